#!/usr/bin/env bash
# A terminated MPI job leaves a diagnosis every time: train on 4 MPI ranks, send SIGTERM to
# mpirun, and check that `meshscope doctor` on the flight folder names all 4 ranks, each with
# where it was and what its record is (a dump written on SIGTERM, or the live record of a rank
# that mpirun's SIGKILL took before or while it dumped), and that no rank outlives mpirun by
# more than a moment. Five rounds, each terminating at another point: as soon as the ranks
# have made their records (before or at their first collectives), a little and a while later,
# and in the middle of training.
#
# Open MPI's mpirun sends SIGTERM to its ranks and SIGKILL once the first of them has ended
# (its sleep between the two ends at the first SIGCHLD), so which rank dumps and which is
# read from its live record differs from run to run; that every rank is diagnosed must not.
# Usage: mpi_term.sh path/to/meshscope SOURCE_DIR MPIEXEC. Skips (77) without data/kjv.txt.
set -u
bin=$1 src=$2 mpiexec=$3
data="$src/data/kjv.txt"
[ -f "$data" ] || {
  echo "skip: $data is missing (scripts/prepare-data.sh makes it)"
  exit 77
}
tmp=$(mktemp -d)
mpirun_pid=""
cleanup() {
  [ -n "$mpirun_pid" ] && kill -KILL "$mpirun_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL (round $round): $*"
  for f in out err doctor; do
    echo "--- $f"
    tail -20 "$dir/$f" 2>/dev/null
  done
  echo "--- flight folder"
  ls -l "$dir/flight" 2>/dev/null
  exit 1
}

export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$(dirname "$0")/mpi_ranks.sh"

# What a rank's line in the doctor's "per rank" list says: where it was, then its record.
where='(was in|was queued for|waited|completed all of|recorded no communication)'
record='\[dumped on: SIGTERM\]'
record+='|\[no dump: it got SIGTERM and was killed before its dump was written; read from its live record\]'
record+='|\[no dump: it ended without a dump or a signal it could handle \(SIGKILL, or a crash\); read from its live record, as of its last call\]'
torn='( \([0-9]+ entr(y|ies) being written as it ended left out\))?'

# How many live records the ranks of this round's job have made.
live_records() {
  local f n=0
  for f in "$dir"/flight/*.ring; do [ -e "$f" ] && n=$((n + 1)); done
  echo "$n"
}

# terminate N DELAY [STEPS]: a job terminated DELAY seconds after all 4 ranks made their records
# (and, with STEPS, after that many training steps were logged).
terminate() {
  round=$1
  local delay=$2 steps=${3:-0}
  dir="$tmp/$round"
  mkdir -p "$dir"
  ms_mpi_job_mark
  "$mpiexec" --oversubscribe --bind-to none --mca btl self,vader -np 4 \
    "$bin" train --model "$src/configs/gpt-tiny.json" --data "$data" --batch 8 --seq 32 \
    --dp 2 --tp 2 --backend mpi --steps 100000 --log-every 1 --flight-dir "$dir/flight" \
    >"$dir/out" 2>"$dir/err" &
  mpirun_pid=$!
  for _ in $(seq 1200); do
    kill -0 "$mpirun_pid" 2>/dev/null || fail "the job ended before it was terminated"
    [ "$(live_records)" -ge 4 ] && [ "$(grep -c '^step' "$dir/out")" -ge "$steps" ] && break
    sleep 0.1
  done
  [ "$(live_records)" -ge 4 ] || fail "the ranks did not make their 4 live records in 120 s"
  ms_mpi_job_ranks >"$dir/ranks"
  [ "$(wc -l <"$dir/ranks")" -eq 4 ] || fail "not 4 rank processes: $(cat "$dir/ranks")"
  sleep "$delay"
  kill -TERM "$mpirun_pid"
  local t0
  t0=$(date +%s%N)
  wait "$mpirun_pid"
  local rc=$?
  mpirun_pid=""
  [ "$rc" -ne 0 ] || fail "mpirun exited 0 after SIGTERM"
  # mpirun has sent SIGKILL to every rank before it exits: they are gone within a moment.
  local t1 r p
  t1=$(date +%s%N)
  while read -r r p; do
    while [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]; do
      [ $(($(date +%s%N) - t1)) -le 2000000000 ] || fail "rank $r (pid $p) outlived mpirun by 2 s"
      sleep 0.02
    done
  done <"$dir/ranks"
  local lag=$((($(date +%s%N) - t1) / 1000000))

  "$bin" doctor "$dir/flight" >"$dir/doctor" 2>&1 || fail "meshscope doctor failed"
  for r in 0 1 2 3; do
    [ "$(grep -c "^  rank $r " "$dir/doctor")" -eq 1 ] || fail "the doctor does not name rank $r once"
    grep -E "^  rank $r $where" "$dir/doctor" | grep -Eq "($record)$torn\$" ||
      fail "rank $r's line is no diagnosis of a terminated rank"
  done
  grep -Eq 'left no flight (record|dump)|cut short|left out' "$dir/doctor" &&
    fail "a rank's record is missing or unreadable"
  local dumps live
  dumps=$(grep -c 'dumped on: SIGTERM' "$dir/doctor")
  live=$(grep -c 'read from its live record' "$dir/doctor")
  printf 'ok: round %d (%s s after the records): mpirun ended %d ms after SIGTERM, its ranks %d ms later; %d dumps, %d live records\n' \
    "$round" "$delay" $(((t1 - t0) / 1000000)) "$lag" "$dumps" "$live"
}

terminate 1 0
terminate 2 0.3
terminate 3 1
terminate 4 2.5
terminate 5 0.2 3

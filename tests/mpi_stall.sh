#!/usr/bin/env bash
# A stalled or killed rank must end an MPI job, not hang it: train on 4 MPI ranks with a short
# communicator timeout, stop one rank (SIGSTOP, or SIGKILL with FAULT=KILL in the environment)
# once training is under way, and check that the job is gone (every process) within the
# timeout plus 15 s and exits non-zero; that the survivors dumped their flight recorders and
# `meshscope doctor` names the rank; and that stderr says it too: a stopped rank's peers time
# out naming it, and it alone, as missing, and print the doctor's words for their dumps; a
# killed rank's peers are terminated by mpirun and each says which call it was in.
# Usage: mpi_stall.sh path/to/meshscope SOURCE_DIR MPIEXEC [STRATEGY.json]. Skips (77) without
# data/kjv.txt. Without a strategy the ranks run tp 4; with one (e.g. dp 4 with gradient
# buckets, whose all-reduces time out on a communicator's progress thread) they run that.
set -u
bin=$1 src=$2 mpiexec=$3
mesh=(--tp 4)
[ -n "${4:-}" ] && mesh=(--strategy "$4")
timeout_s=5
stall=2 # the world rank to stop
fault=${FAULT:-STOP}
data="$src/data/kjv.txt"
[ -f "$data" ] || {
  echo "skip: $data is missing (scripts/prepare-data.sh makes it)"
  exit 77
}
tmp=$(mktemp -d)
mpirun_pid="" stopped=""
cleanup() {
  [ -n "$stopped" ] && kill -KILL "$stopped" 2>/dev/null
  [ -n "$mpirun_pid" ] && kill -KILL "$mpirun_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- stdout"
  tail -5 "$tmp/out"
  echo "--- stderr"
  cat "$tmp/err"
  exit 1
}

# Marks this job's processes, so that the ranks are found by their environment and never
# confused with another job's.
. "$(dirname "$0")/mpi_ranks.sh"
ms_mpi_job_mark
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$mpiexec" --oversubscribe --bind-to none --mca btl self,vader -np 4 \
  "$bin" train --model "$src/configs/gpt-tiny.json" --data "$data" "${mesh[@]}" --backend mpi \
  --steps 100000 --log-every 1 --timeout-s "$timeout_s" --flight-dir "$tmp/flight" \
  >"$tmp/out" 2>"$tmp/err" &
mpirun_pid=$!

# Under way: a few steps logged (so every collective has run) and all four ranks seen.
for _ in $(seq 1 240); do
  kill -0 "$mpirun_pid" 2>/dev/null || fail "the job ended before a rank was stopped"
  [ "$(grep -c '^step' "$tmp/out")" -ge 3 ] && [ "$(ms_mpi_job_ranks | wc -l)" -eq 4 ] && break
  sleep 0.5
done
[ "$(grep -c '^step' "$tmp/out")" -ge 3 ] || fail "training did not get under way"
ms_mpi_job_ranks >"$tmp/ranks"
stopped=$(awk -v r="$stall" '$1 == r { print $2 }' "$tmp/ranks")
[ -n "$stopped" ] || fail "no process has OMPI_COMM_WORLD_RANK=$stall"
kill "-$fault" "$stopped"
t0=$(date +%s)
echo "sent SIG$fault to rank $stall (pid $stopped)"

limit=$((timeout_s + 15))
while kill -0 "$mpirun_pid" 2>/dev/null && [ $(($(date +%s) - t0)) -le "$limit" ]; do sleep 0.5; done
kill -0 "$mpirun_pid" 2>/dev/null && fail "mpirun still runs ${limit} s after rank $stall stopped"
wait "$mpirun_pid"
rc=$?
mpirun_pid=""
took=$(($(date +%s) - t0))
# mpirun reaps the ranks it started; give a dying one until the same deadline to vanish.
while read -r r p; do
  while [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]; do
    [ $(($(date +%s) - t0)) -le "$limit" ] || fail "rank $r (pid $p) outlived mpirun"
    sleep 0.2
  done
done <"$tmp/ranks"
[ "$rc" -ne 0 ] || fail "the job exited 0 after a rank stalled"

# The survivors' flight recorders: the doctor names the rank as the one that never came.
"$bin" doctor "$tmp/flight" >"$tmp/doctor" 2>&1 || fail "meshscope doctor failed: $(cat "$tmp/doctor")"
echo "meshscope doctor says:"
cat "$tmp/doctor"
grep -Eq "^rank $stall (never entered|never arrived in|did not finish|came late to) " "$tmp/doctor" ||
  fail "the doctor does not name rank $stall first"
[ "$(ls "$tmp/flight" | wc -l)" -ge 3 ] || fail "fewer than 3 ranks dumped their flight recorder"
if [ "$fault" = KILL ]; then
  # mpirun ends the survivors with SIGTERM (before their timeout): each says where it was.
  grep -Eq "^meshscope: SIGTERM: rank [013] (was in|waited) " "$tmp/err" ||
    fail "no surviving rank said where it was when terminated"
  echo "ok: mpirun exited $rc ${took} s after rank $stall was killed"
  exit 0
fi
grep -q "flight recorder (meshscope doctor $tmp/flight):" "$tmp/err" ||
  fail "no rank printed its flight recorder's diagnosis"
grep -Eq "^rank $stall (never arrived in|never entered) " "$tmp/err" ||
  fail "no rank's diagnosis names rank $stall"

# A report names the stopped rank, and none names another. A rank may report "unknown"
# (nobody to name): mpirun wakes the stopped rank (SIGCONT) to kill it, so reports written
# while the job is being torn down may see it alive, or be the stopped rank's own.
grep 'ranks that did not arrive: ' "$tmp/err" >"$tmp/reports"
grep -q "ranks that did not arrive: $stall (world $stall)\$" "$tmp/reports" ||
  fail "no report names rank $stall alone"
while read -r line; do
  named=${line##*ranks that did not arrive: }
  others=$(grep -o '(world [0-9]*)' <<<"$named" | grep -vx "(world $stall)")
  [ -z "$others" ] || fail "a report names another rank: $line"
done <"$tmp/reports"
echo "ok: mpirun exited $rc ${took} s after rank $stall stopped; reports:"
sed 's/.*ranks that did not arrive: /  did not arrive: /' "$tmp/reports"

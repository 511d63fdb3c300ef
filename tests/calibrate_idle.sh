#!/usr/bin/env bash
# calibrate_idle.sh MESHSCOPE SOURCE_DIR - the cpu-local cache's guards through the real
# command (engine/plan/calib_cache.h), in a cache folder of its own:
#   1. with every core kept busy by child busy-loops, `plan --cluster cpu-local --recalibrate`
#      says it measures for this run only, names the load and the fix, and caches nothing;
#   2. on a quiet machine it caches, and the file records its key, load and version;
#   3. the next plan uses that file and says when and under what load it was taken;
#   4. a file of another key is measured again, and the line says which part of the key changed
#      (the process is stopped once it has said so: the measurement is 1. and 2.'s).
# ctest runs tests in parallel, so "quiet" is a busy limit at the core count
# (MS_CALIBRATE_MAX_BUSY, which no load exceeds) and "busy" a limit of half the cores under
# loops that fill all of them. MS_CALIBRATE_WAIT_S=1 keeps the wait short.
set -uo pipefail
bin=${1:?usage: calibrate_idle.sh MESHSCOPE SOURCE_DIR}
src=${2:?usage: calibrate_idle.sh MESHSCOPE SOURCE_DIR}
tmp=$(mktemp -d)
loops=()
stop_loops() {
  for p in "${loops[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${loops[@]}"; do wait "$p" 2>/dev/null; done
  loops=()
}
trap 'stop_loops; rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME=$tmp/cache MS_CALIBRATE_WAIT_S=1
cores=$(nproc)
fails=0
ok() { echo "ok   $1"; }
fail() {
  echo "FAIL $1"
  fails=$((fails + 1))
}
check() { # what command...
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}
plan() {
  "$bin" plan --model "$src/configs/gpt-tiny.json" --cluster cpu-local --devices 4 \
    --global-batch 8 --seq 64 "$@"
}
# Waits (up to 60 s) until file has a line matching the pattern or process pid has ended.
wait_line() { # file pattern pid
  for ((t = 0; t < 600; t++)); do
    grep -qE "$2" "$1" && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 0.1
  done
  grep -qE "$2" "$1"
}
cached() { compgen -G "$XDG_CACHE_HOME/meshscope/*.json" >/dev/null; }

# 1. busy
for ((i = 0; i < cores; i++)); do
  (while :; do :; done) &
  loops+=($!)
done
MS_CALIBRATE_MAX_BUSY=$(awk -v c="$cores" 'BEGIN { print c / 2 }') plan --recalibrate \
  >"$tmp/busy.log" 2>&1 &
pid=$!
# the decision comes before the measurement, so the loops can stop once it is said
wait_line "$tmp/busy.log" 'not caching' "$pid"
stop_loops
wait "$pid"
rc=$?
grep '^cpu-local: \(the machine\|this run\)' "$tmp/busy.log"
check "busy: plan still succeeds" [ "$rc" = 0 ]
check "busy: the not-cached line names the load and the fix" grep -qE \
  "^cpu-local: the machine stayed busy \([0-9.]+ of $cores cores, after waiting 1 s\): measuring for this run only, not caching; rerun with --recalibrate when the machine is quiet$" \
  "$tmp/busy.log"
check "busy: the plan says its calibration is this run's" grep -q \
  "^cpu-local: this run's calibration, not cached, taken .* UTC (.*) on a busy machine" "$tmp/busy.log"
check "busy: no cache file" bash -c "! compgen -G '$XDG_CACHE_HOME/meshscope/*.json'"

# 2. quiet
MS_CALIBRATE_MAX_BUSY=$cores plan >"$tmp/quiet.log" 2>&1
rc=$?
grep '^cpu-local: \(measuring this\|calibration\)' "$tmp/quiet.log"
file=$(compgen -G "$XDG_CACHE_HOME/meshscope/*.json" | head -1)
check "quiet: plan succeeds" [ "$rc" = 0 ]
check "quiet: cached" cached
check "quiet: the file name is model, cores and the key's hash" bash -c \
  "[[ '$file' =~ /cpu-local-.+-${cores}c-[0-9a-f]{8}\.json$ ]]"
check "quiet: the line says where and when" grep -q \
  "^cpu-local: calibration cached in $file, taken .* UTC (.* ago) on " "$tmp/quiet.log"
for field in '"calibrated_at":' '"calibration":[[:space:]]*"meshscope-cpu-local-' \
  '"calibration_key":[[:space:]]*"model=.*; features=.*; cores='"$cores"'; blas=.*; threads=' \
  '"busy_cores_before":' '"busy_cores_after":' '"busy_limit_cores":'; do
  check "quiet: the file records $field" grep -qE "$field" "$file"
done

# 3. the cached file is used
plan >"$tmp/again.log" 2>&1
grep '^cpu-local:' "$tmp/again.log"
check "again: the cached calibration, its age and load said" grep -qE \
  "^cpu-local: calibration from $file, taken [0-9-]+ [0-9:]+ UTC \([0-9]+ (s|min) ago\) on an? (idle|busy) machine \([0-9.]+ cores busy before, [0-9.]+ after\)$" \
  "$tmp/again.log"
check "again: nothing measured" bash -c "! grep -q 'measuring' '$tmp/again.log'"

# 4. another key: in the same file, then under another name
# plan until it says why it measures (into log), then stopped
until_measuring() { # log
  plan >"$1" 2>&1 &
  local pid=$!
  wait_line "$1" '^cpu-local: measuring' "$pid"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  grep '^cpu-local: measuring' "$1"
}
sed -i 's/threads=1 per worker[^"]*"/threads=8 per worker"/' "$file"
until_measuring "$tmp/key.log"
check "key: a changed key is measured again, and the line names the part" grep -q \
  "^cpu-local: measuring this machine: $file: it was measured under another key (threads: '8 per worker' then, '.*' now)$" \
  "$tmp/key.log"
other=${file%-*}-00000000.json
mv "$file" "$other"
until_measuring "$tmp/other.log"
check "key: a file of the same machine under another key is named" grep -q \
  "^cpu-local: measuring this machine: $other was measured under another key (threads: " \
  "$tmp/other.log"

echo "calibrate_idle: $fails failed"
[ "$fails" = 0 ]

#!/usr/bin/env bash
# A thread rank that stops answering (MS_TEST_STALL=RANK:STEP[:SECONDS] makes it sleep, in the
# test build of the binary, meshscope-faults: tests/fault_hooks.c) must end
# a threads-backend job: train tp 4 with a short communicator timeout, twice.
#  - woken: the rank sleeps 2 s past the timeout; the job exits non-zero once it wakes.
#  - stuck: the rank sleeps far longer than the test; the process must exit non-zero within
#    the timeout plus the launcher's grace (one more timeout) plus slack, while the rank still
#    sleeps, saying it exits without that rank.
# Both times the job must print the flight recorder's diagnosis naming that rank, every rank
# must have dumped its recorder (the stuck one's by the launcher), and `meshscope doctor` must
# say the same from the dumps.
# Usage: threads_stall.sh path/to/meshscope SOURCE_DIR. Skips (77) without data/kjv.txt.
set -u
bin=$1 src=$2
timeout_s=3
stall=2
stuck_s=600 # the stuck rank's sleep: far past the test's own timeout
data="$src/data/kjv.txt"
[ -f "$data" ] || {
  echo "skip: $data is missing (scripts/prepare-data.sh makes it)"
  exit 77
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL ($case): $*"
  echo "--- stderr"
  cat "$tmp/$case/err"
  exit 1
}

# run CASE SLEEP_S: trains with rank $stall asleep for SLEEP_S at step 3; sets rc and took.
run() {
  case=$1
  mkdir -p "$tmp/$case"
  local t0
  t0=$(date +%s)
  MS_TEST_STALL="$stall:3:$2" timeout 120 "$bin" train --model "$src/configs/gpt-tiny.json" \
    --data "$data" --tp 4 --steps 50 --log-every 1 --timeout-s "$timeout_s" \
    --flight-dir "$tmp/$case/flight" >"$tmp/$case/out" 2>"$tmp/$case/err"
  rc=$?
  took=$(($(date +%s) - t0))
}

# The diagnosis, printed and from the dumps, names the stalled rank; every rank dumped.
check_diagnosis() {
  local d=$tmp/$case
  [ "$rc" -ne 0 ] || fail "the job exited 0 although rank $stall stalled"
  [ "$rc" -ne 124 ] || fail "the job hung"
  grep -q "Sanitizer" "$d/err" && fail "a sanitizer reported a problem"
  grep -q "ranks that did not arrive: $stall (world $stall)" "$d/err" ||
    fail "the error does not name rank $stall as missing"
  grep -q "flight recorder (meshscope doctor $d/flight):" "$d/err" ||
    fail "no flight recorder diagnosis was printed"
  grep -Eq "^rank $stall (came late to|never entered) " "$d/err" ||
    fail "the printed diagnosis does not name rank $stall"
  "$bin" doctor "$d/flight" >"$d/doctor" 2>&1 || fail "meshscope doctor failed: $(cat "$d/doctor")"
  grep -Eq "^rank $stall (came late to|never entered) " "$d/doctor" ||
    fail "meshscope doctor does not name rank $stall: $(cat "$d/doctor")"
  [ "$(ls "$d/flight" | wc -l)" -eq 4 ] || fail "not every rank dumped its flight recorder"
}

run woken $((timeout_s + 2))
check_diagnosis
grep -q "still running after the others failed" "$tmp/woken/err" &&
  fail "the launcher abandoned rank $stall although it woke within the grace period"
echo "ok: woken: exit $rc after ${took} s; meshscope doctor says:"
cat "$tmp/woken/doctor"

run stuck "$stuck_s"
check_diagnosis
# startup and 3 steps, the others' timeout, the launcher's grace (one timeout), slack for load
limit=$((30 + 2 * timeout_s))
[ "$took" -le "$limit" ] ||
  fail "the process took ${took} s to exit (limit ${limit} s): it waited for the stuck rank"
grep -q "^meshscope train: rank $stall still running after the others failed; exiting without" \
  "$tmp/stuck/err" || fail "the job does not say it exits without the stuck rank $stall"
grep -q '"reason": *"abandoned: ' "$tmp/stuck/flight/flight-rank$stall-"*.jsonl ||
  fail "the stuck rank's flight recorder was not dumped by the launcher"
echo "ok: stuck: exit $rc after ${took} s while rank $stall still slept (${stuck_s} s)"

#!/usr/bin/env bash
# A thread rank that stops answering (MS_TEST_STALL=RANK:STEP makes it sleep past the timeout)
# must end a threads-backend job: train tp 4 with a short communicator timeout and check that
# the job exits non-zero once the stalled rank wakes (the timeout plus 2 s, plus slack), that
# it printed the flight recorder's diagnosis naming that rank, and that `meshscope doctor`
# says the same from the dumps.
# Usage: threads_stall.sh path/to/meshscope SOURCE_DIR. Skips (77) without data/kjv.txt.
set -u
bin=$1 src=$2
timeout_s=3
stall=2
data="$src/data/kjv.txt"
[ -f "$data" ] || {
  echo "skip: $data is missing (scripts/prepare-data.sh makes it)"
  exit 77
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  echo "--- stderr"
  cat "$tmp/err"
  exit 1
}

t0=$(date +%s)
MS_TEST_STALL="$stall:3" timeout 120 "$bin" train --model "$src/configs/gpt-tiny.json" \
  --data "$data" --tp 4 --steps 50 --log-every 1 --timeout-s "$timeout_s" \
  --flight-dir "$tmp/flight" >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$(($(date +%s) - t0))
[ "$rc" -ne 0 ] || fail "the job exited 0 although rank $stall stalled"
[ "$rc" -ne 124 ] || fail "the job hung"
grep -q "ranks that did not arrive: $stall (world $stall)" "$tmp/err" ||
  fail "the error does not name rank $stall as missing"
grep -q "flight recorder (meshscope doctor $tmp/flight):" "$tmp/err" ||
  fail "no flight recorder diagnosis was printed"
grep -Eq "^rank $stall (came late to|never entered) " "$tmp/err" ||
  fail "the printed diagnosis does not name rank $stall"
"$bin" doctor "$tmp/flight" >"$tmp/doctor" 2>&1 || fail "meshscope doctor failed: $(cat "$tmp/doctor")"
grep -Eq "^rank $stall (came late to|never entered) " "$tmp/doctor" ||
  fail "meshscope doctor does not name rank $stall: $(cat "$tmp/doctor")"
[ "$(ls "$tmp/flight" | wc -l)" -eq 4 ] || fail "not every rank dumped its flight recorder"
echo "ok: exit $rc after ${took} s; meshscope doctor says:"
cat "$tmp/doctor"

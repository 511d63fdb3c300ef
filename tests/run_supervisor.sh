#!/usr/bin/env bash
# meshscope run: a job killed with SIGKILL after a checkpoint is restarted from it and ends as a
# run that was never interrupted (final weights bit for bit); with --world N the restart runs
# under the planner's strategy for N ranks; a job that keeps failing is given up after K
# restarts with its exit code; usage errors exit 2.
# Usage: run_supervisor.sh path/to/meshscope
set -u
bin=$(realpath "$1")
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
printf '{"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 256, "n_positions": 32}\n' >"$tmp/m.json"
for i in $(seq 400); do echo "And the earth was without form, and void. Verse $i."; done >"$tmp/t.txt"
# Long enough that the kill, right after the first checkpoint, lands while it trains.
job=("$bin" train --model "$tmp/m.json" --data "$tmp/t.txt" --batch 8 --seq 16 --steps 600 --log-every 100)

# The uninterrupted reference.
"${job[@]}" --dp 2 --tp 2 --save "$tmp/ref.safetensors" >"$tmp/ref.txt" 2>&1 || bad "reference run failed"

# kill_after_checkpoint DIR: SIGKILL the job writing DIR once DIR/latest names a checkpoint.
kill_after_checkpoint() {
  for _ in $(seq 600); do
    [ -f "$1/latest" ] && break
    sleep 0.05
  done
  sleep 0.3
  pkill -9 -n -f "save-dir $1"
}

"$bin" run --max-restarts 2 -- "${job[@]}" --dp 2 --tp 2 --save-dir "$tmp/ck" --save-every 20 \
  --save "$tmp/res.safetensors" >"$tmp/run.txt" 2>&1 &
sup=$!
kill_after_checkpoint "$tmp/ck"
wait $sup
rc=$?
if [ $rc -eq 0 ] && grep -q "restart 1 of 2 from" "$tmp/run.txt" && grep -q "^resumed" "$tmp/run.txt"; then
  ok "killed after a checkpoint: restarted from it, exit 0"
else
  bad "killed job: exit $rc; $(grep -E 'run:|resumed' "$tmp/run.txt" | head -3)"
fi
if cmp -s "$tmp/ref.safetensors" "$tmp/res.safetensors"; then
  ok "its final weights equal the uninterrupted run's, bit for bit"
else
  bad "the restarted run's final weights differ from the uninterrupted run's"
fi

"$bin" run --max-restarts 2 --world 2 -- "${job[@]}" --dp 2 --tp 2 --save-dir "$tmp/ck2" \
  --save-every 20 >"$tmp/run2.txt" 2>&1 &
sup=$!
kill_after_checkpoint "$tmp/ck2"
wait $sup
rc=$?
if [ $rc -eq 0 ] && grep -q "on 2 ranks" "$tmp/run2.txt" && grep -q ", 2 ranks, threads backend" "$tmp/run2.txt"; then
  ok "--world 2: $(grep -o 'restart 1 of 2 .*' "$tmp/run2.txt")"
else
  bad "--world 2: exit $rc; $(grep -E 'run:' "$tmp/run2.txt" | head -3)"
fi

# (a job that exits 2 refused its command line: that is never retried, see job_hardening.sh)
"$bin" run --max-restarts 1 -- sh -c 'exit 3' sh --save-dir "$tmp/ck3" >"$tmp/run3.txt" 2>&1
rc=$?
if [ $rc -eq 3 ] && grep -q "gave up after 1 restart" "$tmp/run3.txt"; then
  ok "a job that keeps failing: given up after 1 restart, its exit code ($rc)"
else
  bad "a job that keeps failing: exit $rc; $(tail -2 "$tmp/run3.txt")"
fi
"$bin" run "${job[@]}" >"$tmp/u.txt" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "after --" "$tmp/u.txt" && ok "no -- : exit 2" || bad "no --: exit $rc"
"$bin" run -- "${job[@]}" >"$tmp/u.txt" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "add --save-dir" "$tmp/u.txt" && ok "no --save-dir: exit 2" || bad "no --save-dir: exit $rc"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

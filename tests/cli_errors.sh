#!/usr/bin/env bash
# Bad input to the CLI: each case must exit non-zero (never crash: no exit code >= 128) and
# print an error that names the problem. Usage: cli_errors.sh path/to/meshscope
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

# expect NAME WANTED-TEXT COMMAND...
expect() {
  local name=$1 want=$2
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name (exit $rc): wanted '$want' in:"
    echo "$out" | head -5
    fail=$((fail + 1))
  else
    echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1)"
    pass=$((pass + 1))
  fi
}

cat >"$tmp/ok.json" <<'J'
{"n_layer": 1, "n_head": 4, "n_embd": 32, "vocab_size": 256, "n_positions": 32}
J
cat >"$tmp/bad-div.json" <<'J'
{"n_layer": 1, "n_head": 5, "n_embd": 32, "vocab_size": 256, "n_positions": 32}
J
printf '{"n_layer": 1, "n_head": "four", "n_embd": 32, "vocab_size": 256, "n_positions": 32}' >"$tmp/bad-type.json"
printf '{"n_layer": 1, "n_head": 4,' >"$tmp/truncated.json"
printf '{"mesh": {"dp": 2, "tp": "two"}}' >"$tmp/bad-strategy.json"
printf '{"mesh": {"dp": 1, "tp": 2}, "placements": {"h.*.mlp.c_fc.weight": "[R, S(7)]"}}' >"$tmp/bad-placement.json"
head -c 3000 /dev/urandom | tr -dc 'a-z \n' >"$tmp/text.txt" 2>/dev/null || true
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 200) >"$tmp/text.txt"
: >"$tmp/empty.txt"
printf 'short' >"$tmp/short.txt"

run=("$bin" train --model "$tmp/ok.json" --steps 1 --batch 2 --seq 16)
expect "n_embd not divisible by n_head" "not divisible" "$bin" train --model "$tmp/bad-div.json" --data "$tmp/text.txt"
expect "config JSON path" '$.n_head' "$bin" train --model "$tmp/bad-type.json" --data "$tmp/text.txt"
expect "malformed config" "malformed" "$bin" train --model "$tmp/truncated.json" --data "$tmp/text.txt"
expect "missing config" "missing.json" "$bin" train --model "$tmp/missing.json" --data "$tmp/text.txt"
expect "tp does not divide heads" "does not divide" "${run[@]}" --data "$tmp/text.txt" --tp 3
expect "missing data" "nothere.txt" "${run[@]}" --data "$tmp/nothere.txt"
expect "empty data" "empty" "${run[@]}" --data "$tmp/empty.txt"
expect "short data" "short.txt" "${run[@]}" --data "$tmp/short.txt"
expect "strategy JSON path" '$.mesh.tp' "${run[@]}" --data "$tmp/text.txt" --strategy "$tmp/bad-strategy.json"
expect "placements no rule accepts" "S(7)" "${run[@]}" --data "$tmp/text.txt" --strategy "$tmp/bad-placement.json"
expect "sp without tp" "--sp" "${run[@]}" --data "$tmp/text.txt" --sp
expect "unknown flag" "unknown option" "${run[@]}" --data "$tmp/text.txt" --frobnicate 3
expect "bad number" "bad value" "${run[@]}" --data "$tmp/text.txt" --steps lots
expect "batch not divisible by dp" "not divisible by dp" "${run[@]}" --data "$tmp/text.txt" --batch 3 --dp 2

# A checkpoint whose shapes do not match the model.
"${run[@]}" --data "$tmp/text.txt" --save "$tmp/ck.safetensors" >/dev/null 2>&1
cat >"$tmp/wide.json" <<'J'
{"n_layer": 1, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 32}
J
expect "checkpoint shape mismatch" "the model expects" "$bin" eval --model "$tmp/wide.json" \
  --checkpoint "$tmp/ck.safetensors" --data "$tmp/text.txt" --batch 2 --seq 16 --batches 1
printf 'garbage' >"$tmp/bad.safetensors"
expect "corrupt checkpoint" "bad.safetensors" "$bin" eval --model "$tmp/ok.json" \
  --checkpoint "$tmp/bad.safetensors" --data "$tmp/text.txt" --batch 2 --seq 16 --batches 1
plan=("$bin" plan --model "$tmp/ok.json" --cluster dgx-a100-80gb --devices 8 --global-batch 8 --seq 16)
expect "plan without a model" "--model CONFIG.json is required" "$bin" plan --cluster h100 --devices 8 --global-batch 8 --seq 16
expect "plan unknown cluster" "unknown cluster 'dgx-z9'" "$bin" plan --model "$tmp/ok.json" --cluster dgx-z9 --devices 8 --global-batch 8 --seq 16
expect "plan bad knob" "unknown knob 'tq'" "${plan[@]}" --evaluate "tq=2"
expect "plan impossible knob" "does not divide the 4 attention heads" "${plan[@]}" --evaluate "tp=8"
expect "plan bad number" "bad value '0' for --devices" "${plan[@]}" --devices 0
expect "plan sequence too long" "exceeds the model's n_positions" "${plan[@]}" --seq 64
expect "plan bad dtype" "use bf16 or fp32" "${plan[@]}" --dtype fp8
"${plan[@]}" --evaluate "tq=2" >/dev/null 2>&1
rc=$?
if [ "$rc" -eq 2 ]; then echo "ok   plan bad input exits 2"; pass=$((pass + 1)); else echo "FAIL plan bad input exits $rc, not 2"; fail=$((fail + 1)); fi
expect "unknown command" "unknown command" "$bin" frobnicate

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

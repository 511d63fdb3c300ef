#!/usr/bin/env bash
# plan_offload.sh BIN SRC - `meshscope plan` prices offload: a 1.3B GPT on one 16 GB A100 fits
# only with it (the search picks it), and --evaluate "dp=1,offload=1" prices it (host memory,
# copies, host AdamW) with offload in the strategy names; offload=1 with everything fitting
# still gives offloaded candidates, and a bad value names the knob.
set -u
bin=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat > "$tmp/gpt1b.json" <<'J'
{"model_type": "gpt2", "n_layer": 24, "n_head": 16, "n_embd": 2048, "vocab_size": 50257, "n_positions": 1024}
J
sed 's/"memory_gb": 80/"memory_gb": 16/' "$src/configs/clusters/dgx-a100-80gb.json" > "$tmp/a100-16.json"
plan=("$bin" plan --model "$tmp/gpt1b.json" --devices 1 --global-batch 4 --seq 512 --dtype fp32)

out=$("${plan[@]}" --cluster "$tmp/a100-16.json" 2>&1) || fail "plan failed: $out"
first=$(echo "$out" | grep -E '^ 1  ')
echo "$first" | grep -q 'offload' || fail "the winner is not offloaded: $first"
echo "$first" | grep -q ' yes ' || fail "the offloaded winner does not fit: $first"
echo "$out" | grep -q 'offload: host 21.0 GB per device' || fail "no host memory line: $out"

out=$("${plan[@]}" --cluster "$tmp/a100-16.json" --evaluate "dp=1,offload=0" 2>&1)
echo "$out" | grep -q 'nothing in the searched space' || fail "fits without offload: $out"

out=$("${plan[@]}" --cluster dgx-a100-80gb --evaluate "dp=1,offload=1" --json 2>&1) ||
    fail "evaluate offload=1 failed: $out"
echo "$out" | grep -q '"offload":	true' || fail "no offloaded candidate in JSON: $out"
echo "$out" | grep -q '"host_optimizer":' || fail "no host memory in JSON: $out"
echo "$out" | grep -q '"offload":	false' && fail "a candidate without offload: $out"

out=$("${plan[@]}" --cluster dgx-a100-80gb --evaluate "offload=2" 2>&1) && fail "offload=2 accepted"
echo "$out" | grep -q 'offload=2: expected true or false' || fail "bad value message: $out"
echo "plan_offload: ok"

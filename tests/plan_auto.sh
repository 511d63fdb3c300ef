#!/usr/bin/env bash
# plan_auto.sh BIN SRC - `meshscope plan --placements auto`: each tp degree's best strategy with
# its layout searched, as a table and as JSON; the JSON's placements, put in a strategy file,
# compile under explain; bad values and a cp that leaves nothing to search are refused by name.
set -u
bin=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$tmp" || exit 1
plan=("$bin" plan --model "$src/configs/gpt-tiny.json" --cluster h100 --devices 4 --global-batch 8
      --seq 32)

out=$("${plan[@]}" --placements auto 2>&1) || fail "plan failed: $out"
echo "$out" | grep -q '^automatic placements, searched with the mesh' || fail "no section: $out"
echo "$out" | grep -Eq '^  2  dp2 x tp2 .* layouts, [0-9]+ ms$' || fail "no tp 2 row: $out"
echo "$out" | grep -Eq '^  4  dp1 x tp4 .* layouts, [0-9]+ ms$' || fail "no tp 4 row: $out"
echo "$out" | grep -q '^searched 2 tp degrees in ' || fail "no search time: $out"

"${plan[@]}" --placements auto --evaluate tp=4 --json > plan.json 2>&1 || fail "json: $(cat plan.json)"
python3 - plan.json > strategy.json <<'PY' || fail "the JSON lacks the layout: $(cat plan.json)"
import json, sys
ap = json.load(open(sys.argv[1]))["auto_placements"]
row = [r for r in ap["tp_degrees"] if r["tp"] == 4][0]
s = row["strategy"]
print(json.dumps({"mesh": {"dp": s["dp"], "tp": s["tp"]}, "placements": row["placements"]}))
PY
out=$("$bin" explain --model "$src/configs/gpt-tiny.json" --strategy strategy.json --batch 8 \
      --seq 32 2>&1) || fail "its placements do not compile: $out"
echo "$out" | grep -q 'reshards per step' || fail "explain printed no program: $out"

out=$("${plan[@]}" --placements manual 2>&1) && fail "--placements manual accepted"
echo "$out" | grep -q "bad value 'manual' for --placements: use auto" || fail "message: $out"
out=$("${plan[@]}" --placements auto --evaluate cp=2 2>&1) && fail "cp 2 accepted"
echo "$out" | grep -q 'the layout search runs without cp' || fail "cp message: $out"
echo "plan_auto: ok"

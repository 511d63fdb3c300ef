#!/usr/bin/env bash
# example_strategies.sh EXAMPLE [--no-auto]: a model written against the public API (examples/)
# trains under each strategy with the losses of its one-rank run: dp, tp, pp, ZeRO 3, recompute, a
# live switch, automatic placements (with a memory cap data parallelism does not fit), and a save
# under one strategy resumed under another. bf16 is checked against bf16 on one rank (it changes
# the arithmetic). fp32 runs agree within 1e-5 relative per step. --no-auto leaves the automatic
# placements out (the TSan run: the search is serial code, slowed twentyfold there).
set -u
bin=$1
no_auto=${2:-}
name=$(basename "$bin")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" make-data "$tmp/data.st" --samples 256 >/dev/null || { echo "FAIL make-data"; exit 1; }
common=(--data "$tmp/data.st" --steps 6 --batch 8 --lr 3e-3 --log-every 1 --seed 5)

# run TAG FLAGS...: trains, its losses one per line into $tmp/TAG.loss
run() {
  local tag=$1
  shift
  if ! "$bin" train "${common[@]}" --log-jsonl "$tmp/$tag.jsonl" "$@" >"$tmp/$tag.out" 2>&1; then
    echo "FAIL $name $tag: $*"
    tail -5 "$tmp/$tag.out"
    return 1
  fi
  sed -n 's/.*"loss": \([-0-9.e]*\).*/\1/p' "$tmp/$tag.jsonl" >"$tmp/$tag.loss"
}

# same TAG REF TOL: every step's loss of TAG within TOL (relative) of REF's
same() {
  local n
  n=$(paste "$tmp/$1.loss" "$tmp/$2.loss" | awk -v tol="$3" '
    { d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2
      if ($1 == "" || $2 == "" || d > tol * s) bad++; n++ }
    END { print (n == 6 && !bad) ? "ok" : "bad" }')
  if [ "$n" = ok ]; then
    echo "ok   $name $1: losses equal $2's within $3"
  else
    echo "FAIL $name $1 against $2 (tolerance $3):"
    paste "$tmp/$1.loss" "$tmp/$2.loss"
    fail=1
  fi
}

fail=0
run one || exit 1
run bf16one --precision bf16 || exit 1
# the model learns: the last loss is below the first
awk 'NR == 1 { a = $1 } END { exit !($1 < a) }' "$tmp/one.loss" ||
  { echo "FAIL $name does not learn:"; cat "$tmp/one.loss"; fail=1; }
declare -A strategies=(
  [dp2]="--dp 2"
  [tp2]="--tp 2"
  [dp2tp2]="--dp 2 --tp 2"
  [pp2]="--pp 2 --micro-batches 2"
  [zero3]="--dp 2 --zero 3"
  [recompute]="--dp 2 --recompute full"
  [switch]="--dp 2 --switch 3:{\"dp\":1,\"tp\":2}"
)
for tag in dp2 tp2 dp2tp2 pp2 zero3 recompute switch; do
  # shellcheck disable=SC2086
  run "$tag" ${strategies[$tag]} && same "$tag" one 1e-5 || fail=1
done
run bf16 --dp 2 --precision bf16 && same bf16 bf16one 2e-2 || fail=1

# "placements": "auto" under dp2 x tp2: the layout searched with no annotations trains with one
# rank's losses; then with --memory-cap at 80% of what data parallelism (every weight
# replicated) needs, the search must shard, fit the cap, and train alike.
echo '{"mesh": {"dp": 2, "tp": 2}, "placements": "auto"}' >"$tmp/auto.json"
if [ "$no_auto" = --no-auto ]; then
  echo "skip $name auto, automem: --no-auto (the search is serial, run before any rank starts)"
fi
# mib TEXT KEY: the size after KEY ("4.8 MiB") in MiB
mib() {
  grep -o "$2 [0-9.]* [KMG]iB" <<<"$1" | head -1 | awk '{ v = $(NF - 1); u = $NF
    print (u == "KiB" ? v / 1024 : u == "GiB" ? v * 1024 : v) }'
}
if [ "$no_auto" = --no-auto ]; then
  :
elif run auto --strategy "$tmp/auto.json" && same auto one 1e-5; then
  line=$(grep '^auto placements: ' "$tmp/auto.out")
  dp_mib=$(mib "$line" "replicated: [0-9.]* ms,")
  cap=$(awk -v m="$dp_mib" 'BEGIN { printf "%.3f", 0.8 * m }')
  if run automem --strategy "$tmp/auto.json" --memory-cap "$cap" && same automem one 1e-5; then
    line=$(grep '^auto placements: ' "$tmp/automem.out")
    got=$(mib "$line" "ms,")
    if ! grep -q 'S(' <<<"$line" || awk -v g="$got" -v c="$cap" 'BEGIN { exit !(g > c) }'; then
      echo "FAIL $name automem: a layout of $got MiB under a cap of $cap MiB: $line"
      fail=1
    else
      echo "ok   $name automem: $got MiB per rank under a cap of $cap MiB (data parallel: $dp_mib)"
    fi
  else
    fail=1
  fi
else
  fail=1
fi
# saved under dp2 at step 3, resumed from there under tp2: its steps 3-5 and the saving run's
# 0-2 equal one rank's six
if run save --dp 2 --save-dir "$tmp/ck" --save-every 3 &&
  run resume --tp 2 --resume "$tmp/ck/step-00000003"; then
  { head -3 "$tmp/save.loss"; cat "$tmp/resume.loss"; } >"$tmp/resumed.loss"
  same resumed one 1e-5
else
  fail=1
fi
exit $fail

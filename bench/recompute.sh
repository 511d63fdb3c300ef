#!/usr/bin/env bash
# Activation recompute on this machine: for each mesh (dp4 and dp2 x tp2 on 4 thread ranks by
# default) and each mode (none, selective, full), the program's activation arena and the
# activations in it (`meshscope explain`), the planner's predicted step time and activation
# memory (`meshscope plan --evaluate ...,recompute=...`, which compiles the engine's program)
# and the median step time `meshscope train` measures.
#
# Usage: bench/recompute.sh [--bin build/meshscope] [--model configs/gpt-bench.json]
#          [--batch 8] [--seq 128] [--steps 10] [--skip 3] [--rounds 3] [--max-wait 120]
#          [--meshes "dp=4 dp=2,tp=2"]
#
# Each round runs every (mesh, mode) once, interleaved, so slow spells of a shared machine
# spread over all of them; a run's measured time is the median step_ms over steps >= --skip of
# all its rounds. Before each run the script waits (up to --max-wait seconds) for the CPUs to be
# at least 85% idle and keeps the idle share it saw. Prints one table; exits 1 when full
# recompute cuts the activations by less than 60% or its predicted step time is more than 15%
# off the measured one.
set -euo pipefail
bin=build/meshscope
model=configs/gpt-bench.json
batch=8
seq=128
steps=10
skip=3
rounds=3
max_wait=120
meshes="dp=4 dp=2,tp=2"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --max-wait) max_wait=$2; shift 2 ;;
    --meshes) meshes=$2; shift 2 ;;
    *) echo "recompute.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "recompute.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
modes="none selective full"

# idle_pct, wait_quiet (before each run) and knob ("dp=2,tp=2" -> one knob)
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ranks() { echo $(($(knob "$1" dp 1) * $(knob "$1" tp 1))); }
strategy_file() { # strategy_file MESH MODE -> a strategy JSON file
  local f="$tmp/s.$1.$2.json"
  echo "{\"dp\": $(knob "$1" dp 1), \"tp\": $(knob "$1" tp 1), \"recompute\": \"$2\"}" >"$f"
  echo "$f"
}
evaluate_knob() { case "$1" in none) echo 0 ;; full) echo 1 ;; *) echo "$1" ;; esac; }

echo "load before: $(cat /proc/loadavg)"
for m in $meshes; do
  for mode in $modes; do
    f=$(strategy_file "$m" "$mode")
    "$bin" explain --model "$model" --strategy "$f" --batch "$batch" --seq "$seq" \
      | tail -1 >"$tmp/explain.$m.$mode"
    tp=$(knob "$m" tp 1)
    "$bin" plan --model "$model" --cluster cpu-local --devices "$(ranks "$m")" \
      --global-batch "$batch" --seq "$seq" --json --top 1 \
      --evaluate "dp=$(knob "$m" dp 1),tp=$tp,cp=1,sp=0,pp=1,zero=0,recompute=$(evaluate_knob "$mode"),micro_batches=1,head_replicated=0" \
      >"$tmp/plan.$m.$mode.json" 2>"$tmp/plan.err" || { cat "$tmp/plan.err" >&2; exit 1; }
  done
done
for r in $(seq "$rounds"); do
  for m in $meshes; do
    for mode in $modes; do
      wait_quiet
      "$bin" train --model "$model" --data "$data" --steps "$steps" --batch "$batch" --seq "$seq" \
        --strategy "$tmp/s.$m.$mode.json" --log-every 1000 \
        --log-jsonl "$tmp/train.$m.$mode.$r.jsonl" >/dev/null
    done
  done
done
echo "load after:  $(cat /proc/loadavg)"
echo "idle CPU before each run: $(sort -n "$tmp/idle" | head -1)% to $(sort -n "$tmp/idle" | tail -1)%"

python3 - "$tmp" "$skip" "$meshes" "$modes" <<'PY'
import glob, json, re, statistics, sys
tmp, skip, meshes, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def mib(text):
    v, u = text.split()
    return float(v) * unit[u] / 2**20
fails = 0
print(f"{'mesh':10s} {'mode':10s} {'arena MiB':>10s} {'activ. MiB':>10s} {'cut':>6s} "
      f"{'pred. act MiB':>13s} {'pred. ms':>9s} {'meas. ms':>9s} {'error':>7s} "
      f"{'pred. cost':>10s} {'meas. cost':>10s}")
for m in meshes:
    rows = {}
    for mode in modes:
        line = open(f"{tmp}/explain.{m}.{mode}").read()
        arena = mib(re.search(r"activation arena ([0-9.]+ \w+)", line).group(1))
        act = mib(re.search(r"activations ([0-9.]+ \w+) besides", line).group(1))
        c = json.load(open(f"{tmp}/plan.{m}.{mode}.json"))["candidates"][0]
        steps = [d["step_ms"] for f in glob.glob(f"{tmp}/train.{m}.{mode}.*.jsonl")
                 for d in map(json.loads, open(f)) if d["step"] >= skip]
        rows[mode] = (arena, act, c["memory_bytes"]["activations"] / 2**20, c["step_time_s"] * 1e3,
                      statistics.median(steps))
    none = rows["none"]
    for mode in modes:
        arena, act, pact, pred, meas = rows[mode]
        cut = 1 - act / none[1]
        err = pred / meas - 1
        pcost, mcost = pred / none[3] - 1, meas / none[4] - 1
        print(f"{m:10s} {mode:10s} {arena:10.2f} {act:10.2f} {100*cut:5.0f}% {pact:13.2f} "
              f"{pred:9.1f} {meas:9.1f} {100*err:+6.1f}% {100*pcost:+9.1f}% {100*mcost:+9.1f}%")
        if mode == "full":
            fails += cut < 0.60
            fails += abs(err) > 0.15
sys.exit(1 if fails else 0)
PY

#!/usr/bin/env bash
# The planner against the engine on this machine: for each executable strategy on N thread
# ranks, the step time `meshscope plan --cluster cpu-local` predicts against the median step
# time `meshscope train` measures, and whether the planner's top pick is the fastest measured
# or within 3% of it.
#
# Usage: bench/plan_validate.sh [--bin build/meshscope] [--model configs/gpt-bench.json]
#          [--ranks 4] [--batch 8] [--seq 128] [--steps 10] [--skip 3] [--rounds 3]
#          [--tolerance 0.15] [--recalibrate] [--max-wait 600]
#          [--strategies "dp=4 tp=4 tp=4,sp=1 pp=2,micro_batches=4 tp=4,head_replicated=1 ..."]
#          (each a list of strategy settings by their names)
#
# Each round runs every strategy once (rounds interleave, so slow spells of a shared machine
# spread over all strategies); a strategy's measured time is the median step_ms over steps
# >= --skip of all its rounds. Before each run the script waits (up to --max-wait seconds) for
# the CPUs to be at least 85% idle; the idle share seen before each run and the load average
# are printed.
set -euo pipefail
bin=build/meshscope
model=configs/gpt-bench.json
ranks=4
batch=8
seq=128
steps=10
skip=3
rounds=3
tol=0.15
recal=""
max_wait=600
strategies="dp=4 tp=4 tp=4,sp=1 dp=2,tp=2 dp=2,tp=2,sp=1 dp=2,cp=2 tp=2,cp=2 tp=2,cp=2,sp=1 cp=4
  tp=4,head_replicated=1 dp=2,tp=2,sp=1,head_replicated=1"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --tolerance) tol=$2; shift 2 ;;
    --recalibrate) recal=--recalibrate; shift ;;
    --max-wait) max_wait=$2; shift 2 ;;
    --strategies) strategies=$2; shift 2 ;;
    *) echo "plan_validate.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "plan_validate.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# idle_pct, wait_quiet (before each run) and knob ("dp=2,tp=2,sp=1" -> one knob)
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

degrees() { # the missing degree makes dp x tp x cp x pp = ranks; then sp, pp, micro-batches,
  # and hr (1: the head replicated over tp)
  local dp tp cp pp
  dp=$(knob "$1" dp 0); tp=$(knob "$1" tp 1); cp=$(knob "$1" cp 1); pp=$(knob "$1" pp 1)
  [ "$dp" = 0 ] && dp=$((ranks / (tp * cp * pp)))
  echo "$dp $tp $cp $(knob "$1" sp 0) $pp $(knob "$1" micro_batches 1) $(($(knob "$1" head_replicated 0) && tp > 1))"
}

echo "load before: $(cat /proc/loadavg)"
# The prediction first (calibrates cpu-local once if there is no cached measurement).
for s in $strategies; do
  read -r dp tp cp sp pp m hr <<<"$(degrees "$s")"
  "$bin" plan --model "$model" --cluster cpu-local --devices "$ranks" --global-batch "$batch" \
    --seq "$seq" --json --top 1 $recal \
    --evaluate "dp=$dp,tp=$tp,cp=$cp,sp=$sp,pp=$pp,zero=0,recompute=0,micro_batches=$m,head_replicated=$hr" \
    >"$tmp/plan.$s.json" 2>"$tmp/plan.$s.err" || { cat "$tmp/plan.$s.err" >&2; exit 1; }
  recal=""
done
for r in $(seq "$rounds"); do
  for s in $strategies; do
    read -r dp tp cp sp pp m hr <<<"$(degrees "$s")"
    flags="--dp $dp --tp $tp --cp $cp --pp $pp --micro-batches $m"
    [ "$sp" = 1 ] && flags="$flags --sp"
    [ "$hr" = 1 ] && flags="$flags --head-replicated"
    wait_quiet
    # shellcheck disable=SC2086
    "$bin" train --model "$model" --data "$data" --steps "$steps" --batch "$batch" --seq "$seq" \
      $flags --log-every 1000 --log-jsonl "$tmp/train.$s.$r.jsonl" >/dev/null
  done
done
echo "load after:  $(cat /proc/loadavg)"
echo "idle CPU before each run: $(sort -n "$tmp/idle" | head -1)% to $(sort -n "$tmp/idle" | tail -1)% (median $(sort -n "$tmp/idle" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')%)"

python3 - "$tmp" "$skip" "$tol" $strategies <<'PY'
import json, statistics, sys
tmp, skip, tol, strategies = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
import glob
rows = []
for s in strategies:
    plan = json.load(open(f"{tmp}/plan.{s}.json"))
    c = plan["candidates"][0]
    steps = []
    for f in sorted(glob.glob(f"{tmp}/train.{s}.*.jsonl")):
        for line in open(f):
            d = json.loads(line)
            if d["step"] >= skip:
                steps.append(d["step_ms"])
    meas = statistics.median(steps)
    pred = c["step_time_s"] * 1e3
    rows.append((c["text"], pred, meas, pred / meas - 1, len(steps)))
print(f"{'strategy':24s} {'predicted ms':>13s} {'measured ms':>12s} {'error':>8s} {'steps':>6s}")
fails = 0
for text, pred, meas, err, n in rows:
    ok = abs(err) <= tol
    fails += not ok
    print(f"{text:24s} {pred:13.1f} {meas:12.1f} {100*err:+7.1f}% {n:6d}  {'PASS' if ok else 'FAIL'}")
pick = min(rows, key=lambda r: r[1])
by_meas = sorted(rows, key=lambda r: r[2])
rank = [r[0] for r in by_meas].index(pick[0]) + 1
behind = pick[2] / by_meas[0][2] - 1
ok = behind <= 0.03
fails += not ok
print(f"planner's pick: {pick[0]} (predicted {pick[1]:.1f} ms); measured rank {rank} of {len(rows)}, "
      f"{100 * behind:.1f}% behind the fastest (fastest measured: {by_meas[0][0]} {by_meas[0][2]:.1f} ms"
      + (f", {by_meas[1][0]} {by_meas[1][2]:.1f} ms" if len(by_meas) > 1 else "")
      + f")  {'PASS' if ok else 'FAIL'}")
sys.exit(1 if fails else 0)
PY

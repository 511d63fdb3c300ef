#!/usr/bin/env bash
# Pipeline schedules as run against their formulas: for each pp, micro-batch count and
# schedule, `meshscope train --trace` on thread ranks (or MPI processes with --mpi), then the
# measured bubble from `meshscope trace summary` (1 - busy / the step's span of pipeline
# actions, mean over ranks and steps) beside the schedule's formula, and the micro-batches each
# stage held at once beside the schedule's bound (train's activation report), and the planner's
# simulated bubble with the run's mean F, B and W (`trace summary`'s "simulated"; the ratio is
# against it where the schedule has no formula). Each case runs --rounds times; the bubbles
# reported are the medians of the rounds. "cpu" is bench/pipeline_gaps.py's replay of each step
# with every action's thread CPU time and free transfers: the bubble with a core per rank.
#
# Usage: bench/pipeline.sh [--bin build/meshscope] [--model bench/configs/gpt-pipe.json]
#          [--batch 16] [--seq 128] [--steps 8] [--skip 3] [--rounds 3] [--mpi]
#          [--cases "2:4:1f1b 2:8:1f1b ..."]   (pp:micro-batches:schedule[:virtual stages])
set -euo pipefail
bin=build/meshscope
model=bench/configs/gpt-pipe.json
batch=16
seq=128
steps=8
skip=3
rounds=3
mpi=""
cases="2:4:gpipe 2:4:1f1b 2:4:interleaved:2 2:4:zb-h1 2:8:gpipe 2:8:1f1b 2:8:interleaved:2 2:8:zb-h1 4:4:gpipe 4:4:1f1b 4:4:interleaved:2 4:4:zb-h1 4:8:gpipe 4:8:1f1b 4:8:interleaved:2 4:8:zb-h1"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --mpi) mpi=1; shift ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "pipeline.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "pipeline.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "load before: $(cat /proc/loadavg)"
printf '%-22s %8s %8s %8s %8s %8s %7s   %s\n' case formula simulated measured ratio cpu step_ms "held/bound per stage"
for c in $cases; do
  IFS=: read -r pp m sched v <<<"$c"
  v=${v:-1}
  flags=(--pp "$pp" --micro-batches "$m" --schedule "$sched" --virtual-stages "$v")
  bubbles=() steps_ms=() sims=() cpus=()
  for r in $(seq "$rounds"); do
    run=("$bin" train --model "$model" --data "$data" --steps "$steps" --batch "$batch" --seq "$seq"
      "${flags[@]}" --log-every 1000 --log-jsonl "$tmp/log.jsonl" --trace "$tmp/t.json")
    if [ -n "$mpi" ]; then
      mpirun --oversubscribe --bind-to none --mca btl self,vader -np "$pp" "${run[@]}" --backend mpi >"$tmp/out" 2>&1
    else
      "${run[@]}" >"$tmp/out" 2>&1
    fi
    "$bin" trace summary "$tmp/t.json" --steps "$skip:" >"$tmp/sum"
    bubbles+=("$(awk '$1 == "all" { sub("%", "", $2); print $2 }' "$tmp/sum")")
    sims+=("$(sed -n 's/.*simulated .* = \([0-9.]*\)%.*/\1/p' "$tmp/sum" | head -1)")
    cpus+=("$(python3 "$(dirname "$0")/pipeline_gaps.py" "$tmp/t.json" --skip "$skip" | sed -n 's/.*, cpu \([0-9.]*\)%.*/\1/p')")
    steps_ms+=("$(python3 -c 'import json,sys,statistics; s=[json.loads(l) for l in open(sys.argv[1])]; print("%.1f" % statistics.median(d["step_ms"] for d in s if d["step"] >= int(sys.argv[2])))' "$tmp/log.jsonl" "$skip")")
  done
  formula=$(sed -n 's/.*formula .* = \([0-9.]*\)%.*/\1/p' "$tmp/sum" | head -1)
  held=$(sed -n 's/.*stage \([0-9]*\): held \([0-9]*\) (bound \([0-9]*\)).*/\2\/\3/p' "$tmp/out" | paste -sd' ')
  med=$(printf '%s\n' "${bubbles[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  step=$(printf '%s\n' "${steps_ms[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  sim=$(printf '%s\n' "${sims[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  cpu=$(printf '%s\n' "${cpus[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  ratio=$(awk -v a="$med" -v b="${formula:-}" -v s="${sim:-}" 'BEGIN { if (b == "" || b == 0) b = s; if (b == "" || b == 0) print "-"; else printf "%.2f", a / b }')
  printf '%-22s %7s%% %8s%% %7s%% %8s %7s%% %7s   %s\n' "pp$pp m$m $sched${v:+ v$v}" "${formula:--}" "${sim:--}" "$med" "$ratio" "${cpu:--}" "$step" "$held"
done
echo "load after: $(cat /proc/loadavg)"

#!/usr/bin/env bash
# placements.sh MESHSCOPE DATA [RUNS] [PLAN_ARGS...]: dp 2 x tp 2 of gpt-tiny (--batch 8 --seq 64,
# 12 steps) on the namespace hosts of netns.sh (2 hosts x 2 ranks, after measure.sh) under three
# placements, RUNS times each (default 5), interleaved so that a change in the machine's load
# hits all three alike:
#   one-host     all 4 ranks in the root namespace, shared memory only
#   by-host      tests/cluster/mpirun.sh --map-by slot: tp inside the hosts, dp across
#   round-robin  tests/cluster/mpirun.sh --map-by node: tp across the hosts, dp inside
# Prints per placement the median over runs of each run's median step_ms (steps 2-11), the range,
# and the median of the planner's predictions (`meshscope plan --evaluate`, the topology
# measure.sh wrote with the matching rank_order; PLAN_ARGS go to plan) and its error. With
# RECALIBRATE=1 in the environment, cpu-local is measured again (into a private cache) before
# each round, so that each round's predictions see the load its runs see. COMPARE=BIN adds the
# predictions of another meshscope (e.g. before a change of the cost model) on the same
# calibrations.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: placements.sh MESHSCOPE DATA [RUNS] [PLAN_ARGS...]}
data=${2:?usage: placements.sh MESHSCOPE DATA [RUNS] [PLAN_ARGS...]}
runs=${3:-5}
shift $(($# < 3 ? $# : 3))
src=$(cd "$here/../.." && pwd)
topo=${MS_NETNS_TOPOLOGY:-/tmp/meshscope-netns/topology.json}
[ -f "$topo" ] || { echo "placements.sh: no $topo (run netns.sh up, then measure.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
strategy="dp=2,tp=2,sp=0,zero=0,head_replicated=0,recompute=0,micro_batches=1"
train=(train --model "$src/configs/gpt-tiny.json" --data "$data" --dp 2 --tp 2 --backend mpi
       --steps 12 --batch 8 --seq 64 --log-every 1)
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

run_once() { # PLACEMENT LOG
  case $1 in
    one-host) timeout 300 mpirun --oversubscribe --bind-to none --mca btl self,vader -np 4 \
                "$bin" "${train[@]}" --log-jsonl "$2" ;;
    by-host) timeout 300 "$here/mpirun.sh" -np 4 "$bin" "${train[@]}" --log-jsonl "$2" ;;
    round-robin) timeout 300 "$here/mpirun.sh" --map-by node -np 4 "$bin" "${train[@]}" \
                   --log-jsonl "$2" ;;
  esac >/dev/null 2>"$tmp/err" || { echo "placements.sh: $1 failed:" >&2; cat "$tmp/err" >&2; exit 1; }
}
median() { sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
step_median() { # LOG: the median step_ms of steps 2-11
  sed -n 's/.*"step": \([0-9]*\),.*"step_ms": \([0-9.]*\).*/\1 \2/p' "$1" |
    awk '$1 >= 2 && $1 <= 11 {print $2}' | median
}
predict() { # PLACEMENT [BIN]
  local args=() pbin=${2:-$bin}
  case $1 in
    by-host) args=(--topology "$topo") ;;
    round-robin) sed 's/"by-host"/"round-robin"/' "$topo" >"$tmp/rr.json"
                 args=(--topology "$tmp/rr.json") ;;
  esac
  plan "$pbin" --evaluate "$strategy" "${args[@]}" "${PLAN_ARGS[@]}" 2>/dev/null |
    awk '$1 == "1" { for (i = 2; i < NF; i++) if ($(i + 1) == "ms") { print $i; exit } }'
}
plan() { # BIN ARGS...
  local pbin=$1
  shift
  if [ "${RECALIBRATE:-0}" = 1 ]; then export XDG_CACHE_HOME="$tmp/cache"; fi
  "$pbin" plan --model "$src/configs/gpt-tiny.json" --cluster cpu-local --devices 4 \
    --global-batch 8 --seq 64 "$@"
}
PLAN_ARGS=("$@")
places=(one-host by-host round-robin)
for ((r = 0; r < runs; r++)); do
  if [ "${RECALIBRATE:-0}" = 1 ]; then
    plan "$bin" --recalibrate --evaluate "$strategy" >/dev/null 2>&1 ||
      { echo "placements.sh: cpu-local calibration failed" >&2; exit 1; }
  fi
  for p in "${places[@]}"; do
    run_once "$p" "$tmp/$p-$r.jsonl"
    step_median "$tmp/$p-$r.jsonl" >>"$tmp/$p.ms"
    predict "$p" >>"$tmp/$p.pred"
    [ -z "${COMPARE:-}" ] || predict "$p" "$COMPARE" >>"$tmp/$p.cmp"
  done
done
err() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%+.0f%%", (a / b - 1) * 100}'; }
printf '%-12s %10s %16s %10s %7s%s\n' placement measured range predicted error \
  "${COMPARE:+   compared  error}"
for p in "${places[@]}"; do
  m=$(median <"$tmp/$p.ms")
  range=$(sort -g "$tmp/$p.ms" | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.0f-%.0f", lo, hi}')
  pred=$(median <"$tmp/$p.pred")
  extra=""
  [ -z "${COMPARE:-}" ] || { c=$(median <"$tmp/$p.cmp"); extra=$(printf ' %7.0f ms %6s' "$c" "$(err "$c" "$m")"); }
  printf '%-12s %7.0f ms %13s ms %7.0f ms %7s%s\n' "$p" "$m" "$range" "$pred" "$(err "$pred" "$m")" \
    "$extra"
done

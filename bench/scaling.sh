#!/usr/bin/env bash
# Scaling on thread ranks: the same GPT step on one rank (1 and 2 BLAS threads) and on two
# ranks with dp2 and tp2 (1 BLAS thread each), alternating runs, reporting the median step
# time of each and the speedup over one rank with 2 threads (the same 2 cores).
# Usage: bench/scaling.sh [build/meshscope] [config] [rounds]
set -euo pipefail
bin=${1:-build/meshscope}
cfg=${2:-configs/gpt-bench.json}
rounds=${3:-3}
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

declare -A args=(
  [1rank_1thread]="--threads 1"
  [1rank_2threads]="--threads 2"
  [dp2]="--dp 2 --threads 1"
  [tp2]="--tp 2 --threads 1"
  [tp2_sp]="--tp 2 --sp --threads 1"
)
order=(1rank_1thread 1rank_2threads dp2 tp2 tp2_sp)
for r in $(seq "$rounds"); do
  for k in "${order[@]}"; do
    # shellcheck disable=SC2086
    "$bin" train --model "$cfg" --data "$data" --steps 12 --batch 8 --seq 128 --log-every 100 \
      ${args[$k]} --log-jsonl "$tmp/$k.$r.jsonl" >/dev/null
  done
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
declare -A med
for k in "${order[@]}"; do
  # steps 4..11 of every round: past warm-up
  med[$k]=$(cat "$tmp/$k".*.jsonl | sed -n 's/.*"step": \([0-9]*\),.*"step_ms": \([0-9.]*\),.*/\1 \2/p' |
    awk '$1 >= 4 {print $2}' | median)
done
base=${med[1rank_2threads]}
printf '%-16s %12s %12s %22s\n' config "step ms" "tokens/s" "speedup vs 1 rank x 2"
for k in "${order[@]}"; do
  awk -v k="$k" -v m="${med[$k]}" -v b="$base" \
    'BEGIN {printf "%-16s %12.1f %12.0f %21.2fx\n", k, m, 8 * 128 / (m / 1000), b / m}'
done

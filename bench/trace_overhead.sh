#!/usr/bin/env bash
# Tracing overhead: the engine's GPT on 4 thread ranks (dp2 x tp2), alternating runs with
# full tracing (--trace) and without, median step time of each over all runs (steps past
# warm-up), and their ratio. Goal: <= 1.02.
# Usage: bench/trace_overhead.sh [build/meshscope] [config] [pairs]
set -euo pipefail
bin=${1:-build/meshscope}
cfg=${2:-configs/gpt-bench.json}
pairs=${3:-5}
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$pairs"); do
  "$bin" train --model "$cfg" --data "$data" --dp 2 --tp 2 --steps 15 --batch 8 --seq 128 \
    --log-every 100 --log-jsonl "$tmp/off.$i.jsonl" >/dev/null
  "$bin" train --model "$cfg" --data "$data" --dp 2 --tp 2 --steps 15 --batch 8 --seq 128 \
    --log-every 100 --log-jsonl "$tmp/on.$i.jsonl" --trace "$tmp/trace.$i.json" >/dev/null
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
steps() { cat "$tmp"/$1.*.jsonl | sed -n 's/.*"step": \([0-9]*\),.*"step_ms": \([0-9.]*\),.*/\1 \2/p' | awk '$1 >= 3 {print $2}'; }
off=$(steps off | median)
on=$(steps on | median)
events=$(grep -o '"ph":"X"' "$tmp/trace.1.json" | wc -l)
awk -v a="$on" -v b="$off" -v e="$events" -v p="$pairs" 'BEGIN {
  printf "tracing off: median step %.2f ms\ntracing on:  median step %.2f ms (%d slices per trace)\n", b, a, e
  printf "overhead ratio (on / off): %.3f over %d alternating pairs\n", a / b, p }'

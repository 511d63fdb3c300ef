#!/usr/bin/env bash
# Overlap of the data-parallel gradient all-reduces with backward: the engine's gpt-bench
# model under MPI (dp NP, one process per rank), gradient buckets off (bucket_mb 0: one
# blocking all-reduce per gradient after backward) against bucket_mb 1 and 4 (non-blocking
# all-reduces issued during backward). Each round runs every setting once, alternating, all
# traced; reported per setting: the median step time over all rounds (steps past warm-up),
# and from each run's trace the share of the dp communication hidden under compute and the
# exposed communication per step (mean over ranks, median over rounds).
# Goal: >= 50% of the dp gradient communication hidden where compute exceeds communication.
# With BACKEND threads the ranks are threads of one process instead (the threads backend).
# Usage: bench/overlap.sh [build/meshscope] [rounds] [NP] [steps] [mpi|threads]
set -euo pipefail
bin=${1:-build/meshscope}
rounds=${2:-5}
np=${3:-2}
steps=${4:-16}
backend=${5:-mpi}
cfg=configs/gpt-bench.json
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
launch=()
if [ "$backend" = mpi ]; then
  command -v mpirun >/dev/null || { echo "overlap: mpirun is not on PATH" >&2; exit 1; }
  launch=(mpirun --oversubscribe --bind-to none --mca btl self,vader -np "$np")
fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
settings="0 1 4"
for b in $settings; do
  if [ "$b" = 0 ]; then echo "{\"dp\": $np}"; else echo "{\"dp\": $np, \"bucket_mb\": $b}"; fi \
    >"$tmp/s$b.json"
done
for i in $(seq "$rounds"); do
  for b in $settings; do
    "${launch[@]}" "$bin" train --model "$cfg" --data "$data" --strategy "$tmp/s$b.json" \
      --backend "$backend" \
      --steps "$steps" --batch 8 --seq 128 --log-every 1000 --log-jsonl "$tmp/l$b.$i.jsonl" \
      --trace "$tmp/t$b.$i.json" >/dev/null
    # The overlap table of `trace summary`: rank, comm, compute, overlapped, exposed, overlap,
    # exposed/step, dp comm, dp hidden. One line per run: mean over ranks.
    "$bin" trace summary "$tmp/t$b.$i.json" |
      awk '/^Overlap per rank/ {on = 1; next} on && /^ *[0-9]+ / {n++; e += $7; h += $9}
           on && /^$/ {on = 0} END {if (n) printf "%.3f %.1f\n", e / n, h / n}' \
        >>"$tmp/o$b.txt"
  done
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
steps_ms() {
  cat "$tmp"/l$1.*.jsonl | sed -n 's/.*"step": \([0-9]*\),.*"step_ms": \([0-9.]*\),.*/\1 \2/p' |
    awk '$1 >= 3 {print $2}'
}
printf "gpt-bench, dp %d (%s), batch 8 x 128, %d steps, %d rounds\n" "$np" "$backend" "$steps" \
  "$rounds"
printf "%-10s %14s %22s %18s\n" "bucket_mb" "median step ms" "exposed comm/step ms" "dp comm hidden"
for b in $settings; do
  step=$(steps_ms "$b" | median)
  exposed=$(awk '{print $1}' "$tmp/o$b.txt" | median)
  hidden=$(awk '{print $2}' "$tmp/o$b.txt" | median)
  printf "%-10s %14.1f %22.2f %17.1f%%\n" "$b" "$step" "$exposed" "$hidden"
done

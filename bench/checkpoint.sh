#!/usr/bin/env bash
# Checkpoint saving and resuming on gpt-bench, against the disk: side by side in one run,
#   dd        the disk's sequential write bandwidth (1 GiB of zeros written and fdatasync'ed)
#   meshscope train --save-dir --save-every: each save's bytes over the slowest rank's write
#             (durable: temporary file, fsync, rename), the step stall of the asynchronous
#             save ("state copied in"), and the median step time without a save
#   resume    --resume of the last checkpoint: the load, then the first step after it
# Repeats --runs times (each after waiting for a quiet machine) and prints medians.
#
# Usage: bench/checkpoint.sh [--bin build/meshscope] [--model configs/gpt-bench.json]
#          [--strategy "--dp 2 --tp 2"] [--steps 12] [--every 4] [--runs 3] [--dir DIR]
set -euo pipefail
bin=build/meshscope
model=configs/gpt-bench.json
strategy="--dp 2 --tp 2"
steps=12
every=4
runs=3
dir=""
max_wait=120
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --strategy) strategy=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "checkpoint.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "checkpoint.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d "${dir:-${TMPDIR:-/tmp}}/ms-ckpt-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

echo "model $model, $strategy, $steps steps, a save every $every; checkpoints in $tmp"
echo "load before: $(cat /proc/loadavg)"
for r in $(seq "$runs"); do
  wait_quiet
  dd if=/dev/zero of="$tmp/dd" bs=1M count=1024 conv=fdatasync 2>"$tmp/dd.txt"
  rm -f "$tmp/dd"
  # "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 2.3 s, 466 MB/s"
  awk '/copied/ { print $1 / $(NF - 3) / 1e6 }' "$tmp/dd.txt" >>"$tmp/dd_mbs"
  rm -rf "$tmp/ck"
  # shellcheck disable=SC2086
  "$bin" train --model "$model" --data "$data" $strategy --steps "$steps" --log-every 1 \
    --save-dir "$tmp/ck" --save-every "$every" --keep 2 >"$tmp/train.txt" 2>&1
  sed -n 's/.*written in \([0-9.]*\) ms by the slowest rank (\([0-9]*\) MB\/s.*/\2/p' "$tmp/train.txt" >>"$tmp/save_mbs"
  sed -n 's/.*checkpoint: state copied in \([0-9.]*\) ms.*/\1/p' "$tmp/train.txt" >>"$tmp/stall_ms"
  # steps that neither save nor follow a save's copy: the step time to compare the stall with
  awk -v e="$every" '/^step +[0-9]+ +loss/ { s = $2; if ((s + 1) % e != 0 && s % e != 0 && s > 0) print $5 }' \
    "$tmp/train.txt" >>"$tmp/step_ms"
  # shellcheck disable=SC2086
  "$bin" train --model "$model" --data "$data" $strategy --steps $((steps + 2)) --log-every 1 \
    --resume "$tmp/ck" >"$tmp/resume.txt" 2>&1
  sed -n 's/^resumed .* in \([0-9.]*\) ms .*/\1/p' "$tmp/resume.txt" >>"$tmp/load_ms"
  awk -v s="$steps" '$1 == "step" && $2 == s && $3 == "loss" { print $5 }' "$tmp/resume.txt" >>"$tmp/first_ms"
done
bytes=$(sed -n 's/.*committed: [0-9]* tensors, \([0-9.]*\) MiB.*/\1/p' "$tmp/train.txt" | head -1)
dd_mbs=$(median <"$tmp/dd_mbs")
save_mbs=$(median <"$tmp/save_mbs")
stall=$(median <"$tmp/stall_ms")
step=$(median <"$tmp/step_ms")
echo "checkpoint: $bytes MiB per save; $(wc -l <"$tmp/save_mbs") saves, $runs runs; medians:"
printf '  dd sequential write     %8.0f MB/s\n' "$dd_mbs"
printf '  meshscope save          %8.0f MB/s   (%.0f%% of dd)\n' "$save_mbs" "$(awk -v a="$save_mbs" -v b="$dd_mbs" 'BEGIN { print 100 * a / b }')"
printf '  step stall of a save    %8.1f ms     (a step: %.1f ms; %.2f steps)\n' "$stall" "$step" "$(awk -v a="$stall" -v b="$step" 'BEGIN { print a / b }')"
printf '  resume: load            %8.1f ms, first step after it %.1f ms\n' "$(median <"$tmp/load_ms")" "$(median <"$tmp/first_ms")"
echo "idle share before each run: $(tr '\n' ' ' <"$tmp/idle")%"

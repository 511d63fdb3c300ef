#!/usr/bin/env bash
# Pipeline activation memory with full recompute, against Megatron-LM's accounting: for each
# pp, micro-batch count and schedule, `meshscope train --recompute full` (and the same run
# without recompute) on thread ranks, and from train's activation report each stage's
# micro-batches held, the bytes of their arenas and of the scratch they share, and the device
# peak's growth. Beside them the bytes Megatron-LM's full recompute keeps (Korthikanti et al.
# 2022: a micro-batch in flight holds each of its stage's layer inputs, s x b x h values; in
# fp32 4 bytes each) for the same micro-batches held, and the ratio of what meshscope held to
# it. The scratch (one layer's values and the backward's working gradients, made again for
# each micro-batch) is listed apart: Megatron-LM needs it too, once.
#
# Memory does not depend on the machine's load, so every case runs once.
#
# Usage: bench/pipeline_memory.sh [--bin build/meshscope] [--model bench/configs/gpt-pipe.json]
#          [--batch 16] [--seq 128] [--cases "2:8:gpipe 2:8:1f1b 4:8:gpipe 4:8:1f1b"]
set -euo pipefail
bin=build/meshscope
model=bench/configs/gpt-pipe.json
batch=16
seq=128
cases="2:8:gpipe 2:8:1f1b 4:8:gpipe 4:8:1f1b"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_opts pipeline_memory.sh "$@"
[ -x "$bin" ] || { echo "pipeline_memory.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh

# n_layer and n_embd of the model
read -r layers width < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["n_layer"], c["n_embd"])' "$model")

printf '%-16s %-5s %5s %6s %10s %10s %10s %12s %7s\n' case recomp stage held "slots MiB" \
  "scratch" "peak grew" "Megatron MiB" ratio
for c in $cases; do
  IFS=: read -r pp m sched <<<"$c"
  for rc in none full; do
    out="$tmp/$pp.$m.$sched.$rc.out"
    if ! "$bin" train --data "$data" --model "$model" --steps 2 --batch "$batch" --seq "$seq" \
      --pp "$pp" --micro-batches "$m" --schedule "$sched" --recompute "$rc" >"$out" 2>&1; then
      echo "pipeline_memory.sh: pp $pp m $m $sched recompute $rc failed:" >&2
      tail -5 "$out" >&2
      exit 1
    fi
    python3 - "$out" "$c" "$rc" "$layers" "$width" "$pp" "$batch" "$m" "$seq" <<'PY'
import re, sys
out, case, rc, layers, width, pp, batch, m, seq = sys.argv[1:]
layers, width, pp, batch, m, seq = map(int, (layers, width, pp, batch, m, seq))
pat = re.compile(r"stage (\d+): held (\d+) \(bound \d+\), ([\d.]+) MiB in slots"
                 r"(?: \+ ([\d.]+) MiB shared scratch)?, device peak grew ([\d.]+) MiB")
rows = [pat.search(l) for l in open(out)]
rows = [r for r in rows if r]
if not rows:
    sys.exit("pipeline_memory.sh: no activation report in " + out)
for r in rows:
    stage, held = int(r.group(1)), int(r.group(2))
    slots, scratch, grew = float(r.group(3)), float(r.group(4) or 0), float(r.group(5))
    # Megatron-LM, full recompute: each layer input (s x b x h, fp32) of the stage's layers,
    # per micro-batch held
    meg = held * (layers / pp) * seq * (batch / m) * width * 4 / 1048576
    ratio = f"{slots / meg:.2f}" if rc == "full" else "-"
    print(f"{case:<16} {rc:<5} {stage:5d} {held:6d} {slots:10.2f} {scratch:10.2f} {grew:10.2f} "
          f"{meg:12.2f} {ratio:>7}")
PY
  done
done

#!/usr/bin/env bash
# bf16 mixed precision against fp32 on this machine: for each mesh (dp2, tp2 and dp2 zero1 on
# 2 thread ranks by default) `meshscope train --precision fp32|bf16` side by side, reporting
# the bytes every collective moved per step (measured: the trace's traffic matrix over all
# communicators), rank 0's parameters, gradients, optimizer state and the rest of its device
# peak (activations, staging, workspace), and the median step time.
#
# Usage: bench/precision.sh [--bin build/meshscope] [--model configs/gpt-bench.json]
#          [--batch 8] [--seq 128] [--steps 8] [--skip 2] [--rounds 3] [--max-wait 120]
#          [--meshes "dp=2 tp=2 dp=2,zero=1"]
#
# Each round runs every (mesh, precision) once, interleaved, so slow spells of a shared
# machine spread over both precisions; a run's time is the median step_ms over steps >= --skip
# of all its rounds. Exits 1 when bf16 moves more than 55% of fp32's collective bytes on any
# mesh, or does not cut the gradients to half and the activations by a quarter.
set -euo pipefail
bin=build/meshscope
model=configs/gpt-bench.json
batch=8
seq=128
steps=8
skip=2
rounds=3
max_wait=120
meshes="dp=2 tp=2 dp=2,zero=1"
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
    *) echo "precision.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "precision.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# idle_pct, wait_quiet (before each run) and knob ("dp=2,zero=1" -> one knob)
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

echo "load before: $(cat /proc/loadavg)"
for r in $(seq "$rounds"); do
  for m in $meshes; do
    for p in fp32 bf16; do
      wait_quiet
      trace=""
      [ "$r" -eq 1 ] && trace="--trace $tmp/trace.$m.$p.json"
      # shellcheck disable=SC2086
      "$bin" train --model "$model" --data "$data" --steps "$steps" --batch "$batch" --seq "$seq" \
        --dp "$(knob "$m" dp 1)" --tp "$(knob "$m" tp 1)" --zero "$(knob "$m" zero 0)" \
        --precision "$p" --log-every 1000 --log-jsonl "$tmp/train.$m.$p.$r.jsonl" $trace \
        >"$tmp/out.$m.$p.$r" 2>&1 || { cat "$tmp/out.$m.$p.$r" >&2; exit 1; }
      [ "$r" -eq 1 ] && "$bin" trace summary "$tmp/trace.$m.$p.json" >"$tmp/summary.$m.$p" 2>&1
    done
  done
done
echo "load after:  $(cat /proc/loadavg)"
echo "idle CPU before each run: $(sort -n "$tmp/idle" | head -1)% to $(sort -n "$tmp/idle" | tail -1)%"

python3 - "$tmp" "$skip" "$steps" "$meshes" <<'PY'
import glob, json, re, statistics, sys
tmp, skip, steps, meshes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def mib(v, u):
    return float(v) * unit[u] / 2**20
def run(m, p):
    s = open(f"{tmp}/summary.{m}.{p}").read()
    t = re.search(r"Traffic \(all communicators\): ([0-9.]+) (\w+) sent", s)
    comm = mib(t.group(1), t.group(2)) / steps if t else 0.0
    mem = re.search(r"parameters ([0-9.]+) MiB, gradients ([0-9.]+) MiB, optimizer state "
                    r"([0-9.]+) MiB, activations and the rest ([0-9.]+) MiB",
                    open(f"{tmp}/out.{m}.{p}.1").read())
    ms = [d["step_ms"] for f in glob.glob(f"{tmp}/train.{m}.{p}.*.jsonl")
          for d in map(json.loads, open(f)) if d["step"] >= skip]
    return comm, [float(x) for x in mem.groups()], statistics.median(ms)
fails = 0
print(f"{'mesh':12s} {'prec.':5s} {'comm MiB/step':>13s} {'params':>7s} {'grads':>7s} "
      f"{'optim':>7s} {'rest':>7s} {'step ms':>8s}   bf16 / fp32: comm, act., step")
for m in meshes:
    r = {p: run(m, p) for p in ("fp32", "bf16")}
    for p in ("fp32", "bf16"):
        comm, mem, ms = r[p]
        ratio = ""
        if p == "bf16":
            f = r["fp32"]
            cr = comm / f[0] if f[0] else 0
            ratio = f"  {cr:.3f}, {mem[3] / f[1][3]:.3f}, {ms / f[2]:.2f}"
            fails += f[0] > 0 and cr > 0.55
            fails += abs(mem[1] - f[1][1] / 2) > 0.02 * f[1][1] or mem[3] > 0.75 * f[1][3]
        print(f"{m:12s} {p:5s} {comm:13.2f} {mem[0]:7.2f} {mem[1]:7.2f} {mem[2]:7.2f} "
              f"{mem[3]:7.2f} {ms:8.1f}{ratio}")
sys.exit(1 if fails else 0)
PY

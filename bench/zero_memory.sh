#!/usr/bin/env bash
# ZeRO's memory as run against its formula: for each stage 0..3 on dp (4 thread ranks by
# default), `meshscope train --dp 4 --zero K` reports rank 0's parameters, gradients and optimizer state as
# allocated on its device and the rest of the device's peak (activations, inputs, staging,
# reshard workspace). Beside them: the formula of Rajbhandari et al. 2020 for fp32 AdamW
# (parameters 4 psi, gradients 4 psi, moments 8 psi; stage k divides the parts it shards by
# dp: 1 the moments, 2 also the gradients, 3 also the parameters), with psi counted from the
# config (GPT-2's layout), and what `meshscope plan` predicts for the same strategy. With
# --precision bf16 the formula is mixed precision's: parameters 2 psi (the bf16 use copies),
# gradients 2 psi, optimizer state K psi = 12 psi (fp32 master weights and moments).
#
# Usage: bench/zero_memory.sh [--bin build/meshscope] [--model configs/gpt-bench.json]
#          [--dp 4] [--batch 8] [--seq 128] [--steps 2] [--precision fp32|bf16]
set -euo pipefail
bin=build/meshscope
model=configs/gpt-bench.json
dp=4
batch=8
seq=128
steps=2
precision=fp32
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --dp) dp=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    *) echo "zero_memory.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "zero_memory.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# psi: GPT-2's parameters (wte, wpe, per layer 12 C^2 + 13 C, the final LayerNorm)
psi=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); C=c["n_embd"]
print(c["vocab_size"]*C + c["n_positions"]*C + c["n_layer"]*(12*C*C + 13*C) + 2*C)' "$model")
echo "model $model: psi = $psi parameters; dp $dp, batch $batch x $seq, $steps steps, $precision"
echo "load before: $(cat /proc/loadavg)"
printf '%-6s | %-17s | %-17s | %-17s | %-20s | %-9s | %s\n' stage "params MiB" "grads MiB" \
  "optimizer MiB" "state MiB (ratio)" "act. MiB" "plan: state / act. MiB"
printf '%-6s | %-17s | %-17s | %-17s | %-20s | %-9s | %s\n' "" "run / formula" "run / formula" \
  "run / formula" "run / formula" run ""
for z in 0 1 2 3; do
  "$bin" train --model "$model" --data "$data" --steps "$steps" --batch "$batch" --seq "$seq" \
    --dp "$dp" --zero "$z" --precision "$precision" --log-every 1000 >"$tmp/out" 2>&1 ||
    { cat "$tmp/out" >&2; exit 1; }
  line=$(grep '^memory on rank 0' "$tmp/out")
  "$bin" plan --model "$model" --cluster cpu-local --devices "$dp" --global-batch "$batch" \
    --seq "$seq" --json --evaluate "dp=$dp,tp=1,pp=1,cp=1,zero=$z,recompute=0,micro=1" --dtype "$precision" \
    --top 1 >"$tmp/plan.json" 2>/dev/null
  python3 - "$z" "$dp" "$psi" "$line" "$tmp/plan.json" "$precision" <<'EOF'
import json, re, sys
z, dp, psi, line, plan = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
w, k = (2, 12) if sys.argv[6] == "bf16" else (4, 8)  # bytes: weights and gradients, optimizer
mib = 1048576.0
run = [float(x) for x in re.findall(r"([0-9.]+) MiB", line)]  # params grads optim rest peak
f = [w * psi / (dp if z >= 3 else 1), w * psi / (dp if z >= 2 else 1), k * psi / (dp if z >= 1 else 1)]
f = [x / mib for x in f]
mem = json.load(open(plan))["candidates"][0]["memory_bytes"]
pstate = (mem["params"] + mem["grads"] + mem["optimizer"]) / mib
state, fstate = sum(run[:3]), sum(f)
cell = lambda a, b: "%7.2f / %7.2f" % (a, b)
print("%-6s | %s | %s | %s | %s (%.3f) | %9.2f | %.2f / %.2f" % (
    "zero%d" % z, cell(run[0], f[0]), cell(run[1], f[1]), cell(run[2], f[2]),
    "%6.2f / %6.2f" % (state, fstate), state / fstate, run[3], pstate, mem["activations"] / mib))
EOF
done

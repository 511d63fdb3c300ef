#!/usr/bin/env bash
# ZeRO-Offload on this machine: step time and the optimizer time left on the step's critical
# path, for no offload, offload with the host AdamW inside the step (--offload-serial),
# offload overlapped (--offload: the gradient copies during backward, the host AdamW after the
# clipping norm, hidden by the next step's forward) and the same without clipping (--clip 0:
# each parameter's host AdamW right after its copy, during backward; beside it no offload with
# --clip 0), on one rank of gpt-bench with a small batch, so that the optimizer is a visible
# share of the step.
#
# Usage: bench/offload.sh [--bin build/meshscope] [--model configs/gpt-bench.json]
#          [--batch 4] [--seq 64] [--steps 20] [--skip 4] [--rounds 5] [--device cpu]
#          [--threads 1] [--max-wait 60]
#
# --threads N gives the rank's kernels N BLAS threads (0: the cores / ranks default); on a CPU
# "device" the host AdamW's worker competes with them for the same cores, so --threads 1 on a
# 2-core machine leaves it a core, as ZeRO-Offload leaves the CPU to the optimizer.
#
# Each round runs the three modes once, interleaved, each traced (`train --trace`). Per run:
# the median step_ms over steps >= --skip (the JSONL log); from the trace, per step, the
# exposed optimizer time (the rank thread's optimizer span: the device AdamW without offload,
# the gradient copies and, serial, the host AdamW and parameter copies; with the overlap also
# the waits for a parameter and its copy inside the next forward) and the host AdamW time (the
# "adamw (host)" spans of the "optimizer (host)" lane) and, overlapped, how much of it ran
# during the step's backward (before its optimizer span began), medians over steps >= --skip. The table shows the medians over the
# rounds. Before each run the script waits (up to --max-wait s) for the CPUs to be 85% idle.
set -euo pipefail
bin=build/meshscope
model=configs/gpt-bench.json
batch=4
seq=64
steps=20
skip=4
rounds=5
device=cpu
threads=1
max_wait=60
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_opts offload.sh "$@"
[ -x "$bin" ] || { echo "offload.sh: no binary at $bin (build first or pass --bin)" >&2; exit 2; }
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

modes="none serial overlap none_noclip overlap_noclip"
flags() {
  case "$1" in
    none) ;;
    serial) echo "--offload --offload-serial" ;;
    overlap) echo "--offload" ;;
    none_noclip) echo "--clip 0" ;;
    overlap_noclip) echo "--offload --clip 0" ;;
  esac
}

echo "load before: $(cat /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  for mode in $modes; do
    wait_quiet
    # shellcheck disable=SC2046
    "$bin" train --model "$model" --data "$data" --device "$device" --steps "$steps" \
      --batch "$batch" --seq "$seq" --log-every 1000 --threads "$threads" $(flags $mode) \
      --log-jsonl "$tmp/$mode.$r.jsonl" --trace "$tmp/$mode.$r.trace.json" >"$tmp/$mode.$r.out" 2>&1 ||
      { cat "$tmp/$mode.$r.out"; exit 1; }
  done
done

python3 - "$tmp" "$rounds" "$skip" <<'PY'
import json, statistics as st, sys
tmp, rounds, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def per_step(trace):
    ev = json.load(open(trace))["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    opt = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "optimizer" and e["pid"] == 0]
    spans = [e for e in opt if e["name"] == "optimizer"]
    inside = lambda e: any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in spans)
    exposed, host, early = {}, {}, {}
    start = {s["args"].get("step", -1): s["ts"] for s in spans}
    for e in opt:
        k = e["args"].get("step", -1)
        if names.get((e["pid"], e["tid"])) == "optimizer (host)":
            if e["args"].get("op") != "adamw (host)":
                continue
            host[k] = host.get(k, 0) + e["dur"]
            # step k-1's update, taken (and stamped) in step k: during k-1's backward when it
            # ended before k-1's optimizer span began
            if k - 1 in start and e["ts"] + e["dur"] <= start[k - 1]:
                early[k] = early.get(k, 0) + e["dur"]
        elif e["name"] == "optimizer" or (
                e["args"].get("op") in ("offload wait", "memcpy H2D") and not inside(e)):
            exposed[k] = exposed.get(k, 0) + e["dur"]
    med = lambda d: st.median([v for k, v in d.items() if k >= skip]) / 1e3 if d else 0.0
    return med(exposed), med(host), med(early)

rows = {}
for mode in ("none", "serial", "overlap", "none_noclip", "overlap_noclip"):
    step, exp, host, early = [], [], [], []
    for r in range(1, rounds + 1):
        log = [json.loads(l) for l in open(f"{tmp}/{mode}.{r}.jsonl") if l.strip()]
        step.append(st.median([x["step_ms"] for x in log if x["step"] >= skip]))
        e, h, b = per_step(f"{tmp}/{mode}.{r}.trace.json")
        exp.append(e), host.append(h), early.append(b)
    rows[mode] = (st.median(step), st.median(exp), st.median(host), st.median(early))
label = {"none": "no offload, clip 1", "serial": "offload, host AdamW in the step, clip 1",
         "overlap": "offload overlapped, clip 1 (copies in backward, AdamW in the next forward)",
         "none_noclip": "no offload, clip 0",
         "overlap_noclip": "offload overlapped, clip 0 (copies and AdamW in backward)"}
print("| mode | step (ms) | exposed optimizer (ms) | host AdamW (ms) | of it in backward (ms) |")
print("|---|---|---|---|---|")
for m, (s, e, h, b) in rows.items():
    print(f"| {label[m]} | {s:.2f} | {e:.2f} | {h:.2f} | {b:.2f} |" if m.startswith(("serial", "overlap"))
          else f"| {label[m]} | {s:.2f} | {e:.2f} | - | - |")
PY
echo "CPU idle before the runs: $(sort -n "$tmp/idle" | head -1)-$(sort -n "$tmp/idle" | tail -1)%"
echo "load after: $(cat /proc/loadavg)"

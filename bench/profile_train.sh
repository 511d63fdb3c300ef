#!/usr/bin/env bash
# profile_train.sh - where `meshscope train` spends a steady-state training step: samples one
# rank's run with `perf record` over a window that opens once the first --skip steps are
# logged (so start-up, parameter initialisation and step 0's first touch of every buffer are
# out) and closes before the final validation pass, then groups the symbols into kernels
# (sgemm, GELU, AdamW, ...).
#
#   bench/profile_train.sh [--build-dir DIR] --model CONFIG --batch B --seq T --threads K
#                          [--skip N] [--window S] [--steps N]
#
# --skip defaults to 2 steps, --window to 10 seconds. The training run gets enough steps to
# outlast the window (--steps, default 50000); it is stopped once perf is done. Needs perf
# (Debian: linux-perf) and permission to profile this user's processes
# (kernel.perf_event_paranoid <= 2). Used for docs/benchmarks.md. With K >= 2 threads, most
# "kernel" samples are OpenBLAS's idle workers in sched_yield while the main thread runs the
# single-threaded kernels.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

build_dir="${BUILD_DIR:-build}"
model="" batch="" seq="" threads=1 skip=2 window=10 steps=50000
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "profile_train: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --build-dir) build_dir="$2" ;;
    --model) model="$2" ;;
    --batch) batch="$2" ;;
    --seq) seq="$2" ;;
    --threads) threads="$2" ;;
    --skip) skip="$2" ;;
    --window) window="$2" ;;
    --steps) steps="$2" ;;
    *) echo "profile_train: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
[ -n "$model" ] && [ -n "$batch" ] && [ -n "$seq" ] ||
  { echo "profile_train: --model, --batch and --seq are required" >&2; exit 2; }
exe="$build_dir/meshscope"
[ -x "$exe" ] || { echo "profile_train: $exe is missing; build meshscope first" >&2; exit 1; }
command -v perf >/dev/null || { echo "profile_train: perf is not installed" >&2; exit 1; }
[ -s data/kjv.txt ] || bash scripts/prepare-data.sh

tmp="$(mktemp -d)"
pid=
# The training run never outlives the script: an early exit (set -e, a signal) ends it too.
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT HUP
OPENBLAS_NUM_THREADS="$threads" "$exe" train --model "$model" --data data/kjv.txt \
  --steps "$steps" --batch "$batch" --seq "$seq" --threads "$threads" \
  --log-jsonl "$tmp/log.jsonl" --log-every 1000000 >"$tmp/train.out" 2>&1 &
pid=$!
# Where the shell keeps a subshell around the background command, profile the binary itself.
if [ "$(cat /proc/$pid/comm 2>/dev/null)" != meshscope ]; then
  sleep 0.5
  pid="$(pgrep -n -x -P "$pid" meshscope || echo "$pid")"
fi
# Wait (up to 10 minutes) until --skip steps are in the log.
for _ in $(seq 1 6000); do
  kill -0 "$pid" 2>/dev/null ||
    { cat "$tmp/train.out" >&2; echo "profile_train: training ended early" >&2; exit 1; }
  [ "$(cat "$tmp/log.jsonl" 2>/dev/null | wc -l)" -ge "$skip" ] && break
  sleep 0.1
done
skipped=$(wc -l <"$tmp/log.jsonl")
perf record -F 999 -o "$tmp/perf.data" -p "$pid" -- sleep "$window" >"$tmp/perf.out" 2>&1 ||
  { cat "$tmp/perf.out" >&2; kill "$pid"; exit 1; }
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
steps_done=$(wc -l <"$tmp/log.jsonl")
echo "profiled $model B=$batch T=$seq threads=$threads: a ${window}s window from step" \
  "$skipped to step $steps_done"
perf report -i "$tmp/perf.data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null |
  /usr/bin/python3 -c '
import re, sys
groups = [
    ("sgemm (OpenBLAS kernels and packing)", r"^sgemm_|^SGEMM|gemm_"),
    ("OpenBLAS threads waiting (sched_yield, blas_thread_server)",
     r"sched_yield|blas_thread|exec_blas"),
    ("GELU (tanhf, expm1f, ms_k_gelu_*)", r"tanhf|expm1f|ms_k_gelu"),
    ("AdamW (ms_adamw_step)", r"ms_adamw"),
    ("memset/memcpy (gradient zeroing, copies)", r"memset|memcpy|memmove"),
    ("softmax, attention, cross-entropy (expf, ms_k_attention, ms_k_xent, ms_k_softmax)",
     r"expf|ms_k_attention|ms_k_xent|ms_k_softmax"),
    ("LayerNorm", r"ms_k_layernorm"),
    ("bias, add, scale, embedding", r"ms_k_bias|ms_k_add|ms_k_scale|ms_scale|ms_k_embedding"),
    ("gradient norm (ms_sumsq_f32)", r"ms_sumsq"),
    ("kernel (page faults, interrupts, scheduling)", r"^\[k\]"),
]
tot = {g[0]: 0.0 for g in groups}
tot["other"] = 0.0
top = []
for line in sys.stdin:
    m = re.match(r"\s+([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*\S)", line)
    if not m:
        continue
    pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).split()[0]
    top.append((pct, dso, sym))
    key = ("[k] " if kind == "k" else "") + sym
    for name, rx in groups:
        if re.search(rx, sym) or (kind == "k" and rx == r"^\[k\]"):
            tot[name] += pct
            break
    else:
        tot["other"] += pct
print("\nshare of samples by kernel group:")
for name, pct in sorted(tot.items(), key=lambda x: -x[1]):
    if pct >= 0.05:
        print(f"  {pct:5.1f}%  {name}")
print("\ntop symbols:")
for pct, dso, sym in top[:20]:
    print(f"  {pct:5.1f}%  {sym}  ({dso})")
'

#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU: show the GPU (nvidia-smi),
# configure a CUDA build, build, and run every test labelled `cuda` (test_cuda: the CUDA
# device; test_cupti: the CUPTI collector; test_nccl: the NCCL communicator backend;
# test_cuda_kernels: every CUDA kernel against the CPU kernels; test_cuda_host: the kernels'
# arithmetic on the CPU). Then training on the GPU, each step recorded under $OUT_DIR:
#   - gpt-tiny, 50 steps, on the GPU and on the CPU: losses within 1e-4 (fp32) and within
#     2e-2 relative (bf16, whose rounding differs between the two kernel sets);
#   - dp2 x tp2 on four thread ranks sharing the one GPU (collectives staged through the host)
#     against one CPU rank;
#   - gpt-tiny bf16 with ZeRO-Offload (masters and AdamW on the host, pinned) against the same
#     run without it, and the device memory of both;
#   - GPT-2 124M, 20 steps in bf16: step time, tokens/s and model FLOP utilisation against
#     the GPU's bf16 peak (GPU_PEAK_TFLOPS, default 989 for an H100/H200);
#   - the planner's prediction for that run on this machine's GPU (--cluster gpu-local);
#   - the same run traced (CUPTI): the tracing overhead;
#   - a traced GPU run (CUPTI) and `meshscope trace check` on it;
#   - with 2 GPUs or more and NCCL: dp 2 on two GPUs (the dp dim on NCCL), traced: NCCL loads
#     meshscope's profiler plugin, and the trace has its calls on the "NCCL (plugin)" lane,
#     linked to meshscope's collectives (skipped, and said so, with fewer GPUs);
#   - bench_gemm_cuda (bench/gemm_cuda.c): bf16 GEMMs through the kernel table against
#     cublasGemmEx at 4096^3 and GPT-2 124M's shapes (the 50257-wide head among them);
#   - bench/attention_cuda.sh: GPT-2 124M's bf16 attention (forward + backward) through the
#     kernel table, tensor-core flash kernels and row kernels, and PyTorch's SDPA beside them;
#     then the same at LLaMA's head size 128;
#   - bench/pipeline.sh's pp 4 cases on thread ranks with a core each (not a GPU check: the
#     development machine has 2 cores for pp 4's 4 ranks).
#
# A machine without the build dependencies and without package access (a bare GPU image):
# make .gpu-bundle on a Debian 12 machine with scripts/gpu-bundle.sh and copy it into this
# checkout; the check unpacks what the machine lacks into $BUILD_DIR/deps, and takes the
# training text from it.
#
# Safe to run again and again: the build directory is reused (an incremental build) and
# nothing outside it and data/ is written. Every step has a time limit, so a run ends within about
# 9 minutes (BUDGET_S) whatever happens. Exits non-zero when something failed, and also when a cuda
# test skipped although nvidia-smi saw a GPU (a skip there means the GPU was not usable).
#
#   BUILD_DIR  the build directory (default: build-gpu)
#   JOBS       parallel build jobs (default: nproc)
#   OUT_DIR    where the results and logs go (default: $BUILD_DIR/gpu-check)
#   ARCHIVE    also pack them into this .tar.gz, after each section and at the end (optional)
#   BUDGET_S   seconds the whole check may take (default 540); the sections run most
#              important first, and one that would not fit in what is left is skipped
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
OUT_DIR=${OUT_DIR:-$BUILD_DIR/gpu-check}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
mkdir -p "$BUILD_DIR" "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
BUDGET_S=${BUDGET_S:-540}
# ARCHIVE: every result and log of this run packed into one file, after each section and when
# the script ends (for a machine whose results come back as a few files, and whose command
# may be stopped before the end).
pack_results() {
  if [ -n "${ARCHIVE:-}" ]; then
    tar -czf "$ARCHIVE.tmp" -C "$OUT_DIR" . && mv "$ARCHIVE.tmp" "$ARCHIVE"
  fi
}
if [ -n "${ARCHIVE:-}" ]; then
  trap 'pack_results && echo "=== results packed into $ARCHIVE"' EXIT
  trap 'exit 143' TERM INT
fi

echo "=== nvidia-smi"
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  if timeout 60 nvidia-smi; then
    nvidia-smi -L 2>/dev/null | grep -q '^GPU' && have_gpu=1
  else
    echo "nvidia-smi failed: no usable driver; the cuda tests will skip"
  fi
else
  echo "nvidia-smi not found: no NVIDIA driver here; the cuda tests will skip"
fi

echo "=== prerequisites"
have_prereqs() { # sets missing
  missing=""
  for tool in cmake cc pkg-config python3; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
  done
  for mod in cmocka openblas libcjson zlib ncursesw libcurl libmicrohttpd; do
    pkg-config --exists "$mod" 2>/dev/null || missing="$missing $mod"
  done
  [ -z "$missing" ]
}
if ! have_prereqs; then
  echo "missing:$missing"
  # A machine without package access: the packages of .gpu-bundle (scripts/gpu-bundle.sh,
  # made on a machine that has Debian's archive), unpacked into the build directory.
  if [ ! -d .gpu-bundle ]; then
    echo "Debian: scripts/install-deps.sh installs them. Without package access: run" \
      "scripts/gpu-bundle.sh on a Debian 12 machine and copy its .gpu-bundle here"
    exit 2
  fi
  echo "unpacking what this machine lacks from .gpu-bundle"
  # shellcheck source=scripts/gpu-bundle-env.sh
  . scripts/gpu-bundle-env.sh
  bundle_env .gpu-bundle "$PWD/$BUILD_DIR/deps" || exit 2
  if ! have_prereqs; then
    echo "still missing after unpacking:$missing"
    exit 2
  fi
fi
echo "ok"

echo "=== the CUDA toolkit"
# nvcc where CMake looks (PATH, /usr/local/cuda), else in a Python environment's CUDA wheels;
# NCCL next to the toolkit, else in the nvidia-nccl wheel. Both only hints: the configure
# summary below says what was found.
py_nvidia=$(python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  nvcc_path=$(find $py_nvidia -name nvcc -type f -path '*/bin/*' 2>/dev/null | head -1)
  [ -n "$nvcc_path" ] && export PATH="$PATH:$(dirname "$nvcc_path")"
fi
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2
cuda_args=()
if [ ! -e /usr/local/cuda/include/nccl.h ] && [ -n "$py_nvidia" ]; then
  nccl_h=$(find $py_nvidia -name nccl.h 2>/dev/null | head -1)
  if [ -n "$nccl_h" ]; then
    cuda_args+=("-DNCCL_ROOT=$(dirname "$(dirname "$nccl_h")")")
    echo "NCCL: $(dirname "$(dirname "$nccl_h")")"
  fi
fi
# Device code for this machine's GPU only (a shorter build than every architecture).
if [ "$have_gpu" -eq 1 ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
  if [ -n "$cap" ]; then
    cuda_args+=("-DCMAKE_CUDA_ARCHITECTURES=$cap")
    echo "building device code for compute capability $cap"
  fi
fi

echo "=== configure ($BUILD_DIR)"
log="$OUT_DIR/configure.log"
# Warnings are not errors here: the GPU machine's compilers may be newer than CI's, whose
# -Werror build keeps the code clean; a new warning must not cost the GPU run.
if ! timeout 90 cmake -S . -B "$BUILD_DIR" -DMS_ENABLE_CUDA=ON -DMS_WERROR=OFF "${cuda_args[@]}" \
  >"$log" 2>&1; then
  tail -40 "$log"
  echo "configure failed (full log: $log)"
  exit 1
fi
grep -E "CUDA \(cudart\)|CUPTI  |NCCL  " "$log"
if ! grep -qE "CUDA \(cudart\) +ON" "$log"; then
  echo "the CUDA toolkit was not found: nothing to check (install it, or set CUDAToolkit_ROOT)"
  exit 2
fi
# The loader must find the CUDA libraries the build links (a toolkit outside the loader's
# paths, NCCL from a wheel): each one's folder that ldconfig does not list, appended.
for var in CUDA_cudart_LIBRARY CUDA_cublas_LIBRARY CUDA_cublasLt_LIBRARY CUDA_cupti_LIBRARY \
  NCCL_LIBRARY; do
  lib=$(sed -n "s/^$var:FILEPATH=//p" "$BUILD_DIR/CMakeCache.txt")
  [ -n "$lib" ] && [ -e "$lib" ] || continue
  dir=$(dirname "$(readlink -f "$lib")")
  ldconfig -p 2>/dev/null | grep -q " => $dir/" && continue
  case ":${LD_LIBRARY_PATH:-}:" in
  *":$dir:"*) ;;
  *) export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir" && echo "loader path += $dir" ;;
  esac
done
have_nccl=0
if grep -qE "NCCL +ON" "$log"; then
  have_nccl=1
else
  echo "warning: NCCL was not found; test_nccl only checks that the build says so"
fi
# Every executable the cuda labels run (test names are target names), the CLI and the GEMM
# benchmark; the NCCL profiler plugin with NCCL.
mapfile -t cuda_targets < <(cd "$BUILD_DIR" && ctest -N -L cuda | awk '/Test +#/ { print $3 }')
[ "$have_nccl" -eq 1 ] && cuda_targets+=(meshscope-nccl-profiler)

echo "=== build (-j$JOBS): ${cuda_targets[*]} meshscope bench_gemm_cuda bench_attention_cuda"
log="$OUT_DIR/build.log"
if ! timeout 300 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${cuda_targets[@]}" meshscope \
  bench_gemm_cuda bench_attention_cuda >"$log" 2>&1; then
  grep -E "error|warning" "$log" | head -40
  tail -20 "$log"
  echo "build failed (full log: $log)"
  exit 1
fi
echo "ok ($(grep -c 'warning' "$log") warning lines in $log)"

echo "=== ctest -L cuda"
out="$OUT_DIR/ctest-cuda.log"
(cd "$BUILD_DIR" && timeout 150 ctest -L cuda --output-on-failure --timeout 140) 2>&1 |
  tee "$out"
rc=${PIPESTATUS[0]}
failed=0
if [ "$rc" -ne 0 ]; then
  echo "cuda tests failed (rc $rc)"
  failed=1
fi
if [ "$have_gpu" -eq 1 ] && grep -q "(Skipped)" "$out"; then
  echo "a cuda test skipped although nvidia-smi lists a GPU: read its SKIP line above"
  failed=1
fi
[ "$failed" -eq 0 ] && echo "=== all cuda tests passed"
if [ "$have_gpu" -ne 1 ]; then
  echo "no GPU: the training checks need one"
  exit "$failed"
fi

ms="$BUILD_DIR/meshscope"
data=data/kjv.txt
[ -s "$data" ] || scripts/prepare-data.sh >/dev/null
# step_check NAME TIMEOUT ARGS...: one training run, its log in $OUT_DIR/NAME.{out,jsonl}
run_train() {
  local name=$1 limit=$2
  shift 2
  if timeout "$limit" "$ms" train --data "$data" --log-every 1 --log-jsonl "$OUT_DIR/$name.jsonl" \
    "$@" >"$OUT_DIR/$name.out" 2>&1; then
    return 0
  fi
  echo "$name: failed (rc $?); last lines:"
  tail -5 "$OUT_DIR/$name.out"
  failed=1
  return 1
}
# compare A B TOL: the losses of two logs agree within TOL (relative) at every step
compare() {
  python3 - "$OUT_DIR/$1.jsonl" "$OUT_DIR/$2.jsonl" "$3" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol = float(sys.argv[3])
worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"  {len(a)} steps, worst relative loss difference {worst:.3g} (tolerance {tol:g}): "
    + ("ok" if worst <= tol else "FAILED"))
sys.exit(0 if worst <= tol else 1)
PY
}

# section TITLE NEED_S: starts a section when the time budget leaves NEED_S seconds for it,
# after packing what the earlier ones wrote (so a run cut short still returns its results).
section() {
  pack_results
  if [ $((SECONDS + $2)) -gt "$BUDGET_S" ]; then
    echo "=== $1: skipped, ${BUDGET_S} s budget ($SECONDS s used)"
    return 1
  fi
  echo "=== $1"
}

tiny=(--model configs/gpt-tiny.json --steps 50 --batch 8 --seq 64)
if section "gpt-tiny, 50 steps, GPU against CPU (fp32, then bf16)" 60; then
  for prec in fp32 bf16; do
    tol=1e-4
    [ "$prec" = bf16 ] && tol=2e-2
    run_train "tiny-$prec-cuda" 120 "${tiny[@]}" --precision "$prec" --device cuda &&
      run_train "tiny-$prec-cpu" 120 "${tiny[@]}" --precision "$prec" --device cpu &&
      { compare "tiny-$prec-cuda" "tiny-$prec-cpu" "$tol" || failed=1; }
  done
fi

if section "GPT-2 124M, 20 steps, bf16: step time, tokens/s, MFU" 90; then
  if run_train gpt2-124m 240 --model bench/configs/gpt2-small.json --steps 20 --batch 8 --seq 1024 \
    --precision bf16 --device cuda; then
    python3 - "$OUT_DIR/gpt2-124m.jsonl" "${GPU_PEAK_TFLOPS:-989}" <<'PY' | tee "$OUT_DIR/mfu.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]  # after warm-up
ms = statistics.median(r["step_ms"] for r in rows)
tokens = 8 * 1024
n = 124.44e6  # parameters of GPT-2 small, tied embedding counted once
flops = 6 * n * tokens + 12 * 12 * 1024 * 768 * tokens  # weights, then attention (as Megatron)
print(f"  step {ms:.1f} ms, {tokens / ms * 1e3:.0f} tokens/s, "
      f"MFU {flops / (ms / 1e3) / (float(sys.argv[2]) * 1e12) * 100:.1f}% of {sys.argv[2]} TFLOP/s")
PY
  fi
fi

if section "bf16 attention, forward + backward: tensor-core flash, row kernels, PyTorch SDPA" 90; then
  timeout 120 bash bench/attention_cuda.sh --bin "$BUILD_DIR/bench_attention_cuda" |
    tee "$OUT_DIR/attention-cuda.txt" || failed=1
  # LLaMA's head size 128 (32 heads of a 4096-wide model, 2 x 2048 tokens): flash at its
  # largest instantiation, whose backward spills a few dozen bytes
  timeout 120 bash bench/attention_cuda.sh --bin "$BUILD_DIR/bench_attention_cuda" --b 2 \
    --t 2048 --c 4096 --nh 32 --reps 3 | tee -a "$OUT_DIR/attention-cuda.txt" || failed=1
fi

if section "bf16 GEMM through the kernel table against cuBLAS called directly (goal: 0.9 or more)" 60; then
  for shape in "4096 4096 4096" "8192 2304 768" "8192 3072 768" "8192 768 3072" "8192 50257 768"; do
    read -r m n k <<<"$shape"
    timeout 60 "$BUILD_DIR/bench_gemm_cuda" --m "$m" --n "$n" --k "$k" --dtype bf16 |
      tee -a "$OUT_DIR/gemm-cuda.txt" || failed=1
  done
fi

if section "the planner on this machine's GPUs (gpu-local) against the GPT-2 124M run above" 20; then
  if [ ! -s "$OUT_DIR/gpt2-124m.jsonl" ]; then
    echo "  skipped: the GPT-2 124M run did not finish"
  elif timeout 60 "$ms" plan --model bench/configs/gpt2-small.json --cluster gpu-local --devices 1 \
      --global-batch 8 --seq 1024 --dtype bf16 --evaluate "dp=1,tp=1,pp=1,cp=1,micro=1,offload=0" \
      --json >"$OUT_DIR/plan-gpu-local.json" 2>"$OUT_DIR/plan-gpu-local.err"; then
    python3 - "$OUT_DIR/plan-gpu-local.json" "$OUT_DIR/gpt2-124m.jsonl" <<'PY' | tee "$OUT_DIR/plan-vs-measured.txt"
import json, statistics, sys
pred = json.load(open(sys.argv[1]))["candidates"][0]["step_time_s"] * 1e3
ms = statistics.median(json.loads(l)["step_ms"] for l in list(open(sys.argv[2]))[5:])
print(f"  predicted {pred:.1f} ms per step, measured {ms:.1f} ms ({(pred / ms - 1) * 100:+.1f}%)")
PY
  else
    echo "  the planner failed on gpu-local:"; tail -3 "$OUT_DIR/plan-gpu-local.err"; failed=1
  fi
fi

if section "CUPTI tracing overhead: GPT-2 124M traced against the run above (goal: at most 3%)" 90; then
  if [ -s "$OUT_DIR/gpt2-124m.jsonl" ] &&
    run_train gpt2-124m-traced 240 --model bench/configs/gpt2-small.json --steps 20 --batch 8 \
      --seq 1024 --precision bf16 --device cuda --trace "$OUT_DIR/gpt2-124m-trace.json"; then
    python3 - "$OUT_DIR/gpt2-124m.jsonl" "$OUT_DIR/gpt2-124m-traced.jsonl" <<'PY' |
import json, statistics, sys
ms = [statistics.median(json.loads(l)["step_ms"] for l in list(open(f))[5:]) for f in sys.argv[1:]]
print(f"  step {ms[0]:.1f} ms untraced, {ms[1]:.1f} ms traced: overhead {(ms[1] / ms[0] - 1) * 100:+.1f}%")
PY
      tee "$OUT_DIR/cupti-overhead.txt"
    # Where a step's GPU time goes, before the trace is removed: the trace's own summary, and
    # the kernels by total GPU time with the operator that launched them.
    timeout 120 "$ms" trace summary "$OUT_DIR/gpt2-124m-trace.json" --steps 5: \
      >"$OUT_DIR/gpt2-124m-trace-summary.txt" 2>&1
    python3 - "$OUT_DIR/gpt2-124m-trace.json" <<'PY' | tee "$OUT_DIR/gpt2-124m-kernels.txt"
import collections, json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"]
      if e.get("ph") == "X" and e.get("cat") == "kernel"]
tot = collections.defaultdict(lambda: [0.0, 0])
for e in ev:
    k = (e["args"].get("op", "?"), e["name"][:60])
    tot[k][0] += e["dur"]
    tot[k][1] += 1
busy = sum(v[0] for v in tot.values())
print(f"  {len(ev)} kernels, {busy / 1e3:.1f} ms of GPU time in all; the top 25:")
for (op, name), (us, n) in sorted(tot.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"  {us / 1e3:9.2f} ms {100 * us / busy:5.1f}% {n:6d}x  {op:18s} {name}")
PY
    rm -f "$OUT_DIR/gpt2-124m-trace.json" # large; the small traced run below is kept
  fi
fi

if section "a traced GPU run (CUPTI) and the trace's check" 40; then
  run_train traced 120 "${tiny[@]}" --steps 4 --device cuda --trace "$OUT_DIR/trace.json" &&
    { timeout 60 "$ms" trace check "$OUT_DIR/trace.json" | tee "$OUT_DIR/trace-check.txt" || failed=1; } &&
    { kernels=$(grep -o '"cat":"kernel"' "$OUT_DIR/trace.json" | wc -l)
      echo "  kernel slices: $kernels"
      [ "$kernels" -gt 0 ] || { echo "  FAILED: a CUDA run's trace holds no kernel (CUPTI recorded nothing)"; failed=1; }; }
fi

if section "dp2 x tp2 on one GPU (four ranks, host-staged collectives) against one CPU rank" 60; then
  run_train dp2tp2-cuda 180 "${tiny[@]}" --steps 20 --dp 2 --tp 2 --device cuda &&
    run_train one-cpu 120 "${tiny[@]}" --steps 20 --device cpu &&
    { compare dp2tp2-cuda one-cpu 1e-4 || failed=1; }
fi

if section "ZeRO-Offload on the GPU, bf16: pinned host masters and AdamW against the device's" 60; then
  # The host AdamW (CPU kernels) and the device's differ in the last bits, which bf16 rounding
  # can carry into a weight: the bf16 tolerance of GPU against CPU.
  run_train tiny-bf16-offload 120 "${tiny[@]}" --steps 20 --precision bf16 --device cuda --offload &&
    run_train tiny-bf16-nooffload 120 "${tiny[@]}" --steps 20 --precision bf16 --device cuda &&
    { compare tiny-bf16-offload tiny-bf16-nooffload 2e-2 || failed=1; } &&
    grep -h "^memory on rank 0" "$OUT_DIR/tiny-bf16-nooffload.out" "$OUT_DIR/tiny-bf16-offload.out" |
    sed 's/^/  /'
fi

if section "NCCL's view in a trace: dp 2 on two GPUs over NCCL, traced (the NCCL profiler plugin)" 60; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$have_nccl" -ne 1 ] || [ "$ngpu" -lt 2 ]; then
    echo "  skipped: needs NCCL and 2 GPUs (NCCL: $have_nccl, GPUs: $ngpu)"
  elif run_train nccl-traced 180 "${tiny[@]}" --steps 6 --dp 2 --device cuda \
    --trace "$OUT_DIR/nccl-trace.json"; then
    grep -E "mesh|NCCL plugin|no NCCL profiler plugin" "$OUT_DIR/nccl-traced.out" | sed 's/^/  /'
    timeout 60 "$ms" trace check "$OUT_DIR/nccl-trace.json" | tee "$OUT_DIR/nccl-trace-check.txt" ||
      failed=1
    python3 - "$OUT_DIR/nccl-trace.json" <<'PY' | tee "$OUT_DIR/nccl-lane.txt" || failed=1
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
lane = {(e["pid"], e["tid"]) for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"
        and e["args"]["name"].startswith("NCCL (plugin)")}
nccl = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "nccl"]
linked = [e for e in nccl if e["args"].get("linked") == 1]
gpu = [e for e in nccl if e["args"].get("timing") == "gpu"]
ranks = sorted({e["pid"] for e in nccl})
print(f"  {len(nccl)} NCCL plugin slices on ranks {ranks}, {len(linked)} linked, {len(gpu)} GPU-timed; "
      f"algorithms {sorted({e['args']['algorithm'] for e in nccl})}")
ok = (nccl and len(ranks) == 2 and linked and all((e["pid"], e["tid"]) in lane for e in nccl)
      and all(e["args"]["algorithm"] and e["args"]["count"] >= 0 for e in nccl))
print("  ok" if ok else "  FAILED: no NCCL plugin records on both ranks (or none linked)")
sys.exit(0 if ok else 1)
PY
  fi
fi

if section "pipeline bubbles with a core per rank (this machine's CPUs; thread ranks, no GPU)" 150; then
  # The 2-core development machine time-shares pp 4's four ranks; here each gets its own core.
  if [ "$(nproc)" -ge 8 ]; then
    timeout 150 bash bench/pipeline.sh --bin "$ms" --rounds 2 \
      --cases "4:8:interleaved:2 4:4:interleaved:2 4:8:1f1b 4:8:zb-h1" \
      2>&1 | tee "$OUT_DIR/pipeline.txt" || echo "  pipeline bench failed or timed out (not a GPU check)"
  else
    echo "  skipped: $(nproc) cores, fewer than 8"
  fi
fi

echo "=== results in $OUT_DIR"
exit "$failed"

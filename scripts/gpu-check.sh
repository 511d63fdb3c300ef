#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU: show the GPU (nvidia-smi),
# configure a CUDA build, build the GPU tests, and run every test labelled `cuda`
# (test_cuda: the CUDA device; test_cupti: the CUPTI collector; test_nccl: the NCCL
# communicator backend; test_cuda_kernels: every CUDA kernel against the CPU kernels), and the
# `cuda-host` test the label regex also picks (test_cuda_host: the kernels' arithmetic on the
# CPU, which runs without a GPU too).
#
# Safe to run again and again: the build directory is reused (an incremental build) and
# nothing outside it is written. Every step has a time limit, so a run ends within about
# 8 minutes whatever happens. Exits non-zero when something failed, and also when a cuda
# test skipped although nvidia-smi saw a GPU (a skip there means the GPU was not usable).
#
#   BUILD_DIR  the build directory (default: build-gpu)
#   JOBS       parallel build jobs (default: nproc)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
mkdir -p "$BUILD_DIR"

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
missing=""
for tool in cmake cc pkg-config; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
for mod in cmocka openblas libcjson ncursesw libcurl libmicrohttpd; do
  pkg-config --exists "$mod" 2>/dev/null || missing="$missing $mod"
done
if [ -n "$missing" ]; then
  echo "missing:$missing (Debian: scripts/install-deps.sh installs them)"
  exit 2
fi
echo "ok"

echo "=== configure ($BUILD_DIR)"
log="$BUILD_DIR/gpu-check.configure.log"
if ! timeout 90 cmake -S . -B "$BUILD_DIR" -DMS_ENABLE_CUDA=ON -DMS_WERROR=ON >"$log" 2>&1; then
  tail -40 "$log"
  echo "configure failed (full log: $log)"
  exit 1
fi
grep -E "CUDA \(cudart\)|NCCL  " "$log"
if ! grep -qE "CUDA \(cudart\) +ON" "$log"; then
  echo "the CUDA toolkit was not found: nothing to check (install it, or set CUDAToolkit_ROOT)"
  exit 2
fi
grep -qE "NCCL +ON" "$log" ||
  echo "warning: NCCL was not found; test_nccl only checks that the build says so"

echo "=== build (-j$JOBS)"
log="$BUILD_DIR/gpu-check.build.log"
if ! timeout 240 cmake --build "$BUILD_DIR" -j "$JOBS" --target test_cuda test_cupti test_nccl \
  test_cuda_kernels test_cuda_host \
  >"$log" 2>&1; then
  grep -E "error|warning" "$log" | head -40
  tail -20 "$log"
  echo "build failed (full log: $log)"
  exit 1
fi
echo "ok"

echo "=== ctest -L cuda"
out="$BUILD_DIR/gpu-check.ctest.log"
(cd "$BUILD_DIR" && timeout 150 ctest -L cuda --output-on-failure --timeout 140) 2>&1 |
  tee "$out"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "cuda tests failed (rc $rc)"
  exit 1
fi
if [ "$have_gpu" -eq 1 ] && grep -q "(Skipped)" "$out"; then
  echo "a cuda test skipped although nvidia-smi lists a GPU: read its SKIP line above"
  exit 1
fi
echo "=== all cuda tests passed"

#!/usr/bin/env bash
# The whole test suite: a warnings-as-errors build, the same suite under ASan+UBSan, and
# the threads-backend tests under TSan. Prints one summary line per configuration with its
# build and test times, and a final "N passed, N failed" line; exits non-zero if anything
# failed.
#
# Where each property is checked:
#   release     every test, the CUDA kernels compiled for the GPU and their arithmetic run on
#               the host (label cuda-host);
#   asan+ubsan  every test except cuda-host (host-side arithmetic, checked above), so the
#               build leaves out nvcc, the slowest part of a build; the brute-force sweeps
#               (test_rules, test_reshard) on every 2nd case (MS_SWEEP_STRIDE): each operator,
#               mesh and shape still runs, with even and uneven shards;
#   tsan        the tests that run thread ranks (label threads), the sweeps on every 7th case.
#   The release configuration runs every case of every sweep.
# Sanitizer builds are Debug (assertions on) at -O1, as the sanitizers' authors advise.
#
# MS_TEST_BLAS_THREADS=N starts OpenBLAS's pool with N threads in every test process
# (OPENBLAS_NUM_THREADS), so GEMMs split across workers whatever the CPU's thresholds; the
# suite must stay green, TSan included, because the BLAS policy (engine/kernels/blas.h) pins a
# TSan build to one thread.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ -n "${MS_TEST_BLAS_THREADS:-}" ]; then
  case $MS_TEST_BLAS_THREADS in
    '' | *[!0-9]* | 0) echo "run-tests: MS_TEST_BLAS_THREADS must be a thread count (got '$MS_TEST_BLAS_THREADS')" >&2; exit 2 ;;
  esac
  export OPENBLAS_NUM_THREADS=$MS_TEST_BLAS_THREADS MS_BLAS_THREADS=$MS_TEST_BLAS_THREADS
  echo "=== OpenBLAS's pool forced to $MS_TEST_BLAS_THREADS threads in every test process"
fi

passed=0
failed=0
summary=()
suite_start=$SECONDS
run_config() { # name build-dir ctest-args cmake-args...
  local name=$1 dir=$2 ctest_args=$3 t0=$SECONDS t_build result
  shift 3
  echo "=== $name: configure and build ($dir)"
  if ! cmake -S . -B "$dir" -DMS_WERROR=ON "$@" >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; failed=$((failed + 1)); summary+=("$name: configure failed"); return
  fi
  if ! cmake --build "$dir" -j "$JOBS" >"$dir.build.log" 2>&1; then
    tail -50 "$dir.build.log"; failed=$((failed + 1)); summary+=("$name: build failed"); return
  fi
  # The OpenBLAS kernels the meshscope binary asks for (engine/kernels/blas.h), for every test
  # binary too: the calibration's key and the numbers then agree between the CLI and the tests.
  local core
  core=$("$dir/meshscope" blas-core 2>/dev/null) || core=""
  if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; fi
  if [ "${CALIBRATE:-1}" = 1 ] && ! calibrate "$dir"; then
    failed=$((failed + 1)); summary+=("$name: calibration failed"); return
  fi
  t_build=$((SECONDS - t0))
  echo "=== $name: ctest $ctest_args"
  # shellcheck disable=SC2086
  if (cd "$dir" && ctest --output-on-failure -j "$JOBS" $ctest_args); then
    passed=$((passed + 1)); result=passed
  else
    failed=$((failed + 1)); result=FAILED
  fi
  summary+=("$(printf '%-24s %s: build %4d s, tests %4d s' "$name" "$result" "$t_build" $((SECONDS - t0 - t_build)))")
}

# The planner's cpu-local calibration (per-core GEMM rates, collectives, the synchronisation of
# thread ranks) is measured before any test runs: the tests run in parallel, and a calibration
# taken while they load the cores misprices every strategy. It lands in the suite's own cache,
# never the user's. The release and ASan builds each measure their own before their tests (an
# ASan build's key has a part of its own: its kernels run several times slower, so the release
# build's rates would misprice it). The TSan build (its BLAS pinned to one thread: another key)
# does not: measuring under TSan takes minutes (9.5 on a loaded 2-core machine), and of its tests
# (-L threads) only the image classifier's advisor prices on cpu-local, measuring it once in its
# own process. The measurement waits up to a minute for the machine to settle; if other
# work keeps it busy, the suite caches a loaded calibration anyway (its own cache only, the load
# recorded in the file) rather than have every test that needs cpu-local measure again.
export XDG_CACHE_HOME="$PWD/build/test-cache"
rm -rf "$XDG_CACHE_HOME"
calibrate() { # build-dir
  local log=$1.calibrate.log
  cal() {
    "$1/meshscope" plan --model configs/gpt-tiny.json --cluster cpu-local --devices 4 \
      --global-batch 8 --seq 64 >"$log" 2>&1 || { cat "$log"; return 1; }
  }
  MS_CALIBRATE_WAIT_S=${MS_CALIBRATE_WAIT_S:-60} cal "$1" || return 1
  if grep -q 'not caching' "$log"; then
    grep '^cpu-local: the machine' "$log"
    echo "=== the machine stayed busy: caching the suite's calibration as measured under load"
    MS_CALIBRATE_MAX_BUSY=$(nproc) MS_CALIBRATE_WAIT_S=0 cal "$1" || return 1
  fi
  grep -E '^cpu-local: ([0-9]+ ranks:|calibrated in|calibration (from|cached))' "$log"
}

sanitized=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1")
mkdir -p build
run_config "release" build "" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMS_SANITIZE=
MS_SWEEP_STRIDE=2 run_config "asan+ubsan" build-asan "-LE cuda-host" "${sanitized[@]}" -DMS_SANITIZE=address \
  -DMS_ENABLE_CUDA=OFF
CALIBRATE=0 MS_SWEEP_STRIDE=7 run_config "tsan (threads backend)" build-tsan "-L threads" "${sanitized[@]}" \
  -DMS_SANITIZE=thread -DMS_ENABLE_MPI=OFF -DMS_ENABLE_CUDA=OFF

echo
printf '%s\n' "${summary[@]}"
echo "whole suite: $((SECONDS - suite_start)) s"
echo "test configurations: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

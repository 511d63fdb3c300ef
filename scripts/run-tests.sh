#!/usr/bin/env bash
# The whole test suite: a warnings-as-errors build, the same suite under ASan+UBSan, and
# the threads-backend tests under TSan. Prints one summary line per configuration and a
# final "N passed, N failed" line; exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

passed=0
failed=0
run_config() { # name build-dir ctest-args cmake-args...
  local name=$1 dir=$2 ctest_args=$3
  shift 3
  echo "=== $name: configure and build ($dir)"
  if ! cmake -S . -B "$dir" -DMS_WERROR=ON "$@" >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; failed=$((failed + 1)); return
  fi
  if ! cmake --build "$dir" -j "$JOBS" >"$dir.build.log" 2>&1; then
    tail -50 "$dir.build.log"; failed=$((failed + 1)); return
  fi
  if [ ! -d "$XDG_CACHE_HOME" ] && ! calibrate "$dir"; then
    failed=$((failed + 1)); return
  fi
  echo "=== $name: ctest $ctest_args"
  # shellcheck disable=SC2086
  if (cd "$dir" && ctest --output-on-failure -j "$JOBS" $ctest_args); then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
}

# The planner's cpu-local calibration (per-core GEMM rates, collectives, the synchronisation of
# thread ranks) is measured once, by the release build, before any test runs: the tests run in
# parallel, and a calibration taken while they load the cores misprices every strategy. It
# lands in the suite's own cache, never the user's, and all three configurations share it.
export XDG_CACHE_HOME="$PWD/build/test-cache"
rm -rf "$XDG_CACHE_HOME"
calibrate() { # build-dir
  if ! "$1/meshscope" plan --model configs/gpt-tiny.json --cluster cpu-local --devices 4 \
    --global-batch 8 --seq 64 --recalibrate >"$1.calibrate.log" 2>&1; then
    cat "$1.calibrate.log"
    return 1
  fi
  grep -E '^cpu-local: ([0-9]+ ranks:|calibrated in)' "$1.calibrate.log"
}

mkdir -p build
run_config "release" build "" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMS_SANITIZE=
run_config "asan+ubsan" build-asan "" -DCMAKE_BUILD_TYPE=Debug -DMS_SANITIZE=address
run_config "tsan (threads backend)" build-tsan "-L threads" -DCMAKE_BUILD_TYPE=Debug \
  -DMS_SANITIZE=thread -DMS_ENABLE_MPI=OFF -DMS_ENABLE_CUDA=OFF

echo
echo "test configurations: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# train_vs_torch.sh - single-rank GPT and LLaMA training speed: `meshscope train` next to a
# PyTorch reference (bench/torch_gpt.py, bench/torch_llama.py) in the same run, plus `meshscope
# bench gemm` at the models' own GEMM shapes. Builds meshscope, prepares data/kjv.txt and installs Debian's python3-torch
# when missing, then hands over to bench/train_vs_torch.py (Debian's /usr/bin/python3).
#
#   bench/train_vs_torch.sh [--build-dir DIR] [--no-build] [options of train_vs_torch.py]
#
#   --build-dir DIR   CMake build directory (default: build, or $BUILD_DIR)
#   --no-build        use DIR/meshscope as it is
#   --models a,b,lt,la  --threads 1,2  --rounds R  --gemm-reps R  --no-gemm  --json-out FILE
#                     passed on; see /usr/bin/python3 bench/train_vs_torch.py --help
#
# Exits non-zero with a message when the build, the data, the PyTorch install or any
# training step fails. Benchmarks are not tests: this is not part of ctest.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

build_dir="${BUILD_DIR:-build}"
do_build=1
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir)
      [ $# -ge 2 ] || { echo "train_vs_torch: --build-dir needs a value" >&2; exit 2; }
      build_dir="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help)
      sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done

fail() { echo "train_vs_torch: $*" >&2; exit 1; }

if [ "$do_build" = 1 ]; then
  echo "== building meshscope in $build_dir"
  mkdir -p "$build_dir"
  log="$build_dir/train_vs_torch.build.log"
  cmake -S . -B "$build_dir" >"$log" 2>&1 || fail "cmake configure failed; see $log"
  cmake --build "$build_dir" -j"$(nproc)" --target meshscope >>"$log" 2>&1 ||
    fail "the build failed; see $log"
fi
[ -x "$build_dir/meshscope" ] ||
  fail "$build_dir/meshscope is missing (build it, or drop --no-build)"

if [ ! -s data/kjv.txt ]; then
  echo "== preparing data/kjv.txt"
  bash scripts/prepare-data.sh || fail "scripts/prepare-data.sh failed"
fi

py=/usr/bin/python3
[ -x "$py" ] || fail "$py is missing (Debian's python3; the PyTorch side runs there)"
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "== installing Debian's python3-torch for $py"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  if ! dpkg -s python3-torch >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y python3-torch ||
      { $sudo apt-get update && $sudo apt-get install -y python3-torch; } ||
      fail "apt-get install python3-torch failed"
  fi
  "$py" -c 'import torch' || fail "python3-torch is installed but 'import torch' fails in $py"
fi

exec "$py" bench/train_vs_torch.py --meshscope "$build_dir/meshscope" "${pass[@]+"${pass[@]}"}"

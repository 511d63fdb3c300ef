#!/usr/bin/env bash
# Installs the Debian packages meshscope needs, only those missing. Idempotent and quiet
# when everything is present. Run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config clang-format
  libcmocka-dev          # tests
  libopenblas-dev        # GEMM
  openmpi-bin libopenmpi-dev  # the MPI backend and its tests
  libcjson-dev libmicrohttpd-dev libncurses-dev  # views
  zlib1g-dev             # checkpoint checksums (CRC-32)
  libzip-dev             # .npz data files (zip archives of .npy arrays)
  libglpk-dev            # the automatic placement search's integer program (GLPK)
  libcurl4-openssl-dev   # meshscope top (reads a dashboard)
  tmux                   # TUI tests
  curl chromium          # dashboard tests: curl (tests/web_live.sh), headless Chromium (tests/browser)
  bible-kjv              # the default training text (scripts/prepare-data.sh)
  # ONNX import: protobuf-c and its compiler for onnx.proto (from libonnx-dev); the ONNX
  # backend test data for the conformance test (tests/test_onnx_conformance.c)
  libprotobuf-c-dev protobuf-c-compiler libonnx-dev libonnx-testdata
  python3-torch          # the ONNX models of tests/pytorch_equivalence.py and PyTorch's losses
)

# The browser test runs under Node; Debian's nodejs/npm only when no node is installed.
command -v node >/dev/null || PACKAGES+=(nodejs npm)

# Its driver, playwright-core, pinned by tests/browser/package-lock.json (uses the system
# Chromium; downloads no browser). Best effort: without it the browser test skips.
browser_deps() {
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/tests/browser"
  [ -d "$dir/node_modules/playwright-core" ] && return 0
  command -v npm >/dev/null || return 0
  npm ci --prefix "$dir" --no-audit --no-fund --silent >/dev/null 2>&1 ||
    echo "meshscope: npm ci in tests/browser failed; the browser test will skip" >&2
}

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { browser_deps; exit 0; }

echo "meshscope: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "meshscope: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
browser_deps

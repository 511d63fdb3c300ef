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
  tmux                   # TUI tests
  bible-kjv              # the default training text (scripts/prepare-data.sh)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "meshscope: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "meshscope: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

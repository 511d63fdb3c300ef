#!/usr/bin/env bash
# gpu-bundle.sh - packs what scripts/gpu-check.sh needs on a GPU machine that has the CUDA
# toolkit but no package access (a compute node, a bare GPU image): the Debian packages of
# meshscope's build dependencies and of the libraries they load, and the training text.
#
# Run it here, on a Debian 12 machine that reaches Debian's archive; copy the folder it writes
# (default .gpu-bundle, git-ignored) to the GPU machine's checkout. gpu-check.sh finds it there
# and unpacks into its build directory only what that machine lacks: a library package whose
# shared objects the machine's loader already knows is left packed, so the machine's own
# programs never see a second copy of a library they use.
#
#   scripts/gpu-bundle.sh [OUT]     OUT defaults to .gpu-bundle in the repository
#
# Idempotent: packages already in OUT are not fetched again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/.gpu-bundle}"

# The headers, pkg-config files and link names of every library CMakeLists.txt looks up with
# pkg-config (cmocka, openblas, libcjson, zlib, ncursesw, libcurl, libmicrohttpd), pkg-config
# itself, and the shared libraries these load, down to what every Linux system has (libc,
# libgcc, libstdc++, zlib's runtime). OpenMPI is not packed: the GPU check needs no MPI.
PACKAGES=(
  pkgconf pkgconf-bin libpkgconf3
  libcmocka-dev libcmocka0
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5
  libquadmath0
  libcjson-dev libcjson1
  zlib1g-dev
  libncurses-dev libncurses6 libncursesw6 libtinfo6
  libcurl4-openssl-dev libcurl4 libnghttp2-14 libidn2-0 libunistring2 librtmp1 libssh2-1
  libpsl5 libssl3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1
  libcom-err2 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3 libzstd1 libbrotli1
  libmicrohttpd-dev libmicrohttpd12 libgnutls30 libhogweed6 libnettle8 libgmp10 libtasn1-6
  libp11-kit0 libffi8
  # pkg-config files only: libmicrohttpd.pc requires gnutls.pc, and that one its own
  libgnutls28-dev nettle-dev libgmp-dev libtasn1-6-dev libp11-kit-dev libidn2-dev
)

command -v apt-get >/dev/null || { echo "gpu-bundle: needs apt-get (a Debian 12 machine)" >&2; exit 1; }
mkdir -p "$out/debs"
cd "$out/debs"
need=()
for p in "${PACKAGES[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "gpu-bundle: fetching ${#need[@]} packages"
  # apt's download sandbox user cannot write into a root-owned folder: fetch as root.
  if ! apt-get -q -o APT::Sandbox::User=root download "${need[@]}" >/dev/null; then
    echo "gpu-bundle: apt-get download failed; run 'apt-get update' once and try again" >&2
    exit 1
  fi
fi

# The training text, made here (scripts/prepare-data.sh needs Debian's bible-kjv).
"$root/scripts/prepare-data.sh" "$out/data/kjv.txt" >/dev/null

cd "$out"
echo "gpu-bundle: $(find debs -name '*.deb' | wc -l) packages and data/kjv.txt, $(du -sh . | cut -f1) in $out"
echo "gpu-bundle: copy it into the GPU machine's checkout as .gpu-bundle and run scripts/gpu-check.sh"

# gpu-bundle-env.sh - sourced by scripts/gpu-check.sh on a machine without meshscope's build
# dependencies: unpacks the packages of .gpu-bundle (scripts/gpu-bundle.sh) that this machine
# lacks into a private prefix and points pkg-config, the compiler and the loader at it.
#
#   bundle_env BUNDLE PREFIX    0 when the environment is set, 1 (with the reason) when not
#
# What is unpacked: every package without a shared library of its own (headers, pkg-config
# files, link names, pkg-config itself), and each library package of which at least one
# shared object is unknown to this machine's loader (ldconfig -p). A library the machine has
# stays the machine's: a link name in the prefix whose library was left packed is pointed at
# the machine's copy, and the prefix holds no second copy that its own programs could load.

# The machine's path of a shared object, by soname (libcurl.so.4), or nothing.
bundle_system_lib() {
  ldconfig -p 2>/dev/null | awk -v s="$1" '$1 == s { print $NF; exit }'
}

bundle_env() {
  local bundle=$1 prefix=$2 deb sonames so missing unpacked=0 kept=0
  [ -d "$bundle/debs" ] || { echo "  no $bundle/debs (make it with scripts/gpu-bundle.sh)"; return 1; }
  command -v dpkg-deb >/dev/null || { echo "  dpkg-deb is missing: cannot unpack $bundle"; return 1; }
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$bundle"/debs/*.deb; do
    # The sonames a package ships: lib*.so.N, a name and one version number.
    sonames=$(dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|.*/||' |
      grep -E '^lib.*\.so\.[0-9]+$' | sort -u)
    missing=0
    for so in $sonames; do
      [ -n "$(bundle_system_lib "$so")" ] || missing=1
    done
    if [ -n "$sonames" ] && [ "$missing" -eq 0 ]; then
      kept=$((kept + 1))
      continue
    fi
    dpkg-deb -x "$deb" "$prefix" || { echo "  cannot unpack $deb"; return 1; }
    unpacked=$((unpacked + 1))
  done
  # Link names (libcurl.so -> libcurl.so.4.8.0) whose library stayed packed: the machine's.
  local link target soname sys
  while IFS= read -r link; do
    target=$(readlink "$link")
    soname=$(basename "$target" | sed -E 's/^(lib.*\.so\.[0-9]+).*/\1/')
    sys=$(bundle_system_lib "$soname")
    [ -n "$sys" ] && ln -sf "$sys" "$link"
  done < <(find "$prefix" -xtype l -name 'lib*.so*')
  local lib=$prefix/usr/lib/x86_64-linux-gnu blas=$prefix/usr/lib/x86_64-linux-gnu/openblas-pthread
  export PATH="$PATH:$prefix/usr/bin"
  export LD_LIBRARY_PATH="$lib:$prefix/lib/x86_64-linux-gnu:$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The prefix's pkg-config files only, read as if the prefix were /, with /usr/include and
  # the library folders kept in the flags (pkg-config drops them as the system's own).
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig:$blas/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR=$prefix PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1
  export PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
  command -v pkg-config >/dev/null || { echo "  pkg-config is missing after unpacking"; return 1; }
  echo "  unpacked $unpacked packages into $prefix; $kept library packages left packed" \
    "(this machine has their libraries)"
  # The training text, when the checkout has none (scripts/prepare-data.sh needs Debian).
  if [ ! -s data/kjv.txt ] && [ -s "$bundle/data/kjv.txt" ]; then
    mkdir -p data && cp "$bundle/data/kjv.txt" data/kjv.txt
  fi
  return 0
}

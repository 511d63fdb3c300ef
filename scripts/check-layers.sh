#!/usr/bin/env bash
# check-layers.sh ROOT [TABLE_FILE]
#
# Checks every #include "..." in the layered folders against the allowed-edges table in
# docs/ARCHITECTURE.md (the rows between the layers:begin and layers:end markers). Each row
# names a layer, the folders it owns and the layers it may include. A row named "base.sub" is
# a sub-layer: it counts as "base" for rows that list "base", while sub-layers of one base list
# each other by their whole names, so a cycle between two of them fails like an upward include. A file's layer is that of
# the longest folder prefix that matches it; an include must resolve from ROOT (the one
# include root) and land in an allowed layer. A file under a layered top-level folder that no
# row owns is an error too, so a new folder has to be placed in the table first.
# Prints one line per violation and exits 1 if there is any; the build runs it before
# compiling anything (CMakeLists.txt) and ctest runs it with a planted violation too.
set -euo pipefail
root=${1:?usage: check-layers.sh ROOT [TABLE_FILE]}
table=${2:-$root/docs/ARCHITECTURE.md}
cd "$root"

rows=$(awk '/<!-- layers:begin -->/{on=1; next} /<!-- layers:end -->/{on=0} on && /^\| *[a-z]/' "$table" |
  awk -F'|' 'NR > 0 && $2 !~ /layer/ {
      gsub(/`/, ""); gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4);
      print $2 "|" $3 "|" $4 }')
if [ -z "$rows" ]; then
  echo "check-layers: no layer table between <!-- layers:begin --> and <!-- layers:end --> in $table" >&2
  exit 1
fi

# Sources of every top-level folder that some row owns (tests/ and bench/ may include anything).
tops=$(printf '%s\n' "$rows" | awk -F'|' '{n = split($2, f, /[ ,]+/); for (i = 1; i <= n; i++) if (f[i] != "") { split(f[i], p, "/"); print p[1] } }' | sort -u)
tops=$(for t in $tops; do [ -d "$t" ] && echo "$t"; done)
# shellcheck disable=SC2086
files=$(find $tops -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)

# OpenBLAS has one door, engine/kernels/blas.c: it alone decides the process's BLAS threads
# (engine/kernels/blas.h), so no other file may include cblas.h or call openblas_*.
# shellcheck disable=SC2086
blas_bad=$(grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<cblas\.h>|openblas_[a-z_]+[[:space:]]*\(' $files |
  grep -v '^engine/kernels/blas\.c:' || true)
if [ -n "$blas_bad" ]; then
  printf '%s: OpenBLAS used outside engine/kernels/blas.c; call ms_blas_sgemm or ms_k_blas_set_threads (engine/kernels/blas.h)\n' \
    $(cut -d: -f1,2 <<<"$blas_bad")
  exit 1
fi

# One awk pass over "FILE<TAB>LINE<TAB>HEADER<TAB>EXISTS" for every include (and one
# "FILE<TAB>0" line per file, so a file without includes is still placed in a layer).
{
  # shellcheck disable=SC2086
  { grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $files || true; } |
    sed -E 's/^([^:]+):([0-9]+):.*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1\t\2\t\3/' |
    while IFS=$'\t' read -r file line hdr; do
      if [ -f "$hdr" ]; then printf '%s\t%s\t%s\t1\n' "$file" "$line" "$hdr"
      else printf '%s\t%s\t%s\t0\n' "$file" "$line" "$hdr"; fi
    done
  for f in $files; do printf '%s\t0\t\t1\n' "$f"; done
} | awk -F'\t' -v rows="$rows" '
  function layer_of(path,   best, bl, i, n) {
    best = ""; bl = 0
    for (i = 1; i <= nf; i++) {
      n = length(folder[i])
      if ((path == folder[i] || substr(path, 1, n + 1) == folder[i] "/") && n > bl) { best = owner[i]; bl = n }
    }
    return best
  }
  BEGIN {
    nrow = split(rows, r, "\n")
    for (k = 1; k <= nrow; k++) {
      split(r[k], c, "|"); name = c[1]
      n = split(c[2], fs, /[ ,]+/)
      for (i = 1; i <= n; i++) if (fs[i] != "") { nf++; folder[nf] = fs[i]; owner[nf] = name }
      allowed[name] = " " name " "
      n = split(c[3], as, /[ ,]+/)
      for (i = 1; i <= n; i++) if (as[i] != "") allowed[name] = allowed[name] as[i] " "
    }
  }
  {
    file = $1; line = $2; hdr = $3; exists = $4
    from = layer_of(file)
    if (from == "") {
      if (!(file in unowned)) { print file ": no layer owns this folder (add it to the table in docs/ARCHITECTURE.md)"; bad++ }
      unowned[file] = 1; next
    }
    if (hdr == "") next
    if (!exists) { print file ":" line ": include \"" hdr "\" does not resolve from the include root (write it as a path from the top of the tree)"; bad++; next }
    to = layer_of(hdr)
    if (to == "") next   # tests/ or another unlayered folder: nothing to check
    # A sub-layer "base.sub" counts as "base" for the layers that list "base" (a layer above
    # the engine lists "engine", meaning every engine.* row); sub-layers name each other whole.
    base = to; sub(/\..*/, "", base)
    if (index(allowed[from], " " to " ") == 0 && (base == to || index(allowed[from], " " base " ") == 0)) {
      print file ":" line ": layer \x27" from "\x27 includes \"" hdr "\" of layer \x27" to "\x27; \x27" from "\x27 may include only:" allowed[from]
      bad++
    }
  }
  END { if (bad) { print bad " include(s) break the layering (docs/ARCHITECTURE.md, Layers)"; exit 1 } }'

#!/usr/bin/env bash
# check-functions.sh ROOT [MAX_LINES]
#
# No function outside tests/ and bench/ may be longer than MAX_LINES (default 120) lines,
# signature to closing brace, except the table-like ones named in TABLES below: there a long
# body is one row per entry, and splitting it would only scatter the table. The sources are
# clang-formatted, so a function starts at a line in column 0 that ends with its "{" (its
# signature may wrap over indented lines) and ends at the next "}" in column 0.
# Prints one line per function too long and exits 1 if there is any.
set -euo pipefail
root=${1:?usage: check-functions.sh ROOT [MAX_LINES]}
max=${2:-120}
cd "$root"

# Table-like functions: name and why.
#   run_opts_parse  cli/session.c: the flag table of train, eval and explain, one row per flag
TABLES="run_opts_parse"

files=$(git ls-files '*.c' '*.cu' 2>/dev/null | grep -vE '^(tests|bench)/' ||
  find . -type f \( -name '*.c' -o -name '*.cu' \) -not -path './tests/*' -not -path './bench/*' \
    -not -path './build*' | sed 's|^\./||')
# shellcheck disable=SC2086
long=$(awk -v max="$max" -v tables=" $TABLES " '
  FNR == 1 { infn = 0; pending = "" }
  # a signature on one line: "type name(args) {"
  !infn && /^[A-Za-z_].*\)[ ]*(__attribute__.*)?\{[ ]*$/ && $0 !~ /^(typedef|struct|enum|union)[ ]/ && $0 !~ /=/ {
    infn = 1; start = FNR; hdr = $0; next
  }
  # a signature that wraps: its first line ends with "(" or ",", its last (indented) with "{"
  !infn && /^[A-Za-z_].*[(,][ ]*$/ && $0 !~ /=/ { pending = $0; pstart = FNR; next }
  !infn && pending != "" && /^ .*\)[ ]*(__attribute__.*)?\{[ ]*$/ { infn = 1; start = pstart; hdr = pending; pending = ""; next }
  !infn && pending != "" && /^ / { next }
  { pending = "" }
  infn && /^\}/ {
    infn = 0; n = FNR - start + 1
    name = hdr; sub(/\(.*/, "", name); k = split(name, w, /[ *]+/); name = w[k]
    if (n > max && index(tables, " " name " ") == 0)
      printf "%s:%d: %s is %d lines (at most %d); split it into named steps\n", FILENAME, start, name, n, max
  }' $files)
if [ -n "$long" ]; then
  printf '%s\n' "$long"
  exit 1
fi

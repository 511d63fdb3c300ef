#!/usr/bin/env bash
# prepare-data.sh - makes the default training text data/kjv.txt: the King James Bible
# (~4.3 MB of English, from the Debian package bible-kjv) with the verse references
# ("Ge1:1 ", "1Sa3:4 ", ...) stripped, one verse per line.
#
#   scripts/prepare-data.sh [OUT]      OUT defaults to data/kjv.txt in the repository
#
# Idempotent: an existing non-empty OUT is left alone. The text is generated, never
# committed (/data/ is git-ignored).
set -euo pipefail

out="${1:-}"
if [ -z "$out" ]; then
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  out="$root/data/kjv.txt"
fi

if [ -s "$out" ]; then
  echo "prepare-data: $out exists; nothing to do"
  exit 0
fi

if ! command -v bible >/dev/null 2>&1; then
  echo "prepare-data: the 'bible' program is missing; install the Debian package bible-kjv" \
       "(sudo apt-get install bible-kjv, or scripts/install-deps.sh) and rerun" >&2
  exit 1
fi

mkdir -p "$(dirname "$out")"
# Write next to the target and rename, so an interrupted run never leaves a partial file
# that the idempotence check above would then accept.
tmp="$(mktemp "$out.tmp.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
# stdin from /dev/null: without it `bible` falls into its interactive prompt.
bible -f gen1:1-rev22:21 </dev/null | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' >"$tmp"

size="$(wc -c <"$tmp")"
if [ "$size" -lt 1000000 ] || ! head -c 16 "$tmp" | grep -q '^In the beginning'; then
  echo "prepare-data: 'bible' produced unexpected output ($size bytes, starting" \
       "'$(head -c 40 "$tmp")'); is bible-kjv complete?" >&2
  exit 1
fi
if grep -qE '^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ ' "$tmp"; then
  echo "prepare-data: some verse references were not stripped; check the sed pattern" >&2
  exit 1
fi
chmod 644 "$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "prepare-data: wrote $out ($size bytes)"

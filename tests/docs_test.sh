#!/usr/bin/env bash
# docs_test.sh SRC_DIR: the README stays a map. No paragraph or list item outside code blocks
# and tables is over 80 words, the two commands are within its first 15 lines, and every
# relative link in it names a file that exists.
set -uo pipefail
src=${1:?usage: docs_test.sh SRC_DIR}
readme="$src/README.md"
fail=0
long=$(awk '
  /^```/ { code = !code; next }
  code || /^\|/ { flush(); next }
  /^[[:space:]]*$/ || /^#/ || /^- / { flush() }
  !/^[[:space:]]*$/ && !/^#/ { text = text " " $0 }
  END { flush() }
  function flush(   n) { n = split(text, w, /[[:space:]]+/) - 1; if (n > 80) print n " words: " substr(text, 1, 70); text = "" }
' "$readme")
if [ -n "$long" ]; then echo "FAIL: README paragraphs over 80 words:"; echo "$long"; fail=1; fi
if ! head -15 "$readme" | grep -q '^make run' || ! head -15 "$readme" | grep -q '^make test'; then
  echo "FAIL: the two commands are not within the README's first 15 lines"; fail=1
fi
while read -r link; do
  [ -e "$src/${link%%#*}" ] || { echo "FAIL: README links to $link, which does not exist"; fail=1; }
done < <(grep -o '](\([^)#h][^)]*\))' "$readme" | sed 's/^](//; s/)$//')
[ "$fail" -eq 0 ] && echo "docs: the README is a map (paragraphs, commands, links)"
exit "$fail"

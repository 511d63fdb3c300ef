#!/usr/bin/env bash
# functions_test.sh SOURCE_DIR: scripts/check-functions.sh passes on the sources, and refuses
# a planted function one line too long, whether its signature fits one line or wraps, while
# it lets one of exactly the limit and a named table-like function through.
set -uo pipefail
src=${1:?usage: functions_test.sh SOURCE_DIR}
check=$src/scripts/check-functions.sh
fails=0
ok() { echo "ok - $1"; }
fail() { echo "not ok - $1"; fails=$((fails + 1)); }

out=$(bash "$check" "$src" 2>&1) && ok "the sources pass" || fail "the sources: $out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/engine" "$tmp/tests"
# body LINES: a function body of LINES lines in all, braces and signature included.
body() {
  local n=$1 i
  for ((i = 0; i < n - 2; i++)); do echo "    x += $i;"; done
  echo "}"
}
{ echo "int fits(int x) {"; body 120; } >"$tmp/engine/a.c"
out=$(bash "$check" "$tmp" 2>&1) && ok "120 lines pass" || fail "120 lines refused: $out"

{ echo "static int too_long(int x) {"; body 121; } >"$tmp/engine/b.c"
out=$(bash "$check" "$tmp" 2>&1)
[ $? -ne 0 ] && grep -q 'engine/b.c:1: too_long is 121 lines' <<<"$out" &&
  ok "121 lines refused, named" || fail "121 lines: $out"
rm "$tmp/engine/b.c"

{ printf 'static int wrapped(int a,\n                   int b) {\n'; body 121 | tail -n +2; } >"$tmp/engine/c.c"
out=$(bash "$check" "$tmp" 2>&1)
[ $? -ne 0 ] && grep -q 'wrapped is 121 lines' <<<"$out" &&
  ok "a wrapped signature is counted from its first line" || fail "wrapped: $out"
rm "$tmp/engine/c.c"

{ echo "int run_opts_parse(int x) {"; body 200; } >"$tmp/engine/d.c"
{ echo "int too_long_test(int x) {"; body 200; } >"$tmp/tests/t.c"
out=$(bash "$check" "$tmp" 2>&1) && ok "table-like functions and tests/ pass" ||
  fail "table-like or tests/: $out"

[ "$fails" -eq 0 ] || exit 1

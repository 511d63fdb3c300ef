#!/usr/bin/env bash
# tui_tmux.sh - the terminal view end to end, in a real terminal (tmux) of a fixed size:
#
#   1. `train --tui` on 4 ranks: every screen shows data of the run (the step advances, a
#      loss, a 4x4 heatmap with values and a legend, 4 timeline lanes, reshard transitions
#      with counts, memory of 4 ranks, the suggestions list); the advisor's first suggestion
#      is accepted through the confirm box (Enter, y) and the job switches to it (the status
#      line names the target, the suggestion reads "applied"); `?` shows the help, `q` quits:
#      the job exits 0 and the terminal is restored (normal screen, the shell's output).
#      That run has no pipeline: no screen 7 in the header, and 7 says why.
#   2. The same with MESHSCOPE_ASCII=1: no byte outside ASCII on any screen.
#   3. Ctrl-C in `train --tui`: the same clean exit.
#   4. `meshscope top URL` against a job started with --web: the same step advances; q
#      leaves it (exit 0) without stopping the job; bad addresses fail with a clear message.
#   5. A pipeline (`--pp 2 --micro-batches 4`): screen 7 is offered and shows one lane per
#      stage with F and B blocks of every micro-batch, the measured bubble per stage beside
#      the formula's 20.0%, and a time axis; in ASCII mode too, without a byte outside ASCII.
#
# usage: tui_tmux.sh MESHSCOPE_BINARY SOURCE_DIR
# Skips (77) when tmux or the training text (data/kjv.txt) is missing.
set -uo pipefail

BIN=${1:?usage: tui_tmux.sh MESHSCOPE_BINARY SOURCE_DIR}
SRC=${2:?usage: tui_tmux.sh MESHSCOPE_BINARY SOURCE_DIR}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
cd "$SRC" || exit 1

if ! command -v tmux >/dev/null; then
  echo "SKIP: tmux is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
if [ ! -s data/kjv.txt ]; then
  echo "SKIP: data/kjv.txt is missing (scripts/prepare-data.sh writes it)"
  exit 77
fi

TMP=$(mktemp -d)
SOCK="ms-tui-test-$$"
WEB_PID=""
cleanup() {
  tmux -L "$SOCK" kill-server >/dev/null 2>&1
  rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$SOCK"
  if [ -n "$WEB_PID" ]; then
    kill -TERM "$WEB_PID" 2>/dev/null
    wait "$WEB_PID" 2>/dev/null
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
ok() { echo "ok: $*"; }

COLS=160
ROWS=48
TRAIN=("$BIN" train --model configs/gpt-tiny.json --data data/kjv.txt --dp 2 --tp 2 --steps 100000
  --advise-threshold 0.01)

# Starts a command in a fresh tmux session; afterwards the pane prints a marker with the
# exit code (the shell's output, proving the terminal is back) and the code lands in $TMP/rc.
start_pane() { # ENV... -- COMMAND...
  local envs=() q=""
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  for a in "$@"; do q+=" $(printf '%q' "$a")"; done
  rm -f "$TMP/rc"
  tmux -L "$SOCK" -f /dev/null new-session -d -x "$COLS" -y "$ROWS" \
    "env TERM=xterm-256color ${envs[*]} $q 2>$TMP/stderr; rc=\$?; echo \$rc > $TMP/rc; echo \"pane-exited rc=\$rc\"; exec sleep 600"
}

capture() { tmux -L "$SOCK" capture-pane -p; }
keys() { tmux -L "$SOCK" send-keys "$@"; }

# wait_for REGEX [SECONDS]: until the pane matches (extended regex).
wait_for() {
  local re=$1 limit=${2:-60} i
  for ((i = 0; i < limit * 5; i++)); do
    if capture | grep -Eq -- "$re"; then return 0; fi
    [ -f "$TMP/rc" ] && break
    sleep 0.2
  done
  echo "--- pane (waiting for /$re/) ---"
  capture
  echo "--- stderr ---"
  cat "$TMP/stderr" 2>/dev/null | tail -20
  return 1
}

# The step shown in the status line (row 2).
shown_step() { capture | sed -n 2p | grep -oE '^step [0-9]+' | grep -oE '[0-9]+'; }

# Two captures a little apart: the step must increase.
check_step_advances() { # LABEL
  local a b
  wait_for '^step [0-9]+' 90 || { fail "$1: no step shown"; return; }
  a=$(shown_step)
  sleep 2
  b=$(shown_step)
  if [ -n "$a" ] && [ -n "$b" ] && [ "$b" -gt "$a" ]; then
    ok "$1: step advances ($a -> $b)"
  else
    fail "$1: step did not advance ($a -> $b)"
  fi
}

# q (or the key given), then: exit code 0, the TUI is gone, the normal screen is back with
# the shell's output.
check_quit() { # LABEL [KEY]
  local i
  keys "${2:-q}"
  for ((i = 0; i < 300; i++)); do
    [ -f "$TMP/rc" ] && break
    sleep 0.2
  done
  if [ ! -f "$TMP/rc" ]; then
    fail "$1: did not exit within 60 s of q"
    capture
    return
  fi
  local rc
  rc=$(cat "$TMP/rc")
  [ "$rc" = 0 ] && ok "$1: exit code 0" || fail "$1: exit code $rc ($(tail -3 "$TMP/stderr"))"
  wait_for 'pane-exited rc=' 10 >/dev/null
  local alt
  alt=$(tmux -L "$SOCK" display -p '#{alternate_on}')
  [ "$alt" = 0 ] && ok "$1: alternate screen off" || fail "$1: alternate screen still on"
  if capture | grep -q ' 1 overview '; then
    fail "$1: the TUI is still on the screen after exit"
  elif capture | grep -q 'pane-exited rc='; then
    ok "$1: terminal restored"
  else
    fail "$1: no shell output after exit"
  fi
  tmux -L "$SOCK" kill-server >/dev/null 2>&1
  sleep 0.3
}

# Visits screens 1-6, saving each capture as $TMP/PREFIX-N.txt.
visit_screens() { # PREFIX
  local n title
  local titles=("" "^Training" "^Heatmap:" "^(Timeline of step|Timeline)" "^Reshards"
    "^Memory per rank" "^Suggestions")
  for n in 1 2 3 4 5 6; do
    keys "$n"
    title=${titles[$n]}
    wait_for "$title" 30 >/dev/null || fail "$1: screen $n did not show /$title/"
    # Screens with data after the first steps: wait until they have it.
    case $n in
      2) wait_for '^ +r3 +.*[0-9.]+[BKMG]' 60 >/dev/null ;;
      3) wait_for '^r3 ' 60 >/dev/null ;;
      4) wait_for 'P\(sum\)' 60 >/dev/null ;;
    esac
    capture >"$TMP/$1-$n.txt"
  done
}

# --- 1. train --tui ---------------------------------------------------------------------------

start_pane LANG=C.UTF-8 -- "${TRAIN[@]}" --tui
check_step_advances "train --tui"
visit_screens utf8
S="$TMP/utf8"
grep -Eq '^  loss +[0-9]+\.[0-9]+' "$S-1.txt" && ok "overview: loss value" ||
  fail "overview: no loss value"
grep -Eq 'compute .*exposed comm .*idle' "$S-1.txt" && ok "overview: step breakdown" ||
  fail "overview: no step breakdown"
[ "$(grep -cE '^  r[0-3] ' "$S-1.txt")" = 4 ] && ok "overview: overlap of 4 ranks" ||
  fail "overview: overlap rows missing"
grep -Eq 'src.dst +r0 +r1 +r2 +r3' "$S-2.txt" && [ "$(grep -cE '^ +r[0-3] ' "$S-2.txt")" = 4 ] &&
  ok "heatmap: 4 rank labels on both axes" || fail "heatmap: rank labels"
grep -Eq '^ +r[0-3] .*[0-9.]+[BKMG]' "$S-2.txt" && ok "heatmap: non-zero cells" ||
  fail "heatmap: no non-zero cell"
grep -Eq '^scale .*0 .* [0-9.]+ (B|KiB|MiB|GiB)' "$S-2.txt" && ok "heatmap: legend" ||
  fail "heatmap: no legend"
[ "$(grep -cE '^r[0-3] ' "$S-3.txt")" = 4 ] && ok "timeline: 4 lanes" || fail "timeline: lanes"
grep -Eq '^ +0 ' "$S-3.txt" && ok "timeline: time axis" || fail "timeline: no time axis"
grep -Eq 'P\(sum\).* [0-9]+ +[0-9.]+ (B|KiB|MiB|GiB)' "$S-4.txt" &&
  ok "reshards: a P(sum) transition with count and bytes" || fail "reshards: no P(sum) row"
grep -Eq '^  (all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|p2p).* [0-9.]+ [kMGT]?B/s' \
  "$S-4.txt" && ok "reshards: collectives by busbw" || fail "reshards: no busbw rows"
[ "$(grep -cE '^r[0-3] .*[0-9.]+ (B|KiB|MiB|GiB) .*[0-9.]+ (B|KiB|MiB|GiB)' "$S-5.txt")" = 4 ] &&
  ok "memory: 4 ranks with byte values" || fail "memory: rows"
grep -q '^Suggestions' "$S-6.txt" && grep -Eq 'no suggestions yet|^  id +state' "$S-6.txt" &&
  ok "suggestions: header and list" || fail "suggestions: header or list"
# No pipeline in this run: no tab for it, and its key says why instead of showing it.
head -1 "$S-1.txt" | grep -Eq ' 7 pipeline( |$)' && fail "dp2 x tp2: the header offers a pipeline" ||
  ok "dp2 x tp2: no pipeline tab"
keys 7
wait_for 'no pipeline in this run' 5 >/dev/null && ok "7 without a pipeline says why" ||
  fail "7 without a pipeline said nothing"
# Accept the advisor's first suggestion through the confirm box: the job switches strategy
# (the status line names the target) and the suggestion reads "applied". An advisor whose cost
# model keeps missing the measured step (a loaded machine) suggests nothing and says why, in
# the status line and on this screen: that is checked instead.
keys 6
if wait_for ' open |no advice: ' 120 >/dev/null && ! capture | grep -q ' open '; then
  capture >"$TMP/note.txt"
  sed -n 2p "$TMP/note.txt" | grep -q 'no advice: the cost model is [0-9]*% off the measured step' &&
    ok "advisor note in the status line: $(sed -n 2p "$TMP/note.txt" | grep -o 'no advice: .*')" ||
    fail "advisor note missing from the status line"
  grep -q '^  the cost model is [0-9]*% off the measured step for [0-9]* rounds' "$TMP/note.txt" &&
    ok "advisor note on the suggestions screen" || fail "advisor note missing from the suggestions screen"
  echo "note: the advisor withheld its suggestions, so accepting one was not exercised"
elif capture | grep -q ' open '; then
  target=$(capture | grep -E '^ *> .* open ' | head -1 |
    grep -oE 'dp[0-9]+ x tp[0-9]+( \+sp)?( x cp[0-9]+)?( x pp[0-9]+)?( (zero[0-9]|recompute|selective-recompute|m[0-9]+|gpipe|interleaved|zb-h1|v[0-9]+))*' |
    head -1)
  keys Enter
  if wait_for 'y: accept' 10 >/dev/null; then
    ok "suggestions: confirm box for $target"
    capture >"$TMP/confirm.txt"
    grep -Eq 'faster|gain' "$TMP/confirm.txt" && ok "confirm box shows the predicted gain" ||
      fail "confirm box without the predicted gain"
    # the box is for the highlighted suggestion, even if an advisor round re-sorted the list
    grep -F "switch " "$TMP/confirm.txt" | grep -qF "$target" &&
      ok "confirm box names $target" || fail "confirm box is not for '$target'"
    keys y
    # the target is text, not a pattern: "+sp" must not read as " +" (one or more spaces)
    target_re=$(sed 's/[][\.*^$+?(){}|]/\\&/g' <<<"$target")
    if wait_for " applied |withdrawn +$target_re " 90 >/dev/null && ! capture | grep -q ' applied '; then
      # withdrawn between the box and y: the advisor's model stopped agreeing with the step
      capture | grep -q 'cost model is' && ok "the advisor withdrew $target before y (model off)" ||
        fail "$target withdrawn without the advisor's note"
    elif capture | grep -q ' applied '; then
      ok "accepted suggestion applied"
      [ -n "$target" ] && wait_for "  $target_re  " 30 >/dev/null && ok "status line shows $target" ||
        fail "status line does not show '$target'"
    else
      fail "accepted suggestion never applied"
    fi
  else
    fail "Enter did not open the confirm box"
  fi
else
  fail "no open suggestion within 120 s"
fi
keys 1
keys '?'
wait_for 'press any key' 10 >/dev/null && ok "? shows the help" || fail "? did not show the help"
keys Escape
sleep 0.5
capture | grep -q 'press any key' && fail "help did not close"
check_quit "train --tui"

# --- 2. ASCII ---------------------------------------------------------------------------------

start_pane LANG=C.UTF-8 MESHSCOPE_ASCII=1 -- "${TRAIN[@]}" --tui
wait_for '^step [0-9]+' 90 >/dev/null
visit_screens ascii
keys 6
keys '?'
wait_for 'press any key' 10 >/dev/null
capture >"$TMP/ascii-help.txt"
keys Escape
bad=0
for f in "$TMP"/ascii-*.txt; do
  n=$(LC_ALL=C tr -d '\000-\177' <"$f" | wc -c)
  if [ "$n" != 0 ]; then
    fail "ASCII mode: $n non-ASCII bytes in $(basename "$f")"
    bad=1
  fi
done
[ $bad = 0 ] && ok "ASCII mode: every screen is plain ASCII"
check_quit "train --tui (ASCII)"

# --- 3. Ctrl-C: the signal only sets a flag; the view restores the terminal and the job stops
# after its step ----------------------------------------------------------------------------

start_pane LANG=C.UTF-8 -- "${TRAIN[@]}" --tui
wait_for '^step [0-9]+' 90 >/dev/null
check_quit "train --tui (Ctrl-C)" C-c

# --- 4. meshscope top -------------------------------------------------------------------------

"$BIN" top "http://127.0.0.1:1/?token=x" >"$TMP/top-err.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q 'cannot connect to http://127.0.0.1:1' "$TMP/top-err.txt" &&
  ok "top: refused connection names the address" || fail "top: refused connection (rc $rc): $(cat "$TMP/top-err.txt")"
"$BIN" top "ftp://nowhere" >"$TMP/top-err.txt" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "http://127.0.0.1:PORT/?token=TOKEN" "$TMP/top-err.txt" &&
  ok "top: a bad URL shows the expected form" || fail "top: bad URL (rc $rc)"

"${TRAIN[@]}" --web 127.0.0.1:0 >"$TMP/web.out" 2>&1 &
WEB_PID=$!
url=""
for ((i = 0; i < 300; i++)); do
  url=$(grep -oE 'dashboard: http://127\.0\.0\.1:[0-9]+/\?token=[0-9a-zA-Z]+' "$TMP/web.out" |
    head -1 | sed 's/^dashboard: //')
  [ -n "$url" ] && break
  kill -0 "$WEB_PID" 2>/dev/null || break
  sleep 0.2
done
if [ -z "$url" ]; then
  fail "train --web printed no dashboard line: $(tail -5 "$TMP/web.out")"
else
  ok "train --web: $url"
  "$BIN" top "${url%%\?*}?token=wrong" >"$TMP/top-err.txt" 2>&1
  rc=$?
  [ $rc = 1 ] && grep -q 'refused the token' "$TMP/top-err.txt" &&
    ok "top: a wrong token is refused clearly" || fail "top: wrong token (rc $rc): $(cat "$TMP/top-err.txt")"
  start_pane LANG=C.UTF-8 -- "$BIN" top "$url"
  check_step_advances "top"
  port=${url#http://127.0.0.1:}
  port=${port%%/*}
  capture | sed -n 2p | grep -q "http://127.0.0.1:$port" && ok "top: header names the dashboard" ||
    fail "top: header does not name the dashboard"
  capture >"$TMP/top-1.txt"
  grep -E "token=[^*]" "$TMP/top-1.txt" && fail "top: the token is shown on screen"
  keys 2
  wait_for '^ +r3 +.*[0-9.]+[BKMG]' 30 >/dev/null && ok "top: heatmap from the dashboard" ||
    fail "top: heatmap"
  check_quit "top"
  kill -0 "$WEB_PID" 2>/dev/null && ok "top: q left the job running" ||
    fail "top: the job stopped when top quit"
fi

# --- 5. a pipeline ------------------------------------------------------------------------------

PIPE=("$BIN" train --model configs/gpt-tiny.json --data data/kjv.txt --pp 2 --micro-batches 4
  --batch 8 --seq 32 --steps 100000)
check_pipeline() { # LABEL ENV...
  local label=$1 f l
  shift
  start_pane "$@" -- "${PIPE[@]}" --tui
  wait_for '^step [0-9]+' 90 >/dev/null || fail "$label: no step shown"
  wait_for ' 7 pipeline( |$)' 30 >/dev/null && ok "$label: the header offers the pipeline" ||
    fail "$label: no pipeline tab"
  keys 7
  if wait_for '^s1 r1 ' 60 >/dev/null; then
    f="$TMP/pipe-$label.txt"
    capture >"$f"
    grep -Eq '^Pipeline of step [0-9]+: 1f1b, 2 stages, 4 micro-batches' "$f" &&
      ok "$label: title names the schedule" || fail "$label: title"
    [ "$(grep -cE '^s[01] r[01] ' "$f")" = 2 ] && ok "$label: one lane per stage" ||
      fail "$label: lanes"
    for l in 0 1; do
      grep -E "^s$l r$l " "$f" | grep -q 'F0' && grep -E "^s$l r$l " "$f" | grep -q 'B3' &&
        ok "$label: stage $l shows F0 .. B3" || fail "$label: stage $l lacks F0 or B3"
      grep -Eq "^s$l r$l .* [0-9.]+% +20\.0% +[0-9.]+% *\$" "$f" &&
        ok "$label: stage $l's bubble beside the formula" || fail "$label: stage $l bubble"
    done
    grep -Eq 'bubble +formula +window' "$f" && ok "$label: bubble columns" ||
      fail "$label: bubble columns"
    grep -Eq '^ +0 .*ms' "$f" && ok "$label: time axis" || fail "$label: no time axis"
    grep -Eq 'formula \(p-1\)/\(m\+p-1\) = 20\.0%' "$f" && ok "$label: formula line" ||
      fail "$label: formula line"
  else
    fail "$label: screen 7 shows no lanes"
  fi
  check_quit "$label"
}
check_pipeline "pipeline" LANG=C.UTF-8
check_pipeline "pipeline-ascii" LANG=C.UTF-8 MESHSCOPE_ASCII=1
n=$(LC_ALL=C tr -d '\000-\177' <"$TMP/pipe-pipeline-ascii.txt" 2>/dev/null | wc -c)
[ "$n" = 0 ] && [ -s "$TMP/pipe-pipeline-ascii.txt" ] && ok "pipeline in ASCII mode: plain ASCII" ||
  fail "pipeline in ASCII mode: $n non-ASCII bytes"

if [ $FAILS -gt 0 ]; then
  echo "$FAILS check(s) failed"
  exit 1
fi
echo "all TUI checks passed"
exit 0

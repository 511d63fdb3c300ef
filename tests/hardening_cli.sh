#!/usr/bin/env bash
# Regression checks of the command line for input hardening: data whose bytes the vocabulary
# does not hold, a model key that is refused, eval of NaN weights (valid JSON and a non-zero
# exit), a tensor name with terminal escapes (shown escaped), serve on a trace with no usable
# events (an empty dashboard), the umask deciding the mode of a checkpoint and a trace,
# meshscope doctor on crafted flight dumps (many, a FIFO, a huge file), and the dashboard's
# token kept out of command lines (serve --web-token-file; top --token-file, --token -,
# MESHSCOPE_TOKEN; a warning for the forms that show it in ps; bad token files refused).
# Usage: hardening_cli.sh path/to/meshscope
set -u
bin=$1
. "$(dirname "$0")/dashboard_url.sh"
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

cat >"$tmp/ok.json" <<'J'
{"n_layer": 1, "n_head": 4, "n_embd": 32, "vocab_size": 256, "n_positions": 32}
J
printf '{"n_layer":1,"n_head":1,"n_embd":8,"vocab_size":1,"n_positions":16}' >"$tmp/v1.json"
printf '{"n_layer":1,"n_head":4,"n_embd":32,"vocab_size":256,"n_positions":32,"n_layers":12}' \
  >"$tmp/typo.json"
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 200) >"$tmp/text.txt"
run=("$bin" train --model "$tmp/ok.json" --data "$tmp/text.txt" --steps 1 --batch 2 --seq 16)

# 1. A vocabulary of 1 for byte tokens up to 'v' (118): refused before training, with the size.
out=$("$bin" train --model "$tmp/v1.json" --data "$tmp/text.txt" --steps 2 --batch 1 --seq 8 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -qF "needs vocab_size 119 or more" <<<"$out" &&
  ! grep -q "loss" <<<"$out"; then
  ok "vocab too small: $(grep -F vocab_size <<<"$out" | head -1 | cut -c1-150)"
else
  bad "vocab too small (exit $rc): $out"
fi

# 2. A typo in a model key is refused, naming the key meant.
out=$("$bin" train --model "$tmp/typo.json" --data "$tmp/text.txt" --steps 1 --batch 2 --seq 16 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && grep -qF 'unknown key "n_layers" (the closest known key is "n_layer")' <<<"$out"; then
  ok "config key typo refused"
else
  bad "config key typo (exit $rc): $out"
fi

# 3. eval of a checkpoint with NaN weights: one line of valid JSON with null and an error, and a
# non-zero exit.
"${run[@]}" --save "$tmp/ck.safetensors" >/dev/null 2>&1 || bad "train --save failed"
hl=$(od -An -tu8 -N8 "$tmp/ck.safetensors" | tr -d ' ')
printf '\x00\x00\xc0\x7f%.0s' $(seq 1024) |
  dd of="$tmp/ck.safetensors" bs=4096 seek=$((8 + hl)) oflag=seek_bytes conv=notrunc status=none
eval_cmd=("$bin" eval --model "$tmp/ok.json" --checkpoint "$tmp/ck.safetensors" --data "$tmp/text.txt"
  --batch 2 --seq 16 --batches 1)
"${eval_cmd[@]}" >"$tmp/eval.out" 2>"$tmp/eval.err"
rc=$?
line=$(cat "$tmp/eval.out")
valid=yes
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); assert d["loss"] is None and d["error"]' \
    <"$tmp/eval.out" 2>/dev/null || valid=no
fi
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$valid" = yes ] &&
  [[ "$line" == '{"loss": null, "error": "the loss is nan'* ]]; then
  ok "eval of NaN weights: $line"
else
  bad "eval of NaN weights (exit $rc, JSON valid: $valid): $line $(cat "$tmp/eval.err")"
fi

# 4. A tensor name with terminal escapes is shown escaped in the error.
h='{"\u001b[2J\u001b]0;pwned\u0007":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}'
printf "$(printf '\\x%02x\\x%02x' $((${#h} & 255)) $((${#h} >> 8)))\\0\\0\\0\\0\\0\\0" >"$tmp/evil.safetensors"
printf '%s' "$h" >>"$tmp/evil.safetensors"
printf '\0\0\0\0\0\0\0\0' >>"$tmp/evil.safetensors"
out=$("$bin" eval --model "$tmp/ok.json" --checkpoint "$tmp/evil.safetensors" \
  --data "$tmp/text.txt" --batch 2 --seq 16 --batches 1 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && grep -qF 'tensor \x1B[2J\x1B]0;pwned\x07: dtype "F64"' <<<"$out" &&
  ! grep -q $'[\x1b\x07]' <<<"$out"; then
  ok "tensor name escaped"
else
  bad "tensor name escaped (exit $rc): $(cat -v <<<"$out")"
fi

# 5. serve on a trace with no usable events: an empty dashboard until SIGINT, exit 0.
printf '{"traceEvents": [{"ph": "X", "name": "x", "ts": 1, "dur": 1}]}' >"$tmp/empty-trace.json"
if command -v curl >/dev/null; then
  "$bin" serve "$tmp/empty-trace.json" --web 127.0.0.1:0 >"$tmp/serve.out" 2>"$tmp/serve.err" &
  pid=$!
  url=$(dashboard_url "$tmp/serve.out" "$pid" 100)
  code=000
  if [ -n "$url" ]; then
    code=$(curl -s -o "$tmp/snap.json" -w '%{http_code}' -H "Authorization: Bearer ${url##*token=}" \
      "${url%%/\?*}/api/v1/snapshot")
  fi
  kill -INT "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  pid=
  if [ "$code" = 200 ] && [ "$rc" -eq 0 ] && grep -q '"history":\[\]' "$tmp/snap.json"; then
    ok "serve on a trace with no usable events"
  else
    bad "serve on a trace with no usable events (HTTP $code, exit $rc): $(head -3 "$tmp/serve.err")"
  fi
else
  echo "skip serve: curl is missing"
fi

# 6. The umask decides the mode of the checkpoint and the trace, as for any new file.
(umask 027 && "${run[@]}" --save "$tmp/um.safetensors" --trace "$tmp/um-trace.json" >/dev/null 2>&1)
modes="$(stat -c %a "$tmp/um.safetensors" 2>/dev/null) $(stat -c %a "$tmp/um-trace.json" 2>/dev/null)"
if [ "$modes" = "640 640" ]; then ok "umask 027 gives 640"; else bad "umask 027 gave '$modes'"; fi

# 7. doctor on a folder of crafted dumps: 1100 in one collective (past the 1024 the doctor's
# stack arrays once held), then a FIFO and a 1 GB sparse file named like dumps: refused by name
# with exit 1, without waiting on the FIFO or reading the file.
fl="$tmp/flight"
mkdir -p "$fl"
for r in $(seq 0 1099); do
  printf '{"flight":1,"rank":%d,"now_ns":100000}\n{"seq":5,"op":"all_reduce","comm":"dp","comm_id":7,"ranks":"0-1100","state":"started","start_ns":1}\n' \
    "$r" >"$fl/flight-rank$r-pid$r.jsonl"
done
out=$(timeout 60 "$bin" doctor "$fl" 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && grep -qF "rank 1100 did not finish all_reduce seq 5 on 'dp' (ranks 0-1100) and left no flight dump (it died or was stopped); ranks 0-1099 waited" <<<"$out"; then
  ok "doctor on 1100 dumps in one collective"
else
  bad "doctor on 1100 dumps (exit $rc): $(head -3 <<<"$out")"
fi
mkfifo "$fl/flight-rank2000-pid1.jsonl"
out=$(timeout 60 "$bin" doctor "$fl" 2>&1)
rc=$?
if [ "$rc" -eq 1 ] && grep -qF "flight-rank2000-pid1.jsonl: is a FIFO, not a regular file" <<<"$out"; then
  ok "doctor refuses a FIFO named like a dump"
else
  bad "doctor on a FIFO (exit $rc): $(head -3 <<<"$out")"
fi
rm "$fl/flight-rank2000-pid1.jsonl"
truncate -s 1G "$fl/flight-rank2000-pid1.jsonl"
out=$(timeout 60 "$bin" doctor "$fl" 2>&1)
rc=$?
if [ "$rc" -eq 1 ] && grep -qF "flight-rank2000-pid1.jsonl is 1073741824 bytes, more than the 64 MiB" <<<"$out"; then
  ok "doctor refuses a 1 GB file unread"
else
  bad "doctor on a 1 GB file (exit $rc): $(head -3 <<<"$out")"
fi
rm -rf "$fl"

# 8. The dashboard's token out of command lines (every local user reads them: ps). serve
# writes it to a file of mode 0600 and removes it when it stops; top takes it from that file,
# from standard input or from MESHSCOPE_TOKEN, and authenticates. Without a terminal top stops
# after its first snapshot: "answers" says the dashboard took the token, "refused" that it did
# not. The forms that put it in a command line still work, with a warning.
unset MESHSCOPE_TOKEN # the cases set it where they mean to
"$bin" serve "$tmp/empty-trace.json" --web 127.0.0.1:0 --web-token-file "$tmp/tok" \
  >"$tmp/serve-tok.out" 2>"$tmp/serve-tok.err" &
pid=$!
url=$(dashboard_url "$tmp/serve-tok.out" "$pid" 100)
base=${url%%/\?*}
token=${url##*token=}
# top_case NAME WANT-RC WANT-TEXT WARNING [VAR=VALUE...] -- ARGS...: top's exit code and
# output, with stdin from $top_in (default /dev/null). WARNING: ps (the command-line one),
# none, or any.
top_case() {
  local name=$1 want_rc=$2 want=$3 warn=$4 out rc env=() warned=yes
  shift 4
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  out=$(env "${env[@]}" timeout 30 "$bin" top "$@" <"${top_in:-/dev/null}" 2>&1)
  rc=$?
  case $warn in
    ps) grep -q 'warning: .*can read (ps)' <<<"$out" || warned=no ;;
    none) ! grep -q 'warning' <<<"$out" || warned=no ;;
  esac
  if [ "$rc" -eq "$want_rc" ] && grep -qF -- "$want" <<<"$out" && [ "$warned" = yes ]; then
    ok "top: $name"
  else
    bad "top: $name (exit $rc, wanted $want_rc and '$want', warning $warn): $out"
  fi
}
answers="$base answers, but this is not a terminal"
if [ -z "$url" ]; then
  bad "serve --web-token-file: no dashboard line: $(head -3 "$tmp/serve-tok.err")"
else
  mode=$(stat -c %a "$tmp/tok" 2>/dev/null)
  if [ "$mode" = 600 ] && [ "$(cat "$tmp/tok")" = "$token" ]; then
    ok "serve --web-token-file: the token, mode 600"
  else
    bad "serve --web-token-file: mode '$mode', '$(cat "$tmp/tok" 2>&1)' for $token"
  fi
  top_case "--token-file" 1 "$answers" none -- "$base" --token-file "$tmp/tok"
  top_case "MESHSCOPE_TOKEN" 1 "$answers" none MESHSCOPE_TOKEN="$token" -- "$base"
  top_in="$tmp/tok" top_case "--token - (standard input)" 1 "$answers" none -- "$base" --token -
  printf 'wrong0123456789abcdef\n' >"$tmp/wrong"
  chmod 600 "$tmp/wrong"
  top_case "a wrong --token-file is refused" 1 "$base refused the token" none -- \
    "$base" --token-file "$tmp/wrong"
  top_case "a wrong MESHSCOPE_TOKEN is refused" 1 "$base refused the token" none \
    MESHSCOPE_TOKEN=wrong0123456789 -- "$base"
  top_case "no token is refused" 1 "refused a request without a token" none -- "$base"
  top_case "?token= in the URL: a warning" 1 "$answers" ps -- "$url"
  top_case "--token TOKEN: a warning" 1 "$answers" ps -- "$base" --token "$token"
  top_case "--token-file before the URL's token" 1 "$answers" ps -- \
    "$base/?token=wrong0123456789" --token-file "$tmp/tok"
  top_case "the URL's token before MESHSCOPE_TOKEN" 1 "$answers" ps \
    MESHSCOPE_TOKEN=wrong0123456789 -- "$url"
  # Token files that are not one: each a one-line error naming the file and the fix, exit 2.
  : >"$tmp/empty-tok"
  mkfifo "$tmp/fifo-tok"
  head -c 5000 /dev/zero | tr '\0' a >"$tmp/big-tok"
  head -c 300 /dev/zero | tr '\0' a >"$tmp/long-tok"
  chmod 600 "$tmp/empty-tok" "$tmp/long-tok"
  refused_file() { top_case "$1" 2 "$3" none -- "$base" --token-file "$2"; } # NAME FILE WANT
  refused_file "an empty token file" "$tmp/empty-tok" "--token-file $tmp/empty-tok is empty"
  refused_file "a FIFO as token file" "$tmp/fifo-tok" "$tmp/fifo-tok: is a FIFO, not a regular file"
  refused_file "a folder as token file" "$tmp" "$tmp: is a folder, not a regular file"
  refused_file "a 5000-byte token file" "$tmp/big-tok" "is 5000 bytes, more than the 4096-byte limit"
  refused_file "a 300-character token" "$tmp/long-tok" "is longer than 256 characters"
  refused_file "a missing token file" "$tmp/none" "$tmp/none: cannot open: No such file or directory"
  top_case "an empty MESHSCOPE_TOKEN" 2 "the token from MESHSCOPE_TOKEN is empty" none \
    MESHSCOPE_TOKEN= -- "$base"
  top_case "--token-file and --token both" 2 "give the token one way" none -- \
    "$base" --token-file "$tmp/tok" --token "$token"
  if [ "$(id -u)" != 0 ]; then # root reads any file
    cp "$tmp/tok" "$tmp/locked-tok"
    chmod 000 "$tmp/locked-tok"
    refused_file "an unreadable token file" "$tmp/locked-tok" "cannot open: Permission denied"
  fi
  chmod 644 "$tmp/wrong"
  top_case "a token file others can read: a warning" 1 "can be read by other users (mode 644)" \
    any -- "$base" --token-file "$tmp/wrong"
fi
kill -INT "$pid" 2>/dev/null
wait "$pid"
rc=$?
pid=
if [ "$rc" -eq 0 ] && [ ! -e "$tmp/tok" ]; then
  ok "serve removed its token file"
else
  bad "serve --web-token-file (exit $rc): the token file $(ls "$tmp/tok" 2>&1)"
fi
ln -s "$tmp/elsewhere" "$tmp/link-tok"
out=$("$bin" serve "$tmp/empty-trace.json" --web-token-file "$tmp/link-tok" 2>&1)
rc=$?
if [ "$rc" -eq 1 ] && grep -qF "cannot write the token file $tmp/link-tok: it is a symbolic link" <<<"$out" &&
  [ ! -e "$tmp/elsewhere" ]; then
  ok "serve writes no token through a symbolic link"
else
  bad "serve --web-token-file on a link (exit $rc): $out"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# Regression checks of the command line for input hardening: data whose bytes the vocabulary
# does not hold, a model key that is refused, eval of NaN weights (valid JSON and a non-zero
# exit), a tensor name with terminal escapes (shown escaped), serve on a trace with no usable
# events (an empty dashboard), the umask deciding the mode of a checkpoint and a trace, and
# meshscope doctor on crafted flight dumps (many, a FIFO, a huge file).
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

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

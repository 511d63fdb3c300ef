#!/usr/bin/env bash
# The dashboard of a real training run: steps advance in the snapshots, hostile requests are
# refused (401, 403, 405, 413, 400, 422, a slowloris connection closed by the deadline) while
# training keeps going, server-sent events arrive, and POST /api/v1/stop ends the job with
# exit code 0. Strategy switches through POST /api/v1/strategy: each refusal (world size,
# pipeline, ZeRO, sp without tp, memory cap, unknown knob) is a 422 with its reason and the job
# runs on unchanged; a valid target is applied at a step boundary. That run has no pipeline
# ("pipeline": null); a second, pp 2 run's snapshots have one: 2 lanes, 4 F and 4 B blocks per
# lane, the measured bubble and the formula. Usage: web_live.sh path/to/meshscope SOURCE_DIR
# Skips (77) only when the training text is missing.
set -u
bin=$1
src=$2
. "$(dirname "$0")/dashboard_url.sh"
data=$src/data/kjv.txt
if [ ! -f "$data" ]; then
  echo "skip: $data is missing (scripts/prepare-data.sh writes it)"
  exit 77
fi
for tool in curl timeout; do
  command -v $tool >/dev/null || { echo "FAIL: $tool is needed (scripts/install-deps.sh)"; exit 1; }
done

tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  exec 3>&- 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

"$bin" train --model "$src/configs/gpt-tiny.json" --data "$data" --dp 2 --tp 2 --steps 100000 \
  --log-every 1000 --web 127.0.0.1:0 --memory-cap 20.3 --log-jsonl "$tmp/log.jsonl" \
  >"$tmp/out" 2>"$tmp/err" &
pid=$!

url=$(dashboard_url "$tmp/out" "$pid" 600)
if [ -z "$url" ]; then
  echo "FAIL: no 'dashboard: URL' line from train --web"
  cat "$tmp/out" "$tmp/err" | head -20
  exit 1
fi
token=${url##*token=}
base=${url%%/\?*}
port=${base##*:}
auth="Authorization: Bearer $token"
origin="Origin: http://127.0.0.1:$port"
echo "dashboard at $base"

# status METHOD PATH [curl args...]: prints the HTTP status code.
status() {
  local m=$1 p=$2
  shift 2
  curl -s -o "$tmp/body" -w '%{http_code}' --max-time 20 -X "$m" "$@" "$base$p"
}
expect() { # expect NAME WANT GOT
  if [ "$3" = "$2" ]; then ok "$1 ($3)"; else bad "$1: got $3, wanted $2 ($(head -c 200 "$tmp/body"))"; fi
}
step_now() {
  curl -s --max-time 20 -H "$auth" "$base/metrics" | awk '$1 == "meshscope_step" { print $2 }'
}
wait_step() { # wait_step N SECONDS: until the snapshot shows step >= N
  local want=$1 secs=$2 s
  for _ in $(seq $((secs * 5))); do
    s=$(step_now)
    [ -n "$s" ] && [ "$s" -ge "$want" ] 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

if wait_step 3 120; then ok "snapshots show training steps (step $(step_now))"; else bad "no step >= 3 within 120 s"; fi
s1=$(step_now)
if wait_step $((s1 + 3)) 60; then ok "steps advance ($s1 -> $(step_now))"; else bad "steps stuck at $s1"; fi

# The start page: token for cookie, then the page.
code=$(curl -s -o /dev/null -w '%{http_code}' -c "$tmp/jar" "$url")
expect "start page with the token redirects" 303 "$code"
grep -q "meshscope_$port" "$tmp/jar" && grep -q "#HttpOnly_" "$tmp/jar" && ok "HttpOnly cookie set" ||
  bad "no HttpOnly cookie in the jar"
# Netscape jar: name and value are the 6th and 7th fields.
cookie=$(awk -v n="meshscope_$port" '$6 == n { print $7 }' "$tmp/jar")
[ -n "$cookie" ] && [ "$cookie" != "$token" ] && ok "the cookie is a session secret, not the token" ||
  bad "the cookie's value is the token (or missing)"
expect "page with the cookie" 200 "$(status GET / -b "$tmp/jar")"
grep -q 'id="heatmap"' "$tmp/body" && ok "page has the heatmap canvas" || bad "page lacks the heatmap"
grep -q 'id="sec-pipeline" hidden' "$tmp/body" && grep -q 'id="pipeline"' "$tmp/body" &&
  ok "page has the pipeline panel, hidden until a snapshot has a pipeline" ||
  bad "page lacks the pipeline panel"

# The job posts its dashboard URL as an event: no snapshot or event may carry the token.
curl -s --max-time 20 -H "$auth" "$base/api/v1/snapshot" >"$tmp/snap"
if grep -qF "$token" "$tmp/snap"; then bad "the snapshot carries the token"
else ok "the snapshot does not carry the token"; fi
grep -q '},"pipeline":null,"mem"' "$tmp/snap" && ok "dp2 x tp2: no pipeline in the snapshot" ||
  bad "dp2 x tp2: the snapshot has a pipeline view"
# The memory view splits each rank's bytes: the parameters are nonzero on every rank.
python3 - "$tmp/snap" <<'PY' && ok "memory per rank split into parameters, gradients, optimizer, activations" ||
import json, sys
mem = json.load(open(sys.argv[1]))["mem"]
sys.exit(0 if mem and all(m["params"] > 0 and m["optimizer"] > 0 and m["activations"] > 0 and
                          m["params"] + m["optimizer"] <= m["in_use"] for m in mem) else 1)
PY
  bad "the snapshot's memory has no split: $(head -c 300 "$tmp/snap")"

# Hostile requests.
before=$(step_now)
expect "no token" 401 "$(status GET /api/v1/snapshot)"
expect "wrong token" 401 "$(status GET /api/v1/snapshot -H 'Authorization: Bearer 00000000000000000000000000000000')"
expect "start page without token" 401 "$(status GET /)"
expect "DNS rebinding Host" 403 "$(status GET /api/v1/snapshot -H "$auth" -H 'Host: evil.example')"
expect "cross-origin POST with the cookie" 403 "$(status POST /api/v1/stop -b "$tmp/jar" -H 'Origin: http://evil.example')"
expect "POST with the cookie and no Origin" 403 "$(status POST /api/v1/stop -b "$tmp/jar")"
expect "PUT" 405 "$(status PUT /api/v1/stop -H "$auth")"
expect "DELETE" 405 "$(status DELETE /api/v1/snapshot -H "$auth")"
expect "two Content-Length headers" 400 \
  "$(status POST /api/v1/stop -H "$auth" -H 'Content-Length: 2' -H 'Content-Length: 2' --data '{}')"
head -c 100000 /dev/zero | tr '\0' ' ' >"$tmp/big"
expect "oversized body" 413 "$(status POST /api/v1/strategy -H "$auth" --data-binary @"$tmp/big")"
expect "malformed JSON" 400 "$(status POST /api/v1/strategy -H "$auth" --data '{"dp": 2,')"
deep=$(printf '[%.0s' $(seq 64))$(printf ']%.0s' $(seq 64))
expect "over-deep JSON" 400 "$(status POST /api/v1/strategy -H "$auth" --data "$deep")"
expect "strategy the job cannot run" 422 "$(status POST /api/v1/strategy -H "$auth" -H "$origin" --data '{"dp": 3, "tp": 1}')"
grep -q '"error"' "$tmp/body" && ok "422 says why: $(head -c 160 "$tmp/body")" || bad "422 without a reason"
expect "unknown suggestion" 422 "$(status POST /api/v1/suggestions/999999/accept -H "$auth")"
expect "unknown route" 404 "$(status GET /api/v1/nope -H "$auth")"

# Slowloris: half a request line, then silence; the server hangs up within its request
# deadline (10 s) while other requests are answered.
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /api/v1/snap' >&3
t0=$(date +%s)
expect "answered while a slow client waits" 200 "$(status GET /api/v1/snapshot -H "$auth")"
if timeout 20 cat <&3 >/dev/null; then
  took=$(($(date +%s) - t0))
  [ "$took" -le 15 ] && ok "slow connection closed after ${took} s" || bad "slow connection closed only after ${took} s"
else
  bad "slow connection still open after 20 s"
fi
exec 3>&-

# Switching strategy: every refusal is a 422 with its reason, and the job runs on unchanged;
# a valid target is applied at a step boundary (the log names it from then on).
refuse() { # refuse NAME BODY WANTED-TEXT
  expect "refused: $1" 422 "$(status POST /api/v1/strategy -H "$auth" --data "$2")"
  grep -qF -- "$3" "$tmp/body" && ok "  says: $(head -c 150 "$tmp/body")" || bad "  no '$3' in $(head -c 200 "$tmp/body")"
}
refuse "mesh does not match the world" '{"dp": 2, "tp": 1}' "needs 2 ranks but the job runs on 4"
refuse "ZeRO without dp" '{"dp": 1, "tp": 4, "zero": 1}' "ZeRO shards over data parallelism"
refuse "replicated head not executable" '{"dp": 4, "head_replicated": true}' "replicated head"
refuse "sp without tp" '{"mesh": {"dp": 1, "tp": 1, "cp": 4}, "sp": true}' "sp"
# --memory-cap 20.3 MiB: dp4 needs 19.7 MiB per rank here, cp4 20.7 MiB (tp4 +sp 14.3 MiB since
# its linears gather the weights instead of splitting the reduction).
refuse "over the memory cap" '{"mesh": {"dp": 1, "tp": 1, "cp": 4}}' "over memory"
refuse "unknown knob" '{"dp": 4, "warp": 9}' "warp"
grep -q '"strategy": "dp2 x tp2"' "$tmp/log.jsonl" && ok "still dp2 x tp2 after the refusals" || bad "strategy changed by a refused request"
expect "switch to dp4" 202 "$(status POST /api/v1/strategy -H "$auth" --data '{"dp": 4}')"
for _ in $(seq 300); do
  grep -q '"strategy": "dp4 x tp1"' "$tmp/log.jsonl" && break
  sleep 0.2
done
grep -q '"strategy": "dp4 x tp1"' "$tmp/log.jsonl" && ok "the job switched to dp4 x tp1" || bad "no step ran dp4 x tp1 within 60 s"
# The live model publishes at most every 250 ms, after the step that the log already shows:
# the snapshot catches up within a few publish periods (it is not ordered with the log).
for _ in $(seq 25); do
  snap_strategy=$(curl -s --max-time 20 -H "$auth" "$base/api/v1/snapshot" | grep -o '"strategy":"[^"]*"' | head -1)
  [ "$snap_strategy" = '"strategy":"dp4 x tp1"' ] && break
  sleep 0.2
done
[ "$snap_strategy" = '"strategy":"dp4 x tp1"' ] && ok "the snapshot shows $snap_strategy within 5 s of the log" || bad "snapshot strategy $snap_strategy 5 s after the log showed dp4 x tp1"
# Mixed precision is a switch like any other: into bf16 under ZeRO 1.
expect "switch to dp4 zero1 bf16" 202 "$(status POST /api/v1/strategy -H "$auth" --data '{"dp": 4, "zero": 1, "precision": "bf16"}')"
for _ in $(seq 300); do
  grep -q '"strategy": "dp4 x tp1 zero1 bf16"' "$tmp/log.jsonl" && break
  sleep 0.2
done
grep -q '"strategy": "dp4 x tp1 zero1 bf16"' "$tmp/log.jsonl" && ok "the job switched to dp4 x tp1 zero1 bf16" || bad "no step ran dp4 x tp1 zero1 bf16 within 60 s: $(tail -c 300 "$tmp/log.jsonl")"

# Server-sent events: new versions arrive.
timeout 4 curl -s -N -H "$auth" "$base/api/v1/events" >"$tmp/sse" 2>/dev/null
n=$(grep -c '^event: snapshot' "$tmp/sse")
[ "$n" -ge 2 ] && ok "events stream: $n snapshots in 4 s" || bad "events stream: $n snapshots in 4 s"
if grep -qF "$token" "$tmp/sse"; then bad "the events carry the token"
else ok "the events do not carry the token"; fi

after=$(step_now)
if wait_step $((after + 2)) 60; then
  ok "training continued through the hostile requests ($before -> $(step_now))"
else
  bad "training stalled at step $after"
fi

# Stop: accepted, then the process ends with 0.
expect "stop" 202 "$(status POST /api/v1/stop -H "$auth")"
rc=
for _ in $(seq 600); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    rc=$?
    pid=
    break
  fi
  sleep 0.1
done
if [ -z "$rc" ]; then
  bad "training still running 60 s after stop"
elif [ "$rc" -eq 0 ]; then
  ok "training exited 0 after stop"
else
  bad "training exited $rc after stop"
  tail -5 "$tmp/err"
fi

# A pipeline: pp 2, 1f1b over 4 micro-batches.
"$bin" train --model "$src/configs/gpt-tiny.json" --data "$data" --pp 2 --micro-batches 4 \
  --batch 8 --seq 32 --steps 100000 --log-every 1000 --web 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
pid=$!
url=$(dashboard_url "$tmp/out" "$pid" 600)
if [ -z "$url" ]; then
  bad "pp 2: no 'dashboard: URL' line ($(head -c 200 "$tmp/err"))"
else
  token=${url##*token=}
  base=${url%%/\?*}
  auth="Authorization: Bearer $token"
  for _ in $(seq 300); do
    curl -s --max-time 20 -H "$auth" "$base/api/v1/snapshot" >"$tmp/snap"
    grep -q '"pipeline":{"step":' "$tmp/snap" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  lanes=$(grep -o '"lanes":\[[^]]*\]' "$tmp/snap" | head -1)
  [ "$(printf '%s' "$lanes" | grep -o '"stage":' | wc -l)" = 2 ] &&
    printf '%s' "$lanes" | grep -q '{"stage":0,"rank":0},{"stage":1,"rank":1}' &&
    ok "pp 2: the snapshot's pipeline has 2 lanes ($lanes)" ||
    bad "pp 2: pipeline lanes: '$lanes' ($(head -c 300 "$tmp/snap"))"
  nf=$(grep -o '"action":"F"' "$tmp/snap" | wc -l)
  nb=$(grep -o '"action":"B"' "$tmp/snap" | wc -l)
  [ "$nf" = 8 ] && [ "$nb" = 8 ] && ok "pp 2: 4 F and 4 B blocks per lane" ||
    bad "pp 2: $nf F and $nb B blocks, wanted 8 each"
  grep -q '"pipeline":{"schedule":"1f1b","stages":2,"virtual_stages":1,"micro_batches":4' \
    "$tmp/snap" && grep -q '"formula":0.2,' "$tmp/snap" &&
    grep -Eq '"last_stage_bubble":\[[0-9.e-]+,[0-9.e-]+\]' "$tmp/snap" &&
    ok "pp 2: the measured bubble per stage and the formula (0.2)" ||
    bad "pp 2: analysis.pipeline ($(grep -o '"pipeline":{"schedule[^}]*}' "$tmp/snap"))"
  expect "pp 2: stop" 202 "$(status POST /api/v1/stop -H "$auth")"
  rc=
  for _ in $(seq 600); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      rc=$?
      pid=
      break
    fi
    sleep 0.1
  done
  [ "$rc" = 0 ] && ok "pp 2: training exited 0 after stop" || bad "pp 2: exit code '$rc'"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# Does a crowd of dashboard viewers slow training? Trains gpt-tiny on dp2 x tp2 with the
# dashboard on twice: once with nobody watching, once with CLIENTS concurrent server-sent
# event streams (bench/sse_client.c) for SECONDS; compares the median step time of the steps
# run during each window (from --log-jsonl) and prints the ratio. Every stream must receive
# updates. The promise (docs/api.md): 100 streams cost under 3% on a 2-core machine.
#
# usage: bench/sse_load.sh [path/to/meshscope] [CLIENTS] [SECONDS]
#        (defaults: build/meshscope 100 30)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=${1:-$root/build/meshscope}
clients=${2:-100}
secs=${3:-30}
data=$root/data/kjv.txt
[ -x "$bin" ] || { echo "sse_load: $bin not built (make build)"; exit 1; }
[ -f "$data" ] || { echo "sse_load: $data missing (scripts/prepare-data.sh)"; exit 1; }

tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
cc -O2 -o "$tmp/sse_client" "$here/sse_client.c"

# metric NAME: a sample of the running job's /metrics.
metric() { curl -s --max-time 10 -H "Authorization: Bearer $token" "$base/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }

# run NAME WITH_CLIENTS: one training; sets $lo/$hi (the steps inside the window).
run() {
  local name=$1 with=$2
  "$bin" train --model "$root/configs/gpt-tiny.json" --data "$data" --dp 2 --tp 2 \
    --steps 1000000 --log-every 100000 --log-jsonl "$tmp/$name.jsonl" --web 127.0.0.1:0 \
    >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pid=$!
  local url=
  for _ in $(seq 600); do
    url=$(sed -n 's/^dashboard: //p' "$tmp/$name.out" | head -1)
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "sse_load: no dashboard line"; cat "$tmp/$name.err"; exit 1; }
  token=${url##*token=}
  base=${url%%/\?*}
  # Warm up: let the first steps (allocation, first touches) pass.
  for _ in $(seq 600); do
    s=$(metric meshscope_step)
    [ -n "$s" ] && [ "$s" -ge 30 ] && break
    sleep 0.1
  done
  lo=$(metric meshscope_step)
  if [ "$with" = yes ]; then
    "$tmp/sse_client" 127.0.0.1 "${base##*:}" "$token" "$clients" "$secs" | tee "$tmp/clients.txt"
  else
    sleep "$secs"
  fi
  hi=$(metric meshscope_step)
  curl -s -o /dev/null --max-time 10 -X POST -H "Authorization: Bearer $token" "$base/api/v1/stop"
  wait "$pid"
  pid=
}

# median_ms FILE LO HI: median step_ms of steps LO..HI.
median_ms() {
  sed -n 's/.*"step": \([0-9]*\), .*"step_ms": \([0-9.]*\),.*/\1 \2/p' "$1" |
    awk -v lo="$2" -v hi="$3" '$1 >= lo && $1 <= hi { print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit } print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

echo "baseline: dashboard on, no viewers, ${secs} s"
run base no
base_lo=$lo base_hi=$hi
b=$(median_ms "$tmp/base.jsonl" "$lo" "$hi")
echo "  steps $lo..$hi, median step $b ms"
echo "loaded: $clients event streams for ${secs} s"
run load yes
l=$(median_ms "$tmp/load.jsonl" "$lo" "$hi")
echo "  steps $lo..$hi, median step $l ms"
awk -v b="$b" -v l="$l" -v bn=$((base_hi - base_lo)) -v ln=$((hi - lo)) 'BEGIN {
  printf "median step time with %s viewers / without: %.3f (%.2f ms vs %.2f ms; %d vs %d steps)\n",
         "'"$clients"'", l / b, l, b, ln, bn }'

#!/usr/bin/env bash
# user_model_advisor.sh - the advisor on a program's own model, through the dashboard: the
# image classifier (examples/image_classifier.c, a def without a built-in config) trains on
# dp1 x tp4 with --web; the advisor prices other strategies from the model's compiled program
# and opens at least one suggestion with a predicted step and a memory check; accepting it
# through POST /api/v1/suggestions/ID/accept switches the job, which reports predicted against
# measured; POST /api/v1/stop ends it with exit code 0. A "placements searched" suggestion is
# preferred when offered: accepted, it applies the layout it was priced with, at once.
# usage: user_model_advisor.sh path/to/image_classifier
# Skips (77) when the advisor withholds its suggestions because its cost model disagrees with
# the measured step (a busy machine): then its note is printed.
set -u
bin=${1:?usage: user_model_advisor.sh path/to/image_classifier}
. "$(dirname "$0")/dashboard_url.sh"
command -v curl >/dev/null || { echo "FAIL: curl is needed (scripts/install-deps.sh)"; exit 1; }

tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

"$bin" make-data "$tmp/images.st" --samples 512 >/dev/null || { echo "FAIL: make-data"; exit 1; }
"$bin" train --data "$tmp/images.st" --tp 4 --batch 16 --steps 1000000 --log-every 100000 \
  --web 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
pid=$!
# the advisor prices on cpu-local, measured once (minutes on a busy machine) and then cached
url=$(dashboard_url "$tmp/out" "$pid" 3000)
if [ -z "$url" ]; then
  echo "FAIL: no 'dashboard: URL' line from image_classifier train --web"
  cat "$tmp/out" "$tmp/err" | head -20
  exit 1
fi
if grep -q "advisor prices transformer models only" "$tmp/err"; then
  echo "FAIL: the job skipped the advisor for its own model"
  exit 1
fi
token=${url##*token=}
base=${url%%/\?*}
port=${base##*:}
auth="Authorization: Bearer $token"
origin="Origin: http://127.0.0.1:$port"

# the first open suggestion: its id, once the advisor has one (rounds every 2 s)
id=
for _ in $(seq 300); do
  curl -s --max-time 10 -H "$auth" "$base/api/v1/suggestions" >"$tmp/sugg"
  id=$(grep -o '"id":[0-9]*' "$tmp/sugg" | head -1 | cut -d: -f2)
  # a searched layout, when offered, is the one taken: its accept applies the layout priced
  searched=$(grep -o '"id":[0-9]*,"state":"open","target":"[^"]*placements searched"' "$tmp/sugg" |
    head -1 | cut -d, -f1 | cut -d: -f2)
  [ -n "$searched" ] && id=$searched
  [ -n "$id" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
if [ -z "$id" ]; then
  note=$(grep -o '"advisor_note":"[^"]*"' "$tmp/sugg")
  if [ -n "$note" ] && [ "$note" != '"advisor_note":""' ]; then
    echo "skip: the advisor withheld its suggestions: $note"
    exit 77
  fi
  echo "FAIL: no suggestion for the image classifier within 300 s"
  cat "$tmp/sugg" "$tmp/err" | head -20
  exit 1
fi
target=$(grep -o "\"id\":$id,\"state\":\"[a-z]*\",\"target\":\"[^\"]*\"" "$tmp/sugg" | head -1 |
  grep -o '"target":"[^"]*"')
echo "ok   suggestion $id: $target"
grep -q '"predicted_step_s":[0-9.e-]*[1-9]' "$tmp/sugg" && grep -q '"memory_check":"fits:' "$tmp/sugg" ||
  { echo "FAIL: the suggestion has no predicted step or memory check: $(head -c 600 "$tmp/sugg")"; exit 1; }
echo "ok   priced: predicted step and memory check"

code=$(curl -s -o "$tmp/body" -w '%{http_code}' --max-time 20 -X POST -H "$auth" -H "$origin" \
  "$base/api/v1/suggestions/$id/accept")
[ "$code" = 202 ] || [ "$code" = 200 ] || { echo "FAIL: accept returned $code: $(cat "$tmp/body")"; exit 1; }
for _ in $(seq 120); do
  grep -q "switch at step .*predicted" "$tmp/out" && break
  sleep 0.5
done
grep -q "switched dp1 x tp4 -> " "$tmp/out" && grep -q "switch at step .*predicted" "$tmp/out" ||
  { echo "FAIL: the accepted suggestion was not applied"; tail -n 5 "$tmp/out" "$tmp/err"; exit 1; }
echo "ok   applied: $(grep -o 'switched dp1 x tp4 -> .*' "$tmp/out" | head -1)"

curl -s -o /dev/null --max-time 20 -X POST -H "$auth" -H "$origin" "$base/api/v1/stop"
wait "$pid"
rc=$?
pid=
[ "$rc" = 0 ] || { echo "FAIL: the job exited $rc after stop"; tail -n 5 "$tmp/err"; exit 1; }
echo "ok   stopped, exit 0"

#!/usr/bin/env bash
# multihost_train.sh MESHSCOPE SRC_DIR MPIEXEC: dp 2 x tp 2 trained on 2 namespace hosts x 2 MPI
# ranks (tests/cluster/netns.sh) loses what one rank loses, step by step within 1e-5 relative,
# and its traffic between hosts went through the rate-limited links (the token bucket on
# host0's interface counted at least the gradients dp sends). Skips (77) where namespaces
# cannot be made (not root, no ip or tc, netns forbidden).
set -u
bin=$1 src=$2 mpiexec=$3
here="$src/tests/cluster"
"$here/netns.sh" check || exit $?
tmp=$(mktemp -d)
trap '"$here/netns.sh" down; rm -rf "$tmp"' EXIT
"$here/netns.sh" up --hosts 2 --ranks-per-host 2 --rate 400 --hostfile "$tmp/hosts" >/dev/null ||
    { echo "FAIL: netns.sh up"; exit 1; }
model="$src/configs/gpt-tiny.json"
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 300) >"$tmp/text.txt"
args=(train --model "$model" --data "$tmp/text.txt" --steps 4 --batch 4 --seq 32 --log-every 1)
"$bin" "${args[@]}" --log-jsonl "$tmp/one.jsonl" >"$tmp/one.txt" 2>&1 ||
    { echo "FAIL: training on one rank"; cat "$tmp/one.txt"; exit 1; }
if ! MPIRUN=$mpiexec MS_NETNS_HOSTFILE="$tmp/hosts" timeout 240 "$here/mpirun.sh" -np 4 \
    "$bin" "${args[@]}" --dp 2 --tp 2 --backend mpi --log-jsonl "$tmp/four.jsonl" \
    >"$tmp/four.txt" 2>&1; then
    echo "FAIL: training dp 2 x tp 2 on 2 hosts x 2 ranks"; tail -20 "$tmp/four.txt"; exit 1
fi
losses() { sed -n 's/.*"loss": *\([-0-9.eE+]*\).*/\1/p' "$1"; }
paste <(losses "$tmp/one.jsonl") <(losses "$tmp/four.jsonl") >"$tmp/pairs"
fail=0
n=$(wc -l <"$tmp/pairs")
[ "$n" -eq 4 ] || { echo "FAIL: $n logged steps, expected 4"; cat "$tmp/pairs"; fail=1; }
if ! awk '{ d = $1 - $2; if (d < 0) d = -d; if ($2 == "" || d > 1e-5 * $1) bad = 1 }
          END { exit bad }' "$tmp/pairs"; then
    echo "FAIL: losses differ (one rank, 2 hosts x 2 ranks):"; cat "$tmp/pairs"; fail=1
else
    echo "ok   losses of 2 hosts x 2 ranks equal one rank's: $(tr '\n\t' '; ' <"$tmp/pairs")"
fi
# gpt-tiny has ~0.2M parameters: dp's all-reduce of tp's half sends well over 100 KB per step
sent=$(ip netns exec host0 tc -s qdisc show dev ms0 | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p')
if [ "${sent:-0}" -gt 400000 ]; then
    echo "ok   host0 sent $sent bytes through its rate-limited link"
else
    echo "FAIL: host0's link carried ${sent:-0} bytes; the ranks did not talk across hosts"; fail=1
fi
exit $fail

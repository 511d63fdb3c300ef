#!/usr/bin/env bash
# link_down.sh MESHSCOPE SRC_DIR MPIEXEC: the link of a namespace host goes down in the middle of
# a dp 2 x tp 2 training on 2 hosts x 2 MPI ranks (tests/cluster/netns.sh; tp inside the hosts,
# dp across). Checks that every rank ends with a non-zero status within the communicator
# timeout plus the time to name the missing (a health check's grace, a quarter of the timeout)
# and to linger for the peers of its own host (as long again), though mpirun itself cannot
# reach the cut-off host's daemon; that each rank's error names the other host as unreachable,
# not just a rank that did not arrive (or, for a rank that gave up first in a tp collective,
# names the peer of its own host that was still in a dp collective across the link, whose own
# error names the other host); that every rank dumped its flight recorder; and that
# `meshscope doctor` on the dumps says the link between the two hosts is down. The link then comes back and everything is
# torn down. Skips (77) where namespaces cannot be made (not root, no ip or tc, netns
# forbidden). Every wait is bounded.
set -u
bin=$1 src=$2 mpiexec=$3
here="$src/tests/cluster"
timeout_s=5
"$here/netns.sh" check || exit $?
tmp=$(mktemp -d)
export MS_LINK_DOWN_JOB="$$.$RANDOM" # marks this job's processes (mpirun, daemons, ranks)
mpirun_pid=""

# Every process of this job, found by its environment (one grep over every environ).
job_pids() {
  grep -lzsx "MS_LINK_DOWN_JOB=$MS_LINK_DOWN_JOB" /proc/[0-9]*/environ 2>/dev/null |
    sed 's|^/proc/\([0-9]*\)/environ$|\1|'
}
# The ranks (meshscope processes of this job) still running, as pids.
ranks_alive() {
  local p
  for p in $(job_pids); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = meshscope ] &&
      [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && echo "$p"
  done
}
cleanup() {
  ip link set ms-veth1 up 2>/dev/null
  local p
  for p in $(job_pids); do kill -KILL "$p" 2>/dev/null; done
  "$here/netns.sh" down
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/out "$tmp"/err.*; do [ -f "$f" ] && { echo "--- $f"; tail -15 "$f"; }; done
  exit 1
}

"$here/netns.sh" up --hosts 2 --ranks-per-host 2 --rate 400 --hostfile "$tmp/hosts" >/dev/null ||
  fail "netns.sh up"
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 300) >"$tmp/text.txt"
# Each rank runs under a wrapper that keeps its stderr (the cut-off host's output cannot reach
# mpirun) and its exit status, also when its daemon terminates it.
cat >"$tmp/rank.sh" <<'WRAP'
#!/usr/bin/env bash
dir=$1
shift
r=$OMPI_COMM_WORLD_RANK
"$@" 2>"$dir/err.$r" &
child=$!
echo $child >"$dir/pid.$r"
trap 'kill -TERM $child 2>/dev/null' TERM
while :; do
  wait $child
  rc=$?
  kill -0 $child 2>/dev/null || break
done
echo "$rc $(date +%s.%N)" >"$dir/rc.$r"
exit $rc
WRAP
chmod +x "$tmp/rank.sh"
MPIRUN=$mpiexec MS_NETNS_HOSTFILE="$tmp/hosts" timeout -s KILL 300 "$here/mpirun.sh" -np 4 \
  "$tmp/rank.sh" "$tmp" "$bin" train --model "$src/configs/gpt-tiny.json" --data "$tmp/text.txt" \
  --dp 2 --tp 2 --backend mpi --steps 100000 --batch 4 --seq 32 --log-every 1 \
  --timeout-s "$timeout_s" --flight-dir "$tmp/flight" >"$tmp/out" 2>&1 &
mpirun_pid=$!

for _ in $(seq 1 240); do
  kill -0 "$mpirun_pid" 2>/dev/null || fail "the job ended before the link went down"
  [ "$(grep -c '^step' "$tmp/out")" -ge 3 ] && [ "$(ls "$tmp"/pid.* 2>/dev/null | wc -l)" -eq 4 ] && break
  sleep 0.5
done
[ "$(grep -c '^step' "$tmp/out")" -ge 3 ] || fail "training did not get under way"
t0=$(date +%s.%N)
ip link set ms-veth1 down || fail "cannot take host1's link down"
echo "took host1's link (ms-veth1) down after $(grep -c '^step' "$tmp/out") steps"

# the blocked collective's timeout, the health check's grace (a quarter of it), the linger
# for this host's peers (as long again) and slack for a loaded machine
limit=$((2 * timeout_s + 5))
since() { awk -v a="$1" -v b="$t0" 'BEGIN {printf "%.1f", a - b}'; }
# each rank's wrapper records its end; then no rank process may be left
while [ "$(ls "$tmp"/rc.* 2>/dev/null | wc -l)" -lt 4 ] &&
  [ "$(since "$(date +%s.%N)" | cut -d. -f1)" -lt "$limit" ]; do
  sleep 0.2
done
left=$(ranks_alive | tr '\n' ' ')
took=$(since "$(date +%s.%N)")
ip link set ms-veth1 up
[ -z "$left" ] || fail "rank processes $left still run ${took} s after the link went down"
[ "$(ls "$tmp"/rc.* | wc -l)" -eq 4 ] ||
  fail "only $(ls "$tmp"/rc.* | wc -l) ranks ended within ${limit} s of the link going down"
echo "every rank ended within ${took} s after the link went down"
# mpirun may wait for host1's daemon until the link is back; it must not outlive that long
for _ in $(seq 1 40); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.5; done
kill -0 "$mpirun_pid" 2>/dev/null && echo "(mpirun still waited for host1's daemon; killed)"

fail_any=0
host_of() { [ "$1" -ge 2 ] && echo host1 || echo host0; }
names_other() { grep -q "host $(host_of $((3 - $1))) unreachable from host " "$tmp/err.$1"; }
# The world ranks a rank's timeout names as not arrived, when all are of its own host and each
# of them names the other host as unreachable itself: empty otherwise.
behind_own_host() {
  local r=$1 w named
  named=$(grep -o 'ranks that did not arrive: .*' "$tmp/err.$r" | head -1 | grep -o 'world [0-9]*' |
    awk '{print $2}')
  [ -n "$named" ] || return 1
  for w in $named; do
    [ "$(host_of "$w")" = "$(host_of "$r")" ] && [ -s "$tmp/err.$w" ] && names_other "$w" ||
      return 1
  done
  echo "$named" | tr '\n' ' '
}
for r in 0 1 2 3; do
  [ -s "$tmp/rc.$r" ] || fail "rank $r's exit status was not recorded"
  read -r rc at <"$tmp/rc.$r"
  [ "$rc" -ne 0 ] || fail "rank $r exited 0 after the link went down"
  other=$(host_of $((3 - r)))
  if names_other "$r"; then
    echo "ok   rank $r exited $rc $(since "$at") s after the link went down: $(grep -o "host $other unreachable[^;]*" "$tmp/err.$r" | head -1)"
  elif behind=$(behind_own_host "$r"); then
    echo "ok   rank $r exited $rc $(since "$at") s after the link went down, behind world rank(s) ${behind}of its host, which name $other as unreachable"
  else
    echo "FAIL: rank $r's error does not name host $other as unreachable:"
    grep "meshscope train" "$tmp/err.$r" | head -3
    fail_any=1
  fi
done
[ "$(ls "$tmp/flight" 2>/dev/null | wc -l)" -eq 4 ] ||
  fail "not every rank dumped its flight recorder: $(ls "$tmp/flight" 2>/dev/null | tr '\n' ' ')"
"$bin" doctor "$tmp/flight" >"$tmp/doctor" 2>&1 || fail "meshscope doctor failed: $(cat "$tmp/doctor")"
echo "meshscope doctor says:"
cat "$tmp/doctor"
grep -q "^hosts host0 (ranks 0-1) and host1 (ranks 2-3) lost each other: .*the link between host0 and host1 is down" \
  "$tmp/doctor" || fail "meshscope doctor does not say the link between host0 and host1 is down"
exit $fail_any

#!/usr/bin/env bash
# netns.sh - several "hosts" on this machine: network namespaces joined by rate-limited links.
#
#   tests/cluster/netns.sh up [--hosts H] [--ranks-per-host R] [--rate MBIT] [--delay-free]
#                             [--hostfile FILE]
#   tests/cluster/netns.sh down
#   tests/cluster/netns.sh check      # exit 0 when namespaces can be made here, 77 (and why) if not
#
# Host i is the namespace "host<i>" with loopback up and one interface, ms0 (10.77.0.<i+1>/24),
# the far end of a veth pair whose near end (ms-veth<i>) is enslaved to the bridge ms-br0
# (10.77.0.254/24) in the root namespace, where mpirun runs. Ranks of one host talk over
# shared memory (/dev/shm is not namespaced); ranks of different hosts go through two token
# buckets in series (tbf on ms0 going out of the sender, tbf on ms-veth<j> going into the
# receiver), so the inter-host link is --rate Mbit/s per host and direction, a fraction of
# the intra-host bandwidth as on a real cluster. netem is not needed: --delay-free is the only
# mode (tbf adds no propagation delay; its queue bounds the latency at 10 ms).
#
# `up` writes a hostfile (host<i> slots=R; --hostfile, default /tmp/meshscope-netns/hostfile)
# and a topology JSON beside it (topology.json) that `meshscope plan --topology` reads.
# `down` removes everything `up` made and is idempotent.
set -euo pipefail

PREFIX=host
BRIDGE=ms-br0
STATE=/tmp/meshscope-netns
hosts=2 rph=2 rate=200 hostfile=""

die() { echo "netns.sh: $*" >&2; exit 1; }
skip() { echo "netns.sh: $*" >&2; exit 77; }

# Exits 77 with the reason when this machine cannot make namespaces.
check() {
    [ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (run as root)"
    command -v ip >/dev/null || skip "needs iproute2's ip (apt-get install iproute2)"
    command -v tc >/dev/null || skip "needs tc from iproute2 (apt-get install iproute2)"
    local probe=ms-probe-$$
    if ! ip netns add "$probe" 2>/dev/null; then
        skip "network namespaces are forbidden here (ip netns add failed; needs CAP_SYS_ADMIN)"
    fi
    ip netns del "$probe" 2>/dev/null || true
}

down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
    local v
    for v in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
               grep -E '^ms-veth[0-9]+$' || true); do
        ip link del "$v" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$STATE"
}

# tbf on one interface: rate in Mbit/s, a burst of 10 ms at that rate (at least rate / HZ, or
# the bucket cannot refill fast enough to reach the rate).
shape() {
    local ns=$1 dev=$2 burst=$((rate * 1000000 / 8 / 100))
    [ "$burst" -ge 16384 ] || burst=16384
    ${ns:+ip netns exec "$ns"} tc qdisc replace dev "$dev" root tbf rate "${rate}mbit" \
        burst "$burst" latency 10ms
}

up() {
    [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "--hosts must be 1..200"
    [ "$rph" -ge 1 ] || die "--ranks-per-host must be at least 1"
    [ "$rate" -ge 1 ] || die "--rate must be at least 1 (Mbit/s)"
    check
    down
    mkdir -p "$STATE"
    ip link add "$BRIDGE" type bridge
    ip addr add 10.77.0.254/24 dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local i ns
    for ((i = 0; i < hosts; i++)); do
        ns=$PREFIX$i
        ip netns add "$ns"
        ip link add "ms-veth$i" type veth peer name ms0 netns "$ns"
        ip link set "ms-veth$i" master "$BRIDGE" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev ms0
        ip -n "$ns" link set ms0 up
        shape "$ns" ms0
        shape "" "ms-veth$i"
    done
    [ -n "$hostfile" ] || hostfile=$STATE/hostfile
    : >"$hostfile"
    for ((i = 0; i < hosts; i++)); do echo "$PREFIX$i slots=$rph" >>"$hostfile"; done
    # what the planner needs; the link figures are the configured ones (bench comm measures them)
    cat >"$STATE/topology.json" <<EOF
{"hosts": $hosts, "ranks_per_host": $rph, "rank_order": "by-host",
 "inter_node": {"bw_gbps": $(awk -v r="$rate" -v n="$rph" 'BEGIN{printf "%.6f", r / 8000 / n}'), "latency_us": 60, "efficiency": 1}}
EOF
    echo "netns.sh: $hosts hosts x $rph ranks, inter-host ${rate} Mbit/s; hostfile $hostfile"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
while [ $# -gt 0 ]; do
    case $1 in
        --hosts) hosts=$2; shift 2 ;;
        --ranks-per-host) rph=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --delay-free) shift ;;
        --hostfile) hostfile=$2; shift 2 ;;
        *) die "unknown option $1 (use --hosts H --ranks-per-host R --rate MBIT --hostfile F)" ;;
    esac
done
case $cmd in
    up) up ;;
    down) [ "$(id -u)" = 0 ] || die "needs root (run as root)"; down ;;
    check) check ;;
    *) die "usage: netns.sh up|down|check [--hosts H --ranks-per-host R --rate MBIT]" ;;
esac

#!/usr/bin/env bash
# measure.sh MESHSCOPE [OUT.json]: measures the link between the namespace hosts of netns.sh
# (an MPI all-reduce between one rank on host0 and one on host1, 4 KiB and 256 KiB) and writes
# the topology `meshscope plan --topology` reads (default /tmp/meshscope-netns/topology.json):
# the latency is half the small all-reduce (a 2-rank ring makes 2 hops), the bandwidth the
# slope between the two sizes divided among the ranks of a host (they share the host's link).
# 256 KiB is the size of the engine's per-tensor all-reduces; OpenMPI switches to reduce then
# broadcast for 2 ranks from about 1 MiB, which halves the bus bandwidth of larger buffers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: measure.sh MESHSCOPE [OUT.json]}
out=${2:-/tmp/meshscope-netns/topology.json}
hostfile=${MS_NETNS_HOSTFILE:-/tmp/meshscope-netns/hostfile}
[ -f "$hostfile" ] || { echo "measure.sh: no $hostfile (run tests/cluster/netns.sh up)" >&2; exit 1; }
hosts=$(grep -c slots= "$hostfile")
rph=$(sed -n '1s/.*slots=\([0-9]*\).*/\1/p' "$hostfile")
[ "$hosts" -ge 2 ] || { echo "measure.sh: needs 2 hosts or more" >&2; exit 1; }
rows=$("$here/mpirun.sh" --map-by node -np 2 "$bin" bench comm-mpi-worker --ops all_reduce \
    --min-bytes 4K --max-bytes 256K --step 8 --reps 5)
# rows: TAG op ranks bytes iters reps time_us min_us
small=$(awk -F'\t' '$4 == 4096 {print $7}' <<<"$rows")
large=$(awk -F'\t' '$4 == 262144 {print $7}' <<<"$rows")
[ -n "$small" ] && [ -n "$large" ] || { echo "measure.sh: no rows from the bench:" >&2; echo "$rows" >&2; exit 1; }
lat_us=$(awk -v t="$small" 'BEGIN {printf "%.3f", t / 2}')
bw_gbps=$(awk -v s="$small" -v t="$large" -v n="$rph" \
    'BEGIN {printf "%.6f", (262144 - 4096) / ((t - s) * 1e-6) / 1e9 / n}')
cat >"$out" <<EOF
{"hosts": $hosts, "ranks_per_host": $rph, "rank_order": "by-host",
 "inter_node": {"bw_gbps": $bw_gbps, "latency_us": $lat_us, "efficiency": 1},
 "measured": {"all_reduce_4KiB_us": $small, "all_reduce_256KiB_us": $large}}
EOF
echo "measure.sh: between hosts ${lat_us} us a hop, $(awk -v b="$bw_gbps" -v n="$rph" \
    'BEGIN {printf "%.1f", b * n * 1000}') MB/s a host; wrote $out"

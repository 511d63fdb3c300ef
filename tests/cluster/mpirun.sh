#!/usr/bin/env bash
# mpirun.sh - mpirun over the namespace hosts of netns.sh: one orted per host (agent.sh), shared
# memory (vader) between the ranks of a host, TCP on the 10.77.0.0/24 links between hosts.
#
#   tests/cluster/mpirun.sh [--map-by slot|node] -np N PROGRAM ARGS...
#
# --map-by slot (the default) fills host0 before host1 (ranks 0,1 on host0 with 2 per host);
# --map-by node deals the ranks round robin (0 and 2 on host0). MPIRUN overrides the mpirun.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hostfile=${MS_NETNS_HOSTFILE:-/tmp/meshscope-netns/hostfile}
[ -f "$hostfile" ] || { echo "mpirun.sh: no $hostfile (run tests/cluster/netns.sh up)" >&2; exit 1; }
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "${MPIRUN:-mpirun}" --hostfile "$hostfile" --oversubscribe --bind-to none \
    --mca plm_rsh_agent "$here/agent.sh" \
    --mca oob_tcp_if_include 10.77.0.0/24 \
    --mca btl self,vader,tcp --mca btl_tcp_if_include 10.77.0.0/24 \
    "$@"

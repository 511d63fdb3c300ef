#!/usr/bin/env bash
# agent.sh - OpenMPI's launch agent for the namespace hosts of netns.sh (--mca plm_rsh_agent).
#
# mpirun calls it as an ssh stand-in: `agent.sh [ssh options] HOST COMMAND...`. It runs COMMAND
# (the orted daemon) inside the network namespace HOST, in its own UTS namespace whose
# hostname is HOST, so that OpenMPI sees distinct nodes (shared memory inside one, TCP across).
set -euo pipefail
while [ $# -gt 0 ]; do
    case $1 in
        -x | -T | -q | -n | -A) shift ;;
        -o | -l | -p | -i) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=${1:?agent.sh: no host given}
shift
ip netns list | awk '{print $1}' | grep -qx "$host" ||
    { echo "agent.sh: no network namespace '$host' (run tests/cluster/netns.sh up)" >&2; exit 1; }
# the daemon's command line arrives as one string, as ssh would pass it to a shell
exec ip netns exec "$host" unshare --uts sh -c "hostname $host && $*"

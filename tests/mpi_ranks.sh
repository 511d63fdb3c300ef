# mpi_ranks.sh - sourced by the MPI test scripts: finds the rank processes of one job by a mark
# in their environment, so that they are never confused with another job's.
#   ms_mpi_job_mark   marks the jobs started from now on (exports MS_TEST_MPI_JOB)
#   ms_mpi_job_ranks  the marked job's ranks, one "RANK PID" line each
# shellcheck shell=bash

ms_mpi_job_mark() {
  export MS_TEST_MPI_JOB="$$.$RANDOM.$SECONDS"
}

ms_mpi_job_ranks() {
  local e p r env
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}
    p=${p%/environ}
    env=$({ tr '\0' '\n' <"$e"; } 2>/dev/null)
    grep -qx "MS_TEST_MPI_JOB=$MS_TEST_MPI_JOB" <<<"$env" || continue
    r=$(sed -n 's/^OMPI_COMM_WORLD_RANK=//p' <<<"$env")
    [ -n "$r" ] && echo "$r $p"
  done
}

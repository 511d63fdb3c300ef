/* comm_mpi.h - the MPI backend: ranks are OpenMPI processes (mpirun, hostfiles).
 *
 * Collectives use MPI's non-blocking calls polled against the deadline, so a missing
 * rank yields MS_ERR_TIMEOUT instead of a hang. Available when built with MPI; otherwise
 * every function returns MS_ERR_UNSUPPORTED with a message.
 */
#ifndef MS_COMM_MPI_H
#define MS_COMM_MPI_H

#include <stdbool.h>

#include "engine/comm/comm.h"

/* True when this process was started by mpirun/mpiexec (checked from the environment,
 * without initialising MPI). */
bool ms_mpi_launched(void);

/* Initialises MPI (MPI_THREAD_SERIALIZED or better) unless already initialised. */
ms_status ms_mpi_init(int *argc, char ***argv, ms_error *err);
/* Finalises MPI if this module initialised it. */
void ms_mpi_finalize(void);

/* This process's world communicator (a duplicate of MPI_COMM_WORLD). */
ms_status ms_comm_mpi_create_world(ms_comm **out, ms_error *err);

#endif

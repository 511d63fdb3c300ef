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
/* This process's world rank as the launcher put it in the environment (read before MPI is
 * initialised, e.g. to print something once per job); 0 when not launched by one. */
int ms_mpi_launch_rank(void);

/* Initialises MPI (MPI_THREAD_SERIALIZED or better) unless already initialised. */
ms_status ms_mpi_init(int *argc, char ***argv, ms_error *err);
/* Finalises MPI if this module initialised it. Not after ms_mpi_failed(): MPI_Finalize
 * would then wait for a stalled rank, possibly forever. */
void ms_mpi_finalize(void);

/* True once a communicator of this process abandoned an operation (a timeout, a transport
 * error, collectives called in different orders): MPI may still be waiting on a peer. */
bool ms_mpi_failed(void);

/* Ends the whole job now without waiting for any rank: flushes stdout and stderr, then
 * MPI_Abort on MPI_COMM_WORLD with `code` (mpirun kills every process, stopped ones too).
 * For the program's top level, after it reported the error; does not return. */
_Noreturn void ms_mpi_abort(int code);

/* This process's world communicator (a duplicate of MPI_COMM_WORLD). */
ms_status ms_comm_mpi_create_world(ms_comm **out, ms_error *err);

#endif

/* comm_threads.h - the threads backend: ranks are threads of one process and collectives
 * go through shared memory (each rank reads its peers' buffers directly).
 *
 * Usage: one ms_threads_world for n ranks, created before the rank threads start; each
 * rank thread then calls ms_comm_threads_create with its rank to get its world
 * communicator. Destroy every communicator first, then the world (after the threads join).
 */
#ifndef MS_COMM_THREADS_H
#define MS_COMM_THREADS_H

#include "engine/comm/comm.h"

typedef struct ms_threads_world ms_threads_world;

ms_status ms_threads_world_create(int nranks, ms_threads_world **out, ms_error *err);
void ms_threads_world_destroy(ms_threads_world *w);
int ms_threads_world_size(const ms_threads_world *w);

/* The world communicator of `rank` (0..n-1). Not collective; call from the rank's thread. */
ms_status ms_comm_threads_create(ms_threads_world *w, int rank, ms_comm **out, ms_error *err);

#endif

/* clock.h - aligning the ranks' monotonic clocks, so that events recorded on different
 * processes (MPI, possibly several hosts) can be drawn on one time axis.
 *
 * Rank 0 is the reference. For every other rank, rank 0 runs `rounds` ping-pongs: it notes
 * its time t_a, asks the rank for its clock T, notes t_b on the answer. T was read somewhere
 * in [t_a, t_b] of rank 0's time, so offset = (t_a + t_b)/2 - T maps the rank's time to rank
 * 0's within +-(t_b - t_a)/2. The round with the smallest round trip wins (Cristian's
 * algorithm); its half round trip is the uncertainty. Rank 0 drives the exchange so that a
 * rank waiting for its turn does not inflate its own round trips.
 *
 * Traffic goes over a private communicator split from `world` for the call, so that it
 * neither shifts the sequence numbers of the world's later collectives (point-to-point
 * calls count only on the ranks that make them) nor shows up in traces; the split itself
 * is one collective on `world`.
 */
#ifndef MS_CLOCK_H
#define MS_CLOCK_H

#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/core/status.h"

/* Collective over world. On return, on every rank, local_time + *offset_ns ~ rank 0's time
 * within *uncertainty_ns (rank 0: 0 and 0). rounds: ping-pongs per rank, 1..1000 (8-32 is
 * plenty). May be called again at any time (e.g. every few minutes) to follow drift.
 *
 * On the threads backend all ranks share one clock, so the exchange is still run (the code
 * path is the same everywhere and stays tested) but the result is exactly 0 +- 0: a measured
 * offset of a few microseconds would only add noise to cross-rank comparisons. */
ms_status ms_clock_align(ms_comm *world, int rounds, int64_t *offset_ns, int64_t *uncertainty_ns,
                         ms_error *err);

/* The measurement itself, never short-circuited (ms_clock_align without the shared-clock
 * rule): for tests, and for backends whose processes may share a host clock. */
ms_status ms_clock_measure(ms_comm *world, int rounds, int64_t *offset_ns, int64_t *uncertainty_ns,
                           ms_error *err);

/* An int64 as three floats, exactly (22 + 22 + 20 bits; each part is an integer below 2^22,
 * which a float holds exactly), for passing one through a float32 call (ms_broadcast,
 * ms_all_reduce). The alignment itself moves its values as bytes. */
void ms_clock_encode(int64_t v, float out[3]);
int64_t ms_clock_decode(const float in[3]);

#endif

/* gather.h - collecting every rank's events (and group tables) on rank 0, incrementally and
 * with bounded memory, so rank 0 can analyse and serve a live view of the whole job.
 *
 * Called at step boundaries by every rank of the communicator (it is collective). Each call
 * moves at most max_per_rank new events per rank; what is left stays in the rings for the
 * next call, so one call costs a bounded amount of time and memory whatever the backlog.
 * Wire format: the records themselves. Events travel as byte messages (ms_p2p_bytes), each
 * rank's a run of whole ms_event structs (profiler/event.h) exactly as they sit in memory:
 * one struct in memory, on the wire and, field for field, in the trace file. Group tables
 * travel the same way as ms_group structs. Nothing is converted, so every rank must run the
 * same build on the same kind of machine (layout and byte order), as an MPI job does.
 *
 * Traffic: one all-gather of the per-rank (count, limit) pairs (as float32 values, exact
 * since both are below 2^24), then one point-to-point batch (tag 7302) in which every rank
 * with records sends them to rank 0, which receives them all at once at their places in its
 * buffer (a gatherv). Every rank makes both calls, even with nothing to send, so the
 * communicator's sequence numbers stay in step. Pass a communicator without a profiler
 * probe (e.g. one split from the world for the profiler) if the gathers should not appear
 * in the trace themselves.
 */
#ifndef MS_GATHER_H
#define MS_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/core/status.h"
#include "profiler/record/recorder.h"

/* Upper bound on max_per_rank (events per rank per call). */
#define MS_GATHER_MAX_PER_RANK ((size_t)1 << 20)

/* Collective over comm; every rank passes the same max_per_rank.
 *
 * Each rank reads up to max_per_rank events newer than *cursor (its own, start at 0) from
 * `local` (NULL: a rank without tracing, contributes nothing), adds clock_offset_ns to their
 * times (ms_clock_align's offset, so rank 0 sees one time axis), and sends them to rank 0.
 *
 * out: rank 0: room for size * max_per_rank events; receives all of them, rank 0's first,
 *      then rank 1's, ..., each rank's in the order it recorded them; *n_out = the total.
 *      Other ranks: room for max_per_rank events, or NULL (then a buffer is allocated for
 *      the call); receives what this rank sent; *n_out = that count.
 * The cursor advances only when the call succeeds (a failed call loses no events). Events
 * that the ring overwrote before they were gathered are skipped; the difference between the
 * cursor's advance and the count sent is what this rank lost. The caller owns out. */
ms_status ms_gather_events(ms_comm *comm, ms_recorder *local, uint64_t *cursor, size_t max_per_rank,
                           ms_event *out, size_t *n_out, int64_t clock_offset_ns, ms_error *err);

/* Collective over comm. Rank 0 receives the union of every rank's group table (ids are
 * content hashes, see ms_recorder_group, so the same group from several ranks is kept once),
 * at most max groups, in order of first appearance (rank 0's table first); *n_out = how many
 * were stored. Other ranks: out may be NULL, *n_out = 0. local may be NULL. */
ms_status ms_gather_groups(ms_comm *comm, const ms_recorder *local, ms_group *out, int max,
                           int *n_out, ms_error *err);

#endif

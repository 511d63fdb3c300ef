/* tracer.h - a training job's tracing: each rank records into its own ring; rank 0 gathers
 * what is new every few steps (bounded per call) over a private communicator, so the
 * gathering is not itself traced, and writes one Chrome trace at the end. The live views
 * read the threads backend's rings directly; under MPI the gathered events also feed rank
 * 0's live model.
 *
 * Ownership: each rank owns its tracer; tracer_free detaches the recorder from the ctx.
 */
#ifndef MS_JOB_TRACER_H
#define MS_JOB_TRACER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/runtime/ctx.h"
#include "profiler/live.h"
#include "profiler/nccl_lane.h"
#include "profiler/record/recorder.h"

typedef struct tracer {
    ms_recorder *rec;
    ms_comm *comm; /* private: split from the world before the world is probed */
    uint64_t cursor;
    int64_t clock_offset;
    bool keep;     /* keep gathered events for the trace file (--trace) */
    bool live_mpi; /* every rank: live views under MPI (gather events and groups for them) */
    ms_live *feed; /* rank 0 under MPI: gathered events go to the live model */
    ms_event *all; /* rank 0 */
    size_t n, cap;
    /* GPU activity (CUDA devices): the first rank of each process runs the CUPTI collector
     * into gpu_rec and passes its events on into rec at every gather. */
    ms_recorder *gpu_rec;
    uint64_t gpu_cursor;
    /* NCCL's view of the collectives (profiler/nccl_lane.h): the first rank of each process
     * drains the NCCL profiler plugin into rec at every gather. */
    bool nccl_drain;
    ms_nccl_lane_counts nccl_counts;
} tracer;

/* Collective: splits the private communicator, aligns clocks, attaches a recorder; on a CUDA
 * device also starts collecting GPU activity (or says why it cannot, and traces the host). */
ms_status tracer_start(ms_ctx *ctx, tracer *t, ms_error *err);
/* --trace on a CUDA device of a build with NCCL: makes NCCL load meshscope's profiler plugin
 * (NCCL_PROFILER_PLUGIN, unless the user set it) and drains it into the trace. Call after
 * tracer_start and before the first NCCL communicator (the trainer's); every rank calls it.
 * Without the plugin it says why once and the trace goes on without NCCL's view. */
void tracer_nccl_start(ms_ctx *ctx, tracer *t);
/* Collective: gathers every rank's new events to rank 0. */
ms_status tracer_gather(ms_ctx *ctx, tracer *t, ms_error *err);
/* Collective: a last gather, then rank 0 writes the trace file with the events from step
 * `from` on. */
ms_status tracer_finish(ms_ctx *ctx, tracer *t, const char *path, int64_t from, ms_error *err);
void tracer_free(ms_ctx *ctx, tracer *t);

#endif

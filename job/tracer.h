/* tracer.h - a training job's tracing: each rank records into its own ring; rank 0 gathers
 * what is new every few steps (bounded per call) over a private communicator, so the
 * gathering is not itself traced, and writes one Chrome trace at the end. The live views
 * read the threads backend's rings directly; under MPI the gathered events also feed rank
 * 0's live model.
 *
 * Ownership: each rank owns its tracer; tracer_close detaches the recorder from the ctx and the
 * live model.
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

/* What a job asks of its tracing: a trace file, live views, or neither (then nothing starts). */
typedef struct tracer_opts {
    const char *path; /* --trace: the Chrome trace written at the end, NULL for none */
    int64_t from;     /* --trace-from: the file keeps events from this step on */
    ms_live *live;    /* the live model the views read, NULL for none (MPI: rank 0's only) */
    bool live_views;  /* every rank: the job has live views (on some rank) */
} tracer_opts;

typedef struct tracer {
    tracer_opts o;
    ms_recorder *rec; /* NULL: not tracing */
    ms_comm *comm;    /* private: split from the world before the world is probed */
    uint64_t cursor;
    int64_t clock_offset;
    bool keep;         /* keep gathered events for the trace file (--trace) */
    bool live_mpi;     /* every rank: live views under MPI (gather events and groups for them) */
    ms_live *feed;     /* rank 0 under MPI: gathered events go to the live model */
    ms_live *attached; /* threads: the live model that reads this rank's rings directly */
    ms_event *all;     /* rank 0 */
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

/* Collective: starts what o asks for (nothing, and t stays empty, when it asks for neither a
 * file nor live views). The backend decides how events reach the views, here and nowhere
 * else: under threads the live model reads each rank's rings directly; under MPI rank 0
 * gathers every few steps and feeds it. On a CUDA device also collects GPU activity (or says
 * why it cannot) and, with a trace file, NCCL's view. */
ms_status tracer_open(ms_ctx *ctx, tracer *t, const tracer_opts *o, ms_error *err);
/* Before step `step`: records from --trace-from on (from step 0 when live views need it). */
void tracer_step(ms_ctx *ctx, tracer *t, int step);
/* Collective, after step `step`: every 10 steps gathers what the trace file or MPI's live
 * views need. */
ms_status tracer_after_step(ms_ctx *ctx, tracer *t, int step, ms_error *err);
/* Collective: a last gather, then rank 0 writes the trace file (a no-op without one). */
ms_status tracer_finish(ms_ctx *ctx, tracer *t, ms_error *err);
/* Detaches from the live model and the ctx, frees. */
void tracer_close(ms_ctx *ctx, tracer *t);

/* Collective: gathers every rank's new events to rank 0. */
ms_status tracer_gather(ms_ctx *ctx, tracer *t, ms_error *err);

#endif

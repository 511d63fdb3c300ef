/* tracer.c - a training job's tracing (see tracer.h). */
#include "job/tracer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "profiler/cupti.h"
#include "profiler/gpu_attribute.h"
#include "profiler/record/clock.h"
#include "profiler/record/gather.h"
#include "profiler/record/hooks.h"
#include "traces/trace_write.h"

#define TRACE_RING       (1u << 16)
#define TRACE_GATHER_MAX (1u << 15)

/* Every rank on a CUDA device brackets its operators' launches with correlation ids; the first
 * rank of the process (one CUPTI collector per process) collects. */
static void gpu_start(ms_ctx *ctx, tracer *t) {
    if (ctx->device->ops->kind != MS_DEVICE_CUDA) return;
    ctx->trace.gpu_push = ms_cupti_push_correlation;
    ctx->trace.gpu_pop = ms_cupti_pop_correlation;
    if (ctx->backend != MS_BACKEND_MPI && ctx->rank != 0) return;
    ms_error e = {0};
    ms_status st = ms_recorder_create(ctx->rank, TRACE_RING, &t->gpu_rec, &e);
    if (st == MS_OK) st = ms_cupti_start(t->gpu_rec, 100, &e);
    if (st == MS_OK) return;
    fprintf(stderr, "trace: rank %d: no GPU activity (%s); tracing the host side only\n", ctx->rank,
            e.msg);
    ms_recorder_destroy(t->gpu_rec);
    t->gpu_rec = NULL;
}

/* GPU activity collected so far goes into this rank's ring (this is the ring's writer), with
 * the rank and step it was stamped with; rank 0 attributes it to its operators later. */
static void gpu_pass_on(tracer *t) {
    if (!t->gpu_rec) return;
    ms_error e = {0};
    (void)ms_cupti_flush(&e);
    ms_event buf[256];
    uint64_t missed = 0;
    size_t got;
    while ((got = ms_recorder_read(t->gpu_rec, &t->gpu_cursor, buf, 256, &missed)) > 0)
        for (size_t i = 0; i < got; i++) ms_recorder_push_as(t->rec, &buf[i]);
}

/* With a trace file on a CUDA device of a build with NCCL: makes NCCL load meshscope's profiler
 * plugin (NCCL_PROFILER_PLUGIN, unless the user set it) and drains it into the trace. Before the
 * first NCCL communicator (the trainer's); every rank calls it. Without the plugin it says why
 * once and the trace goes on without NCCL's view. */
static void nccl_start(ms_ctx *ctx, tracer *t) {
#ifdef MS_HAVE_NCCL
    if (ctx->device->ops->kind != MS_DEVICE_CUDA) return;
    /* Every rank opens (once per process), so none makes a communicator before the variable
     * is set; one rank per process drains. */
    const bool open = ms_nccl_lane_open(NULL);
    t->nccl_drain = open && (ctx->backend == MS_BACKEND_MPI || ctx->rank == 0);
#else
    (void)ctx, (void)t; /* no NCCL communicators in this build */
#endif
}

/* NCCL's records so far go into this rank's ring (this is the ring's writer); rank 0 links
 * them to their collectives at the end. */
static void nccl_pass_on(ms_ctx *ctx, tracer *t) {
    if (t->nccl_drain) ms_nccl_lane_drain(t->rec, ctx->rank, &t->nccl_counts);
}

/* Rank 0, before the step filter (linking gives NCCL's records their steps). */
static void nccl_link(ms_ctx *ctx, tracer *t) {
    ms_nccl_link_stats ls;
    if (ms_nccl_lane_link(t->all, t->n, ctx->backend != MS_BACKEND_MPI, &ls) != 0) {
        fprintf(stderr, "trace: out of memory linking NCCL's records; kept unlinked\n");
        return;
    }
    if (ls.linked + ls.unlinked == 0) return;
    printf("trace: NCCL plugin: %zu calls, %zu linked to meshscope's collectives, %zu on GPU time "
           "(clock offset within %.1f us); %llu proxy ops on rank 0's process\n",
           ls.linked + ls.unlinked, ls.linked, ls.gpu_placed, (double)ls.gpu_uncertainty_ns / 1e3,
           (unsigned long long)t->nccl_counts.proxy_ops);
}

static void gpu_stop(ms_ctx *ctx, tracer *t) {
    ctx->trace.gpu_push = NULL;
    ctx->trace.gpu_pop = NULL;
    if (!t->gpu_rec) return;
    ms_cupti_stop();
    gpu_pass_on(t);
}

/* The live views' feed: the threads backend's model reads this rank's rings (and the GPU
 * collector's, as it fills); under MPI rank 0's model gets what rank 0 gathers. */
static void live_attach(ms_ctx *ctx, tracer *t) {
    t->live_mpi = t->o.live_views && ctx->backend == MS_BACKEND_MPI;
    if (!t->o.live) return;
    if (ctx->backend == MS_BACKEND_MPI) {
        t->feed = t->o.live;
        return;
    }
    t->attached = t->o.live;
    ms_live_attach_recorder(t->attached, t->rec);
    if (t->gpu_rec) ms_live_attach_recorder(t->attached, t->gpu_rec);
}

ms_status tracer_open(ms_ctx *ctx, tracer *t, const tracer_opts *o, ms_error *err) {
    memset(t, 0, sizeof *t);
    t->o = *o;
    if (!o->path && !o->live_views) return MS_OK;
    MS_CHECK(ms_comm_split(ctx->world, 0, ctx->rank, "trace", &t->comm, err));
    int64_t unc;
    MS_CHECK(ms_clock_align(t->comm, 8, &t->clock_offset, &unc, err));
    MS_CHECK(ms_recorder_create(ctx->rank, TRACE_RING, &t->rec, err));
    ms_record_into(ctx, t->rec);
    gpu_start(ctx, t);
    t->keep = o->path != NULL;
    if (t->keep) nccl_start(ctx, t);
    live_attach(ctx, t);
    return MS_OK;
}

void tracer_step(ms_ctx *ctx, tracer *t, int step) {
    if (!t->rec) return;
    /* Attached from the start (so every communicator is probed), recording from --trace-from
     * on (from step 0 when the live views need the events). */
    ctx->trace.recorder = step >= t->o.from || t->o.live_views ? t->rec : NULL;
    ms_recorder_set_step(t->rec, step);
}

ms_status tracer_after_step(ms_ctx *ctx, tracer *t, int step, ms_error *err) {
    if (t->rec && (t->keep || t->live_mpi) && step % 10 == 9) return tracer_gather(ctx, t, err);
    return MS_OK;
}

ms_status tracer_gather(ms_ctx *ctx, tracer *t, ms_error *err) {
    gpu_pass_on(t);
    nccl_pass_on(ctx, t);
    for (;;) {
        if (ctx->rank == 0 && t->cap - t->n < (size_t)ctx->world_size * TRACE_GATHER_MAX) {
            t->cap = t->cap * 2 + (size_t)ctx->world_size * TRACE_GATHER_MAX;
            t->all = xrealloc(t->all, sizeof *t->all * t->cap);
        }
        size_t got = 0;
        MS_CHECK(ms_gather_events(t->comm, t->rec, &t->cursor, TRACE_GATHER_MAX,
                                  ctx->rank == 0 ? t->all + t->n : NULL, &got, t->clock_offset,
                                  err));
        if (ctx->rank == 0 && t->feed) ms_live_feed_events(t->feed, t->all + t->n, got);
        if (t->keep) t->n += got;
        /* Agree on whether any rank still has events waiting. */
        float more = ms_recorder_pushed(t->rec) > t->cursor ? 1.0f : 0.0f, any = 0;
        MS_CHECK(ms_all_reduce(t->comm, &more, &any, 1, MS_REDUCE_MAX, err));
        if (any == 0) break;
    }
    if (t->live_mpi) {
        /* The live model needs the groups to draw the heatmap (collective: every rank). */
        ms_group groups[256];
        int ng = 0;
        MS_CHECK(ms_gather_groups(t->comm, t->rec, groups, 256, &ng, err));
        if (ctx->rank == 0 && t->feed) ms_live_feed_groups(t->feed, groups, ng);
    }
    return MS_OK;
}

ms_status tracer_finish(ms_ctx *ctx, tracer *t, ms_error *err) {
    if (!t->rec || !t->keep) return MS_OK;
    const char *path = t->o.path;
    const int64_t from = t->o.from;
    ctx->trace.recorder = t->rec; /* what follows the last step is recorded too */
    ms_recorder_set_step(t->rec, -1);
    /* Every rank's queued work has run before the last drain (a sync, then all agree), so
     * NCCL's records of the last step's collectives, kept by the plugin once their kernels
     * end, are complete when the process's draining rank reads them */
    if (ctx->device->ops->kind == MS_DEVICE_CUDA) {
        float done = 1, all = 0;
        MS_CHECK(ms_device_sync(ctx->device, err));
        MS_CHECK(ms_all_reduce(t->comm, &done, &all, 1, MS_REDUCE_MIN, err));
    }
    gpu_stop(ctx, t);
    MS_CHECK(tracer_gather(ctx, t, err));
    ms_group groups[512];
    int ng = 0;
    MS_CHECK(ms_gather_groups(t->comm, t->rec, groups, 512, &ng, err));
    if (ctx->rank != 0) return MS_OK;
    ms_gpu_attribute(t->all, t->n); /* before the step filter: GPU activity's steps come late */
    nccl_link(ctx, t);
    /* Recording starts at step 0 when the live views need it; the file keeps --trace-from on
     * (and what follows the last step: the final gather, memory). */
    size_t w = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->all[i].step < 0 ? t->all[i].t0_ns > 0 : t->all[i].step >= from)
            t->all[w++] = t->all[i];
    t->n = w;
    ms_trace_meta meta = {.backend = ms_comm_backend(ctx->world), .world_size = ctx->world_size};
    MS_CHECK(ms_trace_write(path, t->all, t->n, groups, ng, &meta, err));
    printf("trace: %zu events from %d ranks in %s (dropped %llu on rank 0)\n", t->n,
           ctx->world_size, path, (unsigned long long)ms_recorder_dropped(t->rec));
    return MS_OK;
}

void tracer_close(ms_ctx *ctx, tracer *t) {
    if (t->attached && t->rec) ms_live_detach_recorder(t->attached, t->rec);
    if (t->attached && t->gpu_rec) ms_live_detach_recorder(t->attached, t->gpu_rec);
    if (t->gpu_rec) gpu_stop(ctx, t);
    ms_recorder_destroy(t->gpu_rec);
    if (t->rec) ms_record_into(ctx, NULL);
    ms_recorder_destroy(t->rec);
    ms_comm_destroy(t->comm);
    free(t->all);
    memset(t, 0, sizeof *t);
}

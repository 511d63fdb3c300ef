/* ctx.c - rank contexts and the threads/MPI launcher. */
#include "engine/runtime/ctx.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/comm/comm_mpi.h"
#include "engine/comm/comm_threads.h"
#include "engine/comm/flight.h"
#include "engine/core/xalloc.h"

const char *ms_backend_name(ms_backend_kind b) {
    return b == MS_BACKEND_MPI ? "mpi" : "threads";
}

ms_status ms_backend_parse(const char *text, ms_backend_kind *out, ms_error *err) {
    if (!strcmp(text, "threads"))
        *out = MS_BACKEND_THREADS;
    else if (!strcmp(text, "mpi"))
        *out = MS_BACKEND_MPI;
    else
        return ms_fail(err, MS_ERR_INVALID, "unknown backend '%s'; use threads or mpi", text);
    return MS_OK;
}

static ms_status ctx_init(ms_ctx *ctx, const ms_launch_opts *opts, ms_comm *world, ms_error *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->world = world;
    ctx->rank = ms_comm_rank(world);
    ctx->world_size = ms_comm_size(world);
    ctx->backend = opts->backend;
    ctx->seed = opts->seed;
    if (opts->timeout_ms > 0) ms_comm_set_timeout_ms(world, opts->timeout_ms);
    MS_CHECK(ms_device_create(opts->device, ctx->rank, &ctx->device, err));
    /* Collectives on the device's memory stage through the host (comm.h); the dmesh's and
     * every other split of the world inherit it. */
    ms_comm_set_device(world, ctx->device);
    return MS_OK;
}

void ms_ctx_set_sink(ms_ctx *ctx, void *recorder, const ms_trace_sink_ops *ops) {
    ms_comm_set_observer(ctx->world, NULL, NULL);
    ms_trace_probe_free(&ctx->trace, ctx->world_probe);
    ctx->world_probe = NULL;
    ctx->trace.recorder = recorder;
    if (ops) ctx->trace.ops = ops;
    ctx->world_probe = ms_trace_probe(&ctx->trace, ctx->world, -1);
}

static void ctx_fini(ms_ctx *ctx) {
    for (int i = 0; i < 4; i++) ms_device_free(ctx->device, ctx->ws[i], ctx->ws_cap[i]);
    ms_trace_probe_free(&ctx->trace, ctx->world_probe);
    if (ctx->plans_free) ctx->plans_free(ctx->plans);
    ms_comm_destroy(ctx->world);
    ms_device_destroy(ctx->device);
}

/* What the launcher learns as the rank threads of one launch return. */
typedef struct launch_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC, the clock of ms_now_ns */
    int returned, failed;
    int64_t last_return_ns;
} launch_watch;

typedef struct rank_thread {
    pthread_t tid;
    ms_threads_world *w;
    int rank;
    const ms_launch_opts *opts;
    ms_rank_fn fn;
    void *arg;
    launch_watch *watch;
    bool returned; /* under watch->mu */
    ms_status st;
    ms_error err;
} rank_thread;

static void rank_returned(rank_thread *t) {
    launch_watch *w = t->watch;
    pthread_mutex_lock(&w->mu);
    t->returned = true;
    w->returned++;
    if (t->st != MS_OK) w->failed++;
    w->last_return_ns = ms_now_ns();
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void *rank_thread_main(void *p) {
    rank_thread *t = p;
    ms_comm *world = NULL;
    t->st = ms_comm_threads_create(t->w, t->rank, &world, &t->err);
    if (t->st == MS_OK) {
        ms_ctx ctx;
        t->st = ctx_init(&ctx, t->opts, world, &t->err);
        if (t->st == MS_OK) t->st = t->fn(&ctx, t->arg, &t->err);
        ctx_fini(&ctx);
    }
    rank_returned(t);
    return NULL;
}

/* Waits until `started` ranks returned (true), or until a rank has failed and none has
 * returned for abandon_after_ms (false: the ones still running are stuck). */
static bool wait_ranks(launch_watch *w, int started, int64_t abandon_after_ms) {
    bool all = true;
    pthread_mutex_lock(&w->mu);
    while (w->returned < started) {
        if (abandon_after_ms <= 0 || w->failed == 0) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        int64_t deadline = w->last_return_ns + abandon_after_ms * 1000000;
        if (ms_now_ns() >= deadline) {
            all = false;
            break;
        }
        struct timespec at = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
        pthread_cond_timedwait(&w->cv, &w->mu, &at);
    }
    pthread_mutex_unlock(&w->mu);
    return all;
}

/* The failure to report among the ranks that returned: the cause, not its echo. When one rank
 * fails, the others usually fail in a collective that rank abandoned (MS_ERR_COMM), so a rank
 * with another error is preferred. -1 when none failed. */
static int failed_rank(const rank_thread *ts, int n) {
    int cause = -1;
    for (int r = 0; r < n; r++)
        if (ts[r].returned && ts[r].st != MS_OK &&
            (cause < 0 || (ts[cause].st == MS_ERR_COMM && ts[r].st != MS_ERR_COMM)))
            cause = r;
    return cause;
}

/* Ends the process without the stuck ranks: dumps their flight recorders (the others dumped
 * theirs when their communicators failed), reports and exits 1. The stuck threads keep the
 * launch's memory to the end; _exit runs no exit handlers that could wait for them. */
static _Noreturn void abandon_ranks(rank_thread *ts, int n, const ms_launch_opts *opts) {
    launch_watch *w = ts[0].watch;
    int *stuck = xcalloc((size_t)n, sizeof *stuck);
    int n_stuck = 0;
    ms_error err = {0};
    pthread_mutex_lock(&w->mu);
    for (int r = 0; r < n; r++)
        if (!ts[r].returned) stuck[n_stuck++] = r;
    int cause = failed_rank(ts, n);
    err = ts[cause].err;
    ms_fail_wrap(&err, ts[cause].st, "rank %d", cause);
    pthread_mutex_unlock(&w->mu);
    for (int r = 0, i = 0; r < n; r++) /* those that returned are done: joining is immediate */
        if (i < n_stuck && stuck[i] == r)
            i++;
        else
            pthread_join(ts[r].tid, NULL);
    char reason[128];
    snprintf(reason, sizeof reason, "abandoned: still running %.1f s after rank %d failed",
             (double)opts->abandon_after_ms / 1000, cause);
    for (int i = 0; i < n_stuck; i++) ms_flight_dump(ms_flight_for_rank(stuck[i]), reason, NULL, 0);
    if (opts->on_abandon) opts->on_abandon(&err, stuck, n_stuck, opts->abandon_arg);
    /* a stuck rank may hold stdout's lock (blocked in a write): never wait for it */
    if (ftrylockfile(stdout) == 0) {
        fflush(stdout);
        funlockfile(stdout);
    }
    fflush(stderr);
    _exit(1);
}

static ms_status launch_threads(const ms_launch_opts *opts, ms_rank_fn fn, void *arg,
                                ms_error *err) {
    if (opts->nranks < 1)
        return ms_fail(err, MS_ERR_INVALID, "need at least one rank (got %d)", opts->nranks);
    ms_threads_world *w;
    MS_CHECK(ms_threads_world_create(opts->nranks, &w, err));
    launch_watch watch = {0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&watch.mu, NULL);
    pthread_cond_init(&watch.cv, &ca);
    pthread_condattr_destroy(&ca);
    rank_thread *ts = xcalloc((size_t)opts->nranks, sizeof *ts);
    int started = 0;
    ms_status st = MS_OK;
    for (int r = 0; r < opts->nranks; r++) {
        ts[r] =
            (rank_thread){.w = w, .rank = r, .opts = opts, .fn = fn, .arg = arg, .watch = &watch};
        if (pthread_create(&ts[r].tid, NULL, rank_thread_main, &ts[r]) != 0) {
            st = ms_fail(err, MS_ERR_INTERNAL, "cannot start the thread of rank %d", r);
            break;
        }
        started++;
    }
    /* If a thread failed to start, the started ranks time out in their first collective. */
    if (!wait_ranks(&watch, started, opts->abandon_after_ms)) abandon_ranks(ts, started, opts);
    for (int r = 0; r < started; r++) pthread_join(ts[r].tid, NULL);
    int cause = failed_rank(ts, started);
    if (st == MS_OK && cause >= 0) {
        if (err) *err = ts[cause].err;
        st = ms_fail_wrap(err, ts[cause].st, "rank %d", cause);
    }
    free(ts);
    pthread_cond_destroy(&watch.cv);
    pthread_mutex_destroy(&watch.mu);
    ms_threads_world_destroy(w);
    return st;
}

static ms_status launch_mpi(const ms_launch_opts *opts, ms_rank_fn fn, void *arg, ms_error *err) {
    ms_comm *world;
    MS_CHECK(ms_comm_mpi_create_world(&world, err));
    if (opts->nranks > 0 && ms_comm_size(world) != opts->nranks) {
        int have = ms_comm_size(world);
        ms_comm_destroy(world);
        return ms_fail(err, MS_ERR_INVALID,
                       "%d ranks were asked for but mpirun started %d; run mpirun -np %d",
                       opts->nranks, have, opts->nranks);
    }
    ms_ctx ctx;
    ms_status st = ctx_init(&ctx, opts, world, err);
    if (st == MS_OK) st = fn(&ctx, arg, err);
    int r = ctx.rank;
    ctx_fini(&ctx);
    if (st != MS_OK) st = ms_fail_wrap(err, st, "rank %d", r);
    return st;
}

ms_status ms_launch(const ms_launch_opts *opts, ms_rank_fn fn, void *arg, ms_error *err) {
    return opts->backend == MS_BACKEND_MPI ? launch_mpi(opts, fn, arg, err)
                                           : launch_threads(opts, fn, arg, err);
}

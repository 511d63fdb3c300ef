/* ctx.h - the rank context and the launcher that creates one per rank.
 *
 * Everything below the CLI takes an ms_ctx explicitly (no globals), so many ranks can
 * live in one process (threads backend) and tests can run several worlds.
 *
 * Ownership: the launcher creates each ctx, runs the rank function, then destroys it;
 * the ctx owns its world communicator, device and reshard plan cache.
 */
#ifndef MS_CTX_H
#define MS_CTX_H

#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/core/device.h"
#include "engine/core/status.h"
#include "engine/core/trace_sink.h"

typedef enum ms_backend_kind {
    MS_BACKEND_THREADS,
    MS_BACKEND_MPI,
    MS_BACKEND_COUNT
} ms_backend_kind;

const char *ms_backend_name(ms_backend_kind b);
/* "threads" or "mpi"; MS_ERR_INVALID naming the choices otherwise. */
ms_status ms_backend_parse(const char *text, ms_backend_kind *out, ms_error *err);

struct ms_plan_cache;
struct ms_comm_probe;

typedef struct ms_ctx {
    int rank; /* world rank */
    int world_size;
    ms_backend_kind backend;
    ms_comm *world;    /* owned */
    ms_device *device; /* owned */
    uint64_t seed;
    /* owned: reshard plans (dist/reshard.h), made by the rank's first mesh (ms_dmesh_create),
     * freed with plans_free; the runtime sits below dist and never looks inside */
    struct ms_plan_cache *plans;
    void (*plans_free)(struct ms_plan_cache *plans);
    ms_trace_state trace;              /* the sink (borrowed; recorder NULL: tracing off) */
    struct ms_comm_probe *world_probe; /* owned: the world communicator's probe */
    float *ws[4]; /* owned, from `device`: reshard workspace (dist/reshard_exec.c) */
    size_t ws_cap[4];
} ms_ctx;

/* Called, threads backend only, when rank threads are abandoned (see ms_launch_opts): err is
 * the failure ms_launch would have returned, stuck[0..n_stuck) the ranks still running. */
typedef void (*ms_abandon_fn)(const ms_error *err, const int *stuck, int n_stuck, void *arg);

typedef struct ms_launch_opts {
    ms_backend_kind backend;
    int nranks;            /* threads: how many; mpi: 0 or the expected world size */
    ms_device_kind device; /* each rank's device (CUDA: GPU rank mod count); 0 is the CPU */
    uint64_t seed;
    int64_t timeout_ms; /* communicator timeout; 0 = default */
    /* Threads: a rank thread that stays stuck (asleep, in a kernel, stopped) after the others
     * failed would keep the process alive until it wakes. Once a rank has failed and no rank
     * has returned for abandon_after_ms, the ranks still running are abandoned: their flight
     * recorders are dumped, on_abandon reports (it may be NULL) and the process ends with
     * _exit(1) without joining them. 0: wait for every thread however long. */
    int64_t abandon_after_ms;
    ms_abandon_fn on_abandon;
    void *abandon_arg;
} ms_launch_opts;

/* A rank's entry point. Return MS_OK or a failure with err filled. */
typedef ms_status (*ms_rank_fn)(ms_ctx *ctx, void *arg, ms_error *err);

/* Starts handing this rank's events to recorder through ops (both borrowed; NULL stops):
 * probes the world communicator; meshes bound afterwards probe their per-dim communicators.
 * The recorder's side calls it (profiler/record/hooks.h: ms_record_into). */
void ms_ctx_set_sink(ms_ctx *ctx, void *recorder, const ms_trace_sink_ops *ops);

/* Runs fn once per rank: on `nranks` threads (threads backend) or once in this process
 * (mpi backend; MPI must have been initialised with ms_mpi_init). Returns MS_OK if every
 * local rank succeeded, else the first failure with "rank R: " prepended. */
ms_status ms_launch(const ms_launch_opts *opts, ms_rank_fn fn, void *arg, ms_error *err);

#endif

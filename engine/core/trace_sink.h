/* trace_sink.h - the one interface through which the engine tells a recorder what runs.
 *
 * The engine builds events (engine/core/event.h) and hands them to its rank's sink: a
 * recorder and the functions that take events into it, installed by whoever records (the
 * profiler's recorder, profiler/record/hooks.h: ms_record_into). The engine never includes
 * profiler/. Every call here is one branch when the rank is not recording.
 *
 * Ownership: the state lives in the rank context (ms_ctx.trace); the recorder and the ops are
 * borrowed from the installer, which outlives the rank's use of them. Probes (one observer on
 * a communicator) belong to whoever attached them and are freed through the same ops.
 */
#ifndef MS_TRACE_SINK_H
#define MS_TRACE_SINK_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/core/device.h"
#include "engine/core/event.h"

typedef struct ms_comm_probe ms_comm_probe;
typedef struct ms_trace_state ms_trace_state;

/* What a recorder provides. */
typedef struct ms_trace_sink_ops {
    /* Takes one event (from the recorder's own rank thread). */
    void (*emit)(void *recorder, const ms_event *e);
    /* Observes every call on c (mesh_dim -1 outside meshes): its events go to ts's recorder,
     * tagged with ts->flow, while ts->recorder is set. NULL when it cannot. */
    ms_comm_probe *(*probe_attach)(const ms_trace_state *ts, ms_comm *c, int mesh_dim);
    void (*probe_free)(ms_comm_probe *p);
} ms_trace_sink_ops;

/* What a rank's engine code reads at every event. */
struct ms_trace_state {
    void *recorder;               /* NULL: not recording (or paused, train --trace-from) */
    const ms_trace_sink_ops *ops; /* set with the recorder; kept while paused */
    uint64_t flow;                /* id of the reshard running now, 0 outside reshards */
    /* Set while GPU activity is collected (CUPTI): the program brackets each operator's
     * launches with gpu_push(its correlation id) / gpu_pop(), so the activity links back to
     * the operator. NULL otherwise. */
    void (*gpu_push)(uint64_t corr);
    void (*gpu_pop)(void);
};

static inline bool ms_trace_on(const ms_trace_state *ts) {
    return ts->recorder && ts->ops;
}

/* Emits e when recording. */
void ms_trace_emit(const ms_trace_state *ts, const ms_event *e);

/* A probe on c when recording, else NULL; free it with ms_trace_probe_free after c. */
ms_comm_probe *ms_trace_probe(const ms_trace_state *ts, ms_comm *c, int mesh_dim);
void ms_trace_probe_free(const ms_trace_state *ts, ms_comm_probe *p);

/* A memory sample, an instant event: the device's counters (in use, peak) and, when split is not
 * NULL, what the training state holds of them (ms_ev_mem's params, grads, optim, acts). */
void ms_record_memory(const ms_trace_state *ts, const ms_device *dev, const ms_ev_mem *split);

/* A span [t0, now) of kind DATA, OPTIM or STEP. */
void ms_record_span(const ms_trace_state *ts, ms_ev_kind kind, int64_t t0);

/* A named optimizer span [t0, t1) (MS_EV_OPTIM; name: the parameter or the step's part, what:
 * "adamw (host)", "memcpy H2D", ...). on_host: the work ran on the rank's host optimizer thread
 * (offload), so the trace gives it its own lane; the rank thread records it for that thread once
 * it is done (a recorder has one writer). */
void ms_record_optim(const ms_trace_state *ts, const char *name, const char *what, int64_t t0,
                     int64_t t1, bool on_host);

/* A pipeline action's span [t0, now) (phase: F forward, B and W backward). */
void ms_record_pipe(const ms_trace_state *ts, const ms_ev_pipe *pipe, int64_t t0);

#endif

/* trace_sink.c - the engine's side of tracing: events built and handed to the sink. */
#include "engine/core/trace_sink.h"

#include <stdatomic.h>

void ms_trace_emit(const ms_trace_state *ts, const ms_event *e) {
    if (ms_trace_on(ts)) ts->ops->emit(ts->recorder, e);
}

ms_comm_probe *ms_trace_probe(const ms_trace_state *ts, ms_comm *c, int mesh_dim) {
    return ms_trace_on(ts) && c ? ts->ops->probe_attach(ts, c, mesh_dim) : NULL;
}

void ms_trace_probe_free(const ms_trace_state *ts, ms_comm_probe *p) {
    if (p && ts->ops) ts->ops->probe_free(p);
}

void ms_record_memory(const ms_trace_state *ts, const ms_device *dev, const ms_ev_mem *split) {
    if (!ms_trace_on(ts)) return;
    ms_event e = {.kind = MS_EV_MEM, .phase = MS_PHASE_OTHER};
    e.t0_ns = e.t1_ns = ms_now_ns();
    if (split) e.u.mem = *split;
    e.u.mem.in_use = atomic_load(&dev->in_use);
    e.u.mem.peak = atomic_load(&dev->peak);
    ms_trace_emit(ts, &e);
}

void ms_record_pipe(const ms_trace_state *ts, const ms_ev_pipe *pipe, int64_t t0) {
    if (!ms_trace_on(ts)) return;
    ms_event e = {.kind = MS_EV_PIPE,
                  .phase = pipe->action == MS_PIPE_F ? MS_PHASE_FORWARD : MS_PHASE_BACKWARD,
                  .t0_ns = t0,
                  .t1_ns = ms_now_ns(),
                  .u.pipe = *pipe};
    ms_trace_emit(ts, &e);
}

void ms_record_optim(const ms_trace_state *ts, const char *name, const char *what, int64_t t0,
                     int64_t t1, bool on_host) {
    if (!ms_trace_on(ts)) return;
    ms_event e = {.kind = MS_EV_OPTIM, .phase = MS_PHASE_OTHER, .t0_ns = t0, .t1_ns = t1};
    ms_ev_strcpy(e.u.op.name, sizeof e.u.op.name, NULL, name);
    ms_ev_strcpy(e.u.op.opname, sizeof e.u.op.opname, NULL, what);
    e.u.op.host_optim = on_host;
    ms_trace_emit(ts, &e);
}

void ms_record_span(const ms_trace_state *ts, ms_ev_kind kind, int64_t t0) {
    if (!ms_trace_on(ts)) return;
    ms_event e = {
        .kind = (uint8_t)kind, .phase = MS_PHASE_OTHER, .t0_ns = t0, .t1_ns = ms_now_ns()};
    ms_trace_emit(ts, &e);
}

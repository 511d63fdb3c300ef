/* hooks.h - where the engine meets the recorder: communicator probes and small helpers the
 * executor and the training loop call. All hooks are no-ops (one branch) when the rank's
 * trace state has no recorder.
 *
 * A probe is the observer installed on one communicator: it turns every call into an
 * MS_EV_COLL event with the communicator's group (registered once, at probe time), its mesh
 * dim, and the id of the reshard running at the time (ms_trace_state.flow), so traces can link
 * each reshard to its collectives. Point-to-point batches become one event per send, with a
 * two-member group {sender, receiver}.
 */
#ifndef MS_HOOKS_H
#define MS_HOOKS_H

#include "engine/comm/comm.h"
#include "engine/core/device.h"
#include "profiler/record/recorder.h"

/* What a rank's probes read at every call. It lives in the rank context (ms_ctx.trace);
 * probes borrow it. recorder NULL: not recording (or paused, train --trace-from). */
typedef struct ms_trace_state {
    ms_recorder *recorder;
    uint64_t flow; /* id of the reshard running now, 0 outside reshards */
    /* Set while GPU activity is collected (CUPTI): the program brackets each operator's
     * launches with gpu_push(its correlation id) / gpu_pop(), so the activity links back to
     * the operator. NULL otherwise. */
    void (*gpu_push)(uint64_t corr);
    void (*gpu_pop)(void);
} ms_trace_state;

typedef struct ms_comm_probe ms_comm_probe;

/* Installs a probe on c (mesh_dim -1 for non-mesh communicators). Returns NULL (and does
 * nothing) when ts has no recorder. ts must outlive the probe. Free with ms_comm_probe_free
 * after the communicator. */
ms_comm_probe *ms_comm_probe_attach(ms_trace_state *ts, ms_comm *c, int mesh_dim);
void ms_comm_probe_free(ms_comm_probe *p);

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

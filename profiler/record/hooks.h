/* hooks.h - the recorder behind the engine's sink: the sink's functions, and communicator
 * probes. The engine only knows engine/core/trace_sink.h; the job installs this sink on each
 * rank (ms_record_into).
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
#include "engine/core/trace_sink.h"
#include "engine/runtime/ctx.h"
#include "profiler/record/recorder.h"

/* The recorder's side of the engine's sink (engine/core/trace_sink.h). */
extern const ms_trace_sink_ops ms_recorder_sink;

/* Starts recording ctx's rank into rec (borrowed; NULL stops): installs the sink, probes the
 * world communicator; meshes bound afterwards probe their per-dim communicators. */
void ms_record_into(ms_ctx *ctx, ms_recorder *rec);

/* Installs a probe on c (mesh_dim -1 for non-mesh communicators). Returns NULL (and does
 * nothing) when ts has no recorder. ts must outlive the probe. Free with ms_comm_probe_free
 * after the communicator. */
ms_comm_probe *ms_comm_probe_attach(const ms_trace_state *ts, ms_comm *c, int mesh_dim);
void ms_comm_probe_free(ms_comm_probe *p);

#endif

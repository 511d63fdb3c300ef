/* hooks.h - where the engine meets the recorder: communicator probes and small helpers the
 * executor and the training loop call. All hooks are no-ops (one branch) when the rank
 * context has no recorder.
 *
 * A probe is the observer installed on one communicator: it turns every call into an
 * MS_EV_COLL event with the communicator's group (registered once, at probe time), its mesh
 * dim, and the id of the reshard running at the time (ctx->trace_flow), so traces can link
 * each reshard to its collectives. Point-to-point batches become one event per send, with a
 * two-member group {sender, receiver}.
 */
#ifndef MS_HOOKS_H
#define MS_HOOKS_H

#include "comm/comm.h"
#include "profiler/recorder.h"

struct ms_ctx;

typedef struct ms_comm_probe ms_comm_probe;

/* Installs a probe on c (mesh_dim -1 for non-mesh communicators). Returns NULL (and does
 * nothing) when ctx has no recorder. Free with ms_comm_probe_free after the communicator. */
ms_comm_probe *ms_comm_probe_attach(struct ms_ctx *ctx, ms_comm *c, int mesh_dim);
void ms_comm_probe_free(ms_comm_probe *p);

/* Memory in use and peak of the rank's device, as an instant event. */
void ms_record_memory(struct ms_ctx *ctx);

/* A span [t0, now) of kind DATA, OPTIM or STEP. */
void ms_record_span(struct ms_ctx *ctx, ms_ev_kind kind, int64_t t0);

#endif

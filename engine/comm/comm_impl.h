/* comm_impl.h - what a communicator backend implements (private to engine/comm).
 *
 * A backend provides one ms_comm_backend_ops table plus a context pointer per group. The
 * shared layer (comm.c) has already validated arguments and computed the call's deadline
 * when a slot is called; a slot only moves data. On timeout a slot returns MS_ERR_TIMEOUT
 * and lists the members that had not arrived in call->missing; the shared layer formats
 * the error. Slots may assume count/counts fit the buffers.
 *
 * Element types: every slot moves call->dtype (counts are in elements of that type, so a slot
 * multiplies by ms_comm_dtype_size where it needs bytes). The reductions get only MS_COMM_F32
 * or MS_COMM_BF16 (the shared layer refuses bytes); a bf16 reduction must give the result of
 * ms_reduce_bf16 (fp32 in rank order, rounded once), bit for bit, on every member.
 */
#ifndef MS_COMM_IMPL_H
#define MS_COMM_IMPL_H

#include "engine/comm/comm.h"

#define MS_COMM_MAX_RANKS 1024

/* Per-call information handed to a backend slot. */
typedef struct ms_comm_call {
    ms_coll_kind kind;
    ms_comm_dtype dtype; /* element type of the buffers (and of p2p counts) */
    int64_t seq;         /* sequence number of this call on this communicator */
    int64_t deadline_ns; /* absolute, ms_now_ns() clock */
    int64_t timeout_ns;  /* the communicator's timeout, which set the deadline */
    /* Filled by the backend on MS_ERR_TIMEOUT: members (communicator ranks) missing. */
    int n_missing;
    int missing[64];
    /* Filled by the backend on MS_ERR_TIMEOUT when it knows more: e.g. a host that does not
     * answer at all. Appended to the error. */
    char note[192];
    const char *algo;         /* set by the backend: the algorithm it used */
    const ms_p2p_op *p2p_ops; /* MS_COLL_P2P: reported to the observer */
    int n_p2p;
    uint64_t flight; /* the call's ticket in the rank's flight recorder (flight.h) */
    /* A direct call (device memory on a backend with a stream of its own, comm.h): the point
     * in the caller's work on ready_dev up to which the call's buffers are final, recorded on
     * the caller's thread when the call was issued. The backend makes its stream wait for it
     * before touching them (ms_comm_call_wait_ready). NULL: nothing to wait for (not direct,
     * or a device without marks, synced at issue instead). Owned by the shared layer. */
    ms_device *ready_dev;
    const ms_device_mark *ready;
} ms_comm_call;

/* Makes the backend's `stream` wait for call->ready; the host does not wait. */
static inline ms_status ms_comm_call_wait_ready(const ms_comm_call *call, void *stream,
                                                ms_error *err) {
    return ms_device_mark_wait(call->ready_dev, call->ready, stream, err);
}

typedef struct ms_comm_backend_ops {
    const char *name;
    ms_status (*all_reduce)(void *ctx, const void *send, void *recv, size_t count, ms_reduce_op op,
                            ms_comm_call *call, ms_error *err);
    ms_status (*reduce_scatter)(void *ctx, const void *send, void *recv, const size_t *recv_counts,
                                ms_reduce_op op, ms_comm_call *call, ms_error *err);
    ms_status (*all_gather)(void *ctx, const void *send, void *recv, const size_t *counts,
                            ms_comm_call *call, ms_error *err);
    ms_status (*all_to_all)(void *ctx, const void *send, const size_t *send_counts,
                            const size_t *send_displs, void *recv, const size_t *recv_counts,
                            const size_t *recv_displs, ms_comm_call *call, ms_error *err);
    ms_status (*broadcast)(void *ctx, void *buf, size_t count, int root, ms_comm_call *call,
                           ms_error *err);
    ms_status (*p2p)(void *ctx, const ms_p2p_op *ops, int nops, ms_comm_call *call, ms_error *err);
    /* Optional, non-blocking point-to-point (ms_ip2p): p2p_post starts the batch (sends
     * posted, receives matched as they can) and returns at once with *req, its handle; ops
     * stay valid until the handle is done. p2p_poll advances it: *done when every operation
     * completed (the handle is then freed). With wait it returns only once done or past
     * call->deadline_ns; then MS_ERR_TIMEOUT with the peers of the unfinished operations in
     * call->missing, those operations withdrawn (no peer touches the buffers afterwards) and
     * the handle freed, as after any failure. Without these slots ms_ip2p runs p2p at issue. */
    ms_status (*p2p_post)(void *ctx, const ms_p2p_op *ops, int nops, ms_comm_call *call, void **req,
                          ms_error *err);
    ms_status (*p2p_poll)(void *ctx, void *req, bool wait, bool *done, ms_comm_call *call,
                          ms_error *err);
    ms_status (*barrier)(void *ctx, ms_comm_call *call, ms_error *err);
    /* Creates the backend context of the new group. For color < 0 sets *out_ctx = NULL.
     * Otherwise fills *out_size, *out_rank, and out_members[0..size): the *parent* rank of
     * each member in new-rank order (ordered by key, then parent rank). */
    ms_status (*split)(void *ctx, int color, int key, void **out_ctx, int *out_size, int *out_rank,
                       int *out_members, ms_comm_call *call, ms_error *err);
    void (*destroy)(void *ctx);
    /* Whether the slots may be called from a communicator's progress thread while the
     * caller's thread runs other communicators' calls (non-blocking calls, comm.h). NULL or
     * false: non-blocking calls execute at issue. */
    bool (*async_ok)(void *ctx);
    /* Optional: advances calls in flight from the caller's thread (ms_comm_progress). */
    void (*progress)(void *ctx);
} ms_comm_backend_ops;

/* Whether the calling thread is a communicator's progress thread (non-blocking calls): its
 * waits should sleep rather than spin, since the rank's compute runs beside it. */
bool ms_comm_on_progress_thread(void);

/* Wraps a backend context into a communicator (used by backend constructors).
 * world_ranks has `size` entries and is copied. Takes ownership of ctx. */
ms_comm *ms_comm_wrap(const ms_comm_backend_ops *ops, void *ctx, int rank, int size,
                      const int *world_ranks, const char *name);

/* Applies op to n floats: acc = acc (op) x. AVG accumulates as a sum; the caller divides
 * once by the group size via ms_reduce_finish. Shared by all CPU backends. */
void ms_reduce_accumulate(float *acc, const float *x, size_t n, ms_reduce_op op);
void ms_reduce_finish(float *acc, size_t n, ms_reduce_op op, int group_size);

/* The bf16 reduction every CPU backend gives: dst[i] = bf16(reduce over p = 0..n-1 of
 * fp32(src[p][i])), each element widened, reduced in fp32 in that order (AVG: the sum times
 * 1/n), rounded once to nearest even. dst may be one of the src arrays. */
void ms_reduce_bf16(uint16_t *dst, const uint16_t *const *src, int n, size_t count,
                    ms_reduce_op op);

/* The members of a split's group `color`, in the order every backend agrees on (key, then
 * parent rank, as MPI_Comm_split and ncclCommSplit order them). color_key holds each parent
 * rank's pair: color_key[2p] = color, color_key[2p + 1] = key, p = 0..n-1. Writes the parent
 * ranks of the members to members[] and returns their count; *pos = the position of parent
 * rank `me` among them (-1 if it is not a member). */
int ms_split_order(const int *color_key, int n, int color, int me, int *members, int *pos);

/* What a rank learnt about a peer that did not finish a call with it, after a timeout. */
typedef enum ms_peer_state {
    MS_PEER_SILENT,   /* no sign of life: stalled, or gone */
    MS_PEER_GAVE_UP,  /* it timed out or failed itself and left: a victim */
    MS_PEER_ANSWERED, /* alive, waiting for something else (e.g. behind a stalled rank) */
} ms_peer_state;

/* The ranks a timeout names as missing, from suspects[0..n) (communicator ranks that did not
 * finish the call with this rank) and what was learnt about each. When some are silent, only
 * those are named: the others are blocked behind them, or gave up because of them. Otherwise
 * the ones that answered are named (nobody stalled; they are busy elsewhere, e.g. in another
 * collective), unless all_arrived (every member entered and only the transfer stalled), when
 * nobody can be named; ranks that gave up are never named. Writes the named ranks to out (may
 * alias suspects) and returns their count. */
int ms_comm_blame(const int *suspects, const ms_peer_state *state, int n, bool all_arrived,
                  int *out);

#endif

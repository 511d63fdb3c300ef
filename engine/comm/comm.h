/* comm.h - the communicator interface: collectives over one group of ranks.
 *
 * A communicator (ms_comm) is one group, e.g. the ranks along one mesh dim. Every backend
 * (threads, MPI, NCCL) implements the raw operations in comm_impl.h; the thin shared
 * layer in comm.c validates arguments, assigns sequence numbers, applies the timeout,
 * turns backend failures into errors that name the op, the group, the sequence number and
 * the ranks that did not arrive, reports every call to an observer (the profiler) with
 * its bytes and peers, and records it in the rank's flight recorder (flight.h), dumped when a
 * call fails so that `meshscope doctor` can say what happened. A new backend gets all of that
 * for free.
 *
 * All calls are collective over the communicator unless noted and must be called by every
 * member in the same order, with the same element type. Every call that carries data comes
 * typed (the `_dt` suffix: an ms_comm_dtype and void buffers, counts in elements of that type)
 * and as a float32 shorthand (ms_all_reduce is ms_all_reduce_dt with MS_COMM_F32); broadcast
 * and point-to-point also take raw bytes (ms_broadcast_bytes, ms_p2p_bytes). Reductions refuse
 * MS_COMM_BYTES. bf16 reductions widen every element to fp32, reduce in fp32 in rank order
 * (member 0 first) and round once to bf16 (nearest even), so that every member, on the threads
 * and MPI backends alike, gets bit-identical results; NCCL reduces bf16 its own way (ring
 * steps in bf16), close to but not bit-equal with the CPU backends. A call never
 * hangs: it returns MS_ERR_TIMEOUT after the communicator's timeout. After a timeout the
 * communicator is broken and every later call fails fast with MS_ERR_COMM.
 *
 * Blocking calls return when done. all_reduce, reduce_scatter and all_gather also come
 * non-blocking (ms_iall_reduce, ...: a request to ms_comm_wait or ms_comm_test for), executed
 * in issue order by a progress thread of the communicator while the caller computes; see
 * "non-blocking collectives" below. The gradient buckets (engine/graph/grad_buckets.h) use
 * them to reduce gradients during backward. Point-to-point batches come non-blocking too
 * (ms_ip2p): posted at once, no progress thread; the pipeline's transfers use them.
 *
 * Buffers: `send` and `recv` may be the same pointer (in place) for all_reduce only. They are
 * CUDA device memory on the NCCL backend. The threads and MPI backends move data with the CPU:
 * they take host memory, and memory of the communicator's device (ms_comm_set_device) that
 * the host cannot address, which the shared layer stages through host buffers of the
 * communicator (copied in before the call, back after it completes; non-blocking calls: in at
 * issue, back when ms_comm_wait or ms_comm_test completes them), so that ranks on a device
 * without a device transport (a GPU shared by several ranks, the fenced device) run the same
 * calls on device memory. Host buffers pass straight through.
 * Ownership: the caller owns all buffers; a communicator is freed with ms_comm_destroy,
 * and communicators made by ms_comm_split must be destroyed before their parent.
 */
#ifndef MS_COMM_H
#define MS_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/device.h"
#include "engine/core/status.h"

typedef enum ms_reduce_op {
    MS_REDUCE_SUM,
    MS_REDUCE_AVG,
    MS_REDUCE_MAX,
    MS_REDUCE_MIN,
    MS_REDUCE_COUNT
} ms_reduce_op;

const char *ms_reduce_op_name(ms_reduce_op op); /* "sum", "avg", "max", "min" */

typedef enum ms_coll_kind {
    MS_COLL_ALL_REDUCE,
    MS_COLL_REDUCE_SCATTER,
    MS_COLL_ALL_GATHER,
    MS_COLL_ALL_TO_ALL,
    MS_COLL_BROADCAST,
    MS_COLL_P2P, /* a batch of sends and receives (ms_p2p, ms_send, ms_recv) */
    MS_COLL_BARRIER,
    MS_COLL_SPLIT,
    MS_COLL_KIND_COUNT
} ms_coll_kind;

const char *ms_coll_name(ms_coll_kind kind); /* "all_reduce", ... */

/* nccl-tests bus-bandwidth factor for n ranks (docs/formats.md section 1). */
double ms_coll_busbw_factor(ms_coll_kind kind, int n);

/* What a call's buffers hold; counts are in elements of this type. Bytes are copied
 * exactly and never interpreted: a struct sent as bytes arrives with the sender's layout
 * and byte order (every rank runs the same build on the same kind of machine). */
typedef enum ms_comm_dtype {
    MS_COMM_F32,   /* float32 */
    MS_COMM_BYTES, /* uint8: messages, packed records; never reduced */
    MS_COMM_BF16,  /* bfloat16 as uint16 bits (engine/core/tensor.h); reduced in fp32 */
    MS_COMM_DTYPE_COUNT
} ms_comm_dtype;

const char *ms_comm_dtype_name(ms_comm_dtype dt); /* "f32", "bytes", "bf16" */
size_t ms_comm_dtype_size(ms_comm_dtype dt);      /* 4, 1, 2 */

typedef struct ms_comm ms_comm;
/* A non-blocking call in flight (ms_iall_reduce, ms_ip2p, ...): see below. */
typedef struct ms_comm_request ms_comm_request;

/* One point-to-point operation of a batch. */
typedef enum ms_p2p_kind { MS_P2P_SEND, MS_P2P_RECV } ms_p2p_kind;
typedef struct ms_p2p_op {
    ms_p2p_kind kind;
    int peer;     /* rank within the communicator */
    void *buf;    /* read for SEND, written for RECV */
    size_t count; /* elements of the batch's type: floats for ms_p2p, bytes for ms_p2p_bytes */
    int tag;      /* 0..32767; a SEND matches the RECV with the same (peer, tag) */
} ms_p2p_op;

/* What the observer receives after every call, successful or not. */
typedef struct ms_comm_event {
    ms_coll_kind kind;
    const ms_comm *comm;
    int64_t seq;        /* per-communicator call number, from 1 */
    int64_t t_start_ns; /* monotonic clock */
    int64_t t_end_ns;
    int64_t t_issue_ns;  /* non-blocking calls: when issued (<= t_start_ns) */
    bool async;          /* issued by a non-blocking call */
    size_t bytes;        /* nccl-tests convention: see ms_comm_event_bytes in comm.c */
    ms_comm_dtype dtype; /* element type: p2p[i].count * ms_comm_dtype_size(dtype) bytes */
    ms_reduce_op op;     /* for reductions */
    int root;            /* broadcast root, or -1 */
    const char *algo;    /* the backend's algorithm name, e.g. "shm-direct", "mpi" */
    ms_status status;
    const ms_p2p_op *p2p; /* MS_COLL_P2P: the batch (peers and counts), else NULL */
    int n_p2p;
} ms_comm_event;

typedef void (*ms_comm_observer_fn)(void *user, const ms_comm_event *ev);
/* Non-blocking calls (ms_iall_reduce, ...) report t_issue_ns (when the caller issued it) as
 * well: t_start_ns is when the communicator began to execute it, t_end_ns when it completed,
 * so the span is the collective's real span, concurrent with whatever the caller ran
 * meanwhile. For blocking calls t_issue_ns == t_start_ns. The observer of a non-blocking call
 * runs on the thread that waits for it (ms_comm_wait or a completing ms_comm_test), never on
 * the progress thread, so an observer may keep single-threaded state per rank (the
 * recorder's ring). */

/* --- identity and settings (local, not collective) ---------------------------------- */

int ms_comm_rank(const ms_comm *c);
int ms_comm_size(const ms_comm *c);
/* The world rank of member r. */
int ms_comm_world_rank(const ms_comm *c, int r);
const char *ms_comm_name(const ms_comm *c);
const char *ms_comm_backend(const ms_comm *c);
int64_t ms_comm_seq(const ms_comm *c);
bool ms_comm_is_broken(const ms_comm *c);

#define MS_COMM_DEFAULT_TIMEOUT_MS 60000
void ms_comm_set_timeout_ms(ms_comm *c, int64_t ms);
int64_t ms_comm_timeout_ms(const ms_comm *c);
void ms_comm_set_observer(ms_comm *c, ms_comm_observer_fn fn, void *user);
/* The rank's device, whose memory the threads and MPI backends stage through the host (see
 * "Buffers" above); borrowed, must outlive c. NULL (the default): nothing is staged. Children
 * of ms_comm_split take their parent's. Not for NCCL communicators, which take device memory
 * directly. */
void ms_comm_set_device(ms_comm *c, ms_device *dev);
ms_device *ms_comm_device(const ms_comm *c);

/* --- collectives ---------------------------------------------------------------------- */

ms_status ms_all_reduce(ms_comm *c, const float *send, float *recv, size_t count, ms_reduce_op op,
                        ms_error *err);
ms_status ms_all_reduce_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv, size_t count,
                           ms_reduce_op op, ms_error *err);

/* send holds sum(recv_counts) elements in rank order; member r receives the reduction of
 * block r (recv_counts[r] elements) into recv. */
ms_status ms_reduce_scatter(ms_comm *c, const float *send, float *recv, const size_t *recv_counts,
                            ms_reduce_op op, ms_error *err);
ms_status ms_reduce_scatter_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                               const size_t *recv_counts, ms_reduce_op op, ms_error *err);

/* Member r contributes counts[r] elements (its `send`); recv receives all blocks in rank
 * order (sum(counts) elements). Counts may differ and may be zero. */
ms_status ms_all_gather(ms_comm *c, const float *send, float *recv, const size_t *counts,
                        ms_error *err);
ms_status ms_all_gather_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                           const size_t *counts, ms_error *err);

/* Member r sends send_counts[p] elements from send + send_displs[p] to each member p and
 * receives recv_counts[p] elements from p at recv + recv_displs[p]. */
ms_status ms_all_to_all(ms_comm *c, const float *send, const size_t *send_counts,
                        const size_t *send_displs, float *recv, const size_t *recv_counts,
                        const size_t *recv_displs, ms_error *err);
ms_status ms_all_to_all_dt(ms_comm *c, ms_comm_dtype dt, const void *send,
                           const size_t *send_counts, const size_t *send_displs, void *recv,
                           const size_t *recv_counts, const size_t *recv_displs, ms_error *err);

ms_status ms_broadcast(ms_comm *c, float *buf, size_t count, int root, ms_error *err);
ms_status ms_broadcast_dt(ms_comm *c, ms_comm_dtype dt, void *buf, size_t count, int root,
                          ms_error *err);
/* The same with nbytes raw bytes (any length, including 0 and odd ones). */
ms_status ms_broadcast_bytes(ms_comm *c, void *buf, size_t nbytes, int root, ms_error *err);

/* A batch of point-to-point operations that complete together (like an NCCL group): any
 * pattern of sends and receives among members is deadlock-free within one batch. Only
 * the members named as peers need to take part; it is not collective over the group.
 * A receive must name the count its matching send sends. */
ms_status ms_p2p(ms_comm *c, const ms_p2p_op *ops, int nops, ms_error *err);
ms_status ms_send(ms_comm *c, const float *buf, size_t count, int peer, int tag, ms_error *err);
ms_status ms_recv(ms_comm *c, float *buf, size_t count, int peer, int tag, ms_error *err);
/* The same for every op's buffer holding elements of dt (a send matches only a receive of
 * the same type on the threads backend). */
ms_status ms_p2p_dt(ms_comm *c, ms_comm_dtype dt, const ms_p2p_op *ops, int nops, ms_error *err);
ms_status ms_send_dt(ms_comm *c, ms_comm_dtype dt, const void *buf, size_t count, int peer, int tag,
                     ms_error *err);
ms_status ms_recv_dt(ms_comm *c, ms_comm_dtype dt, void *buf, size_t count, int peer, int tag,
                     ms_error *err);
/* The same with raw bytes: every op's count is in bytes. A byte send matches only a byte
 * receive (the threads backend refuses a mix; MPI and NCCL cannot tell). */
ms_status ms_p2p_bytes(ms_comm *c, const ms_p2p_op *ops, int nops, ms_error *err);

/* Non-blocking point-to-point: ms_ip2p checks and posts a batch as ms_p2p would and returns
 * at once with a request for ms_comm_wait or ms_comm_test (NULL on failure, err set). Sends
 * are posted, so a peer's matching receive can complete while this rank computes, and the
 * batch's own operations never wait on each other. The request completes when every
 * operation did: a receive when its data is in buf, a send when the receiver has its data.
 * Until then the caller must not touch any op's buffer (ops itself is copied). Where data
 * moves: on the threads backend the receiver copies from the sender's buffer when it waits
 * for or tests its receive; on MPI (MPI_Issend / MPI_Irecv) MPI moves it within any call that
 * makes progress. Requests are not ordered with the communicator's other calls (a batch is
 * not collective, so nobody must agree on its place), need no progress thread, and must all
 * complete before the communicator is destroyed. A request that has not completed within the
 * communicator's timeout of its posting fails as ms_p2p does (MS_ERR_TIMEOUT naming the
 * peers of the unfinished operations, which are withdrawn). The NCCL backend has none:
 * MS_ERR_UNSUPPORTED. */
ms_comm_request *ms_ip2p(ms_comm *c, const ms_p2p_op *ops, int nops, ms_error *err);
ms_comm_request *ms_ip2p_dt(ms_comm *c, ms_comm_dtype dt, const ms_p2p_op *ops, int nops,
                            ms_error *err);
ms_status ms_send_bytes(ms_comm *c, const void *buf, size_t nbytes, int peer, int tag,
                        ms_error *err);
ms_status ms_recv_bytes(ms_comm *c, void *buf, size_t nbytes, int peer, int tag, ms_error *err);

/* --- non-blocking collectives ------------------------------------------------------------
 *
 * ms_iall_reduce, ms_ireduce_scatter and ms_iall_gather take the arguments of their blocking
 * counterparts, validate them at once (a bad argument fails the call and returns NULL; no
 * request, no sequence number), assign the call's sequence number, and return a request
 * while the collective runs. The caller must not touch recv (nor send) until the request
 * completes, and must complete every request with ms_comm_wait or a ms_comm_test that says
 * done (either frees it) before destroying the communicator. Counts arrays are copied.
 *
 * Progress: each communicator gets one progress thread of its own, started on its first
 * non-blocking call, that executes the communicator's queued collectives in issue order with
 * the backend's blocking slot. Per communicator, not per rank: the order the members must
 * agree on is per communicator, so one queue each keeps it without any cross-communicator
 * ordering (collectives queued on the dp and tp communicators of one rank cannot block each
 * other, which a single per-rank queue would allow: rank 0 queues dp then tp, rank 1 tp then
 * dp). A thread per communicator costs one sleeping thread, only for communicators that
 * overlap. Under MPI the progress thread is also what makes MPI progress while the caller
 * computes (OpenMPI's shared-memory transport advances only inside MPI calls), which needs
 * MPI_THREAD_MULTIPLE; it polls gently, so the caller helps: ms_comm_progress between its
 * kernels, and ms_comm_wait drives progress itself while it waits. With less than MULTIPLE
 * the call runs to completion before it returns its request (still correct, no overlap). On
 * NCCL (and any direct path) the caller's compute is ordered by a device mark recorded at
 * issue on the caller's thread, which the backend's stream waits for: the collective reads
 * what was queued before it, while kernels queued after it run beside it.
 *
 * A blocking call on a communicator first waits until every non-blocking call issued before
 * it on that communicator has executed (not been waited for), so blocking and non-blocking
 * calls may be mixed in any order that every member agrees on.
 *
 * Deadlines and errors are the blocking calls': a queued collective's timeout starts when it
 * begins to execute; a timeout names the missing ranks and breaks the communicator, and every
 * call queued behind it then fails at once with MS_ERR_COMM. The error is returned by the
 * request's ms_comm_wait. */
ms_comm_request *ms_iall_reduce(ms_comm *c, const float *send, float *recv, size_t count,
                                ms_reduce_op op, ms_error *err);
ms_comm_request *ms_ireduce_scatter(ms_comm *c, const float *send, float *recv,
                                    const size_t *recv_counts, ms_reduce_op op, ms_error *err);
ms_comm_request *ms_iall_gather(ms_comm *c, const float *send, float *recv, const size_t *counts,
                                ms_error *err);
ms_comm_request *ms_iall_reduce_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                                   size_t count, ms_reduce_op op, ms_error *err);
ms_comm_request *ms_ireduce_scatter_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                                       const size_t *recv_counts, ms_reduce_op op, ms_error *err);
ms_comm_request *ms_iall_gather_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                                   const size_t *counts, ms_error *err);
/* Waits for r, reports it to the communicator's observer, frees it and returns its status
 * (the collective's error in err). NULL: MS_OK. */
ms_status ms_comm_wait(ms_comm_request *r, ms_error *err);
/* Sets *done. When done, it is ms_comm_wait (r is freed, its status returned); otherwise
 * returns MS_OK and r stays valid. */
ms_status ms_comm_test(ms_comm_request *r, bool *done, ms_error *err);
/* Non-blocking calls of c issued and not yet executed (queued or running). */
int ms_comm_in_flight(ms_comm *c);
/* Lets the backend advance c's calls in flight from the caller's thread, between its kernels:
 * OpenMPI's shared-memory transport moves data only inside MPI calls, and a progress thread
 * that polls gently (to leave the core to the kernels) is not enough on its own. Cheap, never
 * blocks; nothing to do on the other backends or with nothing in flight. */
void ms_comm_progress(ms_comm *c);

/* A variable-length message from root to every member: two byte broadcasts, its length
 * first (a 16-byte header: the length and root's cap, uint64 each), then the payload.
 * Collective; host memory only (not for NCCL communicators).
 *   root:   sends buf[0..*len); *len is not changed.
 *   others: receive it into buf[0..cap) and set *len to its length.
 * A message longer than cap is refused, never truncated: when root's *len exceeds root's
 * cap, every member returns MS_ERR_INVALID and no payload moves; when it fits root's cap but
 * not a member's (members passed different caps), that member still takes part, discards
 * the payload, leaves buf untouched and returns MS_ERR_INVALID, while the others succeed, so
 * the communicator stays in step. On any failure *len is 0 on non-root members. Zero-length
 * messages are fine (buf may then be NULL). */
ms_status ms_comm_bcast_msg(ms_comm *c, int root, void *buf, size_t *len, size_t cap,
                            ms_error *err);

ms_status ms_barrier(ms_comm *c, ms_error *err);

/* Members with the same color form a new communicator, ordered by (key, parent rank).
 * color < 0 means "not a member": *out is set to NULL. Collective over the parent. */
ms_status ms_comm_split(ms_comm *parent, int color, int key, const char *name, ms_comm **out,
                        ms_error *err);

void ms_comm_destroy(ms_comm *c);

/* --- a direct path for device memory --------------------------------------------------- */

/* Lets c move its device's memory (ms_comm_set_device) through `direct`: a communicator with
 * the same members in the same order whose backend reads and writes that memory itself
 * (NCCL). A collective whose buffers are all memory of c's device then runs on direct's
 * backend with nothing staged through the host; collectives on host buffers (or a mix), and
 * point-to-point, stay on c's own backend. Sequence numbers, the flight recorder, the
 * observer, the timeout and the failure handling stay c's. Every member must adopt alike and
 * pass device memory alike (a rank with no data in a call goes the host way). Takes ownership
 * of direct (destroyed with c, also on failure: a mismatched size or rank, or a second one). */
ms_status ms_comm_adopt_direct(ms_comm *c, ms_comm *direct, ms_error *err);
/* The direct path's backend name ("nccl"), or NULL; and how many calls took it. */
const char *ms_comm_direct_name(const ms_comm *c);
int64_t ms_comm_direct_calls(const ms_comm *c);

/* --- the NCCL backend ------------------------------------------------------------------- */

/* A communicator over NCCL with the same members, in the same order, as `bootstrap` (any
 * host-memory communicator: the threads world, the MPI world, a split of one). Collective over
 * `bootstrap`: rank 0 creates the NCCL unique id and broadcasts it, and every member binds
 * CUDA device `device` and joins. Every buffer later passed to the new communicator must be
 * device memory of that device (e.g. from a device made by ms_device_cuda_create). It runs
 * its operations on a CUDA stream of its own and returns once they have completed, under the
 * same deadline as every other backend. The new communicator is named
 * "nccl:<bootstrap name>" and takes the bootstrap's timeout.
 *
 * Failures, agreed on by all members (nobody is left waiting for a rank that gave up):
 * MS_ERR_UNSUPPORTED when this build has no NCCL, or when a member has no CUDA device (the
 * message says so; falling back to the threads or MPI backend is the caller's choice);
 * MS_ERR_INVALID when `device` does not exist; MS_ERR_COMM or MS_ERR_TIMEOUT when NCCL
 * fails to start. Ownership: on success *out belongs to the caller (ms_comm_destroy); it
 * does not depend on `bootstrap`, which may be destroyed first. On failure *out is NULL. */
ms_status ms_comm_nccl_create(ms_comm *bootstrap, int device, ms_comm **out, ms_error *err);

/* Monotonic nanoseconds (CLOCK_MONOTONIC), the clock of every event. */
int64_t ms_now_ns(void);

#endif

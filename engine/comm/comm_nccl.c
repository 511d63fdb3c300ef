/* comm_nccl.c - the NCCL communicator backend (built when CUDA and NCCL are found).
 *
 * One NCCL communicator and one CUDA stream per group, both owned by the context. Buffers
 * are CUDA device memory of the communicator's device. Every slot enqueues its work on that
 * stream and then polls until it has completed or the call's deadline has passed:
 *
 *   - communicators are created non-blocking (ncclConfig_t.blocking = 0), so no NCCL call
 *     blocks the host: initialisation, split and the connections NCCL sets up lazily on a
 *     first collective return ncclInProgress and are polled with ncclCommGetAsyncError;
 *   - once NCCL reports the work enqueued, cudaStreamQuery says when the GPU has finished;
 *   - past the deadline the communicator is aborted (ncclCommAbort stops its kernels) and
 *     the slot returns MS_ERR_TIMEOUT; the shared layer formats the message and marks the
 *     communicator broken. NCCL cannot tell which rank is missing, so only a send/recv
 *     batch with a single peer names one;
 *   - NCCL and CUDA failures become MS_ERR_COMM naming the NCCL call, with
 *     ncclGetErrorString's text and NCCL's last error message; the communicator is aborted,
 *     since NCCL leaves it unusable after an asynchronous error.
 *
 * Streams: on a communicator's direct path (ms_comm_adopt_direct) the buffers are written by
 * the rank's compute stream (core/device_cuda.c). The shared layer records a mark (an event on
 * that stream) on the caller's thread when the call is issued, and enter() makes this stream
 * wait for it (cudaStreamWaitEvent): NCCL reads what the kernels before the call wrote, and
 * nothing waits for the kernels queued after it. The other way, compute after a collective,
 * keeps the host's completion: a call, or the wait for a non-blocking one, returns once this
 * stream is done (the deadline needs the host to watch it anyway), and only then does the
 * caller queue the kernels that read the result. Non-blocking calls run on the communicator's
 * progress thread (async_ok). None of this has run on a GPU yet.
 *
 * Profiling: the events do not come from here but from comm.c. A communicator made by
 * ms_comm_nccl_create (or split from one) is an ordinary ms_comm around these slots, so
 * ms_comm_probe_attach installs the profiler's observer on it as on a threads or MPI
 * communicator, and every NCCL call becomes an MS_EV_COLL event with the bytes comm.c
 * computes (the nccl-tests convention), the communicator's group and its sequence number
 * (tests/test_nccl.c checks kind, bytes and group on a GPU). Because a slot returns only
 * after its work has completed, the times comm.c stamps are host-side, enqueue to
 * completion: they include the launch and any wait for late peers, like the other backends'
 * times. GPU-side kernel times are the CUPTI collector's business (profiler/cupti.h).
 *
 * Unequal counts, which NCCL's own collectives do not take:
 *   - all_gather: a group of ncclSend/ncclRecv: each rank sends its block to every peer and
 *     receives each peer's block in place at its offset (its own block is a device copy).
 *     Nothing is padded and no scratch is used.
 *   - reduce_scatter: padded. The blocks are copied into scratch as n blocks of the largest
 *     count, ncclReduceScatter runs over that, and this rank's block is copied out. A
 *     send/recv version would need a reduction kernel on the device, which this C-only
 *     build does not have; the price is (n + 1) * max(count) floats of scratch, kept by the
 *     communicator, and two device copies.
 *   Equal counts (the common case) go straight to ncclAllGather / ncclReduceScatter.
 *
 * all_to_all and p2p are groups of ncclSend/ncclRecv. NCCL matches the sends and receives
 * between two ranks by the order they were issued in, not by tag, so a p2p batch is issued
 * sorted by (tag, position in the batch): a send then meets the receive with the same
 * (peer, tag), as comm.h promises.
 *
 * After an abort the context keeps its scratch on purpose (a kernel that NCCL stopped may
 * have been reading it); the shared layer refuses every later call on that communicator.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/comm_impl.h"
#include "engine/core/cuda_check.h"
#include "engine/core/xalloc.h"

/* How long ms_comm_destroy lets NCCL finalise before it aborts the communicator instead.
 * Every call has completed by then, so finalising has nothing left to flush. */
#define FINALIZE_WAIT_NS (10LL * 1000000000LL)
/* Scratch allocated with each context: the barrier word and split's (color, key) exchange
 * for up to 127 ranks; grown on demand. */
#define SCRATCH_INITIAL_BYTES ((size_t)1024)

typedef struct p2p_slot {
    int tag, index; /* issue order of a p2p batch: by tag, then position in the batch */
} p2p_slot;

typedef struct nccl_ctx {
    ncclComm_t comm;      /* NULL once aborted or destroyed */
    cudaStream_t stream;  /* every operation of this communicator runs here */
    int device;           /* CUDA ordinal: every buffer must live there */
    int rank, size;       /* in this group */
    bool aborted;         /* ncclCommAbort ran: see the top of this file */
    void *scratch;        /* device memory, scratch_bytes long */
    size_t scratch_bytes; /* barrier word, split exchange, reduce_scatter padding */
    p2p_slot *order;      /* host: p2p issue order, grows to the largest batch */
    int order_cap;
} nccl_ctx;

static const ms_comm_backend_ops nccl_ops;

/* --- helpers --------------------------------------------------------------------------------- */

/* Between polls: spin briefly (a small collective finishes in microseconds), then yield,
 * then sleep, so ranks sharing cores with their peers' host threads let them run. */
static void backoff(int *spins) {
    int s = (*spins)++;
    if (s < 64) return;
    if (s < 1024) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* The NCCL type of a call's elements. NCCL reduces bf16 in its own order, rounding at its ring
 * steps, so its bf16 results are close to, not bit-equal with, the CPU backends' (comm.h). */
static ncclDataType_t nccl_type(ms_comm_dtype dt) {
    return dt == MS_COMM_BYTES ? ncclUint8 : dt == MS_COMM_BF16 ? ncclBfloat16 : ncclFloat32;
}

/* Element i of an array of `elt`-byte elements. */
static inline char *elem(const void *base, size_t i, size_t elt) {
    return (char *)base + i * elt;
}

static ncclRedOp_t nccl_op(ms_reduce_op op) {
    switch (op) {
        case MS_REDUCE_AVG:
            return ncclAvg;
        case MS_REDUCE_MAX:
            return ncclMax;
        case MS_REDUCE_MIN:
            return ncclMin;
        default:
            return ncclSum;
    }
}

/* Stops the communicator's kernels and frees the NCCL handle. */
static void abort_comm(nccl_ctx *c) {
    if (c->comm) ncclCommAbort(c->comm);
    c->comm = NULL;
    c->aborted = true;
}

static bool nccl_ok(ncclResult_t r) {
    return r == ncclSuccess || r == ncclInProgress;
}

/* `what` failed with r: records NCCL's words, aborts the communicator (when there is one)
 * and returns MS_ERR_COMM. */
static ms_status nccl_fail(nccl_ctx *c, ncclResult_t r, const char *what, ms_error *err) {
    const char *last = ncclGetLastError(c ? c->comm : NULL);
    ms_status st = ms_fail(err, MS_ERR_COMM, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                           last && *last ? ": " : "", last && *last ? last : "");
    if (c) abort_comm(c);
    return st;
}

static ms_status cuda_fail(nccl_ctx *c, cudaError_t e, const char *what, ms_error *err) {
    ms_status st = ms_cuda_status_as(e, MS_ERR_COMM, what, err);
    if (c) abort_comm(c);
    return st;
}

/* Polls until neither communicator (b may be NULL) is in progress. Returns ncclSuccess,
 * the first asynchronous error, or ncclInProgress when the deadline passed first. */
static ncclResult_t poll_ready(ncclComm_t a, ncclComm_t b, int64_t deadline_ns) {
    int spins = 0;
    for (;;) {
        ncclResult_t sa = ncclSuccess, sb = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(a, &sa);
        if (r != ncclSuccess) return r;
        if (b) {
            r = ncclCommGetAsyncError(b, &sb);
            if (r != ncclSuccess) return r;
        }
        if (!nccl_ok(sa)) return sa;
        if (!nccl_ok(sb)) return sb;
        if (sa == ncclSuccess && sb == ncclSuccess) return ncclSuccess;
        if (ms_now_ns() > deadline_ns) return ncclInProgress;
        backoff(&spins);
    }
}

/* Waits until NCCL has finished enqueueing the last call's work on the stream. In
 * non-blocking mode a call may return ncclInProgress, and nothing may be added to the
 * stream (a copy that must follow it) before the communicator is ready again. */
static ms_status wait_enqueued(nccl_ctx *c, const char *what, ms_comm_call *call, ms_error *err) {
    ncclResult_t r = poll_ready(c->comm, NULL, call->deadline_ns);
    if (r == ncclSuccess) return MS_OK;
    if (r != ncclInProgress) return nccl_fail(c, r, what, err);
    abort_comm(c);
    return MS_ERR_TIMEOUT;
}

/* Waits until everything on the stream has completed, watching NCCL's asynchronous state
 * (a peer's failure, a broken connection) at the same time. */
static ms_status wait_done(nccl_ctx *c, const char *what, ms_comm_call *call, ms_error *err) {
    MS_CHECK(wait_enqueued(c, what, call, err));
    int spins = 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess) return MS_OK;
        if (e != cudaErrorNotReady) return cuda_fail(c, e, what, err);
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
        if (r != ncclSuccess) return nccl_fail(c, r, "ncclCommGetAsyncError", err);
        if (!nccl_ok(st)) return nccl_fail(c, st, what, err);
        if (ms_now_ns() > call->deadline_ns) {
            abort_comm(c);
            return MS_ERR_TIMEOUT;
        }
        backoff(&spins);
    }
}

/* Every slot starts here: the calling thread's current device may be another one (a progress
 * thread runs non-blocking calls). On the direct path the stream first waits for the caller's
 * mark (call->ready: its compute up to the call's issue), on the GPU, not the host. */
static ms_status enter(nccl_ctx *c, ms_comm_call *call, ms_error *err) {
    call->algo = "nccl";
    if (!c->comm)
        return ms_fail(err, MS_ERR_COMM, "the NCCL communicator was aborted; recreate it");
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return cuda_fail(NULL, e, "cudaSetDevice", err);
    return ms_comm_call_wait_ready(call, c->stream, err);
}

/* NCCL moves device memory of the communicator's device. A host pointer would fault inside
 * a kernel and poison the whole CUDA context, so it is refused here with a message. */
static ms_status check_buf(const nccl_ctx *c, const void *p, const char *what, ms_error *err) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear it, so it is not reported by a later call */
        return ms_fail(err, MS_ERR_INVALID, "%s (%p) is not CUDA memory (%s)", what, p,
                       cudaGetErrorString(e));
    }
    if (a.type == cudaMemoryTypeManaged ||
        (a.type == cudaMemoryTypeDevice && a.device == c->device))
        return MS_OK;
    if (a.type == cudaMemoryTypeDevice)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s is memory of CUDA device %d but this NCCL communicator uses device %d",
                       what, a.device, c->device);
    return ms_fail(err, MS_ERR_INVALID,
                   "%s is host memory; the nccl backend moves CUDA device memory of device %d "
                   "(allocate it through a CUDA ms_device)",
                   what, c->device);
}

/* Grows the scratch to at least `bytes`. Only between calls: nothing is in flight then. */
static ms_status ensure_scratch(nccl_ctx *c, size_t bytes, ms_error *err) {
    if (bytes <= c->scratch_bytes) return MS_OK;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ms_fail(err, MS_ERR_NOMEM, "cudaMalloc of %zu bytes of communicator scratch: %s",
                       bytes, cudaGetErrorString(e));
    }
    cudaFree(c->scratch);
    c->scratch = p;
    c->scratch_bytes = bytes;
    return MS_OK;
}

static ms_status copy_async(nccl_ctx *c, void *dst, const void *src, size_t bytes, ms_error *err) {
    if (!bytes || dst == src) return MS_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream);
    return e == cudaSuccess ? MS_OK : cuda_fail(c, e, "cudaMemcpyAsync (device to device)", err);
}

/* --- context --------------------------------------------------------------------------------- */

/* Wraps a ready NCCL communicator: a stream and the scratch. On failure the caller still
 * owns comm. */
static ms_status ctx_create(ncclComm_t comm, int device, int rank, int size, nccl_ctx **out,
                            ms_error *err) {
    *out = NULL;
    nccl_ctx *c = xcalloc(1, sizeof *c);
    c->device = device;
    c->rank = rank;
    c->size = size;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return ms_fail(err, MS_ERR_COMM, "cudaStreamCreate on device %d failed: %s", device,
                       cudaGetErrorString(e));
    }
    if (ensure_scratch(c, SCRATCH_INITIAL_BYTES, err) != MS_OK) {
        cudaStreamDestroy(c->stream);
        free(c);
        return MS_ERR_NOMEM;
    }
    c->comm = comm;
    *out = c;
    return MS_OK;
}

static void nccl_destroy(void *ctx) {
    nccl_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->comm) {
        /* Finalise (flush) under a bound, then free; abort if NCCL does not get there. */
        ncclResult_t r = ncclCommFinalize(c->comm);
        if (nccl_ok(r)) r = poll_ready(c->comm, NULL, ms_now_ns() + FINALIZE_WAIT_NS);
        if (r == ncclSuccess) {
            ncclCommDestroy(c->comm);
            c->comm = NULL;
        } else {
            abort_comm(c);
        }
    }
    cudaStreamDestroy(c->stream); /* returns at once; released when its work is done */
    if (!c->aborted) cudaFree(c->scratch);
    free(c->order);
    free(c);
}

/* --- slots ----------------------------------------------------------------------------------- */

static ms_status nccl_all_reduce(void *ctx, const void *send, void *recv, size_t count,
                                 ms_reduce_op op, ms_comm_call *call, ms_error *err) {
    nccl_ctx *c = ctx;
    MS_CHECK(enter(c, call, err));
    if (!count) return MS_OK; /* count is the same on every member: all skip */
    MS_CHECK(check_buf(c, send, "all_reduce's send buffer", err));
    MS_CHECK(check_buf(c, recv, "all_reduce's receive buffer", err));
    ncclResult_t r =
        ncclAllReduce(send, recv, count, nccl_type(call->dtype), nccl_op(op), c->comm, c->stream);
    if (!nccl_ok(r)) return nccl_fail(c, r, "ncclAllReduce", err);
    return wait_done(c, "ncclAllReduce", call, err);
}

static ms_status nccl_reduce_scatter(void *ctx, const void *send, void *recv,
                                     const size_t *recv_counts, ms_reduce_op op, ms_comm_call *call,
                                     ms_error *err) {
    nccl_ctx *c = ctx;
    MS_CHECK(enter(c, call, err));
    const int n = c->size;
    size_t total = 0, max = 0;
    bool equal = true;
    for (int p = 0; p < n; p++) {
        total += recv_counts[p];
        if (recv_counts[p] > max) max = recv_counts[p];
        equal &= recv_counts[p] == recv_counts[0];
    }
    if (!total) return MS_OK;
    const size_t mine = recv_counts[c->rank];
    const ncclDataType_t type = nccl_type(call->dtype);
    const size_t elt = ms_comm_dtype_size(call->dtype);
    MS_CHECK(check_buf(c, send, "reduce_scatter's send buffer", err));
    if (mine) MS_CHECK(check_buf(c, recv, "reduce_scatter's receive buffer", err));
    if (equal) {
        ncclResult_t r = ncclReduceScatter(send, recv, mine, type, nccl_op(op), c->comm, c->stream);
        if (!nccl_ok(r)) return nccl_fail(c, r, "ncclReduceScatter", err);
        return wait_done(c, "ncclReduceScatter", call, err);
    }
    /* Unequal blocks: pad each to `max` in scratch (see the top of this file). What the
     * padding holds is never read back: it only reduces into other padding. */
    MS_CHECK(ensure_scratch(c, ((size_t)n + 1) * max * elt, err));
    char *padded = c->scratch, *out = elem(padded, (size_t)n * max, elt);
    size_t off = 0;
    for (int p = 0; p < n; p++) {
        MS_CHECK(copy_async(c, elem(padded, (size_t)p * max, elt), elem(send, off, elt),
                            recv_counts[p] * elt, err));
        off += recv_counts[p];
    }
    ncclResult_t r = ncclReduceScatter(padded, out, max, type, nccl_op(op), c->comm, c->stream);
    if (!nccl_ok(r)) return nccl_fail(c, r, "ncclReduceScatter (padded)", err);
    MS_CHECK(wait_enqueued(c, "ncclReduceScatter (padded)", call, err));
    MS_CHECK(copy_async(c, recv, out, mine * elt, err));
    return wait_done(c, "ncclReduceScatter (padded)", call, err);
}

/* Runs a group of sends and receives; every op with a zero count has been left out by the
 * caller. `first_err` collects an enqueue failure without leaving the group open. */
static ms_status group_end(nccl_ctx *c, ncclResult_t first_err, const char *what, ms_error *err) {
    ncclResult_t r = ncclGroupEnd();
    if (!nccl_ok(first_err)) return nccl_fail(c, first_err, what, err);
    if (!nccl_ok(r)) return nccl_fail(c, r, what, err);
    return MS_OK;
}

static ms_status nccl_all_gather(void *ctx, const void *send, void *recv, const size_t *counts,
                                 ms_comm_call *call, ms_error *err) {
    nccl_ctx *c = ctx;
    MS_CHECK(enter(c, call, err));
    const int n = c->size, me = c->rank;
    size_t total = 0;
    bool equal = true;
    for (int p = 0; p < n; p++) {
        total += counts[p];
        equal &= counts[p] == counts[0];
    }
    if (!total) return MS_OK;
    const ncclDataType_t type = nccl_type(call->dtype);
    const size_t elt = ms_comm_dtype_size(call->dtype);
    if (counts[me]) MS_CHECK(check_buf(c, send, "all_gather's send buffer", err));
    MS_CHECK(check_buf(c, recv, "all_gather's receive buffer", err));
    if (equal) {
        ncclResult_t r = ncclAllGather(send, recv, counts[0], type, c->comm, c->stream);
        if (!nccl_ok(r)) return nccl_fail(c, r, "ncclAllGather", err);
        return wait_done(c, "ncclAllGather", call, err);
    }
    /* Unequal blocks: every rank sends its block to each peer (see the top of this file). */
    size_t off = 0, my_off = 0;
    for (int p = 0; p < me; p++) my_off += counts[p];
    if (counts[me]) MS_CHECK(copy_async(c, elem(recv, my_off, elt), send, counts[me] * elt, err));
    ncclResult_t first = ncclSuccess;
    ncclGroupStart();
    for (int p = 0; p < n; p++) {
        if (p != me && counts[me] && nccl_ok(first))
            first = ncclSend(send, counts[me], type, p, c->comm, c->stream);
        if (p != me && counts[p] && nccl_ok(first))
            first = ncclRecv(elem(recv, off, elt), counts[p], type, p, c->comm, c->stream);
        off += counts[p];
    }
    MS_CHECK(group_end(c, first, "ncclSend/ncclRecv (all_gather of unequal blocks)", err));
    return wait_done(c, "ncclSend/ncclRecv (all_gather of unequal blocks)", call, err);
}

static ms_status nccl_all_to_all(void *ctx, const void *send, const size_t *send_counts,
                                 const size_t *send_displs, void *recv, const size_t *recv_counts,
                                 const size_t *recv_displs, ms_comm_call *call, ms_error *err) {
    nccl_ctx *c = ctx;
    MS_CHECK(enter(c, call, err));
    const int n = c->size, me = c->rank;
    size_t sent = 0, received = 0;
    for (int p = 0; p < n; p++) sent += send_counts[p], received += recv_counts[p];
    if (sent) MS_CHECK(check_buf(c, send, "all_to_all's send buffer", err));
    if (received) MS_CHECK(check_buf(c, recv, "all_to_all's receive buffer", err));
    const ncclDataType_t type = nccl_type(call->dtype);
    const size_t elt = ms_comm_dtype_size(call->dtype);
    if (send_counts[me])
        MS_CHECK(copy_async(c, elem(recv, recv_displs[me], elt), elem(send, send_displs[me], elt),
                            send_counts[me] * elt, err));
    ncclResult_t first = ncclSuccess;
    ncclGroupStart();
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        if (send_counts[p] && nccl_ok(first))
            first = ncclSend(elem(send, send_displs[p], elt), send_counts[p], type, p, c->comm,
                             c->stream);
        if (recv_counts[p] && nccl_ok(first))
            first = ncclRecv(elem(recv, recv_displs[p], elt), recv_counts[p], type, p, c->comm,
                             c->stream);
    }
    MS_CHECK(group_end(c, first, "ncclSend/ncclRecv (all_to_all)", err));
    return wait_done(c, "ncclSend/ncclRecv (all_to_all)", call, err);
}

static ms_status nccl_broadcast(void *ctx, void *buf, size_t count, int root, ms_comm_call *call,
                                ms_error *err) {
    nccl_ctx *c = ctx;
    MS_CHECK(enter(c, call, err));
    if (!count) return MS_OK;
    MS_CHECK(check_buf(c, buf, "broadcast's buffer", err));
    ncclResult_t r =
        ncclBroadcast(buf, buf, count, nccl_type(call->dtype), root, c->comm, c->stream);
    if (!nccl_ok(r)) return nccl_fail(c, r, "ncclBroadcast", err);
    return wait_done(c, "ncclBroadcast", call, err);
}

static int cmp_slot(const void *a, const void *b) {
    const p2p_slot *x = a, *y = b;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static ms_status nccl_p2p(void *ctx, const ms_p2p_op *ops, int nops, ms_comm_call *call,
                          ms_error *err) {
    nccl_ctx *c = ctx;
    MS_CHECK(enter(c, call, err));
    if (nops > c->order_cap) {
        c->order_cap = nops > 2 * c->order_cap ? nops : 2 * c->order_cap;
        free(c->order);
        c->order = xmalloc((size_t)c->order_cap * sizeof *c->order);
    }
    /* Zero-count operations move nothing; the matching one on the peer has count zero too
     * and is left out there as well. */
    int n = 0;
    for (int i = 0; i < nops; i++) {
        if (!ops[i].count) continue;
        MS_CHECK(check_buf(c, ops[i].buf,
                           ops[i].kind == MS_P2P_SEND ? "a send's buffer" : "a receive's buffer",
                           err));
        c->order[n++] = (p2p_slot){ops[i].tag, i};
    }
    if (!n) return MS_OK;
    qsort(c->order, (size_t)n, sizeof *c->order, cmp_slot);
    const ncclDataType_t type = nccl_type(call->dtype);
    ncclResult_t first = ncclSuccess;
    ncclGroupStart();
    for (int k = 0; k < n && nccl_ok(first); k++) {
        const ms_p2p_op *o = &ops[c->order[k].index];
        first = o->kind == MS_P2P_SEND
                    ? ncclSend(o->buf, o->count, type, o->peer, c->comm, c->stream)
                    : ncclRecv(o->buf, o->count, type, o->peer, c->comm, c->stream);
    }
    MS_CHECK(group_end(c, first, "ncclSend/ncclRecv", err));
    ms_status st = wait_done(c, "ncclSend/ncclRecv", call, err);
    if (st == MS_ERR_TIMEOUT) {
        /* The batch completes as a whole, so the missing rank is known only when it is
         * the batch's single peer. */
        int peer = ops[c->order[0].index].peer;
        bool single = true;
        for (int k = 1; k < n; k++) single &= ops[c->order[k].index].peer == peer;
        call->n_missing = 0;
        if (single) call->missing[call->n_missing++] = peer;
    }
    return st;
}

static ms_status nccl_barrier(void *ctx, ms_comm_call *call, ms_error *err) {
    nccl_ctx *c = ctx;
    MS_CHECK(enter(c, call, err));
    /* A one-element all-reduce of the scratch word: whatever it holds, no rank finishes
     * before every rank has joined. */
    ncclResult_t r =
        ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->comm, c->stream);
    if (!nccl_ok(r)) return nccl_fail(c, r, "ncclAllReduce (barrier)", err);
    return wait_done(c, "ncclAllReduce (barrier)", call, err);
}

static ms_status nccl_split(void *ctx, int color, int key, void **out_ctx, int *out_size,
                            int *out_rank, int *out_members, ms_comm_call *call, ms_error *err) {
    nccl_ctx *c = ctx;
    *out_ctx = NULL;
    MS_CHECK(enter(c, call, err));
    const int n = c->size;
    if (color < 0) color = NCCL_SPLIT_NOCOLOR;

    /* Learn every member's (color, key): NCCL builds the groups but does not say who is in
     * ours, and the shared layer needs the members in new-rank order. */
    int mine[2] = {color, key};
    int *all = xmalloc(2 * (size_t)n * sizeof *all);
    ms_status st = ensure_scratch(c, (2 + 2 * (size_t)n) * sizeof(int), err);
    int *dmine = c->scratch, *dall = dmine + 2;
    cudaError_t e = cudaSuccess;
    if (st == MS_OK) {
        e = cudaMemcpyAsync(dmine, mine, sizeof mine, cudaMemcpyHostToDevice, c->stream);
        if (e != cudaSuccess) st = cuda_fail(c, e, "cudaMemcpyAsync (split colors)", err);
    }
    if (st == MS_OK) {
        ncclResult_t r = ncclAllGather(dmine, dall, 2, ncclInt32, c->comm, c->stream);
        st = nccl_ok(r) ? wait_done(c, "ncclAllGather (split colors)", call, err)
                        : nccl_fail(c, r, "ncclAllGather (split colors)", err);
    }
    if (st == MS_OK) {
        /* The stream is idle, so this copy into pageable memory returns at once. */
        e = cudaMemcpyAsync(all, dall, 2 * (size_t)n * sizeof *all, cudaMemcpyDeviceToHost,
                            c->stream);
        st = e == cudaSuccess ? wait_done(c, "cudaMemcpyAsync (split colors)", call, err)
                              : cuda_fail(c, e, "cudaMemcpyAsync (split colors)", err);
    }
    if (st != MS_OK) {
        free(all);
        return st;
    }

    /* The child inherits the parent's configuration (non-blocking). */
    ncclComm_t child = NULL;
    ncclResult_t r = ncclCommSplit(c->comm, color, key, &child, NULL);
    if (nccl_ok(r)) r = poll_ready(c->comm, child, call->deadline_ns);
    if (r != ncclSuccess) {
        free(all);
        if (child) ncclCommAbort(child);
        if (r == ncclInProgress) {
            abort_comm(c);
            return MS_ERR_TIMEOUT;
        }
        return nccl_fail(c, r, "ncclCommSplit", err);
    }
    if (color == NCCL_SPLIT_NOCOLOR) {
        free(all);
        return MS_OK;
    }

    int me = -1;
    int size = ms_split_order(all, n, color, c->rank, out_members, &me);
    free(all);
    int nccl_size = 0, nccl_rank = -1;
    ncclCommCount(child, &nccl_size);
    ncclCommUserRank(child, &nccl_rank);
    if (nccl_size != size || nccl_rank != me) {
        ncclCommAbort(child);
        return ms_fail(err, MS_ERR_INTERNAL,
                       "ncclCommSplit gave rank %d of %d but (key, rank) order gives %d of %d",
                       nccl_rank, nccl_size, me, size);
    }
    nccl_ctx *sub;
    st = ctx_create(child, c->device, me, size, &sub, err);
    if (st != MS_OK) {
        ncclCommAbort(child);
        return st;
    }
    *out_ctx = sub;
    *out_size = size;
    *out_rank = me;
    return MS_OK;
}

/* Non-blocking calls run on the communicator's progress thread: every slot binds the device
 * (enter), and the caller's compute is ordered by its mark, recorded at issue, so kernels the
 * caller queues after the call overlap it. */
static bool nccl_async_ok(void *ctx) {
    (void)ctx;
    return true;
}

static const ms_comm_backend_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = nccl_all_reduce,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .all_to_all = nccl_all_to_all,
    .broadcast = nccl_broadcast,
    .p2p = nccl_p2p,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .destroy = nccl_destroy,
    .async_ok = nccl_async_ok,
};

/* --- creation -------------------------------------------------------------------------------- */

/* Whether this rank can bind `device`: MS_OK, MS_ERR_UNSUPPORTED (no GPU at all) or
 * MS_ERR_INVALID (no such ordinal), with the message in err. */
static ms_status check_device(int device, ms_error *err) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "no CUDA device: cudaGetDeviceCount failed (%s); the nccl backend needs "
                       "one GPU per rank. Falling back is the caller's choice; use the threads "
                       "or mpi backend",
                       cudaGetErrorString(e));
    }
    if (count == 0)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "no CUDA device: cudaGetDeviceCount found none; the nccl backend needs "
                       "one GPU per rank. Falling back is the caller's choice; use the threads "
                       "or mpi backend");
    if (device < 0 || device >= count)
        return ms_fail(err, MS_ERR_INVALID,
                       "CUDA device %d requested for the nccl backend but this rank has %d "
                       "(0..%d)",
                       device, count, count - 1);
    return MS_OK;
}

/* Binds the device and joins the NCCL communicator, polling until it is ready or the
 * deadline passes; then wraps it in a context. */
static ms_status join(int device, int n, int rank, const ncclUniqueId *id, int64_t deadline_ns,
                      nccl_ctx **out, ms_error *err) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return ms_fail(err, MS_ERR_COMM, "cudaSetDevice(%d) failed: %s", device,
                       cudaGetErrorString(e));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* see the top of this file */
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, n, *id, rank, &cfg);
    if (nccl_ok(r) && comm) r = poll_ready(comm, NULL, deadline_ns);
    if (r != ncclSuccess || !comm) {
        const char *last = ncclGetLastError(comm);
        ms_status st =
            r == ncclInProgress
                ? ms_fail(err, MS_ERR_TIMEOUT,
                          "joining the NCCL communicator (rank %d of %d, device %d) timed out; "
                          "a member did not arrive or NCCL could not connect",
                          rank, n, device)
                : ms_fail(err, MS_ERR_COMM,
                          "ncclCommInitRankConfig (rank %d of %d, device %d) failed: %s%s%s", rank,
                          n, device, ncclGetErrorString(r), last && *last ? ": " : "",
                          last && *last ? last : "");
        if (comm) ncclCommAbort(comm);
        return st;
    }
    ms_status st = ctx_create(comm, device, rank, n, out, err);
    if (st != MS_OK) ncclCommAbort(comm);
    return st;
}

ms_status ms_comm_nccl_create(ms_comm *bootstrap, int device, ms_comm **out, ms_error *err) {
    if (!out) return ms_fail(err, MS_ERR_INVALID, "ms_comm_nccl_create: out is NULL");
    *out = NULL;
    if (!bootstrap)
        return ms_fail(err, MS_ERR_INVALID, "ms_comm_nccl_create: no bootstrap communicator");
    const int n = ms_comm_size(bootstrap), me = ms_comm_rank(bootstrap);
    const char *bname = ms_comm_name(bootstrap);

    /* 1. Every member says whether it can bind its device, and all of them learn every
     *    answer, so that they fail together instead of leaving the others waiting. */
    ms_error mine = {0};
    ms_status verdict = check_device(device, &mine);
    float *verdicts = xmalloc((size_t)n * sizeof *verdicts);
    size_t *ones = xmalloc((size_t)n * sizeof *ones);
    for (int p = 0; p < n; p++) ones[p] = 1;
    float v = (float)verdict;
    ms_status st = ms_all_gather(bootstrap, &v, verdicts, ones, err);
    int failed = -1;
    for (int p = 0; st == MS_OK && p < n && failed < 0; p++)
        if (verdicts[p] != 0.0f) failed = p;
    ms_status remote = failed >= 0 ? (ms_status)verdicts[failed] : MS_OK;
    free(verdicts);
    free(ones);
    MS_CHECK(st);
    if (verdict != MS_OK) {
        if (err) *err = mine;
        return verdict;
    }
    if (failed >= 0)
        return ms_fail(err, remote,
                       "rank %d (world %d) of communicator '%s' cannot join NCCL: %s; every "
                       "member needs a CUDA device. Falling back is the caller's choice; use "
                       "the threads or mpi backend",
                       failed, ms_comm_world_rank(bootstrap, failed), bname,
                       remote == MS_ERR_UNSUPPORTED ? "it has no CUDA device"
                                                    : "its CUDA device does not exist");

    /* 2. Rank 0 makes the unique id and broadcasts it as bytes, with a flag saying whether
     *    it could. */
    struct {
        ncclUniqueId id;
        uint8_t ok;
    } msg;
    memset(&msg, 0, sizeof msg);
    ms_error id_err = {0};
    if (me == 0) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        if (r == ncclSuccess)
            msg.ok = 1;
        else
            nccl_fail(NULL, r, "ncclGetUniqueId", &id_err);
    }
    MS_CHECK(ms_broadcast_bytes(bootstrap, &msg, sizeof msg, 0, err));
    if (!msg.ok) {
        if (me == 0) {
            if (err) *err = id_err;
            return id_err.code;
        }
        return ms_fail(err, MS_ERR_COMM,
                       "rank 0 of communicator '%s' could not create the NCCL unique id (its "
                       "error says why)",
                       bname);
    }
    const ncclUniqueId id = msg.id;

    /* 3. Join, under the bootstrap's timeout, then agree that everybody made it: a rank
     *    that failed reports its rank + 1 (MAX names the last such rank). */
    int64_t deadline = ms_now_ns() + ms_comm_timeout_ms(bootstrap) * 1000000;
    nccl_ctx *ctx = NULL;
    ms_error join_err = {0};
    ms_status joined = join(device, n, me, &id, deadline, &ctx, &join_err);
    float bad = joined == MS_OK ? 0.0f : (float)(me + 1), worst = 0.0f;
    st = ms_all_reduce(bootstrap, &bad, &worst, 1, MS_REDUCE_MAX, err);
    if (st != MS_OK || worst != 0.0f) {
        if (ctx) {
            /* Some member is not in the clique: abort rather than wait for it in a
             * finalise. Nothing ran on the stream, so the scratch can go too. */
            ncclCommAbort(ctx->comm);
            cudaStreamDestroy(ctx->stream);
            cudaFree(ctx->scratch);
            free(ctx);
        }
        if (st != MS_OK) return st;
        if (joined != MS_OK) {
            if (err) *err = join_err;
            return joined;
        }
        int who = (int)worst - 1;
        return ms_fail(err, MS_ERR_COMM,
                       "rank %d (world %d) of communicator '%s' failed to join the NCCL "
                       "communicator (its error says why)",
                       who, ms_comm_world_rank(bootstrap, who), bname);
    }

    int *world = xmalloc((size_t)n * sizeof *world);
    for (int p = 0; p < n; p++) world[p] = ms_comm_world_rank(bootstrap, p);
    char name[48];
    snprintf(name, sizeof name, "nccl:%s", bname);
    *out = ms_comm_wrap(&nccl_ops, ctx, me, n, world, name);
    free(world);
    ms_comm_set_timeout_ms(*out, ms_comm_timeout_ms(bootstrap));
    return MS_OK;
}

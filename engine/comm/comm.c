/* comm.c - the shared layer around every communicator backend: validation, sequence
 * numbers, deadlines, error messages that name the failure, the observer event, and the
 * non-blocking calls' queue and progress thread (comm.h). */
#include "engine/comm/comm_impl.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/flight.h"
#include "engine/core/tensor.h"
#include "engine/core/xalloc.h"

struct ms_comm {
    const ms_comm_backend_ops *ops;
    void *ctx;
    int rank, size;
    int *world_ranks;
    char name[32];
    int64_t seq;
    int64_t timeout_ns;
    ms_comm_observer_fn observer;
    void *observer_user;
    ms_flight *flight;    /* this rank's flight recorder */
    ms_flight_comm fdesc; /* what its entries say about this communicator */
    /* Guarded by mu: the progress thread breaks the communicator and completes requests. */
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* the progress thread: work queued, or stop */
    pthread_cond_t completed; /* waiters: a request completed */
    bool broken;
    char broken_why[160];
    /* The failure of a non-blocking call that broke the communicator, until a later call
     * reports it: its caller may meet the broken communicator before it waits for that call,
     * and must still learn what happened (e.g. which ranks did not arrive). */
    bool unreported;
    ms_error async_failure;
    ms_comm_request *q_head, *q_tail; /* issued, not yet started, in issue order */
    int in_flight;                    /* issued, not yet executed */
    bool has_thread, stopping;
    pthread_t thread;
    ms_device *device;      /* the rank's device: its buffers are staged (NULL: none) */
    struct stage_buf *pool; /* host staging buffers, grown on demand; guarded by mu */
    int npool;
    /* Owned, or NULL: a communicator with the same members whose backend moves the device's
     * memory itself (NCCL); collectives on device buffers only run on its backend. */
    ms_comm *direct;
    _Atomic int64_t direct_calls;
};

/* A host staging buffer of a communicator, held by one call at a time. */
typedef struct stage_buf {
    char *p;
    size_t cap;
    bool busy;
} stage_buf;

/* One device buffer of a call and its stand-in in host memory. */
typedef struct stage_region {
    void *dev;
    size_t bytes;
    bool in, out; /* copied to the host before the call / back to the device after it */
    size_t off;   /* its place in the staging buffer */
} stage_region;

/* The device buffers of one call, staged through one pool buffer of its communicator. */
typedef struct stage {
    ms_comm *c;
    int slot; /* the pool buffer held, or -1 */
    char *host;
    int n;
    stage_region *r;
    int host_bufs;         /* the call's non-empty buffers in host memory */
    bool direct;           /* every buffer is device memory and runs on c->direct's backend */
    ms_device_mark *ready; /* direct: the caller's work up to the call's issue (owned) */
} stage;

/* A non-blocking call: its arguments, then what the progress thread found. */
struct ms_comm_request {
    ms_comm *c;
    ms_comm_call call;
    const void *send; /* elements of call.dtype */
    void *recv;
    size_t count;   /* all_reduce */
    size_t *counts; /* reduce_scatter, all_gather: a copy, c->size entries */
    ms_reduce_op op;
    size_t bytes;
    int64_t t_issue, t0, t1;
    ms_status st;
    bool done; /* guarded by c->mu */
    ms_error err;
    ms_comm_request *next;
    /* A point-to-point batch (ms_ip2p): never queued, advanced by the waiting thread. */
    bool p2p;
    ms_p2p_op *ops; /* a copy, which the backend's handle reads */
    void *handle;
    stage stage; /* device buffers staged through the host until completion */
};

static const char *const reduce_names[MS_REDUCE_COUNT] = {"sum", "avg", "max", "min"};
static const char *const coll_names[MS_COLL_KIND_COUNT] = {
    [MS_COLL_ALL_REDUCE] = "all_reduce", [MS_COLL_REDUCE_SCATTER] = "reduce_scatter",
    [MS_COLL_ALL_GATHER] = "all_gather", [MS_COLL_ALL_TO_ALL] = "all_to_all",
    [MS_COLL_BROADCAST] = "broadcast",   [MS_COLL_P2P] = "send_recv",
    [MS_COLL_BARRIER] = "barrier",       [MS_COLL_SPLIT] = "split",
};

static const char *const dtype_names[] = {
    [MS_COMM_F32] = "f32", [MS_COMM_BYTES] = "bytes", [MS_COMM_BF16] = "bf16"};
static const size_t dtype_sizes[] = {
    [MS_COMM_F32] = sizeof(float), [MS_COMM_BYTES] = 1, [MS_COMM_BF16] = sizeof(uint16_t)};
static_assert(sizeof dtype_names / sizeof dtype_names[0] == MS_COMM_DTYPE_COUNT, "dtype names");
static_assert(sizeof dtype_sizes / sizeof dtype_sizes[0] == MS_COMM_DTYPE_COUNT, "dtype sizes");

const char *ms_comm_dtype_name(ms_comm_dtype dt) {
    return (unsigned)dt < MS_COMM_DTYPE_COUNT ? dtype_names[dt] : "?";
}

size_t ms_comm_dtype_size(ms_comm_dtype dt) {
    return (unsigned)dt < MS_COMM_DTYPE_COUNT ? dtype_sizes[dt] : 0;
}

const char *ms_reduce_op_name(ms_reduce_op op) {
    return (unsigned)op < MS_REDUCE_COUNT ? reduce_names[op] : "?";
}

const char *ms_coll_name(ms_coll_kind kind) {
    return (unsigned)kind < MS_COLL_KIND_COUNT ? coll_names[kind] : "?";
}

double ms_coll_busbw_factor(ms_coll_kind kind, int n) {
    if (n <= 1) return 0.0;
    switch (kind) {
        case MS_COLL_ALL_REDUCE:
            return 2.0 * (n - 1) / n;
        case MS_COLL_ALL_GATHER:
        case MS_COLL_REDUCE_SCATTER:
        case MS_COLL_ALL_TO_ALL:
            return (double)(n - 1) / n;
        default:
            return 1.0;
    }
}

int64_t ms_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

ms_comm *ms_comm_wrap(const ms_comm_backend_ops *ops, void *ctx, int rank, int size,
                      const int *world_ranks, const char *name) {
    ms_comm *c = xcalloc(1, sizeof *c);
    c->ops = ops;
    c->ctx = ctx;
    c->rank = rank;
    c->size = size;
    c->world_ranks = xmalloc(sizeof(int) * (size_t)size);
    memcpy(c->world_ranks, world_ranks, sizeof(int) * (size_t)size);
    snprintf(c->name, sizeof c->name, "%s", name ? name : "world");
    c->timeout_ns = (int64_t)MS_COMM_DEFAULT_TIMEOUT_MS * 1000000;
    ms_flight_comm_init(&c->fdesc, c->name, world_ranks, size, rank);
    c->fdesc.timeout_ns = c->timeout_ns;
    c->flight = ms_flight_for_rank(world_ranks[rank]);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->completed, NULL);
    return c;
}

static void stop_progress(ms_comm *c);

void ms_comm_destroy(ms_comm *c) {
    if (!c) return;
    stop_progress(c);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->completed);
    for (int i = 0; i < c->npool; i++) free(c->pool[i].p);
    free(c->pool);
    c->ops->destroy(c->ctx);
    ms_comm_destroy(c->direct);
    free(c->world_ranks);
    free(c);
}

int ms_comm_rank(const ms_comm *c) {
    return c->rank;
}
int ms_comm_size(const ms_comm *c) {
    return c->size;
}
int ms_comm_world_rank(const ms_comm *c, int r) {
    return r >= 0 && r < c->size ? c->world_ranks[r] : -1;
}
const char *ms_comm_name(const ms_comm *c) {
    return c->name;
}
const char *ms_comm_backend(const ms_comm *c) {
    return c->ops->name;
}
int64_t ms_comm_seq(const ms_comm *c) {
    return c->seq;
}
bool ms_comm_is_broken(const ms_comm *c) {
    ms_comm *m = (ms_comm *)c; /* the lock, not the value, is mutated */
    pthread_mutex_lock(&m->mu);
    bool b = m->broken;
    pthread_mutex_unlock(&m->mu);
    return b;
}
void ms_comm_set_timeout_ms(ms_comm *c, int64_t ms) {
    c->timeout_ns = ms * 1000000;
    c->fdesc.timeout_ns = c->timeout_ns;
}
int64_t ms_comm_timeout_ms(const ms_comm *c) {
    return c->timeout_ns / 1000000;
}
void ms_comm_set_observer(ms_comm *c, ms_comm_observer_fn fn, void *user) {
    c->observer = fn;
    c->observer_user = user;
}
void ms_comm_set_device(ms_comm *c, ms_device *dev) {
    c->device = dev;
}

ms_status ms_comm_adopt_direct(ms_comm *c, ms_comm *direct, ms_error *err) {
    if (!direct || direct->size != c->size || direct->rank != c->rank || c->direct) {
        ms_comm_destroy(direct);
        return ms_fail(err, MS_ERR_INVALID,
                       "communicator '%s': a direct path needs the same members in the same "
                       "order, and only one",
                       c->name);
    }
    c->direct = direct;
    return MS_OK;
}
const char *ms_comm_direct_name(const ms_comm *c) {
    return c->direct ? c->direct->ops->name : NULL;
}
int64_t ms_comm_direct_calls(const ms_comm *c) {
    return c->direct_calls;
}
ms_device *ms_comm_device(const ms_comm *c) {
    return c->device;
}

/* --- staging device memory through the host ------------------------------------------- *
 *
 * The threads and MPI backends move data with the CPU. A call's buffers that are memory of
 * the communicator's device (ms_device_owns) are swapped for host stand-ins carved from one
 * staging buffer of the communicator: what the call reads is copied in before it runs, what
 * it writes is copied back once it completed (non-blocking calls: on the thread that waits).
 * Host buffers pass straight through, and a communicator without a device stages nothing. */

/* A free pool buffer of at least `bytes`: the smallest that fits, else the largest grown. */
static int pool_take(ms_comm *c, size_t bytes, char **out) {
    pthread_mutex_lock(&c->mu);
    int fit = -1, big = -1;
    for (int i = 0; i < c->npool; i++) {
        const stage_buf *b = &c->pool[i];
        if (b->busy) continue;
        if (b->cap >= bytes && (fit < 0 || b->cap < c->pool[fit].cap)) fit = i;
        if (big < 0 || b->cap > c->pool[big].cap) big = i;
    }
    int pick = fit >= 0 ? fit : big;
    if (pick < 0) {
        c->pool = xrealloc(c->pool, sizeof *c->pool * (size_t)(c->npool + 1));
        c->pool[pick = c->npool++] = (stage_buf){0};
    }
    stage_buf *b = &c->pool[pick];
    if (b->cap < bytes) {
        free(b->p);
        b->p = xmalloc(bytes);
        b->cap = bytes;
    }
    b->busy = true;
    *out = b->p;
    pthread_mutex_unlock(&c->mu);
    return pick;
}

static void pool_give(ms_comm *c, int slot) {
    pthread_mutex_lock(&c->mu);
    c->pool[slot].busy = false;
    pthread_mutex_unlock(&c->mu);
}

static void stage_init(stage *s, ms_comm *c) {
    *s = (stage){.c = c, .slot = -1};
}

/* Adds buf (bytes long; read by the call when `in`, written when `out`) if it is device
 * memory. The same buffer twice (in place) is one region. */
static void stage_add(stage *s, const void *buf, size_t bytes, bool in, bool out) {
    if (!bytes) return;
    if (!ms_device_owns(s->c->device, buf)) {
        s->host_bufs++;
        return;
    }
    for (int i = 0; i < s->n; i++)
        if (s->r[i].dev == buf) {
            stage_region *r = &s->r[i];
            r->bytes = bytes > r->bytes ? bytes : r->bytes;
            r->in |= in, r->out |= out;
            return;
        }
    s->r = xrealloc(s->r, sizeof *s->r * (size_t)(s->n + 1));
    s->r[s->n++] = (stage_region){(void *)buf, bytes, in, out, 0};
}

/* Takes a staging buffer and copies in what the call reads. */
static ms_status stage_begin(stage *s, ms_error *err) {
    if (!s->n) return MS_OK;
    size_t total = 0;
    for (int i = 0; i < s->n; i++) {
        s->r[i].off = total;
        total += (s->r[i].bytes + MS_TENSOR_ALIGN - 1) / MS_TENSOR_ALIGN * MS_TENSOR_ALIGN;
    }
    s->slot = pool_take(s->c, total, &s->host);
    for (int i = 0; i < s->n; i++) {
        const stage_region *r = &s->r[i];
        if (r->in)
            MS_CHECK(ms_device_copy(s->c->device, s->host + r->off, r->dev, r->bytes,
                                    MS_COPY_DEVICE_TO_HOST, err));
    }
    return MS_OK;
}

/* stage_begin for a collective that may take the direct path: when every buffer of the call
 * is device memory and the communicator has one, nothing is staged. Called on the caller's
 * thread when the call is issued, non-blocking calls too. */
static ms_status stage_begin_routed(stage *s, ms_comm_call *call, ms_error *err) {
    if (s->c->direct && s->n > 0 && s->host_bufs == 0) {
        /* The direct backend works on its own stream: it waits there for a mark after what
         * the caller has queued so far (the kernels that wrote the buffers), and for nothing
         * the caller queues later, so compute issued after a non-blocking call overlaps it.
         * A device without marks is synced here instead. */
        MS_CHECK(ms_device_mark_record(s->c->device, &s->ready, err));
        call->ready_dev = s->c->device;
        call->ready = s->ready;
        s->direct = true;
        s->c->direct_calls++;
        call->algo = s->c->direct->ops->name; /* the backend may name its algorithm instead */
        return MS_OK;
    }
    return stage_begin(s, err);
}

/* The backend that moves the staged call's data, and its context. */
static const ms_comm_backend_ops *stage_ops_of(const stage *s) {
    return s->direct ? s->c->direct->ops : s->c->ops;
}
static void *stage_ctx_of(const stage *s) {
    return s->direct ? s->c->direct->ctx : s->c->ctx;
}

/* The buffer the backend gets for buf: its host stand-in, or buf itself. */
static void *stage_ptr(const stage *s, const void *buf) {
    if (s->direct) return (void *)buf;
    for (int i = 0; i < s->n; i++)
        if (s->r[i].dev == buf) return s->host + s->r[i].off;
    return (void *)buf;
}

/* Copies back what the call wrote (when st is MS_OK) and gives the buffer back. Returns st, or
 * the copy's failure. */
static ms_status stage_end(stage *s, ms_status st, ms_error *err) {
    for (int i = 0; i < s->n && st == MS_OK && s->slot >= 0 && !s->direct; i++) {
        const stage_region *r = &s->r[i];
        if (r->out)
            st = ms_device_copy(s->c->device, r->dev, s->host + r->off, r->bytes,
                                MS_COPY_HOST_TO_DEVICE, err);
    }
    if (s->slot >= 0) pool_give(s->c, s->slot);
    ms_device_mark_release(s->c->device, s->ready); /* the backend's wait is queued by now */
    free(s->r);
    stage_init(s, s->c);
    return st;
}

/* The buffers of a collective of `kind` (not p2p, not broadcast): all_reduce moves count
 * elements, reduce_scatter and all_gather the blocks of counts[]. */
static void stage_coll(stage *s, ms_coll_kind kind, ms_comm_dtype dt, const void *send, void *recv,
                       size_t count, const size_t *counts) {
    const size_t elt = ms_comm_dtype_size(dt);
    size_t mine = count, total = count;
    if (kind != MS_COLL_ALL_REDUCE) {
        total = 0;
        for (int r = 0; r < s->c->size; r++) total += counts[r];
        mine = counts[s->c->rank];
    }
    const bool gather = kind == MS_COLL_ALL_GATHER, scatter = kind == MS_COLL_REDUCE_SCATTER;
    stage_add(s, send, (gather ? mine : total) * elt, true, false);
    stage_add(s, recv, (scatter ? mine : total) * elt, false, true);
}

/* --- reductions shared by the CPU backends ------------------------------------------- */

void ms_reduce_accumulate(float *restrict acc, const float *restrict x, size_t n, ms_reduce_op op) {
    switch (op) {
        case MS_REDUCE_SUM:
        case MS_REDUCE_AVG:
            for (size_t i = 0; i < n; i++) acc[i] += x[i];
            break;
        case MS_REDUCE_MAX:
            for (size_t i = 0; i < n; i++) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
            break;
        case MS_REDUCE_MIN:
            for (size_t i = 0; i < n; i++) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
            break;
        default:
            break;
    }
}

void ms_reduce_finish(float *acc, size_t n, ms_reduce_op op, int group_size) {
    if (op != MS_REDUCE_AVG || group_size <= 1) return;
    const float inv = 1.0f / (float)group_size;
    for (size_t i = 0; i < n; i++) acc[i] *= inv;
}

/* Widens, reduces in fp32 a run that stays in L1, rounds once. */
#define BF16_RUN 512

void ms_reduce_bf16(uint16_t *dst, const uint16_t *const *src, int n, size_t count,
                    ms_reduce_op op) {
    float acc[BF16_RUN], x[BF16_RUN];
    for (size_t lo = 0; lo < count; lo += BF16_RUN) {
        const size_t m = count - lo < BF16_RUN ? count - lo : BF16_RUN;
        for (size_t i = 0; i < m; i++) acc[i] = ms_f32_from_bf16(src[0][lo + i]);
        for (int p = 1; p < n; p++) {
            for (size_t i = 0; i < m; i++) x[i] = ms_f32_from_bf16(src[p][lo + i]);
            ms_reduce_accumulate(acc, x, m, op);
        }
        ms_reduce_finish(acc, m, op, n);
        for (size_t i = 0; i < m; i++) dst[lo + i] = ms_bf16_from_f32(acc[i]);
    }
}

/* --- the wrapper ------------------------------------------------------------------------ */

static void group_str(const ms_comm *c, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "'%s' (world ranks ", c->name);
    for (int r = 0; r < c->size && n + 16 < len; r++)
        n += (size_t)snprintf(buf + n, len - n, "%s%d", r ? "," : "", c->world_ranks[r]);
    if (c->size * 6 + 40 > (int)len) n += (size_t)snprintf(buf + n, len - n, "...");
    snprintf(buf + n, len - n, ")");
}

/* Waits until every non-blocking call issued on c has executed, so that a blocking call
 * keeps its place in the communicator's order. Bounded: each queued call has a deadline. */
static void drain(ms_comm *c) {
    pthread_mutex_lock(&c->mu);
    while (c->in_flight > 0) pthread_cond_wait(&c->completed, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* The refusal of a call on a broken communicator, or MS_OK. On the caller's thread (report),
 * the first refusal after a non-blocking call broke it is that call's own failure. */
static ms_status refuse_if_broken(ms_comm *c, ms_coll_kind kind, bool report, ms_error *err) {
    char why[sizeof c->broken_why];
    pthread_mutex_lock(&c->mu);
    bool broken = c->broken, first = report && c->unreported;
    memcpy(why, c->broken_why, sizeof why);
    ms_error failure = c->async_failure;
    if (first) c->unreported = false;
    pthread_mutex_unlock(&c->mu);
    if (!broken) return MS_OK;
    if (first) {
        if (err) *err = failure;
        return failure.code;
    }
    char g[200];
    group_str(c, g, sizeof g);
    return ms_fail(err, MS_ERR_COMM,
                   "%s on communicator %s refused: the communicator is "
                   "broken since %s; recreate it",
                   ms_coll_name(kind), g, why);
}

/* What the flight recorder keeps of a call besides its kind and sequence number. */
typedef struct call_info {
    size_t bytes;
    int root; /* communicator rank, or -1 */
    const ms_p2p_op *ops;
    int nops;
} call_info;

/* Records call in the rank's flight recorder, as issued (and started unless queued). */
static void flight_issue(ms_comm *c, ms_comm_call *call, call_info info, bool started) {
    ms_flight_call fc = {.kind = call->kind,
                         .dtype = call->dtype,
                         .seq = call->seq,
                         .bytes = info.bytes,
                         .root = info.root >= 0 ? c->world_ranks[info.root] : -1,
                         .peer = info.nops ? c->world_ranks[info.ops[0].peer] : -1,
                         .p2p_send = info.nops && info.ops[0].kind == MS_P2P_SEND,
                         .n_p2p = info.nops};
    int64_t now = ms_now_ns();
    call->flight = ms_flight_issue(c->flight, &c->fdesc, &fc, now);
    if (started) ms_flight_start(c->flight, call->flight, now);
}

/* Records how call ended, with the world ranks a timeout named as missing. */
static void flight_end(ms_comm *c, const ms_comm_call *call, ms_status st) {
    int missing[MS_FLIGHT_MAX_MISSING];
    int n = 0;
    for (int i = 0; i < call->n_missing && n < MS_FLIGHT_MAX_MISSING; i++)
        missing[n++] = ms_comm_world_rank(c, call->missing[i]);
    ms_flight_end(c->flight, call->flight, st, missing, st == MS_ERR_TIMEOUT ? n : 0, ms_now_ns());
}

/* Starts a call on buffers of type dt: waits for the non-blocking calls before it, refuses on
 * a broken communicator, assigns seq and deadline, and records it. */
static ms_status call_begin_as(ms_comm *c, ms_coll_kind kind, ms_comm_dtype dt, call_info info,
                               ms_comm_call *call, ms_error *err) {
    memset(call, 0, sizeof *call);
    call->kind = kind;
    call->dtype = dt;
    drain(c);
    MS_CHECK(refuse_if_broken(c, kind, true, err));
    call->seq = ++c->seq;
    call->timeout_ns = c->timeout_ns;
    call->deadline_ns = ms_now_ns() + c->timeout_ns;
    flight_issue(c, call, info, true);
    return MS_OK;
}

/* A call that moves `bytes` of dt (the collectives but broadcast and p2p). */
static ms_status call_begin(ms_comm *c, ms_coll_kind kind, ms_comm_dtype dt, size_t bytes,
                            ms_comm_call *call, ms_error *err) {
    return call_begin_as(c, kind, dt, (call_info){bytes, -1, NULL, 0}, call, err);
}

/* Decorates a failure with op, group, seq and missing ranks, and marks the communicator
 * broken after a timeout or transport failure; a non-blocking call's failure (async) is kept
 * for the next call on the caller's thread, in the same step, so that no call sees the
 * communicator broken without it. */
static ms_status call_fail(ms_comm *c, const ms_comm_call *call, ms_status st, bool async,
                           ms_error *err) {
    char g[200];
    group_str(c, g, sizeof g);
    if (st == MS_ERR_TIMEOUT) {
        char miss[256] = "";
        size_t n = 0;
        for (int i = 0; i < call->n_missing && n + 24 < sizeof miss; i++)
            n += (size_t)snprintf(miss + n, sizeof miss - n, "%s%d (world %d)", i ? ", " : "",
                                  call->missing[i], ms_comm_world_rank(c, call->missing[i]));
        ms_fail(err, MS_ERR_TIMEOUT,
                "%s seq %lld on communicator %s (%s backend) timed out after %lld ms; "
                "ranks that did not arrive: %s%s%s",
                ms_coll_name(call->kind), (long long)call->seq, g, c->ops->name,
                (long long)(call->timeout_ns / 1000000), call->n_missing ? miss : "unknown",
                call->note[0] ? "; " : "", call->note);
    } else {
        ms_fail_wrap(err, st, "%s seq %lld on communicator %s (%s backend)",
                     ms_coll_name(call->kind), (long long)call->seq, g, c->ops->name);
    }
    if (st == MS_ERR_TIMEOUT || st == MS_ERR_COMM) {
        ms_flight_dump(c->flight, err ? err->msg : ms_status_str(st), NULL, 0);
        pthread_mutex_lock(&c->mu);
        c->broken = true;
        snprintf(c->broken_why, sizeof c->broken_why, "%s seq %lld failed (%s)",
                 ms_coll_name(call->kind), (long long)call->seq, ms_status_str(st));
        if (async && err) {
            c->unreported = true;
            c->async_failure = *err;
        }
        pthread_mutex_unlock(&c->mu);
    }
    return st;
}

/* What the observer is told about one call. */
typedef struct call_times {
    int64_t issue, start, end;
    bool async;
} call_times;

static void call_report(ms_comm *c, const ms_comm_call *call, ms_status st, call_times t,
                        size_t bytes, ms_reduce_op op, int root) {
    if (!c->observer) return;
    ms_comm_event ev = {
        .kind = call->kind,
        .comm = c,
        .seq = call->seq,
        .t_start_ns = t.start,
        .t_end_ns = t.end,
        .t_issue_ns = t.issue,
        .async = t.async,
        .bytes = bytes,
        .dtype = call->dtype,
        .op = op,
        .root = root,
        .p2p = call->p2p_ops,
        .n_p2p = call->n_p2p,
        .algo = call->algo ? call->algo : c->ops->name,
        .status = st,
    };
    c->observer(c->observer_user, &ev);
}

/* Finishes a blocking call: the failure decorated, the event emitted. */
static ms_status call_end(ms_comm *c, ms_comm_call *call, ms_status st, int64_t t0, size_t bytes,
                          ms_reduce_op op, int root, ms_error *err) {
    int64_t t1 = ms_now_ns();
    flight_end(c, call, st);
    if (st != MS_OK) call_fail(c, call, st, false, err);
    call_report(c, call, st, (call_times){t0, t0, t1, false}, bytes, op, root);
    return st;
}

static ms_status bad(ms_comm *c, ms_coll_kind kind, ms_error *err, const char *what) {
    return ms_fail(err, MS_ERR_INVALID, "%s on communicator '%s': %s", ms_coll_name(kind), c->name,
                   what);
}

static size_t sum_counts(const size_t *counts, int n) {
    size_t s = 0;
    for (int i = 0; i < n; i++) s += counts[i];
    return s;
}

/* Elements an all_to_all's buffer spans: the end of its furthest block. */
static size_t extent(const size_t *counts, const size_t *displs, int n) {
    size_t end = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] && displs[i] + counts[i] > end) end = displs[i] + counts[i];
    return end;
}

/* The element type: known, and one that can be reduced when `reduce`. */
static ms_status check_dtype(ms_comm *c, ms_coll_kind kind, ms_comm_dtype dt, bool reduce,
                             ms_error *err) {
    if ((unsigned)dt >= MS_COMM_DTYPE_COUNT) return bad(c, kind, err, "unknown element type");
    if (reduce && dt == MS_COMM_BYTES)
        return bad(c, kind, err, "raw bytes cannot be reduced; pass MS_COMM_F32 or MS_COMM_BF16");
    return MS_OK;
}

/* Argument checks shared by the blocking and non-blocking calls. */
static ms_status check_all_reduce(ms_comm *c, ms_comm_dtype dt, const void *send, const void *recv,
                                  size_t count, ms_reduce_op op, ms_error *err) {
    MS_CHECK(check_dtype(c, MS_COLL_ALL_REDUCE, dt, true, err));
    if ((unsigned)op >= MS_REDUCE_COUNT)
        return bad(c, MS_COLL_ALL_REDUCE, err, "unknown reduce op");
    if (count && (!send || !recv)) return bad(c, MS_COLL_ALL_REDUCE, err, "NULL buffer");
    return MS_OK;
}

static ms_status check_reduce_scatter(ms_comm *c, ms_comm_dtype dt, const void *send,
                                      const void *recv, const size_t *recv_counts, ms_reduce_op op,
                                      ms_error *err) {
    MS_CHECK(check_dtype(c, MS_COLL_REDUCE_SCATTER, dt, true, err));
    if ((unsigned)op >= MS_REDUCE_COUNT)
        return bad(c, MS_COLL_REDUCE_SCATTER, err, "unknown reduce op");
    if (!recv_counts) return bad(c, MS_COLL_REDUCE_SCATTER, err, "NULL recv_counts");
    size_t total = sum_counts(recv_counts, c->size);
    if ((total && !send) || (recv_counts[c->rank] && !recv))
        return bad(c, MS_COLL_REDUCE_SCATTER, err, "NULL buffer");
    if (send && send == recv && c->size > 1)
        return bad(c, MS_COLL_REDUCE_SCATTER, err, "in-place is not supported; use two buffers");
    return MS_OK;
}

static ms_status check_all_gather(ms_comm *c, ms_comm_dtype dt, const void *send, const void *recv,
                                  const size_t *counts, ms_error *err) {
    MS_CHECK(check_dtype(c, MS_COLL_ALL_GATHER, dt, false, err));
    if (!counts) return bad(c, MS_COLL_ALL_GATHER, err, "NULL counts");
    if ((counts[c->rank] && !send) || (sum_counts(counts, c->size) && !recv))
        return bad(c, MS_COLL_ALL_GATHER, err, "NULL buffer");
    return MS_OK;
}

ms_status ms_all_reduce_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv, size_t count,
                           ms_reduce_op op, ms_error *err) {
    MS_CHECK(check_all_reduce(c, dt, send, recv, count, op, err));
    ms_comm_call call;
    const size_t bytes = count * ms_comm_dtype_size(dt);
    MS_CHECK(call_begin(c, MS_COLL_ALL_REDUCE, dt, bytes, &call, err));
    stage s;
    stage_init(&s, c);
    stage_coll(&s, MS_COLL_ALL_REDUCE, dt, send, recv, count, NULL);
    int64_t t0 = ms_now_ns();
    ms_status st = stage_begin_routed(&s, &call, err);
    if (st == MS_OK)
        st = stage_ops_of(&s)->all_reduce(stage_ctx_of(&s), stage_ptr(&s, send),
                                          stage_ptr(&s, recv), count, op, &call, err);
    st = stage_end(&s, st, err);
    return call_end(c, &call, st, t0, bytes, op, -1, err);
}

ms_status ms_all_reduce(ms_comm *c, const float *send, float *recv, size_t count, ms_reduce_op op,
                        ms_error *err) {
    return ms_all_reduce_dt(c, MS_COMM_F32, send, recv, count, op, err);
}

ms_status ms_reduce_scatter_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                               const size_t *recv_counts, ms_reduce_op op, ms_error *err) {
    MS_CHECK(check_reduce_scatter(c, dt, send, recv, recv_counts, op, err));
    ms_comm_call call;
    const size_t bytes = sum_counts(recv_counts, c->size) * ms_comm_dtype_size(dt);
    MS_CHECK(call_begin(c, MS_COLL_REDUCE_SCATTER, dt, bytes, &call, err));
    stage s;
    stage_init(&s, c);
    stage_coll(&s, MS_COLL_REDUCE_SCATTER, dt, send, recv, 0, recv_counts);
    int64_t t0 = ms_now_ns();
    ms_status st = stage_begin_routed(&s, &call, err);
    if (st == MS_OK)
        st = stage_ops_of(&s)->reduce_scatter(stage_ctx_of(&s), stage_ptr(&s, send),
                                              stage_ptr(&s, recv), recv_counts, op, &call, err);
    st = stage_end(&s, st, err);
    return call_end(c, &call, st, t0, bytes, op, -1, err);
}

ms_status ms_reduce_scatter(ms_comm *c, const float *send, float *recv, const size_t *recv_counts,
                            ms_reduce_op op, ms_error *err) {
    return ms_reduce_scatter_dt(c, MS_COMM_F32, send, recv, recv_counts, op, err);
}

ms_status ms_all_gather_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                           const size_t *counts, ms_error *err) {
    MS_CHECK(check_all_gather(c, dt, send, recv, counts, err));
    ms_comm_call call;
    const size_t bytes = sum_counts(counts, c->size) * ms_comm_dtype_size(dt);
    MS_CHECK(call_begin(c, MS_COLL_ALL_GATHER, dt, bytes, &call, err));
    stage s;
    stage_init(&s, c);
    stage_coll(&s, MS_COLL_ALL_GATHER, dt, send, recv, 0, counts);
    int64_t t0 = ms_now_ns();
    ms_status st = stage_begin_routed(&s, &call, err);
    if (st == MS_OK)
        st = stage_ops_of(&s)->all_gather(stage_ctx_of(&s), stage_ptr(&s, send),
                                          stage_ptr(&s, recv), counts, &call, err);
    st = stage_end(&s, st, err);
    return call_end(c, &call, st, t0, bytes, MS_REDUCE_SUM, -1, err);
}

ms_status ms_all_gather(ms_comm *c, const float *send, float *recv, const size_t *counts,
                        ms_error *err) {
    return ms_all_gather_dt(c, MS_COMM_F32, send, recv, counts, err);
}

/* --- non-blocking calls ------------------------------------------------------------------ */

/* Runs request r on the calling thread (the progress thread, or the issuer when the backend
 * cannot progress asynchronously). Its deadline starts now: a queued call is not late. */
static void execute(ms_comm_request *r) {
    ms_comm *c = r->c;
    ms_comm_call *call = &r->call;
    const ms_comm_backend_ops *ops = stage_ops_of(&r->stage);
    void *ctx = stage_ctx_of(&r->stage);
    r->t0 = ms_now_ns();
    ms_flight_start(c->flight, call->flight, r->t0);
    r->st = refuse_if_broken(c, call->kind, false, &r->err);
    const bool ran = r->st == MS_OK; /* not refused: a failure is its own */
    if (ran) {
        call->deadline_ns = r->t0 + call->timeout_ns;
        switch (call->kind) {
            case MS_COLL_ALL_REDUCE:
                r->st = ops->all_reduce(ctx, r->send, r->recv, r->count, r->op, call, &r->err);
                break;
            case MS_COLL_REDUCE_SCATTER:
                r->st = ops->reduce_scatter(ctx, r->send, r->recv, r->counts, r->op, call, &r->err);
                break;
            default: /* MS_COLL_ALL_GATHER */
                r->st = ops->all_gather(ctx, r->send, r->recv, r->counts, call, &r->err);
                break;
        }
    }
    flight_end(c, call, r->st);
    if (ran && r->st != MS_OK) call_fail(c, call, r->st, true, &r->err);
    r->t1 = ms_now_ns();
}

/* Marks r executed and wakes its waiters (and blocking calls draining the queue). */
static void complete(ms_comm *c, ms_comm_request *r) {
    pthread_mutex_lock(&c->mu);
    r->done = true;
    c->in_flight--;
    pthread_cond_broadcast(&c->completed);
    pthread_mutex_unlock(&c->mu);
}

static _Thread_local bool tl_progress;

bool ms_comm_on_progress_thread(void) {
    return tl_progress;
}

/* The progress thread: executes queued requests in issue order until stopped. */
static void *progress_main(void *arg) {
    ms_comm *c = arg;
    tl_progress = true;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->q_head && !c->stopping) pthread_cond_wait(&c->wake, &c->mu);
        ms_comm_request *r = c->q_head;
        if (!r) break; /* stopping with an empty queue */
        c->q_head = r->next;
        if (!c->q_head) c->q_tail = NULL;
        pthread_mutex_unlock(&c->mu);
        execute(r);
        complete(c, r);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Joins the progress thread after it executed everything queued. */
static void stop_progress(ms_comm *c) {
    pthread_mutex_lock(&c->mu);
    bool joined = c->has_thread;
    c->stopping = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
    if (joined) pthread_join(c->thread, NULL);
}

/* Queues r (assigns its seq and issue time), or runs it here when the backend cannot run
 * calls off the caller's thread. */
static ms_comm_request *issue(ms_comm *c, ms_comm_request *r, ms_coll_kind kind, ms_comm_dtype dt,
                              ms_error *err) {
    r->c = c;
    r->call.kind = kind;
    r->call.dtype = dt;
    stage_init(&r->stage, c);
    stage_coll(&r->stage, kind, dt, r->send, r->recv, r->count, r->counts);
    ms_status st = refuse_if_broken(c, kind, true, err);
    if (st == MS_OK)
        st = stage_begin_routed(&r->stage, &r->call, err); /* what it reads, copied at issue */
    if (st != MS_OK) {
        stage_end(&r->stage, st, NULL);
        free(r->counts);
        free(r);
        return NULL;
    }
    void *send = stage_ptr(&r->stage, r->send), *recv = stage_ptr(&r->stage, r->recv);
    r->send = send, r->recv = recv;
    r->call.seq = ++c->seq;
    r->call.timeout_ns = c->timeout_ns;
    r->t_issue = ms_now_ns();
    flight_issue(c, &r->call, (call_info){r->bytes, -1, NULL, 0}, false);
    pthread_mutex_lock(&c->mu);
    c->in_flight++;
    const ms_comm_backend_ops *ops = stage_ops_of(&r->stage);
    bool async = ops->async_ok && ops->async_ok(stage_ctx_of(&r->stage));
    if (async) {
        if (!c->has_thread) {
            if (pthread_create(&c->thread, NULL, progress_main, c) != 0)
                async = false; /* no thread to spare: run it here */
            c->has_thread = async;
        }
    }
    if (async) {
        if (c->q_tail)
            c->q_tail->next = r;
        else
            c->q_head = r;
        c->q_tail = r;
        pthread_cond_signal(&c->wake);
    }
    pthread_mutex_unlock(&c->mu);
    if (!async) {
        execute(r);
        complete(c, r);
    }
    return r;
}

static size_t *copy_counts(const ms_comm *c, const size_t *counts) {
    size_t *out = xmalloc(sizeof(size_t) * (size_t)c->size);
    memcpy(out, counts, sizeof(size_t) * (size_t)c->size);
    return out;
}

ms_comm_request *ms_iall_reduce_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                                   size_t count, ms_reduce_op op, ms_error *err) {
    if (check_all_reduce(c, dt, send, recv, count, op, err) != MS_OK) return NULL;
    ms_comm_request *r = xcalloc(1, sizeof *r);
    *r = (ms_comm_request){.send = send, .recv = recv, .count = count, .op = op};
    r->bytes = count * ms_comm_dtype_size(dt);
    return issue(c, r, MS_COLL_ALL_REDUCE, dt, err);
}

ms_comm_request *ms_iall_reduce(ms_comm *c, const float *send, float *recv, size_t count,
                                ms_reduce_op op, ms_error *err) {
    return ms_iall_reduce_dt(c, MS_COMM_F32, send, recv, count, op, err);
}

ms_comm_request *ms_ireduce_scatter_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                                       const size_t *recv_counts, ms_reduce_op op, ms_error *err) {
    if (check_reduce_scatter(c, dt, send, recv, recv_counts, op, err) != MS_OK) return NULL;
    ms_comm_request *r = xcalloc(1, sizeof *r);
    *r = (ms_comm_request){.send = send, .recv = recv, .op = op};
    r->counts = copy_counts(c, recv_counts);
    r->bytes = sum_counts(recv_counts, c->size) * ms_comm_dtype_size(dt);
    return issue(c, r, MS_COLL_REDUCE_SCATTER, dt, err);
}

ms_comm_request *ms_ireduce_scatter(ms_comm *c, const float *send, float *recv,
                                    const size_t *recv_counts, ms_reduce_op op, ms_error *err) {
    return ms_ireduce_scatter_dt(c, MS_COMM_F32, send, recv, recv_counts, op, err);
}

ms_comm_request *ms_iall_gather_dt(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                                   const size_t *counts, ms_error *err) {
    if (check_all_gather(c, dt, send, recv, counts, err) != MS_OK) return NULL;
    ms_comm_request *r = xcalloc(1, sizeof *r);
    *r = (ms_comm_request){.send = send, .recv = recv, .op = MS_REDUCE_SUM};
    r->counts = copy_counts(c, counts);
    r->bytes = sum_counts(counts, c->size) * ms_comm_dtype_size(dt);
    return issue(c, r, MS_COLL_ALL_GATHER, dt, err);
}

ms_comm_request *ms_iall_gather(ms_comm *c, const float *send, float *recv, const size_t *counts,
                                ms_error *err) {
    return ms_iall_gather_dt(c, MS_COMM_F32, send, recv, counts, err);
}

/* Reports an executed request to the observer (on this, the waiting thread) and frees it. */
static ms_status finish(ms_comm_request *r, ms_error *err) {
    ms_comm *c = r->c;
    r->st = stage_end(&r->stage, r->st, &r->err); /* what it wrote, back on the device */
    ms_status st = r->st;
    if (st != MS_OK) {
        /* The first failure reported is the one that broke the communicator, even when the
         * caller waits first for a call that was refused because of it. */
        ms_error e = r->err;
        pthread_mutex_lock(&c->mu);
        if (c->unreported) {
            e = c->async_failure;
            c->unreported = false;
        }
        pthread_mutex_unlock(&c->mu);
        if (err) *err = e;
        st = e.code;
    }
    call_report(c, &r->call, r->st, (call_times){r->t_issue, r->t0, r->t1, true}, r->bytes, r->op,
                -1);
    free(r->counts);
    free(r);
    return st;
}

static ms_status p2p_advance(ms_comm_request *r, bool wait, bool *done, ms_error *err);

/* A waiter with nothing else to do drives the backend's progress itself where it has a
 * progress hook (MPI: the transfer then moves at the waiter's pace, not at the progress
 * thread's polls); otherwise it sleeps until the progress thread completes the request. */
ms_status ms_comm_wait(ms_comm_request *r, ms_error *err) {
    if (!r) return MS_OK;
    if (r->p2p) {
        bool done;
        return p2p_advance(r, true, &done, err);
    }
    ms_comm *c = r->c;
    pthread_mutex_lock(&c->mu);
    while (!r->done) {
        if (c->ops->progress && c->has_thread) {
            pthread_mutex_unlock(&c->mu);
            c->ops->progress(c->ctx);
            sched_yield();
            pthread_mutex_lock(&c->mu);
        } else {
            pthread_cond_wait(&c->completed, &c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return finish(r, err);
}

ms_status ms_comm_test(ms_comm_request *r, bool *done, ms_error *err) {
    *done = true;
    if (!r) return MS_OK;
    if (r->p2p) return p2p_advance(r, false, done, err);
    pthread_mutex_lock(&r->c->mu);
    *done = r->done;
    pthread_mutex_unlock(&r->c->mu);
    return *done ? finish(r, err) : MS_OK;
}

void ms_comm_progress(ms_comm *c) {
    if (c && c->ops->progress && ms_comm_in_flight(c) > 0) c->ops->progress(c->ctx);
}

int ms_comm_in_flight(ms_comm *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->in_flight;
    pthread_mutex_unlock(&c->mu);
    return n;
}

ms_status ms_all_to_all_dt(ms_comm *c, ms_comm_dtype dt, const void *send,
                           const size_t *send_counts, const size_t *send_displs, void *recv,
                           const size_t *recv_counts, const size_t *recv_displs, ms_error *err) {
    MS_CHECK(check_dtype(c, MS_COLL_ALL_TO_ALL, dt, false, err));
    if (!send_counts || !send_displs || !recv_counts || !recv_displs)
        return bad(c, MS_COLL_ALL_TO_ALL, err, "NULL counts or displacements");
    size_t sent = sum_counts(send_counts, c->size);
    if ((sent && !send) || (sum_counts(recv_counts, c->size) && !recv))
        return bad(c, MS_COLL_ALL_TO_ALL, err, "NULL buffer");
    if (send && send == recv && c->size > 1)
        return bad(c, MS_COLL_ALL_TO_ALL, err, "in-place is not supported; use two buffers");
    ms_comm_call call;
    const size_t bytes = sent * ms_comm_dtype_size(dt);
    MS_CHECK(call_begin(c, MS_COLL_ALL_TO_ALL, dt, bytes, &call, err));
    stage s;
    stage_init(&s, c);
    const size_t elt = ms_comm_dtype_size(dt);
    stage_add(&s, send, extent(send_counts, send_displs, c->size) * elt, true, false);
    /* Gaps between the blocks received keep what they held: copied in, too, if any. */
    const size_t span = extent(recv_counts, recv_displs, c->size);
    stage_add(&s, recv, span * elt, span != sum_counts(recv_counts, c->size), true);
    int64_t t0 = ms_now_ns();
    ms_status st = stage_begin_routed(&s, &call, err);
    if (st == MS_OK)
        st = stage_ops_of(&s)->all_to_all(stage_ctx_of(&s), stage_ptr(&s, send), send_counts,
                                          send_displs, stage_ptr(&s, recv), recv_counts,
                                          recv_displs, &call, err);
    st = stage_end(&s, st, err);
    return call_end(c, &call, st, t0, bytes, MS_REDUCE_SUM, -1, err);
}

ms_status ms_all_to_all(ms_comm *c, const float *send, const size_t *send_counts,
                        const size_t *send_displs, float *recv, const size_t *recv_counts,
                        const size_t *recv_displs, ms_error *err) {
    return ms_all_to_all_dt(c, MS_COMM_F32, send, send_counts, send_displs, recv, recv_counts,
                            recv_displs, err);
}

ms_status ms_broadcast_dt(ms_comm *c, ms_comm_dtype dt, void *buf, size_t count, int root,
                          ms_error *err) {
    MS_CHECK(check_dtype(c, MS_COLL_BROADCAST, dt, false, err));
    if (root < 0 || root >= c->size) return bad(c, MS_COLL_BROADCAST, err, "root out of range");
    if (count && !buf) return bad(c, MS_COLL_BROADCAST, err, "NULL buffer");
    ms_comm_call call;
    call_info info = {count * ms_comm_dtype_size(dt), root, NULL, 0};
    MS_CHECK(call_begin_as(c, MS_COLL_BROADCAST, dt, info, &call, err));
    stage s;
    stage_init(&s, c);
    stage_add(&s, buf, info.bytes, c->rank == root, c->rank != root);
    int64_t t0 = ms_now_ns();
    ms_status st = stage_begin_routed(&s, &call, err);
    if (st == MS_OK)
        st = stage_ops_of(&s)->broadcast(stage_ctx_of(&s), stage_ptr(&s, buf), count, root, &call,
                                         err);
    st = stage_end(&s, st, err);
    return call_end(c, &call, st, t0, count * ms_comm_dtype_size(dt), MS_REDUCE_SUM, root, err);
}

ms_status ms_broadcast(ms_comm *c, float *buf, size_t count, int root, ms_error *err) {
    return ms_broadcast_dt(c, MS_COMM_F32, buf, count, root, err);
}

ms_status ms_broadcast_bytes(ms_comm *c, void *buf, size_t nbytes, int root, ms_error *err) {
    return ms_broadcast_dt(c, MS_COMM_BYTES, buf, nbytes, root, err);
}

/* A batch's arguments; *bytes: what its sends carry. */
static ms_status check_p2p(ms_comm *c, ms_comm_dtype dt, const ms_p2p_op *ops, int nops,
                           size_t *bytes, ms_error *err) {
    MS_CHECK(check_dtype(c, MS_COLL_P2P, dt, false, err));
    if (nops < 0 || (nops && !ops)) return bad(c, MS_COLL_P2P, err, "bad op list");
    *bytes = 0;
    for (int i = 0; i < nops; i++) {
        if (ops[i].peer < 0 || ops[i].peer >= c->size || ops[i].peer == c->rank)
            return bad(c, MS_COLL_P2P, err, "peer out of range or self");
        if (ops[i].tag < 0 || ops[i].tag > 32767)
            return bad(c, MS_COLL_P2P, err, "tag outside 0..32767");
        if (ops[i].count && !ops[i].buf) return bad(c, MS_COLL_P2P, err, "NULL buffer");
        if (ops[i].kind == MS_P2P_SEND) *bytes += ops[i].count * ms_comm_dtype_size(dt);
    }
    return MS_OK;
}

/* The device buffers of a batch staged into s; a copy of ops for the host stand-ins (see
 * stage_ops), or NULL when none is device memory. */
static ms_p2p_op *stage_p2p(stage *s, ms_comm *c, ms_comm_dtype dt, const ms_p2p_op *ops,
                            int nops) {
    stage_init(s, c);
    for (int i = 0; i < nops; i++)
        stage_add(s, ops[i].buf, ops[i].count * ms_comm_dtype_size(dt), ops[i].kind == MS_P2P_SEND,
                  ops[i].kind == MS_P2P_RECV);
    if (!s->n) return NULL;
    ms_p2p_op *copy = xmalloc(sizeof *copy * (size_t)nops);
    memcpy(copy, ops, sizeof *copy * (size_t)nops);
    return copy;
}

/* After stage_begin: the batch the backend runs, the copy pointed at the stand-ins, or ops
 * itself when nothing is staged (copy NULL). */
static const ms_p2p_op *stage_ops(const stage *s, ms_p2p_op *copy, const ms_p2p_op *ops, int nops) {
    if (!copy) return ops;
    for (int i = 0; i < nops; i++) copy[i].buf = stage_ptr(s, copy[i].buf);
    return copy;
}

ms_status ms_p2p_dt(ms_comm *c, ms_comm_dtype dt, const ms_p2p_op *ops, int nops, ms_error *err) {
    size_t bytes;
    MS_CHECK(check_p2p(c, dt, ops, nops, &bytes, err));
    ms_comm_call call;
    MS_CHECK(call_begin_as(c, MS_COLL_P2P, dt, (call_info){bytes, -1, ops, nops}, &call, err));
    stage s;
    ms_p2p_op *host_ops = stage_p2p(&s, c, dt, ops, nops);
    int64_t t0 = ms_now_ns();
    ms_status st = stage_begin(&s, err);
    if (st == MS_OK) st = c->ops->p2p(c->ctx, stage_ops(&s, host_ops, ops, nops), nops, &call, err);
    st = stage_end(&s, st, err);
    free(host_ops);
    call.p2p_ops = ops;
    call.n_p2p = nops;
    return call_end(c, &call, st, t0, bytes, MS_REDUCE_SUM, -1, err);
}

/* Ends a point-to-point request: flight record, failure, observer (on this, the caller's
 * thread); frees it. */
static ms_status p2p_end(ms_comm_request *r, ms_status st, ms_error *err) {
    ms_comm *c = r->c;
    st = stage_end(&r->stage, st, &r->err); /* the receives, back on the device */
    r->t1 = ms_now_ns();
    flight_end(c, &r->call, st);
    if (st != MS_OK) call_fail(c, &r->call, st, false, &r->err);
    call_report(c, &r->call, st, (call_times){r->t_issue, r->t0, r->t1, true}, r->bytes,
                MS_REDUCE_SUM, -1);
    if (st != MS_OK && err) *err = r->err;
    free(r->ops);
    free(r);
    return st;
}

ms_comm_request *ms_ip2p_dt(ms_comm *c, ms_comm_dtype dt, const ms_p2p_op *ops, int nops,
                            ms_error *err) {
    size_t bytes;
    if (check_p2p(c, dt, ops, nops, &bytes, err) != MS_OK) return NULL;
    if (!c->ops->p2p_post) {
        ms_fail(err, MS_ERR_UNSUPPORTED,
                "non-blocking send/recv on communicator '%s': the %s backend has none; use "
                "ms_p2p",
                c->name, c->ops->name);
        return NULL;
    }
    if (refuse_if_broken(c, MS_COLL_P2P, true, err) != MS_OK) return NULL;
    ms_comm_request *r = xcalloc(1, sizeof *r);
    r->c = c;
    r->p2p = true;
    r->bytes = bytes;
    r->ops = stage_p2p(&r->stage, c, dt, ops, nops);
    if (!r->ops) {
        r->ops = xmalloc(sizeof *r->ops * (size_t)(nops ? nops : 1));
        if (nops) memcpy(r->ops, ops, sizeof *r->ops * (size_t)nops);
    }
    r->call = (ms_comm_call){.kind = MS_COLL_P2P,
                             .dtype = dt,
                             .seq = ++c->seq,
                             .timeout_ns = c->timeout_ns,
                             .p2p_ops = r->ops,
                             .n_p2p = nops};
    r->t_issue = r->t0 = ms_now_ns();
    r->call.deadline_ns = r->t0 + c->timeout_ns;
    flight_issue(c, &r->call, (call_info){bytes, -1, r->ops, nops}, true);
    ms_status st = stage_begin(&r->stage, &r->err); /* the sends, copied at posting */
    stage_ops(&r->stage, r->ops, r->ops, nops);
    if (st == MS_OK) st = c->ops->p2p_post(c->ctx, r->ops, nops, &r->call, &r->handle, &r->err);
    if (st != MS_OK) {
        p2p_end(r, st, err);
        return NULL;
    }
    return r;
}

ms_comm_request *ms_ip2p(ms_comm *c, const ms_p2p_op *ops, int nops, ms_error *err) {
    return ms_ip2p_dt(c, MS_COMM_F32, ops, nops, err);
}

/* Advances a point-to-point request (wait: to its end); ends it once done or failed. */
static ms_status p2p_advance(ms_comm_request *r, bool wait, bool *done, ms_error *err) {
    ms_status st = r->c->ops->p2p_poll(r->c->ctx, r->handle, wait, done, &r->call, &r->err);
    if (!*done && st == MS_OK) return MS_OK;
    *done = true;
    return p2p_end(r, st, err);
}

/* A batch of one operation. */
static ms_status p2p_one(ms_comm *c, ms_comm_dtype dt, ms_p2p_kind kind, void *buf, size_t count,
                         int peer, int tag, ms_error *err) {
    ms_p2p_op op = {kind, peer, buf, count, tag};
    return ms_p2p_dt(c, dt, &op, 1, err);
}

ms_status ms_send_dt(ms_comm *c, ms_comm_dtype dt, const void *buf, size_t count, int peer, int tag,
                     ms_error *err) {
    return p2p_one(c, dt, MS_P2P_SEND, (void *)buf, count, peer, tag, err);
}

ms_status ms_recv_dt(ms_comm *c, ms_comm_dtype dt, void *buf, size_t count, int peer, int tag,
                     ms_error *err) {
    return p2p_one(c, dt, MS_P2P_RECV, buf, count, peer, tag, err);
}

ms_status ms_p2p(ms_comm *c, const ms_p2p_op *ops, int nops, ms_error *err) {
    return ms_p2p_dt(c, MS_COMM_F32, ops, nops, err);
}

ms_status ms_send(ms_comm *c, const float *buf, size_t count, int peer, int tag, ms_error *err) {
    return p2p_one(c, MS_COMM_F32, MS_P2P_SEND, (void *)buf, count, peer, tag, err);
}

ms_status ms_recv(ms_comm *c, float *buf, size_t count, int peer, int tag, ms_error *err) {
    return p2p_one(c, MS_COMM_F32, MS_P2P_RECV, buf, count, peer, tag, err);
}

ms_status ms_p2p_bytes(ms_comm *c, const ms_p2p_op *ops, int nops, ms_error *err) {
    return ms_p2p_dt(c, MS_COMM_BYTES, ops, nops, err);
}

ms_status ms_send_bytes(ms_comm *c, const void *buf, size_t nbytes, int peer, int tag,
                        ms_error *err) {
    return p2p_one(c, MS_COMM_BYTES, MS_P2P_SEND, (void *)buf, nbytes, peer, tag, err);
}

ms_status ms_recv_bytes(ms_comm *c, void *buf, size_t nbytes, int peer, int tag, ms_error *err) {
    return p2p_one(c, MS_COMM_BYTES, MS_P2P_RECV, buf, nbytes, peer, tag, err);
}

/* The length header of ms_comm_bcast_msg: the message's length and root's cap, so that every
 * member refuses an oversized message alike, before any payload moves. */
typedef struct msg_header {
    uint64_t len, root_cap;
} msg_header;

ms_status ms_comm_bcast_msg(ms_comm *c, int root, void *buf, size_t *len, size_t cap,
                            ms_error *err) {
    if (!len) return bad(c, MS_COLL_BROADCAST, err, "message: NULL length");
    if (root < 0 || root >= c->size)
        return bad(c, MS_COLL_BROADCAST, err, "message: root out of range");
    const bool is_root = c->rank == root;
    if (is_root ? *len && !buf : cap && !buf)
        return bad(c, MS_COLL_BROADCAST, err, "message: NULL buffer");
    msg_header h = {0, 0};
    if (is_root)
        h = (msg_header){*len, cap};
    else
        *len = 0;
    MS_CHECK(ms_broadcast_bytes(c, &h, sizeof h, root, err));
    if (h.len > h.root_cap)
        return ms_fail(err, MS_ERR_INVALID,
                       "message broadcast on communicator '%s': rank %d's message of %llu bytes "
                       "exceeds its cap of %llu bytes; refused, nothing was sent",
                       c->name, root, (unsigned long long)h.len, (unsigned long long)h.root_cap);
    if (!h.len) return MS_OK;
    /* A member with a smaller cap still takes part, so that nobody is left waiting for it,
     * but receives into scratch and discards it rather than truncate. */
    const bool fits = is_root || h.len <= cap;
    void *dst = fits ? buf : xmalloc((size_t)h.len);
    ms_status st = ms_broadcast_bytes(c, dst, (size_t)h.len, root, err);
    if (!fits) {
        free(dst);
        if (st == MS_OK)
            st = ms_fail(err, MS_ERR_INVALID,
                         "message broadcast on communicator '%s': the message of %llu bytes from "
                         "rank %d exceeds this rank's (%d) cap of %zu bytes (rank %d's cap is "
                         "%llu); discarded, not truncated; every member must pass the same cap",
                         c->name, (unsigned long long)h.len, root, c->rank, cap, root,
                         (unsigned long long)h.root_cap);
    } else if (st == MS_OK && !is_root) {
        *len = (size_t)h.len;
    }
    return st;
}

ms_status ms_barrier(ms_comm *c, ms_error *err) {
    ms_comm_call call;
    MS_CHECK(call_begin(c, MS_COLL_BARRIER, MS_COMM_F32, 0, &call, err));
    int64_t t0 = ms_now_ns();
    ms_status st = c->ops->barrier(c->ctx, &call, err);
    return call_end(c, &call, st, t0, 0, MS_REDUCE_SUM, -1, err);
}

ms_status ms_comm_split(ms_comm *parent, int color, int key, const char *name, ms_comm **out,
                        ms_error *err) {
    *out = NULL;
    ms_comm_call call;
    MS_CHECK(call_begin(parent, MS_COLL_SPLIT, MS_COMM_F32, 0, &call, err));
    int64_t t0 = ms_now_ns();
    void *ctx = NULL;
    int size = 0, rank = -1;
    int *world = xmalloc(sizeof(int) * (size_t)parent->size);
    int *members = xmalloc(sizeof(int) * (size_t)parent->size);
    ms_status st =
        parent->ops->split(parent->ctx, color, key, &ctx, &size, &rank, members, &call, err);
    if (st == MS_OK && ctx) {
        /* Backends report members as parent ranks; translate to world ranks. */
        for (int i = 0; i < size; i++) world[i] = parent->world_ranks[members[i]];
        *out = ms_comm_wrap(parent->ops, ctx, rank, size, world, name);
        ms_comm_set_timeout_ms(*out, ms_comm_timeout_ms(parent));
        ms_comm_set_device(*out, parent->device);
    }
    free(world);
    free(members);
    return call_end(parent, &call, st, t0, 0, MS_REDUCE_SUM, -1, err);
}

typedef struct split_member {
    int key, parent;
} split_member;

static int split_member_cmp(const void *a, const void *b) {
    const split_member *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->parent > y->parent) - (x->parent < y->parent);
}

int ms_split_order(const int *color_key, int n, int color, int me, int *members, int *pos) {
    split_member *m = xmalloc(sizeof *m * (size_t)(n > 0 ? n : 1));
    int size = 0;
    for (int p = 0; p < n; p++)
        if (color_key[2 * p] == color) m[size++] = (split_member){color_key[2 * p + 1], p};
    qsort(m, (size_t)size, sizeof *m, split_member_cmp);
    *pos = -1;
    for (int i = 0; i < size; i++) {
        members[i] = m[i].parent;
        if (m[i].parent == me) *pos = i;
    }
    free(m);
    return size;
}

int ms_comm_blame(const int *suspects, const ms_peer_state *state, int n, bool all_arrived,
                  int *out) {
    bool any_silent = false;
    for (int i = 0; i < n; i++) any_silent |= state[i] == MS_PEER_SILENT;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (any_silent ? state[i] == MS_PEER_SILENT : !all_arrived && state[i] == MS_PEER_ANSWERED)
            out[k++] = suspects[i];
    return k;
}

/* nccl_profiler.c - meshscope's NCCL profiler plugin, v5 interface (see nccl_profiler.h).
 *
 * Tracking. NCCL gets an opaque handle per event it starts. Collectives and p2p calls (tasks)
 * and proxy operations live in slots of a static pool, claimed round-robin with a CAS (no
 * allocation, no lock on NCCL's threads; a slot is reused only after the whole pool has
 * gone round, which leaves late events of a finished task ample time to arrive). A
 * kernel-channel event needs no slot: its handle is its parent's slot address with the low
 * bit set, and it only folds its timers into the parent.
 *
 * Completion. A task's slot holds 1 + nChannels references when KernelCh events are active:
 * one dropped by the task's stopEvent (enqueued), one by each channel's stopEvent. NCCL
 * announces nChannels in the descriptor precisely so that plugins can gate completion this
 * way. The last one out builds the record (see the timing rules in the header), puts it in
 * the ring and frees the slot. Channels beyond the announced number are ignored rather than
 * let them touch a slot that may already be someone else's. Tasks whose channels never all
 * arrive are finished by finalize (counted in flushed_early).
 *
 * The ring is Vyukov's bounded MPMC queue: each cell has a sequence number that says whose
 * turn it is, producers and consumers claim positions with a CAS and never wait for each
 * other except on the one cell they claimed. Cells hold the sequence relative to their index
 * so that the zero-initialised static array is already a valid empty queue.
 */
#include "profiler/nccl_profiler.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/comm/comm.h" /* ms_coll_kind, ms_reduce_op (enums only: no link dependency) */

#define MS_NCCL_EXPORT __attribute__((visibility("default")))

#define POOL_SLOTS 4096  /* tasks and proxy ops in flight, all communicators together */
#define RING_CAP   16384 /* records waiting to be drained (~2.5 MB) */
#define PROBES     64    /* slots tried before an event is given up */

enum { NCCL_SUCCESS = 0, NCCL_INTERNAL_ERROR = 3 };
enum { NCCL_LOG_INFO = 3, NCCL_INIT = 0x1 }; /* ncclDebugLogLevel, ncclDebugLogSubSys */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the ms_now_ns clock, without linking the engine */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* --- pure functions ------------------------------------------------------------------- */

MS_NCCL_EXPORT size_t ms_nccl_type_size(const char *datatype) {
    static const struct {
        const char *name;
        size_t size;
    } types[] = {
        {"ncclInt8", 1},    {"ncclUint8", 1},    {"ncclFloat8e4m3", 1}, {"ncclFloat8e5m2", 1},
        {"ncclFloat16", 2}, {"ncclBfloat16", 2}, {"ncclInt32", 4},      {"ncclUint32", 4},
        {"ncclFloat32", 4}, {"ncclInt64", 8},    {"ncclUint64", 8},     {"ncclFloat64", 8},
    };
    if (!datatype) return 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(datatype, types[i].name)) return types[i].size;
    return 0;
}

MS_NCCL_EXPORT int ms_nccl_coll_kind(const char *func) {
    static const struct {
        const char *name;
        ms_coll_kind kind;
    } funcs[] = {
        {"AllReduce", MS_COLL_ALL_REDUCE},
        {"AllGather", MS_COLL_ALL_GATHER},
        {"ReduceScatter", MS_COLL_REDUCE_SCATTER},
        {"AlltoAll", MS_COLL_ALL_TO_ALL},
        {"Broadcast", MS_COLL_BROADCAST},
        {"Send", MS_COLL_P2P},
        {"Recv", MS_COLL_P2P},
        {"SendRecv", MS_COLL_P2P},
    };
    if (!func) return -1;
    for (size_t i = 0; i < sizeof funcs / sizeof funcs[0]; i++)
        if (!strcmp(func, funcs[i].name)) return (int)funcs[i].kind;
    return -1;
}

/* "RING" + "LL128" -> "ring/ll128", truncated to the event's field. */
static void algo_text(char *dst, size_t cap, const char *algo, const char *proto) {
    size_t n = 0;
    for (const char *s = algo; *s && n + 1 < cap; s++) dst[n++] = (char)tolower((unsigned char)*s);
    if (*proto && n + 1 < cap) dst[n++] = '/';
    for (const char *s = proto; *s && n + 1 < cap; s++) dst[n++] = (char)tolower((unsigned char)*s);
    dst[n] = '\0';
}

MS_NCCL_EXPORT bool ms_nccl_record_to_event(const ms_nccl_record *r, ms_event *out) {
    if (r->kind != MS_NCCL_COLL && r->kind != MS_NCCL_P2P) return false;
    const int kind = ms_nccl_coll_kind(r->func);
    if (kind < 0) return false;
    const bool p2p = r->kind == MS_NCCL_P2P;
    if (p2p && (kind != MS_COLL_P2P || !r->is_send)) return false;

    ms_event e;
    memset(&e, 0, sizeof e);
    e.kind = MS_EV_COLL;
    e.phase = MS_PHASE_OTHER;
    e.rank = r->rank;
    e.step = -1;
    e.t0_ns = r->t_start_ns;
    switch ((ms_nccl_timing)r->timing) {
        case MS_NCCL_T_GPU: {
            e.t1_ns = r->t_end_ns;
            const uint64_t gpu =
                r->gpu_end_ns > r->gpu_start_ns ? r->gpu_end_ns - r->gpu_start_ns : 0;
            if (gpu <= (uint64_t)INT64_MAX && e.t1_ns - (int64_t)gpu > e.t0_ns)
                e.t0_ns = e.t1_ns - (int64_t)gpu;
            break;
        }
        case MS_NCCL_T_HOST:
            e.t1_ns = r->t_end_ns;
            break;
        default:
            e.t1_ns = r->t_enqueued_ns;
            break;
    }
    if (e.t1_ns < e.t0_ns) e.t1_ns = e.t0_ns;

    ms_ev_coll *c = &e.u.coll;
    c->coll = (uint8_t)kind;
    c->reduce = MS_REDUCE_SUM;
    c->mesh_dim = -1;
    c->group = -1;
    c->seq = (int64_t)r->seq;
    const uint64_t elem = r->count * ms_nccl_type_size(r->datatype);
    const uint64_t n = r->nranks > 0 ? (uint64_t)r->nranks : 1;
    if (p2p) {
        c->group_size = 2;
        c->group_rank = 0;
        c->bytes = elem;
        ms_ev_strcpy(c->algo, sizeof c->algo, NULL, "send");
    } else {
        c->group_size = r->nranks;
        c->group_rank = r->rank;
        c->bytes = kind == MS_COLL_ALL_GATHER || kind == MS_COLL_REDUCE_SCATTER ||
                           kind == MS_COLL_ALL_TO_ALL
                       ? elem * n
                       : elem;
        algo_text(c->algo, sizeof c->algo, r->algo, r->proto);
        if (!c->algo[0]) ms_ev_strcpy(c->algo, sizeof c->algo, NULL, "nccl");
        c->root = kind == MS_COLL_BROADCAST && r->peer >= 0 ? r->peer : 0;
    }
    *out = e;
    return true;
}

/* --- the ring --------------------------------------------------------------------------- */

typedef struct cell {
    _Atomic size_t seq; /* Vyukov's sequence minus the cell's index */
    ms_nccl_record rec;
} cell;

static cell ring[RING_CAP];
static _Atomic size_t ring_enq, ring_deq;
static _Atomic uint64_t st_recorded, st_dropped_full, st_dropped_pool, st_flushed_early;
static _Atomic int64_t st_comms;

static void ring_put(const ms_nccl_record *r) {
    size_t pos = atomic_load_explicit(&ring_enq, memory_order_relaxed);
    for (;;) {
        const size_t i = pos & (RING_CAP - 1);
        cell *c = &ring[i];
        const size_t seq = atomic_load_explicit(&c->seq, memory_order_acquire) + i;
        const ptrdiff_t dif = (ptrdiff_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&ring_enq, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                c->rec = *r;
                atomic_store_explicit(&c->seq, pos + 1 - i, memory_order_release);
                atomic_fetch_add_explicit(&st_recorded, 1, memory_order_relaxed);
                return;
            }
        } else if (dif < 0) { /* full: NCCL must never wait for meshscope */
            atomic_fetch_add_explicit(&st_dropped_full, 1, memory_order_relaxed);
            return;
        } else {
            pos = atomic_load_explicit(&ring_enq, memory_order_relaxed);
        }
    }
}

static bool ring_get(ms_nccl_record *out) {
    size_t pos = atomic_load_explicit(&ring_deq, memory_order_relaxed);
    for (;;) {
        const size_t i = pos & (RING_CAP - 1);
        cell *c = &ring[i];
        const size_t seq = atomic_load_explicit(&c->seq, memory_order_acquire) + i;
        const ptrdiff_t dif = (ptrdiff_t)(seq - (pos + 1));
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&ring_deq, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                *out = c->rec;
                atomic_store_explicit(&c->seq, pos + RING_CAP - i, memory_order_release);
                return true;
            }
        } else if (dif < 0) {
            return false; /* empty */
        } else {
            pos = atomic_load_explicit(&ring_deq, memory_order_relaxed);
        }
    }
}

MS_NCCL_EXPORT size_t ms_nccl_profiler_drain_records(ms_nccl_record *out, size_t max) {
    size_t n = 0;
    while (n < max && ring_get(&out[n])) n++;
    return n;
}

MS_NCCL_EXPORT size_t ms_nccl_profiler_drain(ms_event *out, size_t max) {
    size_t n = 0;
    ms_nccl_record r;
    while (n < max && ring_get(&r))
        if (ms_nccl_record_to_event(&r, &out[n])) n++;
    return n;
}

MS_NCCL_EXPORT void ms_nccl_profiler_get_stats(ms_nccl_profiler_stats *out) {
    out->recorded = atomic_load(&st_recorded);
    out->dropped_full = atomic_load(&st_dropped_full);
    out->dropped_pool = atomic_load(&st_dropped_pool);
    out->flushed_early = atomic_load(&st_flushed_early);
    int64_t comms = atomic_load(&st_comms);
    out->comms = comms > 0 ? (uint64_t)comms : 0;
}

/* --- tracking ------------------------------------------------------------------------- */

typedef struct pctx {
    uint64_t comm_id;
    int rank, nranks;
    int mask; /* the activation mask given to NCCL */
} pctx;

typedef struct slot {
    _Alignas(64) _Atomic uint32_t busy;
    _Atomic int32_t refs;     /* tasks: 1 (enqueue) + announced channels still running */
    _Atomic int32_t channels; /* tasks: KernelCh events seen */
    const pctx *ctx;
    _Atomic int64_t t_end;   /* tasks: latest channel stop on the host; 0 if none */
    _Atomic uint64_t gpu_t0; /* tasks: earliest channel start, GPU timer; UINT64_MAX if none */
    _Atomic uint64_t gpu_t1; /* tasks: latest channel stop, GPU timer; 0 if none */
    ms_nccl_record rec;
} slot;

static slot pool[POOL_SLOTS];
static _Atomic size_t pool_cursor;

static slot *slot_claim(void) {
    for (int t = 0; t < PROBES; t++) {
        size_t i = atomic_fetch_add_explicit(&pool_cursor, 1, memory_order_relaxed) % POOL_SLOTS;
        uint32_t free_ = 0;
        if (atomic_compare_exchange_strong_explicit(&pool[i].busy, &free_, 1, memory_order_acquire,
                                                    memory_order_relaxed))
            return &pool[i];
    }
    atomic_fetch_add_explicit(&st_dropped_pool, 1, memory_order_relaxed);
    return NULL;
}

static void slot_release(slot *s) {
    atomic_store_explicit(&s->busy, 0, memory_order_release);
}

/* The task slot behind a handle NCCL hands back as a parent, or NULL if it is not one of
 * ours (NULL, another plugin's object, a slot that is no longer a live task). */
static slot *task_of(const void *h) {
    const uintptr_t u = (uintptr_t)h, base = (uintptr_t)pool;
    if (u < base || u >= base + sizeof pool || (u - base) % sizeof(slot)) return NULL;
    slot *s = (slot *)h;
    if (!atomic_load_explicit(&s->busy, memory_order_acquire)) return NULL;
    return s->rec.kind == MS_NCCL_COLL || s->rec.kind == MS_NCCL_P2P ? s : NULL;
}

static void atomic_min_u64(_Atomic uint64_t *a, uint64_t v) {
    uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v < cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

static void atomic_max_u64(_Atomic uint64_t *a, uint64_t v) {
    uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

static void atomic_max_i64(_Atomic int64_t *a, int64_t v) {
    int64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

static void copy_str(char *dst, size_t cap, const char *src) {
    ms_ev_strcpy(dst, cap, NULL, src ? src : "");
}

/* Builds the task's record from what its channels reported, queues it, frees the slot.
 * Called by whoever dropped the last reference (the acq_rel decrement makes every earlier
 * writer's fields visible here). */
static void task_finish(slot *s) {
    ms_nccl_record *r = &s->rec;
    if (!r->t_enqueued_ns) r->t_enqueued_ns = now_ns(); /* finished by finalize */
    const int64_t te = atomic_load_explicit(&s->t_end, memory_order_relaxed);
    const uint64_t g0 = atomic_load_explicit(&s->gpu_t0, memory_order_relaxed);
    const uint64_t g1 = atomic_load_explicit(&s->gpu_t1, memory_order_relaxed);
    if (te > 0 && g0 != UINT64_MAX && g1 > g0) {
        r->timing = MS_NCCL_T_GPU;
        r->t_end_ns = te;
        r->gpu_start_ns = g0;
        r->gpu_end_ns = g1;
    } else if (te > 0) {
        r->timing = MS_NCCL_T_HOST;
        r->t_end_ns = te;
    } else {
        r->timing = MS_NCCL_T_ENQUEUE;
        r->t_end_ns = r->t_enqueued_ns;
    }
    ring_put(r);
    slot_release(s);
}

static void task_unref(slot *s) {
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) task_finish(s);
}

static void start_task(const pctx *c, void **handle, const ms_nccl_event_descr_v5 *d) {
    slot *s = slot_claim();
    if (!s) return;
    ms_nccl_record *r = &s->rec;
    memset(r, 0, sizeof *r);
    r->rank = c->rank;
    r->nranks = c->nranks;
    r->comm_id = c->comm_id;
    r->t_start_ns = now_ns();
    if (d->type == MS_NCCL_PROFILE_COLL) {
        r->kind = MS_NCCL_COLL;
        r->seq = d->coll.seqNumber;
        r->count = d->coll.count;
        r->peer = d->coll.root;
        r->n_channels = d->coll.nChannels;
        copy_str(r->func, sizeof r->func, d->coll.func);
        copy_str(r->datatype, sizeof r->datatype, d->coll.datatype);
        copy_str(r->algo, sizeof r->algo, d->coll.algo);
        copy_str(r->proto, sizeof r->proto, d->coll.proto);
    } else {
        r->kind = MS_NCCL_P2P;
        r->count = d->p2p.count;
        r->peer = d->p2p.peer;
        r->n_channels = d->p2p.nChannels;
        r->is_send = d->p2p.func && !strcmp(d->p2p.func, "Send");
        copy_str(r->func, sizeof r->func, d->p2p.func);
        copy_str(r->datatype, sizeof r->datatype, d->p2p.datatype);
    }
    s->ctx = c;
    atomic_store_explicit(&s->t_end, 0, memory_order_relaxed);
    atomic_store_explicit(&s->gpu_t0, UINT64_MAX, memory_order_relaxed);
    atomic_store_explicit(&s->gpu_t1, 0, memory_order_relaxed);
    atomic_store_explicit(&s->channels, 0, memory_order_relaxed);
    const int chans = c->mask & MS_NCCL_PROFILE_KERNEL_CH ? r->n_channels : 0;
    atomic_store_explicit(&s->refs, 1 + chans, memory_order_release);
    *handle = s;
}

static void start_channel(void **handle, const ms_nccl_event_descr_v5 *d) {
    slot *p = task_of(d->parentObj);
    if (!p) return;
    /* More channels than announced would drop references the task never had. */
    if (atomic_fetch_add_explicit(&p->channels, 1, memory_order_relaxed) >= p->rec.n_channels)
        return;
    if (d->kernelCh.pTimer) atomic_min_u64(&p->gpu_t0, d->kernelCh.pTimer);
    *handle = (void *)((uintptr_t)p | 1u);
}

static void start_proxy(const pctx *c, void **handle, const ms_nccl_event_descr_v5 *d) {
    slot *s = slot_claim();
    if (!s) return;
    ms_nccl_record *r = &s->rec;
    memset(r, 0, sizeof *r);
    r->kind = MS_NCCL_PROXY_OP;
    r->timing = MS_NCCL_T_HOST;
    r->rank = c->rank;
    r->nranks = c->nranks;
    r->comm_id = c->comm_id;
    r->peer = d->proxyOp.peer;
    r->is_send = d->proxyOp.isSend != 0;
    r->n_channels = d->proxyOp.channelId;
    r->n_steps = d->proxyOp.nSteps;
    r->chunk_size = d->proxyOp.chunkSize;
    r->pid = (int32_t)d->proxyOp.pid;
    r->t_start_ns = now_ns();
    /* PXN: the parent lives in another process's address space; never dereference it. */
    r->remote = d->proxyOp.pid != getpid();
    const slot *p = r->remote ? NULL : task_of(d->parentObj);
    if (p) { /* best effort: the parent is normally still running while its proxy ops start */
        r->seq = p->rec.seq;
        memcpy(r->func, p->rec.func, sizeof r->func);
        memcpy(r->datatype, p->rec.datatype, sizeof r->datatype);
        r->count = p->rec.count;
    }
    s->ctx = c;
    atomic_store_explicit(&s->refs, 1, memory_order_release);
    *handle = s;
}

/* --- the v5 entry points (NCCL's threads) ----------------------------------------------- */

static int p_init(void **context, uint64_t comm_id, int *mask, const char *comm_name, int nnodes,
                  int nranks, int rank, ms_nccl_logger_t logfn) {
    (void)comm_name, (void)nnodes;
    pctx *c = calloc(1, sizeof *c);
    if (!c) return NCCL_INTERNAL_ERROR; /* NCCL then runs without the plugin */
    c->comm_id = comm_id;
    c->rank = rank;
    c->nranks = nranks;
    const char *px = getenv("MS_NCCL_PROFILER_PROXY");
    const bool proxy = !(px && px[0] == '0');
    c->mask = MS_NCCL_PROFILE_COLL | MS_NCCL_PROFILE_P2P | MS_NCCL_PROFILE_KERNEL_CH |
              (proxy ? MS_NCCL_PROFILE_PROXY_OP : 0);
    *mask = c->mask;
    *context = c;
    atomic_fetch_add(&st_comms, 1);
    if (logfn)
        logfn(NCCL_LOG_INFO, NCCL_INIT, __FILE__, __LINE__,
              "meshscope profiler: comm %llx rank %d/%d, events 0x%x", (unsigned long long)comm_id,
              rank, nranks, c->mask);
    return NCCL_SUCCESS;
}

static int p_start(void *context, void **handle, ms_nccl_event_descr_v5 *d) {
    if (!handle) return NCCL_SUCCESS;
    *handle = NULL;
    const pctx *c = context;
    if (!c || !d) return NCCL_SUCCESS;
    switch (d->type) {
        case MS_NCCL_PROFILE_COLL:
        case MS_NCCL_PROFILE_P2P:
            start_task(c, handle, d);
            break;
        case MS_NCCL_PROFILE_KERNEL_CH:
            start_channel(handle, d);
            break;
        case MS_NCCL_PROFILE_PROXY_OP:
            start_proxy(c, handle, d);
            break;
        default:
            break; /* not in our activation mask */
    }
    return NCCL_SUCCESS;
}

static int p_stop(void *handle) {
    if (!handle) return NCCL_SUCCESS;
    const uintptr_t u = (uintptr_t)handle;
    if (u & 1u) { /* a channel: fold its end into the task */
        slot *p = (slot *)(u & ~(uintptr_t)1);
        atomic_max_i64(&p->t_end, now_ns());
        task_unref(p);
        return NCCL_SUCCESS;
    }
    slot *s = handle;
    if (s->rec.kind == MS_NCCL_PROXY_OP) {
        s->rec.t_end_ns = now_ns();
        s->rec.t_enqueued_ns = s->rec.t_end_ns;
        ring_put(&s->rec);
        slot_release(s);
        return NCCL_SUCCESS;
    }
    s->rec.t_enqueued_ns = now_ns(); /* enqueued, not completed: channels say when it ends */
    task_unref(s);
    return NCCL_SUCCESS;
}

static int p_record_state(void *handle, int state, ms_nccl_state_args_v5 *args) {
    const uintptr_t u = (uintptr_t)handle;
    if (!(u & 1u) || state != MS_NCCL_STATE_KERNEL_CH_STOP || !args || !args->kernelCh.pTimer)
        return NCCL_SUCCESS;
    slot *p = (slot *)(u & ~(uintptr_t)1);
    atomic_max_u64(&p->gpu_t1, args->kernelCh.pTimer);
    return NCCL_SUCCESS;
}

/* NCCL has stopped this communicator's threads: finish what is still open, so that nothing
 * it enqueued is lost and no slot stays pinned by a context about to be freed. */
static int p_finalize(void *context) {
    pctx *c = context;
    if (!c) return NCCL_SUCCESS;
    for (size_t i = 0; i < POOL_SLOTS; i++) {
        slot *s = &pool[i];
        if (!atomic_load_explicit(&s->busy, memory_order_acquire) || s->ctx != c) continue;
        if (s->rec.kind == MS_NCCL_PROXY_OP) {
            slot_release(s);
        } else if (atomic_exchange_explicit(&s->refs, 0, memory_order_acq_rel) > 0) {
            atomic_fetch_add_explicit(&st_flushed_early, 1, memory_order_relaxed);
            task_finish(s);
        }
    }
    free(c);
    atomic_fetch_sub(&st_comms, 1);
    return NCCL_SUCCESS;
}

MS_NCCL_EXPORT const ms_nccl_profiler_v5 ncclProfiler_v5 = {
    .name = "meshscope",
    .init = p_init,
    .startEvent = p_start,
    .stopEvent = p_stop,
    .recordEventState = p_record_state,
    .finalize = p_finalize,
};

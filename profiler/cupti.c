/* cupti.c - the CUPTI activity collector (see cupti.h). Built only with CUPTI (MS_HAVE_CUPTI).
 *
 * Buffers. Each buffer is one allocation: a small header of ours (queue link, valid size,
 * context and stream) followed by the BUF_BYTES that CUPTI fills. The completion callback
 * therefore queues a buffer without allocating anything, under q_mu only, and returns.
 *
 * Drains (flush thread, ms_cupti_flush, ms_cupti_stop) run under drain_mu: they take the
 * whole queue, read the external-correlation records of every buffer first (an API record
 * and the kernel it launched may sit in different buffers of the same drain), then convert
 * and push. The correlation table is direct-mapped by CUPTI correlation id (ids increase by
 * one per API call), so it remembers the last CORR_SLOTS calls without allocating; a kernel
 * whose launch is older than that, or whose launch record arrives in a later drain, loses
 * its external id (the event is still recorded, without "#corr=").
 *
 * Locks: q_mu is the only lock the CUPTI callback takes, and no CUPTI function is ever
 * called while q_mu is held. drain_mu is held across CUPTI parsing calls, but the callback
 * never takes it, so no cycle with CUPTI's internal locks is possible.
 */
#include "profiler/cupti.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/comm.h" /* ms_now_ns */

#define BUF_BYTES            ((size_t)4 << 20) /* Kineto uses 1-10 MB; 4 MB holds ~20k kernels */
#define BUF_HDR              64                /* keeps CUPTI's part 8-byte (here 64) aligned */
#define CORR_SLOTS           ((size_t)1 << 16)
#define OFFSET_ROUNDS_START  16
#define OFFSET_ROUNDS_DRAIN  4
#define OFFSET_HYSTERESIS_NS 1000

typedef struct buf_hdr {
    struct buf_hdr *next;
    size_t valid;
    CUcontext ctx;
    uint32_t stream;
} buf_hdr;
_Static_assert(sizeof(buf_hdr) <= BUF_HDR, "the buffer header must fit in front of CUPTI's part");

static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
};
#define N_KINDS (sizeof kinds / sizeof kinds[0])

typedef struct corr_slot {
    uint32_t corr; /* CUPTI correlation id of an API call */
    uint64_t ext;  /* the id pushed around it */
} corr_slot;

static struct collector {
    _Atomic bool running;
    pthread_mutex_t life_mu; /* serialises start and stop */

    pthread_mutex_t q_mu; /* the completed-buffer queue; the only lock the callback takes */
    buf_hdr *q_head, *q_tail;

    pthread_mutex_t drain_mu; /* one drain at a time: the recorder sees one writer */
    ms_recorder *rec;         /* NULL when stopped: drains then only free buffers */
    corr_slot corr[CORR_SLOTS];

    pthread_mutex_t tick_mu; /* the flush thread's timer */
    pthread_cond_t wake;
    bool stop_req;
    int flush_ms;
    pthread_t thread;

    _Atomic int64_t offset_ns, uncertainty_ns;
    _Atomic uint64_t buffers, records, events, cupti_dropped, incomplete, buffer_failures;
} g = {
    .life_mu = PTHREAD_MUTEX_INITIALIZER,
    .q_mu = PTHREAD_MUTEX_INITIALIZER,
    .drain_mu = PTHREAD_MUTEX_INITIALIZER,
    .tick_mu = PTHREAD_MUTEX_INITIALIZER,
};

/* --- errors -------------------------------------------------------------------------- */

static ms_status cupti_check(CUptiResult r, const char *call, const char *file, int line,
                             ms_status code, ms_error *err) {
    if (r == CUPTI_SUCCESS) return MS_OK;
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
    return ms_fail(err, code, "cupti: %s failed: %s (error %d) at %s:%d", call, s, (int)r, file,
                   line);
}

/* Evaluates a CUPTI call; on failure records "<call> failed: <CUPTI's words> at file:line"
 * with status `code` in err. Yields an ms_status. */
#define CUPTI_CALL(call, code, err) cupti_check((call), #call, __FILE__, __LINE__, (code), (err))

/* --- clocks -------------------------------------------------------------------------- */

/* offset = ms_now_ns - CUPTI time, from the tightest of `rounds` bracketed reads: the CUPTI
 * read happened somewhere in [a, b], so the midpoint is off by at most (b - a) / 2. */
static ms_status measure_offset(int rounds, int64_t *offset, int64_t *uncertainty, ms_error *err) {
    int64_t best = INT64_MAX;
    for (int i = 0; i < rounds; i++) {
        uint64_t c = 0;
        int64_t a = ms_now_ns();
        MS_CHECK(CUPTI_CALL(cuptiGetTimestamp(&c), MS_ERR_UNSUPPORTED, err));
        int64_t b = ms_now_ns();
        if (b - a < best) {
            best = b - a;
            *offset = a + (b - a) / 2 - (int64_t)c;
        }
    }
    *uncertainty = best / 2;
    return MS_OK;
}

/* At each drain: follow slow drift (CUPTI's clock may be slewed by NTP), but ignore both
 * sub-microsecond jitter and measurements that were themselves too noisy to trust. */
static void recheck_offset(void) {
    int64_t off = 0, unc = 0;
    if (measure_offset(OFFSET_ROUNDS_DRAIN, &off, &unc, NULL) != MS_OK) return;
    int64_t cur = atomic_load(&g.offset_ns);
    int64_t moved = off > cur ? off - cur : cur - off;
    if (moved > OFFSET_HYSTERESIS_NS && unc < OFFSET_HYSTERESIS_NS) {
        atomic_store(&g.offset_ns, off);
        atomic_store(&g.uncertainty_ns, unc);
    }
}

/* --- CUPTI buffer callbacks (CUPTI's threads) ----------------------------------------- */

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    uint8_t *p = aligned_alloc(BUF_HDR, BUF_HDR + BUF_BYTES);
    if (!p) {
        /* CUPTI drops the records it had no room for and counts them. */
        atomic_fetch_add(&g.buffer_failures, 1);
        *buffer = NULL;
        *size = 0;
    } else {
        *buffer = p + BUF_HDR;
        *size = BUF_BYTES;
    }
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)size;
    if (!buffer) return;
    buf_hdr *h = (buf_hdr *)(void *)(buffer - BUF_HDR);
    h->next = NULL;
    h->valid = valid;
    h->ctx = ctx;
    h->stream = stream;
    atomic_fetch_add(&g.buffers, 1);
    /* Only queue: parsing happens in drains, outside CUPTI's callback. */
    pthread_mutex_lock(&g.q_mu);
    if (g.q_tail)
        g.q_tail->next = h;
    else
        g.q_head = h;
    g.q_tail = h;
    pthread_mutex_unlock(&g.q_mu);
}

static void free_list(buf_hdr *h) {
    while (h) {
        buf_hdr *next = h->next;
        free(h);
        h = next;
    }
}

/* --- records -> events (drain_mu held) ------------------------------------------------ */

static uint8_t *payload(buf_hdr *h) {
    return (uint8_t *)h + BUF_HDR;
}

static uint64_t corr_lookup(uint32_t corr) {
    const corr_slot *s = &g.corr[corr & (CORR_SLOTS - 1)];
    return corr && s->corr == corr ? s->ext : 0;
}

static void push_op(ms_ev_gpu kind, const char *opname, const char *name, uint64_t ext,
                    uint64_t start, uint64_t end, double bytes, uint32_t device, uint32_t stream) {
    if (start == 0 && end == 0) { /* CUPTI's "no timestamps": still running at a forced flush */
        atomic_fetch_add(&g.incomplete, 1);
        return;
    }
    const int64_t off = atomic_load_explicit(&g.offset_ns, memory_order_relaxed);
    ms_event e;
    memset(&e, 0, sizeof e);
    e.kind = MS_EV_OP;
    e.phase = MS_PHASE_OTHER;
    e.t0_ns = (int64_t)start + off;
    e.t1_ns = end >= start ? (int64_t)end + off : e.t0_ns;
    e.u.op.op = -1; /* not an engine op: the GPU work is tied to one through corr */
    ms_ev_strcpy(e.u.op.name, sizeof e.u.op.name, NULL, name);
    ms_ev_strcpy(e.u.op.opname, sizeof e.u.op.opname, NULL, opname);
    e.u.op.bytes = bytes;
    e.u.op.corr = ext;
    e.u.op.gpu = (uint8_t)kind;
    e.u.op.device = device;
    e.u.op.stream = stream;
    ms_recorder_push(g.rec, &e);
    atomic_fetch_add(&g.events, 1);
}

static const char *memcpy_name(uint8_t kind) {
    static const char *const names[] = {
        [CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN] = "memcpy", [CUPTI_ACTIVITY_MEMCPY_KIND_HTOD] = "HtoD",
        [CUPTI_ACTIVITY_MEMCPY_KIND_DTOH] = "DtoH",      [CUPTI_ACTIVITY_MEMCPY_KIND_HTOA] = "HtoA",
        [CUPTI_ACTIVITY_MEMCPY_KIND_ATOH] = "AtoH",      [CUPTI_ACTIVITY_MEMCPY_KIND_ATOA] = "AtoA",
        [CUPTI_ACTIVITY_MEMCPY_KIND_ATOD] = "AtoD",      [CUPTI_ACTIVITY_MEMCPY_KIND_DTOA] = "DtoA",
        [CUPTI_ACTIVITY_MEMCPY_KIND_DTOD] = "DtoD",      [CUPTI_ACTIVITY_MEMCPY_KIND_HTOH] = "HtoH",
        [CUPTI_ACTIVITY_MEMCPY_KIND_PTOP] = "PtoP",
    };
    return kind < sizeof names / sizeof names[0] && names[kind] ? names[kind] : "memcpy";
}

static const char *sync_name(CUpti_ActivitySynchronizationType t) {
    switch (t) {
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE:
            return "event_sync";
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT:
            return "stream_wait_event";
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE:
            return "stream_sync";
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE:
            return "context_sync";
        default:
            return "sync";
    }
}

/* "cudaMemcpy_v3020" -> "cudaMemcpy": the version tag is noise in a timeline. */
static void api_name(CUpti_CallbackDomain domain, uint32_t cbid, char *out, size_t cap) {
    const char *s = NULL;
    if (cuptiGetCallbackName(domain, cbid, &s) != CUPTI_SUCCESS || !s) {
        snprintf(out, cap, "%s#%u", domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "cuda" : "cu", cbid);
        return;
    }
    ms_ev_strcpy(out, cap, NULL, s);
    char *v = strstr(out, "_v");
    if (v && v[2] >= '0' && v[2] <= '9' && strspn(v + 2, "0123456789") == strlen(v + 2)) *v = '\0';
}

/* Calls fn on every record of the buffer; stops at the end or at a malformed record. */
static void for_each_record(buf_hdr *h, void (*fn)(const CUpti_Activity *)) {
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(payload(h), h->valid, &r) == CUPTI_SUCCESS) fn(r);
}

static void note_correlation(const CUpti_Activity *r) {
    if (r->kind != CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) return;
    const CUpti_ActivityExternalCorrelation *x = (const void *)r;
    if (x->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) return;
    corr_slot *s = &g.corr[x->correlationId & (CORR_SLOTS - 1)];
    s->corr = x->correlationId;
    s->ext = x->externalId;
}

static void convert(const CUpti_Activity *r) {
    atomic_fetch_add(&g.records, 1);
    switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
            /* The fields read here sit in the prefix that every Kernel record version shares. */
            const CUpti_ActivityKernel10 *k = (const void *)r;
            push_op(MS_GPU_KERNEL, "cuda_kernel", k->name ? k->name : "kernel",
                    corr_lookup(k->correlationId), k->start, k->end, 0.0, k->deviceId, k->streamId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy6 *m = (const void *)r;
            uint64_t ext = corr_lookup(m->correlationId);
            if (!ext) ext = corr_lookup(m->runtimeCorrelationId);
            push_op(MS_GPU_MEMCPY, "cuda_memcpy", memcpy_name(m->copyKind), ext, m->start, m->end,
                    (double)m->bytes, m->deviceId, m->streamId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset4 *m = (const void *)r;
            push_op(MS_GPU_MEMSET, "cuda_memset", "memset", corr_lookup(m->correlationId), m->start,
                    m->end, (double)m->bytes, m->deviceId, m->streamId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            const CUpti_ActivityAPI *a = (const void *)r;
            const bool rt = r->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
            char name[MS_EV_NAME_MAX];
            api_name(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, name,
                     sizeof name);
            push_op(MS_GPU_API, rt ? "cuda_runtime" : "cuda_driver", name,
                    corr_lookup(a->correlationId), a->start, a->end, 0.0, 0, 0);
            break;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
            const CUpti_ActivitySynchronization2 *s = (const void *)r;
            push_op(MS_GPU_API, "cuda_sync", sync_name(s->type), corr_lookup(s->correlationId),
                    s->start, s->end, 0.0, 0, 0);
            break;
        }
        default: /* external correlation (read in the first pass) and kinds we did not enable */
            break;
    }
}

static void drain(void) {
    pthread_mutex_lock(&g.drain_mu);
    /* Taken under drain_mu so that concurrent drains push buffers in completion order. */
    pthread_mutex_lock(&g.q_mu);
    buf_hdr *list = g.q_head;
    g.q_head = g.q_tail = NULL;
    pthread_mutex_unlock(&g.q_mu);
    if (list && g.rec) {
        recheck_offset();
        for (buf_hdr *h = list; h; h = h->next) for_each_record(h, note_correlation);
        for (buf_hdr *h = list; h; h = h->next) {
            for_each_record(h, convert);
            size_t dropped = 0;
            if (cuptiActivityGetNumDroppedRecords(h->ctx, h->stream, &dropped) == CUPTI_SUCCESS)
                atomic_fetch_add(&g.cupti_dropped, dropped);
        }
    }
    pthread_mutex_unlock(&g.drain_mu);
    free_list(list);
}

/* --- the flush thread ---------------------------------------------------------------- */

static void *flush_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g.tick_mu);
    while (!g.stop_req) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += g.flush_ms / 1000;
        until.tv_nsec += (long)(g.flush_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        while (!g.stop_req && pthread_cond_timedwait(&g.wake, &g.tick_mu, &until) != ETIMEDOUT) {
        }
        if (g.stop_req) break;
        pthread_mutex_unlock(&g.tick_mu);
        /* Default flush: only buffers whose records are all complete, so nothing is lost;
         * a failure here has no one to report to and the next tick tries again. */
        cuptiActivityFlushAll(0);
        drain();
        pthread_mutex_lock(&g.tick_mu);
    }
    pthread_mutex_unlock(&g.tick_mu);
    return NULL;
}

/* --- API ----------------------------------------------------------------------------- */

static void reset_counters(void) {
    atomic_store(&g.buffers, 0);
    atomic_store(&g.records, 0);
    atomic_store(&g.events, 0);
    atomic_store(&g.cupti_dropped, 0);
    atomic_store(&g.incomplete, 0);
    atomic_store(&g.buffer_failures, 0);
}

static ms_status start_locked(ms_recorder *gpu_rec, int flush_ms, ms_error *err) {
    if (atomic_load(&g.running))
        return ms_fail(err, MS_ERR_INVALID,
                       "cupti: a collector is already running in this process (CUPTI allows one "
                       "activity subscriber); stop it first");
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "cupti: no usable CUDA device (%s)",
                       cudaGetErrorString(ce));
    if (n <= 0) return ms_fail(err, MS_ERR_UNSUPPORTED, "cupti: no CUDA device present");

    /* Buffers CUPTI returned after the previous stop belong to no one: free them. */
    pthread_mutex_lock(&g.drain_mu);
    pthread_mutex_lock(&g.q_mu);
    buf_hdr *stale = g.q_head;
    g.q_head = g.q_tail = NULL;
    pthread_mutex_unlock(&g.q_mu);
    memset(g.corr, 0, sizeof g.corr);
    pthread_mutex_unlock(&g.drain_mu);
    free_list(stale);
    reset_counters();

    int64_t off = 0, unc = 0;
    MS_CHECK(measure_offset(OFFSET_ROUNDS_START, &off, &unc, err));
    atomic_store(&g.offset_ns, off);
    atomic_store(&g.uncertainty_ns, unc);

    MS_CHECK(CUPTI_CALL(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
                        MS_ERR_UNSUPPORTED, err));
    ms_status st = MS_OK;
    size_t enabled = 0;
    for (; enabled < N_KINDS; enabled++)
        MS_CHECK_GOTO(CUPTI_CALL(cuptiActivityEnable(kinds[enabled]), MS_ERR_UNSUPPORTED, err), st,
                      undo);

    pthread_mutex_lock(&g.drain_mu);
    g.rec = gpu_rec;
    pthread_mutex_unlock(&g.drain_mu);

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the timer must not jump with the wall */
    pthread_cond_init(&g.wake, &ca);
    pthread_condattr_destroy(&ca);
    g.stop_req = false;
    g.flush_ms = flush_ms;
    atomic_store(&g.running, true);
    int rc = pthread_create(&g.thread, NULL, flush_main, NULL);
    if (rc != 0) {
        atomic_store(&g.running, false);
        pthread_cond_destroy(&g.wake);
        st = ms_fail(err, rc == EAGAIN ? MS_ERR_NOMEM : MS_ERR_INTERNAL,
                     "cupti: cannot start the flush thread: %s", strerror(rc));
        goto undo;
    }
    pthread_setname_np(g.thread, "ms-cupti");
    return MS_OK;

undo:
    while (enabled-- > 0) cuptiActivityDisable(kinds[enabled]);
    pthread_mutex_lock(&g.drain_mu);
    g.rec = NULL;
    pthread_mutex_unlock(&g.drain_mu);
    return st;
}

ms_status ms_cupti_start(ms_recorder *gpu_rec, int flush_ms, ms_error *err) {
    if (!gpu_rec) return ms_fail(err, MS_ERR_INVALID, "cupti: no recorder given");
    if (flush_ms < 1 || flush_ms > 60000)
        return ms_fail(err, MS_ERR_INVALID,
                       "cupti: flush period %d ms is out of range; use 1 .. 60000 (100 is "
                       "a good default)",
                       flush_ms);
    pthread_mutex_lock(&g.life_mu);
    ms_status st = start_locked(gpu_rec, flush_ms, err);
    pthread_mutex_unlock(&g.life_mu);
    return st;
}

ms_status ms_cupti_flush(ms_error *err) {
    if (!atomic_load(&g.running)) return MS_OK;
    ms_status st = CUPTI_CALL(cuptiActivityFlushAll(0), MS_ERR_INTERNAL, err);
    drain(); /* whatever did arrive is still worth converting */
    return st;
}

void ms_cupti_stop(void) {
    pthread_mutex_lock(&g.life_mu);
    if (!atomic_load(&g.running)) {
        pthread_mutex_unlock(&g.life_mu);
        return;
    }
    pthread_mutex_lock(&g.tick_mu);
    g.stop_req = true;
    pthread_cond_signal(&g.wake);
    pthread_mutex_unlock(&g.tick_mu);
    pthread_join(g.thread, NULL);
    pthread_cond_destroy(&g.wake);

    atomic_store(&g.running, false);
    for (size_t i = N_KINDS; i-- > 0;) cuptiActivityDisable(kinds[i]);
    /* Forced: hand over every buffer, even those with records still in flight (they are
     * dropped as incomplete); this is the last chance before the recorder is let go. */
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    drain();
    pthread_mutex_lock(&g.drain_mu);
    g.rec = NULL;
    pthread_mutex_unlock(&g.drain_mu);
    pthread_mutex_unlock(&g.life_mu);
}

/* Per thread: how deep the brackets are, and which levels really pushed into CUPTI (a push
 * made while no collector ran was skipped, and its pop must be skipped too). */
static _Thread_local unsigned corr_depth;
static _Thread_local uint64_t corr_pushed;

void ms_cupti_push_correlation(uint64_t id) {
    unsigned level = corr_depth++;
    if (level >= 64 || !atomic_load_explicit(&g.running, memory_order_relaxed)) return;
    if (cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id) ==
        CUPTI_SUCCESS)
        corr_pushed |= (uint64_t)1 << level;
}

void ms_cupti_pop_correlation(void) {
    if (corr_depth == 0) return; /* unbalanced pop: ignore rather than corrupt CUPTI's stack */
    unsigned level = --corr_depth;
    if (level >= 64 || !(corr_pushed & ((uint64_t)1 << level))) return;
    corr_pushed &= ~((uint64_t)1 << level);
    uint64_t last = 0;
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

void ms_cupti_get_stats(ms_cupti_stats *out) {
    out->buffers = atomic_load(&g.buffers);
    out->records = atomic_load(&g.records);
    out->events = atomic_load(&g.events);
    out->cupti_dropped = atomic_load(&g.cupti_dropped);
    out->incomplete = atomic_load(&g.incomplete);
    out->buffer_failures = atomic_load(&g.buffer_failures);
    out->clock_offset_ns = atomic_load(&g.offset_ns);
    out->clock_uncertainty_ns = atomic_load(&g.uncertainty_ns);
}

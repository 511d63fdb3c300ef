/* comm_threads.c - the threads backend: every rank is a thread of this process, so a
 * collective is a couple of barriers around direct loads and stores of the peers' buffers.
 *
 * Collectives ("shm-direct"): each rank publishes its buffer pointers in its slot of the
 * group and enters barrier 1; then it reads (or writes) its peers' buffers directly; then it
 * enters barrier 2, so that nobody returns (and lets its caller reuse a buffer) while a
 * peer still touches it. The ranks share the work: for all_reduce, rank i reduces chunk i of
 * every send buffer and stores the result straight into chunk i of every recv buffer.
 *
 * Barriers: one arrival counter per group that only grows; barrier number k (counted per
 * rank, every rank runs the same sequence) completes when the counter reaches k*n. Waiting
 * spins briefly, then yields, then sleeps on a futex, so oversubscribed ranks progress.
 *
 * Timeouts: a rank whose deadline passes sets the counter's poison bit, but only while the
 * barrier is still incomplete, and arrivals never add to a poisoned counter; so either
 * every member passes a barrier or none does, and a late rank fails on arrival without
 * touching any buffer. A poisoned group stays poisoned: every later call on it fails.
 *
 * Point-to-point ("shm-mailbox"): a sender posts each send (pointer, count, element type,
 * tag, sequence number) into its mailbox for the receiver; the receiver claims a matching
 * entry, copies straight from the sender's buffer and frees the entry; the sender returns
 * once all of its entries are free. All sends of a batch are posted before anything waits,
 * which makes every pattern within a batch deadlock-free.
 */
#include "engine/comm/comm_threads.h"

#include <limits.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sched.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Copies use `rep movsb` on x86 (see copy_bytes), except under sanitizers, which see only
 * what goes through memcpy. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MS_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MS_SANITIZED 1
#endif
#if (defined(__x86_64__) || defined(__i386__)) && !defined(MS_SANITIZED)
#define USE_REP_MOVSB 1
#endif

#include "engine/comm/comm_impl.h"
#include "engine/core/xalloc.h"

#define LINE 64
/* Reductions run in sub-chunks that stay in L1 while every peer's input is added. */
#define SUB_FLOATS 4096
/* all_gather pushes its block in sub-chunks of SUB_FLOATS, or of BIG_SUB_FLOATS (a quarter
 * of L2) when the call gathers BIG_BYTES or more: measured faster at 16-64 MiB. */
#define BIG_SUB_FLOATS 65536
#define BIG_BYTES      (8u << 20)
/* Copies from this size on use `rep movsb` (see copy_bytes). */
#define REP_MIN_BYTES (64u << 10)

#define SPIN_ITERS   200 /* busy polls before yielding: covers peers running in lockstep */
#define YIELD_ITERS  50  /* sched_yield polls before sleeping: lets oversubscribed peers run */
#define SLEEP_MAX_NS 20000000LL /* a sleeper re-checks its deadline at least this often */
/* After a failure inside a call, peers that passed the call's previous barrier are still
 * reading our buffers; we wait this long at most for them to arrive. They never block, so
 * this only matters on a machine that stalls threads for seconds. */
#define GRACE_NS 10000000000LL

#define POISON (UINT64_C(1) << 62)

/* --- shared state ---------------------------------------------------------------------- */

/* What a rank publishes for the current collective; written before barrier 1, read by
 * peers between barriers 1 and 2 (the split's new group: between 1 and 2, read after 2). */
typedef struct slot {
    alignas(LINE) const void *send; /* elements of dtype */
    void *recv;
    void *buf;            /* broadcast */
    const size_t *counts; /* all_gather / reduce_scatter counts, all_to_all send counts */
    const size_t *displs; /* all_to_all send displacements */
    size_t count;         /* all_reduce / broadcast count, all_gather own count */
    size_t total;         /* all_gather / reduce_scatter: sum of counts */
    int op, root, color, key;
    int dtype;          /* ms_comm_dtype of the call's buffers */
    struct group *newg; /* split: the new group, set by its leader */
    /* Barriers this rank has entered; read by others to name the missing ranks. */
    _Atomic uint64_t arrived;
} slot;

/* A rank's doorbell for point-to-point: bumped whenever something for it changes. */
typedef struct bell {
    alignas(LINE) _Atomic uint32_t word;
    _Atomic int sleepers;
} bell;

/* One posted send. state packs (sequence number, tag, E_*) so that a receiver can pick
 * the oldest matching entry and claim exactly that posting with one compare-exchange. */
typedef struct p2p_entry {
    _Atomic uint64_t state;
    const void *buf;
    size_t count; /* elements of dtype */
    int dtype;    /* ms_comm_dtype */
} p2p_entry;

enum { E_FREE = 0, E_POSTED = 1, E_CLAIMED = 2 };
#define E_MAKE(seq, tag, st) (((uint64_t)(seq) << 17) | ((uint64_t)(tag) << 2) | (uint64_t)(st))
#define E_ST(v)              ((int)((v)&3))
#define E_TAG(v)             ((int)(((v) >> 2) & 0x7fff))
#define E_SEQ(v)             ((v) >> 17)

/* Mailbox (src -> dst): a chain of blocks, grown by the sender when all entries are busy. */
#define BLOCK_ENTRIES 8
typedef struct p2p_block {
    p2p_entry e[BLOCK_ENTRIES];
    _Atomic(struct p2p_block *) next;
} p2p_block;

/* The read-mostly fields, the arrival counter and the futex word sit on separate cache lines:
 * every barrier writes the latter two. */
typedef struct group {
    int n;
    _Atomic int refs;
    slot *slots;                             /* [n] */
    bell *bells;                             /* [n] */
    _Atomic(p2p_block *) *mailbox;           /* [src * n + dst], allocated by src on first send */
    alignas(LINE) _Atomic uint64_t bar;      /* barrier arrivals, plus POISON */
    alignas(LINE) _Atomic uint32_t bar_word; /* futex word: bumped when a barrier completes */
    _Atomic int bar_sleepers;
} group;

struct ms_threads_world {
    int n;
    group *g;
    _Atomic int *claimed; /* [n]: ms_comm_threads_create was called for this rank */
};

/* Where one operation of a batch stands: a send's posted entry and the sequence number it was
 * posted with (the entry is reused once the receiver freed it, so only a state with this
 * number is still ours), or whether a receive is done. */
typedef struct op_state {
    struct p2p_entry *e;
    uint64_t seq;
    bool done;
} op_state;

/* One rank's view of a group: the backend context of a communicator. */
typedef struct tctx {
    group *g;
    int rank;
    uint64_t nbar;      /* barriers entered so far */
    uint64_t *send_seq; /* [n]: last sequence number posted to each peer */
    int *mark;          /* [n]: scratch to list each missing peer once */
    op_state *op;       /* per op of a blocking p2p batch */
    int op_cap;
} tctx;

/* --- small helpers ---------------------------------------------------------------------- */

static void *zalloc_lines(size_t size) {
    size = size ? (size + LINE - 1) / LINE * LINE : LINE;
    void *p = xaligned_alloc(LINE, size);
    memset(p, 0, size);
    return p;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Sleeps while *word == seen, for at most ns (spurious wake-ups are fine). */
static void word_sleep(_Atomic uint32_t *word, uint32_t seen, int64_t ns) {
    if (ns <= 0) return;
    if (ns > SLEEP_MAX_NS) ns = SLEEP_MAX_NS;
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
#else
    (void)word;
    (void)seen;
    ts.tv_sec = 0;
    ts.tv_nsec = 50000;
    nanosleep(&ts, NULL);
#endif
}

/* Bumps *word and wakes its sleepers, if any; the seq_cst pair with waiter_block ensures
 * that either the waker sees the sleeper or the sleeper sees the new state. */
static void word_wake(_Atomic uint32_t *word, _Atomic int *sleepers) {
    atomic_fetch_add(word, 1);
    if (atomic_load(sleepers) > 0) {
#ifdef __linux__
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
    }
}

/* A wait in three stages: spin, then yield, then sleep on a futex word. The caller loops:
 *   seen = load(word); if (done) break; if (past deadline) fail; waiter_block(&w, seen, dl);
 * Entering the sleep stage first registers as a sleeper and returns once, so the caller
 * re-checks its condition before the first sleep (no lost wake-up). */
typedef struct waiter {
    _Atomic uint32_t *word;
    _Atomic int *sleepers;
    int polls;
    int sleeping;
} waiter;

static void waiter_block(waiter *w, uint32_t seen, int64_t deadline_ns) {
    /* A communicator's progress thread runs beside its rank's kernels: it sleeps almost at
     * once rather than take their core (a peer's arrival wakes it). */
    const bool beside = ms_comm_on_progress_thread();
    const int spin = beside ? 8 : SPIN_ITERS, yield = beside ? 0 : YIELD_ITERS;
    if (w->polls < spin) {
        w->polls++;
        cpu_relax();
    } else if (w->polls < spin + yield) {
        w->polls++;
        sched_yield();
    } else if (!w->sleeping) {
        w->sleeping = 1;
        atomic_fetch_add(w->sleepers, 1);
    } else {
        word_sleep(w->word, seen, deadline_ns - ms_now_ns());
    }
}

static void waiter_end(waiter *w) {
    if (w->sleeping) atomic_fetch_sub(w->sleepers, 1);
}

/* --- groups ----------------------------------------------------------------------------- */

static group *group_create(int n, int refs) {
    group *g = zalloc_lines(sizeof *g);
    g->n = n;
    atomic_init(&g->refs, refs);
    g->slots = zalloc_lines(sizeof(slot) * (size_t)n);
    g->bells = zalloc_lines(sizeof(bell) * (size_t)n);
    g->mailbox = xcalloc((size_t)n * (size_t)n, sizeof *g->mailbox);
    return g;
}

static void group_free(group *g) {
    if (!g) return;
    for (size_t i = 0; i < (size_t)g->n * (size_t)g->n; i++) {
        p2p_block *b = atomic_load_explicit(&g->mailbox[i], memory_order_relaxed);
        while (b) {
            p2p_block *next = atomic_load_explicit(&b->next, memory_order_relaxed);
            free(b);
            b = next;
        }
    }
    free(g->mailbox);
    free(g->bells);
    free(g->slots);
    free(g);
}

static void group_unref(group *g) {
    if (g && atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1) group_free(g);
}

static tctx *tctx_create(group *g, int rank) {
    tctx *t = xcalloc(1, sizeof *t);
    t->g = g;
    t->rank = rank;
    t->send_seq = xcalloc((size_t)g->n, sizeof *t->send_seq);
    t->mark = xcalloc((size_t)g->n, sizeof *t->mark);
    return t;
}

static void threads_destroy(void *ctx) {
    tctx *t = ctx;
    if (!t) return;
    group_unref(t->g);
    free(t->send_seq);
    free(t->mark);
    free(t->op);
    free(t);
}

/* Wakes everybody who might wait on g, so that they notice the poison. */
static void wake_all(group *g) {
    word_wake(&g->bar_word, &g->bar_sleepers);
    for (int r = 0; r < g->n; r++) word_wake(&g->bells[r].word, &g->bells[r].sleepers);
}

static int is_poisoned(group *g) {
    return (atomic_load_explicit(&g->bar, memory_order_acquire) & POISON) != 0;
}

/* Poisons the group unless barrier `target` completed first; returns 1 if it is poisoned. */
static int poison(group *g, uint64_t target) {
    uint64_t cur = atomic_load(&g->bar);
    while (!(cur & POISON) && cur < target)
        if (atomic_compare_exchange_weak(&g->bar, &cur, cur | POISON)) {
            wake_all(g);
            return 1;
        }
    return (cur & POISON) && (cur & ~POISON) < target;
}

static ms_status poisoned_error(ms_error *err) {
    return ms_fail(err, MS_ERR_COMM,
                   "the group was abandoned after another member timed out or failed");
}

/* --- barriers ----------------------------------------------------------------------------- */

/* Enters the next barrier; *target is the count at which it completes. Fails (without
 * counting itself) when the group is poisoned, so the caller must not touch peers. */
static ms_status bar_arrive(tctx *t, uint64_t *target, ms_error *err) {
    group *g = t->g;
    t->nbar++;
    *target = t->nbar * (uint64_t)g->n;
    /* release: whatever we did with peers' buffers before happens-before their leaving. */
    atomic_store_explicit(&g->slots[t->rank].arrived, t->nbar, memory_order_release);
    uint64_t cur = atomic_load_explicit(&g->bar, memory_order_relaxed);
    do {
        if (cur & POISON) return poisoned_error(err);
    } while (!atomic_compare_exchange_weak(&g->bar, &cur, cur + 1));
    if (cur + 1 == *target) word_wake(&g->bar_word, &g->bar_sleepers);
    return MS_OK;
}

/* Lists the members that have not entered barrier number t->nbar. */
static void list_missing(tctx *t, ms_comm_call *call) {
    call->n_missing = 0;
    for (int r = 0; r < t->g->n; r++) {
        if (atomic_load_explicit(&t->g->slots[r].arrived, memory_order_relaxed) >= t->nbar)
            continue;
        if (call->n_missing < (int)(sizeof call->missing / sizeof call->missing[0]))
            call->missing[call->n_missing++] = r;
    }
}

/* Waits (bounded) until every member entered barrier t->nbar: after a failure inside a call
 * they may still be reading our buffers, and they are not blocked, so they come soon. */
static void grace_wait(tctx *t) {
    group *g = t->g;
    int64_t until = ms_now_ns() + GRACE_NS;
    for (int r = 0; r < g->n; r++) {
        while (atomic_load_explicit(&g->slots[r].arrived, memory_order_acquire) < t->nbar &&
               ms_now_ns() < until)
            sched_yield();
    }
}

/* Completes barrier `target`. `first` says whether it is the first barrier of the call
 * (before it, no member has touched any other member's buffers). */
static ms_status bar_wait(tctx *t, uint64_t target, int first, ms_comm_call *call, ms_error *err) {
    group *g = t->g;
    waiter w = {.word = &g->bar_word, .sleepers = &g->bar_sleepers};
    int failed = 0;
    for (;;) {
        uint32_t seen = atomic_load(&g->bar_word);
        uint64_t v = atomic_load_explicit(&g->bar, memory_order_acquire);
        if ((v & ~POISON) >= target) break;
        if (v & POISON) {
            failed = 1;
            break;
        }
        if (ms_now_ns() >= call->deadline_ns) {
            if (poison(g, target)) {
                failed = 1;
                break;
            }
            continue;
        }
        waiter_block(&w, seen, call->deadline_ns);
    }
    waiter_end(&w);
    if (!failed) return MS_OK;
    list_missing(t, call);
    if (!first) grace_wait(t);
    if (call->n_missing == 0) return poisoned_error(err);
    return ms_fail(err, MS_ERR_TIMEOUT, "timed out in barrier %llu of the group",
                   (unsigned long long)t->nbar);
}

static ms_status barrier(tctx *t, int first, ms_comm_call *call, ms_error *err) {
    uint64_t target;
    MS_CHECK(bar_arrive(t, &target, err));
    return bar_wait(t, target, first, call, err);
}

/* --- collectives ---------------------------------------------------------------------------- */

/* [lo, hi) of chunk i when count elements of `elt` bytes are split over n ranks on cache-line
 * boundaries. */
static void chunk_range(size_t count, size_t elt, int n, int i, size_t *lo, size_t *hi) {
    const size_t line = LINE / elt;
    size_t per = (count + (size_t)n - 1) / (size_t)n;
    per = (per + line - 1) / line * line;
    size_t a = per * (size_t)i, b = a + per;
    *lo = a < count ? a : count;
    *hi = b < count ? b : count;
}

/* dst = src, `bytes` long. glibc's memcpy on AMD stops using `rep movsb` above the L2 size
 * and falls back to a vector loop, which measured ~1.4x slower on this project's 2-core EPYC
 * for the multi-MiB copies of all_gather and all_to_all; `rep movsb` (fast strings, on every
 * x86-64 of the last decade) was the fastest there. For small copies out of L1 memcpy wins. */
static void copy_bytes(void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
#ifdef USE_REP_MOVSB
    if (bytes >= REP_MIN_BYTES) {
        __asm__ __volatile__("rep movsb" : "+D"(dst), "+S"(src), "+c"(bytes) : : "memory");
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

static void copy_floats(float *dst, const float *src, size_t n) {
    copy_bytes(dst, src, n * sizeof(float));
}

/* Element i of an array of `elt`-byte elements. */
static inline char *elem(const void *base, size_t i, size_t elt) {
    return (char *)base + i * elt;
}

/* acc (op)= x, and the AVG division, as ms_reduce_accumulate / ms_reduce_finish. Their loops
 * in comm.c have a trip count unknown at compile time, which GCC's -O2 cost model does not
 * vectorize; a bound that is a multiple of 16 it does. So the bulk runs here with the same
 * expressions and the shared functions do the tail. */
static void accumulate(float *restrict acc, const float *restrict x, size_t n, ms_reduce_op op) {
    const size_t m = n & ~(size_t)15;
    switch (op) {
        case MS_REDUCE_SUM:
        case MS_REDUCE_AVG:
            for (size_t i = 0; i < m; i++) acc[i] += x[i];
            break;
        case MS_REDUCE_MAX:
            for (size_t i = 0; i < m; i++) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
            break;
        case MS_REDUCE_MIN:
            for (size_t i = 0; i < m; i++) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
            break;
        default:
            return;
    }
    ms_reduce_accumulate(acc + m, x + m, n - m, op);
}

static void finish(float *acc, size_t n, ms_reduce_op op, int group_size) {
    if (op != MS_REDUCE_AVG || group_size <= 1) return;
    const size_t m = n & ~(size_t)15;
    const float inv = 1.0f / (float)group_size;
    for (size_t i = 0; i < m; i++) acc[i] *= inv;
    ms_reduce_finish(acc + m, n - m, op, group_size);
}

/* dst[0..len) = reduction over members of src_p[off..off+len), mine first. dst may be my
 * own send (in place); sub-chunks keep dst in L1 while every peer's input is added. */
static void reduce_block_f32(group *g, int me, float *dst, size_t off, size_t len, ms_reduce_op op,
                             int push) {
    const int n = g->n;
    for (size_t lo = 0; lo < len; lo += SUB_FLOATS) {
        size_t m = len - lo < SUB_FLOATS ? len - lo : SUB_FLOATS;
        float *acc = dst + lo;
        copy_floats(acc, (const float *)g->slots[me].send + off + lo, m);
        for (int k = 1; k < n; k++) {
            int p = (me + k) % n;
            accumulate(acc, (const float *)g->slots[p].send + off + lo, m, op);
        }
        finish(acc, m, op, n);
        /* all_reduce: store the result straight into every peer's recv. A peer's recv may be
         * its send (in place), but only we read this part of it, and we already have. */
        for (int k = 1; push && k < n; k++) {
            int p = (me + k) % n;
            copy_floats((float *)g->slots[p].recv + off + lo, acc, m);
        }
    }
}

/* The same for bf16: in rank order, not mine first (ms_reduce_bf16), so that the result does
 * not depend on which member reduced the chunk, nor on the backend. */
static void reduce_block_bf16(group *g, int me, uint16_t *dst, size_t off, size_t len,
                              ms_reduce_op op, int push) {
    const int n = g->n;
    const uint16_t *src[MS_COMM_MAX_RANKS];
    for (size_t lo = 0; lo < len; lo += SUB_FLOATS) {
        size_t m = len - lo < SUB_FLOATS ? len - lo : SUB_FLOATS;
        for (int p = 0; p < n; p++) src[p] = (const uint16_t *)g->slots[p].send + off + lo;
        ms_reduce_bf16(dst + lo, src, n, m, op);
        for (int k = 1; push && k < n; k++) {
            int p = (me + k) % n;
            copy_bytes((uint16_t *)g->slots[p].recv + off + lo, dst + lo, m * sizeof(uint16_t));
        }
    }
}

static void reduce_block(group *g, int me, ms_comm_dtype dt, void *dst, size_t off, size_t len,
                         ms_reduce_op op, int push) {
    if (dt == MS_COMM_BF16)
        reduce_block_bf16(g, me, dst, off, len, op, push);
    else
        reduce_block_f32(g, me, dst, off, len, op, push);
}

static ms_status mismatch(ms_error *err, const char *what, int a, size_t va, int b, size_t vb) {
    return ms_fail(err, MS_ERR_INVALID,
                   "rank %d passed %s %zu but rank %d passed %zu; every member must agree", a, what,
                   va, b, vb);
}

/* Every member must pass the same element type (read after barrier 1). */
static ms_status check_dtypes(const group *g, int me, ms_comm_dtype dt, ms_error *err) {
    for (int p = 0; p < g->n; p++)
        if (g->slots[p].dtype != (int)dt)
            return ms_fail(err, MS_ERR_INVALID,
                           "rank %d passes %s elements but rank %d passes %s; every member must "
                           "agree",
                           p, ms_comm_dtype_name((ms_comm_dtype)g->slots[p].dtype), me,
                           ms_comm_dtype_name(dt));
    return MS_OK;
}

static ms_status threads_all_reduce(void *ctx, const void *send, void *recv, size_t count,
                                    ms_reduce_op op, ms_comm_call *call, ms_error *err) {
    tctx *t = ctx;
    group *g = t->g;
    const int n = g->n, me = t->rank;
    call->algo = "shm-direct";
    slot *s = &g->slots[me];
    s->send = send;
    s->recv = recv;
    s->count = count;
    s->op = (int)op;
    s->dtype = (int)call->dtype;
    MS_CHECK(barrier(t, 1, call, err));
    ms_status st = check_dtypes(g, me, call->dtype, err);
    for (int p = 0; p < n && st == MS_OK; p++) {
        if (g->slots[p].count != count)
            st = mismatch(err, "count", p, g->slots[p].count, me, count);
        else if (g->slots[p].op != (int)op)
            st =
                ms_fail(err, MS_ERR_INVALID, "rank %d reduces with %s but rank %d with %s", p,
                        ms_reduce_op_name((ms_reduce_op)g->slots[p].op), me, ms_reduce_op_name(op));
    }
    if (st == MS_OK) {
        const size_t elt = ms_comm_dtype_size(call->dtype);
        size_t lo, hi;
        chunk_range(count, elt, n, me, &lo, &hi);
        reduce_block(g, me, call->dtype, elem(recv, lo, elt), lo, hi - lo, op, 1);
    }
    ms_status st2 = barrier(t, 0, call, err);
    return st2 != MS_OK ? st2 : st;
}

static ms_status threads_reduce_scatter(void *ctx, const void *send, void *recv,
                                        const size_t *recv_counts, ms_reduce_op op,
                                        ms_comm_call *call, ms_error *err) {
    tctx *t = ctx;
    group *g = t->g;
    const int n = g->n, me = t->rank;
    call->algo = "shm-direct";
    size_t off = 0, total = 0;
    for (int p = 0; p < n; p++) {
        if (p < me) off += recv_counts[p];
        total += recv_counts[p];
    }
    slot *s = &g->slots[me];
    s->send = send;
    s->counts = recv_counts;
    s->total = total;
    s->op = (int)op;
    s->dtype = (int)call->dtype;
    MS_CHECK(barrier(t, 1, call, err));
    /* Reading block `me` of every send is safe once each member agrees on its size, on the
     * size of the whole send buffer and on the element type. */
    ms_status st = check_dtypes(g, me, call->dtype, err);
    for (int p = 0; p < n && st == MS_OK; p++) {
        if (g->slots[p].counts[me] != recv_counts[me])
            st = mismatch(err, "recv_counts[me]", p, g->slots[p].counts[me], me, recv_counts[me]);
        else if (g->slots[p].total != total)
            st = mismatch(err, "sum(recv_counts)", p, g->slots[p].total, me, total);
        else if (g->slots[p].op != (int)op)
            st =
                ms_fail(err, MS_ERR_INVALID, "rank %d reduces with %s but rank %d with %s", p,
                        ms_reduce_op_name((ms_reduce_op)g->slots[p].op), me, ms_reduce_op_name(op));
    }
    if (st == MS_OK) reduce_block(g, me, call->dtype, recv, off, recv_counts[me], op, 0);
    ms_status st2 = barrier(t, 0, call, err);
    return st2 != MS_OK ? st2 : st;
}

static ms_status threads_all_gather(void *ctx, const void *send, void *recv, const size_t *counts,
                                    ms_comm_call *call, ms_error *err) {
    tctx *t = ctx;
    group *g = t->g;
    const int n = g->n, me = t->rank;
    call->algo = "shm-direct";
    size_t my_off = 0, total = 0;
    for (int p = 0; p < n; p++) {
        if (p < me) my_off += counts[p];
        total += counts[p];
    }
    slot *s = &g->slots[me];
    s->recv = recv;
    s->count = counts[me];
    s->total = total;
    s->dtype = (int)call->dtype;
    MS_CHECK(barrier(t, 1, call, err));
    /* Everybody passes the counts of everybody; writing into a peer's recv is safe once its
     * own count, its total and its element type agree with ours. */
    ms_status st = check_dtypes(g, me, call->dtype, err);
    for (int p = 0; p < n && st == MS_OK; p++) {
        if (g->slots[p].count != counts[p])
            st = mismatch(err, "counts[r]", p, g->slots[p].count, me, counts[p]);
        else if (g->slots[p].total != total)
            st = mismatch(err, "sum(counts)", p, g->slots[p].total, me, total);
    }
    /* Push: our block goes into every member's recv, a sub-chunk at a time, so that it is read
     * once (from cache) however many members there are. */
    const size_t elt = ms_comm_dtype_size(call->dtype);
    const size_t sub =
        (total * elt >= BIG_BYTES ? BIG_SUB_FLOATS : SUB_FLOATS) * sizeof(float) / elt;
    for (size_t lo = 0; st == MS_OK && lo < counts[me]; lo += sub) {
        size_t m = counts[me] - lo < sub ? counts[me] - lo : sub;
        for (int k = 0; k < n; k++) {
            int p = (me + k) % n;
            copy_bytes(elem(g->slots[p].recv, my_off + lo, elt), elem(send, lo, elt), m * elt);
        }
    }
    ms_status st2 = barrier(t, 0, call, err);
    return st2 != MS_OK ? st2 : st;
}

static ms_status threads_all_to_all(void *ctx, const void *send, const size_t *send_counts,
                                    const size_t *send_displs, void *recv,
                                    const size_t *recv_counts, const size_t *recv_displs,
                                    ms_comm_call *call, ms_error *err) {
    tctx *t = ctx;
    group *g = t->g;
    const int n = g->n, me = t->rank;
    call->algo = "shm-direct";
    slot *s = &g->slots[me];
    s->send = send;
    s->counts = send_counts;
    s->displs = send_displs;
    s->dtype = (int)call->dtype;
    const size_t elt = ms_comm_dtype_size(call->dtype);
    uint64_t target;
    MS_CHECK(bar_arrive(t, &target, err));
    if (recv_counts[me] == send_counts[me])
        copy_bytes(elem(recv, recv_displs[me], elt), elem(send, send_displs[me], elt),
                   recv_counts[me] * elt);
    MS_CHECK(bar_wait(t, target, 1, call, err));
    ms_status st = check_dtypes(g, me, call->dtype, err);
    for (int k = 0; st == MS_OK && k < n; k++) {
        int p = (me + k) % n;
        const slot *ps = &g->slots[p];
        if (ps->counts[me] != recv_counts[p])
            st = ms_fail(err, MS_ERR_INVALID,
                         "rank %d sends %zu elements to rank %d, which expects %zu", p,
                         ps->counts[me], me, recv_counts[p]);
    }
    for (int k = 0; st == MS_OK && k < n; k++) {
        int p = (me + k) % n;
        const slot *ps = &g->slots[p];
        if (p != me)
            copy_bytes(elem(recv, recv_displs[p], elt), elem(ps->send, ps->displs[me], elt),
                       recv_counts[p] * elt);
    }
    ms_status st2 = barrier(t, 0, call, err);
    return st2 != MS_OK ? st2 : st;
}

static ms_status threads_broadcast(void *ctx, void *buf, size_t count, int root, ms_comm_call *call,
                                   ms_error *err) {
    tctx *t = ctx;
    group *g = t->g;
    const int me = t->rank;
    call->algo = "shm-direct";
    g->slots[me].buf = buf;
    g->slots[me].count = count;
    g->slots[me].root = root;
    g->slots[me].dtype = (int)call->dtype;
    MS_CHECK(barrier(t, 1, call, err));
    ms_status st = MS_OK;
    const slot *rs = &g->slots[root];
    if (g->slots[root].root != root)
        st = ms_fail(err, MS_ERR_INVALID, "rank %d broadcasts from root %d but rank %d from %d", me,
                     root, root, rs->root);
    else if (rs->dtype != (int)call->dtype)
        st = ms_fail(err, MS_ERR_INVALID, "rank %d broadcasts %s but rank %d broadcasts %s", me,
                     ms_comm_dtype_name(call->dtype), root,
                     ms_comm_dtype_name((ms_comm_dtype)rs->dtype));
    else if (rs->count != count)
        st = mismatch(err, "count", root, rs->count, me, count);
    else if (me != root)
        copy_bytes(buf, rs->buf, count * ms_comm_dtype_size(call->dtype));
    ms_status st2 = barrier(t, 0, call, err);
    return st2 != MS_OK ? st2 : st;
}

static ms_status threads_barrier(void *ctx, ms_comm_call *call, ms_error *err) {
    call->algo = "shm-direct";
    return barrier(ctx, 1, call, err);
}

/* --- split ---------------------------------------------------------------------------------- */

static ms_status threads_split(void *ctx, int color, int key, void **out_ctx, int *out_size,
                               int *out_rank, int *out_members, ms_comm_call *call, ms_error *err) {
    tctx *t = ctx;
    group *g = t->g;
    const int n = g->n, me = t->rank;
    call->algo = "shm-direct";
    *out_ctx = NULL;
    g->slots[me].color = color;
    g->slots[me].key = key;
    MS_CHECK(barrier(t, 1, call, err));

    /* Every member computes the same order; the first one creates the shared group. */
    int size = 0, rank = -1;
    group *mine = NULL;
    if (color >= 0) {
        int *ck = xmalloc(sizeof *ck * 2 * (size_t)n);
        for (int r = 0; r < n; r++) ck[2 * r] = g->slots[r].color, ck[2 * r + 1] = g->slots[r].key;
        size = ms_split_order(ck, n, color, me, out_members, &rank);
        free(ck);
        if (rank == 0) mine = g->slots[me].newg = group_create(size, size);
    }
    /* The leader's newg is rewritten only after barrier 1 of a later split, which needs
     * every member to have read it here first. */
    ms_status st = barrier(t, 0, call, err);
    if (st != MS_OK) {
        group_free(mine); /* nobody passed the barrier, so nobody saw it */
        return st;
    }
    if (color < 0) return MS_OK;
    group *ng = g->slots[out_members[0]].newg;
    *out_ctx = tctx_create(ng, rank);
    *out_size = size;
    *out_rank = rank;
    return MS_OK;
}

/* --- point-to-point -------------------------------------------------------------------------- */

static void ring(group *g, int r) {
    word_wake(&g->bells[r].word, &g->bells[r].sleepers);
}

/* Posts one send of dtype elements into the mailbox (me -> peer): its entry and number. */
static void post_send(tctx *t, const ms_p2p_op *op, ms_comm_dtype dtype, op_state *os) {
    group *g = t->g;
    _Atomic(p2p_block *) *link = &g->mailbox[(size_t)t->rank * (size_t)g->n + (size_t)op->peer];
    for (;;) {
        p2p_block *b = atomic_load_explicit(link, memory_order_relaxed); /* we are its writer */
        if (!b) {
            b = xcalloc(1, sizeof *b);
            atomic_store_explicit(link, b, memory_order_release);
        }
        for (int k = 0; k < BLOCK_ENTRIES; k++) {
            p2p_entry *e = &b->e[k];
            /* acquire: the receiver's last read of this entry precedes our rewrite */
            if (E_ST(atomic_load_explicit(&e->state, memory_order_acquire)) != E_FREE) continue;
            e->buf = op->buf;
            e->count = op->count;
            e->dtype = (int)dtype;
            uint64_t seq = ++t->send_seq[op->peer];
            atomic_store_explicit(&e->state, E_MAKE(seq, op->tag, E_POSTED), memory_order_release);
            *os = (op_state){.e = e, .seq = seq};
            return;
        }
        link = &b->next;
    }
}

/* The oldest posted entry of chain b with `tag`, or NULL; *state receives its state. */
static p2p_entry *oldest_posted(p2p_block *b, int tag, uint64_t *state) {
    p2p_entry *best = NULL;
    for (; b; b = atomic_load_explicit(&b->next, memory_order_acquire))
        for (int k = 0; k < BLOCK_ENTRIES; k++) {
            uint64_t v = atomic_load_explicit(&b->e[k].state, memory_order_acquire);
            if (E_ST(v) == E_POSTED && E_TAG(v) == tag && (!best || E_SEQ(v) < E_SEQ(*state))) {
                best = &b->e[k];
                *state = v;
            }
        }
    return best;
}

/* "floats" or "bytes": what a p2p count counts, for messages. */
static const char *units(int dtype) {
    return dtype == MS_COMM_BYTES ? "bytes" : dtype == MS_COMM_BF16 ? "bf16 elements" : "floats";
}

/* Receives op (dtype elements) if its sender has posted it: claims the oldest matching
 * entry, copies straight from the sender's buffer and frees the entry. Returns 1 when done. */
static int try_recv(tctx *t, const ms_p2p_op *op, ms_comm_dtype dtype, ms_status *st,
                    ms_error *err) {
    group *g = t->g;
    uint64_t bv = 0;
    p2p_block *b = atomic_load_explicit(
        &g->mailbox[(size_t)op->peer * (size_t)g->n + (size_t)t->rank], memory_order_acquire);
    p2p_entry *best = oldest_posted(b, op->tag, &bv);
    /* One scan is no snapshot: an older entry may have been posted into a slot we had already
     * passed. Every entry older than the one we saw was posted before it, so it is visible to
     * a second scan, whose oldest is the true oldest. */
    if (best) best = oldest_posted(b, op->tag, &bv);
    /* The compare-exchange fails only if the sender withdrew the entry (it failed). */
    if (!best ||
        !atomic_compare_exchange_strong_explicit(&best->state, &bv, (bv & ~(uint64_t)3) | E_CLAIMED,
                                                 memory_order_acq_rel, memory_order_relaxed))
        return 0;
    size_t sent = best->count * ms_comm_dtype_size((ms_comm_dtype)best->dtype);
    size_t want = op->count * ms_comm_dtype_size(dtype);
    if ((best->count != op->count || best->dtype != (int)dtype) && *st == MS_OK)
        *st = ms_fail(err, MS_ERR_INVALID,
                      "rank %d sent %zu %s with tag %d but rank %d receives %zu %s", op->peer,
                      best->count, units(best->dtype), op->tag, t->rank, op->count,
                      units((int)dtype));
    copy_bytes(op->buf, best->buf, sent < want ? sent : want);
    atomic_store_explicit(&best->state, E_FREE, memory_order_release);
    ring(g, op->peer);
    return 1;
}

/* Receives from one (peer, tag) complete in the order they were posted in the batch. */
static int earlier_recv_pending(const ms_p2p_op *ops, const op_state *os, int i) {
    for (int j = 0; j < i; j++)
        if (ops[j].kind == MS_P2P_RECV && !os[j].done && ops[j].peer == ops[i].peer &&
            ops[j].tag == ops[i].tag)
            return 1;
    return 0;
}

/* Whether a send's entry still holds it: not freed by the receiver (and, a non-blocking
 * send being completed late, not reused since for a later send). */
static int send_pending(const op_state *os) {
    uint64_t v = atomic_load_explicit(&os->e->state, memory_order_acquire);
    return E_ST(v) != E_FREE && E_SEQ(v) == os->seq;
}

/* One pass over the batch; returns how many operations are still incomplete. */
static int p2p_progress(tctx *t, const ms_p2p_op *ops, int nops, op_state *os, ms_comm_dtype dtype,
                        ms_status *st, ms_error *err) {
    int pending = 0;
    for (int i = 0; i < nops; i++) {
        if (ops[i].kind == MS_P2P_SEND) {
            pending += send_pending(&os[i]);
        } else if (!os[i].done) {
            if (!earlier_recv_pending(ops, os, i) && try_recv(t, &ops[i], dtype, st, err))
                os[i].done = true;
            else
                pending++;
        }
    }
    return pending;
}

/* After a failure: lists the peers of incomplete operations, then withdraws our posted
 * sends so that nobody reads our buffers after we return. */
static void p2p_abandon(tctx *t, const ms_p2p_op *ops, int nops, const op_state *os,
                        ms_comm_call *call) {
    memset(t->mark, 0, sizeof *t->mark * (size_t)t->g->n);
    call->n_missing = 0;
    for (int i = 0; i < nops; i++) {
        int open = ops[i].kind == MS_P2P_SEND ? send_pending(&os[i]) : !os[i].done;
        int p = ops[i].peer;
        if (!open || t->mark[p]) continue;
        t->mark[p] = 1;
        if (call->n_missing < (int)(sizeof call->missing / sizeof call->missing[0]))
            call->missing[call->n_missing++] = p;
    }
    for (int i = 0; i < nops; i++) {
        if (ops[i].kind != MS_P2P_SEND) continue;
        p2p_entry *e = os[i].e;
        uint64_t v = atomic_load_explicit(&e->state, memory_order_acquire);
        while (E_ST(v) != E_FREE && E_SEQ(v) == os[i].seq) {
            if (E_ST(v) == E_POSTED) {
                if (atomic_compare_exchange_weak_explicit(
                        &e->state, &v, E_FREE, memory_order_acq_rel, memory_order_acquire))
                    break;
            } else { /* claimed: the receiver is copying; that takes a moment */
                sched_yield();
                v = atomic_load_explicit(&e->state, memory_order_acquire);
            }
        }
    }
}

/* Posts every send of a batch (so that any pattern within it is deadlock-free). */
static ms_status batch_post(tctx *t, const ms_p2p_op *ops, int nops, op_state *os,
                            ms_comm_dtype dtype, ms_error *err) {
    if (is_poisoned(t->g)) return poisoned_error(err);
    for (int i = 0; i < nops; i++) {
        os[i] = (op_state){0};
        if (ops[i].kind == MS_P2P_SEND) {
            post_send(t, &ops[i], dtype, &os[i]);
            ring(t->g, ops[i].peer);
        }
    }
    return MS_OK;
}

/* Advances a posted batch: one pass, or (wait) until done or the deadline. *st keeps a
 * mismatch found on the way (the batch still completes); it is returned once done. */
static ms_status batch_poll(tctx *t, const ms_p2p_op *ops, int nops, op_state *os, bool wait,
                            bool *done, ms_status *st, ms_comm_call *call, ms_error *err) {
    group *g = t->g;
    bell *b = &g->bells[t->rank];
    waiter w = {.word = &b->word, .sleepers = &b->sleepers};
    ms_status fail = MS_OK;
    *done = false;
    for (;;) {
        uint32_t seen = atomic_load(&b->word);
        if (!p2p_progress(t, ops, nops, os, call->dtype, st, err)) {
            *done = true;
            break;
        }
        if (is_poisoned(g)) {
            fail = MS_ERR_COMM;
            break;
        }
        if (ms_now_ns() >= call->deadline_ns) {
            fail = MS_ERR_TIMEOUT;
            break;
        }
        if (!wait) break;
        waiter_block(&w, seen, call->deadline_ns);
    }
    waiter_end(&w);
    if (fail == MS_OK) return *done ? *st : MS_OK;
    p2p_abandon(t, ops, nops, os, call);
    if (fail == MS_ERR_COMM) return poisoned_error(err);
    /* Our peers would wait for us in vain: poison the group so they fail fast. */
    atomic_fetch_or(&g->bar, POISON);
    wake_all(g);
    return ms_fail(err, MS_ERR_TIMEOUT, "timed out waiting for peers");
}

static ms_status threads_p2p(void *ctx, const ms_p2p_op *ops, int nops, ms_comm_call *call,
                             ms_error *err) {
    tctx *t = ctx;
    call->algo = "shm-mailbox";
    if (nops > t->op_cap) { /* grows only when a batch is bigger than any before */
        t->op = xrealloc(t->op, sizeof *t->op * (size_t)nops);
        t->op_cap = nops;
    }
    bool done;
    ms_status st = MS_OK;
    MS_CHECK(batch_post(t, ops, nops, t->op, call->dtype, err));
    return batch_poll(t, ops, nops, t->op, true, &done, &st, call, err);
}

/* A non-blocking batch: the caller's operations and each one's state. */
typedef struct tbatch {
    const ms_p2p_op *ops;
    int nops;
    ms_status st;
    op_state os[];
} tbatch;

static ms_status threads_p2p_post(void *ctx, const ms_p2p_op *ops, int nops, ms_comm_call *call,
                                  void **req, ms_error *err) {
    tctx *t = ctx;
    call->algo = "shm-mailbox";
    tbatch *b = xcalloc(1, sizeof *b + sizeof b->os[0] * (size_t)nops);
    b->ops = ops;
    b->nops = nops;
    ms_status st = batch_post(t, ops, nops, b->os, call->dtype, err);
    if (st != MS_OK) {
        free(b);
        return st;
    }
    *req = b;
    return MS_OK;
}

static ms_status threads_p2p_poll(void *ctx, void *req, bool wait, bool *done, ms_comm_call *call,
                                  ms_error *err) {
    tbatch *b = req;
    ms_status st = batch_poll(ctx, b->ops, b->nops, b->os, wait, done, &b->st, call, err);
    if (*done || st != MS_OK) free(b);
    return st;
}

/* --- construction -------------------------------------------------------------------------- */

/* Slots touch only the group's shared slots and the caller's buffers, from any thread. */
static bool threads_async_ok(void *ctx) {
    (void)ctx;
    return true;
}

static const ms_comm_backend_ops threads_ops = {
    .name = "threads",
    .all_reduce = threads_all_reduce,
    .reduce_scatter = threads_reduce_scatter,
    .all_gather = threads_all_gather,
    .all_to_all = threads_all_to_all,
    .broadcast = threads_broadcast,
    .p2p = threads_p2p,
    .p2p_post = threads_p2p_post,
    .p2p_poll = threads_p2p_poll,
    .barrier = threads_barrier,
    .split = threads_split,
    .destroy = threads_destroy,
    .async_ok = threads_async_ok,
};

ms_status ms_threads_world_create(int nranks, ms_threads_world **out, ms_error *err) {
    *out = NULL;
    if (nranks < 1 || nranks > MS_COMM_MAX_RANKS)
        return ms_fail(err, MS_ERR_INVALID, "the threads backend runs 1..%d ranks (got %d)",
                       MS_COMM_MAX_RANKS, nranks);
    ms_threads_world *w = xcalloc(1, sizeof *w);
    w->n = nranks;
    w->g = group_create(nranks, 1);
    w->claimed = xcalloc((size_t)nranks, sizeof *w->claimed);
    *out = w;
    return MS_OK;
}

void ms_threads_world_destroy(ms_threads_world *w) {
    if (!w) return;
    group_unref(w->g);
    free(w->claimed);
    free(w);
}

int ms_threads_world_size(const ms_threads_world *w) {
    return w->n;
}

ms_status ms_comm_threads_create(ms_threads_world *w, int rank, ms_comm **out, ms_error *err) {
    *out = NULL;
    if (rank < 0 || rank >= w->n)
        return ms_fail(err, MS_ERR_INVALID, "rank %d is outside this threads world of %d ranks",
                       rank, w->n);
    /* A second context for a rank would count barriers from zero and corrupt the group. */
    if (atomic_exchange(&w->claimed[rank], 1))
        return ms_fail(err, MS_ERR_INVALID,
                       "rank %d of this threads world already has its communicator", rank);
    atomic_fetch_add(&w->g->refs, 1);
    int *ids = xmalloc(sizeof *ids * (size_t)w->n);
    for (int r = 0; r < w->n; r++) ids[r] = r;
    *out = ms_comm_wrap(&threads_ops, tctx_create(w->g, rank), rank, w->n, ids, "world");
    free(ids);
    return MS_OK;
}

/* parallel.c - a per-rank pool of sleeping workers for ms_parallel_for.
 *
 * Hand-off: the caller publishes the job (fn, arg, split) with plain stores, then bumps
 * `gen` with release order; a worker that sees the new generation (acquire) therefore sees
 * the job. Every thread, the caller too, takes chunks from `next` until none is left; each
 * worker then decrements `pending` (release) and the caller waits for zero (acquire), so the
 * workers' writes are visible when ms_parallel_for returns. `next` is reset only after every
 * worker has left the previous job. Futexes only put threads to sleep and wake them; every
 * decision is made on the atomics. */
#include "engine/core/parallel.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/core/xalloc.h"

#define MAX_WORKERS       63
#define CHUNKS_PER_THREAD 4

typedef struct pool {
    int nworkers;
    pthread_t th[MAX_WORKERS];
    _Atomic uint32_t gen;
    _Atomic uint32_t pending;
    _Atomic bool quit;
    /* the job of generation `gen` */
    ms_range_fn fn;
    void *arg;
    int64_t n, chunk;
    _Atomic int64_t next; /* the first item no thread has taken */
} pool;

typedef struct worker_arg {
    pool *p;
} worker_arg;

static _Atomic int g_threads = 1;
static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Thread_local pool *tl_pool;

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Takes chunks until none is left: a thread that starts late (a sleeping worker is woken
 * by the scheduler, tens of microseconds on a VM) or runs slower does less, so no thread
 * waits on another's fixed share. Which thread runs a chunk never changes what it computes. */
static void run_chunks(pool *p) {
    for (;;) {
        int64_t lo = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (lo >= p->n) return;
        int64_t hi = lo + p->chunk < p->n ? lo + p->chunk : p->n;
        p->fn(p->arg, lo, hi);
    }
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    pool *p = wa.p;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
            futex_wait(&p->gen, seen);
        seen = g;
        if (atomic_load_explicit(&p->quit, memory_order_acquire)) return NULL;
        run_chunks(p);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1)
            futex_wake(&p->pending, 1);
    }
}

static void pool_destroy(void *arg) {
    pool *p = arg;
    if (!p) return;
    atomic_store_explicit(&p->quit, true, memory_order_release);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    futex_wake(&p->gen, MAX_WORKERS);
    for (int i = 0; i < p->nworkers; i++) pthread_join(p->th[i], NULL);
    free(p);
}

static void make_key(void) {
    pthread_key_create(&g_key, pool_destroy);
}

/* The calling thread's pool with `workers` workers (recreated when the setting changed);
 * NULL if threads cannot be started (then everything runs inline). */
static pool *get_pool(int workers) {
    if (tl_pool && tl_pool->nworkers == workers) return tl_pool;
    pthread_once(&g_once, make_key);
    if (tl_pool) {
        pool_destroy(tl_pool);
        tl_pool = NULL;
        pthread_setspecific(g_key, NULL);
    }
    pool *p = xcalloc(1, sizeof *p);
    for (int i = 0; i < workers; i++) {
        worker_arg *wa = xmalloc(sizeof *wa);
        *wa = (worker_arg){.p = p};
        if (pthread_create(&p->th[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->nworkers = i;
            pool_destroy(p);
            return NULL;
        }
        p->nworkers = i + 1;
    }
    tl_pool = p;
    pthread_setspecific(g_key, p); /* joined when this rank's thread exits */
    return p;
}

void ms_parallel_for(int64_t n, int64_t grain, ms_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int threads = atomic_load_explicit(&g_threads, memory_order_relaxed);
    int64_t grains = (n + grain - 1) / grain;
    int parts = threads < grains ? threads : (int)grains;
    pool *p = parts > 1 ? get_pool(threads - 1) : NULL;
    if (!p) {
        fn(arg, 0, n);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    /* a few chunks per thread, so the shares even out however the threads start */
    int64_t pieces = (int64_t)parts * CHUNKS_PER_THREAD;
    p->chunk = (grains + pieces - 1) / pieces * grain;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, (uint32_t)p->nworkers, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    futex_wake(&p->gen, p->nworkers);
    run_chunks(p);
    uint32_t left;
    for (int spin = 0; (left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0;
         spin++)
        if (spin > 200) futex_wait(&p->pending, left);
}

void ms_parallel_set_threads(int n) {
    if (n < 1) n = 1;
    if (n > MAX_WORKERS + 1) n = MAX_WORKERS + 1;
    atomic_store_explicit(&g_threads, n, memory_order_relaxed);
}

int ms_parallel_threads(void) {
    return atomic_load_explicit(&g_threads, memory_order_relaxed);
}

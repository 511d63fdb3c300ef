/* recorder.c - the per-rank event ring (see recorder.h).
 *
 * Ring: C slots (C a power of two); event number i (from 0, the write counter) lives in slot
 * i & (C-1). Each slot carries a sequence word, seqlock style: the writer stores 2i+1 before
 * it rewrites the slot for event i and 2i+2 once event i is complete. A reader that wants
 * event i loads the sequence, copies the words, reloads the sequence, and keeps the copy only
 * when both loads read 2i+2; anything else means the slot was (or is being) reused for a
 * later event, so event i is lost to that reader and counted in `missed`.
 *
 * Memory model: every access to slot memory is atomic (an event is moved as an array of
 * uint64_t words), so there is no data race in the C11 sense and ThreadSanitizer has nothing
 * to report. The ordering comes from release stores of the words (each is ordered after the
 * odd sequence store) and acquire loads of them (each is ordered before the sequence reload):
 * if a reader sees any word of a newer event, it also sees the newer sequence. On x86 these
 * are plain moves; we avoid stand-alone fences because TSan does not model them (and GCC
 * warns about atomic_thread_fence under -fsanitize=thread).
 *
 * The group table is a fixed array under a mutex: registration is rare and never on the
 * push path.
 */
#include "profiler/record/recorder.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define EV_WORDS (sizeof(ms_event) / sizeof(uint64_t))
static_assert(sizeof(ms_event) % sizeof(uint64_t) == 0,
              "ms_event must be a whole number of 64-bit words: the ring moves it word by word");

#define MAX_CAPACITY ((size_t)1 << 26)

typedef struct slot {
    _Atomic uint64_t seq; /* 2i+1: event i being written; 2i+2: event i complete; 0: empty */
    _Atomic uint64_t w[EV_WORDS];
} slot;

/* An event seen as words: the union is how C lets us reinterpret it without aliasing UB. */
typedef union ev_words {
    ms_event ev;
    uint64_t w[EV_WORDS];
} ev_words;

struct ms_recorder {
    int rank;
    size_t cap, mask;
    slot *slots;
    /* Written by the writer thread only; atomic because readers load it at any time. */
    _Atomic uint64_t head; /* events pushed so far (the write counter) */
    _Atomic int64_t step;  /* stamped on pushed events; readers may query it */
    pthread_mutex_t mu;    /* guards groups and n_groups */
    int n_groups;
    ms_group groups[MS_REC_MAX_GROUPS];
};

ms_status ms_recorder_create(int rank, size_t capacity, ms_recorder **out, ms_error *err) {
    *out = NULL;
    if (capacity == 0 || capacity > MAX_CAPACITY)
        return ms_fail(err, MS_ERR_INVALID,
                       "recorder capacity %zu is out of range; use 2 .. %zu events", capacity,
                       MAX_CAPACITY);
    size_t cap = 2;
    while (cap < capacity) cap <<= 1;
    ms_recorder *r = calloc(1, sizeof *r);
    if (!r) return ms_fail(err, MS_ERR_NOMEM, "cannot allocate the recorder of rank %d", rank);
    /* Slots are 192 bytes: cache-line aligned, no slot shares a line with two others. */
    size_t bytes = cap * sizeof(slot);
    bytes = (bytes + 63) & ~(size_t)63;
    r->slots = aligned_alloc(64, bytes);
    if (!r->slots) {
        free(r);
        return ms_fail(err, MS_ERR_NOMEM,
                       "cannot allocate a trace ring of %zu events (%zu MiB) for rank %d; "
                       "lower the trace buffer size",
                       cap, bytes >> 20, rank);
    }
    for (size_t i = 0; i < cap; i++) {
        atomic_init(&r->slots[i].seq, 0);
        for (size_t k = 0; k < EV_WORDS; k++) atomic_init(&r->slots[i].w[k], 0);
    }
    r->rank = rank;
    r->cap = cap;
    r->mask = cap - 1;
    atomic_init(&r->head, 0);
    atomic_init(&r->step, -1);
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return MS_OK;
}

void ms_recorder_destroy(ms_recorder *r) {
    if (!r) return;
    pthread_mutex_destroy(&r->mu);
    free(r->slots);
    free(r);
}

static void push_words(ms_recorder *r, const ev_words *e);

void ms_recorder_push(ms_recorder *r, const ms_event *ev) {
    ev_words e;
    e.ev = *ev;
    e.ev.rank = r->rank;
    e.ev.step = atomic_load_explicit(&r->step, memory_order_relaxed);
    push_words(r, &e);
}

void ms_recorder_push_as(ms_recorder *r, const ms_event *ev) {
    ev_words e;
    e.ev = *ev;
    push_words(r, &e);
}

static void push_words(ms_recorder *r, const ev_words *ew) {
    ev_words e = *ew;
    /* Only this thread writes head, so a relaxed load reads our own last store. */
    uint64_t i = atomic_load_explicit(&r->head, memory_order_relaxed);
    slot *s = &r->slots[i & r->mask];
    atomic_store_explicit(&s->seq, 2 * i + 1, memory_order_relaxed);
    /* release: a reader that loads any of these words also sees the odd sequence above */
    for (size_t k = 0; k < EV_WORDS; k++)
        atomic_store_explicit(&s->w[k], e.w[k], memory_order_release);
    atomic_store_explicit(&s->seq, 2 * i + 2, memory_order_release);
    atomic_store_explicit(&r->head, i + 1, memory_order_release);
}

/* Copies event i into *out if slot i still holds it, whole. */
static bool read_slot(const ms_recorder *r, uint64_t i, ms_event *out) {
    const slot *s = &r->slots[i & r->mask];
    const uint64_t want = 2 * i + 2;
    if (atomic_load_explicit(&s->seq, memory_order_acquire) != want) return false;
    ev_words e;
    /* acquire: the sequence reload below cannot move above these loads */
    for (size_t k = 0; k < EV_WORDS; k++)
        e.w[k] = atomic_load_explicit(&s->w[k], memory_order_acquire);
    if (atomic_load_explicit(&s->seq, memory_order_relaxed) != want) return false;
    *out = e.ev;
    return true;
}

size_t ms_recorder_read(const ms_recorder *r, uint64_t *cursor, ms_event *out, size_t max,
                        uint64_t *missed) {
    uint64_t lost = 0, i = *cursor;
    size_t n = 0;
    uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
    if (i > h) i = h; /* a cursor from another recorder, or corrupt: start from now */
    while (n < max && i < h) {
        uint64_t oldest = h > r->cap ? h - r->cap : 0;
        if (i < oldest) { /* the writer lapped us before we started */
            lost += oldest - i;
            i = oldest;
            continue;
        }
        /* Event i was complete (i < h); if its slot no longer holds it, the writer reused
         * the slot for event i + C (or is doing so now): it is gone. */
        if (read_slot(r, i, &out[n]))
            n++;
        else
            lost++;
        i++;
    }
    *cursor = i;
    if (missed) *missed = lost;
    return n;
}

void ms_recorder_set_step(ms_recorder *r, int64_t step) {
    atomic_store_explicit(&r->step, step, memory_order_relaxed);
}

int64_t ms_recorder_step(const ms_recorder *r) {
    return atomic_load_explicit(&r->step, memory_order_relaxed);
}

uint64_t ms_recorder_pushed(const ms_recorder *r) {
    return atomic_load_explicit(&r->head, memory_order_acquire);
}

uint64_t ms_recorder_dropped(const ms_recorder *r) {
    uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
    return h > r->cap ? h - r->cap : 0;
}

int ms_recorder_rank(const ms_recorder *r) {
    return r->rank;
}

/* --- groups ---------------------------------------------------------------------------- */

static int group_nranks(const ms_group *g) {
    return g->size < MS_EV_GROUP_MAX ? g->size : MS_EV_GROUP_MAX;
}

static bool group_same(const ms_group *a, const ms_group *b) {
    if (a->size != b->size || strncmp(a->name, b->name, sizeof a->name)) return false;
    for (int i = 0; i < group_nranks(a); i++)
        if (a->ranks[i] != b->ranks[i]) return false;
    return true;
}

/* FNV-1a over the name, size and listed ranks, folded to a non-negative int32. */
static int32_t group_hash(const ms_group *g) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof g->name && g->name[i]; i++)
        h = (h ^ (uint8_t)g->name[i]) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull; /* separates the name from the numbers */
    int32_t nums[MS_EV_GROUP_MAX + 1];
    nums[0] = g->size;
    int n = group_nranks(g);
    memcpy(nums + 1, g->ranks, sizeof(int32_t) * (size_t)n);
    const uint8_t *b = (const uint8_t *)nums;
    for (size_t i = 0; i < sizeof(int32_t) * (size_t)(n + 1); i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return (int32_t)((h ^ (h >> 32)) & 0x7fffffff);
}

int32_t ms_recorder_group(ms_recorder *r, const ms_group *g) {
    if (!r || !g || g->size < 0) return -1;
    ms_group key = *g;
    /* Compare names as NUL-terminated strings whatever follows the terminator. */
    key.name[sizeof key.name - 1] = '\0';
    size_t len = strlen(key.name);
    memset(key.name + len, 0, sizeof key.name - len);
    for (int i = group_nranks(&key); i < MS_EV_GROUP_MAX; i++) key.ranks[i] = 0;
    key.id = group_hash(&key);
    int32_t id = -1;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        int hit = -1;
        for (int k = 0; k < r->n_groups; k++)
            if (r->groups[k].id == key.id) {
                hit = k;
                break;
            }
        if (hit < 0) break;
        if (group_same(&r->groups[hit], &key)) {
            id = key.id;
            goto done;
        }
        key.id = (key.id + 1) & 0x7fffffff; /* a clash: probe on */
    }
    if (r->n_groups < MS_REC_MAX_GROUPS) {
        r->groups[r->n_groups++] = key;
        id = key.id;
    }
done:
    pthread_mutex_unlock(&r->mu);
    return id;
}

int ms_recorder_groups(const ms_recorder *r, ms_group *out, int max) {
    /* The mutex is part of the recorder's mutable state, not of what `const` promises. */
    ms_recorder *m = (ms_recorder *)r;
    pthread_mutex_lock(&m->mu);
    int n = m->n_groups < max ? m->n_groups : max;
    if (n > 0) memcpy(out, m->groups, sizeof(ms_group) * (size_t)n);
    pthread_mutex_unlock(&m->mu);
    return n < 0 ? 0 : n;
}

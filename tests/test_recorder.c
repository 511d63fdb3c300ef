/* test_recorder.c - the per-rank event ring: order, wrap-around and drop counting, whole
 * (never torn) events for a reader racing the writer, lagging readers told what they missed,
 * the group table, and the round trip of events gathered to rank 0 (byte for byte the events
 * pushed). Functional properties only; the push rate is printed, not asserted.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testkit.h"

#include "profiler/record/gather.h"
#include "profiler/record/recorder.h"

#define WORDS (sizeof(ms_event) / sizeof(uint64_t))

typedef union ev_words {
    ms_event ev;
    uint64_t w[WORDS];
} ev_words;

/* Word k of event i; words 0 and 1 (kind, rank, step) are stamped by the recorder. */
static uint64_t pattern(uint64_t i, size_t k) {
    return i * 0x9e3779b97f4a7c15ull ^ (uint64_t)k * 0x2545f4914f6cdd1dull;
}

/* An event that carries its index i in every word from t0_ns on, so a torn copy (words from
 * two different events) cannot pass index_of. */
static ms_event make_event(uint64_t i) {
    ev_words e;
    memset(&e, 0, sizeof e);
    for (size_t k = 2; k < WORDS; k++) e.w[k] = pattern(i, k);
    e.ev.kind = MS_EV_OP;
    e.ev.phase = MS_PHASE_FORWARD;
    e.ev.t0_ns = (int64_t)i; /* word 2 */
    e.ev.rank = 99;          /* overwritten by the recorder */
    return e.ev;
}

/* The index the event carries, or UINT64_MAX if its words disagree (torn). */
static uint64_t index_of(const ms_event *ev) {
    ev_words e;
    e.ev = *ev;
    uint64_t i = (uint64_t)e.ev.t0_ns;
    for (size_t k = 3; k < WORDS; k++)
        if (e.w[k] != pattern(i, k)) return UINT64_MAX;
    return i;
}

static ms_recorder *make(int rank, size_t cap) {
    ms_recorder *r = NULL;
    ms_error err = {0};
    assert_int_equal(ms_recorder_create(rank, cap, &r, &err), MS_OK);
    assert_non_null(r);
    return r;
}

static void test_create_rejects_bad_capacity(void **state) {
    (void)state;
    ms_recorder *r = (ms_recorder *)1;
    ms_error err = {0};
    assert_int_equal(ms_recorder_create(0, 0, &r, &err), MS_ERR_INVALID);
    assert_null(r);
    assert_non_null(strstr(err.msg, "capacity"));
    assert_int_equal(ms_recorder_create(0, (size_t)1 << 40, &r, &err), MS_ERR_INVALID);
    assert_false(ms_recorder_on(NULL));
}

static void test_order_and_stamps(void **state) {
    (void)state;
    ms_recorder *r = make(3, 100); /* rounds up to 128 */
    assert_true(ms_recorder_on(r));
    assert_int_equal(ms_recorder_rank(r), 3);
    assert_int_equal(ms_recorder_step(r), -1);
    for (uint64_t i = 0; i < 50; i++) {
        if (i == 20) ms_recorder_set_step(r, 7);
        ms_event e = make_event(i);
        ms_recorder_push(r, &e);
    }
    assert_int_equal(ms_recorder_step(r), 7);
    assert_int_equal(ms_recorder_pushed(r), 50);
    assert_int_equal(ms_recorder_dropped(r), 0);

    ms_event out[64];
    uint64_t cur = 0, missed = 123;
    /* Two reads in chunks see every event once, oldest first. */
    size_t n = ms_recorder_read(r, &cur, out, 30, &missed);
    assert_int_equal(n, 30);
    assert_int_equal(cur, 30);
    assert_int_equal(missed, 0);
    n += ms_recorder_read(r, &cur, out + 30, 64 - 30, &missed);
    assert_int_equal(n, 50);
    assert_int_equal(cur, 50);
    for (uint64_t i = 0; i < 50; i++) {
        assert_int_equal(index_of(&out[i]), i);
        assert_int_equal(out[i].rank, 3);
        assert_int_equal(out[i].step, i < 20 ? -1 : 7);
        assert_int_equal(out[i].kind, MS_EV_OP);
    }
    /* Nothing new: nothing read, cursor unchanged. */
    assert_int_equal(ms_recorder_read(r, &cur, out, 64, NULL), 0);
    assert_int_equal(cur, 50);
    /* A cursor beyond the write counter (another recorder's) restarts at "now". */
    cur = 1000;
    assert_int_equal(ms_recorder_read(r, &cur, out, 64, &missed), 0);
    assert_int_equal(cur, 50);
    ms_recorder_destroy(r);
}

static void test_wraparound_counts_drops(void **state) {
    (void)state;
    ms_recorder *r = make(0, 5); /* rounds up to 8 */
    const uint64_t total = 3 * 8 + 5;
    for (uint64_t i = 0; i < total; i++) {
        ms_event e = make_event(i);
        ms_recorder_push(r, &e);
    }
    assert_int_equal(ms_recorder_pushed(r), total);
    assert_int_equal(ms_recorder_dropped(r), total - 8);

    /* A reader from the start gets the newest 8 and learns it missed the rest. */
    ms_event out[16];
    uint64_t cur = 0, missed = 0;
    size_t n = ms_recorder_read(r, &cur, out, 16, &missed);
    assert_int_equal(n, 8);
    assert_int_equal(missed, total - 8);
    assert_int_equal(cur, total);
    for (size_t k = 0; k < n; k++) assert_int_equal(index_of(&out[k]), total - 8 + k);

    /* A reader that keeps up in small chunks misses nothing across the wrap. */
    ms_recorder *q = make(1, 8);
    uint64_t c2 = 0, got = 0;
    for (uint64_t i = 0; i < 100; i++) {
        ms_event e = make_event(i);
        ms_recorder_push(q, &e);
        if (i % 5 == 4) {
            size_t m = ms_recorder_read(q, &c2, out, 3, &missed);
            assert_int_equal(missed, 0);
            for (size_t k = 0; k < m; k++) assert_int_equal(index_of(&out[k]), got + k);
            got += m;
            m = ms_recorder_read(q, &c2, out, 16, &missed);
            assert_int_equal(missed, 0);
            for (size_t k = 0; k < m; k++) assert_int_equal(index_of(&out[k]), got + k);
            got += m;
        }
    }
    assert_int_equal(got, 100);
    assert_int_equal(ms_recorder_dropped(q), 100 - 8);
    ms_recorder_destroy(q);
    ms_recorder_destroy(r);
}

/* --- a reader racing the writer ---------------------------------------------------------- */

typedef struct race {
    ms_recorder *r;
    uint64_t total;
    _Atomic int writer_done;
    /* reader results */
    uint64_t seen, missed, torn, disorder, last;
    uint64_t calls_with_missed;
} race;

static void *writer_main(void *p) {
    race *x = p;
    for (uint64_t i = 0; i < x->total; i++) {
        ms_event e = make_event(i);
        ms_recorder_push(x->r, &e);
        /* Now and then give the reader the CPU, so that it reads while we write, at any
         * core count; the rest of the time we outrun it and lap it. */
        if (i % 128 == 127) sched_yield();
    }
    atomic_store(&x->writer_done, 1);
    return NULL;
}

static void *reader_main(void *p) {
    race *x = p;
    ms_event buf[96];
    uint64_t cur = 0;
    int64_t prev = -1;
    for (;;) {
        int done = atomic_load(&x->writer_done); /* read before the drain below */
        uint64_t missed = 0;
        size_t n = ms_recorder_read(x->r, &cur, buf, 96, &missed);
        x->missed += missed;
        x->calls_with_missed += missed > 0;
        for (size_t k = 0; k < n; k++) {
            uint64_t i = index_of(&buf[k]);
            if (i == UINT64_MAX || buf[k].rank != 5) {
                x->torn++;
                continue;
            }
            if ((int64_t)i <= prev) x->disorder++;
            prev = (int64_t)i;
        }
        x->seen += n;
        if (done && n == 0) break;
    }
    x->last = (uint64_t)prev;
    return NULL;
}

static void test_concurrent_reader_sees_whole_ordered_events(void **state) {
    (void)state;
    race x = {.total = 300000};
    x.r = make(5, 256); /* small: the writer laps the reader now and then */
    atomic_init(&x.writer_done, 0);
    pthread_t w, rd;
    int64_t t0 = ms_now_ns();
    assert_int_equal(pthread_create(&rd, NULL, reader_main, &x), 0);
    assert_int_equal(pthread_create(&w, NULL, writer_main, &x), 0);
    pthread_join(w, NULL);
    int64_t t1 = ms_now_ns();
    pthread_join(rd, NULL);
    printf("# %llu pushes with a racing reader: %.1f ns/push; reader saw %llu, missed %llu\n",
           (unsigned long long)x.total, (double)(t1 - t0) / (double)x.total,
           (unsigned long long)x.seen, (unsigned long long)x.missed);
    assert_int_equal(x.torn, 0);
    assert_int_equal(x.disorder, 0);
    /* Every event was either delivered or reported missed, exactly once. */
    assert_int_equal(x.seen + x.missed, x.total);
    assert_int_equal(x.last, x.total - 1);
    assert_int_equal(ms_recorder_dropped(x.r), x.total - 256);
    ms_recorder_destroy(x.r);
}

/* Several readers, each with its own cursor, may read at once. */
typedef struct many {
    ms_recorder *r;
    _Atomic int *done;
    uint64_t seen, missed, bad;
} many;

static void *many_reader(void *p) {
    many *m = p;
    ms_event buf[40];
    uint64_t cur = 0;
    int64_t prev = -1;
    for (;;) {
        int done = atomic_load(m->done);
        uint64_t missed = 0;
        size_t n = ms_recorder_read(m->r, &cur, buf, 40, &missed);
        m->missed += missed;
        for (size_t k = 0; k < n; k++) {
            uint64_t i = index_of(&buf[k]);
            if (i == UINT64_MAX || (int64_t)i <= prev) m->bad++;
            prev = (int64_t)i;
        }
        m->seen += n;
        if (done && n == 0) break;
    }
    return NULL;
}

static void test_many_readers(void **state) {
    (void)state;
    const uint64_t total = 100000;
    _Atomic int done;
    atomic_init(&done, 0);
    ms_recorder *r = make(0, 64);
    many m[3];
    pthread_t t[3];
    for (int k = 0; k < 3; k++) {
        m[k] = (many){.r = r, .done = &done};
        assert_int_equal(pthread_create(&t[k], NULL, many_reader, &m[k]), 0);
    }
    for (uint64_t i = 0; i < total; i++) {
        ms_event e = make_event(i);
        ms_recorder_push(r, &e);
    }
    atomic_store(&done, 1);
    for (int k = 0; k < 3; k++) {
        pthread_join(t[k], NULL);
        assert_int_equal(m[k].bad, 0);
        assert_int_equal(m[k].seen + m[k].missed, total);
    }
    ms_recorder_destroy(r);
}

/* --- groups ------------------------------------------------------------------------------ */

static ms_group group_of(const char *name, int n, const int *ranks) {
    ms_group g;
    memset(&g, 0, sizeof g);
    snprintf(g.name, sizeof g.name, "%s", name);
    g.size = n;
    for (int i = 0; i < n && i < MS_EV_GROUP_MAX; i++) g.ranks[i] = ranks[i];
    return g;
}

static void test_groups(void **state) {
    (void)state;
    ms_recorder *a = make(0, 16), *b = make(1, 16);
    int r01[] = {0, 1}, r23[] = {2, 3}, r10[] = {1, 0}, w[] = {0, 1, 2, 3};
    ms_group g01 = group_of("tp", 2, r01), g23 = group_of("tp", 2, r23);
    ms_group g10 = group_of("p2p", 2, r10), gw = group_of("world", 4, w);
    int32_t i01 = ms_recorder_group(a, &g01);
    int32_t iw = ms_recorder_group(a, &gw);
    assert_true(i01 >= 0 && iw >= 0 && i01 != iw);
    /* Idempotent, whatever id the caller left in the struct. */
    g01.id = 12345;
    assert_int_equal(ms_recorder_group(a, &g01), i01);
    /* Another rank registering the same groups in another order gets the same ids, and a
     * different group with the same name gets a different one: ids merge across ranks. */
    int32_t i23 = ms_recorder_group(b, &g23);
    assert_int_equal(ms_recorder_group(b, &gw), iw);
    assert_int_equal(ms_recorder_group(b, &g01), i01);
    assert_true(i23 != i01);
    assert_true(ms_recorder_group(b, &g10) != ms_recorder_group(b, &g01));

    ms_group out[8];
    assert_int_equal(ms_recorder_groups(a, out, 8), 2);
    assert_int_equal(out[0].id, i01);
    assert_string_equal(out[0].name, "tp");
    assert_int_equal(out[0].size, 2);
    assert_int_equal(out[0].ranks[1], 1);
    assert_int_equal(out[1].id, iw);
    assert_int_equal(ms_recorder_groups(b, out, 2), 2); /* truncated to max */
    assert_int_equal(ms_recorder_groups(b, out, 8), 4);

    /* A full table says so with -1; known groups still resolve. */
    int added = 0;
    for (int k = 0; k < MS_REC_MAX_GROUPS + 10; k++) {
        int pair[2] = {k, k + 1};
        ms_group g = group_of("p2p", 2, pair);
        if (ms_recorder_group(a, &g) >= 0) added++;
    }
    assert_int_equal(added, MS_REC_MAX_GROUPS - 2); /* two were there already */
    assert_int_equal(ms_recorder_group(a, &gw), iw);
    assert_int_equal(ms_recorder_group(NULL, &gw), -1);
    ms_recorder_destroy(a);
    ms_recorder_destroy(b);
}

/* --- gathering to rank 0 --------------------------------------------------------------------- */

#define GATHER_MAX 32

/* Events rank q pushes: uneven, and none at all on rank 1. */
static int gather_count(int q) {
    return q == 1 ? 0 : 3 + 5 * q;
}

/* Rank q's k-th event as it must arrive: as made, stamped with q and its step. */
static ms_event gathered_want(int q, int k) {
    ms_event e = make_event((uint64_t)q * 1000 + (uint64_t)k);
    e.rank = q;
    e.step = 10 + q;
    return e;
}

static void gather_body(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *w = r->ctx->world;
    const int me = ms_comm_rank(w), n = ms_comm_size(w);
    ms_error err = {0};
    ms_recorder *rec = NULL;
    if (!MT_OK(r, ms_recorder_create(me, 64, &rec, &err), &err)) return;
    ms_recorder_set_step(rec, 10 + me);
    for (int k = 0; k < gather_count(me); k++) {
        ms_event e = make_event((uint64_t)me * 1000 + (uint64_t)k);
        ms_recorder_push(rec, &e);
    }
    ms_event *out = calloc((size_t)n * GATHER_MAX, sizeof *out);
    uint64_t cursor = 0;
    size_t got = 0;
    if (MT_OK(r, ms_gather_events(w, rec, &cursor, GATHER_MAX, out, &got, 0, &err), &err)) {
        MT_CHECK(r, cursor == (uint64_t)gather_count(me), "rank %d: cursor %llu after the gather",
                 me, (unsigned long long)cursor);
        size_t total = 0;
        for (int q = 0; q < n; q++) total += (size_t)gather_count(q);
        size_t want_n = me == 0 ? total : (size_t)gather_count(me);
        MT_CHECK(r, got == want_n, "rank %d: %zu events gathered, want %zu", me, got, want_n);
        /* Rank 0 holds every rank's events in rank order, each exactly as pushed. */
        size_t i = 0;
        for (int q = 0; me == 0 && got == total && q < n; q++)
            for (int k = 0; k < gather_count(q); k++, i++) {
                ms_event want = gathered_want(q, k);
                if (memcmp(&out[i], &want, sizeof want)) {
                    MT_CHECK(r, 0, "gathered event %zu (rank %d, #%d) differs from the one pushed",
                             i, q, k);
                    q = n;
                    break;
                }
            }
    }
    /* Nothing new: the next gather moves nothing and keeps the cursor. */
    if (MT_OK(r, ms_gather_events(w, rec, &cursor, GATHER_MAX, out, &got, 0, &err), &err))
        MT_CHECK(r, got == 0 && cursor == (uint64_t)gather_count(me),
                 "rank %d: a second gather moved %zu events", me, got);
    free(out);
    ms_recorder_destroy(rec);
}

static void test_gather_round_trip(void **state) {
    (void)state;
    /* 1..4 thread ranks; under mpirun, the whole world. */
    if (mt_backend() == MS_BACKEND_MPI)
        mt_run(mt_mpi_world(), gather_body, NULL);
    else
        for (int n = 1; n <= 4; n++) mt_run(n, gather_body, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_create_rejects_bad_capacity),
    cmocka_unit_test(test_order_and_stamps),
    cmocka_unit_test(test_wraparound_counts_drops),
    cmocka_unit_test(test_concurrent_reader_sees_whole_ordered_events),
    cmocka_unit_test(test_many_readers),
    cmocka_unit_test(test_groups),
    cmocka_unit_test(test_gather_round_trip),
};

MT_MAIN("recorder", tests)

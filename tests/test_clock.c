/* test_clock.c - cross-rank collection: clock alignment (ping-pong with rank 0) and the
 * incremental gather of events and group tables to rank 0, on thread ranks and, under
 * mpirun, on processes. Every rank function works for any world size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testkit.h"

#include "profiler/record/clock.h"
#include "profiler/record/gather.h"

/* Ranks to run on: 4 threads, or the whole MPI world. */
static int nranks(void) {
    return mt_backend() == MS_BACKEND_MPI ? mt_mpi_world() : 4;
}

static void test_encode_roundtrip(void **state) {
    (void)state;
    const int64_t v[] = {
        0,          1,         -1,        4194303,          4194304,     -4194305,    123456789,
        -987654321, INT64_MAX, INT64_MIN, (int64_t)1 << 62, ms_now_ns(), -ms_now_ns()};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        float f[3];
        ms_clock_encode(v[i], f);
        assert_true(ms_clock_decode(f) == v[i]);
    }
}

/* Every rank's world sequence number, so a test can check they stayed in step. */
static int seqs_agree(mt_rank *r) {
    ms_comm *w = r->ctx->world;
    int n = ms_comm_size(w);
    float mine = (float)ms_comm_seq(w), *all = calloc((size_t)n, sizeof(float));
    size_t *ones = calloc((size_t)n, sizeof(size_t));
    for (int p = 0; p < n; p++) ones[p] = 1;
    ms_error err = {0};
    int ok = MT_OK(r, ms_all_gather(w, &mine, all, ones, &err), &err);
    for (int p = 0; ok && p < n; p++) ok = all[p] == all[0];
    free(all);
    free(ones);
    return ok;
}

static void clock_rank(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *w = r->ctx->world;
    const int me = ms_comm_rank(w);
    const int64_t ms = 1000000;
    ms_error err = {0};
    int64_t off = -1, unc = -1;

    /* The measurement itself: all ranks read one CLOCK_MONOTONIC (threads, or processes on
     * one host), so the true offset is 0 and must lie within the reported uncertainty. */
    for (int rep = 0; rep < 2; rep++) { /* callable again: a refresh */
        if (!MT_OK(r, ms_clock_measure(w, 16, &off, &unc, &err), &err)) return;
        MT_CHECK(r, unc >= 0, "rank %d: negative uncertainty %lld", me, (long long)unc);
        MT_CHECK(r, llabs(off) <= unc + ms, "rank %d: offset %lld ns beyond uncertainty %lld ns",
                 me, (long long)off, (long long)unc);
        if (me == 0) MT_CHECK(r, off == 0 && unc == 0, "rank 0 is the reference");
    }
    if (me == 1)
        printf("# rank 1 (%s): measured offset %lld ns +- %lld ns\n", ms_comm_backend(w),
               (long long)off, (long long)unc);

    if (!MT_OK(r, ms_clock_align(w, 8, &off, &unc, &err), &err)) return;
    if (mt_backend() == MS_BACKEND_THREADS)
        MT_CHECK(r, off == 0 && unc == 0, "threads: shared clock, got %lld +- %lld", (long long)off,
                 (long long)unc);
    else
        MT_CHECK(r, llabs(off) <= unc + ms, "rank %d: offset %lld ns beyond uncertainty %lld ns",
                 me, (long long)off, (long long)unc);

    /* The ping-pongs ran on a private communicator: the world's sequence numbers, which
     * match collectives across ranks in traces, are still equal everywhere. */
    MT_CHECK(r, seqs_agree(r), "world sequence numbers diverged after clock alignment");

    /* Bad arguments fail on every rank before any communication. */
    ms_status st = ms_clock_align(w, 0, &off, &unc, &err);
    MT_CHECK(r, st == MS_ERR_INVALID && strstr(err.msg, "rounds"), "rounds 0: %s", err.msg);
}

static void test_clock_align(void **state) {
    (void)state;
    mt_run(nranks(), clock_rank, NULL);
}

/* --- event gather ------------------------------------------------------------------------ */

#define CAP       64
#define MAX_PER   10
#define OFFSET(r) ((int64_t)1000000 * ((r) + 1)) /* a made-up clock offset per rank */

/* Event i of a rank: its index travels in seq, its original time is 10 i. */
static void push_n(ms_recorder *rec, uint64_t *next, int count) {
    for (int k = 0; k < count; k++) {
        ms_event e;
        memset(&e, 0, sizeof e);
        e.kind = MS_EV_COLL;
        e.t0_ns = (int64_t)(*next * 10);
        e.t1_ns = e.t0_ns + 7;
        e.u.coll.seq = (int64_t)*next;
        e.u.coll.bytes = *next * 3;
        snprintf(e.u.coll.algo, sizeof e.u.coll.algo, "ev%llu", (unsigned long long)*next);
        ms_recorder_push(rec, &e);
        (*next)++;
    }
}

typedef struct expect {
    uint64_t next[64];  /* per rank: the index the next event must carry */
    uint64_t count[64]; /* per rank: events received */
} expect;

/* Rank 0: checks one call's output and advances the expectations. */
static void check_batch(mt_rank *r, expect *x, const ms_event *ev, size_t n, int nr) {
    size_t per[64] = {0};
    int prev_rank = 0;
    for (size_t i = 0; i < n; i++) {
        const ms_event *e = &ev[i];
        int q = e->rank;
        if (q < 0 || q >= nr) {
            mt_failf(r, __FILE__, __LINE__, "event %zu has rank %d", i, q);
            return;
        }
        MT_CHECK(r, q >= prev_rank, "ranks out of order in the output: %d after %d", q, prev_rank);
        prev_rank = q;
        per[q]++;
        uint64_t idx = (uint64_t)e->u.coll.seq;
        MT_CHECK(r, idx == x->next[q], "rank %d: got event %llu, expected %llu", q,
                 (unsigned long long)idx, (unsigned long long)x->next[q]);
        MT_CHECK(r, e->t0_ns == (int64_t)idx * 10 + OFFSET(q) && e->t1_ns == e->t0_ns + 7,
                 "rank %d event %llu: times not shifted by the offset", q, (unsigned long long)idx);
        char want[16];
        snprintf(want, sizeof want, "ev%llu", (unsigned long long)idx);
        MT_CHECK(
            r, !strcmp(e->u.coll.algo, want) && e->u.coll.bytes == idx * 3 && e->kind == MS_EV_COLL,
            "rank %d event %llu: payload damaged", q, (unsigned long long)idx);
        x->next[q] = idx + 1;
        x->count[q]++;
    }
    for (int q = 0; q < nr; q++)
        MT_CHECK(r, per[q] <= MAX_PER, "rank %d sent %zu > %d events in one call", q, per[q],
                 MAX_PER);
}

static void gather_rank(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *w = r->ctx->world;
    const int me = ms_comm_rank(w), nr = ms_comm_size(w);
    if (nr > 64) return;
    ms_error err = {0};
    ms_recorder *rec = NULL;
    if (!MT_OK(r, ms_recorder_create(me, CAP, &rec, &err), &err)) return;
    /* Rank 0 collects; odd ranks let the gather allocate their staging buffer. */
    ms_event *out = me == 0  ? calloc((size_t)nr * MAX_PER, sizeof *out)
                    : me % 2 ? NULL
                             : calloc(MAX_PER, sizeof *out);
    expect *x = calloc(1, sizeof *x);
    uint64_t cursor = 0, next = 0;
    size_t n = 0;

    /* Phase 1: uneven backlogs (rank q has 5 + 7q), drained over several bounded calls. */
    push_n(rec, &next, 5 + 7 * me);
    int calls = (5 + 7 * (nr - 1) + MAX_PER - 1) / MAX_PER;
    for (int c = 0; c < calls; c++) {
        if (!MT_OK(r, ms_gather_events(w, rec, &cursor, MAX_PER, out, &n, OFFSET(me), &err), &err))
            break;
        if (me == 0) check_batch(r, x, out, n, nr);
        MT_CHECK(r, me == 0 || n <= MAX_PER, "rank %d: n_out %zu", me, n);
    }
    MT_CHECK(r, cursor == next, "rank %d: cursor %llu after draining %llu events", me,
             (unsigned long long)cursor, (unsigned long long)next);
    if (me == 0)
        for (int q = 0; q < nr; q++)
            MT_CHECK(r, x->count[q] == (uint64_t)(5 + 7 * q), "rank %d: %llu of %d events", q,
                     (unsigned long long)x->count[q], 5 + 7 * q);

    /* Phase 2: an empty call moves nothing. */
    if (MT_OK(r, ms_gather_events(w, rec, &cursor, MAX_PER, out, &n, OFFSET(me), &err), &err))
        MT_CHECK(r, n == 0, "rank %d: %zu events from an empty ring", me, n);

    /* Phase 3: the last rank overruns its ring before the next gather: only the newest CAP
     * events can arrive, in order; the others push a few and lose nothing. */
    const int over = nr - 1;
    uint64_t first_kept = next;
    if (me == over) {
        push_n(rec, &next, 3 * CAP);
        first_kept = next - CAP;
    } else {
        push_n(rec, &next, 4);
    }
    /* Rank 0 learns where the overrun rank's survivors start: a broadcast of first_kept. */
    float fk[3];
    ms_clock_encode((int64_t)first_kept, fk);
    if (MT_OK(r, ms_broadcast(w, fk, 3, over, &err), &err) && me == 0)
        x->next[over] = (uint64_t)ms_clock_decode(fk);
    uint64_t before = me == 0 ? x->count[over] : 0;
    for (int c = 0; c < CAP / MAX_PER + 1; c++) {
        if (!MT_OK(r, ms_gather_events(w, rec, &cursor, MAX_PER, out, &n, OFFSET(me), &err), &err))
            break;
        if (me == 0) check_batch(r, x, out, n, nr);
    }
    MT_CHECK(r, cursor == next, "rank %d: cursor %llu, pushed %llu", me, (unsigned long long)cursor,
             (unsigned long long)next);
    if (me == 0) {
        MT_CHECK(r, x->count[over] - before == CAP, "overrun rank: %llu survivors arrived",
                 (unsigned long long)(x->count[over] - before));
        for (int q = 0; q < nr - 1; q++)
            MT_CHECK(r, x->count[q] == (uint64_t)(5 + 7 * q + 4), "rank %d: %llu events", q,
                     (unsigned long long)x->count[q]);
    }

    /* Phase 4: ranks disagreeing on max_per_rank all fail alike, and lose nothing. */
    push_n(rec, &next, 2);
    uint64_t c0 = cursor;
    ms_status st = ms_gather_events(w, rec, &cursor, me == 1 ? MAX_PER - 1 : MAX_PER, out, &n,
                                    OFFSET(me), &err);
    if (nr > 1)
        MT_CHECK(r, st == MS_ERR_INVALID && cursor == c0 && strstr(err.msg, "max_per_rank"),
                 "rank %d: mismatched max_per_rank gave %s (%s)", me, ms_status_str(st), err.msg);
    if (st != MS_OK) {
        /* The events are still there for the next (correct) call. */
        if (MT_OK(r, ms_gather_events(w, rec, &cursor, MAX_PER, out, &n, OFFSET(me), &err), &err) &&
            me == 0) {
            check_batch(r, x, out, n, nr);
            MT_CHECK(r, n == (size_t)(2 * nr), "retry delivered %zu events", n);
        }
    }
    MT_CHECK(r, seqs_agree(r), "world sequence numbers diverged after gathers");

    free(x);
    free(out);
    ms_recorder_destroy(rec);
}

static void test_gather_events(void **state) {
    (void)state;
    mt_run(nranks(), gather_rank, NULL);
}

/* --- group gather ------------------------------------------------------------------------- */

static ms_group group_of(const char *name, int n, const int *ranks) {
    ms_group g;
    memset(&g, 0, sizeof g);
    snprintf(g.name, sizeof g.name, "%s", name);
    g.size = n;
    for (int i = 0; i < n && i < MS_EV_GROUP_MAX; i++) g.ranks[i] = ranks[i];
    return g;
}

static void groups_rank(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *w = r->ctx->world;
    const int me = ms_comm_rank(w), nr = ms_comm_size(w);
    ms_error err = {0};
    ms_recorder *rec = NULL;
    if (!MT_OK(r, ms_recorder_create(me, 8, &rec, &err), &err)) return;
    int world[64], pair[2] = {me, (me + 1) % nr}, half[64], nh = 0;
    for (int q = 0; q < nr && q < 64; q++) world[q] = q;
    for (int q = me % 2; q < nr && nh < 64; q += 2) half[nh++] = q;
    ms_group gw = group_of("world", nr, world), gp = group_of("p2p", 2, pair);
    ms_group gh = group_of("dp", nh, half);
    int32_t id_w = ms_recorder_group(rec, &gw);
    ms_recorder_group(rec, &gh);
    if (nr > 1) ms_recorder_group(rec, &gp);

    ms_group *out = me == 0 ? calloc(4 * (size_t)nr + 4, sizeof *out) : NULL;
    int n = -1;
    if (MT_OK(r, ms_gather_groups(w, rec, out, 4 * nr + 4, &n, &err), &err) && me == 0) {
        /* world once, dp for evens and odds, one p2p pair per rank */
        int want = 1 + (nr > 1 ? 2 : 1) + (nr > 1 ? nr : 0);
        MT_CHECK(r, n == want, "got %d groups, expected %d", n, want);
        int seen_w = 0, pairs = 0;
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < i; j++)
                MT_CHECK(r, out[i].id != out[j].id, "group id %d twice", (int)out[i].id);
            if (out[i].id == id_w) {
                seen_w++;
                MT_CHECK(r, out[i].size == nr && !strcmp(out[i].name, "world"), "world group");
            }
            if (!strcmp(out[i].name, "p2p")) {
                pairs++;
                MT_CHECK(r, out[i].ranks[1] == (out[i].ranks[0] + 1) % nr, "pair group ranks");
            }
        }
        MT_CHECK(r, seen_w == 1, "world group seen %d times", seen_w);
        MT_CHECK(r, pairs == (nr > 1 ? nr : 0), "%d pair groups", pairs);
    }
    /* A small table on rank 0 keeps the first max. */
    ms_group small[2];
    if (MT_OK(r, ms_gather_groups(w, rec, me == 0 ? small : NULL, 2, &n, &err), &err) && me == 0)
        MT_CHECK(r, n == 2 && small[0].id == id_w, "truncated table: %d groups", n);
    free(out);
    ms_recorder_destroy(rec);
}

static void test_gather_groups(void **state) {
    (void)state;
    mt_run(nranks(), groups_rank, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_encode_roundtrip),
    cmocka_unit_test(test_clock_align),
    cmocka_unit_test(test_gather_events),
    cmocka_unit_test(test_gather_groups),
};

MT_MAIN("clock", tests)

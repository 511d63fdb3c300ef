/* test_analysis.c - the analysis on synthetic traces whose answers are known by
 * construction: bytes per peer against the nccl-tests factors, heatmap matrices and row
 * sums, HTA overlap on hand-built intervals, step breakdowns, bus bandwidth for known
 * durations, stragglers, reshard and operator tables, the step window, and the report.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testkit.h"

#include "engine/pipeline/simulate.h"
#include "profiler/analysis.h"

#define MS(x)      ((int64_t)((x)*1000000.0)) /* milliseconds -> ns */
#define NEAR(a, b) near_((double)(a), (double)(b))

static int near_(double a, double b) {
    return fabs(a - b) <= 1e-9 * (1.0 + fabs(b));
}

/* --- building traces ---------------------------------------------------------------------- */

typedef struct trace {
    ms_event ev[4096];
    size_t n;
    ms_group g[64];
    int ng;
} trace;

static ms_event *add(trace *t, int rank, ms_ev_kind kind, int64_t step, int64_t t0, int64_t t1) {
    assert_true(t->n < sizeof t->ev / sizeof t->ev[0]);
    ms_event *e = &t->ev[t->n++];
    memset(e, 0, sizeof *e);
    e->kind = (uint8_t)kind;
    e->phase = MS_PHASE_OTHER;
    e->rank = rank;
    e->step = step;
    e->t0_ns = t0;
    e->t1_ns = t1;
    return e;
}

static int32_t group(trace *t, int32_t id, const char *name, int n, const int *ranks) {
    ms_group *g = &t->g[t->ng++];
    memset(g, 0, sizeof *g);
    g->id = id;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->size = n;
    for (int i = 0; i < n; i++) g->ranks[i] = ranks[i];
    return id;
}

/* One rank's event of a collective on group gid (pos = its position in the group). */
static ms_event *coll(trace *t, int rank, ms_coll_kind k, int32_t gid, int n, int pos, int64_t seq,
                      uint64_t bytes, const char *algo, int dim, int64_t t0, int64_t t1) {
    ms_event *e = add(t, rank, MS_EV_COLL, 0, t0, t1);
    e->u.coll.coll = (uint8_t)k;
    e->u.coll.group = gid;
    e->u.coll.group_size = n;
    e->u.coll.group_rank = pos;
    e->u.coll.seq = seq;
    e->u.coll.bytes = bytes;
    e->u.coll.mesh_dim = (int16_t)dim;
    snprintf(e->u.coll.algo, sizeof e->u.coll.algo, "%s", algo);
    return e;
}

static ms_event *op(trace *t, int rank, const char *opname, ms_ev_phase ph, int64_t step,
                    int64_t t0, int64_t t1, double flops) {
    ms_event *e = add(t, rank, MS_EV_OP, step, t0, t1);
    e->phase = (uint8_t)ph;
    snprintf(e->u.op.opname, sizeof e->u.op.opname, "%s", opname);
    snprintf(e->u.op.name, sizeof e->u.op.name, "node.%s", opname);
    e->u.op.flops = flops;
    return e;
}

static void analyze(const trace *t, int64_t lo, int64_t hi, ms_analysis *a) {
    ms_error err = {0};
    ms_status st = ms_analyze(t->ev, t->n, t->g, t->ng, lo, hi, a, &err);
    if (st != MS_OK) print_error("%s\n", err.msg);
    assert_int_equal(st, MS_OK);
}

/* What a rank sends in all, from the nccl-tests bus-bandwidth factors (docs/formats.md section 1)
 * and the broadcast/send_recv rules: the independent answer for row sums. */
static double expected_sent(ms_coll_kind k, int n, double b, int ring, int me, int root) {
    switch (k) {
        case MS_COLL_ALL_REDUCE:
        case MS_COLL_REDUCE_SCATTER:
        case MS_COLL_ALL_GATHER:
        case MS_COLL_ALL_TO_ALL:
            return ms_coll_busbw_factor(k, n) * b;
        case MS_COLL_BROADCAST:
            if (ring) return (me + 1) % n != root ? b : 0;
            return me == root ? (n - 1) * b : 0;
        case MS_COLL_P2P:
            return n > 1 ? b : 0;
        default:
            return 0;
    }
}

/* --- bytes per peer ------------------------------------------------------------------------- */

static void test_bytes_per_peer_rules(void **state) {
    (void)state;
    const char *algos[] = {"ring", "ring-ll", "shm-direct", "mpi", "direct", "who-knows"};
    const ms_coll_kind kinds[] = {MS_COLL_ALL_REDUCE, MS_COLL_REDUCE_SCATTER, MS_COLL_ALL_GATHER,
                                  MS_COLL_ALL_TO_ALL, MS_COLL_BROADCAST,      MS_COLL_BARRIER,
                                  MS_COLL_SPLIT};
    double out[16];
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
            for (int n = 1; n <= 8; n++)
                for (int me = 0; me < n; me++)
                    for (int root = 0; root < n; root++) {
                        ms_ev_coll c = {.coll = (uint8_t)kinds[k],
                                        .group_size = n,
                                        .group_rank = me,
                                        .bytes = 1 << 20,
                                        .root = root};
                        snprintf(c.algo, sizeof c.algo, "%s", algos[a]);
                        ms_bytes_per_peer(&c, out);
                        int ring = !strncmp(algos[a], "ring", 4);
                        double sum = 0;
                        for (int p = 0; p < n; p++) {
                            sum += out[p];
                            assert_true(out[p] >= 0);
                        }
                        assert_true(out[me] == 0);
                        double want =
                            n == 1 ? 0 : expected_sent(kinds[k], n, 1 << 20, ring, me, root);
                        assert_true(NEAR(sum, want));
                        /* Ring collectives (not all_to_all) talk to the next rank only. */
                        if (ring && kinds[k] != MS_COLL_ALL_TO_ALL)
                            for (int p = 0; p < n; p++)
                                if (p != (me + 1) % n) assert_true(out[p] == 0);
                    }
    /* Direct all_reduce: 2B/n to each peer; a 2-member send_recv: all to the other. */
    ms_ev_coll ar = {.coll = MS_COLL_ALL_REDUCE, .group_size = 4, .group_rank = 1, .bytes = 400};
    snprintf(ar.algo, sizeof ar.algo, "shm-direct");
    ms_bytes_per_peer(&ar, out);
    assert_true(out[0] == 200 && out[1] == 0 && out[2] == 200 && out[3] == 200);
    ms_ev_coll p2p = {.coll = MS_COLL_P2P, .group_size = 2, .group_rank = 0, .bytes = 12};
    ms_bytes_per_peer(&p2p, out);
    assert_true(out[0] == 0 && out[1] == 12);
}

/* --- heatmaps --------------------------------------------------------------------------------- */

static void test_heatmap_ring_all_reduce_exact(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    int w[] = {0, 1, 2, 3};
    int32_t gw = group(t, 77, "world", 4, w);
    const uint64_t b = 8 << 20;
    for (int seq = 1; seq <= 3; seq++)
        for (int r = 0; r < 4; r++)
            coll(t, r, MS_COLL_ALL_REDUCE, gw, 4, r, seq, b, "ring", -1, MS(10 * seq),
                 MS(10 * seq + 2));
    ms_analysis a;
    analyze(t, 0, -1, &a);
    assert_int_equal(a.nranks, 4);
    assert_int_equal(a.n_dims, 0);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++) {
            double want = d == (s + 1) % 4 ? 3 * 1.5 * (double)b : 0;
            assert_true(NEAR(a.all.bytes[s * 4 + d], want));
            assert_true(NEAR(a.all.seconds[s * 4 + d], d == (s + 1) % 4 ? 3 * 0.002 : 0));
        }
    ms_analysis_free(&a);
    free(t);
}

static void test_heatmap_row_sums_and_dims(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    /* A 2x2 mesh: dim 0 "dp" groups {0,2} {1,3}, dim 1 "tp" groups {0,1} {2,3}. */
    int w[] = {0, 1, 2, 3}, dp0[] = {0, 2}, dp1[] = {1, 3}, tp0[] = {0, 1}, tp1[] = {2, 3};
    int32_t gw = group(t, 1, "world", 4, w);
    int32_t gdp[2] = {group(t, 10, "dp", 2, dp0), group(t, 11, "dp", 2, dp1)};
    int32_t gtp[2] = {group(t, 20, "tp", 2, tp0), group(t, 21, "tp", 2, tp1)};
    double sent[4] = {0}, sent_dim[2][4] = {{0}};
    int64_t clock = 0;
    for (int it = 0; it < 5; it++) {
        uint64_t b = (uint64_t)(1000 + 37 * it);
        for (int r = 0; r < 4; r++) {
            int tp_pos = r % 2, dp_pos = r / 2, dpg = r % 2, tpg = r / 2;
            /* tp: direct all_reduce and reduce_scatter; dp: ring all_gather and broadcast */
            coll(t, r, MS_COLL_ALL_REDUCE, gtp[tpg], 2, tp_pos, 2 * it + 1, b, "shm-direct", 1,
                 clock, clock + 10);
            coll(t, r, MS_COLL_REDUCE_SCATTER, gtp[tpg], 2, tp_pos, 2 * it + 2, 3 * b, "mpi", 1,
                 clock + 20, clock + 30);
            sent_dim[1][r] += expected_sent(MS_COLL_ALL_REDUCE, 2, (double)b, 0, tp_pos, 0) +
                              expected_sent(MS_COLL_REDUCE_SCATTER, 2, 3.0 * b, 0, tp_pos, 0);
            coll(t, r, MS_COLL_ALL_GATHER, gdp[dpg], 2, dp_pos, 2 * it + 1, 5 * b, "ring", 0,
                 clock + 40, clock + 50);
            ms_event *bc = coll(t, r, MS_COLL_BROADCAST, gdp[dpg], 2, dp_pos, 2 * it + 2, 7 * b,
                                "shm-direct", 0, clock + 60, clock + 70);
            bc->u.coll.root = 1;
            sent_dim[0][r] += expected_sent(MS_COLL_ALL_GATHER, 2, 5.0 * b, 1, dp_pos, 0) +
                              expected_sent(MS_COLL_BROADCAST, 2, 7.0 * b, 0, dp_pos, 1);
            /* world: all_to_all and a barrier (no bytes) */
            coll(t, r, MS_COLL_ALL_TO_ALL, gw, 4, r, 2 * it + 1, 11 * b, "shm-direct", -1,
                 clock + 80, clock + 90);
            coll(t, r, MS_COLL_BARRIER, gw, 4, r, 2 * it + 2, 0, "shm-direct", -1, clock + 95,
                 clock + 99);
            sent[r] += expected_sent(MS_COLL_ALL_TO_ALL, 4, 11.0 * b, 0, r, 0);
        }
        clock += 1000;
    }
    /* point-to-point: one event per send on a {sender, receiver} pair group */
    int pair[2] = {3, 0};
    int32_t gp = group(t, 30, "p2p", 2, pair);
    coll(t, 3, MS_COLL_P2P, gp, 2, 0, 1, 4096, "shm-mailbox", -1, clock, clock + 5);
    sent[3] += 4096;
    /* a collective on a group the table does not know: left out of the heatmap */
    coll(t, 0, MS_COLL_ALL_REDUCE, 999, 4, 0, 1, 1 << 20, "ring", -1, clock, clock + 5);

    ms_analysis a;
    analyze(t, 0, -1, &a);
    assert_int_equal(a.nranks, 4);
    assert_int_equal(a.n_dims, 2);
    assert_string_equal(a.dim_names[0], "dp");
    assert_string_equal(a.dim_names[1], "tp");
    for (int s = 0; s < 4; s++) {
        double row = 0, row_d[2] = {0, 0};
        for (int d = 0; d < 4; d++) {
            row += a.all.bytes[s * 4 + d];
            for (int k = 0; k < 2; k++) {
                double v = a.per_dim[k].bytes[s * 4 + d];
                row_d[k] += v;
                /* per-dim traffic stays inside that dim's groups */
                int same_group = k == 0 ? (s % 2 == d % 2) : (s / 2 == d / 2);
                if (!same_group || s == d) assert_true(v == 0);
            }
        }
        for (int k = 0; k < 2; k++) assert_true(NEAR(row_d[k], sent_dim[k][s]));
        assert_true(NEAR(row, sent[s] + sent_dim[0][s] + sent_dim[1][s]));
    }
    /* the broadcast from dp position 1 (ranks 2 and 3) only flows downwards */
    assert_true(a.per_dim[0].bytes[2 * 4 + 0] > a.per_dim[0].bytes[0 * 4 + 2]);
    assert_true(a.all.bytes[3 * 4 + 0] >= 4096);
    assert_true(a.per_dim[0].mesh_dim == 0 && a.all.mesh_dim == -1);
    ms_analysis_free(&a);
    free(t);
}

/* --- overlap and steps ------------------------------------------------------------------------ */

static void test_overlap_and_steps(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    int w[] = {0, 1};
    int32_t g = group(t, 5, "world", 2, w);
    /* rank 0: comm [0,10) with compute [5,15): overlap 0.5, exposed 5 */
    coll(t, 0, MS_COLL_ALL_REDUCE, g, 2, 0, 1, 64, "ring", -1, MS(0), MS(10));
    op(t, 0, "matmul", MS_PHASE_FORWARD, 0, MS(5), MS(15), 1e9);
    add(t, 0, MS_EV_STEP, 0, MS(0), MS(20));
    /* rank 1: nested and overlapping intervals of both kinds
     *   comm [0,10) [2,4) [8,12)        -> union [0,12)         = 12
     *   ops  [1,3) [2,5) [11,20)        -> union [1,5) [11,20)  = 13
     *   both                            -> [1,5) [11,12)        = 5 */
    coll(t, 1, MS_COLL_ALL_REDUCE, g, 2, 1, 1, 64, "ring", -1, MS(0), MS(10));
    coll(t, 1, MS_COLL_BROADCAST, g, 2, 1, 2, 64, "ring", -1, MS(2), MS(4));
    coll(t, 1, MS_COLL_ALL_GATHER, g, 2, 1, 3, 64, "ring", -1, MS(8), MS(12));
    op(t, 1, "gelu", MS_PHASE_FORWARD, 0, MS(1), MS(3), 0);
    op(t, 1, "matmul", MS_PHASE_BACKWARD, 0, MS(2), MS(5), 0);
    op(t, 1, "matmul", MS_PHASE_BACKWARD, 0, MS(11), MS(20), 0);
    add(t, 1, MS_EV_STEP, 0, MS(0), MS(25));
    /* step 1: rank 0 is the slow one; an op hangs over the end of its step and is clipped */
    add(t, 0, MS_EV_STEP, 1, MS(100), MS(130));
    op(t, 0, "matmul", MS_PHASE_FORWARD, 1, MS(120), MS(140), 0);
    coll(t, 0, MS_COLL_ALL_REDUCE, g, 2, 0, 4, 64, "ring", -1, MS(110), MS(125))->step = 1;
    add(t, 1, MS_EV_STEP, 1, MS(100), MS(110));

    ms_analysis a;
    analyze(t, 0, 0, &a); /* step 0 only */
    const ms_rank_overlap *o0 = &a.overlap[0], *o1 = &a.overlap[1];
    assert_true(NEAR(o0->comm_s, 0.010) && NEAR(o0->compute_s, 0.010));
    assert_true(NEAR(o0->overlapped_s, 0.005) && NEAR(o0->exposed_comm_s, 0.005));
    assert_true(NEAR(o0->overlap_ratio, 0.5));
    assert_true(NEAR(o1->comm_s, 0.012) && NEAR(o1->compute_s, 0.013));
    assert_true(NEAR(o1->overlapped_s, 0.005) && NEAR(o1->exposed_comm_s, 0.007));
    assert_true(NEAR(o1->overlap_ratio, 5.0 / 12.0));
    assert_int_equal(a.n_steps, 1);
    /* step 0 as seen on rank 1 (25 ms, the slowest): 13 compute + 7 exposed + 5 idle */
    const ms_step_row *s = &a.steps[0];
    assert_int_equal(s->step, 0);
    assert_int_equal(s->rank, 1);
    assert_true(NEAR(s->wall_s, 0.025) && NEAR(s->compute_s, 0.013));
    assert_true(NEAR(s->exposed_comm_s, 0.007) && NEAR(s->idle_s, 0.005));
    ms_analysis_free(&a);

    analyze(t, 0, -1, &a); /* both steps */
    assert_int_equal(a.n_steps, 2);
    s = &a.steps[1];
    /* rank 0, [100,130): op [120,130) = 10, comm [110,125) with 5 of it under the op */
    assert_int_equal(s->step, 1);
    assert_int_equal(s->rank, 0);
    assert_true(NEAR(s->wall_s, 0.030) && NEAR(s->compute_s, 0.010));
    assert_true(NEAR(s->exposed_comm_s, 0.010) && NEAR(s->idle_s, 0.010));
    assert_true(NEAR(s->wall_s, s->compute_s + s->exposed_comm_s + s->idle_s));
    /* no communication: ratio 0, not NaN */
    ms_analysis_free(&a);
    trace *u = calloc(1, sizeof *u);
    op(u, 0, "matmul", MS_PHASE_FORWARD, 0, 0, 100, 0);
    analyze(u, 0, -1, &a);
    assert_true(a.overlap[0].overlap_ratio == 0 && a.overlap[0].comm_s == 0);
    assert_int_equal(a.n_steps, 0);
    ms_analysis_free(&a);
    free(u);
    free(t);
}

/* Exposed communication per step and the data-parallel share hidden under compute: a dp
 * group (mesh dim 1, named "dp") whose all-reduces run under backward ops, and a tp group
 * (mesh dim 0) whose collectives do not count as dp. */
static void test_overlap_per_step_and_dp(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    int tp_ranks[] = {0, 1}, dp_ranks[] = {0, 2};
    int32_t tp = group(t, 1, "tp", 2, tp_ranks), dp = group(t, 2, "dp", 2, dp_ranks);
    /* rank 0, step 0 [0,40): ops [0,20); dp [10,30) -> 10 hidden, 10 exposed;
     *                        tp [30,34) -> 4 exposed. Exposed in the step: 14.
     * rank 0, step 1 [100,120): ops [100,110); dp [105,107) all hidden. Exposed: 0.
     * Exposed per step: (14 + 0) / 2 = 7. dp: 22 ms, 12 hidden. */
    op(t, 0, "matmul", MS_PHASE_BACKWARD, 0, MS(0), MS(20), 0);
    coll(t, 0, MS_COLL_ALL_REDUCE, dp, 2, 0, 1, 64, "shm", 1, MS(10), MS(30));
    coll(t, 0, MS_COLL_ALL_REDUCE, tp, 2, 0, 1, 64, "shm", 0, MS(30), MS(34));
    add(t, 0, MS_EV_STEP, 0, MS(0), MS(40));
    op(t, 0, "matmul", MS_PHASE_BACKWARD, 1, MS(100), MS(110), 0);
    coll(t, 0, MS_COLL_ALL_REDUCE, dp, 2, 0, 2, 64, "shm", 1, MS(105), MS(107))->step = 1;
    add(t, 0, MS_EV_STEP, 1, MS(100), MS(120));
    /* rank 2: the dp peer, nothing hidden, one step: exposed 20 per step */
    coll(t, 2, MS_COLL_ALL_REDUCE, dp, 2, 1, 1, 64, "shm", 1, MS(10), MS(30));
    add(t, 2, MS_EV_STEP, 0, MS(0), MS(40));
    ms_analysis a;
    analyze(t, 0, -1, &a);
    const ms_rank_overlap *o0 = &a.overlap[0], *o2 = &a.overlap[2];
    assert_int_equal(o0->steps, 2);
    assert_true(NEAR(o0->exposed_comm_step_s, 0.007));
    assert_true(NEAR(o0->dp_comm_s, 0.022) && NEAR(o0->dp_hidden_s, 0.012));
    assert_true(NEAR(o0->dp_hidden_ratio, 12.0 / 22.0));
    assert_int_equal(o2->steps, 1);
    assert_true(NEAR(o2->exposed_comm_step_s, 0.020));
    assert_true(NEAR(o2->dp_comm_s, 0.020) && o2->dp_hidden_s == 0 && o2->dp_hidden_ratio == 0);
    /* rank 1 (tp only) has no steps and no dp communication: zeros, not NaN */
    assert_true(a.overlap[1].steps == 0 && a.overlap[1].exposed_comm_step_s == 0);
    assert_true(a.overlap[1].dp_hidden_ratio == 0);
    ms_analysis_free(&a);
    free(t);
}

/* --- bus bandwidth ---------------------------------------------------------------------------- */

static void test_busbw(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    int w[] = {0, 1, 2, 3};
    int32_t g = group(t, 3, "world", 4, w);
    const uint64_t mib = 1 << 20;
    for (int r = 0; r < 4; r++) {
        /* 1 MiB all_reduce: 1 ms and 3 ms -> mean 2 ms */
        coll(t, r, MS_COLL_ALL_REDUCE, g, 4, r, 1, mib, "ring", -1, MS(0), MS(1));
        coll(t, r, MS_COLL_ALL_REDUCE, g, 4, r, 2, mib, "ring", -1, MS(10), MS(13));
        /* 4 MiB all_gather: 4 ms */
        coll(t, r, MS_COLL_ALL_GATHER, g, 4, r, 3, 4 * mib, "ring", -1, MS(20), MS(24));
        /* a barrier moves nothing and gets no row */
        coll(t, r, MS_COLL_BARRIER, g, 4, r, 4, 0, "ring", -1, MS(30), MS(31));
    }
    ms_analysis a;
    analyze(t, 0, -1, &a);
    assert_int_equal(a.n_busbw, 2);
    const ms_busbw_row *ar = &a.busbw[0], *ag = &a.busbw[1];
    assert_int_equal(ar->coll, MS_COLL_ALL_REDUCE);
    assert_int_equal(ar->group_size, 4);
    assert_int_equal(ar->bytes, mib);
    assert_int_equal(ar->count, 8);
    assert_true(NEAR(ar->mean_s, 0.002));
    /* algbw = 1 MiB / 2 ms; busbw = algbw * 2(n-1)/n = 1.5 algbw */
    assert_true(NEAR(ar->busbw_gbs, (double)mib / 0.002 * 1.5 / 1e9));
    assert_int_equal(ag->coll, MS_COLL_ALL_GATHER);
    assert_int_equal(ag->count, 4);
    assert_true(NEAR(ag->busbw_gbs, 4.0 * mib / 0.004 * 0.75 / 1e9));
    ms_analysis_free(&a);
    free(t);
}

/* --- stragglers ------------------------------------------------------------------------------- */

/* 20 world all_reduces on 4 ranks; each rank enters at base + arrive(rank, instance). */
static void straggler_trace(trace *t, int64_t (*arrive)(int r, int i)) {
    int w[] = {0, 1, 2, 3};
    int32_t g = group(t, 9, "world", 4, w);
    for (int i = 0; i < 20; i++) {
        int64_t base = MS(10 * i);
        int64_t end = base + MS(5);
        for (int r = 0; r < 4; r++)
            coll(t, r, MS_COLL_ALL_REDUCE, g, 4, r, i + 1, 4096, "shm-direct", -1,
                 base + arrive(r, i), end);
    }
}

static int64_t late_rank2(int r, int i) {
    if (r == 2) return MS(3);
    return r == 0 ? 0 : (int64_t)((r + i) % 3) * 5000; /* rank 0 first, others within 10 us */
}
static int64_t jitter(int r, int i) {
    return (int64_t)((r * 7 + i * 3) % 5) * 4000; /* up to 16 us: noise, nobody late */
}
static int64_t rotating(int r, int i) {
    return r == i % 4 ? MS(1) : 0; /* late by 1 ms, but a different rank each time */
}

static void test_stragglers(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    straggler_trace(t, late_rank2);
    /* an incomplete instance (rank 0's event lost) is ignored */
    int64_t b = MS(500);
    for (int r = 1; r < 4; r++)
        coll(t, r, MS_COLL_ALL_REDUCE, 9, 4, r, 99, 4096, "shm-direct", -1,
             b + (r == 1 ? MS(50) : 0), b + MS(60));
    ms_analysis a;
    analyze(t, 0, -1, &a);
    assert_int_equal(a.n_stragglers, 1);
    assert_int_equal(a.stragglers[0].rank, 2);
    assert_true(NEAR(a.stragglers[0].last_fraction, 1.0));
    assert_true(NEAR(a.stragglers[0].mean_lag_s, 0.003));
    assert_int_equal(a.stragglers[0].count, 20);
    ms_analysis_free(&a);

    int64_t (*balanced[])(int, int) = {jitter, rotating};
    for (int k = 0; k < 2; k++) {
        memset(t, 0, sizeof *t);
        straggler_trace(t, balanced[k]);
        analyze(t, 0, -1, &a);
        assert_int_equal(a.n_stragglers, 0);
        ms_analysis_free(&a);
    }
    free(t);
}

/* --- operators, reshards, window ------------------------------------------------------------ */

static ms_event *reshard(trace *t, int rank, const char *from, const char *to, uint64_t bytes,
                         int64_t t0, int64_t t1) {
    ms_event *e = add(t, rank, MS_EV_RESHARD, 0, t0, t1);
    snprintf(e->u.reshard.from, sizeof e->u.reshard.from, "%s", from);
    snprintf(e->u.reshard.to, sizeof e->u.reshard.to, "%s", to);
    snprintf(e->u.reshard.tensor, sizeof e->u.reshard.tensor, "h.0.mlp");
    e->u.reshard.bytes = bytes;
    return e;
}

static void test_ops_and_reshards(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    double total_ms = 0;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 6; i++) {
            op(t, r, "matmul", MS_PHASE_FORWARD, 0, MS(i), MS(i + 0.5), 100);
            op(t, r, "matmul", MS_PHASE_BACKWARD, 0, MS(10 + i), MS(11 + i), 200);
            op(t, r, "softmax", MS_PHASE_FORWARD, 0, MS(20 + i), MS(20.25 + i), 1);
            total_ms += 0.5 + 1 + 0.25;
        }
    reshard(t, 0, "[P(sum)]", "[R]", 1000, MS(30), MS(32));
    reshard(t, 1, "[P(sum)]", "[R]", 1000, MS(30), MS(33));
    reshard(t, 0, "[S(0)]", "[R]", 64, MS(40), MS(40.5));
    /* a from-string that fills its array with no terminator */
    ms_event *full = reshard(t, 1, "", "[R]", 8, MS(50), MS(50.1));
    memset(full->u.reshard.from, 'x', sizeof full->u.reshard.from);

    ms_analysis a;
    analyze(t, 0, -1, &a);
    assert_int_equal(a.n_ops, 3);
    /* most time first: matmul backward 12 ms, matmul forward 6 ms, softmax 3 ms */
    assert_string_equal(a.ops[0].name, "matmul");
    assert_int_equal(a.ops[0].phase, MS_PHASE_BACKWARD);
    assert_int_equal(a.ops[0].count, 12);
    assert_true(NEAR(a.ops[0].seconds, 0.012) && NEAR(a.ops[0].flops, 2400));
    assert_string_equal(a.ops[1].name, "matmul");
    assert_int_equal(a.ops[1].phase, MS_PHASE_FORWARD);
    assert_true(NEAR(a.ops[1].seconds, 0.006) && NEAR(a.ops[1].flops, 1200));
    assert_string_equal(a.ops[2].name, "softmax");
    assert_true(NEAR(a.ops[2].seconds, 0.003));
    double sum = 0;
    for (int i = 0; i < a.n_ops; i++) sum += a.ops[i].seconds;
    assert_true(NEAR(sum, total_ms / 1e3));

    assert_int_equal(a.n_reshards, 3);
    assert_string_equal(a.reshards[0].transition, "[P(sum)] -> [R]");
    assert_int_equal(a.reshards[0].count, 2);
    assert_true(NEAR(a.reshards[0].bytes, 2000) && NEAR(a.reshards[0].seconds, 0.005));
    assert_string_equal(a.reshards[1].transition, "[S(0)] -> [R]");
    assert_int_equal(a.reshards[1].count, 1);
    assert_true(NEAR(a.reshards[1].bytes, 64) && NEAR(a.reshards[1].seconds, 0.0005));
    assert_int_equal(strlen(a.reshards[2].transition), MS_EV_PL_MAX + strlen(" -> [R]"));
    ms_analysis_free(&a);
    free(t);
}

static void test_step_window(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    op(t, 0, "setup", MS_PHASE_OTHER, -1, 0, 10, 0); /* outside any step */
    for (int s = 0; s < 5; s++) op(t, 0, "matmul", MS_PHASE_FORWARD, s, 100 * s, 100 * s + 10, 1);
    ms_analysis a;
    struct {
        int64_t lo, hi;
        int matmuls, setup;
    } cases[] = {{0, -1, 5, 1}, {2, -1, 3, 0}, {1, 3, 3, 0}, {4, 4, 1, 0}, {7, 9, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        analyze(t, cases[c].lo, cases[c].hi, &a);
        int mm = 0, su = 0;
        for (int i = 0; i < a.n_ops; i++) {
            if (!strcmp(a.ops[i].name, "matmul")) mm = a.ops[i].count;
            if (!strcmp(a.ops[i].name, "setup")) su = a.ops[i].count;
        }
        assert_int_equal(mm, cases[c].matmuls);
        assert_int_equal(su, cases[c].setup);
        assert_true(a.step_lo == cases[c].lo && a.step_hi == cases[c].hi);
        ms_analysis_free(&a);
    }
    free(t);
}

static void test_errors(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    op(t, MS_AN_MAX_RANKS, "matmul", MS_PHASE_FORWARD, 0, 0, 1, 0);
    ms_analysis a;
    ms_error err = {0};
    assert_int_equal(ms_analyze(t->ev, t->n, NULL, 0, 0, -1, &a, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "rank 256"));
    ms_analysis_free(&a); /* safe after a failure */
    assert_int_equal(ms_analyze(NULL, 3, NULL, 0, 0, -1, &a, &err), MS_ERR_INVALID);
    ms_analysis_free(&a);
    /* no events at all: an empty, printable analysis */
    assert_int_equal(ms_analyze(NULL, 0, NULL, 0, 0, -1, &a, &err), MS_OK);
    assert_int_equal(a.nranks, 0);
    FILE *f = tmpfile();
    ms_analysis_print(&a, f);
    fclose(f);
    ms_analysis_free(&a);
    free(t);
}

/* --- the report ---------------------------------------------------------------------------------
 */

static char *report(const trace *t) {
    ms_analysis a;
    analyze(t, 0, -1, &a);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ms_analysis_print(&a, f);
    fclose(f);
    ms_analysis_free(&a);
    return buf;
}

static void test_print(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    straggler_trace(t, late_rank2);
    op(t, 0, "matmul", MS_PHASE_FORWARD, 0, MS(1), MS(2), 1e9);
    reshard(t, 0, "[P(sum)]", "[R]", 1000, MS(30), MS(32));
    add(t, 0, MS_EV_STEP, 0, 0, MS(300));
    char *s = report(t);
    const char *want[] = {"4 ranks",    "Steps",        "Overlap per rank",
                          "all_reduce", "matmul",       "[P(sum)] -> [R]",
                          "Stragglers", "Traffic (all", "busbw GB/s"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(s, want[i])) fail_msg("report lacks '%s':\n%s", want[i], s);
    /* the straggler line names rank 2, 100% */
    const char *st = strstr(s, "Stragglers");
    assert_non_null(strstr(st, "    2   100.0%"));
    free(s);

    /* more ranks than a matrix can show: the busiest pairs instead */
    memset(t, 0, sizeof *t);
    int w[20];
    for (int r = 0; r < 20; r++) w[r] = r;
    int32_t g = group(t, 4, "world", 20, w);
    for (int r = 0; r < 20; r++)
        coll(t, r, MS_COLL_ALL_REDUCE, g, 20, r, 1, 1 << 20, "ring", -1, 0, MS(1));
    s = report(t);
    assert_non_null(strstr(s, "from"));
    assert_non_null(strstr(s, "20 ranks"));
    free(s);
    free(t);
}

/* --- the pipeline bubble ------------------------------------------------------------------ */

static ms_event *pipe_ev(trace *t, int rank, int64_t step, int action, int mb, double t0_ms,
                         double t1_ms, int p, int m, const char *sched) {
    ms_event *e = add(t, rank, MS_EV_PIPE, step, MS(t0_ms), MS(t1_ms));
    e->phase = action == MS_PIPE_F ? MS_PHASE_FORWARD : MS_PHASE_BACKWARD;
    ms_ev_pipe *x = &e->u.pipe;
    x->action = (uint8_t)action;
    x->stage = (int16_t)(rank / 2);
    x->mb = mb;
    x->model_chunk = x->stage;
    x->stages = (int16_t)p;
    x->virtual_stages = 1;
    x->micro_batches = m;
    snprintf(x->schedule, sizeof x->schedule, "%s", sched);
    return e;
}

static void test_pipe_formula(void **state) {
    (void)state;
    assert_true(NEAR(ms_pipe_formula_bubble("1f1b", 2, 4, 1), 1.0 / 5));
    assert_true(NEAR(ms_pipe_formula_bubble("gpipe", 4, 8, 1), 3.0 / 11));
    assert_true(NEAR(ms_pipe_formula_bubble("interleaved", 4, 8, 2), 3.0 / 19));
    assert_true(NEAR(ms_pipe_formula_bubble("1f1b", 1, 4, 1), 0));
    assert_true(isnan(ms_pipe_formula_bubble("zb-h1", 4, 8, 1)));
    assert_true(isnan(ms_pipe_formula_bubble("nope", 4, 8, 1)));
}

/* pp 2 x dp 2 (ranks 0, 1 on stage 0; 2, 3 on stage 1), 1f1b with 2 micro-batches, in ms:
 *
 *   step 0  r0  F0 [0,2) F1 [2,4)                   B0 [8,11) B1 [11,14)    busy 10
 *           r1  F0 [0,2) F1 [2,5)                   B0 [9,12) B1 [11,14)    busy 2+3+5 = 10
 *           r2      F0 [2,4) B0 [4,7) F1 [7,9) B1 [9,12)                    busy 10
 *           r3      F0 [2,4) B0 [4,6) F1 [6,8) B1 [8,10)                    busy 8
 *           window [0, 14): bubbles 4/14, 4/14, 4/14, 6/14
 *   step 1  r0, r1 busy [100, 105), r2, r3 busy [105, 110): window 10, every bubble 1/2
 *
 * Stage 0: step 0 4/14, step 1 1/2; stage 1: step 0 (4/14 + 6/14) / 2 = 5/14, step 1 1/2.
 * The step slices (wider than the actions), ops and a stray action of another schedule
 * change nothing. */
/* zb-h1 has no formula here, but a simulated bubble: with F = B = W (each 1 ms, spans in
 * any place) Qi et al.'s (p-1)/(3m+p-1) over p 2 and m 2; with W twice as long, less. */
static void test_pipe_simulated_zb(void **state) {
    (void)state;
    for (int longer_w = 0; longer_w < 2; longer_w++) {
        trace *t = calloc(1, sizeof *t);
        for (int r = 0; r < 4; r += 2)
            for (int j = 0; j < 2; j++) {
                double at = 10 * r + 5 * j;
                pipe_ev(t, r, 0, MS_PIPE_F, j, at, at + 1, 2, 2, "zb-h1");
                pipe_ev(t, r, 0, MS_PIPE_B, j, at + 1, at + 2, 2, 2, "zb-h1");
                pipe_ev(t, r, 0, MS_PIPE_W, j, at + 2, at + 3 + longer_w, 2, 2, "zb-h1");
            }
        ms_analysis a;
        analyze(t, 0, -1, &a);
        assert_true(isnan(a.pipe.formula));
        assert_true(NEAR(a.pipe.mean_w_s, 0.001 * (1 + longer_w)));
        double want = 1.0 / 7;
        if (longer_w) /* the planner's simulator, independently: (p-1) F idle at most */
            assert_int_equal(
                ms_pp_bubble_fraction(MS_SCHEDULE_ZB_H1, 2, 2, 1, 1, 1, 2, &want, NULL), MS_OK);
        assert_true(NEAR(a.pipe.simulated, want));
        assert_true(longer_w ? want < 1.0 / 7 : true);
        ms_analysis_free(&a);
        free(t);
    }
}

static void test_pipe_bubble(void **state) {
    (void)state;
    trace *t = calloc(1, sizeof *t);
    static const double spans[4][4][2] = {{{0, 2}, {2, 4}, {8, 11}, {11, 14}},
                                          {{0, 2}, {2, 5}, {9, 12}, {11, 14}},
                                          {{2, 4}, {7, 9}, {4, 7}, {9, 12}},
                                          {{2, 4}, {6, 8}, {4, 6}, {8, 10}}};
    for (int r = 0; r < 4; r++) {
        add(t, r, MS_EV_STEP, 0, MS(-5), MS(20));
        for (int k = 0; k < 4; k++) {
            pipe_ev(t, r, 0, k < 2 ? MS_PIPE_F : MS_PIPE_B, k % 2, spans[r][k][0], spans[r][k][1],
                    2, 2, "1f1b");
            op(t, r, "matmul", MS_PHASE_FORWARD, 0, MS(spans[r][k][0]), MS(spans[r][k][1]), 1);
        }
        double s1 = r < 2 ? 100 : 105;
        pipe_ev(t, r, 1, MS_PIPE_F, 0, s1, s1 + 2, 2, 2, "1f1b");
        pipe_ev(t, r, 1, MS_PIPE_B, 0, s1 + 2, s1 + 5, 2, 2, "1f1b");
    }
    pipe_ev(t, 0, 0, MS_PIPE_F, 0, -50, -40, 4, 8, "gpipe"); /* another schedule: left out */
    ms_analysis a;
    analyze(t, 0, -1, &a);
    const ms_pipe_stats *p = &a.pipe;
    assert_int_equal(p->stages, 2);
    assert_int_equal(p->virtual_stages, 1);
    assert_int_equal(p->micro_batches, 2);
    assert_string_equal(p->schedule, "1f1b");
    assert_int_equal(p->n_steps, 2);
    assert_int_equal(p->last_step, 1);
    assert_true(NEAR(p->formula, 1.0 / 3));
    assert_true(NEAR(p->stage_bubble[0], (4.0 / 14 + 0.5) / 2));
    assert_true(NEAR(p->stage_bubble[1], (5.0 / 14 + 0.5) / 2));
    assert_true(NEAR(p->bubble, ((4.0 + 4 + 4 + 6) / 14 + 4 * 0.5) / 8));
    assert_true(NEAR(p->last_stage_bubble[0], 0.5) && NEAR(p->last_stage_bubble[1], 0.5));
    assert_true(NEAR(p->last_bubble, 0.5));
    assert_true(NEAR(p->last_window_s, 0.010));
    assert_int_equal(p->stage_ranks[0], 2);
    assert_int_equal(p->stage_ranks[1], 2);
    /* the window's mean action times (the gpipe stray left out): F 25 ms over 12, B 34 over
     * 12; with them the planner's simulator gives 1F1B's formula (it holds for any split) */
    assert_true(NEAR(p->mean_f_s, 0.025 / 12) && NEAR(p->mean_b_s, 0.034 / 12));
    assert_true(p->mean_w_s == 0);
    assert_true(NEAR(p->simulated, 1.0 / 3));
    ms_analysis_free(&a);

    /* Step 0 alone: its window [0, 14). */
    analyze(t, 0, 0, &a);
    assert_int_equal(a.pipe.n_steps, 1);
    assert_int_equal(a.pipe.last_step, 0);
    assert_true(NEAR(a.pipe.last_stage_bubble[0], 4.0 / 14));
    assert_true(NEAR(a.pipe.last_stage_bubble[1], 5.0 / 14));
    assert_true(NEAR(a.pipe.last_bubble, 4.5 / 14));
    assert_true(NEAR(a.pipe.last_window_s, 0.014));
    ms_analysis_free(&a);

    /* The report has a pipeline section with both stages and the formula. */
    char *rep = report(t);
    const char *sec = strstr(rep, "Pipeline: 1f1b, 2 stages, 2 micro-batches");
    if (!sec) fail_msg("no pipeline section in:\n%s", rep);
    assert_non_null(strstr(sec, "     1      2     42.9%      50.0%"));
    assert_non_null(strstr(sec, "formula (p-1)/(m+p-1) = 33.3%"));
    assert_non_null(strstr(sec, "simulated (the planner's: posted transfers, mean F 2.08 B 2.83 "
                                "W 0.00 ms) = 33.3%"));
    free(rep);

    /* One stage (gradient accumulation): measured, but no pipeline section in the report. */
    for (size_t i = 0; i < t->n; i++)
        if (t->ev[i].kind == MS_EV_PIPE) t->ev[i].u.pipe.stages = 1, t->ev[i].u.pipe.stage = 0;
    rep = report(t);
    assert_null(strstr(rep, "Pipeline"));
    free(rep);

    /* No pipeline actions: no pipeline section, stages 0. */
    memset(t, 0, sizeof *t);
    add(t, 0, MS_EV_STEP, 0, 0, MS(1));
    analyze(t, 0, -1, &a);
    assert_int_equal(a.pipe.stages, 0);
    ms_analysis_free(&a);
    rep = report(t);
    assert_null(strstr(rep, "Pipeline"));
    free(rep);
    free(t);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_bytes_per_peer_rules),
    cmocka_unit_test(test_heatmap_ring_all_reduce_exact),
    cmocka_unit_test(test_heatmap_row_sums_and_dims),
    cmocka_unit_test(test_overlap_and_steps),
    cmocka_unit_test(test_overlap_per_step_and_dp),
    cmocka_unit_test(test_busbw),
    cmocka_unit_test(test_stragglers),
    cmocka_unit_test(test_ops_and_reshards),
    cmocka_unit_test(test_step_window),
    cmocka_unit_test(test_errors),
    cmocka_unit_test(test_print),
    cmocka_unit_test(test_pipe_formula),
    cmocka_unit_test(test_pipe_bubble),
    cmocka_unit_test(test_pipe_simulated_zb),
    cmocka_unit_test(test_pipe_simulated_zb),
};

MT_MAIN("analysis", tests)

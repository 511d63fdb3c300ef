/* test_pp_schedule.c - pipeline schedules, their simulator and their diagram.
 *
 * Over every kind, p in {1, 2, 3, 4, 8}, m in {1, 2, 3, 4, 8, 16} and v in {1, 2, 3}:
 * - ms_pp_schedule_check accepts exactly what the rules say (and names a fix otherwise);
 * - each stage runs one F and one B (zb-h1: and one W) per micro-batch and chunk, in that
 *   order, and every transfer has exactly one partner on its peer, checked here from the model
 *   chunk layout rather than by the simulator;
 * - the simulator finds no deadlock, the cross-stage dependencies hold on its timeline, and
 *   the peak in flight on every stage equals ms_pp_inflight_bound's formula;
 * - bubbles: 1f1b and gpipe (p-1)/(m+p-1), interleaved (p-1)/(v m+p-1) with t_f = t_b and
 *   t_w = 0 (the full backward costs t_b + t_w, so t_w = 0 makes B as long as F, the
 *   textbook setting; t_b = 2 t_f is checked too), zb-h1 (p-1)/(3m+p-1) with F = B = W,
 *   strictly below 1f1b's at the same work when m >= p.
 * Then hand-written lists for small cases, a deadlock and a stray send the simulator must
 * name, the planner's extrapolation to many micro-batches, and the printed diagram.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/pipeline/balance.h"
#include "engine/pipeline/diagram.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"
#include "tests/testkit.h"

static const int P[] = {1, 2, 3, 4, 8}, M[] = {1, 2, 3, 4, 8, 16};
#define NP (int)(sizeof P / sizeof *P)
#define NM (int)(sizeof M / sizeof *M)

/* The rules, restated: which (kind, p, m, v) a schedule runs on. */
static bool accepted(ms_schedule k, int p, int m, int v) {
    if (k != MS_SCHEDULE_INTERLEAVED) return v == 1;
    return v >= 2 && p >= 2 && m % p == 0;
}

typedef void (*case_fn)(ms_schedule k, int p, int m, int v, const ms_pp_plan *pl);

/* Runs fn on the plan of every accepted case; checks the refusals of the others. */
static int each_case(case_fn fn) {
    int n = 0;
    for (int k = 0; k < MS_SCHEDULE_COUNT; k++)
        for (int a = 0; a < NP; a++)
            for (int b = 0; b < NM; b++)
                for (int v = 1; v <= 3; v++) {
                    int p = P[a], m = M[b];
                    ms_error err = {0};
                    ms_status st = ms_pp_schedule_check((ms_schedule)k, p, m, v, &err);
                    if (!accepted((ms_schedule)k, p, m, v)) {
                        if (st != MS_ERR_INVALID || !err.msg[0])
                            fail_msg("%s p%d m%d v%d accepted", ms_schedule_name(k), p, m, v);
                        ms_pp_plan pl;
                        assert_int_equal(ms_pp_plan_make((ms_schedule)k, p, m, v, &pl, NULL),
                                         MS_ERR_INVALID);
                        continue;
                    }
                    if (st != MS_OK)
                        fail_msg("%s p%d m%d v%d refused: %s", ms_schedule_name(k), p, m, v,
                                 err.msg);
                    ms_pp_plan pl;
                    assert_int_equal(ms_pp_plan_make((ms_schedule)k, p, m, v, &pl, &err), MS_OK);
                    fn((ms_schedule)k, p, m, v, &pl);
                    ms_pp_plan_free(&pl);
                    n++;
                }
    return n;
}

static const char *case_name(ms_schedule k, int p, int m, int v) {
    static char buf[64];
    snprintf(buf, sizeof buf, "%s p%d m%d v%d", ms_schedule_name(k), p, m, v);
    return buf;
}

/* --- the lists ------------------------------------------------------------------------------- */

static void check_computes(ms_schedule k, int p, int m, int v, const ms_pp_plan *pl) {
    const bool zb = k == MS_SCHEDULE_ZB_H1;
    int *pos = malloc(sizeof(int) * 3 * (size_t)m * v);
    for (int s = 0; s < p; s++) {
        for (int i = 0; i < 3 * m * v; i++) pos[i] = -1;
        for (int i = 0; i < pl->n[s]; i++) {
            const ms_pp_action *a = &pl->act[s][i];
            if (ms_pp_is_comm(a->op)) {
                if (a->peer < 0 || a->peer >= p || a->peer == s)
                    fail_msg("%s stage %d action %d: peer %d", case_name(k, p, m, v), s, i,
                             a->peer);
                continue;
            }
            if (a->peer != -1 || a->chunk >= v || a->mb < 0 || a->mb >= m ||
                (a->op == MS_PP_WEIGHT && !zb))
                fail_msg("%s stage %d action %d: op %d chunk %d mb %d peer %d",
                         case_name(k, p, m, v), s, i, a->op, a->chunk, a->mb, a->peer);
            int *slot = &pos[(a->op * m + a->mb) * v + a->chunk];
            if (*slot >= 0)
                fail_msg("%s stage %d: %s mb %d chunk %d twice", case_name(k, p, m, v), s,
                         ms_pp_op_name((ms_pp_op)a->op), a->mb, a->chunk);
            *slot = i;
        }
        for (int mb = 0; mb < m; mb++)
            for (int c = 0; c < v; c++) {
                int f = pos[(0 * m + mb) * v + c], b = pos[(1 * m + mb) * v + c];
                int w = pos[(2 * m + mb) * v + c];
                if (f < 0 || b < 0 || (zb && w < 0) || !(f < b) || (zb && !(b < w)))
                    fail_msg("%s stage %d mb %d chunk %d: F at %d, B at %d, W at %d",
                             case_name(k, p, m, v), s, mb, c, f, b, w);
            }
    }
    free(pos);
}

static void computes_once_in_order(void **state) {
    (void)state;
    int n = each_case(check_computes);
    printf("%d accepted cases\n", n);
    assert_true(n > 100);
}

/* Every transfer from the chunk layout: model chunk k = chunk p + stage sends its activation
 * to k+1 and its input gradient to k-1, on ranks (k +- 1) mod p, and nothing past the ends. */
static void check_transfers(ms_schedule k, int p, int m, int v, const ms_pp_plan *pl) {
    const int chunks = p * v;
    /* per (activation | gradient, boundary after model chunk b, mb): sends and receives */
    int *sends = calloc((size_t)2 * chunks * m, sizeof(int));
    int *recvs = calloc((size_t)2 * chunks * m, sizeof(int));
    for (int s = 0; s < p; s++) {
        /* what this stage has received and computed so far, for the order checks */
        bool *have = calloc((size_t)4 * m * v, sizeof(bool)); /* recv-act, F, recv-grad, B */
        for (int i = 0; i < pl->n[s]; i++) {
            const ms_pp_action *a = &pl->act[s][i];
            int mc = a->chunk * p + s, at = a->mb * v + a->chunk, dir, boundary, peer;
            switch (a->op) {
                case MS_PP_FORWARD:
                    if (mc > 0 && !have[at])
                        fail_msg("%s: F before its receive", case_name(k, p, m, v));
                    have[m * v + at] = true;
                    continue;
                case MS_PP_BACKWARD:
                    if (mc < chunks - 1 && !have[2 * m * v + at])
                        fail_msg("%s: B before its receive", case_name(k, p, m, v));
                    have[3 * m * v + at] = true;
                    continue;
                case MS_PP_WEIGHT:
                    continue;
                case MS_PP_SEND_ACT:
                    if (!have[m * v + at]) fail_msg("%s: send-act before F", case_name(k, p, m, v));
                    dir = 0, boundary = mc, peer = (mc + 1) % p;
                    break;
                case MS_PP_RECV_ACT:
                    have[at] = true;
                    dir = 0, boundary = mc - 1, peer = (mc - 1 + p) % p;
                    break;
                case MS_PP_SEND_GRAD:
                    if (!have[3 * m * v + at])
                        fail_msg("%s: send-grad before B", case_name(k, p, m, v));
                    dir = 1, boundary = mc - 1, peer = (mc - 1 + p) % p;
                    break;
                default: /* MS_PP_RECV_GRAD */
                    have[2 * m * v + at] = true;
                    dir = 1, boundary = mc, peer = (mc + 1) % p;
                    break;
            }
            if (boundary < 0 || boundary >= chunks - 1)
                fail_msg("%s stage %d: %s mb %d chunk %d past the end of the model",
                         case_name(k, p, m, v), s, ms_pp_op_name((ms_pp_op)a->op), a->mb, a->chunk);
            if (a->peer != peer)
                fail_msg("%s stage %d: %s mb %d peer %d, not %d", case_name(k, p, m, v), s,
                         ms_pp_op_name((ms_pp_op)a->op), a->mb, a->peer, peer);
            bool send = a->op == MS_PP_SEND_ACT || a->op == MS_PP_SEND_GRAD;
            (send ? sends : recvs)[(dir * chunks + boundary) * m + a->mb]++;
        }
        free(have);
    }
    /* every boundary of every micro-batch crossed once each way, a send for each receive */
    for (int dir = 0; dir < 2; dir++)
        for (int b = 0; b < chunks - 1; b++)
            for (int mb = 0; mb < m; mb++) {
                int i = (dir * chunks + b) * m + mb;
                if (sends[i] != 1 || recvs[i] != 1)
                    fail_msg("%s: %s across chunk %d|%d of mb %d: %d sends, %d receives",
                             case_name(k, p, m, v), dir ? "gradient" : "activation", b, b + 1, mb,
                             sends[i], recvs[i]);
            }
    free(sends);
    free(recvs);
}

static void transfers_pair_up(void **state) {
    (void)state;
    each_case(check_transfers);
}

/* --- the simulator ---------------------------------------------------------------------------- */

/* Unit times; no deadlock; data dependencies across stages hold on the timeline; the peak in
 * flight is the formula's. Under both transfer semantics; returns the timeline. */
static ms_pp_timeline simulate_checked(ms_schedule k, int p, int m, int v, const ms_pp_plan *pl,
                                       bool posted) {
    ms_pp_times t = {.f = 1, .b = 1, .w = 1, .posted = posted};
    ms_pp_timeline tl;
    ms_error err = {0};
    if (ms_pp_simulate(pl, &t, &tl, &err) != MS_OK)
        fail_msg("%s: %s", case_name(k, p, m, v), err.msg);
    const int chunks = p * v;
    double *fend = calloc((size_t)chunks * m, sizeof(double));
    double *bend = calloc((size_t)chunks * m, sizeof(double));
    for (int s = 0; s < p; s++)
        for (int i = 0; i < pl->n[s]; i++) {
            const ms_pp_action *a = &pl->act[s][i];
            int mc = a->chunk * p + s;
            if (a->op == MS_PP_FORWARD) fend[mc * m + a->mb] = tl.end[s][i];
            if (a->op == MS_PP_BACKWARD) bend[mc * m + a->mb] = tl.end[s][i];
        }
    for (int s = 0; s < p; s++)
        for (int i = 0; i < pl->n[s]; i++) {
            const ms_pp_action *a = &pl->act[s][i];
            int mc = a->chunk * p + s;
            double need = a->op == MS_PP_FORWARD && mc > 0             ? fend[(mc - 1) * m + a->mb]
                          : a->op == MS_PP_BACKWARD && mc < chunks - 1 ? bend[(mc + 1) * m + a->mb]
                          : a->op == MS_PP_BACKWARD                    ? fend[mc * m + a->mb]
                                                                       : 0;
            if (!ms_pp_is_comm(a->op) && tl.start[s][i] < need)
                fail_msg("%s stage %d (%s): %s mb %d chunk %d starts at %g, its input at %g",
                         case_name(k, p, m, v), s, posted ? "posted" : "rendezvous",
                         ms_pp_op_name((ms_pp_op)a->op), a->mb, a->chunk, tl.start[s][i], need);
        }
    for (int s = 0; s < p; s++)
        if (tl.stage[s].peak_inflight != ms_pp_inflight_bound(k, p, m, v, s))
            fail_msg("%s stage %d: peak in flight %d, bound %d", case_name(k, p, m, v), s,
                     tl.stage[s].peak_inflight, ms_pp_inflight_bound(k, p, m, v, s));
    free(fend);
    free(bend);
    return tl;
}

/* Both semantics, and posted transfers (the executor's) never start a compute later than
 * rendezvous ones: a receive waits for the same send, a send for nothing. */
static void check_simulation(ms_schedule k, int p, int m, int v, const ms_pp_plan *pl) {
    ms_pp_timeline rv = simulate_checked(k, p, m, v, pl, false);
    ms_pp_timeline po = simulate_checked(k, p, m, v, pl, true);
    for (int s = 0; s < p; s++)
        for (int i = 0; i < pl->n[s]; i++)
            if (!ms_pp_is_comm(pl->act[s][i].op) && po.start[s][i] > rv.start[s][i] + 1e-9)
                fail_msg("%s stage %d action %d: posted at %g, rendezvous at %g",
                         case_name(k, p, m, v), s, i, po.start[s][i], rv.start[s][i]);
    if (po.step > rv.step + 1e-9)
        fail_msg("%s: posted step %g, rendezvous %g", case_name(k, p, m, v), po.step, rv.step);
    ms_pp_timeline_free(&rv);
    ms_pp_timeline_free(&po);
}

static void simulates_without_deadlock(void **state) {
    (void)state;
    each_case(check_simulation);
}

static double simulated_bubble(const ms_pp_plan *pl, double f, double b, double w, bool posted) {
    ms_pp_times t = {.f = f, .b = b, .w = w, .posted = posted};
    ms_pp_timeline tl;
    ms_error err = {0};
    if (ms_pp_simulate(pl, &t, &tl, &err) != MS_OK) fail_msg("%s", err.msg);
    double bubble = tl.bubble;
    for (int s = 0; s < pl->p; s++) /* every stage does the same work */
        if (fabs(tl.stage[s].bubble - bubble) > 1e-12)
            fail_msg("stage %d: bubble %g, mean %g", s, tl.stage[s].bubble, bubble);
    ms_pp_timeline_free(&tl);
    return bubble;
}

/* The formulas hold under both transfer semantics. */
static void check_bubble(ms_schedule k, int p, int m, int v, const ms_pp_plan *pl) {
    for (int posted = 0; posted < 2; posted++) {
        const char *how = posted ? "posted" : "rendezvous";
        if (k == MS_SCHEDULE_ZB_H1) {
            double zb = simulated_bubble(pl, 1, 1, 1, posted);
            if (m < p) continue; /* the pipeline never fills: the formula does not apply */
            ms_pp_plan ref;      /* 1F1B doing the same work: F 1, B (input and weight) 2 */
            assert_int_equal(ms_pp_plan_make(MS_SCHEDULE_1F1B, p, m, 1, &ref, NULL), MS_OK);
            double one = simulated_bubble(&ref, 1, 1, 1, posted);
            ms_pp_plan_free(&ref);
            double want = (double)(p - 1) / (3 * m + p - 1);
            if (fabs(zb - want) > 1e-12 || (p > 1 && !(zb < one)))
                fail_msg("%s (%s): bubble %.6f, formula %.6f, 1f1b %.6f", case_name(k, p, m, v),
                         how, zb, want, one);
            continue;
        }
        double want = (double)(p - 1) / (v * m + p - 1); /* v = 1: 1f1b and gpipe */
        const double ratios[][3] = {{1, 1, 0}, {1, 2, 0}, {1, 1, 1}, {2, 1, 0}};
        for (size_t r = 0; r < sizeof ratios / sizeof *ratios; r++) {
            double got = simulated_bubble(pl, ratios[r][0], ratios[r][1], ratios[r][2], posted);
            if (fabs(got - want) > 1e-12)
                fail_msg("%s (%s), f %g b %g w %g: bubble %.6f, formula %.6f",
                         case_name(k, p, m, v), how, ratios[r][0], ratios[r][1], ratios[r][2], got,
                         want);
        }
    }
}

static void bubbles_match_formulas(void **state) {
    (void)state;
    each_case(check_bubble);
}

static void inflight_bounds(void **state) {
    (void)state;
    const int one[] = {4, 3, 2, 1};
    for (int s = 0; s < 4; s++) {
        assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_1F1B, 4, 8, 1, s), one[s]);
        assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_1F1B, 4, 2, 1, s), s < 2 ? 2 : one[s]);
        assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_GPIPE, 4, 8, 1, s), 8);
        assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_ZB_H1, 4, 8, 1, s), 4);
        assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_ZB_H1, 4, 3, 1, s), 3);
        /* 2(p-s-1) + (v-1)p warm-up chunk forwards, then one more */
        assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_INTERLEAVED, 4, 8, 2, s),
                         2 * (3 - s) + 4 + 1);
    }
    /* m = p: stage 0's warm-up is every unit */
    assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_INTERLEAVED, 4, 4, 2, 0), 8);
    assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_INTERLEAVED, 4, 6, 2, 0), 0);
    assert_int_equal(ms_pp_inflight_bound(MS_SCHEDULE_1F1B, 4, 8, 1, 4), 0);
}

/* --- independent references --------------------------------------------------------------------
 */

#define A(o, m_, p_)                                                                               \
    { .op = MS_PP_##o, .chunk = 0, .mb = (m_), .peer = (p_) }

static void expect_list(ms_schedule k, int p, int m, int stage, const ms_pp_action *want,
                        int n_want) {
    ms_pp_action *got;
    int n;
    ms_error err = {0};
    assert_int_equal(ms_pp_schedule(k, p, m, 1, stage, &got, &n, &err), MS_OK);
    int same = n == n_want;
    for (int i = 0; same && i < n; i++)
        same = got[i].op == want[i].op && got[i].chunk == want[i].chunk &&
               got[i].mb == want[i].mb && got[i].peer == want[i].peer;
    if (!same) {
        for (int i = 0; i < n; i++)
            printf("  %s mb %d peer %d\n", ms_pp_op_name((ms_pp_op)got[i].op), got[i].mb,
                   got[i].peer);
        fail_msg("%s p%d m%d stage %d: %d actions, not the %d written down", ms_schedule_name(k), p,
                 m, stage, n, n_want);
    }
    free(got);
}

static void hand_written_lists(void **state) {
    (void)state;
    /* 1F1B, 2 stages, 3 micro-batches. Stage 0: one warm-up forward, then
     * send_forward_recv_backward after each F, the last backwards alone. */
    const ms_pp_action s0[] = {A(FORWARD, 0, -1),  A(SEND_ACT, 0, 1),  A(FORWARD, 1, -1),
                               A(SEND_ACT, 1, 1),  A(RECV_GRAD, 0, 1), A(BACKWARD, 0, -1),
                               A(FORWARD, 2, -1),  A(SEND_ACT, 2, 1),  A(RECV_GRAD, 1, 1),
                               A(BACKWARD, 1, -1), A(RECV_GRAD, 2, 1), A(BACKWARD, 2, -1)};
    /* stage 1 computes the loss: no warm-up, send_backward_recv_forward after each B */
    const ms_pp_action s1[] = {A(RECV_ACT, 0, 0),  A(FORWARD, 0, -1),  A(BACKWARD, 0, -1),
                               A(SEND_GRAD, 0, 0), A(RECV_ACT, 1, 0),  A(FORWARD, 1, -1),
                               A(BACKWARD, 1, -1), A(SEND_GRAD, 1, 0), A(RECV_ACT, 2, 0),
                               A(FORWARD, 2, -1),  A(BACKWARD, 2, -1), A(SEND_GRAD, 2, 0)};
    expect_list(MS_SCHEDULE_1F1B, 2, 3, 0, s0, 12);
    expect_list(MS_SCHEDULE_1F1B, 2, 3, 1, s1, 12);
    /* GPipe, 2 stages, 2 micro-batches */
    const ms_pp_action g0[] = {A(FORWARD, 0, -1),  A(SEND_ACT, 0, 1),  A(FORWARD, 1, -1),
                               A(SEND_ACT, 1, 1),  A(RECV_GRAD, 0, 1), A(BACKWARD, 0, -1),
                               A(RECV_GRAD, 1, 1), A(BACKWARD, 1, -1)};
    const ms_pp_action g1[] = {A(RECV_ACT, 0, 0),  A(FORWARD, 0, -1),  A(RECV_ACT, 1, 0),
                               A(FORWARD, 1, -1),  A(BACKWARD, 0, -1), A(SEND_GRAD, 0, 0),
                               A(BACKWARD, 1, -1), A(SEND_GRAD, 1, 0)};
    expect_list(MS_SCHEDULE_GPIPE, 2, 2, 0, g0, 8);
    expect_list(MS_SCHEDULE_GPIPE, 2, 2, 1, g1, 8);
    /* one stage: computes only */
    const ms_pp_action z[] = {A(FORWARD, 0, -1), A(BACKWARD, 0, -1), A(WEIGHT, 0, -1)};
    expect_list(MS_SCHEDULE_ZB_H1, 1, 1, 0, z, 3);
}

static void refusals_name_the_fix(void **state) {
    (void)state;
    static const struct {
        ms_schedule k;
        int p, m, v;
        const char *want;
    } bad[] = {
        {MS_SCHEDULE_INTERLEAVED, 4, 6, 2,
         "the interleaved schedule needs the micro-batches (6) to be a multiple of pp 4; use 4 "
         "or 8 micro-batches"},
        {MS_SCHEDULE_INTERLEAVED, 4, 2, 2, "use 4 micro-batches"},
        {MS_SCHEDULE_INTERLEAVED, 4, 8, 1, "takes 2 or more virtual stages"},
        {MS_SCHEDULE_INTERLEAVED, 1, 8, 2, "use it with pp 2 or more"},
        {MS_SCHEDULE_1F1B, 4, 8, 2, "use 1 virtual stage, or the interleaved schedule"},
        {MS_SCHEDULE_ZB_H1, 0, 8, 1, "pp 0"},
        {MS_SCHEDULE_GPIPE, 2, 0, 1, "0 micro-batches"},
        {MS_SCHEDULE_COUNT, 2, 2, 1, "unknown pipeline schedule"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ms_error err = {0};
        assert_int_equal(ms_pp_schedule_check(bad[i].k, bad[i].p, bad[i].m, bad[i].v, &err),
                         MS_ERR_INVALID);
        printf("refused: %s\n", err.msg);
        if (!strstr(err.msg, bad[i].want)) fail_msg("wanted '%s' in: %s", bad[i].want, err.msg);
    }
    ms_pp_action *a;
    int n;
    ms_error err = {0};
    assert_int_equal(ms_pp_schedule(MS_SCHEDULE_1F1B, 2, 2, 1, 2, &a, &n, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "stage 2 of a 2-stage pipeline"));
}

/* Stage 0 waits for the gradient before it sends the activation the gradient comes from. */
static void deadlock_is_named(void **state) {
    (void)state;
    ms_pp_action s0[] = {A(RECV_GRAD, 0, 1), A(FORWARD, 0, -1), A(SEND_ACT, 0, 1),
                         A(BACKWARD, 0, -1)};
    ms_pp_action s1[] = {A(RECV_ACT, 0, 0), A(FORWARD, 0, -1), A(BACKWARD, 0, -1),
                         A(SEND_GRAD, 0, 0)};
    ms_pp_action *acts[] = {s0, s1};
    int n[] = {4, 4};
    ms_pp_plan pl = {.kind = MS_SCHEDULE_1F1B, .p = 2, .m = 1, .v = 1, .act = acts, .n = n};
    ms_pp_times t = {.f = 1, .b = 1};
    ms_pp_timeline tl;
    ms_error err = {0};
    assert_int_equal(ms_pp_simulate(&pl, &t, &tl, &err), MS_ERR_INVALID);
    printf("%s\n", err.msg);
    assert_string_equal(err.msg, "deadlock: stage 0 waits in [recv-grad mb 0 chunk 0 from stage "
                                 "1]; stage 1 waits in [recv-act mb 0 chunk 0 from stage 0]");
    /* posted, the same lists run: a receive waits only for its send, which comes */
    t.posted = true;
    assert_int_equal(ms_pp_simulate(&pl, &t, &tl, &err), MS_OK);
    assert_true(tl.step == 4); /* s0 F, s1 F and B, s0 B */
    ms_pp_timeline_free(&tl);
    /* but no semantics runs a backward before the forward that feeds its gradient */
    s0[1] = (ms_pp_action)A(BACKWARD, 0, -1), s0[3] = (ms_pp_action)A(FORWARD, 0, -1);
    assert_int_equal(ms_pp_simulate(&pl, &t, &tl, &err), MS_ERR_INVALID);
    printf("%s\n", err.msg);
    assert_string_equal(err.msg, "deadlock: stage 0 waits for B mb 0 chunk 0's input; stage 1 "
                                 "waits for F mb 0 chunk 0's input");
    t.posted = false;
    /* a send nobody receives */
    s1[0] = (ms_pp_action)A(FORWARD, 0, -1);
    s1[1] = (ms_pp_action)A(BACKWARD, 0, -1);
    n[1] = 2;
    s0[0] = (ms_pp_action)A(FORWARD, 0, -1);
    s0[1] = (ms_pp_action)A(SEND_ACT, 0, 1);
    s0[2] = (ms_pp_action)A(BACKWARD, 0, -1);
    n[0] = 3;
    assert_int_equal(ms_pp_simulate(&pl, &t, &tl, &err), MS_ERR_INVALID);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "send-act mb 0 chunk 0 to stage 1 has no matching receive"));
    /* durations must make sense */
    t.b = NAN;
    assert_int_equal(ms_pp_simulate(&pl, &t, &tl, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "finite"));
}

/* --- the planner's question --------------------------------------------------------------------
 */

/* Past 3p micro-batches the bubble comes from 2p and 3p; it must equal the full run's. */
static void bubble_fraction_extrapolates(void **state) {
    (void)state;
    static const struct {
        ms_schedule k;
        int v;
        double f, b, w;
    } c[] = {
        {MS_SCHEDULE_1F1B, 1, 1, 2, 0},        {MS_SCHEDULE_GPIPE, 1, 1, 1.5, 0.5},
        {MS_SCHEDULE_INTERLEAVED, 2, 1, 2, 0}, {MS_SCHEDULE_INTERLEAVED, 3, 2, 1, 1},
        {MS_SCHEDULE_ZB_H1, 1, 1, 1, 1},       {MS_SCHEDULE_ZB_H1, 1, 1, 1.2, 0.9},
        {MS_SCHEDULE_ZB_H1, 1, 1, 1, 1.3},
    };
    const int p[] = {2, 3, 8}, m[] = {13, 24, 37, 2056};
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) {
                if (ms_pp_schedule_check(c[i].k, p[a], m[b], c[i].v, NULL) != MS_OK) continue;
                double quick;
                ms_error err = {0};
                assert_int_equal(ms_pp_bubble_fraction(c[i].k, p[a], m[b], c[i].v, c[i].f, c[i].b,
                                                       c[i].w, &quick, &err),
                                 MS_OK);
                ms_pp_plan pl;
                assert_int_equal(ms_pp_plan_make(c[i].k, p[a], m[b], c[i].v, &pl, &err), MS_OK);
                double full =
                    simulated_bubble(&pl, c[i].f / c[i].v, c[i].b / c[i].v, c[i].w / c[i].v, true);
                ms_pp_plan_free(&pl);
                if (m[b] == 2056)
                    printf("%-11s p%d v%d f %g b %g w %g: bubble %.6f, extrapolated %.6f\n",
                           ms_schedule_name(c[i].k), p[a], c[i].v, c[i].f, c[i].b, c[i].w, full,
                           quick);
                if (fabs(quick - full) > 1e-9)
                    fail_msg("%s p%d m%d v%d: %.9f, extrapolated %.9f", ms_schedule_name(c[i].k),
                             p[a], m[b], c[i].v, full, quick);
            }
    double b = -1;
    ms_error err = {0};
    assert_int_equal(ms_pp_bubble_fraction(MS_SCHEDULE_1F1B, 1, 8, 1, 1, 2, 0, &b, &err), MS_OK);
    assert_true(b == 0);
    assert_int_equal(ms_pp_bubble_fraction(MS_SCHEDULE_1F1B, 4, 8, 1, 0, 0, 0, &b, &err),
                     MS_ERR_INVALID);
    assert_int_equal(ms_pp_bubble_fraction(MS_SCHEDULE_INTERLEAVED, 4, 6, 2, 1, 2, 0, &b, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "use 4 or 8"));
}

/* --- the diagram -------------------------------------------------------------------------------
 */

static char *printed(ms_schedule k, int p, int m, int v, ms_status *st, ms_error *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    *st = ms_pp_schedule_print(f, k, p, m, v, err);
    fclose(f);
    return text;
}

static void diagram(void **state) {
    (void)state;
    ms_status st;
    ms_error err = {0};
    char *t = printed(MS_SCHEDULE_1F1B, 2, 2, 1, &st, &err);
    assert_int_equal(st, MS_OK);
    printf("%s", t);
    /* F one cell, B (input and weight gradients) two; stage 0 waits for the first gradient */
    assert_non_null(strstr(t, "\nstage 0  F0 F1 .  .  B0 B0 .  B1 B1\n"));
    assert_non_null(strstr(t, "\nstage 1  .  F0 B0 B0 F1 B1 B1 .  .\n"));
    assert_non_null(strstr(t, "stage 0: bubble 33.3% (3 of 9 idle), peak in flight 2 (bound 2)"));
    assert_non_null(strstr(t, "stage 1: bubble 33.3% (3 of 9 idle), peak in flight 1 (bound 1)"));
    assert_non_null(strstr(t, "formula (p-1)/(m+p-1) = 1/3 = 33.3%"));
    free(t);
    t = printed(MS_SCHEDULE_INTERLEAVED, 2, 2, 2, &st, &err);
    assert_int_equal(st, MS_OK);
    printf("%s", t);
    assert_non_null(strstr(t, "\nstage 0  F0a F1a F0b F1b"));
    free(t);
    /* the largest readable case wraps within 100 columns, with every stage in every part */
    const ms_schedule kinds[] = {MS_SCHEDULE_1F1B, MS_SCHEDULE_ZB_H1, MS_SCHEDULE_INTERLEAVED};
    for (int i = 0; i < 3; i++) {
        t = printed(kinds[i], 8, 16, kinds[i] == MS_SCHEDULE_INTERLEAVED ? 2 : 1, &st, &err);
        assert_int_equal(st, MS_OK);
        int parts = 0, rows = 0;
        for (char *line = t, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
            if (nl - line > 100)
                fail_msg("a line of %d columns: %.*s", (int)(nl - line), (int)(nl - line), line);
            parts += !strncmp(line, "time ", 5);
            rows += !strncmp(line, "stage ", 6);
        }
        assert_true(parts >= 2 && rows == 8 * parts);
        free(t);
    }
    /* refused: the error, nothing printed */
    t = printed(MS_SCHEDULE_INTERLEAVED, 4, 6, 2, &st, &err);
    assert_int_equal(st, MS_ERR_INVALID);
    assert_string_equal(t, "");
    free(t);
}

/* --- layer balancing ------------------------------------------------------------------------ */

static double costliest(const ms_pp_costs *c, int chunks, const int *counts) {
    double worst = 0;
    for (int k = 0; k < chunks; k++) {
        double x = counts[k] * c->layer + (k == 0 ? c->first : 0) + (k == chunks - 1 ? c->last : 0);
        worst = fmax(worst, x);
    }
    return worst;
}

/* The least costliest chunk over every split, by enumerating them (compositions of L into K). */
static double brute_force(int L, int K, const ms_pp_costs *c, int *counts, int k, int left) {
    if (k == K - 1) {
        counts[k] = left;
        return costliest(c, K, counts);
    }
    double best = INFINITY;
    for (int x = 1; x <= left - (K - k - 1); x++) {
        counts[k] = x;
        best = fmin(best, brute_force(L, K, c, counts, k + 1, left - x));
    }
    return best;
}

static void balances_layers_by_cost(void **state) {
    (void)state;
    /* Every split of up to 9 layers into up to 5 chunks, heads from none to five layers' worth
     * and an embedding of half a layer: the split is never worse than the best one by more
     * than the 2% that keeps an even split, and counts add up with a layer per chunk. */
    for (double head = 0; head <= 5; head += 0.75)
        for (int L = 1; L <= 9; L++)
            for (int K = 1; K <= L && K <= 5; K++) {
                ms_pp_costs c = {.layer = 1, .first = 0.5, .last = head};
                int got[9], tmp[9], sum = 0;
                ms_pp_balance_layers(L, K, &c, got);
                for (int k = 0; k < K; k++) {
                    assert_true(got[k] >= 1);
                    sum += got[k];
                }
                assert_int_equal(sum, L);
                double best = brute_force(L, K, &c, tmp, 0, L);
                if (costliest(&c, K, got) > best / 0.98 + 1e-9)
                    fail_msg("L %d, K %d, head %.2f: costliest chunk %.2f, best split %.2f", L, K,
                             head, costliest(&c, K, got), best);
            }
    /* GPT-2 small (12 layers, vocabulary 50257): the head costs about 4.5 layers, so pp 4
     * gives the last stage fewer layers; a model with a small vocabulary keeps 3 each. */
    ms_model_config gpt2 = {.model_type = MS_MODEL_GPT2,
                            .n_layer = 12,
                            .n_embd = 768,
                            .n_head = 12,
                            .vocab_size = 50257,
                            .n_positions = 1024};
    ms_pp_costs c = ms_pp_model_costs(&gpt2, 1024);
    assert_true(c.last > 4 * c.layer && c.last < 5 * c.layer);
    int counts[4];
    ms_pp_balance_layers(12, 4, &c, counts);
    assert_true(counts[3] < 3 && counts[0] >= 3);
    gpt2.vocab_size = 256;
    c = ms_pp_model_costs(&gpt2, 1024);
    ms_pp_balance_layers(12, 4, &c, counts);
    for (int k = 0; k < 4; k++) assert_int_equal(counts[k], 3);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(computes_once_in_order),
    cmocka_unit_test(transfers_pair_up),
    cmocka_unit_test(simulates_without_deadlock),
    cmocka_unit_test(bubbles_match_formulas),
    cmocka_unit_test(inflight_bounds),
    cmocka_unit_test(hand_written_lists),
    cmocka_unit_test(refusals_name_the_fix),
    cmocka_unit_test(deadlock_is_named),
    cmocka_unit_test(bubble_fraction_extrapolates),
    cmocka_unit_test(diagram),
    cmocka_unit_test(balances_layers_by_cost),
};

MT_MAIN("pp_schedule", tests)

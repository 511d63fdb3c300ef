/* schedule.c - the pipeline schedules' action lists (schedule.h). */
#include "engine/pipeline/schedule.h"

#include <stdlib.h>

#include "engine/core/xalloc.h"

const char *ms_pp_op_name(ms_pp_op op) {
    static const char *const n[] = {"F",        "B",         "W",        "send-act",
                                    "recv-act", "send-grad", "recv-grad"};
    return op < MS_PP_OP_COUNT ? n[op] : "?";
}

ms_status ms_pp_schedule_check(ms_schedule kind, int p, int m, int v, ms_error *err) {
    if ((unsigned)kind >= MS_SCHEDULE_COUNT)
        return ms_fail(err, MS_ERR_INVALID,
                       "unknown pipeline schedule %d; use 1f1b, gpipe, interleaved or zb-h1",
                       (int)kind);
    const char *name = ms_schedule_name(kind);
    if (p < 1 || p > MS_STRATEGY_MAX_DEGREE)
        return ms_fail(err, MS_ERR_INVALID, "pp %d: a pipeline has 1 to %d stages", p,
                       MS_STRATEGY_MAX_DEGREE);
    if (m < 1) return ms_fail(err, MS_ERR_INVALID, "%d micro-batches: a step runs 1 or more", m);
    if (v < 1 || v > MS_PP_MAX_VIRTUAL)
        return ms_fail(err, MS_ERR_INVALID, "%d virtual stages: use 1 to %d", v, MS_PP_MAX_VIRTUAL);
    if ((int64_t)m * v > (1 << 30))
        return ms_fail(err, MS_ERR_INVALID,
                       "%d micro-batches x %d virtual stages is past 2^30 units; use fewer", m, v);
    if (kind != MS_SCHEDULE_INTERLEAVED) {
        if (v != 1)
            return ms_fail(err, MS_ERR_INVALID,
                           "the %s schedule runs one model chunk per rank, not %d virtual "
                           "stages; use 1 virtual stage, or the interleaved schedule",
                           name, v);
        return MS_OK;
    }
    /* v = 1 would be a 1F1B with twice its warm-up (Megatron-LM's count): refused, so one
     * name means one schedule. */
    if (v < 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "the interleaved schedule takes 2 or more virtual stages (with 1 it is "
                       "the 1f1b schedule); use 2 or more, or the 1f1b schedule");
    if (p < 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "the interleaved schedule passes chunks between ranks; use it with pp 2 "
                       "or more");
    if (m % p) {
        int lo = m / p * p, hi = lo + p;
        if (lo)
            return ms_fail(err, MS_ERR_INVALID,
                           "the interleaved schedule needs the micro-batches (%d) to be a "
                           "multiple of pp %d; use %d or %d micro-batches",
                           m, p, lo, hi);
        return ms_fail(err, MS_ERR_INVALID,
                       "the interleaved schedule needs the micro-batches (%d) to be a multiple "
                       "of pp %d; use %d micro-batches",
                       m, p, hi);
    }
    return MS_OK;
}

/* Warm-up forwards of the interleaved schedule on stage s, in chunk units. */
static int64_t interleaved_warmup(int p, int m, int v, int s) {
    int64_t w = 2 * (int64_t)(p - s - 1) + (int64_t)(v - 1) * p, total = (int64_t)m * v;
    return w < total ? w : total;
}

int ms_pp_inflight_bound(ms_schedule kind, int p, int m, int v, int stage) {
    if (ms_pp_schedule_check(kind, p, m, v, NULL) != MS_OK || stage < 0 || stage >= p) return 0;
    switch (kind) {
        case MS_SCHEDULE_1F1B:
            return m < p - stage ? m : p - stage;
        case MS_SCHEDULE_GPIPE:
            return m;
        case MS_SCHEDULE_ZB_H1:
            return m < p ? m : p;
        case MS_SCHEDULE_INTERLEAVED: {
            int64_t w = interleaved_warmup(p, m, v, stage), total = (int64_t)m * v;
            return (int)(w == total ? total : w + 1);
        }
        default:
            return 0;
    }
}

/* --- building one stage's list ------------------------------------------------------------- */

typedef struct builder {
    int p, v, s;
    bool comm; /* false: compute actions only (zb-h1's first pass) */
    ms_pp_action *a;
    int n;
} builder;

static void put(builder *b, int op, int chunk, int mb, int peer) {
    b->a[b->n++] =
        (ms_pp_action){.op = (uint8_t)op, .chunk = (uint8_t)chunk, .mb = mb, .peer = peer};
}

/* The receive a compute action of local chunk `chunk` needs, and the send of what it made. */
static void recv_for(builder *b, int op, int chunk, int mb) {
    int k = chunk * b->p + b->s, last = b->p * b->v - 1; /* model chunk */
    if (!b->comm) return;
    if (op == MS_PP_FORWARD && k > 0) put(b, MS_PP_RECV_ACT, chunk, mb, (k + b->p - 1) % b->p);
    if (op == MS_PP_BACKWARD && k < last) put(b, MS_PP_RECV_GRAD, chunk, mb, (k + 1) % b->p);
}

static void send_for(builder *b, int op, int chunk, int mb) {
    int k = chunk * b->p + b->s, last = b->p * b->v - 1;
    if (!b->comm) return;
    if (op == MS_PP_FORWARD && k < last) put(b, MS_PP_SEND_ACT, chunk, mb, (k + 1) % b->p);
    if (op == MS_PP_BACKWARD && k > 0) put(b, MS_PP_SEND_GRAD, chunk, mb, (k + b->p - 1) % b->p);
}

/* A compute action with its receive right before it and its send right after, so that a
 * send merges with the next receive: in 1F1B, send_forward_recv_backward after F and
 * send_backward_recv_forward after B, which pair up with the neighbour's opposite batch. */
static void compute(builder *b, int op, int chunk, int mb) {
    recv_for(b, op, chunk, mb);
    put(b, op, chunk, mb, -1);
    send_for(b, op, chunk, mb);
}

/* 1F1B's order of F and B; with zb, stage s runs W(j) after B(j+s), then one deferred W
 * after each cool-down B and the rest at the end. */
static void build_1f1b(builder *b, int m, bool zb) {
    int p = b->p, s = b->s;
    int nw = p - s - 1 < m ? p - s - 1 : m, w = 0;
    for (int i = 0; i < nw; i++) compute(b, MS_PP_FORWARD, 0, i);
    for (int j = 0; j < m - nw; j++) {
        compute(b, MS_PP_FORWARD, 0, nw + j);
        compute(b, MS_PP_BACKWARD, 0, j);
        if (zb && j >= s) compute(b, MS_PP_WEIGHT, 0, w++);
    }
    for (int j = m - nw; j < m; j++) {
        compute(b, MS_PP_BACKWARD, 0, j);
        if (zb) compute(b, MS_PP_WEIGHT, 0, w++);
    }
    while (zb && w < m) compute(b, MS_PP_WEIGHT, 0, w++);
}

static void build_gpipe(builder *b, int m) {
    for (int i = 0; i < m; i++) compute(b, MS_PP_FORWARD, 0, i);
    for (int i = 0; i < m; i++) compute(b, MS_PP_BACKWARD, 0, i);
}

/* Virtual micro-batch K: groups of p micro-batches run through every chunk in turn, forwards
 * in chunk order, backwards in reverse chunk order. */
static void virtual_unit(int p, int v, int64_t K, bool backward, int *chunk, int *mb) {
    int c = (int)((K / p) % v);
    *chunk = backward ? v - 1 - c : c;
    *mb = (int)(K / ((int64_t)p * v) * p + K % p);
}

/* One step of the interleaved schedule, a forward and a backward (mb -1: none): both
 * receives before it and both sends after it, Megatron-LM's
 * send_forward_backward_recv_forward_backward. Stage s+1 runs two fewer warm-up steps than
 * stage s, and these whole-step batches are what keeps the two in step; a receive right
 * before each compute deadlocks under rendezvous. */
static void step(builder *b, int fc, int fmb, int bc, int bmb) {
    if (fmb >= 0) recv_for(b, MS_PP_FORWARD, fc, fmb);
    if (bmb >= 0) recv_for(b, MS_PP_BACKWARD, bc, bmb);
    if (fmb >= 0) put(b, MS_PP_FORWARD, fc, fmb, -1);
    if (bmb >= 0) put(b, MS_PP_BACKWARD, bc, bmb, -1);
    if (fmb >= 0) send_for(b, MS_PP_FORWARD, fc, fmb);
    if (bmb >= 0) send_for(b, MS_PP_BACKWARD, bc, bmb);
}

static void build_interleaved(builder *b, int m) {
    int p = b->p, v = b->v, c, mb, bc, bmb;
    int64_t total = (int64_t)m * v, w = interleaved_warmup(p, m, v, b->s);
    for (int64_t k = 0; k < w; k++) {
        virtual_unit(p, v, k, false, &c, &mb);
        step(b, c, mb, 0, -1);
    }
    for (int64_t k = 0; k < total - w; k++) {
        virtual_unit(p, v, w + k, false, &c, &mb);
        virtual_unit(p, v, k, true, &bc, &bmb);
        step(b, c, mb, bc, bmb);
    }
    for (int64_t k = total - w; k < total; k++) {
        virtual_unit(p, v, k, true, &c, &mb);
        step(b, 0, -1, c, mb);
    }
}

/* --- zb-h1: receives where the sender sends ------------------------------------------------ */

/* Under ZB-H1 B alone is short, so an output gradient often arrives while the stage runs the F
 * or the W before the B that needs it; a receive right before that B would hold the sender in
 * its rendezvous meanwhile. So the lists are built in two passes: every stage's computes, then
 * their timeline with F = B = W = 1 and transfers that never wait (the paper's setting), and
 * each receive goes to the last gap of the receiver at or before the time the sender sends.
 * With those durations both sides then post their batches at the same time, and the lists
 * run exactly that timeline; with others they still run (no deadlock: that depends on the
 * order only) with some waiting. */

typedef struct zb_timeline {
    int p, m;
    ms_pp_action **a; /* per stage: computes only */
    int *n;
    double **end;  /* per stage: each compute's end */
    double *f, *b; /* [stage * m + mb]: end of F and of B; -1 until known */
} zb_timeline;

static void zb_free(zb_timeline *z) {
    for (int s = 0; s < z->p; s++) free(z->a[s]), free(z->end[s]);
    free(z->a), free(z->n), free(z->end), free(z->f), free(z->b);
}

/* When the input of compute a on stage s is sent: 0 when it needs nothing from another stage,
 * -1 while unknown. */
static double zb_ready(const zb_timeline *z, int s, const ms_pp_action *a) {
    if (a->op == MS_PP_FORWARD && s > 0) return z->f[(size_t)(s - 1) * z->m + a->mb];
    if (a->op == MS_PP_BACKWARD && s < z->p - 1) return z->b[(size_t)(s + 1) * z->m + a->mb];
    return 0;
}

static void zb_times(zb_timeline *z, int p, int m) {
    *z = (zb_timeline){.p = p,
                       .m = m,
                       .a = xcalloc((size_t)p, sizeof(ms_pp_action *)),
                       .n = xcalloc((size_t)p, sizeof(int)),
                       .end = xcalloc((size_t)p, sizeof(double *)),
                       .f = xmalloc((size_t)p * m * sizeof(double)),
                       .b = xmalloc((size_t)p * m * sizeof(double))};
    for (size_t i = 0; i < (size_t)p * m; i++) z->f[i] = z->b[i] = -1;
    for (int s = 0; s < p; s++) {
        builder b = {.p = p, .v = 1, .s = s, .a = xmalloc((size_t)m * 3 * sizeof(ms_pp_action))};
        build_1f1b(&b, m, true);
        z->a[s] = b.a;
        z->n[s] = b.n;
        z->end[s] = xmalloc((size_t)b.n * sizeof(double));
    }
    /* every stage runs until its next compute's input is not sent yet; 1F1B's order always
     * lets some stage go on */
    int *at = xcalloc((size_t)p, sizeof(int));
    double *clock = xcalloc((size_t)p, sizeof(double));
    for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < p; s++)
            for (; at[s] < z->n[s]; at[s]++) {
                const ms_pp_action *a = &z->a[s][at[s]];
                double ready = zb_ready(z, s, a);
                if (ready < 0) break;
                double t = (ready > clock[s] ? ready : clock[s]) + 1;
                z->end[s][at[s]] = clock[s] = t;
                if (a->op == MS_PP_FORWARD) z->f[(size_t)s * m + a->mb] = t;
                if (a->op == MS_PP_BACKWARD) z->b[(size_t)s * m + a->mb] = t;
                moved = true;
            }
    }
    free(at);
    free(clock);
}

static void build_zb(builder *b, const zb_timeline *z) {
    const int s = b->s, n = z->n[s];
    const ms_pp_action *a = z->a[s];
    /* gap g is before compute g and opens when compute g-1 ends; each compute's receive goes
     * to the last gap at or before it that opens by the time the input is sent */
    int *gap = xmalloc((size_t)n * sizeof(int)), *first = xcalloc((size_t)n + 1, sizeof(int));
    int *order = xmalloc((size_t)n * sizeof(int)), *fill = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        double sent = zb_ready(z, s, &a[i]);
        int lo = 0, hi = i;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (z->end[s][mid - 1] <= sent)
                lo = mid;
            else
                hi = mid - 1;
        }
        gap[i] = lo;
        first[lo + 1]++;
    }
    for (int g = 0; g < n; g++) first[g + 1] += first[g], fill[g] = first[g];
    for (int i = 0; i < n; i++) order[fill[gap[i]]++] = i; /* receives by gap, in list order */
    for (int i = 0; i < n; i++) {
        for (int k = first[i]; k < first[i + 1]; k++)
            recv_for(b, a[order[k]].op, 0, a[order[k]].mb);
        put(b, a[i].op, 0, a[i].mb, -1);
        send_for(b, a[i].op, 0, a[i].mb);
    }
    free(gap), free(first), free(order), free(fill);
}

/* Stage b->s's list into b; z: zb-h1's timeline (unused by the others). */
static void build(builder *b, ms_schedule kind, int m, const zb_timeline *z) {
    switch (kind) {
        case MS_SCHEDULE_1F1B:
            build_1f1b(b, m, false);
            break;
        case MS_SCHEDULE_ZB_H1:
            build_zb(b, z);
            break;
        case MS_SCHEDULE_GPIPE:
            build_gpipe(b, m);
            break;
        default:
            build_interleaved(b, m);
            break;
    }
}

static ms_status check_size(ms_schedule kind, int p, int m, int v, ms_error *err) {
    MS_CHECK(ms_pp_schedule_check(kind, p, m, v, err));
    if ((int64_t)m * v > MS_PP_MAX_UNITS)
        return ms_fail(err, MS_ERR_INVALID,
                       "%d micro-batches x %d virtual stages is more than the %d units a list "
                       "holds; use fewer micro-batches",
                       m, v, MS_PP_MAX_UNITS);
    return MS_OK;
}

/* room for a stage's list: per unit F, B and W, and at most four transfers */
static builder builder_for(int p, int m, int v, int s) {
    return (builder){.p = p,
                     .v = v,
                     .s = s,
                     .comm = true,
                     .a = xmalloc((size_t)m * v * 7 * sizeof(ms_pp_action))};
}

ms_status ms_pp_schedule(ms_schedule kind, int p, int m, int v, int stage, ms_pp_action **out,
                         int *n, ms_error *err) {
    *out = NULL;
    *n = 0;
    MS_CHECK(check_size(kind, p, m, v, err));
    if (stage < 0 || stage >= p)
        return ms_fail(err, MS_ERR_INVALID, "stage %d of a %d-stage pipeline: use 0..%d", stage, p,
                       p - 1);
    zb_timeline z = {0};
    if (kind == MS_SCHEDULE_ZB_H1) zb_times(&z, p, m);
    builder b = builder_for(p, m, v, stage);
    build(&b, kind, m, &z);
    if (kind == MS_SCHEDULE_ZB_H1) zb_free(&z);
    *out = b.a;
    *n = b.n;
    return MS_OK;
}

ms_status ms_pp_plan_make(ms_schedule kind, int p, int m, int v, ms_pp_plan *out, ms_error *err) {
    *out = (ms_pp_plan){.kind = kind, .p = p, .m = m, .v = v};
    MS_CHECK(check_size(kind, p, m, v, err));
    zb_timeline z = {0};
    if (kind == MS_SCHEDULE_ZB_H1) zb_times(&z, p, m); /* once for every stage */
    out->act = xcalloc((size_t)p, sizeof *out->act);
    out->n = xcalloc((size_t)p, sizeof *out->n);
    for (int s = 0; s < p; s++) {
        builder b = builder_for(p, m, v, s);
        build(&b, kind, m, &z);
        out->act[s] = b.a;
        out->n[s] = b.n;
    }
    if (kind == MS_SCHEDULE_ZB_H1) zb_free(&z);
    return MS_OK;
}

void ms_pp_plan_free(ms_pp_plan *plan) {
    if (!plan) return;
    for (int s = 0; plan->act && s < plan->p; s++) free(plan->act[s]);
    free(plan->act);
    free(plan->n);
    plan->act = NULL;
    plan->n = NULL;
}

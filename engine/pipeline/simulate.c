/* simulate.c - the simulator of pipeline schedules, rendezvous or posted (simulate.h). */
#include "engine/pipeline/simulate.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

/* An action of some stage: its stage and index. */
typedef struct where {
    int stage, at;
} where;

typedef struct sim {
    const ms_pp_plan *pl;
    int **first;     /* [s][i]: for a transfer, the first action of its batch; -1 for compute */
    where **partner; /* [s][i]: for a transfer, the matching op */
    double **posted; /* [s][i] at a batch's first action: when it was posted; -1: not yet */
} sim;

static bool is_send(int op) {
    return op == MS_PP_SEND_ACT || op == MS_PP_SEND_GRAD;
}

/* A message: the activation (k -> k+1) or the gradient (k+1 -> k) across the boundary after
 * model chunk k, of one micro-batch. -1 for an op that crosses no boundary. */
static int64_t msg_key(const ms_pp_plan *pl, int s, const ms_pp_action *a) {
    int k = a->chunk * pl->p + s, nb = pl->p * pl->v - 1;
    bool act = a->op == MS_PP_SEND_ACT || a->op == MS_PP_RECV_ACT;
    int boundary = a->op == MS_PP_SEND_ACT || a->op == MS_PP_RECV_GRAD ? k : k - 1;
    if (boundary < 0 || boundary >= nb) return -1;
    return ((int64_t)(act ? 0 : 1) * nb + boundary) * pl->m + a->mb;
}

static const char *describe(char *buf, size_t n, const ms_pp_action *a) {
    snprintf(buf, n, "%s mb %d chunk %d %s stage %d", ms_pp_op_name((ms_pp_op)a->op), a->mb,
             a->chunk, is_send(a->op) ? "to" : "from", a->peer);
    return buf;
}

/* Pairs every send with its receive; refuses strays, duplicates and wrong peers. */
static ms_status pair(sim *S, ms_error *err) {
    const ms_pp_plan *pl = S->pl;
    int64_t nkeys = 2 * ((int64_t)pl->p * pl->v - 1) * pl->m;
    size_t nk = (size_t)(nkeys > 0 ? nkeys : 1);
    where *snd = xmalloc(nk * sizeof *snd), *rcv = xmalloc(nk * sizeof *rcv);
    for (size_t i = 0; i < nk; i++) snd[i] = rcv[i] = (where){-1, -1};
    ms_status st = MS_OK;
    char d[96];
    for (int s = 0; s < pl->p && st == MS_OK; s++)
        for (int i = 0; i < pl->n[s] && st == MS_OK; i++) {
            const ms_pp_action *a = &pl->act[s][i];
            if (a->op >= MS_PP_OP_COUNT || a->chunk >= pl->v || a->mb < 0 || a->mb >= pl->m) {
                st = ms_fail(err, MS_ERR_INVALID,
                             "stage %d action %d: op %d, chunk %d, mb %d out of range", s, i, a->op,
                             a->chunk, a->mb);
                break;
            }
            if (!ms_pp_is_comm(a->op)) continue;
            int64_t key = msg_key(pl, s, a);
            where *slot = key < 0 ? NULL : is_send(a->op) ? &snd[key] : &rcv[key];
            if (!slot || slot->stage >= 0)
                st = ms_fail(err, MS_ERR_INVALID, "stage %d action %d: %s %s", s, i,
                             describe(d, sizeof d, a),
                             slot ? "appears twice" : "crosses no boundary of the model");
            else
                *slot = (where){s, i};
        }
    for (int64_t key = 0; key < nkeys && st == MS_OK; key++) {
        where x = snd[key], y = rcv[key];
        if (x.stage < 0 && y.stage < 0) continue;
        if (x.stage < 0 || y.stage < 0) {
            where has = x.stage >= 0 ? x : y;
            st = ms_fail(err, MS_ERR_INVALID, "stage %d action %d: %s has no matching %s",
                         has.stage, has.at, describe(d, sizeof d, &pl->act[has.stage][has.at]),
                         x.stage >= 0 ? "receive" : "send");
            break;
        }
        const ms_pp_action *a = &pl->act[x.stage][x.at], *b = &pl->act[y.stage][y.at];
        if (a->peer != y.stage || b->peer != x.stage) {
            st = ms_fail(err, MS_ERR_INVALID, "stage %d: %s, but its receive is on stage %d",
                         x.stage, describe(d, sizeof d, a), y.stage);
            break;
        }
        S->partner[x.stage][x.at] = y;
        S->partner[y.stage][y.at] = x;
    }
    free(snd);
    free(rcv);
    return st;
}

/* Why the stuck stages wait: each one's ops whose partner batch was never posted. */
static ms_status deadlock(const sim *S, const int *pos, ms_error *err) {
    const ms_pp_plan *pl = S->pl;
    char msg[MS_ERROR_MSG_MAX], d[96];
    size_t len = (size_t)snprintf(msg, sizeof msg, "deadlock:");
    const char *sep = " ";
    for (int s = 0; s < pl->p && len < sizeof msg; s++) {
        if (pos[s] >= pl->n[s]) continue;
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%sstage %d waits in [", sep, s);
        const char *comma = "";
        for (int i = pos[s]; i < pl->n[s] && ms_pp_is_comm(pl->act[s][i].op) && len < sizeof msg;
             i++) {
            where q = S->partner[s][i];
            if (S->posted[q.stage][S->first[q.stage][q.at]] >= 0) continue;
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s", comma,
                                    describe(d, sizeof d, &pl->act[s][i]));
            comma = ", ";
        }
        if (len < sizeof msg) len += (size_t)snprintf(msg + len, sizeof msg - len, "]");
        sep = "; ";
    }
    return ms_fail(err, MS_ERR_INVALID, "%s", msg);
}

static double duration(const ms_pp_plan *pl, const ms_pp_times *t, int op) {
    switch (op) {
        case MS_PP_FORWARD:
            return t->f;
        case MS_PP_BACKWARD:
            return pl->kind == MS_SCHEDULE_ZB_H1 ? t->b : t->b + t->w;
        case MS_PP_WEIGHT:
            return t->w;
        default:
            return 0;
    }
}

/* Runs compute action i of stage s from `at`: its span, the stage's busy time and clock, and
 * the units it holds (an F takes one; the B, or under zb-h1 the W, gives it back). */
static void compute(const ms_pp_plan *pl, const ms_pp_times *t, ms_pp_timeline *tl, int *held,
                    double *clock, int s, int i, double at) {
    const ms_pp_action *a = &pl->act[s][i];
    ms_pp_stage_time *me = &tl->stage[s];
    double d = duration(pl, t, a->op);
    tl->start[s][i] = at;
    tl->end[s][i] = clock[s] = at + d;
    me->busy += d;
    bool release = a->op == (pl->kind == MS_SCHEDULE_ZB_H1 ? MS_PP_WEIGHT : MS_PP_BACKWARD);
    held[s] += a->op == MS_PP_FORWARD ? 1 : release ? -1 : 0;
    if (held[s] > me->peak_inflight) me->peak_inflight = held[s];
}

/* Rendezvous: a stage runs until it waits in a batch; posting a batch wakes the stages it
 * pairs with. Leaves pos[s] < n[s] on the stages that never finish. */
static void run_rendezvous(sim *S, const ms_pp_times *t, ms_pp_timeline *tl, int *pos, int *held,
                           double *clock) {
    const ms_pp_plan *pl = S->pl;
    const int p = pl->p;
    int *stack = xmalloc((size_t)p * sizeof(int)), top = 0;
    bool *queued = xcalloc((size_t)p, sizeof(bool));
    for (int s = p - 1; s >= 0; s--) stack[top++] = s, queued[s] = true;
    while (top > 0) {
        int s = stack[--top];
        queued[s] = false;
        while (pos[s] < pl->n[s]) {
            int i = pos[s];
            if (!ms_pp_is_comm(pl->act[s][i].op)) {
                compute(pl, t, tl, held, clock, s, i, clock[s]);
                pos[s]++;
                continue;
            }
            int j = i;
            while (j < pl->n[s] && ms_pp_is_comm(pl->act[s][j].op)) j++;
            if (S->posted[s][i] < 0) {
                S->posted[s][i] = clock[s];
                for (int k = i; k < j; k++) {
                    int q = S->partner[s][k].stage;
                    if (!queued[q]) stack[top++] = q, queued[q] = true;
                }
            }
            double done = clock[s];
            bool ready = true;
            for (int k = i; k < j && ready; k++) {
                where q = S->partner[s][k];
                double theirs = S->posted[q.stage][S->first[q.stage][q.at]];
                if (theirs < 0) ready = false;
                double met = (theirs > S->posted[s][i] ? theirs : S->posted[s][i]) + t->comm;
                if (met > done) done = met;
            }
            if (!ready) break;
            for (int k = i; k < j; k++) tl->start[s][k] = S->posted[s][i], tl->end[s][k] = done;
            clock[s] = done;
            pos[s] = j;
        }
        tl->stage[s].end = clock[s];
    }
    free(stack), free(queued);
}

/* Posted: when unit (model chunk k, micro-batch j)'s input exists on its stage -- F of k-1's
 * output or B of k+1's gradient, sent the moment it was made -- or -1 while it does not.
 * made[0] holds the F's ends, made[1] the B's, per model chunk and micro-batch. */
static double input_ready(const ms_pp_plan *pl, const ms_pp_times *t, double *const made[2], int s,
                          const ms_pp_action *a) {
    int k = a->chunk * pl->p + s, last = pl->p * pl->v - 1;
    double from;
    if (a->op == MS_PP_FORWARD && k > 0)
        from = made[0][(size_t)(k - 1) * pl->m + a->mb];
    else if (a->op == MS_PP_BACKWARD && k < last)
        from = made[1][(size_t)(k + 1) * pl->m + a->mb];
    else
        return 0; /* the data, its own F (the last chunk's B) or its own B (W): in order */
    return from < 0 ? -1 : from + t->comm;
}

/* Posted: every stage runs its computes in order, each once its input exists; sweeps until
 * none moves. Leaves pos[s] < n[s] on the stages that never finish. */
static void run_posted(const ms_pp_plan *pl, const ms_pp_times *t, ms_pp_timeline *tl, int *pos,
                       int *held, double *clock) {
    size_t units = (size_t)pl->p * pl->v * pl->m;
    double *made[2] = {xmalloc(units * sizeof(double)), xmalloc(units * sizeof(double))};
    for (size_t u = 0; u < units; u++) made[0][u] = made[1][u] = -1;
    for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < pl->p; s++) {
            for (; pos[s] < pl->n[s]; pos[s]++, moved = true) {
                int i = pos[s];
                const ms_pp_action *a = &pl->act[s][i];
                if (ms_pp_is_comm(a->op)) {
                    tl->start[s][i] = tl->end[s][i] = clock[s];
                    continue;
                }
                double ready = input_ready(pl, t, made, s, a);
                if (ready < 0) break;
                compute(pl, t, tl, held, clock, s, i, ready > clock[s] ? ready : clock[s]);
                if (a->op != MS_PP_WEIGHT)
                    made[a->op == MS_PP_BACKWARD][(size_t)(a->chunk * pl->p + s) * pl->m + a->mb] =
                        clock[s];
            }
            tl->stage[s].end = clock[s];
        }
    }
    free(made[0]), free(made[1]);
}

/* Posted: why the stuck stages wait -- the compute each one cannot start. */
static ms_status deadlock_posted(const ms_pp_plan *pl, const int *pos, ms_error *err) {
    char msg[MS_ERROR_MSG_MAX];
    size_t len = (size_t)snprintf(msg, sizeof msg, "deadlock:");
    const char *sep = " ";
    for (int s = 0; s < pl->p && len < sizeof msg; s++) {
        if (pos[s] >= pl->n[s]) continue;
        const ms_pp_action *a = &pl->act[s][pos[s]];
        len += (size_t)snprintf(msg + len, sizeof msg - len,
                                "%sstage %d waits for %s mb %d chunk "
                                "%d's input",
                                sep, s, ms_pp_op_name((ms_pp_op)a->op), a->mb, a->chunk);
        sep = "; ";
    }
    return ms_fail(err, MS_ERR_INVALID, "%s", msg);
}

/* The step, and each stage's bubble against it and the mean. */
static void finish(ms_pp_timeline *tl) {
    for (int s = 0; s < tl->p; s++)
        if (tl->stage[s].end > tl->step) tl->step = tl->stage[s].end;
    for (int s = 0; s < tl->p; s++) {
        ms_pp_stage_time *x = &tl->stage[s];
        x->bubble = tl->step > 0 ? (tl->step - x->busy) / tl->step : 0;
        tl->bubble += x->bubble / tl->p;
    }
}

ms_status ms_pp_simulate(const ms_pp_plan *pl, const ms_pp_times *t, ms_pp_timeline *out,
                         ms_error *err) {
    const double tv[4] = {t->f, t->b, t->w, t->comm};
    for (int i = 0; i < 4; i++)
        if (!isfinite(tv[i]) || tv[i] < 0)
            return ms_fail(err, MS_ERR_INVALID,
                           "pipeline durations must be finite and >= 0 (f %g, b %g, w %g, "
                           "transfer %g)",
                           t->f, t->b, t->w, t->comm);
    const int p = pl->p;
    sim S = {.pl = pl,
             .first = xcalloc((size_t)p, sizeof(int *)),
             .partner = xcalloc((size_t)p, sizeof(where *)),
             .posted = xcalloc((size_t)p, sizeof(double *))};
    ms_pp_timeline tl = {.p = p,
                         .stage = xcalloc((size_t)p, sizeof *tl.stage),
                         .start = xcalloc((size_t)p, sizeof(double *)),
                         .end = xcalloc((size_t)p, sizeof(double *))};
    for (int s = 0; s < p; s++) {
        size_t n = (size_t)(pl->n[s] > 0 ? pl->n[s] : 1);
        S.first[s] = xmalloc(n * sizeof(int));
        S.partner[s] = xmalloc(n * sizeof(where));
        S.posted[s] = xmalloc(n * sizeof(double));
        tl.start[s] = xcalloc(n, sizeof(double));
        tl.end[s] = xcalloc(n, sizeof(double));
        for (int i = 0; i < pl->n[s]; i++) {
            bool comm = ms_pp_is_comm(pl->act[s][i].op);
            S.first[s][i] = !comm ? -1 : i > 0 && S.first[s][i - 1] >= 0 ? S.first[s][i - 1] : i;
            S.posted[s][i] = -1;
        }
    }
    /* paired under either semantics: a list whose transfers do not match is refused */
    ms_status st = pair(&S, err);
    int *pos = xcalloc((size_t)p, sizeof(int)), *held = xcalloc((size_t)p, sizeof(int));
    double *clock = xcalloc((size_t)p, sizeof(double));
    if (st == MS_OK && t->posted)
        run_posted(pl, t, &tl, pos, held, clock);
    else if (st == MS_OK)
        run_rendezvous(&S, t, &tl, pos, held, clock);
    for (int s = 0; s < p && st == MS_OK; s++)
        if (pos[s] < pl->n[s])
            st = t->posted ? deadlock_posted(pl, pos, err) : deadlock(&S, pos, err);
    if (st == MS_OK) {
        finish(&tl);
        *out = tl;
    } else {
        ms_pp_timeline_free(&tl);
    }
    for (int s = 0; s < p; s++) free(S.first[s]), free(S.partner[s]), free(S.posted[s]);
    free(S.first), free(S.partner), free(S.posted);
    free(pos), free(held), free(clock);
    return st;
}

void ms_pp_timeline_free(ms_pp_timeline *tl) {
    if (!tl) return;
    for (int s = 0; s < tl->p; s++) {
        if (tl->start) free(tl->start[s]);
        if (tl->end) free(tl->end[s]);
    }
    free(tl->start), free(tl->end), free(tl->stage);
    tl->start = tl->end = NULL;
    tl->stage = NULL;
}

/* Idle time of a stage (all do the same work) when kind runs m micro-batches. */
static ms_status idle_time(ms_schedule kind, int p, int m, int v, const ms_pp_times *t,
                           double *idle, ms_error *err) {
    ms_pp_plan pl;
    MS_CHECK(ms_pp_plan_make(kind, p, m, v, &pl, err));
    ms_pp_timeline tl;
    ms_status st = ms_pp_simulate(&pl, t, &tl, err);
    ms_pp_plan_free(&pl);
    if (st != MS_OK) return st;
    *idle = tl.step - tl.stage[0].busy;
    ms_pp_timeline_free(&tl);
    return MS_OK;
}

ms_status ms_pp_bubble_fraction(ms_schedule kind, int p, int m, int v, double t_f, double t_b,
                                double t_w, double *bubble, ms_error *err) {
    *bubble = 0;
    MS_CHECK(ms_pp_schedule_check(kind, p, m, v, err));
    if (!isfinite(t_f) || !isfinite(t_b) || !isfinite(t_w) || t_f < 0 || t_b < 0 || t_w < 0 ||
        t_f + t_b + t_w <= 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "pipeline durations must be finite, >= 0 and not all 0 (f %g, b %g, w %g)",
                       t_f, t_b, t_w);
    if (p == 1) return MS_OK;
    /* a chunk: 1/v of the layers; transfers as the executor runs them */
    ms_pp_times t = {.f = t_f / v, .b = t_b / v, .w = t_w / v, .posted = true};
    double idle;
    if (m <= 3 * p) {
        MS_CHECK(idle_time(kind, p, m, v, &t, &idle, err));
    } else {
        /* past the warm-up every p micro-batches repeat the same pattern, so the idle time is
         * affine in m (constant, with posted transfers, for every schedule; rendezvous zb-h1
         * lists would wait |F - W| per micro-batch). Two short runs give the line. */
        double hi, lo;
        MS_CHECK(idle_time(kind, p, 3 * p, v, &t, &hi, err));
        MS_CHECK(idle_time(kind, p, 2 * p, v, &t, &lo, err));
        idle = hi + (double)(m - 3 * p) / p * (hi - lo);
    }
    double busy = (double)m * (t_f + t_b + t_w);
    *bubble = idle > 0 ? idle / (busy + idle) : 0;
    return MS_OK;
}

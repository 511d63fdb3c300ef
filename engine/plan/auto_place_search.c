/* auto_place_search.c - the placement search: a surrogate of unary and pairwise terms priced
 * from compiled programs, its integer program, and a polish of each solution (auto_place.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/plan/auto_place_impl.h"

enum { AP_SOLUTIONS = 3 };

/* The surrogate around a centre layout: var[v] is the class of the program's variable v. */
typedef struct ap_program {
    ms_assign_class c[AP_MAX_CLASSES];
    int var[AP_MAX_CLASSES], nvar;
    ms_assign_pair *pairs;
    int npairs;
    uint8_t centre[AP_MAX_CLASSES];
    double base_step, base_mem, base_bytes; /* the centre's */
} ap_program;

/* The centre with class i at candidate k and class j (>= 0) at l, priced. */
static const ap_eval *priced_at(ap_ctx *cx, const ap_program *pr, int i, int k, int j, int l) {
    uint8_t a[AP_MAX_CLASSES];
    memcpy(a, pr->centre, sizeof a);
    a[i] = (uint8_t)k;
    if (j >= 0) a[j] = (uint8_t)l;
    int idx = ap_evaluate(cx, a); /* it may move cx->evals */
    return &cx->evals[idx];
}

/* Rounding noise in a difference of two priced figures is not an interaction. */
static double settle(double x, double scale) {
    return fabs(x) <= 1e-9 * fabs(scale) ? 0 : x;
}

/* Each searched class's candidates alone, from the centre. */
static void unary_terms(ap_ctx *cx, ap_program *pr) {
    pr->nvar = 0;
    for (int i = 0; i < cx->n; i++) {
        if (cx->c[i].ncand < 2) continue;
        ms_assign_class *c = &pr->c[pr->nvar];
        pr->var[pr->nvar++] = i;
        memset(c, 0, sizeof *c);
        c->ncand = cx->c[i].ncand;
        for (int k = 0; k < c->ncand; k++) {
            if (k == pr->centre[i]) continue;
            const ap_eval *e = priced_at(cx, pr, i, k, -1, 0);
            c->forbid[k] = !e->ok;
            if (!e->ok) continue;
            c->cost[k] = settle(e->e.step_s - pr->base_step, pr->base_step);
            c->mem[k] = settle(e->e.mem_total - pr->base_mem, pr->base_mem);
            c->aux[k] = settle(e->bytes - pr->base_bytes, pr->base_bytes);
        }
    }
}

/* Each interacting pair's joint candidates: what pricing them together adds to the two alone. */
static void pair_terms(ap_ctx *cx, ap_program *pr) {
    free(pr->pairs);
    pr->npairs = 0;
    pr->pairs = xcalloc((size_t)(pr->nvar * pr->nvar / 2 + 1), sizeof *pr->pairs);
    for (int v = 0; v < pr->nvar; v++)
        for (int w = v + 1; w < pr->nvar; w++) {
            int i = pr->var[v], j = pr->var[w];
            if (!cx->adj[i][j]) continue;
            ms_assign_pair *q = &pr->pairs[pr->npairs++];
            q->i = v, q->j = w;
            const ms_assign_class *ci = &pr->c[v], *cj = &pr->c[w];
            for (int k = 0; k < ci->ncand; k++)
                for (int l = 0; l < cj->ncand; l++) {
                    if (k == pr->centre[i] || l == pr->centre[j] || ci->forbid[k] || cj->forbid[l])
                        continue;
                    const ap_eval *e = priced_at(cx, pr, i, k, j, l);
                    q->forbid[k][l] = !e->ok;
                    if (!e->ok) continue;
                    q->cost[k][l] = settle(e->e.step_s - pr->base_step - ci->cost[k] - cj->cost[l],
                                           pr->base_step);
                    q->mem[k][l] = settle(e->e.mem_total - pr->base_mem - ci->mem[k] - cj->mem[l],
                                          pr->base_mem);
                    q->aux[k][l] =
                        settle(e->bytes - pr->base_bytes - ci->aux[k] - cj->aux[l], pr->base_bytes);
                }
        }
}

/* Whether layout x beats y at fewer collective bytes (then the faster), inside the tie band:
 * fitting, and at most `band` seconds a step. */
static bool fewer_bytes(const ap_eval *x, const ap_eval *y, double band) {
    bool xin = x->fits && x->e.step_s <= band, yin = y->fits && y->e.step_s <= band;
    if (xin != yin) return xin;
    return xin && (x->bytes < y->bytes || (x->bytes == y->bytes && x->e.step_s < y->e.step_s));
}

static bool beats(const ap_eval *x, const ap_eval *y, double band) {
    return band > 0 ? fewer_bytes(x, y, band) : ap_better(x, y);
}

/* Coordinate descent from layout `start`: each searched class in turn to its best candidate
 * with the others held, until a sweep changes nothing. By ap_better, or with band > 0 by
 * fewer_bytes. Returns the best layout's index. */
static int polish(ap_ctx *cx, int start, double band) {
    uint8_t cur[AP_MAX_CLASSES];
    memcpy(cur, cx->evals[start].a, sizeof cur);
    int best = start;
    bool changed = true;
    for (int sweep = 0; changed && sweep < cx->max_sweeps; sweep++) {
        changed = false;
        for (int i = 0; i < cx->n; i++) {
            for (int k = 0; k < cx->c[i].ncand; k++) {
                if (k == cur[i]) continue;
                uint8_t trial[AP_MAX_CLASSES];
                memcpy(trial, cur, sizeof trial);
                trial[i] = (uint8_t)k;
                int t = ap_evaluate(cx, trial);
                if (beats(&cx->evals[t], &cx->evals[best], band)) best = t;
            }
            if (cx->evals[best].a[i] != cur[i]) {
                cur[i] = cx->evals[best].a[i];
                changed = true;
            }
        }
    }
    return best;
}

/* What the program minimises: the step, the memory (when no layout fits), or the collective
 * bytes with the step held inside a band. */
typedef enum ap_goal { AP_STEP, AP_MEMORY, AP_BYTES } ap_goal;

/* The program's best layouts for `goal` under the memory limit (none for AP_MEMORY; for
 * AP_BYTES also at most `band` seconds a step). */
static ms_status solve_for(ap_ctx *cx, const ap_program *pr, ap_goal goal, double band,
                           ms_assign_result *r, ms_error *err) {
    ms_assign_class *c = xmalloc(sizeof *c * (size_t)pr->nvar);
    ms_assign_pair *q = xmalloc(sizeof *q * (size_t)(pr->npairs + 1));
    memcpy(c, pr->c, sizeof *c * (size_t)pr->nvar);
    memcpy(q, pr->pairs, sizeof *q * (size_t)pr->npairs);
    for (int v = 0; v < pr->nvar && goal != AP_STEP; v++) {
        double step[MS_ASSIGN_MAX_CANDS];
        memcpy(step, c[v].cost, sizeof step);
        memcpy(c[v].cost, goal == AP_MEMORY ? c[v].mem : c[v].aux, sizeof step);
        memcpy(c[v].aux, step, sizeof step);
    }
    for (int e = 0; e < pr->npairs && goal != AP_STEP; e++) {
        double step[MS_ASSIGN_MAX_CANDS][MS_ASSIGN_MAX_CANDS];
        memcpy(step, q[e].cost, sizeof step);
        memcpy(q[e].cost, goal == AP_MEMORY ? q[e].mem : q[e].aux, sizeof step);
        memcpy(q[e].aux, step, sizeof step);
    }
    ms_assign_problem p = {.n = pr->nvar,
                           .c = c,
                           .npairs = pr->npairs,
                           .pairs = q,
                           .has_budget = goal != AP_MEMORY,
                           .budget = cx->limit - pr->base_mem,
                           .has_aux_budget = goal == AP_BYTES,
                           .aux_budget = band - pr->base_step,
                           .time_limit_s = cx->time_limit_s};
    ms_status st = ms_assign_solve(&p, goal == AP_MEMORY ? 1 : AP_SOLUTIONS, r, err);
    free(c);
    free(q);
    return st;
}

/* The program's best layouts (the least memory when none fits the limit), or -1 with err. */
static int solve(ap_ctx *cx, ap_program *pr, ms_assign_result *r, ms_error *err) {
    MS_CHECK(solve_for(cx, pr, AP_STEP, 0, r, err));
    if (r->infeasible) /* none fits: the least memory, which the caller reports */
        MS_CHECK(solve_for(cx, pr, AP_MEMORY, 0, r, err));
    if (r->timed_out) cx->timed_out = true;
    if (r->nsol == 0 && r->timed_out)
        return ms_fail(err, MS_ERR_INVALID,
                       "auto placements: the solver's time limit of %.3g s ran out before it "
                       "found a layout (%d classes, %d interacting pairs); raise the limit "
                       "(--auto-time-limit) or pin some tensors in the strategy file",
                       cx->time_limit_s, pr->nvar, pr->npairs);
    return MS_OK;
}

/* The best layout priced so far: by ap_better, or with band > 0 by fewer_bytes. */
static int best_priced(const ap_ctx *cx, double band) {
    int best = 0;
    for (int i = 1; i < cx->nevals; i++)
        if (beats(&cx->evals[i], &cx->evals[best], band)) best = i;
    return best;
}

/* One round: the surrogate around `centre`, its program's best layouts for the step (band 0)
 * or for the bytes inside the band, each priced and polished the same way. Returns the best
 * layout priced so far, or -1 with err. */
static int round_from(ap_ctx *cx, ap_program *pr, int centre, double band, ms_error *err) {
    memcpy(pr->centre, cx->evals[centre].a, sizeof pr->centre);
    pr->base_step = cx->evals[centre].e.step_s, pr->base_mem = cx->evals[centre].e.mem_total;
    pr->base_bytes = cx->evals[centre].bytes;
    unary_terms(cx, pr);
    pair_terms(cx, pr);
    if (pr->nvar == 0) return centre;
    ms_assign_result r;
    if (band > 0 ? solve_for(cx, pr, AP_BYTES, band, &r, err) != MS_OK
                 : solve(cx, pr, &r, err) != MS_OK)
        return -1;
    for (int s = 0; s < r.nsol; s++) {
        uint8_t a[AP_MAX_CLASSES];
        memcpy(a, pr->centre, sizeof a);
        for (int v = 0; v < pr->nvar; v++) a[pr->var[v]] = r.sol[s][v];
        int e = ap_evaluate(cx, a);
        /* in the band, only a solution that already beats the centre is worth a polish */
        if (band <= 0 || fewer_bytes(&cx->evals[e], &cx->evals[centre], band)) polish(cx, e, band);
        cx->solutions++;
    }
    return best_priced(cx, band);
}

/* Rounds from `centre` until one finds nothing better (at most max_rounds): the winner, or -1
 * with err. */
static int rounds_from(ap_ctx *cx, ap_program *pr, int centre, double band, ms_error *err) {
    for (int round = 0; round < cx->max_rounds; round++) {
        int best = round_from(cx, pr, centre, band, err);
        if (best < 0) return -1;
        cx->rounds++;
        const ap_eval *b = &cx->evals[best], *c = &cx->evals[centre];
        /* while nothing fits, rounds chase memory: one that gains under 1% will not reach the
         * limit in the rounds left, and saying so early is what a user waiting needs */
        bool done = best == centre ||
                    (!b->fits && b->ok && c->ok && b->e.mem_total > 0.99 * c->e.mem_total);
        centre = best;
        if (done) break;
    }
    return centre;
}

int ap_refine(ap_ctx *cx, int start) {
    int sweeps = cx->max_sweeps;
    cx->max_sweeps = 1;
    polish(cx, start, 0);
    int win = best_priced(cx, 0);
    if (cx->evals[win].fits) {
        double band = cx->evals[win].e.step_s * (1 + cx->tie);
        win = polish(cx, best_priced(cx, band), band);
    }
    cx->max_sweeps = sweeps;
    return win;
}

/* First the fastest layout that fits (or the smallest, when none does); then, inside the tie
 * band of its step, the one with the fewest collective bytes. */
int ap_search(ap_ctx *cx, ms_error *err) {
    ap_program *pr = xcalloc(1, sizeof *pr);
    int win = rounds_from(cx, pr, polish(cx, 0, 0), 0, err);
    if (win >= 0) win = best_priced(cx, 0);
    if (win >= 0 && cx->evals[win].fits) {
        double band = cx->evals[win].e.step_s * (1 + cx->tie);
        win = rounds_from(cx, pr, best_priced(cx, band), band, err);
    }
    free(pr->pairs);
    free(pr);
    return win;
}

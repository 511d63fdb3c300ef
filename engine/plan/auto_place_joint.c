/* auto_place_joint.c - the placement search joined with the strategy search: one layout search
 * per tp degree, on that degree's best strategy (see auto_place.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/event.h"
#include "engine/core/xalloc.h"
#include "engine/plan/auto_place.h"

/* The best fitting strategy with tp fixed at `tp` (and whatever `fixed` fixes); false when
 * there is none. */
static bool best_with_tp(const ms_plan_problem *pb, const ms_plan_fixed *fixed, int tp,
                         ms_strategy *out) {
    ms_plan_fixed f;
    if (fixed)
        f = *fixed;
    else
        ms_plan_fixed_none(&f);
    if (ms_plan_fixed_has(&f, MS_SET_tp) && f.s.tp != tp) return false;
    if (ms_plan_fixed_has(&f, MS_SET_cp) && f.s.cp != 1) return false;
    f.s.tp = tp, f.s.cp = 1; /* layouts are searched without cp (auto_place.h) */
    f.mask |= 1u << MS_SET_tp | 1u << MS_SET_cp;
    ms_plan_search_opts so = {.fixed = &f, .keep = 1, .executable_only = true};
    ms_plan_result r = {0};
    ms_error err = {0};
    bool ok = ms_plan_search(pb, &so, &r, &err) == MS_OK && r.n_cands > 0 && r.cands[0].fits;
    if (ok) *out = r.cands[0].s;
    ms_plan_result_free(&r);
    return ok;
}

/* Row `row`: the hand layout priced whole, then the layout search. */
static void search_row(const ms_plan_problem *pb, const ms_auto_place_opts *opts,
                       ms_auto_plan_row *row) {
    ms_plan_problem whole = *pb;
    whole.engine_workloads = whole.engine_any_size = true;
    whole.memo = NULL;
    ms_error err = {0};
    if (ms_plan_estimate_one(&whole, &row->s, NULL, &row->hand, &err) != MS_OK) {
        snprintf(row->why, sizeof row->why, "%s", err.msg);
        return;
    }
    if (row->s.tp < 2) {
        snprintf(row->why, sizeof row->why, "tp 1: no tensor-parallel layout to search");
        return;
    }
    row->have_auto = ms_plan_auto_placements(&whole, &row->s, opts, &row->layout, &err) == MS_OK;
    if (!row->have_auto) snprintf(row->why, sizeof row->why, "%s", err.msg);
}

/* The tp degrees, shared by the workers: each takes the next one not taken. */
typedef struct joint_work {
    const ms_plan_problem *pb; /* its memo is not shared: NULL */
    const ms_plan_fixed *fixed;
    const ms_auto_place_opts *opts;
    int tps[MS_AUTO_PLAN_MAX_ROWS], n;
    ms_auto_plan_row *rows; /* [n] */
    bool found[MS_AUTO_PLAN_MAX_ROWS];
    atomic_int next;
} joint_work;

static void *joint_worker(void *arg) {
    joint_work *w = arg;
    for (int k; (k = atomic_fetch_add(&w->next, 1)) < w->n;) {
        /* the largest degree first: its stages are the deepest, its search the longest, and
         * started last it would leave the other workers idle */
        int i = w->n - 1 - k;
        ms_auto_plan_row *row = &w->rows[i];
        w->found[i] = best_with_tp(w->pb, w->fixed, w->tps[i], &row->s);
        if (w->found[i]) search_row(w->pb, w->opts, row);
    }
    return NULL;
}

ms_status ms_plan_auto_joint(const ms_plan_problem *pb, const ms_plan_fixed *fixed,
                             const ms_auto_place_opts *opts, ms_auto_plan *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    int64_t t0 = ms_now_ns();
    ms_plan_problem own = *pb;
    own.memo = NULL;
    joint_work *w = xcalloc(1, sizeof *w);
    *w = (joint_work){.pb = &own, .fixed = fixed, .opts = opts};
    for (int tp = 1; tp <= pb->devices && tp <= 64 && w->n < MS_AUTO_PLAN_MAX_ROWS; tp++)
        if (pb->devices % tp == 0) w->tps[w->n++] = tp;
    w->rows = xcalloc((size_t)w->n, sizeof *w->rows);
    /* the degrees are independent: one worker per core, each result the same as alone */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = (int)(cores < 1 ? 1 : cores > w->n ? w->n : cores), started = 0;
    pthread_t th[MS_AUTO_PLAN_MAX_ROWS];
    for (int t = 1; t < nthreads; t++)
        if (pthread_create(&th[started], NULL, joint_worker, w) == 0) started++;
    joint_worker(w);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    for (int i = 0; i < w->n; i++)
        if (w->found[i]) {
            out->rows[out->n++] = w->rows[i];
            out->tp_searched += w->tps[i] > 1;
        }
    free(w->rows);
    free(w);
    out->search_ms = (double)(ms_now_ns() - t0) / 1e6;
    if (out->tp_searched == 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "auto placements: no strategy with tp 2 or more and cp 1 fits %d devices "
                       "here (the layout search runs without cp); there is no tensor-parallel "
                       "layout to search",
                       pb->devices);
    double best = 0;
    out->best = -1;
    for (int i = 0; i < out->n; i++) {
        const ms_auto_plan_row *r = &out->rows[i];
        if (r->hand.step_s > 0 && r->hand.fits && (out->best < 0 || r->hand.step_s < best))
            best = r->hand.step_s, out->best = i, out->best_is_auto = false;
        if (r->have_auto && (out->best < 0 || r->layout.best.step_s < best))
            best = r->layout.best.step_s, out->best = i, out->best_is_auto = true;
    }
    if (out->best < 0) out->best = 0;
    return MS_OK;
}

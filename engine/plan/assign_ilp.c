/* assign_ilp.c - the pairwise assignment program on GLPK (see assign_ilp.h). */
#include "engine/plan/assign_ilp.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

/* The program's columns: x first (class by class), then one y per interacting combination. */
typedef struct ilp_cols {
    int x0[MS_ASSIGN_MAX_CLASSES]; /* column of x[i][0] (1-based) */
    int ncols;
} ilp_cols;

static double max_abs(double a, double b) {
    return fabs(b) > a ? fabs(b) : a;
}

static ms_status check_problem(const ms_assign_problem *p, int k_best, ms_error *err) {
    if (p->n < 1 || p->n > MS_ASSIGN_MAX_CLASSES || k_best < 1 || k_best > MS_ASSIGN_MAX_SOLS)
        return ms_fail(err, MS_ERR_INVALID,
                       "assignment program: %d classes (1..%d) and %d solutions (1..%d) asked",
                       p->n, MS_ASSIGN_MAX_CLASSES, k_best, MS_ASSIGN_MAX_SOLS);
    for (int i = 0; i < p->n; i++)
        if (p->c[i].ncand < 1 || p->c[i].ncand > MS_ASSIGN_MAX_CANDS)
            return ms_fail(err, MS_ERR_INVALID,
                           "assignment program: class %d has %d candidates (1..%d)", i,
                           p->c[i].ncand, MS_ASSIGN_MAX_CANDS);
    for (int e = 0; e < p->npairs; e++) {
        const ms_assign_pair *q = &p->pairs[e];
        if (q->i < 0 || q->j < 0 || q->i >= p->n || q->j >= p->n || q->i == q->j)
            return ms_fail(err, MS_ERR_INVALID, "assignment program: pair %d joins %d and %d", e,
                           q->i, q->j);
    }
    return MS_OK;
}

/* Adds one row lo <= sum val * x[ind] <= hi (bounds by type), 1-based ind and val. */
static void add_row(glp_prob *lp, int type, double lo, double hi, int len, const int *ind,
                    const double *val) {
    int r = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, r, type, lo, hi);
    glp_set_mat_row(lp, r, len, ind, val);
}

/* A budget row's coefficients, grown as columns are added (1-based, as GLPK takes them). */
typedef struct ilp_row {
    int len, cap;
    int *ind;
    double *val;
} ilp_row;

static void row_put(ilp_row *r, int col, double v) {
    if (v == 0) return;
    if (r->len + 1 >= r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->ind = xrealloc(r->ind, sizeof(int) * (size_t)(r->cap + 1));
        r->val = xrealloc(r->val, sizeof(double) * (size_t)(r->cap + 1));
    }
    r->ind[++r->len] = col, r->val[r->len] = v;
}

/* The program without cuts; cost, memory and aux divided by their scales sc[0..2]. */
static glp_prob *build(const ms_assign_problem *p, const double *sc, ilp_cols *cols) {
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    int ncols = 0;
    for (int i = 0; i < p->n; i++) cols->x0[i] = ncols + 1, ncols += p->c[i].ncand;
    glp_add_cols(lp, ncols);
    ilp_row mem = {0}, aux = {0};
    for (int i = 0; i < p->n; i++) {
        const ms_assign_class *c = &p->c[i];
        int ind[MS_ASSIGN_MAX_CANDS + 1];
        double one[MS_ASSIGN_MAX_CANDS + 1];
        for (int k = 0; k < c->ncand; k++) {
            int col = cols->x0[i] + k;
            glp_set_col_kind(lp, col, GLP_BV);
            if (c->forbid[k]) glp_set_col_bnds(lp, col, GLP_FX, 0, 0);
            glp_set_obj_coef(lp, col, c->cost[k] / sc[0]);
            ind[k + 1] = col, one[k + 1] = 1;
            row_put(&mem, col, c->mem[k] / sc[1]);
            row_put(&aux, col, c->aux[k] / sc[2]);
        }
        add_row(lp, GLP_FX, 1, 1, c->ncand, ind, one);
    }
    for (int e = 0; e < p->npairs; e++) {
        const ms_assign_pair *q = &p->pairs[e];
        int ki = p->c[q->i].ncand, kj = p->c[q->j].ncand;
        int y0 = glp_add_cols(lp, ki * kj); /* y[k][l] at y0 + k * kj + l */
        for (int k = 0; k < ki; k++)
            for (int l = 0; l < kj; l++) {
                int y = y0 + k * kj + l;
                glp_set_col_bnds(lp, y, q->forbid[k][l] ? GLP_FX : GLP_DB, 0,
                                 q->forbid[k][l] ? 0 : 1);
                glp_set_obj_coef(lp, y, q->cost[k][l] / sc[0]);
                row_put(&mem, y, q->mem[k][l] / sc[1]);
                row_put(&aux, y, q->aux[k][l] / sc[2]);
            }
        /* the marginals: row k of y sums to x_ik, column l to x_jl (exact for binary x, and
         * a much tighter relaxation than bounding each product alone) */
        int ind[MS_ASSIGN_MAX_CANDS + 2];
        double val[MS_ASSIGN_MAX_CANDS + 2];
        for (int k = 0; k < ki; k++) {
            for (int l = 0; l < kj; l++) ind[l + 1] = y0 + k * kj + l, val[l + 1] = 1;
            ind[kj + 1] = cols->x0[q->i] + k, val[kj + 1] = -1;
            add_row(lp, GLP_FX, 0, 0, kj + 1, ind, val);
        }
        for (int l = 0; l < kj; l++) {
            for (int k = 0; k < ki; k++) ind[k + 1] = y0 + k * kj + l, val[k + 1] = 1;
            ind[ki + 1] = cols->x0[q->j] + l, val[ki + 1] = -1;
            add_row(lp, GLP_FX, 0, 0, ki + 1, ind, val);
        }
    }
    if (p->has_budget) add_row(lp, GLP_UP, 0, p->budget / sc[1], mem.len, mem.ind, mem.val);
    if (p->has_aux_budget) add_row(lp, GLP_UP, 0, p->aux_budget / sc[2], aux.len, aux.ind, aux.val);
    cols->ncols = glp_get_num_cols(lp);
    free(mem.ind), free(mem.val), free(aux.ind), free(aux.val);
    return lp;
}

ms_status ms_assign_solve(const ms_assign_problem *p, int k_best, ms_assign_result *out,
                          ms_error *err) {
    memset(out, 0, sizeof *out);
    MS_CHECK(check_problem(p, k_best, err));
    /* scales: the largest magnitude of each of cost, memory and aux */
    double sc[3] = {0, p->has_budget ? fabs(p->budget) : 0,
                    p->has_aux_budget ? fabs(p->aux_budget) : 0};
    for (int i = 0; i < p->n; i++)
        for (int k = 0; k < p->c[i].ncand; k++) {
            sc[0] = max_abs(sc[0], p->c[i].cost[k]);
            sc[1] = max_abs(sc[1], p->c[i].mem[k]);
            sc[2] = max_abs(sc[2], p->c[i].aux[k]);
        }
    for (int e = 0; e < p->npairs; e++)
        for (int k = 0; k < MS_ASSIGN_MAX_CANDS; k++)
            for (int l = 0; l < MS_ASSIGN_MAX_CANDS; l++) {
                sc[0] = max_abs(sc[0], p->pairs[e].cost[k][l]);
                sc[1] = max_abs(sc[1], p->pairs[e].mem[k][l]);
                sc[2] = max_abs(sc[2], p->pairs[e].aux[k][l]);
            }
    for (int r = 0; r < 3; r++) sc[r] = sc[r] > 0 ? sc[r] : 1;
    glp_term_out(GLP_OFF);
    ilp_cols cols;
    glp_prob *lp = build(p, sc, &cols);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    if (p->time_limit_s > 0)
        parm.tm_lim = p->time_limit_s * 1e3 < 1 ? 1 : (int)fmin(p->time_limit_s * 1e3, 1e9);
    ms_status st = MS_OK;
    while (out->nsol < k_best) {
        int ret = glp_intopt(lp, &parm);
        int status = glp_mip_status(lp);
        if (ret == GLP_ETMLIM || (ret == 0 && status == GLP_FEAS)) {
            out->timed_out = true;
            break;
        }
        if (ret == GLP_ENOPFS || ret == GLP_ENODFS || status == GLP_NOFEAS) {
            out->infeasible = out->nsol == 0;
            break;
        }
        if (ret != 0 || status != GLP_OPT) {
            st = ms_fail(err, MS_ERR_INTERNAL,
                         "assignment program: GLPK's branch and cut failed (code %d, status %d)",
                         ret, status);
            break;
        }
        uint8_t *sol = out->sol[out->nsol];
        int ind[MS_ASSIGN_MAX_CLASSES + 1];
        double one[MS_ASSIGN_MAX_CLASSES + 1];
        for (int i = 0; i < p->n; i++) {
            for (int k = 0; k < p->c[i].ncand; k++)
                if (glp_mip_col_val(lp, cols.x0[i] + k) > 0.5) sol[i] = (uint8_t)k;
            ind[i + 1] = cols.x0[i] + sol[i], one[i + 1] = 1;
        }
        out->objective[out->nsol++] = glp_mip_obj_val(lp) * sc[0];
        add_row(lp, GLP_UP, 0, p->n - 1, p->n, ind, one); /* the no-good cut */
    }
    glp_delete_prob(lp);
    glp_free_env(); /* GLPK's per-thread environment: allocated again by the next solve */
    return st;
}

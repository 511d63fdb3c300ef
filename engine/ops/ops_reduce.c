/* ops_reduce.c - reductions over a set of dims: sum, mean, max, min, prod, var, std,
 * logsumexp, L2 norm and nonzero count (i[0] a dim mask, bit d = dim d; i[1] keepdim), and
 * argmax/argmin over one dim i[0] (i[1] keepdim).
 *
 * Rules per mesh dim: a kept dim keeps its shard. A sharded reduced dim leaves each rank a
 * piece of the answer only for the reductions the placement layer can finish: P(sum) for
 * sum, mean (divided by the GLOBAL count) and count, P(max) / P(min) for max / min. var,
 * std, logsumexp, norm, prod and argmax/argmin need the whole reduced dim on a rank.
 *
 * max/min send the gradient to the first winner in row-major order over the reduced dims.
 * When a reduced dim is sharded each rank only knows its local winner, so the backward
 * agrees on the global one (max of the values, then min of the global positions).
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "engine/dist/dmesh.h"
#include "engine/kernels/reduce_ext.h"
#include "engine/ops/op_defs.h"

typedef enum {
    RD_SUM,
    RD_MEAN,
    RD_MAX,
    RD_MIN,
    RD_PROD,
    RD_VAR,
    RD_STD,
    RD_LSE,
    RD_NORM,
    RD_ARGMAX,
    RD_ARGMIN,
    RD_COUNT,
} rd_kind;

static const char *const rd_names[] = {"sum_dims", "mean_dims", "max_dims", "min_dims",
                                       "prod",     "var",       "std",      "logsumexp",
                                       "norm",     "argmax",    "argmin",   "count_nonzero"};

static bool rd_is_arg(rd_kind k) {
    return k == RD_ARGMAX || k == RD_ARGMIN;
}

static uint32_t rd_mask(rd_kind k, const ms_op_attrs *a) {
    return rd_is_arg(k) ? 1u << a->i[0] : (uint32_t)a->i[0];
}

static ms_status rd_infer(rd_kind k, const ms_op_attrs *a, const ms_shape *in, ms_shape *out,
                          ms_error *err) {
    char buf[96];
    const char *name = rd_names[k], *shape = ms_shape_str(in[0].d, in[0].ndim, buf, sizeof buf);
    int nd = in[0].ndim;
    if (rd_is_arg(k) && (a->i[0] < 0 || a->i[0] >= nd))
        return ms_fail(err, MS_ERR_INVALID, "%s: dim %lld is out of range for %s; use 0..%d", name,
                       (long long)a->i[0], shape, nd - 1);
    if (!rd_is_arg(k) && (a->i[0] <= 0 || a->i[0] >> nd))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: dim mask %lld names no dim or a dim beyond %s; set bit d to reduce "
                       "dim d (1..%d)",
                       name, (long long)a->i[0], shape, (1 << nd) - 1);
    if (a->i[1] != 0 && a->i[1] != 1)
        return ms_fail(err, MS_ERR_INVALID, "%s: keepdim is %lld; use 0 or 1", name,
                       (long long)a->i[1]);
    if ((k == RD_VAR || k == RD_STD) && a->i[2] != 0 && a->i[2] != 1)
        return ms_fail(err, MS_ERR_INVALID, "%s: correction is %lld; use 0 or 1", name,
                       (long long)a->i[2]);
    uint32_t mask = rd_mask(k, a);
    out->ndim = 0;
    for (int d = 0; d < nd; d++) {
        if (!(mask >> d & 1))
            out->d[out->ndim++] = in[0].d[d];
        else if (a->i[1])
            out->d[out->ndim++] = 1;
    }
    return MS_OK;
}

/* What a rank's result is when a reduced dim is sharded; kind REPLICATE = no such candidate. */
static ms_placement rd_split_result(rd_kind k) {
    switch (k) {
        case RD_SUM:
        case RD_MEAN:
        case RD_COUNT:
            return ms_Psum();
        case RD_MAX:
            return ms_pl_partial(MS_REDUCE_MAX);
        case RD_MIN:
            return ms_pl_partial(MS_REDUCE_MIN);
        default:
            return ms_R();
    }
}

static int rd_rule(rd_kind k, const ms_op_attrs *a, const ms_shape *in, ms_rule_cand *c) {
    uint32_t mask = rd_mask(k, a);
    int j = 0, gone = 0;
    cand1(&c[j++], ms_R(), ms_R());
    for (int d = 0; d < in[0].ndim; d++) {
        if (!(mask >> d & 1)) {
            cand1(&c[j++], ms_S(d), ms_S(a->i[1] ? d : d - gone));
            continue;
        }
        gone++;
        ms_placement p = rd_split_result(k);
        if (p.kind == MS_PL_PARTIAL) cand1(&c[j++], ms_S(d), p);
    }
    /* Only sums are linear in their input. */
    if (k == RD_SUM || k == RD_MEAN) cand1(&c[j++], ms_Psum(), ms_Psum());
    return j;
}

static void rd_geom(rd_kind k, const ms_op_call *c, ms_k_rgeom *g) {
    ms_k_rgeom_init(g, c->in[0]->ndim, c->in[0]->shape, rd_mask(k, c->attrs));
}

static void rd_saved(rd_kind k, const ms_op_call *c, int64_t *sizes) {
    ms_k_rgeom g;
    rd_geom(k, c, &g);
    if (k == RD_MAX || k == RD_MIN) {
        sizes[0] = sizes[1] = g.n_out; /* winner positions and local values */
        sizes[2] = 2 * g.n_out;        /* backward scratch: global values and positions */
    } else if (rd_is_arg(k)) {
        sizes[0] = g.n_out;
    }
}

/* 1 / the GLOBAL count of reduced elements, so partial sums of shards add up to the mean. */
static float rd_mean_scale(const ms_op_call *c) {
    uint32_t mask = (uint32_t)c->attrs->i[0];
    int64_t cnt = 1;
    for (int d = 0; d < c->gin[0].ndim; d++)
        if (mask >> d & 1) cnt *= c->gin[0].d[d];
    return cnt ? 1.0f / (float)cnt : NAN;
}

static ms_status rd_forward(rd_kind k, ms_op_call *c) {
    ms_k_rgeom g;
    rd_geom(k, c, &g);
    const float *x = F(c->in[0]);
    float *y = F(c->out[0]);
    int corr = (int)c->attrs->i[2];
    switch (k) {
        case RD_SUM:
            ms_k_rsum_forward(y, x, &g, 1.0f);
            break;
        case RD_MEAN:
            ms_k_rsum_forward(y, x, &g, rd_mean_scale(c));
            break;
        case RD_MAX:
        case RD_MIN:
            ms_k_rmax_forward(y, F(c->saved[0]), x, &g, k == RD_MAX ? 1 : -1);
            if (g.n_out) memcpy(F(c->saved[1]), y, sizeof(float) * (size_t)g.n_out);
            break;
        case RD_ARGMAX:
        case RD_ARGMIN:
            ms_k_rmax_forward(F(c->saved[0]), y, x, &g, k == RD_ARGMAX ? 1 : -1);
            break;
        case RD_PROD:
            ms_k_rprod_forward(y, x, &g);
            break;
        case RD_VAR:
        case RD_STD:
            ms_k_rvar_forward(y, x, &g, corr, k == RD_STD);
            break;
        case RD_LSE:
            ms_k_rlse_forward(y, x, &g);
            break;
        case RD_NORM:
            ms_k_rnorm_forward(y, x, &g);
            break;
        case RD_COUNT:
            ms_k_rcount_forward(y, x, &g);
            break;
    }
    return MS_OK;
}

/* Row-major position of local reduced position r among the GLOBAL reduced positions. */
static float rd_global_pos(const ms_op_call *c, uint32_t mask, int64_t r) {
    const ms_tensor *x = c->in[0];
    int64_t idx[MS_MAX_DIMS], gp = 0;
    for (int d = x->ndim - 1; d >= 0; d--)
        if (mask >> d & 1) idx[d] = r % x->shape[d], r /= x->shape[d];
    for (int d = 0; d < x->ndim; d++)
        if (mask >> d & 1) gp = gp * c->gin[0].d[d] + c->in_start[0][d] + idx[d];
    return (float)gp; /* exact below 2^24 reduced elements */
}

/* All-reduces buf over the mesh dims that shard a reduced dim of the input. */
static ms_status rd_all_reduce(ms_op_call *c, uint32_t mask, float *buf, int64_t n, ms_reduce_op op,
                               ms_error *e) {
    for (int m = 0; m < c->in_pl[0].n; m++) {
        ms_placement p = c->in_pl[0].p[m];
        if (p.kind == MS_PL_SHARD && (mask >> p.dim & 1))
            MS_CHECK(ms_all_reduce(c->mesh->dim_comm[m], buf, buf, (size_t)n, op, e));
    }
    return MS_OK;
}

static ms_status rd_max_backward(rd_kind k, ms_op_call *c, const ms_k_rgeom *g, ms_error *e) {
    uint32_t mask = rd_mask(k, c->attrs);
    const float *pos = F(c->saved[0]), *val = F(c->saved[1]), *dy = F(c->dout[0]);
    bool split = false;
    for (int m = 0; m < c->in_pl[0].n; m++)
        split |= c->in_pl[0].p[m].kind == MS_PL_SHARD && (mask >> c->in_pl[0].p[m].dim & 1);
    if (!split) {
        ms_k_rmax_backward(F(c->din[0]), dy, pos, g);
        return MS_OK;
    }
    int64_t n = g->n_out;
    float *best = F(c->saved[2]), *key = n ? best + n : NULL;
    if (n) memcpy(best, val, sizeof(float) * (size_t)n);
    MS_CHECK(rd_all_reduce(c, mask, best, n, k == RD_MAX ? MS_REDUCE_MAX : MS_REDUCE_MIN, e));
    for (int64_t o = 0; o < n; o++)
        key[o] = pos[o] >= 0 && (val[o] == best[o] || (isnan(val[o]) && isnan(best[o])))
                     ? rd_global_pos(c, mask, (int64_t)pos[o])
                     : FLT_MAX;
    MS_CHECK(rd_all_reduce(c, mask, key, n, MS_REDUCE_MIN, e));
    float *dx = F(c->din[0]);
    for (int64_t o = 0; o < n; o++)
        if (pos[o] >= 0 && key[o] != FLT_MAX && key[o] == rd_global_pos(c, mask, (int64_t)pos[o]))
            dx[ms_k_rgeom_base(g, o) + ms_k_rgeom_roff(g, (int64_t)pos[o])] += dy[o];
    return MS_OK;
}

static ms_status rd_backward(rd_kind k, ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    ms_k_rgeom g;
    rd_geom(k, c, &g);
    const float *x = F(c->in[0]), *dy = F(c->dout[0]);
    float *dx = F(c->din[0]);
    int corr = (int)c->attrs->i[2];
    switch (k) {
        case RD_SUM:
            ms_k_rsum_backward(dx, dy, &g, 1.0f);
            break;
        case RD_MEAN:
            ms_k_rsum_backward(dx, dy, &g, rd_mean_scale(c));
            break;
        case RD_MAX:
        case RD_MIN:
            return rd_max_backward(k, c, &g, e);
        case RD_PROD:
            ms_k_rprod_backward(dx, dy, x, &g);
            break;
        case RD_VAR:
        case RD_STD:
            ms_k_rvar_backward(dx, dy, x, &g, corr, k == RD_STD);
            break;
        case RD_LSE:
            ms_k_rlse_backward(dx, dy, x, &g);
            break;
        case RD_NORM:
            ms_k_rnorm_backward(dx, dy, x, &g);
            break;
        case RD_ARGMAX:
        case RD_ARGMIN:
        case RD_COUNT:
            break; /* integer-valued outputs take no gradient */
    }
    return MS_OK;
}

static ms_k_cost rd_cost(rd_kind k, const ms_op_call *c, bool bw) {
    ms_k_rgeom g;
    rd_geom(k, c, &g);
    int passes = k == RD_VAR || k == RD_STD || k == RD_LSE ? 2 : 1;
    double flops = k == RD_LSE ? 20 : k == RD_VAR || k == RD_STD || k == RD_NORM ? 3 : 1;
    return ms_k_rgeom_cost(&g, flops, passes, bw);
}

/* One table row per reduction; the wrappers bind the kind. */
#define RD_OP(lower, KIND, OPKIND, grads)                                                          \
    static ms_status lower##_infer(const ms_op_attrs *a, int n_in, const ms_shape *in,             \
                                   ms_shape *out, ms_error *err) {                                 \
        (void)n_in;                                                                                \
        return rd_infer(KIND, a, in, out, err);                                                    \
    }                                                                                              \
    static int lower##_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,             \
                            ms_rule_cand *c) {                                                     \
        (void)n_in, (void)n;                                                                       \
        return rd_rule(KIND, a, in, c);                                                            \
    }                                                                                              \
    static void lower##_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {         \
        (void)a;                                                                                   \
        rd_saved(KIND, c, sizes);                                                                  \
    }                                                                                              \
    static ms_status lower##_forward(ms_op_call *c, ms_error *e) {                                 \
        (void)e;                                                                                   \
        return rd_forward(KIND, c);                                                                \
    }                                                                                              \
    static ms_status lower##_backward(ms_op_call *c, ms_error *e) {                                \
        return rd_backward(KIND, c, e);                                                            \
    }                                                                                              \
    static ms_k_cost lower##_cost(const ms_op_call *c, bool bw) {                                  \
        return rd_cost(KIND, c, bw);                                                               \
    }                                                                                              \
    const ms_op_def ms_op_##lower##_def = {                                                        \
        .kind = OPKIND,                                                                            \
        .name = #lower,                                                                            \
        .n_in = 1,                                                                                 \
        .n_out = 1,                                                                                \
        .infer = lower##_infer,                                                                    \
        .rule = lower##_rule,                                                                      \
        .saved_floats = lower##_saved,                                                             \
        .forward = lower##_forward,                                                                \
        .backward = lower##_backward,                                                              \
        .cost = lower##_cost,                                                                      \
        .grad_inputs = grads,                                                                      \
    }

RD_OP(sum_dims, RD_SUM, MS_OP_SUM_DIMS, 1);
RD_OP(mean_dims, RD_MEAN, MS_OP_MEAN_DIMS, 1);
RD_OP(max_dims, RD_MAX, MS_OP_MAX_DIMS, 1);
RD_OP(min_dims, RD_MIN, MS_OP_MIN_DIMS, 1);
RD_OP(prod, RD_PROD, MS_OP_PROD, 1);
RD_OP(var, RD_VAR, MS_OP_VAR, 1);
RD_OP(std, RD_STD, MS_OP_STD, 1);
RD_OP(logsumexp, RD_LSE, MS_OP_LOGSUMEXP, 1);
RD_OP(norm, RD_NORM, MS_OP_NORM, 1);
RD_OP(argmax, RD_ARGMAX, MS_OP_ARGMAX, 0);
RD_OP(argmin, RD_ARGMIN, MS_OP_ARGMIN, 0);
RD_OP(count_nonzero, RD_COUNT, MS_OP_COUNT_NONZERO, 0);

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
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
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

/* The kernel op code of each reduction (argmax/argmin: max/min with the outputs swapped). */
static ms_k_reduce rd_kernel(rd_kind k) {
    static const ms_k_reduce code[] = {
        [RD_SUM] = MS_K_RED_SUM,    [RD_MEAN] = MS_K_RED_SUM,   [RD_MAX] = MS_K_RED_MAX,
        [RD_MIN] = MS_K_RED_MIN,    [RD_PROD] = MS_K_RED_PROD,  [RD_VAR] = MS_K_RED_VAR,
        [RD_STD] = MS_K_RED_STD,    [RD_LSE] = MS_K_RED_LSE,    [RD_NORM] = MS_K_RED_NORM,
        [RD_ARGMAX] = MS_K_RED_MAX, [RD_ARGMIN] = MS_K_RED_MIN, [RD_COUNT] = MS_K_RED_COUNT,
    };
    return code[k];
}

static ms_status rd_forward(rd_kind k, ms_op_call *c, ms_error *e) {
    ms_k_rgeom g;
    rd_geom(k, c, &g);
    const float *x = F(c->in[0]);
    float *y = F(c->out[0]), *pos = c->saved[0] ? F(c->saved[0]) : NULL;
    float scale = k == RD_MEAN ? rd_mean_scale(c) : 1.0f;
    int corr = (int)c->attrs->i[2];
    if (rd_is_arg(k)) { /* the positions are the output, the values are not kept */
        float *t = pos;
        pos = y, y = t;
    }
    MS_CHECK(MS_CALL_K(c->kc, reduce_forward, rd_kernel(k), y, pos, x, &g, scale, corr, e));
    if ((k == RD_MAX || k == RD_MIN) && g.n_out)
        return MS_CALL_K(c->kc, copy, F(c->saved[1]), y, g.n_out, e);
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

/* Copies n floats between the device and the host (to_host: device -> host). */
static ms_status rd_move(ms_op_call *c, float *dst, const float *src, int64_t n, bool to_host,
                         ms_error *e) {
    if (!n) return MS_OK;
    return ms_device_copy(c->kc->dev, dst, src, sizeof(float) * (size_t)n,
                          to_host ? MS_COPY_DEVICE_TO_HOST : MS_COPY_HOST_TO_DEVICE, e);
}

/* A reduced dim split across ranks: each rank knows its local winner only, so the ranks
 * agree on the global one (max of the values, then min of the global positions), computed
 * on the host from the device's per-output values (n_out floats, not the input), and the
 * winners' positions go back to the device with -1 where another rank holds the winner. */
static ms_status rd_max_split_backward(rd_kind k, ms_op_call *c, const ms_k_rgeom *g, ms_error *e) {
    uint32_t mask = rd_mask(k, c->attrs);
    int64_t n = g->n_out;
    float *best = F(c->saved[2]), *key = best + n; /* device scratch, 2 n floats */
    float *h = xmalloc(sizeof(float) * (size_t)(4 * n + 1));
    float *hpos = h, *hval = h + n, *hbest = h + 2 * n, *hkey = h + 3 * n;
    ms_status st = MS_CALL_K(c->kc, copy, best, F(c->saved[1]), n, e);
    if (st == MS_OK)
        st = rd_all_reduce(c, mask, best, n, k == RD_MAX ? MS_REDUCE_MAX : MS_REDUCE_MIN, e);
    if (st == MS_OK) st = rd_move(c, hpos, F(c->saved[0]), n, true, e);
    if (st == MS_OK) st = rd_move(c, hval, F(c->saved[1]), n, true, e);
    if (st == MS_OK) st = rd_move(c, hbest, best, n, true, e);
    for (int64_t o = 0; o < n && st == MS_OK; o++) {
        bool won = hval[o] == hbest[o] || (isnan(hval[o]) && isnan(hbest[o]));
        hkey[o] = hpos[o] >= 0 && won ? rd_global_pos(c, mask, (int64_t)hpos[o]) : FLT_MAX;
    }
    if (st == MS_OK) st = rd_move(c, key, hkey, n, false, e);
    if (st == MS_OK) st = rd_all_reduce(c, mask, key, n, MS_REDUCE_MIN, e);
    if (st == MS_OK) st = rd_move(c, hkey, key, n, true, e);
    for (int64_t o = 0; o < n && st == MS_OK; o++) {
        bool mine = hpos[o] >= 0 && hkey[o] != FLT_MAX &&
                    hkey[o] == rd_global_pos(c, mask, (int64_t)hpos[o]);
        hbest[o] = mine ? hpos[o] : -1.0f;
    }
    if (st == MS_OK) st = rd_move(c, best, hbest, n, false, e);
    if (st == MS_OK)
        st = MS_CALL_K(c->kc, reduce_backward, rd_kernel(k), F(c->din[0]), F(c->dout[0]), NULL,
                       best, g, 1.0f, 0, e);
    free(h);
    return st;
}

static ms_status rd_backward(rd_kind k, ms_op_call *c, ms_error *e) {
    if (!c->din[0] || rd_is_arg(k) || k == RD_COUNT) return MS_OK; /* integer outputs */
    ms_k_rgeom g;
    rd_geom(k, c, &g);
    if (k == RD_MAX || k == RD_MIN) {
        uint32_t mask = rd_mask(k, c->attrs);
        for (int m = 0; m < c->in_pl[0].n; m++)
            if (c->in_pl[0].p[m].kind == MS_PL_SHARD && (mask >> c->in_pl[0].p[m].dim & 1))
                return rd_max_split_backward(k, c, &g, e);
    }
    float scale = k == RD_MEAN ? rd_mean_scale(c) : 1.0f;
    const float *pos = c->saved[0] ? F(c->saved[0]) : NULL;
    return MS_CALL_K(c->kc, reduce_backward, rd_kernel(k), F(c->din[0]), F(c->dout[0]), F(c->in[0]),
                     pos, &g, scale, (int)c->attrs->i[2], e);
}

static bool rd_runs_on(const ms_kernels *k) {
    return k->reduce_forward && k->reduce_backward && k->copy;
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
        return rd_forward(KIND, c, e);                                                             \
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
        .runs_on = rd_runs_on,                                                                     \
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

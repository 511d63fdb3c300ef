/* ops_pool.c - operators for vision and speech models on channels-first tensors (NCHW and
 * NCL, as PyTorch and ONNX lay them out): max and average pooling in 1-D and 2-D, global
 * average pooling, group normalisation, nearest / linear resizing, and train_select, batch
 * norm's switch between the batch's statistics (training) and the running ones (evaluation).
 * Kernels are pool.h's slots (global average pooling: the reductions'), called through the rank's
 * kernel table.
 *
 * Rules only declare what is exact without a halo: every op runs on batch shards (S(0)), and
 * every op but group_norm on channel shards (S(1)), since channels are independent; group_norm
 * on channel shards only where each shard holds whole groups. The ops linear in their input
 * (average pooling, global average pooling, resizing) pass partial sums through, and global
 * average pooling reduces a sharded spatial dim to a partial sum (it divides by the GLOBAL
 * count). Spatial dims are otherwise never split: a window or an interpolation reads across
 * the cut.
 */
#include <math.h>
#include <stdio.h>

#include "engine/kernels/pool.h"
#include "engine/kernels/reduce_ext.h"
#include "engine/ops/op_family_row.h"

static ms_status bad_input(ms_error *err, const char *op, const char *want, int n,
                           const ms_shape *in) {
    char buf[240];
    return ms_fail(err, MS_ERR_INVALID, "%s: %s; got %s", op, want,
                   ms_op_shapes_str(n, in, buf, sizeof buf));
}

/* N * C of a local [N, C, ...] and the product of its other dims. */
static int64_t planes_of(const ms_tensor *t) {
    return t->shape[0] * t->shape[1];
}
static int64_t spatial_of(const ms_tensor *t) {
    int64_t s = 1;
    for (int d = 2; d < t->ndim; d++) s *= t->shape[d];
    return s;
}

/* R -> R, S(0) -> S(0), S(1) -> S(1) on input 0 (the others R with batch shards, `chan` on
 * channel shards), and P(sum) -> P(sum) for the ops linear in their input. */
static int nc_cands(int n_in, bool channels, ms_placement chan, bool linear, ms_rule_cand *c) {
    int k = 0;
    for (int d = -1; d < (channels ? 2 : 1); d++, k++) {
        c[k].in[0] = c[k].out[0] = d < 0 ? ms_R() : ms_S(d);
        for (int i = 1; i < n_in; i++) c[k].in[i] = d == 1 ? chan : ms_R();
    }
    if (linear) cand1(&c[k++], ms_Psum(), ms_Psum());
    return k;
}

/* --- pooling: x [N, C, L] or [N, C, H, W]; per spatial dim s of k (1 or 2): kernel i[s],
 * stride i[k + s], padding i[2k + s]; average: i[3k] excludes padding from the divisor ---- */

/* The family's ids: max_pool1d, max_pool2d, avg_pool1d, avg_pool2d. */
typedef struct pool_kind {
    ms_k_pool_op op;
    int k; /* spatial dims */
} pool_kind;

static const pool_kind pool_kinds[] = {
    {MS_K_POOL_MAX, 1},
    {MS_K_POOL_MAX, 2},
    {MS_K_POOL_AVG, 1},
    {MS_K_POOL_AVG, 2},
};

/* One spatial dim's window against its input extent; *out the output extent. */
static ms_status pool_dim_check(const char *name, const pool_kind *pk, const ms_op_attrs *a,
                                const ms_shape *x, int s, int64_t *out, ms_error *err) {
    const char *dim = pk->k == 1 ? "L" : s == 0 ? "H" : "W";
    const int64_t k = a->i[s], st = a->i[pk->k + s], p = a->i[2 * pk->k + s];
    const int64_t in = x->d[2 + s];
    char sh[96];
    ms_shape_str(x->d, x->ndim, sh, sizeof sh);
    if (k < 1)
        return ms_fail(err, MS_ERR_INVALID, "%s: kernel %lld along %s of input %s; use >= 1", name,
                       (long long)k, dim, sh);
    if (st < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: stride %lld along %s of input %s; use >= 1 (PyTorch's default is the "
                       "kernel size, %lld)",
                       name, (long long)st, dim, sh, (long long)k);
    if (p < 0 || 2 * p > k)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: padding %lld along %s of input %s must be 0..%lld, at most half the "
                       "kernel %lld (as PyTorch)",
                       name, (long long)p, dim, sh, (long long)(k / 2), (long long)k);
    if (k > in + 2 * p)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: kernel %lld along %s is larger than the padded input (%lld + 2 x %lld) "
                       "of input %s; use a kernel of at most %lld or pad the input",
                       name, (long long)k, dim, (long long)in, (long long)p, sh,
                       (long long)(in + 2 * p));
    *out = (in + 2 * p - k) / st + 1;
    return MS_OK;
}

static ms_status pool_infer(int kind, const char *name, const ms_op_attrs *a, int n_in,
                            const ms_shape *in, ms_shape *out, ms_error *err) {
    const pool_kind *pk = &pool_kinds[kind];
    if (in[0].ndim != 2 + pk->k)
        return bad_input(err, name,
                         pk->k == 1 ? "the input must be [N, C, L]"
                                    : "the input must be [N, C, H, W]",
                         n_in, in);
    if (pk->op == MS_K_POOL_AVG && a->i[3 * pk->k] != 0 && a->i[3 * pk->k] != 1)
        return ms_fail(
            err, MS_ERR_INVALID,
            "%s: exclude_pad i[%d] is %lld; use 0 (padding counts, PyTorch's default) or "
            "1 (count_include_pad=False)",
            name, 3 * pk->k, (long long)a->i[3 * pk->k]);
    out[0] = in[0];
    for (int s = 0; s < pk->k; s++)
        MS_CHECK(pool_dim_check(name, pk, a, &in[0], s, &out[0].d[2 + s], err));
    return MS_OK;
}

static int pool_rule(int kind, const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                     ms_rule_cand *c) {
    (void)a, (void)in, (void)n;
    return nc_cands(n_in, true, ms_R(), pool_kinds[kind].op == MS_K_POOL_AVG, c);
}

/* The local problem: planes of [H, W] (1-D: [1, L] with a window of 1 along H). */
static ms_k_pool pool_geom(int kind, const ms_op_call *c) {
    const pool_kind *pk = &pool_kinds[kind];
    const ms_tensor *x = c->in[0], *y = c->out[0];
    const int64_t *i = c->attrs->i;
    const int k = pk->k, last = x->ndim - 1;
    ms_k_pool g = {.op = pk->op,
                   .planes = planes_of(x),
                   .h = 1,
                   .w = x->shape[last],
                   .oh = 1,
                   .ow = y->shape[last],
                   .kh = 1,
                   .kw = i[k - 1],
                   .sh = 1,
                   .sw = i[2 * k - 1],
                   .ph = 0,
                   .pw = i[3 * k - 1],
                   .exclude_pad = pk->op == MS_K_POOL_AVG && i[3 * k]};
    if (k == 2) g.h = x->shape[2], g.oh = y->shape[2], g.kh = i[0], g.sh = i[2], g.ph = i[4];
    return g;
}

static void pool_saved(int kind, const ms_op_call *c, int64_t *sizes) {
    if (pool_kinds[kind].op == MS_K_POOL_MAX) sizes[0] = N(c->out[0]); /* int32 winners */
}
static ms_status pool_forward(int kind, ms_op_call *c, ms_error *e) {
    ms_k_pool g = pool_geom(kind, c);
    int32_t *idx = c->saved[0] ? (int32_t *)F(c->saved[0]) : NULL;
    return MS_CALL_K(c->kc, pool_forward, &g, F(c->out[0]), idx, F(c->in[0]), e);
}
static ms_status pool_backward(int kind, ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    ms_k_pool g = pool_geom(kind, c);
    const int32_t *idx = c->saved[0] ? (const int32_t *)F(c->saved[0]) : NULL;
    return MS_CALL_K(c->kc, pool_backward, &g, F(c->din[0]), F(c->dout[0]), idx, e);
}
static bool pool_runs_on(const ms_kernels *k) {
    return k->pool_forward && k->pool_backward;
}
static ms_k_cost pool_cost(int kind, const ms_op_call *c, bool bw) {
    ms_k_pool g = pool_geom(kind, c);
    return ms_k_pool_cost(&g, bw);
}

MS_OP_FAMILY_ROW_SAVED(pool, 0, MS_OP_MAX_POOL1D, max_pool1d, 1, 1)
MS_OP_FAMILY_ROW_SAVED(pool, 1, MS_OP_MAX_POOL2D, max_pool2d, 1, 1)
MS_OP_FAMILY_ROW_SAVED(pool, 2, MS_OP_AVG_POOL1D, avg_pool1d, 1, 1)
MS_OP_FAMILY_ROW_SAVED(pool, 3, MS_OP_AVG_POOL2D, avg_pool2d, 1, 1)

/* --- global average pooling: x [N, C, ...] -> [N, C, 1, ...] (ONNX GlobalAveragePool) -------
 * The reductions' kernels over the spatial dims, scaled by 1 / the GLOBAL spatial count, so a
 * rank holding part of a spatial dim contributes its part of the mean. */

static uint32_t gap_mask(int ndim) {
    return ((1u << ndim) - 1) & ~3u;
}
static ms_status gap_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a;
    if (in[0].ndim < 3)
        return bad_input(err, "global_avg_pool", "the input must be [N, C, D1, ...]", n_in, in);
    out[0] = in[0];
    for (int d = 2; d < in[0].ndim; d++) out[0].d[d] = 1;
    return MS_OK;
}
static int gap_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    int k = nc_cands(n_in, true, ms_R(), true, c);
    for (int d = 2; d < in[0].ndim; d++) cand1(&c[k++], ms_S(d), ms_Psum());
    return k;
}
static ms_k_rgeom gap_geom(const ms_op_call *c) {
    ms_k_rgeom g;
    ms_k_rgeom_init(&g, c->in[0]->ndim, c->in[0]->shape, gap_mask(c->in[0]->ndim));
    return g;
}
static float gap_scale(const ms_op_call *c) {
    int64_t cnt = 1;
    for (int d = 2; d < c->gin[0].ndim; d++) cnt *= c->gin[0].d[d];
    return cnt ? 1.0f / (float)cnt : 0.0f;
}
static ms_status gap_forward(ms_op_call *c, ms_error *e) {
    ms_k_rgeom g = gap_geom(c);
    return MS_CALL_K(c->kc, reduce_forward, MS_K_RED_SUM, F(c->out[0]), NULL, F(c->in[0]), &g,
                     gap_scale(c), 0, e);
}
static ms_status gap_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    ms_k_rgeom g = gap_geom(c);
    return MS_CALL_K(c->kc, reduce_backward, MS_K_RED_SUM, F(c->din[0]), F(c->dout[0]), F(c->in[0]),
                     NULL, &g, gap_scale(c), 0, e);
}
static bool gap_runs_on(const ms_kernels *k) {
    return k->reduce_forward && k->reduce_backward;
}
static ms_k_cost gap_cost(const ms_op_call *c, bool bw) {
    ms_k_rgeom g = gap_geom(c);
    return ms_k_rgeom_cost(&g, 1, 1, bw);
}
const ms_op_def ms_op_global_avg_pool_def = {
    .kind = MS_OP_GLOBAL_AVG_POOL,
    .name = "global_avg_pool",
    .n_in = 1,
    .n_out = 1,
    .infer = gap_infer,
    .rule = gap_rule,
    .forward = gap_forward,
    .backward = gap_backward,
    .cost = gap_cost,
    .runs_on = gap_runs_on,
    .grad_inputs = 1,
};

/* --- group normalisation: x [N, C, ...], weight [C], bias [C]; i[0] groups, f[0] eps --------
 * Channels shard by whole groups: the rule offers S(1) when the groups split evenly over the
 * mesh dim (or are single channels, which any split keeps whole), and `valid` checks the same
 * over every mesh dim that shards the channels, since two such dims split them further. */

static ms_status gn_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                          ms_error *err) {
    const ms_shape *x = &in[0];
    if (x->ndim < 2 || in[1].ndim != 1 || in[2].ndim != 1 || in[1].d[0] != x->d[1] ||
        in[2].d[0] != x->d[1])
        return bad_input(err, "group_norm",
                         "x must be [N, C, ...] with weight and bias [C] (C = x's dim 1)", n_in,
                         in);
    const int64_t c = x->d[1], groups = a->i[0];
    if (groups < 1 || c < 1 || c % groups) {
        char sh[96];
        return ms_fail(
            err, MS_ERR_INVALID,
            "group_norm: %lld groups (i[0]) do not divide the %lld channels of input "
            "%s; use a divisor of %lld (1 is LayerNorm over C and the spatial dims, %lld "
            "InstanceNorm)",
            (long long)groups, (long long)c, ms_shape_str(x->d, x->ndim, sh, sizeof sh),
            (long long)c, (long long)c);
    }
    if (!(a->f[0] > 0.0f))
        return ms_fail(err, MS_ERR_INVALID,
                       "group_norm: eps f[0] = %g must be > 0 (PyTorch's default is 1e-5)",
                       (double)a->f[0]);
    out[0] = *x;
    return MS_OK;
}
/* Whether a split of the channels `ways` ways keeps every group whole. */
static bool gn_whole_groups(const ms_op_attrs *a, const ms_shape *x, int64_t ways) {
    return a->i[0] % ways == 0 || a->i[0] == x->d[1];
}
static int gn_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    return nc_cands(n_in, gn_whole_groups(a, &in[0], n), ms_S(0), false, c);
}
static bool gn_valid(const ms_op_attrs *a, int n_in, const ms_shape *in, const ms_placements *pl,
                     const int *mesh_shape) {
    (void)n_in;
    return gn_whole_groups(a, &in[0], ms_op_shard_ways(&pl[0], 1, mesh_shape));
}
/* The local problem: this shard's channels hold whole groups of C / G (global) channels. */
static ms_k_gnorm gn_geom(const ms_op_call *c) {
    const ms_tensor *x = c->in[0];
    const int64_t cpg = c->gin[0].d[1] / c->attrs->i[0];
    return (ms_k_gnorm){.n = x->shape[0],
                        .c = x->shape[1],
                        .s = spatial_of(x),
                        .groups = x->shape[1] / cpg,
                        .eps = c->attrs->f[0]};
}
/* mean and rstd per (sample, group), then the backward's scratch */
static void gn_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    ms_k_gnorm g = gn_geom(c);
    sizes[0] = sizes[1] = g.n * g.groups;
    sizes[2] = ms_k_group_norm_scratch_floats(&g);
}
static ms_status gn_forward(ms_op_call *c, ms_error *e) {
    ms_k_gnorm g = gn_geom(c);
    return MS_CALL_K(c->kc, group_norm_forward, &g, F(c->out[0]), F(c->saved[0]), F(c->saved[1]),
                     F(c->in[0]), F(c->in[1]), F(c->in[2]), e);
}
static ms_status gn_backward(ms_op_call *c, ms_error *e) {
    ms_k_gnorm g = gn_geom(c);
    return MS_CALL_K(c->kc, group_norm_backward, &g, F(c->din[0]), F(c->din[1]), F(c->din[2]),
                     F(c->saved[2]), F(c->dout[0]), F(c->in[0]), F(c->in[1]), F(c->saved[0]),
                     F(c->saved[1]), e);
}
static bool gn_runs_on(const ms_kernels *k) {
    return k->group_norm_forward && k->group_norm_backward;
}
static ms_k_cost gn_cost(const ms_op_call *c, bool bw) {
    ms_k_gnorm g = gn_geom(c);
    return ms_k_group_norm_cost(&g, bw);
}
const ms_op_def ms_op_group_norm_def = {
    .kind = MS_OP_GROUP_NORM,
    .name = "group_norm",
    .n_in = 3,
    .n_out = 1,
    .infer = gn_infer,
    .rule = gn_rule,
    .valid = gn_valid,
    .saved_floats = gn_saved,
    .forward = gn_forward,
    .backward = gn_backward,
    .cost = gn_cost,
    .runs_on = gn_runs_on,
    .grad_inputs = 7,
};

/* --- resize: x [N, C, L] or [N, C, H, W]; i[0] 0 nearest, 1 linear (bilinear on [H, W]);
 * the output size i[1] (L or H), i[2] (W; 0: i[1]) or the scale factors f[0], f[1] (0: f[0]),
 * one of the two. A scale gives floor(in x scale) and steps of 1 / scale, as PyTorch's
 * interpolate(scale_factor=...); a size steps by in / out. ---------------------------------- */

/* The size or scale attribute of spatial dim s (0: L or H, 1: W), 0 when not given. */
static int64_t rs_size(const ms_op_attrs *a, int s) {
    return s == 1 && a->i[2] ? a->i[2] : a->i[1];
}
static float rs_scale(const ms_op_attrs *a, int s) {
    return s == 1 && a->f[1] != 0.0f ? a->f[1] : a->f[0];
}

static ms_status rs_dim(const ms_op_attrs *a, const ms_shape *x, int s, int64_t *out,
                        ms_error *err) {
    const int k = x->ndim - 2;
    const char *dim = k == 1 ? "L" : s == 0 ? "H" : "W";
    const int64_t in = x->d[2 + s], size = rs_size(a, s);
    const float scale = rs_scale(a, s);
    char sh[96];
    ms_shape_str(x->d, x->ndim, sh, sizeof sh);
    if (size < 0 || !(scale >= 0.0f) || (size > 0) == (scale > 0.0f))
        return ms_fail(err, MS_ERR_INVALID,
                       "resize: input %s needs an output size i[1] (i[2]) or a scale f[0] (f[1]) "
                       "> 0 along %s, one of the two; got size %lld, scale %g",
                       sh, dim, (long long)size, (double)scale);
    *out = size ? size : (int64_t)floor((double)in * (double)scale);
    if (*out < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "resize: scale %g along %s of input %s gives an empty output (floor(%lld x "
                       "%g) = 0); use a scale >= %g or an output size",
                       (double)scale, dim, sh, (long long)in, (double)scale,
                       in ? 1.0 / (double)in : 1.0);
    return MS_OK;
}
static ms_status rs_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                          ms_error *err) {
    if (in[0].ndim != 3 && in[0].ndim != 4)
        return bad_input(err, "resize", "the input must be [N, C, L] or [N, C, H, W]", n_in, in);
    if (a->i[0] != 0 && a->i[0] != 1)
        return ms_fail(err, MS_ERR_INVALID, "resize: mode i[0] is %lld; use 0 nearest or 1 linear",
                       (long long)a->i[0]);
    out[0] = in[0];
    for (int s = 0; s < in[0].ndim - 2; s++) MS_CHECK(rs_dim(a, &in[0], s, &out[0].d[2 + s], err));
    return MS_OK;
}
static int rs_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)in, (void)n;
    return nc_cands(n_in, true, ms_R(), true, c);
}
/* PyTorch's fp32 step: 1 / scale (the double quotient rounded once) or in / out. */
static float rs_step(const ms_op_attrs *a, int s, int64_t in, int64_t out) {
    const float scale = rs_scale(a, s);
    return rs_size(a, s) ? (float)in / (float)out : (float)(1.0 / (double)scale);
}
static ms_k_resize rs_geom(const ms_op_call *c) {
    const ms_tensor *x = c->in[0], *y = c->out[0];
    const int last = x->ndim - 1;
    ms_k_resize g = {.planes = planes_of(x),
                     .h = 1,
                     .w = x->shape[last],
                     .oh = 1,
                     .ow = y->shape[last],
                     .rh = 1.0f,
                     .linear = c->attrs->i[0] == 1};
    g.rw = rs_step(c->attrs, last - 2, g.w, g.ow);
    if (x->ndim == 4) g.h = x->shape[2], g.oh = y->shape[2], g.rh = rs_step(c->attrs, 0, g.h, g.oh);
    return g;
}
static ms_status rs_forward(ms_op_call *c, ms_error *e) {
    ms_k_resize g = rs_geom(c);
    return MS_CALL_K(c->kc, resize_forward, &g, F(c->out[0]), F(c->in[0]), e);
}
static ms_status rs_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    ms_k_resize g = rs_geom(c);
    return MS_CALL_K(c->kc, resize_backward, &g, F(c->din[0]), F(c->dout[0]), e);
}
static bool rs_runs_on(const ms_kernels *k) {
    return k->resize_forward && k->resize_backward;
}
static ms_k_cost rs_cost(const ms_op_call *c, bool bw) {
    ms_k_resize g = rs_geom(c);
    return ms_k_resize_cost(&g, bw);
}
const ms_op_def ms_op_resize_def = {
    .kind = MS_OP_RESIZE,
    .name = "resize",
    .n_in = 1,
    .n_out = 1,
    .infer = rs_infer,
    .rule = rs_rule,
    .forward = rs_forward,
    .backward = rs_backward,
    .cost = rs_cost,
    .runs_on = rs_runs_on,
    .grad_inputs = 1,
};

/* --- train_select: a, b of one shape -> a while training, b in evaluation (ms_op_call.eval).
 * Batch normalisation (engine/graph/graph.h, ms_graph_batch_norm) normalises with the batch's
 * statistics in training and the running ones in evaluation through it. A copy either way, so
 * every placement passes through, partial sums included; the gradient flows to a in training
 * (b, the running statistics, takes none). --------------------------------------------------- */

static ms_status ts_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                          ms_error *err) {
    (void)a, (void)n_in;
    bool same = in[0].ndim == in[1].ndim;
    for (int d = 0; same && d < in[0].ndim; d++) same = in[0].d[d] == in[1].d[d];
    if (!same) return bad_input(err, "train_select", "a and b must have one shape", 2, in);
    out[0] = in[0];
    return MS_OK;
}
static int ts_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int k = 0;
    for (int d = -1; d < in[0].ndim; d++, k++) {
        ms_placement p = d < 0 ? ms_R() : ms_S(d);
        c[k].in[0] = c[k].in[1] = c[k].out[0] = p;
    }
    c[k].in[0] = c[k].in[1] = c[k].out[0] = ms_Psum();
    return k + 1;
}
static ms_status ts_forward(ms_op_call *c, ms_error *e) {
    const ms_tensor *src = c->eval ? c->in[1] : c->in[0];
    return MS_CALL_K(c->kc, scale_forward, F(c->out[0]), F(src), 1.0f, N(c->out[0]), e);
}
static ms_status ts_backward(ms_op_call *c, ms_error *e) {
    if (c->eval || !c->din[0]) return MS_OK; /* b was selected: a's gradient is zero */
    return MS_CALL_K(c->kc, scale_backward, F(c->din[0]), F(c->dout[0]), 1.0f, N(c->dout[0]), e);
}
static bool ts_runs_on(const ms_kernels *k) {
    return k->scale_forward && k->scale_backward;
}
static ms_k_cost ts_cost(const ms_op_call *c, bool bw) {
    (void)bw;
    return (ms_k_cost){.flops = 0, .bytes = 8.0 * (double)N(c->out[0])};
}
const ms_op_def ms_op_train_select_def = {
    .kind = MS_OP_TRAIN_SELECT,
    .name = "train_select",
    .n_in = 2,
    .n_out = 1,
    .infer = ts_infer,
    .rule = ts_rule,
    .forward = ts_forward,
    .backward = ts_backward,
    .cost = ts_cost,
    .runs_on = ts_runs_on,
    .grad_inputs = 1,
};

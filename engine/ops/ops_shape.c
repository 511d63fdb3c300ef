/* ops_shape.c - reshape, transpose, split, concat, and sum/mean reductions. */
#include <string.h>

#include "engine/ops/op_defs.h"

/* R->R, P->P and the given shard map (in dim d -> out dim map[d], -1 = not allowed). */
static int mapped_rule(int in_ndim, const int *map, int n_in, int n_out, bool partial_ok,
                       ms_rule_cand *c) {
    int k = 0;
    for (int i = 0; i < n_in; i++) c[k].in[i] = ms_R();
    for (int o = 0; o < n_out; o++) c[k].out[o] = ms_R();
    k++;
    for (int d = 0; d < in_ndim; d++) {
        if (map[d] < 0) continue;
        for (int i = 0; i < n_in; i++) c[k].in[i] = ms_S(d);
        for (int o = 0; o < n_out; o++) c[k].out[o] = ms_S(map[d]);
        k++;
    }
    if (partial_ok) {
        for (int i = 0; i < n_in; i++) c[k].in[i] = ms_Psum();
        for (int o = 0; o < n_out; o++) c[k].out[o] = ms_Psum();
        k++;
    }
    return k;
}

/* --- reshape: i[0] ndim, i[1..] shape ------------------------------------------------------- */

static ms_status reshape_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                               ms_error *err) {
    (void)n_in;
    if (a->i[0] < 0 || a->i[0] > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID, "reshape: target rank %lld", (long long)a->i[0]);
    out->ndim = (int)a->i[0];
    for (int d = 0; d < out->ndim; d++) out->d[d] = a->i[1 + d];
    if (shape_numel(out) != shape_numel(&in[0])) {
        char x[96], y[96];
        return ms_fail(err, MS_ERR_INVALID, "reshape: %s has %lld elements, %s has %lld",
                       ms_shape_str(in[0].d, in[0].ndim, x, sizeof x),
                       (long long)shape_numel(&in[0]), ms_shape_str(out->d, out->ndim, y, sizeof y),
                       (long long)shape_numel(out));
    }
    return MS_OK;
}
/* A sharded input dim survives a reshape when it appears whole in the output after the same
 * number of leading elements. */
static int reshape_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)n;
    ms_shape out;
    reshape_infer(a, n_in, in, &out, NULL);
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) {
        map[d] = -1;
        int64_t before = 1;
        for (int e = 0; e < d; e++) before *= in[0].d[e];
        int64_t ob = 1;
        for (int e = 0; e < out.ndim; e++) {
            if (ob == before && out.d[e] == in[0].d[d]) {
                map[d] = e;
                break;
            }
            ob *= out.d[e];
        }
    }
    return mapped_rule(in[0].ndim, map, 1, 1, true, c);
}
static ms_status reshape_forward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, copy, F(c->out[0]), F(c->in[0]), N(c->in[0]), e);
}
static ms_status reshape_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, accumulate, F(c->din[0]), F(c->dout[0]), N(c->dout[0]), e);
}
static bool reshape_runs_on(const ms_kernels *k) {
    return k->copy && k->accumulate;
}
static ms_k_cost copy_cost(const ms_op_call *c, bool bw) {
    return ms_k_copy_cost(N(c->in[0]), bw);
}
const ms_op_def ms_op_reshape_def = {
    .kind = MS_OP_RESHAPE,
    .name = "reshape",
    .n_in = 1,
    .n_out = 1,
    .infer = reshape_infer,
    .rule = reshape_rule,
    .forward = reshape_forward,
    .backward = reshape_backward,
    .cost = copy_cost,
    .runs_on = reshape_runs_on,
    .grad_inputs = 1,
};

/* --- transpose: swap dims i[0] and i[1] ------------------------------------------------------ */

static ms_status transpose_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                                 ms_error *err) {
    (void)n_in;
    int x = (int)a->i[0], y = (int)a->i[1];
    if (x < 0 || y < 0 || x >= in[0].ndim || y >= in[0].ndim)
        return ms_fail(err, MS_ERR_INVALID, "transpose: dims (%d, %d) out of range for rank %d", x,
                       y, in[0].ndim);
    *out = in[0];
    out->d[x] = in[0].d[y];
    out->d[y] = in[0].d[x];
    return MS_OK;
}
static int transpose_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                          ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++)
        map[d] = d == a->i[0] ? (int)a->i[1] : d == a->i[1] ? (int)a->i[0] : d;
    return mapped_rule(in[0].ndim, map, 1, 1, true, c);
}
/* The transpose of a contiguous x as a strided view: output dim a reads x's dim b. */
static void transpose_view(const ms_op_call *c, ms_k_view *v) {
    const ms_tensor *x = c->in[0];
    int a = (int)c->attrs->i[0], b = (int)c->attrs->i[1];
    int64_t oshape[MS_MAX_DIMS], istride[MS_MAX_DIMS], s = 1;
    for (int d = x->ndim - 1; d >= 0; d--) istride[d] = s, s *= x->shape[d];
    for (int d = 0; d < x->ndim; d++) oshape[d] = x->shape[d == a ? b : d == b ? a : d];
    ms_k_view_identity(v, x->ndim, oshape);
    for (int d = 0; d < x->ndim; d++) v->istride[d] = istride[d == a ? b : d == b ? a : d];
}
static ms_status transpose_forward(ms_op_call *c, ms_error *e) {
    ms_k_view v;
    transpose_view(c, &v);
    return MS_CALL_K(c->kc, view_forward, F(c->out[0]), F(c->in[0]), &v, 0.0f, e);
}
static ms_status transpose_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    ms_k_view v;
    transpose_view(c, &v);
    return MS_CALL_K(c->kc, view_backward, F(c->din[0]), F(c->dout[0]), &v, e);
}
static bool transpose_runs_on(const ms_kernels *k) {
    return k->view_forward && k->view_backward;
}
const ms_op_def ms_op_transpose_def = {
    .kind = MS_OP_TRANSPOSE,
    .name = "transpose",
    .n_in = 1,
    .n_out = 1,
    .infer = transpose_infer,
    .rule = transpose_rule,
    .forward = transpose_forward,
    .backward = transpose_backward,
    .cost = copy_cost,
    .runs_on = transpose_runs_on,
    .grad_inputs = 1,
};

/* --- split along i[0] into i[1] equal parts; concat along i[0] ------------------------------ */

static ms_status split_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    (void)n_in;
    int k = (int)a->i[0];
    int64_t p = a->i[1];
    if (k < 0 || k >= in[0].ndim || p < 1 || p > MS_OP_MAX_OUT || in[0].d[k] % p)
        return ms_fail(err, MS_ERR_INVALID,
                       "split: dim %d of size %lld into %lld equal parts "
                       "(1..%d)",
                       k, k >= 0 && k < in[0].ndim ? (long long)in[0].d[k] : -1LL, (long long)p,
                       MS_OP_MAX_OUT);
    for (int o = 0; o < p; o++) {
        out[o] = in[0];
        out[o].d[k] /= p;
    }
    return MS_OK;
}
static int split_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) map[d] = d == a->i[0] ? -1 : d;
    return mapped_rule(in[0].ndim, map, 1, (int)a->i[1], true, c);
}
/* Parts along a dim of the whole viewed as [O, D, I] move as blocks: part p is O rows of
 * sizes[p] * I floats at column (sizes before p) * I of the whole's rows of D * I. to_whole:
 * part -> whole (concat), else whole -> part (split). NULL parts are skipped (unwanted
 * gradients). */
static ms_status move_parts(ms_op_call *c, float *whole, float *const *parts, const int64_t *sizes,
                            int n, int64_t o, int64_t i, bool to_whole, bool acc, ms_error *e) {
    int64_t total = 0, col = 0;
    for (int p = 0; p < n; p++) total += sizes[p];
    for (int p = 0; p < n; col += sizes[p] * i, p++) {
        if (!parts[p] || !sizes[p] || !i) continue;
        float *w = whole + col;
        if (to_whole)
            MS_CHECK(MS_CALL_K(c->kc, block_copy, w, parts[p], o, sizes[p] * i, total * i,
                               sizes[p] * i, acc, e));
        else
            MS_CHECK(MS_CALL_K(c->kc, block_copy, parts[p], w, o, sizes[p] * i, sizes[p] * i,
                               total * i, acc, e));
    }
    return MS_OK;
}
static ms_status split_forward(ms_op_call *c, ms_error *e) {
    int64_t o, d, i, sizes[MS_OP_MAX_OUT];
    ms_k_dim_split(c->in[0]->ndim, c->in[0]->shape, (int)c->attrs->i[0], &o, &d, &i);
    float *parts[MS_OP_MAX_OUT];
    for (int p = 0; p < c->n_out; p++) sizes[p] = d / c->n_out, parts[p] = F(c->out[p]);
    return move_parts(c, F(c->in[0]), parts, sizes, c->n_out, o, i, false, false, e);
}
static ms_status split_backward(ms_op_call *c, ms_error *e) {
    int64_t o, d, i, sizes[MS_OP_MAX_OUT];
    if (!c->din[0]) return MS_OK;
    ms_k_dim_split(c->in[0]->ndim, c->in[0]->shape, (int)c->attrs->i[0], &o, &d, &i);
    float *parts[MS_OP_MAX_OUT];
    for (int p = 0; p < c->n_out; p++) sizes[p] = d / c->n_out, parts[p] = F(c->dout[p]);
    return move_parts(c, F(c->din[0]), parts, sizes, c->n_out, o, i, true, true, e);
}
static bool parts_runs_on(const ms_kernels *k) {
    return k->block_copy != NULL;
}
const ms_op_def ms_op_split_def = {
    .kind = MS_OP_SPLIT,
    .name = "split",
    .n_in = 1,
    .n_out = -MS_OP_MAX_OUT,
    .infer = split_infer,
    .rule = split_rule,
    .forward = split_forward,
    .backward = split_backward,
    .cost = copy_cost,
    .runs_on = parts_runs_on,
    .grad_inputs = 1,
};

static ms_status concat_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    int k = (int)a->i[0];
    if (k < 0 || k >= in[0].ndim)
        return ms_fail(err, MS_ERR_INVALID, "concat: dim %d out of range", k);
    *out = in[0];
    out->d[k] = 0;
    for (int j = 0; j < n_in; j++) {
        bool ok = in[j].ndim == in[0].ndim;
        for (int d = 0; ok && d < in[0].ndim; d++) ok = d == k || in[j].d[d] == in[0].d[d];
        if (!ok) {
            char buf[300];
            return ms_fail(err, MS_ERR_INVALID, "concat: shapes %s differ outside dim %d",
                           ms_op_shapes_str(n_in, in, buf, sizeof buf), k);
        }
        out->d[k] += in[j].d[k];
    }
    return MS_OK;
}
static int concat_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) map[d] = d == a->i[0] ? -1 : d;
    return mapped_rule(in[0].ndim, map, n_in, 1, true, c);
}
static ms_status concat_forward(ms_op_call *c, ms_error *e) {
    int64_t o, d, i, sizes[MS_OP_MAX_IN];
    float *parts[MS_OP_MAX_IN];
    for (int p = 0; p < c->n_in; p++) {
        ms_k_dim_split(c->in[p]->ndim, c->in[p]->shape, (int)c->attrs->i[0], &o, &d, &i);
        sizes[p] = d, parts[p] = F(c->in[p]);
    }
    return move_parts(c, F(c->out[0]), parts, sizes, c->n_in, o, i, true, false, e);
}
static ms_status concat_backward(ms_op_call *c, ms_error *e) {
    int64_t o, d, i, sizes[MS_OP_MAX_IN];
    float *parts[MS_OP_MAX_IN];
    for (int p = 0; p < c->n_in; p++) {
        ms_k_dim_split(c->in[p]->ndim, c->in[p]->shape, (int)c->attrs->i[0], &o, &d, &i);
        sizes[p] = d, parts[p] = F(c->din[p]);
    }
    return move_parts(c, F(c->dout[0]), parts, sizes, c->n_in, o, i, false, true, e);
}
const ms_op_def ms_op_concat_def = {
    .kind = MS_OP_CONCAT,
    .name = "concat",
    .n_in = -MS_OP_MAX_IN,
    .n_out = 1,
    .infer = concat_infer,
    .rule = concat_rule,
    .forward = concat_forward,
    .backward = concat_backward,
    .cost = copy_cost,
    .runs_on = parts_runs_on,
    .grad_inputs = 15,
};

/* --- sum / mean over dim i[0] (i[0] < 0: every dim, to a scalar) ---------------------------
 * A sharded reduced dim gives a partial sum. Mean divides by the GLOBAL count, so the
 * partial sums of uneven shards still add up to the mean. */

static ms_status reduce_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    (void)n_in;
    int k = (int)a->i[0];
    if (k >= in[0].ndim)
        return ms_fail(err, MS_ERR_INVALID, "sum/mean: dim %d out of range for rank %d", k,
                       in[0].ndim);
    out->ndim = 0;
    if (k >= 0)
        for (int d = 0; d < in[0].ndim; d++)
            if (d != k) out->d[out->ndim++] = in[0].d[d];
    return MS_OK;
}
static int reduce_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    int k = (int)a->i[0], j = 0;
    cand1(&c[j++], ms_R(), ms_R());
    for (int d = 0; d < in[0].ndim; d++) {
        if (k < 0 || d == k)
            cand1(&c[j++], ms_S(d), ms_Psum());
        else
            cand1(&c[j++], ms_S(d), ms_S(d < k ? d : d - 1));
    }
    cand1(&c[j++], ms_Psum(), ms_Psum());
    return j;
}
static void reduce_dims(const ms_op_call *c, int64_t *o, int64_t *d, int64_t *i) {
    int k = (int)c->attrs->i[0];
    if (k < 0)
        *o = 1, *d = N(c->in[0]), *i = 1;
    else
        ms_k_dim_split(c->in[0]->ndim, c->in[0]->shape, k, o, d, i);
}
static float reduce_factor(const ms_op_call *c, bool mean) {
    if (!mean) return 1.0f;
    int k = (int)c->attrs->i[0];
    int64_t cnt = k < 0 ? shape_numel(&c->gin[0]) : c->gin[0].d[k];
    return cnt ? 1.0f / (float)cnt : 0.0f;
}
static ms_status reduce_fwd(ms_op_call *c, bool mean, ms_error *e) {
    int64_t o, d, i;
    reduce_dims(c, &o, &d, &i);
    MS_CHECK(MS_CALL_K(c->kc, sum_forward, F(c->out[0]), F(c->in[0]), o, d, i, e));
    float f = reduce_factor(c, mean);
    if (f == 1.0f) return MS_OK;
    return MS_CALL_K(c->kc, scale_forward, F(c->out[0]), F(c->out[0]), f, N(c->out[0]), e);
}
static ms_status reduce_bwd(ms_op_call *c, bool mean, ms_error *e) {
    int64_t o, d, i;
    reduce_dims(c, &o, &d, &i);
    return MS_CALL_K(c->kc, sum_backward, F(c->din[0]), F(c->dout[0]), reduce_factor(c, mean), o, d,
                     i, e);
}
static ms_status sum_forward(ms_op_call *c, ms_error *e) {
    return reduce_fwd(c, false, e);
}
static ms_status sum_backward(ms_op_call *c, ms_error *e) {
    return reduce_bwd(c, false, e);
}
static ms_status mean_forward(ms_op_call *c, ms_error *e) {
    return reduce_fwd(c, true, e);
}
static ms_status mean_backward(ms_op_call *c, ms_error *e) {
    return reduce_bwd(c, true, e);
}
static bool reduce_runs_on(const ms_kernels *k) {
    return k->sum_forward && k->sum_backward && k->scale_forward;
}
static ms_k_cost sum_cost(const ms_op_call *c, bool bw) {
    int64_t o, d, i;
    reduce_dims(c, &o, &d, &i);
    return ms_k_reduce_cost(o, d, i, false, bw);
}
static ms_k_cost mean_cost(const ms_op_call *c, bool bw) {
    int64_t o, d, i;
    reduce_dims(c, &o, &d, &i);
    return ms_k_reduce_cost(o, d, i, true, bw);
}
const ms_op_def ms_op_sum_def = {
    .kind = MS_OP_SUM,
    .name = "sum",
    .n_in = 1,
    .n_out = 1,
    .infer = reduce_infer,
    .rule = reduce_rule,
    .forward = sum_forward,
    .backward = sum_backward,
    .cost = sum_cost,
    .runs_on = reduce_runs_on,
    .grad_inputs = 1,
};
const ms_op_def ms_op_mean_def = {
    .kind = MS_OP_MEAN,
    .name = "mean",
    .n_in = 1,
    .n_out = 1,
    .infer = reduce_infer,
    .rule = reduce_rule,
    .forward = mean_forward,
    .backward = mean_backward,
    .cost = mean_cost,
    .runs_on = reduce_runs_on,
    .grad_inputs = 1,
};

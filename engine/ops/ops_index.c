/* ops_index.c - indexing and layout: permute, slice, narrow, flip, roll, repeat, expand,
 * squeeze, unsqueeze, pad, stack, tril/triu, cumsum/cumprod, index_select, gather,
 * batch_gather, scatter_add, masked_fill, one_hot, topk and sort.
 *
 * Rules: a dim may stay sharded only where it survives with the same global extent and
 * meaning, since then a rank's local slice of the output is computed from its local slice of
 * the input (permute moves the shard to the dim's new place). A dim that is sliced, flipped,
 * rolled, repeated, padded, scanned or sorted along needs the whole dim, except where a rule
 * below says why a split is still exact (triangles and one-hot use global positions; a
 * gather from rows split across ranks gives each rank the rows it holds, zeros elsewhere: a
 * partial sum). P(sum) passes through the ops that are linear in the partial input.
 */
#include <math.h>
#include <string.h>

#include "engine/kernels/index.h"
#include "engine/ops/op_defs.h"

/* R->R; S(d)->S(map[d]) on every input and output (map[d] < 0: d may not be sharded);
 * P(sum)->P(sum) when `linear`. */
static int survive_rule(int ndim, const int *map, int n_in, int n_out, bool linear,
                        ms_rule_cand *c) {
    int k = 0;
    for (int d = -1; d < ndim; d++) {
        if (d >= 0 && map[d] < 0) continue;
        for (int i = 0; i < n_in; i++) c[k].in[i] = d < 0 ? ms_R() : ms_S(d);
        for (int o = 0; o < n_out; o++) c[k].out[o] = d < 0 ? ms_R() : ms_S(map[d]);
        k++;
    }
    if (linear) {
        for (int i = 0; i < n_in; i++) c[k].in[i] = ms_Psum();
        for (int o = 0; o < n_out; o++) c[k].out[o] = ms_Psum();
        k++;
    }
    return k;
}

/* map[d] = d except for the dims in `fixed` (bit d: the op works along dim d). */
static void keep_map(int ndim, uint32_t fixed, int *map) {
    for (int d = 0; d < ndim; d++) map[d] = fixed >> d & 1 ? -1 : d;
}

static ms_status bad(ms_error *err, const char *op, const ms_shape *in, int n, const char *what) {
    char buf[300];
    return ms_fail(err, MS_ERR_INVALID, "%s: %s (input %s)", op, what,
                   ms_op_shapes_str(n, in, buf, sizeof buf));
}

static bool dim_ok(int64_t d, int ndim) {
    return d >= 0 && d < ndim;
}

static ms_k_cost out_cost(const ms_op_call *c, bool bw) {
    return ms_k_index_cost(N(c->out[0]), 0, bw);
}

/* --- views: one input, output element = an input element (or padding) ---------------------
 * Each op builds its ms_k_view from the local input and output shapes; sharded dims are
 * unchanged ones, whose local extents agree. */

typedef void (*view_fn)(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os,
                        int ond, ms_k_view *v);

static void view_base(const int64_t *is, int ind, const int64_t *os, int ond, ms_k_view *v,
                      int64_t *in_stride) {
    ms_k_view_identity(v, ond, os);
    int64_t s = 1;
    for (int d = ind - 1; d >= 0; d--) in_stride[d] = s, s *= is[d];
}

static ms_status view_forward(ms_op_call *c, view_fn fn, float fill, ms_error *e) {
    ms_k_view v;
    fn(c->attrs, c->in[0]->shape, c->in[0]->ndim, c->out[0]->shape, c->out[0]->ndim, &v);
    return MS_CALL_K(c->kc, view_forward, F(c->out[0]), F(c->in[0]), &v, fill, e);
}

static ms_status view_backward(ms_op_call *c, view_fn fn, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    ms_k_view v;
    fn(c->attrs, c->in[0]->shape, c->in[0]->ndim, c->dout[0]->shape, c->dout[0]->ndim, &v);
    return MS_CALL_K(c->kc, view_backward, F(c->din[0]), F(c->dout[0]), &v, e);
}

/* Which kernel slots each group of ops below calls. */
static bool view_runs_on(const ms_kernels *k) {
    return k->view_forward && k->view_backward;
}
static bool copy_runs_on(const ms_kernels *k) {
    return k->copy && k->accumulate;
}
static bool block_runs_on(const ms_kernels *k) {
    return k->block_copy != NULL;
}
static bool triangle_runs_on(const ms_kernels *k) {
    return k->triangle != NULL;
}
static bool scan_runs_on(const ms_kernels *k) {
    return k->scan_forward && k->scan_backward;
}
static bool gather_runs_on(const ms_kernels *k) {
    return k->gather && k->scatter_add;
}
static bool scatter_runs_on(const ms_kernels *k) {
    return k->gather && k->scatter_add && k->copy && k->accumulate;
}
static bool masked_fill_runs_on(const ms_kernels *k) {
    return k->masked_fill_forward && k->masked_fill_backward;
}
static bool one_hot_runs_on(const ms_kernels *k) {
    return k->one_hot != NULL;
}
static bool sort_runs_on(const ms_kernels *k) {
    return k->sort_rows && k->sort_rows_backward && k->copy;
}

#define VIEW_OP(lower, OPKIND, fill)                                                               \
    static ms_status lower##_forward(ms_op_call *c, ms_error *e) {                                 \
        return view_forward(c, lower##_view, fill, e);                                             \
    }                                                                                              \
    static ms_status lower##_backward(ms_op_call *c, ms_error *e) {                                \
        return view_backward(c, lower##_view, e);                                                  \
    }                                                                                              \
    const ms_op_def ms_op_##lower##_def = {                                                        \
        .kind = OPKIND,                                                                            \
        .name = #lower,                                                                            \
        .n_in = 1,                                                                                 \
        .n_out = 1,                                                                                \
        .infer = lower##_infer,                                                                    \
        .rule = lower##_rule,                                                                      \
        .forward = lower##_forward,                                                                \
        .backward = lower##_backward,                                                              \
        .cost = out_cost,                                                                          \
        .runs_on = view_runs_on,                                                                   \
        .grad_inputs = 1,                                                                          \
    }

/* --- permute: i[k] = the input dim that becomes output dim k ------------------------------ */

static ms_status permute_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                               ms_error *err) {
    (void)n_in;
    unsigned seen = 0;
    for (int k = 0; k < in[0].ndim; k++) {
        if (!dim_ok(a->i[k], in[0].ndim) || (seen >> a->i[k] & 1))
            return bad(err, "permute", in, 1, "i[0..rank-1] must order the dims 0..rank-1");
        seen |= 1u << a->i[k];
        out->d[k] = in[0].d[a->i[k]];
    }
    out->ndim = in[0].ndim;
    return MS_OK;
}
static int permute_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    for (int k = 0; k < in[0].ndim; k++) map[a->i[k]] = k; /* S(d) -> S(perm^-1(d)) */
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static void permute_view(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os,
                         int ond, ms_k_view *v) {
    int64_t st[MS_MAX_DIMS];
    view_base(is, ind, os, ond, v, st);
    for (int k = 0; k < ond; k++) v->istride[k] = st[a->i[k]];
}
VIEW_OP(permute, MS_OP_PERMUTE, 0.0f);

/* --- slice: dim i[0], [i[1], i[2]); narrow: dim i[0], i[2] elements from i[1] ----------- */

static ms_status cut_infer(const char *op, int64_t start, int64_t len, const ms_op_attrs *a,
                           const ms_shape *in, ms_shape *out, ms_error *err) {
    if (!dim_ok(a->i[0], in[0].ndim)) return bad(err, op, in, 1, "dim i[0] out of range");
    if (start < 0 || len < 0 || start + len > in[0].d[a->i[0]])
        return bad(err, op, in, 1, "the range must lie within the dim (0 <= start <= end <= size)");
    *out = in[0];
    out->d[a->i[0]] = len;
    return MS_OK;
}
static ms_status slice_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    (void)n_in;
    return cut_infer("slice", a->i[1], a->i[2] - a->i[1], a, in, out, err);
}
static ms_status narrow_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    (void)n_in;
    return cut_infer("narrow", a->i[1], a->i[2], a, in, out, err);
}
/* Every op below that works along the one dim i[0] shares this rule. */
static int along_dim_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                          ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    keep_map(in[0].ndim, 1u << a->i[0], map);
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static void cut_view(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os, int ond,
                     ms_k_view *v) {
    int64_t st[MS_MAX_DIMS];
    view_base(is, ind, os, ond, v, st);
    for (int k = 0; k < ond; k++) v->istride[k] = st[k];
    v->start[a->i[0]] = a->i[1];
}
#define slice_rule  along_dim_rule
#define slice_view  cut_view
#define narrow_rule along_dim_rule
#define narrow_view cut_view
VIEW_OP(slice, MS_OP_SLICE, 0.0f);
VIEW_OP(narrow, MS_OP_NARROW, 0.0f);

/* --- flip: the dims in mask i[0]; roll: dim i[0] by i[1] (out[j] = x[j - shift]) --------- */

static ms_status same_infer(const ms_shape *in, ms_shape *out) {
    *out = in[0];
    return MS_OK;
}
static ms_status flip_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)n_in;
    if (a->i[0] <= 0 || a->i[0] >> in[0].ndim)
        return bad(err, "flip", in, 1, "dim mask i[0] must name 1..rank dims (bit d = dim d)");
    return same_infer(in, out);
}
static int flip_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    keep_map(in[0].ndim, (uint32_t)a->i[0], map);
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static void flip_view(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os, int ond,
                      ms_k_view *v) {
    int64_t st[MS_MAX_DIMS];
    view_base(is, ind, os, ond, v, st);
    for (int k = 0; k < ond; k++) v->istride[k] = st[k], v->flip[k] = a->i[0] >> k & 1;
}
VIEW_OP(flip, MS_OP_FLIP, 0.0f);

static ms_status roll_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)n_in;
    if (!dim_ok(a->i[0], in[0].ndim)) return bad(err, "roll", in, 1, "dim i[0] out of range");
    return same_infer(in, out);
}
static void roll_view(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os, int ond,
                      ms_k_view *v) {
    int64_t st[MS_MAX_DIMS], k = a->i[0], n = is[k];
    view_base(is, ind, os, ond, v, st);
    for (int d = 0; d < ond; d++) v->istride[d] = st[d];
    if (n > 0) v->mod[k] = n, v->shift[k] = ((-a->i[1]) % n + n) % n;
}
#define roll_rule along_dim_rule
VIEW_OP(roll, MS_OP_ROLL, 0.0f);

/* --- repeat: tile dim d i[d] times; expand: size-1 dims to i[d] (0 or equal: unchanged) --- */

static ms_status repeat_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    (void)n_in;
    *out = in[0];
    for (int d = 0; d < in[0].ndim; d++) {
        if (a->i[d] < 1) return bad(err, "repeat", in, 1, "i[d] (times along dim d) must be >= 1");
        out->d[d] *= a->i[d];
    }
    return MS_OK;
}
static int repeat_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) map[d] = a->i[d] == 1 ? d : -1;
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static void repeat_view(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os,
                        int ond, ms_k_view *v) {
    (void)a;
    int64_t st[MS_MAX_DIMS];
    view_base(is, ind, os, ond, v, st);
    for (int k = 0; k < ond; k++) v->istride[k] = st[k], v->mod[k] = is[k];
}
VIEW_OP(repeat, MS_OP_REPEAT, 0.0f);

static ms_status expand_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    (void)n_in;
    *out = in[0];
    for (int d = 0; d < in[0].ndim; d++) {
        if (a->i[d] == 0 || a->i[d] == in[0].d[d]) continue;
        if (in[0].d[d] != 1 || a->i[d] < 0)
            return bad(err, "expand", in, 1, "only size-1 dims expand (i[d] = new size, 0 = keep)");
        out->d[d] = a->i[d];
    }
    return MS_OK;
}
/* An expanded dim stays whole: a sharded size-1 input dim does not become a shard of the
 * output. (A replicated input could broadcast straight into a sharded output, but that
 * candidate has the same inputs as R->R, so the selector would never pick it.) */
static int expand_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS] = {0};
    for (int d = 0; d < in[0].ndim; d++) map[d] = a->i[d] > 1 && in[0].d[d] == 1 ? -1 : d;
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static void expand_view(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os,
                        int ond, ms_k_view *v) {
    (void)a;
    int64_t st[MS_MAX_DIMS];
    view_base(is, ind, os, ond, v, st);
    for (int k = 0; k < ond; k++) v->istride[k] = is[k] == 1 ? 0 : st[k];
}
VIEW_OP(expand, MS_OP_EXPAND, 0.0f);

/* --- pad: constant f[0]; i[2d], i[2d+1] elements before / after dim d (rank <= 5) -------- */

static ms_status pad_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)n_in;
    if (in[0].ndim > 5) return bad(err, "pad", in, 1, "at most 5 dims (two attrs per dim)");
    *out = in[0];
    for (int d = 0; d < in[0].ndim; d++) {
        if (a->i[2 * d] < 0 || a->i[2 * d + 1] < 0)
            return bad(err, "pad", in, 1, "pads must be >= 0 (i[2d] before, i[2d+1] after dim d)");
        out->d[d] += a->i[2 * d] + a->i[2 * d + 1];
    }
    return MS_OK;
}
/* Linear only when the padding is 0 (ranks would each add the constant otherwise). */
static int pad_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) map[d] = a->i[2 * d] || a->i[2 * d + 1] ? -1 : d;
    return survive_rule(in[0].ndim, map, 1, 1, a->f[0] == 0.0f, c);
}
static void pad_view(const ms_op_attrs *a, const int64_t *is, int ind, const int64_t *os, int ond,
                     ms_k_view *v) {
    int64_t st[MS_MAX_DIMS];
    view_base(is, ind, os, ond, v, st);
    for (int k = 0; k < ond; k++) v->istride[k] = st[k], v->lo[k] = a->i[2 * k], v->ext[k] = is[k];
}
static ms_status pad_forward(ms_op_call *c, ms_error *e) {
    return view_forward(c, pad_view, c->attrs->f[0], e);
}
static ms_status pad_backward(ms_op_call *c, ms_error *e) {
    return view_backward(c, pad_view, e);
}
const ms_op_def ms_op_pad_def = {
    .kind = MS_OP_PAD,
    .name = "pad",
    .n_in = 1,
    .n_out = 1,
    .infer = pad_infer,
    .rule = pad_rule,
    .forward = pad_forward,
    .backward = pad_backward,
    .cost = out_cost,
    .runs_on = view_runs_on,
    .grad_inputs = 1,
};

/* --- squeeze: drop size-1 dim i[0]; unsqueeze: new size-1 dim at i[0] (same memory) ------- */

static ms_status squeeze_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                               ms_error *err) {
    (void)n_in;
    int k = (int)a->i[0];
    if (!dim_ok(k, in[0].ndim) || in[0].d[k] != 1)
        return bad(err, "squeeze", in, 1, "dim i[0] must be a dim of size 1");
    out->ndim = 0;
    for (int d = 0; d < in[0].ndim; d++)
        if (d != k) out->d[out->ndim++] = in[0].d[d];
    return MS_OK;
}
static int squeeze_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) map[d] = d < a->i[0] ? d : d > a->i[0] ? d - 1 : -1;
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static ms_status unsqueeze_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                                 ms_error *err) {
    (void)n_in;
    int k = (int)a->i[0];
    if (k < 0 || k > in[0].ndim || in[0].ndim == MS_MAX_DIMS)
        return bad(err, "unsqueeze", in, 1, "dim i[0] must be in 0..rank (and rank < 8)");
    out->ndim = in[0].ndim + 1;
    for (int d = 0, s = 0; d < out->ndim; d++) out->d[d] = d == k ? 1 : in[0].d[s++];
    return MS_OK;
}
static int unsqueeze_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                          ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) map[d] = d < a->i[0] ? d : d + 1;
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static ms_status same_memory_forward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, copy, F(c->out[0]), F(c->in[0]), N(c->in[0]), e);
}
static ms_status same_memory_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, accumulate, F(c->din[0]), F(c->dout[0]), N(c->dout[0]), e);
}
const ms_op_def ms_op_squeeze_def = {
    .kind = MS_OP_SQUEEZE,
    .name = "squeeze",
    .n_in = 1,
    .n_out = 1,
    .infer = squeeze_infer,
    .rule = squeeze_rule,
    .forward = same_memory_forward,
    .backward = same_memory_backward,
    .cost = out_cost,
    .runs_on = copy_runs_on,
    .grad_inputs = 1,
};
const ms_op_def ms_op_unsqueeze_def = {
    .kind = MS_OP_UNSQUEEZE,
    .name = "unsqueeze",
    .n_in = 1,
    .n_out = 1,
    .infer = unsqueeze_infer,
    .rule = unsqueeze_rule,
    .forward = same_memory_forward,
    .backward = same_memory_backward,
    .cost = out_cost,
    .runs_on = copy_runs_on,
    .grad_inputs = 1,
};

/* --- stack: n inputs of one shape along a new dim i[0] (0..rank) ---------------------------- */

static ms_status stack_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    int k = (int)a->i[0];
    if (k < 0 || k > in[0].ndim || in[0].ndim == MS_MAX_DIMS)
        return bad(err, "stack", in, n_in, "dim i[0] must be in 0..rank (and rank < 8)");
    for (int j = 1; j < n_in; j++) {
        bool same = in[j].ndim == in[0].ndim;
        for (int d = 0; same && d < in[0].ndim; d++) same = in[j].d[d] == in[0].d[d];
        if (!same) return bad(err, "stack", in, n_in, "every input must have the same shape");
    }
    out->ndim = in[0].ndim + 1;
    for (int d = 0, s = 0; d < out->ndim; d++) out->d[d] = d == k ? n_in : in[0].d[s++];
    return MS_OK;
}
static int stack_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n;
    int map[MS_MAX_DIMS];
    for (int d = 0; d < in[0].ndim; d++) map[d] = d < a->i[0] ? d : d + 1;
    return survive_rule(in[0].ndim, map, n_in, 1, true, c);
}
/* Stacking is a concat of [O, 1, I] views. */
static void stack_dims(const ms_op_call *c, int64_t *o, int64_t *i) {
    const ms_tensor *x = c->in[0];
    *o = *i = 1;
    for (int d = 0; d < x->ndim; d++) *(d < c->attrs->i[0] ? o : i) *= x->shape[d];
}
/* Part p is rows [O] of I floats at column p * I of the [O, n * I] output. */
static ms_status stack_forward(ms_op_call *c, ms_error *e) {
    int64_t o, i, n = c->n_in;
    stack_dims(c, &o, &i);
    for (int p = 0; p < c->n_in; p++)
        MS_CHECK(MS_CALL_K(c->kc, block_copy, F(c->out[0]) + p * i, F(c->in[p]), o, i, n * i, i,
                           false, e));
    return MS_OK;
}
static ms_status stack_backward(ms_op_call *c, ms_error *e) {
    int64_t o, i, n = c->n_in;
    stack_dims(c, &o, &i);
    for (int p = 0; p < c->n_in; p++)
        if (c->din[p])
            MS_CHECK(MS_CALL_K(c->kc, block_copy, F(c->din[p]), F(c->dout[0]) + p * i, o, i, i,
                               n * i, true, e));
    return MS_OK;
}
const ms_op_def ms_op_stack_def = {
    .kind = MS_OP_STACK,
    .name = "stack",
    .n_in = -MS_OP_MAX_IN,
    .n_out = 1,
    .infer = stack_infer,
    .rule = stack_rule,
    .forward = stack_forward,
    .backward = stack_backward,
    .cost = out_cost,
    .runs_on = block_runs_on,
    .grad_inputs = 15,
};

/* --- tril / triu of the last two dims, diagonal offset i[0] ---------------------------------
 * The kernel uses global row and column numbers, so every dim may stay sharded, and the
 * mask is linear. */

static ms_status tri_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a, (void)n_in;
    if (in[0].ndim < 2) return bad(err, "tril/triu", in, 1, "needs at least 2 dims");
    return same_infer(in, out);
}
static int tri_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    keep_map(in[0].ndim, 0, map);
    return survive_rule(in[0].ndim, map, 1, 1, true, c);
}
static ms_status tri_run(ms_op_call *c, float *dst, const float *src, bool upper, bool acc,
                         ms_error *e) {
    const ms_tensor *x = c->in[0];
    int nd = x->ndim;
    int64_t rows = x->shape[nd - 2], cols = x->shape[nd - 1];
    int64_t batch = rows > 0 && cols > 0 ? N(x) / (rows * cols) : 0;
    if (!dst) return MS_OK; /* an unwanted gradient */
    return MS_CALL_K(c->kc, triangle, dst, src, batch, rows, cols, c->in_start[0][nd - 2],
                     c->in_start[0][nd - 1], c->attrs->i[0], upper, acc, e);
}
static ms_status tril_forward(ms_op_call *c, ms_error *e) {
    return tri_run(c, F(c->out[0]), F(c->in[0]), false, false, e);
}
static ms_status tril_backward(ms_op_call *c, ms_error *e) {
    return tri_run(c, F(c->din[0]), F(c->dout[0]), false, true, e);
}
static ms_status triu_forward(ms_op_call *c, ms_error *e) {
    return tri_run(c, F(c->out[0]), F(c->in[0]), true, false, e);
}
static ms_status triu_backward(ms_op_call *c, ms_error *e) {
    return tri_run(c, F(c->din[0]), F(c->dout[0]), true, true, e);
}
const ms_op_def ms_op_tril_def = {
    .kind = MS_OP_TRIL,
    .name = "tril",
    .n_in = 1,
    .n_out = 1,
    .infer = tri_infer,
    .rule = tri_rule,
    .forward = tril_forward,
    .backward = tril_backward,
    .cost = out_cost,
    .runs_on = triangle_runs_on,
    .grad_inputs = 1,
};
const ms_op_def ms_op_triu_def = {
    .kind = MS_OP_TRIU,
    .name = "triu",
    .n_in = 1,
    .n_out = 1,
    .infer = tri_infer,
    .rule = tri_rule,
    .forward = triu_forward,
    .backward = triu_backward,
    .cost = out_cost,
    .runs_on = triangle_runs_on,
    .grad_inputs = 1,
};

/* --- cumsum / cumprod along dim i[0] (the scanned dim stays whole) ------------------------ */

static ms_status scan_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)n_in;
    if (!dim_ok(a->i[0], in[0].ndim))
        return bad(err, "cumsum/cumprod", in, 1, "dim i[0] out of range");
    return same_infer(in, out);
}
static int cumprod_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    keep_map(in[0].ndim, 1u << a->i[0], map);
    return survive_rule(in[0].ndim, map, 1, 1, false, c);
}
static void scan_dims(const ms_op_call *c, int64_t *o, int64_t *d, int64_t *i) {
    ms_k_dim_split(c->in[0]->ndim, c->in[0]->shape, (int)c->attrs->i[0], o, d, i);
}
static ms_status scan_forward(ms_k_scan op, ms_op_call *c, ms_error *e) {
    int64_t o, d, i;
    scan_dims(c, &o, &d, &i);
    return MS_CALL_K(c->kc, scan_forward, op, F(c->out[0]), F(c->in[0]), o, d, i, e);
}
static ms_status scan_backward(ms_k_scan op, ms_op_call *c, ms_error *e) {
    int64_t o, d, i;
    scan_dims(c, &o, &d, &i);
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, scan_backward, op, F(c->din[0]), F(c->dout[0]), F(c->in[0]), o, d, i,
                     e);
}
static ms_status cumsum_forward(ms_op_call *c, ms_error *e) {
    return scan_forward(MS_K_SCAN_SUM, c, e);
}
static ms_status cumsum_backward(ms_op_call *c, ms_error *e) {
    return scan_backward(MS_K_SCAN_SUM, c, e);
}
static ms_status cumprod_forward(ms_op_call *c, ms_error *e) {
    return scan_forward(MS_K_SCAN_PROD, c, e);
}
static ms_status cumprod_backward(ms_op_call *c, ms_error *e) {
    return scan_backward(MS_K_SCAN_PROD, c, e);
}
const ms_op_def ms_op_cumsum_def = {
    .kind = MS_OP_CUMSUM,
    .name = "cumsum",
    .n_in = 1,
    .n_out = 1,
    .infer = scan_infer,
    .rule = along_dim_rule,
    .forward = cumsum_forward,
    .backward = cumsum_backward,
    .cost = out_cost,
    .runs_on = scan_runs_on,
    .grad_inputs = 1,
};
const ms_op_def ms_op_cumprod_def = {
    .kind = MS_OP_CUMPROD,
    .name = "cumprod",
    .n_in = 1,
    .n_out = 1,
    .infer = scan_infer,
    .rule = cumprod_rule,
    .forward = cumprod_forward,
    .backward = cumprod_backward,
    .cost = out_cost,
    .runs_on = scan_runs_on,
    .grad_inputs = 1,
};

/* --- index_select (x, ids [L]), gather (x, ids), scatter_add (x, ids, src) along dim i[0] --
 * ids are integer-valued floats and take no gradient. Rows of x split across ranks along the
 * dim: each rank reads (or adds to) only the rows it holds, so a gather gives a partial sum
 * and a scatter into a split x stays split. */

static ms_status index_select_infer(const ms_op_attrs *a, int n_in, const ms_shape *in,
                                    ms_shape *out, ms_error *err) {
    (void)n_in;
    if (!dim_ok(a->i[0], in[0].ndim) || in[1].ndim != 1)
        return bad(err, "index_select", in, 2, "needs x, ids [L] and dim i[0] of x");
    *out = in[0];
    out->d[a->i[0]] = in[1].d[0];
    return MS_OK;
}
static int index_select_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                             ms_rule_cand *c) {
    (void)n_in, (void)n;
    int j = 0, k = (int)a->i[0];
    cand2(&c[j++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < in[0].ndim; d++)
        cand2(&c[j++], ms_S(d), ms_R(), d == k ? ms_Psum() : ms_S(d));
    cand2(&c[j++], ms_R(), ms_S(0), ms_S(k));
    cand2(&c[j++], ms_Psum(), ms_R(), ms_Psum());
    return j;
}

/* Geometry of x (input 0, rows start d0 globally) against ids shaped like `like`. */
static ms_k_gather_dims gather_dims(const ms_op_call *c, const ms_tensor *like, bool per_row) {
    int k = (int)c->attrs->i[0];
    ms_k_gather_dims g = {.d0 = c->in_start[0][k], .ids_per_row = per_row};
    int64_t l;
    ms_k_dim_split(c->in[0]->ndim, c->in[0]->shape, k, &g.o, &g.d, &g.i);
    if (!per_row) ms_k_dim_split(like->ndim, like->shape, k, &g.o, &l, &g.i);
    g.l = per_row ? like->shape[0] : l;
    return g;
}
static ms_status index_select_forward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = gather_dims(c, c->in[1], true);
    return MS_CALL_K(c->kc, gather, F(c->out[0]), F(c->in[0]), F(c->in[1]), &g, false, e);
}
static ms_status index_select_backward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = gather_dims(c, c->in[1], true);
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, scatter_add, F(c->din[0]), F(c->dout[0]), F(c->in[1]), &g, e);
}
const ms_op_def ms_op_index_select_def = {
    .kind = MS_OP_INDEX_SELECT,
    .name = "index_select",
    .n_in = 2,
    .n_out = 1,
    .infer = index_select_infer,
    .rule = index_select_rule,
    .forward = index_select_forward,
    .backward = index_select_backward,
    .cost = out_cost,
    .runs_on = gather_runs_on,
    .grad_inputs = 1,
};

/* ids (and src) must match x outside the dim, so their shards line up with x's. */
static bool matches_outside(const ms_shape *x, const ms_shape *y, int k) {
    bool ok = x->ndim == y->ndim;
    for (int d = 0; ok && d < x->ndim; d++) ok = d == k || x->d[d] == y->d[d];
    return ok;
}
static ms_status gather_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    (void)n_in;
    if (!dim_ok(a->i[0], in[0].ndim) || !matches_outside(&in[0], &in[1], (int)a->i[0]))
        return bad(err, "gather", in, 2, "ids must have x's shape outside dim i[0]");
    *out = in[1];
    return MS_OK;
}
static int gather_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    int j = 0, k = (int)a->i[0];
    cand2(&c[j++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < in[0].ndim; d++)
        if (d != k) cand2(&c[j++], ms_S(d), ms_S(d), ms_S(d));
    cand2(&c[j++], ms_S(k), ms_R(), ms_Psum());
    cand2(&c[j++], ms_R(), ms_S(k), ms_S(k));
    cand2(&c[j++], ms_Psum(), ms_R(), ms_Psum());
    return j;
}
static ms_status gather_forward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = gather_dims(c, c->in[1], false);
    return MS_CALL_K(c->kc, gather, F(c->out[0]), F(c->in[0]), F(c->in[1]), &g, false, e);
}
static ms_status gather_backward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = gather_dims(c, c->in[1], false);
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, scatter_add, F(c->din[0]), F(c->dout[0]), F(c->in[1]), &g, e);
}
const ms_op_def ms_op_gather_def = {
    .kind = MS_OP_GATHER,
    .name = "gather",
    .n_in = 2,
    .n_out = 1,
    .infer = gather_infer,
    .rule = gather_rule,
    .forward = gather_forward,
    .backward = gather_backward,
    .cost = out_cost,
    .runs_on = gather_runs_on,
    .grad_inputs = 1,
};

/* --- batch_gather (x, ids [x's dims before i[0], L]): each leading index its own rows ---
 * out[b..., l, tail...] = x[b..., ids[b..., l], tail...]: the rows of each sequence at its own
 * positions (BERT's masked positions). The leading dims shard with ids, the tail dims with
 * x; rows split across ranks give a partial sum, as gather's. */

static ms_status batch_gather_infer(const ms_op_attrs *a, int n_in, const ms_shape *in,
                                    ms_shape *out, ms_error *err) {
    (void)n_in;
    int k = (int)a->i[0];
    bool ok = dim_ok(k, in[0].ndim) && in[1].ndim == k + 1;
    for (int d = 0; ok && d < k; d++) ok = in[0].d[d] == in[1].d[d];
    if (!ok) return bad(err, "batch_gather", in, 2, "ids must be x's dims before i[0], then L");
    *out = in[0];
    out->d[k] = in[1].d[k];
    return MS_OK;
}
static int batch_gather_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                             ms_rule_cand *c) {
    (void)n_in, (void)n;
    int j = 0, k = (int)a->i[0];
    cand2(&c[j++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < in[0].ndim; d++)
        if (d != k) cand2(&c[j++], ms_S(d), d < k ? ms_S(d) : ms_R(), ms_S(d));
    cand2(&c[j++], ms_S(k), ms_R(), ms_Psum());
    cand2(&c[j++], ms_R(), ms_S(k), ms_S(k));
    cand2(&c[j++], ms_Psum(), ms_R(), ms_Psum());
    return j;
}
static ms_k_gather_dims batch_gather_dims(const ms_op_call *c) {
    int k = (int)c->attrs->i[0];
    ms_k_gather_dims g = {.d0 = c->in_start[0][k], .ids_per_outer = true};
    ms_k_dim_split(c->in[0]->ndim, c->in[0]->shape, k, &g.o, &g.d, &g.i);
    g.l = c->in[1]->shape[k];
    return g;
}
static ms_status batch_gather_forward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = batch_gather_dims(c);
    return MS_CALL_K(c->kc, gather, F(c->out[0]), F(c->in[0]), F(c->in[1]), &g, false, e);
}
static ms_status batch_gather_backward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = batch_gather_dims(c);
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, scatter_add, F(c->din[0]), F(c->dout[0]), F(c->in[1]), &g, e);
}
const ms_op_def ms_op_batch_gather_def = {
    .kind = MS_OP_BATCH_GATHER,
    .name = "batch_gather",
    .n_in = 2,
    .n_out = 1,
    .infer = batch_gather_infer,
    .rule = batch_gather_rule,
    .forward = batch_gather_forward,
    .backward = batch_gather_backward,
    .cost = out_cost,
    .runs_on = gather_runs_on,
    .grad_inputs = 1,
};

static ms_status scatter_add_infer(const ms_op_attrs *a, int n_in, const ms_shape *in,
                                   ms_shape *out, ms_error *err) {
    (void)n_in;
    int k = (int)a->i[0];
    bool same = in[1].ndim == in[2].ndim;
    for (int d = 0; same && d < in[1].ndim; d++) same = in[1].d[d] == in[2].d[d];
    if (!dim_ok(k, in[0].ndim) || !same || !matches_outside(&in[0], &in[1], k))
        return bad(err, "scatter_add", in, 3,
                   "ids and src must share a shape that is x's outside dim i[0]");
    *out = in[0];
    return MS_OK;
}
/* out = x + scatter(src) is linear in (x, src) together: partial x and src add up. */
static int scatter_add_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                            ms_rule_cand *c) {
    (void)n_in, (void)n;
    int j = 0, k = (int)a->i[0];
    ms_placement R = ms_R(), P = ms_Psum();
    c[j++] = (ms_rule_cand){.in = {R, R, R}, .out = {R}};
    for (int d = 0; d < in[0].ndim; d++)
        if (d != k) c[j++] = (ms_rule_cand){.in = {ms_S(d), ms_S(d), ms_S(d)}, .out = {ms_S(d)}};
    c[j++] = (ms_rule_cand){.in = {ms_S(k), R, R}, .out = {ms_S(k)}};
    c[j++] = (ms_rule_cand){.in = {P, ms_S(k), ms_S(k)}, .out = {P}};
    c[j++] = (ms_rule_cand){.in = {P, R, P}, .out = {P}};
    return j;
}
static ms_status scatter_add_forward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = gather_dims(c, c->in[1], false);
    MS_CHECK(MS_CALL_K(c->kc, copy, F(c->out[0]), F(c->in[0]), N(c->in[0]), e));
    return MS_CALL_K(c->kc, scatter_add, F(c->out[0]), F(c->in[2]), F(c->in[1]), &g, e);
}
static ms_status scatter_add_backward(ms_op_call *c, ms_error *e) {
    ms_k_gather_dims g = gather_dims(c, c->in[1], false);
    if (c->din[0])
        MS_CHECK(MS_CALL_K(c->kc, accumulate, F(c->din[0]), F(c->dout[0]), N(c->dout[0]), e));
    if (!c->din[2]) return MS_OK;
    return MS_CALL_K(c->kc, gather, F(c->din[2]), F(c->dout[0]), F(c->in[1]), &g, true, e);
}
const ms_op_def ms_op_scatter_add_def = {
    .kind = MS_OP_SCATTER_ADD,
    .name = "scatter_add",
    .n_in = 3,
    .n_out = 1,
    .infer = scatter_add_infer,
    .rule = scatter_add_rule,
    .forward = scatter_add_forward,
    .backward = scatter_add_backward,
    .cost = out_cost,
    .runs_on = scatter_runs_on,
    .grad_inputs = 5,
};

/* --- masked_fill (x, mask of 0/1, same shape): mask ? f[0] : x ---------------------------- */

static ms_status masked_fill_infer(const ms_op_attrs *a, int n_in, const ms_shape *in,
                                   ms_shape *out, ms_error *err) {
    (void)a, (void)n_in;
    if (!matches_outside(&in[0], &in[1], -1))
        return bad(err, "masked_fill", in, 2, "the mask must have x's shape");
    return same_infer(in, out);
}
/* Partial x stays partial only when the fill is 0 (ranks would each add it otherwise). */
static int masked_fill_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                            ms_rule_cand *c) {
    (void)n_in, (void)n;
    int j = 0;
    cand2(&c[j++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < in[0].ndim; d++) cand2(&c[j++], ms_S(d), ms_S(d), ms_S(d));
    if (a->f[0] == 0.0f) cand2(&c[j++], ms_Psum(), ms_R(), ms_Psum());
    return j;
}
static ms_status masked_fill_forward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, masked_fill_forward, F(c->out[0]), F(c->in[0]), F(c->in[1]),
                     c->attrs->f[0], N(c->in[0]), e);
}
static ms_status masked_fill_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, masked_fill_backward, F(c->din[0]), F(c->dout[0]), F(c->in[1]),
                     N(c->in[0]), e);
}
static ms_k_cost masked_fill_cost(const ms_op_call *c, bool bw) {
    return ms_k_index_cost(N(c->out[0]), 1, bw);
}
const ms_op_def ms_op_masked_fill_def = {
    .kind = MS_OP_MASKED_FILL,
    .name = "masked_fill",
    .n_in = 2,
    .n_out = 1,
    .infer = masked_fill_infer,
    .rule = masked_fill_rule,
    .forward = masked_fill_forward,
    .backward = masked_fill_backward,
    .cost = masked_fill_cost,
    .runs_on = masked_fill_runs_on,
    .grad_inputs = 1,
};

/* --- one_hot: ids [...] -> [..., i[0]]; the kernel takes the first class of its block ------ */

static ms_status one_hot_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                               ms_error *err) {
    (void)n_in;
    if (a->i[0] < 1 || in[0].ndim == MS_MAX_DIMS)
        return bad(err, "one_hot", in, 1, "i[0] (the number of classes) must be >= 1");
    *out = in[0];
    out->d[out->ndim++] = a->i[0];
    return MS_OK;
}
static int one_hot_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    keep_map(in[0].ndim, 0, map);
    return survive_rule(in[0].ndim, map, 1, 1, false, c);
}
static ms_status one_hot_forward(ms_op_call *c, ms_error *e) {
    int cd = c->out[0]->ndim - 1;
    return MS_CALL_K(c->kc, one_hot, F(c->out[0]), F(c->in[0]), N(c->in[0]), c->out[0]->shape[cd],
                     c->out_start[0][cd], e);
}
static ms_status no_gradient(ms_op_call *c, ms_error *e) {
    (void)c, (void)e;
    return MS_OK;
}
const ms_op_def ms_op_one_hot_def = {
    .kind = MS_OP_ONE_HOT,
    .name = "one_hot",
    .n_in = 1,
    .n_out = 1,
    .infer = one_hot_infer,
    .rule = one_hot_rule,
    .forward = one_hot_forward,
    .backward = no_gradient,
    .cost = out_cost,
    .runs_on = one_hot_runs_on,
    .grad_inputs = 0,
};

/* --- topk (k = i[0], largest) and sort (i[0] descending) along the last dim ----------------
 * Outputs values and indices (integer-valued floats); ties go to the lower index. The
 * gradient flows to the chosen values. Rows may be split, the sorted dim may not. */

static ms_status topk_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)n_in;
    if (in[0].ndim < 1 || a->i[0] < 1 || a->i[0] > in[0].d[in[0].ndim - 1])
        return bad(err, "topk", in, 1, "k = i[0] must be in 1..(last dim)");
    out[0] = out[1] = in[0];
    out[0].d[in[0].ndim - 1] = out[1].d[in[0].ndim - 1] = a->i[0];
    return MS_OK;
}
static ms_status sort_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)n_in;
    if (in[0].ndim < 1 || (a->i[0] != 0 && a->i[0] != 1))
        return bad(err, "sort", in, 1, "needs rank >= 1 and i[0] descending 0 or 1");
    out[0] = out[1] = in[0];
    return MS_OK;
}
static int rows_sort_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                          ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int map[MS_MAX_DIMS];
    keep_map(in[0].ndim, 1u << (in[0].ndim - 1), map);
    return survive_rule(in[0].ndim, map, 1, 2, false, c);
}
static void sort_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    sizes[0] = N(c->out[1]); /* the chosen indices, for backward */
}
static ms_status sort_run(ms_op_call *c, bool descending, ms_error *e) {
    int64_t cols = last_dim(c->in[0]), k = last_dim(c->out[0]);
    int64_t rows = cols ? N(c->in[0]) / cols : 0;
    MS_CHECK(MS_CALL_K(c->kc, sort_rows, F(c->out[0]), F(c->out[1]), F(c->in[0]), rows, cols, k,
                       descending, e));
    if (!N(c->out[1])) return MS_OK;
    return MS_CALL_K(c->kc, copy, F(c->saved[0]), F(c->out[1]), N(c->out[1]), e);
}
static ms_status topk_forward(ms_op_call *c, ms_error *e) {
    return sort_run(c, true, e);
}
static ms_status sort_forward(ms_op_call *c, ms_error *e) {
    return sort_run(c, c->attrs->i[0] == 1, e);
}
static ms_status sort_backward(ms_op_call *c, ms_error *e) {
    int64_t cols = last_dim(c->in[0]), k = last_dim(c->dout[0]);
    int64_t rows = cols ? N(c->in[0]) / cols : 0;
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, sort_rows_backward, F(c->din[0]), F(c->dout[0]), F(c->saved[0]), rows,
                     cols, k, e);
}
static ms_k_cost sort_cost(const ms_op_call *c, bool bw) {
    ms_k_cost k = ms_k_index_cost(N(c->in[0]), 1, bw);
    if (!bw) k.flops = (double)N(c->in[0]) * log2((double)last_dim(c->in[0]) + 1);
    return k;
}
const ms_op_def ms_op_topk_def = {
    .kind = MS_OP_TOPK,
    .name = "topk",
    .n_in = 1,
    .n_out = 2,
    .infer = topk_infer,
    .rule = rows_sort_rule,
    .saved_floats = sort_saved,
    .forward = topk_forward,
    .backward = sort_backward,
    .cost = sort_cost,
    .runs_on = sort_runs_on,
    .grad_inputs = 1,
    .int_outputs = 2,
};
const ms_op_def ms_op_sort_def = {
    .kind = MS_OP_SORT,
    .name = "sort",
    .n_in = 1,
    .n_out = 2,
    .infer = sort_infer,
    .rule = rows_sort_rule,
    .saved_floats = sort_saved,
    .forward = sort_forward,
    .backward = sort_backward,
    .cost = sort_cost,
    .runs_on = sort_runs_on,
    .grad_inputs = 1,
    .int_outputs = 2,
};

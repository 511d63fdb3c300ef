/* ops_layers.c - neural-network layers for LLaMA-style models: RMSNorm, LayerNorm without
 * affine, log-softmax, masked softmax, SwiGLU, rotary embedding, grouped-query and padded
 * attention, linear, broadcasting bmm, and the losses (NLL, MSE, L1, Huber, label-smoothed
 * cross-entropy, cosine similarity). Kernels live in engine/kernels/layers.c; the LLaMA ops
 * (RMSNorm, SwiGLU, rotary, grouped-query attention, linear) and padded attention call them
 * through the rank's kernel table (call->kc), so they run on every device that fills those
 * slots; the others call the CPU kernels directly and run on the CPU device only.
 *
 * Rules only declare what is exact: row-wise ops shard rows, never the dim they normalise;
 * ops linear in an input (rotary, NLL, linear, bmm) pass partial sums through; losses that
 * average over every element give a partial sum of terms divided by the GLOBAL count.
 */
#include <stdio.h>

#include "engine/kernels/layers.h"
#include "engine/ops/op_defs.h"

static ms_status bad_shapes(ms_error *err, const char *op, const char *want, int n,
                            const ms_shape *in) {
    char buf[240];
    return ms_fail(err, MS_ERR_INVALID, "%s: %s; got %s", op, want,
                   ms_op_shapes_str(n, in, buf, sizeof buf));
}

static bool same_shape(const ms_shape *a, const ms_shape *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->d[d] != b->d[d]) return false;
    return true;
}

/* R..R -> R, then for d < ndim: S(d) on the inputs in `sharded` (bit i), R on the others ->
 * S(d) (S(d) -> P(sum) when reduce_all: a loss over every element). */
static int row_cands(int ndim, int n_in, unsigned sharded, bool reduce_all, ms_rule_cand *c) {
    int k = 0;
    for (int d = -1; d < ndim; d++, k++) {
        for (int i = 0; i < n_in; i++) c[k].in[i] = d >= 0 && (sharded >> i & 1) ? ms_S(d) : ms_R();
        c[k].out[0] = d < 0 ? ms_R() : reduce_all ? ms_Psum() : ms_S(d);
    }
    return k;
}

static int64_t rows_of(const ms_tensor *t) {
    int64_t c = last_dim(t);
    return c ? N(t) / c : 0;
}

static void saved_rows(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    sizes[0] = rows_of(c->in[0]);
}

/* --- RMSNorm: x [..., C], weight [C]; f[0] eps ------------------------------------------------ */

static ms_status rmsnorm_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                               ms_error *err) {
    (void)a, (void)n_in;
    if (in[0].ndim < 1 || in[1].ndim != 1 || in[1].d[0] != in[0].d[in[0].ndim - 1])
        return bad_shapes(err, "rmsnorm", "weight must be [C] with C the last input dim", 2, in);
    out[0] = in[0];
    return MS_OK;
}
static int rmsnorm_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)a, (void)n;
    return row_cands(in[0].ndim - 1, n_in, 1, false, c);
}
static ms_status rmsnorm_forward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, rmsnorm_forward, F(c->out[0]), F(c->saved[0]), F(c->in[0]), F(c->in[1]),
                     rows_of(c->in[0]), last_dim(c->in[0]), c->attrs->f[0], e);
}
static ms_status rmsnorm_backward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, rmsnorm_backward, F(c->din[0]), F(c->din[1]), F(c->dout[0]),
                     F(c->in[0]), F(c->in[1]), F(c->saved[0]), rows_of(c->in[0]),
                     last_dim(c->in[0]), e);
}
static bool rmsnorm_runs_on(const ms_kernels *k) {
    return k->rmsnorm_forward && k->rmsnorm_backward;
}
static ms_k_cost rmsnorm_cost(const ms_op_call *c, bool bw) {
    return ms_k_rmsnorm_cost(rows_of(c->in[0]), last_dim(c->in[0]), bw);
}
const ms_op_def ms_op_rmsnorm_def = {
    .kind = MS_OP_RMSNORM,
    .name = "rmsnorm",
    .n_in = 2,
    .n_out = 1,
    .infer = rmsnorm_infer,
    .rule = rmsnorm_rule,
    .saved_floats = saved_rows,
    .forward = rmsnorm_forward,
    .backward = rmsnorm_backward,
    .cost = rmsnorm_cost,
    .runs_on = rmsnorm_runs_on,
    .grad_inputs = 3,
};

/* --- row-wise ops over the last dim: layernorm_plain, log_softmax ------------------------------
 */

static ms_status same_shapes_infer(const char *op, int n_in, const ms_shape *in, ms_shape *out,
                                   ms_error *err) {
    if (in[0].ndim < 1) return bad_shapes(err, op, "the input needs a last dim", 1, in);
    for (int i = 1; i < n_in; i++)
        if (!same_shape(&in[i], &in[0]))
            return bad_shapes(err, op, "inputs must have the same shape", n_in, in);
    out[0] = in[0];
    return MS_OK;
}
/* infer of an op whose output has its inputs' (equal) shapes. */
#define SAME_SHAPES_INFER(fn, NAME)                                                                \
    static ms_status fn(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,         \
                        ms_error *err) {                                                           \
        (void)a;                                                                                   \
        return same_shapes_infer(NAME, n_in, in, out, err);                                        \
    }
SAME_SHAPES_INFER(norm_plain_infer, "layernorm_plain")
SAME_SHAPES_INFER(log_softmax_infer, "log_softmax")
SAME_SHAPES_INFER(swiglu_infer, "swiglu")

static int rowwise_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)a, (void)n;
    return row_cands(in[0].ndim - 1, n_in, (1u << n_in) - 1, false, c);
}
static ms_k_cost rowwise_cost(const ms_op_call *c, bool bw) {
    return ms_k_rowwise_cost(rows_of(c->in[0]), last_dim(c->in[0]), bw ? 5 : 4, bw ? 4 : 2);
}

/* The per-row ops share one kernel slot pair: x = input 0, y = input 1 (a mask or cosine's
 * b), aux = saved 0 (the plain norm's rstd). Backwards read the forward output. */
static ms_status rows_fwd(ms_op_call *c, ms_k_row_op op, ms_error *e) {
    const float *y = c->n_in > 1 ? F(c->in[1]) : NULL;
    float *aux = c->saved[0] ? F(c->saved[0]) : NULL;
    return MS_CALL_K(c->kc, rows_forward, op, F(c->out[0]), aux, F(c->in[0]), y, rows_of(c->in[0]),
                     last_dim(c->in[0]), c->attrs->f[0], e);
}
static ms_status rows_bwd(ms_op_call *c, ms_k_row_op op, ms_error *e) {
    const float *y = c->n_in > 1 ? F(c->in[1]) : NULL;
    float *dy = c->n_in > 1 ? F(c->din[1]) : NULL;
    const float *aux = c->saved[0] ? F(c->saved[0]) : NULL;
    if (op == MS_K_ROW_MASKED_SOFTMAX) dy = NULL; /* the mask takes no gradient */
    return MS_CALL_K(c->kc, rows_backward, op, F(c->din[0]), dy, F(c->dout[0]), F(c->in[0]), y,
                     F(c->out[0]), aux, rows_of(c->in[0]), last_dim(c->in[0]), c->attrs->f[0], e);
}
static bool rows_runs_on(const ms_kernels *k) {
    return k->rows_forward && k->rows_backward;
}

static ms_status norm_plain_forward(ms_op_call *c, ms_error *e) {
    return rows_fwd(c, MS_K_ROW_NORM_PLAIN, e);
}
static ms_status norm_plain_backward(ms_op_call *c, ms_error *e) {
    return rows_bwd(c, MS_K_ROW_NORM_PLAIN, e);
}
const ms_op_def ms_op_layernorm_plain_def = {
    .kind = MS_OP_LAYERNORM_PLAIN,
    .name = "layernorm_plain",
    .n_in = 1,
    .n_out = 1,
    .infer = norm_plain_infer,
    .rule = rowwise_rule,
    .saved_floats = saved_rows,
    .forward = norm_plain_forward,
    .backward = norm_plain_backward,
    .cost = rowwise_cost,
    .runs_on = rows_runs_on,
    .grad_inputs = 1,
};

static ms_status log_softmax_forward(ms_op_call *c, ms_error *e) {
    return rows_fwd(c, MS_K_ROW_LOG_SOFTMAX, e);
}
static ms_status log_softmax_backward(ms_op_call *c, ms_error *e) {
    return rows_bwd(c, MS_K_ROW_LOG_SOFTMAX, e);
}
const ms_op_def ms_op_log_softmax_def = {
    .kind = MS_OP_LOG_SOFTMAX,
    .name = "log_softmax",
    .n_in = 1,
    .n_out = 1,
    .infer = log_softmax_infer,
    .rule = rowwise_rule,
    .forward = log_softmax_forward,
    .backward = log_softmax_backward,
    .cost = rowwise_cost,
    .runs_on = rows_runs_on,
    .grad_inputs = 1,
};

/* --- masked softmax: x [..., C], mask [..., C] (0 drops); f[0] temperature ----------------------
 */

static ms_status masked_softmax_infer(const ms_op_attrs *a, int n_in, const ms_shape *in,
                                      ms_shape *out, ms_error *err) {
    if (!(a->f[0] > 0.0f))
        return ms_fail(err, MS_ERR_INVALID,
                       "masked_softmax: temperature f[0] = %g must be > 0 (1 for a plain softmax)",
                       (double)a->f[0]);
    return same_shapes_infer("masked_softmax", n_in, in, out, err);
}
static ms_status masked_softmax_forward(ms_op_call *c, ms_error *e) {
    return rows_fwd(c, MS_K_ROW_MASKED_SOFTMAX, e);
}
static ms_status masked_softmax_backward(ms_op_call *c, ms_error *e) {
    return rows_bwd(c, MS_K_ROW_MASKED_SOFTMAX, e);
}
const ms_op_def ms_op_masked_softmax_def = {
    .kind = MS_OP_MASKED_SOFTMAX,
    .name = "masked_softmax",
    .n_in = 2,
    .n_out = 1,
    .infer = masked_softmax_infer,
    .rule = rowwise_rule,
    .forward = masked_softmax_forward,
    .backward = masked_softmax_backward,
    .cost = rowwise_cost,
    .runs_on = rows_runs_on,
    .grad_inputs = 1,
};

/* --- SwiGLU: gate, up (same shapes) -> silu(gate) * up ---------------------------------------- */

static int swiglu_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    return row_cands(in[0].ndim, n_in, 3, false, c);
}
static ms_status swiglu_forward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, swiglu_forward, F(c->out[0]), F(c->in[0]), F(c->in[1]), N(c->in[0]), e);
}
static ms_status swiglu_backward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, swiglu_backward, F(c->din[0]), F(c->din[1]), F(c->dout[0]), F(c->in[0]),
                     F(c->in[1]), N(c->in[0]), e);
}
static bool swiglu_runs_on(const ms_kernels *k) {
    return k->swiglu_forward && k->swiglu_backward;
}
static ms_k_cost swiglu_cost(const ms_op_call *c, bool bw) {
    /* exp, add, divide, two multiplies; backward about twice that, 5 tensors */
    return ms_k_rowwise_cost(1, N(c->in[0]), bw ? 10 : 5, bw ? 7 : 3);
}
const ms_op_def ms_op_swiglu_def = {
    .kind = MS_OP_SWIGLU,
    .name = "swiglu",
    .n_in = 2,
    .n_out = 1,
    .infer = swiglu_infer,
    .rule = swiglu_rule,
    .forward = swiglu_forward,
    .backward = swiglu_backward,
    .cost = swiglu_cost,
    .runs_on = swiglu_runs_on,
    .grad_inputs = 3,
};

/* --- rotary: x [B, T, ..., D]; f[0] theta; positions are global indices along T ---------------
 * Linear in x, so partial sums pass through; any dim but D shards (a T shard rotates by its
 * global positions, from the box start). */

static ms_status rotary_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    (void)n_in;
    if (in[0].ndim < 3 || in[0].d[in[0].ndim - 1] % 2)
        return bad_shapes(err, "rotary", "x must be [B, T, ..., D] with D even", 1, in);
    if (!(a->f[0] > 1.0f))
        return ms_fail(err, MS_ERR_INVALID, "rotary: theta f[0] = %g must be > 1 (LLaMA: 10000)",
                       (double)a->f[0]);
    out[0] = in[0];
    return MS_OK;
}
static int rotary_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    int k = row_cands(in[0].ndim - 1, n_in, 1, false, c);
    cand1(&c[k++], ms_Psum(), ms_Psum());
    return k;
}
static void rotary_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    sizes[0] = sizes[1] = c->in[0]->shape[1] * (last_dim(c->in[0]) / 2);
}
static void rotary_dims(const ms_tensor *x, int64_t *b, int64_t *t, int64_t *h, int64_t *d) {
    *b = x->shape[0], *t = x->shape[1], *d = last_dim(x);
    int64_t btd = *b * *t * *d;
    *h = btd > 0 ? N(x) / btd : 0;
}
static ms_status rotary_forward(ms_op_call *c, ms_error *e) {
    int64_t b, t, h, d;
    rotary_dims(c->in[0], &b, &t, &h, &d);
    MS_CHECK(MS_CALL_K(c->kc, rotary_tables, F(c->saved[0]), F(c->saved[1]), t, c->in_start[0][1],
                       d, c->attrs->f[0], e));
    return MS_CALL_K(c->kc, rotary_apply, F(c->out[0]), F(c->in[0]), F(c->saved[0]), F(c->saved[1]),
                     b, t, h, d, false, e);
}
static ms_status rotary_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    int64_t b, t, h, d;
    rotary_dims(c->in[0], &b, &t, &h, &d);
    return MS_CALL_K(c->kc, rotary_apply, F(c->din[0]), F(c->dout[0]), F(c->saved[0]),
                     F(c->saved[1]), b, t, h, d, true, e);
}
static bool rotary_runs_on(const ms_kernels *k) {
    return k->rotary_tables && k->rotary_apply;
}
static ms_k_cost rotary_cost(const ms_op_call *c, bool bw) {
    /* 6 flops per pair (3 per element); tables are per position, not counted */
    return ms_k_rowwise_cost(1, N(c->in[0]), 3, bw ? 3 : 2);
}
const ms_op_def ms_op_rotary_def = {
    .kind = MS_OP_ROTARY,
    .name = "rotary",
    .n_in = 1,
    .n_out = 1,
    .infer = rotary_infer,
    .rule = rotary_rule,
    .saved_floats = rotary_saved,
    .forward = rotary_forward,
    .backward = rotary_backward,
    .cost = rotary_cost,
    .runs_on = rotary_runs_on,
    .grad_inputs = 1,
};

/* --- grouped-query attention: q [B, T, H, D] with k, v [B, T, Hkv, D] (3 inputs) or packed
 * kv [B, T, 2, Hkv, D] (2 inputs: one projection, as GPT-2's fused qkv) -> [B, T, H, D] ----
 * i[0] causal. Heads shard when H and Hkv both divide by the mesh dim (query head h then
 * stays with its kv head h / (H / Hkv)), or the query heads alone with every kv head on every
 * rank (kv heads that do not divide tensor parallelism: each rank reads the kv heads of its
 * own query heads, found from the box start, and the kv gradient is a partial sum); queries
 * shard along T with the keys whole (exact: causal positions come from the box start). */

static ms_status gqa_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a;
    const ms_shape *q = &in[0], *k = &in[1];
    bool packed = n_in == 2, ok = n_in >= 2 && q->ndim == 4;
    int hd = packed ? 3 : 2; /* the kv head dim of k (or kv) */
    if (ok && packed) ok = k->ndim == 5 && k->d[2] == 2;
    if (ok && !packed) ok = k->ndim == 4 && same_shape(k, &in[2]);
    ok = ok && k->d[0] == q->d[0] && k->d[1] == q->d[1] && k->d[hd + 1] == q->d[3] &&
         k->d[hd] >= 1 && q->d[2] % k->d[hd] == 0;
    if (!ok)
        return bad_shapes(err, "gqa_attention",
                          "q must be [B, T, H, D] with k and v [B, T, Hkv, D] (or kv "
                          "[B, T, 2, Hkv, D]), H a multiple of Hkv",
                          n_in, in);
    out[0] = *q;
    return MS_OK;
}
static void gqa_cand(ms_rule_cand *c, int n_in, ms_placement q, ms_placement kv, ms_placement out) {
    c->in[0] = q, c->in[1] = kv, c->out[0] = out;
    if (n_in == 3) c->in[2] = kv;
}
static int gqa_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a;
    int k = 0, hd = n_in == 2 ? 3 : 2;
    gqa_cand(&c[k++], n_in, ms_R(), ms_R(), ms_R());
    gqa_cand(&c[k++], n_in, ms_S(0), ms_S(0), ms_S(0));
    gqa_cand(&c[k++], n_in, ms_S(1), ms_R(), ms_S(1));
    if (in[0].d[2] % n == 0 && in[1].d[hd] % n == 0)
        gqa_cand(&c[k++], n_in, ms_S(2), ms_S(hd), ms_S(2));
    if (in[0].d[2] % n == 0) gqa_cand(&c[k++], n_in, ms_S(2), ms_R(), ms_S(2));
    return k;
}
static bool gqa_valid(const ms_op_attrs *a, int n_in, const ms_shape *in, const ms_placements *pl,
                      const int *mesh_shape) {
    (void)a;
    int hd = n_in == 2 ? 3 : 2;
    int64_t w = ms_op_shard_ways(&pl[0], 2, mesh_shape),
            wkv = ms_op_shard_ways(&pl[1], hd, mesh_shape);
    /* kv heads split as the query heads, or not at all */
    return in[0].d[2] % w == 0 && (wkv == 1 || (wkv == w && in[1].d[hd] % w == 0));
}
static ms_k_gqa gqa_shape(const ms_op_call *c) {
    const ms_tensor *q = c->in[0], *k = c->in[1];
    bool packed = c->n_in == 2;
    int64_t hkv = k->shape[packed ? 3 : 2], d = q->shape[3];
    return (ms_k_gqa){.b = q->shape[0],
                      .tq = q->shape[1],
                      .tk = k->shape[1],
                      .h = q->shape[2],
                      .hkv = hkv ? hkv : 1,
                      .d = d,
                      .q_stride = q->shape[2] * d,
                      .kv_stride = (packed ? 2 : 1) * hkv * d,
                      .out_stride = q->shape[2] * d,
                      .q_start = c->in_start[0][1],
                      .causal = c->attrs->i[0] != 0};
}
/* Where k and v (or their gradients, from t[1] and t[2]) start. */
static void gqa_kv(const ms_op_call *c, const ms_k_gqa *g, ms_tensor *const *t, float **k,
                   float **v) {
    *k = F(t[1]);
    *v = c->n_in == 3 ? F(t[2]) : *k ? *k + g->hkv * g->d : NULL;
}
/* The query heads split while every kv head is local: head h of the shard reads kv head
 * (h0 + h) / group, h0 the shard's first query head. */
static bool gqa_kv_whole(const ms_op_call *c) {
    int hd = c->n_in == 2 ? 3 : 2;
    return c->in[0]->shape[2] != c->gin[0].d[2] && c->in[1]->shape[hd] == c->gin[1].d[hd];
}
/* One query head of the call's shape (the per-head path of gqa_kv_whole). */
static ms_k_gqa gqa_one_head(const ms_op_call *c) {
    ms_k_gqa one = gqa_shape(c);
    one.h = one.hkv = 1;
    return one;
}
/* saved[0]: what the backend's forward saves (per query head on the per-head path);
 * saved[1]: the backward's scratch. */
static void gqa_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    const ms_kernels *k = c->kc->k;
    ms_k_gqa g = gqa_shape(c), one = gqa_one_head(c);
    sizes[0] = gqa_kv_whole(c) ? g.h * k->gqa_saved_floats(&one) : k->gqa_saved_floats(&g);
    sizes[1] = k->gqa_scratch_floats(&g);
}
/* One query head at a time against its kv head (the kernel pairs heads by local index, which
 * the shard's offset breaks); what each head saves follows the previous head's. */
static ms_status gqa_per_head(ms_op_call *c, bool backward, ms_error *e) {
    ms_k_gqa g = gqa_shape(c), one = gqa_one_head(c);
    int64_t group = c->gin[0].d[2] / g.hkv, h0 = c->in_start[0][2], d = g.d;
    int64_t per_head = c->kc->k->gqa_saved_floats(&one);
    float *k, *v, *dk = NULL, *dv = NULL, *dq = F(c->din[0]);
    gqa_kv(c, &g, c->in, &k, &v);
    if (backward) gqa_kv(c, &g, c->din, &dk, &dv);
    for (int64_t h = 0; h < g.h; h++) {
        int64_t qo = h * d, kvo = ((h0 + h) / group) * d;
        float *saved = F(c->saved[0]) + h * per_head;
        if (!backward) {
            MS_CHECK(MS_CALL_K(c->kc, gqa_forward, &one, F(c->out[0]) + qo, saved, F(c->in[0]) + qo,
                               k + kvo, v + kvo, NULL, e));
            continue;
        }
        MS_CHECK(MS_CALL_K(c->kc, gqa_backward, &one, dq ? dq + qo : NULL, dk ? dk + kvo : NULL,
                           dv ? dv + kvo : NULL, F(c->saved[1]), F(c->dout[0]) + qo,
                           F(c->in[0]) + qo, k + kvo, v + kvo, saved, NULL, e));
    }
    return MS_OK;
}
static ms_status gqa_forward(ms_op_call *c, ms_error *e) {
    if (gqa_kv_whole(c)) return gqa_per_head(c, false, e);
    ms_k_gqa g = gqa_shape(c);
    float *k, *v;
    gqa_kv(c, &g, c->in, &k, &v);
    return MS_CALL_K(c->kc, gqa_forward, &g, F(c->out[0]), F(c->saved[0]), F(c->in[0]), k, v, NULL,
                     e);
}
static ms_status gqa_backward(ms_op_call *c, ms_error *e) {
    if (gqa_kv_whole(c)) return gqa_per_head(c, true, e);
    ms_k_gqa g = gqa_shape(c);
    float *k, *v, *dk, *dv;
    gqa_kv(c, &g, c->in, &k, &v);
    gqa_kv(c, &g, c->din, &dk, &dv);
    return MS_CALL_K(c->kc, gqa_backward, &g, F(c->din[0]), dk, dv, F(c->saved[1]), F(c->dout[0]),
                     F(c->in[0]), k, v, F(c->saved[0]), NULL, e);
}
static bool gqa_runs_on(const ms_kernels *k) {
    return k->gqa_saved_floats && k->gqa_scratch_floats && k->gqa_forward && k->gqa_backward;
}
static ms_k_cost gqa_cost(const ms_op_call *c, bool bw) {
    ms_k_gqa g = gqa_shape(c);
    return ms_k_gqa_cost(&g, bw);
}
const ms_op_def ms_op_gqa_attention_def = {
    .kind = MS_OP_GQA_ATTENTION,
    .name = "gqa_attention",
    .n_in = -3,
    .n_out = 1,
    .infer = gqa_infer,
    .rule = gqa_rule,
    .valid = gqa_valid,
    .saved_floats = gqa_saved,
    .forward = gqa_forward,
    .backward = gqa_backward,
    .cost = gqa_cost,
    .runs_on = gqa_runs_on,
    .grad_inputs = 7,
};

/* --- padded attention: qkv [B, T, 3, C], mask [B, T] (0 = padding key) -> [B, T, C] ----------
 * i[0] heads, i[1] causal; the layout of the built-in attention. The mask takes no gradient;
 * a query with no visible key outputs zeros. */

static ms_status pattn_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    const ms_shape *q = &in[0], *m = &in[1];
    if (q->ndim != 4 || q->d[2] != 3 || m->ndim != 2 || m->d[0] != q->d[0] || m->d[1] != q->d[1])
        return bad_shapes(err, "padded_attention", "qkv must be [B, T, 3, C] and mask [B, T]", n_in,
                          in);
    if (a->i[0] <= 0 || q->d[3] % a->i[0])
        return ms_fail(err, MS_ERR_INVALID,
                       "padded_attention: C = %lld is not divisible by %lld heads (i[0])",
                       (long long)q->d[3], (long long)a->i[0]);
    out[0].ndim = 3;
    out[0].d[0] = q->d[0], out[0].d[1] = q->d[1], out[0].d[2] = q->d[3];
    return MS_OK;
}
static int pattn_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in;
    int k = 0;
    cand2(&c[k++], ms_R(), ms_R(), ms_R());
    cand2(&c[k++], ms_S(0), ms_S(0), ms_S(0));
    if (a->i[0] % n == 0 && in[0].d[3] % n == 0) cand2(&c[k++], ms_S(3), ms_R(), ms_S(2));
    return k;
}
static bool pattn_valid(const ms_op_attrs *a, int n_in, const ms_shape *in, const ms_placements *pl,
                        const int *mesh_shape) {
    (void)n_in;
    int64_t w = ms_op_shard_ways(&pl[0], 3, mesh_shape);
    return a->i[0] % w == 0 && in[0].d[3] % w == 0;
}
static ms_k_gqa pattn_shape(const ms_op_call *c) {
    const ms_tensor *q = c->in[0];
    int64_t hs = c->gin[0].d[3] / c->attrs->i[0], cl = q->shape[3];
    int64_t nh = cl / hs;
    return (ms_k_gqa){.b = q->shape[0],
                      .tq = q->shape[1],
                      .tk = q->shape[1],
                      .h = nh,
                      .hkv = nh ? nh : 1,
                      .d = hs,
                      .q_stride = 3 * cl,
                      .kv_stride = 3 * cl,
                      .out_stride = cl,
                      .causal = c->attrs->i[1] != 0};
}
static void pattn_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    ms_k_gqa g = pattn_shape(c);
    sizes[0] = c->kc->k->gqa_saved_floats(&g);
    sizes[1] = c->kc->k->gqa_scratch_floats(&g);
}
static ms_status pattn_forward(ms_op_call *c, ms_error *e) {
    ms_k_gqa g = pattn_shape(c);
    const float *q = F(c->in[0]);
    int64_t cl = c->in[0]->shape[3];
    return MS_CALL_K(c->kc, gqa_forward, &g, F(c->out[0]), F(c->saved[0]), q, q + cl, q + 2 * cl,
                     F(c->in[1]), e);
}
static ms_status pattn_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    ms_k_gqa g = pattn_shape(c);
    const float *q = F(c->in[0]);
    float *dq = F(c->din[0]);
    int64_t cl = c->in[0]->shape[3];
    return MS_CALL_K(c->kc, gqa_backward, &g, dq, dq + cl, dq + 2 * cl, F(c->saved[1]),
                     F(c->dout[0]), q, q + cl, q + 2 * cl, F(c->saved[0]), F(c->in[1]), e);
}
static ms_k_cost pattn_cost(const ms_op_call *c, bool bw) {
    ms_k_gqa g = pattn_shape(c);
    return ms_k_gqa_cost(&g, bw);
}
const ms_op_def ms_op_padded_attention_def = {
    .kind = MS_OP_PADDED_ATTENTION,
    .name = "padded_attention",
    .n_in = 2,
    .n_out = 1,
    .infer = pattn_infer,
    .rule = pattn_rule,
    .valid = pattn_valid,
    .saved_floats = pattn_saved,
    .forward = pattn_forward,
    .backward = pattn_backward,
    .cost = pattn_cost,
    .runs_on = gqa_runs_on,
    .grad_inputs = 1,
};

/* --- linear: x [..., K...], W [N..., K...], optional bias [N...] -> x W^T + b [..., N...] ---
 * i[0] the number of contracted (K) dims, 0 meaning 1. Several N dims let a projection
 * produce heads directly (W [H, D, C]: x [B, T, C] -> [B, T, H, D]) and several K dims let
 * one consume them (W [C, H, D]), so tensor parallelism needs no reshape around attention.
 * Megatron's rules: W sharded on an N dim (column parallel) -> that output dim; x and W
 * sharded on the same K dim (row parallel) -> P(sum), the bias then partial too so that it
 * is added once in the sum. */

static int linear_kdims(const ms_op_attrs *a) {
    return a->i[0] > 0 ? (int)a->i[0] : 1;
}
static ms_status linear_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    const ms_shape *x = &in[0], *w = &in[1];
    int kc = linear_kdims(a), lead = x->ndim - kc, nn = w->ndim - kc;
    bool ok = n_in >= 2 && lead >= 0 && nn >= 1 && lead + nn <= MS_MAX_DIMS;
    for (int j = 0; ok && j < kc; j++) ok = x->d[lead + j] == w->d[nn + j];
    if (ok && n_in == 3) ok = in[2].ndim == nn;
    for (int j = 0; ok && n_in == 3 && j < nn; j++) ok = in[2].d[j] == w->d[j];
    if (!ok)
        return bad_shapes(err, "linear",
                          "x must be [..., K...], W [N..., K...] with i[0] K dims (default 1) "
                          "and the optional bias [N...]",
                          n_in, in);
    out->ndim = lead + nn;
    for (int d = 0; d < lead; d++) out->d[d] = x->d[d];
    for (int j = 0; j < nn; j++) out->d[lead + j] = w->d[j];
    return MS_OK;
}
static void linear_cand(ms_rule_cand *c, int n_in, ms_placement x, ms_placement w, ms_placement b,
                        ms_placement out) {
    c->in[0] = x, c->in[1] = w, c->out[0] = out;
    if (n_in == 3) c->in[2] = b;
}
static int linear_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n;
    int kc = linear_kdims(a), lead = in[0].ndim - kc, nn = in[1].ndim - kc;
    int k = row_cands(lead, n_in, 1, false, c);
    for (int j = 0; j < nn; j++)
        linear_cand(&c[k++], n_in, ms_R(), ms_S(j), ms_S(j), ms_S(lead + j));
    for (int j = 0; j < kc; j++)
        linear_cand(&c[k++], n_in, ms_S(lead + j), ms_S(nn + j), ms_Psum(), ms_Psum());
    linear_cand(&c[k++], n_in, ms_Psum(), ms_R(), ms_Psum(), ms_Psum());
    linear_cand(&c[k++], n_in, ms_R(), ms_Psum(), ms_Psum(), ms_Psum());
    return k;
}
/* The local product, every dim flattened: [M, K] x [N, K]^T (K may be 0 on an empty shard). */
static ms_k_gemm linear_gemm(const ms_op_call *c) {
    const ms_tensor *x = c->in[0], *w = c->in[1];
    int kc = linear_kdims(c->attrs), lead = x->ndim - kc;
    ms_k_gemm g = {.batch = 1, .m = 1, .n = 1, .k = 1, .trans_b = true, .bcast_b = true};
    for (int d = 0; d < x->ndim; d++) *(d < lead ? &g.m : &g.k) *= x->shape[d];
    for (int d = 0; d < w->ndim - kc; d++) g.n *= w->shape[d];
    return g;
}
static ms_status linear_forward(ms_op_call *c, ms_error *e) {
    ms_k_gemm g = linear_gemm(c);
    float *y = F(c->out[0]);
    if (g.k == 0)
        MS_CHECK(MS_CALL_K(c->kc, fill, y, 0.0f, N(c->out[0]), e));
    else
        MS_CHECK(MS_CALL_K(c->kc, matmul_forward, &g, y, F(c->in[0]), F(c->in[1]), 1.0f, 0.0f, e));
    if (c->n_in == 3) MS_CHECK(MS_CALL_K(c->kc, bias_add_forward, y, y, F(c->in[2]), g.m, g.n, e));
    return MS_OK;
}
static ms_status linear_backward(ms_op_call *c, ms_error *e) {
    ms_k_gemm g = linear_gemm(c);
    if (c->din[0] || c->din[1]) MS_CHECK(matmul_grads(c, &g, e));
    if (c->n_in == 3 && c->din[2])
        MS_CHECK(
            MS_CALL_K(c->kc, bias_add_backward, NULL, F(c->din[2]), F(c->dout[0]), g.m, g.n, 0, e));
    return MS_OK;
}
static bool linear_runs_on(const ms_kernels *k) {
    return k->fill && k->matmul_forward && k->matmul_backward && k->bias_add_forward &&
           k->bias_add_backward;
}
static ms_k_cost linear_cost(const ms_op_call *c, bool bw) {
    ms_k_gemm g = linear_gemm(c);
    ms_k_cost k = ms_k_matmul_cost(&g, bw, false, true, true);
    if (c->n_in == 3) {
        ms_k_cost b = ms_k_elementwise_cost(MS_K_BIAS_ADD, g.m * g.n, g.n, bw);
        k.flops += b.flops, k.bytes += b.bytes;
    }
    return k;
}
const ms_op_def ms_op_linear_def = {
    .kind = MS_OP_LINEAR,
    .name = "linear",
    .n_in = -3,
    .n_out = 1,
    .infer = linear_infer,
    .rule = linear_rule,
    .forward = linear_forward,
    .backward = linear_backward,
    .cost = linear_cost,
    .runs_on = linear_runs_on,
    .grad_inputs = 7,
    .fresh_ok = 3, /* x and W (products); the bias's gradient is a column sum, added */
};

/* --- bmm: a [..., M, K] @ b [..., K, N], batch dims broadcast (right-aligned, size 1 or
 * missing dims broadcast) -> [batch..., M, N] ------------------------------------------------- */

static ms_status bmm_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a;
    const ms_shape *A = &in[0], *B = &in[1];
    bool ok = A->ndim >= 2 && B->ndim >= 2 && A->d[A->ndim - 1] == B->d[B->ndim - 2];
    int nba = ok ? A->ndim - 2 : 0, nbb = ok ? B->ndim - 2 : 0, nb = nba > nbb ? nba : nbb;
    out->ndim = nb + 2;
    for (int d = 0; ok && d < nb; d++) {
        int da = d - (nb - nba), db = d - (nb - nbb);
        int64_t x = da >= 0 ? A->d[da] : 1, y = db >= 0 ? B->d[db] : 1;
        ok = x == y || x == 1 || y == 1;
        out->d[d] = x == 1 ? y : x;
    }
    if (!ok)
        return bad_shapes(err, "bmm",
                          "a must be [..., M, K] and b [..., K, N] with broadcastable batch dims",
                          n_in, in);
    out->d[nb] = A->d[A->ndim - 2], out->d[nb + 1] = B->d[B->ndim - 1];
    return MS_OK;
}
static int bmm_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    const ms_shape *A = &in[0], *B = &in[1];
    ms_shape o;
    bmm_infer(a, 2, in, &o, NULL);
    int nb = o.ndim - 2, k = 0;
    cand2(&c[k++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < nb; d++) {
        int da = d - (nb - (A->ndim - 2)), db = d - (nb - (B->ndim - 2));
        /* An operand shards a batch dim it has at full size; one that broadcasts it stays R. */
        bool ha = da >= 0 && A->d[da] == o.d[d], hb = db >= 0 && B->d[db] == o.d[d];
        bool ra = da < 0 || A->d[da] == 1, rb = db < 0 || B->d[db] == 1;
        if ((ha || ra) && (hb || rb) && (ha || hb))
            cand2(&c[k++], ha ? ms_S(da) : ms_R(), hb ? ms_S(db) : ms_R(), ms_S(d));
    }
    cand2(&c[k++], ms_S(A->ndim - 2), ms_R(), ms_S(nb));
    cand2(&c[k++], ms_R(), ms_S(B->ndim - 1), ms_S(nb + 1));
    cand2(&c[k++], ms_S(A->ndim - 1), ms_S(B->ndim - 2), ms_Psum());
    cand2(&c[k++], ms_Psum(), ms_R(), ms_Psum());
    cand2(&c[k++], ms_R(), ms_Psum(), ms_Psum());
    return k;
}
/* The local problem: output batch dims and each operand's item strides (0 = broadcast). */
static ms_k_bmm bmm_shape(const ms_op_call *c) {
    const ms_tensor *A = c->in[0], *B = c->in[1], *O = c->out[0];
    ms_k_bmm g = {.nb = O->ndim - 2};
    g.m = A->shape[A->ndim - 2], g.k = A->shape[A->ndim - 1], g.n = B->shape[B->ndim - 1];
    int64_t sa = 1, sb = 1;
    for (int d = g.nb - 1; d >= 0; d--) {
        int da = d - (g.nb - (A->ndim - 2)), db = d - (g.nb - (B->ndim - 2));
        int64_t xa = da >= 0 ? A->shape[da] : 1, xb = db >= 0 ? B->shape[db] : 1;
        g.shape[d] = O->shape[d];
        g.a_stride[d] = xa == 1 ? 0 : sa;
        g.b_stride[d] = xb == 1 ? 0 : sb;
        sa *= xa, sb *= xb;
    }
    return g;
}
static ms_status bmm_forward(ms_op_call *c, ms_error *e) {
    ms_k_bmm g = bmm_shape(c);
    return MS_CALL_K(c->kc, bmm_forward, &g, F(c->out[0]), F(c->in[0]), F(c->in[1]), e);
}
static ms_status bmm_backward(ms_op_call *c, ms_error *e) {
    ms_k_bmm g = bmm_shape(c);
    return MS_CALL_K(c->kc, bmm_backward, &g, F(c->din[0]), F(c->din[1]), F(c->dout[0]),
                     F(c->in[0]), F(c->in[1]), e);
}
static bool bmm_runs_on(const ms_kernels *k) {
    return k->bmm_forward && k->bmm_backward;
}
static ms_k_cost bmm_cost(const ms_op_call *c, bool bw) {
    ms_k_bmm g = bmm_shape(c);
    return ms_k_bmm_cost(&g, bw);
}
const ms_op_def ms_op_bmm_def = {
    .kind = MS_OP_BMM,
    .name = "bmm",
    .n_in = 2,
    .n_out = 1,
    .infer = bmm_infer,
    .rule = bmm_rule,
    .forward = bmm_forward,
    .backward = bmm_backward,
    .cost = bmm_cost,
    .runs_on = bmm_runs_on,
    .grad_inputs = 3,
};

/* --- NLL: log-probs [..., V], targets [...] -> losses [...]; targets < 0 ignored -----------------
 * Picking one entry is linear: a vocab shard gives a partial sum (0 off the slice). */

static ms_status targets_infer(const char *op, int n_in, const ms_shape *in, ms_shape *out,
                               ms_error *err) {
    bool ok = in[0].ndim >= 1 && in[1].ndim == in[0].ndim - 1;
    for (int d = 0; ok && d < in[1].ndim; d++) ok = in[0].d[d] == in[1].d[d];
    if (!ok)
        return bad_shapes(err, op, "targets must be the input's shape without the class dim", n_in,
                          in);
    out[0] = in[1];
    return MS_OK;
}
static ms_status nll_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a;
    return targets_infer("nll_loss", n_in, in, out, err);
}
static int nll_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    int nd = in[1].ndim, k = row_cands(nd, n_in, 3, false, c);
    cand2(&c[k++], ms_S(nd), ms_R(), ms_Psum());
    cand2(&c[k++], ms_Psum(), ms_R(), ms_Psum());
    return k;
}
static void saved_targets(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    sizes[0] = sizes[1] = N(c->in[1]);
}
static ms_status nll_forward(ms_op_call *c, ms_error *e) {
    const ms_tensor *lp = c->in[0];
    int32_t *tg = (int32_t *)F(c->saved[0]);
    MS_CHECK(MS_CALL_K(c->kc, ids_from_floats, tg, F(c->in[1]), N(c->in[1]), e));
    return MS_CALL_K(c->kc, nll_forward, F(c->out[0]), F(lp), tg, N(c->in[1]), last_dim(lp),
                     c->in_start[0][lp->ndim - 1], e);
}
static ms_status nll_backward(ms_op_call *c, ms_error *e) {
    const ms_tensor *lp = c->in[0];
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, nll_backward, F(c->din[0]), F(c->dout[0]),
                     (const int32_t *)F(c->saved[0]), N(c->in[1]), last_dim(lp),
                     c->in_start[0][lp->ndim - 1], e);
}
static bool nll_runs_on(const ms_kernels *k) {
    return k->ids_from_floats && k->nll_forward && k->nll_backward;
}
static ms_k_cost nll_cost(const ms_op_call *c, bool bw) {
    /* a gather (forward) or scatter (backward): a target, a value and a loss per row */
    (void)bw;
    return ms_k_rowwise_cost(1, N(c->in[1]), 1, 3);
}
const ms_op_def ms_op_nll_loss_def = {
    .kind = MS_OP_NLL_LOSS,
    .name = "nll_loss",
    .n_in = 2,
    .n_out = 1,
    .infer = nll_infer,
    .rule = nll_rule,
    .saved_floats = saved_targets,
    .forward = nll_forward,
    .backward = nll_backward,
    .cost = nll_cost,
    .runs_on = nll_runs_on,
    .grad_inputs = 1,
};

/* --- pointwise losses: a, b (same shapes) -> scalar mean of loss(a - b) -------------------------
 * mse_loss, l1_loss, huber_loss (f[0] delta). The mean divides by the GLOBAL count, so the
 * shards' results are partial sums of the mean. */

static ms_status loss_infer(const char *op, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    if (!same_shape(&in[0], &in[1]))
        return bad_shapes(err, op, "both inputs must have the same shape", n_in, in);
    out[0].ndim = 0;
    return MS_OK;
}
static ms_status mse_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a;
    return loss_infer("mse_loss", n_in, in, out, err);
}
static ms_status l1_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                          ms_error *err) {
    (void)a;
    return loss_infer("l1_loss", n_in, in, out, err);
}
static ms_status huber_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    if (!(a->f[0] > 0.0f))
        return ms_fail(err, MS_ERR_INVALID, "huber_loss: delta f[0] = %g must be > 0 (1 is usual)",
                       (double)a->f[0]);
    return loss_infer("huber_loss", n_in, in, out, err);
}
static int loss_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    return row_cands(in[0].ndim, n_in, 3, true, c);
}
static float loss_scale(const ms_op_call *c) {
    int64_t cnt = shape_numel(&c->gin[0]);
    return cnt ? 1.0f / (float)cnt : 0.0f;
}
static ms_status loss_fwd(ms_op_call *c, ms_k_loss kind, ms_error *e) {
    return MS_CALL_K(c->kc, pointwise_loss_forward, kind, F(c->out[0]), F(c->in[0]), F(c->in[1]),
                     N(c->in[0]), c->attrs->f[0], loss_scale(c), e);
}
static ms_status loss_bwd(ms_op_call *c, ms_k_loss kind, ms_error *e) {
    return MS_CALL_K(c->kc, pointwise_loss_backward, kind, F(c->din[0]), F(c->din[1]), F(c->in[0]),
                     F(c->in[1]), F(c->dout[0]), N(c->in[0]), c->attrs->f[0], loss_scale(c), e);
}
static bool loss_runs_on(const ms_kernels *k) {
    return k->pointwise_loss_forward && k->pointwise_loss_backward;
}
static ms_k_cost loss_cost(const ms_op_call *c, bool bw) {
    return ms_k_rowwise_cost(1, N(c->in[0]), bw ? 4 : 3, bw ? 6 : 2);
}
#define POINTWISE_LOSS(fn, KIND, NAME, INFER)                                                      \
    static ms_status fn##_forward(ms_op_call *c, ms_error *e) {                                    \
        return loss_fwd(c, KIND, e);                                                               \
    }                                                                                              \
    static ms_status fn##_backward(ms_op_call *c, ms_error *e) {                                   \
        return loss_bwd(c, KIND, e);                                                               \
    }                                                                                              \
    const ms_op_def ms_op_##fn##_def = {                                                           \
        .kind = MS_OP_##NAME,                                                                      \
        .name = #fn,                                                                               \
        .n_in = 2,                                                                                 \
        .n_out = 1,                                                                                \
        .infer = INFER,                                                                            \
        .rule = loss_rule,                                                                         \
        .forward = fn##_forward,                                                                   \
        .backward = fn##_backward,                                                                 \
        .cost = loss_cost,                                                                         \
        .runs_on = loss_runs_on,                                                                   \
        .grad_inputs = 3,                                                                          \
    };
POINTWISE_LOSS(mse_loss, MS_K_LOSS_MSE, MSE_LOSS, mse_infer)
POINTWISE_LOSS(l1_loss, MS_K_LOSS_L1, L1_LOSS, l1_infer)
POINTWISE_LOSS(huber_loss, MS_K_LOSS_HUBER, HUBER_LOSS, huber_infer)

/* --- cross-entropy with label smoothing: logits [..., V], targets [...] -> losses [...] -------
 * f[0] smoothing in [0, 1). Rows shard; the vocab does not (see cross_entropy for that). */

static ms_status xent_smooth_infer(const ms_op_attrs *a, int n_in, const ms_shape *in,
                                   ms_shape *out, ms_error *err) {
    if (!(a->f[0] >= 0.0f && a->f[0] < 1.0f))
        return ms_fail(err, MS_ERR_INVALID,
                       "cross_entropy_smooth: smoothing f[0] = %g must be in [0, 1)",
                       (double)a->f[0]);
    return targets_infer("cross_entropy_smooth", n_in, in, out, err);
}
static int xent_smooth_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                            ms_rule_cand *c) {
    (void)a, (void)n;
    return row_cands(in[1].ndim, n_in, 3, false, c);
}
static ms_status xent_smooth_forward(ms_op_call *c, ms_error *e) {
    int32_t *tg = (int32_t *)F(c->saved[0]);
    int64_t rows = N(c->in[1]), v = last_dim(c->in[0]);
    MS_CHECK(MS_CALL_K(c->kc, ids_from_floats, tg, F(c->in[1]), rows, e));
    if (ms_device_host_addressable(c->kc->dev)) /* debug builds: a target past the vocabulary */
        ms_k_xent_check_targets(tg, rows, v);
    return MS_CALL_K(c->kc, xent_smooth_forward, F(c->out[0]), F(c->saved[1]), F(c->in[0]), tg,
                     rows, v, c->attrs->f[0], e);
}
static ms_status xent_smooth_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, xent_smooth_backward, F(c->din[0]), F(c->in[0]), F(c->saved[1]),
                     (const int32_t *)F(c->saved[0]), F(c->dout[0]), N(c->in[1]),
                     last_dim(c->in[0]), c->attrs->f[0], e);
}
static bool xent_smooth_runs_on(const ms_kernels *k) {
    return k->ids_from_floats && k->xent_smooth_forward && k->xent_smooth_backward;
}
static ms_k_cost xent_smooth_cost(const ms_op_call *c, bool bw) {
    return ms_k_xent_cost(N(c->in[1]), last_dim(c->in[0]), bw);
}
const ms_op_def ms_op_xent_smooth_def = {
    .kind = MS_OP_XENT_SMOOTH,
    .name = "cross_entropy_smooth",
    .n_in = 2,
    .n_out = 1,
    .infer = xent_smooth_infer,
    .rule = xent_smooth_rule,
    .saved_floats = saved_targets,
    .forward = xent_smooth_forward,
    .backward = xent_smooth_backward,
    .cost = xent_smooth_cost,
    .runs_on = xent_smooth_runs_on,
    .grad_inputs = 1,
};

/* --- cosine similarity over the last dim: a, b [..., C] -> [...]; f[0] eps ------------------- */

static ms_status cosine_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    if (!(a->f[0] > 0.0f))
        return ms_fail(err, MS_ERR_INVALID, "cosine_similarity: eps f[0] = %g must be > 0 (1e-8)",
                       (double)a->f[0]);
    if (!same_shape(&in[0], &in[1]) || in[0].ndim < 1)
        return bad_shapes(err, "cosine_similarity", "a and b must have the same shape [..., C]",
                          n_in, in);
    out[0] = in[0];
    out[0].ndim--;
    return MS_OK;
}
static ms_status cosine_forward(ms_op_call *c, ms_error *e) {
    return rows_fwd(c, MS_K_ROW_COSINE, e);
}
static ms_status cosine_backward(ms_op_call *c, ms_error *e) {
    return rows_bwd(c, MS_K_ROW_COSINE, e);
}
static ms_k_cost cosine_cost(const ms_op_call *c, bool bw) {
    return ms_k_rowwise_cost(1, N(c->in[0]), bw ? 12 : 6, bw ? 6 : 2);
}
const ms_op_def ms_op_cosine_similarity_def = {
    .kind = MS_OP_COSINE_SIMILARITY,
    .name = "cosine_similarity",
    .n_in = 2,
    .n_out = 1,
    .infer = cosine_infer,
    .rule = rowwise_rule,
    .forward = cosine_forward,
    .backward = cosine_backward,
    .cost = cosine_cost,
    .runs_on = rows_runs_on,
    .grad_inputs = 3,
};

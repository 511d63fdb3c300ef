/* ops_nn.c - GELU, LayerNorm, softmax, fused attention, embedding, cross-entropy and
 * dropout. */
#include <string.h>

#include "engine/dist/dmesh.h"
#include "engine/ops/op_defs.h"

static ms_status unary_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    (void)a, (void)n_in, (void)err;
    out[0] = in[0];
    return MS_OK;
}

/* R->R and S(d)->S(d) for d < ndim - skip_last. */
static int rows_rule(int ndim, int skip_last, int n_in, ms_rule_cand *c) {
    int k = 0;
    for (int d = -1; d < ndim - skip_last; d++, k++) {
        ms_placement p = d < 0 ? ms_R() : ms_S(d);
        c[k].in[0] = p;
        for (int i = 1; i < n_in; i++) c[k].in[i] = ms_R();
        c[k].out[0] = p;
    }
    return k;
}

/* --- GELU ----------------------------------------------------------------------------- */

static int gelu_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    return rows_rule(in[0].ndim, 0, n_in, c);
}
static ms_status gelu_forward(ms_op_call *c, ms_error *e) {
    if (bf16_call(c))
        return MS_CALL_K(c->kc, gelu_forward_bf16, U16(c->out[0]), U16(c->in[0]), N(c->in[0]), e);
    return MS_CALL_K(c->kc, gelu_forward, F(c->out[0]), F(c->in[0]), N(c->in[0]), e);
}
static ms_status gelu_backward(ms_op_call *c, ms_error *e) {
    if (bf16_call(c))
        return MS_CALL_K(c->kc, gelu_backward_bf16, U16(c->din[0]), U16(c->in[0]), U16(c->dout[0]),
                         N(c->in[0]), e);
    return MS_CALL_K(c->kc, gelu_backward, F(c->din[0]), F(c->in[0]), F(c->dout[0]), N(c->in[0]),
                     e);
}
static bool gelu_runs_on(const ms_kernels *k) {
    return k->gelu_forward && k->gelu_backward;
}
static bool gelu_runs_bf16_on(const ms_kernels *k) {
    return k->gelu_forward_bf16 && k->gelu_backward_bf16;
}
static ms_k_cost gelu_cost(const ms_op_call *c, bool bw) {
    return ms_k_elementwise_cost(MS_K_GELU, N(c->in[0]), 0, bw);
}
const ms_op_def ms_op_gelu_def = {
    .kind = MS_OP_GELU,
    .name = "gelu",
    .n_in = 1,
    .n_out = 1,
    .infer = unary_infer,
    .rule = gelu_rule,
    .forward = gelu_forward,
    .backward = gelu_backward,
    .cost = gelu_cost,
    .runs_on = gelu_runs_on,
    .runs_bf16_on = gelu_runs_bf16_on,
    .grad_inputs = 1,
};

/* --- LayerNorm: x [..., C], weight [C], bias [C]; saves mean and rstd per row ------------ */

static ms_status ln_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                          ms_error *err) {
    (void)a, (void)n_in;
    int64_t c = in[0].d[in[0].ndim - 1];
    if (in[0].ndim < 1 || in[1].ndim != 1 || in[2].ndim != 1 || in[1].d[0] != c ||
        in[2].d[0] != c) {
        char buf[200];
        return ms_fail(err, MS_ERR_INVALID,
                       "layernorm: weight and bias must be [C] with C the "
                       "last input dim; got %s",
                       ms_op_shapes_str(3, in, buf, sizeof buf));
    }
    out[0] = in[0];
    return MS_OK;
}
static int ln_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    return rows_rule(in[0].ndim, 1, n_in, c);
}
static void ln_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    sizes[0] = sizes[1] = N(c->in[0]) / last_dim(c->in[0]);
}
static ms_status ln_forward(ms_op_call *c, ms_error *e) {
    int64_t C = last_dim(c->in[0]);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, layernorm_forward_bf16, U16(c->out[0]), F(c->saved[0]),
                         F(c->saved[1]), U16(c->in[0]), U16(c->in[1]), U16(c->in[2]),
                         N(c->in[0]) / C, C, c->attrs->f[0], e);
    return MS_CALL_K(c->kc, layernorm_forward, F(c->out[0]), F(c->saved[0]), F(c->saved[1]),
                     F(c->in[0]), F(c->in[1]), F(c->in[2]), N(c->in[0]) / C, C, c->attrs->f[0], e);
}
static ms_status ln_backward(ms_op_call *c, ms_error *e) {
    int64_t C = last_dim(c->in[0]);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, layernorm_backward_bf16, U16(c->din[0]), U16(c->din[1]),
                         U16(c->din[2]), U16(c->dout[0]), U16(c->in[0]), U16(c->in[1]),
                         F(c->saved[0]), F(c->saved[1]), N(c->in[0]) / C, C, e);
    return MS_CALL_K(c->kc, layernorm_backward, F(c->din[0]), F(c->din[1]), F(c->din[2]),
                     F(c->dout[0]), F(c->in[0]), F(c->in[1]), F(c->saved[0]), F(c->saved[1]),
                     N(c->in[0]) / C, C, e);
}
static bool ln_runs_on(const ms_kernels *k) {
    return k->layernorm_forward && k->layernorm_backward;
}
static bool ln_runs_bf16_on(const ms_kernels *k) {
    return k->layernorm_forward_bf16 && k->layernorm_backward_bf16;
}
static ms_k_cost ln_cost(const ms_op_call *c, bool bw) {
    int64_t C = last_dim(c->in[0]);
    return ms_k_layernorm_cost(N(c->in[0]) / C, C, bw);
}
const ms_op_def ms_op_layernorm_def = {
    .kind = MS_OP_LAYERNORM,
    .name = "layernorm",
    .n_in = 3,
    .n_out = 1,
    .infer = ln_infer,
    .rule = ln_rule,
    .saved_floats = ln_saved,
    .forward = ln_forward,
    .backward = ln_backward,
    .cost = ln_cost,
    .runs_on = ln_runs_on,
    .runs_bf16_on = ln_runs_bf16_on,
    .grad_inputs = 7,
};

/* --- softmax over the last dim ----------------------------------------------------------- */

static int softmax_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)a, (void)n;
    return rows_rule(in[0].ndim, 1, n_in, c);
}
static ms_status softmax_forward(ms_op_call *c, ms_error *e) {
    int64_t C = last_dim(c->in[0]);
    return MS_CALL_K(c->kc, softmax_forward, F(c->out[0]), F(c->in[0]), N(c->in[0]) / C, C, e);
}
static ms_status softmax_backward(ms_op_call *c, ms_error *e) {
    int64_t C = last_dim(c->in[0]);
    /* Backward reads the forward output, which the engine keeps alive for this op. */
    return MS_CALL_K(c->kc, softmax_backward, F(c->din[0]), F(c->dout[0]), F(c->out[0]),
                     N(c->in[0]) / C, C, e);
}
static bool softmax_runs_on(const ms_kernels *k) {
    return k->softmax_forward && k->softmax_backward;
}
static ms_k_cost softmax_cost(const ms_op_call *c, bool bw) {
    int64_t C = last_dim(c->in[0]);
    return ms_k_softmax_cost(N(c->in[0]) / C, C, bw);
}
const ms_op_def ms_op_softmax_def = {
    .kind = MS_OP_SOFTMAX,
    .name = "softmax",
    .n_in = 1,
    .n_out = 1,
    .infer = unary_infer,
    .rule = softmax_rule,
    .forward = softmax_forward,
    .backward = softmax_backward,
    .cost = softmax_cost,
    .runs_on = softmax_runs_on,
    .grad_inputs = 1,
};

/* --- attention: qkv [B, T, 3, C] -> [B, T, C]; i[0] heads, i[1] causal --------------------
 * Heads are sharded by sharding the C dim of qkv: each local slice [B, T, 3, C/k] holds the
 * q, k and v of the rank's heads, exactly the layout the kernel wants. */

static ms_status attn_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)n_in;
    const ms_shape *q = &in[0];
    if (q->ndim != 4 || q->d[2] != 3)
        return ms_fail(err, MS_ERR_INVALID, "attention: qkv must be [B, T, 3, C]");
    if (a->i[0] <= 0 || q->d[3] % a->i[0])
        return ms_fail(err, MS_ERR_INVALID, "attention: C = %lld is not divisible by %lld heads",
                       (long long)q->d[3], (long long)a->i[0]);
    out[0].ndim = 3;
    out[0].d[0] = q->d[0], out[0].d[1] = q->d[1], out[0].d[2] = q->d[3];
    return MS_OK;
}
static int attn_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in;
    int k = 0;
    cand1(&c[k++], ms_R(), ms_R());
    cand1(&c[k++], ms_S(0), ms_S(0));
    /* Head-parallel only when the heads split evenly over this mesh dim. */
    if (a->i[0] % n == 0 && in[0].d[3] % n == 0) cand1(&c[k++], ms_S(3), ms_S(2));
    return k;
}
/* Heads split over every mesh dim that shards qkv's C must still divide evenly. */
static bool attn_valid(const ms_op_attrs *a, int n_in, const ms_shape *in, const ms_placements *pl,
                       const int *mesh_shape) {
    (void)n_in;
    int64_t ways = ms_op_shard_ways(&pl[0], 3, mesh_shape);
    return a->i[0] % ways == 0 && in[0].d[3] % ways == 0;
}

static int64_t attn_local_heads(const ms_op_call *c) {
    int64_t hs = c->gin[0].d[3] / c->attrs->i[0];
    return c->in[0]->shape[3] / hs;
}
static void attn_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    const ms_tensor *q = c->in[0];
    int64_t b = q->shape[0], t = q->shape[1], nh = attn_local_heads(c);
    sizes[0] = c->kc->k->attention_saved_floats(b, t, q->shape[3], nh);
    sizes[1] = c->kc->k->attention_scratch_floats(b, t, nh);
}
static ms_status attn_check(const ms_op_call *c, ms_error *e) {
    int64_t hs = c->gin[0].d[3] / c->attrs->i[0];
    if (c->in[0]->shape[3] % hs)
        return ms_fail(e, MS_ERR_INVALID,
                       "attention: a rank holds %lld channels of qkv, not a "
                       "whole number of heads of size %lld; shard heads by a degree that divides "
                       "the head count",
                       (long long)c->in[0]->shape[3], (long long)hs);
    return MS_OK;
}
/* attrs f[0] > 0: dropout on the probabilities, stream i[2], keyed by the step's seed and each
 * probability's global index (the rank's first batch row and head from its box); NULL in
 * evaluation or without it. */
static const ms_k_attn_dropout *attn_dropout(const ms_op_call *c, ms_k_attn_dropout *d) {
    if (c->eval || !(c->attrs->f[0] > 0)) return NULL;
    const int64_t hs = c->gin[0].d[3] / c->attrs->i[0];
    *d = (ms_k_attn_dropout){.p = c->attrs->f[0],
                             .seed = c->seed,
                             .stream = (uint64_t)c->attrs->i[2],
                             .b0 = c->in_start[0][0],
                             .h0 = c->in_start[0][3] / hs,
                             .nh = c->attrs->i[0],
                             .w = &c->batch};
    return d;
}
static ms_status attn_forward(ms_op_call *c, ms_error *e) {
    MS_CHECK(attn_check(c, e));
    const ms_tensor *q = c->in[0];
    ms_k_attn_dropout d;
    const ms_k_attn_dropout *drop = attn_dropout(c, &d);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, attention_forward_bf16, U16(c->out[0]), F(c->saved[0]),
                         F(c->saved[1]), U16(q), NULL, q->shape[0], q->shape[1], q->shape[3],
                         attn_local_heads(c), c->attrs->i[1] != 0, drop, e);
    return MS_CALL_K(c->kc, attention_forward, F(c->out[0]), F(c->saved[0]), F(c->saved[1]), F(q),
                     NULL, q->shape[0], q->shape[1], q->shape[3], attn_local_heads(c),
                     c->attrs->i[1] != 0, drop, e);
}
static ms_status attn_backward(ms_op_call *c, ms_error *e) {
    MS_CHECK(attn_check(c, e));
    const ms_tensor *q = c->in[0];
    ms_k_attn_dropout d;
    const ms_k_attn_dropout *drop = attn_dropout(c, &d);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, attention_backward_bf16, U16(c->din[0]), F(c->saved[1]),
                         U16(c->dout[0]), U16(q), F(c->saved[0]), NULL, q->shape[0], q->shape[1],
                         q->shape[3], attn_local_heads(c), c->attrs->i[1] != 0, c->din_fresh, drop,
                         e);
    return MS_CALL_K(c->kc, attention_backward, F(c->din[0]), F(c->saved[1]), F(c->dout[0]), F(q),
                     F(c->saved[0]), NULL, q->shape[0], q->shape[1], q->shape[3],
                     attn_local_heads(c), c->attrs->i[1] != 0, c->din_fresh, drop, e);
}
static bool attn_runs_on(const ms_kernels *k) {
    return k->attention_forward && k->attention_backward;
}
static bool attn_runs_bf16_on(const ms_kernels *k) {
    return k->attention_forward_bf16 && k->attention_backward_bf16;
}
static ms_k_cost attn_cost(const ms_op_call *c, bool bw) {
    const ms_tensor *q = c->in[0];
    const int64_t b = q->shape[0], t = q->shape[1], nh = attn_local_heads(c);
    ms_k_cost k = ms_k_attention_cost(b, t, q->shape[3], nh, c->attrs->i[1] != 0, bw);
    if (c->attrs->f[0] > 0) { /* the dropout's draws, once forward and twice backward; no bytes */
        const int64_t probs = c->attrs->i[1] ? b * nh * t * (t + 1) / 2 : b * nh * t * t;
        k.flops += ms_k_dropout_cost(probs, false).flops * (bw ? 2 : 1);
    }
    return k;
}
const ms_op_def ms_op_attention_def = {
    .kind = MS_OP_ATTENTION,
    .name = "attention",
    .n_in = 1,
    .n_out = 1,
    .infer = attn_infer,
    .valid = attn_valid,
    .rule = attn_rule,
    .saved_floats = attn_saved,
    .forward = attn_forward,
    .backward = attn_backward,
    .cost = attn_cost,
    .runs_on = attn_runs_on,
    .runs_bf16_on = attn_runs_bf16_on,
    .grad_inputs = 1,
    .fresh_ok = 1, /* every element of dqkv has one writer (dq, or dk and dv, rows) */
};

/* --- embedding: ids [...], table [V, C] -> [..., C] --------------------------------------
 * A vocab-sharded table gives a partial sum: ids outside a rank's rows contribute zeros. */

static ms_status emb_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a, (void)n_in;
    if (in[1].ndim != 2 || in[0].ndim + 1 > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID, "embedding: the table must be [V, C]");
    out[0] = in[0];
    out[0].d[out[0].ndim++] = in[1].d[1];
    return MS_OK;
}
static int emb_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int k = 0, nd = in[0].ndim;
    cand2(&c[k++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < nd; d++) cand2(&c[k++], ms_S(d), ms_R(), ms_S(d));
    cand2(&c[k++], ms_R(), ms_S(0), ms_Psum());
    cand2(&c[k++], ms_R(), ms_S(1), ms_S(nd));
    return k;
}
static void emb_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    sizes[0] = N(c->in[0]); /* ids as int32 */
}
/* The table is the operand a bf16 program makes bf16 (the ids stay fp32). */
static bool emb_bf16_call(const ms_op_call *c) {
    return c->in[1]->dtype == MS_BF16;
}
static ms_status emb_forward(ms_op_call *c, ms_error *e) {
    int32_t *ids = (int32_t *)F(c->saved[0]);
    MS_CHECK(MS_CALL_K(c->kc, ids_from_floats, ids, F(c->in[0]), N(c->in[0]), e));
    const ms_tensor *t = c->in[1];
    if (emb_bf16_call(c))
        return MS_CALL_K(c->kc, embedding_forward_bf16, U16(c->out[0]), ids, U16(t), N(c->in[0]),
                         t->shape[1], c->in_start[1][0], t->shape[0], e);
    return MS_CALL_K(c->kc, embedding_forward, F(c->out[0]), ids, F(t), N(c->in[0]), t->shape[1],
                     c->in_start[1][0], t->shape[0], e);
}
static ms_status emb_backward(ms_op_call *c, ms_error *e) {
    const ms_tensor *t = c->in[1];
    const int32_t *ids = (const int32_t *)F(c->saved[0]);
    if (emb_bf16_call(c))
        return MS_CALL_K(c->kc, embedding_backward_bf16, U16(c->din[1]), ids, U16(c->dout[0]),
                         N(c->in[0]), t->shape[1], c->in_start[1][0], t->shape[0], e);
    return MS_CALL_K(c->kc, embedding_backward, F(c->din[1]), ids, F(c->dout[0]), N(c->in[0]),
                     t->shape[1], c->in_start[1][0], t->shape[0], e);
}
static bool emb_runs_on(const ms_kernels *k) {
    return k->ids_from_floats && k->embedding_forward && k->embedding_backward;
}
static bool emb_runs_bf16_on(const ms_kernels *k) {
    return k->ids_from_floats && k->embedding_forward_bf16 && k->embedding_backward_bf16;
}
static ms_k_cost emb_cost(const ms_op_call *c, bool bw) {
    return ms_k_embedding_cost(N(c->in[0]), c->in[1]->shape[1], bw);
}
const ms_op_def ms_op_embedding_def = {
    .kind = MS_OP_EMBEDDING,
    .name = "embedding",
    .n_in = 2,
    .n_out = 1,
    .infer = emb_infer,
    .rule = emb_rule,
    .saved_floats = emb_saved,
    .forward = emb_forward,
    .backward = emb_backward,
    .cost = emb_cost,
    .runs_on = emb_runs_on,
    .runs_bf16_on = emb_runs_bf16_on,
    .grad_inputs = 2,
};

/* --- cross-entropy fused with softmax: logits [..., V], targets [...] -> losses [...] -----
 * Vocab-parallel when V is sharded: row max, sum of exponentials and target logit are
 * combined across the mesh dims that shard V, so the loss comes out replicated there. */

static ms_status xent_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)a, (void)n_in;
    bool ok = in[1].ndim == in[0].ndim - 1;
    for (int d = 0; ok && d < in[1].ndim; d++) ok = in[0].d[d] == in[1].d[d];
    if (!ok) {
        char buf[200];
        return ms_fail(err, MS_ERR_INVALID,
                       "cross-entropy: targets must be the logits' shape "
                       "without the vocab dim; got %s",
                       ms_op_shapes_str(2, in, buf, sizeof buf));
    }
    out[0] = in[1];
    return MS_OK;
}
static int xent_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int k = 0, nd = in[1].ndim;
    cand2(&c[k++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < nd; d++) cand2(&c[k++], ms_S(d), ms_S(d), ms_S(d));
    cand2(&c[k++], ms_S(nd), ms_R(), ms_R());
    return k;
}
/* [0] the targets as int32, then the fp32 target logits and losses of a bf16 call (which
 * rounds them into its bf16 output once); [1], [2] the row max and sum of exps. */
static void xent_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    sizes[0] = 2 * N(c->in[1]);
    sizes[1] = sizes[2] = N(c->in[1]);
}

/* All-reduces over the mesh dims along which the logits' vocab dim is sharded. */
static ms_status vocab_all_reduce(ms_op_call *c, float *buf, int64_t n, ms_reduce_op op,
                                  ms_error *e) {
    int vdim = c->in[0]->ndim - 1;
    for (int m = 0; m < c->in_pl[0].n; m++) {
        ms_placement p = c->in_pl[0].p[m];
        if (p.kind == MS_PL_SHARD && p.dim == vdim)
            MS_CHECK(ms_all_reduce(c->mesh->dim_comm[m], buf, buf, (size_t)n, op, e));
    }
    return MS_OK;
}

static ms_status xent_forward(ms_op_call *c, ms_error *e) {
    const ms_tensor *lg = c->in[0];
    int64_t rows = N(c->in[1]), vl = last_dim(lg), v0 = c->in_start[0][lg->ndim - 1];
    int32_t *tg = (int32_t *)F(c->saved[0]);
    bool bf = bf16_call(c);
    /* tgt holds the target logits until the loss overwrites them: the fp32 output, or under
     * bf16 the scratch after the targets, rounded into the output at the end. */
    float *gmax = F(c->saved[1]), *gsum = F(c->saved[2]);
    float *tgt = bf ? F(c->saved[0]) + rows : F(c->out[0]);
    MS_CHECK(MS_CALL_K(c->kc, ids_from_floats, tg, F(c->in[1]), rows, e));
    if (ms_device_host_addressable(c->kc->dev)) /* debug builds: a target past the vocabulary */
        ms_k_xent_check_targets(tg, rows, c->gin[0].d[lg->ndim - 1]);
    MS_CHECK(bf ? MS_CALL_K(c->kc, xent_vp_rowmax_bf16, gmax, U16(lg), rows, vl, e)
                : MS_CALL_K(c->kc, xent_vp_rowmax, gmax, F(lg), rows, vl, e));
    MS_CHECK(vocab_all_reduce(c, gmax, rows, MS_REDUCE_MAX, e));
    MS_CHECK(bf ? MS_CALL_K(c->kc, xent_vp_sumexp_bf16, gsum, U16(lg), gmax, rows, vl, e)
                : MS_CALL_K(c->kc, xent_vp_sumexp, gsum, F(lg), gmax, rows, vl, e));
    MS_CHECK(vocab_all_reduce(c, gsum, rows, MS_REDUCE_SUM, e));
    MS_CHECK(bf ? MS_CALL_K(c->kc, xent_vp_target_bf16, tgt, U16(lg), tg, rows, vl, v0, e)
                : MS_CALL_K(c->kc, xent_vp_target, tgt, F(lg), tg, rows, vl, v0, e));
    MS_CHECK(vocab_all_reduce(c, tgt, rows, MS_REDUCE_SUM, e));
    MS_CHECK(MS_CALL_K(c->kc, xent_vp_loss, tgt, gmax, gsum, tgt, tg, rows, e));
    return bf ? MS_CALL_K(c->kc, bf16_round, U16(c->out[0]), tgt, rows, e) : MS_OK;
}
static ms_status xent_backward(ms_op_call *c, ms_error *e) {
    const ms_tensor *lg = c->in[0];
    int64_t rows = N(c->in[1]), vl = last_dim(lg), v0 = c->in_start[0][lg->ndim - 1];
    if (bf16_call(c))
        return MS_CALL_K(c->kc, xent_vp_backward_bf16, U16(c->din[0]), U16(lg), F(c->saved[1]),
                         F(c->saved[2]), (const int32_t *)F(c->saved[0]), U16(c->dout[0]), rows, vl,
                         v0, c->din_fresh, e);
    return MS_CALL_K(c->kc, xent_vp_backward, F(c->din[0]), F(lg), F(c->saved[1]), F(c->saved[2]),
                     (const int32_t *)F(c->saved[0]), F(c->dout[0]), rows, vl, v0, c->din_fresh, e);
}
static bool xent_runs_on(const ms_kernels *k) {
    return k->ids_from_floats && k->xent_vp_rowmax && k->xent_vp_sumexp && k->xent_vp_target &&
           k->xent_vp_loss && k->xent_vp_backward;
}
static bool xent_runs_bf16_on(const ms_kernels *k) {
    return k->xent_vp_rowmax_bf16 && k->xent_vp_sumexp_bf16 && k->xent_vp_target_bf16 &&
           k->xent_vp_backward_bf16 && k->bf16_round;
}
static ms_k_cost xent_cost(const ms_op_call *c, bool bw) {
    return ms_k_xent_cost(N(c->in[1]), last_dim(c->in[0]), bw);
}
const ms_op_def ms_op_xent_def = {
    .kind = MS_OP_XENT,
    .name = "cross_entropy",
    .n_in = 2,
    .n_out = 1,
    .infer = xent_infer,
    .rule = xent_rule,
    .saved_floats = xent_saved,
    .forward = xent_forward,
    .backward = xent_backward,
    .cost = xent_cost,
    .runs_on = xent_runs_on,
    .runs_bf16_on = xent_runs_bf16_on,
    .grad_inputs = 1,
    .fresh_ok = 1, /* every logit's gradient, ignored rows' zeros included */
};

/* --- dropout: f[0] p, i[0] stream -------------------------------------------------------- */

static int dropout_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                        ms_rule_cand *c) {
    (void)a, (void)n;
    return rows_rule(in[0].ndim, 0, n_in, c);
}
static ms_status dropout_forward(ms_op_call *c, ms_error *e) {
    const ms_tensor *x = c->in[0];
    if (c->eval)
        return F(c->out[0]) == F(x) ? MS_OK
                                    : ms_device_copy(c->kc->dev, F(c->out[0]), F(x),
                                                     ms_dtype_size(x->dtype) * (size_t)N(x),
                                                     MS_COPY_DEVICE_TO_DEVICE, e);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, dropout_forward_bf16, U16(c->out[0]), U16(x), c->attrs->f[0],
                         c->seed, (uint64_t)c->attrs->i[0], x->ndim, x->shape, c->in_start[0],
                         c->gin[0].d, &c->batch, e);
    return MS_CALL_K(c->kc, dropout_forward, F(c->out[0]), F(x), c->attrs->f[0], c->seed,
                     (uint64_t)c->attrs->i[0], x->ndim, x->shape, c->in_start[0], c->gin[0].d,
                     &c->batch, e);
}
static ms_status dropout_backward(ms_op_call *c, ms_error *e) {
    const ms_tensor *x = c->in[0];
    if (c->eval && bf16_call(c))
        return MS_CALL_K(c->kc, bf16_accumulate, U16(c->din[0]), U16(c->dout[0]), N(x), e);
    if (c->eval) return MS_CALL_K(c->kc, accumulate, F(c->din[0]), F(c->dout[0]), N(x), e);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, dropout_backward_bf16, U16(c->din[0]), U16(c->dout[0]),
                         c->attrs->f[0], c->seed, (uint64_t)c->attrs->i[0], x->ndim, x->shape,
                         c->in_start[0], c->gin[0].d, &c->batch, e);
    return MS_CALL_K(c->kc, dropout_backward, F(c->din[0]), F(c->dout[0]), c->attrs->f[0], c->seed,
                     (uint64_t)c->attrs->i[0], x->ndim, x->shape, c->in_start[0], c->gin[0].d,
                     &c->batch, e);
}
static bool dropout_runs_on(const ms_kernels *k) {
    return k->dropout_forward && k->dropout_backward && k->accumulate;
}
static bool dropout_runs_bf16_on(const ms_kernels *k) {
    return k->dropout_forward_bf16 && k->dropout_backward_bf16 && k->bf16_accumulate;
}
static ms_k_cost dropout_cost(const ms_op_call *c, bool bw) {
    return ms_k_dropout_cost(N(c->in[0]), bw);
}
const ms_op_def ms_op_dropout_def = {
    .kind = MS_OP_DROPOUT,
    .name = "dropout",
    .n_in = 1,
    .n_out = 1,
    .infer = unary_infer,
    .rule = dropout_rule,
    .forward = dropout_forward,
    .backward = dropout_backward,
    .cost = dropout_cost,
    .runs_on = dropout_runs_on,
    .runs_bf16_on = dropout_runs_bf16_on,
    .grad_inputs = 1,
};

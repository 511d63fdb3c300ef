/* ops_linear.c - matmul, add, mul, scale and bias: the linear and bilinear operators. */
#include <stdio.h>
#include <string.h>

#include "engine/ops/op_defs.h"

const char *ms_op_shapes_str(int n, const ms_shape *s, char *buf, size_t len) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < len; i++) {
        char one[96];
        k += (size_t)snprintf(buf + k, len - k, "%s%s", i ? " and " : "",
                              ms_shape_str(s[i].d, s[i].ndim, one, sizeof one));
    }
    return buf;
}

void ms_op_ids_from_floats(int32_t *out, const float *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)in[i];
}

/* --- matmul ----------------------------------------------------------------------------
 * Weight form (i[1] = 0): A [..., K] @ B [K, N...] (or B [N, K] with i[0] trans_b) gives
 * [..., N...]: a linear layer with a shared weight. Batched form (i[1] = 1): A [b..., M, K]
 * @ B [b..., K, N] with i[0] trans_b and i[2] trans_a on the last two dims. */

static ms_status matmul_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                              ms_error *err) {
    (void)n_in;
    const ms_shape *A = &in[0], *B = &in[1];
    bool tb = a->i[0], batched = a->i[1], ta = a->i[2];
    char buf[200];
    if (!batched) {
        int64_t k = A->d[A->ndim - 1];
        int64_t bk = tb ? B->d[1] : B->d[0];
        if (A->ndim < 1 || B->ndim < 2 || (tb && B->ndim != 2) || k != bk ||
            A->ndim - 1 + B->ndim - 1 > MS_MAX_DIMS)
            return ms_fail(err, MS_ERR_INVALID,
                           "matmul: shapes %s do not multiply (K %lld vs %lld)",
                           ms_op_shapes_str(2, in, buf, sizeof buf), (long long)k, (long long)bk);
        out->ndim = A->ndim - 1 + B->ndim - 1;
        for (int d = 0; d < A->ndim - 1; d++) out->d[d] = A->d[d];
        if (tb)
            out->d[A->ndim - 1] = B->d[0];
        else
            for (int j = 1; j < B->ndim; j++) out->d[A->ndim - 2 + j] = B->d[j];
        return MS_OK;
    }
    int nd = A->ndim;
    bool ok = nd >= 2 && B->ndim == nd;
    for (int d = 0; ok && d < nd - 2; d++) ok = A->d[d] == B->d[d];
    int64_t m = ta ? A->d[nd - 1] : A->d[nd - 2], ka = ta ? A->d[nd - 2] : A->d[nd - 1];
    int64_t kb = ok ? (tb ? B->d[nd - 1] : B->d[nd - 2]) : -1,
            n = ok ? (tb ? B->d[nd - 2] : B->d[nd - 1]) : 0;
    if (!ok || ka != kb)
        return ms_fail(err, MS_ERR_INVALID, "batched matmul: shapes %s do not multiply",
                       ms_op_shapes_str(2, in, buf, sizeof buf));
    *out = *A;
    out->d[nd - 2] = m;
    out->d[nd - 1] = n;
    return MS_OK;
}

static int matmul_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)n_in, (void)n;
    const ms_shape *A = &in[0], *B = &in[1];
    bool tb = a->i[0], batched = a->i[1], ta = a->i[2];
    int k = 0;
    cand2(&c[k++], ms_R(), ms_R(), ms_R());
    if (!batched) {
        int ka = A->ndim - 1;
        for (int d = 0; d < ka; d++) cand2(&c[k++], ms_S(d), ms_R(), ms_S(d));
        if (tb)
            cand2(&c[k++], ms_R(), ms_S(0), ms_S(ka));
        else
            for (int j = 1; j < B->ndim; j++) cand2(&c[k++], ms_R(), ms_S(j), ms_S(ka + j - 1));
        cand2(&c[k++], ms_S(ka), ms_S(tb ? 1 : 0), ms_Psum());
    } else {
        int nd = A->ndim;
        for (int d = 0; d < nd - 2; d++) cand2(&c[k++], ms_S(d), ms_S(d), ms_S(d));
        cand2(&c[k++], ms_S(ta ? nd - 1 : nd - 2), ms_R(), ms_S(nd - 2));
        cand2(&c[k++], ms_R(), ms_S(tb ? nd - 2 : nd - 1), ms_S(nd - 1));
        cand2(&c[k++], ms_S(ta ? nd - 2 : nd - 1), ms_S(tb ? nd - 1 : nd - 2), ms_Psum());
    }
    cand2(&c[k++], ms_Psum(), ms_R(), ms_Psum());
    cand2(&c[k++], ms_R(), ms_Psum(), ms_Psum());
    return k;
}

static ms_k_gemm matmul_gemm(const ms_op_call *call) {
    const ms_tensor *A = call->in[0], *B = call->in[1];
    bool tb = call->attrs->i[0], batched = call->attrs->i[1], ta = call->attrs->i[2];
    ms_k_gemm g = {.batch = 1, .trans_a = ta, .trans_b = tb, .bcast_b = !batched};
    if (!batched) {
        g.k = A->shape[A->ndim - 1];
        g.m = g.k ? N(A) / g.k : 0;
        g.n = g.k ? N(B) / g.k : 0;
        g.trans_a = false;
        return g;
    }
    int nd = A->ndim;
    for (int d = 0; d < nd - 2; d++) g.batch *= A->shape[d];
    g.m = ta ? A->shape[nd - 1] : A->shape[nd - 2];
    g.k = ta ? A->shape[nd - 2] : A->shape[nd - 1];
    g.n = tb ? B->shape[nd - 2] : B->shape[nd - 1];
    return g;
}

static ms_status matmul_forward(ms_op_call *call, ms_error *err) {
    ms_k_gemm g = matmul_gemm(call);
    if (bf16_call(call))
        return MS_CALL_K(call->kc, matmul_forward_bf16, &g, U16(call->out[0]), U16(call->in[0]),
                         U16(call->in[1]), 1.0f, 0.0f, err);
    return MS_CALL_K(call->kc, matmul_forward, &g, F(call->out[0]), F(call->in[0]), F(call->in[1]),
                     1.0f, 0.0f, err);
}

static ms_status matmul_backward(ms_op_call *call, ms_error *err) {
    ms_k_gemm g = matmul_gemm(call);
    return matmul_grads(call, &g, err);
}

static ms_k_cost matmul_cost(const ms_op_call *call, bool backward) {
    ms_k_gemm g = matmul_gemm(call);
    return ms_k_matmul_cost(&g, backward, false, true, true);
}

static bool matmul_runs_on(const ms_kernels *k) {
    return k->matmul_forward && k->matmul_backward;
}

static bool matmul_runs_bf16_on(const ms_kernels *k) {
    return k->matmul_forward_bf16 && k->matmul_backward_bf16;
}

const ms_op_def ms_op_matmul_def = {
    .kind = MS_OP_MATMUL,
    .name = "matmul",
    .n_in = 2,
    .n_out = 1,
    .infer = matmul_infer,
    .rule = matmul_rule,
    .forward = matmul_forward,
    .backward = matmul_backward,
    .cost = matmul_cost,
    .fresh_ok = 3, /* both gradients are products: beta 0 writes them whole */
    .runs_on = matmul_runs_on,
    .runs_bf16_on = matmul_runs_bf16_on,
    .grad_inputs = 3,
};

/* --- elementwise: add, mul, scale ------------------------------------------------------- */

static ms_status same_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)a;
    for (int i = 1; i < n_in; i++) {
        bool same = in[i].ndim == in[0].ndim;
        for (int d = 0; same && d < in[0].ndim; d++) same = in[i].d[d] == in[0].d[d];
        if (!same) {
            char buf[200];
            return ms_fail(err, MS_ERR_INVALID, "elementwise op: shapes %s differ",
                           ms_op_shapes_str(n_in, in, buf, sizeof buf));
        }
    }
    out[0] = in[0];
    return MS_OK;
}

/* Shard-preserving candidates of an elementwise op: R..R->R and S(d)..S(d)->S(d). */
static int elementwise_cands(int n_in, int ndim, ms_rule_cand *c) {
    int k = 0;
    for (int d = -1; d < ndim; d++, k++) {
        ms_placement p = d < 0 ? ms_R() : ms_S(d);
        for (int i = 0; i < n_in; i++) c[k].in[i] = p;
        c[k].out[0] = p;
    }
    return k;
}

static int add_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    int k = elementwise_cands(n_in, in[0].ndim, c);
    cand2(&c[k++], ms_Psum(), ms_Psum(), ms_Psum()); /* sums of partials are partial */
    return k;
}

static int mul_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    int k = elementwise_cands(n_in, in[0].ndim, c);
    cand2(&c[k++], ms_Psum(), ms_R(), ms_Psum());
    cand2(&c[k++], ms_R(), ms_Psum(), ms_Psum());
    return k;
}

static int scale_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    int k = elementwise_cands(n_in, in[0].ndim, c);
    cand1(&c[k++], ms_Psum(), ms_Psum());
    return k;
}

static ms_status add_forward(ms_op_call *c, ms_error *e) {
    if (bf16_call(c))
        return MS_CALL_K(c->kc, add_forward_bf16, U16(c->out[0]), U16(c->in[0]), U16(c->in[1]),
                         N(c->out[0]), e);
    return MS_CALL_K(c->kc, add_forward, F(c->out[0]), F(c->in[0]), F(c->in[1]), N(c->out[0]), e);
}
static ms_status add_backward(ms_op_call *c, ms_error *e) {
    if (bf16_call(c))
        return MS_CALL_K(c->kc, add_backward_bf16, U16(c->din[0]), U16(c->din[1]), U16(c->dout[0]),
                         N(c->dout[0]), e);
    return MS_CALL_K(c->kc, add_backward, F(c->din[0]), F(c->din[1]), F(c->dout[0]), N(c->dout[0]),
                     e);
}
static ms_status mul_forward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, mul_forward, F(c->out[0]), F(c->in[0]), F(c->in[1]), N(c->out[0]), e);
}
static ms_status mul_backward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, mul_backward, F(c->din[0]), F(c->din[1]), F(c->dout[0]), F(c->in[0]),
                     F(c->in[1]), N(c->dout[0]), e);
}
static ms_status scale_forward(ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, scale_forward, F(c->out[0]), F(c->in[0]), c->attrs->f[0], N(c->out[0]),
                     e);
}
static ms_status scale_backward(ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, scale_backward, F(c->din[0]), F(c->dout[0]), c->attrs->f[0],
                     N(c->dout[0]), e);
}
static bool add_runs_on(const ms_kernels *k) {
    return k->add_forward && k->add_backward;
}
static bool add_runs_bf16_on(const ms_kernels *k) {
    return k->add_forward_bf16 && k->add_backward_bf16;
}
static bool mul_runs_on(const ms_kernels *k) {
    return k->mul_forward && k->mul_backward;
}
static bool scale_runs_on(const ms_kernels *k) {
    return k->scale_forward && k->scale_backward;
}
static ms_k_cost add_cost(const ms_op_call *c, bool bw) {
    return ms_k_elementwise_cost(MS_K_ADD, N(c->in[0]), 0, bw);
}
static ms_k_cost mul_cost(const ms_op_call *c, bool bw) {
    return ms_k_elementwise_cost(MS_K_MUL, N(c->in[0]), 0, bw);
}
static ms_k_cost scale_cost(const ms_op_call *c, bool bw) {
    return ms_k_elementwise_cost(MS_K_SCALE, N(c->in[0]), 0, bw);
}

const ms_op_def ms_op_add_def = {
    .kind = MS_OP_ADD,
    .name = "add",
    .n_in = 2,
    .n_out = 1,
    .infer = same_infer,
    .rule = add_rule,
    .forward = add_forward,
    .backward = add_backward,
    .cost = add_cost,
    .runs_on = add_runs_on,
    .runs_bf16_on = add_runs_bf16_on,
    .grad_inputs = 3,
};
const ms_op_def ms_op_mul_def = {
    .kind = MS_OP_MUL,
    .name = "mul",
    .n_in = 2,
    .n_out = 1,
    .infer = same_infer,
    .rule = mul_rule,
    .forward = mul_forward,
    .backward = mul_backward,
    .cost = mul_cost,
    .runs_on = mul_runs_on,
    .grad_inputs = 3,
};
const ms_op_def ms_op_scale_def = {
    .kind = MS_OP_SCALE,
    .name = "scale",
    .n_in = 1,
    .n_out = 1,
    .infer = same_infer,
    .rule = scale_rule,
    .forward = scale_forward,
    .backward = scale_backward,
    .cost = scale_cost,
    .runs_on = scale_runs_on,
    .grad_inputs = 1,
};

/* --- bias: x [lead..., tail...] + b [tail...] ------------------------------------------- */

static ms_status bias_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                            ms_error *err) {
    (void)a, (void)n_in;
    int lead = in[0].ndim - in[1].ndim;
    bool ok = lead >= 0;
    for (int j = 0; ok && j < in[1].ndim; j++) ok = in[0].d[lead + j] == in[1].d[j];
    if (!ok) {
        char buf[200];
        return ms_fail(err, MS_ERR_INVALID,
                       "bias: bias shape must equal the trailing dims of "
                       "the input; got %s",
                       ms_op_shapes_str(2, in, buf, sizeof buf));
    }
    out[0] = in[0];
    return MS_OK;
}

static int bias_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int lead = in[0].ndim - in[1].ndim, k = 0;
    cand2(&c[k++], ms_R(), ms_R(), ms_R());
    for (int d = 0; d < lead; d++) cand2(&c[k++], ms_S(d), ms_R(), ms_S(d));
    for (int j = 0; j < in[1].ndim; j++) cand2(&c[k++], ms_S(lead + j), ms_S(j), ms_S(lead + j));
    return k;
}

/* The local bias may be a box of the global one when a trailing dim is sharded; with the
 * box contiguous in the input's local layout, bias_add over [rows, numel(bias)] is exact. */
static ms_status bias_forward(ms_op_call *c, ms_error *e) {
    int64_t nb = N(c->in[1]);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, bias_add_forward_bf16, U16(c->out[0]), U16(c->in[0]), U16(c->in[1]),
                         N(c->out[0]) / (nb ? nb : 1), nb, e);
    return MS_CALL_K(c->kc, bias_add_forward, F(c->out[0]), F(c->in[0]), F(c->in[1]),
                     N(c->out[0]) / (nb ? nb : 1), nb, e);
}
static ms_status bias_backward(ms_op_call *c, ms_error *e) {
    int64_t nb = N(c->in[1]);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, bias_add_backward_bf16, U16(c->din[0]), U16(c->din[1]),
                         U16(c->dout[0]), N(c->dout[0]) / (nb ? nb : 1), nb, c->din_fresh & 1u, e);
    return MS_CALL_K(c->kc, bias_add_backward, F(c->din[0]), F(c->din[1]), F(c->dout[0]),
                     N(c->dout[0]) / (nb ? nb : 1), nb, c->din_fresh & 1u, e);
}
static bool bias_runs_on(const ms_kernels *k) {
    return k->bias_add_forward && k->bias_add_backward;
}
static bool bias_runs_bf16_on(const ms_kernels *k) {
    return k->bias_add_forward_bf16 && k->bias_add_backward_bf16;
}
static ms_k_cost bias_cost(const ms_op_call *c, bool bw) {
    int64_t nb = N(c->in[1]);
    return ms_k_elementwise_cost(MS_K_BIAS_ADD, N(c->in[0]), nb, bw);
}

const ms_op_def ms_op_bias_def = {
    .kind = MS_OP_BIAS,
    .name = "bias",
    .n_in = 2,
    .n_out = 1,
    .infer = bias_infer,
    .rule = bias_rule,
    .forward = bias_forward,
    .backward = bias_backward,
    .cost = bias_cost,
    .runs_on = bias_runs_on,
    .runs_bf16_on = bias_runs_bf16_on,
    .grad_inputs = 3,
    .fresh_ok = 1, /* dx is dout: written whole; the bias's gradient is a column sum, added */
};

/* ops_fused.c - elementwise chains as one operator each, one pass over memory
 * (kernels/fused.h): bias_gelu after an up projection, bias_dropout_add after an output
 * projection. The builders use them where the chain appears; the results are the chain's.
 *
 * Rules: the bias op's, since the chains are a bias add followed by elementwise work on
 * global positions: replicated; a leading dim sharded (bias whole); a trailing dim sharded
 * with the bias's matching dim. bias_dropout_add's residual follows its input. No partial
 * candidates: a bias (and dropout's scaling of it) does not distribute over a partial sum.
 * Nothing is saved for backward: the sum is recomputed from the input and the mask is drawn
 * again (Philox on global indices).
 */
#include "engine/kernels/fused.h"
#include "engine/ops/op_defs.h"

/* x [lead..., tail...], b [tail...], then `extra` inputs of x's shape. */
static ms_status fused_infer(const char *op, int extra, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    int lead = in[0].ndim - in[1].ndim;
    bool ok = lead >= 0 && n_in == 2 + extra;
    for (int j = 0; ok && j < in[1].ndim; j++) ok = in[0].d[lead + j] == in[1].d[j];
    for (int k = 2; ok && k < n_in; k++) {
        ok = in[k].ndim == in[0].ndim;
        for (int d = 0; ok && d < in[0].ndim; d++) ok = in[k].d[d] == in[0].d[d];
    }
    if (!ok) {
        char buf[300];
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the bias must be the input's trailing dims%s; got %s", op,
                       extra ? " and the residual the input's shape" : "",
                       ms_op_shapes_str(n_in, in, buf, sizeof buf));
    }
    out[0] = in[0];
    return MS_OK;
}

static int fused_rule(int n_in, const ms_shape *in, ms_rule_cand *c) {
    int lead = in[0].ndim - in[1].ndim, k = 0;
    for (int d = -1; d < in[0].ndim; d++, k++) {
        ms_placement x = d < 0 ? ms_R() : ms_S(d);
        c[k].in[0] = c[k].out[0] = x;
        c[k].in[1] = d < lead ? ms_R() : ms_S(d - lead);
        for (int i = 2; i < n_in; i++) c[k].in[i] = x;
    }
    return k;
}

static int64_t bias_numel(const ms_op_call *c) {
    int64_t nb = N(c->in[1]);
    return nb ? nb : 1;
}

/* --- bias_gelu: x, b -> gelu(x + b) --------------------------------------------------------- */

static ms_status bias_gelu_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                                 ms_error *err) {
    (void)a;
    return fused_infer("bias_gelu", 0, n_in, in, out, err);
}
static int bias_gelu_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                          ms_rule_cand *c) {
    (void)a, (void)n;
    return fused_rule(n_in, in, c);
}
/* The local bias is a box of the global one when a trailing dim is sharded; contiguous in the
 * input's local layout, so [rows, numel(bias)] is exact (as the bias op). */
static ms_status bias_gelu_forward(ms_op_call *c, ms_error *e) {
    int64_t nb = bias_numel(c);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, bias_gelu_forward_bf16, U16(c->out[0]), U16(c->in[0]),
                         U16(c->in[1]), N(c->in[0]) / nb, nb, e);
    return MS_CALL_K(c->kc, bias_gelu_forward, F(c->out[0]), F(c->in[0]), F(c->in[1]),
                     N(c->in[0]) / nb, nb, e);
}
static ms_status bias_gelu_backward(ms_op_call *c, ms_error *e) {
    int64_t nb = bias_numel(c);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, bias_gelu_backward_bf16, U16(c->din[0]), U16(c->din[1]),
                         U16(c->dout[0]), U16(c->in[0]), U16(c->in[1]), N(c->in[0]) / nb, nb,
                         c->din_fresh, e);
    return MS_CALL_K(c->kc, bias_gelu_backward, F(c->din[0]), F(c->din[1]), F(c->dout[0]),
                     F(c->in[0]), F(c->in[1]), N(c->in[0]) / nb, nb, c->din_fresh, e);
}
static bool bias_gelu_runs_on(const ms_kernels *k) {
    return k->bias_gelu_forward && k->bias_gelu_backward;
}
static bool bias_gelu_runs_bf16_on(const ms_kernels *k) {
    return k->bias_gelu_forward_bf16 && k->bias_gelu_backward_bf16;
}
static ms_k_cost bias_gelu_cost(const ms_op_call *c, bool bw) {
    int64_t nb = bias_numel(c);
    return ms_k_bias_gelu_cost(N(c->in[0]) / nb, nb, bw);
}
const ms_op_def ms_op_bias_gelu_def = {
    .kind = MS_OP_BIAS_GELU,
    .name = "bias_gelu",
    .n_in = 2,
    .n_out = 1,
    .infer = bias_gelu_infer,
    .rule = bias_gelu_rule,
    .forward = bias_gelu_forward,
    .backward = bias_gelu_backward,
    .cost = bias_gelu_cost,
    .runs_on = bias_gelu_runs_on,
    .runs_bf16_on = bias_gelu_runs_bf16_on,
    .grad_inputs = 3,
    .fresh_ok = 1, /* dx elementwise; dbias a column sum, added */
};

/* --- bias_dropout_add: x, b, res -> res + dropout(x + b); f[0] p, i[0] stream --------------
 * The mask is MS_OP_DROPOUT's for the same stream: drawn on the global index of each element
 * of x's global shape, the step's batch window applied. Evaluation drops nothing. */

static ms_status bda_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                           ms_error *err) {
    (void)a;
    return fused_infer("bias_dropout_add", 1, n_in, in, out, err);
}
static int bda_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n;
    return fused_rule(n_in, in, c);
}
static ms_k_fused_dropout bda_dropout(const ms_op_call *c) {
    const ms_tensor *x = c->in[0];
    return (ms_k_fused_dropout){
        .p = c->eval ? 0.0f : c->attrs->f[0],
        .seed = c->seed,
        .stream = (uint64_t)c->attrs->i[0],
        .box = {x->ndim, x->shape, c->in_start[0], c->gin[0].d, &c->batch},
    };
}
static ms_status bda_forward(ms_op_call *c, ms_error *e) {
    ms_k_fused_dropout d = bda_dropout(c);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, bias_dropout_add_forward_bf16, U16(c->out[0]), U16(c->in[0]),
                         U16(c->in[1]), U16(c->in[2]), bias_numel(c), &d, e);
    return MS_CALL_K(c->kc, bias_dropout_add_forward, F(c->out[0]), F(c->in[0]), F(c->in[1]),
                     F(c->in[2]), bias_numel(c), &d, e);
}
static ms_status bda_backward(ms_op_call *c, ms_error *e) {
    ms_k_fused_dropout d = bda_dropout(c);
    if (bf16_call(c))
        return MS_CALL_K(c->kc, bias_dropout_add_backward_bf16, U16(c->din[0]), U16(c->din[1]),
                         U16(c->din[2]), U16(c->dout[0]), bias_numel(c), &d, c->din_fresh, e);
    return MS_CALL_K(c->kc, bias_dropout_add_backward, F(c->din[0]), F(c->din[1]), F(c->din[2]),
                     F(c->dout[0]), bias_numel(c), &d, c->din_fresh, e);
}
static bool bda_runs_on(const ms_kernels *k) {
    return k->bias_dropout_add_forward && k->bias_dropout_add_backward;
}
static bool bda_runs_bf16_on(const ms_kernels *k) {
    return k->bias_dropout_add_forward_bf16 && k->bias_dropout_add_backward_bf16;
}
static ms_k_cost bda_cost(const ms_op_call *c, bool bw) {
    return ms_k_bias_dropout_add_cost(N(c->in[0]), bias_numel(c), c->attrs->f[0] > 0, bw);
}
const ms_op_def ms_op_bias_dropout_add_def = {
    .kind = MS_OP_BIAS_DROPOUT_ADD,
    .name = "bias_dropout_add",
    .n_in = 3,
    .n_out = 1,
    .infer = bda_infer,
    .rule = bda_rule,
    .forward = bda_forward,
    .backward = bda_backward,
    .cost = bda_cost,
    .runs_on = bda_runs_on,
    .runs_bf16_on = bda_runs_bf16_on,
    .grad_inputs = 7,
    .fresh_ok = 5, /* dx and dres elementwise; dbias a column sum, added */
};

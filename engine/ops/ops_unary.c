/* ops_unary.c - the elementwise unary family (neg, exp, relu, gelu_erf, clamp, ...).
 *
 * Every op shares one infer, rule, forward, backward and cost, parameterised by its kernel
 * id (kernels/elementwise_ext.h holds the formulas); MS_OP_FAMILY_ROW stamps out each op's
 * wrappers and table row.
 *
 * Rule: R->R and S(d)->S(d) for every dim (the op is pointwise). P(sum)->P(sum) only for a
 * linear op (neg): f(sum of partials) = sum of f(partials) holds for nothing else. A
 * monotone op would commute with P(max), but its backward would read a partial input, so no
 * op declares it.
 */
#include <math.h>

#include "engine/kernels/elementwise_ext.h"
#include "engine/ops/op_family_row.h"

static bool unary_linear(ms_k_unary k) {
    return k == MS_K_UN_NEG;
}

static ms_status unary_infer(ms_k_unary k, const char *name, const ms_op_attrs *a, int n_in,
                             const ms_shape *in, ms_shape *out, ms_error *err) {
    (void)n_in;
    bool uses_f0 = k == MS_K_UN_LEAKY_RELU || k == MS_K_UN_ELU || k == MS_K_UN_POW_SCALAR ||
                   k == MS_K_UN_CLAMP || k == MS_K_UN_ADD_SCALAR;
    if (uses_f0 && !isfinite(a->f[0]))
        return ms_fail(err, MS_ERR_INVALID, "%s: f[0] = %g is not a finite number", name,
                       (double)a->f[0]);
    if (k == MS_K_UN_CLAMP && !(isfinite(a->f[1]) && a->f[0] <= a->f[1]))
        return ms_fail(err, MS_ERR_INVALID,
                       "clamp: bounds f[0] = %g, f[1] = %g are not an interval; pass finite "
                       "lo <= hi",
                       (double)a->f[0], (double)a->f[1]);
    out[0] = in[0];
    return MS_OK;
}

static int unary_rule(ms_k_unary k, const ms_op_attrs *a, int n_in, const ms_shape *in, int nr,
                      ms_rule_cand *c) {
    (void)a, (void)n_in, (void)nr;
    int n = 0;
    for (int d = -1; d < in[0].ndim; d++, n++) {
        ms_placement p = d < 0 ? ms_R() : ms_S(d);
        cand1(&c[n], p, p);
    }
    if (unary_linear(k)) cand1(&c[n++], ms_Psum(), ms_Psum());
    return n;
}

static ms_status unary_forward(ms_k_unary k, ms_op_call *c, ms_error *e) {
    return MS_CALL_K(c->kc, unary_forward, k, F(c->out[0]), F(c->in[0]), N(c->in[0]),
                     c->attrs->f[0], c->attrs->f[1], e);
}

/* Derivatives may read the forward's output, which the engine keeps for the backward. */
static ms_status unary_backward(ms_k_unary k, ms_op_call *c, ms_error *e) {
    if (!c->din[0]) return MS_OK;
    return MS_CALL_K(c->kc, unary_backward, k, F(c->din[0]), F(c->in[0]), F(c->out[0]),
                     F(c->dout[0]), N(c->in[0]), c->attrs->f[0], c->attrs->f[1],
                     (c->din_fresh & 1u) != 0, e);
}

static bool unary_runs_on(const ms_kernels *k) {
    return k->unary_forward && k->unary_backward;
}

static ms_k_cost unary_cost(ms_k_unary k, const ms_op_call *c, bool bw) {
    return ms_k_unary_cost(k, N(c->in[0]), bw);
}

/* fresh_ok: every element of dx has one writer, so a fresh gradient is written, not added to. */
#define UNARY_ROW(ID, op, ff, fb)                                                                  \
    MS_OP_FAMILY_ROW_FRESH(unary, MS_K_UN_##ID, MS_OP_##ID, op, 1, 1, 1)
MS_K_UNARY_OPS(UNARY_ROW)

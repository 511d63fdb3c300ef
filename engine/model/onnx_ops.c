/* onnx_ops.c - one mapper per ONNX operator: each reads its node (ox_build.node) and adds the
 * meshscope operators that compute it exactly, or refuses an attribute combination with one
 * line naming the attribute and the fix. The table at the end lists them (docs/onnx.md). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/model/onnx_impl.h"

#ifdef MS_HAVE_ONNX

/* --- helpers ------------------------------------------------------------------------------- */

static ms_status norm_axis(ox_build *b, int64_t axis, int rank, int *out, ms_error *err) {
    *out = 0;
    if (axis < -rank || axis >= (rank ? rank : 1))
        return ox_fail(b, MS_ERR_INVALID, err, "axis %lld is outside a rank-%d tensor",
                       (long long)axis, rank);
    *out = (int)(axis < 0 ? axis + rank : axis);
    return MS_OK;
}

static int rank_of(const ox_build *b, int v) {
    return ox_shape(b, v)->ndim;
}

/* The constant's values as integers into out[max]; returns how many. */
static int const_ints(const ox_const *c, int64_t *out, int max) {
    int n = c->numel < max ? (int)c->numel : max;
    for (int i = 0; i < n; i++) {
        double d = c->d[i];
        out[i] = d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : (int64_t)d;
    }
    return (int)c->numel;
}

static int reshape(ox_build *b, int v, int nd, const int64_t *shape, int k, ms_error *err) {
    ms_op_attrs a = {0};
    a.i[0] = nd;
    for (int d = 0; d < nd; d++) a.i[1 + d] = shape[d];
    return ox_op(b, MS_OP_RESHAPE, &a, 1, &v, k, err);
}

/* A tensor of x's shape full of c (0 x, clamped to [c, c]: a NaN or inf in x still gives c). */
static int fill_like(ox_build *b, int x, float c, ms_error *err) {
    ms_op_attrs a = {.f = {0.0f}};
    int z = ox_op(b, MS_OP_SCALE, &a, 1, &x, -1, err);
    if (z < 0) return -1;
    a.f[0] = a.f[1] = c;
    return ox_op(b, MS_OP_CLAMP, &a, 1, &z, -1, err);
}

static int add_scalar(ox_build *b, int x, float c, int k, ms_error *err) {
    int f = fill_like(b, x, c, err);
    if (f < 0) return -1;
    int in[2] = {x, f};
    return ox_op(b, MS_OP_ADD, NULL, 2, in, k, err);
}

/* A constant graph value (it never trains) of the given values, named after the node. */
static int const_value(ox_build *b, int ndim, const int64_t *shape, const float *vals,
                       ms_error *err) {
    char name[192];
    snprintf(name, sizeof name, "%s/c%d", b->node->n_output ? b->node->output[0] : "onnx",
             b->tmp++);
    int v = ms_graph_constant(b->g, name, ndim, shape, vals);
    if (v < 0) {
        ms_error e = {0};
        ms_graph_error(b->g, &e);
        ox_fail(b, e.code ? e.code : MS_ERR_INVALID, err, "%s", e.msg);
    }
    return v;
}

/* Whether input k is an empty constant (a dim of 0), its shape into *s. */
static bool empty_in(ox_build *b, int k, ms_shape *s) {
    const ox_const *c = NULL;
    ms_error e = {0};
    if (!ox_is_const(b, k) || ox_const_in(b, k, &c, &e) != MS_OK || c->numel) return false;
    s->ndim = c->ndim;
    for (int d = 0; d < c->ndim; d++) s->d[d] = c->shape[d];
    return true;
}

/* Output k as an empty constant of the shape (an empty tensor is no graph value). */
static void empty_out(ox_build *b, int k, int ndim, const int64_t *shape) {
    ox_const *c = ox_new_const(b, OX_FLOAT, ndim, shape);
    ox_out_const(b, k, c);
}

/* The axes of a node: attribute `axes` (older opsets) or input 1 (newer), into out. Returns the
 * count, -1 when neither is given. */
static int node_axes(ox_build *b, int input, int64_t *out, ms_error *err, ms_status *st) {
    *st = MS_OK;
    int n = ox_attr_ints(b, "axes", out, MS_MAX_DIMS + 1);
    if (n >= 0 || !ox_has(b, input)) return n;
    const ox_const *c;
    if ((*st = ox_const_in(b, input, &c, err)) != MS_OK) return -1;
    return const_ints(c, out, MS_MAX_DIMS + 1);
}

/* --- elementwise ----------------------------------------------------------------------------- */

static ms_status unary(ox_build *b, int op, ms_op_attrs a, ms_error *err) {
    int x, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    OX_OP(y, op, &a, 0, x);
    ox_out(b, 0, y);
    return MS_OK;
}
#define UNARY(fn, OP)                                                                              \
    static ms_status fn(ox_build *b, ms_error *err) {                                              \
        return unary(b, OP, (ms_op_attrs){0}, err);                                                \
    }
UNARY(map_relu, MS_OP_RELU)
UNARY(map_sigmoid, MS_OP_SIGMOID)
UNARY(map_tanh, MS_OP_TANH)
UNARY(map_exp, MS_OP_EXP)
UNARY(map_log, MS_OP_LOG)
UNARY(map_sqrt, MS_OP_SQRT)
UNARY(map_neg, MS_OP_NEG)
UNARY(map_abs, MS_OP_ABS)
UNARY(map_reciprocal, MS_OP_RECIPROCAL)
UNARY(map_sin, MS_OP_SIN)
UNARY(map_cos, MS_OP_COS)
UNARY(map_erf, MS_OP_ERF)
UNARY(map_atan, MS_OP_ATAN)
UNARY(map_sign, MS_OP_SIGN)
UNARY(map_softsign, MS_OP_SOFTSIGN)
UNARY(map_softplus, MS_OP_SOFTPLUS)
UNARY(map_hardswish, MS_OP_HARDSWISH)

static ms_status map_leaky_relu(ox_build *b, ms_error *err) {
    return unary(b, MS_OP_LEAKY_RELU, (ms_op_attrs){.f = {ox_attr_f(b, "alpha", 0.01f)}}, err);
}
static ms_status map_elu(ox_build *b, ms_error *err) {
    return unary(b, MS_OP_ELU, (ms_op_attrs){.f = {ox_attr_f(b, "alpha", 1.0f)}}, err);
}
/* The SNN constants: meshscope's selu; others: gamma elu_alpha(x). */
static ms_status map_selu(ox_build *b, ms_error *err) {
    float al = ox_attr_f(b, "alpha", 1.67326319217681884765625f);
    float ga = ox_attr_f(b, "gamma", 1.05070102214813232421875f);
    if (fabsf(al - 1.6732632f) <= 1e-6f && fabsf(ga - 1.0507010f) <= 1e-6f)
        return unary(b, MS_OP_SELU, (ms_op_attrs){0}, err);
    int x, e, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    ms_op_attrs a = {.f = {al}}, s = {.f = {ga}};
    OX_OP(e, MS_OP_ELU, &a, -1, x);
    OX_OP(y, MS_OP_SCALE, &s, 0, e);
    ox_out(b, 0, y);
    return MS_OK;
}
/* max(0, min(1, alpha x + beta)): beta 0.5 is relu6(6 alpha x + 3) / 6, meshscope's
 * hardsigmoid of 6 alpha x; another beta adds it first. */
static ms_status map_hardsigmoid(ox_build *b, ms_error *err) {
    float al = ox_attr_f(b, "alpha", 0.2f), be = ox_attr_f(b, "beta", 0.5f);
    int x, s, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    ms_op_attrs a = {.f = {6.0f * al}};
    OX_OP(s, MS_OP_SCALE, &a, -1, x);
    if (be != 0.5f) {
        s = add_scalar(b, s, 6.0f * be - 3.0f, -1, err);
        if (s < 0) return err->code;
    }
    OX_OP(y, MS_OP_HARDSIGMOID, NULL, 0, s);
    ox_out(b, 0, y);
    return MS_OK;
}
static int per_channel(ox_build *b, int v, int r, ms_error *err);

/* x >= 0 ? x : slope x, as relu(x) - slope relu(-x) (both exact). */
static ms_status map_prelu(ox_build *b, ms_error *err) {
    int x, sl, p, nx, q, m, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &sl, err));
    int r = rank_of(b, x); /* opset < 7: a [C] slope is per channel (dim 1) */
    if (b->m->opset < 7 && rank_of(b, sl) == 1 && r > 2 && (sl = per_channel(b, sl, r, err)) < 0)
        return err->code;
    OX_OP(p, MS_OP_RELU, NULL, -1, x);
    OX_OP(nx, MS_OP_NEG, NULL, -1, x);
    OX_OP(q, MS_OP_RELU, NULL, -1, nx);
    OX_OP(m, MS_OP_MUL_BCAST, NULL, -1, q, sl);
    OX_OP(y, MS_OP_SUB, NULL, 0, p, m);
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_clip(ox_build *b, ms_error *err) {
    float lo = ox_attr_f(b, "min", -FLT_MAX), hi = ox_attr_f(b, "max", FLT_MAX);
    for (int k = 1; k <= 2; k++) {
        if (!ox_has(b, k)) continue;
        const ox_const *c;
        MS_CHECK(ox_const_in(b, k, &c, err));
        if (c->numel != 1) return ox_fail(b, MS_ERR_INVALID, err, "input %d must be a scalar", k);
        *(k == 1 ? &lo : &hi) = c->f[0];
    }
    return unary(b, MS_OP_CLAMP, (ms_op_attrs){.f = {lo, hi}}, err);
}

static ms_status map_identity(ox_build *b, ms_error *err) {
    int x, y;
    ms_shape es;
    if (empty_in(b, 0, &es)) {
        empty_out(b, 0, es.ndim, es.d);
        return MS_OK;
    }
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape *s = ox_shape(b, x);
    y = reshape(b, x, s->ndim, s->d, 0, err);
    if (y < 0) return err->code;
    ox_out(b, 0, y);
    return MS_OK;
}

/* MT19937, as numpy's legacy RandomState seeds it with an integer. */
typedef struct mt19937 {
    uint32_t mt[624];
    int i;
} mt19937;

static void mt_seed(mt19937 *m, uint32_t seed) {
    m->mt[0] = seed;
    for (int i = 1; i < 624; i++)
        m->mt[i] = 1812433253u * (m->mt[i - 1] ^ (m->mt[i - 1] >> 30)) + (uint32_t)i;
    m->i = 624;
}

static uint32_t mt_next(mt19937 *m) {
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->mt[k] & 0x80000000u) | (m->mt[(k + 1) % 624] & 0x7fffffffu);
            m->mt[k] = m->mt[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    uint32_t y = m->mt[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* A double in [0, 1) from 53 random bits, as numpy's random_sample. */
static double mt_double(mt19937 *m) {
    uint32_t a = mt_next(m) >> 5, c = mt_next(m) >> 6;
    return ((double)a * 67108864.0 + (double)c) / 9007199254740992.0;
}

/* Dropout's ratio and whether it drops (training_mode, or is_test=0 before opset 7). */
static ms_status dropout_mode(ox_build *b, float *ratio, bool *train, ms_error *err) {
    *ratio = ox_attr_f(b, "ratio", 0.5f);
    *train = b->m->opset < 7 && !ox_attr_i(b, "is_test", 0);
    if (ox_has(b, 1)) {
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 1, &c, err));
        if (c->numel) *ratio = c->f[0];
    }
    if (ox_has(b, 2)) {
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 2, &c, err));
        *train = c->numel && c->d[0] != 0;
    }
    if (*ratio < 0.0f || *ratio >= 1.0f)
        return ox_fail(b, MS_ERR_INVALID, err, "ratio %g is outside [0, 1)", (double)*ratio);
    return MS_OK;
}

/* Inference (or ratio 0): the identity, with a mask of ones. Training with a seed attribute:
 * the mask ONNX's reference draws (numpy's MT19937 seeded with it, kept where uniform(0, 1) >=
 * ratio, the kept values scaled by 1 / (1 - ratio)), the same on every forward, as the
 * reference reseeds on every call. Training without a seed (what PyTorch exports): meshscope's
 * dropout, a fresh mask every training step; its mask output is refused. */
static ms_status map_dropout(ox_build *b, ms_error *err) {
    float ratio;
    bool train, want_mask = b->node->n_output > 1 && b->node->output[1][0];
    int x, y, mask = -1;
    MS_CHECK(dropout_mode(b, &ratio, &train, err));
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape s = *ox_shape(b, x);
    if (!train || ratio == 0.0f) {
        if (want_mask && (mask = fill_like(b, x, 1.0f, err)) < 0) return err->code;
        if ((y = reshape(b, x, s.ndim, s.d, 0, err)) < 0) return err->code;
    } else if (ox_attr(b, "seed")) {
        int64_t n = 1;
        for (int d = 0; d < s.ndim; d++) n *= s.d[d];
        float *f = xmalloc(sizeof(float) * (size_t)(n + 1)), scale = 1.0f / (1.0f - ratio);
        mt19937 m;
        mt_seed(&m, (uint32_t)ox_attr_i(b, "seed", 0));
        for (int64_t i = 0; i < n; i++) f[i] = mt_double(&m) >= (double)ratio ? scale : 0.0f;
        int keep = const_value(b, s.ndim, s.d, f, err), zero;
        free(f);
        if (keep < 0) return err->code;
        OX_OP(y, MS_OP_MUL, NULL, 0, x, keep);
        if (want_mask && (zero = fill_like(b, keep, 0.0f, err)) < 0) return err->code;
        if (want_mask) OX_OP(mask, MS_OP_NE, NULL, 1, keep, zero);
    } else {
        if (want_mask)
            return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                           "the mask output of a training dropout without a seed is not "
                           "supported; use the output only");
        ms_op_attrs a = {.f = {ratio}}; /* a stream per node: the node's index */
        const Onnx__GraphProto *g = b->m->pb->graph;
        for (size_t i = 0; i < g->n_node; i++)
            if (g->node[i] == b->node) a.i[0] = (int64_t)i;
        OX_OP(y, MS_OP_DROPOUT, &a, 0, x);
    }
    ox_out(b, 0, y);
    if (mask >= 0) ox_out(b, 1, mask);
    return MS_OK;
}

/* A product or quotient by a constant scalar is a scale, not a parameter: an exported
 * training graph's constants (attention's 1 / sqrt(d), say) must not train. */
static bool scalar_const(ox_build *b, int k, double *v) {
    const ox_const *c = NULL;
    ms_error e = {0};
    if (!ox_is_const(b, k) || ox_const_in(b, k, &c, &e) != MS_OK || c->numel != 1) return false;
    /* the other input's rank must hold the result's: [1, 1] * [3] broadcasts to [1, 3] */
    const ox_const *o = NULL;
    int v_other;
    if (ox_is_const(b, 1 - k) && ox_const_in(b, 1 - k, &o, &e) == MS_OK)
        return false; /* both constant: folded as data elsewhere */
    if (ox_val(b, 1 - k, &v_other, &e) != MS_OK || ox_shape(b, v_other)->ndim < c->ndim)
        return false;
    *v = c->d[0];
    return true;
}

static bool scale_by_const(ox_build *b, int op, ms_error *err, ms_status *st) {
    double c;
    int k = op == MS_OP_MUL_BCAST && scalar_const(b, 0, &c)                        ? 1
            : (op == MS_OP_MUL_BCAST || op == MS_OP_DIV) && scalar_const(b, 1, &c) ? 0
                                                                                   : -1;
    if (k < 0 || (op == MS_OP_DIV && c == 0)) return false;
    int x, z;
    *st = ox_val(b, k, &x, err);
    if (*st != MS_OK) return true;
    ms_op_attrs a = {.f = {(float)(op == MS_OP_DIV ? 1.0 / c : c)}};
    const int in[1] = {x};
    if ((z = ox_op(b, MS_OP_SCALE, &a, 1, in, 0, err)) < 0) {
        *st = err->code;
        return true;
    }
    ox_out(b, 0, z);
    *st = MS_OK;
    return true;
}

static ms_status binary(ox_build *b, int op, ms_error *err) {
    int x, y, z;
    ms_status st;
    if (scale_by_const(b, op, err, &st)) return st;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &y, err));
    /* opset < 7: broadcast=1 with axis aligns B's dims at A's dim axis (trailing ones added) */
    const ms_shape xs = *ox_shape(b, x), ys = *ox_shape(b, y);
    int64_t ax = ox_attr_i(b, "axis", -1);
    if (ox_attr_i(b, "broadcast", 0) && ox_attr(b, "axis") && ax >= 0 && ax + ys.ndim < xs.ndim) {
        int64_t sh[MS_MAX_DIMS];
        int nd = (int)(xs.ndim - ax);
        for (int d = 0; d < nd; d++) sh[d] = d < ys.ndim ? ys.d[d] : 1;
        if ((y = reshape(b, y, nd, sh, -1, err)) < 0) return err->code;
    }
    /* a residual add whose only reader is the ReLU after it: one pass instead of two */
    const bool relu = op == MS_OP_ADD_BCAST && ox_relu_follows(b);
    OX_OP(z, relu ? MS_OP_ADD_RELU : op, NULL, 0, x, y);
    ox_out(b, 0, z);
    if (relu) b->fused_relu = z;
    return MS_OK;
}
#define BINARY(fn, OP)                                                                             \
    static ms_status fn(ox_build *b, ms_error *err) {                                              \
        return binary(b, OP, err);                                                                 \
    }
BINARY(map_add, MS_OP_ADD_BCAST)
BINARY(map_sub, MS_OP_SUB)
BINARY(map_mul, MS_OP_MUL_BCAST)
BINARY(map_div, MS_OP_DIV)
BINARY(map_equal, MS_OP_EQ)
BINARY(map_less, MS_OP_LT)
BINARY(map_greater, MS_OP_GT)
BINARY(map_less_equal, MS_OP_LE)
BINARY(map_greater_equal, MS_OP_GE)
BINARY(map_and, MS_OP_MUL_BCAST) /* bools as 0/1 */
BINARY(map_or, MS_OP_MAXIMUM)
BINARY(map_xor, MS_OP_NE)

static ms_status map_not(ox_build *b, ms_error *err) {
    int x, z, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    ms_op_attrs a = {.f = {0.0f}};
    OX_OP(z, MS_OP_SCALE, &a, -1, x);
    OX_OP(y, MS_OP_EQ, NULL, 0, x, z);
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_pow(ox_build *b, ms_error *err) {
    if (ox_is_const(b, 1)) {
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 1, &c, err));
        if (c->numel == 1) return unary(b, MS_OP_POW_SCALAR, (ms_op_attrs){.f = {c->f[0]}}, err);
    }
    return binary(b, MS_OP_POW, err);
}

static ms_status map_where(ox_build *b, ms_error *err) {
    int c, x, y, z;
    MS_CHECK(ox_val(b, 0, &c, err));
    MS_CHECK(ox_val(b, 1, &x, err));
    MS_CHECK(ox_val(b, 2, &y, err));
    OX_OP(z, MS_OP_WHERE, NULL, 0, c, x, y);
    ox_out(b, 0, z);
    return MS_OK;
}

/* Max, Min, Sum, Mean over their inputs (a chain of binary operators). */
static ms_status variadic(ox_build *b, int op, bool mean, ms_error *err) {
    int n = (int)b->node->n_input, acc;
    MS_CHECK(ox_val(b, 0, &acc, err));
    if (n == 1) return map_identity(b, err);
    for (int k = 1; k < n; k++) {
        int x;
        MS_CHECK(ox_val(b, k, &x, err));
        OX_OP(acc, op, NULL, k == n - 1 && !mean ? 0 : -1, acc, x);
    }
    if (mean) {
        ms_op_attrs a = {.f = {1.0f / (float)n}};
        OX_OP(acc, MS_OP_SCALE, &a, 0, acc);
    }
    ox_out(b, 0, acc);
    return MS_OK;
}
static ms_status map_max(ox_build *b, ms_error *err) {
    return variadic(b, MS_OP_MAXIMUM, false, err);
}
static ms_status map_min(ox_build *b, ms_error *err) {
    return variadic(b, MS_OP_MINIMUM, false, err);
}
static ms_status map_sum(ox_build *b, ms_error *err) {
    return variadic(b, MS_OP_ADD_BCAST, false, err);
}
static ms_status map_mean(ox_build *b, ms_error *err) {
    return variadic(b, MS_OP_ADD_BCAST, true, err);
}

/* --- shapes ---------------------------------------------------------------------------------- */

static ms_status map_reshape(ox_build *b, ms_error *err) {
    int x = -1, y, nd;
    ms_shape es;
    bool empty = empty_in(b, 0, &es);
    if (!empty) MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape *s = empty ? &es : ox_shape(b, x);
    int64_t sh[MS_MAX_DIMS + 1], known = 1, total = 1;
    if ((nd = ox_attr_ints(b, "shape", sh, MS_MAX_DIMS + 1)) < 0) { /* opset < 5: an attribute */
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 1, &c, err));
        nd = const_ints(c, sh, MS_MAX_DIMS + 1);
    }
    int neg = -1;
    bool allowzero = ox_attr_i(b, "allowzero", 0) != 0;
    if (nd > MS_MAX_DIMS) return ox_fail(b, MS_ERR_UNSUPPORTED, err, "more than 8 dims");
    for (int d = 0; d < s->ndim; d++) total *= s->d[d];
    for (int d = 0; d < nd; d++) {
        if (sh[d] == 0 && !allowzero) {
            if (d >= s->ndim) return ox_fail(b, MS_ERR_INVALID, err, "0 copies a missing dim");
            sh[d] = s->d[d];
        }
        if (sh[d] == -1 && neg < 0)
            neg = d;
        else if (sh[d] < 0 || (sh[d] == 0 && !empty))
            return ox_fail(b, MS_ERR_UNSUPPORTED, err, "shape entry %lld at %d is not supported",
                           (long long)sh[d], d);
        else
            known *= sh[d];
    }
    if (neg >= 0) sh[neg] = known ? total / known : 0;
    if (empty) {
        empty_out(b, 0, nd, sh);
        return MS_OK;
    }
    y = reshape(b, x, nd, sh, 0, err);
    if (y < 0) return err->code;
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_flatten(ox_build *b, ms_error *err) {
    int x, y, ax;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape *s = ox_shape(b, x);
    int64_t axis = ox_attr_i(b, "axis", 1);
    if (axis == s->ndim)
        ax = s->ndim;
    else
        MS_CHECK(norm_axis(b, axis, s->ndim, &ax, err));
    int64_t sh[2] = {1, 1};
    for (int d = 0; d < s->ndim; d++) sh[d >= ax] *= s->d[d];
    y = reshape(b, x, 2, sh, 0, err);
    if (y < 0) return err->code;
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_transpose(ox_build *b, ms_error *err) {
    int x, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    int r = rank_of(b, x);
    int64_t perm[MS_MAX_DIMS + 1];
    int n = ox_attr_ints(b, "perm", perm, MS_MAX_DIMS + 1);
    if (n < 0)
        for (int d = 0; d < r; d++) perm[d] = r - 1 - d;
    else if (n != r)
        return ox_fail(b, MS_ERR_INVALID, err, "perm has %d entries for a rank-%d input", n, r);
    ms_op_attrs a = {0};
    for (int d = 0; d < r; d++) a.i[d] = perm[d];
    OX_OP(y, MS_OP_PERMUTE, &a, 0, x);
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_squeeze(ox_build *b, ms_error *err) {
    int x, y;
    ms_status st;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape *s = ox_shape(b, x);
    int64_t axes[MS_MAX_DIMS + 1], sh[MS_MAX_DIMS];
    int n = node_axes(b, 1, axes, err, &st), nd = 0;
    MS_CHECK(st);
    bool drop[MS_MAX_DIMS] = {0};
    for (int i = 0; i < n && i <= MS_MAX_DIMS; i++) {
        int ax;
        MS_CHECK(norm_axis(b, axes[i], s->ndim, &ax, err));
        if (s->d[ax] != 1)
            return ox_fail(b, MS_ERR_INVALID, err, "dim %d has size %lld, not 1", ax,
                           (long long)s->d[ax]);
        drop[ax] = true;
    }
    for (int d = 0; d < s->ndim; d++)
        if (!(n < 0 ? s->d[d] == 1 : drop[d])) sh[nd++] = s->d[d];
    y = reshape(b, x, nd, sh, 0, err);
    if (y < 0) return err->code;
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_unsqueeze(ox_build *b, ms_error *err) {
    int x, y;
    ms_status st;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape *s = ox_shape(b, x);
    int64_t axes[MS_MAX_DIMS + 1], sh[MS_MAX_DIMS];
    int n = node_axes(b, 1, axes, err, &st);
    MS_CHECK(st);
    int r = s->ndim + n;
    if (n < 0 || r > MS_MAX_DIMS)
        return ox_fail(b, MS_ERR_UNSUPPORTED, err, "needs axes and a result of at most 8 dims");
    bool ins[MS_MAX_DIMS] = {0};
    for (int i = 0; i < n; i++) {
        int ax;
        MS_CHECK(norm_axis(b, axes[i], r, &ax, err));
        ins[ax] = true;
    }
    for (int d = 0, j = 0; d < r; d++) sh[d] = ins[d] ? 1 : s->d[j++];
    y = reshape(b, x, r, sh, 0, err);
    if (y < 0) return err->code;
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_concat(ox_build *b, ms_error *err) {
    int n = (int)b->node->n_input, acc = -1, ax;
    int first;
    MS_CHECK(ox_val(b, 0, &first, err));
    MS_CHECK(
        norm_axis(b, ox_attr_i(b, "axis", b->m->opset < 4 ? 1 : 0), rank_of(b, first), &ax, err));
    ms_op_attrs a = {.i = {ax}};
    for (int k = 0; k < n;) {
        int in[MS_OP_MAX_IN], m = 0;
        if (acc >= 0) in[m++] = acc;
        while (m < MS_OP_MAX_IN && k < n) MS_CHECK(ox_val(b, k++, &in[m++], err));
        acc = m == 1 ? reshape(b, in[0], ox_shape(b, in[0])->ndim, ox_shape(b, in[0])->d,
                               k == n ? 0 : -1, err)
                     : ox_op(b, MS_OP_CONCAT, &a, m, in, k == n ? 0 : -1, err);
        if (acc < 0) return err->code;
    }
    ox_out(b, 0, acc);
    return MS_OK;
}

static ms_status map_split(ox_build *b, ms_error *err) {
    int x = -1, ax, n = (int)b->node->n_output;
    ms_shape es;
    bool empty = empty_in(b, 0, &es);
    if (!empty) MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape *s = empty ? &es : ox_shape(b, x);
    MS_CHECK(norm_axis(b, ox_attr_i(b, "axis", 0), s->ndim, &ax, err));
    int64_t parts[64];
    int np = ox_attr_ints(b, "split", parts, 64);
    if (np < 0 && ox_has(b, 1)) {
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 1, &c, err));
        np = const_ints(c, parts, 64);
    }
    if (n > 64 || (np >= 0 && np != n))
        return ox_fail(b, MS_ERR_INVALID, err, "%d outputs for %d split sizes", n, np);
    if (np < 0) {
        if (s->d[ax] % n)
            return ox_fail(b, MS_ERR_INVALID, err, "dim %lld does not split in %d equal parts",
                           (long long)s->d[ax], n);
        for (int k = 0; k < n; k++) parts[k] = s->d[ax] / n;
    }
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        if (parts[k] < 0)
            return ox_fail(b, MS_ERR_INVALID, err, "split size %lld", (long long)parts[k]);
        if (empty || parts[k] == 0) { /* an empty output */
            ms_shape o = *s;
            o.d[ax] = parts[k];
            empty_out(b, k, o.ndim, o.d);
            start += parts[k];
            continue;
        }
        ms_op_attrs a = {.i = {ax, start, parts[k]}};
        int y;
        OX_OP(y, MS_OP_NARROW, &a, k, x);
        ox_out(b, k, y);
        start += parts[k];
    }
    if (start != s->d[ax])
        return ox_fail(b, MS_ERR_INVALID, err, "split sizes add up to %lld, the dim is %lld",
                       (long long)start, (long long)s->d[ax]);
    return MS_OK;
}

static int64_t clamp_index(int64_t i, int64_t n) {
    if (i < 0) i += n;
    return i < 0 ? 0 : i > n ? n : i;
}

/* How many elements start, start + step, ... short of end a dim of n holds, with ONNX's
 * clamping (start and end made so in place). */
static int64_t slice_range(int64_t n, int64_t *start, int64_t *end, int64_t step) {
    int64_t lo_lim = step < 0 ? -1 : 0, hi_lim = step < 0 ? n - 1 : n, a = *start, e = *end;
    if (a < 0) a = a < INT64_MIN / 2 ? INT64_MIN / 2 : a + n;
    if (e < 0) e = e < INT64_MIN / 2 ? INT64_MIN / 2 : e + n;
    *start = a = a < lo_lim ? lo_lim : a > hi_lim ? hi_lim : a;
    *end = e = e < lo_lim ? lo_lim : e > hi_lim ? hi_lim : e;
    int64_t cnt = step > 0 ? (e - a + step - 1) / step : (a - e - step - 1) / -step;
    return cnt > 0 ? cnt : 0;
}

/* Elements start, start + step, ... short of end along dim d (step != 1, either sign, ONNX's
 * clamping), as an index_select at constant ids. */
static int slice_step(ox_build *b, int x, int d, int64_t start, int64_t end, int64_t step, int k,
                      ms_error *err) {
    int64_t cnt = slice_range(ox_shape(b, x)->d[d], &start, &end, step);
    float *ids = xmalloc(sizeof(float) * (size_t)cnt);
    for (int64_t j = 0; j < cnt; j++) ids[j] = (float)(start + j * step);
    int c = const_value(b, 1, &cnt, ids, err);
    free(ids);
    if (c < 0) return -1;
    ms_op_attrs a = {.i = {d}};
    int in[2] = {x, c};
    return ox_op(b, MS_OP_INDEX_SELECT, &a, 2, in, k, err);
}

/* A Slice's starts, ends, axes (normalised) and steps (1 when absent). */
typedef struct slice_args {
    int n;
    int ax[MS_MAX_DIMS + 1];
    int64_t st[MS_MAX_DIMS + 1], en[MS_MAX_DIMS + 1], sp[MS_MAX_DIMS + 1];
} slice_args;

static ms_status slice_read(ox_build *b, int r, slice_args *s, ms_error *err) {
    int64_t ax[MS_MAX_DIMS + 1];
    int n, na = -1, ns = -1;
    if (ox_attr(b, "starts")) {
        n = ox_attr_ints(b, "starts", s->st, MS_MAX_DIMS + 1);
        if (ox_attr_ints(b, "ends", s->en, MS_MAX_DIMS + 1) != n)
            return ox_fail(b, MS_ERR_INVALID, err, "starts and ends differ in length");
        na = ox_attr_ints(b, "axes", ax, MS_MAX_DIMS + 1);
    } else {
        const ox_const *c[5] = {0};
        for (int k = 1; k < 5; k++)
            if (ox_has(b, k)) MS_CHECK(ox_const_in(b, k, &c[k], err));
        if (!c[1] || !c[2]) return ox_fail(b, MS_ERR_INVALID, err, "needs starts and ends");
        n = const_ints(c[1], s->st, MS_MAX_DIMS + 1);
        if (const_ints(c[2], s->en, MS_MAX_DIMS + 1) != n)
            return ox_fail(b, MS_ERR_INVALID, err, "starts and ends differ in length");
        if (c[3]) na = const_ints(c[3], ax, MS_MAX_DIMS + 1);
        if (c[4]) ns = const_ints(c[4], s->sp, MS_MAX_DIMS + 1);
    }
    if (n > r || (na >= 0 && na != n) || (ns >= 0 && ns != n))
        return ox_fail(b, MS_ERR_INVALID, err, "starts, ends, axes and steps disagree");
    s->n = n;
    for (int i = 0; i < n; i++) {
        MS_CHECK(norm_axis(b, na >= 0 ? ax[i] : i, r, &s->ax[i], err));
        if (ns < 0) s->sp[i] = 1;
        if (s->sp[i] == 0) return ox_fail(b, MS_ERR_INVALID, err, "step 0 at %d", i);
    }
    return MS_OK;
}

/* Steps of 1 are slices, others an index_select at constant ids; an empty result (or input)
 * is an empty constant. */
static ms_status map_slice(ox_build *b, ms_error *err) {
    int x = -1;
    ms_shape es;
    bool empty = empty_in(b, 0, &es);
    if (!empty) MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape s0 = empty ? es : *ox_shape(b, x);
    slice_args a;
    MS_CHECK(slice_read(b, s0.ndim, &a, err));
    ms_shape o = s0;
    for (int i = 0; i < a.n; i++) {
        int64_t st = a.st[i], en = a.en[i];
        o.d[a.ax[i]] = slice_range(s0.d[a.ax[i]], &st, &en, a.sp[i]);
        empty |= o.d[a.ax[i]] == 0;
    }
    if (empty) {
        empty_out(b, 0, o.ndim, o.d);
        return MS_OK;
    }
    int v = x;
    for (int i = 0; i < a.n; i++) {
        int d = a.ax[i], k = i == a.n - 1 ? 0 : -1;
        if (a.sp[i] != 1) {
            if ((v = slice_step(b, v, d, a.st[i], a.en[i], a.sp[i], k, err)) < 0) return err->code;
            continue;
        }
        int64_t dim = ox_shape(b, v)->d[d];
        ms_op_attrs at = {.i = {d, clamp_index(a.st[i], dim), clamp_index(a.en[i], dim)}};
        OX_OP(v, MS_OP_SLICE, &at, k, v);
    }
    if (v == x) return map_identity(b, err);
    ox_out(b, 0, v);
    return MS_OK;
}

static ms_status map_expand(ox_build *b, ms_error *err) {
    int x, y;
    const ox_const *c;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_const_in(b, 1, &c, err));
    const ms_shape *s = ox_shape(b, x);
    int64_t want[MS_MAX_DIMS + 1], in[MS_MAX_DIMS];
    int nw = const_ints(c, want, MS_MAX_DIMS + 1);
    int r = nw > s->ndim ? nw : s->ndim;
    if (r > MS_MAX_DIMS) return ox_fail(b, MS_ERR_UNSUPPORTED, err, "more than 8 dims");
    ms_op_attrs a = {0};
    for (int d = 0; d < r; d++) {
        int di = d - (r - s->ndim), dw = d - (r - nw);
        in[d] = di >= 0 ? s->d[di] : 1;
        int64_t w = dw >= 0 ? want[dw] : 1;
        if (in[d] != 1 && w != 1 && w != in[d])
            return ox_fail(b, MS_ERR_INVALID, err, "shape does not broadcast at dim %d", d);
        a.i[d] = in[d] == 1 ? w : in[d];
    }
    int v = x;
    if (r != s->ndim) {
        v = reshape(b, x, r, in, -1, err);
        if (v < 0) return err->code;
    }
    OX_OP(y, MS_OP_EXPAND, &a, 0, v);
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_tile(ox_build *b, ms_error *err) {
    int x, y;
    const ox_const *c;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_const_in(b, 1, &c, err));
    int64_t rep[MS_MAX_DIMS + 1];
    int n = const_ints(c, rep, MS_MAX_DIMS + 1);
    if (n != rank_of(b, x)) return ox_fail(b, MS_ERR_INVALID, err, "repeats must match the rank");
    ms_op_attrs a = {0};
    for (int d = 0; d < n; d++) a.i[d] = rep[d];
    OX_OP(y, MS_OP_REPEAT, &a, 0, x);
    ox_out(b, 0, y);
    return MS_OK;
}

/* x along axis at the ids: index_select on the flattened ids, then their shape in place of
 * the axis. Negative constant ids count from the end; ids computed at run time must be in
 * 0..n-1 (meshscope's ids are >= 0). */
static ms_status map_gather(ox_build *b, ms_error *err) {
    int x, ids = -1, ax, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape xs = *ox_shape(b, x);
    MS_CHECK(norm_axis(b, ox_attr_i(b, "axis", 0), xs.ndim, &ax, err));
    if (ox_is_const(b, 1)) {
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 1, &c, err));
        bool neg = false;
        for (int64_t i = 0; i < c->numel; i++) {
            if (c->d[i] < -(double)xs.d[ax] || c->d[i] >= (double)xs.d[ax])
                return ox_fail(b, MS_ERR_INVALID, err, "index %g is outside -%lld..%lld", c->d[i],
                               (long long)xs.d[ax], (long long)xs.d[ax] - 1);
            neg |= c->d[i] < 0;
        }
        if (neg) {
            float *f = xmalloc(sizeof(float) * (size_t)(c->numel + 1));
            for (int64_t i = 0; i < c->numel; i++)
                f[i] = (float)(c->d[i] < 0 ? c->d[i] + (double)xs.d[ax] : c->d[i]);
            ids = const_value(b, c->ndim, c->shape, f, err);
            free(f);
            if (ids < 0) return err->code;
        }
    }
    if (ids < 0) MS_CHECK(ox_val(b, 1, &ids, err));
    const ms_shape is = *ox_shape(b, ids);
    int64_t L = 1, sh[MS_MAX_DIMS];
    for (int d = 0; d < is.ndim; d++) L *= is.d[d];
    int r = xs.ndim - 1 + is.ndim;
    if (r > MS_MAX_DIMS) return ox_fail(b, MS_ERR_UNSUPPORTED, err, "more than 8 dims");
    int flat = ids;
    if (is.ndim != 1) {
        flat = reshape(b, ids, 1, &L, -1, err);
        if (flat < 0) return err->code;
    }
    ms_op_attrs a = {.i = {ax}};
    OX_OP(y, MS_OP_INDEX_SELECT, &a, is.ndim == 1 ? 0 : -1, x, flat);
    if (is.ndim != 1) {
        int j = 0;
        for (int d = 0; d < ax; d++) sh[j++] = xs.d[d];
        for (int d = 0; d < is.ndim; d++) sh[j++] = is.d[d];
        for (int d = ax + 1; d < xs.ndim; d++) sh[j++] = xs.d[d];
        y = reshape(b, y, r, sh, 0, err);
        if (y < 0) return err->code;
    }
    ox_out(b, 0, y);
    return MS_OK;
}

/* --- reductions ------------------------------------------------------------------------------ */

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_L1, R_L2, R_LSE, R_SUMSQ, R_LOGSUM } red_kind;

static ms_status reduce(ox_build *b, red_kind kind, ms_error *err) {
    int x, y;
    ms_status st;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape *s = ox_shape(b, x);
    int64_t axes[MS_MAX_DIMS + 1];
    int n = node_axes(b, 1, axes, err, &st);
    MS_CHECK(st);
    bool keep = ox_attr_i(b, "keepdims", 1) != 0;
    if (n <= 0 && ox_attr_i(b, "noop_with_empty_axes", 0)) return map_identity(b, err);
    unsigned mask = 0;
    for (int i = 0; i < n; i++) {
        int ax;
        MS_CHECK(norm_axis(b, axes[i], s->ndim, &ax, err));
        mask |= 1u << ax;
    }
    if (n <= 0) mask = (1u << s->ndim) - 1;
    static const int ops[] = {MS_OP_SUM_DIMS, MS_OP_MEAN_DIMS, MS_OP_MAX_DIMS, MS_OP_MIN_DIMS,
                              MS_OP_PROD,     MS_OP_SUM_DIMS,  MS_OP_NORM,     MS_OP_LOGSUMEXP,
                              MS_OP_SUM_DIMS, MS_OP_SUM_DIMS};
    int v = x;
    if (kind == R_L1) OX_OP(v, MS_OP_ABS, NULL, -1, x);
    if (kind == R_SUMSQ) OX_OP(v, MS_OP_SQUARE, NULL, -1, x);
    ms_op_attrs a = {.i = {mask, keep}};
    OX_OP(y, ops[kind], &a, kind == R_LOGSUM ? -1 : 0, v);
    if (kind == R_LOGSUM) OX_OP(y, MS_OP_LOG, NULL, 0, y);
    ox_out(b, 0, y);
    return MS_OK;
}
#define REDUCE(fn, K)                                                                              \
    static ms_status fn(ox_build *b, ms_error *err) {                                              \
        return reduce(b, K, err);                                                                  \
    }
REDUCE(map_reduce_sum, R_SUM)
REDUCE(map_reduce_mean, R_MEAN)
REDUCE(map_reduce_max, R_MAX)
REDUCE(map_reduce_min, R_MIN)
REDUCE(map_reduce_prod, R_PROD)
REDUCE(map_reduce_l1, R_L1)
REDUCE(map_reduce_l2, R_L2)
REDUCE(map_reduce_lse, R_LSE)
REDUCE(map_reduce_sumsq, R_SUMSQ)
REDUCE(map_reduce_logsum, R_LOGSUM)

static ms_status arg_reduce(ox_build *b, int op, ms_error *err) {
    int x, y, ax;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(norm_axis(b, ox_attr_i(b, "axis", 0), rank_of(b, x), &ax, err));
    bool last = ox_attr_i(b, "select_last_index", 0) != 0;
    ms_op_attrs a = {.i = {ax, ox_attr_i(b, "keepdims", 1) != 0}}, f = {.i = {1 << ax}};
    int64_t n = ox_shape(b, x)->d[ax];
    /* the last extreme: the first one of the flipped axis, at n - 1 - its index */
    if (last) OX_OP(x, MS_OP_FLIP, &f, -1, x);
    OX_OP(y, op, &a, last ? -1 : 0, x);
    if (last) {
        OX_OP(y, MS_OP_NEG, NULL, -1, y);
        if ((y = add_scalar(b, y, (float)(n - 1), 0, err)) < 0) return err->code;
    }
    ox_out(b, 0, y);
    return MS_OK;
}
static ms_status map_argmax(ox_build *b, ms_error *err) {
    return arg_reduce(b, MS_OP_ARGMAX, err);
}
static ms_status map_argmin(ox_build *b, ms_error *err) {
    return arg_reduce(b, MS_OP_ARGMIN, err);
}

/* --- linear algebra ------------------------------------------------------------------------- */

static ms_status map_matmul(ox_build *b, ms_error *err) {
    int x, w, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &w, err));
    ms_shape xs = *ox_shape(b, x), ws = *ox_shape(b, w);
    bool x1 = xs.ndim == 1, w1 = ws.ndim == 1;
    if (x1) {
        int64_t sh[2] = {1, xs.d[0]};
        if ((x = reshape(b, x, 2, sh, -1, err)) < 0) return err->code;
    }
    if (w1) {
        int64_t sh[2] = {ws.d[0], 1};
        if ((w = reshape(b, w, 2, sh, -1, err)) < 0) return err->code;
    }
    bool last = !x1 && !w1;
    if (!w1 && ws.ndim == 2)
        OX_OP(y, MS_OP_MATMUL, NULL, last ? 0 : -1, x, w);
    else
        OX_OP(y, MS_OP_BMM, NULL, last ? 0 : -1, x, w);
    if (!last) {
        ms_shape ys = *ox_shape(b, y);
        int64_t sh[MS_MAX_DIMS];
        int nd = 0;
        for (int d = 0; d < ys.ndim; d++)
            if (!((x1 && d == ys.ndim - 2) || (w1 && d == ys.ndim - 1))) sh[nd++] = ys.d[d];
        if ((y = reshape(b, y, nd, sh, 0, err)) < 0) return err->code;
    }
    ox_out(b, 0, y);
    return MS_OK;
}

/* alpha op(A) op(B) + beta C */
static ms_status map_gemm(ox_build *b, ms_error *err) {
    int x, w, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &w, err));
    float alpha = ox_attr_f(b, "alpha", 1.0f), beta = ox_attr_f(b, "beta", 1.0f);
    bool has_c = ox_has(b, 2) && beta != 0.0f, scale = alpha != 1.0f;
    if (ox_attr_i(b, "transA", 0)) {
        ms_op_attrs t = {.i = {0, 1}};
        OX_OP(x, MS_OP_TRANSPOSE, &t, -1, x);
    }
    ms_op_attrs m = {.i = {ox_attr_i(b, "transB", 0) != 0}};
    OX_OP(y, MS_OP_MATMUL, &m, has_c || scale ? -1 : 0, x, w);
    if (scale) {
        ms_op_attrs s = {.f = {alpha}};
        OX_OP(y, MS_OP_SCALE, &s, has_c ? -1 : 0, y);
    }
    if (has_c) {
        int c;
        MS_CHECK(ox_val(b, 2, &c, err));
        if (beta != 1.0f) {
            ms_op_attrs s = {.f = {beta}};
            OX_OP(c, MS_OP_SCALE, &s, -1, c);
        }
        OX_OP(y, MS_OP_ADD_BCAST, NULL, 0, y, c);
    }
    ox_out(b, 0, y);
    return MS_OK;
}

/* op over the last dim of x; LogSoftmax first subtracts the max, so that large inputs keep
 * their precision (log_softmax(x) = log_softmax(x - max)). */
static int softmax_last(ox_build *b, int op, int x, int k, ms_error *err) {
    if (op == MS_OP_LOG_SOFTMAX) {
        ms_op_attrs r = {.i = {1u << (ox_shape(b, x)->ndim - 1), 1}};
        int in[2] = {x, -1};
        if ((in[1] = ox_op(b, MS_OP_MAX_DIMS, &r, 1, &x, -1, err)) < 0) return -1;
        if ((x = ox_op(b, MS_OP_SUB, NULL, 2, in, -1, err)) < 0) return -1;
    }
    return ox_op(b, op, NULL, 1, &x, k, err);
}

/* Softmax and LogSoftmax: opset 13 normalises along one axis (moved last and back); before
 * it, over the input flattened to 2-D at the axis. */
static ms_status softmax_like(ox_build *b, int op, ms_error *err) {
    int x, y, ax;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape s = *ox_shape(b, x);
    bool v13 = b->m->opset >= 13;
    MS_CHECK(norm_axis(b, ox_attr_i(b, "axis", v13 ? -1 : 1), s.ndim, &ax, err));
    if (!v13 && ax != s.ndim - 1) {
        int64_t sh[2] = {1, 1};
        for (int d = 0; d < s.ndim; d++) sh[d >= ax] *= s.d[d];
        if ((x = reshape(b, x, 2, sh, -1, err)) < 0) return err->code;
        if ((y = softmax_last(b, op, x, -1, err)) < 0 ||
            (y = reshape(b, y, s.ndim, s.d, 0, err)) < 0)
            return err->code;
    } else if (ax != s.ndim - 1) {
        ms_op_attrs p = {0};
        for (int d = 0, j = 0; d < s.ndim; d++)
            if (d != ax) p.i[j++] = d;
        p.i[s.ndim - 1] = ax;
        ms_op_attrs q = {0}; /* the inverse */
        for (int d = 0; d < s.ndim; d++) q.i[p.i[d]] = d;
        OX_OP(x, MS_OP_PERMUTE, &p, -1, x);
        if ((y = softmax_last(b, op, x, -1, err)) < 0) return err->code;
        OX_OP(y, MS_OP_PERMUTE, &q, 0, y);
    } else if ((y = softmax_last(b, op, x, 0, err)) < 0) {
        return err->code;
    }
    ox_out(b, 0, y);
    return MS_OK;
}
static ms_status map_softmax(ox_build *b, ms_error *err) {
    return softmax_like(b, MS_OP_SOFTMAX, err);
}
static ms_status map_log_softmax(ox_build *b, ms_error *err) {
    return softmax_like(b, MS_OP_LOG_SOFTMAX, err);
}

/* The labels SoftmaxCrossEntropyLoss keeps (1) or ignores (0), and the labels xent is given: an
 * ignore_index >= 0 is a class, so its labels become -1 (xent skips targets < 0); a negative
 * one, or none, keeps the labels as they are (xent skips the negative ones). */
static ms_status xent_labels(ox_build *b, int t, int *labels, int *kept, ms_error *err) {
    int64_t ignore = ox_attr_i(b, "ignore_index", -1);
    *labels = t;
    if (!ox_attr(b, "ignore_index") || ignore < 0) {
        int zero = fill_like(b, t, 0.0f, err);
        if (zero < 0) return err->code;
        OX_OP(*kept, MS_OP_GE, NULL, -1, t, zero);
        return MS_OK;
    }
    int ii = fill_like(b, t, (float)ignore, err), neg;
    if (ii < 0 || (neg = fill_like(b, t, -1.0f, err)) < 0) return err->code;
    OX_OP(*kept, MS_OP_NE, NULL, -1, t, ii);
    OX_OP(*labels, MS_OP_WHERE, NULL, -1, *kept, t, neg);
    return MS_OK;
}

/* The class weight of each kept label (0 for an ignored one), in the labels' shape. */
static ms_status xent_weights(ox_build *b, int labels, int kept, int *wt, ms_error *err) {
    int w, zero, ids, g;
    MS_CHECK(ox_val(b, 2, &w, err));
    const ms_shape ts = *ox_shape(b, labels);
    int64_t L = 1;
    for (int d = 0; d < ts.ndim; d++) L *= ts.d[d];
    if ((zero = fill_like(b, labels, 0.0f, err)) < 0) return err->code;
    OX_OP(ids, MS_OP_MAXIMUM, NULL, -1, labels, zero);
    if ((ids = reshape(b, ids, 1, &L, -1, err)) < 0) return err->code;
    ms_op_attrs a = {.i = {0}};
    OX_OP(g, MS_OP_INDEX_SELECT, &a, -1, w, ids);
    if ((g = reshape(b, g, ts.ndim, ts.d, -1, err)) < 0) return err->code;
    OX_OP(*wt, MS_OP_MUL, NULL, -1, g, kept);
    return MS_OK;
}

/* The log-probabilities output (classes back on dim 1), from scores with the classes last. */
static ms_status xent_log_prob(ox_build *b, int x, int r, ms_error *err) {
    int lp;
    OX_OP(lp, MS_OP_LOG_SOFTMAX, NULL, r > 2 ? -1 : 1, x);
    if (r > 2) {
        ms_op_attrs q = {0}; /* back to the classes on dim 1 */
        q.i[0] = 0, q.i[1] = r - 1;
        for (int d = 2; d < r; d++) q.i[d] = d - 1;
        OX_OP(lp, MS_OP_PERMUTE, &q, 1, lp);
    }
    ox_out(b, 1, lp);
    return MS_OK;
}

/* SoftmaxCrossEntropyLoss (opset 12+; what torch.onnx exports F.cross_entropy as): scores
 * [N, C, d...] with the classes on dim 1, labels [N, d...]; meshscope's xent takes the classes
 * last, so the scores are permuted first. As ONNX defines it: a label equal to ignore_index
 * contributes 0, each kept label's loss is scaled by its class weight (input 2), and the mean
 * divides by the summed weights of the kept labels (their count without weights; every label
 * without an ignore_index). */
static ms_status map_softmax_xent(ox_build *b, ms_error *err) {
    int x, t, y;
    const char *red = ox_attr_s(b, "reduction", "mean");
    bool mean = !strcmp(red, "mean"), sum = !strcmp(red, "sum");
    if (!mean && !sum && strcmp(red, "none"))
        return ox_fail(b, MS_ERR_INVALID, err, "reduction \"%s\" is not mean, sum or none", red);
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &t, err));
    int r = ox_shape(b, x)->ndim;
    if (r < 2) return ox_fail(b, MS_ERR_INVALID, err, "scores need [N, C, ...]");
    if (r > 2) { /* classes last */
        ms_op_attrs p = {0};
        for (int d = 0, j = 0; d < r; d++)
            if (d != 1) p.i[j++] = d;
        p.i[r - 1] = 1;
        OX_OP(x, MS_OP_PERMUTE, &p, -1, x);
    }
    if (b->node->n_output > 1 && b->node->output[1][0]) MS_CHECK(xent_log_prob(b, x, r, err));
    /* plain: xent as it is (no weights, and no ignored class, or a sum skipping negatives) */
    bool weighted = ox_has(b, 2), has_ii = ox_attr(b, "ignore_index") != NULL;
    bool plain = !weighted && (!has_ii || (sum && ox_attr_i(b, "ignore_index", -1) < 0));
    int labels = t, kept = -1, wt = -1, losses;
    if (!plain) MS_CHECK(xent_labels(b, t, &labels, &kept, err));
    if (weighted) MS_CHECK(xent_weights(b, labels, kept, &wt, err));
    bool last = !mean && !sum && !weighted;
    OX_OP(losses, MS_OP_XENT, NULL, last ? 0 : -1, x, labels);
    if (weighted) OX_OP(losses, MS_OP_MUL, NULL, !mean && !sum ? 0 : -1, losses, wt);
    ms_op_attrs all = {.i = {-1}};
    if (!mean && !sum) {
        y = losses;
    } else if (sum || plain) {
        OX_OP(y, mean ? MS_OP_MEAN : MS_OP_SUM, &all, 0, losses);
    } else { /* the mean over the kept labels' weights (or their count) */
        int total, count;
        OX_OP(count, MS_OP_SUM, &all, -1, weighted ? wt : kept);
        OX_OP(total, MS_OP_SUM, &all, -1, losses);
        OX_OP(y, MS_OP_DIV, NULL, 0, total, count);
    }
    ox_out(b, 0, y);
    return MS_OK;
}

/* --- normalisation --------------------------------------------------------------------------- */

/* A per-channel [C] value shaped [C, 1, ...] to broadcast against [N, C, ...] of rank r. */
static int per_channel(ox_build *b, int v, int r, ms_error *err) {
    int64_t sh[MS_MAX_DIMS];
    sh[0] = ox_shape(b, v)->d[0];
    for (int d = 1; d < r - 1; d++) sh[d] = 1;
    return reshape(b, v, r - 1, sh, -1, err);
}

/* Training mode (ONNX's training_mode=1): the batch's mean and biased variance over every dim
 * but 1 normalise x; outputs 1 and 2 are the running statistics, input_mean momentum +
 * batch_mean (1 - momentum) (the variance likewise). v: scale, B, mean, var as [C, 1, ...]. */
static ms_status batchnorm_train(ox_build *b, int x, const int *v, int r, ms_error *err) {
    const ms_shape s = *ox_shape(b, x);
    unsigned mask = ((1u << r) - 1) & ~2u;
    ms_op_attrs red = {.i = {mask, 1, 0}};
    int mean, var, ve, inv, c, y;
    OX_OP(mean, MS_OP_MEAN_DIMS, &red, -1, x);
    OX_OP(var, MS_OP_VAR, &red, -1, x);
    if ((ve = add_scalar(b, var, ox_attr_f(b, "epsilon", 1e-5f), -1, err)) < 0) return err->code;
    OX_OP(inv, MS_OP_RSQRT, NULL, -1, ve);
    OX_OP(c, MS_OP_SUB, NULL, -1, x, mean);
    OX_OP(c, MS_OP_MUL_BCAST, NULL, -1, c, inv);
    OX_OP(c, MS_OP_MUL_BCAST, NULL, -1, c, v[0]);
    OX_OP(y, MS_OP_ADD_BCAST, NULL, 0, c, v[1]);
    ox_out(b, 0, y);
    float mom = ox_attr_f(b, "momentum", 0.9f);
    for (int k = 1; k <= 2 && k < (int)b->node->n_output; k++) {
        int stat = k == 1 ? mean : var, run = v[k + 1], o;
        ms_op_attrs keep = {.f = {mom}}, take = {.f = {1.0f - mom}};
        if ((stat = reshape(b, stat, 1, &s.d[1], -1, err)) < 0 ||
            (run = reshape(b, run, 1, &s.d[1], -1, err)) < 0)
            return err->code;
        OX_OP(run, MS_OP_SCALE, &keep, -1, run);
        OX_OP(stat, MS_OP_SCALE, &take, -1, stat);
        OX_OP(o, MS_OP_ADD, NULL, k, run, stat);
        ox_out(b, k, o);
    }
    return MS_OK;
}

/* Inference: (x - mean) * scale / sqrt(var + eps) + B; training mode: batchnorm_train. */
static ms_status map_batchnorm(ox_build *b, ms_error *err) {
    bool train = ox_attr_i(b, "training_mode", 0) != 0;
    if ((!train && b->node->n_output > 1) || b->node->n_output > 3 ||
        (b->m->opset < 7 && !ox_attr_i(b, "is_test", 0)))
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "the saved mean and variance outputs of opsets before 14 are not "
                       "supported; export with opset >= 14 (or in eval mode)");
    if (!ox_attr_i(b, "spatial", 1))
        return ox_fail(b, MS_ERR_UNSUPPORTED, err, "spatial=0 is not supported");
    int x, v[4], y;
    MS_CHECK(ox_val(b, 0, &x, err));
    int r = rank_of(b, x);
    if (r < 2) return ox_fail(b, MS_ERR_INVALID, err, "the input needs [N, C, ...]");
    for (int k = 0; k < 4; k++) {
        MS_CHECK(ox_val(b, k + 1, &v[k], err));
        if (rank_of(b, v[k]) != 1)
            return ox_fail(b, MS_ERR_INVALID, err, "input %d not [C]", k + 1);
        if ((v[k] = per_channel(b, v[k], r, err)) < 0) return err->code;
    }
    if (train) return batchnorm_train(b, x, v, r, err);
    int ve = add_scalar(b, v[3], ox_attr_f(b, "epsilon", 1e-5f), -1, err), inv, a, c;
    if (ve < 0) return err->code;
    OX_OP(inv, MS_OP_RSQRT, NULL, -1, ve);
    OX_OP(a, MS_OP_MUL, NULL, -1, v[0], inv);
    OX_OP(c, MS_OP_SUB, NULL, -1, x, v[2]);
    OX_OP(c, MS_OP_MUL_BCAST, NULL, -1, c, a);
    OX_OP(y, MS_OP_ADD_BCAST, NULL, 0, c, v[1]);
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_instancenorm(ox_build *b, ms_error *err) {
    int x, w, bi, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &w, err));
    MS_CHECK(ox_val(b, 2, &bi, err));
    const ms_shape *s = ox_shape(b, x);
    if (s->ndim < 3) return ox_fail(b, MS_ERR_INVALID, err, "the input needs [N, C, ...]");
    ms_op_attrs a = {.i = {s->d[1]}, .f = {ox_attr_f(b, "epsilon", 1e-5f)}};
    OX_OP(y, MS_OP_GROUP_NORM, &a, 0, x, w, bi);
    ox_out(b, 0, y);
    return MS_OK;
}

/* Over the dims from axis on (flattened to one when several), with the optional Mean and
 * InvStdDev outputs. */
static ms_status map_layernorm(ox_build *b, ms_error *err) {
    int x, w, bi = -1, ax, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &w, err));
    if (ox_has(b, 2)) MS_CHECK(ox_val(b, 2, &bi, err));
    const ms_shape s = *ox_shape(b, x);
    MS_CHECK(norm_axis(b, ox_attr_i(b, "axis", -1), s.ndim, &ax, err));
    float eps = ox_attr_f(b, "epsilon", 1e-5f);
    int64_t sh[MS_MAX_DIMS], c = 1;
    for (int d = 0; d < ax; d++) sh[d] = s.d[d];
    for (int d = ax; d < s.ndim; d++) c *= s.d[d];
    sh[ax] = c;
    int xf = x;
    bool flat = ax != s.ndim - 1;
    if (flat &&
        ((xf = reshape(b, x, ax + 1, sh, -1, err)) < 0 || (w = reshape(b, w, 1, &c, -1, err)) < 0 ||
         (bi >= 0 && (bi = reshape(b, bi, 1, &c, -1, err)) < 0)))
        return err->code;
    ms_op_attrs a = {.f = {eps}};
    if (bi >= 0) {
        OX_OP(y, MS_OP_LAYERNORM, &a, flat ? -1 : 0, xf, w, bi);
    } else {
        OX_OP(y, MS_OP_LAYERNORM_PLAIN, &a, -1, xf);
        OX_OP(y, MS_OP_MUL_BCAST, NULL, flat ? -1 : 0, y, w);
    }
    if (flat && (y = reshape(b, y, s.ndim, s.d, 0, err)) < 0) return err->code;
    ox_out(b, 0, y);
    if (b->node->n_output > 1) {
        ms_op_attrs r = {.i = {1u << ax, 1, 0}};
        int mean, var, inv;
        OX_OP(mean, MS_OP_MEAN_DIMS, &r, 1, xf);
        OX_OP(var, MS_OP_VAR, &r, -1, xf);
        if ((var = add_scalar(b, var, eps, -1, err)) < 0) return err->code;
        OX_OP(inv, MS_OP_RSQRT, NULL, flat ? -1 : 2, var);
        if (flat) {
            int64_t ms[MS_MAX_DIMS];
            for (int d = 0; d < s.ndim; d++) ms[d] = d < ax ? s.d[d] : 1;
            if ((mean = reshape(b, mean, s.ndim, ms, 1, err)) < 0 ||
                (inv = reshape(b, inv, s.ndim, ms, 2, err)) < 0)
                return err->code;
        }
        ox_out(b, 1, mean);
        ox_out(b, 2, inv);
    }
    return MS_OK;
}

/* --- convolution and pooling ----------------------------------------------------------------- */

/* The window geometry of a Conv or pool node over nsp spatial dims of x's shape s. */
typedef struct win {
    int nsp;
    int64_t k[3], stride[3], dil[3], pb[3], pe[3]; /* kernel, stride, dilation, pads begin/end */
} win;

static ms_status read_window(ox_build *b, const ms_shape *s, const int64_t *kernel, win *w,
                             ms_error *err) {
    w->nsp = s->ndim - 2;
    if (w->nsp < 1 || w->nsp > 3)
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "a rank-%d input: only 1-D, 2-D and 3-D (N, C, spatial...) are supported",
                       s->ndim);
    int64_t v[6];
    for (int i = 0; i < w->nsp; i++) w->k[i] = kernel[i], w->stride[i] = 1, w->dil[i] = 1;
    if (ox_attr_ints(b, "strides", v, 6) == w->nsp)
        for (int i = 0; i < w->nsp; i++) w->stride[i] = v[i];
    if (ox_attr_ints(b, "dilations", v, 6) == w->nsp)
        for (int i = 0; i < w->nsp; i++) w->dil[i] = v[i];
    int np = ox_attr_ints(b, "pads", v, 6);
    for (int i = 0; i < w->nsp; i++) {
        w->pb[i] = np == 2 * w->nsp ? v[i] : 0;
        w->pe[i] = np == 2 * w->nsp ? v[w->nsp + i] : 0;
    }
    const char *ap = ox_attr_s(b, "auto_pad", "NOTSET");
    bool upper = !strcmp(ap, "SAME_UPPER"), lower = !strcmp(ap, "SAME_LOWER");
    if (!upper && !lower && strcmp(ap, "NOTSET") && strcmp(ap, "VALID"))
        return ox_fail(b, MS_ERR_INVALID, err, "auto_pad '%s' is unknown", ap);
    for (int i = 0; i < w->nsp; i++) {
        if (!strcmp(ap, "VALID")) w->pb[i] = w->pe[i] = 0;
        if (!upper && !lower) continue;
        int64_t in = s->d[2 + i], out = (in + w->stride[i] - 1) / w->stride[i];
        int64_t tot = (out - 1) * w->stride[i] + (w->k[i] - 1) * w->dil[i] + 1 - in;
        if (tot < 0) tot = 0;
        w->pb[i] = upper ? tot / 2 : tot - tot / 2;
        w->pe[i] = tot - w->pb[i];
    }
    for (int i = 0; i < w->nsp; i++)
        if (w->k[i] < 1 || w->stride[i] < 1 || w->dil[i] < 1 || w->pb[i] < 0 || w->pe[i] < 0)
            return ox_fail(b, MS_ERR_INVALID, err, "bad kernel, stride, dilation or pads");
    return MS_OK;
}

/* Pads the spatial dims of x by pb before and pe after (value fill); clears them in w. */
static int pad_spatial(ox_build *b, int x, win *w, float fill, ms_error *err) {
    ms_op_attrs a = {.f = {fill}};
    for (int i = 0; i < w->nsp; i++) {
        a.i[2 * (2 + i)] = w->pb[i];
        a.i[2 * (2 + i) + 1] = w->pe[i];
        w->pb[i] = w->pe[i] = 0;
    }
    return ox_op(b, MS_OP_PAD, &a, 1, &x, -1, err);
}

static bool symmetric(const win *w, bool half) {
    for (int i = 0; i < w->nsp; i++)
        if (w->pb[i] != w->pe[i] || (half && 2 * w->pb[i] > w->k[i])) return false;
    return true;
}

static ms_status map_conv(ox_build *b, ms_error *err) {
    int x, wt, bias = -1, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_val(b, 1, &wt, err));
    if (ox_has(b, 2)) MS_CHECK(ox_val(b, 2, &bias, err));
    const ms_shape s = *ox_shape(b, x), ws = *ox_shape(b, wt);
    win w = {0};
    if (ws.ndim != s.ndim) return ox_fail(b, MS_ERR_INVALID, err, "weight rank differs");
    MS_CHECK(read_window(b, &s, ws.d + 2, &w, err));
    if (w.nsp > 2)
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "a rank-%d input: only 1-D and 2-D convolutions (N, C, L or N, C, H, W) "
                       "are supported",
                       s.ndim);
    if (!symmetric(&w, false) && (x = pad_spatial(b, x, &w, 0.0f, err)) < 0) return err->code;
    ms_op_attrs a = {0};
    for (int i = 0; i < w.nsp; i++) {
        a.i[i] = w.stride[i];
        a.i[w.nsp + i] = w.pb[i];
        a.i[2 * w.nsp + i] = w.dil[i];
    }
    a.i[3 * w.nsp] = ox_attr_i(b, "group", 1);
    const bool relu = ox_relu_follows(b); /* the ReLU in the conv's last pass */
    a.i[3 * w.nsp + 1] = relu;
    int op = w.nsp == 1 ? MS_OP_CONV1D : MS_OP_CONV2D;
    if (bias >= 0)
        OX_OP(y, op, &a, 0, x, wt, bias);
    else
        OX_OP(y, op, &a, 0, x, wt);
    ox_out(b, 0, y);
    if (relu) b->fused_relu = y;
    return MS_OK;
}

/* Extra end padding so that ceil_mode's last window (which must start inside the input or its
 * begin padding) exists. */
static void ceil_pad(const ms_shape *s, win *w) {
    for (int i = 0; i < w->nsp; i++) {
        int64_t in = s->d[2 + i] + w->pb[i] + w->pe[i], span = (w->k[i] - 1) * w->dil[i] + 1;
        int64_t out = (in - span + w->stride[i] - 1) / w->stride[i] + 1;
        if ((out - 1) * w->stride[i] >= s->d[2 + i] + w->pb[i]) out--;
        int64_t need = (out - 1) * w->stride[i] + span - in;
        if (need > 0) w->pe[i] += need;
    }
}

static ms_status pool_window(ox_build *b, const ms_shape *s, win *w, ms_error *err) {
    int64_t k[4];
    if (ox_attr_ints(b, "kernel_shape", k, 4) != s->ndim - 2)
        return ox_fail(b, MS_ERR_INVALID, err, "kernel_shape must name every spatial dim");
    return read_window(b, s, k, w, err);
}

/* Whether meshscope's 1-D and 2-D pools take the window (no dilation). */
static bool pool_native(const win *w) {
    bool ok = w->nsp <= 2;
    for (int i = 0; i < w->nsp; i++) ok &= w->dil[i] == 1;
    return ok;
}

/* Pooling by gathering, for what the pools do not take (3-D, dilations, MaxPool's Indices):
 * after padding, kernel offset j of spatial dim i reads the elements at o stride + j dilation
 * (an index_select at constant ids); the window is the max or the sum over the offsets. */
static int pool_take(ox_build *b, int x, const win *w, int i, int64_t j, int64_t out,
                     ms_error *err) {
    float *ids = xmalloc(sizeof(float) * (size_t)out);
    for (int64_t o = 0; o < out; o++) ids[o] = (float)(o * w->stride[i] + j * w->dil[i]);
    int c = const_value(b, 1, &out, ids, err);
    free(ids);
    if (c < 0) return -1;
    ms_op_attrs a = {.i = {2 + i}};
    int in[2] = {x, c};
    return ox_op(b, MS_OP_INDEX_SELECT, &a, 2, in, -1, err);
}

/* The outputs of each spatial dim of the padded window w over s. */
static void pool_outs(const ms_shape *s, const win *w, int64_t *out) {
    for (int i = 0; i < w->nsp; i++)
        out[i] =
            (s->d[2 + i] + w->pb[i] + w->pe[i] - (w->k[i] - 1) * w->dil[i] - 1) / w->stride[i] + 1;
}

/* Max or sum over the window, one dim at a time (both are separable), of x padded. */
static int pool_separable(ox_build *b, int x, const win *w, const int64_t *out, bool max,
                          ms_error *err) {
    for (int i = 0; i < w->nsp; i++) {
        int acc = -1;
        for (int64_t j = 0; j < w->k[i]; j++) {
            int g = pool_take(b, x, w, i, j, out[i], err);
            int in[2] = {acc, g};
            if (g < 0) return -1;
            acc =
                acc < 0 ? g : ox_op(b, max ? MS_OP_MAXIMUM : MS_OP_ADD_BCAST, NULL, 2, in, -1, err);
            if (acc < 0) return -1;
        }
        x = acc;
    }
    return x;
}

static ms_op_attrs pool_attrs(const win *w) {
    ms_op_attrs a = {0};
    for (int i = 0; i < w->nsp; i++) {
        a.i[i] = w->k[i];
        a.i[w->nsp + i] = w->stride[i];
        a.i[2 * w->nsp + i] = w->pb[i];
    }
    return a;
}

/* The flat index into x [N, C, spatial...] (storage_order 1: the spatial dims column-major) of
 * every element of x padded by w; -1 in the padding. */
static int pool_index(ox_build *b, const ms_shape *s, const win *w, bool colmajor, ms_error *err) {
    ms_shape p = *s;
    int64_t n = 1, sp = 1;
    for (int i = 0; i < w->nsp; i++) p.d[2 + i] += w->pb[i] + w->pe[i], sp *= s->d[2 + i];
    for (int d = 0; d < p.ndim; d++) n *= p.d[d];
    float *f = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t e = 0; e < n; e++) {
        int64_t c[MS_MAX_DIMS], r = e, at = 0;
        for (int d = p.ndim - 1; d >= 0; d--) c[d] = r % p.d[d], r /= p.d[d];
        bool in = true;
        for (int i = 0; i < w->nsp; i++) {
            c[2 + i] -= w->pb[i];
            in &= c[2 + i] >= 0 && c[2 + i] < s->d[2 + i];
        }
        for (int k = 0; k < w->nsp; k++) {
            int i = colmajor ? w->nsp - 1 - k : k;
            at = at * s->d[2 + i] + c[2 + i];
        }
        f[e] = in ? (float)((c[0] * s->d[1] + c[1]) * sp + at) : -1.0f;
    }
    int v = const_value(b, p.ndim, p.d, f, err);
    free(f);
    return v;
}

/* MaxPool with its Indices: every kernel offset in row-major order, the first maximum kept. */
static ms_status maxpool_indices(ox_build *b, int x, int idx, const win *w, const int64_t *out,
                                 ms_error *err) {
    int64_t total = 1;
    int best = -1, bidx = -1;
    for (int i = 0; i < w->nsp; i++) total *= w->k[i];
    for (int64_t t = 0; t < total; t++) {
        int v = x, vi = idx, gt;
        for (int64_t i = w->nsp - 1, r = t; i >= 0; r /= w->k[i], i--) {
            if ((v = pool_take(b, v, w, (int)i, r % w->k[i], out[i], err)) < 0 ||
                (vi = pool_take(b, vi, w, (int)i, r % w->k[i], out[i], err)) < 0)
                return err->code;
        }
        if (best < 0) {
            best = v, bidx = vi;
            continue;
        }
        bool last = t == total - 1;
        OX_OP(gt, MS_OP_GT, NULL, -1, v, best);
        OX_OP(best, MS_OP_WHERE, NULL, last ? 0 : -1, gt, v, best);
        OX_OP(bidx, MS_OP_WHERE, NULL, last ? 1 : -1, gt, vi, bidx);
    }
    ox_out(b, 0, best);
    ox_out(b, 1, bidx);
    return MS_OK;
}

/* MaxPool by gathering (pool_take): 3-D, dilations, or the Indices output. */
static ms_status maxpool_gather(ox_build *b, int x, const ms_shape *s, const win *w,
                                ms_error *err) {
    int64_t out[3];
    pool_outs(s, w, out);
    bool want = b->node->n_output > 1 && b->node->output[1][0];
    int idx = want ? pool_index(b, s, w, ox_attr_i(b, "storage_order", 0) != 0, err) : -1;
    if (want && idx < 0) return err->code;
    win wp = *w;
    if ((x = pad_spatial(b, x, &wp, -INFINITY, err)) < 0) return err->code;
    if (want) return maxpool_indices(b, x, idx, w, out, err);
    int y = pool_separable(b, x, w, out, true, err);
    if (y < 0) return err->code;
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_maxpool(ox_build *b, ms_error *err) {
    int x, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape s = *ox_shape(b, x);
    win w = {0};
    MS_CHECK(pool_window(b, &s, &w, err));
    if (ox_attr_i(b, "ceil_mode", 0)) ceil_pad(&s, &w);
    if (!pool_native(&w) || (b->node->n_output > 1 && b->node->output[1][0]))
        return maxpool_gather(b, x, &s, &w, err);
    if (!symmetric(&w, true) && (x = pad_spatial(b, x, &w, -INFINITY, err)) < 0) return err->code;
    ms_op_attrs a = pool_attrs(&w);
    OX_OP(y, w.nsp == 1 ? MS_OP_MAX_POOL1D : MS_OP_MAX_POOL2D, &a, 0, x);
    ox_out(b, 0, y);
    return MS_OK;
}

/* AveragePool by gathering (pool_take): the window sums over the zero-padded input divided by
 * the elements each window counts (a constant): those of the input, and with
 * count_include_pad those of the explicit pads (pe0: the end pads before ceil_mode's). */
static ms_status avgpool_gather(ox_build *b, int x, const ms_shape *s, const win *w,
                                const int64_t *pe0, bool incl, ms_error *err) {
    int64_t out[3], cshape[MS_MAX_DIMS] = {1, 1}, n = 1;
    pool_outs(s, w, out);
    for (int i = 0; i < w->nsp; i++) cshape[2 + i] = out[i], n *= out[i];
    float *cnt = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t e = 0; e < n; e++) {
        double c = 1;
        for (int64_t i = w->nsp - 1, r = e; i >= 0; r /= out[i], i--) {
            int64_t o = r % out[i], lo = incl ? 0 : w->pb[i],
                    hi = w->pb[i] + s->d[2 + i] + (incl ? pe0[i] : 0), m = 0;
            for (int64_t j = 0; j < w->k[i]; j++) {
                int64_t pos = o * w->stride[i] + j * w->dil[i];
                m += pos >= lo && pos < hi;
            }
            c *= (double)m;
        }
        cnt[e] = (float)c;
    }
    int c = const_value(b, 2 + w->nsp, cshape, cnt, err), y;
    free(cnt);
    win wp = *w;
    if (c < 0 || (x = pad_spatial(b, x, &wp, 0.0f, err)) < 0 ||
        (x = pool_separable(b, x, w, out, false, err)) < 0)
        return err->code;
    OX_OP(y, MS_OP_DIV, NULL, 0, x, c);
    ox_out(b, 0, y);
    return MS_OK;
}

/* count_include_pad=1: zero padding counts. =0: the padded mean divided by the share of real
 * elements in each window (the same pool over ones), which also covers asymmetric and ceil
 * padding. */
static ms_status map_avgpool(ox_build *b, ms_error *err) {
    int x, y;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape s = *ox_shape(b, x);
    win w = {0};
    MS_CHECK(pool_window(b, &s, &w, err));
    bool incl = ox_attr_i(b, "count_include_pad", 0) != 0, ceil = ox_attr_i(b, "ceil_mode", 0);
    int op = w.nsp == 1 ? MS_OP_AVG_POOL1D : MS_OP_AVG_POOL2D;
    int64_t pe0[3] = {w.pe[0], w.pe[1], w.pe[2]};
    if (ceil) ceil_pad(&s, &w);
    if (!pool_native(&w) || (ceil && incl)) return avgpool_gather(b, x, &s, &w, pe0, incl, err);
    if (symmetric(&w, true)) {
        ms_op_attrs a = pool_attrs(&w);
        a.i[3 * w.nsp] = !incl;
        OX_OP(y, op, &a, 0, x);
        ox_out(b, 0, y);
        return MS_OK;
    }
    win w2 = w;
    int one = incl ? -1 : fill_like(b, x, 1.0f, err);
    if ((!incl && one < 0) || (x = pad_spatial(b, x, &w, 0.0f, err)) < 0) return err->code;
    ms_op_attrs a = pool_attrs(&w);
    OX_OP(y, op, &a, incl ? 0 : -1, x);
    if (!incl) {
        int share;
        if ((one = pad_spatial(b, one, &w2, 0.0f, err)) < 0) return err->code;
        OX_OP(share, op, &a, -1, one);
        OX_OP(y, MS_OP_DIV, NULL, 0, y, share);
    }
    ox_out(b, 0, y);
    return MS_OK;
}

static ms_status map_global_avgpool(ox_build *b, ms_error *err) {
    return unary(b, MS_OP_GLOBAL_AVG_POOL, (ms_op_attrs){0}, err);
}

static ms_status map_global_maxpool(ox_build *b, ms_error *err) {
    int x;
    MS_CHECK(ox_val(b, 0, &x, err));
    int r = rank_of(b, x);
    if (r < 3) return ox_fail(b, MS_ERR_INVALID, err, "the input needs [N, C, ...]");
    return unary(b, MS_OP_MAX_DIMS, (ms_op_attrs){.i = {((1u << r) - 1) & ~3u, 1}}, err);
}

/* Resize (and Upsample): nearest as PyTorch exports it (asymmetric, floor), linear with
 * half-pixel centres; N and C kept. */
static ms_status resize_to(ox_build *b, int x, bool linear, const ox_const *scales,
                           const ox_const *sizes, ms_error *err) {
    const ms_shape s = *ox_shape(b, x);
    int y;
    if (s.ndim != 3 && s.ndim != 4)
        return ox_fail(b, MS_ERR_UNSUPPORTED, err, "only [N, C, L] and [N, C, H, W] inputs");
    const ox_const *c = sizes ? sizes : scales;
    if (!c || c->numel != s.ndim)
        return ox_fail(b, MS_ERR_INVALID, err, "needs scales or sizes for every dim");
    for (int d = 0; d < 2; d++)
        if (sizes ? c->d[d] != s.d[d] : c->d[d] != 1.0)
            return ox_fail(b, MS_ERR_UNSUPPORTED, err, "resizing N or C is not supported");
    ms_op_attrs a = {.i = {linear}};
    for (int i = 0; i < s.ndim - 2; i++) {
        if (sizes)
            a.i[1 + i] = (int64_t)c->d[2 + i];
        else
            a.f[i] = (float)c->d[2 + i];
    }
    OX_OP(y, MS_OP_RESIZE, &a, 0, x);
    ox_out(b, 0, y);
    return MS_OK;
}

/* Resize's other modes, as ONNX's reference computes them: separable, one dim at a time from
 * the last, each output element a weighted sum of its input neighbours (edge-padded), so each
 * dim is a product with a constant [in, out] matrix. */
typedef struct rs_mode {
    int kind; /* 0 nearest, 1 linear, 2 cubic */
    char ct[32], nm[32];
    double a;     /* cubic_coeff_a */
    bool exclude; /* exclude_outside */
    double roi0, roi1;
} rs_mode;

/* The input coordinate of output o; *outside: tf_crop_and_resize extrapolates it. */
static double rs_coord(const rs_mode *m, int64_t o, double scale, int64_t in, bool *outside) {
    double ow = scale * (double)in, x = (double)o, r;
    *outside = false;
    if (!strcmp(m->ct, "align_corners")) return ow == 1 ? 0.0 : x * (double)(in - 1) / (ow - 1);
    if (!strcmp(m->ct, "asymmetric")) return x / scale;
    if (!strcmp(m->ct, "tf_crop_and_resize")) {
        r = ow == 1 ? (m->roi1 - m->roi0) * (double)(in - 1) / 2
                    : x * (m->roi1 - m->roi0) * (double)(in - 1) / (ow - 1);
        r += m->roi0 * (double)(in - 1);
        *outside = r < 0 || r > (double)(in - 1);
        return r;
    }
    if (!strcmp(m->ct, "pytorch_half_pixel")) return ow == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
    if (!strcmp(m->ct, "tf_half_pixel_for_nn")) return (x + 0.5) / scale;
    return (x + 0.5) / scale - 0.5; /* half_pixel */
}

/* The coefficients for a fractional position ratio in (0, 1]; returns how many. */
static int rs_coeffs(const rs_mode *m, double t, double *c) {
    if (m->kind == 0) {
        bool hi = t == 1.0                              ? true
                  : !strcmp(m->nm, "round_prefer_ceil") ? t >= 0.5
                  : !strcmp(m->nm, "floor")             ? false
                  : !strcmp(m->nm, "ceil")              ? true
                                                        : t > 0.5;
        c[0] = !hi, c[1] = hi;
        return 2;
    }
    if (m->kind == 1) {
        c[0] = 1 - t, c[1] = t;
        return 2;
    }
    double A = m->a, u = t + 1, v = 1 - t, w = 2 - t;
    c[0] = ((A * u - 5 * A) * u + 8 * A) * u - 4 * A;
    c[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
    c[2] = ((A + 2) * v - (A + 3)) * v * v + 1;
    c[3] = ((A * w - 5 * A) * w + 8 * A) * w - 4 * A;
    return 4;
}

/* The n integers nearest x in [0, limit), ties to the smaller, ascending, into idx. */
static void rs_nearest(double x, int n, int64_t limit, int64_t *idx) {
    int64_t f = (int64_t)floor(x), cand[12];
    int nc = 0;
    for (int64_t c = f - n; c <= f + n + 1; c++)
        if (c >= 0 && c < limit) cand[nc++] = c;
    for (int i = 0; i < nc; i++) /* by distance, then index */
        for (int j = i + 1; j < nc; j++) {
            double di = fabs(x - (double)cand[i]), dj = fabs(x - (double)cand[j]);
            if (dj < di || (dj == di && cand[j] < cand[i])) {
                int64_t t = cand[i];
                cand[i] = cand[j], cand[j] = t;
            }
        }
    for (int i = 0; i < n; i++) idx[i] = cand[i];
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (idx[j] < idx[i]) {
                int64_t t = idx[i];
                idx[i] = idx[j], idx[j] = t;
            }
}

/* The [in, out] matrix wt (wt[i * out + o]) of one dim; ext[o] is 1 where o extrapolates. */
static void rs_matrix(const rs_mode *m, int64_t in, int64_t out, double scale, float *wt,
                      float *ext) {
    memset(wt, 0, sizeof(float) * (size_t)(in * out));
    for (int64_t o = 0; o < out; o++) {
        bool outside;
        double x = rs_coord(m, o, scale, in, &outside), c[4], sum = 0;
        ext[o] = outside;
        if (outside) continue;
        double t = x == floor(x) ? 1.0 : x - floor(x);
        int n = rs_coeffs(m, t, c), pad = (n + 1) / 2;
        int64_t idx[4];
        rs_nearest(x + pad, n, in + 2 * pad, idx);
        for (int k = 0; k < n; k++) {
            int64_t i = idx[k] - pad;
            if (m->exclude && (i < 0 || i >= in)) c[k] = 0;
            sum += c[k];
        }
        for (int k = 0; k < n; k++) {
            int64_t i = idx[k] - pad;
            i = i < 0 ? 0 : i >= in ? in - 1 : i;
            wt[i * out + o] += (float)(m->exclude ? c[k] / sum : c[k]);
        }
    }
}

/* Resamples dim d of x from in to out elements: moved last, times the matrix (plus the
 * extrapolation value where tf_crop_and_resize extrapolates), moved back. */
static int rs_dim(ox_build *b, int x, int d, const rs_mode *m, int64_t out, double scale,
                  float extrap, int k, ms_error *err) {
    const ms_shape s = *ox_shape(b, x);
    int64_t in = s.d[d], shape[2] = {in, out};
    float *wt = xmalloc(sizeof(float) * (size_t)(in * out + 1)),
          *ext = xmalloc(sizeof(float) * (size_t)(out + 1));
    rs_matrix(m, in, out, scale, wt, ext);
    bool any = false;
    for (int64_t o = 0; o < out; o++) any |= ext[o] != 0, ext[o] *= extrap;
    int w = const_value(b, 2, shape, wt, err), e = any ? const_value(b, 1, &out, ext, err) : 0;
    free(wt);
    free(ext);
    if (w < 0 || e < 0) return -1;
    ms_op_attrs p = {0};
    for (int i = 0; i < s.ndim; i++) p.i[i] = i;
    p.i[d] = s.ndim - 1, p.i[s.ndim - 1] = d; /* a swap: its own inverse */
    bool moved = d != s.ndim - 1;
    int in2[2] = {x, w};
    if (moved && (in2[0] = ox_op(b, MS_OP_PERMUTE, &p, 1, &x, -1, err)) < 0) return -1;
    int y = ox_op(b, MS_OP_MATMUL, NULL, 2, in2, moved || any ? -1 : k, err);
    int in3[2] = {y, e};
    if (y >= 0 && any) y = ox_op(b, MS_OP_ADD_BCAST, NULL, 2, in3, moved ? -1 : k, err);
    if (y >= 0 && moved) y = ox_op(b, MS_OP_PERMUTE, &p, 1, &y, k, err);
    return y;
}

/* The general Resize: every dim whose size or coordinates change, from the last. */
static ms_status resize_general(ox_build *b, int x, rs_mode *m, const ox_const *scales,
                                const ox_const *sizes, ms_error *err) {
    const ms_shape s = *ox_shape(b, x);
    const ox_const *c = sizes ? sizes : scales, *roi = NULL;
    if (!c || c->numel != s.ndim)
        return ox_fail(b, MS_ERR_INVALID, err, "needs scales or sizes for every dim");
    bool crop = !strcmp(m->ct, "tf_crop_and_resize");
    if (crop && ox_has(b, 1)) MS_CHECK(ox_const_in(b, 1, &roi, err));
    if (crop && (!roi || roi->numel != 2 * s.ndim))
        return ox_fail(b, MS_ERR_INVALID, err, "tf_crop_and_resize needs a roi of 2 x rank");
    float extrap = ox_attr_f(b, "extrapolation_value", 0.0f);
    int last = -1;
    int64_t out[MS_MAX_DIMS];
    double scale[MS_MAX_DIMS];
    for (int d = 0; d < s.ndim; d++) {
        out[d] = sizes ? (int64_t)c->d[d] : (int64_t)(c->d[d] * (double)s.d[d]);
        scale[d] = sizes ? (double)out[d] / (double)s.d[d] : c->d[d];
        if (out[d] < 1)
            return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                           "an output dim of %lld; empty tensors "
                           "are not supported",
                           (long long)out[d]);
        if (out[d] != s.d[d] || crop || scale[d] != 1.0) last = d;
    }
    if (last < 0) return map_identity(b, err);
    for (int d = s.ndim - 1; d >= 0; d--) {
        if (out[d] == s.d[d] && !crop && scale[d] == 1.0) continue;
        m->roi0 = roi ? roi->d[d] : 0, m->roi1 = roi ? roi->d[s.ndim + d] : 1;
        if ((x = rs_dim(b, x, d, m, out[d], scale[d], extrap, d == last ? 0 : -1, err)) < 0)
            return err->code;
    }
    ox_out(b, 0, x);
    return MS_OK;
}

/* Whether meshscope's resize computes it: nearest as PyTorch exports it (asymmetric, floor)
 * or linear with half-pixel centres, over [N, C, L] or [N, C, H, W] with N and C kept. */
static bool resize_native(ox_build *b, int x, const rs_mode *m, const ox_const *scales,
                          const ox_const *sizes) {
    const ms_shape *xs = ox_shape(b, x);
    const ox_const *c = sizes ? sizes : scales;
    bool ok = m->kind == 1
                  ? !strcmp(m->ct, "half_pixel") || !strcmp(m->ct, "pytorch_half_pixel")
                  : m->kind == 0 && !strcmp(m->ct, "asymmetric") && !strcmp(m->nm, "floor");
    if (!ok || !c || c->numel != xs->ndim || (xs->ndim != 3 && xs->ndim != 4)) return false;
    for (int d = 0; d < 2; d++)
        if (sizes ? c->d[d] != xs->d[d] : c->d[d] != 1.0) return false;
    /* pytorch_half_pixel is half_pixel except where an output dim is 1 */
    for (int d = 2; !strcmp(m->ct, "pytorch_half_pixel") && d < xs->ndim; d++)
        if ((sizes ? c->d[d] : floor((double)xs->d[d] * c->d[d])) == 1) return false;
    return true;
}

static ms_status map_resize(ox_build *b, ms_error *err) {
    int x;
    MS_CHECK(ox_val(b, 0, &x, err));
    rs_mode m = {.a = ox_attr_f(b, "cubic_coeff_a", -0.75f),
                 .exclude = ox_attr_i(b, "exclude_outside", 0) != 0};
    const char *mode = ox_attr_s(b, "mode", "nearest");
    m.kind = !strcmp(mode, "nearest")  ? 0
             : !strcmp(mode, "linear") ? 1
             : !strcmp(mode, "cubic")  ? 2
                                       : -1;
    if (m.kind < 0) return ox_fail(b, MS_ERR_INVALID, err, "mode '%s' is unknown", mode);
    snprintf(m.ct, sizeof m.ct, "%s",
             ox_attr_s(b, "coordinate_transformation_mode",
                       b->m->opset >= 11 ? "half_pixel" : "asymmetric"));
    snprintf(m.nm, sizeof m.nm, "%s",
             ox_attr_s(b, "nearest_mode", b->m->opset >= 11 ? "round_prefer_floor" : "floor"));
    const ox_const *scales = NULL, *sizes = NULL;
    int si = b->m->opset >= 11 ? 2 : 1;
    if (ox_has(b, si)) MS_CHECK(ox_const_in(b, si, &scales, err));
    if (scales && !scales->numel) scales = NULL;
    if (b->m->opset >= 11 && ox_has(b, 3)) MS_CHECK(ox_const_in(b, 3, &sizes, err));
    if (resize_native(b, x, &m, scales, sizes))
        return resize_to(b, x, m.kind == 1, scales, sizes, err);
    return resize_general(b, x, &m, scales, sizes, err);
}

static ms_status map_upsample(ox_build *b, ms_error *err) {
    int x;
    MS_CHECK(ox_val(b, 0, &x, err));
    if (strcmp(ox_attr_s(b, "mode", "nearest"), "nearest"))
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "only mode 'nearest' is supported (Upsample's linear aligns corners "
                       "differently); export with opset >= 11 (Resize)");
    const ox_const *scales = NULL;
    if (ox_has(b, 1)) MS_CHECK(ox_const_in(b, 1, &scales, err));
    ox_const *tmp = NULL;
    if (!scales) {
        int n = 0;
        const Onnx__AttributeProto *a = ox_attr(b, "scales");
        if (a) n = (int)a->n_floats;
        int64_t shape[1] = {n};
        tmp = ox_new_const(b, OX_FLOAT, 1, shape);
        for (int i = 0; i < n && i < MS_MAX_DIMS; i++) tmp->d[i] = a->floats[i];
        scales = tmp;
    }
    return resize_to(b, x, false, scales, NULL, err);
}

/* --- selection and scans --------------------------------------------------------------------- */

static ms_status map_topk(ox_build *b, ms_error *err) {
    int x, ax, out[2];
    const ox_const *kc;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_const_in(b, 1, &kc, err));
    const ms_shape s = *ox_shape(b, x);
    MS_CHECK(norm_axis(b, ox_attr_i(b, "axis", -1), s.ndim, &ax, err));
    bool largest = ox_attr_i(b, "largest", 1) != 0;
    if (ax != s.ndim - 1)
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "axis %d: only the last axis is supported; transpose before TopK", ax);
    if (!largest) OX_OP(x, MS_OP_NEG, NULL, -1, x);
    ms_op_attrs a = {.i = {(int64_t)kc->d[0]}};
    char name[160];
    snprintf(name, sizeof name, "%s/topk", b->node->output[0]);
    ms_status st = ms_graph_op_n(b->g, MS_OP_TOPK, &a, 1, &x, 2, out, name);
    if (st != MS_OK) {
        ms_error e = {0};
        ms_graph_error(b->g, &e);
        return ox_fail(b, st, err, "%s", e.msg);
    }
    int v = out[0];
    if (!largest)
        OX_OP(v, MS_OP_NEG, NULL, 0, v);
    else if ((v = reshape(b, v, s.ndim, ox_shape(b, v)->d, 0, err)) < 0)
        return err->code;
    int i = reshape(b, out[1], s.ndim, ox_shape(b, out[1])->d, 1, err);
    if (i < 0) return err->code;
    ox_out(b, 0, v);
    ox_out(b, 1, i);
    return MS_OK;
}

static ms_status map_trilu(ox_build *b, ms_error *err) {
    int64_t k = 0;
    if (ox_has(b, 1)) {
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 1, &c, err));
        k = (int64_t)c->d[0];
    }
    bool upper = ox_attr_i(b, "upper", 1) != 0;
    return unary(b, upper ? MS_OP_TRIU : MS_OP_TRIL, (ms_op_attrs){.i = {k}}, err);
}

static ms_status map_cumsum(ox_build *b, ms_error *err) {
    int x, ax, y;
    const ox_const *c;
    MS_CHECK(ox_val(b, 0, &x, err));
    MS_CHECK(ox_const_in(b, 1, &c, err));
    MS_CHECK(norm_axis(b, (int64_t)c->d[0], rank_of(b, x), &ax, err));
    bool rev = ox_attr_i(b, "reverse", 0) != 0, excl = ox_attr_i(b, "exclusive", 0) != 0;
    if (excl)
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "exclusive=1 is not supported; export an inclusive cumsum");
    ms_op_attrs f = {.i = {1 << ax}}, a = {.i = {ax}};
    if (rev) OX_OP(x, MS_OP_FLIP, &f, -1, x);
    OX_OP(y, MS_OP_CUMSUM, &a, rev ? -1 : 0, x);
    if (rev) OX_OP(y, MS_OP_FLIP, &f, 0, y);
    ox_out(b, 0, y);
    return MS_OK;
}

/* --- folded at build: shapes and constants -------------------------------------------------- */

static ms_status map_shape(ox_build *b, ms_error *err) {
    int x;
    MS_CHECK(ox_val(b, 0, &x, err));
    const ms_shape s = *ox_shape(b, x);
    int64_t lo = ox_attr_i(b, "start", 0), hi = ox_attr_i(b, "end", s.ndim);
    lo = clamp_index(lo, s.ndim);
    hi = clamp_index(hi, s.ndim);
    int64_t n = hi > lo ? hi - lo : 0;
    ox_const *c = ox_new_const(b, OX_INT64, 1, &n);
    for (int64_t i = 0; i < n; i++) c->d[i] = (double)s.d[lo + i], c->f[i] = (float)s.d[lo + i];
    ox_out_const(b, 0, c);
    return MS_OK;
}

static ms_status map_cast(ox_build *b, ms_error *err) {
    int64_t to = ox_attr_i(b, "to", OX_FLOAT);
    if (ox_is_const(b, 0)) {
        const ox_const *c;
        MS_CHECK(ox_const_in(b, 0, &c, err));
        ox_const *o = ox_new_const(b, (int)to, c->ndim, c->shape);
        for (int64_t i = 0; i < c->numel; i++) {
            o->d[i] = to == OX_FLOAT ? (double)(float)c->d[i] : trunc(c->d[i]);
            o->f[i] = (float)o->d[i];
        }
        ox_out_const(b, 0, o);
        return MS_OK;
    }
    if (to != OX_FLOAT)
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "casting a computed value to %s is not supported (only to float32)",
                       ox_dtype_name((int)to));
    return map_identity(b, err);
}

static ms_status map_constant_of_shape(ox_build *b, ms_error *err) {
    const ox_const *c;
    MS_CHECK(ox_const_in(b, 0, &c, err));
    int64_t sh[MS_MAX_DIMS + 1];
    int n = const_ints(c, sh, MS_MAX_DIMS + 1);
    if (n > MS_MAX_DIMS) return ox_fail(b, MS_ERR_UNSUPPORTED, err, "more than 8 dims");
    const Onnx__AttributeProto *a = ox_attr(b, "value");
    ox_const *v = NULL;
    if (a && a->t) MS_CHECK(ox_decode(b->m, a->t, "value", &v, err));
    ox_const *o = ox_new_const(b, v ? v->dtype : OX_FLOAT, n, sh);
    for (int64_t i = 0; i < o->numel; i++)
        o->d[i] = v && v->numel ? v->d[0] : 0, o->f[i] = (float)o->d[i];
    ox_const_free(v);
    ox_out_const(b, 0, o);
    return MS_OK;
}

/* --- the table ------------------------------------------------------------------------------- */

static const struct {
    const char *op;
    ox_map_fn fn;
} maps[] = {
    {"Abs", map_abs},
    {"Add", map_add},
    {"And", map_and},
    {"ArgMax", map_argmax},
    {"ArgMin", map_argmin},
    {"Atan", map_atan},
    {"AveragePool", map_avgpool},
    {"BatchNormalization", map_batchnorm},
    {"Cast", map_cast},
    {"Clip", map_clip},
    {"Concat", map_concat},
    {"ConstantOfShape", map_constant_of_shape},
    {"Conv", map_conv},
    {"Cos", map_cos},
    {"CumSum", map_cumsum},
    {"Div", map_div},
    {"Dropout", map_dropout},
    {"Elu", map_elu},
    {"Equal", map_equal},
    {"Erf", map_erf},
    {"Exp", map_exp},
    {"Expand", map_expand},
    {"Flatten", map_flatten},
    {"Gather", map_gather},
    {"Gemm", map_gemm},
    {"GlobalAveragePool", map_global_avgpool},
    {"GlobalMaxPool", map_global_maxpool},
    {"Greater", map_greater},
    {"GreaterOrEqual", map_greater_equal},
    {"HardSigmoid", map_hardsigmoid},
    {"HardSwish", map_hardswish},
    {"Identity", map_identity},
    {"InstanceNormalization", map_instancenorm},
    {"LayerNormalization", map_layernorm},
    {"LeakyRelu", map_leaky_relu},
    {"Less", map_less},
    {"LessOrEqual", map_less_equal},
    {"Log", map_log},
    {"LogSoftmax", map_log_softmax},
    {"MatMul", map_matmul},
    {"Max", map_max},
    {"MaxPool", map_maxpool},
    {"Mean", map_mean},
    {"Min", map_min},
    {"Mul", map_mul},
    {"Neg", map_neg},
    {"Not", map_not},
    {"Or", map_or},
    {"PRelu", map_prelu},
    {"Pow", map_pow},
    {"Reciprocal", map_reciprocal},
    {"ReduceL1", map_reduce_l1},
    {"ReduceL2", map_reduce_l2},
    {"ReduceLogSum", map_reduce_logsum},
    {"ReduceLogSumExp", map_reduce_lse},
    {"ReduceMax", map_reduce_max},
    {"ReduceMean", map_reduce_mean},
    {"ReduceMin", map_reduce_min},
    {"ReduceProd", map_reduce_prod},
    {"ReduceSum", map_reduce_sum},
    {"ReduceSumSquare", map_reduce_sumsq},
    {"Relu", map_relu},
    {"Reshape", map_reshape},
    {"Resize", map_resize},
    {"Selu", map_selu},
    {"Shape", map_shape},
    {"Sigmoid", map_sigmoid},
    {"Sign", map_sign},
    {"Sin", map_sin},
    {"Slice", map_slice},
    {"Softmax", map_softmax},
    {"SoftmaxCrossEntropyLoss", map_softmax_xent},
    {"Softplus", map_softplus},
    {"Softsign", map_softsign},
    {"Split", map_split},
    {"Sqrt", map_sqrt},
    {"Squeeze", map_squeeze},
    {"Sub", map_sub},
    {"Sum", map_sum},
    {"Tanh", map_tanh},
    {"Tile", map_tile},
    {"TopK", map_topk},
    {"Transpose", map_transpose},
    {"Trilu", map_trilu},
    {"Unsqueeze", map_unsqueeze},
    {"Upsample", map_upsample},
    {"Where", map_where},
    {"Xor", map_xor},
};

ox_map_fn ox_find_map(const char *op_type) {
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++)
        if (!strcmp(maps[i].op, op_type)) return maps[i].fn;
    return NULL;
}

#endif

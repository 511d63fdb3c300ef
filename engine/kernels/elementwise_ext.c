/* elementwise_ext.c - the unary and broadcasting binary/ternary families: one switch case per
 * op with its formula, around shared loops.
 *
 * Broadcasting walks the output row by row (the last coalesced dim), each input at its own
 * offset with an inner stride of 1 or 0. Unary loops and the binary forward are split across
 * the rank's threads; broadcasting backward loops are serial: an input broadcast along the
 * output accumulates into shared elements, which a threaded loop would race on.
 */
#include "engine/kernels/elementwise_ext.h"

#include <math.h>
#include <string.h>

#include "engine/core/parallel.h"

/* Forward loops longer than this are split across the rank's threads (core/parallel.h). */
#define GRAIN (1 << 14)

#define SELU_ALPHA       1.67326324235437728f
#define SELU_SCALE       1.05070098735548049f
#define INV_SQRT_2PI     0.398942280401432678f
#define INV_SQRT_2       0.707106781186547524f
#define TWO_OVER_SQRT_PI 1.12837916709551257f

static inline float sigmoidf(float x) {
    const float e = expf(-fabsf(x)); /* never overflows */
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
static inline float softplusf(float x) {
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}
static inline float signf(float x) {
    return (float)((x > 0) - (x < 0));
}
/* d hypot(a, b) / da; 0 at the origin */
static inline float hypot_partial(float a, float b) {
    const float h = hypotf(a, b);
    return h > 0 ? a / h : 0.0f;
}
static inline float relu6f(float x) {
    return fminf(fmaxf(x, 0.0f), 6.0f);
}

/* ---- unary ------------------------------------------------------------------------------- */

static inline float silu_grad(float x) {
    const float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}
static inline float gelu_erf_grad(float x) {
    return 0.5f * (1.0f + erff(x * INV_SQRT_2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}
/* mish = x tanh(softplus x); softplus' = sigmoid */
static inline float mish_grad(float x) {
    const float t = tanhf(softplusf(x));
    return t + x * (1.0f - t * t) * sigmoidf(x);
}

/* One call's loop, split across the rank's threads in ranges [lo, hi). */
typedef struct unary_job {
    ms_k_unary op;
    float *out, *dinp;
    const float *inp, *y, *dout;
    float p0, p1;
    bool fresh; /* backward: dinp written, not added to */
} unary_job;

#define FWD(EXPR)                                                                                  \
    for (int64_t i = lo; i < hi; i++) {                                                            \
        const float x = inp[i];                                                                    \
        out[i] = (EXPR);                                                                           \
    }                                                                                              \
    break

static void unary_fwd_range(void *arg, int64_t lo, int64_t hi) {
    const unary_job *j = arg;
    float *out = j->out;
    const float *inp = j->inp;
    const float p0 = j->p0, p1 = j->p1;
    const ms_k_unary op = j->op;
    // clang-format off
    switch (op) {
        case MS_K_UN_NEG: FWD(-x);
        case MS_K_UN_ABS: FWD(fabsf(x));
        case MS_K_UN_EXP: FWD(expf(x));
        case MS_K_UN_LOG: FWD(logf(x));
        case MS_K_UN_LOG1P: FWD(log1pf(x));
        case MS_K_UN_EXPM1: FWD(expm1f(x));
        case MS_K_UN_SQRT: FWD(sqrtf(x));
        case MS_K_UN_RSQRT: FWD(1.0f / sqrtf(x));
        case MS_K_UN_SQUARE: FWD(x * x);
        case MS_K_UN_RECIPROCAL: FWD(1.0f / x);
        case MS_K_UN_SIN: FWD(sinf(x));
        case MS_K_UN_COS: FWD(cosf(x));
        case MS_K_UN_TANH: FWD(tanhf(x));
        case MS_K_UN_SIGMOID: FWD(sigmoidf(x));
        case MS_K_UN_RELU: FWD(x > 0 ? x : 0.0f);
        case MS_K_UN_LEAKY_RELU: FWD(x > 0 ? x : p0 * x);
        case MS_K_UN_ELU: FWD(x > 0 ? x : p0 * expm1f(x));
        case MS_K_UN_SILU: FWD(x * sigmoidf(x));
        case MS_K_UN_GELU_ERF: FWD(0.5f * x * (1.0f + erff(x * INV_SQRT_2)));
        case MS_K_UN_SOFTPLUS: FWD(softplusf(x));
        case MS_K_UN_MISH: FWD(x * tanhf(softplusf(x)));
        case MS_K_UN_HARDSWISH: FWD(x * relu6f(x + 3.0f) / 6.0f);
        case MS_K_UN_HARDSIGMOID: FWD(relu6f(x + 3.0f) / 6.0f);
        case MS_K_UN_CLAMP: FWD(fminf(fmaxf(x, p0), p1));
        case MS_K_UN_POW_SCALAR: FWD(powf(x, p0));
        case MS_K_UN_SIGN: FWD(signf(x));
        case MS_K_UN_SELU: FWD(SELU_SCALE * (x > 0 ? x : SELU_ALPHA * expm1f(x)));
        case MS_K_UN_SOFTSIGN: FWD(x / (1.0f + fabsf(x)));
        case MS_K_UN_LOGSIGMOID: FWD(fminf(x, 0.0f) - log1pf(expf(-fabsf(x))));
        case MS_K_UN_ERF: FWD(erff(x));
        case MS_K_UN_ATAN: FWD(atanf(x));
        case MS_K_UN_ADD_SCALAR: FWD(x + p0);
        case MS_K_UN_COUNT:
            break;
    }
    // clang-format on
}
#undef FWD

void ms_k_unary_forward(ms_k_unary op, float *out, const float *inp, int64_t n, float p0,
                        float p1) {
    unary_job j = {.op = op, .out = out, .inp = inp, .p0 = p0, .p1 = p1};
    ms_parallel_for(n, GRAIN, unary_fwd_range, &j);
}

/* d is f'(x), from x = inp[i] and y = out[i]; a fresh dinp is written without being read. */
#define BWD(D)                                                                                     \
    if (fresh)                                                                                     \
        for (int64_t i = lo; i < hi; i++) {                                                        \
            const float x = inp[i], y = out[i];                                                    \
            (void)x, (void)y;                                                                      \
            dinp[i] = (D)*dout[i];                                                                 \
        }                                                                                          \
    else                                                                                           \
        for (int64_t i = lo; i < hi; i++) {                                                        \
            const float x = inp[i], y = out[i];                                                    \
            (void)x, (void)y;                                                                      \
            dinp[i] += (D)*dout[i];                                                                \
        }                                                                                          \
    break

static void unary_bwd_range(void *arg, int64_t lo, int64_t hi) {
    const unary_job *j = arg;
    float *dinp = j->dinp;
    const float *inp = j->inp, *out = j->y, *dout = j->dout;
    const float p0 = j->p0, p1 = j->p1;
    const ms_k_unary op = j->op;
    const bool fresh = j->fresh;
    // clang-format off
    switch (op) {
        case MS_K_UN_NEG: BWD(-1.0f);
        case MS_K_UN_ABS: BWD(signf(x));
        case MS_K_UN_EXP: BWD(y);
        case MS_K_UN_LOG: BWD(1.0f / x);
        case MS_K_UN_LOG1P: BWD(1.0f / (1.0f + x));
        case MS_K_UN_EXPM1: BWD(y + 1.0f);
        case MS_K_UN_SQRT: BWD(0.5f / y);
        case MS_K_UN_RSQRT: BWD(-0.5f * y * y * y);
        case MS_K_UN_SQUARE: BWD(2.0f * x);
        case MS_K_UN_RECIPROCAL: BWD(-y * y);
        case MS_K_UN_SIN: BWD(cosf(x));
        case MS_K_UN_COS: BWD(-sinf(x));
        case MS_K_UN_TANH: BWD(1.0f - y * y);
        case MS_K_UN_SIGMOID: BWD(y * (1.0f - y));
        case MS_K_UN_RELU: BWD(x > 0 ? 1.0f : 0.0f);
        case MS_K_UN_LEAKY_RELU: BWD(x > 0 ? 1.0f : p0);
        case MS_K_UN_ELU: BWD(x > 0 ? 1.0f : p0 * expf(x));
        case MS_K_UN_SILU: BWD(silu_grad(x));
        case MS_K_UN_GELU_ERF: BWD(gelu_erf_grad(x));
        case MS_K_UN_SOFTPLUS: BWD(sigmoidf(x));
        case MS_K_UN_MISH: BWD(mish_grad(x));
        case MS_K_UN_HARDSWISH: BWD(x < -3.0f ? 0.0f : x > 3.0f ? 1.0f : (2.0f * x + 3.0f) / 6.0f);
        case MS_K_UN_HARDSIGMOID: BWD(x > -3.0f && x < 3.0f ? 1.0f / 6.0f : 0.0f);
        case MS_K_UN_CLAMP: BWD(x >= p0 && x <= p1 ? 1.0f : 0.0f);
        case MS_K_UN_POW_SCALAR: BWD(p0 == 0 ? 0.0f : p0 * powf(x, p0 - 1.0f));
        case MS_K_UN_SIGN: BWD(0.0f);
        case MS_K_UN_SELU: BWD(SELU_SCALE * (x > 0 ? 1.0f : SELU_ALPHA * expf(x)));
        case MS_K_UN_SOFTSIGN: BWD(1.0f / ((1.0f + fabsf(x)) * (1.0f + fabsf(x))));
        case MS_K_UN_LOGSIGMOID: BWD(sigmoidf(-x));
        case MS_K_UN_ERF: BWD(TWO_OVER_SQRT_PI * expf(-x * x));
        case MS_K_UN_ATAN: BWD(1.0f / (1.0f + x * x));
        case MS_K_UN_ADD_SCALAR: BWD(1.0f);
        case MS_K_UN_COUNT:
            break;
    }
    // clang-format on
    (void)p1;
}
#undef BWD

void ms_k_unary_backward(ms_k_unary op, float *dinp, const float *inp, const float *out,
                         const float *dout, int64_t n, float p0, float p1, bool fresh) {
    unary_job j = {.op = op,
                   .dinp = dinp,
                   .inp = inp,
                   .y = out,
                   .dout = dout,
                   .p0 = p0,
                   .p1 = p1,
                   .fresh = fresh};
    ms_parallel_for(n, GRAIN, unary_bwd_range, &j);
}

static const uint8_t unary_flops[MS_K_UN_COUNT][2] = {
#define UNARY_FLOPS(ID, name, ff, fb) [MS_K_UN_##ID] = {ff, fb},
    MS_K_UNARY_OPS(UNARY_FLOPS)
#undef UNARY_FLOPS
};

/* Forward reads x, writes y; backward reads x, y and dout and accumulates dx (one more
 * multiply for the chain rule). */
ms_k_cost ms_k_unary_cost(ms_k_unary op, int64_t n, bool backward) {
    const double e = (double)n;
    if (backward) return (ms_k_cost){(unary_flops[op][1] + 1) * e, 4.0 * 5 * e};
    return (ms_k_cost){unary_flops[op][0] * e, 4.0 * 2 * e};
}

/* ---- broadcasting layout ----------------------------------------------------------------- */

void ms_k_bcast_init(ms_k_bcast *bc, int out_ndim, const int64_t *out_shape, int n_in,
                     const int64_t *const *in_shape, const int *in_ndim) {
    memset(bc, 0, sizeof *bc);
    bc->n_in = n_in;
    bc->numel = 1;
    for (int d = 0; d < out_ndim; d++) bc->numel *= out_shape[d];
    /* Each input's contiguous strides, 0 where it broadcasts; size-1 output dims dropped. */
    int64_t run[MS_K_BCAST_MAX_IN];
    for (int i = 0; i < n_in; i++) run[i] = 1;
    int nd = 0;
    int64_t shape[8], stride[MS_K_BCAST_MAX_IN][8];
    for (int d = out_ndim - 1; d >= 0; d--) {
        if (out_shape[d] == 1) continue;
        shape[nd] = out_shape[d];
        for (int i = 0; i < n_in; i++) {
            int di = d - (out_ndim - in_ndim[i]);
            bool has = di >= 0 && in_shape[i][di] != 1;
            stride[i][nd] = has ? run[i] : 0;
            if (has) run[i] *= in_shape[i][di];
        }
        nd++;
    }
    /* Innermost first in the scratch; merge a dim into the next inner one when every input
     * continues the same way (contiguous, or broadcast in both). */
    int m = 0;
    for (int k = 0; k < nd; k++) {
        bool merge = m > 0;
        for (int i = 0; merge && i < n_in; i++)
            merge = stride[i][k] == bc->stride[i][m - 1] * bc->shape[m - 1];
        if (merge) {
            bc->shape[m - 1] *= shape[k];
            continue;
        }
        bc->shape[m] = shape[k];
        for (int i = 0; i < n_in; i++) bc->stride[i][m] = stride[i][k];
        m++;
    }
    if (m == 0) bc->shape[m++] = 1; /* a scalar */
    /* Outermost first, as the walkers read it. */
    for (int a = 0, b = m - 1; a < b; a++, b--) {
        int64_t t = bc->shape[a];
        bc->shape[a] = bc->shape[b], bc->shape[b] = t;
        for (int i = 0; i < n_in; i++) {
            t = bc->stride[i][a];
            bc->stride[i][a] = bc->stride[i][b], bc->stride[i][b] = t;
        }
    }
    bc->ndim = m;
}

/* Row r of the output: each input's element offset at the row's start. */
static void row_offsets(const ms_k_bcast *bc, int64_t r, int64_t *off) {
    for (int i = 0; i < bc->n_in; i++) off[i] = 0;
    for (int d = bc->ndim - 2; d >= 0; d--) {
        int64_t c = r % bc->shape[d];
        r /= bc->shape[d];
        for (int i = 0; i < bc->n_in; i++) off[i] += c * bc->stride[i][d];
    }
}

static int64_t row_len(const ms_k_bcast *bc) {
    return bc->shape[bc->ndim - 1];
}

/* ---- binary ------------------------------------------------------------------------------ */

typedef struct bin_row {
    const float *a, *b;
    int64_t sa, sb, n; /* inner strides (0 or 1) and length */
} bin_row;

/* Equal shapes coalesce to one contiguous row: a loop without strides, which vectorises. */
#define BIN_FWD(EXPR)                                                                              \
    if (r->sa == 1 && r->sb == 1) {                                                                \
        for (int64_t i = 0; i < r->n; i++) {                                                       \
            const float a = r->a[i], b = r->b[i];                                                  \
            out[i] = (EXPR);                                                                       \
        }                                                                                          \
    } else {                                                                                       \
        for (int64_t i = 0; i < r->n; i++) {                                                       \
            const float a = r->a[i * r->sa], b = r->b[i * r->sb];                                  \
            out[i] = (EXPR);                                                                       \
        }                                                                                          \
    }                                                                                              \
    break

static void binary_row_forward(ms_k_binary op, float *out, const bin_row *r) {
    // clang-format off
    switch (op) {
        case MS_K_BIN_ADD_BCAST: BIN_FWD(a + b);
        case MS_K_BIN_SUB: BIN_FWD(a - b);
        case MS_K_BIN_MUL_BCAST: BIN_FWD(a * b);
        case MS_K_BIN_DIV: BIN_FWD(a / b);
        case MS_K_BIN_MAXIMUM: BIN_FWD(a > b || a != a ? a : b); /* NaN propagates */
        case MS_K_BIN_MINIMUM: BIN_FWD(a < b || a != a ? a : b);
        case MS_K_BIN_POW: BIN_FWD(powf(a, b));
        case MS_K_BIN_ATAN2: BIN_FWD(atan2f(a, b));
        case MS_K_BIN_HYPOT: BIN_FWD(hypotf(a, b));
        case MS_K_BIN_SQUARED_DIFFERENCE: BIN_FWD((a - b) * (a - b));
        case MS_K_BIN_ADD_RELU: BIN_FWD(a + b > 0 ? a + b : 0.0f);
        case MS_K_BIN_EQ: BIN_FWD(a == b ? 1.0f : 0.0f);
        case MS_K_BIN_NE: BIN_FWD(a != b ? 1.0f : 0.0f);
        case MS_K_BIN_LT: BIN_FWD(a < b ? 1.0f : 0.0f);
        case MS_K_BIN_LE: BIN_FWD(a <= b ? 1.0f : 0.0f);
        case MS_K_BIN_GT: BIN_FWD(a > b ? 1.0f : 0.0f);
        case MS_K_BIN_GE: BIN_FWD(a >= b ? 1.0f : 0.0f);
        case MS_K_BIN_COUNT:
            break;
    }
    // clang-format on
}
#undef BIN_FWD

/* One row of the backward: da += DA * g and db += DB * g, the switch kept out of the loops.
 * Inputs of the row's own length take both in one pass over g, a and b; otherwise each is a
 * pass of its own, and an input broadcast along the row (stride 0) accumulates into one
 * element. */
#define BIN_BWD_PASS(dst, stride, D)                                                               \
    for (int64_t i = 0; i < r->n; i++) {                                                           \
        const float a = r->a[i * r->sa], b = r->b[i * r->sb];                                      \
        (void)a, (void)b;                                                                          \
        dst[i * (stride)] += (D)*g[i];                                                             \
    }
#define BIN_BWD(DA, DB)                                                                            \
    if (da && db && r->sa == 1 && r->sb == 1) {                                                    \
        for (int64_t i = 0; i < r->n; i++) {                                                       \
            const float a = r->a[i], b = r->b[i];                                                  \
            (void)a, (void)b;                                                                      \
            da[i] += (DA)*g[i], db[i] += (DB)*g[i];                                                \
        }                                                                                          \
        break;                                                                                     \
    }                                                                                              \
    if (da) BIN_BWD_PASS(da, r->sa, DA)                                                            \
    if (db) BIN_BWD_PASS(db, r->sb, DB)                                                            \
    break

static void binary_row_backward(ms_k_binary op, float *da, float *db, const float *g,
                                const bin_row *r) {
    // clang-format off
    switch (op) {
        case MS_K_BIN_ADD_BCAST: BIN_BWD(1.0f, 1.0f);
        case MS_K_BIN_SUB: BIN_BWD(1.0f, -1.0f);
        case MS_K_BIN_MUL_BCAST: BIN_BWD(b, a);
        case MS_K_BIN_DIV: BIN_BWD(1.0f / b, -a / (b * b));
        case MS_K_BIN_MAXIMUM: /* a tie splits the gradient evenly */
            BIN_BWD(a > b ? 1.0f : a == b ? 0.5f : 0.0f, b > a ? 1.0f : a == b ? 0.5f : 0.0f);
        case MS_K_BIN_MINIMUM:
            BIN_BWD(a < b ? 1.0f : a == b ? 0.5f : 0.0f, b < a ? 1.0f : a == b ? 0.5f : 0.0f);
        case MS_K_BIN_POW: BIN_BWD(b == 0 ? 0.0f : b * powf(a, b - 1.0f), powf(a, b) * logf(a));
        case MS_K_BIN_ATAN2: BIN_BWD(b / (a * a + b * b), -a / (a * a + b * b));
        case MS_K_BIN_HYPOT: BIN_BWD(hypot_partial(a, b), hypot_partial(b, a));
        case MS_K_BIN_SQUARED_DIFFERENCE: BIN_BWD(2.0f * (a - b), -2.0f * (a - b));
        case MS_K_BIN_ADD_RELU: BIN_BWD(a + b > 0 ? 1.0f : 0.0f, a + b > 0 ? 1.0f : 0.0f);
        case MS_K_BIN_EQ: case MS_K_BIN_NE: case MS_K_BIN_LT: case MS_K_BIN_LE: case MS_K_BIN_GT:
        case MS_K_BIN_GE: case MS_K_BIN_COUNT: break; /* no gradient */
    }
    // clang-format on
}
#undef BIN_BWD
#undef BIN_BWD_PASS

typedef struct bin_job {
    ms_k_binary op;
    float *out;
    const float *a, *b;
    const ms_k_bcast *bc;
} bin_job;

/* Output elements [lo, hi): the tail of one row, whole rows, the head of another. */
static void binary_fwd_range(void *arg, int64_t lo, int64_t hi) {
    const bin_job *j = arg;
    const ms_k_bcast *bc = j->bc;
    const int64_t n = row_len(bc), sa = bc->stride[0][bc->ndim - 1],
                  sb = bc->stride[1][bc->ndim - 1];
    while (lo < hi) {
        const int64_t r = lo / n, i0 = lo % n, len = n - i0 < hi - lo ? n - i0 : hi - lo;
        int64_t off[MS_K_BCAST_MAX_IN] = {0};
        row_offsets(bc, r, off);
        bin_row row = {j->a + off[0] + i0 * sa, j->b + off[1] + i0 * sb, sa, sb, len};
        binary_row_forward(j->op, j->out + lo, &row);
        lo += len;
    }
}

void ms_k_binary_forward(ms_k_binary op, float *out, const float *a, const float *b,
                         const ms_k_bcast *bc) {
    if (bc->numel == 0) return;
    bin_job j = {op, out, a, b, bc};
    ms_parallel_for(bc->numel, GRAIN, binary_fwd_range, &j);
}

typedef struct bin_bwd_job {
    ms_k_binary op;
    float *da, *db;
    const float *dout, *a, *b;
} bin_bwd_job;

/* Elements [lo, hi) of inputs of the output's own shape: no two ranges share a gradient. */
static void binary_bwd_range(void *arg, int64_t lo, int64_t hi) {
    const bin_bwd_job *j = arg;
    bin_row row = {j->a + lo, j->b + lo, 1, 1, hi - lo};
    binary_row_backward(j->op, j->da ? j->da + lo : NULL, j->db ? j->db + lo : NULL, j->dout + lo,
                        &row);
}

void ms_k_binary_backward(ms_k_binary op, float *da, float *db, const float *dout, const float *a,
                          const float *b, const ms_k_bcast *bc) {
    const int64_t n = row_len(bc);
    if (bc->numel == 0) return;
    const int last = bc->ndim - 1;
    const int64_t sa = bc->stride[0][last], sb = bc->stride[1][last];
    if (bc->ndim == 1 && sa == 1 && sb == 1) { /* no broadcast: on the rank's threads */
        bin_bwd_job j = {op, da, db, dout, a, b};
        ms_parallel_for(bc->numel, GRAIN, binary_bwd_range, &j);
        return;
    }
    /* A broadcast input's gradient sums over rows: one thread, rows in order. */
    for (int64_t r = 0; r < bc->numel / n; r++) {
        int64_t off[MS_K_BCAST_MAX_IN] = {0};
        row_offsets(bc, r, off);
        bin_row row = {a + off[0], b + off[1], sa, sb, n};
        binary_row_backward(op, da ? da + off[0] : NULL, db ? db + off[1] : NULL, dout + r * n,
                            &row);
    }
}

static const uint8_t binary_flops[MS_K_BIN_COUNT][2] = {
#define BINARY_FLOPS(ID, name, ff, fb) [MS_K_BIN_##ID] = {ff, fb},
    MS_K_BINARY_OPS(BINARY_FLOPS)
#undef BINARY_FLOPS
};

/* Forward reads both inputs once and writes the output; backward reads dout and both inputs
 * and accumulates both input gradients. */
ms_k_cost ms_k_binary_cost(ms_k_binary op, int64_t n_out, int64_t n_a, int64_t n_b, bool backward) {
    const double o = (double)n_out, ab = (double)(n_a + n_b);
    if (backward) return (ms_k_cost){binary_flops[op][1] * o, 4.0 * (o + ab + 2 * ab)};
    return (ms_k_cost){binary_flops[op][0] * o, 4.0 * (o + ab)};
}

/* ---- ternary ----------------------------------------------------------------------------- */

/* Calls body(row, ptr offsets, inner strides, length) for every output row. */
#define FOR_ROWS(bc, BODY)                                                                         \
    do {                                                                                           \
        const int64_t n = row_len(bc);                                                             \
        if ((bc)->numel == 0) break;                                                               \
        const int last = (bc)->ndim - 1;                                                           \
        const int64_t s0 = (bc)->stride[0][last], s1 = (bc)->stride[1][last],                      \
                      s2 = (bc)->stride[2][last];                                                  \
        for (int64_t r = 0; r < (bc)->numel / n; r++) {                                            \
            int64_t off[MS_K_BCAST_MAX_IN] = {0};                                                  \
            row_offsets(bc, r, off);                                                               \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const int64_t k = r * n + i, i0 = off[0] + i * s0, i1 = off[1] + i * s1,           \
                              i2 = off[2] + i * s2;                                                \
                BODY;                                                                              \
            }                                                                                      \
        }                                                                                          \
    } while (0)

void ms_k_lerp_forward(float *out, const float *a, const float *b, const float *w,
                       const ms_k_bcast *bc) {
    FOR_ROWS(bc, out[k] = a[i0] + w[i2] * (b[i1] - a[i0]));
}

void ms_k_lerp_backward(float *da, float *db, float *dw, const float *dout, const float *a,
                        const float *b, const float *w, const ms_k_bcast *bc) {
    FOR_ROWS(bc, {
        if (da) da[i0] += (1.0f - w[i2]) * dout[k];
        if (db) db[i1] += w[i2] * dout[k];
        if (dw) dw[i2] += (b[i1] - a[i0]) * dout[k];
    });
}

void ms_k_where_forward(float *out, const float *cond, const float *a, const float *b,
                        const ms_k_bcast *bc) {
    FOR_ROWS(bc, out[k] = cond[i0] != 0 ? a[i1] : b[i2]);
}

void ms_k_where_backward(float *da, float *db, const float *dout, const float *cond,
                         const ms_k_bcast *bc) {
    FOR_ROWS(bc, {
        if (cond[i0] != 0) {
            if (da) da[i1] += dout[k];
        } else if (db) {
            db[i2] += dout[k];
        }
    });
}

ms_k_cost ms_k_ternary_cost(int flops_fwd, int flops_bwd, int64_t n_out, const int64_t *n_in,
                            bool backward) {
    const double o = (double)n_out, in = (double)(n_in[0] + n_in[1] + n_in[2]);
    if (backward) return (ms_k_cost){flops_bwd * o, 4.0 * (o + in + 2 * in)};
    return (ms_k_cost){flops_fwd * o, 4.0 * (o + in)};
}

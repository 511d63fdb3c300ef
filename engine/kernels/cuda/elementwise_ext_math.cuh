/* elementwise_ext_math.cuh - per-element arithmetic of the unary family and of the
 * broadcasting binary and ternary families (engine/kernels/elementwise_ext.h): the formulas
 * of elementwise_ext.c, and the walks of a broadcast layout (ms_k_bcast).
 *
 * Forward: one output element k. Backward: one element j of an input, which sums the
 * gradient of every output element that reads it, in increasing output order starting from
 * its current value: the order of the CPU kernel's serial loop, so no two threads write one
 * element and no atomics are needed.
 */
#ifndef MS_CUDA_ELEMENTWISE_EXT_MATH_CUH
#define MS_CUDA_ELEMENTWISE_EXT_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"
#include "engine/kernels/cuda/cuda_kernels.h" /* elementwise_ext.h, with C linkage */

#define MS_CU_SELU_ALPHA       1.67326324235437728f
#define MS_CU_SELU_SCALE       1.05070098735548049f
#define MS_CU_INV_SQRT_2PI     0.398942280401432678f
#define MS_CU_INV_SQRT_2       0.707106781186547524f
#define MS_CU_TWO_OVER_SQRT_PI 1.12837916709551257f

MS_HD float ms_cu_sigmoid(float x) {
    const float e = expf(-fabsf(x)); /* never overflows */
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
MS_HD float ms_cu_softplus(float x) {
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}
MS_HD float ms_cu_sign(float x) {
    return (float)((x > 0) - (x < 0));
}
MS_HD float ms_cu_relu6(float x) {
    return fminf(fmaxf(x, 0.0f), 6.0f);
}
/* d hypot(a, b) / da; 0 at the origin */
MS_HD float ms_cu_hypot_partial(float a, float b) {
    const float h = hypotf(a, b);
    return h > 0 ? a / h : 0.0f;
}

/* f(x) of unary op `op`; p0, p1 its float attributes. */
MS_HD float ms_cu_unary_f(ms_k_unary op, float x, float p0, float p1) {
    switch (op) {
        case MS_K_UN_NEG:
            return -x;
        case MS_K_UN_ABS:
            return fabsf(x);
        case MS_K_UN_EXP:
            return expf(x);
        case MS_K_UN_LOG:
            return logf(x);
        case MS_K_UN_LOG1P:
            return log1pf(x);
        case MS_K_UN_EXPM1:
            return expm1f(x);
        case MS_K_UN_SQRT:
            return sqrtf(x);
        case MS_K_UN_RSQRT:
            return 1.0f / sqrtf(x);
        case MS_K_UN_SQUARE:
            return x * x;
        case MS_K_UN_RECIPROCAL:
            return 1.0f / x;
        case MS_K_UN_SIN:
            return sinf(x);
        case MS_K_UN_COS:
            return cosf(x);
        case MS_K_UN_TANH:
            return tanhf(x);
        case MS_K_UN_SIGMOID:
            return ms_cu_sigmoid(x);
        case MS_K_UN_RELU:
            return x > 0 ? x : 0.0f;
        case MS_K_UN_LEAKY_RELU:
            return x > 0 ? x : p0 * x;
        case MS_K_UN_ELU:
            return x > 0 ? x : p0 * expm1f(x);
        case MS_K_UN_SILU:
            return x * ms_cu_sigmoid(x);
        case MS_K_UN_GELU_ERF:
            return 0.5f * x * (1.0f + erff(x * MS_CU_INV_SQRT_2));
        case MS_K_UN_SOFTPLUS:
            return ms_cu_softplus(x);
        case MS_K_UN_MISH:
            return x * tanhf(ms_cu_softplus(x));
        case MS_K_UN_HARDSWISH:
            return x * ms_cu_relu6(x + 3.0f) / 6.0f;
        case MS_K_UN_HARDSIGMOID:
            return ms_cu_relu6(x + 3.0f) / 6.0f;
        case MS_K_UN_CLAMP:
            return fminf(fmaxf(x, p0), p1);
        case MS_K_UN_POW_SCALAR:
            return powf(x, p0);
        case MS_K_UN_SIGN:
            return ms_cu_sign(x);
        case MS_K_UN_SELU:
            return MS_CU_SELU_SCALE * (x > 0 ? x : MS_CU_SELU_ALPHA * expm1f(x));
        case MS_K_UN_SOFTSIGN:
            return x / (1.0f + fabsf(x));
        case MS_K_UN_LOGSIGMOID:
            return fminf(x, 0.0f) - log1pf(expf(-fabsf(x)));
        case MS_K_UN_ERF:
            return erff(x);
        case MS_K_UN_ATAN:
            return atanf(x);
        case MS_K_UN_ADD_SCALAR:
            return x + p0;
        default:
            return 0.0f;
    }
}

/* f'(x), from x and y = f(x) (some derivatives read the output). */
MS_HD float ms_cu_unary_d(ms_k_unary op, float x, float y, float p0, float p1) {
    switch (op) {
        case MS_K_UN_NEG:
            return -1.0f;
        case MS_K_UN_ABS:
            return ms_cu_sign(x);
        case MS_K_UN_EXP:
            return y;
        case MS_K_UN_LOG:
            return 1.0f / x;
        case MS_K_UN_LOG1P:
            return 1.0f / (1.0f + x);
        case MS_K_UN_EXPM1:
            return y + 1.0f;
        case MS_K_UN_SQRT:
            return 0.5f / y;
        case MS_K_UN_RSQRT:
            return -0.5f * y * y * y;
        case MS_K_UN_SQUARE:
            return 2.0f * x;
        case MS_K_UN_RECIPROCAL:
            return -y * y;
        case MS_K_UN_SIN:
            return cosf(x);
        case MS_K_UN_COS:
            return -sinf(x);
        case MS_K_UN_TANH:
            return 1.0f - y * y;
        case MS_K_UN_SIGMOID:
            return y * (1.0f - y);
        case MS_K_UN_RELU:
            return x > 0 ? 1.0f : 0.0f;
        case MS_K_UN_LEAKY_RELU:
            return x > 0 ? 1.0f : p0;
        case MS_K_UN_ELU:
            return x > 0 ? 1.0f : p0 * expf(x);
        case MS_K_UN_SILU: {
            const float s = ms_cu_sigmoid(x);
            return s * (1.0f + x * (1.0f - s));
        }
        case MS_K_UN_GELU_ERF:
            return 0.5f * (1.0f + erff(x * MS_CU_INV_SQRT_2)) +
                   x * MS_CU_INV_SQRT_2PI * expf(-0.5f * x * x);
        case MS_K_UN_SOFTPLUS:
            return ms_cu_sigmoid(x);
        case MS_K_UN_MISH: {
            const float t = tanhf(ms_cu_softplus(x));
            return t + x * (1.0f - t * t) * ms_cu_sigmoid(x);
        }
        case MS_K_UN_HARDSWISH:
            return x < -3.0f ? 0.0f : x > 3.0f ? 1.0f : (2.0f * x + 3.0f) / 6.0f;
        case MS_K_UN_HARDSIGMOID:
            return x > -3.0f && x < 3.0f ? 1.0f / 6.0f : 0.0f;
        case MS_K_UN_CLAMP:
            return x >= p0 && x <= p1 ? 1.0f : 0.0f;
        case MS_K_UN_POW_SCALAR:
            return p0 == 0 ? 0.0f : p0 * powf(x, p0 - 1.0f);
        case MS_K_UN_SIGN:
            return 0.0f;
        case MS_K_UN_SELU:
            return MS_CU_SELU_SCALE * (x > 0 ? 1.0f : MS_CU_SELU_ALPHA * expf(x));
        case MS_K_UN_SOFTSIGN:
            return 1.0f / ((1.0f + fabsf(x)) * (1.0f + fabsf(x)));
        case MS_K_UN_LOGSIGMOID:
            return ms_cu_sigmoid(-x);
        case MS_K_UN_ERF:
            return MS_CU_TWO_OVER_SQRT_PI * expf(-x * x);
        case MS_K_UN_ATAN:
            return 1.0f / (1.0f + x * x);
        case MS_K_UN_ADD_SCALAR:
            return 1.0f;
        default:
            return 0.0f;
    }
}

MS_HD void ms_cu_unary_fwd(ms_k_unary op, float *out, const float *inp, float p0, float p1,
                           int64_t i) {
    out[i] = ms_cu_unary_f(op, inp[i], p0, p1);
}

MS_HD void ms_cu_unary_bwd(ms_k_unary op, float *dinp, const float *inp, const float *out,
                           const float *dout, float p0, float p1, int64_t i) {
    dinp[i] += ms_cu_unary_d(op, inp[i], out[i], p0, p1) * dout[i];
}

/* ---- broadcasting ------------------------------------------------------------------------ */

/* The offset in input `in` of output element k. */
MS_HD int64_t ms_cu_bcast_offset(const ms_k_bcast *bc, int in, int64_t k) {
    int64_t off = 0;
    for (int d = bc->ndim - 1; d >= 0; d--) {
        off += (k % bc->shape[d]) * bc->stride[in][d];
        k /= bc->shape[d];
    }
    return off;
}

/* Elements of input `in`: the product of the dims it does not broadcast along. */
MS_HD int64_t ms_cu_bcast_numel(const ms_k_bcast *bc, int in) {
    int64_t n = 1;
    for (int d = 0; d < bc->ndim; d++)
        if (bc->stride[in][d]) n *= bc->shape[d];
    return n;
}

/* f(k) for every output element k that reads element j of input `in`, in increasing k. The
 * input's own dims (stride != 0) are fixed by j; the dims it broadcasts along run row-major. */
template <typename F> MS_HD void ms_cu_bcast_readers(const ms_k_bcast *bc, int in, int64_t j, F f) {
    int64_t base = 0, ostride[8], reps = 1, os = 1;
    for (int d = bc->ndim - 1; d >= 0; d--) ostride[d] = os, os *= bc->shape[d];
    for (int d = 0; d < bc->ndim; d++) {
        const int64_t st = bc->stride[in][d];
        if (st)
            base += (j / st) % bc->shape[d] * ostride[d];
        else
            reps *= bc->shape[d];
    }
    for (int64_t r = 0; r < reps; r++) { /* r row-major over the broadcast dims */
        int64_t k = base, rem = r;
        for (int d = bc->ndim - 1; d >= 0; d--)
            if (!bc->stride[in][d]) k += (rem % bc->shape[d]) * ostride[d], rem /= bc->shape[d];
        f(k);
    }
}

/* ---- binary ------------------------------------------------------------------------------ */

MS_HD float ms_cu_binary_f(ms_k_binary op, float a, float b) {
    switch (op) {
        case MS_K_BIN_ADD_BCAST:
            return a + b;
        case MS_K_BIN_SUB:
            return a - b;
        case MS_K_BIN_MUL_BCAST:
            return a * b;
        case MS_K_BIN_DIV:
            return a / b;
        case MS_K_BIN_MAXIMUM:
            return a > b || a != a ? a : b; /* NaN propagates */
        case MS_K_BIN_MINIMUM:
            return a < b || a != a ? a : b;
        case MS_K_BIN_POW:
            return powf(a, b);
        case MS_K_BIN_ATAN2:
            return atan2f(a, b);
        case MS_K_BIN_HYPOT:
            return hypotf(a, b);
        case MS_K_BIN_SQUARED_DIFFERENCE:
            return (a - b) * (a - b);
        case MS_K_BIN_ADD_RELU:
            return a + b > 0 ? a + b : 0.0f;
        case MS_K_BIN_EQ:
            return a == b ? 1.0f : 0.0f;
        case MS_K_BIN_NE:
            return a != b ? 1.0f : 0.0f;
        case MS_K_BIN_LT:
            return a < b ? 1.0f : 0.0f;
        case MS_K_BIN_LE:
            return a <= b ? 1.0f : 0.0f;
        case MS_K_BIN_GT:
            return a > b ? 1.0f : 0.0f;
        case MS_K_BIN_GE:
            return a >= b ? 1.0f : 0.0f;
        default:
            return 0.0f;
    }
}

/* df/da (wrt_b false) or df/db at (a, b); comparisons have none. */
MS_HD float ms_cu_binary_d(ms_k_binary op, float a, float b, bool wrt_b) {
    switch (op) {
        case MS_K_BIN_ADD_BCAST:
            return 1.0f;
        case MS_K_BIN_SUB:
            return wrt_b ? -1.0f : 1.0f;
        case MS_K_BIN_MUL_BCAST:
            return wrt_b ? a : b;
        case MS_K_BIN_DIV:
            return wrt_b ? -a / (b * b) : 1.0f / b;
        case MS_K_BIN_MAXIMUM: /* a tie splits the gradient evenly */
            return wrt_b ? (b > a    ? 1.0f
                            : a == b ? 0.5f
                                     : 0.0f)
                         : (a > b    ? 1.0f
                            : a == b ? 0.5f
                                     : 0.0f);
        case MS_K_BIN_MINIMUM:
            return wrt_b ? (b < a    ? 1.0f
                            : a == b ? 0.5f
                                     : 0.0f)
                         : (a < b    ? 1.0f
                            : a == b ? 0.5f
                                     : 0.0f);
        case MS_K_BIN_POW:
            return wrt_b ? powf(a, b) * logf(a) : b == 0 ? 0.0f : b * powf(a, b - 1.0f);
        case MS_K_BIN_ATAN2:
            return wrt_b ? -a / (a * a + b * b) : b / (a * a + b * b);
        case MS_K_BIN_HYPOT:
            return wrt_b ? ms_cu_hypot_partial(b, a) : ms_cu_hypot_partial(a, b);
        case MS_K_BIN_SQUARED_DIFFERENCE:
            return wrt_b ? -2.0f * (a - b) : 2.0f * (a - b);
        case MS_K_BIN_ADD_RELU:
            return a + b > 0 ? 1.0f : 0.0f;
        default:
            return 0.0f;
    }
}

MS_HD void ms_cu_binary_fwd(ms_k_binary op, float *out, const float *a, const float *b,
                            const ms_k_bcast *bc, int64_t k) {
    out[k] = ms_cu_binary_f(op, a[ms_cu_bcast_offset(bc, 0, k)], b[ms_cu_bcast_offset(bc, 1, k)]);
}

/* Element j of input `in` (0: a, 1: b): d[j] += sum over its readers of df * dout. */
MS_HD void ms_cu_binary_bwd(ms_k_binary op, float *d, int in, const float *dout, const float *a,
                            const float *b, const ms_k_bcast *bc, int64_t j) {
    float acc = d[j];
    ms_cu_bcast_readers(bc, in, j, [&](int64_t k) {
        const float x = a[ms_cu_bcast_offset(bc, 0, k)], y = b[ms_cu_bcast_offset(bc, 1, k)];
        acc += ms_cu_binary_d(op, x, y, in == 1) * dout[k];
    });
    d[j] = acc;
}

/* ---- ternary: lerp (a, b, w) and where (cond, a, b) -------------------------------------- */

MS_HD void ms_cu_ternary_fwd(ms_k_ternary op, float *out, const float *x, const float *y,
                             const float *z, const ms_k_bcast *bc, int64_t k) {
    const float u = x[ms_cu_bcast_offset(bc, 0, k)], v = y[ms_cu_bcast_offset(bc, 1, k)],
                w = z[ms_cu_bcast_offset(bc, 2, k)];
    out[k] = op == MS_K_TER_LERP ? u + w * (v - u) : u != 0 ? v : w;
}

/* Element j of input `in`'s gradient d: lerp da = (1 - w) g, db = w g, dw = (b - a) g; where
 * da = g where cond, db = g elsewhere (cond, input 0, has none). */
MS_HD void ms_cu_ternary_bwd(ms_k_ternary op, float *d, int in, const float *dout, const float *x,
                             const float *y, const float *z, const ms_k_bcast *bc, int64_t j) {
    float acc = d[j];
    ms_cu_bcast_readers(bc, in, j, [&](int64_t k) {
        const float u = x[ms_cu_bcast_offset(bc, 0, k)], v = y[ms_cu_bcast_offset(bc, 1, k)],
                    w = z[ms_cu_bcast_offset(bc, 2, k)], g = dout[k];
        if (op == MS_K_TER_LERP)
            acc += (in == 0 ? 1.0f - w : in == 1 ? w : v - u) * g;
        else if (in == 1 ? u != 0 : in == 2 && u == 0)
            acc += g;
    });
    d[j] = acc;
}

#endif

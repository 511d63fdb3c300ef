/* elementwise_ext.h - the elementwise unary family (neg, exp, relu, GELU with erf, ...) and
 * the broadcasting binary and ternary family (sub, div, maximum, pow, comparisons, lerp,
 * where), forward and backward, over local float32 buffers (conventions in kernels.h).
 *
 * Both families are tables: one X-macro row per op with its formula and its derivative, so
 * adding an op is one line here and its rows in engine/ops. Formulas are written in float
 * with libm; p0, p1 are the op's float attributes.
 */
#ifndef MS_ELEMENTWISE_EXT_H
#define MS_ELEMENTWISE_EXT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/kernels.h"

/* ---- unary: y = f(x), dx += f'(x) * dout ------------------------------------------------
 * X(ID, name, flops per element forward, flops backward). The formulas live in the kernel
 * file; the order is the op table's. */
#define MS_K_UNARY_OPS(X)                                                                          \
    X(NEG, neg, 1, 1)                                                                              \
    X(ABS, abs, 1, 1)                                                                              \
    X(EXP, exp, 1, 1)                                                                              \
    X(LOG, log, 1, 1)                                                                              \
    X(LOG1P, log1p, 1, 2)                                                                          \
    X(EXPM1, expm1, 1, 2)                                                                          \
    X(SQRT, sqrt, 1, 2)                                                                            \
    X(RSQRT, rsqrt, 2, 3)                                                                          \
    X(SQUARE, square, 1, 2)                                                                        \
    X(RECIPROCAL, reciprocal, 1, 2)                                                                \
    X(SIN, sin, 1, 2)                                                                              \
    X(COS, cos, 1, 2)                                                                              \
    X(TANH, tanh, 1, 3)                                                                            \
    X(SIGMOID, sigmoid, 3, 3)                                                                      \
    X(RELU, relu, 0, 1)                                                                            \
    X(LEAKY_RELU, leaky_relu, 1, 1)                                                                \
    X(ELU, elu, 3, 2)                                                                              \
    X(SILU, silu, 4, 6)                                                                            \
    X(GELU_ERF, gelu_erf, 5, 9)                                                                    \
    X(SOFTPLUS, softplus, 4, 4)                                                                    \
    X(MISH, mish, 6, 12)                                                                           \
    X(HARDSWISH, hardswish, 3, 3)                                                                  \
    X(HARDSIGMOID, hardsigmoid, 2, 1)                                                              \
    X(CLAMP, clamp, 0, 1)                                                                          \
    X(POW_SCALAR, pow_scalar, 1, 3)                                                                \
    X(SIGN, sign, 0, 0)                                                                            \
    X(SELU, selu, 4, 3)                                                                            \
    X(SOFTSIGN, softsign, 3, 4)                                                                    \
    X(LOGSIGMOID, logsigmoid, 4, 4)                                                                \
    X(ERF, erf, 1, 4)                                                                              \
    X(ATAN, atan, 1, 3)                                                                            \
    X(ADD_SCALAR, add_scalar, 1, 1)

typedef enum ms_k_unary {
#define MS_K_UNARY_ENUM(ID, name, ff, fb) MS_K_UN_##ID,
    MS_K_UNARY_OPS(MS_K_UNARY_ENUM)
#undef MS_K_UNARY_ENUM
        MS_K_UN_COUNT
} ms_k_unary;

/* out = f(inp). out, inp: [N]; out may alias inp. */
void ms_k_unary_forward(ms_k_unary op, float *out, const float *inp, int64_t n, float p0, float p1);
/* dinp += f'(inp) * dout (fresh: dinp = it, dinp not read); out is the forward's result (some
 * derivatives read it). dinp, inp, out, dout: [N] */
void ms_k_unary_backward(ms_k_unary op, float *dinp, const float *inp, const float *out,
                         const float *dout, int64_t n, float p0, float p1, bool fresh);
ms_k_cost ms_k_unary_cost(ms_k_unary op, int64_t n, bool backward);

/* ---- broadcasting layout -----------------------------------------------------------------
 * numpy's rule: shapes aligned from the right, a size-1 (or missing) input dim repeats along
 * the output's. The init coalesces adjacent dims that broadcast alike, so equal shapes run
 * as one contiguous row. */
#define MS_K_BCAST_MAX_IN 3
typedef struct ms_k_bcast {
    int ndim, n_in;
    int64_t shape[8];                     /* output extents, coalesced */
    int64_t stride[MS_K_BCAST_MAX_IN][8]; /* each input's element stride; 0 = broadcast */
    int64_t numel;
} ms_k_bcast;

/* out_shape [out_ndim] and in_shape[i] [in_ndim[i]] (each in_ndim <= out_ndim <= 8, each
 * input dim equal to the output's or 1). */
void ms_k_bcast_init(ms_k_bcast *bc, int out_ndim, const int64_t *out_shape, int n_in,
                     const int64_t *const *in_shape, const int *in_ndim);

/* ---- binary: out = f(a, b) with broadcasting ---------------------------------------------
 * X(ID, name, flops forward, flops backward). Comparisons give 1 or 0 and have no
 * gradient. maximum/minimum split the gradient of a tie evenly, as PyTorch does. pow wants
 * positive bases. */
#define MS_K_BINARY_OPS(X)                                                                         \
    X(ADD_BCAST, add_bcast, 1, 2)                                                                  \
    X(SUB, sub, 1, 2)                                                                              \
    X(MUL_BCAST, mul_bcast, 1, 4)                                                                  \
    X(DIV, div, 1, 5)                                                                              \
    X(MAXIMUM, maximum, 0, 2)                                                                      \
    X(MINIMUM, minimum, 0, 2)                                                                      \
    X(POW, pow, 1, 6)                                                                              \
    X(ATAN2, atan2, 1, 7)                                                                          \
    X(HYPOT, hypot, 4, 4)                                                                          \
    X(SQUARED_DIFFERENCE, squared_difference, 2, 4)                                                \
    X(ADD_RELU, add_relu, 2, 2)                                                                    \
    X(EQ, eq, 0, 0)                                                                                \
    X(NE, ne, 0, 0)                                                                                \
    X(LT, lt, 0, 0)                                                                                \
    X(LE, le, 0, 0)                                                                                \
    X(GT, gt, 0, 0)                                                                                \
    X(GE, ge, 0, 0)

typedef enum ms_k_binary {
#define MS_K_BINARY_ENUM(ID, name, ff, fb) MS_K_BIN_##ID,
    MS_K_BINARY_OPS(MS_K_BINARY_ENUM)
#undef MS_K_BINARY_ENUM
        MS_K_BIN_COUNT
} ms_k_binary;

/* out = f(a, b). out: the layout's output; a, b: inputs 0 and 1 of the layout. */
void ms_k_binary_forward(ms_k_binary op, float *out, const float *a, const float *b,
                         const ms_k_bcast *bc);
/* da += df/da * dout, db += df/db * dout, summed over the dims each broadcasts.
 * da or db may be NULL. */
void ms_k_binary_backward(ms_k_binary op, float *da, float *db, const float *dout, const float *a,
                          const float *b, const ms_k_bcast *bc);
ms_k_cost ms_k_binary_cost(ms_k_binary op, int64_t n_out, int64_t n_a, int64_t n_b, bool backward);

/* ---- ternary: lerp and where, inputs 0..2 of a three-input layout ------------------------ */

/* The two ternary ops, as the kernel tables name them. */
typedef enum ms_k_ternary { MS_K_TER_LERP, MS_K_TER_WHERE } ms_k_ternary;

/* out = a + w * (b - a) */
void ms_k_lerp_forward(float *out, const float *a, const float *b, const float *w,
                       const ms_k_bcast *bc);
/* da += (1 - w) dout, db += w dout, dw += (b - a) dout; any may be NULL. */
void ms_k_lerp_backward(float *da, float *db, float *dw, const float *dout, const float *a,
                        const float *b, const float *w, const ms_k_bcast *bc);
/* out = cond != 0 ? a : b */
void ms_k_where_forward(float *out, const float *cond, const float *a, const float *b,
                        const ms_k_bcast *bc);
/* da += dout where cond, db += dout elsewhere; either may be NULL. */
void ms_k_where_backward(float *da, float *db, const float *dout, const float *cond,
                         const ms_k_bcast *bc);
/* n_in: the three inputs' element counts. */
ms_k_cost ms_k_ternary_cost(int flops_fwd, int flops_bwd, int64_t n_out, const int64_t *n_in,
                            bool backward);

#endif

/* fastmath.h - exp for the softmax-style kernels and tanh for GELU, written so loops that call
 * them vectorise (private to engine/kernels).
 *
 * Every caller exponentiates x - max <= 0, so ms_expf_nonpos handles x <= 0 only:
 * e^x = 2^-k e^-r with k = round(-x log2 e), |r| <= ln2/2, e^-r a degree-6 polynomial and
 * 2^-k built in the exponent bits. Relative error below 3e-7; x < -87 gives ~1e-38 rather
 * than a denormal; NaN stays NaN. Branch-free integer selects instead of float min/max or
 * ternaries, which keep GCC from vectorising without -ffast-math.
 */
#ifndef MS_FASTMATH_H
#define MS_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ms_expf_nonpos(float x) {
    uint32_t xb, ab;
    memcpy(&xb, &x, 4);
    ab = xb & 0x7fffffffu; /* |x| = -x */
    uint32_t nan = 0u - (uint32_t)(ab > 0x7f800000u);
    ab = ab < 0x42ae0000u ? ab : 0x42ae0000u; /* clamp |x| at 87 */
    float a;
    memcpy(&a, &ab, 4);
    int32_t k = (int32_t)(a * 1.44269504088896341f + 0.5f);
    float r = (float)k * 0.693145751953125f - a + (float)k * 1.428606765330187e-06f; /* -r' */
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f +
                                                  r * (0.0416666642f + r * (0.00833336543f +
                                                                            r * 0.00138888892f)))));
    int32_t bits = (127 - k) << 23;
    float two;
    memcpy(&two, &bits, 4);
    float y = p * two;
    uint32_t yb;
    memcpy(&yb, &y, 4);
    yb = (yb & ~nan) | (xb & nan);
    memcpy(&y, &yb, 4);
    return y;
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE  0.044715f

/* tanh without libm, written so the compiler vectorises the loops that call it:
 * tanh(u) = sign(u) (1 - 2 / (e^{2|u|} + 1)), with e^y = 2^k e^r, |r| <= ln2/2, e^r a
 * degree-6 polynomial and 2^k built in the exponent bits. Relative error below 3e-7 on the
 * range that matters; |u| > 9 saturates to +-1 exactly as tanhf does in float. */
static inline float fast_tanh(float u) {
    /* Sign, absolute value and the clamp at 9 as integer operations on the bits: float
     * min/max and branches keep GCC from vectorising the loop. */
    uint32_t ub, sign, ab, tb;
    memcpy(&ub, &u, 4);
    sign = ub & 0x80000000u;
    ab = ub & 0x7fffffffu;
    ab = ab < 0x41100000u ? ab : 0x41100000u; /* 9.0f */
    float a;
    memcpy(&a, &ab, 4);
    a *= 2.0f;
    float t = a * 1.44269504088896341f; /* log2(e) */
    int32_t k = (int32_t)(t + 0.5f);    /* a >= 0: round to nearest */
    float r = a - (float)k * 0.693145751953125f - (float)k * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f +
                                                  r * (0.0416666642f + r * (0.00833336543f +
                                                                            r * 0.00138888892f)))));
    int32_t bits = (k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, 4);
    float th = 1.0f - 2.0f / (p * two_k + 1.0f);
    memcpy(&tb, &th, 4);
    tb |= sign;
    memcpy(&th, &tb, 4);
    return th;
}

/* GELU, tanh approximation (GPT-2, llm.c): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
 * and its derivative. One definition, so a fused kernel computes exactly what the GELU
 * kernel does. */
static inline float ms_gelu(float x) {
    const float cube = GELU_CUBE * x * x * x;
    return 0.5f * x * (1.0f + fast_tanh(GELU_SCALE * (x + cube)));
}
static inline float ms_gelu_grad(float x) {
    const float cube = GELU_CUBE * x * x * x;
    const float th = fast_tanh(GELU_SCALE * (x + cube));
    /* sech^2 = 1 - tanh^2: llm.c's 1/cosh^2 overflows coshf for |x| beyond ~10. */
    const float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
}

/* out = softmax(in) over n values (out may alias in); the max is subtracted first. */
static inline void ms_softmax_row(float *out, const float *in, int64_t n) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; j++) mx = in[j] > mx ? in[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) {
        out[j] = ms_expf_nonpos(in[j] - mx);
        sum += out[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; j++) out[j] *= inv;
}

#endif

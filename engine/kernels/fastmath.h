/* fastmath.h - exp for the softmax-style kernels, written so loops that call it vectorise
 * (private to engine/kernels).
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

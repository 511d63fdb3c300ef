/* norm_math.cuh - the row arithmetic of LayerNorm and softmax (and the row max / sum of exps
 * that cross-entropy shares), forward and backward, as engine/kernels/norm.c defines them, and
 * LayerNorm's dweight and dbias per (row chunk, column) of a column reduction (colsum_math.cuh).
 *
 * A row [C] is split over nlanes lanes (math_common.cuh): the *_part functions return one
 * lane's partial, the caller combines the lanes with ms_cu_lanes_sum / ms_cu_lanes_max and
 * hands the combined value to the next step. LayerNorm is two-pass (mean, then centred
 * variance) like the CPU kernel.
 */
#ifndef MS_CUDA_NORM_MATH_CUH
#define MS_CUDA_NORM_MATH_CUH

#include "engine/kernels/cuda/colsum_math.cuh"
#include "engine/kernels/cuda/math_common.cuh"

/* ---- LayerNorm ---- */

template <typename T> MS_HD float ms_cu_row_sum_part(const T *x, int64_t c, int lane, int nlanes) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += nlanes) s += ms_cu_load(x + j);
    return s;
}

/* sum over the lane's elements of (x - mean)^2 */
template <typename T>
MS_HD float ms_cu_ln_sqdev_part(const T *x, int64_t c, float mean, int lane, int nlanes) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += nlanes) {
        const float d = ms_cu_load(x + j) - mean;
        s += d * d;
    }
    return s;
}

/* 1 / sqrt(biased variance + eps) from the combined sum of squared deviations. */
MS_HD float ms_cu_ln_rstd(float sqdev, int64_t c, float eps) {
    return 1.0f / sqrtf(sqdev / (float)c + eps);
}

/* out = (x - mean) * rstd * weight + bias over the lane's elements. */
template <typename T, typename W>
MS_HD void ms_cu_ln_out_part(T *out, const T *x, const W *weight, const W *bias, int64_t c,
                             float mean, float rstd, int lane, int nlanes) {
    for (int64_t j = lane; j < c; j += nlanes)
        ms_cu_store(out + j, (ms_cu_load(x + j) - mean) * rstd * ms_cu_load(weight + j) +
                                 ms_cu_load(bias + j));
}

/* Backward, with xhat = (x - mean) rstd and dxhat = weight * dout:
 *   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
 * One lane's partial sums of dxhat and dxhat * xhat. */
template <typename T, typename W>
MS_HD void ms_cu_ln_bwd_part(float *sum_dxhat, float *sum_dxhat_xhat, const T *dout, const T *x,
                             const W *weight, int64_t c, float mean, float rstd, int lane,
                             int nlanes) {
    float a = 0.0f, b = 0.0f;
    for (int64_t j = lane; j < c; j += nlanes) {
        const float xhat = (ms_cu_load(x + j) - mean) * rstd;
        const float dxhat = ms_cu_load(weight + j) * ms_cu_load(dout + j);
        a += dxhat;
        b += dxhat * xhat;
    }
    *sum_dxhat = a;
    *sum_dxhat_xhat = b;
}

/* dinp += ... over the lane's elements, from the combined sums. */
template <typename T, typename W>
MS_HD void ms_cu_ln_dinp_part(T *dinp, const T *dout, const T *x, const W *weight, int64_t c,
                              float mean, float rstd, float sum_dxhat, float sum_dxhat_xhat,
                              int lane, int nlanes) {
    const float dmean = sum_dxhat / (float)c, dnorm_mean = sum_dxhat_xhat / (float)c;
    for (int64_t j = lane; j < c; j += nlanes) {
        const float xhat = (ms_cu_load(x + j) - mean) * rstd;
        const float d =
            rstd * (ms_cu_load(weight + j) * ms_cu_load(dout + j) - dmean - xhat * dnorm_mean);
        ms_cu_store(dinp + j, ms_cu_load(dinp + j) + d);
    }
}

/* Pass 1 of dweight and dbias (colsum_math.cuh) for chunk b, column j: pw[b * c + j] = the sum
 * of xhat[r, j] dout[r, j] and pb[b * c + j] = the sum of dout[r, j] over the chunk's rows in
 * order. Either part may be NULL (its output is not wanted). */
template <typename T>
MS_HD void ms_cu_ln_dparams_part(float *pw, float *pb, const T *dout, const T *inp,
                                 const float *mean, const float *rstd, int64_t n, int64_t c,
                                 int64_t b, int64_t j) {
    int64_t lo, hi;
    ms_cu_colsum_rows(n, b, &lo, &hi);
    float dw = 0.0f, db = 0.0f;
    for (int64_t r = lo; r < hi; r++) {
        const float g = ms_cu_load(dout + r * c + j);
        db += g;
        dw += (ms_cu_load(inp + r * c + j) - mean[r]) * rstd[r] * g;
    }
    if (pw) pw[b * c + j] = dw;
    if (pb) pb[b * c + j] = db;
}

/* ---- softmax, and the row pieces cross-entropy shares ---- */

template <typename T> MS_HD float ms_cu_row_max_part(const T *x, int64_t c, int lane, int nlanes) {
    float m = -INFINITY;
    for (int64_t j = lane; j < c; j += nlanes) m = ms_cu_maxf(ms_cu_load(x + j), m);
    return m;
}

/* sum of exp(x - mx) over the lane's elements (mx: the row max, so every exponent is <= 0). */
template <typename T>
MS_HD float ms_cu_row_sumexp_part(const T *x, int64_t c, float mx, int lane, int nlanes) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += nlanes) s += expf(ms_cu_load(x + j) - mx);
    return s;
}

/* out = exp(x - mx) / sum over the lane's elements; out may alias x. */
template <typename T>
MS_HD void ms_cu_softmax_out_part(T *out, const T *x, int64_t c, float mx, float sum, int lane,
                                  int nlanes) {
    const float inv = 1.0f / sum;
    for (int64_t j = lane; j < c; j += nlanes)
        ms_cu_store(out + j, expf(ms_cu_load(x + j) - mx) * inv);
}

/* Backward: dinp += y * (dout - sum(dout * y)). The lane's part of the dot, then the update. */
template <typename T>
MS_HD float ms_cu_row_dot_part(const T *a, const T *b, int64_t c, int lane, int nlanes) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += nlanes) s += ms_cu_load(a + j) * ms_cu_load(b + j);
    return s;
}

template <typename T>
MS_HD void ms_cu_softmax_dinp_part(T *dinp, const T *dout, const T *y, int64_t c, float dot,
                                   int lane, int nlanes) {
    for (int64_t j = lane; j < c; j += nlanes) {
        const float yj = ms_cu_load(y + j);
        ms_cu_store(dinp + j, ms_cu_load(dinp + j) + yj * (ms_cu_load(dout + j) - dot));
    }
}

#endif

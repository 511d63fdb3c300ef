/* llama_math.cuh - the arithmetic of the LLaMA layers, as engine/kernels/layers.c defines it:
 * RMSNorm per row (forward and backward, split over lanes as norm_math.cuh's rows; dweight per
 * (row chunk, column) of a column reduction, colsum_math.cuh), SwiGLU per element, rotary
 * embedding per table entry and per rotated pair.
 *
 * Each expression keeps the CPU kernel's order of operations, so the host test
 * (tests/test_cuda_host.cu) agrees with layers.c up to the lane sums' and chunk sums' order,
 * FMA contraction and the device's expf / sincosf.
 */
#ifndef MS_CUDA_LLAMA_MATH_CUH
#define MS_CUDA_LLAMA_MATH_CUH

#include "engine/kernels/cuda/colsum_math.cuh"
#include "engine/kernels/cuda/math_common.cuh"
#include "engine/kernels/cuda/norm_math.cuh"

/* ---- RMSNorm: out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps) (ms_cu_ln_rstd of
 * the sum of squares) ---- */

/* sum of x^2 over the lane's elements */
template <typename T>
MS_HD float ms_cu_rms_sumsq_part(const T *x, int64_t c, int lane, int nlanes) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += nlanes) {
        const float v = ms_cu_load(x + j);
        s += v * v;
    }
    return s;
}

template <typename T>
MS_HD void ms_cu_rms_out_part(T *out, const T *x, const float *weight, int64_t c, float rstd,
                              int lane, int nlanes) {
    for (int64_t j = lane; j < c; j += nlanes)
        ms_cu_store(out + j, ms_cu_load(x + j) * rstd * weight[j]);
}

/* Backward: dx = rstd * (w g - x rstd^2 mean(w g x)). One lane's part of sum(w g x). */
template <typename T>
MS_HD float ms_cu_rms_wgx_part(const T *dout, const T *x, const float *weight, int64_t c, int lane,
                               int nlanes) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += nlanes)
        s += weight[j] * ms_cu_load(dout + j) * ms_cu_load(x + j);
    return s;
}

/* dinp += ... over the lane's elements, from the combined sum(w g x). */
template <typename T>
MS_HD void ms_cu_rms_dinp_part(T *dinp, const T *dout, const T *x, const float *weight, int64_t c,
                               float rstd, float wgx, int lane, int nlanes) {
    const float k = rstd * rstd * wgx / (float)c;
    for (int64_t j = lane; j < c; j += nlanes) {
        const float d = rstd * (weight[j] * ms_cu_load(dout + j) - ms_cu_load(x + j) * k);
        ms_cu_store(dinp + j, ms_cu_load(dinp + j) + d);
    }
}

/* Pass 1 of dweight (colsum_math.cuh) for chunk b, column j: part[b * c + j] = the sum of
 * dout[r, j] x[r, j] rstd[r] over the chunk's rows in order. */
template <typename T>
MS_HD void ms_cu_rms_dweight_part(float *part, const T *dout, const T *inp, const float *rstd,
                                  int64_t n, int64_t c, int64_t b, int64_t j) {
    int64_t lo, hi;
    ms_cu_colsum_rows(n, b, &lo, &hi);
    float dw = 0.0f;
    for (int64_t r = lo; r < hi; r++)
        dw += ms_cu_load(dout + r * c + j) * ms_cu_load(inp + r * c + j) * rstd[r];
    part[b * c + j] = dw;
}

/* ---- SwiGLU: out = silu(gate) * up, silu(g) = g sigmoid(g) ---- */

MS_HD float ms_cu_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

template <typename T> MS_HD void ms_cu_swiglu_fwd(T *out, const T *gate, const T *up, int64_t i) {
    const float g = ms_cu_load(gate + i);
    ms_cu_store(out + i, g * ms_cu_sigmoid(g) * ms_cu_load(up + i));
}

/* dgate += dout * up * silu'(gate), dup += dout * silu(gate); either may be NULL. */
template <typename T>
MS_HD void ms_cu_swiglu_bwd(T *dgate, T *dup, const T *dout, const T *gate, const T *up,
                            int64_t i) {
    const float g = ms_cu_load(gate + i), s = ms_cu_sigmoid(g), silu = g * s;
    const float dy = ms_cu_load(dout + i);
    if (dgate)
        ms_cu_store(dgate + i,
                    ms_cu_load(dgate + i) + dy * ms_cu_load(up + i) * (s + silu * (1.0f - s)));
    if (dup) ms_cu_store(dup + i, ms_cu_load(dup + i) + dy * silu);
}

/* ---- rotary: pairs (i, i + D/2) of each head vector turn by the angle of (t, i) ---- */

/* Entry e = p * (D/2) + i of the tables [T, D/2]: cos and sin of (t0 + p) theta^(-2i / D),
 * the angle in double reduced to [-pi, pi] before a float sincos (as layers.c). */
MS_HD void ms_cu_rotary_entry(float *cosb, float *sinb, int64_t t0, int64_t d, float theta,
                              int64_t e) {
    const int64_t half = d / 2, p = e / half, i = e % half;
    const double two_pi = 6.283185307179586;
    const double freq = pow((double)theta, -2.0 * (double)i / (double)d);
    double ang = (double)(t0 + p) * freq;
    ang -= two_pi * nearbyint(ang / two_pi);
    sincosf((float)ang, &sinb[e], &cosb[e]);
}

/* Pair e of x [B, T, H, D] (e = ((b T + t) H + h) D/2 + i). inverse: turn backwards and
 * accumulate into out (the backward of a rotation); else overwrite. */
template <typename T>
MS_HD void ms_cu_rotary_pair(T *out, const T *inp, const float *cosb, const float *sinb, int64_t t,
                             int64_t h, int64_t d, bool inverse, int64_t e) {
    const int64_t half = d / 2, i = e % half, row = e / half, ti = row / h % t;
    const int64_t lo = row * d + i, hi = lo + half;
    const float cs = cosb[ti * half + i], sn = sinb[ti * half + i];
    const float a = ms_cu_load(inp + lo), c = ms_cu_load(inp + hi);
    if (!inverse) {
        ms_cu_store(out + lo, a * cs - c * sn);
        ms_cu_store(out + hi, c * cs + a * sn);
    } else {
        ms_cu_store(out + lo, ms_cu_load(out + lo) + (a * cs + c * sn));
        ms_cu_store(out + hi, ms_cu_load(out + hi) + (c * cs - a * sn));
    }
}

#endif

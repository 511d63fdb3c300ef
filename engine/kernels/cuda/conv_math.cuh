/* conv_math.cuh - the arithmetic of conv.cu, per element: im2col over every group of one image
 * (engine/kernels/conv.c's layout, one group after another), col2im gathering an input
 * element's taps in ascending (ky, kx) order (the order in which the CPU's scatter adds them,
 * so dx has the CPU's bits), the bias broadcast and a channel's dbias over lanes; and the three
 * products conv.cu hands cuBLAS per image, as ms_k_gemm descriptors batched over the groups
 * (the host test runs them through the CPU's matmul). */
#ifndef MS_CUDA_CONV_MATH_CUH
#define MS_CUDA_CONV_MATH_CUH

#include "engine/kernels/conv.h"
#include "engine/kernels/cuda/math_common.cuh"

/* Rows of one group's columns: cin_g * kh * kw. */
MS_HD int64_t ms_cu_conv_col_rows(const ms_k_conv &g) {
    return g.cin_g * g.kh * g.kw;
}

/* Floats of every group's columns of one image: groups * cin_g * kh * kw * oh * ow. */
MS_HD int64_t ms_cu_conv_col_floats(const ms_k_conv &g) {
    return g.groups * ms_cu_conv_col_rows(g) * g.oh * g.ow;
}

/* col[i] of the channels x [ch, h, w] (ms_k_im2col's element i): row (c, ky, kx), column
 * (oy, ox); 0 in the padding. */
MS_HD void ms_cu_conv_im2col_elem(float *col, const float *x, const ms_k_conv &g, int64_t i) {
    const int64_t ohw = g.oh * g.ow, s = i % ohw, r = i / ohw;
    const int64_t kx = r % g.kw, ky = (r / g.kw) % g.kh, c = r / (g.kw * g.kh);
    const int64_t iy = (s / g.ow) * g.sh - g.ph + ky * g.dh;
    const int64_t ix = (s % g.ow) * g.sw - g.pw + kx * g.dw;
    col[i] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? x[(c * g.h + iy) * g.w + ix] : 0.0f;
}

/* dx[i] of [ch, h, w] += the columns of its taps: (ky, kx) such that the input row
 * oy * sh - ph + ky * dh is its row for an output row oy in [0, oh), the same for columns. */
MS_HD void ms_cu_conv_col2im_elem(float *dx, const float *col, const ms_k_conv &g, int64_t i) {
    const int64_t hw = g.h * g.w, ohw = g.oh * g.ow;
    const int64_t c = i / hw, iy = (i % hw) / g.w, ix = i % g.w;
    float acc = dx[i];
    for (int64_t ky = 0; ky < g.kh; ky++) {
        const int64_t ty = iy + g.ph - ky * g.dh;
        if (ty < 0 || ty % g.sh || ty / g.sh >= g.oh) continue;
        for (int64_t kx = 0; kx < g.kw; kx++) {
            const int64_t tx = ix + g.pw - kx * g.dw;
            if (tx < 0 || tx % g.sw || tx / g.sw >= g.ow) continue;
            acc += col[((c * g.kh + ky) * g.kw + kx) * ohw + (ty / g.sh) * g.ow + tx / g.sw];
        }
    }
    dx[i] = acc;
}

/* out[i] of [n, cout, ohw] = the bias of its channel. */
MS_HD void ms_cu_conv_bias_elem(float *out, const float *bias, int64_t cout, int64_t ohw,
                                int64_t i) {
    out[i] = bias[(i / ohw) % cout];
}

/* A lane's part of dbias[c]: dout's elements of channel c over images and positions, the
 * lane's every nlanes-th. */
MS_HD float ms_cu_conv_dbias_part(const float *dout, const ms_k_conv &g, int64_t c, int lane,
                                  int nlanes) {
    const int64_t ohw = g.oh * g.ow, cout = g.groups * g.cout_g, total = g.n * ohw;
    float s = 0.0f;
    for (int64_t j = lane; j < total; j += nlanes)
        s += dout[((j / ohw) * cout + c) * ohw + j % ohw];
    return s;
}

/* The products of one image, batched over the groups (batch strides: each operand's per-group
 * block), as gemm.cu runs them:
 *   forward  out [grp][cout_g, ohw]  = w [grp][cout_g, k] @ col [grp][k, ohw]
 *   dw       dw [grp][cout_g, k]    += dout [grp][cout_g, ohw] @ col [grp][k, ohw]^T
 *   dx       col [grp][k, ohw]       = w [grp][cout_g, k]^T @ dout [grp][cout_g, ohw]
 * with k = cin_g * kh * kw (a pointwise conv's col is x itself, and dx's product adds to dx). */
MS_HD ms_k_gemm ms_cu_conv_fwd_gemm(const ms_k_conv &g) {
    ms_k_gemm p = {};
    p.batch = g.groups, p.m = g.cout_g, p.n = g.oh * g.ow, p.k = ms_cu_conv_col_rows(g);
    return p;
}
MS_HD ms_k_gemm ms_cu_conv_dw_gemm(const ms_k_conv &g) {
    ms_k_gemm p = {};
    p.batch = g.groups, p.m = g.cout_g, p.n = ms_cu_conv_col_rows(g), p.k = g.oh * g.ow;
    p.trans_b = true;
    return p;
}
MS_HD ms_k_gemm ms_cu_conv_dx_gemm(const ms_k_conv &g) {
    ms_k_gemm p = {};
    p.batch = g.groups, p.m = ms_cu_conv_col_rows(g), p.n = g.oh * g.ow, p.k = g.cout_g;
    p.trans_a = true;
    return p;
}

#endif

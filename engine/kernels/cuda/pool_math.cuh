/* pool_math.cuh - the arithmetic of pooling, group normalisation and resizing
 * (engine/kernels/pool.h), forward and backward, as engine/kernels/pool.c defines it.
 *
 * Pooling and resizing: a forward call computes one output element with pool.h's shared
 * functions (windows, sources and each output, which the CPU kernels call too); a backward call
 * one input element, gathering from the outputs that read it (no atomics), in ascending output
 * order and onto the value it holds: the order of the CPU kernel's scatter, so the two agree
 * bit for bit up to FMA contraction. GroupNorm: a (sample, group) row is contiguous, so its
 * statistics are LayerNorm's row functions (norm_math.cuh) over C / G * S elements; the
 * backward sums dout and dout * xhat per (sample, channel) row on lanes, then per group and per
 * channel serially. All of it sums in fp32, on the lanes' tree where the CPU kernel sums a row
 * in double, so the two agree to rounding.
 */
#ifndef MS_CUDA_POOL_MATH_CUH
#define MS_CUDA_POOL_MATH_CUH

#include "engine/kernels/cuda/cuda_kernels.h" /* pool.h, with C linkage */
#include "engine/kernels/cuda/math_common.cuh"
#include "engine/kernels/cuda/norm_math.cuh"

/* ---- pooling ---- */

/* Output element o of [planes, oh, ow] (pool.h's ms_k_pool_point). */
MS_HD void ms_cu_pool_fwd(const ms_k_pool *g, float *out, int32_t *idx, const float *inp,
                          int64_t o) {
    const int64_t ohw = g->oh * g->ow, q = o % ohw;
    int32_t at;
    out[o] = ms_k_pool_point(g, inp + o / ohw * g->h * g->w, q / g->ow, q % g->ow, &at);
    if (idx) idx[o] = at;
}

/* The outputs along one dim whose windows hold input index i: [*lo, *hi]. */
MS_HD void ms_cu_pool_readers(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out, int64_t *lo,
                              int64_t *hi) {
    const int64_t t = i + p - k; /* a window starting at o s - p holds i when o s > t */
    *lo = t < 0 ? 0 : t / s + 1;
    *hi = (i + p) / s < out - 1 ? (i + p) / s : out - 1;
}

/* Input element i of [planes, h, w]: dinp[i] += each reader's share, in output order. */
MS_HD void ms_cu_pool_bwd(const ms_k_pool *g, float *dinp, const float *dout, const int32_t *idx,
                          int64_t i) {
    const int64_t hw = g->h * g->w, e = i % hw, base = i / hw * g->oh * g->ow;
    int64_t ylo, yhi, xlo, xhi;
    ms_cu_pool_readers(e / g->w, g->kh, g->sh, g->ph, g->oh, &ylo, &yhi);
    ms_cu_pool_readers(e % g->w, g->kw, g->sw, g->pw, g->ow, &xlo, &xhi);
    float v = dinp[i];
    for (int64_t y = ylo; y <= yhi; y++)
        for (int64_t x = xlo; x <= xhi; x++) {
            const int64_t o = base + y * g->ow + x;
            if (g->op == MS_K_POOL_MAX) {
                if (idx[o] == e) v += dout[o];
                continue;
            }
            int64_t r0, r1, c0, c1;
            ms_k_pool_window(g, y, x, &r0, &r1, &c0, &c1);
            v += dout[o] / ms_k_pool_divisor(g, r0, r1, c0, c1);
        }
    dinp[i] = v;
}

/* ---- group normalisation: rows are (sample, group), len = C / G * S elements ---- */

/* out = (x - mean) rstd w[c] + b[c] over the lane's elements of a row; w and b from the
 * group's first channel. */
MS_HD void ms_cu_gn_out_part(float *out, const float *x, const float *w, const float *b,
                             int64_t len, int64_t s, float mean, float rstd, int lane, int nlanes) {
    for (int64_t k = lane; k < len; k += nlanes)
        out[k] = (x[k] - mean) * rstd * w[k / s] + b[k / s];
}

/* One lane's sums over a (sample, channel) row of s elements of dout and dout * xhat. */
MS_HD void ms_cu_gn_chan_part(float *sd, float *sdx, const float *dout, const float *x, int64_t s,
                              float mean, float rstd, int lane, int nlanes) {
    float a = 0.0f, b = 0.0f;
    for (int64_t k = lane; k < s; k += nlanes) {
        a += dout[k];
        b += dout[k] * ((x[k] - mean) * rstd);
    }
    *sd = a, *sdx = b;
}

/* Row r's means over the group of w dout and w dout xhat, from the channel sums sd, sdx
 * [N, C], into ga[r], gb[r]. */
MS_HD void ms_cu_gn_group_sums(float *ga, float *gb, const float *sd, const float *sdx,
                               const float *w, const ms_k_gnorm *g, int64_t r) {
    const int64_t cpg = g->c / g->groups, c0 = r % g->groups * cpg;
    const int64_t ch = r / g->groups * g->c + c0;
    float a = 0.0f, b = 0.0f;
    for (int64_t k = 0; k < cpg; k++) a += w[c0 + k] * sd[ch + k];
    for (int64_t k = 0; k < cpg; k++) b += w[c0 + k] * sdx[ch + k];
    ga[r] = a / (float)(cpg * g->s), gb[r] = b / (float)(cpg * g->s);
}

/* dinp[e] += rstd (w dout - mean(w dout) - xhat mean(w dout xhat)) for element e of [N, C, S]. */
MS_HD void ms_cu_gn_dinp(float *dinp, const float *dout, const float *inp, const float *w,
                         const float *mean, const float *rstd, const float *ga, const float *gb,
                         const ms_k_gnorm *g, int64_t e) {
    const int64_t cpg = g->c / g->groups, len = cpg * g->s, r = e / len;
    const int64_t c = r % g->groups * cpg + e % len / g->s;
    const float xhat = (inp[e] - mean[r]) * rstd[r], wd = w[c] * dout[e];
    dinp[e] += rstd[r] * (wd - ga[r] - xhat * gb[r]);
}

/* Channel c's weight and bias gradients: the sums over samples of sdx and sd. */
MS_HD void ms_cu_gn_dparams(float *dw, float *db, const float *sd, const float *sdx,
                            const ms_k_gnorm *g, int64_t c) {
    float a = 0.0f, b = 0.0f;
    for (int64_t i = 0; i < g->n; i++) a += sd[i * g->c + c], b += sdx[i * g->c + c];
    if (dw) dw[c] += b;
    if (db) db[c] += a;
}

/* ---- resizing ---- */

/* Output element o of [planes, oh, ow] (pool.h's ms_k_resize_point). */
MS_HD void ms_cu_resize_fwd(const ms_k_resize *g, float *out, const float *inp, int64_t o) {
    const int64_t ohw = g->oh * g->ow, q = o % ohw;
    const ms_k_resize_src sh = ms_k_resize_source(q / g->ow, g->h, g->oh, g->rh, g->linear);
    const ms_k_resize_src sw = ms_k_resize_source(q % g->ow, g->w, g->ow, g->rw, g->linear);
    out[o] = ms_k_resize_point(inp + o / ohw * g->h * g->w, g->w, &sh, &sw);
}

/* The outputs along a dim that may read input index i: every o whose sources reach i lies in
 * [*lo, *hi] (a copy: i; twice the size: 2i, 2i + 1; else the interval the step r maps onto
 * [i - 1, i + 2], widened by two for rounding). */
MS_HD void ms_cu_resize_readers(int64_t i, int64_t in, int64_t out, float r, int64_t *lo,
                                int64_t *hi) {
    if (out == in) {
        *lo = *hi = i;
        return;
    }
    const int64_t a = (int64_t)floorf((float)(i - 1) / r) - 2;
    const int64_t b = (int64_t)ceilf((float)(i + 2) / r) + 2;
    *lo = a > 0 ? a : 0;
    *hi = b < out - 1 ? b : out - 1;
    if (i == in - 1) *hi = out - 1; /* the clamp sends every later output to the last input */
}

/* Input element i of [planes, h, w]: dinp[i] += (lh[a] lw[b]) dout over the outputs and terms
 * whose sources are i, in output order and (a, b) order. */
MS_HD void ms_cu_resize_bwd(const ms_k_resize *g, float *dinp, const float *dout, int64_t i) {
    const int64_t hw = g->h * g->w, y = i % hw / g->w, x = i % g->w;
    const float *d = dout + i / hw * g->oh * g->ow;
    int64_t ylo, yhi, xlo, xhi;
    ms_cu_resize_readers(y, g->h, g->oh, g->rh, &ylo, &yhi);
    ms_cu_resize_readers(x, g->w, g->ow, g->rw, &xlo, &xhi);
    float v = dinp[i];
    for (int64_t oy = ylo; oy <= yhi; oy++) {
        const ms_k_resize_src sh = ms_k_resize_source(oy, g->h, g->oh, g->rh, g->linear);
        if (sh.i[0] != y && sh.i[sh.n - 1] != y) continue;
        for (int64_t ox = xlo; ox <= xhi; ox++) {
            const ms_k_resize_src sw = ms_k_resize_source(ox, g->w, g->ow, g->rw, g->linear);
            for (int a = 0; a < sh.n; a++)
                for (int b = 0; b < sw.n; b++)
                    if (sh.i[a] == y && sw.i[b] == x) v += sh.l[a] * sw.l[b] * d[oy * g->ow + ox];
        }
    }
    dinp[i] = v;
}

#endif

/* conv.c - convolution: the direct AVX-512 kernels (conv_direct.h) where they apply, else
 * im2col and ms_blas_sgemm, one group of one image at a time, so the column buffer is the
 * smallest the GEMM can read (conv.h). The input gradient is a GEMM into the same buffer and
 * col2im; the weight gradient reads the columns again, recomputed. */
#include "engine/kernels/conv.h"

#include <stddef.h>
#include <string.h>

#include "engine/kernels/blas.h"
#include "engine/kernels/conv_direct.h"
#include "engine/kernels/elementwise_ext.h"
#include "engine/core/parallel.h"

/* The direct kernels need the packed weight; the GEMMs (any pass the direct kernels do not
 * take) one group of one image's columns. */
int64_t ms_k_conv_scratch_floats(const ms_k_conv *g) {
    const bool gemm =
        !ms_k_conv_direct_forward_ok(g) || !ms_k_conv_direct_dx_ok(g) || !ms_k_conv_direct_dw_ok(g);
    const int64_t col = ms_k_conv_pointwise(g) ? 0 : g->cin_g * g->kh * g->kw * g->oh * g->ow;
    const int64_t wk = ms_k_conv_direct_scratch_floats(g);
    return gemm && col > wk ? col : wk;
}

/* The input row and column of output (oy, ox) under tap (ky, kx); outside [0, h) x [0, w) is
 * padding. */
static inline int64_t tap_y(const ms_k_conv *g, int64_t oy, int64_t ky) {
    return oy * g->sh - g->ph + ky * g->dh;
}
static inline int64_t tap_x(const ms_k_conv *g, int64_t ox, int64_t kx) {
    return ox * g->sw - g->pw + kx * g->dw;
}

/* The one walk over the columns, row (c, ky, kx) by row: gathers x into col (dx NULL), or
 * adds col into dx. */
static void col_walk(float *col, const float *x, float *dx, int64_t ch, const ms_k_conv *g) {
    const int64_t hw = g->h * g->w;
    for (int64_t c = 0; c < ch; c++)
        for (int64_t ky = 0; ky < g->kh; ky++)
            for (int64_t kx = 0; kx < g->kw; kx++)
                for (int64_t oy = 0; oy < g->oh; oy++) {
                    const int64_t iy = tap_y(g, oy, ky);
                    const bool row_in = iy >= 0 && iy < g->h;
                    for (int64_t ox = 0; ox < g->ow; ox++, col++) {
                        const int64_t ix = tap_x(g, ox, kx), at = c * hw + iy * g->w + ix;
                        const bool in = row_in && ix >= 0 && ix < g->w;
                        if (!dx)
                            *col = in ? x[at] : 0.0f;
                        else if (in)
                            dx[at] += *col;
                    }
                }
}

void ms_k_im2col(float *col, const float *x, int64_t ch, const ms_k_conv *g) {
    col_walk(col, x, NULL, ch, g);
}

void ms_k_col2im(float *dx, const float *col, int64_t ch, const ms_k_conv *g) {
    col_walk((float *)col, NULL, dx, ch, g); /* read only: dx is set */
}

static int64_t x_at(const ms_k_conv *g, int64_t i, int64_t grp) {
    return ms_k_conv_x_at(g, i, grp);
}
static int64_t out_at(const ms_k_conv *g, int64_t i, int64_t grp) {
    return ms_k_conv_out_at(g, i, grp);
}
static int64_t w_at(const ms_k_conv *g, int64_t grp) {
    return ms_k_conv_w_at(g, grp);
}

/* The columns of image i, group grp: x itself when pointwise, else im2col into col. */
static const float *columns(const ms_k_conv *g, float *col, const float *x, int64_t i,
                            int64_t grp) {
    const float *xg = x + x_at(g, i, grp);
    if (ms_k_conv_pointwise(g)) return xg;
    ms_k_im2col(col, xg, g->cin_g, g);
    return col;
}

typedef struct fill_job {
    const ms_k_conv *g;
    float *out;
    const float *bias;
} fill_job;

/* Planes [lo, hi) of out (image-major), each its channel's bias. */
static void fill_range(void *arg, int64_t lo, int64_t hi) {
    const fill_job *j = arg;
    const int64_t ohw = j->g->oh * j->g->ow, cout = j->g->groups * j->g->cout_g;
    for (int64_t p = lo; p < hi; p++) {
        float *o = j->out + p * ohw;
        const float b = j->bias ? j->bias[p % cout] : 0.0f;
        for (int64_t s = 0; s < ohw; s++) o[s] = b;
    }
}

void ms_k_conv_fill(const ms_k_conv *g, float *out, const float *bias) {
    fill_job j = {.g = g, .out = out, .bias = bias};
    const int64_t ohw = g->oh * g->ow, grain = ohw >= 4096 ? 1 : 4096 / (ohw > 0 ? ohw : 1);
    ms_parallel_for(g->n * g->groups * g->cout_g, grain, fill_range, &j);
}

static void zero_range(void *arg, int64_t lo, int64_t hi) {
    memset((float *)arg + lo, 0, sizeof(float) * (size_t)(hi - lo));
}

void ms_k_conv_zero(float *x, int64_t n) {
    if (x && n > 0) ms_parallel_for(n, 1 << 15, zero_range, x);
}

void ms_k_conv_relu(const ms_k_conv *g, float *out) {
    ms_k_unary_forward(MS_K_UN_RELU, out, out, g->n * g->groups * g->cout_g * g->oh * g->ow, 0.0f,
                       0.0f);
}

void ms_k_conv_forward(const ms_k_conv *g, float *out, float *col, const float *x, const float *w,
                       const float *bias) {
    const int64_t ohw = g->oh * g->ow, k = g->cin_g * g->kh * g->kw;
    if (k > 0 && ms_k_conv_direct_forward_ok(g)) { /* the bias and ReLU with the sums */
        ms_k_conv_direct_forward(g, out, col, x, w, bias);
        return;
    }
    /* The bias first and beta 1: the GEMM adds its sum to it, one rounding as gemm + bias. */
    ms_k_conv_fill(g, out, bias);
    for (int64_t i = 0; k > 0 && i < g->n; i++) /* k 0: no input channel here, the bias alone */
        for (int64_t grp = 0; grp < g->groups; grp++)
            ms_blas_sgemm(false, false, g->cout_g, ohw, k, 1.0f, w + w_at(g, grp), k,
                          columns(g, col, x, i, grp), ohw, 1.0f, out + out_at(g, i, grp), ohw);
    if (g->relu) ms_k_conv_relu(g, out);
}

/* dbias[c] += the sum of dout over images and positions: image by image, the positions of
 * each in SIMD lanes (one fixed order). */
static void conv_dbias(const ms_k_conv *g, float *dbias, const float *dout) {
    const int64_t ohw = g->oh * g->ow, cout = g->groups * g->cout_g;
    for (int64_t c = 0; c < cout; c++) {
        float sum = 0.0f;
        for (int64_t i = 0; i < g->n; i++) {
            const float *d = dout + (i * cout + c) * ohw;
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int64_t s = 0; s < ohw; s++) part += d[s];
            sum += part;
        }
        dbias[c] += sum;
    }
}

/* dx of image i, group grp: W^T dout into the columns, scattered back; pointwise: straight
 * into dx (beta 1). */
static void conv_dx(const ms_k_conv *g, float *dx, float *col, const float *dy, const float *w,
                    int64_t i, int64_t grp) {
    const int64_t ohw = g->oh * g->ow, k = g->cin_g * g->kh * g->kw;
    float *dxg = dx + x_at(g, i, grp);
    if (ms_k_conv_pointwise(g)) {
        ms_blas_sgemm(true, false, k, ohw, g->cout_g, 1.0f, w + w_at(g, grp), k, dy, ohw, 1.0f, dxg,
                      ohw);
        return;
    }
    ms_blas_sgemm(true, false, k, ohw, g->cout_g, 1.0f, w + w_at(g, grp), k, dy, ohw, 0.0f, col,
                  ohw);
    ms_k_col2im(dxg, col, g->cin_g, g);
}

void ms_k_conv_backward(const ms_k_conv *g, float *dx, float *dw, float *dbias, float *col,
                        const float *dout, const float *x, const float *w, bool dx_fresh) {
    const int64_t ohw = g->oh * g->ow, k = g->cin_g * g->kh * g->kw;
    const bool direct_dx = dx && k > 0 && g->cout_g > 0 && ms_k_conv_direct_dx_ok(g);
    if (dx && dx_fresh && !direct_dx) ms_k_conv_zero(dx, g->n * g->c_x * g->h * g->w);
    if (k == 0 || g->cout_g == 0) {
        if (dbias) conv_dbias(g, dbias, dout);
        return;
    }
    const bool direct_dw = dw && ms_k_conv_direct_dw_ok(g);
    if (!(direct_dw && ms_k_conv_direct_dw(g, dw, col, dout, x, dbias)) && dbias)
        conv_dbias(g, dbias, dout);
    if (dw && !direct_dw) /* dw[grp] += dout [cout_g, ohw] @ columns^T [ohw, k] */
        for (int64_t i = 0; i < g->n; i++)
            for (int64_t grp = 0; grp < g->groups; grp++)
                ms_blas_sgemm(false, true, g->cout_g, k, ohw, 1.0f, dout + out_at(g, i, grp), ohw,
                              columns(g, col, x, i, grp), ohw, 1.0f, dw + w_at(g, grp), k);
    if (direct_dx)
        ms_k_conv_direct_dx(g, dx, col, dout, w, dx_fresh);
    else if (dx)
        for (int64_t i = 0; i < g->n; i++)
            for (int64_t grp = 0; grp < g->groups; grp++)
                conv_dx(g, dx, col, dout + out_at(g, i, grp), w, i, grp);
}

ms_k_cost ms_k_conv_cost(const ms_k_conv *g, bool bias, bool backward) {
    const double cout = (double)g->groups * g->cout_g, k = (double)g->cin_g * g->kh * g->kw;
    const double ny = (double)g->n * cout * g->oh * g->ow;
    const double nx = (double)g->n * g->groups * g->cin_g * g->h * g->w, nw = cout * k;
    const double gemm = 2.0 * ny * k, nb = bias ? cout : 0;
    ms_k_cost c = {0, 0};
    if (!backward) {
        c.flops = gemm + (bias ? ny : 0);
        c.bytes = 4.0 * (nx + nw + nb + ny);
        return c;
    }
    /* dx reads dout and w, writes dx; dw reads dout and x, writes dw; dbias reads dout. */
    c.flops = 2 * gemm + (bias ? ny : 0);
    c.bytes = 4.0 * ((ny + nw + nx) + (ny + nx + nw) + (bias ? ny + nb : 0));
    return c;
}

/* conv.cu - the convolution slots of the kernel table. Per image: im2col of every group into
 * the column buffer (one thread per element) and one cuBLAS product batched over the groups
 * (ms_cu_gemm_forward, fp32 accumulation, as gemm.cu's slots); the input gradient a product
 * into the columns and col2im, one thread per input element gathering its taps (no atomics:
 * the CPU's order); dbias a block per channel over the lane tree. The arithmetic and the
 * products' descriptors are conv_math.cuh's. The column buffer is the caller's, every group of
 * one image (ms_cu_conv_scratch_floats); a pointwise conv reads x as its columns. */
#include "engine/kernels/cuda/conv_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

int64_t ms_cu_conv_scratch_floats(const ms_k_conv *g) {
    return ms_k_conv_pointwise(g) ? 0 : ms_cu_conv_col_floats(*g);
}

/* Where image i starts in x (its first channel read) and in out. */
static int64_t x_image(const ms_k_conv &g, int64_t i) {
    return (i * g.c_x + g.c0) * g.h * g.w;
}
static int64_t y_image(const ms_k_conv &g, int64_t i) {
    return i * g.groups * g.cout_g * g.oh * g.ow;
}

/* The columns of image i: x itself when pointwise, else its im2col in col. */
static ms_status columns(ms_kctx *kc, const ms_k_conv &g, float *col, const float *x, int64_t i,
                         const float **cols, ms_error *err) {
    const float *xi = x + x_image(g, i);
    *cols = xi;
    if (ms_k_conv_pointwise(&g)) return MS_OK;
    if (!col) return ms_fail(err, MS_ERR_INVALID, "cuda conv: no column buffer");
    *cols = col;
    return ms_cu_each(ms_cu_conv_col_floats(g), kc, "conv im2col", err,
                      [=] __device__(int64_t j) { ms_cu_conv_im2col_elem(col, xi, g, j); });
}

static ms_status zero(ms_kctx *kc, float *p, int64_t n, ms_error *err) {
    if (!p || n <= 0) return MS_OK;
    MS_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(float) * (size_t)n, (cudaStream_t)ms_cu_stream(kc)),
                  err);
    return MS_OK;
}

ms_status ms_cu_conv_forward(ms_kctx *kc, const ms_k_conv *gp, float *out, float *col,
                             const float *x, const float *w, const float *bias, ms_error *err) {
    const ms_k_conv g = *gp;
    const int64_t cout = g.groups * g.cout_g, ohw = g.oh * g.ow, ny = g.n * cout * ohw;
    const bool empty = ms_cu_conv_col_rows(g) == 0; /* no input channel on this rank */
    /* The bias first and beta 1: the product adds its sum to it, as the CPU kernel does. */
    if (bias)
        MS_CHECK(ms_cu_each(ny, kc, "conv bias", err, [=] __device__(int64_t i) {
            ms_cu_conv_bias_elem(out, bias, cout, ohw, i);
        }));
    else if (empty)
        MS_CHECK(zero(kc, out, ny, err));
    const ms_k_gemm p = ms_cu_conv_fwd_gemm(g);
    for (int64_t i = 0; !empty && i < g.n; i++) {
        const float *cols;
        MS_CHECK(columns(kc, g, col, x, i, &cols, err));
        MS_CHECK(ms_cu_gemm_forward(kc, &p, out + y_image(g, i), MS_CU_F32, w, cols, MS_CU_F32,
                                    1.0f, bias ? 1.0f : 0.0f, err));
    }
    if (!g.relu) return MS_OK;
    return ms_cu_each(ny, kc, "conv relu", err, [=] __device__(int64_t i) {
        out[i] = out[i] > 0.0f ? out[i] : 0.0f; /* NaN -> 0, as relu's */
    });
}

/* dbias[c] (+)= its channel's sum, a block per channel. */
static ms_status conv_dbias(ms_kctx *kc, const ms_k_conv &g, float *dbias, const float *dout,
                            bool fresh, ms_error *err) {
    return ms_cu_rows(
        g.groups * g.cout_g, kc, "conv dbias", err, [=] __device__(int64_t c, int lane) {
            const float s =
                ms_cu_block_sum(ms_cu_conv_dbias_part(dout, g, c, lane, MS_CU_ROW_LANES));
            if (lane == 0) dbias[c] = (fresh ? 0.0f : dbias[c]) + s;
        });
}

/* dx of image i: W^T dout into the columns, gathered back; pointwise straight into dx. */
static ms_status conv_dx(ms_kctx *kc, const ms_k_conv &g, float *dx, float *col, const float *dy,
                         const float *w, int64_t i, ms_error *err) {
    const ms_k_gemm p = ms_cu_conv_dx_gemm(g);
    float *dxi = dx + x_image(g, i);
    if (ms_k_conv_pointwise(&g))
        return ms_cu_gemm_forward(kc, &p, dxi, MS_CU_F32, w, dy, MS_CU_F32, 1.0f, 1.0f, err);
    if (!col) return ms_fail(err, MS_ERR_INVALID, "cuda conv: no column buffer");
    MS_CHECK(ms_cu_gemm_forward(kc, &p, col, MS_CU_F32, w, dy, MS_CU_F32, 1.0f, 0.0f, err));
    return ms_cu_each(g.groups * g.cin_g * g.h * g.w, kc, "conv col2im", err,
                      [=] __device__(int64_t j) { ms_cu_conv_col2im_elem(dxi, col, g, j); });
}

ms_status ms_cu_conv_backward(ms_kctx *kc, const ms_k_conv *gp, float *dx, float *dw, float *dbias,
                              float *col, const float *dout, const float *x, const float *w,
                              unsigned fresh, ms_error *err) {
    const ms_k_conv g = *gp;
    const int64_t cout = g.groups * g.cout_g, k = ms_cu_conv_col_rows(g);
    if (fresh & 1u) MS_CHECK(zero(kc, dx, g.n * g.c_x * g.h * g.w, err));
    if (fresh & 2u) MS_CHECK(zero(kc, dw, cout * k, err));
    if (dbias) MS_CHECK(conv_dbias(kc, g, dbias, dout, fresh & 4u, err));
    if (k == 0 || cout == 0 || (!dx && !dw)) return MS_OK;
    const ms_k_gemm pw = ms_cu_conv_dw_gemm(g);
    for (int64_t i = 0; i < g.n; i++) {
        const float *dy = dout + y_image(g, i);
        if (dw) {
            const float *cols;
            MS_CHECK(columns(kc, g, col, x, i, &cols, err));
            MS_CHECK(
                ms_cu_gemm_forward(kc, &pw, dw, MS_CU_F32, dy, cols, MS_CU_F32, 1.0f, 1.0f, err));
        }
        if (dx) MS_CHECK(conv_dx(kc, g, dx, col, dy, w, i, err));
    }
    return MS_OK;
}

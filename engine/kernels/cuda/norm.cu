/* norm.cu - LayerNorm, softmax and cross-entropy: one block per row around the row functions
 * of norm_math.cuh and xent_math.cuh, the lanes combined by the block's tree (launch.cuh). */
#include "engine/kernels/cuda/launch.cuh"
#include "engine/kernels/cuda/norm_math.cuh"
#include "engine/kernels/cuda/xent_math.cuh"

/* ---- LayerNorm: T the activations' storage, W the parameters'; mean and rstd fp32 ---- */

template <typename T, typename W>
static ms_status layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const W *weight,
                                   const W *bias, int64_t n, int64_t c, float eps, ms_kctx *kc,
                                   const char *what, ms_error *err) {
    return ms_cu_rows(n, kc, what, err, [=] __device__(int64_t r, int lane) {
        const T *x = inp + r * c;
        const float m = ms_cu_block_sum(ms_cu_row_sum_part(x, c, lane, MS_CU_ROW_LANES)) / (float)c;
        const float sq = ms_cu_block_sum(ms_cu_ln_sqdev_part(x, c, m, lane, MS_CU_ROW_LANES));
        const float s = ms_cu_ln_rstd(sq, c, eps);
        ms_cu_ln_out_part(out + r * c, x, weight, bias, c, m, s, lane, MS_CU_ROW_LANES);
        if (lane == 0) mean[r] = m, rstd[r] = s;
    });
}

/* dinp one block per row; dweight and dbias the two passes of colsum_math.cuh, their partials
 * in scratch [2, chunks, c] (dweight's, then dbias's). */
template <typename T, typename W>
static ms_status layernorm_backward(T *dinp, W *dweight, W *dbias, float *scratch, const T *dout,
                                    const T *inp, const W *weight, const float *mean,
                                    const float *rstd, int64_t n, int64_t c, ms_kctx *kc,
                                    const char *what, ms_error *err) {
    if (dinp)
        MS_CHECK(ms_cu_rows(n, kc, what, err, [=] __device__(int64_t r, int l) {
            const T *g = dout + r * c, *x = inp + r * c;
            float a, b;
            ms_cu_ln_bwd_part(&a, &b, g, x, weight, c, mean[r], rstd[r], l, MS_CU_ROW_LANES);
            a = ms_cu_block_sum(a);
            b = ms_cu_block_sum(b);
            ms_cu_ln_dinp_part(dinp + r * c, g, x, weight, c, mean[r], rstd[r], a, b, l,
                               MS_CU_ROW_LANES);
        }));
    if ((!dweight && !dbias) || n <= 0 || c <= 0) return MS_OK;
    MS_CHECK(ms_cu_colsum_scratch(scratch, what, err));
    const int64_t chunks = ms_cu_colsum_chunks(n);
    float *pw = dweight ? scratch : NULL, *pb = dbias ? scratch + chunks * c : NULL;
    MS_CHECK(ms_cu_chunks(n, c, kc, what, err, [=] __device__(int64_t b, int64_t j) {
        ms_cu_ln_dparams_part(pw, pb, dout, inp, mean, rstd, n, c, b, j);
    }));
    return ms_cu_each(c, kc, what, err, [=] __device__(int64_t j) {
        if (dweight) ms_cu_colsum_finish(dweight, pw, chunks, c, j);
        if (dbias) ms_cu_colsum_finish(dbias, pb, chunks, c, j);
    });
}

ms_status ms_cu_layernorm_forward(ms_kctx *kc, float *out, float *mean, float *rstd,
                                  const float *inp, const float *weight, const float *bias,
                                  int64_t n, int64_t c, float eps, ms_error *err) {
    return layernorm_forward(out, mean, rstd, inp, weight, bias, n, c, eps, kc, "layernorm forward",
                             err);
}

ms_status ms_cu_layernorm_forward_bf16(ms_kctx *kc, uint16_t *out, float *mean, float *rstd,
                                       const uint16_t *inp, const uint16_t *weight,
                                       const uint16_t *bias, int64_t n, int64_t c, float eps,
                                       ms_error *err) {
    return layernorm_forward(ms_cu_bf(out), mean, rstd, ms_cu_bf(inp), ms_cu_bf(weight),
                             ms_cu_bf(bias), n, c, eps, kc, "layernorm forward (bf16)", err);
}

ms_status ms_cu_layernorm_backward(ms_kctx *kc, float *dinp, float *dweight, float *dbias,
                                   float *scratch, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd,
                                   int64_t n, int64_t c, ms_error *err) {
    return layernorm_backward(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, n, c,
                              kc, "layernorm backward", err);
}

ms_status ms_cu_layernorm_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dweight,
                                        uint16_t *dbias, float *scratch, const uint16_t *dout,
                                        const uint16_t *inp, const uint16_t *weight,
                                        const float *mean, const float *rstd, int64_t n, int64_t c,
                                        ms_error *err) {
    return layernorm_backward(ms_cu_bf(dinp), ms_cu_bf(dweight), ms_cu_bf(dbias), scratch,
                              ms_cu_bf(dout), ms_cu_bf(inp), ms_cu_bf(weight), mean, rstd, n, c, kc,
                              "layernorm backward (bf16)", err);
}

/* ---- softmax ---- */

ms_status ms_cu_softmax_forward(ms_kctx *kc, float *out, const float *inp, int64_t n, int64_t c,
                                ms_error *err) {
    return ms_cu_rows(n, kc, "softmax forward", err, [=] __device__(int64_t r, int lane) {
        const float *x = inp + r * c;
        const float mx = ms_cu_block_max(ms_cu_row_max_part(x, c, lane, MS_CU_ROW_LANES));
        const float sum = ms_cu_block_sum(ms_cu_row_sumexp_part(x, c, mx, lane, MS_CU_ROW_LANES));
        ms_cu_softmax_out_part(out + r * c, x, c, mx, sum, lane, MS_CU_ROW_LANES);
    });
}

ms_status ms_cu_softmax_backward(ms_kctx *kc, float *dinp, const float *dout, const float *out,
                                 int64_t n, int64_t c, ms_error *err) {
    return ms_cu_rows(n, kc, "softmax backward", err, [=] __device__(int64_t r, int lane) {
        const float *g = dout + r * c, *y = out + r * c;
        const float dot = ms_cu_block_sum(ms_cu_row_dot_part(g, y, c, lane, MS_CU_ROW_LANES));
        ms_cu_softmax_dinp_part(dinp + r * c, g, y, c, dot, lane, MS_CU_ROW_LANES);
    });
}

/* ---- cross-entropy: the vocab-parallel pieces (the engine's only form, one rank too) ---- */

/* The vocab-parallel pieces over logits of storage T (float, or ms_bf16 unstaged). */
template <typename T>
static ms_status xent_vp_rowmax(float *lmax, const T *logits, int64_t n, int64_t vl, ms_kctx *kc,
                                ms_error *err) {
    return ms_cu_rows(n, kc, "cross-entropy row max", err, [=] __device__(int64_t r, int l) {
        const float m =
            ms_cu_block_max(ms_cu_row_max_part(logits + r * vl, vl, l, MS_CU_ROW_LANES));
        if (l == 0) lmax[r] = m;
    });
}

template <typename T>
static ms_status xent_vp_sumexp(float *lsum, const T *logits, const float *gmax, int64_t n,
                                int64_t vl, ms_kctx *kc, ms_error *err) {
    return ms_cu_rows(n, kc, "cross-entropy sum of exp", err, [=] __device__(int64_t r, int l) {
        const float s = ms_cu_block_sum(
            ms_cu_row_sumexp_part(logits + r * vl, vl, gmax[r], l, MS_CU_ROW_LANES));
        if (l == 0) lsum[r] = s;
    });
}

template <typename T>
static ms_status xent_vp_target(float *ltgt, const T *logits, const int32_t *targets, int64_t n,
                                int64_t vl, int64_t v0, ms_kctx *kc, ms_error *err) {
    return ms_cu_each(n, kc, "cross-entropy target", err, [=] __device__(int64_t r) {
        ltgt[r] = ms_cu_xent_target(logits + r * vl, targets[r], vl, v0);
    });
}

template <typename T>
static ms_status xent_vp_backward(T *dlogits, const T *logits, const float *gmax, const float *gsum,
                                  const int32_t *targets, const T *dlosses, int64_t n, int64_t vl,
                                  int64_t v0, unsigned fresh, ms_kctx *kc, ms_error *err) {
    const bool f = fresh & 1u;
    return ms_cu_each(n * vl, kc, "cross-entropy backward (vocab slice)", err,
                      [=] __device__(int64_t i) {
                          const int64_t r = i / vl;
                          ms_cu_xent_vp_grad(dlogits + r * vl, logits + r * vl, i % vl, gmax[r],
                                             gsum[r], targets[r], ms_cu_load(dlosses + r), v0, f);
                      });
}

ms_status ms_cu_xent_vp_rowmax(ms_kctx *kc, float *lmax, const float *logits, int64_t n, int64_t vl,
                               ms_error *err) {
    return xent_vp_rowmax(lmax, logits, n, vl, kc, err);
}

ms_status ms_cu_xent_vp_sumexp(ms_kctx *kc, float *lsum, const float *logits, const float *gmax,
                               int64_t n, int64_t vl, ms_error *err) {
    return xent_vp_sumexp(lsum, logits, gmax, n, vl, kc, err);
}

ms_status ms_cu_xent_vp_target(ms_kctx *kc, float *ltgt, const float *logits,
                               const int32_t *targets, int64_t n, int64_t vl, int64_t v0,
                               ms_error *err) {
    return xent_vp_target(ltgt, logits, targets, n, vl, v0, kc, err);
}

ms_status ms_cu_xent_vp_loss(ms_kctx *kc, float *losses, const float *gmax, const float *gsum,
                             const float *gtgt, const int32_t *targets, int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "cross-entropy loss", err, [=] __device__(int64_t r) {
        losses[r] = ms_cu_xent_loss(gmax[r], gsum[r], gtgt[r], targets[r]);
    });
}

ms_status ms_cu_xent_vp_backward(ms_kctx *kc, float *dlogits, const float *logits,
                                 const float *gmax, const float *gsum, const int32_t *targets,
                                 const float *dlosses, int64_t n, int64_t vl, int64_t v0,
                                 unsigned fresh, ms_error *err) {
    return xent_vp_backward(dlogits, logits, gmax, gsum, targets, dlosses, n, vl, v0, fresh, kc,
                            err);
}

ms_status ms_cu_xent_vp_rowmax_bf16(ms_kctx *kc, float *lmax, const uint16_t *logits, int64_t n,
                                    int64_t vl, ms_error *err) {
    return xent_vp_rowmax(lmax, ms_cu_bf(logits), n, vl, kc, err);
}

ms_status ms_cu_xent_vp_sumexp_bf16(ms_kctx *kc, float *lsum, const uint16_t *logits,
                                    const float *gmax, int64_t n, int64_t vl, ms_error *err) {
    return xent_vp_sumexp(lsum, ms_cu_bf(logits), gmax, n, vl, kc, err);
}

ms_status ms_cu_xent_vp_target_bf16(ms_kctx *kc, float *ltgt, const uint16_t *logits,
                                    const int32_t *targets, int64_t n, int64_t vl, int64_t v0,
                                    ms_error *err) {
    return xent_vp_target(ltgt, ms_cu_bf(logits), targets, n, vl, v0, kc, err);
}

ms_status ms_cu_xent_vp_backward_bf16(ms_kctx *kc, uint16_t *dlogits, const uint16_t *logits,
                                      const float *gmax, const float *gsum, const int32_t *targets,
                                      const uint16_t *dlosses, int64_t n, int64_t vl, int64_t v0,
                                      unsigned fresh, ms_error *err) {
    return xent_vp_backward(ms_cu_bf(dlogits), ms_cu_bf(logits), gmax, gsum, targets,
                            ms_cu_bf(dlosses), n, vl, v0, fresh, kc, err);
}

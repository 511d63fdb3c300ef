/* fused.cu - bias + GELU, bias + dropout + residual add (one thread per element forward; the
 * backward one thread per (row chunk, column) doing the elementwise gradients and the chunk's
 * dbias partial, then one per column adding the partials: colsum_math.cuh), and gather /
 * scatter-add (one thread per output element; the scatter adds with atomics, so repeated rows
 * add in any order). */
#include "engine/kernels/cuda/fused_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

template <typename T>
static ms_status bias_gelu_forward(T *out, const T *inp, const T *bias, int64_t n, int64_t c,
                                   ms_kctx *kc, ms_error *err) {
    return ms_cu_each(n * c, kc, "bias gelu forward", err,
                      [=] __device__(int64_t i) { ms_cu_bias_gelu_fwd(out, inp, bias, c, i); });
}

/* The dbias partials of a fused backward in scratch [chunks, c], added up by pass 2; without
 * dbias pass 1 alone does the elementwise gradients. */
static ms_status fused_colsum_check(void *dbias, float *scratch, const char *what, ms_error *err) {
    return dbias ? ms_cu_colsum_scratch(scratch, what, err) : MS_OK;
}

template <typename T>
static ms_status bias_gelu_backward(T *dinp, T *dbias, float *scratch, const T *dout, const T *inp,
                                    const T *bias, int64_t n, int64_t c, unsigned fresh,
                                    ms_kctx *kc, ms_error *err) {
    const char *what = "bias gelu backward";
    const bool fx = fresh & 1u;
    if ((!dinp && !dbias) || n <= 0 || c <= 0) return MS_OK;
    MS_CHECK(fused_colsum_check(dbias, scratch, what, err));
    float *part = dbias ? scratch : NULL;
    MS_CHECK(ms_cu_chunks(n, c, kc, what, err, [=] __device__(int64_t b, int64_t k) {
        ms_cu_bias_gelu_bwd_part(dinp, part, dout, inp, bias, n, c, b, k, fx);
    }));
    if (!dbias) return MS_OK;
    const int64_t chunks = ms_cu_colsum_chunks(n);
    return ms_cu_each(c, kc, what, err, [=] __device__(int64_t k) {
        ms_cu_colsum_finish(dbias, part, chunks, c, k);
    });
}

static ms_cu_box bda_box(const ms_k_fused_dropout *d) {
    const ms_k_batch_window *w = d->box.w;
    return ms_cu_box_make(d->box.ndim, d->box.lshape, d->box.gstart, d->box.gshape, w ? w->rows : 0,
                          w ? w->stride : 0, w ? w->offset : 0);
}

static int64_t bda_numel(const ms_k_fused_dropout *d) {
    int64_t n = 1;
    for (int k = 0; k < d->box.ndim; k++) n *= d->box.lshape[k];
    return n;
}

template <typename T>
static ms_status bda_forward(T *out, const T *inp, const T *bias, const T *res, int64_t nb,
                             const ms_k_fused_dropout *d, ms_kctx *kc, ms_error *err) {
    if (d->box.ndim > 8) return ms_fail(err, MS_ERR_INVALID, "bias_dropout_add: over 8 dims");
    const ms_cu_box b = bda_box(d);
    const float p = d->p;
    const uint64_t seed = d->seed, sid = d->stream;
    const int64_t nbv = nb > 0 ? nb : 1;
    return ms_cu_each(bda_numel(d), kc, "bias dropout add forward", err, [=] __device__(int64_t i) {
        ms_cu_bda_fwd(out, inp, bias, res, nbv, p, seed, sid, b, i);
    });
}

template <typename T>
static ms_status bda_backward(T *dinp, T *dbias, T *dres, float *scratch, const T *dout, int64_t nb,
                              const ms_k_fused_dropout *d, unsigned fresh, ms_kctx *kc,
                              ms_error *err) {
    const char *what = "bias dropout add backward";
    if (d->box.ndim > 8) return ms_fail(err, MS_ERR_INVALID, "bias_dropout_add: over 8 dims");
    const ms_cu_box b = bda_box(d);
    const float p = d->p;
    const uint64_t seed = d->seed, sid = d->stream;
    const int64_t nbv = nb > 0 ? nb : 1, rows = bda_numel(d) / nbv;
    if ((!dinp && !dbias && !dres) || rows <= 0) return MS_OK;
    MS_CHECK(fused_colsum_check(dbias, scratch, what, err));
    float *part = dbias ? scratch : NULL;
    MS_CHECK(ms_cu_chunks(rows, nbv, kc, what, err, [=] __device__(int64_t ch, int64_t k) {
        ms_cu_bda_bwd_part(dinp, part, dres, dout, rows, nbv, p, seed, sid, b, ch, k, fresh);
    }));
    if (!dbias) return MS_OK;
    const int64_t chunks = ms_cu_colsum_chunks(rows);
    return ms_cu_each(nbv, kc, what, err, [=] __device__(int64_t k) {
        ms_cu_colsum_finish(dbias, part, chunks, nbv, k);
    });
}

ms_status ms_cu_bias_gelu_forward(ms_kctx *kc, float *out, const float *inp, const float *bias,
                                  int64_t n, int64_t c, ms_error *err) {
    return bias_gelu_forward(out, inp, bias, n, c, kc, err);
}

ms_status ms_cu_bias_gelu_backward(ms_kctx *kc, float *dinp, float *dbias, float *scratch,
                                   const float *dout, const float *inp, const float *bias,
                                   int64_t n, int64_t c, unsigned fresh, ms_error *err) {
    return bias_gelu_backward(dinp, dbias, scratch, dout, inp, bias, n, c, fresh, kc, err);
}

ms_status ms_cu_bias_dropout_add_forward(ms_kctx *kc, float *out, const float *inp,
                                         const float *bias, const float *res, int64_t nb,
                                         const ms_k_fused_dropout *d, ms_error *err) {
    return bda_forward(out, inp, bias, res, nb, d, kc, err);
}

ms_status ms_cu_bias_dropout_add_backward(ms_kctx *kc, float *dinp, float *dbias, float *dres,
                                          float *scratch, const float *dout, int64_t nb,
                                          const ms_k_fused_dropout *d, unsigned fresh,
                                          ms_error *err) {
    return bda_backward(dinp, dbias, dres, scratch, dout, nb, d, fresh, kc, err);
}

/* bf16 storage: the same templates, every operand bf16. */
ms_status ms_cu_bias_gelu_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp,
                                       const uint16_t *bias, int64_t n, int64_t c, ms_error *err) {
    return bias_gelu_forward(ms_cu_bf(out), ms_cu_bf(inp), ms_cu_bf(bias), n, c, kc, err);
}

ms_status ms_cu_bias_gelu_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                        float *scratch, const uint16_t *dout, const uint16_t *inp,
                                        const uint16_t *bias, int64_t n, int64_t c, unsigned fresh,
                                        ms_error *err) {
    return bias_gelu_backward(ms_cu_bf(dinp), ms_cu_bf(dbias), scratch, ms_cu_bf(dout),
                              ms_cu_bf(inp), ms_cu_bf(bias), n, c, fresh, kc, err);
}

ms_status ms_cu_bias_dropout_add_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp,
                                              const uint16_t *bias, const uint16_t *res, int64_t nb,
                                              const ms_k_fused_dropout *d, ms_error *err) {
    return bda_forward(ms_cu_bf(out), ms_cu_bf(inp), ms_cu_bf(bias), ms_cu_bf(res), nb, d, kc, err);
}

ms_status ms_cu_bias_dropout_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                               uint16_t *dres, float *scratch, const uint16_t *dout,
                                               int64_t nb, const ms_k_fused_dropout *d,
                                               unsigned fresh, ms_error *err) {
    return bda_backward(ms_cu_bf(dinp), ms_cu_bf(dbias), ms_cu_bf(dres), scratch, ms_cu_bf(dout),
                        nb, d, fresh, kc, err);
}

ms_status ms_cu_gather(ms_kctx *kc, float *out, const float *x, const float *ids,
                       const ms_k_gather_dims *g, bool accumulate, ms_error *err) {
    const ms_k_gather_dims d = *g;
    return ms_cu_each(d.o * d.l * d.i, kc, "gather", err, [=] __device__(int64_t e) {
        const int64_t j = e % d.i, li = (e / d.i) % d.l, a = e / (d.i * d.l);
        const int64_t r = ms_cu_gather_row(ids, d.o, d.d, d.l, d.i, d.d0, d.ids_per_row,
                                           d.ids_per_outer, a, li, j);
        const float v = r < 0 ? 0.0f : x[(a * d.d + r) * d.i + j];
        out[e] = accumulate ? out[e] + v : v;
    });
}

ms_status ms_cu_scatter_add(ms_kctx *kc, float *x, const float *src, const float *ids,
                            const ms_k_gather_dims *g, ms_error *err) {
    const ms_k_gather_dims d = *g;
    return ms_cu_each(d.o * d.l * d.i, kc, "scatter add", err, [=] __device__(int64_t e) {
        const int64_t j = e % d.i, li = (e / d.i) % d.l, a = e / (d.i * d.l);
        const int64_t r = ms_cu_gather_row(ids, d.o, d.d, d.l, d.i, d.d0, d.ids_per_row,
                                           d.ids_per_outer, a, li, j);
        if (r >= 0) atomicAdd(&x[(a * d.d + r) * d.i + j], src[e]);
    });
}

/* fused.cu - bias + GELU, bias + dropout + residual add (one thread per element forward, one
 * per column backward, rows in order, as the CPU), and gather / scatter-add (one thread per
 * output element; the scatter adds with atomics, so repeated rows add in any order). */
#include "engine/kernels/cuda/fused_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

template <typename T>
static ms_status bias_gelu_forward(T *out, const T *inp, const T *bias, int64_t n, int64_t c,
                                   void *stream, ms_error *err) {
    return ms_cu_each(n * c, stream, "bias gelu forward", err,
                      [=] __device__(int64_t i) { ms_cu_bias_gelu_fwd(out, inp, bias, c, i); });
}

template <typename T>
static ms_status bias_gelu_backward(T *dinp, T *dbias, const T *dout, const T *inp, const T *bias,
                                    int64_t n, int64_t c, void *stream, ms_error *err) {
    return ms_cu_each(c, stream, "bias gelu backward", err, [=] __device__(int64_t k) {
        ms_cu_bias_gelu_bwd_col(dinp, dbias, dout, inp, bias, n, c, k);
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
                             const ms_k_fused_dropout *d, void *stream, ms_error *err) {
    if (d->box.ndim > 8) return ms_fail(err, MS_ERR_INVALID, "bias_dropout_add: over 8 dims");
    const ms_cu_box b = bda_box(d);
    const float p = d->p;
    const uint64_t seed = d->seed, sid = d->stream;
    const int64_t nbv = nb > 0 ? nb : 1;
    return ms_cu_each(
        bda_numel(d), stream, "bias dropout add forward", err,
        [=] __device__(int64_t i) { ms_cu_bda_fwd(out, inp, bias, res, nbv, p, seed, sid, b, i); });
}

template <typename T>
static ms_status bda_backward(T *dinp, T *dbias, T *dres, const T *dout, int64_t nb,
                              const ms_k_fused_dropout *d, void *stream, ms_error *err) {
    if (d->box.ndim > 8) return ms_fail(err, MS_ERR_INVALID, "bias_dropout_add: over 8 dims");
    const ms_cu_box b = bda_box(d);
    const float p = d->p;
    const uint64_t seed = d->seed, sid = d->stream;
    const int64_t nbv = nb > 0 ? nb : 1, rows = bda_numel(d) / nbv;
    return ms_cu_each(nbv, stream, "bias dropout add backward", err, [=] __device__(int64_t k) {
        ms_cu_bda_bwd_col(dinp, dbias, dres, dout, rows, nbv, p, seed, sid, b, k);
    });
}

ms_status ms_cu_bias_gelu_forward(float *out, const float *inp, const float *bias, int64_t n,
                                  int64_t c, void *stream, ms_error *err) {
    return bias_gelu_forward(out, inp, bias, n, c, stream, err);
}

ms_status ms_cu_bias_gelu_backward(float *dinp, float *dbias, const float *dout, const float *inp,
                                   const float *bias, int64_t n, int64_t c, void *stream,
                                   ms_error *err) {
    return bias_gelu_backward(dinp, dbias, dout, inp, bias, n, c, stream, err);
}

ms_status ms_cu_bias_dropout_add_forward(float *out, const float *inp, const float *bias,
                                         const float *res, int64_t nb, const ms_k_fused_dropout *d,
                                         void *stream, ms_error *err) {
    return bda_forward(out, inp, bias, res, nb, d, stream, err);
}

ms_status ms_cu_bias_dropout_add_backward(float *dinp, float *dbias, float *dres, const float *dout,
                                          int64_t nb, const ms_k_fused_dropout *d, void *stream,
                                          ms_error *err) {
    return bda_backward(dinp, dbias, dres, dout, nb, d, stream, err);
}

/* bf16 storage: the same templates, every operand bf16. */
ms_status ms_cu_bias_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, const uint16_t *bias,
                                       int64_t n, int64_t c, void *stream, ms_error *err) {
    return bias_gelu_forward(ms_cu_bf(out), ms_cu_bf(inp), ms_cu_bf(bias), n, c, stream, err);
}

ms_status ms_cu_bias_gelu_backward_bf16(uint16_t *dinp, uint16_t *dbias, const uint16_t *dout,
                                        const uint16_t *inp, const uint16_t *bias, int64_t n,
                                        int64_t c, void *stream, ms_error *err) {
    return bias_gelu_backward(ms_cu_bf(dinp), ms_cu_bf(dbias), ms_cu_bf(dout), ms_cu_bf(inp),
                              ms_cu_bf(bias), n, c, stream, err);
}

ms_status ms_cu_bias_dropout_add_forward_bf16(uint16_t *out, const uint16_t *inp,
                                              const uint16_t *bias, const uint16_t *res, int64_t nb,
                                              const ms_k_fused_dropout *d, void *stream,
                                              ms_error *err) {
    return bda_forward(ms_cu_bf(out), ms_cu_bf(inp), ms_cu_bf(bias), ms_cu_bf(res), nb, d, stream,
                       err);
}

ms_status ms_cu_bias_dropout_add_backward_bf16(uint16_t *dinp, uint16_t *dbias, uint16_t *dres,
                                               const uint16_t *dout, int64_t nb,
                                               const ms_k_fused_dropout *d, void *stream,
                                               ms_error *err) {
    return bda_backward(ms_cu_bf(dinp), ms_cu_bf(dbias), ms_cu_bf(dres), ms_cu_bf(dout), nb, d,
                        stream, err);
}

ms_status ms_cu_gather(float *out, const float *x, const float *ids, const ms_k_gather_dims *g,
                       bool accumulate, void *stream, ms_error *err) {
    const ms_k_gather_dims d = *g;
    return ms_cu_each(d.o * d.l * d.i, stream, "gather", err, [=] __device__(int64_t e) {
        const int64_t j = e % d.i, li = (e / d.i) % d.l, a = e / (d.i * d.l);
        const int64_t r = ms_cu_gather_row(ids, d.o, d.d, d.l, d.i, d.d0, d.ids_per_row,
                                           d.ids_per_outer, a, li, j);
        const float v = r < 0 ? 0.0f : x[(a * d.d + r) * d.i + j];
        out[e] = accumulate ? out[e] + v : v;
    });
}

ms_status ms_cu_scatter_add(float *x, const float *src, const float *ids, const ms_k_gather_dims *g,
                            void *stream, ms_error *err) {
    const ms_k_gather_dims d = *g;
    return ms_cu_each(d.o * d.l * d.i, stream, "scatter add", err, [=] __device__(int64_t e) {
        const int64_t j = e % d.i, li = (e / d.i) % d.l, a = e / (d.i * d.l);
        const int64_t r = ms_cu_gather_row(ids, d.o, d.d, d.l, d.i, d.d0, d.ids_per_row,
                                           d.ids_per_outer, a, li, j);
        if (r >= 0) atomicAdd(&x[(a * d.d + r) * d.i + j], src[e]);
    });
}

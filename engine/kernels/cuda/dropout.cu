/* dropout.cu - inverted dropout, one thread per element around dropout_math.cuh. */
#include "engine/kernels/cuda/dropout_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

template <typename T>
static ms_status dropout(T *y, const T *x, bool acc, float p, uint64_t seed, uint64_t stream_id,
                         int ndim, const int64_t *lshape, const int64_t *gstart,
                         const int64_t *gshape, const ms_k_batch_window *w, ms_kctx *kc,
                         ms_error *err) {
    if (ndim > 8) return ms_fail(err, MS_ERR_INVALID, "dropout: %d dims, at most 8", ndim);
    const ms_cu_box b = ms_cu_box_make(ndim, lshape, gstart, gshape, w ? w->rows : 0,
                                       w ? w->stride : 0, w ? w->offset : 0);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= lshape[d];
    return ms_cu_each(
        n, kc, acc ? "dropout backward" : "dropout forward", err,
        [=] __device__(int64_t i) { ms_cu_dropout_elem(y, x, acc, p, seed, stream_id, b, i); });
}

ms_status ms_cu_dropout_forward(ms_kctx *kc, float *out, const float *inp, float p, uint64_t seed,
                                uint64_t stream_id, int ndim, const int64_t *lshape,
                                const int64_t *gstart, const int64_t *gshape,
                                const ms_k_batch_window *w, ms_error *err) {
    return dropout(out, inp, false, p, seed, stream_id, ndim, lshape, gstart, gshape, w, kc, err);
}

ms_status ms_cu_dropout_backward(ms_kctx *kc, float *dinp, const float *dout, float p,
                                 uint64_t seed, uint64_t stream_id, int ndim, const int64_t *lshape,
                                 const int64_t *gstart, const int64_t *gshape,
                                 const ms_k_batch_window *w, ms_error *err) {
    return dropout(dinp, dout, true, p, seed, stream_id, ndim, lshape, gstart, gshape, w, kc, err);
}

ms_status ms_cu_dropout_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp, float p,
                                     uint64_t seed, uint64_t stream_id, int ndim,
                                     const int64_t *lshape, const int64_t *gstart,
                                     const int64_t *gshape, const ms_k_batch_window *w,
                                     ms_error *err) {
    return dropout(ms_cu_bf(out), ms_cu_bf(inp), false, p, seed, stream_id, ndim, lshape, gstart,
                   gshape, w, kc, err);
}

ms_status ms_cu_dropout_backward_bf16(ms_kctx *kc, uint16_t *dinp, const uint16_t *dout, float p,
                                      uint64_t seed, uint64_t stream_id, int ndim,
                                      const int64_t *lshape, const int64_t *gstart,
                                      const int64_t *gshape, const ms_k_batch_window *w,
                                      ms_error *err) {
    return dropout(ms_cu_bf(dinp), ms_cu_bf(dout), true, p, seed, stream_id, ndim, lshape, gstart,
                   gshape, w, kc, err);
}

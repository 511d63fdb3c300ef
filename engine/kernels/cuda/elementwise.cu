/* elementwise.cu - add, mul, scale, bias add, GELU and the embedding lookup: one thread per
 * element around the functions of elementwise_math.cuh. */
#include "engine/kernels/cuda/elementwise_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

ms_status ms_cu_add_forward(float *out, const float *a, const float *b, int64_t n, void *stream,
                            ms_error *err) {
    return ms_cu_each(n, stream, "add forward", err,
                      [=] __device__(int64_t i) { ms_cu_add_fwd(out, a, b, i); });
}

ms_status ms_cu_add_backward(float *da, float *db, const float *dout, int64_t n, void *stream,
                             ms_error *err) {
    return ms_cu_each(n, stream, "add backward", err, [=] __device__(int64_t i) {
        if (da) ms_cu_acc(da, dout, i);
        if (db) ms_cu_acc(db, dout, i);
    });
}

ms_status ms_cu_mul_forward(float *out, const float *a, const float *b, int64_t n, void *stream,
                            ms_error *err) {
    return ms_cu_each(n, stream, "mul forward", err,
                      [=] __device__(int64_t i) { ms_cu_mul_fwd(out, a, b, i); });
}

ms_status ms_cu_mul_backward(float *da, float *db, const float *dout, const float *a,
                             const float *b, int64_t n, void *stream, ms_error *err) {
    return ms_cu_each(n, stream, "mul backward", err, [=] __device__(int64_t i) {
        if (da) ms_cu_mul_bwd(da, dout, b, i);
        if (db) ms_cu_mul_bwd(db, dout, a, i);
    });
}

ms_status ms_cu_scale_forward(float *out, const float *x, float s, int64_t n, void *stream,
                              ms_error *err) {
    return ms_cu_each(n, stream, "scale forward", err,
                      [=] __device__(int64_t i) { ms_cu_scale_fwd(out, x, s, i); });
}

ms_status ms_cu_scale_backward(float *dx, const float *dout, float s, int64_t n, void *stream,
                               ms_error *err) {
    return ms_cu_each(n, stream, "scale backward", err,
                      [=] __device__(int64_t i) { ms_cu_scale_bwd(dx, dout, s, i); });
}

ms_status ms_cu_bias_add_forward(float *out, const float *inp, const float *bias, int64_t n,
                                 int64_t c, void *stream, ms_error *err) {
    return ms_cu_each(n * c, stream, "bias add forward", err,
                      [=] __device__(int64_t i) { ms_cu_bias_add_fwd(out, inp, bias, c, i); });
}

/* dinp one thread per element; dbias one thread per column, rows in order. */
ms_status ms_cu_bias_add_backward(float *dinp, float *dbias, const float *dout, int64_t n,
                                  int64_t c, void *stream, ms_error *err) {
    if (dinp)
        MS_CHECK(ms_cu_each(n * c, stream, "bias add backward", err,
                            [=] __device__(int64_t i) { ms_cu_acc(dinp, dout, i); }));
    if (!dbias) return MS_OK;
    return ms_cu_each(c, stream, "bias add backward (dbias)", err,
                      [=] __device__(int64_t j) { ms_cu_bias_dbias_col(dbias, dout, n, c, j); });
}

ms_status ms_cu_gelu_forward(float *out, const float *inp, int64_t n, void *stream, ms_error *err) {
    return ms_cu_each(n, stream, "gelu forward", err,
                      [=] __device__(int64_t i) { ms_cu_gelu_fwd(out, inp, i); });
}

ms_status ms_cu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n,
                              void *stream, ms_error *err) {
    return ms_cu_each(n, stream, "gelu backward", err,
                      [=] __device__(int64_t i) { ms_cu_gelu_bwd(dinp, inp, dout, i); });
}

/* ---- bf16 storage ---- */

ms_status ms_cu_add_forward_bf16(uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n,
                                 void *stream, ms_error *err) {
    ms_bf16 *o = ms_cu_bf(out);
    const ms_bf16 *x = ms_cu_bf(a), *y = ms_cu_bf(b);
    return ms_cu_each(n, stream, "add forward (bf16)", err,
                      [=] __device__(int64_t i) { ms_cu_add_fwd(o, x, y, i); });
}

ms_status ms_cu_bias_add_forward_bf16(uint16_t *out, const uint16_t *inp, const float *bias,
                                      int64_t n, int64_t c, void *stream, ms_error *err) {
    ms_bf16 *o = ms_cu_bf(out);
    const ms_bf16 *x = ms_cu_bf(inp);
    return ms_cu_each(n * c, stream, "bias add forward (bf16)", err,
                      [=] __device__(int64_t i) { ms_cu_bias_add_fwd(o, x, bias, c, i); });
}

ms_status ms_cu_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t n, void *stream,
                                  ms_error *err) {
    ms_bf16 *o = ms_cu_bf(out);
    const ms_bf16 *x = ms_cu_bf(inp);
    return ms_cu_each(n, stream, "gelu forward (bf16)", err,
                      [=] __device__(int64_t i) { ms_cu_gelu_fwd(o, x, i); });
}

ms_status ms_cu_gelu_backward_bf16(uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
                                   int64_t n, void *stream, ms_error *err) {
    ms_bf16 *d = ms_cu_bf(dinp);
    const ms_bf16 *x = ms_cu_bf(inp), *g = ms_cu_bf(dout);
    return ms_cu_each(n, stream, "gelu backward (bf16)", err,
                      [=] __device__(int64_t i) { ms_cu_gelu_bwd(d, x, g, i); });
}

/* ---- embedding ---- */

ms_status ms_cu_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                                  int64_t c, int64_t v0, int64_t vl, void *stream, ms_error *err) {
    return ms_cu_each(n * c, stream, "embedding forward", err, [=] __device__(int64_t i) {
        ms_cu_embedding_fwd(out, ids, table, c, v0, vl, i);
    });
}

ms_status ms_cu_embedding_backward(float *dtable, const int32_t *ids, const float *dout, int64_t n,
                                   int64_t c, int64_t v0, int64_t vl, void *stream, ms_error *err) {
    return ms_cu_each(n * c, stream, "embedding backward", err, [=] __device__(int64_t i) {
        const int64_t at = ms_cu_embedding_bwd_index(ids, c, v0, vl, i);
        if (at >= 0) atomicAdd(dtable + at, dout[i]);
    });
}

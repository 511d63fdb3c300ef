/* elementwise.cu - add, mul, scale, bias add, GELU and the program's own instructions: one
 * thread per element around the functions of elementwise_math.cuh (the embedding lookup's
 * kernels are embedding.cu's); bias add's dbias is a column reduction (colsum_math.cuh),
 * the sum a block per output when its outputs are few. */
#include "engine/kernels/cuda/elementwise_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

/* The fp32 and bf16 entries share one template per kernel (T: float or ms_bf16), so the
 * bf16 kernel does the fp32 kernel's arithmetic on widened values and rounds on each store. */

template <typename T>
static ms_status add_forward(T *out, const T *a, const T *b, int64_t n, ms_kctx *kc,
                             const char *what, ms_error *err) {
    return ms_cu_each(n, kc, what, err, [=] __device__(int64_t i) { ms_cu_add_fwd(out, a, b, i); });
}

template <typename T>
static ms_status add_backward(T *da, T *db, const T *dout, int64_t n, ms_kctx *kc, const char *what,
                              ms_error *err) {
    return ms_cu_each(n, kc, what, err, [=] __device__(int64_t i) {
        if (da) ms_cu_acc(da, dout, i);
        if (db) ms_cu_acc(db, dout, i);
    });
}

ms_status ms_cu_add_forward(ms_kctx *kc, float *out, const float *a, const float *b, int64_t n,
                            ms_error *err) {
    return add_forward(out, a, b, n, kc, "add forward", err);
}

ms_status ms_cu_add_backward(ms_kctx *kc, float *da, float *db, const float *dout, int64_t n,
                             ms_error *err) {
    return add_backward(da, db, dout, n, kc, "add backward", err);
}

ms_status ms_cu_mul_forward(ms_kctx *kc, float *out, const float *a, const float *b, int64_t n,
                            ms_error *err) {
    return ms_cu_each(n, kc, "mul forward", err,
                      [=] __device__(int64_t i) { ms_cu_mul_fwd(out, a, b, i); });
}

ms_status ms_cu_mul_backward(ms_kctx *kc, float *da, float *db, const float *dout, const float *a,
                             const float *b, int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "mul backward", err, [=] __device__(int64_t i) {
        if (da) ms_cu_mul_bwd(da, dout, b, i);
        if (db) ms_cu_mul_bwd(db, dout, a, i);
    });
}

ms_status ms_cu_scale_forward(ms_kctx *kc, float *out, const float *x, float s, int64_t n,
                              ms_error *err) {
    return ms_cu_each(n, kc, "scale forward", err,
                      [=] __device__(int64_t i) { ms_cu_scale_fwd(out, x, s, i); });
}

ms_status ms_cu_scale_backward(ms_kctx *kc, float *dx, const float *dout, float s, int64_t n,
                               ms_error *err) {
    return ms_cu_each(n, kc, "scale backward", err,
                      [=] __device__(int64_t i) { ms_cu_scale_bwd(dx, dout, s, i); });
}

template <typename T>
static ms_status bias_add_forward(T *out, const T *inp, const T *bias, int64_t n, int64_t c,
                                  ms_kctx *kc, ms_error *err) {
    return ms_cu_each(n * c, kc, "bias add forward", err,
                      [=] __device__(int64_t i) { ms_cu_bias_add_fwd(out, inp, bias, c, i); });
}

int64_t ms_cu_colsum_scratch_floats(int64_t n, int64_t c, int terms) {
    return (int64_t)terms * ms_cu_colsum_chunks(n) * c;
}

/* Without dbias, dinp one thread per element; with it, the two passes of colsum_math.cuh,
 * dinp in pass 1 as it reads dout for the chunk sums. */
template <typename T>
static ms_status bias_add_backward(T *dinp, T *dbias, float *scratch, const T *dout, int64_t n,
                                   int64_t c, unsigned fresh, ms_kctx *kc, const char *what,
                                   ms_error *err) {
    const bool fx = fresh & 1u;
    if (!dbias)
        return dinp ? ms_cu_each(n * c, kc, what, err,
                                 [=] __device__(int64_t i) {
                                     ms_cu_grad_put(dinp + i, ms_cu_load(dout + i), fx);
                                 })
                    : MS_OK;
    if (n <= 0 || c <= 0) return MS_OK;
    MS_CHECK(ms_cu_colsum_scratch(scratch, what, err));
    MS_CHECK(ms_cu_chunks(n, c, kc, what, err, [=] __device__(int64_t b, int64_t j) {
        ms_cu_bias_add_bwd_part(dinp, scratch, dout, n, c, b, j, fx);
    }));
    const int64_t chunks = ms_cu_colsum_chunks(n);
    return ms_cu_each(c, kc, what, err, [=] __device__(int64_t j) {
        ms_cu_colsum_finish(dbias, scratch, chunks, c, j);
    });
}

template <typename T>
static ms_status gelu_forward(T *out, const T *inp, int64_t n, ms_kctx *kc, ms_error *err) {
    return ms_cu_each(n, kc, "gelu forward", err,
                      [=] __device__(int64_t i) { ms_cu_gelu_fwd(out, inp, i); });
}

template <typename T>
static ms_status gelu_backward(T *dinp, const T *inp, const T *dout, int64_t n, ms_kctx *kc,
                               ms_error *err) {
    return ms_cu_each(n, kc, "gelu backward", err,
                      [=] __device__(int64_t i) { ms_cu_gelu_bwd(dinp, inp, dout, i); });
}

ms_status ms_cu_bias_add_forward(ms_kctx *kc, float *out, const float *inp, const float *bias,
                                 int64_t n, int64_t c, ms_error *err) {
    return bias_add_forward(out, inp, bias, n, c, kc, err);
}

ms_status ms_cu_bias_add_backward(ms_kctx *kc, float *dinp, float *dbias, float *scratch,
                                  const float *dout, int64_t n, int64_t c, unsigned fresh,
                                  ms_error *err) {
    return bias_add_backward(dinp, dbias, scratch, dout, n, c, fresh, kc, "bias add backward", err);
}

ms_status ms_cu_gelu_forward(ms_kctx *kc, float *out, const float *inp, int64_t n, ms_error *err) {
    return gelu_forward(out, inp, n, kc, err);
}

ms_status ms_cu_gelu_backward(ms_kctx *kc, float *dinp, const float *inp, const float *dout,
                              int64_t n, ms_error *err) {
    return gelu_backward(dinp, inp, dout, n, kc, err);
}

/* ---- bf16 storage (every operand bf16) ---- */

ms_status ms_cu_add_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *a, const uint16_t *b,
                                 int64_t n, ms_error *err) {
    return add_forward(ms_cu_bf(out), ms_cu_bf(a), ms_cu_bf(b), n, kc, "add forward (bf16)", err);
}

ms_status ms_cu_add_backward_bf16(ms_kctx *kc, uint16_t *da, uint16_t *db, const uint16_t *dout,
                                  int64_t n, ms_error *err) {
    return add_backward(ms_cu_bf(da), ms_cu_bf(db), ms_cu_bf(dout), n, kc, "add backward (bf16)",
                        err);
}

ms_status ms_cu_bias_add_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp,
                                      const uint16_t *bias, int64_t n, int64_t c, ms_error *err) {
    return bias_add_forward(ms_cu_bf(out), ms_cu_bf(inp), ms_cu_bf(bias), n, c, kc, err);
}

ms_status ms_cu_bias_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias, float *scratch,
                                       const uint16_t *dout, int64_t n, int64_t c, unsigned fresh,
                                       ms_error *err) {
    return bias_add_backward(ms_cu_bf(dinp), ms_cu_bf(dbias), scratch, ms_cu_bf(dout), n, c, fresh,
                             kc, "bias add backward (bf16)", err);
}

ms_status ms_cu_gelu_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp, int64_t n,
                                  ms_error *err) {
    return gelu_forward(ms_cu_bf(out), ms_cu_bf(inp), n, kc, err);
}

ms_status ms_cu_gelu_backward_bf16(ms_kctx *kc, uint16_t *dinp, const uint16_t *inp,
                                   const uint16_t *dout, int64_t n, ms_error *err) {
    return gelu_backward(ms_cu_bf(dinp), ms_cu_bf(inp), ms_cu_bf(dout), n, kc, err);
}

/* ---- the program's own instructions: seeds, bf16 conversions, ids ---- */

ms_status ms_cu_fill(ms_kctx *kc, float *dst, float value, int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "fill", err, [=] __device__(int64_t i) { dst[i] = value; });
}

/* dst += src: add_backward with only the first gradient. */
ms_status ms_cu_accumulate(ms_kctx *kc, float *dst, const float *src, int64_t n, ms_error *err) {
    return add_backward(dst, (float *)NULL, src, n, kc, "add backward", err);
}

ms_status ms_cu_bf16_widen(ms_kctx *kc, float *out, const uint16_t *in, int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "bf16 widen", err,
                      [=] __device__(int64_t i) { out[i] = ms_cu_bf16_widen(in[i]); });
}

ms_status ms_cu_bf16_round(ms_kctx *kc, uint16_t *out, const float *in, int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "bf16 round", err,
                      [=] __device__(int64_t i) { out[i] = ms_cu_bf16_round(in[i]); });
}

ms_status ms_cu_bf16_accumulate(ms_kctx *kc, uint16_t *acc, const uint16_t *x, int64_t n,
                                ms_error *err) {
    return ms_cu_each(n, kc, "bf16 accumulate", err, [=] __device__(int64_t i) {
        acc[i] = ms_cu_bf16_round(ms_cu_bf16_widen(acc[i]) + ms_cu_bf16_widen(x[i]));
    });
}

ms_status ms_cu_ids_from_floats(ms_kctx *kc, int32_t *out, const float *in, int64_t n,
                                ms_error *err) {
    return ms_cu_each(n, kc, "ids from floats", err,
                      [=] __device__(int64_t i) { out[i] = (int32_t)in[i]; });
}

ms_status ms_cu_scale_inplace(ms_kctx *kc, float *x, size_t n, float s, ms_error *err) {
    return ms_cu_each((int64_t)n, kc, "scale in place", err,
                      [=] __device__(int64_t i) { x[i] *= s; });
}

/* A block per output when the outputs are few (ms_cu_sum_by_blocks), else one thread each. */
ms_status ms_cu_sum_forward(ms_kctx *kc, float *out, const float *inp, int64_t o, int64_t d,
                            int64_t i, ms_error *err) {
    if (!ms_cu_sum_by_blocks(o, d, i))
        return ms_cu_each(o * i, kc, "sum forward", err, [=] __device__(int64_t k) {
            out[k] = ms_cu_sum_part(inp, d, i, k, 0, 1);
        });
    return ms_cu_rows(o * i, kc, "sum forward", err, [=] __device__(int64_t k, int lane) {
        const float s = ms_cu_block_sum(ms_cu_sum_part(inp, d, i, k, lane, MS_CU_ROW_LANES));
        if (lane == 0) out[k] = s;
    });
}

ms_status ms_cu_sum_backward(ms_kctx *kc, float *dinp, const float *dout, float f, int64_t o,
                             int64_t d, int64_t i, ms_error *err) {
    return ms_cu_each(o * d * i, kc, "sum backward", err, [=] __device__(int64_t k) {
        const int64_t a = k / (d * i), e = k % i;
        dinp[k] += f * dout[a * i + e];
    });
}

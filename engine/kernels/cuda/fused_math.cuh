/* fused_math.cuh - bias + GELU and bias + dropout + residual add per element (their backwards
 * per (row chunk, column), dbias a column reduction: colsum_math.cuh), and the gather of
 * index.h per output element: the float operations of engine/kernels/fused.c and index.c in
 * the same order, the dropout mask of dropout_math.cuh. T is the storage type (float or
 * ms_bf16; math_common.cuh): loads widen, stores round. */
#ifndef MS_CUDA_FUSED_MATH_CUH
#define MS_CUDA_FUSED_MATH_CUH

#include "engine/kernels/cuda/colsum_math.cuh"
#include "engine/kernels/cuda/dropout_math.cuh"
#include "engine/kernels/cuda/elementwise_math.cuh"

/* out[i] = gelu(inp[i] + bias[i % c]) */
template <typename T>
MS_HD void ms_cu_bias_gelu_fwd(T *out, const T *inp, const T *bias, int64_t c, int64_t i) {
    ms_cu_store(out + i, ms_cu_gelu(ms_cu_load(inp + i) + ms_cu_load(bias + i % c)));
}

/* Pass 1 of bias + GELU backward (colsum_math.cuh) for chunk b, column k: over the chunk's
 * rows in order, g = gelu'(x + b) dout, dinp[r, k] += g (dinp may be NULL; fresh: written,
 * not added to) and part[b * c + k] = the sum of g (part NULL: no dbias). */
template <typename T>
MS_HD void ms_cu_bias_gelu_bwd_part(T *dinp, float *part, const T *dout, const T *inp,
                                    const T *bias, int64_t n, int64_t c, int64_t b, int64_t k,
                                    bool fresh) {
    int64_t lo, hi;
    ms_cu_colsum_rows(n, b, &lo, &hi);
    float db = 0.0f;
    const float bk = ms_cu_load(bias + k);
    for (int64_t r = lo; r < hi; r++) {
        const int64_t i = r * c + k;
        const float g = ms_cu_gelu_grad(ms_cu_load(inp + i) + bk) * ms_cu_load(dout + i);
        if (dinp) ms_cu_grad_put(dinp + i, g, fresh);
        db += g;
    }
    if (part) part[b * c + k] = db;
}

/* Whether element i survives (p <= 0: no dropout, every element does). */
MS_HD bool ms_cu_bda_keep(float p, uint64_t seed, uint64_t stream, const ms_cu_box &b, int64_t i) {
    if (p <= 0.0f) return true;
    return p < 1.0f && ms_cu_philox_uniform(seed, stream, b.ndim ? ms_cu_box_global(b, i) : 0) >= p;
}

/* out[i] = res[i] + dropout(inp[i] + bias[i % nb]) */
template <typename T>
MS_HD void ms_cu_bda_fwd(T *out, const T *inp, const T *bias, const T *res, int64_t nb, float p,
                         uint64_t seed, uint64_t stream, const ms_cu_box &b, int64_t i) {
    const float v = ms_cu_load(inp + i) + ms_cu_load(bias + i % nb), r = ms_cu_load(res + i);
    if (p <= 0.0f) {
        ms_cu_store(out + i, r + v);
        return;
    }
    const float scale = p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
    ms_cu_store(out + i, r + (ms_cu_bda_keep(p, seed, stream, b, i) ? v * scale : 0.0f));
}

/* Pass 1 of bias + dropout + residual add backward (colsum_math.cuh) for chunk b, column k of
 * the [rows, nb] view: over the chunk's rows in order, g = mask * dout / (1 - p),
 * dres += dout, dinp += g (either may be NULL; fresh bit 0: dinp written, not added to, bit 2:
 * dres, as the slot's gradient order) and part[b * nb + k] = the sum of g (part NULL: no
 * dbias). */
template <typename T>
MS_HD void ms_cu_bda_bwd_part(T *dinp, float *part, T *dres, const T *dout, int64_t rows,
                              int64_t nb, float p, uint64_t seed, uint64_t stream,
                              const ms_cu_box &box, int64_t b, int64_t k, unsigned fresh) {
    int64_t lo, hi;
    ms_cu_colsum_rows(rows, b, &lo, &hi);
    const float scale = p > 0.0f ? (p >= 1.0f ? 0.0f : 1.0f / (1.0f - p)) : 1.0f;
    float db = 0.0f;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t i = r * nb + k;
        const float dy = ms_cu_load(dout + i);
        const float gx = ms_cu_bda_keep(p, seed, stream, box, i) ? dy * scale : 0.0f;
        if (dres) ms_cu_grad_put(dres + i, dy, fresh & 4u);
        if (dinp) ms_cu_grad_put(dinp + i, gx, fresh & 1u);
        db += gx;
    }
    if (part) part[b * nb + k] = db;
}

/* The local row of output element (a, l, j) in x, or -1 outside [d0, d0 + d). */
MS_HD int64_t ms_cu_gather_row(const float *ids, int64_t o, int64_t d, int64_t l, int64_t in,
                               int64_t d0, bool per_row, bool per_outer, int64_t a, int64_t li,
                               int64_t j) {
    (void)o;
    const float id = per_row ? ids[li] : per_outer ? ids[a * l + li] : ids[(a * l + li) * in + j];
    const int64_t r = (int64_t)id - d0;
    return r >= 0 && r < d ? r : -1;
}

#endif

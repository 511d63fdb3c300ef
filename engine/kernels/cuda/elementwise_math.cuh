/* elementwise_math.cuh - per-element arithmetic of add, mul, scale, bias add, GELU and the
 * embedding lookup, forward and backward, as engine/kernels/kernels.h defines them, and the
 * sum over a dim.
 *
 * Each function handles element i of a flattened tensor, except bias add's dbias (one row chunk
 * of a column: colsum_math.cuh) and the sum (one lane of an output); backward functions
 * accumulate (+=) like the CPU kernels. T is the storage type (float or ms_bf16;
 * math_common.cuh).
 */
#ifndef MS_CUDA_ELEMENTWISE_MATH_CUH
#define MS_CUDA_ELEMENTWISE_MATH_CUH

#include "engine/kernels/cuda/colsum_math.cuh"
#include "engine/kernels/cuda/math_common.cuh"

#define MS_CU_GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define MS_CU_GELU_CUBE  0.044715f

template <typename T> MS_HD void ms_cu_add_fwd(T *out, const T *a, const T *b, int64_t i) {
    ms_cu_store(out + i, ms_cu_load(a + i) + ms_cu_load(b + i));
}

/* d += g (da and db of add, dinp of bias add and scale with s = 1). */
template <typename T> MS_HD void ms_cu_acc(T *d, const T *g, int64_t i) {
    ms_cu_store(d + i, ms_cu_load(d + i) + ms_cu_load(g + i));
}

template <typename T> MS_HD void ms_cu_mul_fwd(T *out, const T *a, const T *b, int64_t i) {
    ms_cu_store(out + i, ms_cu_load(a + i) * ms_cu_load(b + i));
}

/* d += g * other (da = dout * b, db = dout * a). */
template <typename T> MS_HD void ms_cu_mul_bwd(T *d, const T *g, const T *other, int64_t i) {
    ms_cu_store(d + i, ms_cu_load(d + i) + ms_cu_load(g + i) * ms_cu_load(other + i));
}

template <typename T> MS_HD void ms_cu_scale_fwd(T *out, const T *x, float s, int64_t i) {
    ms_cu_store(out + i, s * ms_cu_load(x + i));
}

template <typename T> MS_HD void ms_cu_scale_bwd(T *dx, const T *dout, float s, int64_t i) {
    ms_cu_store(dx + i, ms_cu_load(dx + i) + s * ms_cu_load(dout + i));
}

/* out[i] = inp[i] + bias[i % c]; element i of [N, C]. */
template <typename T, typename W>
MS_HD void ms_cu_bias_add_fwd(T *out, const T *inp, const W *bias, int64_t c, int64_t i) {
    ms_cu_store(out + i, ms_cu_load(inp + i) + ms_cu_load(bias + i % c));
}

/* Pass 1 of dbias (colsum_math.cuh) for chunk b, column j: dinp[r, j] += dout[r, j] (dinp may
 * be NULL; fresh: written, not added to) and part[b * c + j] = the sum of dout[r, j] over the
 * chunk's rows in order. */
template <typename T>
MS_HD void ms_cu_bias_add_bwd_part(T *dinp, float *part, const T *dout, int64_t n, int64_t c,
                                   int64_t b, int64_t j, bool fresh) {
    int64_t lo, hi;
    ms_cu_colsum_rows(n, b, &lo, &hi);
    float s = 0.0f;
    for (int64_t r = lo; r < hi; r++) {
        const float g = ms_cu_load(dout + r * c + j);
        if (dinp) ms_cu_grad_put(dinp + r * c + j, g, fresh);
        s += g;
    }
    part[b * c + j] = s;
}

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
MS_HD float ms_cu_gelu(float x) {
    const float cube = MS_CU_GELU_CUBE * x * x * x;
    return 0.5f * x * (1.0f + tanhf(MS_CU_GELU_SCALE * (x + cube)));
}

/* gelu'(x), with sech^2 = 1 - tanh^2 (1/cosh^2 overflows coshf for large |x|). */
MS_HD float ms_cu_gelu_grad(float x) {
    const float cube = MS_CU_GELU_CUBE * x * x * x;
    const float th = tanhf(MS_CU_GELU_SCALE * (x + cube));
    const float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) +
           x * 0.5f * sech2 * MS_CU_GELU_SCALE * (1.0f + 3.0f * MS_CU_GELU_CUBE * x * x);
}

template <typename T> MS_HD void ms_cu_gelu_fwd(T *out, const T *inp, int64_t i) {
    ms_cu_store(out + i, ms_cu_gelu(ms_cu_load(inp + i)));
}

template <typename T> MS_HD void ms_cu_gelu_bwd(T *dinp, const T *inp, const T *dout, int64_t i) {
    const float d = ms_cu_gelu_grad(ms_cu_load(inp + i)) * ms_cu_load(dout + i);
    ms_cu_store(dinp + i, ms_cu_load(dinp + i) + d);
}

/* The table row of element i of out [N, C], or -1 when ids[i / c] is outside the slice
 * [v0, v0 + Vl) this rank holds. */
MS_HD int64_t ms_cu_embedding_row(const int32_t *ids, int64_t c, int64_t v0, int64_t vl,
                                  int64_t i) {
    const int64_t row = (int64_t)ids[i / c] - v0;
    return row >= 0 && row < vl ? row : -1;
}

/* out[i] = the table entry, or 0 off-slice (the partial that vocab shards sum). */
template <typename T>
MS_HD void ms_cu_embedding_fwd(T *out, const int32_t *ids, const T *table, int64_t c, int64_t v0,
                               int64_t vl, int64_t i) {
    const int64_t row = ms_cu_embedding_row(ids, c, v0, vl, i);
    ms_cu_store(out + i, row < 0 ? 0.0f : ms_cu_load(table + row * c + i % c));
}

/* The backward's sort key of token r: its row in the slice, or vl when off-slice (sorted
 * after every row, that run is skipped). */
MS_HD uint32_t ms_cu_embedding_key(const int32_t *ids, int64_t v0, int64_t vl, int64_t r) {
    const int64_t row = (int64_t)ids[r] - v0;
    return (uint32_t)(row >= 0 && row < vl ? row : vl);
}

/* The backward's scatter-add without atomics, element i = p * C + j over the tokens stably
 * sorted by key (keys[p], the token tokens[p]): the first position of each run of equal keys
 * adds the run's dout[token, j] into dtable[row, j] in ascending token order - the CPU
 * kernel's order - widening the gradient once and rounding once; other positions and the
 * off-slice run do nothing. So each element of dtable has one writer and a fixed sum order. */
template <typename T>
MS_HD void ms_cu_embedding_bwd_run(T *dtable, const T *dout, const uint32_t *keys,
                                   const int32_t *tokens, int64_t n, int64_t c, int64_t vl,
                                   int64_t i) {
    const int64_t p = i / c, j = i % c;
    const uint32_t key = keys[p];
    if ((int64_t)key >= vl || (p > 0 && keys[p - 1] == key)) return;
    T *d = dtable + (int64_t)key * c + j;
    float s = ms_cu_load(d);
    for (int64_t q = p; q < n && keys[q] == key; q++)
        s += ms_cu_load(dout + (int64_t)tokens[q] * c + j);
    ms_cu_store(d, s);
}

/* The sum over the middle dim of [O, D, I] for output k = a * I + e: one lane's part, the
 * terms b = lane, lane + nlanes, ... < D in order (nlanes = 1: the whole sum in order). */
MS_HD float ms_cu_sum_part(const float *inp, int64_t d, int64_t i, int64_t k, int lane,
                           int nlanes) {
    const int64_t a = k / i, e = k % i;
    float s = 0.0f;
    for (int64_t b = lane; b < d; b += nlanes) s += inp[(a * d + b) * i + e];
    return s;
}

/* The most outputs the sum reduces a block per output (ms_cu_sum_by_blocks). */
#define MS_CU_SUM_BLOCK_OUTPUTS 4096

/* Whether the sum runs a block of MS_CU_ROW_LANES lanes per output (the lane parts combined by
 * the tree) rather than one thread per output: when the outputs are too few to fill a GPU
 * (GPT-2's loss mean is one output of 8192 terms) and each has a lane's worth of terms. With
 * many outputs one thread each fills it, and its loads coalesce across outputs when I > 1. */
MS_HD bool ms_cu_sum_by_blocks(int64_t o, int64_t d, int64_t i) {
    return o * i <= MS_CU_SUM_BLOCK_OUTPUTS && d >= MS_CU_ROW_LANES;
}

#endif

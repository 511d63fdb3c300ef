/* xent_math.cuh - softmax cross-entropy per row, split as engine/kernels/xent.c splits it for
 * a vocab-sharded run, so a sharded GPU run reduces the same partials as the CPU:
 *   1. local max        ms_cu_row_max_part (norm_math.cuh)        all-reduce MAX -> gmax
 *   2. local sum of exp ms_cu_row_sumexp_part with gmax           all-reduce SUM -> gsum
 *   3. target logit     ms_cu_xent_target (0 off-slice)           all-reduce SUM -> gtgt
 *   4. loss             ms_cu_xent_loss = log(gsum) + gmax - gtgt
 *   backward            ms_cu_xent_vp_grad per logit of the slice, no communication.
 * The whole-vocab kernels are the same with one slice (v0 = 0, Vl = V), saving
 * lse = gmax + log(gsum) for the backward (ms_cu_xent_grad). A negative target marks an
 * ignored row: loss 0, no gradient.
 */
#ifndef MS_CUDA_XENT_MATH_CUH
#define MS_CUDA_XENT_MATH_CUH

#include "engine/kernels/cuda/norm_math.cuh"

/* The row's logit at the (global) target when this slice [v0, v0 + Vl) holds it, else 0. */
template <typename T>
MS_HD float ms_cu_xent_target(const T *row, int32_t target, int64_t vl, int64_t v0) {
    const int64_t j = (int64_t)target - v0;
    return (target >= 0 && j >= 0 && j < vl) ? ms_cu_load(row + j) : 0.0f;
}

MS_HD float ms_cu_xent_loss(float gmax, float gsum, float gtgt, int32_t target) {
    return target < 0 ? 0.0f : logf(gsum) + gmax - gtgt;
}

MS_HD float ms_cu_xent_lse(float gmax, float gsum) {
    return gmax + logf(gsum);
}

/* dlogits[j] += (exp(l - gmax) / gsum - [v0 + j == target]) * dloss, for logit j of the slice.
 * The two terms are added in the CPU kernel's order (the softmax part, then the one-hot). */
template <typename T>
MS_HD void ms_cu_xent_vp_grad(T *drow, const T *row, int64_t j, float gmax, float gsum,
                              int32_t target, float dloss, int64_t v0, bool fresh = false) {
    if (target < 0) { /* an ignored row adds nothing; a fresh gradient is written as zeros */
        if (fresh) ms_cu_store(drow + j, 0.0f);
        return;
    }
    float d =
        (fresh ? 0.0f : ms_cu_load(drow + j)) + expf(ms_cu_load(row + j) - gmax) * (dloss / gsum);
    if (v0 + j == (int64_t)target) d -= dloss;
    ms_cu_store(drow + j, d);
}

/* The same from the saved logsumexp: dlogits[j] += (exp(l - lse) - [j == target]) * dloss. */
template <typename T>
MS_HD void ms_cu_xent_grad(T *drow, const T *row, int64_t j, float lse, int32_t target,
                           float dloss) {
    if (target < 0) return;
    float d = ms_cu_load(drow + j) + expf(ms_cu_load(row + j) - lse) * dloss;
    if (j == (int64_t)target) d -= dloss;
    ms_cu_store(drow + j, d);
}

#endif

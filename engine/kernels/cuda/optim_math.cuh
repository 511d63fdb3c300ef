/* optim_math.cuh - the per-element AdamW update and the gradient's sum of squares, as
 * engine/optim/optim.h defines them (PyTorch semantics, decoupled weight decay, the clipping
 * factor fused in as grad_scale).
 */
#ifndef MS_CUDA_OPTIM_MATH_CUH
#define MS_CUDA_OPTIM_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"
#include "engine/kernels/cuda/cuda_kernels.h"

/* The step's constants, computed once on the host exactly as optim.c does (the bias
 * corrections in double: 1 - beta2^t in float loses most of its digits for small t). */
struct ms_cu_adamw_consts {
    float gscale, step, inv_sqrt_bc2, b1, b2, eps, decay;
};

__host__ inline ms_cu_adamw_consts ms_cu_adamw_prepare(const ms_adamw_opts *o, int64_t t,
                                                       float grad_scale) {
    const double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
    ms_cu_adamw_consts k;
    k.gscale = grad_scale;
    k.step = (float)(o->lr / bc1);
    k.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    k.b1 = o->beta1;
    k.b2 = o->beta2;
    k.eps = o->eps;
    k.decay = 1.0f - o->lr * o->weight_decay;
    return k;
}

/* Element i: g scaled by grad_scale, m and v updated, p decayed and stepped. G is the
 * gradient's storage (float, or ms_bf16 for a bf16 gradient). */
template <typename G>
MS_HD void ms_cu_adamw_elem(float *p, const G *g, float *m, float *v, int64_t i,
                            const ms_cu_adamw_consts &k) {
    const float gi = ms_cu_load(g + i) * k.gscale;
    const float mi = k.b1 * m[i] + (1.0f - k.b1) * gi;
    const float vi = k.b2 * v[i] + (1.0f - k.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * k.decay - k.step * mi / (sqrtf(vi) * k.inv_sqrt_bc2 + k.eps);
}

/* The fp32-master variant: a bf16 gradient updates the fp32 master p, and the bf16 copy the
 * forward reads is rewritten from it. */
MS_HD void ms_cu_adamw_master_elem(float *p, const ms_bf16 *g, float *m, float *v, ms_bf16 *p16,
                                   int64_t i, const ms_cu_adamw_consts &k) {
    ms_cu_adamw_elem(p, g, m, v, i, k);
    ms_cu_store(p16 + i, p[i]);
}

/* Sum of squares in double over fixed chunks of MS_CU_SUMSQ_CHUNK elements (one block each),
 * each chunk over MS_CU_ROW_LANES lanes and the lane tree, then the chunk partials added in
 * chunk order: the result depends on n alone. */
#define MS_CU_SUMSQ_CHUNK (1 << 16)

template <typename T> MS_HD double ms_cu_sumsq_part(const T *x, int64_t len, int lane, int nlanes) {
    double s = 0.0;
    for (int64_t i = lane; i < len; i += nlanes) {
        const double xi = (double)ms_cu_load(x + i);
        s += xi * xi;
    }
    return s;
}

MS_HD int64_t ms_cu_sumsq_chunks(int64_t n) {
    return (n + MS_CU_SUMSQ_CHUNK - 1) / MS_CU_SUMSQ_CHUNK;
}

/* The item of a list (ms_cu_sumsq_list, ms_cu_adamw_list) that chunk b of all the list's
 * chunks belongs to: the last whose chunk0 is at most b (items in chunk0 order, every one with
 * a chunk or more). */
template <typename I> MS_HD int ms_cu_list_item_of(const I *items, int n, int64_t b) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (items[mid].chunk0 <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Chunk b of a list's chunks, as a block of ms_cu_sumsq takes it: (lane's part, via T). */
template <typename T>
MS_HD double ms_cu_sumsq_list_part(const ms_cu_sumsq_item &it, int64_t b, int lane, int nlanes) {
    const int64_t lo = (b - it.chunk0) * MS_CU_SUMSQ_CHUNK;
    const int64_t len = it.n - lo < MS_CU_SUMSQ_CHUNK ? it.n - lo : MS_CU_SUMSQ_CHUNK;
    return ms_cu_sumsq_part((const T *)it.x + lo, len, lane, nlanes);
}

/* Elements an AdamW list's block updates: a chunk of each parameter. */
#define MS_CU_ADAMW_CHUNK 4096

/* Lane l's share of chunk b of an AdamW list: elements lo + l, lo + l + nlanes, ... of its
 * parameter, each as ms_cu_adamw_elem updates it. */
MS_HD void ms_cu_adamw_list_part(const ms_cu_adamw_item &it, int64_t b, int lane, int nlanes,
                                 const ms_cu_adamw_consts &k) {
    const int64_t lo = (b - it.chunk0) * MS_CU_ADAMW_CHUNK;
    const int64_t hi = it.n - lo < MS_CU_ADAMW_CHUNK ? it.n : lo + MS_CU_ADAMW_CHUNK;
    for (int64_t i = lo + lane; i < hi; i += nlanes) {
        if (it.g_bf16)
            ms_cu_adamw_elem(it.p, (const ms_bf16 *)it.g, it.m, it.v, i, k);
        else
            ms_cu_adamw_elem(it.p, (const float *)it.g, it.m, it.v, i, k);
    }
}

/* Elements a cast list's block rounds: a chunk of each tensor. */
#define MS_CU_CAST_CHUNK 8192

/* Lane l's share of chunk b of a cast list: elements lo + l, lo + l + nlanes, ... of its
 * tensor, each rounded to bf16 as ms_cu_bf16_round rounds it. */
MS_HD void ms_cu_cast_list_part(const ms_cu_cast_item &it, int64_t b, int lane, int nlanes) {
    const int64_t lo = (b - it.chunk0) * MS_CU_CAST_CHUNK;
    const int64_t hi = it.n - lo < MS_CU_CAST_CHUNK ? it.n : lo + MS_CU_CAST_CHUNK;
    for (int64_t i = lo + lane; i < hi; i += nlanes) it.dst[i] = ms_cu_bf16_round(it.src[i]);
}

MS_HD double ms_cu_sumsq_combine(const double *parts, int64_t nchunks) {
    double s = 0.0;
    for (int64_t b = 0; b < nchunks; b++) s += parts[b];
    return s;
}

#endif

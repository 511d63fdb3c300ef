/* xent.c - softmax cross-entropy fused per row, whole-vocab and vocab-parallel.
 *
 * The fused form never materialises the probabilities: forward keeps only logsumexp per row and
 * backward recomputes exp(l - lse), which costs one exp per logit but saves an [N, V] buffer,
 * the largest activation of a language model.
 *
 * The vocab-parallel pieces split the same computation at the points where a distributed run
 * must communicate: the global row max (for a stable exp), the global sum of exps, and the
 * target's logit, which lives on exactly one vocab shard.
 */
#include "engine/kernels/kernels.h"
#include "engine/kernels/fastmath.h"

#include <math.h>

#include "engine/core/status.h"

void ms_k_xent_check_targets(const int32_t *targets, int64_t n, int64_t v) {
#ifndef NDEBUG
    for (int64_t r = 0; r < n; r++)
        MS_DEBUG_CHECK(targets[r] < v,
                       "cross-entropy row %lld: target %d is outside the vocabulary of %lld "
                       "logits (validate tokens against vocab_size before training)",
                       (long long)r, (int)targets[r], (long long)v);
#else
    (void)targets, (void)n, (void)v;
#endif
}

static float row_max(const float *l, int64_t v) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < v; j++) mx = l[j] > mx ? l[j] : mx;
    return mx;
}

static float row_sumexp(const float *l, int64_t v, float mx) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < v; j++) s += ms_expf_nonpos(l[j] - mx);
    return s;
}

void ms_k_xent_forward(float *losses, float *lse, const float *logits, const int32_t *targets,
                       int64_t n, int64_t v) {
    ms_k_xent_check_targets(targets, n, v);
    for (int64_t r = 0; r < n; r++) {
        const float *l = logits + r * v;
        const float mx = row_max(l, v);
        const float z = mx + logf(row_sumexp(l, v, mx));
        lse[r] = z;
        losses[r] = targets[r] < 0 ? 0.0f : z - l[targets[r]];
    }
}

void ms_k_xent_backward(float *dlogits, const float *logits, const float *lse,
                        const int32_t *targets, const float *dlosses, int64_t n, int64_t v) {
    ms_k_xent_check_targets(targets, n, v);
    for (int64_t r = 0; r < n; r++) {
        if (targets[r] < 0) continue;
        const float *l = logits + r * v;
        float *d = dlogits + r * v;
        const float z = lse[r], g = dlosses[r];
#pragma omp simd
        for (int64_t j = 0; j < v; j++) d[j] += ms_expf_nonpos(l[j] - z) * g;
        d[targets[r]] -= g;
    }
}

void ms_k_xent_vp_rowmax(float *lmax, const float *logits, int64_t n, int64_t vl) {
    for (int64_t r = 0; r < n; r++) lmax[r] = row_max(logits + r * vl, vl);
}

void ms_k_xent_vp_sumexp(float *lsum, const float *logits, const float *gmax, int64_t n,
                         int64_t vl) {
    for (int64_t r = 0; r < n; r++) lsum[r] = row_sumexp(logits + r * vl, vl, gmax[r]);
}

void ms_k_xent_vp_target(float *ltgt, const float *logits, const int32_t *targets, int64_t n,
                         int64_t vl, int64_t v0) {
    for (int64_t r = 0; r < n; r++) {
        const int64_t j = (int64_t)targets[r] - v0;
        /* Off-slice (and ignored) targets contribute 0 to the SUM all-reduce. */
        ltgt[r] = (targets[r] >= 0 && j >= 0 && j < vl) ? logits[r * vl + j] : 0.0f;
    }
}

void ms_k_xent_vp_loss(float *losses, const float *gmax, const float *gsum, const float *gtgt,
                       const int32_t *targets, int64_t n) {
    for (int64_t r = 0; r < n; r++)
        losses[r] = targets[r] < 0 ? 0.0f : logf(gsum[r]) + gmax[r] - gtgt[r];
}

void ms_k_xent_vp_backward(float *dlogits, const float *logits, const float *gmax,
                           const float *gsum, const int32_t *targets, const float *dlosses,
                           int64_t n, int64_t vl, int64_t v0) {
    for (int64_t r = 0; r < n; r++) {
        if (targets[r] < 0) continue;
        const float *l = logits + r * vl;
        float *d = dlogits + r * vl;
        const float mx = gmax[r], g = dlosses[r] / gsum[r];
#pragma omp simd
        for (int64_t j = 0; j < vl; j++) d[j] += ms_expf_nonpos(l[j] - mx) * g;
        const int64_t t = (int64_t)targets[r] - v0;
        if (t >= 0 && t < vl) d[t] -= dlosses[r];
    }
}

void ms_k_xent_vp_forward_local(float *losses, float *gmax, float *gsum, const float *logits,
                                const int32_t *targets, int64_t n, int64_t v) {
    ms_k_xent_vp_rowmax(gmax, logits, n, v);
    ms_k_xent_vp_sumexp(gsum, logits, gmax, n, v);
    ms_k_xent_vp_target(losses, logits, targets, n, v, 0);
    ms_k_xent_vp_loss(losses, gmax, gsum, losses, targets, n);
}

ms_k_cost ms_k_xent_cost(int64_t n, int64_t v, bool backward) {
    const double e = (double)n * (double)v, rows = (double)n;
    ms_k_cost k;
    if (!backward) {
        k.flops = 3 * e + 3 * rows; /* subtract, exp, add per logit; log, add, subtract per row */
        k.bytes = 4.0 * (e + 3 * rows); /* logits, targets in; losses, lse out */
    } else {
        k.flops = 4 * e + rows; /* subtract, exp, multiply, add per logit */
        k.bytes = 4.0 * (e + 2 * e + 3 * rows);
    }
    return k;
}

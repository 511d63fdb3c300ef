/* rows_math.cuh - per-row arithmetic of the row ops of engine/kernels/layers.h (the plain
 * normalisation, log-softmax, masked softmax, cosine similarity), the batched matmul with
 * broadcast batch dims, the pointwise losses and the two vocabulary losses (NLL, label-
 * smoothed cross-entropy), forward and backward.
 *
 * A row function handles one row of C elements serially, in the CPU kernel's order; the CPU
 * vectorises its float sums, so results agree to rounding, not bit for bit, and the device's
 * expf is not the CPU's fast exponential. The batched matmul computes one output element
 * (forward) or one element of an operand's gradient (backward: the sum over every item and
 * column that reads it), so no two threads write one element.
 */
#ifndef MS_CUDA_ROWS_MATH_CUH
#define MS_CUDA_ROWS_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"
#include "engine/kernels/cuda/cuda_kernels.h" /* layers.h, with C linkage */

/* ---- the row ops (ms_k_row_op): x, y the inputs, aux the plain norm's rstd ---- */

MS_HD void ms_cu_rows_fwd(ms_k_row_op op, float *out, float *aux, const float *x, const float *y,
                          int64_t c, float p, int64_t r) {
    const float *xr = x + r * c;
    float *o = out + r * c;
    switch (op) {
        case MS_K_ROW_NORM_PLAIN: {
            float m = 0.0f, v = 0.0f;
            for (int64_t j = 0; j < c; j++) m += xr[j];
            m /= (float)c;
            for (int64_t j = 0; j < c; j++) v += (xr[j] - m) * (xr[j] - m);
            const float s = 1.0f / sqrtf(v / (float)c + p);
            for (int64_t j = 0; j < c; j++) o[j] = (xr[j] - m) * s;
            aux[r] = s;
            break;
        }
        case MS_K_ROW_LOG_SOFTMAX: {
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < c; j++) mx = xr[j] > mx ? xr[j] : mx;
            for (int64_t j = 0; j < c; j++) sum += expf(xr[j] - mx);
            const float lse = mx + logf(sum);
            for (int64_t j = 0; j < c; j++) o[j] = xr[j] - lse;
            break;
        }
        case MS_K_ROW_MASKED_SOFTMAX: { /* softmax(x / p) over the kept entries, 0 elsewhere */
            const float *keep = y + r * c, inv_t = 1.0f / p;
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < c; j++)
                if (keep[j] != 0.0f && xr[j] > mx) mx = xr[j];
            for (int64_t j = 0; j < c; j++) {
                o[j] = mx != -INFINITY && keep[j] != 0.0f ? expf((xr[j] - mx) * inv_t) : 0.0f;
                sum += o[j];
            }
            const float inv = mx == -INFINITY ? 0.0f : 1.0f / sum;
            for (int64_t j = 0; j < c; j++) o[j] *= inv;
            break;
        }
        case MS_K_ROW_COSINE: { /* one output per row */
            const float *yr = y + r * c;
            double ab = 0.0, aa = 0.0, bb = 0.0;
            for (int64_t j = 0; j < c; j++)
                ab += (double)xr[j] * yr[j], aa += (double)xr[j] * xr[j],
                    bb += (double)yr[j] * yr[j];
            out[r] = (float)(ab / (fmax(sqrt(aa), (double)p) * fmax(sqrt(bb), (double)p)));
            break;
        }
    }
}

MS_HD void ms_cu_rows_bwd(ms_k_row_op op, float *dx, float *dy, const float *dout, const float *x,
                          const float *y, const float *out, const float *aux, int64_t c, float p,
                          int64_t r) {
    const float *g = dout + r * c, *yo = out ? out + r * c : nullptr;
    switch (op) {
        case MS_K_ROW_NORM_PLAIN: {
            if (!dx) break;
            float gm = 0.0f, gy = 0.0f;
            for (int64_t j = 0; j < c; j++) gm += g[j], gy += g[j] * yo[j];
            gm /= (float)c, gy /= (float)c;
            const float s = aux[r];
            for (int64_t j = 0; j < c; j++) dx[r * c + j] += s * (g[j] - gm - yo[j] * gy);
            break;
        }
        case MS_K_ROW_LOG_SOFTMAX: {
            if (!dx) break;
            float gs = 0.0f;
            for (int64_t j = 0; j < c; j++) gs += g[j];
            for (int64_t j = 0; j < c; j++) dx[r * c + j] += g[j] - expf(yo[j]) * gs;
            break;
        }
        case MS_K_ROW_MASKED_SOFTMAX: {
            if (!dx) break;
            const float inv_t = 1.0f / p;
            float dot = 0.0f;
            for (int64_t j = 0; j < c; j++) dot += g[j] * yo[j];
            for (int64_t j = 0; j < c; j++) dx[r * c + j] += yo[j] * (g[j] - dot) * inv_t;
            break;
        }
        case MS_K_ROW_COSINE: {
            const float *a = x + r * c, *b = y + r * c;
            double ab = 0.0, aa = 0.0, bb = 0.0;
            for (int64_t j = 0; j < c; j++)
                ab += (double)a[j] * b[j], aa += (double)a[j] * a[j], bb += (double)b[j] * b[j];
            const double na = fmax(sqrt(aa), (double)p), nb = fmax(sqrt(bb), (double)p);
            const double f = ab / (na * nb), gr = dout[r], inv = 1.0 / (na * nb);
            const double ka = na > p ? f / (na * na) : 0.0, kb = nb > p ? f / (nb * nb) : 0.0;
            for (int64_t j = 0; j < c; j++) {
                if (dx) dx[r * c + j] += (float)(gr * (b[j] * inv - ka * a[j]));
                if (dy) dy[r * c + j] += (float)(gr * (a[j] * inv - kb * b[j]));
            }
            break;
        }
    }
}

/* ---- batched matmul with broadcast batch dims ---- */

MS_HD int64_t ms_cu_bmm_items(const ms_k_bmm *g) {
    int64_t n = 1;
    for (int d = 0; d < g->nb; d++) n *= g->shape[d];
    return n;
}

/* The A and B items that batch item `it` multiplies. */
MS_HD void ms_cu_bmm_item(const ms_k_bmm *g, int64_t it, int64_t *ia, int64_t *ib) {
    *ia = *ib = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        const int64_t x = it % g->shape[d];
        it /= g->shape[d];
        *ia += x * g->a_stride[d];
        *ib += x * g->b_stride[d];
    }
}

/* Element e = (it, i, j) of c [items, M, N]. */
MS_HD void ms_cu_bmm_fwd(const ms_k_bmm *g, float *c, const float *a, const float *b, int64_t e) {
    const int64_t m = g->m, k = g->k, n = g->n, it = e / (m * n), i = e / n % m, j = e % n;
    int64_t ia, ib;
    ms_cu_bmm_item(g, it, &ia, &ib);
    const float *ar = a + ia * m * k + i * k, *bc = b + ib * k * n + j;
    float s = 0.0f;
    for (int64_t q = 0; q < k; q++) s += ar[q] * bc[q * n];
    c[e] = s;
}

/* Element e of da (items of A, [M, K]) or, wrt_b, of db (items of B, [K, N]): the sum over the
 * batch items that read that operand item. */
MS_HD void ms_cu_bmm_bwd(const ms_k_bmm *g, float *d, bool wrt_b, const float *dc, const float *a,
                         const float *b, int64_t e) {
    const int64_t m = g->m, k = g->k, n = g->n, rows = wrt_b ? k : m, cols = wrt_b ? n : k;
    const int64_t item = e / (rows * cols), r = e / cols % rows, q = e % cols;
    float s = 0.0f;
    for (int64_t it = 0; it < ms_cu_bmm_items(g); it++) {
        int64_t ia, ib;
        ms_cu_bmm_item(g, it, &ia, &ib);
        if ((wrt_b ? ib : ia) != item) continue;
        const float *gi = dc + it * m * n;
        if (wrt_b) /* db[r, q] += sum_i A[i, r] dC[i, q] */
            for (int64_t i = 0; i < m; i++) s += a[ia * m * k + i * k + r] * gi[i * n + q];
        else /* da[r, q] += sum_j dC[r, j] B[q, j] */
            for (int64_t j = 0; j < n; j++) s += gi[r * n + j] * b[ib * k * n + q * n + j];
    }
    d[e] += s;
}

/* ---- losses ---- */

MS_HD double ms_cu_pointwise_loss(ms_k_loss kind, double x, double delta) {
    const double ax = fabs(x);
    switch (kind) {
        case MS_K_LOSS_MSE:
            return x * x;
        case MS_K_LOSS_L1:
            return ax;
        default:
            return ax <= delta ? 0.5 * x * x : delta * (ax - 0.5 * delta);
    }
}

MS_HD float ms_cu_pointwise_grad(ms_k_loss kind, float x, float delta) {
    const float sgn = (float)((x > 0.0f) - (x < 0.0f));
    switch (kind) {
        case MS_K_LOSS_MSE:
            return 2.0f * x;
        case MS_K_LOSS_L1:
            return sgn;
        default:
            return fabsf(x) <= delta ? x : delta * sgn;
    }
}

/* out[0] = scale * sum of loss(a - b), in double and in order (one thread). */
MS_HD void ms_cu_pointwise_loss_fwd(ms_k_loss kind, float *out, const float *a, const float *b,
                                    int64_t n, float delta, float scale) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += ms_cu_pointwise_loss(kind, (double)a[i] - b[i], delta);
    out[0] = (float)(s * scale);
}

MS_HD void ms_cu_pointwise_loss_bwd(ms_k_loss kind, float *da, float *db, const float *a,
                                    const float *b, const float *dout, float delta, float scale,
                                    int64_t i) {
    const float gr = dout[0] * scale * ms_cu_pointwise_grad(kind, a[i] - b[i], delta);
    if (da) da[i] += gr;
    if (db) db[i] -= gr;
}

/* Row i of the NLL over a vocabulary slice [v0, v0 + vl). */
MS_HD void ms_cu_nll_fwd(float *losses, const float *logp, const int32_t *targets, int64_t vl,
                         int64_t v0, int64_t i) {
    const int64_t t = (int64_t)targets[i] - v0;
    losses[i] = targets[i] >= 0 && t >= 0 && t < vl ? -logp[i * vl + t] : 0.0f;
}

MS_HD void ms_cu_nll_bwd(float *dlogp, const float *dlosses, const int32_t *targets, int64_t vl,
                         int64_t v0, int64_t i) {
    const int64_t t = (int64_t)targets[i] - v0;
    if (targets[i] >= 0 && t >= 0 && t < vl) dlogp[i * vl + t] -= dlosses[i];
}

/* Row i of the label-smoothed cross-entropy: lse[i] and the loss. */
MS_HD void ms_cu_xent_smooth_fwd(float *losses, float *lse, const float *logits,
                                 const int32_t *targets, int64_t v, float s, int64_t i) {
    const float *x = logits + i * v;
    float mx = -INFINITY, sum = 0.0f, tot = 0.0f;
    for (int64_t j = 0; j < v; j++) mx = x[j] > mx ? x[j] : mx;
    for (int64_t j = 0; j < v; j++) sum += expf(x[j] - mx), tot += x[j];
    lse[i] = mx + logf(sum);
    losses[i] = targets[i] < 0 ? 0.0f : lse[i] - (1.0f - s) * x[targets[i]] - s * tot / (float)v;
}

MS_HD void ms_cu_xent_smooth_bwd(float *dlogits, const float *logits, const float *lse,
                                 const int32_t *targets, const float *dlosses, int64_t v, float s,
                                 int64_t i) {
    if (targets[i] < 0) return;
    const float *x = logits + i * v, gl = dlosses[i], l = lse[i], u = s / (float)v;
    float *d = dlogits + i * v;
    for (int64_t j = 0; j < v; j++) d[j] += gl * (expf(x[j] - l) - u);
    d[targets[i]] -= gl * (1.0f - s);
}

#endif

/* layers.c - kernels of the neural-network layer operators (see layers.h).
 *
 * Row-wise kernels make one or two passes over a row that stays in cache; reductions over a
 * row accumulate in float within a row (rows are short) and in double across rows or whole
 * tensors (losses), where the sums are long. Attention follows attention.c's blocked sgemm
 * structure over strided head vectors, so grouped-query heads need no copies.
 */
#include "engine/kernels/layers.h"
#include "engine/kernels/blas.h"

#include <math.h>
#include <string.h>

#include "engine/kernels/fastmath.h"

static inline int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}
static inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
    return x < lo ? lo : x > hi ? hi : x;
}

/* ---- normalisation -------------------------------------------------------------------------- */

void ms_k_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t n,
                          int64_t c, float eps) {
    for (int64_t r = 0; r < n; r++) {
        const float *x = inp + r * c;
        float *o = out + r * c;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < c; j++) ss += x[j] * x[j];
        const float s = 1.0f / sqrtf(ss / (float)c + eps);
#pragma omp simd
        for (int64_t j = 0; j < c; j++) o[j] = x[j] * s * weight[j];
        rstd[r] = s;
    }
}

void ms_k_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *x = inp + r * c;
        const float s = rstd[r];
        if (dweight) {
#pragma omp simd
            for (int64_t j = 0; j < c; j++) dweight[j] += g[j] * x[j] * s;
        }
        if (!dinp) continue;
        /* dx = s * (w g - x s^2 mean(w g x)) */
        float wgx = 0.0f;
#pragma omp simd reduction(+ : wgx)
        for (int64_t j = 0; j < c; j++) wgx += weight[j] * g[j] * x[j];
        const float k = s * s * wgx / (float)c;
        float *d = dinp + r * c;
#pragma omp simd
        for (int64_t j = 0; j < c; j++) d[j] += s * (weight[j] * g[j] - x[j] * k);
    }
}

ms_k_cost ms_k_rmsnorm_cost(int64_t n, int64_t c, bool backward) {
    const double e = (double)n * (double)c, rows = (double)n, ch = (double)c;
    if (!backward) return (ms_k_cost){4 * e + 3 * rows, 4.0 * (2 * e + ch + rows)};
    return (ms_k_cost){10 * e + 3 * rows, 4.0 * (2 * e + 2 * e + ch + 2 * ch + rows)};
}

void ms_k_norm_plain_forward(float *out, float *rstd, const float *inp, int64_t n, int64_t c,
                             float eps) {
    for (int64_t r = 0; r < n; r++) {
        const float *x = inp + r * c;
        float *o = out + r * c;
        float m = 0.0f, v = 0.0f;
#pragma omp simd reduction(+ : m)
        for (int64_t j = 0; j < c; j++) m += x[j];
        m /= (float)c;
#pragma omp simd reduction(+ : v)
        for (int64_t j = 0; j < c; j++) v += (x[j] - m) * (x[j] - m);
        const float s = 1.0f / sqrtf(v / (float)c + eps);
#pragma omp simd
        for (int64_t j = 0; j < c; j++) o[j] = (x[j] - m) * s;
        rstd[r] = s;
    }
}

void ms_k_norm_plain_backward(float *dinp, const float *dout, const float *out, const float *rstd,
                              int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *y = out + r * c;
        float gm = 0.0f, gy = 0.0f;
#pragma omp simd reduction(+ : gm, gy)
        for (int64_t j = 0; j < c; j++) gm += g[j], gy += g[j] * y[j];
        gm /= (float)c, gy /= (float)c;
        float *d = dinp + r * c;
        const float s = rstd[r];
#pragma omp simd
        for (int64_t j = 0; j < c; j++) d[j] += s * (g[j] - gm - y[j] * gy);
    }
}

/* ---- softmax family ------------------------------------------------------------------------- */

void ms_k_log_softmax_forward(float *out, const float *inp, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *x = inp + r * c;
        float *o = out + r * c;
        float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < c; j++) mx = x[j] > mx ? x[j] : mx;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < c; j++) sum += ms_expf_nonpos(x[j] - mx);
        const float lse = mx + logf(sum);
#pragma omp simd
        for (int64_t j = 0; j < c; j++) o[j] = x[j] - lse;
    }
}

void ms_k_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t n,
                               int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *y = out + r * c;
        float *d = dinp + r * c;
        float gs = 0.0f;
#pragma omp simd reduction(+ : gs)
        for (int64_t j = 0; j < c; j++) gs += g[j];
#pragma omp simd
        for (int64_t j = 0; j < c; j++) d[j] += g[j] - ms_expf_nonpos(y[j]) * gs;
    }
}

/* out = softmax(inp * inv_t) over the kept entries (keep NULL: all), 0 elsewhere; a row with
 * nothing kept is all zeros. out may alias inp. */
static void softmax_kept(float *out, const float *inp, const float *keep, int64_t c, float inv_t) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < c; j++)
        if ((!keep || keep[j] != 0.0f) && inp[j] > mx) mx = inp[j];
    if (mx == -INFINITY) {
        memset(out, 0, sizeof(float) * (size_t)c);
        return;
    }
    float sum = 0.0f;
    if (keep) {
        for (int64_t j = 0; j < c; j++) {
            out[j] = keep[j] != 0.0f ? ms_expf_nonpos((inp[j] - mx) * inv_t) : 0.0f;
            sum += out[j];
        }
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < c; j++) {
            out[j] = ms_expf_nonpos((inp[j] - mx) * inv_t);
            sum += out[j];
        }
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < c; j++) out[j] *= inv;
}

void ms_k_masked_softmax_forward(float *out, const float *inp, const float *mask, int64_t n,
                                 int64_t c, float temperature) {
    for (int64_t r = 0; r < n; r++)
        softmax_kept(out + r * c, inp + r * c, mask + r * c, c, 1.0f / temperature);
}

void ms_k_masked_softmax_backward(float *dinp, const float *dout, const float *out, int64_t n,
                                  int64_t c, float temperature) {
    const float inv_t = 1.0f / temperature;
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *y = out + r * c;
        float *d = dinp + r * c;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < c; j++) dot += g[j] * y[j];
#pragma omp simd
        for (int64_t j = 0; j < c; j++) d[j] += y[j] * (g[j] - dot) * inv_t;
    }
}

ms_k_cost ms_k_rowwise_cost(int64_t n, int64_t c, double flops_per_elem, int tensors) {
    const double e = (double)n * (double)c;
    return (ms_k_cost){flops_per_elem * e, 4.0 * tensors * e};
}

/* ---- SwiGLU -----------------------------------------------------------------------------------
 */

static inline float sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}

void ms_k_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

void ms_k_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float s = sigmoidf(gate[i]), silu = gate[i] * s;
        if (dgate) dgate[i] += dout[i] * up[i] * (s + silu * (1.0f - s));
        if (dup) dup[i] += dout[i] * silu;
    }
}

/* ---- rotary position embedding ----------------------------------------------------------------
 */

void ms_k_rotary_tables(float *cosb, float *sinb, int64_t t, int64_t t0, int64_t d, float theta) {
    const int64_t half = d / 2;
    const double two_pi = 6.283185307179586;
    for (int64_t i = 0; i < half; i++) {
        const double freq = pow((double)theta, -2.0 * (double)i / (double)d);
        for (int64_t p = 0; p < t; p++) {
            /* The angle in double, reduced to [-pi, pi] there, so float sin and cos lose
             * nothing at large positions (HF's float32 angle would). */
            double ang = (double)(t0 + p) * freq;
            ang -= two_pi * nearbyint(ang / two_pi);
            sincosf((float)ang, &sinb[p * half + i], &cosb[p * half + i]);
        }
    }
}

void ms_k_rotary_apply(float *out, const float *inp, const float *cosb, const float *sinb,
                       int64_t b, int64_t t, int64_t h, int64_t d, bool inverse) {
    const int64_t half = d / 2;
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t ti = 0; ti < t; ti++) {
            const float *cs = cosb + ti * half, *sn = sinb + ti * half;
            for (int64_t hh = 0; hh < h; hh++) {
                const int64_t base = ((bi * t + ti) * h + hh) * d;
                const float *x1 = inp + base, *x2 = x1 + half;
                float *o1 = out + base, *o2 = o1 + half;
                if (!inverse) {
#pragma omp simd
                    for (int64_t i = 0; i < half; i++) {
                        const float a = x1[i], c = x2[i];
                        o1[i] = a * cs[i] - c * sn[i];
                        o2[i] = c * cs[i] + a * sn[i];
                    }
                } else {
#pragma omp simd
                    for (int64_t i = 0; i < half; i++) {
                        const float a = x1[i], c = x2[i];
                        o1[i] += a * cs[i] + c * sn[i];
                        o2[i] += c * cs[i] - a * sn[i];
                    }
                }
            }
        }
}

/* ---- attention --------------------------------------------------------------------------------
 */

/* Keys query i can see: all, or up to its global position when causal. */
static inline int64_t gqa_keys(const ms_k_gqa *g, int64_t i) {
    return g->causal ? clamp64(g->q_start + i + 1, 0, g->tk) : g->tk;
}

/* One (batch item, query head): q, k, v, o point at its first row. */
static void gqa_head_forward(const ms_k_gqa *g, float *o, float *p, const float *q, const float *k,
                             const float *v, const float *km) {
    const float scale = 1.0f / sqrtf((float)g->d);
    for (int64_t r0 = 0; r0 < g->tq; r0 += MS_K_ATTN_ROW_BLOCK) {
        const int64_t r1 = min64(g->tq, r0 + MS_K_ATTN_ROW_BLOCK), nk = gqa_keys(g, r1 - 1);
        /* S[r0:r1, 0:nk] = scale Q K^T, written into att */
        ms_blas_sgemm(false, true, r1 - r0, nk, g->d, scale, q + r0 * g->q_stride, g->q_stride, k,
                      g->kv_stride, 0.0f, p + r0 * g->tk, g->tk);
        for (int64_t i = r0; i < r1; i++) {
            float *row = p + i * g->tk;
            const int64_t nv = gqa_keys(g, i);
            softmax_kept(row, row, km, nv, 1.0f);
            for (int64_t j = nv; j < g->tk; j++) row[j] = 0.0f;
        }
        if (nk > 0)
            ms_blas_sgemm(false, false, r1 - r0, g->d, nk, 1.0f, p + r0 * g->tk, g->tk, v,
                          g->kv_stride, 0.0f, o + r0 * g->out_stride, g->out_stride);
        else
            for (int64_t i = r0; i < r1; i++)
                memset(o + i * g->out_stride, 0, sizeof(float) * (size_t)g->d);
    }
}

void ms_k_gqa_forward(const ms_k_gqa *g, float *out, float *att, const float *q, const float *k,
                      const float *v, const float *mask) {
    const int64_t grp = g->h / g->hkv;
    for (int64_t bi = 0; bi < g->b; bi++)
        for (int64_t h = 0; h < g->h; h++) {
            const int64_t kvo = bi * g->tk * g->kv_stride + (h / grp) * g->d;
            gqa_head_forward(g, out + bi * g->tq * g->out_stride + h * g->d,
                             att + (bi * g->h + h) * g->tq * g->tk,
                             q + bi * g->tq * g->q_stride + h * g->d, k + kvo, v + kvo,
                             mask ? mask + bi * g->tk : NULL);
        }
}

int64_t ms_k_gqa_scratch_floats(const ms_k_gqa *g) {
    return min64(g->tq, MS_K_ATTN_ROW_BLOCK) * g->tk;
}

typedef struct gqa_head {
    const float *q, *k, *v, *p, *dout;
    float *dq, *dk, *dv;
} gqa_head;

static void gqa_head_backward(const ms_k_gqa *g, const gqa_head *hd, float *scratch) {
    const float scale = 1.0f / sqrtf((float)g->d);
    const int64_t qs = g->q_stride, ks = g->kv_stride, os = g->out_stride;
    for (int64_t r0 = 0; r0 < g->tq; r0 += MS_K_ATTN_ROW_BLOCK) {
        const int64_t r1 = min64(g->tq, r0 + MS_K_ATTN_ROW_BLOCK), m = r1 - r0;
        const int64_t nk = gqa_keys(g, r1 - 1);
        if (nk == 0) continue;
        const float *pb = hd->p + r0 * g->tk, *gb = hd->dout + r0 * os;
        float *ds = scratch; /* [m, nk] */
        ms_blas_sgemm(false, true, m, nk, g->d, 1.0f, gb, os, hd->v, ks, 0.0f, ds,
                      nk); /* dP = dO V^T */
        if (hd->dv)
            ms_blas_sgemm(true, false, nk, g->d, m, 1.0f, pb, g->tk, gb, os, 1.0f, hd->dv, ks);
        /* dS = P (dP - rowsum(P dP)); excluded keys have P = 0 and get none. */
        for (int64_t i = 0; i < m; i++) {
            const float *pr = pb + i * g->tk;
            float *dr = ds + i * nk, dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < nk; j++) dot += pr[j] * dr[j];
#pragma omp simd
            for (int64_t j = 0; j < nk; j++) dr[j] = pr[j] * (dr[j] - dot);
        }
        if (hd->dq)
            ms_blas_sgemm(false, false, m, g->d, nk, scale, ds, nk, hd->k, ks, 1.0f,
                          hd->dq + r0 * qs, qs);
        if (hd->dk)
            ms_blas_sgemm(true, false, nk, g->d, m, scale, ds, nk, hd->q + r0 * qs, qs, 1.0f,
                          hd->dk, ks);
    }
}

void ms_k_gqa_backward(const ms_k_gqa *g, float *dq, float *dk, float *dv, float *scratch,
                       const float *dout, const float *q, const float *k, const float *v,
                       const float *att) {
    const int64_t grp = g->h / g->hkv;
    for (int64_t bi = 0; bi < g->b; bi++)
        for (int64_t h = 0; h < g->h; h++) {
            const int64_t qo = bi * g->tq * g->q_stride + h * g->d;
            const int64_t kvo = bi * g->tk * g->kv_stride + (h / grp) * g->d;
            gqa_head hd = {q + qo,
                           k + kvo,
                           v + kvo,
                           att + (bi * g->h + h) * g->tq * g->tk,
                           dout + bi * g->tq * g->out_stride + h * g->d,
                           dq ? dq + qo : NULL,
                           dk ? dk + kvo : NULL,
                           dv ? dv + kvo : NULL};
            gqa_head_backward(g, &hd, scratch);
        }
}

ms_k_cost ms_k_gqa_cost(const ms_k_gqa *g, bool backward) {
    const double bh = (double)g->b * (double)g->h, tq = (double)g->tq, tk = (double)g->tk;
    double seen = 0; /* query-key pairs of one head: a causal shard of queries sees a prefix */
    for (int64_t i = 0; i < g->tq; i++) seen += (double)gqa_keys(g, i);
    const double pairs = bh * seen, d = (double)g->d;
    const double qo = 2.0 * bh * tq * d, kv = 2.0 * (double)g->b * (double)g->hkv * tk * d;
    const double att = bh * tq * tk;
    if (!backward) return (ms_k_cost){pairs * (4 * d + 4), 4.0 * (qo + kv + att)};
    return (ms_k_cost){pairs * (8 * d + 4), 4.0 * (2 * qo + 2 * kv + att)};
}

/* ---- batched products with broadcast batch dims -----------------------------------------------
 */

/* Offsets (in items) of A and B for batch item `it`. */
static void bmm_item(const ms_k_bmm *g, int64_t it, int64_t *ia, int64_t *ib) {
    *ia = *ib = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        const int64_t x = it % g->shape[d];
        it /= g->shape[d];
        *ia += x * g->a_stride[d];
        *ib += x * g->b_stride[d];
    }
}

static int64_t bmm_items(const ms_k_bmm *g) {
    int64_t n = 1;
    for (int d = 0; d < g->nb; d++) n *= g->shape[d];
    return n;
}

void ms_k_bmm_forward(const ms_k_bmm *g, float *c, const float *a, const float *b) {
    const int64_t m = g->m, k = g->k, n = g->n;
    for (int64_t it = 0; it < bmm_items(g); it++) {
        int64_t ia, ib;
        bmm_item(g, it, &ia, &ib);
        if (k == 0)
            memset(c + it * m * n, 0, sizeof(float) * (size_t)(m * n));
        else
            ms_blas_sgemm(false, false, m, n, k, 1.0f, a + ia * m * k, k, b + ib * k * n, n, 0.0f,
                          c + it * m * n, n);
    }
}

void ms_k_bmm_backward(const ms_k_bmm *g, float *da, float *db, const float *dc, const float *a,
                       const float *b) {
    const int64_t m = g->m, k = g->k, n = g->n;
    if (k == 0) return;
    for (int64_t it = 0; it < bmm_items(g); it++) {
        int64_t ia, ib;
        bmm_item(g, it, &ia, &ib);
        const float *g_it = dc + it * m * n;
        if (da)
            ms_blas_sgemm(false, true, m, k, n, 1.0f, g_it, n, b + ib * k * n, n, 1.0f,
                          da + ia * m * k, k);
        if (db)
            ms_blas_sgemm(true, false, k, n, m, 1.0f, a + ia * m * k, k, g_it, n, 1.0f,
                          db + ib * k * n, n);
    }
}

ms_k_cost ms_k_bmm_cost(const ms_k_bmm *g, bool backward) {
    const double it = (double)bmm_items(g), m = (double)g->m, k = (double)g->k, n = (double)g->n;
    const double io = it * (m * k + k * n + m * n);
    if (!backward) return (ms_k_cost){2 * it * m * n * k, 4.0 * io};
    return (ms_k_cost){4 * it * m * n * k, 4.0 * 2 * io};
}

/* ---- losses ------------------------------------------------------------------------------------
 */

static inline double pointwise_loss(ms_k_loss kind, double x, double delta) {
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

static inline float pointwise_grad(ms_k_loss kind, float x, float delta) {
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

double ms_k_pointwise_loss_sum(ms_k_loss kind, const float *a, const float *b, int64_t n,
                               float delta) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += pointwise_loss(kind, (double)a[i] - b[i], delta);
    return s;
}

void ms_k_pointwise_loss_backward(ms_k_loss kind, float *da, float *db, const float *a,
                                  const float *b, int64_t n, float delta, float scale) {
    for (int64_t i = 0; i < n; i++) {
        const float gr = scale * pointwise_grad(kind, a[i] - b[i], delta);
        if (da) da[i] += gr;
        if (db) db[i] -= gr;
    }
}

void ms_k_nll_forward(float *losses, const float *logp, const int32_t *targets, int64_t n,
                      int64_t vl, int64_t v0) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = (int64_t)targets[i] - v0;
        losses[i] = targets[i] >= 0 && t >= 0 && t < vl ? -logp[i * vl + t] : 0.0f;
    }
}

void ms_k_nll_backward(float *dlogp, const float *dlosses, const int32_t *targets, int64_t n,
                       int64_t vl, int64_t v0) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = (int64_t)targets[i] - v0;
        if (targets[i] >= 0 && t >= 0 && t < vl) dlogp[i * vl + t] -= dlosses[i];
    }
}

void ms_k_xent_smooth_forward(float *losses, float *lse, const float *logits,
                              const int32_t *targets, int64_t n, int64_t v, float s) {
    for (int64_t i = 0; i < n; i++) {
        const float *x = logits + i * v;
        float mx = -INFINITY, sum = 0.0f, tot = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < v; j++) mx = x[j] > mx ? x[j] : mx;
#pragma omp simd reduction(+ : sum, tot)
        for (int64_t j = 0; j < v; j++) sum += ms_expf_nonpos(x[j] - mx), tot += x[j];
        lse[i] = mx + logf(sum);
        losses[i] =
            targets[i] < 0 ? 0.0f : lse[i] - (1.0f - s) * x[targets[i]] - s * tot / (float)v;
    }
}

void ms_k_xent_smooth_backward(float *dlogits, const float *logits, const float *lse,
                               const int32_t *targets, const float *dlosses, int64_t n, int64_t v,
                               float s) {
    for (int64_t i = 0; i < n; i++) {
        if (targets[i] < 0) continue;
        const float *x = logits + i * v, gl = dlosses[i], l = lse[i], u = s / (float)v;
        float *d = dlogits + i * v;
#pragma omp simd
        for (int64_t j = 0; j < v; j++) d[j] += gl * (ms_expf_nonpos(x[j] - l) - u);
        d[targets[i]] -= gl * (1.0f - s);
    }
}

/* Per row: a.b, |a| and |b| clamped at eps. */
static void cosine_row(const float *a, const float *b, int64_t c, float eps, double *dot,
                       double *na, double *nb) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int64_t j = 0; j < c; j++)
        ab += (double)a[j] * b[j], aa += (double)a[j] * a[j], bb += (double)b[j] * b[j];
    *dot = ab;
    *na = fmax(sqrt(aa), eps);
    *nb = fmax(sqrt(bb), eps);
}

void ms_k_cosine_forward(float *out, const float *a, const float *b, int64_t n, int64_t c,
                         float eps) {
    for (int64_t i = 0; i < n; i++) {
        double dot, na, nb;
        cosine_row(a + i * c, b + i * c, c, eps, &dot, &na, &nb);
        out[i] = (float)(dot / (na * nb));
    }
}

/* d/da of a.b / (|a| |b|) = b / (|a| |b|) - f a / |a|^2, with no second term where |a| was
 * clamped at eps (a constant there). */
void ms_k_cosine_backward(float *da, float *db, const float *dout, const float *a, const float *b,
                          int64_t n, int64_t c, float eps) {
    for (int64_t i = 0; i < n; i++) {
        const float *x = a + i * c, *y = b + i * c;
        double dot, na, nb;
        cosine_row(x, y, c, eps, &dot, &na, &nb);
        const double f = dot / (na * nb), g = dout[i], inv = 1.0 / (na * nb);
        const double ka = na > eps ? f / (na * na) : 0.0, kb = nb > eps ? f / (nb * nb) : 0.0;
        for (int64_t j = 0; j < c; j++) {
            if (da) da[i * c + j] += (float)(g * (y[j] * inv - ka * x[j]));
            if (db) db[i * c + j] += (float)(g * (x[j] * inv - kb * y[j]));
        }
    }
}

void ms_k_rows_forward(ms_k_row_op op, float *out, float *aux, const float *x, const float *y,
                       int64_t n, int64_t c, float p) {
    switch (op) {
        case MS_K_ROW_NORM_PLAIN:
            ms_k_norm_plain_forward(out, aux, x, n, c, p);
            break;
        case MS_K_ROW_LOG_SOFTMAX:
            ms_k_log_softmax_forward(out, x, n, c);
            break;
        case MS_K_ROW_MASKED_SOFTMAX:
            ms_k_masked_softmax_forward(out, x, y, n, c, p);
            break;
        case MS_K_ROW_COSINE:
            ms_k_cosine_forward(out, x, y, n, c, p);
            break;
    }
}

void ms_k_rows_backward(ms_k_row_op op, float *dx, float *dy, const float *dout, const float *x,
                        const float *y, const float *out, const float *aux, int64_t n, int64_t c,
                        float p) {
    switch (op) {
        case MS_K_ROW_NORM_PLAIN:
            if (dx) ms_k_norm_plain_backward(dx, dout, out, aux, n, c);
            break;
        case MS_K_ROW_LOG_SOFTMAX:
            if (dx) ms_k_log_softmax_backward(dx, dout, out, n, c);
            break;
        case MS_K_ROW_MASKED_SOFTMAX:
            if (dx) ms_k_masked_softmax_backward(dx, dout, out, n, c, p);
            break;
        case MS_K_ROW_COSINE:
            ms_k_cosine_backward(dx, dy, dout, x, y, n, c, p);
            break;
    }
}

void ms_k_pointwise_loss_forward(ms_k_loss kind, float *out, const float *a, const float *b,
                                 int64_t n, float delta, float scale) {
    out[0] = (float)(ms_k_pointwise_loss_sum(kind, a, b, n, delta) * scale);
}

void ms_k_pointwise_loss_backward_dev(ms_k_loss kind, float *da, float *db, const float *a,
                                      const float *b, const float *dout, int64_t n, float delta,
                                      float scale) {
    ms_k_pointwise_loss_backward(kind, da, db, a, b, n, delta, dout[0] * scale);
}

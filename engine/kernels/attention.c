/* attention.c - fused multi-head self-attention (GPT-2 layout), forward and backward.
 *
 * Per (batch, head) the work is two products, S = Q K^T and O = P V (and four in backward),
 * done with sgemm straight on the strided head columns of qkv (leading dim 3C) and out
 * (leading dim C): no gathering copies. Queries go in blocks of MS_K_ATTN_ROW_BLOCK rows; in
 * causal mode a block only multiplies the keys up to its last row, which cuts the products to
 * about half, as the mask would otherwise throw that work away. Dropout on the probabilities
 * (attn_pdrop) draws its mask from each probability's global index (as dropout.c does), so the
 * backward draws it again instead of storing it.
 */
#include "engine/kernels/kernels.h"
#include "engine/kernels/blas.h"
#include "engine/kernels/fastmath.h"

#include <math.h>

static inline int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

static bool dropping(const ms_k_attn_dropout *d) {
    return d && d->p > 0;
}

/* The global index of probability (bi, h, i, 0) (kernels.h). */
static uint64_t drop_row_base(const ms_k_attn_dropout *d, int64_t bi, int64_t h, int64_t i,
                              int64_t t) {
    const uint64_t gb = (uint64_t)ms_k_batch_row(d->w, d->b0 + bi);
    return ((gb * (uint64_t)d->nh + (uint64_t)(d->h0 + h)) * (uint64_t)t + (uint64_t)i) *
           (uint64_t)t;
}

/* dst[j] = src[j] / (1 - p) where probability g0 + j is kept, else 0; j < n (dst may be src). */
static void drop_row(float *dst, const float *src, int64_t n, const ms_k_attn_dropout *d,
                     uint64_t g0) {
    const float scale = ms_k_dropout_scale(d->p);
    for (int64_t j = 0; j < n; j++)
        dst[j] =
            ms_k_dropout_keep(d->p, d->seed, d->stream, g0 + (uint64_t)j) ? src[j] * scale : 0.0f;
}

void ms_k_attention_forward(float *out, float *att, float *work, const float *qkv,
                            const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh,
                            bool causal, const ms_k_attn_dropout *drop) {
    const int64_t hs = c / nh, c3 = 3 * c;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int64_t bi = 0; bi < b; bi++) {
        const float *km = mask ? mask + bi * t : NULL;
        for (int64_t h = 0; h < nh; h++) {
            const float *q = qkv + bi * t * c3 + h * hs, *k = q + c, *v = q + 2 * c;
            float *p = att + (bi * nh + h) * t * t;
            float *o = out + bi * t * c + h * hs;
            for (int64_t r0 = 0; r0 < t; r0 += MS_K_ATTN_ROW_BLOCK) {
                const int64_t r1 = min64(t, r0 + MS_K_ATTN_ROW_BLOCK);
                const int64_t nk = causal ? r1 : t; /* keys this block can see */
                /* S[r0:r1, 0:nk] = scale * Q[r0:r1] K[0:nk]^T, written into att */
                ms_blas_sgemm(false, true, r1 - r0, nk, hs, scale, q + r0 * c3, c3, k, c3, 0.0f,
                              p + r0 * t, t);
                for (int64_t i = r0; i < r1; i++) {
                    float *row = p + i * t;
                    const int64_t nv = causal ? i + 1 : t;
                    if (km)
                        for (int64_t j = 0; j < nv; j++) row[j] += km[j];
                    ms_softmax_row(row, row, nv);
                    /* Zeros above the diagonal: the P V product below reads up to nk, and
                     * backward relies on P = 0 wherever a key was excluded. */
                    for (int64_t j = nv; j < t; j++) row[j] = 0.0f;
                }
                /* O[r0:r1] = P[r0:r1, 0:nk] V[0:nk], or dropout(P) V from the work block */
                const float *pa = p + r0 * t;
                int64_t lda = t;
                if (dropping(drop)) {
                    for (int64_t i = r0; i < r1; i++)
                        drop_row(work + (i - r0) * nk, p + i * t, nk, drop,
                                 drop_row_base(drop, bi, h, i, t));
                    pa = work, lda = nk;
                }
                ms_blas_sgemm(false, false, r1 - r0, hs, nk, 1.0f, pa, lda, v, c3, 0.0f, o + r0 * c,
                              c);
            }
        }
    }
}

int64_t ms_k_attention_scratch_floats(int64_t t) {
    return min64(t, MS_K_ATTN_ROW_BLOCK) * t;
}

void ms_k_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, int64_t b, int64_t t, int64_t c, int64_t nh,
                             bool causal, const ms_k_attn_dropout *drop) {
    const int64_t hs = c / nh, c3 = 3 * c;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t h = 0; h < nh; h++) {
            const int64_t off = bi * t * c3 + h * hs;
            const float *q = qkv + off, *k = q + c, *v = q + 2 * c;
            float *dq = dqkv + off, *dk = dq + c, *dv = dq + 2 * c;
            const float *p = att + (bi * nh + h) * t * t;
            const float *g = dout + bi * t * c + h * hs;
            for (int64_t r0 = 0; r0 < t; r0 += MS_K_ATTN_ROW_BLOCK) {
                const int64_t r1 = min64(t, r0 + MS_K_ATTN_ROW_BLOCK), m = r1 - r0;
                const int64_t nk = causal ? r1 : t;
                const float *pb = p + r0 * t;
                float *ds = scratch; /* [m, nk] */
                if (dropping(drop)) {
                    /* dV[0:nk] += D^T dO with D = dropout(P), drawn into the scratch first */
                    for (int64_t i = 0; i < m; i++)
                        drop_row(ds + i * nk, pb + i * t, nk, drop,
                                 drop_row_base(drop, bi, h, r0 + i, t));
                    ms_blas_sgemm(true, false, nk, hs, m, 1.0f, ds, nk, g + r0 * c, c, 1.0f, dv,
                                  c3);
                }
                /* dD = dO V^T; without dropout D is P and this is dP */
                ms_blas_sgemm(false, true, m, nk, hs, 1.0f, g + r0 * c, c, v, c3, 0.0f, ds, nk);
                if (dropping(drop)) /* dP = dD where kept, scaled; 0 where dropped */
                    for (int64_t i = 0; i < m; i++)
                        drop_row(ds + i * nk, ds + i * nk, nk, drop,
                                 drop_row_base(drop, bi, h, r0 + i, t));
                else /* dV[0:nk] += P^T dO */
                    ms_blas_sgemm(true, false, nk, hs, m, 1.0f, pb, t, g + r0 * c, c, 1.0f, dv, c3);
                /* dS = P * (dP - rowsum(P * dP)); entries with P = 0 (excluded keys) become 0,
                 * so the causal and masked cases need no special handling. */
                for (int64_t i = 0; i < m; i++) {
                    const float *pr = pb + i * t;
                    float *dr = ds + i * nk;
                    float dot = 0.0f;
                    for (int64_t j = 0; j < nk; j++) dot += pr[j] * dr[j];
                    for (int64_t j = 0; j < nk; j++) dr[j] = pr[j] * (dr[j] - dot);
                }
                /* S = scale Q K^T:  dQ[r0:r1] += scale dS K,  dK[0:nk] += scale dS^T Q */
                ms_blas_sgemm(false, false, m, hs, nk, scale, ds, nk, k, c3, 1.0f, dq + r0 * c3,
                              c3);
                ms_blas_sgemm(true, false, nk, hs, m, scale, ds, nk, q + r0 * c3, c3, 1.0f, dk, c3);
            }
        }
    }
}

ms_k_cost ms_k_attention_cost(int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                              bool backward) {
    const double tt = (double)t, hs = (double)(c / nh), bh = (double)b * (double)nh;
    const double pairs = bh * (causal ? tt * (tt + 1) / 2 : tt * tt);
    const double qkv = (double)b * tt * 3.0 * (double)c, o = (double)b * tt * (double)c;
    const double att = bh * tt * tt;
    ms_k_cost k;
    if (!backward) {
        /* QK^T and PV: 2 * HS each per pair; softmax: exp, subtract, add, scale (+ mask add) */
        k.flops = pairs * (4 * hs + 4);
        k.bytes = 4.0 * (qkv + o + att);
    } else {
        /* dP, dV, dQ, dK: 4 products of 2 * HS per pair; softmax backward 4 per pair */
        k.flops = pairs * (8 * hs + 4);
        k.bytes = 4.0 * (qkv + o + att + 2 * qkv);
    }
    return k;
}

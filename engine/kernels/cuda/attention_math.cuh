/* attention_math.cuh - fused attention, one query (or key) row per call and one tile of keys
 * (or queries) at a time, so no T x T matrix ever exists in memory.
 *
 * The functions see one head's rows: a query row, and tiles of key and value rows (of the
 * query head's kv head under grouped-query attention), wherever the layout puts them
 * (attention.cu: GPT-2's packed qkv [B, T, 3C], or layers.h's strided q, k, v). The key mask
 * is additive (0 keep, -INFINITY drop; ms_cu_attn_mask_term turns layers.h's keep flags into
 * that); causal excludes keys j > the query's global position. Instead of the probabilities
 * the forward saves each query row's logsumexp of its scores; a row that sees no key outputs
 * zeros and saves lse = -INFINITY, and takes no gradient.
 *
 * Forward (online softmax): a query row's state is its running max m, running sum l and an
 * output accumulator acc [HS]; each key tile rescales them once by exp(m_old - m_new) and adds
 * its keys. At the end out = acc / l and lse = m + log l.
 * Backward recomputes P from lse: p_ij = exp(s_ij - lse_i), with s_ij = scale q_i.k_j + mask_j;
 * with delta_i = dO_i . O_i (= sum_j p_ij dO_i.v_j),
 *   dS_ij = p_ij (dO_i.v_j - delta_i),  dQ_i += scale sum_j dS_ij k_j,
 *   dK_j += scale sum_i dS_ij q_i,      dV_j += sum_i p_ij dO_i.
 * dQ is summed per query row over key tiles, dK and dV per key row over query tiles: each
 * output row has one owner, so the GPU needs no atomics and the sums have a fixed order.
 *
 * K, V, Q and dO tiles are passed as a pointer to their first row and a row stride (ld): 3C
 * or C straight from global memory, HS from a tile staged in shared memory.
 */
#ifndef MS_CUDA_ATTENTION_MATH_CUH
#define MS_CUDA_ATTENTION_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"

/* Keys (queries) per tile, and the largest head size the per-row state holds. */
#define MS_CU_ATTN_TILE   32
#define MS_CU_ATTN_MAX_HS 128

struct ms_cu_attn_state {
    float m, l; /* running max and sum of exp(s - m) */
};

template <typename A, typename B> MS_HD float ms_cu_dot(const A *a, const B *b, int64_t hs) {
    float s = 0.0f;
    for (int64_t d = 0; d < hs; d++) s += ms_cu_load(a + d) * ms_cu_load(b + d);
    return s;
}

MS_HD void ms_cu_attn_fwd_init(ms_cu_attn_state *st, float *acc, int64_t hs) {
    st->m = -INFINITY;
    st->l = 0.0f;
    for (int64_t d = 0; d < hs; d++) acc[d] = 0.0f;
}

/* The number of keys of the tile starting at key j0 (of nkeys <= MS_CU_ATTN_TILE) that query
 * i may see. */
MS_HD int64_t ms_cu_attn_visible(int64_t i, int64_t j0, int64_t nkeys, bool causal) {
    if (!causal) return nkeys;
    const int64_t n = i + 1 - j0;
    return n < 0 ? 0 : (n < nkeys ? n : nkeys);
}

/* Adds keys [0, nkeys) of a tile to query row q [HS] (fp32). k, v: the tile's first key and
 * value rows, ld apart; mask: the tile's mask entries or NULL. Masked keys (-inf) are skipped,
 * so a tile with no visible key leaves the state as it was. */
template <typename T>
MS_HD void ms_cu_attn_fwd_tile(ms_cu_attn_state *st, float *acc, const float *q, const T *k,
                               const T *v, int64_t ld, const float *mask, int64_t nkeys, int64_t hs,
                               float scale) {
    float s[MS_CU_ATTN_TILE];
    float tmax = -INFINITY;
    for (int64_t j = 0; j < nkeys; j++) {
        s[j] = scale * ms_cu_dot(q, k + j * ld, hs) + (mask ? mask[j] : 0.0f);
        tmax = ms_cu_maxf(s[j], tmax);
    }
    if (tmax == -INFINITY) return;
    const float m = ms_cu_maxf(tmax, st->m);
    const float corr = expf(st->m - m); /* 0 on the first visible tile (m was -inf) */
    st->l *= corr;
    for (int64_t d = 0; d < hs; d++) acc[d] *= corr;
    for (int64_t j = 0; j < nkeys; j++) {
        if (s[j] == -INFINITY) continue;
        const float p = expf(s[j] - m);
        st->l += p;
        for (int64_t d = 0; d < hs; d++) acc[d] += p * ms_cu_load(v + j * ld + d);
    }
    st->m = m;
}

/* The additive mask term of key j: mask[j] itself, or with keep flags (0 drops the key) 0 or
 * -INFINITY. No mask: 0. */
MS_HD float ms_cu_attn_mask_term(const float *mask, int64_t j, bool keep_flags) {
    if (!mask) return 0.0f;
    if (keep_flags) return mask[j] != 0.0f ? 0.0f : -INFINITY;
    return mask[j];
}

/* out [HS] = acc / l; returns the row's logsumexp (-INFINITY, and zeros out, for a row that
 * saw no key). */
template <typename T>
MS_HD float ms_cu_attn_fwd_finish(T *out, const ms_cu_attn_state *st, const float *acc,
                                  int64_t hs) {
    if (st->l == 0.0f) {
        for (int64_t d = 0; d < hs; d++) ms_cu_store(out + d, 0.0f);
        return -INFINITY;
    }
    const float inv = 1.0f / st->l;
    for (int64_t d = 0; d < hs; d++) ms_cu_store(out + d, acc[d] * inv);
    return st->m + logf(st->l);
}

/* p_ij recomputed from the saved logsumexp (0 for a masked key, and in a row that saw none). */
template <typename A, typename B>
MS_HD float ms_cu_attn_prob(const A *q, const B *k, int64_t hs, float scale, float maskj,
                            float lse) {
    if (lse == -INFINITY || maskj == -INFINITY) return 0.0f;
    return expf(scale * ms_cu_dot(q, k, hs) + maskj - lse);
}

/* Query row i's dQ [HS] (fp32, +=) from the key tile [0, nkeys). q, dout: the row's fp32 q
 * and dO; delta = dO_i . O_i; lse: the row's logsumexp. */
template <typename T>
MS_HD void ms_cu_attn_dq_tile(float *dq, const float *q, const float *dout, float delta, float lse,
                              const T *k, const T *v, int64_t ld, const float *mask, int64_t nkeys,
                              int64_t hs, float scale) {
    for (int64_t j = 0; j < nkeys; j++) {
        const float p = ms_cu_attn_prob(q, k + j * ld, hs, scale, mask ? mask[j] : 0.0f, lse);
        if (p == 0.0f) continue;
        const float ds = p * (ms_cu_dot(dout, v + j * ld, hs) - delta);
        for (int64_t d = 0; d < hs; d++) dq[d] += scale * ds * ms_cu_load(k + j * ld + d);
    }
}

/* Key row j's dK and dV [HS] (fp32, +=) from the query tile starting at query i0 (its global
 * position) with nq rows. k, v: the key row (fp32); maskj: its mask term; q, dout: the tile's
 * first q and dO rows (ldq, ldo apart); lse, delta: the tile's per-query values. Causal:
 * queries before key j are skipped. */
template <typename T>
MS_HD void ms_cu_attn_dkv_tile(float *dk, float *dv, const float *k, const float *v, int64_t j,
                               float maskj, const T *q, int64_t ldq, const T *dout, int64_t ldo,
                               const float *lse, const float *delta, int64_t i0, int64_t nq,
                               int64_t hs, float scale, bool causal) {
    for (int64_t i = 0; i < nq; i++) {
        if (causal && i0 + i < j) continue;
        const T *qi = q + i * ldq, *gi = dout + i * ldo;
        const float p = ms_cu_attn_prob(qi, k, hs, scale, maskj, lse[i]);
        if (p == 0.0f) continue;
        const float ds = p * (ms_cu_dot(gi, v, hs) - delta[i]);
        for (int64_t d = 0; d < hs; d++) {
            dv[d] += p * ms_cu_load(gi + d);
            dk[d] += scale * ds * ms_cu_load(qi + d);
        }
    }
}

#endif

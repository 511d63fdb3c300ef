/* flash_math.cuh - flash attention for bf16 on the tensor cores: the bodies of its three
 * kernels (forward; backward dQ; backward dK, dV), one thread block each, written against a
 * block context so that the same code runs on a GPU (flash.cu) and, lane by lane, on the CPU
 * (tests/cuda_simt_host.h, tests/test_cuda_host_flash.cu).
 *
 * The block context Cx offers: tid() (0 .. MS_FA_THREADS - 1), lane() and warp(); sync(), the
 * block's barrier; shfl_xor(v, mask) within a warp; mma(d, a, b): d += A B, one warp's bf16
 * m16n8k16 product with fp32 accumulators; ldsm(r, count, trans, row): the warp's matrix load
 * from shared memory, this lane giving the address of one row (mma_math.cuh has the layouts).
 *
 * The arithmetic is attention_math.cuh's (online softmax forward saving each row's
 * logsumexp, a backward that recomputes the probabilities from it; every output row has one
 * owner block, so no atomics and a fixed order of sums), tiled for the tensor cores as
 * FlashAttention-2 tiles it:
 *   - a block owns 64 rows (4 warps x 16): query rows for the forward and dQ, key rows for
 *     dK and dV; the rows it multiplies by stay in registers as A fragments;
 *   - the other side streams through shared memory in tiles of 64 rows (keys and values, or
 *     queries and output gradients; 32 queries for dK and dV from head size 48, whose
 *     registers hold four fragment sets already), padded by 8 elements a row so that the
 *     matrix loads of a warp hit 32 different banks;
 *   - scores S = Q K^T (or K Q^T) are C fragments; the softmax works on them in registers,
 *     the row max and sum over the 4 lanes that share a row (shfl_xor 1, 2); the
 *     probabilities, rounded to bf16, are the A operand of the next product (P V, P^T dO,
 *     dS K, dS^T Q) without leaving the registers.
 * Scores are kept in base 2 (scaled by log2 e), so each exponential is one exp2.
 *
 * Precision: operands are bf16 and every sum fp32; the probabilities and dS are rounded to
 * bf16 before their second product (as FlashAttention does), so results differ from the row
 * kernels' fp32 arithmetic on widened operands by about bf16's 2^-9 relative to the row's
 * scale; the forward's normaliser sums the rounded probabilities it multiplied by. dQ, dK
 * and dV are added to what the buffers hold and rounded once.
 *
 * Which calls take this path (flash.cu): bf16 storage, a head size the bodies are built for
 * (ms_fa_head_size_ok: 16 to 64 in steps of 16, 80, 96 and 128: GPT-2's, BERT's and LLaMA's),
 * every row stride a multiple of 8 elements and 16-byte aligned pointers; the rest run the row
 * kernels of attention.cu.
 */
#ifndef MS_CUDA_FLASH_MATH_CUH
#define MS_CUDA_FLASH_MATH_CUH

#include "engine/kernels/cuda/attention_math.cuh"
#include "engine/kernels/cuda/mma_math.cuh"

#define MS_FA_WARPS   4
#define MS_FA_THREADS (32 * MS_FA_WARPS)
#define MS_FA_ROWS    (16 * MS_FA_WARPS) /* rows a block owns */
#define MS_FA_TILE    64                 /* rows of a staged tile */

#define MS_FA_LOG2E 1.4426950408889634f
#define MS_FA_LN2   0.6931471805599453f

/* One attention call. Pointers are those of batch item 0, head 0; rows of q (of out, dout,
 * dq) are q_ld (out_ld) elements apart, rows of k and v kv_ld; query head h reads kv head
 * h / (h_count / hkv). lse [B, H, Tq]; o_f32 (forward, may be NULL) and the backward's
 * saved output are [B, Tq, H, HS] fp32; delta [B, H, Tq] = dO_i . O_i. mask [B, Tk] or NULL:
 * additive, or with keep_mask a keep flag (attention_math.cuh's ms_cu_attn_mask_term). */
struct ms_fa_args {
    const uint16_t *q, *k, *v, *dout;
    uint16_t *out, *dq, *dk, *dv; /* dq, dk, dv: += the gradients; any may be NULL */
    float *lse, *o_f32;
    const float *delta, *mask;
    int64_t tq, tk, h, hkv;
    int64_t hs; /* the head size: the HS the bodies are instantiated with */
    int64_t q_ld, kv_ld, out_ld;
    int64_t q_start; /* the global position of query row 0 (key 0 is position 0) */
    bool causal, keep_mask;
    bool fresh; /* backward: dq, dk, dv hold nothing yet: written, not added to */
    float scale;
};

/* The head sizes flash.cu instantiates its kernels for. At 96 and 128 the dQ kernel keeps its
 * accumulators and operand fragments in 255 registers and spills 36-104 bytes a thread (ptxas,
 * sm_80 and sm_90), dK/dV at 128 16-20 bytes: a little local memory per thread, against the
 * row kernels' rereading of every key and value row per query. */
MS_HD bool ms_fa_head_size_ok(int64_t hs) {
    return hs == 16 || hs == 32 || hs == 48 || hs == 64 || hs == 80 || hs == 96 || hs == 128;
}

/* Shared memory of a block, in bf16 elements (two padded tiles) and floats (per-row terms). */
#define MS_FA_LDT(hs)       ((hs) + 8)
#define MS_FA_SMEM_BF16(hs) (2 * MS_FA_TILE * MS_FA_LDT(hs))
#define MS_FA_SMEM_FLOATS   (2 * MS_FA_TILE)

/* Rows [r0, r0 + ROWS) of one head (ld apart) into a padded tile, 16 bytes a copy;
 * rows >= n are zeros. Called by every thread of the block. */
template <int HS, int ROWS = MS_FA_TILE, class Cx>
MS_HD void ms_fa_stage(Cx &cx, uint16_t *tile, const uint16_t *src, int64_t ld, int64_t r0,
                       int64_t n) {
    constexpr int chunks = HS / 8;
    for (int e = cx.tid(); e < ROWS * chunks; e += MS_FA_THREADS) {
        const int r = e / chunks, c = e % chunks;
        uint16_t *d = tile + r * MS_FA_LDT(HS) + c * 8;
        if (r0 + r < n)
            ms_cu_copy16(d, src + (r0 + r) * ld + c * 8);
        else
            ms_cu_zero16(d);
    }
}

/* s[nt] = rows(a) . rows(tile)^T for the tile's 8-row groups nt: a warp's 16 x 64 scores. The
 * B fragments of two k-steps come in one matrix load: lane 8 i + r gives row nt * 8 + r, at
 * column ks * 16 + 8 i (i = 0..3; 0..1 for a last, odd k-step). */
template <int HS, int COLS = MS_FA_TILE, class Cx>
MS_HD void ms_fa_scores(Cx &cx, float s[COLS / 8][4], const uint32_t a[HS / 16][4],
                        const uint16_t *tile) {
    const int lane = cx.lane();
    MS_UNROLL
    for (int nt = 0; nt < COLS / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const uint16_t *row = tile + (nt * 8 + lane % 8) * MS_FA_LDT(HS) + 8 * (lane / 8);
        MS_UNROLL
        for (int ks = 0; ks < HS / 16; ks += 2) {
            uint32_t b[4];
            const int pair = ks + 1 < HS / 16;
            cx.ldsm(b, pair ? 4 : 2, false, row + ks * 16);
            cx.mma(s[nt], a[ks], b);
            if (pair) cx.mma(s[nt], a[ks + 1], b + 2);
        }
    }
}

/* acc[dt] += P tile, with p the 16 x 64 C fragments of this warp (rounded to bf16 here). The
 * B fragments of two 8-column groups come in one transposed matrix load: lane 8 i + r gives
 * row kk * 16 + r + 8 (i % 2), at column dt * 8 + 8 (i / 2). */
template <int HS, int COLS = MS_FA_TILE, class Cx>
MS_HD void ms_fa_times_tile(Cx &cx, float acc[HS / 8][4], const float p[COLS / 8][4],
                            const uint16_t *tile) {
    const int lane = cx.lane(), i = lane / 8;
    MS_UNROLL
    for (int kk = 0; kk < COLS / 16; kk++) {
        uint32_t a[4];
        ms_cu_mma_a_from_c(a, p[2 * kk], p[2 * kk + 1]);
        const uint16_t *row =
            tile + (kk * 16 + lane % 8 + 8 * (i % 2)) * MS_FA_LDT(HS) + 8 * (i / 2);
        MS_UNROLL
        for (int dt = 0; dt < HS / 8; dt += 2) { /* HS / 8 is even: HS is a multiple of 16 */
            uint32_t b[4];
            cx.ldsm(b, 4, true, row + dt * 8);
            cx.mma(acc[dt], a, b);
            cx.mma(acc[dt + 1], a, b + 2);
        }
    }
}

/* The max and the sum over the 4 lanes that hold one row. */
template <class Cx> MS_HD float ms_fa_row_max(Cx &cx, float v) {
    v = ms_cu_maxf(v, cx.shfl_xor(v, 1));
    return ms_cu_maxf(v, cx.shfl_xor(v, 2));
}
template <class Cx> MS_HD float ms_fa_row_sum(Cx &cx, float v) {
    v += cx.shfl_xor(v, 1);
    return v + cx.shfl_xor(v, 2);
}

/* The last column of the key tile starting at j0 that query row `row` sees (keys past the end
 * and, causally, past the row's position are not seen): a score is kept where its column is
 * at most this, -1 when the row sees none of the tile. Rows past the queries' end are never
 * stored, so what they see does not matter. */
MS_HD int ms_fa_last_seen(const ms_fa_args &a, int64_t row, int64_t j0) {
    int64_t end = a.tk;
    if (a.causal && a.q_start + row + 1 < end) end = a.q_start + row + 1;
    const int64_t last = end - 1 - j0;
    return last < -1 ? -1 : last > MS_FA_TILE ? MS_FA_TILE : (int)last;
}

/* The first column of the query tile starting at i0 that sees key `key` (causally, queries
 * before the key's position do not): 0 without a causal mask. Queries past the end have
 * lse -inf (probability 0), keys past the end are never stored. */
MS_HD int ms_fa_first_seeing(const ms_fa_args &a, int64_t key, int64_t i0) {
    if (!a.causal) return 0;
    const int64_t first = key - a.q_start - i0;
    return first < 0 ? 0 : first > MS_FA_TILE ? MS_FA_TILE : (int)first;
}

/* Loads the additive mask terms (base 2) of keys [j0, j0 + MS_FA_TILE) into mt. */
template <class Cx>
MS_HD void ms_fa_stage_mask(Cx &cx, float *mt, const float *km, int64_t j0, const ms_fa_args &a) {
    for (int e = cx.tid(); e < MS_FA_TILE; e += MS_FA_THREADS)
        mt[e] = j0 + e < a.tk ? ms_cu_attn_mask_term(km, j0 + e, a.keep_mask) * MS_FA_LOG2E : 0.0f;
}

/* What the forward and dQ blocks share: a block of MS_FA_ROWS query rows of head h of batch
 * item bi, this lane's two rows, where the head's q, k, v and mask start, and the keys the
 * block's rows may see (all keys, or causally up to its last row's position). */
struct ms_fa_qblock {
    int64_t q0, row[2], kend;
    const uint16_t *qh, *kh, *vh;
    const float *km;
};

template <int HS, class Cx>
MS_HD ms_fa_qblock ms_fa_qblock_of(Cx &cx, const ms_fa_args &a, int64_t qb, int64_t h, int64_t bi) {
    ms_fa_qblock q;
    q.q0 = qb * MS_FA_ROWS + cx.warp() * 16;
    q.row[0] = q.q0 + cx.lane() / 4, q.row[1] = q.row[0] + 8;
    const int64_t kvh = h / (a.h / a.hkv);
    q.qh = a.q + bi * a.tq * a.q_ld + h * HS;
    q.kh = a.k + bi * a.tk * a.kv_ld + kvh * HS;
    q.vh = a.v + bi * a.tk * a.kv_ld + kvh * HS;
    q.km = a.mask ? a.mask + bi * a.tk : NULL;
    const int64_t end = qb * MS_FA_ROWS + MS_FA_ROWS < a.tq ? qb * MS_FA_ROWS + MS_FA_ROWS : a.tq;
    q.kend = a.causal && a.q_start + end < a.tk ? a.q_start + end : a.tk;
    return q;
}

/* Key tile j0 of a query block into shared memory: its keys, its values and (with a mask)
 * their mask terms; returns once every thread's copies are done. */
template <int HS, class Cx>
MS_HD void ms_fa_stage_keys(Cx &cx, const ms_fa_args &a, const ms_fa_qblock &blk, int64_t j0,
                            uint16_t *ks, uint16_t *vs, float *mt) {
    ms_fa_stage<HS>(cx, ks, blk.kh, a.kv_ld, j0, a.tk);
    ms_fa_stage<HS>(cx, vs, blk.vh, a.kv_ld, j0, a.tk);
    if (blk.km) ms_fa_stage_mask(cx, mt, blk.km, j0, a);
    cx.sync();
}

/* A query row's base-2 score for column col of the staged key tile, plus its mask term (mt:
 * the staged terms, or NULL); -inf past the last key the row sees. */
MS_HD float ms_fa_score2(float s, float sl2, const float *mt, int col, int last) {
    return col <= last ? s * sl2 + (mt ? mt[col] : 0.0f) : -INFINITY;
}

/* ---- forward: a block of MS_FA_ROWS query rows of head h of batch item bi ---- */
template <int HS, class Cx>
MS_HD void ms_fa_forward_block(Cx &cx, const ms_fa_args &a, int64_t qb, int64_t h, int64_t bi,
                               uint16_t *smem, float *fsmem) {
    constexpr int NT = MS_FA_TILE / 8, DT = HS / 8;
    uint16_t *ks = smem, *vs = smem + MS_FA_TILE * MS_FA_LDT(HS);
    const int lane = cx.lane(), t = lane % 4;
    const ms_fa_qblock blk = ms_fa_qblock_of<HS>(cx, a, qb, h, bi);
    const int64_t *row = blk.row;
    const float *mt = blk.km ? fsmem : NULL; /* the tile's staged mask terms */
    const float sl2 = a.scale * MS_FA_LOG2E;

    uint32_t qf[HS / 16][4];
    MS_UNROLL
    for (int k = 0; k < HS / 16; k++)
        ms_cu_mma_load_a(qf[k], lane, blk.qh, a.q_ld, blk.q0, a.tq, k * 16);
    float o[DT][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int64_t j0 = 0; j0 < blk.kend; j0 += MS_FA_TILE) {
        ms_fa_stage_keys<HS>(cx, a, blk, j0, ks, vs, fsmem);
        float s[NT][4];
        ms_fa_scores<HS>(cx, s, qf, ks);
        /* Base-2 scores, -inf where a key is not seen; the tile's max per row. */
        float mx[2] = {-INFINITY, -INFINITY};
        const int last[2] = {ms_fa_last_seen(a, row[0], j0), ms_fa_last_seen(a, row[1], j0)};
        MS_UNROLL
        for (int nt = 0; nt < NT; nt++) {
            MS_UNROLL
            for (int e = 0; e < 4; e++) {
                const float x =
                    ms_fa_score2(s[nt][e], sl2, mt, nt * 8 + 2 * t + e % 2, last[e / 2]);
                s[nt][e] = x;
                mx[e / 2] = ms_cu_maxf(mx[e / 2], x);
            }
        }
        MS_UNROLL
        for (int r = 0; r < 2; r++) {
            const float mnew = ms_cu_maxf(m[r], ms_fa_row_max(cx, mx[r]));
            /* No key seen yet: p = 0 everywhere and the state stays as it was. */
            const float alpha = mnew == -INFINITY ? 1.0f : exp2f(m[r] - mnew);
            float sum = 0.0f;
            MS_UNROLL
            for (int nt = 0; nt < NT; nt++) {
                MS_UNROLL
                for (int e = 2 * r; e < 2 * r + 2; e++) {
                    const float x = s[nt][e];
                    const float p =
                        x == -INFINITY ? 0.0f : ms_cu_bf16_widen(ms_cu_bf16_round(exp2f(x - mnew)));
                    s[nt][e] = p;
                    sum += p;
                }
            }
            l[r] = l[r] * alpha + sum;
            MS_UNROLL
            for (int dt = 0; dt < DT; dt++) o[dt][2 * r] *= alpha, o[dt][2 * r + 1] *= alpha;
            m[r] = mnew;
        }
        ms_fa_times_tile<HS>(cx, o, s, vs);
        cx.sync(); /* the tiles are overwritten next */
    }

    MS_UNROLL

    for (int r = 0; r < 2; r++) {
        const float sum = ms_fa_row_sum(cx, l[r]);
        if (row[r] >= a.tq) continue;
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        uint16_t *out = a.out + (bi * a.tq + row[r]) * a.out_ld + h * HS;
        float *of = a.o_f32 ? a.o_f32 + ((bi * a.tq + row[r]) * a.h + h) * HS : NULL;
        MS_UNROLL
        for (int dt = 0; dt < DT; dt++) {
            const int d = dt * 8 + 2 * t;
            const float v0 = o[dt][2 * r] * inv, v1 = o[dt][2 * r + 1] * inv;
            out[d] = ms_cu_bf16_round(v0);
            out[d + 1] = ms_cu_bf16_round(v1);
            if (of) of[d] = v0, of[d + 1] = v1;
        }
        if (t == 0)
            a.lse[(bi * a.h + h) * a.tq + row[r]] =
                sum > 0.0f ? m[r] * MS_FA_LN2 + logf(sum) : -INFINITY;
    }
}

/* dst[d] += scale * acc (or, fresh, dst[d] = scale * acc), rounded once: one row's 2 x HS / 8
 * values of a C fragment row. */
template <int HS>
MS_HD void ms_fa_add_row(uint16_t *dst, const float acc[HS / 8][4], int r, int t, float scale,
                         bool fresh) {
    MS_UNROLL
    for (int dt = 0; dt < HS / 8; dt++) {
        MS_UNROLL
        for (int e = 0; e < 2; e++) {
            const int d = dt * 8 + 2 * t + e;
            dst[d] = ms_cu_bf16_round((fresh ? 0.0f : ms_cu_bf16_widen(dst[d])) +
                                      scale * acc[dt][2 * r + e]);
        }
    }
}

/* The probability of a base-2 score x under a row's base-2 logsumexp (0 where not seen). */
MS_HD float ms_fa_prob(float x, float lse2) {
    return x == -INFINITY || lse2 == -INFINITY ? 0.0f : exp2f(x - lse2);
}

/* ---- backward, dQ: a block of MS_FA_ROWS query rows, over the key tiles they see ---- */
template <int HS, class Cx>
MS_HD void ms_fa_dq_block(Cx &cx, const ms_fa_args &a, int64_t qb, int64_t h, int64_t bi,
                          uint16_t *smem, float *fsmem) {
    constexpr int NT = MS_FA_TILE / 8, DT = HS / 8;
    uint16_t *ks = smem, *vs = smem + MS_FA_TILE * MS_FA_LDT(HS);
    const int lane = cx.lane(), t = lane % 4;
    const ms_fa_qblock blk = ms_fa_qblock_of<HS>(cx, a, qb, h, bi);
    const int64_t *row = blk.row;
    const float *mt = blk.km ? fsmem : NULL; /* the tile's staged mask terms */
    const uint16_t *gh = a.dout + bi * a.tq * a.out_ld + h * HS;
    const float sl2 = a.scale * MS_FA_LOG2E;

    uint32_t qf[HS / 16][4], gf[HS / 16][4];
    MS_UNROLL
    for (int k = 0; k < HS / 16; k++) {
        ms_cu_mma_load_a(qf[k], lane, blk.qh, a.q_ld, blk.q0, a.tq, k * 16);
        ms_cu_mma_load_a(gf[k], lane, gh, a.out_ld, blk.q0, a.tq, k * 16);
    }
    float lse2[2], dl[2];
    MS_UNROLL
    for (int r = 0; r < 2; r++) {
        const int64_t i = (bi * a.h + h) * a.tq + row[r];
        lse2[r] = row[r] < a.tq ? a.lse[i] * MS_FA_LOG2E : -INFINITY;
        dl[r] = row[r] < a.tq ? a.delta[i] : 0.0f;
    }
    float dq[DT][4] = {};

    for (int64_t j0 = 0; j0 < blk.kend; j0 += MS_FA_TILE) {
        ms_fa_stage_keys<HS>(cx, a, blk, j0, ks, vs, fsmem);
        float s[NT][4], dp[NT][4];
        ms_fa_scores<HS>(cx, s, qf, ks);  /* S = Q K^T */
        ms_fa_scores<HS>(cx, dp, gf, vs); /* dP = dO V^T */
        const int last[2] = {ms_fa_last_seen(a, row[0], j0), ms_fa_last_seen(a, row[1], j0)};
        MS_UNROLL
        for (int nt = 0; nt < NT; nt++) {
            MS_UNROLL
            for (int e = 0; e < 4; e++) {
                const float x =
                    ms_fa_score2(s[nt][e], sl2, mt, nt * 8 + 2 * t + e % 2, last[e / 2]);
                s[nt][e] = ms_fa_prob(x, lse2[e / 2]) * (dp[nt][e] - dl[e / 2]); /* dS */
            }
        }
        ms_fa_times_tile<HS>(cx, dq, s, ks); /* dQ += dS K */
        cx.sync();
    }
    MS_UNROLL
    for (int r = 0; r < 2; r++)
        if (row[r] < a.tq && a.dq)
            ms_fa_add_row<HS>(a.dq + (bi * a.tq + row[r]) * a.q_ld + h * HS, dq, r, t, a.scale,
                              a.fresh);
}

/* ---- backward, dK and dV: a block of MS_FA_ROWS key rows of kv head kvh, over the query
 * tiles of every query head that reads it ---- */
template <int HS, class Cx>
MS_HD void ms_fa_dkv_block(Cx &cx, const ms_fa_args &a, int64_t kb, int64_t kvh, int64_t bi,
                           uint16_t *smem, float *fsmem) {
    /* Query tiles of 32 for head sizes from 48: two fewer 16 x 32 fragment pairs in
     * registers, which this block's K, V, dK and dV fragments already crowd. */
    constexpr int QT = HS >= 48 ? 32 : MS_FA_TILE, NT = QT / 8, DT = HS / 8;
    uint16_t *qs = smem, *gs = smem + MS_FA_TILE * MS_FA_LDT(HS);
    float *lse2s = fsmem, *dls = fsmem + MS_FA_TILE;
    const int lane = cx.lane(), t = lane % 4;
    const int64_t k0 = kb * MS_FA_ROWS + cx.warp() * 16,
                  key[2] = {k0 + lane / 4, k0 + lane / 4 + 8};
    const uint16_t *kh = a.k + bi * a.tk * a.kv_ld + kvh * HS,
                   *vh = a.v + bi * a.tk * a.kv_ld + kvh * HS;
    const float sl2 = a.scale * MS_FA_LOG2E;

    uint32_t kf[HS / 16][4], vf[HS / 16][4];
    MS_UNROLL
    for (int k = 0; k < HS / 16; k++) {
        ms_cu_mma_load_a(kf[k], lane, kh, a.kv_ld, k0, a.tk, k * 16);
        ms_cu_mma_load_a(vf[k], lane, vh, a.kv_ld, k0, a.tk, k * 16);
    }
    float mk[2];
    MS_UNROLL
    for (int r = 0; r < 2; r++)
        mk[r] = a.mask && key[r] < a.tk
                    ? ms_cu_attn_mask_term(a.mask + bi * a.tk, key[r], a.keep_mask) * MS_FA_LOG2E
                    : 0.0f;
    float dk[DT][4] = {}, dv[DT][4] = {};

    /* Causal: queries before the block's first key see none of its keys. */
    const int64_t first = kb * MS_FA_ROWS - a.q_start;
    const int64_t i_start = a.causal && first > 0 ? first / QT * QT : 0;
    const int64_t group = a.h / a.hkv;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        const uint16_t *qh = a.q + bi * a.tq * a.q_ld + h * HS;
        const uint16_t *gh = a.dout + bi * a.tq * a.out_ld + h * HS;
        const int64_t rows = (bi * a.h + h) * a.tq;
        for (int64_t i0 = i_start; i0 < a.tq; i0 += QT) {
            ms_fa_stage<HS, QT>(cx, qs, qh, a.q_ld, i0, a.tq);
            ms_fa_stage<HS, QT>(cx, gs, gh, a.out_ld, i0, a.tq);
            for (int e = cx.tid(); e < QT; e += MS_FA_THREADS) {
                lse2s[e] = i0 + e < a.tq ? a.lse[rows + i0 + e] * MS_FA_LOG2E : -INFINITY;
                dls[e] = i0 + e < a.tq ? a.delta[rows + i0 + e] : 0.0f;
            }
            cx.sync();
            float p[NT][4], ds[NT][4];
            ms_fa_scores<HS, QT>(cx, p, kf, qs);  /* S^T = K Q^T */
            ms_fa_scores<HS, QT>(cx, ds, vf, gs); /* dP^T = V dO^T */
            const int seen_from[2] = {ms_fa_first_seeing(a, key[0], i0),
                                      ms_fa_first_seeing(a, key[1], i0)};
            MS_UNROLL
            for (int nt = 0; nt < NT; nt++) {
                MS_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int col = nt * 8 + 2 * t + e % 2;
                    const float x =
                        col >= seen_from[e / 2] ? p[nt][e] * sl2 + mk[e / 2] : -INFINITY;
                    p[nt][e] = ms_fa_prob(x, lse2s[col]);
                    ds[nt][e] = p[nt][e] * (ds[nt][e] - dls[col]);
                }
            }
            ms_fa_times_tile<HS, QT>(cx, dv, p, gs);  /* dV += P^T dO */
            ms_fa_times_tile<HS, QT>(cx, dk, ds, qs); /* dK += dS^T Q */
            cx.sync();
        }
    }
    MS_UNROLL
    for (int r = 0; r < 2; r++) {
        if (key[r] >= a.tk) continue;
        if (a.dk)
            ms_fa_add_row<HS>(a.dk + (bi * a.tk + key[r]) * a.kv_ld + kvh * HS, dk, r, t, a.scale,
                              a.fresh);
        if (a.dv)
            ms_fa_add_row<HS>(a.dv + (bi * a.tk + key[r]) * a.kv_ld + kvh * HS, dv, r, t, 1.0f,
                              a.fresh);
    }
}

#endif

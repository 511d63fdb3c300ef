/* attention.cu - tiled fused attention around attention_math.cuh, for GPT-2's packed qkv and
 * for grouped-query attention over layers.h's strided q, k, v (one set of kernels: the packed
 * layout is the strided one with row strides 3C and as many kv heads as query heads).
 *
 * A block owns ATTN_ROWS consecutive query rows (or key rows) of one (batch, head), one thread
 * per row; the block stages each tile of keys and values (or queries and output gradients) in
 * shared memory and every thread runs the row function over it. The forward writes out and
 * the per-row logsumexp; the backward is three kernels: delta_i = dO_i . O_i, dQ per query row,
 * dK and dV per key row of a kv head, over the query rows of every query head that reads it
 * (each output row has one owner: no atomics).
 *
 * T is the storage of q, k, v, out, dout and the gradients (float, or ms_bf16 for a bf16
 * program's unstaged buffers): tiles are widened as they are staged, every sum is fp32, each
 * output is rounded once when stored. The logsumexps and the saved output copy stay fp32, so
 * the bf16 kernels compute exactly what the fp32 ones do on widened operands.
 *
 * A bf16 call that fits the tensor cores (flash.cuh: head sizes 16 to 128, aligned rows) runs
 * flash.cu's kernels instead where its kernel context chose them (ms_cu_attention_flash), which
 * round the probabilities to bf16 for their products; these row kernels stay the fp32 path,
 * the fallback and the path a context can choose instead.
 */
#include "engine/kernels/cuda/attention_math.cuh"
#include "engine/kernels/cuda/flash.cuh"
#include "engine/kernels/cuda/launch.cuh"

#define ATTN_ROWS 64

/* One attention call: sizes, row strides (floats between consecutive rows of q, of k and v,
 * of out and dout), the global position of query row 0 and the mask's kind. */
struct attn_dims {
    int64_t tq, tk, h, hkv, hs;
    int64_t q_ld, kv_ld, out_ld;
    int64_t q_start;
    bool causal, keep_mask; /* keep_mask: 0 drops a key (layers.h); else additive */
    bool fresh;             /* backward: the gradients hold nothing yet: written, not added */
    float scale;
};

/* Rows [r0, r0 + n) of a head (ld apart) into a shared [n, HS] tile. Called by every thread
 * of the block. */
template <typename T>
__device__ static void stage_rows(float *dst, const T *src, int64_t ld, int64_t r0, int64_t n,
                                  int64_t hs) {
    for (int64_t e = threadIdx.x; e < n * hs; e += blockDim.x)
        dst[e] = ms_cu_load(src + (r0 + e / hs) * ld + e % hs);
}

/* The key loop of the query-row kernels: every key tile this block's rows may see, staged in
 * ks, vs and (with a mask) its additive terms in mt; tile(j0, vis) runs for this thread's
 * row i when it sees vis > 0 keys of it. km: the batch item's mask or NULL. */
template <typename T, typename F>
__device__ static void each_key_tile(const attn_dims &a, const T *k, const T *v, const float *km,
                                     int64_t i, float *ks, float *vs, float *mt, F tile) {
    const int64_t last = min((int64_t)(blockIdx.x + 1) * blockDim.x, a.tq) - 1;
    const int64_t kend = a.causal ? min(a.q_start + last + 1, a.tk) : a.tk;
    for (int64_t j0 = 0; j0 < kend; j0 += MS_CU_ATTN_TILE) {
        const int64_t nk = min((int64_t)MS_CU_ATTN_TILE, a.tk - j0);
        stage_rows(ks, k, a.kv_ld, j0, nk, a.hs);
        stage_rows(vs, v, a.kv_ld, j0, nk, a.hs);
        if (km)
            for (int64_t e = threadIdx.x; e < nk; e += blockDim.x)
                mt[e] = ms_cu_attn_mask_term(km, j0 + e, a.keep_mask);
        __syncthreads();
        const int64_t vis = i < a.tq ? ms_cu_attn_visible(a.q_start + i, j0, nk, a.causal) : 0;
        if (vis > 0) tile(j0, vis);
        __syncthreads();
    }
}

/* The kv head that query head h reads. */
__device__ static int64_t kv_head(const attn_dims &a, int64_t h) {
    return h / (a.h / a.hkv);
}

/* out and lse, and o_copy [B, Tq, H, HS] (the output again, contiguous and fp32 - unrounded
 * under bf16 - for the backward's delta) unless it is NULL. */
template <typename T>
__global__ static void attn_fwd_kernel(T *out, float *lse, float *o_copy, const T *q, const T *k,
                                       const T *v, const float *mask, attn_dims a) {
    __shared__ float ks[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS],
        vs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS], mt[MS_CU_ATTN_TILE];
    const int64_t bi = blockIdx.z, h = blockIdx.y, hs = a.hs;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t kvo = bi * a.tk * a.kv_ld + kv_head(a, h) * hs;
    const T *qb = q + bi * a.tq * a.q_ld + h * hs;
    const float *km = mask ? mask + bi * a.tk : NULL;
    float qi[MS_CU_ATTN_MAX_HS], acc[MS_CU_ATTN_MAX_HS];
    ms_cu_attn_state st;
    ms_cu_attn_fwd_init(&st, acc, hs);
    if (i < a.tq)
        for (int64_t d = 0; d < hs; d++) qi[d] = ms_cu_load(qb + i * a.q_ld + d);
    each_key_tile(a, k + kvo, v + kvo, km, i, ks, vs, mt, [&](int64_t j0, int64_t vis) {
        ms_cu_attn_fwd_tile(&st, acc, qi, ks, vs, hs, km ? mt : NULL, vis, hs, a.scale);
    });
    if (i >= a.tq) return;
    lse[(bi * a.h + h) * a.tq + i] =
        ms_cu_attn_fwd_finish(out + (bi * a.tq + i) * a.out_ld + h * hs, &st, acc, hs);
    if (o_copy) ms_cu_attn_fwd_finish(o_copy + ((bi * a.tq + i) * a.h + h) * hs, &st, acc, hs);
}

template <typename T>
__global__ static void attn_dq_kernel(T *dq, const T *dout, const T *q, const T *k, const T *v,
                                      const float *lse, const float *delta, const float *mask,
                                      attn_dims a) {
    __shared__ float ks[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS],
        vs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS], mt[MS_CU_ATTN_TILE];
    const int64_t bi = blockIdx.z, h = blockIdx.y, hs = a.hs;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t qo = bi * a.tq * a.q_ld + h * hs, row = (bi * a.h + h) * a.tq + i;
    const int64_t kvo = bi * a.tk * a.kv_ld + kv_head(a, h) * hs;
    const float *km = mask ? mask + bi * a.tk : NULL;
    const T *g = dout + bi * a.tq * a.out_ld + h * hs;
    float qi[MS_CU_ATTN_MAX_HS], gi[MS_CU_ATTN_MAX_HS], dqi[MS_CU_ATTN_MAX_HS];
    for (int64_t d = 0; d < hs; d++) {
        qi[d] = i < a.tq ? ms_cu_load(q + qo + i * a.q_ld + d) : 0.0f;
        gi[d] = i < a.tq ? ms_cu_load(g + i * a.out_ld + d) : 0.0f;
        dqi[d] = 0.0f;
    }
    const float dl = i < a.tq ? delta[row] : 0.0f, ls = i < a.tq ? lse[row] : 0.0f;
    each_key_tile(a, k + kvo, v + kvo, km, i, ks, vs, mt, [&](int64_t j0, int64_t vis) {
        ms_cu_attn_dq_tile(dqi, qi, gi, dl, ls, ks, vs, hs, km ? mt : NULL, vis, hs, a.scale);
    });
    if (i < a.tq)
        for (int64_t d = 0; d < hs; d++) {
            T *at = dq + qo + i * a.q_ld + d;
            ms_cu_grad_put(at, dqi[d], a.fresh);
        }
}

/* Key rows of kv head blockIdx.y: the query rows of each query head of its group in turn. */
template <typename T>
__global__ static void attn_dkv_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k,
                                       const T *v, const float *lse, const float *delta,
                                       const float *mask, attn_dims a) {
    __shared__ float qs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS],
        gs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS];
    __shared__ float ls[MS_CU_ATTN_TILE], ds[MS_CU_ATTN_TILE];
    const int64_t bi = blockIdx.z, kvh = blockIdx.y, hs = a.hs, group = a.h / a.hkv;
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x;
    const int64_t kvo = bi * a.tk * a.kv_ld + kvh * hs + j * a.kv_ld;
    float kj[MS_CU_ATTN_MAX_HS], vj[MS_CU_ATTN_MAX_HS], dkj[MS_CU_ATTN_MAX_HS],
        dvj[MS_CU_ATTN_MAX_HS];
    for (int64_t d = 0; d < hs; d++) {
        kj[d] = j < a.tk ? ms_cu_load(k + kvo + d) : 0.0f;
        vj[d] = j < a.tk ? ms_cu_load(v + kvo + d) : 0.0f;
        dkj[d] = dvj[d] = 0.0f;
    }
    const float maskj =
        mask && j < a.tk ? ms_cu_attn_mask_term(mask + bi * a.tk, j, a.keep_mask) : 0.0f;
    /* Causal: queries before the block's first key see none of its keys. */
    const int64_t skip = a.causal ? max(first - a.q_start, (int64_t)0) : 0;
    const int64_t i_start = skip / MS_CU_ATTN_TILE * MS_CU_ATTN_TILE;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        const T *qb = q + bi * a.tq * a.q_ld + h * hs;
        const T *gb = dout + bi * a.tq * a.out_ld + h * hs;
        const int64_t rows = (bi * a.h + h) * a.tq;
        for (int64_t i0 = i_start; i0 < a.tq; i0 += MS_CU_ATTN_TILE) {
            const int64_t nq = min((int64_t)MS_CU_ATTN_TILE, a.tq - i0);
            stage_rows(qs, qb, a.q_ld, i0, nq, hs);
            stage_rows(gs, gb, a.out_ld, i0, nq, hs);
            for (int64_t e = threadIdx.x; e < nq; e += blockDim.x) {
                ls[e] = lse[rows + i0 + e];
                ds[e] = delta[rows + i0 + e];
            }
            __syncthreads();
            if (j < a.tk)
                ms_cu_attn_dkv_tile(dkj, dvj, kj, vj, j, maskj, qs, hs, gs, hs, ls, ds,
                                    a.q_start + i0, nq, hs, a.scale, a.causal);
            __syncthreads();
        }
    }
    if (j >= a.tk) return;
    for (int64_t d = 0; d < hs; d++) {
        if (dk) ms_cu_grad_put(dk + kvo + d, dkj[d], a.fresh);
        if (dv) ms_cu_grad_put(dv + kvo + d, dvj[d], a.fresh);
    }
}

/* A bf16 call's arguments for the tensor-core kernels (flash.cu), when kc chose them and the
 * call fits them; fp32 calls always run the row kernels here, whose arithmetic is the CPU's. */
static bool flash_args(const ms_kctx *, ms_fa_args *, const attn_dims &, const float *,
                       const float *, const float *, const float *, const float *) {
    return false;
}
static bool flash_args(const ms_kctx *kc, ms_fa_args *f, const attn_dims &a, const ms_bf16 *q,
                       const ms_bf16 *k, const ms_bf16 *v, const ms_bf16 *dout, const float *mask) {
    if (!ms_cu_attention_flash(kc)) return false;
    *f = ms_fa_args{};
    f->q = &q->bits, f->k = &k->bits, f->v = &v->bits, f->dout = dout ? &dout->bits : NULL;
    f->mask = mask;
    f->tq = a.tq, f->tk = a.tk, f->h = a.h, f->hkv = a.hkv, f->hs = a.hs;
    f->q_ld = a.q_ld, f->kv_ld = a.kv_ld, f->out_ld = a.out_ld, f->q_start = a.q_start;
    f->causal = a.causal, f->keep_mask = a.keep_mask, f->fresh = a.fresh, f->scale = a.scale;
    return ms_cu_flash_fits(f);
}

static dim3 attn_grid(int64_t b, int64_t rows, int64_t heads) {
    return dim3((unsigned)((rows + ATTN_ROWS - 1) / ATTN_ROWS), (unsigned)heads, (unsigned)b);
}

/* The three backward kernels. o_copy: the output, contiguous [B, Tq, H, HS]; delta: scratch
 * [B, H, Tq]. */
template <typename T>
static ms_status attn_backward(const attn_dims &a, int64_t b, T *dq, T *dk, T *dv, float *delta,
                               const T *dout, const T *q, const T *k, const T *v,
                               const float *o_copy, const float *lse, const float *mask,
                               ms_kctx *kc, ms_error *err) {
    const int64_t tq = a.tq, nh = a.h, hs = a.hs, ld = a.out_ld;
    MS_CHECK(
        ms_cu_each(b * nh * tq, kc, "attention backward (delta)", err, [=] __device__(int64_t r) {
            const int64_t i = r % tq, bh = r / tq, h = bh % nh, bi = bh / nh;
            const float *o = o_copy + ((bi * tq + i) * nh + h) * hs;
            delta[r] = ms_cu_dot(dout + (bi * tq + i) * ld + h * hs, o, hs);
        }));
    ms_fa_args f;
    if (flash_args(kc, &f, a, q, k, v, dout, mask)) {
        f.dq = (uint16_t *)dq, f.dk = (uint16_t *)dk, f.dv = (uint16_t *)dv;
        f.lse = const_cast<float *>(lse), f.delta = delta;
        return ms_cu_flash_backward(kc, &f, b, err);
    }
    cudaStream_t s = (cudaStream_t)ms_cu_stream(kc);
    if (dq) {
        attn_dq_kernel<<<attn_grid(b, tq, nh), ATTN_ROWS, 0, s>>>(dq, dout, q, k, v, lse, delta,
                                                                  mask, a);
        MS_CHECK(ms_cu_launched("attention backward (dq)", err));
    }
    if ((!dk && !dv) || a.tk <= 0) return MS_OK;
    attn_dkv_kernel<<<attn_grid(b, a.tk, a.hkv), ATTN_ROWS, 0, s>>>(dk, dv, dout, q, k, v, lse,
                                                                    delta, mask, a);
    return ms_cu_launched("attention backward (dk, dv)", err);
}

/* ---- GPT-2's packed qkv ---- */

static ms_status packed_dims(attn_dims *a, int64_t t, int64_t c, int64_t nh, bool causal,
                             ms_error *err) {
    if (nh <= 0 || c % nh != 0 || c / nh > MS_CU_ATTN_MAX_HS)
        return ms_fail(err, MS_ERR_INVALID,
                       "cuda attention: C = %lld over %lld heads; need C divisible by the heads "
                       "and a head size of at most %d",
                       (long long)c, (long long)nh, MS_CU_ATTN_MAX_HS);
    *a = attn_dims{};
    a->tq = a->tk = t, a->h = a->hkv = nh, a->hs = c / nh;
    a->q_ld = a->kv_ld = 3 * c, a->out_ld = c, a->causal = causal;
    a->scale = 1.0f / sqrtf((float)a->hs);
    return MS_OK;
}

template <typename T>
static ms_status packed_forward(T *out, float *lse, float *o_copy, const T *qkv, const float *mask,
                                int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                                ms_kctx *kc, const char *what, ms_error *err) {
    attn_dims a;
    MS_CHECK(packed_dims(&a, t, c, nh, causal, err));
    if (b <= 0 || t <= 0) return MS_OK;
    ms_fa_args f;
    if (flash_args(kc, &f, a, qkv, qkv + c, qkv + 2 * c, (const T *)NULL, mask)) {
        f.out = (uint16_t *)out, f.lse = lse, f.o_f32 = o_copy;
        return ms_cu_flash_forward(kc, &f, b, err);
    }
    attn_fwd_kernel<<<attn_grid(b, t, nh), ATTN_ROWS, 0, (cudaStream_t)ms_cu_stream(kc)>>>(
        out, lse, o_copy, qkv, qkv + c, qkv + 2 * c, mask, a);
    return ms_cu_launched(what, err);
}

/* out [B, T, C] (or its fp32 copy) is the contiguous [B, T, NH, HS] the backward reads. */
template <typename T>
static ms_status packed_backward(T *dqkv, float *scratch, const T *dout, const T *qkv,
                                 const float *out, const float *lse, const float *mask, int64_t b,
                                 int64_t t, int64_t c, int64_t nh, bool causal, unsigned fresh,
                                 ms_kctx *kc, ms_error *err) {
    attn_dims a;
    MS_CHECK(packed_dims(&a, t, c, nh, causal, err));
    if (b <= 0 || t <= 0) return MS_OK;
    a.fresh = fresh & 1u; /* dqkv whole: dq, then dk and dv, every row written once */
    return attn_backward(a, b, dqkv, dqkv + c, dqkv + 2 * c, scratch, dout, qkv, qkv + c,
                         qkv + 2 * c, out, lse, mask, kc, err);
}

/* saved: the log-sum-exps [B, NH, T], then a copy of the output [B, T, C] (fp32; under bf16
 * the output before rounding), which the backward reads: the program may reuse the output's
 * own buffer meanwhile. */
int64_t ms_cu_attention_saved_floats(int64_t b, int64_t t, int64_t c, int64_t nh) {
    return b * nh * t + b * t * c;
}

int64_t ms_cu_attention_scratch_floats(int64_t b, int64_t t, int64_t nh) {
    return b * nh * t;
}

ms_status ms_cu_attention_forward(ms_kctx *kc, float *out, float *saved, const float *qkv,
                                  const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh,
                                  bool causal, ms_error *err) {
    MS_CHECK(packed_forward(out, saved, (float *)NULL, qkv, mask, b, t, c, nh, causal, kc,
                            "attention forward", err));
    return ms_cuda_status(cudaMemcpyAsync(saved + b * nh * t, out,
                                          sizeof(float) * (size_t)(b * t * c),
                                          cudaMemcpyDeviceToDevice, (cudaStream_t)ms_cu_stream(kc)),
                          "cudaMemcpyAsync (attention output)", err);
}

ms_status ms_cu_attention_backward(ms_kctx *kc, float *dqkv, float *scratch, const float *dout,
                                   const float *qkv, const float *saved, const float *mask,
                                   int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                                   unsigned fresh, ms_error *err) {
    return packed_backward(dqkv, scratch, dout, qkv, saved + b * nh * t, saved, mask, b, t, c, nh,
                           causal, fresh, kc, err);
}

/* bf16: the output before rounding goes straight into the saved copy (no memcpy). */
ms_status ms_cu_attention_forward_bf16(ms_kctx *kc, uint16_t *out, float *saved,
                                       const uint16_t *qkv, const float *mask, int64_t b, int64_t t,
                                       int64_t c, int64_t nh, bool causal, ms_error *err) {
    return packed_forward(ms_cu_bf(out), saved, saved + b * nh * t, ms_cu_bf(qkv), mask, b, t, c,
                          nh, causal, kc, "attention forward (bf16)", err);
}

ms_status ms_cu_attention_backward_bf16(ms_kctx *kc, uint16_t *dqkv, float *scratch,
                                        const uint16_t *dout, const uint16_t *qkv,
                                        const float *saved, const float *mask, int64_t b, int64_t t,
                                        int64_t c, int64_t nh, bool causal, unsigned fresh,
                                        ms_error *err) {
    return packed_backward(ms_cu_bf(dqkv), scratch, ms_cu_bf(dout), ms_cu_bf(qkv),
                           saved + b * nh * t, saved, mask, b, t, c, nh, causal, fresh, kc, err);
}

/* ---- grouped-query attention over strided heads (layers.h) ---- */

static ms_status gqa_dims(attn_dims *a, const ms_k_gqa *g, ms_error *err) {
    if (g->hkv <= 0 || g->h % g->hkv != 0 || g->d <= 0 || g->d > MS_CU_ATTN_MAX_HS)
        return ms_fail(err, MS_ERR_INVALID,
                       "cuda gqa attention: %lld query heads over %lld kv heads of size %lld; "
                       "need the query heads a multiple of the kv heads and a head size of at "
                       "most %d",
                       (long long)g->h, (long long)g->hkv, (long long)g->d, MS_CU_ATTN_MAX_HS);
    *a = attn_dims{};
    a->tq = g->tq, a->tk = g->tk, a->h = g->h, a->hkv = g->hkv, a->hs = g->d;
    a->q_ld = g->q_stride, a->kv_ld = g->kv_stride, a->out_ld = g->out_stride;
    a->q_start = g->q_start, a->causal = g->causal, a->keep_mask = true;
    a->scale = 1.0f / sqrtf((float)g->d);
    return MS_OK;
}

int64_t ms_cu_gqa_saved_floats(const ms_k_gqa *g) {
    return g->b * g->h * g->tq + g->b * g->tq * g->h * g->d;
}

int64_t ms_cu_gqa_scratch_floats(const ms_k_gqa *g) {
    return g->b * g->h * g->tq;
}

ms_status ms_cu_gqa_forward(ms_kctx *kc, const ms_k_gqa *g, float *out, float *saved,
                            const float *q, const float *k, const float *v, const float *mask,
                            ms_error *err) {
    attn_dims a;
    MS_CHECK(gqa_dims(&a, g, err));
    if (g->b <= 0 || g->tq <= 0 || g->h <= 0) return MS_OK;
    attn_fwd_kernel<<<attn_grid(g->b, g->tq, g->h), ATTN_ROWS, 0, (cudaStream_t)ms_cu_stream(kc)>>>(
        out, saved, saved + g->b * g->h * g->tq, q, k, v, mask, a);
    return ms_cu_launched("gqa attention forward", err);
}

ms_status ms_cu_gqa_backward(ms_kctx *kc, const ms_k_gqa *g, float *dq, float *dk, float *dv,
                             float *scratch, const float *dout, const float *q, const float *k,
                             const float *v, const float *saved, const float *mask, ms_error *err) {
    attn_dims a;
    MS_CHECK(gqa_dims(&a, g, err));
    if (g->b <= 0 || g->tq <= 0 || g->h <= 0) return MS_OK;
    return attn_backward(a, g->b, dq, dk, dv, scratch, dout, q, k, v, saved + g->b * g->h * g->tq,
                         saved, mask, kc, err);
}

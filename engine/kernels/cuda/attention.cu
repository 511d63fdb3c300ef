/* attention.cu - tiled fused attention around attention_math.cuh. A block owns
 * ATTN_ROWS consecutive query rows (or key rows) of one (batch, head), one thread per row; the
 * block stages each tile of keys and values (or queries and output gradients) in shared
 * memory and every thread runs the row function over it. The forward writes out and the
 * per-row logsumexp; the backward is three kernels: delta_i = dO_i . O_i, dQ per query row,
 * dK and dV per key row (each output row has one owner: no atomics).
 */
#include "engine/kernels/cuda/attention_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

#define ATTN_ROWS 64

struct attn_dims {
    int64_t t, c, nh, hs;
    bool causal;
    float scale;
};

/* Rows [r0, r0 + n) of one part (column offset col) of qkv, head columns only, into a shared
 * [n, HS] tile. Called by every thread of the block. */
__device__ static void stage_rows(float *dst, const float *src, int64_t ld, int64_t r0, int64_t n,
                                  int64_t hs) {
    for (int64_t e = threadIdx.x; e < n * hs; e += blockDim.x)
        dst[e] = src[(r0 + e / hs) * ld + e % hs];
}

/* The key loop of the query-row kernels: every key tile this block's rows may see, staged in
 * ks and vs; tile(j0, vis) runs for this thread's row i when it sees vis > 0 keys of it. */
template <typename F>
__device__ static void each_key_tile(const attn_dims &a, const float *k, const float *v, int64_t i,
                                     float *ks, float *vs, F tile) {
    const int64_t last = min((int64_t)(blockIdx.x + 1) * blockDim.x, a.t) - 1;
    const int64_t kend = a.causal ? last + 1 : a.t;
    for (int64_t j0 = 0; j0 < kend; j0 += MS_CU_ATTN_TILE) {
        const int64_t nk = min((int64_t)MS_CU_ATTN_TILE, a.t - j0);
        stage_rows(ks, k, 3 * a.c, j0, nk, a.hs);
        stage_rows(vs, v, 3 * a.c, j0, nk, a.hs);
        __syncthreads();
        const int64_t vis = i < a.t ? ms_cu_attn_visible(i, j0, nk, a.causal) : 0;
        if (vis > 0) tile(j0, vis);
        __syncthreads();
    }
}

__global__ static void attn_fwd_kernel(float *out, float *lse, const float *qkv, const float *mask,
                                       attn_dims a) {
    __shared__ float ks[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS],
        vs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS];
    const int64_t bi = blockIdx.z, h = blockIdx.y, c3 = 3 * a.c, hs = a.hs;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float *q = qkv + bi * a.t * c3 + h * hs, *k = q + a.c, *v = q + 2 * a.c;
    const float *km = mask ? mask + bi * a.t : NULL;
    float qi[MS_CU_ATTN_MAX_HS], acc[MS_CU_ATTN_MAX_HS];
    ms_cu_attn_state st;
    ms_cu_attn_fwd_init(&st, acc, hs);
    if (i < a.t)
        for (int64_t d = 0; d < hs; d++) qi[d] = q[i * c3 + d];
    each_key_tile(a, k, v, i, ks, vs, [&](int64_t j0, int64_t vis) {
        ms_cu_attn_fwd_tile(&st, acc, qi, ks, vs, hs, km ? km + j0 : NULL, vis, hs, a.scale);
    });
    if (i < a.t)
        lse[(bi * a.nh + h) * a.t + i] =
            ms_cu_attn_fwd_finish(out + (bi * a.t + i) * a.c + h * hs, &st, acc, hs);
}

__global__ static void attn_dq_kernel(float *dqkv, const float *dout, const float *qkv,
                                      const float *lse, const float *delta, const float *mask,
                                      attn_dims a) {
    __shared__ float ks[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS],
        vs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS];
    const int64_t bi = blockIdx.z, h = blockIdx.y, c3 = 3 * a.c, hs = a.hs;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t off = bi * a.t * c3 + h * hs, row = (bi * a.nh + h) * a.t + i;
    const float *q = qkv + off, *k = q + a.c, *v = q + 2 * a.c;
    const float *km = mask ? mask + bi * a.t : NULL;
    float qi[MS_CU_ATTN_MAX_HS], gi[MS_CU_ATTN_MAX_HS], dq[MS_CU_ATTN_MAX_HS];
    for (int64_t d = 0; d < hs; d++) {
        qi[d] = i < a.t ? q[i * c3 + d] : 0.0f;
        gi[d] = i < a.t ? dout[(bi * a.t + i) * a.c + h * hs + d] : 0.0f;
        dq[d] = 0.0f;
    }
    each_key_tile(a, k, v, i, ks, vs, [&](int64_t j0, int64_t vis) {
        ms_cu_attn_dq_tile(dq, qi, gi, delta[row], lse[row], ks, vs, hs, km ? km + j0 : NULL, vis,
                           hs, a.scale);
    });
    if (i < a.t)
        for (int64_t d = 0; d < hs; d++) dqkv[off + i * c3 + d] += dq[d];
}

__global__ static void attn_dkv_kernel(float *dqkv, const float *dout, const float *qkv,
                                       const float *lse, const float *delta, const float *mask,
                                       attn_dims a) {
    __shared__ float qs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS],
        gs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS];
    __shared__ float ls[MS_CU_ATTN_TILE], ds[MS_CU_ATTN_TILE];
    const int64_t bi = blockIdx.z, h = blockIdx.y, c3 = 3 * a.c, hs = a.hs;
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x;
    const int64_t off = bi * a.t * c3 + h * hs, rows = (bi * a.nh + h) * a.t;
    const float *q = qkv + off, *k = q + a.c, *v = q + 2 * a.c;
    const float *g = dout + bi * a.t * a.c + h * hs;
    float kj[MS_CU_ATTN_MAX_HS], vj[MS_CU_ATTN_MAX_HS], dk[MS_CU_ATTN_MAX_HS],
        dv[MS_CU_ATTN_MAX_HS];
    for (int64_t d = 0; d < hs; d++) {
        kj[d] = j < a.t ? k[j * c3 + d] : 0.0f;
        vj[d] = j < a.t ? v[j * c3 + d] : 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    const float maskj = mask && j < a.t ? mask[bi * a.t + j] : 0.0f;
    /* Causal: queries before the block's first key see none of its keys. */
    const int64_t i_start = a.causal ? first / MS_CU_ATTN_TILE * MS_CU_ATTN_TILE : 0;
    for (int64_t i0 = i_start; i0 < a.t; i0 += MS_CU_ATTN_TILE) {
        const int64_t nq = min((int64_t)MS_CU_ATTN_TILE, a.t - i0);
        stage_rows(qs, q, c3, i0, nq, hs);
        stage_rows(gs, g, a.c, i0, nq, hs);
        for (int64_t e = threadIdx.x; e < nq; e += blockDim.x) {
            ls[e] = lse[rows + i0 + e];
            ds[e] = delta[rows + i0 + e];
        }
        __syncthreads();
        if (j < a.t)
            ms_cu_attn_dkv_tile(dk, dv, kj, vj, j, maskj, qs, hs, gs, hs, ls, ds, i0, nq, hs,
                                a.scale, a.causal);
        __syncthreads();
    }
    if (j < a.t)
        for (int64_t d = 0; d < hs; d++) {
            dqkv[off + j * c3 + a.c + d] += dk[d];
            dqkv[off + j * c3 + 2 * a.c + d] += dv[d];
        }
}

static ms_status attn_dims_of(attn_dims *a, int64_t t, int64_t c, int64_t nh, bool causal,
                              ms_error *err) {
    if (nh <= 0 || c % nh != 0 || c / nh > MS_CU_ATTN_MAX_HS)
        return ms_fail(err, MS_ERR_INVALID,
                       "cuda attention: C = %lld over %lld heads; need C divisible by the heads "
                       "and a head size of at most %d",
                       (long long)c, (long long)nh, MS_CU_ATTN_MAX_HS);
    a->t = t, a->c = c, a->nh = nh, a->hs = c / nh, a->causal = causal;
    a->scale = 1.0f / sqrtf((float)a->hs);
    return MS_OK;
}

static dim3 attn_grid(int64_t b, int64_t t, int64_t nh) {
    return dim3((unsigned)((t + ATTN_ROWS - 1) / ATTN_ROWS), (unsigned)nh, (unsigned)b);
}

ms_status ms_cu_attention_forward(float *out, float *lse, const float *qkv, const float *mask,
                                  int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                                  void *stream, ms_error *err) {
    attn_dims a;
    MS_CHECK(attn_dims_of(&a, t, c, nh, causal, err));
    if (b <= 0 || t <= 0) return MS_OK;
    attn_fwd_kernel<<<attn_grid(b, t, nh), ATTN_ROWS, 0, (cudaStream_t)stream>>>(out, lse, qkv,
                                                                                 mask, a);
    return ms_cu_launched("attention forward", err);
}

int64_t ms_cu_attention_scratch_floats(int64_t b, int64_t t, int64_t nh) {
    return b * nh * t;
}

ms_status ms_cu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                   const float *out, const float *lse, const float *mask, int64_t b,
                                   int64_t t, int64_t c, int64_t nh, bool causal, void *stream,
                                   ms_error *err) {
    attn_dims a;
    MS_CHECK(attn_dims_of(&a, t, c, nh, causal, err));
    if (b <= 0 || t <= 0) return MS_OK;
    float *delta = scratch; /* [B, NH, T] */
    const int64_t hs = a.hs;
    MS_CHECK(ms_cu_each(b * nh * t, stream, "attention backward (delta)", err,
                        [=] __device__(int64_t r) {
                            const int64_t i = r % t, bh = r / t, h = bh % nh, bi = bh / nh;
                            const float *o = out + (bi * t + i) * c + h * hs;
                            delta[r] = ms_cu_dot(dout + (bi * t + i) * c + h * hs, o, hs);
                        }));
    attn_dq_kernel<<<attn_grid(b, t, nh), ATTN_ROWS, 0, (cudaStream_t)stream>>>(
        dqkv, dout, qkv, lse, delta, mask, a);
    MS_CHECK(ms_cu_launched("attention backward (dq)", err));
    attn_dkv_kernel<<<attn_grid(b, t, nh), ATTN_ROWS, 0, (cudaStream_t)stream>>>(
        dqkv, dout, qkv, lse, delta, mask, a);
    return ms_cu_launched("attention backward (dk, dv)", err);
}

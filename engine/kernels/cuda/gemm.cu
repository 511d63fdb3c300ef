/* gemm.cu - the matmul slots of the kernel table: ms_k_gemm's batched products through
 * cublasGemmStridedBatchedEx with fp32 accumulation, on the kernel context's cuBLAS handle
 * (ms_cu_blas: made on the first product, bound to the device's compute stream).
 *
 * cuBLAS is column-major; a row-major [r, c] matrix is the column-major [c, r] one, so the
 * row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: the
 * operands swap places and keep their transpose flags. A broadcast operand has batch stride 0.
 * The backward mirrors engine/kernels/matmul.c: each gradient is one product with the right
 * flags, a broadcast operand's gradient summed over the batch item by item (beta = 1 after
 * the first). bf16 operands go straight to the tensor cores; a bf16 broadcast gradient is
 * rounded after each item (cuBLAS accumulates into the bf16 output), where staging rounds once.
 */
#include <cublas_v2.h>

#include "engine/kernels/cuda/launch.cuh"

static ms_status blas_failed(const char *what, cublasStatus_t s, ms_error *err) {
    return ms_fail(err, MS_ERR_INTERNAL, "%s: cuBLAS failed: %s", what, cublasGetStatusString(s));
}

static cudaDataType_t cu_type(ms_cu_dtype t) {
    return t == MS_CU_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static size_t type_size(ms_cu_dtype t) {
    return t == MS_CU_BF16 ? 2 : 4;
}

/* One row-major operand: its pointer, element type and batch stride (0: shared). */
struct operand {
    const void *p;
    ms_cu_dtype type;
    int64_t stride;
};

/* C[i] (row-major [m, n], batch stride m n) = alpha op(A[i]) op(B[i]) + beta C[i], leading
 * dims implied by the storage shapes as in matmul.c. */
static ms_status gemm(ms_kctx *kc, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      operand a, operand b, float beta, void *c, ms_cu_dtype ct, int64_t batch,
                      ms_error *err) {
    if (m == 0 || n == 0 || batch == 0) return MS_OK;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || batch > INT32_MAX)
        return ms_fail(err, MS_ERR_INVALID,
                       "cuda matmul: %lld x %lld x %lld (batch %lld) exceeds cuBLAS's int sizes",
                       (long long)m, (long long)n, (long long)k, (long long)batch);
    void *blas;
    MS_CHECK(ms_cu_blas(kc, &blas, err));
    const int64_t lda = ta ? m : k, ldb = tb ? k : n;
    const cublasStatus_t s = cublasGemmStridedBatchedEx(
        (cublasHandle_t)blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
        (int)n, (int)m, (int)k, &alpha, b.p, cu_type(b.type), (int)(ldb > 0 ? ldb : 1), b.stride,
        a.p, cu_type(a.type), (int)(lda > 0 ? lda : 1), a.stride, &beta, c, cu_type(ct), (int)n,
        m * n, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? MS_OK : blas_failed("cuda matmul", s, err);
}

static const void *at(const void *p, ms_cu_dtype t, int64_t elems) {
    return (const char *)p + (size_t)elems * type_size(t);
}

ms_status ms_cu_gemm_forward(ms_kctx *kc, const ms_k_gemm *g, void *c, ms_cu_dtype c_type,
                             const void *a, const void *b, ms_cu_dtype ab_type, float alpha,
                             float beta, ms_error *err) {
    const operand oa = {a, ab_type, g->bcast_a ? 0 : g->m * g->k};
    const operand ob = {b, ab_type, g->bcast_b ? 0 : g->k * g->n};
    return gemm(kc, g->trans_a, g->trans_b, g->m, g->n, g->k, alpha, oa, ob, beta, c, c_type,
                g->batch, err);
}

/* The gradient of A (matmul.c's grad_a): da = alpha dc op(B)^T, or its transpose when A is
 * stored transposed. dc and b are operands; da has batch stride m k. */
static ms_status grad_a(ms_kctx *kc, const ms_k_gemm *g, float alpha, void *da, ms_cu_dtype dt,
                        operand dc, operand b, float beta, int64_t batch, ms_error *err) {
    if (!g->trans_a)
        return gemm(kc, false, !g->trans_b, g->m, g->k, g->n, alpha, dc, b, beta, da, dt, batch,
                    err);
    return gemm(kc, g->trans_b, true, g->k, g->m, g->n, alpha, b, dc, beta, da, dt, batch, err);
}

static ms_status grad_b(ms_kctx *kc, const ms_k_gemm *g, float alpha, void *db, ms_cu_dtype dt,
                        operand dc, operand a, float beta, int64_t batch, ms_error *err) {
    if (!g->trans_b)
        return gemm(kc, !g->trans_a, false, g->k, g->n, g->m, alpha, a, dc, beta, db, dt, batch,
                    err);
    return gemm(kc, true, g->trans_a, g->n, g->k, g->m, alpha, dc, a, beta, db, dt, batch, err);
}

/* One gradient: strided over the batch when its operand is per-item, else item by item into
 * the one shared buffer. */
static ms_status grad_of(ms_kctx *kc, const ms_k_gemm *g, bool of_a, void *d, ms_cu_dtype dt,
                         const void *dc, const void *other, ms_cu_dtype it, float alpha,
                         float beta0, ms_error *err) {
    const bool shared = of_a ? g->bcast_a : g->bcast_b,
               other_shared = of_a ? g->bcast_b : g->bcast_a;
    const int64_t sc = g->m * g->n, so = of_a ? g->k * g->n : g->m * g->k;
    if (!shared) {
        const operand odc = {dc, it, sc}, oo = {other, it, other_shared ? 0 : so};
        return of_a ? grad_a(kc, g, alpha, d, dt, odc, oo, beta0, g->batch, err)
                    : grad_b(kc, g, alpha, d, dt, odc, oo, beta0, g->batch, err);
    }
    for (int64_t i = 0; i < g->batch; i++) {
        const operand odc = {at(dc, it, i * sc), it, 0};
        const operand oo = {at(other, it, other_shared ? 0 : i * so), it, 0};
        const float beta = i > 0 ? 1.0f : beta0;
        MS_CHECK(of_a ? grad_a(kc, g, alpha, d, dt, odc, oo, beta, 1, err)
                      : grad_b(kc, g, alpha, d, dt, odc, oo, beta, 1, err));
    }
    if (g->batch == 0 && beta0 == 0.0f) { /* the promised zeroed shared gradient */
        const size_t bytes = (size_t)(of_a ? g->m * g->k : g->k * g->n) * type_size(dt);
        MS_CUDA_CHECK(cudaMemsetAsync(d, 0, bytes, (cudaStream_t)ms_cu_stream(kc)), err);
    }
    return MS_OK;
}

ms_status ms_cu_gemm_backward(ms_kctx *kc, const ms_k_gemm *g, void *da, void *db,
                              ms_cu_dtype grad_type, const void *dc, const void *a, const void *b,
                              ms_cu_dtype in_type, float alpha, bool accumulate, ms_error *err) {
    const float beta0 = accumulate ? 1.0f : 0.0f;
    if (da) MS_CHECK(grad_of(kc, g, true, da, grad_type, dc, b, in_type, alpha, beta0, err));
    if (db) MS_CHECK(grad_of(kc, g, false, db, grad_type, dc, a, in_type, alpha, beta0, err));
    return MS_OK;
}

/* ---- the table's slots: every operand fp32, or every operand bf16 ---- */

ms_status ms_cu_matmul_forward(ms_kctx *kc, const ms_k_gemm *g, float *c, const float *a,
                               const float *b, float alpha, float beta, ms_error *err) {
    return ms_cu_gemm_forward(kc, g, c, MS_CU_F32, a, b, MS_CU_F32, alpha, beta, err);
}

ms_status ms_cu_matmul_backward(ms_kctx *kc, const ms_k_gemm *g, float *da, float *db,
                                const float *dc, const float *a, const float *b, float alpha,
                                bool accumulate, ms_error *err) {
    return ms_cu_gemm_backward(kc, g, da, db, MS_CU_F32, dc, a, b, MS_CU_F32, alpha, accumulate,
                               err);
}

ms_status ms_cu_matmul_forward_bf16(ms_kctx *kc, const ms_k_gemm *g, uint16_t *c, const uint16_t *a,
                                    const uint16_t *b, float alpha, float beta, ms_error *err) {
    return ms_cu_gemm_forward(kc, g, c, MS_CU_BF16, a, b, MS_CU_BF16, alpha, beta, err);
}

ms_status ms_cu_matmul_backward_bf16(ms_kctx *kc, const ms_k_gemm *g, uint16_t *da, uint16_t *db,
                                     const uint16_t *dc, const uint16_t *a, const uint16_t *b,
                                     float alpha, bool accumulate, ms_error *err) {
    return ms_cu_gemm_backward(kc, g, da, db, MS_CU_BF16, dc, a, b, MS_CU_BF16, alpha, accumulate,
                               err);
}

/* launch.cuh - the launch shapes every .cu file here uses (device code only): one thread per
 * element (grid-stride), one block of MS_CU_ROW_LANES threads per row, the block's lane tree,
 * one thread per (chunk, column) of a column reduction, and the conversion of a launch error
 * into an ms_status.
 */
#ifndef MS_CUDA_LAUNCH_CUH
#define MS_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include "engine/core/cuda_check.h"

#include "engine/kernels/cuda/colsum_math.cuh"
#include "engine/kernels/cuda/cuda_kernels.h"
#include "engine/kernels/cuda/math_common.cuh"

#define MS_CU_EACH_THREADS 256
#define MS_CU_MAX_BLOCKS   65535

template <typename F> __global__ void ms_cu_each_kernel(int64_t n, F f) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) f(i);
}

template <typename F> __global__ void ms_cu_rows_kernel(int64_t n, F f) {
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) f(r, (int)threadIdx.x);
}

template <typename F> __global__ void ms_cu_chunks_kernel(int64_t n, int64_t c, F f) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        f(i / c, i % c);
}

/* The C header's uint16_t bf16 buffers as the math headers' storage type. */
static inline ms_bf16 *ms_cu_bf(uint16_t *p) {
    return reinterpret_cast<ms_bf16 *>(p);
}
static inline const ms_bf16 *ms_cu_bf(const uint16_t *p) {
    return reinterpret_cast<const ms_bf16 *>(p);
}

/* The error of the last launch (or of the stream), named after the kernel. */
static inline ms_status ms_cu_launched(const char *what, ms_error *err) {
    return ms_cuda_status(cudaGetLastError(), what, err);
}

static inline unsigned ms_cu_blocks(int64_t n, int64_t per_block) {
    const int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < MS_CU_MAX_BLOCKS ? b : MS_CU_MAX_BLOCKS);
}

/* f(i) for i in [0, n), one thread per element. */
template <typename F>
static ms_status ms_cu_each(int64_t n, const ms_kctx *kc, const char *what, ms_error *err, F f) {
    if (n <= 0) return MS_OK;
    ms_cu_each_kernel<<<ms_cu_blocks(n, MS_CU_EACH_THREADS), MS_CU_EACH_THREADS, 0,
                        (cudaStream_t)ms_cu_stream(kc)>>>(n, f);
    return ms_cu_launched(what, err);
}

/* f(row, lane) for every row of n, a block of MS_CU_ROW_LANES lanes per row. */
template <typename F>
static ms_status ms_cu_rows(int64_t n, const ms_kctx *kc, const char *what, ms_error *err, F f) {
    if (n <= 0) return MS_OK;
    ms_cu_rows_kernel<<<ms_cu_blocks(n, 1), MS_CU_ROW_LANES, 0, (cudaStream_t)ms_cu_stream(kc)>>>(
        n, f);
    return ms_cu_launched(what, err);
}

/* f(chunk, j) for every row chunk of n rows (colsum_math.cuh) and column j of c, one thread
 * each; consecutive threads take consecutive columns of a chunk, so their loads coalesce. */
template <typename F>
static ms_status ms_cu_chunks(int64_t n, int64_t c, const ms_kctx *kc, const char *what,
                              ms_error *err, F f) {
    const int64_t total = ms_cu_colsum_chunks(n) * c;
    if (total <= 0) return MS_OK;
    ms_cu_chunks_kernel<<<ms_cu_blocks(total, MS_CU_EACH_THREADS), MS_CU_EACH_THREADS, 0,
                          (cudaStream_t)ms_cu_stream(kc)>>>(total, c, f);
    return ms_cu_launched(what, err);
}

/* A column reduction's partials: the caller's scratch of ms_cu_colsum_scratch_floats floats. */
static inline ms_status ms_cu_colsum_scratch(const float *scratch, const char *what,
                                             ms_error *err) {
    if (scratch) return MS_OK;
    return ms_fail(err, MS_ERR_INVALID, "%s: no column-sum scratch", what);
}

/* The lane tree of math_common.cuh (ms_cu_lanes_sum) across the block, in shared memory;
 * every lane gets the result. Called by all lanes of a MS_CU_ROW_LANES block. */
template <typename R> __device__ R ms_cu_block_sum(R v) {
    __shared__ R sh[MS_CU_ROW_LANES];
    const int l = threadIdx.x;
    sh[l] = v;
    __syncthreads();
    for (int s = MS_CU_ROW_LANES / 2; s > 0; s /= 2) {
        if (l < s) sh[l] += sh[l + s];
        __syncthreads();
    }
    const R r = sh[0];
    __syncthreads(); /* sh is reused by the next reduction */
    return r;
}

__device__ inline float ms_cu_block_max(float v) {
    __shared__ float sh[MS_CU_ROW_LANES];
    const int l = threadIdx.x;
    sh[l] = v;
    __syncthreads();
    for (int s = MS_CU_ROW_LANES / 2; s > 0; s /= 2) {
        if (l < s) sh[l] = ms_cu_maxf(sh[l], sh[l + s]);
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}

#endif

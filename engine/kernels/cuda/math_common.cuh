/* math_common.cuh - what every CUDA kernel's arithmetic shares: the __host__ __device__
 * qualifier, bf16 load/store and the fixed-order lane reductions.
 *
 * The rule of this folder: a kernel's arithmetic lives in a __host__ __device__ function over
 * one element or one row (or one row chunk of a column: colsum_math.cuh) in the *_math.cuh
 * headers, and the __global__ kernels in the .cu files only pick the index and call it.
 * tests/test_cuda_host.cu runs the same functions on the CPU over whole tensors and compares them
 * with engine/kernels, so only launch configurations are left for a GPU to check.
 *
 * Rows are split over `nlanes` lanes (the threads of a block): lane l handles the elements
 * l, l + nlanes, ... and the lane partials are combined by a pairwise tree in a fixed order
 * (ms_cu_lanes_sum). The host test runs the same lanes and the same tree, so a kernel's
 * result is reproduced on the CPU operation for operation (up to FMA contraction and the
 * device's expf/tanhf, which differ from glibc's by an ulp or two).
 *
 * Storage types are float or ms_bf16; ms_cu_load / ms_cu_store convert, so every row function
 * is a template over its storage and computes in fp32 (bf16 in, fp32 math, bf16 out).
 */
#ifndef MS_CUDA_MATH_COMMON_CUH
#define MS_CUDA_MATH_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef __CUDACC__
#error "the CUDA math headers are compiled by nvcc (host or device code)"
#endif

#define MS_HD __host__ __device__ inline

/* Threads per block of the row kernels, and so the lanes of a row (a power of two). */
#define MS_CU_ROW_LANES 256

/* A bf16 value as its bit pattern: a distinct type so load/store overload on it. */
struct ms_bf16 {
    uint16_t bits;
};

MS_HD uint32_t ms_cu_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

MS_HD float ms_cu_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* fp32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN. Bit for bit the same as
 * engine/core/tensor.c's ms_bf16_from_f32 (the host test checks every case). */
MS_HD uint16_t ms_cu_bf16_round(float f) {
    uint32_t u = ms_cu_f32_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

MS_HD float ms_cu_bf16_widen(uint16_t h) {
    return ms_cu_bits_f32((uint32_t)h << 16);
}

MS_HD float ms_cu_load(const float *p) {
    return *p;
}
MS_HD float ms_cu_load(const ms_bf16 *p) {
    return ms_cu_bf16_widen(p->bits);
}
MS_HD void ms_cu_store(float *p, float v) {
    *p = v;
}
MS_HD void ms_cu_store(ms_bf16 *p, float v) {
    p->bits = ms_cu_bf16_round(v);
}

/* A backward's gradient element: *p += g, or, where the buffer holds nothing yet (fresh:
 * backend.h), *p = g without reading it. */
template <typename T> MS_HD void ms_cu_grad_put(T *p, float g, bool fresh) {
    ms_cu_store(p, fresh ? g : ms_cu_load(p) + g);
}

MS_HD float ms_cu_maxf(float a, float b) {
    return a > b ? a : b; /* NaN in b is dropped, as the CPU's max loops do */
}

/* The lane tree: v[0..n) (n a power of two) folded as v[l] += v[l + s] for s = n/2, n/4, ...,
 * 1; the result is v[0]. A block does the same in shared memory (kernels_common.cuh). */
template <typename R> MS_HD R ms_cu_lanes_sum(R *v, int n) {
    for (int s = n / 2; s > 0; s /= 2)
        for (int l = 0; l < s; l++) v[l] += v[l + s];
    return v[0];
}

MS_HD float ms_cu_lanes_max(float *v, int n) {
    for (int s = n / 2; s > 0; s /= 2)
        for (int l = 0; l < s; l++) v[l] = ms_cu_maxf(v[l], v[l + s]);
    return v[0];
}

#endif

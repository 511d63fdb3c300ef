/* dropout_math.cuh - inverted dropout per element, the mask a pure function of the element's
 * global index: Philox4x32-10 keyed by (seed, stream, index) as engine/core/philox.c, the
 * index from the local box as engine/kernels/dropout.c (its batch window included), so a GPU
 * drops exactly the elements the CPU kernel drops. */
#ifndef MS_CUDA_DROPOUT_MATH_CUH
#define MS_CUDA_DROPOUT_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"

MS_HD void ms_cu_philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0, c[1] = lo1, c[2] = n2, c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* ms_philox_uniform: the top 24 bits of the first word, in [0, 1). */
MS_HD float ms_cu_philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t c[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                     (uint32_t)(stream >> 32)};
    ms_cu_philox(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (float)(c[0] >> 8) * (1.0f / 16777216.0f);
}

/* Where the local box sits in the global tensor, passed to the kernel by value. */
struct ms_cu_box {
    int ndim;
    int64_t lshape[8], gstart[8], gstride[8];
    int64_t win_rows, win_stride, win_offset; /* the batch window of dim 0 (rows 0: none) */
};

/* The global linear index of local element i (row-major over lshape). */
MS_HD uint64_t ms_cu_box_global(const ms_cu_box &b, int64_t i) {
    uint64_t g = 0;
    for (int d = b.ndim - 1; d >= 0; d--) {
        const int64_t at = i % b.lshape[d] + b.gstart[d];
        i /= b.lshape[d];
        int64_t row = at;
        if (d == 0 && b.ndim > 1 && b.win_rows > 0)
            row = (at / b.win_rows) * b.win_stride + b.win_offset + at % b.win_rows;
        g += (uint64_t)(row * b.gstride[d]);
    }
    return g;
}

/* y[i] = keep ? x[i] / (1 - p) : 0 (acc: y[i] += that); T float or ms_bf16. */
template <typename T>
MS_HD void ms_cu_dropout_elem(T *y, const T *x, bool acc, float p, uint64_t seed, uint64_t stream,
                              const ms_cu_box &b, int64_t i) {
    const bool none = p >= 1.0f;
    const float scale = none ? 0.0f : 1.0f / (1.0f - p);
    const uint64_t g = b.ndim ? ms_cu_box_global(b, i) : 0;
    const bool keep = !none && ms_cu_philox_uniform(seed, stream, g) >= p;
    const float v = keep ? ms_cu_load(x + i) * scale : 0.0f;
    ms_cu_store(y + i, acc ? ms_cu_load(y + i) + v : v);
}

/* The box for the CPU kernel's arguments (gshape NULL: the local shape is the global one). */
static inline ms_cu_box ms_cu_box_make(int ndim, const int64_t *lshape, const int64_t *gstart,
                                       const int64_t *gshape, int64_t win_rows, int64_t win_stride,
                                       int64_t win_offset) {
    ms_cu_box b;
    memset(&b, 0, sizeof b);
    b.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        b.lshape[d] = lshape[d];
        b.gstart[d] = gstart ? gstart[d] : 0;
    }
    if (ndim) b.gstride[ndim - 1] = 1;
    for (int d = ndim - 2; d >= 0; d--)
        b.gstride[d] = b.gstride[d + 1] * (gshape ? gshape[d + 1] : lshape[d + 1]);
    b.win_rows = win_rows, b.win_stride = win_stride, b.win_offset = win_offset;
    return b;
}

#endif

/* colsum_math.cuh - the column reduction of the backward kernels (dbias, the norms' dweight):
 * out[j] += sum over the n rows of an [n, c] tensor of a per-element term, deterministic and
 * parallel over rows as well as columns.
 *
 * One thread per column walking all n rows leaves c threads for n * c elements (768 threads
 * for GPT-2's 8192 x 768), so the reduction runs in two passes over fixed row chunks:
 *   pass 1, one thread per (chunk, column), consecutive threads on consecutive columns so the
 *     loads coalesce: walks the chunk's rows in order, does the kernel's elementwise work for
 *     those elements (dinp += ...) and writes the chunk's fp32 column sum into a scratch
 *     part[chunk * c + j] (each kernel's *_part function, beside its other arithmetic);
 *   pass 2, one thread per column (ms_cu_colsum_finish): adds the chunks' sums in chunk order
 *     onto the column's existing value and rounds once to the storage type.
 * The order depends on n alone, so a result has the same bits every run; it is not the CPU
 * kernels' row order, so fp32 results differ from theirs by the rounding of two different
 * summation orders (tests/test_cuda_host.cu holds both to the summation bound).
 */
#ifndef MS_CUDA_COLSUM_MATH_CUH
#define MS_CUDA_COLSUM_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"

/* Rows per chunk: n = 8192 gives 128 chunks, so pass 1 has 128 * c threads and pass 2 adds
 * 128 partials per column. */
#define MS_CU_COLSUM_CHUNK 64

MS_HD int64_t ms_cu_colsum_chunks(int64_t n) {
    return n > 0 ? (n + MS_CU_COLSUM_CHUNK - 1) / MS_CU_COLSUM_CHUNK : 0;
}

/* The rows [*lo, *hi) of chunk b of n: the chunks tile [0, n) in order, the last one short. */
MS_HD void ms_cu_colsum_rows(int64_t n, int64_t b, int64_t *lo, int64_t *hi) {
    *lo = b * MS_CU_COLSUM_CHUNK;
    *hi = *lo + MS_CU_COLSUM_CHUNK < n ? *lo + MS_CU_COLSUM_CHUNK : n;
}

/* Pass 2 for column j: out[j] += part[0 * c + j] + part[1 * c + j] + ..., left to right from
 * out[j]'s value, in fp32, rounded once on the store. */
template <typename W>
MS_HD void ms_cu_colsum_finish(W *out, const float *part, int64_t chunks, int64_t c, int64_t j) {
    float s = ms_cu_load(out + j);
    for (int64_t b = 0; b < chunks; b++) s += part[b * c + j];
    ms_cu_store(out + j, s);
}

#endif

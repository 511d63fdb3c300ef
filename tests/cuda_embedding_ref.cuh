/* cuda_embedding_ref.cuh - the CUDA embedding backward (embedding.cu) on the host: the token
 * positions stably sorted by ms_cu_embedding_key, as CUB's radix sort orders them, then
 * ms_cu_embedding_bwd_run for every element, as the launch does thread by thread. */
#ifndef MS_TESTS_CUDA_EMBEDDING_REF_CUH
#define MS_TESTS_CUDA_EMBEDDING_REF_CUH

#include <algorithm>
#include <vector>

#include "engine/kernels/cuda/elementwise_math.cuh"

template <typename T>
static void emb_sorted_backward(T *dtable, const int32_t *ids, const T *dout, int64_t n, int64_t c,
                                int64_t v0, int64_t vl) {
    std::vector<uint32_t> keys(n);
    std::vector<int32_t> tokens(n);
    for (int64_t r = 0; r < n; r++) tokens[r] = (int32_t)r;
    std::stable_sort(tokens.begin(), tokens.end(), [&](int32_t a, int32_t b) {
        return ms_cu_embedding_key(ids, v0, vl, a) < ms_cu_embedding_key(ids, v0, vl, b);
    });
    for (int64_t p = 0; p < n; p++) keys[p] = ms_cu_embedding_key(ids, v0, vl, tokens[p]);
    /* the threads in reverse: no element may depend on another thread's write */
    for (int64_t i = n * c - 1; i >= 0; i--)
        ms_cu_embedding_bwd_run(dtable, dout, keys.data(), tokens.data(), n, c, vl, i);
}

#endif

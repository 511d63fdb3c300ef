/* embedding.cu - the embedding lookup and its deterministic backward, fp32 and bf16, around
 * the functions of elementwise_math.cuh.
 *
 * The backward sorts the token positions by row with CUB's stable radix sort, then one thread
 * per (sorted position, channel) sums each row's run in ascending token order: no atomics, so
 * the table gradient is the CPU kernel's bit for bit and the same every run. The caller owns
 * the scratch (ms_cu_embedding_scratch_bytes; backend_cuda.c keeps it in the kernel context).
 */
#include <cub/device/device_radix_sort.cuh>

#include "engine/kernels/cuda/elementwise_math.cuh"
#include "engine/kernels/cuda/launch.cuh"

#define EMB_ALIGN 256 /* every scratch array starts on a boundary CUB and coalescing like */

/* The scratch of one backward: keys and token positions, unsorted and sorted, then CUB's. */
typedef struct emb_scratch {
    uint32_t *keys_in, *keys;
    int32_t *tokens_in, *tokens;
    void *sort_temp;
    size_t sort_bytes;
} emb_scratch;

static size_t emb_aligned(size_t bytes) {
    return (bytes + EMB_ALIGN - 1) / EMB_ALIGN * EMB_ALIGN;
}

/* Key bits to sort: enough for vl, the off-slice key. */
static int emb_key_bits(int64_t vl) {
    int bits = 1;
    while (bits < 32 && ((uint64_t)1 << bits) <= (uint64_t)vl) bits++;
    return bits;
}

static size_t emb_sort_bytes(int64_t n, int64_t vl) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(NULL, bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0,
                                    emb_key_bits(vl));
    return bytes;
}

size_t ms_cu_embedding_scratch_bytes(int64_t n, int64_t vl) {
    if (n <= 0) return 0;
    return 4 * emb_aligned((size_t)n * 4) + emb_aligned(emb_sort_bytes(n, vl));
}

static emb_scratch emb_carve(void *scratch, int64_t n, int64_t vl) {
    char *p = (char *)scratch;
    const size_t a = emb_aligned((size_t)n * 4);
    emb_scratch s;
    s.keys_in = (uint32_t *)p, s.keys = (uint32_t *)(p + a);
    s.tokens_in = (int32_t *)(p + 2 * a), s.tokens = (int32_t *)(p + 3 * a);
    s.sort_temp = p + 4 * a, s.sort_bytes = emb_sort_bytes(n, vl);
    return s;
}

static ms_status emb_check(int64_t n, int64_t vl, size_t scratch_bytes, const char *what,
                           ms_error *err) {
    if (n > INT32_MAX || vl >= UINT32_MAX)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: %lld tokens over %lld rows exceed the 32-bit sort keys; split the "
                       "batch",
                       what, (long long)n, (long long)vl);
    if (scratch_bytes < ms_cu_embedding_scratch_bytes(n, vl))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: scratch of %zu bytes, %zu needed (ms_cu_embedding_scratch_bytes)", what,
                       scratch_bytes, ms_cu_embedding_scratch_bytes(n, vl));
    return MS_OK;
}

/* The tokens' positions stably sorted by row (off-slice ones last, under key vl). */
static ms_status emb_sort(const emb_scratch &s, const int32_t *ids, int64_t n, int64_t v0,
                          int64_t vl, ms_kctx *kc, const char *what, ms_error *err) {
    const emb_scratch k = s;
    MS_CHECK(ms_cu_each(n, kc, what, err, [=] __device__(int64_t r) {
        k.keys_in[r] = ms_cu_embedding_key(ids, v0, vl, r);
        k.tokens_in[r] = (int32_t)r;
    }));
    size_t bytes = s.sort_bytes;
    const cudaError_t e = cub::DeviceRadixSort::SortPairs(
        s.sort_temp, bytes, s.keys_in, s.keys, s.tokens_in, s.tokens, (int)n, 0, emb_key_bits(vl),
        (cudaStream_t)ms_cu_stream(kc));
    if (e != cudaSuccess)
        return ms_fail(err, MS_ERR_INTERNAL, "%s: CUB radix sort failed: %s", what,
                       cudaGetErrorString(e));
    return MS_OK;
}

template <typename T>
static ms_status embedding_forward(T *out, const int32_t *ids, const T *table, int64_t n, int64_t c,
                                   int64_t v0, int64_t vl, ms_kctx *kc, const char *what,
                                   ms_error *err) {
    return ms_cu_each(n * c, kc, what, err, [=] __device__(int64_t i) {
        ms_cu_embedding_fwd(out, ids, table, c, v0, vl, i);
    });
}

template <typename T>
static ms_status embedding_backward(T *dtable, const int32_t *ids, const T *dout, int64_t n,
                                    int64_t c, int64_t v0, int64_t vl, void *scratch,
                                    size_t scratch_bytes, ms_kctx *kc, const char *what,
                                    ms_error *err) {
    if (n <= 0 || c <= 0) return MS_OK;
    MS_CHECK(emb_check(n, vl, scratch_bytes, what, err));
    const emb_scratch s = emb_carve(scratch, n, vl);
    MS_CHECK(emb_sort(s, ids, n, v0, vl, kc, what, err));
    const uint32_t *keys = s.keys;
    const int32_t *tokens = s.tokens;
    return ms_cu_each(n * c, kc, what, err, [=] __device__(int64_t i) {
        ms_cu_embedding_bwd_run(dtable, dout, keys, tokens, n, c, vl, i);
    });
}

ms_status ms_cu_embedding_forward(ms_kctx *kc, float *out, const int32_t *ids, const float *table,
                                  int64_t n, int64_t c, int64_t v0, int64_t vl, ms_error *err) {
    return embedding_forward(out, ids, table, n, c, v0, vl, kc, "embedding forward", err);
}

ms_status ms_cu_embedding_backward(ms_kctx *kc, float *dtable, const int32_t *ids,
                                   const float *dout, int64_t n, int64_t c, int64_t v0, int64_t vl,
                                   void *scratch, size_t scratch_bytes, ms_error *err) {
    return embedding_backward(dtable, ids, dout, n, c, v0, vl, scratch, scratch_bytes, kc,
                              "embedding backward", err);
}

ms_status ms_cu_embedding_forward_bf16(ms_kctx *kc, uint16_t *out, const int32_t *ids,
                                       const uint16_t *table, int64_t n, int64_t c, int64_t v0,
                                       int64_t vl, ms_error *err) {
    return embedding_forward(ms_cu_bf(out), ids, ms_cu_bf(table), n, c, v0, vl, kc,
                             "embedding forward bf16", err);
}

ms_status ms_cu_embedding_backward_bf16(ms_kctx *kc, uint16_t *dtable, const int32_t *ids,
                                        const uint16_t *dout, int64_t n, int64_t c, int64_t v0,
                                        int64_t vl, void *scratch, size_t scratch_bytes,
                                        ms_error *err) {
    return embedding_backward(ms_cu_bf(dtable), ids, ms_cu_bf(dout), n, c, v0, vl, scratch,
                              scratch_bytes, kc, "embedding backward bf16", err);
}

/* optim.cu - AdamW (fp32, and fp32 master weights with a bf16 gradient) one thread per element,
 * the sum of squares one block per fixed chunk, and the lists of a training step's tensors
 * (AdamW's, the gradient norm's, the masters' casts into their bf16 use copies) one launch for
 * all (optim_math.cuh). */
#include "engine/kernels/cuda/launch.cuh"
#include "engine/kernels/cuda/optim_math.cuh"

ms_status ms_cu_adamw_step(ms_kctx *kc, float *p, const float *g, float *m, float *v, size_t n,
                           const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err) {
    MS_CHECK(ms_adamw_check(o, t, grad_scale, err));
    const ms_cu_adamw_consts k = ms_cu_adamw_prepare(o, t, grad_scale);
    return ms_cu_each((int64_t)n, kc, "adamw", err,
                      [=] __device__(int64_t i) { ms_cu_adamw_elem(p, g, m, v, i, k); });
}

ms_status ms_cu_adamw_step_master(ms_kctx *kc, float *p, const uint16_t *g, float *m, float *v,
                                  uint16_t *p16, size_t n, const ms_adamw_opts *o, int64_t t,
                                  float grad_scale, ms_error *err) {
    MS_CHECK(ms_adamw_check(o, t, grad_scale, err));
    const ms_cu_adamw_consts k = ms_cu_adamw_prepare(o, t, grad_scale);
    const ms_bf16 *g16 = ms_cu_bf(g);
    ms_bf16 *w16 = ms_cu_bf(p16);
    if (!w16)
        return ms_cu_each((int64_t)n, kc, "adamw (fp32 master, bf16 gradient)", err,
                          [=] __device__(int64_t i) { ms_cu_adamw_elem(p, g16, m, v, i, k); });
    return ms_cu_each(
        (int64_t)n, kc, "adamw (fp32 master, bf16 gradient)", err,
        [=] __device__(int64_t i) { ms_cu_adamw_master_elem(p, g16, m, v, w16, i, k); });
}

/* The table's slot: the program rounds the masters into their bf16 use copies itself. */
ms_status ms_cu_adamw_step_bf16_grad(ms_kctx *kc, float *p, const uint16_t *g, float *m, float *v,
                                     size_t n, const ms_adamw_opts *o, int64_t t, float grad_scale,
                                     ms_error *err) {
    return ms_cu_adamw_step_master(kc, p, g, m, v, NULL, n, o, t, grad_scale, err);
}

/* Numbers each item's first chunk and returns the list's chunks: chunks_of(n) for an item of
 * n elements, and one for an empty item, so that every item owns a block. */
template <typename Item, typename Chunks>
static int64_t list_plan(Item *items, int n, Chunks chunks_of) {
    int64_t chunks = 0;
    for (int i = 0; i < n; i++) {
        items[i].chunk0 = chunks;
        chunks += items[i].n > 0 ? chunks_of(items[i].n) : 1;
    }
    return chunks;
}

int64_t ms_cu_adamw_list_plan(ms_cu_adamw_item *items, int n) {
    return list_plan(items, n,
                     [](int64_t e) { return (e + MS_CU_ADAMW_CHUNK - 1) / MS_CU_ADAMW_CHUNK; });
}

ms_status ms_cu_adamw_list(ms_kctx *kc, const ms_cu_adamw_item *items, int n, int64_t chunks,
                           const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err) {
    MS_CHECK(ms_adamw_check(o, t, grad_scale, err));
    if (n <= 0) return MS_OK;
    const ms_cu_adamw_consts k = ms_cu_adamw_prepare(o, t, grad_scale);
    return ms_cu_rows(chunks, kc, "adamw (list)", err, [=] __device__(int64_t b, int l) {
        ms_cu_adamw_list_part(items[ms_cu_list_item_of(items, n, b)], b, l, MS_CU_ROW_LANES, k);
    });
}

int64_t ms_cu_cast_list_plan(ms_cu_cast_item *items, int n) {
    return list_plan(items, n,
                     [](int64_t e) { return (e + MS_CU_CAST_CHUNK - 1) / MS_CU_CAST_CHUNK; });
}

ms_status ms_cu_cast_list(ms_kctx *kc, const ms_cu_cast_item *items, int n, int64_t chunks,
                          ms_error *err) {
    if (n <= 0) return MS_OK;
    return ms_cu_rows(chunks, kc, "bf16 round (list)", err, [=] __device__(int64_t b, int l) {
        ms_cu_cast_list_part(items[ms_cu_list_item_of(items, n, b)], b, l, MS_CU_ROW_LANES);
    });
}

int64_t ms_cu_sumsq_scratch_doubles(int64_t n) {
    return ms_cu_sumsq_chunks(n);
}

template <typename T>
static ms_status sumsq(double *out, double *scratch, const T *x, int64_t n, ms_kctx *kc,
                       ms_error *err) {
    const int64_t chunks = ms_cu_sumsq_chunks(n);
    MS_CHECK(ms_cu_rows(chunks, kc, "sum of squares", err, [=] __device__(int64_t b, int l) {
        const int64_t lo = b * MS_CU_SUMSQ_CHUNK;
        const int64_t len = n - lo < MS_CU_SUMSQ_CHUNK ? n - lo : MS_CU_SUMSQ_CHUNK;
        const double s = ms_cu_block_sum(ms_cu_sumsq_part(x + lo, len, l, MS_CU_ROW_LANES));
        if (l == 0) scratch[b] = s;
    }));
    /* The chunk partials in chunk order: one thread, a few thousand additions at most. */
    return ms_cu_each(1, kc, "sum of squares (combine)", err,
                      [=] __device__(int64_t) { *out = ms_cu_sumsq_combine(scratch, chunks); });
}

ms_status ms_cu_sumsq(ms_kctx *kc, double *out, double *scratch, const float *x, int64_t n,
                      ms_error *err) {
    return sumsq(out, scratch, x, n, kc, err);
}

ms_status ms_cu_sumsq_bf16(ms_kctx *kc, double *out, double *scratch, const uint16_t *x, int64_t n,
                           ms_error *err) {
    return sumsq(out, scratch, ms_cu_bf(x), n, kc, err);
}

int64_t ms_cu_sumsq_list_plan(ms_cu_sumsq_item *items, int n) {
    return list_plan(items, n, ms_cu_sumsq_chunks); /* an empty item's chunk sums to 0 */
}

ms_status ms_cu_sumsq_list(ms_kctx *kc, double *out, double *scratch, const ms_cu_sumsq_item *items,
                           int n, int64_t chunks, ms_error *err) {
    if (n <= 0) return MS_OK;
    MS_CHECK(ms_cu_rows(chunks, kc, "sum of squares (list)", err, [=] __device__(int64_t b, int l) {
        const ms_cu_sumsq_item it = items[ms_cu_list_item_of(items, n, b)];
        const double part = it.bf16 ? ms_cu_sumsq_list_part<ms_bf16>(it, b, l, MS_CU_ROW_LANES)
                                    : ms_cu_sumsq_list_part<float>(it, b, l, MS_CU_ROW_LANES);
        const double s = ms_cu_block_sum(part);
        if (l == 0) scratch[b] = s;
    }));
    return ms_cu_each(n, kc, "sum of squares (list, combine)", err, [=] __device__(int64_t i) {
        const int64_t end = i + 1 < n ? items[i + 1].chunk0 : chunks;
        out[i] = ms_cu_sumsq_combine(scratch + items[i].chunk0, end - items[i].chunk0);
    });
}

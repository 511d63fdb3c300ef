/* ops_ext.cu - the table's entries for every operator family beyond the model layers:
 * elementwise unary, broadcasting binary and ternary, reductions over a dims mask, views and
 * block copies, scans, triangles, masks, one-hot, sorting, the row ops, the batched matmul and
 * the losses. Each picks its element or row and calls the function of elementwise_ext_math.cuh,
 * reduce_math.cuh, index_math.cuh or rows_math.cuh; descriptors (layouts, geometries, views)
 * are captured by value. */
#include "engine/kernels/cuda/elementwise_ext_math.cuh"
#include "engine/kernels/cuda/index_math.cuh"
#include "engine/kernels/cuda/launch.cuh"
#include "engine/kernels/cuda/reduce_math.cuh"
#include "engine/kernels/cuda/rows_math.cuh"

ms_status ms_cu_copy(ms_kctx *kc, float *dst, const float *src, int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "copy", err, [=] __device__(int64_t i) { dst[i] = src[i]; });
}

/* ---- elementwise ---- */

ms_status ms_cu_unary_forward(ms_kctx *kc, ms_k_unary op, float *out, const float *inp, int64_t n,
                              float p0, float p1, ms_error *err) {
    return ms_cu_each(n, kc, "unary forward", err,
                      [=] __device__(int64_t i) { ms_cu_unary_fwd(op, out, inp, p0, p1, i); });
}

ms_status ms_cu_unary_backward(ms_kctx *kc, ms_k_unary op, float *dinp, const float *inp,
                               const float *out, const float *dout, int64_t n, float p0, float p1,
                               bool fresh, ms_error *err) {
    return ms_cu_each(n, kc, "unary backward", err, [=] __device__(int64_t i) {
        if (fresh) dinp[i] = 0.0f; /* element i has this one writer */
        ms_cu_unary_bwd(op, dinp, inp, out, dout, p0, p1, i);
    });
}

ms_status ms_cu_binary_forward(ms_kctx *kc, ms_k_binary op, float *out, const float *a,
                               const float *b, const ms_k_bcast *bc, ms_error *err) {
    const ms_k_bcast l = *bc;
    return ms_cu_each(l.numel, kc, "binary forward", err,
                      [=] __device__(int64_t k) { ms_cu_binary_fwd(op, out, a, b, &l, k); });
}

ms_status ms_cu_binary_backward(ms_kctx *kc, ms_k_binary op, float *da, float *db,
                                const float *dout, const float *a, const float *b,
                                const ms_k_bcast *bc, ms_error *err) {
    const ms_k_bcast l = *bc;
    if (!l.numel) return MS_OK;
    if (da)
        MS_CHECK(ms_cu_each(
            ms_cu_bcast_numel(&l, 0), kc, "binary backward (a)", err,
            [=] __device__(int64_t j) { ms_cu_binary_bwd(op, da, 0, dout, a, b, &l, j); }));
    if (!db) return MS_OK;
    return ms_cu_each(
        ms_cu_bcast_numel(&l, 1), kc, "binary backward (b)", err,
        [=] __device__(int64_t j) { ms_cu_binary_bwd(op, db, 1, dout, a, b, &l, j); });
}

ms_status ms_cu_ternary_forward(ms_kctx *kc, ms_k_ternary op, float *out, const float *x,
                                const float *y, const float *z, const ms_k_bcast *bc,
                                ms_error *err) {
    const ms_k_bcast l = *bc;
    return ms_cu_each(l.numel, kc, "ternary forward", err,
                      [=] __device__(int64_t k) { ms_cu_ternary_fwd(op, out, x, y, z, &l, k); });
}

ms_status ms_cu_ternary_backward(ms_kctx *kc, ms_k_ternary op, float *dx, float *dy, float *dz,
                                 const float *dout, const float *x, const float *y, const float *z,
                                 const ms_k_bcast *bc, ms_error *err) {
    const ms_k_bcast l = *bc;
    float *d[3] = {op == MS_K_TER_LERP ? dx : nullptr, dy, dz};
    for (int in = 0; in < 3 && l.numel; in++) {
        float *g = d[in];
        if (!g) continue;
        MS_CHECK(ms_cu_each(
            ms_cu_bcast_numel(&l, in), kc, "ternary backward", err,
            [=] __device__(int64_t j) { ms_cu_ternary_bwd(op, g, in, dout, x, y, z, &l, j); }));
    }
    return MS_OK;
}

/* ---- reductions: one thread per output ---- */

ms_status ms_cu_reduce_forward(ms_kctx *kc, ms_k_reduce op, float *out, float *pos,
                               const float *inp, const ms_k_rgeom *g, float scale, int correction,
                               ms_error *err) {
    const ms_k_rgeom r = *g;
    return ms_cu_each(r.n_out, kc, "reduce forward", err, [=] __device__(int64_t o) {
        ms_cu_reduce_fwd(op, out, pos, inp, &r, scale, correction, o);
    });
}

ms_status ms_cu_reduce_backward(ms_kctx *kc, ms_k_reduce op, float *dinp, const float *dout,
                                const float *inp, const float *pos, const ms_k_rgeom *g,
                                float scale, int correction, ms_error *err) {
    const ms_k_rgeom r = *g;
    if (op == MS_K_RED_COUNT) return MS_OK;
    return ms_cu_each(r.n_out, kc, "reduce backward", err, [=] __device__(int64_t o) {
        ms_cu_reduce_bwd(op, dinp, dout, inp, pos, &r, scale, correction, o);
    });
}

/* ---- layout and indexing ---- */

ms_status ms_cu_view_forward(ms_kctx *kc, float *out, const float *inp, const ms_k_view *v,
                             float fill, ms_error *err) {
    const ms_k_view w = *v;
    return ms_cu_each(ms_k_view_numel(&w), kc, "view forward", err,
                      [=] __device__(int64_t o) { ms_cu_view_fwd(out, inp, &w, fill, o); });
}

/* An injective view (permute, slice, flip, roll, pad) adds each gradient to its own source;
 * one whose outputs share sources (expand, repeat) adds with atomics, in any order. */
ms_status ms_cu_view_backward(ms_kctx *kc, float *dinp, const float *dout, const ms_k_view *v,
                              ms_error *err) {
    const ms_k_view w = *v;
    if (ms_cu_view_injective(&w))
        return ms_cu_each(ms_k_view_numel(&w), kc, "view backward", err, [=] __device__(int64_t o) {
            const int64_t s = ms_cu_view_source(&w, o);
            if (s >= 0) dinp[s] += dout[o];
        });
    return ms_cu_each(ms_k_view_numel(&w), kc, "view backward (shared sources)", err,
                      [=] __device__(int64_t o) {
                          const int64_t s = ms_cu_view_source(&w, o);
                          if (s >= 0) atomicAdd(&dinp[s], dout[o]);
                      });
}

ms_status ms_cu_block_copy(ms_kctx *kc, float *dst, const float *src, int64_t rows, int64_t cols,
                           int64_t dst_ld, int64_t src_ld, bool accumulate, ms_error *err) {
    return ms_cu_each(rows * cols, kc, "block copy", err, [=] __device__(int64_t i) {
        ms_cu_block_copy(dst, src, cols, dst_ld, src_ld, accumulate, i);
    });
}

ms_status ms_cu_scan_forward(ms_kctx *kc, ms_k_scan op, float *out, const float *inp, int64_t o,
                             int64_t d, int64_t i, ms_error *err) {
    return ms_cu_each(o * d * i, kc, "scan forward", err,
                      [=] __device__(int64_t e) { ms_cu_scan_fwd(op, out, inp, d, i, e); });
}

ms_status ms_cu_scan_backward(ms_kctx *kc, ms_k_scan op, float *dinp, const float *dout,
                              const float *inp, int64_t o, int64_t d, int64_t i, ms_error *err) {
    return ms_cu_each(o * d * i, kc, "scan backward", err,
                      [=] __device__(int64_t e) { ms_cu_scan_bwd(op, dinp, dout, inp, d, i, e); });
}

ms_status ms_cu_triangle(ms_kctx *kc, float *out, const float *inp, int64_t batch, int64_t rows,
                         int64_t cols, int64_t r0, int64_t c0, int64_t diag, bool upper,
                         bool accumulate, ms_error *err) {
    return ms_cu_each(batch * rows * cols, kc, "triangle", err, [=] __device__(int64_t k) {
        ms_cu_triangle(out, inp, rows, cols, r0, c0, diag, upper, accumulate, k);
    });
}

ms_status ms_cu_masked_fill_forward(ms_kctx *kc, float *out, const float *x, const float *mask,
                                    float value, int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "masked fill forward", err,
                      [=] __device__(int64_t k) { ms_cu_masked_fill_fwd(out, x, mask, value, k); });
}

ms_status ms_cu_masked_fill_backward(ms_kctx *kc, float *dinp, const float *dout, const float *mask,
                                     int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "masked fill backward", err,
                      [=] __device__(int64_t k) { ms_cu_masked_fill_bwd(dinp, dout, mask, k); });
}

ms_status ms_cu_one_hot(ms_kctx *kc, float *out, const float *ids, int64_t n, int64_t v, int64_t v0,
                        ms_error *err) {
    return ms_cu_each(n * v, kc, "one hot", err,
                      [=] __device__(int64_t e) { ms_cu_one_hot(out, ids, v, v0, e); });
}

ms_status ms_cu_sort_rows(ms_kctx *kc, float *values, float *indices, const float *inp,
                          int64_t rows, int64_t c, int64_t k, bool descending, ms_error *err) {
    return ms_cu_each(rows * c, kc, "sort rows", err, [=] __device__(int64_t e) {
        ms_cu_sort_place(values, indices, inp, c, k, descending, e);
    });
}

ms_status ms_cu_sort_rows_backward(ms_kctx *kc, float *dinp, const float *dout,
                                   const float *indices, int64_t rows, int64_t c, int64_t k,
                                   ms_error *err) {
    return ms_cu_each(rows * k, kc, "sort rows backward", err,
                      [=] __device__(int64_t e) { ms_cu_sort_bwd(dinp, dout, indices, c, k, e); });
}

/* ---- row ops, batched matmul, losses ---- */

ms_status ms_cu_rows_forward(ms_kctx *kc, ms_k_row_op op, float *out, float *aux, const float *x,
                             const float *y, int64_t n, int64_t c, float p, ms_error *err) {
    return ms_cu_each(n, kc, "row op forward", err,
                      [=] __device__(int64_t r) { ms_cu_rows_fwd(op, out, aux, x, y, c, p, r); });
}

ms_status ms_cu_rows_backward(ms_kctx *kc, ms_k_row_op op, float *dx, float *dy, const float *dout,
                              const float *x, const float *y, const float *out, const float *aux,
                              int64_t n, int64_t c, float p, ms_error *err) {
    return ms_cu_each(n, kc, "row op backward", err, [=] __device__(int64_t r) {
        ms_cu_rows_bwd(op, dx, dy, dout, x, y, out, aux, c, p, r);
    });
}

ms_status ms_cu_bmm_forward(ms_kctx *kc, const ms_k_bmm *g, float *c, const float *a,
                            const float *b, ms_error *err) {
    const ms_k_bmm m = *g;
    return ms_cu_each(ms_cu_bmm_items(&m) * m.m * m.n, kc, "bmm forward", err,
                      [=] __device__(int64_t e) { ms_cu_bmm_fwd(&m, c, a, b, e); });
}

/* Operand items: the largest item index any batch item reads, plus one. */
static int64_t bmm_operand_items(const ms_k_bmm *g, bool b) {
    int64_t n = 0;
    for (int64_t it = 0; it < ms_cu_bmm_items(g); it++) {
        int64_t ia, ib;
        ms_cu_bmm_item(g, it, &ia, &ib);
        const int64_t last = (b ? ib : ia) + 1;
        n = last > n ? last : n;
    }
    return n;
}

ms_status ms_cu_bmm_backward(ms_kctx *kc, const ms_k_bmm *g, float *da, float *db, const float *dc,
                             const float *a, const float *b, ms_error *err) {
    const ms_k_bmm m = *g;
    if (m.k == 0) return MS_OK;
    if (da)
        MS_CHECK(
            ms_cu_each(bmm_operand_items(&m, false) * m.m * m.k, kc, "bmm backward (a)", err,
                       [=] __device__(int64_t e) { ms_cu_bmm_bwd(&m, da, false, dc, a, b, e); }));
    if (!db) return MS_OK;
    return ms_cu_each(bmm_operand_items(&m, true) * m.k * m.n, kc, "bmm backward (b)", err,
                      [=] __device__(int64_t e) { ms_cu_bmm_bwd(&m, db, true, dc, a, b, e); });
}

ms_status ms_cu_pointwise_loss_forward(ms_kctx *kc, ms_k_loss kind, float *out, const float *a,
                                       const float *b, int64_t n, float delta, float scale,
                                       ms_error *err) {
    return ms_cu_each(1, kc, "pointwise loss forward", err, [=] __device__(int64_t) {
        ms_cu_pointwise_loss_fwd(kind, out, a, b, n, delta, scale);
    });
}

ms_status ms_cu_pointwise_loss_backward(ms_kctx *kc, ms_k_loss kind, float *da, float *db,
                                        const float *a, const float *b, const float *dout,
                                        int64_t n, float delta, float scale, ms_error *err) {
    return ms_cu_each(n, kc, "pointwise loss backward", err, [=] __device__(int64_t i) {
        ms_cu_pointwise_loss_bwd(kind, da, db, a, b, dout, delta, scale, i);
    });
}

ms_status ms_cu_nll_forward(ms_kctx *kc, float *losses, const float *logp, const int32_t *targets,
                            int64_t n, int64_t vl, int64_t v0, ms_error *err) {
    return ms_cu_each(n, kc, "nll forward", err, [=] __device__(int64_t i) {
        ms_cu_nll_fwd(losses, logp, targets, vl, v0, i);
    });
}

ms_status ms_cu_nll_backward(ms_kctx *kc, float *dlogp, const float *dlosses,
                             const int32_t *targets, int64_t n, int64_t vl, int64_t v0,
                             ms_error *err) {
    return ms_cu_each(n, kc, "nll backward", err, [=] __device__(int64_t i) {
        ms_cu_nll_bwd(dlogp, dlosses, targets, vl, v0, i);
    });
}

ms_status ms_cu_xent_smooth_forward(ms_kctx *kc, float *losses, float *lse, const float *logits,
                                    const int32_t *targets, int64_t n, int64_t v, float s,
                                    ms_error *err) {
    return ms_cu_each(n, kc, "smoothed cross-entropy forward", err, [=] __device__(int64_t i) {
        ms_cu_xent_smooth_fwd(losses, lse, logits, targets, v, s, i);
    });
}

ms_status ms_cu_xent_smooth_backward(ms_kctx *kc, float *dlogits, const float *logits,
                                     const float *lse, const int32_t *targets, const float *dlosses,
                                     int64_t n, int64_t v, float s, ms_error *err) {
    return ms_cu_each(n, kc, "smoothed cross-entropy backward", err, [=] __device__(int64_t i) {
        ms_cu_xent_smooth_bwd(dlogits, logits, lse, targets, dlosses, v, s, i);
    });
}

/* backend.c - the CPU and fenced kernel tables, and the kernel contexts of every backend.
 *
 * One set of wrappers serves both tables: each turns the addresses it is given into host
 * addresses (H: minus kc->tag, which is 0 on the CPU) and calls the kernel of kernels.h or
 * optim.h. The cost is a subtraction per pointer per call. */
#include "engine/kernels/backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/panic.h"
#include "engine/core/xalloc.h"

/* The host address of a device address; NULL stays NULL (an unwanted gradient). */
#define H(p) ((void *)((p) ? (uintptr_t)(p)-kc->tag : (uintptr_t)0))
#define OK   (void)err, MS_OK

/* A fresh gradient (backend.h) on host memory: the CPU kernels add, so it starts at zero. */
static void zero_floats(float *x, int64_t n) {
    if (x && n > 0) memset(x, 0, sizeof(float) * (size_t)n);
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

static ms_status host_sync(ms_kctx *kc, ms_error *err) {
    (void)kc, (void)err;
    return MS_OK;
}

/* ---- program instructions ---- */
static ms_status h_fill(ms_kctx *kc, float *dst, float v, int64_t n, ms_error *err) {
    float *d = H(dst);
    for (int64_t i = 0; i < n; i++) d[i] = v;
    return OK;
}
static ms_status h_accumulate(ms_kctx *kc, float *dst, const float *src, int64_t n, ms_error *err) {
    ms_k_add_backward(H(dst), NULL, H(src), n);
    return OK;
}
static ms_status h_bf16_accumulate(ms_kctx *kc, uint16_t *dst, const uint16_t *src, int64_t n,
                                   ms_error *err) {
    ms_k_bf16_add_inplace(H(dst), H(src), n);
    return OK;
}
static ms_status h_bf16_widen(ms_kctx *kc, float *out, const uint16_t *in, int64_t n,
                              ms_error *err) {
    ms_k_bf16_widen(H(out), H(in), n);
    return OK;
}
static ms_status h_bf16_round(ms_kctx *kc, uint16_t *out, const float *in, int64_t n,
                              ms_error *err) {
    ms_k_bf16_round(H(out), H(in), n);
    return OK;
}
static ms_status h_bf16_round_list(ms_kctx *kc, const ms_k_cast_item *x, int n, ms_error *err) {
    for (int i = 0; i < n; i++) ms_k_bf16_round(H(x[i].dst), H(x[i].src), (int64_t)x[i].n);
    return OK;
}
static ms_status h_ids_from_floats(ms_kctx *kc, int32_t *out, const float *in, int64_t n,
                                   ms_error *err) {
    int32_t *o = H(out);
    const float *x = H(in);
    for (int64_t i = 0; i < n; i++) o[i] = (int32_t)x[i];
    return OK;
}

/* ---- matmul ---- */
static ms_status h_matmul_forward(ms_kctx *kc, const ms_k_gemm *g, float *c, const float *a,
                                  const float *b, float alpha, float beta, ms_error *err) {
    ms_k_matmul_forward(g, H(c), H(a), H(b), alpha, beta);
    return OK;
}
static ms_status h_matmul_backward(ms_kctx *kc, const ms_k_gemm *g, float *da, float *db,
                                   const float *dc, const float *a, const float *b, float alpha,
                                   bool accumulate, ms_error *err) {
    ms_k_matmul_backward(g, H(da), H(db), H(dc), H(a), H(b), alpha, accumulate);
    return OK;
}

/* ---- elementwise ---- */
static ms_status h_add_forward(ms_kctx *kc, float *out, const float *a, const float *b, int64_t n,
                               ms_error *err) {
    ms_k_add_forward(H(out), H(a), H(b), n);
    return OK;
}
static ms_status h_add_backward(ms_kctx *kc, float *da, float *db, const float *dout, int64_t n,
                                ms_error *err) {
    ms_k_add_backward(H(da), H(db), H(dout), n);
    return OK;
}
static ms_status h_mul_forward(ms_kctx *kc, float *out, const float *a, const float *b, int64_t n,
                               ms_error *err) {
    ms_k_mul_forward(H(out), H(a), H(b), n);
    return OK;
}
static ms_status h_mul_backward(ms_kctx *kc, float *da, float *db, const float *dout,
                                const float *a, const float *b, int64_t n, ms_error *err) {
    ms_k_mul_backward(H(da), H(db), H(dout), H(a), H(b), n);
    return OK;
}
static ms_status h_scale_forward(ms_kctx *kc, float *out, const float *x, float s, int64_t n,
                                 ms_error *err) {
    ms_k_scale_forward(H(out), H(x), s, n);
    return OK;
}
static ms_status h_scale_backward(ms_kctx *kc, float *dx, const float *dout, float s, int64_t n,
                                  ms_error *err) {
    ms_k_scale_backward(H(dx), H(dout), s, n);
    return OK;
}
static ms_status h_bias_add_forward(ms_kctx *kc, float *out, const float *inp, const float *bias,
                                    int64_t n, int64_t c, ms_error *err) {
    ms_k_bias_add_forward(H(out), H(inp), H(bias), n, c);
    return OK;
}
static ms_status h_bias_add_backward(ms_kctx *kc, float *dinp, float *dbias, const float *dout,
                                     int64_t n, int64_t c, unsigned fresh, ms_error *err) {
    if (fresh & 1u) zero_floats(H(dinp), n * c);
    ms_k_bias_add_backward(H(dinp), H(dbias), H(dout), n, c);
    return OK;
}
static ms_status h_gelu_forward(ms_kctx *kc, float *out, const float *inp, int64_t n,
                                ms_error *err) {
    ms_k_gelu_forward(H(out), H(inp), n);
    return OK;
}
static ms_status h_gelu_backward(ms_kctx *kc, float *dinp, const float *inp, const float *dout,
                                 int64_t n, ms_error *err) {
    ms_k_gelu_backward(H(dinp), H(inp), H(dout), n);
    return OK;
}

/* ---- the elementwise families ---- */
static ms_status h_copy(ms_kctx *kc, float *dst, const float *src, int64_t n, ms_error *err) {
    float *d = H(dst);
    const float *x = H(src);
    for (int64_t k = 0; k < n; k++) d[k] = x[k];
    return OK;
}
static ms_status h_unary_forward(ms_kctx *kc, ms_k_unary op, float *out, const float *inp,
                                 int64_t n, float p0, float p1, ms_error *err) {
    ms_k_unary_forward(op, H(out), H(inp), n, p0, p1);
    return OK;
}
static ms_status h_unary_backward(ms_kctx *kc, ms_k_unary op, float *dinp, const float *inp,
                                  const float *out, const float *dout, int64_t n, float p0,
                                  float p1, bool fresh, ms_error *err) {
    ms_k_unary_backward(op, H(dinp), H(inp), H(out), H(dout), n, p0, p1, fresh);
    return OK;
}
static ms_status h_binary_forward(ms_kctx *kc, ms_k_binary op, float *out, const float *a,
                                  const float *b, const ms_k_bcast *bc, ms_error *err) {
    ms_k_binary_forward(op, H(out), H(a), H(b), bc);
    return OK;
}
static ms_status h_binary_backward(ms_kctx *kc, ms_k_binary op, float *da, float *db,
                                   const float *dout, const float *a, const float *b,
                                   const ms_k_bcast *bc, ms_error *err) {
    ms_k_binary_backward(op, H(da), H(db), H(dout), H(a), H(b), bc);
    return OK;
}
static ms_status h_ternary_forward(ms_kctx *kc, ms_k_ternary op, float *out, const float *x,
                                   const float *y, const float *z, const ms_k_bcast *bc,
                                   ms_error *err) {
    if (op == MS_K_TER_LERP)
        ms_k_lerp_forward(H(out), H(x), H(y), H(z), bc);
    else
        ms_k_where_forward(H(out), H(x), H(y), H(z), bc);
    return OK;
}
static ms_status h_ternary_backward(ms_kctx *kc, ms_k_ternary op, float *dx, float *dy, float *dz,
                                    const float *dout, const float *x, const float *y,
                                    const float *z, const ms_k_bcast *bc, ms_error *err) {
    if (op == MS_K_TER_LERP)
        ms_k_lerp_backward(H(dx), H(dy), H(dz), H(dout), H(x), H(y), H(z), bc);
    else
        ms_k_where_backward(H(dy), H(dz), H(dout), H(x), bc);
    return OK;
}

/* ---- reductions ---- */
static ms_status h_reduce_forward(ms_kctx *kc, ms_k_reduce op, float *out, float *pos,
                                  const float *inp, const ms_k_rgeom *g, float scale,
                                  int correction, ms_error *err) {
    ms_k_reduce_forward(op, H(out), H(pos), H(inp), g, scale, correction);
    return OK;
}
static ms_status h_reduce_backward(ms_kctx *kc, ms_k_reduce op, float *dinp, const float *dout,
                                   const float *inp, const float *pos, const ms_k_rgeom *g,
                                   float scale, int correction, ms_error *err) {
    ms_k_reduce_backward(op, H(dinp), H(dout), H(inp), H(pos), g, scale, correction);
    return OK;
}

/* ---- layout and indexing ---- */
static ms_status h_view_forward(ms_kctx *kc, float *out, const float *inp, const ms_k_view *v,
                                float fill, ms_error *err) {
    ms_k_view_forward(H(out), H(inp), v, fill);
    return OK;
}
static ms_status h_view_backward(ms_kctx *kc, float *dinp, const float *dout, const ms_k_view *v,
                                 ms_error *err) {
    ms_k_view_backward(H(dinp), H(dout), v);
    return OK;
}
static ms_status h_block_copy(ms_kctx *kc, float *dst, const float *src, int64_t rows, int64_t cols,
                              int64_t dst_ld, int64_t src_ld, bool accumulate, ms_error *err) {
    ms_k_block_copy(H(dst), H(src), rows, cols, dst_ld, src_ld, accumulate);
    return OK;
}
static ms_status h_scan_forward(ms_kctx *kc, ms_k_scan op, float *out, const float *inp, int64_t o,
                                int64_t d, int64_t i, ms_error *err) {
    if (op == MS_K_SCAN_SUM)
        ms_k_cumsum_forward(H(out), H(inp), o, d, i);
    else
        ms_k_cumprod_forward(H(out), H(inp), o, d, i);
    return OK;
}
static ms_status h_scan_backward(ms_kctx *kc, ms_k_scan op, float *dinp, const float *dout,
                                 const float *inp, int64_t o, int64_t d, int64_t i, ms_error *err) {
    if (op == MS_K_SCAN_SUM)
        ms_k_cumsum_backward(H(dinp), H(dout), o, d, i);
    else
        ms_k_cumprod_backward(H(dinp), H(dout), H(inp), o, d, i);
    return OK;
}
static ms_status h_triangle(ms_kctx *kc, float *out, const float *inp, int64_t batch, int64_t rows,
                            int64_t cols, int64_t r0, int64_t c0, int64_t diag, bool upper,
                            bool accumulate, ms_error *err) {
    ms_k_triangle(H(out), H(inp), batch, rows, cols, r0, c0, diag, upper, accumulate);
    return OK;
}
static ms_status h_masked_fill_forward(ms_kctx *kc, float *out, const float *x, const float *mask,
                                       float value, int64_t n, ms_error *err) {
    ms_k_masked_fill_forward(H(out), H(x), H(mask), value, n);
    return OK;
}
static ms_status h_masked_fill_backward(ms_kctx *kc, float *dinp, const float *dout,
                                        const float *mask, int64_t n, ms_error *err) {
    ms_k_masked_fill_backward(H(dinp), H(dout), H(mask), n);
    return OK;
}
static ms_status h_one_hot(ms_kctx *kc, float *out, const float *ids, int64_t n, int64_t v,
                           int64_t v0, ms_error *err) {
    ms_k_one_hot(H(out), H(ids), n, v, v0);
    return OK;
}
static ms_status h_sort_rows(ms_kctx *kc, float *values, float *indices, const float *inp,
                             int64_t rows, int64_t c, int64_t k, bool descending, ms_error *err) {
    ms_k_sort_rows(H(values), H(indices), H(inp), rows, c, k, descending);
    return OK;
}
static ms_status h_sort_rows_backward(ms_kctx *kc, float *dinp, const float *dout,
                                      const float *indices, int64_t rows, int64_t c, int64_t k,
                                      ms_error *err) {
    ms_k_sort_rows_backward(H(dinp), H(dout), H(indices), rows, c, k);
    return OK;
}

/* ---- per-row ops, batched matmul, losses ---- */
static ms_status h_rows_forward(ms_kctx *kc, ms_k_row_op op, float *out, float *aux, const float *x,
                                const float *y, int64_t n, int64_t c, float p, ms_error *err) {
    ms_k_rows_forward(op, H(out), H(aux), H(x), H(y), n, c, p);
    return OK;
}
static ms_status h_rows_backward(ms_kctx *kc, ms_k_row_op op, float *dx, float *dy,
                                 const float *dout, const float *x, const float *y,
                                 const float *out, const float *aux, int64_t n, int64_t c, float p,
                                 ms_error *err) {
    ms_k_rows_backward(op, H(dx), H(dy), H(dout), H(x), H(y), H(out), H(aux), n, c, p);
    return OK;
}
static ms_status h_bmm_forward(ms_kctx *kc, const ms_k_bmm *g, float *c, const float *a,
                               const float *b, ms_error *err) {
    ms_k_bmm_forward(g, H(c), H(a), H(b));
    return OK;
}
static ms_status h_bmm_backward(ms_kctx *kc, const ms_k_bmm *g, float *da, float *db,
                                const float *dc, const float *a, const float *b, ms_error *err) {
    ms_k_bmm_backward(g, H(da), H(db), H(dc), H(a), H(b));
    return OK;
}
static ms_status h_pointwise_loss_forward(ms_kctx *kc, ms_k_loss kind, float *out, const float *a,
                                          const float *b, int64_t n, float delta, float scale,
                                          ms_error *err) {
    ms_k_pointwise_loss_forward(kind, H(out), H(a), H(b), n, delta, scale);
    return OK;
}
static ms_status h_pointwise_loss_backward(ms_kctx *kc, ms_k_loss kind, float *da, float *db,
                                           const float *a, const float *b, const float *dout,
                                           int64_t n, float delta, float scale, ms_error *err) {
    ms_k_pointwise_loss_backward_dev(kind, H(da), H(db), H(a), H(b), H(dout), n, delta, scale);
    return OK;
}
static ms_status h_nll_forward(ms_kctx *kc, float *losses, const float *logp,
                               const int32_t *targets, int64_t n, int64_t vl, int64_t v0,
                               ms_error *err) {
    ms_k_nll_forward(H(losses), H(logp), H(targets), n, vl, v0);
    return OK;
}
static ms_status h_nll_backward(ms_kctx *kc, float *dlogp, const float *dlosses,
                                const int32_t *targets, int64_t n, int64_t vl, int64_t v0,
                                ms_error *err) {
    ms_k_nll_backward(H(dlogp), H(dlosses), H(targets), n, vl, v0);
    return OK;
}
static ms_status h_xent_smooth_forward(ms_kctx *kc, float *losses, float *lse, const float *logits,
                                       const int32_t *targets, int64_t n, int64_t v, float s,
                                       ms_error *err) {
    ms_k_xent_smooth_forward(H(losses), H(lse), H(logits), H(targets), n, v, s);
    return OK;
}
static ms_status h_xent_smooth_backward(ms_kctx *kc, float *dlogits, const float *logits,
                                        const float *lse, const int32_t *targets,
                                        const float *dlosses, int64_t n, int64_t v, float s,
                                        ms_error *err) {
    ms_k_xent_smooth_backward(H(dlogits), H(logits), H(lse), H(targets), H(dlosses), n, v, s);
    return OK;
}

/* ---- sum ---- */
static ms_status h_sum_forward(ms_kctx *kc, float *out, const float *inp, int64_t o, int64_t d,
                               int64_t i, ms_error *err) {
    ms_k_sum_forward(H(out), H(inp), o, d, i);
    return OK;
}
static ms_status h_sum_backward(ms_kctx *kc, float *dinp, const float *dout, float f, int64_t o,
                                int64_t d, int64_t i, ms_error *err) {
    float *dx = H(dinp);
    const float *dy = H(dout);
    for (int64_t a = 0; a < o; a++)
        for (int64_t b = 0; b < d; b++)
            for (int64_t e = 0; e < i; e++) dx[(a * d + b) * i + e] += f * dy[a * i + e];
    return OK;
}

/* ---- fused chains, gather ---- */
static ms_status h_bias_gelu_forward(ms_kctx *kc, float *out, const float *inp, const float *bias,
                                     int64_t n, int64_t c, ms_error *err) {
    ms_k_bias_gelu_forward(H(out), H(inp), H(bias), n, c);
    return OK;
}
static ms_status h_bias_gelu_backward(ms_kctx *kc, float *dinp, float *dbias, const float *dout,
                                      const float *inp, const float *bias, int64_t n, int64_t c,
                                      unsigned fresh, ms_error *err) {
    if (fresh & 1u) zero_floats(H(dinp), n * c);
    ms_k_bias_gelu_backward(H(dinp), H(dbias), H(dout), H(inp), H(bias), n, c);
    return OK;
}
static ms_status h_bias_dropout_add_forward(ms_kctx *kc, float *out, const float *inp,
                                            const float *bias, const float *res, int64_t nb,
                                            const ms_k_fused_dropout *d, ms_error *err) {
    ms_k_bias_dropout_add_forward(H(out), H(inp), H(bias), H(res), nb, d);
    return OK;
}
static ms_status h_bias_dropout_add_backward(ms_kctx *kc, float *dinp, float *dbias, float *dres,
                                             const float *dout, int64_t nb,
                                             const ms_k_fused_dropout *d, unsigned fresh,
                                             ms_error *err) {
    const int64_t n = numel_of(d->box.ndim, d->box.lshape);
    if (fresh & 1u) zero_floats(H(dinp), n);
    if (fresh & 4u) zero_floats(H(dres), n);
    ms_k_bias_dropout_add_backward(H(dinp), H(dbias), H(dres), H(dout), nb, d);
    return OK;
}
static ms_status h_gather(ms_kctx *kc, float *out, const float *x, const float *ids,
                          const ms_k_gather_dims *g, bool accumulate, ms_error *err) {
    ms_k_gather(H(out), H(x), H(ids), g, accumulate);
    return OK;
}
static ms_status h_scatter_add(ms_kctx *kc, float *x, const float *src, const float *ids,
                               const ms_k_gather_dims *g, ms_error *err) {
    ms_k_scatter_add(H(x), H(src), H(ids), g);
    return OK;
}

/* ---- normalisation and softmax ---- */
static ms_status h_layernorm_forward(ms_kctx *kc, float *out, float *mean, float *rstd,
                                     const float *inp, const float *weight, const float *bias,
                                     int64_t n, int64_t c, float eps, ms_error *err) {
    ms_k_layernorm_forward(H(out), H(mean), H(rstd), H(inp), H(weight), H(bias), n, c, eps);
    return OK;
}
static ms_status h_layernorm_backward(ms_kctx *kc, float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp, const float *weight,
                                      const float *mean, const float *rstd, int64_t n, int64_t c,
                                      ms_error *err) {
    ms_k_layernorm_backward(H(dinp), H(dweight), H(dbias), H(dout), H(inp), H(weight), H(mean),
                            H(rstd), n, c);
    return OK;
}
static ms_status h_softmax_forward(ms_kctx *kc, float *out, const float *inp, int64_t n, int64_t c,
                                   ms_error *err) {
    ms_k_softmax_forward(H(out), H(inp), n, c);
    return OK;
}
static ms_status h_softmax_backward(ms_kctx *kc, float *dinp, const float *dout, const float *out,
                                    int64_t n, int64_t c, ms_error *err) {
    ms_k_softmax_backward(H(dinp), H(dout), H(out), n, c);
    return OK;
}

/* ---- attention: the CPU kernel saves the probabilities ---- */
static int64_t h_attention_saved_floats(int64_t b, int64_t t, int64_t c, int64_t nh) {
    (void)c;
    return b * nh * t * t;
}
static int64_t h_attention_scratch_floats(int64_t b, int64_t t, int64_t nh) {
    (void)b, (void)nh;
    return ms_k_attention_scratch_floats(t);
}
static ms_status h_attention_forward(ms_kctx *kc, float *out, float *saved, float *work,
                                     const float *qkv, const float *mask, int64_t b, int64_t t,
                                     int64_t c, int64_t nh, bool causal,
                                     const ms_k_attn_dropout *drop, ms_error *err) {
    ms_k_attention_forward(H(out), H(saved), H(work), H(qkv), H(mask), b, t, c, nh, causal, drop);
    return OK;
}
static ms_status h_attention_backward(ms_kctx *kc, float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *saved, const float *mask,
                                      int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                                      unsigned fresh, const ms_k_attn_dropout *drop,
                                      ms_error *err) {
    (void)mask; /* its effect is in the saved probabilities */
    if (fresh & 1u) zero_floats(H(dqkv), 3 * b * t * c);
    ms_k_attention_backward(H(dqkv), H(scratch), H(dout), H(qkv), H(saved), b, t, c, nh, causal,
                            drop);
    return OK;
}

/* ---- the LLaMA layers ---- */
static ms_status h_rmsnorm_forward(ms_kctx *kc, float *out, float *rstd, const float *inp,
                                   const float *weight, int64_t n, int64_t c, float eps,
                                   ms_error *err) {
    ms_k_rmsnorm_forward(H(out), H(rstd), H(inp), H(weight), n, c, eps);
    return OK;
}
static ms_status h_rmsnorm_backward(ms_kctx *kc, float *dinp, float *dweight, const float *dout,
                                    const float *inp, const float *weight, const float *rstd,
                                    int64_t n, int64_t c, ms_error *err) {
    ms_k_rmsnorm_backward(H(dinp), H(dweight), H(dout), H(inp), H(weight), H(rstd), n, c);
    return OK;
}
static ms_status h_swiglu_forward(ms_kctx *kc, float *out, const float *gate, const float *up,
                                  int64_t n, ms_error *err) {
    ms_k_swiglu_forward(H(out), H(gate), H(up), n);
    return OK;
}
static ms_status h_swiglu_backward(ms_kctx *kc, float *dgate, float *dup, const float *dout,
                                   const float *gate, const float *up, int64_t n, ms_error *err) {
    ms_k_swiglu_backward(H(dgate), H(dup), H(dout), H(gate), H(up), n);
    return OK;
}
static ms_status h_rotary_tables(ms_kctx *kc, float *cosb, float *sinb, int64_t t, int64_t t0,
                                 int64_t d, float theta, ms_error *err) {
    ms_k_rotary_tables(H(cosb), H(sinb), t, t0, d, theta);
    return OK;
}
static ms_status h_rotary_apply(ms_kctx *kc, float *out, const float *inp, const float *cosb,
                                const float *sinb, int64_t b, int64_t t, int64_t h, int64_t d,
                                bool inverse, ms_error *err) {
    ms_k_rotary_apply(H(out), H(inp), H(cosb), H(sinb), b, t, h, d, inverse);
    return OK;
}

/* ---- grouped-query attention: the CPU kernel saves the probabilities ---- */
static int64_t h_gqa_saved_floats(const ms_k_gqa *g) {
    return g->b * g->h * g->tq * g->tk;
}
static int64_t h_gqa_scratch_floats(const ms_k_gqa *g) {
    return ms_k_gqa_scratch_floats(g);
}
static ms_status h_gqa_forward(ms_kctx *kc, const ms_k_gqa *g, float *out, float *saved,
                               const float *q, const float *k, const float *v, const float *mask,
                               ms_error *err) {
    ms_k_gqa_forward(g, H(out), H(saved), H(q), H(k), H(v), H(mask));
    return OK;
}
static ms_status h_gqa_backward(ms_kctx *kc, const ms_k_gqa *g, float *dq, float *dk, float *dv,
                                float *scratch, const float *dout, const float *q, const float *k,
                                const float *v, const float *saved, const float *mask,
                                ms_error *err) {
    (void)mask; /* its effect is in the saved probabilities */
    ms_k_gqa_backward(g, H(dq), H(dk), H(dv), H(scratch), H(dout), H(q), H(k), H(v), H(saved));
    return OK;
}

/* ---- embedding and cross-entropy ---- */
static ms_status h_embedding_forward(ms_kctx *kc, float *out, const int32_t *ids,
                                     const float *table, int64_t n, int64_t c, int64_t v0,
                                     int64_t vl, ms_error *err) {
    ms_k_embedding_forward(H(out), H(ids), H(table), n, c, v0, vl);
    return OK;
}
static ms_status h_embedding_backward(ms_kctx *kc, float *dtable, const int32_t *ids,
                                      const float *dout, int64_t n, int64_t c, int64_t v0,
                                      int64_t vl, ms_error *err) {
    ms_k_embedding_backward(H(dtable), H(ids), H(dout), n, c, v0, vl);
    return OK;
}
static ms_status h_xent_vp_rowmax(ms_kctx *kc, float *lmax, const float *logits, int64_t n,
                                  int64_t vl, ms_error *err) {
    ms_k_xent_vp_rowmax(H(lmax), H(logits), n, vl);
    return OK;
}
static ms_status h_xent_vp_sumexp(ms_kctx *kc, float *lsum, const float *logits, const float *gmax,
                                  int64_t n, int64_t vl, ms_error *err) {
    ms_k_xent_vp_sumexp(H(lsum), H(logits), H(gmax), n, vl);
    return OK;
}
static ms_status h_xent_vp_target(ms_kctx *kc, float *ltgt, const float *logits,
                                  const int32_t *targets, int64_t n, int64_t vl, int64_t v0,
                                  ms_error *err) {
    ms_k_xent_vp_target(H(ltgt), H(logits), H(targets), n, vl, v0);
    return OK;
}
static ms_status h_xent_vp_loss(ms_kctx *kc, float *losses, const float *gmax, const float *gsum,
                                const float *gtgt, const int32_t *targets, int64_t n,
                                ms_error *err) {
    ms_k_xent_vp_loss(H(losses), H(gmax), H(gsum), H(gtgt), H(targets), n);
    return OK;
}
static ms_status h_xent_vp_backward(ms_kctx *kc, float *dlogits, const float *logits,
                                    const float *gmax, const float *gsum, const int32_t *targets,
                                    const float *dlosses, int64_t n, int64_t vl, int64_t v0,
                                    unsigned fresh, ms_error *err) {
    if (fresh & 1u) zero_floats(H(dlogits), n * vl);
    ms_k_xent_vp_backward(H(dlogits), H(logits), H(gmax), H(gsum), H(targets), H(dlosses), n, vl,
                          v0);
    return OK;
}

/* ---- dropout ---- */
static ms_status h_dropout_forward(ms_kctx *kc, float *out, const float *inp, float p,
                                   uint64_t seed, uint64_t stream, int ndim, const int64_t *lshape,
                                   const int64_t *gstart, const int64_t *gshape,
                                   const ms_k_batch_window *w, ms_error *err) {
    ms_k_dropout_forward(H(out), H(inp), p, seed, stream, ndim, lshape, gstart, gshape, w);
    return OK;
}
static ms_status h_dropout_backward(ms_kctx *kc, float *dinp, const float *dout, float p,
                                    uint64_t seed, uint64_t stream, int ndim, const int64_t *lshape,
                                    const int64_t *gstart, const int64_t *gshape,
                                    const ms_k_batch_window *w, ms_error *err) {
    ms_k_dropout_backward(H(dinp), H(dout), p, seed, stream, ndim, lshape, gstart, gshape, w);
    return OK;
}

/* ---- optimizer ---- */
static ms_status h_adamw_step(ms_kctx *kc, float *p, const float *g, float *m, float *v, size_t n,
                              const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err) {
    return ms_adamw_step_scaled(H(p), H(g), H(m), H(v), n, o, t, grad_scale, err);
}
static ms_status h_adamw_step_bf16_grad(ms_kctx *kc, float *p, const uint16_t *g, float *m,
                                        float *v, size_t n, const ms_adamw_opts *o, int64_t t,
                                        float grad_scale, ms_error *err) {
    return ms_adamw_step_bf16_grad(H(p), H(g), H(m), H(v), n, o, t, grad_scale, err);
}
static ms_status h_adamw_list(ms_kctx *kc, const ms_k_adamw_item *x, int n, const ms_adamw_opts *o,
                              int64_t t, float grad_scale, ms_error *err) {
    for (int i = 0; i < n; i++)
        MS_CHECK(x[i].g_bf16 ? ms_adamw_step_bf16_grad(H(x[i].p), H(x[i].g), H(x[i].m), H(x[i].v),
                                                       x[i].n, o, t, grad_scale, err)
                             : ms_adamw_step_scaled(H(x[i].p), H(x[i].g), H(x[i].m), H(x[i].v),
                                                    x[i].n, o, t, grad_scale, err));
    return MS_OK;
}
static ms_status h_sumsq(ms_kctx *kc, double *host_out, const float *x, size_t n, ms_error *err) {
    *host_out = ms_sumsq_f32(H(x), n);
    return OK;
}
static ms_status h_sumsq_bf16(ms_kctx *kc, double *host_out, const uint16_t *x, size_t n,
                              ms_error *err) {
    *host_out = ms_sumsq_bf16(H(x), n);
    return OK;
}
static ms_status h_sumsq_list(ms_kctx *kc, double *host_out, const ms_k_span *x, int n,
                              ms_error *err) {
    for (int i = 0; i < n; i++)
        host_out[i] =
            x[i].bf16 ? ms_sumsq_bf16(H(x[i].data), x[i].n) : ms_sumsq_f32(H(x[i].data), x[i].n);
    return OK;
}
static ms_status h_scale_inplace(ms_kctx *kc, float *x, size_t n, float s, ms_error *err) {
    ms_scale_f32(H(x), n, s);
    return OK;
}

/* -- conv -- */
static int64_t h_conv_scratch_floats(const ms_k_conv *g) {
    return ms_k_conv_scratch_floats(g);
}
static ms_status h_conv_forward(ms_kctx *kc, const ms_k_conv *g, float *out, float *col,
                                const float *x, const float *w, const float *bias, ms_error *err) {
    ms_k_conv_forward(g, H(out), H(col), H(x), H(w), H(bias));
    return OK;
}
static ms_status h_conv_backward(ms_kctx *kc, const ms_k_conv *g, float *dx, float *dw,
                                 float *dbias, float *col, const float *dout, const float *x,
                                 const float *w, unsigned fresh, ms_error *err) {
    const int64_t cout = g->groups * g->cout_g;
    if (fresh & 2u) zero_floats(H(dw), cout * g->cin_g * g->kh * g->kw);
    if (fresh & 4u) zero_floats(H(dbias), cout);
    ms_k_conv_backward(g, H(dx), H(dw), H(dbias), H(col), H(dout), H(x), H(w), (fresh & 1u) != 0);
    return OK;
}
/* clang-format off */
#define CONV_SLOTS                                \
    .conv_scratch_floats = h_conv_scratch_floats, \
    .conv_forward = h_conv_forward,               \
    .conv_backward = h_conv_backward
/* clang-format on */
/* -- end conv -- */

/* -- pool -- */
static ms_status h_pool_forward(ms_kctx *kc, const ms_k_pool *g, float *out, int32_t *idx,
                                const float *inp, ms_error *err) {
    ms_k_pool_forward(g, H(out), H(idx), H(inp));
    return OK;
}
static ms_status h_pool_backward(ms_kctx *kc, const ms_k_pool *g, float *dinp, const float *dout,
                                 const int32_t *idx, ms_error *err) {
    ms_k_pool_backward(g, H(dinp), H(dout), H(idx));
    return OK;
}
static ms_status h_group_norm_forward(ms_kctx *kc, const ms_k_gnorm *g, float *out, float *mean,
                                      float *rstd, const float *inp, const float *weight,
                                      const float *bias, ms_error *err) {
    ms_k_group_norm_forward(g, H(out), H(mean), H(rstd), H(inp), H(weight), H(bias));
    return OK;
}
static ms_status h_group_norm_backward(ms_kctx *kc, const ms_k_gnorm *g, float *dinp,
                                       float *dweight, float *dbias, float *scratch,
                                       const float *dout, const float *inp, const float *weight,
                                       const float *mean, const float *rstd, ms_error *err) {
    ms_k_group_norm_backward(g, H(dinp), H(dweight), H(dbias), H(scratch), H(dout), H(inp),
                             H(weight), H(mean), H(rstd));
    return OK;
}
static ms_status h_resize_forward(ms_kctx *kc, const ms_k_resize *g, float *out, const float *inp,
                                  ms_error *err) {
    ms_k_resize_forward(g, H(out), H(inp));
    return OK;
}
static ms_status h_resize_backward(ms_kctx *kc, const ms_k_resize *g, float *dinp,
                                   const float *dout, ms_error *err) {
    ms_k_resize_backward(g, H(dinp), H(dout));
    return OK;
}
/* clang-format off */
#define POOL_SLOTS                                  \
    .pool_forward = h_pool_forward,                 \
    .pool_backward = h_pool_backward,               \
    .group_norm_forward = h_group_norm_forward,     \
    .group_norm_backward = h_group_norm_backward,   \
    .resize_forward = h_resize_forward,             \
    .resize_backward = h_resize_backward
/* clang-format on */
/* -- end pool -- */

/* clang-format off */
#define HOST_SLOTS                                            \
    .sync = host_sync,                                        \
    .fill = h_fill,                                           \
    .accumulate = h_accumulate,                               \
    .bf16_accumulate = h_bf16_accumulate,                     \
    .bf16_widen = h_bf16_widen,                               \
    .bf16_round = h_bf16_round,                               \
    .bf16_round_list = h_bf16_round_list,                     \
    .ids_from_floats = h_ids_from_floats,                     \
    .matmul_forward = h_matmul_forward,                       \
    .matmul_backward = h_matmul_backward,                     \
    .add_forward = h_add_forward,                             \
    .add_backward = h_add_backward,                           \
    .mul_forward = h_mul_forward,                             \
    .mul_backward = h_mul_backward,                           \
    .scale_forward = h_scale_forward,                         \
    .scale_backward = h_scale_backward,                       \
    .bias_add_forward = h_bias_add_forward,                   \
    .bias_add_backward = h_bias_add_backward,                 \
    .gelu_forward = h_gelu_forward,                           \
    .gelu_backward = h_gelu_backward,                         \
    .copy = h_copy,                                           \
    .unary_forward = h_unary_forward,                         \
    .unary_backward = h_unary_backward,                       \
    .binary_forward = h_binary_forward,                       \
    .binary_backward = h_binary_backward,                     \
    .ternary_forward = h_ternary_forward,                     \
    .ternary_backward = h_ternary_backward,                   \
    .reduce_forward = h_reduce_forward,                       \
    .reduce_backward = h_reduce_backward,                     \
    .view_forward = h_view_forward,                           \
    .view_backward = h_view_backward,                         \
    .block_copy = h_block_copy,                               \
    .scan_forward = h_scan_forward,                           \
    .scan_backward = h_scan_backward,                         \
    .triangle = h_triangle,                                   \
    .masked_fill_forward = h_masked_fill_forward,             \
    .masked_fill_backward = h_masked_fill_backward,           \
    .one_hot = h_one_hot,                                     \
    .sort_rows = h_sort_rows,                                 \
    .sort_rows_backward = h_sort_rows_backward,               \
    .rows_forward = h_rows_forward,                           \
    .rows_backward = h_rows_backward,                         \
    .bmm_forward = h_bmm_forward,                             \
    .bmm_backward = h_bmm_backward,                           \
    .pointwise_loss_forward = h_pointwise_loss_forward,       \
    .pointwise_loss_backward = h_pointwise_loss_backward,     \
    .nll_forward = h_nll_forward,                             \
    .nll_backward = h_nll_backward,                           \
    .xent_smooth_forward = h_xent_smooth_forward,             \
    .xent_smooth_backward = h_xent_smooth_backward,           \
    .sum_forward = h_sum_forward,                             \
    .sum_backward = h_sum_backward,                           \
    .bias_gelu_forward = h_bias_gelu_forward,                 \
    .bias_gelu_backward = h_bias_gelu_backward,               \
    .bias_dropout_add_forward = h_bias_dropout_add_forward,   \
    .bias_dropout_add_backward = h_bias_dropout_add_backward, \
    .gather = h_gather,                                       \
    .scatter_add = h_scatter_add,                             \
    .layernorm_forward = h_layernorm_forward,                 \
    .layernorm_backward = h_layernorm_backward,               \
    .softmax_forward = h_softmax_forward,                     \
    .softmax_backward = h_softmax_backward,                   \
    .attention_saved_floats = h_attention_saved_floats,       \
    .attention_scratch_floats = h_attention_scratch_floats,   \
    .attention_forward = h_attention_forward,                 \
    .attention_backward = h_attention_backward,               \
    .rmsnorm_forward = h_rmsnorm_forward,                     \
    .rmsnorm_backward = h_rmsnorm_backward,                   \
    .swiglu_forward = h_swiglu_forward,                       \
    .swiglu_backward = h_swiglu_backward,                     \
    .rotary_tables = h_rotary_tables,                         \
    .rotary_apply = h_rotary_apply,                           \
    .gqa_saved_floats = h_gqa_saved_floats,                   \
    .gqa_scratch_floats = h_gqa_scratch_floats,               \
    .gqa_forward = h_gqa_forward,                             \
    .gqa_backward = h_gqa_backward,                           \
    .embedding_forward = h_embedding_forward,                 \
    .embedding_backward = h_embedding_backward,               \
    .xent_vp_rowmax = h_xent_vp_rowmax,                       \
    .xent_vp_sumexp = h_xent_vp_sumexp,                       \
    .xent_vp_target = h_xent_vp_target,                       \
    .xent_vp_loss = h_xent_vp_loss,                           \
    .xent_vp_backward = h_xent_vp_backward,                   \
    .dropout_forward = h_dropout_forward,                     \
    .dropout_backward = h_dropout_backward,                   \
    .adamw_step = h_adamw_step,                               \
    .adamw_step_bf16_grad = h_adamw_step_bf16_grad,           \
    .adamw_list = h_adamw_list,                               \
    .sumsq = h_sumsq,                                         \
    .sumsq_bf16 = h_sumsq_bf16,                               \
    .sumsq_list = h_sumsq_list,                               \
    .scale_inplace = h_scale_inplace,                         \
    CONV_SLOTS,                                               \
    POOL_SLOTS
/* clang-format on */

/* ---- the fenced device's bf16 kernels ----
 * Widened into host scratch, the fp32 kernel, rounded back: what the program's staging does,
 * so the program's unstaged bf16 path (taken where a table has these slots, as CUDA's does)
 * is checked against the staged one bit for bit without a GPU. The CPU table leaves them out:
 * without bf16 arithmetic in its cores, staging once per instruction is the cheaper way. */

/* One call's bf16 operands as fp32 host copies; wide_done rounds the written ones back once. */
#define WIDE_MAX 6 /* the most bf16 operands of one slot: layernorm_backward_bf16's */
typedef struct wide_set {
    float *w[WIDE_MAX];
    uint16_t *back[WIDE_MAX]; /* host address to round into, or NULL for an operand only read */
    int64_t n[WIDE_MAX];
    int k;
} wide_set;

/* x (host address, or NULL: the operand is absent and so is its copy) as fp32; read: widen
 * its values (else the kernel overwrites them); write: round back in wide_done. */
static float *wide(wide_set *s, const uint16_t *x, int64_t n, bool read, bool write) {
    if (!x) return NULL;
    if (s->k == WIDE_MAX) ms_panic("fenced bf16 kernel: more than %d bf16 operands", WIDE_MAX);
    float *w = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    if (read) ms_k_bf16_widen(w, x, n);
    s->w[s->k] = w, s->back[s->k] = write ? (uint16_t *)x : NULL, s->n[s->k++] = n;
    return w;
}
#define WIN(x, n)  wide(&ws, H(x), (n), true, false) /* read */
#define WOUT(x, n) wide(&ws, H(x), (n), false, true) /* overwritten */
#define WACC(x, n) wide(&ws, H(x), (n), true, true)  /* accumulated into */
/* a gradient accumulated into, or when fresh (backend.h) written whole: zeros to add to */
#define WGRAD(x, n, fresh) ((fresh) ? wide_zeros(&ws, H(x), (n)) : WACC(x, n))

static float *wide_zeros(wide_set *s, uint16_t *x, int64_t n) {
    float *w = wide(s, x, n, false, true);
    if (w && n > 0) memset(w, 0, sizeof *w * (size_t)n);
    return w;
}

static void wide_done(wide_set *s) {
    for (int i = 0; i < s->k; i++) {
        if (s->back[i]) ms_k_bf16_round(s->back[i], s->w[i], s->n[i]);
        free(s->w[i]);
    }
}

static int64_t gemm_a_numel(const ms_k_gemm *g) {
    return (g->bcast_a ? 1 : g->batch) * g->m * g->k;
}
static int64_t gemm_b_numel(const ms_k_gemm *g) {
    return (g->bcast_b ? 1 : g->batch) * g->k * g->n;
}
static ms_status f_matmul_forward_bf16(ms_kctx *kc, const ms_k_gemm *g, uint16_t *c,
                                       const uint16_t *a, const uint16_t *b, float alpha,
                                       float beta, ms_error *err) {
    wide_set ws = {0};
    int64_t nc = g->batch * g->m * g->n;
    float *wa = WIN(a, gemm_a_numel(g)), *wb = WIN(b, gemm_b_numel(g));
    float *wc = beta != 0 ? WACC(c, nc) : WOUT(c, nc);
    ms_k_matmul_forward(g, wc, wa, wb, alpha, beta);
    wide_done(&ws);
    return OK;
}
static ms_status f_matmul_backward_bf16(ms_kctx *kc, const ms_k_gemm *g, uint16_t *da, uint16_t *db,
                                        const uint16_t *dc, const uint16_t *a, const uint16_t *b,
                                        float alpha, bool accumulate, ms_error *err) {
    wide_set ws = {0};
    int64_t na = gemm_a_numel(g), nb = gemm_b_numel(g);
    float *wa = WIN(a, na), *wb = WIN(b, nb), *wdc = WIN(dc, g->batch * g->m * g->n);
    float *wda = accumulate ? WACC(da, na) : WOUT(da, na);
    float *wdb = accumulate ? WACC(db, nb) : WOUT(db, nb);
    ms_k_matmul_backward(g, wda, wdb, wdc, wa, wb, alpha, accumulate);
    wide_done(&ws);
    return OK;
}
static ms_status f_add_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *a,
                                    const uint16_t *b, int64_t n, ms_error *err) {
    wide_set ws = {0};
    ms_k_add_forward(WOUT(out, n), WIN(a, n), WIN(b, n), n);
    wide_done(&ws);
    return OK;
}
static ms_status f_add_backward_bf16(ms_kctx *kc, uint16_t *da, uint16_t *db, const uint16_t *dout,
                                     int64_t n, ms_error *err) {
    wide_set ws = {0};
    ms_k_add_backward(WACC(da, n), WACC(db, n), WIN(dout, n), n);
    wide_done(&ws);
    return OK;
}
static ms_status f_bias_add_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp,
                                         const uint16_t *bias, int64_t n, int64_t c,
                                         ms_error *err) {
    wide_set ws = {0};
    ms_k_bias_add_forward(WOUT(out, n * c), WIN(inp, n * c), WIN(bias, c), n, c);
    wide_done(&ws);
    return OK;
}
static ms_status f_bias_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                          const uint16_t *dout, int64_t n, int64_t c,
                                          unsigned fresh, ms_error *err) {
    wide_set ws = {0};
    ms_k_bias_add_backward(WGRAD(dinp, n * c, fresh & 1u), WACC(dbias, c), WIN(dout, n * c), n, c);
    wide_done(&ws);
    return OK;
}
static ms_status f_gelu_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp, int64_t n,
                                     ms_error *err) {
    wide_set ws = {0};
    ms_k_gelu_forward(WOUT(out, n), WIN(inp, n), n);
    wide_done(&ws);
    return OK;
}
static ms_status f_gelu_backward_bf16(ms_kctx *kc, uint16_t *dinp, const uint16_t *inp,
                                      const uint16_t *dout, int64_t n, ms_error *err) {
    wide_set ws = {0};
    ms_k_gelu_backward(WACC(dinp, n), WIN(inp, n), WIN(dout, n), n);
    wide_done(&ws);
    return OK;
}
static ms_status f_bias_gelu_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp,
                                          const uint16_t *bias, int64_t n, int64_t c,
                                          ms_error *err) {
    wide_set ws = {0};
    ms_k_bias_gelu_forward(WOUT(out, n * c), WIN(inp, n * c), WIN(bias, c), n, c);
    wide_done(&ws);
    return OK;
}
static ms_status f_bias_gelu_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                           const uint16_t *dout, const uint16_t *inp,
                                           const uint16_t *bias, int64_t n, int64_t c,
                                           unsigned fresh, ms_error *err) {
    wide_set ws = {0};
    ms_k_bias_gelu_backward(WGRAD(dinp, n * c, fresh & 1u), WACC(dbias, c), WIN(dout, n * c),
                            WIN(inp, n * c), WIN(bias, c), n, c);
    wide_done(&ws);
    return OK;
}
static ms_status f_bias_dropout_add_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp,
                                                 const uint16_t *bias, const uint16_t *res,
                                                 int64_t nb, const ms_k_fused_dropout *d,
                                                 ms_error *err) {
    wide_set ws = {0};
    int64_t n = numel_of(d->box.ndim, d->box.lshape);
    ms_k_bias_dropout_add_forward(WOUT(out, n), WIN(inp, n), WIN(bias, nb), WIN(res, n), nb, d);
    wide_done(&ws);
    return OK;
}
static ms_status f_bias_dropout_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                                  uint16_t *dres, const uint16_t *dout, int64_t nb,
                                                  const ms_k_fused_dropout *d, unsigned fresh,
                                                  ms_error *err) {
    wide_set ws = {0};
    int64_t n = numel_of(d->box.ndim, d->box.lshape);
    ms_k_bias_dropout_add_backward(WGRAD(dinp, n, fresh & 1u), WACC(dbias, nb),
                                   WGRAD(dres, n, fresh & 4u), WIN(dout, n), nb, d);
    wide_done(&ws);
    return OK;
}
static ms_status f_layernorm_forward_bf16(ms_kctx *kc, uint16_t *out, float *mean, float *rstd,
                                          const uint16_t *inp, const uint16_t *weight,
                                          const uint16_t *bias, int64_t n, int64_t c, float eps,
                                          ms_error *err) {
    wide_set ws = {0};
    ms_k_layernorm_forward(WOUT(out, n * c), H(mean), H(rstd), WIN(inp, n * c), WIN(weight, c),
                           WIN(bias, c), n, c, eps);
    wide_done(&ws);
    return OK;
}
static ms_status f_layernorm_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dweight,
                                           uint16_t *dbias, const uint16_t *dout,
                                           const uint16_t *inp, const uint16_t *weight,
                                           const float *mean, const float *rstd, int64_t n,
                                           int64_t c, ms_error *err) {
    wide_set ws = {0};
    ms_k_layernorm_backward(WACC(dinp, n * c), WACC(dweight, c), WACC(dbias, c), WIN(dout, n * c),
                            WIN(inp, n * c), WIN(weight, c), H(mean), H(rstd), n, c);
    wide_done(&ws);
    return OK;
}
static ms_status f_attention_forward_bf16(ms_kctx *kc, uint16_t *out, float *saved, float *work,
                                          const uint16_t *qkv, const float *mask, int64_t b,
                                          int64_t t, int64_t c, int64_t nh, bool causal,
                                          const ms_k_attn_dropout *drop, ms_error *err) {
    wide_set ws = {0};
    ms_k_attention_forward(WOUT(out, b * t * c), H(saved), H(work), WIN(qkv, b * t * 3 * c),
                           H(mask), b, t, c, nh, causal, drop);
    wide_done(&ws);
    return OK;
}
static ms_status f_attention_backward_bf16(ms_kctx *kc, uint16_t *dqkv, float *scratch,
                                           const uint16_t *dout, const uint16_t *qkv,
                                           const float *saved, const float *mask, int64_t b,
                                           int64_t t, int64_t c, int64_t nh, bool causal,
                                           unsigned fresh, const ms_k_attn_dropout *drop,
                                           ms_error *err) {
    (void)mask; /* its effect is in the saved probabilities */
    wide_set ws = {0};
    ms_k_attention_backward(WGRAD(dqkv, b * t * 3 * c, fresh & 1u), H(scratch),
                            WIN(dout, b * t * c), WIN(qkv, b * t * 3 * c), H(saved), b, t, c, nh,
                            causal, drop);
    wide_done(&ws);
    return OK;
}
static ms_status f_xent_vp_rowmax_bf16(ms_kctx *kc, float *lmax, const uint16_t *logits, int64_t n,
                                       int64_t vl, ms_error *err) {
    wide_set ws = {0};
    ms_k_xent_vp_rowmax(H(lmax), WIN(logits, n * vl), n, vl);
    wide_done(&ws);
    return OK;
}
static ms_status f_xent_vp_sumexp_bf16(ms_kctx *kc, float *lsum, const uint16_t *logits,
                                       const float *gmax, int64_t n, int64_t vl, ms_error *err) {
    wide_set ws = {0};
    ms_k_xent_vp_sumexp(H(lsum), WIN(logits, n * vl), H(gmax), n, vl);
    wide_done(&ws);
    return OK;
}
static ms_status f_xent_vp_target_bf16(ms_kctx *kc, float *ltgt, const uint16_t *logits,
                                       const int32_t *targets, int64_t n, int64_t vl, int64_t v0,
                                       ms_error *err) {
    wide_set ws = {0};
    ms_k_xent_vp_target(H(ltgt), WIN(logits, n * vl), H(targets), n, vl, v0);
    wide_done(&ws);
    return OK;
}
static ms_status f_xent_vp_backward_bf16(ms_kctx *kc, uint16_t *dlogits, const uint16_t *logits,
                                         const float *gmax, const float *gsum,
                                         const int32_t *targets, const uint16_t *dlosses, int64_t n,
                                         int64_t vl, int64_t v0, unsigned fresh, ms_error *err) {
    wide_set ws = {0};
    ms_k_xent_vp_backward(WGRAD(dlogits, n * vl, fresh & 1u), WIN(logits, n * vl), H(gmax), H(gsum),
                          H(targets), WIN(dlosses, n), n, vl, v0);
    wide_done(&ws);
    return OK;
}
static ms_status f_dropout_forward_bf16(ms_kctx *kc, uint16_t *out, const uint16_t *inp, float p,
                                        uint64_t seed, uint64_t stream, int ndim,
                                        const int64_t *lshape, const int64_t *gstart,
                                        const int64_t *gshape, const ms_k_batch_window *w,
                                        ms_error *err) {
    wide_set ws = {0};
    int64_t n = numel_of(ndim, lshape);
    ms_k_dropout_forward(WOUT(out, n), WIN(inp, n), p, seed, stream, ndim, lshape, gstart, gshape,
                         w);
    wide_done(&ws);
    return OK;
}
static ms_status f_dropout_backward_bf16(ms_kctx *kc, uint16_t *dinp, const uint16_t *dout, float p,
                                         uint64_t seed, uint64_t stream, int ndim,
                                         const int64_t *lshape, const int64_t *gstart,
                                         const int64_t *gshape, const ms_k_batch_window *w,
                                         ms_error *err) {
    wide_set ws = {0};
    int64_t n = numel_of(ndim, lshape);
    ms_k_dropout_backward(WACC(dinp, n), WIN(dout, n), p, seed, stream, ndim, lshape, gstart,
                          gshape, w);
    wide_done(&ws);
    return OK;
}
static ms_status f_embedding_forward_bf16(ms_kctx *kc, uint16_t *out, const int32_t *ids,
                                          const uint16_t *table, int64_t n, int64_t c, int64_t v0,
                                          int64_t vl, ms_error *err) {
    wide_set ws = {0};
    ms_k_embedding_forward(WOUT(out, n * c), H(ids), WIN(table, vl * c), n, c, v0, vl);
    wide_done(&ws);
    return OK;
}
static ms_status f_embedding_backward_bf16(ms_kctx *kc, uint16_t *dtable, const int32_t *ids,
                                           const uint16_t *dout, int64_t n, int64_t c, int64_t v0,
                                           int64_t vl, ms_error *err) {
    wide_set ws = {0};
    ms_k_embedding_backward(WACC(dtable, vl * c), H(ids), WIN(dout, n * c), n, c, v0, vl);
    wide_done(&ws);
    return OK;
}

/* clang-format off */
#define BF16_SLOTS                                                      \
    .matmul_forward_bf16 = f_matmul_forward_bf16,                       \
    .matmul_backward_bf16 = f_matmul_backward_bf16,                     \
    .add_forward_bf16 = f_add_forward_bf16,                             \
    .add_backward_bf16 = f_add_backward_bf16,                           \
    .bias_add_forward_bf16 = f_bias_add_forward_bf16,                   \
    .bias_add_backward_bf16 = f_bias_add_backward_bf16,                 \
    .gelu_forward_bf16 = f_gelu_forward_bf16,                           \
    .gelu_backward_bf16 = f_gelu_backward_bf16,                         \
    .bias_gelu_forward_bf16 = f_bias_gelu_forward_bf16,                 \
    .bias_gelu_backward_bf16 = f_bias_gelu_backward_bf16,               \
    .bias_dropout_add_forward_bf16 = f_bias_dropout_add_forward_bf16,   \
    .bias_dropout_add_backward_bf16 = f_bias_dropout_add_backward_bf16, \
    .layernorm_forward_bf16 = f_layernorm_forward_bf16,                 \
    .layernorm_backward_bf16 = f_layernorm_backward_bf16,               \
    .attention_forward_bf16 = f_attention_forward_bf16,                 \
    .attention_backward_bf16 = f_attention_backward_bf16,               \
    .xent_vp_rowmax_bf16 = f_xent_vp_rowmax_bf16,                       \
    .xent_vp_sumexp_bf16 = f_xent_vp_sumexp_bf16,                       \
    .xent_vp_target_bf16 = f_xent_vp_target_bf16,                       \
    .xent_vp_backward_bf16 = f_xent_vp_backward_bf16,                   \
    .dropout_forward_bf16 = f_dropout_forward_bf16,                     \
    .dropout_backward_bf16 = f_dropout_backward_bf16,                   \
    .embedding_forward_bf16 = f_embedding_forward_bf16,                 \
    .embedding_backward_bf16 = f_embedding_backward_bf16
/* clang-format on */

static const ms_kernels cpu_kernels = {.name = "cpu", .kind = MS_DEVICE_CPU, HOST_SLOTS};
static const ms_kernels fenced_kernels = {
    .name = "fenced", .kind = MS_DEVICE_FENCED, HOST_SLOTS, BF16_SLOTS};

/* The CUDA table and its context (kernels/cuda/backend_cuda.c), when CUDA is built. */
#ifdef MS_HAVE_CUDA
const ms_kernels *ms_kernels_cuda_table(void);
ms_status ms_kctx_cuda_init(ms_kctx *kc, const ms_kctx_opts *opts, ms_error *err);
void ms_kctx_cuda_fini(ms_kctx *kc);
#else
static const ms_kernels *ms_kernels_cuda_table(void) {
    return NULL;
}
static ms_status ms_kctx_cuda_init(ms_kctx *kc, const ms_kctx_opts *opts, ms_error *err) {
    (void)kc, (void)opts;
    return ms_fail(err, MS_ERR_UNSUPPORTED, "CUDA is not built");
}
static void ms_kctx_cuda_fini(ms_kctx *kc) {
    (void)kc;
}
#endif

const ms_kernels *ms_kernels_for(ms_device_kind kind) {
    switch (kind) {
        case MS_DEVICE_CPU:
            return &cpu_kernels;
        case MS_DEVICE_FENCED:
            return &fenced_kernels;
        case MS_DEVICE_CUDA:
            return ms_kernels_cuda_table();
        default:
            return NULL;
    }
}

ms_status ms_kctx_create(ms_device *dev, ms_kctx **out, ms_error *err) {
    return ms_kctx_create_with(dev, NULL, out, err);
}

ms_status ms_kctx_create_with(ms_device *dev, const ms_kctx_opts *opts, ms_kctx **out,
                              ms_error *err) {
    *out = NULL;
    const ms_kernels *k = ms_kernels_for(dev->ops->kind);
    if (!k)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "no kernels for device '%s' in this build (configure with "
                       "-DMS_ENABLE_CUDA=ON on a machine with the CUDA toolkit)",
                       ms_device_name(dev));
    ms_kctx *kc = xcalloc(1, sizeof *kc);
    kc->k = k;
    kc->dev = dev;
    kc->tag = dev->addr_tag;
    kc->work = dev->ops->counts_work ? &dev->work : NULL;
    if (dev->ops->kind == MS_DEVICE_CUDA) {
        ms_status st = ms_kctx_cuda_init(kc, opts, err);
        if (st != MS_OK) {
            free(kc);
            return st;
        }
    }
    *out = kc;
    return MS_OK;
}

void ms_kctx_destroy(ms_kctx *kc) {
    if (!kc) return;
    if (kc->dev->ops->kind == MS_DEVICE_CUDA) ms_kctx_cuda_fini(kc);
    free(kc);
}

static ms_kctx host_kctx = {.k = &cpu_kernels};
static pthread_once_t host_kctx_once = PTHREAD_ONCE_INIT;

static void host_kctx_init(void) {
    host_kctx.dev = ms_device_host();
}

ms_kctx *ms_kctx_host(void) {
    pthread_once(&host_kctx_once, host_kctx_init);
    return &host_kctx;
}

ms_status ms_kctx_sync(ms_kctx *kc, ms_error *err) {
    return kc->k->sync(kc, err);
}

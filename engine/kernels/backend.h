/* backend.h - the kernel interface per device: one table of kernels for each device kind.
 *
 * The program, the operators and the optimizer call every kernel through a table, as ggml's
 * backends do, and never dereference a tensor's memory themselves: on a GPU that memory is
 * not the host's. Three tables exist:
 *   - cpu:    the kernels of kernels.h and optim.h, on host memory;
 *   - fenced: the same kernels on the fenced device's memory (core/device.h), removing the
 *             address tag on the way in. Training on it proves on any machine that nothing
 *             else touches device memory;
 *   - cuda:   engine/kernels/cuda (cuBLAS GEMMs and the kernels of cuda_kernels.h), on one
 *             stream per rank (built with CUDA only).
 *
 * Every slot has the argument order and the semantics of the CPU kernel it is named after
 * (shapes in kernels.h; backward kernels accumulate, forward kernels overwrite) and returns a
 * status: a GPU launch can fail. A backward slot with a `fresh` argument may instead write a
 * gradient whole: bit i set says its i-th gradient output (in argument order) holds nothing
 * yet, so the kernel writes it rather than adding to it (ms_op_call.din_fresh: the program
 * then skips zeroing it; the CPU tables zero and add, a GPU's writes). A NULL slot is a kernel
 * the backend does not have yet; an operator says which slots it needs (ms_op_def.runs_on),
 * so the program refuses, when it is compiled, a graph that the device cannot run, naming
 * the operator.
 *
 * Ownership: tables are static. A kernel context (ms_kctx) is created per rank and device
 * and destroyed by its creator; it borrows the device. All the contexts of one device launch
 * on the device's queue (CUDA: its compute stream, core/device.h), so a device mark covers
 * the kernels of every context of the rank.
 */
#ifndef MS_KERNEL_BACKEND_H
#define MS_KERNEL_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/device.h"
#include "engine/core/status.h"
#include "engine/kernels/conv.h"
#include "engine/kernels/elementwise_ext.h"
#include "engine/kernels/fused.h"
#include "engine/kernels/index.h"
#include "engine/kernels/kctx_opts.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/layers.h"
#include "engine/kernels/pool.h"
#include "engine/kernels/reduce_ext.h"
#include "engine/optim/optim.h"

typedef struct ms_kernels ms_kernels;

/* One parameter of a list AdamW updates at once (adamw_list): its fp32 values (or master
 * weights), its gradient (fp32, or bf16 bits), its two moments and its element count, all on
 * the device. */
typedef struct ms_k_adamw_item {
    float *p;
    const void *g;
    float *m, *v;
    size_t n;
    bool g_bf16;
} ms_k_adamw_item;

/* One tensor of a list bf16_round_list rounds: n fp32 values (a master) into n bf16 values (its
 * use copy), both on the device. */
typedef struct ms_k_cast_item {
    uint16_t *dst;
    const float *src;
    size_t n;
} ms_k_cast_item;

/* One tensor of a list the kernels read whole: its data on the device, its element count and
 * its number format. */
typedef struct ms_k_span {
    const void *data;
    size_t n;
    bool bf16; /* uint16_t bf16 values, else float */
} ms_k_span;

/* A rank's handle on its device's kernels. */
typedef struct ms_kctx {
    const ms_kernels *k;
    ms_device *dev;         /* borrowed */
    uintptr_t tag;          /* dev->addr_tag: subtracted from addresses by the fenced table */
    void *impl;             /* the backend's state (CUDA: cuBLAS handle, scratch); or NULL */
    _Atomic uint64_t *work; /* &dev->work where the device counts launches (fenced), else NULL */
} ms_kctx;

/* The context for `dev`'s kind, with every default (ms_kctx_opts). MS_ERR_UNSUPPORTED when
 * this build has no kernels for it (CUDA not built). */
ms_status ms_kctx_create(ms_device *dev, ms_kctx **out, ms_error *err);
/* ms_kctx_create with the choices of opts (kctx_opts.h), fixed for the context's life; NULL is
 * every default. */
ms_status ms_kctx_create_with(ms_device *dev, const ms_kctx_opts *opts, ms_kctx **out,
                              ms_error *err);
void ms_kctx_destroy(ms_kctx *kc); /* NULL is a no-op */
/* The CPU kernels on host memory (ms_device_host()), for code that works on host tensors
 * outside any rank's program: eager mode, tests. Process-wide; never destroyed. */
ms_kctx *ms_kctx_host(void);
/* Waits until every kernel enqueued on kc has finished (a no-op on the CPU; CUDA: the device's
 * compute stream, so every context's kernels and the device's copies). */
ms_status ms_kctx_sync(ms_kctx *kc, ms_error *err);

struct ms_k_attn_dropout; /* kernels.h */

#define MS_KSLOT(name, ...) ms_status (*name)(ms_kctx * kc, __VA_ARGS__, ms_error * err)

struct ms_kernels {
    const char *name;
    ms_device_kind kind;
    ms_status (*sync)(ms_kctx *kc, ms_error *err);

    /* ---- program instructions: seeds, accumulation, precision ---- */
    MS_KSLOT(fill, float *dst, float value, int64_t n);
    MS_KSLOT(accumulate, float *dst, const float *src, int64_t n); /* dst += src */
    MS_KSLOT(bf16_accumulate, uint16_t *dst, const uint16_t *src, int64_t n);
    MS_KSLOT(bf16_widen, float *out, const uint16_t *in, int64_t n);
    MS_KSLOT(bf16_round, uint16_t *out, const float *in, int64_t n);
    /* Every item's bf16_round, the same bits, in as few launches as the device allows (the
     * bf16 use copies after the optimizer: one per parameter tensor). */
    MS_KSLOT(bf16_round_list, const ms_k_cast_item *x, int n);
    MS_KSLOT(ids_from_floats, int32_t *out, const float *in, int64_t n);

    /* ---- matmul ---- */
    MS_KSLOT(matmul_forward, const ms_k_gemm *g, float *c, const float *a, const float *b,
             float alpha, float beta);
    MS_KSLOT(matmul_backward, const ms_k_gemm *g, float *da, float *db, const float *dc,
             const float *a, const float *b, float alpha, bool accumulate);
    /* Optional (NULL: a bf16 program widens the operands to fp32, calls the two above and
     * rounds what they wrote): the same products on bf16 buffers, accumulating in fp32 and
     * rounding each output once. With beta or accumulate the bf16 output is widened, added to
     * in fp32 and rounded, so the result is bit for bit the staged one's. */
    MS_KSLOT(matmul_forward_bf16, const ms_k_gemm *g, uint16_t *c, const uint16_t *a,
             const uint16_t *b, float alpha, float beta);
    MS_KSLOT(matmul_backward_bf16, const ms_k_gemm *g, uint16_t *da, uint16_t *db,
             const uint16_t *dc, const uint16_t *a, const uint16_t *b, float alpha,
             bool accumulate);

    /* ---- optional bf16 kernels of the slots below (the same name without _bf16), every
     * tensor operand bf16, the statistics saved for backward (mean, rstd) fp32. The contract
     * is the program's staging (program_precision.c): each reads bf16, computes in fp32
     * exactly as the fp32 slot of the same table does, and rounds each output once to nearest
     * even; a backward widens the gradient it accumulates into, adds in fp32 and rounds once.
     * So the result is bit for bit the staged one on the same device. A NULL slot stages. ---- */
    MS_KSLOT(add_forward_bf16, uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n);
    MS_KSLOT(add_backward_bf16, uint16_t *da, uint16_t *db, const uint16_t *dout, int64_t n);
    MS_KSLOT(bias_add_forward_bf16, uint16_t *out, const uint16_t *inp, const uint16_t *bias,
             int64_t n, int64_t c);
    MS_KSLOT(bias_add_backward_bf16, uint16_t *dinp, uint16_t *dbias, const uint16_t *dout,
             int64_t n, int64_t c, unsigned fresh);
    MS_KSLOT(gelu_forward_bf16, uint16_t *out, const uint16_t *inp, int64_t n);
    MS_KSLOT(gelu_backward_bf16, uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
             int64_t n);
    MS_KSLOT(bias_gelu_forward_bf16, uint16_t *out, const uint16_t *inp, const uint16_t *bias,
             int64_t n, int64_t c);
    MS_KSLOT(bias_gelu_backward_bf16, uint16_t *dinp, uint16_t *dbias, const uint16_t *dout,
             const uint16_t *inp, const uint16_t *bias, int64_t n, int64_t c, unsigned fresh);
    MS_KSLOT(bias_dropout_add_forward_bf16, uint16_t *out, const uint16_t *inp,
             const uint16_t *bias, const uint16_t *res, int64_t nb, const ms_k_fused_dropout *d);
    MS_KSLOT(bias_dropout_add_backward_bf16, uint16_t *dinp, uint16_t *dbias, uint16_t *dres,
             const uint16_t *dout, int64_t nb, const ms_k_fused_dropout *d, unsigned fresh);
    MS_KSLOT(layernorm_forward_bf16, uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
             const uint16_t *weight, const uint16_t *bias, int64_t n, int64_t c, float eps);
    MS_KSLOT(layernorm_backward_bf16, uint16_t *dinp, uint16_t *dweight, uint16_t *dbias,
             const uint16_t *dout, const uint16_t *inp, const uint16_t *weight, const float *mean,
             const float *rstd, int64_t n, int64_t c);
    /* saved and scratch as attention_forward's (attention_saved_floats, fp32) */
    MS_KSLOT(attention_forward_bf16, uint16_t *out, float *saved, float *work, const uint16_t *qkv,
             const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
             const struct ms_k_attn_dropout *drop);
    MS_KSLOT(attention_backward_bf16, uint16_t *dqkv, float *scratch, const uint16_t *dout,
             const uint16_t *qkv, const float *saved, const float *mask, int64_t b, int64_t t,
             int64_t c, int64_t nh, bool causal, unsigned fresh,
             const struct ms_k_attn_dropout *drop);
    /* the vocab-parallel cross-entropy's pieces on bf16 logits; the losses are computed fp32
     * (xent_vp_loss) and rounded by bf16_round */
    MS_KSLOT(xent_vp_rowmax_bf16, float *lmax, const uint16_t *logits, int64_t n, int64_t vl);
    MS_KSLOT(xent_vp_sumexp_bf16, float *lsum, const uint16_t *logits, const float *gmax, int64_t n,
             int64_t vl);
    MS_KSLOT(xent_vp_target_bf16, float *ltgt, const uint16_t *logits, const int32_t *targets,
             int64_t n, int64_t vl, int64_t v0);
    MS_KSLOT(xent_vp_backward_bf16, uint16_t *dlogits, const uint16_t *logits, const float *gmax,
             const float *gsum, const int32_t *targets, const uint16_t *dlosses, int64_t n,
             int64_t vl, int64_t v0, unsigned fresh);
    MS_KSLOT(dropout_forward_bf16, uint16_t *out, const uint16_t *inp, float p, uint64_t seed,
             uint64_t stream, int ndim, const int64_t *lshape, const int64_t *gstart,
             const int64_t *gshape, const ms_k_batch_window *w);
    MS_KSLOT(dropout_backward_bf16, uint16_t *dinp, const uint16_t *dout, float p, uint64_t seed,
             uint64_t stream, int ndim, const int64_t *lshape, const int64_t *gstart,
             const int64_t *gshape, const ms_k_batch_window *w);
    /* the table and out bf16, the ids int32; the backward adds each row's contributions in
     * ascending token order in fp32 and rounds the row once */
    MS_KSLOT(embedding_forward_bf16, uint16_t *out, const int32_t *ids, const uint16_t *table,
             int64_t n, int64_t c, int64_t v0, int64_t vl);
    MS_KSLOT(embedding_backward_bf16, uint16_t *dtable, const int32_t *ids, const uint16_t *dout,
             int64_t n, int64_t c, int64_t v0, int64_t vl);

    /* ---- elementwise ---- */
    MS_KSLOT(add_forward, float *out, const float *a, const float *b, int64_t n);
    MS_KSLOT(add_backward, float *da, float *db, const float *dout, int64_t n);
    MS_KSLOT(mul_forward, float *out, const float *a, const float *b, int64_t n);
    MS_KSLOT(mul_backward, float *da, float *db, const float *dout, const float *a, const float *b,
             int64_t n);
    MS_KSLOT(scale_forward, float *out, const float *x, float s, int64_t n);
    MS_KSLOT(scale_backward, float *dx, const float *dout, float s, int64_t n);
    MS_KSLOT(bias_add_forward, float *out, const float *inp, const float *bias, int64_t n,
             int64_t c);
    MS_KSLOT(bias_add_backward, float *dinp, float *dbias, const float *dout, int64_t n, int64_t c,
             unsigned fresh);
    MS_KSLOT(gelu_forward, float *out, const float *inp, int64_t n);
    MS_KSLOT(gelu_backward, float *dinp, const float *inp, const float *dout, int64_t n);

    /* ---- the elementwise families (elementwise_ext.h): unary by op code, binary and ternary
     * by op code over a broadcasting layout; copy is dst = src (reshape, squeeze) ---- */
    MS_KSLOT(copy, float *dst, const float *src, int64_t n);
    MS_KSLOT(unary_forward, ms_k_unary op, float *out, const float *inp, int64_t n, float p0,
             float p1);
    MS_KSLOT(unary_backward, ms_k_unary op, float *dinp, const float *inp, const float *out,
             const float *dout, int64_t n, float p0, float p1, bool fresh);
    MS_KSLOT(binary_forward, ms_k_binary op, float *out, const float *a, const float *b,
             const ms_k_bcast *bc);
    MS_KSLOT(binary_backward, ms_k_binary op, float *da, float *db, const float *dout,
             const float *a, const float *b, const ms_k_bcast *bc);
    MS_KSLOT(ternary_forward, ms_k_ternary op, float *out, const float *x, const float *y,
             const float *z, const ms_k_bcast *bc);
    /* lerp (a, b, w): dx, dy, dz = da, db, dw; where (cond, a, b): dx is unused */
    MS_KSLOT(ternary_backward, ms_k_ternary op, float *dx, float *dy, float *dz, const float *dout,
             const float *x, const float *y, const float *z, const ms_k_bcast *bc);

    /* ---- reductions over a dims mask (reduce_ext.h): scale multiplies sums, correction is
     * var/std's; pos holds max/min's winners (written forward, read backward) ---- */
    MS_KSLOT(reduce_forward, ms_k_reduce op, float *out, float *pos, const float *inp,
             const ms_k_rgeom *g, float scale, int correction);
    MS_KSLOT(reduce_backward, ms_k_reduce op, float *dinp, const float *dout, const float *inp,
             const float *pos, const ms_k_rgeom *g, float scale, int correction);

    /* ---- layout and indexing (index.h): strided views (permute, transpose, slice, flip,
     * roll, repeat, expand, pad), block copies (concat, split, stack: dst[r * dst_ld + c]
     * (+)= src[r * src_ld + c] for r < rows, c < cols), scans, triangles, masks, sorting ---- */
    MS_KSLOT(view_forward, float *out, const float *inp, const ms_k_view *v, float fill);
    MS_KSLOT(view_backward, float *dinp, const float *dout, const ms_k_view *v);
    MS_KSLOT(block_copy, float *dst, const float *src, int64_t rows, int64_t cols, int64_t dst_ld,
             int64_t src_ld, bool accumulate);
    MS_KSLOT(scan_forward, ms_k_scan op, float *out, const float *inp, int64_t o, int64_t d,
             int64_t i);
    MS_KSLOT(scan_backward, ms_k_scan op, float *dinp, const float *dout, const float *inp,
             int64_t o, int64_t d, int64_t i);
    MS_KSLOT(triangle, float *out, const float *inp, int64_t batch, int64_t rows, int64_t cols,
             int64_t r0, int64_t c0, int64_t diag, bool upper, bool accumulate);
    MS_KSLOT(masked_fill_forward, float *out, const float *x, const float *mask, float value,
             int64_t n);
    MS_KSLOT(masked_fill_backward, float *dinp, const float *dout, const float *mask, int64_t n);
    MS_KSLOT(one_hot, float *out, const float *ids, int64_t n, int64_t v, int64_t v0);
    MS_KSLOT(sort_rows, float *values, float *indices, const float *inp, int64_t rows, int64_t c,
             int64_t k, bool descending);
    MS_KSLOT(sort_rows_backward, float *dinp, const float *dout, const float *indices, int64_t rows,
             int64_t c, int64_t k);

    /* ---- per-row ops, batched matmul and losses (layers.h) ---- */
    MS_KSLOT(rows_forward, ms_k_row_op op, float *out, float *aux, const float *x, const float *y,
             int64_t n, int64_t c, float p);
    MS_KSLOT(rows_backward, ms_k_row_op op, float *dx, float *dy, const float *dout, const float *x,
             const float *y, const float *out, const float *aux, int64_t n, int64_t c, float p);
    MS_KSLOT(bmm_forward, const ms_k_bmm *g, float *c, const float *a, const float *b);
    MS_KSLOT(bmm_backward, const ms_k_bmm *g, float *da, float *db, const float *dc, const float *a,
             const float *b);
    /* out[0] = scale * sum of loss(a - b); backward reads dout[0] on the device */
    MS_KSLOT(pointwise_loss_forward, ms_k_loss kind, float *out, const float *a, const float *b,
             int64_t n, float delta, float scale);
    MS_KSLOT(pointwise_loss_backward, ms_k_loss kind, float *da, float *db, const float *a,
             const float *b, const float *dout, int64_t n, float delta, float scale);
    MS_KSLOT(nll_forward, float *losses, const float *logp, const int32_t *targets, int64_t n,
             int64_t vl, int64_t v0);
    MS_KSLOT(nll_backward, float *dlogp, const float *dlosses, const int32_t *targets, int64_t n,
             int64_t vl, int64_t v0);
    MS_KSLOT(xent_smooth_forward, float *losses, float *lse, const float *logits,
             const int32_t *targets, int64_t n, int64_t v, float s);
    MS_KSLOT(xent_smooth_backward, float *dlogits, const float *logits, const float *lse,
             const int32_t *targets, const float *dlosses, int64_t n, int64_t v, float s);

    /* ---- sum over the middle dim of [O, D, I] (kernels.h); backward: dinp += f * dout ---- */
    MS_KSLOT(sum_forward, float *out, const float *inp, int64_t o, int64_t d, int64_t i);
    MS_KSLOT(sum_backward, float *dinp, const float *dout, float f, int64_t o, int64_t d,
             int64_t i);

    /* ---- fused elementwise chains (fused.h) ---- */
    MS_KSLOT(bias_gelu_forward, float *out, const float *inp, const float *bias, int64_t n,
             int64_t c);
    MS_KSLOT(bias_gelu_backward, float *dinp, float *dbias, const float *dout, const float *inp,
             const float *bias, int64_t n, int64_t c, unsigned fresh);
    MS_KSLOT(bias_dropout_add_forward, float *out, const float *inp, const float *bias,
             const float *res, int64_t nb, const ms_k_fused_dropout *d);
    MS_KSLOT(bias_dropout_add_backward, float *dinp, float *dbias, float *dres, const float *dout,
             int64_t nb, const ms_k_fused_dropout *d, unsigned fresh);

    /* ---- gather and its scatter-add (index.h) ---- */
    MS_KSLOT(gather, float *out, const float *x, const float *ids, const ms_k_gather_dims *g,
             bool accumulate);
    MS_KSLOT(scatter_add, float *x, const float *src, const float *ids, const ms_k_gather_dims *g);

    /* ---- normalisation and softmax ---- */
    MS_KSLOT(layernorm_forward, float *out, float *mean, float *rstd, const float *inp,
             const float *weight, const float *bias, int64_t n, int64_t c, float eps);
    MS_KSLOT(layernorm_backward, float *dinp, float *dweight, float *dbias, const float *dout,
             const float *inp, const float *weight, const float *mean, const float *rstd, int64_t n,
             int64_t c);
    MS_KSLOT(softmax_forward, float *out, const float *inp, int64_t n, int64_t c);
    MS_KSLOT(softmax_backward, float *dinp, const float *dout, const float *out, int64_t n,
             int64_t c);

    /* ---- attention: the forward saves what its backward reads (the CPU: the probabilities
     * [B, NH, T, T]; CUDA: the log-sum-exps and the output), sized by attention_saved_floats;
     * the backward's working memory is attention_scratch_floats, which the forward may use as
     * `work` (dropout on the CPU). Dropout on the probabilities (attn_pdrop; NULL or p = 0:
     * none) is kernels.h's ms_k_attn_dropout; a backend without it refuses p > 0. */
    int64_t (*attention_saved_floats)(int64_t b, int64_t t, int64_t c, int64_t nh);
    int64_t (*attention_scratch_floats)(int64_t b, int64_t t, int64_t nh);
    MS_KSLOT(attention_forward, float *out, float *saved, float *work, const float *qkv,
             const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
             const struct ms_k_attn_dropout *drop);
    MS_KSLOT(attention_backward, float *dqkv, float *scratch, const float *dout, const float *qkv,
             const float *saved, const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh,
             bool causal, unsigned fresh, const struct ms_k_attn_dropout *drop);

    /* ---- the LLaMA layers (layers.h): RMSNorm, SwiGLU, rotary, grouped-query attention ---- */
    MS_KSLOT(rmsnorm_forward, float *out, float *rstd, const float *inp, const float *weight,
             int64_t n, int64_t c, float eps);
    MS_KSLOT(rmsnorm_backward, float *dinp, float *dweight, const float *dout, const float *inp,
             const float *weight, const float *rstd, int64_t n, int64_t c);
    MS_KSLOT(swiglu_forward, float *out, const float *gate, const float *up, int64_t n);
    MS_KSLOT(swiglu_backward, float *dgate, float *dup, const float *dout, const float *gate,
             const float *up, int64_t n);
    MS_KSLOT(rotary_tables, float *cosb, float *sinb, int64_t t, int64_t t0, int64_t d,
             float theta);
    MS_KSLOT(rotary_apply, float *out, const float *inp, const float *cosb, const float *sinb,
             int64_t b, int64_t t, int64_t h, int64_t d, bool inverse);
    /* The forward saves what its backward reads (the CPU: the probabilities [B, H, Tq, Tk];
     * CUDA: the log-sum-exps [B, H, Tq], then a copy of the output [B, Tq, H, D]), sized by
     * gqa_saved_floats; the backward's working memory is gqa_scratch_floats. mask [B, Tk]:
     * 0 drops a key (layers.h), or NULL. */
    int64_t (*gqa_saved_floats)(const ms_k_gqa *g);
    int64_t (*gqa_scratch_floats)(const ms_k_gqa *g);
    MS_KSLOT(gqa_forward, const ms_k_gqa *g, float *out, float *saved, const float *q,
             const float *k, const float *v, const float *mask);
    MS_KSLOT(gqa_backward, const ms_k_gqa *g, float *dq, float *dk, float *dv, float *scratch,
             const float *dout, const float *q, const float *k, const float *v, const float *saved,
             const float *mask);

    /* ---- embedding and the vocab-parallel cross-entropy ---- */
    MS_KSLOT(embedding_forward, float *out, const int32_t *ids, const float *table, int64_t n,
             int64_t c, int64_t v0, int64_t vl);
    MS_KSLOT(embedding_backward, float *dtable, const int32_t *ids, const float *dout, int64_t n,
             int64_t c, int64_t v0, int64_t vl);
    MS_KSLOT(xent_vp_rowmax, float *lmax, const float *logits, int64_t n, int64_t vl);
    MS_KSLOT(xent_vp_sumexp, float *lsum, const float *logits, const float *gmax, int64_t n,
             int64_t vl);
    MS_KSLOT(xent_vp_target, float *ltgt, const float *logits, const int32_t *targets, int64_t n,
             int64_t vl, int64_t v0);
    MS_KSLOT(xent_vp_loss, float *losses, const float *gmax, const float *gsum, const float *gtgt,
             const int32_t *targets, int64_t n);
    MS_KSLOT(xent_vp_backward, float *dlogits, const float *logits, const float *gmax,
             const float *gsum, const int32_t *targets, const float *dlosses, int64_t n, int64_t vl,
             int64_t v0, unsigned fresh);

    /* ---- dropout (Philox on global indices, kernels.h) ---- */
    MS_KSLOT(dropout_forward, float *out, const float *inp, float p, uint64_t seed, uint64_t stream,
             int ndim, const int64_t *lshape, const int64_t *gstart, const int64_t *gshape,
             const ms_k_batch_window *w);
    MS_KSLOT(dropout_backward, float *dinp, const float *dout, float p, uint64_t seed,
             uint64_t stream, int ndim, const int64_t *lshape, const int64_t *gstart,
             const int64_t *gshape, const ms_k_batch_window *w);

    /* ---- optimizer (optim.h): the sums of squares land on the host ---- */
    MS_KSLOT(adamw_step, float *p, const float *g, float *m, float *v, size_t n,
             const ms_adamw_opts *o, int64_t t, float grad_scale);
    MS_KSLOT(adamw_step_bf16_grad, float *p, const uint16_t *g, float *m, float *v, size_t n,
             const ms_adamw_opts *o, int64_t t, float grad_scale);
    /* Every item's adamw_step (adamw_step_bf16_grad for a bf16 gradient), the same values,
     * in as few launches as the device allows (a training step: one per parameter tensor). */
    MS_KSLOT(adamw_list, const ms_k_adamw_item *x, int n, const ms_adamw_opts *o, int64_t t,
             float grad_scale);
    MS_KSLOT(sumsq, double *host_out, const float *x, size_t n);
    MS_KSLOT(sumsq_bf16, double *host_out, const uint16_t *x, size_t n);
    /* The sums of squares of n tensors, host_out[i] as sumsq (sumsq_bf16) gives x[i]'s, with
     * one wait for the device for all of them (the gradient norm: one per parameter tensor). */
    MS_KSLOT(sumsq_list, double *host_out, const ms_k_span *x, int n);
    MS_KSLOT(scale_inplace, float *x, size_t n, float s);

    /* -- conv: convolution (conv.h) --
     * The column buffer is the caller's, conv_scratch_floats of it (the CPU: one group of one
     * image; CUDA: every group of one image); the op keeps it in a saved slot, as attention
     * keeps its scratch. fresh: bit 0 dx, bit 1 dw, bit 2 dbias. */
    int64_t (*conv_scratch_floats)(const ms_k_conv *g);
    MS_KSLOT(conv_forward, const ms_k_conv *g, float *out, float *col, const float *x,
             const float *w, const float *bias);
    MS_KSLOT(conv_backward, const ms_k_conv *g, float *dx, float *dw, float *dbias, float *col,
             const float *dout, const float *x, const float *w, unsigned fresh);
    /* -- end conv -- */

    /* -- pool: pooling, group normalisation and resizing on NCHW / NCL (pool.h) --
     * The max pool's winners are int32 positions in their plane; group_norm_backward's
     * scratch is ms_k_group_norm_scratch_floats, which the op keeps in a saved slot. */
    MS_KSLOT(pool_forward, const ms_k_pool *g, float *out, int32_t *idx, const float *inp);
    MS_KSLOT(pool_backward, const ms_k_pool *g, float *dinp, const float *dout, const int32_t *idx);
    MS_KSLOT(group_norm_forward, const ms_k_gnorm *g, float *out, float *mean, float *rstd,
             const float *inp, const float *weight, const float *bias);
    MS_KSLOT(group_norm_backward, const ms_k_gnorm *g, float *dinp, float *dweight, float *dbias,
             float *scratch, const float *dout, const float *inp, const float *weight,
             const float *mean, const float *rstd);
    MS_KSLOT(resize_forward, const ms_k_resize *g, float *out, const float *inp);
    MS_KSLOT(resize_backward, const ms_k_resize *g, float *dinp, const float *dout);
    /* -- end pool -- */
};

/* The tables. ms_kernels_cuda is NULL when CUDA is not built. */
const ms_kernels *ms_kernels_for(ms_device_kind kind);

/* Calls slot `fn` of kc's table: MS_CALL_K(kc, gelu_forward, out, inp, n, err). */
#define MS_CALL_K(kc, fn, ...) (ms_kctx_count_launch(kc), (kc)->k->fn((kc), __VA_ARGS__))

/* Adds a launch to the device's work count where it keeps one (the fenced device's marks). */
static inline void ms_kctx_count_launch(ms_kctx *kc) {
    if (kc->work) atomic_fetch_add_explicit(kc->work, 1, memory_order_relaxed);
}

#endif

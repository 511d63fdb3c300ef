/* cuda_kernels.h - the CUDA kernels, callable from C: the entries of the CUDA kernel table
 * (engine/kernels/backend.h; the table itself is backend_cuda.c's) and the few launchers that
 * backend_cuda.c hands scratch or staged lists to.
 *
 * An entry of the table is declared MS_CU_SLOT(name, args): ms_cu_<name> with exactly the
 * signature of the slot backend.h declares MS_KSLOT(name, args), so the table points straight
 * at it, and its semantics: device pointers, the CPU kernel's argument order (shapes in
 * kernels.h, layers.h, ...), backward kernels accumulate (or write a gradient whose `fresh`
 * bit is set), forward kernels overwrite. Every function taking a kernel context enqueues on
 * the compute stream of the context's device (ms_cu_stream), returns at once, and reports a
 * launch error as MS_ERR_INTERNAL (or MS_ERR_INVALID for an argument it cannot handle) with
 * the CUDA error string in err; it never aborts. The arithmetic of every kernel is a
 * __host__ __device__ function in the *_math.cuh headers beside this one, checked on the CPU
 * by tests/test_cuda_host*.cu. None of it has run on a GPU yet.
 *
 * bf16 buffers are uint16_t bit patterns (engine/core/tensor.h's ms_bf16_from_f32 rounding):
 * the *_bf16 kernels take every tensor operand (parameters included) in bf16 and share the
 * fp32 kernel's template, so they compute exactly what it computes on widened values and
 * round each output once; statistics (mean, rstd, lse) stay fp32.
 */
#ifndef MS_CUDA_KERNELS_H
#define MS_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* status.h is C17; the .cu files that implement this header include it as C++. */
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif
extern "C" {
#endif

#include "engine/core/status.h"
#include "engine/kernels/conv.h"
#include "engine/kernels/elementwise_ext.h"
#include "engine/kernels/fused.h"
#include "engine/kernels/index.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/layers.h"
#include "engine/kernels/pool.h"
#include "engine/kernels/reduce_ext.h"
#include "engine/optim/optim.h"

/* backend.h's kernel context (its C11 atomics keep backend.h itself out of C++). */
typedef struct ms_kctx ms_kctx;

/* An entry of the kernel table: the signature of backend.h's MS_KSLOT(name, ...). */
#define MS_CU_SLOT(name, ...) ms_status ms_cu_##name(ms_kctx *kc, __VA_ARGS__, ms_error *err)

/* ---- what a launch asks of its kernel context (backend_cuda.c) ----
 * The compute stream is the device's (core/device_cuda.c): the device makes it on first use
 * and destroys it with itself. No kernel context keeps a copy: a launch asks for it here. */

/* kc's device's compute stream (a cudaStream_t); made when kc was created, so always there. */
void *ms_cu_stream(const ms_kctx *kc);
/* Whether kc runs a bf16 attention call that fits the tensor-core kernels on them (flash.cu),
 * else the row kernels: ms_kctx_opts.attention and the device, decided when kc was created. */
bool ms_cu_attention_flash(const ms_kctx *kc);
/* kc's cuBLAS handle (a cublasHandle_t), made on the first product and bound then to the
 * device's compute stream; kc owns it and destroys it with itself. */
ms_status ms_cu_blas(ms_kctx *kc, void **out, ms_error *err);

/* ---- GEMM (gemm.cu: cuBLAS, fp32 accumulation): every operand fp32, or every one bf16 ---- */
MS_CU_SLOT(matmul_forward, const ms_k_gemm *g, float *c, const float *a, const float *b,
           float alpha, float beta);
MS_CU_SLOT(matmul_backward, const ms_k_gemm *g, float *da, float *db, const float *dc,
           const float *a, const float *b, float alpha, bool accumulate);
MS_CU_SLOT(matmul_forward_bf16, const ms_k_gemm *g, uint16_t *c, const uint16_t *a,
           const uint16_t *b, float alpha, float beta);
MS_CU_SLOT(matmul_backward_bf16, const ms_k_gemm *g, uint16_t *da, uint16_t *db, const uint16_t *dc,
           const uint16_t *a, const uint16_t *b, float alpha, bool accumulate);
/* The same products for any operand and output types (the slots fix them): a and b (dc, a, b)
 * in ab_type (in_type), c (da, db, either may be NULL) in c_type (grad_type). */
typedef enum ms_cu_dtype { MS_CU_F32, MS_CU_BF16 } ms_cu_dtype;
ms_status ms_cu_gemm_forward(ms_kctx *kc, const ms_k_gemm *g, void *c, ms_cu_dtype c_type,
                             const void *a, const void *b, ms_cu_dtype ab_type, float alpha,
                             float beta, ms_error *err);
ms_status ms_cu_gemm_backward(ms_kctx *kc, const ms_k_gemm *g, void *da, void *db,
                              ms_cu_dtype grad_type, const void *dc, const void *a, const void *b,
                              ms_cu_dtype in_type, float alpha, bool accumulate, ms_error *err);

/* ---- column reductions: the backwards that sum over rows ----
 * dbias of bias add, bias + GELU and bias + dropout + residual add, LayerNorm's dweight and
 * dbias, RMSNorm's dweight sum an [n, c] tensor over its rows in two passes: one thread per
 * (chunk of 64 rows, column) writes each chunk's fp32 column sums to `scratch`, then one thread
 * per column adds them in chunk order onto the output. The order depends on n alone, so the
 * result is the same every run (it is not the CPU kernel's row order: fp32 results differ
 * from the CPU's by summation rounding). These backwards are the slot's arguments plus that
 * scratch, of ms_cu_colsum_scratch_floats(n, c, terms) floats (terms: the sums the kernel
 * makes, 2 for LayerNorm, else 1), which no other launch may use until this one is done
 * (stream order); it may be NULL when the call has no such output. backend_cuda.c keeps it in
 * the kernel context and hands it over. */
int64_t ms_cu_colsum_scratch_floats(int64_t n, int64_t c, int terms);

/* ---- elementwise (elementwise.cu): one thread per element ---- */
MS_CU_SLOT(add_forward, float *out, const float *a, const float *b, int64_t n);
MS_CU_SLOT(add_backward, float *da, float *db, const float *dout, int64_t n);
MS_CU_SLOT(mul_forward, float *out, const float *a, const float *b, int64_t n);
MS_CU_SLOT(mul_backward, float *da, float *db, const float *dout, const float *a, const float *b,
           int64_t n);
MS_CU_SLOT(scale_forward, float *out, const float *x, float s, int64_t n);
MS_CU_SLOT(scale_backward, float *dx, const float *dout, float s, int64_t n);
MS_CU_SLOT(bias_add_forward, float *out, const float *inp, const float *bias, int64_t n, int64_t c);
MS_CU_SLOT(gelu_forward, float *out, const float *inp, int64_t n);
MS_CU_SLOT(gelu_backward, float *dinp, const float *inp, const float *dout, int64_t n);
MS_CU_SLOT(add_forward_bf16, uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n);
MS_CU_SLOT(add_backward_bf16, uint16_t *da, uint16_t *db, const uint16_t *dout, int64_t n);
MS_CU_SLOT(bias_add_forward_bf16, uint16_t *out, const uint16_t *inp, const uint16_t *bias,
           int64_t n, int64_t c);
MS_CU_SLOT(gelu_forward_bf16, uint16_t *out, const uint16_t *inp, int64_t n);
MS_CU_SLOT(gelu_backward_bf16, uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
           int64_t n);
/* dinp += dout, dbias += the column sums (dinp done in the reduction's first pass; without
 * dbias one thread per element). */
ms_status ms_cu_bias_add_backward(ms_kctx *kc, float *dinp, float *dbias, float *scratch,
                                  const float *dout, int64_t n, int64_t c, unsigned fresh,
                                  ms_error *err);
ms_status ms_cu_bias_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias, float *scratch,
                                       const uint16_t *dout, int64_t n, int64_t c, unsigned fresh,
                                       ms_error *err);
/* The program's instructions: dst = value; dst += src; bf16 <-> fp32 (ms_bf16_from_f32's
 * rounding); acc = round(acc + x) in fp32; integer ids from their float values; x *= s. */
MS_CU_SLOT(fill, float *dst, float value, int64_t n);
MS_CU_SLOT(accumulate, float *dst, const float *src, int64_t n);
MS_CU_SLOT(bf16_widen, float *out, const uint16_t *in, int64_t n);
MS_CU_SLOT(bf16_round, uint16_t *out, const float *in, int64_t n);
MS_CU_SLOT(bf16_accumulate, uint16_t *dst, const uint16_t *src, int64_t n);
MS_CU_SLOT(ids_from_floats, int32_t *out, const float *in, int64_t n);
MS_CU_SLOT(scale_inplace, float *x, size_t n, float s);
/* Sum over the middle dim of [O, D, I] in a fixed order: a block per output, the D terms over
 * its lanes and the lane tree, when there are few outputs (GPT-2's loss mean: one of 8192), else
 * one thread per output in order; the backward dinp += f * dout broadcast, one thread per input
 * element. */
MS_CU_SLOT(sum_forward, float *out, const float *inp, int64_t o, int64_t d, int64_t i);
MS_CU_SLOT(sum_backward, float *dinp, const float *dout, float f, int64_t o, int64_t d, int64_t i);

/* ---- LayerNorm, softmax, cross-entropy (norm.cu): one block per row ---- */
MS_CU_SLOT(layernorm_forward, float *out, float *mean, float *rstd, const float *inp,
           const float *weight, const float *bias, int64_t n, int64_t c, float eps);
MS_CU_SLOT(layernorm_forward_bf16, uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
           const uint16_t *weight, const uint16_t *bias, int64_t n, int64_t c, float eps);
/* dinp one block per row; dweight and dbias the column reduction above (terms 2). */
ms_status ms_cu_layernorm_backward(ms_kctx *kc, float *dinp, float *dweight, float *dbias,
                                   float *scratch, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd,
                                   int64_t n, int64_t c, ms_error *err);
ms_status ms_cu_layernorm_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dweight,
                                        uint16_t *dbias, float *scratch, const uint16_t *dout,
                                        const uint16_t *inp, const uint16_t *weight,
                                        const float *mean, const float *rstd, int64_t n, int64_t c,
                                        ms_error *err);
MS_CU_SLOT(softmax_forward, float *out, const float *inp, int64_t n, int64_t c);
MS_CU_SLOT(softmax_backward, float *dinp, const float *dout, const float *out, int64_t n,
           int64_t c);
/* The vocab-parallel pieces of kernels.h (one rank too); under bf16 the logits, their
 * gradient and the losses' gradient bf16, the row statistics fp32. */
MS_CU_SLOT(xent_vp_rowmax, float *lmax, const float *logits, int64_t n, int64_t vl);
MS_CU_SLOT(xent_vp_sumexp, float *lsum, const float *logits, const float *gmax, int64_t n,
           int64_t vl);
MS_CU_SLOT(xent_vp_target, float *ltgt, const float *logits, const int32_t *targets, int64_t n,
           int64_t vl, int64_t v0);
MS_CU_SLOT(xent_vp_loss, float *losses, const float *gmax, const float *gsum, const float *gtgt,
           const int32_t *targets, int64_t n);
MS_CU_SLOT(xent_vp_backward, float *dlogits, const float *logits, const float *gmax,
           const float *gsum, const int32_t *targets, const float *dlosses, int64_t n, int64_t vl,
           int64_t v0, unsigned fresh);
MS_CU_SLOT(xent_vp_rowmax_bf16, float *lmax, const uint16_t *logits, int64_t n, int64_t vl);
MS_CU_SLOT(xent_vp_sumexp_bf16, float *lsum, const uint16_t *logits, const float *gmax, int64_t n,
           int64_t vl);
MS_CU_SLOT(xent_vp_target_bf16, float *ltgt, const uint16_t *logits, const int32_t *targets,
           int64_t n, int64_t vl, int64_t v0);
MS_CU_SLOT(xent_vp_backward_bf16, uint16_t *dlogits, const uint16_t *logits, const float *gmax,
           const float *gsum, const int32_t *targets, const uint16_t *dlosses, int64_t n,
           int64_t vl, int64_t v0, unsigned fresh);

/* ---- embedding (embedding.cu). The backward is deterministic: each table row's
 * contributions are summed in ascending token order, the CPU kernel's, with no atomics; it
 * takes ms_cu_embedding_scratch_bytes(n, vl) bytes of device scratch besides the slot's
 * arguments (backend_cuda.c keeps it in the kernel context), which must not be in use by
 * another launch until this one is done (stream order). ---- */
MS_CU_SLOT(embedding_forward, float *out, const int32_t *ids, const float *table, int64_t n,
           int64_t c, int64_t v0, int64_t vl);
MS_CU_SLOT(embedding_forward_bf16, uint16_t *out, const int32_t *ids, const uint16_t *table,
           int64_t n, int64_t c, int64_t v0, int64_t vl);
size_t ms_cu_embedding_scratch_bytes(int64_t n, int64_t vl);
ms_status ms_cu_embedding_backward(ms_kctx *kc, float *dtable, const int32_t *ids,
                                   const float *dout, int64_t n, int64_t c, int64_t v0, int64_t vl,
                                   void *scratch, size_t scratch_bytes, ms_error *err);
ms_status ms_cu_embedding_backward_bf16(ms_kctx *kc, uint16_t *dtable, const int32_t *ids,
                                        const uint16_t *dout, int64_t n, int64_t c, int64_t v0,
                                        int64_t vl, void *scratch, size_t scratch_bytes,
                                        ms_error *err);

/* ---- fused chains (fused.h) and gather / scatter-add (index.h) (fused.cu) ---- */
MS_CU_SLOT(bias_gelu_forward, float *out, const float *inp, const float *bias, int64_t n,
           int64_t c);
MS_CU_SLOT(bias_gelu_forward_bf16, uint16_t *out, const uint16_t *inp, const uint16_t *bias,
           int64_t n, int64_t c);
MS_CU_SLOT(bias_dropout_add_forward, float *out, const float *inp, const float *bias,
           const float *res, int64_t nb, const ms_k_fused_dropout *d);
MS_CU_SLOT(bias_dropout_add_forward_bf16, uint16_t *out, const uint16_t *inp, const uint16_t *bias,
           const uint16_t *res, int64_t nb, const ms_k_fused_dropout *d);
/* The backwards: the column reduction above over [n, c] (bias + dropout + residual add: over
 * [numel / nb, nb]), whose first pass also does dinp (and dres) for its elements; without
 * dbias that pass alone. */
ms_status ms_cu_bias_gelu_backward(ms_kctx *kc, float *dinp, float *dbias, float *scratch,
                                   const float *dout, const float *inp, const float *bias,
                                   int64_t n, int64_t c, unsigned fresh, ms_error *err);
ms_status ms_cu_bias_gelu_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                        float *scratch, const uint16_t *dout, const uint16_t *inp,
                                        const uint16_t *bias, int64_t n, int64_t c, unsigned fresh,
                                        ms_error *err);
ms_status ms_cu_bias_dropout_add_backward(ms_kctx *kc, float *dinp, float *dbias, float *dres,
                                          float *scratch, const float *dout, int64_t nb,
                                          const ms_k_fused_dropout *d, unsigned fresh,
                                          ms_error *err);
ms_status ms_cu_bias_dropout_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                               uint16_t *dres, float *scratch, const uint16_t *dout,
                                               int64_t nb, const ms_k_fused_dropout *d,
                                               unsigned fresh, ms_error *err);
MS_CU_SLOT(gather, float *out, const float *x, const float *ids, const ms_k_gather_dims *g,
           bool accumulate);
MS_CU_SLOT(scatter_add, float *x, const float *src, const float *ids, const ms_k_gather_dims *g);

/* ---- dropout (dropout.cu): the CPU kernel's mask (Philox on global indices), one thread per
 * element. The mask's arguments, the same in all four: */
#define MS_CU_DROPOUT_MASK                                                                         \
    float p, uint64_t seed, uint64_t stream_id, int ndim, const int64_t *lshape,                   \
        const int64_t *gstart, const int64_t *gshape, const ms_k_batch_window *w
MS_CU_SLOT(dropout_forward, float *out, const float *inp, MS_CU_DROPOUT_MASK);
MS_CU_SLOT(dropout_backward, float *dinp, const float *dout, MS_CU_DROPOUT_MASK);
MS_CU_SLOT(dropout_forward_bf16, uint16_t *out, const uint16_t *inp, MS_CU_DROPOUT_MASK);
MS_CU_SLOT(dropout_backward_bf16, uint16_t *dinp, const uint16_t *dout, MS_CU_DROPOUT_MASK);

/* ---- optimizer (optim.cu) ---- */
/* ms_adamw_step_scaled on the GPU (the same argument checks); bf16_grad: fp32 master weights
 * with a bf16 gradient. */
MS_CU_SLOT(adamw_step, float *p, const float *g, float *m, float *v, size_t n,
           const ms_adamw_opts *o, int64_t t, float grad_scale);
MS_CU_SLOT(adamw_step_bf16_grad, float *p, const uint16_t *g, float *m, float *v, size_t n,
           const ms_adamw_opts *o, int64_t t, float grad_scale);
/* adamw_step_bf16_grad that also rewrites p16 (a bf16 copy of p) from the updated p, unless
 * p16 is NULL. */
ms_status ms_cu_adamw_step_master(ms_kctx *kc, float *p, const uint16_t *g, float *m, float *v,
                                  uint16_t *p16, size_t n, const ms_adamw_opts *o, int64_t t,
                                  float grad_scale, ms_error *err);
/* AdamW over a list of parameters in one launch (a block per chunk of every parameter, each
 * finding its parameter): each element updated as ms_cu_adamw_step (ms_cu_adamw_step_master
 * without a bf16 copy, for a bf16 gradient) updates it. items: a device copy of the list,
 * chunk0 filled by ms_cu_adamw_list_plan, which returns the chunks in all. */
typedef struct ms_cu_adamw_item {
    float *p;
    const void *g; /* float, or bf16 bits with g_bf16 */
    float *m, *v;
    int64_t n;
    int64_t chunk0;
    int32_t g_bf16;
} ms_cu_adamw_item;
int64_t ms_cu_adamw_list_plan(ms_cu_adamw_item *items, int n);
ms_status ms_cu_adamw_list(ms_kctx *kc, const ms_cu_adamw_item *items, int n, int64_t chunks,
                           const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err);
/* bf16_round over a list of tensors in one launch (a block per chunk of every tensor, each
 * finding its tensor): each element rounded as ms_cu_bf16_round rounds it. items: a device copy
 * of the list, chunk0 filled by ms_cu_cast_list_plan, which returns the chunks in all. */
typedef struct ms_cu_cast_item {
    uint16_t *dst;
    const float *src;
    int64_t n;
    int64_t chunk0;
} ms_cu_cast_item;
int64_t ms_cu_cast_list_plan(ms_cu_cast_item *items, int n);
ms_status ms_cu_cast_list(ms_kctx *kc, const ms_cu_cast_item *items, int n, int64_t chunks,
                          ms_error *err);
/* *out (device) = sum of x^2 in double, in an order that depends on n alone.
 * scratch: ms_cu_sumsq_scratch_doubles(n) doubles of device memory. */
int64_t ms_cu_sumsq_scratch_doubles(int64_t n);
ms_status ms_cu_sumsq(ms_kctx *kc, double *out, double *scratch, const float *x, int64_t n,
                      ms_error *err);
ms_status ms_cu_sumsq_bf16(ms_kctx *kc, double *out, double *scratch, const uint16_t *x, int64_t n,
                           ms_error *err);
/* The sums of squares of a list of tensors in two launches (one block per chunk of every
 * tensor, then one thread per tensor adding its chunks in order): out[i] (device) has the bits
 * ms_cu_sumsq gives tensor i. items: a device copy of the list, each with chunk0, the index of
 * its first chunk among all the list's (ms_cu_sumsq_list_plan fills them and returns the total);
 * scratch: that many doubles of device memory. */
typedef struct ms_cu_sumsq_item {
    const void *x;  /* device data: float, or bf16 bits */
    int64_t n;      /* elements */
    int64_t chunk0; /* its first chunk in the list's scratch */
    int32_t bf16;
} ms_cu_sumsq_item;
int64_t ms_cu_sumsq_list_plan(ms_cu_sumsq_item *items, int n);
ms_status ms_cu_sumsq_list(ms_kctx *kc, double *out, double *scratch, const ms_cu_sumsq_item *items,
                           int n, int64_t chunks, ms_error *err);

/* ---- attention (attention.cu): tiled and fused; saves the log-sum-exps instead of the
 * probabilities ---- */
/* qkv [B, T, 3C], out [B, T, C], mask [B, T] or NULL; HS <= 128. saved: lse [B, NH, T], then a
 * copy of the output [B, T, C] (fp32: the output before rounding under bf16), which the
 * backward reads; scratch: delta [B, NH, T]. A bf16 call that fits the tensor cores runs
 * flash.cu's kernels where kc chose them (ms_cu_attention_flash). */
int64_t ms_cu_attention_saved_floats(int64_t b, int64_t t, int64_t c, int64_t nh);
int64_t ms_cu_attention_scratch_floats(int64_t b, int64_t t, int64_t nh);
MS_CU_SLOT(attention_forward, float *out, float *saved, const float *qkv, const float *mask,
           int64_t b, int64_t t, int64_t c, int64_t nh, bool causal);
MS_CU_SLOT(attention_backward, float *dqkv, float *scratch, const float *dout, const float *qkv,
           const float *saved, const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh,
           bool causal, unsigned fresh);
MS_CU_SLOT(attention_forward_bf16, uint16_t *out, float *saved, const uint16_t *qkv,
           const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh, bool causal);
MS_CU_SLOT(attention_backward_bf16, uint16_t *dqkv, float *scratch, const uint16_t *dout,
           const uint16_t *qkv, const float *saved, const float *mask, int64_t b, int64_t t,
           int64_t c, int64_t nh, bool causal, unsigned fresh);
/* Grouped-query attention (layers.h's ms_k_gqa: strided heads, query head h reads kv head
 * h / (H / Hkv), causal from the global position q_start, mask [B, Tk] with 0 dropping a key):
 * the kernels above. D <= 128. saved: lse [B, H, Tq], then a copy of the output
 * [B, Tq, H, D]; scratch: delta [B, H, Tq]. A query that sees no key outputs zeros. */
int64_t ms_cu_gqa_saved_floats(const ms_k_gqa *g);
int64_t ms_cu_gqa_scratch_floats(const ms_k_gqa *g);
MS_CU_SLOT(gqa_forward, const ms_k_gqa *g, float *out, float *saved, const float *q, const float *k,
           const float *v, const float *mask);
MS_CU_SLOT(gqa_backward, const ms_k_gqa *g, float *dq, float *dk, float *dv, float *scratch,
           const float *dout, const float *q, const float *k, const float *v, const float *saved,
           const float *mask);

/* ---- the LLaMA layers (llama.cu; shapes in layers.h) ---- */
/* RMSNorm: one block per row; dweight the column reduction above (terms 1). */
MS_CU_SLOT(rmsnorm_forward, float *out, float *rstd, const float *inp, const float *weight,
           int64_t n, int64_t c, float eps);
ms_status ms_cu_rmsnorm_backward(ms_kctx *kc, float *dinp, float *dweight, float *scratch,
                                 const float *dout, const float *inp, const float *weight,
                                 const float *rstd, int64_t n, int64_t c, ms_error *err);
MS_CU_SLOT(swiglu_forward, float *out, const float *gate, const float *up, int64_t n);
MS_CU_SLOT(swiglu_backward, float *dgate, float *dup, const float *dout, const float *gate,
           const float *up, int64_t n);
/* The tables: one thread per (position, frequency); the rotation: one per pair. */
MS_CU_SLOT(rotary_tables, float *cosb, float *sinb, int64_t t, int64_t t0, int64_t d, float theta);
MS_CU_SLOT(rotary_apply, float *out, const float *inp, const float *cosb, const float *sinb,
           int64_t b, int64_t t, int64_t h, int64_t d, bool inverse);

/* ---- every other operator (ops_ext.cu) ----
 * Elementwise, broadcasting and reductions: one thread per output element (a broadcasting
 * backward: per input element, summing its readers in order); views, block copies, scans,
 * triangles, masks, one-hot: one per element; sorting: one per element, by rank; the row
 * ops, NLL and smoothed cross-entropy: one per row; the batched matmul: one per element of
 * the output or of each operand's gradient; the pointwise losses' forward: one thread. The
 * backward of a view that reads an input element more than once (expand, repeat) adds with
 * atomics, in any order. */
MS_CU_SLOT(copy, float *dst, const float *src, int64_t n);
MS_CU_SLOT(unary_forward, ms_k_unary op, float *out, const float *inp, int64_t n, float p0,
           float p1);
MS_CU_SLOT(unary_backward, ms_k_unary op, float *dinp, const float *inp, const float *out,
           const float *dout, int64_t n, float p0, float p1, bool fresh);
MS_CU_SLOT(binary_forward, ms_k_binary op, float *out, const float *a, const float *b,
           const ms_k_bcast *bc);
MS_CU_SLOT(binary_backward, ms_k_binary op, float *da, float *db, const float *dout, const float *a,
           const float *b, const ms_k_bcast *bc);
MS_CU_SLOT(ternary_forward, ms_k_ternary op, float *out, const float *x, const float *y,
           const float *z, const ms_k_bcast *bc);
MS_CU_SLOT(ternary_backward, ms_k_ternary op, float *dx, float *dy, float *dz, const float *dout,
           const float *x, const float *y, const float *z, const ms_k_bcast *bc);
MS_CU_SLOT(reduce_forward, ms_k_reduce op, float *out, float *pos, const float *inp,
           const ms_k_rgeom *g, float scale, int correction);
MS_CU_SLOT(reduce_backward, ms_k_reduce op, float *dinp, const float *dout, const float *inp,
           const float *pos, const ms_k_rgeom *g, float scale, int correction);
MS_CU_SLOT(view_forward, float *out, const float *inp, const ms_k_view *v, float fill);
MS_CU_SLOT(view_backward, float *dinp, const float *dout, const ms_k_view *v);
MS_CU_SLOT(block_copy, float *dst, const float *src, int64_t rows, int64_t cols, int64_t dst_ld,
           int64_t src_ld, bool accumulate);
MS_CU_SLOT(scan_forward, ms_k_scan op, float *out, const float *inp, int64_t o, int64_t d,
           int64_t i);
MS_CU_SLOT(scan_backward, ms_k_scan op, float *dinp, const float *dout, const float *inp, int64_t o,
           int64_t d, int64_t i);
MS_CU_SLOT(triangle, float *out, const float *inp, int64_t batch, int64_t rows, int64_t cols,
           int64_t r0, int64_t c0, int64_t diag, bool upper, bool accumulate);
MS_CU_SLOT(masked_fill_forward, float *out, const float *x, const float *mask, float value,
           int64_t n);
MS_CU_SLOT(masked_fill_backward, float *dinp, const float *dout, const float *mask, int64_t n);
MS_CU_SLOT(one_hot, float *out, const float *ids, int64_t n, int64_t v, int64_t v0);
MS_CU_SLOT(sort_rows, float *values, float *indices, const float *inp, int64_t rows, int64_t c,
           int64_t k, bool descending);
MS_CU_SLOT(sort_rows_backward, float *dinp, const float *dout, const float *indices, int64_t rows,
           int64_t c, int64_t k);
MS_CU_SLOT(rows_forward, ms_k_row_op op, float *out, float *aux, const float *x, const float *y,
           int64_t n, int64_t c, float p);
MS_CU_SLOT(rows_backward, ms_k_row_op op, float *dx, float *dy, const float *dout, const float *x,
           const float *y, const float *out, const float *aux, int64_t n, int64_t c, float p);
MS_CU_SLOT(bmm_forward, const ms_k_bmm *g, float *c, const float *a, const float *b);
MS_CU_SLOT(bmm_backward, const ms_k_bmm *g, float *da, float *db, const float *dc, const float *a,
           const float *b);
MS_CU_SLOT(pointwise_loss_forward, ms_k_loss kind, float *out, const float *a, const float *b,
           int64_t n, float delta, float scale);
MS_CU_SLOT(pointwise_loss_backward, ms_k_loss kind, float *da, float *db, const float *a,
           const float *b, const float *dout, int64_t n, float delta, float scale);
MS_CU_SLOT(nll_forward, float *losses, const float *logp, const int32_t *targets, int64_t n,
           int64_t vl, int64_t v0);
MS_CU_SLOT(nll_backward, float *dlogp, const float *dlosses, const int32_t *targets, int64_t n,
           int64_t vl, int64_t v0);
MS_CU_SLOT(xent_smooth_forward, float *losses, float *lse, const float *logits,
           const int32_t *targets, int64_t n, int64_t v, float s);
MS_CU_SLOT(xent_smooth_backward, float *dlogits, const float *logits, const float *lse,
           const int32_t *targets, const float *dlosses, int64_t n, int64_t v, float s);

/* -- conv: convolution (conv.cu; conv.h's geometry) --
 * Per image: im2col of every group into `col`, then one product batched over the groups; the
 * input gradient a product into `col` and col2im gathering each input element's taps in the
 * CPU's order; dbias a block per channel. col: ms_cu_conv_scratch_floats floats (every group
 * of one image; 0 and unused for a pointwise conv), not used by another launch until these
 * are done (stream order). fresh: bit 0 dx, bit 1 dw, bit 2 dbias, zeroed (dbias written). */
int64_t ms_cu_conv_scratch_floats(const ms_k_conv *g);
MS_CU_SLOT(conv_forward, const ms_k_conv *g, float *out, float *col, const float *x, const float *w,
           const float *bias);
MS_CU_SLOT(conv_backward, const ms_k_conv *g, float *dx, float *dw, float *dbias, float *col,
           const float *dout, const float *x, const float *w, unsigned fresh);
/* -- end conv -- */

/* -- pool: pooling, group normalisation, resizing (pool.cu; shapes in pool.h) --
 * Pooling and resizing: one thread per output element, the backward one per input element
 * gathering from its readers in the CPU kernel's order (no atomics). GroupNorm: one block per
 * (sample, group) row; the backward one block per (sample, channel) row for the channel sums,
 * then one thread per row, element and channel, in the scratch of
 * ms_k_group_norm_scratch_floats: the channel sums [2, N, C], then the group means [2, N, G]. */
MS_CU_SLOT(pool_forward, const ms_k_pool *g, float *out, int32_t *idx, const float *inp);
MS_CU_SLOT(pool_backward, const ms_k_pool *g, float *dinp, const float *dout, const int32_t *idx);
MS_CU_SLOT(group_norm_forward, const ms_k_gnorm *g, float *out, float *mean, float *rstd,
           const float *inp, const float *weight, const float *bias);
MS_CU_SLOT(group_norm_backward, const ms_k_gnorm *g, float *dinp, float *dweight, float *dbias,
           float *scratch, const float *dout, const float *inp, const float *weight,
           const float *mean, const float *rstd);
MS_CU_SLOT(resize_forward, const ms_k_resize *g, float *out, const float *inp);
MS_CU_SLOT(resize_backward, const ms_k_resize *g, float *dinp, const float *dout);
/* -- end pool -- */

#ifdef __cplusplus
}
#endif

#endif

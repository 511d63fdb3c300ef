/* cuda_kernels.h - the CUDA kernels: the GPU counterparts of engine/kernels/kernels.h (and of
 * AdamW and the gradient norm of engine/optim/optim.h), callable from C.
 *
 * Every pointer is device memory; sizes and argument order are the CPU kernels', and the
 * same conventions hold (backward kernels accumulate, forward kernels overwrite, shapes in the
 * comments of kernels.h). Each launcher enqueues on `stream` (a cudaStream_t; NULL is the
 * default stream), returns at once, and reports a launch error as MS_ERR_INTERNAL (or
 * MS_ERR_INVALID for an argument it cannot handle) with the CUDA error string in err; it never
 * aborts. The arithmetic of every kernel is a __host__ __device__ function in the *_math.cuh
 * headers beside this one, checked on the CPU by tests/test_cuda_host.cu.
 *
 * bf16 buffers are uint16_t bit patterns (engine/core/tensor.h's ms_bf16_from_f32 rounding):
 * the *_bf16 launchers take every tensor operand (parameters included) in bf16 and share the
 * fp32 launcher's template, so they compute exactly what it computes on widened values and
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
#include "engine/kernels/elementwise_ext.h"
#include "engine/kernels/fused.h"
#include "engine/kernels/index.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/layers.h"
#include "engine/kernels/reduce_ext.h"
#include "engine/optim/optim.h"

/* ---- the kernel context (backend_cuda.c): what a launch asks of its ms_kctx ----
 * The compute stream is the device's (core/device_cuda.c): it makes it on first use and
 * destroys it with itself. No kernel context keeps a copy: a launch asks for it here. */
typedef struct ms_kctx ms_kctx;

/* kc's device's compute stream (a cudaStream_t); made when kc was created, so always there. */
void *ms_cu_stream(const ms_kctx *kc);
/* kc's cuBLAS handle (a cublasHandle_t), made on the first product and bound then to the
 * device's compute stream; kc owns it and destroys it with itself. */
ms_status ms_cu_blas(ms_kctx *kc, void **out, ms_error *err);

/* ---- GEMM (gemm.cu: cuBLAS, fp32 accumulation) ---- */
/* The table's matmul slots: every operand fp32, or every operand bf16. */
ms_status ms_cu_matmul_forward(ms_kctx *kc, const ms_k_gemm *g, float *c, const float *a,
                               const float *b, float alpha, float beta, ms_error *err);
ms_status ms_cu_matmul_backward(ms_kctx *kc, const ms_k_gemm *g, float *da, float *db,
                                const float *dc, const float *a, const float *b, float alpha,
                                bool accumulate, ms_error *err);
ms_status ms_cu_matmul_forward_bf16(ms_kctx *kc, const ms_k_gemm *g, uint16_t *c, const uint16_t *a,
                                    const uint16_t *b, float alpha, float beta, ms_error *err);
ms_status ms_cu_matmul_backward_bf16(ms_kctx *kc, const ms_k_gemm *g, uint16_t *da, uint16_t *db,
                                     const uint16_t *dc, const uint16_t *a, const uint16_t *b,
                                     float alpha, bool accumulate, ms_error *err);
/* The same products for any operand and output types (the slots fix them). */
typedef enum ms_cu_dtype { MS_CU_F32, MS_CU_BF16 } ms_cu_dtype;
/* ms_k_matmul_forward on the GPU: a and b in ab_type, c in c_type. */
ms_status ms_cu_gemm_forward(ms_kctx *kc, const ms_k_gemm *g, void *c, ms_cu_dtype c_type,
                             const void *a, const void *b, ms_cu_dtype ab_type, float alpha,
                             float beta, ms_error *err);
/* ms_k_matmul_backward on the GPU: dc, a, b in in_type; da, db (either may be NULL) in
 * grad_type. */
ms_status ms_cu_gemm_backward(ms_kctx *kc, const ms_k_gemm *g, void *da, void *db,
                              ms_cu_dtype grad_type, const void *dc, const void *a, const void *b,
                              ms_cu_dtype in_type, float alpha, bool accumulate, ms_error *err);

/* ---- column reductions: the scratch of the backwards that sum over rows ----
 * dbias of bias add, bias + GELU and bias + dropout + residual add, LayerNorm's dweight and
 * dbias, RMSNorm's dweight sum an [n, c] tensor over its rows in two passes: one thread per
 * (chunk of 64 rows, column) writes each chunk's fp32 column sums to `scratch`, then one thread
 * per column adds them in chunk order onto the output. The order depends on n alone, so the
 * result is the same every run (it is not the CPU kernel's row order: fp32 results differ
 * from the CPU's by summation rounding). The caller owns the scratch, of
 * ms_cu_colsum_scratch_floats(n, c, terms) floats (terms: the sums the kernel makes, 2 for
 * LayerNorm, else 1), which no other launch may use until this one is done (stream order);
 * it may be NULL when the call has no such output. */
int64_t ms_cu_colsum_scratch_floats(int64_t n, int64_t c, int terms);

/* ---- elementwise ---- */
ms_status ms_cu_add_forward(float *out, const float *a, const float *b, int64_t n, void *stream,
                            ms_error *err);
ms_status ms_cu_add_backward(float *da, float *db, const float *dout, int64_t n, void *stream,
                             ms_error *err);
ms_status ms_cu_mul_forward(float *out, const float *a, const float *b, int64_t n, void *stream,
                            ms_error *err);
ms_status ms_cu_mul_backward(float *da, float *db, const float *dout, const float *a,
                             const float *b, int64_t n, void *stream, ms_error *err);
ms_status ms_cu_scale_forward(float *out, const float *x, float s, int64_t n, void *stream,
                              ms_error *err);
ms_status ms_cu_scale_backward(float *dx, const float *dout, float s, int64_t n, void *stream,
                               ms_error *err);
ms_status ms_cu_bias_add_forward(float *out, const float *inp, const float *bias, int64_t n,
                                 int64_t c, void *stream, ms_error *err);
/* dinp += dout, dbias += the column sums (the column reduction above, dinp done in its first
 * pass; without dbias one thread per element). */
ms_status ms_cu_bias_add_backward(float *dinp, float *dbias, float *scratch, const float *dout,
                                  int64_t n, int64_t c, unsigned fresh, void *stream,
                                  ms_error *err);
ms_status ms_cu_gelu_forward(float *out, const float *inp, int64_t n, void *stream, ms_error *err);
ms_status ms_cu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n,
                              void *stream, ms_error *err);

ms_status ms_cu_add_forward_bf16(uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n,
                                 void *stream, ms_error *err);
ms_status ms_cu_add_backward_bf16(uint16_t *da, uint16_t *db, const uint16_t *dout, int64_t n,
                                  void *stream, ms_error *err);
ms_status ms_cu_bias_add_forward_bf16(uint16_t *out, const uint16_t *inp, const uint16_t *bias,
                                      int64_t n, int64_t c, void *stream, ms_error *err);
ms_status ms_cu_bias_add_backward_bf16(uint16_t *dinp, uint16_t *dbias, float *scratch,
                                       const uint16_t *dout, int64_t n, int64_t c, unsigned fresh,
                                       void *stream, ms_error *err);
ms_status ms_cu_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t n, void *stream,
                                  ms_error *err);
ms_status ms_cu_gelu_backward_bf16(uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
                                   int64_t n, void *stream, ms_error *err);

/* The program's instructions: dst = value; bf16 <-> fp32 (ms_bf16_from_f32's rounding);
 * acc = round(acc + x) in fp32; integer ids from their float values; x *= s. */
ms_status ms_cu_fill(float *dst, float value, int64_t n, void *stream, ms_error *err);
ms_status ms_cu_bf16_widen(float *out, const uint16_t *in, int64_t n, void *stream, ms_error *err);
ms_status ms_cu_bf16_round(uint16_t *out, const float *in, int64_t n, void *stream, ms_error *err);
ms_status ms_cu_bf16_accumulate(uint16_t *acc, const uint16_t *x, int64_t n, void *stream,
                                ms_error *err);
ms_status ms_cu_ids_from_floats(int32_t *out, const float *in, int64_t n, void *stream,
                                ms_error *err);
ms_status ms_cu_scale_inplace(float *x, int64_t n, float s, void *stream, ms_error *err);
/* Sum over the middle dim of [O, D, I] in a fixed order: a block per output, the D terms over
 * its lanes and the lane tree, when there are few outputs (GPT-2's loss mean: one of 8192), else
 * one thread per output in order; the backward dinp += f * dout broadcast, one thread per input
 * element. */
ms_status ms_cu_sum_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i,
                            void *stream, ms_error *err);
ms_status ms_cu_sum_backward(float *dinp, const float *dout, float f, int64_t o, int64_t d,
                             int64_t i, void *stream, ms_error *err);

/* ---- LayerNorm and softmax (one block per row) ---- */
ms_status ms_cu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                  const float *weight, const float *bias, int64_t n, int64_t c,
                                  float eps, void *stream, ms_error *err);
ms_status ms_cu_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                                       const uint16_t *weight, const uint16_t *bias, int64_t n,
                                       int64_t c, float eps, void *stream, ms_error *err);
/* dinp one block per row; dweight and dbias the column reduction above (terms 2). */
ms_status ms_cu_layernorm_backward(float *dinp, float *dweight, float *dbias, float *scratch,
                                   const float *dout, const float *inp, const float *weight,
                                   const float *mean, const float *rstd, int64_t n, int64_t c,
                                   void *stream, ms_error *err);
ms_status ms_cu_layernorm_backward_bf16(uint16_t *dinp, uint16_t *dweight, uint16_t *dbias,
                                        float *scratch, const uint16_t *dout, const uint16_t *inp,
                                        const uint16_t *weight, const float *mean,
                                        const float *rstd, int64_t n, int64_t c, void *stream,
                                        ms_error *err);
ms_status ms_cu_softmax_forward(float *out, const float *inp, int64_t n, int64_t c, void *stream,
                                ms_error *err);
ms_status ms_cu_softmax_backward(float *dinp, const float *dout, const float *out, int64_t n,
                                 int64_t c, void *stream, ms_error *err);

/* ---- cross-entropy: the vocab-parallel pieces of kernels.h (one rank too) ---- */
/* bf16 logits (and their gradient, and the losses' gradient); the row statistics fp32. */
ms_status ms_cu_xent_vp_rowmax_bf16(float *lmax, const uint16_t *logits, int64_t n, int64_t vl,
                                    void *stream, ms_error *err);
ms_status ms_cu_xent_vp_sumexp_bf16(float *lsum, const uint16_t *logits, const float *gmax,
                                    int64_t n, int64_t vl, void *stream, ms_error *err);
ms_status ms_cu_xent_vp_target_bf16(float *ltgt, const uint16_t *logits, const int32_t *targets,
                                    int64_t n, int64_t vl, int64_t v0, void *stream, ms_error *err);
ms_status ms_cu_xent_vp_backward_bf16(uint16_t *dlogits, const uint16_t *logits, const float *gmax,
                                      const float *gsum, const int32_t *targets,
                                      const uint16_t *dlosses, int64_t n, int64_t vl, int64_t v0,
                                      unsigned fresh, void *stream, ms_error *err);
ms_status ms_cu_xent_vp_rowmax(float *lmax, const float *logits, int64_t n, int64_t vl,
                               void *stream, ms_error *err);
ms_status ms_cu_xent_vp_sumexp(float *lsum, const float *logits, const float *gmax, int64_t n,
                               int64_t vl, void *stream, ms_error *err);
ms_status ms_cu_xent_vp_target(float *ltgt, const float *logits, const int32_t *targets, int64_t n,
                               int64_t vl, int64_t v0, void *stream, ms_error *err);
ms_status ms_cu_xent_vp_loss(float *losses, const float *gmax, const float *gsum, const float *gtgt,
                             const int32_t *targets, int64_t n, void *stream, ms_error *err);
ms_status ms_cu_xent_vp_backward(float *dlogits, const float *logits, const float *gmax,
                                 const float *gsum, const int32_t *targets, const float *dlosses,
                                 int64_t n, int64_t vl, int64_t v0, unsigned fresh, void *stream,
                                 ms_error *err);

/* ---- embedding (embedding.cu). The backward is deterministic: each table row's
 * contributions are summed in ascending token order, the CPU kernel's, with no atomics; it
 * needs ms_cu_embedding_scratch_bytes(n, vl) bytes of device scratch, which the caller owns
 * and which must not be in use by another launch until this one is done (stream order). ---- */
size_t ms_cu_embedding_scratch_bytes(int64_t n, int64_t vl);
ms_status ms_cu_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                                  int64_t c, int64_t v0, int64_t vl, void *stream, ms_error *err);
ms_status ms_cu_embedding_backward(float *dtable, const int32_t *ids, const float *dout, int64_t n,
                                   int64_t c, int64_t v0, int64_t vl, void *scratch,
                                   size_t scratch_bytes, void *stream, ms_error *err);
ms_status ms_cu_embedding_forward_bf16(uint16_t *out, const int32_t *ids, const uint16_t *table,
                                       int64_t n, int64_t c, int64_t v0, int64_t vl, void *stream,
                                       ms_error *err);
ms_status ms_cu_embedding_backward_bf16(uint16_t *dtable, const int32_t *ids, const uint16_t *dout,
                                        int64_t n, int64_t c, int64_t v0, int64_t vl, void *scratch,
                                        size_t scratch_bytes, void *stream, ms_error *err);

/* ---- fused chains (fused.h) and gather / scatter-add (index.h) ---- */
ms_status ms_cu_bias_gelu_forward(float *out, const float *inp, const float *bias, int64_t n,
                                  int64_t c, void *stream, ms_error *err);
/* The backwards: the column reduction above over [n, c] (bias + dropout + residual add: over
 * [numel / nb, nb]), whose first pass also does dinp (and dres) for its elements; without
 * dbias that pass alone. */
ms_status ms_cu_bias_gelu_backward(float *dinp, float *dbias, float *scratch, const float *dout,
                                   const float *inp, const float *bias, int64_t n, int64_t c,
                                   unsigned fresh, void *stream, ms_error *err);
ms_status ms_cu_bias_dropout_add_forward(float *out, const float *inp, const float *bias,
                                         const float *res, int64_t nb, const ms_k_fused_dropout *d,
                                         void *stream, ms_error *err);
ms_status ms_cu_bias_dropout_add_backward(float *dinp, float *dbias, float *dres, float *scratch,
                                          const float *dout, int64_t nb,
                                          const ms_k_fused_dropout *d, unsigned fresh, void *stream,
                                          ms_error *err);
ms_status ms_cu_bias_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, const uint16_t *bias,
                                       int64_t n, int64_t c, void *stream, ms_error *err);
ms_status ms_cu_bias_gelu_backward_bf16(uint16_t *dinp, uint16_t *dbias, float *scratch,
                                        const uint16_t *dout, const uint16_t *inp,
                                        const uint16_t *bias, int64_t n, int64_t c, unsigned fresh,
                                        void *stream, ms_error *err);
ms_status ms_cu_bias_dropout_add_forward_bf16(uint16_t *out, const uint16_t *inp,
                                              const uint16_t *bias, const uint16_t *res, int64_t nb,
                                              const ms_k_fused_dropout *d, void *stream,
                                              ms_error *err);
ms_status ms_cu_bias_dropout_add_backward_bf16(uint16_t *dinp, uint16_t *dbias, uint16_t *dres,
                                               float *scratch, const uint16_t *dout, int64_t nb,
                                               const ms_k_fused_dropout *d, unsigned fresh,
                                               void *stream, ms_error *err);
ms_status ms_cu_gather(float *out, const float *x, const float *ids, const ms_k_gather_dims *g,
                       bool accumulate, void *stream, ms_error *err);
ms_status ms_cu_scatter_add(float *x, const float *src, const float *ids, const ms_k_gather_dims *g,
                            void *stream, ms_error *err);

/* ---- dropout: the CPU kernel's mask (Philox on global indices), one thread per element ---- */
ms_status ms_cu_dropout_forward(float *out, const float *inp, float p, uint64_t seed,
                                uint64_t stream_id, int ndim, const int64_t *lshape,
                                const int64_t *gstart, const int64_t *gshape,
                                const ms_k_batch_window *w, void *stream, ms_error *err);
ms_status ms_cu_dropout_backward(float *dinp, const float *dout, float p, uint64_t seed,
                                 uint64_t stream_id, int ndim, const int64_t *lshape,
                                 const int64_t *gstart, const int64_t *gshape,
                                 const ms_k_batch_window *w, void *stream, ms_error *err);
ms_status ms_cu_dropout_forward_bf16(uint16_t *out, const uint16_t *inp, float p, uint64_t seed,
                                     uint64_t stream_id, int ndim, const int64_t *lshape,
                                     const int64_t *gstart, const int64_t *gshape,
                                     const ms_k_batch_window *w, void *stream, ms_error *err);
ms_status ms_cu_dropout_backward_bf16(uint16_t *dinp, const uint16_t *dout, float p, uint64_t seed,
                                      uint64_t stream_id, int ndim, const int64_t *lshape,
                                      const int64_t *gstart, const int64_t *gshape,
                                      const ms_k_batch_window *w, void *stream, ms_error *err);

/* ---- optimizer ---- */
/* ms_adamw_step_scaled on the GPU (the same argument checks). */
ms_status ms_cu_adamw_step(float *p, const float *g, float *m, float *v, size_t n,
                           const ms_adamw_opts *o, int64_t t, float grad_scale, void *stream,
                           ms_error *err);
/* fp32 master weights with a bf16 gradient: p, m, v fp32, g bf16; p16 (the bf16 copy the
 * forward reads) is rewritten from the updated p, unless it is NULL. */
ms_status ms_cu_adamw_step_master(float *p, const uint16_t *g, float *m, float *v, uint16_t *p16,
                                  size_t n, const ms_adamw_opts *o, int64_t t, float grad_scale,
                                  void *stream, ms_error *err);
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
ms_status ms_cu_adamw_list(const ms_cu_adamw_item *items, int n, int64_t chunks,
                           const ms_adamw_opts *o, int64_t t, float grad_scale, void *stream,
                           ms_error *err);
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
ms_status ms_cu_cast_list(const ms_cu_cast_item *items, int n, int64_t chunks, void *stream,
                          ms_error *err);
/* *out (device) = sum of x^2 in double, in an order that depends on n alone.
 * scratch: ms_cu_sumsq_scratch_doubles(n) doubles of device memory. */
int64_t ms_cu_sumsq_scratch_doubles(int64_t n);
ms_status ms_cu_sumsq(double *out, double *scratch, const float *x, int64_t n, void *stream,
                      ms_error *err);
ms_status ms_cu_sumsq_bf16(double *out, double *scratch, const uint16_t *x, int64_t n, void *stream,
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
ms_status ms_cu_sumsq_list(double *out, double *scratch, const ms_cu_sumsq_item *items, int n,
                           int64_t chunks, void *stream, ms_error *err);

/* ---- attention: tiled and fused; saves lse [B, NH, T] instead of the probabilities ---- */
/* out: [B, T, C]   lse: [B, NH, T]   qkv: [B, T, 3C]   mask: [B, T] or NULL. HS <= 128. */
ms_status ms_cu_attention_forward(float *out, float *lse, const float *qkv, const float *mask,
                                  int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                                  void *stream, ms_error *err);
int64_t ms_cu_attention_scratch_floats(int64_t b, int64_t t, int64_t nh);
/* dqkv += gradient (fresh bit 0: dqkv = gradient). out and lse: the forward's. scratch:
 * ms_cu_attention_scratch_floats. */
ms_status ms_cu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                   const float *out, const float *lse, const float *mask, int64_t b,
                                   int64_t t, int64_t c, int64_t nh, bool causal, unsigned fresh,
                                   void *stream, ms_error *err);
/* bf16 qkv, out, dout and dqkv; lse fp32, and out_f32 [B, T, C] the output before rounding,
 * which the backward reads (as the fp32 path reads its saved copy of the output). */
ms_status ms_cu_attention_forward_bf16(uint16_t *out, float *lse, float *out_f32,
                                       const uint16_t *qkv, const float *mask, int64_t b, int64_t t,
                                       int64_t c, int64_t nh, bool causal, void *stream,
                                       ms_error *err);
ms_status ms_cu_attention_backward_bf16(uint16_t *dqkv, float *scratch, const uint16_t *dout,
                                        const uint16_t *qkv, const float *out_f32, const float *lse,
                                        const float *mask, int64_t b, int64_t t, int64_t c,
                                        int64_t nh, bool causal, unsigned fresh, void *stream,
                                        ms_error *err);

/* ---- grouped-query attention (layers.h's ms_k_gqa: strided heads, query head h reads kv
 * head h / (H / Hkv), causal from the global position q_start, mask [B, Tk] with 0 dropping a
 * key): the kernels above. D <= 128. saved: lse [B, H, Tq], then a copy of the output
 * [B, Tq, H, D]; scratch: delta [B, H, Tq]. A query that sees no key outputs zeros. */
int64_t ms_cu_gqa_saved_floats(const ms_k_gqa *g);
int64_t ms_cu_gqa_scratch_floats(const ms_k_gqa *g);
ms_status ms_cu_gqa_forward(const ms_k_gqa *g, float *out, float *saved, const float *q,
                            const float *k, const float *v, const float *mask, void *stream,
                            ms_error *err);
/* dq, dk, dv (any may be NULL) += gradients. */
ms_status ms_cu_gqa_backward(const ms_k_gqa *g, float *dq, float *dk, float *dv, float *scratch,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *saved, const float *mask, void *stream, ms_error *err);

/* ---- the LLaMA layers (llama.cu; shapes in layers.h) ---- */
/* RMSNorm: one block per row; dweight the column reduction above (terms 1). */
ms_status ms_cu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                int64_t n, int64_t c, float eps, void *stream, ms_error *err);
ms_status ms_cu_rmsnorm_backward(float *dinp, float *dweight, float *scratch, const float *dout,
                                 const float *inp, const float *weight, const float *rstd,
                                 int64_t n, int64_t c, void *stream, ms_error *err);
ms_status ms_cu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n,
                               void *stream, ms_error *err);
ms_status ms_cu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, int64_t n, void *stream, ms_error *err);
/* The tables: one thread per (position, frequency); the rotation: one per pair. */
ms_status ms_cu_rotary_tables(float *cosb, float *sinb, int64_t t, int64_t t0, int64_t d,
                              float theta, void *stream, ms_error *err);
ms_status ms_cu_rotary_apply(float *out, const float *inp, const float *cosb, const float *sinb,
                             int64_t b, int64_t t, int64_t h, int64_t d, bool inverse, void *stream,
                             ms_error *err);

/* ---- every other operator (ops_ext.cu): the slots of kernels/backend.h by op code ----
 * Elementwise, broadcasting and reductions: one thread per output element (a broadcasting
 * backward: per input element, summing its readers in order); views, block copies, scans,
 * triangles, masks, one-hot: one per element; sorting: one per element, by rank; the row
 * ops, NLL and smoothed cross-entropy: one per row; the batched matmul: one per element of
 * the output or of each operand's gradient; the pointwise losses' forward: one thread. The
 * backward of a view that reads an input element more than once (expand, repeat) adds with
 * atomics, in any order. */
ms_status ms_cu_copy(float *dst, const float *src, int64_t n, void *stream, ms_error *err);
ms_status ms_cu_unary_forward(ms_k_unary op, float *out, const float *inp, int64_t n, float p0,
                              float p1, void *stream, ms_error *err);
ms_status ms_cu_unary_backward(ms_k_unary op, float *dinp, const float *inp, const float *out,
                               const float *dout, int64_t n, float p0, float p1, void *stream,
                               ms_error *err);
ms_status ms_cu_binary_forward(ms_k_binary op, float *out, const float *a, const float *b,
                               const ms_k_bcast *bc, void *stream, ms_error *err);
ms_status ms_cu_binary_backward(ms_k_binary op, float *da, float *db, const float *dout,
                                const float *a, const float *b, const ms_k_bcast *bc, void *stream,
                                ms_error *err);
ms_status ms_cu_ternary_forward(ms_k_ternary op, float *out, const float *x, const float *y,
                                const float *z, const ms_k_bcast *bc, void *stream, ms_error *err);
ms_status ms_cu_ternary_backward(ms_k_ternary op, float *dx, float *dy, float *dz,
                                 const float *dout, const float *x, const float *y, const float *z,
                                 const ms_k_bcast *bc, void *stream, ms_error *err);
ms_status ms_cu_reduce_forward(ms_k_reduce op, float *out, float *pos, const float *inp,
                               const ms_k_rgeom *g, float scale, int correction, void *stream,
                               ms_error *err);
ms_status ms_cu_reduce_backward(ms_k_reduce op, float *dinp, const float *dout, const float *inp,
                                const float *pos, const ms_k_rgeom *g, float scale, int correction,
                                void *stream, ms_error *err);
ms_status ms_cu_view_forward(float *out, const float *inp, const ms_k_view *v, float fill,
                             void *stream, ms_error *err);
ms_status ms_cu_view_backward(float *dinp, const float *dout, const ms_k_view *v, void *stream,
                              ms_error *err);
ms_status ms_cu_block_copy(float *dst, const float *src, int64_t rows, int64_t cols, int64_t dst_ld,
                           int64_t src_ld, bool accumulate, void *stream, ms_error *err);
ms_status ms_cu_scan_forward(ms_k_scan op, float *out, const float *inp, int64_t o, int64_t d,
                             int64_t i, void *stream, ms_error *err);
ms_status ms_cu_scan_backward(ms_k_scan op, float *dinp, const float *dout, const float *inp,
                              int64_t o, int64_t d, int64_t i, void *stream, ms_error *err);
ms_status ms_cu_triangle(float *out, const float *inp, int64_t batch, int64_t rows, int64_t cols,
                         int64_t r0, int64_t c0, int64_t diag, bool upper, bool accumulate,
                         void *stream, ms_error *err);
ms_status ms_cu_masked_fill_forward(float *out, const float *x, const float *mask, float value,
                                    int64_t n, void *stream, ms_error *err);
ms_status ms_cu_masked_fill_backward(float *dinp, const float *dout, const float *mask, int64_t n,
                                     void *stream, ms_error *err);
ms_status ms_cu_one_hot(float *out, const float *ids, int64_t n, int64_t v, int64_t v0,
                        void *stream, ms_error *err);
ms_status ms_cu_sort_rows(float *values, float *indices, const float *inp, int64_t rows, int64_t c,
                          int64_t k, bool descending, void *stream, ms_error *err);
ms_status ms_cu_sort_rows_backward(float *dinp, const float *dout, const float *indices,
                                   int64_t rows, int64_t c, int64_t k, void *stream, ms_error *err);
ms_status ms_cu_rows_forward(ms_k_row_op op, float *out, float *aux, const float *x, const float *y,
                             int64_t n, int64_t c, float p, void *stream, ms_error *err);
ms_status ms_cu_rows_backward(ms_k_row_op op, float *dx, float *dy, const float *dout,
                              const float *x, const float *y, const float *out, const float *aux,
                              int64_t n, int64_t c, float p, void *stream, ms_error *err);
ms_status ms_cu_bmm_forward(const ms_k_bmm *g, float *c, const float *a, const float *b,
                            void *stream, ms_error *err);
ms_status ms_cu_bmm_backward(const ms_k_bmm *g, float *da, float *db, const float *dc,
                             const float *a, const float *b, void *stream, ms_error *err);
ms_status ms_cu_pointwise_loss_forward(ms_k_loss kind, float *out, const float *a, const float *b,
                                       int64_t n, float delta, float scale, void *stream,
                                       ms_error *err);
ms_status ms_cu_pointwise_loss_backward(ms_k_loss kind, float *da, float *db, const float *a,
                                        const float *b, const float *dout, int64_t n, float delta,
                                        float scale, void *stream, ms_error *err);
ms_status ms_cu_nll_forward(float *losses, const float *logp, const int32_t *targets, int64_t n,
                            int64_t vl, int64_t v0, void *stream, ms_error *err);
ms_status ms_cu_nll_backward(float *dlogp, const float *dlosses, const int32_t *targets, int64_t n,
                             int64_t vl, int64_t v0, void *stream, ms_error *err);
ms_status ms_cu_xent_smooth_forward(float *losses, float *lse, const float *logits,
                                    const int32_t *targets, int64_t n, int64_t v, float s,
                                    void *stream, ms_error *err);
ms_status ms_cu_xent_smooth_backward(float *dlogits, const float *logits, const float *lse,
                                     const int32_t *targets, const float *dlosses, int64_t n,
                                     int64_t v, float s, void *stream, ms_error *err);

#ifdef __cplusplus
}
#endif

#endif

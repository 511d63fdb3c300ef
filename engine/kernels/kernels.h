/* kernels.h - local (single-rank) CPU operator kernels, forward and backward.
 *
 * These are the leaves the engine's operators call once placement and communication have been
 * decided: they see one rank's contiguous float32 buffers and know nothing about meshes. The
 * style is llm.c's: raw pointers, sizes as arguments, a shape comment on every tensor argument.
 *
 * Shape letters:
 *   B batch, T time (sequence), C channels, NH heads, HS head size (C = NH * HS), V vocab,
 *   Vl local vocab slice, N rows (any flattened leading dims), M/K matrix dims,
 *   O/D/I outer, reduced and inner extents of a tensor viewed around one dim.
 *
 * Conventions every kernel here follows:
 *   - All buffers are contiguous, row-major float32 (ids and targets int32), host memory.
 *   - Kernels never allocate. Where a kernel needs working memory the caller passes it in and
 *     the size is stated next to the argument.
 *   - In meshscope ranks are threads, so a kernel never starts threads of its own. A rank may
 *     use the cores it was given: ms_k_blas_set_threads sizes OpenBLAS's pool (a process-wide
 *     setting, cores / ranks) and the same number of threads for the long streaming loops
 *     (GELU, adds, bias, LayerNorm forward, the optimizer), through each rank's own pool of
 *     sleeping workers (core/parallel.h). With one thread per rank everything runs inline.
 *   - Backward kernels ACCUMULATE (+=) into every gradient buffer, as in llm.c, because a tensor
 *     used twice (a residual) must receive the sum of its gradients; the caller zeroes gradients
 *     once per step. Exceptions say so: matmul and the copy kernels take an `accumulate` flag
 *     (plain overwrite lets sgemm skip reading the output).
 *   - Forward kernels overwrite their outputs. In-place use (out == inp) is allowed only where
 *     the comment says so.
 *   - Sizes are int64_t; sizes handed to BLAS must fit in an int.
 *   - Preconditions (non-negative sizes, ids inside the table, ...) are the caller's to check:
 *     kernels do not validate, to stay out of the inner loops.
 */
#ifndef MS_KERNELS_H
#define MS_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

/* ---- cost accounting ---------------------------------------------------------------------
 * Each op family has a *_cost function returning the work of one forward or backward call for
 * the given shapes; the cost model and the profiler read them. Counting convention:
 *   - flops: one multiply-add counts 2 (GEMM: 2*M*N*K per product); any other add, multiply,
 *     division, exp, log, tanh or sqrt counts 1. Comparisons (max, masks) and copies count 0.
 *     Elementwise counts are per element of the formula as written, not of libm's internals.
 *   - bytes: the compulsory traffic of an ideal kernel: every input read once, every output
 *     written once; an accumulated (+=) output is read and written (2x). 4 bytes per float and
 *     per int32. Caches, re-reads inside a kernel and scratch traffic are not counted.
 *   - Dropout counts its Philox rounds (integer multiplies) as ~60 flops per element: they
 *     occupy the same units and dominate its time.
 *   - Causal attention counts only the T*(T+1)/2 query-key pairs it needs, which is what the
 *     blocked kernel does (up to a small diagonal-block overhead).
 */
typedef struct ms_k_cost {
    double flops;
    double bytes;
} ms_k_cost;

/* ---- matmul (matmul.c) -------------------------------------------------------------------- */

/* A batched product C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i], i in [0, batch).
 * op(A) is m x k and op(B) is k x n. Storage, per batch item:
 *   A: [m, k], or [k, m] when trans_a      B: [k, n], or [n, k] when trans_b      C: [m, n]
 * Batch items are packed back to back; bcast_a (bcast_b) means a single A (B) is shared by every
 * item, as a weight is. A linear layer over [B*T, C] is batch = 1 with m = B*T. */
typedef struct ms_k_gemm {
    int64_t batch;
    int64_t m, n, k;
    bool trans_a, trans_b;
    bool bcast_a, bcast_b;
} ms_k_gemm;

/* c:     [batch, m, n]
 * a, b:  as described by g
 * beta == 0 means C is write-only (it may hold garbage, even NaN). */
void ms_k_matmul_forward(const ms_k_gemm *g, float *c, const float *a, const float *b, float alpha,
                         float beta);

/* Gradients of C = alpha * op(A) op(B) + beta * C0 with respect to A and B, through sgemm calls
 * with transpose flags (no copies). da / db may be NULL to skip one. accumulate = false
 * overwrites da / db, true adds to them. A broadcast operand's gradient is the sum over the
 * batch. The gradient for C0 (beta * dc) is the caller's business.
 * da: shape of a     db: shape of b     dc: [batch, m, n] */
void ms_k_matmul_backward(const ms_k_gemm *g, float *da, float *db, const float *dc, const float *a,
                          const float *b, float alpha, bool accumulate);

/* need_da / need_db select which backward products are counted (ignored for forward).
 * beta_nonzero adds the read of C in forward. Backward gradients count as written once (the
 * accumulate flag is the caller's choice and is not counted). */
ms_k_cost ms_k_matmul_cost(const ms_k_gemm *g, bool backward, bool beta_nonzero, bool need_da,
                           bool need_db);

/* OpenBLAS's thread pool size (process-wide). */
void ms_k_blas_set_threads(int n);
int ms_k_blas_threads(void);

/* ---- precision conversion (convert.c) ----------------------------------------------------
 * bf16 storage for mixed precision: kernels compute in fp32 on widened copies and their
 * results are rounded once (round-to-nearest-even, as ms_bf16_from_f32).
 * out, in: [N]; acc, x: [N] (bf16 bit patterns) */
void ms_k_bf16_widen(float *out, const uint16_t *in, int64_t n);
void ms_k_bf16_round(uint16_t *out, const float *in, int64_t n);
/* acc = round(acc + x), the sum in fp32 */
void ms_k_bf16_add_inplace(uint16_t *acc, const uint16_t *x, int64_t n);

/* ---- elementwise (elementwise.c) ---------------------------------------------------------- */

/* out = a + b, out = a * b, out = s * x; out may alias an input.
 * out, a, b, x: [N] */
void ms_k_add_forward(float *out, const float *a, const float *b, int64_t n);
/* da += dout, db += dout. da, db, dout: [N]; da or db may be NULL. */
void ms_k_add_backward(float *da, float *db, const float *dout, int64_t n);

void ms_k_mul_forward(float *out, const float *a, const float *b, int64_t n);
/* da += dout * b, db += dout * a. da, db, dout, a, b: [N]; da or db may be NULL. */
void ms_k_mul_backward(float *da, float *db, const float *dout, const float *a, const float *b,
                       int64_t n);

void ms_k_scale_forward(float *out, const float *x, float s, int64_t n);
/* dx += s * dout. dx, dout: [N] */
void ms_k_scale_backward(float *dx, const float *dout, float s, int64_t n);

/* out = inp + bias broadcast over rows; out may alias inp.
 * out, inp: [N, C]   bias: [C] */
void ms_k_bias_add_forward(float *out, const float *inp, const float *bias, int64_t n, int64_t c);
/* dinp += dout; dbias += sum over rows of dout. dinp may be NULL (bias only).
 * dinp, dout: [N, C]   dbias: [C] */
void ms_k_bias_add_backward(float *dinp, float *dbias, const float *dout, int64_t n, int64_t c);

/* GELU, tanh approximation, exactly as GPT-2 and llm.c:
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out, inp: [N]; out may alias inp. */
void ms_k_gelu_forward(float *out, const float *inp, int64_t n);
/* dinp += gelu'(inp) * dout. dinp, inp, dout: [N] */
void ms_k_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

typedef enum ms_k_elt {
    MS_K_ADD,
    MS_K_MUL,
    MS_K_SCALE,
    MS_K_BIAS_ADD, /* n = N * C elements, c = C */
    MS_K_GELU,
    MS_K_ELT_COUNT
} ms_k_elt;

/* n elements; c is the bias length for MS_K_BIAS_ADD and ignored otherwise. The backward counts
 * both input gradients for add and mul. */
ms_k_cost ms_k_elementwise_cost(ms_k_elt op, int64_t n, int64_t c, bool backward);

/* ---- normalisation (norm.c) --------------------------------------------------------------- */

/* LayerNorm over the last dim: out = (inp - mean) * rstd * weight + bias, rstd =
 * 1 / sqrt(var + eps) with the biased variance (GPT-2 uses eps = 1e-5).
 * out, inp: [N, C]   mean, rstd: [N] (saved for backward)   weight, bias: [C] */
void ms_k_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int64_t n, int64_t c,
                            float eps);
/* dinp += ..., dweight += ..., dbias += ... (any of the three may be NULL).
 * dinp, dout, inp: [N, C]   dweight, dbias, weight: [C]   mean, rstd: [N] */
void ms_k_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int64_t n, int64_t c);
ms_k_cost ms_k_layernorm_cost(int64_t n, int64_t c, bool backward);

/* Softmax over the last dim (max-subtracted). out, inp: [N, C]; out may alias inp. */
void ms_k_softmax_forward(float *out, const float *inp, int64_t n, int64_t c);
/* dinp += out * (dout - sum(dout * out)). dinp, dout, out: [N, C] */
void ms_k_softmax_backward(float *dinp, const float *dout, const float *out, int64_t n, int64_t c);
ms_k_cost ms_k_softmax_cost(int64_t n, int64_t c, bool backward);

/* ---- attention (attention.c) ------------------------------------------------------------- */

/* Rows of queries processed per sgemm block; causal attention skips the key blocks above it. */
#define MS_K_ATTN_ROW_BLOCK 64

/* Dropout on the probabilities (attn_pdrop), below; NULL or p = 0: none. */
struct ms_k_attn_dropout;

/* Fused multi-head self-attention on GPT-2's c_attn output. For each (b, h):
 *   S = Q K^T / sqrt(HS) (+ key mask) (causal: keys j > query i excluded), P = softmax(S),
 *   out = dropout(P) V,
 * with Q, K, V the head-h columns of the q, k and v parts of qkv.
 * out:  [B, T, C]
 * att:  [B, NH, T, T]  written: the probabilities P (zero where masked, before dropout), saved
 *       for backward
 * work: ms_k_attention_scratch_floats(T) floats, used only with dropout (may be NULL without)
 * qkv:  [B, T, 3C]     q, k, v concatenated on the last dim
 * mask: [B, T] or NULL, an additive key mask (0 keep, -INFINITY drop padding); each query must
 *       keep at least one key or its row is NaN. */
void ms_k_attention_forward(float *out, float *att, float *work, const float *qkv,
                            const float *mask, int64_t b, int64_t t, int64_t c, int64_t nh,
                            bool causal, const struct ms_k_attn_dropout *drop);

/* Working memory of the backward (and of a forward with dropout), in floats:
 * min(T, MS_K_ATTN_ROW_BLOCK) * T. */
int64_t ms_k_attention_scratch_floats(int64_t t);

/* dqkv += gradient. The mask needs no argument: its effect is stored in att; the dropout's is
 * drawn again from `drop`, which must be the forward's.
 * dqkv, qkv: [B, T, 3C]   dout: [B, T, C]   att: [B, NH, T, T]
 * scratch: ms_k_attention_scratch_floats(T) floats, contents ignored. */
void ms_k_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, int64_t b, int64_t t, int64_t c, int64_t nh,
                             bool causal, const struct ms_k_attn_dropout *drop);
ms_k_cost ms_k_attention_cost(int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                              bool backward);

/* ---- embedding (embedding.c) -------------------------------------------------------------- */

/* out[i] = table[ids[i] - v0] when v0 <= ids[i] < v0 + Vl, else zeros. A vocab-sharded table
 * (this rank holds rows [v0, v0 + Vl)) thus yields a partial result that the engine all-reduces
 * (sums) across the vocab shards; an unsharded table is v0 = 0, Vl = V.
 * out: [N, C]   ids: [N]   table: [Vl, C] */
void ms_k_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                            int64_t c, int64_t v0, int64_t vl);
/* dtable[ids[i] - v0] += dout[i] for ids inside the slice (a scatter-add; repeats sum).
 * dtable: [Vl, C]   ids: [N]   dout: [N, C] */
void ms_k_embedding_backward(float *dtable, const int32_t *ids, const float *dout, int64_t n,
                             int64_t c, int64_t v0, int64_t vl);
/* Counts every row as a hit (the sharded case reads and writes no more than that). */
ms_k_cost ms_k_embedding_cost(int64_t n, int64_t c, bool backward);

/* ---- cross-entropy (xent.c) --------------------------------------------------------------- */

/* Softmax cross-entropy per row, fused: loss[i] = logsumexp(logits[i]) - logits[i][targets[i]].
 * A negative target marks an ignored row (padding): loss 0 and zero gradient.
 * losses: [N]   lse: [N] (logsumexp, saved for backward)   logits: [N, V]   targets: [N] */
void ms_k_xent_forward(float *losses, float *lse, const float *logits, const int32_t *targets,
                       int64_t n, int64_t v);
/* dlogits += (softmax(logits) - onehot(target)) * dlosses[i].
 * dlogits, logits: [N, V]   lse, dlosses: [N]   targets: [N] */
void ms_k_xent_backward(float *dlogits, const float *logits, const float *lse,
                        const int32_t *targets, const float *dlosses, int64_t n, int64_t v);
/* Debug builds (no NDEBUG): aborts with a message naming the row unless every target is
 * ignored (< 0) or below v, the global vocabulary size; a no-op otherwise. The two kernels
 * above check themselves; the vocab-parallel pieces see only a slice and would silently drop
 * such a target, so their caller checks against the global size. */
void ms_k_xent_check_targets(const int32_t *targets, int64_t n, int64_t v);

/* Vocab-parallel building blocks. Each rank holds logits for the slice [v0, v0 + Vl) of V.
 *   1. ms_k_xent_vp_rowmax  -> local max      ; all-reduce MAX -> gmax
 *   2. ms_k_xent_vp_sumexp  -> local sumexp   ; all-reduce SUM -> gsum   (uses gmax)
 *   3. ms_k_xent_vp_target  -> local target   ; all-reduce SUM -> gtgt   (0 off-slice)
 *   4. ms_k_xent_vp_loss: loss = log(gsum) + gmax - gtgt on every rank
 *   backward: ms_k_xent_vp_backward on each rank's slice, no communication.
 * Steps 2 and 3 are independent, so the engine may fuse their two all-reduces into one.
 * logits: [N, Vl]   the per-row vectors: [N]   targets: [N] (global ids) */
void ms_k_xent_vp_rowmax(float *lmax, const float *logits, int64_t n, int64_t vl);
void ms_k_xent_vp_sumexp(float *lsum, const float *logits, const float *gmax, int64_t n,
                         int64_t vl);
void ms_k_xent_vp_target(float *ltgt, const float *logits, const int32_t *targets, int64_t n,
                         int64_t vl, int64_t v0);
/* losses may alias gtgt. Ignored rows (negative target) get 0. */
void ms_k_xent_vp_loss(float *losses, const float *gmax, const float *gsum, const float *gtgt,
                       const int32_t *targets, int64_t n);
/* dlogits += (exp(l - gmax) / gsum - [target == v]) * dlosses[i] over this slice.
 * dlogits, logits: [N, Vl] */
void ms_k_xent_vp_backward(float *dlogits, const float *logits, const float *gmax,
                           const float *gsum, const int32_t *targets, const float *dlosses,
                           int64_t n, int64_t vl, int64_t v0);
/* The one-rank composition of steps 1-4 (every all-reduce is the identity): the reference the
 * distributed path is tested against. gmax and gsum are outputs, for ms_k_xent_vp_backward.
 * losses, gmax, gsum: [N]   logits: [N, V] */
void ms_k_xent_vp_forward_local(float *losses, float *gmax, float *gsum, const float *logits,
                                const int32_t *targets, int64_t n, int64_t v);
/* The plain kernels over a [N, V] block (the vocab-parallel pieces cost the same per slice). */
ms_k_cost ms_k_xent_cost(int64_t n, int64_t v, bool backward);

/* ---- reductions (reduce.c) ---------------------------------------------------------------- */

/* Sum / mean over the middle dim of a tensor viewed as [O, D, I] (ms_k_dim_split gives O, D, I
 * for a dim of a shape). Forward overwrites out; backward broadcasts: dinp += dout (/ D).
 * out, dout: [O, I]   inp, dinp: [O, D, I] */
void ms_k_sum_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i);
void ms_k_sum_backward(float *dinp, const float *dout, int64_t o, int64_t d, int64_t i);
void ms_k_mean_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i);
void ms_k_mean_backward(float *dinp, const float *dout, int64_t o, int64_t d, int64_t i);
ms_k_cost ms_k_reduce_cost(int64_t o, int64_t d, int64_t i, bool mean, bool backward);

/* ---- dropout (dropout.c) ------------------------------------------------------------------ */

/* Inverted dropout: keep an element with probability 1 - p and scale it by 1 / (1 - p). The
 * keep decision for an element is ms_philox_uniform(seed, stream, g) >= p, where g is the
 * element's linear index in the GLOBAL tensor. The buffer holds the box of shape lshape starting
 * at gstart in a global tensor of shape gshape, so every sharding draws the same mask as the
 * whole tensor. The mask is recomputed in backward rather than stored. p >= 1 drops everything.
 * gstart NULL means all zeros; gshape NULL means lshape (the buffer is the whole tensor).
 * With a batch window w (NULL: none) and ndim >= 2, dim 0 is the batch and the global tensor is one
 * micro-batch of a larger batch: its row r is row ms_k_batch_row(w, r) of the step's batch,
 * and the mask is that row's, so splitting a batch into micro-batches keeps every mask.
 * out, inp: [lshape]; out may alias inp.   lshape, gstart, gshape: [ndim] */
typedef struct ms_k_batch_window {
    int64_t rows;   /* rows per data-parallel replica in the micro-batch (0: no window) */
    int64_t stride; /* rows per replica in the step's batch */
    int64_t offset; /* the micro-batch's first row within each replica's rows */
} ms_k_batch_window;
/* (r / rows) * stride + offset + r % rows; r itself without a window. */
int64_t ms_k_batch_row(const ms_k_batch_window *w, int64_t r);
void ms_k_dropout_forward(float *out, const float *inp, float p, uint64_t seed, uint64_t stream,
                          int ndim, const int64_t *lshape, const int64_t *gstart,
                          const int64_t *gshape, const ms_k_batch_window *w);
/* dinp += mask * dout / (1 - p), same mask as the forward with the same arguments. */
void ms_k_dropout_backward(float *dinp, const float *dout, float p, uint64_t seed, uint64_t stream,
                           int ndim, const int64_t *lshape, const int64_t *gstart,
                           const int64_t *gshape, const ms_k_batch_window *w);
ms_k_cost ms_k_dropout_cost(int64_t n, bool backward);
/* The pieces of the above for kernels that drop inside a fused pass: the local box, a walk
 * over its rows (the innermost dim) that hands each row's first global index (batch window
 * applied) to fn, and the keep decision of the element at global index g. */
typedef struct ms_k_dropout_box {
    int ndim;
    const int64_t *lshape, *gstart, *gshape; /* as ms_k_dropout_forward's */
    const ms_k_batch_window *w;
} ms_k_dropout_box;
typedef void (*ms_k_dropout_row_fn)(void *arg, int64_t row, uint64_t g, int64_t len);
void ms_k_dropout_rows(const ms_k_dropout_box *box, ms_k_dropout_row_fn fn, void *arg);
bool ms_k_dropout_keep(float p, uint64_t seed, uint64_t stream, uint64_t g);
static inline float ms_k_dropout_scale(float p) {
    return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
}

/* Dropout on attention's probabilities: element (b, h, i, j) of the buffer's [B, NH, T, T] is
 * kept when ms_k_dropout_keep(p, seed, stream, g) with
 *   g = ((ms_k_batch_row(w, b0 + b) * nh + h0 + h) * T + i) * T + j,
 * its linear index in the step's whole [batch, heads, T, T], as ms_k_dropout_forward would draw
 * it on that tensor: every split of the batch, its micro-batches and the heads drops the same
 * probabilities. Kept ones are scaled by 1 / (1 - p). */
typedef struct ms_k_attn_dropout {
    float p; /* 0: none */
    uint64_t seed, stream;
    int64_t b0, h0;             /* the global batch row and head of the buffer's first */
    int64_t nh;                 /* heads in the whole model */
    const ms_k_batch_window *w; /* or NULL */
} ms_k_attn_dropout;

/* ---- shape copies (shape.c) --------------------------------------------------------------- */

/* O, D, I of shape viewed around dim: O = prod(shape[:dim]), D = shape[dim],
 * I = prod(shape[dim+1:]). */
void ms_k_dim_split(int ndim, const int64_t *shape, int dim, int64_t *o, int64_t *d, int64_t *i);

/* out = inp with dims a and b swapped, as a new contiguous buffer. Its own backward: transpose
 * dout (whose shape is shape with a and b swapped) with the same a, b. accumulate adds into out.
 * inp: [shape]   out: [shape with a <-> b]   out must not alias inp. */
void ms_k_transpose(float *out, const float *inp, int ndim, const int64_t *shape, int a, int b,
                    bool accumulate);

/* Concatenate nparts tensors along one dim, each viewed as [O, sizes[p], I], into
 * out [O, sum(sizes), I]. Split is the inverse, and each is the other's backward.
 * accumulate adds into the destination(s) instead of overwriting. */
void ms_k_concat(float *out, const float *const *parts, const int64_t *sizes, int nparts, int64_t o,
                 int64_t i, bool accumulate);
void ms_k_split(float *const *parts, const float *inp, const int64_t *sizes, int nparts, int64_t o,
                int64_t i, bool accumulate);
/* Transpose, split and concat all move n elements (no flops). */
ms_k_cost ms_k_copy_cost(int64_t n, bool accumulate);

#endif

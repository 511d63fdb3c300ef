/* layers.h - local kernels of the neural-network layer operators (engine/ops/ops_layers.c):
 * RMSNorm, LayerNorm without affine, log-softmax, masked softmax, SwiGLU, rotary embedding,
 * grouped-query attention, batched products with broadcasting, and losses.
 *
 * The conventions of kernels.h hold: contiguous row-major float32 buffers, no allocation,
 * forward kernels overwrite their outputs, backward kernels ACCUMULATE (+=) into every input
 * gradient and skip a NULL one. Kernels that need global indices (rotary positions, a
 * vocabulary slice, causal query positions) take the box start of their local shard.
 */
#ifndef MS_KERNELS_LAYERS_H
#define MS_KERNELS_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/kernels.h"

/* ---- normalisation -------------------------------------------------------------------------- */

/* RMSNorm over the last dim: out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps).
 * out, inp: [N, C]   rstd: [N] (saved for backward)   weight: [C] */
void ms_k_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t n,
                          int64_t c, float eps);
/* dinp, dout, inp: [N, C]   dweight, weight: [C]   rstd: [N]; dinp or dweight may be NULL. */
void ms_k_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int64_t n, int64_t c);
ms_k_cost ms_k_rmsnorm_cost(int64_t n, int64_t c, bool backward);

/* LayerNorm without affine: out = (inp - mean) * rstd (biased variance, two passes).
 * out, inp: [N, C]   rstd: [N] (saved)   Backward reads the forward output. */
void ms_k_norm_plain_forward(float *out, float *rstd, const float *inp, int64_t n, int64_t c,
                             float eps);
/* dinp += rstd * (dout - mean(dout) - out * mean(dout * out)). dinp, dout, out: [N, C] */
void ms_k_norm_plain_backward(float *dinp, const float *dout, const float *out, const float *rstd,
                              int64_t n, int64_t c);

/* The per-row ops by op code, as the kernel tables run them (kernels/backend.h rows_*):
 * NORM_PLAIN (aux: rstd, p: eps), LOG_SOFTMAX, MASKED_SOFTMAX (y: mask, p: temperature) and
 * COSINE (x, y: a, b; p: eps). */
typedef enum ms_k_row_op {
    MS_K_ROW_NORM_PLAIN,
    MS_K_ROW_LOG_SOFTMAX,
    MS_K_ROW_MASKED_SOFTMAX,
    MS_K_ROW_COSINE,
} ms_k_row_op;
void ms_k_rows_forward(ms_k_row_op op, float *out, float *aux, const float *x, const float *y,
                       int64_t n, int64_t c, float p);
/* dx (and dy: cosine's db) += the gradient; out and aux are the forward's. */
void ms_k_rows_backward(ms_k_row_op op, float *dx, float *dy, const float *dout, const float *x,
                        const float *y, const float *out, const float *aux, int64_t n, int64_t c,
                        float p);

/* ---- softmax family ------------------------------------------------------------------------- */

/* out = inp - max - log(sum(exp(inp - max))) per row. out, inp: [N, C] */
void ms_k_log_softmax_forward(float *out, const float *inp, int64_t n, int64_t c);
/* dinp += dout - exp(out) * sum(dout). dinp, dout, out: [N, C] */
void ms_k_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t n,
                               int64_t c);

/* Softmax of inp / temperature over the entries whose mask is non-zero; masked entries (and
 * every entry of a fully masked row) are 0. out, inp, mask: [N, C] */
void ms_k_masked_softmax_forward(float *out, const float *inp, const float *mask, int64_t n,
                                 int64_t c, float temperature);
/* dinp += out * (dout - sum(dout * out)) / temperature. dinp, dout, out: [N, C] */
void ms_k_masked_softmax_backward(float *dinp, const float *dout, const float *out, int64_t n,
                                  int64_t c, float temperature);

/* Per-row normalisations and softmaxes: passes over a row as one ms_k_softmax_cost counts. */
ms_k_cost ms_k_rowwise_cost(int64_t n, int64_t c, double flops_per_elem, int tensors);

/* ---- SwiGLU -----------------------------------------------------------------------------------
 */

/* out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). out, gate, up: [N]; out may alias. */
void ms_k_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
/* dgate += dout * up * silu'(gate), dup += dout * silu(gate); either may be NULL. */
void ms_k_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, int64_t n);

/* ---- rotary position embedding ----------------------------------------------------------------
 */

/* cos and sin of position (t0 + t) * theta^(-2i / D) for t < T, i < D/2 (the angle in double,
 * reduced to [-pi, pi] before a float sincos): t0 is the GLOBAL position of the first local
 * row, so a sequence shard rotates exactly as the whole sequence does. cosb, sinb: [T, D/2] */
void ms_k_rotary_tables(float *cosb, float *sinb, int64_t t, int64_t t0, int64_t d, float theta);
/* LLaMA / Hugging Face rotate_half: pairs (i, i + D/2) of each head vector turn by the
 * angle of (t, i). inverse = true turns backwards (the backward of a rotation), and then
 * accumulates into out instead of overwriting.
 * out, inp: [B, T, H, D] (H any flattened middle dims)   cosb, sinb: [T, D/2] */
void ms_k_rotary_apply(float *out, const float *inp, const float *cosb, const float *sinb,
                       int64_t b, int64_t t, int64_t h, int64_t d, bool inverse);

/* ---- attention --------------------------------------------------------------------------------
 */

/* Grouped-query attention over strided head vectors. Query head h of token i reads the key
 * and value head h / (H / Hkv). Row i of a batch item starts at q + i * q_stride (keys and
 * values: k/v + j * kv_stride; output: out + i * out_stride), head h at + h * D; a batch item
 * spans T rows of each. So q [B, T, H, D] has q_stride H * D, and a packed qkv [B, T, 3, C]
 * is q = qkv, k = qkv + C, v = qkv + 2C with strides 3C and H = Hkv.
 * Causal: query i (global position q_start + i) sees keys j <= q_start + i. mask [B, Tk]
 * (0 drops a key, else keeps it) or NULL. A query that sees no key outputs zeros. */
typedef struct ms_k_gqa {
    int64_t b, tq, tk, h, hkv, d;
    int64_t q_stride, kv_stride, out_stride;
    int64_t q_start;
    bool causal;
} ms_k_gqa;
/* att: [B, H, Tq, Tk] written: the probabilities (0 where excluded), saved for backward. */
void ms_k_gqa_forward(const ms_k_gqa *g, float *out, float *att, const float *q, const float *k,
                      const float *v, const float *mask);
/* Working memory of the backward, in floats: min(Tq, MS_K_ATTN_ROW_BLOCK) * Tk. */
int64_t ms_k_gqa_scratch_floats(const ms_k_gqa *g);
/* dq, dk, dv (same strides as q, k, v; any may be NULL) += gradients. */
void ms_k_gqa_backward(const ms_k_gqa *g, float *dq, float *dk, float *dv, float *scratch,
                       const float *dout, const float *q, const float *k, const float *v,
                       const float *att);
ms_k_cost ms_k_gqa_cost(const ms_k_gqa *g, bool backward);

/* ---- batched products with broadcast batch dims -----------------------------------------------
 */

/* C[i] = A[ia(i)] B[ib(i)] for every index i of the batch shape, A items [M, K], B items
 * [K, N]. a_stride / b_stride give, per batch dim, the step in items of A / B (0 where that
 * operand broadcasts a size-1 or missing dim).
 * c: [batch..., M, N] */
#define MS_K_BMM_DIMS 6
typedef struct ms_k_bmm {
    int nb;                       /* batch dims */
    int64_t shape[MS_K_BMM_DIMS]; /* output batch shape */
    int64_t a_stride[MS_K_BMM_DIMS], b_stride[MS_K_BMM_DIMS];
    int64_t m, k, n;
} ms_k_bmm;
void ms_k_bmm_forward(const ms_k_bmm *g, float *c, const float *a, const float *b);
/* da += dC B^T, db += A^T dC, summed over the items that share an operand. */
void ms_k_bmm_backward(const ms_k_bmm *g, float *da, float *db, const float *dc, const float *a,
                       const float *b);
ms_k_cost ms_k_bmm_cost(const ms_k_bmm *g, bool backward);

/* ---- losses ------------------------------------------------------------------------------------
 */

typedef enum ms_k_loss { MS_K_LOSS_MSE, MS_K_LOSS_L1, MS_K_LOSS_HUBER } ms_k_loss;
/* Sum over the N elements of loss(a - b), in double: (a - b)^2, |a - b|, or Huber with
 * threshold delta (0.5 x^2 for |x| <= delta, else delta (|x| - delta / 2)). */
double ms_k_pointwise_loss_sum(ms_k_loss kind, const float *a, const float *b, int64_t n,
                               float delta);
/* da += scale * loss'(a - b), db -= the same; either may be NULL. */
void ms_k_pointwise_loss_backward(ms_k_loss kind, float *da, float *db, const float *a,
                                  const float *b, int64_t n, float delta, float scale);

/* out[0] = scale * the sum above; and its backward reading the output gradient dout[0]:
 * da += (dout[0] * scale) loss'(a - b), db -= the same. For tables whose memory the host
 * cannot read. */
void ms_k_pointwise_loss_forward(ms_k_loss kind, float *out, const float *a, const float *b,
                                 int64_t n, float delta, float scale);
void ms_k_pointwise_loss_backward_dev(ms_k_loss kind, float *da, float *db, const float *a,
                                      const float *b, const float *dout, int64_t n, float delta,
                                      float scale);

/* Negative log-likelihood of log-probabilities over a vocabulary slice [v0, v0 + Vl): losses[i]
 * = -logp[i][targets[i] - v0] when the target lies in the slice, else 0 (and for targets < 0).
 * losses: [N]   logp: [N, Vl]   targets: [N] */
void ms_k_nll_forward(float *losses, const float *logp, const int32_t *targets, int64_t n,
                      int64_t vl, int64_t v0);
void ms_k_nll_backward(float *dlogp, const float *dlosses, const int32_t *targets, int64_t n,
                       int64_t vl, int64_t v0);

/* Cross-entropy with label smoothing s: the target distribution is (1 - s) onehot + s / V, so
 * loss = lse - (1 - s) x[t] - s mean(x). Targets < 0: loss 0, no gradient.
 * losses, lse: [N] (lse saved)   logits: [N, V]   targets: [N] */
void ms_k_xent_smooth_forward(float *losses, float *lse, const float *logits,
                              const int32_t *targets, int64_t n, int64_t v, float s);
void ms_k_xent_smooth_backward(float *dlogits, const float *logits, const float *lse,
                               const int32_t *targets, const float *dlosses, int64_t n, int64_t v,
                               float s);

/* Cosine similarity of rows: out[i] = a.b / (max(|a|, eps) max(|b|, eps)).
 * out: [N]   a, b: [N, C] */
void ms_k_cosine_forward(float *out, const float *a, const float *b, int64_t n, int64_t c,
                         float eps);
void ms_k_cosine_backward(float *da, float *db, const float *dout, const float *a, const float *b,
                          int64_t n, int64_t c, float eps);

#endif

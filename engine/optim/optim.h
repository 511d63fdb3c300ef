/* optim.h - optimizer kernels on one rank's contiguous shard, and the LR schedule.
 *
 * Every update is elementwise, so a sharded parameter is updated shard by shard with the
 * same result as the whole tensor: the engine calls these on each rank's local slice of
 * parameters, gradients and optimizer state. Gradient-norm clipping is split the same way:
 * each rank computes ms_sumsq_f32 over its shard, the engine sums those across ranks (once
 * per replica), and ms_clip_scale turns the global norm into a factor for every shard.
 *
 * All arrays are caller-owned, contiguous, n floats, and must not alias each other.
 */
#ifndef MS_OPTIM_H
#define MS_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"

/* SGD, PyTorch semantics (dampening 0, no Nesterov):
 *   g' = g + weight_decay * p;  buf = momentum * buf + g';  p -= lr * buf
 * With momentum 0 `buf` is unused and may be NULL; otherwise it starts zeroed. */
typedef struct ms_sgd_opts {
    float lr;
    float momentum;     /* in [0, 1) */
    float weight_decay; /* L2 coupled into the gradient, >= 0 */
} ms_sgd_opts;

ms_status ms_sgd_step(float *p, const float *g, float *buf, size_t n, const ms_sgd_opts *o,
                      ms_error *err);

/* AdamW, PyTorch semantics (decoupled weight decay), for step t = 1, 2, ...:
 *   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 * m and v start zeroed. The engine passes weight_decay 0 for parameters it does not decay
 * (biases, layer norms). */
typedef struct ms_adamw_opts {
    float lr;
    float beta1;        /* in [0, 1), typically 0.9 */
    float beta2;        /* in [0, 1), typically 0.95 or 0.999 */
    float eps;          /* > 0, typically 1e-8 */
    float weight_decay; /* >= 0 */
} ms_adamw_opts;

ms_status ms_adamw_step(float *p, const float *g, float *m, float *v, size_t n,
                        const ms_adamw_opts *o, int64_t t, ms_error *err);
/* The same with g replaced by grad_scale * g (the clipping factor), in the same pass: one
 * streaming pass over 4 arrays instead of a scale pass and an update pass. g is not
 * modified. Uses the rank's threads (core/parallel.h). */
ms_status ms_adamw_step_scaled(float *p, const float *g, float *m, float *v, size_t n,
                               const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err);

/* The same with bf16 gradients (mixed precision): p, m and v are the fp32 master weights and
 * moments; each gradient is widened to fp32 before use. */
ms_status ms_adamw_step_bf16_grad(float *p, const uint16_t *g, float *m, float *v, size_t n,
                                  const ms_adamw_opts *o, int64_t t, float grad_scale,
                                  ms_error *err);

/* The argument checks of the AdamW steps (here and on the GPU): MS_ERR_INVALID with a message
 * naming the bad value. */
ms_status ms_adamw_check(const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err);

/* Sum of squares of x in double precision: this rank's share of the squared global norm.
 * Summed in fixed blocks, so the result is the same whatever the number of threads. */
double ms_sumsq_f32(const float *x, size_t n);
double ms_sumsq_bf16(const uint16_t *x, size_t n); /* x: bf16 bit patterns */

/* min(1, max_norm / (norm + 1e-6)), the factor to multiply every gradient by; 1 when
 * max_norm <= 0 (clipping off). A non-finite norm gives a non-finite or zero factor, as in
 * PyTorch: check isfinite(norm) first to skip a step with overflowed gradients. */
float ms_clip_scale(double norm, double max_norm);

/* x *= s. */
void ms_scale_f32(float *x, size_t n, float s);

/* Linear warmup, then cosine decay to lr_min:
 *   step < warmup:          lr_max * (step + 1) / warmup
 *   warmup <= step < total: lr_min + (lr_max - lr_min) * (1 + cos(pi * r)) / 2,
 *                           r = (step - warmup) / (total - warmup)
 *   step >= total:          lr_min
 * so lr(total) = lr_min; warmup never reaches 0 at step 0 (the first step already learns). */
typedef struct ms_lr_schedule {
    double lr_max;
    double lr_min;        /* in [0, lr_max] */
    int64_t warmup_steps; /* >= 0 */
    int64_t total_steps;  /* >= warmup_steps */
} ms_lr_schedule;

ms_status ms_lr_schedule_check(const ms_lr_schedule *s, ms_error *err);
double ms_lr_at(const ms_lr_schedule *s, int64_t step);

#endif

/* optim.c - SGD, AdamW, norm helpers and the warmup-cosine schedule. */
#include "engine/optim/optim.h"

#include <math.h>
#include <string.h>

#include "engine/core/parallel.h"

ms_status ms_sgd_step(float *p, const float *g, float *buf, size_t n, const ms_sgd_opts *o,
                      ms_error *err) {
    if (!(o->lr >= 0) || !(o->momentum >= 0 && o->momentum < 1) || !(o->weight_decay >= 0))
        return ms_fail(err, MS_ERR_INVALID,
                       "sgd: lr %g, momentum %g, weight_decay %g; need lr >= 0, momentum in "
                       "[0, 1), weight_decay >= 0",
                       o->lr, o->momentum, o->weight_decay);
    if (o->momentum > 0 && !buf)
        return ms_fail(err, MS_ERR_INVALID, "sgd: momentum %g needs a momentum buffer",
                       o->momentum);
    const float lr = o->lr, mu = o->momentum, wd = o->weight_decay;
    if (mu == 0) {
        for (size_t i = 0; i < n; i++) p[i] -= lr * (g[i] + wd * p[i]);
    } else {
        for (size_t i = 0; i < n; i++) {
            float b = mu * buf[i] + (g[i] + wd * p[i]);
            buf[i] = b;
            p[i] -= lr * b;
        }
    }
    return MS_OK;
}

typedef struct adamw_job {
    float *p, *m, *v;
    const float *g;
    const uint16_t *g16; /* bf16 gradients instead of g */
    float gscale, step, inv_sqrt_bc2, b1, b2, eps, decay;
} adamw_job;

/* One element's update; gi is the (scaled) gradient. */
static inline void adamw_one(const adamw_job *j, int64_t i, float gi) {
    const float mi = j->b1 * j->m[i] + (1.0f - j->b1) * gi;
    const float vi = j->b2 * j->v[i] + (1.0f - j->b2) * gi * gi;
    j->m[i] = mi;
    j->v[i] = vi;
    j->p[i] = j->p[i] * j->decay - j->step * mi / (sqrtf(vi) * j->inv_sqrt_bc2 + j->eps);
}

ms_status ms_adamw_check(const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err) {
    if (t < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "adamw: step %lld; steps count from 1 (the bias correction divides by "
                       "1 - beta^t)",
                       (long long)t);
    if (!(o->lr >= 0) || !(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) ||
        !(o->eps > 0) || !(o->weight_decay >= 0) || !(grad_scale >= 0))
        return ms_fail(err, MS_ERR_INVALID,
                       "adamw: lr %g, betas (%g, %g), eps %g, weight_decay %g, gradient scale %g; "
                       "need lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, scale >= 0",
                       o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, grad_scale);
    return MS_OK;
}

static void adamw_range(void *arg, int64_t lo, int64_t hi) {
    const adamw_job *j = arg;
    const float *restrict g = j->g;
    for (int64_t i = lo; i < hi; i++) adamw_one(j, i, g[i] * j->gscale);
}

static inline float widen_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void adamw_range_bf16(void *arg, int64_t lo, int64_t hi) {
    const adamw_job *j = arg;
    const uint16_t *restrict g = j->g16;
    for (int64_t i = lo; i < hi; i++) adamw_one(j, i, widen_bf16(g[i]) * j->gscale);
}

static ms_status adamw_run(adamw_job *j, size_t n, const ms_adamw_opts *o, int64_t t,
                           float grad_scale, ms_error *err) {
    MS_CHECK(ms_adamw_check(o, t, grad_scale, err));
    /* Bias corrections in double: for beta2 = 0.999 and small t, 1 - beta2^t in float loses
     * most of its digits. */
    const double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
    j->gscale = grad_scale;
    j->step = (float)(o->lr / bc1);
    j->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    j->b1 = o->beta1;
    j->b2 = o->beta2;
    j->eps = o->eps;
    j->decay = 1.0f - o->lr * o->weight_decay;
    ms_parallel_for((int64_t)n, 1 << 15, j->g16 ? adamw_range_bf16 : adamw_range, j);
    return MS_OK;
}

ms_status ms_adamw_step_scaled(float *p, const float *g, float *m, float *v, size_t n,
                               const ms_adamw_opts *o, int64_t t, float grad_scale, ms_error *err) {
    adamw_job j = {.p = p, .m = m, .v = v, .g = g};
    return adamw_run(&j, n, o, t, grad_scale, err);
}

ms_status ms_adamw_step_bf16_grad(float *p, const uint16_t *g, float *m, float *v, size_t n,
                                  const ms_adamw_opts *o, int64_t t, float grad_scale,
                                  ms_error *err) {
    adamw_job j = {.p = p, .m = m, .v = v, .g16 = g};
    return adamw_run(&j, n, o, t, grad_scale, err);
}

ms_status ms_adamw_step(float *p, const float *g, float *m, float *v, size_t n,
                        const ms_adamw_opts *o, int64_t t, ms_error *err) {
    return ms_adamw_step_scaled(p, g, m, v, n, o, t, 1.0f, err);
}

/* Sum of squares in fixed blocks: the block partials are added in block order, so the
 * result depends on n alone, never on how many threads computed it. */
#define SUMSQ_MAX_BLOCKS 4096
typedef struct sumsq_job {
    const float *x;
    const uint16_t *x16; /* bf16 instead of x */
    int64_t n, block;
    double part[SUMSQ_MAX_BLOCKS];
} sumsq_job;

static void sumsq_range(void *arg, int64_t lo, int64_t hi) {
    sumsq_job *j = arg;
    for (int64_t b = lo; b < hi; b++) {
        int64_t len = j->n - b * j->block < j->block ? j->n - b * j->block : j->block;
        double s = 0;
        if (j->x16) {
            const uint16_t *x = j->x16 + b * j->block;
            for (int64_t i = 0; i < len; i++) s += (double)widen_bf16(x[i]) * widen_bf16(x[i]);
        } else {
            const float *x = j->x + b * j->block;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < len; i++) s += (double)x[i] * (double)x[i];
        }
        j->part[b] = s;
    }
}

static double sumsq(const float *x, const uint16_t *x16, size_t n) {
    static _Thread_local sumsq_job j; /* 32 KiB: too big for every rank's stack frame */
    j.x = x;
    j.x16 = x16;
    j.n = (int64_t)n;
    j.block = 1 << 16;
    if (j.n > j.block * SUMSQ_MAX_BLOCKS) j.block = (j.n + SUMSQ_MAX_BLOCKS - 1) / SUMSQ_MAX_BLOCKS;
    int64_t blocks = (j.n + j.block - 1) / j.block;
    ms_parallel_for(blocks, 1, sumsq_range, &j);
    double s = 0;
    for (int64_t b = 0; b < blocks; b++) s += j.part[b];
    return s;
}

double ms_sumsq_f32(const float *x, size_t n) {
    return sumsq(x, NULL, n);
}

double ms_sumsq_bf16(const uint16_t *x, size_t n) {
    return sumsq(NULL, x, n);
}

float ms_clip_scale(double norm, double max_norm) {
    if (!(max_norm > 0)) return 1.0f;
    double s = max_norm / (norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

void ms_scale_f32(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

ms_status ms_lr_schedule_check(const ms_lr_schedule *s, ms_error *err) {
    if (!(s->lr_max > 0) || !(s->lr_min >= 0 && s->lr_min <= s->lr_max))
        return ms_fail(err, MS_ERR_INVALID,
                       "lr schedule: lr_max %g and lr_min %g; need lr_max > 0 and 0 <= lr_min <= "
                       "lr_max",
                       s->lr_max, s->lr_min);
    if (s->warmup_steps < 0 || s->total_steps < s->warmup_steps)
        return ms_fail(err, MS_ERR_INVALID,
                       "lr schedule: warmup %lld steps of %lld total; need 0 <= warmup <= total "
                       "(lower the warmup or train longer)",
                       (long long)s->warmup_steps, (long long)s->total_steps);
    return MS_OK;
}

double ms_lr_at(const ms_lr_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    if (step < s->warmup_steps) return s->lr_max * (double)(step + 1) / (double)s->warmup_steps;
    if (step >= s->total_steps) return s->lr_min;
    double r = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    return s->lr_min + (s->lr_max - s->lr_min) * 0.5 * (1.0 + cos(M_PI * r));
}

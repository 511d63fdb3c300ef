/* test_optim.c - SGD, AdamW, norm clipping and the LR schedule against straightforward
 * double-precision references, including a 200-step AdamW trajectory and shard-by-shard
 * updates equal to whole-tensor ones. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/parallel.h"
#include "engine/optim/optim.h"
#include "tests/testkit.h"

enum { N = 1000 };

/* Gradient of step s for element i: deterministic, mixed signs and scales. */
static float grad(int s, int i) {
    return (float)(ms_philox_normal(11, (uint64_t)s, (uint64_t)i) * (1.0 + (i % 7)) * 0.1);
}

static void assert_close(double got, double want, double rtol, double atol, const char *what,
                         int i) {
    if (!(fabs(got - want) <= atol + rtol * fabs(want)))
        fail_msg("%s[%d]: got %.9g, want %.9g", what, i, got, want);
}

static void sgd(void **state) {
    (void)state;
    float p[N], buf[N], g[N];
    double rp[N], rb[N];
    for (int i = 0; i < N; i++) {
        p[i] = (float)(ms_philox_normal(3, 0, (uint64_t)i));
        rp[i] = p[i];
        buf[i] = 0;
        rb[i] = 0;
    }
    ms_error err = {0};
    /* Plain SGD, one step. */
    ms_sgd_opts o = {.lr = 0.1f};
    float q[N];
    memcpy(q, p, sizeof q);
    for (int i = 0; i < N; i++) g[i] = grad(0, i);
    assert_int_equal(ms_sgd_step(q, g, NULL, N, &o, &err), MS_OK);
    for (int i = 0; i < N; i++) assert_close(q[i], rp[i] - 0.1 * (double)g[i], 1e-6, 1e-7, "p", i);
    /* Momentum and weight decay, 20 steps. */
    o = (ms_sgd_opts){.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f};
    for (int s = 0; s < 20; s++) {
        for (int i = 0; i < N; i++) g[i] = grad(s, i);
        assert_int_equal(ms_sgd_step(p, g, buf, N, &o, &err), MS_OK);
        for (int i = 0; i < N; i++) {
            double gi = (double)g[i] + 0.01 * rp[i];
            rb[i] = 0.9 * rb[i] + gi;
            rp[i] -= 0.05 * rb[i];
        }
    }
    for (int i = 0; i < N; i++) assert_close(p[i], rp[i], 1e-5, 1e-6, "p", i);
    o.momentum = 0.5f;
    assert_int_equal(ms_sgd_step(p, g, NULL, N, &o, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "needs a momentum buffer"));
    o.momentum = 1.0f;
    assert_int_equal(ms_sgd_step(p, g, buf, N, &o, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "momentum in [0, 1)"));
}

/* The textbook AdamW in double, PyTorch's order of operations. */
static void adamw_ref(double *p, const float *g, double *m, double *v, int n, double lr, double b1,
                      double b2, double eps, double wd, int t) {
    for (int i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * (double)g[i] * g[i];
        double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

static void adamw_first_step(void **state) {
    (void)state;
    /* Step 1 from zero moments: mhat = g and vhat = g^2, so the update is lr * sign(g) (up
     * to eps), independent of |g|: a known closed form. */
    float p[4] = {1, -1, 0.5f, 2}, m[4] = {0}, v[4] = {0};
    const float g[4] = {0.3f, -2.0f, 1e-3f, 0};
    ms_adamw_opts o = {
        .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    ms_error err = {0};
    assert_int_equal(ms_adamw_step(p, g, m, v, 4, &o, 1, &err), MS_OK);
    const double decay = 1 - 0.01 * 0.1;
    assert_close(p[0], 1 * decay - 0.01, 1e-6, 1e-7, "p", 0);
    assert_close(p[1], -1 * decay + 0.01, 1e-6, 1e-7, "p", 1);
    assert_close(p[2], 0.5 * decay - 0.01 * 1e-3 / (1e-3 + 1e-8), 1e-6, 1e-7, "p", 2);
    assert_close(p[3], 2 * decay, 1e-6, 1e-7, "p", 3);
    assert_close(m[1], -0.2, 1e-6, 0, "m", 1);
    /* 1 - beta2 in float is 0.0009999871: the tolerance covers that rounding. */
    assert_close(v[1], 0.004, 1e-4, 0, "v", 1);
    assert_int_equal(ms_adamw_step(p, g, m, v, 4, &o, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "steps count from 1"));
    o.eps = 0;
    assert_int_equal(ms_adamw_step(p, g, m, v, 4, &o, 1, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "eps > 0"));
}

static void adamw_trajectory(void **state) {
    (void)state;
    float *p = malloc(sizeof(float) * N), *m = calloc(N, sizeof(float)),
          *v = calloc(N, sizeof(float)), *g = malloc(sizeof(float) * N);
    /* The same run split into 3 uneven shards, as on 3 ranks. */
    float *ps = malloc(sizeof(float) * N), *ms = calloc(N, sizeof(float)),
          *vs = calloc(N, sizeof(float));
    double *rp = malloc(sizeof(double) * N), *rm = calloc(N, sizeof(double)),
           *rv = calloc(N, sizeof(double));
    for (int i = 0; i < N; i++) {
        p[i] = ps[i] = (float)ms_philox_normal(5, 0, (uint64_t)i);
        rp[i] = p[i];
    }
    const ms_adamw_opts o = {
        .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    ms_error err = {0};
    const size_t cuts[4] = {0, 333, 334, N};
    for (int t = 1; t <= 200; t++) {
        for (int i = 0; i < N; i++) g[i] = grad(t, i) + 0.05f * p[i];
        assert_int_equal(ms_adamw_step(p, g, m, v, N, &o, t, &err), MS_OK);
        for (int k = 0; k < 3; k++)
            assert_int_equal(ms_adamw_step(ps + cuts[k], g + cuts[k], ms + cuts[k], vs + cuts[k],
                                           cuts[k + 1] - cuts[k], &o, t, &err),
                             MS_OK);
        adamw_ref(rp, g, rm, rv, N, 3e-3, 0.9, 0.95, 1e-8, 0.1, t);
    }
    /* Float state against the double reference after 200 steps: every parameter moved by
     * up to ~0.6, and the float run stays within 1e-4 of it. */
    double moved = 0;
    for (int i = 0; i < N; i++) {
        assert_close(p[i], rp[i], 1e-4, 1e-5, "p", i);
        assert_close(m[i], rm[i], 1e-4, 1e-6, "m", i);
        assert_close(v[i], rv[i], 1e-4, 1e-8, "v", i);
        moved = fmax(moved, fabs(rp[i] - ms_philox_normal(5, 0, (uint64_t)i)));
    }
    assert_true(moved > 0.1);
    /* Shards: bit-identical to the whole. */
    assert_memory_equal(p, ps, sizeof(float) * N);
    assert_memory_equal(m, ms, sizeof(float) * N);
    assert_memory_equal(v, vs, sizeof(float) * N);
    free(p), free(m), free(v), free(g), free(ps), free(ms), free(vs), free(rp), free(rm), free(rv);
}

static void clipping(void **state) {
    (void)state;
    float g[N];
    double ref = 0;
    for (int i = 0; i < N; i++) {
        g[i] = grad(1, i);
        ref += (double)g[i] * g[i];
    }
    /* Sum of shard sums = whole (what the engine's all-reduce relies on). */
    double whole = ms_sumsq_f32(g, N), parts = ms_sumsq_f32(g, 400) + ms_sumsq_f32(g + 400, 600);
    assert_close(whole, ref, 1e-12, 0, "sumsq", 0);
    assert_close(parts, ref, 1e-12, 0, "sumsq parts", 0);
    double norm = sqrt(whole);
    float s = ms_clip_scale(norm, 1.0);
    assert_close(s, 1.0 / (norm + 1e-6), 1e-6, 0, "scale", 0);
    ms_scale_f32(g, N, s);
    assert_close(sqrt(ms_sumsq_f32(g, N)), 1.0, 1e-5, 0, "clipped norm", 0);
    assert_true(ms_clip_scale(0.5, 1.0) == 1.0f);
    assert_true(ms_clip_scale(0.0, 1.0) == 1.0f);
    assert_true(ms_clip_scale(100.0, 0.0) == 1.0f);
    assert_close(ms_clip_scale(4.0, 1.0), 0.25, 1e-6, 0, "scale", 1);
}

static void lr_schedule(void **state) {
    (void)state;
    ms_lr_schedule s = {.lr_max = 6e-4, .lr_min = 6e-5, .warmup_steps = 10, .total_steps = 110};
    ms_error err = {0};
    assert_int_equal(ms_lr_schedule_check(&s, &err), MS_OK);
    assert_close(ms_lr_at(&s, 0), 6e-5, 1e-12, 0, "lr", 0);
    assert_close(ms_lr_at(&s, 4), 3e-4, 1e-12, 0, "lr", 4);
    assert_close(ms_lr_at(&s, 9), 6e-4, 1e-12, 0, "lr", 9);
    assert_close(ms_lr_at(&s, 10), 6e-4, 1e-12, 0, "lr", 10);
    assert_close(ms_lr_at(&s, 60), 3.3e-4, 1e-12, 0, "lr", 60); /* halfway: the mean */
    assert_close(ms_lr_at(&s, 110), 6e-5, 1e-12, 0, "lr", 110);
    assert_close(ms_lr_at(&s, 1000), 6e-5, 1e-12, 0, "lr", 1000);
    for (int64_t k = 10; k < 110; k++) {
        double r = (double)(k - 10) / 100;
        assert_close(ms_lr_at(&s, k), 6e-5 + (6e-4 - 6e-5) * 0.5 * (1 + cos(M_PI * r)), 1e-12, 0,
                     "lr", (int)k);
        assert_true(ms_lr_at(&s, k + 1) <= ms_lr_at(&s, k));
    }
    /* No warmup; warmup = total. */
    s.warmup_steps = 0;
    assert_close(ms_lr_at(&s, 0), 6e-4, 1e-12, 0, "lr", 0);
    s.warmup_steps = s.total_steps = 5;
    assert_int_equal(ms_lr_schedule_check(&s, &err), MS_OK);
    assert_close(ms_lr_at(&s, 4), 6e-4, 1e-12, 0, "lr", 4);
    assert_close(ms_lr_at(&s, 5), 6e-5, 1e-12, 0, "lr", 5);
    s.warmup_steps = 6;
    assert_int_equal(ms_lr_schedule_check(&s, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "warmup 6 steps of 5 total"));
    s.warmup_steps = 1;
    s.lr_min = 1;
    assert_int_equal(ms_lr_schedule_check(&s, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "0 <= lr_min <= lr_max"));
}

/* --- the rank's threads (core/parallel.h) ------------------------------------------- */

/* The fused clip + AdamW pass equals scaling the gradient and then stepping (bit for bit),
 * on 1 and 3 threads; the gradient norm is the same number on any thread count. */
static void fused_scaled_adamw(void **state) {
    (void)state;
    enum { M = 300007 };
    float *g = malloc(sizeof *g * M), *gs = malloc(sizeof *gs * M);
    float *p[2], *m[2], *v[2];
    for (int k = 0; k < 2; k++) {
        p[k] = malloc(sizeof(float) * M);
        m[k] = calloc(M, sizeof(float));
        v[k] = calloc(M, sizeof(float));
    }
    ms_adamw_opts o = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    ms_error err = {0};
    double norms[3];
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < M; i++) p[0][i] = p[1][i] = grad(99, i);
        memset(m[0], 0, sizeof(float) * M), memset(m[1], 0, sizeof(float) * M);
        memset(v[0], 0, sizeof(float) * M), memset(v[1], 0, sizeof(float) * M);
        ms_parallel_set_threads(t);
        for (int step = 1; step <= 3; step++) {
            for (int i = 0; i < M; i++) g[i] = gs[i] = grad(step, i);
            norms[t - 1] = sqrt(ms_sumsq_f32(g, M));
            float scale = ms_clip_scale(norms[t - 1], 1.0);
            assert_true(scale < 1.0f);
            ms_scale_f32(gs, M, scale);
            assert_int_equal(ms_adamw_step(p[0], gs, m[0], v[0], M, &o, step, &err), MS_OK);
            assert_int_equal(ms_adamw_step_scaled(p[1], g, m[1], v[1], M, &o, step, scale, &err),
                             MS_OK);
            assert_memory_equal(p[0], p[1], sizeof(float) * M);
            assert_memory_equal(m[0], m[1], sizeof(float) * M);
            assert_memory_equal(v[0], v[1], sizeof(float) * M);
        }
    }
    assert_true(norms[0] == norms[1] && norms[1] == norms[2]);
    /* against a plain double sum */
    double ref = 0;
    for (int i = 0; i < M; i++) ref += (double)g[i] * g[i];
    assert_close(norms[0] * norms[0], ref, 1e-12, 0, "sumsq", 0);
    ms_parallel_set_threads(1);
    for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(v[k]);
    free(g), free(gs);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sgd),
    cmocka_unit_test(adamw_first_step),
    cmocka_unit_test(adamw_trajectory),
    cmocka_unit_test(clipping),
    cmocka_unit_test(lr_schedule),
    cmocka_unit_test(fused_scaled_adamw),
};
MT_MAIN("optim", tests)

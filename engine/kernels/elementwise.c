/* elementwise.c - add, mul, scale, bias add and GELU, forward and backward.
 *
 * Plain loops over contiguous memory that the compiler vectorises; nothing here is worth BLAS.
 * The long ones are split across the rank's threads (core/parallel.h).
 */
#include "engine/kernels/kernels.h"
#include "engine/kernels/fastmath.h"
#include "engine/core/parallel.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Long streaming loops are split across the rank's threads (core/parallel.h) in chunks of
 * at least GRAIN elements; shorter ones run inline. */
#define GRAIN (1 << 14)

typedef struct elt_job {
    float *out, *out2;
    const float *a, *b, *c;
    int64_t cols;
} elt_job;

static void add_fwd_range(void *arg, int64_t lo, int64_t hi) {
    const elt_job *j = arg;
    for (int64_t i = lo; i < hi; i++) j->out[i] = j->a[i] + j->b[i];
}

void ms_k_add_forward(float *out, const float *a, const float *b, int64_t n) {
    elt_job j = {.out = out, .a = a, .b = b};
    ms_parallel_for(n, GRAIN, add_fwd_range, &j);
}

static void add_bwd_range(void *arg, int64_t lo, int64_t hi) {
    const elt_job *j = arg;
    if (j->out)
        for (int64_t i = lo; i < hi; i++) j->out[i] += j->a[i];
    if (j->out2)
        for (int64_t i = lo; i < hi; i++) j->out2[i] += j->a[i];
}

void ms_k_add_backward(float *da, float *db, const float *dout, int64_t n) {
    elt_job j = {.out = da, .out2 = db, .a = dout};
    ms_parallel_for(n, GRAIN, add_bwd_range, &j);
}

void ms_k_mul_forward(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

void ms_k_mul_backward(float *da, float *db, const float *dout, const float *a, const float *b,
                       int64_t n) {
    if (da)
        for (int64_t i = 0; i < n; i++) da[i] += dout[i] * b[i];
    if (db)
        for (int64_t i = 0; i < n; i++) db[i] += dout[i] * a[i];
}

void ms_k_scale_forward(float *out, const float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = s * x[i];
}

void ms_k_scale_backward(float *dx, const float *dout, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) dx[i] += s * dout[i];
}

static void bias_fwd_range(void *arg, int64_t lo, int64_t hi) {
    const elt_job *j = arg;
    const int64_t c = j->cols;
    const float *restrict b = j->b;
    for (int64_t r = lo; r < hi; r++) {
        float *restrict o = j->out + r * c;
        const float *restrict x = j->a + r * c;
        for (int64_t k = 0; k < c; k++) o[k] = x[k] + b[k];
    }
}

void ms_k_bias_add_forward(float *out, const float *inp, const float *bias, int64_t n, int64_t c) {
    elt_job j = {.out = out, .a = inp, .b = bias, .cols = c};
    ms_parallel_for(n, c > 0 ? GRAIN / c + 1 : n, bias_fwd_range, &j);
}

void ms_k_bias_add_backward(float *dinp, float *dbias, const float *dout, int64_t n, int64_t c) {
    /* Row by row so both the read of dout and the update of dbias stay contiguous. */
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c;
        if (dinp) {
            float *d = dinp + r * c;
            for (int64_t j = 0; j < c; j++) d[j] += g[j];
        }
        if (dbias)
            for (int64_t j = 0; j < c; j++) dbias[j] += g[j];
    }
}

static void gelu_fwd_range(void *arg, int64_t lo, int64_t hi) {
    const elt_job *j = arg;
    float *restrict out = j->out;
    const float *restrict inp = j->a;
    for (int64_t i = lo; i < hi; i++) out[i] = ms_gelu(inp[i]);
}

void ms_k_gelu_forward(float *out, const float *inp, int64_t n) {
    elt_job j = {.out = out, .a = inp};
    ms_parallel_for(n, GRAIN, gelu_fwd_range, &j);
}

static void gelu_bwd_range(void *arg, int64_t lo, int64_t hi) {
    const elt_job *j = arg;
    float *restrict dinp = j->out;
    const float *restrict inp = j->a, *restrict dout = j->b;
    for (int64_t i = lo; i < hi; i++) dinp[i] += ms_gelu_grad(inp[i]) * dout[i];
}

void ms_k_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
    elt_job j = {.out = dinp, .a = inp, .b = dout};
    ms_parallel_for(n, GRAIN, gelu_bwd_range, &j);
}

ms_k_cost ms_k_elementwise_cost(ms_k_elt op, int64_t n, int64_t c, bool backward) {
    const double e = (double)n;
    ms_k_cost k = {0, 0};
    switch (op) {
        case MS_K_ADD: /* fwd: read a, b, write out; bwd: da += dout, db += dout */
            k.flops = backward ? 2 * e : e;
            k.bytes = backward ? 4.0 * (e + 4 * e) : 4.0 * 3 * e;
            break;
        case MS_K_MUL: /* bwd: reads dout, a, b, accumulates da, db */
            k.flops = backward ? 4 * e : e;
            k.bytes = backward ? 4.0 * (3 * e + 4 * e) : 4.0 * 3 * e;
            break;
        case MS_K_SCALE:
            k.flops = backward ? 2 * e : e;
            k.bytes = backward ? 4.0 * 3 * e : 4.0 * 2 * e;
            break;
        case MS_K_BIAS_ADD: /* bwd: dinp += dout and dbias += column sums */
            k.flops = backward ? 2 * e : e;
            k.bytes = backward ? 4.0 * (e + 2 * e + 2.0 * (double)c) : 4.0 * (2 * e + (double)c);
            break;
        case MS_K_GELU: /* fwd: 3 mul + add + mul + tanh + add + 2 mul; bwd adds ~10 more */
            k.flops = backward ? 20 * e : 9 * e;
            k.bytes = backward ? 4.0 * 4 * e : 4.0 * 2 * e;
            break;
        case MS_K_ELT_COUNT:
            break;
    }
    return k;
}

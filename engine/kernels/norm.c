/* norm.c - LayerNorm and softmax over the last dim, forward and backward.
 *
 * Both work one row at a time so a row stays in cache between its passes. LayerNorm uses two
 * passes (mean, then centred variance) rather than E[x^2] - E[x]^2, which cancels badly when
 * |mean| >> std.
 */
#include "engine/kernels/kernels.h"
#include "engine/kernels/fastmath.h"
#include "engine/core/parallel.h"

#include <math.h>

typedef struct ln_job {
    float *out, *mean, *rstd;
    const float *inp, *weight, *bias;
    int64_t c;
    float eps;
} ln_job;

static void layernorm_fwd_range(void *arg, int64_t lo, int64_t hi) {
    const ln_job *jb = arg;
    float *out = jb->out, *mean = jb->mean, *rstd = jb->rstd;
    const float *inp = jb->inp, *weight = jb->weight, *bias = jb->bias;
    const int64_t c = jb->c;
    const float eps = jb->eps;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = inp + r * c;
        float *o = out + r * c;
        float m = 0.0f;
        for (int64_t j = 0; j < c; j++) m += x[j];
        m /= (float)c;
        float v = 0.0f;
        for (int64_t j = 0; j < c; j++) {
            const float d = x[j] - m;
            v += d * d;
        }
        v /= (float)c;
        const float s = 1.0f / sqrtf(v + eps);
        for (int64_t j = 0; j < c; j++) o[j] = (x[j] - m) * s * weight[j] + bias[j];
        mean[r] = m;
        rstd[r] = s;
    }
}

void ms_k_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int64_t n, int64_t c,
                            float eps) {
    ln_job j = {out, mean, rstd, inp, weight, bias, c, eps};
    ms_parallel_for(n, c > 0 ? (1 << 14) / c + 1 : n, layernorm_fwd_range, &j);
}

typedef struct ln_bwd_job {
    float *dinp, *dweight, *dbias;
    const float *dout, *inp, *weight, *mean, *rstd;
    int64_t n, c;
} ln_bwd_job;

/* dinp, row by row. */
static void layernorm_bwd_rows(void *arg, int64_t lo, int64_t hi) {
    const ln_bwd_job *jb = arg;
    const int64_t c = jb->c;
    const float *weight = jb->weight;
    for (int64_t r = lo; r < hi; r++) {
        const float *g = jb->dout + r * c, *x = jb->inp + r * c;
        const float m = jb->mean[r], s = jb->rstd[r];
        /* With xhat = (x - m) s and dxhat = w * dout:
         * dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)). */
        float dmean = 0.0f, dnorm_mean = 0.0f;
        for (int64_t j = 0; j < c; j++) {
            const float xhat = (x[j] - m) * s;
            const float dxhat = weight[j] * g[j];
            dmean += dxhat;
            dnorm_mean += dxhat * xhat;
        }
        dmean /= (float)c;
        dnorm_mean /= (float)c;
        float *d = jb->dinp + r * c;
        for (int64_t j = 0; j < c; j++) {
            const float xhat = (x[j] - m) * s;
            d[j] += s * (weight[j] * g[j] - dmean - xhat * dnorm_mean);
        }
    }
}

/* dweight and dbias: column sums over all rows, a range of columns per thread, rows in
 * order (the same additions in the same order as one thread would do). */
static void layernorm_bwd_cols(void *arg, int64_t lo, int64_t hi) {
    const ln_bwd_job *jb = arg;
    const int64_t c = jb->c;
    for (int64_t r = 0; r < jb->n; r++) {
        const float *g = jb->dout + r * c, *x = jb->inp + r * c;
        const float m = jb->mean[r], s = jb->rstd[r];
        if (jb->dbias)
            for (int64_t j = lo; j < hi; j++) jb->dbias[j] += g[j];
        if (jb->dweight)
            for (int64_t j = lo; j < hi; j++) jb->dweight[j] += (x[j] - m) * s * g[j];
    }
}

void ms_k_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int64_t n, int64_t c) {
    ln_bwd_job j = {dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c};
    if (dinp) ms_parallel_for(n, c > 0 ? (1 << 14) / c + 1 : n, layernorm_bwd_rows, &j);
    if (dweight || dbias) ms_parallel_for(c, 64, layernorm_bwd_cols, &j);
}

ms_k_cost ms_k_layernorm_cost(int64_t n, int64_t c, bool backward) {
    const double e = (double)n * (double)c, rows = (double)n, ch = (double)c;
    ms_k_cost k;
    if (!backward) {
        /* mean 1, centred square 3, normalise-scale-shift 4 per element; rsqrt etc. per row */
        k.flops = 8 * e + 4 * rows;
        k.bytes = 4.0 * (2 * e + 2 * ch + 2 * rows);
    } else {
        /* two reductions (5) and the update of dinp, dweight, dbias (9) per element */
        k.flops = 14 * e + 2 * rows;
        k.bytes = 4.0 * (2 * e + 2 * e + ch + 4 * ch + 2 * rows);
    }
    return k;
}

void ms_k_softmax_forward(float *out, const float *inp, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) ms_softmax_row(out + r * c, inp + r * c, c);
}

void ms_k_softmax_backward(float *dinp, const float *dout, const float *out, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *y = out + r * c;
        float *d = dinp + r * c;
        float dot = 0.0f;
        for (int64_t j = 0; j < c; j++) dot += g[j] * y[j];
        for (int64_t j = 0; j < c; j++) d[j] += y[j] * (g[j] - dot);
    }
}

ms_k_cost ms_k_softmax_cost(int64_t n, int64_t c, bool backward) {
    const double e = (double)n * (double)c;
    ms_k_cost k;
    if (!backward) {
        k.flops = 4 * e; /* subtract, exp, add, scale */
        k.bytes = 4.0 * 2 * e;
    } else {
        k.flops = 5 * e; /* dot (2), subtract, multiply, add */
        k.bytes = 4.0 * (2 * e + 2 * e);
    }
    return k;
}

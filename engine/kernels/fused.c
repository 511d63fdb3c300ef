/* fused.c - bias + GELU and bias + dropout + residual add, one pass each (fused.h). */
#include "engine/kernels/fused.h"

#include <string.h>

#include "engine/kernels/fastmath.h"
#include "engine/core/parallel.h"

/* Rows per thread chunk: at least this many elements, as the streaming kernels split. */
#define GRAIN (1 << 14)

/* Backward kernels that sum a bias gradient over rows split the columns instead: each thread
 * owns its columns of dinp and dbias, and every column sums its rows in order (as one thread
 * would). At least 16 columns per chunk, and about GRAIN elements. */
static int64_t column_grain(int64_t rows) {
    int64_t g = GRAIN / (rows > 0 ? rows : 1);
    return g > 16 ? g : 16;
}

/* --- bias + GELU ---------------------------------------------------------------------------- */

typedef struct bias_gelu_job {
    float *out, *dinp, *dbias;
    const float *inp, *bias, *dout;
    int64_t n, c;
} bias_gelu_job;

static void bias_gelu_rows(void *arg, int64_t lo, int64_t hi) {
    const bias_gelu_job *j = arg;
    const int64_t c = j->c;
    for (int64_t r = lo; r < hi; r++) {
        float *restrict o = j->out + r * c;
        const float *restrict x = j->inp + r * c, *restrict b = j->bias;
        for (int64_t k = 0; k < c; k++) o[k] = ms_gelu(x[k] + b[k]);
    }
}

void ms_k_bias_gelu_forward(float *out, const float *inp, const float *bias, int64_t n, int64_t c) {
    bias_gelu_job j = {.out = out, .inp = inp, .bias = bias, .c = c};
    ms_parallel_for(n, c > 0 ? GRAIN / c + 1 : n, bias_gelu_rows, &j);
}

static void bias_gelu_bwd_cols(void *arg, int64_t lo, int64_t hi) {
    const bias_gelu_job *j = arg;
    const int64_t c = j->c;
    const float *restrict b = j->bias;
    float *restrict db = j->dbias;
    for (int64_t r = 0; r < j->n; r++) {
        const float *restrict x = j->inp + r * c, *restrict dy = j->dout + r * c;
        float *restrict dx = j->dinp ? j->dinp + r * c : NULL;
        if (dx && db) { /* the usual case, branch-free so that it vectorises */
            for (int64_t k = lo; k < hi; k++) {
                const float g = ms_gelu_grad(x[k] + b[k]) * dy[k];
                dx[k] += g;
                db[k] += g;
            }
            continue;
        }
        for (int64_t k = lo; k < hi; k++) {
            const float g = ms_gelu_grad(x[k] + b[k]) * dy[k];
            if (dx) dx[k] += g;
            if (db) db[k] += g;
        }
    }
}

void ms_k_bias_gelu_backward(float *dinp, float *dbias, const float *dout, const float *inp,
                             const float *bias, int64_t n, int64_t c) {
    bias_gelu_job j = {
        .dinp = dinp, .dbias = dbias, .inp = inp, .bias = bias, .dout = dout, .n = n, .c = c};
    ms_parallel_for(c, column_grain(n), bias_gelu_bwd_cols, &j);
}

ms_k_cost ms_k_bias_gelu_cost(int64_t n, int64_t c, bool backward) {
    const double e = (double)n * (double)c, ch = (double)c;
    ms_k_cost k;
    if (!backward) { /* the add, then GELU's 9 */
        k.flops = 10 * e;
        k.bytes = 4.0 * (2 * e + ch);
    } else { /* the add again, GELU's backward (20), the bias gradient's add */
        k.flops = 22 * e;
        k.bytes = 4.0 * (2 * e + 2 * e + ch + 2 * ch);
    }
    return k;
}

/* --- bias + dropout + residual add ------------------------------------------------------- */

typedef struct bda_job {
    float *out, *dinp, *dbias, *dres;
    const float *inp, *bias, *res, *dout;
    int64_t nb;
    const ms_k_fused_dropout *d;
} bda_job;

static int64_t box_numel(const ms_k_dropout_box *b) {
    int64_t n = 1;
    for (int k = 0; k < b->ndim; k++) n *= b->lshape[k];
    return n;
}

/* Columns [lo, hi) of the [N / nb, nb] view without dropout: the gradients pass through. */
static void bda_plain_bwd_cols(void *arg, int64_t lo, int64_t hi) {
    const bda_job *j = arg;
    const int64_t nb = j->nb, rows = box_numel(&j->d->box) / nb;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = lo; k < hi; k++) {
            const float dy = j->dout[r * nb + k];
            if (j->dres) j->dres[r * nb + k] += dy;
            if (j->dinp) j->dinp[r * nb + k] += dy;
            if (j->dbias) j->dbias[k] += dy;
        }
}

/* Elements [lo, hi) without dropout: the add chain alone, one bias period at a time (a
 * modulo per element cost more than the memory traffic: 4 GB/s against 25). */
static void bda_plain(void *arg, int64_t lo, int64_t hi) {
    const bda_job *j = arg;
    const int64_t nb = j->nb;
    float *restrict out = j->out;
    const float *restrict res = j->res, *restrict inp = j->inp, *restrict bias = j->bias;
    for (int64_t i = lo; i < hi;) {
        const int64_t b0 = i % nb, len = nb - b0 < hi - i ? nb - b0 : hi - i;
        for (int64_t k = 0; k < len; k++) out[i + k] = res[i + k] + (inp[i + k] + bias[b0 + k]);
        i += len;
    }
}

/* One row of the box: element i = row * len + k, its global index g + k. */
static void bda_row_forward(void *arg, int64_t row, uint64_t g, int64_t len) {
    const bda_job *j = arg;
    const float scale = ms_k_dropout_scale(j->d->p);
    int64_t b = row * len % j->nb; /* the bias index, advanced without a modulo per element */
    for (int64_t k = 0; k < len; k++, b = b + 1 == j->nb ? 0 : b + 1) {
        const int64_t i = row * len + k;
        const float v = j->inp[i] + j->bias[b];
        const bool keep = ms_k_dropout_keep(j->d->p, j->d->seed, j->d->stream, g + (uint64_t)k);
        j->out[i] = j->res[i] + (keep ? v * scale : 0.0f);
    }
}

static void bda_row_backward(void *arg, int64_t row, uint64_t g, int64_t len) {
    const bda_job *j = arg;
    const ms_k_fused_dropout *d = j->d;
    const float scale = d->p > 0 ? ms_k_dropout_scale(d->p) : 1.0f;
    int64_t b = row * len % j->nb;
    for (int64_t k = 0; k < len; k++, b = b + 1 == j->nb ? 0 : b + 1) {
        const int64_t i = row * len + k;
        const bool keep = d->p <= 0 || ms_k_dropout_keep(d->p, d->seed, d->stream, g + (uint64_t)k);
        const float dy = j->dout[i], gx = keep ? dy * scale : 0.0f;
        if (j->dres) j->dres[i] += dy;
        if (j->dinp) j->dinp[i] += gx;
        if (j->dbias) j->dbias[b] += gx;
    }
}

void ms_k_bias_dropout_add_forward(float *out, const float *inp, const float *bias,
                                   const float *res, int64_t nb, const ms_k_fused_dropout *d) {
    bda_job j = {.out = out, .inp = inp, .bias = bias, .res = res, .nb = nb > 0 ? nb : 1, .d = d};
    if (d->p > 0)
        ms_k_dropout_rows(&d->box, bda_row_forward, &j);
    else
        ms_parallel_for(box_numel(&d->box), GRAIN, bda_plain, &j);
}

void ms_k_bias_dropout_add_backward(float *dinp, float *dbias, float *dres, const float *dout,
                                    int64_t nb, const ms_k_fused_dropout *d) {
    bda_job j = {
        .dinp = dinp, .dbias = dbias, .dres = dres, .dout = dout, .nb = nb > 0 ? nb : 1, .d = d};
    if (d->p > 0)
        ms_k_dropout_rows(&d->box, bda_row_backward, &j);
    else
        ms_parallel_for(j.nb, column_grain(box_numel(&d->box) / j.nb), bda_plain_bwd_cols, &j);
}

ms_k_cost ms_k_bias_dropout_add_cost(int64_t n, int64_t nb, bool drop, bool backward) {
    const double e = (double)n, b = (double)nb;
    /* Philox as ms_k_dropout_cost counts it: 60 per element, the scale 1 */
    const double philox = drop ? 61 * e : 0;
    ms_k_cost k;
    if (!backward) { /* the bias add and the residual add */
        k.flops = 2 * e + philox;
        k.bytes = 4.0 * (3 * e + b);
    } else { /* dres, dinp and dbias accumulated */
        k.flops = 3 * e + philox;
        k.bytes = 4.0 * (e + 2 * e + 2 * e + 2 * b);
    }
    return k;
}

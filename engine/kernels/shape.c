/* shape.c - copies that change layout: transpose of two dims, split and concat along a dim.
 *
 * Each is its own family's backward (transpose again, split <-> concat), so they take an
 * accumulate flag instead of having separate backward kernels.
 */
#include "engine/kernels/kernels.h"

#include <string.h>

void ms_k_dim_split(int ndim, const int64_t *shape, int dim, int64_t *o, int64_t *d, int64_t *i) {
    int64_t a = 1, b = 1;
    for (int k = 0; k < dim; k++) a *= shape[k];
    for (int k = dim + 1; k < ndim; k++) b *= shape[k];
    *o = a;
    *d = shape[dim];
    *i = b;
}

static inline void run(float *dst, const float *src, int64_t n, bool acc) {
    if (acc)
        for (int64_t j = 0; j < n; j++) dst[j] += src[j];
    else
        memcpy(dst, src, (size_t)n * sizeof(float));
}

#define TILE 32

void ms_k_transpose(float *out, const float *inp, int ndim, const int64_t *shape, int a, int b,
                    bool accumulate) {
    if (a == b) {
        int64_t n = 1;
        for (int k = 0; k < ndim; k++) n *= shape[k];
        run(out, inp, n, accumulate);
        return;
    }
    if (a > b) {
        const int tmp = a;
        a = b;
        b = tmp;
    }
    /* View inp as [P, A, M, Bd, I] with A = shape[a], Bd = shape[b]; out is [P, Bd, M, A, I]. */
    int64_t p = 1, m = 1, in = 1;
    for (int k = 0; k < a; k++) p *= shape[k];
    for (int k = a + 1; k < b; k++) m *= shape[k];
    for (int k = b + 1; k < ndim; k++) in *= shape[k];
    const int64_t na = shape[a], nb = shape[b];
    /* Element strides of the four loop indices on each side. */
    const int64_t s_in_a = m * nb * in, s_in_m = nb * in, s_in_b = in;
    const int64_t s_out_b = m * na * in, s_out_m = na * in, s_out_a = in;
    for (int64_t pi = 0; pi < p; pi++) {
        const float *x = inp + pi * na * m * nb * in;
        float *y = out + pi * na * m * nb * in;
        for (int64_t mi = 0; mi < m; mi++) {
            if (in > 1) {
                /* Runs of I contiguous elements: copy them whole. */
                for (int64_t ai = 0; ai < na; ai++)
                    for (int64_t bi = 0; bi < nb; bi++)
                        run(y + bi * s_out_b + mi * s_out_m + ai * s_out_a,
                            x + ai * s_in_a + mi * s_in_m + bi * s_in_b, in, accumulate);
                continue;
            }
            /* A strided 2-D transpose: go in TILE x TILE tiles so that both the reads and the
             * writes of a tile touch few cache lines. */
            for (int64_t a0 = 0; a0 < na; a0 += TILE)
                for (int64_t b0 = 0; b0 < nb; b0 += TILE) {
                    const int64_t a1 = a0 + TILE < na ? a0 + TILE : na;
                    const int64_t b1 = b0 + TILE < nb ? b0 + TILE : nb;
                    for (int64_t bi = b0; bi < b1; bi++) {
                        float *yr = y + bi * s_out_b + mi * s_out_m;
                        const float *xc = x + mi * s_in_m + bi;
                        if (accumulate)
                            for (int64_t ai = a0; ai < a1; ai++) yr[ai] += xc[ai * s_in_a];
                        else
                            for (int64_t ai = a0; ai < a1; ai++) yr[ai] = xc[ai * s_in_a];
                    }
                }
        }
    }
}

void ms_k_concat(float *out, const float *const *parts, const int64_t *sizes, int nparts, int64_t o,
                 int64_t i, bool accumulate) {
    int64_t total = 0;
    for (int k = 0; k < nparts; k++) total += sizes[k];
    for (int64_t a = 0; a < o; a++) {
        float *y = out + a * total * i;
        for (int k = 0; k < nparts; k++) {
            const int64_t n = sizes[k] * i;
            if (n == 0) continue; /* an empty part may have no buffer at all */
            run(y, parts[k] + a * n, n, accumulate);
            y += n;
        }
    }
}

void ms_k_split(float *const *parts, const float *inp, const int64_t *sizes, int nparts, int64_t o,
                int64_t i, bool accumulate) {
    int64_t total = 0;
    for (int k = 0; k < nparts; k++) total += sizes[k];
    for (int64_t a = 0; a < o; a++) {
        const float *x = inp + a * total * i;
        for (int k = 0; k < nparts; k++) {
            const int64_t n = sizes[k] * i;
            if (n == 0) continue;
            run(parts[k] + a * n, x, n, accumulate);
            x += n;
        }
    }
}

ms_k_cost ms_k_copy_cost(int64_t n, bool accumulate) {
    ms_k_cost k;
    k.flops = accumulate ? (double)n : 0.0;
    k.bytes = 4.0 * (double)n * (accumulate ? 3 : 2);
    return k;
}

/* reduce.c - sum and mean over one dim of a contiguous tensor, and their broadcasts back.
 *
 * The tensor is viewed as [O, D, I]; loops run o, d, i so both the input and the [O, I] output
 * are walked contiguously whatever dim is reduced.
 */
#include "engine/kernels/kernels.h"

#include <math.h>
#include <string.h>

static void reduce(float *out, const float *inp, int64_t o, int64_t d, int64_t i, float scale) {
    for (int64_t a = 0; a < o; a++) {
        float *y = out + a * i;
        memset(y, 0, (size_t)i * sizeof(float));
        const float *x = inp + a * d * i;
        for (int64_t r = 0; r < d; r++)
            for (int64_t j = 0; j < i; j++) y[j] += x[r * i + j];
        if (scale != 1.0f)
            for (int64_t j = 0; j < i; j++) y[j] *= scale;
    }
}

static void broadcast(float *dinp, const float *dout, int64_t o, int64_t d, int64_t i,
                      float scale) {
    for (int64_t a = 0; a < o; a++) {
        const float *g = dout + a * i;
        float *dx = dinp + a * d * i;
        for (int64_t r = 0; r < d; r++)
            for (int64_t j = 0; j < i; j++) dx[r * i + j] += scale * g[j];
    }
}

void ms_k_sum_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i) {
    reduce(out, inp, o, d, i, 1.0f);
}

void ms_k_sum_backward(float *dinp, const float *dout, int64_t o, int64_t d, int64_t i) {
    broadcast(dinp, dout, o, d, i, 1.0f);
}

/* The mean of an empty dim is NaN (0/0), as in PyTorch. */
void ms_k_mean_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i) {
    reduce(out, inp, o, d, i, d > 0 ? 1.0f / (float)d : NAN);
}

void ms_k_mean_backward(float *dinp, const float *dout, int64_t o, int64_t d, int64_t i) {
    if (d > 0) broadcast(dinp, dout, o, d, i, 1.0f / (float)d);
}

ms_k_cost ms_k_reduce_cost(int64_t o, int64_t d, int64_t i, bool mean, bool backward) {
    const double e = (double)o * (double)d * (double)i, r = (double)o * (double)i;
    ms_k_cost k;
    if (!backward) {
        k.flops = e + (mean ? r : 0);
        k.bytes = 4.0 * (e + r);
    } else {
        k.flops = e * (mean ? 2 : 1);
        k.bytes = 4.0 * (r + 2 * e);
    }
    return k;
}

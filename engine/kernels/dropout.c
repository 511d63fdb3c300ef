/* dropout.c - inverted dropout whose mask is a pure function of the global element index.
 *
 * Keying Philox by (seed, stream, global linear index) makes the mask independent of how the
 * tensor is sharded, so a distributed run drops exactly the elements a one-rank run drops, and
 * backward can recompute the mask instead of storing one byte (or float) per element.
 */
#include "engine/kernels/kernels.h"

#include "engine/core/philox.h"
#include "engine/core/tensor.h" /* MS_MAX_DIMS */

/* Walks the local box row by row (a row = the innermost dim, contiguous both locally and in
 * the global index space) and applies y = keep ? x * scale : 0, accumulating into y if acc. */
int64_t ms_k_batch_row(const ms_k_batch_window *w, int64_t r) {
    if (!w || w->rows <= 0) return r;
    return (r / w->rows) * w->stride + w->offset + r % w->rows;
}

static void apply(float *y, const float *x, bool acc, float p, uint64_t seed, uint64_t stream,
                  int ndim, const int64_t *lshape, const int64_t *gstart, const int64_t *gshape,
                  const ms_k_batch_window *w) {
    const bool none = p >= 1.0f;
    const float scale = none ? 0.0f : 1.0f / (1.0f - p);
    if (ndim == 0) {
        const float v = (!none && ms_philox_uniform(seed, stream, 0) >= p) ? x[0] * scale : 0.0f;
        y[0] = acc ? y[0] + v : v;
        return;
    }
    int64_t gstride[MS_MAX_DIMS];
    int64_t rows = 1;
    gstride[ndim - 1] = 1;
    for (int d = ndim - 2; d >= 0; d--)
        gstride[d] = gstride[d + 1] * (gshape ? gshape[d + 1] : lshape[d + 1]);
    for (int d = 0; d < ndim - 1; d++) rows *= lshape[d];
    const int64_t len = lshape[ndim - 1];
    if (len == 0) return;
    int64_t idx[MS_MAX_DIMS] = {0}; /* local index of the current row, dims [0, ndim-1) */
    for (int64_t r = 0; r < rows; r++) {
        uint64_t g = (uint64_t)(gstart ? gstart[ndim - 1] : 0);
        for (int d = 0; d < ndim - 1; d++) {
            int64_t at = idx[d] + (gstart ? gstart[d] : 0);
            g += (uint64_t)((d == 0 ? ms_k_batch_row(w, at) : at) * gstride[d]);
        }
        float *yr = y + r * len;
        const float *xr = x + r * len;
        for (int64_t j = 0; j < len; j++) {
            const bool keep = !none && ms_philox_uniform(seed, stream, g + (uint64_t)j) >= p;
            const float v = keep ? xr[j] * scale : 0.0f;
            yr[j] = acc ? yr[j] + v : v;
        }
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < lshape[d]) break;
            idx[d] = 0;
        }
    }
}

void ms_k_dropout_forward(float *out, const float *inp, float p, uint64_t seed, uint64_t stream,
                          int ndim, const int64_t *lshape, const int64_t *gstart,
                          const int64_t *gshape, const ms_k_batch_window *w) {
    apply(out, inp, false, p, seed, stream, ndim, lshape, gstart, gshape, w);
}

void ms_k_dropout_backward(float *dinp, const float *dout, float p, uint64_t seed, uint64_t stream,
                           int ndim, const int64_t *lshape, const int64_t *gstart,
                           const int64_t *gshape, const ms_k_batch_window *w) {
    apply(dinp, dout, true, p, seed, stream, ndim, lshape, gstart, gshape, w);
}

ms_k_cost ms_k_dropout_cost(int64_t n, bool backward) {
    /* The Philox block (10 rounds of 2 multiplies and a few xors/adds) is integer work; it is
     * counted as flops because it occupies the same units: ~60 per element, plus the scale. */
    const double e = (double)n;
    ms_k_cost k;
    k.flops = 61 * e;
    k.bytes = backward ? 4.0 * 3 * e : 4.0 * 2 * e;
    return k;
}

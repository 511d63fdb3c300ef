/* dropout.c - inverted dropout whose mask is a pure function of the global element index.
 *
 * Keying Philox by (seed, stream, global linear index) makes the mask independent of how the
 * tensor is sharded, so a distributed run drops exactly the elements a one-rank run drops, and
 * backward can recompute the mask instead of storing one byte (or float) per element.
 */
#include "engine/kernels/kernels.h"

#include "engine/core/philox.h"
#include "engine/core/tensor.h" /* MS_MAX_DIMS */

int64_t ms_k_batch_row(const ms_k_batch_window *w, int64_t r) {
    if (!w || w->rows <= 0) return r;
    return (r / w->rows) * w->stride + w->offset + r % w->rows;
}

void ms_k_dropout_rows(const ms_k_dropout_box *box, ms_k_dropout_row_fn fn, void *arg) {
    const int ndim = box->ndim;
    const int64_t *lshape = box->lshape, *gstart = box->gstart, *gshape = box->gshape;
    if (ndim == 0) {
        fn(arg, 0, 0, 1);
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
            g += (uint64_t)((d == 0 ? ms_k_batch_row(box->w, at) : at) * gstride[d]);
        }
        fn(arg, r, g, len);
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < lshape[d]) break;
            idx[d] = 0;
        }
    }
}

bool ms_k_dropout_keep(float p, uint64_t seed, uint64_t stream, uint64_t g) {
    return p < 1.0f && ms_philox_uniform(seed, stream, g) >= p;
}

/* y = keep ? x * scale : 0 over one row, accumulating into y if acc. */
typedef struct apply_job {
    float *y;
    const float *x;
    bool acc;
    float p;
    uint64_t seed, stream;
} apply_job;

static void apply_row(void *arg, int64_t r, uint64_t g, int64_t len) {
    const apply_job *a = arg;
    const float scale = ms_k_dropout_scale(a->p);
    float *yr = a->y + r * len;
    const float *xr = a->x + r * len;
    for (int64_t j = 0; j < len; j++) {
        const float v =
            ms_k_dropout_keep(a->p, a->seed, a->stream, g + (uint64_t)j) ? xr[j] * scale : 0.0f;
        yr[j] = a->acc ? yr[j] + v : v;
    }
}

static void apply(float *y, const float *x, bool acc, float p, uint64_t seed, uint64_t stream,
                  int ndim, const int64_t *lshape, const int64_t *gstart, const int64_t *gshape,
                  const ms_k_batch_window *w) {
    apply_job a = {.y = y, .x = x, .acc = acc, .p = p, .seed = seed, .stream = stream};
    ms_k_dropout_box box = {ndim, lshape, gstart, gshape, w};
    ms_k_dropout_rows(&box, apply_row, &a);
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

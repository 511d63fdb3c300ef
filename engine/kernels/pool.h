/* pool.h - local kernels of the vision and speech operators (engine/ops/ops_pool.c) on
 * channels-first tensors (NCHW, NCL as PyTorch and ONNX lay them out): max and average pooling,
 * group normalisation, and nearest and linear resizing.
 *
 * The conventions of kernels.h hold: contiguous row-major float32 buffers, no allocation,
 * forward kernels overwrite their outputs, backward kernels ACCUMULATE (+=) into every input
 * gradient and skip a NULL one. Pooling and resizing see a tensor as `planes` independent
 * [H, W] planes (N * C of them); a 1-D tensor [N, C, L] is the plane [1, L], with a window,
 * stride and scale of 1 and no padding along H.
 */
#ifndef MS_KERNELS_POOL_H
#define MS_KERNELS_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/kernels.h"

/* The windows, the resize sources and each forward output below are shared by these CPU
 * kernels and the CUDA kernels' arithmetic (cuda/pool_math.cuh): written once, in C that nvcc
 * also compiles for the device, so the two cannot pick different windows or sources. */
#ifdef __CUDACC__
#define MS_K_POOL_INLINE __host__ __device__ static inline
#else
#define MS_K_POOL_INLINE static inline
#endif

/* ---- pooling ------------------------------------------------------------------------------ */

typedef enum ms_k_pool_op { MS_K_POOL_MAX, MS_K_POOL_AVG } ms_k_pool_op;

typedef struct ms_k_pool {
    ms_k_pool_op op;
    int64_t planes;                 /* N * C */
    int64_t h, w, oh, ow;           /* input and output plane extents */
    int64_t kh, kw, sh, sw, ph, pw; /* window, stride, padding on both sides */
    bool exclude_pad;               /* average: divide by the window's in-plane count */
} ms_k_pool;

/* The window of output (y, x) clipped to the plane: rows [r0, r1), columns [c0, c1). */
MS_K_POOL_INLINE void ms_k_pool_window(const ms_k_pool *g, int64_t y, int64_t x, int64_t *r0,
                                       int64_t *r1, int64_t *c0, int64_t *c1) {
    const int64_t ys = y * g->sh - g->ph, xs = x * g->sw - g->pw;
    *r0 = ys > 0 ? ys : 0, *c0 = xs > 0 ? xs : 0;
    *r1 = ys + g->kh < g->h ? ys + g->kh : g->h;
    *c1 = xs + g->kw < g->w ? xs + g->kw : g->w;
}

/* The average's divisor of a window clipped to [r0, r1) x [c0, c1). */
MS_K_POOL_INLINE float ms_k_pool_divisor(const ms_k_pool *g, int64_t r0, int64_t r1, int64_t c0,
                                         int64_t c1) {
    return g->exclude_pad ? (float)((r1 - r0) * (c1 - c0)) : (float)(g->kh * g->kw);
}

/* Output (y, x) of the plane x0 as the forward below defines it; *at the max's winner. */
MS_K_POOL_INLINE float ms_k_pool_point(const ms_k_pool *g, const float *x0, int64_t y, int64_t x,
                                       int32_t *at) {
    int64_t r0, r1, c0, c1, win = -1;
    ms_k_pool_window(g, y, x, &r0, &r1, &c0, &c1);
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            const float v = x0[r * g->w + c];
            if (g->op == MS_K_POOL_AVG)
                acc += v;
            else if (win < 0 || v > acc || (v != v && acc == acc)) /* the first NaN wins */
                acc = v, win = r * g->w + c;
        }
    *at = (int32_t)win;
    return g->op == MS_K_POOL_AVG ? acc / ms_k_pool_divisor(g, r0, r1, c0, c1) : acc;
}

/* Output (y, x) pools the window rows y sh - ph + [0, kh), columns x sw - pw + [0, kw), the
 * part of it inside the plane (padding is never a candidate and adds nothing).
 *   max: the largest element; idx its position r * w + c in its plane, the first in row-major
 *        window order among equals; a NaN wins over every number (the first NaN).
 *   avg: the sum of the window's elements divided by kh kw (PyTorch's count_include_pad=True,
 *        its default), or with exclude_pad by their count (count_include_pad=False, ONNX's
 *        default).
 * out, idx: [planes, oh, ow] (idx: max only, else NULL)   inp: [planes, h, w] */
void ms_k_pool_forward(const ms_k_pool *g, float *out, int32_t *idx, const float *inp);
/* dinp += the gradient: max sends dout to idx's element, avg dout / divisor to every element
 * of the window; an input element takes its contributions in ascending output order.
 * dinp: [planes, h, w]   dout, idx: [planes, oh, ow] */
void ms_k_pool_backward(const ms_k_pool *g, float *dinp, const float *dout, const int32_t *idx);
/* Max compares (0 flops) and reads its winners' indices back; avg adds kh kw and divides. */
ms_k_cost ms_k_pool_cost(const ms_k_pool *g, bool backward);

/* ---- group normalisation ------------------------------------------------------------------ */

/* x [N, C, S] (S the product of the spatial dims) in `groups` groups of C / groups channels. */
typedef struct ms_k_gnorm {
    int64_t n, c, s, groups;
    float eps;
} ms_k_gnorm;

/* Per sample and group, over its C / groups * S elements: mean and rstd = 1 / sqrt(biased
 * variance + eps) (two passes, as LayerNorm, summed in double); out = (x - mean) rstd
 * weight[c] + bias[c].
 * out, inp: [N, C, S]   mean, rstd: [N, groups] (saved for backward)   weight, bias: [C] */
void ms_k_group_norm_forward(const ms_k_gnorm *g, float *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias);
/* Floats of the backward's scratch: the sums of dout and dout * xhat per sample and channel. */
int64_t ms_k_group_norm_scratch_floats(const ms_k_gnorm *g);
/* dinp, dweight, dbias += their gradients (any may be NULL), with xhat = (x - mean) rstd:
 *   dx = rstd (w dout - mean(w dout) - xhat mean(w dout xhat)) over the group,
 *   dweight[c] = sum over N, S of dout xhat, dbias[c] = sum of dout.
 * scratch: ms_k_group_norm_scratch_floats floats, contents ignored. */
void ms_k_group_norm_backward(const ms_k_gnorm *g, float *dinp, float *dweight, float *dbias,
                              float *scratch, const float *dout, const float *inp,
                              const float *weight, const float *mean, const float *rstd);
ms_k_cost ms_k_group_norm_cost(const ms_k_gnorm *g, bool backward);

/* ---- resizing ----------------------------------------------------------------------------- */

/* r: input pixels per output pixel along a dim, as PyTorch computes it in fp32: 1 / scale
 * when a scale factor is given, else in / out. Where out == in a dim is copied whatever r is. */
typedef struct ms_k_resize {
    int64_t planes, h, w, oh, ow;
    float rh, rw;
    bool linear; /* linear (bilinear on a plane), else nearest */
} ms_k_resize;

/* Source of output index o along a dim of `in` -> `out` (PyTorch's upsample kernels), n terms:
 *   out == in: the copy, n = 1, i0 = o, l0 = 1;
 *   nearest (PyTorch's 'nearest'; ONNX's asymmetric coordinates with floor rounding): n = 1,
 *     i0 = min(floor(o r), in - 1) (o / 2 when out == 2 in), l0 = 1;
 *   linear (align_corners=False; ONNX's half_pixel, edges clamped): n = 2,
 *     src = max(r (o + 0.5) - 0.5, 0), i0 = min(floor(src), in - 1),
 *     i1 = i0 + (i0 < in - 1), l1 = min(src - i0, 1), l0 = 1 - l1.
 * The arithmetic is fp32, as PyTorch's. */
typedef struct ms_k_resize_src {
    int n;
    int64_t i[2];
    float l[2];
} ms_k_resize_src;
MS_K_POOL_INLINE ms_k_resize_src ms_k_resize_source(int64_t o, int64_t in, int64_t out, float r,
                                                    bool linear) {
    ms_k_resize_src s = {1, {o, o}, {1.0f, 0.0f}};
    if (out == in) return s;
    if (!linear) { /* o r >= 0: truncation is floor */
        const int64_t i = out == 2 * in ? o >> 1 : (int64_t)((float)o * r);
        s.i[0] = s.i[1] = i < in - 1 ? i : in - 1;
        return s;
    }
    float src = r * ((float)o + 0.5f) - 0.5f;
    src = src < 0.0f ? 0.0f : src;
    const int64_t i0 = (int64_t)src < in - 1 ? (int64_t)src : in - 1;
    const float l1 = src - (float)i0 < 1.0f ? src - (float)i0 : 1.0f;
    s.n = 2;
    s.i[0] = i0, s.i[1] = i0 + (i0 < in - 1);
    s.l[0] = 1.0f - l1, s.l[1] = l1;
    return s;
}

/* lh[0] (lw[0] x[ih[0], iw[0]] + lw[1] x[ih[0], iw[1]]) + lh[1] (...) of the plane x0 of width
 * w, the terms that exist, in that order. */
MS_K_POOL_INLINE float ms_k_resize_point(const float *x0, int64_t w, const ms_k_resize_src *sh,
                                         const ms_k_resize_src *sw) {
    float acc = 0.0f;
    for (int a = 0; a < sh->n; a++) {
        const float *row = x0 + sh->i[a] * w;
        float v = sw->l[0] * row[sw->i[0]];
        if (sw->n > 1) v += sw->l[1] * row[sw->i[1]];
        acc = a ? acc + sh->l[a] * v : sh->l[a] * v;
    }
    return acc;
}

/* out[y, x] = sum over a < n_h of lh[a] (sum over b < n_w of lw[b] x[ih[a], iw[b]]) with the
 * sources of y along H and x along W (nearest: the one element, times 1).
 * out: [planes, oh, ow]   inp: [planes, h, w] */
void ms_k_resize_forward(const ms_k_resize *g, float *out, const float *inp);
/* dinp += the transpose: dinp[ih[a], iw[b]] += (lh[a] lw[b]) dout[y, x]; an input element
 * takes its contributions in ascending output order, and within one output in (a, b) order.
 * dinp: [planes, h, w]   dout: [planes, oh, ow] */
void ms_k_resize_backward(const ms_k_resize *g, float *dinp, const float *dout);
ms_k_cost ms_k_resize_cost(const ms_k_resize *g, bool backward);

#endif

/* conv.h - local kernels of the convolution operators (engine/ops/ops_conv.c): conv1d and
 * conv2d in NCHW as im2col and GEMMs (col2im for the input gradient), image by image.
 *
 * The conventions of kernels.h hold: contiguous row-major float32 buffers, no allocation (the
 * column buffer is the caller's), forward kernels overwrite, backward kernels ACCUMULATE into
 * every gradient and skip a NULL one. A conv1d is the conv2d of height 1 (h = kh = 1, stride,
 * padding and dilation 1, 0, 1 along H).
 *
 * One call runs `groups` groups of cout_g output channels, each reading cin_g input channels.
 * A shard of the operator may hold fewer channels than the global op: whole groups, or part of
 * one group (the op derives the call's geometry from its local box, ops_conv.c). x may then
 * hold more channels (c_x per image) than the call reads: it reads channels
 * c0 + grp * cin_g + ci of each image, so a rank holding every input channel runs the groups
 * of its output shard without a copy.
 *
 * Memory: the CPU kernels take a column buffer of ms_k_conv_scratch_floats floats, the im2col
 * of one group of one image, [cin_g * kh * kw, oh * ow]. A pointwise conv (1 x 1 kernel, stride
 * 1, no padding) reads x in place and does not touch it.
 */
#ifndef MS_KERNELS_CONV_H
#define MS_KERNELS_CONV_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus /* conv_math.cuh includes it, maybe before the headers that wrap it */
extern "C" {
#endif

#include "engine/kernels/kernels.h"

typedef struct ms_k_conv {
    int64_t n;             /* images */
    int64_t c_x;           /* channels of x (and dx) per image */
    int64_t c0;            /* the first of them the call reads */
    int64_t groups;        /* groups of this call */
    int64_t cin_g, cout_g; /* input and output channels per group */
    int64_t h, w;          /* input height and width */
    int64_t kh, kw;        /* kernel height and width */
    int64_t oh, ow;        /* output height and width */
    int64_t sh, sw;        /* stride */
    int64_t ph, pw;        /* padding, the same before and after */
    int64_t dh, dw;        /* dilation */
    bool relu;             /* forward: out = max(out, 0) after the bias (the backward ignores it) */
} ms_k_conv;

/* The output size of one spatial dim: (in + 2 pad - dil (k - 1) - 1) / stride + 1. */
static inline int64_t ms_k_conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad,
                                         int64_t dil) {
    return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* Whether the columns of an image are its channels as they lie (1 x 1, stride 1, no padding). */
static inline bool ms_k_conv_pointwise(const ms_k_conv *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* Where image i's group grp starts in x (its first channel read) and in out, and where group
 * grp starts in the weight, in floats. */
static inline int64_t ms_k_conv_x_at(const ms_k_conv *g, int64_t i, int64_t grp) {
    return (i * g->c_x + g->c0 + grp * g->cin_g) * g->h * g->w;
}
static inline int64_t ms_k_conv_out_at(const ms_k_conv *g, int64_t i, int64_t grp) {
    return (i * g->groups + grp) * g->cout_g * g->oh * g->ow;
}
static inline int64_t ms_k_conv_w_at(const ms_k_conv *g, int64_t grp) {
    return grp * g->cout_g * g->cin_g * g->kh * g->kw;
}

/* Floats of the CPU kernels' column buffer: cin_g * kh * kw * oh * ow (0 when pointwise). */
int64_t ms_k_conv_scratch_floats(const ms_k_conv *g);

/* The columns of `ch` consecutive channels of one image: col[(c * kh + ky) * kw + kx][oy * ow + ox]
 * = x[c][oy * sh - ph + ky * dh][ox * sw - pw + kx * dw], 0 in the padding.
 * col: [ch * kh * kw, oh * ow]   x: [ch, h, w] (one image, from its first channel read) */
void ms_k_im2col(float *col, const float *x, int64_t ch, const ms_k_conv *g);
/* dx += the columns scattered back (each input element gets its kernel taps in ascending
 * (ky, kx) order). dx: [ch, h, w]   col: [ch * kh * kw, oh * ow] */
void ms_k_col2im(float *dx, const float *col, int64_t ch, const ms_k_conv *g);

/* out[i][grp * cout_g + o] = sum over ci, ky, kx of w * x (+ bias), per image and group.
 * out: [n, groups * cout_g, oh, ow]   x: [n, c_x, h, w]   w: [groups * cout_g, cin_g, kh, kw]
 * bias: [groups * cout_g] or NULL   col: ms_k_conv_scratch_floats floats, contents ignored */
void ms_k_conv_forward(const ms_k_conv *g, float *out, float *col, const float *x, const float *w,
                       const float *bias);
/* dx += the input gradient (only the channels the call reads), dw += the weight gradient,
 * dbias += dout summed over images and positions; any of the three may be NULL. dx_fresh: dx
 * holds nothing yet and is written whole (zeros where the call reads no channel).
 * Shapes as the forward's; dout: [n, groups * cout_g, oh, ow]. */
void ms_k_conv_backward(const ms_k_conv *g, float *dx, float *dw, float *dbias, float *col,
                        const float *dout, const float *x, const float *w, bool dx_fresh);
/* out[i][c][..] = bias[c] (NULL: 0) for every image, on the rank's threads. */
void ms_k_conv_fill(const ms_k_conv *g, float *out, const float *bias);
/* x[0, n) = 0 on the rank's threads. */
void ms_k_conv_zero(float *x, int64_t n);
/* out = max(out, 0) over the call's output, on the rank's threads (g->relu's pass where the
 * kernel does not fuse it). */
void ms_k_conv_relu(const ms_k_conv *g, float *out);
/* The GEMMs (2 per multiply-add) plus the bias adds; bytes read and written once each (the
 * column buffer's traffic is the kernel's, not counted). The backward counts dx, dw and, with
 * a bias, dbias. */
ms_k_cost ms_k_conv_cost(const ms_k_conv *g, bool bias, bool backward);

#ifdef __cplusplus
}
#endif

#endif

/* conv_direct.h - direct convolution with AVX-512 for the convs of conv.c, strided ones too:
 * no column buffer.
 *
 * A tile of 8 output channels by 16 or 32 output positions (one or two 16-wide vectors, each
 * within one output row) keeps its sums in registers over every input channel and tap; a tap
 * that falls in the padding is a masked load (zeros), so the input needs no padded copy. The
 * input gradient is the same kernel run on dout with the weight flipped and transposed, the
 * padding kh - 1 - ph. The weight gradient, where the output channels per group are a multiple
 * of 16, puts them in the vector lanes: per chunk of images (about 2048 positions) dout is
 * transposed to [position][channel] and x copied with its padding as zeros into the scratch;
 * a tile of 16 or 32 output channels by up to 9 taps of one input channel keeps its sums in
 * registers, one row of positions at a time, each position one load of dout per vector and
 * one broadcast of x per tap (no horizontal sums); any stride and width, the padded copy read
 * at (oy * sh + ky, ox * sw + kx). Otherwise (stride 1 only) it keeps 8 output channels by
 * up to 3 taps of one kernel row in registers over about 1024 positions and sums the lanes.
 * The forward of a conv the stride-1 kernel does not take, where the output channels per
 * group are a multiple of 32, reads the same padded copy: a tile of 32 output channels by up
 * to 8 positions of one row, per tap two loads of the weight packed [c][tap][channel] and one
 * broadcast of x per position. The input gradient of a conv the stride-1 kernel does not take,
 * where the input channels per group are a multiple of 32, is the same tile with the roles
 * swapped: 32 input channels by up to 8 input positions of one row and one phase of the
 * stride, over every output channel and the taps that reach that phase, broadcasting from a
 * copy of dout with a border of zeros.
 *
 * A strided conv whose output rows are 16 wide (the forward) or whose input rows split into
 * phases 16 wide (the input gradient, input channels of 8 a group) runs by phases instead: a
 * stride-(sh, sw) conv is a sum of stride-1 convs, one per phase (ry, rx) of the stride, each
 * by the taps that reach it, so the stride-1 tile above does the work. The forward reads a
 * copy of x split into its phases and adds every phase into the output; the input gradient
 * writes each phase of dx densely and adds it in (the two phases of a stride of 2 interleaved
 * a row at a time).
 *
 * Deterministic and independent of the thread count: the forward and the input gradient split
 * images (the strided forward: its tiles) over the rank's threads, each output summed in one fixed
 * order; the weight gradient splits its tiles (every dw element is one thread's; the tile shape
 * never changes an element's order of summation) and sums chunks in image order.
 *
 * Built only where the compiler targets AVX-512 F (-march=native on such a CPU, MS_NATIVE);
 * elsewhere the _ok functions say false and conv.c runs its GEMMs.
 */
#ifndef MS_KERNELS_CONV_DIRECT_H
#define MS_KERNELS_CONV_DIRECT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/conv.h"

/* Whether the forward (and the weight gradient) runs direct: stride and dilation 1, output
 * width a multiple of 16, output channels per group a multiple of 8, at most 64 taps. */
bool ms_k_conv_direct_ok(const ms_k_conv *g);
/* Whether the input gradient runs direct: as the forward's, with the input width a multiple
 * of 16, input channels per group a multiple of 8 and padding below the kernel size; or by
 * phases (a stride, dilation 1, input width a multiple of 16 sw, input channels per group a
 * multiple of 8); or any
 * stride and width with the input channels per group a multiple of 32, dilation 1 and more
 * than one tap. */
bool ms_k_conv_direct_dx_ok(const ms_k_conv *g);

/* Whether the forward runs direct: as ms_k_conv_direct_ok, or by phases (a stride, dilation
 * 1, output width a multiple of 16, output channels per group a multiple of 8), or (output
 * channels in the lanes) any stride and width with the output channels per group a multiple of
 * 32, dilation 1 and more than one tap. */
bool ms_k_conv_direct_forward_ok(const ms_k_conv *g);
/* Whether the weight gradient runs direct: as the forward's, or any stride and width with the
 * output channels per group a multiple of 16, dilation 1 and more than one tap (the channels
 * in the lanes). */
bool ms_k_conv_direct_dw_ok(const ms_k_conv *g);

/* Floats of scratch the direct kernels take: the packed weight's (groups * cout_g * cin_g * kh
 * * kw) where the forward runs direct, the weight gradient's one chunk of transposed dout and
 * padded x where it puts the channels in the lanes, the larger; 0 where neither runs. */
int64_t ms_k_conv_direct_scratch_floats(const ms_k_conv *g);

/* out = bias (NULL: zeros) + the convolution of x by w, written whole, then max(out, 0) with
 * g->relu. wk: the scratch. */
void ms_k_conv_direct_forward(const ms_k_conv *g, float *out, float *wk, const float *x,
                              const float *w, const float *bias);
/* dx += the input gradient; fresh: dx = it, whatever dx held. wk: the scratch. */
void ms_k_conv_direct_dx(const ms_k_conv *g, float *dx, float *wk, const float *dout,
                         const float *w, bool fresh);
/* dw += the weight gradient. wk: the scratch. With dbias, it may add the bias's gradient in the
 * same pass over dout (the lanes kernel in slots does): true when it did. */
bool ms_k_conv_direct_dw(const ms_k_conv *g, float *dw, float *wk, const float *dout,
                         const float *x, float *dbias);

#endif

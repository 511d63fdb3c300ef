/* fused.h - the elementwise chains of a transformer layer as one pass over memory each:
 * bias + GELU after the MLP's up projection, and bias + dropout + residual add after each
 * output projection (what BERT's and GPT-2's fast implementations run).
 *
 * Each computes exactly what its unfused chain does (the same float operations in the same
 * order, the same dropout mask: Philox on global indices, as ms_k_dropout_forward), so a model
 * gives the same losses either way. Conventions as kernels.h: contiguous float32, forward
 * overwrites, backward accumulates (+=); a NULL gradient is skipped.
 */
#ifndef MS_KERNELS_FUSED_H
#define MS_KERNELS_FUSED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/kernels.h"

/* out = gelu(inp + bias), bias broadcast over rows.
 * out, inp: [N, C]   bias: [C] */
void ms_k_bias_gelu_forward(float *out, const float *inp, const float *bias, int64_t n, int64_t c);
/* With g = gelu'(inp + bias) * dout: dinp += g, dbias += sum over rows of g. The sum is
 * recomputed, not saved: the op keeps only its input.
 * dinp, dout, inp: [N, C]   dbias, bias: [C] */
void ms_k_bias_gelu_backward(float *dinp, float *dbias, const float *dout, const float *inp,
                             const float *bias, int64_t n, int64_t c);
/* One pass: inp and bias read, out written (backward: dout, inp, bias read, dinp and dbias
 * accumulated). */
ms_k_cost ms_k_bias_gelu_cost(int64_t n, int64_t c, bool backward);

/* The dropout inside bias_dropout_add: probability p (<= 0: none, nothing drawn), the key
 * (seed, stream) and the local box of the tensor in its global one, as ms_k_dropout_forward
 * takes them. */
typedef struct ms_k_fused_dropout {
    float p;
    uint64_t seed, stream;
    ms_k_dropout_box box;
} ms_k_fused_dropout;

/* out = res + dropout(inp + bias). bias holds nb elements, broadcast over the leading dims
 * (nb is a multiple of the innermost extent, its trailing dims).
 * out, inp, res: [N]   bias: [nb] */
void ms_k_bias_dropout_add_forward(float *out, const float *inp, const float *bias,
                                   const float *res, int64_t nb, const ms_k_fused_dropout *d);
/* With g = mask * dout / (1 - p): dinp += g, dbias += its sum over the leading dims,
 * dres += dout. The mask is drawn again, not saved.
 * dinp, dres, dout: [N]   dbias: [nb] */
void ms_k_bias_dropout_add_backward(float *dinp, float *dbias, float *dres, const float *dout,
                                    int64_t nb, const ms_k_fused_dropout *d);
/* n elements; `drop` counts the Philox draws (as ms_k_dropout_cost does). One pass: inp, res
 * and bias read, out written (backward: dout read, dinp, dres and dbias accumulated). */
ms_k_cost ms_k_bias_dropout_add_cost(int64_t n, int64_t nb, bool drop, bool backward);

#endif

/* reduce_ext.h - reductions over any set of dims of a contiguous tensor: sum (scaled),
 * max/min with the position of the winner, product, variance, logsumexp, L2 norm and
 * nonzero count, and their backward passes.
 *
 * A reduction is described by an ms_k_rgeom built from a local shape and a dim mask: the
 * output is the input with the masked dims removed (or kept as 1, the same memory order),
 * and each output element reduces the elements that share its kept indices. Reduced
 * positions are numbered row-major over the reduced dims; "first" below means the lowest
 * such number. Forward kernels overwrite the output; backward kernels accumulate into dinp.
 * Accumulation is in double.
 */
#ifndef MS_KERNELS_REDUCE_EXT_H
#define MS_KERNELS_REDUCE_EXT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/kernels.h"

#define MS_K_RED_MAX_DIMS 8

typedef struct ms_k_rgeom {
    int nk, nr;                         /* kept and reduced dims */
    int64_t kshape[MS_K_RED_MAX_DIMS];  /* kept extents, in order */
    int64_t kstride[MS_K_RED_MAX_DIMS]; /* their input strides */
    int64_t rshape[MS_K_RED_MAX_DIMS];  /* reduced extents, in order */
    int64_t rstride[MS_K_RED_MAX_DIMS]; /* their input strides */
    int64_t n_out, n_red;               /* output elements; reduced elements per output */
    /* When the reduced dims are one run of adjacent dims the input is [bo, n_red, bi] and
     * sum and max walk it in memory order. */
    bool block;
    int64_t bo, bi;
} ms_k_rgeom;

/* Geometry of reducing the dims in mask (bit d = dim d) of a contiguous [shape]. */
void ms_k_rgeom_init(ms_k_rgeom *g, int ndim, const int64_t *shape, uint32_t mask);
/* Input offset of output element o, and of reduced position r relative to it. */
int64_t ms_k_rgeom_base(const ms_k_rgeom *g, int64_t o);
int64_t ms_k_rgeom_roff(const ms_k_rgeom *g, int64_t r);

/* out = scale * sum; its backward dinp += scale * dout. */
void ms_k_rsum_forward(float *out, const float *inp, const ms_k_rgeom *g, float scale);
void ms_k_rsum_backward(float *dinp, const float *dout, const ms_k_rgeom *g, float scale);

/* out = max (sign > 0) or min (sign < 0); pos = the first winner's reduced position as a float
 * (-1 and out = -inf / +inf when nothing is reduced). NaN wins over every number. */
void ms_k_rmax_forward(float *out, float *pos, const float *inp, const ms_k_rgeom *g, int sign);
/* dinp[winner] += dout, for outputs whose pos >= 0. */
void ms_k_rmax_backward(float *dinp, const float *dout, const float *pos, const ms_k_rgeom *g);

/* Product; backward by the product of the other elements (exact with zeros). */
void ms_k_rprod_forward(float *out, const float *inp, const ms_k_rgeom *g);
void ms_k_rprod_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g);

/* Variance with `correction` subtracted from the count (0 population, 1 sample); std = its
 * root (take_root). A count <= correction gives NaN. */
void ms_k_rvar_forward(float *out, const float *inp, const ms_k_rgeom *g, int correction,
                       bool take_root);
void ms_k_rvar_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g,
                        int correction, bool take_root);

/* log(sum(exp(x))), shifted by the max so large inputs do not overflow. */
void ms_k_rlse_forward(float *out, const float *inp, const ms_k_rgeom *g);
void ms_k_rlse_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g);

/* sqrt(sum(x^2)); the gradient at a zero norm is taken as 0. */
void ms_k_rnorm_forward(float *out, const float *inp, const ms_k_rgeom *g);
void ms_k_rnorm_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g);

/* Number of elements != 0. */
void ms_k_rcount_forward(float *out, const float *inp, const ms_k_rgeom *g);

/* The reductions by op code, as the kernel tables run them (kernels/backend.h): SUM is
 * rsum with a scale, MAX and MIN rmax with their sign, VAR and STD rvar, COUNT has no
 * backward. */
typedef enum ms_k_reduce {
    MS_K_RED_SUM,
    MS_K_RED_MAX,
    MS_K_RED_MIN,
    MS_K_RED_PROD,
    MS_K_RED_VAR,
    MS_K_RED_STD,
    MS_K_RED_LSE,
    MS_K_RED_NORM,
    MS_K_RED_COUNT,
} ms_k_reduce;

/* Dispatch by op code. scale multiplies SUM; pos is MAX/MIN's winners (-1: none); correction
 * is VAR/STD's. The backward of COUNT does nothing. */
void ms_k_reduce_forward(ms_k_reduce op, float *out, float *pos, const float *inp,
                         const ms_k_rgeom *g, float scale, int correction);
void ms_k_reduce_backward(ms_k_reduce op, float *dinp, const float *dout, const float *inp,
                          const float *pos, const ms_k_rgeom *g, float scale, int correction);

/* Work of a reduction that touches every input element `passes` times with `flops_per` each. */
ms_k_cost ms_k_rgeom_cost(const ms_k_rgeom *g, double flops_per, int passes, bool backward);

#endif

/* index.h - indexing and layout kernels: views (permute, slice, flip, roll, repeat, expand,
 * pad as one affine-with-wrap map), gather / scatter-add along a dim, cumulative sum and
 * product, triangles, masked fill, one-hot and per-row sorting.
 *
 * Kernels see local buffers; where a result depends on global positions (triangles,
 * one-hot classes, ids into a sharded dim) they take the box start of the local part.
 * Forward kernels overwrite their output; backward kernels accumulate (+=).
 */
#ifndef MS_KERNELS_INDEX_H
#define MS_KERNELS_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/kernels.h"

#define MS_K_VIEW_MAX_DIMS 8

/* Output element at index o (per output dim k) reads the input at sum_k c_k * istride[k],
 * where c = o[k] - lo[k]; if c is outside [0, ext[k]) the element is `fill` (padding);
 * flip: c = ext - 1 - c; mod > 0: c = (c + shift) % mod (roll, repeat); then c += start
 * (slice). istride 0 broadcasts (expand, new dims). */
typedef struct ms_k_view {
    int ndim;
    int64_t oshape[MS_K_VIEW_MAX_DIMS];
    int64_t lo[MS_K_VIEW_MAX_DIMS], ext[MS_K_VIEW_MAX_DIMS];
    int64_t shift[MS_K_VIEW_MAX_DIMS], mod[MS_K_VIEW_MAX_DIMS];
    int64_t start[MS_K_VIEW_MAX_DIMS], istride[MS_K_VIEW_MAX_DIMS];
    bool flip[MS_K_VIEW_MAX_DIMS];
} ms_k_view;

/* The identity view of a contiguous [shape]: every field set so callers change only what
 * their op moves. */
void ms_k_view_identity(ms_k_view *v, int ndim, const int64_t *shape);
void ms_k_view_forward(float *out, const float *inp, const ms_k_view *v, float fill);
/* dinp[source of o] += dout[o] for every o not filled. */
void ms_k_view_backward(float *dinp, const float *dout, const ms_k_view *v);
int64_t ms_k_view_numel(const ms_k_view *v);

/* Along a dim viewed as [O, D, I] (x) and [O, L, I] (ids, out): out[a, l, j] =
 * x[a, ids[a, l, j] - d0, j] when that id falls in the local rows [d0, d0 + D), else 0.
 * ids_per_row: ids is [L] shared by every (a, j) (index_select) instead of [O, L, I];
 * ids_per_outer: ids is [O, L] shared by every j (batch_gather).
 * accumulate adds into out. The same walk scatters: dx[a, id - d0, j] += src[a, l, j]. */
typedef struct ms_k_gather_dims {
    int64_t o, d, l, i, d0;
    bool ids_per_row, ids_per_outer;
} ms_k_gather_dims;
void ms_k_gather(float *out, const float *x, const float *ids, const ms_k_gather_dims *g,
                 bool accumulate);
void ms_k_scatter_add(float *x, const float *src, const float *ids, const ms_k_gather_dims *g);

/* Part p of n stacked [O, I] tensors: dinp[a, j] += dout[a, p, j] (dout is [O, n, I]). */
void ms_k_unstack_add(float *dinp, const float *dout, int64_t o, int n, int p, int64_t i);

/* The scans by op code, as the kernel tables run them. */
typedef enum ms_k_scan { MS_K_SCAN_SUM, MS_K_SCAN_PROD } ms_k_scan;

/* Inclusive cumulative sum / product along the middle dim of [O, D, I], and their backward
 * (cumprod's without division, so zeros are exact). */
void ms_k_cumsum_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i);
void ms_k_cumsum_backward(float *dinp, const float *dout, int64_t o, int64_t d, int64_t i);
void ms_k_cumprod_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i);
void ms_k_cumprod_backward(float *dinp, const float *dout, const float *inp, int64_t o, int64_t d,
                           int64_t i);

/* dst[r * dst_ld + c] = src[r * src_ld + c] (accumulate: +=) for r < rows, c < cols: one
 * part of a concat, split, stack or unstack. */
void ms_k_block_copy(float *dst, const float *src, int64_t rows, int64_t cols, int64_t dst_ld,
                     int64_t src_ld, bool accumulate);

/* Keeps element (r, c) of each [rows, cols] matrix when c - r <= diag (lower) or
 * c - r >= diag (upper), zero elsewhere; r0, c0 are the block's global row and column
 * starts. The backward is the same mask (accumulate = true). */
void ms_k_triangle(float *out, const float *inp, int64_t batch, int64_t rows, int64_t cols,
                   int64_t r0, int64_t c0, int64_t diag, bool upper, bool accumulate);

/* out = mask != 0 ? value : x; backward dinp += mask != 0 ? 0 : dout. */
void ms_k_masked_fill_forward(float *out, const float *x, const float *mask, float value,
                              int64_t n);
void ms_k_masked_fill_backward(float *dinp, const float *dout, const float *mask, int64_t n);

/* out [n, v] = 1 where ids[r] == v0 + column, else 0 (v0: first class of the local block). */
void ms_k_one_hot(float *out, const float *ids, int64_t n, int64_t v, int64_t v0);

/* Sorts each row of [rows, c] by value (descending or ascending), ties by lower index,
 * stable; writes the first k values and their indices (as floats). NaN sorts as largest. */
void ms_k_sort_rows(float *values, float *indices, const float *inp, int64_t rows, int64_t c,
                    int64_t k, bool descending);
/* dinp[r, indices[r, j]] += dout[r, j]. */
void ms_k_sort_rows_backward(float *dinp, const float *dout, const float *indices, int64_t rows,
                             int64_t c, int64_t k);

/* A pass that moves n floats (and reads `extra` more per element: ids, masks). */
ms_k_cost ms_k_index_cost(int64_t n, double extra, bool backward);

#endif

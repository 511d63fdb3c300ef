/* index_math.cuh - per-element arithmetic of the layout and indexing kernels
 * (engine/kernels/index.h): strided views, block copies, cumulative sums and products,
 * triangles, masked fill, one-hot and per-row sorting.
 *
 * Every function handles one output element (views, copies, masks) or one element of a
 * scanned line, computing it the way index.c does: a scan element runs its own prefix (or
 * suffix) in the same order as the CPU's running loop, so the two agree bit for bit; a sort
 * element finds its rank under the CPU's total order (value, NaN largest, then index).
 */
#ifndef MS_CUDA_INDEX_MATH_CUH
#define MS_CUDA_INDEX_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"
#include "engine/kernels/cuda/cuda_kernels.h" /* index.h, with C linkage */

/* The input offset of view output element o, or -1 where it is padding. */
MS_HD int64_t ms_cu_view_source(const ms_k_view *v, int64_t o) {
    int64_t off = 0;
    for (int k = v->ndim - 1; k >= 0; k--) {
        int64_t c = o % v->oshape[k] - v->lo[k];
        o /= v->oshape[k];
        if (c < 0 || c >= v->ext[k]) return -1;
        if (v->flip[k]) c = v->ext[k] - 1 - c;
        if (v->mod[k] > 0) c = (c + v->shift[k]) % v->mod[k];
        off += (c + v->start[k]) * v->istride[k];
    }
    return off;
}

/* Whether no two outputs of the view read the same source element: no dim broadcasts (a
 * stride 0 over more than one index) or wraps around (a roll longer than its period), and the
 * dims' source ranges do not overlap (sorted by stride, each dim's span of source elements
 * fits below the next stride). Then the backward adds each output's gradient to its own
 * source with no other thread touching it: no atomics, and the CPU's result bit for bit. */
MS_HD bool ms_cu_view_injective(const ms_k_view *v) {
    int order[MS_K_VIEW_MAX_DIMS], n = 0;
    for (int k = 0; k < v->ndim; k++) {
        const int64_t used = v->ext[k] < v->oshape[k] ? v->ext[k] : v->oshape[k];
        if (used <= 1) continue; /* one index: no two outputs differ along this dim */
        if (v->istride[k] <= 0 || (v->mod[k] > 0 && used > v->mod[k])) return false;
        int at = n++;
        while (at > 0 && v->istride[order[at - 1]] > v->istride[k]) order[at] = order[at - 1], at--;
        order[at] = k;
    }
    for (int i = 0; i + 1 < n; i++) {
        const int k = order[i];
        const int64_t used = v->ext[k] < v->oshape[k] ? v->ext[k] : v->oshape[k];
        const int64_t coords = v->mod[k] > 0 ? v->mod[k] : used; /* source indices reached */
        if (v->istride[order[i + 1]] < v->istride[k] * (v->start[k] + coords)) return false;
    }
    return true;
}

MS_HD void ms_cu_view_fwd(float *out, const float *inp, const ms_k_view *v, float fill, int64_t o) {
    const int64_t s = ms_cu_view_source(v, o);
    out[o] = s < 0 ? fill : inp[s];
}

/* dst[r * dst_ld + c] (+)= src[r * src_ld + c] for element i = r * cols + c. */
MS_HD void ms_cu_block_copy(float *dst, const float *src, int64_t cols, int64_t dst_ld,
                            int64_t src_ld, bool accumulate, int64_t i) {
    const int64_t r = i / cols, c = i % cols;
    const float v = src[r * src_ld + c];
    float *d = dst + r * dst_ld + c;
    *d = accumulate ? *d + v : v;
}

/* Element e = (a, r, j) of [O, D, I]: its line starts at a * D * I + j, stride I. */
MS_HD void ms_cu_scan_fwd(ms_k_scan op, float *out, const float *inp, int64_t d, int64_t i,
                          int64_t e) {
    const int64_t a = e / (d * i), r = e / i % d, base = a * d * i + e % i;
    double acc = op == MS_K_SCAN_PROD ? 1 : 0;
    for (int64_t q = 0; q <= r; q++)
        acc = op == MS_K_SCAN_PROD ? acc * inp[base + q * i] : acc + inp[base + q * i];
    out[e] = (float)acc;
}

/* cumsum: dinp_r += sum_{k >= r} dout_k (from the end); cumprod: dinp_r += P_r R_r with
 * P_r = prod_{q < r} x_q and R_r = dout_r + x_{r+1} R_{r+1}, as index.c, without division. */
MS_HD void ms_cu_scan_bwd(ms_k_scan op, float *dinp, const float *dout, const float *inp, int64_t d,
                          int64_t i, int64_t e) {
    const int64_t a = e / (d * i), r = e / i % d, base = a * d * i + e % i;
    if (op == MS_K_SCAN_SUM) {
        double s = 0;
        for (int64_t q = d - 1; q >= r; q--) s += dout[base + q * i];
        dinp[e] += (float)s;
        return;
    }
    double rr = 0;
    for (int64_t q = d - 1; q >= r; q--)
        rr = dout[base + q * i] + (q + 1 < d ? inp[base + (q + 1) * i] * rr : 0);
    double p = 1;
    for (int64_t q = 0; q < r; q++) p *= inp[base + q * i];
    dinp[e] += (float)(p * rr);
}

/* Element k of [batch, rows, cols]: kept where (c0 + c) - (r0 + r) <= diag (lower) or >= diag
 * (upper), else 0. */
MS_HD void ms_cu_triangle(float *out, const float *inp, int64_t rows, int64_t cols, int64_t r0,
                          int64_t c0, int64_t diag, bool upper, bool accumulate, int64_t k) {
    const int64_t r = k / cols % rows, c = k % cols, off = (c0 + c) - (r0 + r);
    const bool keep = upper ? off >= diag : off <= diag;
    const float v = keep ? inp[k] : 0.0f;
    out[k] = accumulate ? out[k] + v : v;
}

MS_HD void ms_cu_masked_fill_fwd(float *out, const float *x, const float *mask, float value,
                                 int64_t k) {
    out[k] = mask[k] != 0.0f ? value : x[k];
}

MS_HD void ms_cu_masked_fill_bwd(float *dinp, const float *dout, const float *mask, int64_t k) {
    if (mask[k] == 0.0f) dinp[k] += dout[k];
}

/* Element e = (row, class) of out [n, v]. */
MS_HD void ms_cu_one_hot(float *out, const float *ids, int64_t v, int64_t v0, int64_t e) {
    out[e] = (int64_t)ids[e / v] == v0 + e % v ? 1.0f : 0.0f;
}

/* Whether (x, i) sorts before (y, j): by value (NaN largest), descending or ascending, ties by
 * the lower index. */
MS_HD bool ms_cu_sorts_before(float x, int64_t i, float y, int64_t j, bool descending) {
    const bool nx = isnan(x), ny = isnan(y);
    const int c = nx != ny ? (nx ? 1 : -1) : nx ? 0 : (x > y) - (x < y);
    if (c) return descending ? c > 0 : c < 0;
    return i < j;
}

/* Element e = (row, j) of inp [rows, c]: its place in the sorted row; written out when it is
 * among the first k. */
MS_HD void ms_cu_sort_place(float *values, float *indices, const float *inp, int64_t c, int64_t k,
                            bool descending, int64_t e) {
    const int64_t row = e / c, j = e % c;
    const float *x = inp + row * c;
    int64_t rank = 0;
    for (int64_t q = 0; q < c; q++) rank += ms_cu_sorts_before(x[q], q, x[j], j, descending);
    if (rank < k) values[row * k + rank] = x[j], indices[row * k + rank] = (float)j;
}

/* Element e = (row, t) of dout [rows, k]: dinp[row, indices] += dout (distinct per row). */
MS_HD void ms_cu_sort_bwd(float *dinp, const float *dout, const float *indices, int64_t c,
                          int64_t k, int64_t e) {
    const int64_t row = e / k;
    dinp[row * c + (int64_t)indices[e]] += dout[e];
}

#endif

/* index.c - indexing and layout kernels (see index.h). */
#include "engine/kernels/index.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

void ms_k_view_identity(ms_k_view *v, int ndim, const int64_t *shape) {
    memset(v, 0, sizeof *v);
    v->ndim = ndim;
    int64_t stride = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        v->oshape[k] = v->ext[k] = shape[k];
        v->istride[k] = stride;
        stride *= shape[k];
    }
}

int64_t ms_k_view_numel(const ms_k_view *v) {
    int64_t n = 1;
    for (int k = 0; k < v->ndim; k++) n *= v->oshape[k];
    return n;
}

/* The input offset that output dim k contributes at coordinate o, or -1 in padding. */
static inline int64_t dim_source(const ms_k_view *v, int k, int64_t o) {
    int64_t c = o - v->lo[k];
    if (c < 0 || c >= v->ext[k]) return -1;
    if (v->flip[k]) c = v->ext[k] - 1 - c;
    if (v->mod[k] > 0) c = (c + v->shift[k]) % v->mod[k];
    return (c + v->start[k]) * v->istride[k];
}

/* The input offset of output row `row` (every dim but the last), or -1 in padding. */
static int64_t row_source(const ms_k_view *v, int64_t row) {
    int64_t off = 0;
    for (int k = v->ndim - 2; k >= 0; k--) {
        int64_t s = dim_source(v, k, row % v->oshape[k]);
        row /= v->oshape[k];
        if (s < 0) return -1;
        off += s;
    }
    return off;
}

/* Forward: out = source or fill. Backward (dinp != NULL): dinp[source] += dout. The outer
 * dims are resolved once per row, so the last dim costs no division. */
static void view_walk(const ms_k_view *v, float *out, const float *inp, float fill, float *dinp) {
    if (v->ndim == 0) {
        if (dinp)
            dinp[0] += inp[0];
        else
            out[0] = inp[0];
        return;
    }
    int last = v->ndim - 1;
    int64_t cols = v->oshape[last], n = ms_k_view_numel(v);
    bool plain = !v->lo[last] && v->ext[last] == cols && !v->flip[last] && !v->mod[last];
    for (int64_t row = 0; cols > 0 && row < n / cols; row++) {
        int64_t base = row_source(v, row);
        if (plain && base >= 0) { /* a strided run: no per-element mapping */
            const int64_t st = v->istride[last], b = base + v->start[last] * st;
            if (dinp)
                for (int64_t j = 0; j < cols; j++) dinp[b + j * st] += inp[row * cols + j];
            else
                for (int64_t j = 0; j < cols; j++) out[row * cols + j] = inp[b + j * st];
            continue;
        }
        for (int64_t j = 0; j < cols; j++) {
            int64_t s = base < 0 ? -1 : dim_source(v, last, j);
            if (dinp && s >= 0)
                dinp[base + s] += inp[row * cols + j];
            else if (!dinp)
                out[row * cols + j] = s < 0 ? fill : inp[base + s];
        }
    }
}

void ms_k_view_forward(float *out, const float *inp, const ms_k_view *v, float fill) {
    view_walk(v, out, inp, fill, NULL);
}

void ms_k_view_backward(float *dinp, const float *dout, const ms_k_view *v) {
    view_walk(v, NULL, dout, 0.0f, dinp);
}

/* Local row of the id at (a, l, j), or -1 when another rank holds it. */
static int64_t gather_row(const float *ids, const ms_k_gather_dims *g, int64_t a, int64_t l,
                          int64_t j) {
    float id = g->ids_per_row     ? ids[l]
               : g->ids_per_outer ? ids[a * g->l + l]
                                  : ids[(a * g->l + l) * g->i + j];
    int64_t r = (int64_t)id - g->d0;
    return r >= 0 && r < g->d ? r : -1;
}

void ms_k_gather(float *out, const float *x, const float *ids, const ms_k_gather_dims *g,
                 bool accumulate) {
    for (int64_t a = 0; a < g->o; a++)
        for (int64_t l = 0; l < g->l; l++)
            for (int64_t j = 0; j < g->i; j++) {
                int64_t r = gather_row(ids, g, a, l, j);
                float v = r < 0 ? 0.0f : x[(a * g->d + r) * g->i + j];
                float *y = &out[(a * g->l + l) * g->i + j];
                *y = accumulate ? *y + v : v;
            }
}

void ms_k_scatter_add(float *x, const float *src, const float *ids, const ms_k_gather_dims *g) {
    for (int64_t a = 0; a < g->o; a++)
        for (int64_t l = 0; l < g->l; l++)
            for (int64_t j = 0; j < g->i; j++) {
                int64_t r = gather_row(ids, g, a, l, j);
                if (r >= 0) x[(a * g->d + r) * g->i + j] += src[(a * g->l + l) * g->i + j];
            }
}

void ms_k_unstack_add(float *dinp, const float *dout, int64_t o, int n, int p, int64_t i) {
    for (int64_t a = 0; a < o; a++) {
        const float *src = dout + (a * n + p) * i;
        float *dst = dinp + a * i;
#pragma omp simd
        for (int64_t j = 0; j < i; j++) dst[j] += src[j];
    }
}

/* Running sum or product along the middle dim of [O, D, I], accumulated in double. */
static void scan(float *out, const float *inp, int64_t o, int64_t d, int64_t i, bool product) {
    for (int64_t a = 0; a < o; a++)
        for (int64_t j = 0; j < i; j++) {
            double acc = product ? 1 : 0;
            for (int64_t r = 0; r < d; r++) {
                int64_t k = (a * d + r) * i + j;
                acc = product ? acc * inp[k] : acc + inp[k];
                out[k] = (float)acc;
            }
        }
}

void ms_k_cumsum_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i) {
    scan(out, inp, o, d, i, false);
}

/* d/dx_r of sum_k w_k y_k = sum_{k >= r} w_k: a reverse cumulative sum. */
void ms_k_cumsum_backward(float *dinp, const float *dout, int64_t o, int64_t d, int64_t i) {
    for (int64_t a = 0; a < o; a++)
        for (int64_t j = 0; j < i; j++) {
            double s = 0;
            for (int64_t r = d - 1; r >= 0; r--) {
                int64_t k = (a * d + r) * i + j;
                s += dout[k];
                dinp[k] += (float)s;
            }
        }
}

void ms_k_cumprod_forward(float *out, const float *inp, int64_t o, int64_t d, int64_t i) {
    scan(out, inp, o, d, i, true);
}

/* d/dx_r of sum_k w_k y_k = P_r * R_r with P_r = prod_{q<r} x_q and R_r = sum_{k>=r} w_k
 * prod_{r<q<=k} x_q, so R_r = w_r + x_{r+1} R_{r+1}: two linear passes, no division. */
void ms_k_cumprod_backward(float *dinp, const float *dout, const float *inp, int64_t o, int64_t d,
                           int64_t i) {
    double *rr = xmalloc(sizeof *rr * (size_t)(d ? d : 1));
    for (int64_t a = 0; a < o; a++)
        for (int64_t j = 0; j < i; j++) {
            const int64_t base = a * d * i + j;
            for (int64_t r = d - 1; r >= 0; r--)
                rr[r] = dout[base + r * i] + (r + 1 < d ? inp[base + (r + 1) * i] * rr[r + 1] : 0);
            double p = 1;
            for (int64_t r = 0; r < d; r++) {
                dinp[base + r * i] += (float)(p * rr[r]);
                p *= inp[base + r * i];
            }
        }
    free(rr);
}

void ms_k_triangle(float *out, const float *inp, int64_t batch, int64_t rows, int64_t cols,
                   int64_t r0, int64_t c0, int64_t diag, bool upper, bool accumulate) {
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                int64_t k = (b * rows + r) * cols + c, off = (c0 + c) - (r0 + r);
                bool keep = upper ? off >= diag : off <= diag;
                float v = keep ? inp[k] : 0.0f;
                out[k] = accumulate ? out[k] + v : v;
            }
}

void ms_k_masked_fill_forward(float *out, const float *x, const float *mask, float value,
                              int64_t n) {
    for (int64_t k = 0; k < n; k++) out[k] = mask[k] != 0.0f ? value : x[k];
}

void ms_k_masked_fill_backward(float *dinp, const float *dout, const float *mask, int64_t n) {
    for (int64_t k = 0; k < n; k++)
        if (mask[k] == 0.0f) dinp[k] += dout[k];
}

void ms_k_one_hot(float *out, const float *ids, int64_t n, int64_t v, int64_t v0) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < v; c++) out[r * v + c] = (int64_t)ids[r] == v0 + c ? 1.0f : 0.0f;
}

typedef struct sort_item {
    float v;
    int64_t i;
} sort_item;

/* Orders by value, NaN largest, then by index: a total order, so qsort is deterministic. */
static int by_value_then_index(const sort_item *a, const sort_item *b, int sign) {
    bool na = isnan(a->v), nb = isnan(b->v);
    int c = na != nb ? (na ? 1 : -1) : na ? 0 : (a->v > b->v) - (a->v < b->v);
    if (c) return sign * c;
    return (a->i > b->i) - (a->i < b->i);
}
static int cmp_desc(const void *a, const void *b) {
    return by_value_then_index(a, b, -1);
}
static int cmp_asc(const void *a, const void *b) {
    return by_value_then_index(a, b, 1);
}

void ms_k_sort_rows(float *values, float *indices, const float *inp, int64_t rows, int64_t c,
                    int64_t k, bool descending) {
    sort_item *items = xmalloc(sizeof *items * (size_t)(c ? c : 1));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < c; j++) items[j] = (sort_item){inp[r * c + j], j};
        qsort(items, (size_t)c, sizeof *items, descending ? cmp_desc : cmp_asc);
        for (int64_t j = 0; j < k; j++) {
            values[r * k + j] = items[j].v;
            indices[r * k + j] = (float)items[j].i;
        }
    }
    free(items);
}

void ms_k_sort_rows_backward(float *dinp, const float *dout, const float *indices, int64_t rows,
                             int64_t c, int64_t k) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k; j++)
            dinp[r * c + (int64_t)indices[r * k + j]] += dout[r * k + j];
}

ms_k_cost ms_k_index_cost(int64_t n, double extra, bool backward) {
    ms_k_cost k;
    k.flops = backward ? (double)n : 0;
    k.bytes = 4.0 * (double)n * (2 + extra + (backward ? 1 : 0));
    return k;
}

void ms_k_block_copy(float *dst, const float *src, int64_t rows, int64_t cols, int64_t dst_ld,
                     int64_t src_ld, bool accumulate) {
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * dst_ld;
        const float *s = src + r * src_ld;
        if (accumulate)
            for (int64_t c = 0; c < cols; c++) d[c] += s[c];
        else
            for (int64_t c = 0; c < cols; c++) d[c] = s[c];
    }
}

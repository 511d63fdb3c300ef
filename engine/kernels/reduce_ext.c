/* reduce_ext.c - reductions over a set of dims (see reduce_ext.h).
 *
 * Each output element walks its reduced positions in row-major order, so the tie rule
 * ("first winner") and the summation order are the same whatever the memory layout. When
 * the reduced dims are adjacent, sum and max walk the input in memory order instead, with
 * one accumulator per output: the same order per output, without index arithmetic.
 */
#include "engine/kernels/reduce_ext.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "engine/core/xalloc.h"

void ms_k_rgeom_init(ms_k_rgeom *g, int ndim, const int64_t *shape, uint32_t mask) {
    int64_t stride = 1, st[MS_K_RED_MAX_DIMS];
    for (int d = ndim - 1; d >= 0; d--) st[d] = stride, stride *= shape[d];
    g->nk = g->nr = 0;
    g->n_out = g->n_red = 1;
    for (int d = 0; d < ndim; d++) {
        if (mask >> d & 1) {
            g->rshape[g->nr] = shape[d], g->rstride[g->nr++] = st[d];
            g->n_red *= shape[d];
        } else {
            g->kshape[g->nk] = shape[d], g->kstride[g->nk++] = st[d];
            g->n_out *= shape[d];
        }
    }
    int first = ndim, last = -1;
    for (int d = 0; d < ndim; d++)
        if (mask >> d & 1) first = first < d ? first : d, last = d;
    g->block = last >= 0 && last - first + 1 == g->nr;
    g->bo = g->bi = 1;
    for (int d = 0; d < ndim; d++) {
        if (d < first) g->bo *= shape[d];
        if (d > last) g->bi *= shape[d];
    }
}

static int64_t offset_of(int64_t flat, int n, const int64_t *shape, const int64_t *stride) {
    if (n == 1) return flat * stride[0]; /* one dim: no division (the common case) */
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        off += (flat % shape[d]) * stride[d];
        flat /= shape[d];
    }
    return off;
}

int64_t ms_k_rgeom_base(const ms_k_rgeom *g, int64_t o) {
    return offset_of(o, g->nk, g->kshape, g->kstride);
}

int64_t ms_k_rgeom_roff(const ms_k_rgeom *g, int64_t r) {
    return offset_of(r, g->nr, g->rshape, g->rstride);
}

/* Sum of a [bo, n_red, bi] block with bi double accumulators, in memory order. */
static void block_sum(float *out, const float *inp, const ms_k_rgeom *g, float scale) {
    if (g->bi == 1) { /* trailing dims: one contiguous row per output */
        for (int64_t a = 0; a < g->bo; a++) {
            const float *x = inp + a * g->n_red;
            double acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t r = 0; r < g->n_red; r++) acc += x[r];
            out[a] = (float)(acc * scale);
        }
        return;
    }
    double *acc = xmalloc(sizeof *acc * (size_t)(g->bi ? g->bi : 1));
    for (int64_t a = 0; a < g->bo; a++) {
        const float *x = inp + a * g->n_red * g->bi;
        for (int64_t j = 0; j < g->bi; j++) acc[j] = 0;
        for (int64_t r = 0; r < g->n_red; r++)
#pragma omp simd
            for (int64_t j = 0; j < g->bi; j++) acc[j] += x[r * g->bi + j];
        for (int64_t j = 0; j < g->bi; j++) out[a * g->bi + j] = (float)(acc[j] * scale);
    }
    free(acc);
}

void ms_k_rsum_forward(float *out, const float *inp, const ms_k_rgeom *g, float scale) {
    if (g->block) {
        block_sum(out, inp, g, scale);
        return;
    }
    for (int64_t o = 0; o < g->n_out; o++) {
        const float *x = inp + ms_k_rgeom_base(g, o);
        double s = 0;
        for (int64_t r = 0; r < g->n_red; r++) s += x[ms_k_rgeom_roff(g, r)];
        out[o] = (float)(s * scale);
    }
}

void ms_k_rsum_backward(float *dinp, const float *dout, const ms_k_rgeom *g, float scale) {
    for (int64_t a = 0; g->block && g->bi == 1 && a < g->bo; a++) { /* trailing dims: a row */
        float *dx = dinp + a * g->n_red;
        const float d = scale * dout[a];
#pragma omp simd
        for (int64_t r = 0; r < g->n_red; r++) dx[r] += d;
    }
    for (int64_t a = 0; g->block && g->bi > 1 && a < g->bo; a++)
        for (int64_t r = 0; r < g->n_red; r++) {
            float *dx = dinp + (a * g->n_red + r) * g->bi;
            const float *dy = dout + a * g->bi;
#pragma omp simd
            for (int64_t j = 0; j < g->bi; j++) dx[j] += scale * dy[j];
        }
    if (g->block) return;
    for (int64_t o = 0; o < g->n_out; o++) {
        float *dx = dinp + ms_k_rgeom_base(g, o), d = scale * dout[o];
        for (int64_t r = 0; r < g->n_red; r++) dx[ms_k_rgeom_roff(g, r)] += d;
    }
}

/* Whether v replaces the current winner: the first element, a NaN, or a strictly better
 * value (so ties keep the first). */
static inline bool takes_over(float v, float best, bool none, int sign) {
    return none || (!isnan(best) && (isnan(v) || (sign > 0 ? v > best : v < best)));
}

/* max/min of a [bo, n_red, bi] block in memory order; r ascends, so ties keep the first. */
static void block_max(float *out, float *pos, const float *inp, const ms_k_rgeom *g, int sign) {
    for (int64_t a = 0; g->bi == 1 && a < g->bo; a++) { /* trailing dims: a row per output */
        const float *x = inp + a * g->n_red;
        float best = sign > 0 ? -INFINITY : INFINITY;
        int64_t at = -1;
        for (int64_t r = 0; r < g->n_red; r++)
            if (takes_over(x[r], best, at < 0, sign)) best = x[r], at = r;
        out[a] = best, pos[a] = (float)at;
    }
    for (int64_t a = 0; g->bi > 1 && a < g->bo; a++) {
        float *y = out + a * g->bi, *p = pos + a * g->bi;
        for (int64_t j = 0; j < g->bi; j++) y[j] = sign > 0 ? -INFINITY : INFINITY, p[j] = -1;
        for (int64_t r = 0; r < g->n_red; r++) {
            const float *x = inp + (a * g->n_red + r) * g->bi;
            for (int64_t j = 0; j < g->bi; j++)
                if (takes_over(x[j], y[j], p[j] < 0, sign)) y[j] = x[j], p[j] = (float)r;
        }
    }
}

void ms_k_rmax_forward(float *out, float *pos, const float *inp, const ms_k_rgeom *g, int sign) {
    if (g->block) {
        block_max(out, pos, inp, g, sign);
        return;
    }
    for (int64_t o = 0; o < g->n_out; o++) {
        const float *x = inp + ms_k_rgeom_base(g, o);
        float best = sign > 0 ? -INFINITY : INFINITY;
        int64_t at = -1;
        for (int64_t r = 0; r < g->n_red; r++) {
            float v = x[ms_k_rgeom_roff(g, r)];
            if (takes_over(v, best, at < 0, sign)) best = v, at = r;
        }
        out[o] = best;
        pos[o] = (float)at;
    }
}

void ms_k_rmax_backward(float *dinp, const float *dout, const float *pos, const ms_k_rgeom *g) {
    for (int64_t o = 0; o < g->n_out; o++)
        if (pos[o] >= 0)
            dinp[ms_k_rgeom_base(g, o) + ms_k_rgeom_roff(g, (int64_t)pos[o])] += dout[o];
}

void ms_k_rprod_forward(float *out, const float *inp, const ms_k_rgeom *g) {
    for (int64_t o = 0; o < g->n_out; o++) {
        const float *x = inp + ms_k_rgeom_base(g, o);
        double p = 1;
        for (int64_t r = 0; r < g->n_red; r++) p *= x[ms_k_rgeom_roff(g, r)];
        out[o] = (float)p;
    }
}

/* The product of all but one element: the product of the nonzero ones is enough, since
 * with two zeros every such product is 0 and with one only the zero's own is not. */
void ms_k_rprod_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g) {
    for (int64_t o = 0; o < g->n_out; o++) {
        int64_t base = ms_k_rgeom_base(g, o), zeros = 0;
        double nz = 1;
        for (int64_t r = 0; r < g->n_red; r++) {
            float v = inp[base + ms_k_rgeom_roff(g, r)];
            if (v == 0.0f)
                zeros++;
            else
                nz *= v;
        }
        for (int64_t r = 0; r < g->n_red && zeros < 2; r++) {
            int64_t k = base + ms_k_rgeom_roff(g, r);
            double others = inp[k] == 0.0f ? nz : zeros ? 0.0 : nz / inp[k];
            dinp[k] += (float)(dout[o] * others);
        }
    }
}

/* dinp += slope * x + offset over the reduced elements of the output at `base`. */
static void add_affine(float *dinp, const float *inp, const ms_k_rgeom *g, int64_t base,
                       double slope, double offset) {
    for (int64_t r = 0; r < g->n_red; r++) {
        int64_t k = base + ms_k_rgeom_roff(g, r);
        dinp[k] += (float)(slope * inp[k] + offset);
    }
}

static double mean_of(const float *x, const ms_k_rgeom *g) {
    double s = 0;
    for (int64_t r = 0; r < g->n_red; r++) s += x[ms_k_rgeom_roff(g, r)];
    return s / (double)g->n_red;
}

static double var_of(const float *x, const ms_k_rgeom *g, double mean, int correction) {
    double s = 0;
    for (int64_t r = 0; r < g->n_red; r++) {
        double e = x[ms_k_rgeom_roff(g, r)] - mean;
        s += e * e;
    }
    int64_t n = g->n_red - correction;
    return n > 0 ? s / (double)n : NAN;
}

void ms_k_rvar_forward(float *out, const float *inp, const ms_k_rgeom *g, int correction,
                       bool take_root) {
    for (int64_t o = 0; o < g->n_out; o++) {
        const float *x = inp + ms_k_rgeom_base(g, o);
        double v = var_of(x, g, mean_of(x, g), correction);
        out[o] = (float)(take_root ? sqrt(v) : v);
    }
}

/* d var / d x_r = 2 (x_r - mean) / n; d std = d var / (2 std). */
void ms_k_rvar_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g,
                        int correction, bool take_root) {
    int64_t n = g->n_red - correction;
    if (n <= 0) return;
    for (int64_t o = 0; o < g->n_out; o++) {
        int64_t base = ms_k_rgeom_base(g, o);
        double mean = mean_of(inp + base, g), f = 2.0 * dout[o] / (double)n;
        if (take_root) {
            double sd = sqrt(var_of(inp + base, g, mean, correction));
            f = sd > 0 ? f / (2 * sd) : 0;
        }
        add_affine(dinp, inp, g, base, f, -f * mean);
    }
}

static double lse_of(const float *x, const ms_k_rgeom *g) {
    double m = -INFINITY, s = 0;
    for (int64_t r = 0; r < g->n_red; r++) m = fmax(m, x[ms_k_rgeom_roff(g, r)]);
    if (isinf(m)) return m;
    for (int64_t r = 0; r < g->n_red; r++) s += exp(x[ms_k_rgeom_roff(g, r)] - m);
    return m + log(s);
}

/* out[o] = stat of output o's reduced elements. */
static void each_output(float *out, const float *inp, const ms_k_rgeom *g,
                        double (*stat)(const float *, const ms_k_rgeom *)) {
    for (int64_t o = 0; o < g->n_out; o++) out[o] = (float)stat(inp + ms_k_rgeom_base(g, o), g);
}

void ms_k_rlse_forward(float *out, const float *inp, const ms_k_rgeom *g) {
    each_output(out, inp, g, lse_of);
}

/* dinp += dout * dstat(x, stat) over each output's reduced elements. */
static void stat_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g,
                          double (*stat)(const float *, const ms_k_rgeom *),
                          double (*dstat)(double x, double s)) {
    for (int64_t o = 0; o < g->n_out; o++) {
        int64_t base = ms_k_rgeom_base(g, o);
        double s = stat(inp + base, g);
        for (int64_t r = 0; r < g->n_red; r++) {
            int64_t k = base + ms_k_rgeom_roff(g, r);
            dinp[k] += (float)(dout[o] * dstat(inp[k], s));
        }
    }
}

/* d lse / d x = softmax(x) = exp(x - lse). */
static double lse_grad(double x, double l) {
    return isinf(l) ? 0 : exp(x - l);
}

void ms_k_rlse_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g) {
    stat_backward(dinp, dout, inp, g, lse_of, lse_grad);
}

static double norm_of(const float *x, const ms_k_rgeom *g) {
    double s = 0;
    for (int64_t r = 0; r < g->n_red; r++) {
        double v = x[ms_k_rgeom_roff(g, r)];
        s += v * v;
    }
    return sqrt(s);
}

void ms_k_rnorm_forward(float *out, const float *inp, const ms_k_rgeom *g) {
    each_output(out, inp, g, norm_of);
}

static double norm_grad(double x, double nrm) {
    return nrm > 0 ? x / nrm : 0;
}

void ms_k_rnorm_backward(float *dinp, const float *dout, const float *inp, const ms_k_rgeom *g) {
    stat_backward(dinp, dout, inp, g, norm_of, norm_grad);
}

void ms_k_rcount_forward(float *out, const float *inp, const ms_k_rgeom *g) {
    for (int64_t o = 0; o < g->n_out; o++) {
        const float *x = inp + ms_k_rgeom_base(g, o);
        int64_t n = 0;
        for (int64_t r = 0; r < g->n_red; r++) n += x[ms_k_rgeom_roff(g, r)] != 0.0f;
        out[o] = (float)n;
    }
}

ms_k_cost ms_k_rgeom_cost(const ms_k_rgeom *g, double flops_per, int passes, bool backward) {
    double e = (double)g->n_out * (double)g->n_red, r = (double)g->n_out;
    ms_k_cost k;
    k.flops = e * flops_per * (backward ? passes + 1 : passes);
    k.bytes = 4.0 * (e * (backward ? passes + 1 : passes) + r);
    return k;
}

void ms_k_reduce_forward(ms_k_reduce op, float *out, float *pos, const float *inp,
                         const ms_k_rgeom *g, float scale, int correction) {
    switch (op) {
        case MS_K_RED_SUM:
            ms_k_rsum_forward(out, inp, g, scale);
            break;
        case MS_K_RED_MAX:
        case MS_K_RED_MIN:
            ms_k_rmax_forward(out, pos, inp, g, op == MS_K_RED_MAX ? 1 : -1);
            break;
        case MS_K_RED_PROD:
            ms_k_rprod_forward(out, inp, g);
            break;
        case MS_K_RED_VAR:
        case MS_K_RED_STD:
            ms_k_rvar_forward(out, inp, g, correction, op == MS_K_RED_STD);
            break;
        case MS_K_RED_LSE:
            ms_k_rlse_forward(out, inp, g);
            break;
        case MS_K_RED_NORM:
            ms_k_rnorm_forward(out, inp, g);
            break;
        case MS_K_RED_COUNT:
            ms_k_rcount_forward(out, inp, g);
            break;
    }
}

void ms_k_reduce_backward(ms_k_reduce op, float *dinp, const float *dout, const float *inp,
                          const float *pos, const ms_k_rgeom *g, float scale, int correction) {
    switch (op) {
        case MS_K_RED_SUM:
            ms_k_rsum_backward(dinp, dout, g, scale);
            break;
        case MS_K_RED_MAX:
        case MS_K_RED_MIN:
            ms_k_rmax_backward(dinp, dout, pos, g);
            break;
        case MS_K_RED_PROD:
            ms_k_rprod_backward(dinp, dout, inp, g);
            break;
        case MS_K_RED_VAR:
        case MS_K_RED_STD:
            ms_k_rvar_backward(dinp, dout, inp, g, correction, op == MS_K_RED_STD);
            break;
        case MS_K_RED_LSE:
            ms_k_rlse_backward(dinp, dout, inp, g);
            break;
        case MS_K_RED_NORM:
            ms_k_rnorm_backward(dinp, dout, inp, g);
            break;
        case MS_K_RED_COUNT:
            break;
    }
}

/* pool.c - pooling, group normalisation and resizing on channels-first tensors (pool.h).
 *
 * Pooling and resizing work plane by plane (the planes are independent, so they split over
 * the rank's threads); their backwards scatter each output's gradient in output order, which
 * is the order pool.h promises and the CUDA kernels' per-input gathers reproduce. GroupNorm
 * is LayerNorm over each (sample, group) row, contiguous in [N, C, S]: two passes, summed in
 * double, since a group of a large image holds hundreds of thousands of elements.
 */
#include "engine/kernels/pool.h"

#include <math.h>

#include "engine/core/parallel.h"

/* Planes per parallel chunk: about 16k elements of work each. */
static int64_t plane_grain(int64_t per_plane) {
    return per_plane > 0 ? (1 << 14) / per_plane + 1 : 1;
}

/* ---- pooling ---- */

typedef struct pool_job {
    const ms_k_pool *g;
    float *out;
    int32_t *idx;
    const float *inp;
    float *dinp;
    const float *dout;
    const int32_t *cidx;
} pool_job;

static void pool_fwd_planes(void *arg, int64_t lo, int64_t hi) {
    const pool_job *j = arg;
    const ms_k_pool *g = j->g;
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    for (int64_t p = lo; p < hi; p++) {
        const float *x = j->inp + p * hw;
        for (int64_t o = 0; o < ohw; o++) {
            int32_t at;
            j->out[p * ohw + o] = ms_k_pool_point(g, x, o / g->ow, o % g->ow, &at);
            if (j->idx) j->idx[p * ohw + o] = at;
        }
    }
}

void ms_k_pool_forward(const ms_k_pool *g, float *out, int32_t *idx, const float *inp) {
    pool_job j = {.g = g, .out = out, .idx = idx, .inp = inp};
    ms_parallel_for(g->planes, plane_grain(g->oh * g->ow * g->kh * g->kw), pool_fwd_planes, &j);
}

static void pool_bwd_planes(void *arg, int64_t lo, int64_t hi) {
    const pool_job *j = arg;
    const ms_k_pool *g = j->g;
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    for (int64_t p = lo; p < hi; p++) {
        float *dx = j->dinp + p * hw;
        for (int64_t o = 0; o < ohw; o++) {
            const float d = j->dout[p * ohw + o];
            if (g->op == MS_K_POOL_MAX) {
                const int32_t at = j->cidx[p * ohw + o];
                if (at >= 0) dx[at] += d;
                continue;
            }
            int64_t r0, r1, c0, c1;
            ms_k_pool_window(g, o / g->ow, o % g->ow, &r0, &r1, &c0, &c1);
            const float share = d / ms_k_pool_divisor(g, r0, r1, c0, c1);
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) dx[r * g->w + c] += share;
        }
    }
}

void ms_k_pool_backward(const ms_k_pool *g, float *dinp, const float *dout, const int32_t *idx) {
    if (!dinp) return;
    pool_job j = {.g = g, .dinp = dinp, .dout = dout, .cidx = idx};
    ms_parallel_for(g->planes, plane_grain(g->oh * g->ow * g->kh * g->kw), pool_bwd_planes, &j);
}

ms_k_cost ms_k_pool_cost(const ms_k_pool *g, bool backward) {
    const double in = (double)g->planes * (double)(g->h * g->w);
    const double out = (double)g->planes * (double)(g->oh * g->ow);
    const double win = (double)(g->kh * g->kw);
    if (g->op == MS_K_POOL_MAX) /* the winners' indices: written, then read back */
        return backward ? (ms_k_cost){out, 4.0 * (2 * out + 2 * in)}
                        : (ms_k_cost){0, 4.0 * (in + 2 * out)};
    /* a window's sum and one division; the backward divides once and adds win times */
    return backward ? (ms_k_cost){out * (1 + win), 4.0 * (out + 2 * in)}
                    : (ms_k_cost){out * win, 4.0 * (in + out)};
}

/* ---- group normalisation ---- */

typedef struct gn_job {
    const ms_k_gnorm *g;
    float *out, *mean, *rstd;
    const float *inp, *weight, *bias;
} gn_job;

/* Rows are (sample, group): cpg * s contiguous elements. */
static void gn_fwd_rows(void *arg, int64_t lo, int64_t hi) {
    const gn_job *j = arg;
    const ms_k_gnorm *g = j->g;
    const int64_t cpg = g->c / g->groups, len = cpg * g->s;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->inp + r * len;
        const int64_t c0 = (r % g->groups) * cpg;
        double md = 0, v = 0;
        for (int64_t k = 0; k < len; k++) md += x[k];
        md /= (double)len;
        for (int64_t k = 0; k < len; k++) v += (x[k] - md) * (x[k] - md);
        const float m = (float)md, s = (float)(1.0 / sqrt(v / (double)len + g->eps));
        /* channel by channel: a division per element to find its channel cost more than
         * the normalisation (2 GFLOP/s) */
        for (int64_t ci = 0; ci < cpg; ci++) {
            const float w = j->weight[c0 + ci], b = j->bias[c0 + ci];
            const float *restrict xc = x + ci * g->s;
            float *restrict o = j->out + r * len + ci * g->s;
            for (int64_t k = 0; k < g->s; k++) o[k] = (xc[k] - m) * s * w + b;
        }
        j->mean[r] = m, j->rstd[r] = s;
    }
}

void ms_k_group_norm_forward(const ms_k_gnorm *g, float *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias) {
    if (g->groups <= 0) return;
    gn_job j = {g, out, mean, rstd, inp, weight, bias};
    ms_parallel_for(g->n * g->groups, plane_grain(g->c / g->groups * g->s), gn_fwd_rows, &j);
}

int64_t ms_k_group_norm_scratch_floats(const ms_k_gnorm *g) {
    return 2 * g->n * (g->c + g->groups);
}

/* scratch [2, N, C]: per (sample, channel) the sums over S of dout and dout * xhat. */
static void gn_channel_sums(const ms_k_gnorm *g, float *sd, float *sdx, const float *dout,
                            const float *inp, const float *mean, const float *rstd) {
    const int64_t cpg = g->c / g->groups;
    for (int64_t nc = 0; nc < g->n * g->c; nc++) {
        const int64_t row = nc / g->c * g->groups + nc % g->c / cpg;
        const float *d = dout + nc * g->s, *x = inp + nc * g->s, m = mean[row], rs = rstd[row];
        double a = 0, b = 0;
        for (int64_t k = 0; k < g->s; k++) {
            a += d[k];
            b += d[k] * ((x[k] - m) * rs);
        }
        sd[nc] = (float)a, sdx[nc] = (float)b;
    }
}

void ms_k_group_norm_backward(const ms_k_gnorm *g, float *dinp, float *dweight, float *dbias,
                              float *scratch, const float *dout, const float *inp,
                              const float *weight, const float *mean, const float *rstd) {
    if (g->groups <= 0) return;
    const int64_t nc = g->n * g->c, cpg = g->c / g->groups, len = cpg * g->s;
    float *sd = scratch, *sdx = scratch + nc;
    gn_channel_sums(g, sd, sdx, dout, inp, mean, rstd);
    for (int64_t r = 0; dinp && r < g->n * g->groups; r++) {
        const int64_t c0 = (r % g->groups) * cpg, ch = r / g->groups * g->c + c0;
        double ad = 0, bd = 0; /* means over the group of w dout and w dout xhat */
        for (int64_t k = 0; k < cpg; k++) ad += weight[c0 + k] * sd[ch + k];
        for (int64_t k = 0; k < cpg; k++) bd += weight[c0 + k] * sdx[ch + k];
        const float a = (float)(ad / (double)len), b = (float)(bd / (double)len);
        const float m = mean[r], rs = rstd[r];
        for (int64_t ci = 0; ci < cpg; ci++) { /* by channel, as the forward */
            const float w = weight[c0 + ci];
            const int64_t at = r * len + ci * g->s;
            const float *restrict x = inp + at, *restrict dy = dout + at;
            float *restrict dx = dinp + at;
            for (int64_t k = 0; k < g->s; k++) {
                const float xhat = (x[k] - m) * rs;
                dx[k] += rs * (w * dy[k] - a - xhat * b);
            }
        }
    }
    for (int64_t c = 0; c < g->c && (dweight || dbias); c++) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < g->n; i++) a += sd[i * g->c + c], b += sdx[i * g->c + c];
        if (dweight) dweight[c] += (float)b;
        if (dbias) dbias[c] += (float)a;
    }
}

ms_k_cost ms_k_group_norm_cost(const ms_k_gnorm *g, bool backward) {
    const double e = (double)g->n * (double)(g->c * g->s), rows = (double)(g->n * g->groups);
    const double ch = (double)g->c, nc = (double)(g->n * g->c);
    if (!backward) /* LayerNorm's per element: mean 1, centred square 3, scale and shift 4 */
        return (ms_k_cost){8 * e + 4 * rows, 4.0 * (2 * e + 2 * ch + 2 * rows)};
    /* the channel sums (5), dinp (7); the weight's and bias's sums over samples */
    return (ms_k_cost){12 * e + 4 * nc, 4.0 * (2 * e + 2 * e + ch + 4 * ch + 2 * rows)};
}

/* ---- resizing ---- */

typedef struct resize_job {
    const ms_k_resize *g;
    float *out;
    const float *inp;
} resize_job;

static void resize_fwd_planes(void *arg, int64_t lo, int64_t hi) {
    const resize_job *j = arg;
    const ms_k_resize *g = j->g;
    for (int64_t p = lo; p < hi; p++) {
        const float *x = j->inp + p * g->h * g->w;
        float *y = j->out + p * g->oh * g->ow;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const ms_k_resize_src sh = ms_k_resize_source(oy, g->h, g->oh, g->rh, g->linear);
            for (int64_t ox = 0; ox < g->ow; ox++) {
                const ms_k_resize_src sw = ms_k_resize_source(ox, g->w, g->ow, g->rw, g->linear);
                y[oy * g->ow + ox] = ms_k_resize_point(x, g->w, &sh, &sw);
            }
        }
    }
}

void ms_k_resize_forward(const ms_k_resize *g, float *out, const float *inp) {
    resize_job j = {g, out, inp};
    ms_parallel_for(g->planes, plane_grain(4 * g->oh * g->ow), resize_fwd_planes, &j);
}

static void resize_bwd_planes(void *arg, int64_t lo, int64_t hi) {
    const resize_job *j = arg;
    const ms_k_resize *g = j->g;
    for (int64_t p = lo; p < hi; p++) {
        float *dx = j->out + p * g->h * g->w;
        const float *dy = j->inp + p * g->oh * g->ow;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const ms_k_resize_src sh = ms_k_resize_source(oy, g->h, g->oh, g->rh, g->linear);
            for (int64_t ox = 0; ox < g->ow; ox++) {
                const ms_k_resize_src sw = ms_k_resize_source(ox, g->w, g->ow, g->rw, g->linear);
                for (int a = 0; a < sh.n; a++)
                    for (int b = 0; b < sw.n; b++)
                        dx[sh.i[a] * g->w + sw.i[b]] += sh.l[a] * sw.l[b] * dy[oy * g->ow + ox];
            }
        }
    }
}

void ms_k_resize_backward(const ms_k_resize *g, float *dinp, const float *dout) {
    if (!dinp) return;
    resize_job j = {g, dinp, dout};
    ms_parallel_for(g->planes, plane_grain(4 * g->oh * g->ow), resize_bwd_planes, &j);
}

ms_k_cost ms_k_resize_cost(const ms_k_resize *g, bool backward) {
    const double in = (double)g->planes * (double)(g->h * g->w);
    const double out = (double)g->planes * (double)(g->oh * g->ow);
    /* terms per output: 1 (nearest) or up to 4 (bilinear), a multiply and an add each */
    const double terms = g->linear ? (g->h != g->oh ? 2 : 1) * (g->w != g->ow ? 2 : 1) : 1;
    const double flops = g->linear ? out * terms * (backward ? 3 : 2) : 0;
    return backward ? (ms_k_cost){flops, 4.0 * (out + 2 * in)}
                    : (ms_k_cost){flops, 4.0 * (in + out)};
}

/* reduce_math.cuh - per-output arithmetic of the reductions over a dims mask
 * (engine/kernels/reduce_ext.h): sum, max/min with the first winner, product, variance and
 * standard deviation, logsumexp, L2 norm and nonzero count, forward and backward.
 *
 * One call handles output element o: it walks o's reduced positions r = 0, 1, ... in
 * row-major order (ms_k_rgeom), accumulating in double as reduce_ext.c does, so the order of
 * every sum is the CPU kernel's. A backward call adds into the input elements of o alone;
 * outputs own disjoint inputs, so one thread per output needs no atomics.
 */
#ifndef MS_CUDA_REDUCE_MATH_CUH
#define MS_CUDA_REDUCE_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"
#include "engine/kernels/cuda/cuda_kernels.h" /* reduce_ext.h, with C linkage */

MS_HD int64_t ms_cu_roffset(int64_t flat, int n, const int64_t *shape, const int64_t *stride) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        off += (flat % shape[d]) * stride[d];
        flat /= shape[d];
    }
    return off;
}

/* Input offsets of output o and of its reduced position r. */
MS_HD int64_t ms_cu_rbase(const ms_k_rgeom *g, int64_t o) {
    return ms_cu_roffset(o, g->nk, g->kshape, g->kstride);
}
MS_HD int64_t ms_cu_rpos(const ms_k_rgeom *g, int64_t r) {
    return ms_cu_roffset(r, g->nr, g->rshape, g->rstride);
}

/* Whether v replaces the current winner: the first element, a NaN, or strictly better. */
MS_HD bool ms_cu_takes_over(float v, float best, bool none, int sign) {
    return none || (!isnan(best) && (isnan(v) || (sign > 0 ? v > best : v < best)));
}

MS_HD double ms_cu_rmean(const float *x, const ms_k_rgeom *g) {
    double s = 0;
    for (int64_t r = 0; r < g->n_red; r++) s += x[ms_cu_rpos(g, r)];
    return s / (double)g->n_red;
}

MS_HD double ms_cu_rvar(const float *x, const ms_k_rgeom *g, double mean, int correction) {
    double s = 0;
    for (int64_t r = 0; r < g->n_red; r++) {
        const double e = x[ms_cu_rpos(g, r)] - mean;
        s += e * e;
    }
    const int64_t n = g->n_red - correction;
    return n > 0 ? s / (double)n : NAN;
}

MS_HD double ms_cu_rlse(const float *x, const ms_k_rgeom *g) {
    double m = -INFINITY, s = 0;
    for (int64_t r = 0; r < g->n_red; r++) m = fmax(m, (double)x[ms_cu_rpos(g, r)]);
    if (isinf(m)) return m;
    for (int64_t r = 0; r < g->n_red; r++) s += exp(x[ms_cu_rpos(g, r)] - m);
    return m + log(s);
}

MS_HD double ms_cu_rnorm(const float *x, const ms_k_rgeom *g) {
    double s = 0;
    for (int64_t r = 0; r < g->n_red; r++) {
        const double v = x[ms_cu_rpos(g, r)];
        s += v * v;
    }
    return sqrt(s);
}

/* Output o of reduction op (pos: max/min's winner, as a float; -1 when nothing is reduced). */
MS_HD void ms_cu_reduce_fwd(ms_k_reduce op, float *out, float *pos, const float *inp,
                            const ms_k_rgeom *g, float scale, int correction, int64_t o) {
    const float *x = inp + ms_cu_rbase(g, o);
    switch (op) {
        case MS_K_RED_SUM: {
            double s = 0;
            for (int64_t r = 0; r < g->n_red; r++) s += x[ms_cu_rpos(g, r)];
            out[o] = (float)(s * scale);
            break;
        }
        case MS_K_RED_MAX:
        case MS_K_RED_MIN: {
            const int sign = op == MS_K_RED_MAX ? 1 : -1;
            float best = sign > 0 ? -INFINITY : INFINITY;
            int64_t at = -1;
            for (int64_t r = 0; r < g->n_red; r++) {
                const float v = x[ms_cu_rpos(g, r)];
                if (ms_cu_takes_over(v, best, at < 0, sign)) best = v, at = r;
            }
            out[o] = best, pos[o] = (float)at;
            break;
        }
        case MS_K_RED_PROD: {
            double p = 1;
            for (int64_t r = 0; r < g->n_red; r++) p *= x[ms_cu_rpos(g, r)];
            out[o] = (float)p;
            break;
        }
        case MS_K_RED_VAR:
        case MS_K_RED_STD: {
            const double v = ms_cu_rvar(x, g, ms_cu_rmean(x, g), correction);
            out[o] = (float)(op == MS_K_RED_STD ? sqrt(v) : v);
            break;
        }
        case MS_K_RED_LSE:
            out[o] = (float)ms_cu_rlse(x, g);
            break;
        case MS_K_RED_NORM:
            out[o] = (float)ms_cu_rnorm(x, g);
            break;
        case MS_K_RED_COUNT: {
            int64_t c = 0;
            for (int64_t r = 0; r < g->n_red; r++) c += x[ms_cu_rpos(g, r)] != 0.0f;
            out[o] = (float)c;
            break;
        }
    }
}

/* dinp += the gradient of output o over its reduced elements. */
MS_HD void ms_cu_reduce_bwd(ms_k_reduce op, float *dinp, const float *dout, const float *inp,
                            const float *pos, const ms_k_rgeom *g, float scale, int correction,
                            int64_t o) {
    const int64_t base = ms_cu_rbase(g, o);
    float *dx = dinp + base;
    const float *x = inp ? inp + base : nullptr;
    switch (op) {
        case MS_K_RED_SUM: {
            const float d = scale * dout[o];
            for (int64_t r = 0; r < g->n_red; r++) dx[ms_cu_rpos(g, r)] += d;
            break;
        }
        case MS_K_RED_MAX:
        case MS_K_RED_MIN:
            if (pos[o] >= 0) dx[ms_cu_rpos(g, (int64_t)pos[o])] += dout[o];
            break;
        case MS_K_RED_PROD: { /* the product of the others, exact with zeros */
            int64_t zeros = 0;
            double nz = 1;
            for (int64_t r = 0; r < g->n_red; r++) {
                const float v = x[ms_cu_rpos(g, r)];
                if (v == 0.0f)
                    zeros++;
                else
                    nz *= v;
            }
            for (int64_t r = 0; r < g->n_red && zeros < 2; r++) {
                const int64_t k = ms_cu_rpos(g, r);
                const double others = x[k] == 0.0f ? nz : zeros ? 0.0 : nz / x[k];
                dx[k] += (float)(dout[o] * others);
            }
            break;
        }
        case MS_K_RED_VAR:
        case MS_K_RED_STD: {
            const int64_t n = g->n_red - correction;
            if (n <= 0) break;
            const double mean = ms_cu_rmean(x, g);
            double f = 2.0 * dout[o] / (double)n;
            if (op == MS_K_RED_STD) {
                const double sd = sqrt(ms_cu_rvar(x, g, mean, correction));
                f = sd > 0 ? f / (2 * sd) : 0;
            }
            for (int64_t r = 0; r < g->n_red; r++) {
                const int64_t k = ms_cu_rpos(g, r);
                dx[k] += (float)(f * x[k] + -f * mean);
            }
            break;
        }
        case MS_K_RED_LSE: {
            const double l = ms_cu_rlse(x, g);
            for (int64_t r = 0; r < g->n_red; r++) {
                const int64_t k = ms_cu_rpos(g, r);
                dx[k] += (float)(dout[o] * (isinf(l) ? 0 : exp(x[k] - l)));
            }
            break;
        }
        case MS_K_RED_NORM: {
            const double nrm = ms_cu_rnorm(x, g);
            for (int64_t r = 0; r < g->n_red; r++) {
                const int64_t k = ms_cu_rpos(g, r);
                dx[k] += (float)(dout[o] * (nrm > 0 ? x[k] / nrm : 0));
            }
            break;
        }
        case MS_K_RED_COUNT:
            break;
    }
}

#endif

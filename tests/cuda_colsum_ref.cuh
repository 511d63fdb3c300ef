/* cuda_colsum_ref.cuh - the column reductions of engine/kernels/cuda/colsum_math.cuh on the
 * host, for the CUDA tests: the two passes run as the launchers run them, the chunks' tiling of
 * the rows, the result the documented order must give, and the summation bounds a column sum
 * is held to against float64 and against the CPU kernels (which sum the rows in order).
 */
#ifndef MS_TESTS_CUDA_COLSUM_REF_CUH
#define MS_TESTS_CUDA_COLSUM_REF_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <numeric>
#include <vector>

#include "engine/kernels/cuda/colsum_math.cuh"
#include "engine/kernels/cuda/cuda_kernels.h"
#include "engine/kernels/cuda/elementwise_math.cuh"
#include "engine/kernels/cuda/fused_math.cuh"
#include "engine/kernels/cuda/llama_math.cuh"
#include "engine/kernels/cuda/norm_math.cuh"
#include "tests/cuda_testkit.cuh"

typedef std::vector<double> dvec;

static const double COLSUM_U = 1.0 / 16777216.0; /* 2^-24, fp32's unit roundoff */

/* The chunks tile [0, n) in order: each starts where the previous ended, the first at 0, the
 * last ends at n, none is empty or longer than MS_CU_COLSUM_CHUNK, so every row is summed
 * exactly once; and the scratch holds terms partials per (chunk, column). */
static inline bool colsum_tiles(int64_t n, int64_t c, int terms) {
    const int64_t chunks = ms_cu_colsum_chunks(n);
    std::vector<int> seen((size_t)n, 0);
    int64_t next = 0;
    bool ok = true;
    for (int64_t b = 0; b < chunks; b++) {
        int64_t lo, hi;
        ms_cu_colsum_rows(n, b, &lo, &hi);
        ok &= lo == next && hi > lo && hi - lo <= MS_CU_COLSUM_CHUNK && lo >= 0 && hi <= n;
        for (int64_t r = std::max<int64_t>(lo, 0); r < hi && r < n; r++) seen[(size_t)r]++;
        next = hi;
    }
    ok &= next == n;
    for (int s : seen) ok &= s == 1;
    ok &= ms_cu_colsum_scratch_floats(n, c, terms) == (int64_t)terms * chunks * c;
    printf("  colsum tiling n=%-6lld %lld chunk(s): every row once, scratch %lld floats%s\n",
           (long long)n, (long long)chunks, (long long)ms_cu_colsum_scratch_floats(n, c, terms),
           ok ? "" : "  FAIL");
    return ok;
}

/* The two passes as the launchers run them: pass1(part, b, j) for every chunk b and column j,
 * then pass2(part, chunks, j) for every column, part a scratch of
 * ms_cu_colsum_scratch_floats(n, c, terms) floats. A GPU runs a pass's threads in any order;
 * shuffled runs pass 1 in a random order and pass 2 backwards, which must change no bit. The
 * scratch starts as NaN, so a partial that pass 1 did not write poisons its column (and fails
 * here), and a guard after it must stay untouched. */
template <typename P1, typename P2>
static bool colsum_run(int64_t n, int64_t c, int terms, bool shuffled, P1 pass1, P2 pass2) {
    const int64_t chunks = ms_cu_colsum_chunks(n), size = ms_cu_colsum_scratch_floats(n, c, terms);
    const int64_t guard = 64;
    fvec part((size_t)(size + guard), NAN);
    std::vector<int64_t> order((size_t)(chunks * c));
    std::iota(order.begin(), order.end(), (int64_t)0);
    if (shuffled)
        for (size_t i = order.size(); i > 1; i--)
            std::swap(order[i - 1], order[(size_t)(urand() * (double)i)]);
    for (int64_t t : order) pass1(part.data(), t / c, t % c);
    bool ok = true;
    for (int64_t i = 0; i < size; i++) ok &= !isnan(part[(size_t)i]);
    for (int64_t k = 0; k < c; k++) pass2(part.data(), chunks, shuffled ? c - 1 - k : k);
    for (int64_t i = size; i < size + guard; i++) ok &= isnan(part[(size_t)i]);
    if (!ok)
        printf("    colsum n=%lld c=%lld: a partial unwritten or written out of bounds\n",
               (long long)n, (long long)c);
    return ok;
}

/* What a column reduction must give, from the outputs' values before the call (init) and the
 * fp32 terms t(r, j) the kernel adds:
 *   order: the documented order in fp32 (each chunk's terms left to right from 0, the chunk
 *          sums left to right onto init), which the kernel matches bit for bit;
 *   exact: init + the terms in float64;
 *   mag:   |init| + the sum of |t|, the scale of a summation bound.
 * The chunks are cut here by their definition (MS_CU_COLSUM_CHUNK rows from row 0), not by
 * the header's ms_cu_colsum_rows. */
struct colsum_want {
    fvec order;
    dvec exact, mag;
};

template <typename Term>
static colsum_want colsum_reference(int64_t n, int64_t c, const fvec &init, Term term) {
    colsum_want w{fvec((size_t)c), dvec((size_t)c), dvec((size_t)c)};
    for (int64_t j = 0; j < c; j++) {
        float s = init[(size_t)j];
        double e = init[(size_t)j], m = fabs((double)init[(size_t)j]);
        for (int64_t lo = 0; lo < n; lo += MS_CU_COLSUM_CHUNK) {
            float part = 0.0f;
            for (int64_t r = lo; r < n && r < lo + MS_CU_COLSUM_CHUNK; r++) {
                const float t = term(r, j);
                part += t;
                e += t;
                m += fabs((double)t);
            }
            s += part;
        }
        w.order[(size_t)j] = s, w.exact[(size_t)j] = e, w.mag[(size_t)j] = m;
    }
    return w;
}

/* The roundings between a column's exact sum and the two-pass result, in units of 2^-24 |mag|:
 * at most CHUNK - 1 in a chunk's sum, then one per chunk added onto init (recursive summation,
 * first order), and one for slack. */
static inline double colsum_units(int64_t n) {
    return (double)(MS_CU_COLSUM_CHUNK + ms_cu_colsum_chunks(n) + 1);
}
/* ... and between the two-pass result and a CPU kernel's (rows in order: n more). */
static inline double colsum_units_cpu(int64_t n) {
    return colsum_units(n) + (double)n + 1;
}

/* Per column |got - want| <= units 2^-24 mag + extra[j] (the terms' own difference, where the
 * two sides compute them differently; NULL: none) + rtol |want| (the rounding to bf16 of a
 * bf16 result). Prints the worst column as a fraction of its bound. */
static inline bool close_colsum(const char *what, const fvec &got, const dvec &want,
                                const dvec &mag, double units, double rtol = 0,
                                const dvec *extra = NULL) {
    double worst = 0, worst_err = 0;
    size_t at = 0;
    bool ok = got.size() == want.size() && mag.size() == want.size();
    for (size_t j = 0; ok && j < got.size(); j++) {
        const double e = fabs((double)got[j] - want[j]);
        const double lim =
            units * COLSUM_U * mag[j] + (extra ? (*extra)[j] : 0.0) + rtol * fabs(want[j]);
        const double ratio = lim > 0 ? e / lim : (e > 0 ? INFINITY : 0.0);
        if (!(e <= lim)) ok = false;
        if (!(ratio <= worst)) worst = ratio, worst_err = e, at = j;
    }
    printf("  %-58s c=%-5zu worst |err| %.3g (%.2g of bound)%s\n", what, got.size(), worst_err,
           worst, ok ? "" : "  FAIL");
    if (!ok && at < got.size())
        printf("    column %zu: got %.9g want %.9g mag %.3g\n", at, got[at], want[at], mag[at]);
    return ok;
}

/* ---- the backwards' column reductions as their launchers run them (T the activations'
 * storage, W the parameters'); false if colsum_run found a partial unwritten or out of
 * bounds. Every output is wanted (the launchers pass NULL parts for the others). fresh: the
 * elementwise gradients are written, not added to (the slots' fresh bits). ---- */

template <typename T, typename W>
static bool colsum_bias_add_bwd(T *dinp, W *dbias, const T *dout, int64_t n, int64_t c,
                                bool shuffled, bool fresh = false) {
    return colsum_run(
        n, c, 1, shuffled,
        [&](float *part, int64_t b, int64_t j) {
            ms_cu_bias_add_bwd_part(dinp, part, dout, n, c, b, j, fresh);
        },
        [&](const float *part, int64_t chunks, int64_t j) {
            ms_cu_colsum_finish(dbias, part, chunks, c, j);
        });
}

/* scratch [2, chunks, c]: dweight's partials, then dbias's (norm.cu). */
template <typename T, typename W>
static bool colsum_layernorm_bwd(W *dweight, W *dbias, const T *dout, const T *inp,
                                 const float *mean, const float *rstd, int64_t n, int64_t c,
                                 bool shuffled) {
    const int64_t plane = ms_cu_colsum_chunks(n) * c;
    return colsum_run(
        n, c, 2, shuffled,
        [&](float *part, int64_t b, int64_t j) {
            ms_cu_ln_dparams_part(part, part + plane, dout, inp, mean, rstd, n, c, b, j);
        },
        [&](const float *part, int64_t chunks, int64_t j) {
            ms_cu_colsum_finish(dweight, part, chunks, c, j);
            ms_cu_colsum_finish(dbias, part + plane, chunks, c, j);
        });
}

template <typename T>
static bool colsum_bias_gelu_bwd(T *dinp, T *dbias, const T *dout, const T *inp, const T *bias,
                                 int64_t n, int64_t c, bool shuffled, bool fresh = false) {
    return colsum_run(
        n, c, 1, shuffled,
        [&](float *part, int64_t b, int64_t k) {
            ms_cu_bias_gelu_bwd_part(dinp, part, dout, inp, bias, n, c, b, k, fresh);
        },
        [&](const float *part, int64_t chunks, int64_t k) {
            ms_cu_colsum_finish(dbias, part, chunks, c, k);
        });
}

/* Over the [rows, nb] view of the box (fused.cu). */
template <typename T>
static bool colsum_bda_bwd(T *dinp, T *dbias, T *dres, const T *dout, int64_t rows, int64_t nb,
                           float p, uint64_t seed, uint64_t sid, const ms_cu_box &box,
                           bool shuffled, unsigned fresh = 0) {
    return colsum_run(
        rows, nb, 1, shuffled,
        [&](float *part, int64_t b, int64_t k) {
            ms_cu_bda_bwd_part(dinp, part, dres, dout, rows, nb, p, seed, sid, box, b, k, fresh);
        },
        [&](const float *part, int64_t chunks, int64_t k) {
            ms_cu_colsum_finish(dbias, part, chunks, nb, k);
        });
}

template <typename T>
static bool colsum_rms_bwd(float *dweight, const T *dout, const T *inp, const float *rstd,
                           int64_t n, int64_t c, bool shuffled) {
    return colsum_run(
        n, c, 1, shuffled,
        [&](float *part, int64_t b, int64_t j) {
            ms_cu_rms_dweight_part(part, dout, inp, rstd, n, c, b, j);
        },
        [&](const float *part, int64_t chunks, int64_t j) {
            ms_cu_colsum_finish(dweight, part, chunks, c, j);
        });
}

/* Values in [-1, 1) scaled by 2^-k, k in [0, 24): their sums need more bits than fp32 has, so
 * another summation order, or a chunk left out or added twice, changes the result. */
static inline fvec colsum_binades(size_t n) {
    fvec x = frand(n, -1, 1);
    for (float &v : x) v = ldexpf(v, -(int)(urand() * 24));
    return x;
}

/* sum over rows of |a - b| per column: the terms' difference, from dinp outputs that started
 * at zero (0 + t is t exactly). */
static inline dvec column_absdiff(const fvec &a, const fvec &b, int64_t n, int64_t c) {
    dvec d((size_t)c, 0.0);
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < c; j++) d[j] += fabs((double)a[r * c + j] - (double)b[r * c + j]);
    return d;
}

static inline dvec to_dvec(const fvec &x) {
    return dvec(x.begin(), x.end());
}

/* got == want bit for bit, and so does got2 (a second run) unless it is NULL. */
static inline bool same_floats(const char *what, const fvec &got, const fvec &want,
                               const fvec *got2 = NULL) {
    const bool sizes = got.size() == want.size() && (!got2 || got2->size() == want.size());
    size_t bad = !sizes;
    for (size_t i = 0; sizes && i < want.size(); i++)
        bad += memcmp(&got[i], &want[i], sizeof(float)) != 0 ||
               (got2 && memcmp(&(*got2)[i], &want[i], sizeof(float)) != 0);
    printf("  %-58s %zu values, %zu differ%s\n", what, want.size(), bad, bad ? "  FAIL" : "");
    return bad == 0;
}

#endif

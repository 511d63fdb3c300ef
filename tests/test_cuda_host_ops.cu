/* test_cuda_host_ops.cu - the arithmetic of the CUDA kernels of every operator family beyond
 * the model layers (engine/kernels/cuda/ops_ext.cu), run on the CPU without a GPU: the
 * __host__ __device__ element, output and row functions of elementwise_ext_math.cuh,
 * reduce_math.cuh, index_math.cuh and rows_math.cuh, called for every element as the launchers
 * do, against the CPU kernels of engine/kernels on real shapes (GPT-2 small rows of 768, the
 * 50257 vocab, broadcasts over [8, 16, 48]), and every backward against central finite
 * differences of its own forward (tests/cuda_testkit.cuh's fd_check).
 *
 * Tolerances: the per-output reductions, scans, views, masks and broadcasting walks sum in
 * the CPU kernel's order, so they must agree exactly; the elementwise formulas are the CPU's
 * with the same libm on the host, but the CPU kernels are built with -O3 and may vectorise
 * through other math routines (1e-6 relative); the row ops sum in another order than the
 * CPU's vectorised float loops and use expf instead of its fast exponential (1e-5).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" { /* this cmocka.h has no C++ guards */
#include <cmocka.h>
}

#include "engine/kernels/cuda/elementwise_ext_math.cuh"
#include "engine/kernels/cuda/index_math.cuh"
#include "engine/kernels/cuda/reduce_math.cuh"
#include "engine/kernels/cuda/rows_math.cuh"
#include "tests/cuda_testkit.cuh"

/* ---- unary ---- */

/* Inputs inside each op's domain, away from kinks where a finite difference would straddle. */
static fvec unary_inputs(ms_k_unary op, size_t n) {
    switch (op) {
        case MS_K_UN_LOG:
        case MS_K_UN_SQRT:
        case MS_K_UN_RSQRT:
        case MS_K_UN_POW_SCALAR:
        case MS_K_UN_RECIPROCAL:
            return frand(n, 0.5, 3);
        case MS_K_UN_LOG1P:
            return frand(n, -0.5, 3);
        default:
            return frand(n, -3, 3);
    }
}

static float unary_p0(ms_k_unary op) {
    return op == MS_K_UN_CLAMP ? -1.0f : op == MS_K_UN_POW_SCALAR ? 1.7f : 0.2f;
}

static void test_unary(void **state) {
    (void)state;
    const int64_t n = 64 * 768;
    bool ok = true;
    for (int k = 0; k < MS_K_UN_COUNT; k++) {
        const ms_k_unary op = (ms_k_unary)k;
        const float p0 = unary_p0(op), p1 = 1.5f;
        fvec x = unary_inputs(op, n), g = frand(n, -1, 1), got(n), want(n);
        for (int64_t i = 0; i < n; i++) ms_cu_unary_fwd(op, got.data(), x.data(), p0, p1, i);
        ms_k_unary_forward(op, want.data(), x.data(), n, p0, p1);
        char what[64];
        snprintf(what, sizeof what, "unary %d forward (1e-6 rel)", k);
        ok &= close(what, got, want, 1e-7, 1e-6);
        fvec d1 = frand(n, -1, 1), d2 = d1;
        for (int64_t i = 0; i < n; i++)
            ms_cu_unary_bwd(op, d1.data(), x.data(), want.data(), g.data(), p0, p1, i);
        ms_k_unary_backward(op, d2.data(), x.data(), want.data(), g.data(), n, p0, p1, false);
        snprintf(what, sizeof what, "unary %d backward (1e-6 rel)", k);
        ok &= close(what, d1, d2, 1e-7, 1e-6);
        /* the backward against finite differences of the forward, on 512 elements */
        const int64_t m = 512;
        fvec xs(x.begin(), x.begin() + m), w = frand(m, -1, 1), y(m), dx(m, 0.0f);
        for (int64_t i = 0; i < m; i++) ms_cu_unary_fwd(op, y.data(), xs.data(), p0, p1, i);
        for (int64_t i = 0; i < m; i++)
            ms_cu_unary_bwd(op, dx.data(), xs.data(), y.data(), w.data(), p0, p1, i);
        auto loss = [&]() {
            for (int64_t i = 0; i < m; i++) ms_cu_unary_fwd(op, y.data(), xs.data(), p0, p1, i);
            return dot_loss(w, y);
        };
        snprintf(what, sizeof what, "unary %d backward vs finite differences", k);
        if (op != MS_K_UN_SIGN) ok &= fd_check(what, xs, dx, loss, 1e-3, 2e-3, 32);
    }
    assert_true(ok);
}

/* ---- broadcasting binary and ternary ---- */

typedef struct bshape {
    int nd;
    int64_t d[4];
} bshape;

static int64_t bnumel(const bshape &s) {
    int64_t n = 1;
    for (int i = 0; i < s.nd; i++) n *= s.d[i];
    return n;
}

static ms_k_bcast layout(const bshape &out, int n_in, const bshape *in) {
    const int64_t *shapes[3];
    int nds[3];
    for (int i = 0; i < n_in; i++) shapes[i] = in[i].d, nds[i] = in[i].nd;
    ms_k_bcast bc;
    ms_k_bcast_init(&bc, out.nd, out.d, n_in, shapes, nds);
    return bc;
}

/* The three layouts: both broadcast, one a row vector, one a scalar. */
static const bshape bin_cases[3][3] = {
    {{3, {8, 16, 48}}, {3, {8, 1, 48}}, {2, {16, 1}}},
    {{2, {256, 768}}, {2, {256, 768}}, {1, {768}}},
    {{3, {4, 6, 5}}, {3, {4, 6, 5}}, {0, {0}}},
};

static fvec binary_inputs(ms_k_binary op, size_t n, bool second) {
    if (op == MS_K_BIN_POW) return second ? frand(n, -2, 2) : frand(n, 0.5, 2);
    if (op == MS_K_BIN_DIV && second) return frand(n, 0.5, 2);
    return frand(n, -2, 2);
}

static bool binary_case(ms_k_binary op, const bshape *s) {
    const ms_k_bcast bc = layout(s[0], 2, s + 1);
    const int64_t no = bnumel(s[0]), na = bnumel(s[1]), nb = bnumel(s[2]);
    fvec a = binary_inputs(op, na, false), b = binary_inputs(op, nb, true), g = frand(no, -1, 1);
    if (op == MS_K_BIN_MAXIMUM || op == MS_K_BIN_EQ) a[0] = b[0]; /* a tie */
    fvec got(no), want(no);
    for (int64_t k = 0; k < no; k++) ms_cu_binary_fwd(op, got.data(), a.data(), b.data(), &bc, k);
    ms_k_binary_forward(op, want.data(), a.data(), b.data(), &bc);
    char what[80];
    snprintf(what, sizeof what, "binary %d forward, out %lld (exact)", (int)op, (long long)no);
    bool ok = close(what, got, want, 0, 0);
    fvec da1 = frand(na, -1, 1), da2 = da1, db1 = frand(nb, -1, 1), db2 = db1;
    for (int64_t j = 0; j < na; j++)
        ms_cu_binary_bwd(op, da1.data(), 0, g.data(), a.data(), b.data(), &bc, j);
    for (int64_t j = 0; j < nb; j++)
        ms_cu_binary_bwd(op, db1.data(), 1, g.data(), a.data(), b.data(), &bc, j);
    ms_k_binary_backward(op, da2.data(), db2.data(), g.data(), a.data(), b.data(), &bc);
    snprintf(what, sizeof what, "binary %d backward da (CPU's order: exact)", (int)op);
    ok &= close(what, da1, da2, 0, 0);
    snprintf(what, sizeof what, "binary %d backward db (CPU's order: exact)", (int)op);
    ok &= close(what, db1, db2, 0, 0);
    return ok;
}

static void test_binary(void **state) {
    (void)state;
    bool ok = true;
    for (int k = 0; k < MS_K_BIN_COUNT; k++)
        for (int c = 0; c < 3; c++) ok &= binary_case((ms_k_binary)k, bin_cases[c]);
    /* finite differences of the differentiable ops on the broadcast layout */
    const bshape *s = bin_cases[0];
    const ms_k_bcast bc = layout(s[0], 2, s + 1);
    const int64_t no = bnumel(s[0]), na = bnumel(s[1]), nb = bnumel(s[2]);
    for (int k = 0; k <= MS_K_BIN_SQUARED_DIFFERENCE; k++) {
        const ms_k_binary op = (ms_k_binary)k;
        if (op == MS_K_BIN_MAXIMUM || op == MS_K_BIN_MINIMUM) continue; /* kinks */
        fvec a = binary_inputs(op, na, false), b = binary_inputs(op, nb, true),
             w = frand(no, -1, 1);
        fvec y(no), da(na, 0.0f), db(nb, 0.0f);
        for (int64_t j = 0; j < na; j++)
            ms_cu_binary_bwd(op, da.data(), 0, w.data(), a.data(), b.data(), &bc, j);
        for (int64_t j = 0; j < nb; j++)
            ms_cu_binary_bwd(op, db.data(), 1, w.data(), a.data(), b.data(), &bc, j);
        auto loss = [&]() {
            for (int64_t q = 0; q < no; q++)
                ms_cu_binary_fwd(op, y.data(), a.data(), b.data(), &bc, q);
            return dot_loss(w, y);
        };
        char what[64];
        snprintf(what, sizeof what, "binary %d da vs finite differences", k);
        ok &= fd_check(what, a, da, loss, 1e-3, 2e-3, 24);
        snprintf(what, sizeof what, "binary %d db vs finite differences", k);
        ok &= fd_check(what, b, db, loss, 1e-3, 2e-3, 24);
    }
    assert_true(ok);
}

static void test_ternary(void **state) {
    (void)state;
    const bshape s[4] = {{3, {8, 16, 48}}, {3, {8, 1, 48}}, {2, {16, 48}}, {3, {8, 16, 1}}};
    const ms_k_bcast bc = layout(s[0], 3, s + 1);
    const int64_t no = bnumel(s[0]);
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        const ms_k_ternary op = (ms_k_ternary)k;
        fvec x = frand(bnumel(s[1]), -1, 1), y = frand(bnumel(s[2]), -1, 1),
             z = frand(bnumel(s[3]), -1, 1), g = frand(no, -1, 1);
        if (op == MS_K_TER_WHERE)
            for (float &v : x) v = v > 0 ? 1.0f : 0.0f;
        fvec got(no), want(no);
        for (int64_t q = 0; q < no; q++)
            ms_cu_ternary_fwd(op, got.data(), x.data(), y.data(), z.data(), &bc, q);
        if (op == MS_K_TER_LERP)
            ms_k_lerp_forward(want.data(), x.data(), y.data(), z.data(), &bc);
        else
            ms_k_where_forward(want.data(), x.data(), y.data(), z.data(), &bc);
        ok &= close(op == MS_K_TER_LERP ? "lerp forward (exact)" : "where forward (exact)", got,
                    want, 0, 0);
        fvec d1[3], d2[3];
        const fvec *in[3] = {&x, &y, &z};
        for (int i = 0; i < 3; i++) d1[i] = frand(in[i]->size(), -1, 1), d2[i] = d1[i];
        for (int i = op == MS_K_TER_LERP ? 0 : 1; i < 3; i++)
            for (int64_t j = 0; j < (int64_t)in[i]->size(); j++)
                ms_cu_ternary_bwd(op, d1[i].data(), i, g.data(), x.data(), y.data(), z.data(), &bc,
                                  j);
        if (op == MS_K_TER_LERP)
            ms_k_lerp_backward(d2[0].data(), d2[1].data(), d2[2].data(), g.data(), x.data(),
                               y.data(), z.data(), &bc);
        else
            ms_k_where_backward(d2[1].data(), d2[2].data(), g.data(), x.data(), &bc);
        for (int i = 0; i < 3; i++)
            ok &= close("ternary backward (CPU's order: exact)", d1[i], d2[i], 0, 0);
    }
    assert_true(ok);
}

/* ---- reductions ---- */

static void test_reduce(void **state) {
    (void)state;
    const int64_t shape[4] = {6, 7, 5, 4}, n = 6 * 7 * 5 * 4;
    const uint32_t masks[] = {0x5, 0x6, 0x8, 0xf, 0x1};
    bool ok = true;
    for (uint32_t mask : masks)
        for (int k = 0; k <= MS_K_RED_COUNT; k++) {
            const ms_k_reduce op = (ms_k_reduce)k;
            ms_k_rgeom g;
            ms_k_rgeom_init(&g, 4, shape, mask);
            fvec x = op == MS_K_RED_PROD ? frand(n, 0.8, 1.2) : frand(n, -2, 2);
            x[3] = 0.0f, x[5] = x[4]; /* a zero (count, prod) and a tie (max) */
            fvec got(g.n_out), want(g.n_out), p1(g.n_out), p2(g.n_out), dy = frand(g.n_out, -1, 1);
            for (int64_t o = 0; o < g.n_out; o++)
                ms_cu_reduce_fwd(op, got.data(), p1.data(), x.data(), &g, 0.3f, 1, o);
            ms_k_reduce_forward(op, want.data(), p2.data(), x.data(), &g, 0.3f, 1);
            char what[80];
            snprintf(what, sizeof what, "reduce %d mask %x forward (CPU's order: exact)", k, mask);
            ok &= close(what, got, want, 0, 0);
            if (op == MS_K_RED_MAX || op == MS_K_RED_MIN) ok &= close("  winners", p1, p2, 0, 0);
            fvec d1 = frand(n, -1, 1), d2 = d1;
            for (int64_t o = 0; o < g.n_out; o++)
                ms_cu_reduce_bwd(op, d1.data(), dy.data(), x.data(), p2.data(), &g, 0.3f, 1, o);
            ms_k_reduce_backward(op, d2.data(), dy.data(), x.data(), p2.data(), &g, 0.3f, 1);
            snprintf(what, sizeof what, "reduce %d mask %x backward (exact)", k, mask);
            ok &= close(what, d1, d2, 0, 0);
            if (op == MS_K_RED_MAX || op == MS_K_RED_MIN || op == MS_K_RED_COUNT) continue;
            fvec w = frand(g.n_out, -1, 1), y(g.n_out), pos(g.n_out), dx(n, 0.0f);
            for (int64_t o = 0; o < g.n_out; o++)
                ms_cu_reduce_bwd(op, dx.data(), w.data(), x.data(), NULL, &g, 0.3f, 1, o);
            auto loss = [&]() {
                for (int64_t o = 0; o < g.n_out; o++)
                    ms_cu_reduce_fwd(op, y.data(), pos.data(), x.data(), &g, 0.3f, 1, o);
                return dot_loss(w, y);
            };
            snprintf(what, sizeof what, "reduce %d mask %x vs finite differences", k, mask);
            /* one output of all 840 elements: each gradient is ~1/840 of the output, whose
             * float rounding over h would swamp it at h = 1e-3 */
            const double h = g.n_red > 100 ? 5e-2 : 1e-3;
            ok &= fd_check(what, x, dx, loss, h, 3e-3, 16);
        }
    assert_true(ok);
}

/* ---- views, copies, scans, masks, sorting ---- */

/* injective: whether ms_cu_view_injective must say the outputs read distinct sources (the
 * launcher then adds without atomics); checked against a count of each source's readers. */
static bool view_case(const char *what, const ms_k_view &v, const fvec &x, int64_t n_in,
                      bool injective) {
    const int64_t n = ms_k_view_numel(&v);
    std::vector<int> readers(n_in, 0);
    for (int64_t o = 0; o < n; o++) {
        const int64_t s = ms_cu_view_source(&v, o);
        if (s >= 0) readers[s]++;
    }
    const bool shared = *std::max_element(readers.begin(), readers.end()) > 1;
    const bool says = ms_cu_view_injective(&v);
    printf("  %-50s injective: %s (sources read twice: %s)\n", what, says ? "yes" : "no",
           shared ? "yes" : "no");
    if (says != injective || (says && shared)) {
        printf("    FAIL: expected %s\n", injective ? "injective" : "not injective");
        return false;
    }
    fvec got(n), want(n), g = frand(n, -1, 1), d1(n_in, 0.5f), d2 = d1;
    for (int64_t o = 0; o < n; o++) ms_cu_view_fwd(got.data(), x.data(), &v, 9.0f, o);
    ms_k_view_forward(want.data(), x.data(), &v, 9.0f);
    bool ok = close(what, got, want, 0, 0);
    for (int64_t o = 0; o < n; o++) { /* the launcher's atomics, in order */
        const int64_t s = ms_cu_view_source(&v, o);
        if (s >= 0) d1[s] += g[o];
    }
    ms_k_view_backward(d2.data(), g.data(), &v);
    return ok & close("  backward (exact)", d1, d2, 0, 0);
}

static void test_views(void **state) {
    (void)state;
    const int64_t is[3] = {12, 64, 48}, n = 12 * 64 * 48;
    const fvec x = frand(n, -1, 1);
    bool ok = true;
    ms_k_view v;
    const int64_t ps[3] = {48, 12, 64}; /* permute (2, 0, 1) */
    ms_k_view_identity(&v, 3, ps);
    v.istride[0] = 1, v.istride[1] = 64 * 48, v.istride[2] = 48;
    ok &= view_case("permute forward (exact)", v, x, n, true);
    const int64_t ss[3] = {12, 20, 48}; /* slice dim 1 [30, 50), flipped */
    ms_k_view_identity(&v, 3, ss);
    v.istride[0] = 64 * 48, v.istride[1] = 48, v.start[1] = 30, v.flip[1] = true;
    ok &= view_case("slice + flip forward (exact)", v, x, n, true);
    ms_k_view_identity(&v, 3, is); /* roll dim 2 by 7 */
    v.mod[2] = 48, v.shift[2] = 48 - 7;
    ok &= view_case("roll forward (exact)", v, x, n, true);
    const int64_t pad[3] = {14, 64, 52}; /* pad 1 + 1 rows, 3 + 1 columns */
    ms_k_view_identity(&v, 3, pad);
    v.istride[0] = 64 * 48, v.istride[1] = 48, v.istride[2] = 1;
    v.lo[0] = 1, v.ext[0] = 12, v.lo[2] = 3, v.ext[2] = 48;
    ok &= view_case("pad forward (exact)", v, x, n, true);
    const int64_t ex[3] = {12, 64, 48}; /* expand a [12, 1, 48] over dim 1: shared sources */
    ms_k_view_identity(&v, 3, ex);
    v.istride[0] = 48, v.istride[1] = 0, v.istride[2] = 1;
    ok &= view_case("expand forward (exact)", v, x, 12 * 48, false);
    /* a roll longer than its period repeats sources (tile); strides that overlap (a view
     * whose dims step over the same elements) do too */
    const int64_t tl[3] = {12, 64, 96}; /* dim 2 read twice round 48 */
    ms_k_view_identity(&v, 3, tl);
    v.istride[0] = 64 * 48, v.istride[1] = 48, v.istride[2] = 1, v.mod[2] = 48;
    ok &= view_case("tile forward (exact)", v, x, n, false);
    const int64_t ov[2] = {40, 40}; /* row stride 20 over rows of 40: windows overlap */
    ms_k_view_identity(&v, 2, ov);
    v.istride[0] = 20, v.istride[1] = 1;
    ok &= view_case("overlapping windows forward (exact)", v, x, n, false);
    /* block copies: one part of a concat and its split-back, accumulating */
    const int64_t rows = 64, cols = 48, ld = 160;
    fvec whole = frand(rows * ld, -1, 1), w2 = whole, part = frand(rows * cols, -1, 1);
    for (int64_t i = 0; i < rows * cols; i++)
        ms_cu_block_copy(whole.data() + 32, part.data(), cols, ld, cols, true, i);
    ms_k_block_copy(w2.data() + 32, part.data(), rows, cols, ld, cols, true);
    ok &= close("block copy (exact)", whole, w2, 0, 0);
    assert_true(ok);
}

static void test_scans(void **state) {
    (void)state;
    const int64_t o = 6, d = 40, i = 24, n = o * d * i;
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        const ms_k_scan op = (ms_k_scan)k;
        fvec x = op == MS_K_SCAN_PROD ? frand(n, 0.9, 1.1) : frand(n, -1, 1), got(n), want(n);
        x[i * 3] = 0.0f; /* a zero in a product */
        const fvec g = frand(n, -1, 1);
        for (int64_t e = 0; e < n; e++) ms_cu_scan_fwd(op, got.data(), x.data(), d, i, e);
        if (op == MS_K_SCAN_SUM)
            ms_k_cumsum_forward(want.data(), x.data(), o, d, i);
        else
            ms_k_cumprod_forward(want.data(), x.data(), o, d, i);
        ok &= close(k ? "cumprod forward (exact)" : "cumsum forward (exact)", got, want, 0, 0);
        fvec d1 = frand(n, -1, 1), d2 = d1;
        for (int64_t e = 0; e < n; e++) ms_cu_scan_bwd(op, d1.data(), g.data(), x.data(), d, i, e);
        if (op == MS_K_SCAN_SUM)
            ms_k_cumsum_backward(d2.data(), g.data(), o, d, i);
        else
            ms_k_cumprod_backward(d2.data(), g.data(), x.data(), o, d, i);
        ok &= close(k ? "cumprod backward (exact)" : "cumsum backward (exact)", d1, d2, 0, 0);
        fvec dx(n, 0.0f), y(n);
        for (int64_t e = 0; e < n; e++) ms_cu_scan_bwd(op, dx.data(), g.data(), x.data(), d, i, e);
        auto loss = [&]() {
            for (int64_t e = 0; e < n; e++) ms_cu_scan_fwd(op, y.data(), x.data(), d, i, e);
            return dot_loss(g, y);
        };
        ok &= fd_check(k ? "cumprod vs finite differences" : "cumsum vs finite differences", x, dx,
                       loss, 1e-3, 2e-3, 24);
    }
    assert_true(ok);
}

static void test_masks_and_sort(void **state) {
    (void)state;
    const int64_t b = 3, r = 64, c = 48, n = b * r * c;
    const fvec x = frand(n, -1, 1);
    bool ok = true;
    for (int upper = 0; upper < 2; upper++) {
        fvec got = frand(n, -1, 1), want = got;
        for (int64_t k = 0; k < n; k++)
            ms_cu_triangle(got.data(), x.data(), r, c, 16, 8, -3, upper, true, k);
        ms_k_triangle(want.data(), x.data(), b, r, c, 16, 8, -3, upper, true);
        ok &= close(upper ? "triu (exact)" : "tril (exact)", got, want, 0, 0);
    }
    fvec mask = frand(n, 0, 1), got(n), want(n);
    for (float &m : mask) m = m > 0.7f ? 1.0f : 0.0f;
    for (int64_t k = 0; k < n; k++) ms_cu_masked_fill_fwd(got.data(), x.data(), mask.data(), -5, k);
    ms_k_masked_fill_forward(want.data(), x.data(), mask.data(), -5, n);
    ok &= close("masked fill forward (exact)", got, want, 0, 0);
    fvec d1 = frand(n, -1, 1), d2 = d1;
    for (int64_t k = 0; k < n; k++) ms_cu_masked_fill_bwd(d1.data(), x.data(), mask.data(), k);
    ms_k_masked_fill_backward(d2.data(), x.data(), mask.data(), n);
    ok &= close("masked fill backward (exact)", d1, d2, 0, 0);
    const int64_t rows = 512, v = 64, v0 = 16;
    fvec ids = frand(rows, 0, 100), oh1(rows * v), oh2(rows * v);
    for (float &id : ids) id = floorf(id);
    for (int64_t e = 0; e < rows * v; e++) ms_cu_one_hot(oh1.data(), ids.data(), v, v0, e);
    ms_k_one_hot(oh2.data(), ids.data(), rows, v, v0);
    ok &= close("one hot (exact)", oh1, oh2, 0, 0);
    /* sort: rows of 768 with ties and a NaN; top 5 and the whole row, both directions */
    const int64_t sr = 64, sc = 768;
    fvec s = frand(sr * sc, -1, 1);
    for (int64_t q = 0; q < sr * sc; q += 7) s[q] = roundf(s[q] * 4) / 4; /* ties */
    s[10] = NAN;
    for (int64_t k : {(int64_t)5, sc})
        for (int desc = 0; desc < 2; desc++) {
            fvec v1(sr * k), i1(sr * k), v2(sr * k), i2(sr * k);
            for (int64_t e = 0; e < sr * sc; e++)
                ms_cu_sort_place(v1.data(), i1.data(), s.data(), sc, k, desc, e);
            ms_k_sort_rows(v2.data(), i2.data(), s.data(), sr, sc, k, desc);
            ok &= close("sort indices (exact)", i1, i2, 0, 0);
            bool same = !memcmp(v1.data(), v2.data(), sizeof(float) * v1.size());
            printf("  sort values k=%lld %s: %s\n", (long long)k, desc ? "desc" : "asc",
                   same ? "bit for bit" : "DIFFER");
            ok &= same;
            fvec g = frand(sr * k, -1, 1), e1 = frand(sr * sc, -1, 1), e2 = e1;
            for (int64_t e = 0; e < sr * k; e++)
                ms_cu_sort_bwd(e1.data(), g.data(), i2.data(), sc, k, e);
            ms_k_sort_rows_backward(e2.data(), g.data(), i2.data(), sr, sc, k);
            ok &= close("sort backward (exact)", e1, e2, 0, 0);
        }
    assert_true(ok);
}

/* ---- row ops, batched matmul, losses ---- */

static void test_rows(void **state) {
    (void)state;
    const int64_t n = 256, c = 768, e = n * c;
    bool ok = true;
    const char *names[] = {"plain norm", "log softmax", "masked softmax", "cosine"};
    for (int k = 0; k < 4; k++) {
        const ms_k_row_op op = (ms_k_row_op)k;
        const bool cos = op == MS_K_ROW_COSINE;
        const float p = op == MS_K_ROW_MASKED_SOFTMAX ? 0.7f : 1e-5f;
        fvec x = frand(e, -3, 3), y = frand(e, -1, 1);
        if (op == MS_K_ROW_MASKED_SOFTMAX)
            for (int64_t q = 0; q < e; q++) y[q] = y[q] > -0.5f || q < c ? 1.0f : 0.0f;
        const int64_t no = cos ? n : e;
        fvec o1(no), o2(no), a1(n), a2(n), g = frand(no, -1, 1);
        for (int64_t r = 0; r < n; r++)
            ms_cu_rows_fwd(op, o1.data(), a1.data(), x.data(), y.data(), c, p, r);
        ms_k_rows_forward(op, o2.data(), a2.data(), x.data(), y.data(), n, c, p);
        char what[80];
        snprintf(what, sizeof what, "%s forward (1e-5)", names[k]);
        ok &= close(what, o1, o2, 1e-5, 1e-5);
        fvec dx1 = frand(e, -1, 1), dx2 = dx1, dy1 = frand(e, -1, 1), dy2 = dy1;
        float *dy = cos ? dy1.data() : NULL;
        for (int64_t r = 0; r < n; r++)
            ms_cu_rows_bwd(op, dx1.data(), dy, g.data(), x.data(), y.data(), o2.data(), a2.data(),
                           c, p, r);
        ms_k_rows_backward(op, dx2.data(), cos ? dy2.data() : NULL, g.data(), x.data(), y.data(),
                           o2.data(), a2.data(), n, c, p);
        snprintf(what, sizeof what, "%s backward (1e-5)", names[k]);
        ok &= close(what, dx1, dx2, 1e-5, 1e-5);
        if (cos) ok &= close("cosine backward db (1e-5)", dy1, dy2, 1e-5, 1e-5);
        /* finite differences on 4 rows of 64 */
        const int64_t fn = 4, fc = 64;
        fvec fx(x.begin(), x.begin() + fn * fc), fy(y.begin(), y.begin() + fn * fc);
        const int64_t fo = cos ? fn : fn * fc;
        fvec w = frand(fo, -1, 1), out(fo), aux(fn), dfx(fn * fc, 0.0f);
        auto loss = [&]() {
            for (int64_t r = 0; r < fn; r++)
                ms_cu_rows_fwd(op, out.data(), aux.data(), fx.data(), fy.data(), fc, p, r);
            return dot_loss(w, out);
        };
        loss();
        for (int64_t r = 0; r < fn; r++)
            ms_cu_rows_bwd(op, dfx.data(), NULL, w.data(), fx.data(), fy.data(), out.data(),
                           aux.data(), fc, p, r);
        snprintf(what, sizeof what, "%s vs finite differences", names[k]);
        ok &= fd_check(what, fx, dfx, loss, 1e-3, 3e-3, 24);
    }
    assert_true(ok);
}

static void test_bmm(void **state) {
    (void)state;
    /* c [4, 3, M, N] = a [4, 1, M, K] @ b [3, K, N]: both operands broadcast */
    ms_k_bmm g;
    memset(&g, 0, sizeof g);
    g.nb = 2, g.shape[0] = 4, g.shape[1] = 3, g.a_stride[0] = 1, g.b_stride[1] = 1;
    g.m = 16, g.k = 64, g.n = 24;
    const int64_t items = 12, na = 4 * g.m * g.k, nb = 3 * g.k * g.n, nc = items * g.m * g.n;
    fvec a = frand(na, -1, 1), b = frand(nb, -1, 1), c1(nc), c2(nc), dc = frand(nc, -1, 1);
    for (int64_t e = 0; e < nc; e++) ms_cu_bmm_fwd(&g, c1.data(), a.data(), b.data(), e);
    ms_k_bmm_forward(&g, c2.data(), a.data(), b.data());
    bool ok = close("bmm forward (1e-5)", c1, c2, 1e-5, 1e-5);
    fvec da1 = frand(na, -1, 1), da2 = da1, db1 = frand(nb, -1, 1), db2 = db1;
    for (int64_t e = 0; e < na; e++)
        ms_cu_bmm_bwd(&g, da1.data(), false, dc.data(), a.data(), b.data(), e);
    for (int64_t e = 0; e < nb; e++)
        ms_cu_bmm_bwd(&g, db1.data(), true, dc.data(), a.data(), b.data(), e);
    ms_k_bmm_backward(&g, da2.data(), db2.data(), dc.data(), a.data(), b.data());
    ok &= close("bmm backward da (1e-5)", da1, da2, 1e-5, 1e-5);
    ok &= close("bmm backward db (1e-5)", db1, db2, 1e-5, 1e-5);
    fvec y(nc), ga(na, 0.0f);
    for (int64_t e = 0; e < na; e++)
        ms_cu_bmm_bwd(&g, ga.data(), false, dc.data(), a.data(), b.data(), e);
    auto loss = [&]() {
        for (int64_t e = 0; e < nc; e++) ms_cu_bmm_fwd(&g, y.data(), a.data(), b.data(), e);
        return dot_loss(dc, y);
    };
    ok &= fd_check("bmm da vs finite differences", a, ga, loss, 1e-2, 1e-3, 24);
    assert_true(ok);
}

static void test_losses(void **state) {
    (void)state;
    bool ok = true;
    const int64_t n = 256 * 768;
    fvec a = frand(n, -2, 2), b = frand(n, -2, 2), dout = {0.8f};
    for (int k = 0; k < 3; k++) {
        const ms_k_loss kind = (ms_k_loss)k;
        fvec l1(1), l2(1);
        ms_cu_pointwise_loss_fwd(kind, l1.data(), a.data(), b.data(), n, 1.0f, 1.0f / n);
        ms_k_pointwise_loss_forward(kind, l2.data(), a.data(), b.data(), n, 1.0f, 1.0f / n);
        ok &= close("pointwise loss forward (same order: exact)", l1, l2, 0, 0);
        fvec da1(n, 0.1f), da2 = da1, db1(n, 0.2f), db2 = db1;
        for (int64_t i = 0; i < n; i++)
            ms_cu_pointwise_loss_bwd(kind, da1.data(), db1.data(), a.data(), b.data(), dout.data(),
                                     1.0f, 1.0f / n, i);
        ms_k_pointwise_loss_backward_dev(kind, da2.data(), db2.data(), a.data(), b.data(),
                                         dout.data(), n, 1.0f, 1.0f / n);
        ok &= close("pointwise loss backward da (exact)", da1, da2, 0, 0);
        ok &= close("pointwise loss backward db (exact)", db1, db2, 0, 0);
    }
    /* NLL over a vocab slice and the smoothed cross-entropy over the 50257 vocab */
    const int64_t rows = 8, v = 50257, vl = 12000, v0 = 20000;
    std::vector<int32_t> t(rows);
    for (int64_t i = 0; i < rows; i++) t[i] = i == 1 ? -1 : (int32_t)(urand() * v);
    t[2] = (int32_t)(v0 + 5);
    fvec lp = frand(rows * vl, -12, 0), n1(rows), n2(rows), dl = frand(rows, -1, 1);
    for (int64_t i = 0; i < rows; i++) ms_cu_nll_fwd(n1.data(), lp.data(), t.data(), vl, v0, i);
    ms_k_nll_forward(n2.data(), lp.data(), t.data(), rows, vl, v0);
    ok &= close("nll forward (exact)", n1, n2, 0, 0);
    fvec g1 = frand(rows * vl, -1, 1), g2 = g1;
    for (int64_t i = 0; i < rows; i++) ms_cu_nll_bwd(g1.data(), dl.data(), t.data(), vl, v0, i);
    ms_k_nll_backward(g2.data(), dl.data(), t.data(), rows, vl, v0);
    ok &= close("nll backward (exact)", g1, g2, 0, 0);
    fvec x = frand(rows * v, -4, 4), s1(rows), s2(rows), e1(rows), e2(rows);
    for (int64_t i = 0; i < rows; i++)
        ms_cu_xent_smooth_fwd(s1.data(), e1.data(), x.data(), t.data(), v, 0.1f, i);
    ms_k_xent_smooth_forward(s2.data(), e2.data(), x.data(), t.data(), rows, v, 0.1f);
    ok &= close("smoothed xent forward, V = 50257 (1e-5)", s1, s2, 1e-5, 1e-5);
    fvec d1 = frand(rows * v, -1, 1), d2 = d1;
    for (int64_t i = 0; i < rows; i++)
        ms_cu_xent_smooth_bwd(d1.data(), x.data(), e2.data(), t.data(), dl.data(), v, 0.1f, i);
    ms_k_xent_smooth_backward(d2.data(), x.data(), e2.data(), t.data(), dl.data(), rows, v, 0.1f);
    ok &= close("smoothed xent backward, V = 50257 (1e-6)", d1, d2, 1e-6, 1e-5);
    /* finite differences of the smoothed cross-entropy on rows of 97 */
    const int64_t fr = 4, fv = 97;
    std::vector<int32_t> ft = {3, -1, 96, 0};
    fvec fx = frand(fr * fv, -3, 3), w = frand(fr, -1, 1), fl(fr), flse(fr), dfx(fr * fv, 0.0f);
    auto loss = [&]() {
        for (int64_t i = 0; i < fr; i++)
            ms_cu_xent_smooth_fwd(fl.data(), flse.data(), fx.data(), ft.data(), fv, 0.1f, i);
        return dot_loss(w, fl);
    };
    loss();
    for (int64_t i = 0; i < fr; i++)
        ms_cu_xent_smooth_bwd(dfx.data(), fx.data(), flse.data(), ft.data(), w.data(), fv, 0.1f, i);
    ok &= fd_check("smoothed xent vs finite differences", fx, dfx, loss, 1e-3, 2e-3, 24);
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_ternary),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_scans),
        cmocka_unit_test(test_masks_and_sort),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_bmm),
        cmocka_unit_test(test_losses),
    };
    return cmocka_run_group_tests_name("cuda_host_ops", tests, NULL, NULL);
}

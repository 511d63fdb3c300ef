/* test_cuda_host_pool.cu - the arithmetic of the CUDA kernels of pooling, group normalisation
 * and resizing (engine/kernels/cuda/pool.cu), run on the CPU without a GPU: pool_math.cuh's
 * element and row functions called for every element, and every lane of a row, as the
 * launchers call them, against the CPU kernels of engine/kernels/pool.c on the shapes of
 * vision and speech models (ResNet's stem and stages, UNet's resizes, 1-D audio frames), and
 * every backward against central finite differences of its own forward.
 *
 * Tolerances: pooling compares and sums each window in the CPU kernel's order and its
 * backward gathers in the CPU scatter's order, so it must agree exactly; resizing agrees but
 * for FMA contraction of its two-term sums (1e-6 relative); GroupNorm's sums run in fp32 on
 * the lanes' tree where the CPU kernel sums in double (1e-5 relative).
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

#include "engine/kernels/cuda/pool_math.cuh"
#include "tests/cuda_testkit.cuh"

#define L MS_CU_ROW_LANES

/* ---- pooling ---- */

static void pool_forward(const ms_k_pool &g, fvec &out, std::vector<int32_t> &idx, const fvec &x) {
    out.assign(g.planes * g.oh * g.ow, 0.0f), idx.assign(out.size(), -2);
    for (int64_t o = 0; o < (int64_t)out.size(); o++)
        ms_cu_pool_fwd(&g, out.data(), idx.data(), x.data(), o);
}
static void pool_backward(const ms_k_pool &g, fvec &dx, const fvec &dy,
                          const std::vector<int32_t> &idx) {
    for (int64_t i = 0; i < (int64_t)dx.size(); i++)
        ms_cu_pool_bwd(&g, dx.data(), dy.data(), idx.data(), i);
}

static ms_k_pool pool_geom(ms_k_pool_op op, int64_t planes, int64_t h, int64_t w, int64_t kh,
                           int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, bool excl) {
    return ms_k_pool{
        op, planes, h,  w,   (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1, kh, kw, sh,
        sw, ph,     pw, excl};
}

static void test_pool(void **state) {
    (void)state;
    const ms_k_pool cases[] = {
        /* ResNet's stem pool on a batch of 4 [64, 112, 112]; a stage's 2x2 average; a VGG-like
         * 2x2 max; a 1-D pool over 400 audio frames; average with and without the padding */
        pool_geom(MS_K_POOL_MAX, 4 * 64, 112, 112, 3, 3, 2, 2, 1, 1, false),
        pool_geom(MS_K_POOL_AVG, 8 * 128, 28, 28, 2, 2, 2, 2, 0, 0, false),
        pool_geom(MS_K_POOL_MAX, 8 * 64, 32, 32, 2, 2, 2, 2, 0, 0, false),
        pool_geom(MS_K_POOL_MAX, 8 * 80, 1, 400, 1, 5, 1, 3, 0, 2, false),
        pool_geom(MS_K_POOL_AVG, 4 * 64, 19, 23, 5, 3, 3, 2, 2, 1, false),
        pool_geom(MS_K_POOL_AVG, 4 * 64, 19, 23, 5, 3, 3, 2, 2, 1, true),
    };
    bool ok = true;
    for (const ms_k_pool &g : cases) {
        const int64_t n_in = g.planes * g.h * g.w, n_out = g.planes * g.oh * g.ow;
        fvec x = frand(n_in, -3, 3);
        if (g.op == MS_K_POOL_MAX) /* ties: a quarter of the values on a coarse grid */
            for (int64_t i = 0; i < n_in; i += 4) x[i] = floorf(x[i]);
        fvec got, want(n_out);
        std::vector<int32_t> idx, widx(n_out);
        pool_forward(g, got, idx, x);
        ms_k_pool_forward(&g, want.data(), g.op == MS_K_POOL_MAX ? widx.data() : NULL, x.data());
        printf("%s pool [%lld, %lld], window %lldx%lld\n",
               g.op == MS_K_POOL_MAX ? "max"
               : g.exclude_pad       ? "avg (exclude pad)"
                                     : "avg",
               (long long)g.h, (long long)g.w, (long long)g.kh, (long long)g.kw);
        ok &= close("  forward (exact)", got, want, 0, 0);
        if (g.op == MS_K_POOL_MAX) ok &= idx == widx;
        const fvec dy = frand(n_out, -1, 1), d0 = frand(n_in, -1, 1);
        fvec d1 = d0, d2 = d0;
        pool_backward(g, d1, dy, idx);
        ms_k_pool_backward(&g, d2.data(), dy.data(), g.op == MS_K_POOL_MAX ? widx.data() : NULL);
        ok &= close("  backward (exact)", d1, d2, 0, 0);
    }
    assert_true(ok);
}

static void test_pool_fd(void **state) {
    (void)state;
    bool ok = true;
    for (ms_k_pool_op op : {MS_K_POOL_MAX, MS_K_POOL_AVG}) {
        const ms_k_pool g = pool_geom(op, 6, 9, 7, 3, 2, 2, 1, 1, 1, false);
        fvec x = frand(g.planes * g.h * g.w, -2, 2), out;
        const fvec w = frand(g.planes * g.oh * g.ow, -1, 1);
        std::vector<int32_t> idx;
        auto loss = [&]() {
            pool_forward(g, out, idx, x);
            return dot_loss(w, out);
        };
        loss();
        fvec dx(x.size(), 0.0f);
        pool_backward(g, dx, w, idx);
        /* max: a step well below the gaps between values, so no window changes its winner */
        ok &= fd_check(op == MS_K_POOL_MAX ? "max pool dinp vs finite differences"
                                           : "avg pool dinp vs finite differences",
                       x, dx, loss, op == MS_K_POOL_MAX ? 1e-4 : 1e-2, 1e-3, 64);
    }
    assert_true(ok);
}

/* ---- group normalisation ---- */

/* The forward's rows with the lanes and tree of a block. */
static void gn_forward(const ms_k_gnorm &g, fvec &out, fvec &mean, fvec &rstd, const fvec &x,
                       const fvec &w, const fvec &b) {
    const int64_t cpg = g.c / g.groups, len = cpg * g.s;
    out.resize(x.size()), mean.resize(g.n * g.groups), rstd.resize(g.n * g.groups);
    for (int64_t r = 0; r < g.n * g.groups; r++) {
        const float *xr = x.data() + r * len;
        const int64_t c0 = r % g.groups * cpg;
        float pa[L], pb[L];
        for (int l = 0; l < L; l++) pa[l] = ms_cu_row_sum_part(xr, len, l, L);
        const float m = ms_cu_lanes_sum(pa, L) / (float)len;
        for (int l = 0; l < L; l++) pb[l] = ms_cu_ln_sqdev_part(xr, len, m, l, L);
        const float s = ms_cu_ln_rstd(ms_cu_lanes_sum(pb, L), len, g.eps);
        for (int l = 0; l < L; l++)
            ms_cu_gn_out_part(out.data() + r * len, xr, w.data() + c0, b.data() + c0, len, g.s, m,
                              s, l, L);
        mean[r] = m, rstd[r] = s;
    }
}

/* The backward's four launches. */
static void gn_backward(const ms_k_gnorm &g, float *dx, float *dw, float *db, const fvec &dy,
                        const fvec &x, const fvec &w, const fvec &mean, const fvec &rstd) {
    const int64_t nc = g.n * g.c, rows = g.n * g.groups, cpg = g.c / g.groups;
    fvec scratch(ms_k_group_norm_scratch_floats(&g));
    float *sd = scratch.data(), *sdx = sd + nc, *ga = sd + 2 * nc, *gb = ga + rows;
    for (int64_t q = 0; q < nc; q++) {
        const int64_t r = q / g.c * g.groups + q % g.c / cpg;
        float pa[L], pb[L];
        for (int l = 0; l < L; l++)
            ms_cu_gn_chan_part(&pa[l], &pb[l], dy.data() + q * g.s, x.data() + q * g.s, g.s,
                               mean[r], rstd[r], l, L);
        sd[q] = ms_cu_lanes_sum(pa, L), sdx[q] = ms_cu_lanes_sum(pb, L);
    }
    for (int64_t r = 0; r < rows; r++) ms_cu_gn_group_sums(ga, gb, sd, sdx, w.data(), &g, r);
    for (int64_t e = 0; dx && e < nc * g.s; e++)
        ms_cu_gn_dinp(dx, dy.data(), x.data(), w.data(), mean.data(), rstd.data(), ga, gb, &g, e);
    for (int64_t c = 0; c < g.c; c++) ms_cu_gn_dparams(dw, db, sd, sdx, &g, c);
}

static void test_group_norm(void **state) {
    (void)state;
    /* ResNet-GN stages (32 groups), a UNet block, InstanceNorm, LayerNorm over [C, H, W], and a
     * speech encoder's [N, C, T] with a mean far from zero */
    const ms_k_gnorm cases[] = {{4, 64, 56 * 56, 32, 1e-5f}, {2, 256, 14 * 14, 32, 1e-5f},
                                {4, 32, 16 * 16, 32, 1e-5f}, {2, 64, 8 * 8, 1, 1e-5f},
                                {8, 80, 200, 8, 1e-5f},      {3, 6, 1, 3, 1e-3f}};
    bool ok = true;
    for (const ms_k_gnorm &g : cases) {
        const int64_t e = g.n * g.c * g.s, rows = g.n * g.groups;
        fvec x = frand(e, -2, 2);
        if (g.c == 80)
            for (float &v : x) v += 40.0f;
        const fvec w = frand(g.c, 0.5, 1.5), b = frand(g.c, -0.5, 0.5);
        fvec out, mean, rstd, out2(e), mean2(rows), rstd2(rows);
        gn_forward(g, out, mean, rstd, x, w, b);
        ms_k_group_norm_forward(&g, out2.data(), mean2.data(), rstd2.data(), x.data(), w.data(),
                                b.data());
        printf("group_norm [%lld, %lld, %lld] in %lld groups\n", (long long)g.n, (long long)g.c,
               (long long)g.s, (long long)g.groups);
        ok &= close("  mean vs CPU (1e-6 + 1e-6 rel)", mean, mean2, 1e-6, 1e-6);
        ok &= close("  rstd vs CPU (1e-5 rel)", rstd, rstd2, 0, 1e-5);
        ok &= close("  out vs CPU (2e-5 + 1e-5 rel)", out, out2, 2e-5, 1e-5);
        const fvec dy = frand(e, -1, 1), d0 = frand(e, -1, 1), w0 = frand(g.c, -1, 1);
        fvec d1 = d0, d2 = d0, dw1 = w0, dw2 = w0, db1 = w0, db2 = w0;
        fvec scratch(ms_k_group_norm_scratch_floats(&g));
        gn_backward(g, d1.data(), dw1.data(), db1.data(), dy, x, w, mean, rstd);
        ms_k_group_norm_backward(&g, d2.data(), dw2.data(), db2.data(), scratch.data(), dy.data(),
                                 x.data(), w.data(), mean.data(), rstd.data());
        ok &= close("  dinp vs CPU (1e-6 + 1e-5 rel)", d1, d2, 1e-6, 1e-5);
        ok &= close("  dweight vs CPU (1e-4 + 1e-5 rel)", dw1, dw2, 1e-4, 1e-5);
        ok &= close("  dbias vs CPU (1e-4 + 1e-5 rel)", db1, db2, 1e-4, 1e-5);
    }
    assert_true(ok);
}

static void test_group_norm_fd(void **state) {
    (void)state;
    const ms_k_gnorm g = {3, 6, 10, 2, 1e-5f};
    fvec x = frand(g.n * g.c * g.s, -2, 3), w = frand(g.c, 0.5, 1.5), b = frand(g.c, -0.5, 0.5);
    const fvec wo = frand(x.size(), -1, 1);
    fvec out, mean, rstd;
    auto loss = [&]() {
        gn_forward(g, out, mean, rstd, x, w, b);
        return dot_loss(wo, out);
    };
    loss();
    fvec dx(x.size(), 0.0f), dw(g.c, 0.0f), db(g.c, 0.0f);
    gn_backward(g, dx.data(), dw.data(), db.data(), wo, x, w, mean, rstd);
    bool ok = fd_check("group_norm dinp vs finite differences", x, dx, loss, 1e-2, 2e-3, 48);
    ok &= fd_check("group_norm dweight vs finite differences", w, dw, loss, 1e-2, 1e-3, 6);
    ok &= fd_check("group_norm dbias vs finite differences", b, db, loss, 1e-2, 1e-3, 6);
    assert_true(ok);
}

/* ---- resizing ---- */

static void resize_forward(const ms_k_resize &g, fvec &out, const fvec &x) {
    out.assign(g.planes * g.oh * g.ow, 0.0f);
    for (int64_t o = 0; o < (int64_t)out.size(); o++) ms_cu_resize_fwd(&g, out.data(), x.data(), o);
}
static void resize_backward(const ms_k_resize &g, fvec &dx, const fvec &dy) {
    for (int64_t i = 0; i < (int64_t)dx.size(); i++) ms_cu_resize_bwd(&g, dx.data(), dy.data(), i);
}

/* in -> out along a dim by a size (scale 0) or a scale, as the operator computes the step. */
static void resize_dim(int64_t in, int64_t size, float scale, int64_t *out, float *r) {
    *out = size ? size : (int64_t)floor((double)in * (double)scale);
    *r = size ? (float)in / (float)*out : (float)(1.0 / (double)scale);
}

static ms_k_resize resize_geom(bool linear, int64_t planes, int64_t h, int64_t w, int64_t oh,
                               int64_t ow, float sh, float sw) {
    ms_k_resize g = {planes, h, w, 0, 0, 1.0f, 1.0f, linear};
    resize_dim(h, oh, sh, &g.oh, &g.rh);
    resize_dim(w, ow, sw, &g.ow, &g.rw);
    return g;
}

static void test_resize(void **state) {
    (void)state;
    /* UNet's 2x upsampling (both modes), FPN-style sizes that do not divide, downscaling by a
     * scale, a 1-D speech feature map stretched by 1.6 and squeezed to a size, one dim copied */
    const ms_k_resize cases[] = {
        resize_geom(false, 4 * 32, 28, 28, 0, 0, 2, 2),
        resize_geom(true, 4 * 32, 28, 28, 0, 0, 2, 2),
        resize_geom(true, 2 * 64, 25, 19, 45, 37, 0, 0),
        resize_geom(false, 2 * 64, 25, 19, 45, 37, 0, 0),
        resize_geom(true, 2 * 64, 40, 30, 0, 0, 0.7f, 0.45f),
        resize_geom(false, 2 * 64, 40, 30, 0, 0, 0.7f, 0.45f),
        resize_geom(true, 8 * 80, 1, 100, 1, 0, 1, 1.6f),
        resize_geom(false, 8 * 80, 1, 100, 1, 77, 0, 0),
        resize_geom(true, 2 * 16, 12, 20, 12, 33, 0, 0),
    };
    bool ok = true;
    for (const ms_k_resize &g : cases) {
        const int64_t n_in = g.planes * g.h * g.w, n_out = g.planes * g.oh * g.ow;
        const fvec x = frand(n_in, -3, 3), dy = frand(n_out, -1, 1), d0 = frand(n_in, -1, 1);
        fvec got, want(n_out), d1 = d0, d2 = d0;
        resize_forward(g, got, x);
        ms_k_resize_forward(&g, want.data(), x.data());
        printf("%s [%lld, %lld] -> [%lld, %lld]\n", g.linear ? "linear" : "nearest", (long long)g.h,
               (long long)g.w, (long long)g.oh, (long long)g.ow);
        ok &= close("  forward (1e-7 + 1e-6 rel)", got, want, 1e-7, 1e-6);
        resize_backward(g, d1, dy);
        ms_k_resize_backward(&g, d2.data(), dy.data());
        ok &= close("  backward (1e-6 + 1e-6 rel)", d1, d2, 1e-6, 1e-6);
    }
    assert_true(ok);
}

static void test_resize_fd(void **state) {
    (void)state;
    bool ok = true;
    for (bool linear : {false, true}) {
        const ms_k_resize g = resize_geom(linear, 3, 5, 4, 0, 0, 1.7f, 0.6f);
        fvec x = frand(g.planes * g.h * g.w, -2, 2), out;
        const fvec w = frand(g.planes * g.oh * g.ow, -1, 1);
        auto loss = [&]() {
            resize_forward(g, out, x);
            return dot_loss(w, out);
        };
        loss();
        fvec dx(x.size(), 0.0f);
        resize_backward(g, dx, w);
        ok &= fd_check(linear ? "bilinear dinp vs finite differences"
                              : "nearest dinp vs finite differences",
                       x, dx, loss, 1e-2, 1e-3, 48);
    }
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool),       cmocka_unit_test(test_pool_fd),
        cmocka_unit_test(test_group_norm), cmocka_unit_test(test_group_norm_fd),
        cmocka_unit_test(test_resize),     cmocka_unit_test(test_resize_fd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_cuda_kernels.cu - the CUDA kernels of engine/kernels/cuda/cuda_kernels.h (the kernel
 * table's entries and the launchers its adapters hand scratch to) run on GPU 0 through a
 * kernel context, small and real shapes, against the CPU kernels of engine/kernels (those of
 * the LLaMA layers in layers.c among them; AdamW and the sum of squares of engine/optim); the
 * GEMMs in fp32 and bf16 against the CPU matmul; the convolution slots against conv.c's kernels.
 * tests/test_cuda_host.cu already checks the arithmetic on the CPU, so what this adds is the
 * launch configurations: grids, block reductions, shared-memory tiles, cuBLAS's operand order.
 * Tolerances are the host test's, widened where the device's expf/tanhf or cuBLAS's
 * summation order differs; column sums (dbias, dweight) are held to the summation bound of
 * tests/cuda_colsum_ref.cuh. Skips with 77 (and says why) without a usable GPU.
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

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "engine/kernels/cuda/cuda_kernels.h"
#include "engine/kernels/kctx_opts.h"
#include "engine/kernels/layers.h"
#include "tests/cuda_colsum_ref.cuh"
#include "tests/cuda_testkit.cuh"

/* engine/core/device.h and engine/kernels/backend.h use C11 atomics, which C++17 cannot
 * include: what this test calls of them. */
extern "C" {
typedef struct ms_device ms_device;
ms_status ms_device_cuda_create(int ordinal, ms_device **out, ms_error *err);
void ms_device_destroy(ms_device *dev);
ms_status ms_kctx_create_with(ms_device *dev, const ms_kctx_opts *opts, ms_kctx **out,
                              ms_error *err);
void ms_kctx_destroy(ms_kctx *kc);
}

typedef std::vector<uint16_t> hvec;

/* GPU 0 and two kernel contexts on it, for the whole run (main): kc runs bf16 attention on
 * the flash kernels where a call fits them, kc_rows always on the row kernels. */
static ms_device *gpu;
static ms_kctx *kc, *kc_rows;

/* ---- helpers ---- */

/* Device buffers live until the end of the test case. */
static std::vector<void *> allocs;
template <typename T> static T *dev(const std::vector<T> &h) {
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(T)), cudaSuccess);
    if (!h.empty())
        assert_int_equal(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
                         cudaSuccess);
    allocs.push_back(p);
    return (T *)p;
}
template <typename T> static std::vector<T> back(const T *d, size_t n) {
    std::vector<T> h(n);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    if (n)
        assert_int_equal(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost),
                         cudaSuccess);
    return h;
}
static int free_all(void **state) {
    (void)state;
    for (void *p : allocs) cudaFree(p);
    allocs.clear();
    return 0;
}

#define LAUNCH(call)                                                                               \
    do {                                                                                           \
        ms_error err_ = {};                                                                        \
        const ms_status st_ = (call);                                                              \
        if (st_ != MS_OK) printf("  %s: %s\n", #call, err_.msg);                                   \
        assert_int_equal(st_, MS_OK);                                                              \
    } while (0)
#define ERR (&err_)

/* A column reduction's scratch for [n, c] and `terms` sums (cuda_kernels.h). */
static float *colsum_scratch(int64_t n, int64_t c, int terms) {
    return dev(fvec((size_t)ms_cu_colsum_scratch_floats(n, c, terms)));
}

/* A column sum against the CPU kernel: both orders' roundings (colsum_units_cpu), one more
 * for the device's FMA contraction of a term into its sum. */
static double gpu_colsum_units(int64_t n) {
    return colsum_units_cpu(n) + 1;
}

/* ---- elementwise, embedding ---- */

static void test_elementwise(void **state) {
    (void)state;
    bool ok = true;
    for (int64_t c : {7, 768}) {
        const int64_t n = c == 7 ? 13 : 8 * 64, e = n * c;
        const fvec a = frand(e, -4, 4), b = frand(e, -2, 2), g = frand(e, -1, 1),
                   bias = frand(c, -1, 1);
        const fvec d0 = frand(e, -1, 1), db0 = frand(c, -1, 1);
        fvec want(e), w2 = d0, w3 = d0, wb = db0;
        float *da = dev(a), *dbb = dev(b), *dg = dev(g), *dbias = dev(bias), *out = dev(fvec(e));
        float *dd = dev(d0), *dd2 = dev(d0), *ddb = dev(db0);
        LAUNCH(ms_cu_add_forward(kc, out, da, dbb, e, ERR));
        ms_k_add_forward(want.data(), a.data(), b.data(), e);
        ok &= close("add forward", back(out, e), want, 0, 0);
        LAUNCH(ms_cu_mul_forward(kc, out, da, dbb, e, ERR));
        ms_k_mul_forward(want.data(), a.data(), b.data(), e);
        ok &= close("mul forward", back(out, e), want, 0, 0);
        LAUNCH(ms_cu_mul_backward(kc, dd, dd2, dg, da, dbb, e, ERR));
        ms_k_mul_backward(w2.data(), w3.data(), g.data(), a.data(), b.data(), e);
        ok &= close("mul backward da", back(dd, e), w2, 1e-7, 1e-6);
        ok &= close("mul backward db", back(dd2, e), w3, 1e-7, 1e-6);
        LAUNCH(ms_cu_add_backward(kc, dd, dd2, dg, e, ERR));
        ms_k_add_backward(w2.data(), w3.data(), g.data(), e);
        ok &= close("add backward", back(dd, e), w2, 1e-7, 1e-6);
        LAUNCH(ms_cu_scale_forward(kc, out, da, 0.37f, e, ERR));
        ms_k_scale_forward(want.data(), a.data(), 0.37f, e);
        ok &= close("scale forward", back(out, e), want, 0, 0);
        LAUNCH(ms_cu_scale_backward(kc, dd, dg, 0.37f, e, ERR));
        ms_k_scale_backward(w2.data(), g.data(), 0.37f, e);
        ok &= close("scale backward", back(dd, e), w2, 1e-7, 1e-6);
        LAUNCH(ms_cu_bias_add_forward(kc, out, da, dbias, n, c, ERR));
        ms_k_bias_add_forward(want.data(), a.data(), bias.data(), n, c);
        ok &= close("bias add forward", back(out, e), want, 0, 0);
        const fvec wb0 = wb;
        LAUNCH(ms_cu_bias_add_backward(kc, dd, ddb, colsum_scratch(n, c, 1), dg, n, c, 0u, ERR));
        ms_k_bias_add_backward(w2.data(), wb.data(), g.data(), n, c);
        ok &= close("bias add backward dinp", back(dd, e), w2, 1e-7, 1e-6);
        const colsum_want cw =
            colsum_reference(n, c, wb0, [&](int64_t r, int64_t j) { return g[r * c + j]; });
        ok &= close_colsum("bias add backward dbias (summation bound)", back(ddb, c), to_dvec(wb),
                           cw.mag, gpu_colsum_units(n));
        LAUNCH(ms_cu_gelu_forward(kc, out, da, e, ERR));
        ms_k_gelu_forward(want.data(), a.data(), e);
        ok &= close("gelu forward (device tanhf: 2e-6)", back(out, e), want, 2e-6, 2e-6);
        LAUNCH(ms_cu_gelu_backward(kc, dd, da, dg, e, ERR));
        ms_k_gelu_backward(w2.data(), a.data(), g.data(), e);
        ok &= close("gelu backward (2e-6)", back(dd, e), w2, 2e-6, 2e-6);
    }
    assert_true(ok);
}

static void test_elementwise_bf16(void **state) {
    (void)state;
    const int64_t n = 256, c = 768, e = n * c;
    const hvec a = to_bf16(frand(e, -4, 4)), b = to_bf16(frand(e, -2, 2)),
               g = to_bf16(frand(e, -1, 1));
    const hvec d0 = to_bf16(frand(e, -1, 1));
    const hvec bias16 = to_bf16(frand(c, -1, 1));
    const fvec af = widen(a), bf = widen(b), gf = widen(g), bias = widen(bias16);
    fvec want(e), dw = widen(d0);
    uint16_t *da = dev(a), *db = dev(b), *dg = dev(g), *out = dev(hvec(e)), *dd = dev(d0);
    uint16_t *dbias = dev(bias16);
    bool ok = true;
    LAUNCH(ms_cu_add_forward_bf16(kc, out, da, db, e, ERR));
    ms_k_add_forward(want.data(), af.data(), bf.data(), e);
    ok &= close("add forward bf16 (1 ulp)", widen(back(out, e)), want, 0, BF16_RTOL);
    LAUNCH(ms_cu_bias_add_forward_bf16(kc, out, da, dbias, n, c, ERR));
    ms_k_bias_add_forward(want.data(), af.data(), bias.data(), n, c);
    ok &= close("bias add forward bf16 (1 ulp)", widen(back(out, e)), want, 0, BF16_RTOL);
    LAUNCH(ms_cu_gelu_forward_bf16(kc, out, da, e, ERR));
    ms_k_gelu_forward(want.data(), af.data(), e);
    ok &= close("gelu forward bf16 (1 ulp)", widen(back(out, e)), want, 1e-6, BF16_RTOL);
    LAUNCH(ms_cu_gelu_backward_bf16(kc, dd, da, dg, e, ERR));
    ms_k_gelu_backward(dw.data(), af.data(), gf.data(), e);
    ok &= close("gelu backward bf16 (1 ulp)", widen(back(dd, e)), dw, 1e-6, BF16_RTOL);
    assert_true(ok);
}

static void test_embedding(void **state) {
    (void)state;
    const int64_t n = 4 * 64, c = 768, v = 1000, v0 = 300, vl = 400;
    std::vector<int32_t> ids(n);
    for (auto &id : ids) id = (int32_t)(urand() * 40) * 25;
    const fvec table = frand(vl * c, -1, 1), g = frand(n * c, -1, 1), d0 = frand(vl * c, -1, 1);
    fvec want(n * c), dw = d0;
    int32_t *did = dev(ids);
    float *dt = dev(table), *dg = dev(g), *out = dev(fvec(n * c)), *dd = dev(d0);
    LAUNCH(ms_cu_embedding_forward(kc, out, did, dt, n, c, v0, vl, ERR));
    ms_k_embedding_forward(want.data(), ids.data(), table.data(), n, c, v0, vl);
    bool ok = close("embedding forward, vocab slice", back(out, n * c), want, 0, 0);
    /* the backward is deterministic: two runs bit for bit alike and equal to the CPU kernel's
     * sequential order, repeated ids in shuffled positions (ids off the slice included) */
    const size_t sb = ms_cu_embedding_scratch_bytes(n, vl);
    void *scratch = dev(std::vector<char>(sb));
    float *dd2 = dev(d0);
    LAUNCH(ms_cu_embedding_backward(kc, dd, did, dg, n, c, v0, vl, scratch, sb, ERR));
    LAUNCH(ms_cu_embedding_backward(kc, dd2, did, dg, n, c, v0, vl, scratch, sb, ERR));
    ms_k_embedding_backward(dw.data(), ids.data(), g.data(), n, c, v0, vl);
    const fvec run1 = back(dd, vl * c);
    ok &= close("embedding backward, two runs (bitwise)", back(dd2, vl * c), run1, 0, 0);
    ok &= close("embedding backward == CPU (bitwise)", run1, dw, 0, 0);
    /* bf16: the CPU kernel on widened operands, rounded once */
    const hvec tb = to_bf16(table), gb = to_bf16(g), db0 = to_bf16(d0);
    const fvec tbf = widen(tb), gbf = widen(gb);
    uint16_t *ob = dev(hvec(n * c)), *ddb = dev(db0);
    LAUNCH(ms_cu_embedding_forward_bf16(kc, ob, did, dev(tb), n, c, v0, vl, ERR));
    ms_k_embedding_forward(want.data(), ids.data(), tbf.data(), n, c, v0, vl);
    ok &= close("embedding forward bf16 (exact)", widen(back(ob, n * c)), want, 0, 0);
    LAUNCH(ms_cu_embedding_backward_bf16(kc, ddb, did, dev(gb), n, c, v0, vl, scratch, sb, ERR));
    fvec dwb = widen(db0);
    ms_k_embedding_backward(dwb.data(), ids.data(), gbf.data(), n, c, v0, vl);
    ok &= close("embedding backward bf16 == CPU rounded once", widen(back(ddb, vl * c)),
                widen(to_bf16(dwb)), 0, 0);
    /* too little scratch is refused, named */
    ms_error e = {};
    assert_int_not_equal(
        ms_cu_embedding_backward(kc, dd, did, dg, n, c, v0, vl, scratch, sb - 1, &e), MS_OK);
    (void)v;
    assert_true(ok);
}

/* ---- LayerNorm, softmax ---- */

static void test_layernorm(void **state) {
    (void)state;
    bool ok = true;
    for (int64_t c : {50, 768}) {
        const int64_t n = c == 50 ? 3 : 256, e = n * c;
        const fvec x = frand(e, -2, 3), w = frand(c, 0.5, 1.5), b = frand(c, -0.5, 0.5),
                   g = frand(e, -1, 1);
        const fvec d0 = frand(e, -1, 1), dw0 = frand(c, -1, 1), db0 = frand(c, -1, 1);
        fvec out(e), mean(n), rstd(n), dx = d0, dw = dw0, db = db0;
        ms_k_layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                               n, c, 1e-5f);
        ms_k_layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(),
                                mean.data(), rstd.data(), n, c);
        float *dxin = dev(x), *dwt = dev(w), *dbs = dev(b), *dgo = dev(g), *dout = dev(fvec(e));
        float *dmean = dev(fvec(n)), *drstd = dev(fvec(n)), *ddx = dev(d0), *ddw = dev(dw0),
              *ddb = dev(db0);
        LAUNCH(ms_cu_layernorm_forward(kc, dout, dmean, drstd, dxin, dwt, dbs, n, c, 1e-5f, ERR));
        ok &= close("layernorm out", back(dout, e), out, 2e-5, 2e-5);
        ok &= close("layernorm mean", back(dmean, n), mean, 1e-6, 2e-6);
        ok &= close("layernorm rstd", back(drstd, n), rstd, 0, 1e-5);
        /* the backward from the CPU's statistics, so that both add the same terms */
        LAUNCH(ms_cu_layernorm_backward(kc, ddx, ddw, ddb, colsum_scratch(n, c, 2), dgo, dxin, dwt,
                                        dev(mean), dev(rstd), n, c, ERR));
        ok &= close("layernorm dinp", back(ddx, e), dx, 1e-5, 1e-5);
        const colsum_want ww = colsum_reference(n, c, dw0, [&](int64_t r, int64_t j) {
            return (x[r * c + j] - mean[r]) * rstd[r] * g[r * c + j];
        });
        const colsum_want wb =
            colsum_reference(n, c, db0, [&](int64_t r, int64_t j) { return g[r * c + j]; });
        ok &= close_colsum("layernorm dweight (summation bound)", back(ddw, c), to_dvec(dw), ww.mag,
                           gpu_colsum_units(n));
        ok &= close_colsum("layernorm dbias (summation bound)", back(ddb, c), to_dvec(db), wb.mag,
                           gpu_colsum_units(n));
        const hvec x16 = to_bf16(x), w16 = to_bf16(w), b16 = to_bf16(b);
        const fvec x16f = widen(x16), w16f = widen(w16), b16f = widen(b16);
        uint16_t *dx16 = dev(x16), *dout16 = dev(hvec(e)), *dw16 = dev(w16), *db16 = dev(b16);
        ms_k_layernorm_forward(out.data(), mean.data(), rstd.data(), x16f.data(), w16f.data(),
                               b16f.data(), n, c, 1e-5f);
        LAUNCH(ms_cu_layernorm_forward_bf16(kc, dout16, dmean, drstd, dx16, dw16, db16, n, c, 1e-5f,
                                            ERR));
        ok &= close("layernorm out bf16 (1 ulp)", widen(back(dout16, e)), out, 1e-5, 1.0 / 128);
    }
    assert_true(ok);
}

static void test_softmax(void **state) {
    (void)state;
    bool ok = true;
    for (int64_t c : {5, 256, 1000}) {
        const int64_t n = 64, e = n * c;
        const fvec x = frand(e, -8, 8), g = frand(e, -1, 1), d0 = frand(e, -1, 1);
        fvec y(e), dx = d0;
        ms_k_softmax_forward(y.data(), x.data(), n, c);
        ms_k_softmax_backward(dx.data(), g.data(), y.data(), n, c);
        float *dxin = dev(x), *dy = dev(fvec(e)), *dg = dev(g), *ddx = dev(d0);
        LAUNCH(ms_cu_softmax_forward(kc, dy, dxin, n, c, ERR));
        ok &= close("softmax forward", back(dy, e), y, 1e-8, 1e-5);
        LAUNCH(ms_cu_softmax_backward(kc, ddx, dg, dy, n, c, ERR));
        ok &= close("softmax backward", back(ddx, e), dx, 1e-7, 1e-5);
    }
    assert_true(ok);
}

/* ---- cross-entropy ---- */

static void test_xent(void **state) {
    (void)state;
    const int64_t n = 16, v = 50257, v0 = 20000, vl = 12345;
    const fvec logits = frand(n * v, -6, 6), dl = frand(n, 0.1, 1);
    std::vector<int32_t> t(n);
    for (auto &x : t) x = (int32_t)(urand() * (double)v);
    t[1] = -1;
    t[2] = v0 + 7; /* a target inside the slice */
    /* the engine's cross-entropy is the vocab-parallel pieces, on one rank too */
    float *dlog = dev(logits), *ddl = dev(dl);
    int32_t *dt = dev(t);
    bool ok = true;
    /* One vocab slice: its partials against the CPU's pieces. */
    fvec sub(n * vl);
    for (int64_t r = 0; r < n; r++)
        std::copy_n(logits.data() + r * v + v0, vl, sub.data() + r * vl);
    fvec lm(n), ls(n), lt(n), gmax(n), gsum(n), vpl(n), ds0 = frand(n * vl, -1e-4, 1e-4), ds = ds0;
    ms_k_xent_vp_forward_local(vpl.data(), gmax.data(), gsum.data(), logits.data(), t.data(), n, v);
    ms_k_xent_vp_rowmax(lm.data(), sub.data(), n, vl);
    ms_k_xent_vp_sumexp(ls.data(), sub.data(), gmax.data(), n, vl);
    ms_k_xent_vp_target(lt.data(), sub.data(), t.data(), n, vl, v0);
    ms_k_xent_vp_backward(ds.data(), sub.data(), gmax.data(), gsum.data(), t.data(), dl.data(), n,
                          vl, v0);
    float *dsub = dev(sub), *o1 = dev(fvec(n)), *dgmax = dev(gmax), *dgsum = dev(gsum),
          *dds = dev(ds0);
    LAUNCH(ms_cu_xent_vp_rowmax(kc, o1, dsub, n, vl, ERR));
    ok &= close("xent slice max", back(o1, n), lm, 0, 0);
    LAUNCH(ms_cu_xent_vp_sumexp(kc, o1, dsub, dgmax, n, vl, ERR));
    ok &= close("xent slice sum of exp", back(o1, n), ls, 1e-30, 3e-5);
    LAUNCH(ms_cu_xent_vp_target(kc, o1, dsub, dt, n, vl, v0, ERR));
    ok &= close("xent slice target", back(o1, n), lt, 0, 0);
    LAUNCH(ms_cu_xent_vp_backward(kc, dds, dsub, dgmax, dgsum, dt, ddl, n, vl, v0, 0u, ERR));
    ok &= close("xent slice backward", back(dds, n * vl), ds, 3e-8, 1e-5);
    /* fresh: written whole over NaNs (ignored rows as zeros), the gradient alone */
    fvec alone = fvec(n * vl, 0.0f);
    ms_k_xent_vp_backward(alone.data(), sub.data(), gmax.data(), gsum.data(), t.data(), dl.data(),
                          n, vl, v0);
    float *dfresh = dev(fvec(n * vl, NAN));
    LAUNCH(ms_cu_xent_vp_backward(kc, dfresh, dsub, dgmax, dgsum, dt, ddl, n, vl, v0, 1u, ERR));
    ok &= close("xent slice backward, fresh (over NaNs)", back(dfresh, n * vl), alone, 3e-8, 1e-5);
    /* The combine, from the whole-vocab partials (one slice). */
    float *dgt = dev(fvec(n));
    LAUNCH(ms_cu_xent_vp_target(kc, dgt, dlog, dt, n, v, 0, ERR));
    LAUNCH(ms_cu_xent_vp_loss(kc, o1, dgmax, dgsum, dgt, dt, n, ERR));
    ok &= close("xent vocab-parallel loss", back(o1, n), vpl, 1e-4, 1e-6);
    assert_true(ok);
}

/* ---- optimizer ---- */

static void test_optim(void **state) {
    (void)state;
    const int64_t n = 100003;
    const ms_adamw_opts o = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    const fvec p0 = frand(n, -1, 1), g = frand(n, -2, 2);
    fvec p = p0, m(n, 0.0f), v(n, 0.0f);
    float *dp = dev(p0), *dg = dev(g), *dm = dev(m), *dv = dev(v);
    bool ok = true;
    for (int64_t t = 1; t <= 2; t++) {
        ms_error e = {};
        assert_int_equal(
            ms_adamw_step_scaled(p.data(), g.data(), m.data(), v.data(), n, &o, t, 0.5f, &e),
            MS_OK);
        LAUNCH(ms_cu_adamw_step(kc, dp, dg, dm, dv, n, &o, t, 0.5f, ERR));
    }
    ok &= close("adamw p", back(dp, n), p, 1e-7, 1e-6);
    ok &= close("adamw m", back(dm, n), m, 1e-7, 1e-6);
    ok &= close("adamw v", back(dv, n), v, 1e-9, 1e-6);
    const hvec g16 = to_bf16(g);
    const fvec gw = widen(g16);
    uint16_t *dg16 = dev(g16), *dp16 = dev(hvec(n));
    ms_error e = {};
    assert_int_equal(ms_adamw_step(p.data(), gw.data(), m.data(), v.data(), n, &o, 3, &e), MS_OK);
    LAUNCH(ms_cu_adamw_step_master(kc, dp, dg16, dm, dv, dp16, n, &o, 3, 1.0f, ERR));
    const fvec pm = back(dp, n);
    ok &= close("adamw master p (bf16 gradient)", pm, p, 1e-7, 1e-6);
    ok &= close("adamw master bf16 copy = master rounded", widen(back(dp16, n)), widen(to_bf16(pm)),
                0, 0);
    /* A bad step is refused before anything is launched. */
    assert_int_equal(ms_cu_adamw_step(kc, dp, dg, dm, dv, n, &o, 0, 1.0f, &e), MS_ERR_INVALID);
    for (int64_t len : {1, 3 * 65536 + 12345}) {
        const fvec x = frand(len, -3, 3);
        float *dx = dev(x);
        double *dout = dev(std::vector<double>(1)),
               *scratch = dev(std::vector<double>(ms_cu_sumsq_scratch_doubles(len)));
        LAUNCH(ms_cu_sumsq(kc, dout, scratch, dx, len, ERR));
        const double got = back(dout, 1)[0], want = ms_sumsq_f32(x.data(), (size_t)len);
        printf("  sum of squares n=%lld rel err %.3g (tolerance 1e-12)\n", (long long)len,
               fabs(got - want) / want);
        ok &= fabs(got - want) <= 1e-12 * want;
    }
    /* AdamW over a list in one grid: every parameter's bits as its own launch gives them. */
    {
        const int64_t sizes[3] = {5000, 768, 3 * 4096 + 1};
        std::vector<ms_cu_adamw_item> items(3);
        std::vector<float *> ps(3), alone(3);
        for (int i = 0; i < 3; i++) {
            const fvec pi = frand(sizes[i], -1, 1), mi = frand(sizes[i], -0.1, 0.1),
                       vi = frand(sizes[i], 0, 0.1);
            const hvec gi = to_bf16(frand(sizes[i], -2, 2));
            uint16_t *lg = dev(gi);
            float *dgf = dev(widen(gi));
            ps[i] = dev(pi), alone[i] = dev(pi);
            float *m1 = dev(mi), *v1 = dev(vi), *m2 = dev(mi), *v2 = dev(vi);
            const bool bf = i != 1;
            items[i] = {ps[i], bf ? (const void *)lg : (const void *)dgf, m1, v1, sizes[i], 0, bf};
            if (bf)
                LAUNCH(ms_cu_adamw_step_master(kc, alone[i], lg, m2, v2, NULL, (size_t)sizes[i], &o,
                                               5, 0.5f, ERR));
            else
                LAUNCH(ms_cu_adamw_step(kc, alone[i], dgf, m2, v2, (size_t)sizes[i], &o, 5, 0.5f,
                                        ERR));
        }
        const int64_t chunks = ms_cu_adamw_list_plan(items.data(), 3);
        LAUNCH(ms_cu_adamw_list(kc, dev(items), 3, chunks, &o, 5, 0.5f, ERR));
        bool same = true;
        for (int i = 0; i < 3; i++) same &= back(ps[i], sizes[i]) == back(alone[i], sizes[i]);
        printf("  adamw over a list of 3: %s\n",
               same ? "the bits of each alone" : "DIFFERENT  FAIL");
        ok &= same;
    }
    /* Masters into their use copies in one grid: each tensor the bits of its own round. */
    {
        const int64_t sizes[4] = {3 * 8192 + 77, 768, 0, 8192};
        std::vector<ms_cu_cast_item> items(4);
        std::vector<uint16_t *> lists(4), alone(4);
        for (int i = 0; i < 4; i++) {
            const fvec x = frand(sizes[i] ? sizes[i] : 1, -1e3, 1e3);
            float *dx = dev(x);
            lists[i] = dev(std::vector<uint16_t>((size_t)sizes[i] + 1, 0xBEEF));
            alone[i] = dev(std::vector<uint16_t>((size_t)sizes[i] + 1, 0xBEEF));
            items[i] = {lists[i], dx, sizes[i], 0};
            LAUNCH(ms_cu_bf16_round(kc, alone[i], dx, sizes[i], ERR));
        }
        const int64_t chunks = ms_cu_cast_list_plan(items.data(), 4);
        LAUNCH(ms_cu_cast_list(kc, dev(items), 4, chunks, ERR));
        bool same = true;
        for (int i = 0; i < 4; i++)
            same &= back(lists[i], sizes[i] + 1) == back(alone[i], sizes[i] + 1);
        printf("  bf16 round over a list of 4: %s\n",
               same ? "the bits of each alone" : "DIFFERENT  FAIL");
        ok &= same;
    }
    /* The list of tensors in one grid: each sum has the bits of its own ms_cu_sumsq. */
    {
        const int64_t sizes[4] = {3 * 65536 + 12345, 768, 0, 65536};
        std::vector<ms_cu_sumsq_item> items(4);
        std::vector<double> alone(4);
        for (int i = 0; i < 4; i++) {
            const fvec x = frand(sizes[i] ? sizes[i] : 1, -3, 3);
            float *dx = dev(x);
            items[i] = {dx, sizes[i], 0, 0};
            double *d1 = dev(std::vector<double>(1)),
                   *s1 = dev(std::vector<double>(ms_cu_sumsq_scratch_doubles(sizes[i]) + 1));
            LAUNCH(ms_cu_sumsq(kc, d1, s1, dx, sizes[i], ERR));
            alone[i] = sizes[i] ? back(d1, 1)[0] : 0.0;
        }
        const int64_t chunks = ms_cu_sumsq_list_plan(items.data(), 4);
        ms_cu_sumsq_item *ditems = dev(items);
        double *dsums = dev(std::vector<double>(4)), *dscr = dev(std::vector<double>(chunks));
        LAUNCH(ms_cu_sumsq_list(kc, dsums, dscr, ditems, 4, chunks, ERR));
        const std::vector<double> sums = back(dsums, 4);
        const bool same = memcmp(sums.data(), alone.data(), sizeof(double) * 4) == 0;
        printf("  sums of squares of a list of 4: %s\n",
               same ? "the bits of each alone" : "DIFFERENT  FAIL");
        ok &= same;
    }
    assert_true(ok);
}

/* ---- attention ---- */

/* An additive key mask [B, T]: the last 7 (bi + 1) keys of item bi and every 11th key dropped. */
static fvec attention_mask(int64_t b, int64_t t) {
    fvec mask(b * t, 0.0f);
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t j = 0; j < t; j++)
            if (j >= t - 7 * (bi + 1) || (j % 11 == 5 && j > 0)) mask[bi * t + j] = -INFINITY;
    return mask;
}

static bool attention_case(int64_t b, int64_t t, int64_t c, int64_t nh, bool causal, bool masked) {
    const int64_t n = b * t * c, n3 = 3 * n;
    const fvec qkv = frand(n3, -1.5, 1.5), g = frand(n, -1, 1), d0 = frand(n3, -1, 1);
    const fvec mask = masked ? attention_mask(b, t) : fvec();
    fvec out(n), att(b * nh * t * t), dq = d0, scratch(ms_k_attention_scratch_floats(t));
    ms_k_attention_forward(out.data(), att.data(), NULL, qkv.data(), masked ? mask.data() : NULL, b,
                           t, c, nh, causal, NULL);
    ms_k_attention_backward(dq.data(), scratch.data(), g.data(), qkv.data(), att.data(), b, t, c,
                            nh, causal, NULL);
    float *dqkv_in = dev(qkv), *dout = dev(fvec(n)), *dg = dev(g);
    float *dsaved = dev(fvec(ms_cu_attention_saved_floats(b, t, c, nh)));
    float *ddq = dev(d0), *dmask = masked ? dev(mask) : NULL;
    float *dscr = dev(fvec(ms_cu_attention_scratch_floats(b, t, nh)));
    LAUNCH(ms_cu_attention_forward(kc, dout, dsaved, dqkv_in, dmask, b, t, c, nh, causal, ERR));
    char what[96];
    snprintf(what, sizeof what, "attention out B=%lld T=%lld C=%lld NH=%lld%s%s", (long long)b,
             (long long)t, (long long)c, (long long)nh, causal ? " causal" : "",
             masked ? " mask" : "");
    bool ok = close(what, back(dout, n), out, 1e-5, 1e-4);
    LAUNCH(ms_cu_attention_backward(kc, ddq, dscr, dg, dqkv_in, dsaved, dmask, b, t, c, nh, causal,
                                    0u, ERR));
    ok &= close("  dqkv", back(ddq, n3), dq, 1e-5, 1e-4);
    return ok;
}

static void test_attention(void **state) {
    (void)state;
    bool ok = attention_case(1, 5, 16, 2, true, false); /* smaller than a tile */
    ok &= attention_case(2, 100, 768, 12, true, false);
    ok &= attention_case(2, 77, 768, 12, false, true);
    ok &= attention_case(2, 100, 384, 6, true, true);
    ok &= attention_case(1, 256, 768, 12, true, false);
    ok &= attention_case(1, 64, 256, 2, false, false); /* HS = 128 */
    float *p = dev(fvec(16));
    ms_error e = {};
    assert_int_equal(ms_cu_attention_forward(kc, p, p, p, NULL, 1, 1, 258, 1, true, &e),
                     MS_ERR_INVALID);
    printf("  refused: %s\n", e.msg);
    assert_true(ok);
}

/* ---- bf16 attention: the tensor-core flash kernels (flash.cu) where the call fits them, the
 * row kernels otherwise (and always on kc_rows), against the CPU's fp32 kernel on
 * the widened operands. Tolerances: the flash kernels round the probabilities and dS to bf16
 * before their second product (test_cuda_host_flash has the same bounds against a double
 * reference); each output is rounded once. The flash backward is run twice and must give the
 * same bits (one owner per output row: no atomics). ---- */

static double max_abs(const fvec &x) {
    double m = 0;
    for (float v : x) m = std::max(m, (double)fabsf(v));
    return m;
}

static bool attention_bf16_case(int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                                bool masked, bool rows) {
    const int64_t n = b * t * c, n3 = 3 * n;
    const hvec qkv = to_bf16(frand(n3, -1.5, 1.5)), g = to_bf16(frand(n, -1, 1)),
               d0 = to_bf16(frand(n3, -0.5, 0.5));
    const fvec mask = masked ? attention_mask(b, t) : fvec();
    const fvec qf = widen(qkv), gf = widen(g), d0f = widen(d0);
    fvec out(n), att(b * nh * t * t), dq = d0f, scratch(ms_k_attention_scratch_floats(t));
    ms_k_attention_forward(out.data(), att.data(), NULL, qf.data(), masked ? mask.data() : NULL, b,
                           t, c, nh, causal, NULL);
    ms_k_attention_backward(dq.data(), scratch.data(), gf.data(), qf.data(), att.data(), b, t, c,
                            nh, causal, NULL);
    fvec grad(n3);
    for (int64_t i = 0; i < n3; i++) grad[i] = dq[i] - d0f[i];
    ms_kctx *on = rows ? kc_rows : kc;
    uint16_t *dqkv = dev(qkv), *dout = dev(hvec(n)), *dg = dev(g), *ddq = dev(d0);
    float *dsaved = dev(fvec(ms_cu_attention_saved_floats(b, t, c, nh)));
    float *dmask = masked ? dev(mask) : NULL;
    float *dscr = dev(fvec(ms_cu_attention_scratch_floats(b, t, nh)));
    LAUNCH(ms_cu_attention_forward_bf16(on, dout, dsaved, dqkv, dmask, b, t, c, nh, causal, ERR));
    char what[128];
    snprintf(what, sizeof what, "attention bf16 (%s) out B=%lld T=%lld C=%lld NH=%lld%s%s",
             rows ? "rows" : "flash", (long long)b, (long long)t, (long long)c, (long long)nh,
             causal ? " causal" : "", masked ? " mask" : "");
    bool ok = close(what, widen(back(dout, n)), out, 8e-3 * max_abs(out), BF16_RTOL);
    LAUNCH(ms_cu_attention_backward_bf16(on, ddq, dscr, dg, dqkv, dsaved, dmask, b, t, c, nh,
                                         causal, 0u, ERR));
    const hvec first = back(ddq, n3);
    fvec got(n3);
    for (int64_t i = 0; i < n3; i++) got[i] = ms_f32_from_bf16(first[i]) - d0f[i];
    ok &= close("  dqkv (what was added)", got, grad, 2e-2 * max_abs(grad), BF16_RTOL);
    uint16_t *ddq2 = dev(d0);
    LAUNCH(ms_cu_attention_backward_bf16(on, ddq2, dscr, dg, dqkv, dsaved, dmask, b, t, c, nh,
                                         causal, 0u, ERR));
    const bool same = back(ddq2, n3) == first;
    printf("  dqkv of a second backward: %s\n", same ? "the same bits" : "DIFFERENT  FAIL");
    /* fresh: dqkv written whole over NaNs, every element once: the gradient alone */
    uint16_t *dfresh = dev(to_bf16(fvec(n3, NAN)));
    LAUNCH(ms_cu_attention_backward_bf16(on, dfresh, dscr, dg, dqkv, dsaved, dmask, b, t, c, nh,
                                         causal, 1u, ERR));
    ok &= close("  dqkv fresh (over NaNs)", widen(back(dfresh, n3)), grad, 2e-2 * max_abs(grad),
                BF16_RTOL);
    return ok && same;
}

static void test_attention_bf16(void **state) {
    (void)state;
    bool ok = true;
    for (bool rows : {false, true}) {
        ok &= attention_bf16_case(2, 100, 768, 12, true, false, rows);
        ok &= attention_bf16_case(2, 77, 768, 12, false, true, rows);
        ok &= attention_bf16_case(1, 1024, 768, 12, true, false, rows);
        ok &= attention_bf16_case(1, 64, 256, 2, true, false, rows); /* HS 128: always rows */
    }
    assert_true(ok);
}

/* ---- the LLaMA layers ---- */

static void test_rmsnorm(void **state) {
    (void)state;
    bool ok = true;
    for (int64_t c : {7, 128, 4096}) {
        const int64_t n = c == 7 ? 13 : 4 * 128, e = n * c;
        const fvec x = frand(e, -3, 3), w = frand(c, 0.5, 1.5), g = frand(e, -1, 1);
        const fvec d0 = frand(e, -1, 1), dw0 = frand(c, -1, 1);
        fvec out(e), rstd(n), dx = d0, dw = dw0;
        ms_k_rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6f);
        ms_k_rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), n,
                              c);
        float *dxin = dev(x), *dwt = dev(w), *dg = dev(g), *dout = dev(fvec(e)),
              *drstd = dev(fvec(n)), *ddx = dev(d0), *ddw = dev(dw0);
        LAUNCH(ms_cu_rmsnorm_forward(kc, dout, drstd, dxin, dwt, n, c, 1e-6f, ERR));
        char what[64];
        snprintf(what, sizeof what, "rmsnorm out C=%lld", (long long)c);
        ok &= close(what, back(dout, e), out, 1e-6, 1e-5);
        ok &= close("  rstd", back(drstd, n), rstd, 0, 1e-5);
        /* the backward from the CPU's rstd, so that both add the same terms */
        LAUNCH(ms_cu_rmsnorm_backward(kc, ddx, ddw, colsum_scratch(n, c, 1), dg, dxin, dwt,
                                      dev(rstd), n, c, ERR));
        ok &= close("  dinp", back(ddx, e), dx, 1e-6, 1e-5);
        const colsum_want ww = colsum_reference(
            n, c, dw0, [&](int64_t r, int64_t j) { return g[r * c + j] * x[r * c + j] * rstd[r]; });
        ok &= close_colsum("  dweight (summation bound)", back(ddw, c), to_dvec(dw), ww.mag,
                           gpu_colsum_units(n));
    }
    assert_true(ok);
}

/* ---- the column reductions and the sum at GPT-2's sizes ---- */

/* Two launches give the same bits; the CPU kernel within the summation bound (plus the terms'
 * own difference where the device's tanhf makes them: each side's dinp from zero); a missing
 * scratch is refused by name. */
static void test_colsum(void **state) {
    (void)state;
    bool ok = true;
    { /* bias + GELU over the MLP's width, rows not a multiple of the chunk */
        const int64_t n = 2048 + 37, c = 3072, e = n * c;
        const fvec x = frand(e, -5, 5), b = frand(c, -1, 1), g = frand(e, -1, 1),
                   db0 = frand(c, -1, 1), zero(e, 0.0f);
        fvec dxc = zero, dbc = db0;
        ms_k_bias_gelu_backward(dxc.data(), dbc.data(), g.data(), x.data(), b.data(), n, c);
        float *px = dev(x), *pb = dev(b), *pg = dev(g), *scr = colsum_scratch(n, c, 1);
        float *pdx1 = dev(zero), *pdb1 = dev(db0), *pdx2 = dev(zero), *pdb2 = dev(db0);
        LAUNCH(ms_cu_bias_gelu_backward(kc, pdx1, pdb1, scr, pg, px, pb, n, c, 0u, ERR));
        LAUNCH(ms_cu_bias_gelu_backward(kc, pdx2, pdb2, scr, pg, px, pb, n, c, 0u, ERR));
        const fvec dx1 = back(pdx1, e), db1 = back(pdb1, c);
        ok &= same_floats("bias gelu backward: launched twice, dinp", dx1, back(pdx2, e));
        ok &= same_floats("bias gelu backward: launched twice, dbias", db1, back(pdb2, c));
        /* fresh (bit 0): dinp written over NaNs, the bits of adding to zeros */
        float *pdxf = dev(fvec(e, NAN)), *pdbf = dev(db0);
        LAUNCH(ms_cu_bias_gelu_backward(kc, pdxf, pdbf, scr, pg, px, pb, n, c, 1u, ERR));
        ok &= same_floats("bias gelu backward fresh: dinp over NaN", back(pdxf, e), dx1);
        ok &= same_floats("bias gelu backward fresh: dbias", back(pdbf, c), db1);
        ok &= close("bias gelu backward dinp (device tanhf: 2e-6)", dx1, dxc, 2e-6, 2e-6);
        const dvec tdiff = column_absdiff(dx1, dxc, n, c);
        const colsum_want w =
            colsum_reference(n, c, db0, [&](int64_t r, int64_t k) { return dxc[r * c + k]; });
        ok &= close_colsum("bias gelu backward dbias (summation bound + terms)", db1, to_dvec(dbc),
                           w.mag, gpu_colsum_units(n), 0, &tdiff);
        ms_error e2 = {};
        ok &= ms_cu_bias_gelu_backward(kc, pdx1, pdb1, NULL, pg, px, pb, n, c, 0u, &e2) ==
              MS_ERR_INVALID;
        printf("  no scratch: %s\n", e2.msg);
    }
    { /* bias + dropout + residual over B*T = 8192 rows of 768, p = 0.1 */
        const int64_t n = 8192, c = 768, e = n * c;
        const int64_t lshape[2] = {n, c}, gstart[2] = {0, 0};
        const ms_k_fused_dropout fd = {0.1f, 77, 3, {2, lshape, gstart, NULL, NULL}};
        const fvec g = frand(e, -1, 1), d0 = frand(e, -1, 1), r0 = frand(e, -1, 1),
                   db0 = frand(c, -1, 1);
        fvec dxc = d0, drc = r0, dbc = db0;
        ms_k_bias_dropout_add_backward(dxc.data(), dbc.data(), drc.data(), g.data(), c, &fd);
        float *pg = dev(g), *scr = colsum_scratch(n, c, 1);
        float *pdx1 = dev(d0), *pdr1 = dev(r0), *pdb1 = dev(db0);
        float *pdx2 = dev(d0), *pdr2 = dev(r0), *pdb2 = dev(db0);
        LAUNCH(ms_cu_bias_dropout_add_backward(kc, pdx1, pdb1, pdr1, scr, pg, c, &fd, 0u, ERR));
        LAUNCH(ms_cu_bias_dropout_add_backward(kc, pdx2, pdb2, pdr2, scr, pg, c, &fd, 0u, ERR));
        const fvec db1 = back(pdb1, c);
        /* fresh dinp and dres (bits 0 and 2) over NaNs: as added to zeros, dres = dout */
        fvec dxz(e, 0.0f), drz(e, 0.0f), dbz = db0;
        ms_k_bias_dropout_add_backward(dxz.data(), dbz.data(), drz.data(), g.data(), c, &fd);
        float *pdxf = dev(fvec(e, NAN)), *pdrf = dev(fvec(e, NAN)), *pdbf = dev(db0);
        LAUNCH(ms_cu_bias_dropout_add_backward(kc, pdxf, pdbf, pdrf, scr, pg, c, &fd, 5u, ERR));
        ok &= close("bias dropout add backward fresh dinp (over NaN)", back(pdxf, e), dxz, 1e-7,
                    1e-6);
        ok &= same_floats("bias dropout add backward fresh dres (over NaN) == dout", back(pdrf, e),
                          g);
        ok &= same_floats("bias dropout add backward fresh dbias", back(pdbf, c), db1);
        ok &= same_floats("bias dropout add backward: launched twice, dbias", db1, back(pdb2, c));
        ok &= close("bias dropout add backward dinp", back(pdx1, e), dxc, 1e-7, 1e-6);
        ok &= close("bias dropout add backward dres (exact)", back(pdr1, e), drc, 0, 0);
        const ms_cu_box box = ms_cu_box_make(2, lshape, gstart, NULL, 0, 0, 0);
        const float scale = 1.0f / (1.0f - fd.p);
        const colsum_want w = colsum_reference(n, c, db0, [&](int64_t r, int64_t k) {
            const int64_t i = r * c + k;
            return ms_cu_bda_keep(fd.p, 77, 3, box, i) ? g[i] * scale : 0.0f;
        });
        ok &= close_colsum("bias dropout add backward dbias (summation bound)", db1, to_dvec(dbc),
                           w.mag, gpu_colsum_units(n));
    }
    { /* bf16 bias add over 8192 rows: the CPU's result rounded, within the bound */
        const int64_t n = 8192, c = 768, e = n * c;
        const hvec g = to_bf16(frand(e, -1, 1)), db0 = to_bf16(frand(c, -1, 1));
        const fvec gf = widen(g);
        fvec dbc = widen(db0);
        ms_k_bias_add_backward(NULL, dbc.data(), gf.data(), n, c);
        uint16_t *pg = dev(g), *pdb = dev(db0);
        LAUNCH(ms_cu_bias_add_backward_bf16(kc, NULL, pdb, colsum_scratch(n, c, 1), pg, n, c, 0u,
                                            ERR));
        const colsum_want w =
            colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t j) { return gf[r * c + j]; });
        ok &=
            close_colsum("bias add backward bf16 dbias (1 ulp + summation bound)",
                         widen(back(pdb, c)), to_dvec(dbc), w.mag, gpu_colsum_units(n), BF16_RTOL);
    }
    { /* GPT-2's loss mean: one output of 8192 terms, a block of lanes */
        const int64_t d = 8192;
        const fvec x = frand(d, 0, 11);
        fvec cpu(1);
        ms_k_sum_forward(cpu.data(), x.data(), 1, d, 1);
        float *px = dev(x), *po1 = dev(fvec(1)), *po2 = dev(fvec(1));
        LAUNCH(ms_cu_sum_forward(kc, po1, px, 1, d, 1, ERR));
        LAUNCH(ms_cu_sum_forward(kc, po2, px, 1, d, 1, ERR));
        const fvec s1 = back(po1, 1);
        ok &= same_floats("sum forward o=1 d=8192: launched twice", s1, back(po2, 1));
        double mag = 0;
        for (float v : x) mag += fabs((double)v);
        /* a lane's 32 terms, the tree's 8 levels, and the CPU's d */
        ok &= close_colsum("sum forward o=1 d=8192 (summation bound)", s1, to_dvec(cpu),
                           dvec(1, mag), 32 + 8 + 1 + (double)d);
    }
    assert_true(ok);
}

static void test_swiglu_rotary(void **state) {
    (void)state;
    const int64_t e = 4 * 128 * 352;
    const fvec gate = frand(e, -6, 6), up = frand(e, -2, 2), g = frand(e, -1, 1);
    const fvec d0 = frand(e, -1, 1), d1 = frand(e, -1, 1);
    fvec out(e), dg = d0, du = d1;
    ms_k_swiglu_forward(out.data(), gate.data(), up.data(), e);
    ms_k_swiglu_backward(dg.data(), du.data(), g.data(), gate.data(), up.data(), e);
    float *dgate = dev(gate), *dup = dev(up), *dgr = dev(g), *dout = dev(fvec(e));
    float *ddg = dev(d0), *ddu = dev(d1);
    LAUNCH(ms_cu_swiglu_forward(kc, dout, dgate, dup, e, ERR));
    bool ok = close("swiglu forward (device expf: 2e-6)", back(dout, e), out, 1e-6, 2e-6);
    LAUNCH(ms_cu_swiglu_backward(kc, ddg, ddu, dgr, dgate, dup, e, ERR));
    ok &= close("swiglu dgate", back(ddg, e), dg, 2e-6, 1e-5);
    ok &= close("swiglu dup", back(ddu, e), du, 2e-6, 1e-5);
    /* rotary: a sequence shard from position 4000 */
    const int64_t b = 2, t = 128, h = 6, d = 64, half = d / 2, t0 = 4000, n = b * t * h * d;
    fvec cs(t * half), sn(t * half);
    ms_k_rotary_tables(cs.data(), sn.data(), t, t0, d, 10000.0f);
    float *dcs = dev(fvec(t * half)), *dsn = dev(fvec(t * half));
    LAUNCH(ms_cu_rotary_tables(kc, dcs, dsn, t, t0, d, 10000.0f, ERR));
    ok &= close("rotary cos table (device sincosf: 1e-6)", back(dcs, t * half), cs, 1e-6, 0);
    ok &= close("rotary sin table (device sincosf: 1e-6)", back(dsn, t * half), sn, 1e-6, 0);
    const fvec x = frand(n, -2, 2), r0 = frand(n, -1, 1);
    fvec rx(n), rb = r0;
    ms_k_rotary_apply(rx.data(), x.data(), cs.data(), sn.data(), b, t, h, d, false);
    ms_k_rotary_apply(rb.data(), x.data(), cs.data(), sn.data(), b, t, h, d, true);
    float *dx = dev(x), *drx = dev(fvec(n)), *drb = dev(r0), *hcs = dev(cs), *hsn = dev(sn);
    LAUNCH(ms_cu_rotary_apply(kc, drx, dx, hcs, hsn, b, t, h, d, false, ERR));
    LAUNCH(ms_cu_rotary_apply(kc, drb, dx, hcs, hsn, b, t, h, d, true, ERR));
    ok &= close("rotary forward", back(drx, n), rx, 1e-6, 1e-6);
    ok &= close("rotary backward", back(drb, n), rb, 1e-6, 1e-6);
    assert_true(ok);
}

/* q [B, Tq, H, D], packed kv [B, Tk, 2, Hkv, D]; queries from q_start; mask of keep flags. */
static bool gqa_case(int64_t b, int64_t tq, int64_t tk, int64_t q_start, int64_t h, int64_t hkv,
                     int64_t d, bool causal, bool masked) {
    const ms_k_gqa g = {b, tq, tk, h, hkv, d, h * d, 2 * hkv * d, h * d, q_start, causal};
    const int64_t nq = b * tq * h * d, nkv = b * tk * 2 * hkv * d;
    const fvec q = frand(nq, -1.5, 1.5), kv = frand(nkv, -1.5, 1.5), dout = frand(nq, -1, 1);
    const fvec dq0 = frand(nq, -1, 1), dkv0 = frand(nkv, -1, 1);
    fvec mask;
    if (masked) {
        mask.assign(b * tk, 1.0f);
        for (int64_t bi = 0; bi < b; bi++)
            for (int64_t j = 0; j < tk; j++)
                if (j >= tk - 5 * (bi + 1) || j % 13 == 6) mask[bi * tk + j] = 0.0f;
    }
    const float *m = masked ? mask.data() : NULL;
    fvec out(nq), att(b * h * tq * tk), dq = dq0, dkv = dkv0, scratch(ms_k_gqa_scratch_floats(&g));
    ms_k_gqa_forward(&g, out.data(), att.data(), q.data(), kv.data(), kv.data() + hkv * d, m);
    ms_k_gqa_backward(&g, dq.data(), dkv.data(), dkv.data() + hkv * d, scratch.data(), dout.data(),
                      q.data(), kv.data(), kv.data() + hkv * d, att.data());
    float *dqin = dev(q), *dkv_in = dev(kv), *dgo = dev(dout), *dmask = masked ? dev(mask) : NULL;
    float *dout_ = dev(fvec(nq)), *dsaved = dev(fvec(ms_cu_gqa_saved_floats(&g)));
    float *ddq = dev(dq0), *ddkv = dev(dkv0), *dscr = dev(fvec(ms_cu_gqa_scratch_floats(&g)));
    LAUNCH(ms_cu_gqa_forward(kc, &g, dout_, dsaved, dqin, dkv_in, dkv_in + hkv * d, dmask, ERR));
    char what[112];
    snprintf(what, sizeof what,
             "gqa out B=%lld Tq=%lld Tk=%lld from %lld H=%lld Hkv=%lld D=%lld%s%s", (long long)b,
             (long long)tq, (long long)tk, (long long)q_start, (long long)h, (long long)hkv,
             (long long)d, causal ? " causal" : "", masked ? " mask" : "");
    bool ok = close(what, back(dout_, nq), out, 1e-5, 1e-4);
    LAUNCH(ms_cu_gqa_backward(kc, &g, ddq, ddkv, ddkv + hkv * d, dscr, dgo, dqin, dkv_in,
                              dkv_in + hkv * d, dsaved, dmask, ERR));
    ok &= close("  dq", back(ddq, nq), dq, 1e-5, 1e-4);
    ok &= close("  dk dv", back(ddkv, nkv), dkv, 1e-5, 1e-4);
    return ok;
}

static void test_gqa(void **state) {
    (void)state;
    bool ok = gqa_case(1, 5, 5, 0, 2, 1, 16, true, false); /* smaller than a tile */
    ok &= gqa_case(4, 64, 64, 0, 4, 2, 32, true, false);   /* LLaMA-tiny */
    ok &= gqa_case(2, 100, 100, 0, 8, 2, 64, true, true);
    ok &= gqa_case(2, 77, 77, 0, 6, 3, 64, false, true);
    ok &= gqa_case(1, 128, 128, 0, 4, 1, 128, true, false); /* multi-query, D = 128 */
    ok &= gqa_case(2, 40, 100, 60, 4, 2, 64, true, false);  /* a sequence shard */
    float *p = dev(fvec(16));
    const ms_k_gqa bad = {1, 1, 1, 3, 2, 64, 192, 128, 192, 0, true};
    ms_error e = {};
    assert_int_equal(ms_cu_gqa_forward(kc, &bad, p, p, p, p, p, NULL, &e), MS_ERR_INVALID);
    printf("  refused: %s\n", e.msg);
    assert_true(ok);
}

/* ---- GEMM ---- */

static size_t a_elems(const ms_k_gemm &g) {
    return (size_t)(g.m * g.k * (g.bcast_a ? 1 : g.batch));
}
static size_t b_elems(const ms_k_gemm &g) {
    return (size_t)(g.k * g.n * (g.bcast_b ? 1 : g.batch));
}

static bool gemm_case(ms_k_gemm g, bool bf16) {
    const size_t na = a_elems(g), nb = b_elems(g), nc = (size_t)(g.batch * g.m * g.n);
    fvec a = frand(na, -1, 1), b = frand(nb, -1, 1), dc = frand(nc, -1, 1), c0 = frand(nc, -1, 1);
    if (bf16) a = widen(to_bf16(a)), b = widen(to_bf16(b)), dc = widen(to_bf16(dc));
    fvec c = c0, da = frand(na, -1, 1), db = frand(nb, -1, 1);
    const fvec da0 = da, db0 = db;
    ms_k_matmul_forward(&g, c.data(), a.data(), b.data(), 0.5f, 1.0f);
    ms_k_matmul_backward(&g, da.data(), db.data(), dc.data(), a.data(), b.data(), 0.5f, true);
    const ms_cu_dtype in = bf16 ? MS_CU_BF16 : MS_CU_F32;
    const void *pa = bf16 ? (void *)dev(to_bf16(a)) : (void *)dev(a);
    const void *pb = bf16 ? (void *)dev(to_bf16(b)) : (void *)dev(b);
    const void *pdc = bf16 ? (void *)dev(to_bf16(dc)) : (void *)dev(dc);
    float *pc = dev(c0), *pda = dev(da0), *pdb = dev(db0);
    LAUNCH(ms_cu_gemm_forward(kc, &g, pc, MS_CU_F32, pa, pb, in, 0.5f, 1.0f, ERR));
    LAUNCH(ms_cu_gemm_backward(kc, &g, pda, pdb, MS_CU_F32, pdc, pa, pb, in, 0.5f, true, ERR));
    char what[128];
    snprintf(what, sizeof what, "%s gemm batch %lld %lldx%lldx%lld%s%s%s%s", bf16 ? "bf16" : "fp32",
             (long long)g.batch, (long long)g.m, (long long)g.n, (long long)g.k,
             g.trans_a ? " ta" : "", g.trans_b ? " tb" : "", g.bcast_a ? " bcast_a" : "",
             g.bcast_b ? " bcast_b" : "");
    /* fp32: cuBLAS sums k products in another order (and may use TF32 only if asked: it is
     * not); 1e-5 of sqrt(k) unit-sized terms. bf16 inputs are exact in fp32, so the same. */
    const double tol = 2e-6 * sqrt((double)std::max(g.k, std::max(g.m, g.n)) * (double)g.batch);
    bool ok = close(what, back(pc, nc), c, tol, 1e-5);
    ok &= close("  da", back(pda, na), da, tol, 1e-5);
    ok &= close("  db", back(pdb, nb), db, tol, 1e-5);
    if (!bf16) return ok;
    /* bf16 output: the fp32 product rounded. */
    uint16_t *pc16 = dev(hvec(nc));
    fvec cw(nc);
    ms_k_matmul_forward(&g, cw.data(), a.data(), b.data(), 1.0f, 0.0f);
    LAUNCH(ms_cu_gemm_forward(kc, &g, pc16, MS_CU_BF16, pa, pb, in, 1.0f, 0.0f, ERR));
    ok &= close("  bf16 output (1 ulp)", widen(back(pc16, nc)), cw, tol, 1.0 / 128);
    return ok;
}

static void test_gemm(void **state) {
    (void)state;
    bool ok = true;
    for (bool bf16 : {false, true}) {
        ok &= gemm_case(ms_k_gemm{1, 3, 5, 7, false, false, false, false}, bf16);
        ok &= gemm_case(ms_k_gemm{1, 512, 2304, 768, false, false, false, true}, bf16); /* c_attn */
        ok &= gemm_case(ms_k_gemm{4, 64, 768, 96, false, true, false, true}, bf16);
        ok &= gemm_case(ms_k_gemm{3, 33, 17, 65, true, false, true, false}, bf16);
        ok &= gemm_case(ms_k_gemm{5, 40, 24, 16, true, true, false, false}, bf16);
    }
    assert_true(ok);
}

/* ---- convolution (conv.cu): the slots against conv.c's kernels, fresh gradients included ---- */

static bool conv_gpu_case(const char *name, const ms_k_conv &g, bool bias) {
    const int64_t cout = g.groups * g.cout_g, k = g.cin_g * g.kh * g.kw, ohw = g.oh * g.ow;
    const fvec x = frand(g.n * g.c_x * g.h * g.w, -1, 1), w = frand(cout * k, -1, 1);
    const fvec b = frand(cout, -1, 1), dy = frand(g.n * cout * ohw, -1, 1);
    fvec y(dy.size()), col(ms_k_conv_scratch_floats(&g) + 1);
    ms_k_conv_forward(&g, y.data(), col.data(), x.data(), w.data(), bias ? b.data() : NULL);
    float *dcol = dev(fvec(ms_cu_conv_scratch_floats(&g) + 1)), *dy_d = dev(dy);
    const float *x_d = dev(x), *w_d = dev(w), *b_d = bias ? dev(b) : NULL;
    float *y_d = dev(fvec(y.size()));
    LAUNCH(ms_cu_conv_forward(kc, &g, y_d, dcol, x_d, w_d, b_d, ERR));
    char what[128];
    snprintf(what, sizeof what, "conv %s forward vs CPU", name);
    bool ok = close(what, back(y_d, y.size()), y, 1e-5, 1e-4);
    const fvec dx0 = frand(x.size(), -1, 1), dw0 = frand(w.size(), -1, 1), db0 = frand(cout, -1, 1);
    for (unsigned fresh : {0u, 7u}) {
        fvec dx = fresh ? fvec(x.size()) : dx0, dw = fresh ? fvec(w.size()) : dw0;
        fvec db = fresh ? fvec(cout) : db0;
        ms_k_conv_backward(&g, dx.data(), dw.data(), bias ? db.data() : NULL, col.data(), dy.data(),
                           x.data(), w.data(), false);
        const fvec nan_x(x.size(), NAN), nan_w(w.size(), NAN), nan_b(cout, NAN);
        float *dx_d = dev(fresh ? nan_x : dx0), *dw_d = dev(fresh ? nan_w : dw0);
        float *db_d = dev(fresh ? nan_b : db0);
        LAUNCH(ms_cu_conv_backward(kc, &g, dx_d, dw_d, bias ? db_d : NULL, dcol, dy_d, x_d, w_d,
                                   fresh, ERR));
        const double sums = (double)(g.n * ohw);
        snprintf(what, sizeof what, "conv %s dx%s vs CPU", name, fresh ? " (fresh)" : "");
        ok &= close(what, back(dx_d, dx.size()), dx, 1e-5, 1e-4);
        snprintf(what, sizeof what, "conv %s dw%s vs CPU", name, fresh ? " (fresh)" : "");
        ok &= close(what, back(dw_d, dw.size()), dw, 1e-6 * sums, 1e-4);
        if (bias) {
            snprintf(what, sizeof what, "conv %s dbias%s vs CPU", name, fresh ? " (fresh)" : "");
            ok &= close(what, back(db_d, db.size()), db, 1e-6 * sums, 1e-4);
        }
    }
    return ok;
}

static ms_k_conv conv_geometry(int64_t n, int64_t c_x, int64_t c0, int64_t groups, int64_t cin_g,
                               int64_t cout_g, int64_t h, int64_t w, int64_t kh, int64_t kw,
                               int64_t s, int64_t p) {
    ms_k_conv g = {};
    g.n = n, g.c_x = c_x, g.c0 = c0, g.groups = groups, g.cin_g = cin_g, g.cout_g = cout_g;
    g.h = h, g.w = w, g.kh = kh, g.kw = kw, g.sh = g.sw = s, g.ph = g.pw = p, g.dh = g.dw = 1;
    g.oh = ms_k_conv_out_size(h, kh, s, p, 1), g.ow = ms_k_conv_out_size(w, kw, s, p, 1);
    return g;
}

static void test_conv(void **state) {
    (void)state;
    bool ok = true;
    ok &=
        conv_gpu_case("3x3 64 -> 64", conv_geometry(4, 64, 0, 1, 64, 64, 28, 28, 3, 3, 1, 1), true);
    ok &= conv_gpu_case("stem 7x7 s2", conv_geometry(2, 3, 0, 1, 3, 64, 64, 64, 7, 7, 2, 3), false);
    ok &= conv_gpu_case("depthwise 3x3 s2 from channel 8",
                        conv_geometry(2, 40, 8, 32, 1, 1, 16, 16, 3, 3, 2, 1), true);
    ok &= conv_gpu_case("pointwise groups 2",
                        conv_geometry(2, 32, 0, 2, 16, 24, 14, 14, 1, 1, 1, 0), true);
    assert_true(ok);
}

int main(void) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("SKIP: no usable CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
        return 77;
    }
    ms_error err = {};
    ms_kctx_opts flash = {MS_KATTENTION_FASTEST}, rows = {MS_KATTENTION_ROWS};
    if (ms_device_cuda_create(0, &gpu, &err) != MS_OK ||
        ms_kctx_create_with(gpu, &flash, &kc, &err) != MS_OK ||
        ms_kctx_create_with(gpu, &rows, &kc_rows, &err) != MS_OK) {
        printf("FAIL: kernel contexts on GPU 0: %s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_elementwise, free_all),
        cmocka_unit_test_teardown(test_elementwise_bf16, free_all),
        cmocka_unit_test_teardown(test_embedding, free_all),
        cmocka_unit_test_teardown(test_layernorm, free_all),
        cmocka_unit_test_teardown(test_softmax, free_all),
        cmocka_unit_test_teardown(test_xent, free_all),
        cmocka_unit_test_teardown(test_optim, free_all),
        cmocka_unit_test_teardown(test_attention, free_all),
        cmocka_unit_test_teardown(test_attention_bf16, free_all),
        cmocka_unit_test_teardown(test_rmsnorm, free_all),
        cmocka_unit_test_teardown(test_colsum, free_all),
        cmocka_unit_test_teardown(test_swiglu_rotary, free_all),
        cmocka_unit_test_teardown(test_gqa, free_all),
        cmocka_unit_test_teardown(test_gemm, free_all),
        cmocka_unit_test_teardown(test_conv, free_all),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    ms_kctx_destroy(kc);
    ms_kctx_destroy(kc_rows);
    ms_device_destroy(gpu);
    return failed;
}

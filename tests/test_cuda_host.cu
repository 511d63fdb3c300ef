/* test_cuda_host.cu - the arithmetic of every CUDA kernel, run on the CPU (no GPU, no CUDA
 * runtime call): the __host__ __device__ row and element functions of engine/kernels/cuda/
 * are assembled over whole tensors with the lanes and tiles the kernels use, then compared
 *   - with the CPU kernels of engine/kernels and engine/optim on real shapes (GPT-2 small rows
 *     C = 768, the 50257 vocab whole and in uneven slices, T = 64..256, NH = 12; LLaMA rows
 *     C = 64..4096, grouped-query heads with T up to 128 and D up to 128), within the
 *     tolerances stated at each check (fp32: sums in another order, the device's expf/tanhf
 *     against the CPU's polynomials);
 *   - backwards also with central finite differences of the same functions, the loss
 *     L = sum(w * f(x)) summed in double, on small shapes;
 *   - bf16 variants with the fp32 result rounded to bf16 (one bf16 ulp), and the rounding
 *     itself bit for bit with engine/core/tensor.c over all 2^16 patterns and a sweep of fp32;
 *   - the column sums (dbias, the norms' dweight: colsum_math.cuh's two passes) within fp32
 *     summation bounds of float64 and of the CPU kernels, bit for bit with the documented chunk
 *     order and across thread orders (test_colsum, tests/cuda_colsum_ref.cuh);
 *   - convolution (test_conv): im2col and col2im bit for bit with engine/kernels/conv.c, and
 *     conv.cu's whole plan (the products' descriptors run by the CPU's matmul) against the CPU
 *     kernels on ResNet- and MobileNet-like layers.
 * Each check prints its worst error, so a drifting tolerance is visible in the log.
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

#include <algorithm>
#include <functional>
#include <vector>

#include "engine/kernels/cuda/attention_math.cuh"
#include "engine/kernels/cuda/conv_math.cuh"
#include "engine/kernels/cuda/cuda_kernels.h"
extern "C" { /* a C header without C++ guards */
#include "engine/core/philox.h"
}
#include "engine/kernels/cuda/dropout_math.cuh"
#include "engine/kernels/cuda/elementwise_math.cuh"
#include "engine/kernels/cuda/fused_math.cuh"
#include "engine/kernels/cuda/llama_math.cuh"
#include "engine/kernels/cuda/norm_math.cuh"
#include "engine/kernels/cuda/optim_math.cuh"
#include "engine/kernels/cuda/xent_math.cuh"
#include "tests/cuda_colsum_ref.cuh"
#include "tests/cuda_embedding_ref.cuh"
#include "tests/cuda_testkit.cuh"

#define L MS_CU_ROW_LANES

/* ---- helpers ---- */

/* The lane split of a row kernel: part(lane, nlanes) per lane, then the block's tree. */
static float lanes_sum(const std::function<float(int, int)> &part) {
    float v[L];
    for (int l = 0; l < L; l++) v[l] = part(l, L);
    return ms_cu_lanes_sum(v, L);
}
static float lanes_max(const std::function<float(int, int)> &part) {
    float v[L];
    for (int l = 0; l < L; l++) v[l] = part(l, L);
    return ms_cu_lanes_max(v, L);
}
static void lanes_each(const std::function<void(int, int)> &f) {
    for (int l = 0; l < L; l++) f(l, L);
}

/* ---- bf16 rounding ---- */

static void test_bf16_rounding(void **state) {
    (void)state;
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float w = ms_f32_from_bf16((uint16_t)h);
        bad += ms_cu_f32_bits(ms_cu_bf16_widen((uint16_t)h)) != ms_cu_f32_bits(w);
        bad += ms_cu_bf16_round(w) != ms_bf16_from_f32(w);
        /* The float just below, at and above the halfway point to the next pattern: the ties
         * to even and the carries into the exponent. */
        for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x0001u, 0xffffu}) {
            const float f = ms_cu_bits_f32((h << 16) | low);
            bad += ms_cu_bf16_round(f) != ms_bf16_from_f32(f);
        }
    }
    for (uint64_t u = 0; u < (1ull << 32); u += 65521) { /* a prime stride over all fp32 */
        const float f = ms_cu_bits_f32((uint32_t)u);
        bad += ms_cu_bf16_round(f) != ms_bf16_from_f32(f);
    }
    printf("  bf16 round/widen: %d mismatches over 2^16 patterns x 6 and 65537 fp32 values\n", bad);
    assert_int_equal(bad, 0);
}

/* ---- elementwise ---- */

static void test_elementwise(void **state) {
    (void)state;
    const int64_t n = 8 * 64, c = 768, e = n * c; /* B*T rows of GPT-2 small */
    fvec a = frand(e, -4, 4), b = frand(e, -2, 2), g = frand(e, -1, 1), bias = frand(c, -1, 1);
    bool ok = true;
    fvec got(e), want(e);
    for (int64_t i = 0; i < e; i++) ms_cu_add_fwd(got.data(), a.data(), b.data(), i);
    ms_k_add_forward(want.data(), a.data(), b.data(), e);
    ok &= close("add forward (exact)", got, want, 0, 0);
    for (int64_t i = 0; i < e; i++) ms_cu_mul_fwd(got.data(), a.data(), b.data(), i);
    ms_k_mul_forward(want.data(), a.data(), b.data(), e);
    ok &= close("mul forward (exact)", got, want, 0, 0);
    fvec d0 = frand(e, -1, 1), d1 = d0, d2 = d0, d3 = d0;
    for (int64_t i = 0; i < e; i++) ms_cu_mul_bwd(d1.data(), g.data(), b.data(), i);
    ms_k_mul_backward(d2.data(), NULL, g.data(), a.data(), b.data(), e);
    ok &= close("mul backward (FMA: 1e-7 + 1e-6 rel)", d1, d2, 1e-7, 1e-6);
    for (int64_t i = 0; i < e; i++) ms_cu_scale_fwd(got.data(), a.data(), 0.37f, i);
    ms_k_scale_forward(want.data(), a.data(), 0.37f, e);
    ok &= close("scale forward (exact)", got, want, 0, 0);
    d1 = d0, d2 = d0;
    for (int64_t i = 0; i < e; i++) ms_cu_scale_bwd(d1.data(), g.data(), 0.37f, i);
    ms_k_scale_backward(d2.data(), g.data(), 0.37f, e);
    ok &= close("scale backward (FMA: 1e-7 + 1e-6 rel)", d1, d2, 1e-7, 1e-6);
    for (int64_t i = 0; i < e; i++) ms_cu_bias_add_fwd(got.data(), a.data(), bias.data(), c, i);
    ms_k_bias_add_forward(want.data(), a.data(), bias.data(), n, c);
    ok &= close("bias add forward (exact)", got, want, 0, 0);
    d1 = d0, d2 = d0, d3 = d0;
    const fvec db0 = frand(c, -1, 1);
    fvec db1 = db0, db2 = db0;
    ok &= colsum_bias_add_bwd(d1.data(), db1.data(), g.data(), n, c, false);
    for (int64_t i = 0; i < e; i++) ms_cu_acc(d3.data(), g.data(), i); /* the path without dbias */
    ms_k_bias_add_backward(d2.data(), db2.data(), g.data(), n, c);
    ok &= close("bias add backward dinp (exact)", d1, d2, 0, 0);
    ok &= close("bias add backward dinp, no dbias (exact)", d3, d2, 0, 0);
    const colsum_want wb =
        colsum_reference(n, c, db0, [&](int64_t r, int64_t j) { return g[r * c + j]; });
    ok &= close_colsum("bias add backward dbias vs CPU (summation bound)", db1, to_dvec(db2),
                       wb.mag, colsum_units_cpu(n));
    for (int64_t i = 0; i < e; i++) ms_cu_gelu_fwd(got.data(), a.data(), i);
    ms_k_gelu_forward(want.data(), a.data(), e);
    ok &= close("gelu forward (tanhf vs poly: 1e-6 + 1e-6 rel)", got, want, 1e-6, 1e-6);
    d1 = d0, d2 = d0;
    for (int64_t i = 0; i < e; i++) ms_cu_gelu_bwd(d1.data(), a.data(), g.data(), i);
    ms_k_gelu_backward(d2.data(), a.data(), g.data(), e);
    ok &= close("gelu backward (1e-6 + 1e-6 rel)", d1, d2, 1e-6, 1e-6);
    assert_true(ok);
}

/* GELU and mul backwards against finite differences of their forwards. */
static void test_elementwise_fd(void **state) {
    (void)state;
    const int64_t n = 4096;
    fvec x = frand(n, -5, 5), w = frand(n, -1, 1), other = frand(n, -2, 2), y(n);
    fvec dx(n, 0.0f);
    for (int64_t i = 0; i < n; i++) ms_cu_gelu_bwd(dx.data(), x.data(), w.data(), i);
    auto gelu_loss = [&]() {
        for (int64_t i = 0; i < n; i++) ms_cu_gelu_fwd(y.data(), x.data(), i);
        return dot_loss(w, y);
    };
    bool ok = fd_check("gelu backward vs finite differences", x, dx, gelu_loss, 1e-2, 2e-4, 64);
    std::fill(dx.begin(), dx.end(), 0.0f);
    for (int64_t i = 0; i < n; i++) ms_cu_mul_bwd(dx.data(), w.data(), other.data(), i);
    auto mul_loss = [&]() {
        for (int64_t i = 0; i < n; i++) ms_cu_mul_fwd(y.data(), x.data(), other.data(), i);
        return dot_loss(w, y);
    };
    ok &= fd_check("mul backward vs finite differences", x, dx, mul_loss, 1e-2, 1e-4, 64);
    assert_true(ok);
}

static void test_elementwise_bf16(void **state) {
    (void)state;
    const int64_t n = 256, c = 768, e = n * c;
    std::vector<ms_bf16> a = to_bf16<ms_bf16>(frand(e, -4, 4)),
                         b = to_bf16<ms_bf16>(frand(e, -2, 2));
    std::vector<ms_bf16> g = to_bf16<ms_bf16>(frand(e, -1, 1)),
                         d = to_bf16<ms_bf16>(frand(e, -1, 1)), out(e);
    const fvec af = widen(a), bf = widen(b), gf = widen(g), bias = frand(c, -1, 1);
    fvec want(e), d32 = widen(d);
    bool ok = true;
    for (int64_t i = 0; i < e; i++) ms_cu_add_fwd(out.data(), a.data(), b.data(), i);
    ms_k_add_forward(want.data(), af.data(), bf.data(), e);
    ok &= close("add forward bf16 (1 ulp)", widen(out), want, 0, BF16_RTOL);
    for (int64_t i = 0; i < e; i++) ms_cu_bias_add_fwd(out.data(), a.data(), bias.data(), c, i);
    ms_k_bias_add_forward(want.data(), af.data(), bias.data(), n, c);
    ok &= close("bias add forward bf16 (1 ulp)", widen(out), want, 0, BF16_RTOL);
    for (int64_t i = 0; i < e; i++) ms_cu_gelu_fwd(out.data(), a.data(), i);
    ms_k_gelu_forward(want.data(), af.data(), e);
    ok &= close("gelu forward bf16 (1 ulp + 1e-6)", widen(out), want, 1e-6, BF16_RTOL);
    for (int64_t i = 0; i < e; i++) ms_cu_gelu_bwd(d.data(), a.data(), g.data(), i);
    ms_k_gelu_backward(d32.data(), af.data(), gf.data(), e);
    ok &= close("gelu backward bf16 (1 ulp + 1e-6)", widen(d), d32, 1e-6, BF16_RTOL);
    assert_true(ok);
}

static void test_embedding(void **state) {
    (void)state;
    const int64_t n = 4 * 64, c = 768, v = 1000;
    std::vector<int32_t> ids(n);
    for (auto &id : ids) id = (int32_t)(urand() * 40) * 25; /* repeats, some rows hit often */
    const fvec table = frand(v * c, -1, 1), g = frand(n * c, -1, 1);
    bool ok = true;
    for (int64_t v0 : {0, 300}) { /* whole table, then the slice [300, 700) of a sharded one */
        const int64_t vl = v0 ? 400 : v;
        fvec got(n * c, 9.0f), want(n * c);
        const float *tab = table.data() + v0 * c;
        for (int64_t i = 0; i < n * c; i++)
            ms_cu_embedding_fwd(got.data(), ids.data(), tab, c, v0, vl, i);
        ms_k_embedding_forward(want.data(), ids.data(), tab, n, c, v0, vl);
        ok &= close(v0 ? "embedding forward, vocab slice (exact)" : "embedding forward (exact)",
                    got, want, 0, 0);
        fvec d1 = frand(vl * c, -1, 1), d2 = d1;
        emb_sorted_backward(d1.data(), ids.data(), g.data(), n, c, v0, vl);
        ms_k_embedding_backward(d2.data(), ids.data(), g.data(), n, c, v0, vl);
        ok &= close(v0 ? "embedding backward, vocab slice (exact)" : "embedding backward (exact)",
                    d1, d2, 0, 0);
    }
    assert_true(ok);
}

/* ---- LayerNorm ---- */

/* The layernorm kernel's forward over all rows, lanes and tree as on the GPU. */
template <typename T>
static void ln_forward(T *out, float *mean, float *rstd, const T *inp, const float *w,
                       const float *b, int64_t n, int64_t c, float eps) {
    for (int64_t r = 0; r < n; r++) {
        const T *x = inp + r * c;
        const float m =
            lanes_sum([&](int l, int nl) { return ms_cu_row_sum_part(x, c, l, nl); }) / (float)c;
        const float sq =
            lanes_sum([&](int l, int nl) { return ms_cu_ln_sqdev_part(x, c, m, l, nl); });
        const float s = ms_cu_ln_rstd(sq, c, eps);
        lanes_each([&](int l, int nl) { ms_cu_ln_out_part(out + r * c, x, w, b, c, m, s, l, nl); });
        mean[r] = m, rstd[r] = s;
    }
}

static void ln_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int64_t n,
                        int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *x = inp + r * c;
        float pa[L], pb[L];
        for (int l = 0; l < L; l++)
            ms_cu_ln_bwd_part(&pa[l], &pb[l], g, x, w, c, mean[r], rstd[r], l, L);
        const float a = ms_cu_lanes_sum(pa, L), b = ms_cu_lanes_sum(pb, L);
        lanes_each([&](int l, int nl) {
            ms_cu_ln_dinp_part(dinp + r * c, g, x, w, c, mean[r], rstd[r], a, b, l, nl);
        });
    }
    assert_true(colsum_layernorm_bwd(dw, db, dout, inp, mean, rstd, n, c, false));
}

static void test_layernorm(void **state) {
    (void)state;
    const int64_t n = 4 * 64, c = 768;
    const float eps = 1e-5f;
    /* |mean| >> std in some rows: the two-pass variance must not cancel. */
    fvec x = frand(n * c, -1, 1), w = frand(c, 0.5, 1.5), b = frand(c, -0.5, 0.5);
    for (int64_t r = 0; r < n; r += 3)
        for (int64_t j = 0; j < c; j++) x[r * c + j] += 30.0f;
    fvec out(n * c), mean(n), rstd(n), out2(n * c), mean2(n), rstd2(n);
    ln_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c, eps);
    ms_k_layernorm_forward(out2.data(), mean2.data(), rstd2.data(), x.data(), w.data(), b.data(), n,
                           c, eps);
    /* The CPU sums a row of values near 30 in sequence, about 1e-6 relative off (3e-5
     * absolute), which rstd ~ 1.7 carries into out; the lane tree is closer to float64. */
    bool ok = close("layernorm mean vs CPU (1e-7 + 2e-6 rel)", mean, mean2, 1e-7, 2e-6);
    ok &= close("layernorm rstd vs CPU (1e-5 rel)", rstd, rstd2, 0, 1e-5);
    ok &= close("layernorm out vs CPU (1e-4 + 1e-5 rel)", out, out2, 1e-4, 1e-5);
    fvec mean64(n), out64(n * c);
    for (int64_t r = 0; r < n; r++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < c; j++) m += x[r * c + j];
        m /= (double)c;
        for (int64_t j = 0; j < c; j++) v += (x[r * c + j] - m) * (x[r * c + j] - m);
        const double s = 1.0 / sqrt(v / (double)c + eps);
        for (int64_t j = 0; j < c; j++)
            out64[r * c + j] = (float)((x[r * c + j] - m) * s * w[j] + b[j]);
        mean64[r] = (float)m;
    }
    ok &= close("layernorm mean vs float64 (1e-8 + 3e-7 rel: 2 ulps)", mean, mean64, 1e-8, 3e-7);
    ok &= close("layernorm out vs float64 (2e-5 + 1e-5 rel)", out, out64, 2e-5, 1e-5);
    const fvec g = frand(n * c, -1, 1), dw0 = frand(c, -1, 1), db0 = frand(c, -1, 1);
    fvec d1 = frand(n * c, -1, 1), d2 = d1, dw1 = dw0, dw2 = dw0, db1 = db0, db2 = db0;
    ln_backward(d1.data(), dw1.data(), db1.data(), g.data(), x.data(), w.data(), mean.data(),
                rstd.data(), n, c);
    ms_k_layernorm_backward(d2.data(), dw2.data(), db2.data(), g.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), n, c);
    ok &= close("layernorm dinp (1e-5 + 1e-5 rel)", d1, d2, 1e-5, 1e-5);
    const colsum_want ww = colsum_reference(n, c, dw0, [&](int64_t r, int64_t j) {
        return (x[r * c + j] - mean[r]) * rstd[r] * g[r * c + j];
    });
    const colsum_want wb =
        colsum_reference(n, c, db0, [&](int64_t r, int64_t j) { return g[r * c + j]; });
    ok &= close_colsum("layernorm dweight vs CPU (summation bound)", dw1, to_dvec(dw2), ww.mag,
                       colsum_units_cpu(n));
    ok &= close_colsum("layernorm dbias vs CPU (summation bound)", db1, to_dvec(db2), wb.mag,
                       colsum_units_cpu(n));
    assert_true(ok);
}

static void test_layernorm_fd(void **state) {
    (void)state;
    const int64_t n = 6, c = 768;
    fvec x = frand(n * c, -2, 3), w = frand(c, 0.5, 1.5), b = frand(c, -0.5, 0.5),
         wo = frand(n * c, -1, 1);
    fvec out(n * c), mean(n), rstd(n);
    auto loss = [&]() {
        ln_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c, 1e-5f);
        return dot_loss(wo, out);
    };
    loss();
    fvec dx(n * c, 0.0f), dw(c, 0.0f), db(c, 0.0f);
    ln_backward(dx.data(), dw.data(), db.data(), wo.data(), x.data(), w.data(), mean.data(),
                rstd.data(), n, c);
    bool ok = fd_check("layernorm dinp vs finite differences", x, dx, loss, 1e-2, 1e-3, 48);
    ok &= fd_check("layernorm dweight vs finite differences", w, dw, loss, 1e-2, 1e-4, 32);
    ok &= fd_check("layernorm dbias vs finite differences", b, db, loss, 1e-2, 1e-4, 32);
    assert_true(ok);
}

static void test_layernorm_bf16(void **state) {
    (void)state;
    const int64_t n = 64, c = 768;
    std::vector<ms_bf16> x = to_bf16<ms_bf16>(frand(n * c, -3, 3)), out(n * c);
    const fvec xf = widen(x), w = frand(c, 0.5, 1.5), b = frand(c, -0.5, 0.5);
    fvec mean(n), rstd(n), want(n * c), mean2(n), rstd2(n);
    ln_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c, 1e-5f);
    ms_k_layernorm_forward(want.data(), mean2.data(), rstd2.data(), xf.data(), w.data(), b.data(),
                           n, c, 1e-5f);
    bool ok = close("layernorm forward bf16 out (1 ulp + 1e-5)", widen(out), want, 1e-5, BF16_RTOL);
    ok &= close("layernorm forward bf16 rstd (fp32: 1e-5 rel)", rstd, rstd2, 0, 1e-5);
    assert_true(ok);
}

/* ---- softmax ---- */

static void softmax_forward(float *out, const float *inp, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *x = inp + r * c;
        const float mx = lanes_max([&](int l, int nl) { return ms_cu_row_max_part(x, c, l, nl); });
        const float s =
            lanes_sum([&](int l, int nl) { return ms_cu_row_sumexp_part(x, c, mx, l, nl); });
        lanes_each([&](int l, int nl) { ms_cu_softmax_out_part(out + r * c, x, c, mx, s, l, nl); });
    }
}

static void softmax_backward(float *dinp, const float *dout, const float *y, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *yr = y + r * c;
        const float dot =
            lanes_sum([&](int l, int nl) { return ms_cu_row_dot_part(g, yr, c, l, nl); });
        lanes_each(
            [&](int l, int nl) { ms_cu_softmax_dinp_part(dinp + r * c, g, yr, c, dot, l, nl); });
    }
}

static void test_softmax(void **state) {
    (void)state;
    bool ok = true;
    for (int64_t c : {256, 768, 1000}) {
        const int64_t n = 96;
        const fvec x = frand(n * c, -8, 8), g = frand(n * c, -1, 1);
        fvec y(n * c), y2(n * c);
        softmax_forward(y.data(), x.data(), n, c);
        ms_k_softmax_forward(y2.data(), x.data(), n, c);
        char what[64];
        snprintf(what, sizeof what, "softmax forward C=%lld (1e-8 + 1e-5 rel)", (long long)c);
        ok &= close(what, y, y2, 1e-8, 1e-5);
        fvec d1 = frand(n * c, -1, 1), d2 = d1;
        softmax_backward(d1.data(), g.data(), y.data(), n, c);
        ms_k_softmax_backward(d2.data(), g.data(), y.data(), n, c);
        snprintf(what, sizeof what, "softmax backward C=%lld (1e-7 + 1e-5 rel)", (long long)c);
        ok &= close(what, d1, d2, 1e-7, 1e-5);
    }
    const int64_t n = 4, c = 300;
    fvec x = frand(n * c, -3, 3), w = frand(n * c, -1, 1), y(n * c), dx(n * c, 0.0f);
    softmax_forward(y.data(), x.data(), n, c);
    softmax_backward(dx.data(), w.data(), y.data(), n, c);
    auto loss = [&]() {
        softmax_forward(y.data(), x.data(), n, c);
        return dot_loss(w, y);
    };
    ok &= fd_check("softmax backward vs finite differences", x, dx, loss, 1e-2, 2e-4, 48);
    assert_true(ok);
}

/* ---- cross-entropy ---- */

struct xent_case {
    int64_t n, v;
    fvec logits;
    std::vector<int32_t> targets;
};

static xent_case xent_make(int64_t n, int64_t v) {
    xent_case x{n, v, frand(n * v, -6, 6), std::vector<int32_t>(n)};
    for (int64_t r = 0; r < n; r++) x.targets[r] = (int32_t)(urand() * (double)v);
    x.targets[1] = -1; /* an ignored (padding) row */
    return x;
}

/* The vocab-parallel forward over `parts` slices, the all-reduces done by hand: the losses
 * and the reduced gmax, gsum a sharded GPU run would hold. */
static void xent_vp_forward(const xent_case &x, int parts, fvec &losses, fvec &gmax, fvec &gsum) {
    losses.assign(x.n, 0.0f), gmax.assign(x.n, -INFINITY), gsum.assign(x.n, 0.0f);
    fvec gtgt(x.n, 0.0f);
    for (int pass = 0; pass < 2; pass++)
        for (int p = 0; p < parts; p++) {
            const int64_t v0 = x.v * p / parts, vl = x.v * (p + 1) / parts - v0;
            for (int64_t r = 0; r < x.n; r++) {
                const float *row = x.logits.data() + r * x.v + v0;
                if (pass == 0) { /* MAX all-reduce, then the SUM all-reduces below */
                    gmax[r] = std::max(gmax[r], lanes_max([&](int l, int nl) {
                                           return ms_cu_row_max_part(row, vl, l, nl);
                                       }));
                    continue;
                }
                gsum[r] += lanes_sum(
                    [&](int l, int nl) { return ms_cu_row_sumexp_part(row, vl, gmax[r], l, nl); });
                gtgt[r] += ms_cu_xent_target(row, x.targets[r], vl, v0);
            }
        }
    for (int64_t r = 0; r < x.n; r++)
        losses[r] = ms_cu_xent_loss(gmax[r], gsum[r], gtgt[r], x.targets[r]);
}

static void xent_vp_backward(fvec &d, const xent_case &x, int parts, const fvec &gmax,
                             const fvec &gsum, const fvec &dl) {
    for (int p = 0; p < parts; p++) {
        const int64_t v0 = x.v * p / parts, vl = x.v * (p + 1) / parts - v0;
        for (int64_t r = 0; r < x.n; r++)
            for (int64_t j = 0; j < vl; j++)
                ms_cu_xent_vp_grad(d.data() + r * x.v + v0, x.logits.data() + r * x.v + v0, j,
                                   gmax[r], gsum[r], x.targets[r], dl[r], v0);
    }
}

static void test_xent(void **state) {
    (void)state;
    /* GPT-2's vocabulary. The CPU kernel sums the 50257 exps of a row in sequence when it is
     * not vectorised (Debug builds), which puts its sum up to ~1e-5 relative off: hence 1e-4
     * on a loss or lse of ~10-14, and 3e-8 on gradients whose terms reach 2.5e-4 (the
     * optimised build agrees to 2e-6 and 3e-10; a wrong term of a percent is 1e-3 off). */
    const xent_case x = xent_make(24, 50257);
    fvec want(x.n), lse(x.n), dl = frand(x.n, 0.1, 1), losses, gmax, gsum;
    ms_k_xent_forward(want.data(), lse.data(), x.logits.data(), x.targets.data(), x.n, x.v);
    bool ok = true;
    for (int parts : {1, 4, 7}) { /* whole, and uneven slices */
        xent_vp_forward(x, parts, losses, gmax, gsum);
        char what[64];
        snprintf(what, sizeof what, "xent loss, %d vocab slice(s) (1e-4 + 1e-6 rel)", parts);
        ok &= close(what, losses, want, 1e-4, 1e-6);
        fvec d1 = frand(x.n * x.v, -1e-4, 1e-4), d2 = d1;
        xent_vp_backward(d1, x, parts, gmax, gsum, dl);
        ms_k_xent_backward(d2.data(), x.logits.data(), lse.data(), x.targets.data(), dl.data(), x.n,
                           x.v);
        snprintf(what, sizeof what, "xent backward, %d slice(s) (3e-8 + 1e-5 rel)", parts);
        ok &= close(what, d1, d2, 3e-8, 1e-5);
    }
    /* The per-slice partials against the CPU's vocab-parallel pieces on one slice. */
    const int64_t v0 = 20000, vl = 12345;
    fvec lm(x.n), lm2(x.n), ls(x.n), ls2(x.n), lt(x.n), lt2(x.n);
    std::vector<float> sub(x.n * vl);
    for (int64_t r = 0; r < x.n; r++)
        std::copy_n(x.logits.data() + r * x.v + v0, vl, sub.data() + r * vl);
    for (int64_t r = 0; r < x.n; r++) {
        const float *row = sub.data() + r * vl;
        lm[r] = lanes_max([&](int l, int nl) { return ms_cu_row_max_part(row, vl, l, nl); });
        ls[r] = lanes_sum(
            [&](int l, int nl) { return ms_cu_row_sumexp_part(row, vl, gmax[r], l, nl); });
        lt[r] = ms_cu_xent_target(row, x.targets[r], vl, v0);
    }
    ms_k_xent_vp_rowmax(lm2.data(), sub.data(), x.n, vl);
    ms_k_xent_vp_sumexp(ls2.data(), sub.data(), gmax.data(), x.n, vl);
    ms_k_xent_vp_target(lt2.data(), sub.data(), x.targets.data(), x.n, vl, v0);
    ok &= close("xent slice max (exact)", lm, lm2, 0, 0);
    ok &= close("xent slice sum of exp (3e-5 rel)", ls, ls2, 1e-30, 3e-5);
    ok &= close("xent slice target logit (exact)", lt, lt2, 0, 0);
    /* The whole-vocab GPU kernels: lse saved by the forward, ms_cu_xent_grad from it. */
    xent_vp_forward(x, 1, losses, gmax, gsum);
    fvec lse1(x.n), d1 = frand(x.n * x.v, -1e-4, 1e-4), d2 = d1;
    for (int64_t r = 0; r < x.n; r++) lse1[r] = ms_cu_xent_lse(gmax[r], gsum[r]);
    ok &= close("xent lse (1e-4 abs: lse ~ 14)", lse1, lse, 1e-4, 0);
    for (int64_t r = 0; r < x.n; r++)
        for (int64_t j = 0; j < x.v; j++)
            ms_cu_xent_grad(d1.data() + r * x.v, x.logits.data() + r * x.v, j, lse1[r],
                            x.targets[r], dl[r]);
    ms_k_xent_backward(d2.data(), x.logits.data(), lse.data(), x.targets.data(), dl.data(), x.n,
                       x.v);
    ok &= close("xent backward from lse (3e-8 + 1e-5 rel)", d1, d2, 3e-8, 1e-5);
    assert_true(ok);
}

static void test_xent_fd(void **state) {
    (void)state;
    xent_case x = xent_make(5, 333);
    const fvec dl = frand(x.n, 0.2, 1);
    fvec losses, gmax, gsum, d(x.n * x.v, 0.0f);
    xent_vp_forward(x, 3, losses, gmax, gsum);
    xent_vp_backward(d, x, 3, gmax, gsum, dl);
    auto loss = [&]() {
        fvec l, m, s;
        xent_vp_forward(x, 3, l, m, s);
        return dot_loss(dl, l);
    };
    bool ok =
        fd_check("xent backward (3 slices) vs finite diffs", x.logits, d, loss, 1e-2, 2e-4, 48);
    /* The target logits carry the largest gradients: check each one. */
    fvec dt;
    for (int64_t r = 0; r < x.n; r++)
        if (x.targets[r] >= 0) {
            const int64_t k = r * x.v + x.targets[r];
            const float x0 = x.logits[k];
            x.logits[k] = x0 + 1e-2f;
            const double lp = loss();
            x.logits[k] = x0 - 1e-2f;
            const double lm = loss();
            x.logits[k] = x0;
            const double fd = (lp - lm) / 2e-2;
            printf("  xent target logit row %lld: fd %.6f backward %.6f\n", (long long)r, fd, d[k]);
            ok &= fabs(fd - d[k]) <= 2e-4 * fabs(dl[r]);
        }
    assert_true(ok);
}

/* ---- optimizer ---- */

static void test_adamw(void **state) {
    (void)state;
    const int64_t n = 100003;
    const ms_adamw_opts o = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    fvec p = frand(n, -1, 1), m(n, 0.0f), v(n, 0.0f), p2 = p, m2 = m, v2 = v;
    bool ok = true;
    for (int64_t t = 1; t <= 3; t++) {
        const fvec g = frand(n, -2, 2);
        const ms_cu_adamw_consts k = ms_cu_adamw_prepare(&o, t, 0.5f);
        for (int64_t i = 0; i < n; i++)
            ms_cu_adamw_elem(p.data(), g.data(), m.data(), v.data(), i, k);
        ms_error err = {};
        assert_int_equal(
            ms_adamw_step_scaled(p2.data(), g.data(), m2.data(), v2.data(), n, &o, t, 0.5f, &err),
            MS_OK);
    }
    ok &= close("adamw p after 3 steps (FMA: 1e-7 + 1e-6 rel)", p, p2, 1e-7, 1e-6);
    ok &= close("adamw m (1e-7 + 1e-6 rel)", m, m2, 1e-7, 1e-6);
    ok &= close("adamw v (1e-9 + 1e-6 rel)", v, v2, 1e-9, 1e-6);
    /* fp32 master with a bf16 gradient: the CPU step on the widened gradient, and the bf16
     * use-copy bit for bit the master rounded. */
    std::vector<ms_bf16> g16 = to_bf16<ms_bf16>(frand(n, -2, 2)), w16(n);
    const fvec gw = widen(g16);
    const ms_cu_adamw_consts k = ms_cu_adamw_prepare(&o, 4, 1.0f);
    for (int64_t i = 0; i < n; i++)
        ms_cu_adamw_master_elem(p.data(), g16.data(), m.data(), v.data(), w16.data(), i, k);
    ms_error err = {};
    assert_int_equal(ms_adamw_step(p2.data(), gw.data(), m2.data(), v2.data(), n, &o, 4, &err),
                     MS_OK);
    ok &= close("adamw master p, bf16 gradient (1e-7 + 1e-6 rel)", p, p2, 1e-7, 1e-6);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += w16[i].bits != ms_bf16_from_f32(p[i]);
    printf("  adamw master bf16 copy: %d of %lld differ from the master rounded\n", bad,
           (long long)n);
    ok &= bad == 0;
    assert_true(ok);
}

/* ms_cu_sumsq's work for one fp32 tensor: its chunks' lane trees, then the chunks in order. */
static double sumsq_one(const fvec &x) {
    const int64_t n = (int64_t)x.size();
    std::vector<double> parts(ms_cu_sumsq_chunks(n));
    for (int64_t b = 0; b < (int64_t)parts.size(); b++) {
        const int64_t lo = b * MS_CU_SUMSQ_CHUNK,
                      len = std::min<int64_t>(n - lo, MS_CU_SUMSQ_CHUNK);
        double v[L];
        for (int l = 0; l < L; l++) v[l] = ms_cu_sumsq_part(x.data() + lo, len, l, L);
        parts[b] = ms_cu_lanes_sum(v, L);
    }
    return ms_cu_sumsq_combine(parts.data(), (int64_t)parts.size());
}

/* ms_cu_adamw_list: a block per chunk of every parameter, each finding its parameter, its
 * lanes striding the chunk: every element updated exactly once, with the bits of the elements
 * of ms_cu_adamw_elem one by one (fp32 and bf16 gradients, an empty parameter among them). */
static void test_adamw_list(void **state) {
    (void)state;
    const ms_adamw_opts o = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    const int64_t sizes[5] = {MS_CU_ADAMW_CHUNK + 3, 768, 0, 3 * MS_CU_ADAMW_CHUNK, 1};
    std::vector<fvec> p(5), m(5), v(5), g(5);
    std::vector<std::vector<ms_bf16>> g16(5);
    std::vector<ms_cu_adamw_item> items(5);
    for (int i = 0; i < 5; i++) {
        p[i] = frand(sizes[i], -1, 1), m[i] = frand(sizes[i], -0.1, 0.1);
        v[i] = frand(sizes[i], 0, 0.1), g[i] = frand(sizes[i], -2, 2);
        g16[i] = to_bf16<ms_bf16>(g[i]);
        const bool bf = i % 2 == 1;
        items[i] = {p[i].data(), bf ? (const void *)g16[i].data() : (const void *)g[i].data(),
                    m[i].data(), v[i].data(),
                    sizes[i],    0,
                    bf};
    }
    std::vector<fvec> p2 = p, m2 = m, v2 = v;
    const ms_cu_adamw_consts k = ms_cu_adamw_prepare(&o, 3, 0.5f);
    const int64_t chunks = ms_cu_adamw_list_plan(items.data(), 5);
    for (int64_t b = 0; b < chunks; b++) /* the grid's blocks, each with L lanes */
        for (int l = 0; l < L; l++)
            ms_cu_adamw_list_part(items[ms_cu_list_item_of(items.data(), 5, b)], b, l, L, k);
    int differ = 0;
    for (int i = 0; i < 5; i++) {
        for (int64_t e = 0; e < sizes[i]; e++) {
            if (i % 2)
                ms_cu_adamw_elem(p2[i].data(), g16[i].data(), m2[i].data(), v2[i].data(), e, k);
            else
                ms_cu_adamw_elem(p2[i].data(), g[i].data(), m2[i].data(), v2[i].data(), e, k);
        }
        const size_t bytes = sizeof(float) * (size_t)sizes[i];
        if (bytes == 0) continue; /* the empty parameter: memcmp may not see its null data */
        differ += memcmp(p[i].data(), p2[i].data(), bytes) ||
                  memcmp(m[i].data(), m2[i].data(), bytes) ||
                  memcmp(v[i].data(), v2[i].data(), bytes);
    }
    printf("  adamw over a list of 5 (%lld chunks): %d parameters differ from their own updates\n",
           (long long)chunks, differ);
    assert_int_equal(differ, 0);
}

/* ms_cu_cast_list: a block per chunk of every tensor, each finding its tensor, its lanes
 * striding the chunk: every element rounded exactly once, with the bits of the CPU's
 * ms_k_bf16_round of that tensor alone (an empty tensor among them, the values spanning
 * rounding ties, NaN and infinities); nothing past a tensor's end is written. */
static void test_cast_list(void **state) {
    (void)state;
    const int64_t sizes[5] = {MS_CU_CAST_CHUNK + 5, 768, 0, 2 * MS_CU_CAST_CHUNK, 3};
    std::vector<fvec> src(5);
    std::vector<std::vector<uint16_t>> dst(5), want(5);
    std::vector<ms_cu_cast_item> items(5);
    for (int i = 0; i < 5; i++) {
        src[i] = frand(sizes[i], -1e4, 1e4);
        for (int64_t e = 0; e < sizes[i]; e += 97)
            src[i][e] = ms_cu_bits_f32(0x3f808000u); /* tie */
        if (sizes[i] > 2) src[i][1] = NAN, src[i][2] = -INFINITY;
        dst[i].assign((size_t)sizes[i] + 1, 0xBEEF); /* one past the end, watched */
        want[i].assign((size_t)sizes[i] + 1, 0xBEEF);
        ms_k_bf16_round(want[i].data(), src[i].data(), sizes[i]);
        items[i] = {dst[i].data(), src[i].data(), sizes[i], 0};
    }
    const int64_t chunks = ms_cu_cast_list_plan(items.data(), 5);
    for (int64_t b = 0; b < chunks; b++) /* the grid's blocks, each with L lanes */
        for (int l = 0; l < L; l++)
            ms_cu_cast_list_part(items[ms_cu_list_item_of(items.data(), 5, b)], b, l, L);
    int differ = 0;
    for (int i = 0; i < 5; i++) differ += dst[i] != want[i];
    printf("  bf16 round over a list of 5 (%lld chunks): %d tensors differ from the CPU's\n",
           (long long)chunks, differ);
    assert_int_equal(differ, 0);
}

static void test_sumsq(void **state) {
    (void)state;
    bool ok = true;
    for (int64_t n : {1, 1000, 3 * MS_CU_SUMSQ_CHUNK + 12345}) {
        const fvec x = frand(n, -3, 3);
        const double got = sumsq_one(x);
        const double want = ms_sumsq_f32(x.data(), (size_t)n);
        const double rel = fabs(got - want) / want;
        printf("  sum of squares n=%-8lld rel err %.3g (tolerance 1e-12)\n", (long long)n, rel);
        ok &= rel <= 1e-12;
    }
    assert_true(ok);
}

/* ms_cu_sumsq_list: the chunks of every tensor in one grid (each block finds its tensor), then
 * each tensor's chunks in order: every sum has the bits ms_cu_sumsq gives that tensor alone
 * (bf16 ones: those of the widened values), an empty tensor sums to 0. */
static void test_sumsq_list(void **state) {
    (void)state;
    const int64_t sizes[6] = {MS_CU_SUMSQ_CHUNK, 5, 0, 2 * MS_CU_SUMSQ_CHUNK + 7, 768, 1};
    std::vector<fvec> xs;
    std::vector<std::vector<ms_bf16>> hs;
    std::vector<ms_cu_sumsq_item> items(6);
    for (int i = 0; i < 6; i++) {
        xs.push_back(frand(sizes[i], -3, 3));
        hs.push_back(to_bf16<ms_bf16>(xs.back()));
        const bool bf = i % 2 == 1;
        items[i] = {bf ? (const void *)hs[i].data() : (const void *)xs[i].data(), sizes[i], 0, bf};
    }
    const int64_t chunks = ms_cu_sumsq_list_plan(items.data(), 6);
    std::vector<double> parts(chunks), got(6);
    for (int64_t b = 0; b < chunks; b++) { /* a block each, as the grid runs them */
        const ms_cu_sumsq_item &it = items[ms_cu_list_item_of(items.data(), 6, b)];
        double v[L];
        for (int l = 0; l < L; l++)
            v[l] = it.bf16 ? ms_cu_sumsq_list_part<ms_bf16>(it, b, l, L)
                           : ms_cu_sumsq_list_part<float>(it, b, l, L);
        parts[b] = ms_cu_lanes_sum(v, L);
    }
    int differ = 0;
    for (int i = 0; i < 6; i++) {
        const int64_t end = i + 1 < 6 ? items[i + 1].chunk0 : chunks;
        got[i] = ms_cu_sumsq_combine(parts.data() + items[i].chunk0, end - items[i].chunk0);
        const double alone = sumsq_one(i % 2 ? widen(hs[i]) : xs[i]);
        differ += memcmp(&got[i], &alone, sizeof alone) != 0;
    }
    printf("  sums of squares of a list of 6 (%lld chunks): %d differ from the sums alone\n",
           (long long)chunks, differ);
    assert_int_equal(differ, 0);
    assert_true(got[2] == 0.0);
}

/* ---- attention ---- */

struct attn_case {
    int64_t b, t, c, nh;
    bool causal;
    fvec qkv, mask; /* mask empty: none */
};

static const float *mask_of(const attn_case &a, int64_t bi) {
    return a.mask.empty() ? NULL : a.mask.data() + bi * a.t;
}

/* The forward kernel's work for every query row: key tiles in order, online softmax. */
static void attn_forward(const attn_case &a, float *out, float *lse) {
    const int64_t hs = a.c / a.nh, c3 = 3 * a.c;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int64_t bi = 0; bi < a.b; bi++)
        for (int64_t h = 0; h < a.nh; h++)
            for (int64_t i = 0; i < a.t; i++) {
                const float *base = a.qkv.data() + bi * a.t * c3 + h * hs, *km = mask_of(a, bi);
                float acc[MS_CU_ATTN_MAX_HS];
                ms_cu_attn_state st;
                ms_cu_attn_fwd_init(&st, acc, hs);
                for (int64_t j0 = 0; j0 < a.t; j0 += MS_CU_ATTN_TILE) {
                    const int64_t nk = std::min<int64_t>(MS_CU_ATTN_TILE, a.t - j0);
                    const int64_t vis = ms_cu_attn_visible(i, j0, nk, a.causal);
                    if (vis > 0)
                        ms_cu_attn_fwd_tile(&st, acc, base + i * c3, base + a.c + j0 * c3,
                                            base + 2 * a.c + j0 * c3, c3, km ? km + j0 : NULL, vis,
                                            hs, scale);
                }
                lse[(bi * a.nh + h) * a.t + i] =
                    ms_cu_attn_fwd_finish(out + (bi * a.t + i) * a.c + h * hs, &st, acc, hs);
            }
}

/* The backward kernels' work: delta per query row, dQ per query row over key tiles, dK and
 * dV per key row over query tiles. dqkv accumulates. */
static void attn_backward(const attn_case &a, float *dqkv, const float *dout, const float *out,
                          const float *lse) {
    const int64_t hs = a.c / a.nh, c3 = 3 * a.c;
    const float scale = 1.0f / sqrtf((float)hs);
    fvec delta(a.b * a.nh * a.t);
    for (int64_t bi = 0; bi < a.b; bi++)
        for (int64_t h = 0; h < a.nh; h++) {
            const int64_t off = bi * a.t * c3 + h * hs, rows = (bi * a.nh + h) * a.t;
            const float *q = a.qkv.data() + off, *k = q + a.c, *v = q + 2 * a.c,
                        *km = mask_of(a, bi);
            const float *g = dout + bi * a.t * a.c + h * hs;
            for (int64_t i = 0; i < a.t; i++)
                delta[rows + i] = ms_cu_dot(g + i * a.c, out + (bi * a.t + i) * a.c + h * hs, hs);
            for (int64_t i = 0; i < a.t; i++) {
                float dq[MS_CU_ATTN_MAX_HS] = {};
                for (int64_t j0 = 0; j0 < a.t; j0 += MS_CU_ATTN_TILE) {
                    const int64_t nk = std::min<int64_t>(MS_CU_ATTN_TILE, a.t - j0);
                    const int64_t vis = ms_cu_attn_visible(i, j0, nk, a.causal);
                    if (vis > 0)
                        ms_cu_attn_dq_tile(dq, q + i * c3, g + i * a.c, delta[rows + i],
                                           lse[rows + i], k + j0 * c3, v + j0 * c3, c3,
                                           km ? km + j0 : NULL, vis, hs, scale);
                }
                for (int64_t d = 0; d < hs; d++) dqkv[off + i * c3 + d] += dq[d];
            }
            for (int64_t j = 0; j < a.t; j++) {
                float dk[MS_CU_ATTN_MAX_HS] = {}, dv[MS_CU_ATTN_MAX_HS] = {};
                for (int64_t i0 = 0; i0 < a.t; i0 += MS_CU_ATTN_TILE) {
                    const int64_t nq = std::min<int64_t>(MS_CU_ATTN_TILE, a.t - i0);
                    ms_cu_attn_dkv_tile(dk, dv, k + j * c3, v + j * c3, j, km ? km[j] : 0.0f,
                                        q + i0 * c3, c3, g + i0 * a.c, a.c, lse + rows + i0,
                                        delta.data() + rows + i0, i0, nq, hs, scale, a.causal);
                }
                for (int64_t d = 0; d < hs; d++) {
                    dqkv[off + j * c3 + a.c + d] += dk[d];
                    dqkv[off + j * c3 + 2 * a.c + d] += dv[d];
                }
            }
        }
}

static attn_case attn_make(int64_t b, int64_t t, int64_t c, int64_t nh, bool causal, bool masked) {
    attn_case a{b, t, c, nh, causal, frand(b * t * 3 * c, -1.5, 1.5), fvec()};
    if (masked) { /* padding at the end of each sequence, and a few dropped keys inside */
        a.mask.assign(b * t, 0.0f);
        for (int64_t bi = 0; bi < b; bi++)
            for (int64_t j = 0; j < t; j++)
                if (j >= t - 7 * (bi + 1) || (j % 11 == 5 && j > 0)) a.mask[bi * t + j] = -INFINITY;
    }
    return a;
}

static bool attn_against_cpu(const attn_case &a, const char *name) {
    const int64_t n = a.b * a.t * a.c;
    fvec out(n), lse(a.b * a.nh * a.t), out2(n), att(a.b * a.nh * a.t * a.t);
    attn_forward(a, out.data(), lse.data());
    ms_k_attention_forward(out2.data(), att.data(), NULL, a.qkv.data(),
                           a.mask.empty() ? NULL : a.mask.data(), a.b, a.t, a.c, a.nh, a.causal,
                           NULL);
    char what[96];
    snprintf(what, sizeof what, "attention out, %s (1e-5 + 1e-4 rel)", name);
    bool ok = close(what, out, out2, 1e-5, 1e-4);
    /* lse against float64 over the unmasked scores: an independent reference. */
    const int64_t hs = a.c / a.nh, c3 = 3 * a.c;
    fvec lse2(lse.size());
    for (int64_t bi = 0; bi < a.b; bi++)
        for (int64_t h = 0; h < a.nh; h++)
            for (int64_t i = 0; i < a.t; i++) {
                const float *q = a.qkv.data() + bi * a.t * c3 + h * hs + i * c3;
                std::vector<double> s;
                for (int64_t j = 0; j < (a.causal ? i + 1 : a.t); j++) {
                    const double mk = a.mask.empty() ? 0.0 : a.mask[bi * a.t + j];
                    if (mk == -INFINITY) continue;
                    double d = 0;
                    for (int64_t e = 0; e < hs; e++) d += (double)q[e] * q[a.c + (j - i) * c3 + e];
                    s.push_back(d / sqrt((double)hs) + mk);
                }
                const double mx = *std::max_element(s.begin(), s.end());
                double sum = 0;
                for (double x : s) sum += exp(x - mx);
                lse2[(bi * a.nh + h) * a.t + i] = (float)(mx + log(sum));
            }
    snprintf(what, sizeof what, "attention lse vs float64, %s (1e-5 + 1e-5 rel)", name);
    ok &= close(what, lse, lse2, 1e-5, 1e-5);
    const fvec g = frand(n, -1, 1);
    fvec d1 = frand(a.qkv.size(), -1, 1), d2 = d1, scratch(ms_k_attention_scratch_floats(a.t));
    attn_backward(a, d1.data(), g.data(), out.data(), lse.data());
    ms_k_attention_backward(d2.data(), scratch.data(), g.data(), a.qkv.data(), att.data(), a.b, a.t,
                            a.c, a.nh, a.causal, NULL);
    snprintf(what, sizeof what, "attention dqkv, %s (1e-5 + 1e-4 rel)", name);
    ok &= close(what, d1, d2, 1e-5, 1e-4);
    return ok;
}

static void test_attention(void **state) {
    (void)state;
    bool ok = true;
    /* T = 100 and 77: not multiples of the 32-key tile (nor of the CPU's 64-row block). */
    ok &= attn_against_cpu(attn_make(2, 100, 768, 12, true, false), "causal B=2 T=100 C=768 NH=12");
    ok &= attn_against_cpu(attn_make(2, 77, 768, 12, false, true), "key mask B=2 T=77");
    ok &= attn_against_cpu(attn_make(2, 100, 384, 6, true, true), "causal + mask B=2 T=100 HS=64");
    ok &= attn_against_cpu(attn_make(1, 256, 768, 12, true, false), "causal B=1 T=256 C=768");
    ok &= attn_against_cpu(attn_make(1, 64, 256, 2, false, false), "full B=1 T=64 HS=128");
    assert_true(ok);
}

static void test_attention_fd(void **state) {
    (void)state;
    bool ok = true;
    for (bool causal : {true, false}) {
        attn_case a = attn_make(1, 37, 32, 2, causal, !causal);
        const int64_t n = a.b * a.t * a.c;
        const fvec w = frand(n, -1, 1);
        fvec out(n), lse(a.b * a.nh * a.t), d(a.qkv.size(), 0.0f);
        attn_forward(a, out.data(), lse.data());
        attn_backward(a, d.data(), w.data(), out.data(), lse.data());
        auto loss = [&]() {
            attn_forward(a, out.data(), lse.data());
            return dot_loss(w, out);
        };
        ok &= fd_check(causal ? "attention dqkv causal vs finite differences"
                              : "attention dqkv masked vs finite differences",
                       a.qkv, d, loss, 1e-2, 5e-4, 96);
    }
    assert_true(ok);
}

/* ---- the LLaMA layers ---- */

/* The RMSNorm kernels' work: a row per block (lanes and tree), dweight the column reduction. */
static void rms_forward(float *out, float *rstd, const float *inp, const float *w, int64_t n,
                        int64_t c, float eps) {
    for (int64_t r = 0; r < n; r++) {
        const float *x = inp + r * c;
        const float ss =
            lanes_sum([&](int l, int nl) { return ms_cu_rms_sumsq_part(x, c, l, nl); });
        rstd[r] = ms_cu_ln_rstd(ss, c, eps);
        lanes_each(
            [&](int l, int nl) { ms_cu_rms_out_part(out + r * c, x, w, c, rstd[r], l, nl); });
    }
}
static void rms_backward(float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, const float *rstd, int64_t n, int64_t c) {
    assert_true(colsum_rms_bwd(dw, dout, inp, rstd, n, c, false));
    for (int64_t r = 0; r < n; r++) {
        const float *g = dout + r * c, *x = inp + r * c;
        const float wgx =
            lanes_sum([&](int l, int nl) { return ms_cu_rms_wgx_part(g, x, w, c, l, nl); });
        lanes_each([&](int l, int nl) {
            ms_cu_rms_dinp_part(dinp + r * c, g, x, w, c, rstd[r], wgx, l, nl);
        });
    }
}

static void test_rmsnorm(void **state) {
    (void)state;
    bool ok = true;
    for (int64_t c : {64, 128, 256, 4096}) { /* LLaMA-tiny to LLaMA-7B rows */
        const int64_t n = 4 * 128, e = n * c;
        const fvec x = frand(e, -3, 3), w = frand(c, 0.5, 1.5), g = frand(e, -1, 1);
        fvec out(e), rstd(n), out2(e), rstd2(n);
        rms_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6f);
        ms_k_rmsnorm_forward(out2.data(), rstd2.data(), x.data(), w.data(), n, c, 1e-6f);
        char what[80];
        snprintf(what, sizeof what, "rmsnorm out C=%lld (1e-6 + 1e-5 rel)", (long long)c);
        ok &= close(what, out, out2, 1e-6, 1e-5);
        snprintf(what, sizeof what, "rmsnorm rstd C=%lld (1e-5 rel)", (long long)c);
        ok &= close(what, rstd, rstd2, 0, 1e-5);
        const fvec dw0 = frand(c, -1, 1);
        fvec d1 = frand(e, -1, 1), d2 = d1, dw1 = dw0, dw2 = dw0;
        rms_backward(d1.data(), dw1.data(), g.data(), x.data(), w.data(), rstd2.data(), n, c);
        ms_k_rmsnorm_backward(d2.data(), dw2.data(), g.data(), x.data(), w.data(), rstd2.data(), n,
                              c);
        snprintf(what, sizeof what, "rmsnorm dinp C=%lld (1e-6 + 1e-5 rel)", (long long)c);
        ok &= close(what, d1, d2, 1e-6, 1e-5);
        const colsum_want ww = colsum_reference(n, c, dw0, [&](int64_t r, int64_t j) {
            return g[r * c + j] * x[r * c + j] * rstd2[r];
        });
        snprintf(what, sizeof what, "rmsnorm dweight C=%lld vs CPU (summation bound)",
                 (long long)c);
        ok &= close_colsum(what, dw1, to_dvec(dw2), ww.mag, colsum_units_cpu(n));
    }
    assert_true(ok);
}

static void test_rmsnorm_fd(void **state) {
    (void)state;
    const int64_t n = 6, c = 96, e = n * c;
    fvec x = frand(e, -2, 2), w = frand(c, 0.5, 1.5);
    const fvec lw = frand(e, -1, 1);
    fvec out(e), rstd(n), dx(e, 0.0f), dw(c, 0.0f);
    rms_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6f);
    rms_backward(dx.data(), dw.data(), lw.data(), x.data(), w.data(), rstd.data(), n, c);
    auto loss = [&]() {
        rms_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6f);
        return dot_loss(lw, out);
    };
    bool ok = fd_check("rmsnorm dinp vs finite differences", x, dx, loss, 1e-2, 5e-4, 64);
    ok &= fd_check("rmsnorm dweight vs finite differences", w, dw, loss, 1e-2, 5e-4, 48);
    assert_true(ok);
}

static void test_swiglu(void **state) {
    (void)state;
    const int64_t e = 4 * 128 * 352; /* B*T rows of LLaMA-tiny's intermediate size */
    fvec gate = frand(e, -6, 6), up = frand(e, -2, 2), g = frand(e, -1, 1);
    fvec out(e), out2(e);
    for (int64_t i = 0; i < e; i++) ms_cu_swiglu_fwd(out.data(), gate.data(), up.data(), i);
    ms_k_swiglu_forward(out2.data(), gate.data(), up.data(), e);
    /* the CPU's expf may be a vector polynomial: a few ulps */
    bool ok = close("swiglu forward (1e-7 + 1e-6 rel)", out, out2, 1e-7, 1e-6);
    fvec dg1 = frand(e, -1, 1), dg2 = dg1, du1 = frand(e, -1, 1), du2 = du1;
    for (int64_t i = 0; i < e; i++)
        ms_cu_swiglu_bwd(dg1.data(), du1.data(), g.data(), gate.data(), up.data(), i);
    ms_k_swiglu_backward(dg2.data(), du2.data(), g.data(), gate.data(), up.data(), e);
    ok &= close("swiglu dgate (1e-6 + 1e-5 rel)", dg1, dg2, 1e-6, 1e-5);
    ok &= close("swiglu dup (1e-6 + 1e-5 rel)", du1, du2, 1e-6, 1e-5);
    /* finite differences on a slice: the loss sum(w * silu(gate) * up) */
    const int64_t m = 2000;
    gate.resize(m), up.resize(m), g.resize(m), out.resize(m);
    fvec dg(m, 0.0f), du(m, 0.0f);
    for (int64_t i = 0; i < m; i++)
        ms_cu_swiglu_bwd(dg.data(), du.data(), g.data(), gate.data(), up.data(), i);
    auto loss = [&]() {
        for (int64_t i = 0; i < m; i++) ms_cu_swiglu_fwd(out.data(), gate.data(), up.data(), i);
        return dot_loss(g, out);
    };
    ok &= fd_check("swiglu dgate vs finite differences", gate, dg, loss, 1e-2, 2e-4, 64);
    ok &= fd_check("swiglu dup vs finite differences", up, du, loss, 1e-2, 2e-4, 64);
    assert_true(ok);
}

static void rotary_apply_host(float *out, const float *inp, const fvec &cs, const fvec &sn,
                              int64_t b, int64_t t, int64_t h, int64_t d, bool inverse) {
    for (int64_t e = 0; e < b * t * h * (d / 2); e++)
        ms_cu_rotary_pair(out, inp, cs.data(), sn.data(), t, h, d, inverse, e);
}

static void test_rotary(void **state) {
    (void)state;
    bool ok = true;
    /* A sequence shard starting at position 4000: the reduced angle keeps the tables exact. */
    const int64_t b = 2, t = 128, h = 6, d = 64, half = d / 2, t0 = 4000, e = b * t * h * d;
    fvec cs(t * half), sn(t * half), cs2(t * half), sn2(t * half);
    for (int64_t k = 0; k < t * half; k++)
        ms_cu_rotary_entry(cs.data(), sn.data(), t0, d, 10000.0f, k);
    ms_k_rotary_tables(cs2.data(), sn2.data(), t, t0, d, 10000.0f);
    ok &= close("rotary cos table, t0=4000 (exact on the host)", cs, cs2, 0, 0);
    ok &= close("rotary sin table, t0=4000 (exact on the host)", sn, sn2, 0, 0);
    /* The tables against float64 trigonometry: an independent reference. */
    fvec csd(t * half), snd(t * half);
    for (int64_t p = 0; p < t; p++)
        for (int64_t i = 0; i < half; i++) {
            const double ang = (double)(t0 + p) * pow(10000.0, -2.0 * (double)i / (double)d);
            csd[p * half + i] = (float)cos(ang), snd[p * half + i] = (float)sin(ang);
        }
    ok &= close("rotary cos vs float64 (1e-6 abs)", cs, csd, 1e-6, 0);
    ok &= close("rotary sin vs float64 (1e-6 abs)", sn, snd, 1e-6, 0);
    fvec x = frand(e, -2, 2), out(e), out2(e);
    rotary_apply_host(out.data(), x.data(), cs, sn, b, t, h, d, false);
    ms_k_rotary_apply(out2.data(), x.data(), cs.data(), sn.data(), b, t, h, d, false);
    ok &= close("rotary forward (FMA: 1e-7 + 1e-6 rel)", out, out2, 1e-7, 1e-6);
    fvec d1 = frand(e, -1, 1), d2 = d1;
    const fvec g = frand(e, -1, 1);
    rotary_apply_host(d1.data(), g.data(), cs, sn, b, t, h, d, true);
    ms_k_rotary_apply(d2.data(), g.data(), cs.data(), sn.data(), b, t, h, d, true);
    ok &= close("rotary backward (FMA: 1e-6 + 1e-6 rel)", d1, d2, 1e-6, 1e-6);
    /* The backward is the forward's transpose: <R x, g> = <x, R^T g> in float64. */
    fvec rt(e, 0.0f);
    rotary_apply_host(rt.data(), g.data(), cs, sn, b, t, h, d, true);
    const double lhs = dot_loss(g, out), rhs = dot_loss(x, rt);
    printf("  rotary <Rx, g> %.9g, <x, R^T g> %.9g\n", lhs, rhs);
    ok &= fabs(lhs - rhs) <= 1e-5 * fabs(lhs) + 1e-3;
    assert_true(ok);
}

/* Grouped-query attention on layers.h's strided layout: q [B, Tq, H, D]; k, v [B, Tk, Hkv, D]
 * apart, or packed kv [B, Tk, 2, Hkv, D]; mask [B, Tk] of keep flags, or empty. */
struct gqa_case {
    ms_k_gqa g;
    fvec q, kb, vb, mask; /* vb empty: packed in kb */
    const float *k() const { return kb.data(); }
    const float *v() const { return vb.empty() ? kb.data() + g.hkv * g.d : vb.data(); }
    float *k() { return kb.data(); }
    float *v() { return vb.empty() ? kb.data() + g.hkv * g.d : vb.data(); }
    const float *km(int64_t bi) const { return mask.empty() ? NULL : mask.data() + bi * g.tk; }
    const float *mask_or_null() const { return mask.empty() ? NULL : mask.data(); }
};

static gqa_case gqa_make(int64_t b, int64_t tq, int64_t tk, int64_t q_start, int64_t h, int64_t hkv,
                         int64_t d, bool causal, bool packed, bool masked) {
    gqa_case c;
    c.g = ms_k_gqa{b, tq, tk, h, hkv, d, h * d, (packed ? 2 : 1) * hkv * d, h * d, q_start, causal};
    c.q = frand(b * tq * h * d, -1.5, 1.5);
    c.kb = frand(b * tk * (packed ? 2 : 1) * hkv * d, -1.5, 1.5);
    if (!packed) c.vb = frand(b * tk * hkv * d, -1.5, 1.5);
    if (masked) { /* padding at the end, a few dropped keys inside; batch item 2 drops all */
        c.mask.assign(b * tk, 1.0f);
        for (int64_t bi = 0; bi < b; bi++)
            for (int64_t j = 0; j < tk; j++)
                if (bi == 2 || j >= tk - 5 * (bi + 1) || (j % 13 == 6)) c.mask[bi * tk + j] = 0.0f;
    }
    return c;
}

/* The key tiles query row i of (bi, h) sees, as the forward and dq kernels walk them:
 * tile(j0, vis, mt) with the tile's mask terms mt (NULL without a mask). */
static void gqa_key_tiles(const gqa_case &c, int64_t bi, int64_t i,
                          const std::function<void(int64_t, int64_t, const float *)> &tile) {
    const ms_k_gqa &g = c.g;
    float mt[MS_CU_ATTN_TILE];
    for (int64_t j0 = 0; j0 < g.tk; j0 += MS_CU_ATTN_TILE) {
        const int64_t nk = std::min<int64_t>(MS_CU_ATTN_TILE, g.tk - j0);
        const int64_t vis = ms_cu_attn_visible(g.q_start + i, j0, nk, g.causal);
        for (int64_t e = 0; e < nk; e++) mt[e] = ms_cu_attn_mask_term(c.km(bi), j0 + e, true);
        if (vis > 0) tile(j0, vis, c.mask.empty() ? NULL : mt);
    }
}

/* The forward kernel's work: saved = lse [B, H, Tq], then the output [B, Tq, H, D]. */
static void gqa_forward_host(const gqa_case &c, float *out, float *saved) {
    const ms_k_gqa &g = c.g;
    const float scale = 1.0f / sqrtf((float)g.d);
    float *ocopy = saved + g.b * g.h * g.tq;
    for (int64_t bi = 0; bi < g.b; bi++)
        for (int64_t h = 0; h < g.h; h++)
            for (int64_t i = 0; i < g.tq; i++) {
                const int64_t kvo = bi * g.tk * g.kv_stride + (h / (g.h / g.hkv)) * g.d;
                const float *qi = c.q.data() + (bi * g.tq + i) * g.q_stride + h * g.d;
                float acc[MS_CU_ATTN_MAX_HS];
                ms_cu_attn_state st;
                ms_cu_attn_fwd_init(&st, acc, g.d);
                gqa_key_tiles(c, bi, i, [&](int64_t j0, int64_t vis, const float *mt) {
                    ms_cu_attn_fwd_tile(&st, acc, qi, c.k() + kvo + j0 * g.kv_stride,
                                        c.v() + kvo + j0 * g.kv_stride, g.kv_stride, mt, vis, g.d,
                                        scale);
                });
                float *o = out + (bi * g.tq + i) * g.out_stride + h * g.d;
                saved[(bi * g.h + h) * g.tq + i] = ms_cu_attn_fwd_finish(o, &st, acc, g.d);
                std::copy_n(o, g.d, ocopy + ((bi * g.tq + i) * g.h + h) * g.d);
            }
}

/* The backward kernels' work: delta per query row, dQ per query row over key tiles, dK and
 * dV per key row of a kv head over the query tiles of each query head of its group. */
static void gqa_backward_host(const gqa_case &c, float *dq, float *dk, float *dv, const float *dout,
                              const float *saved) {
    const ms_k_gqa &g = c.g;
    const int64_t grp = g.h / g.hkv, qs = g.q_stride, ks = g.kv_stride, os = g.out_stride;
    const float scale = 1.0f / sqrtf((float)g.d), *lse = saved, *oc = saved + g.b * g.h * g.tq;
    fvec delta(g.b * g.h * g.tq);
    for (int64_t bi = 0; bi < g.b; bi++)
        for (int64_t h = 0; h < g.h; h++)
            for (int64_t i = 0; i < g.tq; i++)
                delta[(bi * g.h + h) * g.tq + i] =
                    ms_cu_dot(dout + (bi * g.tq + i) * os + h * g.d,
                              oc + ((bi * g.tq + i) * g.h + h) * g.d, g.d);
    for (int64_t bi = 0; bi < g.b; bi++)
        for (int64_t h = 0; h < g.h; h++)
            for (int64_t i = 0; i < g.tq; i++) {
                const int64_t kvo = bi * g.tk * ks + (h / grp) * g.d, r = (bi * g.h + h) * g.tq + i;
                const int64_t qo = (bi * g.tq + i) * qs + h * g.d;
                float dqi[MS_CU_ATTN_MAX_HS] = {};
                gqa_key_tiles(c, bi, i, [&](int64_t j0, int64_t vis, const float *mt) {
                    ms_cu_attn_dq_tile(dqi, c.q.data() + qo, dout + (bi * g.tq + i) * os + h * g.d,
                                       delta[r], lse[r], c.k() + kvo + j0 * ks,
                                       c.v() + kvo + j0 * ks, ks, mt, vis, g.d, scale);
                });
                for (int64_t d = 0; d < g.d; d++) dq[qo + d] += dqi[d];
            }
    for (int64_t bi = 0; bi < g.b; bi++)
        for (int64_t kh = 0; kh < g.hkv; kh++)
            for (int64_t j = 0; j < g.tk; j++) {
                const int64_t kvo = (bi * g.tk + j) * ks + kh * g.d;
                float dkj[MS_CU_ATTN_MAX_HS] = {}, dvj[MS_CU_ATTN_MAX_HS] = {};
                const float mj = ms_cu_attn_mask_term(c.km(bi), j, true);
                for (int64_t h = kh * grp; h < (kh + 1) * grp; h++)
                    for (int64_t i0 = 0; i0 < g.tq; i0 += MS_CU_ATTN_TILE) {
                        const int64_t nq = std::min<int64_t>(MS_CU_ATTN_TILE, g.tq - i0);
                        const int64_t r = (bi * g.h + h) * g.tq + i0;
                        ms_cu_attn_dkv_tile(dkj, dvj, c.k() + kvo, c.v() + kvo, j, mj,
                                            c.q.data() + (bi * g.tq + i0) * qs + h * g.d, qs,
                                            dout + (bi * g.tq + i0) * os + h * g.d, os, lse + r,
                                            delta.data() + r, g.q_start + i0, nq, g.d, scale,
                                            g.causal);
                    }
                for (int64_t d = 0; d < g.d; d++) dk[kvo + d] += dkj[d], dv[kvo + d] += dvj[d];
            }
}

/* lse of every query row in float64 over the keys it sees (-inf where none): an independent
 * reference for the forward. */
static fvec gqa_lse_f64(const gqa_case &c) {
    const ms_k_gqa &g = c.g;
    fvec lse(g.b * g.h * g.tq);
    for (int64_t bi = 0; bi < g.b; bi++)
        for (int64_t h = 0; h < g.h; h++)
            for (int64_t i = 0; i < g.tq; i++) {
                const float *qi = c.q.data() + (bi * g.tq + i) * g.q_stride + h * g.d;
                const int64_t nk = g.causal ? std::min(g.tk, g.q_start + i + 1) : g.tk;
                std::vector<double> s;
                for (int64_t j = 0; j < nk; j++) {
                    if (c.km(bi) && c.km(bi)[j] == 0.0f) continue;
                    const float *kj =
                        c.k() + (bi * g.tk + j) * g.kv_stride + h / (g.h / g.hkv) * g.d;
                    double dd = 0;
                    for (int64_t e = 0; e < g.d; e++) dd += (double)qi[e] * kj[e];
                    s.push_back(dd / sqrt((double)g.d));
                }
                double mx = -INFINITY, sum = 0;
                for (double x : s) mx = std::max(mx, x);
                for (double x : s) sum += exp(x - mx);
                lse[(bi * g.h + h) * g.tq + i] = s.empty() ? -INFINITY : (float)(mx + log(sum));
            }
    return lse;
}

static bool gqa_against_cpu(const gqa_case &c, const char *name) {
    const ms_k_gqa &g = c.g;
    const int64_t no = g.b * g.tq * g.h * g.d, nl = g.b * g.h * g.tq;
    fvec out(no), saved(nl + no), out2(no), att(g.b * g.h * g.tq * g.tk);
    gqa_forward_host(c, out.data(), saved.data());
    ms_k_gqa_forward(&g, out2.data(), att.data(), c.q.data(), c.k(), c.v(), c.mask_or_null());
    char what[112];
    snprintf(what, sizeof what, "gqa out, %s (1e-5 + 1e-4 rel)", name);
    bool ok = close(what, out, out2, 1e-5, 1e-4);
    const fvec lse(saved.begin(), saved.begin() + nl), lse2 = gqa_lse_f64(c);
    bool same_inf = true;
    for (int64_t r = 0; r < nl; r++) same_inf &= std::isinf(lse[r]) == std::isinf(lse2[r]);
    fvec lf(lse), lf2(lse2); /* rows without keys: -inf on both sides, compared as 0 */
    for (int64_t r = 0; r < nl; r++)
        if (std::isinf(lf[r]) && std::isinf(lf2[r])) lf[r] = lf2[r] = 0.0f;
    snprintf(what, sizeof what, "gqa lse vs float64, %s (1e-5 + 1e-5 rel)", name);
    ok &= close(what, lf, lf2, 1e-5, 1e-5) && same_inf;
    const fvec dout = frand(no, -1, 1);
    gqa_case d1 = c, d2 = c; /* gradient buffers shaped as q, k and v, random to accumulate on */
    d1.q = d2.q = frand(c.q.size(), -1, 1);
    d1.kb = d2.kb = frand(c.kb.size(), -1, 1);
    d1.vb = d2.vb = frand(c.vb.size(), -1, 1);
    fvec scratch(ms_k_gqa_scratch_floats(&g));
    gqa_backward_host(c, d1.q.data(), d1.k(), d1.v(), dout.data(), saved.data());
    ms_k_gqa_backward(&g, d2.q.data(), d2.k(), d2.v(), scratch.data(), dout.data(), c.q.data(),
                      c.k(), c.v(), att.data());
    snprintf(what, sizeof what, "gqa dq, %s (1e-5 + 1e-4 rel)", name);
    ok &= close(what, d1.q, d2.q, 1e-5, 1e-4);
    snprintf(what, sizeof what, "gqa dk%s, %s (1e-5 + 1e-4 rel)", c.vb.empty() ? " dv" : "", name);
    ok &= close(what, d1.kb, d2.kb, 1e-5, 1e-4);
    if (!c.vb.empty()) {
        snprintf(what, sizeof what, "gqa dv, %s (1e-5 + 1e-4 rel)", name);
        ok &= close(what, d1.vb, d2.vb, 1e-5, 1e-4);
    }
    return ok;
}

static void test_gqa(void **state) {
    (void)state;
    bool ok = true;
    /* LLaMA-tiny's heads (4 over 2 kv heads, D = 32) and wider groups; T = 100 and 77 are not
     * multiples of the 32-key tile. */
    ok &= gqa_against_cpu(gqa_make(2, 128, 128, 0, 4, 2, 32, true, true, false),
                          "causal packed kv B=2 T=128 H=4 Hkv=2 D=32");
    ok &= gqa_against_cpu(gqa_make(2, 100, 100, 0, 8, 2, 64, true, false, false),
                          "causal k, v B=2 T=100 H=8 Hkv=2 D=64");
    ok &= gqa_against_cpu(gqa_make(3, 77, 77, 0, 6, 3, 64, false, false, true),
                          "key mask (item 3 all dropped) B=3 T=77 H=6 Hkv=3");
    ok &= gqa_against_cpu(gqa_make(1, 128, 128, 0, 4, 1, 128, true, true, true),
                          "causal + mask, multi-query B=1 T=128 H=4 Hkv=1 D=128");
    /* A sequence shard: queries 60..99 of 100, every key (the T-sharded rule). */
    ok &= gqa_against_cpu(gqa_make(2, 40, 100, 60, 4, 2, 64, true, false, false),
                          "causal query shard Tq=40 of Tk=100 from 60");
    assert_true(ok);
}

static void test_gqa_fd(void **state) {
    (void)state;
    bool ok = true;
    for (int variant = 0; variant < 2; variant++) {
        const bool causal = variant == 0;
        gqa_case c = causal ? gqa_make(1, 21, 37, 16, 4, 2, 16, true, false, false)
                            : gqa_make(2, 37, 37, 0, 4, 2, 16, false, true, true);
        const ms_k_gqa &g = c.g;
        const int64_t no = g.b * g.tq * g.h * g.d;
        const fvec w = frand(no, -1, 1);
        fvec out(no), saved(g.b * g.h * g.tq + no);
        gqa_case d = c;
        std::fill(d.q.begin(), d.q.end(), 0.0f), std::fill(d.kb.begin(), d.kb.end(), 0.0f);
        std::fill(d.vb.begin(), d.vb.end(), 0.0f);
        gqa_forward_host(c, out.data(), saved.data());
        gqa_backward_host(c, d.q.data(), d.k(), d.v(), w.data(), saved.data());
        auto loss = [&]() {
            gqa_forward_host(c, out.data(), saved.data());
            return dot_loss(w, out);
        };
        ok &= fd_check(causal ? "gqa dq, causal query shard, vs finite diffs"
                              : "gqa dq, masked packed kv, vs finite diffs",
                       c.q, d.q, loss, 1e-2, 5e-4, 64);
        ok &= fd_check(causal ? "gqa dk, causal query shard, vs finite diffs"
                              : "gqa dk dv, masked packed kv, vs finite diffs",
                       c.kb, d.kb, loss, 1e-2, 5e-4, 64);
        if (causal)
            ok &= fd_check("gqa dv, causal query shard, vs finite diffs", c.vb, d.vb, loss, 1e-2,
                           5e-4, 64);
    }
    assert_true(ok);
}

/* ---- dropout: the same Philox words and the same mask as the CPU kernel, bit for bit ---- */
static void test_dropout(void **state) {
    (void)state;
    for (uint64_t i = 0; i < 100000; i += 7) {
        const uint64_t seed = 0x9E3779B97F4A7C15ull * (i + 1), stream = i % 5, idx = i * 977;
        if (ms_cu_philox_uniform(seed, stream, idx) != ms_philox_uniform(seed, stream, idx))
            fail_msg("philox uniform differs at index %llu", (unsigned long long)idx);
    }
    struct {
        int ndim;
        int64_t l[3], g0[3], gs[3];
        ms_k_batch_window w;
    } cases[] = {
        {3, {3, 5, 7}, {2, 0, 3}, {8, 5, 16}, {0, 0, 0}},
        {3, {4, 6, 8}, {0, 6, 0}, {12, 12, 8}, {2, 6, 1}}, /* a micro-batch's rows of a replica */
        {2, {6, 9}, {1, 9}, {7, 18}, {3, 4, 1}},
        {1, {33}, {5}, {40}, {0, 0, 0}},
        {0, {0}, {0}, {0}, {0, 0, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int nd = cases[c].ndim;
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= cases[c].l[d];
        std::vector<float> x(n), cpu(n, 0.5f), gpu(n, 0.5f), cpu_b(n, 0.25f), gpu_b(n, 0.25f);
        for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 13) - 6.0f;
        const ms_k_batch_window *w = cases[c].w.rows ? &cases[c].w : NULL;
        ms_k_dropout_forward(cpu.data(), x.data(), 0.3f, 42, 3, nd, cases[c].l, cases[c].g0,
                             cases[c].gs, w);
        ms_k_dropout_backward(cpu_b.data(), x.data(), 0.3f, 42, 3, nd, cases[c].l, cases[c].g0,
                              cases[c].gs, w);
        const ms_cu_box b = ms_cu_box_make(nd, cases[c].l, cases[c].g0, cases[c].gs,
                                           cases[c].w.rows, cases[c].w.stride, cases[c].w.offset);
        for (int64_t i = 0; i < n; i++) {
            ms_cu_dropout_elem(gpu.data(), x.data(), false, 0.3f, 42, 3, b, i);
            ms_cu_dropout_elem(gpu_b.data(), x.data(), true, 0.3f, 42, 3, b, i);
        }
        int64_t dropped = 0;
        for (int64_t i = 0; i < n; i++) {
            if (memcmp(&cpu[i], &gpu[i], sizeof(float)) || memcmp(&cpu_b[i], &gpu_b[i], 4))
                fail_msg("dropout case %zu element %lld: cpu %g/%g, cuda %g/%g", c, (long long)i,
                         cpu[i], cpu_b[i], gpu[i], gpu_b[i]);
            dropped += cpu[i] == 0.0f && x[i] != 0.0f;
        }
        printf("dropout case %zu: %lld elements, %lld dropped, identical\n", c, (long long)n,
               (long long)dropped);
    }
}

/* ---- the fused chains and gather: against engine/kernels/fused.c and index.c ---- */
static float worst_rel(const std::vector<float> &a, const std::vector<float> &b) {
    float w = 0;
    for (size_t i = 0; i < a.size(); i++) {
        const float d = fabsf(a[i] - b[i]) / (fabsf(b[i]) + 1e-3f);
        w = d > w ? d : w;
    }
    return w;
}

static void test_fused(void **state) {
    (void)state;
    const int64_t n = 24, c = 96; /* rows [B, T] = [4, 6] of a [8, 6, 96] tensor, replica 1 */
    std::vector<float> x(n * c), b(c), r(n * c), dy(n * c);
    for (int64_t i = 0; i < n * c; i++) {
        x[i] = sinf((float)i * 0.37f) * 3.0f;
        r[i] = cosf((float)i * 0.11f);
        dy[i] = sinf((float)i * 0.05f + 1.0f);
    }
    for (int64_t k = 0; k < c; k++) b[k] = 0.01f * (float)(k % 17) - 0.08f;
    /* bias + GELU */
    std::vector<float> cpu(n * c), gpu(n * c), dcx(n * c, 0.1f), dgx(n * c, 0.1f), dcb(c, 0.2f),
        dgb(c, 0.2f);
    ms_k_bias_gelu_forward(cpu.data(), x.data(), b.data(), n, c);
    for (int64_t i = 0; i < n * c; i++) ms_cu_bias_gelu_fwd(gpu.data(), x.data(), b.data(), c, i);
    ms_k_bias_gelu_backward(dcx.data(), dcb.data(), dy.data(), x.data(), b.data(), n, c);
    assert_true(
        colsum_bias_gelu_bwd(dgx.data(), dgb.data(), dy.data(), x.data(), b.data(), n, c, false));
    float w1 = worst_rel(gpu, cpu), w2 = worst_rel(dgx, dcx), w3 = worst_rel(dgb, dcb);
    printf("bias_gelu: forward %.2g, dinp %.2g, dbias %.2g (relative)\n", w1, w2, w3);
    /* tanhf: CUDA's against the CPU's polynomial */
    assert_true(w1 < 5e-5f && w2 < 5e-5f);
    /* dbias sums in another order (colsum_math.cuh) terms that differ by tanhf's: each side's
     * terms are its dinp from zero */
    fvec tg(n * c, 0.0f), tc(n * c, 0.0f);
    for (int64_t i = 0; i < n * c; i++) tg[i] += ms_cu_gelu_grad(x[i] + b[i % c]) * dy[i];
    ms_k_bias_gelu_backward(tc.data(), NULL, dy.data(), x.data(), b.data(), n, c);
    const dvec gelu_terms_diff = column_absdiff(tg, tc, n, c);
    const colsum_want wg = colsum_reference(n, c, fvec(c, 0.2f),
                                            [&](int64_t r0, int64_t k) { return tg[r0 * c + k]; });
    assert_true(close_colsum("bias_gelu dbias vs CPU (summation bound + the terms' difference)",
                             dgb, to_dvec(dcb), wg.mag, colsum_units_cpu(n), 0, &gelu_terms_diff));
    /* bias + dropout + residual, with a dropout box that has an offset and a batch window */
    const int64_t lshape[3] = {4, 6, 96}, gstart[3] = {2, 0, 0}, gshape[3] = {8, 6, 96};
    const ms_k_batch_window win = {2, 4, 1};
    for (float p : {0.0f, 0.25f}) {
        ms_k_fused_dropout d = {p, 1234, 5, {3, lshape, gstart, gshape, &win}};
        std::vector<float> co(n * c), go(n * c);
        std::vector<float> cdi(n * c, 0.1f), gdi(n * c, 0.1f), cdr(n * c, 0.3f), gdr(n * c, 0.3f);
        std::vector<float> cdb(c, 0.2f), gdb(c, 0.2f);
        ms_k_bias_dropout_add_forward(co.data(), x.data(), b.data(), r.data(), c, &d);
        ms_k_bias_dropout_add_backward(cdi.data(), cdb.data(), cdr.data(), dy.data(), c, &d);
        const ms_cu_box box = ms_cu_box_make(3, lshape, gstart, gshape, 2, 4, 1);
        for (int64_t i = 0; i < n * c; i++)
            ms_cu_bda_fwd(go.data(), x.data(), b.data(), r.data(), c, p, 1234, 5, box, i);
        assert_true(colsum_bda_bwd(gdi.data(), gdb.data(), gdr.data(), dy.data(), n, c, p, 1234, 5,
                                   box, false));
        int64_t dropped = 0;
        for (int64_t i = 0; i < n * c; i++) dropped += (co[i] == r[i]) && p > 0;
        const float v1 = worst_rel(go, co), v2 = worst_rel(gdi, cdi), v3 = worst_rel(gdb, cdb),
                    v4 = worst_rel(gdr, cdr);
        printf("bias_dropout_add p %.2f: %lld dropped; forward %.2g, dinp %.2g, dbias %.2g, dres "
               "%.2g\n",
               p, (long long)dropped, v1, v2, v3, v4);
        const float scale = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
        const colsum_want wb = colsum_reference(n, c, fvec(c, 0.2f), [&](int64_t r0, int64_t k) {
            const int64_t i = r0 * c + k;
            return ms_cu_bda_keep(p, 1234, 5, box, i) ? dy[i] * scale : 0.0f;
        });
        const bool okb = close_colsum("bias_dropout_add dbias vs CPU (summation bound)", gdb,
                                      to_dvec(cdb), wb.mag, colsum_units_cpu(n));
        assert_true(v1 < 1e-6f && v2 < 1e-6f && v4 == 0.0f && okb);
        if (p > 0) assert_true(dropped > n * c / 8 && dropped < n * c / 2);
    }
    /* gather and scatter-add per outer index (batch_gather): [O, D, I] rows d0.. */
    ms_k_gather_dims g = {3, 10, 4, 5, 2, false, true}; /* o, d, l, i, d0, per row, per outer */
    std::vector<float> xs(3 * 10 * 5), ids = {2, 5, 11, 9, 3, 3, 12, 0, 6, 7, 8, 2};
    for (size_t i = 0; i < xs.size(); i++) xs[i] = (float)i * 0.5f;
    std::vector<float> co(3 * 4 * 5), go(3 * 4 * 5), cs(xs.size(), 1.0f), gs(xs.size(), 1.0f);
    ms_k_gather(co.data(), xs.data(), ids.data(), &g, false);
    ms_k_scatter_add(cs.data(), co.data(), ids.data(), &g);
    for (int64_t e = 0; e < g.o * g.l * g.i; e++) {
        const int64_t j = e % g.i, li = (e / g.i) % g.l, a = e / (g.i * g.l);
        const int64_t row =
            ms_cu_gather_row(ids.data(), g.o, g.d, g.l, g.i, g.d0, false, true, a, li, j);
        go[e] = row < 0 ? 0.0f : xs[(a * g.d + row) * g.i + j];
        if (row >= 0) gs[(a * g.d + row) * g.i + j] += co[e];
    }
    assert_true(worst_rel(go, co) == 0.0f && worst_rel(gs, cs) == 0.0f);
}

/* ---- the column reductions (colsum_math.cuh) and the sum ---- */

/* What every column sum is held to: the same bits from a run in order and from one in a
 * shuffled thread order, the documented order's fp32 result bit for bit, float64 within the
 * two-pass order's bound (64 + chunks + 1 roundings: a chunk left out or added twice is far
 * outside it), and the CPU kernel within both orders' bounds (+ n), plus the terms' own
 * difference where the CPU computes them otherwise (extra). */
static bool colsum_checks(const char *what, int64_t n, const fvec &got, const fvec &again,
                          const colsum_want &w, const fvec &cpu, const dvec *extra = NULL) {
    char name[128];
    snprintf(name, sizeof name, "%s n=%lld: 2 runs, any order == documented order", what,
             (long long)n);
    bool ok = same_floats(name, got, w.order, &again);
    snprintf(name, sizeof name, "%s n=%lld vs float64", what, (long long)n);
    ok &= close_colsum(name, got, w.exact, w.mag, colsum_units(n));
    snprintf(name, sizeof name, "%s n=%lld vs the CPU kernel", what, (long long)n);
    ok &= close_colsum(name, got, to_dvec(cpu), w.mag, colsum_units_cpu(n), 0, extra);
    return ok;
}

static bool colsum_case_bias_add(int64_t n, int64_t c) {
    const fvec g = colsum_binades(n * c), d0 = frand(n * c, -1, 1), db0 = frand(c, -1, 1);
    fvec d1 = d0, d2 = d0, dc = d0, db1 = db0, db2 = db0, dbc = db0;
    bool ok = colsum_bias_add_bwd(d1.data(), db1.data(), g.data(), n, c, false);
    ok &= colsum_bias_add_bwd(d2.data(), db2.data(), g.data(), n, c, true);
    ms_k_bias_add_backward(dc.data(), dbc.data(), g.data(), n, c);
    ok &= same_floats("bias add dinp: 2 runs == CPU", d1, dc, &d2);
    /* fresh: dinp over NaNs is dout itself, and dbias is unchanged by it */
    fvec df(n * c, NAN), dbf = db0;
    ok &= colsum_bias_add_bwd(df.data(), dbf.data(), g.data(), n, c, true, true);
    ok &= same_floats("bias add fresh dinp (over NaN) == dout", df, g);
    ok &= same_floats("bias add fresh dbias == added dbias", dbf, db1);
    const colsum_want w =
        colsum_reference(n, c, db0, [&](int64_t r, int64_t j) { return g[r * c + j]; });
    return ok & colsum_checks("bias add dbias (many binades)", n, db1, db2, w, dbc);
}

static bool colsum_case_layernorm(int64_t n, int64_t c) {
    const fvec x = frand(n * c, -2, 3), g = frand(n * c, -1, 1), mean = frand(n, -0.5, 0.5),
               rstd = frand(n, 0.5, 2), dw0 = frand(c, -1, 1), db0 = frand(c, -1, 1);
    fvec dw1 = dw0, db1 = db0, dw2 = dw0, db2 = db0, dwc = dw0, dbc = db0;
    bool ok = colsum_layernorm_bwd(dw1.data(), db1.data(), g.data(), x.data(), mean.data(),
                                   rstd.data(), n, c, false);
    ok &= colsum_layernorm_bwd(dw2.data(), db2.data(), g.data(), x.data(), mean.data(), rstd.data(),
                               n, c, true);
    ms_k_layernorm_backward(NULL, dwc.data(), dbc.data(), g.data(), x.data(), NULL, mean.data(),
                            rstd.data(), n, c);
    const colsum_want ww = colsum_reference(n, c, dw0, [&](int64_t r, int64_t j) {
        return (x[r * c + j] - mean[r]) * rstd[r] * g[r * c + j];
    });
    const colsum_want wb =
        colsum_reference(n, c, db0, [&](int64_t r, int64_t j) { return g[r * c + j]; });
    ok &= colsum_checks("layernorm dweight", n, dw1, dw2, ww, dwc);
    return ok & colsum_checks("layernorm dbias", n, db1, db2, wb, dbc);
}

static bool colsum_case_bias_gelu(int64_t n, int64_t c) {
    const fvec x = frand(n * c, -5, 5), b = frand(c, -1, 1), g = frand(n * c, -1, 1),
               db0 = frand(c, -1, 1), zero(n * c, 0.0f);
    fvec d1 = zero, d2 = zero, dc = zero, db1 = db0, db2 = db0, dbc = db0;
    bool ok =
        colsum_bias_gelu_bwd(d1.data(), db1.data(), g.data(), x.data(), b.data(), n, c, false);
    ok &= colsum_bias_gelu_bwd(d2.data(), db2.data(), g.data(), x.data(), b.data(), n, c, true);
    ms_k_bias_gelu_backward(dc.data(), dbc.data(), g.data(), x.data(), b.data(), n, c);
    auto term = [&](int64_t r, int64_t j) {
        return 0.0f + ms_cu_gelu_grad(x[r * c + j] + b[j]) * g[r * c + j]; /* dinp's 0 + t */
    };
    fvec terms(n * c);
    for (int64_t i = 0; i < n * c; i++) terms[i] = term(i / c, i % c);
    /* dinp from zero is the terms: bitwise the kernel's, within tanhf's ulps of the CPU's */
    ok &= same_floats("bias gelu dinp: 2 runs == the terms", d1, terms, &d2);
    /* fresh: written over NaNs, the terms themselves (a -0 term stays -0, not 0 + -0) */
    fvec df(n * c, NAN), dbf = db0, bare(n * c);
    for (int64_t i = 0; i < n * c; i++) bare[i] = ms_cu_gelu_grad(x[i] + b[i % c]) * g[i];
    ok &=
        colsum_bias_gelu_bwd(df.data(), dbf.data(), g.data(), x.data(), b.data(), n, c, true, true);
    ok &= same_floats("bias gelu fresh dinp (over NaN) == the bare terms", df, bare);
    ok &= same_floats("bias gelu fresh dbias == added dbias", dbf, db1);
    ok &= close("bias gelu dinp vs CPU (tanhf vs poly: 2e-6 + 1e-6 rel)", d1, dc, 2e-6, 1e-6);
    const dvec extra = column_absdiff(d1, dc, n, c);
    return ok & colsum_checks("bias gelu dbias", n, db1, db2, colsum_reference(n, c, db0, term),
                              dbc, &extra);
}

/* Over an [n, c] box at row n of a [2n + 3, c] global tensor, p = 0.1. */
static bool colsum_case_bda(int64_t n, int64_t c) {
    const int64_t lshape[2] = {n, c}, gstart[2] = {n, 0}, gshape[2] = {2 * n + 3, c};
    const ms_cu_box box = ms_cu_box_make(2, lshape, gstart, gshape, 0, 0, 0);
    const float p = 0.1f;
    const ms_k_fused_dropout fd = {p, 99, 4, {2, lshape, gstart, gshape, NULL}};
    const fvec g = frand(n * c, -1, 1), r0 = frand(n * c, -1, 1), db0 = frand(c, -1, 1),
               zero(n * c, 0.0f);
    fvec d1 = zero, d2 = zero, dc = zero, r1 = r0, r2 = r0, rc = r0, db1 = db0, db2 = db0,
         dbc = db0;
    bool ok =
        colsum_bda_bwd(d1.data(), db1.data(), r1.data(), g.data(), n, c, p, 99, 4, box, false);
    ok &= colsum_bda_bwd(d2.data(), db2.data(), r2.data(), g.data(), n, c, p, 99, 4, box, true);
    ms_k_bias_dropout_add_backward(dc.data(), dbc.data(), rc.data(), g.data(), c, &fd);
    ok &= same_floats("bias dropout add dres: 2 runs == CPU", r1, rc, &r2);
    ok &= same_floats("bias dropout add dinp: 2 runs == CPU", d1, dc, &d2);
    /* fresh dinp and dres (bits 0 and 2) over NaNs: dinp as added to zeros, dres = dout */
    fvec df(n * c, NAN), rf(n * c, NAN), dbf = db0;
    ok &= colsum_bda_bwd(df.data(), dbf.data(), rf.data(), g.data(), n, c, p, 99, 4, box, true, 5u);
    ok &= same_floats("bias dropout add fresh dinp (over NaN) == from zeros", df, d1);
    ok &= same_floats("bias dropout add fresh dres (over NaN) == dout", rf, g);
    ok &= same_floats("bias dropout add fresh dbias == added dbias", dbf, db1);
    int64_t kept = 0;
    for (int64_t i = 0; i < n * c; i++) kept += d1[i] != 0.0f;
    const float scale = 1.0f / (1.0f - p);
    const colsum_want w = colsum_reference(n, c, db0, [&](int64_t r, int64_t j) {
        const int64_t i = r * c + j;
        return ms_cu_bda_keep(p, 99, 4, box, i) ? g[i] * scale : 0.0f;
    });
    printf("  bias dropout add n=%lld: %lld of %lld kept\n", (long long)n, (long long)kept,
           (long long)(n * c));
    ok &= n * c < 1000 || (kept > n * c * 8 / 10 && kept < n * c * 97 / 100);
    return ok & colsum_checks("bias dropout add dbias", n, db1, db2, w, dbc);
}

static bool colsum_case_rmsnorm(int64_t n, int64_t c) {
    const fvec x = frand(n * c, -3, 3), g = frand(n * c, -1, 1), rstd = frand(n, 0.3, 3),
               dw0 = frand(c, -1, 1);
    fvec dw1 = dw0, dw2 = dw0, dwc = dw0;
    bool ok = colsum_rms_bwd(dw1.data(), g.data(), x.data(), rstd.data(), n, c, false);
    ok &= colsum_rms_bwd(dw2.data(), g.data(), x.data(), rstd.data(), n, c, true);
    ms_k_rmsnorm_backward(NULL, dwc.data(), g.data(), x.data(), NULL, rstd.data(), n, c);
    const colsum_want w = colsum_reference(
        n, c, dw0, [&](int64_t r, int64_t j) { return g[r * c + j] * x[r * c + j] * rstd[r]; });
    return ok & colsum_checks("rmsnorm dweight", n, dw1, dw2, w, dwc);
}

/* Every backward's column reduction on rows around the chunk (fewer, one chunk, one more, not
 * a multiple) and on GPT-2 small's (B*T up to 8192 rows of 768, the MLP's 3072). */
static void test_colsum(void **state) {
    (void)state;
    struct {
        int64_t n, c;
    } const shapes[] = {{1, 768},    {37, 768},   {64, 768},   {65, 96},
                        {1000, 768}, {8192, 768}, {512, 3072}, {2048, 3072}};
    bool ok = true;
    for (const auto &sh : shapes) {
        printf(" n=%lld c=%lld\n", (long long)sh.n, (long long)sh.c);
        ok &= colsum_tiles(sh.n, sh.c, 2);
        ok &= colsum_case_bias_add(sh.n, sh.c);
        ok &= colsum_case_layernorm(sh.n, sh.c);
        ok &= colsum_case_bias_gelu(sh.n, sh.c);
        ok &= colsum_case_bda(sh.n, sh.c);
        ok &= colsum_case_rmsnorm(sh.n, sh.c);
    }
    for (int64_t n : {0, 63, 127, 128, 129, 100000}) ok &= colsum_tiles(n, 5, 1);
    assert_true(ok);
}

/* The sum over the middle dim of [O, D, I] as elementwise.cu runs it: a block per output
 * (lanes, then the tree) or one thread per output, as ms_cu_sum_by_blocks picks. */
static fvec sum_forward(const fvec &x, int64_t o, int64_t d, int64_t i) {
    fvec out(o * i);
    for (int64_t k = 0; k < o * i; k++) {
        if (!ms_cu_sum_by_blocks(o, d, i)) {
            out[k] = ms_cu_sum_part(x.data(), d, i, k, 0, 1);
            continue;
        }
        float v[L];
        for (int l = 0; l < L; l++) v[l] = ms_cu_sum_part(x.data(), d, i, k, l, L);
        out[k] = ms_cu_lanes_sum(v, L);
    }
    return out;
}

static void test_sum(void **state) {
    (void)state;
    bool ok = ms_cu_sum_by_blocks(1, 8192, 1) && !ms_cu_sum_by_blocks(8192, 512, 1) &&
              !ms_cu_sum_by_blocks(1, 100, 1);
    printf("  GPT-2's loss mean (o 1, d 8192, i 1) by blocks: %d; 8192 outputs by threads: %d\n",
           ms_cu_sum_by_blocks(1, 8192, 1), !ms_cu_sum_by_blocks(8192, 512, 1));
    struct {
        int64_t o, d, i;
    } const shapes[] = {{1, 8192, 1}, {3, 1000, 5}, {2, 257, 7}, {64, 100, 80}, {8, 512, 1024}};
    for (const auto &sh : shapes) {
        const int64_t o = sh.o, d = sh.d, i = sh.i;
        const fvec x = colsum_binades(o * d * i);
        fvec got = sum_forward(x, o, d, i), cpu(o * i);
        ms_k_sum_forward(cpu.data(), x.data(), o, d, i);
        dvec exact(o * i, 0.0), mag(o * i, 0.0);
        for (int64_t a = 0; a < o; a++)
            for (int64_t b = 0; b < d; b++)
                for (int64_t e = 0; e < i; e++) {
                    exact[a * i + e] += x[(a * d + b) * i + e];
                    mag[a * i + e] += fabs((double)x[(a * d + b) * i + e]);
                }
        char name[96];
        const bool blocks = ms_cu_sum_by_blocks(o, d, i);
        if (!blocks) { /* one thread per output: the CPU's order */
            snprintf(name, sizeof name, "sum o=%lld d=%lld i=%lld by threads == CPU", (long long)o,
                     (long long)d, (long long)i);
            ok &= same_floats(name, got, cpu);
            continue;
        }
        /* a lane sums ceil(d / L) terms, then the tree's log2(L) levels */
        int lv = 0;
        for (int s = L; s > 1; s /= 2) lv++;
        const double units = (double)((d + L - 1) / L + lv + 1);
        snprintf(name, sizeof name, "sum o=%lld d=%lld i=%lld by blocks vs float64", (long long)o,
                 (long long)d, (long long)i);
        ok &= close_colsum(name, got, exact, mag, units);
        snprintf(name, sizeof name, "sum o=%lld d=%lld i=%lld by blocks vs CPU", (long long)o,
                 (long long)d, (long long)i);
        ok &= close_colsum(name, got, to_dvec(cpu), mag, units + (double)d);
        ok &= same_floats("  run again (bitwise)", sum_forward(x, o, d, i), got);
    }
    assert_true(ok);
}

/* ---- convolution (conv_math.cuh): conv.cu's plan on the host ---- */

/* A geometry: n images of c_x channels read from c0, groups of cin_g -> cout_g, an h x w input,
 * a kh x kw kernel, the same stride, padding and dilation along both dims (h = kh = 1: conv1d,
 * whose H is 1 with stride and dilation 1 and no padding). */
static ms_k_conv conv_case(int64_t n, int64_t c_x, int64_t c0, int64_t groups, int64_t cin_g,
                           int64_t cout_g, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t s,
                           int64_t p, int64_t d) {
    ms_k_conv g = {};
    g.n = n, g.c_x = c_x, g.c0 = c0, g.groups = groups, g.cin_g = cin_g, g.cout_g = cout_g;
    g.h = h, g.w = w, g.kh = kh, g.kw = kw, g.sw = s, g.pw = p, g.dw = d;
    g.sh = h == 1 ? 1 : s, g.ph = h == 1 ? 0 : p, g.dh = h == 1 ? 1 : d;
    g.oh = ms_k_conv_out_size(g.h, g.kh, g.sh, g.ph, g.dh);
    g.ow = ms_k_conv_out_size(g.w, g.kw, g.sw, g.pw, g.dw);
    return g;
}

/* The columns of image i as conv.cu makes them: x itself when pointwise, else every group's
 * im2col element by element. */
static const float *cu_columns(const ms_k_conv &g, fvec &col, const float *x, int64_t i) {
    const float *xi = x + (i * g.c_x + g.c0) * g.h * g.w;
    if (ms_k_conv_pointwise(&g)) return xi;
    for (int64_t j = 0; j < ms_cu_conv_col_floats(g); j++)
        ms_cu_conv_im2col_elem(col.data(), xi, g, j);
    return col.data();
}

static void cu_conv_forward(const ms_k_conv &g, float *out, const float *x, const float *w,
                            const float *bias) {
    fvec col(ms_cu_conv_col_floats(g));
    const int64_t cout = g.groups * g.cout_g, ohw = g.oh * g.ow;
    for (int64_t i = 0; bias && i < g.n * cout * ohw; i++)
        ms_cu_conv_bias_elem(out, bias, cout, ohw, i);
    const ms_k_gemm p = ms_cu_conv_fwd_gemm(g);
    for (int64_t i = 0; i < g.n; i++)
        ms_k_matmul_forward(&p, out + i * cout * ohw, w, cu_columns(g, col, x, i), 1.0f,
                            bias ? 1.0f : 0.0f);
}

static void cu_conv_backward(const ms_k_conv &g, float *dx, float *dw, float *db, const float *dy,
                             const float *x, const float *w) {
    fvec col(ms_cu_conv_col_floats(g));
    const int64_t cout = g.groups * g.cout_g, ohw = g.oh * g.ow, hw = g.h * g.w;
    for (int64_t c = 0; c < cout; c++)
        db[c] += lanes_sum([&](int l, int nl) { return ms_cu_conv_dbias_part(dy, g, c, l, nl); });
    const ms_k_gemm pw = ms_cu_conv_dw_gemm(g), px = ms_cu_conv_dx_gemm(g);
    for (int64_t i = 0; i < g.n; i++) {
        const float *dyi = dy + i * cout * ohw;
        ms_k_matmul_forward(&pw, dw, dyi, cu_columns(g, col, x, i), 1.0f, 1.0f);
        float *dxi = dx + (i * g.c_x + g.c0) * hw;
        if (ms_k_conv_pointwise(&g)) {
            ms_k_matmul_forward(&px, dxi, w, dyi, 1.0f, 1.0f);
            continue;
        }
        ms_k_matmul_forward(&px, col.data(), w, dyi, 1.0f, 0.0f);
        for (int64_t j = 0; j < g.groups * g.cin_g * hw; j++)
            ms_cu_conv_col2im_elem(dxi, col.data(), g, j);
    }
}

/* im2col and col2im against conv.c's, bit for bit; the forward and backward against conv.c's
 * kernels within fp32 summation (the same products, another order of the groups' calls). */
static bool conv_check(const char *name, const ms_k_conv &g) {
    const int64_t cout = g.groups * g.cout_g, k = g.cin_g * g.kh * g.kw, ohw = g.oh * g.ow;
    const int64_t hw = g.h * g.w, ch = g.groups * g.cin_g;
    const fvec x = frand(g.n * g.c_x * hw, -1, 1), w = frand(cout * k, -1, 1);
    const fvec b = frand(cout, -1, 1), dy = frand(g.n * cout * ohw, -1, 1);
    char what[128];
    bool ok = true;
    if (!ms_k_conv_pointwise(&g)) {
        fvec cu(ms_cu_conv_col_floats(g)), cpu(cu.size());
        const float *x0 = x.data() + g.c0 * hw;
        for (int64_t j = 0; j < (int64_t)cu.size(); j++)
            ms_cu_conv_im2col_elem(cu.data(), x0, g, j);
        for (int64_t grp = 0; grp < g.groups; grp++)
            ms_k_im2col(cpu.data() + grp * k * ohw, x0 + grp * g.cin_g * hw, g.cin_g, &g);
        snprintf(what, sizeof what, "%s im2col == CPU", name);
        ok &= same_floats(what, cu, cpu);
        const fvec cols = frand(cu.size(), -1, 1), d0 = frand(ch * hw, -1, 1);
        fvec dcu = d0, dcpu = d0;
        for (int64_t j = 0; j < ch * hw; j++) ms_cu_conv_col2im_elem(dcu.data(), cols.data(), g, j);
        ms_k_col2im(dcpu.data(), cols.data(), ch, &g);
        snprintf(what, sizeof what, "%s col2im == CPU", name);
        ok &= same_floats(what, dcu, dcpu);
    }
    fvec ycu(dy.size()), ycpu(dy.size()), scratch(ms_k_conv_scratch_floats(&g) + 1);
    cu_conv_forward(g, ycu.data(), x.data(), w.data(), b.data());
    ms_k_conv_forward(&g, ycpu.data(), scratch.data(), x.data(), w.data(), b.data());
    /* The two sides sum each output's terms in different orders (the CPU's direct kernels by
     * tiles of channels and taps), so the fp32 rounding allowed grows with the terms summed:
     * k for an output, cout_g x taps for an input gradient, n x positions for dw. A wrong
     * kernel is off by the values' own scale (~0.1 and up), far above any of these. */
    const double out_terms = (double)k, dx_terms = (double)(g.cout_g * g.kh * g.kw);
    snprintf(what, sizeof what, "%s forward vs CPU", name);
    ok &= close(what, ycu, ycpu, 1e-5 + 1e-7 * out_terms, 1e-5);
    fvec dx0 = frand(x.size(), -1, 1), dw0 = frand(w.size(), -1, 1), db0 = frand(cout, -1, 1);
    fvec dxc = dx0, dwc = dw0, dbc = db0, dxp = dx0, dwp = dw0, dbp = db0;
    cu_conv_backward(g, dxc.data(), dwc.data(), dbc.data(), dy.data(), x.data(), w.data());
    ms_k_conv_backward(&g, dxp.data(), dwp.data(), dbp.data(), scratch.data(), dy.data(), x.data(),
                       w.data(), false);
    const double sums = (double)(g.n * ohw); /* dw's and dbias's terms */
    snprintf(what, sizeof what, "%s dx vs CPU", name);
    ok &= close(what, dxc, dxp, 1e-5 + 1e-7 * dx_terms, 1e-5);
    snprintf(what, sizeof what, "%s dw vs CPU", name);
    ok &= close(what, dwc, dwp, 1e-6 * sums, 1e-5);
    snprintf(what, sizeof what, "%s dbias vs CPU", name);
    ok &= close(what, dbc, dbp, 1e-6 * sums, 1e-5);
    return ok;
}

static void test_conv(void **state) {
    (void)state;
    bool ok = true;
    /* n, c_x, c0, groups, cin_g, cout_g, h, w, kh, kw, stride, pad, dilation */
    ok &= conv_check("3x3 pad 1", conv_case(2, 3, 0, 1, 3, 4, 6, 5, 3, 3, 1, 1, 1));
    ok &= conv_check("stride 2 pad 2 dilation 2", conv_case(2, 4, 0, 1, 4, 3, 9, 8, 3, 2, 2, 2, 2));
    ok &= conv_check("groups 2 read from channel 4 of 8",
                     conv_case(2, 8, 4, 2, 2, 3, 5, 5, 3, 3, 1, 0, 1));
    ok &= conv_check("pointwise groups 2", conv_case(2, 6, 0, 2, 3, 2, 4, 3, 1, 1, 1, 0, 1));
    ok &= conv_check("pointwise from channel 1", conv_case(2, 5, 1, 1, 3, 4, 4, 4, 1, 1, 1, 0, 1));
    ok &=
        conv_check("conv1d stride 2 dilation 3", conv_case(3, 4, 0, 2, 2, 3, 1, 20, 1, 4, 2, 3, 3));
    ok &= conv_check("ResNet stem 7x7 s2 p3", conv_case(2, 3, 0, 1, 3, 16, 32, 32, 7, 7, 2, 3, 1));
    ok &= conv_check("ResNet 3x3 64 -> 64", conv_case(2, 64, 0, 1, 64, 64, 28, 28, 3, 3, 1, 1, 1));
    ok &= conv_check("MobileNet depthwise 3x3 s2",
                     conv_case(2, 32, 0, 32, 1, 1, 16, 16, 3, 3, 2, 1, 1));
    ok &= conv_check("wav2vec conv1d 10 s5", conv_case(2, 1, 0, 1, 1, 32, 1, 400, 1, 10, 5, 0, 1));
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_fused),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_elementwise_fd),
        cmocka_unit_test(test_elementwise_bf16),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_layernorm_fd),
        cmocka_unit_test(test_layernorm_bf16),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_xent),
        cmocka_unit_test(test_xent_fd),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adamw_list),
        cmocka_unit_test(test_cast_list),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_sumsq_list),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_fd),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rmsnorm_fd),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_rotary),
        cmocka_unit_test(test_gqa),
        cmocka_unit_test(test_gqa_fd),
        cmocka_unit_test(test_colsum),
        cmocka_unit_test(test_sum),
        cmocka_unit_test(test_conv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

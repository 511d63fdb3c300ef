/* test_cuda_host_flash.cu - bf16 flash attention on the tensor cores (engine/kernels/cuda/
 * flash_math.cuh), its three kernel bodies run on the CPU block by block under
 * tests/cuda_simt_host.h (a host thread per GPU thread, the tensor cores' product assembled
 * from the PTX ISA's fragment layouts), against attention computed in double from the same
 * bf16 inputs.
 *
 * Cases: GPT-2's packed qkv (causal, T not a multiple of the 64-row tiles, two batch items);
 * an additive mask with a query row that sees no key; head sizes 16, 32, 48 and 64; grouped-
 * query attention over separate strided q, k, v with fewer queries than keys starting at a
 * global position (context parallelism's layout) and keep flags. The gradients are added to
 * buffers that hold values already, as the engine's accumulation does.
 *
 * Tolerances come from bf16: the kernels round the probabilities and dS to bf16 (relative
 * error 2^-9) before their second product, and each output once; the bounds below are a few
 * times that, against the largest value of each output, and a wrong fragment layout or tile
 * index gives errors of the order of the outputs themselves.
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

#include "engine/kernels/cuda/flash_math.cuh"
#include "tests/cuda_simt_host.h"
#include "tests/cuda_testkit.cuh"

typedef std::vector<uint16_t> hvec;

/* One attention problem: q [B, Tq, q_ld], k and v [B, Tk, kv_ld], dout and out
 * [B, Tq, out_ld], heads at h * HS within a row. */
struct problem {
    int64_t b, tq, tk, h, hkv, hs, q_start;
    bool causal, keep_mask, masked;
    hvec q, k, v, dout, out, dq, dk, dv;
    fvec mask, lse, o_f32, delta;
    int64_t q_ld, kv_ld, out_ld;
};

static problem make_problem(int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t hkv, int64_t hs,
                            int64_t q_start, bool causal, bool masked, bool keep_mask) {
    problem p{};
    p.b = b, p.tq = tq, p.tk = tk, p.h = h, p.hkv = hkv, p.hs = hs, p.q_start = q_start;
    p.causal = causal, p.masked = masked, p.keep_mask = keep_mask;
    /* Row strides wider than the heads (and multiples of 8), as a packed or strided layout. */
    p.q_ld = h * hs + 8, p.kv_ld = hkv * hs + 16, p.out_ld = h * hs;
    p.q = to_bf16(frand(b * tq * p.q_ld, -1.5, 1.5));
    p.k = to_bf16(frand(b * tk * p.kv_ld, -1.5, 1.5));
    p.v = to_bf16(frand(b * tk * p.kv_ld, -1, 1));
    p.dout = to_bf16(frand(b * tq * p.out_ld, -1, 1));
    p.dq = to_bf16(frand(b * tq * p.q_ld, -0.5, 0.5));
    p.dk = to_bf16(frand(b * tk * p.kv_ld, -0.5, 0.5));
    p.dv = to_bf16(frand(b * tk * p.kv_ld, -0.5, 0.5));
    p.out.assign(b * tq * p.out_ld, 0);
    p.lse.assign(b * h * tq, 0.0f);
    p.o_f32.assign(b * tq * h * hs, 0.0f);
    p.delta.assign(b * h * tq, 0.0f);
    if (masked) {
        /* Additive: drop key 0 (so a causal row 0 sees nothing), every 7th key, and the last
         * keys of the second batch item; keep flags: 0 drops. */
        p.mask.assign(b * tk, keep_mask ? 1.0f : 0.0f);
        for (int64_t bi = 0; bi < b; bi++)
            for (int64_t j = 0; j < tk; j++) {
                const bool drop = j == 0 || j % 7 == 3 || (bi == 1 && j >= tk - 5);
                if (drop)
                    p.mask[bi * tk + j] = keep_mask ? 0.0f : -INFINITY;
                else if (!keep_mask)
                    p.mask[bi * tk + j] = (float)(0.25 * urand());
            }
    }
    return p;
}

static ms_fa_args args_of(problem &p) {
    ms_fa_args a{};
    a.q = p.q.data(), a.k = p.k.data(), a.v = p.v.data(), a.dout = p.dout.data();
    a.out = p.out.data(), a.dq = p.dq.data(), a.dk = p.dk.data(), a.dv = p.dv.data();
    a.lse = p.lse.data(), a.o_f32 = p.o_f32.data(), a.delta = p.delta.data();
    a.mask = p.masked ? p.mask.data() : NULL;
    a.tq = p.tq, a.tk = p.tk, a.h = p.h, a.hkv = p.hkv, a.hs = p.hs;
    a.q_ld = p.q_ld, a.kv_ld = p.kv_ld, a.out_ld = p.out_ld, a.q_start = p.q_start;
    a.causal = p.causal, a.keep_mask = p.keep_mask;
    a.scale = 1.0f / sqrtf((float)p.hs);
    return a;
}

/* Every block of a grid (x: row blocks, y: heads, z: batch items), one after another. */
template <int HS, class Body> static void run_grid(int64_t xs, int64_t ys, int64_t zs, Body body) {
    for (int64_t z = 0; z < zs; z++)
        for (int64_t y = 0; y < ys; y++)
            for (int64_t x = 0; x < xs; x++) {
                std::vector<uint16_t> smem(MS_FA_SMEM_BF16(HS));
                std::vector<float> fsmem(MS_FA_SMEM_FLOATS);
                simt_run_block(MS_FA_THREADS,
                               [&](simt_cx &cx) { body(cx, x, y, z, smem.data(), fsmem.data()); });
            }
}

template <int HS> static void flash_forward(problem &p) {
    const ms_fa_args a = args_of(p);
    run_grid<HS>((p.tq + MS_FA_ROWS - 1) / MS_FA_ROWS, p.h, p.b,
                 [&](simt_cx &cx, int64_t x, int64_t y, int64_t z, uint16_t *sm, float *fs) {
                     ms_fa_forward_block<HS>(cx, a, x, y, z, sm, fs);
                 });
}

template <int HS> static void flash_backward(problem &p, bool fresh = false) {
    /* delta_i = dO_i . O_i from the forward's fp32 output, as attention.cu computes it. */
    for (int64_t bi = 0; bi < p.b; bi++)
        for (int64_t h = 0; h < p.h; h++)
            for (int64_t i = 0; i < p.tq; i++) {
                float s = 0;
                for (int64_t d = 0; d < p.hs; d++)
                    s += ms_f32_from_bf16(p.dout[(bi * p.tq + i) * p.out_ld + h * p.hs + d]) *
                         p.o_f32[((bi * p.tq + i) * p.h + h) * p.hs + d];
                p.delta[(bi * p.h + h) * p.tq + i] = s;
            }
    ms_fa_args a = args_of(p);
    a.fresh = fresh;
    run_grid<HS>((p.tq + MS_FA_ROWS - 1) / MS_FA_ROWS, p.h, p.b,
                 [&](simt_cx &cx, int64_t x, int64_t y, int64_t z, uint16_t *sm, float *fs) {
                     ms_fa_dq_block<HS>(cx, a, x, y, z, sm, fs);
                 });
    run_grid<HS>((p.tk + MS_FA_ROWS - 1) / MS_FA_ROWS, p.hkv, p.b,
                 [&](simt_cx &cx, int64_t x, int64_t y, int64_t z, uint16_t *sm, float *fs) {
                     ms_fa_dkv_block<HS>(cx, a, x, y, z, sm, fs);
                 });
}

static double bf(uint16_t h) {
    return (double)ms_f32_from_bf16(h);
}

/* The reference in double from the same bf16 inputs: out, lse, and dq, dk, dv added to the
 * buffers' initial values. */
struct reference {
    std::vector<double> out, lse, dq, dk, dv;
};

static reference reference_of(const problem &p, const hvec &dq0, const hvec &dk0, const hvec &dv0) {
    reference r;
    const int64_t hs = p.hs, group = p.h / p.hkv;
    const double scale = 1.0 / sqrt((double)hs);
    r.out.assign(p.b * p.tq * p.out_ld, 0.0);
    r.lse.assign(p.b * p.h * p.tq, -INFINITY);
    r.dq.resize(dq0.size()), r.dk.resize(dk0.size()), r.dv.resize(dv0.size());
    for (size_t i = 0; i < dq0.size(); i++) r.dq[i] = bf(dq0[i]);
    for (size_t i = 0; i < dk0.size(); i++) r.dk[i] = bf(dk0[i]);
    for (size_t i = 0; i < dv0.size(); i++) r.dv[i] = bf(dv0[i]);
    std::vector<double> s(p.tk), pr(p.tk), dp(p.tk);
    for (int64_t bi = 0; bi < p.b; bi++)
        for (int64_t h = 0; h < p.h; h++) {
            const int64_t kvh = h / group;
            for (int64_t i = 0; i < p.tq; i++) {
                const uint16_t *qi = &p.q[(bi * p.tq + i) * p.q_ld + h * hs];
                const uint16_t *gi = &p.dout[(bi * p.tq + i) * p.out_ld + h * hs];
                double mx = -INFINITY;
                for (int64_t j = 0; j < p.tk; j++) {
                    const uint16_t *kj = &p.k[(bi * p.tk + j) * p.kv_ld + kvh * hs];
                    double dot = 0;
                    for (int64_t d = 0; d < hs; d++) dot += bf(qi[d]) * bf(kj[d]);
                    double m = 0;
                    if (p.masked) {
                        const float mv = p.mask[bi * p.tk + j];
                        m = p.keep_mask ? (mv != 0.0f ? 0.0 : -INFINITY) : (double)mv;
                    }
                    s[j] = (p.causal && j > p.q_start + i) ? -INFINITY : scale * dot + m;
                    mx = std::max(mx, s[j]);
                }
                if (mx == -INFINITY) continue; /* sees no key: zeros, lse -inf, no gradient */
                double sum = 0;
                for (int64_t j = 0; j < p.tk; j++) sum += pr[j] = exp(s[j] - mx);
                r.lse[(bi * p.h + h) * p.tq + i] = mx + log(sum);
                double delta = 0;
                for (int64_t d = 0; d < hs; d++) {
                    double o = 0;
                    for (int64_t j = 0; j < p.tk; j++)
                        o += pr[j] / sum * bf(p.v[(bi * p.tk + j) * p.kv_ld + kvh * hs + d]);
                    r.out[(bi * p.tq + i) * p.out_ld + h * hs + d] = o;
                    delta += o * bf(gi[d]);
                }
                for (int64_t j = 0; j < p.tk; j++) {
                    const double pj = pr[j] / sum;
                    if (pj == 0) continue;
                    const int64_t kv = (bi * p.tk + j) * p.kv_ld + kvh * hs;
                    double dpj = 0;
                    for (int64_t d = 0; d < hs; d++) dpj += bf(gi[d]) * bf(p.v[kv + d]);
                    const double ds = pj * (dpj - delta);
                    for (int64_t d = 0; d < hs; d++) {
                        r.dq[(bi * p.tq + i) * p.q_ld + h * hs + d] += scale * ds * bf(p.k[kv + d]);
                        r.dk[kv + d] += scale * ds * bf(qi[d]);
                        r.dv[kv + d] += pj * bf(gi[d]);
                    }
                }
            }
        }
    return r;
}

/* got (bf16) against want within atol = tol * max|want - base| (the output's own scale) plus
 * one bf16 rounding of want. */
static bool near(const char *what, const hvec &got, const std::vector<double> &want,
                 const hvec *base, double tol) {
    double scale = 0;
    for (size_t i = 0; i < want.size(); i++)
        scale = std::max(scale, fabs(want[i] - (base ? bf((*base)[i]) : 0.0)));
    fvec g(got.size()), w(want.size());
    for (size_t i = 0; i < got.size(); i++) g[i] = (float)bf(got[i]), w[i] = (float)want[i];
    return close(what, g, w, tol * scale, BF16_RTOL);
}

template <int HS>
static bool check(const char *name, int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t hkv,
                  int64_t q_start, bool causal, bool masked, bool keep_mask) {
    problem p = make_problem(b, tq, tk, h, hkv, HS, q_start, causal, masked, keep_mask);
    const hvec dq0 = p.dq, dk0 = p.dk, dv0 = p.dv;
    flash_forward<HS>(p);
    flash_backward<HS>(p);
    const reference r = reference_of(p, dq0, dk0, dv0);
    printf("%s: B=%lld Tq=%lld Tk=%lld H=%lld Hkv=%lld HS=%d q_start=%lld%s%s\n", name,
           (long long)b, (long long)tq, (long long)tk, (long long)h, (long long)hkv, HS,
           (long long)q_start, causal ? " causal" : "", masked ? " masked" : "");
    bool ok = near("  out", p.out, r.out, NULL, 8e-3);
    /* lse: -inf exactly where the reference has it, else within 4e-3 */
    bool lse_ok = true;
    double worst = 0;
    for (size_t i = 0; i < r.lse.size(); i++) {
        if (std::isinf(r.lse[i]) || std::isinf(p.lse[i])) {
            lse_ok &= std::isinf(r.lse[i]) && std::isinf(p.lse[i]);
            continue;
        }
        worst = std::max(worst, fabs(p.lse[i] - r.lse[i]));
    }
    printf("  %-50s worst |err| %.3g (tolerance 4e-3)%s\n", "lse", worst,
           lse_ok && worst <= 4e-3 ? "" : "  FAIL");
    ok &= lse_ok && worst <= 4e-3;
    ok &= near("  dq (+= into values)", p.dq, r.dq, &dq0, 2e-2);
    ok &= near("  dk (+= into values)", p.dk, r.dk, &dk0, 2e-2);
    ok &= near("  dv (+= into values)", p.dv, r.dv, &dv0, 2e-2);
    /* Fresh: the gradients written whole over NaNs, every row once; the row of each q, k, v
     * head that no head owns (the stride's padding) keeps its NaN, and is not compared. */
    const hvec nan(p.dq.size(), 0x7fc0), nank(p.dk.size(), 0x7fc0), zq(p.dq.size(), 0),
        zk(p.dk.size(), 0);
    p.dq = nan, p.dk = nank, p.dv = nank;
    flash_backward<HS>(p, true);
    reference r0 = reference_of(p, zq, zk, zk);
    for (size_t i = 0; i < p.dq.size(); i++)
        if ((int64_t)(i % p.q_ld) >= p.h * p.hs) p.dq[i] = 0;
    for (size_t i = 0; i < p.dk.size(); i++)
        if ((int64_t)(i % p.kv_ld) >= p.hkv * p.hs) p.dk[i] = p.dv[i] = 0;
    ok &= near("  dq fresh (over NaNs)", p.dq, r0.dq, NULL, 2e-2);
    ok &= near("  dk fresh (over NaNs)", p.dk, r0.dk, NULL, 2e-2);
    ok &= near("  dv fresh (over NaNs)", p.dv, r0.dv, NULL, 2e-2);
    return ok;
}

/* The matrix loads the kernel bodies make (ms_fa_scores: plain, two k-steps of K's rows;
 * ms_fa_times_tile: transposed, two 8-column groups of V's rows) give, register for register,
 * the B fragments that the product's layout asks for, loaded lane by lane: the ldmatrix and
 * mma layouts of mma_math.cuh agree for the addresses the bodies give. */
static void test_matrix_loads(void **state) {
    (void)state;
    const int ldt = MS_FA_LDT(64);
    std::vector<uint16_t> tile(MS_FA_TILE * ldt);
    for (size_t i = 0; i < tile.size(); i++) tile[i] = (uint16_t)(i * 2654435761u >> 7);
    int bad = 0;
    simt_run_block(32, [&](simt_cx &cx) {
        const int lane = cx.lane(), i = lane / 8;
        for (int n0 = 0; n0 < MS_FA_TILE; n0 += 8)
            for (int k0 = 0; k0 < 64; k0 += 32) {
                uint32_t b[4], want[2];
                cx.ldsm(b, 4, false, tile.data() + (n0 + lane % 8) * ldt + k0 + 8 * i);
                for (int step = 0; step < 2; step++) {
                    ms_cu_mma_load_b_rows(want, lane, tile.data(), ldt, n0, k0 + 16 * step);
                    if (b[2 * step] != want[0] || b[2 * step + 1] != want[1]) bad++;
                }
            }
        for (int k0 = 0; k0 < MS_FA_TILE; k0 += 16)
            for (int n0 = 0; n0 < 64; n0 += 16) {
                uint32_t b[4], want[2];
                cx.ldsm(b, 4, true,
                        tile.data() + (k0 + lane % 8 + 8 * (i % 2)) * ldt + n0 + 8 * (i / 2));
                for (int grp = 0; grp < 2; grp++) {
                    ms_cu_mma_load_b_cols(want, lane, tile.data(), ldt, k0, n0 + 8 * grp);
                    if (b[2 * grp] != want[0] || b[2 * grp + 1] != want[1]) bad++;
                }
            }
    });
    printf("matrix loads against lane-by-lane B fragments: %d registers differ\n", bad);
    assert_int_equal(bad, 0);
}

static void test_packed_causal(void **state) {
    (void)state;
    /* GPT-2's layout, 2 heads of 64, 100 positions: two row blocks, the second partial. */
    assert_true(check<64>("gpt-2 causal", 2, 100, 100, 2, 2, 0, true, false, false));
}

static void test_masked(void **state) {
    (void)state;
    bool ok = check<64>("additive mask", 2, 77, 77, 2, 2, 0, false, true, false);
    ok &= check<32>("additive mask, causal (row 0 sees no key)", 2, 70, 70, 1, 1, 0, true, true,
                    false);
    assert_true(ok);
}

static void test_head_sizes(void **state) {
    (void)state;
    bool ok = check<16>("head size 16", 1, 130, 130, 2, 2, 0, true, false, false);
    ok &= check<48>("head size 48", 1, 65, 65, 1, 1, 0, true, false, false);
    ok &= check<80>("head size 80, masked", 1, 70, 70, 1, 1, 0, false, true, false);
    ok &= check<96>("head size 96", 1, 66, 66, 1, 1, 0, true, false, false);
    /* LLaMA's: 4 query heads over 2 kv heads of 128, queries from position 30 */
    ok &= check<128>("head size 128, gqa", 1, 70, 100, 4, 2, 30, true, false, false);
    assert_true(ok);
}

static void test_gqa_offset(void **state) {
    (void)state;
    /* 4 query heads over 2 kv heads; 50 queries at positions 70.. over 120 keys; keep flags. */
    bool ok = check<32>("gqa, queries from position 70", 1, 50, 120, 4, 2, 70, true, true, true);
    ok &= check<16>("gqa, not causal", 2, 40, 90, 4, 1, 0, false, false, false);
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matrix_loads), cmocka_unit_test(test_packed_causal),
        cmocka_unit_test(test_masked),       cmocka_unit_test(test_head_sizes),
        cmocka_unit_test(test_gqa_offset),
    };
    return cmocka_run_group_tests_name("cuda_host_flash", tests, NULL, NULL);
}

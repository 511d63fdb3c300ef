/* test_cuda_host_bf16.cu - the bf16 kernels of the GPT-2 hot path against the staging rule,
 * on the CPU without a GPU.
 *
 * A bf16 program hands an op its bf16 buffers unstaged only if the op's bf16 kernel writes
 * exactly what staging writes: widen every operand, run the fp32 kernel, round each output once
 * (engine/graph/program_precision.c). The CUDA kernels of add, bias add, GELU, bias + GELU,
 * bias + dropout + residual add, dropout, LayerNorm, attention, the vocab-parallel
 * cross-entropy and the embedding (lookup and sorted scatter-add) are one template over the storage
 * type (elementwise_math.cuh, fused_math.cuh, norm_math.cuh; attention.cu widens as it stages
 * tiles), so the check is on the templates as the launchers call them (per element, per
 * (row chunk, column) and per column, per row over MS_CU_ROW_LANES lanes, attention's tiles of
 * attention.cu):
 * the ms_bf16 instantiation on bf16 operands equals, bit for bit, the float instantiation on
 * the widened operands, rounded once - accumulated gradients included. The float
 * instantiations themselves are checked against the CPU kernels and finite differences by
 * test_cuda_host.cu; here the bf16 results are also held against the CPU kernels (one bf16
 * ulp; column sums, which add in another order, one ulp plus both orders' summation bound), so
 * a kernel that rounded twice or read a parameter in the wrong type fails either way.
 * Shapes are GPT-2 small's: rows of 768, the MLP's 3072.
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

#include "engine/kernels/cuda/attention_math.cuh"
#include "engine/kernels/cuda/cuda_kernels.h" /* the CPU kernels' headers, with C linkage */
#include "engine/kernels/cuda/fused_math.cuh"
#include "engine/kernels/cuda/norm_math.cuh"
#include "engine/kernels/cuda/xent_math.cuh"
#include "tests/cuda_colsum_ref.cuh"
#include "tests/cuda_embedding_ref.cuh"
#include "tests/cuda_testkit.cuh"

typedef std::vector<ms_bf16> bvec;

static bvec brand(size_t n, double lo, double hi) {
    return to_bf16<ms_bf16>(frand(n, lo, hi));
}

/* got (bf16) == want (fp32) rounded once, bit for bit. */
static bool same_bits(const char *what, const bvec &got, const fvec &want) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (got[i].bits != ms_cu_bf16_round(want[i]) && !bad++) first = i;
    printf("  %-52s %zu values, %zu differ%s\n", what, got.size(), bad, bad ? "  FAIL" : "");
    if (bad)
        printf("    first at %zu: bf16 kernel %#06x, staged %#06x\n", first, got[first].bits,
               ms_cu_bf16_round(want[first]));
    return bad == 0;
}

/* Both checks of one output: the staging rule, and one ulp from the CPU kernel. */
static bool staged_and_cpu(const char *what, const bvec &got, const fvec &staged, const fvec &cpu) {
    char name[96];
    snprintf(name, sizeof name, "%s == staged", what);
    bool ok = same_bits(name, got, staged);
    snprintf(name, sizeof name, "%s vs the CPU kernel (1 ulp)", what);
    return ok & close(name, widen(got), cpu, 1e-5, BF16_RTOL);
}

/* A column sum (colsum_math.cuh): the staging rule bit for bit, and against the CPU kernel,
 * which sums the rows in order, within both orders' summation bounds plus one bf16 ulp; mag
 * from colsum_reference on the widened operands. */
static bool colsum_staged_and_cpu(const char *what, const bvec &got, const fvec &staged,
                                  const fvec &cpu, const dvec &mag, int64_t n) {
    char name[96];
    snprintf(name, sizeof name, "%s == staged", what);
    bool ok = same_bits(name, got, staged);
    snprintf(name, sizeof name, "%s vs the CPU kernel (1 ulp + sums)", what);
    return ok & close_colsum(name, widen(got), to_dvec(cpu), mag, colsum_units_cpu(n), BF16_RTOL);
}

/* ---- elementwise: add, bias add, GELU ---- */

static void test_add_bias_gelu(void **state) {
    (void)state;
    const int64_t n = 37, c = 768, e = n * c, eg = n * 3072; /* fewer rows than a chunk */
    const bvec a = brand(e, -4, 4), b = brand(e, -2, 2), g = brand(e, -1, 1),
               bias = brand(c, -1, 1);
    const bvec d0 = brand(e, -1, 1), db0 = brand(c, -1, 1);
    const fvec af = widen(a), bf = widen(b), gf = widen(g), biasf = widen(bias);
    bvec out(e);
    fvec want(e), cpu(e);
    bool ok = true;
    for (int64_t i = 0; i < e; i++) ms_cu_add_fwd(out.data(), a.data(), b.data(), i);
    for (int64_t i = 0; i < e; i++) ms_cu_add_fwd(want.data(), af.data(), bf.data(), i);
    ms_k_add_forward(cpu.data(), af.data(), bf.data(), e);
    ok &= staged_and_cpu("add forward", out, want, cpu);
    /* add backward and bias add's dinp: d += dout */
    bvec d = d0;
    fvec dw = widen(d0), dc = widen(d0), dbw = widen(db0), dbc = widen(db0);
    for (int64_t i = 0; i < e; i++) ms_cu_acc(d.data(), g.data(), i);
    for (int64_t i = 0; i < e; i++) ms_cu_acc(dw.data(), gf.data(), i);
    ms_k_add_backward(dc.data(), NULL, gf.data(), e);
    ok &= staged_and_cpu("add backward (accumulated)", d, dw, dc);
    for (int64_t i = 0; i < e; i++) ms_cu_bias_add_fwd(out.data(), a.data(), bias.data(), c, i);
    for (int64_t i = 0; i < e; i++) ms_cu_bias_add_fwd(want.data(), af.data(), biasf.data(), c, i);
    ms_k_bias_add_forward(cpu.data(), af.data(), biasf.data(), n, c);
    ok &= staged_and_cpu("bias add forward", out, want, cpu);
    bvec db = db0, dx0 = d0;
    fvec dx0w = widen(d0);
    ok &= colsum_bias_add_bwd(dx0.data(), db.data(), g.data(), n, c, false);
    ok &= colsum_bias_add_bwd(dx0w.data(), dbw.data(), gf.data(), n, c, false);
    ms_k_bias_add_backward(NULL, dbc.data(), gf.data(), n, c);
    ok &= same_bits("bias add backward dinp == staged", dx0, dx0w);
    const colsum_want wb =
        colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t j) { return gf[r * c + j]; });
    ok &= colsum_staged_and_cpu("bias add backward dbias", db, dbw, dbc, wb.mag, n);
    /* GELU over the MLP's width */
    const bvec x = brand(eg, -5, 5), gg = brand(eg, -1, 1), dg0 = brand(eg, -1, 1);
    const fvec xf = widen(x), ggf = widen(gg);
    bvec y(eg), dx = dg0;
    fvec yw(eg), yc(eg), dxw = widen(dg0), dxc = widen(dg0);
    for (int64_t i = 0; i < eg; i++) ms_cu_gelu_fwd(y.data(), x.data(), i);
    for (int64_t i = 0; i < eg; i++) ms_cu_gelu_fwd(yw.data(), xf.data(), i);
    ms_k_gelu_forward(yc.data(), xf.data(), eg);
    ok &= staged_and_cpu("gelu forward", y, yw, yc);
    for (int64_t i = 0; i < eg; i++) ms_cu_gelu_bwd(dx.data(), x.data(), gg.data(), i);
    for (int64_t i = 0; i < eg; i++) ms_cu_gelu_bwd(dxw.data(), xf.data(), ggf.data(), i);
    ms_k_gelu_backward(dxc.data(), xf.data(), ggf.data(), eg);
    ok &= staged_and_cpu("gelu backward (accumulated)", dx, dxw, dxc);
    assert_true(ok);
}

/* ---- bias + GELU, bias + dropout + residual add ---- */

static void test_fused(void **state) {
    (void)state;
    const int64_t n = 100, c = 3072, e = n * c; /* a chunk and a part */
    const bvec x = brand(e, -4, 4), bias = brand(c, -1, 1), g = brand(e, -1, 1);
    const bvec d0 = brand(e, -1, 1), db0 = brand(c, -1, 1);
    const fvec xf = widen(x), biasf = widen(bias), gf = widen(g);
    bvec y(e), dx = d0, db = db0;
    fvec yw(e), yc(e), dxw = widen(d0), dbw = widen(db0), dxc = widen(d0), dbc = widen(db0);
    bool ok = true;
    for (int64_t i = 0; i < e; i++) ms_cu_bias_gelu_fwd(y.data(), x.data(), bias.data(), c, i);
    for (int64_t i = 0; i < e; i++) ms_cu_bias_gelu_fwd(yw.data(), xf.data(), biasf.data(), c, i);
    ms_k_bias_gelu_forward(yc.data(), xf.data(), biasf.data(), n, c);
    ok &= staged_and_cpu("bias gelu forward", y, yw, yc);
    ok &= colsum_bias_gelu_bwd(dx.data(), db.data(), g.data(), x.data(), bias.data(), n, c, false);
    ok &= colsum_bias_gelu_bwd(dxw.data(), dbw.data(), gf.data(), xf.data(), biasf.data(), n, c,
                               false);
    ms_k_bias_gelu_backward(dxc.data(), dbc.data(), gf.data(), xf.data(), biasf.data(), n, c);
    ok &= staged_and_cpu("bias gelu backward dinp", dx, dxw, dxc);
    /* the terms differ from the CPU's by tanhf's ulps: each side's from zero */
    fvec tg(e, 0.0f), tc(e, 0.0f);
    for (int64_t i = 0; i < e; i++) tg[i] += ms_cu_gelu_grad(xf[i] + biasf[i % c]) * gf[i];
    ms_k_bias_gelu_backward(tc.data(), NULL, gf.data(), xf.data(), biasf.data(), n, c);
    const dvec tdiff = column_absdiff(tg, tc, n, c);
    const colsum_want wg =
        colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t k) { return tg[r * c + k]; });
    ok &= same_bits("bias gelu backward dbias == staged", db, dbw);
    ok &= close_colsum("bias gelu backward dbias vs the CPU kernel (1 ulp + sums + terms)",
                       widen(db), to_dvec(dbc), wg.mag, colsum_units_cpu(n), BF16_RTOL, &tdiff);

    /* bias_dropout_add over [n, 768] with p = 0.1, on the box of a [2n, 768] global tensor */
    const int64_t cb = 768, eb = n * cb;
    const int64_t lshape[2] = {n, cb}, gstart[2] = {n, 0}, gshape[2] = {2 * n, cb};
    const ms_cu_box box = ms_cu_box_make(2, lshape, gstart, gshape, 0, 0, 0);
    const bvec r = brand(eb, -2, 2), xb(x.begin(), x.begin() + eb), gb(g.begin(), g.begin() + eb);
    const bvec bb(bias.begin(), bias.begin() + cb);
    const fvec rf = widen(r), xbf = widen(xb), gbf = widen(gb), bbf = widen(bb);
    const float p = 0.1f;
    const uint64_t seed = 1234, sid = 7;
    const ms_k_batch_window *no_window = NULL;
    const ms_k_fused_dropout fd = {
        .p = p, .seed = seed, .stream = sid, .box = {2, lshape, gstart, gshape, no_window}};
    bvec o(eb), dres(r), dinp(xb), dbb(bb);
    fvec ow(eb), oc(eb), dresw = rf, dinpw = xbf, dbbw = bbf, dresc = rf, dinpc = xbf, dbbc = bbf;
    for (int64_t i = 0; i < eb; i++)
        ms_cu_bda_fwd(o.data(), xb.data(), bb.data(), r.data(), cb, p, seed, sid, box, i);
    for (int64_t i = 0; i < eb; i++)
        ms_cu_bda_fwd(ow.data(), xbf.data(), bbf.data(), rf.data(), cb, p, seed, sid, box, i);
    ms_k_bias_dropout_add_forward(oc.data(), xbf.data(), bbf.data(), rf.data(), cb, &fd);
    ok &= staged_and_cpu("bias dropout add forward", o, ow, oc);
    ok &= colsum_bda_bwd(dinp.data(), dbb.data(), dres.data(), gb.data(), n, cb, p, seed, sid, box,
                         false);
    ok &= colsum_bda_bwd(dinpw.data(), dbbw.data(), dresw.data(), gbf.data(), n, cb, p, seed, sid,
                         box, false);
    ms_k_bias_dropout_add_backward(dinpc.data(), dbbc.data(), dresc.data(), gbf.data(), cb, &fd);
    ok &= staged_and_cpu("bias dropout add backward dinp", dinp, dinpw, dinpc);
    const float keep_scale = 1.0f / (1.0f - p);
    const colsum_want wd = colsum_reference(n, cb, bbf, [&](int64_t r0, int64_t k) {
        const int64_t i = r0 * cb + k;
        return ms_cu_bda_keep(p, seed, sid, box, i) ? gbf[i] * keep_scale : 0.0f;
    });
    ok &= colsum_staged_and_cpu("bias dropout add backward dbias", dbb, dbbw, dbbc, wd.mag, n);
    ok &= staged_and_cpu("bias dropout add backward dres", dres, dresw, dresc);

    /* dropout alone (the embeddings' dropout), p = 0.1, forward and accumulated backward */
    bvec yd(eb), dd(xb);
    fvec ydw(eb), ydc(eb), ddw = xbf, ddc = xbf;
    for (int64_t i = 0; i < eb; i++)
        ms_cu_dropout_elem(yd.data(), r.data(), false, p, seed, sid, box, i);
    for (int64_t i = 0; i < eb; i++)
        ms_cu_dropout_elem(ydw.data(), rf.data(), false, p, seed, sid, box, i);
    ms_k_dropout_forward(ydc.data(), rf.data(), p, seed, sid, 2, lshape, gstart, gshape, no_window);
    ok &= staged_and_cpu("dropout forward", yd, ydw, ydc);
    for (int64_t i = 0; i < eb; i++)
        ms_cu_dropout_elem(dd.data(), gb.data(), true, p, seed, sid, box, i);
    for (int64_t i = 0; i < eb; i++)
        ms_cu_dropout_elem(ddw.data(), gbf.data(), true, p, seed, sid, box, i);
    ms_k_dropout_backward(ddc.data(), gbf.data(), p, seed, sid, 2, lshape, gstart, gshape,
                          no_window);
    ok &= staged_and_cpu("dropout backward (accumulated)", dd, ddw, ddc);
    assert_true(ok);
}

/* ---- LayerNorm: rows over MS_CU_ROW_LANES lanes and the block's tree, as norm.cu ---- */

template <typename F> static float lanes_sum(F part) {
    float v[MS_CU_ROW_LANES];
    for (int l = 0; l < MS_CU_ROW_LANES; l++) v[l] = part(l);
    return ms_cu_lanes_sum(v, MS_CU_ROW_LANES);
}

template <typename T>
static void ln_forward(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                       int64_t n, int64_t c, float eps) {
    const int L = MS_CU_ROW_LANES;
    for (int64_t r = 0; r < n; r++) {
        const T *x = inp + r * c;
        const float m = lanes_sum([&](int l) { return ms_cu_row_sum_part(x, c, l, L); }) / (float)c;
        const float sq = lanes_sum([&](int l) { return ms_cu_ln_sqdev_part(x, c, m, l, L); });
        const float s = ms_cu_ln_rstd(sq, c, eps);
        for (int l = 0; l < L; l++) ms_cu_ln_out_part(out + r * c, x, w, b, c, m, s, l, L);
        mean[r] = m, rstd[r] = s;
    }
}

template <typename T>
static void ln_backward(T *dinp, T *dw, T *db, const T *dout, const T *inp, const T *w,
                        const float *mean, const float *rstd, int64_t n, int64_t c) {
    const int L = MS_CU_ROW_LANES;
    for (int64_t r = 0; r < n; r++) {
        const T *g = dout + r * c, *x = inp + r * c;
        float a[L], b[L];
        for (int l = 0; l < L; l++)
            ms_cu_ln_bwd_part(&a[l], &b[l], g, x, w, c, mean[r], rstd[r], l, L);
        const float sa = ms_cu_lanes_sum(a, L), sb = ms_cu_lanes_sum(b, L);
        for (int l = 0; l < L; l++)
            ms_cu_ln_dinp_part(dinp + r * c, g, x, w, c, mean[r], rstd[r], sa, sb, l, L);
    }
    assert_true(colsum_layernorm_bwd(dw, db, dout, inp, mean, rstd, n, c, false));
}

static void test_layernorm(void **state) {
    (void)state;
    const int64_t n = 200, c = 768, e = n * c; /* 3 chunks and a part */
    const bvec x = brand(e, -3, 3), w = brand(c, 0.5, 1.5), b = brand(c, -0.5, 0.5);
    const bvec g = brand(e, -1, 1), d0 = brand(e, -1, 1), dw0 = brand(c, -1, 1),
               db0 = brand(c, -1, 1);
    const fvec xf = widen(x), wf = widen(w), bf = widen(b), gf = widen(g);
    bvec y(e), dx = d0, dw = dw0, db = db0;
    fvec m16(n), s16(n), yw(e), mw(n), sw(n), yc(e), mc(n), sc(n);
    ln_forward(y.data(), m16.data(), s16.data(), x.data(), w.data(), b.data(), n, c, 1e-5f);
    ln_forward(yw.data(), mw.data(), sw.data(), xf.data(), wf.data(), bf.data(), n, c, 1e-5f);
    ms_k_layernorm_forward(yc.data(), mc.data(), sc.data(), xf.data(), wf.data(), bf.data(), n, c,
                           1e-5f);
    bool ok = staged_and_cpu("layernorm forward", y, yw, yc);
    ok &= close("layernorm mean (fp32) == staged", m16, mw, 0, 0);
    ok &= close("layernorm rstd (fp32) == staged", s16, sw, 0, 0);
    fvec dxw = widen(d0), dww = widen(dw0), dbw = widen(db0);
    fvec dxc = dxw, dwc = dww, dbc = dbw;
    ln_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), m16.data(),
                s16.data(), n, c);
    ln_backward(dxw.data(), dww.data(), dbw.data(), gf.data(), xf.data(), wf.data(), mw.data(),
                sw.data(), n, c);
    /* from the statistics the kernel saved, so that both sides add the same terms */
    ms_k_layernorm_backward(dxc.data(), dwc.data(), dbc.data(), gf.data(), xf.data(), wf.data(),
                            m16.data(), s16.data(), n, c);
    ok &= staged_and_cpu("layernorm backward dinp", dx, dxw, dxc);
    const colsum_want ww = colsum_reference(n, c, widen(dw0), [&](int64_t r, int64_t j) {
        return (xf[r * c + j] - m16[r]) * s16[r] * gf[r * c + j];
    });
    const colsum_want wb =
        colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t j) { return gf[r * c + j]; });
    ok &= colsum_staged_and_cpu("layernorm backward dweight", dw, dww, dwc, ww.mag, n);
    ok &= colsum_staged_and_cpu("layernorm backward dbias", db, dbw, dbc, wb.mag, n);
    assert_true(ok);
}

/* ---- attention over GPT-2's packed qkv: attention.cu's kernels, thread by thread ---- */

struct attn_geom {
    int64_t b, t, c, nh;
};

/* Rows [r0, r0 + n) of a head into an fp32 tile, widened: attention.cu's stage_rows. */
template <typename T>
static void stage(float *dst, const T *src, int64_t ld, int64_t r0, int64_t n, int64_t hs) {
    for (int64_t e = 0; e < n * hs; e++) dst[e] = ms_cu_load(src + (r0 + e / hs) * ld + e % hs);
}

/* attn_fwd_kernel, causal, with the fp32 output copy the bf16 path saves. */
template <typename T>
static void attn_fwd(const attn_geom &a, T *out, float *lse, float *o_copy, const T *qkv) {
    const int64_t hs = a.c / a.nh, c3 = 3 * a.c;
    const float scale = 1.0f / sqrtf((float)hs);
    float ks[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS], vs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS];
    for (int64_t bi = 0; bi < a.b; bi++)
        for (int64_t h = 0; h < a.nh; h++)
            for (int64_t i = 0; i < a.t; i++) {
                const T *q = qkv + bi * a.t * c3 + h * hs;
                float qi[MS_CU_ATTN_MAX_HS], acc[MS_CU_ATTN_MAX_HS];
                for (int64_t d = 0; d < hs; d++) qi[d] = ms_cu_load(q + i * c3 + d);
                ms_cu_attn_state st;
                ms_cu_attn_fwd_init(&st, acc, hs);
                for (int64_t j0 = 0; j0 <= i; j0 += MS_CU_ATTN_TILE) {
                    const int64_t nk = std::min<int64_t>(MS_CU_ATTN_TILE, a.t - j0);
                    stage(ks, q + a.c, c3, j0, nk, hs);
                    stage(vs, q + 2 * a.c, c3, j0, nk, hs);
                    const int64_t vis = ms_cu_attn_visible(i, j0, nk, true);
                    ms_cu_attn_fwd_tile(&st, acc, qi, ks, vs, hs, (const float *)NULL, vis, hs,
                                        scale);
                }
                const int64_t o = (bi * a.t + i) * a.c + h * hs;
                lse[(bi * a.nh + h) * a.t + i] = ms_cu_attn_fwd_finish(out + o, &st, acc, hs);
                ms_cu_attn_fwd_finish(o_copy + o, &st, acc, hs);
            }
}

/* The delta, dq and dk/dv kernels; dqkv accumulates, each element stored once. */
template <typename T>
static void attn_bwd(const attn_geom &a, T *dqkv, const T *dout, const T *qkv, const float *o_copy,
                     const float *lse) {
    const int64_t hs = a.c / a.nh, c3 = 3 * a.c;
    const float scale = 1.0f / sqrtf((float)hs);
    float ks[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS], vs[MS_CU_ATTN_TILE * MS_CU_ATTN_MAX_HS];
    fvec delta(a.b * a.nh * a.t);
    for (int64_t bi = 0; bi < a.b; bi++)
        for (int64_t h = 0; h < a.nh; h++) {
            const int64_t off = bi * a.t * c3 + h * hs, rows = (bi * a.nh + h) * a.t;
            const T *q = qkv + off, *g = dout + bi * a.t * a.c + h * hs;
            for (int64_t i = 0; i < a.t; i++)
                delta[rows + i] =
                    ms_cu_dot(g + i * a.c, o_copy + (bi * a.t + i) * a.c + h * hs, hs);
            for (int64_t i = 0; i < a.t; i++) {
                float qi[MS_CU_ATTN_MAX_HS], gi[MS_CU_ATTN_MAX_HS], dq[MS_CU_ATTN_MAX_HS] = {};
                for (int64_t d = 0; d < hs; d++)
                    qi[d] = ms_cu_load(q + i * c3 + d), gi[d] = ms_cu_load(g + i * a.c + d);
                for (int64_t j0 = 0; j0 <= i; j0 += MS_CU_ATTN_TILE) {
                    const int64_t nk = std::min<int64_t>(MS_CU_ATTN_TILE, a.t - j0);
                    stage(ks, q + a.c, c3, j0, nk, hs);
                    stage(vs, q + 2 * a.c, c3, j0, nk, hs);
                    ms_cu_attn_dq_tile(dq, qi, gi, delta[rows + i], lse[rows + i], ks, vs, hs,
                                       (const float *)NULL, ms_cu_attn_visible(i, j0, nk, true), hs,
                                       scale);
                }
                for (int64_t d = 0; d < hs; d++)
                    ms_cu_store(dqkv + off + i * c3 + d,
                                ms_cu_load(dqkv + off + i * c3 + d) + dq[d]);
            }
            for (int64_t j = 0; j < a.t; j++) {
                float kj[MS_CU_ATTN_MAX_HS], vj[MS_CU_ATTN_MAX_HS];
                float dk[MS_CU_ATTN_MAX_HS] = {}, dv[MS_CU_ATTN_MAX_HS] = {};
                for (int64_t d = 0; d < hs; d++)
                    kj[d] = ms_cu_load(q + j * c3 + a.c + d),
                    vj[d] = ms_cu_load(q + j * c3 + 2 * a.c + d);
                for (int64_t i0 = j / MS_CU_ATTN_TILE * MS_CU_ATTN_TILE; i0 < a.t;
                     i0 += MS_CU_ATTN_TILE) {
                    const int64_t nq = std::min<int64_t>(MS_CU_ATTN_TILE, a.t - i0);
                    stage(ks, q, c3, i0, nq, hs);  /* the query tile */
                    stage(vs, g, a.c, i0, nq, hs); /* and its output gradients */
                    ms_cu_attn_dkv_tile(dk, dv, kj, vj, j, 0.0f, ks, hs, vs, hs, lse + rows + i0,
                                        delta.data() + rows + i0, i0, nq, hs, scale, true);
                }
                T *dkr = dqkv + off + j * c3 + a.c, *dvr = dkr + a.c;
                for (int64_t d = 0; d < hs; d++) {
                    ms_cu_store(dkr + d, ms_cu_load(dkr + d) + dk[d]);
                    ms_cu_store(dvr + d, ms_cu_load(dvr + d) + dv[d]);
                }
            }
        }
}

static void test_attention(void **state) {
    (void)state;
    const attn_geom a = {2, 100, 768, 12}; /* T = 100: not a multiple of the 32-row tile */
    const int64_t n = a.b * a.t * a.c, n3 = 3 * n, nl = a.b * a.nh * a.t;
    const bvec qkv = brand(n3, -1.5, 1.5), g = brand(n, -1, 1), d0 = brand(n3, -1, 1);
    const fvec qkvf = widen(qkv), gf = widen(g);
    bvec out(n), dqkv = d0;
    fvec lse(nl), copy(n), outw(n), lsew(nl), copyw(n), dw = widen(d0);
    attn_fwd(a, out.data(), lse.data(), copy.data(), qkv.data());
    attn_fwd(a, outw.data(), lsew.data(), copyw.data(), qkvf.data());
    fvec outc(n), att(nl * a.t), dc = widen(d0), scratch(ms_k_attention_scratch_floats(a.t));
    ms_k_attention_forward(outc.data(), att.data(), NULL, qkvf.data(), NULL, a.b, a.t, a.c, a.nh,
                           true, NULL);
    bool ok = same_bits("attention forward == staged", out, outw);
    ok &= close("attention forward vs the CPU kernel (1 ulp + 1e-5)", widen(out), outc, 1e-5,
                BF16_RTOL);
    ok &= close("attention lse (fp32) == staged", lse, lsew, 0, 0);
    ok &= close("attention saved output (fp32) == staged", copy, copyw, 0, 0);
    attn_bwd(a, dqkv.data(), g.data(), qkv.data(), copy.data(), lse.data());
    attn_bwd(a, dw.data(), gf.data(), qkvf.data(), copyw.data(), lsew.data());
    ms_k_attention_backward(dc.data(), scratch.data(), gf.data(), qkvf.data(), att.data(), a.b, a.t,
                            a.c, a.nh, true, NULL);
    ok &= same_bits("attention backward dqkv (accumulated) == staged", dqkv, dw);
    ok &= close("attention backward dqkv vs the CPU kernel (1 ulp + 1e-5)", widen(dqkv), dc, 1e-5,
                BF16_RTOL);
    assert_true(ok);
}

/* ---- the vocab-parallel cross-entropy on bf16 logits: GPT-2's vocabulary in two slices ---- */

/* Row statistics of one slice over the lanes, as norm.cu's row kernels. */
template <typename T>
static void xent_stats(float *mx, float *se, float *tg, const T *x, const int32_t *t, int64_t n,
                       int64_t vl, int64_t v0) {
    for (int64_t r = 0; r < n; r++) {
        float v[MS_CU_ROW_LANES];
        for (int l = 0; l < MS_CU_ROW_LANES; l++)
            v[l] = ms_cu_row_max_part(x + r * vl, vl, l, MS_CU_ROW_LANES);
        mx[r] = ms_cu_lanes_max(v, MS_CU_ROW_LANES);
        se[r] = lanes_sum([&](int l) {
            return ms_cu_row_sumexp_part(x + r * vl, vl, mx[r], l, MS_CU_ROW_LANES);
        });
        tg[r] = ms_cu_xent_target(x + r * vl, t[r], vl, v0);
    }
}

static void test_xent(void **state) {
    (void)state;
    const int64_t n = 8, v = 50257, vl = 25129, v0 = 25128; /* the second slice */
    const bvec x = brand(n * vl, -6, 6), dl = brand(n, 0, 1), d0 = brand(n * vl, -1e-3, 1e-3);
    const fvec xf = widen(x), dlf = widen(dl);
    std::vector<int32_t> t(n);
    for (int64_t r = 0; r < n; r++) t[r] = (int32_t)(r % 2 ? v0 + 37 * r : 11 * r); /* in, out */
    t[3] = -1; /* an ignored row */
    fvec mx(n), se(n), tg(n), mxw(n), sew(n), tgw(n), mxc(n), sec(n), tgc(n);
    xent_stats(mx.data(), se.data(), tg.data(), x.data(), t.data(), n, vl, v0);
    xent_stats(mxw.data(), sew.data(), tgw.data(), xf.data(), t.data(), n, vl, v0);
    ms_k_xent_vp_rowmax(mxc.data(), xf.data(), n, vl);
    ms_k_xent_vp_sumexp(sec.data(), xf.data(), mxc.data(), n, vl);
    ms_k_xent_vp_target(tgc.data(), xf.data(), t.data(), n, vl, v0);
    bool ok = close("xent row max (fp32) == staged", mx, mxw, 0, 0);
    ok &= close("xent sum of exps (fp32) == staged", se, sew, 0, 0);
    ok &= close("xent target logit (fp32) == staged", tg, tgw, 0, 0);
    ok &= close("xent row max vs the CPU kernel", mx, mxc, 0, 0);
    ok &= close("xent sum of exps vs the CPU kernel (1e-4: another order)", se, sec, 0, 1e-4);
    ok &= close("xent target logit vs the CPU kernel", tg, tgc, 0, 0);
    bvec d = d0;
    fvec dw = widen(d0), dc = widen(d0);
    for (int64_t i = 0; i < n * vl; i++)
        ms_cu_xent_vp_grad(d.data() + i / vl * vl, x.data() + i / vl * vl, i % vl, mx[i / vl],
                           se[i / vl], t[i / vl], ms_cu_load(dl.data() + i / vl), v0);
    for (int64_t i = 0; i < n * vl; i++)
        ms_cu_xent_vp_grad(dw.data() + i / vl * vl, xf.data() + i / vl * vl, i % vl, mxw[i / vl],
                           sew[i / vl], t[i / vl], dlf[i / vl], v0);
    ms_k_xent_vp_backward(dc.data(), xf.data(), mxc.data(), sec.data(), t.data(), dlf.data(), n, vl,
                          v0);
    ok &= staged_and_cpu("xent backward dlogits (accumulated)", d, dw, dc);
    (void)v;
    assert_true(ok);
}

/* ---- embedding: lookup and the sorted, deterministic scatter-add of embedding.cu ---- */

/* Values in [-1, 1) scaled by 2^-k, k in [0, 24): sums of a few of them need more bits than
 * fp32 has, even from bf16 values, so a different summation order changes the result. */
static fvec wide_range(size_t n) {
    fvec x = frand(n, -1, 1);
    for (float &v : x) v = ldexpf(v, -(int)(urand() * 24));
    return x;
}

/* GPT-2's width, 2 x 100 tokens over 40 ids that repeat in shuffled positions; the whole
 * table, then the vocab slice [300, 700) with ids on and off it. The fp32 instantiation must
 * equal the CPU kernel bit for bit (same per-row order), and the bf16 one the CPU kernel on
 * widened operands rounded once - the staged result on every device. */
static void test_embedding(void **state) {
    (void)state;
    const int64_t n = 2 * 100, c = 768, v = 1000;
    std::vector<int32_t> ids(n);
    for (auto &id : ids) id = (int32_t)(urand() * 40) * 25;
    const bvec table = brand(v * c, -1, 1), g = to_bf16<ms_bf16>(wide_range(n * c));
    const fvec gf = widen(g), g32 = wide_range(n * c);
    bool ok = true;
    for (int64_t v0 : {0, 300}) {
        const int64_t vl = v0 ? 400 : v;
        const bvec tab(table.begin() + v0 * c, table.begin() + (v0 + vl) * c);
        const fvec tabf = widen(tab);
        bvec out(n * c);
        fvec cpu(n * c);
        for (int64_t i = 0; i < n * c; i++)
            ms_cu_embedding_fwd(out.data(), ids.data(), tab.data(), c, v0, vl, i);
        ms_k_embedding_forward(cpu.data(), ids.data(), tabf.data(), n, c, v0, vl);
        ok &= same_bits(v0 ? "embedding forward, vocab slice == CPU" : "embedding forward == CPU",
                        out, cpu);
        fvec dw = wide_range(vl * c), dc = dw;
        emb_sorted_backward(dw.data(), ids.data(), g32.data(), n, c, v0, vl);
        ms_k_embedding_backward(dc.data(), ids.data(), g32.data(), n, c, v0, vl);
        ok &= close(v0 ? "embedding backward fp32, vocab slice == CPU"
                       : "embedding backward fp32 == CPU",
                    dw, dc, 0, 0);
        const bvec d0 = to_bf16<ms_bf16>(wide_range(vl * c));
        bvec d = d0;
        dc = widen(d0);
        emb_sorted_backward(d.data(), ids.data(), g.data(), n, c, v0, vl);
        ms_k_embedding_backward(dc.data(), ids.data(), gf.data(), n, c, v0, vl);
        ok &= same_bits(v0 ? "embedding backward bf16, vocab slice == CPU rounded once"
                           : "embedding backward bf16 == CPU rounded once",
                        d, dc);
    }
    assert_true(ok);
}

/* ---- the column sums at GPT-2's sizes: B*T = 8192 rows of 768, 2048 of the MLP's 3072 ---- */

/* A bf16 column sum twice (in order, then in a shuffled thread order: the same bits), the fp32
 * instantiation on the widened operands (staged), and the CPU kernel. */
static void test_colsum_bf16(void **state) {
    (void)state;
    bool ok = true;
    ms_bf16 *no_dinp = NULL;
    float *no_dinp32 = NULL;
    {
        const int64_t n = 8192, c = 768;
        const bvec g = to_bf16<ms_bf16>(colsum_binades(n * c)), db0 = brand(c, -1, 1);
        const fvec gf = widen(g);
        bvec db1 = db0, db2 = db0;
        fvec dbw = widen(db0), dbc = dbw;
        ok &= colsum_bias_add_bwd(no_dinp, db1.data(), g.data(), n, c, false);
        ok &= colsum_bias_add_bwd(no_dinp, db2.data(), g.data(), n, c, true);
        ok &= colsum_bias_add_bwd(no_dinp32, dbw.data(), gf.data(), n, c, false);
        ms_k_bias_add_backward(NULL, dbc.data(), gf.data(), n, c);
        const colsum_want w =
            colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t j) { return gf[r * c + j]; });
        ok &= same_bits("bias add dbias n=8192 (binades): run 2, another order", db2, widen(db1));
        ok &= colsum_staged_and_cpu("bias add dbias n=8192 (binades)", db1, dbw, dbc, w.mag, n);
    }
    {
        const int64_t n = 2048, c = 3072, e = n * c;
        const bvec x = brand(e, -4, 4), bias = brand(c, -1, 1), g = brand(e, -1, 1),
                   db0 = brand(c, -1, 1);
        const fvec xf = widen(x), biasf = widen(bias), gf = widen(g);
        bvec db1 = db0, db2 = db0;
        fvec dbw = widen(db0), dbc = dbw, tg(e, 0.0f), tc(e, 0.0f);
        ok &=
            colsum_bias_gelu_bwd(no_dinp, db1.data(), g.data(), x.data(), bias.data(), n, c, false);
        ok &=
            colsum_bias_gelu_bwd(no_dinp, db2.data(), g.data(), x.data(), bias.data(), n, c, true);
        ok &= colsum_bias_gelu_bwd(no_dinp32, dbw.data(), gf.data(), xf.data(), biasf.data(), n, c,
                                   false);
        ms_k_bias_gelu_backward(NULL, dbc.data(), gf.data(), xf.data(), biasf.data(), n, c);
        for (int64_t i = 0; i < e; i++) tg[i] += ms_cu_gelu_grad(xf[i] + biasf[i % c]) * gf[i];
        ms_k_bias_gelu_backward(tc.data(), NULL, gf.data(), xf.data(), biasf.data(), n, c);
        const dvec tdiff = column_absdiff(tg, tc, n, c);
        const colsum_want w =
            colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t k) { return tg[r * c + k]; });
        ok &= same_bits("bias gelu dbias n=2048: run 2, another order", db2, widen(db1));
        ok &= same_bits("bias gelu dbias n=2048 == staged", db1, dbw);
        ok &= close_colsum("bias gelu dbias n=2048 vs the CPU kernel (1 ulp + sums + terms)",
                           widen(db1), to_dvec(dbc), w.mag, colsum_units_cpu(n), BF16_RTOL, &tdiff);
    }
    {
        const int64_t n = 8192, c = 768, e = n * c;
        const bvec x = brand(e, -3, 3), g = brand(e, -1, 1), dw0 = brand(c, -1, 1),
                   db0 = brand(c, -1, 1);
        const fvec xf = widen(x), gf = widen(g), mean = frand(n, -0.3, 0.3),
                   rstd = frand(n, 0.5, 2);
        bvec dw1 = dw0, db1 = db0, dw2 = dw0, db2 = db0;
        fvec dww = widen(dw0), dbw = widen(db0), dwc = dww, dbc = dbw;
        ok &= colsum_layernorm_bwd(dw1.data(), db1.data(), g.data(), x.data(), mean.data(),
                                   rstd.data(), n, c, false);
        ok &= colsum_layernorm_bwd(dw2.data(), db2.data(), g.data(), x.data(), mean.data(),
                                   rstd.data(), n, c, true);
        ok &= colsum_layernorm_bwd(dww.data(), dbw.data(), gf.data(), xf.data(), mean.data(),
                                   rstd.data(), n, c, false);
        ms_k_layernorm_backward(NULL, dwc.data(), dbc.data(), gf.data(), xf.data(), NULL,
                                mean.data(), rstd.data(), n, c);
        const colsum_want ww = colsum_reference(n, c, widen(dw0), [&](int64_t r, int64_t j) {
            return (xf[r * c + j] - mean[r]) * rstd[r] * gf[r * c + j];
        });
        const colsum_want wb =
            colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t j) { return gf[r * c + j]; });
        ok &= same_bits("layernorm dweight n=8192: run 2, another order", dw2, widen(dw1));
        ok &= same_bits("layernorm dbias n=8192: run 2, another order", db2, widen(db1));
        ok &= colsum_staged_and_cpu("layernorm dweight n=8192", dw1, dww, dwc, ww.mag, n);
        ok &= colsum_staged_and_cpu("layernorm dbias n=8192", db1, dbw, dbc, wb.mag, n);
    }
    {
        const int64_t n = 1000, c = 768, e = n * c;
        const int64_t lshape[2] = {n, c}, gstart[2] = {0, 0};
        const ms_cu_box box = ms_cu_box_make(2, lshape, gstart, NULL, 0, 0, 0);
        const float p = 0.1f;
        const ms_k_fused_dropout fd = {p, 5, 6, {2, lshape, gstart, NULL, NULL}};
        const bvec g = brand(e, -1, 1), db0 = brand(c, -1, 1);
        const fvec gf = widen(g);
        bvec db1 = db0, db2 = db0;
        fvec dbw = widen(db0), dbc = dbw;
        ok &= colsum_bda_bwd(no_dinp, db1.data(), no_dinp, g.data(), n, c, p, 5, 6, box, false);
        ok &= colsum_bda_bwd(no_dinp, db2.data(), no_dinp, g.data(), n, c, p, 5, 6, box, true);
        ok &=
            colsum_bda_bwd(no_dinp32, dbw.data(), no_dinp32, gf.data(), n, c, p, 5, 6, box, false);
        ms_k_bias_dropout_add_backward(NULL, dbc.data(), NULL, gf.data(), c, &fd);
        const float scale = 1.0f / (1.0f - p);
        const colsum_want w = colsum_reference(n, c, widen(db0), [&](int64_t r, int64_t k) {
            const int64_t i = r * c + k;
            return ms_cu_bda_keep(p, 5, 6, box, i) ? gf[i] * scale : 0.0f;
        });
        ok &= same_bits("bias dropout add dbias n=1000: run 2, another order", db2, widen(db1));
        ok &= colsum_staged_and_cpu("bias dropout add dbias n=1000", db1, dbw, dbc, w.mag, n);
    }
    assert_true(ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_bias_gelu), cmocka_unit_test(test_fused),
        cmocka_unit_test(test_layernorm),     cmocka_unit_test(test_attention),
        cmocka_unit_test(test_xent),          cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_colsum_bf16),
    };
    return cmocka_run_group_tests_name("cuda_host_bf16", tests, NULL, NULL);
}

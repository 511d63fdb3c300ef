/* test_ops_layers.c - the layer operators' forwards against float64 reference loops written
 * here (independent of engine/kernels), on the edge cases that matter: large magnitudes in
 * the softmax-like ops, fully masked rows, broadcast batch dims, ignored targets, zero
 * vectors; sequence shards (rotary, causal attention) against slices of the whole result,
 * since positions are global; and infer's errors on bad shapes and attributes.
 * (Placements and backward are test_rules' and test_op_grads' business.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"
#include "engine/core/philox.h"
#include "engine/dist/dtensor.h"
#include "engine/graph/eager.h"
#include "engine/ops/op.h"
#include "tests/testkit.h"

#define MAXN 4096

/* One forward of a built-in op on one rank. Inputs are local boxes (shape lin, or the global
 * shape gin where lin is unset) starting at `start` in the global inputs. */
typedef struct op_io {
    int op;
    ms_op_attrs a;
    int n_in;
    ms_shape gin[MS_OP_MAX_IN], lin[MS_OP_MAX_IN];
    ms_shape lout; /* the local output, where inferring it from lin does not work */
    const float *x[MS_OP_MAX_IN];
    int64_t start[MS_OP_MAX_IN][MS_MAX_DIMS];
    const float *dout; /* set: run backward too, input gradients (from zero) into dx */
    float *dx[MS_OP_MAX_IN];
} op_io;

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

/* Runs the forward; the output goes to out (its element count to *n_out). */
static ms_status op_run(const op_io *io, float *out, int64_t *n_out, ms_error *err) {
    const ms_op_def *def = ms_op_get(io->op);
    ms_shape gout[MS_OP_MAX_OUT], lout[MS_OP_MAX_OUT], lin[MS_OP_MAX_IN];
    for (int i = 0; i < io->n_in; i++) lin[i] = io->lin[i].ndim ? io->lin[i] : io->gin[i];
    MS_CHECK(def->infer(&io->a, io->n_in, io->gin, gout, err));
    if (io->lout.ndim)
        lout[0] = io->lout;
    else
        MS_CHECK(def->infer(&io->a, io->n_in, lin, lout, err));
    ms_device *dev = NULL;
    MS_CHECK(ms_device_cpu_create(&dev, err));
    static const ms_placements none[MS_OP_MAX_IN];
    ms_op_call call = {.kc = ms_kctx_host(),
                       .attrs = &io->a,
                       .n_in = io->n_in,
                       .n_out = 1,
                       .gin = io->gin,
                       .gout = gout,
                       .in_pl = none,
                       .out_pl = none};
    ms_tensor tin[MS_OP_MAX_IN] = {0}, tout = {0}, saved[MS_OP_MAX_SAVED] = {0};
    for (int i = 0; i < io->n_in; i++) {
        ms_tensor_alloc(dev, MS_F32, lin[i].ndim, lin[i].d, &tin[i], err);
        memcpy(ms_tensor_f32(&tin[i]), io->x[i], sizeof(float) * (size_t)numel(&lin[i]));
        memcpy(call.in_start[i], io->start[i], sizeof io->start[i]);
        call.in[i] = &tin[i];
    }
    ms_tensor_alloc(dev, MS_F32, lout[0].ndim, lout[0].d, &tout, err);
    call.out[0] = &tout;
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    if (def->saved_floats) def->saved_floats(&io->a, &call, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (sizes[k]) {
            ms_tensor_alloc(dev, MS_F32, 1, &sizes[k], &saved[k], err);
            call.saved[k] = &saved[k];
        }
    ms_status st = def->forward(&call, err);
    ms_tensor tdout = {0}, tdin[MS_OP_MAX_IN] = {0};
    if (st == MS_OK && io->dout) {
        ms_tensor_alloc(dev, MS_F32, lout[0].ndim, lout[0].d, &tdout, err);
        memcpy(ms_tensor_f32(&tdout), io->dout, sizeof(float) * (size_t)numel(&lout[0]));
        call.dout[0] = &tdout;
        for (int i = 0; i < io->n_in; i++)
            if (io->dx[i]) {
                ms_tensor_alloc(dev, MS_F32, lin[i].ndim, lin[i].d, &tdin[i], err);
                memset(ms_tensor_f32(&tdin[i]), 0, sizeof(float) * (size_t)numel(&lin[i]));
                call.din[i] = &tdin[i];
            }
        st = def->backward(&call, err);
        for (int i = 0; i < io->n_in; i++)
            if (io->dx[i])
                memcpy(io->dx[i], ms_tensor_f32(&tdin[i]), sizeof(float) * (size_t)numel(&lin[i]));
    }
    ms_tensor_release(&tdout);
    for (int i = 0; i < io->n_in; i++) ms_tensor_release(&tdin[i]);
    *n_out = numel(&lout[0]);
    memcpy(out, ms_tensor_f32(&tout), sizeof(float) * (size_t)*n_out);
    for (int i = 0; i < io->n_in; i++) ms_tensor_release(&tin[i]);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&saved[k]);
    ms_tensor_release(&tout);
    ms_device_destroy(dev);
    return st;
}

static void fill(float *x, int64_t n, uint64_t stream, float lo, float hi) {
    for (int64_t k = 0; k < n; k++)
        x[k] = lo + (hi - lo) * ms_philox_uniform(5, stream, (uint64_t)k);
}

/* The op's output equals ref[0..n) within rtol (relative to max(1, |ref|)). */
static void expect_op(const char *what, const op_io *io, const double *ref, int64_t n,
                      double rtol) {
    static float out[MAXN];
    int64_t got = 0;
    ms_error err = {0};
    if (op_run(io, out, &got, &err) != MS_OK) fail_msg("%s: %s", what, err.msg);
    if (got != n) fail_msg("%s: %lld outputs, expected %lld", what, (long long)got, (long long)n);
    for (int64_t k = 0; k < n; k++)
        if (!(fabs(out[k] - ref[k]) <= rtol * fmax(1.0, fabs(ref[k]))))
            fail_msg("%s: output %lld is %.9g, reference %.9g", what, (long long)k, out[k], ref[k]);
}

static op_io io1(int op, ms_shape s, const float *x) {
    return (op_io){.op = op, .n_in = 1, .gin = {s}, .x = {x}};
}
static op_io io2(int op, ms_shape s0, const float *x0, ms_shape s1, const float *x1) {
    return (op_io){.op = op, .n_in = 2, .gin = {s0, s1}, .x = {x0, x1}};
}

/* --- row-wise: rmsnorm, layernorm_plain, log_softmax, masked_softmax ---------------------------
 */

static void ref_rows(int op, const float *x, const float *aux, double *y, int64_t n, int64_t c,
                     double f) {
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * c;
        double *yr = y + r * c, m = 0, v = 0, ss = 0, mx = -INFINITY, se = 0;
        for (int64_t j = 0; j < c; j++) m += xr[j] / (double)c, ss += (double)xr[j] * xr[j];
        for (int64_t j = 0; j < c; j++) v += (xr[j] - m) * (xr[j] - m) / (double)c;
        for (int64_t j = 0; j < c; j++)
            if ((op != MS_OP_MASKED_SOFTMAX || aux[r * c + j] != 0) && xr[j] > mx) mx = xr[j];
        for (int64_t j = 0; j < c; j++)
            if (op != MS_OP_MASKED_SOFTMAX || aux[r * c + j] != 0)
                se += exp((xr[j] - mx) / (op == MS_OP_MASKED_SOFTMAX ? f : 1.0));
        for (int64_t j = 0; j < c; j++) {
            if (op == MS_OP_RMSNORM) yr[j] = xr[j] / sqrt(ss / (double)c + f) * aux[j];
            if (op == MS_OP_LAYERNORM_PLAIN) yr[j] = (xr[j] - m) / sqrt(v + f);
            if (op == MS_OP_LOG_SOFTMAX) yr[j] = xr[j] - mx - log(se);
            if (op == MS_OP_MASKED_SOFTMAX)
                yr[j] = aux[r * c + j] != 0 ? exp((xr[j] - mx) / f) / se : 0.0;
        }
    }
}

static void rowwise_ops(void **state) {
    (void)state;
    enum { R = 4, C = 9 };
    float x[R * C], w[C], mask[R * C];
    double ref[R * C];
    fill(x, R * C, 1, -2, 2);
    fill(w, C, 2, -1, 1);
    for (int k = 0; k < R * C; k++) mask[k] = (k % 3) != 1;
    for (int j = 0; j < C; j++) mask[2 * C + j] = 0; /* row 2 fully masked: zeros */
    ms_shape xs = {2, {R, C}}, ws = {1, {C}};

    op_io io = io2(MS_OP_RMSNORM, xs, x, ws, w);
    io.a.f[0] = 1e-5f;
    ref_rows(MS_OP_RMSNORM, x, w, ref, R, C, 1e-5);
    expect_op("rmsnorm", &io, ref, R * C, 1e-5);

    io = io1(MS_OP_LAYERNORM_PLAIN, xs, x);
    io.a.f[0] = 1e-5f;
    ref_rows(MS_OP_LAYERNORM_PLAIN, x, NULL, ref, R, C, 1e-5);
    expect_op("layernorm_plain", &io, ref, R * C, 1e-5);

    /* Large magnitudes: exp would overflow without the max subtracted. */
    float big[R * C];
    for (int k = 0; k < R * C; k++) big[k] = 500.0f * x[k];
    io = io1(MS_OP_LOG_SOFTMAX, xs, big);
    ref_rows(MS_OP_LOG_SOFTMAX, big, NULL, ref, R, C, 0);
    expect_op("log_softmax, |x| up to 1000", &io, ref, R * C, 1e-5);

    for (int t = 0; t < 2; t++) {
        const float temp = t ? 0.25f : 1.0f, *in = t ? big : x;
        io = io2(MS_OP_MASKED_SOFTMAX, xs, in, xs, mask);
        io.a.f[0] = temp;
        ref_rows(MS_OP_MASKED_SOFTMAX, in, mask, ref, R, C, temp);
        expect_op("masked_softmax", &io, ref, R * C, 1e-5);
    }
}

/* --- swiglu, rotary ------------------------------------------------------------------------ */

static void swiglu_op(void **state) {
    (void)state;
    enum { N = 40 };
    float g[N], u[N];
    double ref[N];
    fill(g, N, 3, -6, 6);
    fill(u, N, 4, -2, 2);
    g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f; /* saturated sigmoid: no NaN */
    for (int k = 0; k < N; k++) ref[k] = g[k] / (1.0 + exp(-(double)g[k])) * u[k];
    ms_shape s = {2, {5, 8}};
    op_io io = io2(MS_OP_SWIGLU, s, g, s, u);
    expect_op("swiglu", &io, ref, N, 1e-5);
}

/* HF rotate_half: out[i] = x[i] cos - x[i + D/2] sin, out[i + D/2] = x[i + D/2] cos + x[i] sin
 * with angle p * theta^(-2i/D) at position p. x [B, T, H, D]. */
static void ref_rotary(const float *x, double *y, int b, int t, int h, int d, double theta,
                       int t0) {
    for (int bi = 0; bi < b; bi++)
        for (int ti = 0; ti < t; ti++)
            for (int hh = 0; hh < h; hh++)
                for (int i = 0; i < d / 2; i++) {
                    const int64_t o = ((int64_t)(bi * t + ti) * h + hh) * d;
                    double ang = (t0 + ti) / pow(theta, 2.0 * i / d);
                    double a = x[o + i], c = x[o + i + d / 2];
                    y[o + i] = a * cos(ang) - c * sin(ang);
                    y[o + i + d / 2] = c * cos(ang) + a * sin(ang);
                }
}

static void rotary_op(void **state) {
    (void)state;
    enum { B = 2, T = 7, H = 3, D = 8 };
    static float x[B * T * H * D];
    static double ref[B * T * H * D];
    fill(x, B * T * H * D, 5, -1, 1);
    ms_shape s = {4, {B, T, H, D}};
    op_io io = io1(MS_OP_ROTARY, s, x);
    io.a.f[0] = 10000.0f;
    ref_rotary(x, ref, B, T, H, D, 10000.0, 0);
    expect_op("rotary", &io, ref, B * T * H * D, 1e-5);

    /* A shard of T starting at 4 (batch 1 only) rotates by global positions 4.. */
    static float part[T * H * D];
    static double pref[T * H * D];
    const int s0 = 4, tl = T - s0;
    memcpy(part, x + ((int64_t)(1 * T + s0) * H * D), sizeof(float) * (size_t)(tl * H * D));
    ref_rotary(part, pref, 1, tl, H, D, 10000.0, s0);
    io.lin[0] = (ms_shape){4, {1, tl, H, D}};
    io.x[0] = part;
    io.start[0][0] = 1, io.start[0][1] = s0;
    expect_op("rotary on a sequence shard", &io, pref, tl * H * D, 1e-5);
    /* ... which is the matching slice of the whole result. */
    expect_op("rotary shard vs whole", &io, ref + (int64_t)(1 * T + s0) * H * D, tl * H * D, 1e-5);
    /* Far into a long sequence the angles reach 1e5 radians: still exact to float precision. */
    const int far = 100000;
    ref_rotary(part, pref, 1, tl, H, D, 10000.0, far);
    io.start[0][1] = far;
    expect_op("rotary at position 100000", &io, pref, tl * H * D, 2e-5);
}

/* --- attention ------------------------------------------------------------------------------- */

/* Naive attention: query head h reads kv head h / (H / Hkv); q and out rows have H heads,
 * k and v rows Hkv (row strides qs, ks); mask [B, T] or NULL; causal by global position. */
typedef struct ref_attn {
    int b, tq, tk, h, hkv, d, q0;
    int64_t qs, ks, os;
    bool causal;
} ref_attn;

static void ref_attention(const ref_attn *a, const float *q, const float *k, const float *v,
                          const float *mask, double *out) {
    static double s[256];
    for (int bi = 0; bi < a->b; bi++)
        for (int i = 0; i < a->tq; i++)
            for (int h = 0; h < a->h; h++) {
                const int kh = h / (a->h / a->hkv);
                const float *qv = q + (int64_t)(bi * a->tq + i) * a->qs + h * a->d;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < a->tk; j++) {
                    bool see = (!a->causal || j <= a->q0 + i) && (!mask || mask[bi * a->tk + j]);
                    double dot = 0;
                    const float *kv = k + (int64_t)(bi * a->tk + j) * a->ks + kh * a->d;
                    for (int e = 0; e < a->d; e++) dot += (double)qv[e] * kv[e];
                    s[j] = see ? dot / sqrt((double)a->d) : -INFINITY;
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j < a->tk; j++) sum += s[j] > -INFINITY ? exp(s[j] - mx) : 0.0;
                double *o = out + (int64_t)(bi * a->tq + i) * a->os + h * a->d;
                for (int e = 0; e < a->d; e++) {
                    double acc = 0;
                    for (int j = 0; j < a->tk; j++)
                        if (s[j] > -INFINITY)
                            acc += exp(s[j] - mx) / sum *
                                   v[(int64_t)(bi * a->tk + j) * a->ks + kh * a->d + e];
                    o[e] = sum > 0 ? acc : 0.0;
                }
            }
}

/* The separate-k-and-v form: the same outputs and gradients as the packed form (whose
 * backward test_op_grads checks against finite differences). */
static void gqa_separate_kv(op_io *packed, const ms_shape *qs, int64_t nq) {
    static float k[MAXN], v[MAXN], dout[MAXN], dq[2][MAXN], dkv[MAXN], dk[MAXN], dv[MAXN];
    static float out[2][MAXN];
    const ms_shape *kvs = &packed->gin[1];
    const int64_t rows = kvs->d[0] * kvs->d[1], hd = kvs->d[3] * kvs->d[4];
    for (int64_t r = 0; r < rows; r++) {
        memcpy(k + r * hd, packed->x[1] + r * 2 * hd, sizeof(float) * (size_t)hd);
        memcpy(v + r * hd, packed->x[1] + r * 2 * hd + hd, sizeof(float) * (size_t)hd);
    }
    fill(dout, nq, 20, -1, 1);
    ms_shape ks = {4, {kvs->d[0], kvs->d[1], kvs->d[3], kvs->d[4]}};
    op_io sep = {.op = MS_OP_GQA_ATTENTION, .a = packed->a, .n_in = 3, .gin = {*qs, ks, ks}};
    sep.x[0] = packed->x[0], sep.x[1] = k, sep.x[2] = v;
    sep.dout = packed->dout = dout;
    packed->dx[0] = dq[0], packed->dx[1] = dkv;
    sep.dx[0] = dq[1], sep.dx[1] = dk, sep.dx[2] = dv;
    ms_error err = {0};
    int64_t n0, n1;
    if (op_run(packed, out[0], &n0, &err) || op_run(&sep, out[1], &n1, &err))
        fail_msg("gqa_attention: %s", err.msg);
    packed->dout = NULL;
    for (int64_t i = 0; i < nq; i++)
        if (out[0][i] != out[1][i] || dq[0][i] != dq[1][i])
            fail_msg("gqa_attention: separate k, v differ from packed kv at %lld", (long long)i);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < hd; j++)
            if (dk[r * hd + j] != dkv[r * 2 * hd + j] || dv[r * hd + j] != dkv[r * 2 * hd + hd + j])
                fail_msg("gqa_attention: dk or dv differ from packed dkv in row %lld",
                         (long long)r);
}

static void gqa_case(int b, int t, int h, int hkv, int d, bool causal) {
    static float q[MAXN], kv[MAXN];
    static double ref[MAXN];
    const int64_t nq = (int64_t)b * t * h * d, nkv = 2 * nq / (h / hkv);
    assert_true(nq <= MAXN && nkv <= MAXN);
    fill(q, nq, 6, -2, 2);
    fill(kv, nkv, 7, -2, 2);
    ref_attn ra = {b, t, t, h, hkv, d, 0, (int64_t)h * d, 2 * hkv * d, (int64_t)h * d, causal};
    ref_attention(&ra, q, kv, kv + hkv * d, NULL, ref);
    ms_shape qs = {4, {b, t, h, d}}, kvs = {5, {b, t, 2, hkv, d}};
    op_io io = io2(MS_OP_GQA_ATTENTION, qs, q, kvs, kv);
    io.a.i[0] = causal;
    char what[96];
    snprintf(what, sizeof what, "gqa_attention B%d T%d H%d Hkv%d D%d causal %d", b, t, h, hkv, d,
             causal);
    expect_op(what, &io, ref, nq, 1e-4);
    gqa_separate_kv(&io, &qs, nq);
    if (!causal || b != 1) return;
    /* Queries [s0, T) against all keys: causal positions are global. */
    const int s0 = t / 3 + 1;
    io.lin[0] = io.lout = (ms_shape){4, {1, t - s0, h, d}};
    io.x[0] = q + (int64_t)s0 * h * d;
    io.start[0][1] = s0;
    expect_op("gqa_attention on a query-sequence shard", &io, ref + (int64_t)s0 * h * d,
              (int64_t)(t - s0) * h * d, 1e-4);
}

static void gqa_attention_op(void **state) {
    (void)state;
    gqa_case(2, 5, 4, 2, 8, true);
    gqa_case(2, 5, 4, 2, 8, false);
    gqa_case(1, 70, 3, 1, 4, true); /* multi-query, more rows than one block of 64 */
    gqa_case(1, 9, 2, 2, 3, false); /* plain multi-head */
}

/* Variants whose inputs are too many or too large for tests/op_cases (test_rules runs every
 * placement combination on a 2x2 mesh as well) are brute-forced here on a mesh of 2: every
 * placement (R, S(d), P(sum)) of every input against one rank, and every candidate of the
 * rule in strict mode with its declared output placement. */
typedef struct mesh2_case {
    const char *name;
    int op;
    ms_op_attrs a;
    int n_in;
    ms_shape in[3];
} mesh2_case;

static ms_placements one_dim(ms_placement p) {
    ms_placements pl = {.n = 1, .p = {p}};
    ms_placements_default_order(&pl);
    return pl;
}

static bool mesh2_eager(mt_rank *r, ms_dmesh *dm, const mesh2_case *mc, const ms_tensor *g,
                        const ms_placements *pl, bool reshard, const ms_tensor *want,
                        const ms_placement *want_pl) {
    ms_error err = {0};
    ms_dtensor din[3], dout;
    const ms_dtensor *pin[3];
    for (int i = 0; i < mc->n_in; i++) {
        MT_OK(r, ms_dtensor_shard(dm, &g[i], &pl[i], &din[i], &err), &err);
        pin[i] = &din[i];
    }
    ms_eager_opts eo = {.allow_reshard = reshard};
    bool ran = MT_OK(r, ms_eager(mc->op, &mc->a, mc->n_in, pin, 1, &dout, &eo, &err), &err);
    bool ok = ran;
    ms_tensor full = {0};
    if (ok && MT_OK(r, ms_dtensor_full(&dout, &full, &err), &err)) {
        for (int64_t k = 0; k < ms_tensor_numel(want); k++) {
            double x = ms_tensor_f32(&full)[k], y = ms_tensor_f32(want)[k];
            ok &= fabs(x - y) <= 1e-5 * (1 + fabs(y));
        }
        if (want_pl) ok &= ms_placement_same_kind(dout.pl.p[0], *want_pl);
    }
    ms_tensor_release(&full);
    if (ran) ms_dtensor_release(&dout);
    for (int i = 0; i < mc->n_in; i++) ms_dtensor_release(&din[i]);
    return ok;
}

/* Input i's placement number o: R, S(0..nd-1), P(sum). */
static ms_placements option(const mesh2_case *mc, int i, int o) {
    int nd = mc->in[i].ndim;
    return one_dim(o == 0 ? ms_R() : o <= nd ? ms_S(o - 1) : ms_Psum());
}

static void mesh2_rules(mt_rank *r, void *arg) {
    const mesh2_case *mc = arg;
    ms_error err = {0};
    ms_mesh mesh;
    ms_mesh_parse(&mesh, "2", &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_tensor g[3], want;
    ms_shape out;
    op_io io = {.op = mc->op, .a = mc->a, .n_in = mc->n_in};
    MT_OK(r, ms_op_get(mc->op)->infer(&mc->a, mc->n_in, mc->in, &out, &err), &err);
    int combos = 1;
    for (int i = 0; i < mc->n_in; i++) {
        ms_tensor_alloc(r->ctx->device, MS_F32, mc->in[i].ndim, mc->in[i].d, &g[i], &err);
        fill(ms_tensor_f32(&g[i]), ms_tensor_numel(&g[i]), 30 + (uint64_t)i, -2, 2);
        io.gin[i] = mc->in[i], io.x[i] = ms_tensor_f32(&g[i]);
        combos *= mc->in[i].ndim + 2;
    }
    ms_tensor_alloc(r->ctx->device, MS_F32, out.ndim, out.d, &want, &err);
    int64_t n;
    MT_OK(r, op_run(&io, ms_tensor_f32(&want), &n, &err), &err);
    for (int combo = 0; combo < combos && r->failures == 0; combo++) {
        ms_placements pl[3];
        for (int i = 0, rem = combo; i < mc->n_in; rem /= mc->in[i].ndim + 2, i++)
            pl[i] = option(mc, i, rem % (mc->in[i].ndim + 2));
        MT_CHECK(r, mesh2_eager(r, dm, mc, g, pl, true, &want, NULL),
                 "%s: placement combination %d differs from one rank", mc->name, combo);
    }
    ms_rule_cand cands[MS_OP_MAX_CANDS];
    int nc = ms_op_get(mc->op)->rule(&mc->a, mc->n_in, mc->in, 2, cands);
    for (int c = 0; c < nc; c++) {
        ms_placements pl[3];
        for (int i = 0; i < mc->n_in; i++) pl[i] = one_dim(cands[c].in[i]);
        MT_CHECK(r, mesh2_eager(r, dm, mc, g, pl, false, &want, &cands[c].out[0]),
                 "%s: candidate %d in strict mode", mc->name, c);
    }
    for (int i = 0; i < mc->n_in; i++) ms_tensor_release(&g[i]);
    ms_tensor_release(&want);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void variant_rules_on_mesh2(void **state) {
    (void)state;
    static const mesh2_case cases[] = {
        {"gqa_attention, separate k and v",
         MS_OP_GQA_ATTENTION,
         {.i = {1}},
         3,
         {{4, {2, 3, 4, 2}}, {4, {2, 3, 2, 2}}, {4, {2, 3, 2, 2}}}},
        {"linear from heads with bias",
         MS_OP_LINEAR,
         {.i = {2}},
         3,
         {{3, {3, 2, 3}}, {3, {5, 2, 3}}, {1, {5}}}},
        {"linear to heads with bias",
         MS_OP_LINEAR,
         {.i = {1}},
         3,
         {{2, {3, 4}}, {3, {2, 3, 4}}, {2, {2, 3}}}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        mt_run(2, mesh2_rules, (void *)&cases[k]);
}

/* Two contracted dims give the gradients of the same product with them flattened into one
 * (whose backward test_op_grads checks against finite differences). */
static void linear_two_k_dims_backward(void **state) {
    (void)state;
    static float x[120], w[60], b[5], dy[40], dx[2][120], dw[2][60], db[2][5], y[2][40];
    fill(x, 120, 40, -1, 1), fill(w, 60, 41, -1, 1), fill(b, 5, 42, -1, 1), fill(dy, 40, 43, -1, 1);
    op_io two = {.op = MS_OP_LINEAR,
                 .a = {.i = {2}},
                 .n_in = 3,
                 .gin = {{4, {2, 4, 3, 4}}, {3, {5, 3, 4}}, {1, {5}}}};
    op_io one = {.op = MS_OP_LINEAR,
                 .a = {.i = {1}},
                 .n_in = 3,
                 .gin = {{3, {2, 4, 12}}, {2, {5, 12}}, {1, {5}}}};
    op_io *ios[2] = {&two, &one};
    for (int v = 0; v < 2; v++) {
        ios[v]->x[0] = x, ios[v]->x[1] = w, ios[v]->x[2] = b, ios[v]->dout = dy;
        ios[v]->dx[0] = dx[v], ios[v]->dx[1] = dw[v], ios[v]->dx[2] = db[v];
        ms_error err = {0};
        int64_t n;
        if (op_run(ios[v], y[v], &n, &err) != MS_OK) fail_msg("linear: %s", err.msg);
        assert_int_equal(n, 40);
    }
    assert_memory_equal(y[0], y[1], sizeof y[0]);
    assert_memory_equal(dx[0], dx[1], sizeof dx[0]);
    assert_memory_equal(dw[0], dw[1], sizeof dw[0]);
    assert_memory_equal(db[0], db[1], sizeof db[0]);
}

static void padded_attention_op(void **state) {
    (void)state;
    enum { B = 2, T = 6, NH = 2, C = 8 };
    static float qkv[B * T * 3 * C], mask[B * T];
    static double ref[B * T * C];
    fill(qkv, B * T * 3 * C, 8, -2, 2);
    for (int k = 0; k < B * T; k++) mask[k] = (k % 4) != 2;
    mask[T] = 0; /* batch 1 pads its first key: its query 0 sees nothing when causal */
    for (int causal = 0; causal < 2; causal++) {
        ref_attn ra = {B, T, T, NH, NH, C / NH, 0, 3 * C, 3 * C, C, causal};
        ref_attention(&ra, qkv, qkv + C, qkv + 2 * C, mask, ref);
        ms_shape qs = {4, {B, T, 3, C}}, ms = {2, {B, T}};
        op_io io = io2(MS_OP_PADDED_ATTENTION, qs, qkv, ms, mask);
        io.a.i[0] = NH, io.a.i[1] = causal;
        expect_op(causal ? "padded_attention causal" : "padded_attention", &io, ref, B * T * C,
                  1e-4);
        if (causal)
            for (int e = 0; e < C; e++) assert_true(ref[T * C + e] == 0.0);
    }
}

/* --- linear, bmm ---------------------------------------------------------------------------- */

/* Backward against its own loops: dx = dy W, dW = dy^T x, db = column sums of dy. */
static void linear_grads(const char *what, op_io *io, int64_t m, int64_t kk, int64_t nn) {
    static float dy[MAXN], dx[MAXN], dw[MAXN], db[MAXN], y[MAXN];
    fill(dy, m * nn, 19, -1, 1);
    io->dout = dy, io->dx[0] = dx, io->dx[1] = dw, io->dx[2] = io->n_in == 3 ? db : NULL;
    ms_error err = {0};
    int64_t n;
    if (op_run(io, y, &n, &err) != MS_OK) fail_msg("%s backward: %s", what, err.msg);
    io->dout = NULL;
    const float *x = io->x[0], *w = io->x[1];
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < kk; k++) {
            double acc = 0;
            for (int64_t j = 0; j < nn; j++) acc += (double)dy[i * nn + j] * w[j * kk + k];
            if (fabs(dx[i * kk + k] - acc) > 1e-5 * fmax(1, fabs(acc))) fail_msg("%s: dx", what);
        }
    for (int64_t j = 0; j < nn; j++) {
        double sb = 0;
        for (int64_t i = 0; i < m; i++) sb += dy[i * nn + j];
        if (io->n_in == 3 && fabs(db[j] - sb) > 1e-5 * fmax(1, fabs(sb))) fail_msg("%s: db", what);
        for (int64_t k = 0; k < kk; k++) {
            double acc = 0;
            for (int64_t i = 0; i < m; i++) acc += (double)dy[i * nn + j] * x[i * kk + k];
            if (fabs(dw[j * kk + k] - acc) > 1e-5 * fmax(1, fabs(acc))) fail_msg("%s: dW", what);
        }
    }
}

/* x [..., K...] with kc K dims, W [N..., K...]: out[i][n] = sum_k x[i][k] W[n][k] (+ b[n]). */
static void linear_case(const char *what, ms_shape xs, ms_shape ws, int kc, bool with_bias) {
    static float x[MAXN], w[MAXN], bias[MAXN];
    static double ref[MAXN];
    int64_t kk = 1, nn = 1;
    for (int d = xs.ndim - kc; d < xs.ndim; d++) kk *= xs.d[d];
    for (int d = 0; d < ws.ndim - kc; d++) nn *= ws.d[d];
    const int64_t m = numel(&xs) / kk;
    fill(x, numel(&xs), 9, -1, 1);
    fill(w, numel(&ws), 10, -1, 1);
    fill(bias, nn, 11, -1, 1);
    for (int64_t i = 0; i < m; i++)
        for (int64_t n = 0; n < nn; n++) {
            double acc = with_bias ? bias[n] : 0.0;
            for (int64_t k = 0; k < kk; k++) acc += (double)x[i * kk + k] * w[n * kk + k];
            ref[i * nn + n] = acc;
        }
    op_io io = io2(MS_OP_LINEAR, xs, x, ws, w);
    io.a.i[0] = kc;
    if (with_bias) {
        io.n_in = 3, io.x[2] = bias;
        io.gin[2] = (ms_shape){ws.ndim - kc, {0}};
        memcpy(io.gin[2].d, ws.d, sizeof(int64_t) * (size_t)(ws.ndim - kc));
    }
    expect_op(what, &io, ref, m * nn, 1e-5);
    linear_grads(what, &io, m, kk, nn);
}

static void linear_op(void **state) {
    (void)state;
    linear_case("linear", (ms_shape){3, {2, 3, 7}}, (ms_shape){2, {5, 7}}, 1, false);
    linear_case("linear with bias", (ms_shape){3, {2, 3, 7}}, (ms_shape){2, {5, 7}}, 1, true);
    /* A projection to heads, W [H, D, C], and back, W [C, H, D] with two K dims. */
    linear_case("linear to heads", (ms_shape){3, {2, 3, 8}}, (ms_shape){3, {4, 3, 8}}, 1, true);
    linear_case("linear from heads", (ms_shape){4, {2, 3, 4, 3}}, (ms_shape){3, {8, 4, 3}}, 2,
                true);
    ms_shape out;
    ms_error err = {0};
    ms_shape in[2] = {{4, {2, 3, 4, 3}}, {3, {8, 4, 3}}};
    ms_op_attrs two = {.i = {2}};
    assert_int_equal(ms_op_get(MS_OP_LINEAR)->infer(&two, 2, in, &out, &err), MS_OK);
    assert_int_equal(out.ndim, 3);
    assert_true(out.d[0] == 2 && out.d[1] == 3 && out.d[2] == 8);
}

/* Broadcast bmm by explicit index arithmetic: out batch index -> each operand's index. */
static void ref_bmm(const ms_shape *as, const float *a, const ms_shape *bs, const float *b,
                    const ms_shape *os, double *out) {
    const int nb = os->ndim - 2, m = (int)os->d[nb], n = (int)os->d[nb + 1];
    const int k = (int)as->d[as->ndim - 1];
    int64_t items = 1;
    for (int d = 0; d < nb; d++) items *= os->d[d];
    for (int64_t it = 0; it < items; it++) {
        int64_t ia = 0, ib = 0, rem = it, ma = 1, mb = 1;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t idx = rem % os->d[d];
            rem /= os->d[d];
            int da = d - (nb - (as->ndim - 2)), db = d - (nb - (bs->ndim - 2));
            if (da >= 0) ia += (as->d[da] == 1 ? 0 : idx) * ma, ma *= as->d[da];
            if (db >= 0) ib += (bs->d[db] == 1 ? 0 : idx) * mb, mb *= bs->d[db];
        }
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double acc = 0;
                for (int e = 0; e < k; e++)
                    acc += (double)a[(ia * m + i) * k + e] * b[(ib * k + e) * n + j];
                out[(it * m + i) * n + j] = acc;
            }
    }
}

static void bmm_case(const char *what, ms_shape as, ms_shape bs, ms_shape want) {
    static float a[MAXN], b[MAXN];
    static double ref[MAXN];
    fill(a, numel(&as), 12, -1, 1);
    fill(b, numel(&bs), 13, -1, 1);
    ref_bmm(&as, a, &bs, b, &want, ref);
    op_io io = io2(MS_OP_BMM, as, a, bs, b);
    ms_shape got;
    ms_error err = {0};
    assert_int_equal(ms_op_get(MS_OP_BMM)->infer(&io.a, 2, io.gin, &got, &err), MS_OK);
    assert_int_equal(got.ndim, want.ndim);
    for (int d = 0; d < want.ndim; d++) assert_int_equal(got.d[d], want.d[d]);
    expect_op(what, &io, ref, numel(&want), 1e-5);
}

static void bmm_op(void **state) {
    (void)state;
    bmm_case("bmm same batch", (ms_shape){3, {3, 2, 4}}, (ms_shape){3, {3, 4, 5}},
             (ms_shape){3, {3, 2, 5}});
    bmm_case("bmm size-1 batch dims on both sides", (ms_shape){4, {2, 1, 3, 4}},
             (ms_shape){4, {1, 3, 4, 2}}, (ms_shape){4, {2, 3, 3, 2}});
    bmm_case("bmm missing batch dim", (ms_shape){2, {3, 4}}, (ms_shape){3, {5, 4, 2}},
             (ms_shape){3, {5, 3, 2}});
    bmm_case("bmm a broadcast over b's leading dims", (ms_shape){3, {1, 2, 3}},
             (ms_shape){4, {2, 3, 3, 4}}, (ms_shape){4, {2, 3, 2, 4}});
}

/* --- losses --------------------------------------------------------------------------------- */

static void nll_and_xent_smooth(void **state) {
    (void)state;
    enum { R = 6, V = 7 };
    float x[R * V], tg[R] = {3, -1, 0, 6, 2, -5};
    double ref[R];
    fill(x, R * V, 14, -3, 3);
    ms_shape xs = {2, {R, V}}, ts = {1, {R}};
    for (int i = 0; i < R; i++) ref[i] = tg[i] < 0 ? 0.0 : -(double)x[i * V + (int)tg[i]];
    op_io io = io2(MS_OP_NLL_LOSS, xs, x, ts, tg);
    expect_op("nll_loss", &io, ref, R, 1e-6);

    for (int big = 0; big < 2; big++) {
        float lg[R * V];
        for (int k = 0; k < R * V; k++) lg[k] = big ? 300.0f * x[k] : x[k];
        for (int t = 0; t < 2; t++) {
            const double s = t ? 0.2 : 0.0;
            for (int i = 0; i < R; i++) {
                double mx = -INFINITY, se = 0, mean = 0;
                for (int j = 0; j < V; j++) mx = fmax(mx, lg[i * V + j]);
                for (int j = 0; j < V; j++) se += exp(lg[i * V + j] - mx), mean += lg[i * V + j];
                const double lse = mx + log(se);
                ref[i] = tg[i] < 0
                             ? 0.0
                             : (1 - s) * (lse - lg[i * V + (int)tg[i]]) + s * (lse - mean / V);
            }
            io = io2(MS_OP_XENT_SMOOTH, xs, lg, ts, tg);
            io.a.f[0] = (float)s;
            expect_op("cross_entropy_smooth", &io, ref, R, 1e-5);
            if (t == 0 && !big) { /* no smoothing: the built-in cross-entropy's losses */
                op_io plain = io2(MS_OP_XENT, xs, lg, ts, tg);
                expect_op("cross_entropy_smooth with s = 0 vs cross_entropy", &plain, ref, R, 1e-5);
            }
        }
    }
}

static void pointwise_losses(void **state) {
    (void)state;
    enum { N = 35 };
    float a[N], b[N];
    fill(a, N, 15, -2, 2);
    fill(b, N, 16, -2, 2);
    b[0] = a[0]; /* a zero difference */
    ms_shape s = {2, {5, 7}};
    const double delta = 0.5;
    double mse = 0, l1 = 0, hub = 0;
    for (int k = 0; k < N; k++) {
        double dd = (double)a[k] - b[k], ad = fabs(dd);
        mse += dd * dd / N, l1 += ad / N;
        hub += (ad <= delta ? 0.5 * dd * dd : delta * (ad - 0.5 * delta)) / N;
    }
    op_io io = io2(MS_OP_MSE_LOSS, s, a, s, b);
    expect_op("mse_loss", &io, &mse, 1, 1e-6);
    io.op = MS_OP_L1_LOSS;
    expect_op("l1_loss", &io, &l1, 1, 1e-6);
    io.op = MS_OP_HUBER_LOSS, io.a.f[0] = (float)delta;
    expect_op("huber_loss", &io, &hub, 1, 1e-6);
    /* A shard's result is its part of the GLOBAL mean: rows 1..2 divided by all 35. */
    double part = 0;
    for (int k = 7; k < 21; k++) part += ((double)a[k] - b[k]) * ((double)a[k] - b[k]) / N;
    io = io2(MS_OP_MSE_LOSS, s, a + 7, s, b + 7);
    io.lin[0] = io.lin[1] = (ms_shape){2, {2, 7}};
    expect_op("mse_loss of a shard", &io, &part, 1, 1e-6);
}

static void cosine_op(void **state) {
    (void)state;
    enum { R = 5, C = 6 };
    float a[R * C], b[R * C];
    double ref[R];
    fill(a, R * C, 17, -1, 1);
    fill(b, R * C, 18, -1, 1);
    for (int j = 0; j < C; j++) a[2 * C + j] = 0.0f, b[3 * C + j] = 1e3f * a[3 * C + j];
    const double eps = 1e-8;
    for (int i = 0; i < R; i++) {
        double ab = 0, aa = 0, bb = 0;
        for (int j = 0; j < C; j++) {
            ab += (double)a[i * C + j] * b[i * C + j];
            aa += (double)a[i * C + j] * a[i * C + j], bb += (double)b[i * C + j] * b[i * C + j];
        }
        ref[i] = ab / (fmax(sqrt(aa), eps) * fmax(sqrt(bb), eps));
    }
    assert_true(ref[2] == 0.0 && fabs(ref[3] - 1.0) < 1e-9);
    ms_shape s = {2, {R, C}};
    op_io io = io2(MS_OP_COSINE_SIMILARITY, s, a, s, b);
    io.a.f[0] = (float)eps;
    expect_op("cosine_similarity", &io, ref, R, 1e-5);
}

/* --- bad shapes and attributes --------------------------------------------------------------- */

static void expect_rejected(int op, ms_op_attrs a, int n_in, const ms_shape *in, const char *want1,
                            const char *want2) {
    ms_shape out[MS_OP_MAX_OUT];
    ms_error err = {0};
    const ms_op_def *def = ms_op_get(op);
    ms_status st = def->infer(&a, n_in, in, out, &err);
    if (st != MS_ERR_INVALID) fail_msg("%s accepted bad input", def->name);
    if (!strstr(err.msg, want1) || !strstr(err.msg, want2))
        fail_msg("%s: error '%s' does not name '%s' and '%s'", def->name, err.msg, want1, want2);
}

static void infer_rejects_bad_input(void **state) {
    (void)state;
    ms_op_attrs none = {0}, eps = {.f = {1e-5f}}, theta = {.f = {10000.0f}};
    ms_shape rms[2] = {{2, {3, 5}}, {1, {4}}};
    expect_rejected(MS_OP_RMSNORM, eps, 2, rms, "rmsnorm", "[3, 5] and [4]");
    ms_shape odd[1] = {{4, {2, 3, 2, 5}}};
    expect_rejected(MS_OP_ROTARY, theta, 1, odd, "rotary", "[2, 3, 2, 5]");
    ms_shape rot[1] = {{4, {2, 3, 2, 4}}};
    expect_rejected(MS_OP_ROTARY, none, 1, rot, "rotary", "theta");
    ms_shape gqa[2] = {{4, {2, 3, 3, 4}}, {5, {2, 3, 2, 2, 4}}};
    expect_rejected(MS_OP_GQA_ATTENTION, none, 2, gqa, "gqa_attention", "multiple of Hkv");
    ms_shape pad[2] = {{4, {2, 3, 3, 6}}, {2, {2, 4}}};
    ms_op_attrs heads = {.i = {4, 1}};
    expect_rejected(MS_OP_PADDED_ATTENTION, heads, 2, pad, "padded_attention", "[2, 4]");
    pad[1].d[1] = 3;
    expect_rejected(MS_OP_PADDED_ATTENTION, heads, 2, pad, "padded_attention", "4 heads");
    ms_shape lin[3] = {{2, {3, 4}}, {2, {5, 3}}, {1, {5}}};
    expect_rejected(MS_OP_LINEAR, none, 3, lin, "linear", "[5, 3]");
    ms_shape lin2[2] = {{3, {2, 4, 3}}, {3, {8, 3, 4}}};
    expect_rejected(MS_OP_LINEAR, (ms_op_attrs){.i = {2}}, 2, lin2, "linear", "[8, 3, 4]");
    ms_shape bmm[2] = {{3, {2, 3, 4}}, {3, {3, 4, 5}}};
    expect_rejected(MS_OP_BMM, none, 2, bmm, "bmm", "broadcastable");
    ms_shape nll[2] = {{2, {3, 5}}, {1, {4}}};
    expect_rejected(MS_OP_NLL_LOSS, none, 2, nll, "nll_loss", "[3, 5] and [4]");
    ms_shape mse[2] = {{2, {3, 5}}, {2, {5, 3}}};
    expect_rejected(MS_OP_MSE_LOSS, none, 2, mse, "mse_loss", "[5, 3]");
    ms_shape sq[2] = {{1, {7}}, {1, {7}}};
    expect_rejected(MS_OP_HUBER_LOSS, none, 2, sq, "huber_loss", "delta");
    ms_op_attrs s1 = {.f = {1.0f}};
    expect_rejected(MS_OP_XENT_SMOOTH, s1, 2, nll, "cross_entropy_smooth", "[0, 1)");
    expect_rejected(MS_OP_MASKED_SOFTMAX, none, 2, sq, "masked_softmax", "temperature");
    expect_rejected(MS_OP_COSINE_SIMILARITY, eps, 2, mse, "cosine_similarity", "[3, 5]");
    expect_rejected(MS_OP_SWIGLU, none, 2, mse, "swiglu", "same shape");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(rowwise_ops),
    cmocka_unit_test(swiglu_op),
    cmocka_unit_test(rotary_op),
    cmocka_unit_test(gqa_attention_op),
    cmocka_unit_test(variant_rules_on_mesh2),
    cmocka_unit_test(padded_attention_op),
    cmocka_unit_test(linear_op),
    cmocka_unit_test(linear_two_k_dims_backward),
    cmocka_unit_test(bmm_op),
    cmocka_unit_test(nll_and_xent_smooth),
    cmocka_unit_test(pointwise_losses),
    cmocka_unit_test(cosine_op),
    cmocka_unit_test(infer_rejects_bad_input),
};
MT_MAIN("ops layers", tests)

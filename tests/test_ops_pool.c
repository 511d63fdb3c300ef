/* test_ops_pool.c - the vision and speech operators (engine/ops/ops_pool.c), forward and
 * backward, against float64 reference loops written here from PyTorch's and ONNX's
 * definitions (they share no code with the kernels): windows that pad, overlap and leave a
 * remainder, both average divisors, ties and NaNs in max pooling, groups of one channel and
 * one group, resizes up and down by sizes and by scales; results PyTorch prints for the same
 * inputs; the costs the ops report; group_norm's weight and bias gradients as partial sums
 * under batch sharding; and infer's errors on bad attributes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"
#include "engine/core/philox.h"
#include "engine/ops/op.h"
#include "tests/op_cases.h"
#include "tests/testkit.h"

#define MAXN 4096

/* ---- one call of an op on host arrays ----------------------------------------------------- */

typedef struct call_io {
    int op;
    ms_op_attrs a;
    int n_in;
    ms_shape in[3];
    const float *x[3];
    const float *dout; /* set: backward too, every input gradient from zeros into dx[i] */
    float *y, *dx[3];  /* the output [MAXN], the input gradients [MAXN] (NULL: not wanted) */
    ms_shape out;      /* set by run */
} call_io;

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

static void wrap(ms_tensor *t, const float *p, const ms_shape *s) {
    ms_error err = {0};
    assert_int_equal(ms_tensor_wrap((void *)p, MS_F32, s->ndim, s->d, t, &err), MS_OK);
}

static void run(call_io *io) {
    const ms_op_def *def = ms_op_get(io->op);
    ms_error err = {0};
    if (def->infer(&io->a, io->n_in, io->in, &io->out, &err) != MS_OK)
        fail_msg("%s: infer: %s", def->name, err.msg);
    assert_true(numel(&io->out) <= MAXN);
    ms_op_call c = mt_op_call_whole(&io->a, io->n_in, io->in, 1, &io->out);
    ms_tensor in[3] = {0}, din[3] = {0}, out = {0}, dout = {0}, saved[MS_OP_MAX_SAVED] = {0};
    for (int i = 0; i < io->n_in; i++) wrap(&in[i], io->x[i], &io->in[i]), c.in[i] = &in[i];
    wrap(&out, io->y, &io->out);
    c.out[0] = &out;
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    if (def->saved_floats) def->saved_floats(&io->a, &c, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (sizes[k]) {
            ms_tensor_alloc(ms_device_host(), MS_F32, 1, &sizes[k], &saved[k], &err);
            c.saved[k] = &saved[k];
        }
    if (def->forward(&c, &err) != MS_OK) fail_msg("%s: forward: %s", def->name, err.msg);
    if (io->dout) {
        wrap(&dout, io->dout, &io->out);
        c.dout[0] = &dout;
        for (int i = 0; i < io->n_in; i++)
            if (io->dx[i]) {
                memset(io->dx[i], 0, sizeof(float) * (size_t)numel(&io->in[i]));
                wrap(&din[i], io->dx[i], &io->in[i]), c.din[i] = &din[i];
            }
        if (def->backward(&c, &err) != MS_OK) fail_msg("%s: backward: %s", def->name, err.msg);
    }
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&saved[k]);
    for (int i = 0; i < 3; i++) ms_tensor_release(&in[i]), ms_tensor_release(&din[i]);
    ms_tensor_release(&out);
    ms_tensor_release(&dout);
}

static void fill(float *x, int64_t n, uint64_t stream, float lo, float hi) {
    for (int64_t k = 0; k < n; k++)
        x[k] = lo + (hi - lo) * ms_philox_uniform(9, stream, (uint64_t)k);
}

/* got against ref[0..n): NaN where ref is NaN, else within rel |ref| + abs. */
static void expect_near(const char *what, const float *got, const double *ref, int64_t n,
                        double rel, double abs) {
    for (int64_t k = 0; k < n; k++) {
        bool ok = isnan(ref[k]) ? isnan(got[k]) : fabs(got[k] - ref[k]) <= rel * fabs(ref[k]) + abs;
        if (!ok)
            fail_msg("%s: element %lld is %.9g, reference %.9g", what, (long long)k, got[k],
                     ref[k]);
    }
}

static void expect_values(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t k = 0; k < n; k++)
        if (fabsf(got[k] - want[k]) > 1e-5f * (1 + fabsf(want[k])))
            fail_msg("%s: element %lld is %.7g, PyTorch gives %.7g", what, (long long)k, got[k],
                     want[k]);
}

/* ---- pooling ------------------------------------------------------------------------------ */

typedef struct pool_case {
    int k; /* spatial dims: 1 ([N, C, L], h = kh = sh = 1, ph = 0) or 2 */
    bool max, excl;
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
} pool_case;

static call_io pool_io(const pool_case *p, const float *x) {
    call_io io = {.n_in = 1, .x = {x}};
    if (p->k == 1) {
        io.op = p->max ? MS_OP_MAX_POOL1D : MS_OP_AVG_POOL1D;
        io.in[0] = (ms_shape){3, {p->n, p->c, p->w}};
        io.a = (ms_op_attrs){.i = {p->kw, p->sw, p->pw, p->excl}};
    } else {
        io.op = p->max ? MS_OP_MAX_POOL2D : MS_OP_AVG_POOL2D;
        io.in[0] = (ms_shape){4, {p->n, p->c, p->h, p->w}};
        io.a = (ms_op_attrs){.i = {p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, p->excl}};
    }
    return io;
}

/* The definition: the in-plane elements of each window; max the first of the largest (a NaN
 * wins), its gradient there; avg their sum over kh kw (excl: over their count), its gradient
 * spread evenly. */
static void pool_ref(const pool_case *p, const float *x, const float *dout, double *y, double *dx) {
    const int64_t oh = (p->h + 2 * p->ph - p->kh) / p->sh + 1,
                  ow = (p->w + 2 * p->pw - p->kw) / p->sw + 1;
    memset(dx, 0, sizeof(double) * (size_t)(p->n * p->c * p->h * p->w));
    for (int64_t q = 0, o = 0; q < p->n * p->c; q++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++, o++) {
                int64_t at[64], cnt = 0, best = -1;
                double sum = 0;
                for (int64_t i = 0; i < p->kh; i++)
                    for (int64_t j = 0; j < p->kw; j++) {
                        int64_t r = oy * p->sh - p->ph + i, c = ox * p->sw - p->pw + j;
                        if (r < 0 || r >= p->h || c < 0 || c >= p->w) continue;
                        int64_t e = (q * p->h + r) * p->w + c;
                        double v = x[e];
                        if (best < 0 || v > x[best] || (isnan(v) && !isnan(x[best]))) best = e;
                        sum += v, at[cnt++] = e;
                    }
                double div = p->excl ? (double)cnt : (double)(p->kh * p->kw);
                y[o] = p->max ? x[best] : sum / div;
                if (p->max) dx[best] += dout[o];
                for (int64_t k = 0; k < cnt && !p->max; k++) dx[at[k]] += dout[o] / div;
            }
}

static void pool_check(const char *what, const pool_case *p, const float *x) {
    static float y[MAXN], dx[MAXN], dout[MAXN];
    static double ry[MAXN], rdx[MAXN];
    call_io io = pool_io(p, x);
    fill(dout, MAXN, 2, -1, 1);
    io.y = y, io.dout = dout, io.dx[0] = dx;
    run(&io);
    pool_ref(p, x, dout, ry, rdx);
    expect_near(what, y, ry, numel(&io.out), p->max ? 0 : 1e-6, 0);
    expect_near(what, dx, rdx, numel(&io.in[0]), 1e-6, 1e-7);
}

static void pooling(void **state) {
    (void)state;
    static const pool_case cases[] = {
        /* 1-D: overlapping, padded up to half the window, remainders */
        {1, true, false, 2, 3, 1, 11, 1, 3, 1, 2, 0, 1},
        {1, true, false, 3, 2, 1, 9, 1, 4, 1, 1, 0, 2},
        {1, false, false, 2, 3, 1, 11, 1, 3, 1, 2, 0, 1},
        {1, false, true, 2, 3, 1, 11, 1, 4, 1, 3, 0, 2},
        {1, false, false, 1, 2, 1, 6, 1, 6, 1, 1, 0, 0},
        /* 2-D: square and oblong windows, padding on one or both dims */
        {2, true, false, 2, 3, 7, 6, 3, 3, 2, 2, 1, 1},
        {2, true, false, 2, 2, 5, 7, 2, 3, 1, 2, 0, 1},
        {2, true, false, 1, 3, 8, 5, 5, 2, 3, 2, 2, 0},
        {2, false, false, 2, 3, 7, 6, 3, 3, 2, 2, 1, 1},
        {2, false, true, 2, 3, 7, 6, 3, 3, 2, 2, 1, 1},
        {2, false, true, 1, 3, 8, 5, 5, 2, 3, 2, 2, 1},
        {2, false, false, 2, 2, 4, 4, 2, 2, 2, 2, 0, 0},
    };
    static float x[MAXN];
    char what[64];
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        fill(x, MAXN, 100 + k, -2, 2);
        snprintf(what, sizeof what, "pooling case %zu", k);
        pool_check(what, &cases[k], x);
        /* ties everywhere: the gradient must go to the first largest */
        for (int64_t i = 0; i < MAXN; i++) x[i] = floorf(x[i] + 2);
        snprintf(what, sizeof what, "pooling case %zu with ties", k);
        pool_check(what, &cases[k], x);
    }
    /* a NaN wins its windows and takes their gradient; the other windows are untouched */
    fill(x, MAXN, 7, -2, 2);
    x[5] = NAN;
    pool_check("max_pool1d with a NaN", &cases[0], x);
    pool_check("avg_pool1d with a NaN", &cases[2], x);
}

/* Results PyTorch 2.x prints for the same calls. */
static void pooling_as_pytorch(void **state) {
    (void)state;
    const float x[5] = {1, 2, 3, 4, 5}, ties[4] = {1, 3, 3, 2}, ones[5] = {1, 1, 1, 1, 1};
    float y[MAXN], dx[MAXN];
    /* F.avg_pool1d(x, 3, 1, 1) and with count_include_pad=False */
    call_io io = {.op = MS_OP_AVG_POOL1D, .a.i = {3, 1, 1, 0}, .n_in = 1, .in = {{3, {1, 1, 5}}}};
    io.x[0] = x, io.y = y;
    run(&io);
    expect_values("avg_pool1d count_include_pad", y, (const float[]){1, 2, 3, 4, 3}, 5);
    io.a.i[3] = 1;
    run(&io);
    expect_values("avg_pool1d exclude pad", y, (const float[]){1.5f, 2, 3, 4, 4.5f}, 5);
    /* F.max_pool1d(x, 2, 1) on [1, 3, 3, 2], backward of ones: the first 3 wins the tie */
    io = (call_io){.op = MS_OP_MAX_POOL1D, .a.i = {2, 1, 0}, .n_in = 1, .in = {{3, {1, 1, 4}}}};
    io.x[0] = ties, io.y = y, io.dout = ones, io.dx[0] = dx;
    run(&io);
    expect_values("max_pool1d ties", y, (const float[]){3, 3, 3}, 3);
    expect_values("max_pool1d ties backward", dx, (const float[]){0, 2, 1, 0}, 4);
    /* F.max_pool2d on a 4x4 ramp, kernel 2, stride 2: the bottom-right of each block */
    float ramp[16];
    for (int i = 0; i < 16; i++) ramp[i] = (float)i;
    io = (call_io){
        .op = MS_OP_MAX_POOL2D, .a.i = {2, 2, 2, 2}, .n_in = 1, .in = {{4, {1, 1, 4, 4}}}};
    io.x[0] = ramp, io.y = y;
    run(&io);
    expect_values("max_pool2d", y, (const float[]){5, 7, 13, 15}, 4);
}

/* ---- global average pooling ----------------------------------------------------------------- */

static void global_avg_pool(void **state) {
    (void)state;
    static const ms_shape shapes[] = {{4, {2, 3, 4, 5}}, {3, {3, 2, 7}}, {5, {1, 2, 2, 3, 2}}};
    static float x[MAXN], y[MAXN], dx[MAXN], dout[MAXN];
    static double ry[MAXN], rdx[MAXN];
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const ms_shape *s = &shapes[k];
        const int64_t planes = s->d[0] * s->d[1], sp = numel(s) / planes;
        fill(x, numel(s), 20 + k, -3, 3), fill(dout, planes, 30 + k, -1, 1);
        call_io io = {.op = MS_OP_GLOBAL_AVG_POOL, .n_in = 1, .in = {*s}, .dout = dout, .y = y};
        io.x[0] = x, io.dx[0] = dx;
        run(&io);
        assert_int_equal(io.out.ndim, s->ndim);
        for (int d = 2; d < s->ndim; d++) assert_int_equal(io.out.d[d], 1);
        for (int64_t q = 0; q < planes; q++) {
            double m = 0;
            for (int64_t e = 0; e < sp; e++) m += x[q * sp + e];
            ry[q] = m / (double)sp;
            for (int64_t e = 0; e < sp; e++) rdx[q * sp + e] = dout[q] / (double)sp;
        }
        expect_near("global_avg_pool", y, ry, planes, 1e-6, 1e-7);
        expect_near("global_avg_pool backward", dx, rdx, numel(s), 1e-6, 1e-8);
    }
}

/* ---- group normalisation -------------------------------------------------------------------- */

typedef struct gn_ref {
    const float *x, *w, *b, *dout;
    int64_t n, c, s, groups;
    double eps;
    double *y, *dx, *dw, *db;
} gn_ref;

/* Per (sample, group): mean, biased variance; y = xhat w + b; the gradients from the chain rule
 * through xhat = (x - mean) / sqrt(var + eps). */
static void group_norm_ref(const gn_ref *r) {
    const int64_t cpg = r->c / r->groups, len = cpg * r->s;
    memset(r->dw, 0, sizeof(double) * (size_t)r->c);
    memset(r->db, 0, sizeof(double) * (size_t)r->c);
    for (int64_t row = 0; row < r->n * r->groups; row++) {
        const int64_t base = row * len, c0 = row % r->groups * cpg;
        double m = 0, v = 0, a = 0, bsum = 0;
        for (int64_t k = 0; k < len; k++) m += r->x[base + k] / (double)len;
        for (int64_t k = 0; k < len; k++) v += pow(r->x[base + k] - m, 2) / (double)len;
        const double rs = 1 / sqrt(v + r->eps);
        for (int64_t k = 0; k < len; k++) {
            const int64_t c = c0 + k / r->s;
            const double xh = (r->x[base + k] - m) * rs, g = r->w[c] * (double)r->dout[base + k];
            r->y[base + k] = xh * r->w[c] + r->b[c];
            a += g / (double)len, bsum += g * xh / (double)len;
            r->dw[c] += r->dout[base + k] * xh, r->db[c] += r->dout[base + k];
        }
        for (int64_t k = 0; k < len; k++) {
            const int64_t c = c0 + k / r->s;
            const double xh = (r->x[base + k] - m) * rs;
            r->dx[base + k] = rs * (r->w[c] * (double)r->dout[base + k] - a - xh * bsum);
        }
    }
}

static void group_norm_case(const ms_shape *s, int64_t groups, float offset) {
    static float x[MAXN], w[64], b[64], y[MAXN], dout[MAXN], dx[MAXN], dw[64], db[64];
    static double ry[MAXN], rdx[MAXN], rdw[64], rdb[64];
    const int64_t n = s->d[0], c = s->d[1], sp = numel(s) / (n * c);
    fill(x, numel(s), 40, offset - 2, offset + 2), fill(dout, numel(s), 41, -1, 1);
    fill(w, c, 42, 0.5f, 1.5f), fill(b, c, 43, -1, 1);
    call_io io = {.op = MS_OP_GROUP_NORM,
                  .a = {.i = {groups}, .f = {1e-5f}},
                  .n_in = 3,
                  .in = {*s, {1, {c}}, {1, {c}}},
                  .x = {x, w, b},
                  .dout = dout,
                  .y = y,
                  .dx = {dx, dw, db}};
    run(&io);
    gn_ref r = {x, w, b, dout, n, c, sp, groups, 1e-5, ry, rdx, rdw, rdb};
    group_norm_ref(&r);
    char what[96];
    snprintf(what, sizeof what, "group_norm [%lld, %lld, %lld] in %lld groups", (long long)n,
             (long long)c, (long long)sp, (long long)groups);
    expect_near(what, y, ry, numel(s), 1e-5, 1e-5);
    expect_near(what, dx, rdx, numel(s), 1e-4, 1e-5);
    expect_near(what, dw, rdw, c, 1e-5, 1e-5);
    expect_near(what, db, rdb, c, 1e-5, 1e-5);
}

static void group_norm(void **state) {
    (void)state;
    group_norm_case(&(ms_shape){4, {2, 6, 3, 4}}, 3, 0);
    group_norm_case(&(ms_shape){3, {3, 4, 5}}, 1, 0);       /* LayerNorm over C and L */
    group_norm_case(&(ms_shape){4, {2, 4, 2, 2}}, 4, 0);    /* InstanceNorm */
    group_norm_case(&(ms_shape){2, {5, 6}}, 2, 0);          /* no spatial dims */
    group_norm_case(&(ms_shape){5, {2, 4, 2, 3, 2}}, 2, 0); /* 3-D images */
    group_norm_case(&(ms_shape){3, {2, 8, 16}}, 4, 50);     /* a mean far from 0 */
}

/* Under batch sharding the weight and bias are replicated on ranks that each see part of the
 * batch: their gradients come back as partial sums, which the engine reduces. */
static void group_norm_partial_grads(void **state) {
    (void)state;
    const ms_op_def *def = ms_op_get(MS_OP_GROUP_NORM);
    const ms_shape in[3] = {{3, {4, 6, 5}}, {1, {6}}, {1, {6}}};
    const ms_op_attrs a = {.i = {3}, .f = {1e-5f}};
    ms_rule_cand c[MS_OP_MAX_CANDS];
    int nc = def->rule(&a, 3, in, 2, c), batch = -1, chan = -1;
    for (int k = 0; k < nc; k++) {
        if (c[k].in[0].kind == MS_PL_SHARD && c[k].in[0].dim == 0) batch = k;
        if (c[k].in[0].kind == MS_PL_SHARD && c[k].in[0].dim == 1) chan = k;
    }
    assert_true(batch >= 0);
    for (int i = 1; i < 3; i++) {
        ms_placement g = ms_rule_dual_in(&c[batch], 3, 1, i);
        assert_true(g.kind == MS_PL_PARTIAL && g.reduce == MS_REDUCE_SUM);
    }
    /* 3 groups of 2 channels split 2 ways would cut a group: no channel candidate */
    assert_int_equal(chan, -1);
    nc = def->rule(&a, 3, in, 3, c);
    for (int k = 0; k < nc; k++)
        if (c[k].in[0].kind == MS_PL_SHARD && c[k].in[0].dim == 1) chan = k;
    assert_true(chan >= 0 && c[chan].in[1].kind == MS_PL_SHARD && c[chan].in[1].dim == 0);
    /* two mesh dims of 3 shard the channels 9 ways: not whole groups */
    ms_placements pl[3] = {{.n = 2, .p = {ms_S(1), ms_S(1)}},
                           {.n = 2, .p = {ms_S(0), ms_S(0)}},
                           {.n = 2, .p = {ms_S(0), ms_S(0)}}};
    assert_false(def->valid(&a, 3, in, pl, (const int[]){3, 3}));
    pl[0].p[1] = ms_S(0);
    assert_true(def->valid(&a, 3, in, pl, (const int[]){3, 3}));
}

/* ---- resizing ------------------------------------------------------------------------------- */

typedef struct rs_case {
    bool linear;
    ms_shape in;
    int64_t size[2]; /* or */
    float scale[2];
} rs_case;

/* One dim's sources by PyTorch's definition (the fp32 step, the coordinates in double). */
typedef struct rs_src {
    int n;
    int64_t i[2];
    double l[2];
} rs_src;
static rs_src rs_source(int64_t o, int64_t in, int64_t out, float step, bool linear) {
    rs_src s = {1, {o, o}, {1, 0}};
    if (in == out) return s;
    if (!linear) {
        int64_t i = out == 2 * in ? o / 2 : (int64_t)floor((double)o * step);
        s.i[0] = i < in ? i : in - 1;
        return s;
    }
    double src = fmax((double)step * ((double)o + 0.5) - 0.5, 0);
    s.i[0] = (int64_t)floor(src) < in - 1 ? (int64_t)floor(src) : in - 1;
    s.i[1] = s.i[0] + (s.i[0] < in - 1);
    s.l[1] = fmin(src - (double)s.i[0], 1), s.l[0] = 1 - s.l[1];
    s.n = 2;
    return s;
}

/* y = the weighted sum of the sources; dx = its transpose applied to dout. */
static void resize_ref(const rs_case *rc, const ms_shape *out, const float *x, const float *dout,
                       double *y, double *dx) {
    const int two = rc->in.ndim == 4;
    const int64_t h = two ? rc->in.d[2] : 1, w = rc->in.d[rc->in.ndim - 1];
    const int64_t oh = two ? out->d[2] : 1, ow = out->d[out->ndim - 1];
    float step[2];
    for (int s = 0; s < 1 + two; s++) {
        int64_t in = rc->in.d[2 + s], o = out->d[2 + s];
        step[s] = rc->size[0] ? (float)in / (float)o : (float)(1.0 / (double)rc->scale[s]);
    }
    memset(dx, 0, sizeof(double) * (size_t)numel(&rc->in));
    for (int64_t q = 0; q < rc->in.d[0] * rc->in.d[1]; q++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                rs_src sy = rs_source(oy, h, oh, two ? step[0] : 1, rc->linear);
                rs_src sx = rs_source(ox, w, ow, step[two], rc->linear);
                const int64_t o = (q * oh + oy) * ow + ox;
                y[o] = 0;
                for (int a = 0; a < sy.n; a++)
                    for (int b = 0; b < sx.n; b++) {
                        const int64_t e = (q * h + sy.i[a]) * w + sx.i[b];
                        y[o] += sy.l[a] * sx.l[b] * x[e];
                        dx[e] += sy.l[a] * sx.l[b] * dout[o];
                    }
            }
}

static void resize(void **state) {
    (void)state;
    static const rs_case cases[] = {
        {false, {3, {2, 3, 5}}, {8}, {0}},
        {false, {3, {2, 3, 5}}, {3}, {0}},
        {false, {3, {2, 3, 5}}, {0}, {2.0f}},
        {false, {3, {2, 3, 5}}, {0}, {1.5f}},
        {false, {3, {2, 3, 5}}, {0}, {0.5f}},
        {false, {4, {2, 2, 4, 3}}, {7, 5}, {0}},
        {false, {4, {2, 2, 4, 3}}, {0}, {2, 3}},
        {false, {4, {2, 2, 4, 3}}, {0}, {0.75f, 0.75f}},
        {true, {3, {2, 3, 5}}, {9}, {0}},
        {true, {3, {2, 3, 5}}, {3}, {0}},
        {true, {3, {2, 3, 5}}, {0}, {1.7f}},
        {true, {3, {2, 3, 5}}, {0}, {0.6f}},
        {true, {4, {2, 2, 4, 3}}, {7, 5}, {0}},
        {true, {4, {2, 2, 4, 3}}, {2, 2}, {0}},
        {true, {4, {2, 2, 4, 3}}, {0}, {1.5f, 2.5f}},
        {true, {4, {2, 2, 4, 3}}, {4, 6}, {0}},
        {true, {4, {1, 2, 7, 6}}, {0}, {0.3f, 1.0f}},
    };
    static float x[MAXN], y[MAXN], dx[MAXN], dout[MAXN];
    static double ry[MAXN], rdx[MAXN];
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const rs_case *rc = &cases[k];
        fill(x, numel(&rc->in), 50 + k, -2, 2), fill(dout, MAXN, 60 + k, -1, 1);
        call_io io = {
            .op = MS_OP_RESIZE,
            .a = {.i = {rc->linear, rc->size[0], rc->size[1]}, .f = {rc->scale[0], rc->scale[1]}},
            .n_in = 1,
            .in = {rc->in},
            .dout = dout,
            .y = y};
        io.x[0] = x, io.dx[0] = dx;
        run(&io);
        resize_ref(rc, &io.out, x, dout, ry, rdx);
        char what[64];
        snprintf(what, sizeof what, "resize case %zu", k);
        expect_near(what, y, ry, numel(&io.out), 1e-6, 1e-6);
        expect_near(what, dx, rdx, numel(&rc->in), 1e-6, 1e-6);
    }
}

/* The resize of x [in] with attributes a into y; what PyTorch 2.x prints for F.interpolate of
 * the same input (align_corners=False where it applies). */
static void resize_like(const char *what, const float *x, ms_shape in, ms_op_attrs a,
                        const float *want, int64_t n) {
    float y[MAXN];
    call_io io = {.op = MS_OP_RESIZE, .a = a, .n_in = 1, .in = {in}, .y = y};
    io.x[0] = x;
    run(&io);
    assert_int_equal(numel(&io.out), n);
    expect_values(what, y, want, n);
}

static void resize_as_pytorch(void **state) {
    (void)state;
    const float sq[4] = {1, 2, 3, 4}, three[3] = {1, 2, 3};
    const ms_shape sq1 = {4, {1, 1, 2, 2}}, l3 = {3, {1, 1, 3}}, l4 = {3, {1, 1, 4}};
    resize_like("bilinear, scale_factor=2", sq, sq1, (ms_op_attrs){.i = {1}, .f = {2}},
                (const float[]){1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f,
                                3.5f, 3, 3.25f, 3.75f, 4},
                16);
    resize_like("nearest, size=5", three, l3, (ms_op_attrs){.i = {0, 5}},
                (const float[]){1, 1, 2, 2, 3}, 5);
    resize_like("nearest, size=3", sq, l4, (ms_op_attrs){.i = {0, 3}}, (const float[]){1, 2, 3}, 3);
    resize_like("linear, size=3", sq, l4, (ms_op_attrs){.i = {1, 3}},
                (const float[]){7.0f / 6, 2.5f, 23.0f / 6}, 3);
    resize_like("linear, size=5", three, l3, (ms_op_attrs){.i = {1, 5}},
                (const float[]){1, 1.4f, 2, 2.6f, 3}, 5);
}

/* ---- costs ---------------------------------------------------------------------------------- */

static ms_k_cost cost_of(int op, ms_op_attrs a, int n_in, const ms_shape *in, bool backward) {
    static float buf[MAXN];
    const ms_op_def *def = ms_op_get(op);
    ms_shape out;
    ms_error err = {0};
    assert_int_equal(def->infer(&a, n_in, in, &out, &err), MS_OK);
    ms_tensor t[3] = {0}, o = {0};
    ms_op_call c = mt_op_call_whole(&a, n_in, in, 1, &out);
    for (int i = 0; i < n_in; i++) wrap(&t[i], buf, &in[i]), c.in[i] = &t[i];
    wrap(&o, buf, &out), c.out[0] = &o;
    ms_k_cost k = def->cost(&c, backward);
    for (int i = 0; i < 3; i++) ms_tensor_release(&t[i]);
    ms_tensor_release(&o);
    return k;
}

static void costs(void **state) {
    (void)state;
    const ms_shape img[1] = {{4, {1, 1, 4, 4}}};
    const ms_op_attrs k2 = {.i = {2, 2, 2, 2, 0, 0}};
    ms_k_cost k = cost_of(MS_OP_AVG_POOL2D, k2, 1, img, false);
    assert_true(k.flops == 16 && k.bytes == 4 * (16 + 4)); /* 4 windows of 4 adds and a divide */
    k = cost_of(MS_OP_AVG_POOL2D, k2, 1, img, true);
    assert_true(k.flops == 4 * 5 && k.bytes == 4 * (4 + 2 * 16));
    k = cost_of(MS_OP_MAX_POOL2D, k2, 1, img, false); /* compares only; writes the winners */
    assert_true(k.flops == 0 && k.bytes == 4 * (16 + 2 * 4));
    k = cost_of(MS_OP_MAX_POOL2D, k2, 1, img, true);
    assert_true(k.flops == 4 && k.bytes == 4 * (2 * 4 + 2 * 16));
    k = cost_of(MS_OP_GLOBAL_AVG_POOL, (ms_op_attrs){.i = {0}}, 1, img, false);
    assert_true(k.flops == 16 && k.bytes == 4 * (16 + 1));
    const ms_shape gn[3] = {{3, {2, 4, 8}}, {1, {4}}, {1, {4}}};
    k = cost_of(MS_OP_GROUP_NORM, (ms_op_attrs){.i = {2}, .f = {1e-5f}}, 3, gn, false);
    assert_true(k.flops == 8 * 64 + 4 * 4 && k.bytes == 4 * (2 * 64 + 2 * 4 + 2 * 4));
    k = cost_of(MS_OP_RESIZE, (ms_op_attrs){.i = {0}, .f = {2}}, 1, img, false); /* copies */
    assert_true(k.flops == 0 && k.bytes == 4 * (16 + 64));
    k = cost_of(MS_OP_RESIZE, (ms_op_attrs){.i = {1}, .f = {2}}, 1, img, false); /* 4 terms */
    assert_true(k.flops == 64 * 4 * 2 && k.bytes == 4 * (16 + 64));
}

/* ---- bad attributes ------------------------------------------------------------------------- */

static void expect_rejected(int op, ms_op_attrs a, int n_in, const ms_shape *in, const char *want1,
                            const char *want2) {
    ms_shape out[MS_OP_MAX_OUT];
    ms_error err = {0};
    const ms_op_def *def = ms_op_get(op);
    if (def->infer(&a, n_in, in, out, &err) != MS_ERR_INVALID)
        fail_msg("%s accepted bad input", def->name);
    if (!strstr(err.msg, def->name) || !strstr(err.msg, want1) || !strstr(err.msg, want2))
        fail_msg("%s: error '%s' does not name the op, '%s' and '%s'", def->name, err.msg, want1,
                 want2);
}

static void infer_rejects_bad_attributes(void **state) {
    (void)state;
    const ms_shape img[1] = {{4, {2, 3, 5, 5}}}, seq[1] = {{3, {2, 3, 3}}};
    expect_rejected(MS_OP_MAX_POOL2D, (ms_op_attrs){.i = {7, 7, 1, 1, 0, 0}}, 1, img,
                    "larger than the padded input", "[2, 3, 5, 5]");
    expect_rejected(MS_OP_MAX_POOL2D, (ms_op_attrs){.i = {7, 7, 1, 1, 0, 0}}, 1, img, "at most 5",
                    "pad");
    expect_rejected(MS_OP_AVG_POOL1D, (ms_op_attrs){.i = {2, 0, 0}}, 1, seq, "stride 0",
                    "PyTorch's default is the kernel size, 2");
    expect_rejected(MS_OP_MAX_POOL2D, (ms_op_attrs){.i = {3, 3, 1, 1, 2, 0}}, 1, img,
                    "padding 2 along H", "at most half");
    expect_rejected(MS_OP_MAX_POOL1D, (ms_op_attrs){.i = {0, 1, 0}}, 1, seq, "kernel 0",
                    "[2, 3, 3]");
    expect_rejected(MS_OP_MAX_POOL2D, (ms_op_attrs){.i = {2, 2, 2, 2, 0, 0}}, 1, seq,
                    "[N, C, H, W]", "[2, 3, 3]");
    expect_rejected(MS_OP_AVG_POOL2D, (ms_op_attrs){.i = {2, 2, 2, 2, 0, 0, 3}}, 1, img,
                    "exclude_pad", "count_include_pad");
    const ms_shape gn[3] = {{3, {2, 8, 4}}, {1, {8}}, {1, {8}}};
    expect_rejected(MS_OP_GROUP_NORM, (ms_op_attrs){.i = {3}, .f = {1e-5f}}, 3, gn,
                    "3 groups (i[0]) do not divide the 8 channels", "[2, 8, 4]");
    expect_rejected(MS_OP_GROUP_NORM, (ms_op_attrs){.i = {2}}, 3, gn, "eps", "1e-5");
    const ms_shape gnw[3] = {{3, {2, 8, 4}}, {1, {4}}, {1, {8}}};
    expect_rejected(MS_OP_GROUP_NORM, (ms_op_attrs){.i = {2}, .f = {1e-5f}}, 3, gnw, "[C]",
                    "[2, 8, 4] and [4] and [8]");
    expect_rejected(MS_OP_RESIZE, (ms_op_attrs){.i = {1}, .f = {0.2f}}, 1, seq, "empty output",
                    "[2, 3, 3]");
    expect_rejected(MS_OP_RESIZE, (ms_op_attrs){.i = {1, 4}, .f = {2}}, 1, seq, "one of the two",
                    "[2, 3, 3]");
    expect_rejected(MS_OP_RESIZE, (ms_op_attrs){.i = {0}}, 1, img, "output size", "scale");
    expect_rejected(MS_OP_RESIZE, (ms_op_attrs){.i = {2, 4}}, 1, seq, "mode", "nearest");
    const ms_shape flat[1] = {{2, {4, 5}}};
    expect_rejected(MS_OP_GLOBAL_AVG_POOL, (ms_op_attrs){.i = {0}}, 1, flat, "[N, C, D1, ...]",
                    "[4, 5]");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(pooling),
    cmocka_unit_test(pooling_as_pytorch),
    cmocka_unit_test(global_avg_pool),
    cmocka_unit_test(group_norm),
    cmocka_unit_test(group_norm_partial_grads),
    cmocka_unit_test(resize),
    cmocka_unit_test(resize_as_pytorch),
    cmocka_unit_test(costs),
    cmocka_unit_test(infer_rejects_bad_attributes),
};
MT_MAIN("ops pool", tests)

/* test_ops_reduce_index.c - the reductions and the indexing / layout operators against
 * float64 reference loops written here (they share no code with the kernels), including
 * ties (max, min, argmax, topk), large magnitudes (logsumexp), sharded reductions whose
 * backward must agree across ranks on the first winner, and infer errors for bad shapes
 * and attributes.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"
#include "engine/core/philox.h"
#include "engine/dist/dmesh.h"
#include "engine/dist/dtensor.h"
#include "engine/ops/op.h"
#include "tests/testkit.h"

#define TOL 1e-5

/* ---- a one-rank call of an operator on host arrays --------------------------------------- */

typedef struct op_eval {
    const ms_op_def *def;
    ms_op_attrs a;
    int n_in, n_out;
    ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT];
    ms_tensor in[MS_OP_MAX_IN], out[MS_OP_MAX_OUT], saved[MS_OP_MAX_SAVED];
    ms_tensor din[MS_OP_MAX_IN], dout[MS_OP_MAX_OUT];
    ms_op_call call;
} op_eval;

static ms_device *dev;

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

/* Runs the forward; inputs are copied from x[i]. */
static void eval_open(op_eval *e, int op, const ms_op_attrs *a, int n_in, const ms_shape *shapes,
                      float *const *x) {
    static const ms_placements none[MS_OP_MAX_IN];
    ms_error err = {0};
    memset(e, 0, sizeof *e);
    e->def = ms_op_get(op);
    e->a = *a;
    e->n_in = n_in;
    e->n_out = e->def->n_out < 0 ? 1 : e->def->n_out;
    memcpy(e->gin, shapes, sizeof(ms_shape) * (size_t)n_in);
    if (e->def->infer(&e->a, n_in, e->gin, e->gout, &err) != MS_OK)
        fail_msg("%s: infer: %s", e->def->name, err.msg);
    e->call = (ms_op_call){.kc = ms_kctx_host(),
                           .attrs = &e->a,
                           .n_in = n_in,
                           .n_out = e->n_out,
                           .gin = e->gin,
                           .gout = e->gout,
                           .in_pl = none,
                           .out_pl = none};
    for (int i = 0; i < n_in; i++) {
        assert_int_equal(ms_tensor_alloc(dev, MS_F32, shapes[i].ndim, shapes[i].d, &e->in[i], &err),
                         MS_OK);
        memcpy(ms_tensor_f32(&e->in[i]), x[i], sizeof(float) * (size_t)numel(&shapes[i]));
        e->call.in[i] = &e->in[i];
    }
    for (int o = 0; o < e->n_out; o++) {
        assert_int_equal(
            ms_tensor_alloc(dev, MS_F32, e->gout[o].ndim, e->gout[o].d, &e->out[o], &err), MS_OK);
        e->call.out[o] = &e->out[o];
    }
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    if (e->def->saved_floats) e->def->saved_floats(&e->a, &e->call, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (sizes[k]) {
            assert_int_equal(ms_tensor_alloc(dev, MS_F32, 1, &sizes[k], &e->saved[k], &err), MS_OK);
            e->call.saved[k] = &e->saved[k];
        }
    if (e->def->forward(&e->call, &err) != MS_OK)
        fail_msg("%s: forward: %s", e->def->name, err.msg);
}

/* Backward with dout = 1 (ramp: 1, 2, 3, ...) for output 0 and 0 for others, din from zero;
 * the other inputs' gradients are not wanted. */
static float *eval_grad_with(op_eval *e, int input, bool ramp) {
    ms_error err = {0};
    for (int o = 0; o < e->n_out; o++) {
        ms_tensor_alloc(dev, MS_F32, e->gout[o].ndim, e->gout[o].d, &e->dout[o], &err);
        float *g = ms_tensor_f32(&e->dout[o]);
        for (int64_t k = 0; k < numel(&e->gout[o]); k++)
            g[k] = o == 0 ? (ramp ? 1.0f + (float)k : 1.0f) : 0.0f;
        e->call.dout[o] = &e->dout[o];
    }
    ms_tensor_alloc(dev, MS_F32, e->gin[input].ndim, e->gin[input].d, &e->din[input], &err);
    memset(ms_tensor_f32(&e->din[input]), 0, sizeof(float) * (size_t)numel(&e->gin[input]));
    e->call.din[input] = &e->din[input];
    if (e->def->backward(&e->call, &err) != MS_OK)
        fail_msg("%s: backward: %s", e->def->name, err.msg);
    return ms_tensor_f32(&e->din[input]);
}

static float *eval_grad(op_eval *e, int input) {
    return eval_grad_with(e, input, false);
}

static void eval_close(op_eval *e) {
    for (int i = 0; i < MS_OP_MAX_IN; i++)
        ms_tensor_release(&e->in[i]), ms_tensor_release(&e->din[i]);
    for (int o = 0; o < MS_OP_MAX_OUT; o++)
        ms_tensor_release(&e->out[o]), ms_tensor_release(&e->dout[o]);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&e->saved[k]);
}

static void expect_close(const char *what, const float *got, const double *want, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        bool both_nan = isnan(got[k]) && isnan(want[k]);
        bool same_inf = isinf(got[k]) && isinf(want[k]) && (got[k] > 0) == (want[k] > 0);
        if (!both_nan && !same_inf && !(fabs(got[k] - want[k]) <= TOL * (1 + fabs(want[k]))))
            fail_msg("%s: element %lld is %.9g, the reference %.9g", what, (long long)k, got[k],
                     want[k]);
    }
}

static void fill_uniform(float *x, int64_t n, uint64_t seed) {
    for (int64_t k = 0; k < n; k++) x[k] = 2 * ms_philox_uniform(seed, 0, (uint64_t)k) - 1;
}

/* A new [s] of uniform values in [-1, 1); *n its element count. */
static float *random_input(const ms_shape *s, uint64_t seed, int64_t *n) {
    *n = numel(s);
    float *x = malloc(sizeof(float) * (size_t)(*n ? *n : 1));
    fill_uniform(x, *n, seed);
    return x;
}

static void unravel(int64_t f, int nd, const int64_t *sh, int64_t *idx) {
    for (int d = nd - 1; d >= 0; d--) idx[d] = f % sh[d], f /= sh[d];
}
static int64_t ravel(const int64_t *idx, int nd, const int64_t *sh) {
    int64_t f = 0;
    for (int d = 0; d < nd; d++) f = f * sh[d] + idx[d];
    return f;
}

/* ---- reductions ---------------------------------------------------------------------------- */

/* The reduced values of output o, in row-major order over the reduced dims. */
static int64_t reduced_values(const float *x, const ms_shape *s, uint32_t mask, int64_t o,
                              double *v) {
    int64_t idx[MS_MAX_DIMS], n = 0;
    for (int64_t f = 0; f < numel(s); f++) {
        unravel(f, s->ndim, s->d, idx);
        int64_t of = 0;
        for (int d = 0; d < s->ndim; d++)
            if (!(mask >> d & 1)) of = of * s->d[d] + idx[d];
        if (of == o) v[n++] = x[f];
    }
    return n;
}

static double ref_stat(int op, const double *v, int64_t n, int corr) {
    double s = 0, m = 0, best;
    int64_t at = 0;
    switch (op) {
        case MS_OP_SUM_DIMS:
        case MS_OP_MEAN_DIMS:
            for (int64_t k = 0; k < n; k++) s += v[k];
            return op == MS_OP_SUM_DIMS ? s : s / (double)n;
        case MS_OP_MAX_DIMS:
        case MS_OP_MIN_DIMS:
        case MS_OP_ARGMAX:
        case MS_OP_ARGMIN:
            best = v[0];
            for (int64_t k = 1; k < n; k++) {
                bool more = op == MS_OP_MAX_DIMS || op == MS_OP_ARGMAX ? v[k] > best : v[k] < best;
                if (more) best = v[k], at = k;
            }
            return op == MS_OP_MAX_DIMS || op == MS_OP_MIN_DIMS ? best : (double)at;
        case MS_OP_PROD:
            s = 1;
            for (int64_t k = 0; k < n; k++) s *= v[k];
            return s;
        case MS_OP_VAR:
        case MS_OP_STD:
            for (int64_t k = 0; k < n; k++) m += v[k] / (double)n;
            for (int64_t k = 0; k < n; k++) s += (v[k] - m) * (v[k] - m);
            s /= (double)(n - corr);
            return op == MS_OP_VAR ? s : sqrt(s);
        case MS_OP_LOGSUMEXP:
            m = v[0];
            for (int64_t k = 1; k < n; k++) m = fmax(m, v[k]);
            for (int64_t k = 0; k < n; k++) s += exp(v[k] - m);
            return m + log(s);
        case MS_OP_NORM:
            for (int64_t k = 0; k < n; k++) s += v[k] * v[k];
            return sqrt(s);
        case MS_OP_COUNT_NONZERO:
            for (int64_t k = 0; k < n; k++) s += v[k] != 0;
            return s;
    }
    fail_msg("no reference for op %d", op);
    return 0;
}

typedef struct reduce_case {
    int op;
    ms_op_attrs a;
    ms_shape s;
    float scale, offset; /* inputs: scale * uniform(-1, 1) + offset */
    bool ties;           /* inputs rounded to a few levels, so values repeat */
} reduce_case;

static void check_reduce(const reduce_case *rc) {
    ms_shape s = rc->s;
    int64_t n;
    float *x = random_input(&s, 101 + (uint64_t)rc->op, &n);
    for (int64_t k = 0; k < n; k++) {
        if (rc->ties) x[k] = roundf(x[k] * 2);
        if (rc->op == MS_OP_COUNT_NONZERO) x[k] = roundf(x[k]);
        x[k] = x[k] * rc->scale + rc->offset;
    }
    op_eval e;
    eval_open(&e, rc->op, &rc->a, 1, &s, &x);
    bool arg = rc->op == MS_OP_ARGMAX || rc->op == MS_OP_ARGMIN;
    uint32_t mask = arg ? 1u << rc->a.i[0] : (uint32_t)rc->a.i[0];
    int64_t nout = numel(&e.gout[0]);
    double *want = malloc(sizeof(double) * (size_t)nout), *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t o = 0; o < nout; o++)
        want[o] = ref_stat(rc->op, v, reduced_values(x, &s, mask, o, v), (int)rc->a.i[2]);
    char what[96];
    snprintf(what, sizeof what, "%s mask %lld keepdim %lld", e.def->name, (long long)rc->a.i[0],
             (long long)rc->a.i[1]);
    expect_close(what, ms_tensor_f32(&e.out[0]), want, nout);
    /* keepdim keeps every dim (reduced ones as 1); otherwise they are gone. */
    int kept = 0;
    for (int d = 0; d < s.ndim; d++) kept += !(mask >> d & 1);
    assert_int_equal(e.gout[0].ndim, rc->a.i[1] ? s.ndim : kept);
    eval_close(&e);
    free(x), free(want), free(v);
}

static void reductions_match_reference(void **state) {
    (void)state;
    const reduce_case cases[] = {
        {MS_OP_SUM_DIMS, {.i = {5, 0}}, {3, {3, 4, 5}}, 1, 0, false},
        {MS_OP_SUM_DIMS, {.i = {2, 1}}, {2, {7, 1}}, 1, 0, false},
        {MS_OP_MEAN_DIMS, {.i = {7, 0}}, {3, {2, 3, 4}}, 1, 0, false},
        {MS_OP_MEAN_DIMS, {.i = {1, 1}}, {2, {6, 3}}, 1e6f, 3e6f, false},
        {MS_OP_MAX_DIMS, {.i = {6, 1}}, {3, {2, 3, 4}}, 1, 0, true},
        {MS_OP_MIN_DIMS, {.i = {1, 0}}, {3, {5, 2, 3}}, 1, 0, true},
        {MS_OP_PROD, {.i = {2, 0}}, {2, {3, 6}}, 1.5f, 0, false},
        {MS_OP_VAR, {.i = {2, 0, 1}}, {2, {4, 6}}, 1, 0, false},
        {MS_OP_VAR, {.i = {5, 1, 0}}, {3, {3, 2, 5}}, 1e3f, 1e4f, false},
        {MS_OP_STD, {.i = {3, 0, 1}}, {2, {4, 5}}, 1, 0, false},
        {MS_OP_LOGSUMEXP, {.i = {2, 0}}, {2, {3, 7}}, 1, 0, false},
        {MS_OP_LOGSUMEXP, {.i = {3, 0}}, {2, {3, 4}}, 50, 1000, false},  /* exp overflows */
        {MS_OP_LOGSUMEXP, {.i = {2, 1}}, {2, {3, 4}}, 20, -1000, false}, /* exp underflows */
        {MS_OP_NORM, {.i = {6, 0}}, {3, {2, 3, 4}}, 1, 0, false},
        {MS_OP_ARGMAX, {.i = {1, 0}}, {2, {4, 7}}, 1, 0, true},
        {MS_OP_ARGMIN, {.i = {0, 1}}, {3, {6, 2, 3}}, 1, 0, true},
        {MS_OP_COUNT_NONZERO, {.i = {5, 0}}, {3, {3, 2, 5}}, 1, 0, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) check_reduce(&cases[k]);
}

/* Ties: max/min and argmax/argmin pick the first winner in row-major order over the
 * reduced dims, and max/min send the whole gradient there. */
static void ties_go_to_the_first_winner(void **state) {
    (void)state;
    /* [2, 2, 3]: reduce dims 1 and 2; output 0's maximum 5 sits at (0, 0, 2) and (0, 1, 0),
     * output 1's minimum -1 at (1, 0, 1), (1, 1, 1), (1, 1, 2). */
    float x[12] = {1, 0, 5, 5, 2, 5, 0, -1, 3, 2, -1, -1};
    ms_shape s = {3, {2, 2, 3}};
    float *xp = x;
    op_eval e;
    ms_op_attrs a = {.i = {6, 0}};
    eval_open(&e, MS_OP_MAX_DIMS, &a, 1, &s, &xp);
    assert_true(ms_tensor_f32(&e.out[0])[0] == 5.0f);
    float *g = eval_grad(&e, 0);
    for (int k = 0; k < 6; k++) assert_true(g[k] == (k == 2 ? 1.0f : 0.0f));
    eval_close(&e);
    eval_open(&e, MS_OP_MIN_DIMS, &a, 1, &s, &xp);
    assert_true(ms_tensor_f32(&e.out[0])[1] == -1.0f);
    g = eval_grad(&e, 0);
    for (int k = 6; k < 12; k++) assert_true(g[k] == (k == 7 ? 1.0f : 0.0f));
    eval_close(&e);
    /* Along the last dim: row (0, 1) has its max 5 at 0 and 2, row (1, 1) its min at 1 and 2. */
    ms_op_attrs am = {.i = {2, 0}};
    eval_open(&e, MS_OP_ARGMAX, &am, 1, &s, &xp);
    const float want_max[4] = {2, 0, 2, 0};
    for (int k = 0; k < 4; k++) assert_true(ms_tensor_f32(&e.out[0])[k] == want_max[k]);
    eval_close(&e);
    eval_open(&e, MS_OP_ARGMIN, &am, 1, &s, &xp);
    const float want_min[4] = {1, 1, 1, 1};
    for (int k = 0; k < 4; k++) assert_true(ms_tensor_f32(&e.out[0])[k] == want_min[k]);
    eval_close(&e);
}

/* A reduced dim of size 0: the sum is 0, the max -inf, the count 0, no gradient. */
static void empty_reductions(void **state) {
    (void)state;
    ms_shape s = {2, {3, 0}};
    float dummy = 0, *xp = &dummy;
    ms_op_attrs a = {.i = {2, 0}};
    const int ops[3] = {MS_OP_SUM_DIMS, MS_OP_MAX_DIMS, MS_OP_COUNT_NONZERO};
    const float want[3] = {0.0f, -INFINITY, 0.0f};
    for (int k = 0; k < 3; k++) {
        op_eval e;
        eval_open(&e, ops[k], &a, 1, &s, &xp);
        assert_int_equal(numel(&e.gout[0]), 3);
        for (int o = 0; o < 3; o++) assert_true(ms_tensor_f32(&e.out[0])[o] == want[k]);
        eval_close(&e);
    }
}

/* ---- indexing and layout ------------------------------------------------------------------- */

/* Where output element oidx comes from in the input, for the ops whose every output element
 * is one input element or a constant; false: the constant (padding, masked triangle). */
static bool ref_source(int op, const ms_op_attrs *a, const ms_shape *in, const int64_t *oidx,
                       int ond, int64_t *iidx) {
    int64_t k = a->i[0];
    for (int d = 0; d < in->ndim && d < ond; d++) iidx[d] = oidx[d];
    switch (op) {
        case MS_OP_PERMUTE:
            for (int d = 0; d < ond; d++) iidx[a->i[d]] = oidx[d];
            return true;
        case MS_OP_SLICE:
        case MS_OP_NARROW:
            iidx[k] += a->i[1];
            return true;
        case MS_OP_FLIP:
            for (int d = 0; d < ond; d++)
                if (a->i[0] >> d & 1) iidx[d] = in->d[d] - 1 - oidx[d];
            return true;
        case MS_OP_ROLL: {
            int64_t n = in->d[k];
            iidx[k] = (((oidx[k] - a->i[1]) % n) + n) % n;
            return true;
        }
        case MS_OP_REPEAT:
            for (int d = 0; d < ond; d++) iidx[d] = oidx[d] % in->d[d];
            return true;
        case MS_OP_EXPAND:
            for (int d = 0; d < ond; d++) iidx[d] = in->d[d] == 1 ? 0 : oidx[d];
            return true;
        case MS_OP_PAD:
            for (int d = 0; d < ond; d++) {
                iidx[d] = oidx[d] - a->i[2 * d];
                if (iidx[d] < 0 || iidx[d] >= in->d[d]) return false;
            }
            return true;
        case MS_OP_TRIL:
            return oidx[ond - 1] - oidx[ond - 2] <= k;
        case MS_OP_TRIU:
            return oidx[ond - 1] - oidx[ond - 2] >= k;
        case MS_OP_SQUEEZE:
            for (int d = 0; d < in->ndim; d++) iidx[d] = d < k ? oidx[d] : d == k ? 0 : oidx[d - 1];
            return true;
        case MS_OP_UNSQUEEZE:
            for (int d = 0; d < in->ndim; d++) iidx[d] = oidx[d < k ? d : d + 1];
            return true;
    }
    fail_msg("no source map for op %d", op);
    return false;
}

typedef struct view_case {
    int op;
    ms_op_attrs a;
    ms_shape s;
} view_case;

/* Forward against ref_source, and backward (dout = 1) against the count of outputs that
 * read each input element. */
static void check_view(const view_case *vc) {
    ms_shape s = vc->s;
    int64_t n;
    float *x = random_input(&s, 202 + (uint64_t)vc->op, &n);
    op_eval e;
    eval_open(&e, vc->op, &vc->a, 1, &s, &x);
    const ms_shape *os = &e.gout[0];
    int64_t no = numel(os), oidx[MS_MAX_DIMS], iidx[MS_MAX_DIMS];
    double *want = malloc(sizeof(double) * (size_t)no), *reads = calloc((size_t)n, sizeof(double));
    for (int64_t f = 0; f < no; f++) {
        unravel(f, os->ndim, os->d, oidx);
        bool from = ref_source(vc->op, &vc->a, &s, oidx, os->ndim, iidx);
        int64_t src = from ? ravel(iidx, s.ndim, s.d) : -1;
        want[f] = src >= 0 ? x[src] : vc->op == MS_OP_PAD ? vc->a.f[0] : 0.0;
        if (src >= 0) reads[src] += 1;
    }
    expect_close(e.def->name, ms_tensor_f32(&e.out[0]), want, no);
    char what[64];
    snprintf(what, sizeof what, "%s backward", e.def->name);
    expect_close(what, eval_grad(&e, 0), reads, n);
    eval_close(&e);
    free(x), free(want), free(reads);
}

static void views_match_reference(void **state) {
    (void)state;
    const view_case cases[] = {
        {MS_OP_PERMUTE, {.i = {2, 0, 1}}, {3, {2, 3, 4}}},
        {MS_OP_PERMUTE, {.i = {1, 0}}, {2, {3, 5}}},
        {MS_OP_SLICE, {.i = {1, 2, 5}}, {3, {2, 6, 3}}},
        {MS_OP_SLICE, {.i = {0, 3, 3}}, {2, {4, 2}}}, /* empty */
        {MS_OP_NARROW, {.i = {2, 1, 2}}, {3, {2, 2, 4}}},
        {MS_OP_FLIP, {.i = {5}}, {3, {2, 3, 4}}},
        {MS_OP_ROLL, {.i = {1, 2}}, {2, {3, 5}}},
        {MS_OP_ROLL, {.i = {0, -7}}, {2, {3, 5}}},
        {MS_OP_REPEAT, {.i = {2, 1, 3}}, {3, {2, 3, 2}}},
        {MS_OP_EXPAND, {.i = {0, 4, 0}}, {3, {2, 1, 3}}},
        {MS_OP_EXPAND, {.i = {5, 3}}, {2, {1, 1}}},
        {MS_OP_PAD, {.i = {1, 2, 0, 3}, .f = {-7.5f}}, {2, {3, 2}}},
        {MS_OP_TRIL, {.i = {0}}, {3, {2, 4, 3}}},
        {MS_OP_TRIL, {.i = {-2}}, {2, {5, 4}}},
        {MS_OP_TRIU, {.i = {1}}, {2, {4, 5}}},
        {MS_OP_SQUEEZE, {.i = {1}}, {3, {3, 1, 4}}},
        {MS_OP_UNSQUEEZE, {.i = {0}}, {2, {3, 4}}},
        {MS_OP_UNSQUEEZE, {.i = {2}}, {2, {3, 4}}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) check_view(&cases[k]);
}

/* index_select, gather and scatter_add along dim 1 of x [3, 5]; ids repeat a row. */
static void gathers_match_reference(void **state) {
    (void)state;
    float x[15], ids1[4] = {4, 0, 4, 2}, ids2[12], src[12];
    fill_uniform(x, 15, 303);
    fill_uniform(src, 12, 304);
    for (int k = 0; k < 12; k++) ids2[k] = (float)((k * 7 + 3) % 5);
    ms_shape xs = {2, {3, 5}}, i1 = {1, {4}}, i2 = {2, {3, 4}};
    ms_op_attrs a = {.i = {1}};
    double want[15];
    op_eval e;

    float *sel_in[2] = {x, ids1};
    ms_shape sel_s[2] = {xs, i1};
    eval_open(&e, MS_OP_INDEX_SELECT, &a, 2, sel_s, sel_in);
    for (int r = 0; r < 3; r++)
        for (int l = 0; l < 4; l++) want[r * 4 + l] = x[r * 5 + (int)ids1[l]];
    expect_close("index_select", ms_tensor_f32(&e.out[0]), want, 12);
    float *g = eval_grad(&e, 0);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 5; c++) want[r * 5 + c] = c == 4 ? 2 : c == 0 || c == 2 ? 1 : 0;
    expect_close("index_select backward", g, want, 15);
    eval_close(&e);

    float *ga_in[2] = {x, ids2};
    ms_shape ga_s[2] = {xs, i2};
    eval_open(&e, MS_OP_GATHER, &a, 2, ga_s, ga_in);
    for (int r = 0; r < 3; r++)
        for (int l = 0; l < 4; l++) want[r * 4 + l] = x[r * 5 + (int)ids2[r * 4 + l]];
    expect_close("gather", ms_tensor_f32(&e.out[0]), want, 12);
    eval_close(&e);

    float *sc_in[3] = {x, ids2, src};
    ms_shape sc_s[3] = {xs, i2, i2};
    eval_open(&e, MS_OP_SCATTER_ADD, &a, 3, sc_s, sc_in);
    for (int k = 0; k < 15; k++) want[k] = x[k];
    for (int r = 0; r < 3; r++)
        for (int l = 0; l < 4; l++) want[r * 5 + (int)ids2[r * 4 + l]] += src[r * 4 + l];
    expect_close("scatter_add", ms_tensor_f32(&e.out[0]), want, 15);
    eval_close(&e);
}

/* cumsum / cumprod along the middle dim of [2, 4, 3], with a zero in cumprod's input. */
static void scans_match_reference(void **state) {
    (void)state;
    float x[24];
    fill_uniform(x, 24, 404);
    x[7] = 0.0f;
    ms_shape s = {3, {2, 4, 3}};
    float *xp = x;
    ms_op_attrs a = {.i = {1}};
    for (int prod = 0; prod < 2; prod++) {
        double want[24];
        for (int b = 0; b < 2; b++)
            for (int j = 0; j < 3; j++) {
                double acc = prod;
                for (int r = 0; r < 4; r++) {
                    int k = (b * 4 + r) * 3 + j;
                    acc = prod ? acc * x[k] : acc + x[k];
                    want[k] = acc;
                }
            }
        op_eval e;
        eval_open(&e, prod ? MS_OP_CUMPROD : MS_OP_CUMSUM, &a, 1, &s, &xp);
        expect_close(e.def->name, ms_tensor_f32(&e.out[0]), want, 24);
        /* d(sum of outputs)/dx_k: cumsum 4 - r; cumprod sum over later outputs of the product
         * without x_k. */
        float *g = eval_grad(&e, 0);
        for (int k = 0; k < 24; k++) {
            int b = k / 12, r = k / 3 % 4, j = k % 3;
            double d = 0;
            for (int q = r; q < 4; q++) {
                double p = 1;
                for (int t = 0; t <= q; t++)
                    if (t != r) p *= x[(b * 4 + t) * 3 + j];
                d += prod ? p : 1;
            }
            want[k] = d;
        }
        expect_close("scan backward", g, want, 24);
        eval_close(&e);
    }
}

static void stack_fill_one_hot_match_reference(void **state) {
    (void)state;
    float a[6], b[6], mask[6] = {1, 0, 0, 1, 1, 0}, ids[4] = {2, 0, 3, 2};
    fill_uniform(a, 6, 505);
    fill_uniform(b, 6, 506);
    ms_shape s = {2, {2, 3}};
    double want[24];
    op_eval e;
    float *st_in[2] = {a, b};
    ms_shape st_s[2] = {s, s};
    ms_op_attrs st = {.i = {1}}; /* [2, 2, 3]: out[r, j, c] = (j ? b : a)[r, c] */
    eval_open(&e, MS_OP_STACK, &st, 2, st_s, st_in);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 2; j++)
            for (int c = 0; c < 3; c++) want[(r * 2 + j) * 3 + c] = (j ? b : a)[r * 3 + c];
    expect_close("stack", ms_tensor_f32(&e.out[0]), want, 12);
    /* Only b wants a gradient: it gets its own slots of a ramp dout. */
    float *g = eval_grad_with(&e, 1, true);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++) want[r * 3 + c] = (r * 2 + 1) * 3 + c + 1;
    expect_close("stack backward", g, want, 6);
    eval_close(&e);

    float *mf_in[2] = {a, mask};
    ms_op_attrs mf = {.f = {-1e9f}};
    eval_open(&e, MS_OP_MASKED_FILL, &mf, 2, st_s, mf_in);
    for (int k = 0; k < 6; k++) want[k] = mask[k] != 0 ? -1e9 : a[k];
    expect_close("masked_fill", ms_tensor_f32(&e.out[0]), want, 6);
    g = eval_grad(&e, 0);
    for (int k = 0; k < 6; k++) want[k] = mask[k] != 0 ? 0 : 1;
    expect_close("masked_fill backward", g, want, 6);
    eval_close(&e);

    float *oh_in[1] = {ids};
    ms_shape oh_s = {1, {4}};
    ms_op_attrs oh = {.i = {5}};
    eval_open(&e, MS_OP_ONE_HOT, &oh, 1, &oh_s, oh_in);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 5; c++) want[r * 5 + c] = (int)ids[r] == c;
    expect_close("one_hot", ms_tensor_f32(&e.out[0]), want, 20);
    eval_close(&e);
}

/* topk and sort: values by repeated selection, ties to the lower index; the gradient of the
 * values lands on the chosen elements. */
static void topk_and_sort_match_reference(void **state) {
    (void)state;
    float x[12] = {3, 1, 3, 2, -1, 7, -1, 0, 5, 5, 5, 5};
    ms_shape s = {2, {2, 6}};
    float *xp = x;
    const struct {
        int op;
        ms_op_attrs a;
        int k;
        bool desc;
    } runs[3] = {{MS_OP_TOPK, {.i = {3}}, 3, true},
                 {MS_OP_SORT, {.i = {0}}, 6, false},
                 {MS_OP_SORT, {.i = {1}}, 6, true}};
    for (int t = 0; t < 3; t++) {
        op_eval e;
        eval_open(&e, runs[t].op, &runs[t].a, 1, &s, &xp);
        int k = runs[t].k;
        double wv[12], wi[12], grad[12] = {0};
        for (int r = 0; r < 2; r++) {
            bool taken[6] = {0};
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int c = 0; c < 6; c++) {
                    if (taken[c]) continue;
                    float v = x[r * 6 + c], b = best < 0 ? 0 : x[r * 6 + best];
                    if (best < 0 || (runs[t].desc ? v > b : v < b)) best = c;
                }
                taken[best] = true;
                wv[r * k + j] = x[r * 6 + best], wi[r * k + j] = best;
                grad[r * 6 + best] = 1;
            }
        }
        expect_close(e.def->name, ms_tensor_f32(&e.out[0]), wv, 2 * k);
        expect_close("indices", ms_tensor_f32(&e.out[1]), wi, 2 * k);
        expect_close("topk/sort backward", eval_grad(&e, 0), grad, 12);
        eval_close(&e);
    }
}

/* ---- a reduced dim sharded over two ranks: the backward agrees on the first winner --------- */

/* x [3, 6] split by columns (0-2 | 3-5). Row 0's max ties across the ranks (cols 1 and 4),
 * row 1's is only on rank 1, row 2's ties inside rank 1 (cols 3 and 5). */
static const float split_x[18] = {0.1f, 0.9f, 0.2f, 0.3f, 0.9f, 0.0f, 0.5f, 0.1f, 0.2f,
                                  0.3f, 0.4f, 0.8f, 0.6f, 0.1f, 0.2f, 0.7f, 0.2f, 0.7f};

static void sharded_winner_rank(mt_rank *r, void *arg) {
    const int op = *(const int *)arg;
    ms_error err = {0};
    ms_mesh mesh;
    ms_mesh_parse(&mesh, "2", &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_device *d = r->ctx->device;
    const float sign = op == MS_OP_MAX_DIMS ? 1.0f : -1.0f;
    ms_shape gin = {2, {3, 6}}, gout = {1, {3}};
    ms_tensor gx, dout, din, out, saved[MS_OP_MAX_SAVED] = {0};
    ms_tensor_alloc(d, MS_F32, 2, gin.d, &gx, &err);
    for (int k = 0; k < 18; k++) ms_tensor_f32(&gx)[k] = sign * split_x[k];
    ms_placements pl = {.n = 1, .p = {ms_pl_shard(1)}}, out_pl = {.n = 1};
    out_pl.p[0] = ms_pl_partial(op == MS_OP_MAX_DIMS ? MS_REDUCE_MAX : MS_REDUCE_MIN);
    ms_placements_default_order(&pl);
    ms_dtensor dx;
    MT_OK(r, ms_dtensor_shard(dm, &gx, &pl, &dx, &err), &err);
    ms_op_attrs a = {.i = {2, 0}};
    ms_op_call call = {.kc = ms_kctx_host(),
                       .attrs = &a,
                       .n_in = 1,
                       .n_out = 1,
                       .gin = &gin,
                       .gout = &gout,
                       .in_pl = &pl,
                       .out_pl = &out_pl,
                       .mesh = dm};
    int64_t len[MS_MAX_DIMS], sizes[MS_OP_MAX_SAVED] = {0};
    ms_local_box(&pl, &dm->mesh, dm->coords, 2, gin.d, call.in_start[0], len);
    call.in[0] = &dx.local;
    ms_tensor_alloc(d, MS_F32, 1, gout.d, &out, &err);
    ms_tensor_alloc(d, MS_F32, 1, gout.d, &dout, &err);
    ms_tensor_alloc(d, MS_F32, 2, dx.local.shape, &din, &err);
    for (int k = 0; k < 3; k++) ms_tensor_f32(&dout)[k] = 1.0f + (float)k;
    memset(ms_tensor_f32(&din), 0, sizeof(float) * (size_t)ms_tensor_numel(&din));
    call.out[0] = &out, call.dout[0] = &dout, call.din[0] = &din;
    const ms_op_def *def = ms_op_get(op);
    def->saved_floats(&a, &call, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (sizes[k])
            ms_tensor_alloc(d, MS_F32, 1, &sizes[k], &saved[k], &err), call.saved[k] = &saved[k];
    MT_OK(r, def->forward(&call, &err), &err);
    MT_OK(r, def->backward(&call, &err), &err);
    /* The gathered gradient: dout[row] at the row's first global winner, 0 elsewhere. */
    ms_dtensor gd = {.ndim = 2, .gshape = {3, 6}, .mesh = dm, .pl = pl, .local = din};
    ms_tensor full;
    if (MT_OK(r, ms_dtensor_full(&gd, &full, &err), &err)) {
        const int winner[3] = {1, 5, 3};
        for (int k = 0; k < 18; k++) {
            float want = k % 6 == winner[k / 6] ? 1.0f + (float)(k / 6) : 0.0f;
            MT_CHECK(r, ms_tensor_f32(&full)[k] == want,
                     "%s over a split dim: gradient %g at (%d, %d), want %g", def->name,
                     ms_tensor_f32(&full)[k], k / 6, k % 6, want);
        }
        ms_tensor_release(&full);
    }
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&saved[k]);
    ms_dtensor_release(&gd); /* owns din */
    ms_tensor_release(&out), ms_tensor_release(&dout), ms_tensor_release(&gx);
    ms_dtensor_release(&dx);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void split_max_min_backward_agree_on_the_first_winner(void **state) {
    (void)state;
    int op = MS_OP_MAX_DIMS;
    mt_run(2, sharded_winner_rank, &op);
    op = MS_OP_MIN_DIMS;
    mt_run(2, sharded_winner_rank, &op);
}

/* ---- bad shapes and attributes -------------------------------------------------------------- */

static void infer_rejects_bad_input(void **state) {
    (void)state;
    const struct {
        int op;
        ms_op_attrs a;
        int n_in;
        ms_shape in[3];
        const char *want; /* in the message besides the op's name */
    } bad[] = {
        {MS_OP_SUM_DIMS, {.i = {4, 0}}, 1, {{2, {3, 5}}}, "[3, 5]"},
        {MS_OP_MAX_DIMS, {.i = {0, 0}}, 1, {{2, {3, 5}}}, "set bit d"},
        {MS_OP_VAR, {.i = {1, 0, 2}}, 1, {{2, {3, 5}}}, "correction"},
        {MS_OP_ARGMAX, {.i = {2, 0}}, 1, {{2, {3, 5}}}, "[3, 5]"},
        {MS_OP_PERMUTE, {.i = {0, 0}}, 1, {{2, {3, 5}}}, "[3, 5]"},
        {MS_OP_SLICE, {.i = {1, 2, 6}}, 1, {{2, {3, 5}}}, "[3, 5]"},
        {MS_OP_EXPAND, {.i = {6, 0}}, 1, {{2, {3, 5}}}, "size-1"},
        {MS_OP_GATHER, {.i = {1}}, 2, {{2, {3, 5}}, {2, {4, 5}}}, "[4, 5]"},
        {MS_OP_SCATTER_ADD, {.i = {0}}, 3, {{2, {3, 5}}, {2, {2, 5}}, {2, {2, 4}}}, "[2, 4]"},
        {MS_OP_STACK, {.i = {0}}, 2, {{2, {3, 5}}, {2, {3, 4}}}, "same shape"},
        {MS_OP_TOPK, {.i = {6}}, 1, {{2, {3, 5}}}, "[3, 5]"},
        {MS_OP_SQUEEZE, {.i = {0}}, 1, {{2, {3, 5}}}, "size 1"},
        {MS_OP_TRIL, {.i = {0}}, 1, {{1, {5}}}, "2 dims"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        const ms_op_def *def = ms_op_get(bad[k].op);
        ms_shape out[MS_OP_MAX_OUT];
        ms_error err = {0};
        ms_status st = def->infer(&bad[k].a, bad[k].n_in, bad[k].in, out, &err);
        if (st != MS_ERR_INVALID || !strstr(err.msg, bad[k].want) ||
            strncmp(err.msg, def->name, strlen(def->name)) != 0)
            fail_msg("%s case %zu: status %d, message '%s' (want the op's name and '%s')",
                     def->name, k, st, err.msg, bad[k].want);
    }
}

static int setup(void **state) {
    (void)state;
    ms_error err = {0};
    return ms_device_cpu_create(&dev, &err) == MS_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    ms_device_destroy(dev);
    return 0;
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(reductions_match_reference, setup, teardown),
    cmocka_unit_test_setup_teardown(ties_go_to_the_first_winner, setup, teardown),
    cmocka_unit_test_setup_teardown(empty_reductions, setup, teardown),
    cmocka_unit_test_setup_teardown(views_match_reference, setup, teardown),
    cmocka_unit_test_setup_teardown(gathers_match_reference, setup, teardown),
    cmocka_unit_test_setup_teardown(scans_match_reference, setup, teardown),
    cmocka_unit_test_setup_teardown(stack_fill_one_hot_match_reference, setup, teardown),
    cmocka_unit_test_setup_teardown(topk_and_sort_match_reference, setup, teardown),
    cmocka_unit_test(split_max_min_backward_agree_on_the_first_winner),
    cmocka_unit_test(infer_rejects_bad_input),
};
MT_MAIN("ops reduce index", tests)

/* test_ops_elementwise.c - the elementwise unary and broadcasting binary/ternary operators
 * (engine/ops/ops_unary.c, ops_binary.c) against float64 references written here.
 *
 * Each op runs through its table row on one rank (infer, forward, backward). Unary ops are
 * checked at edge values (large magnitudes where naive formulas overflow, zero, the kinks of
 * relu-like ops, clamp bounds), forward against the formula in double and backward against
 * a double central difference of that formula (points where the one-sided slopes disagree
 * are kinks and skipped). Binary and ternary ops walk their broadcasting with an index loop
 * of their own and check outputs and the gradients summed over broadcast dims, on inputs
 * drawn from a small grid so that ties (maximum, minimum, comparisons) occur. Bad shapes
 * and attributes must be refused with an error naming the op. A small graph of these ops
 * trains a step on 2 and 4 ranks with the data sharded and its broadcast parameters'
 * gradients must equal one rank's. test_rules and test_op_grads cover every op's forward
 * under every placement and the backward near zero.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"
#include "engine/core/philox.h"
#include "engine/dist/reshard.h"
#include "engine/graph/graph.h"
#include "engine/core/parallel.h"
#include "engine/ops/op.h"
#include "tests/testkit.h"

static ms_device *dev;

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

/* ---- running one op on one rank -------------------------------------------------------- */

typedef struct op_io {
    int op;
    ms_op_attrs a;
    int n_in;
    ms_shape in[3];
    const float *x[3]; /* input values */
    const float *dy;   /* set: run the backward with this output gradient */
    ms_shape out;      /* results: */
    float *y;
    float *dx[3]; /* gradient increments (the backward accumulates onto 0.25) */
    bool fresh;   /* the gradients the op writes whole (fresh_ok) start as NaN and are written */
} op_io;

#define DX_START 0.25f

static ms_tensor new_tensor(const ms_shape *s, const float *vals, float fill) {
    ms_tensor t;
    ms_error err = {0};
    assert_int_equal(ms_tensor_alloc(dev, MS_F32, s->ndim, s->d, &t, &err), MS_OK);
    for (int64_t k = 0; k < numel(s); k++) ms_tensor_f32(&t)[k] = vals ? vals[k] : fill;
    return t;
}

static float *copy_out(const ms_tensor *t, float minus) {
    int64_t n = ms_tensor_numel(t);
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t k = 0; k < n; k++) p[k] = ms_tensor_f32(t)[k] - minus;
    return p;
}

static void op_io_run(op_io *io) {
    const ms_op_def *def = ms_op_get(io->op);
    ms_error err = {0};
    if (def->infer(&io->a, io->n_in, io->in, &io->out, &err) != MS_OK)
        fail_msg("%s: infer: %s", def->name, err.msg);
    static const ms_placements none[MS_OP_MAX_IN];
    ms_op_call call = {.kc = ms_kctx_host(),
                       .attrs = &io->a,
                       .n_in = io->n_in,
                       .n_out = 1,
                       .gin = io->in,
                       .gout = &io->out,
                       .in_pl = none,
                       .out_pl = none};
    ms_tensor in[3], out = new_tensor(&io->out, NULL, NAN), dout = {0}, din[3] = {0};
    for (int i = 0; i < io->n_in; i++) {
        in[i] = new_tensor(&io->in[i], io->x[i], 0);
        call.in[i] = &in[i];
    }
    call.out[0] = &out;
    assert_int_equal(def->forward(&call, &err), MS_OK);
    io->y = copy_out(&out, 0);
    if (io->dy) {
        dout = new_tensor(&io->out, io->dy, 0);
        call.dout[0] = &dout;
        call.din_fresh = io->fresh ? def->fresh_ok : 0;
        for (int i = 0; i < io->n_in; i++)
            if (def->grad_inputs >> i & 1) {
                din[i] = new_tensor(&io->in[i], NULL, call.din_fresh >> i & 1 ? NAN : DX_START);
                call.din[i] = &din[i];
            }
        assert_int_equal(def->backward(&call, &err), MS_OK);
        for (int i = 0; i < io->n_in; i++)
            if (call.din[i]) io->dx[i] = copy_out(&din[i], call.din_fresh >> i & 1 ? 0 : DX_START);
        ms_tensor_release(&dout);
    }
    for (int i = 0; i < io->n_in; i++) ms_tensor_release(&in[i]), ms_tensor_release(&din[i]);
    ms_tensor_release(&out);
}

static void op_io_free(op_io *io) {
    free(io->y);
    for (int i = 0; i < 3; i++) free(io->dx[i]);
}

/* got (float) against a double reference: same infinity, or within rel * |ref| + abs. */
static bool near(float got, double ref, double rel, double abs) {
    float rf = (float)ref;
    if (isinf(rf)) return got == rf;
    return fabs((double)got - ref) <= rel * fabs(ref) + abs;
}

/* ---- unary ----------------------------------------------------------------------------- */

static double unary_ref(int op, double x, const float *f) {
    const double sa = 1.6732632423543772848, ss = 1.0507009873554804934;
    // clang-format off
    switch (op) {
        case MS_OP_NEG: return -x;
        case MS_OP_ABS: return fabs(x);
        case MS_OP_EXP: return exp(x);
        case MS_OP_LOG: return log(x);
        case MS_OP_LOG1P: return log1p(x);
        case MS_OP_EXPM1: return expm1(x);
        case MS_OP_SQRT: return sqrt(x);
        case MS_OP_RSQRT: return 1 / sqrt(x);
        case MS_OP_SQUARE: return x * x;
        case MS_OP_RECIPROCAL: return 1 / x;
        case MS_OP_SIN: return sin(x);
        case MS_OP_COS: return cos(x);
        case MS_OP_TANH: return tanh(x);
        case MS_OP_SIGMOID: return 1 / (1 + exp(-x));
        case MS_OP_RELU: return x > 0 ? x : 0;
        case MS_OP_LEAKY_RELU: return x > 0 ? x : f[0] * x;
        case MS_OP_ELU: return x > 0 ? x : f[0] * (exp(x) - 1);
        case MS_OP_SILU: return x / (1 + exp(-x));
        case MS_OP_GELU_ERF: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
        case MS_OP_SOFTPLUS: return log(1 + exp(x));
        case MS_OP_MISH: return x * tanh(log(1 + exp(x)));
        case MS_OP_HARDSWISH: return x * fmin(fmax(x + 3, 0), 6) / 6;
        case MS_OP_HARDSIGMOID: return fmin(fmax(x + 3, 0), 6) / 6;
        case MS_OP_CLAMP: return fmin(fmax(x, f[0]), f[1]);
        case MS_OP_POW_SCALAR: return pow(x, f[0]);
        case MS_OP_SIGN: return (x > 0) - (x < 0);
        case MS_OP_SELU: return ss * (x > 0 ? x : sa * (exp(x) - 1));
        case MS_OP_SOFTSIGN: return x / (1 + fabs(x));
        case MS_OP_LOGSIGMOID: return -log(1 + exp(-x));
        case MS_OP_ERF: return erf(x);
        case MS_OP_ATAN: return atan(x);
        case MS_OP_ADD_SCALAR: return x + f[0];
    }
    // clang-format on
    fail_msg("no reference for op %d", op);
    return 0;
}

static const float any_x[] = {-100,  -20,  -3.5f, -3, -1,   -0.5f, -1e-3f, 0,
                              1e-3f, 0.5f, 1,     3,  3.5f, 20,    100};
static const float pos_x[] = {1e-6f, 1e-3f, 0.5f, 1, 2, 20, 1e4f};

typedef struct unary_case {
    int op;
    ms_op_attrs a;
    bool positive; /* domain x > 0 */
} unary_case;

static const unary_case unary_cases[] = {
    {MS_OP_NEG, {.i = {0}}, 0},
    {MS_OP_ABS, {.i = {0}}, 0},
    {MS_OP_EXP, {.i = {0}}, 0},
    {MS_OP_LOG, {.i = {0}}, 1},
    {MS_OP_LOG1P, {.i = {0}}, 1},
    {MS_OP_EXPM1, {.i = {0}}, 0},
    {MS_OP_SQRT, {.i = {0}}, 1},
    {MS_OP_RSQRT, {.i = {0}}, 1},
    {MS_OP_SQUARE, {.i = {0}}, 0},
    {MS_OP_RECIPROCAL, {.i = {0}}, 1},
    {MS_OP_SIN, {.i = {0}}, 0},
    {MS_OP_COS, {.i = {0}}, 0},
    {MS_OP_TANH, {.i = {0}}, 0},
    {MS_OP_SIGMOID, {.i = {0}}, 0},
    {MS_OP_RELU, {.i = {0}}, 0},
    {MS_OP_LEAKY_RELU, {.f = {0.01f}}, 0},
    {MS_OP_ELU, {.f = {1.0f}}, 0},
    {MS_OP_ELU, {.f = {0.3f}}, 0},
    {MS_OP_SILU, {.i = {0}}, 0},
    {MS_OP_GELU_ERF, {.i = {0}}, 0},
    {MS_OP_SOFTPLUS, {.i = {0}}, 0},
    {MS_OP_MISH, {.i = {0}}, 0},
    {MS_OP_HARDSWISH, {.i = {0}}, 0},
    {MS_OP_HARDSIGMOID, {.i = {0}}, 0},
    {MS_OP_CLAMP, {.f = {-0.5f, 2}}, 0},
    {MS_OP_POW_SCALAR, {.f = {3}}, 0},
    {MS_OP_POW_SCALAR, {.f = {2.5f}}, 1},
    {MS_OP_POW_SCALAR, {.f = {0}}, 1},
    {MS_OP_SIGN, {.i = {0}}, 0},
    {MS_OP_SELU, {.i = {0}}, 0},
    {MS_OP_SOFTSIGN, {.i = {0}}, 0},
    {MS_OP_LOGSIGMOID, {.i = {0}}, 0},
    {MS_OP_ERF, {.i = {0}}, 0},
    {MS_OP_ATAN, {.i = {0}}, 0},
    {MS_OP_ADD_SCALAR, {.f = {0.25f}}, 0},
};

/* The derivative at x from double differences of the reference: smooth (the central
 * difference), a kink (one-sided slopes disagree: any value between them is a
 * subgradient) or a jump (the slope grows as the step shrinks: nothing to check). */
typedef enum { SMOOTH, KINK, JUMP } slope_kind;
typedef struct slope {
    slope_kind kind;
    double mid, lo, hi;
} slope;

static double central(const unary_case *c, double x, double h) {
    return (unary_ref(c->op, x + h, c->a.f) - unary_ref(c->op, x - h, c->a.f)) / (2 * h);
}
static slope unary_slope(const unary_case *c, double x) {
    /* a step small against x near zero (log, 1/x), and against curvature far out (exp) */
    double h = x == 0 ? 1e-6 : fabs(x) < 1 ? 1e-5 * fabs(x) : 1e-6 * fabs(x);
    double f0 = unary_ref(c->op, x, c->a.f);
    double left = (f0 - unary_ref(c->op, x - h, c->a.f)) / h;
    double right = (unary_ref(c->op, x + h, c->a.f) - f0) / h;
    slope s = {SMOOTH, central(c, x, h), fmin(left, right), fmax(left, right)};
    double tol = 1e-3 * fmax(1, fabs(s.mid));
    if (fabs(central(c, x, 10 * h) - s.mid) > tol)
        s.kind = JUMP;
    else if (s.hi - s.lo > tol)
        s.kind = KINK;
    return s;
}

static void check_unary_backward(const unary_case *c, float x, float got, int *kinks) {
    const char *name = ms_op_get(c->op)->name;
    slope s = unary_slope(c, x);
    if (s.kind == SMOOTH && !near(got, s.mid, 1e-4, 1e-6))
        fail_msg("%s'(%g): backward gives %.9g, float64 differences %.9g", name, x, got, s.mid);
    if (s.kind == KINK && !(got >= s.lo - 1e-6 && got <= s.hi + 1e-6))
        fail_msg("%s'(%g): backward gives %.9g, not between the one-sided slopes %.9g and %.9g",
                 name, x, got, s.lo, s.hi);
    if (kinks) *kinks += s.kind != SMOOTH;
}

static void unary_matches_float64(void **state) {
    (void)state;
    int n_cases = (int)(sizeof unary_cases / sizeof *unary_cases), covered = 0, kinks = 0;
    bool seen[MS_OP_BUILTIN_COUNT] = {0};
    for (int ci = 0; ci < n_cases; ci++) {
        const unary_case *c = &unary_cases[ci];
        const char *name = ms_op_get(c->op)->name;
        const float *x = c->positive ? pos_x : any_x;
        int n = c->positive ? (int)(sizeof pos_x / 4) : (int)(sizeof any_x / 4);
        float dy[16];
        for (int k = 0; k < n; k++) dy[k] = 0.75f;
        assert_int_equal(ms_op_get(c->op)->fresh_ok, 1); /* dx: one writer an element */
        for (int fresh = 0; fresh < 2; fresh++) {        /* added to 0.25, then written over NaN */
            op_io io = {.op = c->op,
                        .a = c->a,
                        .n_in = 1,
                        .in = {{1, {n}}},
                        .x = {x},
                        .dy = dy,
                        .fresh = fresh};
            op_io_run(&io);
            for (int k = 0; k < n; k++) {
                double ref = unary_ref(c->op, x[k], c->a.f);
                if (!near(io.y[k], ref, 2e-6, 1e-6))
                    fail_msg("%s(%g) = %.9g, float64 gives %.9g", name, x[k], io.y[k], ref);
                check_unary_backward(c, x[k], io.dx[0][k] / 0.75f, fresh ? NULL : &kinks);
            }
            op_io_free(&io);
        }
        if (!seen[c->op]) covered++;
        seen[c->op] = true;
    }
    print_message("  %d unary ops at %d edge cases, %d at kinks or jumps\n", covered, n_cases,
                  kinks);
    assert_int_equal(covered, MS_OP_ADD_SCALAR - MS_OP_NEG + 1); /* every unary op */
}

/* ---- binary and ternary with broadcasting ---------------------------------------------- */

/* Input k of input i: a small grid, so equal values meet; bases of pow positive, divisors
 * and atan2/hypot's second argument nonzero. */
static float grid_value(int op, int i, int64_t k) {
    static const float any[] = {-2, -1, -0.5f, 0, 0.5f, 1, 2};
    static const float nonzero[] = {-2, -1, -0.5f, 0.5f, 1, 2, 3};
    static const float positive[] = {0.5f, 1, 1.5f, 2, 3};
    int64_t h = (k * 5 + i * 3 + k / 3) % 7;
    if (op == MS_OP_POW && i == 0) return positive[h % 5];
    if (i == 1 && (op == MS_OP_DIV || op == MS_OP_ATAN2 || op == MS_OP_HYPOT)) return nonzero[h];
    if (op == MS_OP_WHERE && i == 0) return (float)(h % 2);
    return any[h];
}

/* f(a, b, c) and its partials in double. */
static double nary_ref(int op, const double *v, double *p) {
    double a = v[0], b = v[1], c = v[2], r2 = a * a + b * b, tie = a == b ? 0.5 : 0;
    p[0] = p[1] = p[2] = 0;
    // clang-format off
    switch (op) {
        case MS_OP_ADD_BCAST: p[0] = 1, p[1] = 1; return a + b;
        case MS_OP_SUB: p[0] = 1, p[1] = -1; return a - b;
        case MS_OP_MUL_BCAST: p[0] = b, p[1] = a; return a * b;
        case MS_OP_DIV: p[0] = 1 / b, p[1] = -a / (b * b); return a / b;
        case MS_OP_MAXIMUM: p[0] = a > b ? 1 : tie, p[1] = 1 - p[0]; return fmax(a, b);
        case MS_OP_MINIMUM: p[0] = a < b ? 1 : tie, p[1] = 1 - p[0]; return fmin(a, b);
        case MS_OP_POW: p[0] = b * pow(a, b - 1), p[1] = pow(a, b) * log(a); return pow(a, b);
        case MS_OP_ATAN2: p[0] = b / r2, p[1] = -a / r2; return atan2(a, b);
        case MS_OP_HYPOT: p[0] = a / sqrt(r2), p[1] = b / sqrt(r2); return sqrt(r2);
        case MS_OP_SQUARED_DIFFERENCE: p[0] = 2 * (a - b), p[1] = -p[0]; return (a - b) * (a - b);
        case MS_OP_ADD_RELU: p[0] = p[1] = a + b > 0; return fmax(a + b, 0);
        case MS_OP_EQ: return a == b;
        case MS_OP_NE: return a != b;
        case MS_OP_LT: return a < b;
        case MS_OP_LE: return a <= b;
        case MS_OP_GT: return a > b;
        case MS_OP_GE: return a >= b;
        case MS_OP_LERP: p[0] = 1 - c, p[1] = c, p[2] = b - a; return a + c * (b - a);
        case MS_OP_WHERE: p[1] = a != 0, p[2] = a == 0; return a != 0 ? b : c;
    }
    // clang-format on
    fail_msg("no reference for op %d", op);
    return 0;
}

/* Flat index into input s of the output element at multi-index idx (numpy's rule). */
static int64_t bcast_index(const ms_shape *s, const ms_shape *out, const int64_t *idx) {
    int64_t k = 0;
    for (int d = 0; d < s->ndim; d++) {
        int od = d + out->ndim - s->ndim;
        k = k * s->d[d] + (s->d[d] == 1 ? 0 : idx[od]);
    }
    return k;
}

/* Runs op on shapes, checks output and gradients; returns how many ties it met. */
static int check_nary(int op, int n_in, const ms_shape *shapes) {
    const ms_op_def *def = ms_op_get(op);
    op_io io = {.op = op, .n_in = n_in};
    float *x[3] = {0}, *dy;
    ms_shape out;
    ms_error err = {0};
    assert_int_equal(def->infer(&io.a, n_in, shapes, &out, &err), MS_OK);
    for (int i = 0; i < n_in; i++) {
        io.in[i] = shapes[i];
        x[i] = malloc(sizeof(float) * (size_t)(numel(&shapes[i]) + 1));
        for (int64_t k = 0; k < numel(&shapes[i]); k++) x[i][k] = grid_value(op, i, k);
        io.x[i] = x[i];
    }
    int64_t n = numel(&out);
    dy = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t k = 0; k < n; k++) dy[k] = 0.5f + (float)(k % 3) * 0.25f;
    io.dy = dy;
    op_io_run(&io);
    assert_int_equal(io.out.ndim, out.ndim);
    double *ref_dx[3] = {0};
    for (int i = 0; i < n_in; i++)
        ref_dx[i] = calloc((size_t)numel(&shapes[i]) + 1, sizeof(double));
    int ties = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t idx[MS_MAX_DIMS], rem = k, at[3];
        for (int d = out.ndim - 1; d >= 0; d--) idx[d] = rem % out.d[d], rem /= out.d[d];
        double v[3] = {0}, p[3];
        for (int i = 0; i < n_in; i++)
            at[i] = bcast_index(&shapes[i], &out, idx), v[i] = x[i][at[i]];
        ties += n_in == 2 && v[0] == v[1];
        double ref = nary_ref(op, v, p);
        if (!near(io.y[k], ref, 2e-6, 1e-6))
            fail_msg("%s: output %lld is %.9g, float64 gives %.9g", def->name, (long long)k,
                     io.y[k], ref);
        for (int i = 0; i < n_in; i++) ref_dx[i][at[i]] += p[i] * dy[k];
    }
    for (int i = 0; i < n_in; i++) {
        if (!(def->grad_inputs >> i & 1)) {
            assert_null(io.dx[i]); /* comparisons and where's cond take no gradient */
            continue;
        }
        for (int64_t k = 0; k < numel(&shapes[i]); k++)
            if (!near(io.dx[i][k], ref_dx[i][k], 1e-5, 1e-5))
                fail_msg("%s: gradient of input %d at %lld is %.9g, float64 gives %.9g (summed "
                         "over broadcast dims)",
                         def->name, i, (long long)k, io.dx[i][k], ref_dx[i][k]);
    }
    for (int i = 0; i < n_in; i++) free(x[i]), free(ref_dx[i]);
    free(dy);
    op_io_free(&io);
    return ties;
}

#define SH(...) ((ms_shape){(int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), {__VA_ARGS__}})
#define SCALAR  ((ms_shape){0, {0}})

static void binary_matches_float64(void **state) {
    (void)state;
    const ms_shape pairs[][2] = {
        {SH(3, 5), SH(5)},          {SH(3, 1), SH(1, 5)}, {SH(2, 1, 3), SH(3, 1)},
        {SCALAR, SH(2, 3)},         {SH(4), SH(1)},       {SH(2, 3, 4), SH(2, 3, 4)},
        {SH(1, 4, 1), SH(2, 1, 3)}, {SH(0, 3), SH(3)},
    };
    int n_pairs = (int)(sizeof pairs / sizeof *pairs), ties = 0;
    for (int op = MS_OP_ADD_BCAST; op <= MS_OP_GE; op++) {
        int t = 0;
        for (int k = 0; k < n_pairs; k++) t += check_nary(op, 2, pairs[k]);
        if (op == MS_OP_MAXIMUM || op == MS_OP_MINIMUM || op == MS_OP_EQ) {
            if (!t) fail_msg("%s: the inputs met no tie", ms_op_get(op)->name);
            ties += t;
        }
    }
    print_message("  %d binary ops on %d shape pairs, %d ties\n", MS_OP_GE - MS_OP_ADD_BCAST + 1,
                  n_pairs, ties);
}

static void ternary_matches_float64(void **state) {
    (void)state;
    const ms_shape triples[][3] = {
        {SH(3, 5), SH(5), SH(3, 1)},
        {SCALAR, SH(4), SCALAR},
        {SH(2, 3), SH(2, 3), SH(2, 3)},
        {SH(3, 1), SH(1, 4), SCALAR},
    };
    for (int op = MS_OP_LERP; op <= MS_OP_WHERE; op++)
        for (int k = 0; k < (int)(sizeof triples / sizeof *triples); k++)
            check_nary(op, 3, triples[k]);
}

/* ---- refusals and rules ---------------------------------------------------------------- */

static void expect_refused(int op, ms_op_attrs a, int n_in, const ms_shape *in, const char *want1,
                           const char *want2) {
    const ms_op_def *def = ms_op_get(op);
    ms_shape out;
    ms_error err = {0};
    assert_int_equal(def->infer(&a, n_in, in, &out, &err), MS_ERR_INVALID);
    if (!strstr(err.msg, def->name) || !strstr(err.msg, want1) ||
        (want2 && !strstr(err.msg, want2)))
        fail_msg("%s: unhelpful error: %s", def->name, err.msg);
}

static void bad_shapes_and_attrs_are_refused(void **state) {
    (void)state;
    const ms_op_attrs none = {.i = {0}};
    ms_shape s35_4[2] = {SH(3, 5), SH(4)};
    expect_refused(MS_OP_ADD_BCAST, none, 2, s35_4, "[3, 5]", "[4]");
    ms_shape s23_32[2] = {SH(2, 3), SH(3, 2)};
    expect_refused(MS_OP_POW, none, 2, s23_32, "[2, 3]", "match or be 1");
    expect_refused(MS_OP_GE, none, 2, s23_32, "[3, 2]", NULL);
    ms_shape s3[3] = {SH(2, 3), SH(3), SH(4)};
    expect_refused(MS_OP_WHERE, none, 3, s3, "[4]", NULL);
    ms_shape x[1] = {SH(3)};
    expect_refused(MS_OP_CLAMP, (ms_op_attrs){.f = {1, -1}}, 1, x, "lo <= hi", NULL);
    expect_refused(MS_OP_LEAKY_RELU, (ms_op_attrs){.f = {NAN}}, 1, x, "finite", NULL);
    expect_refused(MS_OP_POW_SCALAR, (ms_op_attrs){.f = {INFINITY}}, 1, x, "f[0]", NULL);
}

static bool has_partial(const ms_rule_cand *c, int n_in) {
    bool p = c->out[0].kind == MS_PL_PARTIAL;
    for (int i = 0; i < n_in; i++) p |= c->in[i].kind == MS_PL_PARTIAL;
    return p;
}

/* The brief of the rules: nonlinear ops never pass P(sum) through; a broadcast input is
 * replicated where the other is sharded. (test_rules checks that what they say is right.) */
static void rules_shard_and_pass_partials_only_when_linear(void **state) {
    (void)state;
    ms_rule_cand c[MS_OP_MAX_CANDS];
    const ms_op_attrs none = {.f = {0, 1}};
    ms_shape x[1] = {SH(3, 5)};
    for (int op = MS_OP_NEG; op <= MS_OP_ADD_SCALAR; op++) {
        int n = ms_op_get(op)->rule(&none, 1, x, 2, c), partials = 0;
        for (int k = 0; k < n; k++) partials += has_partial(&c[k], 1);
        assert_int_equal(n, 3 + partials); /* R, S(0), S(1) */
        if (partials != (op == MS_OP_NEG))
            fail_msg("%s: %d P(sum) candidates", ms_op_get(op)->name, partials);
    }
    ms_shape ab[2] = {SH(3, 1), SH(5)}; /* -> [3, 5] */
    for (int op = MS_OP_ADD_BCAST; op <= MS_OP_GE; op++) {
        int n = ms_op_get(op)->rule(&none, 2, ab, 2, c), partials = 0;
        for (int k = 0; k < n; k++) partials += has_partial(&c[k], 2);
        int want = op == MS_OP_ADD_BCAST || op == MS_OP_SUB || op == MS_OP_DIV ? 1
                   : op == MS_OP_MUL_BCAST                                     ? 2
                                                                               : 0;
        if (partials != want) fail_msg("%s: %d P(sum) candidates", ms_op_get(op)->name, partials);
        assert_int_equal(n, 3 + partials);
        /* output S(0): a sharded, b (lacking the dim) replicated; S(1): the reverse */
        assert_true(c[1].out[0].kind == MS_PL_SHARD && c[1].out[0].dim == 0);
        assert_true(c[1].in[0].kind == MS_PL_SHARD && c[1].in[1].kind == MS_PL_REPLICATE);
        assert_true(c[2].out[0].dim == 1 && c[2].in[0].kind == MS_PL_REPLICATE);
        assert_true(c[2].in[1].kind == MS_PL_SHARD && c[2].in[1].dim == 0);
    }
}

/* Twice the elements, twice the work: the planner reads these. */
static void costs_scale_with_size(void **state) {
    (void)state;
    const ms_op_attrs a = {.f = {0, 1}};
    const ms_shape shapes[2] = {SH(2, 3), SH(4, 3)};
    for (int op = MS_OP_NEG; op <= MS_OP_WHERE; op++) {
        const ms_op_def *def = ms_op_get(op);
        ms_tensor t[2][MS_OP_MAX_IN + 1];
        ms_op_call call[2];
        for (int s = 0; s < 2; s++) {
            call[s] =
                (ms_op_call){.kc = ms_kctx_host(), .attrs = &a, .n_in = def->n_in, .n_out = 1};
            for (int i = 0; i <= def->n_in; i++) t[s][i] = new_tensor(&shapes[s], NULL, 1);
            for (int i = 0; i < def->n_in; i++) call[s].in[i] = &t[s][i];
            call[s].out[0] = &t[s][def->n_in];
        }
        for (int bw = 0; bw < 2; bw++) {
            ms_k_cost c1 = def->cost(&call[0], bw), c2 = def->cost(&call[1], bw);
            if (!(c1.bytes > 0 && c2.bytes == 2 * c1.bytes && c2.flops == 2 * c1.flops))
                fail_msg("%s: cost does not scale with the element count", def->name);
        }
        for (int s = 0; s < 2; s++)
            for (int i = 0; i <= def->n_in; i++) ms_tensor_release(&t[s][i]);
    }
}

/* Long loops split across a rank's threads in chunks that start mid-row; the result must be
 * the one-thread result, bit for bit. */
static void threaded_matches_one_thread(void **state) {
    (void)state;
    const int64_t rows = 70, cols = 1001, n = rows * cols;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    for (int64_t k = 0; k < n; k++) x[k] = (float)(k % 37) / 9 - 2, y[k] = (float)(k % 11) / 4;
    const struct {
        int op, n_in;
        ms_shape in[2];
    } cases[] = {
        {MS_OP_SILU, 1, {SH(rows, cols)}},
        {MS_OP_SUB, 2, {SH(rows, cols), SH(cols)}},
        {MS_OP_MAXIMUM, 2, {SH(rows, 1), SH(rows, cols)}},
        {MS_OP_DIV, 2, {SH(rows, cols), SH(rows, cols)}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        op_io io[2];
        for (int t = 0; t < 2; t++) {
            ms_parallel_set_threads(t ? 3 : 1);
            io[t] = (op_io){.op = cases[c].op, .n_in = cases[c].n_in, .x = {x, y}, .dy = x};
            memcpy(io[t].in, cases[c].in, sizeof cases[c].in);
            op_io_run(&io[t]);
        }
        ms_parallel_set_threads(1);
        const char *name = ms_op_get(cases[c].op)->name;
        if (memcmp(io[0].y, io[1].y, sizeof(float) * (size_t)n))
            fail_msg("%s: the forward on 3 threads differs from 1 thread", name);
        for (int i = 0; i < cases[c].n_in; i++)
            if (memcmp(io[0].dx[i], io[1].dx[i], sizeof(float) * (size_t)numel(&cases[c].in[i])))
                fail_msg("%s: the backward on 3 threads differs from 1 thread", name);
        op_io_free(&io[0]), op_io_free(&io[1]);
    }
    free(x), free(y);
}

/* ---- in a distributed graph: broadcast gradients come back as partial sums ------------- */

/* loss = mean(where(mask, lerp(u, x, g), -u)) with u = silu(x * w - b) / exp(d), x [6, 5]
 * sharded by rows (and columns on a 2x2 mesh): the parameters w [5], b [6, 1], g [1, 5] and
 * d [5] broadcast over the sharded dims, so their gradients are partial sums by duality that
 * the program must reduce. The loss and every gradient must equal one rank's. */
#define G_ROWS 6
#define G_COLS 5
typedef struct graph_run {
    const char *mesh, *x_pl;
    float loss, grad[4][G_ROWS * G_COLS];
} graph_run;

static const char *const g_params[4] = {"w", "b", "g", "d"};
static const ms_shape g_shapes[4] = {SH(G_COLS), SH(G_ROWS, 1), SH(1, G_COLS), SH(G_COLS)};

static int graph_build(ms_graph *g, int *x, int *mask) {
    const int64_t xs[2] = {G_ROWS, G_COLS}, ms[2] = {G_ROWS, 1};
    *x = ms_graph_input(g, "x", 2, xs);
    *mask = ms_graph_input(g, "mask", 2, ms);
    int p[4];
    for (int i = 0; i < 4; i++)
        p[i] = ms_graph_param(g, g_params[i], g_shapes[i].ndim, g_shapes[i].d,
                              (ms_init){MS_INIT_CONST, 0});
    int t1[2] = {*x, p[0]}, h = ms_graph_op(g, MS_OP_MUL_BCAST, NULL, 2, t1, "xw");
    int t2[2] = {h, p[1]};
    h = ms_graph_op(g, MS_OP_SUB, NULL, 2, t2, "shifted");
    h = ms_graph_op(g, MS_OP_SILU, NULL, 1, &h, "act");
    int e = ms_graph_op(g, MS_OP_EXP, NULL, 1, &p[3], "den");
    int t3[2] = {h, e}, u = ms_graph_op(g, MS_OP_DIV, NULL, 2, t3, "u");
    int t4[3] = {u, *x, p[2]}, l = ms_graph_op(g, MS_OP_LERP, NULL, 3, t4, "mixed");
    int nu = ms_graph_op(g, MS_OP_NEG, NULL, 1, &u, "neg");
    int t5[3] = {*mask, l, nu}, y = ms_graph_op(g, MS_OP_WHERE, NULL, 3, t5, "picked");
    ms_op_attrs all = {.i = {-1}};
    return ms_graph_op(g, MS_OP_MEAN, &all, 1, &y, "loss");
}

static void graph_values(int v, int64_t n, float *out) {
    for (int64_t k = 0; k < n; k++) out[k] = 2 * ms_philox_uniform(5, (uint64_t)v, (uint64_t)k) - 1;
}

/* The full gradient of parameter i (collective), into out on rank 0. */
static void graph_grad(mt_rank *r, ms_program *p, ms_dmesh *dm, int i, float *out) {
    ms_error err = {0};
    ms_param_view pv;
    ms_program_param(p, i, &pv);
    ms_dtensor t = {.ndim = pv.gshape.ndim, .mesh = dm, .pl = pv.grad_pl, .local = pv.grad};
    memcpy(t.gshape, pv.gshape.d, sizeof t.gshape);
    ms_tensor full;
    if (!MT_OK(r, ms_dtensor_full(&t, &full, &err), &err)) return;
    if (r->ctx->rank == 0)
        memcpy(out, ms_tensor_f32(&full), sizeof(float) * (size_t)ms_tensor_numel(&full));
    ms_tensor_release(&full);
}

static void graph_body(mt_rank *r, void *arg) {
    graph_run *run = arg;
    ms_error err = {0};
    ms_graph *g = ms_graph_create();
    int x, mask, loss = graph_build(g, &x, &mask);
    ms_graph_set_loss(g, loss);
    ms_placements xpl;
    ms_placements_parse(run->x_pl, &xpl, &err);
    ms_graph_annotate(g, x, &xpl);
    ms_mesh mesh;
    ms_mesh_parse(&mesh, run->mesh, &err);
    ms_dmesh *dm;
    ms_program *p;
    ms_compile_opts co = {.seed = 3};
    if (MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err) &&
        MT_OK(r, ms_program_compile(g, dm, &co, &p, &err), &err)) {
        float xv[G_ROWS * G_COLS], mv[G_ROWS], pv[G_ROWS * G_COLS];
        graph_values(0, G_ROWS * G_COLS, xv);
        for (int k = 0; k < G_ROWS; k++) mv[k] = (float)(k % 2);
        MT_OK(r, ms_program_feed(p, x, xv, &err), &err);
        MT_OK(r, ms_program_feed(p, mask, mv, &err), &err);
        for (int i = 0; i < ms_program_num_params(p); i++) {
            ms_param_view v;
            ms_program_param(p, i, &v);
            graph_values(1 + i, numel(&v.gshape), pv);
            MT_OK(r, ms_program_load_param(p, i, pv, &err), &err);
        }
        float l = 0;
        MT_OK(r, ms_program_step(p, &l, &err), &err);
        for (int i = 0; i < ms_program_num_params(p); i++) {
            ms_param_view v;
            ms_program_param(p, i, &v);
            for (int k = 0; k < 4; k++)
                if (!strcmp(v.name, g_params[k])) graph_grad(r, p, dm, i, run->grad[k]);
        }
        if (r->ctx->rank == 0) run->loss = l;
        ms_program_destroy(p);
        ms_dmesh_destroy(dm);
    }
    ms_mesh_free(&mesh);
    ms_graph_destroy(g);
}

static void graph_matches_one_rank(void **state) {
    (void)state;
    graph_run one = {.mesh = "1", .x_pl = "[R]"},
              runs[2] = {{.mesh = "2", .x_pl = "[S(0)]"}, {.mesh = "2x2", .x_pl = "[S(0), S(1)]"}};
    mt_run(1, graph_body, &one);
    assert_true(fabsf(one.grad[0][0]) > 0 && fabsf(one.grad[2][0]) > 0); /* gradients flowed */
    for (int m = 0; m < 2; m++) {
        mt_run(m ? 4 : 2, graph_body, &runs[m]);
        if (mt_world_rank() != 0) continue;
        if (!(fabs(runs[m].loss - one.loss) <= 1e-5 * fabs(one.loss)))
            fail_msg("mesh %s: loss %.9g, one rank %.9g", runs[m].mesh, runs[m].loss, one.loss);
        for (int i = 0; i < 4; i++)
            for (int64_t k = 0; k < numel(&g_shapes[i]); k++) {
                double a = runs[m].grad[i][k], b = one.grad[i][k];
                if (!(fabs(a - b) <= 1e-5 * fabs(b) + 1e-7))
                    fail_msg("mesh %s: gradient of %s[%lld] is %.9g, one rank %.9g", runs[m].mesh,
                             g_params[i], (long long)k, a, b);
            }
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
    cmocka_unit_test_setup_teardown(unary_matches_float64, setup, teardown),
    cmocka_unit_test_setup_teardown(binary_matches_float64, setup, teardown),
    cmocka_unit_test_setup_teardown(ternary_matches_float64, setup, teardown),
    cmocka_unit_test(bad_shapes_and_attrs_are_refused),
    cmocka_unit_test(rules_shard_and_pass_partials_only_when_linear),
    cmocka_unit_test_setup_teardown(costs_scale_with_size, setup, teardown),
    cmocka_unit_test_setup_teardown(threaded_matches_one_thread, setup, teardown),
    cmocka_unit_test(graph_matches_one_rank),
};
MT_MAIN("ops elementwise", tests)

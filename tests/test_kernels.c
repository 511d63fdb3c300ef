/* test_kernels.c - the CPU kernels against independent double-precision references.
 *
 * Every forward is compared with a straightforward float64 loop written here, and every
 * backward with central finite differences of that reference: for a random projection
 * L = sum(w * f(x)) the kernel's backward, fed dout = w, must give dL/dx. Backward kernels
 * accumulate, so gradient buffers start from random values and the test checks the increment.
 * The vocab-parallel cross-entropy is checked by splitting V into slices and doing the
 * all-reduces by hand, exactly as a distributed run would; dropout by comparing a tensor
 * computed whole against the same tensor computed as boxes. In debug builds, a cross-entropy
 * target past the vocabulary stops the process with a message instead of reading out of bounds.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "engine/kernels/kernels.h"
#include "tests/testkit.h"

/* ---- helpers -------------------------------------------------------------------------------- */

/* Allocations live until the end of the test (arena_free), so the bodies stay about maths. */
#define ARENA_MAX 4096
static void *arena[ARENA_MAX];
static int arena_n;

static void *arena_alloc(size_t bytes) {
    assert_true(arena_n < ARENA_MAX);
    void *p = calloc(bytes ? bytes : 1, 1);
    assert_non_null(p);
    arena[arena_n++] = p;
    return p;
}

static void arena_free(void) {
    while (arena_n > 0) free(arena[--arena_n]);
}

static int arena_setup(void **state) {
    (void)state;
    arena_free();
    return 0;
}

static int arena_teardown(void **state) {
    (void)state;
    arena_free();
    return 0;
}

static float *fnew(int64_t n) {
    return arena_alloc((size_t)n * sizeof(float));
}
static double *dnew(int64_t n) {
    return arena_alloc((size_t)n * sizeof(double));
}

static uint64_t rng = 1;
static void seed_rng(uint64_t s) {
    rng = s * 0x9E3779B97F4A7C15ull + 1;
}
/* splitmix64, mapped to [0, 1) */
static double urand(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static float *frand(int64_t n, double lo, double hi) {
    float *x = fnew(n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}

static float *fcopy(const float *x, int64_t n) {
    float *y = fnew(n);
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* The float inputs promoted exactly, so the reference sees the same numbers as the kernel. */
static double *todouble(const float *x, int64_t n) {
    double *y = dnew(n);
    for (int64_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* Fails (with the first mismatch) unless |got - want| <= atol + rtol |want| everywhere; NaN
 * fails too. Returns the largest error relative to the bound, for tuning. */
static void expect_close(const char *what, const float *got, const double *want, int64_t n,
                         double rtol, double atol) {
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - want[i]);
        if (!(err <= atol + rtol * fabs(want[i])))
            fail_msg("%s[%lld]: got %.9g, want %.9g (|err| %.3g)", what, (long long)i,
                     (double)got[i], want[i], err);
    }
}

/* The increment after - before of an accumulated gradient, against want. */
static void expect_grad(const char *what, const float *after, const float *before,
                        const double *want, int64_t n, double rtol, double atol) {
    double *inc = dnew(n);
    float *incf = fnew(n);
    for (int64_t i = 0; i < n; i++) {
        inc[i] = (double)after[i] - (double)before[i];
        incf[i] = (float)inc[i];
    }
    expect_close(what, incf, want, n, rtol, atol);
}

static void expect_equal(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s[%lld]: got %.9g, want %.9g (must be bit-identical)", what, (long long)i,
                     (double)got[i], (double)want[i]);
}

/* A reference forward: out = f(in[0], in[1], ...) in float64. */
typedef void (*ref_fn)(const void *ctx, double *const *in, double *out);

/* dL/d in[which] by central differences, L = sum(w * f(in)). The step suits O(1) inputs in
 * double: truncation ~h^2 and rounding ~1e-16/h are both far below the float32 tolerances. */
static double *numgrad(ref_fn f, const void *ctx, double *const *in, int which, int64_t nin,
                       int64_t nout, const double *w) {
    const double h = 1e-5;
    double *out = dnew(nout), *grad = dnew(nin);
    for (int64_t j = 0; j < nin; j++) {
        const double orig = in[which][j];
        double lp = 0, lm = 0;
        in[which][j] = orig + h;
        f(ctx, in, out);
        for (int64_t k = 0; k < nout; k++) lp += w[k] * out[k];
        in[which][j] = orig - h;
        f(ctx, in, out);
        for (int64_t k = 0; k < nout; k++) lm += w[k] * out[k];
        in[which][j] = orig;
        grad[j] = (lp - lm) / (2 * h);
    }
    return grad;
}

static double *refout(ref_fn f, const void *ctx, double *const *in, int64_t nout) {
    double *out = dnew(nout);
    f(ctx, in, out);
    return out;
}

/* Tolerances for float32 kernels against float64 truth on O(1) data of these small sizes. */
#define RTOL 2e-4
#define ATOL 2e-5

/* ---- matmul --------------------------------------------------------------------------------- */

typedef struct mm_ctx {
    ms_k_gemm g;
    double alpha;
} mm_ctx;

static int64_t mm_na(const ms_k_gemm *g) {
    return g->m * g->k * (g->bcast_a ? 1 : g->batch);
}
static int64_t mm_nb(const ms_k_gemm *g) {
    return g->k * g->n * (g->bcast_b ? 1 : g->batch);
}

/* out = alpha op(A) op(B), element by element from the storage definitions. */
static void ref_matmul(const void *vc, double *const *in, double *out) {
    const mm_ctx *x = vc;
    const ms_k_gemm *g = &x->g;
    for (int64_t i = 0; i < g->batch; i++) {
        const double *a = in[0] + (g->bcast_a ? 0 : i * g->m * g->k);
        const double *b = in[1] + (g->bcast_b ? 0 : i * g->k * g->n);
        for (int64_t r = 0; r < g->m; r++)
            for (int64_t c = 0; c < g->n; c++) {
                double s = 0;
                for (int64_t kk = 0; kk < g->k; kk++) {
                    const double av = g->trans_a ? a[kk * g->m + r] : a[r * g->k + kk];
                    const double bv = g->trans_b ? b[c * g->k + kk] : b[kk * g->n + c];
                    s += av * bv;
                }
                out[(i * g->m + r) * g->n + c] = x->alpha * s;
            }
    }
}

static void check_matmul(ms_k_gemm g, float alpha, float beta, bool accumulate) {
    char what[160];
    snprintf(what, sizeof what, "matmul ta=%d tb=%d bca=%d bcb=%d batch=%lld acc=%d", g.trans_a,
             g.trans_b, g.bcast_a, g.bcast_b, (long long)g.batch, accumulate);
    const int64_t na = mm_na(&g), nb = mm_nb(&g), nc = g.batch * g.m * g.n;
    float *a = frand(na, -1, 1), *b = frand(nb, -1, 1), *c0 = frand(nc, -1, 1);
    float *c = fcopy(c0, nc);
    ms_k_matmul_forward(&g, c, a, b, alpha, beta);
    mm_ctx ctx = {g, alpha};
    double *in[2] = {todouble(a, na), todouble(b, nb)};
    double *want = refout(ref_matmul, &ctx, in, nc);
    for (int64_t j = 0; j < nc; j++) want[j] += (double)beta * c0[j];
    expect_close(what, c, want, nc, RTOL, ATOL);

    double *w = todouble(frand(nc, -1, 1), nc);
    float *dc = fnew(nc);
    for (int64_t j = 0; j < nc; j++) dc[j] = (float)w[j];
    /* accumulate = false must ignore what is in the buffers: fill them with NaN. */
    float *da0 = accumulate ? frand(na, -1, 1) : fnew(na);
    float *db0 = accumulate ? frand(nb, -1, 1) : fnew(nb);
    float *da = fcopy(da0, na), *db = fcopy(db0, nb);
    if (!accumulate) {
        for (int64_t j = 0; j < na; j++) da[j] = NAN;
        for (int64_t j = 0; j < nb; j++) db[j] = NAN;
    }
    ms_k_matmul_backward(&g, da, db, dc, a, b, alpha, accumulate);
    expect_grad(what, da, da0, numgrad(ref_matmul, &ctx, in, 0, na, nc, w), na, RTOL, ATOL);
    expect_grad(what, db, db0, numgrad(ref_matmul, &ctx, in, 1, nb, nc, w), nb, RTOL, ATOL);

    /* One gradient alone (the other NULL) gives the same values. */
    float *da2 = fcopy(da0, na);
    if (!accumulate) memset(da2, 0, (size_t)na * sizeof(float));
    ms_k_matmul_backward(&g, da2, NULL, dc, a, b, alpha, true);
    expect_close(what, da2, todouble(da, na), na, 1e-6, 1e-6);
}

static void matmul_all_cases(void **state) {
    (void)state;
    seed_rng(11);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bc = 0; bc < 3; bc++) { /* none, shared B (weight), shared A */
                ms_k_gemm g = {.batch = 3,
                               .m = 5,
                               .n = 4,
                               .k = 6,
                               .trans_a = ta,
                               .trans_b = tb,
                               .bcast_a = bc == 2,
                               .bcast_b = bc == 1};
                check_matmul(g, 0.7f, bc == 0 ? 0.3f : 0.0f, true);
                check_matmul(g, 1.0f, 0.0f, false);
            }
    /* batch 1 and a degenerate inner size */
    ms_k_gemm g1 = {.batch = 1, .m = 7, .n = 3, .k = 1, .trans_a = true};
    check_matmul(g1, 1.0f, 1.0f, true);
    /* The shared-B (linear layer) case is folded into one sgemm; check a bigger one where
     * OpenBLAS takes its blocked paths. */
    ms_k_gemm g2 = {.batch = 2, .m = 20, .n = 40, .k = 33, .trans_b = true, .bcast_b = true};
    check_matmul(g2, 1.0f, 0.0f, false);
    arena_free();
}

/* Ranks are threads: several may call sgemm at once, each on its own buffers. */
typedef struct mm_job {
    ms_k_gemm g;
    const float *a, *b;
    float *c;
} mm_job;

static void *mm_thread(void *arg) {
    mm_job *j = arg;
    for (int rep = 0; rep < 10; rep++) ms_k_matmul_forward(&j->g, j->c, j->a, j->b, 1.0f, 0.0f);
    return NULL;
}

static void matmul_concurrent_callers(void **state) {
    (void)state;
    seed_rng(22);
    enum { NT = 4 };
    const ms_k_gemm g = {.batch = 2, .m = 48, .n = 96, .k = 80, .bcast_b = true};
    const int64_t na = mm_na(&g), nb = mm_nb(&g), nc = g.batch * g.m * g.n;
    mm_job jobs[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (mm_job){g, frand(na, -1, 1), frand(nb, -1, 1), fnew(nc)};
        assert_int_equal(pthread_create(&th[i], NULL, mm_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    mm_ctx ctx = {g, 1.0};
    for (int i = 0; i < NT; i++) {
        double *in[2] = {todouble(jobs[i].a, na), todouble(jobs[i].b, nb)};
        expect_close("matmul concurrent", jobs[i].c, refout(ref_matmul, &ctx, in, nc), nc, RTOL,
                     ATOL);
    }
    arena_free();
}

/* ---- elementwise ---------------------------------------------------------------------------- */

typedef struct elt_ctx {
    int op; /* 0 add, 1 mul, 2 scale, 3 bias add, 4 gelu */
    int64_t n, c;
    double s;
} elt_ctx;

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void ref_elt(const void *vc, double *const *in, double *out) {
    const elt_ctx *x = vc;
    for (int64_t i = 0; i < x->n; i++) switch (x->op) {
            case 0:
                out[i] = in[0][i] + in[1][i];
                break;
            case 1:
                out[i] = in[0][i] * in[1][i];
                break;
            case 2:
                out[i] = x->s * in[0][i];
                break;
            case 3:
                out[i] = in[0][i] + in[1][i % x->c];
                break;
            default:
                out[i] = gelu_ref(in[0][i]);
                break;
        }
}

static void elementwise_ops(void **state) {
    (void)state;
    seed_rng(12);
    const int64_t rows = 5, c = 7, n = rows * c;
    float *a = frand(n, -2, 2), *b = frand(n, -2, 2), *bias = frand(c, -1, 1);
    float *g = frand(n, -4, 4);  /* gelu inputs cover the curved region and both tails */
    g[0] = -12.0f, g[1] = 12.0f; /* large |x|: llm.c's cosh form would overflow here */
    double *w = todouble(frand(n, -1, 1), n);
    float *dout = fnew(n);
    for (int64_t i = 0; i < n; i++) dout[i] = (float)w[i];
    float *out = fnew(n);
    double *in2[2] = {todouble(a, n), todouble(b, n)};

    /* add */
    elt_ctx cx = {0, n, c, 0};
    ms_k_add_forward(out, a, b, n);
    expect_close("add", out, refout(ref_elt, &cx, in2, n), n, 1e-7, 0);
    float *da0 = frand(n, -1, 1), *db0 = frand(n, -1, 1);
    float *da = fcopy(da0, n), *db = fcopy(db0, n);
    ms_k_add_backward(da, db, dout, n);
    expect_grad("add da", da, da0, numgrad(ref_elt, &cx, in2, 0, n, n, w), n, RTOL, ATOL);
    expect_grad("add db", db, db0, numgrad(ref_elt, &cx, in2, 1, n, n, w), n, RTOL, ATOL);

    /* mul, in place on a copy of a */
    cx.op = 1;
    float *ip = fcopy(a, n);
    ms_k_mul_forward(ip, ip, b, n);
    expect_close("mul", ip, refout(ref_elt, &cx, in2, n), n, 1e-7, 0);
    da = fcopy(da0, n), db = fcopy(db0, n);
    ms_k_mul_backward(da, db, dout, a, b, n);
    expect_grad("mul da", da, da0, numgrad(ref_elt, &cx, in2, 0, n, n, w), n, RTOL, ATOL);
    expect_grad("mul db", db, db0, numgrad(ref_elt, &cx, in2, 1, n, n, w), n, RTOL, ATOL);

    /* scale */
    cx.op = 2, cx.s = -1.75;
    ms_k_scale_forward(out, a, -1.75f, n);
    expect_close("scale", out, refout(ref_elt, &cx, in2, n), n, 1e-7, 0);
    da = fcopy(da0, n);
    ms_k_scale_backward(da, dout, -1.75f, n);
    expect_grad("scale dx", da, da0, numgrad(ref_elt, &cx, in2, 0, n, n, w), n, RTOL, ATOL);

    /* bias add over the last dim */
    cx.op = 3;
    double *inb[2] = {todouble(a, n), todouble(bias, c)};
    ms_k_bias_add_forward(out, a, bias, rows, c);
    expect_close("bias_add", out, refout(ref_elt, &cx, inb, n), n, 1e-7, 0);
    float *dbias0 = frand(c, -1, 1), *dbias = fcopy(dbias0, c);
    da = fcopy(da0, n);
    ms_k_bias_add_backward(da, dbias, dout, rows, c);
    expect_grad("bias_add dinp", da, da0, numgrad(ref_elt, &cx, inb, 0, n, n, w), n, RTOL, ATOL);
    expect_grad("bias_add dbias", dbias, dbias0, numgrad(ref_elt, &cx, inb, 1, c, n, w), c, RTOL,
                ATOL);

    /* GELU */
    cx.op = 4;
    double *ing[1] = {todouble(g, n)};
    ms_k_gelu_forward(out, g, n);
    expect_close("gelu", out, refout(ref_elt, &cx, ing, n), n, 1e-6, 1e-6);
    da = fcopy(da0, n);
    ms_k_gelu_backward(da, g, dout, n);
    expect_grad("gelu dx", da, da0, numgrad(ref_elt, &cx, ing, 0, n, n, w), n, RTOL, ATOL);
    arena_free();
}

/* ---- layernorm and softmax ------------------------------------------------------------------ */

typedef struct rows_ctx {
    int64_t n, c;
    double eps;
} rows_ctx;

static void ref_layernorm(const void *vc, double *const *in, double *out) {
    const rows_ctx *x = vc;
    for (int64_t r = 0; r < x->n; r++) {
        const double *v = in[0] + r * x->c;
        double m = 0, var = 0;
        for (int64_t j = 0; j < x->c; j++) m += v[j];
        m /= (double)x->c;
        for (int64_t j = 0; j < x->c; j++) var += (v[j] - m) * (v[j] - m);
        var /= (double)x->c;
        for (int64_t j = 0; j < x->c; j++)
            out[r * x->c + j] = (v[j] - m) / sqrt(var + x->eps) * in[1][j] + in[2][j];
    }
}

static void layernorm(void **state) {
    (void)state;
    seed_rng(13);
    const int64_t n = 6, c = 11, nc = n * c;
    float *x = frand(nc, -1, 1), *wt = frand(c, 0.5, 1.5), *bs = frand(c, -0.5, 0.5);
    for (int64_t i = 0; i < nc; i++) x[i] += 3.0f; /* an offset mean, as activations have */
    float *out = fnew(nc), *mean = fnew(n), *rstd = fnew(n);
    ms_k_layernorm_forward(out, mean, rstd, x, wt, bs, n, c, 1e-5f);
    rows_ctx ctx = {n, c, 1e-5};
    double *in[3] = {todouble(x, nc), todouble(wt, c), todouble(bs, c)};
    expect_close("layernorm", out, refout(ref_layernorm, &ctx, in, nc), nc, RTOL, ATOL);
    double *wm = dnew(n), *wr = dnew(n);
    for (int64_t r = 0; r < n; r++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < c; j++) m += in[0][r * c + j];
        m /= (double)c;
        for (int64_t j = 0; j < c; j++) v += (in[0][r * c + j] - m) * (in[0][r * c + j] - m);
        wm[r] = m, wr[r] = 1.0 / sqrt(v / (double)c + 1e-5);
    }
    expect_close("layernorm mean", mean, wm, n, 1e-6, 1e-6);
    expect_close("layernorm rstd", rstd, wr, n, RTOL, ATOL);

    double *w = todouble(frand(nc, -1, 1), nc);
    float *dout = fnew(nc);
    for (int64_t i = 0; i < nc; i++) dout[i] = (float)w[i];
    float *dx0 = frand(nc, -1, 1), *dw0 = frand(c, -1, 1), *db0 = frand(c, -1, 1);
    float *dx = fcopy(dx0, nc), *dw = fcopy(dw0, c), *db = fcopy(db0, c);
    ms_k_layernorm_backward(dx, dw, db, dout, x, wt, mean, rstd, n, c);
    expect_grad("layernorm dinp", dx, dx0, numgrad(ref_layernorm, &ctx, in, 0, nc, nc, w), nc, 1e-3,
                1e-4);
    expect_grad("layernorm dweight", dw, dw0, numgrad(ref_layernorm, &ctx, in, 1, c, nc, w), c,
                RTOL, ATOL);
    expect_grad("layernorm dbias", db, db0, numgrad(ref_layernorm, &ctx, in, 2, c, nc, w), c, RTOL,
                ATOL);
    arena_free();
}

static void ref_softmax(const void *vc, double *const *in, double *out) {
    const rows_ctx *x = vc;
    for (int64_t r = 0; r < x->n; r++) {
        const double *v = in[0] + r * x->c;
        double s = 0;
        for (int64_t j = 0; j < x->c; j++) s += exp(v[j]);
        for (int64_t j = 0; j < x->c; j++) out[r * x->c + j] = exp(v[j]) / s;
    }
}

static void softmax(void **state) {
    (void)state;
    seed_rng(14);
    const int64_t n = 5, c = 9, nc = n * c;
    float *x = frand(nc, -3, 3), *out = fnew(nc);
    ms_k_softmax_forward(out, x, n, c);
    rows_ctx ctx = {n, c, 0};
    double *in[1] = {todouble(x, nc)};
    expect_close("softmax", out, refout(ref_softmax, &ctx, in, nc), nc, RTOL, 1e-7);
    double *w = todouble(frand(nc, -1, 1), nc);
    float *dout = fnew(nc);
    for (int64_t i = 0; i < nc; i++) dout[i] = (float)w[i];
    float *dx0 = frand(nc, -1, 1), *dx = fcopy(dx0, nc);
    ms_k_softmax_backward(dx, dout, out, n, c);
    expect_grad("softmax dinp", dx, dx0, numgrad(ref_softmax, &ctx, in, 0, nc, nc, w), nc, RTOL,
                ATOL);
    /* Large logits: the max subtraction keeps it finite. */
    for (int64_t i = 0; i < c; i++) x[i] += 200.0f;
    ms_k_softmax_forward(out, x, 1, c);
    in[0] = todouble(x, c);
    double *want = dnew(c);
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < c; j++) mx = fmax(mx, in[0][j]);
    for (int64_t j = 0; j < c; j++) s += exp(in[0][j] - mx);
    for (int64_t j = 0; j < c; j++) want[j] = exp(in[0][j] - mx) / s;
    expect_close("softmax large", out, want, c, RTOL, 1e-7);
    arena_free();
}

/* ---- attention ------------------------------------------------------------------------------ */

typedef struct attn_ctx {
    int64_t b, t, c, nh;
    bool causal;
    const float *mask;             /* [B, T] or NULL */
    double *probs;                 /* [B, NH, T, T] written when non-NULL (before dropout) */
    const ms_k_attn_dropout *drop; /* or NULL */
} attn_ctx;

/* The reference's dropout: probability (b, h, i, j) of the buffer is element
 * ((b0 + b) * NH + h0 + h) * T^2 + i * T + j of the whole [batch, heads, T, T] (no window). */
static double ref_attn_keep(const attn_ctx *x, int64_t b, int64_t h, int64_t i, int64_t j) {
    const ms_k_attn_dropout *d = x->drop;
    if (!d || d->p <= 0) return 1.0;
    uint64_t g = (uint64_t)(((d->b0 + b) * d->nh + d->h0 + h) * x->t * x->t + i * x->t + j);
    return ms_k_dropout_keep(d->p, d->seed, d->stream, g) ? 1.0 / (1.0 - d->p) : 0.0;
}

#define REF_TMAX 128

static void ref_attention(const void *vc, double *const *in, double *out) {
    const attn_ctx *x = vc;
    const int64_t t = x->t, c = x->c, hs = c / x->nh;
    const double scale = 1.0 / sqrt((double)hs);
    double s[REF_TMAX];
    for (int64_t b = 0; b < x->b; b++)
        for (int64_t h = 0; h < x->nh; h++)
            for (int64_t i = 0; i < t; i++) {
                const double *q = in[0] + (b * t + i) * 3 * c + h * hs;
                double mx = -INFINITY;
                for (int64_t j = 0; j < t; j++) {
                    s[j] = -INFINITY;
                    if (x->causal && j > i) continue;
                    const double *k = in[0] + (b * t + j) * 3 * c + c + h * hs;
                    double d = 0;
                    for (int64_t e = 0; e < hs; e++) d += q[e] * k[e];
                    s[j] = d * scale + (x->mask ? (double)x->mask[b * t + j] : 0.0);
                    mx = fmax(mx, s[j]);
                }
                double z = 0;
                for (int64_t j = 0; j < t; j++) z += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                for (int64_t j = 0; j < t; j++) s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx) / z;
                if (x->probs)
                    for (int64_t j = 0; j < t; j++)
                        x->probs[((b * x->nh + h) * t + i) * t + j] = s[j];
                for (int64_t j = 0; j < t; j++) s[j] *= ref_attn_keep(x, b, h, i, j);
                for (int64_t e = 0; e < hs; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < t; j++)
                        o += s[j] * in[0][(b * t + j) * 3 * c + 2 * c + h * hs + e];
                    out[(b * t + i) * c + h * hs + e] = o;
                }
            }
}

static void check_attention(int64_t b, int64_t t, int64_t c, int64_t nh, bool causal, bool masked) {
    char what[128];
    snprintf(what, sizeof what, "attention B=%lld T=%lld C=%lld NH=%lld causal=%d mask=%d",
             (long long)b, (long long)t, (long long)c, (long long)nh, causal, masked);
    const int64_t nq = b * t * 3 * c, no = b * t * c, na = b * nh * t * t;
    float *qkv = frand(nq, -1.5, 1.5), *out = fnew(no), *att = fnew(na);
    float *mask = NULL;
    if (masked) { /* batch item b drops its last b keys (padding), with a soft bias elsewhere */
        mask = fnew(b * t);
        for (int64_t bi = 0; bi < b; bi++)
            for (int64_t j = 0; j < t; j++)
                mask[bi * t + j] = j >= t - bi ? -INFINITY : (float)(0.3 * (j % 3));
    }
    for (int64_t i = 0; i < na; i++) att[i] = NAN; /* forward must write all of it */
    ms_k_attention_forward(out, att, NULL, qkv, mask, b, t, c, nh, causal, NULL);
    attn_ctx ctx = {b, t, c, nh, causal, mask, dnew(na), NULL};
    double *in[1] = {todouble(qkv, nq)};
    expect_close(what, out, refout(ref_attention, &ctx, in, no), no, RTOL, ATOL);
    expect_close(what, att, ctx.probs, na, RTOL, 1e-7);
    ctx.probs = NULL;

    double *w = todouble(frand(no, -1, 1), no);
    float *dout = fnew(no);
    for (int64_t i = 0; i < no; i++) dout[i] = (float)w[i];
    float *d0 = frand(nq, -1, 1), *d = fcopy(d0, nq);
    float *scratch = fnew(ms_k_attention_scratch_floats(t));
    ms_k_attention_backward(d, scratch, dout, qkv, att, b, t, c, nh, causal, NULL);
    expect_grad(what, d, d0, numgrad(ref_attention, &ctx, in, 0, nq, no, w), nq, 1e-3, 1e-4);
}

/* Dropout on the probabilities: the output and the gradient against the float64 reference
 * (the same keep rule, finite differences through the fixed mask), for a buffer that is a
 * window of a larger batch and of more heads (b0, h0); then sharding: the whole [2, 4 heads]
 * call against calls on one batch row and on two heads, each given its place, which must
 * reproduce their slices of the whole output exactly. */
static void check_attention_dropout(bool causal) {
    const int64_t b = 2, t = 9, nh = 4, hs = 3, c = nh * hs;
    ms_k_attn_dropout d = {.p = 0.3f, .seed = 11, .stream = 5, .b0 = 1, .h0 = 2, .nh = 7};
    char what[96];
    snprintf(what, sizeof what, "attention dropout causal=%d", causal);
    const int64_t nq = b * t * 3 * c, no = b * t * c, na = b * nh * t * t;
    float *qkv = frand(nq, -1.5, 1.5), *out = fnew(no), *att = fnew(na);
    float *work = fnew(ms_k_attention_scratch_floats(t));
    ms_k_attention_forward(out, att, work, qkv, NULL, b, t, c, nh, causal, &d);
    attn_ctx ctx = {b, t, c, nh, causal, NULL, NULL, &d};
    double *in[1] = {todouble(qkv, nq)};
    expect_close(what, out, refout(ref_attention, &ctx, in, no), no, RTOL, ATOL);
    double *w = todouble(frand(no, -1, 1), no);
    float *dout = fnew(no);
    for (int64_t i = 0; i < no; i++) dout[i] = (float)w[i];
    float *d0 = frand(nq, -1, 1), *dq = fcopy(d0, nq);
    float *scratch = fnew(ms_k_attention_scratch_floats(t));
    ms_k_attention_backward(dq, scratch, dout, qkv, att, b, t, c, nh, causal, &d);
    expect_grad(what, dq, d0, numgrad(ref_attention, &ctx, in, 0, nq, no, w), nq, 1e-3, 1e-4);

    /* the whole step: [2, 4 heads] at b0 = 0, h0 = 0 of 4 heads */
    ms_k_attn_dropout whole = {.p = 0.3f, .seed = 11, .stream = 5, .nh = nh};
    ms_k_attention_forward(out, att, work, qkv, NULL, b, t, c, nh, causal, &whole);
    /* batch row 1 alone */
    float *o1 = fnew(t * c), *a1 = fnew(nh * t * t);
    ms_k_attn_dropout row1 = whole;
    row1.b0 = 1;
    ms_k_attention_forward(o1, a1, work, qkv + t * 3 * c, NULL, 1, t, c, nh, causal, &row1);
    for (int64_t i = 0; i < t * c; i++)
        if (o1[i] != out[t * c + i])
            fail_msg("%s: batch row 1 alone differs at %lld", what, (long long)i);
    /* heads 2 and 3 alone: their q, k, v columns packed as a 2-head qkv */
    const int64_t c2 = 2 * hs;
    float *q2 = fnew(b * t * 3 * c2), *o2 = fnew(b * t * c2), *a2 = fnew(b * 2 * t * t);
    for (int64_t r = 0; r < b * t; r++)
        for (int part = 0; part < 3; part++)
            for (int64_t e = 0; e < c2; e++)
                q2[r * 3 * c2 + part * c2 + e] = qkv[r * 3 * c + part * c + 2 * hs + e];
    ms_k_attn_dropout heads = whole;
    heads.h0 = 2;
    ms_k_attention_forward(o2, a2, work, q2, NULL, b, t, c2, 2, causal, &heads);
    for (int64_t r = 0; r < b * t; r++)
        for (int64_t e = 0; e < c2; e++)
            if (o2[r * c2 + e] != out[r * c + 2 * hs + e])
                fail_msg("%s: heads 2-3 alone differ at row %lld", what, (long long)r);
}

static void attention(void **state) {
    (void)state;
    seed_rng(15);
    check_attention(2, 7, 8, 2, true, false);
    check_attention(2, 7, 8, 2, false, false);
    check_attention(3, 5, 6, 2, false, true);
    check_attention(2, 6, 6, 3, true, true);
    /* T past one row block (64): the causal block skipping and block edges */
    check_attention(1, 70, 8, 2, true, false);
    check_attention(1, 70, 8, 2, false, false);
    check_attention_dropout(true);
    check_attention_dropout(false);
    arena_free();
}

/* ---- embedding ------------------------------------------------------------------------------ */

typedef struct emb_ctx {
    int64_t n, c, v0, vl;
    const int32_t *ids;
} emb_ctx;

static void ref_embedding(const void *vc, double *const *in, double *out) {
    const emb_ctx *x = vc;
    for (int64_t r = 0; r < x->n; r++)
        for (int64_t j = 0; j < x->c; j++) {
            const int64_t row = x->ids[r] - x->v0;
            out[r * x->c + j] = (row >= 0 && row < x->vl) ? in[0][row * x->c + j] : 0.0;
        }
}

static void embedding(void **state) {
    (void)state;
    seed_rng(16);
    const int64_t v = 10, c = 4, n = 9;
    const int32_t ids[9] = {3, 0, 9, 3, 5, 6, 4, 3, 7}; /* repeats must sum in backward */
    float *table = frand(v * c, -1, 1);
    double *w = todouble(frand(n * c, -1, 1), n * c);
    float *dout = fnew(n * c);
    for (int64_t i = 0; i < n * c; i++) dout[i] = (float)w[i];
    float *sum = fnew(n * c), *out = fnew(n * c);
    /* whole table, then three vocab shards whose partial results must sum to it */
    const int64_t starts[4] = {0, 0, 4, 7}, lens[4] = {10, 4, 3, 3};
    float *whole = NULL;
    for (int s = 0; s < 4; s++) {
        char what[96];
        snprintf(what, sizeof what, "embedding v0=%lld Vl=%lld", (long long)starts[s],
                 (long long)lens[s]);
        const float *tab = table + starts[s] * c;
        ms_k_embedding_forward(out, ids, tab, n, c, starts[s], lens[s]);
        emb_ctx ctx = {n, c, starts[s], lens[s], ids};
        double *in[1] = {todouble(tab, lens[s] * c)};
        expect_close(what, out, refout(ref_embedding, &ctx, in, n * c), n * c, 0, 0);
        if (s == 0)
            whole = fcopy(out, n * c);
        else
            for (int64_t i = 0; i < n * c; i++) sum[i] += out[i];
        float *dt0 = frand(lens[s] * c, -1, 1), *dt = fcopy(dt0, lens[s] * c);
        ms_k_embedding_backward(dt, ids, dout, n, c, starts[s], lens[s]);
        expect_grad(what, dt, dt0, numgrad(ref_embedding, &ctx, in, 0, lens[s] * c, n * c, w),
                    lens[s] * c, RTOL, ATOL);
    }
    expect_close("embedding shards sum", sum, todouble(whole, n * c), n * c, 0, 0);
    arena_free();
}

/* ---- cross-entropy -------------------------------------------------------------------------- */

typedef struct xent_ctx {
    int64_t n, v;
    const int32_t *targets;
} xent_ctx;

static void ref_xent(const void *vc, double *const *in, double *out) {
    const xent_ctx *x = vc;
    for (int64_t r = 0; r < x->n; r++) {
        const double *l = in[0] + r * x->v;
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < x->v; j++) mx = fmax(mx, l[j]);
        for (int64_t j = 0; j < x->v; j++) s += exp(l[j] - mx);
        out[r] = x->targets[r] < 0 ? 0.0 : mx + log(s) - l[x->targets[r]];
    }
}

static void xent(void **state) {
    (void)state;
    seed_rng(17);
    enum { N = 6, V = 37 };
    const int32_t targets[N] = {0, 36, 17, -1, 12, 25}; /* row 3 ignored; ends of V covered */
    float *logits = frand(N * V, -3, 3);
    /* Row 4: the last slice dominates by 100 (exp(l) alone would overflow, and the other
     * slices' local sums underflow relative to the global max), and its target lies outside it. */
    for (int64_t j = 25; j < V; j++) logits[4 * V + j] += 100.0f;
    xent_ctx ctx = {N, V, targets};
    double *in[1] = {todouble(logits, N * V)};
    double *want = refout(ref_xent, &ctx, in, N);
    double *w = todouble(frand(N, 0.1, 1), N);
    float *dl = fnew(N);
    for (int64_t i = 0; i < N; i++) dl[i] = (float)w[i];
    double *gwant = numgrad(ref_xent, &ctx, in, 0, N * V, N, w);

    /* plain */
    float *loss = fnew(N), *lse = fnew(N);
    ms_k_xent_forward(loss, lse, logits, targets, N, V);
    expect_close("xent loss", loss, want, N, RTOL, ATOL);
    float *d0 = frand(N * V, -1, 1), *d = fcopy(d0, N * V);
    ms_k_xent_backward(d, logits, lse, targets, dl, N, V);
    expect_grad("xent dlogits", d, d0, gwant, N * V, RTOL, ATOL);

    /* the one-rank composition of the vocab-parallel pieces */
    float *gmax = fnew(N), *gsum = fnew(N), *loss1 = fnew(N);
    ms_k_xent_vp_forward_local(loss1, gmax, gsum, logits, targets, N, V);
    expect_close("xent vp local loss", loss1, want, N, RTOL, ATOL);
    float *dvp = fcopy(d0, N * V);
    ms_k_xent_vp_backward(dvp, logits, gmax, gsum, targets, dl, N, V, 0);
    expect_grad("xent vp local dlogits", dvp, d0, gwant, N * V, RTOL, ATOL);

    /* V split into 2 and 3 slices, each rank's pieces combined by hand-written all-reduces */
    const int64_t split2[2] = {18, 19}, split3[3] = {12, 13, 12};
    const int64_t *splits[2] = {split2, split3};
    for (int si = 0; si < 2; si++) {
        const int np = si == 0 ? 2 : 3;
        const int64_t *sz = splits[si];
        float *part[3], *dpart[3];
        for (int p = 0; p < np; p++) part[p] = fnew(N * sz[p]), dpart[p] = fnew(N * sz[p]);
        ms_k_split(part, logits, sz, np, N, 1, false); /* each rank's [N, Vl] logits */
        float *lmax = fnew(N * np), *lsum = fnew(N * np), *ltgt = fnew(N * np);
        int64_t v0 = 0;
        for (int p = 0; p < np; p++) ms_k_xent_vp_rowmax(lmax + p * N, part[p], N, sz[p]);
        float *amax = fnew(N), *asum = fnew(N), *atgt = fnew(N);
        for (int64_t r = 0; r < N; r++) { /* all-reduce MAX */
            amax[r] = -INFINITY;
            for (int p = 0; p < np; p++) amax[r] = fmaxf(amax[r], lmax[p * N + r]);
        }
        for (int p = 0; p < np; p++) {
            ms_k_xent_vp_sumexp(lsum + p * N, part[p], amax, N, sz[p]);
            ms_k_xent_vp_target(ltgt + p * N, part[p], targets, N, sz[p], v0);
            v0 += sz[p];
        }
        for (int64_t r = 0; r < N; r++) /* all-reduce SUM, SUM */
            for (int p = 0; p < np; p++) asum[r] += lsum[p * N + r], atgt[r] += ltgt[p * N + r];
        float *lossp = fnew(N);
        ms_k_xent_vp_loss(lossp, amax, asum, atgt, targets, N);
        char what[96];
        snprintf(what, sizeof what, "xent vocab-parallel %d slices loss", np);
        expect_close(what, lossp, want, N, RTOL, ATOL);
        expect_close(what, lossp, todouble(loss, N), N, 1e-5, 1e-6);
        /* backward: each rank updates its slice of the gradient, no communication */
        ms_k_split(dpart, d0, sz, np, N, 1, false);
        v0 = 0;
        for (int p = 0; p < np; p++) {
            ms_k_xent_vp_backward(dpart[p], part[p], amax, asum, targets, dl, N, sz[p], v0);
            v0 += sz[p];
        }
        float *dfull = fnew(N * V);
        ms_k_concat(dfull, (const float *const *)dpart, sz, np, N, 1, false);
        snprintf(what, sizeof what, "xent vocab-parallel %d slices dlogits", np);
        expect_grad(what, dfull, d0, gwant, N * V, RTOL, ATOL);
        expect_close(what, dfull, todouble(d, N * V), N * V, 1e-5, 1e-6);
    }
    arena_free();
}

/* ---- reductions ----------------------------------------------------------------------------- */

typedef struct red_ctx {
    int ndim, dim;
    const int64_t *shape;
    bool mean;
} red_ctx;

/* Straight from the definition: walk every input element by its multi-index. */
static void ref_reduce(const void *vc, double *const *in, double *out) {
    const red_ctx *x = vc;
    int64_t n = 1, nout = 1;
    for (int d = 0; d < x->ndim; d++) n *= x->shape[d], nout *= d == x->dim ? 1 : x->shape[d];
    for (int64_t j = 0; j < nout; j++) out[j] = 0;
    for (int64_t lin = 0; lin < n; lin++) {
        int64_t rem = lin, oidx = 0, ostride = 1;
        for (int d = x->ndim - 1; d >= 0; d--) {
            const int64_t id = rem % x->shape[d];
            rem /= x->shape[d];
            if (d == x->dim) continue;
            oidx += id * ostride;
            ostride *= x->shape[d];
        }
        out[oidx] += in[0][lin] / (x->mean ? (double)x->shape[x->dim] : 1.0);
    }
}

static void reductions(void **state) {
    (void)state;
    seed_rng(18);
    const int64_t shape[3] = {3, 4, 5};
    const int64_t n = 60;
    float *x = frand(n, -1, 1);
    double *in[1] = {todouble(x, n)};
    for (int mean = 0; mean < 2; mean++)
        for (int dim = 0; dim < 3; dim++) {
            char what[96];
            snprintf(what, sizeof what, "%s over dim %d", mean ? "mean" : "sum", dim);
            int64_t o, d, i;
            ms_k_dim_split(3, shape, dim, &o, &d, &i);
            assert_int_equal(o * d * i, n);
            assert_int_equal(d, shape[dim]);
            const int64_t no = o * i;
            float *out = fnew(no);
            (mean ? ms_k_mean_forward : ms_k_sum_forward)(out, x, o, d, i);
            red_ctx ctx = {3, dim, shape, mean};
            expect_close(what, out, refout(ref_reduce, &ctx, in, no), no, 1e-6, 1e-6);
            double *w = todouble(frand(no, -1, 1), no);
            float *dout = fnew(no);
            for (int64_t j = 0; j < no; j++) dout[j] = (float)w[j];
            float *dx0 = frand(n, -1, 1), *dx = fcopy(dx0, n);
            (mean ? ms_k_mean_backward : ms_k_sum_backward)(dx, dout, o, d, i);
            expect_grad(what, dx, dx0, numgrad(ref_reduce, &ctx, in, 0, n, no, w), n, RTOL, ATOL);
        }
    arena_free();
}

/* ---- dropout -------------------------------------------------------------------------------- */

static void dropout(void **state) {
    (void)state;
    seed_rng(19);
    const float p = 0.3f;
    const uint64_t seed = 1234, stream = 77;
    const int64_t gs[3] = {6, 10, 5}, n = 300;
    float *x = frand(n, 0.5, 1.5); /* nonzero, so out == 0 means dropped */
    float *whole = fnew(n);
    ms_k_dropout_forward(whole, x, p, seed, stream, 3, gs, NULL, NULL, NULL);
    /* The definition: element g kept iff uniform(seed, stream, g) >= p, scaled by 1/(1-p). */
    int kept = 0;
    for (int64_t g = 0; g < n; g++) {
        const bool keep = ms_philox_uniform(seed, stream, (uint64_t)g) >= p;
        const float want = keep ? x[g] * (1.0f / (1.0f - p)) : 0.0f;
        if (whole[g] != want)
            fail_msg("dropout[%lld]: got %g, want %g", (long long)g, (double)whole[g],
                     (double)want);
        kept += keep;
    }
    assert_true(kept > 0 && kept < n);

    /* The same tensor as two boxes along each dim, on inputs cut from the same global x. */
    for (int dim = 0; dim < 3; dim++) {
        const int64_t cut = gs[dim] / 2 + 1;
        float *got = fnew(n);
        for (int half = 0; half < 2; half++) {
            int64_t ls[3] = {gs[0], gs[1], gs[2]}, st[3] = {0, 0, 0};
            ls[dim] = half == 0 ? cut : gs[dim] - cut;
            st[dim] = half == 0 ? 0 : cut;
            const int64_t nl = ls[0] * ls[1] * ls[2], zero[3] = {0, 0, 0};
            float *xl = fnew(nl), *yl = fnew(nl);
            ms_copy_box_f32(xl, ls, zero, x, gs, st, ls, 3);
            ms_k_dropout_forward(yl, xl, p, seed, stream, 3, ls, st, gs, NULL);
            ms_copy_box_f32(got, gs, st, yl, ls, zero, ls, 3);
            /* backward on the box: dinp += mask * dout * scale */
            float *dx0 = frand(nl, -1, 1), *dx = fcopy(dx0, nl), *dy = frand(nl, -1, 1);
            ms_k_dropout_backward(dx, dy, p, seed, stream, 3, ls, st, gs, NULL);
            for (int64_t j = 0; j < nl; j++) {
                const float inc = yl[j] != 0.0f ? dy[j] * (1.0f / (1.0f - p)) : 0.0f;
                if (fabsf(dx[j] - (dx0[j] + inc)) > 1e-6f)
                    fail_msg("dropout backward dim %d half %d [%lld]: got %g want %g", dim, half,
                             (long long)j, (double)(dx[j] - dx0[j]), (double)inc);
            }
        }
        char what[96];
        snprintf(what, sizeof what, "dropout boxes along dim %d", dim);
        expect_equal(what, got, whole, n);
    }

    /* Micro-batches: 2 data-parallel replicas of 3 rows each, split into 3 micro-batches of 1
     * row per replica. Micro-batch j's tensor is [2, 10, 5]: its row q is row (q / 1) * 3 + j of
     * the whole batch, and with the window its mask is that row's. */
    for (int64_t j = 0; j < 3; j++) {
        const ms_k_batch_window w = {.rows = 1, .stride = 3, .offset = j};
        const int64_t ms[3] = {2, gs[1], gs[2]}, row = gs[1] * gs[2];
        float *xm = fnew(2 * row), *ym = fnew(2 * row);
        for (int64_t q = 0; q < 2; q++) {
            assert_int_equal(ms_k_batch_row(&w, q), q * 3 + j);
            memcpy(xm + q * row, x + (q * 3 + j) * row, sizeof(float) * (size_t)row);
        }
        ms_k_dropout_forward(ym, xm, p, seed, stream, 3, ms, NULL, ms, &w);
        for (int64_t q = 0; q < 2; q++) {
            char what[96];
            snprintf(what, sizeof what, "dropout micro-batch %lld row %lld", (long long)j,
                     (long long)q);
            expect_equal(what, ym + q * row, whole + (q * 3 + j) * row, row);
        }
    }

    /* Keep fraction within 4 sigma of 1 - p on a large tensor. */
    const int64_t big = 200000, gshape1[1] = {big};
    float *ones = fnew(big), *y = fnew(big);
    for (int64_t i = 0; i < big; i++) ones[i] = 1.0f;
    ms_k_dropout_forward(y, ones, p, 99, 5, 1, gshape1, NULL, NULL, NULL);
    int64_t nk = 0;
    for (int64_t i = 0; i < big; i++) {
        if (y[i] != 0.0f) {
            nk++;
            assert_float_equal(y[i], 1.0f / (1.0f - p), 1e-6);
        }
    }
    const double frac = (double)nk / (double)big, sigma = sqrt(p * (1 - p) / (double)big);
    if (fabs(frac - (1 - p)) > 4 * sigma)
        fail_msg("dropout keep fraction %.5f, want %.5f +- %.5f", frac, 1 - p, 4 * sigma);
    /* p = 0 keeps everything unscaled; p = 1 drops everything. */
    ms_k_dropout_forward(y, ones, 0.0f, 99, 5, 1, gshape1, NULL, NULL, NULL);
    for (int64_t i = 0; i < big; i++) assert_true(y[i] == 1.0f);
    ms_k_dropout_forward(y, ones, 1.0f, 99, 5, 1, gshape1, NULL, NULL, NULL);
    for (int64_t i = 0; i < big; i++) assert_true(y[i] == 0.0f);
    arena_free();
}

/* ---- shape copies --------------------------------------------------------------------------- */

/* Reference transpose by unravelling each input index and swapping two of its coordinates. */
static void ref_transpose(float *out, const float *inp, int ndim, const int64_t *shape, int a,
                          int b) {
    int64_t oshape[8], n = 1;
    for (int d = 0; d < ndim; d++) oshape[d] = shape[d], n *= shape[d];
    oshape[a] = shape[b], oshape[b] = shape[a];
    for (int64_t lin = 0; lin < n; lin++) {
        int64_t idx[8], rem = lin;
        for (int d = ndim - 1; d >= 0; d--) idx[d] = rem % shape[d], rem /= shape[d];
        const int64_t t = idx[a];
        idx[a] = idx[b], idx[b] = t;
        int64_t o = 0;
        for (int d = 0; d < ndim; d++) o = o * oshape[d] + idx[d];
        out[o] = inp[lin];
    }
}

static void check_transpose(int ndim, const int64_t *shape, int a, int b) {
    char what[96];
    snprintf(what, sizeof what, "transpose ndim=%d (%d,%d)", ndim, a, b);
    int64_t n = 1, tshape[8];
    for (int d = 0; d < ndim; d++) n *= shape[d], tshape[d] = shape[d];
    tshape[a] = shape[b], tshape[b] = shape[a];
    float *x = frand(n, -1, 1), *got = fnew(n), *want = fnew(n), *back = fnew(n);
    ms_k_transpose(got, x, ndim, shape, a, b, false);
    ref_transpose(want, x, ndim, shape, a, b);
    expect_equal(what, got, want, n);
    /* its own inverse, and accumulate adds */
    ms_k_transpose(back, got, ndim, tshape, b, a, false);
    expect_equal(what, back, x, n);
    float *acc = frand(n, -1, 1), *acc0 = fcopy(acc, n);
    ms_k_transpose(acc, x, ndim, shape, a, b, true);
    for (int64_t i = 0; i < n; i++) want[i] += acc0[i];
    expect_equal(what, acc, want, n);
}

static void transpose(void **state) {
    (void)state;
    seed_rng(20);
    const int64_t s4[4] = {2, 3, 4, 5};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) check_transpose(4, s4, a, b);
    const int64_t s2[2] = {37, 45}, s3[3] = {2, 40, 33}; /* partial 32-tiles */
    const int64_t s5[3] = {3, 5, 2};                     /* inner runs of 2 */
    check_transpose(2, s2, 0, 1);
    check_transpose(3, s3, 1, 2);
    check_transpose(3, s3, 0, 2);
    check_transpose(3, s5, 0, 1);
    arena_free();
}

static void split_concat(void **state) {
    (void)state;
    seed_rng(21);
    const int64_t shape[3] = {3, 7, 4}, n = 84;
    const int64_t sizes[3] = {2, 0, 5}; /* an empty part too */
    float *x = frand(n, -1, 1);
    for (int dim = 0; dim < 3; dim++) {
        int64_t o, d, i;
        ms_k_dim_split(3, shape, dim, &o, &d, &i);
        const int64_t sz[3] = {d / 3, d - d / 3 - (d > 4 ? 2 : 0), d > 4 ? 2 : 0};
        const int64_t *use = dim == 1 ? sizes : sz;
        float *parts[3];
        for (int p = 0; p < 3; p++) parts[p] = fnew(o * use[p] * i);
        ms_k_split(parts, x, use, 3, o, i, false);
        /* each part against direct indexing */
        int64_t start = 0;
        for (int p = 0; p < 3; p++) {
            for (int64_t a = 0; a < o; a++)
                for (int64_t r = 0; r < use[p]; r++)
                    for (int64_t j = 0; j < i; j++)
                        if (parts[p][(a * use[p] + r) * i + j] != x[(a * d + start + r) * i + j])
                            fail_msg("split dim %d part %d (%lld,%lld,%lld)", dim, p, (long long)a,
                                     (long long)r, (long long)j);
            start += use[p];
        }
        assert_int_equal(start, d);
        float *y = fnew(n);
        ms_k_concat(y, (const float *const *)parts, use, 3, o, i, false);
        expect_equal("concat(split(x))", y, x, n);
        /* accumulate: concat adds into out, split adds into the parts */
        ms_k_concat(y, (const float *const *)parts, use, 3, o, i, true);
        for (int64_t k = 0; k < n; k++) assert_true(y[k] == 2 * x[k]);
        ms_k_split(parts, x, use, 3, o, i, true);
        ms_k_concat(y, (const float *const *)parts, use, 3, o, i, false);
        for (int64_t k = 0; k < n; k++) assert_true(y[k] == 2 * x[k]);
    }
    arena_free();
}

/* ---- cost accounting ------------------------------------------------------------------------ */

static void costs(void **state) {
    (void)state;
    ms_k_gemm g = {.batch = 4, .m = 8, .n = 16, .k = 32, .bcast_b = true};
    ms_k_cost f = ms_k_matmul_cost(&g, false, false, true, true);
    assert_true(f.flops == 2.0 * 4 * 8 * 16 * 32);
    assert_true(f.bytes == 4.0 * (4 * 8 * 32 + 32 * 16 + 4 * 8 * 16));
    ms_k_cost bw = ms_k_matmul_cost(&g, true, false, true, true);
    assert_true(bw.flops == 2 * f.flops);
    assert_true(ms_k_matmul_cost(&g, true, false, false, true).flops == f.flops);
    /* causal attention does about half the pair work of bidirectional */
    ms_k_cost ac = ms_k_attention_cost(2, 128, 64, 4, true, false);
    ms_k_cost ab = ms_k_attention_cost(2, 128, 64, 4, false, false);
    assert_true(ac.flops < 0.55 * ab.flops && ac.flops > 0.45 * ab.flops);
    assert_true(ab.flops >= 4.0 * 2 * 128 * 128 * 64); /* QK^T and PV */
    /* everything else: positive and backward at least as much as forward */
    for (int op = 0; op < MS_K_ELT_COUNT; op++) {
        ms_k_cost a = ms_k_elementwise_cost((ms_k_elt)op, 100, 10, false);
        ms_k_cost b = ms_k_elementwise_cost((ms_k_elt)op, 100, 10, true);
        assert_true(a.flops > 0 && a.bytes > 0 && b.flops >= a.flops && b.bytes >= a.bytes);
    }
    ms_k_cost fam[][2] = {
        {ms_k_layernorm_cost(8, 64, false), ms_k_layernorm_cost(8, 64, true)},
        {ms_k_softmax_cost(8, 64, false), ms_k_softmax_cost(8, 64, true)},
        {ms_k_xent_cost(8, 1000, false), ms_k_xent_cost(8, 1000, true)},
        {ms_k_reduce_cost(2, 3, 4, true, false), ms_k_reduce_cost(2, 3, 4, true, true)},
        {ms_k_dropout_cost(100, false), ms_k_dropout_cost(100, true)},
        {ms_k_attention_cost(1, 16, 8, 2, true, false),
         ms_k_attention_cost(1, 16, 8, 2, true, true)},
    };
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++)
        assert_true(fam[k][0].flops > 0 && fam[k][0].bytes > 0 &&
                    fam[k][1].flops >= fam[k][0].flops && fam[k][1].bytes >= fam[k][0].bytes);
    assert_true(ms_k_embedding_cost(8, 64, false).bytes > 0);
    assert_true(ms_k_copy_cost(100, false).flops == 0 && ms_k_copy_cost(100, false).bytes == 800);
}

#ifndef NDEBUG
/* Runs ms_k_xent_forward (backward when `bw`) on one row of V = 4 logits with `target` in a
 * child process; returns its wait status and its stderr in msg[cap]. */
static int xent_in_child(int32_t target, bool bw, char *msg, size_t cap) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        float logits[4] = {1, 2, 3, 4}, loss, lse = 0, d[4] = {0}, dl = 1;
        if (bw)
            ms_k_xent_backward(d, logits, &lse, &target, &dl, 1, 4);
        else
            ms_k_xent_forward(&loss, &lse, logits, &target, 1, 4);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    for (ssize_t got; n + 1 < cap && (got = read(fds[0], msg + n, cap - 1 - n)) > 0;)
        n += (size_t)got;
    msg[n] = '\0';
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}
#endif

/* Debug builds stop a cross-entropy whose target is past the vocabulary (it would read
 * logits[target] and write dlogits[target] beyond the row) with a message naming the row. */
static void hardening_xent_target_guard(void **state) {
    (void)state;
#ifdef NDEBUG
    skip(); /* the check is compiled out of release builds; the debug build runs it */
#else
    char msg[1024];
    for (int bw = 0; bw < 2; bw++) {
        int status = xent_in_child(4, bw, msg, sizeof msg);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
            fail_msg("target 4 of V 4 (%s): the child was not stopped (status 0x%x): %s",
                     bw ? "backward" : "forward", status, msg);
        assert_non_null(
            strstr(msg, "cross-entropy row 0: target 4 is outside the vocabulary of 4"));
        /* In range, or ignored (negative): runs through. */
        status = xent_in_child(3, bw, msg, sizeof msg);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        status = xent_in_child(-1, bw, msg, sizeof msg);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
#endif
}

#define KT(f) cmocka_unit_test_setup_teardown(f, arena_setup, arena_teardown)
static const struct CMUnitTest tests[] = {
    cmocka_unit_test(hardening_xent_target_guard),
    KT(matmul_all_cases),
    KT(matmul_concurrent_callers),
    KT(elementwise_ops),
    KT(layernorm),
    KT(softmax),
    KT(attention),
    KT(embedding),
    KT(xent),
    KT(reductions),
    KT(dropout),
    KT(transpose),
    KT(split_concat),
    KT(costs),
};
MT_MAIN("kernels", tests)

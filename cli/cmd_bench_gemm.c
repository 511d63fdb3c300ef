/* cmd_bench_gemm.c - `meshscope bench gemm`: cblas_sgemm GFLOP/s at one shape, measured through
 * the engine's own matmul kernel (ms_k_matmul_forward, and with --backward the two sgemms of
 * ms_k_matmul_backward), so the numbers are what a linear layer of that shape can reach here.
 *
 * Each pass: one warm-up call, an iteration count sized so a repetition takes ~50 ms (or
 * --iters), then --reps repetitions; the reported time per call is the median repetition.
 * bench/train_vs_torch.sh uses it at a model's GEMM shapes. See bench/README.md.
 */
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "engine/core/xalloc.h"
#include "engine/kernels/kernels.h"

#include "cli/options.h"

#define REP_TARGET_S 0.05      /* aim for ~50 ms per repetition */
#define MAX_ITERS    100000000 /* cap on calls per repetition */

typedef struct gemm_opts {
    int64_t m, n, k;
    bool ta, tb, backward, json;
    int threads; /* OpenBLAS threads */
    int iters;   /* 0: sized per pass */
    int reps;
} gemm_opts;

/* Parses argv (argv[0] is "gemm"). Returns MS_OPTS_PROCEED, or the exit code after the help
 * or an error. */
static int parse_opts(int argc, char **argv, gemm_opts *o) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (gemm_opts){.threads = cores > 0 ? (int)cores : 1, .reps = 5};
    int m = 0, n = 0, k = 0; /* 0: not given */
    const ms_option opts[] = {
        MS_INT("m", "M", &m, 1, INT_MAX, "rows of C and of op(A) (required)"),
        MS_INT("n", "N", &n, 1, INT_MAX, "columns of C and of op(B) (required)"),
        MS_INT("k", "K", &k, 1, INT_MAX, "the inner dimension (required)"),
        MS_FLAG("ta", &o->ta, "A is stored transposed, [k, m] (default [m, k])"),
        MS_FLAG("tb", &o->tb, "B is stored transposed, [n, k] (a tied logits layer: B = [V, C])"),
        MS_FLAG("backward", &o->backward,
                "also time the backward's dA and dB sgemms (accumulating, as the linear op)"),
        MS_INT("threads", "T", &o->threads, 1, 1024,
               "OpenBLAS threads (default: the online cores)"),
        MS_INT("iters", "I", &o->iters, 1, MAX_ITERS, "calls per repetition (default: ~50 ms)"),
        MS_INT("reps", "R", &o->reps, 1, 1000, "repetitions, median reported (default 5)"),
        MS_FLAG("json", &o->json, "print JSON instead of a table"),
    };
    const ms_opts_cmd cmd = {
        .name = "bench gemm",
        .synopsis = "--m M --n N --k K [options]",
        .about = "GFLOP/s of cblas_sgemm at one shape, called through the engine's matmul "
                 "kernel:\nC[m, n] = op(A) op(B) with op(A) m x k and op(B) k x n, row-major "
                 "float32.",
        MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, NULL, 0, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    if (!m || !n || !k) {
        fprintf(stderr, "meshscope bench gemm: --m, --n and --k are required (missing:%s%s%s)\n",
                m ? "" : " --m", n ? "" : " --n", k ? "" : " --k");
        return 2;
    }
    o->m = m, o->n = n, o->k = k;
    /* Buffers: A, B, C, and with --backward dA, dB, dC of the same sizes. */
    double floats = (double)o->m * o->k + (double)o->k * o->n + (double)o->m * o->n;
    double bytes = 4.0 * floats * (o->backward ? 2 : 1);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double limit = pages > 0 && psz > 0 ? 0.75 * (double)pages * (double)psz : 64e9;
    if (bytes > limit || bytes > (double)SIZE_MAX / 2) {
        fprintf(stderr,
                "meshscope bench gemm: the buffers for m=%lld n=%lld k=%lld need %.2f GB, over "
                "75%% of physical memory (%.2f GB)\n",
                (long long)o->m, (long long)o->n, (long long)o->k, bytes / 1e9, limit / 1e9);
        return 2;
    }
    return MS_OPTS_PROCEED;
}

/* --- timing ---------------------------------------------------------------------------------- */

typedef enum pass { PASS_FWD, PASS_DA, PASS_DB, PASS_COUNT } pass;

static const char *const pass_names[PASS_COUNT] = {"forward", "dA", "dB"};

typedef struct bufs {
    ms_k_gemm g;
    float *a, *b, *c, *da, *db, *dc;
} bufs;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void call(const bufs *x, pass p) {
    if (p == PASS_FWD)
        ms_k_matmul_forward(&x->g, x->c, x->a, x->b, 1.0f, 0.0f);
    else if (p == PASS_DA)
        ms_k_matmul_backward(&x->g, x->da, NULL, x->dc, x->a, x->b, 1.0f, true);
    else
        ms_k_matmul_backward(&x->g, NULL, x->db, x->dc, x->a, x->b, 1.0f, true);
}

static double time_calls(const bufs *x, pass p, int iters) {
    double t0 = now_s();
    for (int i = 0; i < iters; i++) call(x, p);
    return now_s() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct result {
    int iters;
    double median_s, min_s; /* per call */
} result;

static result measure(const bufs *x, pass p, const gemm_opts *o) {
    result r = {.iters = o->iters};
    call(x, p); /* warm-up: OpenBLAS's buffers and the threads' first run */
    if (!r.iters) {
        double t1 = time_calls(x, p, 1);
        double want = t1 > 0 ? REP_TARGET_S / t1 : MAX_ITERS;
        r.iters = want < 1 ? 1 : want > MAX_ITERS ? MAX_ITERS : (int)ceil(want);
    }
    double *t = xmalloc(sizeof *t * (size_t)o->reps);
    for (int i = 0; i < o->reps; i++) t[i] = time_calls(x, p, r.iters) / r.iters;
    qsort(t, (size_t)o->reps, sizeof *t, cmp_double);
    r.min_s = t[0];
    r.median_s = o->reps % 2 ? t[o->reps / 2] : 0.5 * (t[o->reps / 2 - 1] + t[o->reps / 2]);
    free(t);
    return r;
}

/* Deterministic values in [-1, 1): no denormals, no NaNs. */
static float *filled(size_t n, uint64_t seed) {
    float *p = xmalloc(sizeof *p * (n ? n : 1));
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (float)((double)(s >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
    }
    return p;
}

/* The product each pass computes, in terms of the stored operands. */
static const char *product(pass p, bool ta, bool tb) {
    if (p == PASS_FWD)
        return ta ? (tb ? "C = A^T B^T" : "C = A^T B") : (tb ? "C = A B^T" : "C = A B");
    if (p == PASS_DA)
        return ta ? (tb ? "dA = B^T dC^T" : "dA = B dC^T") : (tb ? "dA = dC B" : "dA = dC B^T");
    return tb ? (ta ? "dB = dC^T A^T" : "dB = dC^T A") : (ta ? "dB = A dC" : "dB = A^T dC");
}

int ms_cmd_bench_gemm(int argc, char **argv) {
    gemm_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != MS_OPTS_PROCEED) return rc;
    ms_k_blas_set_threads(o.threads);
    const size_t na = (size_t)(o.m * o.k), nb = (size_t)(o.k * o.n), nc = (size_t)(o.m * o.n);
    bufs x = {.g = {.batch = 1,
                    .m = o.m,
                    .n = o.n,
                    .k = o.k,
                    .trans_a = o.ta,
                    .trans_b = o.tb,
                    .bcast_b = true}};
    x.a = filled(na, 1), x.b = filled(nb, 2);
    x.c = xcalloc(nc, sizeof *x.c);
    if (o.backward) {
        x.dc = filled(nc, 3);
        x.da = xcalloc(na, sizeof *x.da), x.db = xcalloc(nb, sizeof *x.db);
    }
    const int npass = o.backward ? PASS_COUNT : 1;
    result r[PASS_COUNT];
    for (int p = 0; p < npass; p++) r[p] = measure(&x, (pass)p, &o);
    const double gflop = ms_k_matmul_cost(&x.g, false, false, false, false).flops / 1e9;
    const int threads = ms_k_blas_threads();
    double load = 0;
    bool busy = getloadavg(&load, 1) == 1 && load > 0.5;

    if (o.json) {
        printf("{\"bench\": \"gemm\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"ta\": %s, "
               "\"tb\": %s, \"threads\": %d, \"reps\": %d, \"gflop_per_call\": %.6f, "
               "\"results\": [",
               (long long)o.m, (long long)o.n, (long long)o.k, o.ta ? "true" : "false",
               o.tb ? "true" : "false", threads, o.reps, gflop);
        for (int p = 0; p < npass; p++)
            printf("%s{\"pass\": \"%s\", \"product\": \"%s\", \"iters\": %d, \"median_ms\": %.6f, "
                   "\"min_ms\": %.6f, \"gflops\": %.3f, \"best_gflops\": %.3f}",
                   p ? ", " : "", pass_names[p], product((pass)p, o.ta, o.tb), r[p].iters,
                   r[p].median_s * 1e3, r[p].min_s * 1e3, gflop / r[p].median_s,
                   gflop / r[p].min_s);
        printf("], \"load_avg_1m\": %.2f}\n", load);
    } else {
        printf("sgemm through ms_k_matmul_%s: m=%lld n=%lld k=%lld, A [%s] B [%s], "
               "%d OpenBLAS thread%s, median of %d repetitions\n",
               o.backward ? "forward/backward" : "forward", (long long)o.m, (long long)o.n,
               (long long)o.k, o.ta ? "k,m" : "m,k", o.tb ? "n,k" : "k,n", threads,
               threads == 1 ? "" : "s", o.reps);
        printf("%-8s  %-14s  %9s  %11s  %11s  %9s  %9s\n", "pass", "product", "iters", "median ms",
               "min ms", "GFLOP/s", "best");
        for (int p = 0; p < npass; p++)
            printf("%-8s  %-14s  %9d  %11.4f  %11.4f  %9.2f  %9.2f\n", pass_names[p],
                   product((pass)p, o.ta, o.tb), r[p].iters, r[p].median_s * 1e3, r[p].min_s * 1e3,
                   gflop / r[p].median_s, gflop / r[p].min_s);
        printf("(%.4f GFLOP per call, 2*m*n*k%s)\n", gflop,
               o.backward ? "; dA and dB accumulate (beta = 1), as the linear op does" : "");
        if (busy)
            printf("note: the 1-minute load average was %.2f; other work on the machine skews "
                   "these numbers\n",
                   load);
    }
    free(x.a), free(x.b), free(x.c), free(x.da), free(x.db), free(x.dc);
    return 0;
}

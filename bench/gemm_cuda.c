/* gemm_cuda.c - the GEMM rate through meshscope's CUDA kernel table against cuBLAS called
 * directly, side by side in one run, at one shape.
 *
 *   bench_gemm_cuda [--m M] [--n N] [--k K] [--dtype bf16|fp32] [--reps R]
 *
 * meshscope: the matmul slot of the CUDA table (matmul_forward_bf16 for bf16, matmul_forward
 * for fp32), on the rank's device and kernel context, as the program calls it for a linear
 * layer (C [m, n] = A [m, k] B[n, k]^T, row-major). cuBLAS: cublasGemmEx with the same
 * operands, types and fp32 compute on a handle of its own. Each side: 3 warm-up calls, then
 * R repetitions of enough calls to take ~100 ms, timed on the host around a device
 * synchronisation; the median repetition. Prints both rates in TFLOP/s and their ratio.
 * Exits 77 with the reason when no GPU is usable (this is a benchmark, not a test).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/core/device.h"
#include "engine/kernels/backend.h"

typedef struct bench_opts {
    int64_t m, n, k;
    bool bf16;
    int reps;
} bench_opts;

static int usage(const char *why) {
    fprintf(stderr,
            "bench_gemm_cuda: %s\nusage: bench_gemm_cuda [--m M] [--n N] [--k K] "
            "[--dtype bf16|fp32] [--reps R]\n",
            why);
    return 2;
}

static int parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.m = 4096, .n = 4096, .k = 4096, .bf16 = true, .reps = 5};
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return usage("every option takes a value");
        const char *v = argv[++i];
        long long x = atoll(v);
        if (!strcmp(argv[i - 1], "--dtype")) {
            if (strcmp(v, "bf16") && strcmp(v, "fp32")) return usage("--dtype is bf16 or fp32");
            o->bf16 = !strcmp(v, "bf16");
            continue;
        }
        if (x <= 0 || x > 1 << 16) return usage("sizes and --reps are 1 to 65536");
        if (!strcmp(argv[i - 1], "--m"))
            o->m = x;
        else if (!strcmp(argv[i - 1], "--n"))
            o->n = x;
        else if (!strcmp(argv[i - 1], "--k"))
            o->k = x;
        else if (!strcmp(argv[i - 1], "--reps"))
            o->reps = (int)x;
        else
            return usage("unknown option");
    }
    return 0;
}

/* One side of the comparison: runs `calls` products and waits for them. */
typedef struct side {
    const char *name;
    int (*run)(void *ctx, int calls);
    void *ctx;
} side;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds per call over reps repetitions of ~100 ms; < 0 on failure. */
static double time_side(const side *s, int reps) {
    if (s->run(s->ctx, 3)) return -1;
    int calls = 1;
    for (;;) {
        int64_t t0 = ms_now_ns();
        if (s->run(s->ctx, calls)) return -1;
        double dt = (double)(ms_now_ns() - t0) * 1e-9;
        if (dt > 0.1 || calls >= 1 << 20) break;
        calls *= 2;
    }
    double per[64];
    reps = reps > 64 ? 64 : reps;
    for (int r = 0; r < reps; r++) {
        int64_t t0 = ms_now_ns();
        if (s->run(s->ctx, calls)) return -1;
        per[r] = (double)(ms_now_ns() - t0) * 1e-9 / calls;
    }
    qsort(per, (size_t)reps, sizeof *per, cmp_double);
    return per[reps / 2];
}

typedef struct gemm_ctx {
    bench_opts o;
    void *a, *b, *c;
    ms_kctx *kc;
    cublasHandle_t blas;
} gemm_ctx;

static int run_table(void *p, int calls) {
    gemm_ctx *x = p;
    ms_k_gemm g = {
        .batch = 1, .m = x->o.m, .n = x->o.n, .k = x->o.k, .trans_b = true, .bcast_b = true};
    ms_error err = {0};
    for (int i = 0; i < calls; i++) {
        ms_status st =
            x->o.bf16
                ? MS_CALL_K(x->kc, matmul_forward_bf16, &g, x->c, x->a, x->b, 1.0f, 0.0f, &err)
                : MS_CALL_K(x->kc, matmul_forward, &g, x->c, x->a, x->b, 1.0f, 0.0f, &err);
        if (st != MS_OK) return fprintf(stderr, "meshscope: %s\n", err.msg), 1;
    }
    if (ms_kctx_sync(x->kc, &err) != MS_OK) return fprintf(stderr, "meshscope: %s\n", err.msg), 1;
    return 0;
}

/* Row-major C = A B^T is column-major C^T = B A^T: B transposed first, then A. */
static int run_cublas(void *p, int calls) {
    gemm_ctx *x = p;
    const float one = 1, zero = 0;
    cudaDataType_t t = x->o.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    int m = (int)x->o.m, n = (int)x->o.n, k = (int)x->o.k;
    for (int i = 0; i < calls; i++) {
        cublasStatus_t s =
            cublasGemmEx(x->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, x->b, t, k, x->a, t, k,
                         &zero, x->c, t, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            return fprintf(stderr, "cublas: %s\n", cublasGetStatusString(s)), 1;
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return fprintf(stderr, "cuda: %s\n", cudaGetErrorString(e)), 1;
    return 0;
}

int main(int argc, char **argv) {
    gemm_ctx x = {0};
    int rc = parse(argc, argv, &x.o);
    if (rc) return rc;
    ms_error err = {0};
    ms_device *dev = NULL;
    if (ms_device_cuda_create(0, &dev, &err) != MS_OK) {
        printf("bench_gemm_cuda: skipped: %s\n", err.msg);
        return 77;
    }
    size_t es = x.o.bf16 ? 2 : 4;
    size_t na = (size_t)(x.o.m * x.o.k) * es, nb = (size_t)(x.o.n * x.o.k) * es;
    size_t nc = (size_t)(x.o.m * x.o.n) * es;
    if (ms_device_alloc(dev, na, &x.a, &err) || ms_device_alloc(dev, nb, &x.b, &err) ||
        ms_device_alloc(dev, nc, &x.c, &err) || ms_device_zero(dev, x.a, na, &err) ||
        ms_device_zero(dev, x.b, nb, &err) || ms_kctx_create(dev, &x.kc, &err)) {
        fprintf(stderr, "bench_gemm_cuda: %s\n", err.msg);
        return 1;
    }
    if (cublasCreate(&x.blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_gemm_cuda: cannot create a cuBLAS handle\n");
        return 1;
    }
    side sides[2] = {{"meshscope (kernel table)", run_table, &x},
                     {"cuBLAS (cublasGemmEx)", run_cublas, &x}};
    double sec[2], flops = 2.0 * (double)x.o.m * (double)x.o.n * (double)x.o.k;
    printf("GEMM %lld x %lld x %lld, %s operands, fp32 accumulation, median of %d\n",
           (long long)x.o.m, (long long)x.o.n, (long long)x.o.k, x.o.bf16 ? "bf16" : "fp32",
           x.o.reps);
    for (int s = 0; s < 2; s++) {
        sec[s] = time_side(&sides[s], x.o.reps);
        if (sec[s] <= 0) return 1;
        printf("  %-26s %8.3f ms  %7.1f TFLOP/s\n", sides[s].name, sec[s] * 1e3,
               flops / sec[s] * 1e-12);
    }
    printf("  meshscope / cuBLAS: %.3f\n", sec[1] / sec[0]);
    cublasDestroy(x.blas);
    ms_kctx_destroy(x.kc);
    ms_device_free(dev, x.a, na), ms_device_free(dev, x.b, nb), ms_device_free(dev, x.c, nc);
    ms_device_destroy(dev);
    return 0;
}

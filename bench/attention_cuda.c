/* attention_cuda.c - bf16 causal attention, forward and backward, through meshscope's CUDA
 * kernel table: the tensor-core flash kernels against the row kernels they replace, side by
 * side in one run, at one shape (bench/attention_cuda.sh adds PyTorch's
 * scaled_dot_product_attention at the same shape).
 *
 *   bench_attention_cuda [--b B] [--t T] [--c C] [--nh NH] [--reps R]
 *
 * Defaults: GPT-2 124M's attention at batch 8 (B 8, T 1024, C 768, 12 heads). One call is
 * attention_forward_bf16 then attention_backward_bf16 on the rank's kernel context, as the
 * program calls them (the gradient written whole, as a training step's first writer of dqkv
 * does); each side has a kernel context of its own, made with the attention path it times
 * (ms_kctx_opts.attention: the flash kernels, or the row kernels). Each side: 3
 * warm-up calls, then R repetitions of enough calls to take ~100 ms, timed on the host
 * around a device synchronisation; the median repetition. FLOPs: the causal half of
 * 4 B NH T^2 HS forward and 2.5 times that backward (FlashAttention's convention).
 * Exits 77 with the reason when no GPU is usable (this is a benchmark, not a test).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/kernels/backend.h"

typedef struct bench_opts {
    int64_t b, t, c, nh;
    int reps;
} bench_opts;

static int usage(const char *why) {
    fprintf(stderr,
            "bench_attention_cuda: %s\nusage: bench_attention_cuda [--b B] [--t T] [--c C] "
            "[--nh NH] [--reps R]\n",
            why);
    return 2;
}

static int parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.b = 8, .t = 1024, .c = 768, .nh = 12, .reps = 5};
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return usage("every option takes a value");
        const long long x = atoll(argv[++i]);
        if (x <= 0 || x > 1 << 16) return usage("sizes and --reps are 1 to 65536");
        if (!strcmp(argv[i - 1], "--b"))
            o->b = x;
        else if (!strcmp(argv[i - 1], "--t"))
            o->t = x;
        else if (!strcmp(argv[i - 1], "--c"))
            o->c = x;
        else if (!strcmp(argv[i - 1], "--nh"))
            o->nh = x;
        else if (!strcmp(argv[i - 1], "--reps"))
            o->reps = (int)x;
        else
            return usage("unknown option");
    }
    if (o->c % o->nh) return usage("--c must be a multiple of --nh");
    return 0;
}

/* The two sides: the flash kernels, then the row kernels they replace. */
static const ms_kattention sides[2] = {MS_KATTENTION_FASTEST, MS_KATTENTION_ROWS};

typedef struct attn_ctx {
    bench_opts o;
    uint16_t *qkv, *out, *dout, *dqkv;
    float *saved, *scratch;
    ms_kctx *kc[2]; /* one per side */
} attn_ctx;

/* `calls` forward + backward pairs on kc, then a wait for the device; 0 on success. */
static int run(attn_ctx *x, ms_kctx *kc, int calls) {
    const bench_opts *o = &x->o;
    ms_error err = {0};
    for (int i = 0; i < calls; i++) {
        if (MS_CALL_K(kc, attention_forward_bf16, x->out, x->saved, NULL, x->qkv, NULL, o->b, o->t,
                      o->c, o->nh, true, NULL, &err) != MS_OK ||
            MS_CALL_K(kc, attention_backward_bf16, x->dqkv, x->scratch, x->dout, x->qkv, x->saved,
                      NULL, o->b, o->t, o->c, o->nh, true, 1u, NULL, &err) != MS_OK)
            return fprintf(stderr, "meshscope: %s\n", err.msg), 1;
    }
    if (ms_kctx_sync(kc, &err) != MS_OK) return fprintf(stderr, "meshscope: %s\n", err.msg), 1;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double p = *(const double *)a, q = *(const double *)b;
    return (p > q) - (p < q);
}

/* Median seconds per call on kc over reps repetitions of ~100 ms; < 0 on failure. */
static double time_calls(attn_ctx *x, ms_kctx *kc) {
    if (run(x, kc, 3)) return -1;
    int calls = 1;
    for (;;) {
        int64_t t0 = ms_now_ns();
        if (run(x, kc, calls)) return -1;
        if ((double)(ms_now_ns() - t0) * 1e-9 > 0.1 || calls >= 1 << 16) break;
        calls *= 2;
    }
    double per[64];
    const int reps = x->o.reps > 64 ? 64 : x->o.reps;
    for (int r = 0; r < reps; r++) {
        int64_t t0 = ms_now_ns();
        if (run(x, kc, calls)) return -1;
        per[r] = (double)(ms_now_ns() - t0) * 1e-9 / calls;
    }
    qsort(per, (size_t)reps, sizeof *per, cmp_double);
    return per[reps / 2];
}

/* bf16 values in [-1, 1) from a fixed sequence (so both sides see the same data). */
static int fill(ms_device *dev, uint16_t *d, int64_t n, uint32_t seed, ms_error *err) {
    uint16_t *h = malloc(sizeof *h * (size_t)n);
    if (!h) return 1;
    uint32_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = ms_bf16_from_f32((float)(s >> 8) / (float)(1u << 23) - 1.0f);
    }
    const int rc = ms_device_copy(dev, d, h, sizeof *h * (size_t)n, MS_COPY_HOST_TO_DEVICE, err);
    free(h);
    return rc;
}

int main(int argc, char **argv) {
    attn_ctx x = {0};
    int rc = parse(argc, argv, &x.o);
    if (rc) return rc;
    const bench_opts *o = &x.o;
    ms_error err = {0};
    ms_device *dev = NULL;
    if (ms_device_cuda_create(0, &dev, &err) != MS_OK) {
        printf("bench_attention_cuda: skipped: %s\n", err.msg);
        return 77;
    }
    for (int s = 0; s < 2; s++)
        if (ms_kctx_create_with(dev, &(ms_kctx_opts){.attention = sides[s]}, &x.kc[s], &err) !=
            MS_OK) {
            fprintf(stderr, "bench_attention_cuda: %s\n", err.msg);
            return 1;
        }
    const int64_t n = o->b * o->t * o->c;
    const size_t nsaved = (size_t)x.kc[0]->k->attention_saved_floats(o->b, o->t, o->c, o->nh);
    const size_t nscratch = (size_t)x.kc[0]->k->attention_scratch_floats(o->b, o->t, o->nh);
    if (ms_device_alloc(dev, 2 * (size_t)(3 * n), (void **)&x.qkv, &err) ||
        ms_device_alloc(dev, 2 * (size_t)(3 * n), (void **)&x.dqkv, &err) ||
        ms_device_alloc(dev, 2 * (size_t)n, (void **)&x.out, &err) ||
        ms_device_alloc(dev, 2 * (size_t)n, (void **)&x.dout, &err) ||
        ms_device_alloc(dev, 4 * nsaved, (void **)&x.saved, &err) ||
        ms_device_alloc(dev, 4 * nscratch, (void **)&x.scratch, &err) ||
        fill(dev, x.qkv, 3 * n, 1, &err) || fill(dev, x.dout, n, 2, &err) ||
        ms_device_zero(dev, x.dqkv, 2 * (size_t)(3 * n), &err)) {
        fprintf(stderr, "bench_attention_cuda: %s\n", err.msg);
        return 1;
    }
    const double tt = (double)o->t * (double)o->t / 2; /* causal: half the scores */
    const double flops = 3.5 * 4.0 * (double)o->b * (double)o->nh * tt * (double)(o->c / o->nh);
    printf("attention B=%lld T=%lld C=%lld NH=%lld (head size %lld), bf16, causal, forward + "
           "backward, median of %d\n",
           (long long)o->b, (long long)o->t, (long long)o->c, (long long)o->nh,
           (long long)(o->c / o->nh), o->reps);
    const char *names[2] = {"meshscope flash (tensor cores)", "meshscope row kernels"};
    double sec[2];
    for (int s = 0; s < 2; s++) {
        sec[s] = time_calls(&x, x.kc[s]);
        if (sec[s] <= 0) return 1;
        printf("  %-32s %9.3f ms  %7.1f TFLOP/s\n", names[s], sec[s] * 1e3, flops / sec[s] * 1e-12);
    }
    printf("  flash / rows speedup: %.2f\n", sec[1] / sec[0]);
    printf("meshscope_ms %.4f\n", sec[0] * 1e3); /* read by bench/attention_cuda.sh */
    ms_kctx_destroy(x.kc[0]), ms_kctx_destroy(x.kc[1]);
    ms_device_free(dev, x.qkv, 2 * (size_t)(3 * n)),
        ms_device_free(dev, x.dqkv, 2 * (size_t)(3 * n));
    ms_device_free(dev, x.out, 2 * (size_t)n), ms_device_free(dev, x.dout, 2 * (size_t)n);
    ms_device_free(dev, x.saved, 4 * nsaved), ms_device_free(dev, x.scratch, 4 * nscratch);
    ms_device_destroy(dev);
    return 0;
}

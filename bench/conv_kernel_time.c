/* conv_kernel_time.c - ms_k_conv_backward (and forward) timed alone on the stride-1 3x3 convs
 * and the stride-2 convs of bench/image_vs_torch.py's model, batch 32: GFLOP/s of the weight
 * gradient (dx NULL), the input gradient (dw NULL) and the forward, best of REPS calls.
 *
 * Build: cc -O3 -march=native -I. bench/conv_kernel_time.c build/libmeshscope_engine.a
 *        build/libmeshscope_core.a -lopenblas -lm -lpthread
 * Run:   conv_kernel_time [threads]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/core/parallel.h"
#include "engine/kernels/conv.h"

#define REPS 20

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *filled(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    return p;
}

static void one(int64_t cin, int64_t cout, int64_t side, int64_t k, int64_t s) {
    ms_k_conv g = {.n = 32,
                   .c_x = cin,
                   .groups = 1,
                   .cin_g = cin,
                   .cout_g = cout,
                   .h = side,
                   .w = side,
                   .kh = k,
                   .kw = k,
                   .sh = s,
                   .sw = s,
                   .ph = k / 2,
                   .pw = k / 2,
                   .dh = 1,
                   .dw = 1};
    g.oh = g.ow = ms_k_conv_out_size(side, k, s, k / 2, 1);
    const int64_t nx = g.n * cin * side * side, ny = g.n * cout * g.oh * g.ow,
                  nw = cout * cin * k * k;
    float *x = filled(nx), *dy = filled(ny), *w = filled(nw), *dx = filled(nx), *dw = filled(nw);
    float *y = filled(ny), *col = filled(ms_k_conv_scratch_floats(&g));
    const double flops = 2.0 * (double)ny * (double)(cin * k * k);
    double best[3] = {1e9, 1e9, 1e9};
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        ms_k_conv_backward(&g, NULL, dw, NULL, col, dy, x, w, false);
        double t1 = now();
        ms_k_conv_backward(&g, dx, NULL, NULL, col, dy, x, w, true);
        double t2 = now();
        ms_k_conv_forward(&g, y, col, x, w, NULL);
        double t3 = now();
        if (t1 - t0 < best[0]) best[0] = t1 - t0;
        if (t2 - t1 < best[1]) best[1] = t2 - t1;
        if (t3 - t2 < best[2]) best[2] = t3 - t2;
    }
    printf("%lldx%lld/%lld %3lld -> %3lld, %2lldx%-2lld  dw %6.2f ms %6.1f GF/s  dx %6.2f ms %6.1f "
           "GF/s  "
           "fwd %6.2f ms %6.1f GF/s\n",
           (long long)k, (long long)k, (long long)s, (long long)cin, (long long)cout,
           (long long)side, (long long)side, best[0] * 1e3, flops / best[0] * 1e-9, best[1] * 1e3,
           flops / best[1] * 1e-9, best[2] * 1e3, flops / best[2] * 1e-9);
    free(x), free(dy), free(w), free(dx), free(dw), free(y), free(col);
}

int main(int argc, char **argv) {
    ms_parallel_set_threads(argc > 1 ? atoi(argv[1]) : 1);
    one(3, 32, 32, 3, 1);
    one(32, 32, 32, 3, 1);
    one(64, 64, 16, 3, 1);
    one(32, 64, 32, 3, 2);
    one(32, 64, 32, 1, 2);
    return 0;
}

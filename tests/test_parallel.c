/* test_parallel.c - the rank's worker pool (core/parallel.h): every index visited once
 * whatever the split, and the kernels that use it give the same bytes on 3 threads as on
 * one. No BLAS here, so the whole test runs under TSan (OpenBLAS's own threads are not
 * instrumented). */
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/kernels/kernels.h"
#include "engine/core/parallel.h"
#include "tests/testkit.h"

static void count_range(void *arg, int64_t lo, int64_t hi) {
    int *hits = arg;
    for (int64_t i = lo; i < hi; i++) hits[i]++;
}

/* Every index is visited exactly once, whatever the size, grain and thread count. */
static void parallel_for_covers(void **state) {
    (void)state;
    static int hits[100003];
    const int64_t sizes[] = {0, 1, 7, 1000, 65536, 100003};
    const int64_t grains[] = {1, 3, 1000, 1 << 16};
    for (int t = 1; t <= 4; t++) {
        ms_parallel_set_threads(t);
        for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
            for (size_t b = 0; b < sizeof grains / sizeof *grains; b++) {
                memset(hits, 0, sizeof hits);
                ms_parallel_for(sizes[a], grains[b], count_range, hits);
                for (int64_t i = 0; i < sizes[a]; i++)
                    if (hits[i] != 1)
                        fail_msg("threads %d, n %lld, grain %lld: index %lld visited %d times", t,
                                 (long long)sizes[a], (long long)grains[b], (long long)i, hits[i]);
            }
    }
    ms_parallel_set_threads(1);
}

/* The kernels that split their loops across the rank's threads give, on 3 threads, exactly
 * the bytes they give on one (each element or row or column is computed by one thread, in
 * the same order). Sizes are large enough to be split. */
static void threaded_kernels_match(void **state) {
    (void)state;
    enum { R = 300, C = 1031, N = R * C };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    float *w = malloc(sizeof(float) * C), *bi = malloc(sizeof(float) * C);
    for (int i = 0; i < N; i++) {
        x[i] = (float)ms_philox_normal(5, 1, (uint64_t)i);
        y[i] = (float)ms_philox_normal(5, 2, (uint64_t)i);
    }
    for (int j = 0; j < C; j++)
        w[j] = 1.0f + 0.1f * (float)ms_philox_normal(5, 3, (uint64_t)j),
        bi[j] = 0.1f * (float)ms_philox_normal(5, 4, (uint64_t)j);
    float *out[2], *d1[2], *d2[2], *dw[2], *db[2], *mean[2], *rstd[2];
    for (int t = 0; t < 2; t++) {
        out[t] = malloc(sizeof(float) * N);
        d1[t] = calloc(N, sizeof(float));
        d2[t] = calloc(N, sizeof(float));
        dw[t] = calloc(C, sizeof(float));
        db[t] = calloc(C, sizeof(float));
        mean[t] = malloc(sizeof(float) * R);
        rstd[t] = malloc(sizeof(float) * R);
        ms_parallel_set_threads(t == 0 ? 1 : 3);
        ms_k_gelu_forward(out[t], x, N);
        ms_k_gelu_backward(d1[t], x, y, N);
        ms_k_add_backward(d2[t], NULL, y, N);
        ms_k_add_forward(d2[t], d2[t], out[t], N);
        ms_k_bias_add_forward(out[t], out[t], bi, R, C);
        ms_k_layernorm_forward(out[t], mean[t], rstd[t], x, w, bi, R, C, 1e-5f);
        ms_k_layernorm_backward(d1[t], dw[t], db[t], y, x, w, mean[t], rstd[t], R, C);
    }
    ms_parallel_set_threads(1);
    assert_memory_equal(out[0], out[1], sizeof(float) * N);
    assert_memory_equal(d1[0], d1[1], sizeof(float) * N);
    assert_memory_equal(d2[0], d2[1], sizeof(float) * N);
    assert_memory_equal(dw[0], dw[1], sizeof(float) * C);
    assert_memory_equal(db[0], db[1], sizeof(float) * C);
    assert_memory_equal(mean[0], mean[1], sizeof(float) * R);
    for (int t = 0; t < 2; t++)
        free(out[t]), free(d1[t]), free(d2[t]), free(dw[t]), free(db[t]), free(mean[t]),
            free(rstd[t]);
    free(x), free(y), free(w), free(bi);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(parallel_for_covers),
    cmocka_unit_test(threaded_kernels_match),
};
MT_MAIN("parallel", tests)

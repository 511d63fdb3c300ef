/* test_blas_policy.c - the process's BLAS thread policy (engine/kernels/blas.h).
 *
 * The policy is decided before the first GEMM, a TSan build never runs a GEMM on more than one
 * BLAS thread, and a TSan build whose pool was widened behind the policy's back stops loudly
 * instead of reporting races it cannot see the cause of. Products from several rank threads
 * at once equal a float64 reference (under TSan that is also the race check of the pinned
 * policy: run-tests.sh can force OpenBLAS's pool to 2 threads, MS_TEST_BLAS_THREADS=2).
 */
#include "tests/testkit.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kernels/blas.h"
#include "engine/kernels/kernels.h"
#include "engine/core/parallel.h"

enum { N = 192 }; /* large enough that any OpenBLAS kernel splits it across a wider pool */

static void fill(float *x, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7 + seed) % 13) / 13.0f - 0.5f;
}

static void policy_is_decided(void **state) {
    (void)state;
    int n = ms_blas_policy();
    assert_true(n >= 1);
    assert_int_equal(ms_blas_policy(), n); /* decided once */
    if (ms_blas_pinned_for_tsan()) {
        assert_int_equal(n, 1);
    } else if (getenv("MS_BLAS_THREADS")) {
        assert_int_equal(n, atoi(getenv("MS_BLAS_THREADS")));
    }
}

static void set_threads_keeps_tsan_pinned(void **state) {
    (void)state;
    int before = ms_k_blas_threads(), par = ms_parallel_threads();
    ms_k_blas_set_threads(2);
    assert_int_equal(ms_k_blas_threads(), ms_blas_pinned_for_tsan() ? 1 : 2);
    assert_int_equal(ms_parallel_threads(), 2); /* our own pool is instrumented: it keeps 2 */
    ms_k_blas_set_threads(before);
    ms_parallel_set_threads(par);
}

/* Each rank multiplies its own matrices, reads the product and writes it again, as a kernel
 * after a GEMM does; all against a float64 product. */
static void rank_products(mt_rank *r, void *arg) {
    (void)arg;
    float *a = malloc(sizeof *a * N * N), *b = malloc(sizeof *b * N * N),
          *c = malloc(sizeof *c * N * N);
    fill(a, N * N, 3 + (unsigned)r->ctx->rank);
    fill(b, N * N, 5);
    for (int round = 0; round < 4; round++) {
        for (int64_t i = 0; i < N * N; i++) c[i] = 1e9f; /* beta 0 must overwrite, not read */
        ms_blas_sgemm(false, round % 2 == 1, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
        double worst = 0;
        for (int i = 0; i < N; i += 17)
            for (int j = 0; j < N; j++) {
                double want = 0;
                for (int k = 0; k < N; k++)
                    want += (double)a[i * N + k] * (round % 2 ? b[j * N + k] : b[k * N + j]);
                double d = c[i * N + j] - want;
                if (d < 0) d = -d;
                if (d > worst) worst = d;
            }
        MT_CHECK(r, worst < 1e-3, "rank %d round %d: product off by %g", r->ctx->rank, round,
                 worst);
        for (int64_t i = 0; i < N * N; i++) c[i] *= 0.5f; /* the next kernel's write */
    }
    free(a);
    free(b);
    free(c);
}

static void concurrent_products_are_right(void **state) {
    (void)state;
    mt_run_threads(2, rank_products, NULL);
}

/* The child of bypass_is_refused: widens the decided pool directly, then multiplies. */
static int bypass_child(void) {
    float a[4] = {1, 2, 3, 4}, c[4] = {0};
    ms_blas_policy(); /* decided, then widened behind its back */
    openblas_set_num_threads(2);
    ms_blas_sgemm(false, false, 2, 2, 2, 1.0f, a, 2, a, 2, 0.0f, c, 2);
    printf("multiplied on a pool of %d threads\n", ms_k_blas_threads());
    return 0;
}

static void bypass_is_refused(void **state) {
    (void)state;
    if (!ms_blas_pinned_for_tsan()) skip(); /* only a TSan build refuses a wider pool */
    char cmd[4200];
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(len > 0);
    self[len] = 0;
    snprintf(cmd, sizeof cmd, "'%s' --bypass-policy 2>&1", self);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[8192] = "";
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = 0;
    int rc = pclose(p);
    if (rc == 0 || !strstr(out, "ThreadSanitizer build, but OpenBLAS's pool has 2 threads"))
        fail_msg("a widened pool was not refused (exit status %d): %s", rc, out);
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--bypass-policy")) return bypass_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(policy_is_decided),
        cmocka_unit_test(set_threads_keeps_tsan_pinned),
        cmocka_unit_test(concurrent_products_are_right),
        cmocka_unit_test(bypass_is_refused),
    };
    return mt_main(argc, argv, "blas_policy", tests, sizeof tests / sizeof tests[0]);
}

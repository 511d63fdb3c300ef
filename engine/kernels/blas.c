/* blas.c - every OpenBLAS call of meshscope, and the process's BLAS thread policy (blas.h). */
#include "engine/kernels/blas.h"
#include "engine/kernels/kernels.h"
#include "engine/core/parallel.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__SANITIZE_THREAD__)
#define MS_TSAN 1
#else
#define MS_TSAN 0
#endif

static pthread_once_t g_policy_once = PTHREAD_ONCE_INIT;

/* MS_BLAS_THREADS as a count, or 0 when unset; a malformed value is named and ignored (the
 * policy must never stop a process that only wanted to multiply). */
static int env_threads(void) {
    const char *s = getenv("MS_BLAS_THREADS");
    if (!s || !*s) return 0;
    char *end;
    long n = strtol(s, &end, 10);
    if (*end || n < 1 || n > 1024) {
        fprintf(stderr,
                "meshscope: ignoring MS_BLAS_THREADS=%s (want a thread count from 1 to 1024)\n", s);
        return 0;
    }
    return (int)n;
}

static void decide_policy(void) {
    int n = MS_TSAN ? 1 : env_threads();
    if (n > 0) openblas_set_num_threads(n);
}

int ms_blas_policy(void) {
    pthread_once(&g_policy_once, decide_policy);
    return openblas_get_num_threads();
}

bool ms_blas_pinned_for_tsan(void) {
    return MS_TSAN;
}

const char *ms_blas_better_core(void) {
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core || strcasecmp(core, "prescott")) return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

void ms_blas_describe(char *buf, size_t len) {
    static const char *const threading[] = {"sequential", "pthreads", "openmp"};
    const char *config = openblas_get_config(), *core = openblas_get_corename();
    int par = openblas_get_parallel();
    int n = (int)strlen(config ? config : "");
    while (n > 0 && config[n - 1] == ' ') n--; /* the config string ends with a space */
    snprintf(buf, len, "%.*s, core %s, %s", n, config ? config : "", core ? core : "?",
             par >= 0 && par < 3 ? threading[par] : "unknown threading");
}

/* A TSan build's one rule, checked where it matters: no GEMM runs on a pool TSan cannot see. */
static void check_pinned(void) {
    int n = openblas_get_num_threads();
    if (n == 1) return;
    fprintf(
        stderr,
        "meshscope: ThreadSanitizer build, but OpenBLAS's pool has %d threads: TSan cannot "
        "see its synchronisation and would report false races. Set BLAS threads only "
        "through ms_k_blas_set_threads (engine/kernels/blas.h), never openblas_set_num_threads.\n",
        n);
    abort();
}

void ms_blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    pthread_once(&g_policy_once, decide_policy);
    if (MS_TSAN) check_pinned();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)(lda > 0 ? lda : 1), b,
                (blasint)(ldb > 0 ? ldb : 1), beta, c, (blasint)(ldc > 0 ? ldc : 1));
}

void ms_k_blas_set_threads(int n) {
    pthread_once(&g_policy_once, decide_policy);
    /* A TSan build runs BLAS on the calling thread; the streaming kernels (our own,
     * instrumented pool) keep n threads. */
    openblas_set_num_threads(MS_TSAN ? 1 : (n > 0 ? n : 1));
    ms_parallel_set_threads(n); /* the streaming kernels use the same cores */
}

int ms_k_blas_threads(void) {
    return ms_blas_policy();
}

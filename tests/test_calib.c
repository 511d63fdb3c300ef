/* test_calib.c - the cpu-local cache's guards (engine/plan/calib_cache.h): the busy CPU from
 * crafted /proc/stat texts, the CPU features from crafted /proc/cpuinfo texts, the key, its
 * hash and the part two keys differ in, when a cached file may stand for this machine, the
 * provenance line, the quiet check's limits from the environment, the new fields of the cache
 * file, a planted cache file used as it is, and a measurement too loaded to cache serving the
 * rest of its process (the one case here that measures; the command's paths are
 * tests/calibrate_idle.sh).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "engine/kernels/blas.h"
#include "engine/plan/calib_cache.h"
#include "engine/plan/cluster.h"
#include "tests/testkit.h"

/* /proc/stat: user nice system idle iowait irq softirq steal guest guest_nice, then cpuN. */
static const char stat0[] = "cpu  100 0 100 800 0 0 0 0 0 0\n"
                            "cpu0 25 0 25 200 0 0 0 0 0 0\n"
                            "cpu1 25 0 25 200 0 0 0 0 0 0\n"
                            "cpu2 25 0 25 200 0 0 0 0 0 0\n"
                            "cpu3 25 0 25 200 0 0 0 0 0 0\n"
                            "intr 12345 0 0\nctxt 99\n";

static void busy_from_proc_stat(void **state) {
    (void)state;
    /* 1000 jiffies later: 300 busy (200 user, 50 system, 50 steal), 500 idle, 200 iowait:
     * 0.3 of 4 CPUs, iowait counting as idle */
    const char stat1[] = "cpu  300 0 150 1300 200 0 0 50 0 0\n"
                         "cpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n"
                         "cpu2 0 0 0 0 0 0 0 0 0 0\ncpu3 0 0 0 0 0 0 0 0 0 0\n";
    double busy = -1;
    assert_true(ms_cpu_busy_between(stat0, stat1, &busy));
    assert_true(fabs(busy - 1.2) < 1e-9);
    /* idle: only idle time passed */
    const char idle[] = "cpu  100 0 100 1800 0 0 0 0 0 0\ncpu0\ncpu1\ncpu2\ncpu3\n";
    assert_true(ms_cpu_busy_between(stat0, idle, &busy));
    assert_true(busy == 0);
    /* a kernel with only the first four columns (before iowait existed) */
    assert_true(ms_cpu_busy_between("cpu  0 0 0 0\ncpu0\n", "cpu  10 0 0 10\ncpu0\n", &busy));
    assert_true(fabs(busy - 0.5) < 1e-9);
    /* no aggregate line, too few columns, no time passed, no cpuN line */
    assert_false(ms_cpu_busy_between("cpu0 1 2 3 4\n", stat1, &busy));
    assert_false(ms_cpu_busy_between("cpu  1 2 3\ncpu0\n", stat1, &busy));
    assert_false(ms_cpu_busy_between(stat0, stat0, &busy));
    assert_false(ms_cpu_busy_between(stat0, "cpu  300 0 150 1300 200 0 0 50\n", &busy));
    /* this machine, if it has /proc/stat: somewhere between none and all of its cores */
    if (access("/proc/stat", R_OK) == 0) {
        assert_true(ms_cpu_busy_sample(0.05, &busy));
        assert_true(busy >= 0 && busy <= sysconf(_SC_NPROCESSORS_ONLN) + 1e-9);
    }
}

static void features_from_cpuinfo(void **state) {
    (void)state;
    char f[96];
    /* whole words only (avx512fp16 is not avx512f), the key's order, the first block only */
    ms_cpu_features("processor\t: 0\nmodel name\t: X\n"
                    "flags\t\t: fpu amx_bf16 avx512fp16 avx2 avx512_bf16 amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: avx512f\n",
                    f, sizeof f);
    assert_string_equal(f, "avx2 avx512_bf16 amx_tile amx_bf16");
    ms_cpu_features("flags\t\t: fpu sse avx2 avx512f\n", f, sizeof f);
    assert_string_equal(f, "avx2 avx512f");
    ms_cpu_features("flags\t\t: fpu sse4_2\n", f, sizeof f);
    assert_string_equal(f, "none");
    ms_cpu_features("processor\t: 0\nFeatures\t: fp asimd\n", f, sizeof f); /* aarch64 */
    assert_string_equal(f, "none");
    ms_cpu_features("flags\t\t: avx2", f, sizeof f); /* no newline at the end */
    assert_string_equal(f, "avx2");
}

static void key_hash_and_diff(void **state) {
    (void)state;
    char h[9], d[256];
    ms_calib_key_hash("abc", h);
    assert_string_equal(h, "1a47e90b"); /* FNV-1a, 32 bits */
    ms_calib_key_hash("", h);
    assert_string_equal(h, "811c9dc5");
    const char *a = "model=X; features=avx2; cores=2; blas=OpenBLAS, core Haswell; threads=1";
    const char *b = "model=X; features=avx2; cores=2; blas=OpenBLAS, core SkylakeX; threads=1";
    ms_calib_key_diff(a, a, d, sizeof d);
    assert_string_equal(d, "");
    ms_calib_key_diff(a, b, d, sizeof d);
    assert_string_equal(d, "blas: 'OpenBLAS, core Haswell' then, 'OpenBLAS, core SkylakeX' now");
    ms_calib_key_diff("model=X; cores=2", "model=X; features=avx2; cores=2", d, sizeof d);
    assert_string_equal(d, "features: not recorded then, 'avx2' now");
    ms_calib_key_diff("", "model=X", d, sizeof d); /* a file from before keys */
    assert_string_equal(d, "model: not recorded then, 'X' now");

    /* this machine's key names every part, and the cache file carries its hash */
    char key[MS_CALIB_KEY_MAX], path[600], want[32], blas[256];
    ms_calib_key(key, sizeof key);
    printf("key: %s\n", key);
    ms_blas_describe(blas, sizeof blas);
    printf("blas: %s\n", blas);
    assert_non_null(strstr(blas, ", core "));
    snprintf(want, sizeof want, "; cores=%ld; ", sysconf(_SC_NPROCESSORS_ONLN));
    assert_true(!strncmp(key, "model=", 6) && strstr(key, want) && strstr(key, "; features=") &&
                strstr(key, "; blas=") && strstr(key, "; threads="));
    assert_true(strstr(key, ms_blas_pinned_for_tsan() ? "pinned" : "2 for the speedup"));
#if defined(__SANITIZE_ADDRESS__)
    assert_non_null(strstr(key, "; build=AddressSanitizer")); /* its own rates, its own cache */
#else
    assert_null(strstr(key, "build="));
#endif
    setenv("XDG_CACHE_HOME", "/tmp/ms-calib-key", 1);
    ms_error err = {0};
    assert_int_equal(ms_cluster_cache_path(path, sizeof path, &err), MS_OK);
    ms_calib_key_hash(key, h);
    snprintf(want, sizeof want, "c-%s.json", h);
    printf("cache: %s\n", path);
    assert_true(!strncmp(path, "/tmp/ms-calib-key/meshscope/cpu-local-", 38));
    assert_true(strlen(path) > strlen(want) && !strcmp(path + strlen(path) - strlen(want), want));
}

static ms_cluster cached_cluster(const char *key, int cores) {
    ms_cluster c;
    memset(&c, 0, sizeof c);
    c.cpu = true;
    c.cores = cores;
    snprintf(c.calibration, sizeof c.calibration, "%s", MS_CALIBRATION_VERSION);
    snprintf(c.calibration_key, sizeof c.calibration_key, "%s", key);
    snprintf(c.calibrated_at, sizeof c.calibrated_at, "2026-12-06T22:10:31Z");
    c.busy_before = 0.02;
    c.busy_after = 0.04;
    c.busy_limit = 0.25;
    return c;
}

static void cache_usable_and_provenance(void **state) {
    (void)state;
    const char *key = "model=X; features=avx2; cores=2; blas=B; threads=1";
    char why[512], line[512];
    ms_cluster c = cached_cluster(key, 2);
    assert_true(ms_calib_usable(&c, key, 2, why, sizeof why));
    assert_false(ms_calib_usable(&c, key, 4, why, sizeof why));
    assert_string_equal(why, "it describes 2 cores, this machine has 4 online");
    assert_false(ms_calib_usable(&c, "model=X; features=avx2 avx512f; cores=2; blas=B; threads=1",
                                 2, why, sizeof why));
    assert_string_equal(why, "it was measured under another key (features: 'avx2' then, "
                             "'avx2 avx512f' now)");
    snprintf(c.calibration, sizeof c.calibration, "meshscope-cpu-local-7");
    assert_false(ms_calib_usable(&c, key, 2, why, sizeof why));
    assert_non_null(strstr(why, "'meshscope-cpu-local-7', this is '" MS_CALIBRATION_VERSION "'"));

    /* 2026-12-07 01:10:31 UTC: three hours later */
    c = cached_cluster(key, 2);
    time_t now = 1796605831;
    ms_calib_provenance(&c, 0.25, now, line, sizeof line);
    assert_string_equal(line, "taken 2026-12-06 22:10 UTC (3 h ago) on an idle machine (0.02 "
                              "cores busy before, 0.04 after)");
    c.busy_before = 1.93;
    ms_calib_provenance(&c, 0.25, now + 3 * 86400, line, sizeof line);
    assert_string_equal(line, "taken 2026-12-06 22:10 UTC (3 days ago) on a busy machine (1.93 "
                              "cores busy before, 0.04 after)");
    c.busy_after = -1;
    ms_calib_provenance(&c, 0.25, now - 3 * 3600 + 30, line, sizeof line);
    assert_string_equal(line, "taken 2026-12-06 22:10 UTC (30 s ago); the machine's load was not "
                              "checked");
    snprintf(c.calibrated_at, sizeof c.calibrated_at, "yesterday");
    ms_calib_provenance(&c, 0.25, now, line, sizeof line);
    assert_string_equal(line, "taken at an unknown time; the machine's load was not checked");
}

static void quiet_limits_from_env(void **state) {
    (void)state;
    unsetenv("MS_CALIBRATE_MAX_BUSY");
    unsetenv("MS_CALIBRATE_WAIT_S");
    ms_calib_quiet q = ms_calib_quiet_limits(2);
    assert_true(q.max_busy == MS_CALIB_BUSY_CORES && q.wait_s == MS_CALIB_WAIT_S);
    /* a big machine: 2% of its cores */
    assert_true(fabs(ms_calib_quiet_limits(64).max_busy - 1.28) < 1e-12);
    setenv("MS_CALIBRATE_MAX_BUSY", "1.5", 1);
    setenv("MS_CALIBRATE_WAIT_S", "0", 1);
    q = ms_calib_quiet_limits(2);
    assert_true(q.max_busy == 1.5 && q.wait_s == 0);
    /* malformed values are ignored (and named on stderr) */
    setenv("MS_CALIBRATE_MAX_BUSY", "-1", 1);
    setenv("MS_CALIBRATE_WAIT_S", "ten", 1);
    q = ms_calib_quiet_limits(2);
    assert_true(q.max_busy == MS_CALIB_BUSY_CORES && q.wait_s == MS_CALIB_WAIT_S);
    unsetenv("MS_CALIBRATE_MAX_BUSY");
    unsetenv("MS_CALIBRATE_WAIT_S");
}

static const char minimal_cpu[] =
    "{\"name\": \"cpu-local\", \"cpu\": true, \"cores\": %ld, \"devices_per_node\": 4096,"
    " \"peak_tflops\": {\"fp32\": 0.02, \"bf16\": 0.02}, \"memory_gb\": 8,"
    " \"memory_bw_gbps\": 10, \"calibrated_at\": \"2026-12-06T22:10:31Z\"%s}";

/* The provenance fields survive the JSON round trip; a file without them (an older version)
 * reads them as unknown. Then a file planted under this machine's key is used as it is, and
 * its provenance said. */
static void cache_file_fields_and_load(void **state) {
    (void)state;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char json[1024], key[MS_CALIB_KEY_MAX];
    ms_error err = {0};
    ms_cluster *c = calloc(1, sizeof *c), *d = calloc(1, sizeof *d);
    snprintf(json, sizeof json, minimal_cpu, cores, "");
    assert_int_equal(ms_cluster_from_json(json, strlen(json), "old.json", c, &err), MS_OK);
    assert_true(c->busy_before == -1 && c->busy_after == -1 && !c->calibration_key[0]);
    ms_calib_key(key, sizeof key);
    snprintf(c->calibration_key, sizeof c->calibration_key, "%s", key);
    snprintf(c->calibration, sizeof c->calibration, "%s", MS_CALIBRATION_VERSION);
    c->busy_before = 0.03, c->busy_after = 0.05, c->busy_limit = 0.25;
    char *text = ms_cluster_to_json(c);
    assert_int_equal(ms_cluster_from_json(text, strlen(text), "rt.json", d, &err), MS_OK);
    assert_string_equal(d->calibration_key, key);
    assert_true(d->busy_before == 0.03 && d->busy_after == 0.05 && d->busy_limit == 0.25);

    char dir[] = "/tmp/ms-calib-XXXXXX", path[600], cmd[700];
    assert_non_null(mkdtemp(dir));
    setenv("XDG_CACHE_HOME", dir, 1);
    assert_int_equal(ms_cluster_cache_path(path, sizeof path, &err), MS_OK);
    snprintf(cmd, sizeof cmd, "%s/meshscope", dir);
    assert_int_equal(mkdir(cmd, 0755), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    char *log = NULL;
    size_t log_len = 0;
    FILE *lf = open_memstream(&log, &log_len);
    memset(d, 0, sizeof *d);
    assert_int_equal(ms_cluster_resolve("cpu-local", false, lf, d, &err), MS_OK);
    fclose(lf);
    printf("%s", log);
    assert_string_equal(d->calibration_key, key);
    char want[700];
    snprintf(want, sizeof want, "cpu-local: calibration from %s, taken 2026-12-06 22:10 UTC (",
             path);
    assert_true(!strncmp(log, want, strlen(want)));
    assert_non_null(strstr(log, ") on an idle machine (0.03 cores busy before, 0.05 after)\n"));
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(log);
    free(text);
    free(c);
    free(d);
}

static atomic_bool spin_on;

static void *spin(void *arg) {
    (void)arg;
    volatile unsigned long n = 0;
    while (atomic_load(&spin_on)) n++;
    return NULL;
}

/* A machine kept busy (a spinning thread; "quiet" is at most 0.5 cores): the first resolve
 * measures for this run only and caches nothing; the second returns that measurement at once
 * and says so, where it measured again before (a job's advisor and its switch each did, for
 * minutes under a sanitizer). */
static void loaded_calibration_serves_the_process(void **state) {
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("skipped under a sanitizer: it measures the machine (seconds in release, minutes "
           "here); the release run covers it\n");
    skip();
#endif
    char dir[] = "/tmp/ms-calib-run-XXXXXX", path[600], cmd[700];
    assert_non_null(mkdtemp(dir));
    setenv("XDG_CACHE_HOME", dir, 1);
    setenv("MS_CALIBRATE_MAX_BUSY", "0.5", 1);
    setenv("MS_CALIBRATE_WAIT_S", "0", 1);
    ms_error err = {0};
    assert_int_equal(ms_cluster_cache_path(path, sizeof path, &err), MS_OK);
    ms_cluster *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    char *log = NULL;
    size_t log_len = 0;
    FILE *lf = open_memstream(&log, &log_len);
    pthread_t th;
    atomic_store(&spin_on, true);
    assert_int_equal(pthread_create(&th, NULL, spin, NULL), 0);
    assert_int_equal(ms_calib_resolve(false, lf, a, &err), MS_OK);
    atomic_store(&spin_on, false);
    pthread_join(th, NULL);
    fflush(lf);
    assert_non_null(strstr(log, "not caching"));
    assert_int_equal(access(path, F_OK), -1); /* nothing cached */
    size_t first = log_len;
    int64_t t0 = ms_now_ns();
    assert_int_equal(ms_calib_resolve(false, lf, b, &err), MS_OK);
    double took = (double)(ms_now_ns() - t0) * 1e-9;
    fclose(lf);
    printf("%s", log);
    assert_string_equal(log + first,
                        "cpu-local: this run's calibration, measured earlier, not cached\n");
    assert_true(took < 0.5);
    assert_string_equal(a->calibration_key, b->calibration_key);
    assert_true(a->busy_before == b->busy_before && a->busy_after == b->busy_after);
    assert_true(a->n_gemm == b->n_gemm && a->n_coll == b->n_coll);
    for (int i = 0; i < a->n_gemm; i++)
        assert_true(a->gemm[i].flops_per_s == b->gemm[i].flops_per_s);
    unsetenv("MS_CALIBRATE_MAX_BUSY");
    unsetenv("MS_CALIBRATE_WAIT_S");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(log), free(a), free(b);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(busy_from_proc_stat),
    cmocka_unit_test(features_from_cpuinfo),
    cmocka_unit_test(key_hash_and_diff),
    cmocka_unit_test(cache_usable_and_provenance),
    cmocka_unit_test(quiet_limits_from_env),
    cmocka_unit_test(cache_file_fields_and_load),
    cmocka_unit_test(loaded_calibration_serves_the_process),
};

MT_MAIN("calib", tests)

/* test_switch.c - switching strategy in a running job.
 *
 * A run that switches from strategy A to B at step k must produce the losses of a run that
 * used B throughout (and of one that used A throughout: all strategies compute the same
 * numbers, so both are independent references), within fp32 tolerance, and its log must
 * name B from step k on. Targets the job cannot take are refused with a reason.
 *
 * Runs the real binary (argv[1]); with argv[2] = "mpi" under mpirun instead of threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/testkit.h"

static const char *bin;
static bool use_mpi;
static char dir[256], text[300], model[300];

#define STEPS 8

typedef struct run_log {
    int n;
    double loss[STEPS];
    char strategy[STEPS][64];
} run_log;

/* Runs `meshscope train` for `steps` steps with extra flags; returns the exit code, output in
 * dir/out.txt. */
static int train_steps(const char *flags, const char *log, int steps) {
    char cmd[2048];
    int ranks = 4;
    snprintf(cmd, sizeof cmd,
             "%s%s train --model %s --data %s --steps %d --batch 8 --seq 16 --log-every 1 "
             "--log-jsonl %s/%s %s %s > %s/out.txt 2>&1",
             use_mpi ? "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl "
                       "self,vader -np 4 "
                     : "",
             bin, model, text, steps, dir, log, use_mpi ? "--backend mpi" : "", flags, dir);
    (void)ranks;
    int rc = system(cmd);
    if (getenv("MS_TEST_VERBOSE")) fprintf(stderr, "%s -> %d\n", cmd, rc);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static int train(const char *flags, const char *log) {
    return train_steps(flags, log, STEPS);
}

static void read_log(const char *name, run_log *l) {
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    memset(l, 0, sizeof *l);
    while (l->n < STEPS && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"loss\": "), *q = strstr(line, "\"strategy\": \"");
        assert_non_null(p);
        assert_non_null(q);
        l->loss[l->n] = atof(p + 8);
        q += 13;
        size_t k = 0;
        while (q[k] && q[k] != '"' && k + 1 < sizeof l->strategy[0])
            l->strategy[l->n][k] = q[k], k++;
        l->n++;
    }
    fclose(f);
    assert_int_equal(l->n, STEPS);
}

static bool out_contains(const char *needle) {
    char path[512], buf[8192];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    if (!strstr(buf, needle)) fprintf(stderr, "output lacks '%s':\n%s\n", needle, buf);
    return strstr(buf, needle) != NULL;
}

/* from A, switch at step k to B; compare with B and A throughout. */
static void check_switch_saying(const char *a_flags, const char *b_flags, const char *b_json, int k,
                                const char *b_text, const char *says) {
    char flags[1024];
    snprintf(flags, sizeof flags, "%s --switch '%d:%s'", a_flags, k, b_json);
    assert_int_equal(train(flags, "switch.jsonl"), 0);
    assert_true(out_contains(says));
    assert_int_equal(train(b_flags, "b.jsonl"), 0);
    assert_int_equal(train(a_flags, "a.jsonl"), 0);
    run_log sw, b, a;
    read_log("switch.jsonl", &sw);
    read_log("b.jsonl", &b);
    read_log("a.jsonl", &a);
    for (int i = 0; i < STEPS; i++) {
        /* fp32 with a different reduction order per mesh: a few ulps of drift per step */
        double tol = 2e-5 * (1 + i) * (b.loss[i] > 1 ? b.loss[i] : 1);
        if (fabs(sw.loss[i] - b.loss[i]) > tol || fabs(sw.loss[i] - a.loss[i]) > tol)
            fail_msg("step %d: switched %.6f, %s throughout %.6f, before-strategy %.6f", i,
                     sw.loss[i], b_text, b.loss[i], a.loss[i]);
        if (i >= k)
            assert_string_equal(sw.strategy[i], b_text);
        else
            assert_string_equal(sw.strategy[i], a.strategy[0]);
    }
}

static void check_switch(const char *a_flags, const char *b_flags, const char *b_json, int k,
                         const char *b_text) {
    check_switch_saying(a_flags, b_flags, b_json, k, b_text, "switched");
}

static void test_dp_to_dp_tp(void **state) {
    (void)state;
    check_switch("--dp 4", "--dp 2 --tp 2", "{\"dp\": 2, \"tp\": 2}", 3, "dp2 x tp2");
}

static void test_dp_tp_to_tp_sp(void **state) {
    (void)state;
    check_switch("--dp 2 --tp 2", "--tp 4 --sp", "{\"dp\": 1, \"tp\": 4, \"sp\": true}", 4,
                 "dp1 x tp4 +sp");
}

static void test_cp_to_dp(void **state) {
    (void)state;
    check_switch("--tp 2 --cp 2", "--dp 4", "{\"mesh\": {\"dp\": 4}}", 2, "dp4 x tp1");
}

/* Into the same mesh with its layout searched ("placements": "auto"): rank 0 runs the search
 * at the switch and every rank takes the layout it found; the reference runs a strategy file
 * saying "auto" throughout (the same search, before the first step). */
static void test_to_auto_placements(void **state) {
    (void)state;
#if defined(__SANITIZE_THREAD__)
    /* the search prices layouts on cpu-local, which the TSan run does not calibrate (measuring
     * it under TSan takes minutes); the release and ASan runs cover this case */
    printf("skipped under TSan: the layout search prices on an uncalibrated cpu-local\n");
    skip();
#endif
    char path[512], b_flags[600];
    snprintf(path, sizeof path, "%s/auto.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"mesh\": {\"dp\": 2, \"tp\": 2}, \"placements\": \"auto\"}\n", f);
    fclose(f);
    snprintf(b_flags, sizeof b_flags, "--strategy %s", path);
    check_switch_saying("--dp 2 --tp 2", b_flags,
                        "{\"dp\": 2, \"tp\": 2, \"placements\": \"auto\"}", 3,
                        "dp2 x tp2, placements searched", "placement rules, the rest completed)");
}

/* Into a head replicated over tp (the vocabulary tables resharded from rows to whole). */
static void test_tp_to_replicated_head(void **state) {
    (void)state;
    check_switch("--dp 2 --tp 2 --sp", "--dp 2 --tp 2 --sp --head-replicated",
                 "{\"dp\": 2, \"tp\": 2, \"sp\": true, \"head_replicated\": true}", 3,
                 "dp2 x tp2 +sp head-replicated");
}

/* Out of a pipeline with clipping: each rank's stage goes from half the parameters to all of
 * them, so the gradient norm's and AdamW's lists grow on the step after the switch (growing one
 * once freed the other: a double free). */
static void test_pp_to_dp_clip(void **state) {
    (void)state;
    check_switch("--dp 2 --pp 2 --clip 1", "--dp 4 --clip 1", "{\"dp\": 4}", 3, "dp4 x tp1");
}

/* Into offload (masters and moments to the host, AdamW there) across meshes, through --switch:
 * the control path every view's switch takes. */
static void test_dp_to_tp_offload(void **state) {
    (void)state;
    check_switch("--dp 4", "--dp 2 --tp 2 --zero 1 --offload",
                 "{\"dp\": 2, \"tp\": 2, \"zero\": 1, \"offload\": true}", 3,
                 "dp2 x tp2 zero1 offload");
}

/* Targets the job cannot take: refused before training starts, with the reason. */
static void test_refusals(void **state) {
    (void)state;
    assert_int_equal(train("--dp 4 --switch '3:{\"dp\": 3}'", "r.jsonl"), 2);
    assert_true(out_contains("needs 3 ranks but the job runs on 4"));
    assert_int_equal(
        train("--dp 4 --switch '3:{\"tp\": 4, \"dp\": 1, \"cp\": 1, \"sp\": 1}'", "r.jsonl"), 2);
    assert_true(out_contains("$.sp"));
    assert_int_equal(train("--dp 4 --switch 'soon:{\"dp\": 4}'", "r.jsonl"), 2);
    assert_true(out_contains("expected STEP:STRATEGY"));
    assert_int_equal(
        train("--dp 4 --switch '3:{\"dp\": 1, \"tp\": 4, \"cp\": 1}' --batch 8", "r.jsonl"),
        0); /* a valid one, for contrast */
}

/* A switch to the strategy the job runs already changes nothing and moves nothing (it
 * resharded every tensor, a second under ASan), and says so. */
static void hardening_switch_to_running(void **state) {
    (void)state;
    assert_int_equal(train("--dp 2 --tp 2 --switch '3:{\"dp\": 2, \"tp\": 2}'", "same.jsonl"), 0);
    assert_true(out_contains("step     3  switch to dp2 x tp2: the job runs it already; nothing "
                             "changes"));
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    while (fgets(line, sizeof line, f))
        if (strstr(line, "switched")) fail_msg("resharded anyway: %s", line);
    fclose(f);
    run_log l;
    read_log("same.jsonl", &l);
    for (int i = 0; i < STEPS; i++) assert_string_equal(l.strategy[i], "dp2 x tp2");
}

/* A --switch whose step the run never reaches is said at the end, not dropped in silence. */
static void hardening_switch_never_reached(void **state) {
    (void)state;
    assert_int_equal(train("--dp 4 --switch '50:{\"dp\": 2, \"tp\": 2}'", "late.jsonl"), 0);
    assert_true(out_contains("the switch to dp2 x tp2 for step 50 (--switch) was not applied: the "
                             "run ended at step 7"));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The report a switch prints once the new strategy has run, against the step times the job
 * logged: before, the median of the steps before the switch; after, of the 10 steps after its
 * first; the gain is their ratio. Independent of the job's arithmetic: recomputed here from
 * the log. */
static void test_switch_report(void **state) {
    (void)state;
    enum { N = 20, K = 6 };
    assert_int_equal(train_steps("--dp 4 --switch '6:{\"dp\": 2, \"tp\": 2}'", "rep.jsonl", N), 0);
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/rep.jsonl", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double ms[N];
    int n = 0;
    while (n < N && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step_ms\": ");
        assert_non_null(p);
        ms[n++] = atof(p + 11);
    }
    fclose(f);
    assert_int_equal(n, N);
    double before[K], after[10];
    memcpy(before, ms, sizeof before);
    memcpy(after, ms + K + 1, sizeof after);
    double b = median(before, K), a = median(after, 10);
    snprintf(path, sizeof path, "%s/out.txt", dir);
    f = fopen(path, "r");
    assert_non_null(f);
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        const char *p =
            strstr(line, "switch at step 6: no prediction (a direct request), measured ");
        if (!p) continue;
        found = true;
        assert_non_null(strstr(line, "step    16  switch at step 6:"));
        int pct = -1;
        char dir_word[16];
        double got_a = 0, got_b = 0;
        assert_int_equal(sscanf(strstr(p, "measured "),
                                "measured %d%% %15s (%lf ms against %lf ms)", &pct, dir_word,
                                &got_a, &got_b),
                         4);
        if (fabs(got_a - a) > 0.051 || fabs(got_b - b) > 0.051)
            fail_msg("report says %.1f ms against %.1f ms; the log gives %.3f against %.3f", got_a,
                     got_b, a, b);
        double gain = (b - a) / b;
        /* The log prints each step to 0.0005 ms, so the gain recomputed from it can differ from
         * the job's by up to 100 * 0.0005 * (1/b + a/b^2) points; add the report's rounding to
         * a whole percent (0.5). With steps of a few ms that slack is several hundredths. */
        double slack = 100 * 0.0005 * (1 / b + a / (b * b)) + 1e-9;
        if (fabs(gain) * 100 > slack)
            assert_string_equal(dir_word, gain >= 0 ? "faster" : "slower");
        if (fabs(pct - fabs(100 * gain)) > 0.5 + slack)
            fail_msg("report says %d%%; the log gives %.4f%% (slack %.4f)", pct, 100 * gain, slack);
    }
    fclose(f);
    if (!found) assert_true(out_contains("switch at step 6: "));
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ms-switch-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    return mt_write_job_files(dir, 32, text, model);
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_switch path/to/meshscope [mpi | --filter PATTERN]\n");
        return 2;
    }
    bin = argv[1];
    use_mpi = argc > 2 && !strcmp(argv[2], "mpi");
    mt_apply_filter(argc - 1, argv + 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dp_to_dp_tp),
        cmocka_unit_test(test_dp_tp_to_tp_sp),
        cmocka_unit_test(test_cp_to_dp),
        cmocka_unit_test(test_pp_to_dp_clip),
        cmocka_unit_test(test_tp_to_replicated_head),
        cmocka_unit_test(test_to_auto_placements),
        cmocka_unit_test(test_dp_to_tp_offload),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_switch_report),
        cmocka_unit_test(hardening_switch_to_running),
        cmocka_unit_test(hardening_switch_never_reached),
    };
    return cmocka_run_group_tests_name(use_mpi ? "switch (mpi)" : "switch (threads)", tests, setup,
                                       teardown);
}

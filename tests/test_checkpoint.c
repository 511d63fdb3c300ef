/* test_checkpoint.c - distributed checkpoints: resume bit for bit under the same strategy,
 * within 1e-5 under any other, refuse what is corrupt, survive a failed or killed save.
 *
 * The reference is a run that was never interrupted: it trains STEPS steps on dp2 x tp2 and
 * checkpoints every HALF steps, so its step-HALF checkpoint is the interrupted run. Resumed
 * runs continue from that checkpoint to STEPS; their losses (the JSONL log, float exact) and
 * their final weights (--save) are compared with the reference's.
 *
 * Runs the real binary (argv[1]); with argv[2] = "mpi" the training runs under mpirun. The
 * failed-save case runs in-process on one rank with an injected write fault.
 */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/io/fileio.h"
#include "engine/io/safetensors.h"
#include "engine/train/checkpoint.h"
#include "engine/train/checkpoint_internal.h"
#include "tests/testkit.h"

#define STEPS 8
#define HALF  4

static const char *bin;
static bool use_mpi;
static const char *ref_name = "full"; /* the uninterrupted run compare() reads */
static char dir[256], text[300], model[300], other_model[300];

static int run(const char *cmd_fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *cmd_fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, cmd_fmt);
    vsnprintf(cmd, sizeof cmd, cmd_fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (getenv("MS_TEST_VERBOSE")) fprintf(stderr, "%s -> %d\n", cmd, rc);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* `meshscope train` on the test's text; output in dir/out.txt. */
static int train(const char *flags) {
    int np = strstr(flags, "--dp 1 ") && !strstr(flags, "--tp") ? 1 : 4;
    char launcher[256] = "";
    if (use_mpi)
        snprintf(launcher, sizeof launcher,
                 "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader "
                 "-np %d ",
                 np);
    /* a hang (a loader waiting on a FIFO) fails the test instead of stalling it */
    return run("timeout 120 %s%s train --model %s --data %s --steps %d --batch 8 --seq 16 "
               "--log-every 1 %s %s > %s/out.txt 2>&1",
               launcher, bin, model, text, STEPS, use_mpi ? "--backend mpi" : "", flags, dir);
}

/* Whether the last output holds needle; out_contains also prints the output when not. */
static bool out_has(const char *needle, bool say) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    uint8_t *buf = NULL;
    size_t n = 0;
    ms_error err = {0};
    if (ms_read_file(path, 1 << 20, &buf, &n, &err) != MS_OK) return false;
    bool found = strstr((char *)buf, needle) != NULL;
    if (!found && say) fprintf(stderr, "output lacks '%s':\n%s\n", needle, (char *)buf);
    free(buf);
    return found;
}

static bool out_contains(const char *needle) {
    return out_has(needle, true);
}

/* The "loss" fields of a JSONL log, as written (float exact: %.9g). */
static int read_losses(const char *name, char losses[][32], int max) {
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"loss\": ");
        assert_non_null(p);
        p += 8;
        size_t k = strcspn(p, ",");
        snprintf(losses[n++], 32, "%.*s", (int)k, p);
    }
    fclose(f);
    return n;
}

/* The reference: STEPS steps on dp2 x tp2, checkpointed every HALF (made once). */
static void reference(void) {
    static bool made;
    if (made) return;
    char flags[4096];
    snprintf(flags, sizeof flags,
             "--dp 2 --tp 2 --save-dir %s/ck --save-every %d --keep 5 --log-jsonl %s/full.jsonl "
             "--save %s/full.safetensors",
             dir, HALF, dir, dir);
    assert_int_equal(train(flags), 0);
    assert_true(out_contains("committed"));
    made = true;
}

/* Resumes the reference's step-HALF checkpoint under `strategy` into res.jsonl and
 * res.safetensors; returns the exit code. */
static int resume(const char *strategy, const char *from) {
    char flags[4096];
    snprintf(flags, sizeof flags,
             "%s --resume %s --log-jsonl %s/res.jsonl --save %s/res.safetensors", strategy, from,
             dir, dir);
    char path[512];
    snprintf(path, sizeof path, "%s/res.jsonl", dir);
    remove(path);
    return train(flags);
}

/* Compares the resumed run with the reference: losses of steps HALF.. and final weights,
 * exactly (tol 0) or within a relative tolerance. */
static void compare(const char *what, double tol) {
    char full[STEPS][32], res[STEPS][32];
    char ref_log[64];
    snprintf(ref_log, sizeof ref_log, "%s.jsonl", ref_name);
    assert_int_equal(read_losses(ref_log, full, STEPS), STEPS);
    assert_int_equal(read_losses("res.jsonl", res, STEPS), STEPS - HALF);
    for (int i = 0; i < STEPS - HALF; i++) {
        double a = atof(full[HALF + i]), b = atof(res[i]);
        if (tol == 0 ? strcmp(full[HALF + i], res[i]) != 0 : fabs(a - b) > tol * fabs(a))
            fail_msg("%s: step %d loss %s, the uninterrupted run %s", what, HALF + i, res[i],
                     full[HALF + i]);
    }
    ms_st_file a = {0}, b = {0};
    ms_error err = {0};
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s.safetensors", dir, ref_name);
    snprintf(pb, sizeof pb, "%s/res.safetensors", dir);
    if (ms_safetensors_read(pa, &a, &err) != MS_OK || ms_safetensors_read(pb, &b, &err) != MS_OK)
        fail_msg("%s: %s", what, err.msg);
    /* Bit for bit (tol 0), or as the equivalence tests compare: ||x - ref|| / ||ref|| over
     * all parameters within tol, and no element off by a tenth of an AdamW step (lr 1e-3), or
     * by four steps (worst 4e-3) across precisions, where AdamW moves an element whose
     * gradient is near zero a whole step whichever its sign. */
    assert_int_equal(a.n, b.n);
    double diff2 = 0, norm2 = 0;
    for (int i = 0; i < a.n; i++) {
        const ms_st_tensor *x = &a.tensors[i], *y = ms_safetensors_find(&b, x->name);
        assert_non_null(y);
        assert_int_equal(x->numel, y->numel);
        for (int64_t k = 0; k < x->numel; k++) {
            double u = x->data[k], v = y->data[k];
            diff2 += (u - v) * (u - v), norm2 += u * u;
            bool same = tol == 0 ? memcmp(&x->data[k], &y->data[k], sizeof(float)) == 0
                                 : fabs(u - v) <= (tol > 1e-4 ? 4e-3 : 1e-4);
            if (!same)
                fail_msg("%s: final %s[%lld] = %.9g, the uninterrupted run %.9g", what, x->name,
                         (long long)k, v, u);
        }
    }
    if (sqrt(diff2) > tol * sqrt(norm2))
        fail_msg("%s: final parameters differ by %.3g relative", what, sqrt(diff2 / norm2));
    ms_safetensors_free(&a);
    ms_safetensors_free(&b);
}

static void half_ckpt(char *out, size_t len) {
    snprintf(out, len, "%s/ck/step-%08d", dir, HALF);
}

static void resume_same_strategy_bit_exact(void **state) {
    (void)state;
    reference();
    char from[512];
    half_ckpt(from, sizeof from);
    assert_int_equal(resume("--dp 2 --tp 2", from), 0);
    assert_true(out_contains("resumed"));
    compare("dp2 x tp2 resumed on dp2 x tp2", 0);
}

static void resume_other_strategies(void **state) {
    (void)state;
    reference();
    char from[512];
    half_ckpt(from, sizeof from);
    static const char *const targets[] = {
        "--dp 1 --tp 4",   "--dp 4", "--dp 2 --tp 2 --zero 2", "--dp 2 --pp 2 --micro-batches 2",
        "--dp 4 --zero 3",
    };
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        if (resume(targets[i], from) != 0) fail_msg("resume on %s failed", targets[i]);
        compare(targets[i], 1e-5);
    }
    if (!use_mpi) { /* one rank: a world of another size */
        assert_int_equal(resume("--dp 1 ", from), 0);
        compare("one rank", 1e-5);
    }
}

/* Saved under pp2 x dp2 with ZeRO-1, resumed on dp2 x tp2. */
static void save_pipeline_zero_resume_elsewhere(void **state) {
    (void)state;
    reference();
    char flags[4096];
    snprintf(flags, sizeof flags,
             "--dp 2 --pp 2 --micro-batches 2 --zero 1 --save-dir %s/ck_pp --save-every %d", dir,
             HALF);
    assert_int_equal(train(flags), 0);
    char from[512];
    snprintf(from, sizeof from, "%s/ck_pp/step-%08d", dir, HALF);
    assert_int_equal(resume("--dp 2 --tp 2", from), 0);
    compare("pp2 x dp2 zero1 resumed on dp2 x tp2", 1e-5);
}

/* bf16 mixed precision: the checkpoint holds the fp32 master weights and moments, so a bf16
 * run resumes bit for bit under its own strategy, and either precision resumes the other's
 * checkpoint (within bf16's tolerance of the uninterrupted run: test_precision's 1e-2). */
static void bf16_checkpoints(void **state) {
    (void)state;
    reference();
    char flags[4096], from[512];
    snprintf(flags, sizeof flags,
             "--dp 2 --tp 2 --zero 1 --precision bf16 --save-dir %s/ck_bf16 --save-every %d "
             "--keep 5 --log-jsonl %s/full_bf16.jsonl --save %s/full_bf16.safetensors",
             dir, HALF, dir, dir);
    assert_int_equal(train(flags), 0);
    snprintf(from, sizeof from, "%s/ck_bf16/step-%08d", dir, HALF);
    ref_name = "full_bf16";
    assert_int_equal(resume("--dp 2 --tp 2 --zero 1 --precision bf16", from), 0);
    compare("bf16 dp2 x tp2 zero1 resumed on itself", 0);
    assert_int_equal(resume("--dp 4 --zero 3 --precision bf16", from), 0);
    compare("bf16 dp2 x tp2 zero1 resumed on bf16 dp4 zero3", 1e-2);
    assert_int_equal(resume("--dp 2 --tp 2", from), 0);
    compare("bf16 checkpoint resumed in fp32", 1e-2);
    ref_name = "full";
    half_ckpt(from, sizeof from);
    assert_int_equal(resume("--dp 2 --tp 2 --precision bf16", from), 0);
    compare("fp32 checkpoint resumed in bf16", 1e-2);
}

/* A copy of the step-HALF checkpoint to damage. */
static void fresh_copy(char *out, size_t len) {
    snprintf(out, len, "%s/bad", dir);
    assert_int_equal(run("rm -rf %s && cp -r %s/ck/step-%08d %s", out, dir, HALF, out), 0);
}

static void refused(const char *what, const char *flags, const char *needle) {
    int rc = train(flags);
    if (rc == 0) fail_msg("%s: resumed anyway", what);
    if (!out_contains(needle)) fail_msg("%s: the error does not say '%s'", what, needle);
    assert_false(out_has("step     5  loss", false));
}

static void corrupt_checkpoints_refused(void **state) {
    (void)state;
    reference();
    char bad[512], flags[4096];
    fresh_copy(bad, sizeof bad);
    assert_int_equal(run("truncate -s -100 %s/rank-00001.safetensors", bad), 0);
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s", bad);
    refused("truncated shard", flags, "truncated");
    fresh_copy(bad, sizeof bad);
    assert_int_equal(run("printf 'X' | dd of=%s/rank-00000.safetensors bs=1 seek=5000 "
                         "conv=notrunc status=none",
                         bad),
                     0);
    refused("flipped byte", flags, "CRC-32");
    fresh_copy(bad, sizeof bad);
    assert_int_equal(run("rm %s/rank-00001.safetensors", bad), 0);
    refused("missing shard", flags, "is missing");
    fresh_copy(bad, sizeof bad);
    assert_int_equal(run("sed -i '0,/\"shape\":\\t\\[/s//\"shape\": [7, /' %s/meta.json", bad), 0);
    refused("mismatched metadata", flags, "checkpoint");
    fresh_copy(bad, sizeof bad);
    assert_int_equal(run("echo '{\"format\": ' > %s/meta.json", bad), 0);
    refused("broken meta.json", flags, "not valid JSON");
    half_ckpt(bad, sizeof bad);
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s --model %s", bad, other_model);
    refused("another model", flags, "another model");
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s --seed 7", bad);
    refused("another data order", flags, "same data order");
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s/ck --steps %d", dir, HALF);
    refused("past the run's total", flags, "raise --steps");
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s/nowhere", dir);
    refused("no checkpoint", flags, "no checkpoint in");
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --save-every 2");
    refused("--save-every alone", flags, "need --save-dir");
}

/* A save that fails (the disk fills up) is abandoned: the run goes on, `latest` still names
 * the previous checkpoint, no temporary folder stays, and that checkpoint still loads. */
static void failed_save(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_model_config cfg = mt_tiny_config(false, 0);
    ms_train_opts o = mt_train_opts(4, 16, 4);
    ms_text_data data;
    ms_strategy s;
    ms_strategy_init(&s, 1, 1, 1, false, &err);
    ms_trainer *t = NULL;
    ms_ckpt_saver *sv = NULL;
    char ck[512], note[512];
    snprintf(ck, sizeof ck, "%s/ck_fail", dir);
    if (!MT_OK(r, mt_repeated_text("In the beginning. ", 16, &data, &err), &err)) return;
    if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, &data, &t, &err), &err)) return;
    ms_ckpt_opts co = {.dir = ck, .keep = 3};
    MT_OK(r, ms_ckpt_saver_create(r->ctx, &co, &sv, &err), &err);
    ms_step_result res;
    MT_OK(r, ms_trainer_step(t, &res, &err), &err);
    MT_OK(r, ms_ckpt_saver_save(sv, t, NULL, &err), &err);
    MT_OK(r, ms_ckpt_saver_poll(sv, true, note, sizeof note, &err), &err);
    MT_CHECK(r, strstr(note, "committed"), "first save: %s", note);
    MT_OK(r, ms_trainer_step(t, &res, &err), &err);
    ms_io_inject_fault(MS_IO_FAULT_WRITE, 1000);
    MT_OK(r, ms_ckpt_saver_save(sv, t, NULL, &err), &err);
    MT_OK(r, ms_ckpt_saver_poll(sv, true, note, sizeof note, &err), &err);
    ms_io_inject_fault(MS_IO_FAULT_NONE, 0);
    MT_CHECK(r, strstr(note, "not saved") && strstr(note, "step 2"), "failed save: '%s'", note);
    MT_OK(r, ms_trainer_step(t, &res, &err), &err); /* training goes on */
    ms_ckpt_info info;
    MT_OK(r, ms_ckpt_describe(ck, &info, NULL, &err), &err);
    MT_CHECK(r, info.step == 1, "latest names step %lld, not the previous checkpoint (1)",
             (long long)info.step);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-00000002", ck);
    MT_CHECK(r, access(tmp, F_OK) != 0, "the failed save left %s", tmp);
    MT_OK(r, ms_ckpt_load(t, ck, &info, &err), &err);
    MT_CHECK(r, ms_trainer_step_index(t) == 1, "loaded step %lld",
             (long long)ms_trainer_step_index(t));
    ms_ckpt_saver_destroy(sv);
    ms_trainer_destroy(t);
    ms_text_data_close(&data);
}

static void failed_save_keeps_previous(void **state) {
    (void)state;
    mt_run_threads(1, failed_save, NULL);
}

/* SIGKILL while a save is being written: the previous checkpoint still loads and resumes. */
static void killed_during_save(void **state) {
    (void)state;
    char ck[512], pidfile[512];
    snprintf(ck, sizeof ck, "%s/ck_kill", dir);
    snprintf(pidfile, sizeof pidfile, "%s/pid", dir);
    assert_int_equal(run("%s train --model %s --data %s --steps 100000 --batch 8 --seq 16 --dp 2 "
                         "--tp 2 --save-dir %s --save-every 1 > %s/kill.txt 2>&1 & echo $! > %s",
                         bin, model, text, ck, dir, pidfile),
                     0);
    FILE *f = fopen(pidfile, "r");
    assert_non_null(f);
    int pid = 0;
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    /* Until a checkpoint is committed and the next one is being written. */
    bool caught = false;
    for (int i = 0; i < 3000 && !caught; i++) {
        usleep(10000);
        caught = run("test -f %s/latest && ls -d %s/.tmp-step-* >/dev/null 2>&1", ck, ck) == 0;
    }
    kill(pid, SIGKILL);
    usleep(200000);
    assert_true(caught);
    ms_ckpt_info info;
    ms_error err = {0};
    if (ms_ckpt_describe(ck, &info, NULL, &err) != MS_OK) fail_msg("%s", err.msg);
    char flags[4096];
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s --steps %lld", ck,
             (long long)info.step + 1);
    assert_int_equal(run("%s train --model %s --data %s --batch 8 --seq 16 --log-every 1 %s > "
                         "%s/out.txt 2>&1",
                         bin, model, text, flags, dir),
                     0);
    assert_true(out_contains("resumed"));
}

/* Every save is reported once, also one that the next save's own wait committed before a
 * poll saw it (with --save-every 1 on a slow disk, most of them: 2 of 6 were reported). */
static void commits_reported(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_model_config cfg = mt_tiny_config(false, 0);
    ms_train_opts o = mt_train_opts(4, 16, 4);
    ms_text_data data;
    ms_strategy s;
    ms_strategy_init(&s, 1, 1, 1, false, &err);
    ms_trainer *t = NULL;
    ms_ckpt_saver *sv = NULL;
    char ck[512], note[8192];
    snprintf(ck, sizeof ck, "%s/ck_notes", dir);
    if (!MT_OK(r, mt_repeated_text("In the beginning. ", 16, &data, &err), &err)) return;
    if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, &data, &t, &err), &err)) return;
    ms_ckpt_opts co = {.dir = ck, .keep = 10};
    MT_OK(r, ms_ckpt_saver_create(r->ctx, &co, &sv, &err), &err);
    ms_step_result res;
    /* Two saves with no poll between: the second one's wait commits the first. */
    MT_OK(r, ms_trainer_step(t, &res, &err), &err);
    MT_OK(r, ms_ckpt_saver_save(sv, t, NULL, &err), &err);
    MT_OK(r, ms_trainer_step(t, &res, &err), &err);
    MT_OK(r, ms_ckpt_saver_save(sv, t, NULL, &err), &err);
    MT_OK(r, ms_ckpt_saver_poll(sv, true, note, sizeof note, &err), &err);
    const char *one = strstr(note, "step-00000001 committed"),
               *two = strstr(note, "step-00000002 committed");
    MT_CHECK(r, one && two && one < two, "both commits, oldest first: '%s'", note);
    MT_CHECK(r, one && !strstr(one + 1, "step-00000001 committed"), "step 1 twice: '%s'", note);
    /* Said once: the next poll has nothing left to say. */
    MT_OK(r, ms_ckpt_saver_poll(sv, true, note, sizeof note, &err), &err);
    MT_CHECK(r, note[0] == '\0', "said again: '%s'", note);
    ms_ckpt_saver_destroy(sv);
    ms_trainer_destroy(t);
    ms_text_data_close(&data);
}

static void hardening_commits_reported(void **state) {
    (void)state;
    mt_run_threads(1, commits_reported, NULL);
}

/* After a live switch, a checkpoint names the strategy it was saved under (it named the one
 * the run started with): meta.json, `checkpoint info` and the resumed run's message. */
static void hardening_strategy_after_switch(void **state) {
    (void)state;
    char flags[4096];
    snprintf(flags, sizeof flags,
             "--dp 2 --tp 2 --save-dir %s/ck_sw --save-every 2 --keep 10 --switch "
             "'3:{\"dp\": 1, \"tp\": 4}'",
             dir);
    assert_int_equal(train(flags), 0);
    assert_true(out_contains("switched dp2 x tp2 -> dp1 x tp4"));
    const char *before = "{\"dp\": 2, \"tp\": 2", *after = "{\"dp\": 1, \"tp\": 4";
    ms_ckpt_info info;
    ms_error err = {0};
    char step_dir[512];
    snprintf(step_dir, sizeof step_dir, "%s/ck_sw/step-00000002", dir);
    if (ms_ckpt_describe(step_dir, &info, NULL, &err) != MS_OK) fail_msg("%s", err.msg);
    if (strncmp(info.strategy, before, strlen(before)))
        fail_msg("step 2 (before the switch) names %s", info.strategy);
    snprintf(step_dir, sizeof step_dir, "%s/ck_sw/step-00000004", dir);
    if (ms_ckpt_describe(step_dir, &info, NULL, &err) != MS_OK) fail_msg("%s", err.msg);
    if (strncmp(info.strategy, after, strlen(after)))
        fail_msg("step 4 (after the switch) names %s", info.strategy);
    assert_int_equal(run("%s checkpoint info %s/ck_sw > %s/out.txt 2>&1", bin, dir, dir), 0);
    assert_true(out_contains("strategy {\"dp\": 1, \"tp\": 4"));
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s/ck_sw --steps %d", dir, STEPS + 1);
    assert_int_equal(train(flags), 0);
    assert_true(out_contains("under {\"dp\": 1, \"tp\": 4"));
}

/* `checkpoint info` and `checkpoint export`: the export equals --save's file. */
static void info_and_export(void **state) {
    (void)state;
    reference();
    assert_int_equal(run("%s checkpoint info %s/ck > %s/out.txt 2>&1", bin, dir, dir), 0);
    assert_true(out_contains("next step 8 of 8"));
    assert_true(out_contains("exp_avg_sq"));
    assert_int_equal(run("%s checkpoint export %s/ck -o %s/exp.safetensors > %s/out.txt 2>&1", bin,
                         dir, dir, dir),
                     0);
    assert_int_equal(run("cmp -s %s/exp.safetensors %s/full.safetensors", dir, dir), 0);
    assert_int_equal(run("%s checkpoint export %s/nowhere -o %s/x.safetensors > %s/out.txt 2>&1",
                         bin, dir, dir, dir),
                     1);
    assert_true(out_contains("no checkpoint in"));
}

/* --- hardening: a checkpoint is input; every loader checks what meta.json claims --- */

typedef void (*meta_edit)(cJSON *meta, void *arg);

/* Rewrites bad/meta.json through edit. */
static void edit_meta(const char *bad, meta_edit edit, void *arg) {
    char path[600];
    snprintf(path, sizeof path, "%s/meta.json", bad);
    uint8_t *buf = NULL;
    size_t n = 0;
    ms_error err = {0};
    if (ms_read_file(path, 1 << 26, &buf, &n, &err) != MS_OK) fail_msg("%s", err.msg);
    cJSON *j = cJSON_ParseWithLength((const char *)buf, n);
    free(buf);
    assert_non_null(j);
    edit(j, arg);
    char *text_out = cJSON_Print(j);
    cJSON_Delete(j);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text_out, f);
    fclose(f);
    cJSON_free(text_out);
}

static cJSON *at(cJSON *o, const char *key, int i) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return i < 0 ? v : cJSON_GetArrayItem(v, i);
}

static void set_num(cJSON *arr, int i, double v) {
    cJSON_SetNumberValue(cJSON_GetArrayItem(arr, i), v);
}

/* The first tensor's two pieces, split along dim 0 (checked): what the edits below move. */
static cJSON *first_pieces(cJSON *meta) {
    cJSON *ps = at(at(meta, "tensors", 0), "pieces", -1);
    assert_int_equal(cJSON_GetArraySize(ps), 2);
    assert_true(at(cJSON_GetArrayItem(ps, 1), "start", 0)->valuedouble > 0);
    return ps;
}

static void shift_second_piece(cJSON *meta, void *arg) {
    (void)arg;
    cJSON *start = at(cJSON_GetArrayItem(first_pieces(meta), 1), "start", -1);
    set_num(start, 0, cJSON_GetArrayItem(start, 0)->valuedouble - 1); /* one row twice, one never */
}

static void shrink_second_piece(cJSON *meta, void *arg) {
    (void)arg;
    cJSON *shape = at(cJSON_GetArrayItem(first_pieces(meta), 1), "shape", -1);
    set_num(shape, 0, cJSON_GetArrayItem(shape, 0)->valuedouble - 1); /* the last row: in none */
}

/* The first tensor 2^40 rows long, its pieces stretched to tile it: meta.json alone is
 * consistent, but its pieces cannot fit in the files. */
static void huge_rows(cJSON *meta, void *arg) {
    (void)arg;
    double big = 1099511627776.0;
    cJSON *ps = first_pieces(meta);
    double rows1 = at(cJSON_GetArrayItem(ps, 1), "shape", 0)->valuedouble;
    set_num(at(at(meta, "tensors", 0), "shape", -1), 0, big);
    set_num(at(cJSON_GetArrayItem(ps, 0), "shape", -1), 0, big - rows1);
    set_num(at(cJSON_GetArrayItem(ps, 1), "start", -1), 0, big - rows1);
}

static void huge_dims(cJSON *meta, void *arg) {
    (void)arg;
    cJSON *shape = at(at(meta, "tensors", 0), "shape", -1);
    for (int d = 0; d < cJSON_GetArraySize(shape); d++) set_num(shape, d, 1e15);
}

/* The first c_attn weight empty ([0, 1e15, 1e15], no pieces): no elements, yet export once
 * multiplied the other two dims into the Hugging Face shape, overflowing int64. */
static void empty_huge_attn(cJSON *meta, void *arg) {
    (void)arg;
    cJSON *t;
    cJSON_ArrayForEach(t, at(meta, "tensors", -1)) {
        const char *name = at(t, "name", -1)->valuestring;
        if (!strstr(name, "attn.c_attn.weight") || strcmp(at(t, "kind", -1)->valuestring, "param"))
            continue;
        cJSON *shape = at(t, "shape", -1);
        assert_int_equal(cJSON_GetArraySize(shape), 3);
        set_num(shape, 0, 0), set_num(shape, 1, 1e15), set_num(shape, 2, 1e15);
        cJSON_ReplaceItemInObject(t, "pieces", cJSON_CreateArray());
        return;
    }
    fail_msg("no c_attn weight in meta.json");
}

/* The file entry of rank *(int *)arg says 0 bytes and CRC 0 (what a FIFO or /dev/zero has). */
static void empty_file_entry(cJSON *meta, void *arg) {
    cJSON *f = at(meta, "files", *(int *)arg);
    cJSON_SetNumberValue(at(f, "bytes", -1), 0);
    cJSON_SetNumberValue(at(f, "crc32", -1), 0);
}

typedef struct file_sum {
    int index;
    uint64_t bytes;
    uint32_t crc;
} file_sum;

static void set_file_sum(cJSON *meta, void *arg) {
    const file_sum *s = arg;
    cJSON *f = at(meta, "files", s->index);
    cJSON_SetNumberValue(at(f, "bytes", -1), (double)s->bytes);
    cJSON_SetNumberValue(at(f, "crc32", -1), (double)s->crc);
}

/* resume and export of `bad` (and info, which reads meta.json alone, where info_too) refuse
 * it, saying needle, exiting 1 (or train's non-zero): never an abort, a signal or a hang. */
static void all_refuse(const char *what, const char *bad, const char *needle, bool info_too) {
    char flags[4096];
    snprintf(flags, sizeof flags, "--dp 2 --tp 2 --resume %s", bad);
    int rc = train(flags);
    if (rc == 0 || rc >= 124) fail_msg("%s: resume exited %d", what, rc);
    if (!out_contains(needle)) fail_msg("%s: resume does not say '%s'", what, needle);
    rc = run("timeout 120 %s checkpoint export %s -o %s/x.safetensors > %s/out.txt 2>&1", bin, bad,
             dir, dir);
    if (rc != 1 || !out_contains(needle)) fail_msg("%s: export exited %d", what, rc);
    if (!info_too) return;
    rc = run("timeout 120 %s checkpoint info %s > %s/out.txt 2>&1", bin, bad, dir);
    if (rc != 1 || !out_contains(needle)) fail_msg("%s: info exited %d", what, rc);
}

/* Pieces that overlap and leave a gap (a piece moved one row onto its neighbour) once loaded
 * silently: the loader counted covered elements. Every loader now checks exact coverage. */
static void hardening_ckpt_exact_coverage(void **state) {
    (void)state;
    reference();
    char bad[512];
    fresh_copy(bad, sizeof bad);
    edit_meta(bad, shift_second_piece, NULL);
    all_refuse("overlap and gap", bad, "meta.json: tensor wte.weight (param): piece 0 (rank 0",
               true);
    assert_true(out_contains("overlap (both hold element"));
    /* one rank reads the whole tensor, where counting found as many elements as it needs */
    char flags[1024];
    snprintf(flags, sizeof flags, "--dp 1 --resume %s", bad);
    refused("overlap and gap, one rank", flags, "overlap (both hold element");
    fresh_copy(bad, sizeof bad);
    edit_meta(bad, shrink_second_piece, NULL);
    all_refuse("gap", bad, "meta.json: tensor wte.weight (param): element", true);
    assert_true(out_contains("is in none of its 2 pieces (a gap)"));
}

/* A shard stored as BF16 where meta.json says F32 was once widened and loaded silently. */
static void hardening_ckpt_dtype_disagrees(void **state) {
    (void)state;
    reference();
    char bad[512], path[600];
    fresh_copy(bad, sizeof bad);
    snprintf(path, sizeof path, "%s/rank-00000.safetensors", bad);
    ms_st_file f;
    ms_error err = {0};
    if (ms_safetensors_read(path, &f, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_st_entry *e = calloc((size_t)f.n, sizeof *e);
    for (int i = 0; i < f.n; i++) {
        e[i] = (ms_st_entry){.name = f.tensors[i].name,
                             .dtype = MS_BF16,
                             .ndim = f.tensors[i].ndim,
                             .data = f.tensors[i].data};
        memcpy(e[i].shape, f.tensors[i].shape, sizeof e[i].shape);
    }
    if (ms_safetensors_write(path, e, f.n, NULL, 0, &err) != MS_OK) fail_msg("%s", err.msg);
    free(e);
    ms_safetensors_free(&f);
    file_sum sum = {.index = 0};
    if (ckpt_file_sum(path, &sum.bytes, &sum.crc, &err) != MS_OK) fail_msg("%s", err.msg);
    edit_meta(bad, set_file_sum, &sum);
    all_refuse("BF16 shard, F32 meta.json", bad, "as BF16, meta.json says F32", false);
}

/* A file entry of rank 2, which writes no piece, 0 bytes long. */
static void add_empty_file(cJSON *meta, void *arg) {
    (void)arg;
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "name", "rank-00002.safetensors");
    cJSON_AddNumberToObject(f, "rank", 2);
    cJSON_AddNumberToObject(f, "bytes", 0);
    cJSON_AddNumberToObject(f, "crc32", 0);
    cJSON_AddItemToArray(at(meta, "files", -1), f);
}

/* A shard that is a FIFO or /dev/zero, with meta.json saying 0 bytes, once hung resume and
 * export (its size matched; reading never ended); so would a FIFO for meta.json or latest.
 * Pieces cannot fit in 0 bytes; a file that holds none is still opened only if regular. */
static void hardening_ckpt_non_regular_files(void **state) {
    (void)state;
    reference();
    char bad[512];
    int second = 1;
    fresh_copy(bad, sizeof bad);
    edit_meta(bad, empty_file_entry, &second);
    assert_int_equal(
        run("rm %s/rank-00001.safetensors && mkfifo %s/rank-00001.safetensors", bad, bad), 0);
    all_refuse("FIFO shard", bad, "does not fit in rank-00001.safetensors, 0 bytes", true);
    assert_int_equal(run("rm %s/rank-00001.safetensors && ln -s /dev/zero "
                         "%s/rank-00001.safetensors",
                         bad, bad),
                     0);
    all_refuse("shard linked to /dev/zero", bad, "does not fit in rank-00001.safetensors", true);
    fresh_copy(bad, sizeof bad);
    edit_meta(bad, add_empty_file, NULL);
    assert_int_equal(run("mkfifo %s/rank-00002.safetensors", bad), 0);
    int rc = run("timeout 120 %s checkpoint export %s -o %s/x.safetensors > %s/out.txt 2>&1", bin,
                 bad, dir, dir);
    if (rc != 1 || !out_contains("rank-00002.safetensors: is a FIFO, not a regular file"))
        fail_msg("FIFO shard of no piece: export exited %d", rc);
    assert_int_equal(run("rm %s/rank-00002.safetensors && ln -s /dev/zero "
                         "%s/rank-00002.safetensors",
                         bad, bad),
                     0);
    rc = run("timeout 120 %s checkpoint export %s -o %s/x.safetensors > %s/out.txt 2>&1", bin, bad,
             dir, dir);
    if (rc != 1 || !out_contains("is a character device, not a regular file"))
        fail_msg("/dev/zero shard of no piece: export exited %d", rc);
    fresh_copy(bad, sizeof bad);
    assert_int_equal(run("rm %s/meta.json && mkfifo %s/meta.json", bad, bad), 0);
    all_refuse("FIFO meta.json", bad, "meta.json: is a FIFO, not a regular file", true);
    assert_int_equal(run("rm -rf %s && mkdir %s && mkfifo %s/latest", bad, bad, bad), 0);
    rc = run("timeout 120 %s checkpoint info %s > %s/out.txt 2>&1", bin, bad, dir);
    if (rc != 1 || !out_contains("latest: is a FIFO")) fail_msg("FIFO latest: exit %d", rc);
}

/* Shapes too large to hold: 2^40 rows (export once aborted allocating 2^51 bytes) and dims of
 * 1e15 (an int64 overflow counting elements) are refused from meta.json and the files' sizes
 * before anything is allocated. */
static void hardening_ckpt_huge_shapes(void **state) {
    (void)state;
    reference();
    char bad[512];
    fresh_copy(bad, sizeof bad);
    edit_meta(bad, huge_rows, NULL);
    int rc = run("timeout 120 %s checkpoint export %s -o %s/x.safetensors > %s/out.txt 2>&1", bin,
                 bad, dir, dir);
    if (rc != 1 || !out_contains("does not fit in rank-00000.safetensors"))
        fail_msg("2^40 rows: export exited %d", rc);
    fresh_copy(bad, sizeof bad);
    edit_meta(bad, huge_dims, NULL);
    rc = run("timeout 120 %s checkpoint export %s -o %s/x.safetensors > %s/out.txt 2>&1", bin, bad,
             dir, dir);
    if (rc != 1 || !out_contains("its shape has more bytes than a file can hold"))
        fail_msg("dims of 1e15: export exited %d", rc);
    fresh_copy(bad, sizeof bad);
    edit_meta(bad, empty_huge_attn, NULL);
    rc = run("timeout 120 %s checkpoint export %s -o %s/x.safetensors > %s/out.txt 2>&1", bin, bad,
             dir, dir);
    if (rc != 1 || !out_contains("its shape has more bytes than a file can hold"))
        fail_msg("an empty tensor of huge dims: export exited %d", rc);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ms-ckpt-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char other_dir[300];
    snprintf(other_dir, sizeof other_dir, "%s/other", dir);
    char other_text[300];
    if (mkdir(other_dir, 0777) != 0 || mt_write_job_files(other_dir, 48, other_text, other_model))
        return -1;
    return mt_write_job_files(dir, 32, text, model);
}

static int teardown(void **state) {
    (void)state;
    return run("rm -rf %s", dir) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_checkpoint path/to/meshscope [mpi | --filter PATTERN]\n");
        return 2;
    }
    bin = argv[1];
    use_mpi = argc > 2 && !strcmp(argv[2], "mpi");
    mt_apply_filter(argc - 1, argv + 1); /* test_checkpoint BIN --filter PATTERN */
    const struct CMUnitTest all[] = {
        cmocka_unit_test(resume_same_strategy_bit_exact),
        cmocka_unit_test(resume_other_strategies),
        cmocka_unit_test(save_pipeline_zero_resume_elsewhere),
        cmocka_unit_test(bf16_checkpoints),
        cmocka_unit_test(corrupt_checkpoints_refused),
        cmocka_unit_test(failed_save_keeps_previous),
        cmocka_unit_test(killed_during_save),
        cmocka_unit_test(info_and_export),
        cmocka_unit_test(hardening_commits_reported),
        cmocka_unit_test(hardening_strategy_after_switch),
        cmocka_unit_test(hardening_ckpt_exact_coverage),
        cmocka_unit_test(hardening_ckpt_dtype_disagrees),
        cmocka_unit_test(hardening_ckpt_non_regular_files),
        cmocka_unit_test(hardening_ckpt_huge_shapes),
    };
    const struct CMUnitTest mpi[] = {
        cmocka_unit_test(resume_same_strategy_bit_exact),
        cmocka_unit_test(resume_other_strategies),
        cmocka_unit_test(bf16_checkpoints),
    };
    if (use_mpi) return cmocka_run_group_tests_name("checkpoint (mpi)", mpi, setup, teardown);
    return cmocka_run_group_tests_name("checkpoint (threads)", all, setup, teardown);
}

/* cmd_run.c - `meshscope run [--max-restarts K] [--world N] [--grace S] -- COMMAND...`:
 * supervises a training job and restarts it from its latest checkpoint when it fails.
 *
 * COMMAND is a `meshscope train ... --save-dir DIR` command line, as typed (possibly behind
 * `mpirun -np M`); its first start runs it unchanged, its own --resume included. When it exits
 * non-zero or dies of a signal, the supervisor restarts it with --resume of the newest
 * checkpoint in DIR that verifies (a damaged newer one is skipped, with its reason), else of
 * the command's own --resume, else from scratch, at most K times. Exit code 2 is the job
 * refusing its command line: that is reported, never retried. With --world N smaller than the
 * job's world (ranks lost for good), the restart asks the planner for the fastest strategy
 * the engine runs on N ranks of this machine, writes it to DIR/run-strategy.json, and restarts
 * under it (--strategy; `-np N` under mpirun): the checkpoint is resharded on load
 * (docs/checkpoints.md). SIGTERM, SIGINT and SIGHUP are forwarded to the job (cli/child.h),
 * which is then not restarted; one that has not ended S seconds later is killed.
 *
 * The flags read from COMMAND (--save-dir, --resume, --model, --batch, --seq, the strategy
 * flags) are taken as `--flag VALUE` or `--flag=VALUE`, the last one given winning, as the
 * option parser of `meshscope train` takes them.
 *
 * Exit codes: the job's last exit code (0 when it finished; 128 + N after signal N), 2 usage
 * errors (its own, or the job's).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/child.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/io/fileio.h"
#include "engine/model/config.h"
#include "engine/plan/cluster.h"
#include "engine/plan/search.h"
#include "engine/train/checkpoint.h"
#include "job/job.h"

/* Whether argument a is `flag` itself (*inline_value NULL: the value, if any, is the next
 * argument) or `flag=VALUE` (*inline_value points at VALUE). */
static bool is_flag(const char *a, const char *flag, const char **inline_value) {
    size_t k = strlen(flag);
    if (strncmp(a, flag, k) || (a[k] && a[k] != '=')) return false;
    *inline_value = a[k] == '=' ? a + k + 1 : NULL;
    return true;
}

/* Whether a is a strategy flag a replanned restart replaces: --strategy, or the flag of a
 * setting (MS_STRATEGY_SETTINGS), either form; *next_value says whether its value is the
 * next argument. */
static bool is_strategy_flag(const char *a, bool *next_value) {
    const char *v;
    *next_value = false;
    if (is_flag(a, "--strategy", &v)) {
        *next_value = !v;
        return true;
    }
    char flag[48] = "--";
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const ms_setting *st = &ms_settings[i];
        ms_setting_flag(st, flag + 2, sizeof flag - 2);
        if (!is_flag(a, flag, &v)) continue;
        *next_value = !v && st->kind != MS_SET_KIND_BOOL;
        return true;
    }
    return false;
}

/* The value of the last `flag VALUE` or `flag=VALUE` in cmd, else dflt. */
static const char *flag_value(int n, char **cmd, const char *flag, const char *dflt) {
    const char *found = dflt, *v;
    for (int i = 0; i < n; i++) {
        if (!is_flag(cmd[i], flag, &v)) continue;
        if (v)
            found = v;
        else if (i + 1 < n)
            found = cmd[++i];
    }
    return found;
}

/* The job's world: mpirun's -np, else the product of the strategy flags (threads). */
static int job_world(int n, char **cmd) {
    const char *np = flag_value(n, cmd, "-np", flag_value(n, cmd, "-n", NULL));
    if (np) return atoi(np);
    int w = 1;
    static const char *const dims[] = {"--dp", "--tp", "--pp", "--cp"};
    for (int d = 0; d < 4; d++) w *= atoi(flag_value(n, cmd, dims[d], "1"));
    return w;
}

/* Writes a replanned strategy into the job's folder as its owner for that moment (the
 * folder's lock, ms_dir_lock): never into a folder another job has taken meanwhile. */
static ms_status write_strategy(const char *dir, const char *json, char *path, size_t len,
                                ms_error *err) {
    int lock;
    MS_CHECK(ms_dir_lock(dir, &lock, err));
    snprintf(path, len, "%s/run-strategy.json", dir);
    FILE *f = fopen(path, "w");
    bool ok = f && fprintf(f, "%s\n", json) > 0;
    if (f && fclose(f) != 0) ok = false;
    ms_dir_unlock(lock);
    return ok ? MS_OK : ms_fail(err, MS_ERR_IO, "cannot write %.700s", path);
}

/* The fastest strategy the engine runs on `world` ranks for the job's model and batch, as a
 * strategy file in dir; its name in `name`. The model: --model's config, else the program's
 * own (meshscope_main_with_model). */
static int replan(int n, char **cmd, int world, const char *dir, char *path, size_t len, char *name,
                  size_t name_len) {
    const char *model = flag_value(n, cmd, "--model", NULL);
    int batch = atoi(flag_value(n, cmd, "--batch", "8"));
    int seq = atoi(flag_value(n, cmd, "--seq", "64"));
    ms_error err = {0};
    ms_model_config cfg = {0};
    const ms_model_def *own = model ? NULL : job_model();
    if (!own && (!model || ms_config_load(model, &cfg, &err) != MS_OK)) {
        fprintf(stderr, "meshscope run: cannot replan: %s\n",
                model ? err.msg : "the command has no --model");
        return -1;
    }
    ms_cluster *cl = calloc(1, sizeof *cl);
    ms_plan_memo *memo = ms_plan_memo_create();
    ms_plan_result res = {0};
    int rc = -1;
    if (cl && ms_cluster_resolve("cpu-local", false, NULL, cl, &err) == MS_OK) {
        ms_plan_problem pb = {.model = cfg,
                              .devices = world,
                              .global_batch = batch,
                              .seq = seq,
                              .dtype = MS_PLAN_FP32,
                              .cluster = cl,
                              .engine_workloads = true,
                              .memo = memo,
                              .def = own};
        ms_plan_fixed fp32; /* as the built-in models' replan: fp32 (a def's search takes both) */
        ms_plan_fixed_none(&fp32);
        fp32.s.precision = MS_PRECISION_FP32;
        fp32.mask |= 1u << MS_SET_precision;
        ms_plan_search_opts so = {.fixed = own ? &fp32 : NULL, .keep = 1, .executable_only = true};
        if (ms_plan_search(&pb, &so, &res, &err) == MS_OK && res.n_cands > 0) {
            char json[MS_STRATEGY_JSON_MAX];
            ms_strategy_short_json(&res.cands[0].s, json, sizeof json);
            snprintf(name, name_len, "%s", res.cands[0].text);
            if (write_strategy(dir, json, path, len, &err) == MS_OK) rc = 0;
        } else if (!*err.msg) {
            snprintf(err.msg, sizeof err.msg, "no strategy the engine runs fits");
        }
    }
    if (rc != 0) fprintf(stderr, "meshscope run: cannot replan on %d ranks: %s\n", world, err.msg);
    ms_plan_result_free(&res);
    ms_plan_memo_destroy(memo);
    free(cl);
    return rc;
}

/* The restarted command line: --resume CHECKPOINT (in place of the command's own, when
 * given) and, when replanned, --strategy FILE in place of the strategy flags and -np N. Owned
 * strings are not made: the array points into cmd and into the given strings. */
static char **restart_line(int n, char **cmd, const char *resume, const char *strategy, int world,
                           char *np_text) {
    char **out = calloc((size_t)n + 8, sizeof *out);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const char *v;
        if (resume && is_flag(cmd[i], "--resume", &v)) {
            if (!v && i + 1 < n) i++;
            continue;
        }
        bool next_value;
        if (strategy && is_strategy_flag(cmd[i], &next_value)) {
            if (next_value && i + 1 < n) i++;
            continue;
        }
        out[k++] = cmd[i];
        if (strategy && (!strcmp(cmd[i], "-np") || !strcmp(cmd[i], "-n")) && i + 1 < n) {
            snprintf(np_text, 16, "%d", world);
            out[k++] = np_text;
            i++;
        }
    }
    if (resume) out[k++] = "--resume", out[k++] = (char *)resume;
    if (strategy) out[k++] = "--strategy", out[k++] = (char *)strategy;
    out[k] = NULL;
    return out;
}

/* Runs argv to its end (an MPI launcher in a process group of its own); returns its exit
 * code, or 128 + the signal that ended it. */
static int run_child(char **argv, int grace_s) {
    ms_child c;
    if (ms_child_start(argv, ms_child_is_launcher(argv[0]), -1, &c) != 0) {
        fprintf(stderr, "meshscope run: cannot start %s: %s\n", argv[0], strerror(errno));
        return 127;
    }
    return ms_child_wait(&c, grace_s);
}

/* Where a restart resumes: the newest checkpoint of dir that verifies (saying which newer
 * ones it skipped and why), else the command's own --resume, else nothing (from scratch). */
static const char *restart_from(const char *dir, const char *own, ms_ckpt_info *info) {
    ms_strbuf skipped = {0};
    ms_error err = {0};
    ms_status st = ms_ckpt_newest_intact(dir, info, &skipped, &err);
    for (char *line = skipped.p, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        fprintf(stderr, "meshscope run: skipping a damaged checkpoint: %s\n", line);
    }
    free(skipped.p);
    return st == MS_OK ? info->path : own;
}

int ms_cmd_run(int argc, char **argv) {
    int max_restarts = 3, world = 0, grace_s = 30;
    const ms_option opts[] = {
        MS_INT("max-restarts", "K", &max_restarts, 0, 1000,
               "restarts before giving up (default 3)"),
        MS_INT("world", "N", &world, 1, 1 << 20,
               "ranks left after a failure: restarts replan the strategy for N ranks"),
        MS_INT("grace", "S", &grace_s, 0, 3600,
               "seconds the job has to end after a signal run forwards (default 30)"),
    };
    const ms_opts_cmd c = {
        .name = "run",
        .synopsis = "[--max-restarts K] [--world N] [--grace S] -- meshscope train ... --save-dir "
                    "DIR",
        .about = "Runs a training job and restarts it from its newest intact checkpoint when it\n"
                 "fails (not after exit 2, a usage error, nor after a signal it was sent);\n"
                 "with --world N, restarts under the planner's best strategy for N ranks.",
        MS_OPTS_TABLE(opts)};
    /* The job's command starts after "--" (which the option parser would also stop at). */
    int dash = 1;
    while (dash < argc && strcmp(argv[dash], "--")) dash++;
    bool help = false;
    for (int i = 1; i < dash; i++) help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    int n = argc - dash - 1;
    char **cmd = argv + dash + 1;
    if (!help && (dash >= argc || n < 1)) {
        fprintf(stderr, "meshscope run: give the job after --, e.g.\n  meshscope run "
                        "--max-restarts 3 -- meshscope train --model M --data D --save-dir ck\n");
        return 2;
    }
    int rc = ms_opts_run(&c, dash, argv, NULL, 0, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    const char *dir = flag_value(n, cmd, "--save-dir", NULL);
    if (!dir) {
        fprintf(stderr, "meshscope run: the job must checkpoint to be restarted: add --save-dir "
                        "DIR (and --save-every N) to its command\n");
        return 2;
    }
    int was = job_world(n, cmd);
    const char *own_resume = flag_value(n, cmd, "--resume", NULL);
    char strategy[1200] = "", name[MS_STRATEGY_NAME_MAX] = "", np_text[16];
    ms_ckpt_info info; /* where a restart resumes: its line points into it */
    char **line = restart_line(n, cmd, NULL, NULL, 0, np_text); /* the command as given */
    for (int attempt = 0;; attempt++) {
        rc = run_child(line, grace_s);
        free(line);
        if (rc == 0) return 0;
        if (ms_child_forwarded()) {
            fprintf(stderr,
                    "meshscope run: stopped by signal %d; the job ended (%s %d), not "
                    "restarted\n",
                    ms_child_forwarded(), rc > 128 ? "signal" : "exit", rc > 128 ? rc - 128 : rc);
            return rc;
        }
        if (rc == 2) {
            fprintf(stderr, "meshscope run: the job refused its command line (exit 2, see its "
                            "message above); not restarted: fix the command\n");
            return 2;
        }
        if (attempt >= max_restarts) {
            fprintf(stderr, "meshscope run: the job failed (exit %d); gave up after %d restart%s\n",
                    rc, attempt, attempt == 1 ? "" : "s");
            return rc;
        }
        const char *resume = restart_from(dir, own_resume, &info);
        bool shrink = world > 0 && world < was && !*strategy;
        if (shrink && replan(n, cmd, world, dir, strategy, sizeof strategy, name, sizeof name))
            return rc;
        char from[1200] = "from the start (no checkpoint yet)",
             under[MS_STRATEGY_NAME_MAX + 64] = "";
        if (resume == info.path)
            snprintf(from, sizeof from, "from %s (step %lld)", info.path, (long long)info.step);
        else if (resume)
            snprintf(from, sizeof from, "from %s (its own --resume: no intact checkpoint in %s)",
                     resume, dir);
        if (*strategy)
            snprintf(under, sizeof under, " under %s on %d rank%s", name, world,
                     world == 1 ? "" : "s");
        fprintf(stderr, "meshscope run: the job failed (%s %d); restart %d of %d %s%s\n",
                rc > 128 ? "signal" : "exit", rc > 128 ? rc - 128 : rc, attempt + 1, max_restarts,
                from, under);
        line = restart_line(n, cmd, resume, *strategy ? strategy : NULL, world, np_text);
    }
}

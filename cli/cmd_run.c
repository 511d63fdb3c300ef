/* cmd_run.c - `meshscope run [--max-restarts K] [--world N] -- COMMAND...`: supervises a
 * training job and restarts it from its latest checkpoint when it fails.
 *
 * COMMAND is a `meshscope train ... --save-dir DIR` command line, as typed (possibly behind
 * `mpirun -np M`). When it exits non-zero or dies of a signal, the supervisor restarts it with
 * `--resume DIR` once DIR holds a complete checkpoint (from scratch before that), at most K
 * times. With --world N smaller than the job's world (ranks lost for good), the restart asks
 * the planner for the fastest strategy the engine runs on N ranks of this machine, writes it
 * to DIR/run-strategy.json, and restarts under it (--strategy; `-np N` under mpirun): the
 * checkpoint is resharded on load (docs/checkpoints.md).
 *
 * Exit codes: the job's last exit code (0 when it finished), 2 usage errors.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/model/config.h"
#include "engine/plan/cluster.h"
#include "engine/plan/search.h"
#include "engine/train/checkpoint.h"

/* Whether a is a strategy flag a replanned restart replaces: --strategy, or the flag of a
 * setting (MS_STRATEGY_SETTINGS); *takes_value says whether a value follows it. */
static bool is_strategy_flag(const char *a, bool *takes_value) {
    *takes_value = true;
    if (!strcmp(a, "--strategy")) return true;
    char flag[48];
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const ms_setting *st = &ms_settings[i];
        if (strncmp(a, "--", 2) || strcmp(a + 2, ms_setting_flag(st, flag, sizeof flag))) continue;
        *takes_value = st->kind != MS_SET_KIND_BOOL;
        return true;
    }
    return false;
}

static const char *flag_value(int n, char **cmd, const char *flag, const char *dflt) {
    for (int i = 0; i + 1 < n; i++)
        if (!strcmp(cmd[i], flag)) return cmd[i + 1];
    return dflt;
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

/* The fastest strategy the engine runs on `world` ranks for the job's model and batch, as a
 * strategy file in dir; its name in `name`. */
static int replan(int n, char **cmd, int world, const char *dir, char *path, size_t len, char *name,
                  size_t name_len) {
    const char *model = flag_value(n, cmd, "--model", NULL);
    int batch = atoi(flag_value(n, cmd, "--batch", "8"));
    int seq = atoi(flag_value(n, cmd, "--seq", "64"));
    ms_error err = {0};
    ms_model_config cfg;
    if (!model || ms_config_load(model, &cfg, &err) != MS_OK) {
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
                              .memo = memo};
        ms_plan_search_opts so = {.keep = 1, .executable_only = true};
        if (ms_plan_search(&pb, &so, &res, &err) == MS_OK && res.n_cands > 0) {
            char json[MS_STRATEGY_JSON_MAX];
            ms_strategy_short_json(&res.cands[0].s, json, sizeof json);
            snprintf(path, len, "%s/run-strategy.json", dir);
            snprintf(name, name_len, "%s", res.cands[0].text);
            FILE *f = fopen(path, "w");
            if (f && fprintf(f, "%s\n", json) > 0 && fclose(f) == 0)
                rc = 0;
            else
                snprintf(err.msg, sizeof err.msg, "cannot write %.700s", path);
        }
    }
    if (rc != 0) fprintf(stderr, "meshscope run: cannot replan on %d ranks: %s\n", world, err.msg);
    ms_plan_result_free(&res);
    ms_plan_memo_destroy(memo);
    free(cl);
    return rc;
}

/* The restarted command line: --resume DIR (when a checkpoint exists) and, when replanned,
 * --strategy FILE in place of the strategy flags and -np N. Owned strings are not made: the
 * array points into cmd and into the given strings. */
static char **restart_line(int n, char **cmd, const char *resume, const char *strategy, int world,
                           char *np_text) {
    char **out = calloc((size_t)n + 8, sizeof *out);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(cmd[i], "--resume") && i + 1 < n) {
            i++;
            continue;
        }
        bool takes_value;
        if (strategy && is_strategy_flag(cmd[i], &takes_value)) {
            if (takes_value && i + 1 < n) i++;
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

/* Runs argv to its end; returns its exit code, or 128 + the signal that ended it. */
static int run_child(char **argv) {
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "meshscope run: cannot start %s: %s\n", argv[0], strerror(errno));
        return 127;
    }
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "meshscope run: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int ms_cmd_run(int argc, char **argv) {
    int max_restarts = 3, world = 0;
    const ms_option opts[] = {
        MS_INT("max-restarts", "K", &max_restarts, 0, 1000,
               "restarts before giving up (default 3)"),
        MS_INT("world", "N", &world, 1, 1 << 20,
               "ranks left after a failure: restarts replan the strategy for N ranks"),
    };
    const ms_opts_cmd c = {
        .name = "run",
        .synopsis = "[--max-restarts K] [--world N] -- meshscope train ... --save-dir DIR",
        .about = "Runs a training job and restarts it from its latest checkpoint when it fails;\n"
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
    char strategy[1200] = "", name[MS_STRATEGY_NAME_MAX] = "", np_text[16];
    char **line = restart_line(n, cmd, NULL, NULL, 0, np_text);
    for (int attempt = 0;; attempt++) {
        rc = run_child(line);
        free(line);
        if (rc == 0) return 0;
        if (attempt >= max_restarts) {
            fprintf(stderr, "meshscope run: the job failed (exit %d); gave up after %d restart%s\n",
                    rc, attempt, attempt == 1 ? "" : "s");
            return rc;
        }
        ms_ckpt_info info;
        ms_error err = {0};
        bool have = ms_ckpt_describe(dir, &info, NULL, &err) == MS_OK;
        bool shrink = world > 0 && world < was && !*strategy;
        if (shrink && replan(n, cmd, world, dir, strategy, sizeof strategy, name, sizeof name))
            return rc;
        char from[1200] = "from the start (no checkpoint yet)",
             under[MS_STRATEGY_NAME_MAX + 64] = "";
        if (have)
            snprintf(from, sizeof from, "from %s (step %lld)", info.path, (long long)info.step);
        if (*strategy)
            snprintf(under, sizeof under, " under %s on %d rank%s", name, world,
                     world == 1 ? "" : "s");
        fprintf(stderr, "meshscope run: the job failed (%s %d); restart %d of %d %s%s\n",
                rc > 128 ? "signal" : "exit", rc > 128 ? rc - 128 : rc, attempt + 1, max_restarts,
                from, under);
        line = restart_line(n, cmd, have ? dir : NULL, *strategy ? strategy : NULL, world, np_text);
    }
}

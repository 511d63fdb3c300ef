/* session.c - shared flags and model set-up for train, eval and explain. */
#include "cli/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "engine/comm/comm_mpi.h"
#include "engine/kernels/kernels.h"

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int run_opts_parse(const char *cmd, int argc, char **argv, const char *allowed, run_opts *o) {
    *o = (run_opts){.dp = 1,
                    .tp = 1,
                    .cp = 1,
                    .backend = ms_mpi_launched() ? MS_BACKEND_MPI : MS_BACKEND_THREADS,
                    .steps = 100,
                    .batch = 8,
                    .seq = 64,
                    .seed = 1337,
                    .lr = 1e-3,
                    .min_lr = 1e-4,
                    .warmup = 10,
                    .weight_decay = 0.0,
                    .clip = 1.0,
                    .val_fraction = 0.1,
                    .batches = 4,
                    .log_every = 10,
                    .eval_every = 0,
                    .advise_threshold = 0.10};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        char key[40];
        snprintf(key, sizeof key, "%s ", f);
        bool ok_flag = strncmp(f, "--", 2) == 0 && strstr(allowed, f) != NULL;
        if (ok_flag) {
            /* whole-word match */
            const char *at = strstr(allowed, f);
            size_t n = strlen(f);
            ok_flag = (at[n] == ' ' || at[n] == '\0') && (at == allowed || at[-1] == ' ');
        }
        if (!ok_flag) {
            fprintf(stderr, "meshscope %s: unknown option '%s'\nvalid options: %s\n", cmd, f,
                    allowed);
            return 2;
        }
        if (!strcmp(f, "--sp") || !strcmp(f, "--tui")) {
            if (f[2] == 's')
                o->sp = true;
            else
                o->tui = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "meshscope %s: %s needs a value\n", cmd, f);
            return 2;
        }
        const char *v = argv[++i];
        long n = 0;
        double d = 0;
        bool good = true;
        if (!strcmp(f, "--model"))
            o->model = v;
        else if (!strcmp(f, "--data"))
            o->data = v;
        else if (!strcmp(f, "--strategy"))
            o->strategy_file = v;
        else if (!strcmp(f, "--log-jsonl"))
            o->log_jsonl = v;
        else if (!strcmp(f, "--save"))
            o->save = v;
        else if (!strcmp(f, "--trace-from"))
            good = parse_int(v, 0, 100000000, &n), o->trace_from = (int)n;
        else if (!strcmp(f, "--trace"))
            o->trace = v;
        else if (!strcmp(f, "--web"))
            o->web = v;
        else if (!strcmp(f, "--switch"))
            o->switch_spec = v;
        else if (!strcmp(f, "--memory-cap"))
            good = parse_double(v, 0, 1e9, &d), o->memory_cap_mib = d;
        else if (!strcmp(f, "--advise-threshold"))
            good = parse_double(v, 0, 10, &d), o->advise_threshold = d;
        else if (!strcmp(f, "--checkpoint"))
            o->checkpoint = v;
        else if (!strcmp(f, "--backend")) {
            ms_error e;
            if (ms_backend_parse(v, &o->backend, &e) != MS_OK) {
                fprintf(stderr, "meshscope %s: %s\n", cmd, e.msg);
                return 2;
            }
        } else if (!strcmp(f, "--dp"))
            good = parse_int(v, 1, 4096, &n), o->dp = (int)n;
        else if (!strcmp(f, "--tp"))
            good = parse_int(v, 1, 4096, &n), o->tp = (int)n;
        else if (!strcmp(f, "--cp"))
            good = parse_int(v, 1, 4096, &n), o->cp = (int)n;
        else if (!strcmp(f, "--threads"))
            good = parse_int(v, 0, 1024, &n), o->threads = (int)n;
        else if (!strcmp(f, "--steps"))
            good = parse_int(v, 0, 100000000, &n), o->steps = (int)n;
        else if (!strcmp(f, "--batch"))
            good = parse_int(v, 1, 1 << 20, &n), o->batch = (int)n;
        else if (!strcmp(f, "--seq"))
            good = parse_int(v, 1, 1 << 20, &n), o->seq = (int)n;
        else if (!strcmp(f, "--warmup"))
            good = parse_int(v, 0, 100000000, &n), o->warmup = (int)n;
        else if (!strcmp(f, "--sample"))
            good = parse_int(v, 0, 100000, &n), o->sample = (int)n;
        else if (!strcmp(f, "--batches"))
            good = parse_int(v, 1, 100000000, &n), o->batches = (int)n;
        else if (!strcmp(f, "--log-every"))
            good = parse_int(v, 1, 100000000, &n), o->log_every = (int)n;
        else if (!strcmp(f, "--eval-every"))
            good = parse_int(v, 0, 100000000, &n), o->eval_every = (int)n;
        else if (!strcmp(f, "--seed"))
            good = parse_int(v, 0, 0x7fffffffL, &n), o->seed = (uint64_t)n;
        else if (!strcmp(f, "--lr"))
            good = parse_double(v, 0, 10, &d), o->lr = d;
        else if (!strcmp(f, "--min-lr"))
            good = parse_double(v, 0, 10, &d), o->min_lr = d;
        else if (!strcmp(f, "--weight-decay"))
            good = parse_double(v, 0, 10, &d), o->weight_decay = d;
        else if (!strcmp(f, "--clip"))
            good = parse_double(v, 0, 1e9, &d), o->clip = d;
        else if (!strcmp(f, "--val-fraction"))
            good = parse_double(v, 0, 0.9, &d), o->val_fraction = d;
        if (!good) {
            fprintf(stderr, "meshscope %s: bad value '%s' for %s\n", cmd, v, f);
            return 2;
        }
    }
    if (strstr(allowed, "--model") && !o->model) {
        fprintf(stderr, "meshscope %s: --model CONFIG.json is required\n", cmd);
        return 2;
    }
    if (o->min_lr > o->lr) o->min_lr = o->lr;
    return 0;
}

ms_status session_strategy(const run_opts *o, const ms_model_config *cfg, ms_strategy *s,
                           ms_error *err) {
    if (o->strategy_file)
        MS_CHECK(ms_strategy_load(o->strategy_file, s, err));
    else
        MS_CHECK(ms_strategy_init(s, o->dp, o->tp, o->cp, o->sp, err));
    return ms_strategy_check_model(s, cfg->n_head, cfg->n_embd, err);
}

ms_status session_open(ms_ctx *ctx, const run_opts *o, bool keep_logits, session *s,
                       ms_error *err) {
    ms_model_config cfg;
    ms_strategy strat;
    MS_CHECK(ms_config_load(o->model, &cfg, err));
    MS_CHECK(session_strategy(o, &cfg, &strat, err));
    return session_open_strategy(ctx, o, &strat, keep_logits, s, err);
}

ms_status session_open_strategy(ms_ctx *ctx, const run_opts *o, const ms_strategy *strat,
                                bool keep_logits, session *s, ms_error *err) {
    memset(s, 0, sizeof *s);
    MS_CHECK(ms_config_load(o->model, &s->cfg, err));
    s->strat = *strat;
    MS_CHECK(ms_strategy_check_model(&s->strat, s->cfg.n_head, s->cfg.n_embd, err));
    MS_CHECK(ms_strategy_mesh(&s->strat, &s->mesh, err));
    MS_CHECK(ms_mesh_check_world(&s->mesh, ctx->world_size, err));
    if (o->batch % s->strat.dp)
        return ms_fail(err, MS_ERR_INVALID, "--batch %d is not divisible by dp %d", o->batch,
                       s->strat.dp);
    MS_CHECK(ms_dmesh_create(ctx, &s->mesh, &s->dm, err));
    MS_CHECK(ms_model_build(&s->cfg, o->batch, o->seq, &s->model, err));
    if (keep_logits) ms_graph_keep(s->model.g, s->model.logits);
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &s->strat, .seed = o->seed};
    return ms_program_compile(s->model.g, s->dm, &co, &s->prog, err);
}

void session_close(session *s) {
    ms_program_destroy(s->prog);
    ms_model_free(&s->model);
    ms_dmesh_destroy(s->dm);
    ms_mesh_free(&s->mesh);
    memset(s, 0, sizeof *s);
}

int session_launch(const char *cmd, const run_opts *o, ms_rank_fn fn, void *arg) {
    ms_error err = {0};
    int nranks = o->dp * o->tp * o->cp;
    if (o->strategy_file) {
        ms_strategy s;
        if (ms_strategy_load(o->strategy_file, &s, &err) != MS_OK) {
            fprintf(stderr, "meshscope %s: %s\n", cmd, err.msg);
            return 1;
        }
        nranks = ms_strategy_ranks(&s);
    }
    if (o->backend == MS_BACKEND_MPI) {
        int argc = 0;
        char **argv = NULL;
        if (ms_mpi_init(&argc, &argv, &err) != MS_OK) {
            fprintf(stderr, "meshscope %s: %s\n", cmd, err.msg);
            return 1;
        }
    }
    /* OpenBLAS's pool is process-wide: share the cores among the thread ranks. */
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int per_rank = o->threads > 0                     ? o->threads
                   : o->backend == MS_BACKEND_THREADS ? (cores / nranks > 0 ? cores / nranks : 1)
                                                      : 1;
    ms_k_blas_set_threads(per_rank);
    ms_launch_opts lo = {.backend = o->backend,
                         .nranks = o->backend == MS_BACKEND_MPI ? 0 : nranks,
                         .seed = o->seed};
    ms_status st = ms_launch(&lo, fn, arg, &err);
    if (o->backend == MS_BACKEND_MPI) ms_mpi_finalize();
    if (st != MS_OK) {
        fprintf(stderr, "meshscope %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

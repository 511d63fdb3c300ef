/* session.c - the flags train, eval and explain share. */
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
        else if (!strcmp(f, "--on-nan")) {
            good = !strcmp(v, "stop") || !strcmp(v, "skip");
            o->on_nan = !strcmp(v, "skip") ? MS_NONFINITE_SKIP : MS_NONFINITE_STOP;
        } else if (!strcmp(f, "--backend")) {
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

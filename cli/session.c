/* session.c - the flags train, eval and explain share. */
#include "cli/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_mpi.h"
#include "engine/pipeline/schedule.h"

/* Every flag of train, eval and explain, with the commands that take it. */
typedef struct run_flag {
    unsigned cmds; /* run_cmd bits */
    ms_option opt;
} run_flag;

/* A strategy flag's destination: the run's strategy and which setting. */
typedef struct setting_dest {
    run_opts *o;
    const ms_setting *st;
} setting_dest;

static bool set_setting(const char *value, void *dest, char *msg, size_t cap) {
    setting_dest *d = dest;
    if (!ms_setting_set_text(&d->o->strat, d->st, value, msg, cap)) return false;
    d->o->strat_given |= 1u << (d->st - ms_settings);
    return true;
}

/* The flags of the strategy settings, one per row of MS_STRATEGY_SETTINGS. */
typedef struct setting_flags {
    setting_dest dest[MS_SET_COUNT];
    char name[MS_SET_COUNT][32];
    char metavar[MS_SET_COUNT][64];
    run_flag flag[MS_SET_COUNT];
} setting_flags;

static void make_setting_flags(run_opts *o, setting_flags *f) {
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const ms_setting *st = &ms_settings[i];
        f->dest[i] = (setting_dest){o, st};
        ms_setting_flag(st, f->name[i], sizeof f->name[i]);
        const char *metavar = ms_setting_metavar(st, f->metavar[i], sizeof f->metavar[i]);
        f->flag[i] = (run_flag){RUN_ALL,
                                {.name = f->name[i],
                                 .kind = st->kind == MS_SET_KIND_BOOL ? MS_OPT_FLAG : MS_OPT_STRING,
                                 .metavar = metavar,
                                 .help = st->help,
                                 .dest = &f->dest[i],
                                 .fn = set_setting}};
    }
}

static void run_opts_defaults(run_opts *o) {
    *o = (run_opts){.backend = ms_mpi_launched() ? MS_BACKEND_MPI : MS_BACKEND_THREADS,
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
    ms_strategy_defaults(&o->strat);
}

/* After the flags: what they must hold together; MS_OPTS_PROCEED or the exit code (2). */
static int run_opts_settle(run_cmd cmd, const char *name, run_opts *o) {
    if (!o->model && !job_has_model()) {
        fprintf(stderr, "meshscope %s: --model CONFIG.json is required\n", name);
        return 2;
    }
    if (!o->model) o->model = job_model_name(); /* the program's own model: its name */
    ms_strategy_settle(&o->strat, o->strat_given);
    const ms_strategy *st = &o->strat;
    if (cmd == RUN_EVAL && st->offload) {
        fprintf(stderr,
                "meshscope eval: --offload moves training's optimizer to the host; eval has no "
                "optimizer: leave --offload out\n");
        return 2;
    }
    ms_error e;
    int ranks = 0;
    if (ms_strategy_check_degrees(st->dp, st->tp, st->cp, 0, &ranks, &e) != MS_OK) {
        fprintf(stderr, "meshscope %s: %s\n", name, e.msg);
        return 2;
    }
    if ((long long)ranks * st->pp > MS_MESH_MAX_RANKS) {
        fprintf(stderr,
                "meshscope %s: dp %d x tp %d x pp %d x cp %d needs more than %d ranks; pick "
                "degrees whose product is at most %d\n",
                name, st->dp, st->tp, st->pp, st->cp, MS_MESH_MAX_RANKS, MS_MESH_MAX_RANKS);
        return 2;
    }
    if (o->web_token_file && !o->web) {
        fprintf(stderr,
                "meshscope %s: --web-token-file goes with --web HOST:PORT (the dashboard "
                "whose token it holds)\n",
                name);
        return 2;
    }
    if (o->min_lr > o->lr) o->min_lr = o->lr;
    return MS_OPTS_PROCEED;
}

int run_opts_parse(run_cmd cmd, int argc, char **argv, run_opts *o) {
    run_opts_defaults(o);
    static setting_flags sf; /* the options table points into it while it parses */
    make_setting_flags(o, &sf);
    int backend = (int)o->backend, seed = (int)o->seed, on_nan = 0;
    static const char *const on_nan_words[] = {"stop", "skip", NULL};
    const char *device_words[MS_DEVICE_CHOICE_COUNT + 1] = {NULL};
    for (int i = 0; i < MS_DEVICE_CHOICE_COUNT; i++) device_words[i] = ms_device_choice_name(i);
    const run_flag flags[] = {
        {RUN_ALL, MS_TEXT("model", "CONFIG", &o->model,
                          "the model: a config JSON (GPT-2, BERT, LLaMA) or an ONNX file "
                          "(model.onnx) (required)")},
        {RUN_ALL, MS_TEXT("loss", "NAME", &o->loss,
                          "an ONNX model's graph output that is the loss (default: its only "
                          "scalar output)")},
        {RUN_TRAIN | RUN_EVAL,
         MS_TEXT("data", "FILE", &o->data,
                 "the data to train on or evaluate (required): text for a config's model, an "
                 "array file (.npy, .npz, safetensors) for others")},
        {RUN_EVAL,
         MS_TEXT("checkpoint", "FILE", &o->checkpoint, "the safetensors weights (required)")},
        {RUN_ALL, MS_TEXT("strategy", "FILE", &o->strategy_file,
                          "strategy JSON: mesh, knobs and placements (instead of --dp/--tp/"
                          "--pp/--cp/--sp and the pipeline flags)")},
        {RUN_TRAIN | RUN_EVAL,
         MS_ENUM("device", &o->device, device_words,
                 "where the ranks compute: cpu; cuda (rank r on GPU r mod the GPUs present; "
                 "fails with the CUDA runtime's reason when none is usable); auto: CUDA when "
                 "usable, else the CPU, saying which; fenced: the CPU with its memory fenced off "
                 "from host code as a GPU's is, to check the device path (default cpu)")},
        {RUN_TRAIN, MS_FLAG("offload-serial", &o->offload_serial,
                            "with --offload: run the host AdamW inside the step (no overlap; "
                            "for comparison)")},
        {RUN_ALL, MS_ENUM_BACKEND(&backend)},
        {RUN_TRAIN | RUN_EXPLAIN,
         MS_NUM("auto-time-limit", "S", &o->auto_time_limit_s, 0.001, 86400,
                "with \"placements\": \"auto\": the search's integer program may take S seconds "
                "per solve (default 10)")},
        {RUN_TRAIN, MS_INT("steps", "N", &o->steps, 0, 100000000, "optimizer steps (default 100)")},
        {RUN_TRAIN, MS_INT("seed", "S", &seed, 0, 0x7fffffff,
                           "seed of weights, data and sampling (default 1337)")},
        {RUN_ALL, MS_INT("batch", "B", &o->batch, 1, 1 << 20, "sequences per step (default 8)")},
        {RUN_ALL, MS_INT("seq", "T", &o->seq, 1, 1 << 20, "tokens per sequence (default 64)")},
        {RUN_EVAL,
         MS_INT("batches", "K", &o->batches, 1, 100000000, "batches to evaluate (default 4)")},
        {RUN_TRAIN, MS_NUM("lr", "LR", &o->lr, 0, 10, "peak learning rate (default 0.001)")},
        {RUN_TRAIN, MS_NUM("min-lr", "LR", &o->min_lr, 0, 10,
                           "learning rate at the end of the cosine (default 0.0001)")},
        {RUN_TRAIN, MS_INT("warmup", "N", &o->warmup, 0, 100000000, "warmup steps (default 10)")},
        {RUN_TRAIN,
         MS_NUM("weight-decay", "W", &o->weight_decay, 0, 10, "AdamW weight decay (default 0)")},
        {RUN_TRAIN, MS_NUM("clip", "C", &o->clip, 0, 1e9,
                           "clip the global gradient norm at C; 0: off (default 1)")},
        {RUN_TRAIN, MS_TEXT("log-jsonl", "FILE", &o->log_jsonl, "one JSON line per logged step")},
        {RUN_TRAIN, MS_TEXT("save", "FILE", &o->save, "write the trained weights (safetensors)")},
        {RUN_TRAIN, MS_TEXT("save-dir", "DIR", &o->save_dir,
                            "write resumable checkpoints (every rank its shards) into DIR")},
        {RUN_TRAIN, MS_INT("save-every", "N", &o->save_every, 0, 100000000,
                           "checkpoint every N steps, in the background; 0: at the end only "
                           "(default 0)")},
        {RUN_TRAIN, MS_INT("keep", "K", &o->keep, 1, 1000000,
                           "checkpoints kept in --save-dir, newest first (default 3)")},
        {RUN_TRAIN, MS_TEXT("resume", "DIR", &o->resume,
                            "continue from the latest checkpoint in DIR, under any strategy "
                            "(--steps stays the total)")},
        {RUN_TRAIN, MS_INT("sample", "N", &o->sample, 0, 100000,
                           "generate N bytes of text after training (default 0)")},
        {RUN_TRAIN,
         MS_INT("log-every", "N", &o->log_every, 1, 100000000, "log every N steps (default 10)")},
        {RUN_TRAIN, MS_INT("eval-every", "N", &o->eval_every, 0, 100000000,
                           "validation loss every N steps; 0: at the end only (default 0)")},
        {RUN_TRAIN, MS_NUM("val-fraction", "F", &o->val_fraction, 0, 0.9,
                           "share of the text held out for validation (default 0.1)")},
        {RUN_TRAIN, MS_INT("threads", "N", &o->threads, 0, 1024,
                           "BLAS threads per rank; 0: cores / ranks (default 0)")},
        {RUN_TRAIN, MS_INT("timeout-s", "S", &o->timeout_s, 1, 86400,
                           "communicator timeout in seconds (default 60)")},
        {RUN_TRAIN, MS_TEXT("flight-dir", "DIR", &o->flight_dir,
                            "where ranks dump their flight recorders on a fault, for meshscope "
                            "doctor (default ./meshscope-flight)")},
        {RUN_TRAIN,
         MS_TEXT("trace", "FILE", &o->trace, "write a Trace Event Format file of the run")},
        {RUN_TRAIN,
         MS_INT("trace-from", "N", &o->trace_from, 0, 100000000, "first traced step (default 0)")},
        {RUN_TRAIN,
         MS_TEXT("web", "HOST:PORT", &o->web, "serve the live dashboard (port 0: any free port)")},
        {RUN_TRAIN, MS_TEXT("web-token-file", "FILE", &o->web_token_file,
                            "with --web: write the dashboard's token to FILE (mode 0600, removed "
                            "at exit), for meshscope top --token-file FILE")},
        {RUN_TRAIN, MS_FLAG("tui", &o->tui, "the terminal view of the running job")},
        {RUN_TRAIN, MS_TEXT("switch", "STEP:STRATEGY", &o->switch_spec,
                            "switch to STRATEGY (JSON text or file) at step STEP")},
        {RUN_TRAIN, MS_NUM("advise-threshold", "F", &o->advise_threshold, 0, 10,
                           "suggest strategies predicted at least F faster (default 0.10)")},
        {RUN_TRAIN, MS_NUM("memory-cap", "MIB", &o->memory_cap_mib, 0, 1e9,
                           "refuse switches needing more MiB per rank; 0: this machine's share")},
        {RUN_TRAIN, MS_ENUM("on-nan", &on_nan, on_nan_words,
                            "a non-finite loss or gradient norm: stop the run (default) or skip "
                            "the step")},
    };
    static const struct {
        const char *name, *synopsis, *about;
    } cmds[] = {
        {"train", "--model CONFIG --data FILE [options]",
         "Trains a GPT-2, BERT or LLaMA model on a mesh of ranks (--dp x --tp x --cp, or "
         "--strategy);\n"
         "--web and --tui show the job live and take strategy switches."},
        {"eval", "--model CONFIG --checkpoint FILE --data FILE [options]",
         "Prints the loss of a checkpoint on deterministic windows of the text, as JSON."},
        {"explain", "--model CONFIG [options]",
         "Prints every value's placements and every reshard with its bytes."},
    };
    /* the strategy's settings right after --strategy, in the table's order */
    ms_option opts[sizeof flags / sizeof flags[0] + MS_SET_COUNT];
    int n = 0;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (flags[i].cmds & cmd) opts[n++] = flags[i].opt;
        if (flags[i].opt.dest == (void *)&o->strategy_file)
            for (int k = 0; k < MS_SET_COUNT; k++) opts[n++] = sf.flag[k].opt;
    }
    const int which = cmd == RUN_TRAIN ? 0 : cmd == RUN_EVAL ? 1 : 2;
    ms_opts_cmd c = {.name = cmds[which].name,
                     .synopsis = cmds[which].synopsis,
                     .about = cmds[which].about,
                     .opts = opts,
                     .n_opts = n};
    int rc = ms_opts_run(&c, argc, argv, NULL, 0, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    o->backend = (ms_backend_kind)backend;
    o->seed = (uint64_t)seed;
    o->on_nan = on_nan ? MS_NONFINITE_SKIP : MS_NONFINITE_STOP;
    return run_opts_settle(cmd, c.name, o);
}

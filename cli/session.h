/* session.h - what train, eval and explain share: their flags, and a rank's model compiled
 * for its strategy. */
#ifndef MS_SESSION_H
#define MS_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "engine/runtime/ctx.h"

typedef struct run_opts {
    const char *model, *data, *strategy_file, *log_jsonl, *save, *checkpoint, *trace;
    const char *web;         /* --web HOST:PORT: serve the dashboard */
    const char *switch_spec; /* --switch STEP:STRATEGY_JSON: switch strategy at that step */
    bool tui;                /* --tui: the terminal view */
    double advise_threshold; /* suggest strategies predicted at least this much faster */
    double memory_cap_mib;   /* refuse switches needing more per rank; 0: the machine's share */
    int dp, tp, cp;
    bool sp;
    ms_backend_kind backend;
    int steps, batch, seq, warmup, sample, batches, log_every, eval_every;
    int threads;    /* BLAS threads per rank; 0 = cores / ranks */
    int trace_from; /* first traced step */
    uint64_t seed;
    double lr, min_lr, weight_decay, clip, val_fraction;
} run_opts;

/* Parses the shared flags; `allowed` lists the flags this command takes, as
 * "--model --data ...". Prints a clear error and returns 2 on bad input, 0 on success. */
int run_opts_parse(const char *cmd, int argc, char **argv, const char *allowed, run_opts *o);

typedef struct session {
    ms_strategy strat;
    ms_mesh mesh;
    ms_dmesh *dm;
    ms_model_config cfg;
    ms_model model;
    ms_program *prog;
} session;

/* Builds strategy, mesh, model and program on this rank. Collective over the world. */
ms_status session_open(ms_ctx *ctx, const run_opts *o, bool keep_logits, session *s, ms_error *err);
/* The same with a given strategy (a live switch): checks it against the model and world. */
ms_status session_open_strategy(ms_ctx *ctx, const run_opts *o, const ms_strategy *strat,
                                bool keep_logits, session *s, ms_error *err);
void session_close(session *s);

/* Resolves the strategy from flags or file into s (no ranks needed), checking the model. */
ms_status session_strategy(const run_opts *o, const ms_model_config *cfg, ms_strategy *s,
                           ms_error *err);

/* Runs fn on the ranks the options ask for (threads: dp*tp of them; mpi: this process). */
int session_launch(const char *cmd, const run_opts *o, ms_rank_fn fn, void *arg);

#endif

/* cmd_train.c - `meshscope train`, `meshscope eval` and `meshscope explain`: flags and
 * wiring. The training run is a job (job/train_job.c); eval and explain build an inference
 * trainer per rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/session.h"
#include "engine/comm/comm_mpi.h"
#include "engine/core/xalloc.h"
#include "engine/data/dataset.h"
#include "engine/io/json_text.h"
#include "engine/io/safetensors.h"
#include "engine/pipeline/balance.h"
#include "engine/pipeline/diagram.h"
#include "engine/train/stages.h"
#include "job/train_job.h"

int ms_cmd_train(int argc, char **argv) {
    run_opts o;
    int rc = run_opts_parse(RUN_TRAIN, argc, argv, &o);
    if (rc != MS_OPTS_PROCEED) return rc;
    if (!o.data) {
        fprintf(stderr, "meshscope train: --data FILE is required (a text file; `make run` "
                        "prepares data/kjv.txt)\n");
        return 2;
    }
    return train_job_run(&o);
}

typedef struct rank_arg {
    const run_opts *o;
    const job_plan *plan;
    const ms_batch_source *src; /* eval's data, opened once per process (job_open_data) */
} rank_arg;

/* Validates a read job and runs fn on its ranks; 2 for bad input, 1 for a failed run. */
static int launch_plan(const char *cmd, const run_opts *o, job_plan *plan, ms_rank_fn fn,
                       const ms_batch_source *src) {
    ms_error err = {0};
    if (job_plan_validate(o, plan, &err) != MS_OK) {
        fprintf(stderr, "meshscope %s: %s\n", cmd, err.msg);
        return 2;
    }
    rank_arg arg = {o, plan, src};
    if (job_launch(cmd, o, plan, fn, &arg, &err) != MS_OK) {
        fprintf(stderr, "meshscope %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

/* --- eval ------------------------------------------------------------------------------------ */

/* Loads every parameter and buffer from a single-file checkpoint (Hugging Face layout), checked
 * first against the whole model (every rank checks all names, whatever its pipeline stage holds).
 */
static ms_status load_checkpoint(ms_trainer *t, const ms_st_file *ck, ms_error *err) {
    int ns = ms_trainer_num_state(t), n = 0;
    ms_st_expect *want = xcalloc((size_t)ns + 1, sizeof *want);
    for (int i = 0; i < ns; i++) {
        ms_state_tensor s;
        ms_trainer_state(t, i, &s);
        bool seen = s.kind != MS_STATE_PARAM && s.kind != MS_STATE_BUFFER;
        for (int k = 0; k < n && !seen; k++) seen = !strcmp(want[k].name, s.param);
        if (seen) continue;
        ms_shape fs;
        ms_model_checkpoint_shape(s.param, &s.gshape, &fs);
        want[n].name = s.param;
        want[n].ndim = fs.ndim;
        memcpy(want[n].shape, fs.d, sizeof want[n].shape);
        n++;
    }
    ms_status st = ms_safetensors_check(ck, want, n, err);
    free(want);
    for (int i = 0; i < ns && st == MS_OK; i++) {
        ms_state_tensor s;
        ms_trainer_state(t, i, &s);
        if (s.kind == MS_STATE_PARAM || s.kind == MS_STATE_BUFFER)
            st = ms_trainer_load_param(t, i, ms_safetensors_find(ck, s.param)->data, err);
    }
    return st;
}

static ms_status eval_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const rank_arg *ra = arg;
    const run_opts *o = ra->o;
    ms_trainer *t = NULL;
    const ms_batch_source *src = ra->src;
    ms_st_file ck = {0};
    ms_status st;
    ms_train_opts to = job_train_opts(o, false, true);
    MS_CHECK_GOTO(ms_trainer_create_def(ctx, &ra->plan->def, &ra->plan->strat, &ra->plan->rules,
                                        &to, src, &t, err),
                  st, out);
    MS_CHECK_GOTO(ms_safetensors_read(o->checkpoint, &ck, err), st, out);
    MS_CHECK_GOTO(load_checkpoint(t, &ck, err), st, out);
    if (ms_batch_source_eval_batches(src, MS_SPLIT_ALL, o->batch) < (uint64_t)o->batches) {
        st = ms_fail(err, MS_ERR_INVALID, "%s: too short for %d batches of %d rows", o->data,
                     o->batches, o->batch);
        goto out;
    }
    double loss;
    MS_CHECK_GOTO(ms_trainer_evaluate(t, MS_SPLIT_ALL, o->batches, &loss, err), st, out);
    char line[256];
    st = ms_json_loss_line(loss, line, sizeof line, err);
    if (ctx->rank == 0) puts(line);
out:
    ms_safetensors_free(&ck);
    ms_trainer_destroy(t);
    return st;
}

int ms_cmd_eval(int argc, char **argv) {
    run_opts o;
    int rc = run_opts_parse(RUN_EVAL, argc, argv, &o);
    if (rc != MS_OPTS_PROCEED) return rc;
    if (!o.checkpoint || !o.data) {
        fprintf(stderr, "meshscope eval: --checkpoint FILE and --data FILE are required\n");
        return 2;
    }
    job_plan plan;
    ms_error err = {0};
    ms_batch_source *src = NULL;
    if (job_plan_read(&o, &plan, &err) != MS_OK ||
        job_open_data(&o, &plan, 0.0, &src, &err) != MS_OK) {
        fprintf(stderr, "meshscope eval: %s\n", err.msg);
        job_plan_free(&plan);
        return 2;
    }
    rc = launch_plan("eval", &o, &plan, eval_rank, src);
    ms_batch_source_close(src);
    job_plan_free(&plan);
    return rc;
}

/* --- explain --------------------------------------------------------------------------------- */

static ms_status explain_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const rank_arg *ra = arg;
    ms_trainer *t = NULL;
    ms_train_opts to = job_train_opts(ra->o, false, true);
    ms_status st = ms_trainer_create_def(ctx, &ra->plan->def, &ra->plan->strat, &ra->plan->rules,
                                         &to, NULL, &t, err);
    if (st == MS_OK && ctx->rank == 0) {
        char name[MS_STRATEGY_NAME_MAX];
        char about[256];
        ms_model_def_describe(ms_trainer_def(t), about, sizeof about);
        printf("strategy %s, batch %d; model %s (%s)\n",
               ms_strategy_name(ms_trainer_strategy(t), name, sizeof name), ra->o->batch,
               ra->o->model, about);
        ms_program_explain(ms_trainer_program(t), stdout);
    }
    ms_trainer_destroy(t);
    return st;
}

/* A pipeline's schedule, drawn once per job (by world rank 0 under mpirun) before any rank
 * starts, so it is there even when the engine then refuses the strategy. */
static int explain_pipeline(const run_opts *o, const job_plan *plan) {
    const ms_strategy *s = &plan->strat;
    int size = 0, m = 0;
    if (s->pp < 2 || (ms_mpi_launched() && ms_mpi_launch_rank() != 0)) return 0;
    ms_strategy_micro(s, o->batch, &size, &m); /* checked by job_plan_read */
    ms_error err = {0};
    if (ms_pp_schedule_print(stdout, (ms_schedule)s->schedule, s->pp, m, s->virtual_stages, &err) !=
        MS_OK) {
        fprintf(stderr, "meshscope explain: %s\n", err.msg);
        return 2;
    }
    /* The layers of each model chunk, and what the split weighed. */
    ms_pp_costs c = {.layer = 1};
    const ms_model_def *d = &plan->def;
    if (d->hooks->block_costs) d->hooks->block_costs(d, &c.layer, &c.first, &c.last);
    int chunks = s->pp * s->virtual_stages;
    printf("  layers per model chunk:");
    for (int k = 0; k < chunks; k++) {
        int lo, hi;
        ms_pp_chunk_layers_def(d, s, k, &lo, &hi);
        printf(" %d", hi - lo);
    }
    if (s->pp_layers[0])
        printf(" (pp_layers)\n");
    else
        printf(" (balanced by cost: the head and loss weigh %.2f layers)\n", c.last / c.layer);
    fflush(stdout);
    return 0;
}

int ms_cmd_explain(int argc, char **argv) {
    run_opts o;
    int rc = run_opts_parse(RUN_EXPLAIN, argc, argv, &o);
    if (rc != MS_OPTS_PROCEED) return rc;
    job_plan plan;
    ms_error err = {0};
    if (job_plan_read(&o, &plan, &err) != MS_OK) {
        fprintf(stderr, "meshscope explain: %s\n", err.msg);
        return 2;
    }
    if ((rc = explain_pipeline(&o, &plan)) == 0)
        rc = launch_plan("explain", &o, &plan, explain_rank, NULL);
    job_plan_free(&plan);
    return rc;
}

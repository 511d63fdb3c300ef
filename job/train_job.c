/* train_job.c - `meshscope train` as a job (see train_job.h).
 *
 * Every rank builds a trainer for the job's strategy and steps it; rank 0 logs, samples text
 * and writes the checkpoint. With live views or --switch, every step boundary starts with the
 * control exchange, so all ranks stop or switch on the same step. */
#include "job/train_job.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/xalloc.h"
#include "engine/data/dataset.h"
#include "engine/io/fileio.h"
#include "engine/io/json_text.h"
#include "engine/io/safetensors.h"
#include "engine/train/checkpoint.h"
#include "engine/train/stages.h"
#include "job/live_job.h"
#include "job/tracer.h"
#include "profiler/record/hooks.h"

/* Rank 0's closing lines: printed at once, or, while the TUI owns the terminal, kept and
 * printed once it has given the terminal back. */
/* A memory sample with the training state's split: parameters, gradients and optimizer state
 * as the trainer holds them, activations as the micro-batch arenas (the program's own arena
 * when one micro-batch runs at a time). */
static void record_memory(ms_ctx *ctx, ms_trainer *t) {
    if (!ctx->trace.recorder) return;
    ms_trainer_bytes b;
    ms_stages_memory m;
    ms_trainer_state_bytes(t, &b);
    ms_trainer_memory(t, &m);
    double acts = m.activation_bytes > 0 ? m.activation_bytes : m.own_arena_bytes;
    ms_ev_mem split = {.params = (uint64_t)b.params,
                       .grads = (uint64_t)b.grads,
                       .optim = (uint64_t)b.optim,
                       .acts = (uint64_t)acts,
                       .host_optim = (uint64_t)b.host_optim};
    ms_record_memory(&ctx->trace, ctx->device, &split);
}

static void say(ms_strbuf *later, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(ms_strbuf *later, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (later) {
        ms_strbuf_put(later, line, strlen(line));
    } else {
        fputs(line, stdout);
        fflush(stdout);
    }
}

/* Gathers every parameter and buffer (the state walk's MS_STATE_PARAM and MS_STATE_BUFFER
 * tensors, each name once: under pp the tied embedding has two equal holders) on rank 0 and writes
 * them, in the Hugging Face layout, as one safetensors file (collective). */
static ms_status save_checkpoint(ms_ctx *ctx, ms_trainer *t, const char *path, ms_error *err) {
    int ns = ms_trainer_num_state(t), n = 0;
    ms_st_entry *e = xcalloc((size_t)ns, sizeof *e);
    ms_tensor *full = xcalloc((size_t)ns, sizeof *full);
    ms_status st = MS_OK;
    for (int i = 0; i < ns && st == MS_OK; i++) {
        ms_state_tensor s;
        ms_trainer_state(t, i, &s);
        if (s.kind != MS_STATE_PARAM && s.kind != MS_STATE_BUFFER) continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++) seen = !strcmp(e[k].name, s.param);
        if (seen) continue;
        st = ms_trainer_state_full(t, i, &full[n], err);
        ms_shape fs;
        ms_model_checkpoint_shape(s.param, &s.gshape, &fs);
        e[n] = (ms_st_entry){.name = s.param, .dtype = MS_F32, .ndim = fs.ndim};
        memcpy(e[n].shape, fs.d, sizeof e[n].shape);
        e[n].data = ms_tensor_f32(&full[n]);
        n++;
    }
    if (st == MS_OK && ctx->rank == 0) {
        ms_st_kv meta[2] = {{"format", "pt"}, {"producer", "meshscope"}};
        st = ms_safetensors_write(path, e, n, meta, 2, err);
        if (st == MS_OK) printf("saved %d tensors to %s\n", n, path);
    }
    for (int i = 0; i < n; i++) ms_tensor_release(&full[i]);
    free(full), free(e);
    return st;
}

/* --resume: loads the checkpoint into t under the job's strategy (collective). */
static ms_status resume(ms_ctx *ctx, ms_trainer *t, const run_opts *o, ms_error *err) {
    ms_ckpt_info info;
    int64_t t0 = ms_now_ns();
    MS_CHECK(ms_ckpt_load(t, o->resume, &info, err));
    if (ctx->rank == 0) {
        char name[MS_STRATEGY_NAME_MAX];
        printf("resumed %s at step %lld in %.1f ms (saved by %d ranks under %s), running %s\n",
               info.path, (long long)info.step, (ms_now_ns() - t0) / 1e6, info.world,
               *info.strategy ? info.strategy : "-",
               ms_strategy_name(ms_trainer_strategy(t), name, sizeof name));
        fflush(stdout);
    }
    return MS_OK;
}

static ms_status open_saver(ms_ctx *ctx, ms_trainer *t, const run_opts *o, ms_ckpt_saver **out,
                            ms_error *err) {
    ms_ckpt_opts co = {.dir = o->save_dir, .keep = o->keep, .model = o->model};
    MS_CHECK(ms_ckpt_saver_create(ctx, &co, out, err));
    ms_ckpt_saver_prepare(*out, t);
    return MS_OK;
}

/* One line of a checkpoint poll's note: rank 0 a commit or why a save was abandoned, any
 * rank its own failure. */
static void ckpt_line(ms_ctx *ctx, live_job *jl, const char *line, ms_strbuf *later) {
    if (ctx->rank == 0 && jl && jl->live) ms_live_set_event(jl->live, "%s", line);
    if (!strncmp(line, "checkpoint at step", 18) && ctx->rank != 0)
        fprintf(stderr, "rank %d: %s\n", ctx->rank, line);
    else if (ctx->rank == 0)
        say(later, "%s\n", line);
}

/* What a checkpoint poll has to say, one line per save. */
static void ckpt_note(ms_ctx *ctx, live_job *jl, char *note, ms_strbuf *later) {
    for (char *line = note, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        ckpt_line(ctx, jl, line, later);
    }
}

/* Room for what one poll says: a few saves' lines (ms_ckpt_saver_poll). */
#define CKPT_NOTE_MAX (4 * (1200 + MS_ERROR_MSG_MAX))

/* At a step boundary: commits a finished save, and starts one every --save-every steps (and
 * after the last step). */
static ms_status checkpoint_step(ms_ctx *ctx, live_job *jl, ms_trainer *t, ms_ckpt_saver *saver,
                                 const run_opts *o, bool last, ms_strbuf *later, ms_error *err) {
    if (!saver) return MS_OK;
    char note[CKPT_NOTE_MAX];
    MS_CHECK(ms_ckpt_saver_poll(saver, false, note, sizeof note, err));
    ckpt_note(ctx, jl, note, later);
    int64_t next = ms_trainer_step_index(t);
    if (!last && !(o->save_every && next % o->save_every == 0)) return MS_OK;
    double stall = 0;
    MS_CHECK(ms_ckpt_saver_save(saver, t, &stall, err));
    if (ctx->rank == 0)
        say(later, "step %5lld  checkpoint: state copied in %.1f ms, written in the background\n",
            (long long)next - 1, stall * 1e3);
    if (!last) return MS_OK;
    MS_CHECK(ms_ckpt_saver_poll(saver, true, note, sizeof note, err));
    ckpt_note(ctx, jl, note, later);
    return MS_OK;
}

/* After training with micro-batches or stages: per stage, the micro-batches held at once
 * against the schedule's bound and the activation memory, as the slots count it and as the
 * device's peak counter saw it grow over the run (collective; rank 0 prints). */
static ms_status report_memory(ms_ctx *ctx, ms_trainer *t, double base_in_use, ms_strbuf *later,
                               ms_error *err) {
    const ms_strategy *s = ms_trainer_strategy(t);
    ms_stages_memory m;
    ms_trainer_memory(t, &m);
    double peak = (double)atomic_load(&ctx->device->peak);
    /* Without micro-batches the program's own arena was allocated with it, before
     * base_in_use; micro-batched arenas come from the pool during the steps. */
    float mine[6] = {(float)m.stage,
                     (float)m.held,
                     (float)m.bound,
                     (float)((m.activation_bytes - m.scratch_bytes) / 1048576.0),
                     (float)((peak - base_in_use + m.own_arena_bytes) / 1048576.0),
                     (float)(m.scratch_bytes / 1048576.0)};
    int n = ctx->world_size;
    float *all = xmalloc(sizeof *all * 6 * (size_t)n);
    size_t *counts = xmalloc(sizeof *counts * (size_t)n);
    for (int r = 0; r < n; r++) counts[r] = 6;
    ms_status st = ms_all_gather(ctx->world, mine, all, counts, err);
    if (st == MS_OK && ctx->rank == 0) {
        char name[MS_STRATEGY_NAME_MAX];
        say(later,
            "activations (%s): micro-batches held at once per stage, against the schedule's "
            "bound\n",
            ms_strategy_name(s, name, sizeof name));
        int last = -1;
        for (int r = 0; r < n; r++) {
            const float *x = all + 6 * r;
            if ((int)x[0] == last) continue; /* a stage's first rank speaks for it */
            last = (int)x[0];
            char shared[64] = "";
            if (x[5] > 0)
                snprintf(shared, sizeof shared, " + %.1f MiB shared scratch", (double)x[5]);
            say(later,
                "  stage %d: held %d (bound %d), %.1f MiB in slots%s, device peak grew %.1f MiB\n",
                last, (int)x[1], (int)x[2], (double)x[3], shared, (double)x[4]);
        }
    }
    free(all), free(counts);
    return st;
}

/* Rank 0's device memory after training: the state as allocated (parameters, gradients,
 * optimizer state: what ZeRO shards) and the rest of the device's peak since the trainer was
 * created (activations, inputs, staging and reshard workspace). */
static void report_state_memory(ms_ctx *ctx, ms_trainer *t, double created_from, ms_strbuf *later) {
    ms_trainer_bytes b;
    ms_trainer_state_bytes(t, &b);
    double peak = (double)atomic_load(&ctx->device->peak) - created_from, mib = 1048576.0;
    say(later,
        "memory on rank 0: parameters %.2f MiB, gradients %.2f MiB, optimizer state %.2f MiB, "
        "activations and the rest %.2f MiB (device peak grew %.2f MiB)\n",
        b.params / mib, b.grads / mib, b.optim / mib, (peak - b.params - b.grads - b.optim) / mib,
        peak / mib);
    if (b.host_optim > 0)
        say(later,
            "host memory on rank 0 (offload): fp32 master weights, Adam moments and staged "
            "gradients %.2f MiB, not on the device\n",
            b.host_optim / mib);
}

typedef struct train_args {
    const run_opts *o;
    const job_plan *plan;
    live_job *job;              /* threads backend: shared by the ranks; NULL otherwise */
    const ms_batch_source *src; /* the data, opened once per process (job_open_data) */
} train_args;

/* The line rank 0 prints before the first step. */
static void announce(ms_ctx *ctx, const run_opts *o, ms_trainer *t, const ms_batch_source *src) {
    ms_program_stats stats;
    ms_program_stats_get(ms_trainer_program(t), &stats);
    char m[128], name[MS_STRATEGY_NAME_MAX], about[256];
    ms_model_def_describe(ms_trainer_def(t), about, sizeof about);
    printf("training %s (%s) on %s, %d ranks, %s backend\n", o->model, about,
           ms_strategy_name(ms_trainer_strategy(t), name, sizeof name), ctx->world_size,
           ms_comm_backend(ctx->world));
    printf("mesh %s; %d reshards per step (%.1f KiB on rank 0); data %s (%llu training rows, "
           "%llu for validation)\n",
           ms_mesh_str(ms_trainer_mesh(t), m, sizeof m), stats.n_reshards,
           stats.reshard_bytes / 1024, o->data, (unsigned long long)src->samples[MS_SPLIT_TRAIN],
           (unsigned long long)src->samples[MS_SPLIT_VAL]);
    ms_device *dev = ctx->device;
    if (dev->ops->kind != MS_DEVICE_CPU) {
        char paths[256];
        printf("device %s (rank 0 on #%d); collectives on device memory: %s\n", ms_device_name(dev),
               dev->ordinal, ms_dmesh_paths_str(ms_trainer_dmesh(t), paths, sizeof paths));
    }
    fflush(stdout);
}

/* Rank 0's per-step outputs: the JSONL log and the console line. */
static ms_status log_step(const run_opts *o, FILE *log, ms_trainer *t, const ms_step_result *r,
                          double ms, bool quiet, ms_error *err) {
    double tps = (double)o->batch * o->seq / (ms / 1e3);
    if (log) {
        /* A skipped step's loss or norm is not finite: null, since JSON has no NaN. */
        char loss[32], norm[32], name[MS_STRATEGY_NAME_MAX];
        fprintf(log,
                "{\"step\": %lld, \"loss\": %s, \"step_ms\": %.3f, \"tokens_per_s\": %.1f, "
                "\"lr\": %.6g, \"grad_norm\": %s, \"strategy\": \"%s\"%s}\n",
                (long long)r->step, ms_json_number(r->loss, "%.9g", loss, sizeof loss), ms, tps,
                r->lr, ms_json_number(r->grad_norm, "%.5f", norm, sizeof norm),
                job_strategy_name(ms_trainer_strategy(t), ms_trainer_rules(t), name, sizeof name),
                r->skipped ? ", \"skipped\": true" : "");
        if (fflush(log) != 0 || ferror(log))
            return ms_fail(err, MS_ERR_IO, "cannot write the log %s (disk full?)", o->log_jsonl);
    }
    if (!quiet && (r->step % o->log_every == 0 || r->step == o->steps - 1)) {
        printf("step %5lld  loss %.4f  %7.1f ms  %8.0f tok/s  lr %.2e  |g| %.3f%s\n",
               (long long)r->step, r->loss, ms, tps, r->lr, r->grad_norm,
               r->skipped ? "  (skipped: not finite)" : "");
        fflush(stdout);
    }
    return MS_OK;
}

train_step_hook train_job_step_hook;

/* One rank's run of the job: what it opens, in order, and closes in reverse (rank_close). */
typedef struct rank_run {
    ms_ctx *ctx;
    const run_opts *o;
    ms_trainer *t;
    const ms_batch_source *src; /* the job's data (borrowed from train_args) */
    FILE *log;                  /* rank 0: --log-jsonl */
    tracer tr;
    ms_comm *control_comm; /* the live job's own channel, whether or not it traces */
    live_job own;          /* MPI: rank 0's live job, opened by this rank */
    live_job *job;         /* the live job this rank takes decisions from (rank 0 decides) */
    live_job *jl;          /* rank 0: the job it reports to; NULL elsewhere */
    bool live_on, quiet;   /* quiet: the TUI owns the terminal */
    ms_strbuf *later;      /* rank 0's closing lines while the TUI owns the terminal */
    ms_ckpt_saver *saver;
    char *sample;
    float last_loss;
    int64_t first_step;
    double created_from, base_in_use; /* device bytes in use before and after the trainer */
} rank_run;

/* Everything before the first step: the live job, tracing, data, trainer, log, resume, saver. */
static ms_status rank_open(rank_run *r, const train_args *ta, ms_error *err) {
    ms_ctx *ctx = r->ctx;
    const run_opts *o = r->o;
    r->live_on = live_job_wanted(o);
    r->quiet = o->tui;
    r->last_loss = NAN;
    MS_CHECK(live_job_for_rank(ctx, o, ta->plan, ta->job, &r->own, &r->job, err));
    if (r->live_on)
        MS_CHECK(ms_comm_split(ctx->world, 0, ctx->rank, "control", &r->control_comm, err));
    tracer_opts tro = {.path = o->trace,
                       .from = o->trace_from,
                       .live = r->job ? r->job->live : NULL,
                       .live_views = r->live_on};
    MS_CHECK(tracer_open(ctx, &r->tr, &tro, err));
    r->src = ta->src;
    ms_train_opts to = job_train_opts(o, o->sample > 0, false);
    r->created_from = (double)atomic_load(&ctx->device->in_use);
    MS_CHECK(ms_trainer_create_def(ctx, &ta->plan->def, &ta->plan->strat, &ta->plan->rules, &to,
                                   r->src, &r->t, err));
    if (ctx->rank == 0 && o->log_jsonl) {
        r->log = fopen(o->log_jsonl, o->resume ? "a" : "w"); /* a resumed run continues its log */
        if (!r->log) return ms_fail(err, MS_ERR_IO, "cannot write the log %s", o->log_jsonl);
    }
    r->base_in_use = (double)atomic_load(&ctx->device->in_use);
    r->jl = ctx->rank == 0 ? r->job : NULL;
    r->later = r->quiet && r->job ? &r->job->epilogue : NULL;
    if (ctx->rank == 0 && !r->quiet) announce(ctx, o, r->t, r->src);
    if (o->resume) MS_CHECK(resume(ctx, r->t, o, err));
    if (o->save_dir) MS_CHECK(open_saver(ctx, r->t, o, &r->saver, err));
    /* A run resumed at its last step trains no more: it evaluates, samples and saves. */
    r->first_step = ms_trainer_step_index(r->t);
    return MS_OK;
}

/* The step boundary's control exchange (with live views or --switch): carries out a switch;
 * *stop when the job was asked to stop. */
static ms_status rank_control(rank_run *r, int step, bool *stop, ms_error *err) {
    *stop = false;
    if (!r->live_on) return MS_OK;
    control c;
    MS_CHECK(live_job_control(r->job, r->control_comm, step, &c, err));
    ms_status st = live_job_apply(r->jl, r->ctx, r->t, &c, step, r->quiet, err);
    *stop = st == MS_OK && c.kind == CONTROL_STOP;
    control_free(&c);
    if (*stop && r->ctx->rank == 0)
        say(r->later, "step %5d  stopped on request (last loss %.4f)\n", step, r->last_loss);
    return st;
}

/* One training step and what follows it: the views, the log, tracing, checkpoints, eval. */
static ms_status rank_step(rank_run *r, int step, ms_error *err) {
    ms_ctx *ctx = r->ctx;
    const run_opts *o = r->o;
    tracer_step(ctx, &r->tr, step);
    if (train_job_step_hook) train_job_step_hook(ctx, step, o->timeout_s);
    ms_step_result res;
    ms_status st = ms_trainer_step(r->t, &res, err);
    if (st == MS_ERR_DIVERGED && r->jl && r->jl->live)
        ms_live_set_event(r->jl->live, "%s", err->msg);
    MS_CHECK(st);
    r->last_loss = res.loss;
    ms_record_span(&ctx->trace, MS_EV_STEP, res.t_data_ns);
    record_memory(ctx, r->t);
    double ms = (ms_now_ns() - res.t_data_ns) / 1e6;
    if (ctx->rank == 0) {
        live_job_step_done(r->jl, r->t, &res, ms);
        MS_CHECK(log_step(o, r->log, r->t, &res, ms, r->quiet, err));
    }
    MS_CHECK(tracer_after_step(ctx, &r->tr, step, err));
    MS_CHECK(checkpoint_step(ctx, r->jl, r->t, r->saver, o, false, r->later, err));
    if (o->eval_every && step && step % o->eval_every == 0) {
        double vl;
        MS_CHECK(ms_trainer_evaluate(r->t, MS_SPLIT_VAL, o->batches, &vl, err));
        if (ctx->rank == 0 && !r->quiet) printf("step %5d  validation loss %.4f\n", step, vl);
    }
    return MS_OK;
}

/* After the last step (or a stop): the last checkpoint, memory reports, the trace file,
 * validation, a sample and --save. */
static ms_status rank_wrap_up(rank_run *r, ms_error *err) {
    ms_ctx *ctx = r->ctx;
    const run_opts *o = r->o;
    ms_trainer *t = r->t;
    if (ctx->rank == 0) live_job_end(r->jl, ms_trainer_step_index(t) - 1, r->quiet);
    /* A last checkpoint unless one was just taken, then wait for it. */
    if (r->saver && ms_trainer_step_index(t) > r->first_step &&
        !(o->save_every && ms_trainer_step_index(t) % o->save_every == 0))
        MS_CHECK(checkpoint_step(ctx, r->jl, t, r->saver, o, true, r->later, err));
    if (r->saver) {
        char note[CKPT_NOTE_MAX];
        MS_CHECK(ms_ckpt_saver_poll(r->saver, true, note, sizeof note, err));
        ckpt_note(ctx, r->jl, note, r->later);
    }
    int mb_size = 0, mb_count = 1;
    ms_strategy_micro(ms_trainer_strategy(t), o->batch, &mb_size, &mb_count);
    bool trained = ms_trainer_step_index(t) > r->first_step;
    if (trained && (ms_trainer_strategy(t)->pp > 1 || mb_count > 1))
        MS_CHECK(report_memory(ctx, t, r->base_in_use, r->later, err));
    if (trained && ctx->rank == 0) report_state_memory(ctx, t, r->created_from, r->later);
    MS_CHECK(tracer_finish(ctx, &r->tr, err));
    if (o->steps > 0 && ms_batch_source_eval_batches(r->src, MS_SPLIT_VAL, o->batch) == 0) {
        if (ctx->rank == 0)
            say(r->later,
                "no validation loss: the validation split of %s holds fewer than %d rows "
                "(--val-fraction %g)\n",
                o->data, o->batch, o->val_fraction);
    } else if (o->steps > 0) {
        double vl;
        MS_CHECK(ms_trainer_evaluate(t, MS_SPLIT_VAL, o->batches, &vl, err));
        if (ctx->rank == 0) say(r->later, "validation loss %.4f (%d batches)\n", vl, o->batches);
    }
    if (o->sample > 0 && ms_trainer_def(t)->lm && !ms_trainer_model(t)->mlm_per_row) {
        const char *prompt = "And God said";
        r->sample = xcalloc((size_t)o->sample + strlen(prompt) + 1, 1);
        MS_CHECK(ms_trainer_sample(t, prompt, o->sample, o->seed, r->sample, err));
        if (ctx->rank == 0) say(r->later, "\nsample:\n%s\n", r->sample);
    }
    if (o->save) MS_CHECK(save_checkpoint(ctx, t, o->save, err));
    return MS_OK;
}

/* Closes what rank_open opened, in reverse; keeps the first failure (st) or reports a log
 * that could not be written. */
static ms_status rank_close(rank_run *r, ms_status st, ms_error *err) {
    if (r->log && fclose(r->log) != 0 && st == MS_OK)
        st = ms_fail(err, MS_ERR_IO, "cannot write the log %s (disk full?)", r->o->log_jsonl);
    free(r->sample);
    ms_ckpt_saver_destroy(r->saver);
    ms_trainer_destroy(r->t);
    tracer_close(r->ctx, &r->tr);
    ms_comm_destroy(r->control_comm);
    live_job_release_rank(&r->own);
    return st;
}

static ms_status train_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const train_args *ta = arg;
    rank_run r = {.ctx = ctx, .o = ta->o};
    ms_status st = rank_open(&r, ta, err);
    for (int step = (int)r.first_step; st == MS_OK && step < r.o->steps; step++) {
        bool stop = false;
        st = rank_control(&r, step, &stop, err);
        if (st != MS_OK || stop) break;
        st = rank_step(&r, step, err);
    }
    if (st == MS_OK) st = rank_wrap_up(&r, err);
    return rank_close(&r, st, err);
}

int train_job_run(const run_opts *o) {
    ms_error err = {0};
    job_plan plan;
    train_args ta = {.o = o, .plan = &plan};
    live_job job;
    ms_status st = job_plan_resolve(o, &plan, &err);
    if (st == MS_OK) st = job_check_outputs(o, &err);
    ms_batch_source *src = NULL;
    if (st == MS_OK) st = job_open_data(o, &plan, o->val_fraction, &src, &err);
    ta.src = src;
    int save_lock = -1; /* held until the job is over: no other job saves into --save-dir */
    if (st == MS_OK) st = job_claim_save_dir(o, &save_lock, &err);
    if (st == MS_OK) {
        ms_train_opts to = job_train_opts(o, o->sample > 0, false);
        st = ms_train_opts_check(&to, &err);
    }
    if (st == MS_OK && live_job_wanted(o)) {
        /* Bad --switch targets fail here, on every process, before any rank starts. The live
         * model, dashboard and TUI live in this process, shared by the rank threads; under
         * MPI rank 0's process opens them. */
        st = live_job_check_options(o, &plan, &err);
        if (st == MS_OK && o->backend == MS_BACKEND_THREADS) {
            st = live_job_open(&job, o, &plan, &err);
            if (st == MS_OK) ta.job = &job;
        }
    }
    if (st != MS_OK) {
        fprintf(stderr, "meshscope train: %s\n", err.msg);
        ms_dir_unlock(save_lock);
        ms_batch_source_close(src);
        job_plan_free(&plan);
        return 2;
    }
    st = job_launch("train", o, &plan, train_rank, &ta, &err);
    if (ta.job) {
        live_job_finish(&job);
        live_job_close(&job);
    }
    ms_dir_unlock(save_lock);
    ms_batch_source_close(src);
    job_plan_free(&plan);
    if (st != MS_OK) {
        fprintf(stderr, "meshscope train: %s\n", err.msg);
        job_report_flight("train", o->backend == MS_BACKEND_MPI);
        return 1;
    }
    return 0;
}

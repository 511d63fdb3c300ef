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

/* Gathers every parameter (the state walk's MS_STATE_PARAM tensors, each name once: under pp
 * the tied embedding has two equal holders) on rank 0 and writes them, in the Hugging Face
 * layout, as one safetensors file (collective). */
static ms_status save_checkpoint(ms_ctx *ctx, ms_trainer *t, const char *path, ms_error *err) {
    int ns = ms_trainer_num_state(t), n = 0;
    ms_st_entry *e = xcalloc((size_t)ns, sizeof *e);
    ms_tensor *full = xcalloc((size_t)ns, sizeof *full);
    ms_status st = MS_OK;
    for (int i = 0; i < ns && st == MS_OK; i++) {
        ms_state_tensor s;
        ms_trainer_state(t, i, &s);
        if (s.kind != MS_STATE_PARAM) continue;
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
    live_job *job; /* threads backend: shared by the ranks; NULL otherwise */
} train_args;

/* The line rank 0 prints before the first step. */
static void announce(ms_ctx *ctx, const run_opts *o, ms_trainer *t, const ms_text_data *data) {
    const ms_model_config *cfg = ms_trainer_config(t);
    ms_program_stats stats;
    ms_program_stats_get(ms_trainer_program(t), &stats);
    char m[128], name[MS_STRATEGY_NAME_MAX];
    printf("training %s (%d layers, %d heads, %d channels, vocab %d) on %s, %d ranks, %s "
           "backend\n",
           o->model, cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size,
           ms_strategy_name(ms_trainer_strategy(t), name, sizeof name), ctx->world_size,
           ms_comm_backend(ctx->world));
    printf("mesh %s; %d reshards per step (%.1f KiB on rank 0); data %s (%zu bytes)\n",
           ms_mesh_str(ms_trainer_mesh(t), m, sizeof m), stats.n_reshards,
           stats.reshard_bytes / 1024, o->data, data->nbytes);
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
                ms_strategy_name(ms_trainer_strategy(t), name, sizeof name),
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

static ms_status train_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const train_args *ta = arg;
    const run_opts *o = ta->o;
    ms_trainer *t = NULL;
    ms_text_data data = {0};
    FILE *log = NULL;
    tracer tr = {0};
    ms_comm *control_comm = NULL; /* the live job's own channel, whether or not it traces */
    live_job own = {0}, *job = ta->job;
    bool live_on = live_job_wanted(o);
    bool quiet = o->tui; /* the TUI owns the terminal */
    float last_loss = NAN;
    char *sample = NULL;
    ms_ckpt_saver *saver = NULL;
    ms_status st;
    if (live_on && o->backend == MS_BACKEND_MPI && ctx->rank == 0) {
        MS_CHECK_GOTO(live_job_open(&own, o, ta->plan, err), st, out);
        job = &own;
    }
    if (live_on)
        MS_CHECK_GOTO(ms_comm_split(ctx->world, 0, ctx->rank, "control", &control_comm, err), st,
                      out);
    if (o->trace || live_on) {
        MS_CHECK_GOTO(tracer_start(ctx, &tr, err), st, out);
        tr.keep = o->trace != NULL;
        if (tr.keep) tracer_nccl_start(ctx, &tr);
        tr.live_mpi = live_on && o->backend == MS_BACKEND_MPI;
        if (job && job->live) {
            if (o->backend == MS_BACKEND_MPI)
                tr.feed = job->live;
            else
                ms_live_attach_recorder(job->live, tr.rec);
            /* threads: the views read the GPU collector's ring as it fills */
            if (o->backend != MS_BACKEND_MPI && tr.gpu_rec)
                ms_live_attach_recorder(job->live, tr.gpu_rec);
        }
    }
    MS_CHECK_GOTO(ms_text_data_open(o->data, o->seq, o->val_fraction, &data, err), st, out);
    ms_train_opts to = job_train_opts(o, o->sample > 0, false);
    double created_from = (double)atomic_load(&ctx->device->in_use);
    MS_CHECK_GOTO(ms_trainer_create(ctx, &ta->plan->cfg, &ta->plan->strat, &ta->plan->rules, &to,
                                    &data, &t, err),
                  st, out);
    if (ctx->rank == 0 && o->log_jsonl) {
        log = fopen(o->log_jsonl, o->resume ? "a" : "w"); /* a resumed run continues its log */
        if (!log) {
            st = ms_fail(err, MS_ERR_IO, "cannot write the log %s", o->log_jsonl);
            goto out;
        }
    }
    double base_in_use = (double)atomic_load(&ctx->device->in_use);
    live_job *jl = ctx->rank == 0 ? job : NULL;
    ms_strbuf *later = quiet && job ? &job->epilogue : NULL;
    if (ctx->rank == 0 && !quiet) announce(ctx, o, t, &data);
    if (o->resume) MS_CHECK_GOTO(resume(ctx, t, o, err), st, out);
    if (o->save_dir) MS_CHECK_GOTO(open_saver(ctx, t, o, &saver, err), st, out);
    /* A run resumed at its last step trains no more: it evaluates, samples and saves. */
    const int64_t first_step = ms_trainer_step_index(t);
    for (int step = (int)first_step; step < o->steps; step++) {
        if (live_on) {
            control c;
            MS_CHECK_GOTO(live_job_control(job, control_comm, step, &c, err), st, out);
            st = live_job_apply(jl, ctx, t, &c, step, quiet, err);
            control_kind kind = c.kind;
            control_free(&c);
            if (st != MS_OK) goto out;
            if (kind == CONTROL_STOP) {
                if (ctx->rank == 0)
                    say(later, "step %5d  stopped on request (last loss %.4f)\n", step, last_loss);
                break;
            }
        }
        if (tr.rec) {
            /* Attached from the start (so every communicator is probed), recording from
             * --trace-from on (from step 0 when the live views need the events). */
            ctx->trace.recorder = step >= o->trace_from || live_on ? tr.rec : NULL;
            ms_recorder_set_step(tr.rec, step);
        }
        if (train_job_step_hook) train_job_step_hook(ctx, step, o->timeout_s);
        ms_step_result r;
        st = ms_trainer_step(t, &r, err);
        if (st == MS_ERR_DIVERGED && jl && jl->live) ms_live_set_event(jl->live, "%s", err->msg);
        if (st != MS_OK) goto out;
        last_loss = r.loss;
        ms_record_span(&ctx->trace, MS_EV_STEP, r.t_data_ns);
        record_memory(ctx, t);
        double ms = (ms_now_ns() - r.t_data_ns) / 1e6;
        if (ctx->rank == 0) {
            live_job_step_done(jl, t, &r, ms);
            MS_CHECK_GOTO(log_step(o, log, t, &r, ms, quiet, err), st, out);
        }
        if (tr.rec && (o->trace || tr.live_mpi) && step % 10 == 9)
            MS_CHECK_GOTO(tracer_gather(ctx, &tr, err), st, out);
        MS_CHECK_GOTO(checkpoint_step(ctx, jl, t, saver, o, false, later, err), st, out);
        if (o->eval_every && step && step % o->eval_every == 0) {
            double vl;
            MS_CHECK_GOTO(ms_trainer_evaluate(t, MS_SPLIT_VAL, o->batches, &vl, err), st, out);
            if (ctx->rank == 0 && !quiet) printf("step %5d  validation loss %.4f\n", step, vl);
        }
    }
    if (ctx->rank == 0) live_job_end(jl, ms_trainer_step_index(t) - 1, quiet);
    /* The run's end (or a stop): a last checkpoint unless one was just taken, then wait for it. */
    if (saver && ms_trainer_step_index(t) > first_step &&
        !(o->save_every && ms_trainer_step_index(t) % o->save_every == 0))
        MS_CHECK_GOTO(checkpoint_step(ctx, jl, t, saver, o, true, later, err), st, out);
    if (saver) {
        char note[CKPT_NOTE_MAX];
        MS_CHECK_GOTO(ms_ckpt_saver_poll(saver, true, note, sizeof note, err), st, out);
        ckpt_note(ctx, jl, note, later);
    }
    int mb_size = 0, mb_count = 1;
    ms_strategy_micro(ms_trainer_strategy(t), o->batch, &mb_size, &mb_count);
    bool trained = ms_trainer_step_index(t) > first_step;
    if (trained && (ms_trainer_strategy(t)->pp > 1 || mb_count > 1))
        MS_CHECK_GOTO(report_memory(ctx, t, base_in_use, later, err), st, out);
    if (trained && ctx->rank == 0) report_state_memory(ctx, t, created_from, later);
    if (o->trace) {
        ctx->trace.recorder = tr.rec;
        ms_recorder_set_step(tr.rec, -1);
        MS_CHECK_GOTO(tracer_finish(ctx, &tr, o->trace, o->trace_from, err), st, out);
    }
    if (o->steps > 0) {
        double vl;
        MS_CHECK_GOTO(ms_trainer_evaluate(t, MS_SPLIT_VAL, o->batches, &vl, err), st, out);
        if (ctx->rank == 0) say(later, "validation loss %.4f (%d batches)\n", vl, o->batches);
    }
    if (o->sample > 0 && !ms_trainer_model(t)->mlm_per_row) {
        const char *prompt = "And God said";
        sample = xcalloc((size_t)o->sample + strlen(prompt) + 1, 1);
        MS_CHECK_GOTO(ms_trainer_sample(t, prompt, o->sample, o->seed, sample, err), st, out);
        if (ctx->rank == 0) say(later, "\nsample:\n%s\n", sample);
    }
    if (o->save) MS_CHECK_GOTO(save_checkpoint(ctx, t, o->save, err), st, out);
    st = MS_OK;
out:
    if (log && fclose(log) != 0 && st == MS_OK)
        st = ms_fail(err, MS_ERR_IO, "cannot write the log %s (disk full?)", o->log_jsonl);
    free(sample);
    ms_ckpt_saver_destroy(saver);
    ms_trainer_destroy(t);
    ms_text_data_close(&data);
    if (job && job->live && tr.rec && o->backend == MS_BACKEND_THREADS)
        ms_live_detach_recorder(job->live, tr.rec);
    if (job && job->live && tr.gpu_rec && o->backend == MS_BACKEND_THREADS)
        ms_live_detach_recorder(job->live, tr.gpu_rec);
    tracer_free(ctx, &tr);
    ms_comm_destroy(control_comm);
    if (own.live) {
        live_job_finish(&own);
        live_job_close(&own);
    }
    return st;
}

int train_job_run(const run_opts *o) {
    ms_error err = {0};
    job_plan plan;
    train_args ta = {.o = o, .plan = &plan};
    live_job job;
    ms_status st = job_plan_resolve(o, &plan, &err);
    if (st == MS_OK) st = job_check_outputs(o, &err);
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
        return 2;
    }
    st = job_launch("train", o, &plan, train_rank, &ta, &err);
    if (ta.job) {
        live_job_finish(&job);
        live_job_close(&job);
    }
    ms_dir_unlock(save_lock);
    if (st != MS_OK) {
        fprintf(stderr, "meshscope train: %s\n", err.msg);
        job_report_flight("train", o->backend == MS_BACKEND_MPI);
        return 1;
    }
    return 0;
}

/* cmd_train.c - `meshscope train`, `meshscope eval` and `meshscope explain`.
 *
 * train: every rank builds the same model, compiles it for its strategy, and steps through
 * deterministic batches (batch i is a pure function of (seed, i), so every mesh sees the
 * same data); AdamW with global-norm clipping and warmup + cosine learning rate updates
 * each rank's shards. Rank 0 logs, samples text and writes the checkpoint. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/data/dataset.h"
#include "engine/dist/reshard.h"
#include "engine/io/safetensors.h"
#include "engine/optim/optim.h"
#include "profiler/record/clock.h"
#include "profiler/record/gather.h"
#include "profiler/record/hooks.h"
#include "cli/live_job.h"
#include "cli/session.h"
#include "traces/trace_write.h"

#define TRAIN_FLAGS                                                                                \
    "--model --data --strategy --dp --tp --cp --sp --backend --steps --seed --batch --seq --lr "   \
    "--min-lr --warmup --weight-decay --clip --log-jsonl --save --sample --log-every "             \
    "--eval-every --val-fraction --threads --trace --trace-from --web --tui --switch "             \
    "--advise-threshold --memory-cap"

/* Feeds batch rows as floats: ids, targets and positions. For BERT the batch is first turned
 * into a masked-LM batch (keyed by the batch index, so every rank masks alike). */
static ms_status feed(session *s, int32_t *ids, int32_t *tgt, float *scratch, uint64_t seed,
                      uint64_t batch, ms_error *err) {
    int n = s->model.B * s->model.T;
    ms_program *p = s->prog;
    if (s->model.mlm_per_row) ms_model_mlm_mask(&s->model, seed, batch, ids, tgt);
    for (int i = 0; i < n; i++) scratch[i] = (float)ids[i];
    MS_CHECK(ms_program_feed(p, s->model.ids, scratch, err));
    for (int i = 0; i < n; i++) scratch[i] = (float)tgt[i];
    MS_CHECK(ms_program_feed(p, s->model.targets, scratch, err));
    for (int i = 0; i < n; i++) scratch[i] = (float)(i % s->model.T);
    return ms_program_feed(p, s->model.pos, scratch, err);
}

/* Squared global gradient norm: each shard counted once (owners), summed over the world. */
static ms_status grad_norm(ms_ctx *ctx, ms_program *p, double *norm, ms_error *err) {
    double local = 0;
    for (int i = 0; i < ms_program_num_params(p); i++) {
        ms_param_view v;
        ms_program_param(p, i, &v);
        if (v.owner)
            local += ms_sumsq_f32(ms_tensor_f32(&v.grad), (size_t)ms_tensor_numel(&v.grad));
    }
    /* Two floats keep the sum's precision through a float all-reduce. */
    float parts[2] = {(float)local, (float)(local - (double)(float)local)}, sum[2];
    MS_CHECK(ms_all_reduce(ctx->world, parts, sum, 2, MS_REDUCE_SUM, err));
    *norm = sqrt((double)sum[0] + (double)sum[1]);
    return MS_OK;
}

/* Adam moments, one pair per parameter shard, allocated on the rank's device so its memory
 * counters (the views' memory per rank) include them. */
typedef struct optimizer {
    float **m, **v;
    size_t *bytes;
    int n;
    ms_device *dev;
} optimizer;

static ms_status optimizer_init(optimizer *o, ms_device *dev, ms_program *p, ms_error *err) {
    o->n = ms_program_num_params(p);
    o->dev = dev;
    o->m = xcalloc((size_t)o->n, sizeof *o->m);
    o->v = xcalloc((size_t)o->n, sizeof *o->v);
    o->bytes = xcalloc((size_t)o->n, sizeof *o->bytes);
    for (int i = 0; i < o->n; i++) {
        ms_param_view pv;
        ms_program_param(p, i, &pv);
        o->bytes[i] = ((size_t)ms_tensor_numel(&pv.data) + 1) * sizeof(float);
        MS_CHECK(ms_device_alloc(dev, o->bytes[i], (void **)&o->m[i], err));
        MS_CHECK(ms_device_alloc(dev, o->bytes[i], (void **)&o->v[i], err));
        memset(o->m[i], 0, o->bytes[i]);
        memset(o->v[i], 0, o->bytes[i]);
    }
    return MS_OK;
}

static void optimizer_free(optimizer *o) {
    for (int i = 0; i < o->n; i++) {
        if (o->m[i]) ms_device_free(o->dev, o->m[i], o->bytes[i]);
        if (o->v[i]) ms_device_free(o->dev, o->v[i], o->bytes[i]);
    }
    free(o->m), free(o->v), free(o->bytes);
    memset(o, 0, sizeof *o);
}

static ms_status evaluate(session *s, const ms_text_data *d, ms_split split, int batches,
                          int32_t *ids, int32_t *tgt, float *scratch, double *out, ms_error *err) {
    double sum = 0;
    uint64_t have = ms_text_data_eval_batches(d, split, s->model.B);
    if ((uint64_t)batches > have) batches = (int)have;
    if (batches < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the %s split is too short for one evaluation "
                       "batch of %d x %d",
                       d->path, split == MS_SPLIT_VAL ? "validation" : "training", s->model.B,
                       s->model.T + 1);
    for (int b = 0; b < batches; b++) {
        MS_CHECK(
            ms_text_data_eval(d, split, (uint64_t)b, s->model.B, 0, s->model.B, ids, tgt, err));
        MS_CHECK(feed(s, ids, tgt, scratch, 7, (uint64_t)b, err));
        float loss;
        MS_CHECK(ms_program_forward(s->prog, &loss, err));
        sum += loss;
    }
    *out = sum / batches;
    return MS_OK;
}

/* Generates n bytes after a prompt, sampling with temperature 0.8 from row 0's logits. */
/* Rank 0's closing lines: printed at once, or, while the TUI owns the terminal, kept and
 * printed once it has given the terminal back. */
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

static ms_status sample_text(ms_ctx *ctx, session *s, int n, uint64_t seed, ms_strbuf *later,
                             ms_error *err) {
    int B = s->model.B, T = s->model.T, V = s->cfg.vocab_size;
    const char *prompt = "And God said";
    int32_t *ids = xcalloc((size_t)B * T, sizeof *ids), *tgt = xcalloc((size_t)B * T, sizeof *tgt);
    float *scratch = xmalloc(sizeof(float) * (size_t)B * T);
    int len = (int)strlen(prompt);
    if (len > T) len = T;
    char *out = xcalloc((size_t)n + (size_t)len + 1, 1);
    memcpy(out, prompt, (size_t)len);
    int total = len;
    ms_status st = MS_OK;
    for (int k = 0; k < n && st == MS_OK; k++) {
        int ctxlen = total < T ? total : T;
        for (int t = 0; t < T; t++)
            ids[t] = t < ctxlen ? (unsigned char)out[total - ctxlen + t] : 0;
        st = feed(s, ids, tgt, scratch, seed, (uint64_t)k, err);
        float loss;
        if (st == MS_OK) st = ms_program_forward(s->prog, &loss, err);
        ms_tensor logits = {0};
        if (st == MS_OK) st = ms_program_value(s->prog, s->model.logits, &logits, err);
        if (st != MS_OK) break;
        const float *row = ms_tensor_f32(&logits) + (size_t)(ctxlen - 1) * V;
        double mx = row[0], z = 0;
        for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < V; v++) z += exp((row[v] - mx) / 0.8);
        double u = ms_philox_uniform(seed, 99, (uint64_t)k) * z, acc = 0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            acc += exp((row[v] - mx) / 0.8);
            if (acc >= u) {
                pick = v;
                break;
            }
        }
        out[total++] = (char)(pick < 32 && pick != '\n' ? ' ' : pick);
        ms_tensor_release(&logits);
    }
    if (st == MS_OK && ctx->rank == 0) {
        say(later, "\nsample:\n");
        say(later, "%s\n", out);
    }
    free(ids), free(tgt), free(scratch), free(out);
    return st;
}

static ms_status save_checkpoint(ms_ctx *ctx, session *s, const char *path, ms_error *err) {
    int n = ms_program_num_params(s->prog);
    ms_st_entry *e = xcalloc((size_t)n, sizeof *e);
    ms_tensor *full = xcalloc((size_t)n, sizeof *full);
    ms_status st = MS_OK;
    for (int i = 0; i < n && st == MS_OK; i++) {
        ms_param_view pv;
        ms_program_param(s->prog, i, &pv);
        ms_dtensor t = {.ndim = pv.gshape.ndim, .mesh = s->dm, .pl = pv.pl, .local = pv.data};
        memcpy(t.gshape, pv.gshape.d, sizeof t.gshape);
        st = ms_dtensor_full(&t, &full[i], err);
        ms_shape fs;
        ms_model_checkpoint_shape(pv.name, &pv.gshape, &fs);
        e[i] = (ms_st_entry){.name = pv.name, .dtype = MS_F32, .ndim = fs.ndim};
        memcpy(e[i].shape, fs.d, sizeof e[i].shape);
        e[i].data = ms_tensor_f32(&full[i]);
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

/* Tracing: each rank records into its own ring; rank 0 gathers what is new every few steps
 * (bounded per call) over a private communicator, so the gathering is not itself traced,
 * and writes one Chrome trace at the end. The live views read the threads backend's rings
 * directly; under MPI the gathered events also feed rank 0's live model. */
typedef struct tracer {
    ms_recorder *rec;
    ms_comm *comm; /* private: split from the world before the world is probed */
    uint64_t cursor;
    int64_t clock_offset;
    bool keep;     /* keep gathered events for the trace file (--trace) */
    bool live_mpi; /* every rank: live views under MPI (gather events and groups for them) */
    ms_live *feed; /* rank 0 under MPI: gathered events go to the live model */
    ms_event *all; /* rank 0 */
    size_t n, cap;
} tracer;

#define TRACE_RING       (1u << 16)
#define TRACE_GATHER_MAX (1u << 15)

static ms_status tracer_start(ms_ctx *ctx, tracer *t, ms_error *err) {
    memset(t, 0, sizeof *t);
    MS_CHECK(ms_comm_split(ctx->world, 0, ctx->rank, "trace", &t->comm, err));
    int64_t unc;
    MS_CHECK(ms_clock_align(t->comm, 8, &t->clock_offset, &unc, err));
    MS_CHECK(ms_recorder_create(ctx->rank, TRACE_RING, &t->rec, err));
    ms_ctx_set_recorder(ctx, t->rec);
    return MS_OK;
}

static ms_status tracer_gather(ms_ctx *ctx, tracer *t, ms_error *err) {
    for (;;) {
        if (ctx->rank == 0 && t->cap - t->n < (size_t)ctx->world_size * TRACE_GATHER_MAX) {
            t->cap = t->cap * 2 + (size_t)ctx->world_size * TRACE_GATHER_MAX;
            t->all = xrealloc(t->all, sizeof *t->all * t->cap);
        }
        size_t got = 0;
        MS_CHECK(ms_gather_events(t->comm, t->rec, &t->cursor, TRACE_GATHER_MAX,
                                  ctx->rank == 0 ? t->all + t->n : NULL, &got, t->clock_offset,
                                  err));
        if (ctx->rank == 0 && t->feed) ms_live_feed_events(t->feed, t->all + t->n, got);
        if (t->keep) t->n += got;
        /* Agree on whether any rank still has events waiting. */
        float more = ms_recorder_pushed(t->rec) > t->cursor ? 1.0f : 0.0f, any = 0;
        MS_CHECK(ms_all_reduce(t->comm, &more, &any, 1, MS_REDUCE_MAX, err));
        if (any == 0) break;
    }
    if (t->live_mpi) {
        /* The live model needs the groups to draw the heatmap (collective: every rank). */
        ms_group groups[256];
        int ng = 0;
        MS_CHECK(ms_gather_groups(t->comm, t->rec, groups, 256, &ng, err));
        if (ctx->rank == 0 && t->feed) ms_live_feed_groups(t->feed, groups, ng);
    }
    return MS_OK;
}

static ms_status tracer_finish(ms_ctx *ctx, tracer *t, const char *path, int64_t from,
                               ms_error *err) {
    MS_CHECK(tracer_gather(ctx, t, err));
    ms_group groups[512];
    int ng = 0;
    MS_CHECK(ms_gather_groups(t->comm, t->rec, groups, 512, &ng, err));
    if (ctx->rank != 0) return MS_OK;
    /* Recording starts at step 0 when the live views need it; the file keeps --trace-from on
     * (and what follows the last step: the final gather, memory). */
    size_t w = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->all[i].step < 0 ? t->all[i].t0_ns > 0 : t->all[i].step >= from)
            t->all[w++] = t->all[i];
    t->n = w;
    ms_trace_meta meta = {.backend = ms_comm_backend(ctx->world), .world_size = ctx->world_size};
    MS_CHECK(ms_trace_write(path, t->all, t->n, groups, ng, &meta, err));
    printf("trace: %zu events from %d ranks in %s (dropped %llu on rank 0)\n", t->n,
           ctx->world_size, path, (unsigned long long)ms_recorder_dropped(t->rec));
    return MS_OK;
}

static void tracer_free(ms_ctx *ctx, tracer *t) {
    if (t->rec) ms_ctx_set_recorder(ctx, NULL);
    ms_recorder_destroy(t->rec);
    ms_comm_destroy(t->comm);
    free(t->all);
    memset(t, 0, sizeof *t);
}

/* Moves one buffer of `gshape` from placements `from` on the old mesh to `to` on the new
 * one (send/recv of only what changes hands; collective over the world). */
static ms_status move_buffer(ms_dmesh *old_dm, ms_dmesh *new_dm, const ms_shape *gshape,
                             const ms_placements *from, const float *src, const ms_tensor *like,
                             const ms_placements *to, float *dst, ms_error *err) {
    ms_dtensor a = {.ndim = gshape->ndim, .mesh = old_dm, .pl = *from}, b = {0};
    memcpy(a.gshape, gshape->d, sizeof a.gshape);
    MS_CHECK(ms_tensor_wrap((void *)src, MS_F32, like->ndim, like->shape, &a.local, err));
    ms_status st = ms_reshard_cross_mesh(&a, new_dm, to, &b, NULL, err);
    ms_tensor_release(&a.local);
    if (st != MS_OK) return st;
    memcpy(dst, ms_tensor_f32(&b.local), sizeof(float) * (size_t)ms_tensor_numel(&b.local));
    ms_dtensor_release(&b);
    return MS_OK;
}

/* Switches the running job to `target` at a step boundary: compiles the model for the new
 * mesh, reshards every parameter and both Adam moments from the old placements to the new
 * ones in memory, and swaps the session. On failure the old session and optimizer stay. */
static ms_status switch_strategy(ms_ctx *ctx, const run_opts *o, session *s, optimizer *opt,
                                 const ms_strategy *target, ms_error *err) {
    session ns;
    MS_CHECK(session_open_strategy(ctx, o, target, o->sample > 0, &ns, err));
    optimizer no = {0};
    ms_status st = optimizer_init(&no, ctx->device, ns.prog, err);
    for (int i = 0; i < opt->n && st == MS_OK; i++) {
        ms_param_view a, b;
        ms_program_param(s->prog, i, &a);
        ms_program_param(ns.prog, i, &b);
        if (strcmp(a.name, b.name)) {
            st = ms_fail(err, MS_ERR_INTERNAL, "switch: parameter %d is %s here but %s there", i,
                         a.name, b.name);
            break;
        }
        const float *srcs[3] = {ms_tensor_f32(&a.data), opt->m[i], opt->v[i]};
        float *dsts[3] = {ms_tensor_f32(&b.data), no.m[i], no.v[i]};
        for (int k = 0; k < 3 && st == MS_OK; k++)
            st = move_buffer(s->dm, ns.dm, &a.gshape, &a.pl, srcs[k], &a.data, &b.pl, dsts[k], err);
    }
    if (st != MS_OK) {
        optimizer_free(&no);
        session_close(&ns);
        return st;
    }
    optimizer_free(opt);
    *opt = no;
    session_close(s);
    *s = ns;
    return MS_OK;
}

/* Rank 0's record of a switch, to report predicted against measured gain once the new
 * strategy has run SWITCH_MEASURE steps. */
#define SWITCH_MEASURE 10
#define RECENT_STEPS   16
typedef struct switch_report {
    int64_t step; /* first step under the new strategy, -1: none pending */
    int32_t suggestion;
    double predicted_gain, before_ms;
} switch_report;

/* Carries out a control decision taken at this step boundary (every rank). */
static ms_status apply_control(ms_ctx *ctx, const run_opts *o, live_job *job, const control *c,
                               int step, session *s, optimizer *opt, const double *recent,
                               int n_recent, switch_report *rep, ms_error *err) {
    ms_strategy target;
    ms_error why = {0};
    ms_status st =
        ms_strategy_from_json(c->strategy, strlen(c->strategy), "strategy", &target, &why);
    char before[64];
    snprintf(before, sizeof before, "%s", s->strat.text);
    if (st == MS_OK) {
        int64_t t0 = ms_now_ns();
        st = switch_strategy(ctx, o, s, opt, &target, &why);
        if (st == MS_OK && ctx->rank == 0) {
            double ms = (ms_now_ns() - t0) / 1e6;
            if (!o->tui)
                printf("step %5d  switched %s -> %s in %.1f ms (parameters and Adam moments "
                       "resharded in memory)\n",
                       step, before, s->strat.text, ms);
            if (job && job->live) {
                live_job_set_current(job, &s->strat);
                ms_live_set_event(job->live, "switched %s -> %s at step %d in %.0f ms", before,
                                  s->strat.text, step, ms);
                double gain = 0;
                const ms_snapshot *snap = ms_live_acquire(job->live);
                for (int i = 0; i < snap->n_suggestions; i++)
                    if (snap->suggestions[i].id == c->suggestion)
                        gain = snap->suggestions[i].predicted_gain;
                ms_snapshot_release(snap);
                if (c->suggestion)
                    ms_live_update_suggestion(job->live, c->suggestion, MS_SUGG_APPLIED, step,
                                              "applied; measuring");
                *rep = (switch_report){.step = step,
                                       .suggestion = c->suggestion,
                                       .predicted_gain = gain,
                                       .before_ms = live_job_median(recent, n_recent)};
            }
        }
    }
    if (st == MS_OK || st == MS_ERR_INVALID || st == MS_ERR_UNSUPPORTED) {
        /* A target the job cannot take is refused; training goes on unchanged. */
        if (st != MS_OK && ctx->rank == 0) {
            if (!o->tui) printf("step %5d  switch refused: %s\n", step, why.msg);
            if (job && job->live) {
                ms_live_set_event(job->live, "switch refused: %s", why.msg);
                if (c->suggestion)
                    ms_live_update_suggestion(job->live, c->suggestion, MS_SUGG_REFUSED, -1,
                                              why.msg);
            }
        }
        return MS_OK;
    }
    *err = why;
    return st;
}

/* After SWITCH_MEASURE steps under the new strategy: predicted against measured gain. */
static void report_switch(live_job *job, switch_report *rep, int step, const double *recent,
                          int n_recent) {
    if (rep->step < 0 || step < rep->step + SWITCH_MEASURE || !job || !job->live) return;
    int n = n_recent < SWITCH_MEASURE ? n_recent : SWITCH_MEASURE;
    double after = live_job_median(recent + n_recent - n, n);
    double measured = rep->before_ms > 0 ? 1 - after / rep->before_ms : 0;
    char text[MS_LIVE_TEXT];
    snprintf(text, sizeof text,
             "predicted %.0f%% faster, measured %.0f%% (median step %.1f ms before, %.1f ms "
             "after)",
             rep->predicted_gain * 100, measured * 100, rep->before_ms, after);
    if (rep->suggestion)
        ms_live_update_suggestion(job->live, rep->suggestion, MS_SUGG_APPLIED, rep->step, text);
    ms_live_set_event(job->live, "switch at step %lld: %s", (long long)rep->step, text);
    rep->step = -1;
}

typedef struct train_args {
    const run_opts *o;
    live_job *job; /* threads backend: shared by the ranks; NULL otherwise */
} train_args;

static ms_status train_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const train_args *ta = arg;
    const run_opts *o = ta->o;
    session s;
    ms_text_data data = {0};
    FILE *log = NULL;
    optimizer opt = {0};
    int32_t *ids = NULL, *tgt = NULL;
    float *scratch = NULL;
    tracer tr = {0};
    live_job own = {0}, *job = ta->job;
    bool live_on = live_job_wanted(o);
    bool quiet = o->tui; /* the TUI owns the terminal */
    float last_loss = NAN;
    ms_status st;
    memset(&s, 0, sizeof s);
    if (live_on && o->backend == MS_BACKEND_MPI && ctx->rank == 0) {
        MS_CHECK_GOTO(live_job_open(&own, o, ctx->world_size, err), st, out);
        job = &own;
    }
    if (o->trace || live_on) {
        MS_CHECK_GOTO(tracer_start(ctx, &tr, err), st, out);
        tr.keep = o->trace != NULL;
        tr.live_mpi = live_on && o->backend == MS_BACKEND_MPI;
        if (job && job->live) {
            if (o->backend == MS_BACKEND_MPI)
                tr.feed = job->live;
            else
                ms_live_attach_recorder(job->live, tr.rec);
        }
    }
    MS_CHECK_GOTO(session_open(ctx, o, o->sample > 0, &s, err), st, out);
    MS_CHECK_GOTO(ms_text_data_open(o->data, o->seq, o->val_fraction, &data, err), st, out);
    if (ctx->rank == 0 && o->log_jsonl) {
        log = fopen(o->log_jsonl, "w");
        if (!log) {
            st = ms_fail(err, MS_ERR_IO, "cannot write the log %s", o->log_jsonl);
            goto out;
        }
    }
    MS_CHECK_GOTO(optimizer_init(&opt, ctx->device, s.prog, err), st, out);
    int B = o->batch, T = o->seq;
    ids = xmalloc(sizeof *ids * (size_t)B * T);
    tgt = xmalloc(sizeof *tgt * (size_t)B * T);
    scratch = xmalloc(sizeof *scratch * (size_t)B * T);
    ms_lr_schedule sched = {
        .lr_max = o->lr, .lr_min = o->min_lr, .warmup_steps = o->warmup, .total_steps = o->steps};
    ms_adamw_opts aw = {.lr = (float)o->lr,
                        .beta1 = 0.9f,
                        .beta2 = 0.95f,
                        .eps = 1e-8f,
                        .weight_decay = (float)o->weight_decay};
    ms_program_stats stats;
    ms_program_stats_get(s.prog, &stats);
    if (ctx->rank == 0 && job && job->live) live_job_set_current(job, &s.strat);
    ms_strbuf *later = quiet && job ? &job->epilogue : NULL;
    if (ctx->rank == 0 && !quiet) {
        char m[128];
        printf("training %s (%d layers, %d heads, %d channels, vocab %d) on %s, %d ranks, %s "
               "backend\n",
               o->model, s.cfg.n_layer, s.cfg.n_head, s.cfg.n_embd, s.cfg.vocab_size, s.strat.text,
               ctx->world_size, ms_comm_backend(ctx->world));
        printf("mesh %s; %d reshards per step (%.1f KiB on rank 0); data %s (%zu bytes)\n",
               ms_mesh_str(&s.mesh, m, sizeof m), stats.n_reshards, stats.reshard_bytes / 1024,
               o->data, data.nbytes);
        fflush(stdout);
    }
    double recent[RECENT_STEPS];
    int n_recent = 0;
    switch_report rep = {.step = -1};
    for (int step = 0; step < o->steps; step++) {
        if (live_on) {
            control c;
            MS_CHECK_GOTO(live_job_control(job, tr.comm, step, &c, err), st, out);
            if (c.kind == CONTROL_STOP) {
                if (ctx->rank == 0)
                    say(later, "step %5d  stopped on request (last loss %.4f)\n", step, last_loss);
                break;
            }
            if (c.kind == CONTROL_SWITCH) {
                MS_CHECK_GOTO(
                    apply_control(ctx, o, job, &c, step, &s, &opt, recent, n_recent, &rep, err), st,
                    out);
                n_recent = 0;
            }
        }
        int64_t t0 = ms_now_ns();
        if (tr.rec) {
            /* Attached from the start (so every communicator is probed), recording from
             * --trace-from on (from step 0 when the live views need the events). */
            ctx->trace.recorder = step >= o->trace_from || live_on ? tr.rec : NULL;
            ms_recorder_set_step(tr.rec, step);
        }
        MS_CHECK_GOTO(ms_text_data_sample(&data, MS_SPLIT_TRAIN, o->seed, (uint64_t)step, B, 0, B,
                                          ids, tgt, err),
                      st, out);
        MS_CHECK_GOTO(feed(&s, ids, tgt, scratch, o->seed, (uint64_t)step, err), st, out);
        ms_record_span(&ctx->trace, MS_EV_DATA, t0);
        float loss;
        MS_CHECK_GOTO(ms_program_step(s.prog, &loss, err), st, out);
        last_loss = loss;
        double norm;
        MS_CHECK_GOTO(grad_norm(ctx, s.prog, &norm, err), st, out);
        float scale = o->clip > 0 ? ms_clip_scale(norm, o->clip) : 1.0f;
        int64_t t_opt = ms_now_ns();
        aw.lr = (float)ms_lr_at(&sched, step);
        for (int i = 0; i < opt.n; i++) {
            ms_param_view pv;
            ms_program_param(s.prog, i, &pv);
            size_t n = (size_t)ms_tensor_numel(&pv.data);
            MS_CHECK_GOTO(ms_adamw_step_scaled(ms_tensor_f32(&pv.data), ms_tensor_f32(&pv.grad),
                                               opt.m[i], opt.v[i], n, &aw, step + 1, scale, err),
                          st, out);
        }
        ms_record_span(&ctx->trace, MS_EV_OPTIM, t_opt);
        ms_record_span(&ctx->trace, MS_EV_STEP, t0);
        ms_record_memory(&ctx->trace, ctx->device);
        double ms = (ms_now_ns() - t0) / 1e6;
        double tps = (double)B * T / (ms / 1e3);
        if (n_recent == RECENT_STEPS) memmove(recent, recent + 1, sizeof *recent * --n_recent);
        recent[n_recent++] = ms;
        if (ctx->rank == 0) {
            if (job && job->live) {
                ms_live_step rec = {.step = step,
                                    .loss = loss,
                                    .step_s = ms / 1e3,
                                    .tokens_per_s = tps,
                                    .lr = aw.lr,
                                    .grad_norm = norm};
                snprintf(rec.strategy, sizeof rec.strategy, "%s", s.strat.text);
                ms_live_step_done(job->live, &rec);
                report_switch(job, &rep, step, recent, n_recent);
            }
            if (log) {
                fprintf(log,
                        "{\"step\": %d, \"loss\": %.6f, \"step_ms\": %.3f, \"tokens_per_s\": %.1f, "
                        "\"lr\": %.6g, \"grad_norm\": %.5f, \"strategy\": \"%s\"}\n",
                        step, loss, ms, tps, aw.lr, norm, s.strat.text);
                fflush(log);
            }
            if (!quiet && (step % o->log_every == 0 || step == o->steps - 1)) {
                printf("step %5d  loss %.4f  %7.1f ms  %8.0f tok/s  lr %.2e  |g| %.3f\n", step,
                       loss, ms, tps, aw.lr, norm);
                fflush(stdout);
            }
        }
        if (tr.rec && (o->trace || tr.live_mpi) && step % 10 == 9)
            MS_CHECK_GOTO(tracer_gather(ctx, &tr, err), st, out);
        if (o->eval_every && step && step % o->eval_every == 0) {
            double vl;
            MS_CHECK_GOTO(
                evaluate(&s, &data, MS_SPLIT_VAL, o->batches, ids, tgt, scratch, &vl, err), st,
                out);
            if (ctx->rank == 0 && !quiet) printf("step %5d  validation loss %.4f\n", step, vl);
        }
    }
    if (o->trace) {
        ctx->trace.recorder = tr.rec;
        ms_recorder_set_step(tr.rec, -1);
        MS_CHECK_GOTO(tracer_finish(ctx, &tr, o->trace, o->trace_from, err), st, out);
    }
    if (o->steps > 0) {
        double vl;
        MS_CHECK_GOTO(evaluate(&s, &data, MS_SPLIT_VAL, o->batches, ids, tgt, scratch, &vl, err),
                      st, out);
        if (ctx->rank == 0) say(later, "validation loss %.4f (%d batches)\n", vl, o->batches);
    }
    if (o->sample > 0 && !s.model.mlm_per_row)
        MS_CHECK_GOTO(sample_text(ctx, &s, o->sample, o->seed, later, err), st, out);
    if (o->save) MS_CHECK_GOTO(save_checkpoint(ctx, &s, o->save, err), st, out);
    st = MS_OK;
out:
    if (log) fclose(log);
    optimizer_free(&opt);
    free(ids), free(tgt), free(scratch);
    ms_text_data_close(&data);
    session_close(&s);
    if (job && job->live && tr.rec && o->backend == MS_BACKEND_THREADS)
        ms_live_detach_recorder(job->live, tr.rec);
    tracer_free(ctx, &tr);
    if (own.live) {
        live_job_finish(&own);
        live_job_close(&own);
    }
    return st;
}

int ms_cmd_train(int argc, char **argv) {
    run_opts o;
    int rc = run_opts_parse("train", argc, argv, TRAIN_FLAGS, &o);
    if (rc) return rc;
    if (!o.data) {
        fprintf(stderr, "meshscope train: --data FILE is required (a text file; `make run` "
                        "prepares data/kjv.txt)\n");
        return 2;
    }
    train_args ta = {.o = &o};
    live_job job;
    if (live_job_wanted(&o)) {
        /* Bad --switch targets fail here, on every process, before any rank starts. The live
         * model, dashboard and TUI live in this process, shared by the rank threads; under
         * MPI rank 0's process opens them. */
        ms_error err = {0};
        ms_strategy strat;
        ms_model_config cfg;
        ms_status st = ms_config_load(o.model, &cfg, &err);
        if (st == MS_OK) st = session_strategy(&o, &cfg, &strat, &err);
        if (st == MS_OK) st = live_job_check_options(&o, ms_strategy_ranks(&strat), &err);
        if (st == MS_OK && o.backend == MS_BACKEND_THREADS) {
            st = live_job_open(&job, &o, ms_strategy_ranks(&strat), &err);
            ta.job = &job;
        }
        if (st != MS_OK) {
            fprintf(stderr, "meshscope train: %s\n", err.msg);
            return 2;
        }
    }
    rc = session_launch("train", &o, train_rank, &ta);
    if (ta.job) {
        live_job_finish(&job);
        live_job_close(&job);
    }
    return rc;
}

/* --- eval ------------------------------------------------------------------------------------ */

static ms_status eval_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const run_opts *o = arg;
    session s;
    ms_text_data data = {0};
    ms_st_file ck = {0};
    int32_t *ids = NULL, *tgt = NULL;
    float *scratch = NULL;
    ms_status st;
    MS_CHECK_GOTO(session_open(ctx, o, false, &s, err), st, out);
    MS_CHECK_GOTO(ms_safetensors_read(o->checkpoint, &ck, err), st, out);
    int n = ms_program_num_params(s.prog);
    ms_st_expect *want = xcalloc((size_t)n, sizeof *want);
    for (int i = 0; i < n; i++) {
        ms_param_view pv;
        ms_program_param(s.prog, i, &pv);
        ms_shape fs;
        ms_model_checkpoint_shape(pv.name, &pv.gshape, &fs);
        want[i].name = pv.name;
        want[i].ndim = fs.ndim;
        memcpy(want[i].shape, fs.d, sizeof want[i].shape);
    }
    st = ms_safetensors_check(&ck, want, n, err);
    free(want);
    if (st != MS_OK) goto out;
    for (int i = 0; i < n; i++) {
        ms_param_view pv;
        ms_program_param(s.prog, i, &pv);
        MS_CHECK_GOTO(
            ms_program_load_param(s.prog, i, ms_safetensors_find(&ck, pv.name)->data, err), st,
            out);
    }
    MS_CHECK_GOTO(ms_text_data_open(o->data, o->seq, 0.0, &data, err), st, out);
    ids = xmalloc(sizeof *ids * (size_t)o->batch * o->seq);
    tgt = xmalloc(sizeof *tgt * (size_t)o->batch * o->seq);
    scratch = xmalloc(sizeof *scratch * (size_t)o->batch * o->seq);
    if (ms_text_data_eval_batches(&data, MS_SPLIT_ALL, o->batch) < (uint64_t)o->batches) {
        st = ms_fail(err, MS_ERR_INVALID, "%s: too short for %d batches of %d x %d bytes", o->data,
                     o->batches, o->batch, o->seq + 1);
        goto out;
    }
    double loss;
    MS_CHECK_GOTO(evaluate(&s, &data, MS_SPLIT_ALL, o->batches, ids, tgt, scratch, &loss, err), st,
                  out);
    if (ctx->rank == 0) printf("{\"loss\": %.6f}\n", loss);
out:
    free(ids), free(tgt), free(scratch);
    ms_text_data_close(&data);
    ms_safetensors_free(&ck);
    session_close(&s);
    return st;
}

int ms_cmd_eval(int argc, char **argv) {
    run_opts o;
    int rc =
        run_opts_parse("eval", argc, argv,
                       "--model --checkpoint --data --batch --seq --batches --dp --tp --cp --sp "
                       "--strategy --backend",
                       &o);
    if (rc) return rc;
    if (!o.checkpoint || !o.data) {
        fprintf(stderr, "meshscope eval: --checkpoint FILE and --data FILE are required\n");
        return 2;
    }
    return session_launch("eval", &o, eval_rank, &o);
}

/* --- explain --------------------------------------------------------------------------------- */

static ms_status explain_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const run_opts *o = arg;
    session s;
    ms_status st = session_open(ctx, o, false, &s, err);
    if (st == MS_OK && ctx->rank == 0) {
        printf("strategy %s, batch %d, sequence %d\n", s.strat.text, o->batch, o->seq);
        ms_program_explain(s.prog, stdout);
    }
    session_close(&s);
    return st;
}

int ms_cmd_explain(int argc, char **argv) {
    run_opts o;
    int rc = run_opts_parse("explain", argc, argv,
                            "--model --strategy --dp --tp --cp --sp --batch --seq --backend", &o);
    if (rc) return rc;
    return session_launch("explain", &o, explain_rank, &o);
}

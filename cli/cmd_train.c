/* cmd_train.c - `meshscope train`, `meshscope eval` and `meshscope explain`.
 *
 * train: every rank builds the same model, compiles it for its strategy, and steps through
 * deterministic batches (batch i is a pure function of (seed, i), so every mesh sees the
 * same data); AdamW with global-norm clipping and warmup + cosine learning rate updates
 * each rank's shards. Rank 0 logs, samples text and writes the checkpoint. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "core/philox.h"
#include "core/xalloc.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "optim/optim.h"
#include "profiler/clock.h"
#include "profiler/gather.h"
#include "profiler/hooks.h"
#include "session.h"
#include "traces/trace_write.h"

#define TRAIN_FLAGS                                                                                \
    "--model --data --strategy --dp --tp --cp --sp --backend --steps --seed --batch --seq --lr "   \
    "--min-lr --warmup --weight-decay --clip --log-jsonl --save --sample --log-every "             \
    "--eval-every --val-fraction --threads --trace --trace-from"

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

typedef struct optimizer {
    float **m, **v;
    int n;
} optimizer;

static void optimizer_init(optimizer *o, ms_program *p) {
    o->n = ms_program_num_params(p);
    o->m = xcalloc((size_t)o->n, sizeof *o->m);
    o->v = xcalloc((size_t)o->n, sizeof *o->v);
    for (int i = 0; i < o->n; i++) {
        ms_param_view pv;
        ms_program_param(p, i, &pv);
        o->m[i] = xcalloc((size_t)ms_tensor_numel(&pv.data) + 1, sizeof(float));
        o->v[i] = xcalloc((size_t)ms_tensor_numel(&pv.data) + 1, sizeof(float));
    }
}

static void optimizer_free(optimizer *o) {
    for (int i = 0; i < o->n; i++) free(o->m[i]), free(o->v[i]);
    free(o->m), free(o->v);
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
static ms_status sample_text(ms_ctx *ctx, session *s, int n, uint64_t seed, ms_error *err) {
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
    if (st == MS_OK && ctx->rank == 0) printf("\nsample:\n%s\n", out);
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

/* Tracing: each rank records into its own ring; every few steps rank 0 gathers what is new
 * (bounded per call) over a private communicator, so the gathering is not itself traced,
 * and writes one Chrome trace at the end. */
typedef struct tracer {
    ms_recorder *rec;
    ms_comm *comm; /* private: split from the world before the world is probed */
    uint64_t cursor;
    int64_t clock_offset;
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
        t->n += got;
        /* Agree on whether any rank still has events waiting. */
        float more = ms_recorder_pushed(t->rec) > t->cursor ? 1.0f : 0.0f, any = 0;
        MS_CHECK(ms_all_reduce(t->comm, &more, &any, 1, MS_REDUCE_MAX, err));
        if (any == 0) return MS_OK;
    }
}

static ms_status tracer_finish(ms_ctx *ctx, tracer *t, const char *path, ms_error *err) {
    MS_CHECK(tracer_gather(ctx, t, err));
    ms_group groups[512];
    int ng = 0;
    MS_CHECK(ms_gather_groups(t->comm, t->rec, groups, 512, &ng, err));
    if (ctx->rank != 0) return MS_OK;
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

static ms_status train_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const run_opts *o = arg;
    session s;
    ms_text_data data = {0};
    FILE *log = NULL;
    optimizer opt = {0};
    int32_t *ids = NULL, *tgt = NULL;
    float *scratch = NULL;
    tracer tr = {0};
    ms_status st;
    memset(&s, 0, sizeof s);
    if (o->trace) MS_CHECK_GOTO(tracer_start(ctx, &tr, err), st, out);
    MS_CHECK_GOTO(session_open(ctx, o, o->sample > 0, &s, err), st, out);
    MS_CHECK_GOTO(ms_text_data_open(o->data, o->seq, o->val_fraction, &data, err), st, out);
    if (ctx->rank == 0 && o->log_jsonl) {
        log = fopen(o->log_jsonl, "w");
        if (!log) {
            st = ms_fail(err, MS_ERR_IO, "cannot write the log %s", o->log_jsonl);
            goto out;
        }
    }
    optimizer_init(&opt, s.prog);
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
    if (ctx->rank == 0) {
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
    for (int step = 0; step < o->steps; step++) {
        int64_t t0 = ms_now_ns();
        if (tr.rec) {
            /* Attached from the start (so every communicator is probed), recording from
             * --trace-from on. */
            ctx->recorder = step >= o->trace_from ? tr.rec : NULL;
            ms_recorder_set_step(tr.rec, step);
        }
        MS_CHECK_GOTO(ms_text_data_sample(&data, MS_SPLIT_TRAIN, o->seed, (uint64_t)step, B, 0, B,
                                          ids, tgt, err),
                      st, out);
        MS_CHECK_GOTO(feed(&s, ids, tgt, scratch, o->seed, (uint64_t)step, err), st, out);
        ms_record_span(ctx, MS_EV_DATA, t0);
        float loss;
        MS_CHECK_GOTO(ms_program_step(s.prog, &loss, err), st, out);
        double norm;
        MS_CHECK_GOTO(grad_norm(ctx, s.prog, &norm, err), st, out);
        float scale = o->clip > 0 ? ms_clip_scale(norm, o->clip) : 1.0f;
        int64_t t_opt = ms_now_ns();
        aw.lr = (float)ms_lr_at(&sched, step);
        for (int i = 0; i < opt.n; i++) {
            ms_param_view pv;
            ms_program_param(s.prog, i, &pv);
            size_t n = (size_t)ms_tensor_numel(&pv.data);
            if (scale != 1.0f) ms_scale_f32(ms_tensor_f32(&pv.grad), n, scale);
            MS_CHECK_GOTO(ms_adamw_step(ms_tensor_f32(&pv.data), ms_tensor_f32(&pv.grad), opt.m[i],
                                        opt.v[i], n, &aw, step + 1, err),
                          st, out);
        }
        ms_record_span(ctx, MS_EV_OPTIM, t_opt);
        ms_record_span(ctx, MS_EV_STEP, t0);
        ms_record_memory(ctx);
        double ms = (ms_now_ns() - t0) / 1e6;
        double tps = (double)B * T / (ms / 1e3);
        if (ctx->rank == 0) {
            if (log) {
                fprintf(log,
                        "{\"step\": %d, \"loss\": %.6f, \"step_ms\": %.3f, \"tokens_per_s\": %.1f, "
                        "\"lr\": %.6g, \"grad_norm\": %.5f, \"strategy\": \"%s\"}\n",
                        step, loss, ms, tps, aw.lr, norm, s.strat.text);
                fflush(log);
            }
            if (step % o->log_every == 0 || step == o->steps - 1) {
                printf("step %5d  loss %.4f  %7.1f ms  %8.0f tok/s  lr %.2e  |g| %.3f\n", step,
                       loss, ms, tps, aw.lr, norm);
                fflush(stdout);
            }
        }
        if (tr.rec && step % 10 == 9) MS_CHECK_GOTO(tracer_gather(ctx, &tr, err), st, out);
        if (o->eval_every && step && step % o->eval_every == 0) {
            double vl;
            MS_CHECK_GOTO(
                evaluate(&s, &data, MS_SPLIT_VAL, o->batches, ids, tgt, scratch, &vl, err), st,
                out);
            if (ctx->rank == 0) printf("step %5d  validation loss %.4f\n", step, vl);
        }
    }
    if (tr.rec) {
        ctx->recorder = tr.rec;
        ms_recorder_set_step(tr.rec, -1);
        MS_CHECK_GOTO(tracer_finish(ctx, &tr, o->trace, err), st, out);
    }
    if (o->steps > 0) {
        double vl;
        MS_CHECK_GOTO(evaluate(&s, &data, MS_SPLIT_VAL, o->batches, ids, tgt, scratch, &vl, err),
                      st, out);
        if (ctx->rank == 0) printf("validation loss %.4f (%d batches)\n", vl, o->batches);
    }
    if (o->sample > 0 && !s.model.mlm_per_row)
        MS_CHECK_GOTO(sample_text(ctx, &s, o->sample, o->seed, err), st, out);
    if (o->save) MS_CHECK_GOTO(save_checkpoint(ctx, &s, o->save, err), st, out);
    st = MS_OK;
out:
    if (log) fclose(log);
    optimizer_free(&opt);
    free(ids), free(tgt), free(scratch);
    ms_text_data_close(&data);
    session_close(&s);
    tracer_free(ctx, &tr);
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
    return session_launch("train", &o, train_rank, &o);
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

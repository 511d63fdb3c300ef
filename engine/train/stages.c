/* stages.c - pipeline chunks, their schedule and the transfers between stages (see stages.h). */
#include "engine/train/stages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/dmesh.h"
#include "engine/graph/program.h"
#include "engine/pipeline/balance.h"
#include "engine/pipeline/schedule.h"
#include "profiler/record/hooks.h"

#define MAX_CHUNKS 64

typedef struct chunk {
    int k; /* model chunk 0 .. p*v-1 */
    ms_model model;
    ms_program *prog;
    int *slot_of; /* [m]: the pool arena holding micro-batch j from its F to its B, or -1 */
    int *holds;   /* [m]: what micro-batch j's arena still waits for before it is free */
    /* What leaves a chunk after its micro-batch's slot is free: the input gradient after B
     * (chunks after the first), the output after a forward-only F (chunks before the last).
     * One each: a chunk's next B or F comes after the batch that sends it. */
    float *out_grad_stage, *out_act_stage;
    size_t grad_bytes, act_bytes;
    /* The input activation arrives here (chunks after the first) and moves into a slot when
     * its forward starts: a schedule may receive before the step's backward frees a slot. */
    float *in_act_stage;
    size_t in_bytes;
    int in_mb; /* the micro-batch waiting in it, or -1 */
} chunk;

struct ms_stages {
    ms_ctx *ctx;
    ms_model_config cfg;
    ms_strategy strat;
    ms_placement_rules rules;
    ms_stages_opts o;
    int p, v, m, stage, R, index; /* index: position in the stage mesh */
    int rows_mb, rows_dp;         /* rows per micro-batch, per replica and micro-batch */
    ms_mesh mesh;
    ms_dmesh **dm; /* [p]: every stage's (creating them is collective) */
    chunk ch[MAX_CHUNKS];
    int nch;
    ms_pp_action *acts, *fwd_acts; /* the training schedule, and forward-only */
    int nacts, nfwd;
    ms_comm *tie; /* first and last stage's ranks at one mesh position; NULL when p == 1 */
    /* Micro-batched: one pool of arenas for all of this rank's chunks, each as large as the
     * largest chunk's, allocated when no free one is left: the pool's size is the most
     * micro-batch units held at once, as the schedule's bound counts them. */
    bool micro;
    float **pool;
    int *pool_free;
    int npool, nfree, pool_cap;
    size_t pool_bytes;
    ms_comm_probe *tie_probe; /* its trace probe, when the run is traced */
    int tie_param[2];         /* local parameter index (ms_stages_param) of each tied copy, or -1 */
    int32_t *ids_mb, *tgt_mb;
    float *scratch;
    ms_p2p_op *ops;
    /* The catalog (ms_stages_entry), made on first use: every chunk's parameters, the other
     * stages' chunks compiled from shapes for their placements. */
    ms_stages_entry *cat;
    int ncat;
    ms_model *foreign_models;
    ms_program **foreign_progs;
    int nforeign;
};

/* --- building -------------------------------------------------------------------------------- */

static ms_status make_catalog(ms_stages *st, ms_error *err);

void ms_stages_chunk_layers(const ms_model_config *cfg, const ms_strategy *s, int k, int *lo,
                            int *hi) {
    int p = s->pp > 1 ? s->pp : 1, v = s->virtual_stages > 1 ? s->virtual_stages : 1;
    int n = cfg->n_layer, chunks = p * v;
    if (s->pp_layers[0] && v == 1) {
        int at = 0;
        for (int i = 0; i < k; i++) at += s->pp_layers[i];
        *lo = at;
        *hi = at + s->pp_layers[k];
        return;
    }
    /* Balanced by cost at the model's context length, so a strategy's split does not depend
     * on the job's sequence length. */
    ms_pp_costs costs = ms_pp_model_costs(cfg, cfg->n_positions);
    int *counts = xmalloc(sizeof *counts * (size_t)chunks);
    ms_pp_balance_layers(n, chunks, &costs, counts);
    *lo = 0;
    for (int i = 0; i < k; i++) *lo += counts[i];
    *hi = *lo + counts[k];
    free(counts);
}

ms_status ms_stages_chunk_model(const ms_model_config *cfg, const ms_strategy *s, int rows, int seq,
                                int k, ms_model *md, ms_error *err) {
    int chunks = (s->pp > 1 ? s->pp : 1) * (s->virtual_stages > 1 ? s->virtual_stages : 1);
    ms_model_chunk mc = {.first = k == 0, .last = k == chunks - 1};
    ms_stages_chunk_layers(cfg, s, k, &mc.layer_lo, &mc.layer_hi);
    MS_CHECK(ms_model_build_chunk(cfg, rows, seq, &mc, md, err));
    int b = md->hidden_in >= 0 ? md->hidden_in : md->hidden_out;
    if (b >= 0) {
        /* the residual stream's placements: what crosses every chunk boundary */
        int ndim = s->cp > 1 ? 3 : 2;
        ms_sharding sh = {.s = s, .rules = NULL};
        ms_placements pl = ms_placements_replicated(ndim);
        if (!ms_strategy_shard(&sh, "embed", ms_graph_value_shape(md->g, b), ndim, &pl))
            pl = ms_placements_replicated(ndim);
        if (md->hidden_in >= 0) ms_graph_annotate(md->g, md->hidden_in, &pl);
        if (md->hidden_out >= 0) ms_graph_annotate(md->g, md->hidden_out, &pl);
    }
    return MS_OK;
}

/* zb-h1 runs each backward in two passes (B: input gradients, W: the parameters'). */
static bool s_zb(const ms_stages *st) {
    return st->p > 1 && st->strat.schedule == MS_SCHEDULE_ZB_H1;
}

/* Model chunk k's graph for this run. */
static ms_status build_chunk(const ms_stages *st, int k, ms_model *md, ms_error *err) {
    MS_CHECK(ms_stages_chunk_model(&st->cfg, &st->strat, st->rows_mb, st->o.seq, k, md, err));
    if (st->o.keep_logits && md->logits >= 0) ms_graph_keep(md->g, md->logits);
    return MS_OK;
}

static ms_compile_opts compile_opts(const ms_stages *st, ms_sharding *sh) {
    *sh = (ms_sharding){.s = &st->strat, .rules = &st->rules, .kv_heads = st->cfg.n_kv_head};
    return (ms_compile_opts){.shard = ms_strategy_shard,
                             .shard_user = sh,
                             .seed = st->o.seed,
                             .micro_batched = st->micro,
                             .split_weight_grads = s_zb(st),
                             .loss_scale = 1.0f / (float)st->m,
                             .recompute = ms_strategy_recompute_regions(&st->strat),
                             .zero_stage = st->strat.zero,
                             .zero_dim = MS_STRATEGY_DP_DIM,
                             .bucket_mb = st->strat.bucket_mb,
                             .micro_batches = st->m,
                             .bf16 = st->strat.precision == MS_PRECISION_BF16};
}

static ms_status compile_chunk(ms_stages *st, chunk *c, ms_error *err) {
    MS_CHECK(build_chunk(st, c->k, &c->model, err));
    ms_sharding sh;
    ms_compile_opts co = compile_opts(st, &sh);
    MS_CHECK(ms_program_compile(c->model.g, st->dm[st->stage], &co, &c->prog, err));
    c->slot_of = xmalloc(sizeof(int) * (size_t)st->m);
    c->holds = xcalloc((size_t)st->m, sizeof(int));
    const ms_model *md = &c->model;
    ms_tensor *gin = ms_program_input_grad(c->prog, md->hidden_in);
    ms_tensor *out = ms_program_local(c->prog, md->hidden_out);
    ms_tensor *in = ms_program_local(c->prog, md->hidden_in);
    c->in_bytes = in ? sizeof(float) * (size_t)ms_tensor_numel(in) + 4 : 0;
    c->in_mb = -1;
    if (c->in_bytes)
        MS_CHECK(ms_device_alloc(st->ctx->device, c->in_bytes, (void **)&c->in_act_stage, err));
    c->grad_bytes = gin ? sizeof(float) * (size_t)ms_tensor_numel(gin) + 4 : 0;
    c->act_bytes = out ? sizeof(float) * (size_t)ms_tensor_numel(out) + 4 : 0;
    if (c->grad_bytes)
        MS_CHECK(ms_device_alloc(st->ctx->device, c->grad_bytes, (void **)&c->out_grad_stage, err));
    if (c->act_bytes)
        MS_CHECK(ms_device_alloc(st->ctx->device, c->act_bytes, (void **)&c->out_act_stage, err));
    for (int j = 0; j < st->m; j++) c->slot_of[j] = -1;
    return MS_OK;
}

/* The tied word embedding's two copies, found by name in the first and last chunk. */
static void find_tied(ms_stages *st) {
    st->tie_param[0] = st->tie_param[1] = -1;
    if (st->p == 1) return;
    for (int c = 0, base = 0; c < st->nch; base += ms_program_num_params(st->ch[c++].prog)) {
        chunk *ch = &st->ch[c];
        bool first = ch->k == 0, last = ch->k == st->p * st->v - 1;
        if (!first && !last) continue;
        for (int i = 0; i < ms_program_num_params(ch->prog); i++) {
            ms_param_view pv;
            ms_program_param(ch->prog, i, &pv);
            if (!strcmp(pv.name, "wte.weight") ||
                !strcmp(pv.name, "embeddings.word_embeddings.weight") ||
                !strcmp(pv.name, "model.embed_tokens.weight"))
                st->tie_param[last ? 1 : 0] = base + i;
        }
    }
}

/* The program holding local parameter i (ms_stages_param's numbering) and its index there. */
static ms_program *local_param(const ms_stages *st, int i, int *index) {
    for (int c = 0; c < st->nch && i >= 0; c++) {
        int n = ms_program_num_params(st->ch[c].prog);
        if (i < n) {
            *index = i;
            return st->ch[c].prog;
        }
        i -= n;
    }
    return NULL;
}

/* Forward-only order: micro-batches in turn, each through the chunks in model order. */
static void forward_schedule(ms_stages *st) {
    st->fwd_acts = xmalloc(sizeof *st->fwd_acts * (size_t)st->m * (size_t)st->v * 3);
    int n = 0, last = st->p * st->v - 1;
    for (int j = 0; j < st->m; j++)
        for (int c = 0; c < st->v; c++) {
            int k = c * st->p + st->stage;
            if (k > 0)
                st->fwd_acts[n++] = (ms_pp_action){MS_PP_RECV_ACT, (uint8_t)c, j, (k - 1) % st->p};
            st->fwd_acts[n++] = (ms_pp_action){MS_PP_FORWARD, (uint8_t)c, j, -1};
            if (k < last)
                st->fwd_acts[n++] = (ms_pp_action){MS_PP_SEND_ACT, (uint8_t)c, j, (k + 1) % st->p};
        }
    st->nfwd = n;
}

ms_status ms_stages_create(ms_ctx *ctx, const ms_model_config *cfg, const ms_strategy *s,
                           const ms_placement_rules *rules, const ms_stages_opts *o,
                           ms_stages **out, ms_error *err) {
    *out = NULL;
    int size = 0, count = 0;
    if (!ms_strategy_micro(s, o->batch, &size, &count))
        return ms_fail(err, MS_ERR_INVALID,
                       "the batch of %d does not split into the strategy's micro-batches",
                       o->batch);
    ms_stages *st = xcalloc(1, sizeof *st);
    st->ctx = ctx;
    st->cfg = *cfg;
    st->strat = *s;
    if (rules) st->rules = *rules;
    st->o = *o;
    st->p = s->pp > 1 ? s->pp : 1;
    st->v = s->virtual_stages > 1 ? s->virtual_stages : 1;
    st->m = count;
    st->rows_dp = size;
    st->rows_mb = size * s->dp;
    st->R = ctx->world_size / st->p;
    st->stage = ctx->rank / st->R;
    st->index = ctx->rank % st->R;
    st->tie_param[0] = st->tie_param[1] = -1;
    ms_status rc = MS_OK;
    if (st->p * st->v > MAX_CHUNKS)
        rc = ms_fail(err, MS_ERR_INVALID, "pp %d x virtual_stages %d: at most %d chunks", st->p,
                     st->v, MAX_CHUNKS);
    /* Every stage's mesh, in order: creating a dmesh splits the world. */
    st->dm = xcalloc((size_t)st->p, sizeof *st->dm);
    for (int q = 0; q < st->p && rc == MS_OK; q++) {
        ms_mesh mq;
        rc = ms_strategy_mesh(s, &mq, err);
        if (rc != MS_OK) break;
        for (int i = 0; i < st->R; i++) mq.ranks[i] = q * st->R + i;
        rc = ms_dmesh_create(ctx, &mq, &st->dm[q], err);
        if (rc == MS_OK && q == st->stage) rc = ms_mesh_copy(&st->mesh, &mq, err);
        ms_mesh_free(&mq);
    }
    st->micro = st->m > 1 || st->p > 1;
    for (int c = 0; c < st->v && rc == MS_OK; c++) {
        st->ch[c].k = c * st->p + st->stage;
        st->nch = c + 1;
        rc = compile_chunk(st, &st->ch[c], err);
        if (rc == MS_OK && ms_program_arena_bytes(st->ch[c].prog) > st->pool_bytes)
            st->pool_bytes = ms_program_arena_bytes(st->ch[c].prog);
    }
    if (rc == MS_OK && st->p > 1 && ms_model_ties_embedding(&st->cfg)) {
        bool ends = st->stage == 0 || st->stage == st->p - 1;
        rc =
            ms_comm_split(ctx->world, ends ? st->index : -1, st->stage, "embedding", &st->tie, err);
        /* Probed like every mesh dim, so the embedding's all-reduce between the first and the
         * last stage is in the trace and the heatmap. */
        if (rc == MS_OK && st->tie) st->tie_probe = ms_comm_probe_attach(&ctx->trace, st->tie, -1);
    }
    if (rc == MS_OK)
        rc = ms_pp_schedule((ms_schedule)s->schedule, st->p, st->m, st->v, st->stage, &st->acts,
                            &st->nacts, err);
    if (rc != MS_OK) {
        ms_stages_destroy(st);
        return rc;
    }
    find_tied(st);
    forward_schedule(st);
    rc = make_catalog(st, err);
    if (rc != MS_OK) {
        ms_stages_destroy(st);
        return rc;
    }
    size_t n = (size_t)st->rows_mb * (size_t)o->seq;
    st->ids_mb = xmalloc(sizeof *st->ids_mb * n);
    st->tgt_mb = xmalloc(sizeof *st->tgt_mb * n);
    st->scratch = xmalloc(sizeof *st->scratch * n);
    st->ops = xmalloc(sizeof *st->ops * (size_t)(st->nacts + st->nfwd + 1));
    *out = st;
    return MS_OK;
}

void ms_stages_destroy(ms_stages *st) {
    if (!st) return;
    for (int c = 0; c < st->nch; c++) {
        ms_program_destroy(st->ch[c].prog);
        ms_model_free(&st->ch[c].model);
        free(st->ch[c].slot_of);
        free(st->ch[c].holds);
        if (st->ch[c].out_grad_stage)
            ms_device_free(st->ctx->device, st->ch[c].out_grad_stage, st->ch[c].grad_bytes);
        if (st->ch[c].out_act_stage)
            ms_device_free(st->ctx->device, st->ch[c].out_act_stage, st->ch[c].act_bytes);
        if (st->ch[c].in_act_stage)
            ms_device_free(st->ctx->device, st->ch[c].in_act_stage, st->ch[c].in_bytes);
    }
    ms_comm_destroy(st->tie);
    for (int i = 0; i < st->npool; i++)
        ms_device_free(st->ctx->device, st->pool[i], st->pool_bytes);
    free(st->pool), free(st->pool_free);
    ms_comm_probe_free(st->tie_probe);
    for (int q = 0; st->dm && q < st->p; q++) ms_dmesh_destroy(st->dm[q]);
    free(st->dm);
    ms_mesh_free(&st->mesh);
    free(st->acts);
    free(st->fwd_acts);
    free(st->ids_mb), free(st->tgt_mb), free(st->scratch);
    free(st->ops);
    for (int i = 0; i < st->nforeign; i++) {
        ms_program_destroy(st->foreign_progs[i]);
        ms_model_free(&st->foreign_models[i]);
    }
    free(st->foreign_progs), free(st->foreign_models);
    free(st->cat);
    free(st);
}

/* --- running the schedule -------------------------------------------------------------------- */

/* Micro-batch j's rows of the global batch: on each replica r, rows j*b .. j*b + b-1 of its
 * share. Feeds ids and positions (first chunk) and targets (last chunk). */
static ms_status feed(ms_stages *st, chunk *c, int j, const int32_t *ids, const int32_t *tgt,
                      ms_error *err) {
    const ms_model *md = &c->model;
    int T = st->o.seq, dp = st->strat.dp, per = st->o.batch / dp, b = st->rows_dp;
    for (int r = 0; r < dp; r++)
        for (int i = 0; i < b; i++) {
            size_t from = ((size_t)r * per + (size_t)j * b + i) * T, to = ((size_t)r * b + i) * T;
            memcpy(st->ids_mb + to, ids + from, sizeof *ids * (size_t)T);
            memcpy(st->tgt_mb + to, tgt + from, sizeof *tgt * (size_t)T);
        }
    int n = st->rows_mb * T;
    if (md->ids >= 0) {
        for (int i = 0; i < n; i++) st->scratch[i] = (float)st->ids_mb[i];
        MS_CHECK(ms_program_feed(c->prog, md->ids, st->scratch, err));
        for (int i = 0; i < n; i++) st->scratch[i] = (float)(i % T);
        if (md->pos >= 0) MS_CHECK(ms_program_feed(c->prog, md->pos, st->scratch, err));
    }
    if (md->targets >= 0) {
        for (int i = 0; i < n; i++) st->scratch[i] = (float)st->tgt_mb[i];
        MS_CHECK(ms_program_feed(c->prog, md->targets, st->scratch, err));
    }
    return MS_OK;
}

/* What a micro-batch's slot waits for before it is free: training, its backward (B) and,
 * split, its weight gradient (W); forward only, its forward. What leaves the chunk afterwards
 * leaves from a staging buffer. */
static int holds_of(const ms_stages *st, bool train) {
    return train ? 1 + s_zb(st) : 1;
}

/* Binds chunk c's program to micro-batch j's arena, taking a free one from the pool (or a
 * new one) at the micro-batch's first use on the chunk. */
static ms_status take_slot(ms_stages *st, chunk *c, int j, bool train, ms_error *err) {
    if (!st->micro) return MS_OK; /* one micro-batch: the program's own arena */
    if (c->slot_of[j] < 0) {
        if (!st->nfree) {
            if (st->npool == st->pool_cap) {
                st->pool_cap = st->pool_cap ? 2 * st->pool_cap : 8;
                st->pool = xrealloc(st->pool, sizeof *st->pool * (size_t)st->pool_cap);
                st->pool_free =
                    xrealloc(st->pool_free, sizeof *st->pool_free * (size_t)st->pool_cap);
            }
            MS_CHECK(ms_device_alloc(st->ctx->device, st->pool_bytes, (void **)&st->pool[st->npool],
                                     err));
            st->pool_free[st->nfree++] = st->npool++;
        }
        c->slot_of[j] = st->pool_free[--st->nfree];
        c->holds[j] = holds_of(st, train);
    }
    ms_program_bind_arena(c->prog, st->pool[c->slot_of[j]]);
    return MS_OK;
}

/* One of the things micro-batch j's arena waits for is done; the last frees it. */
static void release_slot(ms_stages *st, chunk *c, int j) {
    if (!st->micro || c->slot_of[j] < 0 || --c->holds[j] > 0) return;
    st->pool_free[st->nfree++] = c->slot_of[j];
    c->slot_of[j] = -1;
}

/* Where transfer a reads or writes on chunk c: the micro-batch's slot, or a staging buffer
 * for what leaves after the slot is free (*buf and *count in floats). */
static ms_status transfer_buffer(ms_stages *st, chunk *c, const ms_pp_action *a, bool train,
                                 float **buf, size_t *count, ms_error *err) {
    const ms_model *md = &c->model;
    if (a->op == MS_PP_SEND_GRAD || (a->op == MS_PP_SEND_ACT && !train)) {
        bool grad = a->op == MS_PP_SEND_GRAD;
        *buf = grad ? c->out_grad_stage : c->out_act_stage;
        *count = ((grad ? c->grad_bytes : c->act_bytes) - 4) / sizeof(float);
        return *buf ? MS_OK
                    : ms_fail(err, MS_ERR_INTERNAL, "pipeline: chunk %d has nothing to send for %s",
                              c->k, ms_pp_op_name((ms_pp_op)a->op));
    }
    if (a->op == MS_PP_RECV_ACT) {
        if (!c->in_act_stage || c->in_mb >= 0)
            return ms_fail(err, MS_ERR_INTERNAL,
                           "pipeline: chunk %d receives micro-batch %d's input while %d's waits",
                           c->k, a->mb, c->in_mb);
        c->in_mb = a->mb;
        *buf = c->in_act_stage;
        *count = (c->in_bytes - 4) / sizeof(float);
        return MS_OK;
    }
    MS_CHECK(take_slot(st, c, a->mb, train, err));
    ms_tensor *t = a->op == MS_PP_SEND_ACT ? ms_program_local(c->prog, md->hidden_out)
                                           : ms_program_output_grad(c->prog);
    if (!t)
        return ms_fail(err, MS_ERR_INTERNAL, "pipeline: chunk %d has no buffer for %s", c->k,
                       ms_pp_op_name((ms_pp_op)a->op));
    *buf = ms_tensor_f32(t);
    *count = (size_t)ms_tensor_numel(t);
    return MS_OK;
}

/* Copies what leaves chunk c after its slot is freed into the staging buffer. */
static void stage_out(chunk *c, bool grad) {
    const ms_model *md = &c->model;
    ms_tensor *t = grad ? ms_program_input_grad(c->prog, md->hidden_in)
                        : ms_program_local(c->prog, md->hidden_out);
    if (t)
        memcpy(grad ? c->out_grad_stage : c->out_act_stage, ms_tensor_f32(t),
               sizeof(float) * (size_t)ms_tensor_numel(t));
}

/* A batch of consecutive transfers as one ms_p2p call. */
static ms_status transfer(ms_stages *st, const ms_pp_action *a, int n, bool train, ms_error *err) {
    for (int i = 0; i < n; i++) {
        chunk *c = &st->ch[a[i].chunk];
        float *buf = NULL;
        size_t count = 0;
        MS_CHECK(transfer_buffer(st, c, &a[i], train, &buf, &count, err));
        bool send = a[i].op == MS_PP_SEND_ACT || a[i].op == MS_PP_SEND_GRAD;
        /* Each boundary (model chunks lo -> lo + 1), direction and micro-batch has its own tag,
         * so transfers of different chunks between the same two ranks never match. */
        int grad = a[i].op == MS_PP_SEND_GRAD || a[i].op == MS_PP_RECV_GRAD;
        int lo = a[i].op == MS_PP_SEND_ACT || a[i].op == MS_PP_RECV_GRAD ? c->k : c->k - 1;
        int tag = 100 + (int)(((int64_t)a[i].mb * st->p * st->v + lo) * 2 + grad) % 30000;
        st->ops[i] = (ms_p2p_op){.kind = send ? MS_P2P_SEND : MS_P2P_RECV,
                                 .buf = buf,
                                 .count = count,
                                 .peer = a[i].peer * st->R + st->index,
                                 .tag = tag};
    }
    return ms_p2p(st->ctx->world, st->ops, n, err);
}

/* One trace event per compute action of the training schedule, when the run is traced.
 * Forward-only runs (evaluation, sampling) are not the schedule: recording them would put
 * extra F's into the step that happens to be current, and into its measured bubble. */
static void record_action(const ms_stages *st, const ms_pp_action *a, const chunk *c, int64_t t0) {
    if (!st->ctx->trace.recorder) return;
    ms_ev_pipe e = {.action = a->op == MS_PP_FORWARD    ? MS_PIPE_F
                              : a->op == MS_PP_BACKWARD ? MS_PIPE_B
                                                        : MS_PIPE_W,
                    .chunk = a->chunk,
                    .stage = (int16_t)st->stage,
                    .mb = a->mb,
                    .model_chunk = c->k,
                    .stages = (int16_t)st->p,
                    .virtual_stages = (int16_t)st->v,
                    .micro_batches = st->m};
    ms_ev_strcpy(e.schedule, sizeof e.schedule, NULL,
                 ms_schedule_name((ms_schedule)st->strat.schedule));
    ms_record_pipe(&st->ctx->trace, &e, t0);
}

static ms_status run(ms_stages *st, const ms_pp_action *acts, int nacts, bool train,
                     const int32_t *ids, const int32_t *tgt, float *loss, ms_error *err) {
    double sum = 0;
    int last = st->p * st->v - 1;
    for (int c = 0; c < st->nch; c++) {
        for (int j = 0; j < st->m; j++) st->ch[c].slot_of[j] = -1;
        if (train) ms_program_zero_grads(st->ch[c].prog);
        st->ch[c].in_mb = -1;
        memset(st->ch[c].holds, 0, sizeof(int) * (size_t)st->m);
    }
    for (int i = 0; i < nacts;) {
        const ms_pp_action *a = &acts[i];
        if (ms_pp_is_comm(a->op)) {
            int n = 1;
            while (i + n < nacts && ms_pp_is_comm(acts[i + n].op)) n++;
            MS_CHECK(transfer(st, a, n, train, err));
            i += n;
            continue;
        }
        chunk *c = &st->ch[a->chunk];
        int64_t t0 = ms_now_ns();
        MS_CHECK(take_slot(st, c, a->mb, train, err));
        ms_program_set_batch_window(c->prog, st->rows_dp, st->o.batch / st->strat.dp,
                                    (int64_t)a->mb * st->rows_dp);
        if (a->op == MS_PP_FORWARD) {
            if (c->in_act_stage) {
                ms_tensor *in = ms_program_local(c->prog, c->model.hidden_in);
                if (c->in_mb != a->mb)
                    return ms_fail(err, MS_ERR_INTERNAL,
                                   "pipeline: chunk %d runs micro-batch %d but received %d", c->k,
                                   a->mb, c->in_mb);
                memcpy(ms_tensor_f32(in), c->in_act_stage, c->in_bytes - 4);
                c->in_mb = -1;
            }
            MS_CHECK(feed(st, c, a->mb, ids, tgt, err));
            float l = 0;
            MS_CHECK(ms_program_forward(c->prog, &l, err));
            if (c->k == last) sum += l;
            if (!train) {
                if (c->k != last) stage_out(c, false);
                release_slot(st, c, a->mb);
            }
        } else {
            /* B: the input gradients (all of the backward unless split); W: the rest. */
            MS_CHECK(a->op == MS_PP_BACKWARD ? ms_program_backward_input(c->prog, err)
                                             : ms_program_backward_weight(c->prog, err));
            if (a->op == MS_PP_BACKWARD && c->k > 0) stage_out(c, true);
            release_slot(st, c, a->mb);
        }
        if (train) record_action(st, a, c, t0);
        i++;
    }
    /* The loss lives on the last stage; every rank reports it. */
    float l = (float)(sum / st->m);
    MS_CHECK(ms_stages_from_head(st, &l, 1, err));
    *loss = l;
    return MS_OK;
}

int ms_stages_head_chunk(const ms_stages *st) {
    return st->stage == st->p - 1 ? st->nch - 1 : -1;
}

ms_status ms_stages_from_head(ms_stages *st, float *x, size_t n, ms_error *err) {
    if (st->p == 1) return MS_OK;
    return ms_broadcast(st->ctx->world, x, n, (st->p - 1) * st->R, err);
}

/* The tied embedding's two gradients summed between the first and the last stage. */
static ms_status sync_tied(ms_stages *st, ms_error *err) {
    int h = st->tie_param[0] >= 0 ? st->tie_param[0] : st->tie_param[1];
    if (!st->tie || h < 0) return MS_OK;
    ms_param_view pv;
    ms_stages_param(st, h, &pv, NULL);
    size_t n = (size_t)ms_tensor_numel(&pv.grad);
    if (pv.grad.dtype != MS_BF16) {
        float *g = ms_tensor_f32(&pv.grad);
        return ms_all_reduce(st->tie, g, g, n, MS_REDUCE_SUM, err);
    }
    void *g16 = ms_tensor_data(&pv.grad);
    return ms_all_reduce_dt(st->tie, MS_COMM_BF16, g16, g16, n, MS_REDUCE_SUM, err);
}

ms_status ms_stages_train(ms_stages *st, int64_t step, const int32_t *ids, const int32_t *targets,
                          float *loss, ms_error *err) {
    for (int c = 0; c < st->nch; c++) ms_program_set_dropout(st->ch[c].prog, true, (uint64_t)step);
    MS_CHECK(run(st, st->acts, st->nacts, true, ids, targets, loss, err));
    for (int c = 0; c < st->nch; c++) MS_CHECK(ms_program_grad_sync(st->ch[c].prog, err));
    return sync_tied(st, err);
}

void ms_stages_params_written(ms_stages *st) {
    for (int c = 0; c < st->nch; c++) ms_program_params_written(st->ch[c].prog);
}

ms_status ms_stages_param_sync(ms_stages *st, ms_error *err) {
    for (int c = 0; c < st->nch; c++) MS_CHECK(ms_program_param_sync(st->ch[c].prog, err));
    return MS_OK;
}

ms_status ms_stages_forward(ms_stages *st, const int32_t *ids, const int32_t *targets, float *loss,
                            ms_error *err) {
    for (int c = 0; c < st->nch; c++) ms_program_set_dropout(st->ch[c].prog, false, 0);
    return run(st, st->fwd_acts, st->nfwd, false, ids, targets, loss, err);
}

/* --- the catalog ----------------------------------------------------------------------------- */

static void add_entry(ms_stages *st, const ms_param_view *pv, int k, int local) {
    ms_stages_entry *e = &st->cat[st->ncat++];
    memset(e, 0, sizeof *e);
    e->param = pv->name;
    e->gshape = pv->gshape;
    e->pl = pv->pl;
    e->opt_pl = pv->opt_pl;
    e->mesh = st->dm[k % st->p];
    e->model_chunk = k;
    e->local_index = local;
}

/* Every model chunk's parameters in model order: ours from our programs, the others' from
 * their graphs compiled from shapes (placements depend on the graph and the mesh only). */
static ms_status make_catalog(ms_stages *st, ms_error *err) {
    int chunks = st->p * st->v, cap = 0, local_base[MAX_CHUNKS] = {0}, at = 0;
    for (int c = 0; c < st->nch; c++) {
        local_base[c] = at;
        at += ms_program_num_params(st->ch[c].prog);
    }
    st->foreign_models = xcalloc((size_t)chunks, sizeof *st->foreign_models);
    st->foreign_progs = xcalloc((size_t)chunks, sizeof *st->foreign_progs);
    ms_program **prog_of = xcalloc((size_t)chunks, sizeof *prog_of);
    ms_status rc = MS_OK;
    for (int k = 0; k < chunks && rc == MS_OK; k++) {
        if (k % st->p == st->stage) {
            prog_of[k] = st->ch[k / st->p].prog;
        } else {
            int f = st->nforeign;
            rc = build_chunk(st, k, &st->foreign_models[f], err);
            if (rc != MS_OK) break;
            st->nforeign++;
            ms_sharding sh;
            ms_compile_opts co = compile_opts(st, &sh);
            rc = ms_program_compile_shapes(st->foreign_models[f].g, &st->dm[k % st->p]->mesh, NULL,
                                           &co, &st->foreign_progs[f], err);
            prog_of[k] = st->foreign_progs[f];
        }
        if (rc == MS_OK) cap += ms_program_num_params(prog_of[k]);
    }
    if (rc == MS_OK) {
        st->cat = xcalloc((size_t)cap + 1, sizeof *st->cat);
        for (int k = 0; k < chunks; k++) {
            bool ours = k % st->p == st->stage;
            for (int i = 0; i < ms_program_num_params(prog_of[k]); i++) {
                ms_param_view pv;
                ms_program_param(prog_of[k], i, &pv);
                add_entry(st, &pv, k, ours ? local_base[k / st->p] + i : -1);
            }
        }
    }
    free(prog_of);
    return rc;
}

int ms_stages_catalog(const ms_stages *st, const ms_stages_entry **out) {
    *out = st->cat;
    return st->ncat;
}

/* --- reading --------------------------------------------------------------------------------- */

int ms_stages_num_params(const ms_stages *st) {
    int n = 0;
    for (int c = 0; c < st->nch; c++) n += ms_program_num_params(st->ch[c].prog);
    return n;
}

ms_status ms_stages_param(ms_stages *st, int i, ms_param_view *out, bool *in_norm) {
    int at = 0;
    ms_program *p = local_param(st, i, &at);
    if (!p) return MS_ERR_INVALID;
    if (in_norm) *in_norm = st->tie_param[1] != i;
    return ms_program_param(p, at, out);
}

ms_status ms_stages_load_param(ms_stages *st, int i, const float *full, ms_error *err) {
    int at = 0;
    ms_program *p = local_param(st, i, &at);
    if (!p) return ms_fail(err, MS_ERR_INVALID, "stages: no local parameter %d", i);
    return ms_program_load_param(p, at, full, err);
}

void ms_stages_memory_get(const ms_stages *st, ms_stages_memory *out) {
    memset(out, 0, sizeof *out);
    out->stage = st->stage;
    out->bound = st->p > 1 ? ms_pp_inflight_bound((ms_schedule)st->strat.schedule, st->p, st->m,
                                                  st->v, st->stage)
                           : 1;
    out->held = st->micro ? st->npool : 1;
    out->slot_bytes =
        st->micro ? (double)st->pool_bytes : (double)ms_program_arena_bytes(st->ch[0].prog);
    out->activation_bytes = out->held * out->slot_bytes;
    out->own_arena_bytes = st->micro ? 0 : out->slot_bytes;
}

int ms_stages_pp(const ms_stages *st) {
    return st->p;
}
int ms_stages_micro_batches(const ms_stages *st) {
    return st->m;
}
const ms_mesh *ms_stages_mesh(const ms_stages *st) {
    return &st->mesh;
}
ms_dmesh *ms_stages_dmesh(ms_stages *st) {
    return st->dm[st->stage];
}
int ms_stages_num_chunks(const ms_stages *st) {
    return st->nch;
}
const ms_model *ms_stages_model(const ms_stages *st, int c) {
    return &st->ch[c].model;
}
ms_program *ms_stages_program(ms_stages *st, int c) {
    return st->ch[c].prog;
}

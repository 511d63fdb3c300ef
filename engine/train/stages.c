/* stages.c - pipeline chunks, their schedule and the transfers between stages (see stages.h). */
#include "engine/train/stages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/dmesh.h"
#include "engine/graph/program.h"
#include "engine/pipeline/schedule.h"
#include "profiler/record/hooks.h"

#define MAX_CHUNKS 64

typedef struct chunk {
    int k; /* model chunk 0 .. p*v-1 */
    ms_model model;
    ms_program *prog;
    int *slot_of;     /* [m]: the slot holding micro-batch j from its F to its B, or -1 */
    int *holds;       /* [m]: what micro-batch j's slot still waits for before it is free */
    int *free_slots;  /* stack of released slots */
    int n_free, used; /* slots ever taken */
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
    ms_comm_probe *tie_probe; /* its trace probe, when the run is traced */
    int tie_param[2];         /* chunk index * 65536 + param index of each tied copy, or -1 */
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

/* Layers of model chunk k: pp_layers by hand, else an even split. */
static void chunk_layers(const ms_stages *st, int k, int *lo, int *hi) {
    int n = st->cfg.n_layer, chunks = st->p * st->v;
    if (st->strat.pp_layers[0] && st->v == 1) {
        int at = 0;
        for (int i = 0; i < k; i++) at += st->strat.pp_layers[i];
        *lo = at;
        *hi = at + st->strat.pp_layers[k];
        return;
    }
    *lo = n * k / chunks;
    *hi = n * (k + 1) / chunks;
}

/* The residual stream's placements on a stage mesh: what crosses every chunk boundary. */
static ms_placements stream_placements(const ms_stages *st, const ms_shape *shape) {
    ms_sharding sh = {.s = &st->strat, .rules = NULL};
    ms_placements pl = ms_placements_replicated(st->mesh.ndim);
    if (!ms_strategy_shard(&sh, "embed", shape, st->mesh.ndim, &pl))
        pl = ms_placements_replicated(st->mesh.ndim);
    return pl;
}

/* zb-h1 runs each backward in two passes (B: input gradients, W: the parameters'). */
static bool s_zb(const ms_stages *st) {
    return st->p > 1 && st->strat.schedule == MS_SCHEDULE_ZB_H1;
}

/* Model chunk k's graph, its boundary values annotated with the stream placements. */
static ms_status build_chunk(const ms_stages *st, int k, ms_model *md, ms_error *err) {
    ms_model_chunk mc = {.first = k == 0, .last = k == st->p * st->v - 1};
    chunk_layers(st, k, &mc.layer_lo, &mc.layer_hi);
    MS_CHECK(ms_model_build_chunk(&st->cfg, st->rows_mb, st->o.seq, &mc, md, err));
    if (st->o.keep_logits && md->logits >= 0) ms_graph_keep(md->g, md->logits);
    int b = md->hidden_in >= 0 ? md->hidden_in : md->hidden_out;
    if (b >= 0) {
        ms_placements pl = stream_placements(st, ms_graph_value_shape(md->g, b));
        if (md->hidden_in >= 0) ms_graph_annotate(md->g, md->hidden_in, &pl);
        if (md->hidden_out >= 0) ms_graph_annotate(md->g, md->hidden_out, &pl);
    }
    return MS_OK;
}

static ms_compile_opts compile_opts(const ms_stages *st, ms_sharding *sh) {
    *sh = (ms_sharding){.s = &st->strat, .rules = &st->rules};
    return (ms_compile_opts){.shard = ms_strategy_shard,
                             .shard_user = sh,
                             .seed = st->o.seed,
                             .micro_batched = st->m > 1 || st->p > 1,
                             .split_weight_grads = s_zb(st),
                             .loss_scale = 1.0f / (float)st->m};
}

static ms_status compile_chunk(ms_stages *st, chunk *c, ms_error *err) {
    MS_CHECK(build_chunk(st, c->k, &c->model, err));
    ms_sharding sh;
    ms_compile_opts co = compile_opts(st, &sh);
    MS_CHECK(ms_program_compile(c->model.g, st->dm[st->stage], &co, &c->prog, err));
    c->slot_of = xmalloc(sizeof(int) * (size_t)st->m);
    c->holds = xcalloc((size_t)st->m, sizeof(int));
    c->free_slots = xmalloc(sizeof(int) * (size_t)st->m);
    for (int j = 0; j < st->m; j++) c->slot_of[j] = -1;
    return MS_OK;
}

/* The tied word embedding's two copies, found by name in the first and last chunk. */
static void find_tied(ms_stages *st) {
    st->tie_param[0] = st->tie_param[1] = -1;
    if (st->p == 1) return;
    for (int c = 0; c < st->nch; c++) {
        chunk *ch = &st->ch[c];
        bool first = ch->k == 0, last = ch->k == st->p * st->v - 1;
        if (!first && !last) continue;
        for (int i = 0; i < ms_program_num_params(ch->prog); i++) {
            ms_param_view pv;
            ms_program_param(ch->prog, i, &pv);
            if (!strcmp(pv.name, "wte.weight") ||
                !strcmp(pv.name, "embeddings.word_embeddings.weight"))
                st->tie_param[last ? 1 : 0] = c * 65536 + i;
        }
    }
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
    for (int c = 0; c < st->v && rc == MS_OK; c++) {
        st->ch[c].k = c * st->p + st->stage;
        st->nch = c + 1;
        rc = compile_chunk(st, &st->ch[c], err);
    }
    if (rc == MS_OK && st->p > 1) {
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
        free(st->ch[c].free_slots);
    }
    ms_comm_destroy(st->tie);
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
        MS_CHECK(ms_program_feed(c->prog, md->pos, st->scratch, err));
    }
    if (md->targets >= 0) {
        for (int i = 0; i < n; i++) st->scratch[i] = (float)st->tgt_mb[i];
        MS_CHECK(ms_program_feed(c->prog, md->targets, st->scratch, err));
    }
    return MS_OK;
}

/* What a micro-batch's slot on chunk c waits for before it is free. Training: its backward
 * (B), the input gradient's send (chunks after the first) and, split, the weight gradient (W).
 * Forward only: the activation's send, or the forward itself on the last chunk. */
static int holds_of(const ms_stages *st, const chunk *c, bool train) {
    if (!train) return 1;
    return 1 + (c->k > 0) + s_zb(st);
}

/* The slot of chunk c's micro-batch j, taking a free one (or a new one) at its first use. */
static ms_status take_slot(const ms_stages *st, chunk *c, int j, bool train, ms_error *err) {
    if (c->slot_of[j] < 0) {
        c->slot_of[j] = c->n_free ? c->free_slots[--c->n_free] : c->used++;
        c->holds[j] = holds_of(st, c, train);
    }
    return ms_program_use_slot(c->prog, c->slot_of[j], err);
}

/* One of the things micro-batch j's slot waits for is done; the last frees it. */
static void release_slot(chunk *c, int j) {
    if (c->slot_of[j] < 0 || --c->holds[j] > 0) return;
    c->free_slots[c->n_free++] = c->slot_of[j];
    c->slot_of[j] = -1;
}

/* A batch of consecutive transfers as one ms_p2p call. A micro-batch's stay on a chunk ends
 * when its input gradient has left (training) or its activation has (forward only). */
static ms_status transfer(ms_stages *st, const ms_pp_action *a, int n, bool train, ms_error *err) {
    for (int i = 0; i < n; i++) {
        chunk *c = &st->ch[a[i].chunk];
        MS_CHECK(take_slot(st, c, a[i].mb, train, err));
        const ms_model *md = &c->model;
        ms_tensor *t = NULL;
        bool send = a[i].op == MS_PP_SEND_ACT || a[i].op == MS_PP_SEND_GRAD;
        switch (a[i].op) {
            case MS_PP_SEND_ACT:
                t = ms_program_local(c->prog, md->hidden_out);
                break;
            case MS_PP_RECV_ACT:
                t = ms_program_local(c->prog, md->hidden_in);
                break;
            case MS_PP_SEND_GRAD:
                t = ms_program_input_grad(c->prog, md->hidden_in);
                break;
            default:
                t = ms_program_output_grad(c->prog);
                break;
        }
        if (!t)
            return ms_fail(err, MS_ERR_INTERNAL, "pipeline: chunk %d has no buffer for %s", c->k,
                           ms_pp_op_name((ms_pp_op)a[i].op));
        /* Each boundary (model chunks lo -> lo + 1), direction and micro-batch has its own tag,
         * so transfers of different chunks between the same two ranks never match. */
        int grad = a[i].op == MS_PP_SEND_GRAD || a[i].op == MS_PP_RECV_GRAD;
        int lo = a[i].op == MS_PP_SEND_ACT || a[i].op == MS_PP_RECV_GRAD ? c->k : c->k - 1;
        int tag = 100 + (int)(((int64_t)a[i].mb * st->p * st->v + lo) * 2 + grad) % 30000;
        st->ops[i] = (ms_p2p_op){.kind = send ? MS_P2P_SEND : MS_P2P_RECV,
                                 .buf = ms_tensor_f32(t),
                                 .count = (size_t)ms_tensor_numel(t),
                                 .peer = a[i].peer * st->R + st->index,
                                 .tag = tag};
    }
    MS_CHECK(ms_p2p(st->ctx->world, st->ops, n, err));
    for (int i = 0; i < n; i++)
        if (a[i].op == (train ? MS_PP_SEND_GRAD : MS_PP_SEND_ACT))
            release_slot(&st->ch[a[i].chunk], a[i].mb);
    return MS_OK;
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
        st->ch[c].n_free = 0;
        st->ch[c].used = 0;
        if (train) ms_program_zero_grads(st->ch[c].prog);
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
        if (a->op == MS_PP_FORWARD) {
            MS_CHECK(feed(st, c, a->mb, ids, tgt, err));
            float l = 0;
            MS_CHECK(ms_program_forward(c->prog, &l, err));
            if (c->k == last) sum += l;
            if (!train && c->k == last) release_slot(c, a->mb);
        } else {
            /* B: the input gradients (all of the backward unless split); W: the rest. */
            MS_CHECK(a->op == MS_PP_BACKWARD ? ms_program_backward_input(c->prog, err)
                                             : ms_program_backward_weight(c->prog, err));
            release_slot(c, a->mb);
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
    ms_program_param(st->ch[h / 65536].prog, h % 65536, &pv);
    float *g = ms_tensor_f32(&pv.grad);
    return ms_all_reduce(st->tie, g, g, (size_t)ms_tensor_numel(&pv.grad), MS_REDUCE_SUM, err);
}

ms_status ms_stages_train(ms_stages *st, const int32_t *ids, const int32_t *targets, float *loss,
                          ms_error *err) {
    MS_CHECK(run(st, st->acts, st->nacts, true, ids, targets, loss, err));
    for (int c = 0; c < st->nch; c++) MS_CHECK(ms_program_grad_sync(st->ch[c].prog, err));
    return sync_tied(st, err);
}

ms_status ms_stages_forward(ms_stages *st, const int32_t *ids, const int32_t *targets, float *loss,
                            ms_error *err) {
    return run(st, st->fwd_acts, st->nfwd, false, ids, targets, loss, err);
}

/* --- the catalog ----------------------------------------------------------------------------- */

static void add_entry(ms_stages *st, const ms_param_view *pv, int k, int local) {
    ms_stages_entry *e = &st->cat[st->ncat++];
    memset(e, 0, sizeof *e);
    e->param = pv->name;
    e->gshape = pv->gshape;
    e->pl = pv->pl;
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
    for (int c = 0; c < st->nch; c++) {
        int n = ms_program_num_params(st->ch[c].prog);
        if (i < n) {
            if (in_norm) *in_norm = st->tie_param[1] != c * 65536 + i;
            return ms_program_param(st->ch[c].prog, i, out);
        }
        i -= n;
    }
    return MS_ERR_INVALID;
}

ms_status ms_stages_load_param(ms_stages *st, int i, const float *full, ms_error *err) {
    for (int c = 0; c < st->nch; c++) {
        int n = ms_program_num_params(st->ch[c].prog);
        if (i < n) return ms_program_load_param(st->ch[c].prog, i, full, err);
        i -= n;
    }
    return ms_fail(err, MS_ERR_INVALID, "stages: no local parameter %d", i);
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

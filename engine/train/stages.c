/* stages.c - pipeline chunks, their schedule and the transfers between stages (see stages.h). */
#include "engine/train/stages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/xalloc.h"
#include "engine/dist/dmesh.h"
#include "engine/graph/program.h"
#include "engine/pipeline/chunks.h"
#include "engine/pipeline/schedule.h"
#include "engine/core/trace_sink.h"

#define MAX_CHUNKS 64

typedef struct chunk {
    int k; /* model chunk 0 .. p*v-1 */
    ms_model model;
    ms_program *prog;
    int *slot_of; /* [m]: the pool arena holding micro-batch j from its F to its B, or -1 */
    int *holds;   /* [m]: what micro-batch j's arena still waits for before it is free */
    /* [m]: transfers in flight (NULL: none): micro-batch j's output, sent from its slot
     * (training), and its output gradient, received into its slot. */
    ms_comm_request **act_out, **grad_in;
} chunk;

struct ms_stages {
    ms_ctx *ctx;
    ms_model_def def;
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
    /* ... and one scratch for what lives within a pass (ms_program_bind_scratch), as large as
     * the largest chunk's, allocated at the first micro-batch; NULL while none needs one. */
    float *pass_scratch;
    size_t pass_scratch_bytes;
    ms_comm_probe *tie_probe; /* its trace probe, when the run is traced */
    int tie_param[2];         /* local parameter index (ms_stages_param) of each tied copy, or -1 */
    /* ms_stages_on_param_use: the caller's hook, and each chunk's adapter to it */
    ms_param_use_fn use_fn;
    void *use_arg;
    struct use_adapter {
        struct ms_stages *st;
        int base; /* the chunk's first local parameter index */
    } use_at[MAX_CHUNKS];
    /* ms_stages_on_grad_final: the caller's hook (chunks call it through use_at) */
    ms_param_use_fn final_fn;
    void *final_arg;
    float *scratch; /* one micro-batch of the largest input */
    /* The outbox: what leaves a chunk after its micro-batch's slot is free (the input
     * gradient after B, the output after a forward-only F) is copied into one of these and
     * sent from there, so that the slot is free at once. A buffer is reused once its send
     * completed: there are as many as sends were in flight at once. */
    float **outbox;
    ms_comm_request **outbox_q; /* each buffer's send, NULL when free */
    int noutbox;
    size_t outbox_count; /* floats per buffer: the largest boundary of this rank's chunks */
    /* The catalog (ms_stages_entry), made on first use: every chunk's parameters, the other
     * stages' chunks compiled from shapes for their placements. */
    ms_stages_entry *cat;
    int ncat;
    ms_stages_entry *bcat; /* the buffers' catalog, alike (ms_stages_buffer_catalog) */
    int nbcat;
    ms_model *foreign_models;
    ms_program **foreign_progs;
    int nforeign;
};

/* --- building -------------------------------------------------------------------------------- */

static ms_status make_catalog(ms_stages *st, ms_error *err);

/* zb-h1 runs each backward in two passes (B: input gradients, W: the parameters'). */
static bool s_zb(const ms_stages *st) {
    return st->p > 1 && st->strat.schedule == MS_SCHEDULE_ZB_H1;
}

/* Model chunk k's graph for this run. */
static ms_status build_chunk(const ms_stages *st, int k, ms_model *md, ms_error *err) {
    MS_CHECK(ms_pp_chunk_model_def(&st->def, &st->strat, st->rows_mb, k, md, err));
    if (st->o.keep_logits && md->logits >= 0) ms_graph_keep(md->g, md->logits);
    return MS_OK;
}

/* The most micro-batch units this stage holds at once (1 without a pipeline). */
static int inflight_bound(const ms_stages *st) {
    return st->p > 1 ? ms_pp_inflight_bound((ms_schedule)st->strat.schedule, st->p, st->m, st->v,
                                            st->stage)
                     : 1;
}

static ms_compile_opts compile_opts(const ms_stages *st, ms_sharding *sh) {
    *sh = (ms_sharding){.s = &st->strat, .rules = &st->rules, .def = &st->def};
    ms_compile_opts co = ms_strategy_compile_opts(&st->strat, sh);
    co.seed = st->o.seed;
    co.micro_batched = st->micro;
    co.loss_scale = 1.0f / (float)st->m;
    co.micro_batches = st->m;
    co.master_host = st->o.master_host;
    co.inflight = inflight_bound(st);
    return co;
}

static ms_status compile_chunk(ms_stages *st, chunk *c, ms_error *err) {
    MS_CHECK(build_chunk(st, c->k, &c->model, err));
    ms_sharding sh;
    ms_compile_opts co = compile_opts(st, &sh);
    MS_CHECK(ms_program_compile(c->model.g, st->dm[st->stage], &co, &c->prog, err));
    c->slot_of = xmalloc(sizeof(int) * (size_t)st->m);
    c->holds = xcalloc((size_t)st->m, sizeof(int));
    c->act_out = xcalloc((size_t)st->m, sizeof *c->act_out);
    c->grad_in = xcalloc((size_t)st->m, sizeof *c->grad_in);
    const ms_model *md = &c->model;
    ms_tensor *gin = ms_program_input_grad(c->prog, md->hidden_in);
    ms_tensor *out = ms_program_local(c->prog, md->hidden_out);
    size_t ng = gin ? (size_t)ms_tensor_numel(gin) : 0, na = out ? (size_t)ms_tensor_numel(out) : 0;
    if (ng > st->outbox_count) st->outbox_count = ng;
    if (na > st->outbox_count) st->outbox_count = na;
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
            if (!strcmp(pv.name, st->def.tied)) st->tie_param[last ? 1 : 0] = base + i;
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

ms_status ms_stages_create(ms_ctx *ctx, const ms_model_def *def, const ms_strategy *s,
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
    st->def = *def;
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
        if (rc == MS_OK && ms_program_scratch_bytes(st->ch[c].prog) > st->pass_scratch_bytes)
            st->pass_scratch_bytes = ms_program_scratch_bytes(st->ch[c].prog);
    }
    if (rc == MS_OK && st->p > 1 && st->def.tied[0]) {
        bool ends = st->stage == 0 || st->stage == st->p - 1;
        rc =
            ms_comm_split(ctx->world, ends ? st->index : -1, st->stage, "embedding", &st->tie, err);
        /* Probed like every mesh dim, so the embedding's all-reduce between the first and the
         * last stage is in the trace and the heatmap. */
        if (rc == MS_OK && st->tie) st->tie_probe = ms_trace_probe(&ctx->trace, st->tie, -1);
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
    size_t most = 1;
    for (int i = 0; i < def->ninputs; i++)
        if ((size_t)ms_model_input_numel(def, i) > most)
            most = (size_t)ms_model_input_numel(def, i);
    st->scratch = xmalloc(sizeof *st->scratch * (size_t)st->rows_mb * most);
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
        free(st->ch[c].act_out), free(st->ch[c].grad_in);
    }
    for (int b = 0; b < st->noutbox; b++)
        ms_device_free(st->ctx->device, st->outbox[b], sizeof(float) * st->outbox_count);
    free(st->outbox), free(st->outbox_q);
    ms_comm_destroy(st->tie);
    for (int i = 0; i < st->npool; i++)
        ms_device_free(st->ctx->device, st->pool[i], st->pool_bytes);
    if (st->pass_scratch) ms_device_free(st->ctx->device, st->pass_scratch, st->pass_scratch_bytes);
    free(st->pool), free(st->pool_free);
    ms_trace_probe_free(&st->ctx->trace, st->tie_probe);
    for (int q = 0; st->dm && q < st->p; q++) ms_dmesh_destroy(st->dm[q]);
    free(st->dm);
    ms_mesh_free(&st->mesh);
    free(st->acts);
    free(st->fwd_acts);
    free(st->scratch);
    for (int i = 0; i < st->nforeign; i++) {
        ms_program_destroy(st->foreign_progs[i]);
        ms_model_free(&st->foreign_models[i]);
    }
    free(st->foreign_progs), free(st->foreign_models);
    free(st->cat);
    free(st->bcat);
    free(st);
}

/* --- micro-batches: their data, their slots, their trace events ------------------------------ */

/* Micro-batch j's rows of the global batch: on each replica r, rows j*b .. j*b + b-1 of its
 * share, of every model input this chunk takes. */
static ms_status feed(ms_stages *st, chunk *c, int j, float *const *inputs, ms_error *err) {
    const ms_model *md = &c->model;
    int dp = st->strat.dp, per = st->o.batch / dp, b = st->rows_dp;
    for (int k = 0; k < st->def.ninputs; k++) {
        if (md->input[k] < 0) continue;
        size_t row = (size_t)ms_model_input_numel(&st->def, k);
        for (int r = 0; r < dp; r++)
            memcpy(st->scratch + (size_t)r * b * row,
                   inputs[k] + ((size_t)r * per + (size_t)j * b) * row,
                   sizeof(float) * row * (size_t)b);
        MS_CHECK(ms_program_feed(c->prog, md->input[k], st->scratch, err));
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
    if (st->pass_scratch_bytes && !st->pass_scratch) {
        MS_CHECK(ms_device_alloc(st->ctx->device, st->pass_scratch_bytes,
                                 (void **)&st->pass_scratch, err));
        for (int k = 0; k < st->nch; k++) ms_program_bind_scratch(st->ch[k].prog, st->pass_scratch);
    }
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

/* The calling thread's CPU time, read when the run is traced (0 otherwise): beside an
 * action's wall span it tells the time the rank computed from the time it waited for a
 * core. */
static int64_t traced_cpu_ns(const ms_stages *st) {
    struct timespec ts;
    if (!st->ctx->trace.recorder || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One trace event per compute action of the training schedule, when the run is traced, from
 * wall time t0 and thread CPU time cpu0. Forward-only runs (evaluation, sampling) are not the
 * schedule: recording them would put extra F's into the step that happens to be current, and
 * into its measured bubble. */
static void record_action(const ms_stages *st, const ms_pp_action *a, const chunk *c, int64_t t0,
                          int64_t cpu0) {
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
                    .micro_batches = st->m,
                    .cpu_ns = cpu0 > 0 ? traced_cpu_ns(st) - cpu0 : 0};
    ms_ev_strcpy(e.schedule, sizeof e.schedule, NULL,
                 ms_schedule_name((ms_schedule)st->strat.schedule));
    ms_record_pipe(&st->ctx->trace, &e, t0);
}

/* --- transfers ------------------------------------------------------------------------------
 *
 * The schedule's lists order the computes; the transfers run where the data flows rather than
 * where a list batches them. A compute posts the send of what it made right after it
 * (non-blocking: ms_ip2p), so the receiver can take it whenever it gets there and the sender
 * never waits for it; a compute receives its input right before it, straight into its slot.
 * An output gradient's receive is posted where the list receives it, into the slot that the
 * micro-batch holds since its forward, and waited for before its B. No wait is longer than
 * under the lists' rendezvous batches (a receive waits for the same send, a send for
 * nothing), so every list that runs under rendezvous runs here, with less waiting. */

/* Posts one transfer of chunk c's micro-batch mb with the neighbouring model chunk: the
 * activation (grad false: chunk k -> k + 1) or the gradient (k + 1 -> k). */
static ms_status post(ms_stages *st, const chunk *c, int mb, bool grad, bool send, float *buf,
                      size_t count, ms_comm_request **q, ms_error *err) {
    int lo = send != grad ? c->k : c->k - 1; /* the boundary: model chunks lo -> lo + 1 */
    int peer = (lo == c->k ? c->k + 1 : c->k + st->p - 1) % st->p;
    /* Each boundary, direction and micro-batch has its own tag, so transfers of different
     * chunks between the same two ranks never match. */
    int tag = 100 + (int)((((int64_t)mb * st->p * st->v + lo) * 2 + grad) % 30000);
    ms_p2p_op op = {.kind = send ? MS_P2P_SEND : MS_P2P_RECV,
                    .peer = peer * st->R + st->index,
                    .buf = buf,
                    .count = count,
                    .tag = tag};
    *q = ms_ip2p(st->ctx->world, &op, 1, err);
    return *q ? MS_OK : err ? err->code : MS_ERR_COMM;
}

/* Waits for *q (none: nothing to do) and clears it. */
static ms_status settle(ms_comm_request **q, ms_error *err) {
    ms_comm_request *r = *q;
    *q = NULL;
    return ms_comm_wait(r, err);
}

/* Sends n floats from src through a free outbox buffer: one whose send completed, else a new
 * one. */
static ms_status send_from_outbox(ms_stages *st, const chunk *c, int mb, bool grad,
                                  const float *src, size_t n, ms_error *err) {
    int b = 0;
    for (; b < st->noutbox; b++) {
        bool done = true;
        ms_status rc = ms_comm_test(st->outbox_q[b], &done, err);
        if (done) st->outbox_q[b] = NULL;
        MS_CHECK(rc);
        if (done) break;
    }
    if (b == st->noutbox) {
        st->outbox = xrealloc(st->outbox, sizeof *st->outbox * (size_t)(b + 1));
        st->outbox_q = xrealloc(st->outbox_q, sizeof *st->outbox_q * (size_t)(b + 1));
        st->outbox_q[b] = NULL;
        MS_CHECK(ms_device_alloc(st->ctx->device, sizeof(float) * st->outbox_count,
                                 (void **)&st->outbox[b], err));
        st->noutbox++;
    }
    MS_CHECK(ms_device_copy(st->ctx->device, st->outbox[b], src, sizeof(float) * n,
                            MS_COPY_DEVICE_TO_DEVICE, err));
    return post(st, c, mb, grad, true, st->outbox[b], n, &st->outbox_q[b], err);
}

/* Posts the receive of micro-batch mb's output gradient into its slot (held since its F). */
static ms_status receive_grad(ms_stages *st, chunk *c, int mb, ms_error *err) {
    if (c->grad_in[mb] || c->k == st->p * st->v - 1) return MS_OK;
    if (c->slot_of[mb] < 0)
        return ms_fail(err, MS_ERR_INTERNAL,
                       "pipeline: chunk %d receives micro-batch %d's gradient before its forward",
                       c->k, mb);
    MS_CHECK(take_slot(st, c, mb, true, err));
    ms_tensor *g = ms_program_output_grad(c->prog);
    if (!g) return ms_fail(err, MS_ERR_INTERNAL, "pipeline: chunk %d has no output gradient", c->k);
    return post(st, c, mb, true, false, ms_tensor_f32(g), (size_t)ms_tensor_numel(g),
                &c->grad_in[mb], err);
}

/* Waits for every transfer still in flight; after a failure (err NULL) quietly, so that
 * nothing stays posted. */
static ms_status settle_all(ms_stages *st, ms_error *err) {
    ms_status rc = MS_OK;
    for (int c = 0; c < st->nch; c++)
        for (int j = 0; j < st->m; j++) {
            ms_status a = settle(&st->ch[c].act_out[j], rc == MS_OK ? err : NULL);
            ms_status b = settle(&st->ch[c].grad_in[j], rc == MS_OK && a == MS_OK ? err : NULL);
            if (rc == MS_OK) rc = a != MS_OK ? a : b;
        }
    for (int b = 0; b < st->noutbox; b++) {
        ms_status a = settle(&st->outbox_q[b], rc == MS_OK ? err : NULL);
        if (rc == MS_OK) rc = a;
    }
    return rc;
}

/* --- running the schedule ------------------------------------------------------------------ */

/* F of micro-batch a->mb on chunk c: its input received into its slot, the forward, and its
 * output sent (training: from the slot, which it holds until its B; forward only: from the
 * outbox, as the slot is free at once). *sum collects the last chunk's loss. */
static ms_status run_forward(ms_stages *st, chunk *c, const ms_pp_action *a, bool train,
                             float *const *inputs, double *sum, ms_error *err) {
    const ms_model *md = &c->model;
    int last = st->p * st->v - 1;
    MS_CHECK(take_slot(st, c, a->mb, train, err));
    if (c->k > 0) {
        ms_tensor *in = ms_program_local(c->prog, md->hidden_in);
        ms_comm_request *q;
        MS_CHECK(post(st, c, a->mb, false, false, ms_tensor_f32(in), (size_t)ms_tensor_numel(in),
                      &q, err));
        MS_CHECK(ms_comm_wait(q, err));
    }
    int64_t t0 = ms_now_ns(), cpu0 = traced_cpu_ns(st);
    ms_program_set_batch_window(c->prog, st->rows_dp, st->o.batch / st->strat.dp,
                                (int64_t)a->mb * st->rows_dp);
    MS_CHECK(feed(st, c, a->mb, inputs, err));
    float l = 0;
    MS_CHECK(ms_program_forward(c->prog, &l, err));
    if (c->k == last) *sum += l;
    if (train) record_action(st, a, c, t0, cpu0); /* the compute's span, without the send */
    if (c->k < last) {
        ms_tensor *out = ms_program_local(c->prog, md->hidden_out);
        float *o = ms_tensor_f32(out);
        size_t n = (size_t)ms_tensor_numel(out);
        MS_CHECK(train ? post(st, c, a->mb, false, true, o, n, &c->act_out[a->mb], err)
                       : send_from_outbox(st, c, a->mb, false, o, n, err));
    }
    if (!train) release_slot(st, c, a->mb);
    return MS_OK;
}

/* B (the input gradients; all of the backward unless split) or W (the rest) of micro-batch
 * a->mb on chunk c. B first completes the output's send (the next chunk had it before it
 * could send this gradient, so that never waits) and the gradient's receive, and sends the
 * input gradient from the outbox. */
static ms_status run_backward(ms_stages *st, chunk *c, const ms_pp_action *a, ms_error *err) {
    bool b = a->op == MS_PP_BACKWARD;
    if (b) {
        MS_CHECK(settle(&c->act_out[a->mb], err));
        MS_CHECK(receive_grad(st, c, a->mb, err));
        MS_CHECK(settle(&c->grad_in[a->mb], err));
    }
    MS_CHECK(take_slot(st, c, a->mb, true, err));
    int64_t t0 = ms_now_ns(), cpu0 = traced_cpu_ns(st);
    ms_program_set_batch_window(c->prog, st->rows_dp, st->o.batch / st->strat.dp,
                                (int64_t)a->mb * st->rows_dp);
    MS_CHECK(b ? ms_program_backward_input(c->prog, err)
               : ms_program_backward_weight(c->prog, err));
    record_action(st, a, c, t0, cpu0);
    if (b && c->k > 0) {
        ms_tensor *g = ms_program_input_grad(c->prog, c->model.hidden_in);
        MS_CHECK(send_from_outbox(st, c, a->mb, true, ms_tensor_f32(g), (size_t)ms_tensor_numel(g),
                                  err));
    }
    release_slot(st, c, a->mb);
    return MS_OK;
}

static ms_status run_action(ms_stages *st, const ms_pp_action *a, bool train, float *const *inputs,
                            double *sum, ms_error *err) {
    chunk *c = &st->ch[a->chunk];
    switch (a->op) {
        case MS_PP_FORWARD:
            return run_forward(st, c, a, train, inputs, sum, err);
        case MS_PP_BACKWARD:
        case MS_PP_WEIGHT:
            return run_backward(st, c, a, err);
        case MS_PP_RECV_GRAD:
            return receive_grad(st, c, a->mb, err);
        default: /* the other transfers go with their computes */
            return MS_OK;
    }
}

static ms_status run(ms_stages *st, const ms_pp_action *acts, int nacts, bool train,
                     float *const *inputs, float *loss, ms_error *err) {
    double sum = 0;
    for (int c = 0; c < st->nch; c++) {
        for (int j = 0; j < st->m; j++) st->ch[c].slot_of[j] = -1;
        if (train) MS_CHECK(ms_program_zero_grads(st->ch[c].prog, err));
        memset(st->ch[c].holds, 0, sizeof(int) * (size_t)st->m);
    }
    ms_status rc = MS_OK;
    for (int i = 0; i < nacts && rc == MS_OK; i++)
        rc = run_action(st, &acts[i], train, inputs, &sum, err);
    /* Every send completes before the step ends: the next one reuses the tags and buffers. */
    ms_status done = settle_all(st, rc == MS_OK ? err : NULL);
    MS_CHECK(rc != MS_OK ? rc : done);
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

static bool is_tied(const ms_stages *st, int i) {
    return st->tie && (i == st->tie_param[0] || i == st->tie_param[1]);
}

ms_status ms_stages_train(ms_stages *st, int64_t step, float *const *inputs, float *loss,
                          ms_error *err) {
    for (int c = 0; c < st->nch; c++) ms_program_set_dropout(st->ch[c].prog, true, (uint64_t)step);
    MS_CHECK(run(st, st->acts, st->nacts, true, inputs, loss, err));
    for (int c = 0; c < st->nch; c++) MS_CHECK(ms_program_grad_sync(st->ch[c].prog, err));
    MS_CHECK(sync_tied(st, err));
    for (int k = 0; k < 2 && st->final_fn; k++) /* final only after the embedding's all-reduce */
        if (st->tie && st->tie_param[k] >= 0)
            MS_CHECK(st->final_fn(st->final_arg, st->tie_param[k], err));
    return MS_OK;
}

static ms_status final_adapter_call(void *arg, int param, ms_error *err) {
    struct use_adapter *a = arg;
    int i = a->base + param;
    return is_tied(a->st, i) ? MS_OK : a->st->final_fn(a->st->final_arg, i, err);
}

/* Sets every chunk's hook (set: ms_program_on_param_use or _on_grad_final) to adapter, which
 * turns the chunk's parameter index into the local one (use_at). */
static void set_chunk_hooks(ms_stages *st, void (*set)(ms_program *, ms_param_use_fn, void *),
                            ms_param_use_fn adapter) {
    for (int c = 0, base = 0; c < st->nch; c++) {
        st->use_at[c] = (struct use_adapter){st, base};
        set(st->ch[c].prog, adapter, &st->use_at[c]);
        base += ms_program_num_params(st->ch[c].prog);
    }
}

void ms_stages_on_grad_final(ms_stages *st, ms_param_use_fn fn, void *arg) {
    st->final_fn = fn;
    st->final_arg = arg;
    set_chunk_hooks(st, ms_program_on_grad_final, fn ? final_adapter_call : NULL);
}

void ms_stages_params_written(ms_stages *st) {
    for (int c = 0; c < st->nch; c++) ms_program_params_written(st->ch[c].prog);
}

ms_status ms_stages_param_sync(ms_stages *st, ms_error *err) {
    for (int c = 0; c < st->nch; c++) MS_CHECK(ms_program_param_sync(st->ch[c].prog, err));
    return MS_OK;
}

ms_status ms_stages_param_sync_one(ms_stages *st, int i, ms_error *err) {
    int at = 0;
    ms_program *p = local_param(st, i, &at);
    return p ? ms_program_param_sync_one(p, at, err) : MS_OK;
}

ms_status ms_stages_round_master(ms_stages *st, int i, struct ms_kctx *kc, ms_error *err) {
    int at = 0;
    ms_program *p = local_param(st, i, &at);
    return p ? ms_program_round_master(p, at, kc, err) : MS_OK;
}

static ms_status use_adapter_call(void *arg, int param, ms_error *err) {
    struct use_adapter *a = arg;
    return a->st->use_fn(a->st->use_arg, a->base + param, err);
}

void ms_stages_on_param_use(ms_stages *st, ms_param_use_fn fn, void *arg) {
    st->use_fn = fn;
    st->use_arg = arg;
    set_chunk_hooks(st, ms_program_on_param_use, fn ? use_adapter_call : NULL);
}

void ms_stages_param_use_order(ms_stages *st, int *order) {
    int at = 0;
    for (int c = 0; c < st->nch; c++) {
        ms_program *p = st->ch[c].prog;
        int n = ms_program_num_params(p);
        /* insertion sort by first use: a chunk holds tens of parameters */
        for (int i = 0; i < n; i++) {
            int k = at + i, first = ms_program_param_first_use(p, i);
            while (k > at && ms_program_param_first_use(p, order[k - 1] - at) > first) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = at + i;
        }
        at += n;
    }
}

ms_status ms_stages_forward(ms_stages *st, float *const *inputs, float *loss, ms_error *err) {
    for (int c = 0; c < st->nch; c++) ms_program_set_dropout(st->ch[c].prog, false, 0);
    return run(st, st->fwd_acts, st->nfwd, false, inputs, loss, err);
}

/* --- the catalog ----------------------------------------------------------------------------- */

static void add_buffer_entry(ms_stages *st, const ms_buffer_view *bv, int k, int local) {
    ms_stages_entry *e = &st->bcat[st->nbcat++];
    memset(e, 0, sizeof *e);
    e->param = bv->name;
    e->gshape = bv->gshape;
    e->pl = e->opt_pl = bv->pl;
    e->mesh = st->dm[k % st->p];
    e->model_chunk = k;
    e->local_index = local;
}

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
    int chunks = st->p * st->v, cap = 0, bcap = 0, local_base[MAX_CHUNKS] = {0}, at = 0;
    int buffer_base[MAX_CHUNKS] = {0}, bat = 0;
    for (int c = 0; c < st->nch; c++) {
        local_base[c] = at;
        at += ms_program_num_params(st->ch[c].prog);
        buffer_base[c] = bat;
        bat += ms_program_num_buffers(st->ch[c].prog);
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
        if (rc == MS_OK) bcap += ms_program_num_buffers(prog_of[k]);
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
        st->bcat = xcalloc((size_t)bcap + 1, sizeof *st->bcat);
        for (int k = 0; k < chunks; k++) {
            bool ours = k % st->p == st->stage;
            for (int i = 0; i < ms_program_num_buffers(prog_of[k]); i++) {
                ms_buffer_view bv;
                ms_program_buffer(prog_of[k], i, &bv);
                add_buffer_entry(st, &bv, k, ours ? buffer_base[k / st->p] + i : -1);
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

int ms_stages_buffer_catalog(const ms_stages *st, const ms_stages_entry **out) {
    *out = st->bcat;
    return st->nbcat;
}

ms_status ms_stages_load_buffer(ms_stages *st, int i, const float *full, ms_error *err) {
    for (int c = 0; c < st->nch && i >= 0; c++) {
        int n = ms_program_num_buffers(st->ch[c].prog);
        if (i < n) return ms_program_load_buffer(st->ch[c].prog, i, full, err);
        i -= n;
    }
    return ms_fail(err, MS_ERR_INVALID, "stages: no local buffer %d", i);
}

int ms_stages_num_buffers(const ms_stages *st) {
    int n = 0;
    for (int c = 0; c < st->nch; c++) n += ms_program_num_buffers(st->ch[c].prog);
    return n;
}

ms_status ms_stages_buffer(ms_stages *st, int i, ms_buffer_view *out) {
    for (int c = 0; c < st->nch && i >= 0; c++) {
        int n = ms_program_num_buffers(st->ch[c].prog);
        if (i < n) return ms_program_buffer(st->ch[c].prog, i, out);
        i -= n;
    }
    memset(out, 0, sizeof *out);
    return MS_ERR_INVALID;
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
    out->bound = inflight_bound(st);
    out->held = st->micro ? st->npool : 1;
    out->slot_bytes =
        st->micro ? (double)st->pool_bytes : (double)ms_program_arena_bytes(st->ch[0].prog);
    out->scratch_bytes = st->pass_scratch ? (double)st->pass_scratch_bytes : 0;
    out->activation_bytes = out->held * out->slot_bytes + out->scratch_bytes;
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

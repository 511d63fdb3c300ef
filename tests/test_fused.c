/* test_fused.c - what the models run against what it replaces, on one rank.
 *
 *   fused_*           GPT-2 and BERT (dropout 0.1 at every site) built with bias_gelu and
 *                     bias_dropout_add against the same models built op by op (bias, GELU,
 *                     dropout, add): over 3 training steps' masks, the losses within 1e-5
 *                     relative and every parameter's gradient within 1e-5 of its largest.
 *   kernels_*         the fused kernels bit for bit against the unfused kernels in sequence
 *                     (bias add, GELU, dropout, add; forward and backward), on one thread and
 *                     split over three (rows forward, bias columns backward).
 *   gathered_head     BERT's masked-LM head on the gathered masked positions against the head
 *                     it replaces, built here on the same trunk: dense + GELU + LayerNorm and
 *                     the tied decoder on all T positions, cross-entropy with -1 at the
 *                     unmasked ones, the mean over B x T scaled by T / k. The loss and every
 *                     parameter's gradient must agree as above.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/dist/reshard.h"
#include "engine/kernels/fused.h"
#include "engine/core/parallel.h"
#include "engine/model/gpt.h"
#include "tests/testkit.h"

enum { B = 4, T = 16, STEPS = 3, MAX_PARAMS = 64 };

/* One step's loss and every parameter's gradient, by name. */
typedef struct step_out {
    float loss;
    int n;
    char names[MAX_PARAMS][96];
    float *grads[MAX_PARAMS];
    int64_t sizes[MAX_PARAMS];
} step_out;

static void out_free(step_out *o) {
    for (int i = 0; i < o->n; i++) free(o->grads[i]);
    memset(o, 0, sizeof *o);
}

/* A fixed batch of byte tokens; for BERT masked as the trainer masks it. */
typedef struct batch {
    float ids[B * T], pos[B * T], full_targets[B * T];
    float targets[B * T], mlm_pos[B * T]; /* the head's inputs ([B, k] for BERT) */
} batch;

static void make_batch(const ms_model *m, uint64_t step, batch *bt) {
    int32_t ids[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = 1 + (int32_t)(ms_philox_uniform(3, step, (uint64_t)i) * 200);
        tgt[i] = 1 + (int32_t)(ms_philox_uniform(4, step, (uint64_t)i) * 200);
        bt->pos[i] = (float)(i % T);
    }
    if (m->mlm_per_row) ms_model_mlm_mask(m, 7, step, ids, tgt);
    for (int i = 0; i < B * T; i++) bt->ids[i] = (float)ids[i], bt->full_targets[i] = (float)tgt[i];
    ms_model_head_inputs(m, B, tgt, bt->targets, bt->mlm_pos);
}

/* A graph's inputs and what to feed them. */
typedef struct feeds {
    int n;
    int vals[4];
    const float *data[4];
} feeds;

/* Compiles g on the rank's one-rank mesh, runs training step `step` on the inputs and copies
 * out the loss and gradients. */
static void run_step(mt_rank *r, ms_graph *g, const feeds *in, uint64_t step, step_out *out) {
    ms_error err = {0};
    ms_mesh mesh;
    const int one = 1, zero = 0;
    ms_dmesh *dm = NULL;
    ms_program *p = NULL;
    if (!MT_OK(r, ms_mesh_init(&mesh, 1, &one, NULL, &zero, &err), &err)) return;
    if (MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) {
        ms_compile_opts co = {.seed = 42};
        if (MT_OK(r, ms_program_compile(g, dm, &co, &p, &err), &err)) {
            for (int i = 0; i < in->n; i++)
                MT_OK(r, ms_program_feed(p, in->vals[i], in->data[i], &err), &err);
            ms_program_set_dropout(p, true, step);
            MT_OK(r, ms_program_step(p, &out->loss, &err), &err);
            out->n = ms_program_num_params(p);
            MT_CHECK(r, out->n <= MAX_PARAMS, "%d parameters", out->n);
            for (int i = 0; i < out->n && i < MAX_PARAMS; i++) {
                ms_param_view pv;
                ms_program_param(p, i, &pv);
                snprintf(out->names[i], sizeof out->names[i], "%s", pv.name);
                out->sizes[i] = ms_tensor_numel(&pv.grad);
                out->grads[i] = malloc(sizeof(float) * (size_t)out->sizes[i]);
                memcpy(out->grads[i], ms_tensor_f32(&pv.grad),
                       sizeof(float) * (size_t)out->sizes[i]);
            }
        }
        ms_program_destroy(p);
        ms_dmesh_destroy(dm);
    }
    ms_mesh_free(&mesh);
}

/* got against want: the loss within 1e-5 relative, each gradient (matched by name) within
 * 1e-5 of want's largest magnitude; every parameter of want present in got. */
static void compare(mt_rank *r, const char *what, const step_out *got, const step_out *want) {
    MT_CHECK(r, fabsf(got->loss - want->loss) <= 1e-5f * fabsf(want->loss),
             "%s: loss %.9g against %.9g", what, got->loss, want->loss);
    MT_CHECK(r, got->n == want->n, "%s: %d parameters against %d", what, got->n, want->n);
    for (int i = 0; i < want->n; i++) {
        int j = 0;
        while (j < got->n && strcmp(got->names[j], want->names[i])) j++;
        if (j == got->n || got->sizes[j] != want->sizes[i]) {
            MT_CHECK(r, false, "%s: no gradient of %s's shape", what, want->names[i]);
            continue;
        }
        double big = 0, diff = 0;
        for (int64_t k = 0; k < want->sizes[i]; k++) {
            big = fmax(big, fabs(want->grads[i][k]));
            diff = fmax(diff, fabs(got->grads[j][k] - want->grads[i][k]));
        }
        MT_CHECK(r, big > 0, "%s: %s has no gradient", what, want->names[i]);
        MT_CHECK(r, diff <= 1e-5 * big, "%s: %s's gradient differs by %.3g (largest %.3g)", what,
                 want->names[i], diff, big);
    }
}

static ms_model_config config(bool bert) {
    return mt_tiny_config(bert, 0.1);
}

/* The model's inputs from a batch. */
static feeds model_feeds(const ms_model *m, const batch *bt) {
    feeds f = {
        .n = 3, .vals = {m->ids, m->pos, m->targets}, .data = {bt->ids, bt->pos, bt->targets}};
    if (m->mlm_pos >= 0) f.vals[f.n] = m->mlm_pos, f.data[f.n++] = bt->mlm_pos;
    return f;
}

/* Training step `step` of graph g against the same step of graph want. */
static void check_step(mt_rank *r, const char *what, ms_graph *g, const feeds *in, ms_graph *want,
                       const feeds *want_in, uint64_t step) {
    step_out a = {0}, b = {0};
    run_step(r, g, in, step, &a);
    run_step(r, want, want_in, step, &b);
    compare(r, what, &a, &b);
    out_free(&a), out_free(&b);
}

/* --- fused operators against the chains they replace --------------------------------------- */

static void fused_rank(mt_rank *r, void *arg) {
    bool bert = *(const bool *)arg;
    ms_model_config cfg = config(bert);
    ms_error err = {0};
    ms_model fused, chain;
    ms_model_chunk whole = {.layer_hi = cfg.n_layer, .first = true, .last = true};
    ms_model_chunk ref = whole;
    ref.unfused = true;
    if (!MT_OK(r, ms_model_build_chunk(&cfg, B, T, &whole, &fused, &err), &err)) return;
    if (!MT_OK(r, ms_model_build_chunk(&cfg, B, T, &ref, &chain, &err), &err)) return;
    /* the builds differ: the fused one has the fused operators and fewer values */
    MT_CHECK(r, ms_graph_num_values(fused.g) < ms_graph_num_values(chain.g),
             "the fused build has %d values, the chain %d", ms_graph_num_values(fused.g),
             ms_graph_num_values(chain.g));
    for (uint64_t step = 0; step < STEPS && !r->failures; step++) {
        batch bt;
        make_batch(&fused, step, &bt);
        feeds a = model_feeds(&fused, &bt), b = model_feeds(&chain, &bt);
        check_step(r, bert ? "bert fused" : "gpt2 fused", fused.g, &a, chain.g, &b, step);
    }
    ms_model_free(&fused), ms_model_free(&chain);
}

static void fused_gpt2(void **state) {
    (void)state;
    bool bert = false;
    mt_run_threads(1, fused_rank, &bert);
}

static void fused_bert(void **state) {
    (void)state;
    bool bert = true;
    mt_run_threads(1, fused_rank, &bert);
}

/* --- the kernels against the unfused ones, on any number of threads ----------------------- */

enum { KR = 1024, KC = 96 }; /* enough rows and columns for several chunks per thread */

static float *kfill(uint64_t stream, int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = 2 * ms_philox_uniform(9, stream, (uint64_t)i) - 1;
    return p;
}

static void expect_same(const char *what, int threads, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s on %d threads: element %lld is %.9g, the unfused kernels give %.9g", what,
                     threads, (long long)i, a[i], b[i]);
}

/* The unfused reference: bias add then GELU, and their backward into (dx, db). */
static void bias_gelu_chain(float *y, float *dx, float *db, const float *x, const float *b,
                            const float *dy) {
    float *h = malloc(sizeof(float) * KR * KC), *dh = calloc(KR * KC, sizeof(float));
    ms_k_bias_add_forward(h, x, b, KR, KC);
    ms_k_gelu_forward(y, h, (int64_t)KR * KC);
    ms_k_gelu_backward(dh, h, dy, (int64_t)KR * KC);
    ms_k_bias_add_backward(dx, db, dh, KR, KC);
    free(h), free(dh);
}

/* The unfused reference: res + dropout(x + b) and its backward into (dx, db, dres). */
static void bda_chain(float *y, float *dx, float *db, float *dres, const float *x, const float *b,
                      const float *res, const float *dy, const ms_k_fused_dropout *d) {
    const int64_t n = (int64_t)KR * KC;
    float *h = malloc(sizeof(float) * n), *dh = calloc((size_t)n, sizeof(float));
    ms_k_bias_add_forward(h, x, b, KR, KC);
    const ms_k_dropout_box *bx = &d->box;
    if (d->p > 0)
        ms_k_dropout_forward(h, h, d->p, d->seed, d->stream, bx->ndim, bx->lshape, bx->gstart,
                             bx->gshape, bx->w);
    ms_k_add_forward(y, res, h, n);
    ms_k_add_backward(dres, dh, dy, n);
    float *dd = calloc((size_t)n, sizeof(float));
    if (d->p > 0)
        ms_k_dropout_backward(dd, dh, d->p, d->seed, d->stream, bx->ndim, bx->lshape, bx->gstart,
                              bx->gshape, bx->w);
    ms_k_bias_add_backward(dx, db, d->p > 0 ? dd : dh, KR, KC);
    free(h), free(dh), free(dd);
}

/* A kernel's results: output and gradients, zeroed. */
typedef struct kout {
    float *y, *dx, *db, *dres;
} kout;

static kout kalloc(void) {
    const size_t n = (size_t)KR * KC;
    return (kout){calloc(n, 4), calloc(n, 4), calloc(KC, 4), calloc(n, 4)};
}

static void kcheck(const char *what, int threads, kout *got, kout *want, bool res) {
    const int64_t n = (int64_t)KR * KC;
    expect_same(what, threads, got->y, want->y, n);
    expect_same(what, threads, got->dx, want->dx, n);
    expect_same(what, threads, got->db, want->db, KC);
    if (res) expect_same(what, threads, got->dres, want->dres, n);
    free(got->y), free(got->dx), free(got->db), free(got->dres);
}

static void kernels_match_chains(void **state) {
    (void)state;
    const int64_t n = (int64_t)KR * KC, shape[2] = {KR, KC}, start[2] = {0, 0};
    float *x = kfill(1, n), *b = kfill(2, KC), *res = kfill(3, n), *dy = kfill(4, n);
    const int threads[2] = {1, 3};
    kout want = kalloc();
    bias_gelu_chain(want.y, want.dx, want.db, x, b, dy);
    for (int t = 0; t < 2; t++) {
        ms_parallel_set_threads(threads[t]);
        kout got = kalloc();
        ms_k_bias_gelu_forward(got.y, x, b, KR, KC);
        ms_k_bias_gelu_backward(got.dx, got.db, dy, x, b, KR, KC);
        kcheck("bias_gelu", threads[t], &got, &want, false);
    }
    ms_parallel_set_threads(1);
    free(want.y), free(want.dx), free(want.db), free(want.dres);
    for (int drop = 0; drop < 2; drop++) {
        ms_k_fused_dropout d = {
            .p = drop ? 0.1f : 0.0f, .seed = 5, .stream = 2, .box = {2, shape, start, shape, NULL}};
        want = kalloc();
        bda_chain(want.y, want.dx, want.db, want.dres, x, b, res, dy, &d);
        for (int t = 0; t < 2; t++) {
            ms_parallel_set_threads(threads[t]);
            kout got = kalloc();
            ms_k_bias_dropout_add_forward(got.y, x, b, res, KC, &d);
            ms_k_bias_dropout_add_backward(got.dx, got.db, got.dres, dy, KC, &d);
            kcheck(drop ? "bias_dropout_add" : "bias_dropout_add p 0", threads[t], &got, &want,
                   true);
        }
        ms_parallel_set_threads(1);
        free(want.y), free(want.dx), free(want.db), free(want.dres);
    }
    free(x), free(b), free(res), free(dy);
}

/* --- BERT's gathered head against the head on every position ------------------------------- */

static int param(ms_graph *g, const char *name, int64_t c, int ndim, ms_init init) {
    const int64_t shape[2] = {c, c};
    return ms_graph_param(g, name, ndim, shape, init);
}

/* The masked-LM head as it was before the gather, on the trunk's output x [B, T, C]. Returns
 * the targets input ([B, T], -1 where not masked). */
static int full_head(ms_graph *g, const ms_model_config *cfg, int x, int k) {
    const int64_t C = cfg->n_embd, bt[2] = {B, T};
    int wte = ms_graph_find(g, "embeddings.word_embeddings.weight");
    int w =
        param(g, "cls.predictions.transform.dense.weight", C, 2, (ms_init){MS_INIT_NORMAL, 0.02f});
    int b = param(g, "cls.predictions.transform.dense.bias", C, 1, (ms_init){MS_INIT_CONST, 0});
    int lw =
        param(g, "cls.predictions.transform.LayerNorm.weight", C, 1, (ms_init){MS_INIT_CONST, 1});
    int lb =
        param(g, "cls.predictions.transform.LayerNorm.bias", C, 1, (ms_init){MS_INIT_CONST, 0});
    int targets = ms_graph_input(g, "targets", 2, bt);
    int in[3] = {x, w};
    x = ms_graph_op(g, MS_OP_MATMUL, NULL, 2, in, "dense.mm");
    in[0] = x, in[1] = b;
    x = ms_graph_op(g, MS_OP_BIAS, NULL, 2, in, "dense");
    x = ms_graph_op(g, MS_OP_GELU, NULL, 1, &x, "gelu");
    ms_op_attrs eps = {.f = {(float)cfg->layer_norm_epsilon}};
    in[0] = x, in[1] = lw, in[2] = lb;
    x = ms_graph_op(g, MS_OP_LAYERNORM, &eps, 3, in, "ln");
    ms_op_attrs tb = {.i = {1}};
    in[0] = x, in[1] = wte;
    int logits = ms_graph_op(g, MS_OP_MATMUL, &tb, 2, in, "logits");
    in[0] = logits, in[1] = targets;
    int losses = ms_graph_op(g, MS_OP_XENT, NULL, 2, in, "losses");
    ms_op_attrs all = {.i = {-1}}, sc = {.f = {(float)T / (float)k}};
    int mean = ms_graph_op(g, MS_OP_MEAN, &all, 1, &losses, "loss_all");
    ms_graph_set_output(g, -1);
    ms_graph_set_loss(g, ms_graph_op(g, MS_OP_SCALE, &sc, 1, &mean, "loss"));
    return targets;
}

static void gathered_rank(mt_rank *r, void *arg) {
    (void)arg;
    ms_model_config cfg = config(true);
    ms_error err = {0};
    ms_model gathered, trunk;
    ms_model_chunk body = {.layer_hi = cfg.n_layer, .first = true};
    if (!MT_OK(r, ms_model_build(&cfg, B, T, &gathered, &err), &err)) return;
    if (!MT_OK(r, ms_model_build_chunk(&cfg, B, T, &body, &trunk, &err), &err)) return;
    int k = gathered.mlm_per_row;
    MT_CHECK(r, k == 3 && gathered.mlm_pos >= 0, "k = %d, positions input %d", k, gathered.mlm_pos);
    int targets = full_head(trunk.g, &cfg, trunk.hidden_out, k);
    MT_OK(r, ms_graph_error(trunk.g, &err), &err);
    for (uint64_t step = 0; step < STEPS && !r->failures; step++) {
        batch bt;
        make_batch(&gathered, step, &bt);
        feeds a = model_feeds(&gathered, &bt);
        feeds b = {.n = 3,
                   .vals = {trunk.ids, trunk.pos, targets},
                   .data = {bt.ids, bt.pos, bt.full_targets}};
        check_step(r, "gathered head", gathered.g, &a, trunk.g, &b, step);
    }
    ms_model_free(&gathered), ms_model_free(&trunk);
}

static void gathered_head(void **state) {
    (void)state;
    mt_run_threads(1, gathered_rank, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(fused_gpt2),
    cmocka_unit_test(fused_bert),
    cmocka_unit_test(gathered_head),
    cmocka_unit_test(kernels_match_chains),
};
MT_MAIN("fused", tests)

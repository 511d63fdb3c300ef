/* eager_train.c - a training loop written in eager mode, on any mesh of thread ranks.
 *
 *   eager_train --mesh 2x2 --steps 20 [--device cpu|fenced|cuda|auto]
 *
 * A 2-layer MLP (layer norm, W1, GELU, W2, cross-entropy) learns to classify random vectors
 * by a fixed random linear teacher. On a 2-d mesh, dim 0 is data parallel (the batch is
 * split over it) and dim 1 tensor parallel, Megatron style: W1 split by columns, W2 by rows,
 * so the hidden activations never move and the output is one all-reduce. On a 1-d mesh,
 * --parallel picks dp or tp. Each step is the loop of docs/eager.md: eager calls recorded on
 * a tape, ms_tape_backward, AdamW on each rank's shards. Every mesh prints the same losses.
 * The tensors live on the rank's device (--device): batches and initial weights are made on
 * the host and moved there; the kernels run there.
 *
 * --to-static: step 0's recording also becomes a graph program (ms_tape_to_static,
 * docs/eager.md) with the same weights and placements; after the eager run the trainer trains
 * it from those weights under the mesh's dp x tp strategy, and each line prints both losses.
 * Weight decay is off in that mode (the trainer's AdamW decays every parameter).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/graph/eager_adamw.h"
#include "engine/graph/tape.h"
#include "engine/model/static_def.h"
#include "engine/runtime/ctx.h"
#include "engine/train/trainer.h"

enum { BATCH = 32, DIM = 16, HIDDEN = 64, CLASSES = 8 };

typedef struct options {
    const char *mesh;
    int steps;
    float lr;
    bool tp_1d; /* a 1-d mesh is tensor parallel */
    ms_device_choice device;
    bool to_static; /* also train step 0's graph with the trainer */
} options;

/* Placements: dp on mesh dim 0 and tp on dim 1 (2-d), or one of them (1-d). */
typedef struct layout {
    const char *x, *w1, *b1, *w2, *rep;
} layout;

static const layout layout_2d = {"[S(0), R]", "[R, S(1)]", "[R, S(0)]", "[R, S(0)]", "[R, R]"};
static const layout layout_dp = {"[S(0)]", "[R]", "[R]", "[R]", "[R]"};
static const layout layout_tp = {"[R]", "[S(1)]", "[S(0)]", "[S(0)]", "[R]"};

typedef struct model {
    ms_dtensor ln_w, ln_b, w1, b1, w2, b2;
} model;

#define N_PARAMS 6

/* A parameter made shard by shard: Philox keyed by global index, so every mesh starts from
 * the same weights. */
static ms_status param(ms_dmesh *dm, int ndim, const int64_t *shape, const char *pl, uint64_t id,
                       float mean, float std, ms_dtensor *out, ms_error *err) {
    *out = (ms_dtensor){.ndim = ndim, .mesh = dm};
    memcpy(out->gshape, shape, sizeof(int64_t) * (size_t)ndim);
    MS_CHECK(ms_placements_parse(pl, &out->pl, err));
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(&out->pl, &dm->mesh, dm->coords, ndim, shape, start, len);
    ms_tensor host; /* made on the host, then moved to the rank's device */
    MS_CHECK(ms_tensor_alloc(ms_device_host(), MS_F32, ndim, len, &host, err));
    ms_status st = ms_tensor_init_normal(&host, 7, id, shape, start, mean, std, err);
    ms_placements where = out->pl; /* from_local rewrites *out */
    if (st == MS_OK) st = ms_dtensor_from_local(dm, &host, &where, ndim, shape, out, err);
    if (st != MS_OK) ms_tensor_release(&host);
    return st;
}

static ms_status model_init(ms_dmesh *dm, const layout *l, model *m, ms_error *err) {
    const int64_t c[1] = {DIM}, w1[2] = {DIM, HIDDEN}, h[1] = {HIDDEN}, w2[2] = {HIDDEN, CLASSES},
                  k[1] = {CLASSES};
    MS_CHECK(param(dm, 1, c, l->rep, 1, 1.0f, 0.0f, &m->ln_w, err));
    MS_CHECK(param(dm, 1, c, l->rep, 2, 0.0f, 0.0f, &m->ln_b, err));
    MS_CHECK(param(dm, 2, w1, l->w1, 3, 0.0f, 0.25f, &m->w1, err));
    MS_CHECK(param(dm, 1, h, l->b1, 4, 0.0f, 0.0f, &m->b1, err));
    MS_CHECK(param(dm, 2, w2, l->w2, 5, 0.0f, 0.125f, &m->w2, err));
    return param(dm, 1, k, l->rep, 6, 0.0f, 0.0f, &m->b2, err);
}

static void model_params(model *m, ms_dtensor **p) {
    ms_dtensor *all[N_PARAMS] = {&m->ln_w, &m->ln_b, &m->w1, &m->b1, &m->w2, &m->b2};
    memcpy(p, all, sizeof all);
}

/* Batch `step` on the host: x ~ N(0, 1), y the class the teacher scores highest. */
static ms_status host_batch(int step, ms_tensor *gx, ms_tensor *gy, ms_error *err) {
    const int64_t xs[2] = {BATCH, DIM}, ts[2] = {DIM, CLASSES}, ys[1] = {BATCH};
    ms_tensor teacher;
    MS_CHECK(ms_tensor_alloc(ms_device_host(), MS_F32, 2, xs, gx, err));
    MS_CHECK(ms_tensor_alloc(ms_device_host(), MS_F32, 2, ts, &teacher, err));
    MS_CHECK(ms_tensor_alloc(ms_device_host(), MS_F32, 1, ys, gy, err));
    ms_tensor_init_normal(gx, 7, 1000 + (uint64_t)step, xs, NULL, 0.0f, 1.0f, err);
    ms_tensor_init_normal(&teacher, 7, 999, ts, NULL, 0.0f, 1.0f, err);
    const float *px = ms_tensor_f32(gx), *pt = ms_tensor_f32(&teacher);
    for (int b = 0; b < BATCH; b++) {
        int best = 0;
        float best_score = -1e30f;
        for (int c = 0; c < CLASSES; c++) {
            float s = 0;
            for (int d = 0; d < DIM; d++) s += px[b * DIM + d] * pt[d * CLASSES + c];
            if (s > best_score) best_score = s, best = c;
        }
        ms_tensor_f32(gy)[b] = (float)best;
    }
    ms_tensor_release(&teacher);
    return MS_OK;
}

/* One batch, every rank drawing the same global batch and keeping its shard. */
static ms_status batch(ms_dmesh *dm, const layout *l, int step, ms_dtensor *x, ms_dtensor *y,
                       ms_error *err) {
    ms_tensor gx, gy;
    MS_CHECK(host_batch(step, &gx, &gy, err));
    ms_placements pl;
    ms_status st = ms_placements_parse(l->x, &pl, err);
    if (st == MS_OK) st = ms_dtensor_shard(dm, &gx, &pl, x, err);
    if (st == MS_OK) st = ms_dtensor_shard(dm, &gy, &pl, y, err);
    ms_tensor_release(&gx), ms_tensor_release(&gy);
    return st;
}

/* One call recorded on the tape; nothing once a call has failed (*st keeps the first). */
static void call(ms_tape *t, int op, const ms_op_attrs *a, int n_in, const ms_dtensor *const *in,
                 ms_dtensor *out, ms_status *st, ms_error *err) {
    const ms_eager_opts eo = {.allow_reshard = true};
    if (*st == MS_OK) *st = ms_tape_op(t, op, a, n_in, in, 1, out, &eo, err);
}

#define IN(...)                                                                                    \
    (const ms_dtensor *[]) {                                                                       \
        __VA_ARGS__                                                                                \
    }

/* The forward on the tape: loss = mean(xent(gelu(ln(x) @ W1 + b1) @ W2 + b2, y)). The
 * activations are released as soon as the forward is done: the tape holds what backward
 * needs. */
static ms_status forward(ms_tape *t, model *m, const ms_dtensor *x, const ms_dtensor *y,
                         ms_dtensor *loss, ms_error *err) {
    const ms_op_attrs eps = {.f = {1e-5f}}, all = {.i = {-1}};
    ms_dtensor h[7] = {0};
    ms_status st = MS_OK;
    call(t, MS_OP_LAYERNORM, &eps, 3, IN(x, &m->ln_w, &m->ln_b), &h[0], &st, err);
    call(t, MS_OP_MATMUL, NULL, 2, IN(&h[0], &m->w1), &h[1], &st, err); /* column-parallel */
    call(t, MS_OP_BIAS, NULL, 2, IN(&h[1], &m->b1), &h[2], &st, err);
    call(t, MS_OP_GELU, NULL, 1, IN(&h[2]), &h[3], &st, err);
    call(t, MS_OP_MATMUL, NULL, 2, IN(&h[3], &m->w2), &h[4], &st, err); /* row-parallel */
    call(t, MS_OP_BIAS, NULL, 2, IN(&h[4], &m->b2), &h[5], &st, err);
    call(t, MS_OP_XENT, NULL, 2, IN(&h[5], y), &h[6], &st, err);
    call(t, MS_OP_MEAN, &all, 1, IN(&h[6]), loss, &st, err);
    for (int i = 0; i < 7; i++) ms_dtensor_release(&h[i]);
    return st;
}

/* The loss's value on every rank (it may be partial over some mesh dims). */
static ms_status loss_value(const ms_dtensor *loss, float *out, ms_error *err) {
    ms_tensor full;
    MS_CHECK(ms_dtensor_full(loss, &full, err));
    *out = full.storage ? ms_tensor_f32(&full)[0] : 0.0f;
    ms_tensor_release(&full);
    return MS_OK;
}

static const char *const param_names[N_PARAMS] = {"ln.weight", "ln.bias",    "fc1.weight",
                                                  "fc1.bias",  "fc2.weight", "fc2.bias"};

/* One step: forward on the tape, backward, AdamW on every parameter's local shard. With
 * recipe, the step's forward is also made a graph (to_static) into *recipe. */
static ms_status train_step(ms_dmesh *dm, const layout *l, ms_tape *tape, ms_eager_adamw *opt,
                            model *m, int step, const ms_adamw_opts *ao, float *loss_out,
                            ms_static_graph **recipe, ms_error *err) {
    ms_dtensor *params[N_PARAMS];
    model_params(m, params);
    const bool decay[N_PARAMS] = {false, false, true, false, true, false};
    ms_dtensor x = {0}, y = {0}, loss = {0};
    ms_tape_clear(tape);
    ms_status st = batch(dm, l, step, &x, &y, err);
    for (int i = 0; i < N_PARAMS && st == MS_OK; i++) {
        st = ms_tape_watch(tape, params[i], err);
        if (st == MS_OK) st = ms_tape_name(tape, params[i], param_names[i], err);
    }
    if (st == MS_OK && recipe) st = ms_tape_input(tape, &x, "x", err);
    if (st == MS_OK && recipe) st = ms_tape_input(tape, &y, "y", err);
    if (st == MS_OK) st = forward(tape, m, &x, &y, &loss, err);
    if (st == MS_OK && recipe)
        st = ms_tape_to_static(tape, &loss, N_PARAMS, (const ms_dtensor *const *)params, recipe,
                               err);
    if (st == MS_OK) st = loss_value(&loss, loss_out, err);
    if (st == MS_OK) st = ms_tape_backward(tape, &loss, err);
    if (st == MS_OK) st = ms_eager_adamw_step(opt, tape, N_PARAMS, params, decay, ao, err);
    ms_dtensor_release(&x), ms_dtensor_release(&y), ms_dtensor_release(&loss);
    return st;
}

/* --to-static: the trainer's batches are the eager run's (host_batch), rows r0.. */
static ms_status source_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                             uint64_t b, int B, int r0, int nrows, float *const *out,
                             ms_error *err) {
    (void)src, (void)s, (void)eval, (void)seed, (void)B;
    ms_tensor gx, gy;
    MS_CHECK(host_batch((int)b, &gx, &gy, err));
    memcpy(out[0], ms_tensor_f32(&gx) + (size_t)r0 * DIM, sizeof(float) * (size_t)nrows * DIM);
    memcpy(out[1], ms_tensor_f32(&gy) + r0, sizeof(float) * (size_t)nrows);
    ms_tensor_release(&gx), ms_tensor_release(&gy);
    return MS_OK;
}

static const ms_batch_source_vt source_vt = {.read = source_read};

/* Trains the graph made of step 0 with the trainer, from step 0's weights, printing each
 * step's loss beside the eager run's. */
static ms_status train_graph(ms_ctx *ctx, const ms_mesh *mesh, const options *o,
                             const ms_static_graph *recipe, const float *eager, ms_error *err) {
    ms_model_def def;
    MS_CHECK(ms_model_def_from_static(recipe, "eager-mlp", &def, err));
    ms_batch_source src = {.vt = &source_vt, .name = "the eager batches", .nfields = 2};
    src.fields[0] = (ms_batch_field){.name = "x", .ndim = 1, .shape = {DIM}};
    src.fields[1] = (ms_batch_field){.name = "y", .ndim = 0, .integer = true};
    for (int s = 0; s < 3; s++) src.samples[s] = BATCH;
    int dp = mesh->ndim == 2 ? mesh->shape[0] : o->tp_1d ? 1 : mesh->size;
    int tp = mesh->ndim == 2 ? mesh->shape[1] : o->tp_1d ? mesh->size : 1;
    ms_strategy s;
    MS_CHECK(ms_strategy_init(&s, dp, tp, 1, false, err));
    ms_train_opts to = {
        .batch = BATCH, .seq = 1, .steps = o->steps, .seed = 7, .lr = o->lr, .min_lr = o->lr};
    ms_trainer *t = NULL;
    MS_CHECK(ms_trainer_create_def(ctx, &def, &s, NULL, &to, &src, &t, err));
    ms_status st = MS_OK;
    for (int step = 0; step < o->steps && st == MS_OK; step++) {
        ms_step_result r;
        st = ms_trainer_step(t, &r, err);
        if (st == MS_OK && ctx->rank == 0)
            printf("step %3d  loss %.6f  graph %.6f\n", step, eager[step], r.loss);
    }
    ms_trainer_destroy(t);
    return st;
}

static ms_status rank_main(ms_ctx *ctx, void *arg, ms_error *err) {
    const options *o = arg;
    ms_mesh mesh;
    MS_CHECK(ms_mesh_parse(&mesh, o->mesh, err));
    const layout *l = mesh.ndim == 2 ? &layout_2d : o->tp_1d ? &layout_tp : &layout_dp;
    ms_dmesh *dm = NULL;
    ms_status st = ms_dmesh_create(ctx, &mesh, &dm, err);
    model m = {0};
    if (st == MS_OK) st = model_init(dm, l, &m, err);
    ms_tape *tape = ms_tape_create();
    ms_eager_adamw *opt = ms_eager_adamw_create();
    const ms_adamw_opts ao = {.lr = o->lr,
                              .beta1 = 0.9f,
                              .beta2 = 0.95f,
                              .eps = 1e-8f,
                              .weight_decay = o->to_static ? 0.0f : 0.01f};
    ms_static_graph *recipe = NULL;
    float *losses = calloc((size_t)o->steps, sizeof *losses);
    for (int step = 0; step < o->steps && st == MS_OK && losses; step++) {
        st = train_step(dm, l, tape, opt, &m, step, &ao, &losses[step],
                        o->to_static && step == 0 ? &recipe : NULL, err);
        if (st == MS_OK && ctx->rank == 0 && !o->to_static)
            printf("step %3d  loss %.6f\n", step, losses[step]);
    }
    if (st == MS_OK && recipe) st = train_graph(ctx, &mesh, o, recipe, losses, err);
    ms_static_free(recipe);
    free(losses);
    ms_eager_adamw_destroy(opt);
    ms_tape_destroy(tape);
    ms_dtensor *params[N_PARAMS];
    model_params(&m, params);
    for (int i = 0; i < N_PARAMS; i++) ms_dtensor_release(params[i]);
    if (dm) ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    return st;
}

static int usage(FILE *f, int rc) {
    fprintf(
        f, "usage: eager_train [--mesh AxB] [--steps N] [--lr X] [--parallel dp|tp] [--to-static]\n"
           "                   [--device cpu|fenced|cuda|auto]\n"
           "  --mesh      ranks per mesh dim: 2-d is dp x tp, 1-d is --parallel (default 2x2)\n"
           "  --steps     training steps (default 20)\n"
           "  --lr        AdamW learning rate (default 0.01)\n"
           "  --parallel  what a 1-d mesh splits: dp (the batch) or tp (the layers)\n"
           "  --device    where each rank's tensors and kernels are (default cpu)\n"
           "  --to-static also train step 0's graph with the trainer (to_static)\n");
    return rc;
}

/* Flags; a bad one exits 2 with a line naming it and what is accepted. */
static int parse(int argc, char **argv, options *o) {
    *o = (options){.mesh = "2x2", .steps = 20, .lr = 0.01f};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) exit(usage(stdout, 0));
        if (!strcmp(f, "--to-static")) {
            o->to_static = true;
            continue;
        }
        char *end = NULL;
        if (!v) {
            fprintf(stderr, "eager_train: %s needs a value (see --help)\n", f);
            return 2;
        }
        if (!strcmp(f, "--mesh")) {
            o->mesh = v;
        } else if (!strcmp(f, "--steps")) {
            long s = strtol(v, &end, 10);
            if (*end || s < 1 || s > 1000000) {
                fprintf(stderr, "eager_train: --steps %s: give a whole number from 1\n", v);
                return 2;
            }
            o->steps = (int)s;
        } else if (!strcmp(f, "--lr")) {
            o->lr = strtof(v, &end);
            if (*end || !(o->lr > 0 && o->lr < 10)) {
                fprintf(stderr, "eager_train: --lr %s: give a number in (0, 10)\n", v);
                return 2;
            }
        } else if (!strcmp(f, "--parallel")) {
            if (strcmp(v, "dp") && strcmp(v, "tp")) {
                fprintf(stderr, "eager_train: --parallel %s: give dp or tp\n", v);
                return 2;
            }
            o->tp_1d = !strcmp(v, "tp");
        } else if (!strcmp(f, "--device")) {
            int c = 0;
            while (c < MS_DEVICE_CHOICE_COUNT && strcmp(v, ms_device_choice_name(c))) c++;
            if (c == MS_DEVICE_CHOICE_COUNT) {
                fprintf(stderr, "eager_train: --device %s: give cpu, fenced, cuda or auto\n", v);
                return 2;
            }
            o->device = (ms_device_choice)c;
        } else {
            fprintf(stderr, "eager_train: unknown option %s %s (see --help)\n", f, v);
            return 2;
        }
        i++;
    }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    ms_error err = {0};
    ms_mesh mesh;
    if (ms_mesh_parse(&mesh, o.mesh, &err) != MS_OK) {
        fprintf(stderr, "eager_train: --mesh %s: %s\n", o.mesh, err.msg);
        return 2;
    }
    int ranks = mesh.size;
    bool bad = mesh.ndim > 2 || ranks > 64;
    ms_mesh_free(&mesh);
    if (bad) {
        fprintf(stderr, "eager_train: --mesh %s: give 1 or 2 dims and at most 64 ranks\n", o.mesh);
        return 2;
    }
    ms_device_kind kind;
    char note[200] = "";
    if (ms_device_resolve(o.device, &kind, note, sizeof note, &err) != MS_OK) {
        fprintf(stderr, "eager_train: %s\n", err.msg);
        return 2;
    }
    if (note[0]) fprintf(stderr, "eager_train: %s\n", note);
    ms_launch_opts lo = {.backend = MS_BACKEND_THREADS, .nranks = ranks, .seed = 7, .device = kind};
    if (ms_launch(&lo, rank_main, &o, &err) != MS_OK) {
        fprintf(stderr, "eager_train: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* test_eager_train.c - eager training (graph/tape.h, graph/eager_adamw.h) against graph mode.
 *
 * A model is written once against a small builder that either records a graph (graph mode:
 * compile, step, AdamW on each parameter's view) or runs eager calls on a tape (eager mode:
 * forward, ms_tape_backward, ms_eager_adamw_step). The same placements are given to both.
 *
 *   single ops   the gradients of every parameter of one op (or a tiny chain where a value is
 *                used twice) equal graph mode's, on meshes [2] and [2, 2]
 *   training     a 2-layer MLP with a layer norm and cross-entropy, dp x tp (Megatron: W1
 *                column-, W2 row-parallel), trained a few AdamW steps on [1], [2] and [2, 2]:
 *                losses and final parameters equal graph mode's on the same strategy and the
 *                one-rank run's, within 1e-5 relative
 *   fenced       the training loop on the fenced device (thread ranks) on [1] and dp2 x tp2:
 *                losses and final parameters equal the CPU device's bit for bit
 *   errors       backward twice, a loss that is not a scalar, a tensor from another mesh
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/dist/reshard.h"
#include "engine/graph/eager_adamw.h"
#include "engine/graph/graph.h"
#include "engine/graph/tape.h"
#include "tests/testkit.h"

#define MAXV     48
#define MAXP     12
#define MAXSTEPS 4

/* --- the builder: one model description, run in graph or in eager mode -------------------- */

/* Graph mode: a parameter's initial values or an input's feed. */
typedef struct leaf_data {
    ms_shape shape;
    float *full; /* global values (owned) */
} leaf_data;

typedef struct mb {
    mt_rank *r;
    ms_dmesh *dm;
    int step;
    /* graph mode */
    ms_graph *g;
    leaf_data in_data[MAXV]; /* graph: the value's feed (inputs), indexed by value */
    /* eager mode */
    ms_tape *tape;
    ms_dtensor v[MAXV];
    bool owned[MAXV];
    int nv;
    ms_dtensor params[MAXP]; /* persistent across steps */
    int np, param_seen;
    bool failed;
} mb;

static void fill(float *x, int64_t n, uint64_t stream, float scale) {
    for (int64_t k = 0; k < n; k++)
        x[k] = scale * (2 * (float)ms_philox_uniform(17, stream, (uint64_t)k) - 1);
}

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

static ms_placements parse_pl(mb *b, const char *text) {
    ms_placements pl;
    ms_error err = {0};
    if (!MT_OK(b->r, ms_placements_parse(text, &pl, &err), &err)) b->failed = true;
    return pl;
}

/* A DistTensor of the global values in placements pl. */
static int eager_leaf(mb *b, const ms_shape *s, const float *full, const char *pl, bool watch) {
    ms_error err = {0};
    ms_tensor t;
    ms_tensor_wrap((void *)full, MS_F32, s->ndim, s->d, &t, &err);
    ms_placements p = parse_pl(b, pl);
    int id = b->nv++;
    b->owned[id] = true;
    if (!MT_OK(b->r, ms_dtensor_shard(b->dm, &t, &p, &b->v[id], &err), &err)) b->failed = true;
    ms_tensor_release(&t);
    if (watch && !MT_OK(b->r, ms_tape_watch(b->tape, &b->v[id], &err), &err)) b->failed = true;
    return id;
}

/* A parameter initialised from Philox (stream = its index); every mode and mesh starts from
 * the same values. */
static int mb_param(mb *b, const char *name, int ndim, const int64_t *shape, const char *pl,
                    float scale) {
    ms_shape s = {.ndim = ndim};
    memcpy(s.d, shape, sizeof(int64_t) * (size_t)ndim);
    int k = b->param_seen++;
    if (b->g) {
        int v = ms_graph_param(b->g, name, ndim, shape, (ms_init){MS_INIT_CONST, 0});
        ms_placements p = parse_pl(b, pl);
        ms_graph_annotate(b->g, v, &p);
        leaf_data *d = &b->in_data[v];
        d->shape = s;
        d->full = malloc(sizeof(float) * (size_t)numel(&s));
        fill(d->full, numel(&s), 100 + (uint64_t)k, scale);
        return v;
    }
    if (k == b->np) { /* first step: make it */
        float *full = malloc(sizeof(float) * (size_t)numel(&s));
        fill(full, numel(&s), 100 + (uint64_t)k, scale);
        int id = eager_leaf(b, &s, full, pl, false);
        free(full);
        b->params[b->np++] = b->v[id];
        b->owned[id] = false;
        b->nv--;
    }
    int id = b->nv++;
    b->v[id] = b->params[k];
    b->owned[id] = false;
    ms_error err = {0};
    if (!MT_OK(b->r, ms_tape_watch(b->tape, &b->v[id], &err), &err)) b->failed = true;
    return id;
}

/* An input with Philox values for this step (classes > 0: integer targets in [0, classes)). */
static int mb_input(mb *b, const char *name, int ndim, const int64_t *shape, const char *pl,
                    int classes) {
    ms_shape s = {.ndim = ndim};
    memcpy(s.d, shape, sizeof(int64_t) * (size_t)ndim);
    float *full = malloc(sizeof(float) * (size_t)numel(&s));
    uint64_t stream = 1000 + 10 * (uint64_t)b->step + (uint64_t)(name[0]);
    fill(full, numel(&s), stream, 1.0f);
    if (classes)
        for (int64_t k = 0; k < numel(&s); k++)
            full[k] = (float)(int)((full[k] + 1) * 0.5f * (float)classes * 0.999f);
    if (b->g) {
        int v = ms_graph_input(b->g, name, ndim, shape);
        ms_placements p = parse_pl(b, pl);
        ms_graph_annotate(b->g, v, &p);
        b->in_data[v] = (leaf_data){.shape = s, .full = full};
        return v;
    }
    int id = eager_leaf(b, &s, full, pl, false);
    free(full);
    return id;
}

static int mb_op(mb *b, int op, const ms_op_attrs *a, int n_in, const int *in, const char *name) {
    if (b->g) return ms_graph_op(b->g, op, a, n_in, in, name);
    if (b->failed || b->nv >= MAXV) return 0;
    const ms_dtensor *x[MS_OP_MAX_IN];
    for (int i = 0; i < n_in; i++) x[i] = &b->v[in[i]];
    ms_eager_opts eo = {.allow_reshard = true};
    ms_error err = {0};
    int id = b->nv;
    if (!MT_OK(b->r, ms_tape_op(b->tape, op, a, n_in, x, 1, &b->v[id], &eo, &err), &err)) {
        b->failed = true;
        return 0;
    }
    b->owned[b->nv++] = true;
    return id;
}

/* The intermediate values of one eager step. */
static void mb_release_step(mb *b) {
    for (int i = 0; i < b->nv; i++)
        if (b->owned[i]) ms_dtensor_release(&b->v[i]);
    b->nv = 0;
    b->param_seen = 0;
}

/* --- models -------------------------------------------------------------------------------- */

/* A placement choice: each parameter's and input's placements over the mesh dims. */
typedef struct strategy {
    const char *mesh;
    const char *x, *w1, *b1, *w2, *b2, *ln;
} strategy;

typedef int (*model_fn)(mb *b, const strategy *s);

enum { BATCH = 8, DIM = 12, HID = 16, CLASSES = 10 };

/* loss = mean(xent(gelu(ln(x) @ W1 + b1) @ W2 + b2, targets)) */
static int mlp(mb *b, const strategy *s) {
    const int64_t xs[2] = {BATCH, DIM}, ts[1] = {BATCH}, cs[1] = {DIM};
    const int64_t w1s[2] = {DIM, HID}, b1s[1] = {HID}, w2s[2] = {HID, CLASSES}, b2s[1] = {CLASSES};
    int lw = mb_param(b, "ln.weight", 1, cs, s->ln, 0.3f);
    int lb = mb_param(b, "ln.bias", 1, cs, s->ln, 0.1f);
    int w1 = mb_param(b, "w1", 2, w1s, s->w1, 0.4f);
    int b1 = mb_param(b, "b1", 1, b1s, s->b1, 0.1f);
    int w2 = mb_param(b, "w2", 2, w2s, s->w2, 0.4f);
    int b2 = mb_param(b, "b2", 1, b2s, s->b2, 0.1f);
    int x = mb_input(b, "x", 2, xs, s->x, 0);
    int tg = mb_input(b, "targets", 1, ts, s->x, CLASSES);
    ms_op_attrs eps = {.f = {1e-5f}}, all = {.i = {-1}};
    int h = mb_op(b, MS_OP_LAYERNORM, &eps, 3, (int[]){x, lw, lb}, "ln");
    h = mb_op(b, MS_OP_MATMUL, NULL, 2, (int[]){h, w1}, "fc1");
    h = mb_op(b, MS_OP_BIAS, NULL, 2, (int[]){h, b1}, "fc1.bias");
    h = mb_op(b, MS_OP_GELU, NULL, 1, &h, "gelu");
    h = mb_op(b, MS_OP_MATMUL, NULL, 2, (int[]){h, w2}, "fc2");
    h = mb_op(b, MS_OP_BIAS, NULL, 2, (int[]){h, b2}, "logits");
    h = mb_op(b, MS_OP_XENT, NULL, 2, (int[]){h, tg}, "losses");
    return mb_op(b, MS_OP_MEAN, &all, 1, &h, "loss");
}

/* mean(y * r) for a random r, so that every element's gradient differs. */
static int weighted_mean(mb *b, int y, int ndim, const int64_t *shape, const char *pl) {
    ms_op_attrs all = {.i = {-1}};
    int r = mb_input(b, "r", ndim, shape, pl, 0);
    int p = mb_op(b, MS_OP_MUL, NULL, 2, (int[]){y, r}, "weighted");
    return mb_op(b, MS_OP_MEAN, &all, 1, &p, "loss");
}

/* h = x @ W; y = h + gelu(h): h's gradient arrives twice (from add and from gelu). */
static int matmul_twice(mb *b, const strategy *s) {
    const int64_t xs[2] = {6, 8}, ws[2] = {8, 10}, ys[2] = {6, 10};
    int w = mb_param(b, "w", 2, ws, s->w1, 0.5f);
    int x = mb_param(b, "x", 2, xs, s->x, 1.0f);
    int h = mb_op(b, MS_OP_MATMUL, NULL, 2, (int[]){x, w}, "h");
    int g = mb_op(b, MS_OP_GELU, NULL, 1, &h, "g");
    int y = mb_op(b, MS_OP_ADD, NULL, 2, (int[]){h, g}, "y");
    return weighted_mean(b, y, 2, ys, s->b2);
}

static int layernorm_only(mb *b, const strategy *s) {
    const int64_t xs[2] = {6, 8}, cs[1] = {8};
    int x = mb_param(b, "x", 2, xs, s->x, 1.0f);
    int w = mb_param(b, "w", 1, cs, s->ln, 0.5f);
    int bias = mb_param(b, "b", 1, cs, s->ln, 0.5f);
    ms_op_attrs eps = {.f = {1e-5f}};
    int y = mb_op(b, MS_OP_LAYERNORM, &eps, 3, (int[]){x, w, bias}, "y");
    return weighted_mean(b, y, 2, xs, s->x);
}

/* qkv [B, T, 3, C] -> [B, T, C], causal, 2 heads. */
static int attention_only(mb *b, const strategy *s) {
    const int64_t qs[4] = {2, 4, 3, 8}, ys[3] = {2, 4, 8};
    int q = mb_param(b, "qkv", 4, qs, s->x, 1.0f);
    ms_op_attrs a = {.i = {2, 1}};
    int y = mb_op(b, MS_OP_ATTENTION, &a, 1, &q, "y");
    return weighted_mean(b, y, 3, ys, s->b2);
}

/* --- running a model ------------------------------------------------------------------------ */

typedef struct result {
    float loss[MAXSTEPS];
    int np;
    char name[MAXP][32];
    int64_t n[MAXP];
    float *param[MAXP]; /* final values (or gradients: grads_only) */
} result;

static void result_free(result *res) {
    for (int i = 0; i < res->np; i++) free(res->param[i]);
    memset(res, 0, sizeof *res);
}

typedef struct run_spec {
    model_fn model;
    strategy s;
    int steps;       /* 0: one forward + backward, gradients into the result */
    bool graph_mode; /* else eager */
    ms_device_kind device;
    result out;
} run_spec;

static const ms_adamw_opts adamw = {
    .lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

/* Rank 0 keeps the full value of t in res slot i. */
static void keep_full(mt_rank *r, const ms_dtensor *t, const char *name, result *res, int i) {
    ms_error err = {0};
    ms_tensor full;
    if (!MT_OK(r, ms_dtensor_full(t, &full, &err), &err)) return;
    if (r->ctx->rank == 0) {
        res->n[i] = ms_tensor_numel(&full);
        res->param[i] = malloc(sizeof(float) * (size_t)res->n[i]);
        memcpy(res->param[i], ms_tensor_f32(&full), sizeof(float) * (size_t)res->n[i]);
        snprintf(res->name[i], sizeof res->name[i], "%s", name);
        if (i >= res->np) res->np = i + 1;
    }
    ms_tensor_release(&full);
}

static float scalar_of(mt_rank *r, const ms_dtensor *t) {
    ms_error err = {0};
    ms_tensor full;
    if (!MT_OK(r, ms_dtensor_full(t, &full, &err), &err) || !full.storage) return NAN;
    float x = ms_tensor_f32(&full)[0];
    ms_tensor_release(&full);
    return x;
}

static void eager_run(mt_rank *r, ms_dmesh *dm, run_spec *rs) {
    mb b = {.r = r, .dm = dm, .tape = ms_tape_create()};
    ms_eager_adamw *opt = ms_eager_adamw_create();
    ms_error err = {0};
    int steps = rs->steps ? rs->steps : 1;
    for (int step = 0; step < steps && !b.failed; step++) {
        b.step = step;
        int loss = rs->model(&b, &rs->s);
        if (b.failed) break;
        float l = scalar_of(r, &b.v[loss]); /* collective: every rank */
        if (r->ctx->rank == 0) rs->out.loss[step] = l;
        if (!MT_OK(r, ms_tape_backward(b.tape, &b.v[loss], &err), &err)) b.failed = true;
        if (!rs->steps && ms_dmesh_is_member(dm)) {
            for (int i = 0; i < b.np && !b.failed; i++) {
                const ms_dtensor *g = ms_tape_grad(b.tape, &b.params[i]);
                MT_CHECK(r, g && ms_placements_eq(&g->pl, &b.params[i].pl),
                         "gradient %d missing or not in its parameter's placements", i);
                if (g) keep_full(r, g, "grad", &rs->out, i);
            }
        } else if (!b.failed) {
            ms_dtensor *ps[MAXP];
            bool decay[MAXP];
            for (int i = 0; i < b.np; i++) ps[i] = &b.params[i], decay[i] = b.params[i].ndim > 1;
            if (!MT_OK(r, ms_eager_adamw_step(opt, b.tape, b.np, ps, decay, &adamw, &err), &err))
                b.failed = true;
        }
        ms_tape_clear(b.tape);
        mb_release_step(&b);
    }
    if (rs->steps)
        for (int i = 0; i < b.np; i++) keep_full(r, &b.params[i], "param", &rs->out, i);
    for (int i = 0; i < b.np; i++) ms_dtensor_release(&b.params[i]);
    mb_release_step(&b);
    ms_eager_adamw_destroy(opt);
    ms_tape_destroy(b.tape);
}

/* Graph mode: AdamW on each parameter's local view, as the trainer does without ZeRO. */
static void graph_adamw(mt_rank *r, ms_program *p, float **m, float **v, int64_t t) {
    ms_error err = {0};
    for (int i = 0; i < ms_program_num_params(p); i++) {
        ms_param_view pv;
        ms_program_param(p, i, &pv);
        size_t n = (size_t)ms_tensor_numel(&pv.data);
        if (!m[i]) m[i] = calloc(n, sizeof(float)), v[i] = calloc(n, sizeof(float));
        ms_adamw_opts o = adamw;
        if (pv.gshape.ndim < 2) o.weight_decay = 0;
        MT_OK(r,
              ms_adamw_step(ms_tensor_f32(&pv.data), ms_tensor_f32(&pv.grad), m[i], v[i], n, &o, t,
                            &err),
              &err);
    }
}

static void graph_keep(mt_rank *r, ms_dmesh *dm, ms_program *p, run_spec *rs) {
    for (int i = 0; i < ms_program_num_params(p); i++) {
        ms_param_view pv;
        ms_program_param(p, i, &pv);
        ms_dtensor t = {.ndim = pv.gshape.ndim, .mesh = dm, .pl = pv.pl};
        t.local = rs->steps ? pv.data : pv.grad;
        memcpy(t.gshape, pv.gshape.d, sizeof t.gshape);
        keep_full(r, &t, pv.name, &rs->out, i);
    }
}

/* The step's inputs: the model built again on a scratch graph (same value ids) fills
 * in_data with this step's feeds. */
static void graph_feed(mt_rank *r, ms_program *p, mb *b, const run_spec *rs) {
    ms_error err = {0};
    mb scratch = {.r = r, .dm = b->dm, .step = b->step, .g = ms_graph_create()};
    rs->model(&scratch, &rs->s);
    for (int val = 0; val < ms_graph_num_values(scratch.g); val++)
        if (scratch.in_data[val].full && !ms_graph_is_param(scratch.g, val))
            MT_OK(r, ms_program_feed(p, val, scratch.in_data[val].full, &err), &err);
    for (int val = 0; val < MAXV; val++) free(scratch.in_data[val].full);
    ms_graph_destroy(scratch.g);
}

static void graph_run(mt_rank *r, ms_dmesh *dm, run_spec *rs) {
    ms_error err = {0};
    mb b = {.r = r, .dm = dm, .g = ms_graph_create()};
    int loss = rs->model(&b, &rs->s);
    ms_graph_set_loss(b.g, loss);
    ms_program *p = NULL;
    ms_compile_opts co = {.seed = 5};
    bool ok = MT_OK(r, ms_program_compile(b.g, dm, &co, &p, &err), &err);
    for (int i = 0; ok && i < ms_program_num_params(p); i++) {
        ms_param_view pv;
        ms_program_param(p, i, &pv);
        ok = MT_OK(r, ms_program_load_param(p, i, b.in_data[pv.value].full, &err), &err);
    }
    float *m[MAXP] = {0}, *v[MAXP] = {0};
    int steps = rs->steps ? rs->steps : 1;
    for (int step = 0; step < steps && ok; step++) {
        b.step = step;
        graph_feed(r, p, &b, rs);
        float l = NAN;
        ok = MT_OK(r, ms_program_step(p, &l, &err), &err);
        if (r->ctx->rank == 0) rs->out.loss[step] = l;
        if (ok && rs->steps) graph_adamw(r, p, m, v, step + 1);
    }
    if (ok) graph_keep(r, dm, p, rs);
    for (int i = 0; i < MAXP; i++) free(m[i]), free(v[i]);
    for (int val = 0; val < MAXV; val++) free(b.in_data[val].full);
    ms_program_destroy(p);
    ms_graph_destroy(b.g);
}

static void run_body(mt_rank *r, void *arg) {
    run_spec *rs = arg;
    ms_error err = {0};
    ms_mesh mesh;
    if (!MT_OK(r, ms_mesh_parse(&mesh, rs->s.mesh, &err), &err)) return;
    ms_dmesh *dm;
    if (MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) {
        if (rs->graph_mode)
            graph_run(r, dm, rs);
        else
            eager_run(r, dm, rs);
        ms_dmesh_destroy(dm);
    }
    ms_mesh_free(&mesh);
}

static int mesh_ranks(const char *mesh) {
    int n = 1;
    for (const char *c = mesh; *c; c++)
        if (*c >= '1' && *c <= '9') n *= *c - '0';
    return n;
}

static run_spec run_model(model_fn model, const strategy *s, int steps, bool graph_mode) {
    run_spec rs = {.model = model, .s = *s, .steps = steps, .graph_mode = graph_mode};
    mt_run(mesh_ranks(s->mesh), run_body, &rs);
    return rs;
}

/* Eager mode with every rank's tensors on `device` (thread ranks). */
static run_spec run_eager_on(model_fn model, const strategy *s, int steps, ms_device_kind device) {
    run_spec rs = {.model = model, .s = *s, .steps = steps, .device = device};
    mt_run_device(mesh_ranks(s->mesh), device, run_body, &rs);
    return rs;
}

/* ||x - ref|| / ||ref|| over each tensor, and each loss, within 1e-5. */
static void compare(const result *x, const result *ref, int steps, const char *what) {
    if (mt_world_rank() != 0) return;
    for (int k = 0; k < steps; k++)
        if (!(fabsf(x->loss[k] - ref->loss[k]) <= 1e-5f * fabsf(ref->loss[k])))
            fail_msg("%s: loss at step %d is %.9g, the reference %.9g", what, k, x->loss[k],
                     ref->loss[k]);
    assert_int_equal(x->np, ref->np);
    assert_true(ref->np > 0);
    for (int i = 0; i < ref->np; i++) {
        assert_int_equal(x->n[i], ref->n[i]);
        double d = 0, nr = 0;
        for (int64_t k = 0; k < ref->n[i]; k++) {
            double e = (double)x->param[i][k] - ref->param[i][k];
            d += e * e, nr += (double)ref->param[i][k] * ref->param[i][k];
        }
        if (!(nr > 0 && sqrt(d / nr) <= 1e-5))
            fail_msg("%s: tensor %d (%s) differs by %.3g relative (norm %.3g)", what, i,
                     ref->name[i], sqrt(d / (nr > 0 ? nr : 1)), sqrt(nr));
    }
}

/* --- (b) single ops: eager gradients equal graph mode's ----------------------------------- */

typedef struct op_case {
    const char *what;
    model_fn model;
    strategy s;
} op_case;

static const op_case op_cases[] = {
    {"matmul twice, W column-parallel",
     matmul_twice,
     {.mesh = "2", .x = "[R]", .w1 = "[S(1)]", .b2 = "[R]"}},
    {"matmul twice, W row-parallel",
     matmul_twice,
     {.mesh = "2", .x = "[S(1)]", .w1 = "[S(0)]", .b2 = "[S(0)]"}},
    {"matmul twice, dp x tp",
     matmul_twice,
     {.mesh = "2x2", .x = "[S(0), R]", .w1 = "[R, S(1)]", .b2 = "[S(0), S(1)]"}},
    {"layernorm, rows sharded", layernorm_only, {.mesh = "2", .x = "[S(0)]", .ln = "[R]"}},
    {"layernorm, dp x channels",
     layernorm_only,
     {.mesh = "2x2", .x = "[S(0), S(1)]", .ln = "[R, S(0)]"}},
    {"attention, heads sharded", attention_only, {.mesh = "2", .x = "[S(3)]", .b2 = "[S(2)]"}},
    {"attention, batch x heads",
     attention_only,
     {.mesh = "2x2", .x = "[S(0), S(3)]", .b2 = "[S(0), R]"}},
};

static void single_op_grads(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof op_cases / sizeof op_cases[0]; c++) {
        const op_case *oc = &op_cases[c];
        run_spec e = run_model(oc->model, &oc->s, 0, false);
        run_spec g = run_model(oc->model, &oc->s, 0, true);
        compare(&e.out, &g.out, 1, oc->what);
        result_free(&e.out), result_free(&g.out);
    }
}

/* --- (a) the training loop: eager = graph mode = one rank ---------------------------------- */

/* mesh, x (and targets), w1, b1, w2, b2, layer norm */
static const strategy train_cases[] = {
    {"1", "[S(0)]", "[R]", "[R]", "[R]", "[R]", "[R]"},
    {"2", "[S(0)]", "[R]", "[R]", "[R]", "[R]", "[R]"}, /* dp */
    /* tp, Megatron: W1 column-, W2 row-parallel */
    {"2", "[R]", "[S(1)]", "[S(0)]", "[S(0)]", "[R]", "[R]"},
    {"2x2", "[S(0), R]", "[R, S(1)]", "[R, S(0)]", "[R, S(0)]", "[R, R]", "[R, R]"}, /* dp x tp */
    /* dp x tp with a vocab-parallel head: W2 column-parallel, the logits sharded over classes */
    {"2x2", "[S(0), R]", "[R, S(0)]", "[R, R]", "[R, S(1)]", "[R, S(0)]", "[R, R]"},
};

enum { TRAIN_STEPS = 4 };

static void train_matches_graph_and_one_rank(void **state) {
    (void)state;
    run_spec one = run_model(mlp, &train_cases[0], TRAIN_STEPS, false);
    for (size_t c = 0; c < sizeof train_cases / sizeof train_cases[0]; c++) {
        const strategy *s = &train_cases[c];
        char what[160];
        snprintf(what, sizeof what, "mesh %s, x %s, w1 %s, w2 %s", s->mesh, s->x, s->w1, s->w2);
        run_spec e = run_model(mlp, s, TRAIN_STEPS, false);
        run_spec g = run_model(mlp, s, TRAIN_STEPS, true);
        compare(&e.out, &g.out, TRAIN_STEPS, what);
        compare(&e.out, &one.out, TRAIN_STEPS, what);
        if (mt_world_rank() == 0)
            assert_true(e.out.loss[TRAIN_STEPS - 1] < e.out.loss[0]); /* it learns */
        result_free(&e.out), result_free(&g.out);
    }
    result_free(&one.out);
}

/* --- (a') the training loop on the fenced device: every kernel through the device's table ---
 * The fenced device faults on any host access to its memory, so the tape, the operators and
 * the optimizer must run through the device's kernels and copies; its kernels are the CPU's,
 * so the losses and parameters must equal the CPU device's bit for bit. */

static void same_bits(const result *x, const result *ref, int steps, const char *what) {
    if (mt_world_rank() != 0) return;
    for (int k = 0; k < steps; k++)
        if (memcmp(&x->loss[k], &ref->loss[k], sizeof(float)))
            fail_msg("%s: fenced loss at step %d is %.9g, the CPU's %.9g", what, k, x->loss[k],
                     ref->loss[k]);
    assert_int_equal(x->np, ref->np);
    assert_true(ref->np > 0);
    for (int i = 0; i < ref->np; i++) {
        assert_int_equal(x->n[i], ref->n[i]);
        if (memcmp(x->param[i], ref->param[i], sizeof(float) * (size_t)ref->n[i]))
            fail_msg("%s: fenced parameter %d (%s) differs from the CPU's", what, i, ref->name[i]);
    }
}

static void train_on_fenced_device(void **state) {
    (void)state;
    const strategy *cases[] = {&train_cases[0], &train_cases[3]}; /* 1 rank; dp2 x tp2 */
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char what[160];
        snprintf(what, sizeof what, "mesh %s, x %s, w1 %s", cases[c]->mesh, cases[c]->x,
                 cases[c]->w1);
        run_spec cpu = run_eager_on(mlp, cases[c], TRAIN_STEPS, MS_DEVICE_CPU);
        run_spec fen = run_eager_on(mlp, cases[c], TRAIN_STEPS, MS_DEVICE_FENCED);
        same_bits(&fen.out, &cpu.out, TRAIN_STEPS, what);
        if (mt_world_rank() == 0) assert_true(cpu.out.loss[TRAIN_STEPS - 1] < cpu.out.loss[0]);
        result_free(&cpu.out), result_free(&fen.out);
    }
}

/* --- (c) bad use gets clear errors --------------------------------------------------------- */

static void expect_error(mt_rank *r, ms_status st, const ms_error *err, const char *want) {
    MT_CHECK(r, st == MS_ERR_INVALID && strstr(err->msg, want),
             "expected an error with \"%s\", got status %d: %s", want, (int)st, err->msg);
}

static void errors_body(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_mesh m2, m1;
    ms_mesh_parse(&m2, "2", &err);
    ms_mesh_parse(&m1, "1", &err);
    ms_dmesh *d2, *d1;
    MT_OK(r, ms_dmesh_create(r->ctx, &m2, &d2, &err), &err);
    MT_OK(r, ms_dmesh_create(r->ctx, &m1, &d1, &err), &err);
    strategy s = {.x = "[S(0)]", .w1 = "[S(1)]", .b2 = "[R]"};
    mb b = {.r = r, .dm = d2, .tape = ms_tape_create()};
    int loss = matmul_twice(&b, &s);
    int y = loss - 2; /* the matrix before the weighting: not a scalar */
    ms_status st = ms_tape_backward(b.tape, &b.v[y], &err);
    expect_error(r, st, &err, "the loss must be a scalar");
    MT_OK(r, ms_tape_backward(b.tape, &b.v[loss], &err), &err);
    st = ms_tape_backward(b.tape, &b.v[loss], &err);
    expect_error(r, st, &err, "backward already ran");
    st = ms_tape_op(b.tape, MS_OP_GELU, NULL, 1, (const ms_dtensor *[]){&b.v[y]}, 1,
                    &(ms_dtensor){0}, NULL, &err);
    expect_error(r, st, &err, "ms_tape_clear");
    ms_tape_clear(b.tape);
    /* a tensor on another mesh than the tape's */
    MT_OK(r, ms_tape_watch(b.tape, &b.params[0], &err), &err);
    const int64_t one[1] = {4};
    float vals[4] = {1, 2, 3, 4};
    ms_tensor t;
    ms_tensor_wrap(vals, MS_F32, 1, one, &t, &err);
    ms_placements rep = ms_placements_replicated(1);
    ms_dtensor other;
    MT_OK(r, ms_dtensor_shard(d1, &t, &rep, &other, &err), &err);
    st = ms_tape_watch(b.tape, &other, &err);
    expect_error(r, st, &err, "use one tape per mesh");
    st = ms_tape_backward(b.tape, &other, &err);
    expect_error(r, st, &err, "use one tape per mesh");
    /* a loss the tape never recorded */
    ms_tape_clear(b.tape);
    ms_op_attrs all = {.i = {-1}};
    ms_dtensor l;
    MT_OK(
        r,
        ms_tape_op(b.tape, MS_OP_MEAN, &all, 1, (const ms_dtensor *[]){&other}, 1, &l, NULL, &err),
        &err);
    if (ms_dmesh_is_member(d1)) {
        st = ms_tape_backward(b.tape, &l, &err);
        expect_error(r, st, &err, "not recorded on this tape");
    }
    /* a partial leaf */
    ms_tape_clear(b.tape);
    ms_placements part;
    ms_placements_parse("[P(sum)]", &part, &err);
    ms_dtensor pt;
    MT_OK(r, ms_dtensor_shard(d2, &t, &part, &pt, &err), &err);
    st = ms_tape_watch(b.tape, &pt, &err);
    expect_error(r, st, &err, "replicated or sharded");
    ms_dtensor_release(&pt), ms_dtensor_release(&l), ms_dtensor_release(&other);
    ms_tensor_release(&t);
    for (int i = 0; i < b.np; i++) ms_dtensor_release(&b.params[i]);
    mb_release_step(&b);
    ms_tape_destroy(b.tape);
    ms_dmesh_destroy(d1), ms_dmesh_destroy(d2);
    ms_mesh_free(&m1), ms_mesh_free(&m2);
}

static void bad_use_errors(void **state) {
    (void)state;
    mt_run(2, errors_body, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(bad_use_errors),
    cmocka_unit_test(single_op_grads),
    cmocka_unit_test(train_matches_graph_and_one_rank),
    cmocka_unit_test(train_on_fenced_device),
};
MT_MAIN("eager_train", tests)

/* test_batch_norm.c - batch normalisation (ms_graph_batch_norm) and buffers (ms_graph_buffer).
 *
 * The graph: y = batch_norm(x) on x [N, C, H, W], loss = sum(y * r). One rank's forward,
 * gradients (of x, weight and bias) and running statistics are checked against a float64
 * reference written here (itself checked against central differences), and evaluation against
 * the reference computed from the running statistics. Under dp2 and dp4 (x split over the
 * batch) the outputs, gradients and running statistics equal one rank's on the same global
 * batch: the statistics are the global batch's (SyncBN), not each rank's.
 *
 * The trainer: a residual MLP whose blocks are h + W2 gelu(bn(W1 h)) (BatchNorm1d over
 * [rows, HID]) trains under dp2, tp2, pp2, ZeRO 3 equal to one rank, running statistics
 * included (they are state tensors, MS_STATE_BUFFER); a save under dp2 resumed under tp2 and a
 * live switch carry them; evaluation (running statistics) equals one rank's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/dist/dtensor.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "tests/testkit.h"

/* --- the graph against a float64 reference --------------------------------------------------- */

enum { GN = 8, GC = 3, GH = 2, GW = 3, GSP = GH * GW, GX = GN * GC * GSP };
#define EPS 1e-5f
#define MOM 0.1f

typedef struct bn_case {
    float x[GX], r[GX];     /* input and the loss's weights (dy) */
    float w[GC], b[GC];     /* parameters */
    float rm0[GC], rv0[GC]; /* running statistics before the step */
} bn_case;

typedef struct bn_out {
    float y[GX], dx[GX], dw[GC], db[GC], rm[GC], rv[GC], y_eval[GX], loss;
    float rm_after_eval[GC];
} bn_out;

static bn_case make_case(void) {
    bn_case c;
    for (int i = 0; i < GX; i++) {
        int ch = i / GSP % GC;
        c.x[i] = (float)(ms_philox_normal(5, 1, (uint64_t)i) * (1 + ch) + 0.5 * ch - 0.3);
        c.r[i] = (float)ms_philox_normal(5, 2, (uint64_t)i);
    }
    for (int k = 0; k < GC; k++) {
        c.w[k] = 0.5f + 0.3f * (float)k;
        c.b[k] = -0.2f + 0.1f * (float)k;
        c.rm0[k] = 0.05f * (float)k;
        c.rv0[k] = 1.0f + 0.5f * (float)k;
    }
    return c;
}

/* The reference in float64: the loss, and optionally y, the gradients, the running statistics
 * after the step and the evaluation output from them. */
typedef struct bn_ref {
    double y[GX], dx[GX], dw[GC], db[GC], rm[GC], rv[GC], y_eval[GX], loss;
} bn_ref;

static void reference(const bn_case *c, const double *x, bn_ref *o) {
    const double n = GN * GSP;
    o->loss = 0;
    for (int k = 0; k < GC; k++) {
        double mean = 0, var = 0, sdy = 0, sdyx = 0;
        for (int i = 0; i < GN; i++)
            for (int s = 0; s < GSP; s++) mean += x[(i * GC + k) * GSP + s];
        mean /= n;
        for (int i = 0; i < GN; i++)
            for (int s = 0; s < GSP; s++) {
                double d = x[(i * GC + k) * GSP + s] - mean;
                var += d * d;
            }
        var /= n;
        double inv = 1 / sqrt(var + EPS);
        for (int i = 0; i < GN; i++)
            for (int s = 0; s < GSP; s++) {
                int j = (i * GC + k) * GSP + s;
                double xh = (x[j] - mean) * inv;
                o->y[j] = xh * c->w[k] + c->b[k];
                o->loss += o->y[j] * c->r[j];
                sdy += c->r[j];
                sdyx += c->r[j] * xh;
            }
        o->dw[k] = sdyx;
        o->db[k] = sdy;
        for (int i = 0; i < GN; i++)
            for (int s = 0; s < GSP; s++) {
                int j = (i * GC + k) * GSP + s;
                double xh = (x[j] - mean) * inv;
                o->dx[j] = c->w[k] * inv / n * (n * c->r[j] - sdy - xh * sdyx);
            }
        o->rm[k] = (1 - MOM) * c->rm0[k] + MOM * mean;
        o->rv[k] = (1 - MOM) * c->rv0[k] + MOM * var * n / (n - 1);
        for (int i = 0; i < GN; i++)
            for (int s = 0; s < GSP; s++) {
                int j = (i * GC + k) * GSP + s;
                o->y_eval[j] = (x[j] - o->rm[k]) / sqrt(o->rv[k] + EPS) * c->w[k] + c->b[k];
            }
    }
}

typedef struct graph_arg {
    int n; /* ranks: dp */
    const bn_case *c;
    bn_out *out;
} graph_arg;

static int find_param(ms_program *p, const char *name) {
    for (int i = 0; i < ms_program_num_params(p); i++) {
        ms_param_view v;
        ms_program_param(p, i, &v);
        if (!strcmp(v.name, name)) return i;
    }
    return -1;
}

static int find_buffer(ms_program *p, const char *name) {
    for (int i = 0; i < ms_program_num_buffers(p); i++) {
        ms_buffer_view v;
        ms_program_buffer(p, i, &v);
        if (!strcmp(v.name, name)) return i;
    }
    return -1;
}

static void copy_buffer(ms_program *p, const char *name, float *out) {
    ms_buffer_view v;
    ms_program_buffer(p, find_buffer(p, name), &v);
    memcpy(out, ms_tensor_f32(&v.data), sizeof(float) * GC); /* replicated: the whole */
}

static void graph_rank(mt_rank *r, void *arg) {
    graph_arg *a = arg;
    ms_error err = {0};
    ms_graph *g = ms_graph_create();
    const int64_t xs[4] = {GN, GC, GH, GW};
    int x = ms_graph_input(g, "x", 4, xs), rr = ms_graph_input(g, "r", 4, xs);
    ms_graph_input_grad(g, x);
    int y = ms_graph_batch_norm(g, x, "bn", GC, EPS, MOM);
    ms_graph_keep(g, y);
    const int mi[2] = {y, rr};
    int prod = ms_graph_op(g, MS_OP_MUL, NULL, 2, mi, "prod");
    ms_op_attrs all = {.i = {-1}};
    int loss = ms_graph_op(g, MS_OP_SUM, &all, 1, &prod, "loss");
    ms_graph_set_loss(g, loss);
    ms_placements s0;
    MT_OK(r, ms_placements_parse("[S(0)]", &s0, &err), &err);
    ms_graph_annotate(g, x, &s0);
    ms_graph_annotate(g, rr, &s0);
    ms_mesh mesh;
    ms_dmesh *dm = NULL;
    ms_program *p = NULL;
    if (!MT_OK(r, ms_mesh_init(&mesh, 1, (int[]){a->n}, (const char *[]){"dp"}, NULL, &err), &err))
        return;
    if (MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err) &&
        MT_OK(r, ms_program_compile(g, dm, &(ms_compile_opts){.seed = 1}, &p, &err), &err)) {
        const bn_case *c = a->c;
        MT_CHECK(r, ms_program_num_buffers(p) == 2, "%d buffers", ms_program_num_buffers(p));
        MT_CHECK(r, ms_program_num_params(p) == 2, "%d parameters", ms_program_num_params(p));
        MT_OK(r, ms_program_load_param(p, find_param(p, "bn.weight"), c->w, &err), &err);
        MT_OK(r, ms_program_load_param(p, find_param(p, "bn.bias"), c->b, &err), &err);
        MT_OK(r, ms_program_load_buffer(p, find_buffer(p, "bn.running_mean"), c->rm0, &err), &err);
        MT_OK(r, ms_program_load_buffer(p, find_buffer(p, "bn.running_var"), c->rv0, &err), &err);
        MT_OK(r, ms_program_feed(p, x, c->x, &err), &err);
        MT_OK(r, ms_program_feed(p, rr, c->r, &err), &err);
        float l = 0;
        MT_OK(r, ms_program_step(p, &l, &err), &err);
        ms_tensor full = {0};
        if (MT_OK(r, ms_program_value(p, y, &full, &err), &err) && r->ctx->rank == 0)
            memcpy(a->out->y, ms_tensor_f32(&full), sizeof a->out->y);
        ms_tensor_release(&full);
        /* dx: this rank's rows of the batch */
        ms_tensor *dx = ms_program_input_grad(p, x);
        int64_t rows = GN / a->n, per = GX / GN;
        memcpy(a->out->dx + (size_t)(r->ctx->rank * rows * per), ms_tensor_f32(dx),
               sizeof(float) * (size_t)(rows * per));
        if (r->ctx->rank == 0) {
            a->out->loss = l;
            ms_param_view pv;
            ms_program_param(p, find_param(p, "bn.weight"), &pv);
            memcpy(a->out->dw, ms_tensor_f32(&pv.grad), sizeof a->out->dw);
            ms_program_param(p, find_param(p, "bn.bias"), &pv);
            memcpy(a->out->db, ms_tensor_f32(&pv.grad), sizeof a->out->db);
            copy_buffer(p, "bn.running_mean", a->out->rm);
            copy_buffer(p, "bn.running_var", a->out->rv);
        }
        /* evaluation: the running statistics, which it leaves alone */
        ms_program_set_dropout(p, false, 0);
        MT_OK(r, ms_program_forward(p, &l, &err), &err);
        if (MT_OK(r, ms_program_value(p, y, &full, &err), &err) && r->ctx->rank == 0)
            memcpy(a->out->y_eval, ms_tensor_f32(&full), sizeof a->out->y_eval);
        ms_tensor_release(&full);
        if (r->ctx->rank == 0) copy_buffer(p, "bn.running_mean", a->out->rm_after_eval);
    }
    ms_program_destroy(p);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    ms_graph_destroy(g);
}

/* max |a - b| <= tol * max |b| (+ a floor for values that are all near zero) */
static void near_f(const char *what, const float *a, const double *b, int n, double tol) {
    double scale = 0, diff = 0;
    for (int i = 0; i < n; i++) {
        scale = fmax(scale, fabs(b[i]));
        diff = fmax(diff, fabs(a[i] - b[i]));
    }
    if (!(diff <= tol * fmax(scale, 1e-3)))
        fail_msg("%s: off by %g at scale %g", what, diff, scale);
}

static void near_ff(const char *what, const float *a, const float *b, int n, double tol) {
    double *bd = xmalloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) bd[i] = b[i];
    near_f(what, a, bd, n, tol);
    free(bd);
}

static void run_graph(int n, const bn_case *c, bn_out *out) {
    graph_arg a = {.n = n, .c = c, .out = out};
    memset(out, 0, sizeof *out);
    mt_run_threads(n, graph_rank, &a);
}

static void forward_backward_match_float64(void **state) {
    (void)state;
    bn_case c = make_case();
    bn_out o;
    run_graph(1, &c, &o);
    double x[GX];
    for (int i = 0; i < GX; i++) x[i] = c.x[i];
    static bn_ref ref;
    reference(&c, x, &ref);
    /* the reference's gradient against central differences of its loss */
    for (int j = 0; j < GX; j += 7) {
        static bn_ref lo, hi;
        const double h = 1e-5;
        x[j] = c.x[j] + h;
        reference(&c, x, &hi);
        x[j] = c.x[j] - h;
        reference(&c, x, &lo);
        x[j] = c.x[j];
        double fd = (hi.loss - lo.loss) / (2 * h);
        if (!(fabs(fd - ref.dx[j]) <= 1e-6 * fmax(1, fabs(fd))))
            fail_msg("reference dx[%d] = %.9g, differences give %.9g", j, ref.dx[j], fd);
    }
    assert_true(fabs(o.loss - ref.loss) <= 1e-4 * fmax(1, fabs(ref.loss)));
    near_f("y", o.y, ref.y, GX, 1e-5);
    near_f("dx", o.dx, ref.dx, GX, 1e-4);
    near_f("dweight", o.dw, ref.dw, GC, 1e-5);
    near_f("dbias", o.db, ref.db, GC, 1e-5);
    near_f("running_mean", o.rm, ref.rm, GC, 1e-6);
    near_f("running_var", o.rv, ref.rv, GC, 1e-6);
    near_f("eval y (running statistics)", o.y_eval, ref.y_eval, GX, 1e-5);
    near_ff("running_mean after an eval forward", o.rm_after_eval, o.rm, GC, 0);
}

/* dp n against one rank: the statistics are the global batch's */
static void sync_bn(int n) {
    bn_case c = make_case();
    static bn_out one, many;
    run_graph(1, &c, &one);
    run_graph(n, &c, &many);
    near_ff("y", many.y, one.y, GX, 1e-5);
    near_ff("dx", many.dx, one.dx, GX, 1e-5);
    near_ff("dweight", many.dw, one.dw, GC, 1e-5);
    near_ff("dbias", many.db, one.db, GC, 1e-5);
    near_ff("running_mean", many.rm, one.rm, GC, 1e-5);
    near_ff("running_var", many.rv, one.rv, GC, 1e-5);
    near_ff("eval y", many.y_eval, one.y_eval, GX, 1e-5);
    /* a rank's own statistics would differ: its half of the batch has another mean */
    double local = 0, global = 0;
    for (int i = 0; i < GN / n; i++)
        for (int s = 0; s < GSP; s++) local += c.x[i * GC * GSP + s];
    for (int i = 0; i < GN; i++)
        for (int s = 0; s < GSP; s++) global += c.x[i * GC * GSP + s];
    local /= GN / n * GSP, global /= GN * GSP;
    double rm_local = (1 - MOM) * c.rm0[0] + MOM * local;
    assert_true(fabs(rm_local - many.rm[0]) > 1e-3);
    assert_true(fabs((1 - MOM) * c.rm0[0] + MOM * global - many.rm[0]) < 1e-5);
}

static void sync_bn_dp2(void **state) {
    (void)state;
    sync_bn(2);
}

static void sync_bn_dp4(void **state) {
    (void)state;
    sync_bn(4);
}

/* --- a model with batch norm under every strategy ------------------------------------------- */

enum { D = 16, C = 32, HID = 64, K = 10, NB = 4, B = 16, STEPS = 5, MAX_STATE = 64 };

static int param2(ms_graph *g, const char *name, int64_t a, int64_t b, float std) {
    const int64_t s[2] = {a, b};
    return ms_graph_param(g, name, 2, s, (ms_init){MS_INIT_NORMAL, std});
}

static int matmul(ms_graph *g, int x, int w) {
    const int in[2] = {x, w};
    return ms_graph_op(g, MS_OP_MATMUL, NULL, 2, in, NULL);
}

static int block(ms_graph *g, int h, int l) {
    char n1[64], n2[64], bn[64];
    snprintf(n1, sizeof n1, "blocks.%d.fc1.weight", l);
    snprintf(n2, sizeof n2, "blocks.%d.fc2.weight", l);
    snprintf(bn, sizeof bn, "blocks.%d.bn", l);
    ms_graph_region_begin(g, MS_REGION_BLOCK);
    int u = matmul(g, h, param2(g, n1, C, HID, 0.2f));
    u = ms_graph_batch_norm(g, u, bn, HID, 1e-5f, 0.1f);
    const int gin[1] = {u};
    u = ms_graph_op(g, MS_OP_GELU, NULL, 1, gin, NULL);
    u = matmul(g, u, param2(g, n2, HID, C, 0.1f));
    const int add[2] = {h, u};
    int y = ms_graph_op(g, MS_OP_ADD, NULL, 2, add, NULL);
    ms_graph_region_end(g, MS_REGION_BLOCK);
    return y;
}

static ms_status mlp_build(const ms_model_def *d, int rows, const ms_model_chunk *ch, ms_model *out,
                           ms_error *err) {
    (void)d, (void)err;
    memset(out, 0, sizeof *out);
    out->loss = out->logits = out->hidden_in = out->hidden_out = -1;
    ms_graph *g = out->g = ms_graph_create();
    int h;
    if (ch->first) {
        const int64_t xs[2] = {rows, D};
        h = matmul(g, ms_graph_input(g, "x", 2, xs), param2(g, "stem.weight", D, C, 0.2f));
    } else {
        const int64_t hs[2] = {rows, C};
        h = out->hidden_in = ms_graph_input(g, "hidden_in", 2, hs);
        ms_graph_input_grad(g, h);
    }
    for (int l = ch->layer_lo; l < ch->layer_hi; l++) h = block(g, h, l);
    if (!ch->last) {
        out->hidden_out = h;
        ms_graph_set_output(g, h);
        return MS_OK;
    }
    const int64_t ls[1] = {rows};
    int label = ms_graph_input(g, "label", 1, ls);
    out->logits = matmul(g, h, param2(g, "head.weight", C, K, 0.2f));
    const int xe[2] = {out->logits, label};
    int losses = ms_graph_op(g, MS_OP_XENT, NULL, 2, xe, NULL);
    ms_op_attrs all = {.i = {-1}};
    const int li[1] = {losses};
    out->loss = ms_graph_op(g, MS_OP_MEAN, &all, 1, li, NULL);
    ms_graph_set_loss(g, out->loss);
    return MS_OK;
}

/* Megatron's MLP split over tp (mesh dim 1): fc1 by columns, fc2 by rows; the batch norm
 * between them then runs on channel shards. */
static bool mlp_shard(const ms_model_def *d, const ms_strategy *s, const char *name,
                      const ms_shape *shape, int mesh_ndim, ms_placements *pl) {
    (void)d, (void)shape;
    if (s->tp < 2 || mesh_ndim < 2) return false;
    size_t n = strlen(name);
    bool fc1 = n > 10 && !strcmp(name + n - 10, "fc1.weight");
    bool fc2 = n > 10 && !strcmp(name + n - 10, "fc2.weight");
    if (!fc1 && !fc2) return false;
    *pl = ms_placements_replicated(mesh_ndim);
    pl->p[1] = ms_pl_shard(fc1 ? 1 : 0);
    ms_placements_default_order(pl);
    return true;
}

static const ms_model_hooks mlp_hooks = {.build_chunk = mlp_build, .shard = mlp_shard};

static ms_model_def mlp_def(void) {
    ms_model_def d = {.name = "bn-mlp", .hooks = &mlp_hooks, .n_blocks = NB, .ninputs = 2};
    d.inputs[0] = (ms_model_input){.name = "x", .ndim = 1, .shape = {D}};
    d.inputs[1] = (ms_model_input){.name = "label", .ndim = 0, .integer = true};
    return d;
}

enum { SAMPLES = 4 * B };

static void sample(uint64_t i, float *x, float *label) {
    int best = 0;
    for (int k = 0; k < D; k++) {
        x[k] = (float)(ms_philox_normal(11, 3, i * D + (uint64_t)k) + 0.3 * (k % 3));
        if (k < K && x[k] > x[best]) best = k;
    }
    *label = (float)best;
}

static ms_status synth_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                            uint64_t batch, int Bn, int r0, int nrows, float *const *out,
                            ms_error *err) {
    (void)src, (void)seed, (void)err;
    uint64_t base = s == MS_SPLIT_VAL || eval ? SAMPLES / 2 : 0;
    for (int r = 0; r < nrows; r++) {
        uint64_t i = base + (batch * (uint64_t)Bn + (uint64_t)(r0 + r)) % (SAMPLES / 2);
        sample(i, out[0] + (size_t)r * D, out[1] + r);
    }
    return MS_OK;
}

static const ms_batch_source_vt synth_vt = {.read = synth_read};

static ms_batch_source synth_source(void) {
    ms_batch_source src = {.vt = &synth_vt, .name = "synthetic", .nfields = 2};
    src.fields[0] = (ms_batch_field){.name = "x", .ndim = 1, .shape = {D}};
    src.fields[1] = (ms_batch_field){.name = "label", .ndim = 0, .integer = true};
    for (int s = 0; s < 3; s++) src.samples[s] = SAMPLES / 2;
    return src;
}

typedef struct result {
    float losses[STEPS];
    double eval_loss;
    int n, nbuffers;
    int kind[MAX_STATE];
    int64_t len[MAX_STATE];
    float *data[MAX_STATE];
} result;

typedef struct run_arg {
    ms_strategy s;
    result *out;
    int at; /* 0: never; else switch to `then` (or save into dir and resume under it) */
    ms_strategy then;
    const char *dir;
} run_arg;

static ms_train_opts opts(void) {
    return (ms_train_opts){.batch = B,
                           .seq = 1,
                           .steps = STEPS,
                           .warmup = 1,
                           .seed = 3,
                           .lr = 1e-2,
                           .min_lr = 1e-3,
                           .clip = 1.0};
}

static void gather(mt_rank *r, ms_trainer *tr, result *out) {
    ms_error err = {0};
    int n = ms_trainer_num_state(tr); /* every rank walks the state; rank 0 records it */
    bool rec = r->ctx->rank == 0;
    if (rec) out->n = n;
    for (int i = 0; i < n && i < MAX_STATE; i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        if (rec) out->kind[i] = st.kind;
        if (rec) out->nbuffers += st.kind == MS_STATE_BUFFER;
        ms_tensor full = {0};
        if (!MT_OK(r, ms_trainer_state_full(tr, i, &full, &err), &err)) return;
        if (r->ctx->rank == 0) {
            out->len[i] = ms_tensor_numel(&full);
            out->data[i] = xmalloc(sizeof(float) * (size_t)out->len[i]);
            memcpy(out->data[i], ms_tensor_f32(&full), sizeof(float) * (size_t)out->len[i]);
        }
        ms_tensor_release(&full);
    }
}

static void save(mt_rank *r, ms_trainer *tr, const char *dir) {
    ms_error err = {0};
    ms_ckpt_opts co = {.dir = dir, .keep = 1, .model = "bn-mlp"};
    ms_ckpt_saver *sv = NULL;
    double stall;
    if (!MT_OK(r, ms_ckpt_saver_create(r->ctx, &co, &sv, &err), &err)) return;
    MT_OK(r, ms_ckpt_saver_save(sv, tr, &stall, &err), &err);
    MT_OK(r, ms_ckpt_saver_poll(sv, true, NULL, 0, &err), &err);
    ms_ckpt_saver_destroy(sv);
}

static void train(mt_rank *r, void *arg) {
    run_arg *a = arg;
    ms_error err = {0};
    ms_model_def def = mlp_def();
    ms_batch_source src = synth_source();
    ms_train_opts o = opts();
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create_def(r->ctx, &def, &a->s, NULL, &o, &src, &tr, &err), &err))
        return;
    for (int step = 0; step < STEPS; step++) {
        if (step == a->at && a->at && !a->dir)
            if (!MT_OK(r, ms_trainer_switch(tr, &a->then, NULL, &err), &err)) break;
        if (step == a->at && a->at && a->dir) {
            save(r, tr, a->dir);
            ms_trainer_destroy(tr);
            tr = NULL;
            if (!MT_OK(r, ms_trainer_create_def(r->ctx, &def, &a->then, NULL, &o, &src, &tr, &err),
                       &err))
                return;
            ms_ckpt_info info;
            if (!MT_OK(r, ms_ckpt_load(tr, a->dir, &info, &err), &err)) break;
        }
        ms_step_result res;
        if (!MT_OK(r, ms_trainer_step(tr, &res, &err), &err)) break;
        if (r->ctx->rank == 0) a->out->losses[step] = res.loss;
    }
    double ev = 0;
    MT_OK(r, ms_trainer_evaluate(tr, MS_SPLIT_VAL, 1, &ev, &err), &err);
    if (r->ctx->rank == 0) a->out->eval_loss = ev;
    gather(r, tr, a->out);
    ms_trainer_destroy(tr);
}

static void free_result(result *x) {
    for (int i = 0; i < x->n && i < MAX_STATE; i++) free(x->data[i]);
}

static ms_strategy mesh(int dp, int tp) {
    ms_strategy s;
    ms_error err;
    assert_int_equal(ms_strategy_init(&s, dp, tp, 1, false, &err), MS_OK);
    return s;
}

/* Runs b against one rank with the same micro-batches (each a batch norm call of its own). */
static void check_run(run_arg *b, double tol) {
    static result one, many;
    memset(&one, 0, sizeof one), memset(&many, 0, sizeof many);
    run_arg a = {.out = &one};
    b->out = &many;
    const ms_strategy *s = b->at ? &b->then : &b->s;
    a.s = mesh(1, 1);
    a.s.micro_batches = s->micro_batches;
    mt_run(1, train, &a);
    mt_run(ms_strategy_ranks(s), train, b);
    if (mt_world_rank() != 0) return;
    char name[MS_STRATEGY_NAME_MAX];
    ms_strategy_name(s, name, sizeof name);
    for (int k = 0; k < STEPS; k++)
        if (!(fabsf(many.losses[k] - one.losses[k]) <= tol * fabsf(one.losses[k])))
            fail_msg("%s, step %d: loss %.7f, one rank %.7f", name, k, many.losses[k],
                     one.losses[k]);
    if (!(one.losses[STEPS - 1] < one.losses[0]))
        fail_msg("one rank does not learn: loss %.5f, then %.5f", one.losses[0],
                 one.losses[STEPS - 1]);
    if (!(fabs(many.eval_loss - one.eval_loss) <= tol * fabs(one.eval_loss)))
        fail_msg("%s: evaluation loss %.7f, one rank %.7f", name, many.eval_loss, one.eval_loss);
    assert_int_equal(many.n, one.n);
    assert_int_equal(one.nbuffers, 2 * NB); /* running_mean and running_var per block */
    assert_int_equal(one.n, 3 * (NB * 4 + 2) + 2 * NB);
    for (int i = 0; i < one.n; i++) {
        assert_int_equal(many.kind[i], one.kind[i]);
        assert_int_equal(many.len[i], one.len[i]);
        double scale = 0, diff = 0;
        for (int64_t k = 0; k < one.len[i]; k++) {
            scale = fmax(scale, fabs(one.data[i][k]));
            diff = fmax(diff, fabs(many.data[i][k] - one.data[i][k]));
        }
        /* buffers: statistics of the same batches, equal to rounding; parameters and moments
         * as test_user_model (Adam amplifies rounding of near-zero gradients to a fraction of
         * lr) */
        double allowed =
            one.kind[i] == MS_STATE_BUFFER ? 1e-5 * fmax(scale, 1) : 1e-4 * scale + 0.05 * 1e-2;
        if (diff > allowed)
            fail_msg("%s: state tensor %d (kind %d) differs by %g at scale %g", name, i,
                     one.kind[i], diff, scale);
    }
    /* the running statistics moved from their start (0 and 1) */
    bool moved = false;
    for (int i = 0; i < one.n; i++)
        if (one.kind[i] == MS_STATE_BUFFER)
            for (int64_t k = 0; k < one.len[i]; k++)
                moved |= one.data[i][k] != 0.0f && one.data[i][k] != 1.0f;
    assert_true(moved);
    free_result(&one), free_result(&many);
}

static void check_against_one_rank(const ms_strategy *s) {
    run_arg b = {.s = *s};
    check_run(&b, 1e-5);
}

static void trains_dp2(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 1);
    check_against_one_rank(&s);
}

static void trains_tp2(void **state) {
    (void)state;
    ms_strategy s = mesh(1, 2);
    check_against_one_rank(&s);
}

static void trains_pp2(void **state) {
    (void)state;
    ms_strategy s = mesh(1, 1);
    s.pp = 2;
    s.micro_batches = 2;
    check_against_one_rank(&s);
}

static void trains_zero3(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 1);
    s.zero = 3;
    check_against_one_rank(&s);
}

static void trains_recompute(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 1);
    s.recompute = MS_RECOMPUTE_FULL;
    check_against_one_rank(&s);
}

static void switch_dp2_to_tp2(void **state) {
    (void)state;
    run_arg b = {.s = mesh(2, 1), .at = 2, .then = mesh(1, 2)};
    check_run(&b, 1e-5);
}

static void save_dp2_resume_tp2(void **state) {
    (void)state;
    char dir[] = "/tmp/ms-batch-norm-XXXXXX";
    assert_non_null(mkdtemp(dir));
    run_arg b = {.s = mesh(2, 1), .at = 3, .then = mesh(1, 2), .dir = dir};
    check_run(&b, 1e-5);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(forward_backward_match_float64),
    cmocka_unit_test(sync_bn_dp2),
    cmocka_unit_test(sync_bn_dp4),
    cmocka_unit_test(trains_dp2),
    cmocka_unit_test(trains_tp2),
    cmocka_unit_test(trains_pp2),
    cmocka_unit_test(trains_zero3),
    cmocka_unit_test(trains_recompute),
    cmocka_unit_test(switch_dp2_to_tp2),
    cmocka_unit_test(save_dp2_resume_tp2),
};
MT_MAIN("test_batch_norm", tests)

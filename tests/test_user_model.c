/* test_user_model.c - a model written against the model interface alone (engine/model/model.h)
 * trains under every strategy, each run against the one-rank run.
 *
 * The model is a residual MLP classifier: a stem x [16] -> [32], NB blocks h + W2 gelu(W1 h)
 * (each a recompute region and a pipeline cut point), and a head [32] -> 10 classes with a
 * mean cross-entropy. Its shard hook is Megatron's MLP split (fc1 by columns, fc2 by rows),
 * given as a C callback; its inputs come from a batch source written here (samples drawn from
 * Philox by sample index, so the source is its own reference). Every strategy that does not
 * change the arithmetic must give the one-rank run's losses and final parameters.
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

enum { D = 16, C = 32, HID = 64, K = 10, NB = 4, B = 8, STEPS = 5, MAX_STATE = 64 };

/* --- the model ------------------------------------------------------------------------------ */

static int param2(ms_graph *g, const char *name, int64_t a, int64_t b, float std) {
    const int64_t s[2] = {a, b};
    return ms_graph_param(g, name, 2, s, (ms_init){MS_INIT_NORMAL, std});
}

static int matmul(ms_graph *g, int x, int w) {
    const int in[2] = {x, w};
    return ms_graph_op(g, MS_OP_MATMUL, NULL, 2, in, NULL);
}

static int block(ms_graph *g, int h, int l) {
    char n1[64], n2[64];
    snprintf(n1, sizeof n1, "blocks.%d.fc1.weight", l);
    snprintf(n2, sizeof n2, "blocks.%d.fc2.weight", l);
    ms_graph_region_begin(g, MS_REGION_BLOCK);
    int u = matmul(g, h, param2(g, n1, C, HID, 0.1f));
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

/* Megatron's MLP split over tp (mesh dim 1): fc1 by columns, fc2 by rows. */
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
    ms_model_def d = {.name = "residual-mlp", .hooks = &mlp_hooks, .n_blocks = NB, .ninputs = 2};
    d.inputs[0] = (ms_model_input){.name = "x", .ndim = 1, .shape = {D}};
    d.inputs[1] = (ms_model_input){.name = "label", .ndim = 0, .integer = true};
    return d;
}

/* --- the data: sample i is Philox's, its label a function of it ------------------------------ */

enum { SAMPLES = B }; /* every batch holds every sample: the loss must fall */

static void sample(uint64_t i, float *x, float *label) {
    int best = 0;
    for (int k = 0; k < D; k++) {
        x[k] = (float)ms_philox_normal(11, 3, i * D + (uint64_t)k);
        if (k < K && x[k] > x[best]) best = k;
    }
    *label = (float)best; /* the largest of the first K features: linearly learnable */
}

static ms_status synth_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                            uint64_t batch, int Bn, int r0, int nrows, float *const *out,
                            ms_error *err) {
    (void)src, (void)s, (void)eval, (void)seed, (void)err;
    for (int r = 0; r < nrows; r++) {
        uint64_t i = (batch * (uint64_t)Bn + (uint64_t)(r0 + r)) % SAMPLES;
        sample(i, out[0] + (size_t)r * D, out[1] + r);
    }
    return MS_OK;
}

static const ms_batch_source_vt synth_vt = {.read = synth_read};

static ms_batch_source synth_source(void) {
    ms_batch_source src = {.vt = &synth_vt, .name = "synthetic", .nfields = 2};
    src.fields[0] = (ms_batch_field){.name = "x", .ndim = 1, .shape = {D}};
    src.fields[1] = (ms_batch_field){.name = "label", .ndim = 0, .integer = true};
    for (int s = 0; s < 3; s++) src.samples[s] = SAMPLES;
    return src;
}

/* --- runs ---------------------------------------------------------------------------------- */

typedef struct result {
    float losses[STEPS];
    int64_t fc1_local; /* rank 0's box of blocks.0.fc1.weight: split by tp (and ZeRO 3) */
    int n;
    int64_t len[MAX_STATE];
    float *data[MAX_STATE];
} result;

typedef struct run_arg {
    ms_strategy s;
    result *out;
    /* Optional: at step `at` (0: never), switch to `then` live, or save a checkpoint into
     * `dir` there, end the run, and resume it under `then` in a fresh trainer. */
    int at;
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
    if (r->ctx->rank == 0) out->n = n;
    for (int i = 0; i < n && i < MAX_STATE; i++) {
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

static void record_fc1(mt_rank *r, ms_trainer *tr, result *out) {
    for (int i = 0; i < ms_trainer_num_state(tr); i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        if (r->ctx->rank == 0 && st.kind == MS_STATE_PARAM &&
            !strcmp(st.param, "blocks.0.fc1.weight"))
            out->fc1_local = (int64_t)st.n;
    }
}

/* Saves at the step boundary and waits for the commit. */
static void save(mt_rank *r, ms_trainer *tr, const char *dir) {
    ms_error err = {0};
    ms_ckpt_opts co = {.dir = dir, .keep = 1, .model = "residual-mlp"};
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
            MT_CHECK(r, ms_trainer_step_index(tr) == step, "resumed at step %lld, saved at %d",
                     (long long)ms_trainer_step_index(tr), step);
        }
        ms_step_result res;
        if (!MT_OK(r, ms_trainer_step(tr, &res, &err), &err)) break;
        if (r->ctx->rank == 0) a->out->losses[step] = res.loss;
    }
    record_fc1(r, tr, a->out);
    gather(r, tr, a->out);
    ms_trainer_destroy(tr);
}

static void free_result(result *x) {
    for (int i = 0; i < x->n && i < MAX_STATE; i++) free(x->data[i]);
}

/* Runs b (its strategy, or what it switches or resumes to) against one rank. */
static void check_run(run_arg *b, double tol) {
    result one = {0}, many = {0};
    run_arg a = {.out = &one};
    b->out = &many;
    const ms_strategy *s = b->at ? &b->then : &b->s;
    ms_strategy_defaults(&a.s);
    a.s.precision = s->precision; /* bf16 is compared with bf16 on one rank */
    mt_run(1, train, &a);
    mt_run(ms_strategy_ranks(s), train, b);
    if (mt_world_rank() != 0) return;
    char name[MS_STRATEGY_NAME_MAX];
    ms_strategy_name(s, name, sizeof name);
    for (int k = 0; k < STEPS; k++)
        if (!(fabsf(many.losses[k] - one.losses[k]) <= tol * fabsf(one.losses[k])))
            fail_msg("%s, step %d: loss %.7f, one rank %.7f", name, k, many.losses[k],
                     one.losses[k]);
    /* the model learns: the last step's loss is below the first's */
    if (!(one.losses[STEPS - 1] < one.losses[0]))
        fail_msg("one rank does not learn: loss %.5f at step 0, %.5f at step %d", one.losses[0],
                 one.losses[STEPS - 1], STEPS - 1);
    /* the strategy split the weights as it says: tp by the hook, ZeRO 3 over dp */
    assert_int_equal(one.fc1_local, C * HID);
    assert_int_equal(many.fc1_local, C * HID / s->tp / (s->zero == 3 ? s->dp : 1));
    assert_int_equal(many.n, one.n);
    assert_int_equal(one.n, 3 * (NB * 2 + 2)); /* every parameter, m and v */
    for (int i = 0; i < one.n; i++) {
        assert_int_equal(many.len[i], one.len[i]);
        double scale = 0, diff = 0;
        for (int64_t k = 0; k < one.len[i]; k++) {
            scale = fmax(scale, fabs(one.data[i][k]));
            diff = fmax(diff, fabs(many.data[i][k] - one.data[i][k]));
        }
        /* see test_trainer's switch: Adam turns rounding noise of a near-zero gradient into
         * a fraction of lr (bf16's noise: up to one lr); a misplaced shard is off by the
         * weights' own scale, far above this */
        if (diff >
            fmax(1e-4, tol) * scale + (s->precision == MS_PRECISION_BF16 ? 1 : 0.05) * opts().lr)
            fail_msg("%s: state tensor %d differs by %g at scale %g", name, i, diff, scale);
    }
    free_result(&one), free_result(&many);
}

static void check_against_one_rank(const ms_strategy *s, double tol) {
    run_arg b = {.s = *s};
    check_run(&b, tol);
}

static ms_strategy mesh(int dp, int tp) {
    ms_strategy s;
    ms_error err;
    assert_int_equal(ms_strategy_init(&s, dp, tp, 1, false, &err), MS_OK);
    return s;
}

static void test_dp2(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 1);
    check_against_one_rank(&s, 1e-5);
}

static void test_tp2(void **state) {
    (void)state;
    ms_strategy s = mesh(1, 2);
    check_against_one_rank(&s, 1e-5);
}

static void test_dp2_tp2(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 2);
    check_against_one_rank(&s, 1e-5);
}

static void test_pp2(void **state) {
    (void)state;
    ms_strategy s = mesh(1, 1);
    s.pp = 2;
    s.micro_batches = 2;
    check_against_one_rank(&s, 1e-5);
}

static void test_zero3(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 1);
    s.zero = 3;
    check_against_one_rank(&s, 1e-5);
}

static void test_recompute(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 1);
    s.recompute = MS_RECOMPUTE_FULL;
    check_against_one_rank(&s, 1e-5);
}

static void test_bf16(void **state) {
    (void)state;
    ms_strategy s = mesh(2, 1);
    s.precision = MS_PRECISION_BF16;
    /* against bf16 on one rank: dp sums the bf16 gradients in another order, each sum
     * rounded to bf16 (2^-8 relative), which later steps carry */
    check_against_one_rank(&s, 2e-2);
}

static void test_switch_dp2_to_tp2(void **state) {
    (void)state;
    run_arg b = {.s = mesh(2, 1), .at = 2, .then = mesh(1, 2)};
    check_run(&b, 1e-5);
}

static void test_save_dp2_resume_tp2_zero(void **state) {
    (void)state;
    char dir[] = "/tmp/ms-user-model-XXXXXX";
    assert_non_null(mkdtemp(dir));
    run_arg b = {.s = mesh(2, 1), .at = 3, .then = mesh(2, 1), .dir = dir};
    b.then.zero = 3;
    check_run(&b, 1e-5);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* --- bad models and bad data get a clear error ---------------------------------------------- */

static ms_status no_loss_build(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                               ms_model *out, ms_error *err) {
    MS_CHECK(mlp_build(d, rows, ch, out, err));
    out->loss = -1;
    return MS_OK;
}

static void bad_def(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_strategy s = mesh(1, 1);
    ms_train_opts o = opts();
    ms_batch_source src = synth_source();
    ms_trainer *tr = NULL;
    static const ms_model_hooks no_loss = {.build_chunk = no_loss_build};
    ms_model_def d = mlp_def();
    d.hooks = &no_loss;
    MT_CHECK(r, ms_trainer_create_def(r->ctx, &d, &s, NULL, &o, &src, &tr, &err) != MS_OK,
             "a model without a loss was taken");
    MT_CHECK(r, strstr(err.msg, "no scalar loss") != NULL, "message: %s", err.msg);
    d = mlp_def();
    snprintf(d.inputs[1].name, sizeof d.inputs[1].name, "labels");
    MT_CHECK(r, ms_trainer_create_def(r->ctx, &d, &s, NULL, &o, &src, &tr, &err) != MS_OK,
             "an input the source lacks was taken");
    MT_CHECK(r, strstr(err.msg, "no field \"labels\"") != NULL, "message: %s", err.msg);
    d = mlp_def();
    d.inputs[0].shape[0] = D + 1;
    MT_CHECK(r, ms_trainer_create_def(r->ctx, &d, &s, NULL, &o, &src, &tr, &err) != MS_OK,
             "a sample shape the source does not have was taken");
    MT_CHECK(r, strstr(err.msg, "[16]") && strstr(err.msg, "[17]"), "message: %s", err.msg);
    d = mlp_def();
    s.pp = NB + 1;
    MT_CHECK(r, ms_trainer_create_def(r->ctx, &d, &s, NULL, &o, &src, &tr, &err) != MS_OK,
             "more stages than blocks were taken");
    MT_CHECK(r, tr == NULL, "a failed create returned a trainer");
}

static void test_bad_input(void **state) {
    (void)state;
    mt_run(1, bad_def, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_dp2),
    cmocka_unit_test(test_tp2),
    cmocka_unit_test(test_dp2_tp2),
    cmocka_unit_test(test_pp2),
    cmocka_unit_test(test_zero3),
    cmocka_unit_test(test_recompute),
    cmocka_unit_test(test_bf16),
    cmocka_unit_test(test_switch_dp2_to_tp2),
    cmocka_unit_test(test_save_dp2_resume_tp2_zero),
    cmocka_unit_test(test_bad_input),
};
MT_MAIN("test_user_model", tests)

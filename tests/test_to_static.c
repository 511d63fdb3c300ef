/* test_to_static.c - an eager training step, recorded once, becomes a graph program (to_static)
 * that the trainer runs under its strategies, with the eager run's losses.
 *
 * The model is examples/eager_train.c's MLP (layer norm, W1, GELU, W2, cross-entropy) on a
 * 2 x 2 mesh, dp on dim 0 and Megatron's tp on dim 1. The eager run records step 0 on its tape
 * and converts it (ms_tape_to_static), then trains on with eager AdamW. The trainer then trains
 * the converted model from the same weights on the same batches under dp2 x tp2 and on one
 * rank: every step's loss equals the eager run's within 1e-5 relative.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/graph/eager_adamw.h"
#include "engine/graph/tape.h"
#include "engine/model/static_def.h"
#include "engine/train/trainer.h"
#include "tests/testkit.h"

enum { BATCH = 32, DIM = 16, HIDDEN = 64, CLASSES = 8, STEPS = 6, NP = 6 };
static const float LR = 1e-2f;

/* --- the batches, one function for both modes ----------------------------------------------- */

/* Batch `step`: x from Philox, y the largest of its first CLASSES features (learnable). */
static void make_batch(int step, float *x, float *y) {
    for (int r = 0; r < BATCH; r++) {
        int best = 0;
        for (int d = 0; d < DIM; d++) {
            x[r * DIM + d] =
                (float)ms_philox_normal(11, 500 + (uint64_t)step, (uint64_t)(r * DIM + d));
            if (d < CLASSES && x[r * DIM + d] > x[r * DIM + best]) best = d;
        }
        y[r] = (float)best;
    }
}

/* The trainer's source: batch i is make_batch(i) (its rows r0..). */
static ms_status src_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                          uint64_t batch, int B, int r0, int nrows, float *const *out,
                          ms_error *err) {
    (void)src, (void)s, (void)eval, (void)seed, (void)B, (void)err;
    float x[BATCH * DIM], y[BATCH];
    make_batch((int)batch, x, y);
    memcpy(out[0], x + (size_t)r0 * DIM, sizeof(float) * (size_t)nrows * DIM);
    memcpy(out[1], y + r0, sizeof(float) * (size_t)nrows);
    return MS_OK;
}

static const ms_batch_source_vt src_vt = {.read = src_read};

/* --- the eager run --------------------------------------------------------------------------- */

static ms_static_graph *recipe; /* rank 0's, made at step 0 */
static float eager_losses[STEPS];

static ms_status param(ms_dmesh *dm, int ndim, const int64_t *shape, const char *pl, uint64_t id,
                       float mean, float std, ms_dtensor *out, ms_error *err) {
    ms_placements p;
    MS_CHECK(ms_placements_parse(pl, &p, err));
    ms_tensor host;
    MS_CHECK(ms_tensor_alloc(ms_device_host(), MS_F32, ndim, shape, &host, err));
    ms_status st = ms_tensor_init_normal(&host, 7, id, shape, NULL, mean, std, err);
    if (st == MS_OK) st = ms_dtensor_shard(dm, &host, &p, out, err);
    ms_tensor_release(&host);
    return st;
}

static ms_status tensor_of(ms_dmesh *dm, const float *v, int ndim, const int64_t *shape,
                           const char *pl, ms_dtensor *out, ms_error *err) {
    ms_placements p;
    MS_CHECK(ms_placements_parse(pl, &p, err));
    ms_tensor host;
    MS_CHECK(ms_tensor_alloc(ms_device_host(), MS_F32, ndim, shape, &host, err));
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    memcpy(ms_tensor_f32(&host), v, sizeof(float) * (size_t)n);
    ms_status st = ms_dtensor_shard(dm, &host, &p, out, err);
    ms_tensor_release(&host);
    return st;
}

#define IN(...)                                                                                    \
    (const ms_dtensor *[]) {                                                                       \
        __VA_ARGS__                                                                                \
    }

static ms_status forward(ms_tape *t, ms_dtensor *p, const ms_dtensor *x, const ms_dtensor *y,
                         ms_dtensor *loss, ms_error *err) {
    const ms_op_attrs eps = {.f = {1e-5f}}, all = {.i = {-1}};
    const ms_eager_opts eo = {.allow_reshard = true};
    ms_dtensor h[7] = {0};
    ms_status st = ms_tape_op(t, MS_OP_LAYERNORM, &eps, 3, IN(x, &p[0], &p[1]), 1, &h[0], &eo, err);
    if (st == MS_OK)
        st = ms_tape_op(t, MS_OP_MATMUL, NULL, 2, IN(&h[0], &p[2]), 1, &h[1], &eo, err);
    if (st == MS_OK) st = ms_tape_op(t, MS_OP_BIAS, NULL, 2, IN(&h[1], &p[3]), 1, &h[2], &eo, err);
    if (st == MS_OK) st = ms_tape_op(t, MS_OP_GELU, NULL, 1, IN(&h[2]), 1, &h[3], &eo, err);
    if (st == MS_OK)
        st = ms_tape_op(t, MS_OP_MATMUL, NULL, 2, IN(&h[3], &p[4]), 1, &h[4], &eo, err);
    if (st == MS_OK) st = ms_tape_op(t, MS_OP_BIAS, NULL, 2, IN(&h[4], &p[5]), 1, &h[5], &eo, err);
    if (st == MS_OK) st = ms_tape_op(t, MS_OP_XENT, NULL, 2, IN(&h[5], y), 1, &h[6], &eo, err);
    if (st == MS_OK) st = ms_tape_op(t, MS_OP_MEAN, &all, 1, IN(&h[6]), 1, loss, &eo, err);
    for (int i = 0; i < 7; i++) ms_dtensor_release(&h[i]);
    return st;
}

static const char *names[NP] = {"ln.weight", "ln.bias",    "fc1.weight",
                                "fc1.bias",  "fc2.weight", "fc2.bias"};

/* One eager step on the 2 x 2 mesh; step 0 is also converted (convert). */
static ms_status eager_step(ms_dmesh *dm, ms_tape *t, ms_eager_adamw *opt, ms_dtensor *p, int step,
                            float *loss_out, bool convert, ms_error *err) {
    float xv[BATCH * DIM], yv[BATCH];
    make_batch(step, xv, yv);
    const int64_t xs[2] = {BATCH, DIM}, ys[1] = {BATCH};
    ms_dtensor x = {0}, y = {0}, loss = {0};
    ms_tape_clear(t);
    ms_status st = tensor_of(dm, xv, 2, xs, "[S(0), R]", &x, err);
    if (st == MS_OK) st = tensor_of(dm, yv, 1, ys, "[S(0), R]", &y, err);
    const ms_dtensor *pp[NP];
    for (int i = 0; i < NP && st == MS_OK; i++) {
        pp[i] = &p[i];
        st = ms_tape_watch(t, &p[i], err);
        if (st == MS_OK) st = ms_tape_name(t, &p[i], names[i], err);
    }
    if (st == MS_OK) st = ms_tape_input(t, &x, "x", err);
    if (st == MS_OK) st = ms_tape_input(t, &y, "y", err);
    if (st == MS_OK) st = forward(t, p, &x, &y, &loss, err);
    ms_static_graph *s = NULL;
    if (st == MS_OK && convert) st = ms_tape_to_static(t, &loss, NP, pp, &s, err);
    if (s && dm->ctx->rank == 0)
        recipe = s;
    else
        ms_static_free(s);
    ms_tensor full = {0};
    if (st == MS_OK) st = ms_dtensor_full(&loss, &full, err);
    if (st == MS_OK) *loss_out = ms_tensor_f32(&full)[0];
    ms_tensor_release(&full);
    const bool decay[NP] = {false};
    ms_dtensor *params[NP];
    for (int i = 0; i < NP; i++) params[i] = &p[i];
    const ms_adamw_opts ao = {.lr = LR, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    if (st == MS_OK) st = ms_tape_backward(t, &loss, err);
    if (st == MS_OK) st = ms_eager_adamw_step(opt, t, NP, params, decay, &ao, err);
    ms_dtensor_release(&x), ms_dtensor_release(&y), ms_dtensor_release(&loss);
    return st;
}

static void eager_run(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_mesh mesh;
    if (!MT_OK(r, ms_mesh_parse(&mesh, "2x2", &err), &err)) return;
    ms_dmesh *dm = NULL;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    const int64_t c[1] = {DIM}, w1[2] = {DIM, HIDDEN}, h[1] = {HIDDEN}, w2[2] = {HIDDEN, CLASSES},
                  k[1] = {CLASSES};
    ms_dtensor p[NP] = {0};
    ms_status st = param(dm, 1, c, "[R, R]", 1, 1.0f, 0.0f, &p[0], &err);
    if (st == MS_OK) st = param(dm, 1, c, "[R, R]", 2, 0.0f, 0.0f, &p[1], &err);
    if (st == MS_OK) st = param(dm, 2, w1, "[R, S(1)]", 3, 0.0f, 0.25f, &p[2], &err);
    if (st == MS_OK) st = param(dm, 1, h, "[R, S(0)]", 4, 0.0f, 0.0f, &p[3], &err);
    if (st == MS_OK) st = param(dm, 2, w2, "[R, S(0)]", 5, 0.0f, 0.125f, &p[4], &err);
    if (st == MS_OK) st = param(dm, 1, k, "[R, R]", 6, 0.0f, 0.0f, &p[5], &err);
    ms_tape *t = ms_tape_create();
    ms_eager_adamw *opt = ms_eager_adamw_create();
    for (int step = 0; step < STEPS && st == MS_OK; step++) {
        float l = 0;
        st = eager_step(dm, t, opt, p, step, &l, step == 0, &err);
        if (r->ctx->rank == 0) eager_losses[step] = l;
    }
    MT_OK(r, st, &err);
    ms_eager_adamw_destroy(opt);
    ms_tape_destroy(t);
    for (int i = 0; i < NP; i++) ms_dtensor_release(&p[i]);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

/* --- the graph run --------------------------------------------------------------------------- */

typedef struct graph_arg {
    int dp, tp;
    float losses[STEPS];
} graph_arg;

static void graph_run(mt_rank *r, void *arg) {
    graph_arg *a = arg;
    ms_error err = {0};
    ms_model_def def;
    if (!MT_OK(r, ms_model_def_from_static(recipe, "eager-mlp", &def, &err), &err)) return;
    ms_batch_source src = {.vt = &src_vt, .name = "batches", .nfields = 2};
    src.fields[0] = (ms_batch_field){.name = "x", .ndim = 1, .shape = {DIM}};
    src.fields[1] = (ms_batch_field){.name = "y", .ndim = 0, .integer = true};
    for (int s = 0; s < 3; s++) src.samples[s] = 1000;
    ms_strategy s;
    if (!MT_OK(r, ms_strategy_init(&s, a->dp, a->tp, 1, false, &err), &err)) return;
    ms_train_opts o = {.batch = BATCH, .seq = 1, .steps = STEPS, .seed = 1, .lr = LR, .min_lr = LR};
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create_def(r->ctx, &def, &s, NULL, &o, &src, &tr, &err), &err)) return;
    /* the eager step's layout: W1 by columns over tp (mesh dim 1) */
    for (int i = 0; i < ms_trainer_num_state(tr); i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        if (st.kind == MS_STATE_PARAM && !strcmp(st.param, "fc1.weight"))
            MT_CHECK(r, st.pl.p[1].kind == MS_PL_SHARD && st.pl.p[1].dim == 1,
                     "fc1.weight is not split by columns over tp");
    }
    for (int step = 0; step < STEPS; step++) {
        ms_step_result res;
        if (!MT_OK(r, ms_trainer_step(tr, &res, &err), &err)) break;
        if (r->ctx->rank == 0) a->losses[step] = res.loss;
    }
    ms_trainer_destroy(tr);
}

static void check(int dp, int tp) {
    graph_arg a = {.dp = dp, .tp = tp};
    mt_run(dp * tp, graph_run, &a);
    if (mt_world_rank() != 0) return;
    if (getenv("MS_TEST_VERBOSE"))
        for (int k = 0; k < STEPS; k++)
            printf("dp%d x tp%d step %d: graph %.7f eager %.7f\n", dp, tp, k, a.losses[k],
                   eager_losses[k]);
    for (int k = 0; k < STEPS; k++)
        if (!(fabsf(a.losses[k] - eager_losses[k]) <= 1e-5f * fabsf(eager_losses[k])))
            fail_msg("dp%d x tp%d, step %d: graph loss %.7f, eager %.7f", dp, tp, k, a.losses[k],
                     eager_losses[k]);
}

static int setup(void **state) {
    (void)state;
    mt_run(4, eager_run, NULL);
    return recipe ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ms_static_free(recipe);
    recipe = NULL;
    return 0;
}

static void test_eager_learns(void **state) {
    (void)state;
    assert_true(eager_losses[STEPS - 1] < eager_losses[0]);
    /* the recipe: six parameters and the two named inputs, every call of the step */
    assert_int_equal(recipe->nleaves, NP + 2);
    assert_int_equal(recipe->nnodes, 8);
    assert_non_null(ms_static_param(recipe, "fc1.weight"));
}

static void test_graph_dp2_tp2(void **state) {
    (void)state;
    check(2, 2);
}

static void test_graph_one_rank(void **state) {
    (void)state;
    check(1, 1);
}

static void test_graph_dp4(void **state) {
    (void)state;
    check(4, 1);
}

/* A call reading a tensor the tape does not track is refused by name. */
static void untracked(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_mesh mesh;
    ms_dmesh *dm = NULL;
    if (!MT_OK(r, ms_mesh_parse(&mesh, "1", &err), &err)) return;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    const int64_t s2[2] = {2, 2};
    ms_dtensor w = {0}, x = {0}, y = {0};
    MT_OK(r, param(dm, 2, s2, "[R]", 1, 0.0f, 1.0f, &w, &err), &err);
    MT_OK(r, param(dm, 2, s2, "[R]", 2, 0.0f, 1.0f, &x, &err), &err);
    ms_tape *t = ms_tape_create();
    MT_OK(r, ms_tape_watch(t, &w, &err), &err);
    const ms_eager_opts eo = {.allow_reshard = true};
    MT_OK(r, ms_tape_op(t, MS_OP_MATMUL, NULL, 2, IN(&x, &w), 1, &y, &eo, &err), &err);
    ms_static_graph *s = NULL;
    const ms_dtensor *pp[1] = {&w};
    MT_CHECK(r, ms_tape_to_static(t, &y, 1, pp, &s, &err) != MS_OK, "an untracked input passed");
    MT_CHECK(r, strstr(err.msg, "ms_tape_input") != NULL, "message: %s", err.msg);
    ms_tape_destroy(t);
    ms_dtensor_release(&w), ms_dtensor_release(&x), ms_dtensor_release(&y);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void test_untracked_refused(void **state) {
    (void)state;
    mt_run(1, untracked, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_eager_learns),      cmocka_unit_test(test_graph_dp2_tp2),
    cmocka_unit_test(test_graph_one_rank),    cmocka_unit_test(test_graph_dp4),
    cmocka_unit_test(test_untracked_refused),
};

int main(int argc, char **argv) {
    if (setup(NULL) != 0) {
        fprintf(stderr, "test_to_static: the eager run made no recipe\n");
        return 1;
    }
    int rc = mt_main(argc, argv, "test_to_static", tests, sizeof tests / sizeof tests[0]);
    teardown(NULL);
    return rc;
}

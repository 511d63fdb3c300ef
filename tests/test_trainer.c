/* test_trainer.c - the trainer in process, against references written here.
 *
 * - The optimizer loop: a trainer's parameters after each step equal an AdamW with
 *   global-norm clipping and warmup + cosine decay computed in double precision by this
 *   test, from the gradients of a second program compiled alike (so clipping, the schedule,
 *   the bias corrections and weight decay are checked, not just "it ran").
 * - A switch: a run that switches strategy mid-way ends with the same parameters and both
 *   Adam moments, gathered to full tensors, as a run on the target throughout.
 * - Divergence: a non-finite loss stops the step (MS_ERR_DIVERGED, state untouched) or, with
 *   MS_NONFINITE_SKIP, is skipped and counted.
 * - The strategy check names each problem.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/dtensor.h"
#include "engine/plan/validate.h"
#include "engine/train/trainer.h"
#include "tests/testkit.h"

enum { B = 4, T = 8, STEPS = 6, SWITCH_AT = 3 };

static ms_model_config tiny_config(void) {
    return (ms_model_config){.model_type = MS_MODEL_GPT2,
                             .n_layer = 2,
                             .n_head = 4,
                             .n_embd = 32,
                             .vocab_size = 256,
                             .n_positions = 16,
                             .layer_norm_epsilon = 1e-5};
}

static ms_train_opts tiny_opts(void) {
    return (ms_train_opts){.batch = B,
                           .seq = T,
                           .steps = STEPS,
                           .warmup = 2,
                           .seed = 5,
                           .lr = 3e-3,
                           .min_lr = 3e-4,
                           .weight_decay = 0.1,
                           .clip = 0.5};
}

/* Text the model can learn a little of: a repeated sentence. */
static ms_status open_data(ms_text_data *d, ms_error *err) {
    return mt_repeated_text("In the beginning God created the heaven and the earth. ", T, d, err);
}

/* --- the optimizer loop against a double-precision reference ------------------------------ */

/* The schedule, written from its definition. */
static double ref_lr(const ms_train_opts *o, int step) {
    if (step < o->warmup) return o->lr * (step + 1) / o->warmup;
    if (step >= o->steps) return o->min_lr;
    double r = (double)(step - o->warmup) / (o->steps - o->warmup);
    return o->min_lr + (o->lr - o->min_lr) * 0.5 * (1 + cos(M_PI * r));
}

typedef struct ref_state {
    int n;
    double **p, **m, **v;
    size_t *len;
} ref_state;

static void feed_batch(ms_program *prog, const ms_model *mdl, const ms_text_data *d, uint64_t seed,
                       int step, ms_error *err, mt_rank *r) {
    int32_t ids[B * T], tgt[B * T];
    float f[B * T];
    MT_OK(r, ms_text_data_sample(d, MS_SPLIT_TRAIN, seed, (uint64_t)step, B, 0, B, ids, tgt, err),
          err);
    for (int i = 0; i < B * T; i++) f[i] = (float)ids[i];
    MT_OK(r, ms_program_feed(prog, mdl->ids, f, err), err);
    for (int i = 0; i < B * T; i++) f[i] = (float)tgt[i];
    MT_OK(r, ms_program_feed(prog, mdl->targets, f, err), err);
    for (int i = 0; i < B * T; i++) f[i] = (float)(i % T);
    MT_OK(r, ms_program_feed(prog, mdl->pos, f, err), err);
}

/* One reference step: gradients from prog, AdamW with clipping in double, written back. */
static void ref_step(ms_program *prog, ref_state *rs, const ms_train_opts *o, int step,
                     double *norm_out, double *lr_out) {
    double sumsq = 0;
    for (int i = 0; i < rs->n; i++) {
        ms_param_view pv;
        ms_program_param(prog, i, &pv);
        const float *g = ms_tensor_f32(&pv.grad);
        for (size_t k = 0; k < rs->len[i]; k++) sumsq += (double)g[k] * g[k];
    }
    double norm = sqrt(sumsq);
    double scale = norm > o->clip ? o->clip / (norm + 1e-6) : 1.0;
    double lr = ref_lr(o, step), b1 = 0.9, b2 = 0.95, t = step + 1;
    for (int i = 0; i < rs->n; i++) {
        ms_param_view pv;
        ms_program_param(prog, i, &pv);
        const float *g = ms_tensor_f32(&pv.grad);
        float *p = ms_tensor_f32(&pv.data);
        for (size_t k = 0; k < rs->len[i]; k++) {
            double gk = g[k] * scale;
            rs->p[i][k] -= lr * o->weight_decay * rs->p[i][k];
            rs->m[i][k] = b1 * rs->m[i][k] + (1 - b1) * gk;
            rs->v[i][k] = b2 * rs->v[i][k] + (1 - b2) * gk * gk;
            double mh = rs->m[i][k] / (1 - pow(b1, t)), vh = rs->v[i][k] / (1 - pow(b2, t));
            rs->p[i][k] -= lr * mh / (sqrt(vh) + 1e-8);
            p[k] = (float)rs->p[i][k];
        }
    }
    *norm_out = norm;
    *lr_out = lr;
}

static void optimizer_loop(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, open_data(&d, &err), &err)) return;
    ms_model_config cfg = tiny_config();
    ms_train_opts o = tiny_opts();
    ms_strategy s;
    ms_strategy_init(&s, 1, 1, 1, false, &err);
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, &d, &tr, &err), &err)) return;

    /* The reference: the same model and seed compiled again, so it starts from the same
     * weights and produces the same gradients for the same weights. */
    ms_mesh mesh;
    ms_dmesh *dm = NULL;
    ms_model mdl;
    ms_program *prog = NULL;
    ms_strategy_mesh(&s, &mesh, &err);
    MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err);
    MT_OK(r, ms_model_build(&cfg, B, T, &mdl, &err), &err);
    ms_sharding sh = {.s = &s};
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sh, .seed = o.seed};
    MT_OK(r, ms_program_compile(mdl.g, dm, &co, &prog, &err), &err);
    ref_state rs = {.n = ms_program_num_params(prog)};
    rs.p = xcalloc((size_t)rs.n, sizeof *rs.p), rs.m = xcalloc((size_t)rs.n, sizeof *rs.m);
    rs.v = xcalloc((size_t)rs.n, sizeof *rs.v), rs.len = xcalloc((size_t)rs.n, sizeof *rs.len);
    for (int i = 0; i < rs.n; i++) {
        ms_param_view pv;
        ms_program_param(prog, i, &pv);
        rs.len[i] = (size_t)ms_tensor_numel(&pv.data);
        rs.p[i] = xcalloc(rs.len[i], sizeof(double));
        rs.m[i] = xcalloc(rs.len[i], sizeof(double));
        rs.v[i] = xcalloc(rs.len[i], sizeof(double));
        for (size_t k = 0; k < rs.len[i]; k++) rs.p[i][k] = ms_tensor_f32(&pv.data)[k];
    }
    int clipped = 0;
    for (int step = 0; step < STEPS; step++) {
        ms_step_result res;
        MT_OK(r, ms_trainer_step(tr, &res, &err), &err);
        feed_batch(prog, &mdl, &d, o.seed, step, &err, r);
        float loss;
        MT_OK(r, ms_program_step(prog, &loss, &err), &err);
        double norm, lr;
        ref_step(prog, &rs, &o, step, &norm, &lr);
        clipped += norm > o.clip;
        MT_CHECK(r, res.step == step, "step %d reported as %lld", step, (long long)res.step);
        MT_CHECK(r, fabsf(res.loss - loss) <= 1e-6f * fabsf(loss), "step %d: loss %g, ref %g", step,
                 res.loss, loss);
        MT_CHECK(r, fabs(res.grad_norm - norm) <= 1e-5 * norm, "step %d: norm %g, ref %g", step,
                 res.grad_norm, norm);
        MT_CHECK(r, fabs(res.lr - lr) <= 1e-12 + 1e-9 * lr, "step %d: lr %g, ref %g", step, res.lr,
                 lr);
        /* Parameters after the update, element by element. An AdamW step moves each weight by
         * about lr whatever its gradient, so float against double is judged on that scale:
         * a wrong clip factor, bias correction or decay is off by a good fraction of lr. */
        double worst = 0;
        for (int i = 0; i < rs.n; i++) {
            ms_state_tensor st;
            ms_trainer_state(tr, 3 * i, &st);
            for (size_t k = 0; k < rs.len[i]; k++) {
                double e = fabs(st.local[k] - rs.p[i][k]) - 1e-6 * fabs(rs.p[i][k]);
                worst = e > worst ? e : worst;
            }
        }
        MT_CHECK(r, worst <= 1e-3 * o.lr, "step %d: parameters differ from the reference by %g",
                 step, worst);
    }
    MT_CHECK(r, clipped > 0, "clipping never engaged (norms below %g): the test checks nothing",
             o.clip);
    MT_CHECK(r, ms_trainer_step_index(tr) == STEPS, "step counter %lld",
             (long long)ms_trainer_step_index(tr));
    for (int i = 0; i < rs.n; i++) free(rs.p[i]), free(rs.m[i]), free(rs.v[i]);
    free(rs.p), free(rs.m), free(rs.v), free(rs.len);
    ms_program_destroy(prog);
    ms_model_free(&mdl);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
}

static void test_optimizer_loop(void **state) {
    (void)state;
    mt_run_threads(1, optimizer_loop, NULL);
}

/* --- a switch against the target throughout ----------------------------------------------- */

typedef struct full_state {
    mt_state st;
    float losses[STEPS];
} full_state;

typedef struct switch_arg {
    int from[4], to[4]; /* dp, tp, cp, sp */
    int switch_at;      /* STEPS: no switch */
    full_state *out;
} switch_arg;

static void switch_run(mt_rank *r, void *arg) {
    switch_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, open_data(&d, &err), &err)) return;
    ms_model_config cfg = tiny_config();
    ms_train_opts o = tiny_opts();
    ms_strategy from, to;
    MT_OK(r, ms_strategy_init(&from, a->from[0], a->from[1], a->from[2], a->from[3], &err), &err);
    MT_OK(r, ms_strategy_init(&to, a->to[0], a->to[1], a->to[2], a->to[3], &err), &err);
    ms_trainer *tr = NULL;
    if (!MT_OK(r,
               ms_trainer_create(r->ctx, &cfg, a->switch_at < STEPS ? &from : &to, NULL, &o, &d,
                                 &tr, &err),
               &err))
        return;
    for (int step = 0; step < STEPS; step++) {
        if (step == a->switch_at) MT_OK(r, ms_trainer_switch(tr, &to, NULL, &err), &err);
        ms_step_result res;
        MT_OK(r, ms_trainer_step(tr, &res, &err), &err);
        if (r->ctx->rank == 0) a->out->losses[step] = res.loss;
    }
    char runs[MS_STRATEGY_NAME_MAX], want[MS_STRATEGY_NAME_MAX];
    MT_CHECK(r, ms_strategy_equal(ms_trainer_strategy(tr), &to), "runs %s, expected %s",
             ms_strategy_name(ms_trainer_strategy(tr), runs, sizeof runs),
             ms_strategy_name(&to, want, sizeof want));
    mt_gather_state(r, tr, &a->out->st, &err);
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
}

/* Every state tensor (parameters, m, v) of the switched run against the target throughout. */
static void check_switch(const int from[4], const int to[4]) {
    full_state sw = {0}, ref = {0};
    switch_arg a = {.switch_at = SWITCH_AT, .out = &sw}, b = {.switch_at = STEPS, .out = &ref};
    memcpy(a.from, from, sizeof a.from), memcpy(a.to, to, sizeof a.to);
    memcpy(b.from, to, sizeof b.from), memcpy(b.to, to, sizeof b.to);
    /* Threads, or the MPI processes of test_trainer_mpi: the ranks gather to world rank 0. */
    mt_run(4, switch_run, &a);
    mt_run(4, switch_run, &b);
    if (mt_world_rank() != 0) return;
    for (int s = 0; s < STEPS; s++)
        if (fabsf(sw.losses[s] - ref.losses[s]) > 2e-5f * (1 + s) * fabsf(ref.losses[s]))
            fail_msg("step %d: loss %.7f switched, %.7f throughout", s, sw.losses[s],
                     ref.losses[s]);
    mt_state_check(&sw.st, &ref.st, tiny_opts().lr);
    mt_state_free(&sw.st), mt_state_free(&ref.st);
}

static void test_switch_dp4_to_dp2_tp2(void **state) {
    (void)state;
    check_switch((int[4]){4, 1, 1, 0}, (int[4]){2, 2, 1, 0});
}

static void test_switch_tp2_cp2_to_tp4_sp(void **state) {
    (void)state;
    check_switch((int[4]){1, 2, 2, 0}, (int[4]){1, 4, 1, 1});
}

/* --- divergence ------------------------------------------------------------------------------ */

static void diverge(mt_rank *r, void *arg) {
    ms_on_nonfinite policy = *(ms_on_nonfinite *)arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, open_data(&d, &err), &err)) return;
    ms_model_config cfg = tiny_config();
    ms_train_opts o = tiny_opts();
    o.on_nonfinite = policy;
    ms_strategy s;
    ms_strategy_init(&s, 2, 1, 1, false, &err);
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, &d, &tr, &err), &err)) return;
    ms_step_result res;
    MT_OK(r, ms_trainer_step(tr, &res, &err), &err);
    /* Poison one weight on every rank (it is replicated over dp). */
    ms_state_tensor p, m;
    ms_trainer_state(tr, 0, &p);
    ms_trainer_state(tr, 1, &m);
    p.local[0] = NAN;
    float m1 = m.local[1];
    ms_status st = ms_trainer_step(tr, &res, &err);
    if (policy == MS_NONFINITE_STOP) {
        MT_CHECK(r, st == MS_ERR_DIVERGED, "a NaN weight gave status %d", (int)st);
        MT_CHECK(r, strstr(err.msg, "step 1") && strstr(err.msg, "--lr"),
                 "the message names neither the step nor the fix: %s", err.msg);
        MT_CHECK(r, ms_trainer_step_index(tr) == 1, "the step counter moved on a failed step");
    } else {
        MT_CHECK(r, st == MS_OK && res.skipped, "skip policy: status %d, skipped %d", (int)st,
                 res.skipped);
        MT_CHECK(r, ms_trainer_skipped(tr) == 1 && ms_trainer_step_index(tr) == 2,
                 "skipped %lld, step %lld", (long long)ms_trainer_skipped(tr),
                 (long long)ms_trainer_step_index(tr));
    }
    MT_CHECK(r, m.local[1] == m1, "the Adam moment changed on a non-finite step");
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
}

static void test_diverged_stops(void **state) {
    (void)state;
    ms_on_nonfinite p = MS_NONFINITE_STOP;
    mt_run_threads(2, diverge, &p);
}

static void test_diverged_skips(void **state) {
    (void)state;
    ms_on_nonfinite p = MS_NONFINITE_SKIP;
    mt_run_threads(2, diverge, &p);
}

/* --- the strategy check ---------------------------------------------------------------------- */

/* The trainer asks the validator (engine/plan/validate.h) for its world, batch and sequence. */
static void expect_refusal(int dp, int tp, int cp, int world, int batch, const char *words) {
    ms_model_config cfg = tiny_config();
    ms_train_opts o = tiny_opts();
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&s, dp, tp, cp, false, &err), MS_OK);
    ms_job_shape job = {.world = world, .batch = batch, .seq = o.seq};
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 0, &err), MS_ERR_INVALID);
    if (!strstr(err.msg, words)) fail_msg("expected '%s' in: %s", words, err.msg);
}

static void test_check_strategy(void **state) {
    (void)state;
    ms_model_config cfg = tiny_config();
    ms_train_opts o = tiny_opts();
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&s, 2, 2, 1, false, &err), MS_OK);
    ms_job_shape job = {.world = 4, .batch = o.batch, .seq = o.seq};
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 0, &err), MS_OK);
    expect_refusal(2, 2, 1, 8, B, "needs 4 ranks but the job runs on 8");
    expect_refusal(1, 8, 1, 8, B, "8"); /* 8 does not divide 4 heads */
    expect_refusal(8, 1, 1, 8, B, "not divisible by dp 8");
    o.lr = 1e-4, o.min_lr = 1e-3;
    assert_int_equal(ms_train_opts_check(&o, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "--min-lr"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_check_strategy),        cmocka_unit_test(test_optimizer_loop),
    cmocka_unit_test(test_switch_dp4_to_dp2_tp2), cmocka_unit_test(test_switch_tp2_cp2_to_tp4_sp),
    cmocka_unit_test(test_diverged_stops),        cmocka_unit_test(test_diverged_skips),
};
MT_MAIN("trainer", tests)

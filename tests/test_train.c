/* test_train.c - a small GPT trained on several meshes gives the numbers of one rank.
 *
 * The reference is the same model and data on a single rank. Each strategy (dp2, tp2,
 * tp2+sp, dp2xtp2, dp4, tp4, dp2xtp2+sp on 8 ranks, cp, BERT, and the head replicated over tp)
 * runs the same steps; losses must match within 1e-5 relative and the final parameters,
 * gathered to full tensors, within 1e-5. Runs on the threads backend, and under mpirun for the
 * strategies that fit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "engine/optim/optim.h"
#include "tests/testkit.h"

#define STEPS      20
#define MAX_PARAMS 64

enum { B = 4, T = 8 };

typedef struct run_out {
    float losses[STEPS];
    int nparams;
    char names[MAX_PARAMS][96];
    float *params[MAX_PARAMS]; /* full tensors, owned */
    int64_t sizes[MAX_PARAMS];
} run_out;

typedef struct run_arg {
    int dp, tp, cp;
    bool sp;
    run_out *out; /* written by world rank 0 */
    bool bert;
    bool head_replicated; /* the word embedding / head whole on every tp rank */
} run_arg;

static ms_model_config tiny_config(bool bert) {
    ms_model_config c = {.model_type = bert ? MS_MODEL_BERT : MS_MODEL_GPT2,
                         .n_layer = 2,
                         .n_head = 4,
                         .n_embd = 32,
                         .vocab_size = 64,
                         .n_positions = 16,
                         .layer_norm_epsilon = 1e-5};
    return c;
}

static void batch(int step, float *ids, float *tgt, float *pos) {
    for (int i = 0; i < B * T; i++) {
        /* Rows count up in steps of 3 from a random start: a masked token is predictable
         * from its neighbours, and the next-token map below is learnable too. */
        int start = (int)(ms_philox_uniform(7, (uint64_t)step, (uint64_t)(i / T)) * 64);
        ids[i] = (float)((start + 3 * (i % T)) % 64);
        tgt[i] = (float)(((int)ids[i] * 7 + 3) % 64); /* a learnable map */
        pos[i] = (float)(i % T);
    }
}

static void train(mt_rank *r, void *p) {
    run_arg *a = p;
    ms_ctx *ctx = r->ctx;
    ms_error err = {0};
    ms_strategy s;
    if (!MT_OK(r, ms_strategy_init(&s, a->dp, a->tp, a->cp, a->sp, &err), &err)) return;
    s.head_replicated = a->head_replicated;
    ms_mesh mesh;
    ms_strategy_mesh(&s, &mesh, &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(ctx, &mesh, &dm, &err), &err)) return;
    ms_model_config cfg = tiny_config(a->bert);
    ms_model m;
    if (!MT_OK(r, ms_model_build(&cfg, B, T, &m, &err), &err)) return;
    ms_program *prog;
    ms_sharding sh = {.s = &s};
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sh, .seed = 42};
    if (!MT_OK(r, ms_program_compile(m.g, dm, &co, &prog, &err), &err)) return;
    float ids[B * T], tgt[B * T], pos[B * T], mlm_pos[B * T];
    ms_sgd_opts sgd = {.lr = a->bert ? 0.1f : 0.5f};
    for (int step = 0; step < STEPS && r->failures == 0; step++) {
        batch(step, ids, tgt, pos);
        if (a->bert) {
            int32_t iid[B * T], itg[B * T];
            for (int i = 0; i < B * T; i++) iid[i] = (int32_t)ids[i];
            ms_model_mlm_mask(&m, 5, (uint64_t)step, iid, itg);
            for (int i = 0; i < B * T; i++) ids[i] = (float)iid[i];
            ms_model_head_inputs(&m, B, itg, tgt, mlm_pos);
            ms_program_feed(prog, m.mlm_pos, mlm_pos, &err);
        }
        ms_program_feed(prog, m.ids, ids, &err);
        ms_program_feed(prog, m.targets, tgt, &err);
        ms_program_feed(prog, m.pos, pos, &err);
        float loss = 0;
        if (!MT_OK(r, ms_program_step(prog, &loss, &err), &err)) break;
        for (int i = 0; i < ms_program_num_params(prog); i++) {
            ms_param_view pv;
            ms_program_param(prog, i, &pv);
            size_t n = (size_t)ms_tensor_numel(&pv.data);
            ms_sgd_step(ms_tensor_f32(&pv.data), ms_tensor_f32(&pv.grad), NULL, n, &sgd, &err);
        }
        if (ctx->rank == 0 && dm->index >= 0) a->out->losses[step] = loss;
    }
    /* Gather every parameter to a full tensor. */
    for (int i = 0; i < ms_program_num_params(prog) && i < MAX_PARAMS; i++) {
        ms_param_view pv;
        ms_program_param(prog, i, &pv);
        ms_dtensor t = {.ndim = pv.gshape.ndim, .mesh = dm, .pl = pv.pl, .local = pv.data};
        memcpy(t.gshape, pv.gshape.d, sizeof t.gshape);
        ms_tensor full;
        if (!MT_OK(r, ms_dtensor_full(&t, &full, &err), &err)) break;
        if (ctx->rank == 0) {
            run_out *o = a->out;
            snprintf(o->names[i], sizeof o->names[i], "%s", pv.name);
            o->sizes[i] = ms_tensor_numel(&full);
            o->params[i] = xmalloc(sizeof(float) * (size_t)o->sizes[i]);
            memcpy(o->params[i], ms_tensor_f32(&full), sizeof(float) * (size_t)o->sizes[i]);
            o->nparams = i + 1;
        }
        ms_tensor_release(&full);
    }
    ms_program_destroy(prog);
    ms_model_free(&m);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void free_out(run_out *o) {
    for (int i = 0; i < o->nparams; i++) free(o->params[i]);
}

static run_out references[2];
static bool have_reference[2];

static void compare_run(int dp, int tp, int cp, bool sp, bool bert, bool head_replicated) {
    run_out *ref = &references[bert];
    if (!have_reference[bert]) {
        /* The reference: one rank on the threads backend, in every process. */
        run_arg ra = {.dp = 1, .tp = 1, .cp = 1, .out = ref, .bert = bert};
        mt_run_threads(1, train, &ra);
        have_reference[bert] = true;
    }
    run_out got = {0};
    run_arg a = {.dp = dp,
                 .tp = tp,
                 .cp = cp,
                 .sp = sp,
                 .out = &got,
                 .bert = bert,
                 .head_replicated = head_replicated};
    mt_run(dp * tp * cp, train, &a);
    if (mt_backend() == MS_BACKEND_MPI && mt_world_rank() != 0) {
        free_out(&got);
        return;
    }
    for (int s = 0; s < STEPS; s++) {
        double want = ref->losses[s], have = got.losses[s];
        if (!(fabs(have - want) <= 1e-5 * fabs(want)))
            fail_msg("dp%d x tp%d%s x cp%d step %d: loss %.8f, one rank %.8f", dp, tp,
                     sp ? "+sp" : "", cp, s, have, want);
    }
    assert_int_equal(got.nparams, ref->nparams);
    for (int i = 0; i < got.nparams; i++) {
        assert_string_equal(got.names[i], ref->names[i]);
        for (int64_t k = 0; k < got.sizes[i]; k++) {
            double w = ref->params[i][k], h = got.params[i][k];
            if (!(fabs(h - w) <= 1e-5 * (1 + fabs(w))))
                fail_msg("dp%d x tp%d%s: %s[%lld] = %.8f, one rank %.8f", dp, tp, sp ? "+sp" : "",
                         got.names[i], (long long)k, h, w);
        }
    }
    /* The GPT runs really trained: the loss fell. (The tiny BERT needs more than 20 plain
     * SGD steps to learn its masked task; its check is the equivalence above.) */
    if (!bert && !(ref->losses[STEPS - 1] < ref->losses[0]))
        fail_msg("the one-rank run did not learn: loss %.4f -> %.4f", ref->losses[0],
                 ref->losses[STEPS - 1]);
    free_out(&got);
}

static void compare_model(int dp, int tp, int cp, bool sp, bool bert) {
    compare_run(dp, tp, cp, sp, bert, false);
}

static void compare(int dp, int tp, bool sp) {
    compare_model(dp, tp, 1, sp, false);
}

static void dp2(void **s) {
    (void)s;
    compare(2, 1, false);
}
static void tp2(void **s) {
    (void)s;
    compare(1, 2, false);
}
static void tp2_sp(void **s) {
    (void)s;
    compare(1, 2, true);
}
static void dp2_tp2(void **s) {
    (void)s;
    compare(2, 2, false);
}
static void dp4(void **s) {
    (void)s;
    compare(4, 1, false);
}
static void tp4(void **s) {
    (void)s;
    compare(1, 4, false);
}
static void dp2_tp2_sp_8(void **s) {
    (void)s;
    compare(4, 2, true);
}
static void dp2_tp2_cp2(void **s) {
    (void)s;
    compare_model(2, 2, 2, false, false);
}
static void tp2_sp_cp2(void **s) {
    (void)s;
    compare_model(1, 2, 2, true, false);
}
static void bert_dp2_tp2(void **s) {
    (void)s;
    compare_model(2, 2, 1, false, true);
}
/* The head replicated over tp ("head_replicated": true): the lookup whole on every tp rank,
 * the logits and loss of each rank's own rows (under sp its sequence shard) */
static void tp2_head_replicated(void **s) {
    (void)s;
    compare_run(1, 2, 1, false, false, true);
}
static void dp2_tp2_sp_head_replicated(void **s) {
    (void)s;
    compare_run(2, 2, 1, true, false, true);
}
static void bert_tp2_sp_head_replicated(void **s) {
    (void)s;
    compare_run(1, 2, 1, true, true, true);
}

/* Dropout's draws: a step's masks are a function of the run seed and the step (the same step
 * twice gives the same loss, the next step another), and evaluation passes values through (the
 * loss of the same weights without dropout). */
static float forward_loss(ms_program *prog, const ms_model *m, bool training, uint64_t step) {
    float ids[B * T], tgt[B * T], pos[B * T], loss = 0;
    ms_error err = {0};
    batch(0, ids, tgt, pos);
    assert_int_equal(ms_program_feed(prog, m->ids, ids, &err), MS_OK);
    assert_int_equal(ms_program_feed(prog, m->targets, tgt, &err), MS_OK);
    assert_int_equal(ms_program_feed(prog, m->pos, pos, &err), MS_OK);
    ms_program_set_dropout(prog, training, step);
    assert_int_equal(ms_program_forward(prog, &loss, &err), MS_OK);
    return loss;
}

static void dropout_draws(mt_rank *r, void *p) {
    (void)p;
    ms_error err = {0};
    ms_strategy s;
    ms_mesh mesh;
    ms_dmesh *dm;
    if (!MT_OK(r, ms_strategy_init(&s, 1, 1, 1, false, &err), &err)) return;
    ms_strategy_mesh(&s, &mesh, &err);
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    float plain = 0;
    for (int drop = 1; drop >= 0; drop--) {
        ms_model_config cfg = tiny_config(false);
        cfg.embd_pdrop = cfg.resid_pdrop = cfg.attn_pdrop = drop ? 0.3 : 0;
        ms_model m;
        ms_program *prog;
        if (!MT_OK(r, ms_model_build(&cfg, B, T, &m, &err), &err)) break;
        ms_sharding sh = {.s = &s};
        ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sh, .seed = 42};
        if (!MT_OK(r, ms_program_compile(m.g, dm, &co, &prog, &err), &err)) {
            ms_model_free(&m);
            break;
        }
        if (drop) {
            float s0 = forward_loss(prog, &m, true, 0), again = forward_loss(prog, &m, true, 0);
            float s1 = forward_loss(prog, &m, true, 1);
            MT_CHECK(r, s0 == again, "step 0 twice: %.7f then %.7f", s0, again);
            MT_CHECK(r, s0 != s1, "steps 0 and 1 drew the same masks (loss %.7f)", s0);
            plain = forward_loss(prog, &m, false, 0);
        } else {
            float want = forward_loss(prog, &m, true, 0);
            MT_CHECK(r, plain == want, "evaluation with dropout: %.7f, without dropout %.7f", plain,
                     want);
        }
        ms_program_destroy(prog);
        ms_model_free(&m);
    }
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void dropout_steps_and_evaluation(void **s) {
    (void)s;
    mt_run_threads(1, dropout_draws, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(dp2),
    cmocka_unit_test(tp2),
    cmocka_unit_test(tp2_sp),
    cmocka_unit_test(dp2_tp2),
    cmocka_unit_test(dp4),
    cmocka_unit_test(tp4),
    cmocka_unit_test(dp2_tp2_sp_8),
    cmocka_unit_test(bert_dp2_tp2),
    cmocka_unit_test(tp2_head_replicated),
    cmocka_unit_test(dp2_tp2_sp_head_replicated),
    cmocka_unit_test(bert_tp2_sp_head_replicated),
    cmocka_unit_test(dp2_tp2_cp2),
    cmocka_unit_test(tp2_sp_cp2),
    cmocka_unit_test(dropout_steps_and_evaluation),
};
MT_MAIN("train", tests)

/* test_pipeline.c - pipeline parallelism and micro-batches against one rank.
 *
 * Each case trains a few steps under a strategy (pp with its schedules, micro-batches, pp
 * combined with dp and tp, and live switches into and out of a pipeline) and checks every
 * step's loss and every final parameter against a run of the same trainer on one rank with
 * the whole batch at once: losses within 1e-5 relative, all parameters within 1e-5 relative as
 * one vector. The parameters are gathered on world rank 0 as each chunk holds them, so the
 * tied word embedding is checked in both of its copies (first and last stage).
 *
 * Test names end in _wN, the world size they need: the MPI entries filter on it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/dtensor.h"
#include "engine/model/strategy.h"
#include "engine/train/stages.h"
#include "engine/train/trainer.h"
#include "tests/testkit.h"

enum { B = 8, T = 8, STEPS = 3, MAX_PARAMS = 64 };

static ms_model_config config(bool bert) {
    return mt_tiny_config(bert, 0);
}

static ms_train_opts opts(void) {
    return mt_train_opts(B, T, STEPS);
}

static ms_status open_data(ms_text_data *d, ms_error *err) {
    return mt_repeated_text("And God said, Let there be light: and there was light. ", T, d, err);
}

/* The one-rank run: losses and every parameter, full. */
typedef struct reference {
    float losses[STEPS];
    double val;
    int n;
    char names[MAX_PARAMS][96];
    float *data[MAX_PARAMS];
    int64_t len[MAX_PARAMS];
} reference;

typedef struct run_arg {
    bool bert;
    const char *strategy; /* JSON */
    const char *then[2];  /* strategies switched to before steps 1 and 2 (live switches) */
    reference *ref;       /* filled by the reference run, read by the others */
    bool is_ref;
} run_arg;

/* Adds parameter `name`'s squared difference from the one-rank run and its squared norm to
 * sums[0..1], and checks its largest single difference. The relative error is taken over all
 * of a stage's parameters as one vector, ||x - ref|| / ||ref||: sums in another order change
 * an element whose gradient nearly cancels by a fraction of an AdamW step, which a tensor
 * of small values (a bias that started at 0) shows as a large relative error of its own. A
 * misplaced or stale shard is off by whole steps, which the largest difference catches. */
static void compare_param(mt_rank *r, const reference *ref, const char *name, const float *x,
                          int64_t len, double sums[2]) {
    for (int i = 0; i < ref->n; i++) {
        if (strcmp(ref->names[i], name)) continue;
        MT_CHECK(r, ref->len[i] == len, "%s: %lld elements, one rank has %lld", name,
                 (long long)len, (long long)ref->len[i]);
        if (ref->len[i] != len) return;
        double worst = 0, lr = opts().lr;
        for (int64_t k = 0; k < len; k++) {
            double dk = (double)x[k] - ref->data[i][k];
            sums[0] += dk * dk;
            sums[1] += (double)ref->data[i][k] * ref->data[i][k];
            worst = fmax(worst, fabs(dk));
        }
        MT_CHECK(r, worst <= 0.01 * lr, "%s: an element differs by %.3g (rank %d)", name, worst,
                 r->ctx->rank);
        return;
    }
    MT_CHECK(r, false, "%s: no such parameter in the one-rank run", name);
}

static void run(mt_rank *r, void *arg) {
    run_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, open_data(&d, &err), &err)) return;
    ms_model_config cfg = config(a->bert);
    ms_train_opts o = opts();
    ms_strategy s;
    ms_placement_rules rules;
    if (!MT_OK(r,
               ms_strategy_parse_json(a->strategy, strlen(a->strategy), "case", &s, &rules, &err),
               &err)) {
        ms_text_data_close(&d);
        return;
    }
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, &rules, &o, &d, &tr, &err), &err)) {
        ms_text_data_close(&d);
        return;
    }
    reference *ref = a->ref;
    for (int step = 0; step < STEPS; step++) {
        if (step >= 1 && a->then[step - 1]) {
            ms_strategy to;
            ms_placement_rules to_rules;
            const char *j = a->then[step - 1];
            if (MT_OK(r, ms_strategy_parse_json(j, strlen(j), "then", &to, &to_rules, &err), &err))
                MT_OK(r, ms_trainer_switch(tr, &to, &to_rules, &err), &err);
        }
        ms_step_result res;
        if (!MT_OK(r, ms_trainer_step(tr, &res, &err), &err)) break;
        if (a->is_ref)
            ref->losses[step] = res.loss;
        else
            MT_CHECK(r, fabsf(res.loss - ref->losses[step]) <= 1e-5f * fabsf(ref->losses[step]),
                     "%s, step %d: loss %.7f, one rank %.7f", a->strategy, step, res.loss,
                     ref->losses[step]);
    }
    /* Activation memory: the arenas the run needed are the schedule's in-flight bound, no
     * more (the schedule's memory claim, measured) and no fewer (the bound is tight). */
    ms_stages_memory mem;
    ms_trainer_memory(tr, &mem);
    if (ms_trainer_strategy(tr)->pp > 1)
        MT_CHECK(r, mem.held == mem.bound, "%s, stage %d: %d micro-batches held, bound %d",
                 a->strategy, mem.stage, mem.held, mem.bound);
    double val = 0;
    MT_OK(r, ms_trainer_evaluate(tr, MS_SPLIT_VAL, 2, &val, &err), &err);
    if (a->is_ref)
        ref->val = val;
    else
        MT_CHECK(r, fabs(val - ref->val) <= 1e-5 * fabs(ref->val),
                 "%s: validation loss %.7f, one rank %.7f", a->strategy, val, ref->val);
    /* Every parameter as each chunk holds it (both copies of the tied embedding under pp),
     * gathered on world rank 0. */
    double sums[2] = {0, 0};
    int ns = ms_trainer_num_state(tr), root = r->ctx->rank == 0;
    for (int i = 0; i < ns; i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        if (st.kind != MS_STATE_PARAM) continue;
        ms_tensor full = {0};
        if (!MT_OK(r, ms_trainer_state_full(tr, i, &full, &err), &err)) break;
        int64_t len = ms_tensor_numel(&full);
        if (a->is_ref && ref->n < MAX_PARAMS) {
            snprintf(ref->names[ref->n], sizeof ref->names[0], "%s", st.param);
            ref->len[ref->n] = len;
            ref->data[ref->n] = xmalloc(sizeof(float) * (size_t)len);
            memcpy(ref->data[ref->n], ms_tensor_f32(&full), sizeof(float) * (size_t)len);
            ref->n++;
        } else if (!a->is_ref && root) {
            compare_param(r, ref, st.param, ms_tensor_f32(&full), len, sums);
        }
        ms_tensor_release(&full);
    }
    if (!a->is_ref && root)
        MT_CHECK(r, sqrt(sums[0] / sums[1]) <= 1e-5, "%s: the parameters differ by %.3g relative",
                 a->strategy, sqrt(sums[0] / sums[1]));
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
}

static void check_switches(bool bert, const char *strategy, const char *then1, const char *then2,
                           int world) {
    reference ref = {0};
    run_arg ra = {.bert = bert, .strategy = "{\"dp\": 1}", .ref = &ref, .is_ref = true};
    mt_run_threads(1, run, &ra);
    assert_true(ref.n > 0);
    run_arg a = {.bert = bert, .strategy = strategy, .then = {then1, then2}, .ref = &ref};
    mt_run(world, run, &a);
    for (int i = 0; i < ref.n; i++) free(ref.data[i]);
}

static void check(bool bert, const char *strategy, int world) {
    check_switches(bert, strategy, NULL, NULL, world);
}

static void gpt_micro_batches_4_w1(void **state) {
    (void)state;
    check(false, "{\"dp\": 1, \"micro_batches\": 4}", 1);
}
static void gpt_dp2_micro_batches_2_w2(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"micro_batches\": 2}", 2);
}
static void gpt_pp2_m1_w2(void **state) {
    (void)state;
    check(false, "{\"pp\": 2, \"micro_batches\": 1}", 2);
}
static void gpt_pp2_m2_w2(void **state) {
    (void)state;
    check(false, "{\"pp\": 2, \"micro_batches\": 2}", 2);
}
static void gpt_pp2_m4_1f1b_w2(void **state) {
    (void)state;
    check(false, "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"1f1b\"}", 2);
}
static void gpt_pp2_m8_w2(void **state) {
    (void)state;
    check(false, "{\"pp\": 2, \"micro_batches\": 8}", 2);
}
static void gpt_pp2_m4_gpipe_w2(void **state) {
    (void)state;
    check(false, "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"gpipe\"}", 2);
}
static void gpt_pp2_m4_interleaved_v2_w2(void **state) {
    (void)state;
    check(false,
          "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"interleaved\", "
          "\"virtual_stages\": 2}",
          2);
}
static void gpt_pp2_m4_zb_h1_w2(void **state) {
    (void)state;
    check(false, "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"zb-h1\"}", 2);
}
static void gpt_pp4_m8_zb_h1_w4(void **state) {
    (void)state;
    check(false, "{\"pp\": 4, \"micro_batches\": 8, \"schedule\": \"zb-h1\"}", 4);
}
static void bert_tp2_pp2_zb_h1_w4(void **state) {
    (void)state;
    check(true, "{\"tp\": 2, \"pp\": 2, \"micro_batches\": 2, \"schedule\": \"zb-h1\"}", 4);
}
static void gpt_pp2_uneven_layers_w2(void **state) {
    (void)state;
    check(false, "{\"pp\": 2, \"micro_batches\": 2, \"pp_layers\": [1, 3]}", 2);
}
static void gpt_pp4_m4_w4(void **state) {
    (void)state;
    check(false, "{\"pp\": 4, \"micro_batches\": 4}", 4);
}
static void gpt_dp2_pp2_w4(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2}", 4);
}
static void gpt_tp2_pp2_w4(void **state) {
    (void)state;
    check(false, "{\"tp\": 2, \"pp\": 2, \"micro_batches\": 4}", 4);
}
static void gpt_tp2_sp_pp2_w4(void **state) {
    (void)state;
    check(false, "{\"tp\": 2, \"sp\": true, \"pp\": 2, \"micro_batches\": 2}", 4);
}
static void gpt_dp2_tp2_pp2_w8(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"tp\": 2, \"pp\": 2, \"micro_batches\": 2}", 8);
}
static void bert_pp2_m4_w2(void **state) {
    (void)state;
    check(true, "{\"pp\": 2, \"micro_batches\": 4}", 2);
}
static void bert_dp2_pp2_w4(void **state) {
    (void)state;
    check(true, "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"schedule\": \"gpipe\"}", 4);
}

/* Live switches into a pipeline and out of it: dp4, then pp2 x dp2, then dp4 again. */
static void switch_dp4_pp2_dp4_w4(void **state) {
    (void)state;
    check_switches(false, "{\"dp\": 4}", "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2}",
                   "{\"dp\": 4}", 4);
}
static void switch_tp2_pp2_interleaved_to_tp4_w4(void **state) {
    (void)state;
    check_switches(false, "{\"tp\": 4}",
                   "{\"tp\": 2, \"pp\": 2, \"micro_batches\": 2, \"schedule\": \"interleaved\", "
                   "\"virtual_stages\": 2}",
                   "{\"tp\": 4}", 4);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(switch_dp4_pp2_dp4_w4),
    cmocka_unit_test(switch_tp2_pp2_interleaved_to_tp4_w4),
    cmocka_unit_test(gpt_micro_batches_4_w1),
    cmocka_unit_test(gpt_dp2_micro_batches_2_w2),
    cmocka_unit_test(gpt_pp2_m1_w2),
    cmocka_unit_test(gpt_pp2_m2_w2),
    cmocka_unit_test(gpt_pp2_m4_1f1b_w2),
    cmocka_unit_test(gpt_pp2_m8_w2),
    cmocka_unit_test(gpt_pp2_m4_gpipe_w2),
    cmocka_unit_test(gpt_pp2_m4_interleaved_v2_w2),
    cmocka_unit_test(gpt_pp2_m4_zb_h1_w2),
    cmocka_unit_test(gpt_pp4_m8_zb_h1_w4),
    cmocka_unit_test(bert_tp2_pp2_zb_h1_w4),
    cmocka_unit_test(gpt_pp2_uneven_layers_w2),
    cmocka_unit_test(gpt_pp4_m4_w4),
    cmocka_unit_test(gpt_dp2_pp2_w4),
    cmocka_unit_test(gpt_tp2_pp2_w4),
    cmocka_unit_test(gpt_tp2_sp_pp2_w4),
    cmocka_unit_test(gpt_dp2_tp2_pp2_w8),
    cmocka_unit_test(bert_pp2_m4_w2),
    cmocka_unit_test(bert_dp2_pp2_w4),
};

MT_MAIN("test_pipeline", tests)

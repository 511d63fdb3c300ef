/* test_pipeline.c - pipeline parallelism and micro-batches against one rank.
 *
 * Each case trains a few steps under a strategy (pp with its schedules, micro-batches, pp
 * combined with dp and tp, and live switches into and out of a pipeline) and checks losses and
 * every final parameter against one rank (tests/equiv.h).
 *
 * Gradient buckets (bucket_mb) run the same kind of cases with the gradient all-reduces issued
 * during backward (tests/equiv.c also checks that buckets were in fact made).
 *
 * Test names end in _wN, the world size they need: the MPI entries filter on it.
 */
#include "engine/train/stages.h"
#include "tests/equiv.h"
#include "tests/testkit.h"

static void check_switches(bool bert, const char *strategy, const char *then1, const char *then2,
                           int world) {
    mt_equiv_check(bert, strategy, then1, then2, world);
}

static void check(bool bert, const char *strategy, int world) {
    check_switches(bert, strategy, NULL, NULL, world);
}

/* Gradient buckets: sizes that hold every gradient (1 MiB), a few (16 KiB) and less than one
 * weight matrix (2 KiB < 32 x 32 floats), so large gradients go alone and small ones share;
 * with micro-batches the buckets go out during the last backward. */
static void gpt_dp2_bucket1_w2(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"bucket_mb\": 1}", 2);
}
static void gpt_dp2_bucket_small_w2(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"bucket_mb\": 0.002}", 2);
}
static void gpt_dp4_bucket16k_w4(void **state) {
    (void)state;
    check(false, "{\"dp\": 4, \"bucket_mb\": 0.015625}", 4);
}
static void gpt_dp2_tp2_bucket_w4(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"tp\": 2, \"bucket_mb\": 0.004}", 4);
}
static void gpt_dp2_m2_bucket_w2(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"micro_batches\": 2, \"bucket_mb\": 0.004}", 2);
}
static void gpt_dp2_pp2_m4_bucket_w4(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 4, \"bucket_mb\": 0.004}", 4);
}
static void gpt_dp2_pp2_zb_h1_bucket_w4(void **state) {
    (void)state;
    check(false,
          "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 4, \"schedule\": \"zb-h1\", "
          "\"bucket_mb\": 0.002}",
          4);
}
static void gpt_dp2_zero1_bucket_w2(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"zero\": 1, \"bucket_mb\": 0.004}", 2);
}
static void gpt_dp2_recompute_bucket_w2(void **state) {
    (void)state;
    check(false, "{\"dp\": 2, \"recompute\": \"selective\", \"bucket_mb\": 0.004}", 2);
}
static void bert_dp2_bucket_small_w2(void **state) {
    (void)state;
    check(true, "{\"dp\": 2, \"bucket_mb\": 0.002}", 2);
}
static void bert_dp4_bucket1_w4(void **state) {
    (void)state;
    check(true, "{\"dp\": 4, \"bucket_mb\": 1}", 4);
}
static void bert_dp2_pp2_m2_bucket_w4(void **state) {
    (void)state;
    check(true, "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"bucket_mb\": 0.01}", 4);
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
/* Interleaved at the bench's m = 8 (docs/benchmarks.md), and with two ranks per stage: sends
 * posted ahead of their receivers, the outbox reused over a step, peers at one mesh position
 * of the neighbouring stage. (The test model's 4 layers do not split into pp 4 x 2 chunks.) */
static void gpt_pp2_m8_interleaved_v2_w2(void **state) {
    (void)state;
    check(false,
          "{\"pp\": 2, \"micro_batches\": 8, \"schedule\": \"interleaved\", "
          "\"virtual_stages\": 2}",
          2);
}
static void gpt_dp2_pp2_m4_interleaved_v2_w4(void **state) {
    (void)state;
    check(false,
          "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 4, \"schedule\": \"interleaved\", "
          "\"virtual_stages\": 2}",
          4);
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

/* Dropout on (10% at every site): micro-batched and pipelined runs draw the masks of the
 * whole batch, as the one-rank run does. */
static void check_dropout(bool bert, const char *strategy, int world) {
    ms_model_config cfg = mt_tiny_config(bert, 0.1);
    mt_equiv_check_model(&cfg, strategy, NULL, NULL, world);
}
static void gpt_dropout_micro_batches_4_w1(void **state) {
    (void)state;
    check_dropout(false, "{\"dp\": 1, \"micro_batches\": 4}", 1);
}
static void gpt_dropout_dp2_tp2_m2_w4(void **state) {
    (void)state;
    check_dropout(false, "{\"dp\": 2, \"tp\": 2, \"sp\": true, \"micro_batches\": 2}", 4);
}
static void gpt_dropout_dp2_pp2_zb_h1_w4(void **state) {
    (void)state;
    check_dropout(false, "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"schedule\": \"zb-h1\"}",
                  4);
}
static void bert_dropout_pp2_m4_w2(void **state) {
    (void)state;
    check_dropout(true, "{\"pp\": 2, \"micro_batches\": 4}", 2);
}

/* pp 3 on 4 layers: balanced by cost, the head's stage holds one layer (2, 1, 1). */
static void gpt_pp3_balanced_w3(void **state) {
    (void)state;
    int lo, hi;
    ms_model_config cfg = mt_equiv_config(false);
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&s, 1, 1, 1, false, &err), MS_OK);
    s.pp = 3;
    ms_pp_chunk_layers(&cfg, &s, 2, &lo, &hi);
    assert_int_equal(hi - lo, 1);
    check(false, "{\"pp\": 3, \"micro_batches\": 4}", 3);
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
    cmocka_unit_test(gpt_dp2_bucket1_w2),
    cmocka_unit_test(gpt_dp2_bucket_small_w2),
    cmocka_unit_test(gpt_dp4_bucket16k_w4),
    cmocka_unit_test(gpt_dp2_tp2_bucket_w4),
    cmocka_unit_test(gpt_dp2_m2_bucket_w2),
    cmocka_unit_test(gpt_dp2_pp2_m4_bucket_w4),
    cmocka_unit_test(gpt_dp2_pp2_zb_h1_bucket_w4),
    cmocka_unit_test(gpt_dp2_zero1_bucket_w2),
    cmocka_unit_test(gpt_dp2_recompute_bucket_w2),
    cmocka_unit_test(bert_dp2_bucket_small_w2),
    cmocka_unit_test(bert_dp4_bucket1_w4),
    cmocka_unit_test(bert_dp2_pp2_m2_bucket_w4),
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
    cmocka_unit_test(gpt_pp2_m8_interleaved_v2_w2),
    cmocka_unit_test(gpt_dp2_pp2_m4_interleaved_v2_w4),
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
    cmocka_unit_test(gpt_dropout_micro_batches_4_w1),
    cmocka_unit_test(gpt_dropout_dp2_tp2_m2_w4),
    cmocka_unit_test(gpt_dropout_dp2_pp2_zb_h1_w4),
    cmocka_unit_test(bert_dropout_pp2_m4_w2),
    cmocka_unit_test(gpt_pp3_balanced_w3),
};

MT_MAIN("test_pipeline", tests)

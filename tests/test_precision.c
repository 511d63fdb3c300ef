/* test_precision.c - bf16 mixed precision ("precision": "bf16") against fp32.
 *
 *   equivalence  GPT and BERT trained 3 steps in bf16 on one rank, dp2, dp4, tp2, tp2 + sp,
 *                cp2, pp2, ZeRO 1, 2 and 3 (with tp2 too), full and selective recompute, bf16
 *                gradient buckets, and through live switches fp32 <-> bf16, against one rank
 *                in fp32: every loss
 *                within 1e-2 relative (bf16 keeps 8 significant bits: 2^-8 = 0.4% per rounding,
 *                and the loss is an average, so its error stays near one rounding), the
 *                parameters (the fp32 masters) within 1e-2 relative as one vector (measured
 *                0.3-0.45%: at this learning rate three AdamW steps move a weight by up to 45%
 *                of its size, and bf16 gradients change the steps by about 1%), no element off
 *                by more than three steps (AdamW moves an element whose gradient is near zero by
 *                a whole step whichever its sign), and not bit-equal to fp32, which would mean
 *                bf16 never ran
 *   memory       bf16 gradients and parameters (the use copies) take half the bytes of fp32
 *                ones; the fp32 masters count as optimizer state, sharded like the moments
 *                (ZeRO 1 shards them too); on gpt-bench's shape the activation arena plus the
 *                staging area is below 70% of fp32's arena
 *   bytes        every reshard of a bf16 value moves half the bytes of the same reshard in
 *                fp32 (the tp all-reduces among them), and fp32 ones (token ids, the loss)
 *                the same bytes
 *
 * Test names end in _wN, the world size they need: the MPI entries filter on it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/graph/program.h"
#include "engine/model/config.h"
#include "engine/model/strategy.h"
#include "engine/train/stages.h"
#include "engine/train/trainer.h"
#include "tests/equiv.h"
#include "tests/testkit.h"

#ifndef MS_SOURCE_DIR
#define MS_SOURCE_DIR "."
#endif

/* Losses within 1e-2, masters within 1e-2 as one vector, no element off by more than the
 * three steps. */
static mt_equiv_tol bf16_tol(void) {
    mt_equiv_tol t = mt_equiv_exact();
    t.loss = 1e-2;
    t.params = 1e-2;
    t.worst = 3.03 * mt_equiv_opts().lr;
    t.differ = true;
    return t;
}

static void check(bool bert, const char *strategy, const char *then1, const char *then2,
                  int world) {
    ms_model_config cfg = mt_equiv_config(bert);
    mt_equiv_tol tol = bf16_tol();
    mt_equiv_check_tol(&cfg, strategy, then1, then2, world, &tol);
}

#define BF16_CASE(name, bert, json, world)                                                         \
    static void name(void **state) {                                                               \
        (void)state;                                                                               \
        check(bert, json, NULL, NULL, world);                                                      \
    }
#define BF16(mesh) "{" mesh ", \"precision\": \"bf16\"}"

BF16_CASE(gpt_bf16_w1, false, BF16("\"dp\": 1"), 1)
BF16_CASE(bert_bf16_w1, true, BF16("\"dp\": 1"), 1)
BF16_CASE(gpt_dp2_bf16_w2, false, BF16("\"dp\": 2"), 2)
BF16_CASE(gpt_tp2_bf16_w2, false, BF16("\"tp\": 2"), 2)
BF16_CASE(bert_tp2_bf16_w2, true, BF16("\"tp\": 2"), 2)
BF16_CASE(gpt_cp2_bf16_w2, false, BF16("\"cp\": 2"), 2)
BF16_CASE(gpt_pp2_bf16_w2, false, BF16("\"pp\": 2, \"micro_batches\": 2"), 2)
BF16_CASE(gpt_dp2_zero1_bf16_w2, false, BF16("\"dp\": 2, \"zero\": 1"), 2)
BF16_CASE(gpt_dp2_zero2_bf16_w2, false, BF16("\"dp\": 2, \"zero\": 2"), 2)
BF16_CASE(bert_dp2_zero3_bf16_w2, true, BF16("\"dp\": 2, \"zero\": 3"), 2)
BF16_CASE(gpt_dp2_recompute_bf16_w2, false, BF16("\"dp\": 2, \"recompute\": \"full\""), 2)
BF16_CASE(bert_tp2_selective_bf16_w2, true, BF16("\"tp\": 2, \"recompute\": \"selective\""), 2)
BF16_CASE(gpt_dp4_bf16_w4, false, BF16("\"dp\": 4"), 4)
BF16_CASE(gpt_dp4_zero3_bf16_w4, false, BF16("\"dp\": 4, \"zero\": 3"), 4)
BF16_CASE(bert_dp2_tp2_zero1_bf16_w4, true, BF16("\"dp\": 2, \"tp\": 2, \"zero\": 1"), 4)
BF16_CASE(gpt_dp2_tp2_zero3_bf16_w4, false, BF16("\"dp\": 2, \"tp\": 2, \"zero\": 3"), 4)
BF16_CASE(gpt_tp2_sp_bf16_w2, false, BF16("\"tp\": 2, \"sp\": true"), 2)
/* bf16 gradients in buckets (all-reduced, and reduce-scattered under ZeRO 2), issued during
 * the backward; 2 KiB buckets hold several small gradients each */
BF16_CASE(gpt_dp2_bucket_bf16_w2, false, BF16("\"dp\": 2, \"bucket_mb\": 0.002"), 2)
BF16_CASE(bert_dp2_zero2_bucket_bf16_w2, true, BF16("\"dp\": 2, \"zero\": 2, \"bucket_mb\": 1"), 2)
BF16_CASE(gpt_dp2_pp2_bucket_bf16_w4, false,
          BF16("\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"bucket_mb\": 0.01"), 4)

/* Live switches convert: fp32 into bf16 (the masters start from the fp32 parameters) under
 * another mesh and ZeRO stage, then back to fp32 (the masters become the parameters). */
static void switch_fp32_bf16_fp32_w2(void **state) {
    (void)state;
    check(false, "{\"dp\": 2}", BF16("\"tp\": 2"), "{\"dp\": 2, \"zero\": 1}", 2);
}
static void switch_bf16_zero_w4(void **state) {
    (void)state;
    check(true, BF16("\"dp\": 4, \"zero\": 3"), "{\"dp\": 2, \"tp\": 2}",
          BF16("\"dp\": 2, \"tp\": 2, \"zero\": 2"), 4);
}

/* --- memory and bytes, from compiled programs ------------------------------------------------ */

typedef struct compiled_pair {
    const char *strategy;       /* JSON without precision */
    const ms_model_config *cfg; /* NULL: the equivalence model, batch and sequence */
    int batch, seq;
    ms_program_stats st[2];
    ms_trainer_bytes bytes[2];
    int n_bf16;    /* reshards of bf16 values */
    bool bytes_ok; /* each moves half the fp32 program's bytes; fp32 ones the same */
    char bad[256]; /* the first that does not */
} compiled_pair;

static void compile_both(mt_rank *r, void *arg) {
    compiled_pair *cp = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err)) return;
    ms_model_config cfg = cp->cfg ? *cp->cfg : mt_equiv_config(false);
    ms_train_opts o = mt_equiv_opts();
    if (cp->cfg) o.batch = cp->batch, o.seq = cp->seq;
    ms_trainer *tr[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        ms_strategy s;
        ms_placement_rules rules;
        const char *j = cp->strategy;
        if (!MT_OK(r, ms_strategy_parse_json(j, strlen(j), "case", &s, &rules, &err), &err)) break;
        s.precision = k ? MS_PRECISION_BF16 : MS_PRECISION_FP32;
        if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, &rules, &o, &d, &tr[k], &err), &err))
            break;
        if (r->ctx->rank == 0) {
            ms_program_stats_get(ms_trainer_program(tr[k]), &cp->st[k]);
            ms_trainer_state_bytes(tr[k], &cp->bytes[k]);
        }
    }
    if (tr[0] && tr[1] && r->ctx->rank == 0) {
        ms_program *p32 = ms_trainer_program(tr[0]), *p16 = ms_trainer_program(tr[1]);
        cp->bytes_ok = ms_program_num_reshards(p32) == ms_program_num_reshards(p16);
        for (int i = 0; cp->bytes_ok && i < ms_program_num_reshards(p16); i++) {
            ms_reshard_info a, b;
            ms_program_reshard(p32, i, &a);
            ms_program_reshard(p16, i, &b);
            double want = b.dtype == MS_BF16 ? a.coll_bytes / 2 : a.coll_bytes;
            cp->n_bf16 += b.dtype == MS_BF16 && b.coll_bytes > 0;
            if (b.coll_bytes != want || strcmp(a.name, b.name)) {
                cp->bytes_ok = false;
                snprintf(cp->bad, sizeof cp->bad, "%s %s: %.0f bytes in bf16, %.0f in fp32", b.name,
                         ms_dtype_name(b.dtype), b.coll_bytes, a.coll_bytes);
            }
        }
    }
    for (int k = 0; k < 2; k++) ms_trainer_destroy(tr[k]);
    ms_text_data_close(&d);
}

static void memory_dp2_zero1_w2(void **state) {
    (void)state;
    compiled_pair cp = {.strategy = "{\"dp\": 2, \"zero\": 1}"};
    mt_run_threads(2, compile_both, &cp);
    const ms_trainer_bytes *f = &cp.bytes[0], *h = &cp.bytes[1];
    assert_true(f->params > 0 && f->grads > 0);
    /* gradients: bf16, half */
    assert_true(h->grads == f->grads / 2);
    /* parameters: the bf16 use copies, half; the optimizer state gains the fp32 masters,
     * sharded over dp2 like the moments: 4 bytes per element of the shard besides 8 */
    assert_true(h->params == f->params / 2);
    assert_true(fabs(h->optim - 1.5 * f->optim) <= 0.01 * f->optim);
}

/* gpt-bench (configs/gpt-bench.json), batch 8 x 128, one rank: the bf16 arena holds half the
 * bytes of fp32's but for the fp32 values (the loss, token ids) and saved statistics; the
 * staging area adds the largest instruction's operands in fp32. */
static void memory_gpt_bench_w1(void **state) {
    (void)state;
    ms_model_config cfg = mt_source_config("gpt-bench.json");
    compiled_pair cp = {.strategy = "{\"dp\": 1}", .cfg = &cfg, .batch = 8, .seq = 128};
    mt_run_threads(1, compile_both, &cp);
    double act32 = (double)cp.st[0].arena_bytes, arena16 = (double)cp.st[1].arena_bytes,
           act16 = arena16 + (double)cp.st[1].staging_bytes;
    printf("gpt-bench arena: fp32 %.2f MiB; bf16 %.2f MiB + staging %.2f MiB (%.0f%%)\n",
           act32 / 1048576, arena16 / 1048576, (double)cp.st[1].staging_bytes / 1048576,
           100 * act16 / act32);
    assert_true(cp.st[0].staging_bytes == 0);
    assert_true(arena16 < 0.6 * act32);
    assert_true(act16 < 0.7 * act32);
}

/* gpt-bench's bf16 staging area compiled from shapes (the planner's view) for the kernels
 * of `like`, one rank, batch 8 x 128. */
static size_t shapes_staging(const ms_model_config *cfg, ms_device_kind like) {
    ms_strategy s;
    ms_strategy_defaults(&s);
    s.precision = MS_PRECISION_BF16;
    ms_model m;
    ms_error err = {0};
    if (ms_pp_chunk_model(cfg, &s, 8, 128, 0, &m, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_sharding sh = {.s = &s};
    ms_mesh mesh;
    if (ms_strategy_mesh(&s, &mesh, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_compile_opts co = {
        .shard = ms_strategy_shard, .shard_user = &sh, .bf16 = true, .kernels_like = like};
    ms_program *prog = NULL;
    if (ms_program_compile_shapes(m.g, &mesh, NULL, &co, &prog, &err) != MS_OK)
        fail_msg("%s", err.msg);
    ms_program_stats st;
    ms_program_stats_get(prog, &st);
    ms_program_destroy(prog);
    ms_mesh_free(&mesh);
    ms_model_free(&m);
    return st.staging_bytes;
}

/* Instructions whose operator has bf16 kernels on the device need no staging: on the fenced
 * device (CUDA's bf16 kernels) gpt-bench's staging area is what the operators still staged
 * need (the embedding's backward among them), far below the CPU's, where the logits' cross-
 * entropy is the largest; the planner's shapes-only compile for a GPU finds the same size. */
static void staging_only_for_staged_ops_w1(void **state) {
    (void)state;
    ms_model_config cfg = mt_source_config("gpt-bench.json");
    compiled_pair cpu = {.strategy = "{\"dp\": 1}", .cfg = &cfg, .batch = 8, .seq = 128};
    compiled_pair fenced = cpu;
    mt_run_threads(1, compile_both, &cpu);
    mt_run_device(1, MS_DEVICE_FENCED, compile_both, &fenced);
    size_t on_cpu = cpu.st[1].staging_bytes, on_fenced = fenced.st[1].staging_bytes;
    printf("gpt-bench bf16 staging: cpu %.2f MiB, fenced %.2f MiB\n", on_cpu / 1048576.0,
           on_fenced / 1048576.0);
    assert_true(on_fenced > 0);
    assert_true(on_fenced < on_cpu / 4);
    /* Every GPT-2 op has bf16 kernels there, the embedding's included (staging its backward
     * took the table's gradient and the output's, 2.5 MiB); what stages is the loss's mean,
     * its backward the largest: the 8 x 128 losses and their gradient. */
    assert_true(on_fenced == sizeof(float) * 2 * 8 * 128);
    assert_true(shapes_staging(&cfg, MS_DEVICE_CPU) == on_cpu);
    assert_true(shapes_staging(&cfg, MS_DEVICE_CUDA) == on_fenced);
}

static void memory_dp2_w2(void **state) {
    (void)state;
    compiled_pair cp = {.strategy = "{\"dp\": 2}"};
    mt_run_threads(2, compile_both, &cp);
    /* without ZeRO each rank keeps whole masters: 4 more bytes per parameter of optimizer
     * state (8 for the moments) */
    assert_true(cp.bytes[1].params == cp.bytes[0].params / 2);
    assert_true(fabs(cp.bytes[1].optim - 1.5 * cp.bytes[0].optim) <= 0.01 * cp.bytes[0].optim);
    assert_true(cp.bytes[1].grads == cp.bytes[0].grads / 2);
}

static void reshard_bytes(const char *strategy, int world) {
    compiled_pair cp = {.strategy = strategy};
    mt_run_threads(world, compile_both, &cp);
    if (!cp.bytes_ok) fail_msg("%s: %s", strategy, cp.bad);
    assert_true(cp.n_bf16 > 0);
    assert_true(cp.st[1].reshard_bytes < 0.6 * cp.st[0].reshard_bytes);
}

static void bytes_tp2_w2(void **state) {
    (void)state;
    reshard_bytes("{\"tp\": 2}", 2);
}
static void bytes_dp2_tp2_zero3_w4(void **state) {
    (void)state;
    reshard_bytes("{\"dp\": 2, \"tp\": 2, \"zero\": 3}", 4);
}

#define T(name) cmocka_unit_test(name)
static const struct CMUnitTest tests[] = {
    T(gpt_bf16_w1),
    T(bert_bf16_w1),
    T(gpt_dp2_bf16_w2),
    T(gpt_tp2_bf16_w2),
    T(bert_tp2_bf16_w2),
    T(gpt_cp2_bf16_w2),
    T(gpt_pp2_bf16_w2),
    T(gpt_dp2_zero1_bf16_w2),
    T(gpt_dp2_zero2_bf16_w2),
    T(bert_dp2_zero3_bf16_w2),
    T(gpt_dp2_recompute_bf16_w2),
    T(bert_tp2_selective_bf16_w2),
    T(gpt_tp2_sp_bf16_w2),
    T(gpt_dp2_bucket_bf16_w2),
    T(bert_dp2_zero2_bucket_bf16_w2),
    T(gpt_dp2_pp2_bucket_bf16_w4),
    T(gpt_dp4_bf16_w4),
    T(gpt_dp4_zero3_bf16_w4),
    T(bert_dp2_tp2_zero1_bf16_w4),
    T(gpt_dp2_tp2_zero3_bf16_w4),
    T(switch_fp32_bf16_fp32_w2),
    T(switch_bf16_zero_w4),
    T(memory_dp2_zero1_w2),
    T(memory_dp2_w2),
    T(memory_gpt_bench_w1),
    T(staging_only_for_staged_ops_w1),
    T(bytes_tp2_w2),
    T(bytes_dp2_tp2_zero3_w4),
};

MT_MAIN("test_precision", tests)

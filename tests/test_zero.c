/* test_zero.c - ZeRO stages 1, 2 and 3 against one rank, their memory, and switches.
 *
 * Each case trains GPT-2 or BERT a few steps under a ZeRO stage on dp2, dp4, dp2 x tp2 and
 * dp2 x pp2 (two micro-batches: gradients accumulate whole, then reduce-scatter) and checks
 * losses and every final parameter against one rank (tests/equiv.h): sharding the optimizer
 * state, the gradients or the parameters over dp must not change the arithmetic beyond float
 * reassociation; also with zb-h1's split backward and with uneven shards (the balanced
 * split). The switch case moves a run across stages and meshes and must keep the losses of a
 * run on the targets. The memory case measures the state's bytes on each rank's device: under
 * ZeRO 3 on dp4 at most a quarter (plus 10%) of what ZeRO 0 keeps. The state reports its sharded
 * placements, and the optimizer state can live on a device of its own.
 *
 * Test names end in _wN, the world size they need: the MPI entries filter on it.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "engine/dist/placement.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"
#include "engine/train/stages.h"
#include "engine/train/trainer.h"
#include "tests/equiv.h"
#include "tests/testkit.h"

/* One case per model, stage and mesh: e.g. gpt_dp2_tp2_zero3_w4. */
#define ZERO_CASE(name, bert, json, world)                                                         \
    static void name(void **state) {                                                               \
        (void)state;                                                                               \
        mt_equiv_check(bert, json, NULL, NULL, world);                                             \
    }
#define ZERO_STAGES(model, bert, mesh, json_mesh, world)                                           \
    ZERO_CASE(model##_##mesh##_zero1_w##world, bert, "{" json_mesh ", \"zero\": 1}", world)        \
    ZERO_CASE(model##_##mesh##_zero2_w##world, bert, "{" json_mesh ", \"zero\": 2}", world)        \
    ZERO_CASE(model##_##mesh##_zero3_w##world, bert, "{" json_mesh ", \"zero\": 3}", world)
#define ZERO_MESHES(model, bert)                                                                   \
    ZERO_STAGES(model, bert, dp2, "\"dp\": 2", 2)                                                  \
    ZERO_STAGES(model, bert, dp4, "\"dp\": 4", 4)                                                  \
    ZERO_STAGES(model, bert, dp2_tp2, "\"dp\": 2, \"tp\": 2", 4)                                   \
    ZERO_STAGES(model, bert, dp2_pp2, "\"dp\": 2, \"pp\": 2, \"micro_batches\": 2", 4)

ZERO_MESHES(gpt, false)
ZERO_MESHES(bert, true)

/* tp2 with sp and cp2 combine too (one stage each is enough: the placements nest alike). */
ZERO_CASE(gpt_dp2_tp2_sp_zero3_w4, false, "{\"dp\": 2, \"tp\": 2, \"sp\": true, \"zero\": 3}", 4)
ZERO_CASE(gpt_dp2_cp2_zero2_w4, false, "{\"dp\": 2, \"cp\": 2, \"zero\": 2}", 4)

/* zb-h1 runs each backward in two passes: ZeRO 3 gathers for both. */
ZERO_CASE(gpt_dp2_pp2_zb_h1_zero3_w4, false,
          "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"schedule\": \"zb-h1\", \"zero\": 3}", 4)

/* Uneven shards (the balanced split): n_embd 30 and 17 positions over dp4 give rows of 8, 8,
 * 7, 7 and 5, 4, 4, 4; over dp2 x tp2 the position embedding splits 9, 8. */
static void uneven(const char *strategy, int world) {
    ms_model_config cfg = mt_equiv_config(false);
    cfg.n_embd = 30, cfg.n_head = 2, cfg.n_positions = 17;
    mt_equiv_check_model(&cfg, strategy, NULL, NULL, world);
}
static void gpt_uneven_dp4_zero3_w4(void **state) {
    (void)state;
    uneven("{\"dp\": 4, \"zero\": 3}", 4);
}
static void gpt_uneven_dp4_zero1_w4(void **state) {
    (void)state;
    uneven("{\"dp\": 4, \"zero\": 1}", 4);
}
static void gpt_uneven_dp2_tp2_zero2_w4(void **state) {
    (void)state;
    uneven("{\"dp\": 2, \"tp\": 2, \"zero\": 2}", 4);
}

/* Gradient buckets under ZeRO 2 and 3: reduce-scatter buckets, each member's blocks packed
 * together; small buckets (2 KiB, smaller than a weight) and uneven shards too. */
ZERO_CASE(gpt_dp2_zero2_bucket_w2, false, "{\"dp\": 2, \"zero\": 2, \"bucket_mb\": 0.004}", 2)
ZERO_CASE(gpt_dp4_zero3_bucket_w4, false, "{\"dp\": 4, \"zero\": 3, \"bucket_mb\": 1}", 4)
ZERO_CASE(gpt_dp2_tp2_zero2_bucket_w4, false,
          "{\"dp\": 2, \"tp\": 2, \"zero\": 2, \"bucket_mb\": 0.002}", 4)
ZERO_CASE(gpt_dp2_pp2_zero2_bucket_w4, false,
          "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 4, \"zero\": 2, \"bucket_mb\": 0.004}", 4)
ZERO_CASE(bert_dp2_zero3_bucket_w2, true, "{\"dp\": 2, \"zero\": 3, \"bucket_mb\": 0.002}", 2)
ZERO_CASE(gpt_dp2_zero2_recompute_bucket_w2, false,
          "{\"dp\": 2, \"zero\": 2, \"recompute\": \"full\", \"bucket_mb\": 0.004}", 2)
static void gpt_uneven_dp4_zero2_bucket_w4(void **state) {
    (void)state;
    uneven("{\"dp\": 4, \"zero\": 2, \"bucket_mb\": 0.002}", 4);
}

/* ZeRO with activation recompute: the recomputed forward gathers ZeRO 3's parameters from
 * their shards again (it runs after the forward's gathered copies are gone). */
static void gpt_dp2_zero3_recompute_full_w2(void **state) {
    (void)state;
    mt_equiv_check(false, "{\"dp\": 2, \"zero\": 3, \"recompute\": \"full\"}", NULL, NULL, 2);
}
static void bert_dp2_tp2_zero3_selective_w4(void **state) {
    (void)state;
    mt_equiv_check(true, "{\"dp\": 2, \"tp\": 2, \"zero\": 3, \"recompute\": \"selective\"}", NULL,
                   NULL, 4);
}
static void gpt_dp2_pp2_zb_h1_zero3_recompute_w4(void **state) {
    (void)state;
    mt_equiv_check(false,
                   "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"schedule\": \"zb-h1\", "
                   "\"zero\": 3, \"recompute\": \"full\"}",
                   NULL, NULL, 4);
}
/* Switching into and out of recompute and ZeRO in a running job. */
static void switch_zero_recompute_w4(void **state) {
    (void)state;
    mt_equiv_check(false, "{\"dp\": 4, \"recompute\": \"full\"}",
                   "{\"dp\": 2, \"tp\": 2, \"zero\": 3, \"recompute\": \"selective\"}",
                   "{\"dp\": 4, \"zero\": 1}", 4);
}

/* dp4 ZeRO 0 -> dp4 ZeRO 3 -> dp2 x tp2 ZeRO 1: each step's loss that of a run on the target
 * (the one-rank run, which every target equals). */
static void switch_zero0_zero3_tp2_zero1_w4(void **state) {
    (void)state;
    mt_equiv_check(false, "{\"dp\": 4}", "{\"dp\": 4, \"zero\": 3}",
                   "{\"dp\": 2, \"tp\": 2, \"zero\": 1}", 4);
}

/* --- memory ---------------------------------------------------------------------------------- */

typedef struct mem_arg {
    const char *strategy;
    double state_bytes[4]; /* per rank: parameters, gradients and optimizer state */
} mem_arg;

/* The bytes a trainer keeps on the rank's device beyond its activation arena, measured from
 * the device's counter around its creation. */
static void measure(mt_rank *r, void *arg) {
    mem_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err)) return;
    ms_model_config cfg = mt_equiv_config(false);
    ms_train_opts o = mt_equiv_opts();
    ms_strategy s;
    ms_trainer *tr = NULL;
    if (MT_OK(r, ms_strategy_parse_json(a->strategy, strlen(a->strategy), "m", &s, NULL, &err),
              &err)) {
        size_t before = atomic_load(&r->ctx->device->in_use);
        if (MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, &d, &tr, &err), &err)) {
            ms_stages_memory mem;
            ms_trainer_memory(tr, &mem);
            double kept = (double)(atomic_load(&r->ctx->device->in_use) - before);
            a->state_bytes[r->ctx->rank] = kept - mem.own_arena_bytes;
            ms_step_result res; /* and it trains */
            MT_OK(r, ms_trainer_step(tr, &res, &err), &err);
        }
    }
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
}

static void zero3_memory_dp4_w4(void **state) {
    (void)state;
    if (mt_mpi_world()) skip(); /* the ranks' figures are compared in one process */
    mem_arg z0 = {.strategy = "{\"dp\": 4}"}, z3 = {.strategy = "{\"dp\": 4, \"zero\": 3}"};
    mt_run(4, measure, &z0);
    mt_run(4, measure, &z3);
    for (int i = 0; i < 4; i++) {
        double ratio = z3.state_bytes[i] / z0.state_bytes[i];
        printf("rank %d: ZeRO 0 keeps %.0f bytes, ZeRO 3 %.0f (%.3f)\n", i, z0.state_bytes[i],
               z3.state_bytes[i], ratio);
        assert_true(z0.state_bytes[i] > 0);
        assert_true(ratio <= 0.25 * 1.1);
    }
}

/* The state reports ZeRO's placements: under ZeRO 1 the moments are sharded over dp and the
 * parameters are not; under ZeRO 3 both are. */
static void state_placements(mt_rank *r, void *arg) {
    int stage = *(int *)arg;
    ms_error err = {0};
    ms_model_config cfg = mt_equiv_config(false);
    ms_train_opts o = mt_equiv_opts();
    ms_strategy s;
    ms_strategy_defaults(&s);
    s.dp = 2, s.zero = stage;
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, NULL, &tr, &err), &err)) return;
    for (int i = 0; i < ms_trainer_num_state(tr); i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        bool sharded = st.pl.p[MS_STRATEGY_DP_DIM].kind == MS_PL_SHARD;
        bool want = st.kind != MS_STATE_PARAM || stage == 3;
        MT_CHECK(r, sharded == want, "zero %d: %s (kind %d) %s sharded over dp", stage, st.param,
                 st.kind, sharded ? "is" : "is not");
        int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS], n = 1;
        ms_local_box(&st.pl, &st.mesh->mesh, st.mesh->coords, st.gshape.ndim, st.gshape.d, start,
                     len);
        for (int k = 0; k < st.gshape.ndim; k++) n *= len[k];
        MT_CHECK(r, (size_t)n == st.n, "%s: box of %lld, state of %zu", st.param, (long long)n,
                 st.n);
    }
    ms_trainer_destroy(tr);
}

static void state_placements_w2(void **state) {
    (void)state;
    for (int stage = 1; stage <= 3; stage += 2) mt_run(2, state_placements, &stage);
}

/* The optimizer state on a device of its own (what CPU offload will be): its counter holds
 * exactly the moments, the rank's device none of them, and training is unchanged. */
static void own_device(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_text_data d;
    ms_device *host = NULL;
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err)) return;
    MT_OK(r, ms_device_cpu_create(&host, &err), &err);
    ms_model_config cfg = mt_equiv_config(false);
    ms_strategy s;
    ms_strategy_defaults(&s);
    s.dp = 2, s.zero = 2;
    float loss[2] = {0, 0};
    double on_rank[2] = {0, 0};
    for (int run = 0; run < 2 && host; run++) {
        ms_train_opts o = mt_equiv_opts();
        o.optim_device = run ? host : NULL;
        ms_trainer *tr = NULL;
        size_t before = atomic_load(&r->ctx->device->in_use);
        if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, &d, &tr, &err), &err)) break;
        ms_trainer_bytes b;
        ms_trainer_state_bytes(tr, &b);
        on_rank[run] = (double)(atomic_load(&r->ctx->device->in_use) - before);
        if (run) {
            MT_CHECK(r, (double)atomic_load(&host->in_use) == b.optim,
                     "the optimizer's device holds %zu bytes, the moments are %.0f",
                     atomic_load(&host->in_use), b.optim);
            MT_CHECK(r, on_rank[1] + b.optim == on_rank[0],
                     "the rank's device holds %.0f bytes, %.0f without the moments", on_rank[1],
                     on_rank[0] - b.optim);
        }
        for (int k = 0; k < 2; k++) {
            ms_step_result res = {0};
            MT_OK(r, ms_trainer_step(tr, &res, &err), &err);
            if (run)
                MT_CHECK(r, res.loss == loss[k], "step %d: loss %.7f, %.7f on one device", k,
                         res.loss, loss[k]);
            else
                loss[k] = res.loss;
        }
        ms_trainer_destroy(tr);
    }
    ms_device_destroy(host);
    ms_text_data_close(&d);
}

static void optimizer_device_w2(void **state) {
    (void)state;
    mt_run(2, own_device, NULL);
}

/* The collectives each stage compiles to (from shapes, for dp2 x tp2): the gradient sync is an
 * all-reduce over dp below stage 2 and a reduce-scatter from 2 on; stages 1 and 2 all-gather
 * every parameter after the optimizer; stage 3 gathers every parameter before its uses, forward
 * and backward, and nothing after the optimizer. */
static void collectives_by_stage(void **state) {
    (void)state;
    ms_model_config cfg = mt_equiv_config(false);
    for (int z = 0; z <= 3; z++) {
        ms_strategy s;
        ms_error err = {0};
        ms_strategy_init(&s, 2, 2, 1, false, &err);
        s.zero = z;
        ms_mesh mesh;
        ms_model md = {0};
        ms_program *p = NULL;
        assert_int_equal(ms_strategy_mesh(&s, &mesh, &err), MS_OK);
        assert_int_equal(ms_pp_chunk_model(&cfg, &s, 8, 8, 0, &md, &err), MS_OK);
        ms_sharding sh = {.s = &s};
        ms_compile_opts co = {.shard = ms_strategy_shard,
                              .shard_user = &sh,
                              .zero_stage = z,
                              .zero_dim = MS_STRATEGY_DP_DIM};
        assert_int_equal(ms_program_compile_shapes(md.g, &mesh, NULL, &co, &p, &err), MS_OK);
        int params = ms_program_num_params(p), synced = 0, fwd = 0, bwd = 0, grads = 0;
        for (int i = 0; i < ms_program_num_reshards(p); i++) {
            ms_reshard_info ri;
            assert_int_equal(ms_program_reshard(p, i, &ri), MS_OK);
            const ms_rstep *last = &ri.plan->steps[ri.plan->nsteps - 1];
            if (ri.param_gather) {
                assert_true(z == 3 && last->kind == MS_RSTEP_ALL_GATHER);
                ri.phase == MS_PROG_FORWARD ? fwd++ : bwd++;
            } else if (ri.phase == MS_PROG_PARAM_SYNC) {
                assert_true(last->kind == MS_RSTEP_ALL_GATHER && last->mesh_dim == 0);
                synced++;
            } else if (ri.phase == MS_PROG_GRAD_SYNC && ri.plan->steps[0].mesh_dim == 0) {
                ms_rstep_kind want = z >= 2 ? MS_RSTEP_REDUCE_SCATTER : MS_RSTEP_ALL_REDUCE;
                assert_int_equal(ri.plan->steps[0].kind, want);
                grads++;
            }
        }
        printf("zero %d: %d parameters, %d dp gradient syncs, %d gathered after the optimizer, "
               "%d before forward uses, %d before backward uses\n",
               z, params, grads, synced, fwd, bwd);
        assert_int_equal(grads, params);
        assert_int_equal(synced, z == 1 || z == 2 ? params : 0);
        assert_true(z == 3 ? fwd >= params && bwd >= params : fwd + bwd == 0);
        ms_program_destroy(p);
        ms_model_free(&md);
        ms_mesh_free(&mesh);
    }
}

#define T(name) cmocka_unit_test(name)
#define STAGES(model, mesh, world)                                                                 \
    T(model##_##mesh##_zero1_w##world), T(model##_##mesh##_zero2_w##world),                        \
        T(model##_##mesh##_zero3_w##world)

static const struct CMUnitTest tests[] = {
    STAGES(gpt, dp2, 2),
    STAGES(gpt, dp4, 4),
    STAGES(gpt, dp2_tp2, 4),
    STAGES(gpt, dp2_pp2, 4),
    STAGES(bert, dp2, 2),
    STAGES(bert, dp4, 4),
    STAGES(bert, dp2_tp2, 4),
    STAGES(bert, dp2_pp2, 4),
    T(gpt_dp2_tp2_sp_zero3_w4),
    T(gpt_dp2_cp2_zero2_w4),
    T(gpt_dp2_pp2_zb_h1_zero3_w4),
    T(gpt_uneven_dp4_zero3_w4),
    T(gpt_uneven_dp4_zero1_w4),
    T(gpt_uneven_dp2_tp2_zero2_w4),
    T(gpt_dp2_zero2_bucket_w2),
    T(gpt_dp4_zero3_bucket_w4),
    T(gpt_dp2_tp2_zero2_bucket_w4),
    T(gpt_dp2_pp2_zero2_bucket_w4),
    T(bert_dp2_zero3_bucket_w2),
    T(gpt_dp2_zero2_recompute_bucket_w2),
    T(gpt_uneven_dp4_zero2_bucket_w4),
    T(switch_zero0_zero3_tp2_zero1_w4),
    T(gpt_dp2_zero3_recompute_full_w2),
    T(bert_dp2_tp2_zero3_selective_w4),
    T(gpt_dp2_pp2_zb_h1_zero3_recompute_w4),
    T(switch_zero_recompute_w4),
    T(zero3_memory_dp4_w4),
    T(state_placements_w2),
    T(optimizer_device_w2),
    T(collectives_by_stage),
};

MT_MAIN("test_zero", tests)

/* test_plan_def.c - the planner and the advisor on a model that is not a built-in transformer:
 * a def written against engine/model/model.h alone, priced from its compiled program.
 *
 * The model is a residual MLP classifier (a stem x [16] -> [32], NB blocks h + W2 gelu(W1 h),
 * a head over 10 classes, a mean cross-entropy) whose shard hook splits each block's W1 by
 * columns and W2 by rows over tp. Checked:
 *   - the engine workload's FLOPs and reshards are those of the program a rank compiles with
 *     communicators, and the estimate's model FLOPs those of the whole model on one rank;
 *   - collective bytes per step: none on one device, tp's when tp splits the blocks, dp's
 *     gradient all-reduce under dp;
 *   - the search returns ranked strategies that all pass ms_strategy_check_def, fixed knobs
 *     hold, and the closed form is refused (there is none);
 *   - the validator's memory cap applies to the def;
 *   - the advisor ranks candidates for it: priced suggestions, best first, each valid.
 * The cluster is written here (not measured), so the figures follow from the test alone.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/dist/dmesh.h"
#include "engine/model/model.h"
#include "engine/model/strategy.h"
#include "engine/pipeline/chunks.h"
#include "engine/plan/cluster.h"
#include "engine/plan/cost.h"
#include "engine/plan/search.h"
#include "engine/plan/validate.h"
#include "profiler/advisor.h"
#include "tests/testkit.h"

enum { IN = 16, WIDTH = 32, HID = 64, CLASSES = 10, NB = 4, BATCH = 16 };

/* --- the model ------------------------------------------------------------------------------ */

static int weight(ms_graph *g, const char *name, int64_t a, int64_t b) {
    const int64_t s[2] = {a, b};
    return ms_graph_param(g, name, 2, s, (ms_init){MS_INIT_NORMAL, 0.1f});
}

static int op2(ms_graph *g, int kind, int a, int b) {
    const int in[2] = {a, b};
    return ms_graph_op(g, kind, NULL, 2, in, NULL);
}

static int mlp_block(ms_graph *g, int h, int l) {
    char w1[64], w2[64];
    snprintf(w1, sizeof w1, "blocks.%d.w1", l);
    snprintf(w2, sizeof w2, "blocks.%d.w2", l);
    ms_graph_region_begin(g, MS_REGION_BLOCK);
    int u = op2(g, MS_OP_MATMUL, h, weight(g, w1, WIDTH, HID));
    u = ms_graph_op(g, MS_OP_GELU, NULL, 1, &u, NULL);
    u = op2(g, MS_OP_MATMUL, u, weight(g, w2, HID, WIDTH));
    int y = op2(g, MS_OP_ADD, h, u);
    ms_graph_region_end(g, MS_REGION_BLOCK);
    return y;
}

static ms_status mlp_chunk(const ms_model_def *d, int rows, const ms_model_chunk *ch, ms_model *out,
                           ms_error *err) {
    (void)d, (void)err;
    memset(out, 0, sizeof *out);
    out->loss = out->logits = out->hidden_in = out->hidden_out = -1;
    ms_graph *g = out->g = ms_graph_create();
    int h;
    if (ch->first) {
        const int64_t xs[2] = {rows, IN};
        h = op2(g, MS_OP_MATMUL, ms_graph_input(g, "x", 2, xs), weight(g, "stem", IN, WIDTH));
    } else {
        const int64_t hs[2] = {rows, WIDTH};
        h = out->hidden_in = ms_graph_input(g, "hidden_in", 2, hs);
        ms_graph_input_grad(g, h);
    }
    for (int l = ch->layer_lo; l < ch->layer_hi; l++) h = mlp_block(g, h, l);
    if (!ch->last) {
        out->hidden_out = h;
        ms_graph_set_output(g, h);
        return MS_OK;
    }
    const int64_t ls[1] = {rows};
    int label = ms_graph_input(g, "label", 1, ls);
    out->logits = op2(g, MS_OP_MATMUL, h, weight(g, "head", WIDTH, CLASSES));
    int losses = op2(g, MS_OP_XENT, out->logits, label);
    ms_op_attrs all = {.i = {-1}};
    out->loss = ms_graph_op(g, MS_OP_MEAN, &all, 1, &losses, NULL);
    ms_graph_set_loss(g, out->loss);
    return MS_OK;
}

/* w1 by columns, w2 by rows over tp (mesh dim 1). */
static bool mlp_shard(const ms_model_def *d, const ms_strategy *s, const char *name,
                      const ms_shape *shape, int mesh_ndim, ms_placements *pl) {
    (void)d, (void)shape;
    if (s->tp < 2 || mesh_ndim < 2 || strncmp(name, "blocks.", 7)) return false;
    size_t n = strlen(name);
    bool w1 = !strcmp(name + n - 3, ".w1"), w2 = !strcmp(name + n - 3, ".w2");
    if (!w1 && !w2) return false;
    *pl = ms_placements_replicated(mesh_ndim);
    pl->p[1] = ms_pl_shard(w1 ? 1 : 0);
    ms_placements_default_order(pl);
    return true;
}

static const ms_model_hooks mlp_hooks = {.build_chunk = mlp_chunk, .shard = mlp_shard};

static ms_model_def mlp_def(void) {
    ms_model_def d = {.name = "residual-mlp", .hooks = &mlp_hooks, .n_blocks = NB, .ninputs = 2};
    d.inputs[0] = (ms_model_input){.name = "x", .ndim = 1, .shape = {IN}};
    d.inputs[1] = (ms_model_input){.name = "label", .ndim = 0, .integer = true};
    return d;
}

/* --- the cluster and the problem ------------------------------------------------------------ */

/* Thread ranks on 2 cores with made-up but self-consistent measurements. */
static ms_cluster cpu_cluster(void) {
    ms_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "test-cpu");
    snprintf(c.backend, sizeof c.backend, "threads");
    c.cpu = true;
    c.cores = 2;
    c.devices_per_node = 4096;
    c.nodes = 1;
    c.peak_flops[0] = c.peak_flops[1] = 100e9;
    c.gemm_efficiency[0] = c.gemm_efficiency[1] = 1;
    c.vector_flops = 25e9;
    c.mem_bytes = 16e9;
    c.usable_memory_fraction = 0.8;
    c.mem_bw = 20e9;
    c.mem_efficiency = 1;
    c.algo = MS_ALGO_DIRECT;
    const int64_t g[2] = {16, 1024};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int d = 0; d < 2; d++)
                c.gemm[c.n_gemm++] = (ms_gemm_point){g[a], g[b], g[d], (a + b + d) ? 90e9 : 20e9};
    for (int k = 0; k < MS_OPRATE_COUNT; k++) c.oprate[k] = 8e9;
    const ms_coll_kind kinds[4] = {MS_COLL_ALL_REDUCE, MS_COLL_ALL_GATHER, MS_COLL_REDUCE_SCATTER,
                                   MS_COLL_ALL_TO_ALL};
    for (int gsz = 2; gsz <= 4; gsz *= 2)
        for (int k = 0; k < 4; k++)
            c.coll[c.n_coll++] = (ms_coll_point){
                .ranks = 4, .group = gsz, .kind = (uint8_t)kinds[k], .alpha = 40e-6, .busbw = 3e9};
    c.sync[c.n_sync++] = (ms_sync_point){.ranks = 4};
    return c;
}

static ms_plan_problem def_problem(const ms_model_def *d, const ms_cluster *c, int devices) {
    return (ms_plan_problem){.devices = devices,
                             .global_batch = BATCH,
                             .seq = 1,
                             .dtype = MS_PLAN_FP32,
                             .cluster = c,
                             .engine_workloads = true,
                             .def = d};
}

static ms_strategy mesh(int dp, int tp, int pp) {
    ms_strategy s;
    ms_strategy_defaults(&s);
    s.dp = dp, s.tp = tp, s.pp = pp;
    if (pp > 1) s.micro_batches = pp;
    return s;
}

/* --- the engine workload against the program a rank compiles --------------------------------- */

typedef struct prog_arg {
    ms_strategy s;
    double flops; /* rank 0's program */
    int n_reshards;
    double reshard_bytes;
} prog_arg;

static void compile_rank(mt_rank *r, void *p) {
    prog_arg *a = p;
    ms_error err = {0};
    ms_model_def d = mlp_def();
    ms_sharding sh = {.s = &a->s, .def = &d};
    ms_mesh m;
    if (!MT_OK(r, ms_strategy_mesh(&a->s, &m, &err), &err)) return;
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &m, &dm, &err), &err)) return;
    ms_model md;
    ms_program *prog = NULL;
    if (MT_OK(r, ms_pp_chunk_model_def(&d, &a->s, BATCH, 0, &md, &err), &err)) {
        ms_compile_opts co = ms_strategy_compile_opts(&a->s, &sh);
        co.seed = 3;
        if (MT_OK(r, ms_program_compile(md.g, dm, &co, &prog, &err), &err) && r->ctx->rank == 0) {
            ms_program_stats st;
            ms_program_stats_get(prog, &st);
            a->flops = st.flops;
            a->n_reshards = st.n_reshards;
            a->reshard_bytes = st.reshard_bytes;
        }
        ms_program_destroy(prog);
        ms_model_free(&md);
    }
    ms_dmesh_destroy(dm);
    ms_mesh_free(&m);
}

static void engine_matches_program(void **state) {
    (void)state;
    ms_model_def d = mlp_def();
    ms_cluster c = cpu_cluster();
    const int meshes[4][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
    for (int i = 0; i < 4; i++) {
        prog_arg a = {.s = mesh(meshes[i][0], meshes[i][1], 1)};
        int world = meshes[i][0] * meshes[i][1];
        mt_run_threads(world, compile_rank, &a);
        ms_plan_problem pb = def_problem(&d, &c, world);
        ms_plan_engine_stats es;
        ms_error err = {0};
        assert_int_equal(ms_plan_engine_stats_get(&pb, &a.s, &es, &err), MS_OK);
        char txt[MS_STRATEGY_NAME_MAX];
        printf("%-12s program %.6g FLOPs, %d reshards %.0f B; planner %.6g FLOPs, %d reshards "
               "%.0f B\n",
               ms_strategy_name(&a.s, txt, sizeof txt), a.flops, a.n_reshards, a.reshard_bytes,
               es.flops, es.n_reshards, es.reshard_bytes);
        assert_true(a.flops > 0);
        assert_true(fabs(es.flops - a.flops) <= 1e-9 * a.flops);
        assert_int_equal(es.n_reshards, a.n_reshards);
        assert_true(fabs(es.reshard_bytes - a.reshard_bytes) <= 1e-9 * a.reshard_bytes + 1);
        /* the estimate: from the program, rows as tokens, the whole model's FLOPs */
        ms_plan_estimate e;
        assert_int_equal(ms_plan_estimate_one(&pb, &a.s, NULL, &e, &err), MS_OK);
        assert_true(e.from_engine && e.executable && e.fits);
        assert_true(fabs(e.tokens_per_s * e.step_s - BATCH) < 1e-6 * BATCH);
        assert_true(e.mem_params > 0 && e.mem_act > 0);
        if (world == 1) assert_true(fabs(e.model_flops - a.flops) <= 1e-9 * a.flops);
    }
}

/* --- collectives ------------------------------------------------------------------------------ */

static double dim_bytes(const ms_plan_tally *t, ms_plan_dim d) {
    double b = 0;
    for (int k = 0; k < MS_COLL_KIND_COUNT; k++) b += t->coll_bytes[d][k];
    return b;
}

static void collectives_follow_the_mesh(void **state) {
    (void)state;
    ms_model_def d = mlp_def();
    ms_cluster c = cpu_cluster();
    ms_error err = {0};
    ms_plan_tally one, tp2, dp2, pp2;
    ms_plan_problem p1 = def_problem(&d, &c, 1), p2 = def_problem(&d, &c, 2);
    ms_strategy s11 = mesh(1, 1, 1), st = mesh(1, 2, 1), sd = mesh(2, 1, 1), sp = mesh(1, 1, 2);
    assert_int_equal(ms_plan_tally_get(&p1, &s11, false, &one, &err), MS_OK);
    assert_int_equal(ms_plan_tally_get(&p2, &st, false, &tp2, &err), MS_OK);
    assert_int_equal(ms_plan_tally_get(&p2, &sd, false, &dp2, &err), MS_OK);
    assert_int_equal(ms_plan_tally_get(&p2, &sp, false, &pp2, &err), MS_OK);
    double total = 0;
    for (int dim = 0; dim < MS_PLAN_DIM_COUNT; dim++) total += dim_bytes(&one, (ms_plan_dim)dim);
    printf("collective bytes per step: dp1 x tp1 %.0f; tp2 %.0f (tp); dp2 %.0f (dp); pp2 %.0f "
           "(pp)\n",
           total, dim_bytes(&tp2, MS_PLAN_TP), dim_bytes(&dp2, MS_PLAN_DP),
           dim_bytes(&pp2, MS_PLAN_PP));
    assert_true(total == 0);
    assert_true(dim_bytes(&tp2, MS_PLAN_TP) > 0);
    assert_true(dim_bytes(&tp2, MS_PLAN_DP) == 0);
    assert_true(dim_bytes(&dp2, MS_PLAN_DP) > 0);
    assert_true(dim_bytes(&dp2, MS_PLAN_TP) == 0);
    assert_true(dim_bytes(&pp2, MS_PLAN_PP) > 0);
    /* tp splits the blocks' weights: fewer parameters on a rank than the whole model */
    assert_true(tp2.mem_params < one.mem_params);
    /* there is no closed form for a program's own model */
    assert_int_equal(ms_plan_tally_get(&p2, &st, true, &tp2, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "residual-mlp"));
}

/* --- the search --------------------------------------------------------------------------- */

static void search_ranks_valid_strategies(void **state) {
    (void)state;
    ms_model_def d = mlp_def();
    ms_cluster c = cpu_cluster();
    ms_plan_problem pb = def_problem(&d, &c, 4);
    ms_plan_search_opts so = {.keep = 50};
    ms_plan_result res;
    ms_error err = {0};
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    printf("residual-mlp on 4 ranks: %ld strategies in %.0f ms; best %s (%.3f ms)\n", res.evaluated,
           res.search_ms, res.n_cands ? res.cands[0].text : "-",
           res.n_cands ? res.cands[0].step_s * 1e3 : 0);
    assert_true(res.n_cands > 1 && res.evaluated >= res.n_cands);
    ms_job_shape job = ms_plan_job(&pb);
    bool tp_seen = false, pp_seen = false, bf16_seen = false;
    for (int i = 0; i < res.n_cands; i++) {
        const ms_plan_estimate *e = &res.cands[i];
        assert_int_equal(ms_strategy_check_def(&e->s, &d, &job, &err), MS_OK);
        assert_true(e->from_engine && e->fits);
        assert_true(e->s.cp == 1 && !e->s.sp);
        if (i) assert_true(res.cands[i - 1].step_s <= e->step_s);
        tp_seen |= e->s.tp > 1, pp_seen |= e->s.pp > 1;
        bf16_seen |= e->s.precision == MS_PRECISION_BF16;
    }
    assert_true(tp_seen || pp_seen || bf16_seen); /* the space is searched, not dp alone */
    assert_non_null(strstr(res.reason, "rows/s"));
    ms_plan_result_free(&res);
    /* fixed knobs hold */
    ms_plan_fixed f;
    assert_int_equal(ms_plan_fixed_parse("tp=2,precision=fp32", &f, &err), MS_OK);
    so.fixed = &f;
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    assert_true(res.n_cands > 0);
    for (int i = 0; i < res.n_cands; i++)
        assert_true(res.cands[i].s.tp == 2 && res.cands[i].s.precision == MS_PRECISION_FP32);
    ms_plan_result_free(&res);
    /* pp beyond the blocks: nothing */
    assert_int_equal(ms_plan_fixed_parse("pp=8", &f, &err), MS_OK);
    pb.devices = 8;
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "residual-mlp"));
}

/* --- the validator ------------------------------------------------------------------------- */

static void memory_cap_applies(void **state) {
    (void)state;
    ms_model_def d = mlp_def();
    ms_job_shape job = {.world = 2, .batch = BATCH, .seq = 1};
    ms_strategy s = mesh(2, 1, 1);
    ms_error err = {0};
    assert_int_equal(ms_strategy_validate_def(&s, &d, &job, 1e9, &err), MS_OK);
    assert_int_equal(ms_strategy_validate_def(&s, &d, &job, 1024, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "over memory"));
    /* the checks still come first */
    s.tp = 3;
    assert_int_equal(ms_strategy_validate_def(&s, &d, &job, 0, &err), MS_ERR_INVALID);
}

/* --- the advisor -------------------------------------------------------------------------- */

static void advisor_ranks_candidates(void **state) {
    (void)state;
    ms_model_def d = mlp_def();
    ms_cluster c = cpu_cluster();
    ms_advisor *adv;
    ms_error err = {0};
    assert_int_equal(ms_advisor_create(&d, 4, BATCH, 64, &c, &adv, &err), MS_OK);
    /* tp 4: an all-reduce per block forward and backward, each paying its latency */
    ms_strategy cur = mesh(1, 4, 1);
    ms_plan_estimate pred;
    assert_int_equal(ms_advisor_predict(adv, &cur, &pred, &err), MS_OK);
    assert_true(pred.comm_s[MS_PLAN_TP] > 0);
    ms_suggestion sg[MS_LIVE_MAX_SUGGESTIONS];
    int n = 0;
    assert_int_equal(ms_advisor_update(adv, &cur, NULL, pred.step_s, 0.05, sg,
                                       MS_LIVE_MAX_SUGGESTIONS, &n, &err),
                     MS_OK);
    printf("advisor on residual-mlp from %.3f ms: %d suggestions", pred.step_s * 1e3, n);
    for (int i = 0; i < n; i++)
        printf("%s %s %.0f%%", i ? "," : ":", sg[i].target, 100 * sg[i].predicted_gain);
    printf("\n");
    assert_true(n >= 1);
    ms_job_shape job = {.world = 4, .batch = BATCH, .seq = 1};
    for (int i = 0; i < n; i++) {
        assert_true(sg[i].predicted_gain >= 0.05 && sg[i].predicted_step_s > 0);
        if (i) assert_true(sg[i - 1].predicted_gain >= sg[i].predicted_gain);
        assert_non_null(strstr(sg[i].memory_check, "fits"));
        ms_strategy t;
        ms_placement_rules *rules = malloc(sizeof *rules);
        assert_int_equal(ms_strategy_parse_json(sg[i].target_json, strlen(sg[i].target_json),
                                                "suggestion", &t, rules, &err),
                         MS_OK);
        free(rules);
        assert_int_equal(ms_strategy_validate_def(&t, &d, &job, 0, &err), MS_OK);
        /* another strategy, or this one with its layout searched */
        assert_true(!ms_strategy_equal(&t, &cur) ||
                    strstr(sg[i].target_json, "\"placements\": \"auto\"") != NULL);
    }
    ms_advisor_destroy(adv);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(engine_matches_program),        cmocka_unit_test(collectives_follow_the_mesh),
    cmocka_unit_test(search_ranks_valid_strategies), cmocka_unit_test(memory_cap_applies),
    cmocka_unit_test(advisor_ranks_candidates),
};

MT_MAIN("plan_def", tests)

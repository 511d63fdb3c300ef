/* test_plan.c - the planner: formulas against hand counts and the published worked example,
 * the engine workload against the engine's own compiled program, the search against brute
 * force, and the advisor's recalibration on a synthetic measurement.
 *
 * Clusters here are written in the test (not measured), so every expected number follows
 * from the test's own figures. The search time for GPT-3 175B on 1024 GPUs is printed, not
 * asserted (docs/benchmarks.md records it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/dist/dmesh.h"
#include "engine/model/gpt.h"
#include "engine/model/lm_def.h"
#include "engine/model/strategy.h"
#include "profiler/advisor.h"
#include "engine/core/device.h"
#include "engine/plan/cluster.h"
#include "engine/plan/cost.h"
#include "engine/plan/search.h"
#include "engine/plan/validate.h"
#include "tests/testkit.h"

#ifndef MS_SOURCE_DIR
#define MS_SOURCE_DIR "."
#endif

/* An advisor for a built-in model's config (its def borrows cfg only while it is made). */
static ms_status lm_advisor(const ms_model_config *cfg, int world, int batch, int seq,
                            const ms_cluster *c, ms_advisor **out, ms_error *err) {
    ms_model_def d;
    MS_CHECK(ms_model_def_from_config(cfg, seq, &d, err));
    return ms_advisor_create(&d, world, batch, seq, c, out, err);
}

static ms_model_config gpt_tiny(void) {
    /* configs/gpt-tiny.json */
    return (ms_model_config){.model_type = MS_MODEL_GPT2,
                             .n_layer = 4,
                             .n_head = 4,
                             .n_embd = 128,
                             .vocab_size = 256,
                             .n_positions = 128,
                             .layer_norm_epsilon = 1e-5};
}

/* A strategy with the planner's knobs: micro-batches per step, the head vocab-parallel (vp) or
 * replicated over tp, and the precision it is priced at. */
static ms_strategy knobs(int dp, int tp, int pp, int cp, bool sp, int zero, bool recompute,
                         int micro_batches, bool vp, ms_plan_dtype dt) {
    ms_strategy s;
    ms_strategy_defaults(&s);
    s.dp = dp, s.tp = tp, s.pp = pp, s.cp = cp, s.sp = sp, s.zero = zero;
    s.recompute = recompute ? MS_RECOMPUTE_FULL : MS_RECOMPUTE_NONE;
    s.micro_batches = micro_batches;
    s.head_replicated = tp > 1 && !vp;
    s.precision = dt == MS_PLAN_BF16 ? MS_PRECISION_BF16 : MS_PRECISION_FP32;
    return s;
}

/* dp x tp (+ sp) (x cp): what the engine runs. */
static ms_strategy engine_strategy(int dp, int tp, int cp, bool sp) {
    return knobs(dp, tp, 1, cp, sp, 0, false, 1, true, MS_PLAN_FP32);
}

static ms_model_config gpt3(void) {
    return (ms_model_config){.model_type = MS_MODEL_GPT2,
                             .n_layer = 96,
                             .n_head = 96,
                             .n_embd = 12288,
                             .vocab_size = 50257,
                             .n_positions = 2048,
                             .layer_norm_epsilon = 1e-5};
}

/* A GPU cluster with round numbers. */
static ms_cluster gpu_cluster(void) {
    ms_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "test-gpu");
    snprintf(c.backend, sizeof c.backend, "nccl");
    c.devices_per_node = 8;
    c.peak_flops[MS_PLAN_FP32] = 20e12;
    c.peak_flops[MS_PLAN_BF16] = 300e12;
    c.gemm_efficiency[MS_PLAN_FP32] = c.gemm_efficiency[MS_PLAN_BF16] = 0.8;
    c.gemm_half_dim = 64;
    c.vector_flops = 20e12;
    c.mem_bytes = 80e9;
    c.usable_memory_fraction = 0.9;
    c.mem_bw = 2e12;
    c.mem_efficiency = 0.8;
    c.intra = (ms_link){.bw = 300e9, .latency = 3e-6, .efficiency = 0.8};
    c.inter = (ms_link){.bw = 25e9, .latency = 6e-6, .efficiency = 0.8};
    c.algo = MS_ALGO_AUTO;
    return c;
}

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
    c.causal_skip = true;
    c.blas_speedup_2 = 1.8;
    const int64_t g[2] = {16, 1024};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int d = 0; d < 2; d++)
                c.gemm[c.n_gemm++] = (ms_gemm_point){g[a], g[b], g[d], (a + b + d) ? 90e9 : 20e9};
    c.attn[c.n_attn++] = (ms_attn_point){.t = 64, .hs = 32, .fwd_s = 20e-6, .bwd_s = 45e-6};
    for (int k = 0; k < MS_OPRATE_COUNT; k++) c.oprate[k] = 8e9;
    const ms_coll_kind kinds[4] = {MS_COLL_ALL_REDUCE, MS_COLL_ALL_GATHER, MS_COLL_REDUCE_SCATTER,
                                   MS_COLL_ALL_TO_ALL};
    for (int gsz = 2; gsz <= 4; gsz *= 2)
        for (int k = 0; k < 4; k++)
            c.coll[c.n_coll++] = (ms_coll_point){
                .ranks = 4, .group = gsz, .kind = (uint8_t)kinds[k], .alpha = 40e-6, .busbw = 3e9};
    c.sync[c.n_sync++] = (ms_sync_point){.ranks = 4, .per_call = 0, .per_byte = 0, .per_phase = 0};
    return c;
}

static ms_plan_problem problem(const ms_model_config *m, const ms_cluster *c, int devices,
                               int batch, int seq, ms_plan_dtype dt) {
    return (ms_plan_problem){.model = *m,
                             .devices = devices,
                             .global_batch = batch,
                             .seq = seq,
                             .dtype = dt,
                             .cluster = c,
                             .engine_workloads = c->cpu};
}

/* --- formulas ------------------------------------------------------------------------------ */

static void zero_worked_example(void **state) {
    (void)state;
    /* Rajbhandari et al. 2020: psi = 7.5B, N_d = 64, mixed-precision Adam (K = 12) */
    const double psi = 7.5e9, want[4] = {120.0, 31.4, 16.6, 1.9};
    for (int stage = 0; stage <= 3; stage++) {
        double p, g, o;
        ms_plan_zero_memory(psi, 64, stage, MS_PLAN_BF16, &p, &g, &o);
        double gb = (p + g + o) / 1e9;
        printf("ZeRO stage %d: %.2f GB (paper %.1f)\n", stage, gb, want[stage]);
        assert_true(fabs(gb - want[stage]) < 0.06);
    }
    /* fp32 training: 4 + 4 + 8 bytes per parameter */
    double p, g, o;
    ms_plan_zero_memory(1e9, 8, 0, MS_PLAN_FP32, &p, &g, &o);
    assert_true(fabs(p + g + o - 16e9) < 1);
    ms_plan_zero_memory(1e9, 8, 3, MS_PLAN_FP32, &p, &g, &o);
    assert_true(fabs(p + g + o - 2e9) < 1);
}

static void flops_against_hand_count(void **state) {
    (void)state;
    ms_model_config c = gpt3();
    const double b = 1536, s = 2048, h = c.n_embd, l = c.n_layer, V = c.vocab_size;
    /* one layer forward, GEMMs only: qkv, scores, weighted values, projection, MLP up, down */
    double layer = 2 * b * s * h * 3 * h + 2 * b * s * s * h + 2 * b * s * s * h +
                   2 * b * s * h * h + 2 * b * s * h * 4 * h + 2 * b * s * 4 * h * h;
    double logits = 2 * b * s * h * V;
    double model = 3 * (l * layer + logits);       /* forward + backward (2x) */
    double recompute = 4 * l * layer + 3 * logits; /* the layers' forward runs twice */
    assert_true(fabs(ms_plan_model_flops(&c, b, s) / model - 1) < 1e-12);
    assert_true(fabs(ms_plan_narayanan_flops(&c, b, s, true) / recompute - 1) < 1e-12);
    /* the paper's 72 variant scales the logits term by 3/4 of the real count */
    double n72 = ms_plan_narayanan_flops(&c, b, s, false);
    assert_true(fabs((model - n72) - 1.5 * b * s * h * V) / model < 1e-12);
    printf("GPT-3 175B, batch 1536: %.4g FLOPs per step (%.4g with recompute)\n", model, recompute);
}

static void params_formula(void **state) {
    (void)state;
    ms_model_config cs[2] = {gpt3(), gpt_tiny()};
    for (int i = 0; i < 2; i++) {
        double f = ms_plan_param_count(&cs[i]);
        double engine = (double)ms_gpt2_param_count(&cs[i]);
        assert_true(fabs(f + 2 * cs[i].n_embd - engine) < 1);
    }
    double p175 = ms_plan_param_count(&cs[0]);
    printf("GPT-3 175B: %.4g parameters\n", p175);
    assert_true(p175 > 174e9 && p175 < 176e9);
}

static void activation_formula(void **state) {
    (void)state;
    /* Korthikanti et al. 2022, one layer, 16-bit: sbh (34 + 5as/h) with no parallelism,
     * sbh (10 + 24/t + 5as/(ht)) with tp, sbh/t (34 + 5as/h) with tp + sp, 2sbh recompute */
    double s = 2048, b = 1, h = 12288, a = 96;
    double none =
        ms_plan_layer_activation_bytes(s, b, h, a, 1, false, 1, false, false, MS_PLAN_BF16);
    assert_true(fabs(none - s * b * h * (34 + 5 * a * s / h)) < 1);
    double tp8 =
        ms_plan_layer_activation_bytes(s, b, h, a, 8, false, 1, false, false, MS_PLAN_BF16);
    assert_true(fabs(tp8 - s * b * h * (10 + 24.0 / 8 + 5 * a * s / (h * 8))) < 1);
    double sp8 = ms_plan_layer_activation_bytes(s, b, h, a, 8, true, 1, false, false, MS_PLAN_BF16);
    assert_true(fabs(sp8 - s * b * h / 8 * (34 + 5 * a * s / h)) < 1);
    double rc = ms_plan_layer_activation_bytes(s, b, h, a, 8, false, 1, true, false, MS_PLAN_BF16);
    assert_true(fabs(rc - 2 * s * b * h) < 1);
    /* context parallelism divides everything by cp (scores: heads move to the cp ranks) */
    double cp2 = ms_plan_layer_activation_bytes(s, b, h, a, 8, true, 2, false, false, MS_PLAN_BF16);
    assert_true(fabs(cp2 - sp8 / 2) < 1);
}

static void ring_and_tree(void **state) {
    (void)state;
    ms_cluster c = gpu_cluster();
    const double S = 64e6;
    double bw = c.intra.bw * c.intra.efficiency, a = c.intra.latency;
    ms_group_place g = ms_cluster_group(&c, 8, 1);
    assert_false(g.crosses_nodes);
    c.algo = MS_ALGO_RING;
    double ring = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, g, S, 8, -1);
    assert_true(fabs(ring - (2 * 7 * a + 2.0 * 7 / 8 * S / bw)) < 1e-12);
    double ag = ms_cluster_coll_time(&c, MS_COLL_ALL_GATHER, g, S, 8, -1);
    assert_true(fabs(ag - (7 * a + 7.0 / 8 * S / bw)) < 1e-12);
    c.algo = MS_ALGO_TREE;
    double tree = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, g, S, 8, -1);
    assert_true(fabs(tree - (2 * 3 * a + 2 * S / bw)) < 1e-12);
    c.algo = MS_ALGO_AUTO;
    assert_true(ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, g, S, 8, -1) ==
                (ring < tree ? ring : tree));
    /* small messages: the tree's log2(n) hops win */
    double small_ring = 2 * 7 * a + 2.0 * 7 / 8 * 1024 / bw;
    assert_true(ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, g, 1024, 8, -1) < small_ring);
    /* a dp group with stride 8 has one member per node: one NIC's bandwidth */
    ms_group_place dp = ms_cluster_group(&c, 16, 8);
    assert_true(dp.crosses_nodes && dp.per_node == 1);
    c.algo = MS_ALGO_RING;
    double ib = c.inter.bw * c.inter.efficiency;
    double t = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, dp, S, 16, -1);
    assert_true(fabs(t - (2 * 15 * c.inter.latency + 2.0 * 15 / 16 * S / ib)) < 1e-12);
    /* with stride 2, 4 members share a node and drive 4 NICs */
    ms_group_place dp2 = ms_cluster_group(&c, 16, 2);
    assert_true(dp2.per_node == 4);
    double t2 = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, dp2, S, 16, -1);
    assert_true(fabs(t2 - (2 * 15 * c.inter.latency + 2.0 * 15 / 16 * S / (4 * ib))) < 1e-12);
}

/* --- topology: hosts joined by a slow link ------------------------------------------------ */

/* Two hosts of two thread ranks each, 100 Mbit/s between hosts per host (two ranks share
 * it), as tests/cluster/netns.sh describes namespace hosts. */
static ms_cluster two_hosts(const char *order) {
    ms_cluster c = cpu_cluster();
    char json[256];
    snprintf(json, sizeof json,
             "{\"hosts\": 2, \"ranks_per_host\": 2, \"rank_order\": \"%s\", "
             "\"inter_node\": {\"bw_gbps\": 0.00625, \"latency_us\": 100, \"efficiency\": 1}}",
             order);
    ms_error err = {0};
    assert_int_equal(ms_cluster_apply_topology(&c, json, strlen(json), "topo.json", &err), MS_OK);
    return c;
}

static void topology_groups_and_links(void **state) {
    (void)state;
    ms_cluster one = cpu_cluster(), c = two_hosts("by-host"), rr = two_hosts("round-robin");
    assert_int_equal(c.nodes, 2);
    assert_int_equal(c.devices_per_node, 2);
    /* by host: ranks 0,1 share host0, so a stride-1 pair stays, a stride-2 pair crosses */
    assert_false(ms_cluster_group(&c, 2, 1).crosses_nodes);
    ms_group_place across = ms_cluster_group(&c, 2, 2);
    assert_true(across.crosses_nodes && across.per_node == 1);
    /* round robin: rank r on host r % 2, the other way round */
    assert_true(ms_cluster_group(&rr, 2, 1).crosses_nodes);
    assert_false(ms_cluster_group(&rr, 2, 2).crosses_nodes);
    ms_group_place all = ms_cluster_group(&rr, 4, 1);
    assert_true(all.crosses_nodes && all.per_node == 2);
    /* one host: nothing crosses */
    assert_false(ms_cluster_group(&one, 4, 1).crosses_nodes);
    /* a crossing group is priced by the inter-host link (a ring), not the shared memory
     * points; a group inside a host keeps the measured points */
    const double S = 1 << 20;
    double t = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, across, S, 4, -1);
    double want = 2 * 1 * c.inter.latency + 2.0 * 1 / 2 * S / c.inter.bw;
    assert_true(fabs(t - want) < 1e-9 * want);
    double inside =
        ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, ms_cluster_group(&c, 2, 1), S, 4, -1);
    assert_true(inside == ms_cluster_coll_time(&one, MS_COLL_ALL_REDUCE,
                                               ms_cluster_group(&one, 2, 1), S, 4, -1));
    assert_true(t > 50 * inside);
    /* bad topologies name the problem */
    ms_error err = {0};
    const char *bad = "{\"hosts\": 2, \"ranks_per_host\": 2}";
    assert_int_equal(ms_cluster_apply_topology(&c, bad, strlen(bad), "t.json", &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "inter_node"));
    bad = "{\"hosts\": 2, \"ranks_per_host\": 2, \"rank_order\": \"zigzag\", \"inter_node\": {}}";
    assert_int_equal(ms_cluster_apply_topology(&c, bad, strlen(bad), "t.json", &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "rank_order"));
    assert_int_equal(c.nodes, 2); /* untouched by a failed apply */
}

/* Ranks that oversubscribe the cores take turns at the link: the link carries both tp groups
 * of a host (their shared time), but one group's compute between collectives runs while the
 * other waits, so that compute comes off the wait, down to the group's own transfer on a free
 * link. A gradient sync (every group enters it together) and ranks with cores of their own
 * pay the shared time. */
static void topology_groups_take_turns(void **state) {
    (void)state;
    ms_cluster c = two_hosts("round-robin");
    ms_group_place tp = ms_cluster_group(&c, 2, 1); /* one member on each host */
    const double S = 1 << 17, a = c.inter.latency;
    double shared = 2 * a + S / c.inter.bw, alone = 2 * a + S / (2 * c.inter.bw);
    double sync = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, tp, S, 4, -1);
    assert_true(fabs(sync - shared) < 1e-9 * shared);
    double short_gap = 0.001; /* the link is the bottleneck: the gap hides under it */
    double t = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, tp, S, 4, short_gap);
    assert_true(shared - short_gap > alone);
    assert_true(fabs(t - (shared - short_gap)) < 1e-9 * shared);
    double long_gap = shared; /* compute is: the wait is the group's own transfer */
    t = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, tp, S, 4, long_gap);
    assert_true(fabs(t - alone) < 1e-9 * alone);
    c.cores = 4; /* a core per rank: the groups cross in lockstep */
    t = ms_cluster_coll_time(&c, MS_COLL_ALL_REDUCE, tp, S, 4, short_gap);
    assert_true(fabs(t - shared) < 1e-9 * shared);
}

/* tp moves activations every layer, dp the gradients once a step: with more activation than
 * gradient traffic the planner wants tp inside a host and dp across, and prices the same
 * dp=2 x tp=2 higher when the rank order puts tp across the slow link. */
static void topology_prefers_tp_within_host(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster byhost = two_hosts("by-host"), rr = two_hosts("round-robin"), one = cpu_cluster();
    ms_strategy s = knobs(2, 2, 1, 1, false, 0, false, 1, false, MS_PLAN_FP32);
    ms_plan_estimate e[3];
    const ms_cluster *cs[3] = {&byhost, &rr, &one};
    ms_error err = {0};
    for (int i = 0; i < 3; i++) {
        ms_plan_problem pb = problem(&cfg, cs[i], 4, 16, 128, MS_PLAN_FP32);
        assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e[i], &err), MS_OK);
    }
    /* by host: tp inside (as on one host), dp across; round robin the other way */
    assert_true(fabs(e[0].comm_s[MS_PLAN_TP] - e[2].comm_s[MS_PLAN_TP]) < 1e-12);
    assert_true(e[0].comm_s[MS_PLAN_DP] > e[2].comm_s[MS_PLAN_DP]);
    assert_true(fabs(e[1].comm_s[MS_PLAN_DP] - e[2].comm_s[MS_PLAN_DP]) < 1e-12);
    assert_true(e[1].comm_s[MS_PLAN_TP] > e[0].comm_s[MS_PLAN_DP]);
    assert_true(e[0].step_s < e[1].step_s);
    /* the search on the by-host cluster never puts a tp group across hosts */
    ms_plan_problem pb = problem(&cfg, &byhost, 4, 16, 128, MS_PLAN_FP32);
    ms_plan_search_opts so = {.keep = 500};
    ms_plan_result res;
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    assert_true(res.cands[0].s.tp <= byhost.devices_per_node);
    ms_plan_result_free(&res);
}

/* --- the engine workload against the engine ------------------------------------------------- */

typedef struct prog_arg {
    int dp, tp, cp;
    bool sp, head_replicated;
    int B, T;
    const ms_model_config *cfg;
    double flops, arena, persist; /* rank 0 */
    int n_reshards;
    double reshard_bytes;
} prog_arg;

static void compile_rank(mt_rank *r, void *p) {
    prog_arg *a = p;
    ms_error err = {0};
    ms_strategy s;
    if (!MT_OK(r, ms_strategy_init(&s, a->dp, a->tp, a->cp, a->sp, &err), &err)) return;
    s.head_replicated = a->head_replicated;
    ms_sharding sh = {.s = &s};
    ms_mesh mesh;
    if (!MT_OK(r, ms_strategy_mesh(&s, &mesh, &err), &err)) return;
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_model m;
    ms_program *prog = NULL;
    if (MT_OK(r, ms_model_build(a->cfg, a->B, a->T, &m, &err), &err)) {
        ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sh, .seed = 3};
        /* the rank the planner reads: dp and tp coordinate 0, the last over cp (its queries
         * see the longest causal prefix: LLaMA's cp keeps them on the sequence shard) */
        if (MT_OK(r, ms_program_compile(m.g, dm, &co, &prog, &err), &err) &&
            r->ctx->rank == a->cp - 1) {
            ms_program_stats st;
            ms_program_stats_get(prog, &st);
            a->flops = st.flops;
            a->arena = (double)st.arena_bytes;
            a->persist = (double)st.param_bytes;
            a->n_reshards = st.n_reshards;
            a->reshard_bytes = st.reshard_bytes;
        }
        ms_program_destroy(prog);
        ms_model_free(&m);
    }
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

/* One strategy of one model: the program a rank compiles, the planner's reading of it and
 * the closed form agree (FLOPs, reshards, arena). */
static void check_engine_matches(const ms_model_config *cfg, int dp, int tp, int cp, bool sp,
                                 bool head_replicated) {
    ms_cluster c = cpu_cluster();
    const int B = 8, T = 64;
    ms_plan_problem pb = problem(cfg, &c, 4, B, T, MS_PLAN_FP32);
    prog_arg a = {.dp = dp,
                  .tp = tp,
                  .cp = cp,
                  .sp = sp,
                  .head_replicated = head_replicated,
                  .B = B,
                  .T = T,
                  .cfg = cfg};
    mt_run_threads(4, compile_rank, &a);
    ms_strategy s = engine_strategy(dp, tp, cp, sp);
    s.head_replicated = head_replicated;
    ms_plan_engine_stats es;
    ms_error err = {0};
    assert_int_equal(ms_plan_engine_stats_get(&pb, &s, &es, &err), MS_OK);
    char txt[MS_STRATEGY_NAME_MAX];
    printf("%-28s program %.6g FLOPs, %d reshards %.0f B; planner %.6g FLOPs, %d reshards "
           "%.0f B\n",
           ms_strategy_name(&s, txt, sizeof txt), a.flops, a.n_reshards, a.reshard_bytes, es.flops,
           es.n_reshards, es.reshard_bytes);
    assert_true(a.flops > 0);
    assert_true(fabs(es.flops - a.flops) <= 1e-9 * a.flops);
    assert_int_equal(es.n_reshards, a.n_reshards);
    assert_true(fabs(es.reshard_bytes - a.reshard_bytes) <= 1e-9 * a.reshard_bytes + 1);
    assert_true(es.arena_bytes == a.arena && es.persist_bytes == a.persist);
    /* the closed form agrees with the engine's program */
    ms_plan_estimate ee, ea;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &ee, &err), MS_OK);
    assert_true(ee.from_engine);
    ms_plan_problem pa = pb;
    pa.engine_workloads = false;
    assert_int_equal(ms_plan_estimate_one(&pa, &s, NULL, &ea, &err), MS_OK);
    assert_false(ea.from_engine);
    printf("%-28s hardware FLOPs per device: engine %.6g, closed form %.6g\n", txt, ee.hw_flops / 4,
           ea.hw_flops / 4);
    assert_true(fabs(ea.hw_flops / ee.hw_flops - 1) < 1e-3);
}

static void engine_flops_match_program(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    const struct {
        int dp, tp, cp;
        bool sp;
    } cases[] = {{4, 1, 1, false}, {1, 4, 1, false}, {1, 4, 1, true},
                 {2, 2, 1, false}, {2, 2, 1, true},  {2, 1, 2, false},
                 {1, 2, 2, false}, {1, 2, 2, true},  {1, 1, 4, false}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_engine_matches(&cfg, cases[i].dp, cases[i].tp, cases[i].cp, cases[i].sp, false);
}

/* The head replicated over tp ("head_replicated": true), as the engine runs it, on each model
 * family: without sp every tp rank computes the whole head; with sp GPT-2's and BERT's on the
 * sequence shard, LLaMA's on the gathered final norm. */
static void head_replicated_matches_program(void **state) {
    (void)state;
    static const char *const models[] = {"gpt-tiny", "bert-tiny", "llama-tiny"};
    const struct {
        int dp, tp, cp;
        bool sp;
    } cases[] = {{1, 4, 1, false}, {1, 4, 1, true}, {2, 2, 1, true}, {1, 2, 2, true}};
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        char path[512];
        snprintf(path, sizeof path, "%s/configs/%s.json", MS_SOURCE_DIR, models[m]);
        ms_model_config cfg;
        ms_error err = {0};
        if (ms_config_load(path, &cfg, &err) != MS_OK) fail_msg("%s", err.msg);
        printf("%s\n", models[m]);
        /* LLaMA under cp is left out: there the closed form prices 0.3% more than the program
         * with either head (on its causal sequence shard), a gap of its own */
        bool gqa = cfg.model_type == MS_MODEL_LLAMA;
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            if (!(gqa && cases[i].cp > 1))
                check_engine_matches(&cfg, cases[i].dp, cases[i].tp, cases[i].cp, cases[i].sp,
                                     true);
    }
}

/* --- search --------------------------------------------------------------------------------- */

static void search_matches_brute_force(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster c = gpu_cluster();
    ms_plan_problem pb = problem(&cfg, &c, 8, 16, 128, MS_PLAN_BF16);
    ms_plan_result res;
    ms_error err = {0};
    ms_plan_search_opts so = {.keep = 3};
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    /* brute force over the same space, written independently */
    double best = 1e300;
    long n = 0;
    for (int dp = 1; dp <= 8; dp++)
        for (int tp = 1; tp <= 8; tp++)
            for (int pp = 1; pp <= 8; pp++)
                for (int cp = 1; cp <= 8; cp++) {
                    if (dp * tp * pp * cp != 8) continue;
                    for (int sp = 0; sp <= 1; sp++)
                        for (int vp = 0; vp <= 1; vp++)
                            for (int z = 0; z <= 3; z++)
                                for (int rc = 0; rc <= 1; rc++)
                                    for (int bk = 0; bk <= 25; bk += 25)
                                        for (int mb = 1; mb <= 16; mb++) {
                                            if (16 % dp || (16 / dp) % mb) continue;
                                            if (tp == 1 && vp) continue; /* no head to shard */
                                            /* buckets where one collective reduces them */
                                            if (bk && (dp > 1) == (cp > 1)) continue;
                                            ms_strategy s = knobs(dp, tp, pp, cp, sp, z, rc,
                                                                  16 / dp / mb, vp, MS_PLAN_BF16);
                                            s.bucket_mb = (float)bk;
                                            ms_plan_estimate e;
                                            ms_error e2 = {0};
                                            if (ms_plan_estimate_one(&pb, &s, NULL, &e, &e2) !=
                                                MS_OK)
                                                continue;
                                            n++;
                                            if (e.fits && e.step_s < best) best = e.step_s;
                                        }
                }
    printf("search: %ld strategies, best %.6g s (%s); brute force: %ld, best %.6g s\n",
           res.evaluated, res.cands[0].step_s, res.cands[0].text, n, best);
    /* the search skips only ZeRO > 0 without data parallelism (the same strategy) */
    assert_true(res.evaluated <= n && res.evaluated > n / 2);
    assert_true(res.cands[0].step_s == best);
    for (int i = 1; i < res.n_cands; i++)
        assert_true(res.cands[i].step_s >= res.cands[i - 1].step_s);
    assert_true(strlen(res.reason) > 40);
    ms_plan_result_free(&res);
}

static void evaluate_fixes_knobs(void **state) {
    (void)state;
    ms_model_config cfg = gpt3();
    ms_cluster c = gpu_cluster();
    ms_plan_problem pb = problem(&cfg, &c, 64, 512, 2048, MS_PLAN_BF16);
    ms_plan_fixed f;
    ms_error err = {0};
    assert_int_equal(ms_plan_fixed_parse("tp=8,pp=4,recompute=1", &f, &err), MS_OK);
    ms_plan_search_opts so = {.fixed = &f, .keep = 20};
    ms_plan_result res;
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    assert_true(res.n_cands > 1);
    for (int i = 0; i < res.n_cands; i++) {
        assert_int_equal(res.cands[i].s.tp, 8);
        assert_int_equal(res.cands[i].s.pp, 4);
        assert_true(res.cands[i].s.recompute);
    }
    ms_plan_result_free(&res);
    assert_int_equal(ms_plan_fixed_parse("tp=8,bogus=2", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "bogus"));
    assert_int_equal(ms_plan_fixed_parse("tp=eight", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tp=eight"));
    /* each setting by its one name; a former key gets its new name */
    assert_int_equal(ms_plan_fixed_parse("tp=8,micro_batches=16,head_replicated=1", &f, &err),
                     MS_OK);
    assert_true(ms_plan_fixed_has(&f, MS_SET_micro_batches) && f.s.micro_batches == 16);
    assert_true(ms_plan_fixed_has(&f, MS_SET_head_replicated) && f.s.head_replicated);
    assert_false(ms_plan_fixed_has(&f, MS_SET_dp));
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    for (int i = 0; i < res.n_cands; i++) {
        int mb, m;
        assert_true(ms_strategy_micro(&res.cands[i].s, pb.global_batch, &mb, &m) && m == 16);
        assert_true(res.cands[i].s.head_replicated);
    }
    ms_plan_result_free(&res);
    assert_int_equal(ms_plan_fixed_parse("vp=0", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "did you mean 'head_replicated"));
    /* a setting the search does not enumerate is applied to every candidate */
    assert_int_equal(ms_plan_fixed_parse("pp=4,micro_batches=8,schedule=gpipe", &f, &err), MS_OK);
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    for (int i = 0; i < res.n_cands; i++)
        assert_int_equal(res.cands[i].s.schedule, MS_SCHEDULE_GPIPE);
    ms_plan_result_free(&res);
    /* a knob nothing can satisfy: the error says so */
    assert_int_equal(ms_plan_fixed_parse("tp=5", &f, &err), MS_OK);
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no strategy"));
}

static void memory_pruning(void **state) {
    (void)state;
    ms_model_config cfg = gpt3();
    ms_cluster c = gpu_cluster();
    ms_plan_problem pb = problem(&cfg, &c, 256, 512, 2048, MS_PLAN_BF16);
    ms_plan_search_opts so = {.keep = 50};
    ms_plan_result res;
    ms_error err = {0};
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    assert_true(res.pruned_memory > 0);
    for (int i = 0; i < res.n_cands; i++) {
        assert_true(res.cands[i].fits);
        assert_true(res.cands[i].mem_total <= res.cands[i].mem_cap);
    }
    /* pure data parallelism cannot hold 175B parameters in 72 GB */
    ms_strategy dp = knobs(256, 1, 1, 1, false, 0, false, 1, false, MS_PLAN_BF16);
    ms_plan_estimate e;
    assert_int_equal(ms_plan_estimate_one(&pb, &dp, NULL, &e, &err), MS_OK);
    assert_false(e.fits);
    assert_true(e.mem_total > 175e9 * 16 * 0.99);
    ms_plan_result_free(&res);
}

static void non_executable_flagged(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster c = cpu_cluster();
    ms_plan_problem pb = problem(&cfg, &c, 4, 8, 64, MS_PLAN_FP32);
    ms_plan_search_opts so = {.keep = 500};
    ms_plan_result res;
    ms_error err = {0};
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    /* every knob the planner prices the engine runs (a replicated head was the last priced
     * only): on this cluster every candidate is executable, with no reason given */
    int exe = 0, replicated = 0;
    for (int i = 0; i < res.n_cands; i++) {
        const ms_plan_estimate *e = &res.cands[i];
        int mb = 0, m = 0;
        assert_true(ms_strategy_micro(&e->s, 8, &mb, &m));
        if (e->s.zero) assert_true(e->s.dp > 1); /* ZeRO shards over dp only */
        if (!e->executable) fail_msg("candidate %d not executable: %s", i, e->not_executable);
        assert_string_equal(e->not_executable, "");
        exe++;
        replicated += e->s.head_replicated;
    }
    assert_true(exe >= 8 && replicated > 0);
    /* on a GPU cluster (CUDA devices, NCCL) the engine runs what it runs on threads */
    ms_cluster g = gpu_cluster();
    pb.cluster = &g;
    ms_strategy s = engine_strategy(2, 2, 1, false);
    char why[256];
    assert_true(ms_plan_executable(&pb, &s, why, sizeof why));
    assert_string_equal(why, "");
    /* a backend the engine has not: refused, named */
    snprintf(g.backend, sizeof g.backend, "gloo");
    assert_false(ms_plan_executable(&pb, &s, why, sizeof why));
    assert_non_null(strstr(why, "'gloo'"));
    ms_plan_result_free(&res);
}

/* A CUDA job's advisor prices the local GPUs' preset, with the device's own memory. */
static void cluster_for_gpu(void **state) {
    (void)state;
    ms_cluster c, preset;
    ms_error err = {0};
    char note[320];
    assert_int_equal(ms_cluster_for_gpu("NVIDIA H200", 143.7e9, 4, &c, note, sizeof note, &err),
                     MS_OK);
    assert_int_equal(ms_cluster_resolve("h200", false, NULL, &preset, &err), MS_OK);
    assert_string_equal(note, "");
    assert_string_equal(c.device, "NVIDIA H200");
    assert_true(c.peak_flops[MS_PLAN_BF16] == preset.peak_flops[MS_PLAN_BF16]);
    assert_true(c.mem_bytes == 143.7e9 && c.devices_per_node == 4 && c.nodes == 1 && !c.cpu);
    assert_string_equal(c.backend, "nccl");
    assert_int_equal(
        ms_cluster_for_gpu("NVIDIA A100-SXM4-40GB", 40e9, 2, &c, note, sizeof note, &err), MS_OK);
    assert_int_equal(ms_cluster_resolve("dgx-a100-80gb", false, NULL, &preset, &err), MS_OK);
    assert_true(c.peak_flops[MS_PLAN_BF16] == preset.peak_flops[MS_PLAN_BF16] &&
                c.mem_bytes == 40e9);
    /* no preset: the h100's rates, said */
    assert_int_equal(
        ms_cluster_for_gpu("NVIDIA GeForce RTX 4090", 24e9, 1, &c, note, sizeof note, &err), MS_OK);
    assert_non_null(strstr(note, "'NVIDIA GeForce RTX 4090'"));
    assert_non_null(strstr(note, "h100"));
    assert_true(c.mem_bytes == 24e9);
    /* this machine's GPUs, or the reason there are none */
    ms_status st = ms_cluster_resolve("gpu-local", false, NULL, &c, &err);
    if (ms_device_cuda_count() == 0) {
        assert_int_equal(st, MS_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "no usable CUDA device"));
    } else {
        assert_int_equal(st, MS_OK);
        assert_false(c.cpu);
        assert_int_equal(c.devices_per_node, ms_device_cuda_count());
    }
}

static void executable_check_reasons(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_error err = {0};
    ms_strategy ok = engine_strategy(2, 2, 1, true);
    ms_job_shape job = {.world = 4, .batch = 8, .seq = 64};
    assert_int_equal(ms_strategy_validate(&ok, &cfg, &job, 1e9, &err), MS_OK);
    struct {
        ms_strategy s;
        int world, batch;
        double cap;
        const char *want;
    } bad[] = {
        {engine_strategy(2, 2, 1, false), 8, 8, 0, "job runs on 8"},
        {engine_strategy(1, 3, 1, false), 3, 6, 0, "does not divide the 4 attention"},
        {engine_strategy(1, 2, 4, false), 8, 8, 0, "tp x cp = 8"},
        {engine_strategy(4, 1, 1, false), 4, 6, 0, "not divisible by dp 4"},
        {engine_strategy(4, 1, 1, true), 4, 8, 0, "sp without tp"},
        {knobs(1, 2, 1, 2, false, 1, false, 1, true, MS_PLAN_FP32), 4, 8, 0,
         "ZeRO shards over data parallelism: give dp >= 2 or zero 0"},
        {engine_strategy(4, 1, 1, false), 4, 8, 1e6, "over memory"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ms_error e2 = {0};
        ms_job_shape j = {.world = bad[i].world, .batch = bad[i].batch, .seq = 64};
        ms_status st = ms_strategy_validate(&bad[i].s, &cfg, &j, bad[i].cap, &e2);
        printf("refused: %s\n", e2.msg);
        assert_int_equal(st, MS_ERR_INVALID);
        assert_non_null(strstr(e2.msg, bad[i].want));
    }
    /* requests in the control API's short form */
    ms_strategy s;
    const char *j = "{\"dp\": 2, \"tp\": 2, \"sp\": true}";
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "j", &s, NULL, &err), MS_OK);
    int mb = 0, m = 0;
    assert_true(ms_strategy_micro(&s, 8, &mb, &m));
    assert_true(s.dp == 2 && s.tp == 2 && s.sp && mb == 4 && m == 1);
    const char *j2 = "{\"mesh\": {\"dp\": 1, \"tp\": 2, \"pp\": 2}, \"zero\": 1}";
    assert_int_equal(ms_strategy_parse_json(j2, strlen(j2), "j2", &s, NULL, &err), MS_OK);
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "ZeRO"));
    const char *j3 = "{\"dp\": 2, \"tq\": 2}";
    assert_int_equal(ms_strategy_parse_json(j3, strlen(j3), "j3", &s, NULL, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tq"));
}

/* The knobs the search does not enumerate are priced when a strategy names them. */
static void schedules_and_knobs_priced(void **state) {
    (void)state;
    ms_model_config cfg = gpt3();
    ms_cluster c = gpu_cluster();
    ms_plan_problem pb = problem(&cfg, &c, 64, 512, 2048, MS_PLAN_BF16);
    ms_error err = {0};
    ms_strategy base = knobs(2, 8, 4, 1, true, 1, false, 32, true, MS_PLAN_BF16);
    ms_plan_estimate e0, e;
    assert_int_equal(ms_plan_estimate_one(&pb, &base, NULL, &e0, &err), MS_OK);
    assert_true(e0.bubble_s > 0);
    /* interleaved over 2 virtual stages: half the bubble, twice the pipeline transfers */
    ms_strategy s = base;
    s.schedule = MS_SCHEDULE_INTERLEAVED, s.virtual_stages = 2;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e, &err), MS_OK);
    assert_true(fabs(e.bubble_s / e0.bubble_s - 0.5) < 0.02);
    assert_true(e.comm_bytes[MS_PLAN_PP] > e0.comm_bytes[MS_PLAN_PP]);
    /* ZB-H1: less bubble, the same memory. A third of 1F1B's only with F = B = W; here a
     * micro-batch is F 34%, B 37%, W 29%, and this engine's rendezvous transfers, which its
     * zb-h1 lists meet on time when F = W, wait |F - W| per micro-batch: 0.83 of 1F1B's */
    s = base, s.schedule = MS_SCHEDULE_ZB_H1;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e, &err), MS_OK);
    printf("zb-h1 bubble / 1f1b bubble = %.4f\n", e.bubble_s / e0.bubble_s);
    assert_true(e.bubble_s < 0.9 * e0.bubble_s && e.bubble_s > e0.bubble_s / 3);
    assert_true(e.mem_act == e0.mem_act);
    /* GPipe: every micro-batch's activations in flight */
    s = base, s.schedule = MS_SCHEDULE_GPIPE;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e, &err), MS_OK);
    /* the same bubble, from two simulated timelines: equal up to rounding */
    assert_true(e.mem_act > 4 * e0.mem_act && fabs(e.step_s - e0.step_s) < 1e-12 * e0.step_s);
    /* selective recompute: between none and full in memory and in hardware FLOPs */
    ms_strategy full = base, sel = base;
    full.recompute = MS_RECOMPUTE_FULL, sel.recompute = MS_RECOMPUTE_SELECTIVE;
    ms_plan_estimate ef, es;
    assert_int_equal(ms_plan_estimate_one(&pb, &full, NULL, &ef, &err), MS_OK);
    assert_int_equal(ms_plan_estimate_one(&pb, &sel, NULL, &es, &err), MS_OK);
    printf("activations per device: none %.3g, selective %.3g, full %.3g bytes; hardware FLOPs "
           "%.4g, %.4g, %.4g\n",
           e0.mem_act, es.mem_act, ef.mem_act, e0.hw_flops, es.hw_flops, ef.hw_flops);
    assert_true(ef.mem_act < es.mem_act && es.mem_act < e0.mem_act);
    assert_true(e0.hw_flops < es.hw_flops && es.hw_flops < ef.hw_flops);
    /* full recompute of the first layers only (recompute_layers): between none and full, with
     * the recomputed forward in proportion; all of a stage's layers is full recompute */
    ms_strategy part = full, all = full;
    part.recompute_layers = 12, all.recompute_layers = 24;
    ms_plan_estimate ep, ea;
    assert_int_equal(ms_plan_estimate_one(&pb, &part, NULL, &ep, &err), MS_OK);
    assert_int_equal(ms_plan_estimate_one(&pb, &all, NULL, &ea, &err), MS_OK);
    printf("recompute of 12 of a stage's 24 layers: activations %.3g bytes, hardware FLOPs %.4g\n",
           ep.mem_act, ep.hw_flops);
    assert_true(ef.mem_act < ep.mem_act && ep.mem_act < e0.mem_act);
    assert_true(e0.hw_flops < ep.hw_flops && ep.hw_flops < ef.hw_flops);
    assert_true(fabs((ep.hw_flops - e0.hw_flops) / (ef.hw_flops - e0.hw_flops) - 0.5) < 0.05);
    assert_true(ea.mem_act == ef.mem_act && ea.hw_flops == ef.hw_flops);
    /* uneven stages: the busiest stage sets the pace */
    s = base;
    const uint16_t layers[4] = {30, 24, 24, 18};
    memcpy(s.pp_layers, layers, sizeof layers);
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e, &err), MS_OK);
    assert_true(e.step_s > e0.step_s);
    /* the same strategy priced at fp32 is slower and larger */
    s = base, s.precision = MS_PRECISION_FP32;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e, &err), MS_OK);
    assert_true(e.step_s > e0.step_s && e.mem_total > e0.mem_total);
    char name[MS_STRATEGY_NAME_MAX];
    printf("%s: %.3f s per step\n", ms_strategy_name(&s, name, sizeof name), e.step_s);
}

/* Thread ranks that share cores: a stage idle in its bubble hands its core to the busy ones,
 * so the bubble costs wall time only where the schedule's critical path at full speed exceeds
 * the CPU work spread over the cores. pp 2 x dp 2 over 4 micro-batches on 2 cores (bubble 20%
 * of a stage's time, share 2): no wall time; with a core per rank the whole bubble. */
static void shared_cores_absorb_the_bubble(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster shared = cpu_cluster(), own = cpu_cluster();
    own.cores = 4;
    ms_strategy s = knobs(2, 1, 2, 1, false, 0, false, 4, true, MS_PLAN_FP32);
    ms_error err = {0};
    ms_plan_estimate es, eo;
    ms_plan_problem pb = problem(&cfg, &shared, 4, 16, 64, MS_PLAN_FP32);
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &es, &err), MS_OK);
    pb = problem(&cfg, &own, 4, 16, 64, MS_PLAN_FP32);
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &eo, &err), MS_OK);
    printf("pp2 x dp2 m4 bubble: %.3g s on 2 cores, %.3g s on 4 (step %.3g, %.3g s)\n", es.bubble_s,
           eo.bubble_s, es.step_s, eo.step_s);
    assert_true(es.bubble_s == 0 && eo.bubble_s > 0);
    /* gpipe on pp 4 over 2 micro-batches (bubble 60% of the step): the critical path at full
     * speed, 2.5 busy times over a share of 2, exceeds the work: a quarter of the busy time */
    s = knobs(1, 1, 4, 1, false, 0, false, 2, true, MS_PLAN_FP32);
    s.schedule = MS_SCHEDULE_GPIPE;
    pb = problem(&cfg, &shared, 4, 16, 64, MS_PLAN_FP32);
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &es, &err), MS_OK);
    pb = problem(&cfg, &own, 4, 16, 64, MS_PLAN_FP32);
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &eo, &err), MS_OK);
    assert_true(es.bubble_s > 0 && es.bubble_s < eo.bubble_s * 2);
}

/* --- the advisor ----------------------------------------------------------------------------- */

/* A measured analysis that agrees with the prediction except that tp collectives took
 * tp_factor times as long. */
static void synthetic_analysis(const ms_plan_estimate *pred, double tp_factor, int nranks,
                               int steps, ms_analysis *an, double *step_s) {
    memset(an, 0, sizeof *an);
    an->nranks = nranks;
    an->n_ops = 3;
    an->ops = calloc(3, sizeof *an->ops);
    const char *names[3] = {"matmul", "attention", "layernorm"};
    for (int i = 0; i < 3; i++) {
        snprintf(an->ops[i].name, sizeof an->ops[i].name, "%s", names[i]);
        an->ops[i].seconds = pred->compute_s[i] * nranks * steps;
        an->ops[i].count = steps * nranks;
    }
    an->n_steps = steps;
    an->steps = calloc((size_t)steps, sizeof *an->steps);
    double extra = (tp_factor - 1) * pred->comm_s[MS_PLAN_TP];
    *step_s = pred->step_s + extra;
    for (int i = 0; i < steps; i++) {
        an->steps[i].wall_s = *step_s;
        an->steps[i].idle_s = pred->compute_s[MS_PC_OPTIMIZER] + pred->overhead_s;
    }
    an->n_dims = 2;
    snprintf(an->dim_names[0], sizeof an->dim_names[0], "dp");
    snprintf(an->dim_names[1], sizeof an->dim_names[1], "tp");
    for (int d = 0; d < 2; d++) {
        ms_heatmap *h = &an->per_dim[d];
        h->nranks = nranks;
        h->mesh_dim = d;
        h->bytes = calloc((size_t)nranks * nranks, sizeof(double));
        h->seconds = calloc((size_t)nranks * nranks, sizeof(double));
    }
    /* tp4 on 4 ranks: every rank spends the tp time with each of its 3 peers */
    double per_rank = tp_factor * pred->comm_total_s[MS_PLAN_TP] * steps;
    for (int r = 0; r < nranks; r++)
        for (int q = 0; q < nranks; q++)
            if (q != r) an->per_dim[1].seconds[(size_t)r * nranks + q] = per_rank;
}

static void free_analysis(ms_analysis *an) {
    free(an->ops);
    free(an->steps);
    for (int d = 0; d < 2; d++) {
        free(an->per_dim[d].bytes);
        free(an->per_dim[d].seconds);
    }
}

/* An advisor for gpt-tiny on 4 thread ranks (batch 8 x 64) running tp4, and the analysis of 5
 * steps in which tp collectives took 3x the model (its step in `step`). */
typedef struct slow_tp4 {
    ms_advisor *adv;
    ms_strategy cur;
    ms_plan_estimate pred;
    ms_analysis an;
    double step;
    ms_suggestion sg[MS_LIVE_MAX_SUGGESTIONS];
} slow_tp4;

static void slow_tp4_open(slow_tp4 *t) {
    ms_model_config cfg = gpt_tiny();
    ms_cluster c = cpu_cluster();
    ms_error err = {0};
    assert_int_equal(lm_advisor(&cfg, 4, 8, 64, &c, &t->adv, &err), MS_OK);
    assert_int_equal(ms_strategy_init(&t->cur, 1, 4, 1, false, &err), MS_OK);
    assert_int_equal(ms_advisor_predict(t->adv, &t->cur, &t->pred, &err), MS_OK);
    assert_true(t->pred.comm_s[MS_PLAN_TP] > 0);
    synthetic_analysis(&t->pred, 3.0, 4, 5, &t->an, &t->step);
}

/* One advisor round at a 10% threshold against a measured step; its suggestion count. */
static int slow_tp4_round(slow_tp4 *t, double measured_s) {
    ms_error err = {0};
    int n = -1;
    assert_int_equal(ms_advisor_update(t->adv, &t->cur, &t->an, measured_s, 0.10, t->sg,
                                       MS_LIVE_MAX_SUGGESTIONS, &n, &err),
                     MS_OK);
    return n;
}

static void advisor_moves_away_from_slow_tp(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster c = cpu_cluster();
    ms_error err = {0};
    const int B = 8, T = 64;
    slow_tp4 t;
    slow_tp4_open(&t);
    ms_advisor *adv = t.adv;
    ms_strategy cur = t.cur;
    ms_plan_estimate pred = t.pred;
    ms_analysis an = t.an;
    double step = t.step;
    ms_suggestion *sg = t.sg;
    int n = slow_tp4_round(&t, step);
    ms_plan_scales sc;
    ms_advisor_scales(adv, &sc);
    printf("tp scale learned: %.2f; %d suggestions\n", sc.comm[MS_PLAN_TP], n);
    assert_true(fabs(sc.comm[MS_PLAN_TP] - 3.0) < 0.05);
    assert_true(fabs(sc.compute[MS_PC_GEMM] - 1.0) < 0.05);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        printf("  %s (%s): %.0f%% faster; %s; %s; %s\n", sg[i].target, sg[i].target_json,
               100 * sg[i].predicted_gain, sg[i].evidence, sg[i].memory_check, sg[i].diff);
        assert_true(sg[i].predicted_gain >= 0.10);
        assert_true(sg[i].id > 0);
        if (i) assert_true(sg[i].predicted_gain <= sg[i - 1].predicted_gain);
        /* never a strategy the validator refuses */
        ms_strategy ps;
        assert_int_equal(ms_strategy_parse_json(sg[i].target_json, strlen(sg[i].target_json),
                                                "target", &ps, NULL, &err),
                         MS_OK);
        ms_job_shape job = {.world = 4, .batch = B, .seq = T};
        assert_int_equal(ms_strategy_validate(&ps, &cfg, &job, 0, &err), MS_OK);
        /* the change says what moves, the head too (tp4's is vocab-parallel) */
        bool head = ps.head_replicated && ps.tp > 1;
        assert_true(!head == !strstr(sg[i].diff, "head_replicated off -> on"));
    }
    /* the best suggestion leaves tp4 and its evidence names the tp all-reduce */
    assert_non_null(strstr(sg[0].target_json, "\"tp\": 1")
                        ? sg[0].target_json
                        : strstr(sg[0].target_json, "\"tp\": 2"));
    assert_non_null(strstr(sg[0].evidence, "tp all-reduce"));
    assert_non_null(strstr(sg[0].evidence, "3.0x"));
    assert_non_null(strstr(sg[0].diff, "tp 4 -> "));
    assert_non_null(strstr(sg[0].memory_check, "fits"));
    /* after the switch */
    char line[256];
    ms_advisor_switch_result(&sg[0], step, sg[0].predicted_step_s * 1.05, line, sizeof line);
    printf("  %s\n", line);
    assert_non_null(strstr(line, "predicted"));
    assert_non_null(strstr(line, "measured"));
    /* the sentence's numbers: (150 - 121.5) / 150 = 19% faster; a direct request has no
     * prediction; a step that grew is slower */
    ms_suggestion known = {.predicted_gain = 0.22, .predicted_step_s = 0.118};
    ms_advisor_switch_result(&known, 0.150, 0.1215, line, sizeof line);
    assert_string_equal(line, "predicted 22% faster (118.0 ms per step), measured 19% faster "
                              "(121.5 ms against 150.0 ms)");
    ms_advisor_switch_result(NULL, 0.100, 0.120, line, sizeof line);
    assert_string_equal(line, "no prediction (a direct request), measured 20% slower (120.0 ms "
                              "against 100.0 ms)");
    free_analysis(&an);

    /* measurements that agree with the model: the same strategy earns no tp penalty */
    ms_advisor *adv2;
    assert_int_equal(lm_advisor(&cfg, 4, B, T, &c, &adv2, &err), MS_OK);
    synthetic_analysis(&pred, 1.0, 4, 5, &an, &step);
    int n2 = 0;
    assert_int_equal(
        ms_advisor_update(adv2, &cur, &an, step, 0.10, sg, MS_LIVE_MAX_SUGGESTIONS, &n2, &err),
        MS_OK);
    ms_advisor_scales(adv2, &sc);
    assert_true(fabs(sc.comm[MS_PLAN_TP] - 1.0) < 0.05);
    free_analysis(&an);
    ms_advisor_destroy(adv2);
    ms_advisor_destroy(adv);
}

/* A model known to be wrong suggests nothing. The trace explains the tp4 step (tp collectives
 * 3x the model, as in advisor_moves_away_from_slow_tp) but the measured step is twice that:
 * half of it is time no scaled term accounts for. Rounds off by more than MS_ADVISOR_OFF_LIMIT
 * return nothing; after MS_ADVISOR_OFF_ROUNDS of them the note says why; one agreeing round
 * clears it and suggestions come back. */
static void advisor_withholds_while_its_model_is_off(void **state) {
    (void)state;
    slow_tp4 t;
    slow_tp4_open(&t);
    assert_true(slow_tp4_round(&t, t.step) >= 1);
    assert_string_equal(ms_advisor_note(t.adv), "");
    for (int r = 1; r <= MS_ADVISOR_OFF_ROUNDS + 1; r++) {
        int n = slow_tp4_round(&t, 2 * t.step);
        const char *note = ms_advisor_note(t.adv);
        printf("round %d, measured %.1f ms: %d suggestions; note '%s'\n", r, 2e3 * t.step, n, note);
        assert_int_equal(n, 0);
        if (r < MS_ADVISOR_OFF_ROUNDS) {
            assert_string_equal(note, "");
            continue;
        }
        char want[96];
        snprintf(want, sizeof want, "off the measured step for %d rounds (predicts ", r);
        assert_true(!strncmp(note, "the cost model is 50% off", 25) && strstr(note, want));
        assert_non_null(strstr(note, "); relearning from the trace; no suggestions until it "
                                     "agrees within 25%"));
    }
    /* agreeing again: the note clears at once; suggestions return once the per-step constant
     * the long step left behind has blended away */
    int rounds = 0, n;
    do {
        n = slow_tp4_round(&t, t.step);
        assert_string_equal(ms_advisor_note(t.adv), "");
    } while (n == 0 && ++rounds < 10);
    printf("agreeing again: %d suggestions after %d rounds\n", n, rounds + 1);
    assert_true(n >= 1 && strstr(t.sg[0].evidence, "tp all-reduce"));
    free_analysis(&t.an);
    ms_advisor_destroy(t.adv);
}

/* A calibration taken on a busy machine: its phase-boundary synchronisation came out 20 ms
 * (an idle 2-core machine measures about 1.6 ms at 4 ranks), more than the whole measured
 * step. When the job's collectives took just their predicted transfers, there is no room for
 * that sync: it shrinks to nothing, the collectives keep their scale, the prediction meets
 * the measured step and the advice is the one an honest calibration gives. */
static void advisor_discounts_an_inflated_sync(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster truth = cpu_cluster(), busy = cpu_cluster();
    busy.sync[0].per_phase = 20e-3;
    ms_advisor *honest, *adv;
    ms_error err = {0};
    const int B = 8, T = 64;
    assert_int_equal(lm_advisor(&cfg, 4, B, T, &truth, &honest, &err), MS_OK);
    assert_int_equal(lm_advisor(&cfg, 4, B, T, &busy, &adv, &err), MS_OK);
    ms_strategy cur;
    assert_int_equal(ms_strategy_init(&cur, 1, 4, 1, false, &err), MS_OK);
    ms_plan_estimate real, inflated;
    assert_int_equal(ms_advisor_predict(honest, &cur, &real, &err), MS_OK);
    assert_int_equal(ms_advisor_predict(adv, &cur, &inflated, &err), MS_OK);
    assert_true(inflated.sync_s > 0.05 && inflated.step_s > 2 * real.step_s);
    ms_analysis an;
    double step;
    synthetic_analysis(&real, 1.0, 4, 5, &an, &step);
    ms_suggestion sg[MS_LIVE_MAX_SUGGESTIONS], want[MS_LIVE_MAX_SUGGESTIONS];
    int n = 0, n_want = 0;
    assert_int_equal(ms_advisor_update(honest, &cur, &an, step, 0.02, want, MS_LIVE_MAX_SUGGESTIONS,
                                       &n_want, &err),
                     MS_OK);
    assert_int_equal(
        ms_advisor_update(adv, &cur, &an, step, 0.02, sg, MS_LIVE_MAX_SUGGESTIONS, &n, &err),
        MS_OK);
    ms_plan_scales sc;
    ms_advisor_scales(adv, &sc);
    ms_plan_estimate after;
    assert_int_equal(ms_advisor_predict(adv, &cur, &after, &err), MS_OK);
    printf("sync scale %.3f, tp scale %.2f; predicted %.1f ms against %.1f ms measured "
           "(%.1f ms before); %d suggestions, %d with the honest calibration\n",
           sc.sync, sc.comm[MS_PLAN_TP], after.step_s * 1e3, step * 1e3, inflated.step_s * 1e3, n,
           n_want);
    assert_true(sc.sync < 0.01);
    assert_true(fabs(sc.comm[MS_PLAN_TP] - 1.0) < 0.05);
    assert_true(fabs(after.step_s - step) < 0.05 * step);
    assert_true(n_want >= 1);
    assert_int_equal(n, n_want);
    for (int i = 0; i < n; i++) {
        assert_string_equal(sg[i].target, want[i].target);
        assert_true(fabs(sg[i].predicted_gain - want[i].predicted_gain) < 0.02);
    }
    free_analysis(&an);
    ms_advisor_destroy(adv);
    ms_advisor_destroy(honest);
}

/* --- clusters -------------------------------------------------------------------------------- */

/* A stack that gathers ZeRO 3's parameters again after the recompute's forward
 * (ms_cluster.zero3_recompute_regathers, DeepSpeed's): under full recompute every micro-batch
 * gathers each layer's parameters once more over dp, by the layers' own count of 12 h^2 + 13 h
 * (four weights, their biases, two norms); without recompute, or below ZeRO 3, nothing
 * changes; and the step is slower. */
static void zero3_recompute_regathers(void **state) {
    (void)state;
    ms_model_config cfg = gpt3();
    cfg.n_layer = 24, cfg.n_head = 16, cfg.n_embd = 2048; /* a 1.3B shape */
    ms_cluster *c = malloc(sizeof *c);
    ms_error err = {0};
    assert_int_equal(ms_cluster_resolve("dgx-a100-80gb", false, NULL, c, &err), MS_OK);
    assert_false(c->zero3_recompute_regathers);
    ms_plan_problem pb = problem(&cfg, c, 64, 256, 2048, MS_PLAN_BF16);
    const double h = cfg.n_embd, layer = 12 * h * h + 13 * h;
    for (int zero = 2; zero <= 3; zero++)
        for (int rc = 0; rc < 2; rc++) {
            ms_strategy s = knobs(64, 1, 1, 1, false, zero, rc, 2, true, MS_PLAN_BF16);
            ms_plan_estimate e0, e1;
            ms_plan_tally t0, t1;
            c->zero3_recompute_regathers = false;
            assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e0, &err), MS_OK);
            assert_int_equal(ms_plan_tally_get(&pb, &s, true, &t0, &err), MS_OK);
            c->zero3_recompute_regathers = true;
            assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &e1, &err), MS_OK);
            assert_int_equal(ms_plan_tally_get(&pb, &s, true, &t1, &err), MS_OK);
            double g0 = t0.coll_bytes[MS_PLAN_DP][MS_COLL_ALL_GATHER],
                   g1 = t1.coll_bytes[MS_PLAN_DP][MS_COLL_ALL_GATHER];
            double want = zero == 3 && rc ? 2 * 24 * layer * 2 : 0; /* m 2, bf16 */
            printf("zero %d%s: gathered %.4g -> %.4g bytes per step (+%.4g, want +%.4g); step "
                   "%.3f -> %.3f s\n",
                   zero, rc ? " recompute" : "", g0, g1, g1 - g0, want, e0.step_s, e1.step_s);
            assert_true(fabs((g1 - g0) - want) <= 1e-9 * (want + 1));
            if (want > 0)
                assert_true(e1.step_s > e0.step_s);
            else
                assert_true(e1.step_s == e0.step_s);
        }
    free(c);
}

/* Memory: under a cap that dp4 alone exceeds, the advisor still suggests dp4, with ZeRO or
 * recompute, and every suggestion fits the cap. */
static void advisor_fits_memory_with_zero(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster c = cpu_cluster();
    ms_advisor *adv;
    ms_error err = {0};
    const int B = 8, T = 64;
    assert_int_equal(lm_advisor(&cfg, 4, B, T, &c, &adv, &err), MS_OK);
    ms_strategy cur, dp4 = knobs(4, 1, 1, 1, false, 0, false, 1, true, MS_PLAN_FP32), z3 = dp4;
    z3.zero = 3;
    ms_plan_estimate pred, e0, e3;
    assert_int_equal(ms_advisor_predict(adv, &dp4, &e0, &err), MS_OK);
    assert_int_equal(ms_advisor_predict(adv, &z3, &e3, &err), MS_OK);
    printf("dp4: %.3g bytes per rank, with ZeRO 3 %.3g\n", e0.mem_total, e3.mem_total);
    assert_true(e3.mem_total < 0.9 * e0.mem_total);
    double cap = (e0.mem_total + e3.mem_total) / 2;
    ms_advisor_set_memory_cap(adv, cap);
    assert_int_equal(ms_strategy_init(&cur, 1, 4, 1, false, &err), MS_OK);
    assert_int_equal(ms_advisor_predict(adv, &cur, &pred, &err), MS_OK);
    ms_analysis an;
    double step;
    synthetic_analysis(&pred, 3.0, 4, 5, &an, &step);
    /* every suggestion, not only the best few: faster pipelines may outrank dp4's */
    ms_suggestion sg[64];
    int n = 0;
    assert_int_equal(ms_advisor_update(adv, &cur, &an, step, 0.10, sg, 64, &n, &err), MS_OK);
    bool dp4_saver = false;
    for (int i = 0; i < n; i++) {
        ms_strategy ps;
        assert_int_equal(ms_strategy_parse_json(sg[i].target_json, strlen(sg[i].target_json),
                                                "target", &ps, NULL, &err),
                         MS_OK);
        ms_plan_estimate e;
        assert_int_equal(ms_advisor_predict(adv, &ps, &e, &err), MS_OK);
        printf("  %s: %s; %s\n", sg[i].target, sg[i].memory_check, sg[i].diff);
        assert_true(e.mem_total <= cap);
        for (int j = 0; j < i; j++) assert_true(sg[j].id != sg[i].id);
        dp4_saver |= ps.dp == 4 && (ps.zero > 0 || ps.recompute != MS_RECOMPUTE_NONE);
    }
    assert_true(dp4_saver);
    free_analysis(&an);
    ms_advisor_destroy(adv);
}

/* Memory that only bf16 fits: under a cap below dp4's leanest fp32 variant (ZeRO 3 and full
 * recompute) the advisor suggests bf16 strategies, each within the cap and the precision
 * named in the diff, and only where the mesh's leanest fp32 variant does not fit. */
static void advisor_fits_memory_with_bf16(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster c = cpu_cluster();
    ms_advisor *adv;
    ms_error err = {0};
    const int B = 8, T = 64;
    assert_int_equal(lm_advisor(&cfg, 4, B, T, &c, &adv, &err), MS_OK);
    ms_strategy lean = knobs(4, 1, 1, 1, false, 3, true, 1, true, MS_PLAN_FP32), half = lean;
    lean.recompute = MS_RECOMPUTE_FULL;
    half.recompute = MS_RECOMPUTE_FULL;
    half.precision = MS_PRECISION_BF16;
    ms_plan_estimate e32, e16, pred;
    assert_int_equal(ms_advisor_predict(adv, &lean, &e32, &err), MS_OK);
    assert_int_equal(ms_advisor_predict(adv, &half, &e16, &err), MS_OK);
    printf("dp4 zero3 recompute: fp32 %.3g bytes per rank, bf16 %.3g\n", e32.mem_total,
           e16.mem_total);
    /* bf16 halves the activations and the gathered parameters, not the fp32 master shards and
     * optimizer state: 0.82 of fp32 here, a band wide enough for a cap between the two */
    assert_true(e16.mem_total < 0.85 * e32.mem_total);
    double cap = (e32.mem_total + e16.mem_total) / 2;
    ms_advisor_set_memory_cap(adv, cap);
    ms_strategy cur;
    assert_int_equal(ms_strategy_init(&cur, 4, 1, 1, false, &err), MS_OK);
    assert_int_equal(ms_advisor_predict(adv, &cur, &pred, &err), MS_OK);
    ms_analysis an;
    double step;
    synthetic_analysis(&pred, 1.0, 4, 5, &an, &step);
    ms_suggestion sg[64];
    int n = 0;
    assert_int_equal(ms_advisor_update(adv, &cur, &an, step, 0.10, sg, 64, &n, &err), MS_OK);
    assert_true(n > 0);
    int bf16 = 0;
    for (int i = 0; i < n; i++) {
        ms_strategy ps;
        assert_int_equal(ms_strategy_parse_json(sg[i].target_json, strlen(sg[i].target_json),
                                                "target", &ps, NULL, &err),
                         MS_OK);
        ms_plan_estimate e;
        assert_int_equal(ms_advisor_predict(adv, &ps, &e, &err), MS_OK);
        printf("  %s: %s; %s\n", sg[i].target, sg[i].memory_check, sg[i].diff);
        assert_true(e.mem_total <= cap);
        if (ps.precision != MS_PRECISION_BF16) continue;
        bf16++;
        assert_non_null(strstr(sg[i].diff, "precision fp32 -> bf16"));
        ms_strategy lean32 = ps;
        lean32.precision = MS_PRECISION_FP32;
        lean32.zero = ps.dp > 1 ? 3 : 0;
        lean32.recompute = MS_RECOMPUTE_FULL;
        assert_int_equal(ms_advisor_predict(adv, &lean32, &e, &err), MS_OK);
        assert_true(e.mem_total > cap);
    }
    assert_true(bf16 > 0);
    free_analysis(&an);
    ms_advisor_destroy(adv);
}

/* dp_overlap from measurement: a job with gradient buckets whose trace shows 60% of the dp
 * traffic hidden under compute teaches the advisor that share; its estimate of the bucketed
 * strategy then exposes 40% of the dp gradient traffic, while the same mesh without buckets
 * (whose gradients run after the backward) still exposes all of it. Until measured, buckets
 * hide what the cluster says (cpu-local: none). */
static void advisor_learns_dp_overlap(void **state) {
    (void)state;
    ms_model_config cfg = gpt_tiny();
    ms_cluster c = cpu_cluster();
    ms_advisor *adv;
    ms_error err = {0};
    assert_int_equal(lm_advisor(&cfg, 4, 8, 64, &c, &adv, &err), MS_OK);
    ms_strategy plain, bucketed;
    assert_int_equal(ms_strategy_init(&plain, 4, 1, 1, false, &err), MS_OK);
    bucketed = plain;
    bucketed.bucket_mb = 1;
    ms_plan_scales sc;
    ms_advisor_scales(adv, &sc);
    assert_true(sc.dp_overlap < 0);
    ms_plan_estimate before;
    assert_int_equal(ms_advisor_predict(adv, &bucketed, &before, &err), MS_OK);
    assert_true(before.comm_s[MS_PLAN_DP] == before.comm_total_s[MS_PLAN_DP]);
    ms_analysis an;
    double step;
    synthetic_analysis(&before, 1.0, 4, 5, &an, &step);
    for (int r = 0; r < 4; r++) {
        an.overlap[r].dp_comm_s = 0.010 * (r + 1);
        an.overlap[r].dp_hidden_s = 0.6 * an.overlap[r].dp_comm_s;
    }
    ms_suggestion sg[MS_LIVE_MAX_SUGGESTIONS];
    int n = 0;
    assert_int_equal(
        ms_advisor_update(adv, &bucketed, &an, step, 0.10, sg, MS_LIVE_MAX_SUGGESTIONS, &n, &err),
        MS_OK);
    ms_advisor_scales(adv, &sc);
    assert_true(fabs(sc.dp_overlap - 0.6) < 1e-9);
    ms_plan_estimate b, p;
    assert_int_equal(ms_advisor_predict(adv, &bucketed, &b, &err), MS_OK);
    assert_int_equal(ms_advisor_predict(adv, &plain, &p, &err), MS_OK);
    printf("dp4 gradients: %.3f ms in all; exposed %.3f ms with buckets, %.3f without\n",
           b.comm_total_s[MS_PLAN_DP] * 1e3, b.comm_s[MS_PLAN_DP] * 1e3,
           p.comm_s[MS_PLAN_DP] * 1e3);
    assert_true(p.comm_s[MS_PLAN_DP] == p.comm_total_s[MS_PLAN_DP]);
    /* 40% exposed, unless the last layer's share or the backward's length caps what hides */
    double grad = b.comm_total_s[MS_PLAN_DP];
    assert_true(b.comm_s[MS_PLAN_DP] >= 0.4 * grad - 1e-12);
    assert_true(b.comm_s[MS_PLAN_DP] < grad);
    free_analysis(&an);
    ms_advisor_destroy(adv);
}

/* cpu-local's in-step factors: interpolated in log(bytes) between the two measured sizes and
 * held beyond; every kernel of a class priced at its rate times its factor; ranks beyond the
 * cores times their sync point's compute factor as well. */
static void in_step_factors_price_kernels(void **state) {
    (void)state;
    ms_cluster c = cpu_cluster();
    assert_true(ms_cluster_in_step(&c, MS_PC_GEMM, 1e6) == 1); /* unmeasured */
    c.in_step[MS_PC_GEMM] = (ms_in_step){{1e5, 1e7}, {1.0, 2.0}};
    assert_true(ms_cluster_in_step(&c, MS_PC_GEMM, 1e3) == 1.0);
    assert_true(ms_cluster_in_step(&c, MS_PC_GEMM, 1e9) == 2.0);
    assert_true(fabs(ms_cluster_in_step(&c, MS_PC_GEMM, 1e6) - 1.5) < 1e-12);
    assert_true(ms_cluster_in_step(&c, MS_PC_OPTIMIZER, 1e6) == 1);
    ms_model_config tiny = gpt_tiny();
    ms_cluster plain = cpu_cluster(), slow = cpu_cluster();
    for (int k = 0; k < MS_CLUSTER_IN_STEP; k++)
        slow.in_step[k] = (ms_in_step){{1, 2}, {1.0 + k, 1.0 + k}}; /* 1x, 2x, 3x at any size */
    ms_strategy dp2 = engine_strategy(2, 1, 1, false);
    ms_plan_estimate a, b;
    ms_error err = {0};
    ms_plan_problem pa = problem(&tiny, &plain, 2, 8, 64, MS_PLAN_FP32),
                    pb = problem(&tiny, &slow, 2, 8, 64, MS_PLAN_FP32);
    assert_int_equal(ms_plan_estimate_one(&pa, &dp2, NULL, &a, &err), MS_OK);
    assert_int_equal(ms_plan_estimate_one(&pb, &dp2, NULL, &b, &err), MS_OK);
    assert_true(fabs(b.compute_s[MS_PC_GEMM] - a.compute_s[MS_PC_GEMM]) < 1e-12);
    assert_true(fabs(b.compute_s[MS_PC_ATTENTION] - 2 * a.compute_s[MS_PC_ATTENTION]) < 1e-12);
    assert_true(fabs(b.compute_s[MS_PC_ELEMENTWISE] - 3 * a.compute_s[MS_PC_ELEMENTWISE]) < 1e-12);
    assert_true(a.compute_s[MS_PC_ATTENTION] > 0 && a.compute_s[MS_PC_ELEMENTWISE] > 0);
    /* four ranks on two cores: their sync point's compute factor on every class but the
     * optimizer; two ranks (a core each, the in-step factors' own count) at 1 */
    ms_strategy dp4 = engine_strategy(4, 1, 1, false);
    slow.sync[0].compute = 1.25;
    slow.sync[slow.n_sync++] = (ms_sync_point){.ranks = 2, .compute = 1};
    pa.devices = pb.devices = 4;
    assert_int_equal(ms_plan_estimate_one(&pa, &dp4, NULL, &a, &err), MS_OK);
    assert_int_equal(ms_plan_estimate_one(&pb, &dp4, NULL, &b, &err), MS_OK);
    for (int k = 0; k < MS_CLUSTER_IN_STEP; k++)
        assert_true(fabs(b.compute_s[k] - 1.25 * (1.0 + k) * a.compute_s[k]) <
                    1e-9 * a.compute_s[k]);
    assert_true(ms_cluster_sync_compute(&slow, 2) == 1 &&
                ms_cluster_sync_compute(&slow, 4) == 1.25);
}

static void cluster_json(void **state) {
    (void)state;
    const char *presets[3] = {"dgx-a100-80gb", "h100", "h200"};
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/configs/clusters/%s.json", MS_SOURCE_DIR, presets[i]);
        ms_cluster c;
        ms_error err = {0};
        assert_int_equal(ms_cluster_load(path, &c, &err), MS_OK);
        assert_int_equal(c.devices_per_node, 8);
        assert_true(c.peak_flops[MS_PLAN_BF16] > 300e12);
        /* round trip */
        char *text = ms_cluster_to_json(&c);
        ms_cluster d;
        assert_int_equal(ms_cluster_from_json(text, strlen(text), "rt", &d, &err), MS_OK);
        assert_true(fabs(d.peak_flops[1] - c.peak_flops[1]) < 1 && d.intra.bw == c.intra.bw &&
                    d.mem_bytes == c.mem_bytes && d.algo == c.algo);
        assert_true(c.sms > 100 && d.sms == c.sms && d.n_gemm_tiles == c.n_gemm_tiles &&
                    memcmp(d.gemm_tiles, c.gemm_tiles, sizeof c.gemm_tiles) == 0 &&
                    d.score_bytes[0] == c.score_bytes[0] && d.score_bytes[1] == c.score_bytes[1]);
        free(text);
    }
    ms_cluster c = cpu_cluster();
    char *text = ms_cluster_to_json(&c);
    ms_cluster d;
    ms_error err = {0};
    assert_int_equal(ms_cluster_from_json(text, strlen(text), "rt", &d, &err), MS_OK);
    assert_int_equal(d.n_gemm, c.n_gemm);
    assert_int_equal(d.n_coll, c.n_coll);
    assert_true(fabs(d.coll[3].busbw - c.coll[3].busbw) < 1);
    assert_int_equal(d.n_sync, c.n_sync);
    /* every measured figure survives the round trip (the cache is this JSON) */
    c.sync[0] = (ms_sync_point){
        .ranks = 4, .per_call = 75e-6, .per_byte = 0.2e-9, .per_phase = 3e-3, .compute = 1.2};
    for (int k = 0; k < MS_CLUSTER_IN_STEP; k++)
        c.in_step[k] = (ms_in_step){{4e5, 3e6}, {1.0 + 0.01 * k, 1.5 + 0.1 * k}};
    free(text);
    text = ms_cluster_to_json(&c);
    assert_int_equal(ms_cluster_from_json(text, strlen(text), "rt", &d, &err), MS_OK);
    assert_true(fabs(d.sync[0].per_call - 75e-6) < 1e-12 &&
                fabs(d.sync[0].per_byte - 0.2e-9) < 1e-18 &&
                fabs(d.sync[0].per_phase - 3e-3) < 1e-12 && d.sync[0].compute == 1.2);
    for (int k = 0; k < MS_CLUSTER_IN_STEP; k++)
        assert_memory_equal(&d.in_step[k], &c.in_step[k], sizeof c.in_step[k]);
    ms_model_config tiny = gpt_tiny();
    ms_plan_problem p1 = problem(&tiny, &c, 4, 8, 64, MS_PLAN_FP32),
                    p2 = problem(&tiny, &d, 4, 8, 64, MS_PLAN_FP32);
    ms_strategy tp4 = engine_strategy(1, 4, 1, true);
    ms_plan_estimate e1, e2;
    assert_int_equal(ms_plan_estimate_one(&p1, &tp4, NULL, &e1, &err), MS_OK);
    assert_int_equal(ms_plan_estimate_one(&p2, &tp4, NULL, &e2, &err), MS_OK);
    /* the file keeps microseconds and nanoseconds: equal to the last bits of the conversion */
    assert_true(fabs(e1.step_s - e2.step_s) < 1e-12 * e1.step_s && e1.comm_s[MS_PLAN_TP] > 0);
    free(text);
    const char *badj = "{\"devices_per_node\": 8, \"peak_tflops\": {\"fp32\": 1, \"bf16\": -3}, "
                       "\"memory_gb\": 1, \"memory_bw_gbps\": 1, \"intra_node\": {\"bw_gbps\": 1}, "
                       "\"inter_node\": {\"bw_gbps\": 1}}";
    assert_int_equal(ms_cluster_from_json(badj, strlen(badj), "bad.json", &d, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "$.peak_tflops.bf16"));
    const char *badt = "{\"devices_per_node\": 8, \"peak_tflops\": {\"fp32\": 1, \"bf16\": 3}, "
                       "\"memory_gb\": 1, \"memory_bw_gbps\": 1, \"intra_node\": {\"bw_gbps\": 1}, "
                       "\"inter_node\": {\"bw_gbps\": 1}, \"sms\": 108, \"gemm_tiles\": [[256]]}";
    assert_int_equal(ms_cluster_from_json(badt, strlen(badt), "bad.json", &d, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "$.gemm_tiles"));
    /* in-step points: two, bytes ascending */
    const char *bad_in_step =
        "{\"devices_per_node\": 8, \"peak_tflops\": {\"fp32\": 1, \"bf16\": 3}, "
        "\"memory_gb\": 1, \"memory_bw_gbps\": 1, \"intra_node\": {\"bw_gbps\": 1}, "
        "\"inter_node\": {\"bw_gbps\": 1}, \"in_step\": {\"gemm\": [[3e6, 1.2], [4e5, 1.5]]}}";
    assert_int_equal(ms_cluster_from_json(bad_in_step, strlen(bad_in_step), "bad.json", &d, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "bad.json: $.in_step.gemm: expected [[bytes, factor]"));
    assert_int_equal(ms_cluster_resolve("nonexistent-cluster", false, NULL, &d, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "cpu-local"));
}

/* Wave quantization: on 4 SMs with 128 x 128 tiles, a 256 x 384 output (6 tiles) runs in two
 * waves, 3/4 full, so per FLOP it costs 4/3 of a 256 x 256 output (one full wave); a 128 x 128
 * output over a long k splits its reduction over the 4 SMs and loses nothing. The same GEMMs
 * without a wave model are the reference. */
static void gemm_waves(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/configs/clusters/dgx-a100-80gb.json", MS_SOURCE_DIR);
    ms_cluster w, flat;
    ms_error err = {0};
    assert_int_equal(ms_cluster_load(path, &w, &err), MS_OK);
    w.sms = 4;
    w.n_gemm_tiles = 1;
    w.gemm_tiles[0][0] = w.gemm_tiles[0][1] = 128;
    w.kernel_overhead = 0;
    flat = w;
    flat.sms = 0;
    const ms_plan_dtype bf = MS_PLAN_BF16;
    double r_w = ms_cluster_gemm_time(&w, bf, 256, 384, 4096, 1) /
                 ms_cluster_gemm_time(&w, bf, 256, 256, 4096, 1);
    double r_f = ms_cluster_gemm_time(&flat, bf, 256, 384, 4096, 1) /
                 ms_cluster_gemm_time(&flat, bf, 256, 256, 4096, 1);
    assert_true(fabs(r_w / r_f - 4.0 / 3.0) < 1e-9);
    assert_true(fabs(ms_cluster_gemm_time(&w, bf, 128, 128, 4096, 1) /
                         ms_cluster_gemm_time(&flat, bf, 128, 128, 4096, 1) -
                     1) < 1e-9);
    /* a short k cannot be split: one tile of four SMs */
    assert_true(fabs(ms_cluster_gemm_time(&w, bf, 128, 128, 256, 1) /
                         ms_cluster_gemm_time(&flat, bf, 128, 128, 256, 1) -
                     4) < 1e-9);
}

/* --- the 175B search time (printed) ------------------------------------------------------------
 */

static void search_175b_timing(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/configs/clusters/dgx-a100-80gb.json", MS_SOURCE_DIR);
    ms_cluster c;
    ms_error err = {0};
    assert_int_equal(ms_cluster_load(path, &c, &err), MS_OK);
    ms_model_config cfg = gpt3();
    ms_plan_problem pb = problem(&cfg, &c, 1024, 1536, 2048, MS_PLAN_BF16);
    ms_plan_search_opts so = {.keep = 5};
    ms_plan_result res;
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    printf("GPT-3 175B on 1024 x A100: %ld strategies searched in %.1f ms; best %s, %.2f s per "
           "step, %.0f model TFLOP/s per GPU\n",
           res.evaluated, res.search_ms, res.cands[0].text, res.cands[0].step_s,
           res.cands[0].model_tflops_per_device);
    assert_true(res.cands[0].fits);
    ms_plan_result_free(&res);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(zero_worked_example),
    cmocka_unit_test(zero3_recompute_regathers),
    cmocka_unit_test(in_step_factors_price_kernels),
    cmocka_unit_test(flops_against_hand_count),
    cmocka_unit_test(params_formula),
    cmocka_unit_test(activation_formula),
    cmocka_unit_test(ring_and_tree),
    cmocka_unit_test(topology_groups_and_links),
    cmocka_unit_test(topology_groups_take_turns),
    cmocka_unit_test(topology_prefers_tp_within_host),
    cmocka_unit_test(engine_flops_match_program),
    cmocka_unit_test(head_replicated_matches_program),
    cmocka_unit_test(search_matches_brute_force),
    cmocka_unit_test(evaluate_fixes_knobs),
    cmocka_unit_test(memory_pruning),
    cmocka_unit_test(non_executable_flagged),
    cmocka_unit_test(cluster_for_gpu),
    cmocka_unit_test(executable_check_reasons),
    cmocka_unit_test(schedules_and_knobs_priced),
    cmocka_unit_test(shared_cores_absorb_the_bubble),
    cmocka_unit_test(advisor_fits_memory_with_bf16),
    cmocka_unit_test(advisor_learns_dp_overlap),
    cmocka_unit_test(advisor_fits_memory_with_zero),
    cmocka_unit_test(advisor_moves_away_from_slow_tp),
    cmocka_unit_test(advisor_discounts_an_inflated_sync),
    cmocka_unit_test(advisor_withholds_while_its_model_is_off),
    cmocka_unit_test(cluster_json),
    cmocka_unit_test(gemm_waves),
    cmocka_unit_test(search_175b_timing),
};

MT_MAIN("plan", tests)

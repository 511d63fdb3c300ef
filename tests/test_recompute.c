/* test_recompute.c - activation recompute (ms_compile_opts.recompute), full and selective.
 *
 *   program      which kernels and reshards the backward runs again: full recompute re-runs
 *                every forward kernel of every transformer block (and, under tp + sp, the
 *                collectives among them), selective only attention's core; each recomputed
 *                kernel runs before its own backward, and the extra FLOPs are exactly the
 *                recomputed forwards
 *   bitwise      on one rank, full and selective recompute train to the same losses and final
 *                parameters, bit for bit, as no recompute (same kernels on the same inputs),
 *                with dropout on too (masks are a function of the global element index)
 *   distributed  under dp2, tp2 (+ sp), cp2, dp2 x tp2 and pp2 (1f1b and zb-h1, 4 micro-batches;
 *                gpipe and interleaved too) for GPT and BERT, losses and parameters within 1e-5
 *                relative of one rank without recompute
 *   memory       on gpt-bench's shape (configs/gpt-bench.json, batch 8 x 128) the program's
 *                arena with full recompute is at least 60% below none, selective below none;
 *                a pipeline's micro-batch arenas (ms_stages_memory) shrink too; the planner
 *                reads the same arena and FLOPs off the recompiled program
 *
 * Test names end in _wN, the world size they need: the MPI entry filters on it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "engine/plan/cost.h"
#include "engine/train/stages.h"
#include "engine/train/trainer.h"
#include "tests/testkit.h"

#ifndef MS_SOURCE_DIR
#define MS_SOURCE_DIR "."
#endif

enum { B = 8, T = 8, STEPS = 3, MAX_PARAMS = 64 };

/* With dropout, every dropout site drops 10%. */
static ms_model_config config(bool bert, bool dropout) {
    return mt_tiny_config(bert, dropout ? 0.1 : 0);
}

static ms_train_opts opts(void) {
    return mt_train_opts(B, T, STEPS);
}

/* A run's losses and every parameter, full, as world rank 0 gathers them. */
typedef struct result {
    float losses[STEPS];
    int n;
    char names[MAX_PARAMS][96];
    float *data[MAX_PARAMS];
    int64_t len[MAX_PARAMS];
    double slot_bytes; /* one micro-batch arena (ms_stages_memory) */
} result;

static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) free(r->data[i]);
    memset(r, 0, sizeof *r);
}

typedef struct run_arg {
    bool bert, dropout;
    const char *strategy; /* JSON */
    result *out;          /* filled on world rank 0 */
} run_arg;

/* Parameters into out (world rank 0; every rank takes part in the gathers). */
static void gather_params(mt_rank *r, ms_trainer *tr, result *out) {
    ms_error err = {0};
    int ns = ms_trainer_num_state(tr);
    for (int i = 0; i < ns; i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        if (st.kind != MS_STATE_PARAM) continue;
        ms_tensor full = {0};
        if (!MT_OK(r, ms_trainer_state_full(tr, i, &full, &err), &err)) return;
        if (r->ctx->rank == 0 && out->n < MAX_PARAMS) {
            int64_t len = ms_tensor_numel(&full);
            snprintf(out->names[out->n], sizeof out->names[0], "%s", st.param);
            out->len[out->n] = len;
            out->data[out->n] = xmalloc(sizeof(float) * (size_t)len);
            memcpy(out->data[out->n], ms_tensor_f32(&full), sizeof(float) * (size_t)len);
            out->n++;
        }
        ms_tensor_release(&full);
    }
}

static void train(mt_rank *r, void *arg) {
    run_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    const char *line = "And God said, Let there be light: and there was light. ";
    if (!MT_OK(r, mt_repeated_text(line, T, &d, &err), &err)) return;
    ms_model_config cfg = config(a->bert, a->dropout);
    ms_train_opts o = opts();
    ms_strategy s;
    ms_placement_rules rules;
    ms_trainer *tr = NULL;
    if (MT_OK(r, ms_strategy_parse_json(a->strategy, strlen(a->strategy), "case", &s, &rules, &err),
              &err) &&
        MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, &rules, &o, &d, &tr, &err), &err)) {
        for (int step = 0; step < STEPS; step++) {
            ms_step_result res;
            if (!MT_OK(r, ms_trainer_step(tr, &res, &err), &err)) break;
            if (r->ctx->rank == 0) a->out->losses[step] = res.loss;
        }
        ms_stages_memory mem;
        ms_trainer_memory(tr, &mem);
        if (r->ctx->rank == 0) a->out->slot_bytes = mem.slot_bytes;
        gather_params(r, tr, a->out);
        ms_trainer_destroy(tr);
    }
    ms_text_data_close(&d);
}

/* Runs strategy on `world` ranks (threads, or the MPI world) into out. */
static void run(bool bert, bool dropout, const char *strategy, int world, result *out) {
    memset(out, 0, sizeof *out);
    run_arg a = {.bert = bert, .dropout = dropout, .strategy = strategy, .out = out};
    if (world == 1)
        mt_run_threads(1, train, &a);
    else
        mt_run(world, train, &a);
}

/* want's parameter `name`, or -1. */
static int find_param(const result *want, const char *name) {
    for (int i = 0; i < want->n; i++)
        if (!strcmp(want->names[i], name)) return i;
    return -1;
}

/* got against want: bit for bit, or losses within 1e-5 relative and all parameters within
 * 1e-5 relative as one vector (sums in another order move an element whose gradient nearly
 * cancels by a fraction of an AdamW step; a stale or misplaced shard is off by whole steps).
 * Parameters are matched by name: a pipeline holds the tied embedding twice. */
static void compare(const result *got, const result *want, bool bitwise, const char *what) {
    if (mt_world_rank() != 0) return; /* results live on world rank 0 */
    assert_true(want->n > 0 && got->n >= want->n);
    for (int s = 0; s < STEPS; s++) {
        float g = got->losses[s], w = want->losses[s];
        if (bitwise ? g != w : fabsf(g - w) > 1e-5f * fabsf(w))
            fail_msg("%s, step %d: loss %.9g, reference %.9g", what, s, g, w);
    }
    double diff = 0, norm = 0;
    for (int i = 0; i < got->n; i++) {
        int j = find_param(want, got->names[i]);
        if (j < 0 || got->len[i] != want->len[j])
            fail_msg("%s: parameter %s is not the reference's", what, got->names[i]);
        size_t bytes = sizeof(float) * (size_t)want->len[j];
        if (bitwise && memcmp(got->data[i], want->data[j], bytes))
            fail_msg("%s: parameter %s differs from the reference", what, want->names[j]);
        for (int64_t k = 0; k < want->len[j]; k++) {
            double dk = (double)got->data[i][k] - want->data[j][k];
            diff += dk * dk;
            norm += (double)want->data[j][k] * want->data[j][k];
        }
    }
    printf("%-60s parameters %.3g relative from the reference\n", what, sqrt(diff / norm));
    if (sqrt(diff / norm) > 1e-5)
        fail_msg("%s: parameters differ by %.3g", what, sqrt(diff / norm));
}

/* --- bitwise on one rank --------------------------------------------------------------------- */

static void check_bitwise(bool bert, bool dropout) {
    result ref, got;
    run(bert, dropout, "{\"dp\": 1}", 1, &ref);
    const char *modes[] = {"{\"dp\": 1, \"recompute\": \"full\"}",
                           "{\"dp\": 1, \"recompute\": \"selective\"}",
                           "{\"dp\": 1, \"recompute\": \"full\", \"recompute_layers\": 1}"};
    for (int m = 0; m < 3; m++) {
        run(bert, dropout, modes[m], 1, &got);
        char what[160];
        snprintf(what, sizeof what, "%s%s %s", bert ? "bert" : "gpt", dropout ? " dropout" : "",
                 modes[m]);
        compare(&got, &ref, true, what);
        result_free(&got);
    }
    result_free(&ref);
}

/* A bitwise case (tests[]' initial state). */
typedef struct bitwise_case {
    bool bert, dropout;
} bitwise_case;

static void bitwise(void **state) {
    const bitwise_case *c = *state;
    check_bitwise(c->bert, c->dropout);
}

/* --- distributed against one rank ------------------------------------------------------------ */

/* strategy (with recompute) on `world` ranks against one rank without recompute. */
static void check(bool bert, bool dropout, const char *strategy, int world) {
    result ref, got;
    run(bert, dropout, "{\"dp\": 1}", 1, &ref);
    run(bert, dropout, strategy, world, &got);
    compare(&got, &ref, false, strategy);
    result_free(&got);
    result_free(&ref);
}

/* A distributed case (tests[]' initial state). */
typedef struct dist_case {
    bool bert, dropout;
    int world;
    const char *strategy;
} dist_case;

static void distributed(void **state) {
    const dist_case *c = *state;
    check(c->bert, c->dropout, c->strategy, c->world);
}

/* A pipeline with recompute against one rank, and its micro-batch arenas against the same
 * pipeline without recompute (full: smaller, zb-h1 included, whose weight pass recomputes a
 * layer again; selective: never larger). */
static void check_pipeline(bool bert, const char *schedule, const char *mode) {
    char none[160], rc[200];
    snprintf(none, sizeof none, "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"%s\"}",
             schedule);
    snprintf(rc, sizeof rc,
             "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"%s\", \"recompute\": \"%s\"}",
             schedule, mode);
    result ref, base, got;
    run(bert, false, "{\"dp\": 1}", 1, &ref);
    run(bert, false, none, 2, &base);
    run(bert, false, rc, 2, &got);
    compare(&got, &ref, false, rc);
    if (mt_world_rank() == 0) {
        printf("%-60s micro-batch arena %.0f B, without recompute %.0f B\n", rc, got.slot_bytes,
               base.slot_bytes);
        /* selective: zb-h1's peak is where B hands over to W, after every attention's B */
        bool full = !strcmp(mode, "full");
        assert_true(got.slot_bytes > 0 && got.slot_bytes <= base.slot_bytes);
        assert_true(!full || got.slot_bytes < base.slot_bytes);
    }
    result_free(&got);
    result_free(&base);
    result_free(&ref);
}

/* A pipeline case (tests[]' initial state). */
typedef struct pipe_case {
    bool bert;
    const char *schedule, *mode;
} pipe_case;

static void pipeline(void **state) {
    const pipe_case *c = *state;
    check_pipeline(c->bert, c->schedule, c->mode);
}

/* --- the program ------------------------------------------------------------------------------ */

/* model under strategy json, compiled from shapes for mesh coordinate 0. */
static ms_program *compile(const ms_model_config *cfg, int batch, int seq, const char *json,
                           ms_model *model) {
    ms_strategy s;
    ms_error err = {0};
    if (ms_strategy_parse_json(json, strlen(json), "case", &s, NULL, &err) != MS_OK ||
        ms_model_build(cfg, batch, seq, model, &err) != MS_OK)
        fail_msg("%s: %s", json, err.msg);
    ms_mesh mesh = {0};
    assert_int_equal(ms_strategy_mesh(&s, &mesh, &err), MS_OK);
    ms_sharding sh = {0};
    ms_compile_opts co = ms_strategy_compile_opts(&s, &sh);
    ms_program *p = NULL;
    if (ms_program_compile_shapes(model->g, &mesh, NULL, &co, &p, &err) != MS_OK)
        fail_msg("%s: %s", json, err.msg);
    ms_mesh_free(&mesh);
    return p;
}

/* What a program runs, by phase: kernels, their FLOPs, reshards. */
typedef struct census {
    int kernels[MS_PROG_PHASE_COUNT], reshards[MS_PROG_PHASE_COUNT];
    double flops[MS_PROG_PHASE_COUNT];
} census;

static census count(const ms_program *p) {
    census c;
    memset(&c, 0, sizeof c);
    ms_kernel_info kn;
    for (int i = 0; i < ms_program_num_kernels(p); i++) {
        assert_int_equal(ms_program_kernel(p, i, &kn), MS_OK);
        c.kernels[kn.phase]++;
        c.flops[kn.phase] += kn.flops;
    }
    ms_reshard_info ri;
    for (int i = 0; i < ms_program_num_reshards(p); i++) {
        assert_int_equal(ms_program_reshard(p, i, &ri), MS_OK);
        c.reshards[ri.phase]++;
    }
    return c;
}

/* Every recompute kernel is a node of a region of `kind` and runs before that node's
 * backward; returns how many forward kernels (and their FLOPs) such regions hold. */
static int check_order(const ms_program *p, const ms_graph *g, ms_region_kind kind,
                       double *region_flops) {
    int nk = ms_program_num_kernels(p), in_regions = 0;
    *region_flops = 0;
    ms_kernel_info kn, bk;
    for (int i = 0; i < nk; i++) {
        ms_program_kernel(p, i, &kn);
        bool in_region = ms_graph_node_region(g, kn.node, kind) >= 0;
        if (kn.phase == MS_PROG_FORWARD && in_region) in_regions++, *region_flops += kn.flops;
        if (kn.phase != MS_PROG_RECOMPUTE) continue;
        if (!in_region) fail_msg("%s is recomputed outside a region", kn.name);
        int j = i + 1;
        for (; j < nk; j++)
            if (ms_program_kernel(p, j, &bk) == MS_OK && bk.node == kn.node &&
                bk.phase == MS_PROG_BACKWARD)
                break;
        if (j == nk) fail_msg("%s: no backward after its recompute", kn.name);
    }
    return in_regions;
}

static void program_recomputes_regions(void **state) {
    (void)state;
    ms_model_config cfg = config(false, false);
    const char *none = "{\"tp\": 2, \"sp\": true}";
    const char *full = "{\"tp\": 2, \"sp\": true, \"recompute\": \"full\"}";
    const char *sel = "{\"tp\": 2, \"sp\": true, \"recompute\": \"selective\"}";
    ms_model mn, mf, ms;
    ms_program *pn = compile(&cfg, B, T, none, &mn), *pf = compile(&cfg, B, T, full, &mf),
               *ps = compile(&cfg, B, T, sel, &ms);
    census cn = count(pn), cf = count(pf), cs = count(ps);
    double block_flops, attn_flops;
    int blocks = check_order(pf, mf.g, MS_REGION_BLOCK, &block_flops);
    int attn = check_order(ps, ms.g, MS_REGION_ATTENTION, &attn_flops);
    printf("full: %d of %d forward kernels again, %d reshards again; selective: %d kernels\n",
           cf.kernels[MS_PROG_RECOMPUTE], cf.kernels[MS_PROG_FORWARD],
           cf.reshards[MS_PROG_RECOMPUTE], cs.kernels[MS_PROG_RECOMPUTE]);
    assert_int_equal(cn.kernels[MS_PROG_RECOMPUTE], 0);
    /* full: every block's forward again, with its sp all-gathers and reduce-scatters */
    assert_int_equal(cf.kernels[MS_PROG_RECOMPUTE], blocks);
    assert_true(blocks >= 10 * cfg.n_layer);
    assert_true(cf.reshards[MS_PROG_RECOMPUTE] >= 2 * cfg.n_layer);
    assert_true(cf.flops[MS_PROG_RECOMPUTE] == block_flops);
    /* selective: attention's core, once per layer, no collective */
    assert_int_equal(attn, cfg.n_layer);
    assert_int_equal(cs.kernels[MS_PROG_RECOMPUTE], cfg.n_layer);
    assert_true(cs.flops[MS_PROG_RECOMPUTE] == attn_flops);
    /* the rest of the step is the same program */
    for (int ph = 0; ph < MS_PROG_RECOMPUTE; ph++) {
        assert_int_equal(cf.kernels[ph], cn.kernels[ph]);
        assert_int_equal(cs.kernels[ph], cn.kernels[ph]);
        assert_int_equal(cf.reshards[ph], cn.reshards[ph]);
        assert_true(cf.flops[ph] == cn.flops[ph]);
    }
    ms_program_stats sn, sf;
    ms_program_stats_get(pn, &sn);
    ms_program_stats_get(pf, &sf);
    assert_true(sf.flops == sn.flops + block_flops);
    assert_string_equal(ms_program_phase_name(MS_PROG_RECOMPUTE), "recompute");
    ms_program_destroy(pn), ms_program_destroy(pf), ms_program_destroy(ps);
    ms_model_free(&mn), ms_model_free(&mf), ms_model_free(&ms);
}

/* --- memory ------------------------------------------------------------------------------------
 */

static ms_program_stats stats_of(const ms_model_config *cfg, const char *json) {
    ms_model m;
    ms_program *p = compile(cfg, 8, 128, json, &m);
    ms_program_stats st;
    ms_program_stats_get(p, &st);
    assert_true(ms_program_arena_bytes(p) >= st.arena_bytes);
    ms_program_destroy(p);
    ms_model_free(&m);
    return st;
}

/* The planner's engine figures for json on gpt-bench, batch 8 x 128. */
static ms_plan_engine_stats planner_of(const ms_model_config *cfg, const char *json) {
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_parse_json(json, strlen(json), "t", &s, NULL, &err), MS_OK);
    ms_cluster c = {.cpu = true};
    snprintf(c.backend, sizeof c.backend, "threads");
    ms_plan_problem pb = {.model = *cfg,
                          .devices = ms_strategy_ranks(&s),
                          .global_batch = 8,
                          .seq = 128,
                          .cluster = &c,
                          .engine_workloads = true};
    ms_plan_engine_stats es;
    if (ms_plan_engine_stats_get(&pb, &s, &es, &err) != MS_OK) fail_msg("%s", err.msg);
    return es;
}

/* gpt-bench, batch 8 x 128. Activations (the arena's peak without the parameter gradients
 * that wait in it for the grad sync under dp): full recompute at least 60% below none on every
 * mesh, selective below none; the arena itself too on one rank, where no dp gradient waits.
 * The planner reads the same arena and FLOPs off the same programs. */
static void gpt_bench_arena(void **state) {
    (void)state;
    ms_model_config cfg = mt_source_config("gpt-bench.json");
    const char *meshes[] = {"{\"dp\": 1", "{\"dp\": 2, \"tp\": 2", "{\"dp\": 4"};
    const char *modes[] = {"}", ", \"recompute\": \"full\"}", ", \"recompute\": \"selective\"}"};
    for (int m = 0; m < 3; m++) {
        ms_program_stats st[3];
        for (int k = 0; k < 3; k++) {
            char json[128];
            snprintf(json, sizeof json, "%s%s", meshes[m], modes[k]);
            st[k] = stats_of(&cfg, json);
            ms_plan_engine_stats es = planner_of(&cfg, json);
            assert_true(es.arena_bytes == (double)st[k].arena_bytes);
            assert_true(fabs(es.flops - st[k].flops) <= 1e-9 * st[k].flops);
            printf("gpt-bench %-46s arena %6.2f MiB, activations %6.2f MiB, %.4g FLOPs\n", json,
                   (double)st[k].arena_bytes / 1048576.0,
                   (double)st[k].activation_bytes / 1048576.0, st[k].flops);
        }
        assert_true((double)st[1].activation_bytes <= 0.4 * (double)st[0].activation_bytes);
        if (m == 0) assert_true((double)st[1].arena_bytes <= 0.4 * (double)st[0].arena_bytes);
        assert_true(st[2].arena_bytes < st[0].arena_bytes);
        assert_true(st[1].activation_bytes < st[2].activation_bytes &&
                    st[2].activation_bytes < st[0].activation_bytes);
        assert_true(st[0].flops < st[2].flops && st[2].flops < st[1].flops);
        /* full recompute of the first 2 of the 4 layers: between none and full, half the
         * recomputed forward FLOPs, and what the planner reads */
        char json[160];
        snprintf(json, sizeof json, "%s, \"recompute\": \"full\", \"recompute_layers\": 2}",
                 meshes[m]);
        ms_program_stats half = stats_of(&cfg, json);
        ms_plan_engine_stats es = planner_of(&cfg, json);
        assert_true(es.arena_bytes == (double)half.arena_bytes);
        printf("gpt-bench %-46s activations %6.2f MiB, %.4g FLOPs\n", json,
               (double)half.activation_bytes / 1048576.0, half.flops);
        assert_true(st[1].activation_bytes < half.activation_bytes &&
                    half.activation_bytes < st[0].activation_bytes);
        assert_true(st[0].flops < half.flops && half.flops < st[1].flops);
        assert_true(fabs((half.flops - st[0].flops) / (st[1].flops - st[0].flops) - 0.5) < 0.05);
    }
}

/* --- the pipeline's shared scratch ---------------------------------------------------------
 *
 * A micro-batched program told that SCR_MB micro-batches are in flight at once
 * (ms_compile_opts.inflight) moves what lives within one pass into a scratch all of them share.
 * Run as a gpipe stage runs it (every forward, then every backward, each micro-batch on its own
 * arena), with the scratch filled with NaN after every pass, it must give the losses and
 * gradients, bit for bit, of the same program laid out with one arena per micro-batch: nothing
 * a pass leaves in the scratch is read by a later one. And it must take less memory in all. */

enum { SCR_MB = 4, SCR_B = 2, SCR_T = 16 };

static float *scratch_alloc(size_t bytes) {
    float *x = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(x);
    return x;
}

static void poison(float *x, size_t bytes) {
    for (size_t i = 0; x && i < bytes / sizeof(float); i++) x[i] = NAN;
}

/* Micro-batch j's ids, positions and targets, fed to p. */
static void feed_micro(mt_rank *r, ms_program *p, const ms_model *md, int vocab, int j) {
    ms_error err = {0};
    float v[SCR_B * SCR_T];
    for (int i = 0; i < SCR_B * SCR_T; i++) v[i] = (float)((i * 7 + j * 13 + i / 5) % vocab);
    MT_OK(r, ms_program_feed(p, md->ids, v, &err), &err);
    for (int i = 0; i < SCR_B * SCR_T; i++) v[i] = (float)((i * 7 + j * 13 + i / 5 + 1) % vocab);
    MT_OK(r, ms_program_feed(p, md->targets, v, &err), &err);
    if (md->pos >= 0) {
        for (int i = 0; i < SCR_B * SCR_T; i++) v[i] = (float)(i % SCR_T);
        MT_OK(r, ms_program_feed(p, md->pos, v, &err), &err);
    }
}

/* SCR_MB forwards, then their backwards in reverse, then the grad sync; losses into loss. */
static void run_gpipe(mt_rank *r, ms_program *p, const ms_model *md, int vocab, float *loss) {
    ms_error err = {0};
    size_t ab = ms_program_arena_bytes(p), sb = ms_program_scratch_bytes(p);
    float *arena[SCR_MB], *scr = sb ? scratch_alloc(sb) : NULL;
    for (int j = 0; j < SCR_MB; j++) arena[j] = scratch_alloc(ab);
    if (scr) ms_program_bind_scratch(p, scr);
    MT_OK(r, ms_program_zero_grads(p, &err), &err);
    for (int j = 0; j < SCR_MB; j++) {
        ms_program_bind_arena(p, arena[j]);
        feed_micro(r, p, md, vocab, j);
        MT_OK(r, ms_program_forward(p, &loss[j], &err), &err);
        poison(scr, sb);
    }
    for (int j = SCR_MB - 1; j >= 0; j--) {
        ms_program_bind_arena(p, arena[j]);
        MT_OK(r, ms_program_backward(p, &err), &err);
        poison(scr, sb);
    }
    MT_OK(r, ms_program_grad_sync(p, &err), &err);
    for (int j = 0; j < SCR_MB; j++) free(arena[j]);
    free(scr);
}

/* A mesh of this one rank and its communicators. */
static bool one_rank_mesh(mt_rank *r, ms_mesh *mesh, ms_dmesh **dm, ms_error *err) {
    int shape[1] = {1};
    return MT_OK(r, ms_mesh_init(mesh, 1, shape, NULL, NULL, err), err) &&
           MT_OK(r, ms_dmesh_create(r->ctx, mesh, dm, err), err);
}

static void scratch_rank(mt_rank *r, void *arg) {
    const char *mode = arg;
    ms_error err = {0};
    ms_model_config cfg = config(false, false);
    ms_mesh mesh = {0};
    ms_dmesh *dm = NULL;
    if (!one_rank_mesh(r, &mesh, &dm, &err)) return;
    ms_model md[2];
    ms_program *p[2] = {NULL, NULL};
    float loss[2][SCR_MB];
    for (int k = 0; k < 2; k++) {
        MT_OK(r, ms_model_build(&cfg, SCR_B, SCR_T, &md[k], &err), &err);
        ms_compile_opts co = {.seed = 5,
                              .micro_batched = true,
                              .micro_batches = SCR_MB,
                              .loss_scale = 1.0f / SCR_MB,
                              .recompute = !strcmp(mode, "full") ? 1u << MS_REGION_BLOCK : 0,
                              .inflight = k ? SCR_MB : 1};
        if (!MT_OK(r, ms_program_compile(md[k].g, dm, &co, &p[k], &err), &err)) return;
        run_gpipe(r, p[k], &md[k], cfg.vocab_size, loss[k]);
    }
    ms_program_stats one, shared;
    ms_program_stats_get(p[0], &one);
    ms_program_stats_get(p[1], &shared);
    printf("recompute %-5s %d in flight: one arena each %.0f B (%.0f B in all); micro-batch arena "
           "%.0f B + shared scratch %.0f B (%.0f B in all)\n",
           mode, SCR_MB, (double)one.arena_bytes, (double)SCR_MB * one.arena_bytes,
           (double)shared.arena_bytes, (double)shared.scratch_bytes,
           (double)SCR_MB * shared.arena_bytes + shared.scratch_bytes);
    MT_CHECK(r, one.scratch_bytes == 0, "one arena each, yet a scratch of %zu B",
             (size_t)one.scratch_bytes);
    MT_CHECK(r, shared.scratch_bytes > 0 && shared.arena_bytes < one.arena_bytes,
             "the shared scratch takes nothing out of the micro-batch arena");
    MT_CHECK(r,
             (double)SCR_MB * shared.arena_bytes + shared.scratch_bytes <
                 (double)SCR_MB * one.arena_bytes,
             "the shared scratch takes no less memory in all");
    MT_CHECK(r, !memcmp(loss[0], loss[1], sizeof loss[0]), "losses differ with the scratch");
    for (int j = 0; j < SCR_MB; j++) MT_CHECK(r, isfinite(loss[1][j]), "loss %d not finite", j);
    MT_CHECK(r, ms_program_num_params(p[0]) == ms_program_num_params(p[1]),
             "the two layouts have different parameters");
    for (int i = 0; i < ms_program_num_params(p[0]); i++) {
        ms_param_view a, b;
        MT_OK(r, ms_program_param(p[0], i, &a), NULL);
        MT_OK(r, ms_program_param(p[1], i, &b), NULL);
        int64_t n = ms_tensor_numel(&a.grad);
        MT_CHECK(
            r,
            n == ms_tensor_numel(&b.grad) &&
                !memcmp(ms_tensor_f32(&a.grad), ms_tensor_f32(&b.grad), sizeof(float) * (size_t)n),
            "parameter %d's gradient differs with the scratch", i);
    }
    /* Zeroing the gradients clears every one (the micro-batch accumulators too) and touches
     * no parameter: the gradient buffers go in merged ranges, which must cover them all and
     * reach nothing beside them. So zeroing leaves only zeros, and the same step again (it
     * zeroes first) gives the same gradients and losses, bit for bit. */
    for (int k = 0; k < 2; k++) {
        const int np = ms_program_num_params(p[k]);
        float **data = xmalloc(sizeof *data * (size_t)np),
              **grad = xmalloc(sizeof *grad * (size_t)np);
        for (int i = 0; i < np; i++) {
            ms_param_view v;
            MT_OK(r, ms_program_param(p[k], i, &v), NULL);
            const size_t nd = sizeof(float) * (size_t)ms_tensor_numel(&v.data),
                         ng = sizeof(float) * (size_t)ms_tensor_numel(&v.grad);
            data[i] = memcpy(xmalloc(nd), ms_tensor_f32(&v.data), nd);
            grad[i] = memcpy(xmalloc(ng), ms_tensor_f32(&v.grad), ng);
        }
        MT_OK(r, ms_program_zero_grads(p[k], &err), &err);
        for (int i = 0; i < np; i++) {
            ms_param_view v;
            MT_OK(r, ms_program_param(p[k], i, &v), NULL);
            int64_t left = 0;
            for (int64_t e = 0; e < ms_tensor_numel(&v.grad); e++)
                left += ms_tensor_f32(&v.grad)[e] != 0.0f;
            MT_CHECK(r, left == 0, "layout %d: %lld of parameter %d's gradient left after zeroing",
                     k, (long long)left, i);
            MT_CHECK(r,
                     !memcmp(data[i], ms_tensor_f32(&v.data),
                             sizeof(float) * (size_t)ms_tensor_numel(&v.data)),
                     "layout %d: zeroing the gradients changed parameter %d", k, i);
        }
        float again[SCR_MB];
        run_gpipe(r, p[k], &md[k], cfg.vocab_size, again);
        MT_CHECK(r, !memcmp(again, loss[k], sizeof again), "layout %d: the step again differs", k);
        for (int i = 0; i < np; i++) {
            ms_param_view v;
            MT_OK(r, ms_program_param(p[k], i, &v), NULL);
            MT_CHECK(r,
                     !memcmp(grad[i], ms_tensor_f32(&v.grad),
                             sizeof(float) * (size_t)ms_tensor_numel(&v.grad)),
                     "layout %d: parameter %d's gradient differs the second time", k, i);
            free(data[i]), free(grad[i]);
        }
        free(data), free(grad);
    }
    /* without its scratch, the program refuses to run and names the call that binds one */
    float *arena = scratch_alloc(ms_program_arena_bytes(p[1])), l = 0;
    ms_program_bind_scratch(p[1], NULL);
    ms_program_bind_arena(p[1], arena);
    MT_CHECK(r, ms_program_forward(p[1], &l, &err) == MS_ERR_INVALID,
             "a forward without its scratch ran");
    MT_CHECK(r, strstr(err.msg, "ms_program_bind_scratch"),
             "the refusal does not name the call: %s", err.msg);
    free(arena);
    for (int k = 0; k < 2; k++) {
        ms_program_destroy(p[k]);
        ms_model_free(&md[k]);
    }
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void shared_scratch(void **state) {
    mt_run_threads(1, scratch_rank, *state);
}

/* ---- gradients written whole by the kernel that writes them first ----
 * A program that drops the zeroing of a gradient whose first writer writes it whole
 * (ms_op_def.fresh_ok: the products' dA and dB) gives the losses and gradients of the same
 * program zeroing every gradient (ms_compile_opts.zero_all_grads), equal as numbers (a product
 * written whole keeps a -0 that 0 + -0 would make +0), and each zeroing it dropped is one
 * buffer written whole instead. */
/* Element e of a contiguous fp32 or bf16 tensor, as a float. */
static float elem_f32(const ms_tensor *t, int64_t e) {
    return t->dtype == MS_BF16 ? ms_f32_from_bf16(((const uint16_t *)ms_tensor_data(t))[e])
                               : ms_tensor_f32(t)[e];
}

static void fresh_rank(mt_rank *r, void *arg) {
    const bool bf16 = arg != NULL;
    ms_error err = {0};
    ms_model_config cfg = config(false, false);
    ms_mesh mesh = {0};
    ms_dmesh *dm = NULL;
    if (!one_rank_mesh(r, &mesh, &dm, &err)) return;
    ms_model md[2];
    ms_program *p[2] = {NULL, NULL};
    float loss[2] = {0, 0};
    ms_program_stats st[2];
    for (int k = 0; k < 2; k++) {
        MT_OK(r, ms_model_build(&cfg, SCR_B, SCR_T, &md[k], &err), &err);
        ms_compile_opts co = {.seed = 5, .bf16 = bf16, .zero_all_grads = k == 1};
        if (!MT_OK(r, ms_program_compile(md[k].g, dm, &co, &p[k], &err), &err)) return;
        feed_micro(r, p[k], &md[k], cfg.vocab_size, 0);
        MT_OK(r, ms_program_step(p[k], &loss[k], &err), &err);
        ms_program_stats_get(p[k], &st[k]);
    }
    printf("%s: %d gradients zeroed (%.0f B) and %d written whole (%.0f B); zeroing them all: %d "
           "(%.0f B)\n",
           bf16 ? "bf16" : "fp32", st[0].zeroed_grads, st[0].zeroed_bytes, st[0].fresh_grads,
           st[0].fresh_bytes, st[1].zeroed_grads, st[1].zeroed_bytes);
    MT_CHECK(r, st[0].fresh_grads > 0 && st[1].fresh_grads == 0, "written whole: %d and %d",
             st[0].fresh_grads, st[1].fresh_grads);
    MT_CHECK(r,
             st[0].zeroed_grads + st[0].fresh_grads == st[1].zeroed_grads &&
                 st[0].zeroed_bytes + st[0].fresh_bytes == st[1].zeroed_bytes,
             "the zeroings dropped are not the buffers written whole");
    MT_CHECK(r, loss[0] == loss[1] && isfinite(loss[0]), "loss %.9g, zeroing all %.9g", loss[0],
             loss[1]);
    for (int i = 0; i < ms_program_num_params(p[0]); i++) {
        ms_param_view a, b;
        MT_OK(r, ms_program_param(p[0], i, &a), NULL);
        MT_OK(r, ms_program_param(p[1], i, &b), NULL);
        const int64_t n = ms_tensor_numel(&a.grad);
        int64_t differ = 0;
        for (int64_t e = 0; e < n; e++) {
            differ += elem_f32(&a.grad, e) != elem_f32(&b.grad, e);
        }
        MT_CHECK(r, differ == 0, "parameter %d: %lld of its gradient differ", i, (long long)differ);
    }
    for (int k = 0; k < 2; k++) {
        ms_program_destroy(p[k]);
        ms_model_free(&md[k]);
    }
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void fresh_gradients_fp32(void **state) {
    (void)state;
    mt_run_threads(1, fresh_rank, NULL);
}

static void fresh_gradients_bf16(void **state) {
    (void)state;
    mt_run_threads(1, fresh_rank, (void *)1);
}

/* Test names end in _wN, the world size they need (the MPI entry filters on it). */
// clang-format off
#define BITWISE(name, bert, dropout) \
    {#name, bitwise, NULL, NULL, &(bitwise_case){bert, dropout}}
#define DIST(name, bert, dropout, world, json) \
    {#name, distributed, NULL, NULL, &(dist_case){bert, dropout, world, json}}
#define PIPE(name, bert, schedule, mode) \
    {#name, pipeline, NULL, NULL, &(pipe_case){bert, schedule, mode}}
// clang-format on
#define RC_FULL ", \"recompute\": \"full\"}"
#define RC_SEL  ", \"recompute\": \"selective\"}"

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(program_recomputes_regions),
    cmocka_unit_test(gpt_bench_arena),
    {"shared_scratch_full", shared_scratch, NULL, NULL, (void *)"full"},
    cmocka_unit_test(fresh_gradients_fp32),
    cmocka_unit_test(fresh_gradients_bf16),
    {"shared_scratch_none", shared_scratch, NULL, NULL, (void *)"none"},
    BITWISE(gpt_bitwise_w1, false, false),
    BITWISE(bert_bitwise_w1, true, false),
    BITWISE(gpt_dropout_bitwise_w1, false, true),
    BITWISE(bert_dropout_bitwise_w1, true, true),
    DIST(gpt_dp2_full_w2, false, false, 2, "{\"dp\": 2" RC_FULL),
    DIST(gpt_tp2_selective_w2, false, false, 2, "{\"tp\": 2" RC_SEL),
    DIST(gpt_tp2_sp_full_w2, false, false, 2, "{\"tp\": 2, \"sp\": true" RC_FULL),
    DIST(gpt_tp2_sp_dropout_full_w2, false, true, 2, "{\"tp\": 2, \"sp\": true" RC_FULL),
    DIST(gpt_cp2_full_w2, false, false, 2, "{\"cp\": 2" RC_FULL),
    DIST(gpt_cp2_selective_w2, false, false, 2, "{\"cp\": 2" RC_SEL),
    DIST(bert_dp2_selective_w2, true, false, 2, "{\"dp\": 2" RC_SEL),
    DIST(bert_tp2_sp_full_w2, true, false, 2, "{\"tp\": 2, \"sp\": true" RC_FULL),
    DIST(bert_cp2_full_w2, true, false, 2, "{\"cp\": 2" RC_FULL),
    PIPE(gpt_pp2_1f1b_full_w2, false, "1f1b", "full"),
    PIPE(gpt_pp2_zb_h1_full_w2, false, "zb-h1", "full"),
    PIPE(gpt_pp2_zb_h1_selective_w2, false, "zb-h1", "selective"),
    PIPE(bert_pp2_1f1b_selective_w2, true, "1f1b", "selective"),
    PIPE(bert_pp2_zb_h1_full_w2, true, "zb-h1", "full"),
    DIST(gpt_pp2_interleaved_full_w2, false, false, 2,
         "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"interleaved\", \"virtual_stages\": "
         "2" RC_FULL),
    DIST(bert_pp2_gpipe_selective_w2, true, false, 2,
         "{\"pp\": 2, \"micro_batches\": 4, \"schedule\": \"gpipe\"" RC_SEL),
    DIST(gpt_dp2_tp2_sp_full_w4, false, false, 4, "{\"dp\": 2, \"tp\": 2, \"sp\": true" RC_FULL),
    DIST(bert_tp2_pp2_zb_h1_full_w4, true, false, 4,
         "{\"tp\": 2, \"pp\": 2, \"micro_batches\": 4, \"schedule\": \"zb-h1\"" RC_FULL),
    /* the first layer of each chunk recomputed, the other kept (recompute_layers) */
    DIST(gpt_dp2_tp2_first_layer_w4, false, true, 4,
         "{\"dp\": 2, \"tp\": 2, \"recompute\": \"full\", \"recompute_layers\": 1}"),
    DIST(bert_pp2_first_layer_w2, true, false, 2,
         "{\"pp\": 2, \"micro_batches\": 2, \"recompute\": \"full\", \"recompute_layers\": 1}"),
};

MT_MAIN("test_recompute", tests)

/* test_auto_place.c - automatic placements (engine/plan/auto_place.h).
 *
 * The search, for GPT-2, BERT and LLaMA tiny configs with the hand layout removed (no hints),
 * under tp 2 and tp 4 with and without sp, priced on the h100 preset: its layout moves at most
 * the hand (Megatron) layout's collective bytes per step and is predicted at least as fast;
 * and with the memory per rank limited to the hand layout's, it still finds a layout at least
 * as fast as the hand layout. Then the edges (tp 1, a memory limit nothing fits, pins and their
 * contradictions, the solver's time limit, the strategy file's "auto"), and a GPT-2 tiny
 * trained under dp2 x tp2 with the rules found gives the one-rank run's losses.
 *
 * `test_auto_place --table` prints the table of docs/planner.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/auto_place.h"
#include "profiler/advisor.h"
#include "engine/train/trainer.h"
#include "tests/testkit.h"

#ifndef MS_SOURCE_DIR
#define MS_SOURCE_DIR "."
#endif

enum { BATCH = 8, SEQ = 32 };

static ms_cluster h100(void) {
    ms_cluster c;
    ms_error err = {0};
    if (ms_cluster_load(MS_SOURCE_DIR "/configs/clusters/h100.json", &c, &err) != MS_OK)
        fail_msg("%s", err.msg);
    /* The tiny configs' GEMMs (a few hundred rows) fill one partial wave of the H100's 132 SMs
     * whether sharded or not, so under wave quantization sharding saves no time and the
     * search rightly keeps them whole; the cases here are about layouts at shapes where
     * compute scales with the shard, as GPT-2's and LLaMA's do. */
    c.sms = 0;
    return c;
}

static ms_plan_problem problem(const ms_model_config *m, const ms_cluster *c, int devices) {
    return (ms_plan_problem){.model = *m,
                             .devices = devices,
                             .global_batch = BATCH,
                             .seq = SEQ,
                             .dtype = MS_PLAN_FP32,
                             .cluster = c,
                             .engine_workloads = true};
}

typedef struct row {
    const char *model;
    int tp;
    bool sp;
    double hand_bytes, auto_bytes, hand_step, auto_step, runner_step, search_ms;
    int compiles;
    char rules[2048];
    /* the search again under the hand layout's memory per rank */
    double lim_bytes, lim_step, lim_search_ms, hand_mem, lim_mem;
    int lim_compiles;
    char lim_rules[2048];
} row;

/* The hand layout and the search, one case. */
static void run_case(const char *config, int tp, bool sp, row *out) {
    ms_model_config m = mt_source_config(config);
    ms_cluster c = h100();
    ms_plan_problem pb = problem(&m, &c, tp);
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&s, 1, tp, 1, sp, &err), MS_OK);
    ms_plan_estimate hand;
    if (ms_plan_estimate_one(&pb, &s, NULL, &hand, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_true(hand.from_engine);
    ms_auto_place_result *r = malloc(sizeof *r);
    /* this search's memo is kept warm for a second one below */
    ms_plan_memo *memo = ms_plan_memo_create();
    ms_plan_problem warm = pb;
    warm.memo = memo;
    if (ms_plan_auto_placements(&warm, &s, NULL, r, &err) != MS_OK) fail_msg("%s", err.msg);
    *out = (row){.model = config,
                 .tp = tp,
                 .sp = sp,
                 .hand_bytes = ms_plan_estimate_coll_bytes(&hand),
                 .auto_bytes = r->coll_bytes,
                 .hand_step = hand.step_s,
                 .auto_step = r->best.step_s,
                 .runner_step = r->have_runner_up ? r->runner_up.step_s : 0,
                 .search_ms = r->search_ms,
                 .compiles = r->compiles};
    ms_auto_place_rules_str(&r->rules, out->rules, sizeof out->rules);
    /* under the hand layout's memory per rank the search must shard, weights and activations
     * alike (sp's layout is the residual stream split on its sequence) */
    ms_auto_place_opts lim = {.mem_limit = hand.mem_total};
    ms_auto_place_result *rl = malloc(sizeof *rl);
    if (ms_plan_auto_placements(&pb, &s, &lim, rl, &err) != MS_OK) fail_msg("%s", err.msg);
    out->lim_bytes = rl->coll_bytes, out->lim_step = rl->best.step_s;
    out->lim_search_ms = rl->search_ms, out->lim_compiles = rl->compiles;
    out->hand_mem = hand.mem_total, out->lim_mem = rl->best.mem_total;
    assert_true(rl->best.mem_total <= hand.mem_total);
    ms_auto_place_rules_str(&rl->rules, out->lim_rules, sizeof out->lim_rules);
    /* the same search on the warm memo (every reshard plan and bubble already made) finds the
     * same layout, to the bit */
    ms_auto_place_result *rw = malloc(sizeof *rw);
    if (ms_plan_auto_placements(&warm, &s, &lim, rw, &err) != MS_OK) fail_msg("%s", err.msg);
    char warm_rules[2048];
    ms_auto_place_rules_str(&rw->rules, warm_rules, sizeof warm_rules);
    assert_string_equal(warm_rules, out->lim_rules);
    assert_true(rw->best.step_s == rl->best.step_s);
    assert_true(rw->best.mem_total == rl->best.mem_total);
    assert_true(rw->coll_bytes == rl->coll_bytes);
    free(rw);
    ms_plan_memo_destroy(memo);
    free(rl);
    assert_true(r->rules.no_hints);
    assert_true(r->rules.n > 0);
    assert_true(r->have_runner_up);
    assert_true(r->runner_up.step_s >= r->best.step_s);
    assert_true(r->compiles >= 1 + r->classes);
    /* the search's own figure agrees with pricing its rules again */
    ms_plan_problem again = pb;
    again.rules = &r->rules;
    ms_plan_estimate e;
    assert_int_equal(ms_plan_estimate_one(&again, &s, NULL, &e, &err), MS_OK);
    assert_true(fabs(e.step_s - r->best.step_s) <= 1e-12 * r->best.step_s);
    free(r);
}

static const char *const configs[3] = {"gpt-tiny.json", "bert-tiny.json", "llama-tiny.json"};

static void check_case(const char *config, int tp, bool sp) {
    row x;
    run_case(config, tp, sp, &x);
    printf("%s tp%d%s: hand %.0f B %.3f ms, auto %.0f B %.3f ms (%d compiles, %.0f ms)\n  %s\n",
           config, tp, sp ? " +sp" : "", x.hand_bytes, x.hand_step * 1e3, x.auto_bytes,
           x.auto_step * 1e3, x.compiles, x.search_ms, x.rules);
    printf(
        "  under the hand layout's %.0f B: auto %.0f B %.3f ms, %.0f B (%d compiles, %.0f ms)\n  "
        "%s\n",
        x.hand_mem, x.lim_bytes, x.lim_step * 1e3, x.lim_mem, x.lim_compiles, x.lim_search_ms,
        x.lim_rules);
    if (!(x.auto_bytes <= x.hand_bytes))
        fail_msg("%s tp%d%s: the auto layout moves %.0f bytes, the hand layout %.0f", config, tp,
                 sp ? " +sp" : "", x.auto_bytes, x.hand_bytes);
    if (!(x.auto_step <= x.hand_step * (1 + 1e-9)))
        fail_msg("%s tp%d%s: the hand layout is predicted faster: %.3f ms, auto %.3f", config, tp,
                 sp ? " +sp" : "", x.hand_step * 1e3, x.auto_step * 1e3);
    /* in the hand layout's memory, at least as fast as the hand layout, or inside the 1% tie
     * band with fewer collective bytes */
    if (!(x.lim_step <= x.hand_step * (1 + 1e-9) ||
          (x.lim_step <= x.hand_step * 1.01 && x.lim_bytes < x.hand_bytes)))
        fail_msg("%s tp%d%s: under the hand layout's memory the search found %.4f ms, the hand "
                 "layout runs %.4f ms",
                 config, tp, sp ? " +sp" : "", x.lim_step * 1e3, x.hand_step * 1e3);
}

static void test_gpt(void **state) {
    (void)state;
    for (int tp = 2; tp <= 4; tp *= 2)
        for (int sp = 0; sp < 2; sp++) check_case(configs[0], tp, sp);
}

static void test_bert(void **state) {
    (void)state;
    for (int tp = 2; tp <= 4; tp *= 2)
        for (int sp = 0; sp < 2; sp++) check_case(configs[1], tp, sp);
}

static void test_llama(void **state) {
    (void)state;
    for (int tp = 2; tp <= 4; tp *= 2)
        for (int sp = 0; sp < 2; sp++) check_case(configs[2], tp, sp);
}

/* GPT-2 tiny on the h100 preset under dp x tp (m and c hold what the problem points at). */
static ms_plan_problem gpt_tiny(ms_model_config *m, ms_cluster *c, ms_strategy *s, int dp, int tp) {
    *m = mt_source_config("gpt-tiny.json");
    *c = h100();
    ms_error err = {0};
    if (ms_strategy_init(s, dp, tp, 1, false, &err) != MS_OK) fail_msg("%s", err.msg);
    return problem(m, c, dp * tp);
}

/* tp 1: nothing to place. A memory limit nothing fits: said, with the smallest found. */
static void test_edges(void **state) {
    (void)state;
    ms_model_config m;
    ms_cluster c;
    ms_strategy s;
    ms_plan_problem pb = gpt_tiny(&m, &c, &s, 2, 1);
    ms_error err = {0};
    ms_auto_place_result *r = malloc(sizeof *r);
    assert_int_equal(ms_plan_auto_placements(&pb, &s, NULL, r, &err), MS_OK);
    assert_int_equal(r->rules.n, 0);
    assert_int_equal(r->compiles, 1);
    assert_int_equal(ms_strategy_init(&s, 1, 2, 1, false, &err), MS_OK);
    ms_auto_place_opts o = {.mem_limit = 1024};
    assert_int_not_equal(ms_plan_auto_placements(&pb, &s, &o, r, &err), MS_OK);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "fits the memory limit of 1.0 KiB"));
    free(r);
}

/* Pins: kept first and as given, their class fixed, the rest searched around them; pins that
 * contradict each other or the shapes, refused naming the fix. */
static void test_pins(void **state) {
    (void)state;
    ms_model_config m;
    ms_cluster c;
    ms_strategy s;
    ms_plan_problem pb = gpt_tiny(&m, &c, &s, 1, 2);
    ms_error err = {0};
    const char *j = "{\"mesh\": {\"tp\": 2}, \"placements\": {\"h.*.mlp.c_fc.weight\": "
                    "\"[R, S(1)]\", \"*\": \"auto\"}}";
    ms_strategy fs;
    ms_placement_rules pins;
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "t.json", &fs, &pins, &err), MS_OK);
    assert_true(pins.auto_place && pins.no_hints);
    assert_int_equal(pins.n, 1);
    ms_auto_place_result *r = malloc(sizeof *r);
    ms_auto_place_opts o = {.pins = &pins};
    if (ms_plan_auto_placements(&pb, &s, &o, r, &err) != MS_OK) fail_msg("%s", err.msg);
    char text[4096];
    ms_auto_place_rules_str(&r->rules, text, sizeof text);
    printf("with a pin: %s\n", text);
    assert_string_equal(r->rules.r[0].pattern, "h.*.mlp.c_fc.weight");
    assert_true(ms_placements_eq(&r->rules.r[0].pl, &pins.r[0].pl));
    for (int i = 1; i < r->rules.n; i++)
        assert_string_not_equal(r->rules.r[i].pattern, "h.*.mlp.c_fc.weight");
    /* its bias follows the pinned weight */
    assert_non_null(strstr(text, "\"h.*.mlp.c_fc.bias\": \"[R, S(0)]\""));
    /* written out, the layout reads back the same: the whole of it ("*": "complete") */
    char file[4200];
    snprintf(file, sizeof file, "{\"mesh\": {\"tp\": 2}, \"placements\": %s}", text);
    ms_placement_rules back;
    assert_int_equal(ms_strategy_parse_json(file, strlen(file), "t.json", &fs, &back, &err), MS_OK);
    assert_true(back.no_hints && !back.auto_place);
    assert_int_equal(back.n, r->rules.n);
    for (int i = 0; i < back.n; i++) {
        assert_string_equal(back.r[i].pattern, r->rules.r[i].pattern);
        assert_true(ms_placements_eq(&back.r[i].pl, &r->rules.r[i].pl));
    }
    /* one layer pinned, the others not */
    snprintf(pins.r[0].pattern, sizeof pins.r[0].pattern, "h.0.mlp.c_fc.weight");
    assert_int_not_equal(ms_plan_auto_placements(&pb, &s, &o, r, &err), MS_OK);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "contradictory pins: h.0.mlp.c_fc.weight is [R, S(1)] but "
                                    "h.1.mlp.c_fc.weight is unpinned"));
    assert_non_null(strstr(err.msg, "\"h.*.mlp.c_fc.weight\""));
    /* two layers pinned differently */
    pins.r[1] = pins.r[0];
    snprintf(pins.r[1].pattern, sizeof pins.r[1].pattern, "h.*.mlp.c_fc.weight");
    pins.r[1].pl.p[1] = ms_pl_replicate();
    pins.n = 2;
    assert_int_not_equal(ms_plan_auto_placements(&pb, &s, &o, r, &err), MS_OK);
    assert_non_null(strstr(err.msg, "is [R, S(1)] but h.1.mlp.c_fc.weight is [R, R]"));
    /* a dim the tensor lacks: c_attn's weight is [C, 3, C] */
    pins.n = 1;
    snprintf(pins.r[0].pattern, sizeof pins.r[0].pattern, "h.*.attn.c_attn.weight");
    pins.r[0].pl.p[1] = ms_pl_shard(3);
    assert_int_not_equal(ms_plan_auto_placements(&pb, &s, &o, r, &err), MS_OK);
    printf("%s\n", err.msg);
    assert_non_null(
        strstr(err.msg, "shards dim 3 of h.0.attn.c_attn.weight, which has only 3 dims"));
    /* "auto" anywhere but under "*" */
    const char *bad = "{\"tp\": 2, \"placements\": {\"h.*\": \"auto\"}}";
    assert_int_not_equal(ms_strategy_parse_json(bad, strlen(bad), "t.json", &fs, &pins, &err),
                         MS_OK);
    assert_non_null(strstr(err.msg, "goes under the pattern \"*\""));
    free(r);
}

/* The layout searched with the mesh: GPT-2 tiny on 4 H100s. One row per tp degree (1, 2, 4),
 * each the strategy search's best with it; the searched layouts priced like the own ones; the
 * best row the fastest of all; the same answer twice (the degrees run on worker threads). */
static void threads_joint(void **state) {
    (void)state;
    ms_model_config m = mt_source_config("gpt-tiny.json");
    ms_cluster c = h100();
    ms_plan_problem pb = problem(&m, &c, 4);
    ms_auto_plan *ap = malloc(sizeof *ap), *again = malloc(sizeof *again);
    ms_error err = {0};
    if (ms_plan_auto_joint(&pb, NULL, NULL, ap, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(ap->n, 3);
    assert_int_equal(ap->tp_searched, 2);
    double best = 1e30;
    for (int i = 0; i < ap->n; i++) {
        const ms_auto_plan_row *r = &ap->rows[i];
        printf("tp %d: %s own %.3f ms", r->s.tp, r->hand.text, r->hand.step_s * 1e3);
        assert_int_equal(r->s.tp, 1 << i);
        assert_int_equal(r->s.dp * r->s.tp * (r->s.pp > 1 ? r->s.pp : 1), 4);
        assert_true(r->hand.from_engine);
        if (r->hand.fits && r->hand.step_s < best) best = r->hand.step_s;
        if (r->s.tp == 1) {
            assert_false(r->have_auto);
            printf("\n");
            continue;
        }
        if (!r->have_auto) fail_msg("tp %d: %s", r->s.tp, r->why);
        printf(", searched %.3f ms (%d layouts, %.0f ms)\n", r->layout.best.step_s * 1e3,
               r->layout.compiles, r->layout.search_ms);
        /* the searched layout is at least as fast as the own one, or in the tie band with
         * fewer bytes */
        assert_true(r->layout.best.step_s <= r->hand.step_s * 1.01);
        if (r->layout.best.step_s < best) best = r->layout.best.step_s;
    }
    const ms_auto_plan_row *w = &ap->rows[ap->best];
    double wstep = ap->best_is_auto ? w->layout.best.step_s : w->hand.step_s;
    assert_true(wstep == best);
    /* tp fixed: one row */
    ms_plan_fixed f;
    assert_int_equal(ms_plan_fixed_parse("tp=2", &f, &err), MS_OK);
    if (ms_plan_auto_joint(&pb, &f, NULL, again, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(again->n, 1);
    assert_int_equal(again->rows[0].s.tp, 2);
    assert_true(again->rows[0].layout.best.step_s == ap->rows[1].layout.best.step_s);
    /* cp fixed above 1: nothing to search, said */
    assert_int_equal(ms_plan_fixed_parse("cp=2", &f, &err), MS_OK);
    assert_int_not_equal(ms_plan_auto_joint(&pb, &f, NULL, again, &err), MS_OK);
    assert_non_null(strstr(err.msg, "runs without cp"));
    /* deterministic */
    if (ms_plan_auto_joint(&pb, NULL, NULL, again, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(again->n, ap->n);
    for (int i = 0; i < ap->n; i++) {
        assert_true(again->rows[i].hand.step_s == ap->rows[i].hand.step_s);
        assert_true(again->rows[i].layout.best.step_s == ap->rows[i].layout.best.step_s);
    }
    free(ap);
    free(again);
}

/* "placements": "auto" in a strategy file; refused where placements are not taken. */
static void test_parse(void **state) {
    (void)state;
    const char *j = "{\"mesh\": {\"dp\": 2, \"tp\": 2}, \"placements\": \"auto\"}";
    ms_strategy s;
    ms_placement_rules rules;
    ms_error err = {0};
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "t.json", &s, &rules, &err), MS_OK);
    assert_true(rules.auto_place && rules.no_hints);
    assert_int_equal(rules.n, 0);
    assert_int_not_equal(ms_strategy_parse_json(j, strlen(j), "t.json", &s, NULL, &err), MS_OK);
    const char *bad = "{\"tp\": 2, \"placements\": \"automatic\"}";
    assert_int_not_equal(ms_strategy_parse_json(bad, strlen(bad), "t.json", &s, &rules, &err),
                         MS_OK);
    assert_non_null(strstr(err.msg, "\"auto\""));
}

/* --- training with the rules found ------------------------------------------------------------ */

enum { TB = 4, TT = 16, STEPS = 4, SW_AT = 2 };

typedef struct state_copy {
    mt_state st;
    float losses[STEPS];
} state_copy;

typedef struct layout_arg {
    const ms_model_config *cfg; /* NULL: mt_tiny_config's GPT-2 */
    const ms_strategy *s;
    const ms_placement_rules *from, *to; /* the rules before and after SW_AT (from NULL: to) */
    state_copy *out;
} layout_arg;

/* Trains STEPS steps under a->from, switching to a->to at SW_AT (or a->to throughout). */
static void layout_run(mt_rank *r, void *arg) {
    layout_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, mt_repeated_text("In the beginning God created the heaven. ", TT, &d, &err),
               &err))
        return;
    ms_model_config cfg = a->cfg ? *a->cfg : mt_tiny_config(false, 0.1);
    ms_train_opts o = mt_train_opts(TB, TT, STEPS);
    ms_trainer *tr = NULL;
    if (MT_OK(r,
              ms_trainer_create(r->ctx, &cfg, a->s, a->from ? a->from : a->to, &o, &d, &tr, &err),
              &err))
        for (int k = 0; k < STEPS; k++) {
            if (a->from && k == SW_AT) MT_OK(r, ms_trainer_switch(tr, a->s, a->to, &err), &err);
            ms_step_result res;
            if (!MT_OK(r, ms_trainer_step(tr, &res, &err), &err)) break;
            if (r->ctx->rank == 0) a->out->losses[k] = res.loss;
        }
    if (tr) {
        MT_CHECK(r, ms_trainer_runs(tr, a->s, a->to), "the job does not run the searched layout");
        mt_gather_state(r, tr, &a->out->st, &err);
    }
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
}

static void threads_train_dp2_tp2(void **state) {
    (void)state;
    const char *j = "{\"mesh\": {\"dp\": 2, \"tp\": 2}, \"placements\": \"auto\"}";
    ms_strategy s, one;
    ms_placement_rules rules;
    ms_error err = {0};
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "auto.json", &s, &rules, &err), MS_OK);
    ms_model_config cfg = mt_tiny_config(false, 0.1);
    ms_cluster c = h100();
    ms_plan_problem pb = problem(&cfg, &c, 4);
    pb.global_batch = TB, pb.seq = TT;
    /* the layout found, and the one found under the hand layout's memory (which shards) */
    ms_plan_estimate hand;
    ms_plan_problem hp = pb;
    hp.rules = NULL;
    if (ms_plan_estimate_one(&hp, &s, NULL, &hand, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_strategy_defaults(&one);
    state_copy *ref = calloc(1, sizeof *ref), *many = calloc(1, sizeof *many);
    mt_run(1, layout_run, &(layout_arg){.s = &one, .out = ref});
    ms_auto_place_result *r = malloc(sizeof *r);
    for (int lim = 0; lim < 2; lim++) {
        ms_auto_place_opts o = {.mem_limit = lim ? hand.mem_total : 0};
        if (ms_plan_auto_placements(&pb, &s, &o, r, &err) != MS_OK) fail_msg("%s", err.msg);
        char text[2048];
        printf("rules: %s\n", ms_auto_place_rules_str(&r->rules, text, sizeof text));
        if (lim) assert_non_null(strstr(text, "S("));
        mt_run(4, layout_run, &(layout_arg){.s = &s, .to = &r->rules, .out = many});
        for (int k = 0; k < STEPS; k++) {
            printf("step %d: loss %.7f, one rank %.7f\n", k, many->losses[k], ref->losses[k]);
            if (!(fabsf(many->losses[k] - ref->losses[k]) <= 1e-5f * fabsf(ref->losses[k])))
                fail_msg("step %d: loss %.7f, one rank %.7f", k, many->losses[k], ref->losses[k]);
        }
        mt_state_free(&many->st);
    }
    mt_state_free(&ref->st);
    free(r), free(ref), free(many);
}

/* BERT and LLaMA (GPT-2 is threads_train_dp2_tp2) under dp2 x tp2 with the layout the search
 * finds within the hand layout's memory (so that it shards): one rank's losses. */
static void test_train_families(void **state) {
    (void)state;
    ms_model_config cfgs[2] = {mt_tiny_config(true, 0.1), mt_source_config("llama-tiny.json")};
    ms_cluster c = h100();
    ms_error err = {0};
    ms_strategy s, one;
    assert_int_equal(ms_strategy_init(&s, 2, 2, 1, false, &err), MS_OK);
    ms_strategy_defaults(&one);
    ms_auto_place_result *r = malloc(sizeof *r);
    state_copy *ref = calloc(1, sizeof *ref), *many = calloc(1, sizeof *many);
    for (int m = 0; m < 2; m++) {
        ms_plan_problem pb = problem(&cfgs[m], &c, 4);
        pb.global_batch = TB, pb.seq = TT;
        ms_plan_estimate hand;
        if (ms_plan_estimate_one(&pb, &s, NULL, &hand, &err) != MS_OK) fail_msg("%s", err.msg);
        ms_auto_place_opts o = {.mem_limit = hand.mem_total};
        if (ms_plan_auto_placements(&pb, &s, &o, r, &err) != MS_OK) fail_msg("%s", err.msg);
        char text[4096];
        printf("%s: %s\n", m ? "llama" : "bert",
               ms_auto_place_rules_str(&r->rules, text, sizeof text));
        assert_non_null(strstr(text, "S("));
        mt_run(1, layout_run, &(layout_arg){.cfg = &cfgs[m], .s = &one, .out = ref});
        mt_run(4, layout_run,
               &(layout_arg){.cfg = &cfgs[m], .s = &s, .to = &r->rules, .out = many});
        for (int k = 0; k < STEPS; k++)
            if (!(fabsf(many->losses[k] - ref->losses[k]) <= 1e-5f * fabsf(ref->losses[k])))
                fail_msg("%s step %d: loss %.7f, one rank %.7f", m ? "llama" : "bert", k,
                         many->losses[k], ref->losses[k]);
        printf("  %d steps with one rank's losses\n", STEPS);
        mt_state_free(&ref->st), mt_state_free(&many->st);
    }
    free(r), free(ref), free(many);
}

/* --- the advisor's "auto placements", accepted in a running job ---------------------------- */

/* The advisor's suggestion for a dp2 x tp2 job under the model's own layout. */
/* `kept` (may be NULL) gets the layout the advisor priced the suggestion with, which an accept
 * applies (job/live_job.c). */
static ms_suggestion auto_suggestion_for(const ms_model_config *cfg, const ms_cluster *c,
                                         const ms_strategy *s, const ms_placement_rules *runs,
                                         ms_placement_rules *kept) {
    ms_model_def def;
    ms_error err = {0};
    assert_int_equal(ms_model_def_from_config(cfg, TT, &def, &err), MS_OK);
    ms_advisor *adv = NULL;
    assert_int_equal(ms_advisor_create(&def, 4, TB, TT, c, &adv, &err), MS_OK);
    ms_advisor_set_placements(adv, runs);
    ms_plan_estimate now;
    assert_int_equal(ms_advisor_predict(adv, s, &now, &err), MS_OK);
    ms_suggestion out[8], found = {0};
    int n = 0;
    assert_int_equal(ms_advisor_update(adv, s, NULL, now.step_s, 0.05, out, 8, &n, &err), MS_OK);
    for (int i = 0; i < n; i++) {
        printf("suggestion %s: %.0f%% (%s)\n", out[i].target, 100 * out[i].predicted_gain,
               out[i].target_json);
        if (strstr(out[i].target_json, "\"placements\": \"auto\"")) found = out[i];
    }
    if (kept && found.id) assert_true(ms_advisor_searched_rules(adv, s, kept));
    ms_advisor_destroy(adv);
    return found;
}

/* The advisor, pricing a dp2 x tp2 job under the model's own layout, suggests its layout
 * searched ("placements": "auto") and keeps the layout it priced, which is what a search of the
 * job's own finds; accepted, those rules switch the running job at step SW_AT, and every parameter
 * and both Adam moments then equal those of a run under the searched layout throughout. Told the
 * job runs that layout, the advisor suggests it no more. */
static void threads_advisor_auto(void **state) {
    (void)state;
    ms_model_config cfg = mt_tiny_config(false, 0.1);
    ms_cluster c = h100();
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&s, 2, 2, 1, false, &err), MS_OK);
    ms_placement_rules *kept = malloc(sizeof *kept);
    ms_suggestion g = auto_suggestion_for(&cfg, &c, &s, NULL, kept);
    if (!g.id) fail_msg("no auto placements suggested");
    printf("  %s\n  %s\n", g.evidence, g.diff);
    /* its target searched as a strategy file saying "auto" is */
    ms_strategy target;
    ms_placement_rules *pins = malloc(sizeof *pins), *to = malloc(sizeof *to);
    assert_int_equal(
        ms_strategy_parse_json(g.target_json, strlen(g.target_json), "t", &target, pins, &err),
        MS_OK);
    assert_true(pins->auto_place);
    assert_true(ms_strategy_equal(&target, &s));
    ms_plan_problem pb = problem(&cfg, &c, 4);
    pb.global_batch = TB, pb.seq = TT;
    ms_auto_place_result *r = malloc(sizeof *r);
    ms_auto_place_opts o = {.pins = pins};
    if (ms_plan_auto_placements(&pb, &target, &o, r, &err) != MS_OK) fail_msg("%s", err.msg);
    *to = r->rules;
    /* what an accept applies is the layout priced, and the job's own search finds the same */
    char *a_str = malloc(16384), *b_str = malloc(16384);
    ms_auto_place_rules_str(kept, a_str, 16384);
    ms_auto_place_rules_str(to, b_str, 16384);
    assert_string_equal(a_str, b_str);
    free(a_str), free(b_str), free(kept);
    assert_int_equal(auto_suggestion_for(&cfg, &c, &s, to, NULL).id, 0);
    state_copy *sw = calloc(1, sizeof *sw), *ref = calloc(1, sizeof *ref);
    ms_placement_rules *none = calloc(1, sizeof *none);
    layout_arg a = {.s = &s, .from = none, .to = to, .out = sw};
    layout_arg b = {.s = &s, .to = to, .out = ref};
    mt_run(4, layout_run, &a);
    mt_run(4, layout_run, &b);
    for (int k = 0; k < STEPS; k++)
        if (!(fabsf(sw->losses[k] - ref->losses[k]) <= 2e-5f * (1 + k) * fabsf(ref->losses[k])))
            fail_msg("step %d: loss %.7f switched, %.7f throughout", k, sw->losses[k],
                     ref->losses[k]);
    mt_state_check(&sw->st, &ref->st, mt_train_opts(TB, TT, STEPS).lr);
    printf("%d state tensors equal after the switch to the searched layout\n", sw->st.n);
    mt_state_free(&sw->st), mt_state_free(&ref->st);
    free(sw), free(ref), free(pins), free(to), free(r), free(none);
}

/* The docs' table: every case, one Markdown row each. */
static int print_table(void) {
    printf("| model | tp | sp | hand bytes | auto bytes | hand step | auto step | runner-up "
           "| search | compiles |\n|---|---|---|---|---|---|---|---|---|---|\n");
    row x, *rows = malloc(sizeof *rows * 12);
    int n = 0;
    for (int m = 0; m < 3; m++)
        for (int tp = 2; tp <= 4; tp *= 2)
            for (int sp = 0; sp < 2; sp++) {
                run_case(configs[m], tp, sp, &x);
                printf("| %s | %d | %s | %.0f | %.0f | %.3f ms | %.3f ms | %.3f ms | %.0f ms | %d "
                       "|\n",
                       x.model, x.tp, sp ? "on" : "off", x.hand_bytes, x.auto_bytes,
                       x.hand_step * 1e3, x.auto_step * 1e3, x.runner_step * 1e3, x.search_ms,
                       x.compiles);
                fprintf(stderr, "%s tp%d%s: %s\n", x.model, tp, sp ? " +sp" : "", x.rules);
                rows[n++] = x;
            }
    printf("\n| model | tp | sp | hand memory | hand bytes | hand step | auto memory | auto bytes "
           "| auto step | search | compiles |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        const row *y = &rows[i];
        printf(
            "| %s | %d | %s | %.0f | %.0f | %.3f ms | %.0f | %.0f%s | %.3f ms | %.0f ms | %d |\n",
            y->model, y->tp, y->sp ? "on" : "off", y->hand_mem, y->hand_bytes, y->hand_step * 1e3,
            y->lim_mem, y->lim_bytes, y->lim_bytes <= y->hand_bytes ? " (<= hand)" : "",
            y->lim_step * 1e3, y->lim_search_ms, y->lim_compiles);
        fprintf(stderr, "%s tp%d%s under the hand's memory: %s\n", y->model, y->tp,
                y->sp ? " +sp" : "", y->lim_rules);
    }
    free(rows);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--table")) return print_table();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_pins),
        cmocka_unit_test(threads_joint),
        cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_bert),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(threads_train_dp2_tp2),
        cmocka_unit_test(threads_advisor_auto),
        cmocka_unit_test(test_train_families),
    };
    return mt_main(argc, argv, "test_auto_place", tests, sizeof tests / sizeof *tests);
}

/* test_snapshot_json.c - a snapshot as JSON and back: every field survives the round trip
 * (compared one by one, NaN included), and malformed input fails with a message that names
 * the JSON path: wrong types, wrong array sizes, strings too long for their fields, unknown
 * enum names, truncated text, trailing text.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testkit.h"

#include "engine/comm/comm.h"
#include "profiler/snapshot_json.h"

/* Equal as doubles, NaN equal to NaN. */
static int same(double a, double b) {
    return (isnan(a) && isnan(b)) || a == b;
}
#define assert_same(a, b) assert_true(same((a), (b)))

static double *seq(size_t n, double start, double step) {
    double *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = start + step * (double)i;
    return v;
}

/* A snapshot with every field set to a distinct, awkward value. */
static ms_snapshot *full_snapshot(void) {
    const int n = 3;
    ms_snapshot *s = ms_snapshot_new();
    assert_non_null(s);
    s->version = 4242;
    s->taken_ns = 123456789012345;
    snprintf(s->info.model, sizeof s->info.model, "configs/gpt \"tiny\".json");
    snprintf(s->info.backend, sizeof s->info.backend, "threads");
    s->info.nranks = n;
    s->info.tokens_per_step = 512;
    s->info.live = true;
    snprintf(s->strategy, sizeof s->strategy, "dp1 x tp3");
    s->step = 77;
    s->finished = false;
    snprintf(s->last_event, sizeof s->last_event, "switched to dp1 x tp3 at step 70\nline two");
    snprintf(s->advisor_note, sizeof s->advisor_note,
             "the cost model is 41%% off the measured step for 5 rounds (predicts 58.0 ms, "
             "measured 98.1 ms); relearning from the trace; no suggestions until it agrees "
             "within 25%%");
    s->achieved_flops_per_s = 1.25e11;

    s->n_history = 2;
    s->history = calloc(2, sizeof *s->history);
    for (int i = 0; i < 2; i++) {
        ms_live_step *h = &s->history[i];
        h->step = 76 + i;
        h->loss = i ? NAN : 2.718281828459045;
        h->step_s = 0.1 / 3.0 + i;
        h->tokens_per_s = 5120.5;
        h->lr = 3e-4;
        h->grad_norm = 0.987654321;
        snprintf(h->strategy, sizeof h->strategy, "dp1 x tp%d", 3 - i);
    }

    ms_analysis *a = &s->analysis;
    a->nranks = n;
    a->step_lo = 74;
    a->step_hi = 77;
    a->all.nranks = n;
    a->all.mesh_dim = -1;
    a->all.bytes = seq(9, 0, 1024.5);
    a->all.seconds = seq(9, 1e-6, 1e-3 / 7);
    a->n_dims = 2;
    for (int d = 0; d < 2; d++) {
        a->per_dim[d].nranks = n;
        a->per_dim[d].mesh_dim = d;
        a->per_dim[d].bytes = seq(9, d, 7);
        a->per_dim[d].seconds = seq(9, d * 0.5, 0.125);
        snprintf(a->dim_names[d], sizeof a->dim_names[d], d ? "tp" : "dp");
    }
    for (int r = 0; r < n; r++)
        a->overlap[r] = (ms_rank_overlap){.comm_s = r + 0.1,
                                          .compute_s = r + 0.2,
                                          .overlapped_s = r + 0.05,
                                          .exposed_comm_s = 0.05,
                                          .overlap_ratio = 0.5 / (r + 1)};
    a->n_busbw = 2;
    a->busbw = calloc(2, sizeof *a->busbw);
    a->busbw[0] = (ms_busbw_row){.coll = MS_COLL_ALL_REDUCE,
                                 .group_size = 3,
                                 .bytes = 1ull << 40,
                                 .count = 12,
                                 .mean_s = 1.5e-4,
                                 .busbw_gbs = 12.75};
    a->busbw[1] = (ms_busbw_row){.coll = MS_COLL_ALL_TO_ALL, .group_size = 2, .bytes = 7};
    a->n_ops = 1;
    a->ops = calloc(1, sizeof *a->ops);
    a->ops[0] = (ms_op_row){
        .name = "matmul", .phase = MS_PHASE_BACKWARD, .count = 96, .seconds = 0.5, .flops = 3e12};
    a->n_reshards = 1;
    a->reshards = calloc(1, sizeof *a->reshards);
    snprintf(a->reshards[0].transition, sizeof a->reshards[0].transition, "[P(sum), R] -> [R, R]");
    a->reshards[0].count = 4;
    a->reshards[0].bytes = 65536;
    a->reshards[0].seconds = 0.002;
    a->n_steps = 1;
    a->steps = calloc(1, sizeof *a->steps);
    a->steps[0] = (ms_step_row){.step = 77,
                                .rank = 2,
                                .wall_s = 0.05,
                                .compute_s = 0.03,
                                .exposed_comm_s = 0.015,
                                .idle_s = 0.005};
    a->n_stragglers = 1;
    a->stragglers = calloc(1, sizeof *a->stragglers);
    a->stragglers[0] =
        (ms_straggler){.rank = 1, .last_fraction = 0.75, .mean_lag_s = 3e-4, .count = 40};

    s->n_timeline = 2;
    s->timeline = calloc(2, sizeof *s->timeline);
    s->timeline[0] = (ms_live_span){
        .rank = 0, .kind = MS_LANE_COMPUTE, .t0 = 0, .t1 = 0.01, .name = "matmul", .mesh_dim = -1};
    s->timeline[1] = (ms_live_span){.rank = 2,
                                    .kind = MS_LANE_COMM,
                                    .t0 = 0.01,
                                    .t1 = 0.02,
                                    .name = "all_reduce",
                                    .mesh_dim = 1};
    s->timeline_step = 77;
    s->timeline_wall_s = 0.05;

    /* A pipeline: 2 stages, interleaved over 2 chunks, 4 micro-batches. */
    ms_pipe_stats *ps = &a->pipe;
    ps->stages = 2;
    ps->virtual_stages = 2;
    ps->micro_batches = 4;
    snprintf(ps->schedule, sizeof ps->schedule, "interleaved");
    ps->n_steps = 3;
    ps->last_step = 77;
    ps->bubble = 0.25;
    ps->last_bubble = 1.0 / 3;
    ps->formula = 1.0 / 9;
    ps->simulated = 0.125;
    ps->mean_f_s = 0.002, ps->mean_b_s = 0.004, ps->mean_w_s = 0;
    ps->last_window_s = 0.045;
    for (int k = 0; k < 2; k++) {
        ps->stage_ranks[k] = 1 + k;
        ps->stage_bubble[k] = k ? 0.35 : 0.2;
        ps->last_stage_bubble[k] = k ? NAN : 0.3;
    }
    ms_live_pipeline *pl = &s->pipeline;
    pl->step = 77;
    pl->wall_s = 0.045;
    pl->stages = 2;
    pl->rank[0] = 0;
    pl->rank[1] = 2;
    pl->n_blocks = 3;
    pl->blocks = calloc(3, sizeof *pl->blocks);
    pl->blocks[0] = (ms_live_pipe_block){
        .stage = 0, .action = MS_PIPE_F, .chunk = 1, .mb = 3, .t0 = 0, .t1 = 0.01};
    pl->blocks[1] = (ms_live_pipe_block){
        .stage = 0, .action = MS_PIPE_B, .chunk = 0, .mb = 2, .t0 = 0.02, .t1 = 0.03};
    pl->blocks[2] = (ms_live_pipe_block){
        .stage = 1, .action = MS_PIPE_W, .chunk = 1, .mb = 0, .t0 = 1.0 / 3, .t1 = 0.04};

    s->mem = calloc((size_t)n, sizeof *s->mem);
    for (int r = 0; r < n; r++)
        s->mem[r] = (ms_live_mem){.in_use = 1000u + r,
                                  .peak = 5000u + r,
                                  .params = 100u + r,
                                  .grads = 200u + r,
                                  .optim = 300u + r,
                                  .acts = 400u + r};

    s->n_suggestions = 2;
    for (int i = 0; i < 2; i++) {
        ms_suggestion *g = &s->suggestions[i];
        g->id = 10 + i;
        g->state = i ? MS_SUGG_REFUSED : MS_SUGG_OPEN;
        snprintf(g->target, sizeof g->target, "dp3 x tp1");
        snprintf(g->target_json, sizeof g->target_json, "{\"dp\": 3, \"tp\": 1, \"sp\": false}");
        snprintf(g->current, sizeof g->current, "dp1 x tp3");
        g->predicted_gain = 0.25;
        g->predicted_step_s = 0.03;
        g->current_step_s = 0.04;
        snprintf(g->evidence, sizeof g->evidence, "tp all-reduce is 41%% of the step");
        snprintf(g->memory_check, sizeof g->memory_check, "fits: 38 MiB per rank");
        snprintf(g->diff, sizeof g->diff, "dp 1 -> 3, tp 3 -> 1");
        snprintf(g->result, sizeof g->result, i ? "refused: batch not divisible" : "");
        g->applied_step = i ? -1 : 80;
    }
    return s;
}

static char *to_text(const ms_snapshot *s) {
    cJSON *j = ms_snapshot_to_json(s);
    assert_non_null(j);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    assert_non_null(text);
    return text;
}

static void assert_heatmap_eq(const ms_heatmap *a, const ms_heatmap *b, int n) {
    assert_int_equal(a->nranks, b->nranks);
    assert_int_equal(a->mesh_dim, b->mesh_dim);
    for (int i = 0; i < n * n; i++) {
        assert_same(a->bytes[i], b->bytes[i]);
        assert_same(a->seconds[i], b->seconds[i]);
    }
}

static void test_round_trip(void **state) {
    (void)state;
    ms_snapshot *s = full_snapshot();
    char *text = to_text(s);
    ms_snapshot *r = NULL;
    ms_error err = {0};
    assert_int_equal(ms_snapshot_from_json(text, strlen(text), &r, &err), MS_OK);
    assert_non_null(r);
    assert_int_equal(r->refs_, 1);

    assert_true(r->version == s->version);
    assert_true(r->taken_ns == s->taken_ns);
    assert_string_equal(r->info.model, s->info.model);
    assert_string_equal(r->info.backend, s->info.backend);
    assert_int_equal(r->info.nranks, s->info.nranks);
    assert_true(r->info.tokens_per_step == s->info.tokens_per_step);
    assert_true(r->info.live == s->info.live);
    assert_string_equal(r->strategy, s->strategy);
    assert_true(r->step == s->step);
    assert_true(r->finished == s->finished);
    assert_string_equal(r->last_event, s->last_event);
    assert_string_equal(r->advisor_note, s->advisor_note);
    assert_same(r->achieved_flops_per_s, s->achieved_flops_per_s);

    assert_int_equal(r->n_history, s->n_history);
    for (int i = 0; i < s->n_history; i++) {
        const ms_live_step *x = &s->history[i], *y = &r->history[i];
        assert_true(x->step == y->step);
        assert_same(x->loss, y->loss);
        assert_same(x->step_s, y->step_s);
        assert_same(x->tokens_per_s, y->tokens_per_s);
        assert_same(x->lr, y->lr);
        assert_same(x->grad_norm, y->grad_norm);
        assert_string_equal(x->strategy, y->strategy);
    }

    const ms_analysis *a = &s->analysis, *b = &r->analysis;
    const int n = a->nranks;
    assert_int_equal(b->nranks, n);
    assert_true(b->step_lo == a->step_lo && b->step_hi == a->step_hi);
    assert_heatmap_eq(&a->all, &b->all, n);
    assert_int_equal(b->n_dims, a->n_dims);
    for (int d = 0; d < a->n_dims; d++) {
        assert_string_equal(b->dim_names[d], a->dim_names[d]);
        assert_heatmap_eq(&a->per_dim[d], &b->per_dim[d], n);
    }
    for (int k = 0; k < n; k++) {
        assert_same(a->overlap[k].comm_s, b->overlap[k].comm_s);
        assert_same(a->overlap[k].compute_s, b->overlap[k].compute_s);
        assert_same(a->overlap[k].overlapped_s, b->overlap[k].overlapped_s);
        assert_same(a->overlap[k].exposed_comm_s, b->overlap[k].exposed_comm_s);
        assert_same(a->overlap[k].overlap_ratio, b->overlap[k].overlap_ratio);
    }
    assert_int_equal(b->n_busbw, a->n_busbw);
    for (int i = 0; i < a->n_busbw; i++) {
        assert_int_equal(b->busbw[i].coll, a->busbw[i].coll);
        assert_int_equal(b->busbw[i].group_size, a->busbw[i].group_size);
        assert_true(b->busbw[i].bytes == a->busbw[i].bytes);
        assert_int_equal(b->busbw[i].count, a->busbw[i].count);
        assert_same(b->busbw[i].mean_s, a->busbw[i].mean_s);
        assert_same(b->busbw[i].busbw_gbs, a->busbw[i].busbw_gbs);
    }
    assert_int_equal(b->n_ops, a->n_ops);
    assert_string_equal(b->ops[0].name, a->ops[0].name);
    assert_int_equal(b->ops[0].phase, a->ops[0].phase);
    assert_int_equal(b->ops[0].count, a->ops[0].count);
    assert_same(b->ops[0].seconds, a->ops[0].seconds);
    assert_same(b->ops[0].flops, a->ops[0].flops);
    assert_int_equal(b->n_reshards, a->n_reshards);
    assert_string_equal(b->reshards[0].transition, a->reshards[0].transition);
    assert_int_equal(b->reshards[0].count, a->reshards[0].count);
    assert_same(b->reshards[0].bytes, a->reshards[0].bytes);
    assert_same(b->reshards[0].seconds, a->reshards[0].seconds);
    assert_int_equal(b->n_steps, a->n_steps);
    assert_true(b->steps[0].step == a->steps[0].step);
    assert_int_equal(b->steps[0].rank, a->steps[0].rank);
    assert_same(b->steps[0].wall_s, a->steps[0].wall_s);
    assert_same(b->steps[0].compute_s, a->steps[0].compute_s);
    assert_same(b->steps[0].exposed_comm_s, a->steps[0].exposed_comm_s);
    assert_same(b->steps[0].idle_s, a->steps[0].idle_s);
    assert_int_equal(b->n_stragglers, a->n_stragglers);
    assert_int_equal(b->stragglers[0].rank, a->stragglers[0].rank);
    assert_same(b->stragglers[0].last_fraction, a->stragglers[0].last_fraction);
    assert_same(b->stragglers[0].mean_lag_s, a->stragglers[0].mean_lag_s);
    assert_int_equal(b->stragglers[0].count, a->stragglers[0].count);

    assert_int_equal(r->n_timeline, s->n_timeline);
    for (int i = 0; i < s->n_timeline; i++) {
        const ms_live_span *x = &s->timeline[i], *y = &r->timeline[i];
        assert_int_equal(x->rank, y->rank);
        assert_int_equal(x->kind, y->kind);
        assert_same(x->t0, y->t0);
        assert_same(x->t1, y->t1);
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->mesh_dim, y->mesh_dim);
    }
    assert_true(r->timeline_step == s->timeline_step);
    assert_same(r->timeline_wall_s, s->timeline_wall_s);

    const ms_pipe_stats *pa = &a->pipe, *pb = &b->pipe;
    assert_int_equal(pb->stages, pa->stages);
    assert_int_equal(pb->virtual_stages, pa->virtual_stages);
    assert_int_equal(pb->micro_batches, pa->micro_batches);
    assert_string_equal(pb->schedule, pa->schedule);
    assert_int_equal(pb->n_steps, pa->n_steps);
    assert_true(pb->last_step == pa->last_step);
    assert_same(pb->bubble, pa->bubble);
    assert_same(pb->last_bubble, pa->last_bubble);
    assert_same(pb->formula, pa->formula);
    assert_same(pb->simulated, pa->simulated);
    assert_same(pb->mean_f_s, pa->mean_f_s);
    assert_same(pb->mean_b_s, pa->mean_b_s);
    assert_same(pb->mean_w_s, pa->mean_w_s);
    assert_same(pb->last_window_s, pa->last_window_s);
    for (int k = 0; k < pa->stages; k++) {
        assert_int_equal(pb->stage_ranks[k], pa->stage_ranks[k]);
        assert_same(pb->stage_bubble[k], pa->stage_bubble[k]);
        assert_same(pb->last_stage_bubble[k], pa->last_stage_bubble[k]);
    }
    const ms_live_pipeline *la = &s->pipeline, *lb = &r->pipeline;
    assert_true(lb->step == la->step);
    assert_same(lb->wall_s, la->wall_s);
    assert_int_equal(lb->stages, la->stages);
    for (int k = 0; k < la->stages; k++) assert_int_equal(lb->rank[k], la->rank[k]);
    assert_int_equal(lb->n_blocks, la->n_blocks);
    for (int i = 0; i < la->n_blocks; i++) {
        const ms_live_pipe_block *x = &la->blocks[i], *y = &lb->blocks[i];
        assert_int_equal(x->stage, y->stage);
        assert_int_equal(x->action, y->action);
        assert_int_equal(x->chunk, y->chunk);
        assert_int_equal(x->mb, y->mb);
        assert_same(x->t0, y->t0);
        assert_same(x->t1, y->t1);
    }
    for (int k = 0; k < n; k++) {
        assert_true(r->mem[k].in_use == s->mem[k].in_use);
        assert_true(r->mem[k].peak == s->mem[k].peak);
        assert_true(r->mem[k].params == s->mem[k].params && r->mem[k].grads == s->mem[k].grads &&
                    r->mem[k].optim == s->mem[k].optim && r->mem[k].acts == s->mem[k].acts);
    }
    assert_int_equal(r->n_suggestions, s->n_suggestions);
    for (int i = 0; i < s->n_suggestions; i++) {
        const ms_suggestion *x = &s->suggestions[i], *y = &r->suggestions[i];
        assert_int_equal(x->id, y->id);
        assert_int_equal(x->state, y->state);
        assert_string_equal(x->target, y->target);
        assert_string_equal(x->target_json, y->target_json);
        assert_string_equal(x->current, y->current);
        assert_same(x->predicted_gain, y->predicted_gain);
        assert_same(x->predicted_step_s, y->predicted_step_s);
        assert_same(x->current_step_s, y->current_step_s);
        assert_string_equal(x->evidence, y->evidence);
        assert_string_equal(x->memory_check, y->memory_check);
        assert_string_equal(x->diff, y->diff);
        assert_string_equal(x->result, y->result);
        assert_true(x->applied_step == y->applied_step);
    }

    /* And the text of the copy is the text of the original. */
    char *again = to_text(r);
    assert_string_equal(again, text);
    cJSON_free(again);
    cJSON_free(text);
    ms_snapshot_release(r);
    ms_snapshot_release(s);
}

/* An empty snapshot (before any step) round-trips too: no arrays at all. */
static void test_empty(void **state) {
    (void)state;
    ms_snapshot *s = ms_snapshot_new();
    assert_int_equal(s->refs_, 1);
    assert_true(s->step == -1);
    char *text = to_text(s);
    ms_snapshot *r = NULL;
    ms_error err = {0};
    assert_int_equal(ms_snapshot_from_json(text, strlen(text), &r, &err), MS_OK);
    assert_int_equal(r->analysis.nranks, 0);
    assert_null(r->analysis.all.bytes);
    assert_null(r->history);
    assert_null(r->mem);
    assert_true(r->step == -1);
    /* No pipeline: null in both places, hidden when read back. */
    assert_non_null(strstr(text, "\"stragglers\":[],\"pipeline\":null}"));
    assert_non_null(strstr(text, "},\"pipeline\":null,\"mem\""));
    assert_int_equal(r->analysis.pipe.stages, 0);
    assert_true(r->pipeline.step == -1);
    assert_null(r->pipeline.blocks);
    cJSON_free(text);
    ms_snapshot_release(r);
    ms_snapshot_release(s);
}

/* Replaces the first occurrence of `from` in text by `to`; returns a new string. */
static char *replace(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    assert_non_null(at);
    size_t n = strlen(text) - strlen(from) + strlen(to);
    char *out = malloc(n + 1);
    size_t pre = (size_t)(at - text);
    memcpy(out, text, pre);
    strcpy(out + pre, to);
    strcat(out, at + strlen(from));
    return out;
}

/* Parsing `text` with `from` replaced by `to` fails naming `path` and `why`. */
static void expect_fail(const char *text, const char *from, const char *to, const char *want) {
    char *bad = replace(text, from, to);
    ms_snapshot *r = (ms_snapshot *)1;
    ms_error err = {0};
    ms_status st = ms_snapshot_from_json(bad, strlen(bad), &r, &err);
    if (st != MS_ERR_INVALID || !strstr(err.msg, want))
        fail_msg("replacing %s by %s: status %d, message '%s' (wanted '%s')", from, to, st, err.msg,
                 want);
    assert_null(r);
    free(bad);
}

static void test_errors_name_the_path(void **state) {
    (void)state;
    ms_snapshot *s = full_snapshot();
    char *text = to_text(s);
    ms_snapshot_release(s);

    expect_fail(text, "\"version\":4242", "\"version\":\"4242\"",
                "snapshot: $.version: expected a non-negative integer");
    expect_fail(text, "\"step\":77,", "\"step\":7.5,", "$.step: expected an integer");
    expect_fail(text, "\"nranks\":3,\"tokens", "\"nranks\":-1,\"tokens", "$.info.nranks");
    expect_fail(text, "\"live\":true", "\"live\":1", "$.info.live: expected true or false");
    /* A heatmap one cell short. */
    expect_fail(text, "\"bytes\":[0,1024.5,", "\"bytes\":[1024.5,",
                "$.analysis.heatmap.bytes: expected an array of 9 numbers");
    expect_fail(text, "\"seconds\":[0.5,", "\"seconds\":[\"x\",",
                "$.analysis.dims[1].seconds[0]: expected a number");
    expect_fail(text, "\"name\":\"tp\"", "\"name\":\"a-very-long-mesh-dim-name\"",
                "$.analysis.dims[1].name: expected a string of at most 15 bytes");
    expect_fail(text, "\"coll\":\"all_to_all\"", "\"coll\":\"gossip\"",
                "$.analysis.busbw[1].coll: expected one of");
    expect_fail(text, "\"phase\":\"backward\"", "\"phase\":2", "$.analysis.ops[0].phase");
    expect_fail(text, "\"kind\":\"comm\"", "\"kind\":\"sleep\"", "$.timeline.spans[1].kind");
    expect_fail(text, "\"state\":\"refused\"", "\"state\":\"maybe\"",
                "$.suggestions[1].state: expected one of");
    expect_fail(text, "\"in_use\":1001", "\"in_use\":-5", "$.mem[1].in_use");
    expect_fail(text, "\"overlap\":[{", "\"overlap\":[{\"x\":1},{", "$.analysis.overlap");
    expect_fail(text, "\"history\":[", "\"history\":7,\"h\":[", "$.history: expected an array");
    expect_fail(text, "\"schema\":1", "\"schema\":2", "$.schema");
    /* The pipeline: its schedule's stage arrays, its lanes in order, blocks on them. */
    expect_fail(text, "\"stage_bubble\":[0.2,0.35]", "\"stage_bubble\":[0.2]",
                "$.analysis.pipeline.stage_bubble: expected an array of 2 numbers");
    expect_fail(text, "\"stages\":2,\"virtual", "\"stages\":65,\"virtual",
                "$.analysis.pipeline.stages: expected an integer in [1, 64]");
    expect_fail(text, "\"action\":\"W\"", "\"action\":\"X\"",
                "$.pipeline.blocks[2].action: expected one of \"F\", \"B\", \"W\"");
    expect_fail(text, "{\"stage\":1,\"rank\":2}", "{\"stage\":0,\"rank\":2}",
                "$.pipeline.lanes[1].stage: expected an integer in [1, 1]");
    expect_fail(text, "\"stage\":1,\"action\"", "\"stage\":5,\"action\"",
                "$.pipeline.blocks[2]: stage 5: there are 2 lanes");
    expect_fail(text, "\"lanes\":[", "\"lanez\":[", "$.pipeline.lanes: expected an array");
    expect_fail(text, "\"suggestions\":[", "\"suggestionz\":[", "$.suggestions: expected an array");
    expect_fail(text, "\"strategy\":\"dp1 x tp3\",\"step\"",
                "\"strategy\":\"dp1 x tp3 and a name so long that it cannot fit in sixty-four "
                "bytes at all\",\"step\"",
                "$.strategy: expected a string of at most 63 bytes");

    /* Syntax: truncated, trailing text, not an object. */
    ms_snapshot *r = NULL;
    ms_error err = {0};
    assert_int_equal(ms_snapshot_from_json(text, strlen(text) / 2, &r, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "malformed JSON"));
    char *trail = malloc(strlen(text) + 8);
    sprintf(trail, "%s x", text);
    assert_int_equal(ms_snapshot_from_json(trail, strlen(trail), &r, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "trailing"));
    free(trail);
    assert_int_equal(ms_snapshot_from_json("[1]", 3, &r, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "$: expected an object"));
    assert_null(r);
    cJSON_free(text);
}

/* The advisor's note and a withdrawn suggestion round-trip; a snapshot from a job before the
 * note existed (no "advisor_note") reads with none; a note too long for its field is refused. */
static void test_advisor_note(void **state) {
    (void)state;
    ms_snapshot *s = full_snapshot();
    s->suggestions[0].state = MS_SUGG_WITHDRAWN;
    snprintf(s->suggestions[0].result, sizeof s->suggestions[0].result, "%s", s->advisor_note);
    char *text = to_text(s);
    assert_non_null(strstr(text, "\"advisor_note\":\"the cost model is 41% off"));
    assert_non_null(strstr(text, "\"state\":\"withdrawn\""));
    ms_snapshot *r = NULL;
    ms_error err = {0};
    assert_int_equal(ms_snapshot_from_json(text, strlen(text), &r, &err), MS_OK);
    assert_string_equal(r->advisor_note, s->advisor_note);
    assert_int_equal(r->suggestions[0].state, MS_SUGG_WITHDRAWN);
    assert_string_equal(r->suggestions[0].result, s->advisor_note);
    ms_snapshot_release(r);

    char field[320];
    snprintf(field, sizeof field, "\"advisor_note\":\"%s\",", s->advisor_note);
    char *old = replace(text, field, "");
    assert_int_equal(ms_snapshot_from_json(old, strlen(old), &r, &err), MS_OK);
    assert_string_equal(r->advisor_note, "");
    ms_snapshot_release(r);
    free(old);

    char longer[400] = "\"advisor_note\":\"";
    size_t at = strlen(longer);
    memset(longer + at, 'x', 300);
    longer[at + 300] = '\0';
    expect_fail(text, "\"advisor_note\":\"", longer,
                "$.advisor_note: expected a string of at most 255 bytes");
    cJSON_free(text);
    ms_snapshot_release(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_errors_name_the_path),
        cmocka_unit_test(test_advisor_note),
    };
    return cmocka_run_group_tests_name("snapshot_json", tests, NULL, NULL);
}

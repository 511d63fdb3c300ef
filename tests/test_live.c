/* test_live.c - the live model: snapshots reflect what was fed (the step window, the last
 * step's timeline, memory, history), are immutable once taken, and the control queue
 * validates, orders and bounds requests. A concurrency case (run under TSan) has rank
 * threads recording and reporting steps while readers take and drop snapshots. A trace with
 * no usable events gives an empty dashboard.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testkit.h"

#include "engine/comm/comm.h"
#include "profiler/live.h"
#include "profiler/snapshot_json.h"
#include "traces/trace_read.h"

#define NR     2
#define MS_(x) ((int64_t)((x)*1000000.0))

static ms_event ev(int rank, ms_ev_kind kind, int64_t step, int64_t t0, int64_t t1) {
    ms_event e;
    memset(&e, 0, sizeof e);
    e.kind = (uint8_t)kind;
    e.phase = MS_PHASE_OTHER;
    e.rank = rank;
    e.step = step;
    e.t0_ns = t0;
    e.t1_ns = t1;
    return e;
}

/* Step s on both ranks: [100s, 100s+10) ms; rank r runs one matmul of 1e6*(s+1) FLOPs in
 * [1, 5) ms and an all-reduce of 4096 bytes on the pair in [5, 8) ms (rank 1 starts the
 * step 1 ms later). */
static size_t make_step(ms_event *out, int64_t s, const ms_group *g) {
    size_t n = 0;
    for (int r = 0; r < NR; r++) {
        double base = 100.0 * (double)s + r;
        out[n++] = ev(r, MS_EV_STEP, s, MS_(base), MS_(base + 10));
        ms_event *o = &out[n++];
        *o = ev(r, MS_EV_OP, s, MS_(base + 1), MS_(base + 5));
        snprintf(o->u.op.opname, sizeof o->u.op.opname, "matmul");
        o->u.op.flops = 1e6 * (double)(s + 1);
        ms_event *c = &out[n++];
        *c = ev(r, MS_EV_COLL, s, MS_(base + 5), MS_(base + 8));
        c->u.coll.coll = MS_COLL_ALL_REDUCE;
        c->u.coll.group = g->id;
        c->u.coll.group_size = 2;
        c->u.coll.group_rank = r;
        c->u.coll.seq = s;
        c->u.coll.bytes = 4096;
        c->u.coll.mesh_dim = 0;
        snprintf(c->u.coll.algo, sizeof c->u.coll.algo, "direct");
        ms_event *m = &out[n++];
        *m = ev(r, MS_EV_MEM, s, MS_(base + 9), MS_(base + 9));
        m->u.mem.in_use = (uint64_t)(1000 * (r + 1) + s);
        m->u.mem.peak = (uint64_t)(5000 * (r + 1) + s);
        m->u.mem.params = 100, m->u.mem.grads = 200, m->u.mem.optim = 400;
        m->u.mem.acts = (uint64_t)(300 + s);
    }
    return n;
}

static ms_live *new_live(int window) {
    ms_live_opts o = {.info = {.nranks = NR, .live = true, .tokens_per_step = 64},
                      .window_steps = window};
    snprintf(o.info.model, sizeof o.info.model, "test");
    ms_live *l = NULL;
    ms_error err = {0};
    assert_int_equal(ms_live_create(&o, &l, &err), MS_OK);
    return l;
}

static ms_group pair_group(void) {
    ms_group g;
    memset(&g, 0, sizeof g);
    g.id = 7;
    snprintf(g.name, sizeof g.name, "dp");
    g.size = 2;
    g.ranks[0] = 0, g.ranks[1] = 1;
    return g;
}

static void test_empty_snapshot(void **state) {
    (void)state;
    ms_live *l = new_live(2);
    const ms_snapshot *s = ms_live_acquire(l);
    assert_non_null(s);
    assert_int_equal(s->step, -1);
    assert_int_equal(s->n_history, 0);
    assert_int_equal(s->analysis.nranks, 0);
    ms_snapshot_release(s);
    ms_live_destroy(l);
}

/* Five steps fed, a window of 2: the analysis covers steps 3 and 4 only; the timeline is
 * step 4's; memory is the latest sample; the history has every step reported. */
static void test_window_timeline_memory(void **state) {
    (void)state;
    ms_live *l = new_live(2);
    ms_group g = pair_group();
    ms_live_feed_groups(l, &g, 1);
    ms_event buf[64];
    for (int64_t s = 0; s < 5; s++) {
        size_t n = make_step(buf, s, &g);
        ms_live_feed_events(l, buf, n);
        ms_live_step rec = {.step = s, .loss = 5.0 - (double)s, .step_s = 0.010};
        snprintf(rec.strategy, sizeof rec.strategy, "dp2");
        ms_live_step_done(l, &rec);
    }
    ms_live_set_strategy(l, "dp2");
    ms_live_publish_now(l);
    const ms_snapshot *s = ms_live_acquire(l);
    assert_int_equal(s->step, 4);
    assert_string_equal(s->strategy, "dp2");
    assert_int_equal(s->n_history, 5);
    for (int i = 0; i < 5; i++) assert_true(s->history[i].loss == 5.0 - i);
    /* window: steps 3 and 4 */
    assert_int_equal(s->analysis.nranks, NR);
    assert_int_equal(s->analysis.n_steps, 2);
    assert_int_equal(s->analysis.steps[0].step, 3);
    assert_int_equal(s->analysis.steps[1].step, 4);
    /* heatmap: two all-reduces per rank in the window, 2B/n = 4096 bytes to the peer each */
    assert_true(s->analysis.all.bytes[0 * NR + 1] == 2 * 4096.0);
    assert_true(s->analysis.all.bytes[1 * NR + 0] == 2 * 4096.0);
    assert_true(s->analysis.all.bytes[0] == 0);
    /* timeline of step 4: rank 0 starts at 400 ms; spans relative to it */
    assert_int_equal(s->timeline_step, 4);
    assert_true(fabs(s->timeline_wall_s - 0.011) < 1e-12);
    assert_int_equal(s->n_timeline, 4);
    for (int i = 0; i < s->n_timeline; i++) {
        const ms_live_span *sp = &s->timeline[i];
        double off = sp->rank * 0.001;
        if (sp->kind == MS_LANE_COMPUTE) {
            assert_string_equal(sp->name, "matmul");
            assert_true(fabs(sp->t0 - (0.001 + off)) < 1e-12 &&
                        fabs(sp->t1 - (0.005 + off)) < 1e-12);
        } else {
            assert_string_equal(sp->name, "all_reduce");
            assert_int_equal(sp->mesh_dim, 0);
            assert_true(fabs(sp->t0 - (0.005 + off)) < 1e-12);
        }
    }
    /* achieved FLOP/s: both ranks' matmuls of step 4 over the step's wall */
    assert_true(fabs(s->achieved_flops_per_s - 2 * 5e6 / 0.011) < 1e-3);
    /* memory: the latest sample per rank */
    assert_true(s->mem[0].in_use == 1004 && s->mem[1].in_use == 2004);
    assert_true(s->mem[1].peak == 10004);
    /* the training state's split, from the latest sample */
    assert_true(s->mem[1].params == 100 && s->mem[1].grads == 200 && s->mem[1].optim == 400 &&
                s->mem[1].acts == 304);
    ms_snapshot_release(s);
    ms_live_destroy(l);
}

/* A snapshot held by a reader does not change when newer ones are published. */
/* Step s of a pp 2 run (stage 0 = rank 0, stage 1 = rank 1), 1f1b over 2 micro-batches, in ms
 * from 100 s:
 *   r0  F0 [1,3) F1 [3,5)              B0 [9,11)    B1 [13,15)    busy 8
 *   r1          F0 [3,5) B0 [5,9) F1 [9,11) B1 [11,13)            busy 10
 * The window is [1, 15): bubbles 6/14 and 4/14. `stages` 1 makes it gradient accumulation. */
static size_t make_pipe_step(ms_event *out, int64_t s, int stages) {
    static const struct {
        int rank, action, mb;
        double t0, t1;
    } acts[] = {{0, MS_PIPE_F, 0, 1, 3},   {0, MS_PIPE_F, 1, 3, 5},  {0, MS_PIPE_B, 0, 9, 11},
                {0, MS_PIPE_B, 1, 13, 15}, {1, MS_PIPE_F, 0, 3, 5},  {1, MS_PIPE_B, 0, 5, 9},
                {1, MS_PIPE_F, 1, 9, 11},  {1, MS_PIPE_B, 1, 11, 13}};
    size_t n = 0;
    double base = 100.0 * (double)s;
    for (int r = 0; r < NR; r++) out[n++] = ev(r, MS_EV_STEP, s, MS_(base), MS_(base + 20));
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        ms_event *e = &out[n++];
        *e = ev(acts[i].rank, MS_EV_PIPE, s, MS_(base + acts[i].t0), MS_(base + acts[i].t1));
        ms_ev_pipe *p = &e->u.pipe;
        p->action = (uint8_t)acts[i].action;
        p->stage = (int16_t)(stages > 1 ? acts[i].rank : 0);
        p->mb = acts[i].mb;
        p->model_chunk = p->stage;
        p->stages = (int16_t)stages;
        p->virtual_stages = 1;
        p->micro_batches = 2;
        snprintf(p->schedule, sizeof p->schedule, "1f1b");
    }
    return n;
}

/* The pipeline view is the last complete step's actions, one lane per stage, times from its
 * first action, with the analysis' measured bubbles; it is in the JSON with 2 lanes. Without
 * a pipeline (one stage) it is hidden: null in the JSON. */
static void test_pipeline_view(void **state) {
    (void)state;
    for (int stages = 2; stages >= 1; stages--) {
        ms_live *l = new_live(2);
        ms_event buf[64];
        for (int64_t s = 0; s < 3; s++) ms_live_feed_events(l, buf, make_pipe_step(buf, s, stages));
        ms_live_publish_now(l);
        const ms_snapshot *s = ms_live_acquire(l);
        const ms_live_pipeline *pl = &s->pipeline;
        const ms_pipe_stats *ps = &s->analysis.pipe;
        assert_int_equal(ps->stages, stages);
        assert_int_equal(ps->last_step, 2);
        cJSON *j = ms_snapshot_to_json(s);
        assert_non_null(j);
        const cJSON *jp = cJSON_GetObjectItemCaseSensitive(j, "pipeline");
        if (stages == 1) {
            assert_true(pl->step == -1);
            assert_null(pl->blocks);
            assert_true(cJSON_IsNull(jp));
        } else {
            assert_true(pl->step == 2);
            assert_int_equal(pl->stages, 2);
            assert_int_equal(pl->rank[0], 0);
            assert_int_equal(pl->rank[1], 1);
            assert_true(fabs(pl->wall_s - 0.014) < 1e-12);
            assert_int_equal(pl->n_blocks, 8);
            for (int i = 0; i < pl->n_blocks; i++) {
                const ms_live_pipe_block *b = &pl->blocks[i];
                assert_int_equal(b->stage, i / 4);
                if (i % 4) assert_true(b->t0 >= pl->blocks[i - 1].t1 - 1e-12);
            }
            const ms_live_pipe_block *b0 = &pl->blocks[0], *b5 = &pl->blocks[5];
            assert_true(b0->action == MS_PIPE_F && b0->mb == 0 && b0->t0 == 0.0);
            assert_true(b5->action == MS_PIPE_B && b5->mb == 0);
            assert_true(fabs(b5->t0 - 0.004) < 1e-12 && fabs(b5->t1 - 0.008) < 1e-12);
            assert_true(fabs(ps->last_stage_bubble[0] - 6.0 / 14) < 1e-12);
            assert_true(fabs(ps->last_stage_bubble[1] - 4.0 / 14) < 1e-12);
            assert_true(fabs(ps->formula - 1.0 / 3) < 1e-12);
            const cJSON *lanes = cJSON_GetObjectItemCaseSensitive(jp, "lanes");
            assert_int_equal(cJSON_GetArraySize(lanes), 2);
            assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(jp, "blocks")), 8);
            const cJSON *ap = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(j, "analysis"), "pipeline");
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(ap, "schedule")->valuestring,
                                "1f1b");
        }
        cJSON_Delete(j);
        ms_snapshot_release(s);
        ms_live_destroy(l);
    }
}

static void test_snapshots_are_immutable(void **state) {
    (void)state;
    ms_live *l = new_live(4);
    ms_live_step rec = {.step = 0, .loss = 3};
    ms_live_step_done(l, &rec);
    ms_live_publish_now(l);
    const ms_snapshot *a = ms_live_acquire(l);
    uint64_t va = a->version;
    rec.step = 1, rec.loss = 2;
    ms_live_step_done(l, &rec);
    ms_live_publish_now(l);
    const ms_snapshot *b = ms_live_acquire(l);
    assert_true(b->version > va);
    assert_int_equal(a->n_history, 1);
    assert_int_equal(a->step, 0);
    assert_int_equal(b->n_history, 2);
    assert_int_equal(ms_live_wait(l, va, 10), b->version); /* already newer: no wait */
    ms_snapshot_release(a);
    ms_snapshot_release(b);
    ms_live_destroy(l);
}

static int refusals;
static ms_status refuse_tp3(void *user, const ms_live_req *req, ms_error *err) {
    (void)user;
    if (req->kind == MS_REQ_STRATEGY && strstr(req->strategy_json, "\"tp\": 3")) {
        refusals++;
        return ms_fail(err, MS_ERR_INVALID, "tp 3 does not divide 4 heads");
    }
    return MS_OK;
}

static void test_control_queue(void **state) {
    (void)state;
    ms_live *l = new_live(4);
    ms_live_set_validator(l, refuse_tp3, NULL);
    ms_suggestion sg[2] = {{.id = 1, .state = MS_SUGG_OPEN, .predicted_gain = 0.2},
                           {.id = 2, .state = MS_SUGG_OPEN, .predicted_gain = 0.2}};
    snprintf(sg[0].target, sizeof sg[0].target, "dp2 x tp2");
    ms_live_set_suggestions(l, sg, 2, 0.1);
    ms_error err = {0};
    ms_live_req r = {.kind = MS_REQ_STRATEGY};
    snprintf(r.strategy_json, sizeof r.strategy_json, "{\"tp\": 3}");
    assert_int_equal(ms_live_post(l, &r, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tp 3 does not divide"));
    assert_int_equal(refusals, 1);
    ms_live_req take;
    assert_false(ms_live_take(l, &take)); /* refused: never queued */
    /* unknown suggestion */
    r = (ms_live_req){.kind = MS_REQ_ACCEPT, .id = 9};
    assert_int_equal(ms_live_post(l, &r, &err), MS_ERR_INVALID);
    /* accept 1 -> pending and queued; accept again -> refused (not open) */
    r.id = 1;
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    assert_int_equal(ms_live_post(l, &r, &err), MS_ERR_INVALID);
    /* dismiss 2 -> dismissed at once, nothing queued */
    r = (ms_live_req){.kind = MS_REQ_DISMISS, .id = 2};
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    ms_live_publish_now(l);
    const ms_snapshot *s = ms_live_acquire(l);
    assert_int_equal(s->n_suggestions, 2);
    assert_int_equal(s->suggestions[0].state, MS_SUGG_PENDING);
    assert_int_equal(s->suggestions[1].state, MS_SUGG_DISMISSED);
    ms_snapshot_release(s);
    /* the advisor's next list does not resurrect the dismissed id as open */
    ms_live_set_suggestions(l, sg, 2, 0.1);
    ms_live_publish_now(l);
    s = ms_live_acquire(l);
    assert_int_equal(s->n_suggestions, 2);
    for (int i = 0; i < 2; i++) assert_int_not_equal(s->suggestions[i].state, MS_SUGG_OPEN);
    ms_snapshot_release(s);
    assert_true(ms_live_take(l, &take));
    assert_int_equal(take.kind, MS_REQ_ACCEPT);
    assert_int_equal(take.id, 1);
    assert_false(ms_live_take(l, &take));
    /* bounded: the 17th request is refused with NOMEM, order kept */
    for (int i = 0; i < 16; i++) {
        r = (ms_live_req){.kind = MS_REQ_STRATEGY};
        snprintf(r.strategy_json, sizeof r.strategy_json, "{\"dp\": %d}", i);
        assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    }
    assert_int_equal(ms_live_post(l, &r, &err), MS_ERR_NOMEM);
    for (int i = 0; i < 16; i++) {
        char want[32];
        snprintf(want, sizeof want, "{\"dp\": %d}", i);
        assert_true(ms_live_take(l, &take));
        assert_string_equal(take.strategy_json, want);
    }
    /* a finished job takes no requests */
    ms_live_stop(l);
    r = (ms_live_req){.kind = MS_REQ_STOP};
    assert_int_equal(ms_live_post(l, &r, &err), MS_ERR_UNSUPPORTED);
    s = ms_live_acquire(l);
    assert_true(s->finished);
    ms_snapshot_release(s);
    ms_live_destroy(l);
}

/* The event window allocates through a device that may refuse: with a 1 MiB limit it stops
 * at 4096 events, keeps the newest, says so in the views and goes on analysing; a later feed
 * larger than the window keeps the steps the window analyses. With no memory at all there
 * is no window, but snapshots still come. */
static void test_window_out_of_memory(void **state) {
    (void)state;
    ms_live_opts o = {.info = {.nranks = NR, .live = true}, .window_steps = 2};
    o.window_limit_bytes = 1 << 20;
    ms_live *l = NULL;
    ms_error err = {0};
    assert_int_equal(ms_live_create(&o, &l, &err), MS_OK);
    ms_group g = pair_group();
    ms_live_feed_groups(l, &g, 1);
    enum { STEPS = 700 };
    ms_event *buf = malloc(sizeof *buf * 8 * STEPS);
    for (int round = 0; round < 2; round++) {
        size_t n = 0;
        for (int64_t s = 0; s < STEPS; s++) n += make_step(buf + n, round * STEPS + s, &g);
        assert_true(n > 4096);
        ms_live_feed_events(l, buf, n);
        ms_live_publish_now(l);
        const ms_snapshot *s = ms_live_acquire(l);
        assert_non_null(strstr(s->last_event, "live window: cannot grow to 8192 events"));
        assert_non_null(strstr(s->last_event, "analysing the newest 4096 events"));
        assert_int_equal(s->analysis.n_steps, 2);
        assert_int_equal(s->analysis.steps[1].step, (round + 1) * STEPS - 1);
        assert_int_equal(s->timeline_step, (round + 1) * STEPS - 1);
        ms_snapshot_release(s);
    }
    ms_live_destroy(l);

    o.window_limit_bytes = 1;
    assert_int_equal(ms_live_create(&o, &l, &err), MS_OK);
    size_t n = make_step(buf, 0, &g);
    ms_live_feed_events(l, buf, n);
    ms_live_publish_now(l);
    const ms_snapshot *s = ms_live_acquire(l);
    assert_non_null(strstr(s->last_event, "live window: cannot grow to 4096 events"));
    assert_int_equal(s->analysis.nranks, 0);
    ms_snapshot_release(s);
    ms_live_destroy(l);
    free(buf);
}

/* --- the suggestion lifecycle: advisor rounds -> the open list ------------------------- */

static ms_suggestion cand(int32_t id, double gain, int round) {
    ms_suggestion g;
    memset(&g, 0, sizeof g);
    g.id = id;
    g.state = MS_SUGG_OPEN;
    g.predicted_gain = gain;
    g.applied_step = -1;
    snprintf(g.target, sizeof g.target, "target %d", (int)id);
    snprintf(g.evidence, sizeof g.evidence, "round %d", round);
    return g;
}

typedef struct want {
    int32_t id;
    double gain;
    uint8_t state;
} want;

/* One round over `list`: fresh candidates in, the expected list (ids, gains, states, in
 * order) out; open entries carry this round's evidence. */
static void round_is(ms_suggestion *list, int *n, const ms_suggestion *fresh, int n_fresh,
                     int round, const want *w, int n_want) {
    ms_suggestion out[MS_LIVE_MAX_SUGGESTIONS];
    int got = ms_suggestions_next(list, *n, fresh, n_fresh, 0.10, out);
    if (got != n_want) fail_msg("round %d: %d suggestions, expected %d", round, got, n_want);
    for (int i = 0; i < got; i++) {
        if (out[i].id != w[i].id || out[i].state != w[i].state ||
            fabs(out[i].predicted_gain - w[i].gain) > 1e-12)
            fail_msg("round %d, entry %d: id %d gain %g state %d, expected id %d gain %g state %d",
                     round, i, (int)out[i].id, out[i].predicted_gain, out[i].state, (int)w[i].id,
                     w[i].gain, w[i].state);
        char ev[32];
        snprintf(ev, sizeof ev, "round %d", round);
        if (out[i].state == MS_SUGG_OPEN && !out[i].missed)
            assert_string_equal(out[i].evidence, ev);
    }
    memcpy(list, out, sizeof out[0] * (size_t)got);
    *n = got;
}

/* Opens at 10%, stays open down to 5% (updated in place, same id and place), closes below
 * that or when no longer suggested; dismissed and accepted entries stay as they are; a full
 * list lets a better target supersede the weakest open entry. */
static void test_suggestion_lifecycle(void **state) {
    (void)state;
    ms_suggestion list[MS_LIVE_MAX_SUGGESTIONS];
    int n = 0;
    const uint8_t O = MS_SUGG_OPEN;
    /* 1: A opens, B is under the threshold */
    ms_suggestion r1[] = {cand(1, 0.12, 1), cand(2, 0.08, 1)};
    round_is(list, &n, r1, 2, 1, (want[]){{1, 0.12, O}}, 1);
    /* 2: A dips under 10% and stays (the bug: it vanished); B crosses and is appended */
    ms_suggestion r2[] = {cand(2, 0.11, 2), cand(1, 0.09, 2)};
    round_is(list, &n, r2, 2, 2, (want[]){{1, 0.09, O}, {2, 0.11, O}}, 2);
    /* 3: both move; the order is the list's, not the round's */
    ms_suggestion r3[] = {cand(2, 0.12, 3), cand(1, 0.06, 3)};
    round_is(list, &n, r3, 2, 3, (want[]){{1, 0.06, O}, {2, 0.12, O}}, 2);
    /* 4..: A is no longer suggested: kept as last priced (round 3's values) for
     * MS_SUGG_GRACE_ROUNDS - 1 rounds, then closed */
    int r = 4;
    for (int k = 1; k <= MS_SUGG_GRACE_ROUNDS; k++, r++) {
        ms_suggestion f[] = {cand(2, 0.07, r)};
        if (k < MS_SUGG_GRACE_ROUNDS) {
            round_is(list, &n, f, 1, r, (want[]){{1, 0.06, O}, {2, 0.07, O}}, 2);
            assert_string_equal(list[0].evidence, "round 3");
            assert_int_equal(list[0].missed, k);
        } else {
            round_is(list, &n, f, 1, r, (want[]){{2, 0.07, O}}, 1);
        }
    }
    /* B falls under 5% and is closed after the grace rounds; A at 8% does not reopen (under
     * 10%) meanwhile */
    for (int k = 1; k <= MS_SUGG_GRACE_ROUNDS; k++, r++) {
        ms_suggestion f[] = {cand(1, 0.08, r), cand(2, 0.04, r)};
        if (k < MS_SUGG_GRACE_ROUNDS)
            round_is(list, &n, f, 2, r, (want[]){{2, 0.07, O}}, 1);
        else
            round_is(list, &n, f, 2, r, NULL, 0);
    }
    /* 6: A crosses 10% again: the same id */
    ms_suggestion r6[] = {cand(1, 0.11, 6)};
    round_is(list, &n, r6, 1, 6, (want[]){{1, 0.11, O}}, 1);
    /* one noisy round that misses A, then A priced again: open throughout, refreshed */
    round_is(list, &n, NULL, 0, 60, (want[]){{1, 0.11, O}}, 1);
    ms_suggestion r61[] = {cand(1, 0.13, 61)};
    round_is(list, &n, r61, 1, 61, (want[]){{1, 0.13, O}}, 1);
    assert_int_equal(list[0].missed, 0);
    /* 7: dismissed A stays dismissed and unchanged; C opens */
    list[0].state = MS_SUGG_DISMISSED;
    ms_suggestion r7[] = {cand(1, 0.30, 7), cand(3, 0.20, 7)};
    round_is(list, &n, r7, 2, 7, (want[]){{1, 0.13, MS_SUGG_DISMISSED}, {3, 0.20, O}}, 2);
    /* 8: accepted C stays pending when the round no longer has it */
    list[1].state = MS_SUGG_PENDING;
    round_is(list, &n, NULL, 0, 8,
             (want[]){{1, 0.13, MS_SUGG_DISMISSED}, {3, 0.20, MS_SUGG_PENDING}}, 2);
    /* 9: six more fill the list */
    ms_suggestion r9[6];
    want w9[8] = {{1, 0.13, MS_SUGG_DISMISSED}, {3, 0.20, MS_SUGG_PENDING}};
    for (int i = 0; i < 6; i++) {
        r9[i] = cand(10 + i, 0.25 - 0.01 * i, 9);
        w9[2 + i] = (want){10 + i, 0.25 - 0.01 * i, O};
    }
    round_is(list, &n, r9, 6, 9, w9, 8);
    /* 10: full; 50% supersedes the weakest open entry (15, 20%) in its place; 15% does not */
    ms_suggestion r10[8];
    memcpy(r10, r9, sizeof r9);
    for (int i = 0; i < 6; i++) snprintf(r10[i].evidence, sizeof r10[i].evidence, "round 10");
    r10[6] = cand(20, 0.50, 10);
    r10[7] = cand(21, 0.15, 10);
    w9[7] = (want){20, 0.50, O};
    round_is(list, &n, r10, 8, 10, w9, 8);
}

/* --- concurrency: ranks record and report while readers take snapshots ---------------- */

typedef struct conc {
    ms_live *live;
    ms_recorder *rec[NR];
    int steps;
    int done;
    pthread_mutex_t mu;
} conc;

static void *rank_main(void *arg) {
    conc *c = arg;
    static int next;
    pthread_mutex_lock(&c->mu);
    int r = next++;
    pthread_mutex_unlock(&c->mu);
    ms_group g = pair_group();
    ms_recorder_group(c->rec[r], &g);
    ms_event buf[64];
    for (int s = 0; s < c->steps; s++) {
        ms_recorder_set_step(c->rec[r], s);
        size_t n = make_step(buf, s, &g);
        for (size_t i = 0; i < n; i++)
            if (buf[i].rank == r) ms_recorder_push(c->rec[r], &buf[i]);
        if (r == 0) {
            ms_live_step rec = {.step = s, .loss = 1.0 / (s + 1)};
            ms_live_step_done(c->live, &rec);
        }
    }
    return NULL;
}

static _Atomic int inconsistent; /* cmocka's asserts are not thread-safe */

static void *reader_main(void *arg) {
    conc *c = arg;
    uint64_t v = 0;
    for (int i = 0; i < 200; i++) {
        v = ms_live_wait(c->live, v, 5);
        const ms_snapshot *s = ms_live_acquire(c->live);
        /* internal consistency of whatever snapshot we got */
        if (s->n_history && s->history[s->n_history - 1].step != s->step) inconsistent++;
        for (int k = 1; k < s->n_history; k++)
            if (s->history[k].step != s->history[k - 1].step + 1) inconsistent++;
        ms_snapshot_release(s);
    }
    return NULL;
}

static void test_concurrent_readers(void **state) {
    (void)state;
    conc c = {.steps = 300};
    pthread_mutex_init(&c.mu, NULL);
    ms_live_opts o = {.info = {.nranks = NR, .live = true}, .tick_ms = 1, .window_steps = 3};
    ms_error err = {0};
    assert_int_equal(ms_live_create(&o, &c.live, &err), MS_OK);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(ms_recorder_create(r, 1 << 12, &c.rec[r], &err), MS_OK);
        ms_live_attach_recorder(c.live, c.rec[r]);
    }
    assert_int_equal(ms_live_start(c.live, &err), MS_OK);
    pthread_t th[NR + 3];
    for (int r = 0; r < NR; r++) pthread_create(&th[r], NULL, rank_main, &c);
    for (int i = 0; i < 3; i++) pthread_create(&th[NR + i], NULL, reader_main, &c);
    for (int i = 0; i < NR + 3; i++) pthread_join(th[i], NULL);
    assert_int_equal(inconsistent, 0);
    for (int r = 0; r < NR; r++) ms_live_detach_recorder(c.live, c.rec[r]);
    ms_live_stop(c.live);
    const ms_snapshot *s = ms_live_acquire(c.live);
    assert_int_equal(s->step, c.steps - 1);
    assert_int_equal(s->n_history, c.steps);
    assert_int_equal(s->timeline_step, c.steps - 1);
    assert_int_equal(s->analysis.n_steps, 3);
    ms_snapshot_release(s);
    for (int r = 0; r < NR; r++) ms_recorder_destroy(c.rec[r]);
    ms_live_destroy(c.live);
    pthread_mutex_destroy(&c.mu);
}

/* `meshscope serve` on a trace with no usable events: nothing is fed (a NULL array of 0
 * events, as the reader returns), and the model still publishes an empty snapshot and writes
 * an empty trace. Under UBSan this once stopped at memcpy from NULL. */
static void hardening_live_empty_trace(void **state) {
    (void)state;
    ms_live_opts o = {.info = {.nranks = 1, .live = false}, .window_steps = 1};
    ms_live *l;
    ms_error err = {0};
    assert_int_equal(ms_live_create(&o, &l, &err), MS_OK);
    ms_live_feed_groups(l, NULL, 0);
    ms_live_feed_events(l, NULL, 0);
    ms_live_set_strategy(l, "trace");
    ms_live_publish_now(l);
    const ms_snapshot *s = ms_live_acquire(l);
    assert_true(s->version >= 1);
    assert_int_equal(s->n_history, 0);
    assert_int_equal(s->n_timeline, 0);
    assert_int_equal(s->timeline_step, -1);
    assert_int_equal(s->analysis.n_steps, 0);
    assert_true(s->finished);
    assert_string_equal(s->strategy, "trace");
    ms_snapshot_release(s);
    char dir[] = "/tmp/ms_test_live_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/trace.json", dir);
    assert_int_equal(ms_live_write_trace(l, path, &err), MS_OK);
    ms_trace t;
    assert_int_equal(ms_trace_read(path, &t, &err), MS_OK);
    assert_int_equal(t.n_events, 0);
    ms_trace_free(&t);
    unlink(path);
    rmdir(dir);
    ms_live_destroy(l);
}

/* Requests still queued when training ends are handed back to be reported (a switch posted at
 * step 197 of 200 got 202 and was never applied, with nothing said), each with the step it was
 * posted at, and no request is queued after that; an accepted one can be shown as dropped. */
static void hardening_live_close_control(void **state) {
    (void)state;
    ms_live *l = new_live(4);
    ms_suggestion sg = {.id = 3, .state = MS_SUGG_OPEN, .predicted_gain = 0.2};
    snprintf(sg.target, sizeof sg.target, "dp4 x tp1");
    ms_live_set_suggestions(l, &sg, 1, 0.1);
    ms_error err = {0};
    ms_live_req r = {.kind = MS_REQ_STRATEGY}, left[MS_LIVE_QUEUE];
    snprintf(r.strategy_json, sizeof r.strategy_json, "{\"dp\": 4}");
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK); /* before the first step */
    for (int step = 195; step <= 197; step++) {
        ms_live_step rec = {.step = step, .loss = 1, .step_s = 0.01};
        ms_live_step_done(l, &rec);
    }
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    r = (ms_live_req){.kind = MS_REQ_ACCEPT, .id = 3};
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    assert_int_equal(ms_live_close_control(l, left), 3);
    assert_int_equal(left[0].step, -1);
    assert_int_equal(left[1].step, 197);
    assert_int_equal(left[1].kind, MS_REQ_STRATEGY);
    assert_int_equal(left[2].kind, MS_REQ_ACCEPT);
    assert_int_equal(left[2].id, 3);
    ms_live_req take;
    assert_false(ms_live_take(l, &take));
    r = (ms_live_req){.kind = MS_REQ_STOP};
    assert_int_equal(ms_live_post(l, &r, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "ended training"));
    assert_int_equal(ms_live_close_control(l, left), 0);
    assert_true(ms_live_suggestion_dropped(l, 3, 197));
    ms_live_publish_now(l);
    const ms_snapshot *s = ms_live_acquire(l);
    assert_int_equal(s->n_suggestions, 1);
    assert_string_equal(ms_suggestion_state_name(s->suggestions[0].state), "dropped");
    assert_string_equal(s->suggestions[0].result, "not applied: the run ended at step 197");
    ms_snapshot_release(s);
    ms_live_destroy(l);
}

/* The state of suggestion id in the latest snapshot, -1 if absent. */
static int state_of(ms_live *l, int32_t id) {
    ms_live_publish_now(l);
    const ms_snapshot *s = ms_live_acquire(l);
    int state = -1;
    for (int i = 0; i < s->n_suggestions; i++)
        if (s->suggestions[i].id == id) state = s->suggestions[i].state;
    ms_snapshot_release(s);
    return state;
}

/* The advisor withholds: every open suggestion is withdrawn with the note as its result, a
 * pending one stays as it is, and the snapshot carries the note. When the advisor suggests
 * again the note clears; a withdrawn target suggested at 10% or more reopens under its id, in
 * its place; one not suggested (or under 10%) leaves the list. Accepting a withdrawn one is
 * refused. */
static void test_advisor_withholds(void **state) {
    (void)state;
    ms_live *l = new_live(4);
    ms_suggestion sg[3] = {cand(1, 0.20, 1), cand(2, 0.15, 1), cand(3, 0.12, 1)};
    ms_live_set_suggestions(l, sg, 3, 0.10);
    ms_error err = {0};
    ms_live_req r = {.kind = MS_REQ_ACCEPT, .id = 2};
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    const char *note = "the cost model is 41% off the measured step for 5 rounds";
    ms_live_withhold_suggestions(l, note);
    ms_live_publish_now(l);
    const ms_snapshot *s = ms_live_acquire(l);
    assert_string_equal(s->advisor_note, note);
    assert_int_equal(s->n_suggestions, 3);
    const uint8_t held[3] = {MS_SUGG_WITHDRAWN, MS_SUGG_PENDING, MS_SUGG_WITHDRAWN};
    for (int i = 0; i < 3; i++) assert_int_equal(s->suggestions[i].state, held[i]);
    assert_string_equal(s->suggestions[0].result, note);
    assert_string_equal(s->suggestions[1].result, "");
    assert_string_equal(ms_suggestion_state_name(s->suggestions[0].state), "withdrawn");
    ms_snapshot_release(s);
    r.id = 1;
    assert_int_equal(ms_live_post(l, &r, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "suggestion 1 is withdrawn, not open"));
    /* the advisor suggests again: 1 at 18% reopens in place, 3 at 8% and 4 at 11% */
    ms_suggestion again[3] = {cand(1, 0.18, 2), cand(3, 0.08, 2), cand(4, 0.11, 2)};
    ms_live_set_suggestions(l, again, 3, 0.10);
    ms_live_publish_now(l);
    s = ms_live_acquire(l);
    assert_string_equal(s->advisor_note, "");
    assert_int_equal(s->n_suggestions, 3);
    const int32_t ids[3] = {1, 2, 4};
    const uint8_t states[3] = {MS_SUGG_OPEN, MS_SUGG_PENDING, MS_SUGG_OPEN};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(s->suggestions[i].id, ids[i]);
        assert_int_equal(s->suggestions[i].state, states[i]);
    }
    assert_string_equal(s->suggestions[0].result, "");
    assert_true(fabs(s->suggestions[0].predicted_gain - 0.18) < 1e-12);
    ms_snapshot_release(s);
    ms_live_destroy(l);
}

/* Every state change after acceptance goes through the live model, which refuses a move out of
 * a state the suggestion is not in: the job cannot apply a dismissed suggestion, measure a
 * refused one or drop an applied one. */
static void test_suggestion_transitions(void **state) {
    (void)state;
    ms_live *l = new_live(4);
    ms_suggestion sg[3] = {{.id = 1, .predicted_gain = 0.3},
                           {.id = 2, .predicted_gain = 0.3},
                           {.id = 3, .predicted_gain = 0.3}};
    ms_live_set_suggestions(l, sg, 3, 0.1);
    ms_error err = {0};
    /* open: nothing but accept or dismiss moves it */
    assert_false(ms_live_suggestion_applied(l, 1, 5, false));
    assert_false(ms_live_suggestion_refused(l, 1, "no"));
    assert_false(ms_live_suggestion_dropped(l, 1, 9));
    assert_false(ms_live_suggestion_measured(l, 1, "x"));
    assert_false(ms_live_suggestion_applied(l, 99, 5, false)); /* unknown id */
    assert_int_equal(state_of(l, 1), MS_SUGG_OPEN);
    ms_live_req r = {.kind = MS_REQ_ACCEPT, .id = 1};
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    r.id = 2;
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    r = (ms_live_req){.kind = MS_REQ_DISMISS, .id = 3};
    assert_int_equal(ms_live_post(l, &r, &err), MS_OK);
    /* pending -> applied, then measured (the applied step kept); not refused or dropped */
    assert_false(ms_live_suggestion_measured(l, 1, "x"));
    assert_true(ms_live_suggestion_applied(l, 1, 12, false));
    assert_false(ms_live_suggestion_refused(l, 1, "late"));
    assert_false(ms_live_suggestion_dropped(l, 1, 20));
    assert_true(ms_live_suggestion_measured(l, 1, "predicted 30% faster, measured 25% faster"));
    ms_suggestion got;
    assert_true(ms_live_suggestion_get(l, 1, &got));
    assert_int_equal(got.state, MS_SUGG_APPLIED);
    assert_int_equal(got.applied_step, 12);
    assert_string_equal(got.result, "predicted 30% faster, measured 25% faster");
    /* pending -> refused, which is final */
    assert_true(ms_live_suggestion_refused(l, 2, "tp 3 does not divide 4 heads"));
    assert_false(ms_live_suggestion_applied(l, 2, 13, false));
    assert_false(ms_live_suggestion_measured(l, 2, "x"));
    assert_int_equal(state_of(l, 2), MS_SUGG_REFUSED);
    /* dismissed is final too */
    assert_false(ms_live_suggestion_applied(l, 3, 13, true));
    assert_false(ms_live_suggestion_dropped(l, 3, 20));
    assert_int_equal(state_of(l, 3), MS_SUGG_DISMISSED);
    ms_live_destroy(l);
}

int main(int argc, char **argv) {
    mt_apply_filter(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hardening_live_empty_trace),
        cmocka_unit_test(test_empty_snapshot),
        cmocka_unit_test(test_window_timeline_memory),
        cmocka_unit_test(test_pipeline_view),
        cmocka_unit_test(test_snapshots_are_immutable),
        cmocka_unit_test(test_control_queue),
        cmocka_unit_test(test_suggestion_lifecycle),
        cmocka_unit_test(test_suggestion_transitions),
        cmocka_unit_test(test_advisor_withholds),
        cmocka_unit_test(test_window_out_of_memory),
        cmocka_unit_test(test_concurrent_readers),
        cmocka_unit_test(hardening_live_close_control),
    };
    return cmocka_run_group_tests_name("live", tests, NULL, NULL);
}

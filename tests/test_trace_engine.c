/* test_trace_engine.c - traced training against what the engine planned.
 *
 * A dp2 x tp2 step:
 * Every rank records one step of a small GPT. Then, on every rank: each reshard that the
 * compiled program (the `explain` listing) predicts appears in the trace exactly once per
 * step with the same tensor, placements and bytes; each reshard's flow id is carried by at
 * least one collective when it moves bytes; the collectives' bytes add up to the reshards'
 * bytes; every kernel the program lists is traced once, and the traced FLOPs and bytes add up
 * to the listed ones; and every rank's events are there. The written trace file passes the
 * validator. With gradient buckets, the bucketed grad-sync reshards move their bytes in
 * non-blocking all-reduces instead, the first of which runs during backward.
 *
 * A pipeline (pp 2, 1f1b, 4 micro-batches; dp fills the rest of an MPI world) trained two
 * steps: every rank recorded one F and one B per micro-batch per step, naming its stage; the
 * point-to-point sends between the stages moved exactly the activations and gradients the
 * schedule transfers, and the heatmap shows them as the off-diagonal band (stage 0's rank r to
 * stage 1's rank r + R and back); the analysis measures a bubble per stage; the trace file
 * validates and reads back to the same events and the same analysis.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "engine/train/trainer.h"
#include "profiler/analysis.h"
#include "profiler/record/gather.h"
#include "profiler/record/hooks.h"
#include "profiler/record/recorder.h"
#include "tests/testkit.h"
#include "traces/trace_check.h"
#include "traces/trace_read.h"
#include "traces/trace_write.h"

enum { B = 4, T = 8, CAP = 1 << 16 };

typedef struct shared {
    int ranks_seen[8];
    float bucket_mb; /* > 0: the gradient all-reduces run in buckets */
    bool gpu_hooks;  /* bracket launches with fake correlation hooks and check the ids */
} shared;

/* Buckets: the non-blocking all-reduces moved exactly the bytes of the grad-sync reshards they
 * replaced, and the first of them was issued while backward was still computing (before the
 * last backward kernel started; when it began to run depends on the scheduler). */
static void check_buckets(mt_rank *r, const ms_event *ev, size_t n, uint64_t bucketed) {
    uint64_t async_bytes = 0;
    int64_t first_issue = INT64_MAX, last_bwd = 0;
    for (size_t k = 0; k < n; k++) {
        if (ev[k].kind == MS_EV_COLL && ev[k].u.coll.async) {
            async_bytes += ev[k].u.coll.bytes;
            MT_CHECK(r, ev[k].u.coll.queued_ns >= 0, "negative queueing time");
            int64_t issued = ev[k].t0_ns - ev[k].u.coll.queued_ns;
            if (issued < first_issue) first_issue = issued;
        }
        if (ev[k].kind == MS_EV_OP && ev[k].phase == MS_PHASE_BACKWARD && ev[k].t0_ns > last_bwd)
            last_bwd = ev[k].t0_ns;
    }
    MT_CHECK(r, bucketed > 0 && async_bytes == bucketed,
             "rank %d: bucket all-reduces moved %llu bytes, the bucketed reshards %llu",
             r->ctx->rank, (unsigned long long)async_bytes, (unsigned long long)bucketed);
    MT_CHECK(r, first_issue < last_bwd,
             "rank %d: the first bucket was issued %lld ns after backward's last kernel started",
             r->ctx->rank, (long long)(first_issue - last_bwd));
}

/* Stand-ins for the CUPTI bracket (ms_trace_state.gpu_push/pop), per rank thread. */
static _Thread_local uint64_t g_pushed[4096];
static _Thread_local int g_npush, g_npop, g_depth, g_max_depth;
static void fake_push(uint64_t corr) {
    if (g_npush < 4096) g_pushed[g_npush] = corr;
    g_npush++;
    if (++g_depth > g_max_depth) g_max_depth = g_depth;
}
static void fake_pop(void) {
    g_npop++;
    g_depth--;
}

/* Every kernel was bracketed once, unnested, with an id of this rank's that its event carries
 * (in launch order); reshards carry none. */
static void check_correlation(mt_rank *r, const ms_event *ev, size_t n) {
    int k = 0;
    MT_CHECK(r, g_npush == g_npop && g_depth == 0 && g_max_depth == 1,
             "rank %d: %d pushes, %d pops, depth %d (max %d)", r->ctx->rank, g_npush, g_npop,
             g_depth, g_max_depth);
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind != MS_EV_OP) continue;
        uint64_t c = ev[i].u.op.corr;
        MT_CHECK(r, k < g_npush && c == g_pushed[k] && MS_EV_CORR_RANK(c) == r->ctx->rank,
                 "rank %d: op %zu carries correlation %llu, pushed %llu", r->ctx->rank, i,
                 (unsigned long long)c, (unsigned long long)(k < g_npush ? g_pushed[k] : 0));
        k++;
    }
    MT_CHECK(r, k == g_npush && k > 0, "rank %d: %d ops for %d brackets", r->ctx->rank, k, g_npush);
}

static void body(mt_rank *r, void *arg) {
    shared *sh = arg;
    ms_ctx *ctx = r->ctx;
    ms_error err = {0};
    ms_recorder *rec;
    if (!MT_OK(r, ms_recorder_create(ctx->rank, CAP, &rec, &err), &err)) return;
    ms_record_into(ctx, rec);
    ms_strategy s;
    ms_strategy_init(&s, 2, 2, 1, false, &err);
    ms_mesh mesh;
    ms_strategy_mesh(&s, &mesh, &err);
    ms_dmesh *dm;
    MT_OK(r, ms_dmesh_create(ctx, &mesh, &dm, &err), &err);
    ms_model_config cfg = {.model_type = MS_MODEL_GPT2,
                           .n_layer = 1,
                           .n_head = 4,
                           .n_embd = 16,
                           .vocab_size = 32,
                           .n_positions = 8,
                           .layer_norm_epsilon = 1e-5};
    ms_model m;
    MT_OK(r, ms_model_build(&cfg, B, T, &m, &err), &err);
    ms_program *p;
    ms_sharding sharding = {.s = &s};
    ms_compile_opts co = {
        .shard = ms_strategy_shard, .shard_user = &sharding, .seed = 1, .bucket_mb = sh->bucket_mb};
    if (!MT_OK(r, ms_program_compile(m.g, dm, &co, &p, &err), &err)) return;
    float ids[B * T], pos[B * T];
    for (int i = 0; i < B * T; i++) ids[i] = (float)(i * 7 % 32), pos[i] = (float)(i % T);
    ms_program_feed(p, m.ids, ids, &err);
    ms_program_feed(p, m.targets, ids, &err);
    ms_program_feed(p, m.pos, pos, &err);
    ms_recorder_set_step(rec, 0);
    if (sh->gpu_hooks) {
        ctx->trace.gpu_push = fake_push;
        ctx->trace.gpu_pop = fake_pop;
        g_npush = g_npop = g_depth = g_max_depth = 0;
    }
    float loss;
    MT_OK(r, ms_program_step(p, &loss, &err), &err);
    ctx->trace.gpu_push = NULL;
    ctx->trace.gpu_pop = NULL;
    ms_recorder_set_step(rec, -1);

    uint64_t cursor = 0;
    ms_event *ev = xmalloc(sizeof *ev * CAP);
    size_t n = ms_recorder_read(rec, &cursor, ev, CAP, NULL);
    if (sh->gpu_hooks) check_correlation(r, ev, n);
    int nres = ms_program_num_reshards(p);
    MT_CHECK(r, nres > 0, "dp2 x tp2 plans no reshards");
    bool *used = xcalloc(n + 1, 1);
    uint64_t bucketed = 0; /* bytes of the grad-sync reshards that buckets reduced */
    for (int i = 0; i < nres; i++) {
        ms_reshard_info ri;
        ms_program_reshard(p, i, &ri);
        char from[64], to[64], want[64];
        ms_placements_str(&ri.from, from, sizeof from);
        ms_placements_str(&ri.to, to, sizeof to);
        bool grad = ri.phase == MS_PROG_BACKWARD || ri.phase == MS_PROG_GRAD_SYNC;
        snprintf(want, sizeof want, "%s%s", grad ? "grad:" : "", ri.name);
        size_t hit = n;
        for (size_t k = 0; k < n && hit == n; k++)
            if (!used[k] && ev[k].kind == MS_EV_RESHARD &&
                !strncmp(ev[k].u.reshard.tensor, want, MS_EV_NAME_MAX - 1) &&
                !strcmp(ev[k].u.reshard.from, from) && !strcmp(ev[k].u.reshard.to, to))
                hit = k;
        MT_CHECK(r, hit < n, "rank %d: planned reshard %s %s -> %s (%s) is not in the trace",
                 ctx->rank, want, from, to, ms_program_phase_name(ri.phase));
        if (hit == n) continue;
        used[hit] = true;
        const ms_ev_reshard *re = &ev[hit].u.reshard;
        MT_CHECK(r, (double)re->bytes == ri.coll_bytes, "%s: traced %llu bytes, planned %.0f", want,
                 (unsigned long long)re->bytes, ri.coll_bytes);
        /* Its collectives carry its flow id and move exactly its bytes. */
        uint64_t coll = 0;
        int ncoll = 0;
        for (size_t k = 0; k < n; k++)
            if (ev[k].kind == MS_EV_COLL && ev[k].u.coll.flow == re->flow) {
                coll += ev[k].u.coll.bytes;
                ncoll++;
            }
        if (sh->bucket_mb > 0 && ri.phase == MS_PROG_GRAD_SYNC && ncoll == 0) {
            bucketed += re->bytes;
            continue;
        }
        MT_CHECK(r, coll == re->bytes, "%s: its collectives moved %llu bytes, the reshard %llu",
                 want, (unsigned long long)coll, (unsigned long long)re->bytes);
        MT_CHECK(r, re->bytes == 0 || ncoll > 0, "%s: no collective linked to it", want);
    }
    if (sh->bucket_mb > 0) check_buckets(r, ev, n, bucketed);
    size_t extra = 0;
    for (size_t k = 0; k < n; k++) extra += ev[k].kind == MS_EV_RESHARD && !used[k];
    MT_CHECK(r, extra == 0, "rank %d: %zu traced reshards were not planned", ctx->rank, extra);
    /* Every kernel the program lists ran once, with the FLOPs and bytes the listing gives. */
    double flops = 0, bytes = 0, traced_flops = 0, traced_bytes = 0;
    int nk = ms_program_num_kernels(p), traced = 0;
    for (int i = 0; i < nk; i++) {
        ms_kernel_info ki;
        ms_program_kernel(p, i, &ki);
        flops += ki.flops;
        bytes += ki.bytes;
    }
    for (size_t k = 0; k < n; k++) {
        if (ev[k].kind != MS_EV_OP) continue;
        traced++;
        traced_flops += ev[k].u.op.flops;
        traced_bytes += ev[k].u.op.bytes;
    }
    MT_CHECK(r, traced == nk, "rank %d: %d kernels traced, %d in the program", ctx->rank, traced,
             nk);
    MT_CHECK(r, flops > 0 && traced_flops == flops && traced_bytes == bytes,
             "rank %d: traced %.0f FLOPs %.0f B, the program lists %.0f FLOPs %.0f B", ctx->rank,
             traced_flops, traced_bytes, flops, bytes);

    /* Rank 0 gathers every rank's events and writes a file that must validate. */
    ms_comm *gc;
    ms_comm_split(ctx->world, 0, ctx->rank, "gather", &gc, &err);
    uint64_t gcur = 0;
    ms_event *all = ctx->rank == 0 ? xmalloc(sizeof *all * CAP * 4) : NULL;
    size_t got = 0;
    MT_OK(r, ms_gather_events(gc, rec, &gcur, CAP, all, &got, 0, &err), &err);
    ms_group groups[64];
    int ng = 0;
    MT_OK(r, ms_gather_groups(gc, rec, groups, 64, &ng, &err), &err);
    if (ctx->rank == 0) {
        for (size_t k = 0; k < got; k++) sh->ranks_seen[all[k].rank] = 1;
        char path[] = "/tmp/meshscope-trace-XXXXXX.json";
        int fd = mkstemps(path, 5);
        if (fd >= 0) close(fd);
        ms_trace_meta meta = {.world_size = 4};
        MT_OK(r, ms_trace_write(path, all, got, groups, ng, &meta, &err), &err);
        ms_error ce = {0};
        ms_trace_check_info info;
        MT_CHECK(r, ms_trace_check(path, &info, &ce) == MS_OK, "trace file invalid: %s", ce.msg);
        remove(path);
    }
    free(all), free(ev), free(used);
    ms_comm_destroy(gc);
    ms_program_destroy(p);
    ms_model_free(&m);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    ms_record_into(ctx, NULL);
    ms_recorder_destroy(rec);
}

static void traced_step_as(float bucket_mb, bool gpu_hooks) {
    shared sh = {{0}, bucket_mb, gpu_hooks};
    mt_run(4, body, &sh);
    if (mt_world_rank() == 0)
        for (int r = 0; r < 4; r++)
            if (!sh.ranks_seen[r]) fail_msg("rank %d has no events in the gathered trace", r);
}

static void traced_step(void **state) {
    (void)state;
    traced_step_as(0, false);
}

/* The same step with the GPU correlation hooks set: each kernel's event carries its id. */
static void traced_step_correlated(void **state) {
    (void)state;
    traced_step_as(0, true);
}

/* The same step with gradient buckets of 256 bytes (several per layer). */
static void traced_step_buckets(void **state) {
    (void)state;
    traced_step_as(0.000244140625f, false);
}

/* --- a traced pipeline ------------------------------------------------------------------------ */

enum { PB = 8, PT = 8, PC = 16, PM = 4, PSTEPS = 2 };

static void pipe_body(mt_rank *r, void *arg) {
    (void)arg;
    ms_ctx *ctx = r->ctx;
    ms_error err = {0};
    const int world = ctx->world_size, R = world / 2;
    ms_recorder *rec;
    if (!MT_OK(r, ms_recorder_create(ctx->rank, CAP, &rec, &err), &err)) return;
    ms_record_into(ctx, rec);
    char json[128];
    snprintf(json, sizeof json, "{\"pp\": 2, \"dp\": %d, \"micro_batches\": %d}", R, PM);
    ms_strategy s;
    ms_placement_rules rules;
    MT_OK(r, ms_strategy_parse_json(json, strlen(json), "case", &s, &rules, &err), &err);
    static const char line[] = "In the beginning God created the heaven and the earth. ";
    uint8_t bytes[64 * (sizeof line - 1)];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)line[i % (sizeof line - 1)];
    ms_text_data d;
    MT_OK(r, ms_text_data_from_bytes("text", bytes, sizeof bytes, PT, 0.1, &d, &err), &err);
    ms_model_config cfg = {.model_type = MS_MODEL_GPT2,
                           .n_layer = 2,
                           .n_head = 2,
                           .n_embd = PC,
                           .vocab_size = 256,
                           .n_positions = 16,
                           .layer_norm_epsilon = 1e-5};
    ms_train_opts o = {.batch = PB,
                       .seq = PT,
                       .steps = PSTEPS,
                       .warmup = 1,
                       .seed = 5,
                       .lr = 1e-3,
                       .min_lr = 1e-4,
                       .clip = 1};
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create(ctx, &cfg, &s, &rules, &o, &d, &tr, &err), &err)) {
        ms_text_data_close(&d);
        ms_record_into(ctx, NULL);
        ms_recorder_destroy(rec);
        return;
    }
    for (int step = 0; step < PSTEPS; step++) {
        ms_recorder_set_step(rec, step);
        ms_step_result res;
        MT_OK(r, ms_trainer_step(tr, &res, &err), &err);
        ms_record_span(&ctx->trace, MS_EV_STEP, res.t_data_ns);
    }
    ms_recorder_set_step(rec, -1);
    double vl;
    MT_OK(r, ms_trainer_evaluate(tr, MS_SPLIT_VAL, 1, &vl, &err), &err);

    /* This rank's own events: one F and one B per micro-batch and step, on its stage (the
     * evaluation's forwards are not the schedule and are not recorded). */
    uint64_t cursor = 0;
    ms_event *ev = xmalloc(sizeof *ev * CAP);
    size_t n = ms_recorder_read(rec, &cursor, ev, CAP, NULL);
    int nf = 0, nb = 0;
    uint64_t p2p[2] = {0, 0}; /* sent, received */
    for (size_t k = 0; k < n; k++) {
        if (ev[k].kind == MS_EV_COLL && ev[k].u.coll.coll == MS_COLL_P2P && ev[k].step >= 0)
            p2p[ev[k].u.coll.recv] += ev[k].u.coll.bytes;
        if (ev[k].kind != MS_EV_PIPE) continue;
        const ms_ev_pipe *p = &ev[k].u.pipe;
        nf += p->action == MS_PIPE_F, nb += p->action == MS_PIPE_B;
        MT_CHECK(r,
                 p->stage == ctx->rank / R && p->stages == 2 && p->micro_batches == PM &&
                     p->virtual_stages == 1 && !strcmp(p->schedule, "1f1b") && ev[k].step >= 0 &&
                     ev[k].step < PSTEPS,
                 "rank %d: action %d mb %d stage %d of %d, step %lld, schedule %s", ctx->rank,
                 p->action, p->mb, p->stage, p->stages, (long long)ev[k].step, p->schedule);
        /* the thread's CPU time inside the action: some, and no more than its wall span
         * (read inside it; 0.1 ms for the clocks' different sources) */
        int64_t wall = ev[k].t1_ns - ev[k].t0_ns;
        MT_CHECK(r, p->cpu_ns > 0 && p->cpu_ns <= wall + 100000,
                 "rank %d: action %d mb %d: cpu %lld ns in a span of %lld ns", ctx->rank, p->action,
                 p->mb, (long long)p->cpu_ns, (long long)wall);
    }
    MT_CHECK(r, nf == PM * PSTEPS && nb == PM * PSTEPS, "rank %d: %d F and %d B recorded",
             ctx->rank, nf, nb);
    /* Each micro-batch's residual stream (its rows on this replica) crosses once per step:
     * forward from stage 0, its gradient back from stage 1, so every rank sends and receives
     * as many bytes, each side its own event. (The evaluation, at step -1, sends activations
     * too.) */
    uint64_t want = (uint64_t)PSTEPS * PM * (PB / (R * PM)) * PT * PC * sizeof(float);
    MT_CHECK(r, p2p[0] == want && p2p[1] == want,
             "rank %d: point-to-point sends moved %llu bytes and receives %llu, the schedule %llu",
             ctx->rank, (unsigned long long)p2p[0], (unsigned long long)p2p[1],
             (unsigned long long)want);

    ms_comm *gc;
    ms_comm_split(ctx->world, 0, ctx->rank, "gather", &gc, &err);
    uint64_t gcur = 0;
    ms_event *all = ctx->rank == 0 ? xmalloc(sizeof *all * CAP * (size_t)world) : NULL;
    size_t got = 0;
    MT_OK(r, ms_gather_events(gc, rec, &gcur, CAP, all, &got, 0, &err), &err);
    ms_group groups[64];
    int ng = 0;
    MT_OK(r, ms_gather_groups(gc, rec, groups, 64, &ng, &err), &err);
    if (ctx->rank == 0) {
        ms_analysis a;
        MT_OK(r, ms_analyze(all, got, groups, ng, 0, -1, &a, &err), &err);
        /* The stages' traffic is the band off the diagonal: r <-> r + R. */
        for (int q = 0; q < R && a.nranks == world; q++) {
            double fwd = a.all.bytes[(size_t)q * world + q + R];
            double bwd = a.all.bytes[(size_t)(q + R) * world + q];
            MT_CHECK(r, fwd >= (double)want && bwd >= (double)want,
                     "heatmap: rank %d -> %d %.0f bytes, back %.0f; the sends moved %llu each", q,
                     q + R, fwd, bwd, (unsigned long long)want);
        }
        MT_CHECK(r, a.nranks == world, "analysis of %d ranks, world %d", a.nranks, world);
        const ms_pipe_stats *ps = &a.pipe;
        MT_CHECK(r,
                 ps->stages == 2 && ps->micro_batches == PM && ps->n_steps == PSTEPS &&
                     ps->last_step == PSTEPS - 1 && !strcmp(ps->schedule, "1f1b"),
                 "pipeline stats: %d stages, m %d, %d steps (last %lld), %s", ps->stages,
                 ps->micro_batches, ps->n_steps, (long long)ps->last_step, ps->schedule);
        for (int q = 0; q < 2; q++)
            MT_CHECK(r,
                     ps->stage_ranks[q] == R && ps->stage_bubble[q] > 0 &&
                         ps->stage_bubble[q] < 1 && ps->last_stage_bubble[q] > 0 &&
                         ps->last_stage_bubble[q] < 1,
                     "stage %d: %d ranks, bubble %g (last step %g)", q, ps->stage_ranks[q],
                     ps->stage_bubble[q], ps->last_stage_bubble[q]);
        MT_CHECK(r, fabs(ps->formula - 1.0 / (PM + 1)) < 1e-12, "formula %g", ps->formula);

        /* The file: valid, and read back to the same events and the same analysis. */
        char path[] = "/tmp/meshscope-pipe-XXXXXX.json";
        int fd = mkstemps(path, 5);
        if (fd >= 0) close(fd);
        ms_trace_meta meta = {.world_size = world};
        MT_OK(r, ms_trace_write(path, all, got, groups, ng, &meta, &err), &err);
        ms_error ce = {0};
        MT_CHECK(r, ms_trace_check(path, NULL, &ce) == MS_OK, "trace file invalid: %s", ce.msg);
        ms_trace t;
        if (MT_OK(r, ms_trace_read(path, &t, &err), &err)) {
            size_t np = 0, same = 0;
            for (size_t k = 0; k < got; k++) np += all[k].kind == MS_EV_PIPE;
            for (size_t k = 0, j = 0; k < t.n_events; k++) {
                if (t.events[k].kind != MS_EV_PIPE) continue;
                while (j < got && all[j].kind != MS_EV_PIPE) j++;
                if (j < got && !memcmp(&t.events[k].u.pipe, &all[j].u.pipe, sizeof all[j].u.pipe) &&
                    t.events[k].t0_ns == all[j].t0_ns && t.events[k].t1_ns == all[j].t1_ns &&
                    t.events[k].rank == all[j].rank && t.events[k].step == all[j].step)
                    same++;
                j++;
            }
            MT_CHECK(r, np == (size_t)world * 2 * PM * PSTEPS && same == np,
                     "%zu pipeline events gathered, %zu read back the same", np, same);
            /* Both sides of every transfer come back, the receiving side marked as such, and
             * the heatmap counts each transfer once (from its sender). */
            size_t recv_ev = 0, recv_read = 0;
            for (size_t k = 0; k < got; k++)
                recv_ev += all[k].kind == MS_EV_COLL && all[k].u.coll.recv;
            for (size_t k = 0; k < t.n_events; k++)
                recv_read += t.events[k].kind == MS_EV_COLL && t.events[k].u.coll.recv;
            MT_CHECK(r, recv_ev > 0 && recv_read == recv_ev,
                     "%zu receiving sides recorded, %zu read back", recv_ev, recv_read);
            ms_analysis b;
            MT_OK(r, ms_analyze(t.events, t.n_events, t.groups, t.n_groups, 0, -1, &b, &err), &err);
            for (size_t cell = 0; cell < (size_t)world * world && b.nranks == world; cell++)
                MT_CHECK(r, b.all.bytes[cell] == a.all.bytes[cell],
                         "heatmap cell %zu: %.0f bytes from the file, %.0f from the events", cell,
                         b.all.bytes[cell], a.all.bytes[cell]);
            MT_CHECK(r, b.pipe.bubble == ps->bubble && b.pipe.last_bubble == ps->last_bubble,
                     "bubble from the file %g (last %g), from the events %g (%g)", b.pipe.bubble,
                     b.pipe.last_bubble, ps->bubble, ps->last_bubble);
            ms_analysis_free(&b);
            ms_trace_free(&t);
        }
        remove(path);
        ms_analysis_free(&a);
    }
    free(all), free(ev);
    ms_comm_destroy(gc);
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
    ms_record_into(ctx, NULL);
    ms_recorder_destroy(rec);
}

static void traced_pipeline(void **state) {
    (void)state;
    int world = mt_mpi_world();
    if (world && world % 2) skip();
    mt_run(2, pipe_body, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(traced_step), cmocka_unit_test(traced_step_correlated),
    cmocka_unit_test(traced_step_buckets), cmocka_unit_test(traced_pipeline)};
MT_MAIN("trace_engine", tests)

/* test_trace_engine.c - a traced dp2 x tp2 training step against what the engine planned.
 *
 * Every rank records one step of a small GPT. Then, on every rank: each reshard that the
 * compiled program (the `explain` listing) predicts appears in the trace exactly once per
 * step with the same tensor, placements and bytes; each reshard's flow id is carried by at
 * least one collective when it moves bytes; the collectives' bytes add up to the reshards'
 * bytes; every kernel the program lists is traced once, and the traced FLOPs and bytes add up
 * to the listed ones; and every rank's events are there. The written trace file passes the
 * validator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "profiler/record/gather.h"
#include "profiler/record/recorder.h"
#include "tests/testkit.h"
#include "traces/trace_check.h"
#include "traces/trace_write.h"

enum { B = 4, T = 8, CAP = 1 << 16 };

typedef struct shared {
    int ranks_seen[8];
} shared;

static void body(mt_rank *r, void *arg) {
    shared *sh = arg;
    ms_ctx *ctx = r->ctx;
    ms_error err = {0};
    ms_recorder *rec;
    if (!MT_OK(r, ms_recorder_create(ctx->rank, CAP, &rec, &err), &err)) return;
    ms_ctx_set_recorder(ctx, rec);
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
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sharding, .seed = 1};
    if (!MT_OK(r, ms_program_compile(m.g, dm, &co, &p, &err), &err)) return;
    float ids[B * T], pos[B * T];
    for (int i = 0; i < B * T; i++) ids[i] = (float)(i * 7 % 32), pos[i] = (float)(i % T);
    ms_program_feed(p, m.ids, ids, &err);
    ms_program_feed(p, m.targets, ids, &err);
    ms_program_feed(p, m.pos, pos, &err);
    ms_recorder_set_step(rec, 0);
    float loss;
    MT_OK(r, ms_program_step(p, &loss, &err), &err);
    ms_recorder_set_step(rec, -1);

    uint64_t cursor = 0;
    ms_event *ev = xmalloc(sizeof *ev * CAP);
    size_t n = ms_recorder_read(rec, &cursor, ev, CAP, NULL);
    int nres = ms_program_num_reshards(p);
    MT_CHECK(r, nres > 0, "dp2 x tp2 plans no reshards");
    bool *used = xcalloc(n + 1, 1);
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
        MT_CHECK(r, coll == re->bytes, "%s: its collectives moved %llu bytes, the reshard %llu",
                 want, (unsigned long long)coll, (unsigned long long)re->bytes);
        MT_CHECK(r, re->bytes == 0 || ncoll > 0, "%s: no collective linked to it", want);
    }
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
    ms_ctx_set_recorder(ctx, NULL);
    ms_recorder_destroy(rec);
}

static void traced_step(void **state) {
    (void)state;
    shared sh = {{0}};
    mt_run(4, body, &sh);
    if (mt_world_rank() == 0)
        for (int r = 0; r < 4; r++)
            if (!sh.ranks_seen[r]) fail_msg("rank %d has no events in the gathered trace", r);
}

static const struct CMUnitTest tests[] = {cmocka_unit_test(traced_step)};
MT_MAIN("trace_engine", tests)

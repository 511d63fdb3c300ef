/* cmd_demo.c - `meshscope demo`: distributed tensors at work on a 2-d mesh of ranks.
 *
 * Walks a weight through the placements a training step uses (replicated, data-parallel
 * sharded, tensor-parallel, partial sums), printing each reshard plan with its bytes and
 * measured time, checks every result against the global tensor, moves the tensor to
 * another mesh as a pipeline stage would, and measures all-reduce bandwidth. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_mpi.h"
#include "cli/commands.h"
#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/runtime/ctx.h"

#include "cli/options.h"

typedef struct demo_opts {
    int ranks;
    ms_backend_kind backend;
} demo_opts;

static void say(const ms_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const ms_ctx *ctx, const char *fmt, ...) {
    if (ctx->rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* Max |full(t) - reference| over the tensor; collective. */
static ms_status max_error(const ms_dtensor *t, const ms_tensor *ref, double *out, ms_error *err) {
    ms_tensor g;
    MS_CHECK(ms_dtensor_full(t, &g, err));
    double e = 0;
    for (int64_t i = 0; i < ms_tensor_numel(&g); i++)
        e = fmax(e, fabs((double)ms_tensor_f32(&g)[i] - ms_tensor_f32(ref)[i]));
    ms_tensor_release(&g);
    *out = e;
    return MS_OK;
}

static ms_status step_to(ms_dtensor *t, const char *target, const char *why, const ms_tensor *ref,
                         ms_error *err) {
    ms_ctx *ctx = t->mesh->ctx;
    ms_placements dst;
    MS_CHECK(ms_placements_parse(target, &dst, err));
    const ms_reshard_plan *plan;
    MS_CHECK(ms_plan_cache_get(ctx->plans, &t->mesh->mesh, &t->pl, &dst, t->ndim, t->gshape, &plan,
                               err));
    char a[96], b[96];
    say(ctx, "\n  %s -> %s   (%s)\n", ms_placements_str(&t->pl, a, sizeof a),
        ms_placements_str(&dst, b, sizeof b), why);
    if (ctx->rank == 0) ms_reshard_plan_print(plan, &t->mesh->mesh, stdout);
    ms_reshard_report rep;
    MS_CHECK(ms_reshard(t, &dst, &rep, err));
    double e;
    MS_CHECK(max_error(t, ref, &e, err));
    int64_t st[MS_MAX_DIMS], ln[MS_MAX_DIMS];
    ms_dtensor_box(t, st, ln);
    say(ctx,
        "    rank 0 now holds rows [%lld, %lld) x cols [%lld, %lld); moved %zu bytes in %.1f us;"
        " max |full - global| = %.1e %s\n",
        (long long)st[0], (long long)(st[0] + ln[0]), (long long)st[1], (long long)(st[1] + ln[1]),
        rep.coll_bytes, rep.ns / 1e3, e, e < 1e-5 ? "ok" : "MISMATCH");
    if (e >= 1e-5)
        return ms_fail(err, MS_ERR_INTERNAL, "reshard to %s does not match the global tensor",
                       target);
    return MS_OK;
}

static ms_status demo_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    (void)arg;
    ms_status st = MS_OK;
    int dp = ctx->world_size >= 4 ? 2 : 1, tp = ctx->world_size / dp;
    const int shape[2] = {dp, tp};
    const char *names[2] = {"dp", "tp"};
    ms_mesh mesh;
    MS_CHECK(ms_mesh_init(&mesh, 2, shape, names, NULL, err));
    ms_dmesh *dm = NULL;
    ms_tensor global = {0};
    ms_dtensor w = {0};
    MS_CHECK_GOTO(ms_dmesh_create(ctx, &mesh, &dm, err), st, out);
    char buf[256];
    say(ctx, "meshscope demo: %d ranks on the %s backend\n", ctx->world_size,
        ms_comm_backend(ctx->world));
    say(ctx, "mesh %s\n", ms_mesh_str(&mesh, buf, sizeof buf));

    /* A 6 x 10 weight: sizes that do not divide evenly over the mesh. */
    const int64_t g[2] = {6, 10};
    MS_CHECK_GOTO(ms_tensor_alloc(ctx->device, MS_F32, 2, g, &global, err), st, out);
    MS_CHECK_GOTO(ms_tensor_init_normal(&global, ctx->seed, 1, g, NULL, 0, 0.02f, err), st, out);
    ms_placements rep;
    ms_placements_parse("[R, R]", &rep, err);
    MS_CHECK_GOTO(ms_dtensor_shard(dm, &global, &rep, &w, err), st, out);
    say(ctx, "\nweight %s, Philox-initialised; every step below is checked against it\n",
        ms_shape_str(g, 2, buf, sizeof buf));

    struct {
        const char *to, *why;
    } walk[] = {
        {"[S(0), R]", "ZeRO-style: shard rows over dp, a local slice"},
        {"[S(0), S(1)]", "and columns over tp: column-parallel linear"},
        {"[S(1), S(0)]", "swap the sharded dims: two all-to-alls"},
        {"[R, S(1)]", "gather dp back"},
        {"[R, P(sum)]", "a row-parallel output before its all-reduce"},
        {"[R, S(0)]", "sequence parallel: reduce-scatter instead of all-reduce"},
        {"[S(0), S(0)]", "nested: rows over dp, then over tp"},
        {"[R, R]", "all-gather everything"},
    };
    for (size_t i = 0; i < sizeof walk / sizeof *walk; i++)
        MS_CHECK_GOTO(step_to(&w, walk[i].to, walk[i].why, &global, err), st, out);

    /* Pipeline-style move: from the dp=0 row of the mesh to the dp=1 row. */
    if (dp == 2) {
        ms_mesh s0, s1;
        ms_mesh_slice(&mesh, 0, 0, &s0, err);
        ms_mesh_slice(&mesh, 0, 1, &s1, err);
        ms_dmesh *d0 = NULL, *d1 = NULL;
        ms_dtensor a = {0}, b = {0};
        ms_placements pa, pb;
        ms_placements_parse("[S(0)]", &pa, err);
        ms_placements_parse("[S(1)]", &pb, err);
        st = ms_dmesh_create(ctx, &s0, &d0, err);
        if (st == MS_OK) st = ms_dmesh_create(ctx, &s1, &d1, err);
        if (st == MS_OK) st = ms_dtensor_shard(d0, &global, &pa, &a, err);
        ms_reshard_report r = {0};
        if (st == MS_OK) st = ms_reshard_cross_mesh(&a, d1, &pb, &b, &r, err);
        double e = 1;
        if (st == MS_OK) {
            /* Check on the target stage: gather there and compare. */
            ms_tensor full = {0};
            st = ms_dtensor_full(&b, &full, err);
            e = 0;
            if (st == MS_OK && ms_dmesh_is_member(d1))
                for (int64_t i = 0; i < 60; i++)
                    e = fmax(e, fabs((double)ms_tensor_f32(&full)[i] - ms_tensor_f32(&global)[i]));
            ms_tensor_release(&full);
        }
        char m0[96], m1[96];
        say(ctx, "\n  cross-mesh: stage %s [S(0)] -> stage %s [S(1)] with send/recv\n",
            ms_mesh_str(&s0, m0, sizeof m0), ms_mesh_str(&s1, m1, sizeof m1));
        if (st == MS_OK && ctx->rank == mesh.ranks[mesh.size / 2])
            printf("    checked on the target stage: max |full - global| = %.1e %s\n", e,
                   e < 1e-5 ? "ok" : "MISMATCH");
        ms_dtensor_release(&a), ms_dtensor_release(&b);
        ms_dmesh_destroy(d0), ms_dmesh_destroy(d1);
        ms_mesh_free(&s0), ms_mesh_free(&s1);
        if (st != MS_OK) goto out;
        MS_CHECK_GOTO(ms_barrier(ctx->world, err), st, out);
    }

    /* All-reduce bandwidth on the world. */
    {
        size_t n = (4u << 20) / sizeof(float);
        float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) x[i] = 1.0f;
        const int iters = 20;
        st = ms_all_reduce(ctx->world, x, y, n, MS_REDUCE_SUM, err);
        int64_t t0 = ms_now_ns();
        for (int i = 0; i < iters && st == MS_OK; i++)
            st = ms_all_reduce(ctx->world, x, y, n, MS_REDUCE_SUM, err);
        double sec = (ms_now_ns() - t0) / 1e9 / iters;
        double busbw = n * sizeof(float) / sec *
                       ms_coll_busbw_factor(MS_COLL_ALL_REDUCE, ctx->world_size) / 1e9;
        say(ctx, "\nall-reduce of 4 MiB over %d ranks: %.0f us, busbw %.1f GB/s; result %s\n",
            ctx->world_size, sec * 1e6, busbw, y[0] == (float)ctx->world_size ? "ok" : "WRONG");
        free(x), free(y);
        if (st != MS_OK) goto out;
    }
    say(ctx, "\nnext: `meshscope bench comm` compares these collectives with OpenMPI\n");
out:
    ms_dtensor_release(&w);
    ms_tensor_release(&global);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    return st;
}

/* Returns MS_OPTS_PROCEED, or the exit code after the help or an error. */
static int parse_opts(int argc, char **argv, demo_opts *o) {
    o->ranks = 4;
    int backend = ms_mpi_launched() ? MS_BACKEND_MPI : MS_BACKEND_THREADS;
    const ms_option opts[] = {
        MS_INT("ranks", "N", &o->ranks, 1, 64, "thread ranks (default 4; under mpirun: -np)"),
        MS_ENUM_BACKEND(&backend),
    };
    const ms_opts_cmd cmd = {
        .name = "demo",
        .synopsis = "[options]",
        .about = "Distributed tensors on a 2-d mesh of ranks: a weight walked through the "
                 "placements of a\ntraining step, each reshard plan with its bytes and time, "
                 "checked against the global\ntensor, then all-reduce bandwidth.",
        MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, NULL, 0, NULL);
    o->backend = (ms_backend_kind)backend;
    return rc;
}

int ms_cmd_demo(int argc, char **argv) {
    demo_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != MS_OPTS_PROCEED) return rc;
    ms_error err = {0};
    if (o.backend == MS_BACKEND_MPI && ms_mpi_init(&argc, &argv, &err) != MS_OK) {
        fprintf(stderr, "meshscope demo: %s\n", err.msg);
        return 1;
    }
    ms_launch_opts lo = {
        .backend = o.backend, .nranks = o.backend == MS_BACKEND_MPI ? 0 : o.ranks, .seed = 2024};
    ms_status st = ms_launch(&lo, demo_rank, NULL, &err);
    if (o.backend == MS_BACKEND_MPI) ms_mpi_finalize();
    if (st != MS_OK) {
        fprintf(stderr, "meshscope demo: %s\n", err.msg);
        return 1;
    }
    return 0;
}

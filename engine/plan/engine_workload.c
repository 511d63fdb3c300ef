/* engine_workload.c - the workload of a strategy this engine runs, read off the engine itself.
 *
 * The model is built and compiled exactly as `meshscope train` does (model/gpt.c,
 * model/strategy.c, graph/program.c), for the rank at mesh coordinate 0 (it holds the largest
 * shard under the balanced split), on a mesh without communicators: compilation is pure and
 * never communicates. Then:
 *
 *   placements   every value's completed placement comes from the program's own explanation
 *                (ms_program_explain); the placement each operator actually ran in follows
 *                from the reshards the program inserted, in instruction order: the compiler
 *                emits, per node, the reshards of its inputs, the kernel, then the reshards of
 *                its outputs, so walking the nodes alongside the forward reshards recovers the
 *                required input and raw output placements
 *   kernels      each node's local shapes go through its op's cost function (the one the
 *                profiler stamps on every kernel event), forward and, where autograd emits it,
 *                backward; the sum equals ms_program_stats' FLOPs (tests/test_plan.c)
 *   collectives  every reshard the program runs, planned by the reshard planner: kind, mesh
 *                dim and bytes per step; plus the vocab-parallel cross-entropy's three
 *                all-reduces and the training loop's gradient-norm all-reduce
 *   memory       the program's arena and persistent buffers, plus AdamW's two moments
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/dist/dmesh.h"
#include "engine/dist/reshard.h"
#include "engine/graph/graph_impl.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "engine/plan/workload.h"

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

static void local(const ms_mesh *mesh, const ms_shape *g, const ms_placements *pl, ms_shape *out) {
    int coords[MS_MESH_MAX_DIMS] = {0};
    int64_t start[MS_MAX_DIMS];
    out->ndim = g->ndim;
    ms_local_box(pl, mesh, coords, g->ndim, g->d, start, out->d);
}

/* Every value's placement from the program's explanation ("values (...):" section). */
static ms_status read_placements(ms_program *prog, const ms_graph *g, ms_placements *pl, bool *have,
                                 ms_error *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return ms_fail(err, MS_ERR_NOMEM, "planner: cannot capture the program's placements");
    ms_program_explain(prog, f);
    fclose(f);
    ms_status st = MS_OK;
    bool in_values = false;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (!strncmp(line, "values", 6)) {
            in_values = true;
            continue;
        }
        if (!in_values) continue;
        if (!*line) break;
        char *p = line;
        while (*p == ' ') p++;
        if (!strncmp(p, "param ", 6) || !strncmp(p, "input ", 6)) p += 6;
        while (*p == ' ') p++;
        char *name = p;
        while (*p && *p != ' ') p++;
        if (*p) *p++ = '\0';
        char *shape = strchr(p, '[');
        char *shape_end = shape ? strchr(shape, ']') : NULL;
        char *pls = shape_end ? strchr(shape_end, '[') : NULL;
        char *pls_end = pls ? strchr(pls, ']') : NULL;
        int v = ms_graph_find(g, name);
        if (v < 0 || !pls_end) {
            st = ms_fail(err, MS_ERR_INTERNAL,
                         "planner: cannot read the placement of '%s' from the program", name);
            break;
        }
        pls_end[1] = '\0';
        if (ms_placements_parse(pls, &pl[v], err) != MS_OK) {
            st = ms_fail_wrap(err, MS_ERR_INTERNAL, "planner: placement of '%s'", name);
            break;
        }
        have[v] = true;
    }
    free(text);
    return st;
}

static ms_oprate rate_of(int op) {
    switch (op) {
        case MS_OP_LAYERNORM:
            return MS_OPRATE_LAYERNORM;
        case MS_OP_GELU:
            return MS_OPRATE_GELU;
        case MS_OP_BIAS:
            return MS_OPRATE_BIAS;
        case MS_OP_SOFTMAX:
            return MS_OPRATE_SOFTMAX;
        case MS_OP_XENT:
            return MS_OPRATE_XENT;
        case MS_OP_EMBEDDING:
            return MS_OPRATE_EMBEDDING;
        case MS_OP_DROPOUT:
            return MS_OPRATE_DROPOUT;
        default:
            return MS_OPRATE_STREAM;
    }
}

static ms_plan_dim dim_of(const ms_mesh *mesh, int m) {
    const char *n = mesh->names[m];
    return !strcmp(n, "tp") ? MS_PLAN_TP : !strcmp(n, "cp") ? MS_PLAN_CP : MS_PLAN_DP;
}

typedef struct walk {
    const ms_plan_problem *pb;
    ms_program *prog;
    const ms_graph *g;
    const ms_mesh *mesh;
    ms_placements *pl; /* stored placements by value */
    bool *req_grad;    /* by value */
    int next_reshard, n_reshards;
    ms_plan_workload *w;
    ms_plan_engine_stats *st;
} walk;

/* The next forward reshard if it moves value v from `from`; consumes it and returns its target. */
static bool take_reshard(walk *k, int v, const ms_placements *from, ms_placements *to,
                         bool output) {
    if (k->next_reshard >= k->n_reshards) return false;
    ms_reshard_info ri;
    if (ms_program_reshard(k->prog, k->next_reshard, &ri) != MS_OK) return false;
    if (strcmp(ri.phase, "forward") || strcmp(ri.value, k->g->v[v].name)) return false;
    if (!output && !ms_placements_eq(&ri.from, from)) return false;
    if (output && !ms_placements_eq(&ri.to, from)) return false;
    *to = output ? ri.from : ri.to;
    k->next_reshard++;
    return true;
}

static void add_node(walk *k, int node) {
    const gnode *nd = &k->g->n[node];
    const ms_op_def *def = ms_op_get(nd->op);
    ms_placements req[MS_OP_MAX_IN], raw[MS_OP_MAX_OUT];
    for (int i = 0; i < nd->n_in; i++)
        if (!take_reshard(k, nd->in[i], &k->pl[nd->in[i]], &req[i], false))
            req[i] = k->pl[nd->in[i]];
    for (int o = 0; o < nd->n_out; o++)
        if (!take_reshard(k, nd->out[o], &k->pl[nd->out[o]], &raw[o], true))
            raw[o] = k->pl[nd->out[o]];
    /* the kernel's view: local shapes of its inputs as required, outputs as produced */
    ms_op_call call;
    memset(&call, 0, sizeof call);
    ms_tensor tin[MS_OP_MAX_IN], tout[MS_OP_MAX_OUT];
    ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT], lin[MS_OP_MAX_IN];
    call.attrs = &nd->attrs;
    call.n_in = nd->n_in;
    call.n_out = nd->n_out;
    call.in_pl = req;
    call.out_pl = raw;
    bool rg = false, bwd = false;
    for (int i = 0; i < nd->n_in; i++) {
        gin[i] = k->g->v[nd->in[i]].shape;
        local(k->mesh, &gin[i], &req[i], &lin[i]);
        memset(&tin[i], 0, sizeof tin[i]);
        tin[i].ndim = lin[i].ndim;
        memcpy(tin[i].shape, lin[i].d, sizeof(int64_t) * (size_t)lin[i].ndim);
        call.in[i] = &tin[i];
        rg |= k->req_grad[nd->in[i]];
        bwd |= k->req_grad[nd->in[i]] && (def->grad_inputs >> i & 1);
    }
    for (int o = 0; o < nd->n_out; o++) {
        ms_shape lo;
        gout[o] = k->g->v[nd->out[o]].shape;
        local(k->mesh, &gout[o], &raw[o], &lo);
        memset(&tout[o], 0, sizeof tout[o]);
        tout[o].ndim = lo.ndim;
        memcpy(tout[o].shape, lo.d, sizeof(int64_t) * (size_t)lo.ndim);
        call.out[o] = &tout[o];
        k->req_grad[nd->out[o]] = rg;
    }
    call.gin = gin;
    call.gout = gout;
    if (!def->cost) return;
    ms_plan_class cls = nd->op == MS_OP_MATMUL      ? MS_PC_GEMM
                        : nd->op == MS_OP_ATTENTION ? MS_PC_ATTENTION
                                                    : MS_PC_ELEMENTWISE;
    int64_t m = 0, n = 0, kk = 0;
    if (nd->op == MS_OP_MATMUL) {
        const ms_tensor *A = &tin[0], *B = &tin[1];
        kk = A->shape[A->ndim - 1];
        int64_t na = 1, nb = 1;
        for (int d = 0; d < A->ndim; d++) na *= A->shape[d];
        for (int d = 0; d < B->ndim; d++) nb *= B->shape[d];
        m = kk ? na / kk : 0;
        n = kk ? nb / kk : 0;
    } else if (nd->op == MS_OP_ATTENTION) {
        int64_t hs = gin[0].d[3] / nd->attrs.i[0];
        m = tin[0].shape[0] * (hs ? tin[0].shape[3] / hs : 0); /* batch x local heads */
        n = tin[0].shape[1];
        kk = hs;
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !bwd) break;
        ms_k_cost c = def->cost(&call, pass == 1);
        wk_kernel_add(k->w, cls, rate_of(nd->op), pass ? WK_BWD : WK_FWD, nd->op, m, n, kk, c.flops,
                      c.bytes, 1);
        if (k->st) {
            k->st->flops += c.flops;
            if (nd->op < 32) k->st->op_flops[nd->op] += c.flops;
        }
    }
    /* gradient buffers this node's backward writes (zeroed every step) */
    for (int i = 0; bwd && i < nd->n_in; i++)
        if (k->req_grad[nd->in[i]] && (def->grad_inputs >> i & 1))
            k->w->zero_bytes += 4.0 * (double)numel(&lin[i]);
    /* the vocab-parallel cross-entropy all-reduces inside the kernel */
    if (nd->op == MS_OP_XENT) {
        int vdim = gin[0].ndim - 1;
        double rows = (double)numel(&lin[1]);
        for (int mm = 0; mm < req[0].n; mm++)
            if (req[0].p[mm].kind == MS_PL_SHARD && req[0].p[mm].dim == vdim)
                wk_coll_add(k->w, MS_COLL_ALL_REDUCE, dim_of(k->mesh, mm), WK_IN_MB,
                            k->mesh->shape[mm], 4 * rows, 3);
    }
}

static ms_status add_reshards(walk *k, ms_error *err) {
    for (int i = 0; i < k->n_reshards; i++) {
        ms_reshard_info ri;
        MS_CHECK(ms_program_reshard(k->prog, i, &ri));
        int v = ms_graph_find(k->g, ri.value);
        if (v < 0)
            return ms_fail(err, MS_ERR_INTERNAL, "planner: reshard of unknown value '%s'",
                           ri.value);
        const ms_shape *sh = &k->g->v[v].shape;
        ms_reshard_plan plan;
        MS_CHECK(ms_reshard_plan_make(k->mesh, &ri.from, &ri.to, sh->ndim, sh->d, &plan, err));
        bool grad = !strcmp(ri.phase, "grad sync");
        for (int s = 0; s < plan.nsteps; s++) {
            const ms_rstep *rs = &plan.steps[s];
            ms_coll_kind kind;
            switch (rs->kind) {
                case MS_RSTEP_ALL_REDUCE:
                    kind = MS_COLL_ALL_REDUCE;
                    break;
                case MS_RSTEP_REDUCE_SCATTER:
                    kind = MS_COLL_REDUCE_SCATTER;
                    break;
                case MS_RSTEP_ALL_GATHER:
                    kind = MS_COLL_ALL_GATHER;
                    break;
                case MS_RSTEP_ALL_TO_ALL:
                    kind = MS_COLL_ALL_TO_ALL;
                    break;
                default:
                    continue; /* local slices and partial markers move nothing */
            }
            wk_coll_add(k->w, kind, dim_of(k->mesh, rs->mesh_dim), grad ? WK_GRAD : WK_IN_MB,
                        k->mesh->shape[rs->mesh_dim], rs->coll_bytes, 1);
            if (k->st) k->st->reshard_bytes += rs->coll_bytes;
        }
        if (k->st) k->st->n_reshards++;
    }
    return MS_OK;
}

ms_status wk_from_engine(const ms_plan_problem *pb, const ms_plan_strategy *s, ms_plan_workload *w,
                         ms_plan_engine_stats *stats, ms_error *err) {
    wk_reset(w);
    w->from_engine = true;
    w->layers_per_stage = pb->model.n_layer;
    if (stats) memset(stats, 0, sizeof *stats);
    ms_strategy strat;
    MS_CHECK(ms_strategy_init(&strat, s->dp, s->tp, s->cp, s->sp, err));
    ms_mesh mesh = {0};
    MS_CHECK(ms_strategy_mesh(&strat, &mesh, err));
    ms_model model = {0};
    ms_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ms_dmesh dm;
    memset(&dm, 0, sizeof dm);
    ms_program *prog = NULL;
    ms_placements *pl = NULL;
    bool *have = NULL, *rg = NULL;
    ms_status st;
    MS_CHECK_GOTO(ms_model_build(&pb->model, pb->global_batch, pb->seq, &model, err), st, out);
    ctx.world_size = mesh.size;
    ctx.plans = ms_plan_cache_create();
    MS_CHECK_GOTO(ms_mesh_copy(&dm.mesh, &mesh, err), st, out);
    dm.ctx = &ctx;
    dm.index = 0; /* coordinates 0: the largest shard */
    /* Values do not matter here, only shapes and placements: constant initialisation spares
     * the compiler drawing millions of normals (it was 3/4 of the planning time). */
    for (int v = 0; v < model.g->nv; v++)
        if (model.g->v[v].kind == GV_PARAM) model.g->v[v].init = (ms_init){MS_INIT_CONST, 0.0f};
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &strat, .seed = 1};
    MS_CHECK_GOTO(ms_program_compile(model.g, &dm, &co, &prog, err), st, out);
    const ms_graph *g = model.g;
    pl = calloc((size_t)g->nv, sizeof *pl);
    have = calloc((size_t)g->nv, sizeof *have);
    rg = calloc((size_t)g->nv, sizeof *rg);
    if (!pl || !have || !rg) {
        st = ms_fail(err, MS_ERR_NOMEM, "planner: out of memory");
        goto out;
    }
    MS_CHECK_GOTO(read_placements(prog, g, pl, have, err), st, out);
    for (int v = 0; v < g->nv; v++) {
        if (!have[v]) {
            st = ms_fail(err, MS_ERR_INTERNAL, "planner: no placement for '%s'", g->v[v].name);
            goto out;
        }
        rg[v] = g->v[v].kind == GV_PARAM;
    }
    walk k = {.pb = pb,
              .prog = prog,
              .g = g,
              .mesh = &dm.mesh,
              .pl = pl,
              .req_grad = rg,
              .n_reshards = ms_program_num_reshards(prog),
              .w = w,
              .st = stats};
    for (int node = 0; node < g->nn; node++) add_node(&k, node);
    MS_CHECK_GOTO(add_reshards(&k, err), st, out);
    /* the training loop: gradient norm over the world, AdamW on every local shard */
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_WORLD, WK_STEP, mesh.size, 8, 1);
    double local_params = 0;
    for (int i = 0; i < ms_program_num_params(prog); i++) {
        ms_param_view pv;
        ms_program_param(prog, i, &pv);
        local_params += (double)ms_tensor_numel(&pv.data);
    }
    ms_program_stats ps;
    ms_program_stats_get(prog, &ps);
    w->opt_elems = w->norm_elems = local_params;
    w->zero_bytes += 4 * local_params;
    w->mem_params = 4 * local_params;
    w->mem_grads = 4 * local_params;
    w->mem_optim = 8 * local_params;
    w->mem_act = (double)ps.arena_bytes;
    w->mem_other = (double)ps.param_bytes - 8 * local_params; /* inputs and kept values */
    if (w->mem_other < 0) w->mem_other = 0;
    w->hw_flops_step = ps.flops * mesh.size;
    if (stats) {
        stats->local_params = local_params;
        stats->arena_bytes = (double)ps.arena_bytes;
        stats->persist_bytes = (double)ps.param_bytes;
    }
    st = MS_OK;
out:
    free(pl);
    free(have);
    free(rg);
    ms_program_destroy(prog);
    ms_model_free(&model);
    ms_mesh_free(&dm.mesh);
    if (ctx.plans) ms_plan_cache_destroy(ctx.plans);
    ms_mesh_free(&mesh);
    return st;
}

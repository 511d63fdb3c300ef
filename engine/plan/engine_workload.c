/* engine_workload.c - the workload of a strategy this engine runs, read off the engine itself.
 *
 * The model is built exactly as `meshscope train` builds it (model/gpt.c, model/strategy.c)
 * and compiled from shapes alone (graph/program.h) for the rank at mesh coordinate 0, which
 * holds the largest shard under the balanced split (over cp the last rank, the busiest under a
 * causal mask): the same completion, autograd and partition as a training run, without
 * communicators or memory. Then, from the program:
 *
 *   kernels      every forward and backward kernel with the op's cost for its local shapes
 *                (the figures the profiler stamps on every kernel event), and the forward
 *                kernels activation recompute runs again in the backward; their sum is
 *                ms_program_stats' FLOPs (tests/test_plan.c)
 *   collectives  every reshard's plan: kind, mesh dim and bytes per step; plus the
 *                vocab-parallel cross-entropy's three all-reduces and the training loop's
 *                gradient-norm all-reduce
 *   memory       the program's arena and persistent buffers, plus AdamW's two moments (the
 *                arena is recompute's saving: the recompiled program's, not a closed form)
 *
 * A program's own model (ms_plan_problem.def without `lm`) goes the same way: its chunks come
 * from ms_pp_chunk_model_def, placed by its shard hook, and the parameter the first and last
 * chunk share (def->tied) has its gradient all-reduced between them as the tied embedding.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "engine/pipeline/schedule.h"
#include "engine/plan/workload.h"
#include "engine/pipeline/chunks.h"

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

/* The measured rate a kernel runs at (cpu-local): its own op's, or for a fused op the one of
 * the step that bounds it (GELU; dropout's Philox, when it drops). */
static ms_oprate rate_of(const ms_kernel_info *kn) {
    switch (kn->op) {
        case MS_OP_LAYERNORM:
        case MS_OP_RMSNORM:
        case MS_OP_GROUP_NORM: /* the same two passes over each row */
            return MS_OPRATE_LAYERNORM;
        case MS_OP_GELU:
        case MS_OP_BIAS_GELU:
            return MS_OPRATE_GELU;
        case MS_OP_BIAS_DROPOUT_ADD:
            return kn->attrs && kn->attrs->f[0] > 0 ? MS_OPRATE_DROPOUT : MS_OPRATE_STREAM;
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

/* A convolution runs as GEMMs (conv.c: im2col and sgemm per image and group, or direct kernels
 * that match them): `calls` GEMMs of [ohw, cin_g kh kw] x [cin_g kh kw, cout_g], from the
 * forward kernel's shapes (x [N, Cin, ...], w [Cout, Cin / groups, ...], y [N, Cout, ...]). */
static bool conv_gemm(const ms_kernel_info *fwd, int64_t *m, int64_t *n, int64_t *k,
                      int64_t *calls) {
    if (fwd->op != MS_OP_CONV2D && fwd->op != MS_OP_CONV1D) return false;
    const ms_shape *x = &fwd->in_local[0], *wt = &fwd->in_local[1], *y = &fwd->out_local[0];
    if (x->ndim < 3 || wt->ndim != x->ndim || y->ndim != x->ndim || wt->d[1] <= 0) return false;
    int64_t groups = x->d[1] / wt->d[1], ohw = 1, taps = wt->d[1];
    for (int d = 2; d < y->ndim; d++) ohw *= y->d[d], taps *= wt->d[d];
    if (groups <= 0 || wt->d[0] % groups) return false;
    *m = ohw, *n = wt->d[0] / groups, *k = taps, *calls = x->d[0] * groups;
    return *calls > 0;
}

/* One kernel (forward or backward) of the program into the workload; fwd: its forward kernel
 * (the shapes a convolution's GEMMs take); grad_bytes: bytes per element of an activation's
 * gradient (2 in a bf16 program). */
static void add_kernel(ms_plan_workload *w, ms_plan_engine_stats *st, const ms_graph *g,
                       const ms_kernel_info *kn, const ms_kernel_info *fwd, double grad_bytes) {
    bool gqa = kn->op == MS_OP_GQA_ATTENTION;
    ms_plan_class cls = kn->op == MS_OP_MATMUL || kn->op == MS_OP_LINEAR ? MS_PC_GEMM
                        : kn->op == MS_OP_ATTENTION || gqa               ? MS_PC_ATTENTION
                                                                         : MS_PC_ELEMENTWISE;
    int64_t m = 0, n = 0, kk = 0, calls = 1;
    if (conv_gemm(fwd, &m, &n, &kk, &calls)) {
        cls = MS_PC_GEMM;
    } else if (kn->op == MS_OP_LINEAR) {
        /* x [..., K...] W [N..., K...] over the attribute's K dims (default 1) */
        const ms_shape *A = &kn->in_local[0], *B = &kn->in_local[1];
        int kd = kn->attrs && kn->attrs->i[0] > 0 ? kn->attrs->i[0] : 1;
        kk = 1;
        for (int d = A->ndim - kd; d < A->ndim; d++) kk *= A->d[d];
        m = kk ? numel(A) / kk : 0;
        n = kk ? numel(B) / kk : 0;
    } else if (gqa) { /* q [B, Tq, H, D] against k [B, Tk, Hkv, D]: n keys, m x n query rows */
        const ms_shape *q = &kn->in_local[0], *k = &kn->in_local[1];
        n = k->d[1], kk = q->d[3];
        m = n ? q->d[0] * q->d[2] * q->d[1] / n : 0;
    } else if (kn->op == MS_OP_MATMUL) {
        const ms_shape *A = &kn->in_local[0], *B = &kn->in_local[1];
        kk = A->d[A->ndim - 1];
        m = kk ? numel(A) / kk : 0;
        n = kk ? numel(B) / kk : 0;
    } else if (kn->op == MS_OP_ATTENTION) {
        const ms_shape *qkv = &kn->in_local[0];
        int64_t hs = ms_graph_value_shape(g, kn->in[0])->d[3] / kn->attrs->i[0];
        m = qkv->d[0] * (hs ? qkv->d[3] / hs : 0); /* batch x local heads */
        n = qkv->d[1];
        kk = hs;
    }
    bool bwd = kn->phase == MS_PROG_BACKWARD;
    wk_phase ph = bwd ? WK_BWD : kn->phase == MS_PROG_RECOMPUTE ? WK_RECOMPUTE : WK_FWD;
    wk_kernel_add(w, cls, rate_of(kn), ph, kn->op, m, n, kk, kn->flops / (double)calls,
                  kn->bytes / (double)calls, (double)calls);
    if (st) {
        st->flops += kn->flops;
        if (kn->op < 32) st->op_flops[kn->op] += kn->flops;
    }
    /* gradient buffers the backward adds into (zeroed every step; not those it writes whole) */
    for (int i = 0; bwd && i < kn->n_in; i++)
        if (kn->grad_in[i] && !kn->fresh_in[i])
            w->zero_bytes += grad_bytes * (double)numel(&kn->in_local[i]);
}

/* The vocab-parallel cross-entropy all-reduces inside its forward kernel. */
static void add_xent(ms_plan_workload *w, const ms_mesh *mesh, const ms_kernel_info *kn) {
    int vdim = kn->in_local[0].ndim - 1;
    double rows = (double)numel(&kn->in_local[1]);
    for (int mm = 0; mm < kn->in_pl[0].n; mm++)
        if (kn->in_pl[0].p[mm].kind == MS_PL_SHARD && kn->in_pl[0].p[mm].dim == vdim)
            wk_coll_add(w, MS_COLL_ALL_REDUCE, dim_of(mesh, mm), WK_IN_MB, mesh->shape[mm],
                        4 * rows, 3);
}

/* Kernels node by node, each forward followed by its backward (the order the workload's
 * entries have always had, which merging and folding in wk_kernel_add depend on). */
static void add_kernels(ms_plan_workload *w, ms_plan_engine_stats *st, const ms_graph *g,
                        const ms_mesh *mesh, const ms_program *prog, double grad_bytes) {
    int nk = ms_program_num_kernels(prog);
    int *bwd_of = xmalloc(sizeof(int) * (size_t)(nk + 1)); /* by node: its backward kernel */
    for (int i = 0; i < nk; i++) bwd_of[i] = -1;
    ms_kernel_info kn;
    for (int i = 0; i < nk; i++)
        if (ms_program_kernel(prog, i, &kn) == MS_OK && kn.phase == MS_PROG_BACKWARD &&
            kn.node < nk)
            bwd_of[kn.node] = i;
    for (int i = 0; i < nk; i++) {
        if (ms_program_kernel(prog, i, &kn) != MS_OK || kn.phase != MS_PROG_FORWARD) continue;
        if (!ms_op_get(kn.op)->cost) continue; /* a user op without one: not priced */
        add_kernel(w, st, g, &kn, &kn, grad_bytes);
        int b = bwd_of[kn.node];
        if (b >= 0) {
            ms_kernel_info bk;
            ms_program_kernel(prog, b, &bk);
            add_kernel(w, st, g, &bk, &kn, grad_bytes);
        }
        if (kn.op == MS_OP_XENT) add_xent(w, mesh, &kn);
    }
    free(bwd_of);
    /* activation recompute: the forward kernels the backward runs again */
    for (int i = 0; i < nk; i++)
        if (ms_program_kernel(prog, i, &kn) == MS_OK && kn.phase == MS_PROG_RECOMPUTE &&
            ms_op_get(kn.op)->cost)
            add_kernel(w, st, g, &kn, &kn, grad_bytes);
}

/* A gradient bucket: its members' one collective (buckets never mix dims or kinds). */
typedef struct bucket_call {
    ms_coll_kind kind;
    int dim, group;
    double bytes;
} bucket_call;

static ms_status add_reshards(ms_plan_workload *w, ms_plan_engine_stats *st, const ms_mesh *mesh,
                              const ms_program *prog, ms_error *err) {
    const int nr = ms_program_num_reshards(prog);
    bucket_call *buckets = xcalloc((size_t)nr + 1, sizeof *buckets);
    int nb = 0;
    for (int i = 0; i < nr; i++) {
        ms_reshard_info ri;
        if (ms_program_reshard(prog, i, &ri) != MS_OK) {
            free(buckets);
            return ms_fail(err, MS_ERR_INTERNAL, "planner: reshard %d of the program has no plan",
                           i);
        }
        /* once per step: the gradient sync, and ZeRO 1 and 2's gather after the optimizer */
        bool grad = ri.phase == MS_PROG_GRAD_SYNC || ri.phase == MS_PROG_PARAM_SYNC;
        for (int s = 0; s < ri.plan->nsteps; s++) {
            const ms_rstep *rs = &ri.plan->steps[s];
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
            if (st) st->reshard_bytes += rs->coll_bytes;
            if (ri.bucket >= 0 && ri.bucket < nr) { /* one step: the bucket's reduction */
                bucket_call *b = &buckets[ri.bucket];
                *b = (bucket_call){kind, dim_of(mesh, rs->mesh_dim), mesh->shape[rs->mesh_dim],
                                   b->bytes + rs->coll_bytes};
                nb = ri.bucket + 1 > nb ? ri.bucket + 1 : nb;
                continue;
            }
            wk_coll_add(w, kind, dim_of(mesh, rs->mesh_dim), grad ? WK_GRAD : WK_IN_MB,
                        mesh->shape[rs->mesh_dim], rs->coll_bytes, 1);
        }
        if (st) st->n_reshards++;
    }
    for (int b = 0; b < nb; b++)
        if (buckets[b].bytes > 0)
            wk_coll_add(w, buckets[b].kind, (ms_plan_dim)buckets[b].dim, WK_GRAD, buckets[b].group,
                        buckets[b].bytes, 1);
    free(buckets);
    return MS_OK;
}

/* Chunk k's blocks: the def's split for a program's own model, the config's otherwise. */
static void chunk_layers(const ms_plan_problem *pb, const ms_strategy *s, int k, int *lo, int *hi) {
    const ms_model_def *d = ms_plan_user_def(pb);
    if (d)
        ms_pp_chunk_layers_def(d, s, k, lo, hi);
    else
        ms_pp_chunk_layers(&pb->model, s, k, lo, hi);
}

/* The pipeline stage the step waits for: the one with the most layers, the last on a tie (it
 * also computes the head and the loss). */
static int busiest_stage(const ms_plan_problem *pb, const ms_strategy *s) {
    int p = s->pp > 1 ? s->pp : 1, v = s->virtual_stages > 1 ? s->virtual_stages : 1;
    int best = 0, most = -1;
    for (int q = 0; q < p; q++) {
        int layers = 0;
        for (int c = 0; c < v; c++) {
            int lo, hi;
            chunk_layers(pb, s, c * p + q, &lo, &hi);
            layers += hi - lo;
        }
        if (layers >= most) most = layers, best = q;
    }
    return best;
}

/* One chunk of the busiest stage, compiled from shapes for one micro-batch: its kernels and
 * reshards into w, its state's elements into state (parameters as stored, gradients, the
 * optimizer's shards: ZeRO divides them over dp by stage; bf16 use-copy and gradient bytes; a
 * program's own model's tied parameter on one tp rank), its micro-batch arena into *arena
 * and the scratch it shares with the stage's other micro-batches (inflight of them held at
 * once) into *scratch. */
static ms_status add_chunk(const ms_plan_problem *pb, const ms_strategy *s, const ms_mesh *mesh,
                           int rows, int k, int inflight, ms_plan_workload *w,
                           ms_plan_engine_stats *stats, double state[6], double *arena,
                           double *scratch, double *staging, double *persist, double *boundary,
                           ms_error *err) {
    ms_model model = {0};
    ms_program *prog = NULL;
    ms_status st;
    const ms_model_def *d = ms_plan_user_def(pb);
    if (d)
        MS_CHECK_GOTO(ms_pp_chunk_model_def(d, s, rows, k, &model, err), st, out);
    else
        MS_CHECK_GOTO(ms_pp_chunk_model(&pb->model, s, rows, pb->seq, k, &model, err), st, out);
    int m = 0, size = 0;
    ms_strategy_micro(s, pb->global_batch, &size, &m);
    ms_sharding sh = {
        .s = s, .rules = pb->rules, .kv_heads = d ? 0 : pb->model.n_kv_head, .def = d};
    ms_compile_opts co = ms_strategy_compile_opts(s, &sh);
    co.micro_batched = m > 1 || s->pp > 1;
    co.inflight = inflight;
    co.plans = pb->memo ? ms_plan_memo_plans(pb->memo) : NULL;
    /* a GPU's bf16 kernels leave most instructions unstaged */
    co.kernels_like = pb->cluster && !pb->cluster->cpu ? MS_DEVICE_CUDA : MS_DEVICE_CPU;
    /* the rank at coordinate 0 holds the largest shards; over cp, the last rank: its queries
     * see the longest causal prefix (LLaMA's GQA keeps queries on the sequence shard), and
     * every cp shard is alike otherwise */
    int coords[3] = {0, 0, s->cp - 1};
    MS_CHECK_GOTO(
        ms_program_compile_shapes(model.g, mesh, s->cp > 1 ? coords : NULL, &co, &prog, err), st,
        out);
    add_kernels(w, stats, model.g, mesh, prog, co.bf16 ? 2.0 : 4.0);
    MS_CHECK_GOTO(add_reshards(w, stats, mesh, prog, err), st, out);
    for (int i = 0; i < ms_program_num_params(prog); i++) {
        ms_param_view pv;
        ms_program_param(prog, i, &pv);
        state[0] += (double)ms_tensor_numel(&pv.data);
        state[1] += (double)ms_tensor_numel(&pv.grad);
        state[2] += (double)pv.opt_n;
        state[3] += (double)pv.use_bytes;
        state[4] += (double)ms_dtype_size(pv.grad.dtype) * (double)ms_tensor_numel(&pv.grad);
        if (d && d->tied[0] && pv.name && !strcmp(pv.name, d->tied))
            state[5] = (double)numel(&pv.gshape) / s->tp; /* its gradient's elements */
    }
    ms_program_stats ps;
    ms_program_stats_get(prog, &ps);
    if ((double)ps.arena_bytes > *arena) *arena = (double)ps.arena_bytes;
    if ((double)ps.scratch_bytes > *scratch) *scratch = (double)ps.scratch_bytes;
    if ((double)ps.staging_bytes > *staging) *staging = (double)ps.staging_bytes;
    w->hw_flops_step += ps.flops;
    *persist += (double)ps.param_bytes + (double)ps.bucket_bytes; /* buckets: beside them */
    /* the residual stream crossing into this chunk: its local box, in bytes */
    if (model.hidden_in >= 0) {
        const ms_shape *g = ms_graph_value_shape(model.g, model.hidden_in);
        double local = (double)numel(g);
        ms_kernel_info kn;
        for (int i = 0; i < ms_program_num_kernels(prog); i++)
            if (ms_program_kernel(prog, i, &kn) == MS_OK && kn.phase == MS_PROG_FORWARD)
                for (int j = 0; j < kn.n_in; j++)
                    if (kn.in[j] == model.hidden_in) local = (double)numel(&kn.in_local[j]);
        *boundary = 4 * local;
    }
    st = MS_OK;
out:
    ms_program_destroy(prog);
    ms_model_free(&model);
    return st;
}

ms_status wk_from_engine(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_workload *w,
                         ms_plan_engine_stats *stats, ms_error *err) {
    const ms_plan_problem resolved = ms_plan_problem_resolved(pb);
    pb = &resolved;
    wk_reset(w);
    w->from_engine = true;
    if (stats) memset(stats, 0, sizeof *stats);
    /* One micro-batch through the chunks of the busiest stage: price() scales the in-micro-
     * batch part by the micro-batch count and adds the schedule's bubble. */
    int p = s->pp > 1 ? s->pp : 1, v = s->virtual_stages > 1 ? s->virtual_stages : 1;
    int size = 0, m = 1;
    if (!ms_strategy_micro(s, pb->global_batch, &size, &m))
        return ms_fail(err, MS_ERR_INVALID,
                       "the batch of %d does not split into the strategy's "
                       "micro-batches",
                       pb->global_batch);
    int stage = busiest_stage(pb, s);
    ms_mesh mesh = {0};
    MS_CHECK(ms_strategy_mesh(s, &mesh, err));
    /* parameter, gradient and optimizer-shard elements; bf16 use-copy and gradient bytes */
    double state[6] = {0, 0, 0, 0, 0, 0}, arena = 0, scratch = 0, staging = 0, persist = 0;
    double boundary = 0;
    /* the busiest stage's arena per micro-batch in flight, as many as any stage holds (the
     * first, under 1F1B: its arena is within a layer of the busiest's) */
    int held = 1;
    for (int q = 0; p > 1 && q < p; q++) {
        int b = ms_pp_inflight_bound((ms_schedule)s->schedule, p, m, v, q);
        if (b > held) held = b;
    }
    ms_status st = MS_OK;
    w->layers_per_stage = 0;
    for (int c = 0; c < v && st == MS_OK; c++) {
        int lo, hi;
        chunk_layers(pb, s, c * p + stage, &lo, &hi);
        w->layers_per_stage += hi - lo;
        st = add_chunk(pb, s, &mesh, size * s->dp, c * p + stage, held, w, stats, state, &arena,
                       &scratch, &staging, &persist, &boundary, err);
    }
    if (st != MS_OK) {
        ms_mesh_free(&mesh);
        return st;
    }
    if (p > 1) {
        /* the activation forward and its gradient backward, once per chunk boundary */
        wk_coll_add(w, MS_COLL_P2P, MS_PLAN_PP, WK_IN_MB, p, boundary, 2.0 * v);
        /* the tied embedding's gradients between the first and the last stage */
        const ms_model_def *d = ms_plan_user_def(pb);
        double wte = d ? state[5] : (double)pb->model.vocab_size * pb->model.n_embd / s->tp;
        double gbytes = s->precision == MS_PRECISION_BF16 ? 2 : 4;
        if (d ? wte > 0 : ms_model_ties_embedding(&pb->model))
            wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_PP, WK_GRAD, 2, gbytes * wte, 1);
    }
    /* the training loop: gradient norm over the world, AdamW on every local shard */
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_WORLD, WK_STEP, mesh.size * p, 8, 1);
    w->opt_elems = state[2];
    w->norm_elems = state[1];
    /* bf16: the parameters are the bf16 use copies, and the fp32 masters (state[0] elements,
     * the optimizer's shards) count with the optimizer state, as Rajbhandari et al. count K */
    bool bf16 = state[3] > 0;
    w->zero_bytes += state[4];
    w->mem_params = bf16 ? state[3] : 4 * state[0];
    w->mem_grads = state[4];
    w->mem_optim = 8 * state[2] + (bf16 ? 4 * state[0] : 0);
    /* one arena per micro-batch unit in flight (the schedule's bound), the scratch they share,
     * and bf16's staging */
    w->mem_act = arena * held + scratch + staging;
    /* inputs, kept values and, micro-batched under ZeRO 2 and 3, the gradients accumulating
     * whole before their reduce-scatter */
    w->mem_other = persist - (4 * state[0] + state[3] + state[4]);
    if (w->mem_other < 0) w->mem_other = 0;
    w->hw_flops_step *= (double)m * mesh.size * p; /* one micro-batch's, on every device */
    if (stats) {
        stats->local_params = state[0];
        stats->arena_bytes = arena;
        stats->scratch_bytes = scratch;
        stats->persist_bytes = persist;
    }
    ms_mesh_free(&mesh);
    return MS_OK;
}

/* program.c - compiling a graph for one rank, and explaining what was compiled. The passes
 * live one per file, with program_impl.h as their shared contract: completion
 * (program_complete.c), the instruction list (program_build.c), the backward and recompute
 * (program_backward.c), the memory plan (program_memory.c), gradient buckets
 * (program_buckets.c), precision (program_precision.c) and running the list (program_exec.c).
 *
 * The compiled step is a flat list of instructions over numbered buffers:
 *   RESHARD  src (value in placement A) -> dst (placement B), with the cached plan
 *   FWD/BWD  one operator's local kernel
 *   ZERO, ADD, SEED  gradient bookkeeping; COPY  a run of floats (ZeRO's shard, see below)
 * Every buffer that lives only within a step is packed into one arena by the memory
 * planner; parameters, their gradients and the inputs are persistent. Nothing on the step
 * path allocates except the reshard executor's temporaries.
 *
 * Compiling is planning (placements, instructions, buffer layout, costs: shapes only, no
 * communication) and then materialising (the arena, parameter storage and values). The
 * shapes-only compile stops after planning and needs neither a rank context nor
 * communicators; the planner reads such programs.
 *
 * ZeRO is placements: each parameter has a use placement (what completion chose, pvalue.pl),
 * a storage placement, a gradient placement and the optimizer state's, the last three sharded
 * over dp by stage (ms_compile_opts.zero_stage). Storage differing from use (stage 3) makes
 * every use a reshard (an all-gather over dp) into a step-lived buffer, again before the
 * backward kernel; the gradient's sync to its placement is a reduce-scatter (stages 2, 3);
 * the optimizer's shard differing from storage (stages 1, 2) adds a param-sync segment that
 * gathers the updated shards after the optimizer ran.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/graph/grad_buckets.h"
#include "engine/graph/graph_impl.h"
#include "engine/graph/program.h"
#include "engine/core/parallel.h"
#include "engine/ops/select.h"
#include "engine/core/trace_sink.h"

#include "engine/graph/program_impl.h"

/* --- compile ---------------------------------------------------------------------------------- */

void prog_make_call(ms_program *p, const instr *in, ms_op_call *call, ms_shape *gin,
                    ms_shape *gout);

/* Each kernel instruction's FLOPs and bytes, once: the profiler and stats read them. */
static void compute_costs(ms_program *p) {
    for (int k = 0; k < p->ni; k++) {
        instr *in = &p->ins[k];
        if (in->kind != I_FWD && in->kind != I_BWD) continue;
        ms_op_call call;
        ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT];
        prog_make_call(p, in, &call, gin, gout);
        const ms_op_def *def = ms_op_get(p->g->n[in->node].op);
        if (!def->cost) continue;
        ms_k_cost c = def->cost(&call, in->kind == I_BWD);
        double share = 1;
        if (in->kind == I_BWD && p->split_w) {
            /* A split backward: each pass is charged for the gradients it prog_writes, an equal
             * share per gradient (x @ W: dX and dW are one GEMM each). */
            const gnode *nd = &p->g->n[in->node];
            const ms_op_def *od = ms_op_get(nd->op);
            int all = 0, here = 0;
            for (int i = 0; i < nd->n_in; i++) {
                all += p->pv[nd->in[i]].requires_grad && (od->grad_inputs >> i & 1);
                here += in->din_buf[i] >= 0;
            }
            share = all > 0 ? (double)here / all : 1;
        }
        in->flops = c.flops * share;
        in->bytes = c.bytes * share;
    }
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Whether the host reads and prog_writes buffer b in place: a host master, or any buffer of a
 * host-addressable device. */
bool prog_host_reachable(const ms_program *p, const buf *b) {
    return b->on_host || ms_device_host_addressable(p->dev);
}

/* The kernels that prog_run on buffer b: the host's for host masters, else the rank device's. */
static ms_kctx *kernels_of(const ms_program *p, const buf *b) {
    return b->on_host ? p->hkc : p->kc;
}

/* The masters were written: under host masters their roundings are stale too. */
void prog_masters_written(ms_program *p) {
    p->params_dirty = p->bf16;
    for (int v = 0; p->master_host && v < p->g->nv; v++) p->pv[v].up_stale = true;
}

/* Philox values for a parameter's box, generated on the host (then moved to the device). */
static ms_status init_normal(ms_program *p, buf *b, const gvalue *gv, const int64_t *start,
                             ms_error *err) {
    if (prog_host_reachable(p, b))
        return ms_tensor_init_normal(&b->t, p->seed, name_hash(gv->name), gv->shape.d, start, 0.0f,
                                     gv->init.value, err);
    ms_tensor host;
    MS_CHECK(ms_tensor_alloc(ms_device_host(), MS_F32, b->lshape.ndim, b->lshape.d, &host, err));
    ms_status st = ms_tensor_init_normal(&host, p->seed, name_hash(gv->name), gv->shape.d, start,
                                         0.0f, gv->init.value, err);
    if (st == MS_OK)
        st = ms_device_copy(p->dev, b->ptr, ms_tensor_f32(&host), sizeof(float) * (size_t)b->numel,
                            MS_COPY_HOST_TO_DEVICE, err);
    ms_tensor_release(&host);
    return st;
}

static ms_status init_params(ms_program *p, ms_error *err) {
    ms_graph *g = p->g;
    for (int v = 0; v < g->nv; v++) {
        gvalue *gv = &g->v[v];
        if (gv->kind != GV_PARAM && gv->kind != GV_BUFFER) continue;
        ms_placements pl = p->pv[v].pl;
        buf *b = &p->bufs[gv->kind == GV_BUFFER ? p->pv[v].buf : prog_param_home(p, v, &pl)];
        if (gv->init.kind == MS_INIT_CONST) {
            MS_CHECK(MS_CALL_K(kernels_of(p, b), fill, b->ptr, gv->init.value, b->numel, err));
            continue;
        }
        int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
        ms_local_box(&pl, p->mesh, p->coords, gv->shape.ndim, gv->shape.d, start, len);
        if (gv->init.kind == MS_INIT_DATA) {
            MS_CHECK(prog_write_box(p, b, gv->data, gv->shape.d, start, len, gv->shape.ndim, err));
            continue;
        }
        MS_CHECK(init_normal(p, b, gv, start, err));
    }
    prog_masters_written(p);
    return MS_OK;
}

static ms_status check_graph(const ms_graph *g, ms_error *err) {
    MS_CHECK(ms_graph_error(g, err));
    if (g->loss < 0 && g->output >= 0) return MS_OK;
    if (g->loss < 0 || g->v[g->loss].shape.ndim != 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "graph: set a scalar loss with ms_graph_set_loss (or a chunk's output "
                       "with ms_graph_set_output)");
    return MS_OK;
}

/* Where each kernel and reshard sits in the instruction list, for reading them by index. */
static void index_instructions(ms_program *p) {
    p->kernels = xmalloc(sizeof(int) * (size_t)(p->ni + 1));
    p->reshards = xmalloc(sizeof(int) * (size_t)(p->ni + 1));
    for (int k = 0; k < p->ni; k++) {
        if (p->ins[k].kind == I_FWD || p->ins[k].kind == I_BWD) p->kernels[p->nkernels++] = k;
        if (p->ins[k].kind == I_RESHARD) p->reshards[p->nreshards++] = k;
    }
}

/* Everything compiling decides, from shapes alone: placements, the instruction list, the
 * buffer layout and the kernels' costs. Both entry points prog_run exactly this; only
 * ms_program_compile then allocates memory and initialises parameters. */
static ms_status plan_program(ms_program *p, const ms_compile_opts *opts, ms_error *err) {
    ms_graph *g = p->g;
    p->pv = xcalloc((size_t)g->nv, sizeof *p->pv);
    p->pn = xcalloc((size_t)g->nn, sizeof *p->pn);
    p->micro = opts && opts->micro_batched;
    p->inflight = p->micro ? opts->inflight : 0;
    p->split_w = p->micro && opts->split_weight_grads;
    p->passes = p->micro && opts->micro_batches > 1 ? opts->micro_batches : 1;
    p->deferred_sync = opts && opts->deferred_param_sync;
    p->loss_scale = opts && opts->loss_scale != 0 ? opts->loss_scale : 1.0f;
    p->out_grad_buf = -1;
    p->in_grad_buf = xmalloc(sizeof(int) * (size_t)g->nv);
    for (int v = 0; v < g->nv; v++) p->in_grad_buf[v] = -1;
    p->zero_stage = opts ? opts->zero_stage : 0;
    p->bf16 = opts && opts->bf16;
    p->master_host = p->bf16 ? opts->master_host : NULL;
    p->zero_dim = opts ? opts->zero_dim : -1;
    MS_CHECK(prog_complete(p, opts, err));
    prog_assign_dtypes(p);
    prog_zero_placements(p);
    prog_build_forward(p);
    prog_mark_recompute(p, opts ? opts->recompute : 0, opts ? opts->recompute_blocks : 0);
    prog_build_backward(p);
    if (!(opts && opts->zero_all_grads)) prog_fresh_gradients(p);
    if (opts && opts->bucket_mb > 0)
        prog_plan_grad_buckets(p, opts); /* shapes-only: the planner's */
    prog_layout_memory(p);
    p->staging_floats = prog_staging_floats(p);
    compute_costs(p);
    index_instructions(p);
    p->params = xmalloc(sizeof(int) * (size_t)g->nv);
    p->buffers = xmalloc(sizeof(int) * (size_t)g->nv);
    for (int v = 0; v < g->nv; v++) {
        if (g->v[v].kind == GV_PARAM) p->params[p->nparams++] = v;
        if (g->v[v].kind == GV_BUFFER) p->buffers[p->nbuffers++] = v;
    }
    return MS_OK;
}

/* Every operator must have its kernels on the device; named, with the way out, if not. */
static ms_status check_device_ops(const ms_program *p, ms_error *err) {
    if (p->kc->k->kind == MS_DEVICE_CPU) return MS_OK;
    for (int k = 0; k < p->g->nn; k++) {
        const ms_op_def *def = ms_op_get(p->g->n[k].op);
        if (!def->runs_on || !def->runs_on(p->kc->k))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "operator '%s' (node '%s') has no %s kernels yet; train this model "
                           "with --device cpu",
                           def->name, p->g->n[k].name, p->kc->k->name);
    }
    return MS_OK;
}

ms_status ms_program_compile(ms_graph *g, ms_dmesh *mesh, const ms_compile_opts *opts,
                             ms_program **out, ms_error *err) {
    *out = NULL;
    MS_CHECK(check_graph(g, err));
    ms_program *p = xcalloc(1, sizeof *p);
    p->g = g;
    p->dm = mesh;
    p->ctx = mesh->ctx;
    p->mesh = &mesh->mesh;
    memcpy(p->coords, mesh->coords, sizeof p->coords);
    p->plans = mesh->ctx->plans;
    p->seed = p->draw = opts ? opts->seed : 0;
    p->member = ms_dmesh_is_member(mesh);
    p->loss_buf = -1;
    p->dev = p->ctx->device ? p->ctx->device : ms_device_host();
    *out = p;
    if (!p->member) return MS_OK;
    ms_status st;
    MS_CHECK_GOTO(ms_kctx_create(p->dev, &p->kc, err), st, fail);
    p->bf16_kernels = p->kc->k;
    MS_CHECK_GOTO(plan_program(p, opts, err), st, fail);
    if (p->master_host) MS_CHECK_GOTO(ms_kctx_create(p->master_host, &p->hkc, err), st, fail);
    MS_CHECK_GOTO(check_device_ops(p, err), st, fail);
    MS_CHECK_GOTO(prog_alloc_memory(p, err), st, fail);
    MS_CHECK_GOTO(prog_bind_grad_buckets(p, err), st, fail);
    MS_CHECK_GOTO(init_params(p, err), st, fail);
    return MS_OK;
fail:
    ms_program_destroy(p);
    *out = NULL;
    return st;
}

/* The bf16 kernels a shapes-only program prices (ms_compile_opts.kernels_like). Without CUDA
 * in this build the fenced device's table stands in for a GPU's: it has the same bf16 kernels
 * (test_kernel_backend checks that where CUDA is built). */
static const ms_kernels *shapes_kernels(const ms_program *p, const ms_compile_opts *opts) {
    ms_device_kind kind = opts ? opts->kernels_like : MS_DEVICE_CPU;
    const ms_kernels *k = kind == MS_DEVICE_CPU ? NULL : ms_kernels_for(kind);
    if (!k && kind == MS_DEVICE_CUDA) k = ms_kernels_for(MS_DEVICE_FENCED);
    return k ? k : p->kc->k;
}

ms_status ms_program_compile_shapes(ms_graph *g, const ms_mesh *mesh, const int *coords,
                                    const ms_compile_opts *opts, ms_program **out, ms_error *err) {
    *out = NULL;
    MS_CHECK(check_graph(g, err));
    for (int m = 0; coords && m < mesh->ndim; m++)
        if (coords[m] < 0 || coords[m] >= mesh->shape[m])
            return ms_fail(err, MS_ERR_INVALID,
                           "program: coordinate %d of mesh dim %d outside 0..%d", coords[m], m,
                           mesh->shape[m] - 1);
    ms_program *p = xcalloc(1, sizeof *p);
    p->g = g;
    p->shapes_only = true;
    p->seed = p->draw = opts ? opts->seed : 0;
    p->member = true;
    p->loss_buf = -1;
    p->dev = ms_device_host();
    ms_status st;
    MS_CHECK_GOTO(ms_kctx_create(p->dev, &p->kc, err), st, fail);
    p->bf16_kernels = shapes_kernels(p, opts);
    MS_CHECK_GOTO(ms_mesh_copy(&p->own_mesh, mesh, err), st, fail);
    p->mesh = &p->own_mesh;
    if (coords) memcpy(p->coords, coords, sizeof(int) * (size_t)mesh->ndim);
    p->plans = opts && opts->plans ? opts->plans : (p->own_plans = ms_plan_cache_create());
    MS_CHECK_GOTO(plan_program(p, opts, err), st, fail);
    *out = p;
    return MS_OK;
fail:
    ms_program_destroy(p);
    return st;
}

void ms_program_destroy(ms_program *p) {
    if (!p) return;
    if (p->buckets) {
        size_t bytes = ms_gb_storage_bytes(p->buckets) + 64;
        ms_gb_destroy(p->buckets); /* first: it waits for what is in flight into the storage */
        prog_free(p, p->bucket_storage, bytes);
    }
    for (int b = 0; b < p->nb; b++) {
        ms_tensor_release(&p->bufs[b].t);
        ms_tensor_release(&p->bufs[b].wide);
    }
    prog_free(p, p->staging, (p->staging_floats + 16) * sizeof(float));
    free(p->bufs);
    free(p->ins);
    free(p->pv);
    free(p->pn);
    if (!p->micro) prog_free(p, p->arena, (p->arena_floats + 16) * sizeof(float));
    free(p->in_grad_buf);
    free(p->zero_off), free(p->zero_len), free(p->zero_other), free(p->cast_items);
    prog_free(p, p->persist, (p->persist_floats + 16) * sizeof(float));
    if (p->host_persist)
        ms_device_free(p->master_host, p->host_persist, (p->host_floats + 16) * sizeof(float));
    ms_kctx_destroy(p->hkc);
    free(p->params);
    free(p->buffers);
    free(p->param_first);
    free(p->gf_last), free(p->gf_hits), free(p->gf_bucket_param), free(p->gf_told);
    free(p->kernels);
    free(p->reshards);
    free(p->rc_first);
    free(p->rc_buf);
    free(p->vdtype);
    ms_plan_cache_destroy(p->own_plans);
    ms_mesh_free(&p->own_mesh);
    ms_kctx_destroy(p->kc);
    free(p);
}

/* --- explain and stats ---------------------------------------------------------------------- */

static void human(double b, char *out, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB"};
    int k = 0;
    while (b >= 1024 && k < 3) b /= 1024, k++;
    snprintf(out, len, k ? "%.2f %s" : "%.0f %s", b, u[k]);
}

void ms_program_explain(const ms_program *p, FILE *f) {
    if (!p->member) return;
    const ms_graph *g = p->g;
    char m[256];
    fprintf(f, "mesh %s\n\nvalues (global shape, completed placements; * = annotated):\n",
            ms_mesh_str(p->mesh, m, sizeof m));
    for (int v = 0; v < g->nv; v++) {
        const gvalue *gv = &g->v[v];
        char sh[96], pl[128];
        const char *kind = gv->kind == GV_PARAM    ? "param"
                           : gv->kind == GV_INPUT  ? "input"
                           : gv->kind == GV_BUFFER ? "buffer"
                                                   : "";
        fprintf(f, "  %-6s %-40s %-18s %s%s\n", kind, gv->name,
                ms_shape_str(gv->shape.d, gv->shape.ndim, sh, sizeof sh),
                ms_placements_str(&p->pv[v].pl, pl, sizeof pl), gv->annotated ? " *" : "");
    }
    fprintf(f, "\nreshards per step (collective size per rank, from the plan the engine runs):\n");
    double total = 0;
    int n = 0;
    for (int k = 0; k < p->ni; k++) {
        const instr *in = &p->ins[k];
        if (in->kind != I_RESHARD) continue;
        char a[128], b[128], by[32];
        human(in->coll_bytes, by, sizeof by);
        const char *what = prog_moves_grad(in) ? "grad of " : "";
        fprintf(f, "  %-10s %s%-36s %-16s -> %-16s %s\n", ms_program_phase_name(in->phase), what,
                g->v[in->value].name, ms_placements_str(&in->from, a, sizeof a),
                ms_placements_str(&in->to, b, sizeof b), by);
        total += in->coll_bytes;
        n++;
    }
    ms_program_stats st;
    ms_program_stats_get(p, &st);
    char t[32], ar[32], un[32], pb[32], ac[32];
    human(total, t, sizeof t);
    human((double)st.arena_bytes, ar, sizeof ar);
    human((double)st.unplanned_bytes, un, sizeof un);
    human((double)st.param_bytes, pb, sizeof pb);
    human((double)st.activation_bytes, ac, sizeof ac);
    char sc[80] = "";
    if (st.scratch_bytes) {
        char h[32];
        human((double)st.scratch_bytes, h, sizeof h);
        snprintf(sc, sizeof sc, " a micro-batch, + %s shared scratch", h);
    }
    fprintf(f,
            "\n%d reshards, %s per step on this rank; %.3g GFLOP per step; activation arena %s%s "
            "(%s without reuse; activations %s besides the gradients awaiting the grad sync); "
            "parameters and gradients %s\n",
            n, t, st.flops / 1e9, ar, sc, un, ac, pb);
    char zb[32], fb[32];
    human(st.zeroed_bytes, zb, sizeof zb);
    human(st.fresh_bytes, fb, sizeof fb);
    fprintf(f,
            "gradients: %d zeroed before kernels add into them (%s), %d written whole by the "
            "kernel that prog_writes them first (%s)\n",
            st.zeroed_grads, zb, st.fresh_grads, fb);
}

void ms_program_stats_get(const ms_program *p, ms_program_stats *s) {
    memset(s, 0, sizeof *s);
    if (!p->member) return;
    for (int k = 0; k < p->ni; k++) {
        const instr *in = &p->ins[k];
        if (in->kind == I_RESHARD) {
            s->n_reshards++;
            s->reshard_bytes += in->coll_bytes;
        } else if (in->kind == I_FWD || in->kind == I_BWD) {
            s->flops += in->flops;
            for (int i = 0; in->kind == I_BWD && i < MS_OP_MAX_IN; i++)
                if (in->din_fresh >> i & 1u) {
                    s->fresh_grads++;
                    s->fresh_bytes += 4.0 * (double)p->bufs[in->din_buf[i]].nfloats;
                }
        } else if (in->kind == I_ZERO && !in->dropped && in->dst >= 0) {
            s->zeroed_grads++;
            s->zeroed_bytes += 4.0 * (double)p->bufs[in->dst].nfloats;
        }
    }
    s->arena_bytes = p->arena_floats * sizeof(float);
    s->scratch_bytes = p->scratch_floats * sizeof(float);
    s->activation_bytes = p->activation_floats * sizeof(float);
    s->unplanned_bytes = p->unplanned_floats * sizeof(float);
    s->param_bytes = p->persist_floats * sizeof(float);
    s->staging_bytes = p->staging_floats * sizeof(float);
    if (p->buckets) {
        s->grad_buckets = ms_gb_buckets(p->buckets);
        s->bucketed_grads = ms_gb_count(p->buckets);
        s->bucket_bytes = ms_gb_storage_bytes(p->buckets);
    }
}

ms_status ms_program_load_param(ms_program *p, int i, const float *full, ms_error *err) {
    if (i < 0 || i >= p->nparams)
        return ms_fail(err, MS_ERR_INVALID, "parameter %d out of range", i);
    if (!p->member) return MS_OK;
    MS_CHECK(prog_check_has_memory(p, err));
    int v = p->params[i];
    const gvalue *gv = &p->g->v[v];
    ms_placements pl;
    buf *b = &p->bufs[prog_param_home(p, v, &pl)];
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(&pl, p->mesh, p->coords, gv->shape.ndim, gv->shape.d, start, len);
    prog_masters_written(p);
    return prog_write_box(p, b, full, gv->shape.d, start, len, gv->shape.ndim, err);
}

int ms_program_num_buffers(const ms_program *p) {
    return p->nbuffers;
}

ms_status ms_program_buffer(const ms_program *p, int i, ms_buffer_view *out) {
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= p->nbuffers) return MS_ERR_INVALID;
    int v = p->buffers[i];
    out->name = p->g->v[v].name;
    out->value = v;
    out->gshape = p->g->v[v].shape;
    out->pl = p->pv[v].pl;
    if (p->bufs) out->data = p->bufs[p->pv[v].buf].t;
    return MS_OK;
}

ms_status ms_program_load_buffer(ms_program *p, int i, const float *full, ms_error *err) {
    if (i < 0 || i >= p->nbuffers) return ms_fail(err, MS_ERR_INVALID, "buffer %d out of range", i);
    if (!p->member) return MS_OK;
    MS_CHECK(prog_check_has_memory(p, err));
    int v = p->buffers[i];
    const gvalue *gv = &p->g->v[v];
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(&p->pv[v].pl, p->mesh, p->coords, gv->shape.ndim, gv->shape.d, start, len);
    return prog_write_box(p, &p->bufs[p->pv[v].buf], full, gv->shape.d, start, len, gv->shape.ndim,
                          err);
}

ms_status ms_program_value(ms_program *p, int v, ms_tensor *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    if (!p->member) return MS_OK;
    MS_CHECK(prog_check_has_memory(p, err));
    if (v < 0 || v >= p->g->nv || !p->bufs[p->pv[v].buf].persistent)
        return ms_fail(err, MS_ERR_INVALID,
                       "value %d is not kept; call ms_graph_keep before "
                       "compiling",
                       v);
    ms_dtensor t = {.ndim = p->g->v[v].shape.ndim, .mesh = p->dm, .pl = p->pv[v].pl};
    memcpy(t.gshape, p->g->v[v].shape.d, sizeof t.gshape);
    t.local = p->bufs[p->pv[v].buf].t;
    return ms_dtensor_full(&t, out, err);
}

int ms_program_num_kernels(const ms_program *p) {
    return p->nkernels;
}

ms_status ms_program_kernel(const ms_program *p, int i, ms_kernel_info *out) {
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= p->nkernels) return MS_ERR_INVALID;
    const instr *in = &p->ins[p->kernels[i]];
    const gnode *nd = &p->g->n[in->node];
    const pnode *pn = &p->pn[in->node];
    out->node = in->node;
    out->name = nd->name;
    out->op = nd->op;
    out->attrs = &nd->attrs;
    out->phase = in->phase;
    out->n_in = nd->n_in;
    out->n_out = nd->n_out;
    for (int k = 0; k < nd->n_in; k++) {
        out->in[k] = nd->in[k];
        out->in_pl[k] = pn->req_in[k];
        out->in_local[k] = p->bufs[in->kb.in[k]].lshape;
        out->grad_in[k] = in->din_buf[k] >= 0;
        out->fresh_in[k] = in->din_fresh >> k & 1u;
    }
    for (int k = 0; k < nd->n_out; k++) {
        out->out[k] = nd->out[k];
        out->out_pl[k] = pn->out_pl[k];
        out->out_local[k] = p->bufs[in->kb.out[k]].lshape;
    }
    out->flops = in->flops;
    out->bytes = in->bytes;
    return MS_OK;
}

int ms_program_num_reshards(const ms_program *p) {
    return p->nreshards;
}

ms_status ms_program_reshard(const ms_program *p, int i, ms_reshard_info *out) {
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= p->nreshards) return MS_ERR_INVALID;
    const instr *in = &p->ins[p->reshards[i]];
    if (!in->plan) return MS_ERR_INTERNAL;
    *out = (ms_reshard_info){
        .value = in->value,
        .name = p->g->v[in->value].name,
        .phase = in->phase,
        .gshape = p->g->v[in->value].shape,
        .from = in->from,
        .to = in->to,
        .plan = in->plan,
        .coll_bytes = in->coll_bytes,
        .param_gather = in->gather,
        .dtype = p->bufs[in->src].dtype,
        .bucket = in->bucket_grad ? ms_gb_bucket_of(p->buckets, in->bucket_grad - 1) : -1};
    return MS_OK;
}

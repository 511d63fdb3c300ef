/* program.c - compiling a graph for one rank: completion, autograd, partition and the
 * memory plan; then running its instruction list.
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

/* --- small helpers ----------------------------------------------------------------------- */

static void local_shape(const ms_program *p, const ms_shape *g, const ms_placements *pl,
                        ms_shape *out) {
    int64_t start[MS_MAX_DIMS];
    out->ndim = g->ndim;
    ms_local_box(pl, p->mesh, p->coords, g->ndim, g->d, start, out->d);
}

static int64_t shape_n(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

static int new_typed_buf(ms_program *p, const ms_shape *gshape, const ms_placements *pl,
                         bool persistent, ms_dtype dtype) {
    if (p->nb == p->cb) {
        p->cb = p->cb ? p->cb * 2 : 256;
        p->bufs = xrealloc(p->bufs, sizeof *p->bufs * (size_t)p->cb);
    }
    buf *b = &p->bufs[p->nb];
    memset(b, 0, sizeof *b);
    local_shape(p, gshape, pl, &b->lshape);
    b->dtype = dtype;
    b->numel = shape_n(&b->lshape);
    b->nfloats = dtype == MS_BF16 ? (b->numel + 1) / 2 : b->numel;
    b->persistent = persistent;
    b->first = b->last = -1;
    /* shapes only until the memory plan wraps the arena (cost functions read shapes) */
    b->t.dtype = dtype;
    b->t.ndim = b->lshape.ndim;
    memcpy(b->t.shape, b->lshape.d, sizeof b->t.shape);
    return p->nb++;
}

/* A buffer for value v (or its gradient) in placements pl, in the value's element type. */
static int new_buf(ms_program *p, int v, const ms_placements *pl, bool persistent) {
    return new_typed_buf(p, &p->g->v[v].shape, pl, persistent, prog_value_dtype(p, v));
}

static int new_raw_buf(ms_program *p, int64_t nfloats) {
    ms_shape s = {.ndim = 1, .d = {nfloats}};
    ms_placements r = ms_placements_replicated(p->mesh->ndim);
    return new_typed_buf(p, &s, &r, false, MS_F32);
}

static instr *emit(ms_program *p, ikind kind, ms_program_phase phase) {
    if (p->ni == p->ci) {
        p->ci = p->ci ? p->ci * 2 : 256;
        p->ins = xrealloc(p->ins, sizeof *p->ins * (size_t)p->ci);
    }
    instr *in = &p->ins[p->ni++];
    memset(in, 0, sizeof *in);
    in->kind = kind;
    in->node = in->value = in->src = in->dst = -1;
    for (int i = 0; i < MS_OP_MAX_OUT; i++) in->dout_buf[i] = -1;
    for (int i = 0; i < MS_OP_MAX_IN; i++) in->din_buf[i] = -1;
    in->phase = phase;
    return in;
}

static const char *const phase_names[] = {"forward",   "loss",       "backward",
                                          "grad sync", "param sync", "recompute"};
_Static_assert(sizeof phase_names / sizeof *phase_names == MS_PROG_PHASE_COUNT, "a name per phase");

const char *ms_program_phase_name(ms_program_phase ph) {
    return (unsigned)ph < MS_PROG_PHASE_COUNT ? phase_names[ph] : "?";
}

/* Reshards in the backward and the gradient sync move a gradient, not the value itself,
 * except a ZeRO-3 parameter gathered for a backward kernel. */
static bool moves_grad(const instr *in) {
    return (in->phase == MS_PROG_BACKWARD || in->phase == MS_PROG_GRAD_SYNC) && !in->gather;
}

/* --- completion --------------------------------------------------------------------------- */

static int node_rule(const ms_graph *g, const gnode *nd, int mesh_size, ms_rule_cand *cands) {
    const ms_op_def *def = ms_op_get(nd->op);
    ms_shape ins[MS_OP_MAX_IN];
    for (int i = 0; i < nd->n_in; i++) ins[i] = g->v[nd->in[i]].shape;
    memset(cands, 0, sizeof(ms_rule_cand) * MS_OP_MAX_CANDS);
    return def->rule(&nd->attrs, nd->n_in, ins, mesh_size, cands);
}

/* Reverse rule: from wanted output placements back to hints for unplaced inputs. */
static void reverse_hints(ms_program *p) {
    ms_graph *g = p->g;
    const ms_mesh *mesh = p->mesh;
    for (int k = g->nn - 1; k >= 0; k--) {
        gnode *nd = &g->n[k];
        const ms_placements *want[MS_OP_MAX_OUT] = {0};
        bool any = false;
        for (int o = 0; o < nd->n_out; o++) {
            pvalue *ov = &p->pv[nd->out[o]];
            const gvalue *gv = &g->v[nd->out[o]];
            want[o] = gv->annotated ? &gv->ann : ov->has_hint ? &ov->hint : NULL;
            any |= want[o] != NULL;
        }
        if (!any) continue;
        ms_placements hint[MS_OP_MAX_IN];
        for (int i = 0; i < nd->n_in; i++) hint[i] = ms_placements_replicated(mesh->ndim);
        for (int m = 0; m < mesh->ndim; m++) {
            ms_rule_cand cands[MS_OP_MAX_CANDS];
            int nc = node_rule(g, nd, mesh->shape[m], cands);
            for (int c = 0; c < nc; c++) {
                bool match = true;
                for (int o = 0; o < nd->n_out && match; o++)
                    if (want[o]) match = ms_placement_same_kind(cands[c].out[o], want[o]->p[m]);
                if (!match) continue;
                for (int i = 0; i < nd->n_in; i++) hint[i].p[m] = cands[c].in[i];
                break;
            }
        }
        for (int i = 0; i < nd->n_in; i++) {
            pvalue *iv = &p->pv[nd->in[i]];
            if (g->v[nd->in[i]].annotated || iv->has_hint) continue;
            ms_placements_default_order(&hint[i]);
            if (ms_placements_validate(&hint[i], mesh->ndim, g->v[nd->in[i]].shape.ndim, NULL) !=
                MS_OK)
                continue;
            iv->has_hint = true;
            iv->hint = hint[i];
        }
    }
}

static ms_status forward_completion(ms_program *p, ms_error *err) {
    ms_graph *g = p->g;
    const ms_mesh *mesh = p->mesh;
    for (int k = 0; k < g->nn; k++) {
        gnode *nd = &g->n[k];
        pnode *pn = &p->pn[k];
        ms_shape ins[MS_OP_MAX_IN], outs[MS_OP_MAX_OUT];
        ms_placements in_pl[MS_OP_MAX_IN], want[MS_OP_MAX_OUT];
        int want_kind[MS_OP_MAX_OUT];
        for (int i = 0; i < nd->n_in; i++) {
            ins[i] = g->v[nd->in[i]].shape;
            in_pl[i] = p->pv[nd->in[i]].pl;
        }
        for (int o = 0; o < nd->n_out; o++) {
            const gvalue *ov = &g->v[nd->out[o]];
            const pvalue *op = &p->pv[nd->out[o]];
            outs[o] = ov->shape;
            want_kind[o] = ov->annotated ? 2 : op->has_hint ? 1 : 0;
            if (want_kind[o]) want[o] = ov->annotated ? ov->ann : op->hint;
        }
        ms_rule_query q = {.op = nd->op,
                           .attrs = &nd->attrs,
                           .n_in = nd->n_in,
                           .n_out = nd->n_out,
                           .in_shapes = ins,
                           .out_shapes = outs,
                           .in_pl = in_pl,
                           .want_out = want,
                           .want_kind = want_kind,
                           .allow_reshard = true};
        ms_rule_choice ch;
        ms_status st = ms_rule_select(p->plans, mesh, &q, &ch, err);
        if (st != MS_OK) return ms_fail_wrap(err, st, "node '%s'", nd->name);
        memcpy(pn->cand, ch.cand, sizeof pn->cand);
        memcpy(pn->req_in, ch.req_in, sizeof pn->req_in);
        memcpy(pn->out_pl, ch.out_pl, sizeof pn->out_pl);
        for (int o = 0; o < nd->n_out; o++) {
            pvalue *ov = &p->pv[nd->out[o]];
            const gvalue *gv = &g->v[nd->out[o]];
            ov->pl = gv->annotated ? gv->ann : pn->out_pl[o];
            ov->known = true;
        }
    }
    return MS_OK;
}

static ms_status complete(ms_program *p, const ms_compile_opts *opts, ms_error *err) {
    ms_graph *g = p->g;
    const ms_mesh *mesh = p->mesh;
    /* Annotations from the callback, then validation of every annotation. */
    for (int v = 0; v < g->nv; v++) {
        gvalue *gv = &g->v[v];
        if (!gv->annotated && opts && opts->shard) {
            ms_placements pl = {.n = mesh->ndim};
            if (opts->shard(opts->shard_user, gv->name, &gv->shape, mesh->ndim, &pl)) {
                gv->annotated = true;
                gv->ann = pl;
            }
        }
        if (gv->annotated &&
            ms_placements_validate(&gv->ann, mesh->ndim, gv->shape.ndim, err) != MS_OK)
            return ms_fail_wrap(err, MS_ERR_INVALID, "annotation of '%s'", gv->name);
    }
    reverse_hints(p);
    for (int v = 0; v < g->nv; v++) {
        gvalue *gv = &g->v[v];
        if (gv->kind == GV_ACT) continue;
        pvalue *pv = &p->pv[v];
        pv->pl = gv->annotated  ? gv->ann
                 : pv->has_hint ? pv->hint
                                : ms_placements_replicated(mesh->ndim);
        pv->known = true;
    }
    return forward_completion(p, err);
}

/* --- ZeRO: placements over the data-parallel mesh dim --------------------------------------- */

ms_placements ms_program_zero_pl(const ms_placements *pl, int dim, int tensor_ndim) {
    ms_placements z = *pl;
    if (dim < 0 || dim >= pl->n || tensor_ndim < 1 || pl->p[dim].kind != MS_PL_REPLICATE) return z;
    int outer = 0; /* mesh dims already splitting dim 0: dp nests inside them all */
    for (int m = 0; m < pl->n; m++)
        outer += m != dim && pl->p[m].kind == MS_PL_SHARD && pl->p[m].dim == 0;
    z.p[dim] = ms_pl_shard(0);
    z.p[dim].order = (int8_t)outer;
    return z;
}

/* Each parameter's storage, gradient and optimizer placements for the ZeRO stage. */
static void zero_placements(ms_program *p) {
    for (int v = 0; v < p->g->nv; v++) {
        pvalue *pv = &p->pv[v];
        if (p->g->v[v].kind != GV_PARAM) continue;
        ms_placements z = p->zero_stage
                              ? ms_program_zero_pl(&pv->pl, p->zero_dim, p->g->v[v].shape.ndim)
                              : pv->pl;
        pv->opt_pl = z;
        pv->grad_pl = p->zero_stage >= 2 ? z : pv->pl;
        pv->store_pl = p->zero_stage >= 3 ? z : pv->pl;
    }
}

/* A parameter's fp32 values, the ones the optimizer updates and checkpoints hold: the
 * master weights in the optimizer's placements under bf16, else the storage itself. */
static int param_home(const ms_program *p, int v, ms_placements *pl) {
    const pvalue *pv = &p->pv[v];
    *pl = pv->master_buf >= 0 ? pv->opt_pl : pv->store_pl;
    return pv->master_buf >= 0 ? pv->master_buf : pv->buf;
}

/* Where value v's buffer lies: a parameter's storage, or the value's placement. */
static const ms_placements *held_pl(const ms_program *p, int v) {
    return p->g->v[v].kind == GV_PARAM ? &p->pv[v].store_pl : &p->pv[v].pl;
}

/* --- building the instruction list ----------------------------------------------------------- */

/* The local shapes a kernel sees, for sizing saved buffers before any data exists. */
static void fake_call(ms_program *p, int k, ms_op_call *call, ms_tensor *tin, ms_tensor *tout,
                      ms_shape *gin, ms_shape *gout) {
    gnode *nd = &p->g->n[k];
    pnode *pn = &p->pn[k];
    memset(call, 0, sizeof *call);
    call->attrs = &nd->attrs;
    call->n_in = nd->n_in;
    call->n_out = nd->n_out;
    call->kc = p->kc;
    for (int i = 0; i < nd->n_in; i++) {
        gin[i] = p->g->v[nd->in[i]].shape;
        ms_shape ls;
        local_shape(p, &gin[i], &pn->req_in[i], &ls);
        memset(&tin[i], 0, sizeof tin[i]);
        tin[i].ndim = ls.ndim;
        memcpy(tin[i].shape, ls.d, sizeof(int64_t) * (size_t)ls.ndim);
        call->in[i] = &tin[i];
    }
    for (int o = 0; o < nd->n_out; o++) {
        gout[o] = p->g->v[nd->out[o]].shape;
        ms_shape ls;
        local_shape(p, &gout[o], &pn->out_pl[o], &ls);
        memset(&tout[o], 0, sizeof tout[o]);
        tout[o].ndim = ls.ndim;
        memcpy(tout[o].shape, ls.d, sizeof(int64_t) * (size_t)ls.ndim);
        call->out[o] = &tout[o];
    }
    call->gin = gin;
    call->gout = gout;
}

/* The plan is looked up once here; a failed lookup leaves it NULL, which running the step
 * or reading the reshard reports. */
static void emit_reshard(ms_program *p, int value, int src, int dst, const ms_placements *from,
                         const ms_placements *to, ms_program_phase phase) {
    instr *in = emit(p, I_RESHARD, phase);
    in->value = value;
    in->src = src;
    in->dst = dst;
    in->from = *from;
    in->to = *to;
    const ms_shape *g = &p->g->v[value].shape;
    if (ms_plan_cache_get(p->plans, p->mesh, from, to, g->ndim, g->d, &in->plan, NULL) != MS_OK)
        in->plan = NULL;
    in->coll_bytes = prog_reshard_bytes(p, in);
}

/* --- ZeRO 3's gather order and ZeRO 1 and 2's parameter sync ------------------------------- */

/* The layer a parameter belongs to, by name: the prefix up to its first numeric component
 * ("h.3." of "h.3.mlp.c_fc.weight"); empty outside the layers (embeddings, final norm). */
static size_t layer_prefix(const char *name) {
    for (const char *s = name, *e; (e = strchr(s, '.')) != NULL; s = e + 1) {
        bool num = e > s;
        for (const char *c = s; c < e; c++) num &= isdigit((unsigned char)*c) != 0;
        if (num) return (size_t)(e + 1 - name);
    }
    return 0;
}

static bool same_layer(const char *a, const char *b) {
    size_t n = layer_prefix(a);
    return n == layer_prefix(b) && !strncmp(a, b, n);
}

typedef struct placed {
    int anchor, at; /* where an instruction goes (an instruction index), where it was */
} placed;

static int cmp_placed(const void *x, const void *y) {
    const placed *a = x, *b = y;
    if (a->anchor != b->anchor) return a->anchor < b->anchor ? -1 : 1;
    return a->at < b->at ? -1 : a->at > b->at;
}

/* Prefetch order over instructions [lo, hi): a layer's parameter gathers move to where the
 * previous layer's first gather was, so the next layer's parameters are on their way while
 * this one computes, and each gathered copy lives about two layers. The gathers still block
 * today; they overlap compute once the communicators run them without blocking (the
 * non-blocking collectives to come), for which this order is already right. */
static void prefetch_gathers(ms_program *p, int lo, int hi) {
    int n = hi - lo, first = -1, prev = -1;
    const char *layer = NULL;
    bool moved = false;
    placed *o = xmalloc(sizeof *o * (size_t)(n + 1));
    for (int k = lo; k < hi; k++) {
        o[k - lo] = (placed){k, k};
        if (!p->ins[k].gather) continue;
        const char *name = p->g->v[p->ins[k].value].name;
        if (!layer || !same_layer(name, layer)) prev = first, first = k, layer = name;
        if (prev >= 0) o[k - lo].anchor = prev, moved = true;
    }
    if (moved) {
        qsort(o, (size_t)n, sizeof *o, cmp_placed);
        instr *tmp = xmalloc(sizeof *tmp * (size_t)n);
        for (int i = 0; i < n; i++) tmp[i] = p->ins[o[i].at];
        memcpy(p->ins + lo, tmp, sizeof *tmp * (size_t)n);
        free(tmp);
    }
    free(o);
}

/* Floats from the start of the rank's box under placements a to the start of its box under
 * b, a sub-box of rows (dim 0), as ZeRO's shards are. */
static int64_t rows_offset(const ms_program *p, const ms_shape *g, const ms_placements *a,
                           const ms_placements *b) {
    int64_t sa[MS_MAX_DIMS], la[MS_MAX_DIMS], sb[MS_MAX_DIMS], lb[MS_MAX_DIMS], row = 1;
    if (g->ndim == 0) return 0;
    ms_local_box(a, p->mesh, p->coords, g->ndim, g->d, sa, la);
    ms_local_box(b, p->mesh, p->coords, g->ndim, g->d, sb, lb);
    for (int d = 1; d < g->ndim; d++) row *= la[d];
    return (sb[0] - sa[0]) * row;
}

/* bf16: the fp32 masters (the optimizer's shards) are rounded into the use copies: in place
 * where they have the same placements, else into a shard that is all-gathered over dp (ZeRO 1
 * and 2), which so moves bf16. */
static void build_master_cast(ms_program *p) {
    for (int v = 0; v < p->g->nv; v++) {
        pvalue *pv = &p->pv[v];
        if (p->g->v[v].kind != GV_PARAM) continue;
        bool same = ms_placements_eq(&pv->opt_pl, &pv->store_pl);
        instr *cast = emit(p, I_CAST, MS_PROG_PARAM_SYNC);
        cast->value = v;
        cast->src = pv->master_buf;
        cast->dst = same ? pv->buf : new_buf(p, v, &pv->opt_pl, false);
        if (!same)
            emit_reshard(p, v, cast->dst, pv->buf, &pv->opt_pl, &pv->store_pl, MS_PROG_PARAM_SYNC);
    }
}

/* ZeRO 1 and 2: the optimizer updated its shard of each stored parameter; the shard is copied
 * out (a gather must not read what it writes) and all-gathered back over dp. */
static void build_param_sync(ms_program *p) {
    if (p->bf16) {
        build_master_cast(p);
        return;
    }
    for (int v = 0; v < p->g->nv; v++) {
        pvalue *pv = &p->pv[v];
        const ms_shape *gs = &p->g->v[v].shape;
        if (p->g->v[v].kind != GV_PARAM || ms_placements_eq(&pv->opt_pl, &pv->store_pl)) continue;
        int shard = new_buf(p, v, &pv->opt_pl, false);
        instr *cp = emit(p, I_COPY, MS_PROG_PARAM_SYNC);
        cp->value = v;
        cp->src = pv->buf;
        cp->dst = shard;
        cp->src_off = rows_offset(p, gs, &pv->store_pl, &pv->opt_pl);
        emit_reshard(p, v, shard, pv->buf, &pv->opt_pl, &pv->store_pl, MS_PROG_PARAM_SYNC);
    }
}

static void build_forward(ms_program *p) {
    ms_graph *g = p->g;
    /* Parameters persist; inputs too, except micro-batched, where each slot has its own. */
    for (int v = 0; v < g->nv; v++) {
        pvalue *pv = &p->pv[v];
        pv->master_buf = pv->up_buf = -1;
        if (g->v[v].kind != GV_ACT)
            pv->buf = new_buf(p, v, held_pl(p, v), g->v[v].kind == GV_PARAM || !p->micro);
        if (g->v[v].kind == GV_PARAM && p->bf16) {
            pv->master_buf = new_typed_buf(p, &g->v[v].shape, &pv->opt_pl, true, MS_F32);
            if (p->master_host) {
                /* the master and its rounding in host memory; the device keeps the bf16 use
                 * copy alone */
                pv->up_buf = new_typed_buf(p, &g->v[v].shape, &pv->opt_pl, true, MS_BF16);
                p->bufs[pv->master_buf].on_host = p->bufs[pv->up_buf].on_host = true;
                pv->up_stale = true;
            }
        }
    }
    for (int k = 0; k < g->nn; k++) {
        gnode *nd = &g->n[k];
        pnode *pn = &p->pn[k];
        for (int i = 0; i < nd->n_in; i++) {
            pvalue *iv = &p->pv[nd->in[i]];
            const ms_placements *held = held_pl(p, nd->in[i]);
            if (ms_placements_eq(held, &pn->req_in[i])) {
                pn->in_buf[i] = iv->buf;
            } else {
                pn->in_buf[i] = new_buf(p, nd->in[i], &pn->req_in[i], false);
                emit_reshard(p, nd->in[i], iv->buf, pn->in_buf[i], held, &pn->req_in[i],
                             MS_PROG_FORWARD);
                /* a ZeRO-3 parameter: gathered for this use only, again for the backward */
                pn->gathered[i] = !ms_placements_eq(held, &iv->pl);
                p->ins[p->ni - 1].gather = pn->gathered[i];
            }
        }
        ms_op_call call;
        ms_tensor tin[MS_OP_MAX_IN], tout[MS_OP_MAX_OUT];
        ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT];
        fake_call(p, k, &call, tin, tout, gin, gout);
        int64_t saved[MS_OP_MAX_SAVED] = {0};
        const ms_op_def *def = ms_op_get(nd->op);
        if (def->saved_floats) def->saved_floats(&nd->attrs, &call, saved);
        for (int s = 0; s < MS_OP_MAX_SAVED; s++)
            pn->saved_buf[s] = saved[s] ? new_raw_buf(p, saved[s]) : -1;
        for (int o = 0; o < nd->n_out; o++)
            pn->out_buf[o] = new_buf(p, nd->out[o], &pn->out_pl[o], false);
        instr *in = emit(p, I_FWD, MS_PROG_FORWARD);
        in->node = k;
        memcpy(in->kb.in, pn->in_buf, sizeof in->kb.in);
        memcpy(in->kb.out, pn->out_buf, sizeof in->kb.out);
        memcpy(in->kb.saved, pn->saved_buf, sizeof in->kb.saved);
        pn->bw = in->kb;
        for (int o = 0; o < nd->n_out; o++) {
            pvalue *ov = &p->pv[nd->out[o]];
            if (ms_placements_eq(&ov->pl, &pn->out_pl[o])) {
                ov->buf = pn->out_buf[o];
                if (g->v[nd->out[o]].keep) p->bufs[ov->buf].persistent = true;
            } else {
                ov->buf = new_buf(p, nd->out[o], &ov->pl, g->v[nd->out[o]].keep);
                emit_reshard(p, nd->out[o], pn->out_buf[o], ov->buf, &pn->out_pl[o], &ov->pl,
                             MS_PROG_FORWARD);
            }
        }
    }
    /* The loss, replicated, for reporting. */
    if (g->loss >= 0) {
        pvalue *lv = &p->pv[g->loss];
        ms_placements r = ms_placements_replicated(p->mesh->ndim);
        p->loss_buf = new_buf(p, g->loss, &r, false);
        emit_reshard(p, g->loss, lv->buf, p->loss_buf, &lv->pl, &r, MS_PROG_LOSS);
    }
    prefetch_gathers(p, 0, p->ni);
    p->n_forward = p->ni;
}

/* --- activation recompute ------------------------------------------------------------------ */

/* Which nodes the backward recomputes: rc_first[k] is the first node of the region node k runs
 * in, under the outermost kind opts->recompute selects, or -1. A region's nodes are
 * consecutive (the builder records them between begin and end). */
static void mark_recompute(ms_program *p, unsigned kinds) {
    ms_graph *g = p->g;
    if (!kinds || !g->nn) return;
    p->rc_first = xmalloc(sizeof(int) * (size_t)g->nn);
    p->rc_buf = xmalloc(sizeof(int) * (size_t)g->nv);
    for (int v = 0; v < g->nv; v++) p->rc_buf[v] = -1;
    for (int k = 0; k < g->nn; k++) {
        p->rc_first[k] = -1;
        for (int r = 0; r < MS_REGION_KIND_COUNT && p->rc_first[k] < 0; r++) {
            int id = g->n[k].region[r];
            if (!(kinds >> r & 1) || id < 0) continue;
            bool same = k > 0 && g->n[k - 1].region[r] == id;
            p->rc_first[k] = same ? p->rc_first[k - 1] : k;
        }
    }
}

/* A value's buffer as the recompute reads it: the recomputed one inside the region, the kept
 * one (a region input, a parameter) outside it. */
static int recompute_src(const ms_program *p, int v) {
    return p->rc_buf[v] >= 0 ? p->rc_buf[v] : p->pv[v].buf;
}

/* Node k's forward again, with its input and output reshards, into fresh buffers; its
 * backward will read those (pn->bw), so the forward's copies die after their forward uses. */
static void recompute_node(ms_program *p, int k) {
    ms_graph *g = p->g;
    gnode *nd = &g->n[k];
    pnode *pn = &p->pn[k];
    kbufs b;
    memset(&b, -1, sizeof b); /* every slot -1: no buffer */
    for (int i = 0; i < nd->n_in; i++) {
        int v = nd->in[i];
        pvalue *iv = &p->pv[v];
        int src = recompute_src(p, v);
        /* a recomputed value lies in its placements; anything else as stored (a ZeRO-3
         * parameter as its shard, gathered again for this use) */
        bool fresh = p->rc_buf[v] >= 0;
        const ms_placements *held = fresh ? &iv->pl : held_pl(p, v);
        if (ms_placements_eq(held, &pn->req_in[i])) {
            b.in[i] = src;
            continue;
        }
        b.in[i] = new_buf(p, v, &pn->req_in[i], false);
        emit_reshard(p, v, src, b.in[i], held, &pn->req_in[i], MS_PROG_RECOMPUTE);
        p->ins[p->ni - 1].gather = !fresh && !ms_placements_eq(held, &iv->pl);
    }
    for (int s = 0; s < MS_OP_MAX_SAVED; s++)
        b.saved[s] = pn->saved_buf[s] >= 0 ? new_raw_buf(p, p->bufs[pn->saved_buf[s]].nfloats) : -1;
    for (int o = 0; o < nd->n_out; o++) b.out[o] = new_buf(p, nd->out[o], &pn->out_pl[o], false);
    instr *in = emit(p, I_FWD, MS_PROG_RECOMPUTE);
    in->node = k;
    in->kb = pn->bw = b;
    for (int o = 0; o < nd->n_out; o++) {
        pvalue *ov = &p->pv[nd->out[o]];
        int v = nd->out[o];
        if (ms_placements_eq(&ov->pl, &pn->out_pl[o])) {
            p->rc_buf[v] = b.out[o];
            continue;
        }
        p->rc_buf[v] = new_buf(p, v, &ov->pl, false);
        emit_reshard(p, v, b.out[o], p->rc_buf[v], &pn->out_pl[o], &ov->pl, MS_PROG_RECOMPUTE);
    }
}

/* Called as the backward reaches node k (nodes in reverse): entering a recomputed region
 * from its end, runs the whole region's forward again first. Reshards inside it are
 * collectives, so every rank re-runs them, in the same order. */
static void recompute_region(ms_program *p, int k, int *last_region) {
    if (!p->rc_first || p->rc_first[k] < 0 || p->rc_first[k] == *last_region) return;
    int lo = *last_region = p->rc_first[k];
    for (int j = lo; j <= k; j++) recompute_node(p, j);
    for (int j = lo; j <= k; j++)
        for (int o = 0; o < p->g->n[j].n_out; o++) p->rc_buf[p->g->n[j].out[o]] = -1;
}

static ms_placements dual_placements(const pnode *pn, int m_ndim, int n_in, int n_out, int i,
                                     bool output) {
    return ms_rule_dual_placements(pn->cand, m_ndim, n_in, n_out, i, output);
}

/* Gives value v its gradient buffer in placement pl (zeroed where it is first written). */
static int grad_target(ms_program *p, int v, const ms_placements *pl) {
    pvalue *pv = &p->pv[v];
    bool param = p->g->v[v].kind == GV_PARAM;
    pv->has_grad = true;
    pv->gpl = *pl;
    if (param && ms_placements_eq(pl, &pv->grad_pl))
        pv->gbuf = pv->param_grad_buf;
    else
        pv->gbuf = new_buf(p, v, pl, param && p->micro);
    /* Micro-batched, a parameter's gradient accumulates: ms_program_zero_grads clears it. */
    if (!(param && p->micro)) emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = pv->gbuf;
    return pv->gbuf;
}

/* A kernel's parameter gradients, deferred to the weight pass (split_w). */
typedef struct deferred_w {
    int node;
    int dout[MS_OP_MAX_OUT], din[MS_OP_MAX_IN], pending[MS_OP_MAX_IN];
} deferred_w;

/* One backward kernel writing the gradients din (-1: not this time). A gradient arriving in
 * another placement than the value's (pending) is written to its own zeroed buffer, then
 * resharded to the value's and added. */
static void emit_bwd(ms_program *p, int k, const int *dout, const int *din, const int *pending) {
    gnode *nd = &p->g->n[k];
    pnode *pn = &p->pn[k];
    const int md = p->mesh->ndim;
    int again[MS_OP_MAX_IN];
    for (int i = 0; i < MS_OP_MAX_IN; i++) again[i] = -1;
    for (int i = 0; i < nd->n_in; i++) {
        if (pending[i] >= 0) emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = pending[i];
        if (!pn->gathered[i]) continue;
        /* ZeRO 3: the forward's gathered copy is gone; gather the parameter again */
        int v = nd->in[i];
        again[i] = new_buf(p, v, &pn->req_in[i], false);
        emit_reshard(p, v, p->pv[v].buf, again[i], &p->pv[v].store_pl, &pn->req_in[i],
                     MS_PROG_BACKWARD);
        p->ins[p->ni - 1].gather = true;
    }
    instr *in = emit(p, I_BWD, MS_PROG_BACKWARD);
    in->node = k;
    in->kb = pn->bw;
    for (int i = 0; i < nd->n_in; i++)
        if (again[i] >= 0) in->kb.in[i] = again[i]; /* ZeRO 3: the gathered copy */
    memcpy(in->dout_buf, dout, sizeof in->dout_buf);
    memcpy(in->din_buf, din, sizeof in->din_buf);
    for (int i = 0; i < nd->n_in; i++) {
        if (pending[i] < 0) continue;
        pvalue *iv = &p->pv[nd->in[i]];
        ms_placements got = dual_placements(pn, md, nd->n_in, nd->n_out, i, false);
        int tmp = new_buf(p, nd->in[i], &iv->gpl, false);
        emit_reshard(p, nd->in[i], pending[i], tmp, &got, &iv->gpl, MS_PROG_BACKWARD);
        instr *add = emit(p, I_ADD, MS_PROG_BACKWARD);
        add->src = tmp;
        add->dst = iv->gbuf;
    }
}

static void build_backward(ms_program *p) {
    ms_graph *g = p->g;
    const int md = p->mesh->ndim;
    for (int v = 0; v < g->nv; v++) {
        gvalue *gv = &g->v[v];
        p->pv[v].requires_grad = gv->kind == GV_PARAM || gv->grad_input;
        if (gv->kind == GV_PARAM) p->pv[v].param_grad_buf = new_buf(p, v, &p->pv[v].grad_pl, true);
    }
    for (int k = 0; k < g->nn; k++) {
        gnode *nd = &g->n[k];
        bool rg = false;
        for (int i = 0; i < nd->n_in; i++) rg |= p->pv[nd->in[i]].requires_grad;
        for (int o = 0; o < nd->n_out; o++) p->pv[nd->out[o]].requires_grad = rg;
    }
    if (g->loss >= 0) {
        /* Seed: d loss / d loss = 1, replicated (the dual of any partial placement). */
        ms_placements r = ms_placements_replicated(md);
        int seed = grad_target(p, g->loss, &r);
        p->ins[p->ni - 1].kind = I_SEED;
        p->ins[p->ni - 1].dst = seed;
    } else {
        /* An output: its gradient arrives from the next chunk, in the output's placements. */
        p->out_grad_buf = grad_target(p, g->output, &p->pv[g->output].pl);
        p->ni--; /* no zeroing: the caller writes it */
    }
    /* Split (zb-h1): each kernel's parameter gradients are deferred to a second pass. */
    deferred_w *dw = p->split_w ? xmalloc(sizeof *dw * (size_t)(g->nn + 1)) : NULL;
    int ndw = 0, last_region = -1;
    for (int k = g->nn - 1; k >= 0; k--) {
        recompute_region(p, k, &last_region);
        gnode *nd = &g->n[k];
        pnode *pn = &p->pn[k];
        const ms_op_def *def = ms_op_get(nd->op);
        bool any_out = false, any_in = false;
        for (int o = 0; o < nd->n_out; o++) any_out |= p->pv[nd->out[o]].has_grad;
        for (int i = 0; i < nd->n_in; i++)
            any_in |= p->pv[nd->in[i]].requires_grad && (def->grad_inputs >> i & 1);
        if (!any_out || !any_in) continue;
        int dout[MS_OP_MAX_OUT], din[MS_OP_MAX_IN], pending[MS_OP_MAX_IN];
        for (int o = 0; o < MS_OP_MAX_OUT; o++) dout[o] = -1; /* unused slots: no buffer */
        for (int i = 0; i < MS_OP_MAX_IN; i++) din[i] = pending[i] = -1;
        for (int o = 0; o < nd->n_out; o++) {
            pvalue *ov = &p->pv[nd->out[o]];
            ms_placements want = dual_placements(pn, md, nd->n_in, nd->n_out, o, true);
            if (!ov->has_grad) {
                dout[o] = new_buf(p, nd->out[o], &want, false);
                emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = dout[o];
            } else if (ms_placements_eq(&ov->gpl, &want)) {
                dout[o] = ov->gbuf;
            } else {
                dout[o] = new_buf(p, nd->out[o], &want, false);
                emit_reshard(p, nd->out[o], ov->gbuf, dout[o], &ov->gpl, &want, MS_PROG_BACKWARD);
            }
        }
        for (int i = 0; i < nd->n_in; i++) {
            din[i] = pending[i] = -1;
            pvalue *iv = &p->pv[nd->in[i]];
            if (!iv->requires_grad || !(def->grad_inputs >> i & 1)) continue;
            ms_placements got = dual_placements(pn, md, nd->n_in, nd->n_out, i, false);
            if (!iv->has_grad) {
                din[i] = grad_target(p, nd->in[i], &got);
            } else if (ms_placements_eq(&iv->gpl, &got)) {
                din[i] = iv->gbuf;
            } else {
                din[i] = pending[i] = new_buf(p, nd->in[i], &got, false);
            }
        }
        if (p->split_w) {
            /* This pass: the input gradients; the parameters' go to the second pass. */
            deferred_w *d = &dw[ndw];
            d->node = k;
            memcpy(d->dout, dout, sizeof dout);
            bool any_w = false, any_b = false;
            for (int i = 0; i < MS_OP_MAX_IN; i++) {
                bool w = i < nd->n_in && din[i] >= 0 && g->v[nd->in[i]].kind == GV_PARAM;
                d->din[i] = w ? din[i] : -1;
                d->pending[i] = w ? pending[i] : -1;
                if (w) din[i] = pending[i] = -1;
                any_w |= w;
                any_b |= din[i] >= 0;
            }
            if (any_w) ndw++;
            if (any_b) emit_bwd(p, k, dout, din, pending);
        } else {
            emit_bwd(p, k, dout, din, pending);
        }
    }
    /* Gradients of activation inputs, in the inputs' own placements (what the previous
     * chunk's output has). */
    for (int v = 0; v < g->nv; v++) {
        pvalue *pv = &p->pv[v];
        if (!g->v[v].grad_input) continue;
        if (pv->has_grad && ms_placements_eq(&pv->gpl, &pv->pl)) {
            p->in_grad_buf[v] = pv->gbuf;
            continue;
        }
        p->in_grad_buf[v] = new_buf(p, v, &pv->pl, false);
        if (pv->has_grad)
            emit_reshard(p, v, pv->gbuf, p->in_grad_buf[v], &pv->gpl, &pv->pl, MS_PROG_BACKWARD);
        else
            emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = p->in_grad_buf[v];
    }
    prefetch_gathers(p, p->n_forward, p->ni);
    p->n_weight = p->ni;
    /* The weight pass recomputes a region again rather than keep its activations from B. */
    last_region = -1;
    for (int i = 0; i < ndw; i++) {
        recompute_region(p, dw[i].node, &last_region);
        emit_bwd(p, dw[i].node, dw[i].dout, dw[i].din, dw[i].pending);
    }
    free(dw);
    prefetch_gathers(p, p->n_weight, p->ni);
    p->n_backward = p->ni;
    /* Gradients into the parameters' gradient placements (the data-parallel all-reduce, or
     * ZeRO's reduce-scatter). */
    for (int v = 0; v < g->nv; v++) {
        pvalue *pv = &p->pv[v];
        if (g->v[v].kind != GV_PARAM) continue;
        if (!pv->has_grad)
            emit(p, I_ZERO, MS_PROG_GRAD_SYNC)->dst = pv->param_grad_buf;
        else if (pv->gbuf != pv->param_grad_buf)
            emit_reshard(p, v, pv->gbuf, pv->param_grad_buf, &pv->gpl, &pv->grad_pl,
                         MS_PROG_GRAD_SYNC);
    }
    p->n_sync = p->ni;
    build_param_sync(p);
}

/* Whether instruction in reads or writes buffer b other than as an input's gradient. */
static bool uses_buf_besides_din(const ms_program *p, const instr *in, int b) {
    if (in->src == b || in->dst == b) return true;
    if (in->node < 0) return false;
    const gnode *nd = &p->g->n[in->node];
    for (int i = 0; i < nd->n_in; i++)
        if (in->kb.in[i] == b) return true;
    for (int o = 0; o < nd->n_out; o++)
        if (in->kb.out[o] == b) return true;
    for (int s = 0; s < MS_OP_MAX_SAVED; s++)
        if (in->kb.saved[s] == b) return true;
    for (int o = 0; o < MS_OP_MAX_OUT; o++)
        if (in->dout_buf[o] == b) return true;
    return false;
}

/* Whether instruction in reads or writes buffer b. */
static bool uses_buf(const ms_program *p, const instr *in, int b) {
    if (uses_buf_besides_din(p, in, b)) return true;
    for (int i = 0; i < MS_OP_MAX_IN; i++)
        if (in->din_buf[i] == b) return true;
    return false;
}

/* A gradient zeroed only for a backward kernel to add into it: when that kernel's op can write
 * the gradient whole (fresh_ok) and the buffer is nothing else of that call, the kernel writes
 * it (din_fresh) and the zeroing is dropped. The zeroings of the step's gradients moved about
 * as many bytes as the activations (4.3 GB for GPT-2 124M at 8 x 1024 under bf16); the kernels
 * that now write instead of add (the products' dA and dB) also read nothing back. */
static void fresh_gradients(ms_program *p) {
    for (int z = 0; z < p->ni; z++) {
        instr *zi = &p->ins[z];
        if (zi->kind != I_ZERO || zi->phase != MS_PROG_BACKWARD) continue;
        const int b = zi->dst;
        int k = z + 1;
        while (k < p->ni && !uses_buf(p, &p->ins[k], b)) k++;
        if (k == p->ni || p->ins[k].kind != I_BWD) continue;
        instr *w = &p->ins[k];
        const ms_op_def *def = ms_op_get(p->g->n[w->node].op);
        int slot = -1, uses = 0;
        for (int i = 0; i < MS_OP_MAX_IN; i++)
            if (w->din_buf[i] == b) slot = i, uses++;
        if (slot < 0 || uses != 1 || !(def->fresh_ok >> slot & 1u)) continue;
        if (uses_buf_besides_din(p, w, b)) continue;
        w->din_fresh |= 1u << slot;
        zi->dropped = true;
    }
}

/* --- memory plan ---------------------------------------------------------------------------- */

static void touch(ms_program *p, int b, int at) {
    if (b < 0) return;
    buf *bf = &p->bufs[b];
    if (bf->first < 0 || at < bf->first) bf->first = at;
    if (at > bf->last) bf->last = at;
}

static int cmp_size_desc(const void *a, const void *b, void *ctx) {
    const buf *bufs = ctx;
    int64_t x = bufs[*(const int *)a].nfloats, y = bufs[*(const int *)b].nfloats;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The arena and the persistent buffers come from the rank's device, so its in-use and peak
 * counters (the memory the views and traces report) include them. Without a device in the
 * rank context, plain aligned memory does. */
static void *program_alloc(ms_program *p, size_t bytes) {
    void *x = NULL;
    ms_error e;
    return ms_device_alloc(p->dev, bytes, &x, &e) == MS_OK ? x : NULL;
}

static void program_free(ms_program *p, void *x, size_t bytes) {
    if (x) ms_device_free(p->dev, x, bytes);
}

/* The most floats of step-lived buffers live at once, parameter gradients waiting for the
 * grad sync left out: what activations, their gradients and temporaries need. */
static size_t peak_activations(const ms_program *p) {
    bool *param_grad = xcalloc((size_t)p->nb + 1, sizeof(bool));
    for (int v = 0; v < p->g->nv; v++)
        if (p->g->v[v].kind == GV_PARAM && p->pv[v].has_grad) param_grad[p->pv[v].gbuf] = true;
    int64_t *delta = xcalloc((size_t)p->ni + 2, sizeof(int64_t));
    for (int b = 0; b < p->nb; b++) {
        const buf *bf = &p->bufs[b];
        if (bf->persistent || bf->first < 0 || param_grad[b]) continue;
        int64_t padded = (bf->nfloats + 15) / 16 * 16;
        delta[bf->first] += padded;
        delta[bf->last + 1] -= padded;
    }
    int64_t live = 0, peak = 0;
    for (int k = 0; k <= p->ni; k++) {
        live += delta[k];
        if (live > peak) peak = live;
    }
    free(delta);
    free(param_grad);
    return (size_t)peak;
}

static size_t padded_floats(const buf *bf) {
    return ((size_t)bf->nfloats + 15) / 16 * 16; /* 64-byte aligned */
}

/* Greedy by size: each of the buffers order[0..n) takes the lowest offset free during its
 * lifetime. Returns the floats the layout spans. */
static size_t place_buffers(buf *bufs, int *order, int n) {
    qsort_r(order, (size_t)n, sizeof(int), cmp_size_desc, bufs);
    size_t top = 0;
    for (int a = 0; a < n; a++) {
        buf *bf = &bufs[order[a]];
        size_t need = padded_floats(bf), off = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (int c = 0; c < a; c++) {
                buf *o = &bufs[order[c]];
                size_t oneed = padded_floats(o);
                bool live = !(o->last < bf->first || bf->last < o->first);
                if (live && off < o->offset + oneed && o->offset < off + need) {
                    off = o->offset + oneed;
                    moved = true;
                }
            }
        }
        bf->offset = off;
        if (off + need > top) top = off + need;
    }
    return top;
}

/* The pass, one call of a micro-batched program's caller, that instruction k runs in: the
 * forward, the backward (its input gradients), the weight gradients, the grad sync, the
 * parameter sync; ni is after the step. */
static int pass_of(const ms_program *p, int k) {
    return k < p->n_forward    ? 0
           : k < p->n_weight   ? 1
           : k < p->n_backward ? 2
           : k < p->n_sync     ? 3
           : k < p->ni         ? 4
                               : 5;
}

/* With a shared scratch (ms_compile_opts.inflight > 1): the step-lived buffers order[0..n)
 * that live within one pass go to the scratch, the rest (and what the caller moves in or out
 * of the micro-batch's arena between passes: its inputs, output, their gradients and the
 * loss) stay in the arena. Kept when inflight arenas and one scratch take less than inflight
 * arenas of the single layout (top floats); else every buffer goes back to that layout. */
static void split_scratch(ms_program *p, int *order, int n, size_t top) {
    bool *held = xcalloc((size_t)p->nb + 1, sizeof(bool));
    for (int v = 0; v < p->g->nv; v++) {
        if (p->g->v[v].kind == GV_INPUT) held[p->pv[v].buf] = true;
        if (p->in_grad_buf[v] >= 0) held[p->in_grad_buf[v]] = true;
    }
    if (p->g->output >= 0) held[p->pv[p->g->output].buf] = true;
    if (p->out_grad_buf >= 0) held[p->out_grad_buf] = true;
    if (p->loss_buf >= 0) held[p->loss_buf] = true;
    size_t *joint = xmalloc(sizeof(size_t) * (size_t)(n + 1));
    int *keep = xmalloc(sizeof(int) * (size_t)(n + 1)), nk = 0;
    int *scr = xmalloc(sizeof(int) * (size_t)(n + 1)), ns = 0;
    for (int a = 0; a < n; a++) {
        buf *bf = &p->bufs[order[a]];
        joint[a] = bf->offset;
        if (held[order[a]] || pass_of(p, bf->first) != pass_of(p, bf->last))
            keep[nk++] = order[a];
        else
            scr[ns++] = order[a];
    }
    size_t arena = place_buffers(p->bufs, keep, nk), scratch = place_buffers(p->bufs, scr, ns);
    double in = (double)p->inflight;
    if (ns > 0 && in * (double)arena + (double)scratch < in * (double)top) {
        for (int a = 0; a < ns; a++) p->bufs[scr[a]].scratch = true;
        p->arena_floats = arena;
        p->scratch_floats = scratch;
    } else {
        for (int a = 0; a < n; a++) p->bufs[order[a]].offset = joint[a];
    }
    free(scr);
    free(keep);
    free(joint);
    free(held);
}

/* Offsets of every buffer: step-lived ones in the arena (and the scratch), the rest in
 * persistent storage. */
static void layout_memory(ms_program *p) {
    for (int k = 0; k < p->ni; k++) {
        instr *in = &p->ins[k];
        touch(p, in->src, k);
        touch(p, in->dst, k);
        if (in->node >= 0) {
            gnode *nd = &p->g->n[in->node];
            for (int i = 0; i < nd->n_in; i++) touch(p, in->kb.in[i], k);
            for (int o = 0; o < nd->n_out; o++) touch(p, in->kb.out[o], k);
            for (int s = 0; s < MS_OP_MAX_SAVED; s++) touch(p, in->kb.saved[s], k);
            for (int o = 0; o < MS_OP_MAX_OUT; o++) touch(p, in->dout_buf[o], k);
            for (int i = 0; i < MS_OP_MAX_IN; i++) touch(p, in->din_buf[i], k);
        }
    }
    touch(p, p->loss_buf, p->ni); /* read after the step */
    /* Inputs are written before the first instruction, a chunk's output is read (sent) and
     * its gradient written between forward and backward, input gradients read after. */
    for (int v = 0; v < p->g->nv; v++) {
        if (p->g->v[v].kind == GV_INPUT) touch(p, p->pv[v].buf, 0);
        if (p->in_grad_buf[v] >= 0) touch(p, p->in_grad_buf[v], p->ni);
    }
    if (p->g->output >= 0) touch(p, p->pv[p->g->output].buf, p->n_forward);
    touch(p, p->out_grad_buf, p->n_forward);
    /* A deferred parameter sync runs between any two of the step's instructions. */
    for (int b = 0; b < p->nb && p->deferred_sync; b++)
        if (!p->bufs[b].persistent && p->bufs[b].first >= p->n_sync) p->bufs[b].first = 0;
    int *order = xmalloc(sizeof(int) * (size_t)p->nb);
    int n = 0;
    p->persist_floats = 0;
    for (int b = 0; b < p->nb; b++) {
        buf *bf = &p->bufs[b];
        size_t padded = padded_floats(bf);
        if (bf->on_host) {
            bf->offset = p->host_floats;
            p->host_floats += padded;
        } else if (bf->persistent) {
            bf->offset = p->persist_floats;
            p->persist_floats += padded;
        } else if (bf->first >= 0) {
            order[n++] = b;
            p->unplanned_floats += padded;
        }
    }
    p->arena_floats = place_buffers(p->bufs, order, n);
    if (p->micro && p->inflight > 1) split_scratch(p, order, n, p->arena_floats);
    free(order);
    p->activation_floats = peak_activations(p);
}

/* The arena and persistent storage behind the layout; every buffer's tensor becomes a view. */
static ms_status alloc_memory(ms_program *p, ms_error *err) {
    size_t top = p->arena_floats;
    /* Micro-batched, the caller binds an arena per micro-batch (ms_program_bind_arena). */
    p->arena = p->micro ? NULL : program_alloc(p, (top + 16) * sizeof(float));
    p->persist = program_alloc(p, (p->persist_floats + 16) * sizeof(float));
    if (p->staging_floats) p->staging = program_alloc(p, (p->staging_floats + 16) * sizeof(float));
    if ((!p->arena && !p->micro) || !p->persist || (p->staging_floats && !p->staging))
        return ms_fail(err, MS_ERR_NOMEM, "program: cannot allocate %zu + %zu + %zu bytes",
                       top * sizeof(float), p->persist_floats * sizeof(float),
                       p->staging_floats * sizeof(float));
    MS_CHECK(ms_device_zero(p->dev, p->persist, (p->persist_floats + 16) * sizeof(float), err));
    if (p->master_host) {
        size_t bytes = (p->host_floats + 16) * sizeof(float);
        MS_CHECK(ms_device_alloc(p->master_host, bytes, (void **)&p->host_persist, err));
        memset(p->host_persist, 0, bytes);
    }
    for (int b = 0; b < p->nb; b++) {
        buf *bf = &p->bufs[b];
        bf->ptr = bf->on_host      ? p->host_persist + bf->offset
                  : bf->persistent ? p->persist + bf->offset
                  : bf->scratch    ? NULL /* the caller binds it (micro-batched) */
                  : p->arena       ? p->arena + bf->offset
                                   : NULL;
        MS_CHECK(ms_tensor_wrap(bf->ptr, bf->dtype, bf->lshape.ndim, bf->lshape.d, &bf->t, err));
        if (bf->dtype == MS_BF16)
            MS_CHECK(
                ms_tensor_wrap(p->staging, MS_F32, bf->lshape.ndim, bf->lshape.d, &bf->wide, err));
    }
    return MS_OK;
}

/* --- gradient buckets ------------------------------------------------------------------------ */

/* Whether instruction in writes buffer b. */
static bool writes(const instr *in, int b) {
    if (in->dst == b) return true;
    for (int i = 0; in->kind == I_BWD && i < MS_OP_MAX_IN; i++)
        if (in->din_buf[i] == b) return true;
    return false;
}

/* The last backward instruction that writes buffer b: after it the gradient is final. */
static int final_write(const ms_program *p, int b) {
    for (int k = p->n_backward - 1; k >= p->n_forward; k--)
        if (writes(&p->ins[k], b)) return k;
    return p->n_backward - 1;
}

/* The rows a grad-sync reduce-scatter splits, when it splits the local buffer's dim 0 (ZeRO's
 * S(0) innermost: each member's block a contiguous run of rows) and this rank's block is the
 * target buffer; else 0. */
static int64_t scatter_rows(const ms_program *p, const instr *in) {
    const ms_rstep *st = &in->plan->steps[0];
    const buf *src = &p->bufs[in->src], *dst = &p->bufs[in->dst];
    if (st->after.p[st->mesh_dim].kind != MS_PL_SHARD || st->after.p[st->mesh_dim].dim != 0 ||
        src->lshape.ndim < 1 || src->lshape.d[0] < 1)
        return 0;
    int64_t rows = src->lshape.d[0], off, len;
    ms_split_part(rows, p->mesh->shape[st->mesh_dim], p->coords[st->mesh_dim], &off, &len);
    return len * (src->numel / rows) == dst->numel ? rows : 0;
}

/* A grad-sync reshard that is one all-reduce of same-sized buffers (the data-parallel
 * P -> R) or one reduce-scatter of dim 0 (ZeRO 2 and 3) can run in a bucket; anything else
 * (other shards, several steps) runs as a reshard at grad sync, as without buckets. */
static bool bucketable(const ms_program *p, const instr *in) {
    if (in->kind != I_RESHARD || in->phase != MS_PROG_GRAD_SYNC || !in->plan) return false;
    if (in->plan->nsteps != 1) return false;
    if (in->plan->steps[0].kind == MS_RSTEP_REDUCE_SCATTER) return scatter_rows(p, in) > 0;
    if (in->plan->steps[0].kind != MS_RSTEP_ALL_REDUCE) return false;
    return p->bufs[in->src].numel == p->bufs[in->dst].numel;
}

typedef struct ready_grad {
    int ready, ins;
} ready_grad;

static int cmp_ready(const void *a, const void *b) {
    const ready_grad *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return (x->ins > y->ins) - (x->ins < y->ins);
}

/* Groups the bucketable grad-sync all-reduces, in the order backward finishes their
 * gradients, into buckets of at most opts->bucket_mb MiB; their reshard instructions then only
 * collect the bucket's result (ms_gb_finish). The gradients stay live until grad sync as
 * before, so the memory plan is unchanged but for the buckets' own buffer. */
static void plan_grad_buckets(ms_program *p, const ms_compile_opts *opts) {
    ready_grad *rg = xmalloc(sizeof *rg * (size_t)(p->ni - p->n_backward + 1));
    int n = 0;
    for (int k = p->n_backward; k < p->ni; k++)
        if (bucketable(p, &p->ins[k])) rg[n++] = (ready_grad){final_write(p, p->ins[k].src), k};
    qsort(rg, (size_t)n, sizeof *rg, cmp_ready);
    int passes = p->passes;
    p->buckets = n ? ms_gb_create(opts->bucket_mb, passes) : NULL;
    for (int i = 0; i < n; i++) {
        instr *in = &p->ins[rg[i].ins];
        const ms_rstep *step = &in->plan->steps[0];
        ms_reduce_op op = (ms_reduce_op)step->before.p[step->mesh_dim].reduce;
        bool scatter = step->kind == MS_RSTEP_REDUCE_SCATTER;
        int64_t rows = scatter ? scatter_rows(p, in) : 0;
        int parts = scatter ? p->mesh->shape[step->mesh_dim] : 0;
        ms_comm_dtype dt = p->bufs[in->src].dtype == MS_BF16 ? MS_COMM_BF16 : MS_COMM_F32;
        int g = ms_gb_add_dt(p->buckets, rg[i].ready, p->bufs[in->src].numel, rows, parts,
                             step->mesh_dim, op, dt);
        in->bucket_grad = g + 1;
    }
    free(rg);
}

/* The buckets' buffer, and each gradient's source, target and communicator. */
static ms_status bind_grad_buckets(ms_program *p, ms_error *err) {
    if (!p->buckets) return MS_OK;
    size_t bytes = ms_gb_storage_bytes(p->buckets);
    p->bucket_storage = program_alloc(p, bytes + 64);
    if (!p->bucket_storage)
        return ms_fail(err, MS_ERR_NOMEM, "program: cannot allocate %zu bytes of gradient buckets",
                       bytes);
    for (int k = p->n_backward; k < p->ni; k++) {
        const instr *in = &p->ins[k];
        if (!in->bucket_grad) continue;
        ms_comm *comm = p->dm->dim_comm[in->plan->steps[0].mesh_dim];
        ms_gb_bind(p->buckets, in->bucket_grad - 1, p->bufs[in->src].ptr, p->bufs[in->dst].ptr,
                   comm);
    }
    ms_gb_bind_storage(p->buckets, p->bucket_storage);
    return MS_OK;
}

/* --- compile ---------------------------------------------------------------------------------- */

static void make_call(ms_program *p, const instr *in, ms_op_call *call, ms_shape *gin,
                      ms_shape *gout);

/* Each kernel instruction's FLOPs and bytes, once: the profiler and stats read them. */
static void compute_costs(ms_program *p) {
    for (int k = 0; k < p->ni; k++) {
        instr *in = &p->ins[k];
        if (in->kind != I_FWD && in->kind != I_BWD) continue;
        ms_op_call call;
        ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT];
        make_call(p, in, &call, gin, gout);
        const ms_op_def *def = ms_op_get(p->g->n[in->node].op);
        if (!def->cost) continue;
        ms_k_cost c = def->cost(&call, in->kind == I_BWD);
        double share = 1;
        if (in->kind == I_BWD && p->split_w) {
            /* A split backward: each pass is charged for the gradients it writes, an equal
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

/* Whether the host reads and writes buffer b in place: a host master, or any buffer of a
 * host-addressable device. */
static bool host_reachable(const ms_program *p, const buf *b) {
    return b->on_host || ms_device_host_addressable(p->dev);
}

/* The kernels that run on buffer b: the host's for host masters, else the rank device's. */
static ms_kctx *kernels_of(const ms_program *p, const buf *b) {
    return b->on_host ? p->hkc : p->kc;
}

/* The masters were written: under host masters their roundings are stale too. */
static void masters_written(ms_program *p) {
    p->params_dirty = p->bf16;
    for (int v = 0; p->master_host && v < p->g->nv; v++) p->pv[v].up_stale = true;
}

/* Philox values for a parameter's box, generated on the host (then moved to the device). */
static ms_status init_normal(ms_program *p, buf *b, const gvalue *gv, const int64_t *start,
                             ms_error *err) {
    if (host_reachable(p, b))
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
        if (gv->kind != GV_PARAM) continue;
        ms_placements pl;
        buf *b = &p->bufs[param_home(p, v, &pl)];
        if (gv->init.kind == MS_INIT_CONST) {
            MS_CHECK(MS_CALL_K(kernels_of(p, b), fill, b->ptr, gv->init.value, b->numel, err));
            continue;
        }
        int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
        ms_local_box(&pl, p->mesh, p->coords, gv->shape.ndim, gv->shape.d, start, len);
        MS_CHECK(init_normal(p, b, gv, start, err));
    }
    masters_written(p);
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
 * buffer layout and the kernels' costs. Both entry points run exactly this; only
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
    MS_CHECK(complete(p, opts, err));
    prog_assign_dtypes(p);
    zero_placements(p);
    build_forward(p);
    mark_recompute(p, opts ? opts->recompute : 0);
    build_backward(p);
    if (!(opts && opts->zero_all_grads)) fresh_gradients(p);
    if (opts && opts->bucket_mb > 0) plan_grad_buckets(p, opts); /* shapes-only: the planner's */
    layout_memory(p);
    p->staging_floats = prog_staging_floats(p);
    compute_costs(p);
    index_instructions(p);
    p->params = xmalloc(sizeof(int) * (size_t)g->nv);
    for (int v = 0; v < g->nv; v++)
        if (g->v[v].kind == GV_PARAM) p->params[p->nparams++] = v;
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
    MS_CHECK_GOTO(alloc_memory(p, err), st, fail);
    MS_CHECK_GOTO(bind_grad_buckets(p, err), st, fail);
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
    p->plans = p->own_plans = ms_plan_cache_create();
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
        program_free(p, p->bucket_storage, bytes);
    }
    for (int b = 0; b < p->nb; b++) {
        ms_tensor_release(&p->bufs[b].t);
        ms_tensor_release(&p->bufs[b].wide);
    }
    program_free(p, p->staging, (p->staging_floats + 16) * sizeof(float));
    free(p->bufs);
    free(p->ins);
    free(p->pv);
    free(p->pn);
    if (!p->micro) program_free(p, p->arena, (p->arena_floats + 16) * sizeof(float));
    free(p->in_grad_buf);
    free(p->zero_off), free(p->zero_len), free(p->zero_other), free(p->cast_items);
    program_free(p, p->persist, (p->persist_floats + 16) * sizeof(float));
    if (p->host_persist)
        ms_device_free(p->master_host, p->host_persist, (p->host_floats + 16) * sizeof(float));
    ms_kctx_destroy(p->hkc);
    free(p->params);
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

/* --- execution ------------------------------------------------------------------------------- */

/* A shapes-only program has no memory behind its buffers. */
static ms_status check_has_memory(const ms_program *p, ms_error *err) {
    if (p->shapes_only)
        return ms_fail(err, MS_ERR_INVALID, "program: compiled from shapes only, it cannot run");
    return MS_OK;
}

/* ... and, to run or feed, an arena (micro-batched programs are given theirs). */
static ms_status check_runnable(const ms_program *p, ms_error *err) {
    MS_CHECK(check_has_memory(p, err));
    if (!p->arena)
        return ms_fail(err, MS_ERR_INVALID,
                       "program: micro-batched, it needs an arena (ms_program_bind_arena) first");
    if (p->scratch_floats && !p->scratch)
        return ms_fail(err, MS_ERR_INVALID,
                       "program: its pass-lived buffers need a scratch (ms_program_bind_scratch) "
                       "first");
    return MS_OK;
}

/* Straight from the source buffer into the target buffer: the plan comes from the cache and
 * intermediate steps use the rank's workspace, so the step path allocates nothing. */
static ms_status run_reshard(ms_program *p, const instr *in, ms_error *err) {
    const ms_shape *g = &p->g->v[in->value].shape;
    const ms_reshard_plan *plan;
    MS_CHECK(ms_plan_cache_get(p->plans, p->mesh, &in->from, &in->to, g->ndim, g->d, &plan, err));
    return ms_reshard_run_dt(p->dm, plan, g->ndim, g->d, p->bufs[in->src].dtype,
                             p->bufs[in->src].ptr, p->bufs[in->dst].ptr, NULL, err);
}

static void make_call(ms_program *p, const instr *in, ms_op_call *call, ms_shape *gin,
                      ms_shape *gout) {
    gnode *nd = &p->g->n[in->node];
    pnode *pn = &p->pn[in->node];
    memset(call, 0, sizeof *call);
    call->attrs = &nd->attrs;
    call->n_in = nd->n_in;
    call->n_out = nd->n_out;
    call->mesh = p->dm;
    call->kc = p->kc;
    call->seed = p->draw;
    call->batch = p->batch;
    call->eval = p->eval;
    call->in_pl = pn->req_in;
    call->out_pl = pn->out_pl;
    for (int i = 0; i < nd->n_in; i++) {
        gin[i] = p->g->v[nd->in[i]].shape;
        call->in[i] = &p->bufs[in->kb.in[i]].t;
        int64_t len[MS_MAX_DIMS];
        ms_local_box(&pn->req_in[i], p->mesh, p->coords, gin[i].ndim, gin[i].d, call->in_start[i],
                     len);
        if (in->din_buf[i] >= 0) call->din[i] = &p->bufs[in->din_buf[i]].t;
    }
    for (int o = 0; o < nd->n_out; o++) {
        gout[o] = p->g->v[nd->out[o]].shape;
        call->out[o] = &p->bufs[in->kb.out[o]].t;
        int64_t len[MS_MAX_DIMS];
        ms_local_box(&pn->out_pl[o], p->mesh, p->coords, gout[o].ndim, gout[o].d,
                     call->out_start[o], len);
        if (in->dout_buf[o] >= 0) call->dout[o] = &p->bufs[in->dout_buf[o]].t;
    }
    for (int s = 0; s < MS_OP_MAX_SAVED; s++)
        if (in->kb.saved[s] >= 0) call->saved[s] = &p->bufs[in->kb.saved[s]].t;
    call->din_fresh = in->din_fresh;
    call->gin = gin;
    call->gout = gout;
}

/* One event per kernel and per reshard; reshards carry a flow id that the communicator
 * probes stamp on the collectives they run. */
static void record(ms_program *p, const instr *in, int64_t t0, uint64_t flow, uint64_t corr) {
    ms_event e;
    memset(&e, 0, sizeof e);
    e.t0_ns = t0;
    e.t1_ns = ms_now_ns();
    if (in->kind == I_FWD || in->kind == I_BWD) {
        const gnode *nd = &p->g->n[in->node];
        e.kind = MS_EV_OP;
        e.phase = in->kind == I_FWD ? MS_PHASE_FORWARD : MS_PHASE_BACKWARD; /* recompute too */
        e.u.op.op = nd->op;
        ms_ev_strcpy(e.u.op.name, sizeof e.u.op.name, NULL, nd->name);
        ms_ev_strcpy(e.u.op.opname, sizeof e.u.op.opname, NULL, ms_op_get(nd->op)->name);
        e.u.op.flops = in->flops;
        e.u.op.bytes = in->bytes;
        e.u.op.corr = corr;
    } else {
        e.kind = MS_EV_RESHARD;
        e.phase = in->phase == MS_PROG_FORWARD || in->phase == MS_PROG_RECOMPUTE ? MS_PHASE_FORWARD
                  : in->phase == MS_PROG_BACKWARD                                ? MS_PHASE_BACKWARD
                                                                                 : MS_PHASE_OTHER;
        ms_ev_strcpy(e.u.reshard.tensor, sizeof e.u.reshard.tensor, moves_grad(in) ? "grad:" : NULL,
                     p->g->v[in->value].name);
        ms_placements_str(&in->from, e.u.reshard.from, sizeof e.u.reshard.from);
        ms_placements_str(&in->to, e.u.reshard.to, sizeof e.u.reshard.to);
        e.u.reshard.bytes = (uint64_t)in->coll_bytes;
        e.u.reshard.flow = flow;
        if (in->plan) e.u.reshard.nsteps = in->plan->nsteps;
    }
    ms_trace_emit(&p->ctx->trace, &e);
}

/* Zeroing on the rank's threads (core/parallel.h) on the host, by the device elsewhere. */
static void zero_range(void *arg, int64_t lo, int64_t hi) {
    memset((float *)arg + lo, 0, sizeof(float) * (size_t)(hi - lo));
}

static ms_status zero_buf(ms_program *p, const buf *b, ms_error *err) {
    if (ms_device_host_addressable(p->dev)) {
        ms_parallel_for(b->nfloats, 1 << 16, zero_range, b->ptr);
        return MS_OK;
    }
    return ms_device_zero(p->dev, b->ptr, sizeof(float) * (size_t)b->nfloats, err);
}

/* Parameter v's host master into its host rounding, with kc (a host kernel context). */
static ms_status round_master(ms_program *p, int v, ms_kctx *kc, ms_error *err) {
    pvalue *pv = &p->pv[v];
    const buf *m = &p->bufs[pv->master_buf];
    MS_CHECK(MS_CALL_K(kc, bf16_round, (uint16_t *)p->bufs[pv->up_buf].ptr, m->ptr, m->numel, err));
    pv->up_stale = false;
    return MS_OK;
}

/* A host master's cast: its rounding (made now if the master changed since) copied up into
 * the use copy, or into the shard its gather reads. */
static ms_status cast_from_host(ms_program *p, const instr *in, ms_error *err) {
    const pvalue *pv = &p->pv[in->value];
    if (pv->up_stale) MS_CHECK(round_master(p, in->value, p->hkc, err));
    const buf *d = &p->bufs[in->dst];
    return ms_device_copy(p->dev, d->ptr, p->bufs[pv->up_buf].ptr,
                          sizeof(uint16_t) * (size_t)d->numel, MS_COPY_HOST_TO_DEVICE, err);
}

ms_status ms_program_round_master(ms_program *p, int i, ms_kctx *kc, ms_error *err) {
    if (!p->member || p->shapes_only || i < 0 || i >= p->nparams) return MS_OK;
    int v = p->params[i];
    return p->pv[v].up_buf >= 0 ? round_master(p, v, kc, err) : MS_OK;
}

/* Instructions other than kernels and reshards, through the device and its kernel table. */
static ms_status run_data_instr(ms_program *p, const instr *in, ms_error *err) {
    buf *d = &p->bufs[in->dst];
    const buf *s = in->src >= 0 ? &p->bufs[in->src] : NULL;
    switch (in->kind) {
        case I_ZERO:
            return zero_buf(p, d, err);
        case I_SEED:
            return MS_CALL_K(p->kc, fill, d->ptr, p->loss_scale, d->numel, err);
        case I_COPY:
            return ms_device_copy(p->dev, d->ptr, s->ptr + in->src_off,
                                  sizeof(float) * (size_t)d->nfloats, MS_COPY_DEVICE_TO_DEVICE,
                                  err);
        case I_ADD:
            if (d->dtype == MS_BF16)
                return MS_CALL_K(p->kc, bf16_accumulate, (uint16_t *)d->ptr,
                                 (const uint16_t *)s->ptr, d->numel, err);
            return MS_CALL_K(p->kc, accumulate, d->ptr, s->ptr, d->numel, err);
        case I_CAST:
            if (s->on_host) return cast_from_host(p, in, err);
            return MS_CALL_K(p->kc, bf16_round, (uint16_t *)d->ptr, s->ptr, d->numel, err);
        default:
            return ms_fail(err, MS_ERR_INTERNAL, "program: instruction %d is no data move",
                           (int)in->kind);
    }
}

/* Cast k and the casts after it before upto whose masters are on the device (each parameter's,
 * one after another in the parameter sync: 148 for GPT-2; under ZeRO 1 and 2 each is followed
 * by its gather) as one list, one launch on a GPU; a cast alone, or from a host master, by
 * itself. Returns how many it ran in *ran. */
static ms_status run_casts(ms_program *p, int k, int upto, int *ran, ms_error *err) {
    int n = 0;
    for (int j = k; j < upto && p->ins[j].kind == I_CAST && !p->bufs[p->ins[j].src].on_host; j++)
        n++;
    *ran = n > 1 ? n : 1;
    if (n <= 1) return run_data_instr(p, &p->ins[k], err);
    if (n > p->cast_cap) {
        free(p->cast_items);
        p->cast_items = xmalloc(sizeof *p->cast_items * (size_t)n);
        p->cast_cap = n;
    }
    for (int i = 0; i < n; i++) {
        const instr *in = &p->ins[k + i];
        const buf *d = &p->bufs[in->dst];
        p->cast_items[i] = (ms_k_cast_item){
            .dst = (uint16_t *)d->ptr, .src = p->bufs[in->src].ptr, .n = (size_t)d->numel};
    }
    return MS_CALL_K(p->kc, bf16_round_list, p->cast_items, n, err);
}

/* The loss, read back to the host after the kernels that wrote it have finished. */
static ms_status read_loss(ms_program *p, float *loss, ms_error *err) {
    MS_CHECK(ms_kctx_sync(p->kc, err));
    return ms_device_copy(p->dev, loss, p->bufs[p->loss_buf].ptr, sizeof(float),
                          MS_COPY_DEVICE_TO_HOST, err);
}

static ms_status run(ms_program *p, int from, int upto, float *loss, ms_error *err);

/* bf16: the use copies follow the masters before anything reads them. Every member writes
 * its masters through the same calls, so all agree on when this runs (it may gather). */
static ms_status refresh_use_copies(ms_program *p, int from, ms_error *err) {
    if (!p->params_dirty || from >= p->n_sync) return MS_OK;
    p->params_dirty = false;
    return run(p, p->n_sync, p->ni, NULL, err);
}

/* Whether instruction in reads buffer b (kernel inputs and saved values, a copy's source). */
static bool reads_buf(const instr *in, int b) {
    if (in->src == b) return true;
    if (in->kind != I_FWD && in->kind != I_BWD) return false;
    for (int j = 0; j < MS_OP_MAX_IN; j++)
        if (in->kb.in[j] == b) return true;
    for (int j = 0; j < MS_OP_MAX_SAVED; j++)
        if (in->kb.saved[j] == b) return true;
    return false;
}

static void find_first_uses(ms_program *p) {
    if (p->param_first) return;
    p->param_first = xmalloc(sizeof *p->param_first * (size_t)(p->nparams ? p->nparams : 1));
    for (int i = 0; i < p->nparams; i++) {
        int b = p->pv[p->params[i]].buf, k = 0;
        while (k < p->n_sync && !reads_buf(&p->ins[k], b)) k++;
        p->param_first[i] = k;
    }
}

/* Tells the hook about every parameter first read by instruction k. */
static ms_status announce_uses(ms_program *p, int k, ms_error *err) {
    /* the hook may remove itself once every parameter is in */
    for (int i = 0; i < p->nparams && p->param_use; i++)
        if (p->param_first[i] == k) MS_CHECK(p->param_use(p->param_use_arg, i, err));
    return MS_OK;
}

/* --- gradients final during backward (ms_program_on_grad_final) ----------------------------- */

static ms_status tell_grad_final(ms_program *p, int i, ms_error *err) {
    if (p->gf_told[i] || !p->grad_final) return MS_OK;
    p->gf_told[i] = true;
    return p->grad_final(p->grad_final_arg, i, err);
}

static ms_status bucket_grad_done(void *arg, int g, ms_error *err) {
    ms_program *p = arg;
    return tell_grad_final(p, p->gf_bucket_param[g], err);
}

/* After backward instruction k: the gradients it finished on its step's last pass, and those
 * whose bucket's collective is over. */
static ms_status grads_final_after(ms_program *p, int k, ms_error *err) {
    for (int i = 0; i < p->nparams; i++)
        if (p->gf_last[i] == k && ++p->gf_hits[i] == p->passes)
            MS_CHECK(tell_grad_final(p, i, err));
    return ms_gb_poll(p->buckets, bucket_grad_done, p, err);
}

static int param_index(const ms_program *p, int v) {
    for (int i = 0; i < p->nparams; i++)
        if (p->params[i] == v) return i;
    return -1;
}

/* Where each parameter's gradient becomes final: its last backward write when it is already
 * in its stored placement, else its grad sync (bucketed or not). */
static void find_grad_finals(ms_program *p) {
    if (p->gf_last) return;
    size_t n = (size_t)(p->nparams ? p->nparams : 1);
    p->gf_last = xmalloc(sizeof *p->gf_last * n);
    p->gf_hits = xcalloc(n, sizeof *p->gf_hits);
    p->gf_told = xcalloc(n, sizeof *p->gf_told);
    for (int i = 0; i < p->nparams; i++) {
        const pvalue *pv = &p->pv[p->params[i]];
        bool direct = pv->has_grad && pv->gbuf == pv->param_grad_buf;
        p->gf_last[i] = direct ? final_write(p, pv->param_grad_buf) : -1;
    }
    int nb = p->buckets ? ms_gb_count(p->buckets) : 0;
    p->gf_bucket_param = xcalloc((size_t)(nb ? nb : 1), sizeof *p->gf_bucket_param);
    for (int k = p->n_backward; k < p->n_sync; k++)
        if (p->ins[k].bucket_grad)
            p->gf_bucket_param[p->ins[k].bucket_grad - 1] = param_index(p, p->ins[k].value);
}

void ms_program_on_grad_final(ms_program *p, ms_param_use_fn fn, void *arg) {
    if (fn && p->member && !p->shapes_only) find_grad_finals(p);
    p->grad_final = p->gf_last ? fn : NULL;
    p->grad_final_arg = arg;
}

static ms_status run(ms_program *p, int from, int upto, float *loss, ms_error *err) {
    if (!p->member) return MS_OK;
    MS_CHECK(check_runnable(p, err));
    MS_CHECK(refresh_use_copies(p, from, err));
    const bool rec = ms_trace_on(&p->ctx->trace);
    for (int k = from; k < upto; k++) {
        instr *in = &p->ins[k];
        ms_status st = MS_OK;
        int64_t t0 = 0;
        uint64_t flow = 0, corr = 0;
        if (p->param_use && k < p->n_sync) MS_CHECK(announce_uses(p, k, err));
        if (rec && (in->kind == I_RESHARD || in->kind == I_FWD || in->kind == I_BWD)) {
            t0 = ms_now_ns();
            /* Reshards link to their collectives (flow), kernels to their GPU work (corr). */
            uint64_t id = ((uint64_t)p->ctx->rank << 40) | ++p->flow_counter;
            if (in->kind == I_RESHARD) {
                flow = id;
                p->ctx->trace.flow = flow;
            } else if (p->ctx->trace.gpu_push) {
                corr = id;
                p->ctx->trace.gpu_push(corr);
            }
        }
        switch (in->kind) {
            case I_RESHARD:
                st = in->bucket_grad ? ms_gb_finish(p->buckets, in->bucket_grad - 1, err)
                                     : run_reshard(p, in, err);
                break;
            case I_ZERO:
                if (in->dropped) break;
                st = run_data_instr(p, in, err);
                break;
            case I_CAST: {
                int ran = 1;
                st = run_casts(p, k, upto, &ran, err);
                k += ran - 1; /* the run's other casts are done: nothing else to record */
                break;
            }
            case I_SEED:
            case I_COPY:
            case I_ADD:
                st = run_data_instr(p, in, err);
                break;
            case I_FWD:
            case I_BWD: {
                ms_op_call call;
                ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT];
                make_call(p, in, &call, gin, gout);
                st = prog_run_kernel(p, in, &call, err);
                if (st != MS_OK) st = ms_fail_wrap(err, st, "%s", p->g->n[in->node].name);
                break;
            }
        }
        if (rec && t0) {
            p->ctx->trace.flow = 0;
            if (corr) p->ctx->trace.gpu_pop();
            record(p, in, t0, flow, corr);
        }
        if (st == MS_OK && p->buckets && k < p->n_backward) st = ms_gb_after(p->buckets, k, err);
        if (st == MS_OK && p->grad_final && k >= p->n_forward && k < p->n_backward)
            st = grads_final_after(p, k, err);
        if (st != MS_OK) return st;
    }
    if (loss && p->loss_buf >= 0 && upto >= p->n_forward) return read_loss(p, loss, err);
    return MS_OK;
}

ms_status ms_program_step(ms_program *p, float *loss, ms_error *err) {
    if (p->member && p->micro) MS_CHECK(ms_program_zero_grads(p, err));
    return run(p, 0, p->n_sync, loss, err);
}

ms_status ms_program_forward(ms_program *p, float *loss, ms_error *err) {
    return run(p, 0, p->n_forward, loss, err);
}

ms_status ms_program_backward(ms_program *p, ms_error *err) {
    return run(p, p->n_forward, p->n_backward, NULL, err);
}

ms_status ms_program_backward_input(ms_program *p, ms_error *err) {
    return run(p, p->n_forward, p->n_weight, NULL, err);
}

ms_status ms_program_backward_weight(ms_program *p, ms_error *err) {
    return run(p, p->n_weight, p->n_backward, NULL, err);
}

ms_status ms_program_grad_sync(ms_program *p, ms_error *err) {
    MS_CHECK(run(p, p->n_backward, p->n_sync, NULL, err));
    /* every gradient is final now: the rest are told (once each) */
    for (int i = 0; p->member && p->grad_final && i < p->nparams; i++)
        MS_CHECK(tell_grad_final(p, i, err));
    return MS_OK;
}

ms_status ms_program_param_sync(ms_program *p, ms_error *err) {
    p->params_dirty = false;
    return run(p, p->n_sync, p->ni, NULL, err);
}

ms_status ms_program_param_sync_one(ms_program *p, int i, ms_error *err) {
    if (!p->member || p->shapes_only || i < 0 || i >= p->nparams) return MS_OK;
    for (int k = p->n_sync; k < p->ni; k++)
        if (p->ins[k].value == p->params[i]) MS_CHECK(run(p, k, k + 1, NULL, err));
    return MS_OK;
}

void ms_program_on_param_use(ms_program *p, ms_param_use_fn fn, void *arg) {
    if (fn) find_first_uses(p);
    p->param_use = fn;
    p->param_use_arg = arg;
}

int ms_program_param_first_use(ms_program *p, int i) {
    find_first_uses(p);
    return i >= 0 && i < p->nparams ? p->param_first[i] : 0;
}

void ms_program_params_written(ms_program *p) {
    if (p->member && !p->shapes_only) masters_written(p);
}

static int cmp_size(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* The parameters' gradient buffers as few ranges as they allow: the persistent ones (created
 * side by side, laid out side by side) merged where one ends, padding included, where the next
 * begins; the rest listed one by one. */
static void plan_zero_ranges(ms_program *p) {
    const int cap = 2 * p->nparams + 2;
    size_t *span = xmalloc(sizeof *span * 2 * (size_t)cap); /* (offset, padded floats) pairs */
    int ns = 0;
    p->zero_other = xmalloc(sizeof *p->zero_other * (size_t)cap);
    p->zero_n_other = 0;
    for (int v = 0; v < p->g->nv; v++) {
        const pvalue *pv = &p->pv[v];
        if (p->g->v[v].kind != GV_PARAM) continue;
        const int bufs[2] = {pv->param_grad_buf,
                             pv->has_grad && pv->gbuf != pv->param_grad_buf ? pv->gbuf : -1};
        for (int k = 0; k < 2 && ns < cap; k++) {
            if (bufs[k] < 0) continue;
            const buf *bf = &p->bufs[bufs[k]];
            if (bf->persistent && !bf->on_host && bf->ptr == p->persist + bf->offset)
                span[2 * ns] = bf->offset, span[2 * ns + 1] = padded_floats(bf), ns++;
            else
                p->zero_other[p->zero_n_other++] = bufs[k];
        }
    }
    qsort(span, (size_t)ns, 2 * sizeof *span, cmp_size);
    p->zero_off = xmalloc(sizeof *p->zero_off * (size_t)(ns + 1));
    p->zero_len = xmalloc(sizeof *p->zero_len * (size_t)(ns + 1));
    p->zero_n = 0;
    for (int i = 0; i < ns; i++) {
        const size_t off = span[2 * i], len = span[2 * i + 1];
        const int last = p->zero_n - 1;
        if (last >= 0 && p->zero_off[last] + p->zero_len[last] == off)
            p->zero_len[last] += len;
        else if (last < 0 || p->zero_off[last] + p->zero_len[last] < off)
            p->zero_off[p->zero_n] = off, p->zero_len[p->zero_n++] = len;
        /* else: a buffer already inside the last range (one shared by two values) */
    }
    free(span);
    p->zero_ready = true;
}

ms_status ms_program_zero_grads(ms_program *p, ms_error *err) {
    if (!p->member || p->shapes_only) return MS_OK;
    ms_gb_reset(p->buckets);
    for (int i = 0; p->gf_last && i < p->nparams; i++) p->gf_hits[i] = 0, p->gf_told[i] = false;
    if (!p->zero_ready) plan_zero_ranges(p);
    for (int i = 0; i < p->zero_n; i++) {
        const buf range = {.ptr = p->persist + p->zero_off[i], .nfloats = (int64_t)p->zero_len[i]};
        MS_CHECK(zero_buf(p, &range, err));
    }
    for (int i = 0; i < p->zero_n_other; i++)
        MS_CHECK(zero_buf(p, &p->bufs[p->zero_other[i]], err));
    return MS_OK;
}

void ms_program_set_dropout(ms_program *p, bool training, uint64_t step) {
    p->eval = !training;
    /* Any distinct Philox key draws an independent stream; the golden-ratio step keeps keys of
     * nearby seeds and steps apart. */
    p->draw = p->seed + 0x9E3779B97F4A7C15ull * step;
}

void ms_program_set_batch_window(ms_program *p, int64_t rows, int64_t stride, int64_t offset) {
    p->batch = (ms_k_batch_window){.rows = rows, .stride = stride, .offset = offset};
}

size_t ms_program_arena_bytes(const ms_program *p) {
    return (p->arena_floats + 16) * sizeof(float);
}

/* Points the step-lived buffers in the arena (scratch false) or in the scratch at base (NULL:
 * unbound). */
static void bind_buffers(ms_program *p, float *base, bool scratch) {
    for (int b = 0; b < p->nb; b++) {
        buf *bf = &p->bufs[b];
        if (bf->persistent || bf->scratch != scratch) continue;
        bf->ptr = base ? base + bf->offset : NULL;
        bf->t.storage->data = bf->ptr;
    }
}

void ms_program_bind_arena(ms_program *p, float *arena) {
    if (!p->member || p->shapes_only || !p->micro || p->arena == arena) return;
    p->arena = arena;
    bind_buffers(p, arena, false);
}

size_t ms_program_scratch_bytes(const ms_program *p) {
    return p->scratch_floats ? (p->scratch_floats + 16) * sizeof(float) : 0;
}

void ms_program_bind_scratch(ms_program *p, float *scratch) {
    if (!p->member || p->shapes_only || !p->scratch_floats || p->scratch == scratch) return;
    p->scratch = scratch;
    bind_buffers(p, scratch, true);
}

ms_tensor *ms_program_local(ms_program *p, int v) {
    if (!p->member || p->shapes_only || v < 0 || v >= p->g->nv) return NULL;
    if (p->g->v[v].kind != GV_INPUT && v != p->g->output) return NULL;
    return &p->bufs[p->pv[v].buf].t;
}

ms_tensor *ms_program_output_grad(ms_program *p) {
    if (!p->member || p->shapes_only || p->out_grad_buf < 0) return NULL;
    return &p->bufs[p->out_grad_buf].t;
}

ms_tensor *ms_program_input_grad(ms_program *p, int v) {
    if (!p->member || p->shapes_only || v < 0 || v >= p->g->nv || p->in_grad_buf[v] < 0)
        return NULL;
    return &p->bufs[p->in_grad_buf[v]].t;
}

/* Writes the box [start, start + len) of the host array `global` (shape gshape) into buffer
 * b: straight on the host, through a packed host copy elsewhere. */
static ms_status write_box(ms_program *p, buf *b, const float *global, const int64_t *gshape,
                           const int64_t *start, const int64_t *len, int ndim, ms_error *err) {
    int64_t zero[MS_MAX_DIMS] = {0}, n = 1;
    for (int d = 0; d < ndim; d++) n *= len[d];
    if (host_reachable(p, b)) {
        ms_copy_box_f32(b->ptr, len, zero, global, gshape, start, len, ndim);
        return MS_OK;
    }
    float *packed = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
    ms_copy_box_f32(packed, len, zero, global, gshape, start, len, ndim);
    ms_status st = ms_device_copy(p->dev, b->ptr, packed, sizeof(float) * (size_t)n,
                                  MS_COPY_HOST_TO_DEVICE, err);
    free(packed);
    return st;
}

ms_status ms_program_feed(ms_program *p, int v, const float *global, ms_error *err) {
    if (!p->member) return MS_OK;
    MS_CHECK(check_runnable(p, err));
    if (v < 0 || v >= p->g->nv || p->g->v[v].kind != GV_INPUT)
        return ms_fail(err, MS_ERR_INVALID, "feed: value %d is not an input", v);
    gvalue *gv = &p->g->v[v];
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(&p->pv[v].pl, p->mesh, p->coords, gv->shape.ndim, gv->shape.d, start, len);
    return write_box(p, &p->bufs[p->pv[v].buf], global, gv->shape.d, start, len, gv->shape.ndim,
                     err);
}

int ms_program_num_params(const ms_program *p) {
    return p->nparams;
}

ms_status ms_program_param(ms_program *p, int i, ms_param_view *out) {
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= p->nparams) return MS_ERR_INVALID;
    int v = p->params[i];
    pvalue *pv = &p->pv[v];
    out->name = p->g->v[v].name;
    out->value = v;
    out->gshape = p->g->v[v].shape;
    out->data = p->bufs[param_home(p, v, &out->pl)].t;
    out->grad = p->bufs[pv->param_grad_buf].t;
    out->grad_pl = pv->grad_pl;
    out->opt_pl = pv->opt_pl;
    if (pv->master_buf >= 0) out->use_bytes = (size_t)p->bufs[pv->buf].numel * sizeof(uint16_t);
    out->host_master = pv->up_buf >= 0;
    local_shape(p, &out->gshape, &pv->opt_pl, &out->opt_shape);
    out->opt_n = shape_n(&out->opt_shape);
    out->data_off = rows_offset(p, &out->gshape, &out->pl, &pv->opt_pl);
    out->grad_off = rows_offset(p, &out->gshape, &pv->grad_pl, &pv->opt_pl);
    out->owner = true;
    for (int m = 0; m < pv->grad_pl.n; m++)
        if (pv->grad_pl.p[m].kind != MS_PL_SHARD && p->coords[m] != 0) out->owner = false;
    return MS_OK;
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
        const char *kind = gv->kind == GV_PARAM ? "param" : gv->kind == GV_INPUT ? "input" : "";
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
        const char *what = moves_grad(in) ? "grad of " : "";
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
            "kernel that writes them first (%s)\n",
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
    MS_CHECK(check_has_memory(p, err));
    int v = p->params[i];
    const gvalue *gv = &p->g->v[v];
    ms_placements pl;
    buf *b = &p->bufs[param_home(p, v, &pl)];
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(&pl, p->mesh, p->coords, gv->shape.ndim, gv->shape.d, start, len);
    masters_written(p);
    return write_box(p, b, full, gv->shape.d, start, len, gv->shape.ndim, err);
}

ms_status ms_program_value(ms_program *p, int v, ms_tensor *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    if (!p->member) return MS_OK;
    MS_CHECK(check_has_memory(p, err));
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

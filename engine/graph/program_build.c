/* program_build.c - the instruction list: forward, backward, and ZeRO 3's gathers and ZeRO 1 and
 * 2's parameter sync. */
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
        prog_local_shape(p, &gin[i], &pn->req_in[i], &ls);
        memset(&tin[i], 0, sizeof tin[i]);
        tin[i].ndim = ls.ndim;
        memcpy(tin[i].shape, ls.d, sizeof(int64_t) * (size_t)ls.ndim);
        call->in[i] = &tin[i];
    }
    for (int o = 0; o < nd->n_out; o++) {
        gout[o] = p->g->v[nd->out[o]].shape;
        ms_shape ls;
        prog_local_shape(p, &gout[o], &pn->out_pl[o], &ls);
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
void prog_emit_reshard(ms_program *p, int value, int src, int dst, const ms_placements *from,
                       const ms_placements *to, ms_program_phase phase) {
    instr *in = prog_emit(p, I_RESHARD, phase);
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
 * today; they overlap compute once the communicators prog_run them without blocking (the
 * non-blocking collectives to come), for which this order is already right. */
void prog_prefetch_gathers(ms_program *p, int lo, int hi) {
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
int64_t prog_rows_offset(const ms_program *p, const ms_shape *g, const ms_placements *a,
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
        instr *cast = prog_emit(p, I_CAST, MS_PROG_PARAM_SYNC);
        cast->value = v;
        cast->src = pv->master_buf;
        cast->dst = same ? pv->buf : prog_new_buf(p, v, &pv->opt_pl, false);
        if (!same)
            prog_emit_reshard(p, v, cast->dst, pv->buf, &pv->opt_pl, &pv->store_pl,
                              MS_PROG_PARAM_SYNC);
    }
}

/* ZeRO 1 and 2: the optimizer updated its shard of each stored parameter; the shard is copied
 * out (a gather must not read what it prog_writes) and all-gathered back over dp. */
void prog_build_param_sync(ms_program *p) {
    if (p->bf16) {
        build_master_cast(p);
        return;
    }
    for (int v = 0; v < p->g->nv; v++) {
        pvalue *pv = &p->pv[v];
        const ms_shape *gs = &p->g->v[v].shape;
        if (p->g->v[v].kind != GV_PARAM || ms_placements_eq(&pv->opt_pl, &pv->store_pl)) continue;
        int shard = prog_new_buf(p, v, &pv->opt_pl, false);
        instr *cp = prog_emit(p, I_COPY, MS_PROG_PARAM_SYNC);
        cp->value = v;
        cp->src = pv->buf;
        cp->dst = shard;
        cp->src_off = prog_rows_offset(p, gs, &pv->store_pl, &pv->opt_pl);
        prog_emit_reshard(p, v, shard, pv->buf, &pv->opt_pl, &pv->store_pl, MS_PROG_PARAM_SYNC);
    }
}

/* Each buffer's update (ms_graph_assign) at the end of the forward, after every read of the
 * buffer: the value copied, or resharded, into the buffer's storage; training forwards only. */
static void build_buffer_updates(ms_program *p) {
    for (int v = 0; v < p->g->nv; v++) {
        int a = p->g->v[v].assign;
        if (p->g->v[v].kind != GV_BUFFER || a < 0) continue;
        const pvalue *pb = &p->pv[v], *pa = &p->pv[a];
        if (ms_placements_eq(&pa->pl, &pb->pl)) {
            instr *cp = prog_emit(p, I_COPY, MS_PROG_FORWARD);
            cp->value = v;
            cp->src = pa->buf;
            cp->dst = pb->buf;
        } else {
            prog_emit_reshard(p, a, pa->buf, pb->buf, &pa->pl, &pb->pl, MS_PROG_FORWARD);
        }
        p->ins[p->ni - 1].train_only = true;
    }
}

void prog_build_forward(ms_program *p) {
    ms_graph *g = p->g;
    /* Parameters persist; inputs too, except micro-batched, where each slot has its own. */
    for (int v = 0; v < g->nv; v++) {
        pvalue *pv = &p->pv[v];
        pv->master_buf = pv->up_buf = -1;
        bool stored = g->v[v].kind == GV_PARAM || g->v[v].kind == GV_BUFFER;
        if (g->v[v].kind != GV_ACT)
            pv->buf = prog_new_buf(p, v, prog_held_pl(p, v), stored || !p->micro);
        if (g->v[v].kind == GV_PARAM && p->bf16) {
            pv->master_buf = prog_new_typed_buf(p, &g->v[v].shape, &pv->opt_pl, true, MS_F32);
            if (p->master_host) {
                /* the master and its rounding in host memory; the device keeps the bf16 use
                 * copy alone */
                pv->up_buf = prog_new_typed_buf(p, &g->v[v].shape, &pv->opt_pl, true, MS_BF16);
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
            const ms_placements *held = prog_held_pl(p, nd->in[i]);
            if (ms_placements_eq(held, &pn->req_in[i])) {
                pn->in_buf[i] = iv->buf;
            } else {
                pn->in_buf[i] = prog_new_buf(p, nd->in[i], &pn->req_in[i], false);
                prog_emit_reshard(p, nd->in[i], iv->buf, pn->in_buf[i], held, &pn->req_in[i],
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
            pn->saved_buf[s] = saved[s] ? prog_new_raw_buf(p, saved[s]) : -1;
        for (int o = 0; o < nd->n_out; o++)
            pn->out_buf[o] = prog_new_buf(p, nd->out[o], &pn->out_pl[o], false);
        instr *in = prog_emit(p, I_FWD, MS_PROG_FORWARD);
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
                ov->buf = prog_new_buf(p, nd->out[o], &ov->pl, g->v[nd->out[o]].keep);
                prog_emit_reshard(p, nd->out[o], pn->out_buf[o], ov->buf, &pn->out_pl[o], &ov->pl,
                                  MS_PROG_FORWARD);
            }
        }
    }
    build_buffer_updates(p);
    /* The loss, replicated, for reporting. */
    if (g->loss >= 0) {
        pvalue *lv = &p->pv[g->loss];
        ms_placements r = ms_placements_replicated(p->mesh->ndim);
        p->loss_buf = prog_new_buf(p, g->loss, &r, false);
        prog_emit_reshard(p, g->loss, lv->buf, p->loss_buf, &lv->pl, &r, MS_PROG_LOSS);
    }
    prog_prefetch_gathers(p, 0, p->ni);
    p->n_forward = p->ni;
}

/* program_backward.c - the backward: autograd with placements by duality, each recompute
 * region's forward run again right before its backward, and the pass that drops the zeroing of
 * gradients whose first writer writes them whole. */
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

/* --- activation recompute ------------------------------------------------------------------ */

/* Which nodes the backward recomputes: rc_first[k] is the first node of the region node k runs
 * in, under the outermost kind opts->recompute selects, or -1; blocks > 0 keeps that many
 * block regions (the first, in build order) and no later one. A region's nodes are
 * consecutive (the builder records them between begin and end). */
void prog_mark_recompute(ms_program *p, unsigned kinds, int blocks) {
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
            if (r == MS_REGION_BLOCK && blocks > 0 && id >= blocks) continue;
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
        const ms_placements *held = fresh ? &iv->pl : prog_held_pl(p, v);
        if (ms_placements_eq(held, &pn->req_in[i])) {
            b.in[i] = src;
            continue;
        }
        b.in[i] = prog_new_buf(p, v, &pn->req_in[i], false);
        prog_emit_reshard(p, v, src, b.in[i], held, &pn->req_in[i], MS_PROG_RECOMPUTE);
        p->ins[p->ni - 1].gather = !fresh && !ms_placements_eq(held, &iv->pl);
    }
    for (int s = 0; s < MS_OP_MAX_SAVED; s++)
        b.saved[s] =
            pn->saved_buf[s] >= 0 ? prog_new_raw_buf(p, p->bufs[pn->saved_buf[s]].nfloats) : -1;
    for (int o = 0; o < nd->n_out; o++)
        b.out[o] = prog_new_buf(p, nd->out[o], &pn->out_pl[o], false);
    instr *in = prog_emit(p, I_FWD, MS_PROG_RECOMPUTE);
    in->node = k;
    in->kb = pn->bw = b;
    for (int o = 0; o < nd->n_out; o++) {
        pvalue *ov = &p->pv[nd->out[o]];
        int v = nd->out[o];
        if (ms_placements_eq(&ov->pl, &pn->out_pl[o])) {
            p->rc_buf[v] = b.out[o];
            continue;
        }
        p->rc_buf[v] = prog_new_buf(p, v, &ov->pl, false);
        prog_emit_reshard(p, v, b.out[o], p->rc_buf[v], &pn->out_pl[o], &ov->pl, MS_PROG_RECOMPUTE);
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
        pv->gbuf = prog_new_buf(p, v, pl, param && p->micro);
    /* Micro-batched, a parameter's gradient accumulates: ms_program_zero_grads clears it. */
    if (!(param && p->micro)) prog_emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = pv->gbuf;
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
        if (pending[i] >= 0) prog_emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = pending[i];
        if (!pn->gathered[i]) continue;
        /* ZeRO 3 under recompute: the region's forward just ran again and gathered the
         * parameter into pn->bw; that copy serves the backward too (one gather, not two) */
        if (p->rc_first && p->rc_first[k] >= 0) continue;
        /* ZeRO 3: the forward's gathered copy is gone; gather the parameter again */
        int v = nd->in[i];
        again[i] = prog_new_buf(p, v, &pn->req_in[i], false);
        prog_emit_reshard(p, v, p->pv[v].buf, again[i], &p->pv[v].store_pl, &pn->req_in[i],
                          MS_PROG_BACKWARD);
        p->ins[p->ni - 1].gather = true;
    }
    instr *in = prog_emit(p, I_BWD, MS_PROG_BACKWARD);
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
        int tmp = prog_new_buf(p, nd->in[i], &iv->gpl, false);
        prog_emit_reshard(p, nd->in[i], pending[i], tmp, &got, &iv->gpl, MS_PROG_BACKWARD);
        instr *add = prog_emit(p, I_ADD, MS_PROG_BACKWARD);
        add->src = tmp;
        add->dst = iv->gbuf;
    }
}

/* Which values need a gradient: parameters, activation inputs a previous chunk wants, and
 * every output of a node with such an input. */
static void mark_requires_grad(ms_program *p) {
    ms_graph *g = p->g;
    for (int v = 0; v < g->nv; v++) {
        gvalue *gv = &g->v[v];
        p->pv[v].requires_grad = gv->kind == GV_PARAM || gv->grad_input;
        if (gv->kind == GV_PARAM)
            p->pv[v].param_grad_buf = prog_new_buf(p, v, &p->pv[v].grad_pl, true);
    }
    for (int k = 0; k < g->nn; k++) {
        gnode *nd = &g->n[k];
        bool rg = false;
        for (int i = 0; i < nd->n_in; i++) rg |= p->pv[nd->in[i]].requires_grad;
        for (int o = 0; o < nd->n_out; o++) p->pv[nd->out[o]].requires_grad = rg;
    }
}

/* The first gradient: d loss / d loss = 1, or the output's, which the next chunk sends. */
static void seed_gradient(ms_program *p) {
    ms_graph *g = p->g;
    const int md = p->mesh->ndim;
    if (g->loss >= 0) {
        /* Seed: d loss / d loss = 1, replicated (the dual of any partial placement). */
        ms_placements r = ms_placements_replicated(md);
        int seed = grad_target(p, g->loss, &r);
        p->ins[p->ni - 1].kind = I_SEED;
        p->ins[p->ni - 1].dst = seed;
    } else {
        /* An output: its gradient arrives from the next chunk, in the output's placements. */
        p->out_grad_buf = grad_target(p, g->output, &p->pv[g->output].pl);
        p->ni--; /* no zeroing: the caller prog_writes it */
    }
}

/* Node k's backward: its output gradients in the placements its rule wants, its input
 * gradients' targets, and the kernel; with split_w (zb-h1) the parameters' gradients are
 * deferred into dw[*ndw]. */
static void node_backward(ms_program *p, int k, deferred_w *dw, int *ndw_io) {
    ms_graph *g = p->g;
    const int md = p->mesh->ndim;
    int ndw = *ndw_io;
    gnode *nd = &g->n[k];
    pnode *pn = &p->pn[k];
    const ms_op_def *def = ms_op_get(nd->op);
    bool any_out = false, any_in = false;
    for (int o = 0; o < nd->n_out; o++) any_out |= p->pv[nd->out[o]].has_grad;
    for (int i = 0; i < nd->n_in; i++)
        any_in |= p->pv[nd->in[i]].requires_grad && (def->grad_inputs >> i & 1);
    if (!any_out || !any_in) return;
    int dout[MS_OP_MAX_OUT], din[MS_OP_MAX_IN], pending[MS_OP_MAX_IN];
    for (int o = 0; o < MS_OP_MAX_OUT; o++) dout[o] = -1; /* unused slots: no buffer */
    for (int i = 0; i < MS_OP_MAX_IN; i++) din[i] = pending[i] = -1;
    for (int o = 0; o < nd->n_out; o++) {
        pvalue *ov = &p->pv[nd->out[o]];
        ms_placements want = dual_placements(pn, md, nd->n_in, nd->n_out, o, true);
        if (!ov->has_grad) {
            dout[o] = prog_new_buf(p, nd->out[o], &want, false);
            prog_emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = dout[o];
        } else if (ms_placements_eq(&ov->gpl, &want)) {
            dout[o] = ov->gbuf;
        } else {
            dout[o] = prog_new_buf(p, nd->out[o], &want, false);
            prog_emit_reshard(p, nd->out[o], ov->gbuf, dout[o], &ov->gpl, &want, MS_PROG_BACKWARD);
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
            din[i] = pending[i] = prog_new_buf(p, nd->in[i], &got, false);
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
    *ndw_io = ndw;
}

/* Gradients of activation inputs, in the inputs' own placements (what the previous chunk's
 * output has). */
static void input_gradients(ms_program *p) {
    ms_graph *g = p->g;
    for (int v = 0; v < g->nv; v++) {
        pvalue *pv = &p->pv[v];
        if (!g->v[v].grad_input) continue;
        if (pv->has_grad && ms_placements_eq(&pv->gpl, &pv->pl)) {
            p->in_grad_buf[v] = pv->gbuf;
            continue;
        }
        p->in_grad_buf[v] = prog_new_buf(p, v, &pv->pl, false);
        if (pv->has_grad)
            prog_emit_reshard(p, v, pv->gbuf, p->in_grad_buf[v], &pv->gpl, &pv->pl,
                              MS_PROG_BACKWARD);
        else
            prog_emit(p, I_ZERO, MS_PROG_BACKWARD)->dst = p->in_grad_buf[v];
    }
}

/* Gradients into the parameters' gradient placements (the data-parallel all-reduce, or
 * ZeRO's reduce-scatter). */
static void param_gradients(ms_program *p) {
    ms_graph *g = p->g;
    for (int v = 0; v < g->nv; v++) {
        pvalue *pv = &p->pv[v];
        if (g->v[v].kind != GV_PARAM) continue;
        if (!pv->has_grad)
            prog_emit(p, I_ZERO, MS_PROG_GRAD_SYNC)->dst = pv->param_grad_buf;
        else if (pv->gbuf != pv->param_grad_buf)
            prog_emit_reshard(p, v, pv->gbuf, pv->param_grad_buf, &pv->gpl, &pv->grad_pl,
                              MS_PROG_GRAD_SYNC);
    }
}

void prog_build_backward(ms_program *p) {
    ms_graph *g = p->g;
    mark_requires_grad(p);
    seed_gradient(p);
    /* Split (zb-h1): each kernel's parameter gradients are deferred to a second pass. */
    deferred_w *dw = p->split_w ? xmalloc(sizeof *dw * (size_t)(g->nn + 1)) : NULL;
    int ndw = 0, last_region = -1;
    for (int k = g->nn - 1; k >= 0; k--) {
        recompute_region(p, k, &last_region);
        node_backward(p, k, dw, &ndw);
    }
    input_gradients(p);
    prog_prefetch_gathers(p, p->n_forward, p->ni);
    p->n_weight = p->ni;
    /* The weight pass recomputes a region again rather than keep its activations from B. */
    last_region = -1;
    for (int i = 0; i < ndw; i++) {
        recompute_region(p, dw[i].node, &last_region);
        emit_bwd(p, dw[i].node, dw[i].dout, dw[i].din, dw[i].pending);
    }
    free(dw);
    prog_prefetch_gathers(p, p->n_weight, p->ni);
    p->n_backward = p->ni;
    param_gradients(p);
    p->n_sync = p->ni;
    prog_build_param_sync(p);
}

/* Whether instruction in reads or prog_writes buffer b other than as an input's gradient. */
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

/* Whether instruction in reads or prog_writes buffer b. */
static bool uses_buf(const ms_program *p, const instr *in, int b) {
    if (uses_buf_besides_din(p, in, b)) return true;
    for (int i = 0; i < MS_OP_MAX_IN; i++)
        if (in->din_buf[i] == b) return true;
    return false;
}

/* A gradient zeroed only for a backward kernel to add into it: when that kernel's op can write
 * the gradient whole (fresh_ok) and the buffer is nothing else of that call, the kernel prog_writes
 * it (din_fresh) and the zeroing is dropped. The zeroings of the step's gradients moved about
 * as many bytes as the activations (4.3 GB for GPT-2 124M at 8 x 1024 under bf16); the kernels
 * that now write instead of add (the products' dA and dB) also read nothing back. */
void prog_fresh_gradients(ms_program *p) {
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

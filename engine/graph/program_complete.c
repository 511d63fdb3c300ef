/* program_complete.c - completion: every value's placements from the annotations and the
 * operators' rules; ZeRO's placements over dp. */
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

ms_status prog_complete(ms_program *p, const ms_compile_opts *opts, ms_error *err) {
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
void prog_zero_placements(ms_program *p) {
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
int prog_param_home(const ms_program *p, int v, ms_placements *pl) {
    const pvalue *pv = &p->pv[v];
    *pl = pv->master_buf >= 0 ? pv->opt_pl : pv->store_pl;
    return pv->master_buf >= 0 ? pv->master_buf : pv->buf;
}

/* Where value v's buffer lies: a parameter's storage, or the value's placement. */
const ms_placements *prog_held_pl(const ms_program *p, int v) {
    return p->g->v[v].kind == GV_PARAM ? &p->pv[v].store_pl : &p->pv[v].pl;
}

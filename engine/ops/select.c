/* select.c - choosing an operator's placements from its per-mesh-dim rules. */
#include "engine/ops/select.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/dist/reshard.h"

bool ms_placements_with(const ms_placements *in, int m, ms_placement q, int tensor_ndim,
                        ms_placements *out) {
    const ms_placements copy = *in, *pl = &copy; /* out may alias in */
    *out = copy;
    if (ms_placement_same_kind(pl->p[m], q)) return true;
    out->p[m] = q;
    if (q.kind == MS_PL_SHARD) {
        int k = 0;
        for (int e = 0; e < out->n; e++)
            if (e != m && out->p[e].kind == MS_PL_SHARD && out->p[e].dim == q.dim) k++;
        out->p[m].order = (int8_t)k;
    }
    if (pl->p[m].kind == MS_PL_SHARD) {
        int d = pl->p[m].dim, removed = pl->p[m].order;
        for (int e = 0; e < out->n; e++)
            if (e != m && out->p[e].kind == MS_PL_SHARD && out->p[e].dim == d &&
                out->p[e].order > removed)
                out->p[e].order--;
    }
    return ms_placements_validate(out, out->n, tensor_ndim, NULL) == MS_OK;
}

static double move_cost(struct ms_plan_cache *plans, const ms_mesh *mesh, const ms_shape *g,
                        const ms_placements *a, const ms_placements *b) {
    if (ms_placements_eq(a, b)) return 0;
    const ms_reshard_plan *plan;
    if (ms_plan_cache_get(plans, mesh, a, b, g->ndim, g->d, &plan, NULL) != MS_OK) return INFINITY;
    return plan->wire_bytes + plan->nsteps;
}

/* Whether candidate c keeps a partial sum the op's input i already is along mesh dim m (a
 * linear op passing it through): that sum's reduction is priced where it was made. */
static bool passes_partial(const ms_rule_query *q, const ms_placements *req_in,
                           const ms_rule_cand *c, int m) {
    for (int i = 0; i < q->n_in; i++)
        if (req_in[i].p[m].kind == MS_PL_PARTIAL && c->in[i].kind == MS_PL_PARTIAL) return true;
    return false;
}

/* The bytes of reducing output o, a partial sum `sum` along mesh dim m: to the hinted
 * placement when there is one the planner can reach, else the cheapest of the all-reduce and
 * a reduce-scatter onto each of its dims (the reshard planner's figures). */
static double reduction_cost(struct ms_plan_cache *plans, const ms_mesh *mesh,
                             const ms_rule_query *q, int o, int m, ms_placement sum) {
    const ms_shape *g = &q->out_shapes[o];
    ms_placements from = ms_placements_replicated(mesh->ndim),
                  to = ms_placements_replicated(mesh->ndim);
    from.p[m] = sum;
    from.p[m].order = 0;
    if (q->want_out && q->want_kind[o] == 1 && q->want_out[o].p[m].kind != MS_PL_PARTIAL) {
        to.p[m] = q->want_out[o].p[m];
        to.p[m].order = 0;
        double hinted = move_cost(plans, mesh, g, &from, &to);
        if (isfinite(hinted)) return hinted;
    }
    to.p[m] = ms_R();
    double best = move_cost(plans, mesh, g, &from, &to);
    for (int d = 0; d < g->ndim; d++) {
        to.p[m] = ms_S(d);
        best = fmin(best, move_cost(plans, mesh, g, &from, &to));
    }
    return best;
}

/* A partial sum the candidate makes after moving its inputs (the split of a contraction:
 * operands all-to-all'ed onto its k dim) will be reduced downstream, so its reduction counts.
 * One made where the inputs already lie on the contraction dim (Megatron-LM's row-parallel
 * linear after a column-parallel one) is what that layout planned: charging it there would
 * trade the reduction for gathering the weight op by op, which the layers around it do not
 * follow. Annotated outputs are priced by their move instead. */
static double made_partial_cost(struct ms_plan_cache *plans, const ms_mesh *mesh,
                                const ms_rule_query *q, const ms_placements *req_in,
                                const ms_rule_cand *c, int m, double in_cost) {
    if (in_cost == 0 || passes_partial(q, req_in, c, m)) return 0;
    double cost = 0;
    for (int o = 0; o < q->n_out; o++) {
        if (c->out[o].kind != MS_PL_PARTIAL || (q->want_out && q->want_kind[o] == 2)) continue;
        cost += reduction_cost(plans, mesh, q, o, m, c->out[o]);
    }
    return cost;
}

/* "(R, R), (S(0), R), ..." : what the op accepts along one mesh dim. */
static void accepted_str(const ms_rule_cand *c, int nc, int n_in, char *buf, size_t len) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < nc && k + 40 < len; i++) {
        k += (size_t)snprintf(buf + k, len - k, "%s(", i ? ", " : "");
        for (int j = 0; j < n_in && k < len; j++) {
            char one[16];
            k += (size_t)snprintf(buf + k, len - k, "%s%s", j ? ", " : "",
                                  ms_placement_str(c[i].in[j], one, sizeof one));
        }
        k += (size_t)snprintf(buf + k, len - k, ")");
    }
}

ms_placements ms_rule_dual_placements(const ms_rule_cand *cand, int mesh_ndim, int n_in, int n_out,
                                      int i, bool output) {
    ms_placements pl = {.n = mesh_ndim};
    for (int m = 0; m < mesh_ndim; m++)
        pl.p[m] =
            output ? ms_rule_dual_out(cand[m].out[i]) : ms_rule_dual_in(&cand[m], n_in, n_out, i);
    ms_placements_default_order(&pl);
    return pl;
}

ms_status ms_rule_select(struct ms_plan_cache *plans, const ms_mesh *mesh, const ms_rule_query *q,
                         ms_rule_choice *out, ms_error *err) {
    const ms_op_def *def = ms_op_get(q->op);
    if (!def) return ms_fail(err, MS_ERR_INVALID, "unknown operator %d", q->op);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < q->n_in; i++) out->req_in[i] = q->in_pl[i];
    for (int m = 0; m < mesh->ndim; m++) {
        ms_rule_cand cands[MS_OP_MAX_CANDS];
        memset(cands, 0, sizeof cands);
        int nc = def->rule(q->attrs, q->n_in, q->in_shapes, mesh->shape[m], cands);
        double best = INFINITY;
        int pick = -1;
        for (int c = 0; c < nc; c++) {
            double cost = 0;
            for (int i = 0; i < q->n_in && isfinite(cost); i++) {
                ms_placements to;
                if (!ms_placements_with(&out->req_in[i], m, cands[c].in[i], q->in_shapes[i].ndim,
                                        &to))
                    cost = INFINITY;
                else
                    cost += move_cost(plans, mesh, &q->in_shapes[i], &out->req_in[i], &to);
            }
            if (!q->allow_reshard && cost != 0) continue;
            if (def->valid && isfinite(cost)) {
                ms_placements trial[MS_OP_MAX_IN];
                for (int i = 0; i < q->n_in; i++)
                    ms_placements_with(&out->req_in[i], m, cands[c].in[i], q->in_shapes[i].ndim,
                                       &trial[i]);
                if (!def->valid(q->attrs, q->n_in, q->in_shapes, trial, mesh->shape)) continue;
            }
            if (isfinite(cost))
                cost += made_partial_cost(plans, mesh, q, out->req_in, &cands[c], m, cost);
            /* A wanted output placement: add what moving the output there would cost. */
            for (int o = 0; o < q->n_out && isfinite(cost); o++) {
                if (!q->want_out || !q->want_kind[o] ||
                    ms_placement_same_kind(cands[c].out[o], q->want_out[o].p[m]))
                    continue;
                if (q->want_kind[o] == 1) {
                    cost += 0.5;
                    continue;
                }
                ms_placements from = ms_placements_replicated(mesh->ndim),
                              to = ms_placements_replicated(mesh->ndim);
                from.p[m] = cands[c].out[o];
                to.p[m] = q->want_out[o].p[m];
                to.p[m].order = from.p[m].order = 0;
                cost += move_cost(plans, mesh, &q->out_shapes[o], &from, &to);
            }
            if (cost < best) best = cost, pick = c;
        }
        if (pick < 0) {
            char ins[300] = "", acc[700], one[96];
            for (int i = 0; i < q->n_in; i++) {
                size_t k = strlen(ins);
                snprintf(ins + k, sizeof ins - k, "%s%s", i ? " and " : "",
                         ms_placements_str(&q->in_pl[i], one, sizeof one));
            }
            accepted_str(cands, nc, q->n_in, acc, sizeof acc);
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: no rule accepts inputs %s along mesh dim '%s' (size %d)%s; it "
                           "accepts (per input, along that dim): %s",
                           def->name, ins, mesh->names[m], mesh->shape[m],
                           q->allow_reshard ? "" : " without resharding", acc);
        }
        out->cand[m] = cands[pick];
        out->cost += best;
        for (int i = 0; i < q->n_in; i++)
            ms_placements_with(&out->req_in[i], m, cands[pick].in[i], q->in_shapes[i].ndim,
                               &out->req_in[i]);
    }
    /* Inputs that share a sharded dim (A's and B's K in a matmul) must split it the same
     * way, so required inputs, like outputs, nest their shards in mesh-dim order. */
    for (int i = 0; i < q->n_in; i++) ms_placements_default_order(&out->req_in[i]);
    for (int o = 0; o < q->n_out; o++) {
        ms_placements *op = &out->out_pl[o];
        op->n = mesh->ndim;
        for (int m = 0; m < mesh->ndim; m++) op->p[m] = out->cand[m].out[o];
        ms_placements_default_order(op);
        if (ms_placements_validate(op, mesh->ndim, q->out_shapes[o].ndim, err) != MS_OK)
            return ms_fail_wrap(err, MS_ERR_INTERNAL, "%s: output %d placement", def->name, o);
    }
    return MS_OK;
}

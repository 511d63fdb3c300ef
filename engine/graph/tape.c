/* tape.c - recording eager calls and running their backward (see tape.h). */
#include "engine/graph/tape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"

/* A tracked tensor: a watched leaf or an output of a recorded call. */
typedef struct tape_val {
    const ms_storage *key; /* identity: the local tensor's storage and offset */
    int64_t offset;
    int ndim;
    int64_t gshape[MS_MAX_DIMS];
    ms_placements pl;
    bool leaf;
    bool input; /* a named input (ms_tape_input): tracked for to_static, no gradient */
    char name[64];
    bool has_grad;
    ms_dtensor grad; /* in the placement of the first gradient to arrive (graph mode's gpl) */
} tape_val;

typedef struct tape_rec {
    int op, n_in, n_out;
    int in_val[MS_OP_MAX_IN]; /* tracked value, or -1 */
    int out_val[MS_OP_MAX_OUT];
    ms_tensor out[MS_OP_MAX_OUT]; /* references on the outputs, in run.ch.out_pl */
    ms_eager_run run;
} tape_rec;

struct ms_tape {
    ms_dmesh *mesh; /* bound by the first tensor seen; NULL until then */
    ms_kctx *kc;    /* the kernels of the mesh's device: made when a mesh binds, owned */
    tape_val *v;
    int nv, cv;
    tape_rec *r;
    int nr, cr;
    bool done; /* the backward ran: saved buffers are gone */
};

ms_tape *ms_tape_create(void) {
    return xcalloc(1, sizeof(ms_tape));
}

void ms_tape_clear(ms_tape *t) {
    for (int k = 0; k < t->nr; k++) {
        for (int o = 0; o < MS_OP_MAX_OUT; o++) ms_tensor_release(&t->r[k].out[o]);
        ms_eager_run_release(&t->r[k].run);
    }
    for (int i = 0; i < t->nv; i++)
        if (t->v[i].has_grad) ms_dtensor_release(&t->v[i].grad);
    t->nr = t->nv = 0;
    t->mesh = NULL;
    t->done = false;
}

void ms_tape_destroy(ms_tape *t) {
    if (!t) return;
    ms_tape_clear(t);
    ms_kctx_destroy(t->kc);
    free(t->v);
    free(t->r);
    free(t);
}

int ms_tape_size(const ms_tape *t) {
    return t->nr;
}

static int find_val(const ms_tape *t, const ms_dtensor *x) {
    if (!x->local.storage) return -1;
    for (int i = t->nv - 1; i >= 0; i--)
        if (t->v[i].key == x->local.storage && t->v[i].offset == x->local.offset) return i;
    return -1;
}

static int add_val(ms_tape *t, const ms_dtensor *x, bool leaf) {
    if (t->nv == t->cv) {
        t->cv = t->cv ? 2 * t->cv : 32;
        t->v = xrealloc(t->v, sizeof *t->v * (size_t)t->cv);
    }
    tape_val *v = &t->v[t->nv];
    *v = (tape_val){.key = x->local.storage,
                    .offset = x->local.offset,
                    .ndim = x->ndim,
                    .pl = x->pl,
                    .leaf = leaf};
    memcpy(v->gshape, x->gshape, sizeof v->gshape);
    return t->nv++;
}

static ms_status check_usable(ms_tape *t, const ms_dtensor *x, const char *what, ms_error *err) {
    if (t->done)
        return ms_fail(err, MS_ERR_INVALID,
                       "tape %s: the backward already ran on this recording and freed its saved "
                       "buffers; call ms_tape_clear and record the step again",
                       what);
    if (t->mesh && x->mesh != t->mesh) {
        char a[64], b[64];
        return ms_fail(err, MS_ERR_INVALID,
                       "tape %s: a tensor on mesh %s, but this tape records mesh %s; use one "
                       "tape per mesh (move tensors with ms_reshard_cross_mesh)",
                       what, ms_mesh_str(&x->mesh->mesh, a, sizeof a),
                       ms_mesh_str(&t->mesh->mesh, b, sizeof b));
    }
    t->mesh = x->mesh;
    ms_device *dev = x->mesh->ctx->device;
    if (t->kc && t->kc->dev != dev) { /* a new mesh after ms_tape_clear, on another device */
        ms_kctx_destroy(t->kc);
        t->kc = NULL;
    }
    return t->kc ? MS_OK : ms_kctx_create(dev, &t->kc, err);
}

ms_status ms_tape_watch(ms_tape *t, const ms_dtensor *leaf, ms_error *err) {
    MS_CHECK(check_usable(t, leaf, "watch", err));
    for (int m = 0; m < leaf->pl.n; m++)
        if (leaf->pl.p[m].kind == MS_PL_PARTIAL) {
            char s[64];
            return ms_fail(err, MS_ERR_INVALID,
                           "tape watch: a leaf in %s; a parameter must be replicated or sharded "
                           "on every mesh dim (reshard it to R first)",
                           ms_placements_str(&leaf->pl, s, sizeof s));
        }
    if (!ms_dmesh_is_member(leaf->mesh) || find_val(t, leaf) >= 0) return MS_OK;
    add_val(t, leaf, true);
    return MS_OK;
}

ms_status ms_tape_input(ms_tape *t, const ms_dtensor *x, const char *name, ms_error *err) {
    MS_CHECK(check_usable(t, x, "input", err));
    if (!name || !name[0] || strlen(name) >= sizeof t->v[0].name)
        return ms_fail(err, MS_ERR_INVALID, "tape input: a name of 1 to %zu bytes",
                       sizeof t->v[0].name - 1);
    if (!ms_dmesh_is_member(x->mesh)) return MS_OK;
    int i = find_val(t, x);
    if (i >= 0 && !t->v[i].input)
        return ms_fail(err, MS_ERR_INVALID,
                       "tape input %s: the tensor is already a leaf or a recorded output", name);
    if (i < 0) i = add_val(t, x, false);
    t->v[i].input = true;
    snprintf(t->v[i].name, sizeof t->v[i].name, "%s", name);
    return MS_OK;
}

ms_status ms_tape_name(ms_tape *t, const ms_dtensor *leaf, const char *name, ms_error *err) {
    if (!name || !name[0] || strlen(name) >= sizeof t->v[0].name)
        return ms_fail(err, MS_ERR_INVALID, "tape name: a name of 1 to %zu bytes",
                       sizeof t->v[0].name - 1);
    if (!ms_dmesh_is_member(leaf->mesh)) return MS_OK;
    int i = find_val(t, leaf);
    if (i < 0 || !t->v[i].leaf)
        return ms_fail(err, MS_ERR_INVALID, "tape name %s: watch the tensor first (ms_tape_watch)",
                       name);
    snprintf(t->v[i].name, sizeof t->v[i].name, "%s", name);
    return MS_OK;
}

static void record(ms_tape *t, int op, int n_in, const int *in_val, int n_out, ms_dtensor *out,
                   ms_eager_run *run) {
    if (t->nr == t->cr) {
        t->cr = t->cr ? 2 * t->cr : 32;
        t->r = xrealloc(t->r, sizeof *t->r * (size_t)t->cr);
    }
    tape_rec *r = &t->r[t->nr++];
    memset(r, 0, sizeof *r);
    r->op = op, r->n_in = n_in, r->n_out = n_out;
    memcpy(r->in_val, in_val, sizeof r->in_val);
    r->run = *run;
    for (int o = 0; o < n_out; o++) {
        r->out[o] = ms_tensor_share(&out[o].local);
        r->out_val[o] = add_val(t, &out[o], false);
    }
}

ms_status ms_tape_op(ms_tape *t, int op, const ms_op_attrs *attrs, int n_in,
                     const ms_dtensor *const *in, int n_out, ms_dtensor *out,
                     const ms_eager_opts *opts_in, ms_error *err) {
    if (!t || n_in < 1 || n_in > MS_OP_MAX_IN)
        return ms_eager(op, attrs, n_in, in, n_out, out, opts_in, err);
    const ms_op_def *def = ms_op_get(op);
    for (int i = 0; i < n_in; i++) MS_CHECK(check_usable(t, in[i], def ? def->name : "op", err));
    ms_eager_opts o = opts_in ? *opts_in : (ms_eager_opts){.allow_reshard = true};
    o.kc = t->kc; /* the tape's device kernels, made for the mesh's device */
    const ms_eager_opts *opts = &o;
    int in_val[MS_OP_MAX_IN] = {-1, -1, -1, -1};
    bool tracked = false;
    for (int i = 0; i < n_in && ms_dmesh_is_member(in[0]->mesh); i++) {
        in_val[i] = find_val(t, in[i]);
        tracked |= in_val[i] >= 0;
    }
    if (!tracked) return ms_eager(op, attrs, n_in, in, n_out, out, opts, err);
    ms_eager_run run;
    MS_CHECK(ms_eager_keep(op, attrs, n_in, in, n_out, out, opts, &run, err));
    record(t, op, n_in, in_val, n_out, out, &run);
    return MS_OK;
}

/* --- backward ----------------------------------------------------------------------------- */

/* A zeroed local tensor for a gradient of val in placements pl. */
static ms_status zeros(ms_tape *t, const tape_val *val, const ms_placements *pl, ms_dtensor *out,
                       ms_error *err) {
    ms_dmesh *dm = t->mesh;
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(pl, &dm->mesh, dm->coords, val->ndim, val->gshape, start, len);
    *out = (ms_dtensor){.ndim = val->ndim, .mesh = dm, .pl = *pl};
    memcpy(out->gshape, val->gshape, sizeof out->gshape);
    return ms_tensor_alloc(dm->ctx->device, MS_F32, val->ndim, len, &out->local, err);
}

/* Output o's gradient in the placement the candidate requires (a new reference). */
static ms_status output_grad(ms_tape *t, const tape_rec *r, int o, ms_tensor *dout, ms_error *err) {
    tape_val *ov = &t->v[r->out_val[o]];
    ms_placements want =
        ms_rule_dual_placements(r->run.ch.cand, t->mesh->mesh.ndim, r->n_in, r->n_out, o, true);
    ms_dtensor g;
    if (!ov->has_grad) {
        MS_CHECK(zeros(t, ov, &want, &g, err));
    } else {
        g = ov->grad;
        g.local = ms_tensor_share(&ov->grad.local);
        if (!ms_placements_eq(&ov->grad.pl, &want)) {
            ms_status st = ms_reshard(&g, &want, NULL, err);
            if (st != MS_OK) {
                ms_tensor_release(&g.local);
                return st;
            }
        }
    }
    *dout = g.local;
    return MS_OK;
}

/* A gradient that arrived in another placement than the one val keeps: resharded there and
 * added. Consumes g. */
static ms_status accumulate(ms_tape *t, tape_val *val, ms_dtensor *g, ms_error *err) {
    ms_status st = ms_reshard(g, &val->grad.pl, NULL, err);
    if (st == MS_OK) /* grad += g */
        st = MS_CALL_K(t->kc, accumulate, ms_tensor_f32(&val->grad.local), ms_tensor_f32(&g->local),
                       ms_tensor_numel(&g->local), err);
    ms_dtensor_release(g);
    return st;
}

/* The backward kernel's call: inputs, outputs and saved buffers as the forward ran. */
static void backward_call(const ms_tape *t, tape_rec *r, ms_op_call *call) {
    ms_dmesh *dm = t->mesh;
    const ms_rule_choice *ch = &r->run.ch;
    *call = (ms_op_call){.kc = t->kc,
                         .attrs = &r->run.attrs,
                         .n_in = r->n_in,
                         .n_out = r->n_out,
                         .gin = r->run.gin,
                         .gout = r->run.gout,
                         .in_pl = ch->req_in,
                         .out_pl = ch->out_pl,
                         .mesh = dm,
                         .seed = r->run.seed};
    int64_t len[MS_MAX_DIMS];
    for (int i = 0; i < r->n_in; i++) {
        call->in[i] = &r->run.in[i];
        ms_local_box(&ch->req_in[i], &dm->mesh, dm->coords, r->run.gin[i].ndim, r->run.gin[i].d,
                     call->in_start[i], len);
    }
    for (int o = 0; o < r->n_out; o++) {
        call->out[o] = &r->out[o];
        ms_local_box(&ch->out_pl[o], &dm->mesh, dm->coords, r->run.gout[o].ndim, r->run.gout[o].d,
                     call->out_start[o], len);
    }
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (r->run.saved[k].storage) call->saved[k] = &r->run.saved[k];
}

/* Where input i's gradient goes: the value's own gradient when it is new or already in the
 * dual placement, else a pending buffer to reshard and add afterwards. */
static ms_status input_grad(ms_tape *t, tape_rec *r, int i, ms_dtensor *pending, ms_tensor **din,
                            ms_error *err) {
    tape_val *iv = &t->v[r->in_val[i]];
    ms_placements got =
        ms_rule_dual_placements(r->run.ch.cand, t->mesh->mesh.ndim, r->n_in, r->n_out, i, false);
    if (!iv->has_grad) {
        MS_CHECK(zeros(t, iv, &got, &iv->grad, err));
        iv->has_grad = true;
    }
    if (ms_placements_eq(&iv->grad.pl, &got)) {
        *din = &iv->grad.local;
        return MS_OK;
    }
    MS_CHECK(zeros(t, iv, &got, pending, err));
    *din = &pending->local;
    return MS_OK;
}

/* Whether input i of r takes a gradient: tracked, not a named input, and one the op gives. */
static bool wants_grad(const ms_tape *t, const tape_rec *r, const ms_op_def *def, int i) {
    return r->in_val[i] >= 0 && !t->v[r->in_val[i]].input && (def->grad_inputs >> i & 1);
}

static ms_status backward_rec(ms_tape *t, tape_rec *r, ms_error *err) {
    const ms_op_def *def = ms_op_get(r->op);
    bool any_out = false, any_in = false;
    for (int o = 0; o < r->n_out; o++) any_out |= t->v[r->out_val[o]].has_grad;
    for (int i = 0; i < r->n_in; i++) any_in |= wants_grad(t, r, def, i);
    if (!any_out || !any_in) return MS_OK;
    ms_op_call call;
    backward_call(t, r, &call);
    ms_tensor dout[MS_OP_MAX_OUT] = {0};
    ms_dtensor pending[MS_OP_MAX_IN] = {0};
    ms_status st = MS_OK;
    for (int o = 0; o < r->n_out && st == MS_OK; o++) {
        st = output_grad(t, r, o, &dout[o], err);
        call.dout[o] = &dout[o];
    }
    for (int i = 0; i < r->n_in && st == MS_OK; i++)
        if (wants_grad(t, r, def, i)) st = input_grad(t, r, i, &pending[i], &call.din[i], err);
    if (st == MS_OK) {
        st = def->backward(&call, err);
        if (st != MS_OK) st = ms_fail_wrap(err, st, "tape backward of %s", def->name);
    }
    for (int i = 0; i < r->n_in; i++) {
        if (!pending[i].local.storage) continue;
        if (st == MS_OK)
            st = accumulate(t, &t->v[r->in_val[i]], &pending[i], err);
        else
            ms_dtensor_release(&pending[i]);
    }
    for (int o = 0; o < r->n_out; o++) ms_tensor_release(&dout[o]);
    return st;
}

static ms_status check_loss(ms_tape *t, const ms_dtensor *loss, int *val, ms_error *err) {
    MS_CHECK(check_usable(t, loss, "backward", err));
    int64_t n = 1;
    for (int d = 0; d < loss->ndim; d++) n *= loss->gshape[d];
    if (n != 1) {
        char s[64];
        return ms_fail(err, MS_ERR_INVALID,
                       "tape backward: the loss must be a scalar, got shape %s; reduce it first "
                       "(MS_OP_MEAN or MS_OP_SUM with i[0] = -1)",
                       ms_shape_str(loss->gshape, loss->ndim, s, sizeof s));
    }
    *val = -1;
    if (!ms_dmesh_is_member(loss->mesh)) return MS_OK; /* nothing recorded here */
    *val = find_val(t, loss);
    if (*val < 0 || t->v[*val].leaf)
        return ms_fail(err, MS_ERR_INVALID,
                       "tape backward: the loss was not recorded on this tape; compute it with "
                       "ms_tape_op from tensors passed to ms_tape_watch");
    return MS_OK;
}

/* Leaves into their own placements (graph mode's gradient sync); zeros for unused ones. */
static ms_status sync_leaves(ms_tape *t, ms_error *err) {
    for (int i = 0; i < t->nv; i++) {
        tape_val *v = &t->v[i];
        if (!v->leaf) {
            if (v->has_grad) ms_dtensor_release(&v->grad);
            v->has_grad = false;
        } else if (!v->has_grad) {
            MS_CHECK(zeros(t, v, &v->pl, &v->grad, err));
            v->has_grad = true;
        } else if (!ms_placements_eq(&v->grad.pl, &v->pl)) {
            MS_CHECK(ms_reshard(&v->grad, &v->pl, NULL, err));
        }
    }
    return MS_OK;
}

ms_status ms_tape_backward(ms_tape *t, const ms_dtensor *loss, ms_error *err) {
    int lv = -1;
    MS_CHECK(check_loss(t, loss, &lv, err));
    if (lv < 0) { /* a rank outside the mesh */
        t->done = true;
        return MS_OK;
    }
    /* d loss / d loss = 1, replicated: the dual of any partial placement (graph mode's seed) */
    tape_val *l = &t->v[lv];
    ms_placements r = ms_placements_replicated(t->mesh->mesh.ndim);
    MS_CHECK(zeros(t, l, &r, &l->grad, err));
    l->has_grad = true;
    MS_CHECK(MS_CALL_K(t->kc, fill, ms_tensor_f32(&l->grad.local), 1.0f, 1, err));
    t->done = true;
    ms_status st = MS_OK;
    for (int k = t->nr - 1; k >= 0 && st == MS_OK; k--) st = backward_rec(t, &t->r[k], err);
    if (st == MS_OK) st = sync_leaves(t, err);
    for (int k = 0; k < t->nr; k++) { /* what the backward read is no longer needed */
        for (int o = 0; o < MS_OP_MAX_OUT; o++) ms_tensor_release(&t->r[k].out[o]);
        ms_eager_run_release(&t->r[k].run);
    }
    return st;
}

const ms_dtensor *ms_tape_grad(const ms_tape *t, const ms_dtensor *leaf) {
    if (!t->done) return NULL;
    int i = find_val(t, leaf);
    return i >= 0 && t->v[i].leaf && t->v[i].has_grad ? &t->v[i].grad : NULL;
}

/* --- to_static ---------------------------------------------------------------------------- */

/* The recipe's leaves: every leaf and named input the recorded calls read, in tape order;
 * map[tape value] receives its recipe value (-1: none yet). */
static ms_status static_leaves(const ms_tape *t, ms_static_graph *s, int *map, int nparams,
                               const ms_dtensor *const *params, ms_error *err) {
    for (int i = 0; i < t->nv; i++) {
        const tape_val *v = &t->v[i];
        if (!v->leaf && !v->input) continue;
        ms_static_leaf *l = &s->leaves[s->nleaves];
        *l = (ms_static_leaf){.param = v->leaf, .ndim = v->ndim, .pl = v->pl};
        memcpy(l->shape, v->gshape, sizeof l->shape);
        if (v->name[0])
            snprintf(l->name, sizeof l->name, "%s", v->name);
        else
            snprintf(l->name, sizeof l->name, "param%d", s->nleaves);
        map[i] = s->nleaves++;
        if (!v->leaf) continue;
        int k = 0;
        while (k < nparams &&
               !(params[k]->local.storage == v->key && params[k]->local.offset == v->offset))
            k++;
        if (k == nparams)
            return ms_fail(err, MS_ERR_INVALID,
                           "to_static: the watched leaf %s is not among the parameters passed; "
                           "pass every watched tensor",
                           l->name);
        ms_tensor full;
        MS_CHECK(ms_dtensor_full(params[k], &full, err));
        int64_t n = ms_tensor_numel(&full);
        l->values = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
        memcpy(l->values, ms_tensor_f32(&full), sizeof(float) * (size_t)n);
        ms_tensor_release(&full);
    }
    return MS_OK;
}

/* Every recorded call a node, its outputs new recipe values. */
static ms_status static_nodes(const ms_tape *t, ms_static_graph *s, int *map, ms_error *err) {
    int next = s->nleaves;
    for (int k = 0; k < t->nr; k++) {
        const tape_rec *r = &t->r[k];
        ms_static_node *n = &s->nodes[s->nnodes++];
        *n = (ms_static_node){
            .op = r->op, .attrs = r->run.attrs, .n_in = r->n_in, .n_out = r->n_out};
        for (int i = 0; i < r->n_in; i++) {
            if (r->in_val[i] < 0 || map[r->in_val[i]] < 0) {
                const ms_op_def *def = ms_op_get(r->op);
                return ms_fail(err, MS_ERR_INVALID,
                               "to_static: call %d (%s) reads input %d, which the tape does not "
                               "track; name the batch's tensors with ms_tape_input",
                               k, def ? def->name : "op", i);
            }
            n->in[i] = map[r->in_val[i]];
        }
        for (int o = 0; o < r->n_out; o++) {
            map[r->out_val[o]] = next;
            n->out[o] = next++;
            n->out_pl[o] = r->run.ch.out_pl[o];
        }
    }
    s->nvalues = next;
    return MS_OK;
}

ms_status ms_tape_to_static(const ms_tape *t, const ms_dtensor *loss, int nparams,
                            const ms_dtensor *const *params, ms_static_graph **out, ms_error *err) {
    *out = NULL;
    if (t->done)
        return ms_fail(err, MS_ERR_INVALID,
                       "to_static: the backward already ran on this recording; convert the step "
                       "after its forward, before ms_tape_backward");
    int lv = ms_dmesh_is_member(loss->mesh) ? find_val(t, loss) : -1;
    if (lv < 0 || t->nr == 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "to_static: the loss was not recorded on this tape (record the step on "
                       "a mesh this rank belongs to)");
    ms_static_graph *s = xcalloc(1, sizeof *s);
    s->leaves = xcalloc((size_t)t->nv, sizeof *s->leaves);
    s->nodes = xcalloc((size_t)t->nr, sizeof *s->nodes);
    int *map = xmalloc(sizeof(int) * (size_t)t->nv);
    for (int i = 0; i < t->nv; i++) map[i] = -1;
    ms_status st = static_leaves(t, s, map, nparams, params, err);
    if (st == MS_OK) st = static_nodes(t, s, map, err);
    if (st == MS_OK) s->loss = map[lv];
    free(map);
    if (st != MS_OK) {
        ms_static_free(s);
        return st;
    }
    *out = s;
    return MS_OK;
}

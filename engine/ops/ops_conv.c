/* ops_conv.c - conv1d and conv2d in NCHW, as PyTorch's and ONNX's:
 *   conv1d: x [N, C_in, L],    w [C_out, C_in / groups, K],      bias [C_out] -> [N, C_out, L_out]
 *   conv2d: x [N, C_in, H, W], w [C_out, C_in / groups, KH, KW], bias [C_out]
 *           -> [N, C_out, H_out, W_out]
 * with, per spatial dim s of nsp (1 or 2), i[s] the stride, i[nsp + s] the padding (the same
 * before and after: ONNX's asymmetric pads are a pad op first), i[2 nsp + s] the dilation, and
 * i[3 nsp] the groups (dividing C_in and C_out; groups = C_in is depthwise). Every one is
 * explicit: a zero stride, dilation or groups is an error, not a default. Output size
 * (in + 2 pad - dilation (k - 1) - 1) / stride + 1. i[3 nsp + 1] = 1 applies a ReLU after the
 * bias, in the kernel's last pass over the output (the ONNX importer fuses Conv then Relu);
 * the backward masks dout by the output first, into saved[1]. A ReLU does not distribute over
 * a partial sum, so such a conv has no partial candidates.
 *
 * The bias is the op's optional third input, as linear's (ops_layers.c), not a separate add:
 * its gradient is a sum of the dout the backward reads anyway, and each candidate places it
 * with the output channels, sharded with them (column parallel) or partial where the output is
 * (row parallel, so that it is added once in the sum). An add would need the bias as
 * [C_out, 1, 1] and a second pass over the output.
 *
 * Rules along one mesh dim (x, w, bias -> out):
 *   R, R, R -> R
 *   S(0), R, R -> S(0)         batch; the weight's and bias's gradients are partial sums
 *   R, S(0), S(0) -> S(1)      output channels (column parallel)
 *   S(1), S(0), S(0) -> S(1)   groups > 1: whole groups with their input channels
 *   S(1), S(1), P -> P         groups = 1: input channels (row parallel)
 *   P, R, P -> P and R, P, P -> P: linear in x and in w
 * A grouped conv shards channels by whole groups: a rank's output channels must be whole
 * groups, or part of one group, and its x must hold those groups' input channels (only those,
 * or every channel, a rank then reading its groups' from its box start). A candidate is
 * offered only where the mesh dim's balanced split gives such shards, and `valid` checks the
 * N-d boxes of every rank. The input channels of a grouped conv never split: a rank would
 * need a slice of every group, which is not one box of x.
 *
 * Kernels: im2col and GEMMs through the rank's table (conv.h); the column buffer is saved[0],
 * sized by the table's conv_scratch_floats, as attention keeps its scratch.
 */
#include <stdio.h>
#include <string.h>

#include "engine/kernels/conv.h"
#include "engine/kernels/elementwise_ext.h"
#include "engine/ops/op_defs.h"

static int64_t a_stride(const ms_op_attrs *a, int s) {
    return a->i[s];
}
static int64_t a_pad(const ms_op_attrs *a, int nsp, int s) {
    return a->i[nsp + s];
}
static int64_t a_dil(const ms_op_attrs *a, int nsp, int s) {
    return a->i[2 * nsp + s];
}
static int a_groups_slot(int nsp) {
    return 3 * nsp;
}
static int64_t a_groups(const ms_op_attrs *a, int nsp) {
    return a->i[a_groups_slot(nsp)];
}
static int a_relu_slot(int nsp) {
    return 3 * nsp + 1;
}
static bool a_relu(const ms_op_attrs *a, int nsp) {
    return a->i[a_relu_slot(nsp)] != 0;
}
/* Output channels per group of the global weight (0 for groups < 1, which infer refuses). */
static int64_t cout_per_group(const ms_shape *w, int64_t groups) {
    return groups >= 1 ? w->d[0] / groups : 0;
}
static const char *dim_name(int nsp, int s) {
    return nsp == 1 ? "L" : s == 0 ? "H" : "W";
}

/* --- shapes --------------------------------------------------------------------------------- */

/* Stride and dilation at least 1, padding at least 0, each error naming its slot. */
static ms_status conv_check_attrs(int nsp, const char *op, const ms_op_attrs *a, const char *shapes,
                                  ms_error *err) {
    static const char *const what[3] = {"stride", "padding", "dilation"};
    for (int k = 0; k < 3; k++)
        for (int s = 0; s < nsp; s++) {
            int slot = k * nsp + s;
            int64_t v = a->i[slot], least = k == 1 ? 0 : 1;
            if (v < least)
                return ms_fail(err, MS_ERR_INVALID,
                               "%s: %s along %s (i[%d]) is %lld, must be at least %lld; got %s", op,
                               what[k], dim_name(nsp, s), slot, (long long)v, (long long)least,
                               shapes);
        }
    if (a_groups(a, nsp) < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: groups (i[%d]) is %lld, must be at least 1 (1 for a plain "
                       "convolution); got %s",
                       op, a_groups_slot(nsp), (long long)a_groups(a, nsp), shapes);
    const int64_t relu = a->i[a_relu_slot(nsp)];
    if (relu != 0 && relu != 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the ReLU flag (i[%d]) is %lld, must be 0 (none) or 1 (a ReLU after "
                       "the bias); got %s",
                       op, a_relu_slot(nsp), (long long)relu, shapes);
    return MS_OK;
}

/* Groups dividing both channel counts, the weight's dim 1 their quotient. */
static ms_status conv_check_groups(int nsp, const char *op, const ms_op_attrs *a,
                                   const ms_shape *in, const char *shapes, ms_error *err) {
    int64_t g = a_groups(a, nsp), cin = in[0].d[1], cout = in[1].d[0];
    if (cin % g || cout % g)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: groups = %lld (i[%d]) must divide C_in = %lld and C_out = %lld; got "
                       "%s; pick groups dividing both (C_in for a depthwise conv)",
                       op, (long long)g, a_groups_slot(nsp), (long long)cin, (long long)cout,
                       shapes);
    if (in[1].d[1] != cin / g)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the weight's dim 1 must be C_in / groups = %lld / %lld = %lld; got %s",
                       op, (long long)cin, (long long)g, (long long)(cin / g), shapes);
    return MS_OK;
}

/* Each dilated kernel within its padded input, so the output has at least one position. */
static ms_status conv_check_extent(int nsp, const char *op, const ms_op_attrs *a,
                                   const ms_shape *in, const char *shapes, ms_error *err) {
    for (int s = 0; s < nsp; s++) {
        int64_t len = in[0].d[2 + s], k = in[1].d[2 + s], p = a_pad(a, nsp, s);
        int64_t dil = a_dil(a, nsp, s), span = dil * (k - 1) + 1;
        if (k < 1)
            return ms_fail(err, MS_ERR_INVALID, "%s: the kernel has %lld taps along %s; got %s", op,
                           (long long)k, dim_name(nsp, s), shapes);
        if (span > len + 2 * p)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: along %s the kernel spans %lld (%lld taps, dilation %lld), more "
                           "than the padded input's %lld (%lld + 2 x %lld padding); got %s; use a "
                           "smaller kernel or dilation, or more padding",
                           op, dim_name(nsp, s), (long long)span, (long long)k, (long long)dil,
                           (long long)(len + 2 * p), (long long)len, (long long)p, shapes);
    }
    return MS_OK;
}

static ms_status conv_infer(int nsp, const char *op, const ms_op_attrs *a, int n_in,
                            const ms_shape *in, ms_shape *out, ms_error *err) {
    char shapes[240];
    ms_op_shapes_str(n_in, in, shapes, sizeof shapes);
    const ms_shape *x = &in[0], *w = &in[1];
    bool ok = n_in >= 2 && x->ndim == 2 + nsp && w->ndim == 2 + nsp && x->d[1] >= 1 &&
              w->d[0] >= 1 && x->d[0] >= 0;
    if (ok && n_in == 3) ok = in[2].ndim == 1 && in[2].d[0] == w->d[0];
    if (!ok)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: x must be %s, the weight %s and the optional bias [C_out]; got %s", op,
                       nsp == 1 ? "[N, C_in, L]" : "[N, C_in, H, W]",
                       nsp == 1 ? "[C_out, C_in / groups, K]" : "[C_out, C_in / groups, KH, KW]",
                       shapes);
    MS_CHECK(conv_check_attrs(nsp, op, a, shapes, err));
    MS_CHECK(conv_check_groups(nsp, op, a, in, shapes, err));
    MS_CHECK(conv_check_extent(nsp, op, a, in, shapes, err));
    out->ndim = 2 + nsp;
    out->d[0] = x->d[0], out->d[1] = w->d[0];
    for (int s = 0; s < nsp; s++)
        out->d[2 + s] = ms_k_conv_out_size(x->d[2 + s], w->d[2 + s], a_stride(a, s),
                                           a_pad(a, nsp, s), a_dil(a, nsp, s));
    return MS_OK;
}

/* --- a rank's channels ------------------------------------------------------------------------ */

/* One rank's boxes: output channels [o0, o0 + ol) (the weight's dim 0), the weight's input
 * channels [i0, i0 + il) (dim 1) and x's channels [x0, x0 + xl). */
typedef struct conv_box {
    int64_t o0, ol, i0, il, x0, xl;
} conv_box;

/* The groups, channels per group and first channel read of a call from its boxes, in a conv of
 * `groups` groups of cout_g output and cin_g input channels each. g is filled in any case
 * (sizes an upper bound); false when the output channels are neither whole groups nor part of
 * one, several groups hold part of their input channels, or x lacks channels they read. */
static bool conv_local(int64_t groups, int64_t cout_g, int64_t cin_g, const conv_box *b,
                       ms_k_conv *g) {
    g->cin_g = b->il, g->c_x = b->xl, g->c0 = 0;
    if (b->ol == 0 || cout_g < 1) {
        g->groups = g->cout_g = 0;
        return cout_g >= 1;
    }
    int64_t grp0 = b->o0 / cout_g;
    bool ok = true;
    if ((b->o0 + b->ol - 1) / cout_g == grp0) {
        g->groups = 1, g->cout_g = b->ol;
    } else {
        ok = b->o0 % cout_g == 0 && b->ol % cout_g == 0;
        g->cout_g = cout_g, g->groups = (b->ol + cout_g - 1) / cout_g;
    }
    ok = ok && (g->groups == 1 || b->il == cin_g) && grp0 + g->groups <= groups;
    int64_t c0 = grp0 * cin_g + b->i0 - b->x0;
    ok = ok && c0 >= 0 && c0 + g->groups * b->il <= b->xl;
    if (ok) g->c0 = c0;
    return ok;
}

/* Whether every part of a balanced n-way split gives a rank channels it can run: the output
 * channels split, and x's channels with them (x_split) or whole. */
static bool conv_parts_ok(int64_t groups, const ms_shape *in, int n, bool x_split) {
    int64_t cout = in[1].d[0], cin_g = in[1].d[1], cin = in[0].d[1];
    for (int r = 0; r < n; r++) {
        conv_box b = {.i0 = 0, .il = cin_g, .x0 = 0, .xl = cin};
        ms_split_part(cout, n, r, &b.o0, &b.ol);
        if (x_split) ms_split_part(cin, n, r, &b.x0, &b.xl);
        ms_k_conv g;
        if (!conv_local(groups, cout_per_group(&in[1], groups), cin_g, &b, &g)) return false;
    }
    return true;
}

static void conv_cand(ms_rule_cand *c, int n_in, ms_placement x, ms_placement w, ms_placement b,
                      ms_placement out) {
    c->in[0] = x, c->in[1] = w, c->out[0] = out;
    if (n_in == 3) c->in[2] = b;
}

static int conv_rule(int nsp, const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                     ms_rule_cand *c) {
    int64_t groups = a_groups(a, nsp);
    int k = 0;
    conv_cand(&c[k++], n_in, ms_R(), ms_R(), ms_R(), ms_R());
    conv_cand(&c[k++], n_in, ms_S(0), ms_R(), ms_R(), ms_S(0));
    if (conv_parts_ok(groups, in, n, false))
        conv_cand(&c[k++], n_in, ms_R(), ms_S(0), ms_S(0), ms_S(1));
    if (groups > 1 && conv_parts_ok(groups, in, n, true))
        conv_cand(&c[k++], n_in, ms_S(1), ms_S(0), ms_S(0), ms_S(1));
    if (a_relu(a, nsp)) return k; /* max(., 0) of a partial sum is not a partial sum */
    if (groups == 1) conv_cand(&c[k++], n_in, ms_S(1), ms_S(1), ms_Psum(), ms_Psum());
    conv_cand(&c[k++], n_in, ms_Psum(), ms_R(), ms_Psum(), ms_Psum());
    conv_cand(&c[k++], n_in, ms_R(), ms_Psum(), ms_Psum(), ms_Psum());
    return k;
}

/* Whether the placements along mesh dim m are one of the rule's candidates for its size. */
static bool conv_is_cand(int nsp, const ms_op_attrs *a, int n_in, const ms_shape *in,
                         const ms_placements *pl, int m, int size) {
    ms_rule_cand c[MS_OP_MAX_CANDS];
    int nc = conv_rule(nsp, a, n_in, in, size, c);
    for (int k = 0; k < nc; k++) {
        bool same = true;
        for (int i = 0; i < n_in; i++) same &= ms_placement_same_kind(pl[i].p[m], c[k].in[i]);
        if (same) return true;
    }
    return false;
}

/* Every rank's boxes under the N-d placements: channels it can run, its bias with its output
 * channels. The engine chooses a candidate mesh dim by mesh dim (select.c), the dims not yet
 * chosen still as the inputs lie: a dim whose placements are no candidate is one of those,
 * checked as replicated (its R candidate can always make it so). Shards nest in mesh-dim
 * order, as the engine runs them whatever order the trial has. */
static bool conv_valid(int nsp, const ms_op_attrs *a, int n_in, const ms_shape *in,
                       const ms_placements *pl_in, const int *mesh_shape) {
    int64_t groups = a_groups(a, nsp), cin_g = in[1].d[1];
    ms_placements pl[3];
    ms_mesh mesh = {.ndim = pl_in[0].n};
    int coords[MS_MESH_MAX_DIMS] = {0}, ranks = 1;
    for (int i = 0; i < n_in; i++) pl[i] = pl_in[i];
    for (int m = 0; m < mesh.ndim; m++) {
        mesh.shape[m] = mesh_shape[m], ranks *= mesh_shape[m];
        if (conv_is_cand(nsp, a, n_in, in, pl_in, m, mesh_shape[m])) continue;
        for (int i = 0; i < n_in; i++) pl[i].p[m] = ms_R();
    }
    for (int i = 0; i < n_in; i++) ms_placements_default_order(&pl[i]);
    for (int r = 0; r < ranks; r++) {
        for (int m = mesh.ndim - 1, rem = r; m >= 0; rem /= mesh_shape[m], m--)
            coords[m] = rem % mesh_shape[m];
        int64_t xs[MS_MAX_DIMS], xl[MS_MAX_DIMS], ws[MS_MAX_DIMS], wl[MS_MAX_DIMS];
        ms_local_box(&pl[0], &mesh, coords, in[0].ndim, in[0].d, xs, xl);
        ms_local_box(&pl[1], &mesh, coords, in[1].ndim, in[1].d, ws, wl);
        conv_box b = {.o0 = ws[0], .ol = wl[0], .i0 = ws[1], .il = wl[1], .x0 = xs[1], .xl = xl[1]};
        ms_k_conv g;
        if (!conv_local(groups, cout_per_group(&in[1], groups), cin_g, &b, &g)) return false;
        if (n_in == 3) {
            int64_t bs, bl;
            ms_local_box(&pl[2], &mesh, coords, 1, in[2].d, &bs, &bl);
            if (bs != ws[0] || bl != wl[0]) return false;
        }
    }
    return true;
}

/* --- the call --------------------------------------------------------------------------------- */

/* The call's geometry from its local shapes and box starts; false (g still sized) when its
 * channels cannot run (valid keeps such placements away). */
static bool conv_geom(int nsp, const ms_op_call *c, ms_k_conv *g) {
    const ms_tensor *x = c->in[0], *w = c->in[1];
    const ms_op_attrs *a = c->attrs;
    int64_t groups = a_groups(a, nsp);
    conv_box b = {.o0 = c->in_start[1][0],
                  .ol = w->shape[0],
                  .i0 = c->in_start[1][1],
                  .il = w->shape[1],
                  .x0 = c->in_start[0][1],
                  .xl = x->shape[1]};
    memset(g, 0, sizeof *g);
    bool ok = conv_local(groups, cout_per_group(&c->gin[1], groups), c->gin[1].d[1], &b, g);
    g->n = x->shape[0];
    int64_t *hw[2] = {&g->h, &g->w}, *k[2] = {&g->kh, &g->kw}, *o[2] = {&g->oh, &g->ow};
    int64_t *st[2] = {&g->sh, &g->sw}, *pd[2] = {&g->ph, &g->pw}, *dl[2] = {&g->dh, &g->dw};
    for (int s = 0; s < 2; s++) /* conv1d is the conv2d of height 1 */
        *hw[s] = *k[s] = *o[s] = *st[s] = *dl[s] = 1, *pd[s] = 0;
    for (int s = 0; s < nsp; s++) {
        int t = 2 - nsp + s; /* conv1d's one dim is the width */
        *hw[t] = x->shape[2 + s], *k[t] = w->shape[2 + s];
        *st[t] = a_stride(a, s), *pd[t] = a_pad(a, nsp, s), *dl[t] = a_dil(a, nsp, s);
        *o[t] = ms_k_conv_out_size(*hw[t], *k[t], *st[t], *pd[t], *dl[t]);
    }
    if (c->n_in == 3) ok = ok && c->in[2]->shape[0] == w->shape[0] && c->in_start[2][0] == b.o0;
    return ok;
}

static ms_status conv_call_geom(int nsp, const char *op, const ms_op_call *c, ms_k_conv *g,
                                ms_error *err) {
    if (conv_geom(nsp, c, g)) return MS_OK;
    return ms_fail(err, MS_ERR_INVALID,
                   "%s: this rank holds output channels [%lld, +%lld) of the weight with input "
                   "channels [%lld, +%lld) per group and x's channels [%lld, +%lld), of a conv of "
                   "%lld groups: not whole groups (or part of one) with their input channels and "
                   "bias; shard channels by a degree that divides the groups",
                   op, (long long)c->in_start[1][0], (long long)c->in[1]->shape[0],
                   (long long)c->in_start[1][1], (long long)c->in[1]->shape[1],
                   (long long)c->in_start[0][1], (long long)c->in[0]->shape[1],
                   (long long)a_groups(c->attrs, nsp));
}

/* saved[0]: the kernels' scratch; saved[1] with a ReLU: dout masked by the output. */
static void conv_saved(int nsp, const ms_op_call *c, int64_t *sizes) {
    ms_k_conv g;
    conv_geom(nsp, c, &g);
    sizes[0] = c->kc->k->conv_scratch_floats(&g);
    sizes[1] = a_relu(c->attrs, nsp) ? g.n * g.groups * g.cout_g * g.oh * g.ow : 0;
}

static ms_status conv_forward(int nsp, const char *op, ms_op_call *c, ms_error *e) {
    ms_k_conv g;
    MS_CHECK(conv_call_geom(nsp, op, c, &g, e));
    g.relu = a_relu(c->attrs, nsp);
    return MS_CALL_K(c->kc, conv_forward, &g, F(c->out[0]), F(c->saved[0]), F(c->in[0]),
                     F(c->in[1]), c->n_in == 3 ? F(c->in[2]) : NULL, e);
}

static ms_status conv_backward(int nsp, const char *op, ms_op_call *c, ms_error *e) {
    float *db = c->n_in == 3 ? F(c->din[2]) : NULL;
    if (!c->din[0] && !c->din[1] && !db) return MS_OK;
    ms_k_conv g;
    MS_CHECK(conv_call_geom(nsp, op, c, &g, e));
    float *dout = F(c->dout[0]);
    if (a_relu(c->attrs, nsp)) { /* the ReLU's gradient: dout where the output is positive */
        dout = F(c->saved[1]);
        MS_CHECK(MS_CALL_K(c->kc, unary_backward, MS_K_UN_RELU, dout, F(c->out[0]), F(c->out[0]),
                           F(c->dout[0]), N(c->out[0]), 0.0f, 0.0f, true, e));
    }
    return MS_CALL_K(c->kc, conv_backward, &g, F(c->din[0]), F(c->din[1]), db, F(c->saved[0]), dout,
                     F(c->in[0]), F(c->in[1]), c->din_fresh & 7u, e);
}

static ms_k_cost conv_cost(int nsp, const ms_op_call *c, bool backward) {
    ms_k_conv g;
    conv_geom(nsp, c, &g);
    return ms_k_conv_cost(&g, c->n_in == 3, backward);
}

static bool conv_runs_on(const ms_kernels *k) {
    return k->conv_scratch_floats && k->conv_forward && k->conv_backward && k->unary_backward;
}

/* Each op's row: its functions bound to its number of spatial dims. */
#define CONV_ROW(op, KIND, NSP)                                                                    \
    static ms_status op##_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out, \
                                ms_error *err) {                                                   \
        return conv_infer(NSP, #op, a, n_in, in, out, err);                                        \
    }                                                                                              \
    static int op##_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,                \
                         ms_rule_cand *c) {                                                        \
        return conv_rule(NSP, a, n_in, in, n, c);                                                  \
    }                                                                                              \
    static bool op##_valid(const ms_op_attrs *a, int n_in, const ms_shape *in,                     \
                           const ms_placements *pl, const int *mesh_shape) {                       \
        return conv_valid(NSP, a, n_in, in, pl, mesh_shape);                                       \
    }                                                                                              \
    static void op##_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {            \
        (void)a;                                                                                   \
        conv_saved(NSP, c, sizes);                                                                 \
    }                                                                                              \
    static ms_status op##_forward(ms_op_call *c, ms_error *e) {                                    \
        return conv_forward(NSP, #op, c, e);                                                       \
    }                                                                                              \
    static ms_status op##_backward(ms_op_call *c, ms_error *e) {                                   \
        return conv_backward(NSP, #op, c, e);                                                      \
    }                                                                                              \
    static ms_k_cost op##_cost(const ms_op_call *c, bool bw) {                                     \
        return conv_cost(NSP, c, bw);                                                              \
    }                                                                                              \
    const ms_op_def ms_op_##op##_def = {                                                           \
        .kind = KIND,                                                                              \
        .name = #op,                                                                               \
        .n_in = -3,                                                                                \
        .n_out = 1,                                                                                \
        .infer = op##_infer,                                                                       \
        .rule = op##_rule,                                                                         \
        .valid = op##_valid,                                                                       \
        .saved_floats = op##_saved,                                                                \
        .forward = op##_forward,                                                                   \
        .backward = op##_backward,                                                                 \
        .cost = op##_cost,                                                                         \
        .runs_on = conv_runs_on,                                                                   \
        .grad_inputs = 7,                                                                          \
        .fresh_ok = 7, /* the kernels zero a fresh gradient, or write it */                        \
    };

CONV_ROW(conv1d, MS_OP_CONV1D, 1)
CONV_ROW(conv2d, MS_OP_CONV2D, 2)

/* graph.c - recording a model as values and operator nodes with global shapes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/graph/graph_impl.h"

ms_graph *ms_graph_create(void) {
    ms_graph *g = xcalloc(1, sizeof *g);
    g->loss = -1;
    g->output = -1;
    for (int k = 0; k < MS_REGION_KIND_COUNT; k++) g->open_region[k] = -1;
    return g;
}

void ms_graph_destroy(ms_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->nv; i++) free(g->v[i].data);
    free(g->v);
    free(g->n);
    free(g);
}

/* Records the first build error; later calls keep returning -1 through `failed`. */
static int build_fail(ms_graph *g, ms_status code, const char *fmt, const char *a, const char *b) {
    if (!g->failed) {
        char msg[MS_ERROR_MSG_MAX + 200];
        snprintf(msg, sizeof msg, fmt, a, b);
        ms_fail(&g->err, code, "%s", msg);
    }
    g->failed = true;
    return -1;
}

static int add_value(ms_graph *g, const char *name, gv_kind kind, const ms_shape *shape) {
    if (g->nv == g->cv) {
        g->cv = g->cv ? g->cv * 2 : 64;
        g->v = xrealloc(g->v, sizeof *g->v * (size_t)g->cv);
    }
    gvalue *v = &g->v[g->nv];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name ? name : "");
    v->kind = kind;
    v->shape = *shape;
    v->producer = v->producer_out = -1;
    v->assign = -1;
    return g->nv++;
}

static bool shape_ok(ms_graph *g, const char *name, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > MS_MAX_DIMS) {
        build_fail(g, MS_ERR_INVALID, "value '%s': rank outside 0..8%s", name, "");
        return false;
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0) {
            build_fail(g, MS_ERR_INVALID, "value '%s': negative dim%s", name, "");
            return false;
        }
    return true;
}

int ms_graph_param(ms_graph *g, const char *name, int ndim, const int64_t *shape, ms_init init) {
    if (g->failed || !shape_ok(g, name, ndim, shape)) return -1;
    if (ms_graph_find(g, name) >= 0)
        return build_fail(g, MS_ERR_INVALID, "two values are named '%s'%s", name, "");
    ms_shape s = {.ndim = ndim};
    memcpy(s.d, shape, sizeof(int64_t) * (size_t)ndim);
    int v = add_value(g, name, GV_PARAM, &s);
    g->v[v].init = init;
    return v;
}

int ms_graph_buffer(ms_graph *g, const char *name, int ndim, const int64_t *shape, ms_init init) {
    int v = ms_graph_param(g, name, ndim, shape, init);
    if (v >= 0) g->v[v].kind = GV_BUFFER;
    return v;
}

int ms_graph_constant(ms_graph *g, const char *name, int ndim, const int64_t *shape,
                      const float *values) {
    int v = ms_graph_buffer(g, name, ndim, shape, (ms_init){MS_INIT_DATA, 0.0f});
    if (v < 0) return v;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    g->v[v].data = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
    memcpy(g->v[v].data, values, sizeof(float) * (size_t)n);
    return v;
}

void ms_graph_assign(ms_graph *g, int buffer, int v) {
    if (g->failed) return;
    if (buffer < 0 || buffer >= g->nv || g->v[buffer].kind != GV_BUFFER || v < 0 || v >= g->nv) {
        build_fail(g, MS_ERR_INVALID, "assign: value %s is not a buffer of this graph%s",
                   buffer >= 0 && buffer < g->nv ? g->v[buffer].name : "?", "");
        return;
    }
    const ms_shape *a = &g->v[buffer].shape, *b = &g->v[v].shape;
    bool same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->d[d] == b->d[d];
    if (!same || g->v[buffer].assign >= 0) {
        build_fail(g, MS_ERR_INVALID,
                   same ? "assign: buffer '%s' already takes a value%s"
                        : "assign: buffer '%s' and value '%s' differ in shape",
                   g->v[buffer].name, g->v[v].name);
        return;
    }
    g->v[buffer].assign = v;
    g->v[v].assigned = true;
}

int ms_graph_input(ms_graph *g, const char *name, int ndim, const int64_t *shape) {
    if (g->failed || !shape_ok(g, name, ndim, shape)) return -1;
    ms_shape s = {.ndim = ndim};
    memcpy(s.d, shape, sizeof(int64_t) * (size_t)ndim);
    return add_value(g, name, GV_INPUT, &s);
}

ms_status ms_graph_op_n(ms_graph *g, int op, const ms_op_attrs *attrs, int n_in, const int *in,
                        int n_out, int *out, const char *name) {
    for (int o = 0; o < n_out; o++) out[o] = -1;
    if (g->failed) return g->err.code;
    const ms_op_def *def = ms_op_get(op);
    if (!def)
        return build_fail(g, MS_ERR_INVALID, "node '%s': unknown operator%s", name, ""),
               g->err.code;
    bool in_ok = def->n_in > 0 ? n_in == def->n_in : n_in >= 1 && n_in <= -def->n_in;
    bool out_ok = def->n_out > 0 ? n_out == def->n_out : n_out >= 1 && n_out <= -def->n_out;
    if (!in_ok || !out_ok) {
        build_fail(g, MS_ERR_INVALID, "node '%s': wrong number of inputs or outputs for %s", name,
                   def->name);
        return g->err.code;
    }
    ms_shape ins[MS_OP_MAX_IN], outs[MS_OP_MAX_OUT];
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0 || in[i] >= g->nv) {
            build_fail(g, MS_ERR_INVALID, "node '%s': input is not a value of this graph%s", name,
                       "");
            return g->err.code;
        }
        ins[i] = g->v[in[i]].shape;
    }
    ms_op_attrs a = attrs ? *attrs : (ms_op_attrs){0};
    ms_error e = {0};
    if (def->infer(&a, n_in, ins, outs, &e) != MS_OK) {
        build_fail(g, e.code, "node '%s': %s", name, e.msg);
        return g->err.code;
    }
    if (g->nn == g->cn) {
        g->cn = g->cn ? g->cn * 2 : 64;
        g->n = xrealloc(g->n, sizeof *g->n * (size_t)g->cn);
    }
    gnode *nd = &g->n[g->nn];
    memset(nd, 0, sizeof *nd);
    nd->op = op;
    nd->attrs = a;
    nd->n_in = n_in;
    nd->n_out = n_out;
    memcpy(nd->in, in, sizeof(int) * (size_t)n_in);
    snprintf(nd->name, sizeof nd->name, "%s", name ? name : def->name);
    memcpy(nd->region, g->open_region, sizeof nd->region);
    for (int o = 0; o < n_out; o++) {
        char vname[120];
        if (n_out == 1)
            snprintf(vname, sizeof vname, "%s", nd->name);
        else
            snprintf(vname, sizeof vname, "%s.%d", nd->name, o);
        int v = add_value(g, vname, GV_ACT, &outs[o]);
        g->v[v].producer = g->nn;
        g->v[v].producer_out = o;
        g->n[g->nn].out[o] = v;
        out[o] = v;
    }
    g->nn++;
    return MS_OK;
}

int ms_graph_op(ms_graph *g, int op, const ms_op_attrs *attrs, int n_in, const int *in,
                const char *name) {
    int out = -1;
    ms_graph_op_n(g, op, attrs, n_in, in, 1, &out, name);
    return out;
}

void ms_graph_region_begin(ms_graph *g, ms_region_kind kind) {
    if ((unsigned)kind >= MS_REGION_KIND_COUNT || g->open_region[kind] >= 0) return;
    g->open_region[kind] = g->n_regions[kind]++;
}

void ms_graph_region_end(ms_graph *g, ms_region_kind kind) {
    if ((unsigned)kind < MS_REGION_KIND_COUNT) g->open_region[kind] = -1;
}

int ms_graph_node_region(const ms_graph *g, int node, ms_region_kind kind) {
    if (node < 0 || node >= g->nn || (unsigned)kind >= MS_REGION_KIND_COUNT) return -1;
    return g->n[node].region[kind];
}

void ms_graph_annotate(ms_graph *g, int v, const ms_placements *pl) {
    if (v < 0 || v >= g->nv) return;
    g->v[v].annotated = true;
    g->v[v].ann = *pl;
}

void ms_graph_set_loss(ms_graph *g, int v) {
    g->loss = v;
}

void ms_graph_set_output(ms_graph *g, int v) {
    g->output = v;
}

void ms_graph_input_grad(ms_graph *g, int v) {
    if (v >= 0 && v < g->nv && g->v[v].kind == GV_INPUT) g->v[v].grad_input = true;
}

void ms_graph_keep(ms_graph *g, int v) {
    if (v >= 0 && v < g->nv) g->v[v].keep = true;
}

ms_status ms_graph_error(const ms_graph *g, ms_error *err) {
    if (!g->failed) return MS_OK;
    if (err) *err = g->err;
    return g->err.code;
}

int ms_graph_num_values(const ms_graph *g) {
    return g->nv;
}
const char *ms_graph_value_name(const ms_graph *g, int v) {
    return g->v[v].name;
}
const ms_shape *ms_graph_value_shape(const ms_graph *g, int v) {
    return &g->v[v].shape;
}
bool ms_graph_is_param(const ms_graph *g, int v) {
    return g->v[v].kind == GV_PARAM;
}

bool ms_graph_is_input(const ms_graph *g, int v) {
    return v >= 0 && v < g->nv && g->v[v].kind == GV_INPUT;
}
bool ms_graph_is_buffer(const ms_graph *g, int v) {
    return g->v[v].kind == GV_BUFFER;
}

bool ms_graph_is_activation(const ms_graph *g, int v) {
    return g->v[v].kind == GV_ACT && g->v[v].producer >= 0;
}

int ms_graph_value_uses(const ms_graph *g, int v) {
    int uses = 0;
    for (int n = 0; n < g->nn; n++)
        for (int i = 0; i < g->n[n].n_in; i++) uses += g->n[n].in[i] == v;
    return uses;
}

int ms_graph_num_nodes(const ms_graph *g) {
    return g->nn;
}

int ms_graph_node_io(const ms_graph *g, int n, int *n_in, const int **in, int *n_out,
                     const int **out) {
    const gnode *node = &g->n[n];
    *n_in = node->n_in, *in = node->in;
    *n_out = node->n_out, *out = node->out;
    return node->op;
}

int ms_graph_find(const ms_graph *g, const char *name) {
    for (int i = 0; i < g->nv; i++)
        if (!strcmp(g->v[i].name, name)) return i;
    return -1;
}

/* --- batch normalisation (see graph.h) ------------------------------------------------------ */

static int bn_op(ms_graph *g, int op, const ms_op_attrs *a, int x, int y, const char *prefix,
                 const char *what) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    const int in[2] = {x, y};
    return ms_graph_op(g, op, a, y < 0 ? 1 : 2, in, name);
}

/* v reshaped to shape (ndim dims). */
static int bn_reshape(ms_graph *g, int v, int ndim, const int64_t *shape, const char *prefix,
                      const char *what) {
    ms_op_attrs a = {.i = {ndim}};
    for (int d = 0; d < ndim; d++) a.i[1 + d] = shape[d];
    return bn_op(g, MS_OP_RESHAPE, &a, v, -1, prefix, what);
}

int ms_graph_batch_norm(ms_graph *g, int x, const char *prefix, int64_t channels, float eps,
                        float momentum) {
    if (g->failed) return -1;
    if (x < 0 || x >= g->nv)
        return build_fail(g, MS_ERR_INVALID, "batch_norm '%s': x is not a value of this graph%s",
                          prefix, "");
    const ms_shape xs = g->v[x].shape;
    if (xs.ndim < 2 || xs.ndim > 6 || xs.d[1] != channels)
        return build_fail(g, MS_ERR_INVALID,
                          "batch_norm '%s': x must be [N, C, ...] (2 to 6 dims) with C the "
                          "channels; got '%s'",
                          prefix, g->v[x].name);
    if (!(eps > 0) || !(momentum >= 0 && momentum <= 1))
        return build_fail(g, MS_ERR_INVALID,
                          "batch_norm '%s': need eps > 0 and momentum in [0, 1]%s", prefix, "");
    char name[128];
    const int64_t c[1] = {channels};
    snprintf(name, sizeof name, "%s.weight", prefix);
    int w = ms_graph_param(g, name, 1, c, (ms_init){MS_INIT_CONST, 1.0f});
    snprintf(name, sizeof name, "%s.bias", prefix);
    int b = ms_graph_param(g, name, 1, c, (ms_init){MS_INIT_CONST, 0.0f});
    snprintf(name, sizeof name, "%s.running_mean", prefix);
    int rm = ms_graph_buffer(g, name, 1, c, (ms_init){MS_INIT_CONST, 0.0f});
    snprintf(name, sizeof name, "%s.running_var", prefix);
    int rv = ms_graph_buffer(g, name, 1, c, (ms_init){MS_INIT_CONST, 1.0f});
    if (g->failed) return -1;
    /* The batch's statistics over every dim but the channels', kept as [1, C, 1...]: sums of
     * a dp-sharded dim are partial, and their reshard to what the next op reads all-reduces. */
    int64_t n = 1;
    ms_op_attrs red = {.i = {0, 1}};
    for (int d = 0; d < xs.ndim; d++)
        if (d != 1) red.i[0] |= 1 << d, n *= xs.d[d];
    int mean4 = bn_op(g, MS_OP_MEAN_DIMS, &red, x, -1, prefix, "batch_mean");
    int sq = bn_op(g, MS_OP_SQUARED_DIFFERENCE, NULL, x, mean4, prefix, "centered_sq");
    int var4 = bn_op(g, MS_OP_MEAN_DIMS, &red, sq, -1, prefix, "batch_var");
    int mean = bn_reshape(g, mean4, 1, c, prefix, "batch_mean_c");
    int var = bn_reshape(g, var4, 1, c, prefix, "batch_var_c");
    /* training: the batch's; evaluation: the running statistics */
    int m = bn_op(g, MS_OP_TRAIN_SELECT, NULL, mean, rm, prefix, "mean");
    int v = bn_op(g, MS_OP_TRAIN_SELECT, NULL, var, rv, prefix, "var");
    ms_op_attrs add_eps = {.f = {eps}};
    int inv = bn_op(g, MS_OP_ADD_SCALAR, &add_eps, v, -1, prefix, "var_eps");
    inv = bn_op(g, MS_OP_RSQRT, NULL, inv, -1, prefix, "inv_std");
    /* y = x * scale + shift per channel: scale = weight / std, shift = bias - mean * scale */
    int scale = bn_op(g, MS_OP_MUL, NULL, inv, w, prefix, "scale");
    int shift = bn_op(g, MS_OP_MUL, NULL, m, scale, prefix, "mean_scaled");
    shift = bn_op(g, MS_OP_SUB, NULL, b, shift, prefix, "shift");
    int64_t bshape[MS_MAX_DIMS];
    bshape[0] = channels;
    for (int d = 2; d < xs.ndim; d++) bshape[d - 1] = 1;
    scale = bn_reshape(g, scale, xs.ndim - 1, bshape, prefix, "scale_b");
    shift = bn_reshape(g, shift, xs.ndim - 1, bshape, prefix, "shift_b");
    int y = bn_op(g, MS_OP_MUL_BCAST, NULL, x, scale, prefix, "scaled");
    y = bn_op(g, MS_OP_ADD_BCAST, NULL, y, shift, prefix, "out");
    /* the running statistics' update, PyTorch's: unbiased variance */
    float unbias = n > 1 ? (float)((double)n / (double)(n - 1)) : 1.0f;
    ms_op_attrs keep = {.f = {1.0f - momentum}}, take = {.f = {momentum}},
                take_v = {.f = {momentum * unbias}};
    int old_m = bn_op(g, MS_OP_SCALE, &keep, rm, -1, prefix, "rm_keep");
    int new_m = bn_op(g, MS_OP_SCALE, &take, mean, -1, prefix, "rm_take");
    int nm = bn_op(g, MS_OP_ADD, NULL, old_m, new_m, prefix, "running_mean_next");
    int old_v = bn_op(g, MS_OP_SCALE, &keep, rv, -1, prefix, "rv_keep");
    int new_v = bn_op(g, MS_OP_SCALE, &take_v, var, -1, prefix, "rv_take");
    int nv = bn_op(g, MS_OP_ADD, NULL, old_v, new_v, prefix, "running_var_next");
    if (g->failed) return -1;
    ms_graph_assign(g, rm, nm);
    ms_graph_assign(g, rv, nv);
    return g->failed ? -1 : y;
}

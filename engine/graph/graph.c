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

int ms_graph_find(const ms_graph *g, const char *name) {
    for (int i = 0; i < g->nv; i++)
        if (!strcmp(g->v[i].name, name)) return i;
    return -1;
}

/* static_graph.c - replaying a recorded eager step as a graph (static_graph.h). */
#include "engine/graph/static_graph.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

ms_status ms_static_build(const ms_static_graph *s, ms_graph *g, int *loss, ms_error *err) {
    int *val = xmalloc(sizeof(int) * (size_t)(s->nvalues ? s->nvalues : 1));
    for (int i = 0; i < s->nvalues; i++) val[i] = -1;
    for (int i = 0; i < s->nleaves; i++) {
        const ms_static_leaf *l = &s->leaves[i];
        val[i] = l->param
                     ? ms_graph_param(g, l->name, l->ndim, l->shape, (ms_init){MS_INIT_CONST, 0.0f})
                     : ms_graph_input(g, l->name, l->ndim, l->shape);
    }
    for (int k = 0; k < s->nnodes; k++) {
        const ms_static_node *n = &s->nodes[k];
        int in[MS_OP_MAX_IN], out[MS_OP_MAX_OUT];
        for (int i = 0; i < n->n_in; i++) in[i] = val[n->in[i]];
        if (n->n_out == 1) {
            out[0] = ms_graph_op(g, n->op, &n->attrs, n->n_in, in, NULL);
        } else if (ms_graph_op_n(g, n->op, &n->attrs, n->n_in, in, n->n_out, out, NULL) != MS_OK) {
            free(val);
            return ms_graph_error(g, err);
        }
        for (int o = 0; o < n->n_out; o++) val[n->out[o]] = out[o];
    }
    *loss = val[s->loss];
    free(val);
    MS_CHECK(ms_graph_error(g, err));
    ms_graph_set_loss(g, *loss);
    return ms_graph_error(g, err);
}

const ms_static_leaf *ms_static_param(const ms_static_graph *s, const char *name) {
    for (int i = 0; i < s->nleaves; i++)
        if (s->leaves[i].param && !strcmp(s->leaves[i].name, name)) return &s->leaves[i];
    return NULL;
}

void ms_static_free(ms_static_graph *s) {
    if (!s) return;
    for (int i = 0; i < s->nleaves; i++) free(s->leaves[i].values);
    free(s->leaves);
    free(s->nodes);
    free(s);
}

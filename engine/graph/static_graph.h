/* static_graph.h - an eager training step made a graph (to_static).
 *
 * ms_tape_to_static (engine/graph/tape.h) turns the calls one eager step recorded into this
 * recipe: its leaves (the watched parameters, with their values and placements at that moment,
 * and the named inputs with theirs), and every recorded call with the placements its outputs
 * ran in. ms_static_build replays it into a graph; the model def made of it
 * (engine/model/static_def.h) places the leaves as the eager step had them, the operators'
 * rules complete the rest, and the trainer gives it its strategies.
 *
 * Ownership: the recipe owns its arrays and the parameters' values; ms_static_free frees it.
 */
#ifndef MS_STATIC_GRAPH_H
#define MS_STATIC_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/graph/graph.h"

typedef struct ms_static_leaf {
    char name[64];
    bool param; /* a parameter (its values below); else a named input */
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    ms_placements pl;
    float *values; /* a parameter's full values, numel floats (owned) */
} ms_static_leaf;

typedef struct ms_static_node {
    int op;
    ms_op_attrs attrs;
    int n_in, n_out;
    int in[MS_OP_MAX_IN];   /* a value: leaves first (0 .. nleaves-1), then node outputs */
    int out[MS_OP_MAX_OUT]; /* the values it makes */
    ms_placements out_pl[MS_OP_MAX_OUT];
} ms_static_node;

typedef struct ms_static_graph {
    ms_static_leaf *leaves;
    int nleaves;
    ms_static_node *nodes;
    int nnodes;
    int nvalues;
    int loss; /* the value that is the loss */
} ms_static_graph;

/* Replays s into g (a fresh graph): parameters initialised to 0 (load their values from the
 * recipe), inputs, every call, the loss set; no annotations. *loss receives its value id. */
ms_status ms_static_build(const ms_static_graph *s, ms_graph *g, int *loss, ms_error *err);
/* The parameter named `name`, or NULL. */
const ms_static_leaf *ms_static_param(const ms_static_graph *s, const char *name);
void ms_static_free(ms_static_graph *s);

#endif

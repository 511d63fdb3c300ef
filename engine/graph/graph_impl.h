/* graph_impl.h - the graph's and the program's internals (private to engine/graph). */
#ifndef MS_GRAPH_IMPL_H
#define MS_GRAPH_IMPL_H

#include "engine/graph/graph.h"

typedef enum gv_kind { GV_PARAM, GV_INPUT, GV_ACT, GV_BUFFER } gv_kind;

typedef struct gvalue {
    char name[96];
    gv_kind kind;
    ms_shape shape;
    ms_init init;
    int producer, producer_out; /* node and output index; -1 for leaves */
    bool annotated;
    bool keep;       /* buffer persists after the step */
    bool grad_input; /* an input that gets a gradient (a pipeline chunk's activation) */
    int assign;      /* buffers: the value written into it after each training forward, or -1 */
    bool assigned;   /* some buffer takes this value (kept fp32 under bf16) */
    float *data;     /* MS_INIT_DATA: the values (owned by the graph) */
    ms_placements ann;
} gvalue;

typedef struct gnode {
    int op;
    ms_op_attrs attrs;
    int n_in, n_out;
    int in[MS_OP_MAX_IN], out[MS_OP_MAX_OUT];
    char name[96];
    int region[MS_REGION_KIND_COUNT]; /* ms_graph_node_region */
} gnode;

struct ms_graph {
    gvalue *v;
    int nv, cv;
    gnode *n;
    int nn, cn;
    int loss;   /* the scalar to minimise, or -1 */
    int output; /* a pipeline chunk's output whose gradient the caller supplies, or -1 */
    bool failed;
    ms_error err;
    int open_region[MS_REGION_KIND_COUNT]; /* the region being recorded, or -1 */
    int n_regions[MS_REGION_KIND_COUNT];
};

#endif

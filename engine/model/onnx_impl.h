/* onnx_impl.h - what the ONNX importer's two files share (onnx_import.c: the file, its checks
 * and the build loop; onnx_ops.c: one mapper per ONNX operator). Private to engine/model. */
#ifndef MS_ONNX_IMPL_H
#define MS_ONNX_IMPL_H

#ifdef MS_HAVE_ONNX

#include <onnx.pb-c.h>

#include "engine/model/onnx_import.h"

/* ONNX TensorProto.DataType values the importer reads. */
enum {
    OX_FLOAT = 1,
    OX_UINT8 = 2,
    OX_INT8 = 3,
    OX_UINT16 = 4,
    OX_INT16 = 5,
    OX_INT32 = 6,
    OX_INT64 = 7,
    OX_STRING = 8,
    OX_BOOL = 9,
    OX_FLOAT16 = 10,
    OX_DOUBLE = 11,
    OX_UINT32 = 12,
    OX_UINT64 = 13,
    OX_BFLOAT16 = 16
};

/* A constant: an initializer, a Constant node's output, a bound input, or one folded at build. */
typedef struct ox_const {
    char *name; /* owned */
    int dtype;
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    int64_t numel;
    double *d; /* owned: the values */
    float *f;  /* owned: the same as floats (what a parameter holds) */
} ox_const;

/* A graph input or output. */
typedef struct ox_io {
    const char *name; /* in the parsed file */
    int dtype;
    int ndim;
    int64_t d[MS_MAX_DIMS];
    bool batch; /* d[0] is the symbolic batch dim */
} ox_io;

struct ms_onnx_model {
    char label[MS_SAFE_LEN]; /* the file, fit for messages */
    Onnx__ModelProto *pb;
    int64_t opset;
    int nin, nout;
    ox_io *in, *out;
    int nconst, cconst;
    ox_const **consts;
};

/* A name bound during build: a graph value, or a constant. */
typedef struct ox_sym {
    const char *name;
    int v;             /* value id, or -1 */
    const ox_const *c; /* or a constant */
} ox_sym;

typedef struct ox_build {
    const ms_onnx_model *m;
    ms_graph *g;
    int batch;
    size_t in_lo, in_hi; /* the nodes built (a pipeline chunk's) */
    bool partial;        /* not the whole graph: inputs only where read */
    int nsym, csym;
    ox_sym *sym;
    int nfold, cfold;
    ox_const **fold;             /* owned: constants folded at build */
    const Onnx__NodeProto *node; /* the node being mapped */
    int tmp;                     /* temporaries named so far in this node */
    size_t at;                   /* its index in the graph's nodes */
    bool next_fusable;           /* the next node is built with it (same part and region) */
    int fused_relu;              /* a value the next node, a Relu, is bound to; -1 none */
} ox_build;

/* Decodes a TensorProto into a constant named name (NULL: the tensor's). */
ms_status ox_decode(const ms_onnx_model *m, const Onnx__TensorProto *t, const char *name,
                    ox_const **out, ms_error *err);
void ox_const_free(ox_const *c);
const char *ox_dtype_name(int dtype);

/* One line naming the file, the current node and its operator, then the problem and fix. */
ms_status ox_fail(ox_build *b, ms_status code, ms_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Node inputs. ox_has: input k is given (present and not ""). */
bool ox_has(const ox_build *b, int k);
/* Input k as a graph value (a constant used as data becomes a parameter). */
ms_status ox_val(ox_build *b, int k, int *v, ms_error *err);
/* Input k as a constant; a refusal naming it when it is computed at run time. */
ms_status ox_const_in(ox_build *b, int k, const ox_const **c, ms_error *err);
/* Whether input k is a constant. */
bool ox_is_const(const ox_build *b, int k);
/* Binds output k to a value, or to a constant (taken over). */
void ox_out(ox_build *b, int k, int v);
void ox_out_const(ox_build *b, int k, ox_const *c);
/* A new constant of ndim dims (values zero), owned by the build. */
ox_const *ox_new_const(ox_build *b, int dtype, int ndim, const int64_t *shape);

/* Whether the current node's output 0 is read by the next node alone, a Relu built with it,
 * and is no graph output: the two may then be one operator (the mapper sets fused_relu). */
bool ox_relu_follows(const ox_build *b);

/* Adds an operator; name: the node's output k name when k >= 0, else a temporary. Returns the
 * value id, or -1 after filling err from the graph's error with the node named. */
int ox_op(ox_build *b, int op, const ms_op_attrs *a, int n_in, const int *in, int k, ms_error *err);
#define OX_OP(var, op, attrs, k, ...)                                                              \
    do {                                                                                           \
        const int ox_in_[] = {__VA_ARGS__};                                                        \
        (var) =                                                                                    \
            ox_op(b, (op), (attrs), (int)(sizeof ox_in_ / sizeof ox_in_[0]), ox_in_, (k), err);    \
        if ((var) < 0) return err->code;                                                           \
    } while (0)

const ms_shape *ox_shape(const ox_build *b, int v);

/* Attributes of the current node. */
const Onnx__AttributeProto *ox_attr(const ox_build *b, const char *name);
int64_t ox_attr_i(const ox_build *b, const char *name, int64_t def);
float ox_attr_f(const ox_build *b, const char *name, float def);
/* The string attribute (def when absent). */
const char *ox_attr_s(const ox_build *b, const char *name, const char *def);
/* The ints attribute into out[max]; returns how many (-1 when absent). */
int ox_attr_ints(const ox_build *b, const char *name, int64_t *out, int max);

/* One ONNX operator's mapper. */
typedef ms_status (*ox_map_fn)(ox_build *b, ms_error *err);
/* The mapper of op_type, or NULL. */
ox_map_fn ox_find_map(const char *op_type);

#endif
#endif

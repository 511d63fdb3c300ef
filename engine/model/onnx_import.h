/* onnx_import.h - reading ONNX models (.onnx files) into meshscope graphs.
 *
 *   open    ms_onnx_open parses the file (protobuf-c over Debian's onnx.proto) and checks it
 *           once: the opset of the default domain within [MS_ONNX_OPSET_MIN, _MAX], every
 *           node's operator one the importer maps, static shapes (the first dim of a graph
 *           input may be symbolic: the batch, resolved at build), element types fp32 (64- and
 *           32-bit integers and bool for index inputs, masks and shape constants) and sizes in
 *           range.
 *   build   ms_onnx_build adds the graph into an ms_graph for `batch` rows: graph inputs become
 *           ms_graph_input values under their ONNX names; initializers (and Constant nodes)
 *           used as data become ms_graph_param values under their ONNX names, initialised to 0
 *           (load the file's values with ms_onnx_initializer + ms_program_load_param after
 *           compiling); constants used as shapes, axes, pads or scales are folded into the
 *           operators' attributes; each node becomes one or a few ms_graph_op calls.
 *
 * Integer and bool tensors travel as fp32 values (meshscope's ids are integer-valued floats):
 * feed an int64 input as floats. Every refusal is MS_ERR_INVALID (a broken or unreadable file)
 * or MS_ERR_UNSUPPORTED (a valid model this importer does not take) with one line naming the
 * file, the node (name and operator) and the fix. Without ONNX support in the build (CMake
 * MS_ENABLE_ONNX), every entry point returns MS_ERR_UNSUPPORTED naming the packages.
 *
 * Ownership: an ms_onnx_model owns the parsed file and everything its accessors return (valid
 * until ms_onnx_close); ms_onnx_build borrows it and adds only to the caller's graph.
 */
#ifndef MS_ONNX_IMPORT_H
#define MS_ONNX_IMPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/graph/graph.h"

#define MS_ONNX_OPSET_MIN 1
#define MS_ONNX_OPSET_MAX 17
#define MS_ONNX_MAX_DIM   (INT64_C(1) << 31) /* one dim */
#define MS_ONNX_MAX_NUMEL (INT64_C(1) << 33) /* one tensor's elements */
#define MS_ONNX_MAX_BYTES (INT64_C(4) << 30) /* the file */

typedef struct ms_onnx_model ms_onnx_model; /* the parsed, checked file */

/* Reads and checks path (see above); *out is the model to close. */
ms_status ms_onnx_open(const char *path, ms_onnx_model **out, ms_error *err);
/* The same over len bytes in memory (copied); label names it in messages. */
ms_status ms_onnx_open_bytes(const void *data, size_t len, const char *label, ms_onnx_model **out,
                             ms_error *err);
void ms_onnx_close(ms_onnx_model *m);

/* The opset of the default domain the model was exported with. */
int64_t ms_onnx_opset(const ms_onnx_model *m);

/* Graph inputs, initializers excluded, in the file's order. */
int ms_onnx_num_inputs(const ms_onnx_model *m);
const char *ms_onnx_input_name(const ms_onnx_model *m, int i);
/* Input i's shape for `batch` rows (the symbolic first dim, if any, becomes batch); returns
 * its rank (0 for a scalar). */
int ms_onnx_input_shape(const ms_onnx_model *m, int i, int batch, int64_t *shape);
/* Whether input i holds integers or bools (fed as integer-valued floats). */
bool ms_onnx_input_is_index(const ms_onnx_model *m, int i);
/* Whether input i's first dim is the symbolic batch dim. */
bool ms_onnx_input_has_batch(const ms_onnx_model *m, int i);

int ms_onnx_num_outputs(const ms_onnx_model *m);
const char *ms_onnx_output_name(const ms_onnx_model *m, int i);

/* A tensor read from a serialized TensorProto (the backend test data's input_K.pb and
 * output_K.pb): its values widened to double (owned: ms_onnx_tensor_free). */
typedef struct ms_onnx_tensor {
    char name[128];
    int dtype; /* ONNX TensorProto.DataType */
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    int64_t numel;
    double *data;
} ms_onnx_tensor;
ms_status ms_onnx_read_tensor(const char *path, ms_onnx_tensor *out, ms_error *err);
void ms_onnx_tensor_free(ms_onnx_tensor *t);

/* Binds graph input `name` to constant values (copied), as if the file held them as an
 * initializer: models whose shapes, axes or indices arrive as graph inputs (the ONNX node
 * tests) can then be folded. A bound input used as data becomes a parameter like an
 * initializer (its values from ms_onnx_initializer). Call before ms_onnx_build. */
ms_status ms_onnx_bind_input(ms_onnx_model *m, const char *name, const ms_onnx_tensor *t,
                             ms_error *err);

/* Adds the model into g for `batch` rows of the symbolic batch dim (ignored without one):
 * outputs[i] (i < max_outputs) receives the value id of graph output i, or -1 for an output of
 * no elements (a dim of 0: empty tensors are constants at build, and never graph values; a
 * graph input of no elements is not a graph input either). The values keep their
 * ONNX names where ONNX names them. Build-time refusals (a shape input that is not constant,
 * an attribute combination meshscope cannot express) name the node as ms_onnx_open does. */
ms_status ms_onnx_build(const ms_onnx_model *m, int batch, ms_graph *g, int *outputs,
                        int max_outputs, ms_error *err);

/* Part of the graph, for a pipeline chunk: nodes [lo, hi), the value `in` entering it as a new
 * input "hidden_in" of in_shape (its first dim the batch: replaced by the build's) that gets a
 * gradient, and `out` leaving it (its value id in *out_v; the graph's outputs are then not
 * bound). Nodes from each region_starts[i] to the next (the last up to regions_end) are one
 * recompute region (MS_REGION_BLOCK). */
typedef struct ms_onnx_part {
    size_t lo, hi;
    const char *in;
    int in_ndim;
    int64_t in_shape[MS_MAX_DIMS];
    const char *out;
    const size_t *region_starts;
    int nregions;
    size_t regions_end;
} ms_onnx_part;
ms_status ms_onnx_build_part(const ms_onnx_model *m, int batch, const ms_onnx_part *part,
                             ms_graph *g, int *outputs, int max_outputs, int *in_v, int *out_v,
                             ms_error *err);

/* A repeated stack of blocks, found by the scopes PyTorch names nodes with ("/blocks.0/...",
 * "/blocks.1/...": the first numbered scope, in order): block k is nodes [start[k],
 * start[k + 1]) (the last ends at `end`), and cut[k] the one activation a cut before block k
 * passes on (cut[n]: after the last). Nodes before block 0 and after the stack belong to the
 * first and the last chunk. */
#define MS_ONNX_MAX_BLOCKS 256
typedef struct ms_onnx_blocks {
    int n;
    char scope[64];
    size_t start[MS_ONNX_MAX_BLOCKS], end;
    const char *cut[MS_ONNX_MAX_BLOCKS + 1];
} ms_onnx_blocks;
/* Returns the blocks found (0: none, or a stack a cut cannot split: blocks out of order, or
 * more than one activation crossing a boundary). */
int ms_onnx_find_blocks(const ms_onnx_model *m, ms_onnx_blocks *out);
/* The float initializer (a parameter) that nodes [0, a) and nodes [b, end) both read, such as
 * an embedding tied to the head; NULL when none (or more than one: *several is set). */
const char *ms_onnx_shared_initializer(const ms_onnx_model *m, size_t a, size_t b, bool *several);

/* The values of the initializer, Constant node output or bound input `name` as floats
 * (numel of them in *numel), for ms_program_load_param; NULL when there is none. */
const float *ms_onnx_initializer(const ms_onnx_model *m, const char *name, int64_t *numel);

/* Whether the importer maps ONNX operator op_type (default domain). */
bool ms_onnx_op_supported(const char *op_type);

#endif

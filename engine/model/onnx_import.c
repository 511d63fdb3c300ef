/* onnx_import.c - the ONNX file: parsing, checking, constants, and the build loop. The
 * operators' mappers are in onnx_ops.c. */
#include "engine/model/onnx_import.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/model/onnx_impl.h"

#define OX_PACKAGES "protobuf-c-compiler libprotobuf-c-dev libonnx-dev"

#ifndef MS_HAVE_ONNX

static ms_status no_onnx(ms_error *err) {
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "onnx: this build has no ONNX import; install " OX_PACKAGES
                   " (scripts/install-deps.sh) and reconfigure with -DMS_ENABLE_ONNX=AUTO");
}
ms_status ms_onnx_open(const char *path, ms_onnx_model **out, ms_error *err) {
    (void)path;
    *out = NULL;
    return no_onnx(err);
}
ms_status ms_onnx_open_bytes(const void *data, size_t len, const char *label, ms_onnx_model **out,
                             ms_error *err) {
    (void)data, (void)len, (void)label;
    *out = NULL;
    return no_onnx(err);
}
void ms_onnx_close(ms_onnx_model *m) {
    (void)m;
}
int64_t ms_onnx_opset(const ms_onnx_model *m) {
    (void)m;
    return 0;
}
int ms_onnx_num_inputs(const ms_onnx_model *m) {
    (void)m;
    return 0;
}
const char *ms_onnx_input_name(const ms_onnx_model *m, int i) {
    (void)m, (void)i;
    return NULL;
}
int ms_onnx_input_shape(const ms_onnx_model *m, int i, int batch, int64_t *shape) {
    (void)m, (void)i, (void)batch, (void)shape;
    return 0;
}
bool ms_onnx_input_is_index(const ms_onnx_model *m, int i) {
    (void)m, (void)i;
    return false;
}
bool ms_onnx_input_has_batch(const ms_onnx_model *m, int i) {
    (void)m, (void)i;
    return false;
}
int ms_onnx_num_outputs(const ms_onnx_model *m) {
    (void)m;
    return 0;
}
const char *ms_onnx_output_name(const ms_onnx_model *m, int i) {
    (void)m, (void)i;
    return NULL;
}
ms_status ms_onnx_read_tensor(const char *path, ms_onnx_tensor *out, ms_error *err) {
    (void)path;
    memset(out, 0, sizeof *out);
    return no_onnx(err);
}
void ms_onnx_tensor_free(ms_onnx_tensor *t) {
    (void)t;
}
ms_status ms_onnx_bind_input(ms_onnx_model *m, const char *name, const ms_onnx_tensor *t,
                             ms_error *err) {
    (void)m, (void)name, (void)t;
    return no_onnx(err);
}
ms_status ms_onnx_build(const ms_onnx_model *m, int batch, ms_graph *g, int *outputs,
                        int max_outputs, ms_error *err) {
    (void)m, (void)batch, (void)g, (void)outputs, (void)max_outputs;
    return no_onnx(err);
}
ms_status ms_onnx_build_part(const ms_onnx_model *m, int batch, const ms_onnx_part *part,
                             ms_graph *g, int *outputs, int max_outputs, int *in_v, int *out_v,
                             ms_error *err) {
    (void)m, (void)batch, (void)part, (void)g, (void)outputs, (void)max_outputs;
    *in_v = *out_v = -1;
    return no_onnx(err);
}
int ms_onnx_find_blocks(const ms_onnx_model *m, ms_onnx_blocks *out) {
    (void)m;
    memset(out, 0, sizeof *out);
    return 0;
}
const char *ms_onnx_shared_initializer(const ms_onnx_model *m, size_t a, size_t b, bool *several) {
    (void)m, (void)a, (void)b;
    *several = false;
    return NULL;
}
const float *ms_onnx_initializer(const ms_onnx_model *m, const char *name, int64_t *numel) {
    (void)m, (void)name;
    if (numel) *numel = 0;
    return NULL;
}
bool ms_onnx_op_supported(const char *op_type) {
    (void)op_type;
    return false;
}

#else

/* --- constants ---------------------------------------------------------------------------- */

const char *ox_dtype_name(int dtype) {
    static const char *names[] = {"undefined",  "float32", "uint8",  "int8",   "uint16",
                                  "int16",      "int32",   "int64",  "string", "bool",
                                  "float16",    "float64", "uint32", "uint64", "complex64",
                                  "complex128", "bfloat16"};
    return dtype >= 0 && dtype < (int)(sizeof names / sizeof names[0]) ? names[dtype] : "unknown";
}

static int dtype_size(int dtype) {
    switch (dtype) {
        case OX_FLOAT:
        case OX_INT32:
        case OX_UINT32:
            return 4;
        case OX_INT64:
        case OX_UINT64:
        case OX_DOUBLE:
            return 8;
        case OX_UINT8:
        case OX_INT8:
        case OX_BOOL:
            return 1;
        case OX_UINT16:
        case OX_INT16:
            return 2;
        default:
            return 0;
    }
}

/* Whether the importer takes tensors of dtype at all (float32, and 32- and 64-bit integers and
 * bools for ids, exponents and masks). */
static bool dtype_ok(int dtype) {
    return dtype == OX_FLOAT || dtype == OX_INT64 || dtype == OX_INT32 || dtype == OX_UINT64 ||
           dtype == OX_UINT32 || dtype == OX_BOOL;
}

void ox_const_free(ox_const *c) {
    if (!c) return;
    free(c->name);
    free(c->d);
    free(c->f);
    free(c);
}

static double raw_at(const uint8_t *p, int dtype) {
    switch (dtype) {
        case OX_FLOAT: {
            float v;
            memcpy(&v, p, 4);
            return v;
        }
        case OX_DOUBLE: {
            double v;
            memcpy(&v, p, 8);
            return v;
        }
        case OX_INT64: {
            int64_t v;
            memcpy(&v, p, 8);
            return (double)v;
        }
        case OX_UINT64: {
            uint64_t v;
            memcpy(&v, p, 8);
            return (double)v;
        }
        case OX_INT32: {
            int32_t v;
            memcpy(&v, p, 4);
            return v;
        }
        case OX_UINT32: {
            uint32_t v;
            memcpy(&v, p, 4);
            return v;
        }
        case OX_INT16: {
            int16_t v;
            memcpy(&v, p, 2);
            return v;
        }
        case OX_UINT16: {
            uint16_t v;
            memcpy(&v, p, 2);
            return v;
        }
        case OX_INT8:
            return (int8_t)p[0];
        default:
            return p[0]; /* uint8, bool */
    }
}

/* Copies the typed field (n values) into d, or fails when n is not numel. */
static bool typed_values(const Onnx__TensorProto *t, int dtype, int64_t numel, double *d) {
    size_t n = 0;
    switch (dtype) {
        case OX_FLOAT:
            n = t->n_float_data;
            break;
        case OX_DOUBLE:
            n = t->n_double_data;
            break;
        case OX_INT64:
            n = t->n_int64_data;
            break;
        case OX_UINT32:
        case OX_UINT64:
            n = t->n_uint64_data;
            break;
        default:
            n = t->n_int32_data;
            break;
    }
    if ((int64_t)n != numel) return false;
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
            case OX_FLOAT:
                d[i] = t->float_data[i];
                break;
            case OX_DOUBLE:
                d[i] = t->double_data[i];
                break;
            case OX_INT64:
                d[i] = (double)t->int64_data[i];
                break;
            case OX_UINT32:
            case OX_UINT64:
                d[i] = (double)t->uint64_data[i];
                break;
            default:
                d[i] = t->int32_data[i];
                break;
        }
    }
    return true;
}

ms_status ox_decode(const ms_onnx_model *m, const Onnx__TensorProto *t, const char *name,
                    ox_const **out, ms_error *err) {
    char sn[MS_SAFE_LEN];
    const char *nm = name ? name : (t->name ? t->name : "");
    ms_safe_str(sn, sizeof sn, nm);
    *out = NULL;
    int dtype = t->has_data_type ? t->data_type : 0;
    int size = dtype_size(dtype);
    if (!size)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has element type %s; export it as float32 (int64 for "
                       "indices and shapes)",
                       m->label, sn, ox_dtype_name(dtype));
    if (t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: tensor '%s' keeps its data in an external file; export with the "
                       "weights inside the model (save_as_external_data=False)",
                       m->label, sn);
    if (t->n_dims > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has %zu dims (at most %d)",
                       m->label, sn, t->n_dims, MS_MAX_DIMS);
    int64_t numel = 1;
    for (size_t k = 0; k < t->n_dims; k++) {
        if (t->dims[k] < 0 || t->dims[k] > MS_ONNX_MAX_DIM ||
            numel * t->dims[k] > MS_ONNX_MAX_NUMEL)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: tensor '%s' has a dim of %lld (the limits: %lld per dim, %lld "
                           "elements); the file is damaged or the model too large",
                           m->label, sn, (long long)t->dims[k], (long long)MS_ONNX_MAX_DIM,
                           (long long)MS_ONNX_MAX_NUMEL);
        numel *= t->dims[k];
    }
    ox_const *c = xcalloc(1, sizeof *c);
    c->name = xstrdup(nm);
    c->dtype = dtype;
    c->ndim = (int)t->n_dims;
    for (int k = 0; k < c->ndim; k++) c->shape[k] = t->dims[k];
    c->numel = numel;
    c->d = xcalloc((size_t)(numel ? numel : 1), sizeof(double));
    bool ok;
    if (t->has_raw_data) {
        ok = (int64_t)t->raw_data.len == numel * size;
        for (int64_t i = 0; ok && i < numel; i++)
            c->d[i] = raw_at(t->raw_data.data + i * size, dtype);
    } else {
        ok = typed_values(t, dtype, numel, c->d);
    }
    if (!ok) {
        ox_const_free(c);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: tensor '%s' holds a different number of values than its shape "
                       "says; the file is damaged",
                       m->label, sn);
    }
    c->f = xmalloc(sizeof(float) * (size_t)(numel ? numel : 1));
    for (int64_t i = 0; i < numel; i++) c->f[i] = (float)c->d[i];
    *out = c;
    return MS_OK;
}

static void add_const(ms_onnx_model *m, ox_const *c) {
    if (m->nconst == m->cconst) {
        m->cconst = m->cconst ? 2 * m->cconst : 16;
        m->consts = xrealloc(m->consts, sizeof *m->consts * (size_t)m->cconst);
    }
    m->consts[m->nconst++] = c;
}

static const ox_const *find_const(const ms_onnx_model *m, const char *name) {
    for (int i = m->nconst - 1; i >= 0; i--)
        if (!strcmp(m->consts[i]->name, name)) return m->consts[i];
    return NULL;
}

/* --- opening and checking ------------------------------------------------------------------ */

static ms_status check_opset(ms_onnx_model *m, ms_error *err) {
    m->opset = -1;
    for (size_t i = 0; i < m->pb->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->pb->opset_import[i];
        if (!o->domain || !o->domain[0] || !strcmp(o->domain, "ai.onnx")) m->opset = o->version;
    }
    if (m->opset < 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the model imports no opset of the default ONNX domain; the file is "
                       "not an ONNX model or is damaged",
                       m->label);
    if (m->opset < MS_ONNX_OPSET_MIN || m->opset > MS_ONNX_OPSET_MAX)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: opset %lld is outside the supported range %d..%d; export with "
                       "opset_version=%d (torch.onnx.export) or convert it "
                       "(onnx.version_converter)",
                       m->label, (long long)m->opset, MS_ONNX_OPSET_MIN, MS_ONNX_OPSET_MAX,
                       MS_ONNX_OPSET_MAX);
    return MS_OK;
}

/* A value's type: element type and shape, with the batch dim allowed at dim 0 of an input. */
static ms_status read_io(ms_onnx_model *m, const Onnx__ValueInfoProto *vi, bool input, ox_io *io,
                         ms_error *err) {
    char sn[MS_SAFE_LEN];
    ms_safe_str(sn, sizeof sn, vi->name);
    const char *what = input ? "input" : "output";
    io->name = vi->name ? vi->name : "";
    const Onnx__TypeProto *t = vi->type;
    if (!t || t->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: graph %s '%s' is not a tensor (sequences, maps and optionals are not "
                       "supported); export tensors only",
                       m->label, what, sn);
    const Onnx__TypeProto__Tensor *tt = t->tensor_type;
    io->dtype = tt->has_elem_type ? tt->elem_type : 0;
    if (!dtype_ok(io->dtype))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: graph %s '%s' has element type %s; export in float32 (int64 for "
                       "indices)",
                       m->label, what, sn, ox_dtype_name(io->dtype));
    if (!tt->shape) {
        if (input)
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: graph input '%s' has no shape; export with static shapes", m->label,
                           sn);
        io->ndim = -1;
        return MS_OK;
    }
    if (tt->shape->n_dim > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: graph %s '%s' has %zu dims (at most %d)",
                       m->label, what, sn, tt->shape->n_dim, MS_MAX_DIMS);
    io->ndim = (int)tt->shape->n_dim;
    int64_t numel = 1;
    for (int k = 0; k < io->ndim; k++) {
        const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[k];
        bool fixed = d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        if (!fixed && input && k == 0) {
            io->batch = true;
            io->d[0] = 1;
            continue;
        }
        if (!fixed) {
            if (!input) {
                io->d[k] = -1;
                continue;
            }
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: graph input '%s' has a dynamic dim %d ('%s'); only the first "
                           "(batch) dim may be symbolic: export with static shapes otherwise",
                           m->label, sn, k, d->dim_param ? d->dim_param : "?");
        }
        /* a dim of 0: an empty tensor, a constant of no elements at build */
        if (d->dim_value < 0 || d->dim_value > MS_ONNX_MAX_DIM ||
            numel * d->dim_value > MS_ONNX_MAX_NUMEL)
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: graph %s '%s' has dim %d of size %lld (sizes 0..%lld, at most "
                           "%lld elements); export with smaller shapes",
                           m->label, what, sn, k, (long long)d->dim_value,
                           (long long)MS_ONNX_MAX_DIM, (long long)MS_ONNX_MAX_NUMEL);
        io->d[k] = d->dim_value;
        numel *= d->dim_value;
    }
    return MS_OK;
}

static ms_status read_graph_io(ms_onnx_model *m, ms_error *err) {
    const Onnx__GraphProto *g = m->pb->graph;
    m->in = xcalloc(g->n_input + 1, sizeof *m->in);
    m->out = xcalloc(g->n_output + 1, sizeof *m->out);
    for (size_t i = 0; i < g->n_input; i++) {
        if (find_const(m, g->input[i]->name ? g->input[i]->name : "")) continue; /* IR < 4 */
        MS_CHECK(read_io(m, g->input[i], true, &m->in[m->nin], err));
        m->nin++;
    }
    for (size_t i = 0; i < g->n_output; i++) {
        MS_CHECK(read_io(m, g->output[i], false, &m->out[m->nout], err));
        m->nout++;
    }
    if (!m->nout)
        return ms_fail(err, MS_ERR_INVALID, "%s: the graph has no outputs; the file is damaged",
                       m->label);
    return MS_OK;
}

static ms_status read_constants(ms_onnx_model *m, ms_error *err) {
    const Onnx__GraphProto *g = m->pb->graph;
    for (size_t i = 0; i < g->n_initializer; i++) {
        ox_const *c;
        MS_CHECK(ox_decode(m, g->initializer[i], NULL, &c, err));
        add_const(m, c);
        if (!dtype_ok(c->dtype))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: initializer '%s' has element type %s; export in float32 (int64 "
                           "for indices and shapes)",
                           m->label, ms_safe_str((char[MS_SAFE_LEN]){0}, MS_SAFE_LEN, c->name),
                           ox_dtype_name(c->dtype));
    }
    return MS_OK;
}

/* A Constant node's tensor (value, value_float(s), value_int(s)). */
static ms_status read_constant_node(ms_onnx_model *m, const Onnx__NodeProto *n, ms_error *err) {
    char sn[MS_SAFE_LEN];
    ms_safe_str(sn, sizeof sn, n->name);
    if (n->n_output != 1 || n->n_attribute != 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: node '%s' (Constant) must have one output and "
                       "one attribute; the file is damaged",
                       m->label, sn);
    const Onnx__AttributeProto *a = n->attribute[0];
    ox_const *c = NULL;
    if (a->t && !strcmp(a->name, "value")) {
        MS_CHECK(ox_decode(m, a->t, n->output[0], &c, err));
    } else if (!strcmp(a->name, "value_float") || !strcmp(a->name, "value_int") ||
               !strcmp(a->name, "value_floats") || !strcmp(a->name, "value_ints")) {
        bool list = a->name[strlen(a->name) - 1] == 's', fl = strstr(a->name, "float") != NULL;
        size_t n_v = list ? (fl ? a->n_floats : a->n_ints) : 1;
        c = xcalloc(1, sizeof *c);
        c->name = xstrdup(n->output[0]);
        c->dtype = fl ? OX_FLOAT : OX_INT64;
        c->ndim = list ? 1 : 0;
        c->shape[0] = (int64_t)n_v;
        c->numel = (int64_t)n_v;
        c->d = xcalloc(n_v + 1, sizeof(double));
        c->f = xcalloc(n_v + 1, sizeof(float));
        for (size_t i = 0; i < n_v; i++) {
            c->d[i] = list ? (fl ? a->floats[i] : (double)a->ints[i]) : (fl ? a->f : (double)a->i);
            c->f[i] = (float)c->d[i];
        }
    } else {
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: node '%s' (Constant): attribute '%s' is not supported; use 'value' "
                       "with a float32 or int64 tensor",
                       m->label, sn, a->name);
    }
    add_const(m, c);
    if (!dtype_ok(c->dtype))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: node '%s' (Constant) has element type %s; export in float32 (int64 "
                       "for indices and shapes)",
                       m->label, sn, ox_dtype_name(c->dtype));
    return MS_OK;
}

static ms_status check_nodes(ms_onnx_model *m, ms_error *err) {
    const Onnx__GraphProto *g = m->pb->graph;
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        char sn[MS_SAFE_LEN], so[MS_SAFE_LEN], sd[MS_SAFE_LEN];
        ms_safe_str(sn, sizeof sn,
                    n->name && n->name[0]         ? n->name
                    : n->n_output && n->output[0] ? n->output[0]
                                                  : "");
        ms_safe_str(so, sizeof so, n->op_type);
        if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: node '%s' (%s) is in domain '%s'; only the default ONNX domain "
                           "is supported: export without custom or contrib operators",
                           m->label, sn, so, ms_safe_str(sd, sizeof sd, n->domain));
        if (!n->op_type)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: node '%s' has no operator; the file is damaged", m->label, sn);
        if (!strcmp(n->op_type, "Constant")) {
            MS_CHECK(read_constant_node(m, n, err));
            continue;
        }
        if (!ox_find_map(n->op_type))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: node '%s' (%s): operator %s is not supported by the importer "
                           "(see docs/onnx.md for the supported ones); replace it in the model "
                           "before export",
                           m->label, sn, so, so);
        for (size_t k = 0; k < n->n_output + n->n_input; k++)
            if (!(k < n->n_input ? n->input[k] : n->output[k - n->n_input]))
                return ms_fail(err, MS_ERR_INVALID, "%s: node '%s' (%s) has a null value name",
                               m->label, sn, so);
    }
    return MS_OK;
}

ms_status ms_onnx_open_bytes(const void *data, size_t len, const char *label, ms_onnx_model **out,
                             ms_error *err) {
    *out = NULL;
    ms_onnx_model *m = xcalloc(1, sizeof *m);
    ms_safe_str(m->label, sizeof m->label, label ? label : "(memory)");
    m->pb = onnx__model_proto__unpack(NULL, len, data);
    ms_status st = MS_OK;
    if (!m->pb)
        st = ms_fail(err, MS_ERR_INVALID,
                     "%s: not an ONNX model (the protobuf does not parse: the file is truncated, "
                     "damaged or not a .onnx file); export it again with torch.onnx.export",
                     m->label);
    else if (!m->pb->graph)
        st = ms_fail(err, MS_ERR_INVALID,
                     "%s: not an ONNX model (no graph in the protobuf); export it again with "
                     "torch.onnx.export",
                     m->label);
    if (st == MS_OK) st = check_opset(m, err);
    if (st == MS_OK) st = read_constants(m, err);
    if (st == MS_OK) st = check_nodes(m, err);
    if (st == MS_OK) st = read_graph_io(m, err);
    if (st != MS_OK) {
        ms_onnx_close(m);
        return st;
    }
    *out = m;
    return MS_OK;
}

ms_status ms_onnx_open(const char *path, ms_onnx_model **out, ms_error *err) {
    *out = NULL;
    char sp[MS_SAFE_LEN];
    ms_safe_str(sp, sizeof sp, path);
    FILE *f = fopen(path, "rb");
    if (!f) return ms_fail(err, MS_ERR_IO, "%s: cannot open the ONNX file", sp);
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (len < 0 || len > MS_ONNX_MAX_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return ms_fail(err, len > MS_ONNX_MAX_BYTES ? MS_ERR_UNSUPPORTED : MS_ERR_IO,
                       "%s: cannot read the ONNX file (larger than %lld bytes, or not seekable); "
                       "export with external data off and a smaller model",
                       sp, (long long)MS_ONNX_MAX_BYTES);
    }
    uint8_t *buf = xmalloc((size_t)len + 1);
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    if (got != (size_t)len) {
        free(buf);
        return ms_fail(err, MS_ERR_IO, "%s: reading the ONNX file failed", sp);
    }
    ms_status st = ms_onnx_open_bytes(buf, got, path, out, err);
    free(buf);
    return st;
}

void ms_onnx_close(ms_onnx_model *m) {
    if (!m) return;
    for (int i = 0; i < m->nconst; i++) ox_const_free(m->consts[i]);
    free(m->consts);
    free(m->in);
    free(m->out);
    if (m->pb) onnx__model_proto__free_unpacked(m->pb, NULL);
    free(m);
}

int64_t ms_onnx_opset(const ms_onnx_model *m) {
    return m->opset;
}
int ms_onnx_num_inputs(const ms_onnx_model *m) {
    return m->nin;
}
const char *ms_onnx_input_name(const ms_onnx_model *m, int i) {
    return i >= 0 && i < m->nin ? m->in[i].name : NULL;
}
int ms_onnx_input_shape(const ms_onnx_model *m, int i, int batch, int64_t *shape) {
    if (i < 0 || i >= m->nin) return 0;
    for (int k = 0; k < m->in[i].ndim; k++) shape[k] = m->in[i].d[k];
    if (m->in[i].batch) shape[0] = batch;
    return m->in[i].ndim;
}
bool ms_onnx_input_is_index(const ms_onnx_model *m, int i) {
    return i >= 0 && i < m->nin && m->in[i].dtype != OX_FLOAT;
}
bool ms_onnx_input_has_batch(const ms_onnx_model *m, int i) {
    return i >= 0 && i < m->nin && m->in[i].batch;
}
int ms_onnx_num_outputs(const ms_onnx_model *m) {
    return m->nout;
}
const char *ms_onnx_output_name(const ms_onnx_model *m, int i) {
    return i >= 0 && i < m->nout ? m->out[i].name : NULL;
}

const float *ms_onnx_initializer(const ms_onnx_model *m, const char *name, int64_t *numel) {
    const ox_const *c = find_const(m, name);
    if (numel) *numel = c ? c->numel : 0;
    return c ? c->f : NULL;
}

/* --- tensors from files -------------------------------------------------------------------- */

ms_status ms_onnx_read_tensor(const char *path, ms_onnx_tensor *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    ms_onnx_model tmp = {0};
    ms_safe_str(tmp.label, sizeof tmp.label, path);
    FILE *f = fopen(path, "rb");
    if (!f) return ms_fail(err, MS_ERR_IO, "%s: cannot open the tensor file", tmp.label);
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len == cap) buf = xrealloc(buf, cap = cap ? 2 * cap : 65536);
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0 && len < (size_t)MS_ONNX_MAX_BYTES);
    fclose(f);
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, buf);
    free(buf);
    if (!t) return ms_fail(err, MS_ERR_INVALID, "%s: not a serialized ONNX TensorProto", tmp.label);
    ox_const *c;
    ms_status st = ox_decode(&tmp, t, NULL, &c, err);
    onnx__tensor_proto__free_unpacked(t, NULL);
    if (st != MS_OK) return st;
    snprintf(out->name, sizeof out->name, "%s", c->name);
    out->dtype = c->dtype;
    out->ndim = c->ndim;
    memcpy(out->shape, c->shape, sizeof out->shape);
    out->numel = c->numel;
    out->data = c->d;
    c->d = NULL;
    ox_const_free(c);
    return MS_OK;
}

void ms_onnx_tensor_free(ms_onnx_tensor *t) {
    if (!t) return;
    free(t->data);
    t->data = NULL;
}

ms_status ms_onnx_bind_input(ms_onnx_model *m, const char *name, const ms_onnx_tensor *t,
                             ms_error *err) {
    char sn[MS_SAFE_LEN];
    ms_safe_str(sn, sizeof sn, name);
    int i = 0;
    while (i < m->nin && strcmp(m->in[i].name, name)) i++;
    if (i == m->nin)
        return ms_fail(err, MS_ERR_INVALID, "%s: no graph input is named '%s'", m->label, sn);
    if (t->ndim != m->in[i].ndim || t->ndim > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID, "%s: input '%s' has %d dims, the bound tensor %d",
                       m->label, sn, m->in[i].ndim, t->ndim);
    ox_const *c = xcalloc(1, sizeof *c);
    c->name = xstrdup(name);
    c->dtype = m->in[i].dtype;
    c->ndim = t->ndim;
    memcpy(c->shape, t->shape, sizeof c->shape);
    c->numel = t->numel;
    c->d = xmalloc(sizeof(double) * (size_t)(t->numel + 1));
    c->f = xmalloc(sizeof(float) * (size_t)(t->numel + 1));
    for (int64_t k = 0; k < t->numel; k++) c->d[k] = t->data[k], c->f[k] = (float)t->data[k];
    add_const(m, c);
    return MS_OK;
}

/* --- build --------------------------------------------------------------------------------- */

ms_status ox_fail(ox_build *b, ms_status code, ms_error *err, const char *fmt, ...) {
    char sn[MS_SAFE_LEN], so[MS_SAFE_LEN], msg[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const Onnx__NodeProto *n = b->node;
    bool named = n->name && n->name[0];
    ms_safe_str(sn, sizeof sn, named ? n->name : n->n_output ? n->output[0] : "");
    return ms_fail(err, code, "%s: node %s'%s' (%s): %s", b->m->label, named ? "" : "of output ",
                   sn, ms_safe_str(so, sizeof so, n->op_type), msg);
}

static void bind(ox_build *b, const char *name, int v, const ox_const *c) {
    if (b->nsym == b->csym) {
        b->csym = b->csym ? 2 * b->csym : 64;
        b->sym = xrealloc(b->sym, sizeof *b->sym * (size_t)b->csym);
    }
    b->sym[b->nsym++] = (ox_sym){name, v, c};
}

static ox_sym *lookup(const ox_build *b, const char *name) {
    for (int i = b->nsym - 1; i >= 0; i--)
        if (!strcmp(b->sym[i].name, name)) return &b->sym[i];
    return NULL;
}

bool ox_has(const ox_build *b, int k) {
    return k < (int)b->node->n_input && b->node->input[k][0];
}

static ms_status input_sym(ox_build *b, int k, ox_sym **s, ms_error *err) {
    if (!ox_has(b, k))
        return ox_fail(b, MS_ERR_INVALID, err, "input %d is missing; the model is invalid", k);
    *s = lookup(b, b->node->input[k]);
    if (!*s) {
        char sv[MS_SAFE_LEN];
        return ox_fail(b, MS_ERR_INVALID, err,
                       "input '%s' is not produced before the node (the graph is not sorted or "
                       "names an unknown value); the model is invalid",
                       ms_safe_str(sv, sizeof sv, b->node->input[k]));
    }
    return MS_OK;
}

bool ox_is_const(const ox_build *b, int k) {
    const ox_sym *s = ox_has(b, k) ? lookup(b, b->node->input[k]) : NULL;
    return s && s->c;
}

/* Whether c is one of the file's float initializers: the model's weights, which train. */
static bool float_initializer(const ms_onnx_model *m, const ox_const *c) {
    const Onnx__GraphProto *g = m->pb->graph;
    if (find_const(m, c->name) != c || c->dtype != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        return false;
    for (size_t i = 0; i < g->n_initializer; i++)
        if (!strcmp(g->initializer[i]->name, c->name)) return true;
    return false;
}

ms_status ox_val(ox_build *b, int k, int *v, ms_error *err) {
    ox_sym *s;
    MS_CHECK(input_sym(b, k, &s, err));
    if (s->v < 0 && !s->c->numel) {
        char sv[MS_SAFE_LEN];
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "input %d '%s' is empty (a dim of 0); empty tensors pass only through "
                       "Reshape, Slice, Split and Identity: export with "
                       "non-empty shapes",
                       k, ms_safe_str(sv, sizeof sv, b->node->input[k]));
    }
    if (s->v < 0) {
        const ox_const *c = s->c;
        if (float_initializer(b->m, c)) {
            s->v = ms_graph_param(b->g, c->name, c->ndim, c->shape, (ms_init){MS_INIT_CONST, 0.0f});
        } else { /* a Constant node's, an integer tensor, or one folded here: it does not train */
            float *f = xmalloc(sizeof(float) * (size_t)(c->numel ? c->numel : 1));
            for (int64_t i = 0; i < c->numel; i++) f[i] = (float)c->d[i];
            s->v = ms_graph_constant(b->g, b->node->input[k], c->ndim, c->shape, f);
            free(f);
        }
        if (s->v < 0) {
            ms_error e = {0};
            ms_graph_error(b->g, &e);
            return ox_fail(b, e.code, err, "%s", e.msg);
        }
    }
    *v = s->v;
    return MS_OK;
}

ms_status ox_const_in(ox_build *b, int k, const ox_const **c, ms_error *err) {
    ox_sym *s;
    MS_CHECK(input_sym(b, k, &s, err));
    if (!s->c) {
        char sv[MS_SAFE_LEN];
        return ox_fail(b, MS_ERR_UNSUPPORTED, err,
                       "input %d '%s' must be a constant (an initializer or Constant) but is "
                       "computed at run time; export with static shapes (do_constant_folding=True)",
                       k, ms_safe_str(sv, sizeof sv, b->node->input[k]));
    }
    *c = s->c;
    return MS_OK;
}

bool ox_relu_follows(const ox_build *b) {
    const Onnx__GraphProto *gp = b->m->pb->graph;
    if (!b->next_fusable || b->node->n_output < 1 || !b->node->output[0][0]) return false;
    const char *y = b->node->output[0];
    const Onnx__NodeProto *next = gp->node[b->at + 1];
    if (strcmp(next->op_type, "Relu") || next->n_input != 1 || strcmp(next->input[0], y))
        return false;
    for (int k = 0; k < b->m->nout; k++)
        if (!strcmp(b->m->out[k].name, y)) return false;
    for (size_t i = 0; i < gp->n_node; i++) {
        if (i == b->at + 1) continue; /* the Relu itself */
        for (size_t k = 0; k < gp->node[i]->n_input; k++)
            if (!strcmp(gp->node[i]->input[k], y)) return false;
    }
    return true;
}

void ox_out(ox_build *b, int k, int v) {
    if (k < (int)b->node->n_output && b->node->output[k][0]) bind(b, b->node->output[k], v, NULL);
}

void ox_out_const(ox_build *b, int k, ox_const *c) {
    if (k < (int)b->node->n_output && b->node->output[k][0]) {
        free(c->name);
        c->name = xstrdup(b->node->output[k]);
        bind(b, c->name, -1, c);
    }
}

ox_const *ox_new_const(ox_build *b, int dtype, int ndim, const int64_t *shape) {
    ox_const *c = xcalloc(1, sizeof *c);
    c->name = xstrdup("");
    c->dtype = dtype;
    c->ndim = ndim;
    c->numel = 1;
    for (int k = 0; k < ndim; k++) c->shape[k] = shape[k], c->numel *= shape[k];
    c->d = xcalloc((size_t)c->numel + 1, sizeof(double));
    c->f = xcalloc((size_t)c->numel + 1, sizeof(float));
    if (b->nfold == b->cfold) {
        b->cfold = b->cfold ? 2 * b->cfold : 16;
        b->fold = xrealloc(b->fold, sizeof *b->fold * (size_t)b->cfold);
    }
    b->fold[b->nfold++] = c;
    return c;
}

int ox_op(ox_build *b, int op, const ms_op_attrs *a, int n_in, const int *in, int k,
          ms_error *err) {
    char name[160];
    const Onnx__NodeProto *n = b->node;
    if (k >= 0 && k < (int)n->n_output && n->output[k][0])
        snprintf(name, sizeof name, "%s", n->output[k]);
    else
        snprintf(name, sizeof name, "%s/t%d", n->n_output ? n->output[0] : "onnx", b->tmp++);
    int v = ms_graph_op(b->g, op, a, n_in, in, name);
    if (v < 0) {
        ms_error e = {0};
        ms_graph_error(b->g, &e);
        ox_fail(b, e.code ? e.code : MS_ERR_INVALID, err, "%s", e.msg);
    }
    return v;
}

const ms_shape *ox_shape(const ox_build *b, int v) {
    return ms_graph_value_shape(b->g, v);
}

const Onnx__AttributeProto *ox_attr(const ox_build *b, const char *name) {
    for (size_t i = 0; i < b->node->n_attribute; i++)
        if (b->node->attribute[i]->name && !strcmp(b->node->attribute[i]->name, name))
            return b->node->attribute[i];
    return NULL;
}
int64_t ox_attr_i(const ox_build *b, const char *name, int64_t def) {
    const Onnx__AttributeProto *a = ox_attr(b, name);
    return a ? a->i : def;
}
float ox_attr_f(const ox_build *b, const char *name, float def) {
    const Onnx__AttributeProto *a = ox_attr(b, name);
    return a ? a->f : def;
}
const char *ox_attr_s(const ox_build *b, const char *name, const char *def) {
    const Onnx__AttributeProto *a = ox_attr(b, name);
    if (!a || !a->has_s) return def;
    static _Thread_local char buf[64];
    size_t n = a->s.len < sizeof buf - 1 ? a->s.len : sizeof buf - 1;
    memcpy(buf, a->s.data, n);
    buf[n] = 0;
    return buf;
}
int ox_attr_ints(const ox_build *b, const char *name, int64_t *out, int max) {
    const Onnx__AttributeProto *a = ox_attr(b, name);
    if (!a) return -1;
    int n = (int)a->n_ints < max ? (int)a->n_ints : max;
    for (int i = 0; i < n; i++) out[i] = a->ints[i];
    return (int)a->n_ints;
}

static bool read_in(const Onnx__GraphProto *gp, size_t lo, size_t hi, const char *name);

static ms_status add_inputs(ox_build *b, ms_error *err) {
    const ms_onnx_model *m = b->m;
    for (int i = 0; i < m->nin; i++) {
        const ox_const *c = find_const(m, m->in[i].name);
        if (c) {
            bind(b, m->in[i].name, -1, c);
            continue;
        }
        /* a pipeline chunk takes only the inputs its nodes read */
        if (b->partial && !read_in(m->pb->graph, b->in_lo, b->in_hi, m->in[i].name)) continue;
        int64_t shape[MS_MAX_DIMS], numel = 1;
        int nd = ms_onnx_input_shape(m, i, b->batch, shape);
        for (int d = 0; d < nd; d++) numel *= shape[d];
        if (numel == 0) { /* empty: nothing to feed */
            ox_const *e = ox_new_const(b, m->in[i].dtype, nd, shape);
            free(e->name);
            e->name = xstrdup(m->in[i].name);
            bind(b, e->name, -1, e);
            continue;
        }
        int v = ms_graph_input(b->g, m->in[i].name, nd, shape);
        if (v < 0) {
            ms_error e = {0};
            ms_graph_error(b->g, &e);
            return ms_fail(err, e.code, "%s: %s", m->label, e.msg);
        }
        bind(b, m->in[i].name, v, NULL);
    }
    for (int i = 0; i < m->nconst; i++)
        if (!lookup(b, m->consts[i]->name)) bind(b, m->consts[i]->name, -1, m->consts[i]);
    return MS_OK;
}

/* Graph output k: a value. A constant output (folded at build: Shape, ConstantOfShape, a
 * Constant) becomes a constant value, copied into an operator named as the output. */
static ms_status bind_output(ox_build *b, int k, int *out, ms_error *err) {
    char sn[MS_SAFE_LEN];
    ox_sym *s = lookup(b, b->m->out[k].name);
    if (!s)
        return ms_fail(err, MS_ERR_INVALID, "%s: graph output '%s' is produced by no node",
                       b->m->label, ms_safe_str(sn, sizeof sn, b->m->out[k].name));
    if (s->v < 0 && !s->c->numel) { /* empty: no value */
        *out = -1;
        return MS_OK;
    }
    if (s->v < 0) {
        const ox_const *c = s->c;
        char name[200];
        snprintf(name, sizeof name, "%s/value", b->m->out[k].name);
        int v = ms_graph_constant(b->g, name, c->ndim, c->shape, c->f);
        ms_op_attrs a = {0};
        a.i[0] = c->ndim;
        for (int d = 0; d < c->ndim; d++) a.i[1 + d] = c->shape[d];
        if (v >= 0) v = ms_graph_op(b->g, MS_OP_RESHAPE, &a, 1, &v, b->m->out[k].name);
        if (v < 0) {
            ms_error e = {0};
            ms_graph_error(b->g, &e);
            return ms_fail(err, e.code ? e.code : MS_ERR_INVALID, "%s: graph output '%s': %s",
                           b->m->label, ms_safe_str(sn, sizeof sn, b->m->out[k].name), e.msg);
        }
        s->v = v;
    }
    *out = s->v;
    return MS_OK;
}

/* Whether a node in [lo, hi) reads `name`. */
static bool read_in(const Onnx__GraphProto *gp, size_t lo, size_t hi, const char *name) {
    for (size_t i = lo; i < hi; i++)
        for (size_t k = 0; k < gp->node[i]->n_input; k++)
            if (!strcmp(gp->node[i]->input[k], name)) return true;
    return false;
}

/* The part's input: the value crossing into it, a new graph input "hidden_in". */
static ms_status bind_part_input(ox_build *b, const ms_onnx_part *part, int *in_v, ms_error *err) {
    int64_t shape[MS_MAX_DIMS];
    for (int d = 0; d < part->in_ndim; d++) shape[d] = part->in_shape[d];
    shape[0] = b->batch;
    int v = ms_graph_input(b->g, "hidden_in", part->in_ndim, shape);
    if (v < 0) return ms_graph_error(b->g, err);
    ms_graph_input_grad(b->g, v);
    bind(b, part->in, v, NULL);
    *in_v = v;
    return MS_OK;
}

/* The nodes of [lo, hi), each block a recompute region. */
static ms_status build_nodes(ox_build *b, const ms_onnx_part *part, ms_error *err) {
    const Onnx__GraphProto *gp = b->m->pb->graph;
    int open = 0, r = 0;
    ms_status st = MS_OK;
    for (size_t i = part->lo; st == MS_OK && i < part->hi; i++) {
        while (r < part->nregions && part->region_starts[r] <= i) {
            if (open) ms_graph_region_end(b->g, MS_REGION_BLOCK);
            ms_graph_region_begin(b->g, MS_REGION_BLOCK);
            open = 1, r++;
        }
        if (open && r == part->nregions && part->regions_end <= i) {
            ms_graph_region_end(b->g, MS_REGION_BLOCK);
            open = 0;
        }
        b->node = gp->node[i];
        b->tmp = 0;
        b->at = i;
        b->next_fusable = i + 1 < part->hi &&
                          !(r < part->nregions && part->region_starts[r] <= i + 1) &&
                          !(open && r == part->nregions && part->regions_end <= i + 1);
        b->fused_relu = -1;
        if (!strcmp(b->node->op_type, "Constant")) continue;
        st = ox_find_map(b->node->op_type)(b, err);
        if (st == MS_OK && b->fused_relu >= 0) { /* the Relu is the value just built */
            b->node = gp->node[++i];
            ox_out(b, 0, b->fused_relu);
        }
    }
    if (open) ms_graph_region_end(b->g, MS_REGION_BLOCK);
    return st;
}

ms_status ms_onnx_build_part(const ms_onnx_model *m, int batch, const ms_onnx_part *part,
                             ms_graph *g, int *outputs, int max_outputs, int *in_v, int *out_v,
                             ms_error *err) {
    if (batch < 1)
        return ms_fail(err, MS_ERR_INVALID, "%s: batch must be at least 1 (got %d)", m->label,
                       batch);
    const Onnx__GraphProto *gp = m->pb->graph;
    ms_onnx_part whole = *part; /* hi past the last node: to the end */
    if (whole.hi > gp->n_node) whole.hi = gp->n_node;
    if (whole.lo > whole.hi) whole.lo = whole.hi;
    part = &whole;
    ox_build b = {.m = m, .g = g, .batch = batch};
    b.in_lo = part->lo, b.in_hi = part->hi, b.partial = part->lo > 0 || part->hi < gp->n_node;
    *in_v = *out_v = -1;
    ms_status st = add_inputs(&b, err);
    if (st == MS_OK && part->in) st = bind_part_input(&b, part, in_v, err);
    if (st == MS_OK) st = build_nodes(&b, part, err);
    if (st == MS_OK && part->out) {
        ox_sym *s = lookup(&b, part->out);
        if (!s || s->v < 0)
            st = ms_fail(err, MS_ERR_UNSUPPORTED,
                         "%s: the value '%s' a pipeline cut passes on is not computed in its "
                         "chunk; run it without --pp",
                         m->label, part->out);
        else
            *out_v = s->v;
    }
    for (int k = 0; st == MS_OK && !part->out && k < m->nout; k++) {
        int v = -1;
        st = bind_output(&b, k, &v, err);
        if (st == MS_OK && k < max_outputs) outputs[k] = v;
    }
    for (int i = 0; i < b.nfold; i++) ox_const_free(b.fold[i]);
    free(b.fold);
    free(b.sym);
    return st;
}

ms_status ms_onnx_build(const ms_onnx_model *m, int batch, ms_graph *g, int *outputs,
                        int max_outputs, ms_error *err) {
    ms_onnx_part whole = {.lo = 0, .hi = m->pb->graph->n_node};
    int in_v, out_v;
    return ms_onnx_build_part(m, batch, &whole, g, outputs, max_outputs, &in_v, &out_v, err);
}

/* The block index in a node name scoped as PyTorch exports it ("/blocks.3/attn/MatMul"):
 * the prefix "/blocks" into scope, 3 returned; -1 without a numbered first scope. */
static int block_of(const char *name, char *scope, size_t cap) {
    if (!name || name[0] != '/') return -1;
    const char *end = strchr(name + 1, '/');
    if (!end) return -1;
    const char *dot = end;
    while (dot > name + 1 && dot[-1] >= '0' && dot[-1] <= '9') dot--;
    if (dot == end || dot <= name + 2 || dot[-1] != '.' || end - dot > 6) return -1;
    size_t n = (size_t)(dot - 1 - name);
    if (n >= cap) return -1;
    memcpy(scope, name, n);
    scope[n] = '\0';
    return atoi(dot);
}

/* The one value produced before node `at` and read at or after it that is not a constant: what
 * a cut before `at` passes on. NULL when there is none or more than one. */
static const char *crossing(const ms_onnx_model *m, size_t at) {
    const Onnx__GraphProto *gp = m->pb->graph;
    const char *found = NULL;
    for (size_t i = 0; i < at; i++) {
        if (!strcmp(gp->node[i]->op_type, "Constant")) continue;
        for (size_t k = 0; k < gp->node[i]->n_output; k++) {
            const char *v = gp->node[i]->output[k];
            if (!v[0] || !read_in(gp, at, gp->n_node, v)) continue;
            bool is_out = false;
            for (int o = 0; o < m->nout; o++) is_out |= !strcmp(m->out[o].name, v);
            if (found || is_out) return NULL;
            found = v;
        }
    }
    return found;
}

const char *ms_onnx_shared_initializer(const ms_onnx_model *m, size_t a, size_t b, bool *several) {
    const Onnx__GraphProto *gp = m->pb->graph;
    const char *found = NULL;
    *several = false;
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        if (t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) continue;
        if (!read_in(gp, 0, a < gp->n_node ? a : gp->n_node, t->name) ||
            !read_in(gp, b < gp->n_node ? b : gp->n_node, gp->n_node, t->name))
            continue;
        if (found) *several = true;
        found = t->name;
    }
    return *several ? NULL : found;
}

int ms_onnx_find_blocks(const ms_onnx_model *m, ms_onnx_blocks *out) {
    const Onnx__GraphProto *gp = m->pb->graph;
    memset(out, 0, sizeof *out);
    char scope[64] = "", s[64];
    int next = 0;
    for (size_t i = 0; i < gp->n_node; i++) {
        int k = block_of(gp->node[i]->name, s, sizeof s);
        if (k < 0) continue;
        if (!scope[0]) snprintf(scope, sizeof scope, "%s", s);
        if (strcmp(s, scope)) continue;
        if (k == next && next < MS_ONNX_MAX_BLOCKS) {
            out->start[next++] = i;
        } else if (k != next - 1) {
            return 0; /* out of order: not one repeated stack */
        }
        out->end = i + 1;
    }
    for (int k = 1; k < next; k++) {
        out->cut[k] = crossing(m, out->start[k]);
        if (!out->cut[k]) return 0;
    }
    if (next > 0) out->cut[next] = crossing(m, out->end);
    if (next > 0 && !out->cut[next]) return 0;
    snprintf(out->scope, sizeof out->scope, "%s", scope);
    out->n = next;
    return next;
}

bool ms_onnx_op_supported(const char *op_type) {
    return !strcmp(op_type, "Constant") || ox_find_map(op_type) != NULL;
}

#endif

/* test_onnx_import.c - the ONNX importer refuses broken and unsupported files with one line
 * naming the problem. The models are built here with the generated protobuf-c API and packed,
 * so no binary fixtures are needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
// clang-format off
#include <cmocka.h>
// clang-format on

#include "engine/model/onnx_import.h"

#ifdef MS_HAVE_ONNX
#include <onnx.pb-c.h>

/* A one-node model: y = op(x[, w]) with x of dtype xt and shape [d0, d1] (< 0: symbolic), an
 * optional initializer w [d1] of dtype wt (0: none), under opset `opset`. */
typedef struct spec {
    const char *op;
    int64_t opset;
    int xt, wt;
    int64_t d0, d1;
} spec;

static uint8_t *pack(const spec *s, size_t *len) {
    Onnx__OperatorSetIdProto os = ONNX__OPERATOR_SET_ID_PROTO__INIT, *osp = &os;
    os.domain = "";
    os.has_version = 1;
    os.version = s->opset;
    char *ins[2] = {"x", "w"}, *outs[1] = {"y"};
    Onnx__NodeProto node = ONNX__NODE_PROTO__INIT, *np = &node;
    node.name = "n0";
    node.op_type = (char *)s->op;
    node.n_input = s->wt ? 2 : 1;
    node.input = ins;
    node.n_output = 1;
    node.output = outs;
    Onnx__TensorShapeProto__Dimension d[2] = {ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT,
                                              ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT};
    Onnx__TensorShapeProto__Dimension *dp[2] = {&d[0], &d[1]};
    int64_t dv[2] = {s->d0, s->d1};
    for (int k = 0; k < 2; k++) {
        if (dv[k] < 0) {
            d[k].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d[k].dim_param = k ? "width" : "batch";
        } else {
            d[k].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d[k].dim_value = dv[k];
        }
    }
    Onnx__TensorShapeProto shape = ONNX__TENSOR_SHAPE_PROTO__INIT;
    shape.n_dim = 2;
    shape.dim = dp;
    Onnx__TypeProto__Tensor tx = ONNX__TYPE_PROTO__TENSOR__INIT,
                            ty = ONNX__TYPE_PROTO__TENSOR__INIT;
    tx.has_elem_type = ty.has_elem_type = 1;
    tx.elem_type = s->xt;
    ty.elem_type = 1;
    tx.shape = &shape;
    Onnx__TypeProto typx = ONNX__TYPE_PROTO__INIT, typy = ONNX__TYPE_PROTO__INIT;
    typx.value_case = typy.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    typx.tensor_type = &tx;
    typy.tensor_type = &ty;
    Onnx__ValueInfoProto vx = ONNX__VALUE_INFO_PROTO__INIT, vy = ONNX__VALUE_INFO_PROTO__INIT;
    Onnx__ValueInfoProto *vxp = &vx, *vyp = &vy;
    vx.name = "x";
    vx.type = &typx;
    vy.name = "y";
    vy.type = &typy;
    Onnx__TensorProto w = ONNX__TENSOR_PROTO__INIT, *wp = &w;
    int64_t wdim = s->d1 > 0 && s->d1 < 64 ? s->d1 : 4;
    uint8_t raw[64 * 8] = {0};
    w.name = "w";
    w.has_data_type = 1;
    w.data_type = s->wt;
    w.n_dims = 1;
    w.dims = &wdim;
    w.has_raw_data = 1;
    w.raw_data.data = raw;
    w.raw_data.len = (size_t)wdim * (s->wt == 11 || s->wt == 7 ? 8 : 4);
    Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
    g.name = "g";
    g.n_node = 1;
    g.node = &np;
    g.n_input = 1;
    g.input = &vxp;
    g.n_output = 1;
    g.output = &vyp;
    g.n_initializer = s->wt ? 1 : 0;
    g.initializer = &wp;
    Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
    m.has_ir_version = 1;
    m.ir_version = 8;
    m.n_opset_import = 1;
    m.opset_import = &osp;
    m.graph = &g;
    *len = onnx__model_proto__get_packed_size(&m);
    uint8_t *buf = malloc(*len);
    onnx__model_proto__pack(&m, buf);
    return buf;
}

#define RELU                                                                                       \
    { .op = "Relu", .opset = 17, .xt = 1, .d0 = 2, .d1 = 4 }

/* Opens s's model and expects status want with every substring of the NULL-ended list. */
static void expect(const spec *s, ms_status want, ...) {
    size_t len;
    uint8_t *buf = pack(s, &len);
    ms_onnx_model *m = NULL;
    ms_error err = {0};
    ms_status st = ms_onnx_open_bytes(buf, len, "bad.onnx", &m, &err);
    free(buf);
    ms_onnx_close(m);
    if (st != want) fail_msg("status %d, want %d: %s", st, want, err.msg);
    assert_null(strchr(err.msg, '\n'));
    va_list ap;
    va_start(ap, want);
    for (const char *sub; (sub = va_arg(ap, const char *));)
        if (!strstr(err.msg, sub)) fail_msg("'%s' not in: %s", sub, err.msg);
    va_end(ap);
}

static void test_valid(void **state) {
    (void)state;
    spec s = RELU;
    s.d0 = -1; /* the batch dim */
    size_t len;
    uint8_t *buf = pack(&s, &len);
    ms_onnx_model *m = NULL;
    ms_error err = {0};
    assert_int_equal(ms_onnx_open_bytes(buf, len, "ok.onnx", &m, &err), MS_OK);
    free(buf);
    assert_true(ms_onnx_input_has_batch(m, 0));
    ms_graph *g = ms_graph_create();
    int out = -1;
    assert_int_equal(ms_onnx_build(m, 3, g, &out, 1, &err), MS_OK);
    const ms_shape *sh = ms_graph_value_shape(g, ms_graph_find(g, "x"));
    assert_int_equal(sh->ndim, 2);
    assert_int_equal(sh->d[0], 3);
    assert_int_equal(ms_graph_value_shape(g, out)->d[1], 4);
    ms_graph_destroy(g);
    ms_onnx_close(m);
}

static void test_truncated(void **state) {
    (void)state;
    spec s = RELU;
    size_t len;
    uint8_t *buf = pack(&s, &len);
    char path[] = "/tmp/ms_onnx_truncXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_true(write(fd, buf, len - 5) == (ssize_t)(len - 5));
    close(fd);
    free(buf);
    ms_onnx_model *m = NULL;
    ms_error err = {0};
    assert_int_equal(ms_onnx_open(path, &m, &err), MS_ERR_INVALID);
    unlink(path);
    assert_null(m);
    assert_non_null(strstr(err.msg, "not an ONNX model"));
    assert_non_null(strstr(err.msg, "ms_onnx_trunc"));
}

static void test_not_protobuf(void **state) {
    (void)state;
    const char *text = "this is a text file, not a model\n";
    ms_onnx_model *m = NULL;
    ms_error err = {0};
    assert_int_equal(ms_onnx_open_bytes(text, strlen(text), "notes.txt", &m, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "notes.txt: not an ONNX model"));
    assert_int_equal(ms_onnx_open("/nonexistent/model.onnx", &m, &err), MS_ERR_IO);
}

static void test_unknown_operator(void **state) {
    (void)state;
    spec s = RELU;
    s.op = "FrobnicateV2";
    expect(&s, MS_ERR_UNSUPPORTED, "node 'n0' (FrobnicateV2)", "not supported", NULL);
}

static void test_dynamic_dims(void **state) {
    (void)state;
    spec s = RELU;
    s.d1 = -1;
    expect(&s, MS_ERR_UNSUPPORTED, "'x'", "dynamic dim 1", "only the first (batch) dim", NULL);
}

static void test_huge_dims(void **state) {
    (void)state;
    spec s = RELU;
    s.d1 = INT64_C(1) << 40;
    expect(&s, MS_ERR_UNSUPPORTED, "'x'", "dim 1 of size 1099511627776", NULL);
}

static void test_wrong_dtype(void **state) {
    (void)state;
    spec s = RELU;
    s.xt = 11; /* float64 */
    expect(&s, MS_ERR_UNSUPPORTED, "graph input 'x'", "float64", "float32", NULL);
    spec a = {.op = "Add", .opset = 17, .xt = 1, .wt = 11, .d0 = 2, .d1 = 4};
    expect(&a, MS_ERR_UNSUPPORTED, "'w'", "float64", NULL);
}

static void test_opset_range(void **state) {
    (void)state;
    spec s = RELU;
    s.opset = 99;
    expect(&s, MS_ERR_UNSUPPORTED, "opset 99", "supported range", NULL);
    s.opset = 0;
    expect(&s, MS_ERR_UNSUPPORTED, "opset 0", "supported range", NULL);
}

static void test_build_refusal(void **state) {
    (void)state;
    /* Reshape's shape computed at run time (a graph input) cannot be folded */
    spec s = {.op = "Reshape", .opset = 17, .xt = 1, .wt = 0, .d0 = 2, .d1 = 4};
    size_t len;
    uint8_t *buf = pack(&s, &len);
    ms_onnx_model *m = NULL;
    ms_error err = {0};
    assert_int_equal(ms_onnx_open_bytes(buf, len, "r.onnx", &m, &err), MS_OK);
    free(buf);
    ms_graph *g = ms_graph_create();
    int out;
    assert_int_not_equal(ms_onnx_build(m, 1, g, &out, 1, &err), MS_OK);
    assert_non_null(strstr(err.msg, "node 'n0' (Reshape)"));
    ms_graph_destroy(g);
    ms_onnx_close(m);
}

/* y = Relu(a), a = Add(x, w): with `a_out`, a is a graph output as well. */
static uint8_t *pack_add_relu(bool a_out, size_t *len) {
    Onnx__OperatorSetIdProto os = ONNX__OPERATOR_SET_ID_PROTO__INIT, *osp = &os;
    os.domain = "";
    os.has_version = 1;
    os.version = 17;
    char *add_in[2] = {"x", "w"}, *add_out[1] = {"a"}, *relu_out[1] = {"y"};
    Onnx__NodeProto add = ONNX__NODE_PROTO__INIT, relu = ONNX__NODE_PROTO__INIT;
    Onnx__NodeProto *nodes[2] = {&add, &relu};
    add.name = "add", add.op_type = "Add", add.n_input = 2, add.input = add_in;
    add.n_output = 1, add.output = add_out;
    relu.name = "relu", relu.op_type = "Relu", relu.n_input = 1, relu.input = add_out;
    relu.n_output = 1, relu.output = relu_out;
    Onnx__TensorShapeProto__Dimension d[2] = {ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT,
                                              ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT};
    Onnx__TensorShapeProto__Dimension *dp[2] = {&d[0], &d[1]};
    for (int k = 0; k < 2; k++) {
        d[k].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        d[k].dim_value = k ? 4 : 2;
    }
    Onnx__TensorShapeProto shape = ONNX__TENSOR_SHAPE_PROTO__INIT;
    shape.n_dim = 2;
    shape.dim = dp;
    Onnx__TypeProto__Tensor tt = ONNX__TYPE_PROTO__TENSOR__INIT;
    tt.has_elem_type = 1;
    tt.elem_type = 1;
    tt.shape = &shape;
    Onnx__TypeProto ty = ONNX__TYPE_PROTO__INIT;
    ty.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    ty.tensor_type = &tt;
    Onnx__ValueInfoProto vx = ONNX__VALUE_INFO_PROTO__INIT, vy = ONNX__VALUE_INFO_PROTO__INIT,
                         va = ONNX__VALUE_INFO_PROTO__INIT;
    Onnx__ValueInfoProto *vxp = &vx, *outs[2] = {&vy, &va};
    vx.name = "x", vy.name = "y", va.name = "a";
    vx.type = vy.type = va.type = &ty;
    Onnx__TensorProto w = ONNX__TENSOR_PROTO__INIT, *wp = &w;
    int64_t wdim = 4;
    float raw[4] = {1, -1, 0.5f, -0.5f};
    w.name = "w", w.has_data_type = 1, w.data_type = 1, w.n_dims = 1, w.dims = &wdim;
    w.has_raw_data = 1, w.raw_data.data = (uint8_t *)raw, w.raw_data.len = sizeof raw;
    Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
    g.name = "g", g.n_node = 2, g.node = nodes, g.n_input = 1, g.input = &vxp;
    g.n_output = a_out ? 2 : 1, g.output = outs, g.n_initializer = 1, g.initializer = &wp;
    Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
    m.has_ir_version = 1, m.ir_version = 8, m.n_opset_import = 1, m.opset_import = &osp;
    m.graph = &g;
    *len = onnx__model_proto__get_packed_size(&m);
    uint8_t *buf = malloc(*len);
    onnx__model_proto__pack(&m, buf);
    return buf;
}

/* A residual Add read only by the Relu after it becomes one add_relu operator (no value named
 * after the Relu's output); an Add the graph also outputs keeps both. */
static void test_add_relu_fused(void **state) {
    (void)state;
    for (int a_out = 0; a_out < 2; a_out++) {
        size_t len;
        uint8_t *buf = pack_add_relu(a_out, &len);
        ms_onnx_model *m = NULL;
        ms_error err = {0};
        assert_int_equal(ms_onnx_open_bytes(buf, len, "ar.onnx", &m, &err), MS_OK);
        free(buf);
        ms_graph *g = ms_graph_create();
        int out[2] = {-1, -1};
        if (ms_onnx_build(m, 2, g, out, 1 + a_out, &err) != MS_OK) fail_msg("%s", err.msg);
        if (!a_out) {
            assert_string_equal(ms_graph_value_name(g, out[0]), "a");
            assert_true(ms_graph_find(g, "y") < 0);
        } else {
            assert_string_equal(ms_graph_value_name(g, out[0]), "y");
            assert_string_equal(ms_graph_value_name(g, out[1]), "a");
        }
        ms_graph_destroy(g);
        ms_onnx_close(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_relu_fused),   cmocka_unit_test(test_valid),
        cmocka_unit_test(test_truncated),        cmocka_unit_test(test_not_protobuf),
        cmocka_unit_test(test_unknown_operator), cmocka_unit_test(test_dynamic_dims),
        cmocka_unit_test(test_huge_dims),        cmocka_unit_test(test_wrong_dtype),
        cmocka_unit_test(test_opset_range),      cmocka_unit_test(test_build_refusal),
    };
    return cmocka_run_group_tests_name("onnx_import", tests, NULL, NULL);
}

#else

int main(void) {
    ms_onnx_model *m = NULL;
    ms_error err = {0};
    if (ms_onnx_open("x.onnx", &m, &err) != MS_ERR_UNSUPPORTED || !strstr(err.msg, "libonnx-dev"))
        return 1;
    printf("skipped: this build has no ONNX import (MS_ENABLE_ONNX)\n");
    return 77;
}

#endif

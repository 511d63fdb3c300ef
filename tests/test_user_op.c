/* test_user_op.c - registering an operator from outside the engine library.
 *
 * A fused bias + GELU operator (the way one would register a FlashAttention kernel) is
 * defined here with its shape rule, SPMD rule, forward and backward, registered with
 * ms_op_register, and then used in eager mode and in a graph with autograd on a 2-rank
 * mesh. Its results must equal the built-in bias and gelu operators run separately. The
 * same code is the example in docs/user-ops.md.
 */
#include <math.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/dist/reshard.h"
#include "engine/graph/eager.h"
#include "engine/graph/graph.h"
#include "tests/testkit.h"

/* --- the user operator: y = gelu(x + b), x [..., C], b [C] -------------------------------- */

static ms_status bias_gelu_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                                 ms_error *err) {
    (void)a, (void)n_in;
    if (in[1].ndim != 1 || in[0].d[in[0].ndim - 1] != in[1].d[0])
        return ms_fail(err, MS_ERR_INVALID, "bias_gelu: bias must be [C], C = the last input dim");
    out[0] = in[0];
    return MS_OK;
}

/* Along one mesh dim: replicated, rows sharded (bias replicated), or channels sharded (bias
 * sharded the same way). */
static int bias_gelu_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,
                          ms_rule_cand *c) {
    (void)a, (void)n_in, (void)n;
    int k = 0, last = in[0].ndim - 1;
    c[k].in[0] = ms_R(), c[k].in[1] = ms_R(), c[k++].out[0] = ms_R();
    for (int d = 0; d < last; d++)
        c[k].in[0] = ms_S(d), c[k].in[1] = ms_R(), c[k++].out[0] = ms_S(d);
    c[k].in[0] = ms_S(last), c[k].in[1] = ms_S(0), c[k++].out[0] = ms_S(last);
    return k;
}

static float gelu(float x) {
    const float s = sqrtf(2.0f / (float)M_PI);
    return 0.5f * x * (1.0f + tanhf(s * (x + 0.044715f * x * x * x)));
}

static float gelu_grad(float x) {
    const float s = sqrtf(2.0f / (float)M_PI);
    float u = s * (x + 0.044715f * x * x * x), t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * s * (1.0f + 3.0f * 0.044715f * x * x);
}

static ms_status bias_gelu_forward(ms_op_call *c, ms_error *err) {
    (void)err;
    const float *x = ms_tensor_f32(c->in[0]), *b = ms_tensor_f32(c->in[1]);
    float *y = ms_tensor_f32(c->out[0]);
    int64_t C = c->in[1]->shape[0], n = ms_tensor_numel(c->in[0]);
    for (int64_t i = 0; i < n; i++) y[i] = gelu(x[i] + b[i % C]);
    return MS_OK;
}

static ms_status bias_gelu_backward(ms_op_call *c, ms_error *err) {
    (void)err;
    const float *x = ms_tensor_f32(c->in[0]), *b = ms_tensor_f32(c->in[1]);
    const float *dy = ms_tensor_f32(c->dout[0]);
    int64_t C = c->in[1]->shape[0], n = ms_tensor_numel(c->in[0]);
    for (int64_t i = 0; i < n; i++) {
        float g = dy[i] * gelu_grad(x[i] + b[i % C]);
        if (c->din[0]) ms_tensor_f32(c->din[0])[i] += g;
        if (c->din[1]) ms_tensor_f32(c->din[1])[i % C] += g;
    }
    return MS_OK;
}

static const ms_op_def bias_gelu_def = {
    .name = "my_bias_gelu",
    .n_in = 2,
    .n_out = 1,
    .infer = bias_gelu_infer,
    .rule = bias_gelu_rule,
    .forward = bias_gelu_forward,
    .backward = bias_gelu_backward,
    .grad_inputs = 3,
};

static int bias_gelu_op = -1;

/* --- tests ---------------------------------------------------------------------------------- */

static void fill(ms_tensor *t, uint64_t stream) {
    for (int64_t k = 0; k < ms_tensor_numel(t); k++)
        ms_tensor_f32(t)[k] = 2 * ms_philox_uniform(3, stream, (uint64_t)k) - 1;
}

static void eager_body(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_mesh mesh;
    ms_mesh_parse(&mesh, "2", &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    const int64_t xs[2] = {5, 6}, bs[1] = {6};
    ms_tensor x, b;
    ms_tensor_alloc(r->ctx->device, MS_F32, 2, xs, &x, &err);
    ms_tensor_alloc(r->ctx->device, MS_F32, 1, bs, &b, &err);
    fill(&x, 1), fill(&b, 2);
    const char *xpl[] = {"[R]", "[S(0)]", "[S(1)]", "[P(sum)]"};
    for (int i = 0; i < 4; i++) {
        ms_placements px, pb;
        ms_placements_parse(xpl[i], &px, &err);
        ms_placements_parse("[R]", &pb, &err);
        ms_dtensor dx, db, fused, biased, ref;
        ms_dtensor_shard(dm, &x, &px, &dx, &err);
        ms_dtensor_shard(dm, &b, &pb, &db, &err);
        const ms_dtensor *in[2] = {&dx, &db};
        ms_eager_opts eo = {.allow_reshard = true};
        if (!MT_OK(r, ms_eager(bias_gelu_op, NULL, 2, in, 1, &fused, &eo, &err), &err)) continue;
        MT_OK(r, ms_eager(MS_OP_BIAS, NULL, 2, in, 1, &biased, &eo, &err), &err);
        const ms_dtensor *in1[1] = {&biased};
        MT_OK(r, ms_eager(MS_OP_GELU, NULL, 1, in1, 1, &ref, &eo, &err), &err);
        ms_tensor a, c;
        MT_OK(r, ms_dtensor_full(&fused, &a, &err), &err);
        MT_OK(r, ms_dtensor_full(&ref, &c, &err), &err);
        for (int64_t k = 0; k < 30; k++)
            MT_CHECK(r, fabsf(ms_tensor_f32(&a)[k] - ms_tensor_f32(&c)[k]) < 1e-6f,
                     "bias_gelu with x %s differs at %lld", xpl[i], (long long)k);
        ms_tensor_release(&a), ms_tensor_release(&c);
        ms_dtensor_release(&dx), ms_dtensor_release(&db), ms_dtensor_release(&fused);
        ms_dtensor_release(&biased), ms_dtensor_release(&ref);
    }
    ms_tensor_release(&x), ms_tensor_release(&b);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void eager_user_op(void **s) {
    (void)s;
    mt_run(2, eager_body, NULL);
}

/* A graph: loss = mean(op(x @ W, b)); gradients of W and b with the fused op must equal
 * those with bias + gelu, on a 2-rank mesh with W column-sharded. */
typedef struct grads {
    float w[4 * 6], b[6], loss;
} grads;

static void graph_body(mt_rank *r, void *arg) {
    grads *out = arg;
    ms_error err = {0};
    for (int fused = 0; fused < 2; fused++) {
        ms_graph *g = ms_graph_create();
        const int64_t xs[2] = {5, 4}, ws[2] = {4, 6}, bs[1] = {6};
        int x = ms_graph_input(g, "x", 2, xs);
        int w = ms_graph_param(g, "w", 2, ws, (ms_init){MS_INIT_NORMAL, 0.5f});
        int b = ms_graph_param(g, "b", 1, bs, (ms_init){MS_INIT_NORMAL, 0.5f});
        int mm_in[2] = {x, w};
        int h = ms_graph_op(g, MS_OP_MATMUL, NULL, 2, mm_in, "mm");
        int hb[2] = {h, b};
        int y;
        if (fused) {
            y = ms_graph_op(g, bias_gelu_op, NULL, 2, hb, "act");
        } else {
            int t = ms_graph_op(g, MS_OP_BIAS, NULL, 2, hb, "biased");
            y = ms_graph_op(g, MS_OP_GELU, NULL, 1, &t, "act");
        }
        ms_op_attrs all = {.i = {-1}};
        int loss = ms_graph_op(g, MS_OP_MEAN, &all, 1, &y, "loss");
        ms_graph_set_loss(g, loss);
        ms_placements col;
        ms_placements_parse("[S(1)]", &col, &err);
        ms_graph_annotate(g, w, &col);
        ms_mesh mesh;
        ms_mesh_parse(&mesh, "2", &err);
        ms_dmesh *dm;
        MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err);
        ms_program *p;
        ms_compile_opts co = {.seed = 5};
        if (MT_OK(r, ms_program_compile(g, dm, &co, &p, &err), &err)) {
            float xv[20];
            for (int k = 0; k < 20; k++) xv[k] = 2 * ms_philox_uniform(9, 0, (uint64_t)k) - 1;
            ms_program_feed(p, x, xv, &err);
            float l;
            MT_OK(r, ms_program_step(p, &l, &err), &err);
            for (int i = 0; i < ms_program_num_params(p); i++) {
                ms_param_view pv;
                ms_program_param(p, i, &pv);
                ms_dtensor t = {.ndim = pv.gshape.ndim, .mesh = dm, .pl = pv.pl, .local = pv.grad};
                memcpy(t.gshape, pv.gshape.d, sizeof t.gshape);
                ms_tensor full;
                MT_OK(r, ms_dtensor_full(&t, &full, &err), &err);
                float *dst = !strcmp(pv.name, "w") ? out[fused].w : out[fused].b;
                if (r->ctx->rank == 0)
                    memcpy(dst, ms_tensor_f32(&full),
                           sizeof(float) * (size_t)ms_tensor_numel(&full));
                ms_tensor_release(&full);
            }
            if (r->ctx->rank == 0) out[fused].loss = l;
            ms_program_destroy(p);
        }
        ms_dmesh_destroy(dm);
        ms_mesh_free(&mesh);
        ms_graph_destroy(g);
    }
}

static void graph_user_op(void **s) {
    (void)s;
    grads out[2];
    memset(out, 0, sizeof out);
    mt_run(2, graph_body, out);
    if (mt_world_rank() != 0) return;
    assert_float_equal(out[0].loss, out[1].loss, 1e-6);
    for (int k = 0; k < 24; k++) assert_float_equal(out[0].w[k], out[1].w[k], 1e-6);
    for (int k = 0; k < 6; k++) assert_float_equal(out[0].b[k], out[1].b[k], 1e-6);
    assert_true(fabsf(out[0].b[0]) > 0); /* gradients flowed */
}

static void registration(void **s) {
    (void)s;
    ms_error err = {0};
    if (bias_gelu_op < 0)
        assert_int_equal(ms_op_register(&bias_gelu_def, &bias_gelu_op, &err), MS_OK);
    assert_true(bias_gelu_op >= MS_OP_BUILTIN_COUNT);
    assert_int_equal(ms_op_find("my_bias_gelu"), bias_gelu_op);
    int again;
    assert_int_equal(ms_op_register(&bias_gelu_def, &again, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "already registered"));
    ms_op_def broken = bias_gelu_def;
    broken.name = "broken";
    broken.rule = NULL;
    assert_int_equal(ms_op_register(&broken, &again, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "rule"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(registration),
    cmocka_unit_test(eager_user_op),
    cmocka_unit_test(graph_user_op),
};
MT_MAIN("user_op", tests)

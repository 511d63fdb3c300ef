/* test_op_grads.c - every operator's backward against central finite differences of its
 * own forward, for every case of the operator table (tests/op_cases).
 *
 * For a random projection L = sum_o <w_o, y_o> of the outputs, the backward fed dout = w
 * must give dL/dx. Each input that takes gradients is checked on its own along a random
 * direction v: <dL/dx, v> against (L(x + h v) - L(x - h v)) / 2h, with L summed in double.
 * Backward kernels accumulate, so input gradients start from random values and the test
 * checks the increment. Integer inputs (ids, targets) take no gradient and are skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"
#include "engine/core/philox.h"
#include "tests/op_cases.h"
#include "tests/testkit.h"

#define FD_STEP 1e-3
#define FD_TOL  1e-2 /* relative to max(1, |finite difference|) */

typedef struct op_run {
    const op_case *c;
    const ms_op_def *def;
    ms_device *dev;
    ms_shape outs[MS_OP_MAX_OUT];
    ms_tensor in[3], out[MS_OP_MAX_OUT], saved[MS_OP_MAX_SAVED];
    ms_op_call call;
} op_run;

static void run_open(op_run *r, ms_device *dev, const op_case *c) {
    ms_error err = {0};
    memset(r, 0, sizeof *r);
    r->c = c;
    r->dev = dev;
    r->def = ms_op_get(c->op);
    assert_non_null(r->def);
    if (r->def->infer(&c->a, c->n_in, c->in, r->outs, &err) != MS_OK)
        fail_msg("%s: infer: %s", c->name, err.msg);
    static const ms_placements none[MS_OP_MAX_IN];
    r->call = (ms_op_call){.kc = ms_kctx_host(),
                           .attrs = &c->a,
                           .n_in = c->n_in,
                           .n_out = c->n_out,
                           .gin = c->in,
                           .gout = r->outs,
                           .in_pl = none,
                           .out_pl = none,
                           .seed = 7};
    for (int i = 0; i < c->n_in; i++) {
        assert_int_equal(ms_tensor_alloc(dev, MS_F32, c->in[i].ndim, c->in[i].d, &r->in[i], &err),
                         MS_OK);
        mt_op_case_fill(c, i, &r->in[i]);
        r->call.in[i] = &r->in[i];
    }
    for (int o = 0; o < c->n_out; o++) {
        assert_int_equal(
            ms_tensor_alloc(dev, MS_F32, r->outs[o].ndim, r->outs[o].d, &r->out[o], &err), MS_OK);
        r->call.out[o] = &r->out[o];
    }
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    if (r->def->saved_floats) r->def->saved_floats(&c->a, &r->call, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (sizes[k]) {
            assert_int_equal(ms_tensor_alloc(dev, MS_F32, 1, &sizes[k], &r->saved[k], &err), MS_OK);
            r->call.saved[k] = &r->saved[k];
        }
}

static void run_close(op_run *r) {
    for (int i = 0; i < r->c->n_in; i++) ms_tensor_release(&r->in[i]);
    for (int o = 0; o < r->c->n_out; o++) ms_tensor_release(&r->out[o]);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&r->saved[k]);
}

/* sum_o <w_o, y_o> after a forward, in double. */
static double projected(op_run *r, float *const *w) {
    ms_error err = {0};
    if (r->def->forward(&r->call, &err) != MS_OK) fail_msg("%s: forward: %s", r->c->name, err.msg);
    double L = 0;
    for (int o = 0; o < r->c->n_out; o++) {
        const float *y = ms_tensor_f32(&r->out[o]);
        for (int64_t k = 0; k < ms_tensor_numel(&r->out[o]); k++) L += (double)w[o][k] * y[k];
    }
    return L;
}

static void check_case(ms_device *dev, const op_case *c, int *checked) {
    op_run r;
    run_open(&r, dev, c);
    ms_error err = {0};
    float *w[MS_OP_MAX_OUT] = {0};
    ms_tensor dout[MS_OP_MAX_OUT] = {0}, din[3] = {0};
    for (int o = 0; o < c->n_out; o++) {
        assert_int_equal(ms_tensor_alloc(dev, MS_F32, r.outs[o].ndim, r.outs[o].d, &dout[o], &err),
                         MS_OK);
        w[o] = ms_tensor_f32(&dout[o]);
        for (int64_t k = 0; k < ms_tensor_numel(&dout[o]); k++)
            w[o][k] = 2 * ms_philox_uniform(21, (uint64_t)o, (uint64_t)k) - 1;
        r.call.dout[o] = &dout[o];
    }
    /* The analytic gradients: forward (fills saved), then backward onto random starts. */
    projected(&r, w);
    float *start[3] = {0};
    for (int i = 0; i < c->n_in; i++) {
        if (!(r.def->grad_inputs & (1u << i)) || c->kind[i] != IN_FLOAT) continue;
        assert_int_equal(ms_tensor_alloc(dev, MS_F32, c->in[i].ndim, c->in[i].d, &din[i], &err),
                         MS_OK);
        int64_t n = ms_tensor_numel(&din[i]);
        start[i] = malloc(sizeof(float) * (size_t)n);
        for (int64_t k = 0; k < n; k++)
            start[i][k] = ms_tensor_f32(&din[i])[k] =
                ms_philox_uniform(31, (uint64_t)i, (uint64_t)k) - 0.5f;
        r.call.din[i] = &din[i];
    }
    if (r.def->backward(&r.call, &err) != MS_OK) fail_msg("%s: backward: %s", c->name, err.msg);
    for (int i = 0; i < c->n_in; i++) {
        if (!start[i]) continue;
        int64_t n = ms_tensor_numel(&r.in[i]);
        float *x = ms_tensor_f32(&r.in[i]), *g = ms_tensor_f32(&din[i]);
        float *x0 = malloc(sizeof(float) * (size_t)n), *v = malloc(sizeof(float) * (size_t)n);
        memcpy(x0, x, sizeof(float) * (size_t)n);
        double analytic = 0;
        for (int64_t k = 0; k < n; k++) {
            v[k] = 2 * ms_philox_uniform(41, (uint64_t)i, (uint64_t)k) - 1;
            analytic += (double)(g[k] - start[i][k]) * v[k];
        }
        for (int64_t k = 0; k < n; k++) x[k] = (float)(x0[k] + FD_STEP * v[k]);
        double up = projected(&r, w);
        for (int64_t k = 0; k < n; k++) x[k] = (float)(x0[k] - FD_STEP * v[k]);
        double down = projected(&r, w);
        memcpy(x, x0, sizeof(float) * (size_t)n);
        double fd = (up - down) / (2 * FD_STEP);
        if (!(fabs(analytic - fd) <= FD_TOL * fmax(1, fabs(fd))))
            fail_msg("%s: input %d: backward gives %.6g along a random direction, finite "
                     "differences %.6g",
                     c->name, i, analytic, fd);
        (*checked)++;
        free(x0), free(v), free(start[i]);
    }
    for (int o = 0; o < c->n_out; o++) ms_tensor_release(&dout[o]);
    for (int i = 0; i < c->n_in; i++) ms_tensor_release(&din[i]);
    run_close(&r);
}

static void backward_matches_finite_differences(void **state) {
    (void)state;
    ms_device *dev = NULL;
    ms_error err = {0};
    assert_int_equal(ms_device_cpu_create(&dev, &err), MS_OK);
    int checked = 0;
    for (int ci = 0; ci < ms_n_op_cases; ci++) check_case(dev, &ms_op_cases[ci], &checked);
    print_message("  %d inputs of %d op cases checked\n", checked, ms_n_op_cases);
    assert_true(checked > 0);
    ms_device_destroy(dev);
}

/* Every built-in operator has at least one case (so none escapes these tests). */
static void every_operator_has_a_case(void **state) {
    (void)state;
    for (int op = 0; op < MS_OP_BUILTIN_COUNT; op++) {
        bool found = false;
        for (int ci = 0; ci < ms_n_op_cases && !found; ci++) found = ms_op_cases[ci].op == op;
        if (!found) fail_msg("operator '%s' has no case in tests/op_cases", ms_op_get(op)->name);
    }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(every_operator_has_a_case),
    cmocka_unit_test(backward_matches_finite_differences),
};
MT_MAIN("op grads", tests)

/* test_ops_conv.c - conv1d and conv2d against a direct loop in float64 written here (no im2col,
 * no GEMM): the forward and every gradient (dx, dw, dbias) over strides, paddings, dilations,
 * groups (depthwise and channel multipliers included), pointwise kernels, a kernel as large as
 * the padded input, and conv1d, on one rank; a rank's shard of the output channels that reads
 * its groups from all of x (the box start); fresh gradients written whole over NaN; conv2d with
 * a bias brute-forced on a mesh of 2, forward and gradients through the tape (its three inputs
 * of 4 and 1 dims are too many for test_rules' 2x2 sweep); infer's errors; the cost and the
 * column buffer's size.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"
#include "engine/core/parallel.h"
#include "engine/core/philox.h"
#include "engine/dist/dtensor.h"
#include "engine/graph/eager.h"
#include "engine/graph/tape.h"
#include "engine/kernels/conv.h"
#include "engine/ops/op.h"
#include "tests/testkit.h"

/* The specs below leave `relu` out where it is off. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* A convolution as the test sees it: conv1d when nsp == 1 (its one dim in [0]). */
typedef struct conv_spec {
    const char *name;
    int nsp;
    int64_t n, cin, cout, groups;
    int64_t len[2], k[2], stride[2], pad[2], dil[2];
    bool bias;
    bool relu; /* the fused ReLU after the bias (i[3 nsp + 1]) */
} conv_spec;

static ms_op_attrs attrs_of(const conv_spec *s) {
    ms_op_attrs a = {0};
    for (int d = 0; d < s->nsp; d++) {
        a.i[d] = s->stride[d];
        a.i[s->nsp + d] = s->pad[d];
        a.i[2 * s->nsp + d] = s->dil[d];
    }
    a.i[3 * s->nsp] = s->groups;
    a.i[3 * s->nsp + 1] = s->relu;
    return a;
}

static int op_of(const conv_spec *s) {
    return s->nsp == 1 ? MS_OP_CONV1D : MS_OP_CONV2D;
}

/* x, w and (with a bias) b; returns the number of inputs. */
static int shapes_of(const conv_spec *s, ms_shape *in) {
    in[0] = (ms_shape){2 + s->nsp, {s->n, s->cin}};
    in[1] = (ms_shape){2 + s->nsp, {s->cout, s->cin / s->groups}};
    for (int d = 0; d < s->nsp; d++) in[0].d[2 + d] = s->len[d], in[1].d[2 + d] = s->k[d];
    in[2] = (ms_shape){1, {s->cout}};
    return s->bias ? 3 : 2;
}

static int64_t numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

static void fill(float *x, int64_t n, uint64_t stream) {
    for (int64_t k = 0; k < n; k++) x[k] = 2 * ms_philox_uniform(9, stream, (uint64_t)k) - 1;
}

/* --- the reference: the definition, summed in double ------------------------------------- */

/* Sizes as [H, W] with conv1d's one dim as W (H = 1). */
typedef struct dims2 {
    int64_t h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw;
} dims2;

static dims2 dims_of(const conv_spec *s) {
    dims2 d = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1};
    int64_t *len[2] = {&d.h, &d.w}, *k[2] = {&d.kh, &d.kw}, *o[2] = {&d.oh, &d.ow};
    int64_t *st[2] = {&d.sh, &d.sw}, *pd[2] = {&d.ph, &d.pw}, *dl[2] = {&d.dh, &d.dw};
    for (int i = 0; i < s->nsp; i++) {
        int t = 2 - s->nsp + i;
        *len[t] = s->len[i], *k[t] = s->k[i], *st[t] = s->stride[i], *pd[t] = s->pad[i];
        *dl[t] = s->dil[i];
        *o[t] = (s->len[i] + 2 * s->pad[i] - s->dil[i] * (s->k[i] - 1) - 1) / s->stride[i] + 1;
    }
    return d;
}

typedef struct conv_ref {
    double *y, *dx, *dw, *db;
} conv_ref;

/* y = conv(x, w) + b and, for the output gradient dy, dx, dw and db: each output element
 * visits its taps directly. */
static conv_ref reference(const conv_spec *s, const float *x, const float *w, const float *b,
                          const float *dy) {
    dims2 d = dims_of(s);
    int64_t cin_g = s->cin / s->groups, cout_g = s->cout / s->groups;
    int64_t ny = s->n * s->cout * d.oh * d.ow;
    conv_ref r = {calloc((size_t)ny, sizeof(double)),
                  calloc((size_t)(s->n * s->cin * d.h * d.w), sizeof(double)),
                  calloc((size_t)(s->cout * cin_g * d.kh * d.kw), sizeof(double)),
                  calloc((size_t)s->cout, sizeof(double))};
    for (int64_t i = 0; i < s->n; i++)
        for (int64_t o = 0; o < s->cout; o++)
            for (int64_t oy = 0; oy < d.oh; oy++)
                for (int64_t ox = 0; ox < d.ow; ox++) {
                    int64_t yi = ((i * s->cout + o) * d.oh + oy) * d.ow + ox;
                    double acc = b ? b[o] : 0, g = dy[yi];
                    for (int64_t ci = 0; ci < cin_g; ci++)
                        for (int64_t ky = 0; ky < d.kh; ky++)
                            for (int64_t kx = 0; kx < d.kw; kx++) {
                                int64_t iy = oy * d.sh - d.ph + ky * d.dh;
                                int64_t ix = ox * d.sw - d.pw + kx * d.dw;
                                if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
                                int64_t c = (o / cout_g) * cin_g + ci;
                                int64_t xi = ((i * s->cin + c) * d.h + iy) * d.w + ix;
                                int64_t wi = ((o * cin_g + ci) * d.kh + ky) * d.kw + kx;
                                acc += (double)w[wi] * x[xi];
                                r.dx[xi] += (double)w[wi] * g;
                                r.dw[wi] += (double)x[xi] * g;
                            }
                    r.y[yi] = acc;
                    r.db[o] += g;
                }
    return r;
}

static void ref_free(conv_ref *r) {
    free(r->y), free(r->dx), free(r->dw), free(r->db);
}

/* reference() with the spec's ReLU: y = max(conv, 0), the gradients of dy where conv > 0. */
static conv_ref reference_act(const conv_spec *s, const float *x, const float *w, const float *b,
                              const float *dy) {
    if (!s->relu) return reference(s, x, w, b, dy);
    dims2 d = dims_of(s);
    const int64_t ny = s->n * s->cout * d.oh * d.ow;
    conv_ref pre = reference(s, x, w, b, dy);
    float *masked = calloc((size_t)(ny > 0 ? ny : 1), sizeof(float));
    for (int64_t k = 0; k < ny; k++) masked[k] = pre.y[k] > 0 ? dy[k] : 0.0f;
    conv_ref r = reference(s, x, w, b, masked);
    for (int64_t k = 0; k < ny; k++) r.y[k] = r.y[k] > 0 ? r.y[k] : 0;
    free(masked);
    ref_free(&pre);
    return r;
}

/* Largest |got - want| / (1 + |want|) over n elements. */
static double worst(const float *got, const double *want, int64_t n) {
    double e = 0;
    for (int64_t k = 0; k < n; k++) {
        double d = fabs(got[k] - want[k]) / (1 + fabs(want[k]));
        e = isnan(got[k]) ? INFINITY : fmax(e, d);
    }
    return e;
}

/* --- one rank: the op through its table row ------------------------------------------------- */

/* One call: local tensors (box starts in start), forward, then backward into din with the
 * given fresh bits (din's content then NaN, else zeros). */
typedef struct conv_call {
    int op, n_in;
    ms_op_attrs a;
    ms_shape gin[3], lin[3];
    int64_t start[3][MS_MAX_DIMS];
    const float *x[3], *dy;
    float *y, *din[3];
    unsigned fresh;
} conv_call;

static ms_tensor host_tensor(const ms_shape *s, const float *from) {
    ms_tensor t = {0};
    ms_error err = {0};
    assert_int_equal(ms_tensor_alloc(ms_device_host(), MS_F32, s->ndim, s->d, &t, &err), MS_OK);
    if (from) memcpy(ms_tensor_f32(&t), from, sizeof(float) * (size_t)numel(s));
    return t;
}

/* A call of one output on host tensors, no placements: the caller adds its tensors. */
static ms_op_call host_call(const ms_op_attrs *a, int n_in, const ms_shape *gin,
                            const ms_shape *gout) {
    static const ms_placements none[MS_OP_MAX_IN];
    return (ms_op_call){.kc = ms_kctx_host(),
                        .attrs = a,
                        .n_in = n_in,
                        .n_out = 1,
                        .gin = gin,
                        .gout = gout,
                        .in_pl = none,
                        .out_pl = none};
}

static void conv_run(conv_call *cc) {
    const ms_op_def *def = ms_op_get(cc->op);
    ms_error err = {0};
    ms_shape gout, lout;
    assert_int_equal(def->infer(&cc->a, cc->n_in, cc->gin, &gout, &err), MS_OK);
    lout = gout;
    lout.d[1] = cc->lin[1].d[0]; /* the output channels are the weight's */
    ms_op_call c = host_call(&cc->a, cc->n_in, cc->gin, &gout);
    ms_tensor tin[3], din[3], tout = host_tensor(&lout, NULL), dout = host_tensor(&lout, cc->dy);
    ms_tensor saved[MS_OP_MAX_SAVED] = {0};
    for (int i = 0; i < cc->n_in; i++) {
        tin[i] = host_tensor(&cc->lin[i], cc->x[i]);
        din[i] = host_tensor(&cc->lin[i], NULL);
        float *g = ms_tensor_f32(&din[i]);
        for (int64_t k = 0; k < numel(&cc->lin[i]); k++) g[k] = cc->fresh ? NAN : 0.0f;
        c.in[i] = &tin[i], c.din[i] = cc->din[i] ? &din[i] : NULL;
        memcpy(c.in_start[i], cc->start[i], sizeof cc->start[i]);
    }
    c.out[0] = &tout, c.dout[0] = &dout, c.din_fresh = cc->fresh;
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    def->saved_floats(&cc->a, &c, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (sizes[k]) {
            assert_int_equal(
                ms_tensor_alloc(ms_device_host(), MS_F32, 1, &sizes[k], &saved[k], &err), MS_OK);
            c.saved[k] = &saved[k];
        }
    if (def->forward(&c, &err) != MS_OK) fail_msg("forward: %s", err.msg);
    if (def->backward(&c, &err) != MS_OK) fail_msg("backward: %s", err.msg);
    memcpy(cc->y, ms_tensor_f32(&tout), sizeof(float) * (size_t)numel(&lout));
    for (int i = 0; i < cc->n_in; i++) {
        if (cc->din[i])
            memcpy(cc->din[i], ms_tensor_f32(&din[i]), sizeof(float) * (size_t)numel(&cc->lin[i]));
        ms_tensor_release(&tin[i]), ms_tensor_release(&din[i]);
    }
    ms_tensor_release(&tout), ms_tensor_release(&dout);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&saved[k]);
}

/* The whole op on one rank against the reference, gradients from zero and fresh. */
static void check_spec(const conv_spec *s) {
    ms_shape in[3], out;
    int n_in = shapes_of(s, in);
    ms_op_attrs a = attrs_of(s);
    ms_error err = {0};
    if (ms_op_get(op_of(s))->infer(&a, n_in, in, &out, &err) != MS_OK)
        fail_msg("%s: %s", s->name, err.msg);
    float *x[3], *y = malloc(sizeof(float) * (size_t)numel(&out));
    float *dy = malloc(sizeof(float) * (size_t)numel(&out)), *din[3];
    for (int i = 0; i < n_in; i++) {
        x[i] = malloc(sizeof(float) * (size_t)numel(&in[i]));
        din[i] = malloc(sizeof(float) * (size_t)numel(&in[i]));
        fill(x[i], numel(&in[i]), (uint64_t)i);
    }
    fill(dy, numel(&out), 7);
    conv_ref r = reference_act(s, x[0], x[1], s->bias ? x[2] : NULL, dy);
    double *want[3] = {r.dx, r.dw, r.db};
    for (unsigned fresh = 0; fresh <= 7; fresh += 7) {
        conv_call cc = {.op = op_of(s), .n_in = n_in, .a = a, .dy = dy, .y = y, .fresh = fresh};
        for (int i = 0; i < n_in; i++)
            cc.gin[i] = cc.lin[i] = in[i], cc.x[i] = x[i], cc.din[i] = din[i];
        conv_run(&cc);
        double e = worst(y, r.y, numel(&out));
        if (!(e <= 1e-5)) fail_msg("%s: forward off the float64 loop by %.3g", s->name, e);
        for (int i = 0; i < n_in; i++) {
            e = worst(din[i], want[i], numel(&in[i]));
            if (!(e <= 1e-5))
                fail_msg("%s: gradient of input %d%s off the float64 loop by %.3g", s->name, i,
                         fresh ? " (fresh)" : "", e);
        }
    }
    print_message("  %-44s out %s, within 1e-5 of float64\n", s->name,
                  ms_shape_str(out.d, out.ndim, (char[64]){0}, 64));
    ref_free(&r);
    for (int i = 0; i < n_in; i++) free(x[i]), free(din[i]);
    free(y), free(dy);
}

/* name, nsp, n, C_in, C_out, groups, sizes, kernel, stride, padding, dilation, bias */
// clang-format off
static const conv_spec specs[] = {
    {"conv2d 3x3 pad 1 bias", 2, 2, 3, 4, 1, {5, 6}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
    {"conv2d stride 2x1 pad 1x2 dilation 2x1", 2, 2, 4, 6, 1, {7, 6}, {3, 2}, {2, 1}, {1, 2}, {2, 1}, false},
    {"conv2d groups 2", 2, 2, 4, 6, 2, {5, 5}, {3, 3}, {1, 1}, {0, 0}, {1, 1}, true},
    {"conv2d depthwise x2 stride 2", 2, 3, 4, 8, 4, {6, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
    {"conv2d pointwise", 2, 2, 5, 3, 1, {4, 3}, {1, 1}, {1, 1}, {0, 0}, {1, 1}, true},
    {"conv2d pointwise depthwise", 2, 2, 5, 5, 5, {3, 4}, {1, 1}, {1, 1}, {0, 0}, {1, 1}, false},
    {"conv2d 1x1 stride 2 (not pointwise)", 2, 2, 3, 2, 1, {5, 4}, {1, 1}, {2, 2}, {0, 0}, {1, 1}, true},
    {"conv2d kernel the padded input", 2, 1, 2, 3, 1, {3, 3}, {5, 5}, {1, 1}, {1, 1}, {1, 1}, true},
    {"conv1d stride 2 pad 2 dilation 2 groups 2", 1, 3, 4, 6, 2, {9}, {3}, {2}, {2}, {2}, true},
    {"conv1d pointwise", 1, 2, 3, 2, 1, {7}, {1}, {1}, {0}, {1}, false},
    {"conv1d depthwise", 1, 2, 3, 3, 3, {8}, {4}, {3}, {1}, {1}, true},
    /* Rows a multiple of 16 wide, channels of 8: the direct kernels where built (conv_direct.h) */
    {"conv2d direct 3x3 pad 1 bias", 2, 2, 8, 16, 1, {5, 16}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
    {"conv2d direct 3x3 pad 1, rows of two blocks", 2, 2, 16, 8, 1, {5, 32}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
    /* The fused ReLU: in the stride-1 tile's store, after the phases' sum, after the GEMM */
    {"conv2d direct 3x3 pad 1 relu", 2, 2, 16, 16, 1, {5, 32}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true, true},
    {"conv2d phases 3x3 stride 2 relu", 2, 2, 3, 8, 1, {9, 31}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, true},
    {"conv2d 3x3 pad 1 groups 2 relu (GEMM)", 2, 2, 4, 6, 2, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true, true},
    {"conv1d k3 relu, no bias", 1, 2, 3, 4, 1, {9}, {3}, {1}, {1}, {1}, false, true},
    {"conv2d direct 5x3 pad 2x1, rows of three blocks", 2, 2, 8, 8, 1, {4, 48}, {5, 3}, {1, 1}, {2, 1}, {1, 1}, false},
    {"conv2d direct 5x3 pad 2x0 groups 2 (dx by GEMM)", 2, 2, 16, 16, 2, {6, 34}, {5, 3}, {1, 1}, {2, 0}, {1, 1}, true},
    {"conv2d direct 1x5 pad 0x2, 32 wide", 2, 3, 8, 8, 1, {3, 32}, {1, 5}, {1, 1}, {0, 2}, {1, 1}, false},
    {"conv2d direct pointwise", 2, 2, 8, 8, 1, {2, 16}, {1, 1}, {1, 1}, {0, 0}, {1, 1}, true},
    {"conv1d direct k3 pad 1", 1, 2, 8, 8, 1, {48}, {3}, {1}, {1}, {1}, true},
    /* Output channels of 16 a group: the weight gradient with the channels in the lanes */
    {"conv2d direct dw lanes 32 channels, 2 vectors", 2, 2, 8, 32, 1, {4, 16}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
    {"conv2d direct dw lanes 5x5 groups 2 (3 tap chunks)", 2, 2, 8, 32, 2, {5, 16}, {5, 5}, {1, 1}, {2, 2}, {1, 1}, false},
    {"conv2d direct dw lanes from 3 channels, 1 image a chunk", 2, 3, 3, 16, 1, {32, 64}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
    {"conv1d direct dw lanes k3 pad 2", 1, 2, 8, 16, 1, {32}, {3}, {1}, {2}, {1}, true},
    {"conv2d direct dw lanes, 3 chunks in 3 slots", 2, 5, 4, 32, 1, {16, 64}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
    {"conv2d dw lanes 3x3 stride 2 pad 1", 2, 2, 8, 32, 1, {9, 20}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
    {"conv2d dw lanes 1x2 stride 2, groups 2", 2, 2, 8, 32, 2, {6, 7}, {1, 2}, {2, 2}, {0, 0}, {1, 1}, false},
    {"conv2d dw lanes 5x3 stride 3x2 pad 2x1", 2, 3, 4, 16, 1, {11, 9}, {5, 3}, {3, 2}, {2, 1}, {1, 1}, true},
    {"conv1d dw lanes k4 stride 2 pad 1", 1, 2, 5, 16, 1, {23}, {4}, {2}, {1}, {1}, true},
    /* Output channels of 32 a group off the stride-1 kernels: the forward in the lanes too */
    {"conv2d lanes 5x3 stride 3x2 pad 2x1 groups 2", 2, 2, 6, 64, 2, {11, 27}, {5, 3}, {3, 2}, {2, 1}, {1, 1}, true},
    {"conv2d lanes 3x3 stride 1, 20 wide", 2, 2, 4, 32, 1, {5, 20}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, false},
    {"conv1d lanes k3 stride 2 pad 1", 1, 3, 8, 32, 1, {40}, {3}, {2}, {1}, {1}, true},
    /* Input channels of 32 a group: the input gradient in the lanes too */
    {"conv2d dx lanes 3x3 stride 2 pad 1", 2, 2, 32, 16, 1, {9, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
    {"conv2d dx lanes 5x4 stride 3x2 pad 3x0 groups 2", 2, 2, 64, 32, 2, {10, 13}, {5, 4}, {3, 2}, {3, 0}, {1, 1}, false},
    {"conv2d dx lanes 2x2 stride 2 pad 2 (pad > kernel)", 2, 1, 32, 16, 1, {5, 6}, {2, 2}, {2, 2}, {2, 2}, {1, 1}, false},
    {"conv2d dx lanes 3x3 stride 1, 20 wide", 2, 2, 32, 32, 1, {4, 20}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
    {"conv1d dx lanes k4 stride 3 pad 2", 1, 2, 32, 8, 1, {17}, {4}, {3}, {2}, {1}, true},
    /* Strided, input rows of 16 a phase, input channels of 8: the input gradient by phases */
    {"conv2d dx phases 3x3 stride 2 pad 1, odd height", 2, 2, 8, 16, 1, {7, 32}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
    {"conv2d dx phases 1x1 stride 2 (empty phases)", 2, 2, 16, 32, 1, {6, 32}, {1, 1}, {2, 2}, {0, 0}, {1, 1}, true},
    {"conv2d dx phases 4x3 stride 2x4 pad 3x1", 2, 2, 8, 8, 1, {9, 64}, {4, 3}, {2, 4}, {3, 1}, {1, 1}, false},
    {"conv1d dx phases k5 stride 2 pad 2 groups 2", 1, 2, 16, 8, 2, {64}, {5}, {2}, {2}, {1}, true},
    /* Strided, output rows of 16, output channels of 8: the forward by phases of x */
    {"conv2d fwd phases 3x3 stride 2 pad 1, odd input", 2, 2, 3, 8, 1, {9, 31}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
    {"conv2d fwd phases 1x1 stride 2 (one phase)", 2, 2, 4, 16, 1, {6, 32}, {1, 1}, {2, 2}, {0, 0}, {1, 1}, false},
    {"conv2d fwd phases 4x5 stride 3x2 pad 2x3 groups 2", 2, 2, 6, 16, 2, {10, 30}, {4, 5}, {3, 2}, {2, 3}, {1, 1}, true},
    {"conv1d fwd phases k3 stride 4 (taps short of the stride)", 1, 3, 5, 8, 1, {64}, {3}, {4}, {1}, {1}, true},
};
// clang-format on

static void against_float64_loops(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof specs / sizeof *specs; k++) check_spec(&specs[k]);
}

/* The output and every gradient bit for bit the same at 1 and 3 threads: the kernels split
 * their sums by the shape, never by the thread count (conv_direct.h). */
static void same_bits_at_any_thread_count(void **state) {
    (void)state;
    static const conv_spec cases[] = {
        {"dw slots, fwd and dx stride 1",
         2,
         5,
         4,
         32,
         1,
         {32, 64},
         {3, 3},
         {1, 1},
         {1, 1},
         {1, 1},
         true},
        {"stride 2 by phases", 2, 6, 8, 32, 1, {32, 32}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
        {"stride 2 in the lanes", 2, 3, 32, 32, 1, {9, 11}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
    };
    const int saved_threads = ms_parallel_threads();
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const conv_spec *s = &cases[k];
        ms_shape in[3], out;
        int n_in = shapes_of(s, in);
        ms_op_attrs a = attrs_of(s);
        ms_error err = {0};
        assert_int_equal(ms_op_get(op_of(s))->infer(&a, n_in, in, &out, &err), MS_OK);
        float *x[3], *dy = malloc(sizeof(float) * (size_t)numel(&out)), *y[2], *din[2][3];
        fill(dy, numel(&out), 7);
        for (int i = 0; i < n_in; i++) {
            x[i] = malloc(sizeof(float) * (size_t)numel(&in[i]));
            fill(x[i], numel(&in[i]), (uint64_t)i);
        }
        for (int t = 0; t < 2; t++) {
            ms_parallel_set_threads(t == 0 ? 1 : 3);
            y[t] = malloc(sizeof(float) * (size_t)numel(&out));
            conv_call cc = {.op = op_of(s), .n_in = n_in, .a = a, .dy = dy, .y = y[t]};
            for (int i = 0; i < n_in; i++) {
                din[t][i] = malloc(sizeof(float) * (size_t)numel(&in[i]));
                cc.gin[i] = cc.lin[i] = in[i], cc.x[i] = x[i], cc.din[i] = din[t][i];
            }
            conv_run(&cc);
        }
        if (memcmp(y[0], y[1], sizeof(float) * (size_t)numel(&out)) != 0)
            fail_msg("%s: the forward differs between 1 and 3 threads", s->name);
        for (int i = 0; i < n_in; i++)
            if (memcmp(din[0][i], din[1][i], sizeof(float) * (size_t)numel(&in[i])) != 0)
                fail_msg("%s: the gradient of input %d differs between 1 and 3 threads", s->name,
                         i);
        for (int t = 0; t < 2; t++) {
            free(y[t]);
            for (int i = 0; i < n_in; i++) free(din[t][i]);
        }
        for (int i = 0; i < n_in; i++) free(x[i]);
        free(dy);
    }
    ms_parallel_set_threads(saved_threads);
}

/* --- a rank's output channels, its groups read from all of x ----------------------------- */

/* The output channels [o0, o0 + ol) of spec s on one rank with every input channel: its output,
 * weight and bias gradients are the reference's slices, its dx adds up to the reference's. */
static void run_shard(const conv_spec *s, float *const *x, const float *dy, int64_t o0, int64_t ol,
                      const conv_ref *r, float *dx_sum) {
    ms_shape in[3], out;
    int n_in = shapes_of(s, in);
    ms_op_attrs a = attrs_of(s);
    ms_error err = {0};
    assert_int_equal(ms_op_get(op_of(s))->infer(&a, n_in, in, &out, &err), MS_OK);
    int64_t per_w = numel(&in[1]) / s->cout, per_y = numel(&out) / (s->n * s->cout);
    conv_call cc = {.op = op_of(s), .n_in = n_in, .a = a};
    for (int i = 0; i < n_in; i++) cc.gin[i] = cc.lin[i] = in[i];
    cc.lin[1].d[0] = cc.lin[2].d[0] = ol;
    cc.start[1][0] = cc.start[2][0] = o0;
    float *dyl = malloc(sizeof(float) * (size_t)(s->n * ol * per_y)),
          *y = malloc(sizeof *y * (size_t)(s->n * ol * per_y));
    for (int64_t i = 0; i < s->n; i++)
        memcpy(dyl + i * ol * per_y, dy + (i * s->cout + o0) * per_y,
               sizeof(float) * (size_t)(ol * per_y));
    float *dx = calloc((size_t)numel(&in[0]), sizeof(float)),
          *dw = malloc(sizeof(float) * (size_t)(ol * per_w));
    float *db = malloc(sizeof(float) * (size_t)ol);
    cc.x[0] = x[0], cc.x[1] = x[1] + o0 * per_w, cc.x[2] = x[2] + o0;
    cc.dy = dyl, cc.y = y, cc.din[0] = dx, cc.din[1] = dw, cc.din[2] = db;
    conv_run(&cc);
    double e = 0;
    for (int64_t i = 0; i < s->n; i++)
        e = fmax(e, worst(y + i * ol * per_y, r->y + (i * s->cout + o0) * per_y, ol * per_y));
    e = fmax(e, worst(dw, r->dw + o0 * per_w, ol * per_w));
    e = fmax(e, worst(db, r->db + o0, ol));
    if (!(e <= 1e-5))
        fail_msg("%s: output channels [%lld, +%lld) off the float64 loop by %.3g", s->name,
                 (long long)o0, (long long)ol, e);
    for (int64_t k = 0; k < numel(&in[0]); k++) dx_sum[k] += dx[k];
    free(dyl), free(y), free(dx), free(dw), free(db);
}

static void output_channel_shards(void **state) {
    (void)state;
    const conv_spec s = {
        "conv2d groups 4", 2, 2, 8, 8, 4, {4, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true};
    ms_shape in[3], out;
    int n_in = shapes_of(&s, in);
    ms_op_attrs a = attrs_of(&s);
    ms_error err = {0};
    assert_int_equal(ms_op_get(MS_OP_CONV2D)->infer(&a, n_in, in, &out, &err), MS_OK);
    float *x[3], *dy = malloc(sizeof(float) * (size_t)numel(&out));
    for (int i = 0; i < n_in; i++) {
        x[i] = malloc(sizeof(float) * (size_t)numel(&in[i]));
        fill(x[i], numel(&in[i]), 20 + (uint64_t)i);
    }
    fill(dy, numel(&out), 27);
    conv_ref r = reference(&s, x[0], x[1], x[2], dy);
    /* a whole group, two parts of one, two whole groups: every output channel once */
    static const int64_t parts[4][2] = {{0, 2}, {2, 1}, {3, 1}, {4, 4}};
    float *dx = calloc((size_t)numel(&in[0]), sizeof(float));
    for (int p = 0; p < 4; p++) run_shard(&s, x, dy, parts[p][0], parts[p][1], &r, dx);
    double e = worst(dx, r.dx, numel(&in[0]));
    if (!(e <= 1e-5)) fail_msg("the shards' dx add up to the float64 loop's within %.3g", e);
    /* channels [1, 3) cut two groups: refused, naming the op and the fix */
    float *xs[3] = {x[0], x[1] + 1 * 18, x[2] + 1};
    ms_tensor t[3], o = {0};
    ms_shape lin[3] = {in[0], in[1], in[2]}, lout = out;
    lin[1].d[0] = lin[2].d[0] = lout.d[1] = 2;
    ms_op_call c = host_call(&a, 3, in, &out);
    for (int i = 0; i < 3; i++) t[i] = host_tensor(&lin[i], xs[i]), c.in[i] = &t[i];
    o = host_tensor(&lout, NULL);
    c.out[0] = &o, c.in_start[1][0] = c.in_start[2][0] = 1;
    ms_status st = ms_op_get(MS_OP_CONV2D)->forward(&c, &err);
    if (st != MS_ERR_INVALID || !strstr(err.msg, "conv2d") ||
        !strstr(err.msg, "divides the groups"))
        fail_msg("channels [1, 3) of 4 groups of 2: %s", err.msg);
    for (int i = 0; i < 3; i++) ms_tensor_release(&t[i]);
    ms_tensor_release(&o);
    ref_free(&r);
    for (int i = 0; i < n_in; i++) free(x[i]);
    free(dy), free(dx);
}

/* --- conv2d with a bias on a mesh of 2: every placement, forward and gradients -------------- */

typedef struct mesh2_arg {
    const conv_spec *s;
    long combos, grads; /* placement combinations run, input gradients compared */
} mesh2_arg;

static ms_placements one_dim(ms_placement p) {
    ms_placements pl = {.n = 1, .p = {p}};
    ms_placements_default_order(&pl);
    return pl;
}

/* Whether the gathered t equals want within 1e-5 (collective). */
static bool gathered_close(mt_rank *r, const ms_dtensor *t, const double *want, int64_t n) {
    ms_error err = {0};
    ms_tensor full = {0};
    bool ok = MT_OK(r, ms_dtensor_full(t, &full, &err), &err);
    ok = ok && ms_tensor_numel(&full) == n && worst(ms_tensor_f32(&full), want, n) <= 1e-5;
    ms_tensor_release(&full);
    return ok;
}

/* loss = sum(out * wts) on the tape, then every watched input's gradient against the
 * reference's (dy = wts). */
static void mesh2_grads(mt_rank *r, ms_dmesh *dm, ms_tape *t, const ms_dtensor *out,
                        const ms_tensor *wts, const ms_dtensor *din, const bool *watched, int n_in,
                        const conv_ref *ref, mesh2_arg *ma, const char *desc) {
    ms_error err = {0};
    ms_placements rr = ms_placements_replicated(1);
    ms_dtensor w, prod, loss;
    MT_OK(r, ms_dtensor_shard(dm, wts, &rr, &w, &err), &err);
    const ms_dtensor *pw[2] = {out, &w}, *pp[1] = {&prod};
    ms_op_attrs all = {.i = {-1}};
    MT_OK(r, ms_tape_op(t, MS_OP_MUL_BCAST, NULL, 2, pw, 1, &prod, NULL, &err), &err);
    MT_OK(r, ms_tape_op(t, MS_OP_SUM, &all, 1, pp, 1, &loss, NULL, &err), &err);
    if (MT_OK(r, ms_tape_backward(t, &loss, &err), &err)) {
        const double *want[3] = {ref->dx, ref->dw, ref->db};
        for (int i = 0; i < n_in; i++) {
            const ms_dtensor *g = watched[i] ? ms_tape_grad(t, &din[i]) : NULL;
            if (!g) continue;
            int64_t n = 1;
            for (int d = 0; d < din[i].ndim; d++) n *= din[i].gshape[d];
            MT_CHECK(r, gathered_close(r, g, want[i], n), "%s with %s: gradient of input %d",
                     ma->s->name, desc, i);
            if (r->ctx->rank == 0) ma->grads++; /* rank 0 alone writes the shared counts */
        }
    }
    ms_dtensor_release(&w), ms_dtensor_release(&prod), ms_dtensor_release(&loss);
}

/* The op under placements pl: reshards allowed (then the gradients too), or strict with
 * the candidate's declared output placement `want`. */
static void mesh2_one(mt_rank *r, ms_dmesh *dm, const ms_tensor *g, const ms_tensor *wts,
                      const ms_placements *pl, const ms_placement *want, const conv_ref *ref,
                      mesh2_arg *ma) {
    const conv_spec *s = ma->s;
    ms_op_attrs a = attrs_of(s);
    ms_shape in[3];
    int n_in = shapes_of(s, in);
    ms_error err = {0};
    ms_tape *t = ms_tape_create();
    ms_dtensor din[3], out;
    const ms_dtensor *pin[3];
    bool watched[3];
    char desc[128] = "";
    for (int i = 0; i < n_in; i++) {
        MT_OK(r, ms_dtensor_shard(dm, &g[i], &pl[i], &din[i], &err), &err);
        pin[i] = &din[i];
        watched[i] = pl[i].p[0].kind != MS_PL_PARTIAL;
        if (watched[i]) MT_OK(r, ms_tape_watch(t, &din[i], &err), &err);
        char one[32];
        strcat(desc, ms_placements_str(&pl[i], one, sizeof one));
    }
    ms_eager_opts eo = {.allow_reshard = want == NULL};
    if (MT_OK(r, ms_tape_op(t, op_of(s), &a, n_in, pin, 1, &out, &eo, &err), &err)) {
        int64_t ny = 1;
        for (int d = 0; d < out.ndim; d++) ny *= out.gshape[d];
        MT_CHECK(r, gathered_close(r, &out, ref->y, ny), "%s with %s: forward", s->name, desc);
        if (want)
            MT_CHECK(r, ms_placement_same_kind(out.pl.p[0], *want),
                     "%s: candidate %s gives another output placement", s->name, desc);
        else if (ms_tape_size(t) > 0) /* some input is watched */
            mesh2_grads(r, dm, t, &out, wts, din, watched, n_in, ref, ma, desc);
        ms_dtensor_release(&out);
    }
    if (r->ctx->rank == 0) ma->combos++;
    for (int i = 0; i < n_in; i++) ms_dtensor_release(&din[i]);
    ms_tape_destroy(t);
}

static void mesh2_sweep(mt_rank *r, void *arg) {
    mesh2_arg *ma = arg;
    const conv_spec *s = ma->s;
    ms_error err = {0};
    ms_mesh mesh;
    ms_mesh_parse(&mesh, "2", &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_shape in[3], out;
    int n_in = shapes_of(s, in);
    ms_op_attrs a = attrs_of(s);
    MT_OK(r, ms_op_get(op_of(s))->infer(&a, n_in, in, &out, &err), &err);
    ms_tensor g[3], wts = host_tensor(&out, NULL);
    for (int i = 0; i < n_in; i++) {
        g[i] = host_tensor(&in[i], NULL);
        fill(ms_tensor_f32(&g[i]), numel(&in[i]), 40 + (uint64_t)i);
    }
    fill(ms_tensor_f32(&wts), numel(&out), 47);
    conv_ref ref = reference(s, ms_tensor_f32(&g[0]), ms_tensor_f32(&g[1]),
                             n_in == 3 ? ms_tensor_f32(&g[2]) : NULL, ms_tensor_f32(&wts));
    int combos = 1;
    for (int i = 0; i < n_in; i++) combos *= in[i].ndim + 2;
    for (int c = 0; c < combos && r->failures < 3; c++) {
        ms_placements pl[3];
        for (int i = 0, rem = c; i < n_in; rem /= in[i].ndim + 2, i++) {
            int o = rem % (in[i].ndim + 2);
            pl[i] = one_dim(o == 0 ? ms_R() : o <= in[i].ndim ? ms_S(o - 1) : ms_Psum());
        }
        mesh2_one(r, dm, g, &wts, pl, NULL, &ref, ma);
    }
    ms_rule_cand cands[MS_OP_MAX_CANDS];
    int nc = ms_op_get(op_of(s))->rule(&a, n_in, in, 2, cands);
    for (int k = 0; k < nc; k++) {
        ms_placements pl[3];
        for (int i = 0; i < n_in; i++) pl[i] = one_dim(cands[k].in[i]);
        mesh2_one(r, dm, g, &wts, pl, &cands[k].out[0], &ref, ma);
    }
    ref_free(&ref);
    for (int i = 0; i < n_in; i++) ms_tensor_release(&g[i]);
    ms_tensor_release(&wts);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void conv2d_bias_on_mesh2(void **state) {
    (void)state;
    // clang-format off
    static const conv_spec cases[] = {
        {"conv2d bias, groups 2", 2, 3, 4, 6, 2, {4, 3}, {2, 2}, {1, 1}, {1, 0}, {1, 1}, true},
        {"conv2d bias, uneven channels", 2, 2, 3, 5, 1, {4, 4}, {3, 3}, {2, 1}, {1, 1}, {1, 1}, true},
    };
    // clang-format on
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mesh2_arg ma = {.s = &cases[k]};
        mt_run(2, mesh2_sweep, &ma);
        print_message("  %s: %ld runs on a mesh of 2, %ld gradients, as one rank\n", cases[k].name,
                      ma.combos, ma.grads);
    }
}

/* --- infer's errors, the cost, the column buffer --------------------------------------------- */

static void expect_rejected(int op, ms_op_attrs a, int n_in, const ms_shape *in, const char *want1,
                            const char *want2, const char *want3) {
    ms_shape out[MS_OP_MAX_OUT];
    ms_error err = {0};
    const ms_op_def *def = ms_op_get(op);
    if (def->infer(&a, n_in, in, out, &err) != MS_ERR_INVALID)
        fail_msg("%s accepted bad input (%s)", def->name, want2);
    if (!strstr(err.msg, def->name) || !strstr(err.msg, want1) || !strstr(err.msg, want2) ||
        !strstr(err.msg, want3))
        fail_msg("%s: error '%s' does not name '%s', '%s' and '%s'", def->name, err.msg, want1,
                 want2, want3);
}

static void infer_rejects_bad_attributes(void **state) {
    (void)state;
    ms_shape in2[3] = {{4, {2, 4, 5, 5}}, {4, {6, 2, 3, 3}}, {1, {6}}};
    ms_op_attrs ok2 = {.i = {1, 1, 0, 0, 1, 1, 2}}, a = ok2;
    a.i[1] = 0;
    expect_rejected(MS_OP_CONV2D, a, 3, in2, "stride along W (i[1]) is 0", "[2, 4, 5, 5]",
                    "at least 1");
    a = ok2, a.i[4] = 0;
    expect_rejected(MS_OP_CONV2D, a, 3, in2, "dilation along H (i[4])", "[6, 2, 3, 3]",
                    "at least 1");
    a = ok2, a.i[3] = -1;
    expect_rejected(MS_OP_CONV2D, a, 3, in2, "padding along W (i[3]) is -1", "[6]", "at least 0");
    a = ok2, a.i[6] = 0;
    expect_rejected(MS_OP_CONV2D, a, 3, in2, "groups (i[6]) is 0", "[2, 4, 5, 5]", "at least 1");
    a = ok2, a.i[6] = 3;
    expect_rejected(MS_OP_CONV2D, a, 3, in2, "groups = 3", "C_in = 4 and C_out = 6",
                    "pick groups dividing both");
    ms_shape dim1[2] = {{4, {2, 4, 5, 5}}, {4, {6, 4, 3, 3}}};
    expect_rejected(MS_OP_CONV2D, ok2, 2, dim1, "C_in / groups = 4 / 2 = 2", "[6, 4, 3, 3]", "");
    ms_shape big[2] = {{4, {1, 2, 3, 3}}, {4, {2, 1, 5, 3}}};
    a = (ms_op_attrs){.i = {1, 1, 0, 0, 1, 1, 2}};
    expect_rejected(MS_OP_CONV2D, a, 2, big, "along H the kernel spans 5", "padded input's 3",
                    "more padding");
    ms_shape dil[2] = {{3, {1, 2, 6}}, {3, {2, 2, 3}}};
    expect_rejected(MS_OP_CONV1D, (ms_op_attrs){.i = {1, 0, 3, 1}}, 2, dil,
                    "along L the kernel spans 7 (3 taps, dilation 3)", "[1, 2, 6] and [2, 2, 3]",
                    "smaller kernel or dilation");
    ms_shape rank[2] = {{4, {1, 2, 6, 6}}, {3, {2, 2, 3}}};
    expect_rejected(MS_OP_CONV1D, (ms_op_attrs){.i = {1, 0, 1, 1}}, 2, rank, "[N, C_in, L]",
                    "[C_out, C_in / groups, K]", "[1, 2, 6, 6]");
    ms_shape bias[3] = {{3, {1, 2, 6}}, {3, {4, 2, 3}}, {1, {3}}};
    expect_rejected(MS_OP_CONV1D, (ms_op_attrs){.i = {1, 0, 1, 1}}, 3, bias, "bias [C_out]",
                    "[4, 2, 3] and [3]", "");
    ms_shape out[1];
    ms_error err = {0};
    assert_int_equal(ms_op_get(MS_OP_CONV2D)->infer(&ok2, 3, in2, out, &err), MS_OK);
    assert_int_equal(out[0].ndim, 4);
    assert_int_equal(out[0].d[1], 6);
    assert_int_equal(out[0].d[2], 3); /* (5 - 3) / 1 + 1 */
}

/* The work of a conv2d as written out by hand, and the column buffer of each table. */
static void cost_and_scratch(void **state) {
    (void)state;
    ms_k_conv g = {.n = 2,
                   .c_x = 4,
                   .groups = 2,
                   .cin_g = 2,
                   .cout_g = 3,
                   .h = 5,
                   .w = 6,
                   .kh = 3,
                   .kw = 2,
                   .sh = 1,
                   .sw = 2,
                   .ph = 1,
                   .pw = 0,
                   .dh = 1,
                   .dw = 1};
    g.oh = ms_k_conv_out_size(g.h, g.kh, g.sh, g.ph, g.dh); /* (5 + 2 - 2 - 1) / 1 + 1 = 5 */
    g.ow = ms_k_conv_out_size(g.w, g.kw, g.sw, g.pw, g.dw); /* (6 - 1 - 1) / 2 + 1 = 3 */
    assert_int_equal(g.oh, 5);
    assert_int_equal(g.ow, 3);
    const double ny = 2.0 * 6 * 5 * 3, k = 2.0 * 3 * 2, nx = 2.0 * 4 * 5 * 6, nw = 6 * k;
    ms_k_cost f = ms_k_conv_cost(&g, true, false), b = ms_k_conv_cost(&g, true, true);
    assert_true(f.flops == 2 * ny * k + ny);
    assert_true(f.bytes == 4 * (nx + nw + 6 + ny));
    assert_true(b.flops == 4 * ny * k + ny);
    assert_true(b.bytes == 4 * (2 * (ny + nw + nx) + ny + 6));
    const ms_kernels *cpu = ms_kernels_for(MS_DEVICE_CPU);
    assert_int_equal(cpu->conv_scratch_floats(&g), 2 * 3 * 2 * 5 * 3); /* one group's columns */
    ms_k_conv pw = g;
    pw.kh = pw.kw = pw.sw = 1, pw.ph = 0, pw.oh = 5, pw.ow = 6;
    assert_int_equal(cpu->conv_scratch_floats(&pw), 0); /* x is its own columns */
    /* The op's cost is the kernel's for the call's shapes. */
    ms_shape in[2] = {{4, {2, 4, 5, 6}}, {4, {6, 2, 3, 2}}}, out;
    ms_op_attrs a = {.i = {1, 2, 1, 0, 1, 1, 2}};
    ms_error err = {0};
    assert_int_equal(ms_op_get(MS_OP_CONV2D)->infer(&a, 2, in, &out, &err), MS_OK);
    ms_tensor x = host_tensor(&in[0], NULL), w = host_tensor(&in[1], NULL);
    ms_op_call c = host_call(&a, 2, in, &out);
    c.in[0] = &x, c.in[1] = &w;
    ms_k_cost oc = ms_op_get(MS_OP_CONV2D)->cost(&c, true), kc = ms_k_conv_cost(&g, false, true);
    assert_true(oc.flops == kc.flops && oc.bytes == kc.bytes);
    ms_tensor_release(&x), ms_tensor_release(&w);
    /* Every table runs both ops. */
    const ms_device_kind kinds[2] = {MS_DEVICE_CPU, MS_DEVICE_FENCED};
    for (int i = 0; i < 2; i++) {
        assert_true(ms_op_get(MS_OP_CONV1D)->runs_on(ms_kernels_for(kinds[i])));
        assert_true(ms_op_get(MS_OP_CONV2D)->runs_on(ms_kernels_for(kinds[i])));
    }
    const ms_kernels *cuda = ms_kernels_for(MS_DEVICE_CUDA);
    if (cuda) assert_true(ms_op_get(MS_OP_CONV2D)->runs_on(cuda));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(against_float64_loops), cmocka_unit_test(output_channel_shards),
    cmocka_unit_test(conv2d_bias_on_mesh2),  cmocka_unit_test(infer_rejects_bad_attributes),
    cmocka_unit_test(cost_and_scratch),      cmocka_unit_test(same_bits_at_any_thread_count),
};
MT_MAIN("ops conv", tests)

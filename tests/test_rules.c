/* test_rules.c - every operator's SPMD rule by brute force.
 *
 * For each operator and every combination of input placements (R, S(d) for every dim,
 * P(sum)) on the meshes [2] and [2, 2], the op runs in eager mode (rule, reshards, local
 * kernel) and its output, gathered to a full tensor, must equal the op applied to the
 * global inputs on one rank. Then every candidate of every rule runs without resharding
 * (strict mode) and must produce exactly its declared output placement, and inputs that
 * fit no rule get an error naming the op and what it accepts.
 *
 * On the fenced device (host memory the host may not touch: every access must go through
 * the device's kernel table and copies) every op case runs again, forward and backward,
 * under every input placement on [2] and [2, 2], and its outputs and input gradients must
 * equal the CPU device's bit for bit: the fenced table runs the CPU kernels in the same
 * order, so any difference is a wrong table entry or a host access that the fence let by.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/graph/tape.h"
#include "tests/op_cases.h"
#include "tests/testkit.h"

/* The op on the global inputs, on this rank alone: the reference. */
static void reference(mt_rank *r, const op_case *c, ms_tensor *gin, ms_tensor *gout) {
    ms_error err;
    const ms_op_def *def = ms_op_get(c->op);
    ms_shape outs[MS_OP_MAX_OUT];
    def->infer(&c->a, c->n_in, c->in, outs, &err);
    ms_placements none[MS_OP_MAX_IN];
    memset(none, 0, sizeof none);
    ms_op_call call = {.kc = ms_kctx_host(),
                       .attrs = &c->a,
                       .n_in = c->n_in,
                       .n_out = c->n_out,
                       .gin = c->in,
                       .gout = outs,
                       .in_pl = none,
                       .out_pl = none};
    ms_tensor saved[MS_OP_MAX_SAVED] = {0};
    for (int i = 0; i < c->n_in; i++) call.in[i] = &gin[i];
    for (int o = 0; o < c->n_out; o++) {
        ms_tensor_alloc(r->ctx->device, MS_F32, outs[o].ndim, outs[o].d, &gout[o], &err);
        call.out[o] = &gout[o];
    }
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    if (def->saved_floats) def->saved_floats(&c->a, &call, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++)
        if (sizes[k]) {
            ms_tensor_alloc(r->ctx->device, MS_F32, 1, &sizes[k], &saved[k], &err);
            call.saved[k] = &saved[k];
        }
    MT_OK(r, def->forward(&call, &err), &err);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&saved[k]);
}

/* Placements of one tensor of rank nd on a mesh of md dims: R, S(d), P(sum) per dim. */
static int tensor_options(int md, int nd, ms_placements *out) {
    int per = nd + 2, total = 1, n = 0;
    for (int m = 0; m < md; m++) total *= per;
    for (int c = 0; c < total; c++) {
        ms_placements pl = {.n = md};
        int rem = c;
        for (int m = 0; m < md; m++) {
            int o = rem % per;
            rem /= per;
            pl.p[m] = o == 0    ? ms_pl_replicate()
                      : o <= nd ? ms_pl_shard(o - 1)
                                : ms_pl_partial(MS_REDUCE_SUM);
        }
        ms_placements_default_order(&pl);
        out[n++] = pl;
    }
    return n;
}

static bool close_enough(const ms_tensor *a, const ms_tensor *b) {
    if (ms_tensor_numel(a) != ms_tensor_numel(b)) return false;
    for (int64_t k = 0; k < ms_tensor_numel(a); k++) {
        double x = ms_tensor_f32(a)[k], y = ms_tensor_f32(b)[k];
        if (!(fabs(x - y) <= 1e-4 * (1 + fabs(y)))) return false;
    }
    return true;
}

typedef struct rule_arg {
    const char *mesh;
} rule_arg;

static void brute_force(mt_rank *r, void *arg) {
    const rule_arg *ra = arg;
    ms_error err = {0};
    ms_mesh mesh;
    ms_mesh_parse(&mesh, ra->mesh, &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_placements *opts[3];
    for (int i = 0; i < 3; i++) opts[i] = xmalloc(sizeof(ms_placements) * 64);
    long checked = 0;
    for (size_t ci = 0; ci < (size_t)ms_n_op_cases && r->failures < 3; ci++) {
        const op_case *c = &ms_op_cases[ci];
        ms_tensor gin[3], gout[MS_OP_MAX_OUT];
        for (int i = 0; i < c->n_in; i++) {
            ms_tensor_alloc(r->ctx->device, MS_F32, c->in[i].ndim, c->in[i].d, &gin[i], &err);
            mt_op_case_fill(c, i, &gin[i]);
        }
        reference(r, c, gin, gout);
        int nopt[3] = {1, 1, 1}, total = 1;
        for (int i = 0; i < c->n_in; i++) {
            nopt[i] = tensor_options(mesh.ndim, c->in[i].ndim, opts[i]);
            total *= nopt[i];
        }
        for (int combo = 0; combo < total && r->failures < 3; combo++) {
            if (!mt_sweep_take(combo, total, (long)ci)) continue;
            ms_dtensor din[3];
            const ms_dtensor *pin[3];
            char desc[256] = "";
            int rem = combo;
            for (int i = 0; i < c->n_in; i++) {
                const ms_placements *pl = &opts[i][rem % nopt[i]];
                rem /= nopt[i];
                MT_OK(r, ms_dtensor_shard(dm, &gin[i], pl, &din[i], &err), &err);
                pin[i] = &din[i];
                char one[64];
                strncat(desc, ms_placements_str(pl, one, sizeof one),
                        sizeof desc - strlen(desc) - 2);
                strcat(desc, " ");
            }
            ms_dtensor dout[MS_OP_MAX_OUT];
            ms_eager_opts eo = {.allow_reshard = true};
            ms_status st = ms_eager(c->op, &c->a, c->n_in, pin, c->n_out, dout, &eo, &err);
            MT_CHECK(r, st == MS_OK, "%s on mesh %s with %s: %s", c->name, ra->mesh, desc, err.msg);
            for (int o = 0; o < c->n_out && st == MS_OK; o++) {
                ms_tensor full;
                if (MT_OK(r, ms_dtensor_full(&dout[o], &full, &err), &err) &&
                    ms_dmesh_is_member(dm)) {
                    char pl[64];
                    MT_CHECK(r, close_enough(&full, &gout[o]),
                             "%s on mesh %s with inputs %s-> output "
                             "%s differs from the one-rank result",
                             c->name, ra->mesh, desc,
                             ms_placements_str(&dout[o].pl, pl, sizeof pl));
                }
                ms_tensor_release(&full);
                ms_dtensor_release(&dout[o]);
            }
            for (int i = 0; i < c->n_in; i++) ms_dtensor_release(&din[i]);
            checked++;
        }
        for (int i = 0; i < c->n_in; i++) ms_tensor_release(&gin[i]);
        for (int o = 0; o < c->n_out; o++) ms_tensor_release(&gout[o]);
    }
    if (r->ctx->rank == 0)
        print_message("  mesh %s: %ld placement combinations over %zu op cases\n", ra->mesh,
                      checked, (size_t)ms_n_op_cases);
    for (int i = 0; i < 3; i++) free(opts[i]);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void rules_mesh2(void **s) {
    (void)s;
    rule_arg a = {"2"};
    mt_run(2, brute_force, &a);
}

static void rules_mesh2x2(void **s) {
    (void)s;
    rule_arg a = {"2x2"};
    mt_run(4, brute_force, &a);
}

/* --- forward and backward on a device against the CPU device, bit for bit ---------------- */

/* FNV-1a over the bytes of a host tensor, chained. */
static uint64_t fnv(uint64_t h, const ms_tensor *t) {
    const unsigned char *p = (const unsigned char *)ms_tensor_f32(t);
    for (size_t k = 0; k < sizeof(float) * (size_t)ms_tensor_numel(t); k++)
        h = (h ^ p[k]) * 1099511628211ull;
    return h;
}

typedef struct device_arg {
    const char *mesh;
    uint64_t *hash; /* [combo]: the CPU run's (record) or checked against (compare) */
    long n, cap;    /* combos seen */
    bool record;    /* the CPU run: record; the device run: compare */
    long backwards; /* combos whose backward ran */
    bool seen_bw[MS_OP_BUILTIN_COUNT]; /* ops whose backward ran at least once */
} device_arg;

/* The gathered value of t folded into *h (collective). */
static void fold(mt_rank *r, const ms_dtensor *t, uint64_t *h) {
    ms_error err = {0};
    ms_tensor full = {0};
    if (MT_OK(r, ms_dtensor_full(t, &full, &err), &err) && full.storage) *h = fnv(*h, &full);
    ms_tensor_release(&full);
}

/* A replicated DistTensor of the global shape s, from host values (stream picks them). */
static void host_leaf(mt_rank *r, ms_dmesh *dm, const ms_shape *s, uint64_t stream,
                      ms_dtensor *out) {
    ms_error err = {0};
    ms_tensor g;
    MT_OK(r, ms_tensor_alloc(ms_device_host(), MS_F32, s->ndim, s->d, &g, &err), &err);
    for (int64_t k = 0; k < ms_tensor_numel(&g); k++)
        ms_tensor_f32(&g)[k] = 2 * (float)ms_philox_uniform(23, stream, (uint64_t)k) - 1;
    ms_placements rr = ms_placements_replicated(dm->mesh.ndim);
    MT_OK(r, ms_dtensor_shard(dm, &g, &rr, out, &err), &err);
    ms_tensor_release(&g);
}

/* loss = sum over the float outputs of sum(out * w), w fixed random weights: every output
 * element gets its own gradient. Returns false when no output takes a gradient. */
static bool weighted_loss(mt_rank *r, ms_tape *t, ms_dmesh *dm, const op_case *c, ms_dtensor *out,
                          ms_dtensor *loss) {
    const ms_op_def *def = ms_op_get(c->op);
    ms_error err = {0};
    bool any = false;
    for (int o = 0; o < c->n_out; o++) {
        if (def->int_outputs >> o & 1) continue;
        ms_shape s = {.ndim = out[o].ndim};
        memcpy(s.d, out[o].gshape, sizeof s.d);
        ms_dtensor w, prod, part, sum;
        host_leaf(r, dm, &s, 50 + (uint64_t)o, &w);
        const ms_dtensor *pw[2] = {&out[o], &w};
        ms_op_attrs all = {.i = {-1}};
        MT_OK(r, ms_tape_op(t, MS_OP_MUL_BCAST, NULL, 2, pw, 1, &prod, NULL, &err), &err);
        const ms_dtensor *pp[1] = {&prod};
        MT_OK(r, ms_tape_op(t, MS_OP_SUM, &all, 1, pp, 1, &part, NULL, &err), &err);
        if (any) {
            const ms_dtensor *pl[2] = {loss, &part};
            MT_OK(r, ms_tape_op(t, MS_OP_ADD, NULL, 2, pl, 1, &sum, NULL, &err), &err);
            ms_dtensor_release(loss), ms_dtensor_release(&part);
            *loss = sum;
        } else {
            *loss = part;
        }
        any = true;
        ms_dtensor_release(&w), ms_dtensor_release(&prod);
    }
    return any;
}

/* One placement combination: the op's outputs and, for every input that can be watched (a
 * leaf taking a gradient, without partial placements), its gradient, hashed. */
static uint64_t fwd_bwd(mt_rank *r, ms_dmesh *dm, const op_case *c, const ms_dtensor *din,
                        bool *backward) {
    const ms_op_def *def = ms_op_get(c->op);
    ms_error err = {0};
    ms_tape *t = ms_tape_create();
    const ms_dtensor *pin[3];
    bool watched[3] = {false};
    for (int i = 0; i < c->n_in; i++) {
        pin[i] = &din[i];
        bool partial = false;
        for (int m = 0; m < din[i].pl.n; m++) partial |= din[i].pl.p[m].kind == MS_PL_PARTIAL;
        watched[i] = (def->grad_inputs >> i & 1) && !partial;
        if (watched[i]) MT_OK(r, ms_tape_watch(t, &din[i], &err), &err);
    }
    ms_dtensor dout[MS_OP_MAX_OUT], loss;
    ms_eager_opts eo = {.allow_reshard = true};
    uint64_t h = 1469598103934665603ull;
    *backward = false;
    if (!MT_OK(r, ms_tape_op(t, c->op, &c->a, c->n_in, pin, c->n_out, dout, &eo, &err), &err)) {
        ms_tape_destroy(t);
        return 0;
    }
    for (int o = 0; o < c->n_out; o++) fold(r, &dout[o], &h);
    if (ms_tape_size(t) > 0 && weighted_loss(r, t, dm, c, dout, &loss)) {
        *backward = MT_OK(r, ms_tape_backward(t, &loss, &err), &err);
        for (int i = 0; i < c->n_in && *backward; i++)
            if (watched[i] && ms_tape_grad(t, &din[i])) fold(r, ms_tape_grad(t, &din[i]), &h);
        ms_dtensor_release(&loss);
    }
    for (int o = 0; o < c->n_out; o++) ms_dtensor_release(&dout[o]);
    ms_tape_destroy(t);
    return h;
}

static void device_sweep(mt_rank *r, void *arg) {
    device_arg *da = arg;
    ms_error err = {0};
    ms_mesh mesh;
    ms_mesh_parse(&mesh, da->mesh, &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_placements *opts[3];
    for (int i = 0; i < 3; i++) opts[i] = xmalloc(sizeof(ms_placements) * 64);
    long n = 0, backwards = 0;
    for (size_t ci = 0; ci < (size_t)ms_n_op_cases && r->failures < 3; ci++) {
        const op_case *c = &ms_op_cases[ci];
        ms_tensor gin[3];
        int nopt[3] = {1, 1, 1}, total = 1;
        for (int i = 0; i < c->n_in; i++) {
            ms_tensor_alloc(ms_device_host(), MS_F32, c->in[i].ndim, c->in[i].d, &gin[i], &err);
            mt_op_case_fill(c, i, &gin[i]);
            nopt[i] = tensor_options(mesh.ndim, c->in[i].ndim, opts[i]);
            total *= nopt[i];
        }
        for (int combo = 0; combo < total && r->failures < 3; combo++) {
            if (!mt_sweep_take(combo, total, (long)ci)) continue;
            ms_dtensor din[3];
            char desc[256] = "";
            for (int i = 0, rem = combo; i < c->n_in; i++, rem /= nopt[i - 1]) {
                const ms_placements *pl = &opts[i][rem % nopt[i]];
                MT_OK(r, ms_dtensor_shard(dm, &gin[i], pl, &din[i], &err), &err);
                char one[64];
                strncat(desc, ms_placements_str(pl, one, sizeof one),
                        sizeof desc - strlen(desc) - 2);
                strcat(desc, " ");
            }
            bool bw;
            uint64_t h = fwd_bwd(r, dm, c, din, &bw);
            backwards += bw;
            if (bw && r->ctx->rank == 0) da->seen_bw[c->op] = true;
            if (r->ctx->rank == 0 && da->record) {
                if (n == da->cap) {
                    da->cap = da->cap ? 2 * da->cap : 4096;
                    da->hash = xrealloc(da->hash, sizeof *da->hash * (size_t)da->cap);
                }
                da->hash[n] = h;
            } else if (r->ctx->rank == 0) {
                MT_CHECK(r, n < da->n && da->hash[n] == h,
                         "%s on mesh %s with inputs %s: forward or backward on the device "
                         "differs from the CPU's",
                         c->name, da->mesh, desc);
            }
            for (int i = 0; i < c->n_in; i++) ms_dtensor_release(&din[i]);
            n++;
        }
        for (int i = 0; i < c->n_in; i++) ms_tensor_release(&gin[i]);
    }
    if (r->ctx->rank == 0) {
        if (da->record) da->n = n;
        MT_CHECK(r, da->record || n == da->n, "the device run saw %ld combinations, the CPU %ld", n,
                 da->n);
        da->backwards = backwards;
        /* (a sanitizer's sample of the sweep need not reach every backward: all cases do) */
        for (int op = 0; op < MS_OP_BUILTIN_COUNT && !da->record && mt_sweep_full(); op++)
            MT_CHECK(r, da->seen_bw[op] || !ms_op_get(op)->grad_inputs,
                     "%s: no case ran its backward on mesh %s", ms_op_get(op)->name, da->mesh);
        if (!da->record)
            print_message("  mesh %s on the fenced device: %ld placement combinations, %ld with "
                          "a backward, equal to the CPU's bit for bit\n",
                          da->mesh, n, backwards);
    }
    for (int i = 0; i < 3; i++) free(opts[i]);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void device_equals_cpu(const char *mesh, int ranks) {
    device_arg a = {.mesh = mesh, .record = true};
    mt_run_device(ranks, MS_DEVICE_CPU, device_sweep, &a);
    a.record = false;
    mt_run_device(ranks, MS_DEVICE_FENCED, device_sweep, &a);
    free(a.hash);
}

static void fenced_mesh2(void **s) {
    (void)s;
    device_equals_cpu("2", 2);
}

static void fenced_mesh2x2(void **s) {
    (void)s;
    device_equals_cpu("2x2", 4);
}

/* Every candidate of every rule, given exactly its inputs, runs without resharding and
 * yields its declared output; inputs that fit no rule fail with a useful error. */
static void strict(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_mesh mesh;
    ms_mesh_parse(&mesh, "2", &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    for (size_t ci = 0; ci < (size_t)ms_n_op_cases; ci++) {
        const op_case *c = &ms_op_cases[ci];
        const ms_op_def *def = ms_op_get(c->op);
        ms_rule_cand cands[MS_OP_MAX_CANDS];
        memset(cands, 0, sizeof cands);
        int nc = def->rule(&c->a, c->n_in, c->in, 2, cands);
        ms_tensor gin[3];
        for (int i = 0; i < c->n_in; i++) {
            ms_tensor_alloc(r->ctx->device, MS_F32, c->in[i].ndim, c->in[i].d, &gin[i], &err);
            mt_op_case_fill(c, i, &gin[i]);
        }
        for (int k = 0; k < nc; k++) {
            ms_dtensor din[3];
            const ms_dtensor *pin[3];
            for (int i = 0; i < c->n_in; i++) {
                ms_placements pl = {.n = 1, .p = {cands[k].in[i]}};
                ms_dtensor_shard(dm, &gin[i], &pl, &din[i], &err);
                pin[i] = &din[i];
            }
            ms_dtensor dout[MS_OP_MAX_OUT];
            ms_eager_opts eo = {.allow_reshard = false};
            ms_status st = ms_eager(c->op, &c->a, c->n_in, pin, c->n_out, dout, &eo, &err);
            MT_CHECK(r, st == MS_OK, "%s candidate %d refused in strict mode: %s", c->name, k,
                     err.msg);
            for (int o = 0; o < c->n_out && st == MS_OK; o++) {
                MT_CHECK(r,
                         ms_placement_eq(dout[o].pl.p[0], cands[k].out[o]) ||
                             (dout[o].pl.p[0].kind == cands[k].out[o].kind &&
                              dout[o].pl.p[0].dim == cands[k].out[o].dim),
                         "%s candidate %d: output placement differs from the rule", c->name, k);
                ms_dtensor_release(&dout[o]);
            }
            for (int i = 0; i < c->n_in; i++) ms_dtensor_release(&din[i]);
        }
        for (int i = 0; i < c->n_in; i++) ms_tensor_release(&gin[i]);
    }
    /* LayerNorm over a sharded hidden dim has no rule: the error says so and lists options. */
    const int64_t xs[2] = {3, 5}, ws[1] = {5};
    ms_tensor x, w, b;
    ms_tensor_alloc(r->ctx->device, MS_F32, 2, xs, &x, &err);
    ms_tensor_alloc(r->ctx->device, MS_F32, 1, ws, &w, &err);
    ms_tensor_alloc(r->ctx->device, MS_F32, 1, ws, &b, &err);
    ms_placements s1, rr;
    ms_placements_parse("[S(1)]", &s1, &err);
    ms_placements_parse("[R]", &rr, &err);
    ms_dtensor dx, dw, db, dy;
    ms_dtensor_shard(dm, &x, &s1, &dx, &err);
    ms_dtensor_shard(dm, &w, &rr, &dw, &err);
    ms_dtensor_shard(dm, &b, &rr, &db, &err);
    const ms_dtensor *in3[3] = {&dx, &dw, &db};
    ms_eager_opts eo = {.allow_reshard = false};
    ms_op_attrs ln = {.f = {1e-5f}};
    ms_status st = ms_eager(MS_OP_LAYERNORM, &ln, 3, in3, 1, &dy, &eo, &err);
    MT_CHECK(r, st == MS_ERR_INVALID, "layernorm on S(1) accepted in strict mode");
    MT_CHECK(
        r, strstr(err.msg, "layernorm") && strstr(err.msg, "[S(1)]") && strstr(err.msg, "accepts"),
        "unhelpful error: %s", err.msg);
    ms_dtensor_release(&dx), ms_dtensor_release(&dw), ms_dtensor_release(&db);
    ms_tensor_release(&x), ms_tensor_release(&w), ms_tensor_release(&b);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void rules_strict(void **s) {
    (void)s;
    mt_run(2, strict, NULL);
}

static void table_complete(void **s) {
    (void)s;
    ms_error err = {0};
    if (ms_ops_check(&err) != MS_OK) fail_msg("%s", err.msg);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(table_complete), cmocka_unit_test(rules_strict),
    cmocka_unit_test(rules_mesh2),    cmocka_unit_test(rules_mesh2x2),
    cmocka_unit_test(fenced_mesh2),   cmocka_unit_test(fenced_mesh2x2),
};
MT_MAIN("rules", tests)

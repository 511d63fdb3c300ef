/* test_rules.c - every operator's SPMD rule by brute force.
 *
 * For each operator and every combination of input placements (R, S(d) for every dim,
 * P(sum)) on the meshes [2] and [2, 2], the op runs in eager mode (rule, reshards, local
 * kernel) and its output, gathered to a full tensor, must equal the op applied to the
 * global inputs on one rank. Then every candidate of every rule runs without resharding
 * (strict mode) and must produce exactly its declared output placement, and inputs that
 * fit no rule get an error naming the op and what it accepts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/graph/eager.h"
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
    cmocka_unit_test(table_complete),
    cmocka_unit_test(rules_strict),
    cmocka_unit_test(rules_mesh2),
    cmocka_unit_test(rules_mesh2x2),
};
MT_MAIN("rules", tests)

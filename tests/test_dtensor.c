/* test_dtensor.c - DistTensor construction and cross-mesh reshard, against the global
 * tensor: shard_tensor keeps exactly the box, full_tensor returns the global tensor,
 * from_local rejects wrong local sizes on every rank, and a tensor moved between meshes
 * equals the slice of the global tensor on the target. A reshard whose workspace the
 * device refuses fails with MS_ERR_NOMEM and leaves the tensor and the rank usable.
 * Threads and MPI. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "tests/testkit.h"

static ms_status make_global(ms_ctx *ctx, int ndim, const int64_t *g, ms_tensor *out,
                             ms_error *err) {
    MS_CHECK(ms_tensor_alloc(ctx->device, MS_F32, ndim, g, out, err));
    return ms_tensor_init_uniform(out, 5, 77, g, NULL, -1, 1, err);
}

/* Checks that t's local part equals the global tensor's box (values exact). */
static void check_box(mt_rank *r, const ms_dtensor *t, const ms_tensor *global, const char *what) {
    int64_t st[MS_MAX_DIMS], ln[MS_MAX_DIMS];
    if (!ms_dtensor_box(t, st, ln)) return;
    for (int d = 0; d < t->ndim; d++)
        MT_CHECK(r, t->local.shape[d] == ln[d], "%s: local dim %d is %lld, box %lld", what, d,
                 (long long)t->local.shape[d], (long long)ln[d]);
    if (t->ndim != 2) return;
    for (int64_t i = 0; i < ln[0]; i++)
        for (int64_t j = 0; j < ln[1]; j++) {
            int64_t li[2] = {i, j}, gi[2] = {i + st[0], j + st[1]};
            float a = ms_tensor_get(&t->local, li), b = ms_tensor_get(global, gi);
            if (a != b) {
                MT_CHECK(r, false, "%s: rank %d element (%lld,%lld) is %g, global %g", what,
                         r->ctx->rank, (long long)gi[0], (long long)gi[1], a, b);
                return;
            }
        }
}

static ms_mesh mesh_of(mt_rank *r, const char *text) {
    ms_mesh m;
    ms_error err;
    MT_OK(r, ms_mesh_parse(&m, text, &err), &err);
    return m;
}

static void shard_full_roundtrip(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err;
    ms_mesh m = mesh_of(r, "dp=2,tp=2");
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &m, &dm, &err), &err)) return;
    const int64_t g[2] = {5, 3};
    ms_tensor global;
    MT_OK(r, make_global(r->ctx, 2, g, &global, &err), &err);
    const char *pls[] = {"[R, R]",           "[S(0), R]",      "[S(0), S(1)]", "[S(1), S(1)]",
                         "[S(0,1), S(0,0)]", "[P(sum), S(0)]", "[P(max), R]",  "[R, P(avg)]"};
    for (size_t i = 0; i < sizeof pls / sizeof *pls; i++) {
        ms_placements pl;
        ms_placements_parse(pls[i], &pl, &err);
        ms_dtensor t;
        if (!MT_OK(r, ms_dtensor_shard(dm, &global, &pl, &t, &err), &err)) continue;
        if (!ms_placements_has_partial(&pl)) check_box(r, &t, &global, pls[i]);
        ms_tensor full;
        if (MT_OK(r, ms_dtensor_full(&t, &full, &err), &err)) {
            MT_CHECK(r, ms_dmesh_is_member(dm) == (full.storage != NULL),
                     "full: members get the tensor, others an empty one");
            for (int64_t k = 0; k < (full.storage ? 15 : 0); k++)
                MT_CHECK(r, fabsf(ms_tensor_f32(&full)[k] - ms_tensor_f32(&global)[k]) < 1e-6f,
                         "full(shard(%s)) differs at %lld", pls[i], (long long)k);
            ms_tensor_release(&full);
        }
        ms_dtensor_release(&t);
    }
    /* Errors: placements for another mesh rank, or a dim the tensor does not have. */
    ms_placements bad;
    ms_dtensor t;
    ms_placements_parse("[S(0)]", &bad, &err);
    MT_CHECK(r, ms_dtensor_shard(dm, &global, &bad, &t, &err) == MS_ERR_INVALID,
             "1 placement on 2-d mesh accepted");
    ms_placements_parse("[S(2), R]", &bad, &err);
    MT_CHECK(r, ms_dtensor_shard(dm, &global, &bad, &t, &err) == MS_ERR_INVALID,
             "S(2) on 2-d tensor accepted");
    MT_CHECK(r, strstr(err.msg, "S(2)") != NULL, "error does not name S(2): %s", err.msg);
    ms_tensor_release(&global);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&m);
}

static void test_shard_full(void **state) {
    (void)state;
    mt_run(4, shard_full_roundtrip, NULL);
}

/* from_local: valid uneven parts are accepted (with and without a global shape) and wrong
 * sizes are rejected on every rank with an error naming the offending rank. */
static void from_local_checks(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err;
    ms_mesh m = mesh_of(r, "4");
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &m, &dm, &err), &err)) return;
    ms_placements pl;
    ms_placements_parse("[S(0)]", &pl, &err);
    int me = dm->index >= 0 ? dm->coords[0] : -1;
    /* 6 rows over 4 ranks: 2, 2, 1, 1. */
    for (int variant = 0; variant < 4; variant++) {
        int64_t rows = me < 0 ? 0 : (me < 2 ? 2 : 1);
        bool wrong = variant >= 2 && me == 1;
        if (wrong) rows = variant == 2 ? 1 : 3; /* rank 1 holds the wrong count */
        const int64_t shape[2] = {rows, 3};
        ms_tensor local = {0};
        if (me >= 0) ms_tensor_alloc(r->ctx->device, MS_F32, 2, shape, &local, &err);
        const int64_t g[2] = {6, 3};
        ms_dtensor t;
        ms_status st = ms_dtensor_from_local(dm, &local, &pl, 2, variant % 2 ? NULL : g, &t, &err);
        if (me < 0) continue;
        if (variant < 2) {
            MT_OK(r, st, &err);
            MT_CHECK(r, t.gshape[0] == 6 && t.gshape[1] == 3, "inferred shape %lldx%lld",
                     (long long)t.gshape[0], (long long)t.gshape[1]);
            ms_dtensor_release(&t);
        } else {
            MT_CHECK(r, st == MS_ERR_INVALID, "variant %d: wrong local size accepted on rank %d",
                     variant, r->ctx->rank);
            MT_CHECK(r, strstr(err.msg, "rank") && strstr(err.msg, "balanced split"),
                     "error does not explain: %s", err.msg);
            ms_tensor_release(&local);
        }
    }
    ms_dmesh_destroy(dm);
    ms_mesh_free(&m);
}

static void test_from_local(void **state) {
    (void)state;
    mt_run(4, from_local_checks, NULL);
}

/* Cross-mesh: disjoint stages and overlapping meshes, every placement pair from a list. */
static void cross_mesh(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err;
    ms_mesh world = mesh_of(r, "2x3"), a, b, c;
    ms_mesh_slice(&world, 0, 0, &a, &err); /* ranks 0,1,2 */
    ms_mesh_slice(&world, 0, 1, &b, &err); /* ranks 3,4,5 */
    const int cshape[2] = {2, 2};
    const int cids[4] = {5, 1, 0, 4}; /* overlaps both */
    ms_mesh_init(&c, 2, cshape, NULL, cids, &err);
    ms_dmesh *da, *db, *dc, *dw;
    MT_OK(r, ms_dmesh_create(r->ctx, &world, &dw, &err), &err);
    MT_OK(r, ms_dmesh_create(r->ctx, &a, &da, &err), &err);
    MT_OK(r, ms_dmesh_create(r->ctx, &b, &db, &err), &err);
    MT_OK(r, ms_dmesh_create(r->ctx, &c, &dc, &err), &err);
    const int64_t g[2] = {7, 4};
    ms_tensor global;
    MT_OK(r, make_global(r->ctx, 2, g, &global, &err), &err);
    const char *one_d[] = {"[R]", "[S(0)]", "[S(1)]", "[P(sum)]", "[P(max)]"};
    const char *two_d[] = {"[R, R]", "[S(0), S(1)]", "[S(1), S(0)]", "[S(0), S(0)]",
                           "[P(avg), S(1)]"};
    struct {
        ms_dmesh *from, *to;
        const char **pf, **pt;
        int nf, nt;
    } legs[] = {
        {da, db, one_d, one_d, 5, 5}, {db, dc, one_d, two_d, 5, 5}, {dc, dw, two_d, two_d, 5, 5}};
    for (size_t L = 0; L < 3; L++)
        for (int i = 0; i < legs[L].nf; i++)
            for (int j = 0; j < legs[L].nt; j++) {
                ms_placements pf, pt;
                ms_placements_parse(legs[L].pf[i], &pf, &err);
                ms_placements_parse(legs[L].pt[j], &pt, &err);
                ms_dtensor s, t;
                if (!MT_OK(r, ms_dtensor_shard(legs[L].from, &global, &pf, &s, &err), &err))
                    continue;
                ms_reshard_report rep;
                ms_status st = ms_reshard_cross_mesh(&s, legs[L].to, &pt, &t, &rep, &err);
                char what[128];
                snprintf(what, sizeof what, "leg %zu: %s -> %s", L, legs[L].pf[i], legs[L].pt[j]);
                MT_CHECK(r, st == MS_OK, "%s: %s", what, err.msg);
                if (st == MS_OK) {
                    /* Gather on the target mesh and compare with the global tensor. */
                    ms_tensor full;
                    if (MT_OK(r, ms_dtensor_full(&t, &full, &err), &err) &&
                        ms_dmesh_is_member(legs[L].to)) {
                        for (int64_t k = 0; k < 28; k++)
                            if (fabsf(ms_tensor_f32(&full)[k] - ms_tensor_f32(&global)[k]) >
                                1e-6f) {
                                MT_CHECK(r, false, "%s: element %lld differs", what, (long long)k);
                                break;
                            }
                    }
                    ms_tensor_release(&full);
                    if (!ms_placements_has_partial(&pt)) check_box(r, &t, &global, what);
                }
                ms_dtensor_release(&s);
                ms_dtensor_release(&t);
            }
    ms_tensor_release(&global);
    ms_dmesh_destroy(da), ms_dmesh_destroy(db), ms_dmesh_destroy(dc), ms_dmesh_destroy(dw);
    ms_mesh_free(&a), ms_mesh_free(&b), ms_mesh_free(&c), ms_mesh_free(&world);
}

static void test_cross_mesh(void **state) {
    (void)state;
    mt_run(6, cross_mesh, NULL);
}

/* S(0) -> S(1) on two ranks is an all-to-all through two packing workspaces. With a device
 * limit that leaves room for the new local part but not for a workspace, every rank fails
 * (before any collective) with MS_ERR_NOMEM naming the size and the tensor; the tensor keeps
 * its placements and values, nothing stays allocated, and once the limit is lifted the same
 * reshard succeeds on the same ranks, its workspace counted on the device. */
static void workspace_nomem(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err;
    ms_mesh m = mesh_of(r, "dp=2");
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &m, &dm, &err), &err)) return;
    const int64_t g[2] = {64, 32};
    ms_tensor global;
    MT_OK(r, make_global(r->ctx, 2, g, &global, &err), &err);
    ms_placements rows, cols;
    ms_placements_parse("[S(0)]", &rows, &err);
    ms_placements_parse("[S(1)]", &cols, &err);
    ms_dtensor t;
    if (!MT_OK(r, ms_dtensor_shard(dm, &global, &rows, &t, &err), &err)) return;
    ms_device *dev = r->ctx->device;
    size_t before = atomic_load(&dev->in_use), local = 32 * 32 * sizeof(float);
    ms_device_set_limit(dev, before + local + 1024);
    ms_status st = ms_reshard(&t, &cols, NULL, &err);
    if (ms_dmesh_is_member(dm)) {
        MT_CHECK(r, st == MS_ERR_NOMEM, "reshard under the limit returned %s", ms_status_str(st));
        MT_CHECK(r,
                 strstr(err.msg, "reshard workspace") && strstr(err.msg, "[64, 32] tensor") &&
                     strstr(err.msg, "bytes"),
                 "the message names neither the workspace, the tensor nor the size: %s", err.msg);
        MT_CHECK(r, ms_placements_eq(&t.pl, &rows), "a failed reshard changed the placements");
        check_box(r, &t, &global, "after the failed reshard");
        MT_CHECK(r, atomic_load(&dev->in_use) == before, "%zu bytes left allocated",
                 atomic_load(&dev->in_use) - before);
    }
    ms_device_set_limit(dev, 0);
    if (MT_OK(r, ms_reshard(&t, &cols, NULL, &err), &err)) {
        check_box(r, &t, &global, "after the reshard without a limit");
        if (ms_dmesh_is_member(dm))
            MT_CHECK(r, atomic_load(&dev->in_use) > before, "the workspace is not on the device");
    }
    ms_dtensor_release(&t);
    ms_tensor_release(&global);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&m);
}

static void test_workspace_nomem(void **state) {
    (void)state;
    mt_run(2, workspace_nomem, NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_shard_full),
    cmocka_unit_test(test_from_local),
    cmocka_unit_test(test_cross_mesh),
    cmocka_unit_test(test_workspace_nomem),
};
MT_MAIN("dtensor", tests)

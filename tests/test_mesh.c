/* test_mesh.c - ProcessMesh: coordinates, groups, sub-meshes, parsing and every error. */
#include <string.h>

#include "engine/dist/mesh.h"
#include "tests/testkit.h"

static void coords_groups_ids(void **state) {
    (void)state;
    ms_mesh m;
    ms_error err;
    const int shape[2] = {2, 3};
    const char *names[2] = {"dp", "tp"};
    const int ids[6] = {10, 11, 12, 20, 21, 22}; /* arbitrary ids */
    assert_int_equal(ms_mesh_init(&m, 2, shape, names, ids, &err), MS_OK);
    assert_int_equal(m.size, 6);
    int c[2];
    assert_true(ms_mesh_coords(&m, 21, c));
    assert_int_equal(c[0], 1);
    assert_int_equal(c[1], 1);
    assert_false(ms_mesh_coords(&m, 3, c));
    const int at[2] = {1, 2};
    assert_int_equal(ms_mesh_rank_at(&m, at), 22);
    int g[3];
    assert_int_equal(ms_mesh_dim_group(&m, 21, 1, g, &err), MS_OK);
    assert_int_equal(g[0], 20), assert_int_equal(g[1], 21), assert_int_equal(g[2], 22);
    assert_int_equal(ms_mesh_dim_group(&m, 21, 0, g, &err), MS_OK);
    assert_int_equal(g[0], 11), assert_int_equal(g[1], 21);
    assert_int_equal(ms_mesh_dim_by_name(&m, "tp"), 1);
    assert_int_equal(ms_mesh_dim_by_name(&m, "pp"), -1);
    /* Every rank of a dim group differs from the others only in that coordinate. */
    for (int i = 0; i < 6; i++)
        for (int d = 0; d < 2; d++) {
            int rc[2], grp[3], gc[2];
            ms_mesh_coords(&m, ids[i], rc);
            ms_mesh_dim_group(&m, ids[i], d, grp, &err);
            for (int k = 0; k < shape[d]; k++) {
                ms_mesh_coords(&m, grp[k], gc);
                assert_int_equal(gc[d], k);
                assert_int_equal(gc[1 - d], rc[1 - d]);
            }
        }
    ms_mesh sub;
    assert_int_equal(ms_mesh_slice(&m, 0, 1, &sub, &err), MS_OK);
    assert_int_equal(sub.ndim, 1);
    assert_string_equal(sub.names[0], "tp");
    assert_int_equal(sub.ranks[0], 20), assert_int_equal(sub.ranks[2], 22);
    ms_mesh_free(&sub);
    const bool keep[2] = {true, false};
    assert_int_equal(ms_mesh_submesh(&m, 12, keep, &sub, &err), MS_OK);
    assert_int_equal(sub.size, 2);
    assert_int_equal(sub.ranks[0], 12), assert_int_equal(sub.ranks[1], 22);
    ms_mesh_free(&sub);
    assert_int_equal(ms_mesh_check_world(&m, 6, &err), MS_ERR_INVALID); /* ids >= 6 */
    assert_non_null(strstr(err.msg, "outside the world"));
    ms_mesh_free(&m);
}

static void four_d_and_parse(void **state) {
    (void)state;
    ms_mesh m;
    ms_error err;
    assert_int_equal(ms_mesh_parse(&m, "dp=2,pp=1,tp=2,sp=2", &err), MS_OK);
    assert_int_equal(m.ndim, 4);
    assert_int_equal(m.size, 8);
    assert_string_equal(m.names[3], "sp");
    int c[4];
    assert_true(ms_mesh_coords(&m, 7, c));
    assert_int_equal(c[0], 1), assert_int_equal(c[1], 0), assert_int_equal(c[2], 1),
        assert_int_equal(c[3], 1);
    assert_int_equal(ms_mesh_check_world(&m, 8, &err), MS_OK);
    ms_mesh_free(&m);
    assert_int_equal(ms_mesh_parse(&m, "2x3", &err), MS_OK);
    assert_int_equal(m.shape[1], 3);
    assert_string_equal(m.names[1], "d1");
    ms_mesh_free(&m);
    assert_int_equal(ms_mesh_parse(&m, "[4]", &err), MS_OK);
    assert_int_equal(m.size, 4);
    ms_mesh_free(&m);
}

static void errors(void **state) {
    (void)state;
    ms_mesh m;
    ms_error err;
    const int zero[2] = {2, 0};
    assert_int_equal(ms_mesh_init(&m, 2, zero, NULL, NULL, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "must be positive"));
    const int neg[1] = {-3};
    assert_int_equal(ms_mesh_init(&m, 1, neg, NULL, NULL, &err), MS_ERR_INVALID);
    const int shape[1] = {3};
    const int dup[3] = {0, 2, 0};
    assert_int_equal(ms_mesh_init(&m, 1, shape, NULL, dup, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "appears twice"));
    const int two[2] = {1, 1};
    const char *same[2] = {"dp", "dp"};
    assert_int_equal(ms_mesh_init(&m, 2, two, same, NULL, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "both named"));
    const int seven[7] = {1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(ms_mesh_init(&m, 7, seven, NULL, NULL, &err), MS_ERR_INVALID);
    assert_int_equal(ms_mesh_init(&m, 0, seven, NULL, NULL, &err), MS_ERR_INVALID);
    assert_int_equal(ms_mesh_parse(&m, "2x0", &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "must be positive"));
    assert_int_equal(ms_mesh_parse(&m, "2xfoo", &err), MS_ERR_INVALID);
    assert_int_equal(ms_mesh_parse(&m, "", &err), MS_ERR_INVALID);
    /* A mesh whose size does not match the world. */
    assert_int_equal(ms_mesh_parse(&m, "2x2", &err), MS_OK);
    assert_int_equal(ms_mesh_check_world(&m, 8, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "has 4 ranks but the world has 8"));
    ms_mesh_free(&m);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(coords_groups_ids),
    cmocka_unit_test(four_d_and_parse),
    cmocka_unit_test(errors),
};
MT_MAIN("mesh", tests)

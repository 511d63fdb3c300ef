/* test_placement.c - placements: text form, validation errors, the balanced split rule at
 * every size, and local boxes tiling the global tensor; strategy files' text in messages. */
#include <string.h>

#include "engine/dist/placement.h"
#include "engine/model/strategy.h"
#include "profiler/advisor.h"
#include "tests/testkit.h"

static void roundtrip(const char *in, const char *want) {
    ms_placements pl;
    ms_error err = {0};
    char buf[128];
    if (ms_placements_parse(in, &pl, &err) != MS_OK) fail_msg("parse '%s': %s", in, err.msg);
    assert_string_equal(ms_placements_str(&pl, buf, sizeof buf), want);
    ms_placements again;
    assert_int_equal(ms_placements_parse(buf, &again, &err), MS_OK);
    assert_true(ms_placements_eq(&pl, &again));
}

static void text_form(void **state) {
    (void)state;
    roundtrip("[S(0), R, P(sum)]", "[S(0), R, P(sum)]");
    roundtrip("Shard(1), Replicate(), Partial(avg)", "[S(1), R, P(avg)]");
    roundtrip("[P(max),P(min)]", "[P(max), P(min)]");
    roundtrip("[P]", "[P(sum)]");
    roundtrip("[S(0), S(0)]", "[S(0), S(0)]");
    roundtrip("[S(0,1), S(0,0)]", "[S(0,1), S(0,0)]");
    roundtrip("[S(0,0), S(0,1)]", "[S(0), S(0)]"); /* default order prints short */
    roundtrip(" [ s(2) , r ] ", "[S(2), R]");
}

static void parse_errors(void **state) {
    (void)state;
    const char *bad[] = {"",         "[]",    "[S(]",  "[X]",     "[S(0), S(0,1)]",
                         "[P(foo)]", "[S(0)", "[R R]", "[S(-1)]", "[R,]x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ms_placements pl;
        ms_error err = {0};
        if (ms_placements_parse(bad[i], &pl, &err) != MS_ERR_INVALID)
            fail_msg("'%s' parsed but should not", bad[i]);
        assert_non_null(strstr(err.msg, "placements"));
    }
}

static void validate_errors(void **state) {
    (void)state;
    ms_placements pl;
    ms_error err;
    ms_placements_parse("[S(3), R]", &pl, &err);
    assert_int_equal(ms_placements_validate(&pl, 2, 2, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "S(3)"));
    assert_int_equal(ms_placements_validate(&pl, 3, 4, &err), MS_ERR_INVALID); /* 2 vs 3 dims */
    assert_non_null(strstr(err.msg, "one placement per mesh dim"));
    ms_placements_parse("[P(sum), P(max)]", &pl, &err);
    assert_int_equal(ms_placements_validate(&pl, 2, 1, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "do not commute"));
    ms_placements_parse("[P(sum), P(avg)]", &pl, &err);
    assert_int_equal(ms_placements_validate(&pl, 2, 1, &err), MS_OK);
    ms_placements_parse("[P(max), P(max)]", &pl, &err);
    assert_int_equal(ms_placements_validate(&pl, 2, 1, &err), MS_OK);
    ms_placements_parse("[S(0,0), S(0,0)]", &pl, &err);
    assert_int_equal(ms_placements_validate(&pl, 2, 1, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "nesting orders"));
}

/* The split rule at every size from 0 to 40 and every part count from 1 to 9, checked
 * against its definition: sizes differ by at most one, larger parts first, contiguous. */
static void split_every_size(void **state) {
    (void)state;
    for (int64_t n = 0; n <= 40; n++)
        for (int k = 1; k <= 9; k++) {
            int64_t next = 0;
            for (int i = 0; i < k; i++) {
                int64_t off, len;
                ms_split_part(n, k, i, &off, &len);
                assert_int_equal(off, next);
                int64_t want = n / k + (i < n % k ? 1 : 0);
                assert_int_equal(len, want);
                next += len;
            }
            assert_int_equal(next, n);
        }
    int64_t off, len;
    ms_split_part(2, 4, 3, &off, &len); /* fewer elements than parts: trailing parts are empty */
    assert_int_equal(len, 0);
    assert_int_equal(off, 2);
}

/* On a 2x3 mesh every placement of a 2-d tensor gives boxes that, per replica class,
 * tile the global tensor exactly once; nested shards split outer-first. */
static void boxes_tile(void **state) {
    (void)state;
    ms_mesh m;
    ms_error err;
    ms_mesh_parse(&m, "2x3", &err);
    const char *pls[] = {"[S(0), S(1)]",     "[S(1), S(0)]", "[S(0), S(0)]",
                         "[S(0,1), S(0,0)]", "[R, S(1)]",    "[S(1), S(1)]"};
    const int64_t shapes[][2] = {{10, 4}, {1, 2}, {7, 5}, {0, 3}};
    for (size_t s = 0; s < 4; s++)
        for (size_t p = 0; p < sizeof pls / sizeof *pls; p++) {
            ms_placements pl;
            assert_int_equal(ms_placements_parse(pls[p], &pl, &err), MS_OK);
            assert_int_equal(ms_placements_validate(&pl, 2, 2, &err), MS_OK);
            int cover[10][5] = {{0}};
            int holders = 0;
            for (int r = 0; r < 6; r++) {
                int c[2];
                ms_mesh_coords(&m, r, c);
                int64_t st[2], ln[2];
                ms_local_box(&pl, &m, c, 2, shapes[s], st, ln);
                for (int64_t i = st[0]; i < st[0] + ln[0]; i++)
                    for (int64_t j = st[1]; j < st[1] + ln[1]; j++) cover[i][j]++;
                holders++;
            }
            int replicas = 1;
            for (int md = 0; md < 2; md++)
                if (pl.p[md].kind != MS_PL_SHARD) replicas *= m.shape[md];
            for (int64_t i = 0; i < shapes[s][0]; i++)
                for (int64_t j = 0; j < shapes[s][1]; j++) assert_int_equal(cover[i][j], replicas);
        }
    /* Concrete nested case: 10 rows over mesh dim 0 (2) then mesh dim 1 (3):
     * outer [0,5) [5,10); inner of 5 over 3: [0,2) [2,4) [4,5). */
    ms_placements pl;
    ms_placements_parse("[S(0), S(0)]", &pl, &err);
    const int64_t g[1] = {10};
    int c[2] = {1, 2};
    int64_t st, ln;
    ms_local_box(&pl, &m, c, 1, g, &st, &ln);
    assert_int_equal(st, 9), assert_int_equal(ln, 1);
    /* Reversed order: mesh dim 1 (3) outermost: [0,4) [4,7) [7,10); then over 2. */
    ms_placements_parse("[S(0,1), S(0,0)]", &pl, &err);
    c[0] = 1, c[1] = 1;
    ms_local_box(&pl, &m, c, 1, g, &st, &ln);
    assert_int_equal(st, 6), assert_int_equal(ln, 1);
    ms_mesh_free(&m);
}

/* Keys and placement strings of a strategy file reach messages escaped. */
static void hardening_strategy_text_escaped(void **state) {
    (void)state;
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"mesh\": {\"dp\": 1, \"\\u001b[2J\": 2}}", "$.mesh.\\x1B[2J: unknown key"},
        {"{\"mesh\": {\"dp\": 1, \"tp\": 2}, \"placements\": {\"\\u001b]0;x\\u0007\": 3}}",
         "$.placements[\"\\x1B]0;x\\x07\"]: expected a placement string"},
        {"{\"mesh\": {\"dp\": 1, \"tp\": 2}, \"placements\": {\"w\": \"[R, \\u001b[5m]\"}}",
         "placements '[R, \\x1B[5m]': cannot parse at '\\x1B[5m]'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ms_strategy s;
        ms_placement_rules rules;
        ms_error err = {0};
        assert_int_equal(ms_strategy_parse_json(cases[i].json, strlen(cases[i].json), "s.json", &s,
                                                &rules, &err),
                         MS_ERR_INVALID);
        mt_expect_escaped(err.msg, cases[i].want);
    }
    /* The short form (the dashboard's and --switch's) goes through the same parser. */
    const char *plan = "{\"dp\": 2, \"\\u001b[2Jzero\": 1}";
    ms_strategy ps;
    ms_error err = {0};
    assert_int_equal(ms_strategy_parse_json(plan, strlen(plan), "strategy", &ps, NULL, &err),
                     MS_ERR_INVALID);
    fprintf(stderr, "MSG: %s\n", err.msg);
    mt_expect_escaped(err.msg, "\\x1B[2Jzero");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(text_form),       cmocka_unit_test(parse_errors),
    cmocka_unit_test(validate_errors), cmocka_unit_test(split_every_size),
    cmocka_unit_test(boxes_tile),      cmocka_unit_test(hardening_strategy_text_escaped),
};
MT_MAIN("placement", tests)

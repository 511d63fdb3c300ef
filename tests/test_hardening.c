/* test_hardening.c - regressions for inputs and failures that once crashed or misled: mesh
 * degrees whose product overflowed (SIGFPE), error texts that dropped a degree, and the
 * timeout bookkeeping that named ranks which were only blocked behind a stalled one. The
 * stalled-rank run itself is tests/mpi_stall.sh. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "engine/comm/comm_impl.h"
#include "engine/model/strategy.h"
#include "engine/plan/validate.h"
#include "profiler/advisor.h"
#include "engine/plan/cost.h"
#include "tests/testkit.h"

static void degree_products(void **state) {
    (void)state;
    ms_error err = {0};
    int ranks = -1;
    assert_int_equal(ms_strategy_check_degrees(2, 2, 1, 4, &ranks, &err), MS_OK);
    assert_int_equal(ranks, 4);
    assert_int_equal(ms_strategy_check_degrees(4096, 1, 1, 0, &ranks, &err), MS_OK);
    assert_int_equal(ranks, 4096);
    struct {
        int dp, tp, cp, world;
        const char *want;
    } bad[] = {
        /* 4096^3 is 2^36: as an int product it wrapped to 0, then was divided by */
        {4096, 4096, 4096, 0, "dp 4096 x tp 4096 x cp 4096 needs more than 4096 ranks"},
        {INT_MAX, INT_MAX, INT_MAX, 0, "needs more than 4096 ranks"},
        {65536, 65536, 1, 0, "needs more than 4096 ranks"},
        {1, 1, 65536, 0, "needs more than 4096 ranks"},
        {4096, 2, 1, 0, "needs more than 4096 ranks"},
        {2, 2, 1, 8, "dp 2 x tp 2 x cp 1 needs 4 ranks but the job runs on 8"},
        {0, 2, 2, 0, "degrees must be >= 1"},
        {2, -1, 2, 0, "degrees must be >= 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ranks = -1;
        ms_status st =
            ms_strategy_check_degrees(bad[i].dp, bad[i].tp, bad[i].cp, bad[i].world, &ranks, &err);
        printf("refused: %s\n", err.msg);
        assert_int_equal(st, MS_ERR_INVALID);
        assert_int_equal(ranks, 0);
        assert_non_null(strstr(err.msg, bad[i].want));
    }
}

/* Every way degrees come in (flags go through ms_strategy_init, files and live switches
 * through ms_strategy_parse_json) is refused before anything counts ranks. */
static void strategy_refuses_huge_meshes(void **state) {
    (void)state;
    ms_error err = {0};
    ms_strategy s;
    assert_int_equal(ms_strategy_init(&s, 4096, 4096, 4096, false, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "dp 4096 x tp 4096 x cp 4096 needs more than"));
    const char *forms[] = {"{\"mesh\": {\"dp\": 4096, \"tp\": 4096, \"cp\": 4096}}",
                           "{\"dp\": 4096, \"tp\": 4096, \"cp\": 4096, \"sp\": false}"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(
            ms_strategy_parse_json(forms[i], strlen(forms[i]), "s.json", &s, NULL, &err),
            MS_ERR_INVALID);
        assert_non_null(strstr(err.msg, "dp4096 x tp4096 x pp1 x cp4096"));
    }
    assert_int_equal(ms_strategy_init(&s, 2, 2, 2, true, &err), MS_OK);
    assert_int_equal(ms_strategy_ranks(&s), 8);
}

/* The live validator's refusal (a 422 on the dashboard) shows every degree. */
static void executable_check_names_every_degree(void **state) {
    (void)state;
    ms_model_config cfg = {.n_layer = 1, .n_head = 4, .n_embd = 32, .n_positions = 64};
    ms_error err = {0};
    ms_strategy s;
    ms_strategy_defaults(&s);
    s.dp = s.tp = s.cp = 4096; /* as a hand-made value could be: the validator still says so */
    ms_job_shape job = {.world = 4, .batch = 8, .seq = 64};
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 0, &err), MS_ERR_INVALID);
    printf("refused: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "4096"));
    assert_non_null(strstr(err.msg, "(dp 4096, tp 4096, pp 1, cp 4096)"));
}

/* After a timeout: the silent ranks are named, never the ones blocked behind them or the ones
 * that gave up because of them. Once ranks 0 and 1 blamed rank 3 as well as the stopped rank
 * 2: rank 3 was stuck in the previous all_reduce, waiting for rank 2's data. */
static void timeout_blame(void **state) {
    (void)state;
    const ms_peer_state SILENT = MS_PEER_SILENT, GAVE_UP = MS_PEER_GAVE_UP,
                        ANSWERED = MS_PEER_ANSWERED;
    int out[4];
    /* ranks 2 and 3 did not arrive; 3 answered (it waits behind 2) or had given up */
    int suspects[] = {2, 3};
    ms_peer_state waits[] = {SILENT, ANSWERED}, left[] = {SILENT, GAVE_UP};
    assert_int_equal(ms_comm_blame(suspects, waits, 2, false, out), 1);
    assert_int_equal(out[0], 2);
    assert_int_equal(ms_comm_blame(suspects, left, 2, false, out), 1);
    assert_int_equal(out[0], 2);
    /* the transfer stalled after everybody entered: the silent peer is named */
    int peers[] = {0, 1, 3};
    ms_peer_state after[] = {ANSWERED, GAVE_UP, SILENT};
    assert_int_equal(ms_comm_blame(peers, after, 3, true, out), 1);
    assert_int_equal(out[0], 3);
    /* nobody silent: ranks busy elsewhere are named, ranks that gave up are not, and a stalled
     * transfer names nobody */
    ms_peer_state busy[] = {ANSWERED, GAVE_UP};
    assert_int_equal(ms_comm_blame(suspects, busy, 2, false, out), 1);
    assert_int_equal(out[0], 2);
    assert_int_equal(ms_comm_blame(suspects, busy, 2, true, out), 0);
    ms_peer_state gone[] = {GAVE_UP, GAVE_UP};
    assert_int_equal(ms_comm_blame(suspects, gone, 2, false, out), 0);
    /* in place, as the MPI backend calls it */
    int inplace[] = {1, 2, 3};
    ms_peer_state some[] = {ANSWERED, SILENT, SILENT};
    assert_int_equal(ms_comm_blame(inplace, some, 3, false, inplace), 2);
    assert_true(inplace[0] == 2 && inplace[1] == 3);
    assert_int_equal(ms_comm_blame(inplace, some, 0, true, out), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(degree_products),
    cmocka_unit_test(strategy_refuses_huge_meshes),
    cmocka_unit_test(executable_check_names_every_degree),
    cmocka_unit_test(timeout_blame),
};
MT_MAIN("hardening", tests)

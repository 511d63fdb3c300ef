/* test_assign_ilp.c - the pairwise assignment program (engine/plan/assign_ilp.h) against
 * enumerating every assignment: random programs with negative and positive pair terms, memory
 * and aux budgets and forbidden combinations; the k best in order; infeasibility; bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/assign_ilp.h"
#include "tests/testkit.h"

enum { MAXN = 6, MAXK = 4 };

static uint32_t rng = 12345;
static double uniform(void) { /* xorshift32 in [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return (double)(rng >> 8) / 16777216.0;
}

typedef struct enum_sol {
    double obj;
    bool ok;
} enum_sol;

/* The objective and feasibility of assignment a, evaluated directly. */
static enum_sol evaluate(const ms_assign_problem *p, const uint8_t *a) {
    enum_sol r = {0, true};
    double mem = 0, aux = 0;
    for (int i = 0; i < p->n; i++) {
        r.obj += p->c[i].cost[a[i]], mem += p->c[i].mem[a[i]], aux += p->c[i].aux[a[i]];
        r.ok &= !p->c[i].forbid[a[i]];
    }
    for (int e = 0; e < p->npairs; e++) {
        const ms_assign_pair *q = &p->pairs[e];
        r.obj += q->cost[a[q->i]][a[q->j]], mem += q->mem[a[q->i]][a[q->j]];
        aux += q->aux[a[q->i]][a[q->j]];
        r.ok &= !q->forbid[a[q->i]][a[q->j]];
    }
    r.ok &= !p->has_budget || mem <= p->budget + 1e-9 * fabs(p->budget);
    r.ok &= !p->has_aux_budget || aux <= p->aux_budget + 1e-9 * fabs(p->aux_budget);
    return r;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Every feasible objective, sorted; returns the count. */
static int enumerate(const ms_assign_problem *p, double *objs) {
    int total = 1, nf = 0;
    for (int i = 0; i < p->n; i++) total *= p->c[i].ncand;
    for (int code = 0; code < total; code++) {
        uint8_t a[MAXN];
        for (int i = 0, r = code; i < p->n; i++)
            a[i] = (uint8_t)(r % p->c[i].ncand), r /= p->c[i].ncand;
        enum_sol s = evaluate(p, a);
        if (s.ok) objs[nf++] = s.obj;
    }
    qsort(objs, (size_t)nf, sizeof *objs, cmp_double);
    return nf;
}

static void random_problem(ms_assign_problem *p, ms_assign_class *c, ms_assign_pair *pairs) {
    memset(c, 0, sizeof *c * MAXN);
    memset(pairs, 0, sizeof *pairs * MAXN * MAXN);
    p->n = 2 + (int)(uniform() * (MAXN - 1));
    p->c = c, p->pairs = pairs, p->npairs = 0;
    double mem_lo = 0;
    for (int i = 0; i < p->n; i++) {
        c[i].ncand = 1 + (int)(uniform() * MAXK);
        double lo = 1e9;
        for (int k = 0; k < c[i].ncand; k++) {
            c[i].cost[k] = 1e-4 * (uniform() - 0.3); /* seconds: tiny, as step times are */
            c[i].mem[k] = 1e6 * (1 + 9 * uniform()); /* bytes */
            c[i].aux[k] = 1e5 * (uniform() - 0.5);   /* collective bytes, say */
            c[i].forbid[k] = k > 0 && uniform() < 0.1;
            lo = c[i].mem[k] < lo ? c[i].mem[k] : lo;
        }
        mem_lo += lo;
    }
    for (int i = 0; i < p->n; i++)
        for (int j = i + 1; j < p->n; j++) {
            if (uniform() < 0.4) continue;
            ms_assign_pair *q = &pairs[p->npairs++];
            q->i = uniform() < 0.5 ? i : j, q->j = q->i == i ? j : i;
            for (int k = 0; k < MS_ASSIGN_MAX_CANDS; k++)
                for (int l = 0; l < MS_ASSIGN_MAX_CANDS; l++) {
                    q->cost[k][l] = uniform() < 0.5 ? 1e-4 * (uniform() - 0.6) : 0;
                    q->mem[k][l] = uniform() < 0.3 ? 1e6 * (uniform() - 0.5) : 0;
                    q->aux[k][l] = uniform() < 0.3 ? 1e5 * (uniform() - 0.5) : 0;
                    q->forbid[k][l] = uniform() < 0.05;
                }
        }
    p->has_budget = uniform() < 0.7;
    p->budget = mem_lo * (1.2 + uniform());
    p->has_aux_budget = uniform() < 0.5;
    p->aux_budget = 1e5 * (uniform() - 0.5);
}

/* 300 random programs: the ILP's k best equal the enumeration's, in order. */
static void test_against_enumeration(void **state) {
    (void)state;
    ms_assign_class c[MAXN];
    ms_assign_pair *pairs = malloc(sizeof *pairs * MAXN * MAXN);
    int infeasible = 0, checked = 0;
    for (int t = 0; t < 300; t++) {
        ms_assign_problem p = {0};
        random_problem(&p, c, pairs);
        double objs[4096];
        int nf = enumerate(&p, objs);
        ms_assign_result r;
        ms_error err = {0};
        if (ms_assign_solve(&p, 3, &r, &err) != MS_OK) fail_msg("program %d: %s", t, err.msg);
        assert_false(r.timed_out);
        if (nf == 0) {
            assert_true(r.infeasible);
            assert_int_equal(r.nsol, 0);
            infeasible++;
            continue;
        }
        assert_false(r.infeasible);
        assert_int_equal(r.nsol, nf < 3 ? nf : 3);
        for (int s = 0; s < r.nsol; s++) {
            enum_sol e = evaluate(&p, r.sol[s]);
            assert_true(e.ok);
            /* its objective is what the solver says, and the s-th best of all */
            assert_true(fabs(e.obj - r.objective[s]) <= 1e-9);
            if (fabs(e.obj - objs[s]) > 1e-9)
                fail_msg("program %d: solution %d costs %.9g, the %d-th best is %.9g", t, s, e.obj,
                         s, objs[s]);
            for (int u = 0; u < s; u++) assert_memory_not_equal(r.sol[u], r.sol[s], (size_t)p.n);
        }
        checked++;
    }
    printf("%d programs checked against enumeration, %d infeasible\n", checked, infeasible);
    assert_true(checked > 200 && infeasible > 0);
    free(pairs);
}

/* A budget nothing meets, and malformed programs. */
static void test_edges(void **state) {
    (void)state;
    ms_assign_class c[2] = {{.ncand = 2, .cost = {1, 2}, .mem = {10, 5}},
                            {.ncand = 1, .cost = {0}, .mem = {3}}};
    ms_assign_problem p = {.n = 2, .c = c, .has_budget = true, .budget = 7};
    ms_assign_result r;
    ms_error err = {0};
    assert_int_equal(ms_assign_solve(&p, 2, &r, &err), MS_OK);
    assert_true(r.infeasible);
    p.budget = 8; /* only the second candidate fits */
    assert_int_equal(ms_assign_solve(&p, 2, &r, &err), MS_OK);
    assert_int_equal(r.nsol, 1);
    assert_int_equal(r.sol[0][0], 1);
    p.has_budget = false; /* both, cheaper first */
    assert_int_equal(ms_assign_solve(&p, 4, &r, &err), MS_OK);
    assert_int_equal(r.nsol, 2);
    assert_int_equal(r.sol[0][0], 0);
    assert_int_equal(r.sol[1][0], 1);
    c[1].ncand = 0;
    assert_int_not_equal(ms_assign_solve(&p, 1, &r, &err), MS_OK);
    assert_non_null(strstr(err.msg, "class 1 has 0 candidates"));
    c[1].ncand = 1;
    ms_assign_pair self = {.i = 0, .j = 0};
    p.pairs = &self, p.npairs = 1;
    assert_int_not_equal(ms_assign_solve(&p, 1, &r, &err), MS_OK);
    assert_non_null(strstr(err.msg, "pair 0 joins 0 and 0"));
}

/* A frustrated program (every pair of 40 classes joined by random terms) with a 1 ms limit:
 * the limit is reported, not an error and not a wrong answer. */
static void test_time_limit(void **state) {
    (void)state;
    enum { N = 40, K = 6 };
    ms_assign_class *c = calloc(N, sizeof *c);
    ms_assign_pair *pairs = calloc(N * (N - 1) / 2, sizeof *pairs);
    int np = 0;
    for (int i = 0; i < N; i++) {
        c[i].ncand = K;
        for (int k = 0; k < K; k++) c[i].cost[k] = uniform() - 0.5;
        for (int j = i + 1; j < N; j++) {
            ms_assign_pair *q = &pairs[np++];
            q->i = i, q->j = j;
            for (int k = 0; k < K; k++)
                for (int l = 0; l < K; l++) q->cost[k][l] = uniform() - 0.5;
        }
    }
    ms_assign_problem p = {.n = N, .c = c, .npairs = np, .pairs = pairs, .time_limit_s = 1e-3};
    ms_assign_result r;
    ms_error err = {0};
    assert_int_equal(ms_assign_solve(&p, 1, &r, &err), MS_OK);
    printf("timed out: %d, solutions %d\n", r.timed_out, r.nsol);
    assert_true(r.timed_out);
    assert_false(r.infeasible);
    free(c);
    free(pairs);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_enumeration),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_time_limit),
    };
    return mt_main(argc, argv, "test_assign_ilp", tests, sizeof tests / sizeof *tests);
}

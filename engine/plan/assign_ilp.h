/* assign_ilp.h - one candidate per class, minimising unary and pairwise costs under a memory
 * budget: the integer program behind the automatic placement search (auto_place.c), solved
 * exactly by GLPK's branch and cut.
 *
 * The program. x[i][k] = 1 when class i takes candidate k, exactly one per class. For each
 * listed pair e = (i, j), y[e][k][l] = x[i][k] * x[j][l], linearised by its marginals (row k
 * of y sums to x_ik, column l to x_jl: exact for binary x whatever the signs, and the local
 * polytope's relaxation, far tighter than bounding each product alone). Minimise
 *     sum_i cost_i(k) x_ik + sum_e cost_e(k, l) y_ekl
 * subject to
 *     sum_i mem_i(k) x_ik + sum_e mem_e(k, l) y_ekl <= budget      (when has_budget)
 *     sum_i aux_i(k) x_ik + sum_e aux_e(k, l) y_ekl <= aux_budget  (when has_aux_budget)
 * and to the forbidden candidates and combinations (a layout that cannot be compiled).
 *
 * The k best: after each solution a no-good cut (sum_i x_{i, sol_i} <= n - 1) excludes it and
 * the program is solved again. Deterministic: the same program gives the same solutions. Costs
 * and memory are rescaled inside so that GLPK's tolerances see numbers near 1.
 *
 * GLPK keeps per-thread state; call from one thread at a time per process where the library
 * was built without thread-local storage (Debian's has it).
 */
#ifndef MS_PLAN_ASSIGN_ILP_H
#define MS_PLAN_ASSIGN_ILP_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/core/status.h"

#define MS_ASSIGN_MAX_CANDS   10
#define MS_ASSIGN_MAX_CLASSES 64
#define MS_ASSIGN_MAX_SOLS    8

typedef struct ms_assign_class {
    int ncand; /* 1..MS_ASSIGN_MAX_CANDS */
    double cost[MS_ASSIGN_MAX_CANDS], mem[MS_ASSIGN_MAX_CANDS], aux[MS_ASSIGN_MAX_CANDS];
    bool forbid[MS_ASSIGN_MAX_CANDS];
} ms_assign_class;

typedef struct ms_assign_pair {
    int i, j; /* i != j, each < n */
    double cost[MS_ASSIGN_MAX_CANDS][MS_ASSIGN_MAX_CANDS];
    double mem[MS_ASSIGN_MAX_CANDS][MS_ASSIGN_MAX_CANDS];
    double aux[MS_ASSIGN_MAX_CANDS][MS_ASSIGN_MAX_CANDS];
    bool forbid[MS_ASSIGN_MAX_CANDS][MS_ASSIGN_MAX_CANDS];
} ms_assign_pair;

typedef struct ms_assign_problem {
    int n;                    /* classes, 1..MS_ASSIGN_MAX_CLASSES */
    const ms_assign_class *c; /* [n] */
    int npairs;
    const ms_assign_pair *pairs; /* [npairs] */
    bool has_budget, has_aux_budget;
    double budget, aux_budget;
    double time_limit_s; /* per solve; <= 0: none */
} ms_assign_problem;

typedef struct ms_assign_result {
    int nsol; /* best first */
    uint8_t sol[MS_ASSIGN_MAX_SOLS][MS_ASSIGN_MAX_CLASSES];
    double objective[MS_ASSIGN_MAX_SOLS]; /* in the problem's cost units */
    bool infeasible; /* no assignment meets the budgets and the forbidden sets (nsol = 0) */
    bool timed_out;  /* the time limit stopped a solve: nsol holds those found before it */
} ms_assign_result;

/* Solves for up to k_best (1..MS_ASSIGN_MAX_SOLS) solutions, best first; fewer when fewer
 * assignments exist. Infeasibility and the time limit are results, not errors; errors are a
 * malformed problem or a solver failure. */
ms_status ms_assign_solve(const ms_assign_problem *p, int k_best, ms_assign_result *out,
                          ms_error *err);

#endif

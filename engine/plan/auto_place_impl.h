/* auto_place_impl.h - the automatic placement search's internals, shared by auto_place.c (the
 * classes, pins, rules and the public entry) and auto_place_search.c (the surrogate program,
 * its solution and the polish). Private to engine/plan. */
#ifndef MS_PLAN_AUTO_PLACE_IMPL_H
#define MS_PLAN_AUTO_PLACE_IMPL_H

#include <stdint.h>

#include "engine/plan/assign_ilp.h"
#include "engine/plan/auto_place.h"

#define AP_MAX_CLASSES MS_STRATEGY_MAX_RULES
#define AP_MAX_CANDS   (MS_MAX_DIMS + 2)
#define AP_TP_DIM      1 /* the tp dim of the engine's mesh (dp, tp[, cp]) */
#define AP_REPL        (-1)
#define AP_FREE        (-2) /* an activation left to the completion pass: no rule */

_Static_assert(AP_MAX_CANDS <= MS_ASSIGN_MAX_CANDS, "the program holds every candidate");
_Static_assert(AP_MAX_CLASSES <= MS_ASSIGN_MAX_CLASSES, "the program holds every class");

/* Parameters (or fan-out activations) sharing a name once their layer indices are '*'. */
typedef struct ap_class {
    char pattern[96];
    char first[96];           /* its first member's name */
    ms_shape shape;           /* its first member's */
    bool splits[MS_MAX_DIMS]; /* every member's dim holds at least tp elements */
    int follows;              /* a bias: the class of its weight; -1 otherwise */
    bool act;                 /* activations: a fan-out point (the residual stream, a norm) */
    int pin;                  /* the pin rule its members match, or -1 */
    int cand[AP_MAX_CANDS];   /* AP_FREE (activations), AP_REPL, or d: sharded on dim d */
    int ncand;                /* 0: not searched (pinned, replicated or following) */
} ap_class;

/* One layout priced: each class's candidate index. */
typedef struct ap_eval {
    uint8_t a[AP_MAX_CLASSES];
    bool ok, fits;
    double bytes;
    ms_plan_estimate e;
} ap_eval;

typedef struct ap_ctx {
    const ms_plan_problem *pb;
    const ms_strategy *s;
    const ms_placement_rules *pins; /* never NULL (n may be 0) */
    ap_class c[AP_MAX_CLASSES];
    int n;
    bool adj[AP_MAX_CLASSES][AP_MAX_CLASSES]; /* classes joined by unpinned values */
    double limit;                             /* memory per rank */
    double tie;                               /* relative step difference taken as a tie */
    double time_limit_s;                      /* the program's solver, per solve */
    int max_sweeps;
    int shallow_layers; /* > 0: price layouts from one and two layers, extrapolated to these */
    ap_eval *evals;     /* the layouts priced in this pass (shallow or whole), each once */
    int nevals, cap;
    int priced; /* layouts priced, every pass */
    ms_error first_err;
    int max_rounds;
    int rounds;    /* surrogates built */
    int solutions; /* the program's layouts tried */
    bool timed_out;
} ap_ctx;

/* The layout a, priced once (its index into cx->evals). */
int ap_evaluate(ap_ctx *cx, const uint8_t *a);

/* Whether x is a better layout than y: fitting over not, then by step time (by memory while
 * neither fits), then by fewer collective bytes. */
bool ap_better(const ap_eval *x, const ap_eval *y);

/* From layout `start`, priced whole after a shallow search: one polish among its neighbours,
 * then the tie band's fewest bytes, as ap_search ends. Returns the winner's index. */
int ap_refine(ap_ctx *cx, int start);

/* The search from the priced base layout (all zeros, cx->evals[0]): the winner's index into
 * cx->evals, or -1 with *err set (the solver's time limit reached with no layout). */
int ap_search(ap_ctx *cx, ms_error *err);

#endif

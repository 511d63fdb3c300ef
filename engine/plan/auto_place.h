/* auto_place.h - automatic placements: the tensor-parallel layout of a model, found by the
 * planner with no annotations (or around the few the user pins).
 *
 * The model is compiled with its hints removed (ms_placement_rules.no_hints: no shard hook, no
 * built-in Megatron rules; only the rules tried and the inputs' rows over dp), so a layout is a
 * set of glob rules over value names, and the completion pass places every other value.
 *
 * The classes. Parameters and fan-out activations (values two or more operators read: the
 * residual stream, a norm feeding several projections) are grouped by name with each layer index
 * replaced by '*' ("h.*.mlp.c_fc.weight", "h.*.res1"): a repeated block is solved once and its
 * layout reused for every layer. Over tp a weight class (two or more dims) is replicated or
 * sharded on one of its dims (balanced, so a vocabulary tp does not divide splits unevenly;
 * every rank gets at least one element); an activation class is left to the completion pass
 * ("unpinned"), replicated, or sharded on a dim other than its features (its sequence dim:
 * sequence parallelism). Biases follow the weight of the same prefix (sharded along an output dim,
 * else replicated); other parameters (norms) are replicated. Over dp (and cp) parameters are
 * replicated, as the strategy's ZeRO stage leaves them, and activations keep the batch's rows.
 *
 * Pins. Rules given with the search ("placements": {"*": "auto", pattern: placements, ...})
 * come first in every layout, as given, and fix the classes they match. A class's members pinned
 * differently (or some pinned and some not), or a pin sharding a dim tp does not divide, are
 * refused naming both and the fix.
 *
 * The objective: the priced step time of the engine's compiled program for the strategy on the
 * problem's cluster (kernels by op cost, reshards by their plans, gradient collectives), subject
 * to the memory limit per rank.
 *
 * The search (auto_place_search.c). 1. A surrogate: from the base layout (every weight
 * replicated, every activation unpinned) each class's candidates are priced alone, and each
 * pair of interacting classes (joined in the graph through values no class decides) jointly;
 * the step and the memory become unary and pairwise terms. 2. The integer program over those
 * terms (engine/plan/assign_ilp.h, GLPK) gives its three best layouts under the memory limit
 * (or, when none fits it, the one of least memory). 3. Each is priced exactly and polished by
 * coordinate descent (one class at a time to its best candidate, until a sweep changes nothing),
 * which repairs what the pairwise terms miss. 4. Of every layout priced, the fastest that fits
 * wins; layouts within `tie` of its step are taken as equal (finer than the cost model can
 * tell) and the one with the fewest collective bytes is chosen. Deterministic: the same
 * problem gives the same layout. Each distinct layout is compiled once.
 *
 * Limits: the tp dim only; the mesh and the other settings as given (the strategy search tries
 * the mesh shapes around it); activations under cp are left to the completion pass.
 */
#ifndef MS_PLAN_AUTO_PLACE_H
#define MS_PLAN_AUTO_PLACE_H

#include "engine/plan/cost.h"
#include "engine/plan/search.h"

typedef struct ms_auto_place_opts {
    double mem_limit; /* bytes per rank; <= 0: the cluster's (ms_plan_estimate.mem_cap) */
    int max_sweeps;   /* of each polish; <= 0: 4 */
    int max_rounds;   /* surrogates, each around the best layout so far; <= 0: 4 */
    const ms_placement_rules *pins; /* or NULL: none */
    double tie;                     /* relative step difference taken as equal; 0: 1%; < 0: none */
    double time_limit_s;            /* the integer program's solver, per solve; <= 0: 10 s */
} ms_auto_place_opts;

typedef struct ms_auto_place_result {
    ms_placement_rules rules; /* no_hints set; n = 0 under tp 1 */
    ms_plan_estimate best;    /* the winner's estimate */
    double coll_bytes;        /* collective bytes per device per step, every mesh dim */
    bool have_runner_up;
    ms_plan_estimate runner_up; /* the best other layout priced (fitting, when any does) */
    char runner_up_diff[256];   /* where it differs: "h.*.mlp.c_fc.weight [R, R]" */
    bool have_replicated;
    ms_plan_estimate replicated; /* every weight replicated over tp (data parallelism there) */
    double tie;                  /* the tie band used (relative step) */
    int classes;                 /* classes searched (two or more candidates) */
    int pairs;                   /* interacting pairs of them */
    int rounds;                  /* surrogates built */
    int solutions;               /* the integer program's layouts polished */
    int compiles;                /* layouts priced (a shallow one compiles two small models) */
    double search_ms;
} ms_auto_place_result;

/* Finds the rules for strategy s on problem pb (its cluster, batch, sequence; pb->rules is not
 * read). Errors: a model too large to compile here (the search prices compiled programs), a
 * strategy the problem refuses, contradictory pins, a memory limit no layout fits (naming the
 * smallest found), the solver's time limit reached before any layout (naming the option).
 * Under tp 1 there is nothing to place: the pins alone, the strategy's own estimate. */
ms_status ms_plan_auto_placements(const ms_plan_problem *pb, const ms_strategy *s,
                                  const ms_auto_place_opts *opts, ms_auto_place_result *out,
                                  ms_error *err);

/* --- the layout searched jointly with the strategy ------------------------------------------ */

#define MS_AUTO_PLAN_MAX_ROWS 12

/* One tp degree: the strategy search's best fitting strategy with it, under the model's own
 * layout and under the layout searched for it, both priced from compiled programs. */
typedef struct ms_auto_plan_row {
    ms_strategy s;
    ms_plan_estimate hand;
    bool have_auto;
    ms_auto_place_result layout;
    char why[sizeof(((ms_error *)0)->msg)]; /* why no layout was found, when !have_auto */
} ms_auto_plan_row;

typedef struct ms_auto_plan {
    int n;
    ms_auto_plan_row rows[MS_AUTO_PLAN_MAX_ROWS]; /* ascending tp, from 1 */
    int best;          /* the row with the fastest step, hand or automatic */
    bool best_is_auto; /* ... under its searched layout */
    int tp_searched;   /* rows with tp > 1 */
    double search_ms;  /* the strategy searches and the layout searches together */
} ms_auto_plan;

/* The layout searched jointly with the mesh shape and the other settings: for every tp degree
 * (those dividing the devices, at most 64, unless `fixed` fixes tp), the strategy search's best
 * strategy with that tp that fits (pp, ZeRO, recompute, precision, micro-batches and the other
 * dims chosen for the model's own layout) has its layout searched (ms_plan_auto_placements;
 * tp 1 has none), and both are priced whole from compiled programs, whatever the model's size,
 * so that every row compares alike. tp degrees with no fitting strategy are skipped. Errors: no
 * tp degree above 1 has a fitting strategy. */
ms_status ms_plan_auto_joint(const ms_plan_problem *pb, const ms_plan_fixed *fixed,
                             const ms_auto_place_opts *opts, ms_auto_plan *out, ms_error *err);

/* The rules as the strategy file's "placements" object would say them, on one line, with
 * "*": "complete" when they are the whole layout (no_hints), so that the file reads back the
 * same layout: {"h.*.mlp.c_fc.weight": "[R, S(1)]", ..., "*": "complete"}. Returns buf. */
char *ms_auto_place_rules_str(const ms_placement_rules *r, char *buf, size_t n);

/* Collective bytes per device per step of an estimate, every mesh dim together. */
double ms_plan_estimate_coll_bytes(const ms_plan_estimate *e);

#endif

/* auto_place.h - automatic placements: the tensor-parallel layout of a model's weights, found by
 * the planner with no annotations.
 *
 * The model is compiled with its hints removed (ms_placement_rules.no_hints: no shard hook, no
 * built-in Megatron rules; only the rules tried and the inputs' rows over dp), so a layout is a
 * set of glob rules over parameter names, and the completion pass places every other value.
 *
 * The space. Parameters are grouped into classes by name with each layer index replaced by '*'
 * ("h.*.mlp.c_fc.weight"): a repeated block is solved once and its layout reused for every
 * layer. A class of weights (two or more dims) is replicated over tp or sharded on one of its
 * dims that the tp degree divides. Biases follow the weight of the same prefix: a weight split on
 * an output dim shards its bias along (this engine's [in, out...] weights with [out...] biases,
 * or [out, in] with [out]), otherwise the bias is replicated; every other parameter (norm
 * scales and shifts) is replicated. Over dp (and cp) parameters are replicated, as the
 * strategy's ZeRO stage leaves them.
 *
 * The objective: the priced step time of the engine's compiled program for the strategy on the
 * problem's cluster (kernels by op cost, reshards by their plans, gradient collectives), subject
 * to the memory limit per rank. The search: coordinate descent over the classes in order of first
 * appearance, from all-replicated, each class set to its best candidate with the others held,
 * repeated until a sweep changes nothing (at most max_sweeps). Deterministic: ties go to fewer
 * collective bytes, then to the earlier candidate (replicated, then S(0), S(1), ...). While no
 * layout fits, layouts are compared by memory. Each distinct layout is compiled once.
 *
 * Limits: greedy per class (a layout that needs two classes changed at once is found only if
 * each change alone pays), the tp dim only, the mesh and the other settings as given.
 */
#ifndef MS_PLAN_AUTO_PLACE_H
#define MS_PLAN_AUTO_PLACE_H

#include "engine/plan/cost.h"

typedef struct ms_auto_place_opts {
    double mem_limit; /* bytes per rank; <= 0: the cluster's (ms_plan_estimate.mem_cap) */
    int max_sweeps;   /* <= 0: 4 */
} ms_auto_place_opts;

typedef struct ms_auto_place_result {
    ms_placement_rules rules; /* no_hints set; n = 0 under tp 1 */
    ms_plan_estimate best;    /* the winner's estimate */
    double coll_bytes;        /* collective bytes per device per step, every mesh dim */
    bool have_runner_up;
    ms_plan_estimate runner_up; /* the best other layout priced (fitting, when any does) */
    char runner_up_diff[256];   /* where it differs: "h.*.mlp.c_fc.weight [R, R]" */
    int classes;                /* weight classes searched */
    int compiles;               /* layouts compiled and priced */
    int sweeps;
    double search_ms;
} ms_auto_place_result;

/* Finds the rules for strategy s on problem pb (its cluster, batch, sequence; pb->rules is not
 * read). Errors: a model too large to compile here (the search prices compiled programs), a
 * strategy the problem refuses, a memory limit no layout fits (naming the smallest found). Under
 * tp 1 there is nothing to place: no rules, the strategy's own estimate, no compiles beyond it. */
ms_status ms_plan_auto_placements(const ms_plan_problem *pb, const ms_strategy *s,
                                  const ms_auto_place_opts *opts, ms_auto_place_result *out,
                                  ms_error *err);

/* The rules as the strategy file's "placements" object would say them, on one line:
 * {"h.*.mlp.c_fc.weight": "[R, S(1)]", ...}. Returns buf. */
char *ms_auto_place_rules_str(const ms_placement_rules *r, char *buf, size_t n);

/* Collective bytes per device per step of an estimate, every mesh dim together. */
double ms_plan_estimate_coll_bytes(const ms_plan_estimate *e);

#endif

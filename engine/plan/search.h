/* search.h - the planner's search: every strategy of a problem, ranked.
 *
 * The space: mesh factorisations dp x tp x pp x cp of the device count (tp and tp x cp dividing
 * the heads, pp the layers, cp the sequence, dp the global batch), sp on or off (tp > 1), the
 * LM head vocab-parallel or replicated (tp > 1), ZeRO stage 0-3 (dp > 1), full recompute
 * on or off, and every micro-batch size dividing the per-rank batch, at the problem's precision;
 * offload (ZeRO-Offload) where a strategy does not fit the device without it, or when fixed
 * (1F1B, no buckets, no uneven stages: those are priced when given). Each point is priced by
 * the cost model (plan/cost.h); strategies whose memory exceeds the device's are pruned;
 * the rest are ranked by predicted step time. Settings can be fixed (`--evaluate "tp=8,pp=2"`),
 * and the search covers the others.
 *
 * A program's own model (ms_plan_problem.def without `lm`): dp x tp x pp (pp up to its blocks,
 * no cp or sp), ZeRO 0-3, recompute none or full, fp32 and bf16 unless the precision is fixed,
 * buckets and micro-batch sizes as above; each candidate passes ms_strategy_check_def and is
 * priced from its compiled program.
 */
#ifndef MS_PLAN_SEARCH_H
#define MS_PLAN_SEARCH_H

#include "engine/plan/cost.h"

/* Fixed settings: their values in s, bit MS_SET_x of mask for each fixed one; the search
 * covers the others. Settings the search does not enumerate (schedule, virtual_stages,
 * pp_layers, precision) are applied to every candidate when fixed. */
typedef struct ms_plan_fixed {
    ms_strategy s;
    uint32_t mask;
} ms_plan_fixed;

void ms_plan_fixed_none(ms_plan_fixed *f);
/* Whether setting id is fixed. */
static inline bool ms_plan_fixed_has(const ms_plan_fixed *f, ms_setting_id id) {
    return f->mask >> id & 1;
}
/* Parses "tp=8,pp=2,dp=32": each key a setting's name (MS_STRATEGY_SETTINGS), each value as
 * the setting's flag takes it (booleans as 0/1/true/false/on/off, recompute as none / full /
 * selective or a boolean, pp_layers as counts joined by ':'). Errors name the key, the value and
 * what it takes, or for an unknown key the closest setting and the list. */
ms_status ms_plan_fixed_parse(const char *text, ms_plan_fixed *f, ms_error *err);
/* Whether s agrees with every fixed setting (micro-batch size and count for this global batch;
 * head_replicated only where tp > 1 can replicate it). */
bool ms_plan_fixed_match(const ms_plan_fixed *f, const ms_strategy *s, int global_batch);
/* Copies the fixed settings the search does not enumerate into s. */
void ms_plan_fixed_apply(const ms_plan_fixed *f, ms_strategy *s);

typedef struct ms_plan_result {
    ms_plan_estimate *cands; /* best first: fitting by step time, then (only if none fits) the
                                ones that do not fit */
    int n_cands;
    long evaluated;     /* strategies priced */
    long pruned_memory; /* of those, over the memory limit */
    bool have_unconstrained;
    ms_plan_estimate unconstrained; /* the fastest ignoring memory, when it does not fit */
    bool have_best_executable;
    ms_plan_estimate best_executable; /* the engine's best, when it is not cands[0] */
    double search_ms;
    char reason[1024]; /* why cands[0] wins, in words and figures */
} ms_plan_result;

typedef struct ms_plan_search_opts {
    const ms_plan_fixed *fixed;   /* NULL: nothing fixed */
    const ms_plan_scales *scales; /* NULL: identity */
    int keep;                     /* candidates kept (best first); <= 0: 10 */
    bool executable_only;         /* only what the engine runs */
} ms_plan_search_opts;

/* Searches; out owns its array (ms_plan_result_free). MS_ERR_INVALID when nothing is valid
 * (the message says which constraint excluded everything, e.g. a fixed knob). */
ms_status ms_plan_search(const ms_plan_problem *pb, const ms_plan_search_opts *opts,
                         ms_plan_result *out, ms_error *err);
void ms_plan_result_free(ms_plan_result *r);

/* One line comparing two estimates: which part of the step makes the difference. */
void ms_plan_explain_difference(const ms_plan_estimate *win, const ms_plan_estimate *other,
                                char *buf, size_t len);
/* "compute 78%, tp 9%, bubble 7%, dp 3%": the step's largest parts. */
void ms_plan_breakdown_str(const ms_plan_estimate *e, char *buf, size_t len);

#endif

/* advisor.h - the live advisor's core: from what the running job measured, which other
 * strategy would be faster, by how much, and why.
 *
 * The training loop calls ms_advisor_update every few steps with the analysis of its recent
 * steps (profiler/analysis.h) and the measured step time. The advisor:
 *
 *   1. prices the current strategy with the cost model (its engine workload: the program the
 *      job compiled, the same kernels and reshards);
 *   2. recalibrates: per compute class (GEMM, attention, elementwise, optimizer) and per mesh
 *      dim's collectives, measured time / predicted time becomes a scale factor, smoothed over
 *      calls (kept in the ms_advisor); what is left between the scaled prediction and the
 *      measured step becomes a per-step constant;
 *   3. prices every other strategy the validator (engine/plan/validate.h) passes for the job
 *      with those factors;
 *   4. returns those predicted at least `threshold` faster (default 0.10) and within the
 *      memory cap, best first, as ms_suggestion values (profiler/live.h) with evidence in
 *      words and figures; among them the current strategy with its layout searched
 *      (ms_advisor_set_placements);
 *   5. but none from a model that disagrees with the measure: a round in which the current
 *      strategy's prediction with the learned scales (without the per-step constant, which
 *      closes any gap by construction) is more than MS_ADVISOR_OFF_LIMIT off the measured
 *      step returns nothing; after MS_ADVISOR_OFF_ROUNDS such rounds in a row, ms_advisor_note
 *      says why until a round agrees again (the caller withdraws what is open). It keeps
 *      relearning meanwhile.
 *
 * Everything is pure computation: no communication, no locks; the advisor compiles (without
 * communicators) each candidate's program once and keeps it. Not thread-safe: one caller.
 */
#ifndef MS_PLAN_ADVISOR_H
#define MS_PLAN_ADVISOR_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/model/config.h"
#include "engine/model/strategy.h"
#include "engine/plan/cluster.h"
#include "engine/plan/cost.h"
#include "profiler/analysis.h"
#include "profiler/live.h"

#define MS_ADVISOR_DEFAULT_THRESHOLD 0.10
/* The model is off when its prediction of the current step differs from the measured one by
 * more than this share of it ... */
#define MS_ADVISOR_OFF_LIMIT 0.25
/* ... and it suggests nothing once that has held this many rounds in a row (10 s at the live
 * job's 2 s period: one noisy window is not a wrong model). */
#define MS_ADVISOR_OFF_ROUNDS 5

typedef struct ms_advisor ms_advisor;

/* The job: its model (any def, engine/model/model.h: a built-in one's config is priced as the
 * planner prices it, a program's own model from its compiled program; the def is copied, what
 * it borrows must outlive the advisor, a built-in config is copied too), world size (thread
 * ranks), global batch and sequence (a program's own model counts rows: seq is not read), and
 * the cluster the model is priced on (cpu-local for the threads backend; copied). */
ms_status ms_advisor_create(const ms_model_def *def, int world, int batch, int seq,
                            const ms_cluster *cluster, ms_advisor **out, ms_error *err);
void ms_advisor_destroy(ms_advisor *a);

/* One round. `current` is the strategy the measured steps ran under; `an` their analysis
 * (may be NULL or empty: then only the step time recalibrates); measured_step_s > 0 the
 * recent step time (e.g. the median of the window). Writes at most `max` suggestions to
 * `out` (ids stable per target strategy, state MS_SUGG_OPEN, applied_step -1) and their
 * count to *n. threshold <= 0 means the default. */
ms_status ms_advisor_update(ms_advisor *a, const ms_strategy *current, const ms_analysis *an,
                            double measured_step_s, double threshold, ms_suggestion *out, int max,
                            int *n, ms_error *err);

/* Set once the model has disagreed with the measured step for MS_ADVISOR_OFF_ROUNDS updates
 * in a row: why it suggests nothing ("the cost model is 41% off the measured step for 5 rounds
 * (predicts 58.0 ms, measured 98.1 ms); relearning from the trace; no suggestions until it
 * agrees within 25%"); "" otherwise. Owned by the advisor, valid until the next update. */
const char *ms_advisor_note(const ms_advisor *a);

/* The memory per rank a suggestion may need (the cap the job's switch applies); <= 0: the
 * cluster's usable memory shared by the ranks (the default). */
void ms_advisor_set_memory_cap(ms_advisor *a, double bytes);

/* The placement rules the job runs now (NULL: none, the model's own layout): the current
 * strategy is priced under them. A job under a layout it was given (tp > 1, cp 1) is also
 * offered that strategy with its layout searched (engine/plan/auto_place.h; searched once per
 * strategy and kept), target "placements": "auto", when predicted `threshold` faster; a job
 * that runs a complete layout (no_hints) is not. */
void ms_advisor_set_placements(ms_advisor *a, const ms_placement_rules *rules);

/* The layout the advisor searched for strategy s and priced its "placements searched"
 * suggestion with, copied into *out; false when it searched none for s (or found none).
 * Accepting that suggestion applies this layout, so the job runs what was priced and does not
 * search again. Same thread as ms_advisor_update. */
bool ms_advisor_searched_rules(const ms_advisor *a, const ms_strategy *s, ms_placement_rules *out);

/* How the views name strategy s under a layout that is the whole of its placements (searched,
 * "*": "complete"): "dp2 x tp2, placements searched", at most n bytes (the views take 64). The
 * advisor's suggestion of a searched layout is named so, and so is the job that runs one. */
char *ms_advisor_layout_name(const ms_strategy *s, char *buf, size_t n);

/* The scale factors learned so far (identity before the first update). */
void ms_advisor_scales(const ms_advisor *a, ms_plan_scales *out);

/* The prediction for one executable strategy with the learned scales. */
ms_status ms_advisor_predict(ms_advisor *a, const ms_strategy *s, ms_plan_estimate *out,
                             ms_error *err);

/* After the job switched to s->target: predicted against measured gain, as one sentence, e.g.
 * "predicted 22% faster (118.0 ms per step), measured 19% faster (121.5 ms against 150.0 ms)".
 * measured_before_s is the step time before the switch (s->current_step_s when <= 0). s is
 * NULL for a direct request (a strategy posted or --switch): no prediction, the measure alone.
 * The job's one report of a switch, on stdout and in the views. */
void ms_advisor_switch_result(const ms_suggestion *s, double measured_before_s,
                              double measured_after_s, char *buf, size_t len);

#endif

/* validate.h - the one judgement of a strategy against a job.
 *
 * Every door a strategy comes in by (the CLI's flags and --strategy file, --switch, the
 * dashboard's POST, an accepted suggestion, the trainer's switch) and everything that proposes
 * one (the planner's executable flag, the advisor) asks ms_strategy_validate, so a strategy is
 * refused for the same reason, in the same words, wherever it comes from. The planner prices
 * strategies the engine cannot run yet; it asks only ms_strategy_check, the first part.
 */
#ifndef MS_PLAN_VALIDATE_H
#define MS_PLAN_VALIDATE_H

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/model/strategy.h"

/* Whether s is a well-formed strategy for the model and the job, runnable or not: degrees
 * multiply to the world (without overflow), tp and tp x cp divide the heads, pp divides the
 * layers (or pp_layers has pp entries adding up to them), cp divides the sequence, the
 * sequence fits n_positions, sp has tp > 1, ZeRO is 0-3 and, above 0, has dp >= 2 to shard
 * over, dp divides the batch and the
 * micro-batch size and count make it, a schedule other than 1F1B and virtual stages have a
 * pipeline to run on, a replicated head has tp > 1. MS_ERR_INVALID names the rule and the fix. */
ms_status ms_strategy_check(const ms_strategy *s, const ms_model_config *cfg,
                            const ms_job_shape *job, ms_error *err);
/* The same for any model (engine/model/model.h): its blocks stand for the layers, and its
 * check hook adds what the model itself asks (the built-in models: heads and positions). */
ms_status ms_strategy_check_def(const ms_strategy *s, const ms_model_def *d,
                                const ms_job_shape *job, ms_error *err);

/* The validator: ms_strategy_check; then whether this engine runs s, one reason per knob it
 * does not run yet ("pipeline parallelism (pp 2) is predicted only; the engine does not run it
 * yet"); then, with mem_cap_bytes > 0, whether the engine's compiled program (activations),
 * parameters, gradients and Adam moments fit mem_cap_bytes per rank (compiles the program
 * without communicators: milliseconds for small models). Pure. */
ms_status ms_strategy_validate(const ms_strategy *s, const ms_model_config *cfg,
                               const ms_job_shape *job, double mem_cap_bytes, ms_error *err);
/* The same for any model: a def with `lm` is validated as that config; a program's own model
 * gets ms_strategy_check_def, then the memory of its compiled chunks (the planner's engine
 * workload: parameters, gradients, Adam moments and the arena) against mem_cap_bytes. */
ms_status ms_strategy_validate_def(const ms_strategy *s, const ms_model_def *d,
                                   const ms_job_shape *job, double mem_cap_bytes, ms_error *err);

#endif

/* diagram.h - a pipeline schedule drawn as stages over time, with its bubble. */
#ifndef MS_PIPELINE_DIAGRAM_H
#define MS_PIPELINE_DIAGRAM_H

#include <stdio.h>

#include "engine/core/status.h"
#include "engine/model/strategy.h"

/* Prints kind's schedule on p stages with m micro-batches and v virtual stages per rank: one
 * row per stage, time running right, one cell per unit of time from a simulation with F, B
 * and W one unit each (the full backward of 1f1b, gpipe and interleaved, B, takes two cells).
 * A cell names the action and its micro-batch ("F3", "B3", "W3"; with virtual stages the
 * local chunk as a letter, "F3a", "F3b"); "." is idle. Rows wrap at 100 columns, each part
 * under a time ruler. Then, per stage, the bubble fraction and the peak in-flight units
 * (schedule.h) against their bound, the mean bubble, and the formula's bubble for the
 * schedule. Errors: what ms_pp_schedule_check refuses; nothing is printed then. */
ms_status ms_pp_schedule_print(FILE *f, ms_schedule kind, int p, int m, int v, ms_error *err);

#endif

/* train_job.h - `meshscope train` as a job: a trainer per rank stepping through the run, the
 * per-step control exchange when live views or --switch ask for it, tracing, logging, the
 * closing evaluation, the text sample and the checkpoint.
 */
#ifndef MS_TRAIN_JOB_H
#define MS_TRAIN_JOB_H

#include "job/job.h"

/* Called by every rank before each step when set; NULL in the meshscope binary. Only test
 * builds install one (tests/fault_hooks.c, linked into meshscope-faults), to make a rank fail
 * the way a real one does. Set before the job starts; never changed while it runs. */
typedef void (*train_step_hook)(const ms_ctx *ctx, int step, int timeout_s);
extern train_step_hook train_job_step_hook;

/* Runs the whole job for parsed options (all checks before any rank starts). Returns the
 * process exit code: 0, 1 (the run failed; the message is printed) or 2 (bad input). */
int train_job_run(const run_opts *o);

#endif

/* live_job.h - the live side of a training job: the live model (profiler/live.h), the
 * dashboard (web/) and the TUI (tui/) that read it, and the control exchange that every
 * rank runs at each step boundary so that all ranks act on the same request at the same
 * step (rank 0 decides, everyone receives its decision).
 *
 * Ownership: the process that hosts rank 0 opens the job (threads backend: before the ranks
 * start, shared by them; MPI: rank 0's process) and closes it after the ranks finish. Other
 * MPI processes have no live model and only receive decisions.
 */
#ifndef MS_LIVE_JOB_H
#define MS_LIVE_JOB_H

#include <stdbool.h>

#include <pthread.h>

#include "engine/core/xalloc.h"
#include "engine/model/config.h"
#include "profiler/advisor.h"
#include "engine/model/strategy.h"
#include "profiler/live.h"
#include "cli/session.h"
#include "tui/tui.h"
#include "web/web.h"

typedef struct live_job {
    const run_opts *o;
    int world_size;
    ms_model_config cfg;
    ms_live *live; /* NULL on MPI ranks other than 0 */
    ms_web *web;
    ms_tui *tui;
    int switch_step; /* --switch: the step, -1 if none */
    char switch_json[1024];
    /* The advisor runs on the live model's thread; rank 0 tells it the current strategy. */
    ms_advisor *advisor; /* NULL without live views */
    ms_cluster cluster;
    pthread_mutex_t mu; /* guards current */
    ms_strategy current;
    ms_strbuf epilogue; /* rank 0's closing lines while the TUI owns the terminal */
} live_job;

/* The median of n values (0 when n is 0); v is not modified. */
double live_job_median(const double *v, int n);

/* Rank 0 after a switch (and at the start): the strategy the steps now run under. */
void live_job_set_current(live_job *j, const ms_strategy *s);

/* Whether the options ask for any of it (--web, --tui, --switch). */
bool live_job_wanted(const run_opts *o);

/* Checks --switch against the model and the world before any rank starts. */
ms_status live_job_check_options(const run_opts *o, int world_size, ms_error *err);

/* Loads the model config, checks --switch, creates the live model, starts the dashboard (and
 * prints its one line) and the TUI. */
ms_status live_job_open(live_job *j, const run_opts *o, int world_size, ms_error *err);
/* The ranks finished: a last snapshot; with a TUI, waits until the user quits it. */
void live_job_finish(live_job *j);
/* Gives the terminal back (TUI), stops the dashboard, prints the kept closing lines. */
void live_job_close(live_job *j);

/* Checks a target strategy against the job: mesh size equals the world, the model's heads
 * divide, the batch divides by dp. The reason names the fix. */
ms_status live_job_check_target(const live_job *j, const ms_strategy *s, ms_error *err);

typedef enum control_kind { CONTROL_NONE, CONTROL_STOP, CONTROL_SWITCH } control_kind;

typedef struct control {
    control_kind kind;
    int32_t suggestion;  /* the accepted suggestion, 0 for a direct request or --switch */
    char strategy[4096]; /* CONTROL_SWITCH: the target as strategy JSON */
} control;

/* Collective over comm (every rank, every step boundary, same step): rank 0 (j non-NULL
 * there) takes the oldest request from the control queue, or the --switch schedule at its
 * step, and every rank receives the same decision in *out. */
ms_status live_job_control(live_job *j, ms_comm *comm, int step, control *out, ms_error *err);

#endif

/* live_job.h - the live side of a training job: the live model (profiler/live.h), the
 * dashboard (web/) and the TUI (tui/) that read it, the advisor's rounds, and the control
 * protocol that every rank runs at each step boundary so that all ranks act on the same request
 * at the same step (rank 0 decides, everyone receives its decision, the trainer carries it out).
 * What a switch did is told to the live model, which owns every suggestion's state.
 *
 * Ownership: the process that hosts rank 0 opens the job (threads backend: before the ranks
 * start, shared by them; MPI: rank 0's process) and closes it after the ranks finish. Other
 * MPI processes have no live model and only receive decisions. The fields under "rank 0" are
 * touched by rank 0's thread only.
 */
#ifndef MS_LIVE_JOB_H
#define MS_LIVE_JOB_H

#include <stdbool.h>

#include <pthread.h>

#include "engine/core/xalloc.h"
#include "engine/train/trainer.h"
#include "job/job.h"
#include "profiler/advisor.h"
#include "profiler/live.h"
#include "tui/tui.h"
#include "web/web.h"

/* The longest strategy JSON a control message carries (the dashboard's body cap). */
#define LIVE_JOB_MAX_STRATEGY 65536

/* Verdicts of the target check kept per job: the check compiles the model for the memory
 * cap, which must not stall the dashboard's thread (a POST) each time. */
#define LIVE_JOB_VERDICTS 32

typedef struct live_verdict {
    ms_strategy s;
    ms_status st;
    char msg[MS_ERROR_MSG_MAX];
} live_verdict;

/* Step times kept to compare a switch's prediction with what it measured. */
#define LIVE_JOB_RECENT 16

typedef struct live_job {
    const run_opts *o;    /* borrowed */
    const job_plan *plan; /* borrowed: the model config and the world size */
    ms_live *live;        /* NULL on MPI ranks other than 0 */
    ms_web *web;
    ms_tui *tui;
    int switch_step;     /* --switch: the step, -1 if none */
    char *switch_json;   /* --switch: the target (owned) */
    bool switch_taken;   /* rank 0: --switch's step came */
    ms_advisor *advisor; /* runs on the live model's thread; NULL without live views */
    ms_cluster cluster;  /* what the advisor prices: cpu-local, or the GPUs' preset */
    int gpus;            /* CUDA devices the ranks share (0: a CPU job) */
    pthread_mutex_t mu;  /* guards current (and its rules), current_since, has_current, the
                            priced layout and the verdicts */
    ms_strategy current;
    ms_placement_rules current_rules;
    int64_t current_since; /* the first step that ran `current` */
    bool has_current;
    /* The layout the advisor priced its "placements searched" suggestion with (the live thread
     * sets it, under mu): accepting that suggestion applies it rather than searching again. */
    ms_placement_rules *priced_layout;
    int32_t priced_layout_id;                 /* the suggestion it belongs to, 0: none */
    live_verdict verdicts[LIVE_JOB_VERDICTS]; /* guarded by mu; a ring */
    int n_verdicts, next_verdict;
    bool warmed;        /* the live thread has checked every mesh of this world once */
    ms_strbuf epilogue; /* rank 0's closing lines while the TUI owns the terminal */
    /* rank 0: recent step times and the switch being measured */
    double recent[LIVE_JOB_RECENT];
    int n_recent;
    int64_t measure_from; /* first step under the new strategy, -1: none pending */
    int32_t measured_suggestion;
    double before_ms;
} live_job;

/* The median of n values (0 when n is 0); v is not modified. */
double live_job_median(const double *v, int n);

/* Whether the options ask for any of it (--web, --tui, --switch). */
bool live_job_wanted(const run_opts *o);

/* Checks --switch against the model and the world before any rank starts. */
ms_status live_job_check_options(const run_opts *o, const job_plan *plan, ms_error *err);

/* Checks --switch, creates the live model, starts the dashboard (and prints its one line) and
 * the TUI. */
ms_status live_job_open(live_job *j, const run_opts *o, const job_plan *plan, ms_error *err);
/* The live job rank ctx reports to, in *out: `shared` under threads (opened before the ranks
 * start, or NULL), under MPI one that rank 0 opens here into `own` (NULL on other ranks).
 * Release with live_job_release_rank(own). */
ms_status live_job_for_rank(ms_ctx *ctx, const run_opts *o, const job_plan *plan, live_job *shared,
                            live_job *own, live_job **out, ms_error *err);
/* Finishes and closes `own` if this rank opened it (live_job_for_rank). */
void live_job_release_rank(live_job *own);
/* The ranks finished: a last snapshot; with a TUI, waits until the user quits it. */
void live_job_finish(live_job *j);
/* Gives the terminal back (TUI), stops the dashboard, prints the kept closing lines. */
void live_job_close(live_job *j);

/* The one check of a target strategy for this job: the validator (engine/plan/validate.h)
 * for the job's world, batch and sequence, with the memory cap per rank. The reason names the
 * fix. */
ms_status live_job_check_target(const live_job *j, const ms_strategy *s, ms_error *err);

typedef enum control_kind { CONTROL_NONE, CONTROL_STOP, CONTROL_SWITCH } control_kind;

typedef struct control {
    control_kind kind;
    int32_t suggestion; /* the accepted suggestion, 0 for a direct request or --switch */
    char *strategy;     /* CONTROL_SWITCH: the target as strategy JSON (owned) */
} control;

void control_free(control *c);

/* Collective over comm (every rank, every step boundary, same step): rank 0 (j non-NULL
 * there) takes the oldest request from the control queue, or the --switch schedule at its
 * step, and every rank receives the same decision in *out (free with control_free). */
ms_status live_job_control(live_job *j, ms_comm *comm, int step, control *out, ms_error *err);

/* Carries out a decision on every rank: a switch moves the trainer to the target; a target
 * the job cannot take is refused (said in the views and on stdout unless quiet) and training
 * goes on. Rank 0 records the switch so that live_job_step_done reports predicted against
 * measured gain once the new strategy has run a few steps. j may be NULL (no live views on
 * this rank). Fails only when the switch itself failed. */
ms_status live_job_apply(live_job *j, ms_ctx *ctx, ms_trainer *t, const control *c, int step,
                         bool quiet, ms_error *err);

/* Rank 0 after each step: the step record for the views, the step time for the switch
 * report. */
void live_job_step_done(live_job *j, const ms_trainer *t, const ms_step_result *r, double ms);

/* Rank 0 once training has ended, its last step `last_step`: the control queue closes (later
 * requests are refused), and each switch that was asked for and will never be carried out (a
 * request still queued, --switch's step not reached) is said, on stdout (quiet: kept for
 * after the TUI) and in the views, where an accepted suggestion becomes dropped. j may be
 * NULL. */
void live_job_end(live_job *j, int64_t last_step, bool quiet);

#endif

/* job.h - a job: the options of a train, eval or explain run, the strategy they resolve to,
 * and the launch of its ranks.
 *
 * A job sits above the engine and the views: it turns options into a trainer per rank
 * (engine/train/trainer.h), and, for a training job with live views, owns the live model,
 * the dashboard, the TUI and the control protocol (job/live_job.h). cli/ only parses flags
 * into run_opts and calls in here.
 */
#ifndef MS_JOB_H
#define MS_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model/config.h"
#include "engine/model/strategy.h"
#include "engine/runtime/ctx.h"
#include "engine/train/trainer.h"

typedef struct run_opts {
    const char *model, *data, *strategy_file, *log_jsonl, *save, *checkpoint, *trace;
    const char *loss;              /* --loss: an ONNX model's loss output */
    const char *save_dir, *resume; /* --save-dir, --resume: distributed checkpoints */
    int save_every, keep;          /* --save-every (0: at the end), --keep (0: 3) */
    const char *web;               /* --web HOST:PORT: serve the dashboard */
    const char *web_token_file;    /* --web-token-file: its token there, mode 0600 */
    const char *switch_spec;       /* --switch STEP:STRATEGY_JSON: switch strategy at that step */
    bool tui;                      /* --tui: the terminal view */
    double advise_threshold;       /* suggest strategies predicted at least this much faster */
    double memory_cap_mib;    /* refuse switches needing more per rank; 0: the machine's share */
    ms_strategy strat;        /* the strategy flags (MS_STRATEGY_SETTINGS), over the defaults */
    uint32_t strat_given;     /* bit MS_SET_x: that setting's flag was given */
    int device;               /* --device: an ms_device_choice */
    bool offload_serial;      /* --offload-serial: that AdamW inside the step, not overlapped */
    double auto_time_limit_s; /* --auto-time-limit: the placement search's solver; 0: 10 s */
    ms_backend_kind backend;
    int steps, batch, seq, warmup, sample, batches, log_every, eval_every;
    int threads;            /* BLAS threads per rank; 0 = cores / ranks */
    int timeout_s;          /* --timeout-s: communicator timeout; 0 = the default (60 s) */
    const char *flight_dir; /* --flight-dir: flight recorder dumps; NULL: ./meshscope-flight */
    int trace_from;         /* first traced step */
    uint64_t seed;
    double lr, min_lr, weight_decay, clip, val_fraction;
    ms_on_nonfinite on_nan; /* --on-nan stop|skip */
} run_opts;

/* The job's model and strategy, resolved once before any rank starts: the config is read
 * here and nowhere else; the strategy comes from --strategy FILE (with its placement rules;
 * the strategy flags are then not read) or the strategy flags (one per setting of
 * MS_STRATEGY_SETTINGS: --dp, --tp, --zero, ...) and passes the validator
 * (engine/plan/validate.h) for the model, the batch, the sequence and its own world size. */
typedef struct job_plan {
    /* The model: a program's own (job_use_model), else the built-in one of --model's config
     * (def.lm points at cfg, so a plan is not copied once read) */
    ms_model_def def;
    ms_model_config cfg;
    ms_strategy strat;
    ms_placement_rules rules; /* the strategy file's "placements"; n = 0 without ("auto": the
                                 search's, once job_plan_validate ran) */
    int world_size;
    ms_device_kind device; /* where the ranks compute (job_plan_validate resolves --device) */
} job_plan;

/* The gradient bucket a CUDA job takes when --bucket-mb is left at its default: NCCL calls
 * cost microseconds each, and one per parameter tensor after the backward would neither
 * overlap with it nor amortise that (the planner prices 25 MiB on GPU clusters too). */
#define JOB_CUDA_BUCKET_MB 25

ms_status job_plan_resolve(const run_opts *o, job_plan *out, ms_error *err);
/* Releases what reading the plan opened (an ONNX model's parsed file); a no-op otherwise. */
void job_plan_free(job_plan *plan);
/* A program that brings its own model (examples/, meshscope_main_with_model) hands it here
 * before the job reads its plan: train, eval and explain then run `def` (copied; what it
 * borrows outlives the process's jobs) instead of a --model config. */
void job_use_model(const ms_model_def *def);
/* Whether a program handed its model, that model (NULL without) and its name (NULL without). */
bool job_has_model(void);
const ms_model_def *job_model(void);
const char *job_model_name(void);

/* The gradient bucket of a job in MiB (0: none): a strategy file's own (from_file), else the
 * --bucket-mb flag, else at its default (flag < 0) JOB_CUDA_BUCKET_MB on a CUDA device where
 * strategy s reduces gradients over dp or cp, and none elsewhere. */
double job_bucket_mb(double flag, bool from_file, const ms_strategy *s, ms_device_kind kind);

/* job_plan_resolve in two halves. Read: the config and the strategy, well-formed for the job
 * (ms_strategy_check: what the planner can price, such as a pipeline explain can draw).
 * Validate: whether this engine runs it (ms_strategy_validate), on which device; a
 * --bucket-mb left at its default then takes that device's (job_bucket_mb). */
ms_status job_plan_read(const run_opts *o, job_plan *out, ms_error *err);
ms_status job_plan_validate(const run_opts *o, job_plan *plan, ms_error *err);

/* The automatic placement search for strategy s of the job (its model, world, batch and
 * sequence) around `pins` (may be NULL), on this machine's cluster (cpu-local, or gpu-local
 * on CUDA); r->rules is the layout. Before the ranks start ("placements": "auto" in the
 * strategy file) and for a live switch to such a target. */
struct ms_auto_place_result;
ms_status job_auto_placements(const run_opts *o, const job_plan *plan, const ms_strategy *s,
                              const ms_placement_rules *pins, struct ms_auto_place_result *r,
                              ms_error *err);
/* One line on stdout saying what the search found and what the runner-up would cost. */
void job_auto_placements_say(const struct ms_auto_place_result *r);

/* Checks before the first step that every output can be written: --save, --trace and
 * --log-jsonl must not name a directory, and their directory must take a new file (a probe
 * file is created and removed). The message names the flag, the path and the reason, so a
 * long run never ends by failing to write its result. */
ms_status job_check_outputs(const run_opts *o, ms_error *err);

/* The strategy's name as every view gives it (the log, the TUI, the dashboard): a layout that is
 * the whole of its placements (a searched one) is named as the suggestion that brings it, "dp1 x
 * tp4, placements searched", so a switch of placements alone shows as a switch. rules may be
 * NULL. Returns buf. */
char *job_strategy_name(const ms_strategy *s, const ms_placement_rules *rules, char *buf, size_t n);
/* Opens --data as the model's data before any rank starts and checks that it feeds the
 * model's inputs (ms_model_def_open_data, ms_model_def_check_source): a bad file is bad input,
 * said once. The process's ranks share the source (read-only once open); the caller closes it
 * after they joined. */
ms_status job_open_data(const run_opts *o, const job_plan *plan, double val_fraction,
                        ms_batch_source **out, ms_error *err);

/* --save-dir's owner: the process that hosts world rank 0 takes the folder's lock
 * (ms_dir_lock) for the job's life, so that a second job saving there is refused before it
 * trains (the message names the folder, the holder's pid and the fix). *fd receives the lock
 * (-1 when there is nothing to hold: no --save-dir, or another rank's process); the caller
 * releases it with ms_dir_unlock once the job is over. */
ms_status job_claim_save_dir(const run_opts *o, int *fd, ms_error *err);

/* The trainer options the flags describe (inference: no optimizer state). */
ms_train_opts job_train_opts(const run_opts *o, bool keep_logits, bool inference);

/* Runs fn on the job's ranks (threads: world_size of them; mpi: this process, checked against
 * the world mpirun started). Under MPI, once a communicator has failed (a rank timed out or
 * died) the error is printed as "meshscope CMD: message" and the whole job ends with
 * MPI_Abort: MPI_Finalize would wait forever for a stalled rank. Likewise on threads, when a
 * rank has failed and the ranks still running have not returned one communicator timeout
 * later (asleep, stuck in a kernel), it prints that, the error and the flight recorder's
 * diagnosis and the process exits 1 without them. Otherwise returns the first failure, for
 * the caller to print. */
ms_status job_launch(const char *cmd, const run_opts *o, const job_plan *plan, ms_rank_fn fn,
                     void *arg, ms_error *err);

/* After a failed launch: when this process's ranks dumped their flight recorders (a
 * communicator timed out or broke), prints to stderr what `meshscope doctor` says of those
 * dumps (mpi: this process holds only its own rank's). job_launch does it itself before an MPI
 * abort. */
void job_report_flight(const char *cmd, bool mpi);

#endif

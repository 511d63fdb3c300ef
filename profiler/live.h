/* live.h - the one live model that the TUI and the web dashboard read: immutable snapshots
 * of a running (or finished) job, built off the training threads, plus the control queue
 * through which the views ask the job for something (accept a suggestion, switch strategy,
 * stop).
 *
 * Data flow:
 *
 *   rank 0 loop --ms_live_step--------------+
 *   rank rings  --read by the live thread---+--> window of events --ms_analyze--> snapshot
 *   (MPI: rank 0 --ms_live_feed_events------+)                                      |
 *   advisor     --ms_live_set_suggestions---+                 ms_live_acquire <-----+
 *                                                        (TUI, web, /metrics, SSE)
 *   views --ms_live_post--> control queue --ms_live_take--> rank 0 at a step boundary
 *
 * Threads: the training ranks only append (a step record under a short mutex, events into
 * their own lock-free rings). One live thread reads the rings, keeps the last `window_steps`
 * steps of events, analyses them and publishes a new snapshot whenever a step completes
 * (and at least every tick). Readers take a reference to the latest snapshot under a
 * mutex held for a pointer copy; nothing a view does waits for training or the reverse.
 *
 * Ownership: the creator owns the ms_live (ms_live_destroy stops its thread). Recorders
 * attached with ms_live_attach_recorder are borrowed until ms_live_detach_recorder (or
 * ms_live_stop). A snapshot returned by ms_live_acquire is owned by the caller's reference: release
 * it with ms_snapshot_release; it stays valid and unchanged however long it is held.
 */
#ifndef MS_LIVE_H
#define MS_LIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "profiler/analysis.h"
#include "engine/core/event.h"
#include "profiler/record/recorder.h"

#define MS_LIVE_MAX_SUGGESTIONS 8
#define MS_LIVE_TEXT            256
#define MS_LIVE_HANG_FACTOR     10.0
#define MS_LIVE_HANG_MIN_S      1.0

/* One training step as rank 0 saw it. */
typedef struct ms_live_step {
    int64_t step;
    double loss;
    double step_s;       /* wall time of the step on rank 0 */
    double tokens_per_s; /* global tokens / step_s */
    double lr, grad_norm;
    char strategy[64]; /* the strategy the step ran under, "dp2 x tp2" */
} ms_live_step;

/* One span of a rank's lane in the last complete step's timeline. Times are seconds from
 * the start of that step on the earliest rank (one clock: rank 0's). Idle is what no span
 * covers. */
typedef enum ms_lane_kind { MS_LANE_COMPUTE, MS_LANE_COMM, MS_LANE_KIND_COUNT } ms_lane_kind;
typedef struct ms_live_span {
    int32_t rank;
    uint8_t kind;     /* ms_lane_kind */
    double t0, t1;    /* seconds from the step start */
    char name[24];    /* op name or collective kind, "matmul", "all_reduce" */
    int16_t mesh_dim; /* comm spans: the mesh dim, -1 otherwise */
} ms_live_span;

/* One pipeline action (F, B or W of one micro-batch on one chunk) of the last complete
 * step, on its stage's lane. Times are seconds from the step's first action over all ranks,
 * so a lane's idle time is its bubble. */
typedef struct ms_live_pipe_block {
    int16_t stage;
    uint8_t action; /* ms_ev_pipe_action */
    uint8_t chunk;  /* local chunk (virtual stage) */
    int32_t mb;     /* micro-batch */
    double t0, t1;
} ms_live_pipe_block;

/* The pipeline view: one lane per stage, drawn from the stage's first rank (its other ranks
 * run the same schedule), for the last complete step. The schedule and the measured bubbles
 * are in the snapshot's analysis.pipe. step == -1 when there is nothing to show: no pipeline
 * (pp 1), or no complete step yet. */
typedef struct ms_live_pipeline {
    int64_t step;
    double wall_s;                  /* the step's first action start to last action end */
    int stages;                     /* lanes, = analysis.pipe.stages */
    int32_t rank[MS_AN_MAX_STAGES]; /* the rank drawn on each lane, -1 if none reported */
    ms_live_pipe_block *blocks;     /* by stage, then start */
    int n_blocks;
} ms_live_pipeline;

typedef struct ms_live_mem {
    uint64_t in_use, peak; /* bytes on the rank's device, latest sample */
    /* of in_use: parameters, gradients, optimizer state, activations (0: not split) */
    uint64_t params, grads, optim, acts;
    uint64_t host_optim; /* offload: the optimizer's host memory, apart from the device's */
} ms_live_mem;

typedef enum ms_suggestion_state {
    MS_SUGG_OPEN,
    MS_SUGG_PENDING, /* accepted; switches at the next step boundary */
    MS_SUGG_APPLIED, /* the job runs the target strategy now */
    MS_SUGG_DISMISSED,
    MS_SUGG_REFUSED,   /* accepted but refused by the job (reason in `result`) */
    MS_SUGG_DROPPED,   /* accepted, but training ended before a step boundary took it */
    MS_SUGG_WITHDRAWN, /* open, then withdrawn by the advisor: its model disagrees with the
                          measured step (why in `result`); reopens if suggested again */
    MS_SUGG_STATE_COUNT
} ms_suggestion_state;

const char *ms_suggestion_state_name(ms_suggestion_state s);

/* A strategy the advisor (or a user) proposes. `target_json` is the short form the control
 * API takes, {"dp": 2, "tp": 2, "sp": false} (cp when > 1). */
typedef struct ms_suggestion {
    int32_t id; /* unique within the job, > 0 */
    uint8_t state;
    char target[64];       /* "dp2 x tp2" */
    char target_json[256]; /* {"dp": 2, "tp": 2, "sp": false}, or with "placements": "auto" */
    char current[64];      /* the strategy it would replace */
    double predicted_gain; /* fractional step time saving, 0.25 = 25% faster */
    double predicted_step_s, current_step_s;
    char evidence[MS_LIVE_TEXT];     /* "tp all-reduce is 41% of the step; dp2 x tp2 halves it" */
    char memory_check[MS_LIVE_TEXT]; /* "fits: 38 MiB of 24 GiB per rank" */
    char diff[MS_LIVE_TEXT];         /* "dp 1 -> 2, tp 4 -> 2" */
    char result[MS_LIVE_TEXT]; /* after the switch: predicted vs measured gain, or why refused */
    int64_t applied_step;      /* the first step under the target, -1 until applied */
    uint8_t missed;            /* open: consecutive rounds that did not price it good enough */
} ms_suggestion;

/* What the live model describes: fixed when the job starts. */
typedef struct ms_live_info {
    char model[96];   /* config path or name */
    char backend[16]; /* "threads", "mpi", "trace" (a finished trace file) */
    int nranks;
    int64_t tokens_per_step; /* global batch x sequence */
    bool live;               /* false: a finished trace (meshscope serve) */
} ms_live_info;

/* An immutable view of the job at one moment. All arrays are owned by the snapshot. */
typedef struct ms_snapshot {
    uint64_t version; /* increases with every published snapshot */
    int64_t taken_ns; /* ms_now_ns when built */
    ms_live_info info;
    char strategy[64]; /* the current strategy */
    int64_t step;      /* latest completed step (-1: none yet) */
    bool finished;     /* the job has ended (or a trace file) */

    ms_live_step *history; /* oldest first, at most the history capacity */
    int n_history;

    /* Over the last `window_steps` complete steps of events: heatmaps (bytes, seconds; per
     * mesh dim), overlap, busbw, op breakdown, reshard table, step breakdown, stragglers,
     * the pipeline bubble. analysis.nranks == 0 when no events arrived yet. */
    ms_analysis analysis;
    double achieved_flops_per_s; /* sum of op FLOPs over ranks in the last step / its wall */

    ms_live_span *timeline; /* the last complete step, by rank then time */
    int n_timeline;
    int64_t timeline_step;
    double timeline_wall_s;

    ms_live_pipeline pipeline; /* pp > 1 only */

    ms_live_mem *mem; /* [info.nranks] */

    ms_suggestion suggestions[MS_LIVE_MAX_SUGGESTIONS];
    int n_suggestions;
    char last_event[MS_LIVE_TEXT]; /* e.g. "switched to dp2 x tp2 at step 120" */
    /* A collective waiting far longer than usual, before its timeout fires: "hang: all_reduce
     * seq 12 on 'dp' (ranks 0-3) has waited 3.1 s (usually 0.2 ms); not arrived: rank 3" from
     * the flight recorder (engine/comm/flight.h: more than MS_LIVE_HANG_FACTOR times the median
     * of its recent completions and more than MS_LIVE_HANG_MIN_S); "" when nothing hangs. */
    char hang_alert[MS_LIVE_TEXT];
    /* Why the advisor publishes no suggestions now: its cost model has disagreed with the
     * measured step for several rounds ("the cost model is 41% off the measured step for 5
     * rounds; ..."); "" while it suggests (ms_live_withhold_suggestions). */
    char advisor_note[MS_LIVE_TEXT];

    int refs_; /* private */
} ms_snapshot;

void ms_snapshot_release(const ms_snapshot *s);

/* --- the producer side ------------------------------------------------------------------- */

typedef struct ms_live ms_live;

typedef struct ms_live_opts {
    ms_live_info info;
    int history;      /* step records kept; 0 = 1024 */
    int window_steps; /* steps of events analysed; 0 = 4 */
    int tick_ms;      /* publish at least this often; 0 = 250 */
    /* The event window holds at most 2M events (368 MB) and allocates through its own
     * device: if that refuses, the window stops growing and the views say so. 0, or a byte
     * limit on that device (tests). */
    size_t window_limit_bytes;
} ms_live_opts;

ms_status ms_live_create(const ms_live_opts *opts, ms_live **out, ms_error *err);
/* Stops the live thread (if started) and frees everything; snapshots still held by readers
 * stay valid until released. */
void ms_live_destroy(ms_live *l);

/* Starts the live thread. Before that, ms_live_publish_now builds snapshots synchronously
 * (tests, meshscope serve). */
ms_status ms_live_start(ms_live *l, ms_error *err);
/* Stops the thread after one last snapshot; marks the job finished. Idempotent. */
void ms_live_stop(ms_live *l);
void ms_live_publish_now(ms_live *l);

/* Threads backend: each rank registers its recorder once (any thread, before or after
 * start); the live thread reads it directly. */
void ms_live_attach_recorder(ms_live *l, ms_recorder *rec);
/* Before a rank destroys its recorder: reads what is left in it, then forgets it. */
void ms_live_detach_recorder(ms_live *l, ms_recorder *rec);
/* MPI backend (rank 0) or a trace file: events (one time axis) and the groups they use. */
void ms_live_feed_events(ms_live *l, const ms_event *ev, size_t n);
void ms_live_feed_groups(ms_live *l, const ms_group *g, int n);

/* Rank 0, once per step (cheap: a copy under a mutex). */
void ms_live_step_done(ms_live *l, const ms_live_step *s);
void ms_live_set_strategy(ms_live *l, const char *strategy);
void ms_live_set_event(ms_live *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The suggestion lifecycle, one advisor round. `cur` is the list the views show (any
 * states), `fresh` the advisor's candidates of this round (best first, ids stable per target).
 * A suggestion opens when its target is predicted at least `open_at` faster, and stays open,
 * updated in place under the same id (gain, step times, evidence), while it is predicted at
 * least open_at / 2 faster: the gap is hysteresis, so a gain wobbling around the threshold
 * does not make the suggestion vanish and come back. It closes when accepted or dismissed
 * (its state changes), when for MS_SUGG_GRACE_ROUNDS rounds in a row its gain stays below
 * open_at / 2 or its target is not suggested (until then it keeps its last priced values, so
 * one noisy round cannot take away what a user is about to accept), or when the list is full and a
 * better suggestion for another target takes its place (superseded). Entries in other states are
 * kept as they are, and their ids never reopen; withdrawn ones excepted (the advisor's, not a
 * user's): they reopen when suggested at least open_at faster, else leave the list. The order is
 * stable: entries keep their places, new ones are appended best first. Writes at most
 * MS_LIVE_MAX_SUGGESTIONS to `out` and returns the count. Pure. */
int ms_suggestions_next(const ms_suggestion *cur, int n_cur, const ms_suggestion *fresh,
                        int n_fresh, double open_at, ms_suggestion *out);
/* Rounds an open suggestion survives without being priced good enough (about 10 s at the
 * advisor's 2 s period). */
#define MS_SUGG_GRACE_ROUNDS 5

/* The advisor's round is one of the two calls below. ms_live_set_suggestions applies
 * ms_suggestions_next to the shown list with its candidates (predicted at least open_at / 2
 * faster, so that open ones can stay open) and clears the advisor's note. Withdrawn entries
 * reopen there if their target is suggested at least open_at faster, and leave the list
 * otherwise (the advisor withdrew them, no one acted on them). */
void ms_live_set_suggestions(ms_live *l, const ms_suggestion *s, int n, double open_at);
/* The advisor does not trust its model (note, copied, says why; the views show it as the
 * snapshot's advisor_note): every open suggestion is withdrawn, with the note as its result;
 * pending and acted-on ones stay as they are. */
void ms_live_withhold_suggestions(ms_live *l, const char *note);
/* The suggestion lifecycle has one owner, this model: every state change is one of the calls
 * below (and accept / dismiss in ms_live_post, open in ms_live_set_suggestions). The job only
 * says what happened. A call whose suggestion is unknown, or not in the state it leaves, changes
 * nothing and returns false:
 *
 *   open -> pending (accepted) | dismissed              views, ms_live_post
 *   open -> withdrawn -> open | gone                     the advisor's round (above)
 *   pending -> applied | refused | dropped               the job, at a step boundary or the end
 *   applied -> applied, with the measured result         the job, SWITCH_MEASURE steps later */
/* The job runs the target from `step` on (unchanged: it ran it already, nothing moved). */
bool ms_live_suggestion_applied(ms_live *l, int32_t id, int64_t step, bool unchanged);
/* The job could not take the target; why names the reason. */
bool ms_live_suggestion_refused(ms_live *l, int32_t id, const char *why);
/* Training ended (at last_step) before a step boundary took the accepted suggestion. */
bool ms_live_suggestion_dropped(ms_live *l, int32_t id, int64_t last_step);
/* The switch's report (ms_advisor_switch_result's sentence) once it has been measured. */
bool ms_live_suggestion_measured(ms_live *l, int32_t id, const char *report);
/* A copy of suggestion id; false if unknown. */
bool ms_live_suggestion_get(ms_live *l, int32_t id, ms_suggestion *out);

/* The advisor: called on the live thread right after a snapshot is published, at most
 * every period_ms, with that snapshot; it may call ms_live_set_suggestions. It runs off the
 * training threads, so its cost never lands on a step. */
typedef void (*ms_live_advise_fn)(void *user, ms_live *l, const ms_snapshot *s);
void ms_live_set_advisor(ms_live *l, ms_live_advise_fn fn, void *user, int period_ms);

/* --- the reader side --------------------------------------------------------------------- */

/* The latest snapshot (never NULL once created: an empty one before any step). */
const ms_snapshot *ms_live_acquire(ms_live *l);
uint64_t ms_live_version(ms_live *l);
/* Waits until a snapshot newer than `version` is published or timeout_ms passes; returns the
 * latest version. For server-sent events. */
uint64_t ms_live_wait(ms_live *l, uint64_t version, int timeout_ms);

/* Writes the events of the current window as a Chrome trace (traces/trace_write.h). */
ms_status ms_live_write_trace(ms_live *l, const char *path, ms_error *err);

/* --- the control queue ------------------------------------------------------------------- */

typedef enum ms_live_req_kind {
    MS_REQ_ACCEPT,   /* accept suggestion `id` */
    MS_REQ_DISMISS,  /* dismiss suggestion `id` */
    MS_REQ_STRATEGY, /* switch to `strategy_json` (the --strategy JSON or the short form) */
    MS_REQ_STOP,     /* end training after the current step */
    MS_REQ_KIND_COUNT
} ms_live_req_kind;

typedef struct ms_live_req {
    uint8_t kind;
    int32_t id;
    char strategy_json[4096];
    int64_t step; /* set when queued: the latest completed step then (-1: none yet) */
} ms_live_req;

#define MS_LIVE_QUEUE 16 /* requests queued at most */

/* Checks a request before it is queued (pure and fast; runs on the caller's thread):
 * returns MS_OK or a failure whose message says why it is refused (the web answers 422).
 * Installed by the job; NULL accepts everything. */
typedef ms_status (*ms_live_validate_fn)(void *user, const ms_live_req *req, ms_error *err);
void ms_live_set_validator(ms_live *l, ms_live_validate_fn fn, void *user);

/* Views: validates, then queues. MS_ERR_INVALID (refused by the validator or unknown
 * suggestion id), MS_ERR_UNSUPPORTED (a finished job, one whose training has ended, or a
 * trace: nothing to control), or MS_ERR_NOMEM when the queue (MS_LIVE_QUEUE entries) is full.
 * Accepting marks the suggestion pending; dismissing marks it dismissed at once. */
ms_status ms_live_post(ms_live *l, const ms_live_req *req, ms_error *err);
/* Rank 0 at a step boundary: takes the oldest request; false when none. */
bool ms_live_take(ms_live *l, ms_live_req *out);
/* Rank 0 once training has ended (no step boundary will take a request again): every later
 * post is refused (MS_ERR_UNSUPPORTED), and the requests still queued move to out (room for
 * MS_LIVE_QUEUE), oldest first, for the job to report as not carried out; returns how many. */
int ms_live_close_control(ms_live *l, ms_live_req *out);

#endif

/* analysis.h - what the views show, computed from events alone (device-neutral: CPU and
 * GPU traces go through the same code). Pure functions over event arrays; no recorder.
 *
 *   heatmap      rank x rank bytes and time, overall and per mesh dim, over a step window;
 *                bytes per peer follow the collective's algorithm (see ms_bytes_per_peer)
 *   overlap      per rank, Holistic Trace Analysis' definition (docs/formats.md section 3):
 *                compute time during communication / communication time; plus exposed
 *                (non-overlapped) comm, in all and per step, and the share of the
 *                data-parallel ("dp") communication hidden under compute
 *   busbw        per collective kind and size, nccl-tests factors (docs/formats.md section 1)
 *   ops          time per operator (forward and backward)
 *   reshards     per transition kind (e.g. "P(sum) -> R"): count, bytes, time
 *   steps        per step: compute, exposed communication, idle
 *   stragglers   ranks that are consistently the last to enter collectives
 *   pipeline     the measured bubble fraction per pipeline stage (ms_pipe_stats)
 *
 * Definitions used throughout: "compute" is the union of a rank's MS_EV_OP intervals, "comm"
 * the union of its MS_EV_COLL intervals (events of one kind may nest or overlap, so time is
 * never double counted); overlapped = |compute n comm|, exposed comm = comm - overlapped.
 * Sums "over ranks" add every rank's events (an all-reduce on 4 ranks counts 4 times).
 */
#ifndef MS_ANALYSIS_H
#define MS_ANALYSIS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/event.h"

#define MS_AN_MAX_RANKS  256
#define MS_AN_MAX_DIMS   6
#define MS_AN_MAX_STAGES 64 /* pipeline stages analysed (the executor runs at most 64 chunks) */

/* A rank is reported as a straggler when, over at least MS_AN_STRAGGLER_MIN_COUNT complete
 * collective instances (every member's event present, group size > 1, point-to-point
 * excluded), it entered last, more than MS_AN_STRAGGLER_MIN_LAG_NS after the first member,
 * in more than MS_AN_STRAGGLER_FRACTION of them. The lag floor keeps scheduling noise
 * (threads entering microseconds apart) from naming anyone. */
#define MS_AN_STRAGGLER_MIN_LAG_NS 100000 /* 100 us */
#define MS_AN_STRAGGLER_FRACTION   0.5
#define MS_AN_STRAGGLER_MIN_COUNT  3

/* Bytes a rank sends to each peer for one collective event: out[p] for group positions
 * p = 0..group_size-1, out[me] = 0 (me = group_rank). B = c->bytes in the nccl-tests
 * convention (all_reduce/broadcast: the buffer; reduce_scatter: the whole input;
 * all_gather: the whole output; all_to_all: everything this rank sends, own block included;
 * send_recv: what this rank sent). With n = group_size:
 *
 *   algo "ring*"       all_reduce      2(n-1)/n * B to the next rank (me+1 mod n) only
 *                      reduce_scatter  (n-1)/n * B to the next rank
 *                      all_gather      (n-1)/n * B to the next rank
 *                      broadcast       B to the next rank, except the rank before the root
 *   any other algo     all_reduce      2B/n to every peer (direct reduce-scatter + all-gather)
 *   ("direct",         reduce_scatter  B/n to every peer (the peer's block of the input)
 *    "shm-direct",     all_gather      B/n to every peer (this rank's block)
 *    "mpi", unknown)   broadcast       B to every peer from the root (c->root), 0 elsewhere
 *   any algo           all_to_all      B/n to every peer (equal blocks assumed)
 *                      send_recv       B to the other member of a 2-member group (the
 *                                      probes record one event per send that way); with
 *                                      n > 2, B/(n-1) to every peer (peers unknown)
 *                      barrier, split  nothing
 *
 * The row sum (what the rank sends in all) is therefore 2(n-1)/n*B for all_reduce, (n-1)/n*B
 * for reduce_scatter, all_gather and all_to_all, as the nccl-tests bus-bandwidth factors
 * assume; broadcast (n-1)*B from a direct root, B per forwarding ring rank; send_recv B. */
void ms_bytes_per_peer(const ms_ev_coll *c, double *out);

typedef struct ms_heatmap {
    int nranks;
    int mesh_dim;    /* -1 = all traffic */
    double *bytes;   /* [nranks * nranks], src row, dst column */
    double *seconds; /* [nranks * nranks] time spent in collectives with that peer: a
                        collective's duration is added to every peer it sends bytes to */
} ms_heatmap;

typedef struct ms_rank_overlap {
    double comm_s, compute_s, overlapped_s, exposed_comm_s;
    double overlap_ratio; /* overlapped / comm (HTA); 0 when no comm */
    /* Exposed communication per step: within each of the rank's MS_EV_STEP spans, comm not
     * overlapped by compute, averaged over those steps (0 without steps). */
    int steps;
    double exposed_comm_step_s;
    /* The data-parallel share: collectives on the mesh dim whose communicator is named "dp"
     * (the gradient all-reduces, bucketed or not), their time, the part hidden under compute,
     * and hidden / dp comm (0 when none). */
    double dp_comm_s, dp_hidden_s, dp_hidden_ratio;
} ms_rank_overlap;

typedef struct ms_busbw_row {
    uint8_t coll;
    int16_t mesh_dim; /* -1: not a mesh dim's communicator (world, custom) */
    int group_size;
    uint64_t bytes;
    int count;        /* events, over ranks */
    double mean_s;    /* mean duration over those events */
    double busbw_gbs; /* bytes / mean_s * ms_coll_busbw_factor(coll, group_size) / 1e9 */
} ms_busbw_row;

typedef struct ms_op_row {
    char name[24]; /* op name, e.g. "matmul" */
    uint8_t phase;
    int count;
    double seconds, flops; /* summed over ranks */
} ms_op_row;

typedef struct ms_reshard_row {
    char transition[2 * MS_EV_PL_MAX + 8]; /* "[P(sum), R] -> [R, R]" */
    int count;
    double bytes, seconds; /* summed over ranks */
} ms_reshard_row;

/* One step, as seen on its slowest rank (the one with the longest MS_EV_STEP span): all
 * four numbers come from that rank, so wall = compute + exposed_comm + idle. Idle is time
 * inside the step with neither an op nor a collective running (data loading, the optimizer
 * and host overhead land here unless recorded as ops). */
typedef struct ms_step_row {
    int64_t step;
    int rank; /* the slowest rank */
    double wall_s, compute_s, exposed_comm_s, idle_s;
} ms_step_row;

typedef struct ms_straggler {
    int rank;
    double last_fraction; /* share of its collectives this rank entered last (by > the lag
                             floor) */
    double mean_lag_s;    /* mean delay behind the first arrival, when it was last */
    int count;            /* complete collective instances it took part in */
} ms_straggler;

/* The pipeline bubble as measured, from the MS_EV_PIPE events (one per F, B or W action).
 * For each step and each rank with actions in it:
 *   window  from the first action's start to the last action's end over ALL ranks of the
 *           step: the pipeline's span (the step's data loading and optimizer lie outside it,
 *           and are not the schedule's bubble)
 *   busy    the union of the rank's action spans in the step
 *   bubble  1 - busy / window
 * A stage's bubble is the mean over its ranks (those whose actions name the stage); the
 * overall bubble the mean over all ranks. `last_*` is the latest step of the window, the
 * other figures the mean over the window's steps. The schedule (name, p, m, v) is that of the
 * latest action; actions of another schedule (before a switch) are left out. stages == 0
 * when the window has no pipeline actions; stages == 1 is gradient accumulation on one
 * stage (its "bubble" is the time between micro-batches). */
typedef struct ms_pipe_stats {
    int stages, virtual_stages, micro_batches;
    char schedule[12];
    int n_steps;       /* steps with actions of this schedule */
    int64_t last_step; /* the latest of them */
    double bubble, last_bubble;
    double formula; /* the schedule's textbook bubble (ms_pipe_formula_bubble), NaN if none */
    /* The planner's prediction: its pipeline simulator (ms_pp_bubble_fraction: posted
     * transfers, as the executor runs them) with the window's mean F, B and W per action;
     * NaN without both F and B. Equal stages and instant transfers: what the measured bubble
     * adds to it is unequal stages, transfers, scheduling and noise. */
    double simulated;
    double mean_f_s, mean_b_s, mean_w_s;   /* those means (W: zb-h1's weight gradient, else 0) */
    int stage_ranks[MS_AN_MAX_STAGES];     /* ranks seen per stage */
    double stage_bubble[MS_AN_MAX_STAGES]; /* [s] for s < stages */
    double last_stage_bubble[MS_AN_MAX_STAGES]; /* the latest step only */
    double last_window_s;                       /* the latest step's window */
} ms_pipe_stats;

/* The bubble fraction a schedule has by its formula, with equal F and B times and free
 * transfers: (p-1)/(m+p-1) for 1f1b and gpipe, (p-1)/(v*m+p-1) for interleaved; 0 for p <= 1;
 * NaN for a schedule without one here (zb-h1 depends on the ratio of F, B and W, and unknown
 * names). */
double ms_pipe_formula_bubble(const char *schedule, int p, int m, int v);

typedef struct ms_analysis {
    int nranks;
    int64_t step_lo, step_hi; /* the window analysed, as asked */
    ms_heatmap all;
    ms_heatmap per_dim[MS_AN_MAX_DIMS]; /* [d] for d < n_dims */
    char dim_names[MS_AN_MAX_DIMS][16]; /* the group name seen on that dim, e.g. "tp" */
    int n_dims;
    ms_rank_overlap overlap[MS_AN_MAX_RANKS]; /* [r] for r < nranks */
    ms_busbw_row *busbw;                      /* by collective, group size, bytes, mesh dim */
    int n_busbw;
    ms_op_row *ops; /* most time first */
    int n_ops;
    ms_reshard_row *reshards; /* most time first */
    int n_reshards;
    ms_step_row *steps; /* by step */
    int n_steps;
    ms_straggler *stragglers; /* sorted, most late first; only consistent ones */
    int n_stragglers;
    ms_pipe_stats pipe;
} ms_analysis;

/* Analyses events of all ranks (any order) for steps [step_lo, step_hi] by each event's
 * step field. step_hi < 0: no upper bound, and with step_lo <= 0 events outside any step
 * (step -1, e.g. setup) count as well. Groups give the world ranks of each group id;
 * collectives whose group is not in the table are left out of the heatmaps (only).
 * Ranks must be below MS_AN_MAX_RANKS (MS_ERR_UNSUPPORTED otherwise).
 * The result owns its arrays: free with ms_analysis_free (also after a failure). */
ms_status ms_analyze(const ms_event *ev, size_t n, const ms_group *groups, int n_groups,
                     int64_t step_lo, int64_t step_hi, ms_analysis *out, ms_error *err);
void ms_analysis_free(ms_analysis *a);

/* The analysis as text (the `meshscope trace summary` output; the pipeline section for
 * pp > 1 only); file is a FILE *. */
void ms_analysis_print(const ms_analysis *a, void *file);

#endif

/* simulate.h - timing every stage's action list under rendezvous or posted transfers.
 *
 * Each stage takes its actions in order and a compute action takes its duration. The
 * transfers run one of two ways:
 *   rendezvous  the lists' own semantics (schedule.h): a batch of consecutive transfers is
 *               posted when the stage reaches it and completes when every op in it has met
 *               its partner (the batch holding the matching op, on the peer stage, is posted
 *               too) plus the transfer time. A set of stages each waiting in a batch whose
 *               partners are never posted is a deadlock, reported with the stages and the ops
 *               they wait on. What a list must survive to be accepted.
 *   posted      the trainer's executor (engine/train/stages.c): a compute's output is sent
 *               the moment it is made, without waiting for the receiver, and a compute waits
 *               only for its own input: F of model chunk k for F of k-1, B of k for B of k+1
 *               (the last chunk's B for its own F), each plus the transfer time. Transfers
 *               take no time of either stage; where the list has them does not matter. What
 *               the planner prices.
 *
 * Bubble fraction of a stage: (step - busy) / step, where step is when the last stage
 * finishes and busy the stage's compute time; the plan's bubble is the mean over stages.
 * Under 1f1b, gpipe and interleaved B is the full backward and costs b + w; under zb-h1 B
 * costs b and W costs w.
 */
#ifndef MS_PIPELINE_SIMULATE_H
#define MS_PIPELINE_SIMULATE_H

#include <stdbool.h>

#include "engine/core/status.h"
#include "engine/pipeline/schedule.h"

/* Durations of one unit's actions (one micro-batch on one chunk), in any time unit. */
typedef struct ms_pp_times {
    double f;    /* forward */
    double b;    /* input gradient */
    double w;    /* weight gradient */
    double comm; /* one transfer, from both sides posted (posted: from the send) to done */
    bool posted; /* false: rendezvous transfers; true: posted, as the executor runs them */
} ms_pp_times;

typedef struct ms_pp_stage_time {
    double busy;       /* compute time */
    double end;        /* when the stage's last action finished */
    double bubble;     /* (step - busy) / step */
    int peak_inflight; /* the most units held at once: F done, B (zb-h1: W) not yet */
} ms_pp_stage_time;

/* A simulated plan. Owns its arrays; ms_pp_timeline_free frees them. */
typedef struct ms_pp_timeline {
    int p;
    double step;             /* when the last stage finished */
    double bubble;           /* mean of the stages' bubble fractions */
    ms_pp_stage_time *stage; /* p entries */
    /* start[s][i], end[s][i]: action i of stage s; for a transfer, its batch's posting and
     * completion under rendezvous, and the stage's clock where the list has it when posted */
    double **start, **end;
} ms_pp_timeline;

/* Simulates plan with durations t (each finite and >= 0). Errors: a transfer without exactly
 * one matching op on its peer (MS_ERR_INVALID, naming it), a deadlock (MS_ERR_INVALID:
 * "deadlock: stage 0 waits in [send-act mb 3 chunk 0 to stage 1, ...]; stage 1 ..."; posted:
 * "deadlock: stage 0 waits for F mb 3 chunk 1's input; ..."). *out is filled on success
 * only. */
ms_status ms_pp_simulate(const ms_pp_plan *plan, const ms_pp_times *t, ms_pp_timeline *out,
                         ms_error *err);
void ms_pp_timeline_free(ms_pp_timeline *tl);

/* The planner's question: the bubble fraction of kind on p stages, m micro-batches and v
 * virtual stages, with one micro-batch's forward t_f, input gradient t_b and weight gradient
 * t_w on a whole stage (each chunk takes 1/v of them), instant posted transfers (the
 * executor's). 0 for p = 1.
 * Past 3p micro-batches it simulates 2p and 3p and extrapolates the idle time: past the
 * warm-up every p micro-batches repeat the same pattern, so it is affine in m (tested against
 * the full simulation); a search prices thousands of strategies this way. Errors:
 * what ms_pp_schedule_check refuses; durations negative, not finite or all 0. */
ms_status ms_pp_bubble_fraction(ms_schedule kind, int p, int m, int v, double t_f, double t_b,
                                double t_w, double *bubble, ms_error *err);

#endif

/* schedule.h - pipeline schedules as pure functions: what each stage does, in order.
 *
 * A schedule maps (kind, p stages, m micro-batches, v virtual stages per rank, stage) to the
 * ordered list of that stage's actions: compute (F, B, W) and point-to-point transfers. The
 * executor runs the list; the simulator (simulate.h) times it; the diagram (diagram.h) draws it.
 *
 * Model chunks (Megatron's interleaved layout): rank s holds model chunks c*p + s for local
 * chunk c = 0..v-1, so the model has p*v chunks and chunk k hands its output to chunk k+1 on
 * rank (k+1) % p. With v = 1 the chunk is the stage. The first model chunk reads the data (no
 * RECV_ACT, no SEND_GRAD); the last computes the loss in its F and starts its B from it (no
 * SEND_ACT, no RECV_GRAD).
 *
 * Transfers: consecutive comm actions in a list form ONE batch, posted together and returning
 * when all of them completed. Semantics are rendezvous (what a list must run under; the
 * trainer's executor, engine/train/stages.c, posts each send right after its compute without
 * waiting and receives right before the compute that needs it, which waits no longer than
 * this and so runs every list that runs here; the simulator times both): a send completes
 * when the receiver's batch holding the matching receive is posted, a receive when the
 * matching send's batch is.
 * A send comes right after the compute that produced it; where a receive goes is what keeps
 * every list free of deadlock (every accepted (kind, p, m, v) is simulated without one in
 * tests/test_pp_schedule.c, and whether a deadlock exists depends on the order alone):
 *   1f1b, gpipe  right before the compute that needs it, so a send and the next receive form
 *                one batch: Megatron-LM's send_forward_recv_backward after F and
 *                send_backward_recv_forward after B, which pair with the neighbour's opposite
 *                batch. The bubble is the textbook one whatever F and B cost.
 *   interleaved  both receives of a step (a forward and a backward) before it and both sends
 *                after it: send_forward_backward_recv_forward_backward. Stage s+1 runs two
 *                fewer warm-up steps than stage s; receives right before each compute would
 *                deadlock under rendezvous.
 *   zb-h1        where the sender sends on the timeline with F = B = W and transfers that never
 *                wait (the paper's setting): B alone is short, so an output gradient often
 *                arrives while the F or W before its B runs. With those durations the lists run
 *                that timeline exactly; with others the rendezvous makes a stage wait |F - W|
 *                per micro-batch, which the simulator shows.
 *
 * The schedules:
 *   1f1b         PipeDream-Flush: stage s runs min(p-s-1, m) warm-up forwards, then one
 *                forward and one backward at a time, then the remaining backwards.
 *   gpipe        every forward, then every backward (in micro-batch order).
 *   interleaved  Narayanan et al. 2021: 1F1B over the p*v chunks, virtual micro-batch order
 *                in groups of p micro-batches per chunk; warm-up 2(p-s-1) + (v-1)p chunk
 *                forwards (Megatron-LM's count). Needs v >= 2 (v = 1 is 1f1b: ask for that),
 *                p >= 2 and m a multiple of p (the groups of p).
 *   zb-h1        Qi et al. 2023, ZB-H1: B is the input gradient only and W the weight
 *                gradient. 1F1B's order of F and B, with stage s running the W of micro-batch
 *                j after the B of micro-batch j+s: the s deferred W's fill the cool-down, the
 *                bubble is (p-1)(F+B-W) instead of (p-1)(F+B+W), and every stage holds at most
 *                p micro-batches, 1F1B's peak (stage 0's). v = 1.
 */
#ifndef MS_PIPELINE_SCHEDULE_H
#define MS_PIPELINE_SCHEDULE_H

#include <stdint.h>

#include "engine/core/status.h"
#include "engine/model/strategy.h"

#define MS_PP_MAX_VIRTUAL 255 /* local chunks are uint8 */
/* Lists are built for at most this many (micro-batch, chunk) units per stage, m x v (a few
 * megabytes of actions); ms_pp_bubble_fraction extrapolates past it (simulate.h). */
#define MS_PP_MAX_UNITS 1048576

typedef enum ms_pp_op {
    MS_PP_FORWARD,   /* F: forward of micro-batch mb through this rank's chunk */
    MS_PP_BACKWARD,  /* B: the full backward (input and weight gradients), except under zb-h1,
                        where it is the input gradient only */
    MS_PP_WEIGHT,    /* W: the weight gradient (zb-h1 only) */
    MS_PP_SEND_ACT,  /* send F's output activation to the next model chunk's rank */
    MS_PP_RECV_ACT,  /* receive the input activation from the previous model chunk's rank */
    MS_PP_SEND_GRAD, /* send the input gradient to the previous model chunk's rank */
    MS_PP_RECV_GRAD, /* receive the output gradient from the next model chunk's rank */
    MS_PP_OP_COUNT
} ms_pp_op;

typedef struct ms_pp_action {
    uint8_t op;    /* ms_pp_op */
    uint8_t chunk; /* local chunk 0..v-1 (model chunk chunk*p + stage) */
    int32_t mb;    /* micro-batch 0..m-1 */
    int32_t peer;  /* the other side's stage for a transfer; -1 for compute */
} ms_pp_action;

/* "F", "B", "W", "send-act", "recv-act", "send-grad", "recv-grad". */
const char *ms_pp_op_name(ms_pp_op op);
static inline int ms_pp_is_comm(int op) {
    return op >= MS_PP_SEND_ACT && op < MS_PP_OP_COUNT;
}

/* Whether kind runs on p stages with m micro-batches and v virtual stages per rank; one-line
 * MS_ERR_INVALID naming the fix otherwise ("the interleaved schedule needs the micro-batches
 * (6) to be a multiple of pp 4; use 4 or 8 micro-batches"). Beyond the schedules' own rules:
 * p, m, v >= 1, v <= MS_PP_MAX_VIRTUAL. */
ms_status ms_pp_schedule_check(ms_schedule kind, int p, int m, int v, ms_error *err);

/* Stage's actions in order: *out is allocated (xmalloc; the caller frees it) and *n is their
 * count. Fails as ms_pp_schedule_check does, for a stage outside 0..p-1, or past
 * MS_PP_MAX_UNITS. */
ms_status ms_pp_schedule(ms_schedule kind, int p, int m, int v, int stage, ms_pp_action **out,
                         int *n, ms_error *err);

/* The in-flight bound of stage: the most units whose activations the stage holds at once, a
 * unit being one micro-batch on one local chunk (1/v of the stage's layers; with v = 1, a
 * micro-batch). A unit is held from its F until its B, or under zb-h1 until its W: the
 * weight gradient reads the layer inputs the forward kept. From each schedule's formula, not
 * from the list: 1f1b min(m, p-s); gpipe m; zb-h1 min(m, p) (p-s as 1F1B plus the s deferred
 * W's); interleaved w+1 with w = min(2(p-s-1) + (v-1)p, m v) warm-up forwards, m v when the
 * warm-up is everything. 0 for arguments ms_pp_schedule_check refuses. */
int ms_pp_inflight_bound(ms_schedule kind, int p, int m, int v, int stage);

/* Every stage's list of one schedule. Owns act[s] and the arrays; ms_pp_plan_free frees. */
typedef struct ms_pp_plan {
    ms_schedule kind;
    int p, m, v;
    ms_pp_action **act; /* act[s]: stage s's actions */
    int *n;             /* n[s]: their count */
} ms_pp_plan;

ms_status ms_pp_plan_make(ms_schedule kind, int p, int m, int v, ms_pp_plan *out, ms_error *err);
void ms_pp_plan_free(ms_pp_plan *plan);

#endif

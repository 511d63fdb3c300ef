/* eager_adamw.h - AdamW for eager training: the optimizer kernel (optim/optim.h) on each
 * parameter's local shard, with the gradient an ms_tape computed.
 *
 * Every rank updates its own shard with its own gradient shard, which the tape has already
 * put in the parameter's placements (replicated over dp: all-reduced), so replicas stay equal
 * and a sharded parameter updates as the whole tensor would. The moments live here, one pair
 * per parameter slot, allocated at the first step on the rank's device, and the step runs the
 * AdamW kernel of that device's table.
 *
 * Ownership: the caller owns the optimizer (ms_eager_adamw_destroy) and the parameters; the
 * parameters must be passed in the same order, with the same shapes, every step.
 */
#ifndef MS_EAGER_ADAMW_H
#define MS_EAGER_ADAMW_H

#include "engine/graph/tape.h"
#include "engine/optim/optim.h"

typedef struct ms_eager_adamw ms_eager_adamw;

ms_eager_adamw *ms_eager_adamw_create(void);
void ms_eager_adamw_destroy(ms_eager_adamw *a);

/* One AdamW step (t = 1, 2, ... counted here) on params[0..n) with their gradients from the
 * tape (after ms_tape_backward). decay[i] false gives parameter i weight decay 0 (biases,
 * norms); decay NULL decays all. Not collective: a rank outside the mesh does nothing. */
ms_status ms_eager_adamw_step(ms_eager_adamw *a, const ms_tape *tape, int n,
                              ms_dtensor *const *params, const bool *decay, const ms_adamw_opts *o,
                              ms_error *err);

#endif

/* eager.h - eager mode: an operator on DistTensors runs at once.
 *
 * The same rule selection as graph completion (ops/select.h) picks the placements, copies
 * of the inputs are resharded where needed, the local kernel runs, and the outputs come
 * back as DistTensors. With allow_reshard = false an op whose inputs fit none of its rules
 * fails with an error naming the op, the placements and what it would accept.
 *
 * Collective over the inputs' mesh (all inputs must share one dmesh). Ownership: outputs
 * are new DistTensors the caller releases; inputs are not modified.
 */
#ifndef MS_EAGER_H
#define MS_EAGER_H

#include "engine/dist/dtensor.h"
#include "engine/ops/op.h"

typedef struct ms_eager_opts {
    bool allow_reshard;
    uint64_t seed; /* dropout */
} ms_eager_opts;

ms_status ms_eager(int op, const ms_op_attrs *attrs, int n_in, const ms_dtensor *const *in,
                   int n_out, ms_dtensor *out, const ms_eager_opts *opts, ms_error *err);

#endif

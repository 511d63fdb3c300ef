/* eager.h - eager mode: an operator on DistTensors runs at once.
 *
 * The same rule selection as graph completion (ops/select.h) picks the placements, copies
 * of the inputs are resharded where needed, the local kernel runs, and the outputs come
 * back as DistTensors. With allow_reshard = false an op whose inputs fit none of its rules
 * fails with an error naming the op, the placements and what it would accept.
 *
 * Collective over the inputs' mesh (all inputs must share one dmesh). Ownership: outputs
 * are new DistTensors the caller releases; inputs are not modified.
 *
 * Training in eager mode records these calls on a tape (graph/tape.h).
 */
#ifndef MS_EAGER_H
#define MS_EAGER_H

#include "engine/dist/dtensor.h"
#include "engine/ops/op.h"
#include "engine/ops/select.h"

typedef struct ms_eager_opts {
    bool allow_reshard;
    uint64_t seed; /* dropout */
    /* The kernels of the mesh's device (borrowed; its device must be the rank's), or NULL:
     * the call makes a context for the device and drops it afterwards. Kernels run where the
     * tensors live, so eager mode runs on any device that has the op's kernels. */
    ms_kctx *kc;
} ms_eager_opts;

ms_status ms_eager(int op, const ms_op_attrs *attrs, int n_in, const ms_dtensor *const *in,
                   int n_out, ms_dtensor *out, const ms_eager_opts *opts, ms_error *err);

/* What one call ran with, as its backward needs it: the rule choice (per mesh dim
 * candidates, the placements the inputs were resharded to and the outputs came out in), the
 * global shapes, the inputs as the kernel read them and the buffers the forward saved. The
 * tensors are owned (empty on non-members); ms_eager_run_release drops them. */
typedef struct ms_eager_run {
    ms_op_attrs attrs;
    ms_rule_choice ch;
    ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT];
    ms_tensor in[MS_OP_MAX_IN];
    ms_tensor saved[MS_OP_MAX_SAVED];
    uint64_t seed;
} ms_eager_run;

/* ms_eager that hands back what ran in *run (zeroed on failure; caller releases it). */
ms_status ms_eager_keep(int op, const ms_op_attrs *attrs, int n_in, const ms_dtensor *const *in,
                        int n_out, ms_dtensor *out, const ms_eager_opts *opts, ms_eager_run *run,
                        ms_error *err);
void ms_eager_run_release(ms_eager_run *run);

#endif

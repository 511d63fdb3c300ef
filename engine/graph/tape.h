/* tape.h - autograd for eager mode: a tape records the eager calls of one step, and its
 * backward runs them in reverse with the same placements graph mode's autograd would use.
 *
 *   ms_tape *t = ms_tape_create();
 *   for each step:
 *       ms_tape_watch(t, &w, err);                       the parameters (leaves)
 *       ms_tape_op(t, MS_OP_MATMUL, ..., &h, ...);      forward: eager calls, recorded
 *       ms_tape_backward(t, &loss, err);                 d(loss)/d(every watched leaf)
 *       ms_tape_grad(t, &w)                              w's gradient, in w's placements
 *       optimizer step (graph/eager_adamw.h), ms_tape_clear(t)
 *   ms_tape_destroy(t);
 *
 * Recording: a call whose inputs include a watched leaf or an output of a recorded call is
 * recorded with the rule choice it ran with (per mesh dim candidates), its inputs as the
 * kernel read them, its outputs and its saved buffers; other calls run as plain ms_eager.
 *
 * Backward (graph mode's rules, graph/program.c): d(loss) = 1 replicated, the dual of any
 * partial placement; per recorded call in reverse, each output gradient is resharded to the
 * dual placement its candidate requires (ms_rule_dual_placements), the op's backward kernel
 * runs, and each input gradient comes out in its dual placement; a tensor's gradient is kept
 * in the placement of the first one that arrives, later ones are resharded into it and added.
 * Last, each leaf's gradient is resharded into the leaf's own placements: the data-parallel
 * P(sum) -> R all-reduce of graph mode's gradient sync.
 *
 * Tensors are known by their local storage: a tracked tensor must not be resharded in place
 * (ms_reshard) or written between its forward and the backward; watched leaves must stay
 * alive until the backward. All recorded tensors share one mesh (the first one the tape
 * sees). Every call is collective over that mesh and every member must make the same calls;
 * on ranks outside the mesh the calls record and compute nothing, but check their arguments
 * as the members do, so that misuse fails on every rank.
 *
 * Kernels run on the mesh's device: the tape makes a kernel context for it when a mesh binds
 * and passes it to every call, and seeds and adds gradients with that device's kernels.
 *
 * Ownership: the caller owns the tape, the leaves and every DistTensor ms_tape_op returns.
 * The tape holds references on what the backward reads (released by the backward or by
 * ms_tape_clear) and owns the gradients ms_tape_grad returns (valid until ms_tape_clear or
 * ms_tape_destroy).
 */
#ifndef MS_TAPE_H
#define MS_TAPE_H

#include "engine/graph/eager.h"
#include "engine/graph/static_graph.h"

typedef struct ms_tape ms_tape;

ms_tape *ms_tape_create(void);
void ms_tape_destroy(ms_tape *t);
/* Forgets the recorded calls and the gradients, for the next step (keeps its capacity and
 * unbinds the mesh). */
void ms_tape_clear(ms_tape *t);

/* Marks a leaf (a parameter, R or S placements only) as wanting a gradient. Watching the
 * same tensor again does nothing. */
ms_status ms_tape_watch(ms_tape *t, const ms_dtensor *leaf, ms_error *err);

/* ms_eager, recorded on t when an input is tracked. t may be NULL (plain ms_eager). */
ms_status ms_tape_op(ms_tape *t, int op, const ms_op_attrs *attrs, int n_in,
                     const ms_dtensor *const *in, int n_out, ms_dtensor *out,
                     const ms_eager_opts *opts, ms_error *err);

/* Backpropagates from loss (a one-element tensor recorded on t). Runs once per recording: it
 * frees the saved buffers, so a second call fails until ms_tape_clear and a new forward. */
ms_status ms_tape_backward(ms_tape *t, const ms_dtensor *loss, ms_error *err);

/* A watched leaf's gradient after ms_tape_backward, in the leaf's placements (zeros when the
 * loss does not depend on it); NULL before the backward, for tensors that are not watched
 * leaves and on ranks outside the mesh. Borrowed from the tape. */
const ms_dtensor *ms_tape_grad(const ms_tape *t, const ms_dtensor *leaf);

/* Names for to_static (engine/graph/static_graph.h). ms_tape_input tracks a tensor the step
 * reads that is no parameter (the batch) under `name`, without a gradient; ms_tape_name names
 * a watched leaf (default "paramN" in watch order). Names are at most 63 bytes. */
ms_status ms_tape_input(ms_tape *t, const ms_dtensor *x, const char *name, ms_error *err);
ms_status ms_tape_name(ms_tape *t, const ms_dtensor *leaf, const char *name, ms_error *err);
/* to_static: the step recorded so far (after its forward, before ms_tape_backward) as a recipe
 * for a graph program with the same placements: every watched leaf a parameter with its
 * current values (params: every watched tensor, gathered whole: collective over the mesh),
 * every named input an input, every recorded call an operator whose outputs keep the
 * placements they ran in, `loss` the loss. A call reading a tensor the tape does not track is
 * refused, naming it. The caller frees *out (ms_static_free). */
ms_status ms_tape_to_static(const ms_tape *t, const ms_dtensor *loss, int nparams,
                            const ms_dtensor *const *params, ms_static_graph **out, ms_error *err);
/* How many calls the current recording holds (for tests and logs). */
int ms_tape_size(const ms_tape *t);

#endif

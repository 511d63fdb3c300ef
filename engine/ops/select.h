/* select.h - expanding per-mesh-dim SPMD rules to N-d: the one place where an operator's
 * placements are decided, used by graph completion and by eager mode alike.
 *
 * For each mesh dim the op's candidates are scored by the bytes their input reshards move
 * (the reshard planner's own figures, so the cost model and the engine agree), plus the
 * cheapest reduction of a partial-sum output the candidate makes by moving its inputs (the
 * next op pays it; a partial made where the inputs already lie, or passed through, is not
 * charged), plus, when an output placement is annotated, the bytes of moving the output there.
 * Hints from reverse propagation only break ties. The cheapest wins; remaining ties go to the
 * candidate listed first.
 */
#ifndef MS_SELECT_H
#define MS_SELECT_H

#include "engine/dist/mesh.h"
#include "engine/ops/op.h"

struct ms_plan_cache;

typedef struct ms_rule_choice {
    ms_rule_cand cand[MS_MESH_MAX_DIMS];
    ms_placements req_in[MS_OP_MAX_IN];  /* what each input must be resharded to */
    ms_placements out_pl[MS_OP_MAX_OUT]; /* what each output comes out as */
    double cost; /* predicted input reshard and partial-sum reduction bytes (+1 per step) */
} ms_rule_choice;

typedef struct ms_rule_query {
    int op;
    const ms_op_attrs *attrs;
    int n_in, n_out;
    const ms_shape *in_shapes;     /* [n_in] global */
    const ms_shape *out_shapes;    /* [n_out] global */
    const ms_placements *in_pl;    /* [n_in] current placements */
    const ms_placements *want_out; /* [n_out] or NULL: preferred output placements */
    /* [n_out]: 0 no preference; 1 a hint, a tie-breaker (reverse propagation's guess);
     * 2 an annotation: the output will be resharded there, so that cost counts in full */
    const int *want_kind;
    bool allow_reshard; /* false: fail unless inputs already fit a rule */
} ms_rule_query;

/* Chooses the placements of one operator call. Errors (MS_ERR_INVALID) name the operator,
 * the input placements and the combinations it accepts along the offending mesh dim. */
ms_status ms_rule_select(struct ms_plan_cache *plans, const ms_mesh *mesh, const ms_rule_query *q,
                         ms_rule_choice *out, ms_error *err);

/* Backward placements of the choice `cand` (one candidate per mesh dim), by duality
 * (ms_rule_dual_out / ms_rule_dual_in): with output true, the placement output i's gradient
 * must have; otherwise the one input i's gradient comes out in. Graph autograd and the eager
 * tape both read them here. */
ms_placements ms_rule_dual_placements(const ms_rule_cand *cand, int mesh_ndim, int n_in, int n_out,
                                      int i, bool output);

/* pl with mesh dim m set to q (a new shard nests innermost); false if invalid. */
bool ms_placements_with(const ms_placements *pl, int m, ms_placement q, int tensor_ndim,
                        ms_placements *out);

#endif

/* op_family_row.h - one macro that stamps out an operator of a table-driven family: thin
 * wrappers binding the family's shared functions to the op's kernel id, and its table row.
 * An ms_op_call does not carry its op, so each op needs functions of its own; the family
 * writes them once, taking the id first:
 *
 *   FAM_infer(k, name, attrs, n_in, in, out, err)    FAM_rule(k, attrs, n_in, in, n, cands)
 *   FAM_forward(k, call, err)    FAM_backward(k, call, err)    FAM_cost(k, call, backward)
 *   FAM_runs_on(kernels)    (every op of a family calls the same kernel slots)
 *   FAM_saved(k, call, sizes)    (MS_OP_FAMILY_ROW_SAVED only)
 */
#ifndef MS_OP_FAMILY_ROW_H
#define MS_OP_FAMILY_ROW_H

#include "engine/ops/op_defs.h"

/* The wrappers binding the family's functions to id K. */
#define MS_OP_FAMILY_FNS(fam, K, op)                                                               \
    static ms_status op##_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out, \
                                ms_error *err) {                                                   \
        return fam##_infer(K, #op, a, n_in, in, out, err);                                         \
    }                                                                                              \
    static int op##_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n,                \
                         ms_rule_cand *c) {                                                        \
        return fam##_rule(K, a, n_in, in, n, c);                                                   \
    }                                                                                              \
    static ms_status op##_forward(ms_op_call *c, ms_error *e) {                                    \
        return fam##_forward(K, c, e);                                                             \
    }                                                                                              \
    static ms_status op##_backward(ms_op_call *c, ms_error *e) {                                   \
        return fam##_backward(K, c, e);                                                            \
    }                                                                                              \
    static ms_k_cost op##_cost(const ms_op_call *c, bool bw) {                                     \
        return fam##_cost(K, c, bw);                                                               \
    }

/* The fields of the op's table row. */
#define MS_OP_FAMILY_FIELDS(fam, KIND, op, NIN, GRAD)                                              \
    .kind = KIND, .name = #op, .n_in = NIN, .n_out = 1, .infer = op##_infer, .rule = op##_rule,    \
    .forward = op##_forward, .backward = op##_backward, .cost = op##_cost,                         \
    .runs_on = fam##_runs_on, .grad_inputs = GRAD

#define MS_OP_FAMILY_ROW(fam, K, KIND, op, NIN, GRAD)                                              \
    MS_OP_FAMILY_FNS(fam, K, op)                                                                   \
    const ms_op_def ms_op_##op##_def = {MS_OP_FAMILY_FIELDS(fam, KIND, op, NIN, GRAD)};

/* MS_OP_FAMILY_ROW of a family whose backward can write input gradients whole (FRESH: the
 * ms_op_def.fresh_ok bits). */
#define MS_OP_FAMILY_ROW_FRESH(fam, K, KIND, op, NIN, GRAD, FRESH)                                 \
    MS_OP_FAMILY_FNS(fam, K, op)                                                                   \
    const ms_op_def ms_op_##op##_def = {MS_OP_FAMILY_FIELDS(fam, KIND, op, NIN, GRAD),             \
                                        .fresh_ok = FRESH};

/* MS_OP_FAMILY_ROW of a family whose ops keep buffers from forward to backward, sized by
 * FAM_saved(k, call, sizes) (ms_op_def.saved_floats). */
#define MS_OP_FAMILY_ROW_SAVED(fam, K, KIND, op, NIN, GRAD)                                        \
    MS_OP_FAMILY_FNS(fam, K, op)                                                                   \
    static void op##_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {            \
        (void)a;                                                                                   \
        fam##_saved(K, c, sizes);                                                                  \
    }                                                                                              \
    const ms_op_def ms_op_##op##_def = {MS_OP_FAMILY_FIELDS(fam, KIND, op, NIN, GRAD),             \
                                        .saved_floats = op##_saved};

#endif

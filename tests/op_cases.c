/* op_cases.c - the operator case table, one included file per family of operators, and the
 * one-rank call that tests running a single op start from. */
#include "tests/op_cases.h"

#include "engine/core/philox.h"

const op_case ms_op_cases[] = {
#include "tests/op_cases/core.inc"
#include "tests/op_cases/unary.inc"
#include "tests/op_cases/binary.inc"
#include "tests/op_cases/reduce.inc"
#include "tests/op_cases/index.inc"
#include "tests/op_cases/layers.inc"
#include "tests/op_cases/fused.inc"
#include "tests/op_cases/conv.inc"
#include "tests/op_cases/pool.inc"
};
const int ms_n_op_cases = (int)(sizeof ms_op_cases / sizeof *ms_op_cases);

void mt_op_case_fill(const op_case *c, int i, ms_tensor *t) {
    float *p = ms_tensor_f32(t);
    for (int64_t k = 0; k < ms_tensor_numel(t); k++) {
        float u = ms_philox_uniform(11, (uint64_t)i, (uint64_t)k);
        if (c->kind[i] == IN_IDS)
            p[k] = (float)(int)(u * c->vocab);
        else if (c->kind[i] == IN_TARGETS)
            p[k] = k == 1 ? -1.0f : (float)(int)(u * c->vocab);
        else if (c->kind[i] == IN_POSITIVE)
            p[k] = 0.5f + u;
        else
            p[k] = 2 * u - 1;
    }
}

ms_op_call mt_op_call_whole(const ms_op_attrs *a, int n_in, const ms_shape *gin, int n_out,
                            const ms_shape *gout) {
    static const ms_placements none[MS_OP_MAX_IN > MS_OP_MAX_OUT ? MS_OP_MAX_IN : MS_OP_MAX_OUT];
    return (ms_op_call){.kc = ms_kctx_host(),
                        .attrs = a,
                        .n_in = n_in,
                        .n_out = n_out,
                        .gin = gin,
                        .gout = gout,
                        .in_pl = none,
                        .out_pl = none};
}

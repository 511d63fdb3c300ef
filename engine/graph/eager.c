/* eager.c - running one operator on DistTensors immediately. */
#include "engine/graph/eager.h"

#include <string.h>

#include "engine/dist/reshard.h"
#include "engine/ops/select.h"

ms_status ms_eager(int op, const ms_op_attrs *attrs, int n_in, const ms_dtensor *const *in,
                   int n_out, ms_dtensor *out, const ms_eager_opts *opts, ms_error *err) {
    const ms_op_def *def = ms_op_get(op);
    if (!def) return ms_fail(err, MS_ERR_INVALID, "eager: unknown operator %d", op);
    if (n_in < 1 || n_in > MS_OP_MAX_IN || n_out < 1 || n_out > MS_OP_MAX_OUT)
        return ms_fail(err, MS_ERR_INVALID, "eager %s: %d inputs, %d outputs", def->name, n_in,
                       n_out);
    ms_dmesh *dm = in[0]->mesh;
    for (int i = 1; i < n_in; i++)
        if (in[i]->mesh != dm)
            return ms_fail(err, MS_ERR_INVALID,
                           "eager %s: inputs live on different meshes; "
                           "move them with ms_reshard_cross_mesh first",
                           def->name);
    ms_op_attrs a = attrs ? *attrs : (ms_op_attrs){0};
    ms_shape ins[MS_OP_MAX_IN], outs[MS_OP_MAX_OUT];
    ms_placements in_pl[MS_OP_MAX_IN];
    for (int i = 0; i < n_in; i++) {
        ins[i].ndim = in[i]->ndim;
        memcpy(ins[i].d, in[i]->gshape, sizeof ins[i].d);
        in_pl[i] = in[i]->pl;
    }
    MS_CHECK(def->infer(&a, n_in, ins, outs, err));
    ms_rule_query q = {.op = op,
                       .attrs = &a,
                       .n_in = n_in,
                       .n_out = n_out,
                       .in_shapes = ins,
                       .out_shapes = outs,
                       .in_pl = in_pl,
                       .allow_reshard = !opts || opts->allow_reshard};
    ms_rule_choice ch;
    MS_CHECK(ms_rule_select(dm->ctx->plans, &dm->mesh, &q, &ch, err));
    for (int o = 0; o < n_out; o++) {
        out[o] = (ms_dtensor){.ndim = outs[o].ndim, .mesh = dm, .pl = ch.out_pl[o]};
        memcpy(out[o].gshape, outs[o].d, sizeof out[o].gshape);
    }
    if (!ms_dmesh_is_member(dm)) return MS_OK;

    /* Inputs in the chosen placements (copies: the caller's tensors stay as they are). */
    ms_dtensor rin[MS_OP_MAX_IN] = {0};
    ms_tensor saved[MS_OP_MAX_SAVED] = {0};
    ms_status st = MS_OK;
    for (int i = 0; i < n_in && st == MS_OK; i++) {
        rin[i] = *in[i];
        st = ms_tensor_contiguous(&in[i]->local, MS_F32, &rin[i].local, err);
        if (st == MS_OK) st = ms_reshard(&rin[i], &ch.req_in[i], NULL, err);
    }
    ms_op_call call = {.attrs = &a,
                       .n_in = n_in,
                       .n_out = n_out,
                       .gin = ins,
                       .gout = outs,
                       .in_pl = ch.req_in,
                       .out_pl = ch.out_pl,
                       .mesh = dm,
                       .seed = opts ? opts->seed : 0};
    for (int i = 0; i < n_in && st == MS_OK; i++) {
        int64_t len[MS_MAX_DIMS];
        call.in[i] = &rin[i].local;
        ms_local_box(&ch.req_in[i], &dm->mesh, dm->coords, ins[i].ndim, ins[i].d, call.in_start[i],
                     len);
    }
    for (int o = 0; o < n_out && st == MS_OK; o++) {
        int64_t len[MS_MAX_DIMS];
        ms_local_box(&ch.out_pl[o], &dm->mesh, dm->coords, outs[o].ndim, outs[o].d,
                     call.out_start[o], len);
        st = ms_tensor_alloc(dm->ctx->device, MS_F32, outs[o].ndim, len, &out[o].local, err);
        call.out[o] = &out[o].local;
    }
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    if (st == MS_OK && def->saved_floats) def->saved_floats(&a, &call, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED && st == MS_OK; k++)
        if (sizes[k]) {
            st = ms_tensor_alloc(dm->ctx->device, MS_F32, 1, &sizes[k], &saved[k], err);
            call.saved[k] = &saved[k];
        }
    if (st == MS_OK) st = def->forward(&call, err);
    for (int i = 0; i < n_in; i++) ms_tensor_release(&rin[i].local);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&saved[k]);
    if (st != MS_OK)
        for (int o = 0; o < n_out; o++) ms_dtensor_release(&out[o]);
    return st;
}

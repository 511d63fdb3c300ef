/* eager.c - running one operator on DistTensors immediately. */
#include "engine/graph/eager.h"

#include <string.h>

#include "engine/dist/reshard.h"

/* Checks the call, infers the output shapes and chooses the placements. */
static ms_status choose(const ms_op_def *def, int op, int n_in, const ms_dtensor *const *in,
                        int n_out, const ms_eager_opts *opts, ms_eager_run *run, ms_error *err) {
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
    ms_placements in_pl[MS_OP_MAX_IN];
    for (int i = 0; i < n_in; i++) {
        run->gin[i].ndim = in[i]->ndim;
        memcpy(run->gin[i].d, in[i]->gshape, sizeof run->gin[i].d);
        in_pl[i] = in[i]->pl;
    }
    MS_CHECK(def->infer(&run->attrs, n_in, run->gin, run->gout, err));
    ms_rule_query q = {.op = op,
                       .attrs = &run->attrs,
                       .n_in = n_in,
                       .n_out = n_out,
                       .in_shapes = run->gin,
                       .out_shapes = run->gout,
                       .in_pl = in_pl,
                       .allow_reshard = !opts || opts->allow_reshard};
    return ms_rule_select(dm->ctx->plans, &dm->mesh, &q, &run->ch, err);
}

/* This rank's part: inputs resharded (copies: the caller's tensors stay as they are),
 * outputs and saved buffers allocated, the forward kernel. */
static ms_status run_local(const ms_op_def *def, ms_dmesh *dm, ms_kctx *kc, int n_in,
                           const ms_dtensor *const *in, int n_out, ms_dtensor *out,
                           ms_eager_run *run, ms_error *err) {
    const ms_rule_choice *ch = &run->ch;
    ms_op_call call = {.kc = kc,
                       .attrs = &run->attrs,
                       .n_in = n_in,
                       .n_out = n_out,
                       .gin = run->gin,
                       .gout = run->gout,
                       .in_pl = ch->req_in,
                       .out_pl = ch->out_pl,
                       .mesh = dm,
                       .seed = run->seed};
    ms_status st = MS_OK;
    for (int i = 0; i < n_in && st == MS_OK; i++) {
        ms_dtensor r = *in[i];
        r.local = ms_tensor_share(&in[i]->local); /* ms_reshard makes the new local tensor */
        st = ms_reshard(&r, &ch->req_in[i], NULL, err);
        run->in[i] = r.local;
        if (st != MS_OK) break;
        int64_t len[MS_MAX_DIMS];
        call.in[i] = &run->in[i];
        ms_local_box(&ch->req_in[i], &dm->mesh, dm->coords, run->gin[i].ndim, run->gin[i].d,
                     call.in_start[i], len);
    }
    for (int o = 0; o < n_out && st == MS_OK; o++) {
        int64_t len[MS_MAX_DIMS];
        ms_local_box(&ch->out_pl[o], &dm->mesh, dm->coords, run->gout[o].ndim, run->gout[o].d,
                     call.out_start[o], len);
        st = ms_tensor_alloc(dm->ctx->device, MS_F32, run->gout[o].ndim, len, &out[o].local, err);
        call.out[o] = &out[o].local;
    }
    int64_t sizes[MS_OP_MAX_SAVED] = {0};
    if (st == MS_OK && def->saved_floats) def->saved_floats(&run->attrs, &call, sizes);
    for (int k = 0; k < MS_OP_MAX_SAVED && st == MS_OK; k++)
        if (sizes[k]) {
            st = ms_tensor_alloc(dm->ctx->device, MS_F32, 1, &sizes[k], &run->saved[k], err);
            call.saved[k] = &run->saved[k];
        }
    if (st == MS_OK) st = def->forward(&call, err);
    return st;
}

ms_status ms_eager_keep(int op, const ms_op_attrs *attrs, int n_in, const ms_dtensor *const *in,
                        int n_out, ms_dtensor *out, const ms_eager_opts *opts, ms_eager_run *run,
                        ms_error *err) {
    memset(run, 0, sizeof *run);
    const ms_op_def *def = ms_op_get(op);
    if (!def) return ms_fail(err, MS_ERR_INVALID, "eager: unknown operator %d", op);
    if (attrs) run->attrs = *attrs;
    run->seed = opts ? opts->seed : 0;
    MS_CHECK(choose(def, op, n_in, in, n_out, opts, run, err));
    ms_dmesh *dm = in[0]->mesh;
    for (int o = 0; o < n_out; o++) {
        out[o] = (ms_dtensor){.ndim = run->gout[o].ndim, .mesh = dm, .pl = run->ch.out_pl[o]};
        memcpy(out[o].gshape, run->gout[o].d, sizeof out[o].gshape);
    }
    if (!ms_dmesh_is_member(dm)) return MS_OK;
    ms_kctx *kc = opts ? opts->kc : NULL, *own = NULL;
    ms_status st = MS_OK;
    if (!kc) st = ms_kctx_create(dm->ctx->device, &own, err), kc = own;
    if (st == MS_OK && !(def->runs_on ? def->runs_on(kc->k) : kc->k->kind == MS_DEVICE_CPU))
        st = ms_fail(err, MS_ERR_UNSUPPORTED,
                     "eager %s: the operator has no %s kernels; run it with --device cpu",
                     def->name, kc->k->name);
    if (st == MS_OK) st = run_local(def, dm, kc, n_in, in, n_out, out, run, err);
    ms_kctx_destroy(own);
    if (st != MS_OK) {
        for (int o = 0; o < n_out; o++) ms_dtensor_release(&out[o]);
        ms_eager_run_release(run);
    }
    return st;
}

void ms_eager_run_release(ms_eager_run *run) {
    for (int i = 0; i < MS_OP_MAX_IN; i++) ms_tensor_release(&run->in[i]);
    for (int k = 0; k < MS_OP_MAX_SAVED; k++) ms_tensor_release(&run->saved[k]);
}

ms_status ms_eager(int op, const ms_op_attrs *attrs, int n_in, const ms_dtensor *const *in,
                   int n_out, ms_dtensor *out, const ms_eager_opts *opts, ms_error *err) {
    ms_eager_run run;
    ms_status st = ms_eager_keep(op, attrs, n_in, in, n_out, out, opts, &run, err);
    if (st == MS_OK) ms_eager_run_release(&run);
    return st;
}

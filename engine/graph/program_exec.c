/* program_exec.c - running the instruction list, and gradients final during backward. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/graph/grad_buckets.h"
#include "engine/graph/graph_impl.h"
#include "engine/graph/program.h"
#include "engine/core/parallel.h"
#include "engine/ops/select.h"
#include "engine/core/trace_sink.h"

#include "engine/graph/program_impl.h"

/* --- execution ------------------------------------------------------------------------------- */

/* A shapes-only program has no memory behind its buffers. */
ms_status prog_check_has_memory(const ms_program *p, ms_error *err) {
    if (p->shapes_only)
        return ms_fail(err, MS_ERR_INVALID,
                       "program: compiled from shapes only, it cannot prog_run");
    return MS_OK;
}

/* ... and, to prog_run or feed, an arena (micro-batched programs are given theirs). */
static ms_status check_runnable(const ms_program *p, ms_error *err) {
    MS_CHECK(prog_check_has_memory(p, err));
    if (!p->arena)
        return ms_fail(err, MS_ERR_INVALID,
                       "program: micro-batched, it needs an arena (ms_program_bind_arena) first");
    if (p->scratch_floats && !p->scratch)
        return ms_fail(err, MS_ERR_INVALID,
                       "program: its pass-lived buffers need a scratch (ms_program_bind_scratch) "
                       "first");
    return MS_OK;
}

/* Straight from the source buffer into the target buffer: the plan comes from the cache and
 * intermediate steps use the rank's workspace, so the step path allocates nothing. */
static ms_status run_reshard(ms_program *p, const instr *in, ms_error *err) {
    const ms_shape *g = &p->g->v[in->value].shape;
    const ms_reshard_plan *plan;
    MS_CHECK(ms_plan_cache_get(p->plans, p->mesh, &in->from, &in->to, g->ndim, g->d, &plan, err));
    return ms_reshard_run_dt(p->dm, plan, g->ndim, g->d, p->bufs[in->src].dtype,
                             p->bufs[in->src].ptr, p->bufs[in->dst].ptr, NULL, err);
}

void prog_make_call(ms_program *p, const instr *in, ms_op_call *call, ms_shape *gin,
                    ms_shape *gout) {
    gnode *nd = &p->g->n[in->node];
    pnode *pn = &p->pn[in->node];
    memset(call, 0, sizeof *call);
    call->attrs = &nd->attrs;
    call->n_in = nd->n_in;
    call->n_out = nd->n_out;
    call->mesh = p->dm;
    call->kc = p->kc;
    call->seed = p->draw;
    call->batch = p->batch;
    call->eval = p->eval;
    call->in_pl = pn->req_in;
    call->out_pl = pn->out_pl;
    for (int i = 0; i < nd->n_in; i++) {
        gin[i] = p->g->v[nd->in[i]].shape;
        call->in[i] = &p->bufs[in->kb.in[i]].t;
        int64_t len[MS_MAX_DIMS];
        ms_local_box(&pn->req_in[i], p->mesh, p->coords, gin[i].ndim, gin[i].d, call->in_start[i],
                     len);
        if (in->din_buf[i] >= 0) call->din[i] = &p->bufs[in->din_buf[i]].t;
    }
    for (int o = 0; o < nd->n_out; o++) {
        gout[o] = p->g->v[nd->out[o]].shape;
        call->out[o] = &p->bufs[in->kb.out[o]].t;
        int64_t len[MS_MAX_DIMS];
        ms_local_box(&pn->out_pl[o], p->mesh, p->coords, gout[o].ndim, gout[o].d,
                     call->out_start[o], len);
        if (in->dout_buf[o] >= 0) call->dout[o] = &p->bufs[in->dout_buf[o]].t;
    }
    for (int s = 0; s < MS_OP_MAX_SAVED; s++)
        if (in->kb.saved[s] >= 0) call->saved[s] = &p->bufs[in->kb.saved[s]].t;
    call->din_fresh = in->din_fresh;
    call->gin = gin;
    call->gout = gout;
}

/* One event per kernel and per reshard; reshards carry a flow id that the communicator
 * probes stamp on the collectives they prog_run. */
static void record(ms_program *p, const instr *in, int64_t t0, uint64_t flow, uint64_t corr) {
    ms_event e;
    memset(&e, 0, sizeof e);
    e.t0_ns = t0;
    e.t1_ns = ms_now_ns();
    if (in->kind == I_FWD || in->kind == I_BWD) {
        const gnode *nd = &p->g->n[in->node];
        e.kind = MS_EV_OP;
        e.phase = in->kind == I_FWD ? MS_PHASE_FORWARD : MS_PHASE_BACKWARD; /* recompute too */
        e.u.op.op = nd->op;
        ms_ev_strcpy(e.u.op.name, sizeof e.u.op.name, NULL, nd->name);
        ms_ev_strcpy(e.u.op.opname, sizeof e.u.op.opname, NULL, ms_op_get(nd->op)->name);
        e.u.op.flops = in->flops;
        e.u.op.bytes = in->bytes;
        e.u.op.corr = corr;
    } else {
        e.kind = MS_EV_RESHARD;
        e.phase = in->phase == MS_PROG_FORWARD || in->phase == MS_PROG_RECOMPUTE ? MS_PHASE_FORWARD
                  : in->phase == MS_PROG_BACKWARD                                ? MS_PHASE_BACKWARD
                                                                                 : MS_PHASE_OTHER;
        ms_ev_strcpy(e.u.reshard.tensor, sizeof e.u.reshard.tensor,
                     prog_moves_grad(in) ? "grad:" : NULL, p->g->v[in->value].name);
        ms_placements_str(&in->from, e.u.reshard.from, sizeof e.u.reshard.from);
        ms_placements_str(&in->to, e.u.reshard.to, sizeof e.u.reshard.to);
        e.u.reshard.bytes = (uint64_t)in->coll_bytes;
        e.u.reshard.flow = flow;
        if (in->plan) e.u.reshard.nsteps = in->plan->nsteps;
    }
    ms_trace_emit(&p->ctx->trace, &e);
}

/* Zeroing on the rank's threads (core/parallel.h) on the host, by the device elsewhere. */
static void zero_range(void *arg, int64_t lo, int64_t hi) {
    memset((float *)arg + lo, 0, sizeof(float) * (size_t)(hi - lo));
}

static ms_status zero_buf(ms_program *p, const buf *b, ms_error *err) {
    if (ms_device_host_addressable(p->dev)) {
        ms_parallel_for(b->nfloats, 1 << 16, zero_range, b->ptr);
        return MS_OK;
    }
    return ms_device_zero(p->dev, b->ptr, sizeof(float) * (size_t)b->nfloats, err);
}

/* Parameter v's host master into its host rounding, with kc (a host kernel context). */
static ms_status round_master(ms_program *p, int v, ms_kctx *kc, ms_error *err) {
    pvalue *pv = &p->pv[v];
    const buf *m = &p->bufs[pv->master_buf];
    MS_CHECK(MS_CALL_K(kc, bf16_round, (uint16_t *)p->bufs[pv->up_buf].ptr, m->ptr, m->numel, err));
    pv->up_stale = false;
    return MS_OK;
}

/* A host master's cast: its rounding (made now if the master changed since) copied up into
 * the use copy, or into the shard its gather reads. */
static ms_status cast_from_host(ms_program *p, const instr *in, ms_error *err) {
    const pvalue *pv = &p->pv[in->value];
    if (pv->up_stale) MS_CHECK(round_master(p, in->value, p->hkc, err));
    const buf *d = &p->bufs[in->dst];
    return ms_device_copy(p->dev, d->ptr, p->bufs[pv->up_buf].ptr,
                          sizeof(uint16_t) * (size_t)d->numel, MS_COPY_HOST_TO_DEVICE, err);
}

ms_status ms_program_round_master(ms_program *p, int i, ms_kctx *kc, ms_error *err) {
    if (!p->member || p->shapes_only || i < 0 || i >= p->nparams) return MS_OK;
    int v = p->params[i];
    return p->pv[v].up_buf >= 0 ? round_master(p, v, kc, err) : MS_OK;
}

/* Instructions other than kernels and reshards, through the device and its kernel table. */
static ms_status run_data_instr(ms_program *p, const instr *in, ms_error *err) {
    buf *d = &p->bufs[in->dst];
    const buf *s = in->src >= 0 ? &p->bufs[in->src] : NULL;
    switch (in->kind) {
        case I_ZERO:
            return zero_buf(p, d, err);
        case I_SEED:
            return MS_CALL_K(p->kc, fill, d->ptr, p->loss_scale, d->numel, err);
        case I_COPY:
            return ms_device_copy(p->dev, d->ptr, s->ptr + in->src_off,
                                  sizeof(float) * (size_t)d->nfloats, MS_COPY_DEVICE_TO_DEVICE,
                                  err);
        case I_ADD:
            if (d->dtype == MS_BF16)
                return MS_CALL_K(p->kc, bf16_accumulate, (uint16_t *)d->ptr,
                                 (const uint16_t *)s->ptr, d->numel, err);
            return MS_CALL_K(p->kc, accumulate, d->ptr, s->ptr, d->numel, err);
        case I_CAST:
            if (s->on_host) return cast_from_host(p, in, err);
            return MS_CALL_K(p->kc, bf16_round, (uint16_t *)d->ptr, s->ptr, d->numel, err);
        default:
            return ms_fail(err, MS_ERR_INTERNAL, "program: instruction %d is no data move",
                           (int)in->kind);
    }
}

/* Cast k and the casts after it before upto whose masters are on the device (each parameter's,
 * one after another in the parameter sync: 148 for GPT-2; under ZeRO 1 and 2 each is followed
 * by its gather) as one list, one launch on a GPU; a cast alone, or from a host master, by
 * itself. Returns how many it ran in *ran. */
static ms_status run_casts(ms_program *p, int k, int upto, int *ran, ms_error *err) {
    int n = 0;
    for (int j = k; j < upto && p->ins[j].kind == I_CAST && !p->bufs[p->ins[j].src].on_host; j++)
        n++;
    *ran = n > 1 ? n : 1;
    if (n <= 1) return run_data_instr(p, &p->ins[k], err);
    if (n > p->cast_cap) {
        free(p->cast_items);
        p->cast_items = xmalloc(sizeof *p->cast_items * (size_t)n);
        p->cast_cap = n;
    }
    for (int i = 0; i < n; i++) {
        const instr *in = &p->ins[k + i];
        const buf *d = &p->bufs[in->dst];
        p->cast_items[i] = (ms_k_cast_item){
            .dst = (uint16_t *)d->ptr, .src = p->bufs[in->src].ptr, .n = (size_t)d->numel};
    }
    return MS_CALL_K(p->kc, bf16_round_list, p->cast_items, n, err);
}

/* The loss, read back to the host after the kernels that wrote it have finished. */
static ms_status read_loss(ms_program *p, float *loss, ms_error *err) {
    MS_CHECK(ms_kctx_sync(p->kc, err));
    return ms_device_copy(p->dev, loss, p->bufs[p->loss_buf].ptr, sizeof(float),
                          MS_COPY_DEVICE_TO_HOST, err);
}

ms_status prog_run(ms_program *p, int from, int upto, float *loss, ms_error *err);

/* bf16: the use copies follow the masters before anything reads them. Every member prog_writes
 * its masters through the same calls, so all agree on when this runs (it may gather). */
static ms_status refresh_use_copies(ms_program *p, int from, ms_error *err) {
    if (!p->params_dirty || from >= p->n_sync) return MS_OK;
    p->params_dirty = false;
    return prog_run(p, p->n_sync, p->ni, NULL, err);
}

/* Whether instruction in reads buffer b (kernel inputs and saved values, a copy's source). */
static bool reads_buf(const instr *in, int b) {
    if (in->src == b) return true;
    if (in->kind != I_FWD && in->kind != I_BWD) return false;
    for (int j = 0; j < MS_OP_MAX_IN; j++)
        if (in->kb.in[j] == b) return true;
    for (int j = 0; j < MS_OP_MAX_SAVED; j++)
        if (in->kb.saved[j] == b) return true;
    return false;
}

static void find_first_uses(ms_program *p) {
    if (p->param_first) return;
    p->param_first = xmalloc(sizeof *p->param_first * (size_t)(p->nparams ? p->nparams : 1));
    for (int i = 0; i < p->nparams; i++) {
        int b = p->pv[p->params[i]].buf, k = 0;
        while (k < p->n_sync && !reads_buf(&p->ins[k], b)) k++;
        p->param_first[i] = k;
    }
}

/* Tells the hook about every parameter first read by instruction k. */
static ms_status announce_uses(ms_program *p, int k, ms_error *err) {
    /* the hook may remove itself once every parameter is in */
    for (int i = 0; i < p->nparams && p->param_use; i++)
        if (p->param_first[i] == k) MS_CHECK(p->param_use(p->param_use_arg, i, err));
    return MS_OK;
}

/* --- gradients final during backward (ms_program_on_grad_final) ----------------------------- */

static ms_status tell_grad_final(ms_program *p, int i, ms_error *err) {
    if (p->gf_told[i] || !p->grad_final) return MS_OK;
    p->gf_told[i] = true;
    return p->grad_final(p->grad_final_arg, i, err);
}

static ms_status bucket_grad_done(void *arg, int g, ms_error *err) {
    ms_program *p = arg;
    return tell_grad_final(p, p->gf_bucket_param[g], err);
}

/* After backward instruction k: the gradients it finished on its step's last pass, and those
 * whose bucket's collective is over. */
static ms_status grads_final_after(ms_program *p, int k, ms_error *err) {
    for (int i = 0; i < p->nparams; i++)
        if (p->gf_last[i] == k && ++p->gf_hits[i] == p->passes)
            MS_CHECK(tell_grad_final(p, i, err));
    return ms_gb_poll(p->buckets, bucket_grad_done, p, err);
}

static int param_index(const ms_program *p, int v) {
    for (int i = 0; i < p->nparams; i++)
        if (p->params[i] == v) return i;
    return -1;
}

/* Where each parameter's gradient becomes final: its last backward write when it is already
 * in its stored placement, else its grad sync (bucketed or not). */
static void find_grad_finals(ms_program *p) {
    if (p->gf_last) return;
    size_t n = (size_t)(p->nparams ? p->nparams : 1);
    p->gf_last = xmalloc(sizeof *p->gf_last * n);
    p->gf_hits = xcalloc(n, sizeof *p->gf_hits);
    p->gf_told = xcalloc(n, sizeof *p->gf_told);
    for (int i = 0; i < p->nparams; i++) {
        const pvalue *pv = &p->pv[p->params[i]];
        bool direct = pv->has_grad && pv->gbuf == pv->param_grad_buf;
        p->gf_last[i] = direct ? prog_final_write(p, pv->param_grad_buf) : -1;
    }
    int nb = p->buckets ? ms_gb_count(p->buckets) : 0;
    p->gf_bucket_param = xcalloc((size_t)(nb ? nb : 1), sizeof *p->gf_bucket_param);
    for (int k = p->n_backward; k < p->n_sync; k++)
        if (p->ins[k].bucket_grad)
            p->gf_bucket_param[p->ins[k].bucket_grad - 1] = param_index(p, p->ins[k].value);
}

void ms_program_on_grad_final(ms_program *p, ms_param_use_fn fn, void *arg) {
    if (fn && p->member && !p->shapes_only) find_grad_finals(p);
    p->grad_final = p->gf_last ? fn : NULL;
    p->grad_final_arg = arg;
}

ms_status prog_run(ms_program *p, int from, int upto, float *loss, ms_error *err) {
    if (!p->member) return MS_OK;
    MS_CHECK(check_runnable(p, err));
    MS_CHECK(refresh_use_copies(p, from, err));
    const bool rec = ms_trace_on(&p->ctx->trace);
    for (int k = from; k < upto; k++) {
        instr *in = &p->ins[k];
        if (in->train_only && p->eval) continue; /* buffers keep their values in evaluation */
        ms_status st = MS_OK;
        int64_t t0 = 0;
        uint64_t flow = 0, corr = 0;
        if (p->param_use && k < p->n_sync) MS_CHECK(announce_uses(p, k, err));
        if (rec && (in->kind == I_RESHARD || in->kind == I_FWD || in->kind == I_BWD)) {
            t0 = ms_now_ns();
            /* Reshards link to their collectives (flow), kernels to their GPU work (corr). */
            uint64_t id = ((uint64_t)p->ctx->rank << 40) | ++p->flow_counter;
            if (in->kind == I_RESHARD) {
                flow = id;
                p->ctx->trace.flow = flow;
            } else if (p->ctx->trace.gpu_push) {
                corr = id;
                p->ctx->trace.gpu_push(corr);
            }
        }
        switch (in->kind) {
            case I_RESHARD:
                st = in->bucket_grad ? ms_gb_finish(p->buckets, in->bucket_grad - 1, err)
                                     : run_reshard(p, in, err);
                break;
            case I_ZERO:
                if (in->dropped) break;
                st = run_data_instr(p, in, err);
                break;
            case I_CAST: {
                int ran = 1;
                st = run_casts(p, k, upto, &ran, err);
                k += ran - 1; /* the prog_run's other casts are done: nothing else to record */
                break;
            }
            case I_SEED:
            case I_COPY:
            case I_ADD:
                st = run_data_instr(p, in, err);
                break;
            case I_FWD:
            case I_BWD: {
                ms_op_call call;
                ms_shape gin[MS_OP_MAX_IN], gout[MS_OP_MAX_OUT];
                prog_make_call(p, in, &call, gin, gout);
                st = prog_run_kernel(p, in, &call, err);
                if (st != MS_OK) st = ms_fail_wrap(err, st, "%s", p->g->n[in->node].name);
                break;
            }
        }
        if (rec && t0) {
            p->ctx->trace.flow = 0;
            if (corr) p->ctx->trace.gpu_pop();
            record(p, in, t0, flow, corr);
        }
        if (st == MS_OK && p->buckets && k < p->n_backward) st = ms_gb_after(p->buckets, k, err);
        if (st == MS_OK && p->grad_final && k >= p->n_forward && k < p->n_backward)
            st = grads_final_after(p, k, err);
        if (st != MS_OK) return st;
    }
    if (loss && p->loss_buf >= 0 && upto >= p->n_forward) return read_loss(p, loss, err);
    return MS_OK;
}

ms_status ms_program_step(ms_program *p, float *loss, ms_error *err) {
    if (p->member && p->micro) MS_CHECK(ms_program_zero_grads(p, err));
    return prog_run(p, 0, p->n_sync, loss, err);
}

ms_status ms_program_forward(ms_program *p, float *loss, ms_error *err) {
    return prog_run(p, 0, p->n_forward, loss, err);
}

ms_status ms_program_backward(ms_program *p, ms_error *err) {
    return prog_run(p, p->n_forward, p->n_backward, NULL, err);
}

ms_status ms_program_backward_input(ms_program *p, ms_error *err) {
    return prog_run(p, p->n_forward, p->n_weight, NULL, err);
}

ms_status ms_program_backward_weight(ms_program *p, ms_error *err) {
    return prog_run(p, p->n_weight, p->n_backward, NULL, err);
}

ms_status ms_program_grad_sync(ms_program *p, ms_error *err) {
    MS_CHECK(prog_run(p, p->n_backward, p->n_sync, NULL, err));
    /* every gradient is final now: the rest are told (once each) */
    for (int i = 0; p->member && p->grad_final && i < p->nparams; i++)
        MS_CHECK(tell_grad_final(p, i, err));
    return MS_OK;
}

ms_status ms_program_param_sync(ms_program *p, ms_error *err) {
    p->params_dirty = false;
    return prog_run(p, p->n_sync, p->ni, NULL, err);
}

ms_status ms_program_param_sync_one(ms_program *p, int i, ms_error *err) {
    if (!p->member || p->shapes_only || i < 0 || i >= p->nparams) return MS_OK;
    for (int k = p->n_sync; k < p->ni; k++)
        if (p->ins[k].value == p->params[i]) MS_CHECK(prog_run(p, k, k + 1, NULL, err));
    return MS_OK;
}

void ms_program_on_param_use(ms_program *p, ms_param_use_fn fn, void *arg) {
    if (fn) find_first_uses(p);
    p->param_use = fn;
    p->param_use_arg = arg;
}

int ms_program_param_first_use(ms_program *p, int i) {
    find_first_uses(p);
    return i >= 0 && i < p->nparams ? p->param_first[i] : 0;
}

void ms_program_params_written(ms_program *p) {
    if (p->member && !p->shapes_only) prog_masters_written(p);
}

static int cmp_size(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* The parameters' gradient buffers as few ranges as they allow: the persistent ones (created
 * side by side, laid out side by side) merged where one ends, padding included, where the next
 * begins; the rest listed one by one. */
static void plan_zero_ranges(ms_program *p) {
    const int cap = 2 * p->nparams + 2;
    size_t *span = xmalloc(sizeof *span * 2 * (size_t)cap); /* (offset, padded floats) pairs */
    int ns = 0;
    p->zero_other = xmalloc(sizeof *p->zero_other * (size_t)cap);
    p->zero_n_other = 0;
    for (int v = 0; v < p->g->nv; v++) {
        const pvalue *pv = &p->pv[v];
        if (p->g->v[v].kind != GV_PARAM) continue;
        const int bufs[2] = {pv->param_grad_buf,
                             pv->has_grad && pv->gbuf != pv->param_grad_buf ? pv->gbuf : -1};
        for (int k = 0; k < 2 && ns < cap; k++) {
            if (bufs[k] < 0) continue;
            const buf *bf = &p->bufs[bufs[k]];
            if (bf->persistent && !bf->on_host && bf->ptr == p->persist + bf->offset)
                span[2 * ns] = bf->offset, span[2 * ns + 1] = prog_padded_floats(bf), ns++;
            else
                p->zero_other[p->zero_n_other++] = bufs[k];
        }
    }
    qsort(span, (size_t)ns, 2 * sizeof *span, cmp_size);
    p->zero_off = xmalloc(sizeof *p->zero_off * (size_t)(ns + 1));
    p->zero_len = xmalloc(sizeof *p->zero_len * (size_t)(ns + 1));
    p->zero_n = 0;
    for (int i = 0; i < ns; i++) {
        const size_t off = span[2 * i], len = span[2 * i + 1];
        const int last = p->zero_n - 1;
        if (last >= 0 && p->zero_off[last] + p->zero_len[last] == off)
            p->zero_len[last] += len;
        else if (last < 0 || p->zero_off[last] + p->zero_len[last] < off)
            p->zero_off[p->zero_n] = off, p->zero_len[p->zero_n++] = len;
        /* else: a buffer already inside the last range (one shared by two values) */
    }
    free(span);
    p->zero_ready = true;
}

ms_status ms_program_zero_grads(ms_program *p, ms_error *err) {
    if (!p->member || p->shapes_only) return MS_OK;
    ms_gb_reset(p->buckets);
    for (int i = 0; p->gf_last && i < p->nparams; i++) p->gf_hits[i] = 0, p->gf_told[i] = false;
    if (!p->zero_ready) plan_zero_ranges(p);
    for (int i = 0; i < p->zero_n; i++) {
        const buf range = {.ptr = p->persist + p->zero_off[i], .nfloats = (int64_t)p->zero_len[i]};
        MS_CHECK(zero_buf(p, &range, err));
    }
    for (int i = 0; i < p->zero_n_other; i++)
        MS_CHECK(zero_buf(p, &p->bufs[p->zero_other[i]], err));
    return MS_OK;
}

void ms_program_set_dropout(ms_program *p, bool training, uint64_t step) {
    p->eval = !training;
    /* Any distinct Philox key draws an independent stream; the golden-ratio step keeps keys of
     * nearby seeds and steps apart. */
    p->draw = p->seed + 0x9E3779B97F4A7C15ull * step;
}

void ms_program_set_batch_window(ms_program *p, int64_t rows, int64_t stride, int64_t offset) {
    p->batch = (ms_k_batch_window){.rows = rows, .stride = stride, .offset = offset};
}

size_t ms_program_arena_bytes(const ms_program *p) {
    return (p->arena_floats + 16) * sizeof(float);
}

/* Points the step-lived buffers in the arena (scratch false) or in the scratch at base (NULL:
 * unbound). */
static void bind_buffers(ms_program *p, float *base, bool scratch) {
    for (int b = 0; b < p->nb; b++) {
        buf *bf = &p->bufs[b];
        if (bf->persistent || bf->scratch != scratch) continue;
        bf->ptr = base ? base + bf->offset : NULL;
        bf->t.storage->data = bf->ptr;
    }
}

void ms_program_bind_arena(ms_program *p, float *arena) {
    if (!p->member || p->shapes_only || !p->micro || p->arena == arena) return;
    p->arena = arena;
    bind_buffers(p, arena, false);
}

size_t ms_program_scratch_bytes(const ms_program *p) {
    return p->scratch_floats ? (p->scratch_floats + 16) * sizeof(float) : 0;
}

void ms_program_bind_scratch(ms_program *p, float *scratch) {
    if (!p->member || p->shapes_only || !p->scratch_floats || p->scratch == scratch) return;
    p->scratch = scratch;
    bind_buffers(p, scratch, true);
}

ms_tensor *ms_program_local(ms_program *p, int v) {
    if (!p->member || p->shapes_only || v < 0 || v >= p->g->nv) return NULL;
    if (p->g->v[v].kind != GV_INPUT && v != p->g->output) return NULL;
    return &p->bufs[p->pv[v].buf].t;
}

ms_tensor *ms_program_output_grad(ms_program *p) {
    if (!p->member || p->shapes_only || p->out_grad_buf < 0) return NULL;
    return &p->bufs[p->out_grad_buf].t;
}

ms_tensor *ms_program_input_grad(ms_program *p, int v) {
    if (!p->member || p->shapes_only || v < 0 || v >= p->g->nv || p->in_grad_buf[v] < 0)
        return NULL;
    return &p->bufs[p->in_grad_buf[v]].t;
}

/* Writes the box [start, start + len) of the host array `global` (shape gshape) into buffer
 * b: straight on the host, through a packed host copy elsewhere. */
ms_status prog_write_box(ms_program *p, buf *b, const float *global, const int64_t *gshape,
                         const int64_t *start, const int64_t *len, int ndim, ms_error *err) {
    int64_t zero[MS_MAX_DIMS] = {0}, n = 1;
    for (int d = 0; d < ndim; d++) n *= len[d];
    if (prog_host_reachable(p, b)) {
        ms_copy_box_f32(b->ptr, len, zero, global, gshape, start, len, ndim);
        return MS_OK;
    }
    float *packed = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
    ms_copy_box_f32(packed, len, zero, global, gshape, start, len, ndim);
    ms_status st = ms_device_copy(p->dev, b->ptr, packed, sizeof(float) * (size_t)n,
                                  MS_COPY_HOST_TO_DEVICE, err);
    free(packed);
    return st;
}

ms_status ms_program_feed(ms_program *p, int v, const float *global, ms_error *err) {
    if (!p->member) return MS_OK;
    MS_CHECK(check_runnable(p, err));
    if (v < 0 || v >= p->g->nv || p->g->v[v].kind != GV_INPUT)
        return ms_fail(err, MS_ERR_INVALID, "feed: value %d is not an input", v);
    gvalue *gv = &p->g->v[v];
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(&p->pv[v].pl, p->mesh, p->coords, gv->shape.ndim, gv->shape.d, start, len);
    return prog_write_box(p, &p->bufs[p->pv[v].buf], global, gv->shape.d, start, len,
                          gv->shape.ndim, err);
}

int ms_program_num_params(const ms_program *p) {
    return p->nparams;
}

ms_status ms_program_param(ms_program *p, int i, ms_param_view *out) {
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= p->nparams) return MS_ERR_INVALID;
    int v = p->params[i];
    pvalue *pv = &p->pv[v];
    out->name = p->g->v[v].name;
    out->value = v;
    out->gshape = p->g->v[v].shape;
    out->data = p->bufs[prog_param_home(p, v, &out->pl)].t;
    out->grad = p->bufs[pv->param_grad_buf].t;
    out->grad_pl = pv->grad_pl;
    out->opt_pl = pv->opt_pl;
    if (pv->master_buf >= 0) out->use_bytes = (size_t)p->bufs[pv->buf].numel * sizeof(uint16_t);
    out->host_master = pv->up_buf >= 0;
    prog_local_shape(p, &out->gshape, &pv->opt_pl, &out->opt_shape);
    out->opt_n = prog_shape_n(&out->opt_shape);
    out->data_off = prog_rows_offset(p, &out->gshape, &out->pl, &pv->opt_pl);
    out->grad_off = prog_rows_offset(p, &out->gshape, &pv->grad_pl, &pv->opt_pl);
    out->owner = true;
    for (int m = 0; m < pv->grad_pl.n; m++)
        if (pv->grad_pl.p[m].kind != MS_PL_SHARD && p->coords[m] != 0) out->owner = false;
    return MS_OK;
}

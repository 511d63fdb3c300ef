/* reshard_exec.c - executing reshard plans on a rank's local part.
 *
 * Every local part is a contiguous row-major box of the global tensor (see placement.h),
 * so each step is: pack blocks along one tensor dim, run one collective on the mesh dim's
 * communicator, unpack. When the split dim is the outermost non-trivial dim the blocks are
 * already contiguous and the collective reads and writes the tensors directly.
 *
 * Local tensors and the workspace are memory of the rank's device: packing and unpacking are
 * the device's box copies, and the collectives stage device memory where their backend needs
 * it (comm.h), so the host never reads a tensor here.
 *
 * Elements are float32 or bf16 (ms_reshard_run_dt): packing copies elements of either size,
 * and the bf16 partial sums go through the communicator's bf16 reductions (fp32 in rank order,
 * rounded once), so a bf16 reshard moves half the bytes of a float32 one.
 */
#include "engine/dist/reshard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

/* Largest group along one mesh dim that the executor handles (bounds its stack arrays). */
#define MS_COMM_MAX_GROUP 1024

typedef struct step_io {
    const ms_rstep *step;
    ms_comm *comm;
    int coord, n; /* this rank's coordinate along the mesh dim, and the dim's size */
    int ndim;
    int64_t blen[MS_MAX_DIMS], alen[MS_MAX_DIMS]; /* local box lengths before and after */
    const void *in;                               /* elements of cdt */
    void *out;
    ms_comm_dtype cdt;
    size_t elt;            /* bytes per element */
    size_t coll_bytes;     /* exact, for the report */
    ms_ctx *ctx;           /* for workspace */
    const int64_t *gshape; /* [ndim] the global tensor's shape, for messages */
} step_io;

/* Scratch from the rank's workspace (ctx->ws): grow-only, so the steady state allocates
 * nothing. Slots 0 and 1 hold intermediate step results, 2 and 3 packing buffers. The
 * workspace is tensor-sized, so it comes from the rank's device (counted in the memory
 * views) and a failure is MS_ERR_NOMEM, not an abort; the slot is then empty and the rank
 * can go on (a smaller reshard, or the same one once memory is freed). */
static ms_status ws_get(step_io *io, int slot, size_t count, void **out, ms_error *err) {
    ms_ctx *ctx = io->ctx;
    size_t need = (count + 16) * io->elt;
    if (ctx->ws_cap[slot] < need) {
        ms_device_free(ctx->device, ctx->ws[slot], ctx->ws_cap[slot]);
        ctx->ws[slot] = NULL;
        ctx->ws_cap[slot] = 0;
        size_t cap = need + need / 2;
        cap = (cap + 63) / 64 * 64;
        void *p = NULL;
        ms_error why = {0};
        if (ms_device_alloc(ctx->device, cap, &p, &why) != MS_OK) {
            char shape[96];
            size_t k = 0;
            shape[0] = '\0';
            for (int d = 0; d < io->ndim && k < sizeof shape; d++)
                k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? ", " : "",
                                      (long long)io->gshape[d]);
            return ms_fail(err, MS_ERR_NOMEM,
                           "out of memory: the reshard workspace for a [%s] tensor needs %zu "
                           "bytes (%s)",
                           shape, cap, why.msg);
        }
        ctx->ws[slot] = p;
        ctx->ws_cap[slot] = cap;
    }
    *out = ctx->ws[slot];
    return MS_OK;
}

static int64_t prod(const int64_t *v, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= v[i];
    return p;
}

/* Blocks along dim d of a box with lengths `len`, where dim d is split n ways from `parent`:
 * counts[c] elements of block c, displs[c] its offset in packed order. */
static void block_layout(const int64_t *len, int ndim, int d, int64_t parent, int n, size_t *counts,
                         size_t *displs) {
    int64_t other = prod(len, 0, d) * prod(len, d + 1, ndim);
    size_t off = 0;
    for (int c = 0; c < n; c++) {
        int64_t o, l;
        ms_split_part(parent, n, c, &o, &l);
        counts[c] = (size_t)(other * l);
        displs[c] = off;
        off += counts[c];
    }
}

/* Copies between a tensor of lengths `full` and block c (all of `full` but dim d, which
 * holds chunk c of full[d]) stored contiguously at `block`. pack: full -> block. Both are
 * memory of the rank's device, so the device copies the box. */
static ms_status move_block(const step_io *io, const void *full_data, const int64_t *full, int d,
                            int c, void *block, bool pack, ms_error *err) {
    int64_t off, l;
    ms_split_part(full[d], io->n, c, &off, &l);
    int64_t blen[MS_MAX_DIMS], at[MS_MAX_DIMS] = {0};
    const int64_t zero[MS_MAX_DIMS] = {0};
    memcpy(blen, full, sizeof(int64_t) * (size_t)io->ndim);
    blen[d] = l;
    at[d] = off;
    ms_device *dev = io->ctx->device;
    if (pack)
        return ms_device_copy_box(dev, block, blen, zero, full_data, full, at, blen, io->ndim,
                                  io->elt, err);
    return ms_device_copy_box(dev, (void *)full_data, full, at, block, blen, zero, blen, io->ndim,
                              io->elt, err);
}

/* Every block c of `full` along dim d to or from its place in `packed` (displs in elements). */
static ms_status move_blocks(const step_io *io, const void *full_data, const int64_t *full, int d,
                             char *packed, const size_t *displs, bool pack, ms_error *err) {
    for (int c = 0; c < io->n; c++)
        MS_CHECK(move_block(io, full_data, full, d, c, packed + displs[c] * io->elt, pack, err));
    return MS_OK;
}

static ms_reduce_op step_op(const step_io *io) {
    return (ms_reduce_op)io->step->before.p[io->step->mesh_dim].reduce;
}

static ms_status run_all_reduce(step_io *io, ms_error *err) {
    size_t count = (size_t)prod(io->blen, 0, io->ndim);
    io->coll_bytes = count * io->elt;
    return ms_all_reduce_dt(io->comm, io->cdt, io->in, io->out, count, step_op(io), err);
}

static ms_status run_reduce_scatter(step_io *io, ms_error *err) {
    int d = io->step->after.p[io->step->mesh_dim].dim;
    size_t counts[MS_COMM_MAX_GROUP], displs[MS_COMM_MAX_GROUP];
    block_layout(io->blen, io->ndim, d, io->blen[d], io->n, counts, displs);
    size_t total = (size_t)prod(io->blen, 0, io->ndim);
    io->coll_bytes = total * io->elt;
    const void *send = io->in;
    if (prod(io->blen, 0, d) > 1) {
        char *staging;
        MS_CHECK(ws_get(io, 2, total, (void **)&staging, err));
        MS_CHECK(move_blocks(io, io->in, io->blen, d, staging, displs, true, err));
        send = staging;
    }
    return ms_reduce_scatter_dt(io->comm, io->cdt, send, io->out, counts, step_op(io), err);
}

static ms_status run_all_gather(step_io *io, ms_error *err) {
    int d = io->step->before.p[io->step->mesh_dim].dim;
    size_t counts[MS_COMM_MAX_GROUP], displs[MS_COMM_MAX_GROUP];
    block_layout(io->alen, io->ndim, d, io->alen[d], io->n, counts, displs);
    size_t total = (size_t)prod(io->alen, 0, io->ndim);
    io->coll_bytes = total * io->elt;
    if (prod(io->alen, 0, d) == 1)
        return ms_all_gather_dt(io->comm, io->cdt, io->in, io->out, counts, err);
    char *staging;
    MS_CHECK(ws_get(io, 2, total, (void **)&staging, err));
    MS_CHECK(ms_all_gather_dt(io->comm, io->cdt, io->in, staging, counts, err));
    return move_blocks(io, io->out, io->alen, d, staging, displs, false, err);
}

static ms_status run_all_to_all(step_io *io, ms_error *err) {
    int m = io->step->mesh_dim;
    int a = io->step->before.p[m].dim, b = io->step->after.p[m].dim;
    size_t scounts[MS_COMM_MAX_GROUP], sdispls[MS_COMM_MAX_GROUP];
    size_t rcounts[MS_COMM_MAX_GROUP], rdispls[MS_COMM_MAX_GROUP];
    /* Send: my part cut along b into the peers' chunks. Receive: each peer's chunk of a,
     * restricted to my chunk of b. */
    block_layout(io->blen, io->ndim, b, io->blen[b], io->n, scounts, sdispls);
    block_layout(io->alen, io->ndim, a, io->alen[a], io->n, rcounts, rdispls);
    size_t sent = (size_t)prod(io->blen, 0, io->ndim), got = (size_t)prod(io->alen, 0, io->ndim);
    io->coll_bytes = sent * io->elt;
    char *sbuf, *rbuf;
    MS_CHECK(ws_get(io, 2, sent, (void **)&sbuf, err));
    MS_CHECK(ws_get(io, 3, got, (void **)&rbuf, err));
    MS_CHECK(move_blocks(io, io->in, io->blen, b, sbuf, sdispls, true, err));
    MS_CHECK(
        ms_all_to_all_dt(io->comm, io->cdt, sbuf, scounts, sdispls, rbuf, rcounts, rdispls, err));
    return move_blocks(io, io->out, io->alen, a, rbuf, rdispls, false, err);
}

static ms_status run_slice(step_io *io, ms_error *err) {
    int d = io->step->after.p[io->step->mesh_dim].dim;
    return move_block(io, io->in, io->blen, d, io->coord, io->out, true, err);
}

static ms_status run_partialize(step_io *io, ms_error *err) {
    ms_placement p = io->step->after.p[io->step->mesh_dim];
    size_t bytes = (size_t)prod(io->blen, 0, io->ndim) * io->elt;
    /* sum: the value lives on coordinate 0, the others hold zeros (all-zero bits in bf16 too). */
    if (p.reduce != MS_REDUCE_SUM || io->coord == 0)
        return ms_device_copy(io->ctx->device, io->out, io->in, bytes, MS_COPY_DEVICE_TO_DEVICE,
                              err);
    return ms_device_zero(io->ctx->device, io->out, bytes, err);
}

static ms_status run_step(step_io *io, ms_error *err) {
    switch (io->step->kind) {
        case MS_RSTEP_ALL_REDUCE:
            return run_all_reduce(io, err);
        case MS_RSTEP_REDUCE_SCATTER:
            return run_reduce_scatter(io, err);
        case MS_RSTEP_ALL_GATHER:
            return run_all_gather(io, err);
        case MS_RSTEP_ALL_TO_ALL:
            return run_all_to_all(io, err);
        case MS_RSTEP_SLICE:
            return run_slice(io, err);
        case MS_RSTEP_PARTIALIZE:
            return run_partialize(io, err);
        default:
            return ms_fail(err, MS_ERR_INTERNAL, "reshard: unknown step kind %d", io->step->kind);
    }
}

double ms_reshard_plan_bytes(const ms_reshard_plan *plan, size_t elt_size) {
    double bytes = 0;
    for (int k = 0; k < plan->nsteps; k++) bytes += plan->steps[k].coll_bytes;
    return bytes * (double)elt_size / sizeof(float);
}

ms_status ms_reshard_run_dt(ms_dmesh *dm, const ms_reshard_plan *plan, int ndim,
                            const int64_t *gshape, ms_dtype dt, const void *in, void *out,
                            ms_reshard_report *report, ms_error *err) {
    if (report) memset(report, 0, sizeof *report);
    if (dt != MS_F32 && dt != MS_BF16)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "reshard: element type %s is not supported; use f32 or bf16",
                       ms_dtype_name(dt));
    if (!ms_dmesh_is_member(dm)) return MS_OK;
    const ms_comm_dtype cdt = dt == MS_BF16 ? MS_COMM_BF16 : MS_COMM_F32;
    const size_t elt = ms_comm_dtype_size(cdt);
    int64_t t_begin = ms_now_ns();
    if (plan->nsteps == 0) {
        int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
        (void)start;
        ms_local_box(&plan->src, &dm->mesh, dm->coords, ndim, gshape, start, len);
        if (in == out) return MS_OK;
        return ms_device_copy(dm->ctx->device, out, in, elt * (size_t)prod(len, 0, ndim),
                              MS_COPY_DEVICE_TO_DEVICE, err);
    }
    const void *cur = in;
    for (int k = 0; k < plan->nsteps; k++) {
        const ms_rstep *s = &plan->steps[k];
        step_io io = {.step = s,
                      .comm = dm->dim_comm[s->mesh_dim],
                      .ndim = ndim,
                      .cdt = cdt,
                      .elt = elt,
                      .ctx = dm->ctx,
                      .gshape = gshape};
        io.coord = dm->coords[s->mesh_dim];
        io.n = dm->mesh.shape[s->mesh_dim];
        if (io.n > MS_COMM_MAX_GROUP)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "reshard: mesh dim %s has %d ranks; at most %d",
                           dm->mesh.names[s->mesh_dim], io.n, MS_COMM_MAX_GROUP);
        int64_t start[MS_MAX_DIMS];
        ms_local_box(&s->before, &dm->mesh, dm->coords, ndim, gshape, start, io.blen);
        ms_local_box(&s->after, &dm->mesh, dm->coords, ndim, gshape, start, io.alen);
        io.in = cur;
        /* The last step writes the caller's buffer; the others alternate two workspaces. */
        io.out = out;
        ms_status st = MS_OK;
        if (k < plan->nsteps - 1)
            st = ws_get(&io, k & 1, (size_t)prod(io.alen, 0, ndim), &io.out, err);
        int64_t t0 = ms_now_ns();
        if (st == MS_OK) st = run_step(&io, err);
        if (st != MS_OK) {
            char a[96], b[96];
            return ms_fail_wrap(err, st, "reshard %s -> %s, step %d (%s on mesh dim %s)",
                                ms_placements_str(&plan->src, a, sizeof a),
                                ms_placements_str(&plan->dst, b, sizeof b), k + 1,
                                ms_rstep_name(s->kind), dm->mesh.names[s->mesh_dim]);
        }
        cur = io.out;
        if (report) {
            report->steps[k].kind = s->kind;
            report->steps[k].mesh_dim = s->mesh_dim;
            report->steps[k].coll_bytes = io.coll_bytes;
            report->steps[k].ns = ms_now_ns() - t0;
            report->coll_bytes += io.coll_bytes;
            report->nsteps = k + 1;
        }
    }
    if (report) report->ns = ms_now_ns() - t_begin;
    return MS_OK;
}

ms_status ms_reshard_run(ms_dmesh *dm, const ms_reshard_plan *plan, int ndim, const int64_t *gshape,
                         const float *in, float *out, ms_reshard_report *report, ms_error *err) {
    return ms_reshard_run_dt(dm, plan, ndim, gshape, MS_F32, in, out, report, err);
}

ms_status ms_reshard(ms_dtensor *t, const ms_placements *dst, ms_reshard_report *report,
                     ms_error *err) {
    if (report) memset(report, 0, sizeof *report);
    ms_dmesh *dm = t->mesh;
    const ms_reshard_plan *plan;
    MS_CHECK(
        ms_plan_cache_get(dm->ctx->plans, &dm->mesh, &t->pl, dst, t->ndim, t->gshape, &plan, err));
    if (!ms_dmesh_is_member(dm)) {
        t->pl = *dst;
        return MS_OK;
    }
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(dst, &dm->mesh, dm->coords, t->ndim, t->gshape, start, len);
    ms_tensor next;
    MS_CHECK(ms_tensor_alloc(dm->ctx->device, MS_F32, t->ndim, len, &next, err));
    ms_tensor src = ms_tensor_share(&t->local);
    if (!ms_tensor_is_contiguous(&src) || src.dtype != MS_F32) {
        ms_tensor c;
        ms_status st = ms_tensor_contiguous(&src, MS_F32, &c, err);
        ms_tensor_release(&src);
        if (st != MS_OK) {
            ms_tensor_release(&next);
            return st;
        }
        src = c;
    }
    ms_status st = ms_reshard_run(dm, plan, t->ndim, t->gshape, ms_tensor_f32(&src),
                                  ms_tensor_f32(&next), report, err);
    ms_tensor_release(&src);
    if (st != MS_OK) {
        ms_tensor_release(&next);
        return st;
    }
    ms_tensor_release(&t->local);
    t->local = next;
    t->pl = *dst;
    return MS_OK;
}

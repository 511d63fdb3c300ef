/* reshard_xmesh.c - moving a DistTensor between meshes on different rank sets (as between
 * pipeline stages) with point-to-point messages on the world communicator.
 *
 * Every rank computes the same transfer schedule without talking: for each target rank
 * and each distinct source box that overlaps the target's box, one holder of that source
 * box (replicas are spread over target ranks) sends the intersection. A Partial source is
 * first reduced on the source mesh; a Partial target is produced from the replicated value
 * with the usual R->P rule.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"

typedef struct box {
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
} box;

static box rank_box(const ms_placements *pl, const ms_mesh *m, int index, int ndim,
                    const int64_t *gshape) {
    int coords[MS_MESH_MAX_DIMS];
    ms_mesh_coords(m, m->ranks[index], coords);
    box b;
    ms_local_box(pl, m, coords, ndim, gshape, b.start, b.len);
    return b;
}

static bool intersect(const box *a, const box *b, int ndim, box *out) {
    bool nonempty = true;
    for (int d = 0; d < ndim; d++) {
        int64_t lo = a->start[d] > b->start[d] ? a->start[d] : b->start[d];
        int64_t hi_a = a->start[d] + a->len[d], hi_b = b->start[d] + b->len[d];
        int64_t hi = hi_a < hi_b ? hi_a : hi_b;
        out->start[d] = lo;
        out->len[d] = hi > lo ? hi - lo : 0;
        if (out->len[d] == 0) nonempty = false;
    }
    return nonempty;
}

static bool same_box(const box *a, const box *b, int ndim) {
    for (int d = 0; d < ndim; d++)
        if (a->start[d] != b->start[d] || a->len[d] != b->len[d]) return false;
    return true;
}

static int64_t box_numel(const box *b, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= b->len[d];
    return n;
}

/* Copies `region` (global coordinates) out of src, a contiguous f32 array holding the box
 * `from`, into dst, one holding the box `to`; both memory of the rank's device. */
static ms_status copy_region(ms_device *dev, float *dst, const box *to, const float *src,
                             const box *from, const box *region, int ndim, ms_error *err) {
    int64_t at_dst[MS_MAX_DIMS], at_src[MS_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        at_dst[d] = region->start[d] - to->start[d];
        at_src[d] = region->start[d] - from->start[d];
    }
    return ms_device_copy_box(dev, dst, to->len, at_dst, src, from->len, at_src, region->len, ndim,
                              sizeof(float), err);
}

/* One transfer of the schedule: source mesh index -> target mesh index, region. */
typedef struct transfer {
    int src, dst;
    box region;
} transfer;

/* The schedule: for each target and each distinct source box, the chosen holder. */
static int build_schedule(const ms_mesh *sm, const ms_placements *spl, const ms_mesh *dmesh,
                          const ms_placements *dpl, int ndim, const int64_t *gshape,
                          transfer **out) {
    box *sbox = xmalloc(sizeof *sbox * (size_t)sm->size);
    for (int i = 0; i < sm->size; i++) sbox[i] = rank_box(spl, sm, i, ndim, gshape);
    int cap = 64, n = 0;
    transfer *t = xmalloc(sizeof *t * (size_t)cap);
    int *holders = xmalloc(sizeof(int) * (size_t)sm->size);
    bool *seen = xmalloc(sizeof(bool) * (size_t)sm->size);
    for (int j = 0; j < dmesh->size; j++) {
        box db = rank_box(dpl, dmesh, j, ndim, gshape);
        memset(seen, 0, sizeof(bool) * (size_t)sm->size);
        for (int i = 0; i < sm->size; i++) {
            if (seen[i]) continue;
            int nh = 0;
            for (int k = i; k < sm->size; k++)
                if (!seen[k] && same_box(&sbox[k], &sbox[i], ndim)) {
                    seen[k] = true;
                    holders[nh++] = k;
                }
            box region;
            if (!intersect(&sbox[i], &db, ndim, &region)) continue;
            /* Prefer a holder that is the target itself (a local copy), else spread. */
            int pick = holders[j % nh];
            for (int h = 0; h < nh; h++)
                if (sm->ranks[holders[h]] == dmesh->ranks[j]) pick = holders[h];
            if (n == cap) t = xrealloc(t, sizeof *t * (size_t)(cap *= 2));
            t[n++] = (transfer){pick, j, region};
        }
    }
    free(sbox), free(holders), free(seen);
    *out = t;
    return n;
}

static void all_replicate(const ms_placements *in, ms_placements *out) {
    *out = *in;
    for (int m = 0; m < in->n; m++)
        if (in->p[m].kind == MS_PL_PARTIAL) out->p[m] = ms_pl_replicate();
}

ms_status ms_reshard_cross_mesh(const ms_dtensor *src, ms_dmesh *dst_mesh, const ms_placements *dst,
                                ms_dtensor *out, ms_reshard_report *report, ms_error *err) {
    memset(out, 0, sizeof *out);
    if (report) memset(report, 0, sizeof *report);
    MS_CHECK(ms_placements_validate(dst, dst_mesh->mesh.ndim, src->ndim, err));
    ms_ctx *ctx = dst_mesh->ctx;
    int64_t t0 = ms_now_ns();
    const int ndim = src->ndim;
    ms_dmesh *sdm = src->mesh;
    bool in_src = ms_dmesh_is_member(sdm), in_dst = ms_dmesh_is_member(dst_mesh);

    /* 1. Resolve a Partial source on the source mesh (a copy; src stays as it is). */
    ms_placements spl, dpl;
    all_replicate(&src->pl, &spl);
    all_replicate(dst, &dpl);
    ms_dtensor s = *src;
    s.local = (ms_tensor){0};
    if (in_src) MS_CHECK(ms_dtensor_local_copy(sdm, &src->local, false, &s.local, err));
    ms_status st = ms_reshard(&s, &spl, NULL, err);
    if (st != MS_OK) {
        ms_tensor_release(&s.local);
        return ms_fail_wrap(err, st, "cross-mesh reshard (reducing the partial source)");
    }

    /* 2. Schedule, then one batch of sends and receives on the world communicator. */
    ms_dtensor t = {.ndim = ndim, .mesh = dst_mesh, .pl = *dst};
    memcpy(t.gshape, src->gshape, sizeof(int64_t) * (size_t)ndim);
    box mydst = {0}, mysrc = {0};
    if (in_dst) {
        mydst = rank_box(&dpl, &dst_mesh->mesh, dst_mesh->index, ndim, t.gshape);
        st = ms_tensor_alloc(ctx->device, MS_F32, ndim, mydst.len, &t.local, err);
        if (st != MS_OK) {
            ms_tensor_release(&s.local);
            return st;
        }
    }
    if (in_src) mysrc = rank_box(&spl, &sdm->mesh, sdm->index, ndim, t.gshape);
    transfer *sched;
    int nt = (in_src || in_dst)
                 ? build_schedule(&sdm->mesh, &spl, &dst_mesh->mesh, &dpl, ndim, t.gshape, &sched)
                 : 0;
    int nops = 0;
    ms_p2p_op *ops = xmalloc(sizeof *ops * (size_t)(nt + 1));
    float **bufs = xcalloc((size_t)nt + 1, sizeof *bufs);
    size_t *buf_bytes = xcalloc((size_t)nt + 1, sizeof *buf_bytes);
    size_t sent = 0;
    for (int k = 0; k < nt && st == MS_OK; k++) {
        transfer *tr = &sched[k];
        int from = sdm->mesh.ranks[tr->src], to = dst_mesh->mesh.ranks[tr->dst];
        size_t n = (size_t)box_numel(&tr->region, ndim);
        if (from != ctx->rank && to != ctx->rank) continue;
        if (from == ctx->rank && to == ctx->rank) {
            st = copy_region(ctx->device, ms_tensor_f32(&t.local), &mydst, ms_tensor_f32(&s.local),
                             &mysrc, &tr->region, ndim, err);
            continue;
        }
        /* A message buffer on the device (its box is the region); the communicator stages it
         * where its backend needs host memory. */
        buf_bytes[k] = sizeof(float) * n + 1;
        st = ms_device_alloc(ctx->device, buf_bytes[k], (void **)&bufs[k], err);
        if (st != MS_OK) break;
        if (from == ctx->rank) {
            st = copy_region(ctx->device, bufs[k], &tr->region, ms_tensor_f32(&s.local), &mysrc,
                             &tr->region, ndim, err);
            ops[nops++] = (ms_p2p_op){MS_P2P_SEND, to, bufs[k], n, 0};
            sent += n * sizeof(float);
        } else {
            ops[nops++] = (ms_p2p_op){MS_P2P_RECV, from, bufs[k], n, 0};
        }
    }
    if (st == MS_OK && nops) st = ms_p2p(ctx->world, ops, nops, err);
    /* Unpack what arrived. */
    for (int k = 0; k < nt && st == MS_OK; k++) {
        transfer *tr = &sched[k];
        if (dst_mesh->mesh.ranks[tr->dst] != ctx->rank || sdm->mesh.ranks[tr->src] == ctx->rank)
            continue;
        st = copy_region(ctx->device, ms_tensor_f32(&t.local), &mydst, bufs[k], &tr->region,
                         &tr->region, ndim, err);
    }
    for (int k = 0; k < nt; k++) ms_device_free(ctx->device, bufs[k], buf_bytes[k]);
    free(bufs), free(buf_bytes), free(ops);
    if (nt) free(sched);
    ms_tensor_release(&s.local);
    if (st != MS_OK) {
        ms_tensor_release(&t.local);
        return ms_fail_wrap(err, st, "cross-mesh reshard");
    }
    /* 3. R -> P on the target where asked: sum keeps the value on coordinate 0 only. */
    if (in_dst)
        for (int m = 0; m < dst->n; m++)
            if (dst->p[m].kind == MS_PL_PARTIAL && dst->p[m].reduce == MS_REDUCE_SUM &&
                dst_mesh->coords[m] != 0) {
                st = ms_device_zero(ctx->device, ms_tensor_data(&t.local),
                                    sizeof(float) * (size_t)ms_tensor_numel(&t.local), err);
                break;
            }
    if (st != MS_OK) {
        ms_tensor_release(&t.local);
        return st;
    }
    if (report) {
        report->nsteps = 1;
        report->steps[0].kind = MS_RSTEP_SEND_RECV;
        report->steps[0].mesh_dim = -1;
        report->steps[0].coll_bytes = sent;
        report->steps[0].ns = ms_now_ns() - t0;
        report->coll_bytes = sent;
        report->ns = report->steps[0].ns;
    }
    *out = t;
    return MS_OK;
}

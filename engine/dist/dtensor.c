/* dtensor.c - DistTensor construction: shard (global -> local), full (local -> global) and
 * from_local (local shards -> DistTensor, with every rank's size checked). */
#include "engine/dist/dtensor.h"

#include <stdio.h>
#include <string.h>

#include "engine/dist/reshard.h"

static ms_status check_common(ms_dmesh *mesh, const ms_placements *pl, int ndim,
                              const int64_t *gshape, ms_error *err) {
    if (ndim < 0 || ndim > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID, "tensor rank %d outside 0..%d", ndim, MS_MAX_DIMS);
    if (gshape)
        for (int d = 0; d < ndim; d++)
            if (gshape[d] < 0)
                return ms_fail(err, MS_ERR_INVALID, "global dim %d has negative size %lld", d,
                               (long long)gshape[d]);
    return ms_placements_validate(pl, mesh->mesh.ndim, ndim, err);
}

bool ms_dtensor_box(const ms_dtensor *t, int64_t *start, int64_t *len) {
    if (!ms_dmesh_is_member(t->mesh)) return false;
    ms_local_box(&t->pl, &t->mesh->mesh, t->mesh->coords, t->ndim, t->gshape, start, len);
    return true;
}

void ms_dtensor_release(ms_dtensor *t) {
    if (!t) return;
    ms_tensor_release(&t->local);
    memset(t, 0, sizeof *t);
}

ms_status ms_dtensor_shard(ms_dmesh *mesh, const ms_tensor *global, const ms_placements *pl,
                           ms_dtensor *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    MS_CHECK(check_common(mesh, pl, global->ndim, global->shape, err));
    ms_dtensor t = {.ndim = global->ndim, .mesh = mesh, .pl = *pl};
    memcpy(t.gshape, global->shape, sizeof(int64_t) * (size_t)global->ndim);
    if (!ms_dmesh_is_member(mesh)) {
        *out = t;
        return MS_OK;
    }
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(pl, &mesh->mesh, mesh->coords, t.ndim, t.gshape, start, len);
    /* A strided view of the box, a contiguous f32 copy of it on the host (global is host
     * memory), then that copy onto the rank's device. */
    ms_tensor view = ms_tensor_share(global), tmp, host = {0};
    ms_status st = MS_OK;
    for (int d = 0; d < t.ndim && st == MS_OK; d++) {
        st = ms_tensor_slice(&view, d, start[d], len[d], &tmp, err);
        if (st == MS_OK) {
            ms_tensor_release(&view);
            view = tmp;
        }
    }
    if (st == MS_OK) st = ms_tensor_contiguous(&view, MS_F32, &host, err);
    if (st == MS_OK) st = ms_tensor_alloc(mesh->ctx->device, MS_F32, t.ndim, len, &t.local, err);
    const size_t bytes = (size_t)ms_tensor_numel(&t.local) * sizeof(float);
    /* R -> P for partial mesh dims: sum keeps the value on coordinate 0 only (alloc zeroed). */
    bool zero = false;
    for (int m = 0; m < pl->n; m++)
        zero |= pl->p[m].kind == MS_PL_PARTIAL && pl->p[m].reduce == MS_REDUCE_SUM &&
                mesh->coords[m] != 0;
    if (st == MS_OK && !zero)
        st = ms_device_copy(mesh->ctx->device, ms_tensor_data(&t.local), ms_tensor_data(&host),
                            bytes, MS_COPY_HOST_TO_DEVICE, err);
    ms_tensor_release(&view);
    ms_tensor_release(&host);
    if (st != MS_OK) {
        ms_tensor_release(&t.local);
        return st;
    }
    *out = t;
    return MS_OK;
}

ms_status ms_dtensor_local_copy(const ms_dmesh *mesh, const ms_tensor *local, bool to_host,
                                ms_tensor *out, ms_error *err) {
    if (!ms_tensor_is_contiguous(local) || local->dtype != MS_F32)
        return ms_tensor_contiguous(local, MS_F32, out, err);
    ms_device *dev = mesh->ctx->device;
    MS_CHECK(ms_tensor_alloc(to_host ? ms_device_host() : dev, MS_F32, local->ndim, local->shape,
                             out, err));
    ms_status st = ms_device_move(dev, ms_tensor_data(out), ms_tensor_data(local),
                                  sizeof(float) * (size_t)ms_tensor_numel(local), err);
    if (st != MS_OK) ms_tensor_release(out);
    return st;
}

ms_status ms_dtensor_full(const ms_dtensor *t, ms_tensor *global, ms_error *err) {
    memset(global, 0, sizeof *global);
    ms_dtensor tmp = *t;
    if (ms_dmesh_is_member(t->mesh))
        MS_CHECK(ms_dtensor_local_copy(t->mesh, &t->local, false, &tmp.local, err));
    ms_placements all_r = {.n = t->pl.n};
    for (int m = 0; m < all_r.n; m++) all_r.p[m] = ms_pl_replicate();
    ms_status st = ms_reshard(&tmp, &all_r, NULL, err);
    if (st != MS_OK || !tmp.local.storage) {
        ms_tensor_release(&tmp.local);
        return st;
    }
    /* The replicated value is on the rank's device; the caller gets it in host memory. */
    if (ms_device_host_addressable(t->mesh->ctx->device)) {
        *global = tmp.local;
        return MS_OK;
    }
    st = ms_dtensor_local_copy(t->mesh, &tmp.local, true, global, err);
    ms_tensor_release(&tmp.local);
    return st;
}

/* Exact float encoding of a size for exchange through float collectives: two 24-bit
 * halves, so sizes up to 2^48 survive. */
static void size_to_floats(int64_t v, float *f) {
    f[0] = (float)(v >> 24);
    f[1] = (float)(v & 0xffffff);
}
static int64_t floats_to_size(const float *f) {
    return ((int64_t)f[0] << 24) + (int64_t)f[1];
}

/* Infers the global size of tensor dim d from every member's local size: gathers the sizes
 * along the shard chain of d, innermost first, checking each level against the balanced
 * split. On a mismatch sets *bad_rank (world rank) and a message. Collective. */
static ms_status infer_dim(ms_dmesh *mesh, const ms_placements *pl, int d, int64_t local,
                           int64_t *global, int *bad_rank, char *why, size_t why_len,
                           ms_error *err) {
    int chain[MS_MESH_MAX_DIMS];
    int n = ms_shard_chain(pl, d, chain);
    int64_t cur = local;
    for (int i = n - 1; i >= 0; i--) {
        ms_comm *c = mesh->dim_comm[chain[i]];
        int k = ms_comm_size(c);
        float mine[2], all[2 * 1024];
        if (k > 1024)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "from_local: mesh dim over 1024 ranks");
        size_to_floats(cur, mine);
        size_t counts[1024];
        for (int r = 0; r < k; r++) counts[r] = 2;
        MS_CHECK(ms_all_gather(c, mine, all, counts, err));
        int64_t total = 0;
        for (int r = 0; r < k; r++) total += floats_to_size(all + 2 * r);
        for (int r = 0; r < k && *bad_rank < 0; r++) {
            int64_t off, want, got = floats_to_size(all + 2 * r);
            ms_split_part(total, k, r, &off, &want);
            if (got != want) {
                *bad_rank = ms_comm_world_rank(c, r);
                snprintf(why, why_len,
                         "rank %d holds %lld along tensor dim %d, but the balanced split of %lld "
                         "over mesh dim '%s' (%d ranks) gives it %lld",
                         *bad_rank, (long long)got, d, (long long)total, mesh->mesh.names[chain[i]],
                         k, (long long)want);
            }
        }
        cur = total;
    }
    *global = cur;
    return MS_OK;
}

ms_status ms_dtensor_from_local(ms_dmesh *mesh, ms_tensor *local, const ms_placements *pl, int ndim,
                                const int64_t *gshape, ms_dtensor *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    MS_CHECK(check_common(mesh, pl, ndim, gshape, err));
    ms_dtensor t = {.ndim = ndim, .mesh = mesh, .pl = *pl};
    if (!ms_dmesh_is_member(mesh)) {
        if (gshape) memcpy(t.gshape, gshape, sizeof(int64_t) * (size_t)ndim);
        *out = t;
        return MS_OK;
    }
    if (local->ndim != ndim)
        return ms_fail(err, MS_ERR_INVALID, "from_local: local tensor has %d dims, expected %d",
                       local->ndim, ndim);
    int bad_rank = -1;
    char why[256] = "";
    if (gshape) {
        memcpy(t.gshape, gshape, sizeof(int64_t) * (size_t)ndim);
        int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
        ms_local_box(pl, &mesh->mesh, mesh->coords, ndim, gshape, start, len);
        for (int d = 0; d < ndim && bad_rank < 0; d++)
            if (local->shape[d] != len[d]) {
                bad_rank = mesh->ctx->rank;
                snprintf(why, sizeof why,
                         "rank %d holds %lld along tensor dim %d, but placements %s of global "
                         "shape dim %lld give it %lld",
                         bad_rank, (long long)local->shape[d], d,
                         ms_placements_str(pl, (char[96]){0}, 96), (long long)gshape[d],
                         (long long)len[d]);
            }
    } else {
        for (int d = 0; d < ndim; d++)
            MS_CHECK(infer_dim(mesh, pl, d, local->shape[d], &t.gshape[d], &bad_rank, why,
                               sizeof why, err));
    }
    /* Agree on the verdict across the whole mesh, so every member fails together. */
    float flag = (float)(bad_rank + 1), any = 0;
    for (int m = 0; m < mesh->mesh.ndim; m++) {
        MS_CHECK(ms_all_reduce(mesh->dim_comm[m], &flag, &any, 1, MS_REDUCE_MAX, err));
        flag = any;
    }
    if (any > 0) {
        if (bad_rank >= 0)
            return ms_fail(err, MS_ERR_INVALID,
                           "from_local: %s; pass local parts that follow "
                           "the balanced split (placement.h)",
                           why);
        return ms_fail(err, MS_ERR_INVALID,
                       "from_local: rank %d holds a local part whose size does not match the "
                       "balanced split of placements %s (see its error for the sizes)",
                       (int)any - 1, ms_placements_str(pl, (char[96]){0}, 96));
    }
    ms_status st = ms_dtensor_local_copy(mesh, local, false, &t.local, err);
    if (st != MS_OK) return st;
    ms_tensor_release(local);
    *out = t;
    return MS_OK;
}

/* dmesh.c - binding a mesh to per-dim communicators by splitting the world. */
#include "engine/dist/dmesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/core/trace_sink.h"

/* An id of this host, the same for every process on it (its name hashed, FNV-1a). */
static uint32_t host_id(void) {
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    return h;
}

/* With a GPU of its own for every member, a mesh dim's collectives on device memory go
 * straight over NCCL (ms_comm_adopt_direct); members that share a GPU (NCCL cannot put two
 * ranks on one device) keep staging through the host. The members compare their (host, GPU)
 * pairs, so all decide alike; so does NCCL's own failure to start, which then leaves the
 * host path and a note. */
static ms_status adopt_nccl(ms_ctx *ctx, ms_comm *c, ms_error *err) {
    const int n = ms_comm_size(c);
    if (ctx->device->ops->kind != MS_DEVICE_CUDA || n < 2) return MS_OK;
    uint32_t mine[2] = {host_id(), (uint32_t)ctx->device->ordinal};
    uint32_t *all = xmalloc(sizeof mine * (size_t)n);
    size_t *counts = xmalloc(sizeof *counts * (size_t)n);
    for (int r = 0; r < n; r++) counts[r] = sizeof mine;
    ms_status st = ms_all_gather_dt(c, MS_COMM_BYTES, mine, all, counts, err);
    bool distinct = true;
    for (int i = 0; st == MS_OK && i < n; i++)
        for (int j = i + 1; j < n; j++)
            distinct &= all[2 * i] != all[2 * j] || all[2 * i + 1] != all[2 * j + 1];
    free(all), free(counts);
    if (st != MS_OK || !distinct) return st;
    ms_comm *nccl = NULL;
    ms_error why = {0};
    if (ms_comm_nccl_create(c, ctx->device->ordinal, &nccl, &why) != MS_OK) {
        if (ms_comm_rank(c) == 0)
            fprintf(stderr, "note: mesh dim '%s' stages its collectives through the host: %s\n",
                    ms_comm_name(c), why.msg);
        return MS_OK;
    }
    return ms_comm_adopt_direct(c, nccl, err);
}

ms_status ms_dmesh_create(ms_ctx *ctx, const ms_mesh *mesh, ms_dmesh **out, ms_error *err) {
    *out = NULL;
    MS_CHECK(ms_mesh_check_subset(mesh, ctx->world_size, err));
    ms_dmesh *dm = xcalloc(1, sizeof *dm);
    ms_status st = ms_mesh_copy(&dm->mesh, mesh, err);
    if (st != MS_OK) {
        free(dm);
        return st;
    }
    dm->ctx = ctx;
    if (!ctx->plans) { /* the rank's reshard plans: the first mesh makes the cache */
        ctx->plans = ms_plan_cache_create();
        ctx->plans_free = ms_plan_cache_destroy;
    }
    dm->index = ms_mesh_index_of(mesh, ctx->rank);
    if (dm->index >= 0) ms_mesh_coords(mesh, ctx->rank, dm->coords);
    for (int d = 0; d < mesh->ndim; d++) {
        /* Color: this rank's coordinates with dim d removed, so each group along d gets
         * its own color; key: the coordinate along d, so group rank == coordinate. */
        int color = -1, key = 0;
        if (dm->index >= 0) {
            color = 0;
            for (int e = 0; e < mesh->ndim; e++)
                if (e != d) color = color * mesh->shape[e] + dm->coords[e];
            key = dm->coords[d];
        }
        st = ms_comm_split(ctx->world, color, key, mesh->names[d], &dm->dim_comm[d], err);
        if (st == MS_OK && dm->dim_comm[d]) st = adopt_nccl(ctx, dm->dim_comm[d], err);
        if (st != MS_OK) {
            ms_dmesh_destroy(dm);
            return st;
        }
        dm->probe[d] = ms_trace_probe(&ctx->trace, dm->dim_comm[d], d);
    }
    *out = dm;
    return MS_OK;
}

const char *ms_dmesh_paths_str(const ms_dmesh *dm, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int d = 0; d < dm->mesh.ndim && k < cap; d++) {
        const ms_comm *c = dm->dim_comm[d];
        const char *path = !c                       ? "-"
                           : ms_comm_direct_name(c) ? ms_comm_direct_name(c)
                                                    : "host-staged";
        k += (size_t)snprintf(buf + k, cap - k, "%s%s %s", d ? ", " : "", dm->mesh.names[d], path);
    }
    return buf;
}

void ms_dmesh_destroy(ms_dmesh *dm) {
    if (!dm) return;
    for (int d = 0; d < MS_MESH_MAX_DIMS; d++) {
        ms_comm_destroy(dm->dim_comm[d]);
        ms_trace_probe_free(&dm->ctx->trace, dm->probe[d]);
    }
    ms_mesh_free(&dm->mesh);
    free(dm);
}

/* dmesh.c - binding a mesh to per-dim communicators by splitting the world. */
#include "engine/dist/dmesh.h"

#include <stdlib.h>

#include "engine/core/xalloc.h"
#include "profiler/record/hooks.h"

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
        if (st != MS_OK) {
            ms_dmesh_destroy(dm);
            return st;
        }
        dm->probe[d] = ms_comm_probe_attach(&ctx->trace, dm->dim_comm[d], d);
    }
    *out = dm;
    return MS_OK;
}

void ms_dmesh_destroy(ms_dmesh *dm) {
    if (!dm) return;
    for (int d = 0; d < MS_MESH_MAX_DIMS; d++) {
        ms_comm_destroy(dm->dim_comm[d]);
        ms_comm_probe_free(dm->probe[d]);
    }
    ms_mesh_free(&dm->mesh);
    free(dm);
}

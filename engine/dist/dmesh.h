/* dmesh.h - a mesh bound to communicators: one per mesh dim for this rank.
 *
 * Creating one is collective over the world communicator (every world rank calls it,
 * members and non-members alike), because it splits the world per mesh dim.
 * Ownership: the dmesh owns its copy of the mesh and its communicators; the ctx must
 * outlive it.
 */
#ifndef MS_DMESH_H
#define MS_DMESH_H

#include "engine/dist/mesh.h"
#include "engine/runtime/ctx.h"

typedef struct ms_dmesh {
    ms_mesh mesh;                                  /* owned copy */
    ms_ctx *ctx;                                   /* borrowed */
    int index;                                     /* position in mesh.ranks, -1 if not a member */
    int coords[MS_MESH_MAX_DIMS];                  /* valid when index >= 0 */
    ms_comm *dim_comm[MS_MESH_MAX_DIMS];           /* owned; NULL when not a member */
    struct ms_comm_probe *probe[MS_MESH_MAX_DIMS]; /* owned; tracing observers, or NULL */
} ms_dmesh;

ms_status ms_dmesh_create(ms_ctx *ctx, const ms_mesh *mesh, ms_dmesh **out, ms_error *err);
/* Writes how each mesh dim moves device memory, e.g. "dp nccl, tp host-staged" (a dim this
 * rank is not a member of: "-"), for the run's first lines. Returns buf. */
const char *ms_dmesh_paths_str(const ms_dmesh *dm, char *buf, size_t cap);

void ms_dmesh_destroy(ms_dmesh *dm);

static inline bool ms_dmesh_is_member(const ms_dmesh *dm) {
    return dm->index >= 0;
}

#endif

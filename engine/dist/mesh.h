/* mesh.h - ProcessMesh: an N-d array of world rank ids with a name per dim.
 *
 * A mesh is a pure description (no communicators): shape, dim names and the rank id at
 * each coordinate, row-major. The group of a mesh dim for a rank is every rank that
 * differs from it only in that coordinate. Binding a mesh to communicators is done by
 * dist/dmesh.h. Meshes are small values; copy them freely.
 */
#ifndef MS_MESH_H
#define MS_MESH_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/core/status.h"

#define MS_MESH_MAX_DIMS  6
#define MS_MESH_MAX_RANKS 4096
#define MS_MESH_NAME_MAX  16

typedef struct ms_mesh {
    int ndim;
    int shape[MS_MESH_MAX_DIMS];
    char names[MS_MESH_MAX_DIMS][MS_MESH_NAME_MAX];
    int size;   /* product of shape */
    int *ranks; /* size entries, row-major; owned */
} ms_mesh;

/* Builds a mesh. ranks = NULL means 0..size-1. names may be NULL (d0, d1, ...) or hold
 * NULL entries. Errors: ndim outside 1..MS_MESH_MAX_DIMS, a dim <= 0, duplicate or
 * negative ids, empty or overlong names, duplicate names. */
ms_status ms_mesh_init(ms_mesh *m, int ndim, const int *shape, const char *const *names,
                       const int *ranks, ms_error *err);
void ms_mesh_free(ms_mesh *m);
ms_status ms_mesh_copy(ms_mesh *dst, const ms_mesh *src, ms_error *err);

/* Parses "2x2", "dp=2,tp=2" or "[2,3]"; ranks are 0..size-1. */
ms_status ms_mesh_parse(ms_mesh *m, const char *text, ms_error *err);

/* Checks that the mesh covers exactly the world 0..world-1 (each id once). */
ms_status ms_mesh_check_world(const ms_mesh *m, int world, ms_error *err);
/* Checks that every id is in 0..world-1 (a mesh on a subset of the world). */
ms_status ms_mesh_check_subset(const ms_mesh *m, int world, ms_error *err);

/* Index into ranks of world rank r, or -1 if r is not in the mesh. */
int ms_mesh_index_of(const ms_mesh *m, int rank);
bool ms_mesh_contains(const ms_mesh *m, int rank);
/* Coordinates of world rank r; false if r is not in the mesh. */
bool ms_mesh_coords(const ms_mesh *m, int rank, int *coords);
int ms_mesh_rank_at(const ms_mesh *m, const int *coords);
/* Dim index by name, or -1. */
int ms_mesh_dim_by_name(const ms_mesh *m, const char *name);

/* The ranks along mesh dim `dim` through world rank r, in coordinate order (shape[dim]
 * entries written to out). */
ms_status ms_mesh_dim_group(const ms_mesh *m, int rank, int dim, int *out, ms_error *err);

/* The (ndim-1)-d sub-mesh at coordinate `index` of `dim` (e.g. one pipeline stage). */
ms_status ms_mesh_slice(const ms_mesh *m, int dim, int index, ms_mesh *out, ms_error *err);
/* The sub-mesh through world rank r keeping only dims with keep[d] true. */
ms_status ms_mesh_submesh(const ms_mesh *m, int rank, const bool *keep, ms_mesh *out,
                          ms_error *err);

/* "dp=2 x tp=2 [0,1,2,3]" style description. */
char *ms_mesh_str(const ms_mesh *m, char *buf, size_t len);

#endif

/* placement.h - how a tensor lies on a mesh: one placement per mesh dim.
 *
 *   R       Replicate: every rank of the mesh dim holds the same values.
 *   S(d)    Shard(d): tensor dim d is split across the ranks of the mesh dim.
 *   P(op)   Partial(op): the true value is the op-reduction (sum|avg|max|min) of the
 *           ranks' values along the mesh dim.
 *
 * Split rule (balanced): a dim of size n split k ways gives part i the size n/k + 1 for
 * i < n mod k and n/k otherwise, parts laid out in order. Parts may be empty when n < k.
 *
 * Nested shards: several mesh dims may shard the same tensor dim. `order` says which
 * splits first: among the mesh dims sharding dim d, the one with the smallest order
 * splits the whole dim (outermost), the next splits that part, and so on. The default
 * order is mesh-dim order. Every local shard is therefore one contiguous box of the
 * global tensor.
 *
 * Text form, the same in CLI, JSON and logs: "[S(0), R, P(sum)]"; a non-default nesting
 * order is written S(d,k) with k the position (0 = outermost), e.g. "[S(0,1), S(0,0)]".
 *
 * Partial mixing: sum and avg commute, so any mix of them is allowed; max and min may
 * only be combined with the same op.
 */
#ifndef MS_PLACEMENT_H
#define MS_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/core/status.h"
#include "engine/dist/mesh.h"

typedef enum ms_pl_kind { MS_PL_REPLICATE, MS_PL_SHARD, MS_PL_PARTIAL } ms_pl_kind;

typedef struct ms_placement {
    uint8_t kind;   /* ms_pl_kind */
    int8_t dim;     /* tensor dim for SHARD, else -1 */
    uint8_t reduce; /* ms_reduce_op for PARTIAL */
    int8_t order;   /* nesting position for SHARD (0 = outermost), else 0 */
} ms_placement;

typedef struct ms_placements {
    int n; /* == mesh ndim */
    ms_placement p[MS_MESH_MAX_DIMS];
} ms_placements;

static inline ms_placement ms_pl_replicate(void) {
    return (ms_placement){MS_PL_REPLICATE, -1, 0, 0};
}
static inline ms_placement ms_pl_shard(int dim) {
    return (ms_placement){MS_PL_SHARD, (int8_t)dim, 0, 0};
}
static inline ms_placement ms_pl_partial(ms_reduce_op op) {
    return (ms_placement){MS_PL_PARTIAL, -1, (uint8_t)op, 0};
}

bool ms_placement_eq(ms_placement a, ms_placement b);
/* Equal up to the nesting order (what a one-mesh-dim rule compares). */
bool ms_placement_same_kind(ms_placement a, ms_placement b);
/* Replicate on every one of n mesh dims. */
ms_placements ms_placements_replicated(int n);
bool ms_placements_eq(const ms_placements *a, const ms_placements *b);

/* Gives shards without an explicit order the default (mesh-dim order) positions. Call
 * after building placements by hand with ms_pl_shard. */
void ms_placements_default_order(ms_placements *pl);

/* Checks placements against a tensor rank and mesh: n equals mesh ndim, shard dims in
 * range, nesting orders a permutation per tensor dim, allowed partial mixes. */
ms_status ms_placements_validate(const ms_placements *pl, int mesh_ndim, int tensor_ndim,
                                 ms_error *err);

/* Parses "[S(0), R, P(sum)]" (brackets optional; Shard(0)/Replicate()/Partial(sum) also
 * accepted). Fills default orders. Does not know the tensor rank: validate afterwards. */
ms_status ms_placements_parse(const char *text, ms_placements *out, ms_error *err);
/* Canonical text form; returns buf. */
char *ms_placements_str(const ms_placements *pl, char *buf, size_t len);
char *ms_placement_str(ms_placement p, char *buf, size_t len);

/* The balanced split rule. */
void ms_split_part(int64_t n, int parts, int index, int64_t *offset, int64_t *len);

/* The global box held by the rank at mesh coordinates `coords`: for every tensor dim,
 * start and length. Partial and replicate dims hold the full extent. */
void ms_local_box(const ms_placements *pl, const ms_mesh *mesh, const int *coords, int ndim,
                  const int64_t *gshape, int64_t *start, int64_t *len);

/* Mesh dims that shard tensor dim d, outermost first; returns how many. */
int ms_shard_chain(const ms_placements *pl, int d, int *mesh_dims);

/* True if any mesh dim is Partial. */
bool ms_placements_has_partial(const ms_placements *pl);

#endif

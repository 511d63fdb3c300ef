/* reshard.h - changing a DistTensor's placements: a pure plan, then its execution.
 *
 * The planner turns (mesh shape, source placements, target placements, global shape)
 * into a list of steps, each along one mesh dim:
 *
 *   P->R all-reduce      S(d)->R all-gather      P->S(d) reduce-scatter
 *   S(a)->S(b) all-to-all      R->S(d) local slice      R->P local (zero or keep)
 *
 * It searches the placement states with Dijkstra, costing each step by the bytes a rank
 * sends (the nccl-tests bus-bandwidth bytes of the step), and so picks the order that
 * moves the fewest bytes. Only the innermost shard of a nested tensor dim can change, so
 * every intermediate local part stays one contiguous box. The planner does no
 * communication, so `explain`, the cost model and the executor share the same plans and
 * predicted bytes equal executed bytes. Plans are cached per rank context.
 */
#ifndef MS_RESHARD_H
#define MS_RESHARD_H

#include "engine/dist/dtensor.h"

#define MS_RESHARD_MAX_STEPS 24

typedef enum ms_rstep_kind {
    MS_RSTEP_ALL_REDUCE,     /* P -> R */
    MS_RSTEP_REDUCE_SCATTER, /* P -> S(d) */
    MS_RSTEP_ALL_GATHER,     /* S(d) -> R */
    MS_RSTEP_ALL_TO_ALL,     /* S(a) -> S(b) */
    MS_RSTEP_SLICE,          /* R -> S(d), local */
    MS_RSTEP_PARTIALIZE,     /* R -> P(op), local */
    MS_RSTEP_SEND_RECV,      /* cross-mesh transfer (ms_reshard_cross_mesh only) */
    MS_RSTEP_KIND_COUNT
} ms_rstep_kind;

const char *ms_rstep_name(ms_rstep_kind k); /* "all_reduce", ..., "slice", "partialize" */

typedef struct ms_rstep {
    ms_rstep_kind kind;
    int mesh_dim;
    ms_placements before, after;
    /* Figures for the rank at mesh coordinate 0 in every dim, which holds the largest
     * shard under the balanced split: */
    double coll_bytes; /* the collective's size for float32, nccl-tests convention (0 for
                        * local); for other elements see ms_reshard_plan_bytes */
    double wire_bytes; /* bytes this rank sends: coll_bytes * busbw factor */
} ms_rstep;

typedef struct ms_reshard_plan {
    ms_placements src, dst;
    int nsteps;
    ms_rstep steps[MS_RESHARD_MAX_STEPS];
    double wire_bytes; /* sum over steps */
} ms_reshard_plan;

/* The plan's collective bytes (the sum of its steps' coll_bytes) when it moves elements of
 * elt_size bytes: 2 for bf16. The steps are costed for float32; every byte figure scales by
 * elt_size / 4 alike, so the planner's choice does not depend on the element type. */
double ms_reshard_plan_bytes(const ms_reshard_plan *plan, size_t elt_size);

/* Pure planning. Fails with MS_ERR_INVALID for invalid placements. */
ms_status ms_reshard_plan_make(const ms_mesh *mesh, const ms_placements *src,
                               const ms_placements *dst, int ndim, const int64_t *gshape,
                               ms_reshard_plan *out, ms_error *err);

/* One line per step: "mesh dim 1 (tp): all_gather S(0) -> R, 1.50 KiB". */
void ms_reshard_plan_print(const ms_reshard_plan *plan, const ms_mesh *mesh, void *file);

/* Plan cache, owned by a rank context (no locks: one rank uses it). */
struct ms_plan_cache *ms_plan_cache_create(void);
void ms_plan_cache_destroy(struct ms_plan_cache *cache);
/* A cached plan (computed on first use). The pointer stays valid until the cache dies. */
ms_status ms_plan_cache_get(struct ms_plan_cache *cache, const ms_mesh *mesh,
                            const ms_placements *src, const ms_placements *dst, int ndim,
                            const int64_t *gshape, const ms_reshard_plan **out, ms_error *err);

/* What one execution did, step by step: exact bytes for this rank and wall time. */
typedef struct ms_reshard_report {
    int nsteps;
    struct {
        ms_rstep_kind kind;
        int mesh_dim;
        size_t coll_bytes;
        int64_t ns;
    } steps[MS_RESHARD_MAX_STEPS];
    size_t coll_bytes;
    int64_t ns;
} ms_reshard_report;

/* Runs a plan from `in` (this rank's part in plan->src placements) into `out` (sized for
 * plan->dst), with the rank's workspace for intermediate steps and packing: no allocation
 * once the workspace has grown to the largest reshard. in and out must not overlap.
 * Collective over the mesh. */
ms_status ms_reshard_run(ms_dmesh *dm, const ms_reshard_plan *plan, int ndim, const int64_t *gshape,
                         const float *in, float *out, ms_reshard_report *report, ms_error *err);
/* The same for elements of type dt (MS_F32 or MS_BF16; others are refused with
 * MS_ERR_UNSUPPORTED). In bf16 the partial sums are reduced in fp32 and rounded once per
 * reducing step (the communicator's bf16 reductions), and report->coll_bytes counts 2-byte
 * elements, equal to ms_reshard_plan_bytes(plan, 2) on the plan's rank. */
ms_status ms_reshard_run_dt(ms_dmesh *dm, const ms_reshard_plan *plan, int ndim,
                            const int64_t *gshape, ms_dtype dt, const void *in, void *out,
                            ms_reshard_report *report, ms_error *err);

/* Reshards t to placements dst on the same mesh, replacing t's local tensor with a float32 one
 * (a bf16 local is widened; ms_reshard_run_dt keeps bf16). Collective over the mesh. report may
 * be NULL. On failure t is unchanged. */
ms_status ms_reshard(ms_dtensor *t, const ms_placements *dst, ms_reshard_report *report,
                     ms_error *err);

/* Moves a DistTensor to another mesh (a different set of ranks, e.g. the next pipeline
 * stage) with placements dst, using send/recv on the world communicator. A Partial
 * source is first reduced on the source mesh. Collective over the world: every world rank
 * calls it (ranks in neither mesh return at once). *out is bound to dst_mesh. float32 only: a
 * bf16 source is widened and moved as float32, and *out is float32 (as with ms_reshard). */
ms_status ms_reshard_cross_mesh(const ms_dtensor *src, ms_dmesh *dst_mesh, const ms_placements *dst,
                                ms_dtensor *out, ms_reshard_report *report, ms_error *err);

#endif

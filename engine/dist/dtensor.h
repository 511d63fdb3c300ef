/* dtensor.h - DistTensor: a global shape, a mesh, placements and this rank's local part.
 *
 * The local tensor is always the box of the global tensor given by ms_local_box (for
 * Replicate and Shard dims), holding partial values for Partial mesh dims. Functions
 * marked "collective" must be called by every member of the mesh; ranks outside the mesh
 * may call them too and get an empty local tensor.
 *
 * Ownership: an ms_dtensor owns its local tensor and borrows its dmesh (which must outlive
 * it); release with ms_dtensor_release.
 */
#ifndef MS_DTENSOR_H
#define MS_DTENSOR_H

#include "engine/core/tensor.h"
#include "engine/dist/dmesh.h"
#include "engine/dist/placement.h"

typedef struct ms_dtensor {
    int ndim;
    int64_t gshape[MS_MAX_DIMS];
    ms_dmesh *mesh; /* borrowed */
    ms_placements pl;
    ms_tensor local; /* owned; contiguous f32; empty on non-members */
} ms_dtensor;

/* Global -> local: every member passes the same global tensor (host memory, any dtype and
 * strides) and keeps its box, on the rank's device. Partial mesh dims get the R->P rule: sum keeps
 * the value on coordinate 0 and zeros elsewhere; avg, max and min keep the value everywhere. Not
 * collective (no communication). */
ms_status ms_dtensor_shard(ms_dmesh *mesh, const ms_tensor *global, const ms_placements *pl,
                           ms_dtensor *out, ms_error *err);

/* Local -> global: every member receives the whole tensor in *global (a new contiguous
 * f32 tensor in host memory: gathered on the rank's device, then copied to the host when the
 * host cannot address that device). Collective. */
ms_status ms_dtensor_full(const ms_dtensor *t, ms_tensor *global, ms_error *err);

/* A new contiguous f32 copy of local, a local part on mesh (memory of the rank's device or of
 * the host, wrapped or not: the device's owns slot tells): on the rank's device (to_host
 * false) or in host memory (to_host true). A strided or bf16 local is converted on its own
 * device (ms_tensor_contiguous), which must be the host's. */
ms_status ms_dtensor_local_copy(const ms_dmesh *mesh, const ms_tensor *local, bool to_host,
                                ms_tensor *out, ms_error *err);

/* Local shards -> DistTensor. The local tensor's ownership moves into *out on success
 * (on failure the caller still owns it). With gshape NULL the global shape is inferred
 * by exchanging local sizes; in both cases every rank's local size is checked against
 * the balanced split, and all members fail together with an error naming the first
 * offending rank. Collective. */
ms_status ms_dtensor_from_local(ms_dmesh *mesh, ms_tensor *local, const ms_placements *pl, int ndim,
                                const int64_t *gshape, ms_dtensor *out, ms_error *err);

void ms_dtensor_release(ms_dtensor *t);

/* The box of this rank's local tensor in the global tensor. False on non-members. */
bool ms_dtensor_box(const ms_dtensor *t, int64_t *start, int64_t *len);

#endif

/* tensor.h - device-neutral dense tensors: float32 compute, bf16 storage, strided views.
 *
 * A tensor is a small value struct (shape, strides, offset) over a reference-counted
 * storage block allocated through a device (core/device.h). Views share the storage and
 * retain it; every tensor obtained from this API is released with ms_tensor_release.
 *
 * Shapes and strides count elements; strides may be any non-negative values, so slicing
 * and transposing are O(1) views. Storage is MS_TENSOR_ALIGN (64-byte) aligned.
 */
#ifndef MS_TENSOR_H
#define MS_TENSOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/device.h"
#include "engine/core/status.h"

#define MS_MAX_DIMS 8

typedef enum ms_dtype {
    MS_F32,  /* the compute type */
    MS_BF16, /* storage only: round-to-nearest-even from f32, widened on read */
    MS_DTYPE_COUNT
} ms_dtype;

size_t ms_dtype_size(ms_dtype dt);
const char *ms_dtype_name(ms_dtype dt);

typedef struct ms_storage {
    void *data;
    size_t nbytes;
    ms_device *dev; /* borrowed: must outlive the storage; NULL = host memory, wrapped */
    bool wrapped;   /* the caller's memory: released storage never frees it */
    atomic_int refs;
} ms_storage;

typedef struct ms_tensor {
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    int64_t stride[MS_MAX_DIMS]; /* elements */
    int64_t offset;              /* elements from storage->data */
    ms_storage *storage;         /* NULL for an empty (unallocated) tensor */
} ms_tensor;

/* Allocates a zeroed, contiguous tensor on dev. On failure *out is left empty. */
ms_status ms_tensor_alloc(ms_device *dev, ms_dtype dtype, int ndim, const int64_t *shape,
                          ms_tensor *out, ms_error *err);

/* A tensor over memory the caller owns (e.g. a slice of an arena): contiguous, and its
 * release never frees the data. The memory must outlive every handle. */
ms_status ms_tensor_wrap(void *data, ms_dtype dtype, int ndim, const int64_t *shape, ms_tensor *out,
                         ms_error *err);
/* The same over memory of device dev (NULL: the host, as ms_tensor_wrap): copies made from
 * the tensor (ms_tensor_contiguous) are made on dev. */
ms_status ms_tensor_wrap_on(ms_device *dev, void *data, ms_dtype dtype, int ndim,
                            const int64_t *shape, ms_tensor *out, ms_error *err);

/* Drops this handle's reference; frees the storage with the last one. Safe on empty. */
void ms_tensor_release(ms_tensor *t);

/* A new handle to the same storage (retained). */
ms_tensor ms_tensor_share(const ms_tensor *t);

int64_t ms_tensor_numel(const ms_tensor *t);
bool ms_tensor_is_contiguous(const ms_tensor *t);

/* Pointer to element 0 of the view. For contiguous f32 tensors this is the data. */
void *ms_tensor_data(const ms_tensor *t);
static inline float *ms_tensor_f32(const ms_tensor *t) {
    return (float *)ms_tensor_data(t);
}

/* Views (retain the storage; release the result). */
ms_status ms_tensor_slice(const ms_tensor *t, int dim, int64_t start, int64_t len, ms_tensor *out,
                          ms_error *err);
ms_status ms_tensor_transpose(const ms_tensor *t, int a, int b, ms_tensor *out, ms_error *err);
/* A reshape of a contiguous tensor; fails on a strided one (use ms_tensor_contiguous). */
ms_status ms_tensor_reshape(const ms_tensor *t, int ndim, const int64_t *shape, ms_tensor *out,
                            ms_error *err);

/* Element access through strides (host devices only; slow path for tests and tools). */
float ms_tensor_get(const ms_tensor *t, const int64_t *idx);
void ms_tensor_set(ms_tensor *t, const int64_t *idx, float v);

/* dst = src elementwise, through both strides, converting dtypes. Shapes must match. */
ms_status ms_tensor_copy(ms_tensor *dst, const ms_tensor *src, ms_error *err);

/* A new contiguous tensor of `dtype` with src's values. */
ms_status ms_tensor_contiguous(const ms_tensor *src, ms_dtype dtype, ms_tensor *out, ms_error *err);

/* bf16 conversions (round to nearest even; NaN stays NaN). */
uint16_t ms_bf16_from_f32(float f);
float ms_f32_from_bf16(uint16_t h);

/* Philox initialisation keyed by global element index.
 * t is the box of a global tensor of shape gshape (ndim == t->ndim) starting at gstart.
 * Element at local index i gets normal(seed, tensor_id, global_linear_index) * std + mean,
 * so any sharding of the same global tensor produces the same values. gstart NULL = 0. */
ms_status ms_tensor_init_normal(ms_tensor *t, uint64_t seed, uint64_t tensor_id,
                                const int64_t *gshape, const int64_t *gstart, float mean, float std,
                                ms_error *err);
ms_status ms_tensor_init_uniform(ms_tensor *t, uint64_t seed, uint64_t tensor_id,
                                 const int64_t *gshape, const int64_t *gstart, float lo, float hi,
                                 ms_error *err);

/* Copies the box [src_start, src_start + len) of a contiguous row-major f32 array of shape
 * src_shape into a contiguous array of shape dst_shape at dst_start. Used to pack and
 * unpack shards; all arrays have `ndim` dims. */
void ms_copy_box_f32(float *dst, const int64_t *dst_shape, const int64_t *dst_start,
                     const float *src, const int64_t *src_shape, const int64_t *src_start,
                     const int64_t *len, int ndim);

/* "[2, 3, 4]" into buf; returns buf. */
char *ms_shape_str(const int64_t *shape, int ndim, char *buf, size_t len);

#endif

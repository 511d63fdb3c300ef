/* tensor.c - tensor storage, views, copies and Philox initialisation. */
#include "engine/core/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"

size_t ms_dtype_size(ms_dtype dt) {
    return dt == MS_BF16 ? 2 : 4;
}
const char *ms_dtype_name(ms_dtype dt) {
    return dt == MS_BF16 ? "bf16" : "f32";
}

static ms_status check_shape(int ndim, const int64_t *shape, ms_error *err) {
    if (ndim < 0 || ndim > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID, "tensor rank %d is outside 0..%d", ndim, MS_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return ms_fail(err, MS_ERR_INVALID, "tensor dim %d has negative size %lld", d,
                           (long long)shape[d]);
    return MS_OK;
}

/* Wrapped storage is host memory; copies made from it go to the host device. */
static ms_device *storage_device(const ms_storage *s) {
    return s->dev ? s->dev : ms_device_host();
}

static void set_contiguous_strides(ms_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        t->stride[d] = s;
        s *= t->shape[d];
    }
}

ms_status ms_tensor_alloc(ms_device *dev, ms_dtype dtype, int ndim, const int64_t *shape,
                          ms_tensor *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    MS_CHECK(check_shape(ndim, shape, err));
    ms_tensor t = {.dtype = dtype, .ndim = ndim};
    for (int d = 0; d < ndim; d++) t.shape[d] = shape[d];
    set_contiguous_strides(&t);
    size_t nbytes = (size_t)ms_tensor_numel(&t) * ms_dtype_size(dtype);
    void *data = NULL;
    MS_CHECK(ms_device_alloc(dev, nbytes, &data, err));
    ms_status st = ms_device_zero(dev, data, nbytes, err);
    if (st != MS_OK) {
        ms_device_free(dev, data, nbytes);
        return st;
    }
    ms_storage *s = xmalloc(sizeof *s);
    s->data = data;
    s->nbytes = nbytes;
    s->dev = dev;
    s->wrapped = false;
    atomic_init(&s->refs, 1);
    t.storage = s;
    *out = t;
    return MS_OK;
}

ms_status ms_tensor_wrap(void *data, ms_dtype dtype, int ndim, const int64_t *shape, ms_tensor *out,
                         ms_error *err) {
    return ms_tensor_wrap_on(NULL, data, dtype, ndim, shape, out, err);
}

ms_status ms_tensor_wrap_on(ms_device *dev, void *data, ms_dtype dtype, int ndim,
                            const int64_t *shape, ms_tensor *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    MS_CHECK(check_shape(ndim, shape, err));
    ms_tensor t = {.dtype = dtype, .ndim = ndim};
    for (int d = 0; d < ndim; d++) t.shape[d] = shape[d];
    set_contiguous_strides(&t);
    ms_storage *s = xmalloc(sizeof *s);
    s->data = data;
    s->nbytes = (size_t)ms_tensor_numel(&t) * ms_dtype_size(dtype);
    s->dev = dev;
    s->wrapped = true;
    atomic_init(&s->refs, 1);
    t.storage = s;
    *out = t;
    return MS_OK;
}

void ms_tensor_release(ms_tensor *t) {
    if (!t || !t->storage) return;
    ms_storage *s = t->storage;
    if (atomic_fetch_sub(&s->refs, 1) == 1) {
        if (s->dev && !s->wrapped) ms_device_free(s->dev, s->data, s->nbytes);
        free(s);
    }
    memset(t, 0, sizeof *t);
}

ms_tensor ms_tensor_share(const ms_tensor *t) {
    if (t->storage) atomic_fetch_add(&t->storage->refs, 1);
    return *t;
}

int64_t ms_tensor_numel(const ms_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

bool ms_tensor_is_contiguous(const ms_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != s) return false;
        s *= t->shape[d];
    }
    return true;
}

void *ms_tensor_data(const ms_tensor *t) {
    if (!t->storage) return NULL;
    return (char *)t->storage->data + t->offset * (int64_t)ms_dtype_size(t->dtype);
}

ms_status ms_tensor_slice(const ms_tensor *t, int dim, int64_t start, int64_t len, ms_tensor *out,
                          ms_error *err) {
    if (dim < 0 || dim >= t->ndim)
        return ms_fail(err, MS_ERR_INVALID, "slice: dim %d out of range for rank %d", dim, t->ndim);
    if (start < 0 || len < 0 || start + len > t->shape[dim])
        return ms_fail(err, MS_ERR_INVALID, "slice: [%lld, %lld) outside dim %d of size %lld",
                       (long long)start, (long long)(start + len), dim, (long long)t->shape[dim]);
    *out = ms_tensor_share(t);
    out->offset += start * t->stride[dim];
    out->shape[dim] = len;
    return MS_OK;
}

ms_status ms_tensor_transpose(const ms_tensor *t, int a, int b, ms_tensor *out, ms_error *err) {
    if (a < 0 || a >= t->ndim || b < 0 || b >= t->ndim)
        return ms_fail(err, MS_ERR_INVALID, "transpose: dims (%d, %d) out of range for rank %d", a,
                       b, t->ndim);
    *out = ms_tensor_share(t);
    int64_t s = out->shape[a];
    out->shape[a] = out->shape[b], out->shape[b] = s;
    s = out->stride[a];
    out->stride[a] = out->stride[b], out->stride[b] = s;
    return MS_OK;
}

ms_status ms_tensor_reshape(const ms_tensor *t, int ndim, const int64_t *shape, ms_tensor *out,
                            ms_error *err) {
    MS_CHECK(check_shape(ndim, shape, err));
    if (!ms_tensor_is_contiguous(t))
        return ms_fail(err, MS_ERR_INVALID,
                       "reshape of a strided view; call ms_tensor_contiguous first");
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n != ms_tensor_numel(t))
        return ms_fail(err, MS_ERR_INVALID, "reshape: %lld elements cannot become %lld",
                       (long long)ms_tensor_numel(t), (long long)n);
    *out = ms_tensor_share(t);
    out->ndim = ndim;
    for (int d = 0; d < ndim; d++) out->shape[d] = shape[d];
    set_contiguous_strides(out);
    return MS_OK;
}

uint16_t ms_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ms_f32_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int64_t elem_offset(const ms_tensor *t, const int64_t *idx) {
    int64_t off = t->offset;
    for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
    return off;
}

float ms_tensor_get(const ms_tensor *t, const int64_t *idx) {
    int64_t off = elem_offset(t, idx);
    if (t->dtype == MS_BF16) return ms_f32_from_bf16(((const uint16_t *)t->storage->data)[off]);
    return ((const float *)t->storage->data)[off];
}

void ms_tensor_set(ms_tensor *t, const int64_t *idx, float v) {
    int64_t off = elem_offset(t, idx);
    if (t->dtype == MS_BF16)
        ((uint16_t *)t->storage->data)[off] = ms_bf16_from_f32(v);
    else
        ((float *)t->storage->data)[off] = v;
}

/* Advances a row-major multi-index; returns false after the last element. */
static bool next_index(int64_t *idx, const int64_t *shape, int ndim) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return true;
        idx[d] = 0;
    }
    return false;
}

ms_status ms_tensor_copy(ms_tensor *dst, const ms_tensor *src, ms_error *err) {
    if (dst->ndim != src->ndim)
        return ms_fail(err, MS_ERR_INVALID, "copy: rank %d into rank %d", src->ndim, dst->ndim);
    for (int d = 0; d < src->ndim; d++)
        if (dst->shape[d] != src->shape[d])
            return ms_fail(err, MS_ERR_INVALID, "copy: dim %d is %lld in source, %lld in target", d,
                           (long long)src->shape[d], (long long)dst->shape[d]);
    int64_t n = ms_tensor_numel(src);
    if (n == 0) return MS_OK;
    if (dst->dtype == src->dtype && ms_tensor_is_contiguous(dst) && ms_tensor_is_contiguous(src))
        return ms_device_copy(storage_device(dst->storage), ms_tensor_data(dst),
                              ms_tensor_data(src), (size_t)n * ms_dtype_size(src->dtype),
                              MS_COPY_DEVICE_TO_DEVICE, err);
    if (storage_device(dst->storage)->ops->kind != MS_DEVICE_CPU ||
        storage_device(src->storage)->ops->kind != MS_DEVICE_CPU)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "strided or converting copy on a non-host device");
    int64_t idx[MS_MAX_DIMS] = {0};
    do ms_tensor_set(dst, idx, ms_tensor_get(src, idx));
    while (next_index(idx, src->shape, src->ndim));
    return MS_OK;
}

ms_status ms_tensor_contiguous(const ms_tensor *src, ms_dtype dtype, ms_tensor *out,
                               ms_error *err) {
    MS_CHECK(ms_tensor_alloc(storage_device(src->storage), dtype, src->ndim, src->shape, out, err));
    ms_status st = ms_tensor_copy(out, src, err);
    if (st != MS_OK) ms_tensor_release(out);
    return st;
}

typedef double (*init_fn)(uint64_t seed, uint64_t stream, uint64_t index, float a, float b);

static double init_normal(uint64_t seed, uint64_t stream, uint64_t index, float mean, float std) {
    return mean + std * ms_philox_normal(seed, stream, index);
}

static double init_uniform(uint64_t seed, uint64_t stream, uint64_t index, float lo, float hi) {
    return lo + (hi - lo) * (double)ms_philox_uniform(seed, stream, index);
}

static ms_status init_box(ms_tensor *t, uint64_t seed, uint64_t tensor_id, const int64_t *gshape,
                          const int64_t *gstart, float a, float b, init_fn fn, ms_error *err) {
    if (t->storage && storage_device(t->storage)->ops->kind != MS_DEVICE_CPU)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "init: tensors on %s are initialised on the host "
                       "and copied",
                       storage_device(t->storage)->ops->name);
    for (int d = 0; d < t->ndim; d++) {
        int64_t s = gstart ? gstart[d] : 0;
        if (s < 0 || s + t->shape[d] > gshape[d])
            return ms_fail(err, MS_ERR_INVALID,
                           "init: box [%lld, %lld) outside global dim %d of "
                           "size %lld",
                           (long long)s, (long long)(s + t->shape[d]), d, (long long)gshape[d]);
    }
    if (ms_tensor_numel(t) == 0) return MS_OK;
    int64_t idx[MS_MAX_DIMS] = {0};
    do {
        uint64_t g = 0;
        for (int d = 0; d < t->ndim; d++)
            g = g * (uint64_t)gshape[d] + (uint64_t)(idx[d] + (gstart ? gstart[d] : 0));
        ms_tensor_set(t, idx, (float)fn(seed, tensor_id, g, a, b));
    } while (next_index(idx, t->shape, t->ndim));
    return MS_OK;
}

ms_status ms_tensor_init_normal(ms_tensor *t, uint64_t seed, uint64_t tensor_id,
                                const int64_t *gshape, const int64_t *gstart, float mean, float std,
                                ms_error *err) {
    return init_box(t, seed, tensor_id, gshape, gstart, mean, std, init_normal, err);
}

ms_status ms_tensor_init_uniform(ms_tensor *t, uint64_t seed, uint64_t tensor_id,
                                 const int64_t *gshape, const int64_t *gstart, float lo, float hi,
                                 ms_error *err) {
    return init_box(t, seed, tensor_id, gshape, gstart, lo, hi, init_uniform, err);
}

void ms_copy_box_f32(float *dst, const int64_t *dst_shape, const int64_t *dst_start,
                     const float *src, const int64_t *src_shape, const int64_t *src_start,
                     const int64_t *len, int ndim) {
    ms_host_copy_box(dst, dst_shape, dst_start, src, src_shape, src_start, len, ndim,
                     sizeof(float));
}

char *ms_shape_str(const int64_t *shape, int ndim, char *buf, size_t len) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

/* device_fenced.c - the fenced CPU device: host memory behind addresses the host cannot use.
 *
 * Every address it hands out is the real one plus MS_DEVICE_FENCE_TAG (bit 62), which no
 * x86-64 or AArch64 process can dereference, so a host read or write of its memory faults at
 * the spot. Pointer arithmetic keeps the tag (offsets stay far below 2^62), and the device's
 * copies and the fenced kernel table (engine/kernels/backend.c) remove it. Tests train on it
 * to show that only the kernel interface and the device's copies touch device memory, as a
 * GPU requires.
 *
 * Its marks are counts: every copy here and every kernel launched through a kernel context on
 * the device adds one to dev->work, and a mark holds that count when it was recorded. The
 * device runs everything at once, so a mark's work is always done; what a consumer can check
 * is which work the mark covers (tests/test_comm_direct.c: a collective's mark covers exactly
 * the launches and copies issued before the collective, none issued after it). */
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"
#include "engine/core/xalloc.h"

static void *host_of(const void *p) {
    return p ? (void *)((uintptr_t)p - MS_DEVICE_FENCE_TAG) : NULL;
}

/* One more launch or copy queued (and, on this device, done). */
static void counted(ms_device *dev) {
    atomic_fetch_add_explicit(&dev->work, 1, memory_order_relaxed);
}

static ms_status fenced_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err) {
    (void)dev;
    size_t rounded = (nbytes + MS_TENSOR_ALIGN - 1) / MS_TENSOR_ALIGN * MS_TENSOR_ALIGN;
    void *p = aligned_alloc(MS_TENSOR_ALIGN, rounded ? rounded : MS_TENSOR_ALIGN);
    if (!p) return ms_fail(err, MS_ERR_NOMEM, "fenced: cannot allocate %zu bytes", nbytes);
    *out = (void *)((uintptr_t)p + MS_DEVICE_FENCE_TAG);
    return MS_OK;
}

static void fenced_free(ms_device *dev, void *ptr) {
    (void)dev;
    free(host_of(ptr));
}

static ms_status fenced_copy(ms_device *dev, void *dst, const void *src, size_t nbytes,
                             ms_copy_dir dir, ms_error *err) {
    (void)err;
    counted(dev);
    if (!nbytes) return MS_OK;
    void *d = dir == MS_COPY_DEVICE_TO_HOST ? dst : host_of(dst);
    const void *s = dir == MS_COPY_HOST_TO_DEVICE ? src : host_of(src);
    memmove(d, s, nbytes);
    return MS_OK;
}

static ms_status fenced_zero(ms_device *dev, void *dst, size_t nbytes, ms_error *err) {
    (void)err;
    counted(dev);
    if (nbytes) memset(host_of(dst), 0, nbytes);
    return MS_OK;
}

static ms_status fenced_copy_box(ms_device *dev, void *dst, const int64_t *dst_shape,
                                 const int64_t *dst_start, const void *src,
                                 const int64_t *src_shape, const int64_t *src_start,
                                 const int64_t *len, int ndim, size_t elt, ms_error *err) {
    (void)err;
    counted(dev);
    ms_host_copy_box(host_of(dst), dst_shape, dst_start, host_of(src), src_shape, src_start, len,
                     ndim, elt);
    return MS_OK;
}

static bool fenced_owns(const ms_device *dev, const void *ptr) {
    (void)dev;
    return ((uintptr_t)ptr & MS_DEVICE_FENCE_TAG) != 0;
}

typedef struct fenced_mark {
    const ms_device *dev;
    uint64_t work;
} fenced_mark;

static ms_status fenced_mark_record(ms_device *dev, ms_device_mark **out, ms_error *err) {
    (void)err;
    fenced_mark *m = xmalloc(sizeof *m);
    *m = (fenced_mark){dev, atomic_load(&dev->work)};
    *out = (ms_device_mark *)m;
    return MS_OK;
}

/* Nothing to wait for (the work ran when it was issued); a mark of another device is a bug in
 * the caller. */
static ms_status fenced_mark_wait(ms_device *dev, const ms_device_mark *mark, void *stream,
                                  ms_error *err) {
    (void)stream;
    const fenced_mark *m = (const fenced_mark *)mark;
    if (m->dev != dev)
        return ms_fail(err, MS_ERR_INTERNAL, "fenced: waiting for a mark of another device");
    return MS_OK;
}

static void fenced_mark_release(ms_device *dev, ms_device_mark *mark) {
    (void)dev;
    free(mark);
}

uint64_t ms_device_fenced_mark_work(const ms_device_mark *mark) {
    return ((const fenced_mark *)mark)->work;
}

static void fenced_destroy(ms_device *dev) {
    free(dev);
}

static const ms_device_ops fenced_ops = {
    .name = "fenced",
    .kind = MS_DEVICE_FENCED,
    .alloc = fenced_alloc,
    .free = fenced_free,
    .copy = fenced_copy,
    .memset_zero = fenced_zero,
    .copy_box = fenced_copy_box,
    .owns = fenced_owns,
    .mark_record = fenced_mark_record,
    .mark_wait = fenced_mark_wait,
    .mark_release = fenced_mark_release,
    .counts_work = true,
    .destroy = fenced_destroy,
};

ms_status ms_device_fenced_create(ms_device **out, ms_error *err) {
    (void)err;
    ms_device *dev = xcalloc(1, sizeof *dev);
    dev->ops = &fenced_ops;
    dev->addr_tag = MS_DEVICE_FENCE_TAG;
    *out = dev;
    return MS_OK;
}

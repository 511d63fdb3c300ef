/* device.c - the device interface's shared layer and its CPU backend. */
#include "engine/core/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

/* --- CPU backend ------------------------------------------------------------------------ */

static ms_status cpu_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err) {
    (void)dev;
    size_t rounded = (nbytes + MS_TENSOR_ALIGN - 1) / MS_TENSOR_ALIGN * MS_TENSOR_ALIGN;
    void *p = aligned_alloc(MS_TENSOR_ALIGN, rounded ? rounded : MS_TENSOR_ALIGN);
    if (!p) return ms_fail(err, MS_ERR_NOMEM, "cpu: cannot allocate %zu bytes", nbytes);
    *out = p;
    return MS_OK;
}

static void cpu_free(ms_device *dev, void *ptr) {
    (void)dev;
    free(ptr);
}

static ms_status cpu_copy(ms_device *dev, void *dst, const void *src, size_t nbytes,
                          ms_copy_dir dir, ms_error *err) {
    (void)dev, (void)dir, (void)err;
    if (nbytes) memmove(dst, src, nbytes);
    return MS_OK;
}

static ms_status cpu_zero(ms_device *dev, void *dst, size_t nbytes, ms_error *err) {
    (void)dev, (void)err;
    if (nbytes) memset(dst, 0, nbytes);
    return MS_OK;
}

ms_status ms_box_runs(const int64_t *dst_shape, const int64_t *dst_start, const int64_t *src_shape,
                      const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                      ms_box_run_fn fn, void *arg, ms_error *err) {
    if (ndim == 0) return fn(0, 0, elt, arg, err);
    for (int d = 0; d < ndim; d++)
        if (len[d] == 0) return MS_OK;
    /* Row-major strides; the innermost dim is one run. */
    int64_t dstride[MS_DEVICE_MAX_DIMS], sstride[MS_DEVICE_MAX_DIMS], idx[MS_DEVICE_MAX_DIMS] = {0};
    dstride[ndim - 1] = sstride[ndim - 1] = 1;
    for (int d = ndim - 2; d >= 0; d--) {
        dstride[d] = dstride[d + 1] * dst_shape[d + 1];
        sstride[d] = sstride[d + 1] * src_shape[d + 1];
    }
    const size_t run = (size_t)len[ndim - 1] * elt;
    for (;;) {
        int64_t doff = 0, soff = 0;
        for (int d = 0; d < ndim; d++) {
            doff += (idx[d] + dst_start[d]) * dstride[d];
            soff += (idx[d] + src_start[d]) * sstride[d];
        }
        MS_CHECK(fn((size_t)doff * elt, (size_t)soff * elt, run, arg, err));
        int d = ndim - 2;
        for (; d >= 0 && ++idx[d] == len[d]; d--) idx[d] = 0;
        if (d < 0) return MS_OK;
    }
}

typedef struct host_box {
    char *dst;
    const char *src;
} host_box;

static ms_status host_run(size_t doff, size_t soff, size_t bytes, void *arg, ms_error *err) {
    (void)err;
    host_box *b = arg;
    memmove(b->dst + doff, b->src + soff, bytes);
    return MS_OK;
}

void ms_host_copy_box(void *dst, const int64_t *dst_shape, const int64_t *dst_start,
                      const void *src, const int64_t *src_shape, const int64_t *src_start,
                      const int64_t *len, int ndim, size_t elt) {
    host_box b = {dst, src};
    (void)ms_box_runs(dst_shape, dst_start, src_shape, src_start, len, ndim, elt, host_run, &b,
                      NULL);
}

static ms_status cpu_copy_box(ms_device *dev, void *dst, const int64_t *dst_shape,
                              const int64_t *dst_start, const void *src, const int64_t *src_shape,
                              const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                              ms_error *err) {
    (void)dev, (void)err;
    ms_host_copy_box(dst, dst_shape, dst_start, src, src_shape, src_start, len, ndim, elt);
    return MS_OK;
}

static bool cpu_owns(const ms_device *dev, const void *ptr) {
    (void)dev, (void)ptr;
    return false; /* the host addresses all of it */
}

static void cpu_destroy(ms_device *dev) {
    free(dev);
}

static const ms_device_ops cpu_ops = {
    .name = "cpu",
    .kind = MS_DEVICE_CPU,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset_zero = cpu_zero,
    .copy_box = cpu_copy_box,
    .owns = cpu_owns,
    .destroy = cpu_destroy,
};

ms_status ms_device_cpu_create(ms_device **out, ms_error *err) {
    (void)err;
    ms_device *dev = xcalloc(1, sizeof *dev);
    dev->ops = &cpu_ops;
    *out = dev;
    return MS_OK;
}

ms_device *ms_device_host(void) {
    static ms_device host = {.ops = &cpu_ops};
    return &host;
}

#ifndef MS_HAVE_CUDA
ms_status ms_device_cuda_create(int ordinal, ms_device **out, ms_error *err) {
    (void)ordinal, (void)out;
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "this meshscope was built without CUDA (reconfigure with -DMS_ENABLE_CUDA=ON "
                   "on a machine with the CUDA toolkit)");
}

int ms_device_cuda_count(void) {
    return 0;
}

bool ms_device_cuda_describe(int ordinal, char *name, size_t len, double *mem_bytes) {
    (void)ordinal, (void)name, (void)len, (void)mem_bytes;
    return false;
}

ms_status ms_device_cuda_pinned_create(int ordinal, ms_device **out, ms_error *err) {
    (void)ordinal;
    return ms_device_cpu_create(out, err);
}
#endif

ms_status ms_device_host_beside(const ms_device *dev, ms_device **out, ms_error *err) {
    if (dev && dev->ops->kind == MS_DEVICE_CUDA)
        return ms_device_cuda_pinned_create(dev->ordinal, out, err);
    return ms_device_cpu_create(out, err);
}

ms_status ms_device_auto_create(bool want_gpu, int ordinal, ms_device **out, char *note,
                                size_t note_len, ms_error *err) {
    if (note && note_len) note[0] = '\0';
    if (want_gpu) {
        ms_error cuda_err = {0};
        if (ms_device_cuda_create(ordinal, out, &cuda_err) == MS_OK) return MS_OK;
        if (note && note_len) {
            size_t n = strlen(cuda_err.msg);
            const char *suffix = "; using the CPU";
            if (n + strlen(suffix) + 1 <= note_len) {
                memcpy(note, cuda_err.msg, n);
                memcpy(note + n, suffix, strlen(suffix) + 1);
            } else {
                strncpy(note, cuda_err.msg, note_len - 1);
                note[note_len - 1] = '\0';
            }
        }
    }
    return ms_device_cpu_create(out, err);
}

const char *ms_device_choice_name(ms_device_choice c) {
    static const char *const names[] = {"cpu", "cuda", "auto", "fenced"};
    return c < MS_DEVICE_CHOICE_COUNT ? names[c] : "?";
}

ms_status ms_device_resolve(ms_device_choice choice, ms_device_kind *out, char *note,
                            size_t note_len, ms_error *err) {
    *out = MS_DEVICE_CPU;
    if (note && note_len) note[0] = '\0';
    if (choice == MS_DEVICE_CHOICE_CPU) return MS_OK;
    if (choice == MS_DEVICE_CHOICE_FENCED) {
        *out = MS_DEVICE_FENCED;
        return MS_OK;
    }
    ms_error probe_err = {0};
    ms_device *gpu = NULL;
    bool usable = ms_device_cuda_create(0, &gpu, &probe_err) == MS_OK;
    ms_device_destroy(gpu);
    if (usable) {
        *out = MS_DEVICE_CUDA;
        if (note && note_len)
            snprintf(note, note_len,
                     "device %s: training on CUDA (%d GPU%s; rank r binds GPU r mod that)",
                     ms_device_choice_name(choice), ms_device_cuda_count(),
                     ms_device_cuda_count() == 1 ? "" : "s");
        return MS_OK;
    }
    if (choice == MS_DEVICE_CHOICE_CUDA)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "--device cuda: %s; use --device cpu, or --device auto to fall back to the "
                       "CPU",
                       probe_err.msg);
    if (note && note_len)
        snprintf(note, note_len, "device auto: %s; training on the CPU", probe_err.msg);
    return MS_OK;
}

/* --- shared layer ------------------------------------------------------------------------ */

ms_status ms_device_create(ms_device_kind kind, int rank, ms_device **out, ms_error *err) {
    switch (kind) {
        case MS_DEVICE_CPU:
            return ms_device_cpu_create(out, err);
        case MS_DEVICE_FENCED:
            return ms_device_fenced_create(out, err);
        case MS_DEVICE_CUDA: {
            int count = ms_device_cuda_count();
            if (count <= 0)
                return ms_fail(err, MS_ERR_UNSUPPORTED, "rank %d: no CUDA device to bind", rank);
            return ms_device_cuda_create(rank % count, out, err);
        }
        default:
            return ms_fail(err, MS_ERR_INVALID, "device kind %d unknown", (int)kind);
    }
}

void ms_device_destroy(ms_device *dev) {
    if (dev) dev->ops->destroy(dev);
}

void ms_device_set_limit(ms_device *dev, size_t bytes) {
    atomic_store(&dev->limit, bytes);
}

ms_status ms_device_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err) {
    /* Counted before the backend allocates, so concurrent callers cannot pass the limit. */
    size_t now = atomic_fetch_add(&dev->in_use, nbytes) + nbytes;
    size_t limit = atomic_load(&dev->limit);
    if (limit && now > limit) {
        atomic_fetch_sub(&dev->in_use, nbytes);
        return ms_fail(err, MS_ERR_NOMEM,
                       "%s: cannot allocate %zu bytes: %zu of its %zu-byte limit are in use",
                       dev->ops->name, nbytes, now - nbytes, limit);
    }
    ms_status st = dev->ops->alloc(dev, nbytes, out, err);
    if (st != MS_OK) {
        atomic_fetch_sub(&dev->in_use, nbytes);
        return st;
    }
    size_t peak = atomic_load(&dev->peak);
    while (now > peak && !atomic_compare_exchange_weak(&dev->peak, &peak, now)) {
    }
    return MS_OK;
}

void ms_device_free(ms_device *dev, void *ptr, size_t nbytes) {
    if (!ptr) return;
    dev->ops->free(dev, ptr);
    atomic_fetch_sub(&dev->in_use, nbytes);
}

ms_status ms_device_copy(ms_device *dev, void *dst, const void *src, size_t nbytes, ms_copy_dir dir,
                         ms_error *err) {
    return dev->ops->copy(dev, dst, src, nbytes, dir, err);
}

ms_status ms_device_zero(ms_device *dev, void *dst, size_t nbytes, ms_error *err) {
    return dev->ops->memset_zero(dev, dst, nbytes, err);
}

ms_status ms_device_copy_box(ms_device *dev, void *dst, const int64_t *dst_shape,
                             const int64_t *dst_start, const void *src, const int64_t *src_shape,
                             const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                             ms_error *err) {
    return dev->ops->copy_box(dev, dst, dst_shape, dst_start, src, src_shape, src_start, len, ndim,
                              elt, err);
}

ms_status ms_device_sync(ms_device *dev, ms_error *err) {
    return dev && dev->ops->sync ? dev->ops->sync(dev, err) : MS_OK;
}

bool ms_device_has_marks(const ms_device *dev) {
    return dev && dev->ops->mark_record;
}

ms_status ms_device_mark_record(ms_device *dev, ms_device_mark **out, ms_error *err) {
    *out = NULL;
    if (!dev) return MS_OK;
    if (!ms_device_has_marks(dev)) return ms_device_sync(dev, err);
    return dev->ops->mark_record(dev, out, err);
}

ms_status ms_device_mark_wait(ms_device *dev, const ms_device_mark *mark, void *stream,
                              ms_error *err) {
    return mark ? dev->ops->mark_wait(dev, mark, stream, err) : MS_OK;
}

void ms_device_mark_release(ms_device *dev, ms_device_mark *mark) {
    if (mark) dev->ops->mark_release(dev, mark);
}

bool ms_device_owns(const ms_device *dev, const void *ptr) {
    return dev && ptr && dev->ops->owns(dev, ptr);
}

ms_status ms_device_move(const ms_device *dev, void *dst, const void *src, size_t nbytes,
                         ms_error *err) {
    const bool d = ms_device_owns(dev, dst), s = ms_device_owns(dev, src);
    if (!d && !s) {
        if (nbytes) memmove(dst, src, nbytes);
        return MS_OK;
    }
    ms_copy_dir dir = d && s ? MS_COPY_DEVICE_TO_DEVICE
                      : d    ? MS_COPY_HOST_TO_DEVICE
                             : MS_COPY_DEVICE_TO_HOST;
    return dev->ops->copy((ms_device *)dev, dst, src, nbytes, dir, err);
}

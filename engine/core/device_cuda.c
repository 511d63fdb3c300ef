/* device_cuda.c - the CUDA backend of the device interface (built when CUDA is enabled).
 *
 * Created only when a driver and a GPU answer; otherwise ms_device_cuda_create returns
 * MS_ERR_UNSUPPORTED with the CUDA runtime's reason so the caller can fall back.
 *
 * Each device object (one rank's) owns a blocking compute stream, made on first use (so a
 * device made only to probe the GPU creates no CUDA context). Its kernel contexts launch
 * there (kernels/cuda/backend_cuda.c) and its copies run there, in the order the rank issued
 * them; a copy that touches host memory returns once it is done, as cudaMemcpy did. Blocking,
 * so work on the legacy default stream (anything outside the device) stays ordered with it.
 * A mark is an event recorded on that stream, taken from a pool of the device's events
 * (created once, without timing); NCCL's stream waits for it with cudaStreamWaitEvent. Not yet
 * run on a GPU. */
#include "engine/core/device.h"
#include "engine/core/cuda_check.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/core/xalloc.h"

/* A mark: one pooled event. */
typedef struct cuda_mark {
    cudaEvent_t event;
    struct cuda_mark *next; /* in the pool */
} cuda_mark;

typedef struct cuda_impl {
    _Atomic(cudaStream_t) stream; /* the compute stream (kernels and copies), or NULL yet */
    pthread_mutex_t mu; /* guards making the stream and pool: any thread may use the device */
    cuda_mark *pool;    /* released marks, their events ready to record again */
} cuda_impl;

/* The compute stream, made on first use (device.h); blocking, so ordered with the legacy
 * default stream both ways (see the top of the file). The device's own copies ask for it here
 * too. */
ms_status ms_device_cuda_stream(ms_device *dev, void **out, ms_error *err) {
    cuda_impl *impl = dev->impl;
    cudaStream_t s = atomic_load_explicit(&impl->stream, memory_order_acquire);
    ms_status st = MS_OK;
    if (!s) {
        pthread_mutex_lock(&impl->mu);
        s = atomic_load_explicit(&impl->stream, memory_order_relaxed);
        if (!s) {
            st = ms_cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err);
            if (st == MS_OK) st = ms_cuda_status(cudaStreamCreate(&s), "cudaStreamCreate", err);
            if (st == MS_OK) atomic_store_explicit(&impl->stream, s, memory_order_release);
        }
        pthread_mutex_unlock(&impl->mu);
    }
    *out = (void *)s;
    return st;
}

static ms_status cuda_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err) {
    MS_CHECK(ms_cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err));
    /* cudaMalloc returns at least 256-byte alignment, more than MS_TENSOR_ALIGN. */
    return ms_cuda_status(cudaMalloc(out, nbytes ? nbytes : 1), "cudaMalloc", err);
}

static void cuda_free(ms_device *dev, void *ptr) {
    (void)dev;
    cudaFree(ptr);
}

/* On the compute stream; one that reads or writes host memory returns once it is done (the
 * host may reuse or read its buffer at once), one between device buffers at once. */
static ms_status cuda_copy(ms_device *dev, void *dst, const void *src, size_t nbytes,
                           ms_copy_dir dir, ms_error *err) {
    static const enum cudaMemcpyKind kinds[] = {
        [MS_COPY_HOST_TO_DEVICE] = cudaMemcpyHostToDevice,
        [MS_COPY_DEVICE_TO_HOST] = cudaMemcpyDeviceToHost,
        [MS_COPY_DEVICE_TO_DEVICE] = cudaMemcpyDeviceToDevice,
    };
    void *s;
    MS_CHECK(ms_device_cuda_stream(dev, &s, err));
    MS_CHECK(
        ms_cuda_status(cudaMemcpyAsync(dst, src, nbytes, kinds[dir], s), "cudaMemcpyAsync", err));
    if (dir == MS_COPY_DEVICE_TO_DEVICE) return MS_OK;
    return ms_cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize", err);
}

static ms_status cuda_zero(ms_device *dev, void *dst, size_t nbytes, ms_error *err) {
    void *s;
    MS_CHECK(ms_device_cuda_stream(dev, &s, err));
    return ms_cuda_status(cudaMemsetAsync(dst, 0, nbytes, s), "cudaMemsetAsync", err);
}

typedef struct cuda_box {
    char *dst;
    const char *src;
    cudaStream_t stream;
} cuda_box;

static ms_status cuda_run(size_t doff, size_t soff, size_t bytes, void *arg, ms_error *err) {
    cuda_box *b = arg;
    return ms_cuda_status(
        cudaMemcpyAsync(b->dst + doff, b->src + soff, bytes, cudaMemcpyDeviceToDevice, b->stream),
        "cudaMemcpyAsync", err);
}

/* One cudaMemcpyAsync per innermost run on the compute stream: reshards move few, large
 * boxes; a strided-copy kernel is the step after. */
static ms_status cuda_copy_box(ms_device *dev, void *dst, const int64_t *dst_shape,
                               const int64_t *dst_start, const void *src, const int64_t *src_shape,
                               const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                               ms_error *err) {
    void *s;
    MS_CHECK(ms_device_cuda_stream(dev, &s, err));
    cuda_box b = {dst, src, s};
    return ms_box_runs(dst_shape, dst_start, src_shape, src_start, len, ndim, elt, cuda_run, &b,
                       err);
}

/* Device memory only: managed and registered host memory are addressable by the host. */
static bool cuda_owns(const ms_device *dev, const void *ptr) {
    (void)dev;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError(); /* plain host memory on old runtimes: clear the error */
        return false;
    }
    return a.type == cudaMemoryTypeDevice;
}

/* Every mark must have been released: the pool holds them all. */
static void cuda_destroy(ms_device *dev) {
    cuda_impl *impl = dev->impl;
    if (impl) {
        for (cuda_mark *m = impl->pool, *next; m; m = next) {
            next = m->next;
            cudaEventDestroy(m->event);
            free(m);
        }
        cudaStream_t s = atomic_load(&impl->stream);
        if (s) cudaStreamDestroy(s); /* released once its work is done */
        pthread_mutex_destroy(&impl->mu);
        free(impl);
    }
    free(dev);
}

static ms_status cuda_sync(ms_device *dev, ms_error *err) {
    MS_CHECK(ms_cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err));
    return ms_cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize", err);
}

/* --- marks: pooled events on the compute stream ------------------------------------------ */

static cuda_mark *pool_pop(cuda_impl *impl) {
    pthread_mutex_lock(&impl->mu);
    cuda_mark *m = impl->pool;
    if (m) impl->pool = m->next;
    pthread_mutex_unlock(&impl->mu);
    return m;
}

static void cuda_mark_release(ms_device *dev, ms_device_mark *mark) {
    cuda_impl *impl = dev->impl;
    cuda_mark *m = (cuda_mark *)mark;
    pthread_mutex_lock(&impl->mu);
    m->next = impl->pool;
    impl->pool = m;
    pthread_mutex_unlock(&impl->mu);
}

/* An event is created only when the pool is empty: in steady state, as many as calls in
 * flight at once. */
static ms_status cuda_mark_record(ms_device *dev, ms_device_mark **out, ms_error *err) {
    cuda_impl *impl = dev->impl;
    void *s;
    MS_CHECK(ms_device_cuda_stream(dev, &s, err));
    MS_CHECK(ms_cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err));
    cuda_mark *m = pool_pop(impl);
    if (!m) {
        m = xcalloc(1, sizeof *m);
        ms_status st = ms_cuda_status(cudaEventCreateWithFlags(&m->event, cudaEventDisableTiming),
                                      "cudaEventCreateWithFlags", err);
        if (st != MS_OK) {
            free(m);
            return st;
        }
    }
    ms_status st = ms_cuda_status(cudaEventRecord(m->event, s), "cudaEventRecord", err);
    if (st != MS_OK) {
        cuda_mark_release(dev, (ms_device_mark *)m);
        return st;
    }
    *out = (ms_device_mark *)m;
    return MS_OK;
}

static ms_status cuda_mark_wait(ms_device *dev, const ms_device_mark *mark, void *stream,
                                ms_error *err) {
    (void)dev;
    const cuda_mark *m = (const cuda_mark *)mark;
    return ms_cuda_status(cudaStreamWaitEvent((cudaStream_t)stream, m->event, 0),
                          "cudaStreamWaitEvent", err);
}

static const ms_device_ops cuda_ops = {
    .name = "cuda",
    .kind = MS_DEVICE_CUDA,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .memset_zero = cuda_zero,
    .copy_box = cuda_copy_box,
    .owns = cuda_owns,
    .sync = cuda_sync,
    .mark_record = cuda_mark_record,
    .mark_wait = cuda_mark_wait,
    .mark_release = cuda_mark_release,
    .destroy = cuda_destroy,
};

int ms_device_cuda_count(void) {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

bool ms_device_cuda_describe(int ordinal, char *name, size_t len, double *mem_bytes) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) return false;
    snprintf(name, len, "%s", prop.name);
    *mem_bytes = (double)prop.totalGlobalMem;
    return true;
}

ms_status ms_device_cuda_create(int ordinal, ms_device **out, ms_error *err) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "no usable CUDA device (%s)",
                       cudaGetErrorString(e));
    if (ordinal < 0 || ordinal >= count)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "CUDA device %d requested but %d present", ordinal,
                       count);
    ms_device *dev = xcalloc(1, sizeof *dev);
    cuda_impl *impl = xcalloc(1, sizeof *impl);
    pthread_mutex_init(&impl->mu, NULL);
    dev->ops = &cuda_ops;
    dev->impl = impl;
    dev->ordinal = ordinal;
    *out = dev;
    return MS_OK;
}

/* --- pinned host memory (optimizer offload beside a GPU) ------------------------------------ */

static ms_status pinned_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err) {
    MS_CHECK(ms_cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err));
    /* page-aligned, more than MS_TENSOR_ALIGN */
    return ms_cuda_status(cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable),
                          "cudaHostAlloc", err);
}

static void pinned_free(ms_device *dev, void *ptr) {
    (void)dev;
    cudaFreeHost(ptr);
}

/* The CPU backend's slots (host memory: copies, zeroing, boxes, ownership), with the pinned
 * allocator. */
static ms_device_ops pinned_ops;
static pthread_once_t pinned_once = PTHREAD_ONCE_INIT;

static void pinned_ops_init(void) {
    pinned_ops = *ms_device_host()->ops;
    pinned_ops.name = "cuda-pinned";
    pinned_ops.alloc = pinned_alloc;
    pinned_ops.free = pinned_free;
}

ms_status ms_device_cuda_pinned_create(int ordinal, ms_device **out, ms_error *err) {
    MS_CHECK(ms_device_cpu_create(out, err)); /* the CPU's destroy frees it */
    pthread_once(&pinned_once, pinned_ops_init);
    (*out)->ops = &pinned_ops;
    (*out)->ordinal = ordinal;
    return MS_OK;
}

/* device_cuda.c - the CUDA backend of the device interface (built when CUDA is enabled).
 *
 * Created only when a driver and a GPU answer; otherwise ms_device_cuda_create returns
 * MS_ERR_UNSUPPORTED with the CUDA runtime's reason so the caller can fall back. */
#include "engine/core/device.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>

#include "engine/core/xalloc.h"

typedef struct cuda_impl {
    int ordinal;
} cuda_impl;

static ms_status cuda_status(cudaError_t e, const char *what, ms_error *err) {
    if (e == cudaSuccess) return MS_OK;
    return ms_fail(err, e == cudaErrorMemoryAllocation ? MS_ERR_NOMEM : MS_ERR_INTERNAL,
                   "cuda: %s failed: %s", what, cudaGetErrorString(e));
}

static ms_status cuda_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err) {
    MS_CHECK(cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err));
    /* cudaMalloc returns at least 256-byte alignment, more than MS_TENSOR_ALIGN. */
    return cuda_status(cudaMalloc(out, nbytes ? nbytes : 1), "cudaMalloc", err);
}

static void cuda_free(ms_device *dev, void *ptr) {
    (void)dev;
    cudaFree(ptr);
}

static ms_status cuda_copy(ms_device *dev, void *dst, const void *src, size_t nbytes,
                           ms_copy_dir dir, ms_error *err) {
    (void)dev;
    static const enum cudaMemcpyKind kinds[] = {
        [MS_COPY_HOST_TO_DEVICE] = cudaMemcpyHostToDevice,
        [MS_COPY_DEVICE_TO_HOST] = cudaMemcpyDeviceToHost,
        [MS_COPY_DEVICE_TO_DEVICE] = cudaMemcpyDeviceToDevice,
    };
    return cuda_status(cudaMemcpy(dst, src, nbytes, kinds[dir]), "cudaMemcpy", err);
}

static ms_status cuda_zero(ms_device *dev, void *dst, size_t nbytes, ms_error *err) {
    (void)dev;
    return cuda_status(cudaMemset(dst, 0, nbytes), "cudaMemset", err);
}

typedef struct cuda_box {
    char *dst;
    const char *src;
} cuda_box;

static ms_status cuda_run(size_t doff, size_t soff, size_t bytes, void *arg, ms_error *err) {
    cuda_box *b = arg;
    return cuda_status(
        cudaMemcpyAsync(b->dst + doff, b->src + soff, bytes, cudaMemcpyDeviceToDevice, 0),
        "cudaMemcpyAsync", err);
}

/* One cudaMemcpyAsync per innermost run on the default stream (ordered before the synchronous
 * copies that follow): reshards move few, large boxes; a strided-copy kernel is the step
 * after. */
static ms_status cuda_copy_box(ms_device *dev, void *dst, const int64_t *dst_shape,
                               const int64_t *dst_start, const void *src, const int64_t *src_shape,
                               const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                               ms_error *err) {
    (void)dev;
    cuda_box b = {dst, src};
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

static void cuda_destroy(ms_device *dev) {
    free(dev->impl);
    free(dev);
}

static ms_status cuda_sync(ms_device *dev, ms_error *err) {
    MS_CHECK(cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err));
    return cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize", err);
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
    .destroy = cuda_destroy,
};

int ms_device_cuda_count(void) {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
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
    impl->ordinal = ordinal;
    dev->ops = &cuda_ops;
    dev->impl = impl;
    dev->ordinal = ordinal;
    *out = dev;
    return MS_OK;
}

/* --- pinned host memory (optimizer offload beside a GPU) ------------------------------------ */

static ms_status pinned_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err) {
    MS_CHECK(cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice", err));
    /* page-aligned, more than MS_TENSOR_ALIGN */
    return cuda_status(cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable),
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

/* device_cuda.c - the CUDA backend of the device interface (built when CUDA is enabled).
 *
 * Created only when a driver and a GPU answer; otherwise ms_device_cuda_create returns
 * MS_ERR_UNSUPPORTED with the CUDA runtime's reason so the caller can fall back. */
#include "engine/core/device.h"

#include <cuda_runtime_api.h>
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

static void cuda_destroy(ms_device *dev) {
    free(dev->impl);
    free(dev);
}

static const ms_device_ops cuda_ops = {
    .name = "cuda",
    .kind = MS_DEVICE_CUDA,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .memset_zero = cuda_zero,
    .destroy = cuda_destroy,
};

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

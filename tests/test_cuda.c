/* test_cuda.c - the CUDA device backend against the CPU: allocate, copy in, copy out,
 * zero. Skips with exit code 77 (and says why) when no GPU is usable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/device.h"

int main(void) {
    ms_device *gpu;
    ms_error err = {0};
    ms_status st = ms_device_cuda_create(0, &gpu, &err);
    if (st == MS_ERR_UNSUPPORTED) {
        printf("SKIP: %s\n", err.msg);
        return 77;
    }
    if (st != MS_OK) {
        fprintf(stderr, "cuda device: %s\n", err.msg);
        return 1;
    }
    enum { N = 1 << 20 };
    float *host = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f;
    void *dev = NULL;
    int bad = 0;
    if (ms_device_alloc(gpu, N * sizeof(float), &dev, &err) != MS_OK ||
        ms_device_copy(gpu, dev, host, N * sizeof(float), MS_COPY_HOST_TO_DEVICE, &err) != MS_OK ||
        ms_device_copy(gpu, back, dev, N * sizeof(float), MS_COPY_DEVICE_TO_HOST, &err) != MS_OK) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    bad |= memcmp(host, back, N * sizeof(float)) != 0;
    bad |= atomic_load(&gpu->in_use) != N * sizeof(float);
    ms_device_zero(gpu, dev, N * sizeof(float), &err);
    ms_device_copy(gpu, back, dev, N * sizeof(float), MS_COPY_DEVICE_TO_HOST, &err);
    for (int i = 0; i < N; i++) bad |= back[i] != 0.0f;
    ms_device_free(gpu, dev, N * sizeof(float));
    ms_device_destroy(gpu);
    free(host), free(back);
    printf("%s: cuda device round trip of %d floats\n", bad ? "FAIL" : "ok", N);
    return bad;
}

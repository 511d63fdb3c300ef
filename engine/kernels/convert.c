/* convert.c - bf16 <-> f32 over whole buffers, for mixed precision (see kernels.h).
 *
 * bf16 is the top half of an IEEE float, so widening is a shift and rounding is
 * round-to-nearest-even on the dropped half (NaN kept quiet), bit for bit what
 * ms_bf16_from_f32 does one value at a time. The loops are branch-free so that they
 * vectorise; they run on the rank's threads like the other streaming kernels. */
#include <string.h>

#include "engine/kernels/kernels.h"
#include "engine/core/parallel.h"

static inline uint16_t round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? (u >> 16) | 0x40u : r);
}

static inline float widen_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct conv_args {
    float *f;
    uint16_t *h;
    const float *cf;
    const uint16_t *ch;
} conv_args;

static void widen_range(void *arg, int64_t lo, int64_t hi) {
    const conv_args *a = arg;
    for (int64_t i = lo; i < hi; i++) a->f[i] = widen_bf16(a->ch[i]);
}

static void round_range(void *arg, int64_t lo, int64_t hi) {
    const conv_args *a = arg;
    for (int64_t i = lo; i < hi; i++) a->h[i] = round_bf16(a->cf[i]);
}

static void add_range(void *arg, int64_t lo, int64_t hi) {
    const conv_args *a = arg;
    for (int64_t i = lo; i < hi; i++)
        a->h[i] = round_bf16(widen_bf16(a->h[i]) + widen_bf16(a->ch[i]));
}

#define CONVERT_GRAIN (1 << 15)

void ms_k_bf16_widen(float *out, const uint16_t *in, int64_t n) {
    conv_args a = {.f = out, .ch = in};
    ms_parallel_for(n, CONVERT_GRAIN, widen_range, &a);
}

void ms_k_bf16_round(uint16_t *out, const float *in, int64_t n) {
    conv_args a = {.h = out, .cf = in};
    ms_parallel_for(n, CONVERT_GRAIN, round_range, &a);
}

void ms_k_bf16_add_inplace(uint16_t *acc, const uint16_t *x, int64_t n) {
    conv_args a = {.h = acc, .ch = x};
    ms_parallel_for(n, CONVERT_GRAIN, add_range, &a);
}

/* philox.c - Philox4x32-10. Constants from the Random123 paper. */
#include "engine/core/philox.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void ms_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

void ms_philox_words(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    ms_philox4x32_10(ctr, key, out);
}

float ms_philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    ms_philox_words(seed, stream, index, w);
    return (float)(w[0] >> 8) * (1.0f / 16777216.0f);
}

double ms_philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t w[4];
    ms_philox_words(seed, stream, index, w);
    /* u1 in (0, 1] so log(u1) is finite. */
    double u1 = ((double)(w[0] >> 8) + 1.0) * (1.0 / 16777216.0);
    double u2 = (double)(w[1] >> 8) * (1.0 / 16777216.0);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

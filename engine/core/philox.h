/* philox.h - counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
 *
 * A value is a pure function of (seed, stream, index): no state advances. meshscope keys
 * `stream` with a tensor id and `index` with the element's *global* linear index, so a
 * tensor initialised shard by shard on any mesh equals the same tensor initialised whole,
 * and a dropout mask is the same on any mesh.
 */
#ifndef MS_PHILOX_H
#define MS_PHILOX_H

#include <stdint.h>

/* One Philox4x32 block with 10 rounds: out = bijection_key(ctr). */
void ms_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Four raw 32-bit words for (seed, stream, index). */
void ms_philox_words(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);

/* Uniform float in [0, 1) with 24 random bits. */
float ms_philox_uniform(uint64_t seed, uint64_t stream, uint64_t index);

/* Standard normal (Box-Muller on two words of the same block), in double precision. */
double ms_philox_normal(uint64_t seed, uint64_t stream, uint64_t index);

#endif

/* hmap.h - a hash index: 64-bit hashes to 32-bit values, the values being indices into an
 * array the caller owns, where the keys live.
 *
 * The map stores no keys. A lookup passes the key's hash and an equality test that the map
 * calls on each value stored under that hash, so one map serves any key type (a name, a rank
 * list, an id) without copying it. Open addressing with linear probing, at most half full, so
 * a lookup examines about two slots whatever the number of keys; nothing is ever removed (the
 * indexes it serves only grow).
 *
 * Lookups count the slots they examine (probes) and themselves (lookups): the work of a
 * lookup is a tested property, O(1) on average (tests assert probes per lookup).
 *
 * Ownership: the map owns its table; ms_hmap_free releases it. Zero-initialise to start
 * empty. Not thread-safe (a lookup updates the counters).
 */
#ifndef MS_HMAP_H
#define MS_HMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ms_hmap_slot {
    uint64_t hash; /* 0: empty (a key hashing to 0 is stored as 1) */
    uint32_t val;
} ms_hmap_slot;

typedef struct ms_hmap {
    ms_hmap_slot *slots;
    size_t cap; /* 0 or a power of two */
    size_t n;
    uint64_t lookups; /* ms_hmap_find calls */
    uint64_t probes;  /* slots they examined, the empty one that ends a miss included */
} ms_hmap;

/* Whether the key at value `val` equals the key looked up (ctx: that key). */
typedef bool (*ms_hmap_eq)(const void *ctx, uint32_t val);

/* The first value added under hash h for which eq holds, into *val; false when none. */
bool ms_hmap_find(ms_hmap *m, uint64_t h, ms_hmap_eq eq, const void *ctx, uint32_t *val);

/* Adds val under h (an equal key may be there already: finds return the first added). False
 * when out of memory; the map is then unchanged. */
bool ms_hmap_add(ms_hmap *m, uint64_t h, uint32_t val);

void ms_hmap_free(ms_hmap *m);

/* Hashes for keys: bytes (FNV-1a, continuing from h; start from MS_HASH_SEED), then
 * ms_hash_mix, which spreads the bits so that the low ones index the table well. */
#define MS_HASH_SEED 14695981039346656037ull
uint64_t ms_hash_bytes(uint64_t h, const void *data, size_t n);
uint64_t ms_hash_mix(uint64_t x);

#endif

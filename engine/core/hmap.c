/* hmap.c - the hash index of hmap.h: linear probing, grown at half full. */
#include "engine/core/hmap.h"

#include <stdlib.h>

uint64_t ms_hash_bytes(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The finaliser of SplitMix64: every input bit reaches every output bit. */
uint64_t ms_hash_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t stored(uint64_t h) {
    return h ? h : 1;
}

bool ms_hmap_find(ms_hmap *m, uint64_t h, ms_hmap_eq eq, const void *ctx, uint32_t *val) {
    m->lookups++;
    if (!m->cap) return false;
    h = stored(h);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const ms_hmap_slot *s = &m->slots[i];
        m->probes++;
        if (!s->hash) return false;
        if (s->hash == h && eq(ctx, s->val)) {
            *val = s->val;
            return true;
        }
    }
}

static void place(ms_hmap_slot *slots, size_t cap, ms_hmap_slot s) {
    size_t i = s.hash & (cap - 1);
    while (slots[i].hash) i = (i + 1) & (cap - 1);
    slots[i] = s;
}

/* Doubles the table. The old one is walked from an empty slot (one always exists: it is at
 * most half full), so each probe chain is moved in its order and equal keys stay in the
 * order they were added. */
static bool grow(ms_hmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    ms_hmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    size_t start = 0;
    while (start < m->cap && m->slots[start].hash) start++;
    for (size_t k = 0; k < m->cap; k++) {
        const ms_hmap_slot *s = &m->slots[(start + k) & (m->cap - 1)];
        if (s->hash) place(slots, cap, *s);
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

bool ms_hmap_add(ms_hmap *m, uint64_t h, uint32_t val) {
    if ((m->n + 1) * 2 > m->cap && !grow(m)) return false;
    place(m->slots, m->cap, (ms_hmap_slot){.hash = stored(h), .val = val});
    m->n++;
    return true;
}

void ms_hmap_free(ms_hmap *m) {
    if (!m) return;
    free(m->slots);
    *m = (ms_hmap){0};
}

/* trace_merge.c - per-rank traces merged into one (see trace_merge.h). */
#include "traces/trace_merge.h"

#include <stdlib.h>
#include <string.h>

static int listed(int32_t size) {
    return size < 0 ? 0 : size < MS_EV_GROUP_MAX ? size : MS_EV_GROUP_MAX;
}

/* Equal groups: the name (up to its terminator), the size and the listed ranks. */
static bool same_group(const ms_group *a, const ms_group *b) {
    return a->size == b->size && !strncmp(a->name, b->name, sizeof a->name) &&
           !memcmp(a->ranks, b->ranks, sizeof *a->ranks * (size_t)listed(a->size));
}

static uint64_t group_hash(const ms_group *g) {
    uint64_t h = ms_hash_bytes(MS_HASH_SEED, g->name, strnlen(g->name, sizeof g->name));
    h = ms_hash_bytes(h, &g->size, sizeof g->size);
    return ms_hash_mix(ms_hash_bytes(h, g->ranks, sizeof *g->ranks * (size_t)listed(g->size)));
}

typedef struct group_key {
    const ms_group *groups; /* where the indexed values point */
    const ms_group *g;      /* the group looked up (same_group), or ... */
    int32_t id;             /* ... its id (eq_id) */
} group_key;

static bool eq_same(const void *ctx, uint32_t i) {
    const group_key *k = ctx;
    return same_group(&k->groups[i], k->g);
}

static bool eq_id(const void *ctx, uint32_t i) {
    const group_key *k = ctx;
    return k->groups[i].id == k->id;
}

static uint64_t id_hash(int32_t id) {
    return ms_hash_mix((uint64_t)(uint32_t)id);
}

/* The merged id of g: an equal group merged before, or a new one numbered next. */
static ms_status merge_group(ms_trace_merge *m, const ms_group *g, int32_t *id, ms_error *err) {
    group_key k = {.groups = m->groups, .g = g};
    uint64_t h = group_hash(g);
    uint32_t i;
    if (ms_hmap_find(&m->by_key, h, eq_same, &k, &i)) {
        *id = m->groups[i].id;
        return MS_OK;
    }
    if (m->n_groups == m->gcap) {
        int cap = m->gcap ? m->gcap * 2 : 16;
        ms_group *ng = realloc(m->groups, sizeof *ng * (size_t)cap);
        if (!ng) return ms_fail(err, MS_ERR_NOMEM, "out of memory merging %d groups", cap);
        m->groups = ng;
        m->gcap = cap;
    }
    if (!ms_hmap_add(&m->by_key, h, (uint32_t)m->n_groups))
        return ms_fail(err, MS_ERR_NOMEM, "out of memory indexing %d groups", m->n_groups);
    m->groups[m->n_groups] = *g;
    *id = m->groups[m->n_groups].id = m->n_groups;
    m->n_groups++;
    return MS_OK;
}

/* Each group of t mapped to its merged id (gmap), and t's group ids indexed (by_id) to the
 * last group with that id, as a scan of the groups in order would end on. */
static ms_status map_groups(ms_trace_merge *m, const ms_trace *t, int32_t *gmap, ms_hmap *by_id,
                            ms_error *err) {
    for (int g = 0; g < t->n_groups; g++) MS_CHECK(merge_group(m, &t->groups[g], &gmap[g], err));
    for (int g = t->n_groups - 1; g >= 0; g--) {
        group_key k = {.groups = t->groups, .id = t->groups[g].id};
        uint32_t i;
        if (!ms_hmap_find(by_id, id_hash(k.id), eq_id, &k, &i) &&
            !ms_hmap_add(by_id, id_hash(k.id), (uint32_t)g))
            return ms_fail(err, MS_ERR_NOMEM, "out of memory indexing %d groups", t->n_groups);
    }
    return MS_OK;
}

static ms_status append_events(ms_trace_merge *m, const ms_trace *t, const int32_t *gmap,
                               ms_hmap *by_id, ms_error *err) {
    if (t->n_events > m->cap - m->n_events) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap - m->n_events < t->n_events) cap *= 2;
        ms_event *ne = realloc(m->events, sizeof *ne * cap);
        if (!ne) return ms_fail(err, MS_ERR_NOMEM, "out of memory merging %zu events", cap);
        m->events = ne;
        m->cap = cap;
    }
    for (size_t i = 0; i < t->n_events; i++) {
        ms_event e = t->events[i];
        if (e.kind == MS_EV_COLL) {
            group_key k = {.groups = t->groups, .id = e.u.coll.group};
            uint32_t g;
            e.u.coll.group = ms_hmap_find(by_id, id_hash(k.id), eq_id, &k, &g) ? gmap[g] : -1;
        }
        m->events[m->n_events++] = e;
    }
    return MS_OK;
}

ms_status ms_trace_merge_add(ms_trace_merge *m, const ms_trace *t, ms_error *err) {
    int32_t *gmap = malloc(sizeof *gmap * (size_t)(t->n_groups + 1));
    if (!gmap) return ms_fail(err, MS_ERR_NOMEM, "out of memory merging %d groups", t->n_groups);
    ms_hmap by_id = {0};
    uint64_t lookups = m->by_key.lookups, probes = m->by_key.probes;
    ms_status st = map_groups(m, t, gmap, &by_id, err);
    if (st == MS_OK) st = append_events(m, t, gmap, &by_id, err);
    m->n_group_lookups += m->by_key.lookups - lookups + by_id.lookups;
    m->n_group_probes += m->by_key.probes - probes + by_id.probes;
    ms_hmap_free(&by_id);
    free(gmap);
    return st;
}

void ms_trace_merge_free(ms_trace_merge *m) {
    if (!m) return;
    free(m->events);
    free(m->groups);
    ms_hmap_free(&m->by_key);
    *m = (ms_trace_merge){0};
}

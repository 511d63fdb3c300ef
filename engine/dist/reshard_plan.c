/* reshard_plan.c - the pure reshard planner and the per-rank plan cache.
 *
 * Planning is a shortest-path search over placement states. From a state, each mesh dim
 * may change by one step (all-reduce, reduce-scatter, all-gather, all-to-all, slice,
 * partialize); a step costs the bytes a rank sends for it, plus one so that among equal
 * byte counts the plan with fewer steps wins. Dijkstra on this small graph (states are
 * generated on demand) returns the cheapest order, e.g. slicing before an all-reduce so
 * the all-reduce moves fewer bytes.
 *
 * Invariant kept by the transitions: only the innermost shard of a tensor dim changes, so
 * every state's local part is one contiguous box of the global tensor.
 */
#include "engine/dist/reshard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

static const char *const rstep_names[MS_RSTEP_KIND_COUNT] = {
    [MS_RSTEP_ALL_REDUCE] = "all_reduce", [MS_RSTEP_REDUCE_SCATTER] = "reduce_scatter",
    [MS_RSTEP_ALL_GATHER] = "all_gather", [MS_RSTEP_ALL_TO_ALL] = "all_to_all",
    [MS_RSTEP_SLICE] = "slice",           [MS_RSTEP_PARTIALIZE] = "partialize",
    [MS_RSTEP_SEND_RECV] = "send_recv",
};

const char *ms_rstep_name(ms_rstep_kind k) {
    return (unsigned)k < MS_RSTEP_KIND_COUNT ? rstep_names[k] : "?";
}

/* --- state encoding: 8 bits per mesh dim: kind(2) | dim or op(3) | order(3) ------------- */

static uint64_t encode(const ms_placements *pl) {
    uint64_t key = 0;
    for (int m = 0; m < pl->n; m++) {
        ms_placement p = pl->p[m];
        unsigned v = p.kind == MS_PL_SHARD ? (1u | (unsigned)p.dim << 2 | (unsigned)p.order << 5)
                     : p.kind == MS_PL_PARTIAL ? (2u | (unsigned)p.reduce << 2)
                                               : 0u;
        key |= (uint64_t)v << (8 * m);
    }
    return key;
}

static void decode(uint64_t key, int n, ms_placements *pl) {
    memset(pl, 0, sizeof *pl);
    pl->n = n;
    for (int m = 0; m < n; m++) {
        unsigned v = (unsigned)(key >> (8 * m)) & 0xffu;
        unsigned kind = v & 3u;
        if (kind == 1)
            pl->p[m] = (ms_placement){MS_PL_SHARD, (int8_t)((v >> 2) & 7u), 0, (int8_t)(v >> 5)};
        else if (kind == 2)
            pl->p[m] = ms_pl_partial((ms_reduce_op)((v >> 2) & 7u));
        else
            pl->p[m] = ms_pl_replicate();
    }
}

/* Elements held by the rank at coordinate 0 everywhere (the largest part). */
static double local_numel(const ms_placements *pl, const ms_mesh *mesh, int ndim,
                          const int64_t *gshape) {
    int zero[MS_MESH_MAX_DIMS] = {0};
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
    ms_local_box(pl, mesh, zero, ndim, gshape, start, len);
    double n = 1;
    for (int d = 0; d < ndim; d++) n *= (double)len[d];
    return n;
}

static int chain_len(const ms_placements *pl, int d) {
    int n = 0;
    for (int m = 0; m < pl->n; m++)
        if (pl->p[m].kind == MS_PL_SHARD && pl->p[m].dim == d) n++;
    return n;
}

static bool is_innermost(const ms_placements *pl, int m) {
    return pl->p[m].order == chain_len(pl, pl->p[m].dim) - 1;
}

/* Fills the byte figures of a step from its before/after states. */
static void step_bytes(ms_rstep *s, const ms_mesh *mesh, int ndim, const int64_t *gshape) {
    double before = local_numel(&s->before, mesh, ndim, gshape) * sizeof(float);
    double after = local_numel(&s->after, mesh, ndim, gshape) * sizeof(float);
    ms_coll_kind ck = MS_COLL_BARRIER;
    s->coll_bytes = 0;
    switch (s->kind) {
        case MS_RSTEP_ALL_REDUCE:
            ck = MS_COLL_ALL_REDUCE, s->coll_bytes = before;
            break;
        case MS_RSTEP_REDUCE_SCATTER:
            ck = MS_COLL_REDUCE_SCATTER, s->coll_bytes = before;
            break;
        case MS_RSTEP_ALL_GATHER:
            ck = MS_COLL_ALL_GATHER, s->coll_bytes = after;
            break;
        case MS_RSTEP_ALL_TO_ALL:
            ck = MS_COLL_ALL_TO_ALL, s->coll_bytes = before;
            break;
        default:
            break;
    }
    s->wire_bytes =
        s->coll_bytes ? s->coll_bytes * ms_coll_busbw_factor(ck, mesh->shape[s->mesh_dim]) : 0;
}

/* --- Dijkstra ------------------------------------------------------------------------------ */

typedef struct node {
    uint64_t key;
    double dist;
    int prev;
    uint8_t kind, mesh_dim, done;
} node;

typedef struct search {
    node *nodes;
    int n, cap;
    int *table; /* open addressing: node index + 1, 0 = empty */
    int tcap;
    struct heap_item {
        double dist;
        int idx;
    } * heap;
    int hn, hcap;
} search;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int find_or_add(search *s, uint64_t key, bool *added) {
    if (2 * (s->n + 1) > s->tcap) {
        int ncap = s->tcap ? s->tcap * 2 : 256;
        int *nt = xcalloc((size_t)ncap, sizeof *nt);
        for (int i = 0; i < s->n; i++) {
            size_t h = mix(s->nodes[i].key) & (size_t)(ncap - 1);
            while (nt[h]) h = (h + 1) & (size_t)(ncap - 1);
            nt[h] = i + 1;
        }
        free(s->table);
        s->table = nt;
        s->tcap = ncap;
    }
    size_t h = mix(key) & (size_t)(s->tcap - 1);
    while (s->table[h]) {
        if (s->nodes[s->table[h] - 1].key == key) {
            *added = false;
            return s->table[h] - 1;
        }
        h = (h + 1) & (size_t)(s->tcap - 1);
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 128;
        s->nodes = xrealloc(s->nodes, sizeof *s->nodes * (size_t)s->cap);
    }
    s->nodes[s->n] = (node){.key = key, .dist = 1e300, .prev = -1};
    s->table[h] = s->n + 1;
    *added = true;
    return s->n++;
}

static void heap_push(search *s, double dist, int idx) {
    if (s->hn == s->hcap) {
        s->hcap = s->hcap ? s->hcap * 2 : 128;
        s->heap = xrealloc(s->heap, sizeof *s->heap * (size_t)s->hcap);
    }
    int i = s->hn++;
    while (i > 0 && s->heap[(i - 1) / 2].dist > dist) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = (struct heap_item){dist, idx};
}

static struct heap_item heap_pop(search *s) {
    struct heap_item top = s->heap[0], last = s->heap[--s->hn];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= s->hn) break;
        if (c + 1 < s->hn && s->heap[c + 1].dist < s->heap[c].dist) c++;
        if (s->heap[c].dist >= last.dist) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->hn) s->heap[i] = last;
    return top;
}

typedef struct plan_input {
    const ms_mesh *mesh;
    int ndim;
    const int64_t *gshape;
    ms_reduce_op partial_ops[MS_REDUCE_COUNT]; /* ops that may appear (from src or dst) */
    int n_ops;
} plan_input;

static void relax(search *s, const plan_input *in, int from, const ms_placements *next,
                  ms_rstep_kind kind, int m) {
    if (ms_placements_validate(next, in->mesh->ndim, in->ndim, NULL) != MS_OK) return;
    ms_rstep st = {.kind = kind, .mesh_dim = m, .after = *next};
    decode(s->nodes[from].key, in->mesh->ndim, &st.before);
    step_bytes(&st, in->mesh, in->ndim, in->gshape);
    double d = s->nodes[from].dist + st.wire_bytes + 1.0;
    bool added;
    int to = find_or_add(s, encode(next), &added);
    if (d < s->nodes[to].dist) {
        s->nodes[to].dist = d;
        s->nodes[to].prev = from;
        s->nodes[to].kind = (uint8_t)kind;
        s->nodes[to].mesh_dim = (uint8_t)m;
        heap_push(s, d, to);
    }
}

static void expand(search *s, const plan_input *in, int idx) {
    ms_placements cur;
    decode(s->nodes[idx].key, in->mesh->ndim, &cur);
    for (int m = 0; m < cur.n; m++) {
        ms_placement p = cur.p[m];
        ms_placements next = cur;
        if (p.kind == MS_PL_PARTIAL) {
            next.p[m] = ms_pl_replicate();
            relax(s, in, idx, &next, MS_RSTEP_ALL_REDUCE, m);
            for (int d = 0; d < in->ndim; d++) {
                next.p[m] = (ms_placement){MS_PL_SHARD, (int8_t)d, 0, (int8_t)chain_len(&cur, d)};
                relax(s, in, idx, &next, MS_RSTEP_REDUCE_SCATTER, m);
            }
        } else if (p.kind == MS_PL_SHARD) {
            if (!is_innermost(&cur, m)) continue;
            next.p[m] = ms_pl_replicate();
            relax(s, in, idx, &next, MS_RSTEP_ALL_GATHER, m);
            for (int d = 0; d < in->ndim; d++) {
                if (d == p.dim) continue;
                next.p[m] = (ms_placement){MS_PL_SHARD, (int8_t)d, 0, (int8_t)chain_len(&cur, d)};
                relax(s, in, idx, &next, MS_RSTEP_ALL_TO_ALL, m);
            }
        } else {
            for (int d = 0; d < in->ndim; d++) {
                next.p[m] = (ms_placement){MS_PL_SHARD, (int8_t)d, 0, (int8_t)chain_len(&cur, d)};
                relax(s, in, idx, &next, MS_RSTEP_SLICE, m);
            }
            for (int o = 0; o < in->n_ops; o++) {
                next.p[m] = ms_pl_partial(in->partial_ops[o]);
                relax(s, in, idx, &next, MS_RSTEP_PARTIALIZE, m);
            }
        }
    }
}

static void add_op(plan_input *in, const ms_placements *pl) {
    for (int m = 0; m < pl->n; m++) {
        if (pl->p[m].kind != MS_PL_PARTIAL) continue;
        bool seen = false;
        for (int i = 0; i < in->n_ops; i++) seen |= in->partial_ops[i] == pl->p[m].reduce;
        if (!seen) in->partial_ops[in->n_ops++] = (ms_reduce_op)pl->p[m].reduce;
    }
}

ms_status ms_reshard_plan_make(const ms_mesh *mesh, const ms_placements *src,
                               const ms_placements *dst, int ndim, const int64_t *gshape,
                               ms_reshard_plan *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    out->src = *src;
    out->dst = *dst;
    if (ndim < 0 || ndim > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID, "reshard: tensor rank %d outside 0..%d", ndim,
                       MS_MAX_DIMS);
    ms_status st = ms_placements_validate(src, mesh->ndim, ndim, err);
    if (st != MS_OK) return ms_fail_wrap(err, st, "reshard source");
    st = ms_placements_validate(dst, mesh->ndim, ndim, err);
    if (st != MS_OK) return ms_fail_wrap(err, st, "reshard target");

    plan_input in = {.mesh = mesh, .ndim = ndim, .gshape = gshape};
    add_op(&in, src);
    add_op(&in, dst);
    search s = {0};
    bool added;
    int start = find_or_add(&s, encode(src), &added);
    s.nodes[start].dist = 0;
    heap_push(&s, 0, start);
    uint64_t goal = encode(dst);
    int found = -1;
    while (s.hn) {
        struct heap_item it = heap_pop(&s);
        node *nd = &s.nodes[it.idx];
        if (nd->done || it.dist > nd->dist) continue;
        nd->done = 1;
        if (nd->key == goal) {
            found = it.idx;
            break;
        }
        expand(&s, &in, it.idx);
    }
    if (found < 0) {
        free(s.nodes), free(s.table), free(s.heap);
        char a[128], b[128];
        return ms_fail(err, MS_ERR_INTERNAL, "reshard: no plan from %s to %s",
                       ms_placements_str(src, a, sizeof a), ms_placements_str(dst, b, sizeof b));
    }
    int path[MS_RESHARD_MAX_STEPS + 1], n = 0;
    for (int i = found; s.nodes[i].prev >= 0; i = s.nodes[i].prev) {
        if (n == MS_RESHARD_MAX_STEPS) {
            free(s.nodes), free(s.table), free(s.heap);
            return ms_fail(err, MS_ERR_INTERNAL, "reshard: plan longer than %d steps",
                           MS_RESHARD_MAX_STEPS);
        }
        path[n++] = i;
    }
    for (int k = 0; k < n; k++) {
        node *nd = &s.nodes[path[n - 1 - k]];
        ms_rstep *stp = &out->steps[k];
        stp->kind = (ms_rstep_kind)nd->kind;
        stp->mesh_dim = nd->mesh_dim;
        decode(s.nodes[nd->prev].key, mesh->ndim, &stp->before);
        decode(nd->key, mesh->ndim, &stp->after);
        step_bytes(stp, mesh, ndim, gshape);
        out->wire_bytes += stp->wire_bytes;
    }
    out->nsteps = n;
    free(s.nodes), free(s.table), free(s.heap);
    return MS_OK;
}

static void human_bytes(double b, char *buf, size_t len) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

void ms_reshard_plan_print(const ms_reshard_plan *plan, const ms_mesh *mesh, void *file) {
    FILE *f = file;
    if (plan->nsteps == 0) fprintf(f, "    (no steps: placements already match)\n");
    for (int k = 0; k < plan->nsteps; k++) {
        const ms_rstep *s = &plan->steps[k];
        char a[128], b[128], cb[32], wb[32];
        human_bytes(s->coll_bytes, cb, sizeof cb);
        human_bytes(s->wire_bytes, wb, sizeof wb);
        fprintf(f, "    %d. mesh dim %d (%s): %-14s %s -> %s", k + 1, s->mesh_dim,
                mesh->names[s->mesh_dim], ms_rstep_name(s->kind),
                ms_placements_str(&s->before, a, sizeof a),
                ms_placements_str(&s->after, b, sizeof b));
        if (s->coll_bytes > 0)
            fprintf(f, "  size %s, sent per rank %s", cb, wb);
        else
            fprintf(f, "  local");
        fprintf(f, "\n");
    }
}

/* --- plan cache ----------------------------------------------------------------------------- */

typedef struct cache_entry {
    int mesh_ndim, ndim;
    int mesh_shape[MS_MESH_MAX_DIMS];
    int64_t gshape[MS_MAX_DIMS];
    uint64_t src, dst;
    uint64_t hash;
    ms_reshard_plan *plan;
} cache_entry;

/* Open addressing on a hash of the whole key; plans depend on the mesh shape, not ids. */
struct ms_plan_cache {
    cache_entry *slots;
    int n, cap; /* cap is a power of two */
};

struct ms_plan_cache *ms_plan_cache_create(void) {
    return xcalloc(1, sizeof(struct ms_plan_cache));
}

void ms_plan_cache_destroy(struct ms_plan_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->cap; i++) free(c->slots[i].plan);
    free(c->slots);
    free(c);
}

static cache_entry make_key(const ms_mesh *mesh, const ms_placements *src, const ms_placements *dst,
                            int ndim, const int64_t *gshape) {
    cache_entry e = {.mesh_ndim = mesh->ndim, .ndim = ndim, .src = encode(src), .dst = encode(dst)};
    uint64_t h = mix(e.src * 31 + e.dst) ^ (uint64_t)ndim;
    for (int m = 0; m < mesh->ndim; m++) {
        e.mesh_shape[m] = mesh->shape[m];
        h = mix(h + (uint64_t)mesh->shape[m]);
    }
    for (int d = 0; d < ndim; d++) {
        e.gshape[d] = gshape[d];
        h = mix(h + (uint64_t)gshape[d]);
    }
    e.hash = h;
    return e;
}

static bool same_key(const cache_entry *a, const cache_entry *b) {
    return a->hash == b->hash && a->src == b->src && a->dst == b->dst && a->ndim == b->ndim &&
           a->mesh_ndim == b->mesh_ndim &&
           !memcmp(a->mesh_shape, b->mesh_shape, sizeof a->mesh_shape) &&
           !memcmp(a->gshape, b->gshape, sizeof a->gshape);
}

static cache_entry *cache_slot(cache_entry *slots, int cap, const cache_entry *key) {
    size_t i = key->hash & (size_t)(cap - 1);
    while (slots[i].plan && !same_key(&slots[i], key)) i = (i + 1) & (size_t)(cap - 1);
    return &slots[i];
}

ms_status ms_plan_cache_get(struct ms_plan_cache *c, const ms_mesh *mesh, const ms_placements *src,
                            const ms_placements *dst, int ndim, const int64_t *gshape,
                            const ms_reshard_plan **out, ms_error *err) {
    cache_entry key = make_key(mesh, src, dst, ndim, gshape);
    if (c->cap) {
        cache_entry *e = cache_slot(c->slots, c->cap, &key);
        if (e->plan) {
            *out = e->plan;
            return MS_OK;
        }
    }
    ms_reshard_plan *plan = xmalloc(sizeof *plan);
    ms_status st = ms_reshard_plan_make(mesh, src, dst, ndim, gshape, plan, err);
    if (st != MS_OK) {
        free(plan);
        return st;
    }
    if (2 * (c->n + 1) > c->cap) {
        int ncap = c->cap ? c->cap * 2 : 64;
        cache_entry *ns = xcalloc((size_t)ncap, sizeof *ns);
        for (int i = 0; i < c->cap; i++)
            if (c->slots[i].plan) *cache_slot(ns, ncap, &c->slots[i]) = c->slots[i];
        free(c->slots);
        c->slots = ns;
        c->cap = ncap;
    }
    key.plan = plan;
    *cache_slot(c->slots, c->cap, &key) = key;
    c->n++;
    *out = plan;
    return MS_OK;
}

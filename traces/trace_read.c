/* trace_read.c - Chrome trace files back into events and groups (see trace_read.h). */
#include "traces/trace_read.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/comm/comm.h"
#include "engine/core/hmap.h"
#include "engine/model/strategy.h"
#include "traces/trace_json.h"
#include "traces/trace_write.h"

#define MAX_GROUPS   65536
#define STEP_UNKNOWN INT64_MIN /* placeholder until the containing step slice is known */

/* The groups are indexed four ways, so that resolving an event's group costs the same with
 * 65536 groups as with 2 (a scan per event made large traces quadratic): each index maps a
 * key to the first group added with it, as the scans in file order did. */
typedef struct rctx {
    ms_trace *t;
    size_t cap;
    int gcap;
    char (*pg_names)[64]; /* Kineto's pg_name per group (a unique id there), for matching */
    int32_t next_id;      /* one more than the largest group id so far */
    const char *name;
    ms_hmap by_name;       /* pg_name */
    ms_hmap by_name_ranks; /* pg_name and the rank list */
    ms_hmap by_ranks;      /* the rank list */
    ms_hmap by_id;         /* the group id */
    bool nomem;            /* an index could not grow: the read fails */
} rctx;

static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

int ms_trace_coll_parse(const char *name) {
    static const struct {
        const char *name;
        int kind;
    } alias[] = {
        {"allreduce", MS_COLL_ALL_REDUCE},
        {"allreduce_coalesced", MS_COLL_ALL_REDUCE},
        {"allgather", MS_COLL_ALL_GATHER},
        {"_allgather_base", MS_COLL_ALL_GATHER},
        {"allgather_coalesced", MS_COLL_ALL_GATHER},
        {"all_gather_into_tensor", MS_COLL_ALL_GATHER},
        {"allgather_into_tensor_coalesced", MS_COLL_ALL_GATHER},
        {"_reduce_scatter_base", MS_COLL_REDUCE_SCATTER},
        {"reduce_scatter_tensor", MS_COLL_REDUCE_SCATTER},
        {"reduce_scatter_tensor_coalesced", MS_COLL_REDUCE_SCATTER},
        {"alltoall", MS_COLL_ALL_TO_ALL},
        {"alltoall_base", MS_COLL_ALL_TO_ALL},
        {"all_to_all_single", MS_COLL_ALL_TO_ALL},
        {"_broadcast_oop", MS_COLL_BROADCAST},
        {"send", MS_COLL_P2P},
        {"recv", MS_COLL_P2P},
        {"recvanysource", MS_COLL_P2P},
        {"batch_isend_irecv", MS_COLL_P2P},
    };
    if (!name) return -1;
    if (!strncasecmp(name, "nccl:", 5)) name += 5;
    for (int k = 0; k < MS_COLL_KIND_COUNT; k++)
        if (!strcasecmp(name, ms_coll_name((ms_coll_kind)k))) return k;
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (!strcasecmp(name, alias[i].name)) return alias[i].kind;
    return -1;
}

static int reduce_parse(const char *s) {
    for (int r = 0; s && r < MS_REDUCE_COUNT; r++)
        if (!strcasecmp(s, ms_reduce_op_name((ms_reduce_op)r))) return r;
    return MS_REDUCE_SUM;
}

static size_t dtype_size(const char *s) {
    if (!s) return 4;
    static const struct {
        const char *name;
        size_t size;
    } t[] = {{"float", 4},  {"float32", 4}, {"bfloat16", 2}, {"half", 2},  {"float16", 2},
             {"double", 8}, {"float64", 8}, {"int", 4},      {"int32", 4}, {"long", 8},
             {"int64", 8},  {"byte", 1},    {"char", 1},     {"bool", 1},  {"uint8", 1},
             {"int8", 1},   {"short", 2},   {"int16", 2}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcasecmp(s, t[i].name)) return t[i].size;
    return 4;
}

/* --- groups ---------------------------------------------------------------------------- */

/* Ranks from an array of integers or from Kineto's string form "[0, 1, 2]". */
static int parse_ranks(const tj_doc *d, int node, int32_t *out) {
    int n = 0;
    if (tj_type_of(d, node) == TJ_ARR) {
        for (int c = tj_first(d, node); c >= 0; c = tj_next(d, c)) {
            int64_t v;
            if (!tj_int(d, c, INT32_MIN, INT32_MAX, &v)) continue;
            if (n < MS_EV_GROUP_MAX) out[n] = (int32_t)v;
            n++;
        }
    } else if (tj_str(d, node)) {
        const char *s = tj_str(d, node);
        while (*s) {
            if ((*s >= '0' && *s <= '9') || *s == '-') {
                char *end;
                long v = strtol(s, &end, 10);
                if (end == s) {
                    s++;
                    continue;
                }
                if (n < MS_EV_GROUP_MAX)
                    out[n] = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v);
                n++;
                s = end;
            } else {
                s++;
            }
        }
    }
    return n;
}

static int listed(int32_t size) {
    return size < 0 ? 0 : size < MS_EV_GROUP_MAX ? size : MS_EV_GROUP_MAX;
}

static bool ranks_equal(const ms_group *g, const int32_t *ranks, int n) {
    if (g->size != n) return false;
    return !memcmp(g->ranks, ranks, sizeof *ranks * (size_t)listed(n));
}

/* --- the group indexes ------------------------------------------------------------------ */

/* What a lookup compares: the fields that are set (pg NULL: not the name). */
typedef struct group_key {
    const rctx *r;
    const char *pg;
    const int32_t *ranks;
    int n;
    int32_t id;
} group_key;

static bool eq_name(const void *ctx, uint32_t i) {
    const group_key *k = ctx;
    return !strcmp(k->r->pg_names[i], k->pg);
}

static bool eq_ranks(const void *ctx, uint32_t i) {
    const group_key *k = ctx;
    return ranks_equal(&k->r->t->groups[i], k->ranks, k->n);
}

static bool eq_name_ranks(const void *ctx, uint32_t i) {
    return eq_name(ctx, i) && eq_ranks(ctx, i);
}

static bool eq_id(const void *ctx, uint32_t i) {
    const group_key *k = ctx;
    return k->r->t->groups[i].id == k->id;
}

static uint64_t name_hash(const char *pg) {
    return ms_hash_bytes(MS_HASH_SEED, pg, strlen(pg));
}

/* Over what ranks_equal compares: the size and the listed ranks. */
static uint64_t ranks_hash(uint64_t h, const int32_t *ranks, int n) {
    h = ms_hash_bytes(h, &n, sizeof n);
    return ms_hash_bytes(h, ranks, sizeof *ranks * (size_t)listed(n));
}

/* The first group added with key k, or -1. */
static int find_group(ms_hmap *m, uint64_t h, ms_hmap_eq eq, const group_key *k) {
    uint32_t i;
    return ms_hmap_find(m, ms_hash_mix(h), eq, k, &i) ? (int)i : -1;
}

/* Indexes group i under k unless an earlier group has that key (lookups find the first). */
static bool index_first(ms_hmap *m, uint64_t h, ms_hmap_eq eq, const group_key *k, int i) {
    return find_group(m, h, eq, k) >= 0 || ms_hmap_add(m, ms_hash_mix(h), (uint32_t)i);
}

static bool index_group(rctx *r, int i) {
    const ms_group *g = &r->t->groups[i];
    group_key k = {.r = r, .pg = r->pg_names[i], .ranks = g->ranks, .n = g->size, .id = g->id};
    uint64_t hn = name_hash(k.pg);
    return index_first(&r->by_name, hn, eq_name, &k, i) &&
           index_first(&r->by_name_ranks, ranks_hash(hn, k.ranks, k.n), eq_name_ranks, &k, i) &&
           index_first(&r->by_ranks, ranks_hash(MS_HASH_SEED, k.ranks, k.n), eq_ranks, &k, i) &&
           index_first(&r->by_id, (uint64_t)(uint32_t)g->id, eq_id, &k, i);
}

static const ms_group *group_by_id(rctx *r, int32_t id) {
    group_key k = {.r = r, .id = id};
    int i = find_group(&r->by_id, (uint64_t)(uint32_t)id, eq_id, &k);
    return i < 0 ? NULL : &r->t->groups[i];
}

static void indexes_free(rctx *r) {
    ms_hmap *m[] = {&r->by_name, &r->by_name_ranks, &r->by_ranks, &r->by_id};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        r->t->n_group_lookups += m[i]->lookups;
        r->t->n_group_probes += m[i]->probes;
        ms_hmap_free(m[i]);
    }
}

/* --- adding and resolving groups ------------------------------------------------------ */

/* Adds a group; returns its index or -1 (table full, or out of memory: such collectives just
 * lose their group, the trace still reads; an index that cannot grow fails the read). */
static int add_group(rctx *r, const ms_group *g, const char *pg_name) {
    ms_trace *t = r->t;
    if (t->n_groups >= MAX_GROUPS) return -1;
    if (t->n_groups == r->gcap) {
        int cap = r->gcap ? r->gcap * 2 : 16;
        ms_group *ng = realloc(t->groups, sizeof *ng * (size_t)cap);
        if (!ng) return -1;
        t->groups = ng;
        char(*nn)[64] = realloc(r->pg_names, sizeof *nn * (size_t)cap);
        if (!nn) return -1;
        r->pg_names = nn;
        r->gcap = cap;
    }
    t->groups[t->n_groups] = *g;
    if (g->id >= r->next_id) r->next_id = g->id < INT32_MAX ? g->id + 1 : INT32_MAX;
    copy_str(r->pg_names[t->n_groups], sizeof r->pg_names[0], pg_name);
    if (!index_group(r, t->n_groups)) r->nomem = true;
    return t->n_groups++;
}

static void read_pg_config(rctx *r, const tj_doc *d, int arr) {
    for (int c = tj_first(d, arr); c >= 0; c = tj_next(d, c)) {
        if (tj_type_of(d, c) != TJ_OBJ) continue;
        ms_group g = {0};
        int n = parse_ranks(d, tj_get(d, c, "ranks"), g.ranks);
        int64_t v;
        g.size = tj_int(d, tj_get(d, c, "pg_size"), 0, INT32_MAX, &v) ? (int32_t)v : n;
        const char *pg_name = tj_str(d, tj_get(d, c, "pg_name"));
        const char *desc = tj_str(d, tj_get(d, c, "pg_desc"));
        if (tj_int(d, tj_get(d, c, "pg_id"), INT32_MIN, INT32_MAX, &v)) {
            g.id = (int32_t)v; /* meshscope's own: pg_name is the group's name */
            copy_str(g.name, sizeof g.name, pg_name);
        } else {
            /* Kineto: pg_name is an id ("0"), pg_desc the readable name ("default_pg"). */
            g.id = r->next_id;
            copy_str(g.name, sizeof g.name,
                     desc && *desc && strcmp(desc, "undefined") ? desc : pg_name);
        }
        add_group(r, &g, pg_name ? pg_name : "");
    }
}

/* The group of a foreign collective: by Kineto's pg_name (and its ranks, when given), else by
 * its ranks, else a new one. */
static int32_t resolve_group(rctx *r, const tj_doc *d, int args) {
    const char *pg = tj_str(d, tj_get(d, args, "Process Group Name"));
    int32_t ranks[MS_EV_GROUP_MAX];
    int n = parse_ranks(d, tj_get(d, args, "Process Group Ranks"), ranks);
    group_key k = {.r = r, .pg = pg, .ranks = ranks, .n = n};
    int i = -1;
    if (pg) {
        uint64_t hn = name_hash(pg);
        i = n == 0 ? find_group(&r->by_name, hn, eq_name, &k)
                   : find_group(&r->by_name_ranks, ranks_hash(hn, ranks, n), eq_name_ranks, &k);
    }
    if (i < 0 && n == 0) return -1;
    if (i < 0) i = find_group(&r->by_ranks, ranks_hash(MS_HASH_SEED, ranks, n), eq_ranks, &k);
    if (i >= 0) return r->t->groups[i].id;
    ms_group g = {.id = r->next_id, .size = n};
    memcpy(g.ranks, ranks, sizeof *ranks * (size_t)listed(n));
    copy_str(g.name, sizeof g.name, pg && *pg ? pg : "pg");
    i = add_group(r, &g, pg ? pg : "");
    return i < 0 ? -1 : g.id;
}

/* --- events ---------------------------------------------------------------------------- */

static bool want_meta(void *user, const char *key) {
    (void)user;
    return !strcmp(key, "meshscope") || !strcmp(key, "distributedInfo") ||
           !strcmp(key, "baseTimeNanoseconds");
}

static ms_status on_meta(void *user, const char *key, const tj_doc *d, int root, ms_error *err) {
    (void)err;
    rctx *r = user;
    ms_trace *t = r->t;
    int64_t v;
    if (!strcmp(key, "meshscope")) {
        t->meshscope = tj_type_of(d, root) == TJ_OBJ;
    } else if (!strcmp(key, "baseTimeNanoseconds")) {
        if (tj_int(d, root, INT64_MIN, INT64_MAX, &v)) t->base_ns = v;
    } else if (tj_type_of(d, root) == TJ_OBJ) { /* distributedInfo */
        copy_str(t->backend, sizeof t->backend, tj_str(d, tj_get(d, root, "backend")));
        if (tj_int(d, tj_get(d, root, "rank"), 0, INT32_MAX, &v)) t->rank = (int)v;
        if (tj_int(d, tj_get(d, root, "world_size"), 0, INT32_MAX, &v)) t->world_size = (int)v;
        read_pg_config(r, d, tj_get(d, root, "pg_config"));
    }
    return MS_OK;
}

static ms_event *new_event(rctx *r, ms_error *err) {
    ms_trace *t = r->t;
    if (t->n_events == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        ms_event *ne = realloc(t->events, cap * sizeof *ne);
        if (!ne) {
            ms_fail(err, MS_ERR_NOMEM, "%s: out of memory after %zu events", r->name, t->n_events);
            return NULL;
        }
        t->events = ne;
        r->cap = cap;
    }
    ms_event *e = &t->events[t->n_events];
    memset(e, 0, sizeof *e);
    return e;
}

static int64_t arg_i64(const tj_doc *d, int args, const char *key, int64_t lo, int64_t hi,
                       int64_t dflt) {
    int64_t v;
    return tj_int(d, tj_get(d, args, key), lo, hi, &v) ? v : dflt;
}

/* A double arg: missing -> 0, null (a non-finite value when written) -> NaN. */
static double arg_double(const tj_doc *d, int args, const char *key) {
    int node = tj_get(d, args, key);
    if (tj_type_of(d, node) == TJ_NULL) return NAN;
    double v = tj_num(d, node);
    return isnan(v) ? 0.0 : v;
}

/* A count (FLOPs, bytes): a negative or infinite value is no count at all, so it reads as
 * unknown (NaN, as null does) rather than reaching totals and views. */
static double arg_count(const tj_doc *d, int args, const char *key) {
    double v = arg_double(d, args, key);
    return v >= 0 && isfinite(v) ? v : NAN;
}

static void step_phase(ms_event *e, const tj_doc *d, int args, bool infer_step) {
    e->step = arg_i64(d, args, "step", INT64_MIN + 1, INT64_MAX, infer_step ? STEP_UNKNOWN : -1);
    int ph = ms_trace_phase_parse(tj_str(d, tj_get(d, args, "phase")));
    e->phase = (uint8_t)(ph < 0 ? MS_PHASE_OTHER : ph);
}

static bool starts_with(const char *s, const char *prefix) {
    return s && !strncmp(s, prefix, strlen(prefix));
}

/* The GPU activity a category names (the writer's put_gpu_event), or MS_GPU_NONE. */
static ms_ev_gpu gpu_kind(const char *cat) {
    if (!cat) return MS_GPU_NONE;
    if (!strcmp(cat, "kernel")) return MS_GPU_KERNEL;
    if (!strcmp(cat, "gpu_memcpy")) return MS_GPU_MEMCPY;
    if (!strcmp(cat, "gpu_memset")) return MS_GPU_MEMSET;
    if (!strcmp(cat, "cuda_runtime") || !strcmp(cat, "cuda_driver")) return MS_GPU_API;
    return MS_GPU_NONE;
}

/* The kind an X event becomes, or -1 to ignore it. */
static int x_kind(const rctx *r, const char *cat, const char *name, const tj_doc *d, int args) {
    if (r->t->meshscope) {
        if (!cat) return -1;
        if (!strcmp(cat, "user_annotation"))
            return starts_with(name, "ProfilerStep#") ? MS_EV_STEP : -1;
        if (!strcmp(cat, "cpu_op") || gpu_kind(cat) != MS_GPU_NONE) return MS_EV_OP;
        if (!strcmp(cat, "data")) return MS_EV_DATA;
        if (!strcmp(cat, "optimizer")) return MS_EV_OPTIM;
        if (!strcmp(cat, "comm")) return MS_EV_COLL;
        if (!strcmp(cat, "reshard")) return MS_EV_RESHARD;
        if (!strcmp(cat, "pipeline")) return MS_EV_PIPE;
        if (!strcmp(cat, "nccl")) return MS_EV_NCCL;
        return -1;
    }
    /* Kineto also marks steps on the GPU timeline (gpu_user_annotation) and records each
     * collective on the CPU side (cpu_op record_param_comms) as well as as a GPU kernel:
     * take one of each so nothing is counted twice. */
    if (starts_with(name, "ProfilerStep#"))
        return cat && !strcmp(cat, "gpu_user_annotation") ? -1 : MS_EV_STEP;
    bool cpu = cat && !strcmp(cat, "cpu_op");
    if (tj_get(d, args, "Collective name") >= 0) return cpu ? -1 : MS_EV_COLL;
    if (cat && !strcmp(cat, "kernel") && !(name && strstr(name, "nccl"))) return MS_EV_OP;
    return -1;
}

static bool read_coll(rctx *r, ms_event *e, const tj_doc *d, int args) {
    ms_ev_coll *c = &e->u.coll;
    const char *name = tj_str(d, tj_get(d, args, "Collective name"));
    int kind = ms_trace_coll_parse(name);
    if (kind < 0) return false;
    c->coll = (uint8_t)kind;
    c->recv = name && (!strcasecmp(name, "recv") || !strcasecmp(name, "recvanysource") ||
                       !strcasecmp(name, "nccl:recv"));
    c->reduce = (uint8_t)reduce_parse(tj_str(d, tj_get(d, args, "reduce")));
    c->mesh_dim = (int16_t)arg_i64(d, args, "mesh dim", INT16_MIN, INT16_MAX, -1);
    int64_t v;
    if (tj_int(d, tj_get(d, args, "group id"), INT32_MIN, INT32_MAX, &v))
        c->group = (int32_t)v;
    else
        c->group = resolve_group(r, d, args);
    c->group_size = (int32_t)arg_i64(d, args, "Group size", 0, INT32_MAX, 0);
    c->group_rank = (int32_t)arg_i64(d, args, "group rank", INT32_MIN, INT32_MAX, -1);
    c->root = (int32_t)arg_i64(d, args, "root", 0, INT32_MAX, 0); /* broadcast: position */
    c->seq = arg_i64(d, args, "seq", INT64_MIN, INT64_MAX,
                     arg_i64(d, args, "Seq", INT64_MIN, INT64_MAX, 0));
    size_t elt = dtype_size(tj_str(d, tj_get(d, args, "dtype")));
    c->dtype = elt == 2 ? MS_COMM_BF16 : elt == 1 ? MS_COMM_BYTES : MS_COMM_F32;
    if (tj_int(d, tj_get(d, args, "bytes"), 0, INT64_MAX, &v)) {
        c->bytes = (uint64_t)v;
    } else {
        int64_t in = arg_i64(d, args, "In msg nelems", 0, INT64_MAX, 0);
        int64_t out = arg_i64(d, args, "Out msg nelems", 0, INT64_MAX, 0);
        int64_t n = kind == MS_COLL_ALL_GATHER       ? out
                    : kind == MS_COLL_REDUCE_SCATTER ? in
                    : in > out                       ? in
                                                     : out;
        int64_t b;
        c->bytes = __builtin_mul_overflow(n, (int64_t)elt, &b) ? 0 : (uint64_t)b;
    }
    copy_str(c->algo, sizeof c->algo, tj_str(d, tj_get(d, args, "algorithm")));
    c->flow = (uint64_t)arg_i64(d, args, "flow", 0, INT64_MAX, 0);
    c->async = arg_i64(d, args, "async", 0, 1, 0) != 0;
    c->queued_ns = c->async ? arg_i64(d, args, "queued ns", 0, INT64_MAX, 0) : 0;
    return true;
}

/* A pipeline slice's args; false (the slice is skipped) without a known action. */
static bool read_pipe(ms_event *e, const tj_doc *d, int args) {
    ms_ev_pipe *p = &e->u.pipe;
    int action = ms_trace_pipe_action_parse(tj_str(d, tj_get(d, args, "action")));
    if (action < 0) return false;
    p->action = (uint8_t)action;
    p->chunk = (uint8_t)arg_i64(d, args, "chunk", 0, UINT8_MAX, 0);
    p->stage = (int16_t)arg_i64(d, args, "stage", INT16_MIN, INT16_MAX, 0);
    p->mb = (int32_t)arg_i64(d, args, "micro-batch", INT32_MIN, INT32_MAX, 0);
    p->model_chunk = (int32_t)arg_i64(d, args, "model chunk", INT32_MIN, INT32_MAX, 0);
    p->stages = (int16_t)arg_i64(d, args, "stages", INT16_MIN, INT16_MAX, 1);
    p->virtual_stages = (int16_t)arg_i64(d, args, "virtual stages", INT16_MIN, INT16_MAX, 1);
    p->micro_batches = (int32_t)arg_i64(d, args, "micro-batches", INT32_MIN, INT32_MAX, 1);
    copy_str(p->schedule, sizeof p->schedule, tj_str(d, tj_get(d, args, "schedule")));
    p->cpu_ns = arg_i64(d, args, "cpu ns", 0, INT64_MAX, 0);
    return true;
}

/* NCCL's view of a call (trace_write's put_nccl_event); host times come back absolute. */
static void read_nccl(ms_event *e, const tj_doc *d, int args) {
    ms_ev_nccl *c = &e->u.nccl;
    copy_str(c->func, sizeof c->func, tj_str(d, tj_get(d, args, "func")));
    copy_str(c->algo, sizeof c->algo, tj_str(d, tj_get(d, args, "algorithm")));
    copy_str(c->proto, sizeof c->proto, tj_str(d, tj_get(d, args, "protocol")));
    copy_str(c->dtype, sizeof c->dtype, tj_str(d, tj_get(d, args, "dtype")));
    c->channels = (int16_t)arg_i64(d, args, "channels", 0, INT16_MAX, 0);
    c->count = (uint64_t)arg_i64(d, args, "count", 0, INT64_MAX, 0);
    c->peer = (int32_t)arg_i64(d, args, "peer", INT32_MIN, INT32_MAX, -1);
    c->seq = (uint64_t)arg_i64(d, args, "seq", 0, INT64_MAX, 0);
    const char *p2p = tj_str(d, tj_get(d, args, "p2p"));
    c->p2p = p2p != NULL;
    c->is_send = p2p && !strcmp(p2p, "send");
    int timing = ms_trace_nccl_timing_parse(tj_str(d, tj_get(d, args, "timing")));
    if (timing >= 0) c->timing = (uint8_t)timing;
    const char *id = tj_str(d, tj_get(d, args, "comm id"));
    c->comm_id = id ? strtoull(id, NULL, 16) : 0;
    c->comm_rank = (int32_t)arg_i64(d, args, "comm rank", INT32_MIN, INT32_MAX, 0);
    c->nranks = (int32_t)arg_i64(d, args, "nranks", INT32_MIN, INT32_MAX, 0);
    c->enqueued_ns = arg_i64(d, args, "enqueued ns", INT64_MIN, INT64_MAX, 0);
    c->gpu_t0 = (uint64_t)arg_i64(d, args, "gpu start ns", 0, INT64_MAX, 0);
    c->gpu_t1 = (uint64_t)arg_i64(d, args, "gpu end ns", 0, INT64_MAX, 0);
    int64_t h0, h1;
    if (tj_scaled(d, tj_get(d, args, "host start us"), 3, &h0, NULL) &&
        tj_scaled(d, tj_get(d, args, "host end us"), 3, &h1, NULL)) {
        c->host_t0 = h0; /* relative, like t0/t1, until finish adds the base */
        c->host_t1 = h1;
    }
    c->linked = arg_i64(d, args, "linked", 0, 1, 0) == 1;
    c->ms_group = (int32_t)arg_i64(d, args, "ms group id", INT32_MIN, INT32_MAX, -1);
    c->ms_seq = arg_i64(d, args, "ms seq", INT64_MIN, INT64_MAX, -1);
    const int coll = ms_trace_coll_parse(tj_str(d, tj_get(d, args, "collective")));
    c->coll = coll < 0 ? UINT8_MAX : (uint8_t)coll;
}

static ms_status handle_x(rctx *r, const tj_doc *d, int root, ms_error *err) {
    ms_trace *t = r->t;
    int64_t ts, dur, pid = 0, t1;
    if (!tj_scaled(d, tj_get(d, root, "ts"), 3, &ts, NULL) ||
        !tj_scaled(d, tj_get(d, root, "dur"), 3, &dur, NULL) || dur < 0 ||
        __builtin_add_overflow(ts, dur, &t1))
        return MS_OK;
    if (t->meshscope && !tj_int(d, tj_get(d, root, "pid"), INT32_MIN, INT32_MAX, &pid))
        return MS_OK;
    const char *cat = tj_str(d, tj_get(d, root, "cat"));
    const char *name = tj_str(d, tj_get(d, root, "name"));
    int args = tj_get(d, root, "args");
    if (tj_type_of(d, args) != TJ_OBJ) args = -1;
    int kind = x_kind(r, cat, name, d, args);
    if (kind < 0) return MS_OK;
    ms_event *e = new_event(r, err);
    if (!e) return MS_ERR_NOMEM;
    e->kind = (uint8_t)kind;
    e->rank = (int32_t)pid;
    e->t0_ns = ts;
    e->t1_ns = t1;
    bool infer = !t->meshscope;
    switch (kind) {
        case MS_EV_STEP: {
            char *end;
            long long s = strtoll(name + strlen("ProfilerStep#"), &end, 10);
            if (end == name + strlen("ProfilerStep#") || *end) return MS_OK;
            step_phase(e, d, args, false);
            e->step = s;
            break;
        }
        case MS_EV_OP:
        case MS_EV_DATA:
        case MS_EV_OPTIM: {
            ms_ev_op *op = &e->u.op;
            int node = tj_get(d, args, "node");
            copy_str(op->name, sizeof op->name, node >= 0 ? tj_str(d, node) : name);
            copy_str(op->opname, sizeof op->opname,
                     t->meshscope ? tj_str(d, tj_get(d, args, "op")) : "kernel");
            op->op = (int32_t)arg_i64(d, args, "op id", INT32_MIN, INT32_MAX, -1);
            op->flops = arg_count(d, args, "flops");
            op->bytes = arg_count(d, args, "bytes");
            if (kind == MS_EV_OPTIM) op->host_optim = arg_i64(d, args, "host", 0, 1, 0) == 1;
            if (t->meshscope && kind == MS_EV_OP) {
                op->gpu = (uint8_t)gpu_kind(cat);
                op->corr = (uint64_t)arg_i64(d, args, "correlation", 0, INT64_MAX, 0);
                op->device = (uint32_t)arg_i64(d, args, "device", 0, UINT32_MAX, 0);
                op->stream = (uint32_t)arg_i64(d, args, "stream", 0, UINT32_MAX, 0);
            }
            step_phase(e, d, args, infer);
            break;
        }
        case MS_EV_COLL:
            if (!read_coll(r, e, d, args)) return MS_OK;
            step_phase(e, d, args, infer);
            break;
        case MS_EV_PIPE:
            if (!read_pipe(e, d, args)) return MS_OK;
            step_phase(e, d, args, infer);
            break;
        case MS_EV_NCCL:
            read_nccl(e, d, args);
            step_phase(e, d, args, infer);
            break;
        default: { /* MS_EV_RESHARD */
            ms_ev_reshard *rs = &e->u.reshard;
            copy_str(rs->tensor, sizeof rs->tensor, tj_str(d, tj_get(d, args, "tensor")));
            copy_str(rs->from, sizeof rs->from, tj_str(d, tj_get(d, args, "from")));
            copy_str(rs->to, sizeof rs->to, tj_str(d, tj_get(d, args, "to")));
            rs->bytes = (uint64_t)arg_i64(d, args, "bytes", 0, INT64_MAX, 0);
            rs->nsteps = (int32_t)arg_i64(d, args, "steps", INT32_MIN, INT32_MAX, 0);
            rs->flow = (uint64_t)arg_i64(d, args, "flow", 0, INT64_MAX, 0);
            step_phase(e, d, args, infer);
            break;
        }
    }
    t->n_events++;
    return MS_OK;
}

/* MiB with up to 7 decimals back to bytes, rounded (trace_write's put_mib is the inverse). */
static bool mib_bytes(const tj_doc *d, int node, uint64_t *out) {
    int64_t v;
    if (!tj_scaled(d, node, 7, &v, NULL) || v < 0) return false;
    unsigned __int128 b = ((unsigned __int128)(uint64_t)v << 20) + 5000000u;
    b /= 10000000u;
    if (b > UINT64_MAX) return false;
    *out = (uint64_t)b;
    return true;
}

static ms_status handle_counter(rctx *r, const tj_doc *d, int root, ms_error *err) {
    ms_trace *t = r->t;
    const char *name = tj_str(d, tj_get(d, root, "name"));
    int64_t ts, pid;
    int args = tj_get(d, root, "args");
    uint64_t in_use, peak;
    if (!t->meshscope || !name || strcmp(name, "memory") ||
        !tj_scaled(d, tj_get(d, root, "ts"), 3, &ts, NULL) ||
        !tj_int(d, tj_get(d, root, "pid"), INT32_MIN, INT32_MAX, &pid) ||
        !mib_bytes(d, tj_get(d, args, "in_use_MiB"), &in_use) ||
        !mib_bytes(d, tj_get(d, args, "peak_MiB"), &peak))
        return MS_OK;
    ms_event *e = new_event(r, err);
    if (!e) return MS_ERR_NOMEM;
    e->kind = MS_EV_MEM;
    e->phase = MS_PHASE_OTHER;
    e->rank = (int32_t)pid;
    e->step = STEP_UNKNOWN;
    e->t0_ns = e->t1_ns = ts;
    e->u.mem.in_use = in_use;
    e->u.mem.peak = peak;
    /* the training state's split, when the sample has one */
    const char *split[5] = {"params_MiB", "grads_MiB", "optimizer_MiB", "activations_MiB",
                            "host_optimizer_MiB"};
    uint64_t *to[5] = {&e->u.mem.params, &e->u.mem.grads, &e->u.mem.optim, &e->u.mem.acts,
                       &e->u.mem.host_optim};
    for (int k = 0; k < 5; k++)
        if (!mib_bytes(d, tj_get(d, args, split[k]), to[k])) *to[k] = 0;
    t->n_events++;
    return MS_OK;
}

static ms_status on_event(void *user, size_t index, uint64_t off, const tj_doc *d, int root,
                          ms_error *err) {
    (void)off;
    rctx *r = user;
    ms_trace *t = r->t;
    t->n_trace_events = index + 1;
    size_t before = t->n_events;
    ms_status st = MS_OK;
    const char *ph = tj_str(d, tj_get(d, root, "ph"));
    if (ph && !strcmp(ph, "X"))
        st = handle_x(r, d, root, err);
    else if (ph && !strcmp(ph, "C"))
        st = handle_counter(r, d, root, err);
    if (t->n_events == before) t->n_ignored++;
    return st;
}

/* --- finishing ------------------------------------------------------------------------- */

typedef struct step_span {
    int32_t rank;
    int64_t t0, t1, step;
} step_span;

static int cmp_span(const void *a, const void *b) {
    const step_span *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* Events without a step take the step of the rank's ProfilerStep slice containing their
 * start (end inclusive; the later slice wins where two touch), or -1. */
static ms_status infer_steps(ms_trace *t, ms_error *err) {
    size_t ns = 0, nu = 0;
    for (size_t i = 0; i < t->n_events; i++) {
        ns += t->events[i].kind == MS_EV_STEP;
        nu += t->events[i].step == STEP_UNKNOWN;
    }
    if (!nu) return MS_OK;
    step_span *sp = malloc(sizeof *sp * (ns ? ns : 1));
    if (!sp) return ms_fail(err, MS_ERR_NOMEM, "out of memory indexing steps");
    size_t k = 0;
    for (size_t i = 0; i < t->n_events; i++) {
        const ms_event *e = &t->events[i];
        if (e->kind == MS_EV_STEP)
            sp[k++] = (step_span){.rank = e->rank, .t0 = e->t0_ns, .t1 = e->t1_ns, .step = e->step};
    }
    qsort(sp, ns, sizeof *sp, cmp_span);
    for (size_t i = 0; i < t->n_events; i++) {
        ms_event *e = &t->events[i];
        if (e->step != STEP_UNKNOWN) continue;
        size_t lo = 0, hi = ns; /* first span after (rank, t0) */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (sp[mid].rank < e->rank || (sp[mid].rank == e->rank && sp[mid].t0 <= e->t0_ns))
                lo = mid + 1;
            else
                hi = mid;
        }
        e->step = -1;
        if (lo > 0 && sp[lo - 1].rank == e->rank && e->t0_ns <= sp[lo - 1].t1)
            e->step = sp[lo - 1].step;
    }
    free(sp);
    return MS_OK;
}

static ms_status finish(rctx *r, ms_error *err) {
    ms_trace *t = r->t;
    for (size_t i = 0; i < t->n_events; i++) {
        ms_event *e = &t->events[i];
        if (!t->meshscope) e->rank = t->rank;
        if (__builtin_add_overflow(e->t0_ns, t->base_ns, &e->t0_ns) ||
            __builtin_add_overflow(e->t1_ns, t->base_ns, &e->t1_ns))
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: baseTimeNanoseconds plus the times of event %zu overflow 64 bits",
                           r->name, i);
        if (e->kind == MS_EV_NCCL && e->u.nccl.host_t1) {
            e->u.nccl.host_t0 += t->base_ns;
            e->u.nccl.host_t1 += t->base_ns;
        }
        if (e->kind == MS_EV_COLL && e->u.coll.group_rank < 0) {
            e->u.coll.group_rank = 0;
            const ms_group *gr = group_by_id(r, e->u.coll.group);
            for (int k = 0; gr && k < listed(gr->size); k++)
                if (gr->ranks[k] == e->rank) e->u.coll.group_rank = k;
        }
    }
    return infer_steps(t, err);
}

static ms_status read_src(tj_src *s, ms_trace *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    rctx r = {.t = out, .name = s->name};
    tj_handler h = {.user = &r, .want_meta = want_meta, .meta = on_meta, .event = on_event};
    ms_status st = tj_scan_trace(s, &h, err);
    if (st == MS_OK && r.nomem)
        st = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory indexing %d groups", s->name,
                     out->n_groups);
    if (st == MS_OK) st = finish(&r, err);
    indexes_free(&r);
    free(r.pg_names);
    if (st != MS_OK) ms_trace_free(out);
    return st;
}

ms_status ms_trace_read(const char *path, ms_trace *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    tj_src s;
    MS_CHECK(tj_src_open(&s, path, err));
    ms_status st = read_src(&s, out, err);
    tj_src_close(&s);
    return st;
}

ms_status ms_trace_read_mem(const void *data, size_t len, const char *name, ms_trace *out,
                            ms_error *err) {
    tj_src s;
    tj_src_mem(&s, data, len, name ? name : "trace");
    return read_src(&s, out, err);
}

void ms_trace_free(ms_trace *t) {
    if (!t) return;
    free(t->events);
    free(t->groups);
    memset(t, 0, sizeof *t);
}

void ms_trace_strategy_text(const ms_trace *t, char *out, size_t cap) {
    size_t len = 0;
    out[0] = '\0';
    for (int k = 0; k < MS_SET_COUNT && len + 1 < cap; k++) {
        const ms_setting *st = &ms_settings[k];
        if (st->kind != MS_SET_KIND_DEGREE) continue;
        for (int i = 0; i < t->n_groups; i++) {
            const ms_group *g = &t->groups[i];
            if (g->size < 1 || strncmp(g->name, st->name, sizeof g->name) ||
                strlen(st->name) >= sizeof g->name)
                continue;
            int w =
                snprintf(out + len, cap - len, "%s%s%d", len ? " x " : "", st->name, (int)g->size);
            if (w > 0) len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
            break;
        }
    }
    if (!len) snprintf(out, cap, "trace");
}

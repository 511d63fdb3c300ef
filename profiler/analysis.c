/* analysis.c - heatmaps, overlap, bus bandwidth, breakdowns and stragglers from events
 * (see analysis.h for the definitions).
 *
 * Time arithmetic is on interval unions per rank: each rank's op intervals and collective
 * intervals are sorted and merged once, their intersection computed once, and each union
 * keeps prefix sums so that "how much of it lies in [lo, hi)" (one step) is two binary
 * searches. Everything else is sort-and-aggregate over copies of the event keys.
 */
#include "profiler/analysis.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/core/xalloc.h"
#include "engine/model/strategy.h"
#include "engine/pipeline/simulate.h"

/* --- bytes per peer ------------------------------------------------------------------- */

void ms_bytes_per_peer(const ms_ev_coll *c, double *out) {
    const int n = c->group_size, me = c->group_rank;
    for (int p = 0; p < n; p++) out[p] = 0.0;
    if (n <= 1 || me < 0 || me >= n || c->recv) return; /* the sender's event counts it */
    const double b = (double)c->bytes;
    const bool ring = !strncmp(c->algo, "ring", 4);
    const int next = (me + 1) % n;
    switch ((ms_coll_kind)c->coll) {
        case MS_COLL_ALL_REDUCE:
            if (ring)
                out[next] = 2.0 * (n - 1) / n * b;
            else
                for (int p = 0; p < n; p++) out[p] = p == me ? 0.0 : 2.0 * b / n;
            break;
        case MS_COLL_REDUCE_SCATTER:
        case MS_COLL_ALL_GATHER:
            if (ring)
                out[next] = (double)(n - 1) / n * b;
            else
                for (int p = 0; p < n; p++) out[p] = p == me ? 0.0 : b / n;
            break;
        case MS_COLL_ALL_TO_ALL:
            for (int p = 0; p < n; p++) out[p] = p == me ? 0.0 : b / n;
            break;
        case MS_COLL_BROADCAST: {
            const int root = c->root >= 0 && c->root < n ? c->root : 0;
            if (ring) {
                if (next != root) out[next] = b; /* the chain ends at the rank before root */
            } else if (me == root) {
                for (int p = 0; p < n; p++) out[p] = p == me ? 0.0 : b;
            }
            break;
        }
        case MS_COLL_P2P:
            if (n == 2)
                out[1 - me] = b;
            else
                for (int p = 0; p < n; p++) out[p] = p == me ? 0.0 : b / (n - 1);
            break;
        default: /* barrier, split: no payload */
            break;
    }
}

/* --- interval unions ------------------------------------------------------------------ */

typedef struct iv {
    int64_t a, b; /* [a, b) */
} iv;

typedef struct ivset {
    iv *v;        /* sorted, disjoint, non-empty */
    int64_t *cum; /* cum[i] = total length of v[0..i) */
    size_t n;
} ivset;

static int iv_cmp(const void *x, const void *y) {
    const iv *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

static void ivset_sums(ivset *s) {
    s->cum = xmalloc(sizeof(int64_t) * (s->n + 1));
    s->cum[0] = 0;
    for (size_t i = 0; i < s->n; i++) s->cum[i + 1] = s->cum[i] + (s->v[i].b - s->v[i].a);
}

/* Builds the union of raw[0..n) (takes ownership of raw, merges in place). */
static void ivset_build(ivset *s, iv *raw, size_t n) {
    qsort(raw, n, sizeof *raw, iv_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (raw[i].b <= raw[i].a) continue;
        if (m && raw[i].a <= raw[m - 1].b) {
            if (raw[i].b > raw[m - 1].b) raw[m - 1].b = raw[i].b;
        } else {
            raw[m++] = raw[i];
        }
    }
    s->v = raw;
    s->n = m;
    ivset_sums(s);
}

static void ivset_intersect(const ivset *x, const ivset *y, ivset *out) {
    out->v = xmalloc(sizeof(iv) * (x->n + y->n + 1));
    out->n = 0;
    size_t i = 0, j = 0;
    while (i < x->n && j < y->n) {
        int64_t lo = x->v[i].a > y->v[j].a ? x->v[i].a : y->v[j].a;
        int64_t hi = x->v[i].b < y->v[j].b ? x->v[i].b : y->v[j].b;
        if (lo < hi) out->v[out->n++] = (iv){lo, hi};
        if (x->v[i].b < y->v[j].b)
            i++;
        else
            j++;
    }
    ivset_sums(out);
}

/* Length of the union that lies below x. */
static int64_t ivset_below(const ivset *s, int64_t x) {
    size_t lo = 0, hi = s->n; /* find the number of intervals starting before x */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].a < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return 0;
    const iv *last = &s->v[lo - 1];
    return s->cum[lo - 1] + ((x < last->b ? x : last->b) - last->a);
}

/* Length of the union inside [lo, hi). */
static int64_t ivset_measure(const ivset *s, int64_t lo, int64_t hi) {
    return hi > lo ? ivset_below(s, hi) - ivset_below(s, lo) : 0;
}

static int64_t ivset_total(const ivset *s) {
    return s->cum ? s->cum[s->n] : 0;
}

/* Per rank: compute (ops), comm (collectives) and their intersection; the same for the
 * collectives on the data-parallel mesh dim. */
typedef struct rank_ivs {
    ivset op, comm, both, dp, dp_both;
} rank_ivs;

static void ivset_free(ivset *s) {
    free(s->v), free(s->cum);
}

static void rank_ivs_free(rank_ivs *r, int n) {
    if (!r) return;
    for (int i = 0; i < n; i++) {
        ivset_free(&r[i].op), ivset_free(&r[i].comm), ivset_free(&r[i].both);
        ivset_free(&r[i].dp), ivset_free(&r[i].dp_both);
    }
    free(r);
}

static bool on_dim(const ms_event *e, int dim) {
    return e->kind == MS_EV_COLL && dim >= 0 && e->u.coll.mesh_dim == dim;
}

/* A rank's compute: its GPU kernels when it ran on a GPU (the engine's op spans are then only
 * the launches), else its operators. NCCL's kernels are communication, as in HTA. */
static bool is_compute(const ms_event *e, bool gpu_rank) {
    if (e->kind != MS_EV_OP) return false;
    if (!gpu_rank) return e->u.op.gpu == MS_GPU_NONE;
    return e->u.op.gpu == MS_GPU_KERNEL && !strstr(e->u.op.name, "nccl");
}

/* dp_dim: the data-parallel mesh dim, or -1. */
static rank_ivs *build_rank_ivs(const ms_event *const *w, size_t nw, int nranks, int dp_dim) {
    size_t *n_op = xcalloc((size_t)nranks * 3, sizeof(size_t)), *n_comm = n_op + nranks;
    size_t *n_dp = n_comm + nranks;
    bool *gpu = xcalloc((size_t)nranks, sizeof(bool));
    for (size_t i = 0; i < nw; i++)
        if (w[i]->kind == MS_EV_OP && w[i]->u.op.gpu == MS_GPU_KERNEL) gpu[w[i]->rank] = true;
    for (size_t i = 0; i < nw; i++) {
        if (is_compute(w[i], gpu[w[i]->rank])) n_op[w[i]->rank]++;
        if (w[i]->kind == MS_EV_COLL) n_comm[w[i]->rank]++;
        if (on_dim(w[i], dp_dim)) n_dp[w[i]->rank]++;
    }
    rank_ivs *r = xcalloc((size_t)nranks, sizeof *r);
    for (int k = 0; k < nranks; k++) {
        r[k].op.v = xmalloc(sizeof(iv) * (n_op[k] + 1));
        r[k].comm.v = xmalloc(sizeof(iv) * (n_comm[k] + 1));
        r[k].dp.v = xmalloc(sizeof(iv) * (n_dp[k] + 1));
        r[k].op.n = r[k].comm.n = r[k].dp.n = 0;
    }
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        ivset *s = is_compute(e, gpu[e->rank]) ? &r[e->rank].op
                   : e->kind == MS_EV_COLL     ? &r[e->rank].comm
                                               : NULL;
        if (s) s->v[s->n++] = (iv){e->t0_ns, e->t1_ns};
        if (on_dim(e, dp_dim)) r[e->rank].dp.v[r[e->rank].dp.n++] = (iv){e->t0_ns, e->t1_ns};
    }
    for (int k = 0; k < nranks; k++) {
        ivset_build(&r[k].op, r[k].op.v, r[k].op.n);
        ivset_build(&r[k].comm, r[k].comm.v, r[k].comm.n);
        ivset_build(&r[k].dp, r[k].dp.v, r[k].dp.n);
        ivset_intersect(&r[k].op, &r[k].comm, &r[k].both);
        ivset_intersect(&r[k].op, &r[k].dp, &r[k].dp_both);
    }
    free(n_op);
    free(gpu);
    return r;
}

/* --- helpers ---------------------------------------------------------------------------- */

static double secs(int64_t ns) {
    return (double)ns * 1e-9;
}

static int64_t dur_ns(const ms_event *e) {
    return e->t1_ns > e->t0_ns ? e->t1_ns - e->t0_ns : 0;
}

static bool in_window(int64_t s, int64_t lo, int64_t hi) {
    if (hi < 0) return lo <= 0 || s >= lo;
    return s >= lo && s <= hi;
}

/* Copies a fixed-size event string, which may fill its array without a terminator. */
static void fixed_str(char *dst, size_t cap, const char *src, size_t src_cap) {
    size_t n = strnlen(src, src_cap);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

typedef struct group_ref {
    int32_t id;
    int idx;
} group_ref;

static int group_ref_cmp(const void *x, const void *y) {
    const group_ref *p = x, *q = y;
    return p->id < q->id ? -1 : p->id > q->id;
}

static const ms_group *find_group(const group_ref *refs, int n, const ms_group *groups,
                                  int32_t id) {
    group_ref key = {id, 0};
    const group_ref *hit = bsearch(&key, refs, (size_t)n, sizeof *refs, group_ref_cmp);
    return hit ? &groups[hit->idx] : NULL;
}

static void heat_alloc(ms_heatmap *h, int nranks, int dim) {
    h->nranks = nranks;
    h->mesh_dim = dim;
    size_t cells = (size_t)nranks * (size_t)nranks;
    h->bytes = xcalloc(cells ? cells : 1, sizeof(double));
    h->seconds = xcalloc(cells ? cells : 1, sizeof(double));
}

/* --- heatmaps ----------------------------------------------------------------------------- */

static void build_heatmaps(ms_analysis *a, const ms_event *const *w, size_t nw,
                           const group_ref *refs, int n_refs, const ms_group *groups) {
    const int nr = a->nranks;
    heat_alloc(&a->all, nr, -1);
    a->n_dims = 0;
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind != MS_EV_COLL) continue;
        int d = e->u.coll.mesh_dim;
        if (d < 0 || d >= MS_AN_MAX_DIMS) continue;
        if (d + 1 > a->n_dims) a->n_dims = d + 1;
        if (!a->dim_names[d][0]) {
            const ms_group *g = find_group(refs, n_refs, groups, e->u.coll.group);
            if (g && strcmp(g->name, "p2p")) fixed_str(a->dim_names[d], 16, g->name, 16);
        }
    }
    for (int d = 0; d < a->n_dims; d++) heat_alloc(&a->per_dim[d], nr, d);

    double per[MS_AN_MAX_RANKS];
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind != MS_EV_COLL) continue;
        const ms_ev_coll *c = &e->u.coll;
        if (c->group_size < 2 || c->group_size > MS_AN_MAX_RANKS) continue;
        const ms_group *g = find_group(refs, n_refs, groups, c->group);
        if (!g) continue;
        ms_bytes_per_peer(c, per);
        const double t = secs(dur_ns(e));
        const int src = e->rank, d = c->mesh_dim;
        const int listed = g->size < MS_EV_GROUP_MAX ? g->size : MS_EV_GROUP_MAX;
        for (int p = 0; p < c->group_size && p < listed; p++) {
            int dst = g->ranks[p];
            if (per[p] <= 0 || dst < 0 || dst >= nr || dst == src) continue;
            size_t cell = (size_t)src * (size_t)nr + (size_t)dst;
            a->all.bytes[cell] += per[p];
            a->all.seconds[cell] += t;
            if (d >= 0 && d < a->n_dims) {
                a->per_dim[d].bytes[cell] += per[p];
                a->per_dim[d].seconds[cell] += t;
            }
        }
    }
}

/* --- bus bandwidth ------------------------------------------------------------------------ */

typedef struct bw_key {
    uint8_t coll;
    int16_t dim;
    int size;
    uint64_t bytes;
    int64_t ns;
} bw_key;

static int bw_cmp(const void *x, const void *y) {
    const bw_key *p = x, *q = y;
    if (p->coll != q->coll) return p->coll < q->coll ? -1 : 1;
    if (p->size != q->size) return p->size < q->size ? -1 : 1;
    if (p->bytes != q->bytes) return p->bytes < q->bytes ? -1 : 1;
    return p->dim < q->dim ? -1 : p->dim > q->dim;
}

static void build_busbw(ms_analysis *a, const ms_event *const *w, size_t nw) {
    bw_key *k = xmalloc(sizeof *k * (nw + 1));
    size_t m = 0;
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind != MS_EV_COLL) continue;
        const ms_ev_coll *c = &e->u.coll;
        if (c->coll == MS_COLL_BARRIER || c->coll == MS_COLL_SPLIT ||
            c->coll >= MS_COLL_KIND_COUNT || c->bytes == 0 || c->group_size < 2)
            continue;
        k[m++] = (bw_key){c->coll, c->mesh_dim, c->group_size, c->bytes, dur_ns(e)};
    }
    qsort(k, m, sizeof *k, bw_cmp);
    a->busbw = xcalloc(m + 1, sizeof *a->busbw);
    for (size_t i = 0; i < m;) {
        size_t j = i;
        int64_t sum = 0;
        for (; j < m && !bw_cmp(&k[i], &k[j]); j++) sum += k[j].ns;
        ms_busbw_row *r = &a->busbw[a->n_busbw++];
        r->coll = k[i].coll;
        r->mesh_dim = k[i].dim;
        r->group_size = k[i].size;
        r->bytes = k[i].bytes;
        r->count = (int)(j - i);
        r->mean_s = secs(sum) / (double)r->count;
        r->busbw_gbs = r->mean_s > 0
                           ? (double)r->bytes / r->mean_s *
                                 ms_coll_busbw_factor((ms_coll_kind)r->coll, r->group_size) / 1e9
                           : 0.0;
        i = j;
    }
    free(k);
}

/* --- operators and reshards ------------------------------------------------------------- */

typedef struct name_key {
    char name[2 * MS_EV_PL_MAX + 8];
    uint8_t phase;
    int64_t ns;
    double amount; /* flops (ops) or bytes (reshards) */
} name_key;

static int name_cmp(const void *x, const void *y) {
    const name_key *p = x, *q = y;
    int c = strcmp(p->name, q->name);
    if (c) return c;
    return p->phase < q->phase ? -1 : p->phase > q->phase;
}

static int op_row_cmp(const void *x, const void *y) {
    const ms_op_row *p = x, *q = y;
    if (p->seconds != q->seconds) return p->seconds > q->seconds ? -1 : 1;
    int c = strcmp(p->name, q->name);
    return c ? c : (p->phase > q->phase) - (p->phase < q->phase);
}

static int reshard_row_cmp(const void *x, const void *y) {
    const ms_reshard_row *p = x, *q = y;
    if (p->seconds != q->seconds) return p->seconds > q->seconds ? -1 : 1;
    return strcmp(p->transition, q->transition);
}

static void build_ops_reshards(ms_analysis *a, const ms_event *const *w, size_t nw) {
    name_key *ops = xmalloc(sizeof *ops * (nw + 1)), *rs = xmalloc(sizeof *rs * (nw + 1));
    size_t no = 0, nrs = 0;
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind == MS_EV_OP) {
            name_key *k = &ops[no++];
            fixed_str(k->name, sizeof((ms_op_row *)0)->name, e->u.op.opname, sizeof e->u.op.opname);
            k->phase = e->phase;
            k->ns = dur_ns(e);
            k->amount = e->u.op.flops;
        } else if (e->kind == MS_EV_RESHARD) {
            name_key *k = &rs[nrs++];
            snprintf(k->name, sizeof k->name, "%.*s -> %.*s",
                     (int)strnlen(e->u.reshard.from, MS_EV_PL_MAX), e->u.reshard.from,
                     (int)strnlen(e->u.reshard.to, MS_EV_PL_MAX), e->u.reshard.to);
            k->phase = 0;
            k->ns = dur_ns(e);
            k->amount = (double)e->u.reshard.bytes;
        }
    }
    qsort(ops, no, sizeof *ops, name_cmp);
    qsort(rs, nrs, sizeof *rs, name_cmp);
    a->ops = xcalloc(no + 1, sizeof *a->ops);
    for (size_t i = 0; i < no;) {
        ms_op_row *r = &a->ops[a->n_ops++];
        fixed_str(r->name, sizeof r->name, ops[i].name, sizeof ops[i].name);
        r->phase = ops[i].phase;
        size_t j = i;
        int64_t ns = 0;
        for (; j < no && !name_cmp(&ops[i], &ops[j]); j++) {
            ns += ops[j].ns;
            r->flops += ops[j].amount;
        }
        r->count = (int)(j - i);
        r->seconds = secs(ns);
        i = j;
    }
    a->reshards = xcalloc(nrs + 1, sizeof *a->reshards);
    for (size_t i = 0; i < nrs;) {
        ms_reshard_row *r = &a->reshards[a->n_reshards++];
        fixed_str(r->transition, sizeof r->transition, rs[i].name, sizeof rs[i].name);
        size_t j = i;
        int64_t ns = 0;
        for (; j < nrs && !name_cmp(&rs[i], &rs[j]); j++) {
            ns += rs[j].ns;
            r->bytes += rs[j].amount;
        }
        r->count = (int)(j - i);
        r->seconds = secs(ns);
        i = j;
    }
    qsort(a->ops, (size_t)a->n_ops, sizeof *a->ops, op_row_cmp);
    qsort(a->reshards, (size_t)a->n_reshards, sizeof *a->reshards, reshard_row_cmp);
    free(ops);
    free(rs);
}

/* --- overlap and steps -------------------------------------------------------------------- */

static int step_row_cmp(const void *x, const void *y) {
    const ms_step_row *p = x, *q = y;
    if (p->step != q->step) return p->step < q->step ? -1 : 1;
    if (p->wall_s != q->wall_s) return p->wall_s > q->wall_s ? -1 : 1; /* slowest first */
    return p->rank - q->rank;
}

/* The mesh dim whose communicator is named "dp", or -1 (the heatmaps named the dims). */
static int dp_mesh_dim(const ms_analysis *a) {
    for (int d = 0; d < a->n_dims && d < MS_AN_MAX_DIMS; d++)
        if (!strcmp(a->dim_names[d], "dp")) return d;
    return -1;
}

static void build_overlap(ms_analysis *a, const rank_ivs *r) {
    for (int k = 0; k < a->nranks; k++) {
        ms_rank_overlap *o = &a->overlap[k];
        o->comm_s = secs(ivset_total(&r[k].comm));
        o->compute_s = secs(ivset_total(&r[k].op));
        o->overlapped_s = secs(ivset_total(&r[k].both));
        o->exposed_comm_s = secs(ivset_total(&r[k].comm) - ivset_total(&r[k].both));
        o->overlap_ratio = o->comm_s > 0 ? o->overlapped_s / o->comm_s : 0.0;
        o->dp_comm_s = secs(ivset_total(&r[k].dp));
        o->dp_hidden_s = secs(ivset_total(&r[k].dp_both));
        o->dp_hidden_ratio = o->dp_comm_s > 0 ? o->dp_hidden_s / o->dp_comm_s : 0.0;
    }
}

static void build_overlap_steps(ms_analysis *a, const ms_event *const *w, size_t nw) {
    rank_ivs *r = build_rank_ivs(w, nw, a->nranks, dp_mesh_dim(a));
    build_overlap(a, r);
    /* One row per STEP event, then keep each step's slowest rank. */
    size_t ns = 0;
    for (size_t i = 0; i < nw; i++) ns += w[i]->kind == MS_EV_STEP;
    ms_step_row *rows = xcalloc(ns + 1, sizeof *rows);
    size_t m = 0;
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind != MS_EV_STEP) continue;
        const rank_ivs *ri = &r[e->rank];
        int64_t lo = e->t0_ns, hi = e->t1_ns > e->t0_ns ? e->t1_ns : e->t0_ns;
        int64_t compute = ivset_measure(&ri->op, lo, hi);
        int64_t exposed = ivset_measure(&ri->comm, lo, hi) - ivset_measure(&ri->both, lo, hi);
        ms_step_row *s = &rows[m++];
        s->step = e->step;
        s->rank = e->rank;
        s->wall_s = secs(hi - lo);
        s->compute_s = secs(compute);
        s->exposed_comm_s = secs(exposed);
        s->idle_s = secs(hi - lo - compute - exposed);
        ms_rank_overlap *o = &a->overlap[e->rank];
        o->exposed_comm_step_s += (secs(exposed) - o->exposed_comm_step_s) / ++o->steps;
    }
    qsort(rows, m, sizeof *rows, step_row_cmp);
    size_t kept = 0;
    for (size_t i = 0; i < m; i++)
        if (!kept || rows[kept - 1].step != rows[i].step) rows[kept++] = rows[i];
    a->steps = rows;
    a->n_steps = (int)kept;
    rank_ivs_free(r, a->nranks);
}

/* --- stragglers ------------------------------------------------------------------------- */

typedef struct arrival {
    int32_t group;
    int32_t size;
    int64_t seq;
    int64_t t0;
    int rank;
} arrival;

static int arrival_cmp(const void *x, const void *y) {
    const arrival *p = x, *q = y;
    if (p->group != q->group) return p->group < q->group ? -1 : 1;
    if (p->seq != q->seq) return p->seq < q->seq ? -1 : 1;
    if (p->t0 != q->t0) return p->t0 < q->t0 ? -1 : 1;
    return p->rank - q->rank;
}

static int straggler_cmp(const void *x, const void *y) {
    const ms_straggler *p = x, *q = y;
    if (p->last_fraction != q->last_fraction) return p->last_fraction > q->last_fraction ? -1 : 1;
    if (p->mean_lag_s != q->mean_lag_s) return p->mean_lag_s > q->mean_lag_s ? -1 : 1;
    return p->rank - q->rank;
}

static void build_stragglers(ms_analysis *a, const ms_event *const *w, size_t nw) {
    arrival *v = xmalloc(sizeof *v * (nw + 1));
    size_t m = 0;
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind != MS_EV_COLL) continue;
        const ms_ev_coll *c = &e->u.coll;
        /* Point-to-point is not a rendezvous of the whole group: no "last" to find. */
        if (c->coll == MS_COLL_P2P || c->group_size < 2) continue;
        v[m++] = (arrival){c->group, c->group_size, c->seq, e->t0_ns, e->rank};
    }
    qsort(v, m, sizeof *v, arrival_cmp);
    const int nr = a->nranks;
    int *part = xcalloc((size_t)nr * 2, sizeof(int)), *last = part + nr;
    int64_t *lag = xcalloc((size_t)nr, sizeof(int64_t));
    size_t *seen = xcalloc((size_t)nr, sizeof(size_t)), instance = 0; /* duplicate check */
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && v[j].group == v[i].group && v[j].seq == v[i].seq) j++;
        /* Complete instances only: one event per member (a missing or doubled member means
         * dropped events or a recreated communicator, and would fake a straggler). */
        bool complete = (size_t)v[i].size == j - i;
        instance++;
        for (size_t k = i; complete && k < j; k++) {
            complete = seen[v[k].rank] != instance;
            seen[v[k].rank] = instance;
        }
        if (complete) {
            for (size_t k = i; k < j; k++) part[v[k].rank]++;
            int64_t d = v[j - 1].t0 - v[i].t0; /* sorted by arrival: last minus first */
            if (d > MS_AN_STRAGGLER_MIN_LAG_NS) {
                last[v[j - 1].rank]++;
                lag[v[j - 1].rank] += d;
            }
        }
        i = j;
    }
    a->stragglers = xcalloc((size_t)nr + 1, sizeof *a->stragglers);
    for (int k = 0; k < nr; k++) {
        if (part[k] < MS_AN_STRAGGLER_MIN_COUNT) continue;
        double f = (double)last[k] / part[k];
        if (f <= MS_AN_STRAGGLER_FRACTION) continue;
        a->stragglers[a->n_stragglers++] = (ms_straggler){
            .rank = k, .last_fraction = f, .mean_lag_s = secs(lag[k]) / last[k], .count = part[k]};
    }
    qsort(a->stragglers, (size_t)a->n_stragglers, sizeof *a->stragglers, straggler_cmp);
    free(v);
    free(part);
    free(lag);
    free(seen);
}

/* --- pipeline bubble -------------------------------------------------------------------- */

double ms_pipe_formula_bubble(const char *schedule, int p, int m, int v) {
    if (p <= 1) return 0.0;
    if (!schedule || m < 1 || v < 1) return NAN;
    if (!strcmp(schedule, "1f1b") || !strcmp(schedule, "gpipe"))
        return (double)(p - 1) / (double)(m + p - 1);
    if (!strcmp(schedule, "interleaved")) return (double)(p - 1) / ((double)v * m + p - 1);
    return NAN;
}

typedef struct pipe_key {
    int64_t step;
    int32_t rank, stage;
    int64_t t0, t1;
} pipe_key;

static int pipe_key_cmp(const void *x, const void *y) {
    const pipe_key *p = x, *q = y;
    if (p->step != q->step) return p->step < q->step ? -1 : 1;
    if (p->rank != q->rank) return p->rank < q->rank ? -1 : 1;
    return p->t0 < q->t0 ? -1 : p->t0 > q->t0;
}

static bool same_schedule(const ms_ev_pipe *a, const ms_ev_pipe *b) {
    return a->stages == b->stages && a->virtual_stages == b->virtual_stages &&
           a->micro_batches == b->micro_batches &&
           !strncmp(a->schedule, b->schedule, sizeof a->schedule);
}

/* The window's mean F, B and W of the reported schedule, and the planner's simulated bubble
 * with them. */
static void pipe_simulate(ms_pipe_stats *ps, const ms_ev_pipe *rp, const ms_event *const *w,
                          size_t nw) {
    double sum[3] = {0};
    int n[3] = {0};
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind != MS_EV_PIPE || !same_schedule(&e->u.pipe, rp) || e->t1_ns < e->t0_ns ||
            e->u.pipe.action > MS_PIPE_W)
            continue;
        sum[e->u.pipe.action] += secs(e->t1_ns - e->t0_ns);
        n[e->u.pipe.action]++;
    }
    ps->mean_f_s = n[0] ? sum[0] / n[0] : NAN;
    ps->mean_b_s = n[1] ? sum[1] / n[1] : NAN;
    ps->mean_w_s = n[2] ? sum[2] / n[2] : 0;
    ps->simulated = NAN;
    int kind = -1;
    for (int k = 0; k < MS_SCHEDULE_COUNT; k++)
        if (!strcmp(ps->schedule, ms_schedule_name((ms_schedule)k))) kind = k;
    if (kind < 0 || !n[0] || !n[1]) return;
    /* per action is per chunk: the simulator takes a whole stage's times (v chunks) */
    double v = ps->virtual_stages, frac;
    if (ms_pp_bubble_fraction((ms_schedule)kind, ps->stages, ps->micro_batches, ps->virtual_stages,
                              v * ps->mean_f_s, v * ps->mean_b_s, v * ps->mean_w_s, &frac,
                              NULL) == MS_OK)
        ps->simulated = frac;
}

/* Length of the union of k[0..n), sorted by t0. */
static int64_t union_ns(const pipe_key *k, size_t n) {
    int64_t total = 0, lo = 0, hi = INT64_MIN;
    for (size_t i = 0; i < n; i++) {
        if (k[i].t0 > hi) {
            if (hi > lo) total += hi - lo;
            lo = k[i].t0, hi = k[i].t1;
        } else if (k[i].t1 > hi) {
            hi = k[i].t1;
        }
    }
    if (hi > lo) total += hi - lo;
    return total;
}

static void build_pipe(ms_analysis *a, const ms_event *const *w, size_t nw) {
    ms_pipe_stats *ps = &a->pipe;
    const ms_event *ref = NULL; /* the latest action: its schedule is the one reported */
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind == MS_EV_PIPE &&
            (!ref || e->step > ref->step || (e->step == ref->step && e->t1_ns > ref->t1_ns)))
            ref = e;
    }
    if (!ref) return;
    const ms_ev_pipe *rp = &ref->u.pipe;
    if (rp->stages < 1 || rp->stages > MS_AN_MAX_STAGES) return;
    pipe_key *k = xmalloc(sizeof *k * (nw + 1));
    size_t m = 0;
    for (size_t i = 0; i < nw; i++) {
        const ms_event *e = w[i];
        if (e->kind != MS_EV_PIPE || !same_schedule(&e->u.pipe, rp) || e->u.pipe.stage < 0 ||
            e->u.pipe.stage >= rp->stages || e->t1_ns < e->t0_ns)
            continue;
        k[m++] = (pipe_key){e->step, e->rank, e->u.pipe.stage, e->t0_ns, e->t1_ns};
    }
    qsort(k, m, sizeof *k, pipe_key_cmp);
    ps->stages = rp->stages;
    ps->virtual_stages = rp->virtual_stages;
    ps->micro_batches = rp->micro_batches;
    fixed_str(ps->schedule, sizeof ps->schedule, rp->schedule, sizeof rp->schedule);
    ps->formula =
        ms_pipe_formula_bubble(ps->schedule, ps->stages, ps->micro_batches, ps->virtual_stages);
    pipe_simulate(ps, rp, w, nw);
    double sum[MS_AN_MAX_STAGES] = {0}, all = 0;
    int cnt[MS_AN_MAX_STAGES] = {0}, n_all = 0;
    for (size_t i = 0; i < m;) {
        size_t j = i;
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (; j < m && k[j].step == k[i].step; j++) {
            lo = k[j].t0 < lo ? k[j].t0 : lo;
            hi = k[j].t1 > hi ? k[j].t1 : hi;
        }
        const bool last = j == m; /* sorted by step: the last group is the latest step */
        if (hi > lo) {
            double lsum[MS_AN_MAX_STAGES] = {0}, lall = 0;
            int lcnt[MS_AN_MAX_STAGES] = {0}, ln = 0;
            for (size_t r = i; r < j;) {
                size_t q = r;
                while (q < j && k[q].rank == k[r].rank) q++;
                double b = 1.0 - (double)union_ns(&k[r], q - r) / (double)(hi - lo);
                int st = k[r].stage;
                sum[st] += b, cnt[st]++, all += b, n_all++;
                lsum[st] += b, lcnt[st]++, lall += b, ln++;
                r = q;
            }
            ps->n_steps++;
            if (last) {
                ps->last_step = k[i].step;
                ps->last_window_s = secs(hi - lo);
                ps->last_bubble = lall / ln;
                for (int st = 0; st < ps->stages; st++) {
                    ps->stage_ranks[st] = lcnt[st];
                    ps->last_stage_bubble[st] = lcnt[st] ? lsum[st] / lcnt[st] : NAN;
                }
            }
        }
        i = j;
    }
    ps->bubble = n_all ? all / n_all : NAN;
    for (int st = 0; st < ps->stages; st++)
        ps->stage_bubble[st] = cnt[st] ? sum[st] / cnt[st] : NAN;
    if (!ps->n_steps) ps->last_bubble = NAN;
    free(k);
}

/* --- entry points ----------------------------------------------------------------------- */

ms_status ms_analyze(const ms_event *ev, size_t n, const ms_group *groups, int n_groups,
                     int64_t step_lo, int64_t step_hi, ms_analysis *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    out->step_lo = step_lo;
    out->step_hi = step_hi;
    if ((n && !ev) || n_groups < 0 || (n_groups && !groups))
        return ms_fail(err, MS_ERR_INVALID, "analysis: NULL events or groups");
    int max_rank = -1;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].rank < 0 || ev[i].rank >= MS_AN_MAX_RANKS)
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "analysis: event %zu names rank %d; analysis handles ranks 0..%d", i,
                           (int)ev[i].rank, MS_AN_MAX_RANKS - 1);
        if (ev[i].rank > max_rank) max_rank = ev[i].rank;
    }
    for (int g = 0; g < n_groups; g++) {
        int listed = groups[g].size < MS_EV_GROUP_MAX ? groups[g].size : MS_EV_GROUP_MAX;
        for (int p = 0; p < listed; p++) {
            int r = groups[g].ranks[p];
            if (r < 0 || r >= MS_AN_MAX_RANKS) {
                /* The name may come from a trace file, and may fill its field unterminated. */
                char name[sizeof groups[g].name + 1], safe[80];
                snprintf(name, sizeof name, "%.*s", (int)sizeof groups[g].name, groups[g].name);
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "analysis: group %d ('%s') lists rank %d; analysis handles "
                               "ranks 0..%d",
                               (int)groups[g].id, ms_safe_str(safe, sizeof safe, name), r,
                               MS_AN_MAX_RANKS - 1);
            }
            if (r > max_rank) max_rank = r;
        }
    }
    out->nranks = max_rank + 1;

    group_ref *refs = xmalloc(sizeof *refs * ((size_t)n_groups + 1));
    for (int g = 0; g < n_groups; g++) refs[g] = (group_ref){groups[g].id, g};
    qsort(refs, (size_t)n_groups, sizeof *refs, group_ref_cmp);

    const ms_event **w = xmalloc(sizeof *w * (n + 1));
    size_t nw = 0;
    for (size_t i = 0; i < n; i++)
        if (in_window(ev[i].step, step_lo, step_hi)) w[nw++] = &ev[i];

    build_heatmaps(out, w, nw, refs, n_groups, groups);
    build_busbw(out, w, nw);
    build_ops_reshards(out, w, nw);
    build_overlap_steps(out, w, nw);
    build_stragglers(out, w, nw);
    build_pipe(out, w, nw);
    free(w);
    free(refs);
    return MS_OK;
}

void ms_analysis_free(ms_analysis *a) {
    if (!a) return;
    free(a->all.bytes);
    free(a->all.seconds);
    for (int d = 0; d < MS_AN_MAX_DIMS; d++) {
        free(a->per_dim[d].bytes);
        free(a->per_dim[d].seconds);
    }
    free(a->busbw);
    free(a->ops);
    free(a->reshards);
    free(a->steps);
    free(a->stragglers);
    memset(a, 0, sizeof *a);
}

/* --- the text report ---------------------------------------------------------------------- */

static const char *phase_name(uint8_t p) {
    return p == MS_PHASE_FORWARD ? "forward" : p == MS_PHASE_BACKWARD ? "backward" : "other";
}

/* Bytes in a unit chosen for the value, e.g. "1.50 MiB". */
static void human_bytes(char *buf, size_t len, double b) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) b /= 1024.0, u++;
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

static void print_heatmap(FILE *f, const ms_heatmap *h, const char *title) {
    const int nr = h->nranks;
    double total = 0, peak = 0;
    for (size_t i = 0; i < (size_t)nr * (size_t)nr; i++) {
        total += h->bytes[i];
        if (h->bytes[i] > peak) peak = h->bytes[i];
    }
    char tb[32];
    human_bytes(tb, sizeof tb, total);
    fprintf(f, "\nTraffic %s: %s sent in all (row = sender, column = receiver)\n", title, tb);
    if (total <= 0) {
        fprintf(f, "  none\n");
        return;
    }
    if (nr <= 16) {
        /* One unit for the whole matrix, picked from its largest cell. */
        double scale = 1;
        const char *unit = "B";
        if (peak >= 1 << 30)
            scale = 1 << 30, unit = "GiB";
        else if (peak >= 1 << 20)
            scale = 1 << 20, unit = "MiB";
        else if (peak >= 1 << 10)
            scale = 1 << 10, unit = "KiB";
        fprintf(f, "  %-6s", unit);
        for (int c = 0; c < nr; c++) fprintf(f, " %9d", c);
        fprintf(f, "\n");
        for (int r = 0; r < nr; r++) {
            fprintf(f, "  %-6d", r);
            for (int c = 0; c < nr; c++) {
                double v = h->bytes[(size_t)r * (size_t)nr + (size_t)c];
                if (v > 0)
                    fprintf(f, " %9.2f", v / scale);
                else
                    fprintf(f, " %9s", ".");
            }
            fprintf(f, "\n");
        }
        return;
    }
    /* Too many ranks for a matrix: the ten busiest pairs. */
    fprintf(f, "  %-6s %-6s %14s %12s\n", "from", "to", "bytes", "time ms");
    bool *shown = xcalloc((size_t)nr * (size_t)nr, sizeof(bool));
    for (int k = 0; k < 10; k++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < (size_t)nr * (size_t)nr; i++)
            if (!shown[i] && h->bytes[i] > 0 && (best == SIZE_MAX || h->bytes[i] > h->bytes[best]))
                best = i;
        if (best == SIZE_MAX) break;
        shown[best] = true;
        char bb[32];
        human_bytes(bb, sizeof bb, h->bytes[best]);
        fprintf(f, "  %-6d %-6d %14s %12.3f\n", (int)(best / (size_t)nr), (int)(best % (size_t)nr),
                bb, h->seconds[best] * 1e3);
    }
    free(shown);
}

/* A fraction as a percentage, "-" when unknown. */
static void pct(char *buf, size_t len, double v) {
    if (isfinite(v))
        snprintf(buf, len, "%.1f%%", v * 100);
    else
        snprintf(buf, len, "-");
}

static void print_pipe(FILE *f, const ms_pipe_stats *p) {
    /* One stage is gradient accumulation (or plain training): its actions follow each other
     * and the report stays as it was for runs without a pipeline. */
    if (p->stages < 2) return;
    fprintf(f,
            "\nPipeline: %s, %d stage%s, %d micro-batch%s, %d virtual stage%s (bubble = 1 - busy "
            "/ the step's span of actions; over %d step%s, and step %lld alone)\n",
            p->schedule, p->stages, p->stages == 1 ? "" : "s", p->micro_batches,
            p->micro_batches == 1 ? "" : "es", p->virtual_stages, p->virtual_stages == 1 ? "" : "s",
            p->n_steps, p->n_steps == 1 ? "" : "s", (long long)p->last_step);
    fprintf(f, "  %6s %6s %9s %10s\n", "stage", "ranks", "bubble", "last step");
    char a[16], b[16];
    for (int s = 0; s < p->stages; s++) {
        pct(a, sizeof a, p->stage_bubble[s]);
        pct(b, sizeof b, p->last_stage_bubble[s]);
        fprintf(f, "  %6d %6d %9s %10s\n", s, p->stage_ranks[s], a, b);
    }
    pct(a, sizeof a, p->bubble);
    pct(b, sizeof b, p->last_bubble);
    fprintf(f, "  %6s %6s %9s %10s\n", "all", "", a, b);
    pct(a, sizeof a, p->formula);
    if (!strcmp(p->schedule, "interleaved"))
        fprintf(f, "  formula (p-1)/(v*m+p-1) = %s\n", a);
    else if (isfinite(p->formula))
        fprintf(f, "  formula (p-1)/(m+p-1) = %s\n", a);
    if (isfinite(p->simulated)) {
        pct(a, sizeof a, p->simulated);
        fprintf(
            f, "  simulated (the planner's: posted transfers, mean F %.2f B %.2f W %.2f ms) = %s\n",
            p->mean_f_s * 1e3, p->mean_b_s * 1e3, p->mean_w_s * 1e3, a);
    }
}

void ms_analysis_print(const ms_analysis *a, void *file) {
    FILE *f = file;
    fprintf(f, "meshscope trace summary: %d rank%s, ", a->nranks, a->nranks == 1 ? "" : "s");
    if (a->step_hi < 0)
        fprintf(f, a->step_lo > 0 ? "steps %lld..end\n" : "all steps\n", (long long)a->step_lo);
    else
        fprintf(f, "steps %lld..%lld\n", (long long)a->step_lo, (long long)a->step_hi);

    fprintf(f, "\nSteps (each on its slowest rank; idle = neither op nor collective running)\n");
    if (!a->n_steps)
        fprintf(f, "  no step events\n");
    else
        fprintf(f, "  %8s %5s %11s %11s %16s %11s\n", "step", "rank", "wall ms", "compute ms",
                "exposed comm ms", "idle ms");
    for (int i = 0; i < a->n_steps; i++) {
        const ms_step_row *s = &a->steps[i];
        fprintf(f, "  %8lld %5d %11.3f %11.3f %16.3f %11.3f\n", (long long)s->step, s->rank,
                s->wall_s * 1e3, s->compute_s * 1e3, s->exposed_comm_s * 1e3, s->idle_s * 1e3);
    }

    print_pipe(f, &a->pipe);

    fprintf(f, "\nOverlap per rank (HTA: compute during communication / communication; "
               "dp: the data-parallel communication)\n");
    fprintf(f, "  %5s %11s %11s %14s %11s %8s %15s %10s %9s\n", "rank", "comm ms", "compute ms",
            "overlapped ms", "exposed ms", "overlap", "exposed/step ms", "dp comm ms", "dp hidden");
    for (int r = 0; r < a->nranks; r++) {
        const ms_rank_overlap *o = &a->overlap[r];
        fprintf(f, "  %5d %11.3f %11.3f %14.3f %11.3f %7.1f%% %15.3f %10.3f %8.1f%%\n", r,
                o->comm_s * 1e3, o->compute_s * 1e3, o->overlapped_s * 1e3, o->exposed_comm_s * 1e3,
                o->overlap_ratio * 100, o->exposed_comm_step_s * 1e3, o->dp_comm_s * 1e3,
                o->dp_hidden_ratio * 100);
    }

    fprintf(f, "\nCollective bandwidth (nccl-tests convention; mean over every rank's call)\n");
    if (!a->n_busbw)
        fprintf(f, "  no collectives\n");
    else
        fprintf(f, "  %-15s %5s %12s %7s %11s %11s %11s\n", "collective", "ranks", "bytes", "count",
                "mean us", "algbw GB/s", "busbw GB/s");
    for (int i = 0; i < a->n_busbw; i++) {
        const ms_busbw_row *b = &a->busbw[i];
        char bb[32];
        human_bytes(bb, sizeof bb, (double)b->bytes);
        fprintf(f, "  %-15s %5d %12s %7d %11.1f %11.3f %11.3f\n", ms_coll_name(b->coll),
                b->group_size, bb, b->count, b->mean_s * 1e6,
                b->mean_s > 0 ? (double)b->bytes / b->mean_s / 1e9 : 0.0, b->busbw_gbs);
    }

    fprintf(f, "\nOperators (summed over ranks, most time first)\n");
    if (!a->n_ops)
        fprintf(f, "  no op events\n");
    else
        fprintf(f, "  %-23s %-9s %8s %11s %11s\n", "op", "phase", "count", "time ms", "GFLOP");
    for (int i = 0; i < a->n_ops && i < 25; i++) {
        const ms_op_row *o = &a->ops[i];
        fprintf(f, "  %-23s %-9s %8d %11.3f %11.3f\n", o->name, phase_name(o->phase), o->count,
                o->seconds * 1e3, o->flops / 1e9);
    }
    if (a->n_ops > 25) fprintf(f, "  ... %d more\n", a->n_ops - 25);

    fprintf(f, "\nReshards (summed over ranks, most time first)\n");
    if (!a->n_reshards)
        fprintf(f, "  no reshards\n");
    else
        fprintf(f, "  %-44s %7s %12s %11s\n", "transition", "count", "bytes", "time ms");
    for (int i = 0; i < a->n_reshards; i++) {
        const ms_reshard_row *r = &a->reshards[i];
        char bb[32];
        human_bytes(bb, sizeof bb, r->bytes);
        fprintf(f, "  %-44s %7d %12s %11.3f\n", r->transition, r->count, bb, r->seconds * 1e3);
    }

    fprintf(f, "\nStragglers (last into more than %.0f%% of collectives, by over %.0f us)\n",
            MS_AN_STRAGGLER_FRACTION * 100, MS_AN_STRAGGLER_MIN_LAG_NS / 1e3);
    if (!a->n_stragglers)
        fprintf(f, "  none\n");
    else
        fprintf(f, "  %5s %8s %12s %12s\n", "rank", "last", "mean lag ms", "collectives");
    for (int i = 0; i < a->n_stragglers; i++) {
        const ms_straggler *s = &a->stragglers[i];
        fprintf(f, "  %5d %7.1f%% %12.3f %12d\n", s->rank, s->last_fraction * 100,
                s->mean_lag_s * 1e3, s->count);
    }

    print_heatmap(f, &a->all, "(all communicators)");
    for (int d = 0; d < a->n_dims; d++) {
        char title[48];
        snprintf(title, sizeof title, "on mesh dim %d%s%s%s", d, a->dim_names[d][0] ? " (" : "",
                 a->dim_names[d], a->dim_names[d][0] ? ")" : "");
        print_heatmap(f, &a->per_dim[d], title);
    }
}

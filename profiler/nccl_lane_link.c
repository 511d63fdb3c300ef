/* nccl_lane_link.c - linking NCCL's records to meshscope's collectives and placing their GPU
 * spans (nccl_lane.h, "Linking" and "GPU time"). */
#include <stdlib.h>

#include "engine/comm/comm.h"
#include "profiler/nccl_lane.h"

/* How many earlier-starting collectives a record looks back through for the one around it:
 * collectives of one rank follow each other, so the one containing a start is among the
 * last few that began before it, even with every communicator of a process interleaved. */
#define LOOK_BACK 512

typedef struct coll_ref {
    int32_t key; /* the rank, or 0 when every rank shares the process */
    uint32_t idx;
    int64_t t0;
} coll_ref;

/* What is known of one NCCL communicator member: which world rank it is (its meshscope
 * group is not one: a send links to a {sender, receiver} pair's), and the bounds on its
 * GPU's clock offset. */
typedef struct member {
    uint64_t comm_id;
    int32_t comm_rank;
    int32_t rank;
    int state; /* 0: unknown, 1: known, 2: seen on two ranks (then neither is used) */
    bool gpu;
    int64_t off_hi, off_lo;
} member;

typedef struct linker {
    ms_event *ev;
    coll_ref *refs;
    size_t n_refs;
    member *m;
    size_t n_m, cap_m;
    bool one_process;
} linker;

static int cmp_ref(const void *a, const void *b) {
    const coll_ref *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

static member *member_of(linker *l, const ms_ev_nccl *x, bool create) {
    for (size_t i = 0; i < l->n_m; i++)
        if (l->m[i].comm_id == x->comm_id && l->m[i].comm_rank == x->comm_rank) return &l->m[i];
    if (!create) return NULL;
    if (l->n_m == l->cap_m) {
        size_t cap = l->cap_m ? 2 * l->cap_m : 16;
        member *m = realloc(l->m, sizeof *m * cap);
        if (!m) return NULL;
        l->m = m, l->cap_m = cap;
    }
    member *m = &l->m[l->n_m++];
    *m = (member){
        .comm_id = x->comm_id, .comm_rank = x->comm_rank, .off_hi = INT64_MAX, .off_lo = INT64_MIN};
    return m;
}

/* Whether meshscope's collective c can be the call that made NCCL record x. */
static bool fits(const ms_event *x, const ms_event *c) {
    const ms_ev_nccl *n = &x->u.nccl;
    const ms_ev_coll *k = &c->u.coll;
    if (c->t0_ns > x->t0_ns || x->t0_ns > c->t1_ns) return false;
    if (n->p2p) {
        if (k->coll == MS_COLL_P2P) return k->recv == !n->is_send;
        if (k->coll != MS_COLL_ALL_GATHER && k->coll != MS_COLL_ALL_TO_ALL) return false;
    } else if (n->coll != k->coll && k->coll != MS_COLL_BARRIER) {
        return false;
    }
    return k->group_size == n->nranks && k->group_rank == n->comm_rank;
}

/* The innermost collective around x (restricted to owner's rank when given), or -1;
 * *ambiguous when fitting collectives belong to more than one (group, rank). */
static long find(const linker *l, const ms_event *x, const member *owner, bool *ambiguous) {
    const int32_t key = l->one_process ? 0 : x->rank;
    size_t lo = 0, hi = l->n_refs; /* first ref after (key, x->t0) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const coll_ref *r = &l->refs[mid];
        if (r->key < key || (r->key == key && r->t0 <= x->t0_ns))
            lo = mid + 1;
        else
            hi = mid;
    }
    long best = -1;
    *ambiguous = false;
    for (size_t k = lo, seen = 0; k-- > 0 && seen < LOOK_BACK && l->refs[k].key == key; seen++) {
        const ms_event *c = &l->ev[l->refs[k].idx];
        if (!fits(x, c)) continue;
        if (owner && c->rank != owner->rank) continue;
        if (best < 0) {
            best = (long)l->refs[k].idx;
        } else {
            const ms_event *b = &l->ev[best];
            *ambiguous |= b->rank != c->rank || b->u.coll.group != c->u.coll.group;
        }
    }
    return best;
}

/* Pass 0: every member gets its entry, so that nothing later allocates (and a failure leaves
 * the events as they were). */
static int make_members(linker *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (l->ev[i].kind == MS_EV_NCCL && !member_of(l, &l->ev[i].u.nccl, true)) return -1;
    return 0;
}

/* Pass 1: every record with one possible (group, rank) teaches its member's rank. */
static void learn_owners(linker *l, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const ms_event *x = &l->ev[i];
        bool amb;
        long c = x->kind == MS_EV_NCCL ? find(l, x, NULL, &amb) : -1;
        if (c < 0 || amb) continue;
        member *m = member_of(l, &x->u.nccl, false);
        const int32_t r = l->ev[c].rank;
        if (m->state == 0)
            m->state = 1, m->rank = r;
        else if (m->state == 1 && m->rank != r)
            m->state = 2;
    }
}

/* Pass 2: link each record to its collective, or keep it on its member's rank. */
static void link_records(linker *l, size_t n, ms_nccl_link_stats *st) {
    for (size_t i = 0; i < n; i++) {
        ms_event *x = &l->ev[i];
        if (x->kind != MS_EV_NCCL) continue;
        member *m = member_of(l, &x->u.nccl, false);
        const member *owner = m && m->state == 1 ? m : NULL;
        bool amb;
        long c = find(l, x, owner, &amb);
        if (c >= 0 && !amb) {
            const ms_event *k = &l->ev[c];
            x->rank = k->rank;
            x->step = k->step;
            x->phase = k->phase;
            x->u.nccl.ms_group = k->u.coll.group;
            x->u.nccl.ms_seq = k->u.coll.seq;
            x->u.nccl.linked = 1;
            st->linked++;
        } else {
            if (owner) x->rank = owner->rank;
            x->u.nccl.linked = 0;
            st->unlinked++;
        }
    }
}

/* Pass 3: one offset per GPU (member), the tightest upper bound; spans moved onto it. */
static void place_gpu(linker *l, size_t n, ms_nccl_link_stats *st) {
    for (size_t i = 0; i < n; i++) {
        const ms_event *x = &l->ev[i];
        const ms_ev_nccl *g = &x->u.nccl;
        if (x->kind != MS_EV_NCCL || g->timing != MS_NCCL_T_GPU || g->gpu_t1 <= g->gpu_t0 ||
            g->host_t1)
            continue;
        member *m = member_of(l, g, false);
        const int64_t hi = x->t1_ns - (int64_t)g->gpu_t1, lo = x->t0_ns - (int64_t)g->gpu_t0;
        m->gpu = true;
        if (hi < m->off_hi) m->off_hi = hi;
        if (lo > m->off_lo) m->off_lo = lo;
    }
    for (size_t i = 0; i < l->n_m; i++) {
        if (!l->m[i].gpu) continue; /* its bounds are still the sentinels */
        const int64_t w = l->m[i].off_hi - l->m[i].off_lo;
        if ((w < 0 ? -w : w) > st->gpu_uncertainty_ns) st->gpu_uncertainty_ns = w < 0 ? -w : w;
    }
    for (size_t i = 0; i < n; i++) {
        ms_event *x = &l->ev[i];
        ms_ev_nccl *g = &x->u.nccl;
        if (x->kind != MS_EV_NCCL || g->timing != MS_NCCL_T_GPU || g->gpu_t1 <= g->gpu_t0 ||
            g->host_t1)
            continue;
        const member *m = member_of(l, g, false);
        g->host_t0 = x->t0_ns;
        g->host_t1 = x->t1_ns;
        int64_t t0 = (int64_t)g->gpu_t0 + m->off_hi, t1 = (int64_t)g->gpu_t1 + m->off_hi;
        if (t0 < g->host_t0) t0 = g->host_t0; /* clock drift: never before the host start */
        x->t0_ns = t0;
        x->t1_ns = t1 > t0 ? t1 : t0;
        st->gpu_placed++;
    }
}

int ms_nccl_lane_link(ms_event *ev, size_t n, bool one_process, ms_nccl_link_stats *st) {
    ms_nccl_link_stats local;
    if (!st) st = &local;
    *st = (ms_nccl_link_stats){0};
    size_t n_coll = 0, n_nccl = 0;
    for (size_t i = 0; i < n; i++) {
        n_coll += ev[i].kind == MS_EV_COLL;
        n_nccl += ev[i].kind == MS_EV_NCCL;
    }
    if (!n_nccl) return 0;
    linker l = {.ev = ev, .one_process = one_process};
    l.refs = malloc(sizeof *l.refs * (n_coll ? n_coll : 1));
    if (!l.refs) return -1;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == MS_EV_COLL)
            l.refs[l.n_refs++] = (coll_ref){
                .key = one_process ? 0 : ev[i].rank, .idx = (uint32_t)i, .t0 = ev[i].t0_ns};
    qsort(l.refs, l.n_refs, sizeof *l.refs, cmp_ref);
    int rc = make_members(&l, n);
    if (rc == 0) {
        learn_owners(&l, n);
        link_records(&l, n, st);
        place_gpu(&l, n, st);
    }
    free(l.refs);
    free(l.m);
    return rc;
}

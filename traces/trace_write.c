/* trace_write.c - the Chrome/Kineto trace exporter (layout and promises in trace_write.h).
 *
 * Two passes over the events: first an index sorted by (rank, thread kind, group, start)
 * assigns every X event a thread (tid) so that no two events on one thread overlap; then the
 * events are written in their given order with hand-written number and string formatting
 * (printf costs about as much as everything else together at a million events).
 */
#include "traces/trace_write.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/io/fileio.h"

#define OUT_BUF (1u << 20)

/* Each enum the trace's args name, one table for the writer and the reader: the name of value
 * i is names[i]. */
static const char *const phase_names[] = {
    [MS_PHASE_FORWARD] = "forward", [MS_PHASE_BACKWARD] = "backward", [MS_PHASE_OTHER] = "other"};
static const char *const action_names[] = {[MS_PIPE_F] = "F", [MS_PIPE_B] = "B", [MS_PIPE_W] = "W"};
static const char *const timing_names[] = {"enqueue", "host", "gpu"}; /* ms_ev_nccl.timing */

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* names[v], or `otherwise` for a value out of range. */
static const char *name_of(const char *const *names, int n, int v, const char *otherwise) {
    return v >= 0 && v < n && names[v] ? names[v] : otherwise;
}

/* The value named s, or -1. */
static int value_of(const char *const *names, int n, const char *s) {
    for (int i = 0; s && i < n; i++)
        if (names[i] && !strcmp(s, names[i])) return i;
    return -1;
}

const char *ms_trace_phase_name(int phase) {
    return name_of(phase_names, COUNT_OF(phase_names), phase, "other");
}
int ms_trace_phase_parse(const char *s) {
    return value_of(phase_names, COUNT_OF(phase_names), s);
}
const char *ms_trace_pipe_action_name(int action) {
    return name_of(action_names, COUNT_OF(action_names), action, "?");
}
int ms_trace_pipe_action_parse(const char *s) {
    return value_of(action_names, COUNT_OF(action_names), s);
}
const char *ms_trace_nccl_timing_name(int timing) {
    return name_of(timing_names, COUNT_OF(timing_names), timing, timing_names[0]);
}
int ms_trace_nccl_timing_parse(const char *s) {
    return value_of(timing_names, COUNT_OF(timing_names), s);
}

void ms_trace_pipe_name(const ms_ev_pipe *p, char *out, size_t cap) {
    if (p->virtual_stages > 1)
        snprintf(out, cap, "%s%d.%d", ms_trace_pipe_action_name(p->action), (int)p->mb,
                 (int)p->chunk);
    else
        snprintf(out, cap, "%s%d", ms_trace_pipe_action_name(p->action), (int)p->mb);
}

/* --- buffered output ------------------------------------------------------------------ */

typedef struct outbuf {
    FILE *f;
    const char *path;
    char *buf;
    size_t len;
    ms_status st; /* the first failure; later writes are dropped */
    ms_error *err;
} outbuf;

static void ob_flush(outbuf *o) {
    if (o->st == MS_OK && o->len) o->st = ms_durable_fwrite(o->f, o->buf, o->len, o->path, o->err);
    o->len = 0;
}

/* Room for n more bytes (n <= OUT_BUF). */
static inline char *ob_room(outbuf *o, size_t n) {
    if (o->len + n > OUT_BUF) ob_flush(o);
    return o->buf + o->len;
}

static inline void put(outbuf *o, const char *s, size_t n) {
    if (n > OUT_BUF) {
        ob_flush(o);
        if (o->st == MS_OK) o->st = ms_durable_fwrite(o->f, s, n, o->path, o->err);
        return;
    }
    memcpy(ob_room(o, n), s, n);
    o->len += n;
}

/* Only for string literals (the "" forces one: sizeof of a pointer would be wrong). */
#define PUT_LIT(o, lit) put((o), "" lit, sizeof("" lit) - 1)

static inline void put_u64(outbuf *o, uint64_t v) {
    char tmp[24];
    int i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(o, tmp + i, sizeof tmp - (size_t)i);
}

static inline void put_i64(outbuf *o, int64_t v) {
    if (v < 0) {
        PUT_LIT(o, "-");
        put_u64(o, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(o, (uint64_t)v);
    }
}

/* Nanoseconds as microseconds: the integer part, then up to 3 decimals without trailing
 * zeros. Exact: the reader gets the same nanoseconds back. */
static void put_us(outbuf *o, int64_t ns) {
    uint64_t a = ns < 0 ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    if (ns < 0) PUT_LIT(o, "-");
    put_u64(o, a / 1000);
    unsigned frac = (unsigned)(a % 1000);
    if (!frac) return;
    char d[4] = {'.', (char)('0' + frac / 100), (char)('0' + frac / 10 % 10),
                 (char)('0' + frac % 10)};
    size_t n = 4;
    while (d[n - 1] == '0') n--;
    put(o, d, n);
}

/* A double: integers exactly as integers (the common case: flop and byte counts), others with
 * 17 significant digits (round-trips), non-finite values as null (JSON has no inf/nan). */
static void put_double(outbuf *o, double v) {
    if (!isfinite(v)) {
        PUT_LIT(o, "null");
    } else if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        put_i64(o, (int64_t)v);
    } else {
        char tmp[40];
        int n = snprintf(tmp, sizeof tmp, "%.17g", v);
        put(o, tmp, (size_t)n);
    }
}

/* Bytes as MiB with 7 decimals: exact enough that the reader rounds back to the same byte
 * count (7 decimals of a MiB are 0.1 byte). */
static void put_mib(outbuf *o, uint64_t bytes) {
    uint64_t whole = bytes >> 20, rem = bytes & ((1u << 20) - 1);
    uint64_t frac = (rem * 10000000u + (1u << 19)) >> 20; /* rounded to 7 decimals */
    if (frac == 10000000u) {
        whole++;
        frac = 0;
    }
    put_u64(o, whole);
    if (!frac) return;
    char d[8];
    d[0] = '.';
    for (int i = 7; i >= 1; i--) {
        d[i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    size_t n = 8;
    while (d[n - 1] == '0') n--;
    put(o, d, n);
}

/* Length of a valid UTF-8 sequence at s (at most n bytes), or 0 if it is not valid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (len > n) return 0;
    unsigned cp = c & (0xff >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return 0;
    return len;
}

/* A quoted JSON string from at most `max` bytes of s (fixed-size event fields need not be
 * NUL-terminated). Invalid UTF-8 (a name truncated inside a character) becomes U+FFFD, so
 * the file is always valid UTF-8. */
static void put_str(outbuf *o, const char *s, size_t max) {
    static const char hex[] = "0123456789abcdef";
    size_t n = strnlen(s, max);
    char *d = ob_room(o, n * 6 + 2);
    size_t k = 0;
    d[k++] = '"';
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            d[k++] = (char)c;
            i++;
        } else if (c == '"' || c == '\\') {
            d[k++] = '\\';
            d[k++] = (char)c;
            i++;
        } else if (c < 0x20) {
            memcpy(d + k, "\\u00", 4);
            d[k + 4] = hex[c >> 4];
            d[k + 5] = hex[c & 15];
            k += 6;
            i++;
        } else {
            size_t l = utf8_len(u + i, n - i);
            if (l) {
                memcpy(d + k, u + i, l);
                k += l;
                i += l;
            } else {
                memcpy(d + k, "\xef\xbf\xbd", 3);
                k += 3;
                i++;
            }
        }
    }
    d[k++] = '"';
    o->len += k;
}

/* --- thread assignment ------------------------------------------------------------------ */

/* LANE_HOST: the rank's host optimizer thread (offload), "optimizer (host)" */
enum {
    LANE_STEP,
    LANE_PIPE,
    LANE_COMPUTE,
    LANE_RESHARD,
    LANE_COMM,
    LANE_NCCL,
    LANE_GPU,
    LANE_HOST,
    LANE_NONE
};

/* GPU activity on a stream: a lane per (device, stream), as Kineto's "stream N" threads. */
static bool on_gpu_stream(const ms_event *e) {
    return e->kind == MS_EV_OP && (e->u.op.gpu == MS_GPU_KERNEL || e->u.op.gpu == MS_GPU_MEMCPY ||
                                   e->u.op.gpu == MS_GPU_MEMSET);
}
static int32_t gpu_lane_key(const ms_event *e) {
    return (int32_t)((e->u.op.device & 0x7f) << 24 | (e->u.op.stream & 0xffffff));
}

typedef struct item {
    int32_t rank, lane, group;
    uint32_t idx;
    int64_t t0, t1;
} item;

typedef struct thread_info {
    int32_t rank, tid, lane, group, track;
} thread_info;

static int lane_of(const ms_event *e) {
    switch (e->kind) {
        case MS_EV_STEP:
            return LANE_STEP;
        case MS_EV_PIPE:
            return LANE_PIPE;
        case MS_EV_OP:
            return on_gpu_stream(e) ? LANE_GPU : LANE_COMPUTE;
        case MS_EV_OPTIM:
            return e->u.op.host_optim ? LANE_HOST : LANE_COMPUTE;
        case MS_EV_DATA:
            return LANE_COMPUTE;
        case MS_EV_RESHARD:
            return LANE_RESHARD;
        case MS_EV_COLL:
            return LANE_COMM;
        case MS_EV_NCCL:
            return LANE_NCCL;
        default:
            return LANE_NONE;
    }
}

static int cmp_item(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->lane != y->lane) return x->lane < y->lane ? -1 : 1;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    /* the enclosing span first, so a call nested in an op spills, not the op */
    if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* First-fit track assignment: each event goes to the lowest-numbered track of its lane whose
 * last event has ended, so overlaps spill to extra tracks and the main track stays full. A
 * min-tree over the tracks' end times finds that track in O(log tracks), which keeps a
 * pathological input (a million overlapping events) from going quadratic. */
typedef struct tracks {
    int64_t *tree; /* [2 * cap], leaves at cap..2cap-1; unused leaves INT64_MAX */
    int n, cap;
} tracks;

static void tracks_set(tracks *t, int i, int64_t end) {
    int k = t->cap + i;
    t->tree[k] = end;
    for (k /= 2; k >= 1; k /= 2)
        t->tree[k] = t->tree[2 * k] < t->tree[2 * k + 1] ? t->tree[2 * k] : t->tree[2 * k + 1];
}

static bool tracks_grow(tracks *t) {
    int cap = t->cap ? t->cap * 2 : 8;
    int64_t *nt = malloc(sizeof *nt * 2 * (size_t)cap);
    if (!nt) return false;
    for (int i = 0; i < 2 * cap; i++) nt[i] = INT64_MAX;
    for (int i = 0; i < t->n; i++) nt[cap + i] = t->tree[t->cap + i];
    for (int k = cap - 1; k >= 1; k--)
        nt[k] = nt[2 * k] < nt[2 * k + 1] ? nt[2 * k] : nt[2 * k + 1];
    free(t->tree);
    t->tree = nt;
    t->cap = cap;
    return true;
}

/* The track for an event starting at t0, or -1 when out of memory. */
static int tracks_place(tracks *t, int64_t t0, int64_t t1) {
    int i;
    if (t->n && t->tree[1] <= t0) {
        int k = 1;
        while (k < t->cap) k = t->tree[2 * k] <= t0 ? 2 * k : 2 * k + 1;
        i = k - t->cap;
    } else {
        if (t->n == t->cap && !tracks_grow(t)) return -1;
        i = t->n++;
    }
    tracks_set(t, i, t1 > t0 ? t1 : t0);
    return i;
}

/* --- groups -------------------------------------------------------------------------- */

/* Groups sorted by id, for the lookup of every collective's group. */
typedef struct group_by_id {
    int32_t id;
    const ms_group *g;
} group_by_id;

static int cmp_group_by_id(const void *a, const void *b) {
    const group_by_id *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

typedef struct wctx {
    const char *path;
    const ms_event *ev;
    size_t n;
    const ms_group *groups;
    int n_groups;
    group_by_id *gsorted;
    const ms_trace_meta *meta;
    int64_t base;
    int world;
    int32_t *tid;         /* per event; 0 for counters */
    thread_info *threads; /* sorted by rank, tid */
    size_t n_threads;
    int32_t *ranks; /* distinct ranks with events, sorted */
    size_t n_ranks;
    item *reshards; /* (rank, flow) of each reshard, sorted */
    size_t n_reshards;
} wctx;

static const ms_group *find_group(const wctx *w, int32_t id) {
    size_t lo = 0, hi = (size_t)w->n_groups;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (w->gsorted[mid].id == id) return w->gsorted[mid].g;
        if (w->gsorted[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void put_group_ranks(outbuf *o, const ms_group *g) {
    PUT_LIT(o, "[");
    int k = g->size < MS_EV_GROUP_MAX ? g->size : MS_EV_GROUP_MAX;
    for (int i = 0; i < k; i++) {
        if (i) PUT_LIT(o, ",");
        put_i64(o, g->ranks[i]);
    }
    PUT_LIT(o, "]");
}

static void put_group_name(outbuf *o, const ms_group *g, int32_t id) {
    if (g && g->name[0]) {
        put_str(o, g->name, sizeof g->name);
    } else {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "group %d", (int)id);
        put_str(o, tmp, sizeof tmp);
    }
}

/* --- layout --------------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorting a million 32-byte items with qsort was a fifth of the export, and recorded events
 * are already in time order per rank: so items are bucketed by lane (stable), and only a
 * lane found out of time order is sorted. The result is the order of cmp_item. */
typedef struct lane_key {
    int32_t rank, lane, group;
    uint32_t count, start;
} lane_key;

static int cmp_lane_key(const void *a, const void *b) {
    const lane_key *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->lane != y->lane) return x->lane < y->lane ? -1 : 1;
    return x->group < y->group ? -1 : x->group > y->group;
}

static size_t lane_slot(const item *t, size_t mask) {
    uint64_t h = (uint64_t)(uint32_t)t->rank * 0x9e3779b97f4a7c15ull ^
                 (uint64_t)(uint32_t)t->group * 0xc2b2ae3d27d4eb4full ^ (uint64_t)t->lane;
    return (size_t)(h ^ (h >> 29)) & mask;
}

static bool sort_items(item **pit, size_t nx) {
    item *it = *pit;
    size_t cap = 64, nk = 0, kcap = 16;
    uint32_t *slot = malloc(sizeof *slot * cap), *bucket = malloc(sizeof *bucket * (nx ? nx : 1));
    lane_key *keys = malloc(sizeof *keys * kcap);
    item *out = malloc(sizeof *out * (nx ? nx : 1));
    bool ok = slot && bucket && keys && out;
    if (ok) memset(slot, 0xff, sizeof *slot * cap);
    for (size_t i = 0; ok && i < nx; i++) {
        size_t h = lane_slot(&it[i], cap - 1);
        while (slot[h] != UINT32_MAX) {
            const lane_key *k = &keys[slot[h]];
            if (k->rank == it[i].rank && k->lane == it[i].lane && k->group == it[i].group) break;
            h = (h + 1) & (cap - 1);
        }
        if (slot[h] == UINT32_MAX) {
            if (nk == kcap) {
                kcap *= 2;
                lane_key *nkeys = realloc(keys, sizeof *keys * kcap);
                if (!nkeys) {
                    ok = false;
                    break;
                }
                keys = nkeys;
            }
            keys[nk] = (lane_key){.rank = it[i].rank, .lane = it[i].lane, .group = it[i].group};
            slot[h] = (uint32_t)nk++;
            if (nk * 2 > cap) { /* grow and rehash */
                size_t ncap = cap * 4;
                uint32_t *ns = malloc(sizeof *ns * ncap);
                if (!ns) {
                    ok = false;
                    break;
                }
                memset(ns, 0xff, sizeof *ns * ncap);
                for (size_t k = 0; k < nk; k++) {
                    item probe = {
                        .rank = keys[k].rank, .lane = keys[k].lane, .group = keys[k].group};
                    size_t j = lane_slot(&probe, ncap - 1);
                    while (ns[j] != UINT32_MAX) j = (j + 1) & (ncap - 1);
                    ns[j] = (uint32_t)k;
                }
                free(slot);
                slot = ns;
                cap = ncap;
                h = SIZE_MAX;
            }
            if (h == SIZE_MAX) { /* find the new key again after the rehash */
                bucket[i] = (uint32_t)(nk - 1);
                keys[nk - 1].count++;
                continue;
            }
        }
        bucket[i] = slot[h];
        keys[slot[h]].count++;
    }
    if (ok) {
        /* Lanes in (rank, lane, group) order; each lane's items keep their given order. */
        lane_key *sorted = malloc(sizeof *sorted * (nk ? nk : 1));
        ok = sorted != NULL;
        if (ok) {
            memcpy(sorted, keys, sizeof *keys * nk);
            for (size_t k = 0; k < nk; k++) sorted[k].start = (uint32_t)k; /* remember the id */
            qsort(sorted, nk, sizeof *sorted, cmp_lane_key);
            uint32_t start = 0;
            for (size_t k = 0; k < nk; k++) {
                keys[sorted[k].start].start = start;
                start += sorted[k].count;
            }
            for (size_t i = 0; i < nx; i++) out[keys[bucket[i]].start++] = it[i];
            for (size_t k = 0, a = 0; k < nk; k++) {
                size_t b = a + sorted[k].count;
                bool in_order = true;
                for (size_t j = a + 1; j < b && in_order; j++)
                    in_order = cmp_item(&out[j - 1], &out[j]) < 0;
                if (!in_order) qsort(out + a, b - a, sizeof *out, cmp_item);
                a = b;
            }
        }
        free(sorted);
    }
    free(slot);
    free(bucket);
    free(keys);
    if (!ok) {
        free(out);
        return false;
    }
    free(it);
    *pit = out;
    return true;
}

/* The distinct ranks of the events, sorted: a bitmap for the usual small ranks. */
static bool distinct_ranks(wctx *w) {
    const ms_event *ev = w->ev;
    size_t n = w->n;
    enum { SMALL = 1 << 16 };
    bool small = true;
    for (size_t i = 0; i < n && small; i++) small = ev[i].rank >= 0 && ev[i].rank < SMALL;
    if (small) {
        uint8_t *seen = calloc(SMALL, 1);
        if (!seen) return false;
        for (size_t i = 0; i < n; i++) seen[ev[i].rank] = 1;
        for (int32_t r = 0; r < SMALL; r++)
            if (seen[r]) w->ranks[w->n_ranks++] = r;
        free(seen);
        return true;
    }
    for (size_t i = 0; i < n; i++) w->ranks[i] = ev[i].rank;
    qsort(w->ranks, n, sizeof *w->ranks, cmp_i32);
    size_t nr = 0;
    for (size_t i = 0; i < n; i++)
        if (!nr || w->ranks[nr - 1] != w->ranks[i]) w->ranks[nr++] = w->ranks[i];
    w->n_ranks = nr;
    return true;
}

static ms_status layout(wctx *w, ms_error *err) {
    const ms_event *ev = w->ev;
    size_t n = w->n, nx = 0;
    for (size_t i = 0; i < n; i++) nx += lane_of(&ev[i]) != LANE_NONE;
    item *it = malloc(sizeof *it * (nx ? nx : 1));
    w->tid = calloc(n ? n : 1, sizeof *w->tid);
    w->ranks = malloc(sizeof *w->ranks * (n ? n : 1));
    if (!it || !w->tid || !w->ranks) {
        free(it);
        return ms_fail(err, MS_ERR_NOMEM, "cannot allocate the index of %zu trace events", n);
    }
    size_t k = 0, nres = 0;
    for (size_t i = 0; i < n; i++) {
        int lane = lane_of(&ev[i]);
        if (lane == LANE_NONE) continue;
        nres += ev[i].kind == MS_EV_RESHARD;
        it[k++] = (item){.rank = ev[i].rank,
                         .lane = lane,
                         .group = lane == LANE_COMM  ? ev[i].u.coll.group
                                  : lane == LANE_GPU ? gpu_lane_key(&ev[i])
                                                     : 0,
                         .idx = (uint32_t)i,
                         .t0 = ev[i].t0_ns,
                         .t1 = ev[i].t1_ns};
    }
    if (!distinct_ranks(w) || !sort_items(&it, nx)) {
        free(it);
        return ms_fail(err, MS_ERR_NOMEM, "cannot allocate the index of %zu trace events", n);
    }
    tracks tr = {0};
    size_t tcap = 0;
    int32_t next_tid = 1, cur_rank = 0;
    ms_status st = MS_OK;
    for (size_t a = 0; a < nx;) {
        size_t b = a;
        while (b < nx && it[b].rank == it[a].rank && it[b].lane == it[a].lane &&
               it[b].group == it[a].group)
            b++;
        if (a == 0 || it[a].rank != cur_rank) {
            cur_rank = it[a].rank;
            next_tid = 1;
        }
        tr.n = 0;
        for (int i = 0; i < 2 * tr.cap; i++) tr.tree[i] = INT64_MAX;
        for (size_t j = a; j < b; j++) {
            int t = tracks_place(&tr, it[j].t0, it[j].t1);
            if (t < 0) {
                st = ms_fail(err, MS_ERR_NOMEM, "out of memory assigning trace threads");
                goto out;
            }
            w->tid[it[j].idx] = next_tid + t;
        }
        for (int t = 0; t < tr.n; t++) {
            if (w->n_threads == tcap) {
                tcap = tcap ? tcap * 2 : 64;
                thread_info *nt = realloc(w->threads, tcap * sizeof *nt);
                if (!nt) {
                    st = ms_fail(err, MS_ERR_NOMEM, "out of memory assigning trace threads");
                    goto out;
                }
                w->threads = nt;
            }
            w->threads[w->n_threads++] = (thread_info){.rank = it[a].rank,
                                                       .tid = next_tid + t,
                                                       .lane = it[a].lane,
                                                       .group = it[a].group,
                                                       .track = t};
        }
        next_tid += tr.n;
        a = b;
    }
    /* Reshards by (rank, flow), to link collectives to them. */
    w->reshards = malloc(sizeof *w->reshards * (nres ? nres : 1));
    if (!w->reshards) {
        st = ms_fail(err, MS_ERR_NOMEM, "out of memory indexing reshards");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind != MS_EV_RESHARD || ev[i].u.reshard.flow == 0) continue;
        w->reshards[w->n_reshards++] = (item){.rank = ev[i].rank,
                                              .idx = (uint32_t)i,
                                              .t0 = (int64_t)ev[i].u.reshard.flow,
                                              .t1 = (int64_t)i};
    }
    qsort(w->reshards, w->n_reshards, sizeof *w->reshards, cmp_item);
out:
    free(tr.tree);
    free(it);
    return st;
}

/* The reshard event a collective's flow points to, or -1. (Sorted by rank, then flow: t0.) */
static long find_reshard(const wctx *w, int32_t rank, uint64_t flow) {
    size_t lo = 0, hi = w->n_reshards;
    int64_t f = (int64_t)flow;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const item *r = &w->reshards[mid];
        if (r->rank < rank || (r->rank == rank && r->t0 < f))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < w->n_reshards && w->reshards[lo].rank == rank && w->reshards[lo].t0 == f)
        return (long)w->reshards[lo].idx;
    return -1;
}

/* --- writing ------------------------------------------------------------------------- */

static void put_header(outbuf *o, const wctx *w) {
    const ms_trace_meta *m = w->meta;
    const char *backend = m && m->backend ? m->backend : "threads";
    PUT_LIT(o, "{\"schemaVersion\":1,\n\"meshscope\":{\"format\":1,\"events\":");
    put_u64(o, w->n);
    PUT_LIT(o, "},\n\"deviceProperties\":[");
    for (int i = 0; m && m->devices && i < m->n_devices; i++) {
        const ms_trace_device *d = &m->devices[i];
        if (i) PUT_LIT(o, ",");
        PUT_LIT(o, "{\"id\":");
        put_i64(o, d->id);
        PUT_LIT(o, ",\"name\":");
        put_str(o, d->name ? d->name : "", 256);
        PUT_LIT(o, ",\"totalGlobalMem\":");
        put_u64(o, d->total_mem);
        PUT_LIT(o, ",\"computeMajor\":");
        put_i64(o, d->compute_major);
        PUT_LIT(o, ",\"computeMinor\":");
        put_i64(o, d->compute_minor);
        PUT_LIT(o, "}");
    }
    PUT_LIT(o, "],\n\"distributedInfo\":{\"backend\":");
    put_str(o, backend, 64);
    PUT_LIT(o, ",\"rank\":");
    put_i64(o, m ? m->rank : 0);
    PUT_LIT(o, ",\"world_size\":");
    put_i64(o, w->world);
    PUT_LIT(o, ",\"pg_count\":");
    put_i64(o, w->n_groups);
    PUT_LIT(o, ",\"pg_config\":[");
    char bc[80];
    snprintf(bc, sizeof bc, "cpu:%s", backend);
    for (int i = 0; i < w->n_groups; i++) {
        const ms_group *g = &w->groups[i];
        if (i) PUT_LIT(o, ",");
        PUT_LIT(o, "\n{\"pg_name\":");
        put_group_name(o, g, g->id);
        PUT_LIT(o, ",\"pg_desc\":");
        put_group_name(o, g, g->id);
        PUT_LIT(o, ",\"backend_config\":");
        put_str(o, bc, sizeof bc);
        PUT_LIT(o, ",\"pg_size\":");
        put_i64(o, g->size);
        PUT_LIT(o, ",\"ranks\":");
        put_group_ranks(o, g);
        PUT_LIT(o, ",\"pg_id\":");
        put_i64(o, g->id);
        PUT_LIT(o, "}");
    }
    PUT_LIT(o, "]},\n\"baseTimeNanoseconds\":");
    put_i64(o, w->base);
    PUT_LIT(o, ",\n\"displayTimeUnit\":\"ms\",\n\"traceEvents\":[\n");
}

static void thread_name(const wctx *w, const thread_info *t, char *out, size_t len) {
    static const char *const lane_names[] = {"steps", "pipeline", "compute", "reshard"};
    char base[48];
    if (t->lane == LANE_GPU) {
        snprintf(base, sizeof base, "GPU %d stream %d", (int)((uint32_t)t->group >> 24),
                 (int)(t->group & 0xffffff));
    } else if (t->lane == LANE_HOST) {
        snprintf(base, sizeof base, "optimizer (host)");
    } else if (t->lane == LANE_NCCL) {
        snprintf(base, sizeof base, "NCCL (plugin)");
    } else if (t->lane == LANE_COMM) {
        const ms_group *g = find_group(w, t->group);
        if (g && g->name[0])
            snprintf(base, sizeof base, "comm: %.*s", (int)sizeof g->name, g->name);
        else
            snprintf(base, sizeof base, "comm: group %d", (int)t->group);
    } else {
        snprintf(base, sizeof base, "%s", lane_names[t->lane]);
    }
    if (t->track)
        snprintf(out, len, "%s #%d", base, t->track + 1);
    else
        snprintf(out, len, "%s", base);
}

/* M events: a name and sort index per rank (process) and per thread. */
static void put_metadata(outbuf *o, const wctx *w, bool *first) {
    char name[80];
    for (size_t r = 0; r < w->n_ranks; r++) {
        int32_t rank = w->ranks[r];
        if (!*first) PUT_LIT(o, ",\n");
        *first = false;
        PUT_LIT(o, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
        put_i64(o, rank);
        snprintf(name, sizeof name, "rank %d", (int)rank);
        PUT_LIT(o, ",\"tid\":0,\"args\":{\"name\":");
        put_str(o, name, sizeof name);
        PUT_LIT(o, "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":");
        put_i64(o, rank);
        PUT_LIT(o, ",\"tid\":0,\"args\":{\"sort_index\":");
        put_i64(o, rank);
        PUT_LIT(o, "}}");
    }
    for (size_t i = 0; i < w->n_threads; i++) {
        const thread_info *t = &w->threads[i];
        thread_name(w, t, name, sizeof name);
        PUT_LIT(o, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":");
        put_i64(o, t->rank);
        PUT_LIT(o, ",\"tid\":");
        put_i64(o, t->tid);
        PUT_LIT(o, ",\"args\":{\"name\":");
        put_str(o, name, sizeof name);
        PUT_LIT(o, "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":");
        put_i64(o, t->rank);
        PUT_LIT(o, ",\"tid\":");
        put_i64(o, t->tid);
        PUT_LIT(o, ",\"args\":{\"sort_index\":");
        put_i64(o, t->tid);
        PUT_LIT(o, "}}");
    }
}

/* "pid":R,"tid":T,"ts":...,"dur":... */
static void put_place(outbuf *o, const ms_event *e, int32_t tid, int64_t base) {
    PUT_LIT(o, ",\"pid\":");
    put_i64(o, e->rank);
    PUT_LIT(o, ",\"tid\":");
    put_i64(o, tid);
    PUT_LIT(o, ",\"ts\":");
    put_us(o, e->t0_ns - base);
    PUT_LIT(o, ",\"dur\":");
    put_us(o, e->t1_ns > e->t0_ns ? e->t1_ns - e->t0_ns : 0);
}

static void put_step_phase(outbuf *o, const ms_event *e) {
    PUT_LIT(o, ",\"step\":");
    put_i64(o, e->step);
    PUT_LIT(o, ",\"phase\":\"");
    const char *p = ms_trace_phase_name(e->phase);
    put(o, p, strlen(p));
    PUT_LIT(o, "\"}}");
}

/* Input and output element counts for Kineto's args, from the nccl-tests byte convention
 * (comm.h): all-gather counts the gathered output, reduce-scatter the input. */
/* Kineto's names for the element types (PyTorch's scalar type names). */
static const char *coll_dtype_name(const ms_ev_coll *c) {
    return c->dtype == MS_COMM_BF16 ? "BFloat16" : c->dtype == MS_COMM_BYTES ? "Byte" : "Float";
}

static void coll_nelems(const ms_ev_coll *c, uint64_t *in, uint64_t *out) {
    size_t elt = ms_comm_dtype_size((ms_comm_dtype)c->dtype);
    uint64_t total = c->bytes / (elt ? elt : 4),
             n = c->group_size > 0 ? (uint64_t)c->group_size : 1;
    *in = *out = total;
    if (c->coll == MS_COLL_ALL_GATHER) *in = total / n;
    if (c->coll == MS_COLL_REDUCE_SCATTER) *out = total / n;
}

/* GPU activity in Kineto's categories: kernels, copies and memsets on their stream's thread,
 * runtime and driver calls on the host's; the correlation id in args (and in the flows). */
static void put_gpu_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    const ms_ev_op *op = &e->u.op;
    static const char *const cats[] = {[MS_GPU_KERNEL] = "kernel",
                                       [MS_GPU_MEMCPY] = "gpu_memcpy",
                                       [MS_GPU_MEMSET] = "gpu_memset",
                                       [MS_GPU_API] = "cuda_runtime"};
    const char *cat =
        op->gpu < sizeof cats / sizeof *cats && cats[op->gpu] ? cats[op->gpu] : "cuda_runtime";
    if (op->gpu == MS_GPU_API && !strcmp(op->opname, "cuda_driver")) cat = "cuda_driver";
    PUT_LIT(o, "{\"ph\":\"X\",\"cat\":");
    put_str(o, cat, 16);
    PUT_LIT(o, ",\"name\":");
    put_str(o, op->name[0] ? op->name : op->opname,
            op->name[0] ? sizeof op->name : sizeof op->opname);
    put_place(o, e, w->tid[i], w->base);
    PUT_LIT(o, ",\"args\":{\"op\":");
    put_str(o, op->opname, sizeof op->opname);
    PUT_LIT(o, ",\"correlation\":");
    put_u64(o, op->corr);
    if (on_gpu_stream(e)) {
        PUT_LIT(o, ",\"device\":");
        put_u64(o, op->device);
        PUT_LIT(o, ",\"stream\":");
        put_u64(o, op->stream);
    }
    if (op->bytes > 0) {
        PUT_LIT(o, ",\"bytes\":");
        put_double(o, op->bytes);
    }
    put_step_phase(o, e);
}

/* NCCL's view of a call (its profiler plugin): cat "nccl", named by NCCL's function. */
static void put_nccl_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    const ms_ev_nccl *c = &e->u.nccl;
    char hex[24];
    snprintf(hex, sizeof hex, "0x%016llx", (unsigned long long)c->comm_id);
    PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"nccl\",\"name\":");
    put_str(o, c->func[0] ? c->func : "nccl", sizeof c->func);
    put_place(o, e, w->tid[i], w->base);
    PUT_LIT(o, ",\"args\":{\"func\":");
    put_str(o, c->func, sizeof c->func);
    PUT_LIT(o, ",\"algorithm\":");
    put_str(o, c->algo, sizeof c->algo);
    PUT_LIT(o, ",\"protocol\":");
    put_str(o, c->proto, sizeof c->proto);
    PUT_LIT(o, ",\"channels\":");
    put_i64(o, c->channels);
    PUT_LIT(o, ",\"count\":");
    put_u64(o, c->count);
    PUT_LIT(o, ",\"dtype\":");
    put_str(o, c->dtype, sizeof c->dtype);
    PUT_LIT(o, ",\"peer\":");
    put_i64(o, c->peer);
    PUT_LIT(o, ",\"seq\":");
    put_u64(o, c->seq);
    if (c->p2p && c->is_send) PUT_LIT(o, ",\"p2p\":\"send\"");
    if (c->p2p && !c->is_send) PUT_LIT(o, ",\"p2p\":\"recv\"");
    if (c->coll != UINT8_MAX) {
        PUT_LIT(o, ",\"collective\":");
        put_str(o, ms_coll_name((ms_coll_kind)c->coll), 32);
    }
    PUT_LIT(o, ",\"timing\":");
    put_str(o, ms_trace_nccl_timing_name(c->timing), 8);
    PUT_LIT(o, ",\"comm id\":");
    put_str(o, hex, sizeof hex);
    PUT_LIT(o, ",\"comm rank\":");
    put_i64(o, c->comm_rank);
    PUT_LIT(o, ",\"nranks\":");
    put_i64(o, c->nranks);
    PUT_LIT(o, ",\"enqueued ns\":");
    put_i64(o, c->enqueued_ns);
    if (c->timing == 2) {
        PUT_LIT(o, ",\"gpu start ns\":");
        put_u64(o, c->gpu_t0);
        PUT_LIT(o, ",\"gpu end ns\":");
        put_u64(o, c->gpu_t1);
    }
    if (c->host_t1) {
        PUT_LIT(o, ",\"host start us\":");
        put_us(o, c->host_t0 - w->base);
        PUT_LIT(o, ",\"host end us\":");
        put_us(o, c->host_t1 - w->base);
    }
    PUT_LIT(o, ",\"linked\":");
    put_i64(o, c->linked);
    if (c->linked) {
        PUT_LIT(o, ",\"ms group id\":");
        put_i64(o, c->ms_group);
        PUT_LIT(o, ",\"ms seq\":");
        put_i64(o, c->ms_seq);
    }
    put_step_phase(o, e);
}

/* A step: a slice named as the PyTorch profiler names its steps. */
static void put_step_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"ProfilerStep#");
    put_i64(o, e->step);
    PUT_LIT(o, "\"");
    put_place(o, e, w->tid[i], w->base);
    PUT_LIT(o, ",\"args\":{\"kind\":\"step\"");
    put_step_phase(o, e);
}

/* An operator, data loading or the optimizer: a CPU slice (GPU work has its own). */
static void put_op_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    const ms_ev_op *op = &e->u.op;
    if (e->kind == MS_EV_OP && op->gpu != MS_GPU_NONE) {
        put_gpu_event(o, w, i);
        return;
    }
    if (e->kind == MS_EV_OP)
        PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":");
    else if (e->kind == MS_EV_DATA)
        PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"data\",\"name\":");
    else
        PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"optimizer\",\"name\":");
    /* A slice needs a visible name; "node" keeps an empty one for the round trip. */
    bool unnamed = !op->name[0];
    const char *shown = !unnamed                 ? op->name
                        : op->opname[0]          ? op->opname
                        : e->kind == MS_EV_DATA  ? "data"
                        : e->kind == MS_EV_OPTIM ? "optimizer"
                                                 : "op";
    put_str(o, shown, unnamed ? sizeof op->opname : sizeof op->name);
    put_place(o, e, w->tid[i], w->base);
    PUT_LIT(o, ",\"args\":{\"op\":");
    put_str(o, op->opname, sizeof op->opname);
    if (unnamed) PUT_LIT(o, ",\"node\":\"\"");
    PUT_LIT(o, ",\"op id\":");
    put_i64(o, op->op);
    PUT_LIT(o, ",\"flops\":");
    put_double(o, op->flops);
    PUT_LIT(o, ",\"bytes\":");
    put_double(o, op->bytes);
    if (op->corr) {
        PUT_LIT(o, ",\"correlation\":");
        put_u64(o, op->corr);
    }
    if (op->host_optim) PUT_LIT(o, ",\"host\":1");
    put_step_phase(o, e);
}

/* A collective, with the fields Holistic Trace Analysis reads. */
static void put_coll_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    const ms_ev_coll *c = &e->u.coll;
    const ms_group *g = find_group(w, c->group);
    const char *cn = c->recv ? "recv" : ms_coll_name((ms_coll_kind)c->coll);
    PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":");
    put_str(o, cn, 32);
    put_place(o, e, w->tid[i], w->base);
    PUT_LIT(o, ",\"args\":{\"Collective name\":");
    put_str(o, cn, 32);
    uint64_t in, out;
    coll_nelems(c, &in, &out);
    PUT_LIT(o, ",\"In msg nelems\":");
    put_u64(o, in);
    PUT_LIT(o, ",\"Out msg nelems\":");
    put_u64(o, out);
    PUT_LIT(o, ",\"Group size\":");
    put_i64(o, c->group_size);
    PUT_LIT(o, ",\"dtype\":");
    put_str(o, coll_dtype_name(c), 16);
    PUT_LIT(o, ",\"Process Group Ranks\":");
    if (g)
        put_group_ranks(o, g);
    else
        PUT_LIT(o, "[]");
    PUT_LIT(o, ",\"Process Group Name\":");
    put_group_name(o, g, c->group);
    PUT_LIT(o, ",\"bytes\":");
    put_u64(o, c->bytes);
    PUT_LIT(o, ",\"seq\":");
    put_i64(o, c->seq);
    PUT_LIT(o, ",\"algorithm\":");
    put_str(o, c->algo, sizeof c->algo);
    PUT_LIT(o, ",\"mesh dim\":");
    put_i64(o, c->mesh_dim);
    PUT_LIT(o, ",\"reduce\":");
    put_str(o, ms_reduce_op_name((ms_reduce_op)c->reduce), 16);
    PUT_LIT(o, ",\"group id\":");
    put_i64(o, c->group);
    PUT_LIT(o, ",\"group rank\":");
    put_i64(o, c->group_rank);
    PUT_LIT(o, ",\"flow\":");
    put_u64(o, c->flow);
    if (c->coll == MS_COLL_BROADCAST) {
        PUT_LIT(o, ",\"root\":");
        put_i64(o, c->root);
    }
    if (c->async) {
        PUT_LIT(o, ",\"async\":1,\"queued ns\":");
        put_i64(o, c->queued_ns);
    }
    put_step_phase(o, e);
}

/* A reshard: its tensor, placements and bytes. */
static void put_reshard_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    const ms_ev_reshard *r = &e->u.reshard;
    PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"reshard\",\"name\":");
    if (r->tensor[0])
        put_str(o, r->tensor, sizeof r->tensor);
    else
        PUT_LIT(o, "\"reshard\"");
    put_place(o, e, w->tid[i], w->base);
    PUT_LIT(o, ",\"args\":{\"tensor\":");
    put_str(o, r->tensor, sizeof r->tensor);
    PUT_LIT(o, ",\"from\":");
    put_str(o, r->from, sizeof r->from);
    PUT_LIT(o, ",\"to\":");
    put_str(o, r->to, sizeof r->to);
    PUT_LIT(o, ",\"bytes\":");
    put_u64(o, r->bytes);
    PUT_LIT(o, ",\"steps\":");
    put_i64(o, r->nsteps);
    PUT_LIT(o, ",\"flow\":");
    put_u64(o, r->flow);
    put_step_phase(o, e);
}

/* A pipeline action: F, B or W of one micro-batch on one stage. */
static void put_pipe_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    const ms_ev_pipe *pp = &e->u.pipe;
    char name[48];
    ms_trace_pipe_name(pp, name, sizeof name);
    PUT_LIT(o, "{\"ph\":\"X\",\"cat\":\"pipeline\",\"name\":");
    put_str(o, name, sizeof name);
    put_place(o, e, w->tid[i], w->base);
    PUT_LIT(o, ",\"args\":{\"action\":");
    put_str(o, ms_trace_pipe_action_name(pp->action), 4);
    PUT_LIT(o, ",\"stage\":");
    put_i64(o, pp->stage);
    PUT_LIT(o, ",\"micro-batch\":");
    put_i64(o, pp->mb);
    PUT_LIT(o, ",\"chunk\":");
    put_i64(o, pp->chunk);
    PUT_LIT(o, ",\"model chunk\":");
    put_i64(o, pp->model_chunk);
    if (pp->cpu_ns > 0) {
        PUT_LIT(o, ",\"cpu ns\":");
        put_i64(o, pp->cpu_ns);
    }
    PUT_LIT(o, ",\"stages\":");
    put_i64(o, pp->stages);
    PUT_LIT(o, ",\"virtual stages\":");
    put_i64(o, pp->virtual_stages);
    PUT_LIT(o, ",\"micro-batches\":");
    put_i64(o, pp->micro_batches);
    PUT_LIT(o, ",\"schedule\":");
    put_str(o, pp->schedule, sizeof pp->schedule);
    put_step_phase(o, e);
}

/* A memory sample: a counter track. */
static void put_mem_event(outbuf *o, const wctx *w, size_t i) {
    const ms_event *e = &w->ev[i];
    PUT_LIT(o, "{\"ph\":\"C\",\"cat\":\"memory\",\"name\":\"memory\",\"pid\":");
    put_i64(o, e->rank);
    PUT_LIT(o, ",\"ts\":");
    put_us(o, e->t0_ns - w->base);
    PUT_LIT(o, ",\"args\":{\"in_use_MiB\":");
    put_mib(o, e->u.mem.in_use);
    PUT_LIT(o, ",\"peak_MiB\":");
    put_mib(o, e->u.mem.peak);
    if (e->u.mem.params | e->u.mem.grads | e->u.mem.optim | e->u.mem.acts) {
        PUT_LIT(o, ",\"params_MiB\":");
        put_mib(o, e->u.mem.params);
        PUT_LIT(o, ",\"grads_MiB\":");
        put_mib(o, e->u.mem.grads);
        PUT_LIT(o, ",\"optimizer_MiB\":");
        put_mib(o, e->u.mem.optim);
        PUT_LIT(o, ",\"activations_MiB\":");
        put_mib(o, e->u.mem.acts);
    }
    if (e->u.mem.host_optim) { /* offload: host memory, apart from the device's */
        PUT_LIT(o, ",\"host_optimizer_MiB\":");
        put_mib(o, e->u.mem.host_optim);
    }
    PUT_LIT(o, "}}");
}

static void put_event(outbuf *o, const wctx *w, size_t i) {
    switch (w->ev[i].kind) {
        case MS_EV_STEP:
            put_step_event(o, w, i);
            return;
        case MS_EV_OP:
        case MS_EV_DATA:
        case MS_EV_OPTIM:
            put_op_event(o, w, i);
            return;
        case MS_EV_COLL:
            put_coll_event(o, w, i);
            return;
        case MS_EV_RESHARD:
            put_reshard_event(o, w, i);
            return;
        case MS_EV_PIPE:
            put_pipe_event(o, w, i);
            return;
        case MS_EV_NCCL:
            put_nccl_event(o, w, i);
            return;
        case MS_EV_MEM:
            put_mem_event(o, w, i);
            return;
        default:
            return; /* unreachable: ms_trace_write rejects unknown kinds first */
    }
}

/* One end of a flow arrow at slice k's start: "s" (the source) or "f" with "bp": "e" (binding
 * the destination slice); cat is also the flow's name. */
static void put_flow_end(outbuf *o, const wctx *w, bool start, const char *cat, uint64_t id,
                         size_t k) {
    const ms_event *e = &w->ev[k];
    if (start)
        PUT_LIT(o, "{\"ph\":\"s\",\"cat\":");
    else
        PUT_LIT(o, "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":");
    put_str(o, cat, 16);
    PUT_LIT(o, ",\"name\":");
    put_str(o, cat, 16);
    PUT_LIT(o, ",\"id\":");
    put_u64(o, id);
    PUT_LIT(o, ",\"pid\":");
    put_i64(o, e->rank);
    PUT_LIT(o, ",\"tid\":");
    put_i64(o, w->tid[k]);
    PUT_LIT(o, ",\"ts\":");
    put_us(o, e->t0_ns - w->base);
    PUT_LIT(o, "}");
}

static void put_flow(outbuf *o, const wctx *w, const char *cat, uint64_t id, size_t src,
                     size_t dst) {
    put_flow_end(o, w, true, cat, id, src);
    PUT_LIT(o, ",\n");
    put_flow_end(o, w, false, cat, id, dst);
}

/* One flow per (reshard, collective) pair: from the reshard's start to the collective. */
static void put_flows(outbuf *o, const wctx *w, bool *first) {
    uint64_t id = 0;
    for (size_t i = 0; i < w->n; i++) {
        const ms_event *c = &w->ev[i];
        if (c->kind != MS_EV_COLL || c->u.coll.flow == 0) continue;
        long r = find_reshard(w, c->rank, c->u.coll.flow);
        if (r < 0) continue; /* the reshard was not recorded (dropped from the ring) */
        if (!*first) PUT_LIT(o, ",\n");
        *first = false;
        put_flow(o, w, "reshard", ++id, (size_t)r, i);
    }
}

/* Engine ops that launched GPU work, by (rank, correlation id): t0 holds the id, idx the event. */
static int cmp_corr(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* Flow ids are shared by every flow of a file: the reshard flows count from 1, these are the
 * correlation ids (below 2^48) moved above them, still exact in a double. */
#define AC2G_ID(corr) ((corr) + ((uint64_t)1 << 52))

/* One "ac2g" flow (Kineto's launch-to-GPU arrow) from each engine op to each piece of GPU work
 * it launched: "s" at the op's start, "f" binding the kernel's slice. */
static void put_gpu_flows(outbuf *o, const wctx *w, bool *first) {
    size_t n = 0;
    for (size_t i = 0; i < w->n; i++)
        n += w->ev[i].kind == MS_EV_OP && w->ev[i].u.op.gpu == MS_GPU_NONE && w->ev[i].u.op.corr;
    if (!n) return;
    item *ops = malloc(sizeof *ops * n);
    if (!ops) return; /* the trace stays valid without the arrows */
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        const ms_event *e = &w->ev[i];
        if (e->kind == MS_EV_OP && e->u.op.gpu == MS_GPU_NONE && e->u.op.corr)
            ops[k++] = (item){.rank = e->rank, .idx = (uint32_t)i, .t0 = (int64_t)e->u.op.corr};
    }
    qsort(ops, n, sizeof *ops, cmp_corr);
    for (size_t i = 0; i < w->n; i++) {
        const ms_event *g = &w->ev[i];
        if (!on_gpu_stream(g) || !g->u.op.corr) continue;
        item key = {.rank = MS_EV_CORR_RANK(g->u.op.corr), .t0 = (int64_t)g->u.op.corr};
        const item *hit = bsearch(&key, ops, n, sizeof *ops, cmp_corr);
        if (!hit) continue; /* the op was not recorded (dropped from its ring) */
        if (!*first) PUT_LIT(o, ",\n");
        *first = false;
        put_flow(o, w, "ac2g", AC2G_ID(g->u.op.corr), hit->idx, i);
    }
    free(ops);
}

static ms_status write_body(FILE *f, void *arg, ms_error *err) {
    wctx *w = arg;
    outbuf o = {.f = f, .path = w->path, .err = err};
    o.buf = malloc(OUT_BUF);
    if (!o.buf) return ms_fail(err, MS_ERR_NOMEM, "cannot allocate the output buffer");
    put_header(&o, w);
    bool first = true;
    put_metadata(&o, w, &first);
    for (size_t i = 0; i < w->n && o.st == MS_OK; i++) {
        if (!first) PUT_LIT(&o, ",\n");
        first = false;
        put_event(&o, w, i);
    }
    put_flows(&o, w, &first);
    put_gpu_flows(&o, w, &first);
    PUT_LIT(&o, "\n]}\n");
    ob_flush(&o);
    free(o.buf);
    return o.st;
}

ms_status ms_trace_write(const char *path, const ms_event *ev, size_t n, const ms_group *groups,
                         int n_groups, const ms_trace_meta *meta, ms_error *err) {
    if (!path || !*path) return ms_fail(err, MS_ERR_INVALID, "trace write: no output path given");
    if ((n && !ev) || n_groups < 0 || (n_groups && !groups))
        return ms_fail(err, MS_ERR_INVALID, "%s: trace write: bad event or group arguments", path);
    if (n > UINT32_MAX)
        return ms_fail(err, MS_ERR_INVALID, "%s: trace write: %zu events is more than 2^32", path,
                       n);
    wctx w = {.path = path, .ev = ev, .n = n, .groups = groups, .n_groups = n_groups, .meta = meta};
    int32_t max_rank = -1;
    int64_t base = INT64_MAX;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind >= MS_EV_KIND_COUNT)
            return ms_fail(err, MS_ERR_INVALID, "%s: trace write: event %zu has unknown kind %d",
                           path, i, ev[i].kind);
        if (ev[i].rank > max_rank) max_rank = ev[i].rank;
        if (ev[i].t0_ns < base) base = ev[i].t0_ns;
    }
    w.base = meta && meta->has_base ? meta->base_ns : n ? base : 0;
    w.world = meta && meta->world_size > 0 ? meta->world_size : max_rank + 1 > 0 ? max_rank + 1 : 1;
    w.gsorted = malloc(sizeof *w.gsorted * (size_t)(n_groups ? n_groups : 1));
    if (!w.gsorted) return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n_groups; i++)
        w.gsorted[i] = (group_by_id){.id = groups[i].id, .g = &groups[i]};
    qsort(w.gsorted, (size_t)n_groups, sizeof *w.gsorted, cmp_group_by_id);
    ms_status st = layout(&w, err);
    if (st != MS_OK) {
        ms_fail_wrap(err, st, "%s", path);
    } else {
        st = ms_write_file_durable(path, write_body, &w, err);
    }
    free(w.gsorted);
    free(w.tid);
    free(w.threads);
    free(w.ranks);
    free(w.reshards);
    return st;
}

/* trace_check.c - the Trace Event Format validator (rules in trace_check.h).
 *
 * Per-event rules run while streaming; rules that relate events (overlap, B/E pairing,
 * flows) keep a compact record per relevant event and are checked by sorting afterwards,
 * which needs no per-thread hash tables and handles events in any file order.
 */
#include "traces/trace_check.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "traces/trace_json.h"
#include "traces/trace_write.h"

/* An X slice, a B/E event or a flow event, as the cross-event rules need it. */
typedef struct rec {
    int64_t pid, tid;
    int64_t t0, t1; /* X: [t0, t1]; B/E: t0 = ts; flows: t0 = key hash */
    uint64_t name;  /* B/E: hash of the name (0: none); flows: 's', 't' or 'f' */
    size_t index;
} rec;

typedef struct vec {
    rec *v;
    size_t n, cap;
} vec;

typedef struct cctx {
    const char *name;
    vec x, be, flow;
    size_t n;
    size_t bad;     /* the event a per-event rule rejected, or SIZE_MAX */
    bool meshscope; /* a "meshscope" object came before traceEvents: its own rules apply */
} cctx;

static ms_status push(cctx *c, vec *v, rec r, ms_error *err) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        rec *nv = realloc(v->v, cap * sizeof *nv);
        if (!nv) return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", c->name);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = r;
    return MS_OK;
}

static uint64_t fnv(uint64_t h, const char *s) {
    for (; s && *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

#define BAD(...) ms_fail(err, MS_ERR_INVALID, __VA_ARGS__)

/* A per-event violation: "x.json: event 12 (byte 3456): <what>". Formatted only on failure:
 * formatting the prefix for every event cost as much as checking it. */
static ms_status ev_fail(const cctx *c, size_t index, uint64_t off, ms_error *err, const char *fmt,
                         ...) __attribute__((format(printf, 5, 6)));
static ms_status ev_fail(const cctx *c, size_t index, uint64_t off, ms_error *err, const char *fmt,
                         ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ms_fail(err, MS_ERR_INVALID, "%s: event %zu (byte %llu): %s", c->name, index,
                   (unsigned long long)off, what);
}
#define EVBAD(...) ev_fail(c, index, off, err, __VA_ARGS__)

static bool want_meta(void *user, const char *key) {
    (void)user;
    return !strcmp(key, "displayTimeUnit") || !strcmp(key, "meshscope");
}

static ms_status on_meta(void *user, const char *key, const tj_doc *d, int root, ms_error *err) {
    cctx *c = user;
    if (!strcmp(key, "meshscope")) {
        c->meshscope = tj_type_of(d, root) == TJ_OBJ;
        return MS_OK;
    }
    const char *u = tj_str(d, root);
    if (!u || (strcmp(u, "ms") && strcmp(u, "ns")))
        return BAD("%s: displayTimeUnit must be \"ms\" or \"ns\"", c->name);
    return MS_OK;
}

static bool is_phase(const char *ph) {
    static const char *const known[] = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f",
                                        "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(ph, known[i])) return true;
    return false;
}

/* Text of a number or string node, for hashing ids. */
static const char *id_text(const tj_doc *d, int node) {
    int t = tj_type_of(d, node);
    if (t == TJ_STR) return tj_str(d, node);
    if (t == TJ_NUM) return d->pool + d->nodes[node].text;
    return NULL;
}

static ms_status check_meta_event(cctx *c, size_t index, uint64_t off, const tj_doc *d, int root,
                                  ms_error *err) {
    const char *name = tj_str(d, tj_get(d, root, "name"));
    int args = tj_get(d, root, "args");
    if (!name) return EVBAD("M event has no string \"name\"");
    bool thread = !strcmp(name, "thread_name") || !strcmp(name, "thread_sort_index");
    if (thread && tj_get(d, root, "tid") < 0) return EVBAD("M event %s needs a \"tid\"", name);
    if (!strcmp(name, "process_name") || !strcmp(name, "thread_name")) {
        if (!tj_str(d, tj_get(d, args, "name")))
            return EVBAD("M event %s needs a string args.name", name);
    } else if (!strcmp(name, "process_labels")) {
        if (!tj_str(d, tj_get(d, args, "labels")))
            return EVBAD("M event process_labels needs a string args.labels");
    } else if (!strcmp(name, "process_sort_index") || !strcmp(name, "thread_sort_index")) {
        int64_t v;
        if (!tj_int(d, tj_get(d, args, "sort_index"), INT64_MIN, INT64_MAX, &v))
            return EVBAD("M event %s needs an integer args.sort_index", name);
    } else {
        char safe[MS_SAFE_LEN];
        return EVBAD("unknown metadata event name \"%s\" (known: process_name, "
                     "process_labels, process_sort_index, thread_name, thread_sort_index)",
                     ms_safe_str(safe, 64, name));
    }
    return MS_OK;
}

/* An integer arg of a pipeline slice, or a violation naming it. */
static ms_status pipe_int(const cctx *c, size_t index, uint64_t off, const tj_doc *d, int args,
                          const char *key, int64_t lo, int64_t hi, int64_t *out, ms_error *err) {
    if (!tj_int(d, tj_get(d, args, key), lo, hi, out))
        return EVBAD("pipeline slice needs an integer args.\"%s\" in [%lld, %lld]", key,
                     (long long)lo, (long long)hi);
    return MS_OK;
}

/* meshscope's pipeline slices (cat "pipeline"): one action of one micro-batch on one chunk of
 * one stage, consistent with the schedule it names (trace_check.h lists the rules). */
static ms_status pipe_rules(const cctx *c, size_t index, uint64_t off, const tj_doc *d, int root,
                            ms_error *err) {
    int args = tj_get(d, root, "args");
    if (tj_type_of(d, args) != TJ_OBJ) return EVBAD("pipeline slice needs an \"args\" object");
    int action = ms_trace_pipe_action_parse(tj_str(d, tj_get(d, args, "action")));
    if (action < 0) return EVBAD("pipeline slice's args.action must be \"F\", \"B\" or \"W\"");
    int64_t p, v, m, stage, mb, chunk, model_chunk;
    MS_CHECK(pipe_int(c, index, off, d, args, "stages", 1, INT16_MAX, &p, err));
    MS_CHECK(pipe_int(c, index, off, d, args, "virtual stages", 1, UINT8_MAX + 1, &v, err));
    MS_CHECK(pipe_int(c, index, off, d, args, "micro-batches", 1, INT32_MAX, &m, err));
    MS_CHECK(pipe_int(c, index, off, d, args, "stage", 0, p - 1, &stage, err));
    MS_CHECK(pipe_int(c, index, off, d, args, "micro-batch", 0, m - 1, &mb, err));
    MS_CHECK(pipe_int(c, index, off, d, args, "chunk", 0, v - 1, &chunk, err));
    MS_CHECK(pipe_int(c, index, off, d, args, "model chunk", 0, INT32_MAX, &model_chunk, err));
    if (model_chunk != chunk * p + stage)
        return EVBAD("pipeline slice's model chunk %lld is not chunk * stages + stage = %lld",
                     (long long)model_chunk, (long long)(chunk * p + stage));
    const char *sched = tj_str(d, tj_get(d, args, "schedule"));
    if (!sched || !*sched) return EVBAD("pipeline slice needs a string args.schedule");
    char safe[MS_SAFE_LEN];
    if (action == MS_PIPE_W && strcmp(sched, "zb-h1"))
        return EVBAD("pipeline slice W (a weight gradient of its own) under schedule \"%s\": "
                     "only zb-h1 splits W from B",
                     ms_safe_str(safe, 32, sched));
    const char *phase = tj_str(d, tj_get(d, args, "phase"));
    const char *want = action == MS_PIPE_F ? "forward" : "backward";
    if (!phase || strcmp(phase, want))
        return EVBAD("pipeline slice %s needs args.phase \"%s\"", ms_trace_pipe_action_name(action),
                     want);
    ms_ev_pipe ev = {.action = (uint8_t)action,
                     .chunk = (uint8_t)chunk,
                     .mb = (int32_t)mb,
                     .virtual_stages = (int16_t)v};
    char name[48];
    ms_trace_pipe_name(&ev, name, sizeof name);
    const char *got = tj_str(d, tj_get(d, root, "name"));
    if (!got || strcmp(got, name))
        return EVBAD("pipeline slice's name must be \"%s\" (action, micro-batch%s), not \"%s\"",
                     name, v > 1 ? ", chunk" : "", got ? ms_safe_str(safe, 48, got) : "");
    return MS_OK;
}

static ms_status event_rules(cctx *c, size_t index, uint64_t off, const tj_doc *d, int root,
                             ms_error *err) {
    if (tj_type_of(d, root) != TJ_OBJ) return EVBAD("an event must be a JSON object");
    const char *ph = tj_str(d, tj_get(d, root, "ph"));
    if (!ph) return EVBAD("event has no string \"ph\" (phase)");
    char safe[MS_SAFE_LEN];
    if (!is_phase(ph)) return EVBAD("unknown phase \"%s\"", ms_safe_str(safe, 16, ph));
    char p = ph[0];

    int pid_n = tj_get(d, root, "pid"), tid_n = tj_get(d, root, "tid");
    int64_t pid = 0, tid = 0;
    if (pid_n >= 0 && !tj_int(d, pid_n, INT64_MIN, INT64_MAX, &pid))
        return EVBAD("\"pid\" must be an integer");
    if (tid_n >= 0 && !tj_int(d, tid_n, INT64_MIN, INT64_MAX, &tid))
        return EVBAD("\"tid\" must be an integer");
    const char *scope = tj_str(d, tj_get(d, root, "s"));
    bool instant = p == 'i' || p == 'I';
    if (instant && tj_get(d, root, "s") >= 0 &&
        (!scope || (strcmp(scope, "g") && strcmp(scope, "p") && strcmp(scope, "t"))))
        return EVBAD("instant event scope \"s\" must be \"g\", \"p\" or \"t\"");
    bool global = instant && scope && !strcmp(scope, "g");
    if (pid_n < 0 && !global) return EVBAD("%s event has no \"pid\"", ph);
    bool thread_scoped = p == 'X' || p == 'B' || p == 'E' || p == 's' || p == 't' || p == 'f' ||
                         (instant && (!scope || !strcmp(scope, "t")));
    if (thread_scoped && tid_n < 0) return EVBAD("%s event has no \"tid\"", ph);

    if (p == 'M') return check_meta_event(c, index, off, d, root, err);

    int ts_n = tj_get(d, root, "ts");
    int64_t ts;
    if (tj_type_of(d, ts_n) != TJ_NUM) return EVBAD("%s event needs a numeric \"ts\"", ph);
    if (!tj_scaled(d, ts_n, 3, &ts, NULL)) return EVBAD("\"ts\" is out of range");

    switch (p) {
        case 'X': {
            int64_t dur, t1;
            int dur_n = tj_get(d, root, "dur");
            if (tj_type_of(d, dur_n) != TJ_NUM || !tj_scaled(d, dur_n, 3, &dur, NULL) || dur < 0)
                return EVBAD("X event needs a numeric \"dur\" >= 0");
            if (__builtin_add_overflow(ts, dur, &t1))
                return EVBAD("\"ts\" + \"dur\" is out of range");
            const char *cat = c->meshscope ? tj_str(d, tj_get(d, root, "cat")) : NULL;
            if (cat && !strcmp(cat, "pipeline")) MS_CHECK(pipe_rules(c, index, off, d, root, err));
            return push(c, &c->x, (rec){.pid = pid, .tid = tid, .t0 = ts, .t1 = t1, .index = index},
                        err);
        }
        case 'B':
        case 'E': {
            const char *name = tj_str(d, tj_get(d, root, "name"));
            uint64_t h = name ? fnv(14695981039346656037ull, name) | 1 : 0;
            return push(c, &c->be,
                        (rec){.pid = pid, .tid = tid, .t0 = ts, .t1 = p, .name = h, .index = index},
                        err);
        }
        case 'C': {
            int args = tj_get(d, root, "args");
            if (tj_type_of(d, args) != TJ_OBJ)
                return EVBAD("C (counter) event needs an \"args\" object");
            for (int a = tj_first(d, args); a >= 0; a = tj_next(d, a))
                if (tj_type_of(d, a) != TJ_NUM)
                    return EVBAD("C (counter) args must be numbers; \"%s\" is not",
                                 ms_safe_str(safe, 64, tj_key(d, a)));
            return MS_OK;
        }
        case 's':
        case 't':
        case 'f': {
            const char *id = id_text(d, tj_get(d, root, "id"));
            if (!id) return EVBAD("flow event %s needs an \"id\" (number or string)", ph);
            int bp = tj_get(d, root, "bp");
            const char *bps = tj_str(d, bp);
            if (bp >= 0 && (!bps || strcmp(bps, "e")))
                return EVBAD("flow binding point \"bp\" must be \"e\"");
            const char *cat = tj_str(d, tj_get(d, root, "cat"));
            uint64_t h = fnv(fnv(14695981039346656037ull, cat ? cat : ""), "\x1f");
            h = fnv(h, id);
            return push(c, &c->flow, (rec){.t0 = (int64_t)h, .name = (uint64_t)p, .index = index},
                        err);
        }
        case 'b':
        case 'e':
        case 'n':
            if (tj_get(d, root, "id") < 0 && tj_get(d, root, "id2") < 0)
                return EVBAD("async event %s needs an \"id\" or \"id2\"", ph);
            return MS_OK;
        default:
            return MS_OK;
    }
}

static ms_status on_event(void *user, size_t index, uint64_t off, const tj_doc *d, int root,
                          ms_error *err) {
    cctx *c = user;
    c->n = index + 1;
    ms_status st = event_rules(c, index, off, d, root, err);
    if (st == MS_ERR_INVALID) c->bad = index;
    return st;
}

/* --- cross-event rules ------------------------------------------------------------------ */

static int cmp_x(const void *a, const void *b) {
    const rec *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1; /* longer first: it is the parent */
    return x->index < y->index ? -1 : x->index > y->index;
}

static int cmp_be(const void *a, const void *b) {
    const rec *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int cmp_flow(const void *a, const void *b) {
    const rec *x = a, *y = b;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

typedef struct finding {
    size_t index, other;
    char msg[300];
} finding;

static void found(finding *f, size_t index, size_t other, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void found(finding *f, size_t index, size_t other, const char *fmt, ...) {
    if (index >= f->index) return;
    f->index = index;
    f->other = other;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
}

static void us_text(int64_t ns, char *out, size_t len) {
    snprintf(out, len, "%s%lld.%03lld", ns < 0 ? "-" : "",
             (long long)(ns < 0 ? -(ns / 1000) : ns / 1000),
             (long long)(ns < 0 ? -(ns % 1000) : ns % 1000));
}

static ms_status check_overlap(cctx *c, finding *f, ms_error *err) {
    rec *x = c->x.v;
    size_t n = c->x.n;
    if (n) qsort(x, n, sizeof *x, cmp_x);
    size_t *stack = malloc(sizeof *stack * (n ? n : 1));
    if (!stack) return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", c->name);
    size_t top = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || x[i].pid != x[i - 1].pid || x[i].tid != x[i - 1].tid) top = 0;
        while (top && x[stack[top - 1]].t1 <= x[i].t0) top--;
        if (top && x[i].t1 > x[stack[top - 1]].t1) {
            const rec *a = &x[stack[top - 1]], *b = &x[i];
            char a0[32], a1[32], b0[32], b1[32];
            us_text(a->t0, a0, sizeof a0);
            us_text(a->t1, a1, sizeof a1);
            us_text(b->t0, b0, sizeof b0);
            us_text(b->t1, b1, sizeof b1);
            size_t later = a->index > b->index ? a->index : b->index;
            size_t earlier = a->index > b->index ? b->index : a->index;
            found(f, later, earlier,
                  "X events %zu [%s, %s] us and %zu [%s, %s] us partially overlap on pid %lld "
                  "tid %lld (nesting is allowed, partial overlap is not: viewers drop or "
                  "misdraw one)",
                  a->index, a0, a1, b->index, b0, b1, (long long)a->pid, (long long)a->tid);
            continue; /* keep the stack as it was; later events are still checked */
        }
        stack[top++] = i;
    }
    free(stack);
    return MS_OK;
}

static ms_status check_begin_end(cctx *c, finding *f, ms_error *err) {
    rec *x = c->be.v;
    size_t n = c->be.n;
    if (n) qsort(x, n, sizeof *x, cmp_be);
    size_t *stack = malloc(sizeof *stack * (n ? n : 1));
    if (!stack) return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", c->name);
    size_t top = 0;
    for (size_t i = 0; i <= n; i++) {
        bool new_thread =
            i == n || (i > 0 && (x[i].pid != x[i - 1].pid || x[i].tid != x[i - 1].tid));
        if (new_thread) {
            for (size_t k = 0; k < top; k++)
                found(f, x[stack[k]].index, SIZE_MAX,
                      "B event on pid %lld tid %lld is never ended by an E event",
                      (long long)x[stack[k]].pid, (long long)x[stack[k]].tid);
            top = 0;
        }
        if (i == n) break;
        if (x[i].t1 == 'B') {
            stack[top++] = i;
        } else if (!top) {
            found(f, x[i].index, SIZE_MAX,
                  "E event on pid %lld tid %lld has no open B event to end", (long long)x[i].pid,
                  (long long)x[i].tid);
        } else {
            const rec *b = &x[stack[--top]];
            if (b->name && x[i].name && b->name != x[i].name)
                found(f, x[i].index, b->index,
                      "E event's name differs from the name of the B event %zu it ends "
                      "(B/E must nest per thread)",
                      b->index);
        }
    }
    free(stack);
    return MS_OK;
}

static void check_flows(cctx *c, finding *f) {
    rec *x = c->flow.v;
    size_t n = c->flow.n;
    if (n) qsort(x, n, sizeof *x, cmp_flow);
    for (size_t a = 0; a < n;) {
        size_t b = a;
        bool has_s = false;
        while (b < n && x[b].t0 == x[a].t0) has_s |= x[b++].name == 's';
        for (size_t k = a; k < b && !has_s; k++)
            found(f, x[k].index, SIZE_MAX,
                  "flow event %c has no s (start) event with the same cat and id", (char)x[k].name);
        a = b;
    }
}

static ms_status check_src(tj_src *s, ms_trace_check_info *info, ms_error *err) {
    cctx c = {.name = s->name, .bad = SIZE_MAX};
    tj_handler h = {.user = &c, .want_meta = want_meta, .meta = on_meta, .event = on_event};
    finding f = {.index = SIZE_MAX, .other = SIZE_MAX};
    ms_status st = tj_scan_trace(s, &h, err);
    if (st == MS_OK) st = check_overlap(&c, &f, err);
    if (st == MS_OK) st = check_begin_end(&c, &f, err);
    if (st == MS_OK) check_flows(&c, &f);
    if (st == MS_OK && f.index != SIZE_MAX)
        st = ms_fail(err, MS_ERR_INVALID, "%s: event %zu: %s", c.name, f.index, f.msg);
    if (info) {
        info->n_events = c.n;
        info->violation = c.bad != SIZE_MAX ? c.bad : f.index;
        info->other = f.other;
    }
    free(c.x.v);
    free(c.be.v);
    free(c.flow.v);
    return st;
}

ms_status ms_trace_check(const char *path, ms_trace_check_info *info, ms_error *err) {
    if (info) *info = (ms_trace_check_info){.violation = SIZE_MAX, .other = SIZE_MAX};
    tj_src s;
    MS_CHECK(tj_src_open(&s, path, err));
    ms_status st = check_src(&s, info, err);
    tj_src_close(&s);
    return st;
}

ms_status ms_trace_check_mem(const void *data, size_t len, const char *name,
                             ms_trace_check_info *info, ms_error *err) {
    tj_src s;
    tj_src_mem(&s, data, len, name ? name : "trace");
    return check_src(&s, info, err);
}

/* auto_place.c - automatic placements: coordinate descent over weight classes, each layout
 * priced from the engine's compiled program (see auto_place.h). */
#include "engine/plan/auto_place.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/core/xalloc.h"
#include "engine/graph/graph.h"
#include "engine/pipeline/chunks.h"

#define AP_MAX_CLASSES MS_STRATEGY_MAX_RULES
#define AP_MAX_CANDS   (MS_MAX_DIMS + 1)
#define AP_TP_DIM      1 /* the tp dim of the engine's mesh (dp, tp[, cp]) */

/* Parameters sharing a name once their layer indices are '*'. */
typedef struct ap_class {
    char pattern[96];
    ms_shape shape;            /* its first member's */
    bool divides[MS_MAX_DIMS]; /* tp divides that dim of every member */
    int follows;               /* a bias: the class of its weight; -1 otherwise */
    int cand[AP_MAX_CANDS];    /* a weight: -1 replicated, d sharded on dim d */
    int ncand;                 /* 0: not searched (replicated or following) */
} ap_class;

/* One layout priced: each weight class's candidate index. */
typedef struct ap_eval {
    uint8_t a[AP_MAX_CLASSES];
    bool ok, fits;
    double bytes;
    ms_plan_estimate e;
} ap_eval;

typedef struct ap_ctx {
    const ms_plan_problem *pb;
    const ms_strategy *s;
    ap_class c[AP_MAX_CLASSES];
    int n;
    double limit;
    ap_eval *evals;
    int nevals, cap;
    ms_error first_err;
} ap_ctx;

double ms_plan_estimate_coll_bytes(const ms_plan_estimate *e) {
    double b = 0;
    for (int d = 0; d < MS_PLAN_DIM_COUNT; d++) b += e->comm_bytes[d];
    return b;
}

/* name with every all-digit component ("h.3.") as '*'; false when it does not fit. */
static bool class_pattern(const char *name, char *out, size_t n) {
    size_t o = 0;
    for (const char *p = name; *p;) {
        const char *end = strchr(p, '.');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        bool digits = len > 0;
        for (size_t i = 0; i < len; i++) digits &= isdigit((unsigned char)p[i]) != 0;
        const char *piece = digits ? "*" : p;
        size_t plen = digits ? 1 : len;
        if (o + plen + 2 > n) return false;
        memcpy(out + o, piece, plen);
        o += plen;
        if (end) out[o++] = '.';
        p = end ? end + 1 : p + len;
    }
    out[o] = '\0';
    return true;
}

static ms_status add_param(ap_ctx *cx, const char *name, const ms_shape *sh, ms_error *err) {
    char pat[96];
    if (!class_pattern(name, pat, sizeof pat))
        return ms_fail(err, MS_ERR_INVALID, "auto placements: the parameter name %.80s is too long",
                       name);
    int tp = cx->s->tp;
    for (int i = 0; i < cx->n; i++) {
        ap_class *c = &cx->c[i];
        if (strcmp(c->pattern, pat)) continue;
        for (int d = 0; d < MS_MAX_DIMS; d++)
            c->divides[d] &= d < sh->ndim && d < c->shape.ndim && sh->d[d] % tp == 0;
        return MS_OK;
    }
    if (cx->n == AP_MAX_CLASSES)
        return ms_fail(err, MS_ERR_INVALID,
                       "auto placements: the model has more than %d parameter classes (names with "
                       "their layer index as '*'); give its placements in the strategy file",
                       AP_MAX_CLASSES);
    ap_class *c = &cx->c[cx->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->pattern, sizeof c->pattern, "%s", pat);
    c->shape = *sh;
    c->follows = -1;
    for (int d = 0; d < sh->ndim; d++) c->divides[d] = sh->d[d] % tp == 0;
    return MS_OK;
}

/* Biases follow their weight; weights of two or more dims are searched; the rest replicated. */
static void settle_classes(ap_ctx *cx) {
    for (int i = 0; i < cx->n; i++) {
        ap_class *c = &cx->c[i];
        size_t len = strlen(c->pattern);
        if (len > 5 && !strcmp(c->pattern + len - 5, ".bias")) {
            char w[96];
            snprintf(w, sizeof w, "%.*sweight", (int)(len - 4), c->pattern);
            for (int j = 0; j < cx->n; j++)
                if (!strcmp(cx->c[j].pattern, w) && cx->c[j].shape.ndim >= 2) c->follows = j;
        }
        if (c->follows >= 0 || c->shape.ndim < 2) continue;
        c->cand[c->ncand++] = -1;
        for (int d = 0; d < c->shape.ndim && cx->s->tp > 1; d++)
            if (c->divides[d]) c->cand[c->ncand++] = d;
    }
}

/* The parameters of the whole model (one pipeline chunk), in the order the builder made them. */
static ms_status read_classes(ap_ctx *cx, ms_error *err) {
    const ms_plan_problem *pb = cx->pb;
    ms_strategy whole = *cx->s;
    whole.pp = 1, whole.virtual_stages = 1, whole.pp_layers[0] = 0;
    ms_model model = {0};
    const ms_model_def *d = ms_plan_user_def(pb);
    int rows = pb->global_batch;
    ms_status st = d ? ms_pp_chunk_model_def(d, &whole, rows, 0, &model, err)
                     : ms_pp_chunk_model(&pb->model, &whole, rows, pb->seq, 0, &model, err);
    for (int v = 0; st == MS_OK && v < ms_graph_num_values(model.g); v++)
        if (ms_graph_is_param(model.g, v))
            st = add_param(cx, ms_graph_value_name(model.g, v), ms_graph_value_shape(model.g, v),
                           err);
    ms_model_free(&model);
    if (st == MS_OK) settle_classes(cx);
    return st;
}

/* A bias's placement over tp when its weight's is w: [in, out...] weights with [out...]
 * biases (this engine's) first, then [out..., in] with [out...]; replicated otherwise. */
static ms_placement follow(const ms_shape *wsh, const ms_shape *b, ms_placement w) {
    if (w.kind != MS_PL_SHARD) return ms_pl_replicate();
    bool suffix = b->ndim == wsh->ndim - 1, prefix = b->ndim < wsh->ndim;
    for (int d = 0; d < b->ndim; d++) {
        suffix &= b->d[d] == wsh->d[d + 1];
        prefix &= b->d[d] == wsh->d[d];
    }
    if (suffix) return w.dim >= 1 ? ms_pl_shard(w.dim - 1) : ms_pl_replicate();
    if (prefix && w.dim < b->ndim) return ms_pl_shard(w.dim);
    return ms_pl_replicate();
}

static ms_placement tp_of(const ap_ctx *cx, const uint8_t *a, int i) {
    const ap_class *c = &cx->c[i];
    if (c->follows >= 0)
        return follow(&cx->c[c->follows].shape, &c->shape, tp_of(cx, a, c->follows));
    if (!c->ncand) return ms_pl_replicate();
    int d = c->cand[a[i]];
    return d < 0 ? ms_pl_replicate() : ms_pl_shard(d);
}

static void make_rules(const ap_ctx *cx, const uint8_t *a, ms_placement_rules *r) {
    memset(r, 0, sizeof *r);
    r->no_hints = true;
    if (cx->s->tp < 2) return;
    int ndim = cx->s->cp > 1 ? 3 : 2;
    for (int i = 0; i < cx->n; i++) {
        ms_placement_rule *rule = &r->r[r->n++];
        snprintf(rule->pattern, sizeof rule->pattern, "%s", cx->c[i].pattern);
        rule->pl = ms_placements_replicated(ndim);
        rule->pl.p[AP_TP_DIM] = tp_of(cx, a, i);
        ms_placements_default_order(&rule->pl);
    }
}

/* Whether x is a better layout than y: fitting over not, then by step time (by memory while
 * neither fits), then by fewer collective bytes. */
static int descend_single(ap_ctx *cx, int max_sweeps, int *sweeps);

static bool better(const ap_eval *x, const ap_eval *y) {
    if (!x->ok || !y->ok) return x->ok && !y->ok;
    if (x->fits != y->fits) return x->fits;
    double kx = x->fits ? x->e.step_s : x->e.mem_total, ky = y->fits ? y->e.step_s : y->e.mem_total;
    if (kx != ky) return kx < ky;
    return x->bytes < y->bytes;
}

/* The layout a, priced once (index into cx->evals). */
static int evaluate(ap_ctx *cx, const uint8_t *a) {
    for (int i = 0; i < cx->nevals; i++)
        if (!memcmp(cx->evals[i].a, a, AP_MAX_CLASSES)) return i;
    if (cx->nevals == cx->cap) {
        cx->cap = cx->cap ? 2 * cx->cap : 32;
        cx->evals = xrealloc(cx->evals, sizeof *cx->evals * (size_t)cx->cap);
    }
    ap_eval *ev = &cx->evals[cx->nevals];
    memset(ev, 0, sizeof *ev);
    memcpy(ev->a, a, AP_MAX_CLASSES);
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    make_rules(cx, a, rules);
    ms_plan_problem pb = *cx->pb;
    pb.rules = rules;
    pb.engine_workloads = true;
    ms_error e = {0};
    ev->ok = ms_plan_estimate_one(&pb, cx->s, NULL, &ev->e, &e) == MS_OK;
    if (ev->ok && !ev->e.from_engine) {
        ev->ok = false;
        ms_fail(&e, MS_ERR_INVALID,
                "auto placements price the engine's compiled program, and %s is not one it "
                "compiles here (%s)",
                ev->e.text,
                ev->e.not_executable[0] ? ev->e.not_executable : "the model is too large");
    }
    if (!ev->ok && !cx->first_err.msg[0]) cx->first_err = e;
    ev->fits = ev->ok && ev->e.mem_total <= cx->limit;
    ev->bytes = ev->ok ? ms_plan_estimate_coll_bytes(&ev->e) : 0;
    free(rules);
    return cx->nevals++;
}

/* Joint moves of two classes from cur (Megatron's column-then-row pairs only pay when both
 * change): the best layout priced, or `best` when no pair beats it. */
static int pair_moves(ap_ctx *cx, const uint8_t *cur, int best) {
    for (int i = 0; i < cx->n; i++)
        for (int j = i + 1; j < cx->n; j++)
            for (int ki = 0; ki < cx->c[i].ncand; ki++)
                for (int kj = 0; kj < cx->c[j].ncand; kj++) {
                    if (ki == cur[i] || kj == cur[j]) continue;
                    uint8_t trial[AP_MAX_CLASSES];
                    memcpy(trial, cur, sizeof trial);
                    trial[i] = (uint8_t)ki, trial[j] = (uint8_t)kj;
                    int t = evaluate(cx, trial);
                    if (better(&cx->evals[t], &cx->evals[best])) best = t;
                }
    return best;
}

/* Coordinate descent from all-replicated, single classes until none improves, then pairs;
 * returns the winner's index in cx->evals. */
static int descend(ap_ctx *cx, int max_sweeps, int *sweeps) {
    int best = descend_single(cx, max_sweeps, sweeps);
    for (int round = 0; round < 2; round++) {
        uint8_t cur[AP_MAX_CLASSES];
        memcpy(cur, cx->evals[best].a, sizeof cur);
        int p = pair_moves(cx, cur, best);
        if (p == best) break;
        best = p;
        ++*sweeps;
    }
    return best;
}

/* Coordinate descent over single classes; returns the winner's index in cx->evals. */
static int descend_single(ap_ctx *cx, int max_sweeps, int *sweeps) {
    uint8_t cur[AP_MAX_CLASSES] = {0};
    int best = evaluate(cx, cur);
    *sweeps = 0;
    for (bool changed = true; changed && *sweeps < max_sweeps;) {
        changed = false;
        ++*sweeps;
        for (int i = 0; i < cx->n; i++) {
            for (int k = 0; k < cx->c[i].ncand; k++) {
                if (k == cur[i]) continue;
                uint8_t trial[AP_MAX_CLASSES];
                memcpy(trial, cur, sizeof trial);
                trial[i] = (uint8_t)k;
                int t = evaluate(cx, trial);
                if (better(&cx->evals[t], &cx->evals[best])) best = t;
            }
            if (cx->evals[best].a[i] != cur[i]) {
                cur[i] = cx->evals[best].a[i];
                changed = true;
            }
        }
    }
    return best;
}

/* The runner-up (the best other layout priced) and where it differs from the winner. */
static void runner_up(const ap_ctx *cx, int win, ms_auto_place_result *out) {
    int ru = -1;
    for (int i = 0; i < cx->nevals; i++)
        if (i != win && cx->evals[i].ok && (ru < 0 || better(&cx->evals[i], &cx->evals[ru])))
            ru = i;
    if (ru < 0) return;
    out->have_runner_up = true;
    out->runner_up = cx->evals[ru].e;
    size_t o = 0;
    out->runner_up_diff[0] = '\0';
    for (int i = 0; i < cx->n && o < sizeof out->runner_up_diff; i++) {
        if (!cx->c[i].ncand || cx->evals[ru].a[i] == cx->evals[win].a[i]) continue;
        ms_placements pl = ms_placements_replicated(cx->s->cp > 1 ? 3 : 2);
        pl.p[AP_TP_DIM] = tp_of(cx, cx->evals[ru].a, i);
        char b[64];
        int w = snprintf(out->runner_up_diff + o, sizeof out->runner_up_diff - o, "%s%s %s",
                         o ? ", " : "", cx->c[i].pattern, ms_placements_str(&pl, b, sizeof b));
        o += w > 0 ? (size_t)w : 0;
    }
}

ms_status ms_plan_auto_placements(const ms_plan_problem *pb, const ms_strategy *s,
                                  const ms_auto_place_opts *opts, ms_auto_place_result *out,
                                  ms_error *err) {
    memset(out, 0, sizeof *out);
    int64_t t0 = ms_now_ns();
    ms_plan_problem rp = ms_plan_problem_resolved(pb);
    MS_CHECK(ms_plan_check(&rp, s, err));
    ap_ctx *cx = xcalloc(1, sizeof *cx);
    cx->pb = &rp, cx->s = s;
    ms_status st = read_classes(cx, err);
    int win = -1;
    if (st == MS_OK) {
        /* the memory limit: the cluster's per rank unless given */
        int first = evaluate(cx, (uint8_t[AP_MAX_CLASSES]){0});
        cx->limit = opts && opts->mem_limit > 0 ? opts->mem_limit : cx->evals[first].e.mem_cap;
        cx->evals[first].fits = cx->evals[first].ok && cx->evals[first].e.mem_total <= cx->limit;
        if (!cx->evals[first].ok) st = ms_fail(err, MS_ERR_INVALID, "%s", cx->first_err.msg);
    }
    if (st == MS_OK) {
        win = descend(cx, opts && opts->max_sweeps > 0 ? opts->max_sweeps : 4, &out->sweeps);
        const ap_eval *w = &cx->evals[win];
        char need[32], lim[32];
        if (!w->fits)
            st = ms_fail(err, MS_ERR_INVALID,
                         "auto placements: no layout of %s fits the memory limit of %s per rank; "
                         "the smallest found needs %s (more tp, ZeRO or recompute would help)",
                         w->e.text, ms_plan_bytes_str(cx->limit, lim, sizeof lim),
                         ms_plan_bytes_str(w->e.mem_total, need, sizeof need));
    }
    if (st == MS_OK) {
        make_rules(cx, cx->evals[win].a, &out->rules);
        out->best = cx->evals[win].e;
        out->coll_bytes = cx->evals[win].bytes;
        runner_up(cx, win, out);
        for (int i = 0; i < cx->n; i++) out->classes += cx->c[i].ncand > 0;
    }
    out->compiles = cx->nevals;
    out->search_ms = (double)(ms_now_ns() - t0) / 1e6;
    free(cx->evals);
    free(cx);
    return st;
}

char *ms_auto_place_rules_str(const ms_placement_rules *r, char *buf, size_t n) {
    size_t o = 0;
    int w = snprintf(buf, n, "{");
    o = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < r->n && o < n; i++) {
        char pl[64];
        w = snprintf(buf + o, n - o, "%s\"%s\": \"%s\"", i ? ", " : "", r->r[i].pattern,
                     ms_placements_str(&r->r[i].pl, pl, sizeof pl));
        o += w > 0 ? (size_t)w : 0;
    }
    if (o < n) snprintf(buf + o, n - o, "}");
    return buf;
}

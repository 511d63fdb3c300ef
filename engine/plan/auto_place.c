/* auto_place.c - automatic placements: the classes a layout chooses for, the user's pins, the
 * rules a layout becomes, and pricing one layout from the engine's compiled program (see
 * auto_place.h; the search itself is auto_place_search.c). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/core/xalloc.h"
#include "engine/graph/graph.h"
#include "engine/pipeline/chunks.h"
#include "engine/plan/auto_place_impl.h"

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

/* The first pin rule matching name (for this mesh), or -1. */
static int pin_of(const ap_ctx *cx, const char *name) {
    int ndim = cx->s->cp > 1 ? 3 : 2;
    for (int r = 0; r < cx->pins->n; r++)
        if (cx->pins->r[r].pl.n == ndim && ms_glob_match(cx->pins->r[r].pattern, name)) return r;
    return -1;
}

/* Two members of one class pinned differently (or one pinned, one not): the class is solved
 * once for every layer, so its members must agree. */
static ms_status contradiction(const ap_ctx *cx, const ap_class *c, const char *name, int pin,
                               ms_error *err) {
    char a[64] = "unpinned", b[64] = "unpinned";
    if (c->pin >= 0) ms_placements_str(&cx->pins->r[c->pin].pl, a, sizeof a);
    if (pin >= 0) ms_placements_str(&cx->pins->r[pin].pl, b, sizeof b);
    return ms_fail(err, MS_ERR_INVALID,
                   "auto placements: contradictory pins: %s is %s but %s is %s; every layer's "
                   "copy of a tensor takes one placement, so pin them all with one pattern "
                   "such as \"%s\"",
                   c->first, a, name, b, c->pattern);
}

static ms_status add_value(ap_ctx *cx, const char *name, const ms_shape *sh, bool act,
                           ms_error *err) {
    char pat[96];
    if (!class_pattern(name, pat, sizeof pat))
        return ms_fail(err, MS_ERR_INVALID, "auto placements: the value name %.80s is too long",
                       name);
    int tp = cx->s->tp, pin = pin_of(cx, name);
    for (int i = 0; i < cx->n; i++) {
        ap_class *c = &cx->c[i];
        if (strcmp(c->pattern, pat)) continue;
        for (int d = 0; d < MS_MAX_DIMS; d++)
            c->splits[d] &= d < sh->ndim && d < c->shape.ndim && sh->d[d] >= tp;
        bool agree = (pin < 0) == (c->pin < 0) &&
                     (pin < 0 || ms_placements_eq(&cx->pins->r[pin].pl, &cx->pins->r[c->pin].pl));
        return agree ? MS_OK : contradiction(cx, c, name, pin, err);
    }
    if (cx->n == AP_MAX_CLASSES)
        return ms_fail(err, MS_ERR_INVALID,
                       "auto placements: the model has more than %d classes of parameters and "
                       "fan-out activations (names with their layer index as '*'); give its "
                       "placements in the strategy file",
                       AP_MAX_CLASSES);
    ap_class *c = &cx->c[cx->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->pattern, sizeof c->pattern, "%s", pat);
    snprintf(c->first, sizeof c->first, "%s", name);
    c->shape = *sh;
    c->follows = -1;
    c->act = act;
    c->pin = pin;
    for (int d = 0; d < sh->ndim; d++) c->splits[d] = sh->d[d] >= tp; /* balanced, maybe uneven */
    return MS_OK;
}

/* A pin's tp entry must be one every member can hold: a shard of a dim it has, with at least
 * one element per tp rank. */
static ms_status check_pin(const ap_ctx *cx, const ap_class *c, ms_error *err) {
    ms_placement q = cx->pins->r[c->pin].pl.p[AP_TP_DIM];
    if (q.kind != MS_PL_SHARD || (q.dim < c->shape.ndim && c->splits[q.dim])) return MS_OK;
    char b[64], why[96];
    if (q.dim >= c->shape.ndim)
        snprintf(why, sizeof why, "which has only %d dims", c->shape.ndim);
    else
        snprintf(why, sizeof why, "whose dim holds fewer elements than tp's %d ranks", cx->s->tp);
    return ms_fail(err, MS_ERR_INVALID,
                   "auto placements: the pin \"%s\": \"%s\" shards dim %d of %s, %s; pin a dim "
                   "with at least one element per rank, or R",
                   cx->pins->r[c->pin].pattern,
                   ms_placements_str(&cx->pins->r[c->pin].pl, b, sizeof b), q.dim, c->first, why);
}

/* Biases follow their weight; weights of two or more dims and fan-out activations are
 * searched; pinned classes are fixed; the rest are replicated. */
static ms_status settle_classes(ap_ctx *cx, ms_error *err) {
    for (int i = 0; i < cx->n; i++) {
        ap_class *c = &cx->c[i];
        if (c->pin >= 0) {
            MS_CHECK(check_pin(cx, c, err));
            continue;
        }
        size_t len = strlen(c->pattern);
        if (!c->act && len > 5 && !strcmp(c->pattern + len - 5, ".bias")) {
            char w[96];
            snprintf(w, sizeof w, "%.*sweight", (int)(len - 4), c->pattern);
            for (int j = 0; j < cx->n; j++)
                if (!strcmp(cx->c[j].pattern, w) && cx->c[j].shape.ndim >= 2) c->follows = j;
        }
        if (c->follows >= 0 || c->shape.ndim < 2 || cx->s->tp < 2) continue;
        if (c->act) { /* left to the completion pass first: the layout with no rule */
            /* over dp its rows stay split as the batch's; over cp it is the completion's */
            if (cx->s->cp > 1 || c->shape.d[0] % cx->s->dp) continue;
            c->cand[c->ncand++] = AP_FREE;
        }
        c->cand[c->ncand++] = AP_REPL;
        /* an activation's last dim is its features: a split there starves every matmul */
        for (int d = 0; d < c->shape.ndim - (c->act ? 1 : 0); d++)
            if (c->splits[d]) c->cand[c->ncand++] = d;
    }
    return MS_OK;
}

/* The class a value's placement is decided by (a bias: its weight's), or -1. */
static int deciding_class(const ap_ctx *cx, const int *cls_of, int v) {
    int c = cls_of[v];
    if (c >= 0 && cx->c[c].follows >= 0) c = cx->c[c].follows;
    return c;
}

/* Which searched classes interact: those joined through values no class decides (a norm, a
 * projection's output, an attention core), walking the graph both ways from every member and
 * stopping at any class's values. Only these pairs get joint terms in the search. */
static void class_adjacency(ap_ctx *cx, const ms_graph *g, const int *cls_of) {
    int nv = ms_graph_num_values(g), nn = ms_graph_num_nodes(g);
    int *producer = xmalloc(sizeof(int) * (size_t)nv), *seen = xcalloc((size_t)nv, sizeof(int));
    int *nseen = xcalloc((size_t)nn, sizeof(int)), *queue = xmalloc(sizeof(int) * (size_t)nv);
    int *ucount = xcalloc((size_t)nv + 1, sizeof(int)), *users, *fill;
    for (int v = 0; v < nv; v++) producer[v] = -1;
    for (int n = 0; n < nn; n++) {
        int ni, no;
        const int *in, *out;
        ms_graph_node_io(g, n, &ni, &in, &no, &out);
        for (int k = 0; k < no; k++) producer[out[k]] = n;
        for (int k = 0; k < ni; k++) ucount[in[k] + 1]++;
    }
    for (int v = 0; v < nv; v++) ucount[v + 1] += ucount[v];
    users = xmalloc(sizeof(int) * (size_t)(ucount[nv] + 1));
    fill = xmalloc(sizeof(int) * (size_t)nv);
    memcpy(fill, ucount, sizeof(int) * (size_t)nv);
    for (int n = 0; n < nn; n++) {
        int ni, no;
        const int *in, *out;
        ms_graph_node_io(g, n, &ni, &in, &no, &out);
        for (int k = 0; k < ni; k++) users[fill[in[k]]++] = n;
    }
    for (int root = 0, stamp = 0; root < nv; root++) {
        int r = deciding_class(cx, cls_of, root);
        if (r < 0 || !cx->c[r].ncand) continue;
        int head = 0, tail = 0;
        queue[tail++] = root, seen[root] = ++stamp;
        while (head < tail) {
            int u = queue[head++];
            for (int k = -1; k < ucount[u + 1] - ucount[u]; k++) {
                int n = k < 0 ? producer[u] : users[ucount[u] + k];
                if (n < 0 || nseen[n] == stamp) continue;
                nseen[n] = stamp;
                int ni, no;
                const int *in, *out;
                ms_graph_node_io(g, n, &ni, &in, &no, &out);
                for (int j = 0; j < ni + no; j++) {
                    int w = j < ni ? in[j] : out[j - ni];
                    if (seen[w] == stamp) continue;
                    seen[w] = stamp;
                    int c = deciding_class(cx, cls_of, w);
                    if (c >= 0 && (cx->c[c].ncand || cx->c[c].pin >= 0)) {
                        if (c != r && cx->c[c].ncand) cx->adj[r][c] = cx->adj[c][r] = true;
                        continue;
                    }
                    queue[tail++] = w;
                }
            }
        }
    }
    free(producer), free(seen), free(nseen), free(queue), free(ucount), free(users), free(fill);
}

static bool same_shape(const ms_shape *a, const ms_shape *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->d[d] != b->d[d]) return false;
    return true;
}

/* An activation whose placement a layout chooses: one two or more operators read (the residual
 * stream, a norm feeding several projections), or a residual join (an operator adding inputs of
 * its output's shape), where a partial sum becomes either an all-reduce or sequence
 * parallelism's reduce-scatter. producer: each value's node, or -1. */
static bool is_stream(const ms_graph *g, const int *producer, int v) {
    const ms_shape *sh = ms_graph_value_shape(g, v);
    if (!ms_graph_is_activation(g, v) || sh->ndim < 2 || producer[v] < 0) return false;
    if (ms_graph_value_uses(g, v) >= 2) return true;
    int ni, no, same = 0;
    const int *in, *out;
    ms_graph_node_io(g, producer[v], &ni, &in, &no, &out);
    for (int k = 0; k < ni; k++) same += same_shape(ms_graph_value_shape(g, in[k]), sh);
    return no == 1 && same >= 2;
}

/* The parameters of the whole model (one pipeline chunk), in the order the builder made them,
 * and its stream activations (is_stream); then which of them interact. */
static ms_status read_classes(ap_ctx *cx, ms_error *err) {
    const ms_plan_problem *pb = cx->pb;
    ms_strategy whole = *cx->s;
    whole.pp = 1, whole.virtual_stages = 1, whole.pp_layers[0] = 0;
    ms_model model = {0};
    const ms_model_def *d = ms_plan_user_def(pb);
    int rows = pb->global_batch;
    ms_status st = d ? ms_pp_chunk_model_def(d, &whole, rows, 0, &model, err)
                     : ms_pp_chunk_model(&pb->model, &whole, rows, pb->seq, 0, &model, err);
    int nv = st == MS_OK ? ms_graph_num_values(model.g) : 0;
    int *cls_of = xmalloc(sizeof(int) * (size_t)(nv + 1));
    int *producer = xmalloc(sizeof(int) * (size_t)(nv + 1));
    for (int v = 0; v < nv; v++) producer[v] = -1;
    for (int n = 0; st == MS_OK && n < ms_graph_num_nodes(model.g); n++) {
        int ni, no;
        const int *in, *out;
        ms_graph_node_io(model.g, n, &ni, &in, &no, &out);
        for (int k = 0; k < no; k++) producer[out[k]] = n;
    }
    for (int v = 0; st == MS_OK && v < nv; v++) {
        cls_of[v] = -1;
        if (!ms_graph_is_param(model.g, v) && !is_stream(model.g, producer, v)) continue;
        st = add_value(cx, ms_graph_value_name(model.g, v), ms_graph_value_shape(model.g, v),
                       !ms_graph_is_param(model.g, v), err);
        char pat[96];
        class_pattern(ms_graph_value_name(model.g, v), pat, sizeof pat);
        for (int i = 0; st == MS_OK && i < cx->n; i++)
            if (!strcmp(cx->c[i].pattern, pat)) cls_of[v] = i;
    }
    if (st == MS_OK) st = settle_classes(cx, err);
    if (st == MS_OK) class_adjacency(cx, model.g, cls_of);
    free(cls_of);
    free(producer);
    ms_model_free(&model);
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
    if (c->pin >= 0) return cx->pins->r[c->pin].pl.p[AP_TP_DIM];
    if (c->follows >= 0)
        return follow(&cx->c[c->follows].shape, &c->shape, tp_of(cx, a, c->follows));
    if (!c->ncand) return ms_pl_replicate();
    int d = c->cand[a[i]];
    return d < 0 ? ms_pl_replicate() : ms_pl_shard(d);
}

/* The pins first (as given: the first matching rule wins), then one rule per class not left
 * to the completion pass. */
static void make_rules(const ap_ctx *cx, const uint8_t *a, ms_placement_rules *r) {
    memset(r, 0, sizeof *r);
    r->no_hints = true;
    for (int i = 0; i < cx->pins->n && r->n < MS_STRATEGY_MAX_RULES; i++)
        r->r[r->n++] = cx->pins->r[i];
    if (cx->s->tp < 2) return;
    int ndim = cx->s->cp > 1 ? 3 : 2;
    for (int i = 0; i < cx->n && r->n < MS_STRATEGY_MAX_RULES; i++) {
        const ap_class *c = &cx->c[i];
        if (c->pin >= 0 || (c->act && (!c->ncand || c->cand[a[i]] == AP_FREE))) continue;
        ms_placement_rule *rule = &r->r[r->n++];
        snprintf(rule->pattern, sizeof rule->pattern, "%s", c->pattern);
        rule->pl = ms_placements_replicated(ndim);
        /* an activation keeps its batch rows over dp, as the inputs' are */
        if (c->act && cx->s->dp > 1) rule->pl.p[MS_STRATEGY_DP_DIM] = ms_pl_shard(0);
        rule->pl.p[AP_TP_DIM] = tp_of(cx, a, i);
        ms_placements_default_order(&rule->pl);
    }
}

bool ap_better(const ap_eval *x, const ap_eval *y) {
    if (!x->ok || !y->ok) return x->ok && !y->ok;
    if (x->fits != y->fits) return x->fits;
    double kx = x->fits ? x->e.step_s : x->e.mem_total, ky = y->fits ? y->e.step_s : y->e.mem_total;
    if (kx != ky) return kx < ky;
    return x->bytes < y->bytes;
}

/* The estimate of the engine's program for pb (refused when the model is priced otherwise). */
static ms_status estimate_engine(const ms_plan_problem *pb, const ms_strategy *s,
                                 ms_plan_estimate *out, ms_error *err) {
    MS_CHECK(ms_plan_estimate_one(pb, s, NULL, out, err));
    if (out->from_engine) return MS_OK;
    return ms_fail(err, MS_ERR_INVALID,
                   "auto placements price the engine's compiled program, and %s is not one it "
                   "compiles here (%s)",
                   out->text,
                   out->not_executable[0] ? out->not_executable : "the model is too large");
}

/* Layout a's estimate: compiled whole, or while the search runs shallow (cx->shallow_layers)
 * from the model with one layer per pipeline stage and with two, extrapolated to the busiest
 * stage's layers: every repeated block adds the same step, memory and collective bytes. */
static ms_status price(ap_ctx *cx, const uint8_t *a, ms_plan_estimate *out, ms_error *err) {
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    make_rules(cx, a, rules);
    ms_plan_problem pb = *cx->pb;
    pb.rules = rules;
    pb.engine_workloads = pb.engine_any_size = true;
    int depth = cx->shallow_layers;
    ms_status st;
    if (!depth) {
        st = estimate_engine(&pb, cx->s, out, err);
    } else {
        ms_plan_estimate one;
        ms_strategy s = *cx->s;
        int stages = s.pp > 1 ? s.pp : 1;
        st = MS_OK;
        for (int k = 1; k <= 2 && st == MS_OK; k++) {
            pb.model.n_layer = k * stages;
            for (int q = 0; q < stages && stages > 1; q++) s.pp_layers[q] = (uint16_t)k;
            st = estimate_engine(&pb, &s, k == 1 ? &one : out, err);
        }
        double more = depth - 2;
        out->step_s += more * (out->step_s - one.step_s);
        out->mem_total += more * (out->mem_total - one.mem_total);
        for (int d = 0; d < MS_PLAN_DIM_COUNT; d++)
            out->comm_bytes[d] += more * (out->comm_bytes[d] - one.comm_bytes[d]);
    }
    free(rules);
    return st;
}

/* Prices evals[i]. */
static void price_eval(ap_ctx *cx, int i) {
    ap_eval *ev = &cx->evals[i];
    ms_error e = {0};
    ev->ok = price(cx, ev->a, &ev->e, &e) == MS_OK;
    if (!ev->ok && !cx->first_err.msg[0]) cx->first_err = e;
    ev->fits = ev->ok && ev->e.mem_total <= cx->limit;
    ev->bytes = ev->ok ? ms_plan_estimate_coll_bytes(&ev->e) : 0;
}

int ap_evaluate(ap_ctx *cx, const uint8_t *a) {
    for (int i = 0; i < cx->nevals; i++)
        if (!memcmp(cx->evals[i].a, a, AP_MAX_CLASSES)) return i;
    if (cx->nevals == cx->cap) {
        cx->cap = cx->cap ? 2 * cx->cap : 64;
        cx->evals = xrealloc(cx->evals, sizeof *cx->evals * (size_t)cx->cap);
    }
    ap_eval *ev = &cx->evals[cx->nevals];
    memset(ev, 0, sizeof *ev);
    memcpy(ev->a, a, AP_MAX_CLASSES);
    price_eval(cx, cx->nevals);
    cx->priced++;
    return cx->nevals++;
}

/* One class's placement in a layout, as text ("unpinned" for an activation left free). */
static void class_str(const ap_ctx *cx, const uint8_t *a, int i, char *b, size_t n) {
    if (cx->c[i].ncand && cx->c[i].cand[a[i]] == AP_FREE) {
        snprintf(b, n, "unpinned");
        return;
    }
    ms_placements pl = ms_placements_replicated(cx->s->cp > 1 ? 3 : 2);
    pl.p[AP_TP_DIM] = tp_of(cx, a, i);
    ms_placements_str(&pl, b, n);
}

/* The runner-up (the best other layout priced) and where it differs from the winner. */
static void runner_up(const ap_ctx *cx, int win, ms_auto_place_result *out) {
    int ru = -1;
    for (int i = 0; i < cx->nevals; i++)
        if (i != win && cx->evals[i].ok && (ru < 0 || ap_better(&cx->evals[i], &cx->evals[ru])))
            ru = i;
    if (ru < 0) return;
    out->have_runner_up = true;
    out->runner_up = cx->evals[ru].e;
    size_t o = 0;
    out->runner_up_diff[0] = '\0';
    for (int i = 0; i < cx->n && o < sizeof out->runner_up_diff; i++) {
        if (!cx->c[i].ncand || cx->evals[ru].a[i] == cx->evals[win].a[i]) continue;
        char b[64];
        class_str(cx, cx->evals[ru].a, i, b, sizeof b);
        int w = snprintf(out->runner_up_diff + o, sizeof out->runner_up_diff - o, "%s%s %s",
                         o ? ", " : "", cx->c[i].pattern, b);
        o += w > 0 ? (size_t)w : 0;
    }
}

static void set_opts(ap_ctx *cx, const ms_auto_place_opts *opts) {
    static const ms_placement_rules none;
    cx->pins = opts && opts->pins ? opts->pins : &none;
    cx->max_sweeps = opts && opts->max_sweeps > 0 ? opts->max_sweeps : 4;
    cx->max_rounds = opts && opts->max_rounds > 0 ? opts->max_rounds : 4;
    cx->tie = !opts || opts->tie == 0 ? 0.01 : opts->tie < 0 ? 0 : opts->tie;
    cx->time_limit_s = opts && opts->time_limit_s > 0 ? opts->time_limit_s : 10;
}

/* The layers of s's busiest pipeline stage for a built-in config (0 for a program's own model,
 * or with virtual stages: those are priced whole). */
static int busiest_stage_layers(const ms_plan_problem *pb, const ms_strategy *s) {
    if (ms_plan_user_def(pb) || s->virtual_stages > 1) return 0;
    int most = 0;
    for (int k = 0; k < (s->pp > 1 ? s->pp : 1); k++) {
        int lo, hi;
        ms_pp_chunk_layers(&pb->model, s, k, &lo, &hi);
        most = hi - lo > most ? hi - lo : most;
    }
    return most;
}

ms_status ms_plan_auto_placements(const ms_plan_problem *pb, const ms_strategy *s,
                                  const ms_auto_place_opts *opts, ms_auto_place_result *out,
                                  ms_error *err) {
    memset(out, 0, sizeof *out);
    int64_t t0 = ms_now_ns();
    ms_plan_problem rp = ms_plan_problem_resolved(pb);
    MS_CHECK(ms_plan_check(&rp, s, err));
    if (s->cp > 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "auto placements: the search does not place layouts under context "
                       "parallelism (cp %d); use cp 1, or give the placements in the strategy "
                       "file",
                       s->cp);
    /* the layouts' compiles share one memo: their reshard plans and pipeline bubbles repeat */
    ms_plan_memo *own_memo = rp.memo ? NULL : (rp.memo = ms_plan_memo_create());
    ap_ctx *cx = xcalloc(1, sizeof *cx);
    cx->pb = &rp, cx->s = s;
    set_opts(cx, opts);
    ms_status st = read_classes(cx, err);
    int win = -1;
    /* Deep stages are searched shallow (extrapolated from one and two layers a stage: six
     * layers without a pipeline, twelve with one, where that costs less than compiling them),
     * then the winner is priced whole and polished among its whole-priced neighbours; when
     * that no longer fits, the search runs again whole. */
    int deep = busiest_stage_layers(&rp, s);
    bool shallow = deep >= (s->pp > 1 ? 12 : 6);
    for (int pass = shallow ? 0 : 1; st == MS_OK && pass < 2; pass++) {
        cx->shallow_layers = pass == 0 ? deep : 0;
        cx->nevals = 0;
        win = -1;
        /* the memory limit: the cluster's per rank unless given */
        int first = ap_evaluate(cx, (uint8_t[AP_MAX_CLASSES]){0});
        cx->limit = opts && opts->mem_limit > 0 ? opts->mem_limit : cx->evals[first].e.mem_cap;
        cx->evals[first].fits = cx->evals[first].ok && cx->evals[first].e.mem_total <= cx->limit;
        if (!cx->evals[first].ok) st = ms_fail(err, MS_ERR_INVALID, "%s", cx->first_err.msg);
        if (st == MS_OK) {
            win = ap_search(cx, err);
            if (win < 0) st = MS_ERR_INVALID;
        }
        if (st != MS_OK || !cx->shallow_layers) break;
        uint8_t a[AP_MAX_CLASSES];
        memcpy(a, cx->evals[win].a, sizeof a);
        bool fitted = cx->evals[win].fits;
        cx->shallow_layers = 0, cx->nevals = 0;
        win = ap_refine(cx, ap_evaluate(cx, a));
        if (cx->evals[win].fits || !fitted) break;
    }
    if (st == MS_OK && !cx->evals[win].fits) {
        const ap_eval *w = &cx->evals[win];
        char need[32], lim[32];
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
        /* data parallelism's figures beside it: every weight replicated, priced whole */
        ms_error e = {0};
        cx->shallow_layers = 0;
        out->have_replicated =
            price(cx, (uint8_t[AP_MAX_CLASSES]){0}, &out->replicated, &e) == MS_OK;
    }
    for (int i = 0; i < cx->n; i++) {
        out->classes += cx->c[i].ncand > 1;
        for (int j = i + 1; j < cx->n; j++) out->pairs += cx->adj[i][j];
    }
    out->tie = cx->tie;
    out->solutions = cx->solutions;
    out->rounds = cx->rounds;
    out->compiles = cx->priced;
    out->search_ms = (double)(ms_now_ns() - t0) / 1e6;
    free(cx->evals);
    free(cx);
    ms_plan_memo_destroy(own_memo);
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
    /* the layout is the whole of it: said so, and a strategy file reads it back the same */
    if (r->no_hints && o < n) {
        w = snprintf(buf + o, n - o, "%s\"*\": \"complete\"", r->n ? ", " : "");
        o += w > 0 ? (size_t)w : 0;
    }
    if (o < n) snprintf(buf + o, n - o, "}");
    return buf;
}

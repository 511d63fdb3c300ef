/* snapshot_json.c - a live snapshot as JSON and back (format: docs/api.md, "The snapshot").
 *
 * Writing builds a cJSON tree field by field. Reading is strict: every field the writer
 * puts out must be present with the right type, arrays must have the sizes the counts
 * imply (a heatmap has nranks * nranks cells), strings must fit their fixed-size fields, and
 * a failure names the JSON path ("snapshot: $.analysis.ops[3].seconds: expected a number").
 * Numbers are doubles on the wire (cJSON prints the shortest text that reads back to the same
 * double), so integers round-trip exactly up to 2^53; a NaN or infinite value (a diverged
 * loss) is written as null and read back as NaN. The value of a "token=" in last_event is
 * written as "***" (the dashboard URL is posted as an event).
 */
#include "profiler/snapshot_json.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"

#define SNAPSHOT_SCHEMA 1
/* Upper bounds on counts read from JSON, so hostile input cannot ask for huge allocations. */
#define MAX_LIST       (1 << 20)
#define MAX_INFO_RANKS 65536

static const char *const lane_names[MS_LANE_KIND_COUNT] = {"compute", "comm"};
static const char *const phase_names[] = {"forward", "backward", "other"};
static const char *const action_names[] = {"F", "B", "W"}; /* ms_ev_pipe_action */

ms_snapshot *ms_snapshot_new(void) {
    ms_snapshot *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->step = -1;
    s->timeline_step = -1;
    s->pipeline.step = -1;
    s->refs_ = 1;
    return s;
}

/* --- writing --------------------------------------------------------------------------- */

/* Each helper returns false when cJSON could not allocate. */
static bool add_num(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, v) != NULL;
}
static bool add_str(cJSON *o, const char *k, const char *v) {
    return cJSON_AddStringToObject(o, k, v) != NULL;
}
static bool add_bool(cJSON *o, const char *k, bool v) {
    return cJSON_AddBoolToObject(o, k, v) != NULL;
}
static bool add_nums(cJSON *o, const char *k, const double *v, size_t n) {
    cJSON *a = n ? cJSON_CreateDoubleArray(v, (int)n) : cJSON_CreateArray();
    if (!a) return false;
    if (!cJSON_AddItemToObject(o, k, a)) {
        cJSON_Delete(a);
        return false;
    }
    return true;
}
/* A new object appended to array a (NULL when out of memory). */
static cJSON *push_obj(cJSON *a) {
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddItemToArray(a, o)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static bool heatmap_to_json(cJSON *o, const ms_heatmap *h, int nranks) {
    size_t cells = h->bytes && h->seconds ? (size_t)nranks * nranks : 0;
    return add_num(o, "mesh_dim", h->mesh_dim) && add_nums(o, "bytes", h->bytes, cells) &&
           add_nums(o, "seconds", h->seconds, cells);
}

static const char *coll_name(int c) {
    return c >= 0 && c < MS_COLL_KIND_COUNT ? ms_coll_name((ms_coll_kind)c) : "unknown";
}

/* analysis.pipeline: null without pipeline actions. */
static bool pipe_stats_to_json(cJSON *o, const ms_pipe_stats *p) {
    if (p->stages < 1 || p->stages > MS_AN_MAX_STAGES)
        return cJSON_AddNullToObject(o, "pipeline") != NULL;
    cJSON *e = cJSON_AddObjectToObject(o, "pipeline");
    double ranks[MS_AN_MAX_STAGES];
    for (int k = 0; k < p->stages; k++) ranks[k] = p->stage_ranks[k];
    const size_t n = (size_t)p->stages;
    return e && add_str(e, "schedule", p->schedule) && add_num(e, "stages", p->stages) &&
           add_num(e, "virtual_stages", p->virtual_stages) &&
           add_num(e, "micro_batches", p->micro_batches) && add_num(e, "steps", p->n_steps) &&
           add_num(e, "last_step", (double)p->last_step) && add_num(e, "bubble", p->bubble) &&
           add_num(e, "last_bubble", p->last_bubble) && add_num(e, "formula", p->formula) &&
           add_num(e, "simulated", p->simulated) && add_num(e, "mean_f_s", p->mean_f_s) &&
           add_num(e, "mean_b_s", p->mean_b_s) && add_num(e, "mean_w_s", p->mean_w_s) &&
           add_num(e, "last_window_s", p->last_window_s) && add_nums(e, "stage_ranks", ranks, n) &&
           add_nums(e, "stage_bubble", p->stage_bubble, n) &&
           add_nums(e, "last_stage_bubble", p->last_stage_bubble, n);
}

/* The pipeline view: null when hidden (no pipeline, or no complete step yet). */
static bool pipeline_to_json(cJSON *root, const ms_live_pipeline *pl) {
    if (pl->step < 0 || pl->stages < 1 || pl->stages > MS_AN_MAX_STAGES)
        return cJSON_AddNullToObject(root, "pipeline") != NULL;
    cJSON *o = cJSON_AddObjectToObject(root, "pipeline");
    bool ok = o && add_num(o, "step", (double)pl->step) && add_num(o, "wall_s", pl->wall_s);
    cJSON *lanes = ok ? cJSON_AddArrayToObject(o, "lanes") : NULL;
    ok = lanes != NULL;
    for (int k = 0; ok && k < pl->stages; k++) {
        cJSON *e = push_obj(lanes);
        ok = e && add_num(e, "stage", k) && add_num(e, "rank", pl->rank[k]);
    }
    cJSON *blocks = ok ? cJSON_AddArrayToObject(o, "blocks") : NULL;
    ok = blocks != NULL;
    for (int i = 0; ok && pl->blocks && i < pl->n_blocks; i++) {
        const ms_live_pipe_block *x = &pl->blocks[i];
        cJSON *e = push_obj(blocks);
        ok = e && add_num(e, "stage", x->stage) &&
             add_str(e, "action", x->action <= MS_PIPE_W ? action_names[x->action] : "F") &&
             add_num(e, "mb", x->mb) && add_num(e, "chunk", x->chunk) && add_num(e, "t0", x->t0) &&
             add_num(e, "t1", x->t1);
    }
    return ok;
}

static bool analysis_to_json(cJSON *root, const ms_analysis *a) {
    cJSON *o = cJSON_AddObjectToObject(root, "analysis");
    if (!o) return false;
    const int n = a->nranks;
    bool ok = add_num(o, "nranks", n) && add_num(o, "step_lo", (double)a->step_lo) &&
              add_num(o, "step_hi", (double)a->step_hi);
    cJSON *hm = ok ? cJSON_AddObjectToObject(o, "heatmap") : NULL;
    ok = hm && heatmap_to_json(hm, &a->all, n);
    cJSON *dims = ok ? cJSON_AddArrayToObject(o, "dims") : NULL;
    ok = dims != NULL;
    for (int d = 0; ok && d < a->n_dims && d < MS_AN_MAX_DIMS; d++) {
        cJSON *e = push_obj(dims);
        ok = e && add_str(e, "name", a->dim_names[d]) && heatmap_to_json(e, &a->per_dim[d], n);
    }
    cJSON *ov = ok ? cJSON_AddArrayToObject(o, "overlap") : NULL;
    ok = ov != NULL;
    for (int r = 0; ok && r < n && r < MS_AN_MAX_RANKS; r++) {
        const ms_rank_overlap *x = &a->overlap[r];
        cJSON *e = push_obj(ov);
        ok = e && add_num(e, "comm_s", x->comm_s) && add_num(e, "compute_s", x->compute_s) &&
             add_num(e, "overlapped_s", x->overlapped_s) &&
             add_num(e, "exposed_comm_s", x->exposed_comm_s) &&
             add_num(e, "overlap_ratio", x->overlap_ratio) &&
             add_num(e, "exposed_comm_step_s", x->exposed_comm_step_s) &&
             add_num(e, "steps", x->steps) && add_num(e, "dp_comm_s", x->dp_comm_s) &&
             add_num(e, "dp_hidden_s", x->dp_hidden_s) &&
             add_num(e, "dp_hidden_ratio", x->dp_hidden_ratio);
    }
    cJSON *bw = ok ? cJSON_AddArrayToObject(o, "busbw") : NULL;
    ok = bw != NULL;
    for (int i = 0; ok && i < a->n_busbw; i++) {
        const ms_busbw_row *x = &a->busbw[i];
        cJSON *e = push_obj(bw);
        ok = e && add_str(e, "coll", coll_name(x->coll)) && add_num(e, "mesh_dim", x->mesh_dim) &&
             add_num(e, "group_size", x->group_size) && add_num(e, "bytes", (double)x->bytes) &&
             add_num(e, "count", x->count) && add_num(e, "mean_s", x->mean_s) &&
             add_num(e, "busbw_gbs", x->busbw_gbs);
    }
    cJSON *ops = ok ? cJSON_AddArrayToObject(o, "ops") : NULL;
    ok = ops != NULL;
    for (int i = 0; ok && i < a->n_ops; i++) {
        const ms_op_row *x = &a->ops[i];
        cJSON *e = push_obj(ops);
        ok = e && add_str(e, "name", x->name) &&
             add_str(e, "phase", phase_names[x->phase <= MS_PHASE_OTHER ? x->phase : 2]) &&
             add_num(e, "count", x->count) && add_num(e, "seconds", x->seconds) &&
             add_num(e, "flops", x->flops);
    }
    cJSON *rs = ok ? cJSON_AddArrayToObject(o, "reshards") : NULL;
    ok = rs != NULL;
    for (int i = 0; ok && i < a->n_reshards; i++) {
        const ms_reshard_row *x = &a->reshards[i];
        cJSON *e = push_obj(rs);
        ok = e && add_str(e, "transition", x->transition) && add_num(e, "count", x->count) &&
             add_num(e, "bytes", x->bytes) && add_num(e, "seconds", x->seconds);
    }
    cJSON *st = ok ? cJSON_AddArrayToObject(o, "steps") : NULL;
    ok = st != NULL;
    for (int i = 0; ok && i < a->n_steps; i++) {
        const ms_step_row *x = &a->steps[i];
        cJSON *e = push_obj(st);
        ok = e && add_num(e, "step", (double)x->step) && add_num(e, "rank", x->rank) &&
             add_num(e, "wall_s", x->wall_s) && add_num(e, "compute_s", x->compute_s) &&
             add_num(e, "exposed_comm_s", x->exposed_comm_s) && add_num(e, "idle_s", x->idle_s);
    }
    cJSON *sg = ok ? cJSON_AddArrayToObject(o, "stragglers") : NULL;
    ok = sg != NULL;
    for (int i = 0; ok && i < a->n_stragglers; i++) {
        const ms_straggler *x = &a->stragglers[i];
        cJSON *e = push_obj(sg);
        ok = e && add_num(e, "rank", x->rank) && add_num(e, "last_fraction", x->last_fraction) &&
             add_num(e, "mean_lag_s", x->mean_lag_s) && add_num(e, "count", x->count);
    }
    return ok && pipe_stats_to_json(o, &a->pipe);
}

static bool suggestion_to_json(cJSON *e, const ms_suggestion *x) {
    const char *state = x->state < MS_SUGG_STATE_COUNT
                            ? ms_suggestion_state_name((ms_suggestion_state)x->state)
                            : "unknown";
    return add_num(e, "id", x->id) && add_str(e, "state", state) &&
           add_str(e, "target", x->target) && add_str(e, "target_json", x->target_json) &&
           add_str(e, "current", x->current) && add_num(e, "predicted_gain", x->predicted_gain) &&
           add_num(e, "predicted_step_s", x->predicted_step_s) &&
           add_num(e, "current_step_s", x->current_step_s) && add_str(e, "evidence", x->evidence) &&
           add_str(e, "memory_check", x->memory_check) && add_str(e, "diff", x->diff) &&
           add_str(e, "result", x->result) && add_num(e, "applied_step", (double)x->applied_step);
}

/* Copies len bytes of src to out (cap bytes), as many as fit; returns how many it copied. */
static size_t put_text(char *out, size_t cap, const char *src, size_t len) {
    if (len >= cap) len = cap - 1;
    memcpy(out, src, len);
    out[len] = '\0';
    return len;
}

/* text with the value of every "token=" written as "***", truncated to cap bytes. The last
 * event can quote the dashboard URL ("dashboard: http://...?token=T", cli/live_job.c), and
 * every reader of the snapshot, token holder or not, would learn the token from it. */
static void redact_token(const char *text, char *out, size_t cap) {
    static const char key[] = "token=";
    size_t n = put_text(out, cap, "", 0);
    for (const char *hit; (hit = strstr(text, key)) != NULL;) {
        n += put_text(out + n, cap - n, text, (size_t)(hit - text) + sizeof key - 1);
        n += put_text(out + n, cap - n, "***", 3);
        text = hit + sizeof key - 1;
        text += strcspn(text, "&# \t\r\n\"'");
    }
    put_text(out + n, cap - n, text, strlen(text));
}

cJSON *ms_snapshot_to_json(const ms_snapshot *s) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    char event[sizeof s->last_event];
    redact_token(s->last_event, event, sizeof event);
    bool ok = add_num(root, "schema", SNAPSHOT_SCHEMA) &&
              add_num(root, "version", (double)s->version) &&
              add_num(root, "taken_ns", (double)s->taken_ns);
    cJSON *info = ok ? cJSON_AddObjectToObject(root, "info") : NULL;
    ok = info && add_str(info, "model", s->info.model) &&
         add_str(info, "backend", s->info.backend) && add_num(info, "nranks", s->info.nranks) &&
         add_num(info, "tokens_per_step", (double)s->info.tokens_per_step) &&
         add_bool(info, "live", s->info.live);
    ok = ok && add_str(root, "strategy", s->strategy) && add_num(root, "step", (double)s->step) &&
         add_bool(root, "finished", s->finished) && add_str(root, "last_event", event) &&
         add_str(root, "hang_alert", s->hang_alert) &&
         add_num(root, "achieved_flops_per_s", s->achieved_flops_per_s);

    cJSON *hist = ok ? cJSON_AddArrayToObject(root, "history") : NULL;
    ok = hist != NULL;
    for (int i = 0; ok && s->history && i < s->n_history; i++) {
        const ms_live_step *x = &s->history[i];
        cJSON *e = push_obj(hist);
        ok = e && add_num(e, "step", (double)x->step) && add_num(e, "loss", x->loss) &&
             add_num(e, "step_s", x->step_s) && add_num(e, "tokens_per_s", x->tokens_per_s) &&
             add_num(e, "lr", x->lr) && add_num(e, "grad_norm", x->grad_norm) &&
             add_str(e, "strategy", x->strategy);
    }
    ok = ok && analysis_to_json(root, &s->analysis);

    cJSON *tl = ok ? cJSON_AddObjectToObject(root, "timeline") : NULL;
    ok = tl && add_num(tl, "step", (double)s->timeline_step) &&
         add_num(tl, "wall_s", s->timeline_wall_s);
    cJSON *spans = ok ? cJSON_AddArrayToObject(tl, "spans") : NULL;
    ok = spans != NULL;
    for (int i = 0; ok && s->timeline && i < s->n_timeline; i++) {
        const ms_live_span *x = &s->timeline[i];
        cJSON *e = push_obj(spans);
        ok = e && add_num(e, "rank", x->rank) &&
             add_str(e, "kind", x->kind < MS_LANE_KIND_COUNT ? lane_names[x->kind] : "compute") &&
             add_num(e, "t0", x->t0) && add_num(e, "t1", x->t1) && add_str(e, "name", x->name) &&
             add_num(e, "mesh_dim", x->mesh_dim);
    }

    ok = ok && pipeline_to_json(root, &s->pipeline);

    cJSON *mem = ok ? cJSON_AddArrayToObject(root, "mem") : NULL;
    ok = mem != NULL;
    for (int r = 0; ok && s->mem && r < s->info.nranks; r++) {
        cJSON *e = push_obj(mem);
        const ms_live_mem *m = &s->mem[r];
        ok = e && add_num(e, "in_use", (double)m->in_use) && add_num(e, "peak", (double)m->peak) &&
             add_num(e, "params", (double)m->params) && add_num(e, "grads", (double)m->grads) &&
             add_num(e, "optimizer", (double)m->optim) &&
             add_num(e, "activations", (double)m->acts) &&
             add_num(e, "host_optimizer", (double)m->host_optim);
    }

    cJSON *sug = ok ? cJSON_AddArrayToObject(root, "suggestions") : NULL;
    ok = sug != NULL;
    for (int i = 0; ok && i < s->n_suggestions && i < MS_LIVE_MAX_SUGGESTIONS; i++) {
        cJSON *e = push_obj(sug);
        ok = e && suggestion_to_json(e, &s->suggestions[i]);
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* --- reading --------------------------------------------------------------------------- */

/* The JSON path of the value being read, for messages: "$.analysis.ops[3].seconds". */
typedef struct rd {
    char path[256];
    size_t len;
    ms_error *err;
} rd;

static size_t push_key(rd *r, const char *k) {
    size_t old = r->len;
    int n = snprintf(r->path + r->len, sizeof r->path - r->len, ".%s", k);
    if (n > 0)
        r->len += (size_t)n < sizeof r->path - r->len ? (size_t)n : sizeof r->path - r->len - 1;
    return old;
}
static size_t push_idx(rd *r, int i) {
    size_t old = r->len;
    int n = snprintf(r->path + r->len, sizeof r->path - r->len, "[%d]", i);
    if (n > 0)
        r->len += (size_t)n < sizeof r->path - r->len ? (size_t)n : sizeof r->path - r->len - 1;
    return old;
}
static void pop(rd *r, size_t old) {
    r->len = old;
    r->path[old] = '\0';
}

static ms_status bad(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ms_status bad(rd *r, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ms_fail(r->err, MS_ERR_INVALID, "snapshot: %s: %s", r->path, what);
}

/* Looks up key in object o; with the path extended by key while `fn` runs. */
#define FIELD(r, o, key, call)                                                                     \
    do {                                                                                           \
        size_t old_ = push_key((r), (key));                                                        \
        const cJSON *v_ = cJSON_GetObjectItemCaseSensitive((o), (key));                            \
        ms_status st_ = (call);                                                                    \
        if (st_ != MS_OK) return st_;                                                              \
        pop((r), old_);                                                                            \
    } while (0)

/* FIELD for a key that later versions added: absent (a snapshot from an older server), the
 * value keeps its zero; present, it is checked like any other. */
#define OPT_FIELD(r, o, key, call)                                                                 \
    do {                                                                                           \
        if (cJSON_GetObjectItemCaseSensitive((o), (key))) FIELD(r, o, key, call);                  \
    } while (0)

static ms_status rd_num(rd *r, const cJSON *v, double *out) {
    if (cJSON_IsNull(v)) {
        *out = NAN;
        return MS_OK;
    }
    if (!cJSON_IsNumber(v)) return bad(r, "expected a number");
    *out = v->valuedouble;
    return MS_OK;
}
static ms_status rd_int(rd *r, const cJSON *v, double lo, double hi, int64_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return bad(r, "expected an integer in [%.0f, %.0f]", lo, hi);
    *out = (int64_t)v->valuedouble;
    return MS_OK;
}
static ms_status rd_i32(rd *r, const cJSON *v, double lo, double hi, int32_t *out) {
    int64_t x = 0;
    MS_CHECK(rd_int(r, v, lo, hi, &x));
    *out = (int32_t)x;
    return MS_OK;
}
static ms_status rd_i64(rd *r, const cJSON *v, int64_t *out) {
    return rd_int(r, v, -9007199254740992.0, 9007199254740992.0, out);
}
static ms_status rd_u64(rd *r, const cJSON *v, uint64_t *out) {
    /* 2^64 is exactly representable; anything below it converts. */
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble >= 18446744073709551616.0)
        return bad(r, "expected a non-negative integer");
    *out = (uint64_t)v->valuedouble;
    return MS_OK;
}
static ms_status rd_bool(rd *r, const cJSON *v, bool *out) {
    if (!cJSON_IsBool(v)) return bad(r, "expected true or false");
    *out = cJSON_IsTrue(v);
    return MS_OK;
}
static ms_status rd_str(rd *r, const cJSON *v, char *buf, size_t cap) {
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return bad(r, "expected a string of at most %zu bytes", cap - 1);
    memcpy(buf, v->valuestring, strlen(v->valuestring) + 1);
    return MS_OK;
}
/* One of names[0..n-1] -> its index. */
static ms_status rd_enum(rd *r, const cJSON *v, const char *const *names, int n, uint8_t *out) {
    if (cJSON_IsString(v))
        for (int i = 0; i < n; i++)
            if (names[i] && !strcmp(v->valuestring, names[i])) {
                *out = (uint8_t)i;
                return MS_OK;
            }
    char list[256] = "";
    for (int i = 0; i < n; i++)
        if (names[i])
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "",
                     names[i]);
    return bad(r, "expected one of %s", list);
}
static ms_status rd_obj(rd *r, const cJSON *v) {
    return cJSON_IsObject(v) ? MS_OK : bad(r, "expected an object");
}
/* An array of at most max elements; *n receives the count. */
static ms_status rd_arr(rd *r, const cJSON *v, int max, int *n) {
    if (!cJSON_IsArray(v)) return bad(r, "expected an array");
    int k = cJSON_GetArraySize(v);
    if (k > max) return bad(r, "expected at most %d elements (got %d)", max, k);
    *n = k;
    return MS_OK;
}
/* An array of exactly n numbers into a new malloc'd array (NULL when n == 0). */
static ms_status rd_nums(rd *r, const cJSON *v, size_t n, double **out) {
    if (!cJSON_IsArray(v) || (size_t)cJSON_GetArraySize(v) != n)
        return bad(r, "expected an array of %zu numbers", n);
    *out = NULL;
    if (n == 0) return MS_OK;
    double *a = malloc(n * sizeof *a);
    if (!a) return ms_fail(r->err, MS_ERR_NOMEM, "snapshot: %s: out of memory", r->path);
    size_t i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (cJSON_IsNull(e))
            a[i] = NAN;
        else if (cJSON_IsNumber(e))
            a[i] = e->valuedouble;
        else {
            free(a);
            size_t old = push_idx(r, (int)i);
            ms_status st = bad(r, "expected a number");
            pop(r, old);
            return st;
        }
    }
    *out = a;
    return MS_OK;
}
/* A zeroed array of n elements of size sz (NULL when n == 0). */
static ms_status rd_alloc(rd *r, size_t n, size_t sz, void **out) {
    *out = NULL;
    if (n == 0) return MS_OK;
    *out = calloc(n, sz);
    return *out ? MS_OK : ms_fail(r->err, MS_ERR_NOMEM, "snapshot: %s: out of memory", r->path);
}

static ms_status rd_heatmap(rd *r, const cJSON *o, int nranks, ms_heatmap *h) {
    MS_CHECK(rd_obj(r, o));
    int64_t dim = 0;
    FIELD(r, o, "mesh_dim", rd_int(r, v_, -1, MS_AN_MAX_DIMS - 1, &dim));
    h->mesh_dim = (int)dim;
    h->nranks = nranks;
    const size_t cells = (size_t)nranks * nranks;
    FIELD(r, o, "bytes", rd_nums(r, v_, cells, &h->bytes));
    FIELD(r, o, "seconds", rd_nums(r, v_, cells, &h->seconds));
    return MS_OK;
}

static ms_status rd_overlap(rd *r, const cJSON *e, ms_rank_overlap *x) {
    MS_CHECK(rd_obj(r, e));
    FIELD(r, e, "comm_s", rd_num(r, v_, &x->comm_s));
    FIELD(r, e, "compute_s", rd_num(r, v_, &x->compute_s));
    FIELD(r, e, "overlapped_s", rd_num(r, v_, &x->overlapped_s));
    FIELD(r, e, "exposed_comm_s", rd_num(r, v_, &x->exposed_comm_s));
    FIELD(r, e, "overlap_ratio", rd_num(r, v_, &x->overlap_ratio));
    OPT_FIELD(r, e, "exposed_comm_step_s", rd_num(r, v_, &x->exposed_comm_step_s));
    int64_t steps = 0;
    OPT_FIELD(r, e, "steps", rd_int(r, v_, 0, INT32_MAX, &steps));
    x->steps = (int)steps;
    OPT_FIELD(r, e, "dp_comm_s", rd_num(r, v_, &x->dp_comm_s));
    OPT_FIELD(r, e, "dp_hidden_s", rd_num(r, v_, &x->dp_hidden_s));
    OPT_FIELD(r, e, "dp_hidden_ratio", rd_num(r, v_, &x->dp_hidden_ratio));
    return MS_OK;
}

static ms_status rd_busbw(rd *r, const cJSON *e, void *row) {
    ms_busbw_row *x = row;
    const char *names[MS_COLL_KIND_COUNT];
    for (int k = 0; k < MS_COLL_KIND_COUNT; k++) names[k] = ms_coll_name((ms_coll_kind)k);
    MS_CHECK(rd_obj(r, e));
    FIELD(r, e, "coll", rd_enum(r, v_, names, MS_COLL_KIND_COUNT, &x->coll));
    int32_t gs = 0, count = 0, dim = -1;
    FIELD(r, e, "mesh_dim", rd_i32(r, v_, -1, INT16_MAX, &dim));
    x->mesh_dim = (int16_t)dim;
    FIELD(r, e, "group_size", rd_i32(r, v_, 0, INT32_MAX, &gs));
    FIELD(r, e, "bytes", rd_u64(r, v_, &x->bytes));
    FIELD(r, e, "count", rd_i32(r, v_, 0, INT32_MAX, &count));
    FIELD(r, e, "mean_s", rd_num(r, v_, &x->mean_s));
    FIELD(r, e, "busbw_gbs", rd_num(r, v_, &x->busbw_gbs));
    x->group_size = gs;
    x->count = count;
    return MS_OK;
}

static ms_status rd_op(rd *r, const cJSON *e, void *row) {
    ms_op_row *x = row;
    MS_CHECK(rd_obj(r, e));
    int32_t count = 0;
    FIELD(r, e, "name", rd_str(r, v_, x->name, sizeof x->name));
    FIELD(r, e, "phase", rd_enum(r, v_, phase_names, 3, &x->phase));
    FIELD(r, e, "count", rd_i32(r, v_, 0, INT32_MAX, &count));
    FIELD(r, e, "seconds", rd_num(r, v_, &x->seconds));
    FIELD(r, e, "flops", rd_num(r, v_, &x->flops));
    x->count = count;
    return MS_OK;
}

static ms_status rd_reshard(rd *r, const cJSON *e, void *row) {
    ms_reshard_row *x = row;
    MS_CHECK(rd_obj(r, e));
    int32_t count = 0;
    FIELD(r, e, "transition", rd_str(r, v_, x->transition, sizeof x->transition));
    FIELD(r, e, "count", rd_i32(r, v_, 0, INT32_MAX, &count));
    FIELD(r, e, "bytes", rd_num(r, v_, &x->bytes));
    FIELD(r, e, "seconds", rd_num(r, v_, &x->seconds));
    x->count = count;
    return MS_OK;
}

static ms_status rd_steprow(rd *r, const cJSON *e, void *row) {
    ms_step_row *x = row;
    MS_CHECK(rd_obj(r, e));
    int32_t rank = 0;
    FIELD(r, e, "step", rd_i64(r, v_, &x->step));
    FIELD(r, e, "rank", rd_i32(r, v_, -1, INT32_MAX, &rank));
    FIELD(r, e, "wall_s", rd_num(r, v_, &x->wall_s));
    FIELD(r, e, "compute_s", rd_num(r, v_, &x->compute_s));
    FIELD(r, e, "exposed_comm_s", rd_num(r, v_, &x->exposed_comm_s));
    FIELD(r, e, "idle_s", rd_num(r, v_, &x->idle_s));
    x->rank = rank;
    return MS_OK;
}

static ms_status rd_straggler(rd *r, const cJSON *e, void *row) {
    ms_straggler *x = row;
    MS_CHECK(rd_obj(r, e));
    int32_t rank = 0, count = 0;
    FIELD(r, e, "rank", rd_i32(r, v_, 0, MS_AN_MAX_RANKS - 1, &rank));
    FIELD(r, e, "last_fraction", rd_num(r, v_, &x->last_fraction));
    FIELD(r, e, "mean_lag_s", rd_num(r, v_, &x->mean_lag_s));
    FIELD(r, e, "count", rd_i32(r, v_, 0, INT32_MAX, &count));
    x->rank = rank;
    x->count = count;
    return MS_OK;
}

/* An array of exactly n numbers into a fixed array (n <= MS_AN_MAX_STAGES). */
static ms_status rd_stage_nums(rd *r, const cJSON *v, size_t n, double *out) {
    double *a = NULL;
    MS_CHECK(rd_nums(r, v, n, &a));
    if (n) memcpy(out, a, n * sizeof *a);
    free(a);
    return MS_OK;
}

static ms_status rd_pipe_stats(rd *r, const cJSON *o, ms_pipe_stats *p) {
    memset(p, 0, sizeof *p);
    if (cJSON_IsNull(o)) return MS_OK;
    MS_CHECK(rd_obj(r, o));
    int32_t stages = 0, v = 0, m = 0, steps = 0;
    FIELD(r, o, "schedule", rd_str(r, v_, p->schedule, sizeof p->schedule));
    FIELD(r, o, "stages", rd_i32(r, v_, 1, MS_AN_MAX_STAGES, &stages));
    FIELD(r, o, "virtual_stages", rd_i32(r, v_, 1, INT16_MAX, &v));
    FIELD(r, o, "micro_batches", rd_i32(r, v_, 1, INT32_MAX, &m));
    FIELD(r, o, "steps", rd_i32(r, v_, 0, INT32_MAX, &steps));
    FIELD(r, o, "last_step", rd_i64(r, v_, &p->last_step));
    FIELD(r, o, "bubble", rd_num(r, v_, &p->bubble));
    FIELD(r, o, "last_bubble", rd_num(r, v_, &p->last_bubble));
    FIELD(r, o, "formula", rd_num(r, v_, &p->formula));
    FIELD(r, o, "simulated", rd_num(r, v_, &p->simulated));
    FIELD(r, o, "mean_f_s", rd_num(r, v_, &p->mean_f_s));
    FIELD(r, o, "mean_b_s", rd_num(r, v_, &p->mean_b_s));
    FIELD(r, o, "mean_w_s", rd_num(r, v_, &p->mean_w_s));
    FIELD(r, o, "last_window_s", rd_num(r, v_, &p->last_window_s));
    double ranks[MS_AN_MAX_STAGES];
    FIELD(r, o, "stage_ranks", rd_stage_nums(r, v_, (size_t)stages, ranks));
    FIELD(r, o, "stage_bubble", rd_stage_nums(r, v_, (size_t)stages, p->stage_bubble));
    FIELD(r, o, "last_stage_bubble", rd_stage_nums(r, v_, (size_t)stages, p->last_stage_bubble));
    for (int k = 0; k < stages; k++) {
        if (!(ranks[k] >= 0 && ranks[k] <= MS_AN_MAX_RANKS && ranks[k] == floor(ranks[k])))
            return bad(r, "stage_ranks[%d]: expected an integer in [0, %d]", k, MS_AN_MAX_RANKS);
        p->stage_ranks[k] = (int)ranks[k];
    }
    p->stages = stages;
    p->virtual_stages = v;
    p->micro_batches = m;
    p->n_steps = steps;
    return MS_OK;
}

/* Reads the array at o[key] into a new array of rows (each read by fn); *n the count. Every
 * row reader has exactly this type (taking `void *row`), because calling a function through a
 * pointer of another type is undefined behaviour even when only the pointee type differs. */
typedef ms_status (*row_fn)(rd *r, const cJSON *e, void *row);
static ms_status rd_rows(rd *r, const cJSON *o, const char *key, size_t row_size, int max,
                         row_fn fn, void **rows, int *n) {
    size_t old = push_key(r, key);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    int k = 0;
    MS_CHECK(rd_arr(r, a, max, &k));
    MS_CHECK(rd_alloc(r, (size_t)k, row_size, rows));
    *n = k;
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        size_t o2 = push_idx(r, i);
        MS_CHECK(fn(r, e, (char *)*rows + (size_t)i * row_size));
        pop(r, o2);
    }
    pop(r, old);
    return MS_OK;
}
#define ROWS(r, o, key, type, max, fn, rows, n)                                                    \
    rd_rows((r), (o), (key), sizeof(type), (max), (fn), (void **)(rows), (n))

static ms_status rd_analysis(rd *r, const cJSON *o, ms_analysis *a) {
    MS_CHECK(rd_obj(r, o));
    int64_t nr = 0;
    FIELD(r, o, "nranks", rd_int(r, v_, 0, MS_AN_MAX_RANKS, &nr));
    a->nranks = (int)nr;
    FIELD(r, o, "step_lo", rd_i64(r, v_, &a->step_lo));
    FIELD(r, o, "step_hi", rd_i64(r, v_, &a->step_hi));
    FIELD(r, o, "heatmap", rd_heatmap(r, v_, a->nranks, &a->all));
    {
        size_t old = push_key(r, "dims");
        const cJSON *dims = cJSON_GetObjectItemCaseSensitive(o, "dims");
        MS_CHECK(rd_arr(r, dims, MS_AN_MAX_DIMS, &a->n_dims));
        int d = 0;
        for (const cJSON *e = dims->child; e; e = e->next, d++) {
            size_t o2 = push_idx(r, d);
            MS_CHECK(rd_obj(r, e));
            FIELD(r, e, "name", rd_str(r, v_, a->dim_names[d], sizeof a->dim_names[d]));
            MS_CHECK(rd_heatmap(r, e, a->nranks, &a->per_dim[d]));
            pop(r, o2);
        }
        pop(r, old);
    }
    {
        size_t old = push_key(r, "overlap");
        const cJSON *ov = cJSON_GetObjectItemCaseSensitive(o, "overlap");
        if (!cJSON_IsArray(ov) || cJSON_GetArraySize(ov) != a->nranks)
            return bad(r, "expected an array of %d objects (one per rank)", a->nranks);
        int i = 0;
        for (const cJSON *e = ov->child; e; e = e->next, i++) {
            size_t o2 = push_idx(r, i);
            MS_CHECK(rd_overlap(r, e, &a->overlap[i]));
            pop(r, o2);
        }
        pop(r, old);
    }
    MS_CHECK(ROWS(r, o, "busbw", ms_busbw_row, MAX_LIST, rd_busbw, &a->busbw, &a->n_busbw));
    MS_CHECK(ROWS(r, o, "ops", ms_op_row, MAX_LIST, rd_op, &a->ops, &a->n_ops));
    MS_CHECK(
        ROWS(r, o, "reshards", ms_reshard_row, MAX_LIST, rd_reshard, &a->reshards, &a->n_reshards));
    MS_CHECK(ROWS(r, o, "steps", ms_step_row, MAX_LIST, rd_steprow, &a->steps, &a->n_steps));
    MS_CHECK(ROWS(r, o, "stragglers", ms_straggler, MS_AN_MAX_RANKS, rd_straggler, &a->stragglers,
                  &a->n_stragglers));
    FIELD(r, o, "pipeline", rd_pipe_stats(r, v_, &a->pipe));
    return MS_OK;
}

static ms_status rd_history(rd *r, const cJSON *e, void *row) {
    ms_live_step *x = row;
    MS_CHECK(rd_obj(r, e));
    FIELD(r, e, "step", rd_i64(r, v_, &x->step));
    FIELD(r, e, "loss", rd_num(r, v_, &x->loss));
    FIELD(r, e, "step_s", rd_num(r, v_, &x->step_s));
    FIELD(r, e, "tokens_per_s", rd_num(r, v_, &x->tokens_per_s));
    FIELD(r, e, "lr", rd_num(r, v_, &x->lr));
    FIELD(r, e, "grad_norm", rd_num(r, v_, &x->grad_norm));
    FIELD(r, e, "strategy", rd_str(r, v_, x->strategy, sizeof x->strategy));
    return MS_OK;
}

static ms_status rd_span(rd *r, const cJSON *e, void *row) {
    ms_live_span *x = row;
    MS_CHECK(rd_obj(r, e));
    int32_t rank = 0, dim = 0;
    FIELD(r, e, "rank", rd_i32(r, v_, 0, INT32_MAX, &rank));
    FIELD(r, e, "kind", rd_enum(r, v_, lane_names, MS_LANE_KIND_COUNT, &x->kind));
    FIELD(r, e, "t0", rd_num(r, v_, &x->t0));
    FIELD(r, e, "t1", rd_num(r, v_, &x->t1));
    FIELD(r, e, "name", rd_str(r, v_, x->name, sizeof x->name));
    FIELD(r, e, "mesh_dim", rd_i32(r, v_, INT16_MIN, INT16_MAX, &dim));
    x->rank = rank;
    x->mesh_dim = (int16_t)dim;
    return MS_OK;
}

static ms_status rd_block(rd *r, const cJSON *e, void *row) {
    ms_live_pipe_block *x = row;
    MS_CHECK(rd_obj(r, e));
    int32_t stage = 0, mb = 0, chunk = 0;
    FIELD(r, e, "stage", rd_i32(r, v_, 0, MS_AN_MAX_STAGES - 1, &stage));
    FIELD(r, e, "action", rd_enum(r, v_, action_names, 3, &x->action));
    FIELD(r, e, "mb", rd_i32(r, v_, 0, INT32_MAX, &mb));
    FIELD(r, e, "chunk", rd_i32(r, v_, 0, UINT8_MAX, &chunk));
    FIELD(r, e, "t0", rd_num(r, v_, &x->t0));
    FIELD(r, e, "t1", rd_num(r, v_, &x->t1));
    x->stage = (int16_t)stage;
    x->mb = mb;
    x->chunk = (uint8_t)chunk;
    return MS_OK;
}

static ms_status rd_pipeline(rd *r, const cJSON *o, ms_live_pipeline *pl) {
    pl->step = -1;
    if (cJSON_IsNull(o)) return MS_OK;
    MS_CHECK(rd_obj(r, o));
    int64_t step = 0;
    FIELD(r, o, "step", rd_int(r, v_, 0, 9007199254740992.0, &step));
    FIELD(r, o, "wall_s", rd_num(r, v_, &pl->wall_s));
    {
        size_t old = push_key(r, "lanes");
        const cJSON *lanes = cJSON_GetObjectItemCaseSensitive(o, "lanes");
        MS_CHECK(rd_arr(r, lanes, MS_AN_MAX_STAGES, &pl->stages));
        if (pl->stages < 1) return bad(r, "expected at least one lane");
        int k = 0;
        for (const cJSON *e = lanes->child; e; e = e->next, k++) {
            size_t o2 = push_idx(r, k);
            MS_CHECK(rd_obj(r, e));
            int32_t stage = 0;
            FIELD(r, e, "stage", rd_i32(r, v_, k, k, &stage));
            FIELD(r, e, "rank", rd_i32(r, v_, -1, INT32_MAX, &pl->rank[k]));
            pop(r, o2);
        }
        pop(r, old);
    }
    MS_CHECK(
        ROWS(r, o, "blocks", ms_live_pipe_block, MAX_LIST, rd_block, &pl->blocks, &pl->n_blocks));
    for (int i = 0; i < pl->n_blocks; i++)
        if (pl->blocks[i].stage >= pl->stages) {
            size_t o1 = push_key(r, "blocks"), o2 = push_idx(r, i);
            ms_status st = bad(r, "stage %d: there are %d lanes", pl->blocks[i].stage, pl->stages);
            pop(r, o2);
            pop(r, o1);
            return st;
        }
    pl->step = step;
    return MS_OK;
}

static ms_status rd_mem(rd *r, const cJSON *e, ms_live_mem *x) {
    MS_CHECK(rd_obj(r, e));
    FIELD(r, e, "in_use", rd_u64(r, v_, &x->in_use));
    FIELD(r, e, "peak", rd_u64(r, v_, &x->peak));
    OPT_FIELD(r, e, "params", rd_u64(r, v_, &x->params));
    OPT_FIELD(r, e, "grads", rd_u64(r, v_, &x->grads));
    OPT_FIELD(r, e, "optimizer", rd_u64(r, v_, &x->optim));
    OPT_FIELD(r, e, "activations", rd_u64(r, v_, &x->acts));
    OPT_FIELD(r, e, "host_optimizer", rd_u64(r, v_, &x->host_optim));
    return MS_OK;
}

static ms_status rd_suggestion(rd *r, const cJSON *e, ms_suggestion *x) {
    const char *states[MS_SUGG_STATE_COUNT];
    for (int k = 0; k < MS_SUGG_STATE_COUNT; k++)
        states[k] = ms_suggestion_state_name((ms_suggestion_state)k);
    MS_CHECK(rd_obj(r, e));
    FIELD(r, e, "id", rd_i32(r, v_, 1, INT32_MAX, &x->id));
    FIELD(r, e, "state", rd_enum(r, v_, states, MS_SUGG_STATE_COUNT, &x->state));
    FIELD(r, e, "target", rd_str(r, v_, x->target, sizeof x->target));
    FIELD(r, e, "target_json", rd_str(r, v_, x->target_json, sizeof x->target_json));
    FIELD(r, e, "current", rd_str(r, v_, x->current, sizeof x->current));
    FIELD(r, e, "predicted_gain", rd_num(r, v_, &x->predicted_gain));
    FIELD(r, e, "predicted_step_s", rd_num(r, v_, &x->predicted_step_s));
    FIELD(r, e, "current_step_s", rd_num(r, v_, &x->current_step_s));
    FIELD(r, e, "evidence", rd_str(r, v_, x->evidence, sizeof x->evidence));
    FIELD(r, e, "memory_check", rd_str(r, v_, x->memory_check, sizeof x->memory_check));
    FIELD(r, e, "diff", rd_str(r, v_, x->diff, sizeof x->diff));
    FIELD(r, e, "result", rd_str(r, v_, x->result, sizeof x->result));
    FIELD(r, e, "applied_step", rd_i64(r, v_, &x->applied_step));
    return MS_OK;
}

static ms_status rd_snapshot(rd *r, const cJSON *root, ms_snapshot *s) {
    MS_CHECK(rd_obj(r, root));
    int64_t schema = 0;
    FIELD(r, root, "schema", rd_int(r, v_, SNAPSHOT_SCHEMA, SNAPSHOT_SCHEMA, &schema));
    FIELD(r, root, "version", rd_u64(r, v_, &s->version));
    FIELD(r, root, "taken_ns", rd_i64(r, v_, &s->taken_ns));
    {
        size_t old = push_key(r, "info");
        const cJSON *info = cJSON_GetObjectItemCaseSensitive(root, "info");
        MS_CHECK(rd_obj(r, info));
        int64_t nr = 0;
        FIELD(r, info, "model", rd_str(r, v_, s->info.model, sizeof s->info.model));
        FIELD(r, info, "backend", rd_str(r, v_, s->info.backend, sizeof s->info.backend));
        FIELD(r, info, "nranks", rd_int(r, v_, 0, MAX_INFO_RANKS, &nr));
        FIELD(r, info, "tokens_per_step", rd_i64(r, v_, &s->info.tokens_per_step));
        FIELD(r, info, "live", rd_bool(r, v_, &s->info.live));
        s->info.nranks = (int)nr;
        pop(r, old);
    }
    FIELD(r, root, "strategy", rd_str(r, v_, s->strategy, sizeof s->strategy));
    FIELD(r, root, "step", rd_i64(r, v_, &s->step));
    FIELD(r, root, "finished", rd_bool(r, v_, &s->finished));
    FIELD(r, root, "last_event", rd_str(r, v_, s->last_event, sizeof s->last_event));
    OPT_FIELD(r, root, "hang_alert", rd_str(r, v_, s->hang_alert, sizeof s->hang_alert));
    FIELD(r, root, "achieved_flops_per_s", rd_num(r, v_, &s->achieved_flops_per_s));
    MS_CHECK(
        ROWS(r, root, "history", ms_live_step, MAX_LIST, rd_history, &s->history, &s->n_history));
    FIELD(r, root, "analysis", rd_analysis(r, v_, &s->analysis));
    {
        size_t old = push_key(r, "timeline");
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "timeline");
        MS_CHECK(rd_obj(r, tl));
        FIELD(r, tl, "step", rd_i64(r, v_, &s->timeline_step));
        FIELD(r, tl, "wall_s", rd_num(r, v_, &s->timeline_wall_s));
        MS_CHECK(
            ROWS(r, tl, "spans", ms_live_span, MAX_LIST, rd_span, &s->timeline, &s->n_timeline));
        pop(r, old);
    }
    FIELD(r, root, "pipeline", rd_pipeline(r, v_, &s->pipeline));
    {
        /* Either one entry per rank or none yet; the snapshot always gets nranks entries. */
        size_t old = push_key(r, "mem");
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(root, "mem");
        int k = 0;
        if (!cJSON_IsArray(mem) || ((k = cJSON_GetArraySize(mem)) != 0 && k != s->info.nranks))
            return bad(r, "expected an array of %d objects (one per rank) or an empty array",
                       s->info.nranks);
        MS_CHECK(rd_alloc(r, (size_t)s->info.nranks, sizeof *s->mem, (void **)&s->mem));
        int i = 0;
        for (const cJSON *e = mem->child; e; e = e->next, i++) {
            size_t o2 = push_idx(r, i);
            MS_CHECK(rd_mem(r, e, &s->mem[i]));
            pop(r, o2);
        }
        pop(r, old);
    }
    {
        size_t old = push_key(r, "suggestions");
        const cJSON *sug = cJSON_GetObjectItemCaseSensitive(root, "suggestions");
        MS_CHECK(rd_arr(r, sug, MS_LIVE_MAX_SUGGESTIONS, &s->n_suggestions));
        int i = 0;
        for (const cJSON *e = sug->child; e; e = e->next, i++) {
            size_t o2 = push_idx(r, i);
            MS_CHECK(rd_suggestion(r, e, &s->suggestions[i]));
            pop(r, o2);
        }
        pop(r, old);
    }
    return MS_OK;
}

ms_status ms_snapshot_from_json(const char *text, size_t len, ms_snapshot **out, ms_error *err) {
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        return ms_fail(err, MS_ERR_INVALID, "snapshot: malformed JSON near byte %zu", off);
    }
    for (size_t i = (size_t)(end - text); i < len; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\n') {
            cJSON_Delete(root);
            return ms_fail(err, MS_ERR_INVALID,
                           "snapshot: trailing text after the JSON at byte %zu", i);
        }
    ms_snapshot *s = ms_snapshot_new();
    if (!s) {
        cJSON_Delete(root);
        return ms_fail(err, MS_ERR_NOMEM, "snapshot: out of memory");
    }
    rd r = {.path = "$", .len = 1, .err = err};
    ms_status st = rd_snapshot(&r, root, s);
    cJSON_Delete(root);
    if (st != MS_OK) {
        ms_snapshot_release(s);
        return st;
    }
    *out = s;
    return MS_OK;
}

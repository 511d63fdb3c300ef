/* snapshot_json.c - a live snapshot as JSON and back (format: docs/api.md, "The snapshot").
 *
 * Each record (an op row, a step, a suggestion, ...) is described once, by a table of its
 * fields (key, type, place in the struct, accepted range), which both the writer and the
 * reader walk, so the two cannot disagree on a key. Reading is strict: every field the writer
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
#include <stddef.h>
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

static const char *lane_name(int i) {
    return lane_names[i];
}
static const char *phase_name(int i) {
    return phase_names[i];
}
static const char *action_name(int i) {
    return action_names[i];
}
static const char *coll_name(int i) {
    return ms_coll_name((ms_coll_kind)i);
}
static const char *state_name(int i) {
    return ms_suggestion_state_name((ms_suggestion_state)i);
}

/* --- the records' fields: one table each, for writing and reading ------------------------ */

typedef enum field_kind {
    K_NUM,  /* double; NaN as null */
    K_INT,  /* a signed or unsigned integer of `size` bytes in [lo, hi] (signed when lo < 0) */
    K_U64,  /* uint64_t, any value below 2^64 */
    K_BOOL, /* bool */
    K_STR,  /* char[size], NUL-terminated */
    K_ENUM  /* uint8_t, written as name(value) for value < count */
} field_kind;

typedef struct field {
    const char *key;
    uint8_t kind;
    bool optional; /* added by a later version: may be absent when read (keeps its zero) */
    size_t off, size;
    double lo, hi;              /* K_INT */
    const char *(*name)(int i); /* K_ENUM */
    int count;                  /* K_ENUM */
} field;

#define AT_(T, m) .off = offsetof(T, m), .size = sizeof(((T *)0)->m)
#define F_NUM(T, m, k, ...)                                                                        \
    { .key = k, .kind = K_NUM, AT_(T, m), __VA_ARGS__ }
#define F_INT(T, m, k, l, h, ...)                                                                  \
    { .key = k, .kind = K_INT, AT_(T, m), .lo = l, .hi = h, __VA_ARGS__ }
#define F_U64(T, m, k, ...)                                                                        \
    { .key = k, .kind = K_U64, AT_(T, m), __VA_ARGS__ }
#define F_BOOL(T, m, k, ...)                                                                       \
    { .key = k, .kind = K_BOOL, AT_(T, m), __VA_ARGS__ }
#define F_STR(T, m, k, ...)                                                                        \
    { .key = k, .kind = K_STR, AT_(T, m), __VA_ARGS__ }
#define F_ENUM(T, m, k, fn, n, ...)                                                                \
    { .key = k, .kind = K_ENUM, AT_(T, m), .name = fn, .count = n, __VA_ARGS__ }
#define I53         9007199254740992.0 /* 2^53: the integers a double holds exactly */
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

static const field overlap_fields[] = {
    F_NUM(ms_rank_overlap, comm_s, "comm_s"),
    F_NUM(ms_rank_overlap, compute_s, "compute_s"),
    F_NUM(ms_rank_overlap, overlapped_s, "overlapped_s"),
    F_NUM(ms_rank_overlap, exposed_comm_s, "exposed_comm_s"),
    F_NUM(ms_rank_overlap, overlap_ratio, "overlap_ratio"),
    F_NUM(ms_rank_overlap, exposed_comm_step_s, "exposed_comm_step_s", .optional = true),
    F_INT(ms_rank_overlap, steps, "steps", 0, INT32_MAX, .optional = true),
    F_NUM(ms_rank_overlap, dp_comm_s, "dp_comm_s", .optional = true),
    F_NUM(ms_rank_overlap, dp_hidden_s, "dp_hidden_s", .optional = true),
    F_NUM(ms_rank_overlap, dp_hidden_ratio, "dp_hidden_ratio", .optional = true),
};
static const field busbw_fields[] = {
    F_ENUM(ms_busbw_row, coll, "coll", coll_name, MS_COLL_KIND_COUNT),
    F_INT(ms_busbw_row, mesh_dim, "mesh_dim", -1, INT16_MAX),
    F_INT(ms_busbw_row, group_size, "group_size", 0, INT32_MAX),
    F_U64(ms_busbw_row, bytes, "bytes"),
    F_INT(ms_busbw_row, count, "count", 0, INT32_MAX),
    F_NUM(ms_busbw_row, mean_s, "mean_s"),
    F_NUM(ms_busbw_row, busbw_gbs, "busbw_gbs"),
};
static const field op_fields[] = {
    F_STR(ms_op_row, name, "name"),
    F_ENUM(ms_op_row, phase, "phase", phase_name, 3),
    F_INT(ms_op_row, count, "count", 0, INT32_MAX),
    F_NUM(ms_op_row, seconds, "seconds"),
    F_NUM(ms_op_row, flops, "flops"),
};
static const field reshard_fields[] = {
    F_STR(ms_reshard_row, transition, "transition"),
    F_INT(ms_reshard_row, count, "count", 0, INT32_MAX),
    F_NUM(ms_reshard_row, bytes, "bytes"),
    F_NUM(ms_reshard_row, seconds, "seconds"),
};
static const field step_fields[] = {
    F_INT(ms_step_row, step, "step", -I53, I53),
    F_INT(ms_step_row, rank, "rank", -1, INT32_MAX),
    F_NUM(ms_step_row, wall_s, "wall_s"),
    F_NUM(ms_step_row, compute_s, "compute_s"),
    F_NUM(ms_step_row, exposed_comm_s, "exposed_comm_s"),
    F_NUM(ms_step_row, idle_s, "idle_s"),
};
static const field straggler_fields[] = {
    F_INT(ms_straggler, rank, "rank", 0, MS_AN_MAX_RANKS - 1),
    F_NUM(ms_straggler, last_fraction, "last_fraction"),
    F_NUM(ms_straggler, mean_lag_s, "mean_lag_s"),
    F_INT(ms_straggler, count, "count", 0, INT32_MAX),
};
/* ms_pipe_stats' scalars; its per-stage arrays follow them. */
static const field pipe_fields[] = {
    F_STR(ms_pipe_stats, schedule, "schedule"),
    F_INT(ms_pipe_stats, stages, "stages", 1, MS_AN_MAX_STAGES),
    F_INT(ms_pipe_stats, virtual_stages, "virtual_stages", 1, INT16_MAX),
    F_INT(ms_pipe_stats, micro_batches, "micro_batches", 1, INT32_MAX),
    F_INT(ms_pipe_stats, n_steps, "steps", 0, INT32_MAX),
    F_INT(ms_pipe_stats, last_step, "last_step", -I53, I53),
    F_NUM(ms_pipe_stats, bubble, "bubble"),
    F_NUM(ms_pipe_stats, last_bubble, "last_bubble"),
    F_NUM(ms_pipe_stats, formula, "formula"),
    F_NUM(ms_pipe_stats, simulated, "simulated"),
    F_NUM(ms_pipe_stats, mean_f_s, "mean_f_s"),
    F_NUM(ms_pipe_stats, mean_b_s, "mean_b_s"),
    F_NUM(ms_pipe_stats, mean_w_s, "mean_w_s"),
    F_NUM(ms_pipe_stats, last_window_s, "last_window_s"),
};
static const field history_fields[] = {
    F_INT(ms_live_step, step, "step", -I53, I53),
    F_NUM(ms_live_step, loss, "loss"),
    F_NUM(ms_live_step, step_s, "step_s"),
    F_NUM(ms_live_step, tokens_per_s, "tokens_per_s"),
    F_NUM(ms_live_step, lr, "lr"),
    F_NUM(ms_live_step, grad_norm, "grad_norm"),
    F_STR(ms_live_step, strategy, "strategy"),
};
static const field span_fields[] = {
    F_INT(ms_live_span, rank, "rank", 0, INT32_MAX),
    F_ENUM(ms_live_span, kind, "kind", lane_name, MS_LANE_KIND_COUNT),
    F_NUM(ms_live_span, t0, "t0"),
    F_NUM(ms_live_span, t1, "t1"),
    F_STR(ms_live_span, name, "name"),
    F_INT(ms_live_span, mesh_dim, "mesh_dim", INT16_MIN, INT16_MAX),
};
static const field block_fields[] = {
    F_INT(ms_live_pipe_block, stage, "stage", 0, MS_AN_MAX_STAGES - 1),
    F_ENUM(ms_live_pipe_block, action, "action", action_name, 3),
    F_INT(ms_live_pipe_block, mb, "mb", 0, INT32_MAX),
    F_INT(ms_live_pipe_block, chunk, "chunk", 0, UINT8_MAX),
    F_NUM(ms_live_pipe_block, t0, "t0"),
    F_NUM(ms_live_pipe_block, t1, "t1"),
};
static const field mem_fields[] = {
    F_U64(ms_live_mem, in_use, "in_use"),
    F_U64(ms_live_mem, peak, "peak"),
    F_U64(ms_live_mem, params, "params", .optional = true),
    F_U64(ms_live_mem, grads, "grads", .optional = true),
    F_U64(ms_live_mem, optim, "optimizer", .optional = true),
    F_U64(ms_live_mem, acts, "activations", .optional = true),
    F_U64(ms_live_mem, host_optim, "host_optimizer", .optional = true),
};
static const field suggestion_fields[] = {
    F_INT(ms_suggestion, id, "id", 1, INT32_MAX),
    F_ENUM(ms_suggestion, state, "state", state_name, MS_SUGG_STATE_COUNT),
    F_STR(ms_suggestion, target, "target"),
    F_STR(ms_suggestion, target_json, "target_json"),
    F_STR(ms_suggestion, current, "current"),
    F_NUM(ms_suggestion, predicted_gain, "predicted_gain"),
    F_NUM(ms_suggestion, predicted_step_s, "predicted_step_s"),
    F_NUM(ms_suggestion, current_step_s, "current_step_s"),
    F_STR(ms_suggestion, evidence, "evidence"),
    F_STR(ms_suggestion, memory_check, "memory_check"),
    F_STR(ms_suggestion, diff, "diff"),
    F_STR(ms_suggestion, result, "result"),
    F_INT(ms_suggestion, applied_step, "applied_step", -I53, I53),
};
static const field info_fields[] = {
    F_STR(ms_live_info, model, "model"),
    F_STR(ms_live_info, backend, "backend"),
    F_INT(ms_live_info, nranks, "nranks", 0, MAX_INFO_RANKS),
    F_INT(ms_live_info, tokens_per_step, "tokens_per_step", -I53, I53),
    F_BOOL(ms_live_info, live, "live"),
};
/* The snapshot's own scalars before "info", and after it (last_event, redacted, by hand). */
static const field head_fields[] = {
    F_U64(ms_snapshot, version, "version"),
    F_INT(ms_snapshot, taken_ns, "taken_ns", -I53, I53),
};
static const field state_fields[] = {
    F_STR(ms_snapshot, strategy, "strategy"),
    F_INT(ms_snapshot, step, "step", -I53, I53),
    F_BOOL(ms_snapshot, finished, "finished"),
};
static const field tail_fields[] = {
    F_STR(ms_snapshot, hang_alert, "hang_alert", .optional = true),
    F_STR(ms_snapshot, advisor_note, "advisor_note", .optional = true),
    F_NUM(ms_snapshot, achieved_flops_per_s, "achieved_flops_per_s"),
};
#define TABLE(t) (t), COUNT_OF(t)

/* Moves the integer of f's size and signedness at p into *v, or *v (already within f's
 * range) into p when `store`. */
#define INT_IO(T) (store ? (void)(*(T *)p = (T)*v) : (void)(*v = (int64_t) * (const T *)p))
static void int_io(const field *f, void *p, int64_t *v, bool store) {
    const bool sgn = f->lo < 0;
    switch (f->size) {
        case 1:
            sgn ? INT_IO(int8_t) : INT_IO(uint8_t);
            break;
        case 2:
            sgn ? INT_IO(int16_t) : INT_IO(uint16_t);
            break;
        case 4:
            sgn ? INT_IO(int32_t) : INT_IO(uint32_t);
            break;
        default:
            INT_IO(int64_t);
    }
}

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

/* Every field of table f, read from the record at x. */
static bool put_fields(cJSON *o, const void *x, const field *f, size_t n) {
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        const void *p = (const char *)x + f[i].off;
        switch (f[i].kind) {
            case K_NUM:
                ok = add_num(o, f[i].key, *(const double *)p);
                break;
            case K_INT: {
                int64_t v = 0;
                int_io(&f[i], (void *)p, &v, false);
                ok = add_num(o, f[i].key, (double)v);
                break;
            }
            case K_U64:
                ok = add_num(o, f[i].key, (double)*(const uint64_t *)p);
                break;
            case K_BOOL:
                ok = add_bool(o, f[i].key, *(const bool *)p);
                break;
            case K_STR:
                ok = add_str(o, f[i].key, (const char *)p);
                break;
            default: {
                const uint8_t v = *(const uint8_t *)p;
                ok = add_str(o, f[i].key, v < f[i].count ? f[i].name(v) : "unknown");
            }
        }
    }
    return ok;
}

/* o[key]: an array of n records of row_size bytes, each an object of table f. */
static bool put_rows(cJSON *o, const char *key, const void *rows, int n, size_t row_size,
                     const field *f, size_t nf) {
    cJSON *a = cJSON_AddArrayToObject(o, key);
    bool ok = a != NULL;
    for (int i = 0; ok && rows && i < n; i++) {
        cJSON *e = push_obj(a);
        ok = e && put_fields(e, (const char *)rows + (size_t)i * row_size, f, nf);
    }
    return ok;
}
#define PUT_ROWS(o, key, rows, n, table)                                                           \
    put_rows((o), (key), (rows), (n), sizeof *(rows), TABLE(table))

static bool heatmap_to_json(cJSON *o, const ms_heatmap *h, int nranks) {
    size_t cells = h->bytes && h->seconds ? (size_t)nranks * nranks : 0;
    return add_num(o, "mesh_dim", h->mesh_dim) && add_nums(o, "bytes", h->bytes, cells) &&
           add_nums(o, "seconds", h->seconds, cells);
}

/* analysis.pipeline: null without pipeline actions. */
static bool pipe_stats_to_json(cJSON *o, const ms_pipe_stats *p) {
    if (p->stages < 1 || p->stages > MS_AN_MAX_STAGES)
        return cJSON_AddNullToObject(o, "pipeline") != NULL;
    cJSON *e = cJSON_AddObjectToObject(o, "pipeline");
    double ranks[MS_AN_MAX_STAGES];
    for (int k = 0; k < p->stages; k++) ranks[k] = p->stage_ranks[k];
    const size_t n = (size_t)p->stages;
    return e && put_fields(e, p, TABLE(pipe_fields)) && add_nums(e, "stage_ranks", ranks, n) &&
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
    return ok && PUT_ROWS(o, "blocks", pl->blocks, pl->n_blocks, block_fields);
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
    const int nr = n < MS_AN_MAX_RANKS ? n : MS_AN_MAX_RANKS;
    ok = ok && PUT_ROWS(o, "overlap", a->overlap, nr, overlap_fields) &&
         PUT_ROWS(o, "busbw", a->busbw, a->n_busbw, busbw_fields) &&
         PUT_ROWS(o, "ops", a->ops, a->n_ops, op_fields) &&
         PUT_ROWS(o, "reshards", a->reshards, a->n_reshards, reshard_fields) &&
         PUT_ROWS(o, "steps", a->steps, a->n_steps, step_fields) &&
         PUT_ROWS(o, "stragglers", a->stragglers, a->n_stragglers, straggler_fields);
    return ok && pipe_stats_to_json(o, &a->pipe);
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
    bool ok = add_num(root, "schema", SNAPSHOT_SCHEMA) && put_fields(root, s, TABLE(head_fields));
    cJSON *info = ok ? cJSON_AddObjectToObject(root, "info") : NULL;
    ok = info && put_fields(info, &s->info, TABLE(info_fields)) &&
         put_fields(root, s, TABLE(state_fields)) && add_str(root, "last_event", event) &&
         put_fields(root, s, TABLE(tail_fields)) &&
         PUT_ROWS(root, "history", s->history, s->n_history, history_fields) &&
         analysis_to_json(root, &s->analysis);
    cJSON *tl = ok ? cJSON_AddObjectToObject(root, "timeline") : NULL;
    ok = tl && add_num(tl, "step", (double)s->timeline_step) &&
         add_num(tl, "wall_s", s->timeline_wall_s) &&
         PUT_ROWS(tl, "spans", s->timeline, s->n_timeline, span_fields) &&
         pipeline_to_json(root, &s->pipeline) &&
         PUT_ROWS(root, "mem", s->mem, s->mem ? s->info.nranks : 0, mem_fields);
    const int ns =
        s->n_suggestions < MS_LIVE_MAX_SUGGESTIONS ? s->n_suggestions : MS_LIVE_MAX_SUGGESTIONS;
    ok = ok && PUT_ROWS(root, "suggestions", s->suggestions, ns, suggestion_fields);
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

/* One field of table f from object o into the record at x. */
static ms_status rd_field(rd *r, const cJSON *v, const field *f, void *x) {
    void *p = (char *)x + f->off;
    switch (f->kind) {
        case K_NUM:
            return rd_num(r, v, p);
        case K_U64:
            return rd_u64(r, v, p);
        case K_BOOL:
            return rd_bool(r, v, p);
        case K_STR:
            return rd_str(r, v, p, f->size);
        case K_INT: {
            int64_t i = 0;
            MS_CHECK(rd_int(r, v, f->lo, f->hi, &i));
            int_io(f, p, &i, true);
            return MS_OK;
        }
        default: {
            const char *names[256];
            for (int k = 0; k < f->count && k < 256; k++) names[k] = f->name(k);
            return rd_enum(r, v, names, f->count < 256 ? f->count : 256, p);
        }
    }
}

/* Every field of table f from object o into the record at x; an optional one may be absent. */
static ms_status rd_fields(rd *r, const cJSON *o, const field *f, size_t n, void *x) {
    MS_CHECK(rd_obj(r, o));
    for (size_t i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, f[i].key);
        if (!v && f[i].optional) continue;
        size_t old = push_key(r, f[i].key);
        MS_CHECK(rd_field(r, v, &f[i], x));
        pop(r, old);
    }
    return MS_OK;
}

/* Reads the array at o[key], of at most max objects of table f, into a new array of records of
 * row_size bytes; *n the count. */
static ms_status rd_rows(rd *r, const cJSON *o, const char *key, size_t row_size, int max,
                         const field *f, size_t nf, void **rows, int *n) {
    size_t old = push_key(r, key);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    int k = 0;
    MS_CHECK(rd_arr(r, a, max, &k));
    MS_CHECK(rd_alloc(r, (size_t)k, row_size, rows));
    *n = k;
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        size_t o2 = push_idx(r, i);
        MS_CHECK(rd_fields(r, e, f, nf, (char *)*rows + (size_t)i * row_size));
        pop(r, o2);
    }
    pop(r, old);
    return MS_OK;
}
#define ROWS(r, o, key, max, table, rows, n)                                                       \
    rd_rows((r), (o), (key), sizeof **(rows), (max), TABLE(table), (void **)(rows), (n))

/* The array at o[key] of exactly n objects of table f into the records at rows (a fixed
 * array: one per rank). */
static ms_status rd_exact_rows(rd *r, const cJSON *o, const char *key, int n, size_t row_size,
                               const field *f, size_t nf, void *rows, const char *what) {
    size_t old = push_key(r, key);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return bad(r, "expected an array of %d objects (%s)", n, what);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        size_t o2 = push_idx(r, i);
        MS_CHECK(rd_fields(r, e, f, nf, (char *)rows + (size_t)i * row_size));
        pop(r, o2);
    }
    pop(r, old);
    return MS_OK;
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
    MS_CHECK(rd_fields(r, o, TABLE(pipe_fields), p));
    const int stages = p->stages;
    double ranks[MS_AN_MAX_STAGES];
    FIELD(r, o, "stage_ranks", rd_stage_nums(r, v_, (size_t)stages, ranks));
    FIELD(r, o, "stage_bubble", rd_stage_nums(r, v_, (size_t)stages, p->stage_bubble));
    FIELD(r, o, "last_stage_bubble", rd_stage_nums(r, v_, (size_t)stages, p->last_stage_bubble));
    for (int k = 0; k < stages; k++) {
        if (!(ranks[k] >= 0 && ranks[k] <= MS_AN_MAX_RANKS && ranks[k] == floor(ranks[k])))
            return bad(r, "stage_ranks[%d]: expected an integer in [0, %d]", k, MS_AN_MAX_RANKS);
        p->stage_ranks[k] = (int)ranks[k];
    }
    return MS_OK;
}

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
    MS_CHECK(rd_exact_rows(r, o, "overlap", a->nranks, sizeof *a->overlap, TABLE(overlap_fields),
                           a->overlap, "one per rank"));
    MS_CHECK(ROWS(r, o, "busbw", MAX_LIST, busbw_fields, &a->busbw, &a->n_busbw));
    MS_CHECK(ROWS(r, o, "ops", MAX_LIST, op_fields, &a->ops, &a->n_ops));
    MS_CHECK(ROWS(r, o, "reshards", MAX_LIST, reshard_fields, &a->reshards, &a->n_reshards));
    MS_CHECK(ROWS(r, o, "steps", MAX_LIST, step_fields, &a->steps, &a->n_steps));
    MS_CHECK(ROWS(r, o, "stragglers", MS_AN_MAX_RANKS, straggler_fields, &a->stragglers,
                  &a->n_stragglers));
    FIELD(r, o, "pipeline", rd_pipe_stats(r, v_, &a->pipe));
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
    MS_CHECK(ROWS(r, o, "blocks", MAX_LIST, block_fields, &pl->blocks, &pl->n_blocks));
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

static ms_status rd_snapshot(rd *r, const cJSON *root, ms_snapshot *s) {
    MS_CHECK(rd_obj(r, root));
    int64_t schema = 0;
    FIELD(r, root, "schema", rd_int(r, v_, SNAPSHOT_SCHEMA, SNAPSHOT_SCHEMA, &schema));
    MS_CHECK(rd_fields(r, root, TABLE(head_fields), s));
    FIELD(r, root, "info", rd_fields(r, v_, TABLE(info_fields), &s->info));
    MS_CHECK(rd_fields(r, root, TABLE(state_fields), s));
    FIELD(r, root, "last_event", rd_str(r, v_, s->last_event, sizeof s->last_event));
    MS_CHECK(rd_fields(r, root, TABLE(tail_fields), s));
    MS_CHECK(ROWS(r, root, "history", MAX_LIST, history_fields, &s->history, &s->n_history));
    FIELD(r, root, "analysis", rd_analysis(r, v_, &s->analysis));
    {
        size_t old = push_key(r, "timeline");
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "timeline");
        MS_CHECK(rd_obj(r, tl));
        FIELD(r, tl, "step", rd_i64(r, v_, &s->timeline_step));
        FIELD(r, tl, "wall_s", rd_num(r, v_, &s->timeline_wall_s));
        MS_CHECK(ROWS(r, tl, "spans", MAX_LIST, span_fields, &s->timeline, &s->n_timeline));
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
            MS_CHECK(rd_fields(r, e, TABLE(mem_fields), &s->mem[i]));
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
            MS_CHECK(rd_fields(r, e, TABLE(suggestion_fields), &s->suggestions[i]));
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

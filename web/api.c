/* api.c - the routes of the dashboard once a request passed the checks of server.c: the
 * snapshot JSON (serialised once per version and shared), suggestions, the control POSTs
 * (each becomes an ms_live_req through ms_live_post), /metrics and /trace.json.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "profiler/snapshot_json.h"
#include "web/web_internal.h"

/* --- the text cache ------------------------------------------------------------------------- */

void ms_web_text_release(ms_web_text *t) {
    if (!t || atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1) return;
    free(t->buf);
    free(t);
}

static ms_web_text *text_retain(ms_web_text *t) {
    atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

static ms_web_text *text_build(const ms_snapshot *s) {
    cJSON *j = ms_snapshot_to_json(s);
    char *json = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!json) return NULL;
    ms_web_text *t = calloc(1, sizeof *t);
    char head[64];
    int hl = snprintf(head, sizeof head,
                      "id: %llu\nevent: snapshot\ndata: ", (unsigned long long)s->version);
    size_t jl = strlen(json);
    if (t) t->buf = malloc((size_t)hl + jl + 2);
    if (!t || !t->buf) {
        free(t);
        cJSON_free(json);
        return NULL;
    }
    memcpy(t->buf, head, (size_t)hl);
    memcpy(t->buf + hl, json, jl);
    memcpy(t->buf + hl + jl, "\n\n", 2);
    cJSON_free(json);
    t->len = (size_t)hl + jl + 2;
    t->json_off = (size_t)hl;
    t->json_len = jl;
    t->version = s->version;
    atomic_init(&t->refs, 1);
    return t;
}

ms_web_text *ms_web_cache_get(ms_web *w) {
    uint64_t v = ms_live_version(w->live);
    pthread_mutex_lock(&w->cache_mu);
    if (!w->cache || w->cache->version < v) {
        const ms_snapshot *s = ms_live_acquire(w->live);
        if (!w->cache || w->cache->version != s->version) {
            ms_web_text *t = text_build(s);
            if (t) {
                ms_web_text_release(w->cache);
                w->cache = t;
            }
        }
        ms_snapshot_release(s);
    }
    ms_web_text *t = w->cache ? text_retain(w->cache) : NULL;
    pthread_mutex_unlock(&w->cache_mu);
    return t;
}

static void release_cb(void *cls) {
    ms_web_text_release(cls);
}

/* --- GET routes ----------------------------------------------------------------------------- */

static enum MHD_Result get_snapshot(ms_web *w, struct MHD_Connection *c) {
    ms_web_text *t = ms_web_cache_get(w);
    if (!t) return ms_web_queue_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory");
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback_cls(
        t->json_len, t->buf + t->json_off, release_cb, t);
    if (!r) {
        ms_web_text_release(t);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    char etag[32];
    snprintf(etag, sizeof etag, "\"%llu\"", (unsigned long long)t->version);
    MHD_add_response_header(r, "ETag", etag);
    return ms_web_queue(c, MHD_HTTP_OK, r);
}

static enum MHD_Result get_suggestions(ms_web *w, struct MHD_Connection *c) {
    const ms_snapshot *s = ms_live_acquire(w->live);
    /* Only the suggestions and the advisor's note: a snapshot copy without the arrays. */
    ms_snapshot *lite = ms_snapshot_new();
    cJSON *j = NULL;
    if (lite) {
        lite->version = s->version;
        lite->n_suggestions = s->n_suggestions;
        memcpy(lite->suggestions, s->suggestions, sizeof s->suggestions);
        memcpy(lite->advisor_note, s->advisor_note, sizeof s->advisor_note);
        j = ms_snapshot_to_json(lite);
        ms_snapshot_release(lite);
    }
    ms_snapshot_release(s);
    cJSON *out = cJSON_CreateObject();
    char *text = NULL;
    if (j && out) {
        cJSON_AddItemToObject(out, "version",
                              cJSON_DetachItemFromObjectCaseSensitive(j, "version"));
        cJSON_AddItemToObject(out, "suggestions",
                              cJSON_DetachItemFromObjectCaseSensitive(j, "suggestions"));
        /* why there are none, when the advisor does not trust its model */
        cJSON_AddItemToObject(out, "advisor_note",
                              cJSON_DetachItemFromObjectCaseSensitive(j, "advisor_note"));
        text = cJSON_PrintUnformatted(out);
    }
    cJSON_Delete(j);
    cJSON_Delete(out);
    if (!text) return ms_web_queue_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory");
    enum MHD_Result ret = ms_web_queue_text(c, MHD_HTTP_OK, "application/json", text, strlen(text));
    cJSON_free(text);
    return ret;
}

static enum MHD_Result get_metrics(ms_web *w, struct MHD_Connection *c) {
    const ms_snapshot *s = ms_live_acquire(w->live);
    size_t len = 0;
    char *text = ms_web_metrics_text(s, &len);
    ms_snapshot_release(s);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    return ms_web_queue(c, MHD_HTTP_OK, r);
}

/* Writes the window as a Chrome trace into a private temporary folder, opens it, removes the
 * file and the folder (the open descriptor keeps the data until the response is sent). */
static enum MHD_Result get_trace(ms_web *w, struct MHD_Connection *c) {
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/meshscope-trace-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return ms_web_queue_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
                                  "cannot create a temporary folder for the trace");
    snprintf(path, sizeof path, "%s/trace.json", dir);
    ms_error err = {0};
    ms_status st = ms_live_write_trace(w->live, path, &err);
    int fd = st == MS_OK ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat sb;
    bool ok = fd >= 0 && fstat(fd, &sb) == 0;
    unlink(path);
    rmdir(dir);
    if (!ok) {
        if (fd >= 0) close(fd);
        return ms_web_queue_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "trace: %s",
                                  st != MS_OK ? err.msg : "cannot reopen the written trace");
    }
    struct MHD_Response *r = MHD_create_response_from_fd64((uint64_t)sb.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Content-Disposition",
                            "attachment; filename=\"meshscope-trace.json\"");
    return ms_web_queue(c, MHD_HTTP_OK, r);
}

/* --- POST routes ---------------------------------------------------------------------------- */

/* Parses a request body; NULL with a 400 queued (in *ret) when it is not JSON. An empty body
 * gives NULL with *ret untouched and *empty set. */
static cJSON *parse_body(struct MHD_Connection *c, const char *body, size_t len, bool *empty,
                         enum MHD_Result *ret) {
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
        i++;
    *empty = i == len;
    if (*empty) return NULL;
    cJSON *j = NULL;
    ms_error err = {0};
    if (ms_web_parse_json(body, len, &j, &err) != MS_OK) {
        *ret = ms_web_queue_error(c, MHD_HTTP_BAD_REQUEST, "%s", err.msg);
        return NULL;
    }
    return j;
}

static enum MHD_Result post_request(ms_web *w, struct MHD_Connection *c, const ms_live_req *req) {
    ms_error err = {0};
    ms_status st = ms_live_post(w->live, req, &err);
    if (st == MS_OK) {
        static const char ok[] = "{\"status\":\"pending\"}";
        return ms_web_queue_text(c, MHD_HTTP_ACCEPTED, "application/json", ok, sizeof ok - 1);
    }
    unsigned code = st == MS_ERR_INVALID       ? MHD_HTTP_UNPROCESSABLE_CONTENT
                    : st == MS_ERR_UNSUPPORTED ? MHD_HTTP_CONFLICT
                    : st == MS_ERR_NOMEM       ? MHD_HTTP_SERVICE_UNAVAILABLE
                                               : MHD_HTTP_INTERNAL_SERVER_ERROR;
    return ms_web_queue_error(c, code, "%s", err.msg[0] ? err.msg : ms_status_str(st));
}

static enum MHD_Result post_strategy(ms_web *w, struct MHD_Connection *c, const char *body,
                                     size_t len) {
    bool empty = false;
    enum MHD_Result ret = MHD_NO;
    cJSON *j = parse_body(c, body, len, &empty, &ret);
    if (!j) {
        if (!empty) return ret;
        return ms_web_queue_error(c, MHD_HTTP_BAD_REQUEST,
                                  "expected a JSON body: {\"dp\": 2, \"tp\": 2, \"sp\": false} or "
                                  "a --strategy file's JSON");
    }
    ms_live_req req = {.kind = MS_REQ_STRATEGY};
    char *text = cJSON_IsObject(j) ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text)
        return ms_web_queue_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT,
                                  "strategy: $: expected an object like {\"dp\": 2, \"tp\": 2}");
    size_t tl = strlen(text);
    if (tl >= sizeof req.strategy_json) {
        cJSON_free(text);
        return ms_web_queue_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "strategy JSON over %zu bytes",
                                  sizeof req.strategy_json - 1);
    }
    memcpy(req.strategy_json, text, tl + 1);
    cJSON_free(text);
    /* What the strategy means (world size, heads, memory, executable) is the job's to judge:
     * its validator answers through ms_live_post (422 with the reason). */
    return post_request(w, c, &req);
}

enum MHD_Result ms_web_api(ms_web *w, struct MHD_Connection *c, const char *url, const char *method,
                           const char *body, size_t body_len, bool bearer) {
    (void)bearer;
    if (strcmp(method, "POST")) {
        if (!strcmp(url, "/api/v1/snapshot")) return get_snapshot(w, c);
        if (!strcmp(url, "/api/v1/suggestions")) return get_suggestions(w, c);
        if (!strcmp(url, "/metrics")) return get_metrics(w, c);
        if (!strcmp(url, "/trace.json")) return get_trace(w, c);
        if (!strcmp(url, "/api/v1/events")) {
            struct MHD_Response *r = ms_web_sse_response(
                w, c, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID"));
            if (!r) return ms_web_queue_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory");
            return ms_web_queue(c, MHD_HTTP_OK, r);
        }
        const ms_web_asset *a = ms_web_asset_find(url);
        if (a) return ms_web_queue_asset(c, a);
        return ms_web_queue_error(c, MHD_HTTP_NOT_FOUND, "no route %s", url);
    }

    if (!strcmp(url, "/api/v1/strategy")) return post_strategy(w, c, body, body_len);
    /* The other POSTs take no body; one that is sent must still be JSON. */
    bool empty = false;
    enum MHD_Result ret = MHD_NO;
    cJSON *j = parse_body(c, body, body_len, &empty, &ret);
    if (!j && !empty) return ret;
    cJSON_Delete(j);
    ms_live_req req = {0};
    if (!strcmp(url, "/api/v1/stop")) {
        req.kind = MS_REQ_STOP;
        return post_request(w, c, &req);
    }
    static const char pre[] = "/api/v1/suggestions/";
    if (!strncmp(url, pre, sizeof pre - 1)) {
        char *end = NULL;
        long id = strtol(url + sizeof pre - 1, &end, 10);
        if (id < 1 || id > INT32_MAX || !end)
            return ms_web_queue_error(c, MHD_HTTP_NOT_FOUND, "no suggestion %s", url);
        req.id = (int32_t)id;
        req.kind = !strcmp(end, "/accept") ? MS_REQ_ACCEPT : MS_REQ_DISMISS;
        return post_request(w, c, &req);
    }
    return ms_web_queue_error(c, MHD_HTTP_NOT_FOUND, "no route %s", url);
}

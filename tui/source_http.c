/* source_http.c - the TUI's source for `meshscope top`: a running job's dashboard.
 *
 * A fetch thread asks GET /api/v1/snapshot (Authorization: Bearer TOKEN) every interval
 * and keeps the newest snapshot for the UI thread to take; failures become a
 * "disconnected: ..." line while it keeps retrying. Accept and dismiss are POSTs made on the
 * caller's thread with short timeouts (the server is normally on the same host).
 * The token is sent only in the header and never shown.
 */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/xalloc.h"
#include "profiler/snapshot_json.h"
#include "tui/source.h"

#define BODY_CAP        (256u << 20) /* a snapshot of 256 ranks with per-dim heatmaps fits */
#define CONNECT_TIMEOUT 2000         /* ms */
#define GET_TIMEOUT     15000
#define POST_TIMEOUT    5000

typedef struct http_src {
    char base[256];
    char auth[320]; /* "Authorization: Bearer TOKEN" */
    bool has_token;
    int interval_ms;
    CURL *get; /* the fetch thread's handle */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;          /* under mu */
    ms_snapshot *ready; /* under mu: newest, not yet taken */
    bool down;          /* under mu */
    char trouble[640];  /* under mu */
} http_src;

typedef struct body {
    ms_strbuf buf; /* p, len */
    bool over;
} body;

static size_t on_data(char *data, size_t size, size_t n, void *user) {
    body *b = user;
    size_t add = size * n;
    if (b->buf.len + add + 1 > BODY_CAP) {
        b->over = true;
        return 0; /* aborts the transfer */
    }
    ms_strbuf_put(&b->buf, data, add);
    return add;
}

static void set_common(CURL *c, body *b, char *errbuf, long timeout_ms) {
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for timeouts */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    /* Loopback dashboards must not go through a proxy taken from the environment. */
    curl_easy_setopt(c, CURLOPT_NOPROXY, "127.0.0.1,localhost,::1");
}

/* The first line of an error reply, or its "error" field when it is JSON. */
static void reply_reason(const body *b, char *out, size_t cap) {
    out[0] = '\0';
    if (!b->buf.p || !b->buf.len) return;
    cJSON *j = cJSON_ParseWithLength(b->buf.p, b->buf.len);
    const cJSON *e = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    if (cJSON_IsString(e))
        snprintf(out, cap, "%s", e->valuestring);
    else if (e && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "message")))
        snprintf(out, cap, "%s", cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring);
    else
        snprintf(out, cap, "%.*s", (int)strcspn(b->buf.p, "\r\n"), b->buf.p);
    cJSON_Delete(j);
}

/* Turns a failed transfer or a non-2xx status into a message that names the address and
 * the fix. */
static ms_status transfer_error(const http_src *h, const char *what, CURLcode rc,
                                const char *errbuf, long status, const body *b, ms_error *err,
                                char *brief, size_t brief_cap) {
    if (brief) {
        if (rc != CURLE_OK)
            snprintf(brief, brief_cap, "%s", curl_easy_strerror(rc));
        else
            snprintf(brief, brief_cap, "HTTP %ld", status);
    }
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
        return ms_fail(err, MS_ERR_IO,
                       "cannot connect to %s (%s): is the job still running? Start it with "
                       "`meshscope train ... --web 127.0.0.1:0` and pass the dashboard line it "
                       "prints",
                       h->base, errbuf[0] ? errbuf : curl_easy_strerror(rc));
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return ms_fail(err, MS_ERR_IO, "%s %s: no answer in time (%s)", what, h->base,
                       errbuf[0] ? errbuf : curl_easy_strerror(rc));
    if (rc == CURLE_WRITE_ERROR && b->over)
        return ms_fail(err, MS_ERR_IO, "%s %s: the reply is larger than %u MiB", what, h->base,
                       BODY_CAP >> 20);
    if (rc != CURLE_OK)
        return ms_fail(err, MS_ERR_IO, "%s %s: %s", what, h->base,
                       errbuf[0] ? errbuf : curl_easy_strerror(rc));
    char reason[256];
    reply_reason(b, reason, sizeof reason);
    if (status == 401 || status == 403)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s refused %s (HTTP %ld%s%s): pass the token of the dashboard line "
                       "the job printed (?token=TOKEN) with --token-file FILE, --token - or "
                       "MESHSCOPE_TOKEN",
                       h->base, h->has_token ? "the token" : "a request without a token", status,
                       reason[0] ? ", " : "", reason);
    if (status == 404)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s %s: not found (HTTP 404): is this a meshscope dashboard address?", what,
                       h->base);
    return ms_fail(err, MS_ERR_IO, "%s %s: HTTP %ld%s%s", what, h->base, status,
                   reason[0] ? ": " : "", reason);
}

/* One GET of the snapshot. On failure err has the full message and brief (may be NULL) a
 * few words for the status line. */
static ms_status fetch(http_src *h, CURL *c, ms_snapshot **out, ms_error *err, char *brief,
                       size_t brief_cap) {
    *out = NULL;
    char url[320], errbuf[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s/api/v1/snapshot", h->base);
    body b = {0};
    struct curl_slist *hdr = NULL;
    if (h->has_token) hdr = curl_slist_append(hdr, h->auth);
    hdr = curl_slist_append(hdr, "Accept: application/json");
    curl_easy_reset(c);
    set_common(c, &b, errbuf, GET_TIMEOUT);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdr);
    ms_status st = MS_OK;
    if (rc != CURLE_OK || status < 200 || status > 299) {
        st = transfer_error(h, "GET", rc, errbuf, status, &b, err, brief, brief_cap);
    } else {
        st = ms_snapshot_from_json(b.buf.p ? b.buf.p : "", b.buf.len, out, err);
        if (st != MS_OK) {
            if (brief) snprintf(brief, brief_cap, "%.200s", err->msg);
            ms_fail_wrap(err, MS_ERR_INVALID, "%s sent a snapshot this meshscope cannot read",
                         h->base);
        }
    }
    free(b.buf.p);
    return st;
}

/* Waits up to ms or until stop; returns stop. Called with mu held. */
static bool wait_ms(http_src *h, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (!h->stop)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) == ETIMEDOUT) break;
    return h->stop;
}

static void *fetch_thread(void *arg) {
    http_src *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!wait_ms(h, h->interval_ms)) {
        pthread_mutex_unlock(&h->mu);
        ms_snapshot *s = NULL;
        ms_error err = {0};
        char brief[256] = "";
        ms_status st = fetch(h, h->get, &s, &err, brief, sizeof brief);
        pthread_mutex_lock(&h->mu);
        if (st == MS_OK) {
            if (h->ready) ms_snapshot_release(h->ready);
            h->ready = s;
            h->down = false;
        } else {
            h->down = true;
            snprintf(h->trouble, sizeof h->trouble,
                     "disconnected from %s: %s; retrying (the screens show the last snapshot)",
                     h->base, brief);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static const ms_snapshot *http_poll(void *self) {
    http_src *h = self;
    pthread_mutex_lock(&h->mu);
    ms_snapshot *s = h->ready;
    h->ready = NULL;
    pthread_mutex_unlock(&h->mu);
    return s;
}

static void http_release(void *self, const ms_snapshot *s) {
    (void)self;
    if (s) ms_snapshot_release(s);
}

static ms_status http_post(void *self, const ms_live_req *req, ms_error *err) {
    http_src *h = self;
    const char *verb = req->kind == MS_REQ_ACCEPT    ? "accept"
                       : req->kind == MS_REQ_DISMISS ? "dismiss"
                                                     : NULL;
    if (!verb)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "only accept and dismiss are sent to a dashboard from here");
    char url[384], errbuf[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s/api/v1/suggestions/%d/%s", h->base, (int)req->id, verb);
    CURL *c = curl_easy_init();
    if (!c) return ms_fail(err, MS_ERR_NOMEM, "libcurl: cannot create a request");
    body b = {0};
    struct curl_slist *hdr = NULL;
    if (h->has_token) hdr = curl_slist_append(hdr, h->auth);
    hdr = curl_slist_append(hdr, "Content-Type: application/json");
    set_common(c, &b, errbuf, POST_TIMEOUT);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, 2L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    ms_status st = MS_OK;
    if (rc != CURLE_OK || status < 200 || status > 299) {
        char reason[256];
        reply_reason(&b, reason, sizeof reason);
        if (rc == CURLE_OK && (status == 409 || status == 422 || status == 400 || status == 404))
            st = ms_fail(err, MS_ERR_INVALID, "%s refused: %s", verb,
                         reason[0] ? reason : "(no reason given)");
        else
            st = transfer_error(h, "POST", rc, errbuf, status, &b, err, NULL, 0);
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(c);
    free(b.buf.p);
    return st;
}

static bool http_trouble(void *self, char *buf, size_t cap) {
    http_src *h = self;
    pthread_mutex_lock(&h->mu);
    bool down = h->down;
    if (down) snprintf(buf, cap, "%s", h->trouble);
    pthread_mutex_unlock(&h->mu);
    return down;
}

static void http_destroy(void *self) {
    http_src *h = self;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
    }
    if (h->ready) ms_snapshot_release(h->ready);
    if (h->get) curl_easy_cleanup(h->get);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static const ms_tui_source_ops http_ops = {
    .poll = http_poll,
    .release = http_release,
    .post = http_post,
    .trouble = http_trouble,
    .destroy = http_destroy,
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

ms_status ms_tui_source_http(const char *base_url, const char *token, int interval_ms,
                             ms_tui_source **out, ms_error *err) {
    *out = NULL;
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return ms_fail(err, MS_ERR_IO, "libcurl: %s", curl_easy_strerror(curl_init_rc));
    if (strlen(base_url) >= sizeof((http_src *)0)->base)
        return ms_fail(err, MS_ERR_INVALID, "'%s': the address is too long", base_url);
    if (token && strlen(token) > 256)
        return ms_fail(err, MS_ERR_INVALID, "the token is too long (%zu characters)",
                       strlen(token));
    if (token)
        for (const char *c = token; *c; c++)
            if ((unsigned char)*c <= 0x20 || *c == 0x7f)
                return ms_fail(err, MS_ERR_INVALID,
                               "the token contains a space or control character");
    http_src *h = xcalloc(1, sizeof *h);
    snprintf(h->base, sizeof h->base, "%s", base_url);
    h->has_token = token && token[0];
    if (h->has_token) snprintf(h->auth, sizeof h->auth, "Authorization: Bearer %s", token);
    h->interval_ms = interval_ms > 0 ? interval_ms : 500;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->get = curl_easy_init();
    if (!h->get) {
        http_destroy(h);
        return ms_fail(err, MS_ERR_NOMEM, "libcurl: cannot create a request");
    }
    ms_status st = fetch(h, h->get, &h->ready, err, NULL, 0);
    if (st != MS_OK) {
        http_destroy(h);
        return st;
    }
    if (pthread_create(&h->thread, NULL, fetch_thread, h) != 0) {
        http_destroy(h);
        return ms_fail(err, MS_ERR_INTERNAL, "cannot start the fetch thread");
    }
    h->started = true;
    ms_tui_source *s = xcalloc(1, sizeof *s);
    s->ops = &http_ops;
    s->self = h;
    snprintf(s->where, sizeof s->where, "%s", h->base);
    *out = s;
    return MS_OK;
}

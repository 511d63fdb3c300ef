/* server.c - the dashboard's HTTP server: the libmicrohttpd daemon, its limits, and the
 * checks every request passes before a route sees it.
 *
 * Order of the checks (the first that fails answers):
 *   0. at most one Content-Length header (two could frame the body two ways)      -> 400
 *   1. exactly one Host header naming a loopback host (or the specific address the server
 *      was bound to)                                                               -> 403
 *   2. method GET, HEAD or POST                                                    -> 405
 *   3. the start page "/": ?token=T sets the cookie to the session secret and redirects
 *      (303); otherwise the page needs the cookie (401 with a short explanation)
 *   4. the cookie (the session secret), or "Authorization: Bearer TOKEN"           -> 401
 *   5. a known route (404) taking this method (405 with Allow)
 *   6. POST: an Origin equal to http://HOST:PORT of an allowed host; a Bearer request may
 *      come without Origin                                                         -> 403
 *   7. POST: a body of at most body_cap bytes                                      -> 413
 * Then api.c answers. The daemon runs one internal polling thread over epoll (poll where
 * epoll is missing); event streams suspend their connection while idle (sse.c), so idle
 * streams cost nothing but a socket. Before any of this, connections that wait for their
 * request are bounded in time and number ("waiting connections" below).
 */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/comm/comm.h"
#include "web/web_internal.h"

#define CSP                                                                                        \
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "                    \
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "                 \
    "frame-ancestors 'none'"

static const char unauth_page[] =
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>meshscope: "
    "sign-in needed</title></head>\n<body><h1>meshscope dashboard</h1>\n<p>This dashboard "
    "needs its access token. Open the URL that meshscope printed when it started (the line "
    "<code>dashboard: http://127.0.0.1:PORT/?token=...</code>); it sets a cookie for this "
    "browser.</p></body></html>\n";

/* --- waiting connections ------------------------------------------------------------------- *
 *
 * A connection waits from its accept, and again after each completed request, until its next
 * request has arrived in full and is being answered. libmicrohttpd's timeout counts idle time
 * only, so a client that trickles a header line every few seconds would wait forever: here a
 * connection that has waited request_ms is shut down (the reaper thread), however steadily it
 * sends. Waiting connections may also hold at most half of the connection limit and half of
 * the per-address limit (libmicrohttpd refuses at those limits before anything here runs):
 * a newcomer beyond that displaces the longest-waiting connection of its own address, or of
 * any address, and a request completed beyond it closes its connection. So slow clients
 * cannot keep a newcomer out (a real request arrives in milliseconds, long before it would be
 * the longest waiting), and the other half of the limits is left to requests being answered:
 * the event streams of those who hold the token.
 */

typedef enum { CONN_WAITING, CONN_ANSWERING, CONN_DROPPED } conn_state;

struct ms_web_conn {
    ms_web *w;
    int fd;
    unsigned char addr[16]; /* the client's address: 4 bytes (IPv4) or 16 (IPv6) */
    size_t addr_len;
    conn_state state;
    int64_t since_ms; /* waiting since (monotonic) */
    ms_web_conn *prev, *next;
};

static int64_t mono_ms(void) {
    return ms_now_ns() / 1000000;
}

static bool same_addr(const ms_web_conn *a, const ms_web_conn *b) {
    return a->addr_len == b->addr_len && !memcmp(a->addr, b->addr, a->addr_len);
}

/* Waiting connections from like's address, or all of them (like NULL). conn_mu held. */
static int count_waiting(const ms_web *w, const ms_web_conn *like) {
    int n = 0;
    for (const ms_web_conn *k = w->conns; k; k = k->next)
        n += k->state == CONN_WAITING && (!like || same_addr(k, like));
    return n;
}

/* The longest-waiting connection from like's address (or any); NULL if none. conn_mu held. */
static ms_web_conn *oldest_waiting(ms_web *w, const ms_web_conn *like) {
    ms_web_conn *best = NULL;
    for (ms_web_conn *k = w->conns; k; k = k->next)
        if (k->state == CONN_WAITING && (!like || same_addr(k, like)) &&
            (!best || k->since_ms < best->since_ms))
            best = k;
    return best;
}

/* Is there room for k (not counted itself) to wait? conn_mu held. */
static bool room_to_wait(const ms_web *w, const ms_web_conn *k) {
    return count_waiting(w, k) < w->wait_max_per_ip && count_waiting(w, NULL) < w->wait_max;
}

/* Hangs up on k: libmicrohttpd reads the end of the stream and closes the connection. The
 * descriptor stays k's until then: libmicrohttpd closes it only after the CLOSED
 * notification, which waits for conn_mu. conn_mu held. */
static void drop(ms_web_conn *k) {
    k->state = CONN_DROPPED;
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
}

/* Makes room for the newcomer k (not listed yet). conn_mu held. */
static void make_room(ms_web *w, const ms_web_conn *k) {
    ms_web_conn *old;
    while (count_waiting(w, k) >= w->wait_max_per_ip && (old = oldest_waiting(w, k))) drop(old);
    while (count_waiting(w, NULL) >= w->wait_max && (old = oldest_waiting(w, NULL))) drop(old);
}

static void conn_open(ms_web *w, struct MHD_Connection *c, void **socket_context) {
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    ms_web_conn *k = calloc(1, sizeof *k);
    if (!k) {
        if (fd) shutdown(fd->connect_fd, SHUT_RDWR); /* unguarded: refused */
        return;
    }
    k->w = w;
    k->fd = fd ? fd->connect_fd : -1;
    const struct sockaddr *sa = ad ? ad->client_addr : NULL;
    if (sa && sa->sa_family == AF_INET) {
        k->addr_len = 4;
        memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        k->addr_len = 16;
        memcpy(k->addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
    k->state = CONN_WAITING;
    k->since_ms = mono_ms();
    pthread_mutex_lock(&w->conn_mu);
    make_room(w, k);
    k->next = w->conns;
    if (w->conns) w->conns->prev = k;
    w->conns = k;
    pthread_mutex_unlock(&w->conn_mu);
    *socket_context = k;
}

static void conn_close(ms_web *w, void **socket_context) {
    ms_web_conn *k = *socket_context;
    if (!k) return;
    pthread_mutex_lock(&w->conn_mu);
    if (k->prev)
        k->prev->next = k->next;
    else
        w->conns = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&w->conn_mu);
    free(k);
    *socket_context = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        conn_open(cls, c, socket_context);
    else
        conn_close(cls, socket_context);
}

static ms_web_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* The request on c has arrived and is being answered (or refused): no deadline. */
static void conn_answering(struct MHD_Connection *c) {
    ms_web_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&k->w->conn_mu);
    if (k->state == CONN_WAITING) k->state = CONN_ANSWERING;
    pthread_mutex_unlock(&k->w->conn_mu);
}

/* A request on c completed: a kept-alive connection waits for the next, if there is room. */
static void conn_rewait(struct MHD_Connection *c) {
    ms_web_conn *k = conn_of(c);
    if (!k) return;
    ms_web *w = k->w;
    pthread_mutex_lock(&w->conn_mu);
    if (k->state == CONN_ANSWERING && room_to_wait(w, k)) {
        k->state = CONN_WAITING;
        k->since_ms = mono_ms();
    } else if (k->state == CONN_ANSWERING) {
        drop(k);
    }
    pthread_mutex_unlock(&w->conn_mu);
}

/* Drops every connection that waited request_ms; returns when to look again. conn_mu held. */
static int64_t reap(ms_web *w, int64_t now) {
    /* New deadlines are at least request_ms (>= 1 s) away, so never before this. */
    int64_t next = now + 1000;
    for (ms_web_conn *k = w->conns; k; k = k->next) {
        if (k->state != CONN_WAITING) continue;
        int64_t due = k->since_ms + w->request_ms;
        if (due <= now)
            drop(k);
        else if (due < next)
            next = due;
    }
    return next;
}

static void *reaper_main(void *arg) {
    ms_web *w = arg;
    pthread_mutex_lock(&w->conn_mu);
    while (!w->reaper_stopping) {
        int64_t next = reap(w, mono_ms());
        /* conn_cv waits on CLOCK_MONOTONIC, the clock of ms_now_ns. */
        struct timespec ts = {.tv_sec = next / 1000, .tv_nsec = (next % 1000) * 1000000L};
        pthread_cond_timedwait(&w->conn_cv, &w->conn_mu, &ts);
    }
    pthread_mutex_unlock(&w->conn_mu);
    return NULL;
}

static ms_status reaper_start(ms_web *w, ms_error *err) {
    if (pthread_create(&w->reaper, NULL, reaper_main, w) != 0)
        return ms_fail(err, MS_ERR_NOMEM, "web: cannot start the connection reaper thread");
    w->reaper_running = true;
    return MS_OK;
}

static void reaper_stop(ms_web *w) {
    pthread_mutex_lock(&w->conn_mu);
    w->reaper_stopping = true;
    pthread_cond_broadcast(&w->conn_cv);
    pthread_mutex_unlock(&w->conn_mu);
    if (w->reaper_running) pthread_join(w->reaper, NULL);
    w->reaper_running = false;
}

/* --- responses ------------------------------------------------------------------------------ */

enum MHD_Result ms_web_queue(struct MHD_Connection *c, unsigned code, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    conn_answering(c);
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Cross-Origin-Resource-Policy", "same-origin");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result ms_web_queue_text(struct MHD_Connection *c, unsigned code, const char *ctype,
                                  const char *text, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    return ms_web_queue(c, code, r);
}

enum MHD_Result ms_web_queue_error(struct MHD_Connection *c, unsigned code, const char *fmt, ...) {
    char msg[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject();
    char *text = o && cJSON_AddStringToObject(o, "error", msg) ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) return MHD_NO;
    enum MHD_Result ret = ms_web_queue_text(c, code, "application/json", text, strlen(text));
    cJSON_free(text);
    return ret;
}

static enum MHD_Result queue_405(struct MHD_Connection *c, const char *allow) {
    char msg[128];
    int n = snprintf(msg, sizeof msg, "{\"error\": \"method not allowed; allowed: %s\"}", allow);
    struct MHD_Response *r = MHD_create_response_from_buffer((size_t)n, msg, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Allow", allow);
    return ms_web_queue(c, MHD_HTTP_METHOD_NOT_ALLOWED, r);
}

/* --- the start page and the assets ------------------------------------------------------------ */

const ms_web_asset *ms_web_asset_find(const char *path) {
    for (int i = 0; i < ms_web_n_assets; i++)
        if (!strcmp(ms_web_assets[i].path, path)) return &ms_web_assets[i];
    return NULL;
}

enum MHD_Result ms_web_queue_asset(struct MHD_Connection *c, const ms_web_asset *a) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", a->mime);
    return ms_web_queue(c, MHD_HTTP_OK, r);
}

static enum MHD_Result start_page(ms_web *w, struct MHD_Connection *c, bool authed) {
    const char *tok = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
    if (tok) {
        if (!ms_web_token_eq(w->token, tok))
            return ms_web_queue_text(c, MHD_HTTP_UNAUTHORIZED, "text/html; charset=utf-8",
                                     unauth_page, sizeof unauth_page - 1);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        char cookie[160];
        /* The session secret, not the token: a leaked cookie does not reveal the URL. */
        snprintf(cookie, sizeof cookie, "%s=%s; HttpOnly; SameSite=Strict; Path=/", w->cookie_name,
                 w->session);
        MHD_add_response_header(r, "Set-Cookie", cookie);
        MHD_add_response_header(r, "Location", "/");
        return ms_web_queue(c, MHD_HTTP_SEE_OTHER, r);
    }
    if (!authed)
        return ms_web_queue_text(c, MHD_HTTP_UNAUTHORIZED, "text/html; charset=utf-8", unauth_page,
                                 sizeof unauth_page - 1);
    const ms_web_asset *a = ms_web_asset_find("/index.html");
    return a ? ms_web_queue_asset(c, a)
             : ms_web_queue_error(c, MHD_HTTP_NOT_FOUND, "no page built in");
}

/* --- checks ----------------------------------------------------------------------------------- */

typedef struct req {
    bool bearer;  /* authenticated by the Authorization header */
    bool too_big; /* the body went over the cap (the rest is discarded) */
    ms_strbuf body;
    size_t received;
} req;

typedef struct header_count {
    const char *name;
    int n;
} header_count;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    (void)kind, (void)value;
    header_count *hc = cls;
    if (key && !strcasecmp(key, hc->name)) hc->n++;
    return MHD_YES;
}

/* How many headers named `name` the request has (a lookup finds the first only). */
static int headers_named(struct MHD_Connection *c, const char *name) {
    header_count hc = {.name = name};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &hc);
    return hc.n;
}

static bool authenticated(ms_web *w, struct MHD_Connection *c, bool *bearer) {
    char tok[160];
    *bearer = false;
    const char *az = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (az && ms_web_bearer_get(az, tok, sizeof tok) && ms_web_token_eq(w->token, tok)) {
        *bearer = true;
        return true;
    }
    const char *ck = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Cookie");
    return ck && ms_web_cookie_get(ck, w->cookie_name, tok, sizeof tok) &&
           ms_web_token_eq(w->session, tok);
}

/* Route kinds, from the path alone. */
enum { ROUTE_NONE, ROUTE_GET, ROUTE_POST };

static int route_kind(const char *url) {
    static const char *const gets[] = {"/api/v1/snapshot", "/api/v1/events", "/api/v1/suggestions",
                                       "/trace.json", "/metrics"};
    static const char *const posts[] = {"/api/v1/strategy", "/api/v1/stop"};
    for (size_t i = 0; i < sizeof gets / sizeof *gets; i++)
        if (!strcmp(url, gets[i])) return ROUTE_GET;
    for (size_t i = 0; i < sizeof posts / sizeof *posts; i++)
        if (!strcmp(url, posts[i])) return ROUTE_POST;
    static const char pre[] = "/api/v1/suggestions/";
    if (!strncmp(url, pre, sizeof pre - 1)) {
        const char *p = url + sizeof pre - 1;
        const char *q = p;
        while (*q >= '0' && *q <= '9') q++;
        if (q > p && q - p <= 10 && (!strcmp(q, "/accept") || !strcmp(q, "/dismiss")))
            return ROUTE_POST;
        return ROUTE_NONE;
    }
    if (strcmp(url, "/index.html") && ms_web_asset_find(url)) return ROUTE_GET;
    return ROUTE_NONE;
}

/* Steps 0-7 of the header checks. Returns MHD_YES/MHD_NO after queueing an answer, or -1
 * when the request may proceed (q->bearer set). */
static int check_headers(ms_web *w, struct MHD_Connection *c, const char *url, const char *method,
                         req *q) {
    /* libmicrohttpd 0.9.75 frames the body by one of them; a proxy in front could pick the
     * other (request smuggling). */
    if (headers_named(c, "Content-Length") > 1)
        return ms_web_queue_error(c, MHD_HTTP_BAD_REQUEST, "more than one Content-Length header");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    const char *extra = w->host_specific ? w->host : NULL;
    if (headers_named(c, "Host") != 1 || !ms_web_host_ok(host, extra))
        return ms_web_queue_error(c, MHD_HTTP_FORBIDDEN,
                                  "Host header must name a loopback address or localhost "
                                  "(DNS rebinding protection)");
    if (!ms_web_method_allowed(method)) return queue_405(c, "GET, HEAD, POST");
    const bool post = !strcmp(method, "POST");
    bool authed = authenticated(w, c, &q->bearer);
    if (!strcmp(url, "/")) return post ? queue_405(c, "GET, HEAD") : start_page(w, c, authed);
    if (!authed) {
        struct MHD_Response *r = NULL;
        static const char msg[] =
            "{\"error\": \"missing or wrong token: open the dashboard URL printed at start, or "
            "send Authorization: Bearer TOKEN\"}";
        r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"meshscope\"");
        return ms_web_queue(c, MHD_HTTP_UNAUTHORIZED, r);
    }
    int kind = route_kind(url);
    if (kind == ROUTE_NONE) return ms_web_queue_error(c, MHD_HTTP_NOT_FOUND, "no route %s", url);
    if (kind == ROUTE_GET && post) return queue_405(c, "GET, HEAD");
    if (kind == ROUTE_POST && !post) return queue_405(c, "POST");
    if (post) {
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (origin ? !ms_web_origin_ok(origin, w->port, extra) : !q->bearer)
            return ms_web_queue_error(c, MHD_HTTP_FORBIDDEN,
                                      "cross-origin request refused: POST needs an Origin of "
                                      "this dashboard (or a Bearer token and no Origin)");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end = NULL;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > w->body_cap)
                return ms_web_queue_error(c, MHD_HTTP_CONTENT_TOO_LARGE,
                                          "request body over %zu bytes", w->body_cap);
        }
    }
    return -1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    ms_web *w = cls;
    req *q = *con_cls;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q) return MHD_NO;
        *con_cls = q;
        /* A refusal is answered now (libmicrohttpd then closes the connection, which is what
         * a refused upload wants); an accepted request is answered on the next call, once
         * the request is complete, so that the connection can be kept alive. */
        int r = check_headers(w, c, url, method, q);
        if (r >= 0) return (enum MHD_Result)r;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        q->received += n;
        if (q->received > w->body_cap) {
            q->too_big = true;
            /* Chunked bodies have no length up front: discard a little, then hang up. */
            return q->received > 4 * w->body_cap ? MHD_NO : MHD_YES;
        }
        ms_strbuf_put(&q->body, upload_data, n);
        return MHD_YES;
    }
    if (q->too_big)
        return ms_web_queue_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "request body over %zu bytes",
                                  w->body_cap);
    if (strcmp(method, "POST")) return ms_web_api(w, c, url, method, NULL, 0, q->bearer);
    return ms_web_api(w, c, url, method, q->body.p ? q->body.p : "", q->body.len, q->bearer);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    (void)cls;
    if (why == MHD_REQUEST_TERMINATED_COMPLETED_OK) conn_rewait(c);
    req *q = *con_cls;
    if (!q) return;
    free(q->body.p);
    free(q);
    *con_cls = NULL;
}

/* --- start and stop --------------------------------------------------------------------------- */

/* Resolves host into a socket address (IPv4 preferred when a name has both). */
static ms_status resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len,
                         ms_error *err) {
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return ms_fail(err, MS_ERR_IO, "web: cannot resolve '%s': %s", host, gai_strerror(rc));
    const struct addrinfo *pick = res;
    for (const struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    memcpy(ss, pick->ai_addr, pick->ai_addrlen);
    *len = pick->ai_addrlen;
    freeaddrinfo(res);
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        return ms_fail(err, MS_ERR_IO, "web: '%s' is neither IPv4 nor IPv6", host);
    return MS_OK;
}

static bool is_wildcard(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET)
        return ((const struct sockaddr_in *)ss)->sin_addr.s_addr == htonl(INADDR_ANY);
    return !memcmp(&((const struct sockaddr_in6 *)ss)->sin6_addr, &in6addr_any, sizeof in6addr_any);
}

/* The token on one line of path, readable by this user alone. Opened without following a
 * link, and refused unless a regular file of this user's, so that the secret never goes
 * through a link or into a file someone else can already read; its mode is set to 0600
 * before anything is written, whatever it was. */
static ms_status write_token_file(const char *path, const char *token, ms_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    struct stat sb;
    const char *why = NULL;
    if (fd < 0)
        why = errno == ELOOP ? "it is a symbolic link" : strerror(errno);
    else if (fstat(fd, &sb) != 0)
        why = strerror(errno);
    else if (!S_ISREG(sb.st_mode))
        why = "not a regular file";
    else if (sb.st_uid != geteuid())
        why = "it belongs to another user";
    else if (fchmod(fd, 0600) != 0 || ftruncate(fd, 0) != 0)
        why = strerror(errno);
    size_t n = strlen(token);
    if (!why && (write(fd, token, n) != (ssize_t)n || write(fd, "\n", 1) != 1))
        why = strerror(errno);
    if (fd >= 0 && close(fd) != 0 && !why) why = strerror(errno);
    if (why)
        return ms_fail(err, MS_ERR_IO,
                       "web: cannot write the token file %s: %s (name a new file of yours)", path,
                       why);
    return MS_OK;
}

ms_status ms_web_start(ms_live *live, const ms_web_opts *opts, ms_web **out, ms_error *err) {
    *out = NULL;
    ms_web_opts o = opts ? *opts : (ms_web_opts){0};
    if (!live) return ms_fail(err, MS_ERR_INVALID, "web: no live model");
    if (!o.host || !*o.host) o.host = "127.0.0.1";
    if (o.port < 0 || o.port > 65535)
        return ms_fail(err, MS_ERR_INVALID, "web: port %d is not 0..65535", o.port);
    if (o.max_conns <= 0) o.max_conns = 256;
    if (o.max_per_ip <= 0) o.max_per_ip = 128;
    if (o.timeout_s <= 0) o.timeout_s = 10;
    if (o.body_cap == 0) o.body_cap = 64 * 1024;
    if (o.token) {
        size_t n = strlen(o.token);
        bool ok = n >= 16 && n <= MS_WEB_TOKEN_LEN;
        for (size_t i = 0; ok && i < n; i++)
            ok = isalnum((unsigned char)o.token[i]) || o.token[i] == '-' || o.token[i] == '_';
        if (!ok)
            return ms_fail(err, MS_ERR_INVALID,
                           "web: a given token must have 16..%d letters, digits, '-' or '_'",
                           MS_WEB_TOKEN_LEN);
    }
    if (strlen(o.host) >= sizeof((ms_web *)0)->host)
        return ms_fail(err, MS_ERR_INVALID, "web: host name '%s' too long", o.host);

    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char bare[64];
    snprintf(bare, sizeof bare, "%s", o.host);
    if (bare[0] == '[' && bare[strlen(bare) - 1] == ']') {
        memmove(bare, bare + 1, strlen(bare));
        bare[strlen(bare) - 1] = '\0';
    }
    MS_CHECK(resolve(bare, o.port, &ss, &sl, err));

    ms_web *w = calloc(1, sizeof *w);
    if (!w) return ms_fail(err, MS_ERR_NOMEM, "web: out of memory");
    w->live = live;
    w->body_cap = o.body_cap;
    w->heartbeat_ms = MS_WEB_HEARTBEAT_MS;
    snprintf(w->host, sizeof w->host, "%s", bare);
    /* Waiting connections get half of each limit (see "waiting connections"). */
    w->request_ms = (int64_t)o.timeout_s * 1000;
    w->wait_max = o.max_conns > 1 ? o.max_conns / 2 : 1;
    w->wait_max_per_ip = o.max_per_ip > 1 ? o.max_per_ip / 2 : 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->cache_mu, NULL);
    pthread_mutex_init(&w->conn_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->stop_cv, &ca);
    pthread_cond_init(&w->conn_cv, &ca);
    pthread_condattr_destroy(&ca);
    ms_status st = MS_OK;
    if (o.token)
        snprintf(w->token, sizeof w->token, "%s", o.token);
    else
        st = ms_web_random_token(w->token, err);
    if (st == MS_OK) st = ms_web_random_token(w->session, err);
    if (st == MS_OK) st = reaper_start(w, err);
    if (st != MS_OK) {
        ms_web_stop(w);
        return st;
    }

    const bool v6 = ss.ss_family == AF_INET6;
    const bool wildcard = is_wildcard(&ss);
    w->host_specific = !wildcard && !ms_web_is_loopback(bare, strlen(bare));
    if (wildcard)
        snprintf(w->url_host, sizeof w->url_host, "%s", v6 ? "[::1]" : "127.0.0.1");
    else
        snprintf(w->url_host, sizeof w->url_host, v6 && strchr(bare, ':') ? "[%s]" : "%s", bare);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME;
    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
    if (v6) flags |= MHD_USE_IPv6;
    errno = 0;
    w->daemon = MHD_start_daemon(
        flags, (uint16_t)o.port, NULL, NULL, on_request, w, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o.max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o.max_per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)o.timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, w, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        w, MHD_OPTION_END);
    if (!w->daemon) {
        int e = errno;
        ms_web_stop(w);
        return ms_fail(err, MS_ERR_IO, "web: cannot listen on %s:%d: %s", o.host, o.port,
                       e ? strerror(e) : "libmicrohttpd refused to start");
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(w->daemon, MHD_DAEMON_INFO_BIND_PORT);
    w->port = info ? info->port : o.port;
    snprintf(w->cookie_name, sizeof w->cookie_name, "meshscope_%d", w->port);
    snprintf(w->url, sizeof w->url, "http://%s:%d/?token=%s", w->url_host, w->port, w->token);
    st = ms_web_sse_start(w, err);
    if (st == MS_OK && o.token_file) {
        w->token_file = strdup(o.token_file);
        st = w->token_file ? write_token_file(w->token_file, w->token, err)
                           : ms_fail(err, MS_ERR_NOMEM, "web: out of memory");
        if (st != MS_OK) { /* not ours to remove: it may be another's file */
            free(w->token_file);
            w->token_file = NULL;
        }
    }
    if (st != MS_OK) {
        ms_web_stop(w);
        return st;
    }
    *out = w;
    return MS_OK;
}

const char *ms_web_url(const ms_web *w) {
    return w->url;
}
int ms_web_port(const ms_web *w) {
    return w->port;
}
const char *ms_web_token(const ms_web *w) {
    return w->token;
}

void ms_web_stop(ms_web *w) {
    if (!w) return;
    if (w->token_file) unlink(w->token_file); /* the token dies with the server */
    free(w->token_file);
    ms_web_sse_stop(w);
    reaper_stop(w);
    /* Closes every connection; the CLOSED notifications empty w->conns. */
    if (w->daemon) MHD_stop_daemon(w->daemon);
    ms_web_text_release(w->cache);
    pthread_cond_destroy(&w->stop_cv);
    pthread_cond_destroy(&w->conn_cv);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->cache_mu);
    pthread_mutex_destroy(&w->conn_mu);
    free(w);
}

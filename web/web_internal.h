/* web_internal.h - what the files of web/ share: the server struct, the snapshot text cache,
 * the server-sent event streams, and the pure request checks (security.c) and metrics text
 * (metrics.c), which the tests call directly.
 *
 * Threads: libmicrohttpd runs every request callback on its one polling thread; a notifier
 * thread (sse.c) waits for new snapshot versions and resumes suspended event streams; a
 * reaper thread (server.c) hangs up on connections whose request is overdue.
 * `mu` guards the stream list and the stopping flag; `cache_mu` guards the text cache
 * (taken inside `mu` by the streams, never the other way round).
 */
#ifndef MS_WEB_INTERNAL_H
#define MS_WEB_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "engine/core/status.h"
#include "engine/core/xalloc.h"
#include "profiler/live.h"
#include "web/web.h"

#define MS_WEB_TOKEN_LEN          32 /* hex characters */
#define MS_WEB_JSON_MAX_DEPTH     32
#define MS_WEB_HEARTBEAT_MS       15000
#define MS_WEB_MIN_PUSH_MS        100 /* at most this often a new version wakes the streams, */
#define MS_WEB_PUSH_MS_PER_STREAM 10  /* or this many ms per open stream when that is longer */

/* --- one snapshot version as text, shared by every reader ---------------------------------- */

/* `buf` holds the complete server-sent event for the version,
 *   "id: V\nevent: snapshot\ndata: {...}\n\n",
 * and the JSON alone is buf[json_off .. json_off + json_len). Immutable once built; freed
 * when the last reference goes. */
typedef struct ms_web_text {
    _Atomic int refs;
    uint64_t version;
    char *buf;
    size_t len;
    size_t json_off, json_len;
} ms_web_text;

void ms_web_text_release(ms_web_text *t);

/* --- the server ------------------------------------------------------------------------------ */

typedef struct sse_client sse_client;
typedef struct ms_web_conn ms_web_conn;

struct ms_web {
    ms_live *live;
    struct MHD_Daemon *daemon;
    char host[64];      /* as bound, e.g. "127.0.0.1", "::1" */
    char url_host[72];  /* for URLs: "127.0.0.1", "[::1]" */
    bool host_specific; /* bound to one non-loopback address: it is allowed in Host/Origin */
    int port;
    char token[MS_WEB_TOKEN_LEN + 1];   /* in the URL and the Bearer header */
    char session[MS_WEB_TOKEN_LEN + 1]; /* the cookie's value, given for the token */
    char cookie_name[32];               /* "meshscope_PORT" */
    char url[192];
    char *token_file; /* written at start, removed at stop; NULL: none */
    size_t body_cap;

    pthread_mutex_t mu;
    bool stopping;
    sse_client *clients; /* doubly linked */
    int n_clients;
    uint64_t hb_seq; /* heartbeat round, bumped every MS_WEB_HEARTBEAT_MS */
    int heartbeat_ms;
    pthread_cond_t stop_cv;
    pthread_t notifier;
    bool notifier_running;

    pthread_mutex_t cache_mu;
    ms_web_text *cache;

    /* Connections waiting for a request (server.c). `conn_mu` guards the list and the
     * reaper's stopping flag; taken alone. */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv; /* the reaper sleeps on it until the next deadline, or stop */
    ms_web_conn *conns;     /* every open connection, doubly linked */
    int64_t request_ms;     /* a request must arrive in full within this */
    int wait_max;           /* waiting connections at most, in all */
    int wait_max_per_ip;    /* and from one address */
    bool reaper_stopping;
    pthread_t reaper;
    bool reaper_running;
};

/* The latest snapshot as text (serialised once per version), with a reference for the
 * caller; NULL only when out of memory. */
ms_web_text *ms_web_cache_get(ms_web *w);

/* sse.c: the stream for GET /api/v1/events (last_id: the Last-Event-ID header, or NULL). */
struct MHD_Response *ms_web_sse_response(ms_web *w, struct MHD_Connection *c, const char *last_id);
ms_status ms_web_sse_start(ms_web *w, ms_error *err);
/* Ends every stream and the notifier; call before MHD_stop_daemon. */
void ms_web_sse_stop(ms_web *w);
/* Tests: a shorter heartbeat. */
void ms_web_set_heartbeat_ms(ms_web *w, int ms);

/* api.c: answers a request that passed the checks of server.c. `body` is the complete
 * request body (POST), NUL-terminated. */
enum MHD_Result ms_web_api(ms_web *w, struct MHD_Connection *c, const char *url, const char *method,
                           const char *body, size_t body_len, bool bearer);
/* Queues a response with the common headers (security headers, Cache-Control). */
enum MHD_Result ms_web_queue(struct MHD_Connection *c, unsigned code, struct MHD_Response *r);
enum MHD_Result ms_web_queue_text(struct MHD_Connection *c, unsigned code, const char *ctype,
                                  const char *text, size_t len);
enum MHD_Result ms_web_queue_error(struct MHD_Connection *c, unsigned code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --- security.c: pure request checks -------------------------------------------------------- */

/* 32 random hex characters from getrandom(2) into out[33]. */
ms_status ms_web_random_token(char *out, ms_error *err);
/* Constant-time equality of two NUL-terminated strings (time depends on the lengths only). */
bool ms_web_token_eq(const char *a, const char *b);
/* Is `host` (no port, IPv6 without brackets) a loopback address or "localhost"? */
bool ms_web_is_loopback(const char *host, size_t len);
/* A Host header ("127.0.0.1", "localhost:8080", "[::1]:8080") that names a loopback host,
 * or `extra` (the bound address, may be NULL) - with or without a port. */
bool ms_web_host_ok(const char *host_header, const char *extra);
/* An Origin header equal to http://HOST:PORT with HOST as ms_web_host_ok allows and PORT the
 * server's port. */
bool ms_web_origin_ok(const char *origin, int port, const char *extra);
/* The value of cookie `name` in a Cookie header into out (cap bytes); false if absent or too
 * long. */
bool ms_web_cookie_get(const char *cookie_header, const char *name, char *out, size_t cap);
/* The token of an "Authorization: Bearer TOKEN" header; false if another scheme. */
bool ms_web_bearer_get(const char *authz, char *out, size_t cap);
/* Deepest nesting of arrays and objects in JSON text (strings skipped). */
size_t ms_web_json_depth(const char *s, size_t len);
/* A request body as JSON: nesting checked first (at most MS_WEB_JSON_MAX_DEPTH, so cJSON's
 * recursion stays shallow), then parsed with no trailing text but whitespace. MS_ERR_INVALID
 * with "JSON nested deeper than 32 levels" or "malformed JSON near byte N". */
ms_status ms_web_parse_json(const char *body, size_t len, cJSON **out, ms_error *err);
/* "GET", "HEAD", "POST" */
bool ms_web_method_allowed(const char *method);

/* --- metrics.c ------------------------------------------------------------------------------ */

/* The Prometheus text (format 0.0.4) for a snapshot; malloc'd, *len its length. */
char *ms_web_metrics_text(const ms_snapshot *s, size_t *len);

/* --- assets (generated from web/assets at build time) --------------------------------------- */

typedef struct ms_web_asset {
    const char *path; /* "/app.js" */
    const char *mime;
    const unsigned char *data;
    size_t len;
} ms_web_asset;

extern const ms_web_asset ms_web_assets[];
extern const int ms_web_n_assets;

/* server.c: the asset at a path ("/app.js"), or NULL; and its response. */
const ms_web_asset *ms_web_asset_find(const char *path);
enum MHD_Result ms_web_queue_asset(struct MHD_Connection *c, const ms_web_asset *a);

#endif

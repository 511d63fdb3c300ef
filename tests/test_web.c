/* test_web.c - the dashboard server over real HTTP: a raw-socket client (so hostile requests
 * are possible) against a server started in-process on port 0 over a live model fed with
 * synthetic events whose heatmap totals are known.
 *
 * Covered: the token-for-cookie exchange of the start page, 401 without a token, Bearer,
 * Host checks (403), cross-origin POSTs (403), same-origin POSTs reaching the control queue
 * (202), 405 with Allow, 413, 400 for malformed and over-deep JSON, 422 from the validator,
 * 409 on a trace (nothing to control), a slowloris connection closed by the timeout while
 * other requests are answered, server-sent events after a new publish (and Last-Event-ID,
 * heartbeats), /metrics by the Prometheus text rules with byte totals equal to the
 * heatmap's, and /trace.json through the project's trace validator; plus the pure checks
 * of web/security.c. With the argument "hardening" (ctest test_web_hardening) it runs instead
 * the regression tests of defects found by probing, one test per defect.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/testkit.h"

#include "engine/comm/comm.h"
#include "engine/model/strategy.h"
#include "profiler/snapshot_json.h"
#include "traces/trace_check.h"
#include "web/web_internal.h"

#define NRANKS  4
#define TP_B    4096 /* bytes of each tp all-reduce */
#define DP_B    1000 /* bytes of each dp all-reduce */
#define NSTEPS  2
#define TIMEOUT 2 /* the server's idle connection timeout in these tests, seconds */

static ms_live *g_live;
static ms_web *g_web;
static int g_port;
static char g_token[64];
static char g_session[64]; /* the cookie's value, set by the start page */
static char g_cookie[160]; /* "Cookie: other=1; name=session\r\n" */
static char g_bearer[160]; /* "Authorization: Bearer token\r\n" */
static char g_origin[96];  /* "Origin: http://127.0.0.1:PORT\r\n" */

/* --- the synthetic job ------------------------------------------------------------------- */

static ms_event ev_base(int rank, ms_ev_kind kind, int64_t step, int64_t t0, int64_t t1) {
    ms_event e;
    memset(&e, 0, sizeof e);
    e.kind = (uint8_t)kind;
    e.phase = MS_PHASE_FORWARD;
    e.rank = rank;
    e.step = step;
    e.t0_ns = t0;
    e.t1_ns = t1;
    return e;
}

/* Group ids: tp pairs {0,1} = 1, {2,3} = 2; dp pairs {0,2} = 3, {1,3} = 4. */
static void feed_groups(ms_live *l) {
    ms_group g[4];
    memset(g, 0, sizeof g);
    const int ranks[4][2] = {{0, 1}, {2, 3}, {0, 2}, {1, 3}};
    for (int i = 0; i < 4; i++) {
        g[i].id = i + 1;
        snprintf(g[i].name, sizeof g[i].name, "%s", i < 2 ? "tp" : "dp");
        g[i].size = 2;
        g[i].ranks[0] = ranks[i][0];
        g[i].ranks[1] = ranks[i][1];
    }
    ms_live_feed_groups(l, g, 4);
}

/* One step on every rank: an op, a tp all-reduce and a dp all-reduce (direct algorithm, so
 * each rank sends B to its peer: 4 * TP_B + 4 * DP_B bytes per step), and a memory sample. */
static void feed_step(ms_live *l, int64_t step) {
    ms_event ev[NRANKS * 5];
    size_t n = 0;
    const int64_t t = 1000000000LL + step * 20000000LL; /* 20 ms per step */
    for (int r = 0; r < NRANKS; r++) {
        ev[n++] = ev_base(r, MS_EV_STEP, step, t, t + 10000000);
        ms_event op = ev_base(r, MS_EV_OP, step, t + 100000, t + 4000000);
        snprintf(op.u.op.opname, sizeof op.u.op.opname, "matmul");
        snprintf(op.u.op.name, sizeof op.u.op.name, "h.0.mlp.c_fc.mm");
        op.u.op.flops = 1e6;
        ev[n++] = op;
        for (int k = 0; k < 2; k++) {
            const bool tp = k == 0;
            ms_event c =
                ev_base(r, MS_EV_COLL, step, t + 4000000 + k * 2000000, t + 5000000 + k * 2000000);
            c.u.coll.coll = MS_COLL_ALL_REDUCE;
            c.u.coll.mesh_dim = tp ? 1 : 0;
            c.u.coll.group = tp ? (r < 2 ? 1 : 2) : (r % 2 == 0 ? 3 : 4);
            c.u.coll.group_size = 2;
            c.u.coll.group_rank = tp ? r % 2 : r / 2;
            c.u.coll.seq = step * 2 + k;
            c.u.coll.bytes = tp ? TP_B : DP_B;
            snprintf(c.u.coll.algo, sizeof c.u.coll.algo, "direct");
            ev[n++] = c;
        }
        ms_event m = ev_base(r, MS_EV_MEM, step, t + 9000000, t + 9000000);
        m.u.mem.in_use = 1000u * (unsigned)(r + 1);
        m.u.mem.peak = 2000u * (unsigned)(r + 1);
        ev[n++] = m;
    }
    ms_live_feed_events(l, ev, n);
    ms_live_step s = {.step = step,
                      .loss = 3.0 - 0.1 * (double)step,
                      .step_s = 0.01,
                      .tokens_per_s = 51200,
                      .lr = 1e-3,
                      .grad_norm = 1.0};
    snprintf(s.strategy, sizeof s.strategy, "dp2 x tp2");
    ms_live_step_done(l, &s);
}

/* The job's validator: a strategy must use all 4 ranks. */
static ms_status validate(void *user, const ms_live_req *req, ms_error *err) {
    (void)user;
    if (req->kind != MS_REQ_STRATEGY) return MS_OK;
    ms_strategy s;
    MS_CHECK(ms_strategy_parse_json(req->strategy_json, strlen(req->strategy_json), "strategy", &s,
                                    NULL, err));
    char name[MS_STRATEGY_NAME_MAX];
    if (ms_strategy_ranks(&s) != NRANKS)
        return ms_fail(err, MS_ERR_INVALID, "%s needs %d ranks but the job runs on %d",
                       ms_strategy_name(&s, name, sizeof name), ms_strategy_ranks(&s), NRANKS);
    return MS_OK;
}

static ms_live *make_live(bool live) {
    ms_live_opts o = {.info = {.nranks = NRANKS, .tokens_per_step = 512, .live = live}};
    snprintf(o.info.model, sizeof o.info.model, "configs/gpt-tiny.json");
    snprintf(o.info.backend, sizeof o.info.backend, "threads");
    ms_live *l = NULL;
    ms_error err = {0};
    assert_int_equal(ms_live_create(&o, &l, &err), MS_OK);
    feed_groups(l);
    for (int s = 0; s < NSTEPS; s++) feed_step(l, s);
    ms_live_set_strategy(l, "dp2 x tp2");
    ms_suggestion sg[2];
    memset(sg, 0, sizeof sg);
    for (int i = 0; i < 2; i++) {
        sg[i].id = 7 + i;
        sg[i].state = MS_SUGG_OPEN;
        snprintf(sg[i].target, sizeof sg[i].target, i ? "dp1 x tp4" : "dp4 x tp1");
        snprintf(sg[i].target_json, sizeof sg[i].target_json,
                 i ? "{\"dp\": 1, \"tp\": 4, \"sp\": false}"
                   : "{\"dp\": 4, \"tp\": 1, \"sp\": false}");
        snprintf(sg[i].current, sizeof sg[i].current, "dp2 x tp2");
        sg[i].predicted_gain = 0.2;
        sg[i].applied_step = -1;
    }
    ms_live_set_suggestions(l, sg, 2, 0.1);
    ms_live_set_validator(l, validate, NULL);
    ms_live_publish_now(l);
    return l;
}

/* --- a raw HTTP client ---------------------------------------------------------------------- */

/* A connection to 127.0.0.1:port from the loopback address `from` ("127.0.0.2"). */
static int dial_from(const char *from, int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in me = {.sin_family = AF_INET};
    assert_int_equal(inet_pton(AF_INET, from, &me.sin_addr), 1);
    assert_int_equal(bind(fd, (struct sockaddr *)&me, sizeof me), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int dial(int port) {
    return dial_from("127.0.0.1", port);
}

static void send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return; /* the server may hang up on a refused upload */
        p += k;
        n -= (size_t)k;
    }
}

typedef struct resp {
    int status;
    char *raw;  /* everything received */
    char *head; /* status line and headers (in raw) */
    char *body; /* after the blank line (in raw) */
    size_t body_len;
} resp;

static void resp_free(resp *r) {
    free(r->raw);
    memset(r, 0, sizeof *r);
}

/* Sends `raw` on a new connection and reads until the server closes it. */
static resp http_raw(const char *raw, size_t len) {
    int fd = dial(g_port);
    send_all(fd, raw, len);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    resp r = {.raw = buf};
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &r.status) != 1) r.status = -1;
    r.head = buf;
    if (sep) {
        *sep = '\0';
        r.body = sep + 4;
        r.body_len = n - (size_t)(r.body - buf);
    } else {
        r.body = buf + n;
    }
    return r;
}

/* METHOD PATH with extra header lines (each ending in \r\n) and an optional body. The Host is
 * 127.0.0.1:PORT unless `extra` sets one (host = NULL then). */
static resp http(const char *method, const char *path, const char *host, const char *extra,
                 const char *body) {
    char hostline[128] = "";
    if (host)
        snprintf(hostline, sizeof hostline, "Host: %s\r\n", host);
    else if (!extra || !strstr(extra, "Host:"))
        snprintf(hostline, sizeof hostline, "Host: 127.0.0.1:%d\r\n", g_port);
    char cl[64] = "";
    if (body) snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", strlen(body));
    size_t cap = 4096 + (body ? strlen(body) : 0) + (extra ? strlen(extra) : 0);
    char *req = malloc(cap);
    int n = snprintf(req, cap, "%s %s HTTP/1.1\r\n%sConnection: close\r\n%s%s\r\n%s", method, path,
                     hostline, extra ? extra : "", cl, body ? body : "");
    assert_true(n > 0 && (size_t)n < cap);
    resp r = http_raw(req, (size_t)n);
    free(req);
    return r;
}

/* The value of header `name` (case-insensitive), copied into a static buffer; NULL if absent. */
static const char *header(const resp *r, const char *name) {
    static char out[1024];
    size_t nl = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (!strncasecmp(line, name, nl) && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ') v++;
            const char *e = strstr(v, "\r\n");
            size_t vl = e ? (size_t)(e - v) : strlen(v);
            if (vl >= sizeof out) vl = sizeof out - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return out;
        }
    }
    return NULL;
}

/* Every response carries the security headers. */
static void assert_security_headers(const resp *r) {
    const char *csp = header(r, "Content-Security-Policy");
    assert_non_null(csp);
    assert_non_null(strstr(csp, "default-src 'self'"));
    assert_non_null(strstr(csp, "frame-ancestors 'none'"));
    assert_null(strstr(csp, "unsafe-inline"));
    assert_string_equal(header(r, "X-Content-Type-Options"), "nosniff");
    assert_string_equal(header(r, "Referrer-Policy"), "no-referrer");
    assert_string_equal(header(r, "Cache-Control"), "no-store");
}

#define expect_status(r, want)                                                                     \
    do {                                                                                           \
        if ((r).status != (want))                                                                  \
            fail_msg("status %d, wanted %d; response:\n%s\n\n%.300s", (r).status, (want),          \
                     (r).head, (r).body);                                                          \
    } while (0)

/* The value the start page sets for cookie meshscope_PORT with the right token, into out. */
static bool session_cookie(char *out, size_t cap) {
    char path[128];
    snprintf(path, sizeof path, "/?token=%s", g_token);
    resp r = http("GET", path, NULL, NULL, NULL);
    const char *sc = r.status == 303 ? header(&r, "Set-Cookie") : NULL;
    char name[32];
    snprintf(name, sizeof name, "meshscope_%d=", g_port);
    bool ok = sc && !strncmp(sc, name, strlen(name)) && strchr(sc, ';') &&
              (size_t)(strchr(sc, ';') - sc) - strlen(name) < cap;
    if (ok)
        snprintf(out, cap, "%.*s", (int)(strchr(sc, ';') - sc - strlen(name)), sc + strlen(name));
    resp_free(&r);
    return ok;
}

static int setup(void **state) {
    (void)state;
    g_live = make_live(true);
    ms_web_opts o = {.port = 0, .timeout_s = TIMEOUT};
    ms_error err = {0};
    if (ms_web_start(g_live, &o, &g_web, &err) != MS_OK) {
        fprintf(stderr, "ms_web_start: %s\n", err.msg);
        return -1;
    }
    g_port = ms_web_port(g_web);
    snprintf(g_token, sizeof g_token, "%s", ms_web_token(g_web));
    if (!session_cookie(g_session, sizeof g_session)) {
        fprintf(stderr, "the start page set no cookie\n");
        return -1;
    }
    snprintf(g_cookie, sizeof g_cookie, "Cookie: other=1; meshscope_%d=%s\r\n", g_port, g_session);
    snprintf(g_bearer, sizeof g_bearer, "Authorization: Bearer %s\r\n", g_token);
    snprintf(g_origin, sizeof g_origin, "Origin: http://127.0.0.1:%d\r\n", g_port);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ms_web_stop(g_web);
    ms_live_destroy(g_live);
    return 0;
}

static void drain_queue(void) {
    ms_live_req q;
    while (ms_live_take(g_live, &q)) {
    }
}

/* --- tests ---------------------------------------------------------------------------------- */

static void test_start_page(void **state) {
    (void)state;
    resp r = http("GET", "/", NULL, NULL, NULL);
    expect_status(r, 401);
    assert_non_null(strstr(r.body, "printed"));
    assert_non_null(strstr(header(&r, "Content-Type"), "text/html"));
    assert_security_headers(&r);
    resp_free(&r);

    r = http("GET", "/?token=0123456789abcdef0123456789abcdef", NULL, NULL, NULL);
    expect_status(r, 401);
    resp_free(&r);

    char path[128];
    snprintf(path, sizeof path, "/?token=%s", g_token);
    r = http("GET", path, NULL, NULL, NULL);
    expect_status(r, 303);
    assert_string_equal(header(&r, "Location"), "/");
    const char *sc = header(&r, "Set-Cookie");
    assert_non_null(sc);
    char want[128];
    snprintf(want, sizeof want, "meshscope_%d=%s;", g_port, g_session);
    assert_non_null(strstr(sc, want));
    assert_non_null(strstr(sc, "HttpOnly"));
    assert_non_null(strstr(sc, "SameSite=Strict"));
    assert_non_null(strstr(sc, "Path=/"));
    assert_security_headers(&r);
    resp_free(&r);

    /* With the cookie: the page, which loads its script from a file (no inline script). */
    r = http("GET", "/", NULL, g_cookie, NULL);
    expect_status(r, 200);
    assert_non_null(strstr(r.body, "<canvas id=\"heatmap\""));
    assert_non_null(strstr(r.body, "<script src=\"/app.js\""));
    assert_null(strstr(r.body, "<script>"));
    assert_security_headers(&r);
    resp_free(&r);
    r = http("GET", "/app.js", NULL, g_cookie, NULL);
    expect_status(r, 200);
    assert_non_null(strstr(header(&r, "Content-Type"), "javascript"));
    assert_non_null(strstr(r.body, "EventSource('/api/v1/events')"));
    resp_free(&r);
    /* Assets need the cookie too. */
    r = http("GET", "/style.css", NULL, NULL, NULL);
    expect_status(r, 401);
    resp_free(&r);
    /* HEAD is a GET without the body. */
    r = http("HEAD", "/", NULL, g_cookie, NULL);
    expect_status(r, 200);
    assert_int_equal(r.body_len, 0);
    resp_free(&r);
}

static void test_auth(void **state) {
    (void)state;
    resp r = http("GET", "/api/v1/snapshot", NULL, NULL, NULL);
    expect_status(r, 401);
    assert_non_null(strstr(r.body, "\"error\""));
    assert_security_headers(&r);
    resp_free(&r);

    r = http("GET", "/api/v1/snapshot", NULL, "Authorization: Bearer 0123456789abcdef\r\n", NULL);
    expect_status(r, 401);
    resp_free(&r);
    r = http("GET", "/api/v1/snapshot", NULL, "Cookie: meshscope_1=nope\r\n", NULL);
    expect_status(r, 401);
    resp_free(&r);

    r = http("GET", "/api/v1/snapshot", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_security_headers(&r);
    assert_string_equal(header(&r, "Content-Type"), "application/json");
    ms_snapshot *s = NULL;
    ms_error err = {0};
    assert_int_equal(ms_snapshot_from_json(r.body, r.body_len, &s, &err), MS_OK);
    assert_int_equal(s->info.nranks, NRANKS);
    assert_int_equal(s->analysis.nranks, NRANKS);
    assert_string_equal(s->strategy, "dp2 x tp2");
    assert_true(s->step == NSTEPS - 1);
    ms_snapshot_release(s);
    resp_free(&r);

    r = http("GET", "/api/v1/snapshot", NULL, g_cookie, NULL);
    expect_status(r, 200);
    resp_free(&r);

    r = http("GET", "/api/v1/suggestions", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_non_null(strstr(r.body, "\"suggestions\":["));
    assert_non_null(strstr(r.body, "\"id\":7"));
    resp_free(&r);

    r = http("GET", "/api/v1/nothing", NULL, g_bearer, NULL);
    expect_status(r, 404);
    assert_non_null(strstr(r.body, "\"error\""));
    resp_free(&r);
    r = http("GET", "/api/v1/suggestions/7/accept/x", NULL, g_bearer, NULL);
    expect_status(r, 404);
    resp_free(&r);
}

static void test_host_header(void **state) {
    (void)state;
    char h[128];
    const char *good[] = {"127.0.0.1", "localhost", "LOCALHOST:1", "[::1]", "127.9.8.7:80", NULL};
    for (int i = 0; good[i]; i++) {
        resp r = http("GET", "/api/v1/snapshot", good[i], g_bearer, NULL);
        expect_status(r, 200);
        resp_free(&r);
    }
    snprintf(h, sizeof h, "localhost:%d", g_port);
    resp r = http("GET", "/api/v1/snapshot", h, g_bearer, NULL);
    expect_status(r, 200);
    resp_free(&r);
    const char *bad[] = {"evil.example",
                         "127.0.0.1.evil.example",
                         "localhost.evil.example:80",
                         "10.0.0.1",
                         "[::2]:80",
                         "::1",
                         "localhost:http",
                         NULL};
    for (int i = 0; bad[i]; i++) {
        r = http("GET", "/api/v1/snapshot", bad[i], g_bearer, NULL);
        expect_status(r, 403);
        assert_security_headers(&r);
        resp_free(&r);
    }
    /* Even the start page with the right token. */
    snprintf(h, sizeof h, "/?token=%s", g_token);
    r = http("GET", h, "rebind.example", NULL, NULL);
    expect_status(r, 403);
    resp_free(&r);
    /* Two Host headers, or none (HTTP/1.0). */
    char extra[256];
    snprintf(extra, sizeof extra, "Host: 127.0.0.1\r\nHost: evil.example\r\n%s", g_bearer);
    r = http("GET", "/api/v1/snapshot", NULL, extra, NULL);
    assert_true(r.status == 403 || r.status == 400);
    resp_free(&r);
    char req[256];
    int n = snprintf(req, sizeof req, "GET /api/v1/snapshot HTTP/1.0\r\n%s\r\n", g_bearer);
    r = http_raw(req, (size_t)n);
    expect_status(r, 403);
    resp_free(&r);
}

static void test_post_origin(void **state) {
    (void)state;
    drain_queue();
    char extra[512];
    /* Cross-origin: refused whatever the credentials. */
    const char *origins[] = {"http://evil.example",    "null",
                             "http://127.0.0.1:1",     "https://127.0.0.1",
                             "http://evil.example:80", NULL};
    for (int i = 0; origins[i]; i++) {
        snprintf(extra, sizeof extra, "%sOrigin: %s\r\n", g_cookie, origins[i]);
        resp r = http("POST", "/api/v1/stop", NULL, extra, NULL);
        expect_status(r, 403);
        resp_free(&r);
        snprintf(extra, sizeof extra, "%sOrigin: %s\r\n", g_bearer, origins[i]);
        r = http("POST", "/api/v1/stop", NULL, extra, NULL);
        expect_status(r, 403);
        resp_free(&r);
    }
    /* A cookie without Origin: refused (a browser always sends one on POST). */
    resp r = http("POST", "/api/v1/stop", NULL, g_cookie, NULL);
    expect_status(r, 403);
    resp_free(&r);
    ms_live_req q;
    assert_false(ms_live_take(g_live, &q));

    /* Same origin with the cookie. */
    snprintf(extra, sizeof extra, "%s%s", g_cookie, g_origin);
    r = http("POST", "/api/v1/stop", NULL, extra, NULL);
    expect_status(r, 202);
    assert_non_null(strstr(r.body, "\"status\":\"pending\""));
    assert_security_headers(&r);
    resp_free(&r);
    assert_true(ms_live_take(g_live, &q));
    assert_int_equal(q.kind, MS_REQ_STOP);
    snprintf(extra, sizeof extra, "%sOrigin: http://localhost:%d\r\n", g_cookie, g_port);
    r = http("POST", "/api/v1/stop", NULL, extra, "{}");
    expect_status(r, 202);
    resp_free(&r);
    assert_true(ms_live_take(g_live, &q));

    /* Bearer without Origin: scripts (curl). */
    r = http("POST", "/api/v1/stop", NULL, g_bearer, NULL);
    expect_status(r, 202);
    resp_free(&r);
    assert_true(ms_live_take(g_live, &q));
    assert_int_equal(q.kind, MS_REQ_STOP);
    assert_false(ms_live_take(g_live, &q));

    /* No credentials at all: 401 before anything else. */
    r = http("POST", "/api/v1/stop", NULL, g_origin, NULL);
    expect_status(r, 401);
    resp_free(&r);
}

static void test_methods(void **state) {
    (void)state;
    const char *methods[] = {"PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", NULL};
    for (int i = 0; methods[i]; i++) {
        resp r = http(methods[i], "/api/v1/stop", NULL, g_bearer, "{}");
        expect_status(r, 405);
        assert_string_equal(header(&r, "Allow"), "GET, HEAD, POST");
        assert_security_headers(&r);
        resp_free(&r);
    }
    resp r = http("GET", "/api/v1/stop", NULL, g_bearer, NULL);
    expect_status(r, 405);
    assert_string_equal(header(&r, "Allow"), "POST");
    resp_free(&r);
    char extra[512];
    snprintf(extra, sizeof extra, "%s%s", g_bearer, g_origin);
    r = http("POST", "/api/v1/snapshot", NULL, extra, "{}");
    expect_status(r, 405);
    assert_string_equal(header(&r, "Allow"), "GET, HEAD");
    resp_free(&r);
    r = http("POST", "/", NULL, extra, "{}");
    expect_status(r, 405);
    resp_free(&r);
}

static void test_bodies(void **state) {
    (void)state;
    drain_queue();
    char extra[512];
    snprintf(extra, sizeof extra, "%s%s", g_bearer, g_origin);

    /* Over the cap by Content-Length: refused before the body is read. */
    size_t big = 70000;
    char *body = malloc(big + 1);
    memset(body, ' ', big);
    body[0] = '{';
    body[big - 1] = '}';
    body[big] = '\0';
    resp r = http("POST", "/api/v1/strategy", NULL, extra, body);
    expect_status(r, 413);
    assert_security_headers(&r);
    resp_free(&r);
    /* Over the cap in chunks (no length up front): 413 or a closed connection, never a 2xx. */
    {
        char req[1024];
        int n = snprintf(req, sizeof req,
                         "POST /api/v1/strategy HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s"
                         "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                         g_port, extra);
        int fd = dial(g_port);
        send_all(fd, req, (size_t)n);
        char chunk[16];
        int cl = snprintf(chunk, sizeof chunk, "%x\r\n", 8192);
        for (int i = 0; i < 10; i++) {
            send_all(fd, chunk, (size_t)cl);
            send_all(fd, body, 8192);
            send_all(fd, "\r\n", 2);
        }
        send_all(fd, "0\r\n\r\n", 5);
        char buf[512] = "";
        ssize_t k = recv(fd, buf, sizeof buf - 1, 0);
        if (k > 0) {
            buf[k] = '\0';
            assert_non_null(strstr(buf, " 413 "));
        }
        close(fd);
    }
    free(body);

    r = http("POST", "/api/v1/strategy", NULL, extra, "{\"dp\": 2, \"tp\": ");
    expect_status(r, 400);
    assert_non_null(strstr(r.body, "malformed JSON"));
    resp_free(&r);
    r = http("POST", "/api/v1/strategy", NULL, extra, "{\"dp\": 2} trailing");
    expect_status(r, 400);
    resp_free(&r);
    r = http("POST", "/api/v1/strategy", NULL, extra, "");
    expect_status(r, 400);
    resp_free(&r);
    r = http("POST", "/api/v1/stop", NULL, extra, "not json");
    expect_status(r, 400);
    resp_free(&r);

    /* Nested 40 deep (cJSON's own limit is 1000). */
    char deep[256] = "";
    for (int i = 0; i < 40; i++) strcat(deep, "[");
    for (int i = 0; i < 40; i++) strcat(deep, "]");
    r = http("POST", "/api/v1/strategy", NULL, extra, deep);
    expect_status(r, 400);
    assert_non_null(strstr(r.body, "nested deeper than 32"));
    resp_free(&r);
    /* 32 deep is fine as JSON, but not a strategy. */
    char ok32[128] = "";
    for (int i = 0; i < 32; i++) strcat(ok32, "[");
    for (int i = 0; i < 32; i++) strcat(ok32, "]");
    r = http("POST", "/api/v1/strategy", NULL, extra, ok32);
    expect_status(r, 422);
    resp_free(&r);

    /* Refusals with their reason: the strategy parser, then the job's validator. */
    r = http("POST", "/api/v1/strategy", NULL, extra, "{\"dp\": 0, \"tp\": 2}");
    expect_status(r, 422);
    assert_non_null(strstr(r.body, "\"error\""));
    resp_free(&r);
    r = http("POST", "/api/v1/strategy", NULL, extra, "{\"dp\": 3, \"tp\": 1, \"sp\": false}");
    expect_status(r, 422);
    assert_non_null(strstr(r.body, "needs 3 ranks but the job runs on 4"));
    resp_free(&r);
    ms_live_req q;
    assert_false(ms_live_take(g_live, &q));

    /* Accepted: both forms reach the queue as they were sent. */
    r = http("POST", "/api/v1/strategy", NULL, extra, "{\"dp\": 4, \"tp\": 1, \"sp\": false}");
    expect_status(r, 202);
    resp_free(&r);
    assert_true(ms_live_take(g_live, &q));
    assert_int_equal(q.kind, MS_REQ_STRATEGY);
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(
        ms_strategy_parse_json(q.strategy_json, strlen(q.strategy_json), "q", &s, NULL, &err),
        MS_OK);
    assert_int_equal(s.dp, 4);
    assert_int_equal(s.tp, 1);
    r = http("POST", "/api/v1/strategy", NULL, extra, "{\"mesh\": {\"dp\": 1, \"tp\": 4}}");
    expect_status(r, 202);
    resp_free(&r);
    assert_true(ms_live_take(g_live, &q));
    assert_non_null(strstr(q.strategy_json, "\"mesh\""));
    /* the switch into offload (the knob every other view and flag takes) */
    r = http("POST", "/api/v1/strategy", NULL, extra, "{\"dp\": 4, \"offload\": true}");
    expect_status(r, 202);
    resp_free(&r);
    assert_true(ms_live_take(g_live, &q));
    assert_int_equal(
        ms_strategy_parse_json(q.strategy_json, strlen(q.strategy_json), "q", &s, NULL, &err),
        MS_OK);
    assert_true(s.offload && s.dp == 4);
}

static void test_suggestions(void **state) {
    (void)state;
    drain_queue();
    char extra[512];
    snprintf(extra, sizeof extra, "%s%s", g_cookie, g_origin);
    resp r = http("POST", "/api/v1/suggestions/99/accept", NULL, extra, NULL);
    expect_status(r, 422);
    assert_non_null(strstr(r.body, "no suggestion with id 99"));
    resp_free(&r);

    r = http("POST", "/api/v1/suggestions/7/accept", NULL, extra, NULL);
    expect_status(r, 202);
    resp_free(&r);
    ms_live_req q;
    assert_true(ms_live_take(g_live, &q));
    assert_int_equal(q.kind, MS_REQ_ACCEPT);
    assert_int_equal(q.id, 7);
    /* Accepted once: pending now, so a second accept is refused. */
    r = http("POST", "/api/v1/suggestions/7/accept", NULL, extra, NULL);
    expect_status(r, 422);
    assert_non_null(strstr(r.body, "pending"));
    resp_free(&r);

    r = http("POST", "/api/v1/suggestions/8/dismiss", NULL, extra, NULL);
    expect_status(r, 202);
    resp_free(&r);
    ms_live_publish_now(g_live);
    r = http("GET", "/api/v1/suggestions", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_non_null(strstr(r.body, "\"id\":7,\"state\":\"pending\""));
    assert_non_null(strstr(r.body, "\"id\":8,\"state\":\"dismissed\""));
    resp_free(&r);
}

/* The advisor's note, while it withholds its suggestions, is in the suggestions' JSON and the
 * snapshot the dashboard reads (web/assets/app.js shows it above the list); it clears when
 * the advisor suggests again. */
static void test_advisor_note(void **state) {
    (void)state;
    const char *note = "the cost model is 41% off the measured step for 5 rounds (predicts 58.0 "
                       "ms, measured 98.1 ms); relearning from the trace; no suggestions until it "
                       "agrees within 25%";
    ms_live_withhold_suggestions(g_live, note);
    ms_live_publish_now(g_live);
    char want[400];
    snprintf(want, sizeof want, "\"advisor_note\":\"%s\"", note);
    resp r = http("GET", "/api/v1/suggestions", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_non_null(strstr(r.body, want));
    resp_free(&r);
    r = http("GET", "/api/v1/snapshot", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_non_null(strstr(r.body, want));
    resp_free(&r);
    ms_live_set_suggestions(g_live, NULL, 0, 0.1);
    ms_live_publish_now(g_live);
    r = http("GET", "/api/v1/suggestions", NULL, g_bearer, NULL);
    assert_non_null(strstr(r.body, "\"advisor_note\":\"\""));
    resp_free(&r);
}

/* A trace (live = false): every control request is 409. */
static void test_finished_job(void **state) {
    (void)state;
    ms_live *l = make_live(false);
    ms_web *w = NULL;
    ms_error err = {0};
    ms_web_opts o = {.token = "fixed-token-for-the-test"};
    assert_int_equal(ms_web_start(l, &o, &w, &err), MS_OK);
    assert_string_equal(ms_web_token(w), "fixed-token-for-the-test");
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/?token=fixed-token-for-the-test",
             ms_web_port(w));
    assert_string_equal(ms_web_url(w), url);
    int saved = g_port;
    g_port = ms_web_port(w);
    resp r = http("POST", "/api/v1/stop", NULL,
                  "Authorization: Bearer fixed-token-for-the-test\r\n", NULL);
    expect_status(r, 409);
    assert_non_null(strstr(r.body, "nothing to control"));
    resp_free(&r);
    g_port = saved;
    ms_web_stop(w);
    ms_live_destroy(l);

    /* Bad options. */
    ms_web_opts bad = {.token = "short"};
    assert_int_equal(ms_web_start(l = make_live(true), &bad, &w, &err), MS_ERR_INVALID);
    ms_web_opts taken = {.port = saved};
    assert_int_equal(ms_web_start(l, &taken, &w, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot listen on 127.0.0.1"));
    ms_live_destroy(l);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A connection that sends half a request line and then nothing is closed by the server
 * within its timeout, and other requests are answered meanwhile. */
static void test_slowloris(void **state) {
    (void)state;
    int slow[4];
    for (int i = 0; i < 4; i++) {
        slow[i] = dial(g_port);
        send_all(slow[i], "GET /api/v1/snap", 16);
    }
    const double t0 = now_s();
    for (int i = 0; i < 5; i++) {
        resp r = http("GET", "/api/v1/snapshot", NULL, g_bearer, NULL);
        expect_status(r, 200);
        resp_free(&r);
    }
    for (int i = 0; i < 4; i++) {
        struct pollfd p = {.fd = slow[i], .events = POLLIN};
        double left = TIMEOUT + 3 - (now_s() - t0);
        assert_true(poll(&p, 1, left > 0 ? (int)(left * 1000) : 0) == 1);
        char buf[256];
        ssize_t k = recv(slow[i], buf, sizeof buf, 0);
        assert_true(k <= 0); /* closed without an answer */
        close(slow[i]);
    }
    double took = now_s() - t0;
    assert_true(took >= TIMEOUT - 0.5);
    assert_true(took <= TIMEOUT + 3);
}

/* Reads from fd into buf (appending) until `want` appears or `secs` pass. */
static bool read_until(int fd, char *buf, size_t cap, size_t *n, const char *want, double secs) {
    const double end = now_s() + secs;
    while (!strstr(buf, want)) {
        double left = end - now_s();
        if (left <= 0) return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) != 1) return false;
        if (*n + 1 >= cap) return false;
        ssize_t k = recv(fd, buf + *n, cap - *n - 1, 0);
        if (k <= 0) return false;
        *n += (size_t)k;
        buf[*n] = '\0';
    }
    return true;
}

static int sse_open(const char *extra) {
    int fd = dial(g_port);
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s%s"
                     "Accept: text/event-stream\r\n\r\n",
                     g_port, g_bearer, extra ? extra : "");
    send_all(fd, req, (size_t)n);
    return fd;
}

static void test_sse(void **state) {
    (void)state;
    const size_t cap = 1 << 20;
    char *buf = calloc(1, cap);
    size_t n = 0;
    int fd = sse_open(NULL);
    assert_true(read_until(fd, buf, cap, &n, "\r\n\r\n", 5));
    assert_non_null(strstr(buf, "HTTP/1.1 200"));
    assert_non_null(strstr(buf, "text/event-stream"));
    assert_non_null(strstr(buf, "Cache-Control: no-store"));
    uint64_t v = ms_live_version(g_live);
    char want[64];
    snprintf(want, sizeof want, "id: %llu\nevent: snapshot\ndata: {", (unsigned long long)v);
    assert_true(read_until(fd, buf, cap, &n, want, 5));
    assert_non_null(strstr(buf, "retry: "));

    /* A second stream that says it has seen this version gets nothing until the next. */
    char last[64];
    snprintf(last, sizeof last, "Last-Event-ID: %llu\r\n", (unsigned long long)v);
    int fd2 = sse_open(last);
    char *buf2 = calloc(1, cap);
    size_t n2 = 0;
    assert_true(read_until(fd2, buf2, cap, &n2, "\r\n\r\n", 5));
    assert_false(read_until(fd2, buf2, cap, &n2, "event: snapshot", 0.5));

    /* A new step: both streams get the next version. */
    feed_step(g_live, NSTEPS);
    ms_live_publish_now(g_live);
    snprintf(want, sizeof want, "id: %llu\nevent: snapshot\ndata: {", (unsigned long long)v + 1);
    const double t0 = now_s();
    assert_true(read_until(fd, buf, cap, &n, want, 5));
    assert_true(read_until(fd2, buf2, cap, &n2, want, 5));
    assert_true(now_s() - t0 < 2);
    /* The event's data is the snapshot, whole. */
    const char *data = strstr(strstr(buf2, want), "data: ") + 6;
    const char *end = strstr(data, "\n\n");
    assert_non_null(end);
    ms_snapshot *s = NULL;
    ms_error err = {0};
    assert_int_equal(ms_snapshot_from_json(data, (size_t)(end - data), &s, &err), MS_OK);
    assert_true(s->version == v + 1);
    assert_true(s->step == NSTEPS);
    ms_snapshot_release(s);

    /* Heartbeats: comment lines. */
    ms_web_set_heartbeat_ms(g_web, 300);
    assert_true(read_until(fd, buf, cap, &n, ": heartbeat\n\n", 3));
    ms_web_set_heartbeat_ms(g_web, 0);
    close(fd);
    close(fd2);
    free(buf);
    free(buf2);
}

/* Is s a valid Prometheus metric name? */
static bool metric_name_ok(const char *s, size_t n) {
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':')) return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':')) return false;
    return true;
}

/* The value of the sample with this exact name and label text ("" for none). */
static double sample_value(const char *text, const char *name_labels) {
    char line[256];
    snprintf(line, sizeof line, "\n%s ", name_labels);
    const char *p = strstr(text, line);
    if (!p) fail_msg("no sample %s", name_labels);
    return strtod(p + strlen(line), NULL);
}

static void test_metrics(void **state) {
    (void)state;
    resp r = http("GET", "/metrics", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_string_equal(header(&r, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    assert_security_headers(&r);
    const char *text = r.body;
    assert_true(r.body_len > 0 && text[r.body_len - 1] == '\n');

    /* Line by line: HELP and TYPE once per metric, before its samples; names by the rules. */
    char helped[128][96], typed[128][96];
    int nh = 0, nt = 0, samples = 0;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        assert_non_null(e);
        size_t len = (size_t)(e - p);
        char line[1024];
        assert_true(len < sizeof line);
        memcpy(line, p, len);
        line[len] = '\0';
        p = e + 1;
        if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
            const char *name = line + 7;
            const char *sp = strchr(name, ' ');
            assert_non_null(sp);
            assert_true(metric_name_ok(name, (size_t)(sp - name)));
            char(*list)[96] = line[2] == 'H' ? helped : typed;
            int *cnt = line[2] == 'H' ? &nh : &nt;
            for (int i = 0; i < *cnt; i++)
                if (strlen(list[i]) == (size_t)(sp - name) && !strncmp(list[i], name, sp - name))
                    fail_msg("%s twice: %s", line[2] == 'H' ? "HELP" : "TYPE", line);
            snprintf(list[*cnt], 96, "%.*s", (int)(sp - name), name);
            ++*cnt;
            if (line[2] == 'T') assert_string_equal(sp + 1, "gauge");
            continue;
        }
        assert_true(line[0] != '#' && line[0] != '\0');
        size_t nl = strcspn(line, "{ ");
        assert_true(metric_name_ok(line, nl));
        bool has_type = false;
        for (int i = 0; i < nt; i++)
            has_type |= strlen(typed[i]) == nl && !strncmp(typed[i], line, nl);
        if (!has_type) fail_msg("sample before its TYPE: %s", line);
        const char *v = line + nl;
        if (*v == '{') {
            /* label="value" pairs, values escaped */
            v++;
            while (*v != '}') {
                size_t kl = strcspn(v, "=");
                assert_true(kl > 0 && metric_name_ok(v, kl));
                v += kl;
                assert_true(v[0] == '=' && v[1] == '"');
                v += 2;
                while (*v != '"') {
                    assert_true(*v && *v != '\n');
                    if (*v == '\\') {
                        assert_true(v[1] == '\\' || v[1] == '"' || v[1] == 'n');
                        v++;
                    }
                    v++;
                }
                v++;
                if (*v == ',') v++;
            }
            v++;
        }
        assert_true(*v == ' ');
        char *endp = NULL;
        const char *num = v + 1;
        if (strcmp(num, "NaN") && strcmp(num, "+Inf") && strcmp(num, "-Inf")) {
            strtod(num, &endp);
            assert_true(endp && *endp == '\0' && endp != num);
        }
        samples++;
    }
    assert_int_equal(nh, nt);
    assert_true(samples > 20);

    /* Bytes equal the heatmap's totals: known by construction and equal to the snapshot. */
    const ms_snapshot *s = ms_live_acquire(g_live);
    const size_t cells = (size_t)s->analysis.nranks * s->analysis.nranks;
    double all = 0, dim[2] = {0, 0};
    for (size_t i = 0; i < cells; i++) {
        all += s->analysis.all.bytes[i];
        dim[0] += s->analysis.per_dim[0].bytes[i];
        dim[1] += s->analysis.per_dim[1].bytes[i];
    }
    const int steps = (int)(s->analysis.step_hi - s->analysis.step_lo + 1);
    assert_true(steps >= NSTEPS);
    assert_true(all == (double)steps * NRANKS * (TP_B + DP_B));
    assert_true(sample_value(text, "meshscope_comm_bytes{mesh_dim=\"all\"}") == all);
    assert_string_equal(s->analysis.dim_names[0], "dp");
    assert_string_equal(s->analysis.dim_names[1], "tp");
    assert_true(sample_value(text, "meshscope_comm_bytes{mesh_dim=\"dp\"}") == dim[0]);
    assert_true(sample_value(text, "meshscope_comm_bytes{mesh_dim=\"tp\"}") == dim[1]);
    assert_true(dim[1] == (double)steps * NRANKS * TP_B);
    assert_true(sample_value(text, "meshscope_memory_in_use_bytes{rank=\"3\"}") == 4000);
    assert_true(sample_value(text, "meshscope_memory_peak_bytes{rank=\"1\"}") == 4000);
    assert_true(sample_value(text, "meshscope_step") == (double)s->step);
    assert_true(sample_value(text, "meshscope_tokens_per_second") == 51200);
    assert_non_null(strstr(text, "\nmeshscope_overlap_ratio{rank=\"0\"} "));
    const char *bw = strstr(text, "\nmeshscope_collective_busbw_bytes_per_second{collective="
                                  "\"all_reduce\",mesh_dim=\"");
    assert_non_null(bw);
    assert_non_null(strstr(bw, "\",group_size=\"2\",message_bytes=\"4096\"} "));
    ms_snapshot_release(s);
    resp_free(&r);
}

static void test_trace(void **state) {
    (void)state;
    resp r = http("GET", "/trace.json", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_security_headers(&r);
    assert_true(r.body_len > 100);
    ms_trace_check_info info;
    ms_error err = {0};
    if (ms_trace_check_mem(r.body, r.body_len, "trace.json", &info, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_true(info.n_events > 10);
    resp_free(&r);
}

/* --- the pure checks -------------------------------------------------------------------------- */

static void test_security_functions(void **state) {
    (void)state;
    char tok[MS_WEB_TOKEN_LEN + 1], tok2[MS_WEB_TOKEN_LEN + 1];
    assert_int_equal(ms_web_random_token(tok, NULL), MS_OK);
    assert_int_equal(ms_web_random_token(tok2, NULL), MS_OK);
    assert_int_equal(strlen(tok), 32);
    for (int i = 0; i < 32; i++) assert_true(isxdigit((unsigned char)tok[i]));
    assert_string_not_equal(tok, tok2);
    assert_true(ms_web_token_eq(tok, tok));
    assert_false(ms_web_token_eq(tok, tok2));
    assert_false(ms_web_token_eq("abc", "abcd"));
    assert_false(ms_web_token_eq("abcd", "abc"));
    assert_false(ms_web_token_eq("", ""));
    assert_false(ms_web_token_eq(NULL, "a"));

    assert_true(ms_web_host_ok("127.0.0.1:8080", NULL));
    assert_true(ms_web_host_ok("127.255.0.1", NULL));
    assert_true(ms_web_host_ok("[::1]:1", NULL));
    assert_true(ms_web_host_ok("[::ffff:127.0.0.1]", NULL));
    assert_true(ms_web_host_ok("Localhost", NULL));
    assert_true(ms_web_host_ok("10.1.2.3:80", "10.1.2.3"));
    assert_false(ms_web_host_ok("10.1.2.3:80", NULL));
    assert_false(ms_web_host_ok("", NULL));
    assert_false(ms_web_host_ok(":80", NULL));
    assert_false(ms_web_host_ok("127.0.0.1:", NULL));
    assert_false(ms_web_host_ok("127.0.0.1:99999", NULL));
    assert_false(ms_web_host_ok("127.0.0.1:80:80", NULL));
    assert_false(ms_web_host_ok("[::1", NULL));
    assert_false(ms_web_host_ok("[::1]x", NULL));
    assert_false(ms_web_host_ok("0x7f.0.0.1", NULL));
    assert_false(ms_web_host_ok("127.1", NULL));
    assert_false(ms_web_host_ok("localhost.", NULL));
    assert_false(ms_web_host_ok(NULL, NULL));

    assert_true(ms_web_origin_ok("http://127.0.0.1:8080", 8080, NULL));
    assert_true(ms_web_origin_ok("http://localhost:8080", 8080, NULL));
    assert_true(ms_web_origin_ok("http://[::1]:8080", 8080, NULL));
    assert_true(ms_web_origin_ok("http://localhost", 80, NULL));
    assert_false(ms_web_origin_ok("http://localhost", 8080, NULL));
    assert_false(ms_web_origin_ok("http://127.0.0.1:8081", 8080, NULL));
    assert_false(ms_web_origin_ok("https://127.0.0.1:8080", 8080, NULL));
    assert_false(ms_web_origin_ok("http://127.0.0.1:8080/", 8080, NULL));
    assert_false(ms_web_origin_ok("http://evil.example:8080", 8080, NULL));
    assert_false(ms_web_origin_ok("null", 8080, NULL));

    char out[64];
    assert_true(ms_web_cookie_get("a=1; meshscope_80=tok; b=2", "meshscope_80", out, sizeof out));
    assert_string_equal(out, "tok");
    assert_true(ms_web_cookie_get("meshscope_80=\"q\"", "meshscope_80", out, sizeof out));
    assert_string_equal(out, "q");
    assert_false(ms_web_cookie_get("xmeshscope_80=tok", "meshscope_80", out, sizeof out));
    assert_false(ms_web_cookie_get("meshscope_8080=tok", "meshscope_80", out, sizeof out));
    assert_false(ms_web_cookie_get("meshscope_80=0123456789", "meshscope_80", out, 4));
    assert_true(ms_web_bearer_get("Bearer abc ", out, sizeof out));
    assert_string_equal(out, "abc");
    assert_true(ms_web_bearer_get("bearer  xyz", out, sizeof out));
    assert_string_equal(out, "xyz");
    assert_false(ms_web_bearer_get("Basic abc", out, sizeof out));
    assert_false(ms_web_bearer_get("Bearerabc", out, sizeof out));
    assert_false(ms_web_bearer_get("Bearer ", out, sizeof out));

    assert_int_equal(ms_web_json_depth("{}", 2), 1);
    assert_int_equal(ms_web_json_depth("{\"a\":[[1],{\"b\":\"[[[[\"}]}", 24), 3);
    assert_int_equal(ms_web_json_depth("\"\\\"[[\"", 6), 0);
    assert_int_equal(ms_web_json_depth("1", 1), 0);

    assert_true(ms_web_method_allowed("GET") && ms_web_method_allowed("HEAD") &&
                ms_web_method_allowed("POST"));
    assert_false(ms_web_method_allowed("PUT") || ms_web_method_allowed("get") ||
                 ms_web_method_allowed("DELETE") || ms_web_method_allowed(NULL));

    char host[64];
    int port = -1;
    ms_error err = {0};
    assert_int_equal(ms_web_parse_hostport("127.0.0.1:8080", host, sizeof host, &port, &err),
                     MS_OK);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 8080);
    assert_int_equal(ms_web_parse_hostport(":0", host, sizeof host, &port, &err), MS_OK);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 0);
    assert_int_equal(ms_web_parse_hostport("9000", host, sizeof host, &port, &err), MS_OK);
    assert_int_equal(port, 9000);
    assert_int_equal(ms_web_parse_hostport("[::1]:81", host, sizeof host, &port, &err), MS_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(ms_web_parse_hostport("0.0.0.0:1", host, sizeof host, &port, &err), MS_OK);
    assert_string_equal(host, "0.0.0.0");
    const char *bad[] = {"", "host:", "host:x", "1:65536", "::1:80", "[::1]", ":-1", "a:1 ", NULL};
    for (int i = 0; bad[i]; i++) {
        assert_int_equal(ms_web_parse_hostport(bad[i], host, sizeof host, &port, &err),
                         MS_ERR_INVALID);
        assert_non_null(strstr(err.msg, "--web"));
    }
}

/* --- hardening: defects found by probing (ctest test_web_hardening) ------------------------- */

/* Two Content-Length headers could frame the body two ways: refused whatever their values. */
static void test_duplicate_content_length(void **state) {
    (void)state;
    drain_queue();
    static const char *const lengths[] = {
        "Content-Length: 2\r\nContent-Length: 2\r\n",
        "Content-Length: 0\r\nContent-Length: 2\r\n",
        "Content-Length: 2\r\ncontent-length: 9\r\n",
        NULL,
    };
    for (int i = 0; lengths[i]; i++) {
        char req[512];
        int n = snprintf(req, sizeof req,
                         "POST /api/v1/stop HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s%s"
                         "Connection: close\r\n\r\n{}",
                         g_port, g_bearer, lengths[i]);
        resp r = http_raw(req, (size_t)n);
        expect_status(r, 400);
        assert_non_null(strstr(r.body, "Content-Length"));
        resp_free(&r);
    }
    ms_live_req q;
    assert_false(ms_live_take(g_live, &q));
}

/* The start page sets a session secret, not the token: a leaked cookie does not give the URL
 * (or the Bearer token) away. The cookie authenticates; the token as a cookie does not, nor
 * the secret as a Bearer token. */
static void test_cookie_is_a_session_secret(void **state) {
    (void)state;
    char value[64];
    assert_true(session_cookie(value, sizeof value));
    assert_int_equal(strlen(value), MS_WEB_TOKEN_LEN);
    assert_string_not_equal(value, g_token);
    char h[192];
    snprintf(h, sizeof h, "Cookie: meshscope_%d=%s\r\n", g_port, value);
    resp r = http("GET", "/api/v1/snapshot", NULL, h, NULL);
    expect_status(r, 200);
    resp_free(&r);
    r = http("GET", "/", NULL, h, NULL);
    expect_status(r, 200);
    resp_free(&r);
    snprintf(h, sizeof h, "Cookie: meshscope_%d=%s\r\n", g_port, g_token);
    r = http("GET", "/api/v1/snapshot", NULL, h, NULL);
    expect_status(r, 401);
    resp_free(&r);
    snprintf(h, sizeof h, "Authorization: Bearer %s\r\n", value);
    r = http("GET", "/api/v1/snapshot", NULL, h, NULL);
    expect_status(r, 401);
    resp_free(&r);
}

/* A snapshot whose last event is `in` has `want` as last_event in its JSON. */
static void expect_event_json(const char *in, const char *want) {
    ms_snapshot *s = ms_snapshot_new();
    snprintf(s->last_event, sizeof s->last_event, "%s", in);
    cJSON *j = ms_snapshot_to_json(s);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "last_event")->valuestring, want);
    cJSON_Delete(j);
    ms_snapshot_release(s);
}

/* The job posts its dashboard URL as an event (cli/live_job.c); the snapshots and the event
 * streams, which every client reads, must not carry the token. */
static void test_last_event_redacted(void **state) {
    (void)state;
    ms_live_set_event(g_live, "dashboard: %s", ms_web_url(g_web));
    ms_live_publish_now(g_live);
    char want[128];
    snprintf(want, sizeof want, "dashboard: http://127.0.0.1:%d/?token=***", g_port);
    resp r = http("GET", "/api/v1/snapshot", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_null(strstr(r.body, g_token));
    ms_snapshot *s = NULL;
    ms_error err = {0};
    assert_int_equal(ms_snapshot_from_json(r.body, r.body_len, &s, &err), MS_OK);
    assert_string_equal(s->last_event, want);
    ms_snapshot_release(s);
    resp_free(&r);

    const size_t cap = 1 << 20;
    char *buf = calloc(1, cap);
    size_t n = 0;
    int fd = sse_open(NULL);
    assert_true(read_until(fd, buf, cap, &n, "\"last_event\"", 5));
    assert_true(read_until(fd, buf, cap, &n, "}\n\n", 5));
    assert_null(strstr(buf, g_token));
    assert_non_null(strstr(buf, "token=***"));
    close(fd);
    free(buf);

    expect_event_json("a?token=x&b=1 token=y z", "a?token=***&b=1 token=*** z");
    expect_event_json("token=", "token=***");
    expect_event_json("nothing secret", "nothing secret");
    /* A full-length event whose value is shorter than "***": cut to fit, nothing leaks. */
    char in[MS_LIVE_TEXT], out[MS_LIVE_TEXT];
    memset(in, 'x', sizeof in - 1);
    memcpy(in + sizeof in - 9, "token=ab", 9);
    snprintf(out, sizeof out, "%.*stoken=**", (int)sizeof in - 9, in);
    expect_event_json(in, out);
}

/* promtool's lint: base units. The bus bandwidth is bytes per second, the analysis' GB/s
 * (10^9 bytes) scaled. */
static void test_metrics_base_units(void **state) {
    (void)state;
    resp r = http("GET", "/metrics", NULL, g_bearer, NULL);
    expect_status(r, 200);
    assert_null(strstr(r.body, "gigabytes"));
    const ms_snapshot *s = ms_live_acquire(g_live);
    const ms_analysis *a = &s->analysis;
    assert_true(a->n_busbw > 0);
    for (int i = 0; i < a->n_busbw; i++) {
        const ms_busbw_row *x = &a->busbw[i];
        char key[256];
        snprintf(key, sizeof key,
                 "meshscope_collective_busbw_bytes_per_second{collective=\"%s\",mesh_dim=\"%s\","
                 "group_size=\"%d\",message_bytes=\"%llu\"}",
                 ms_coll_name((ms_coll_kind)x->coll),
                 x->mesh_dim >= 0 ? a->dim_names[x->mesh_dim] : "world", x->group_size,
                 (unsigned long long)x->bytes);
        assert_true(x->busbw_gbs > 0);
        assert_true(sample_value(r.body, key) == x->busbw_gbs * 1e9);
    }
    ms_snapshot_release(s);
    resp_free(&r);
}

#define CROWD 16 /* slow clients from each of 127.0.0.1, .2 and .3 */

typedef struct slow_client {
    int fd;
    double opened, closed; /* closed: 0 while open */
} slow_client;

/* Waits up to ms for slow clients to be hung up on; they must get no answer. */
static void watch_slow(slow_client *k, int n, int ms) {
    struct pollfd p[3 * CROWD];
    int idx[3 * CROWD], m = 0;
    for (int i = 0; i < n; i++)
        if (!k[i].closed) {
            p[m] = (struct pollfd){.fd = k[i].fd, .events = POLLIN};
            idx[m++] = i;
        }
    if (m == 0 || poll(p, (nfds_t)m, ms) <= 0) return;
    for (int j = 0; j < m; j++) {
        if (!p[j].revents) continue;
        char buf[256];
        ssize_t got = recv(p[j].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0) fail_msg("a slow client got an answer: %.*s", (int)got, buf);
        if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) k[idx[j]].closed = now_s();
    }
}

/* Slowloris: crowds of clients from three addresses that send a request one header line at a
 * time, more often than the idle timeout, more of them than the connection limits. An
 * authenticated client from the crowd's own address is answered promptly all along, and
 * every slow client is hung up on by the request deadline (TIMEOUT), without an answer. */
static void test_slowloris_crowd(void **state) {
    (void)state;
    ms_web *w = NULL;
    ms_error err = {0};
    ms_web_opts o = {.token = g_token, .max_conns = 16, .max_per_ip = 8, .timeout_s = TIMEOUT};
    assert_int_equal(ms_web_start(g_live, &o, &w, &err), MS_OK);
    const int saved = g_port;
    g_port = ms_web_port(w);
    static const char *const from[] = {"127.0.0.1", "127.0.0.2", "127.0.0.3"};
    char head[128];
    int hl = snprintf(head, sizeof head, "GET /api/v1/snapshot HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n",
                      g_port);
    slow_client k[3 * CROWD];
    int n = 0;
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < CROWD; i++, n++) {
            k[n] = (slow_client){.fd = dial_from(from[a], g_port), .opened = now_s()};
            send_all(k[n].fd, head, (size_t)hl);
        }
    const double t0 = now_s();
    double next_line = t0 + 0.5;
    for (int asked = 0; now_s() - t0 < TIMEOUT + 1.5; asked++) {
        const double q0 = now_s();
        resp r = http("GET", "/api/v1/snapshot", NULL, g_bearer, NULL);
        const double took = now_s() - q0;
        if (r.status != 200 || took > 1.0)
            fail_msg("request %d under attack: status %d after %.2f s", asked, r.status, took);
        resp_free(&r);
        if (now_s() >= next_line) {
            for (int i = 0; i < n; i++)
                if (!k[i].closed) send_all(k[i].fd, "X-Slow: 1\r\n", 11);
            next_line += 0.5;
        }
        watch_slow(k, n, 250);
    }
    int waited = 0; /* slow clients that lasted until the deadline */
    for (int i = 0; i < n; i++) {
        if (!k[i].closed || k[i].closed - k[i].opened > TIMEOUT + 1.0)
            fail_msg("slow client %d (from %s) still open %.2f s after it connected", i,
                     from[i / CROWD], (k[i].closed ? k[i].closed : now_s()) - k[i].opened);
        waited += k[i].closed - k[i].opened >= TIMEOUT - 0.5;
        close(k[i].fd);
    }
    assert_true(waited > 0);
    g_port = saved;
    ms_web_stop(w);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_security_functions),
        cmocka_unit_test(test_start_page),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_host_header),
        cmocka_unit_test(test_post_origin),
        cmocka_unit_test(test_methods),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_suggestions),
        cmocka_unit_test(test_advisor_note),
        cmocka_unit_test(test_finished_job),
        cmocka_unit_test(test_slowloris),
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_trace),
    };
    const struct CMUnitTest hardening[] = {
        cmocka_unit_test(test_duplicate_content_length),
        cmocka_unit_test(test_cookie_is_a_session_secret),
        cmocka_unit_test(test_last_event_redacted),
        cmocka_unit_test(test_metrics_base_units),
        cmocka_unit_test(test_slowloris_crowd),
    };
    if (argc > 1 && !strcmp(argv[1], "hardening"))
        return cmocka_run_group_tests_name("web hardening", hardening, setup, teardown);
    return cmocka_run_group_tests_name("web", tests, setup, teardown);
}

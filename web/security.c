/* security.c - the request checks of the dashboard as pure functions over header text: the
 * token and its constant-time comparison, the cookie and Bearer header, the Host header
 * (DNS rebinding: only loopback names), the Origin of state-changing requests, the method
 * allow-list and the JSON nesting depth. server.c applies them in that order; docs/api.md
 * states the rules.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include <cjson/cJSON.h>

#include "engine/io/json_text.h"
#include "web/web_internal.h"

ms_status ms_web_random_token(char *out, ms_error *err) {
    unsigned char raw[MS_WEB_TOKEN_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return ms_fail(err, MS_ERR_IO, "web: getrandom failed: %s", strerror(errno));
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[MS_WEB_TOKEN_LEN] = '\0';
    return MS_OK;
}

bool ms_web_token_eq(const char *a, const char *b) {
    if (!a || !b) return false;
    size_t la = strlen(a), lb = strlen(b);
    /* Compare every byte of b against a (wrapping), so the time depends only on lengths. */
    unsigned diff = (unsigned)(la ^ lb);
    for (size_t i = 0; i < lb; i++) diff |= (unsigned char)(a[la ? i % la : 0] ^ b[i]);
    return la > 0 && diff == 0;
}

bool ms_web_is_loopback(const char *host, size_t len) {
    char buf[64];
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, host, len);
    buf[len] = '\0';
    if (!strcasecmp(buf, "localhost")) return true;
    struct in_addr a4;
    if (inet_pton(AF_INET, buf, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    struct in6_addr a6;
    if (inet_pton(AF_INET6, buf, &a6) == 1) {
        if (!memcmp(&a6, &in6addr_loopback, sizeof a6)) return true;
        /* ::ffff:127.x.y.z */
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        return !memcmp(a6.s6_addr, mapped, 12) && a6.s6_addr[12] == 127;
    }
    return false;
}

/* Splits "host", "host:port", "[v6]" or "[v6]:port" (the whole string) into the host (without
 * brackets) and the port (-1 when absent). False when malformed. */
static bool split_hostport(const char *s, size_t n, const char **host, size_t *hlen, long *port) {
    const char *colon = NULL;
    *port = -1;
    if (n == 0) return false;
    if (s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close) return false;
        *host = s + 1;
        *hlen = (size_t)(close - s - 1);
        if (close + 1 == s + n) return *hlen > 0;
        if (close[1] != ':') return false;
        colon = close + 1;
    } else {
        const char *c = memchr(s, ':', n);
        if (c && memchr(c + 1, ':', (size_t)(s + n - c - 1))) return false; /* bare IPv6 */
        *host = s;
        *hlen = c ? (size_t)(c - s) : n;
        if (!c) return *hlen > 0;
        colon = c;
    }
    const char *p = colon + 1, *end = s + n;
    if (p == end || end - p > 5) return false;
    long v = 0;
    for (; p < end; p++) {
        if (!isdigit((unsigned char)*p)) return false;
        v = v * 10 + (*p - '0');
    }
    if (v > 65535) return false;
    *port = v;
    return *hlen > 0;
}

static bool host_allowed(const char *h, size_t n, const char *extra) {
    if (ms_web_is_loopback(h, n)) return true;
    return extra && *extra && strlen(extra) == n && !strncasecmp(h, extra, n);
}

bool ms_web_host_ok(const char *host_header, const char *extra) {
    if (!host_header) return false;
    const char *h;
    size_t n;
    long port;
    if (!split_hostport(host_header, strlen(host_header), &h, &n, &port)) return false;
    return host_allowed(h, n, extra);
}

bool ms_web_origin_ok(const char *origin, int port, const char *extra) {
    static const char scheme[] = "http://";
    if (!origin || strncmp(origin, scheme, sizeof scheme - 1)) return false;
    const char *rest = origin + sizeof scheme - 1;
    const char *h;
    size_t n;
    long p;
    if (!split_hostport(rest, strlen(rest), &h, &n, &p)) return false;
    if (p < 0) p = 80;
    return p == port && host_allowed(h, n, extra);
}

bool ms_web_cookie_get(const char *cookie_header, const char *name, char *out, size_t cap) {
    if (!cookie_header || !name) return false;
    size_t nl = strlen(name);
    const char *p = cookie_header;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ';') p++;
        const char *end = strchr(p, ';');
        if (!end) end = p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        if (eq && (size_t)(eq - p) == nl && !strncmp(p, name, nl)) {
            const char *v = eq + 1, *ve = end;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            if (ve - v >= 2 && *v == '"' && ve[-1] == '"') v++, ve--;
            size_t vl = (size_t)(ve - v);
            if (vl >= cap) return false;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return true;
        }
        p = end;
    }
    return false;
}

bool ms_web_bearer_get(const char *authz, char *out, size_t cap) {
    if (!authz) return false;
    while (*authz == ' ') authz++;
    if (strncasecmp(authz, "Bearer", 6) || (authz[6] != ' ' && authz[6] != '\t')) return false;
    const char *v = authz + 6;
    while (*v == ' ' || *v == '\t') v++;
    size_t vl = strlen(v);
    while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) vl--;
    if (vl == 0 || vl >= cap) return false;
    memcpy(out, v, vl);
    out[vl] = '\0';
    return true;
}

size_t ms_web_json_depth(const char *s, size_t len) {
    return ms_json_max_depth(s, len);
}

ms_status ms_web_parse_json(const char *body, size_t len, cJSON **out, ms_error *err) {
    *out = NULL;
    size_t depth = ms_web_json_depth(body, len);
    if (depth > MS_WEB_JSON_MAX_DEPTH)
        return ms_fail(err, MS_ERR_INVALID, "JSON nested deeper than %d levels",
                       MS_WEB_JSON_MAX_DEPTH);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    size_t at = j && end ? (size_t)(end - body) : 0;
    while (j && at < len &&
           (body[at] == ' ' || body[at] == '\t' || body[at] == '\r' || body[at] == '\n'))
        at++;
    if (!j || at != len) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        cJSON_Delete(j);
        return ms_fail(err, MS_ERR_INVALID, "malformed JSON near byte %zu", off);
    }
    *out = j;
    return MS_OK;
}

bool ms_web_method_allowed(const char *method) {
    return method && (!strcmp(method, "GET") || !strcmp(method, "HEAD") || !strcmp(method, "POST"));
}

ms_status ms_web_parse_hostport(const char *text, char *host, size_t cap, int *port,
                                ms_error *err) {
    static const char form[] = "expected HOST:PORT, :PORT or PORT, e.g. 127.0.0.1:8080";
    if (!text || !*text) return ms_fail(err, MS_ERR_INVALID, "--web '': %s", form);
    const char *colon = NULL;
    const char *hs = text;
    size_t hl = 0;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':')
            return ms_fail(err, MS_ERR_INVALID, "--web '%s': %s ([::1]:8080 for IPv6)", text, form);
        hs = text + 1;
        hl = (size_t)(close - text - 1);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon && memchr(text, ':', (size_t)(colon - text)))
            return ms_fail(err, MS_ERR_INVALID, "--web '%s': %s (write IPv6 as [::1]:8080)", text,
                           form);
        hl = colon ? (size_t)(colon - text) : 0;
    }
    const char *ps = colon ? colon + 1 : text;
    char *end = NULL;
    errno = 0;
    long p = strtol(ps, &end, 10);
    if (!*ps || *end || errno || p < 0 || p > 65535 || !isdigit((unsigned char)*ps))
        return ms_fail(err, MS_ERR_INVALID, "--web '%s': the port must be 0..65535; %s", text,
                       form);
    if (hl == 0) {
        hs = "127.0.0.1";
        hl = strlen(hs);
    }
    if (hl >= cap) return ms_fail(err, MS_ERR_INVALID, "--web '%s': host name too long", text);
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *port = (int)p;
    return MS_OK;
}

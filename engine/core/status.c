/* status.c - status strings and error formatting. */
#include "engine/core/status.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[MS_STATUS_COUNT] = {
    [MS_OK] = "ok",
    [MS_ERR_INVALID] = "invalid argument",
    [MS_ERR_NOMEM] = "out of memory",
    [MS_ERR_TIMEOUT] = "timed out",
    [MS_ERR_COMM] = "communication error",
    [MS_ERR_IO] = "i/o error",
    [MS_ERR_UNSUPPORTED] = "unsupported",
    [MS_ERR_INTERNAL] = "internal error",
    [MS_ERR_DIVERGED] = "training diverged",
};

const char *ms_status_str(ms_status s) {
    if ((unsigned)s >= MS_STATUS_COUNT || !status_names[s]) return "unknown status";
    return status_names[s];
}

ms_status ms_fail(ms_error *err, ms_status code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

ms_status ms_fail_wrap(ms_error *err, ms_status code, const char *fmt, ...) {
    if (!err) return code;
    char prefix[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Shift the old message right and put "prefix: " in front, truncating at the end. */
    size_t plen = strnlen(prefix, sizeof prefix - 1), olen = strnlen(err->msg, sizeof err->msg - 1);
    if (plen + 2 >= sizeof err->msg) plen = sizeof err->msg - 3;
    if (plen + 2 + olen >= sizeof err->msg) olen = sizeof err->msg - plen - 3;
    memmove(err->msg + plen + 2, err->msg, olen);
    memcpy(err->msg, prefix, plen);
    err->msg[plen] = ':';
    err->msg[plen + 1] = ' ';
    err->msg[plen + 2 + olen] = '\0';
    err->code = code;
    return code;
}

void ms_error_clear(ms_error *err) {
    if (!err) return;
    err->code = MS_OK;
    err->msg[0] = '\0';
}

/* Length (1..4) of the well-formed UTF-8 sequence at s, with its code point in *cp; 0 for an
 * invalid one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, or
 * cut short by the terminating NUL). */
static size_t utf8_seq(const unsigned char *s, uint32_t *cp) {
    uint32_t v, min;
    size_t n;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        n = 2, v = s[0] & 0x1Fu, min = 0x80;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF)
        n = 3, v = s[0] & 0x0Fu, min = 0x800;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4)
        n = 4, v = s[0] & 0x07u, min = 0x10000;
    else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

/* Code points a terminal acts on or that reorder the text around them. */
static bool is_control(uint32_t cp) {
    return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

const char *ms_safe_str(char *out, size_t cap, const char *s) {
    if (!s) s = "(null)";
    const unsigned char *p = (const unsigned char *)s;
    size_t k = 0, cut = 0; /* cut: the last piece boundary that leaves room for "..." */
    while (*p) {
        char piece[16];
        size_t m = 0;
        uint32_t cp;
        size_t n = utf8_seq(p, &cp);
        if (n == 0 || is_control(cp)) {
            if (n == 0) n = 1;
            for (size_t i = 0; i < n; i++) m += (size_t)snprintf(piece + m, 5, "\\x%02X", p[i]);
        } else if (cp == '\\') {
            m = 2, piece[0] = piece[1] = '\\';
        } else {
            memcpy(piece, p, n), m = n;
        }
        if (k + m > cap - 1) {
            memcpy(out + cut, "...", 4);
            return out;
        }
        memcpy(out + k, piece, m);
        k += m;
        if (k <= cap - 4) cut = k;
        p += n;
    }
    out[k] = '\0';
    return out;
}

void ms_debug_check_failed(const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s:%d: check failed: %s: %s\n", file, line, cond, msg);
    abort();
}

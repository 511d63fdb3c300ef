/* status.c - status strings and error formatting. */
#include "engine/core/status.h"

#include <stdio.h>
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

/* status.h - errors are values.
 *
 * Library functions return an ms_status and, when they fail, write a message that names
 * the problem (and, where possible, the fix) into a caller-provided ms_error. Only the
 * CLI prints and exits. Passing err = NULL is allowed: the code is still returned.
 */
#ifndef MS_STATUS_H
#define MS_STATUS_H

#include <stdarg.h>
#include <stddef.h>

typedef enum ms_status {
    MS_OK = 0,
    MS_ERR_INVALID,     /* bad argument or input: the caller can fix it */
    MS_ERR_NOMEM,       /* an allocation failed */
    MS_ERR_TIMEOUT,     /* a collective or wait exceeded its deadline */
    MS_ERR_COMM,        /* a communicator failed or is broken */
    MS_ERR_IO,          /* a file or socket operation failed */
    MS_ERR_UNSUPPORTED, /* valid request that this build or backend cannot do */
    MS_ERR_INTERNAL,    /* a broken invariant: a bug in meshscope */
    MS_ERR_DIVERGED,    /* training produced a non-finite loss or gradient norm */
    MS_STATUS_COUNT
} ms_status;

#define MS_ERROR_MSG_MAX 768

typedef struct ms_error {
    ms_status code;
    char msg[MS_ERROR_MSG_MAX];
} ms_error;

/* "ok", "invalid argument", ... Never NULL. */
const char *ms_status_str(ms_status s);

/* Records code and a printf-style message into err (if non-NULL) and returns code,
 * so that a failing path reads `return ms_fail(err, MS_ERR_INVALID, "...", ...);`. */
ms_status ms_fail(ms_error *err, ms_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message, to add context on the way up. */
ms_status ms_fail_wrap(ms_error *err, ms_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void ms_error_clear(ms_error *err);

/* Text read from a file (a tensor name, a JSON key or value, a trace string) made fit to put
 * in a message: control characters (C0, DEL, C1, the bidirectional overrides) and bytes that
 * are not valid UTF-8 become \xNN, a backslash becomes \\, and the rendering is cut with
 * "..." where it would not fit out[cap] (cap >= 8), so a file can neither drive the terminal
 * nor flood the message. NULL renders as "(null)". Returns out. */
const char *ms_safe_str(char *out, size_t cap, const char *s);

/* Room for one name rendered by ms_safe_str in a message. */
#define MS_SAFE_LEN 128

/* A precondition that, broken, would make a kernel read or write out of bounds: checked in
 * debug builds (no NDEBUG), where a failure prints file:line, the condition and the message
 * to stderr and aborts, as assert does; compiled out otherwise. Callers validate their
 * inputs before they reach a kernel; this catches the caller that did not. */
#ifdef NDEBUG
#define MS_DEBUG_CHECK(cond, ...) ((void)0)
#else
#define MS_DEBUG_CHECK(cond, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) ms_debug_check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__);                \
    } while (0)
#endif
_Noreturn void ms_debug_check_failed(const char *file, int line, const char *cond, const char *fmt,
                                     ...) __attribute__((format(printf, 4, 5)));

/* Propagate a failing status. */
#define MS_CHECK(expr)                                                                             \
    do {                                                                                           \
        ms_status ms_check_s_ = (expr);                                                            \
        if (ms_check_s_ != MS_OK) return ms_check_s_;                                              \
    } while (0)

/* Propagate a failing status through a cleanup label; `st` must be an ms_status variable. */
#define MS_CHECK_GOTO(expr, st, label)                                                             \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) != MS_OK) goto label;                                                             \
    } while (0)

#endif

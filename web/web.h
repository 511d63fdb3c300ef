/* web.h - the embedded dashboard: an HTTP server (libmicrohttpd) over a live model.
 *
 * Serves the page (assets embedded in the binary), the JSON API under /api/v1
 * (docs/api.md), server-sent events, /metrics (Prometheus text) and /trace.json, with the
 * security defaults of docs/api.md: loopback bind, a token exchanged for a session cookie,
 * Host and Origin checks, method and body limits, connection limits, timeouts and a deadline
 * for each request to arrive.
 *
 * Threads: libmicrohttpd's own; the server only reads snapshots and posts requests to the
 * live model's control queue, so it never blocks training.
 * Ownership: the caller owns the server and the live model; stop the server first.
 */
#ifndef MS_WEB_H
#define MS_WEB_H

#include <stddef.h>

#include "engine/core/status.h"
#include "profiler/live.h"

typedef struct ms_web ms_web;

typedef struct ms_web_opts {
    const char *host;  /* NULL: "127.0.0.1" */
    int port;          /* 0: any free port */
    const char *token; /* NULL: 32 random hex characters */
    int max_conns;     /* 0: 256; half at most for connections still sending a request */
    int max_per_ip;    /* 0: 128; likewise */
    int timeout_s;     /* idle timeout, and the most a request may take to arrive; 0: 10 */
    size_t body_cap;   /* request body bytes; 0: 64 KiB */
    /* Where to write the token for `meshscope top --token-file` (NULL: nowhere): one line,
     * mode 0600, a regular file of this user's; removed when the server stops. */
    const char *token_file;
} ms_web_opts;

/* Parses "HOST:PORT" (or ":PORT", or "PORT") into host (cap bytes) and port. Errors name
 * the text and the expected form. */
ms_status ms_web_parse_hostport(const char *text, char *host, size_t cap, int *port, ms_error *err);

/* Starts serving live (borrowed). Fails with MS_ERR_IO naming the address when it cannot
 * bind, or naming the token file when it cannot write it. */
ms_status ms_web_start(ms_live *live, const ms_web_opts *opts, ms_web **out, ms_error *err);
/* "http://127.0.0.1:PORT/?token=TOKEN" */
const char *ms_web_url(const ms_web *w);
int ms_web_port(const ms_web *w);
const char *ms_web_token(const ms_web *w);
/* Closes every connection (SSE streams end) and frees the server. NULL is fine. */
void ms_web_stop(ms_web *w);

#endif

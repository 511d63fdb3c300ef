/* source.h - where the TUI's snapshots come from, and where its requests go.
 *
 * Two sources share one interface: the in-process live model (`train --tui`) and a running
 * job's dashboard over HTTP (`meshscope top URL`). The UI thread polls its source every
 * tick; a source never blocks that thread for long (the HTTP source fetches on a thread of
 * its own and hands over the newest snapshot).
 *
 * Ownership: a snapshot returned by poll belongs to the caller until it gives it back with
 * release. ms_tui_source_destroy frees the source (stopping its thread).
 */
#ifndef MS_TUI_SOURCE_H
#define MS_TUI_SOURCE_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/core/status.h"
#include "profiler/live.h"

typedef struct ms_tui ms_tui;

typedef struct ms_tui_source_ops {
    /* A snapshot newer than the last one returned, or NULL when there is none. */
    const ms_snapshot *(*poll)(void *self);
    void (*release)(void *self, const ms_snapshot *s);
    /* Accept, dismiss or stop. Errors carry a message to show the user. */
    ms_status (*post)(void *self, const ms_live_req *req, ms_error *err);
    /* A line about a connection problem ("disconnected: ..."); false when all is well. */
    bool (*trouble)(void *self, char *buf, size_t cap);
    void (*destroy)(void *self);
} ms_tui_source_ops;

typedef struct ms_tui_source {
    const ms_tui_source_ops *ops;
    void *self;
    bool in_process; /* q also asks the job to stop */
    bool read_only;  /* accept and dismiss are refused */
    char where[256]; /* shown in the header: "in-process" or the dashboard address */
} ms_tui_source;

/* The in-process live model (borrowed; it must outlive the source). */
ms_tui_source *ms_tui_source_live(ms_live *live);

/* A dashboard: base_url is "http://HOST:PORT" and token its access token. Fetches the first
 * snapshot before returning, so that a wrong address or token fails here, before the
 * terminal is taken over: MS_ERR_IO (cannot connect, bad reply) or MS_ERR_INVALID (token
 * refused, not a meshscope dashboard), with a message naming the address and the fix. Then
 * refetches every interval_ms on its own thread. */
ms_status ms_tui_source_http(const char *base_url, const char *token, int interval_ms,
                             ms_tui_source **out, ms_error *err);

/* Splits the dashboard line a job prints, "http://127.0.0.1:PORT/?token=TOKEN", into the
 * base "http://127.0.0.1:PORT" and the token (empty when the URL has none). Accepts http and
 * https, an optional path ("/" or empty), other query parameters. Errors quote the URL and
 * show the expected form. */
ms_status ms_tui_parse_url(const char *url, char *base, size_t base_cap, char *token,
                           size_t token_cap, ms_error *err);

void ms_tui_source_destroy(ms_tui_source *s);

/* Like ms_tui_start, over any source (taken over by the TUI, also on failure). */
ms_status ms_tui_start_source(ms_tui_source *src, ms_tui **out, ms_error *err);

#endif

/* snapshot_json.h - a live snapshot (profiler/live.h) as JSON and back: the body of
 * GET /api/v1/snapshot and of every server-sent event, and what `meshscope top` reads.
 * The format is documented in docs/api.md; from_json(to_json(s)) reproduces every field the
 * views show (a round trip test holds it to that).
 */
#ifndef MS_SNAPSHOT_JSON_H
#define MS_SNAPSHOT_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "engine/core/status.h"
#include "profiler/live.h"

/* A new cJSON tree (caller frees with cJSON_Delete); NULL only when out of memory. */
cJSON *ms_snapshot_to_json(const ms_snapshot *s);

/* Parses text (len bytes, not necessarily NUL-terminated) into a new snapshot holding one
 * reference (release with ms_snapshot_release). Errors name the JSON path:
 * "snapshot: $.analysis.heatmap.bytes: expected an array of 16 numbers". */
ms_status ms_snapshot_from_json(const char *text, size_t len, ms_snapshot **out, ms_error *err);

/* A snapshot with one reference and every array empty (helpers for builders and parsers). */
ms_snapshot *ms_snapshot_new(void);

#endif

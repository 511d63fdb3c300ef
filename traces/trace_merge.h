/* trace_merge.h - per-rank traces (trace_read.h) merged into one list of events and groups,
 * for `meshscope trace merge`.
 *
 * Events are appended in the order they are added. Group ids are per file (each rank numbers
 * its own), so groups are deduplicated across files by name, size and listed ranks, numbered
 * from 0 in the order first seen, and each collective's group id is mapped to the merged one
 * (-1 when its file has no group with that id; the last such group when it has several).
 * The work is linear in events plus groups: every lookup goes through a hash index.
 *
 * Ownership: the merge owns its arrays until ms_trace_merge_free; a trace added is borrowed
 * for the call only. Zero-initialise to start empty.
 */
#ifndef MS_TRACE_MERGE_H
#define MS_TRACE_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/hmap.h"
#include "engine/core/status.h"
#include "traces/trace_read.h"

typedef struct ms_trace_merge {
    ms_event *events;
    size_t n_events;
    ms_group *groups;
    int n_groups;
    /* Group lookups made and hash-table slots they examined (as in ms_trace), for tests. */
    uint64_t n_group_lookups, n_group_probes;
    /* private */
    size_t cap;
    int gcap;
    ms_hmap by_key; /* the merged groups by name, size and ranks */
} ms_trace_merge;

/* Appends t's events, its collectives' groups mapped to merged ones. MS_ERR_NOMEM when memory
 * runs out: the merge then holds part of t and is good only for ms_trace_merge_free. */
ms_status ms_trace_merge_add(ms_trace_merge *m, const ms_trace *t, ms_error *err);
void ms_trace_merge_free(ms_trace_merge *m);

#endif

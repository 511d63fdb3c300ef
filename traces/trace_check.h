/* trace_check.h - checks a trace file against the Trace Event Format rules (docs/formats.md
 * section 2), for `meshscope trace check` and the tests.
 *
 * Rules, in the order they are checked:
 *   file     well-formed JSON; a top-level object with a "traceEvents" array (the JSON Object
 *            Format); "displayTimeUnit", if present, is "ms" or "ns"
 *   each event (in file order; the first failure stops the check)
 *            an object with a string "ph" that is a known phase; "pid" and "tid", where
 *            present, integers; "pid" present except on global instants, "tid" present on
 *            X, B, E, thread instants, flows and thread metadata; a numeric "ts" on every
 *            event but M (and within +-2^63 ns); X has a numeric "dur" >= 0; i/I scope "s"
 *            is "g", "p" or "t"; C has an "args" object whose values are all numbers; M is
 *            one of process_name, process_labels, process_sort_index, thread_name,
 *            thread_sort_index with args.name / args.labels (string) or args.sort_index
 *            (integer); s/t/f have an "id" (number or string), and "bp", if present, is "e";
 *            b/e/n have an "id" or "id2"
 *   meshscope's own (files with a top-level "meshscope" object before "traceEvents", as the
 *   writer puts it; per event, in file order)
 *            an X slice of cat "pipeline" has an args object with "action" "F", "B" or "W";
 *            integers "stages" >= 1, "virtual stages" in 1..256, "micro-batches" >= 1,
 *            0 <= "stage" < stages, 0 <= "micro-batch" < micro-batches, 0 <= "chunk" <
 *            virtual stages, "model chunk" = chunk * stages + stage; a non-empty string
 *            "schedule", which is "zb-h1" for a W (no other schedule splits W from B); "phase"
 *            "forward" for F, "backward" for B and W; and the name the writer gives it
 *            (ms_trace_pipe_name: "F3", or "F3.1" with virtual stages)
 *   across events (after the file is read; the violation with the lowest event index wins)
 *            X events on one (pid, tid) may touch or nest (one fully inside another: the
 *            format allows it and viewers draw a stack) but never partially overlap;
 *            B/E pair up per (pid, tid) in time order, an E naming its B's name if both
 *            have one, every B ended; every f and t flow event has an s with the same
 *            (cat, id). (Flow ids are compared by a 64-bit hash.)
 * The trace writer (trace_write.h) is stricter than the X rule: it never nests either.
 *
 * Streaming as the reader is: memory is about 40 bytes per X, B/E or flow event.
 */
#ifndef MS_TRACE_CHECK_H
#define MS_TRACE_CHECK_H

#include <stddef.h>

#include "engine/core/status.h"

typedef struct ms_trace_check_info {
    size_t n_events;  /* elements of traceEvents read */
    size_t violation; /* index of the offending event, or SIZE_MAX (none, or a file-level
                         problem such as malformed JSON) */
    size_t other;     /* the other event involved (the overlapped slice, the unmatched B),
                         or SIZE_MAX */
} ms_trace_check_info;

/* MS_OK when the file follows every rule; MS_ERR_INVALID with the first violation in err
 * ("x.json: event 12 (byte 3456): X event needs a numeric \"dur\" >= 0"); MS_ERR_IO when
 * the file cannot be read. info may be NULL. */
ms_status ms_trace_check(const char *path, ms_trace_check_info *info, ms_error *err);
ms_status ms_trace_check_mem(const void *data, size_t len, const char *name,
                             ms_trace_check_info *info, ms_error *err);

#endif

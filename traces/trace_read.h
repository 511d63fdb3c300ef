/* trace_read.h - reads a Chrome trace back into events (profiler/event.h) and groups, for
 * `meshscope trace summary` and `trace merge`.
 *
 * Streams the file (traces/trace_json.h): memory use is the events kept plus one event's
 * JSON, whatever the file size. What becomes an event:
 *   - meshscope's own files (a top-level "meshscope" key before "traceEvents", as
 *     trace_write.h puts it): everything trace_write.h writes (pipeline slices included),
 *     with pid = rank. The round trip is exact: times to the nanosecond (the file has
 *     microseconds with 3 decimals), every field from the args, memory bytes to the byte.
 *     One exception: a counter carries no step, so a memory event's step is that of the
 *     rank's ProfilerStep slice containing it (-1 if none) and its phase is "other". A
 *     pipeline slice without a known "action" (F, B, W) is skipped.
 *   - other Chrome traces (e.g. PyTorch/Kineto): ProfilerStep#N slices (steps; not the GPU
 *     copies, cat "gpu_user_annotation"), X events whose args name a "Collective name"
 *     (collectives, bytes from the element counts and dtype; not the CPU-side "cpu_op"
 *     records, which duplicate the GPU kernel), other "kernel" slices (ops); the rank is
 *     distributedInfo.rank, and events without a step take that of the step slice around them.
 * Everything else (flows, metadata, nested CPU ops, unknown phases, malformed but
 * syntactically valid events) is counted in n_ignored and skipped: foreign files never fail
 * for content this reader does not understand. Syntax errors, truncation and files that are
 * not Chrome traces fail with MS_ERR_INVALID and a message naming the file and byte:
 *   "x.json: byte 123: expected ',' or ']'", "x.json: not a Chrome trace (no traceEvents array)"
 *
 * Groups come from distributedInfo.pg_config (pg_id, pg_name, ranks); a foreign collective
 * whose group is not listed gets a group made from its "Process Group Ranks".
 */
#ifndef MS_TRACE_READ_H
#define MS_TRACE_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/event.h"

/* A trace as read. Owns its arrays; free with ms_trace_free (also safe after a failure). */
typedef struct ms_trace {
    ms_event *events; /* in file order, t0_ns/t1_ns absolute (baseTimeNanoseconds added) */
    size_t n_events;
    ms_group *groups;
    int n_groups;
    int64_t base_ns;       /* baseTimeNanoseconds, 0 if absent */
    int rank;              /* distributedInfo.rank (0 if absent) */
    int world_size;        /* distributedInfo.world_size (0 if absent) */
    char backend[32];      /* distributedInfo.backend ("" if absent) */
    bool meshscope;        /* written by meshscope (trace_write.h) */
    size_t n_trace_events; /* elements of traceEvents */
    size_t n_ignored;      /* of those, not turned into events */
    /* The reader's group lookups (by name, ranks or id: a few per foreign collective) and the
     * hash-table slots they examined, about two per lookup however many groups there are:
     * tests hold the reader to constant work per event with these. */
    uint64_t n_group_lookups, n_group_probes;
} ms_trace;

ms_status ms_trace_read(const char *path, ms_trace *out, ms_error *err);
/* The same from memory (borrowed for the call); `name` is used in messages. */
ms_status ms_trace_read_mem(const void *data, size_t len, const char *name, ms_trace *out,
                            ms_error *err);
void ms_trace_free(ms_trace *t);

/* The strategy a trace ran, as far as its groups tell: its mesh degrees (the groups named as a
 * strategy's degree settings, dp, tp, cp, pp, in that order, each once), "dp2 x tp2"; other
 * groups ("world", an unnamed dim "d0", point-to-point pairs) are not strategy dims. "trace"
 * when it has none. */
void ms_trace_strategy_text(const ms_trace *t, char *out, size_t cap);

/* ms_coll_kind for a collective name, ours ("all_reduce") or PyTorch's ("allreduce",
 * "_allgather_base", "reduce_scatter_tensor", ...); -1 if unknown. */
int ms_trace_coll_parse(const char *name);

#endif

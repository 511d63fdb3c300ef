/* trace_write.h - exports recorded events (profiler/event.h) as a Chrome/Perfetto trace in
 * Kineto's layout, so that Perfetto, chrome://tracing and Holistic Trace Analysis read it.
 *
 * The file (JSON Object Format, docs/formats.md section 2):
 *
 *   {"schemaVersion": 1, "meshscope": {"format": 1, ...}, "deviceProperties": [...],
 *    "distributedInfo": {"backend", "rank", "world_size", "pg_count", "pg_config": [...]},
 *    "baseTimeNanoseconds": B, "displayTimeUnit": "ms", "traceEvents": [...]}
 *
 * One process per rank (pid = world rank), so per-rank files and a merged file look alike;
 * distributedInfo describes meta->rank (0 for a merged file) and pg_config lists every group.
 * Threads (tids) of a rank, each named with M events and sorted in this order:
 *   "steps"        ProfilerStep#N slices (MS_EV_STEP)
 *   "pipeline"     pipeline actions (MS_EV_PIPE), cat "pipeline", named by action and
 *                  micro-batch ("F3", "B3", "W3"; "F3.1" with the local chunk when there are
 *                  virtual stages), args {action, stage, micro-batch, chunk, model chunk, stages,
 *                  virtual stages, micro-batches, schedule}: every ms_ev_pipe field
 *   "compute"      operators (MS_EV_OP), data loading (MS_EV_DATA), optimizer (MS_EV_OPTIM)
 *   "reshard"      reshards, args {tensor, from, to, bytes, steps}
 *   "comm: <name>" collectives, one thread per communicator group (a mesh dim's stream),
 *                  args in Kineto's names ("Collective name", "In msg nelems", "Out msg nelems",
 *                  "Group size", "dtype", "Process Group Ranks", "Process Group Name") plus
 *                  "bytes", "seq", "algorithm", "mesh dim", "reduce", "group id", ...
 * Memory is a counter (ph "C", name "memory", args {in_use_MiB, peak_MiB}) per rank.
 * Each reshard is linked to each of its collectives (same rank, same ms_ev_reshard.flow) by a
 * flow: ph "s" on the reshard's thread at its start, ph "f" with "bp": "e" on the collective's
 * thread at the collective's start, one flow id per pair (cat "reshard").
 *
 * No two X events on one (pid, tid) overlap at all, not even by nesting: an event that would
 * overlap the previous one on its thread goes to an extra thread of the same kind
 * ("compute #2", "comm: tp #2"). (The validator, trace_check.h, allows full containment, which
 * the format permits; partial overlap is what viewers drop or misdraw.)
 *
 * Times: ts and dur are microseconds relative to baseTimeNanoseconds, written as an integer
 * plus up to 3 decimals, i.e. exact nanoseconds: reading the file back (trace_read.h) gives
 * the same t0_ns and t1_ns. Every field of every event is in its args, so the round trip is
 * exact except for what a counter cannot carry (see trace_read.h: a memory event's step).
 *
 * Writing streams events through a 1 MiB buffer (never the whole JSON in memory) into a
 * temporary file next to `path`, then fsync and rename (engine/io/fileio.h): a failure leaves
 * an existing `path` untouched and returns MS_ERR_IO naming it. Speed: a million events
 * (about 250 MB of JSON) export in about 0.6-0.9 s on a 2-core VM (tests/test_traces.c prints
 * the figure); about 40 bytes of index per event are allocated for the duration of the call.
 */
#ifndef MS_TRACE_WRITE_H
#define MS_TRACE_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/event.h"

/* One accelerator as Kineto's deviceProperties lists it. */
typedef struct ms_trace_device {
    int id;
    const char *name;                 /* "NVIDIA H200", "cpu" */
    uint64_t total_mem;               /* bytes; 0 if unknown */
    int compute_major, compute_minor; /* 0 for CPUs */
} ms_trace_device;

/* Header fields. Every member may be zero/NULL: the defaults are said per field. */
typedef struct ms_trace_meta {
    const char *backend; /* distributedInfo.backend: "threads", "mpi", "nccl"; NULL: "threads" */
    int rank;            /* distributedInfo.rank: the writing rank, 0 for a merged file */
    int world_size;      /* 0: one more than the largest rank among the events */
    bool has_base;       /* false: the base time is the earliest event's t0 */
    int64_t base_ns;     /* baseTimeNanoseconds when has_base (events may not precede it
                            by more than 2^63 ns, i.e. any real value works) */
    const ms_trace_device *devices; /* deviceProperties; NULL/0: [] */
    int n_devices;
} ms_trace_meta;

/* Writes events (any order, any ranks) and the groups they refer to (by ms_ev_coll.group;
 * a group id not in the table is shown as "group N") to `path`. meta may be NULL. Borrowed
 * arguments, nothing kept. MS_ERR_INVALID for bad arguments (NULL path, n_groups < 0,
 * an event kind out of range), MS_ERR_IO (naming the path) for file-system failures,
 * MS_ERR_NOMEM if the index arrays (about 40 bytes per event) cannot be allocated. */
ms_status ms_trace_write(const char *path, const ms_event *ev, size_t n, const ms_group *groups,
                         int n_groups, const ms_trace_meta *meta, ms_error *err);

/* "forward", "backward", "other" (the args' "phase"); ms_trace_phase_parse is its inverse
 * (-1 when unknown). */
const char *ms_trace_phase_name(int phase);
int ms_trace_phase_parse(const char *s);

/* "F", "B", "W" (a pipeline slice's args "action"; "?" out of range);
 * ms_trace_pipe_action_parse is its inverse (-1 when unknown). */
const char *ms_trace_pipe_action_name(int action);
int ms_trace_pipe_action_parse(const char *s);
/* "enqueue", "host", "gpu" (an NCCL slice's args "timing": which clock placed it; out of range:
 * "enqueue"); ms_trace_nccl_timing_parse is its inverse (-1 when unknown). */
const char *ms_trace_nccl_timing_name(int timing);
int ms_trace_nccl_timing_parse(const char *s);
/* A pipeline slice's name: "F3" (action, micro-batch), "F3.1" (and the local chunk) when the
 * schedule has virtual stages. */
void ms_trace_pipe_name(const ms_ev_pipe *p, char *out, size_t cap);

#endif

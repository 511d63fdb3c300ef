/* nccl_lane.h - NCCL's own view of a traced job's collectives: meshscope's NCCL profiler
 * plugin (profiler/nccl_profiler.h) loaded into the run, drained into the ranks' rings as
 * MS_EV_NCCL events, and linked at the end to meshscope's MS_EV_COLL for the same call. The
 * trace shows them on a thread "NCCL (plugin)" per rank (traces/trace_write.h).
 *
 * Loading. meshscope_core never links the plugin: NCCL loads it from the path in
 * NCCL_PROFILER_PLUGIN, and meshscope dlopen()s the same path, which gives the copy NCCL has
 * (or will get: the loader keeps one copy per file), so both see one buffer. The path:
 *   1. NCCL_PROFILER_PLUGIN when the user set it (respected as is; "none" turns NCCL's
 *      plugin, and with it this lane, off). A path or a file name ending in .so is
 *      taken as is; NCCL reads a bare name as libnccl-profiler-NAME.so on the loader path,
 *      and so does ms_nccl_plugin_resolve.
 *   2. else libnccl-profiler-meshscope.so next to the executable (the build directory, where
 *      CMake puts both), then in ../lib beside the executable's directory (an installed
 *      layout: bin/meshscope, lib/libnccl-profiler-meshscope.so); the first that exists is
 *      put into NCCL_PROFILER_PLUGIN, as a full path.
 * NCCL reads the variable when the first communicator of the process initialises, so the
 * lane is opened before any (tracer_open runs before the trainer makes its communicators).
 * When the plugin cannot be found or loaded, the lane says so once per process on stderr and
 * the run traces without it.
 *
 * Linking (ms_nccl_lane_link, rank 0 at the end of the run). NCCL's communicator id (a hash
 * of its unique id) and its seqNumber (counted per function) name nothing meshscope knows,
 * and meshscope's seq counts every call on its communicator (host-staged ones included), so
 * neither pair can be computed from the other. The link is made where the call is: the NCCL
 * call is made inside meshscope's call on the same host clock, so an NCCL record belongs to
 * the MS_EV_COLL of the same collective kind (send/recv: p2p, or an all-gather/all-to-all
 * that meshscope runs as sends and receives), on a rank of the same process, with group size
 * = NCCL's nranks and group rank = NCCL's rank (p2p: any), whose [t0, t1] contains the
 * record's host start; the innermost such event wins. A record with several candidates on
 * different (group, rank) pairs (threads ranks making the same call at once) is decided by
 * what the unambiguous records taught: each (comm id, comm rank) is one world rank. The linked
 * record takes its event's rank and step, and carries its group and seq (args "ms group id", "ms
 * seq"); a record nothing contains is kept with linked = 0, on the rank its communicator was seen
 * on (else the draining rank), step -1.
 *
 * GPU time. A GPU-timed record (timing "gpu") has its kernel's start and end on the GPU
 * globaltimer, another clock than the host's. CUPTI's collector (profiler/cupti.h) maps its
 * timestamps with one offset per process, measured and re-adopted only on drift; the lane
 * does the same per GPU, one offset per (communicator id, comm rank) for the whole run, from
 * bounds the records themselves give: the host saw each kernel end no earlier than it did
 * (offset <= host end - GPU end) and NCCL started enqueueing before the kernel started
 * (offset >= host start - GPU start). The offset is the tightest upper bound (the minimum of
 * host end - GPU end), so every placed span ends no later than the host saw it end and starts
 * no earlier than the truth; the gap to the lower bound is reported as the uncertainty. The
 * event's t0..t1 becomes [GPU start, GPU end] + offset (never before the host start) and the
 * host span stays in host_t0/host_t1. Records timed "host" or "enqueue" keep their host span.
 */
#ifndef MS_NCCL_LANE_H
#define MS_NCCL_LANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "profiler/nccl_profiler.h"
#include "engine/core/event.h"
#include "profiler/record/recorder.h"

#define MS_NCCL_PLUGIN_FILE "libnccl-profiler-meshscope.so"

/* Where the plugin is (see "Loading"): env_value is NCCL_PROFILER_PLUGIN (NULL or "" when
 * unset), exe_path the running executable. Writes the path to dlopen into out; *from_env
 * says whether it is the user's. False, with a one-line reason in why, when there is none
 * ("none", or no file in the places looked at). */
bool ms_nccl_plugin_resolve(const char *env_value, const char *exe_path, char *out, size_t cap,
                            bool *from_env, char *why, size_t why_cap);

/* Process-wide and once (later calls return the first answer): resolves with exe_path (NULL:
 * /proc/self/exe), sets NCCL_PROFILER_PLUGIN when the user did not, dlopens the plugin and
 * looks up its drain. True when the lane can drain; else one line on stderr. Any thread. */
bool ms_nccl_lane_open(const char *exe_path);
/* The path opened ("" before a successful ms_nccl_lane_open). */
const char *ms_nccl_lane_path(void);

typedef struct ms_nccl_lane_counts {
    uint64_t events;    /* MS_EV_NCCL events pushed */
    uint64_t proxy_ops; /* proxy operations drained (counted, not traced) */
} ms_nccl_lane_counts;

/* The pure conversion of a plugin record into an MS_EV_NCCL event stamped with rank (the
 * draining rank) and step -1. coll: the ms_coll_kind of its function (ms_nccl_coll_kind), -1
 * if none. False for records that are not calls (proxy operations). */
bool ms_nccl_lane_event(const ms_nccl_record *r, int32_t rank, int coll, ms_event *out);

/* Moves everything the plugin holds into rec (its writer thread only) as MS_EV_NCCL events of
 * `rank`; adds to counts. No-op without an open lane. Returns the events pushed. */
size_t ms_nccl_lane_drain(ms_recorder *rec, int32_t rank, ms_nccl_lane_counts *counts);

typedef struct ms_nccl_link_stats {
    size_t linked, unlinked;    /* MS_EV_NCCL events with and without a meshscope event */
    size_t gpu_placed;          /* moved onto their GPU span */
    int64_t gpu_uncertainty_ns; /* the widest offset bracket among the GPUs; 0 if none */
} ms_nccl_link_stats;

/* Rank 0, over every gathered event (ranks and clocks as gathered): links each MS_EV_NCCL to
 * its MS_EV_COLL and places GPU-timed ones (see above). one_process: every rank ran in this
 * process (threads backend); else a record only links to its draining rank's events.
 * Returns -1 (ev untouched) when out of memory. */
int ms_nccl_lane_link(ms_event *ev, size_t n, bool one_process, ms_nccl_link_stats *st);

#endif

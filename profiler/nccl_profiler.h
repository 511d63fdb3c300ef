/* nccl_profiler.h - meshscope's NCCL profiler plugin (NCCL >= 2.23 loads it by name) and the
 * meshscope side of it: a process-wide buffer of NCCL collective, point-to-point and proxy
 * records, drained as ms_event (MS_EV_COLL) or as raw records.
 *
 * Loading. The plugin is the shared library libnccl-profiler-meshscope.so (CMake target
 * meshscope-nccl-profiler). NCCL loads it when NCCL_PROFILER_PLUGIN=meshscope (the library
 * must be on the loader path) or NCCL_PROFILER_PLUGIN=/full/path/libnccl-profiler-meshscope.so,
 * and looks up the versioned struct ncclProfiler_v5 (the newest the installed NCCL 2.28
 * asks for). The library state is process-wide, so meshscope reaches the same buffer by
 * dlopen()ing the same path (the loader returns the already-loaded copy) and dlsym()ing
 * ms_nccl_profiler_drain, or by linking the library directly. It does not link
 * meshscope_core: a plugin must not drag an engine into every NCCL program. `train --trace`
 * does the dlopen side (profiler/nccl_lane.h: where the library is looked for, the lane it
 * feeds).
 *
 * Events NCCL delivers and what becomes of them (activation mask Coll | P2p | KernelCh, plus
 * ProxyOp unless MS_NCCL_PROFILER_PROXY=0 is set in the environment):
 *   Coll      one record per collective: seqNumber, func, count, datatype, algo, proto.
 *   P2p       one record per ncclSend / ncclRecv, with the peer and count.
 *   KernelCh  never recorded on its own: one per channel the collective's kernel ran on;
 *             their GPU timers and their stop times complete the parent's record.
 *   ProxyOp   one record per proxy operation (network progress of one channel towards one
 *             peer): peer, channel, send or receive, steps, chunk size.
 *
 * Timestamps. A collective's stopEvent means "enqueued", not "completed": NCCL calls it once
 * the work is queued on the stream. So every Coll/P2p record carries three host times
 * (CLOCK_MONOTONIC, the ms_now_ns clock): t_start_ns (NCCL began enqueueing), t_enqueued_ns
 * (stopEvent) and t_end_ns, and says in `timing` which kind of end it is:
 *   MS_NCCL_T_GPU      the kernel's channels reported GPU start/stop timers: gpu_start_ns /
 *                      gpu_end_ns (the GPU globaltimer, a different clock) give the exact GPU
 *                      duration, and t_end_ns is when the proxy thread saw the last channel
 *                      finish (an upper bound on the real end, late by its polling delay).
 *   MS_NCCL_T_HOST     channels finished but without GPU timers: t_end_ns as above.
 *   MS_NCCL_T_ENQUEUE  no channel events (none were delivered, e.g. graph-captured or
 *                      copy-engine work): t_end_ns == t_enqueued_ns, and the span only
 *                      measures enqueueing - never read it as a transfer time.
 * ProxyOp records: [t_start_ns, t_end_ns] is the proxy thread's start/stop of the operation.
 *
 * Threads: NCCL calls the plugin from the application's threads and its proxy threads; the
 * buffer is a bounded multi-producer queue that never blocks them (when full, records are
 * dropped and counted). Drains may run on any thread, concurrently with NCCL.
 */
#ifndef MS_NCCL_PROFILER_H
#define MS_NCCL_PROFILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine/core/event.h"

/* --- meshscope's side ---------------------------------------------------------------- */

typedef enum ms_nccl_rec_kind {
    MS_NCCL_COLL,     /* a collective */
    MS_NCCL_P2P,      /* an ncclSend or ncclRecv (is_send says which) */
    MS_NCCL_PROXY_OP, /* network progress of one channel towards one peer */
} ms_nccl_rec_kind;

typedef enum ms_nccl_timing {
    MS_NCCL_T_ENQUEUE, /* t_end_ns is the enqueue; completion unknown */
    MS_NCCL_T_HOST,    /* t_end_ns is when completion was observed on the host */
    MS_NCCL_T_GPU,     /* as HOST, and gpu_start_ns/gpu_end_ns give the GPU duration */
} ms_nccl_timing;

/* One NCCL event as the plugin saw it: a description independent of NCCL's struct layout
 * (strings copied, truncated), so that it can be built by hand in tests and kept. */
typedef struct ms_nccl_record {
    uint8_t kind;       /* ms_nccl_rec_kind */
    uint8_t timing;     /* ms_nccl_timing */
    uint8_t is_send;    /* P2P, PROXY_OP */
    uint8_t remote;     /* PROXY_OP: issued for another process (PXN); parent fields unset */
    int32_t rank;       /* this rank in the communicator */
    int32_t nranks;     /* communicator size */
    int32_t peer;       /* P2P, PROXY_OP: the remote rank in the communicator; COLL: the root */
    uint64_t comm_id;   /* NCCL's communicator id (from init), the same on every member */
    uint64_t seq;       /* COLL: seqNumber, per communicator and function; PROXY_OP: the
                         * parent collective's, when known; else 0 */
    uint64_t count;     /* elements, as passed to NCCL (AllGather: per rank; ReduceScatter:
                         * received per rank) */
    int32_t n_channels; /* COLL, P2P: channels used; PROXY_OP: its channel id */
    int32_t n_steps;    /* PROXY_OP */
    int32_t chunk_size; /* PROXY_OP: bytes per step as NCCL reports it */
    int32_t pid;        /* PROXY_OP: the process that issued it */
    int64_t t_start_ns, t_enqueued_ns, t_end_ns; /* host, CLOCK_MONOTONIC; see above */
    uint64_t gpu_start_ns, gpu_end_ns;           /* MS_NCCL_T_GPU only: GPU globaltimer */
    char func[16];                               /* "AllReduce", "Send", ... (NCCL's names) */
    char datatype[16];                           /* "ncclFloat32", ... */
    char algo[16];                               /* "RING", "TREE", "NVLS", ... */
    char proto[8];                               /* "LL", "LL128", "Simple" */
} ms_nccl_record;

/* Bytes per element of an NCCL datatype name ("ncclFloat32" -> 4); 0 when unknown. */
size_t ms_nccl_type_size(const char *datatype);

/* The ms_coll_kind of an NCCL function name ("AllReduce" -> MS_COLL_ALL_REDUCE; "Send" and
 * "Recv" -> MS_COLL_P2P), or -1 when meshscope has no such kind (Reduce, Gather, ...). */
int ms_nccl_coll_kind(const char *func);

/* The pure conversion, record -> MS_EV_COLL. Returns false (out untouched) for records that
 * are not events of their own: Recv (the sender's rank reports a transfer, as in hooks.c, so
 * that heatmaps count it once), ProxyOp (progress of an event already reported), and
 * functions without an ms_coll_kind.
 *   bytes: the nccl-tests convention of comm.h (AllReduce, Broadcast: count; AllGather:
 *          total gathered; ReduceScatter: total input; AlltoAll: total sent; Send: count),
 *          times the type size; 0 when the type is unknown.
 *   t0/t1: MS_NCCL_T_GPU: [t_end - GPU duration, t_end] (the GPU's own duration, placed at
 *          the observed end and never before t_start); HOST: [t_start, t_end]; ENQUEUE:
 *          [t_start, t_enqueued].
 *   group: -1 (the plugin knows NCCL's communicator id, not meshscope's group table: the
 *          drainer maps comm_id to a group); group_size/group_rank: nranks/rank for a
 *          collective, 2/0 for a send (the {sender, receiver} pair of hooks.c); mesh_dim -1;
 *          reduce: MS_REDUCE_SUM (NCCL's v5 descriptor does not carry the operation).
 *   algo:  "ring/ll128" (NCCL's algorithm and protocol, lower case, truncated); "send". */
bool ms_nccl_record_to_event(const ms_nccl_record *r, ms_event *out);

/* Moves up to max records, oldest first, out of the process-wide buffer. Any thread. */
size_t ms_nccl_profiler_drain_records(ms_nccl_record *out, size_t max);

/* Moves records out and converts them (ms_nccl_record_to_event); records that convert to
 * nothing are consumed and skipped. Returns the number of events written. Any thread. */
size_t ms_nccl_profiler_drain(ms_event *out, size_t max);

typedef struct ms_nccl_profiler_stats {
    uint64_t recorded;      /* records put in the buffer */
    uint64_t dropped_full;  /* records lost because the buffer was full */
    uint64_t dropped_pool;  /* events NCCL started while every tracking slot was busy */
    uint64_t flushed_early; /* collectives finished at finalize, before all channels ended */
    uint64_t comms;         /* communicators currently initialised */
} ms_nccl_profiler_stats;

void ms_nccl_profiler_get_stats(ms_nccl_profiler_stats *out);

/* --- NCCL's profiler ABI, version 5 -------------------------------------------------------
 * NCCL does not install its ext-profiler headers, so the v5 interface is declared here from
 * NCCL's plugin documentation. Enums travel as int (what NCCL's enums are on every ABI NCCL
 * supports); the names carry an ms_ prefix so that they never clash with NCCL's own headers
 * if a translation unit includes both. */

enum {
    MS_NCCL_PROFILE_GROUP = 1 << 0,
    MS_NCCL_PROFILE_COLL = 1 << 1,
    MS_NCCL_PROFILE_P2P = 1 << 2,
    MS_NCCL_PROFILE_PROXY_OP = 1 << 3,
    MS_NCCL_PROFILE_PROXY_STEP = 1 << 4,
    MS_NCCL_PROFILE_PROXY_CTRL = 1 << 5,
    MS_NCCL_PROFILE_KERNEL_CH = 1 << 6,
    MS_NCCL_PROFILE_NET_PLUGIN = 1 << 7,
    MS_NCCL_PROFILE_GROUP_API = 1 << 8,
    MS_NCCL_PROFILE_COLL_API = 1 << 9,
    MS_NCCL_PROFILE_P2P_API = 1 << 10,
    MS_NCCL_PROFILE_KERNEL_LAUNCH = 1 << 11,
};

/* The event states this plugin acts on (ncclProfilerEventState_t values). */
enum { MS_NCCL_STATE_KERNEL_CH_STOP = 22 };

typedef void (*ms_nccl_logger_t)(int level, unsigned long flags, const char *file, int line,
                                 const char *fmt, ...);

typedef struct ms_nccl_event_descr_v5 {
    uint64_t type;   /* one MS_NCCL_PROFILE_* bit */
    void *parentObj; /* the handle this plugin returned for the parent event, or NULL */
    int rank;
    union {
        struct {
            bool graphCaptured;
            int groupDepth;
        } groupApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            int root;
            void *stream;
            bool graphCaptured;
        } collApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            void *stream;
            bool graphCaptured;
        } p2pApi;
        struct {
            void *stream;
        } kernelLaunch;
        struct {
            uint64_t seqNumber;
            const char *func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
            void *parentGroup;
        } coll;
        struct {
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
            uint8_t nChannels;
            void *parentGroup;
        } p2p;
        struct {
            pid_t pid;
            uint8_t channelId;
            int peer;
            int nSteps;
            int chunkSize;
            int isSend;
        } proxyOp;
        struct {
            int step;
        } proxyStep;
        struct {
            uint8_t channelId;
            uint64_t pTimer; /* GPU globaltimer at the channel's start */
        } kernelCh;
        struct {
            int64_t id;
            void *data;
        } netPlugin;
    };
} ms_nccl_event_descr_v5;

typedef union ms_nccl_state_args_v5 {
    struct {
        size_t transSize;
    } proxyStep;
    struct {
        int appendedProxyOps;
    } proxyCtrl;
    struct {
        void *data;
    } netPlugin;
    struct {
        uint64_t pTimer; /* GPU globaltimer at the channel's stop */
    } kernelCh;
} ms_nccl_state_args_v5;

/* Return values are ncclResult_t: 0 (ncclSuccess); init may return 3 (ncclInternalError) to
 * make NCCL disable the plugin. */
typedef struct ms_nccl_profiler_v5 {
    const char *name;
    int (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName,
                int nNodes, int nranks, int rank, ms_nccl_logger_t logfn);
    int (*startEvent)(void *context, void **eHandle, ms_nccl_event_descr_v5 *eDescr);
    int (*stopEvent)(void *eHandle);
    int (*recordEventState)(void *eHandle, int eState, ms_nccl_state_args_v5 *eStateArgs);
    int (*finalize)(void *context);
} ms_nccl_profiler_v5;

/* The symbol NCCL looks up (dlsym "ncclProfiler_v5"). */
extern const ms_nccl_profiler_v5 ncclProfiler_v5;

#endif

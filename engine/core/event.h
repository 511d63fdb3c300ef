/* event.h - what the engine emits while it runs: one fixed-size event format, the same in
 * memory, on the wire (MPI gather) and, field for field, in the trace file's args.
 *
 * The engine hands events to its rank's sink (engine/core/trace_sink.h); the recorder behind
 * it (profiler/record/recorder.h) keeps them, and analysis (profiler/analysis.h) and the trace
 * writer (traces/) read them. Times are monotonic
 * nanoseconds (ms_now_ns); under MPI they are shifted to rank 0's clock when gathered.
 *
 * Strings are fixed-size, NUL-terminated and truncated: the hot path never allocates.
 */
#ifndef MS_EVENT_H
#define MS_EVENT_H

#include <stdint.h>
#include <string.h>

#define MS_EV_NAME_MAX  48
#define MS_EV_PL_MAX    40 /* placement text, "[S(0), R, P(sum)]" */
#define MS_EV_GROUP_MAX 64 /* ranks listed per communicator group */

typedef enum ms_ev_kind {
    MS_EV_STEP,    /* a training step: ProfilerStep#N */
    MS_EV_OP,      /* an operator's local kernel (compute) */
    MS_EV_COLL,    /* a collective or point-to-point batch on a communicator */
    MS_EV_RESHARD, /* a reshard: source -> target placements, plan steps, bytes */
    MS_EV_MEM,     /* memory in use and peak on the rank's device (an instant) */
    MS_EV_DATA,    /* data loading */
    MS_EV_OPTIM,   /* the optimizer update */
    MS_EV_PIPE,    /* a pipeline action: one micro-batch's F, B or W on one model chunk */
    MS_EV_NCCL,    /* NCCL's own view of a collective or send/recv (its profiler plugin) */
    MS_EV_KIND_COUNT
} ms_ev_kind;

typedef enum ms_ev_phase { MS_PHASE_FORWARD, MS_PHASE_BACKWARD, MS_PHASE_OTHER } ms_ev_phase;

/* GPU activity (from CUPTI) is recorded as ops too, marked by kind. */
typedef enum ms_ev_gpu {
    MS_GPU_NONE,   /* an engine operator (or data, optimizer) on the rank's thread */
    MS_GPU_KERNEL, /* a kernel on a GPU stream */
    MS_GPU_MEMCPY, /* a copy on a GPU stream */
    MS_GPU_MEMSET, /* a memset on a GPU stream */
    MS_GPU_API,    /* a CUDA runtime or driver call, or a synchronisation, on a host thread */
} ms_ev_gpu;

typedef struct ms_ev_op {
    int32_t op;                /* ms_op_kind or a registered op id; -1 for GPU activity */
    char name[MS_EV_NAME_MAX]; /* node name, e.g. "h.0.attn.c_attn.mm"; a kernel's name */
    char opname[24];           /* "matmul"; "cuda_kernel", "cuda_memcpy", ... */
    double flops, bytes;       /* from the op's cost function, this rank's local work */
    /* Correlation: an engine op that launched GPU work carries the id it bracketed that work
     * with (ms_trace_state.gpu_push); the GPU activity carries the same id. 0: none. The id's
     * top bits are the launching rank (MS_EV_CORR_RANK). */
    uint64_t corr;
    uint8_t gpu;             /* ms_ev_gpu */
    uint8_t host_optim;      /* MS_EV_OPTIM: ran on the rank's host optimizer thread (offload) */
    uint32_t device, stream; /* GPU activity on a stream: the CUDA device and stream ids */
} ms_ev_op;

/* Correlation ids are (rank << 40) | a per-rank counter, so GPU activity can be attributed to
 * the rank whose operator launched it even when ranks share a GPU and a collector. */
#define MS_EV_CORR_RANK(id) ((int32_t)((id) >> 40))

typedef struct ms_ev_coll {
    uint8_t coll;     /* ms_coll_kind */
    uint8_t reduce;   /* ms_reduce_op */
    int16_t mesh_dim; /* -1: not a mesh dim communicator (world, custom) */
    int32_t group;    /* id of the communicator group (ms_group_table) */
    int32_t group_size;
    int32_t group_rank; /* this rank's position in the group */
    int64_t seq;        /* the communicator's sequence number */
    uint64_t bytes;     /* nccl-tests size convention (comm.h) */
    uint8_t dtype;      /* ms_comm_dtype: f32, bf16 or bytes */
    char algo[16];      /* "shm-direct", "mpi", "ring", ... */
    uint64_t flow;      /* id of the reshard it belongs to, 0 if none */
    int32_t root;       /* broadcast: the root's position in the group; else unused */
    uint8_t recv;       /* p2p: this rank's side receives ("recv"): it shows the wait, and the
                         * sender's event alone counts the traffic */
    /* Non-blocking calls (ms_iall_reduce, ...): t0..t1 is the collective's real span, and
     * queued_ns how long it waited in its communicator's queue after it was issued (issued at
     * t0 - queued_ns); async is 0 and queued_ns 0 for blocking calls. */
    uint8_t async;
    int64_t queued_ns;
} ms_ev_coll;

typedef struct ms_ev_reshard {
    char tensor[MS_EV_NAME_MAX];
    char from[MS_EV_PL_MAX], to[MS_EV_PL_MAX];
    int32_t nsteps;
    uint64_t bytes; /* collective sizes summed over its steps, this rank */
    uint64_t flow;  /* links the reshard to its collectives */
} ms_ev_reshard;

typedef struct ms_ev_mem {
    uint64_t in_use, peak;
    /* what the training state holds of in_use: parameters, gradients, optimizer state and
     * activations (the micro-batch arenas); all 0 when the sample has no split */
    uint64_t params, grads, optim, acts;
    /* offload: the optimizer's host memory (masters, moments, staged gradients), not in in_use */
    uint64_t host_optim;
} ms_ev_mem;

/* A pipeline action. Its kernels and transfers are recorded too, inside or next to its span;
 * the time between a stage's actions in a step is its bubble. */
typedef enum ms_ev_pipe_action { MS_PIPE_F, MS_PIPE_B, MS_PIPE_W } ms_ev_pipe_action;
typedef struct ms_ev_pipe {
    uint8_t action;      /* ms_ev_pipe_action */
    uint8_t chunk;       /* local chunk (virtual stage) 0..virtual_stages-1 */
    int16_t stage;       /* pipeline stage (pp rank) 0..stages-1 */
    int32_t mb;          /* micro-batch 0..micro_batches-1 */
    int32_t model_chunk; /* chunk * stages + stage */
    int16_t stages, virtual_stages;
    int32_t micro_batches;
    char schedule[12]; /* "1f1b", "gpipe", "interleaved", "zb-h1" */
    /* The rank thread's CPU time inside the action; 0: not measured. Below the span's length
     * by the time the thread waited for a core (or for its kernels' other threads). */
    int64_t cpu_ns;
} ms_ev_pipe;

/* A collective or point-to-point call as NCCL's profiler plugin saw it (profiler/nccl_lane.h).
 * t0..t1 is the host span as drained (start of NCCL's enqueue to the end it observed); rank 0
 * later links it to meshscope's own MS_EV_COLL for the same call and, for GPU-timed records,
 * moves t0..t1 onto the GPU's span (host_t0/host_t1 then keep the host span). */
typedef struct ms_ev_nccl {
    uint64_t comm_id;         /* NCCL's communicator id (commHash), the same on every member */
    uint64_t seq;             /* NCCL's seqNumber (per communicator and function); p2p: 0 */
    uint64_t count;           /* elements as passed to NCCL */
    uint64_t gpu_t0, gpu_t1;  /* timing GPU: the kernel's channels on the GPU globaltimer */
    int64_t enqueued_ns;      /* NCCL's stopEvent (work enqueued), relative to the host start */
    int64_t host_t0, host_t1; /* the host span once t0..t1 holds the GPU's; else 0 */
    int64_t ms_seq;           /* the linked MS_EV_COLL's seq; -1: not linked */
    int32_t ms_group;         /* the linked MS_EV_COLL's group; -1: not linked */
    int32_t comm_rank, nranks;
    int32_t peer;     /* send/recv: the remote rank in the communicator; collectives: root */
    int16_t channels; /* channels NCCL announced */
    uint8_t p2p;      /* 1: ncclSend/ncclRecv (is_send says which) */
    uint8_t is_send;
    uint8_t timing; /* 0 enqueue, 1 host, 2 gpu (ms_nccl_timing) */
    uint8_t linked; /* 1: ms_group/ms_seq name meshscope's event for this call */
    uint8_t coll;   /* the ms_coll_kind NCCL's function is (Send/Recv: p2p); 255: none */
    char func[16];  /* "AllReduce", "Send", ... */
    char dtype[16]; /* "ncclFloat32", ... */
    char algo[16];  /* "RING", "TREE", "COLLNET_DIRECT", ... */
    char proto[8];  /* "LL", "LL128", "Simple" */
} ms_ev_nccl;

typedef struct ms_event {
    uint8_t kind;  /* ms_ev_kind */
    uint8_t phase; /* ms_ev_phase */
    uint16_t pad;
    int32_t rank;         /* world rank */
    int64_t step;         /* training step, -1 outside steps */
    int64_t t0_ns, t1_ns; /* [t0, t1); t0 == t1 for instants */
    union {
        ms_ev_op op;
        ms_ev_coll coll;
        ms_ev_reshard reshard;
        ms_ev_mem mem;
        ms_ev_pipe pipe;
        ms_ev_nccl nccl;
    } u;
} ms_event;

/* A communicator group as it appears in traces (Kineto's pg_config). */
typedef struct ms_group {
    int32_t id;
    char name[16]; /* mesh dim name, "world", ... */
    int32_t size;
    int32_t ranks[MS_EV_GROUP_MAX]; /* world ranks, first MS_EV_GROUP_MAX */
} ms_group;

/* Copies src into a fixed-size event string, truncating (events never allocate). */
static inline void ms_ev_strcpy(char *dst, size_t cap, const char *prefix, const char *src) {
    size_t n = 0;
    for (; prefix && *prefix && n + 1 < cap; prefix++) dst[n++] = *prefix;
    for (; src && *src && n + 1 < cap; src++) dst[n++] = *src;
    dst[n] = '\0';
}

#endif

/* cluster.h - what the planner knows about the machines: a cluster description.
 *
 * A cluster is a set of identical devices, `devices_per_node` to a node, with a compute rate
 * per dtype, a memory size and bandwidth, and two kinds of links: inside a node (NVLink,
 * shared memory) and between nodes (InfiniBand). Descriptions are JSON files
 * (configs/clusters/NAME.json); every figure and its source is listed in docs/planner.md.
 *
 * `cpu-local` is this machine, with the thread ranks of the threads backend as devices. It is
 * not a file: ms_cluster_resolve measures it (the engine's sgemm at a grid of shapes, its
 * attention kernel, the elementwise kernels, AdamW, and the threads backend's collectives at
 * the rank counts the planner uses) and caches the result as JSON under
 * $XDG_CACHE_HOME/meshscope/ (or ~/.cache/meshscope/), keyed by what changes the rates: the
 * CPU model and features, the core count, the BLAS build and kernel, the BLAS thread policy
 * (calib_cache.h, which also keeps a loaded machine's measurement out of the cache).
 *
 * Units inside the struct are SI (FLOP/s, bytes/s, seconds, bytes); the JSON uses TFLOP/s,
 * GB/s (1e9), microseconds and GB (1e9) so that datasheet numbers can be typed as printed.
 */
#ifndef MS_PLAN_CLUSTER_H
#define MS_PLAN_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/core/status.h"

typedef enum ms_plan_dtype { MS_PLAN_FP32, MS_PLAN_BF16, MS_PLAN_DTYPE_COUNT } ms_plan_dtype;

const char *ms_plan_dtype_name(ms_plan_dtype d); /* "fp32", "bf16" */
ms_status ms_plan_dtype_parse(const char *text, ms_plan_dtype *out, ms_error *err);

/* Which collective algorithm the alpha-beta model assumes (see ms_cluster_coll_time). */
typedef enum ms_coll_algo {
    MS_ALGO_AUTO,   /* the faster of ring and tree, as NCCL's tuner picks */
    MS_ALGO_RING,   /* ring: (n-1) or 2(n-1) latency hops, nccl-tests bus bytes */
    MS_ALGO_TREE,   /* double binary tree: 2 log2(n) hops, 2 x bytes for all-reduce */
    MS_ALGO_DIRECT, /* shared memory: one synchronisation, every rank reads its peers */
} ms_coll_algo;

/* A link class: per-device bandwidth in one direction, one-hop latency, and the share of
 * the bandwidth collectives reach (nccl-tests bus bandwidth / link bandwidth). */
typedef struct ms_link {
    double bw;         /* bytes/s per device, one direction */
    double latency;    /* seconds per hop */
    double efficiency; /* 0..1 */
} ms_link;

/* cpu-local measurements. */
#define MS_CLUSTER_MAX_GEMM 128
#define MS_CLUSTER_MAX_ATTN 32
#define MS_CLUSTER_MAX_COLL 64

typedef struct ms_gemm_point {
    int64_t m, n, k;
    double flops_per_s; /* one rank, every core busy */
} ms_gemm_point;

typedef struct ms_attn_point {
    int64_t t, hs;       /* sequence and head size; causal */
    double fwd_s, bwd_s; /* seconds per (batch x head) */
} ms_attn_point;

typedef struct ms_coll_point {
    int ranks, group; /* world ranks running, members per group (ranks / group groups) */
    uint8_t kind;     /* ms_coll_kind */
    double alpha;     /* seconds: the fit's intercept, back-to-back calls on cold buffers */
    double busbw;     /* bytes/s: bus bandwidth of the fit's slope */
} ms_coll_point;

/* Thread ranks that outnumber the cores drift apart while they compute (the scheduler runs
 * them in turns, not always evenly), so a collective they reach from compute waits for the
 * last one. Measured on the engine's own training step (calibrate.c), per rank count. */
#define MS_CLUSTER_MAX_SYNC 8
#define MS_CLUSTER_IN_STEP  3 /* the compute classes below the optimizer (cost.h) */

/* A compute class's time inside a step over its time at the measured rates, against a
 * kernel's bytes (one call, as its cost function counts them): factor[0] at bytes[0] (a small
 * GPT's mean), factor[1] at bytes[1] (a larger one's), interpolated in log(bytes) between and
 * held beyond. */
typedef struct ms_in_step {
    double bytes[2], factor[2];
} ms_in_step;

typedef struct ms_sync_point {
    int ranks;
    double per_call;  /* seconds added to each collective reached from compute */
    double per_byte;  /* seconds added per bus byte of such a collective */
    double per_phase; /* seconds added at each phase boundary of a step (end of forward,
                         start of the gradient reduction, the gradient norm) */
    /* The ranks' compute over its in-step prediction (0 = 1): 1 at the rank count the in-step
     * factors come from; above the cores, ranks lose each other's caches when the scheduler
     * turns them */
    double compute;
} ms_sync_point;

/* Elementwise op classes with a measured rate (bytes as the op's cost function counts
 * them, per second). Anything else uses MS_OPRATE_STREAM. */
typedef enum ms_oprate {
    MS_OPRATE_STREAM, /* add, bias-free copies, reductions: a streaming kernel */
    MS_OPRATE_LAYERNORM,
    MS_OPRATE_GELU,
    MS_OPRATE_BIAS,
    MS_OPRATE_SOFTMAX,
    MS_OPRATE_XENT,
    MS_OPRATE_EMBEDDING,
    MS_OPRATE_DROPOUT,
    MS_OPRATE_ADAMW,  /* bytes = 28 per parameter (p, g, m, v read; p, m, v written) */
    MS_OPRATE_SUMSQ,  /* bytes = 4 per element */
    MS_OPRATE_MEMSET, /* bytes written */
    MS_OPRATE_COUNT
} ms_oprate;

const char *ms_oprate_name(ms_oprate r);

/* How world ranks are dealt to nodes: by-host fills a node before the next (mpirun's default
 * --map-by slot; rank r on node r / devices_per_node), round-robin deals one rank per node in
 * turn (--map-by node; rank r on node r % nodes). */
typedef enum ms_rank_order { MS_RANKS_BY_HOST, MS_RANKS_ROUND_ROBIN } ms_rank_order;

#define MS_CLUSTER_MAX_TILES 4

typedef struct ms_cluster {
    char name[64];
    char device[96];
    char backend[16]; /* "threads" (cpu-local: what the engine runs on) or "nccl" */
    int devices_per_node;
    int nodes;                                   /* nodes available; 0 = as many as asked */
    double peak_flops[MS_PLAN_DTYPE_COUNT];      /* per device, dense */
    double gemm_efficiency[MS_PLAN_DTYPE_COUNT]; /* large-GEMM share of peak */
    double gemm_half_dim; /* eff = gemm_efficiency / (1 + d/m + d/n + d/k) for GEMMs */
    /* Wave quantization (GPUs): a GEMM's output is cut into tiles (rows x cols, one of
     * gemm_tiles, either way round) that run `sms` at a time, so a last, partly filled wave
     * costs a whole one. 0 sms: not modelled. */
    int sms;
    int gemm_tiles[MS_CLUSTER_MAX_TILES][2];
    int n_gemm_tiles;
    double vector_flops; /* non-GEMM arithmetic per device */
    double mem_bytes;    /* per device (cpu-local: the machine's, shared by the ranks) */
    double usable_memory_fraction;
    double mem_bw, mem_efficiency;
    /* ZeRO-Offload's side, per device (engine/plan/cost_offload.c): the device-host link in
     * one direction (PCIe), the host memory's bandwidth and bytes as the devices share them;
     * 0: the defaults there (cpu: the machine's memory; GPUs: PCIe Gen4 x16) */
    double host_link_bw, host_mem_bw, host_mem_bytes;
    double kernel_overhead; /* seconds per kernel call */
    double step_overhead;   /* seconds per step outside kernels (data, launch, logging) */
    ms_link intra, inter;
    ms_rank_order rank_order;
    ms_coll_algo algo;
    double dp_overlap;    /* share of the data-parallel gradient traffic that the schedule
                             hides behind backward compute (0: none, as in this engine) */
    bool flash_attention; /* attention scores are never stored (activation memory) */
    /* Without flash attention: the bytes each attention score moves in the forward [0] and
     * the backward [1] of the stack modelled (an unfused attention writes and reads the
     * score matrix in several kernels); 0: the engine's own attention kernel's traffic. */
    double score_bytes[2];
    bool causal_skip; /* the attention kernel skips masked key blocks (FLOPs) */
    /* ZeRO 3 under full recompute: the stack modelled gathers each parameter a third time per
     * micro-batch, for the backward after the recompute's forward (DeepSpeed's stage-3 hooks
     * release a module's parameters after every forward, the recomputed one included); false:
     * this engine's program, where the recompute's gathered copy serves the backward. */
    bool zero3_recompute_regathers;
    /* cpu-local */
    bool cpu; /* devices are thread ranks sharing `cores` */
    int cores;
    char cpu_model[96];
    char calibrated_at[32];    /* UTC, "2026-12-06T22:10:31Z" */
    char calibration[32];      /* the calibration procedure's version (a stale cache is redone) */
    char calibration_key[512]; /* what the rates depend on (calib_cache.h); a cache is used only
                                  under this machine's key */
    /* Cores' worth of busy CPU on the machine right before and right after the measurement,
     * and the limit in force then; -1: not sampled */
    double busy_before, busy_after, busy_limit;
    double blas_speedup_2; /* sgemm speed with 2 BLAS threads over 1, one rank */
    /* How much slower GEMM [0], attention [1] and the other kernels [2] ran inside a training
     * step than their measured rates say (operands from beyond the core's cache), at two
     * sizes (calibrate.c); unset (0) on GPU presets and caches from before the measurement. */
    ms_in_step in_step[MS_CLUSTER_IN_STEP];
    ms_gemm_point gemm[MS_CLUSTER_MAX_GEMM];
    int n_gemm;
    ms_attn_point attn[MS_CLUSTER_MAX_ATTN];
    int n_attn;
    double oprate[MS_OPRATE_COUNT]; /* bytes/s, one rank, every core busy; 0 = unmeasured */
    ms_coll_point coll[MS_CLUSTER_MAX_COLL];
    int n_coll;
    ms_sync_point sync[MS_CLUSTER_MAX_SYNC];
    int n_sync;
    char notes[512];
} ms_cluster;

/* Parses a description. Errors name the file and the JSON path ("h100.json: $.peak_tflops.bf16:
 * expected a positive number"). Missing optional fields take documented defaults. */
ms_status ms_cluster_from_json(const char *json, size_t len, const char *name, ms_cluster *out,
                               ms_error *err);
ms_status ms_cluster_load(const char *path, ms_cluster *out, ms_error *err);
/* The description as JSON (a malloc'd string the caller frees), measurements included. */
char *ms_cluster_to_json(const ms_cluster *c);

/* A topology over a cluster: hosts, ranks per host, the rank order and the links, as
 * tests/cluster/netns.sh writes it for namespace hosts:
 *   {"hosts": 2, "ranks_per_host": 2, "rank_order": "by-host",
 *    "inter_node": {"bw_gbps": 0.0125, "latency_us": 60, "efficiency": 1},
 *    "intra_node": {...}}   (optional; absent keeps the cluster's)
 * It sets nodes, devices_per_node, rank_order and the links; on cpu-local, collectives of
 * groups that cross hosts are then priced by the inter-host link instead of the measured
 * shared-memory points (see ms_cluster_coll_time). */
ms_status ms_cluster_apply_topology(ms_cluster *c, const char *json, size_t len, const char *name,
                                    ms_error *err);
ms_status ms_cluster_load_topology(const char *path, ms_cluster *c, ms_error *err);

/* The directory of the shipped presets (configs/clusters of the source tree). */
const char *ms_cluster_preset_dir(void);

/* "cpu-local" (cached or measured; recalibrate forces a new measurement), "gpu-local" (this
 * machine's GPUs: ms_cluster_for_gpu of GPU 0's name and memory, as many as answer;
 * MS_ERR_UNSUPPORTED without one), a preset name (configs/clusters/NAME.json) or a path to a
 * JSON file. `log` (a FILE *, may be NULL) gets
 * one line per calibration stage. Errors list the presets. */
ms_status ms_cluster_resolve(const char *what, bool recalibrate, void *log, ms_cluster *out,
                             ms_error *err);

/* The cluster a job on `gpus` local GPUs named gpu_name ("NVIDIA H200"), mem_bytes each, is
 * priced on: the preset of the same GPU model (its device's model token, "H200" of "NVIDIA
 * H200-SXM-141GB (HGX H200)", found in gpu_name), one node of `gpus` devices with the device's
 * own memory. A GPU no preset describes gets the h100 preset's rates with its own memory, and
 * `note` says so (otherwise note is ""). */
ms_status ms_cluster_for_gpu(const char *gpu_name, double mem_bytes, int gpus, ms_cluster *out,
                             char *note, size_t note_len, ms_error *err);

/* Measures this machine as a cpu-local cluster (a few seconds). max_ranks bounds the rank
 * counts whose collectives are measured (2, 4, ... up to it). */
ms_status ms_cluster_calibrate_cpu(int max_ranks, void *log, ms_cluster *out, ms_error *err);

/* The cache file for this machine and key
 * ($XDG_CACHE_HOME/meshscope/cpu-local-<model>-<cores>c-<key hash>.json; calib_cache.c). */
ms_status ms_cluster_cache_path(char *buf, size_t len, ms_error *err);

/* --- rates ----------------------------------------------------------------------------------- */

/* Seconds for one GEMM C[m, n] = A[m, k] B[k, n] (2mnk FLOPs) on one device. On cpu-local the
 * measured grid is interpolated in log space; otherwise peak x efficiency with the size
 * fall-off. `ranks` is the number of thread ranks sharing the cores (cpu-local). */
double ms_cluster_gemm_time(const ms_cluster *c, ms_plan_dtype dt, int64_t m, int64_t n, int64_t k,
                            int ranks);
/* Seconds of the engine's causal attention kernel for bh (batch x local heads) heads. */
double ms_cluster_attention_time(const ms_cluster *c, int64_t bh, int64_t t, int64_t hs,
                                 bool backward, int ranks);
/* Seconds of a memory- or vector-bound kernel moving `bytes` and doing `flops`. */
double ms_cluster_elementwise_time(const ms_cluster *c, ms_oprate cls, double flops, double bytes,
                                   int ranks);
/* How much slower one rank's compute runs because `ranks` thread ranks share the cores
 * (cpu-local: max(1, ranks / cores); 1 elsewhere). */
double ms_cluster_share(const ms_cluster *c, int ranks);

/* The synchronisation costs for `ranks` thread ranks (nearest measured rank count; 0 when
 * none is measured, as on GPU clusters). */
double ms_cluster_sync_call(const ms_cluster *c, int ranks);
double ms_cluster_sync_byte(const ms_cluster *c, int ranks);
double ms_cluster_sync_phase(const ms_cluster *c, int ranks);
/* cpu-local's in-step factor for a kernel of class cls (ms_plan_class; 1 for the optimizer
 * and on clusters without the measurement) moving `bytes` a call. */
double ms_cluster_in_step(const ms_cluster *c, int cls, double bytes);
/* The compute factor of `ranks` thread ranks: the nearest sync point's where they outnumber
 * the cores, 1 otherwise (and on GPU clusters). */
double ms_cluster_sync_compute(const ms_cluster *c, int ranks);

/* Where a mesh dim's group lies. `stride` is the product of the sizes of the mesh dims laid
 * out inside it (the planner orders tp, cp, dp, pp from innermost to outermost); which
 * members share a node follows c->rank_order. A cpu cluster without a topology (one node)
 * never crosses. */
typedef struct ms_group_place {
    int n;        /* members */
    int per_node; /* members on one node */
    bool crosses_nodes;
} ms_group_place;
ms_group_place ms_cluster_group(const ms_cluster *c, int n, int stride);

/* Seconds for one collective of `bytes` (nccl-tests convention: all-reduce the buffer,
 * all-gather the gathered output, reduce-scatter the input, all-to-all what a rank sends,
 * p2p what it sends) on a group placed as g. `world` is the total rank count running
 * (cpu-local looks its measurements up by it). gap_s >= 0: the ranks arrive after gap_s
 * seconds of compute, which on cpu-local adds ms_cluster_sync_call and ms_cluster_sync_byte
 * per bus byte; < 0: they arrive from another collective. A group that crosses nodes is
 * priced by the inter-node link (the slowest it crosses), on cpu-local too, with a ring
 * where shared memory would have read peers directly; it gets its members' share of the
 * node's link, and when ranks that oversubscribe a cpu's cores take turns at it (gap_s >= 0,
 * ranks > cores) the compute gap_s hides under that shared time, down to the group's own
 * transfer on a free link. */
double ms_cluster_coll_time(const ms_cluster *c, ms_coll_kind kind, ms_group_place g, double bytes,
                            int world, double gap_s);

#endif

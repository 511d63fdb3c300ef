/* cost.h - the planner's cost model: step time, throughput and memory of one strategy.
 *
 * A strategy (engine/model/strategy.h) is a mesh dp x tp x pp x cp (+ sp) with a ZeRO stage,
 * activation recompute (full or selective), a precision, micro-batches (size x count) and a
 * pipeline schedule, priced at its own precision. Its estimate comes from a workload: the local
 * kernels one device runs per micro-batch (class, FLOPs, bytes, GEMM shape) and the
 * collectives it joins (kind, mesh dim, group, bytes), priced on a cluster:
 *
 *   compute      per kernel, GEMMs at the cluster's GEMM rate for that shape (measured grid
 *                on cpu-local, peak x efficiency with a small-dimension fall-off on GPUs),
 *                everything else as the slower of its FLOPs and its bytes (roofline)
 *   collectives  alpha-beta per mesh dim with the ring / tree formulas (cluster.h)
 *   step         micro-batches x (one micro-batch on the busiest stage, its tp / cp / pp
 *                communication included: those collectives sit on the critical path), plus
 *                the pipeline bubble: the strategy's schedule (1f1b, gpipe, interleaved over
 *                v virtual stages, zb-h1) run by the pipeline simulator
 *                (engine/pipeline/simulate.h) with that micro-batch's forward, input-gradient
 *                and weight-gradient (the GEMMs' dB) times, so that (pp - 1) / (m + pp - 1) of
 *                1F1B, its 1/v under the interleaved schedule and ZB-H1's (pp - 1)(F + B - W)
 *                come out of the schedules themselves; then the
 *                data-parallel gradient traffic, minus the share
 *                the cluster's schedule hides behind backward (none in this engine); then the
 *                optimizer, the gradient norm and a fixed step overhead
 *   memory       ZeRO formulas (sharding over dp) for parameters, gradients and optimizer
 *                states; activations: every value a layer's forward makes, as this engine
 *                keeps them (the family's description; tp / sp / cp divided, full recompute
 *                keeps only layer inputs, selective drops the attention scores and
 *                recomputes attention), times the most micro-batches any pipeline stage
 *                holds (pp under 1F1B, all of them under GPipe); gradient buckets are not
 *                modelled
 *
 * Two workload sources, one pricing:
 *   engine     every strategy this engine executes (ms_plan_executable: any pp and
 *              micro-batches, ZeRO 0-3, recompute, fp32 or bf16, offload), on a model small
 *              enough to compile here: the engine's own program is compiled (no communicators:
 *              the rank at mesh coordinate 0, over cp the last), every kernel is costed with
 *              its op's cost function, the same one the profiler reports, and every reshard
 *              with the reshard planner's plan; memory is the program's arena, parameters and
 *              gradients as it stores them, plus AdamW's two moments over the optimizer's
 *              shards (ZeRO).
 *              A program's own model (ms_plan_problem.def without `lm`) is priced only so:
 *              its chunks compiled from shapes (ms_pp_chunk_model_def), whatever its size.
 *   analytic   everything else, and every model too large to compile here (GPT-3 175B,
 *              LLaMA-2 7B): the same kernels per layer in closed form, from the model family's
 *              layer description (engine/model/lm_layout.h: GPT-2, BERT, LLaMA), each through
 *              the kernel's own cost function, with the collectives the engine's completion
 *              places for them, so both sources agree where both apply
 *              (tests/test_plan_families.c).
 *
 * FLOPs reported: model FLOPs are the hand count of one forward and backward without
 * recompute, 6 per token per linear weight (layers and head) plus attention's 12 s (heads x
 * head size) per token and layer; for GPT-2 72 B s l h^2 (1 + s/(6h)) + 6 B s h V (see
 * docs/planner.md for how it relates to Narayanan et al.'s formula); hardware FLOPs are what
 * the devices execute (recompute and work replicated over tp included).
 */
#ifndef MS_PLAN_COST_H
#define MS_PLAN_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/model/model.h"
#include "engine/model/strategy.h"
#include "engine/plan/cluster.h"

typedef struct ms_plan_memo ms_plan_memo; /* see ms_plan_memo_create */

/* Mesh dims as the planner reports them. */
typedef enum ms_plan_dim {
    MS_PLAN_DP,
    MS_PLAN_TP,
    MS_PLAN_PP,
    MS_PLAN_CP,
    MS_PLAN_WORLD, /* the gradient-norm all-reduce and other world collectives */
    MS_PLAN_DIM_COUNT
} ms_plan_dim;
const char *ms_plan_dim_name(ms_plan_dim d); /* "dp", "tp", "pp", "cp", "world" */

/* Compute classes the time is broken into (and the advisor rescales). */
typedef enum ms_plan_class {
    MS_PC_GEMM,
    MS_PC_ATTENTION,
    MS_PC_ELEMENTWISE, /* norms, activations, embeddings, loss, copies */
    MS_PC_OPTIMIZER,   /* AdamW, gradient norm, clipping, gradient zeroing */
    MS_PC_COUNT
} ms_plan_class;
const char *ms_plan_class_name(ms_plan_class c);

/* "38.0 MiB": bytes in binary units, for messages. Returns buf. */
char *ms_plan_bytes_str(double bytes, char *buf, size_t len);

typedef struct ms_plan_problem {
    ms_model_config model;
    int devices;
    int global_batch; /* sequences per step */
    int seq;
    ms_plan_dtype dtype;       /* the precision of the strategies the search makes */
    const ms_cluster *cluster; /* borrowed */
    /* Compile the engine's program for executable strategies when the model is small enough
     * (parameters x 4 bytes under 1 GiB); otherwise everything is analytic. */
    bool engine_workloads;
    /* With engine_workloads: compile the engine's program whatever the model's size (a
     * shapes-only compile allocates no tensors; the placement search prices layouts of GPT-3
     * 175B's stages so). */
    bool engine_any_size;
    ms_plan_memo *memo; /* borrowed, may be NULL: compile every time */
    /* The run neither clips the gradient norm nor skips non-finite steps: under offload the
     * host AdamW starts during backward, as each gradient reaches the host. */
    bool no_clip;
    /* The model as a def (engine/model/model.h), or NULL: `model` above. A def with `lm` is
     * that built-in config, priced exactly as `model` is. A def without one (a program's own
     * model) has no closed form: every strategy is priced from its compiled program (the
     * engine workload, whatever engine_workloads says), a step's tokens are its batch rows
     * (seq 1), and `model` is not read. Borrowed. */
    const ms_model_def *def;
    /* Placement rules the engine's program is compiled under (a strategy file's, or the
     * automatic search's candidates, engine/plan/auto_place.h), or NULL: the model's own
     * layout. Workloads compiled under rules are not kept in the memo. Borrowed. */
    const ms_placement_rules *rules;
} ms_plan_problem;

/* The problem's model when it is a def without a built-in config (a program's own model), else
 * NULL: the built-in config `model` (or def->lm) is priced. */
const ms_model_def *ms_plan_user_def(const ms_plan_problem *pb);
/* pb with a def that carries a built-in config turned into that config (def NULL, model =
 * *def->lm), and with a program's own model at seq 1: the form every entry point prices. */
ms_plan_problem ms_plan_problem_resolved(const ms_plan_problem *pb);
/* Checks s against the problem's model and job: ms_strategy_check_def for a program's own
 * model, ms_strategy_check for a built-in config. */
ms_status ms_plan_check(const ms_plan_problem *pb, const ms_strategy *s, ms_error *err);

/* Learned corrections (the advisor's recalibration): each compute class and each mesh dim's
 * collective time is multiplied by its factor; overhead_s is added per step. */
typedef struct ms_plan_scales {
    double compute[MS_PC_COUNT];
    double comm[MS_PLAN_DIM_COUNT];
    double overhead_s;
    /* Multiplies the cluster's phase-boundary synchronisation (sync_s below): the calibration
     * measured it once, as a residual of whole steps, so the advisor takes it down when the
     * job's collectives took less time than it alone would (1: as calibrated). */
    double sync;
    /* The share of bucketed (bucket_mb > 0) data-parallel gradient traffic that runs hidden
     * under the backward, as measured (the trace's dp hidden / dp communication); < 0: not
     * measured, the cluster's dp_overlap applies. */
    double dp_overlap;
} ms_plan_scales;
void ms_plan_scales_identity(ms_plan_scales *s);

typedef struct ms_plan_estimate {
    ms_strategy s;
    char text[MS_STRATEGY_NAME_MAX]; /* ms_strategy_name(&s) */
    bool executable;
    char not_executable[256]; /* why not, when !executable */
    bool fits;
    bool from_engine; /* workload from the engine's compiled program */
    double step_s, tokens_per_s;
    double compute_s[MS_PC_COUNT];          /* per step, on the critical path (bubble excluded) */
    double comm_s[MS_PLAN_DIM_COUNT];       /* exposed per step */
    double comm_total_s[MS_PLAN_DIM_COUNT]; /* before overlap */
    double comm_bytes[MS_PLAN_DIM_COUNT];   /* collective bytes per device per step */
    double bubble_s;                        /* pipeline fill and drain */
    double overhead_s;                      /* fixed per step, synchronisation included */
    double sync_s;            /* of overhead_s: oversubscribed ranks meeting at phase boundaries */
    double mb_coll_calls;     /* collectives reached from compute, per step */
    double mb_coll_bus_bytes; /* their bus bytes (nccl-tests factors applied), per step */
    double model_flops, hw_flops; /* per step, all devices together */
    double model_tflops_per_device, hw_tflops_per_device;
    double mem_params, mem_grads, mem_optim, mem_act, mem_other, mem_total; /* bytes per device */
    double mem_cap;                                                         /* bytes per device */
    /* Offload (engine/plan/cost_offload.c): host bytes per device (fp32 masters, both moments,
     * the staged gradients; mem_optim then counts what stays on the device), the host's share
     * for them, and per step the D2H gradient and H2D parameter copies, the host AdamW and how
     * much of both the backward and the next step's forward hide (all 0 without offload). */
    double mem_host, mem_host_cap;
    double offload_copy_s, offload_host_s, offload_hidden_s;
} ms_plan_estimate;

/* Offload's part of an estimate (cost_offload.c), applied by ms_plan_estimate_one to a
 * strategy with offload after pricing it without: moves the optimizer state's memory to the
 * host, replaces the device AdamW time by the exposed copies and host AdamW. w is the priced
 * workload (internal; engine/plan/workload.h). */
struct ms_plan_workload;
void ms_plan_offload_price(const ms_plan_problem *pb, const ms_strategy *s,
                           struct ms_plan_workload *w, const ms_plan_scales *sc,
                           ms_plan_estimate *out);
/* Offload's device memory for the optimizer (w->mem_optim): the validator's memory cap. */
void ms_plan_offload_memory(const ms_strategy *s, struct ms_plan_workload *w);
/* The device-host link, host memory bandwidth and host bytes per device of cluster c (its
 * host_* fields, or their defaults). */
void ms_plan_host_side(const ms_cluster *c, int devices, double *link_bw, double *mem_bw,
                       double *mem_bytes);

/* The job the problem describes (world = devices), for the validator. */
ms_job_shape ms_plan_job(const ms_plan_problem *pb);

/* Whether this engine runs s on the problem's cluster (thread ranks, and the validator's
 * ms_strategy_validate without a memory cap); if not, why (why may be NULL). */
bool ms_plan_executable(const ms_plan_problem *pb, const ms_strategy *s, char *why, size_t len);

/* Estimates one strategy at its own precision (scales may be NULL: identity). Fails only for
 * invalid strategies (ms_strategy_check) or when the engine's program cannot be compiled. */
ms_status ms_plan_estimate_one(const ms_plan_problem *pb, const ms_strategy *s,
                               const ms_plan_scales *scales, ms_plan_estimate *out, ms_error *err);
/* The same with out->text left empty: a search names only the estimates it keeps (naming
 * every strategy priced took a quarter of its time). */
ms_status ms_plan_estimate_unnamed(const ms_plan_problem *pb, const ms_strategy *s,
                                   const ms_plan_scales *scales, ms_plan_estimate *out,
                                   ms_error *err);

/* --- the pieces, exposed for tests and the advisor ---------------------------------------------
 */

/* Model FLOPs of one step (forward + backward, no recompute): the hand count above, for c's
 * family. */
double ms_plan_model_flops(const ms_model_config *c, double batch, double seq);
/* Narayanan et al. 2021: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recompute, the same
 * with 72 without (their formula as printed; see docs/planner.md). */
double ms_plan_narayanan_flops(const ms_model_config *c, double batch, double seq, bool recompute);
/* Parameters of a GPT-2 (tied head) by Narayanan et al.: 12 l h^2 (1 + 13/(12h) + (V + s)/
 * (12 l h)) with s = n_positions; ms_gpt2_param_count has the final LayerNorm's 2h more. */
double ms_plan_param_count(const ms_model_config *c);

/* ZeRO memory per device for psi parameters over nd data-parallel ranks: parameters,
 * gradients and optimizer states in bytes (mixed precision: 2 + 2 + 12; fp32: 4 + 4 + 8). */
void ms_plan_zero_memory(double psi, int nd, int stage, ms_plan_dtype dt, double *params,
                         double *grads, double *optim);

/* Korthikanti et al. 2022 activation bytes of one transformer layer for a micro-batch of b
 * sequences of s tokens, hidden h, a heads, tensor-parallel t (sp: sequence parallel too),
 * context-parallel c, with 16-bit activations (fp32: twice, masks excluded); recompute keeps
 * only the layer input (2 s b h, / t with sp); flash: no stored attention scores. */
double ms_plan_layer_activation_bytes(double s, double b, double h, double a, int t, bool sp, int c,
                                      bool recompute, bool flash, ms_plan_dtype dt);

/* One collective on a mesh dim of the strategy (the planner's layout: tp innermost, then cp,
 * dp, pp): seconds. */
double ms_plan_coll_time(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_dim dim,
                         ms_coll_kind kind, double bytes, double gap_s);

/* What the engine's compiled program does per step on the rank at mesh coordinate 0 (over cp
 * the last), aggregated by op and phase (for tests and the advisor's per-op comparison). */
typedef struct ms_plan_engine_stats {
    double flops;        /* sum of the op cost functions, forward + backward */
    double op_flops[32]; /* by ms_op_kind */
    int n_reshards;
    double reshard_bytes; /* sum of the plans' collective bytes */
    double local_params;  /* floats */
    double arena_bytes, persist_bytes;
    double scratch_bytes; /* pipelines: the pass-lived buffers' arena, shared (graph.h) */
} ms_plan_engine_stats;
ms_status ms_plan_engine_stats_get(const ms_plan_problem *pb, const ms_strategy *s,
                                   ms_plan_engine_stats *out, ms_error *err);

/* What one workload source makes of a strategy, per step, on the device the estimate prices
 * (the busiest pipeline stage's rank at mesh coordinate 0, the last over cp): the figures the
 * two sources are compared on (tests/test_plan_families.c). */
typedef struct ms_plan_tally {
    double flops; /* its kernels' FLOPs: forward, backward and recompute, every micro-batch */
    double coll_bytes[MS_PLAN_DIM_COUNT][MS_COLL_KIND_COUNT]; /* by mesh dim and kind */
    double coll_calls[MS_PLAN_DIM_COUNT][MS_COLL_KIND_COUNT]; /* each pays its latency */
    double mem_params, mem_grads, mem_optim, mem_act;         /* bytes */
} ms_plan_tally;
/* The tally of s from the engine's compiled program (closed_form false: the strategy must be
 * one the engine runs, on a model small enough to compile) or from the closed form. */
ms_status ms_plan_tally_get(const ms_plan_problem *pb, const ms_strategy *s, bool closed_form,
                            ms_plan_tally *out, ms_error *err);

/* Parameters of the model the engine builds for c (its family's closed form: every embedding,
 * norm and head the builder makes, the tied head counted once). */
double ms_plan_model_params(const ms_model_config *c);

/* Compiled workloads kept across estimates (keyed by model, batch, sequence and strategy), so
 * that a search or the advisor compiles each strategy once, and simulated pipeline bubbles
 * (keyed by schedule, pp, micro-batches and virtual stages), so that each is simulated once.
 * ms_plan_search makes its own when the problem has none. Owned by its creator; not
 * thread-safe (one planner or advisor uses it). */
ms_plan_memo *ms_plan_memo_create(void);
void ms_plan_memo_destroy(ms_plan_memo *m);
/* The memo's reshard plans, which every program it compiles shares (plans depend on the mesh's
 * shape, the placements and the global shape alone, so they hold across strategies and
 * layouts). Owned by the memo. */
struct ms_plan_cache *ms_plan_memo_plans(ms_plan_memo *m);

#endif

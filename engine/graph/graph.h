/* graph.h - graph mode: build a model once, compile it for a mesh, run training steps.
 *
 *   build     ms_graph_param / ms_graph_input / ms_graph_op record values and operators
 *             with GLOBAL shapes; ms_graph_annotate pins a few placements.
 *   compile   (per rank, pure and identical on every rank) completion gives every value a
 *             placement from the annotations and the ops' SPMD rules, forward and reverse;
 *             reverse-mode autograd adds the backward with placements by duality; partition
 *             inserts the reshards; the memory planner packs every step-lived buffer into one
 *             arena, reusing space between buffers whose lifetimes do not overlap.
 *   run       ms_program_step feeds inputs, runs forward and backward and leaves gradients
 *             in the parameters' gradient placements; the optimizer reads them from there.
 *
 * Reading a compiled program's kernels and reshards, and compiling one from shapes alone
 * (the planner), are in graph/program.h.
 *
 * Ownership: the graph owns its values and nodes; a program borrows its graph and dmesh
 * (both must outlive it) and owns its arena and parameter storage.
 */
#ifndef MS_GRAPH_H
#define MS_GRAPH_H

#include <stdio.h>

#include "engine/dist/dtensor.h"
#include "engine/ops/op.h"

typedef struct ms_graph ms_graph;
typedef struct ms_program ms_program;

/* How a parameter is initialised: Philox normal(0, std) keyed by the parameter's id, or a
 * constant. Shard by shard equals whole, so every mesh starts from the same weights. */
typedef enum ms_init_kind {
    MS_INIT_NORMAL,
    MS_INIT_CONST,
    MS_INIT_DATA /* given values (ms_graph_constant) */
} ms_init_kind;
typedef struct ms_init {
    ms_init_kind kind;
    float value; /* std for NORMAL, the constant for CONST */
} ms_init;

ms_graph *ms_graph_create(void);
void ms_graph_destroy(ms_graph *g);

/* Values are small integer ids; -1 means a build error (the first is kept, see
 * ms_graph_error). Names are copied. */
int ms_graph_param(ms_graph *g, const char *name, int ndim, const int64_t *shape, ms_init init);
int ms_graph_input(ms_graph *g, const char *name, int ndim, const int64_t *shape);
/* A buffer: named persistent state that is not trained (batch norm's running statistics). The
 * program stores, places (the shard callback, replicated by default; never sharded by ZeRO) and
 * initialises it as a parameter, but it has no gradient, and the optimizer, weight decay and
 * the gradient norm never see it. Operators read it as any value; ms_graph_assign names the
 * value written into it in place after every training forward. Checkpoints and strategy
 * switches carry it (the trainer's state walk, MS_STATE_BUFFER). */
int ms_graph_buffer(ms_graph *g, const char *name, int ndim, const int64_t *shape, ms_init init);
/* After each forward in training (ms_program_set_dropout(p, true, ...), the default; each
 * micro-batch's forward under micro-batching, as PyTorch updates per call) buffer takes the
 * value v (same shape) computed by that forward, resharded into the buffer's placements; the
 * forwards of evaluation leave it alone. Reads of the buffer within the forward see the value
 * from before it. At most one value per buffer. */
void ms_graph_assign(ms_graph *g, int buffer, int v);
/* A constant: a buffer that holds `values` (numel floats, copied) and is never assigned, such
 * as an imported model's masks and scalars. Checkpoints and switches carry it as any buffer. */
int ms_graph_constant(ms_graph *g, const char *name, int ndim, const int64_t *shape,
                      const float *values);
/* Batch normalisation of x [N, C, ...] (channels first; [N, C] included) over N and every
 * spatial dim, as PyTorch's BatchNorm1d/2d in training and eval mode:
 *   y = (x - mean) / sqrt(var + eps) * weight + bias, per channel.
 * Training normalises with the batch's mean and biased variance, composed of MS_OP_MEAN_DIMS
 * reductions: under data parallelism (x sharded over dp on dim 0) each is a partial sum that
 * the engine all-reduces, so the statistics are the GLOBAL batch's (SyncBN) under every
 * strategy; the backward is autograd's through the composition, exact. Each training forward
 * then updates the buffers prefix.running_mean and prefix.running_var [C] (initial 0 and 1)
 * with PyTorch's convention, running = (1 - momentum) running + momentum stat, the variance
 * unbiased (n / (n - 1), n the rows x spatial elements of that forward's global batch; one
 * update per micro-batch under micro-batching). Evaluation (ms_program_set_dropout(p, false,
 * ...)) normalises with the running statistics. Parameters prefix.weight [C] (1) and
 * prefix.bias [C] (0). Returns y, or -1 (see ms_graph_error). */
int ms_graph_batch_norm(ms_graph *g, int x, const char *prefix, int64_t channels, float eps,
                        float momentum);
int ms_graph_op(ms_graph *g, int op, const ms_op_attrs *attrs, int n_in, const int *in,
                const char *name);
/* Multi-output ops (split): writes n_out value ids. */
ms_status ms_graph_op_n(ms_graph *g, int op, const ms_op_attrs *attrs, int n_in, const int *in,
                        int n_out, int *out, const char *name);
/* Pins value v to placements pl (validated at compile time against the mesh). */
void ms_graph_annotate(ms_graph *g, int v, const ms_placements *pl);
/* Keeps value v's buffer alive after the step (persistent), so ms_program_value can read
 * it (e.g. logits for sampling). */
void ms_graph_keep(ms_graph *g, int v);
/* The scalar to minimise. */
void ms_graph_set_loss(ms_graph *g, int v);
/* A pipeline chunk that ends before the loss: instead of a loss, value v is the chunk's
 * output, and backward starts from its gradient, which the caller writes into
 * ms_program_output_grad before ms_program_backward. A graph has a loss or an output. */
void ms_graph_set_output(ms_graph *g, int v);
/* Input v gets a gradient (a pipeline chunk's activation input): after ms_program_backward
 * it is in ms_program_input_grad, in v's placements. */
void ms_graph_input_grad(ms_graph *g, int v);
/* Recompute regions: the builder brackets spans of consecutive operators (a transformer block,
 * the core of its attention) between ms_graph_region_begin and _end of a kind; every operator
 * recorded in between belongs to that region. Regions of different kinds may nest (attention
 * inside a block); one of a kind may not (a begin while one is open is ignored).
 * ms_compile_opts.recompute says which kinds the backward runs again instead of keeping. */
typedef enum ms_region_kind {
    MS_REGION_BLOCK,     /* one transformer layer: only its inputs are kept */
    MS_REGION_ATTENTION, /* attention's core: its score and probability tensors */
    MS_REGION_KIND_COUNT
} ms_region_kind;
void ms_graph_region_begin(ms_graph *g, ms_region_kind kind);
void ms_graph_region_end(ms_graph *g, ms_region_kind kind);
/* The region of `kind` operator node k belongs to (0, 1, ... in build order), or -1. */
int ms_graph_node_region(const ms_graph *g, int node, ms_region_kind kind);

ms_status ms_graph_error(const ms_graph *g, ms_error *err);

int ms_graph_num_values(const ms_graph *g);
const char *ms_graph_value_name(const ms_graph *g, int v);
const ms_shape *ms_graph_value_shape(const ms_graph *g, int v);
int ms_graph_find(const ms_graph *g, const char *name);
bool ms_graph_is_param(const ms_graph *g, int v);
/* Whether v is an input (fed with ms_program_feed). */
bool ms_graph_is_input(const ms_graph *g, int v);
bool ms_graph_is_buffer(const ms_graph *g, int v);
/* Whether v is an activation: an operator's output (not a parameter, input, constant or
 * buffer). */
bool ms_graph_is_activation(const ms_graph *g, int v);
/* How many operator inputs read v (an operator reading it twice counts twice). */
int ms_graph_value_uses(const ms_graph *g, int v);
/* The operator nodes, in the order they were added: node n's operator, and its inputs and
 * outputs as value ids (borrowed from the graph). */
int ms_graph_num_nodes(const ms_graph *g);
int ms_graph_node_io(const ms_graph *g, int n, int *n_in, const int **in, int *n_out,
                     const int **out);

/* Annotation callback: called for every value (parameters, inputs and named activations)
 * without an annotation; return true and fill *pl to annotate. */
typedef bool (*ms_shard_fn)(void *user, const char *name, const ms_shape *shape, int mesh_ndim,
                            ms_placements *pl);

typedef struct ms_compile_opts {
    ms_shard_fn shard; /* optional */
    void *shard_user;
    uint64_t seed; /* parameter init and dropout */
    /* Micro-batched (gradient accumulation, pipelines): each in-flight micro-batch has its
     * own arena (inputs, activations and temporaries; the caller binds it), gradients accumulate
     * over ms_program_backward calls until ms_program_zero_grads, and ms_program_grad_sync moves
     * them into the parameters' placements once per step. */
    bool micro_batched;
    float loss_scale; /* the backward seed d(loss) (0: 1); 1/m averages m micro-batches */
    /* With micro_batched: backward in two passes, the input gradients
     * (ms_program_backward_input) and the parameters' (ms_program_backward_weight), as the
     * zero-bubble schedules run them; each kernel with parameters runs once in each. */
    bool split_weight_grads;
    /* ZeRO (Rajbhandari et al. 2020) over mesh dim zero_dim, the data-parallel one: a
     * parameter replicated there keeps its optimizer state (stage >= 1), its gradient (>= 2)
     * and itself (3) sharded over it: S(0) nested innermost, so that a rank's shard is a
     * contiguous run of rows of its box under the other mesh dims (ms_program_zero_pl). Stage
     * 3 gathers each parameter just before each use (forward and backward) into the arena,
     * and its gradient is reduce-scattered into the shard. 0: none. */
    int zero_stage;
    int zero_dim;
    /* Activation recompute: bit k set (1u << ms_region_kind) drops what the operators of each
     * region of kind k keep for backward; right before the region's backward, its forward
     * (with the reshards inside it) runs again into buffers that live only until then. Only
     * the values flowing into a region are kept. An outer region wins over one nested in it. */
    unsigned recompute;
    /* > 0: of the block regions (MS_REGION_BLOCK), only the first recompute_blocks in build
     * order are recomputed; the later blocks keep their values. 0: every block. */
    int recompute_blocks;
    /* > 0: the grad-sync all-reduces run in buckets of at most this many MiB, each issued
     * (non-blocking) as soon as backward has produced its gradients, during the last of
     * micro_batches backward passes when micro_batched; ms_program_grad_sync then waits.
     * 0: one all-reduce per gradient at grad sync. */
    float bucket_mb;
    int micro_batches; /* backward passes per step (micro_batched); 0: 1 */
    /* Mixed precision: activations, the parameters' use copies and gradients are bf16, and
     * collectives move bf16; kernels compute in fp32 on widened operands and round their
     * results once; the parameters' fp32 master weights live in the optimizer's placements. */
    bool bf16;
    /* The parameter sync may run parameter by parameter inside the next step, before each
     * one's first use (ms_program_param_sync_one from ms_program_on_param_use: ZeRO-Offload's
     * overlap): its temporaries then get arena space of their own for the whole step instead
     * of sharing it with the step's buffers. */
    bool deferred_param_sync;
    /* Zero every gradient before its first kernel adds into it, even where that kernel could
     * write it whole (ms_op_def.fresh_ok): the program as it was before it skipped those
     * zeroings, for comparing the two. */
    bool zero_all_grads;
    /* Shapes-only programs (ms_program_compile_shapes), under bf16: the device whose kernels
     * decide which instructions take their bf16 buffers unstaged, and so the staging area's
     * size (MS_DEVICE_CPU, the default: every instruction staged). MS_DEVICE_CUDA prices a GPU
     * whether or not this build has CUDA. A compiled program always asks its own device. */
    ms_device_kind kernels_like;
    /* bf16 with ZeRO-Offload: the fp32 master weights live in this host device's memory, where
     * the host optimizer updates them, and not on the rank's device. The parameter sync copies
     * up their bf16 rounding, made on the host (ms_program_round_master) - half the bytes of
     * the fp32 shard. NULL: the masters are on the rank's device. Borrowed: it outlives the
     * program. Ignored without bf16; a shapes-only program only lays its memory out so. */
    ms_device *master_host;
    /* Micro-batched: the most micro-batches whose arenas the caller holds at once (a pipeline
     * stage's in-flight bound). Above 1, the buffers that live within one pass (a forward's
     * temporaries, a backward's working gradients, recompute's values made again) move to a
     * scratch arena that every micro-batch shares, when that takes less memory in all
     * (inflight x the micro-batch arena + the scratch, against inflight x one arena): the
     * micro-batch arena then keeps only what crosses from its forward to its backward, which
     * under full recompute is the layers' inputs. 0 or 1: one arena holds everything. */
    int inflight;
    /* Shapes-only programs: a reshard-plan cache shared with other compiles (a search
     * compiles many programs whose reshards repeat), or NULL: the program's own. Borrowed: it
     * outlives the program, and one thread uses it at a time. A rank's program always uses its
     * rank context's. */
    struct ms_plan_cache *plans;
} ms_compile_opts;

/* Compiles g for the rank's mesh (collective only in that it allocates nothing shared;
 * every member must compile the same graph). Non-members get a program that does nothing. */
ms_status ms_program_compile(ms_graph *g, ms_dmesh *mesh, const ms_compile_opts *opts,
                             ms_program **out, ms_error *err);
void ms_program_destroy(ms_program *p);

/* Sets input v's data from its GLOBAL values (every rank passes the same array; each keeps
 * its box). */
ms_status ms_program_feed(ms_program *p, int v, const float *global, ms_error *err);

/* One forward + backward. *loss receives the global loss on every member. */
ms_status ms_program_step(ms_program *p, float *loss, ms_error *err);
/* Forward only (evaluation); with micro_batched, also the first half of a micro-batch.
 * *loss (may be NULL) receives the loss; a chunk without one leaves it alone. */
ms_status ms_program_forward(ms_program *p, float *loss, ms_error *err);

/* Micro-batched programs (ms_compile_opts.micro_batched): a step is ms_program_zero_grads,
 * then per micro-batch ms_program_bind_arena + feed + ms_program_forward and later, on the
 * same arena, ms_program_backward, then one ms_program_grad_sync. An arena holds one
 * micro-batch's inputs, activations and temporaries from its forward to its backward; the
 * caller owns the arenas (ms_program_arena_bytes each, any float-aligned memory), so it can
 * pool them across programs and count what is truly in flight. Such a program allocates no
 * arena of its own. */
size_t ms_program_arena_bytes(const ms_program *p);
void ms_program_bind_arena(ms_program *p, float *arena);
/* With ms_compile_opts.inflight > 1: the scratch arena's bytes (0 when the program kept one
 * arena), and binding it. One scratch may serve every micro-batch of every program the caller
 * runs one pass at a time, as long as each is bound before the program runs: a pass leaves
 * nothing in it that a later pass reads. The caller owns it. */
size_t ms_program_scratch_bytes(const ms_program *p);
void ms_program_bind_scratch(ms_program *p, float *scratch);
ms_status ms_program_backward(ms_program *p, ms_error *err);
/* Where the bound micro-batch's rows sit in the step's batch: on each data-parallel replica,
 * `rows` rows starting at `offset` of the replica's `stride` rows (0, 0, 0: the program's rows
 * are the batch). Dropout keys its masks by the step's row, so a micro-batched run drops what
 * a run of the whole batch drops. Set it before a micro-batch's forward and its backward. */
void ms_program_set_batch_window(ms_program *p, int64_t rows, int64_t stride, int64_t offset);
/* Dropout for the runs that follow: training step `step` draws its masks keyed by the run seed
 * and the step, so every step drops anew and a resumed or switched run draws what an
 * uninterrupted one would; evaluation (training false) passes values through unchanged, as
 * dropout does outside training. A compiled program starts at training step 0. */
void ms_program_set_dropout(ms_program *p, bool training, uint64_t step);
/* The two passes of a split backward (ms_compile_opts.split_weight_grads); without the split
 * the first runs the whole backward and the second nothing. */
ms_status ms_program_backward_input(ms_program *p, ms_error *err);
ms_status ms_program_backward_weight(ms_program *p, ms_error *err);
ms_status ms_program_grad_sync(ms_program *p, ms_error *err);
/* After the optimizer updated every parameter's optimizer shard (ms_param_view): gathers the
 * shards into the stored parameters (ZeRO 1 and 2: an all-gather over dp; nothing otherwise);
 * under bf16 precision rounds the fp32 masters into the bf16 use copies (and gathers those).
 * Collective over the mesh; needs an arena (micro-batched: any bound one). */
ms_status ms_program_param_sync(ms_program *p, ms_error *err);
/* ms_program_param_sync for parameter i alone (its gather, its bf16 cast): what a deferred
 * update (ZeRO-Offload's overlap) runs right before the parameter's first use. Collective over
 * the mesh, in the same order on every member. */
ms_status ms_program_param_sync_one(ms_program *p, int i, ms_error *err);
/* Host masters (ms_compile_opts.master_host): rounds parameter i's master shard into the host
 * bf16 shard that its next sync copies up, with kc, a kernel context on the host. The host
 * optimizer calls it right after each update, on its own thread while no sync of i runs, so
 * that the rounding leaves the sync (which otherwise rounds a master written since). */
struct ms_kctx;
ms_status ms_program_round_master(ms_program *p, int i, struct ms_kctx *kc, ms_error *err);
/* Called by a training step (ms_program_step and the passes) right before the first instruction
 * that reads parameter i's stored values (its first use: a gather under ZeRO 3, else its first
 * kernel), at most once per instruction run; a failure fails the step. NULL removes it. */
typedef ms_status (*ms_param_use_fn)(void *arg, int param, ms_error *err);
void ms_program_on_param_use(ms_program *p, ms_param_use_fn fn, void *arg);
/* Called during a training step as soon as parameter i's gradient (its stored shard, what
 * ms_program_param's grad views) is final: after the last pass of the backward instruction
 * that finishes it when no grad sync moves it; when its bucket's collective is seen complete
 * during backward (the bucket's values are then copied out at once, see ms_gb_poll); else at
 * the end of ms_program_grad_sync. Once per parameter and step (ms_program_zero_grads starts a
 * step); from the rank thread, between instructions. NULL removes it. */
void ms_program_on_grad_final(ms_program *p, ms_param_use_fn fn, void *arg);
/* The index of that first instruction in the step (a step's order of first uses). */
int ms_program_param_first_use(ms_program *p, int i);
ms_status ms_program_zero_grads(ms_program *p, ms_error *err);
/* This rank's local buffer of input or output v in the bound arena, in v's placements
 * (pipeline transfers read and write it directly); NULL if v is neither. */
ms_tensor *ms_program_local(ms_program *p, int v);
/* The output's gradient, written by the caller before ms_program_backward (graphs with
 * ms_graph_set_output), and input v's gradient after it (ms_graph_input_grad); local
 * buffers in the value's placements, NULL when there is none. */
ms_tensor *ms_program_output_grad(ms_program *p);
ms_tensor *ms_program_input_grad(ms_program *p, int v);

/* Parameter access for the optimizer and checkpoints: the stored shard and its gradient after
 * the gradient sync. Without ZeRO all three placements below are the parameter's; with it the
 * optimizer owns a sub-box of rows of data (and of grad), which it updates before
 * ms_program_param_sync gathers the shards back into data (stages 1 and 2). */
typedef struct ms_param_view {
    const char *name;
    int value;
    ms_shape gshape;
    /* data: the parameter's fp32 values, the ones the optimizer updates, in placements pl:
     * where it is stored (ZeRO 3: sharded over dp), or under bf16 precision the master
     * weights, in the optimizer's placements (opt_pl); a view into the program (shapes only:
     * no storage). Whoever writes data other than the optimizer step must call
     * ms_program_params_written before the next step. */
    ms_placements pl;
    ms_tensor data;
    size_t use_bytes;      /* bf16: the bf16 copy the kernels read, besides data; else 0 */
    bool host_master;      /* data is in host memory (ms_compile_opts.master_host) */
    ms_tensor grad;        /* MS_BF16 under bf16 precision */
    ms_placements grad_pl; /* grad's (ZeRO 2 and 3: sharded over dp) */
    ms_placements opt_pl;  /* the optimizer state's (ZeRO >= 1: sharded over dp) */
    ms_shape opt_shape;    /* its local box */
    /* the optimizer's shard: opt_n floats at data + data_off and at grad + grad_off */
    int64_t opt_n, data_off, grad_off;
    /* True on exactly one rank of each group of ranks holding the same gradient shard, so
     * that global sums over gradient shards count each element once. */
    bool owner;
} ms_param_view;
int ms_program_num_params(const ms_program *p);
/* Writes parameter i's local shard from the parameter's FULL values (checkpoint loads). */
ms_status ms_program_load_param(ms_program *p, int i, const float *full, ms_error *err);
/* Buffers (ms_graph_buffer), in the graph's value order: name, global shape, placements and
 * this rank's box (data: fp32, a view into the program; empty for a shapes-only program). A
 * training forward writes data in place (ms_graph_assign); checkpoints and switches read and
 * write it between steps. */
typedef struct ms_buffer_view {
    const char *name;
    int value;
    ms_shape gshape;
    ms_placements pl;
    ms_tensor data;
} ms_buffer_view;
int ms_program_num_buffers(const ms_program *p);
ms_status ms_program_buffer(const ms_program *p, int i, ms_buffer_view *out);
/* Writes buffer i's local box from the buffer's FULL values (checkpoint loads). */
ms_status ms_program_load_buffer(ms_program *p, int i, const float *full, ms_error *err);
/* The full value of a kept value (ms_graph_keep) after a step or forward: every member
 * receives a new tensor. Collective over the mesh. */
ms_status ms_program_value(ms_program *p, int v, ms_tensor *out, ms_error *err);
ms_status ms_program_param(ms_program *p, int i, ms_param_view *out);
/* The parameters' data were written (a checkpoint load, a strategy switch): under bf16
 * precision, the use copies are refreshed before the next forward. Every member calls it
 * alike (the refresh may gather). ms_program_load_param and ms_program_param_sync need none. */
void ms_program_params_written(ms_program *p);

/* Prints every value's completed placements and every reshard with its bytes per step. */
void ms_program_explain(const ms_program *p, FILE *f);

/* Totals of the compiled step, for logs and the cost model. */
typedef struct ms_program_stats {
    int n_reshards;
    double reshard_bytes; /* collective sizes per step, this rank */
    double flops;         /* forward + backward, this rank */
    size_t arena_bytes;   /* the memory planner's arena (micro-batched: one micro-batch's) */
    size_t scratch_bytes; /* the scratch all micro-batches share (ms_program_scratch_bytes) */
    /* the most arena bytes live at once without the parameter gradients that wait in it for
     * the grad sync (one-micro-batch programs): activations, their gradients, temporaries */
    size_t activation_bytes;
    size_t unplanned_bytes; /* what the step-lived buffers would take without reuse */
    size_t param_bytes;
    size_t staging_bytes; /* bf16: fp32 copies of one instruction's operands, reused by all */
    int grad_buckets;     /* bucket_mb > 0: buckets of grad-sync all-reduces */
    int bucketed_grads;   /* the gradients in them */
    size_t bucket_bytes;  /* their one buffer (and the reduce-scatters' results), device memory */
    /* gradients zeroed in a step before kernels add into them (ms_program_zero_grads' aside),
     * and those a kernel writes whole first instead (ms_op_def.fresh_ok): buffers and bytes */
    int zeroed_grads, fresh_grads;
    double zeroed_bytes, fresh_bytes;
} ms_program_stats;
void ms_program_stats_get(const ms_program *p, ms_program_stats *s);

#endif

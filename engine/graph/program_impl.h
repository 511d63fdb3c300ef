/* program_impl.h - the compiled program's private structures, shared by the files that build
 * and run it (program.c) and that handle its number formats (program_precision.c). Nothing
 * outside engine/graph includes this. */
#ifndef MS_PROGRAM_IMPL_H
#define MS_PROGRAM_IMPL_H

#include "engine/dist/reshard.h"
#include "engine/graph/grad_buckets.h"
#include "engine/graph/graph_impl.h"
#include "engine/graph/program.h"
#include "engine/core/xalloc.h"
#include "engine/ops/select.h"

typedef struct buf {
    ms_dtype dtype;  /* MS_F32, or MS_BF16 for values and gradients under bf16 precision */
    int64_t numel;   /* elements */
    int64_t nfloats; /* storage in 4-byte units: numel, or numel / 2 rounded up for bf16 */
    ms_shape lshape; /* local shape */
    size_t offset;   /* floats into the arena, or into the scratch (step-lived buffers) */
    float *ptr;
    int first, last; /* instruction lifetime; persistent buffers use -1 */
    bool persistent;
    bool on_host;   /* persistent in the master host's memory (ms_compile_opts.master_host) */
    bool scratch;   /* lives within one pass, in the shared scratch (ms_compile_opts.inflight) */
    ms_tensor t;    /* wrapped view over ptr, made once */
    ms_tensor wide; /* bf16: an fp32 view that kernels read and write, over the staging area */
} buf;

typedef struct pvalue {
    ms_placements pl; /* placement the value is stored in */
    int buf;
    bool known, requires_grad;
    bool has_hint;
    ms_placements hint;
    bool has_grad;
    ms_placements gpl;
    int gbuf;
    int param_grad_buf; /* params: the persistent gradient in grad_pl */
    /* params: storage, gradient and optimizer placements (all pl without ZeRO) */
    ms_placements store_pl, grad_pl, opt_pl;
    int master_buf; /* bf16 precision: the fp32 master weights in opt_pl, else -1 */
    /* host masters: the master's bf16 rounding on the host, what the cast copies up, and
     * whether the master was written since it was made (the cast then rounds first) */
    int up_buf;
    bool up_stale;
} pvalue;

/* The buffers one kernel instruction reads and writes besides gradients. */
typedef struct kbufs {
    int in[MS_OP_MAX_IN], out[MS_OP_MAX_OUT], saved[MS_OP_MAX_SAVED];
} kbufs;

typedef struct pnode {
    ms_rule_cand cand[MS_MESH_MAX_DIMS];
    ms_placements req_in[MS_OP_MAX_IN];
    ms_placements out_pl[MS_OP_MAX_OUT];
    int in_buf[MS_OP_MAX_IN];
    int out_buf[MS_OP_MAX_OUT]; /* raw outputs in out_pl */
    int saved_buf[MS_OP_MAX_SAVED];
    bool gathered[MS_OP_MAX_IN]; /* ZeRO 3: input i is a parameter gathered for this use */
    kbufs bw; /* what its backward reads: the forward's buffers, or its recompute's */
} pnode;

/* CAST rounds an fp32 buffer into a bf16 one (the master weights into the use copy). */
typedef enum ikind { I_RESHARD, I_FWD, I_BWD, I_ZERO, I_ADD, I_SEED, I_COPY, I_CAST } ikind;

typedef struct instr {
    ikind kind;
    int node;
    int value; /* RESHARD: whose global shape */
    int src, dst;
    ms_placements from, to;
    int dout_buf[MS_OP_MAX_OUT], din_buf[MS_OP_MAX_IN];
    int64_t src_off;             /* COPY: floats into src */
    bool gather;                 /* RESHARD: a ZeRO-3 parameter gathered for one use */
    const ms_reshard_plan *plan; /* RESHARD: from the program's plan cache */
    double coll_bytes;           /* RESHARD: predicted by the plan */
    double flops, bytes;         /* FWD/BWD: the op's cost for this rank's local shapes */
    kbufs kb;                    /* FWD/BWD: the node's inputs, outputs and saved buffers */
    ms_program_phase phase;
    int bucket_grad;    /* grad-sync RESHARD done by a bucket: its gradient index + 1, else 0 */
    unsigned din_fresh; /* BWD: the ms_op_call.din_fresh it runs with */
    bool dropped;       /* ZERO: skipped, the next writer writes the buffer whole */
    bool train_only;    /* a buffer's update (ms_graph_assign): skipped in evaluation */
} instr;

struct ms_program {
    ms_graph *g;
    ms_dmesh *dm; /* NULL for a shapes-only program */
    ms_ctx *ctx;  /* NULL for a shapes-only program */
    ms_kctx *kc;  /* owned: the rank device's kernels (a CPU table for shapes-only programs) */
    /* The table whose bf16 kernels decide what runs unstaged: kc's, or for a shapes-only
     * program the one ms_compile_opts.kernels_like names. */
    const ms_kernels *bf16_kernels;
    ms_device *dev; /* borrowed: where every buffer lives (ctx->device, or the host device) */
    const ms_mesh *mesh;
    int coords[MS_MESH_MAX_DIMS];
    struct ms_plan_cache *plans; /* the rank context's, or own_plans */
    struct ms_plan_cache *own_plans;
    ms_mesh own_mesh; /* shapes-only: the copy mesh points to */
    bool shapes_only;
    uint64_t seed;
    ms_k_batch_window batch; /* ms_program_set_batch_window */
    bool eval;               /* ms_program_set_dropout */
    uint64_t draw;           /* dropout's key for the current step */
    bool member;
    pvalue *pv;
    pnode *pn;
    buf *bufs;
    int nb, cb;
    instr *ins;
    int ni, ci;
    int n_forward;  /* instructions [0, n_forward) are forward + loss report */
    int n_weight;   /* [n_forward, n_weight) backward (input gradients when split_w) */
    int n_backward; /* [n_weight, n_backward) weight gradients (split_w) */
    int n_sync;     /* [n_backward, n_sync) gradient sync, [n_sync, ni) parameter sync */
    int zero_stage, zero_dim;
    bool split_w;       /* ms_compile_opts.split_weight_grads */
    bool deferred_sync; /* ms_compile_opts.deferred_param_sync */
    int loss_buf;       /* the loss replicated, for reporting; -1 without a loss */
    bool micro;         /* micro-batched (ms_compile_opts.micro_batched) */
    float loss_scale;
    int out_grad_buf; /* the output's gradient (graphs with an output), else -1 */
    int *in_grad_buf; /* [nv]: an input's gradient in its placements, else -1 */
    float *arena;
    size_t arena_floats, unplanned_floats;
    int inflight;             /* ms_compile_opts.inflight */
    float *scratch;           /* micro-batched: the caller's (ms_program_bind_scratch) */
    size_t scratch_floats;    /* 0: no buffer is in a scratch */
    size_t activation_floats; /* peak_activations */
    float *persist;
    size_t persist_floats;
    /* The gradients zeroed at each step as ranges of adjacent buffers (built on first use):
     * the persistent ones [zero_off[i], + zero_len[i]) floats of persist; zero_other: those
     * zeroed one by one (outside persist), zero_n_other of them. */
    size_t *zero_off, *zero_len;
    int zero_n, *zero_other, zero_n_other;
    /* bf16: a run of consecutive casts on the device, as one list (grown on demand) */
    ms_k_cast_item *cast_items;
    int cast_cap;
    bool zero_ready;
    /* host masters (ms_compile_opts.master_host, borrowed): their storage there, and the
     * host's kernels that fill, round and load them (owned) */
    ms_device *master_host;
    ms_kctx *hkc;
    float *host_persist;
    size_t host_floats;
    int *params;
    int nparams;
    int *buffers; /* the graph's buffers (ms_graph_buffer), in value order */
    int nbuffers;
    int *param_first; /* [nparams]: first training instruction reading it, made on demand */
    ms_param_use_fn param_use; /* ms_program_on_param_use */
    void *param_use_arg;
    /* ms_program_on_grad_final: the hook, and per parameter the backward instruction that
     * finishes its gradient when no grad sync moves it (else -1), that instruction's runs this
     * step, and whether the hook heard of it; the parameter of each bucketed gradient. */
    ms_param_use_fn grad_final;
    void *grad_final_arg;
    int *gf_last, *gf_hits, *gf_bucket_param;
    bool *gf_told;
    int passes;               /* backward runs per step */
    uint64_t flow_counter;    /* reshard flow ids, for traces */
    int *kernels, nkernels;   /* instruction index of each FWD/BWD, in step order */
    int *reshards, nreshards; /* instruction index of each RESHARD, in step order */
    ms_grad_buckets *buckets; /* bucket_mb > 0: the grad-sync all-reduces in buckets */
    float *bucket_storage;
    int *rc_first; /* [nn]: first node of the recomputed region holding it, or -1 */
    int *rc_buf;   /* [nv]: a value's buffer while its region is recomputed, or -1 */
    /* bf16 precision (program_precision.c) */
    bool bf16;
    uint8_t *vdtype;       /* [nv]: each value's ms_dtype (prog_assign_dtypes) */
    bool params_dirty;     /* masters written since the last cast into the use copies */
    float *staging;        /* fp32 copies of one instruction's bf16 operands */
    size_t staging_floats; /* the most one instruction needs, set with the memory plan */
};

/* --- program_precision.c ------------------------------------------------------------------- */

/* The element type of value v's buffers (and of its gradient's) under the program's
 * precision: bf16 for activations and parameters' use copies under bf16, fp32 for inputs
 * (token ids are exact integers), the loss, a chunk's output (what pipeline stages pass on) and
 * kept values. */
ms_dtype prog_value_dtype(const ms_program *p, int v);
/* Decides every value's element type, once the graph is complete. */
void prog_assign_dtypes(ms_program *p);
/* Floats of staging the step needs, from the instruction list (after layout). */
size_t prog_staging_floats(const ms_program *p);
/* Runs kernel instruction `in` through call: bf16 operands are widened into the staging
 * area, the kernel runs in fp32, and what it wrote is rounded back once. */
ms_status prog_run_kernel(ms_program *p, const instr *in, ms_op_call *call, ms_error *err);
/* Predicted collective bytes of a reshard instruction, for its buffer's element type. */
double prog_reshard_bytes(const ms_program *p, const instr *in);

/* --- the passes' shared contract: each file of the program (program.c: compile and explain;
 * program_complete.c, program_build.c, program_backward.c, program_memory.c,
 * program_buckets.c, program_exec.c; program_util.c: helpers) defines what the others call --- */

bool prog_moves_grad(const instr *in);
int prog_new_buf(ms_program *p, int v, const ms_placements *pl, bool persistent);
int prog_new_typed_buf(ms_program *p, const ms_shape *gshape, const ms_placements *pl,
                       bool persistent, ms_dtype dtype);
int64_t prog_shape_n(const ms_shape *s);
instr *prog_emit(ms_program *p, ikind kind, ms_program_phase phase);
void prog_local_shape(const ms_program *p, const ms_shape *g, const ms_placements *pl,
                      ms_shape *out);
int prog_new_raw_buf(ms_program *p, int64_t nfloats);
ms_status prog_complete(ms_program *p, const ms_compile_opts *opts, ms_error *err);
void prog_zero_placements(ms_program *p);
const ms_placements *prog_held_pl(const ms_program *p, int v);
int prog_param_home(const ms_program *p, int v, ms_placements *pl);
void prog_emit_reshard(ms_program *p, int value, int src, int dst, const ms_placements *from,
                       const ms_placements *to, ms_program_phase phase);
void prog_build_param_sync(ms_program *p);
void prog_build_forward(ms_program *p);
void prog_prefetch_gathers(ms_program *p, int lo, int hi);
int64_t prog_rows_offset(const ms_program *p, const ms_shape *g, const ms_placements *a,
                         const ms_placements *b);
void prog_build_backward(ms_program *p);
void prog_fresh_gradients(ms_program *p);
void prog_mark_recompute(ms_program *p, unsigned kinds, int blocks);
ms_status prog_alloc_memory(ms_program *p, ms_error *err);
void prog_free(ms_program *p, void *x, size_t bytes);
void prog_layout_memory(ms_program *p);
void *prog_alloc(ms_program *p, size_t bytes);
size_t prog_padded_floats(const buf *bf);
void prog_plan_grad_buckets(ms_program *p, const ms_compile_opts *opts);
ms_status prog_bind_grad_buckets(ms_program *p, ms_error *err);
int prog_final_write(const ms_program *p, int b);
bool prog_writes(const instr *in, int b);
bool prog_host_reachable(const ms_program *p, const buf *b);
void prog_masters_written(ms_program *p);
ms_status prog_check_has_memory(const ms_program *p, ms_error *err);
void prog_make_call(ms_program *p, const instr *in, ms_op_call *call, ms_shape *gin,
                    ms_shape *gout);
ms_status prog_run(ms_program *p, int from, int upto, float *loss, ms_error *err);
ms_status prog_write_box(ms_program *p, buf *b, const float *global, const int64_t *gshape,
                         const int64_t *start, const int64_t *len, int ndim, ms_error *err);

#endif

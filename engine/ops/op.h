/* op.h - operators: one table row per op with its shape rule, SPMD rule, forward and
 * backward kernels and cost, so the engine, `explain`, the cost model and the profiler
 * all read the same definitions.
 *
 * SPMD rules are written for ONE mesh dim: an op lists the placement combinations it can
 * run in along a mesh dim of a given size (its "candidates": what each input must be and
 * what each output then is). The engine expands them to N-d by choosing a candidate per
 * mesh dim: the forward rule picks, among the candidates, the one whose input reshards
 * move the fewest bytes; the reverse rule picks one that yields a wanted output placement.
 * Backward placements follow by duality (ms_rule_dual_*), so backward kernels need no
 * rules of their own.
 *
 * Built-in ops have ids below MS_OP_BUILTIN_COUNT; ms_op_register adds user ops (fused
 * kernels defined outside the engine) with ids after them.
 */
#ifndef MS_OP_H
#define MS_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/dist/placement.h"
#include "engine/kernels/backend.h"
#include "engine/kernels/kernels.h"

#define MS_OP_MAX_IN    4
#define MS_OP_MAX_OUT   4
#define MS_OP_MAX_CANDS 48
#define MS_OP_MAX_SAVED 3

typedef enum ms_op_kind {
    MS_OP_MATMUL,    /* A [..., M, K] @ B [K, N...] -> [..., M, N...]; i[0] trans_b (B is [N, K]) */
    MS_OP_ADD,       /* a + b, same shapes */
    MS_OP_MUL,       /* a * b, same shapes */
    MS_OP_SCALE,     /* x * f[0] */
    MS_OP_BIAS,      /* x [..., tail...] + b [tail...] */
    MS_OP_GELU,      /* tanh GELU */
    MS_OP_LAYERNORM, /* over the last dim; inputs x, weight [C], bias [C]; f[0] eps */
    MS_OP_SOFTMAX,   /* over the last dim */
    MS_OP_ATTENTION, /* qkv [B, T, 3, C] -> [B, T, C]; i[0] heads, i[1] causal; f[0] dropout
                        on the probabilities (0: none), i[2] its stream */
    MS_OP_EMBEDDING, /* ids [...] (integer-valued floats), table [V, C] -> [..., C] */
    MS_OP_XENT,      /* logits [..., V], targets [...] -> losses [...]; target < 0 ignored */
    MS_OP_RESHAPE,   /* i[0] ndim, i[1..] shape */
    MS_OP_TRANSPOSE, /* swap dims i[0], i[1] */
    MS_OP_SPLIT,     /* along dim i[0] into i[1] equal parts (outputs) */
    MS_OP_CONCAT,    /* along dim i[0]; n inputs */
    MS_OP_SUM,       /* over dim i[0] (i[0] < 0: all dims, to a scalar) */
    MS_OP_MEAN,      /* over dim i[0] (i[0] < 0: all dims); divides by the GLOBAL count */
    MS_OP_DROPOUT,   /* f[0] p, i[0] stream; mask from Philox on global indices */
    /* Families of operators, each in its own file; a family adds its kinds between its two
     * marks (and its rows in op.c and op_defs.h in the same order). */
    /* -- unary: elementwise unary (ops_unary.c) -- */
    /* x -> f(x), same shape; S(d) passes through, P(sum) only for the linear neg. */
    MS_OP_NEG,         /* -x */
    MS_OP_ABS,         /* |x|; gradient sign(x), 0 at 0 */
    MS_OP_EXP,         /* e^x */
    MS_OP_LOG,         /* ln x (x > 0) */
    MS_OP_LOG1P,       /* ln(1 + x) (x > -1) */
    MS_OP_EXPM1,       /* e^x - 1 */
    MS_OP_SQRT,        /* sqrt x (x >= 0) */
    MS_OP_RSQRT,       /* 1 / sqrt x (x > 0) */
    MS_OP_SQUARE,      /* x^2 */
    MS_OP_RECIPROCAL,  /* 1 / x */
    MS_OP_SIN,         /* sin x */
    MS_OP_COS,         /* cos x */
    MS_OP_TANH,        /* tanh x */
    MS_OP_SIGMOID,     /* 1 / (1 + e^-x) */
    MS_OP_RELU,        /* max(x, 0) */
    MS_OP_LEAKY_RELU,  /* x > 0 ? x : f[0] x */
    MS_OP_ELU,         /* x > 0 ? x : f[0] (e^x - 1) */
    MS_OP_SILU,        /* x sigmoid(x) */
    MS_OP_GELU_ERF,    /* exact GELU: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
    MS_OP_SOFTPLUS,    /* ln(1 + e^x) */
    MS_OP_MISH,        /* x tanh(softplus x) */
    MS_OP_HARDSWISH,   /* x relu6(x + 3) / 6 */
    MS_OP_HARDSIGMOID, /* relu6(x + 3) / 6 */
    MS_OP_CLAMP,       /* min(max(x, f[0]), f[1]); gradient 0 outside [f[0], f[1]] */
    MS_OP_POW_SCALAR,  /* x^f[0] (x > 0 unless f[0] is an integer) */
    MS_OP_SIGN,        /* -1, 0 or 1; gradient 0 */
    MS_OP_SELU,        /* scale (x > 0 ? x : alpha (e^x - 1)), the SNN constants */
    MS_OP_SOFTSIGN,    /* x / (1 + |x|) */
    MS_OP_LOGSIGMOID,  /* ln sigmoid(x) = -softplus(-x) */
    MS_OP_ERF,         /* erf x */
    MS_OP_ATAN,        /* atan x */
    MS_OP_ADD_SCALAR,  /* x + f[0] (batch norm's var + eps) */
    /* -- end unary -- */

    /* -- binary: elementwise binary with broadcasting (ops_binary.c) -- */
    /* numpy broadcasting: shapes aligned from the right, size-1 or missing dims repeat; the
     * gradient of a broadcast input is summed over the dims it repeats along. */
    MS_OP_ADD_BCAST,          /* a + b */
    MS_OP_SUB,                /* a - b */
    MS_OP_MUL_BCAST,          /* a * b */
    MS_OP_DIV,                /* a / b */
    MS_OP_MAXIMUM,            /* max(a, b); a tie splits the gradient evenly */
    MS_OP_MINIMUM,            /* min(a, b); a tie splits the gradient evenly */
    MS_OP_POW,                /* a^b, a > 0 */
    MS_OP_ATAN2,              /* atan2(a, b) */
    MS_OP_HYPOT,              /* sqrt(a^2 + b^2) */
    MS_OP_SQUARED_DIFFERENCE, /* (a - b)^2 */
    MS_OP_ADD_RELU,           /* max(a + b, 0): a residual add and its ReLU in one pass */
    MS_OP_EQ,                 /* a == b as 1 or 0; no gradient */
    MS_OP_NE,                 /* a != b as 1 or 0; no gradient */
    MS_OP_LT,                 /* a < b as 1 or 0; no gradient */
    MS_OP_LE,                 /* a <= b as 1 or 0; no gradient */
    MS_OP_GT,                 /* a > b as 1 or 0; no gradient */
    MS_OP_GE,                 /* a >= b as 1 or 0; no gradient */
    MS_OP_LERP,               /* a, b, w -> a + w (b - a) */
    MS_OP_WHERE,              /* cond, a, b -> cond != 0 ? a : b; cond takes no gradient */
    /* -- end binary -- */

    /* -- reduce: reductions (ops_reduce.c) -- */
    /* x -> x reduced over the dims in mask i[0] (bit d = dim d); i[1] keepdim (0/1) */
    MS_OP_SUM_DIMS,      /* sum; a sharded reduced dim gives P(sum) */
    MS_OP_MEAN_DIMS,     /* mean, divided by the GLOBAL count */
    MS_OP_MAX_DIMS,      /* max; gradient to the first max (row-major over reduced dims) */
    MS_OP_MIN_DIMS,      /* min; gradient to the first min */
    MS_OP_PROD,          /* product */
    MS_OP_VAR,           /* variance; i[2] correction (0 population, 1 sample) */
    MS_OP_STD,           /* standard deviation; i[2] correction */
    MS_OP_LOGSUMEXP,     /* log(sum(exp(x))), max-shifted */
    MS_OP_NORM,          /* L2 norm sqrt(sum(x^2)) */
    MS_OP_ARGMAX,        /* index of the first max along dim i[0]; i[1] keepdim; no gradient */
    MS_OP_ARGMIN,        /* index of the first min along dim i[0]; i[1] keepdim; no gradient */
    MS_OP_COUNT_NONZERO, /* number of elements != 0; no gradient */
    /* -- end reduce -- */

    /* -- index: indexing and layout (ops_index.c) -- */
    MS_OP_PERMUTE,      /* x -> x with its dims reordered: output dim k is input dim i[k] */
    MS_OP_SLICE,        /* dim i[0], elements [i[1], i[2]) (step 1) */
    MS_OP_NARROW,       /* dim i[0], i[2] elements from i[1] */
    MS_OP_INDEX_SELECT, /* x, ids [L] (integer floats) -> x with dim i[0] = x[ids] */
    MS_OP_GATHER,       /* x, ids (x's shape outside dim i[0]) -> x at ids along dim i[0] */
    MS_OP_SCATTER_ADD,  /* x, ids, src -> x with src added at rows ids along dim i[0] */
    MS_OP_CUMSUM,       /* inclusive cumulative sum along dim i[0] */
    MS_OP_CUMPROD,      /* inclusive cumulative product along dim i[0] */
    MS_OP_FLIP,         /* reverse the dims in mask i[0] (bit d = dim d) */
    MS_OP_ROLL,         /* along dim i[0] by i[1]: out[j] = x[(j - i[1]) mod n] */
    MS_OP_REPEAT,       /* tile: dim d repeated i[d] times (>= 1 each) */
    MS_OP_EXPAND,       /* broadcast size-1 dims to i[d] (0 or equal: unchanged) */
    MS_OP_SQUEEZE,      /* drop the size-1 dim i[0] */
    MS_OP_UNSQUEEZE,    /* insert a size-1 dim at i[0] */
    MS_OP_PAD,          /* constant f[0]; i[2d], i[2d+1] before / after dim d (rank <= 5) */
    MS_OP_TRIL,         /* keep c - r <= i[0] of the last two dims, zero the rest */
    MS_OP_TRIU,         /* keep c - r >= i[0] of the last two dims, zero the rest */
    MS_OP_STACK,        /* n inputs of one shape along a new dim i[0] */
    MS_OP_MASKED_FILL,  /* x, mask (0/1, x's shape) -> mask ? f[0] : x */
    MS_OP_ONE_HOT,      /* ids [...] -> [..., i[0]] of 0/1; no gradient */
    MS_OP_TOPK,         /* i[0] largest of the last dim -> values, indices; ties: lower index */
    MS_OP_SORT,         /* the last dim sorted (i[0] descending) -> values, indices; stable */
    MS_OP_BATCH_GATHER, /* x, ids [x's dims before i[0], L] -> x with dim i[0] = its ids' rows */
    /* -- end index -- */

    /* -- layers: neural-network layers (ops_layers.c) -- */
    MS_OP_RMSNORM,           /* x [..., C], weight [C] -> x / rms(x) * weight; f[0] eps */
    MS_OP_LAYERNORM_PLAIN,   /* x [..., C] -> (x - mean) / std over the last dim; f[0] eps */
    MS_OP_LOG_SOFTMAX,       /* over the last dim */
    MS_OP_MASKED_SOFTMAX,    /* x, mask [..., C] (0 drops) -> softmax(x / f[0]) over kept */
    MS_OP_SWIGLU,            /* gate, up (same shapes) -> silu(gate) * up */
    MS_OP_ROTARY,            /* x [B, T, ..., D]; f[0] theta; pairs (i, i + D/2), global T */
    MS_OP_GQA_ATTENTION,     /* q [B,T,H,D], k, v [B,T,Hkv,D] or kv [B,T,2,Hkv,D]; i[0] causal */
    MS_OP_PADDED_ATTENTION,  /* qkv [B,T,3,C], mask [B,T] -> [B,T,C]; i[0] heads, i[1] causal */
    MS_OP_LINEAR,            /* x [..., K...], W [N..., K...], bias [N...]; i[0] K dims (0: 1) */
    MS_OP_BMM,               /* a [..., M, K] @ b [..., K, N], batch dims broadcast */
    MS_OP_NLL_LOSS,          /* log-probs [..., V], targets [...] -> [...]; target < 0 ignored */
    MS_OP_MSE_LOSS,          /* a, b -> scalar mean (a - b)^2 over every element */
    MS_OP_L1_LOSS,           /* a, b -> scalar mean |a - b| */
    MS_OP_HUBER_LOSS,        /* a, b -> scalar mean Huber(a - b); f[0] delta */
    MS_OP_XENT_SMOOTH,       /* logits [..., V], targets [...] -> [...]; f[0] label smoothing */
    MS_OP_COSINE_SIMILARITY, /* a, b [..., C] -> [...] over the last dim; f[0] eps */
    /* -- end layers -- */

    /* -- fused: elementwise chains in one pass (ops_fused.c) -- */
    MS_OP_BIAS_GELU,        /* x [..., tail...], b [tail...] -> gelu(x + b) */
    MS_OP_BIAS_DROPOUT_ADD, /* x, b [tail...], res -> res + dropout(x + b); f[0] p, i[0] stream */
    /* -- end fused -- */

    /* -- conv: convolutions in NCHW (ops_conv.c) -- */
    /* x, weight [C_out, C_in / groups, K...], optional bias [C_out]; per spatial dim s of nsp:
     * i[s] stride, i[nsp + s] padding (both sides), i[2 nsp + s] dilation; i[3 nsp] groups */
    MS_OP_CONV1D, /* x [N, C_in, L] -> [N, C_out, L_out]; i[0..3] */
    MS_OP_CONV2D, /* x [N, C_in, H, W] -> [N, C_out, H_out, W_out]; i[0..6] */
    /* -- end conv -- */

    /* -- pool: vision and speech on channels-first tensors (ops_pool.c) -- */
    /* Pooling: x [N, C, L] (1d) or [N, C, H, W] (2d); per spatial dim s of k (1 or 2): kernel
     * i[s], stride i[k + s], padding i[2k + s] on both sides (at most half the kernel). */
    MS_OP_MAX_POOL1D,      /* window max; gradient to the first max in row-major order */
    MS_OP_MAX_POOL2D,      /* as max_pool1d over [H, W] windows */
    MS_OP_AVG_POOL1D,      /* window mean; i[3] 1: padding not counted (count_include_pad=0) */
    MS_OP_AVG_POOL2D,      /* as avg_pool1d over [H, W] windows; i[6] 1: padding not counted */
    MS_OP_GLOBAL_AVG_POOL, /* x [N, C, ...] -> [N, C, 1, ...], the mean over every spatial dim */
    MS_OP_GROUP_NORM,      /* x [N, C, ...], weight [C], bias [C]; i[0] groups, f[0] eps */
    MS_OP_RESIZE,          /* x [N, C, L] or [N, C, H, W]; i[0] 0 nearest, 1 (bi)linear;
                            * output size i[1], i[2] or scale factors f[0], f[1] (0: as the
                            * first); PyTorch's interpolate, align_corners=False */
    MS_OP_TRAIN_SELECT,    /* a, b (one shape) -> a while training, b in evaluation (batch
                            * norm's batch or running statistics); gradient to a only */
    /* -- end pool -- */

    MS_OP_BUILTIN_COUNT
} ms_op_kind;

typedef struct ms_op_attrs {
    int64_t i[10];
    float f[4];
} ms_op_attrs;

typedef struct ms_shape {
    int ndim;
    int64_t d[MS_MAX_DIMS];
} ms_shape;

/* One way an op can run along one mesh dim. Placements here use only kind, dim and reduce;
 * nesting orders are assigned when the engine expands to N-d. */
typedef struct ms_rule_cand {
    ms_placement in[MS_OP_MAX_IN];
    ms_placement out[MS_OP_MAX_OUT];
} ms_rule_cand;

/* What a kernel sees: this rank's contiguous local tensors plus where they sit globally. */
typedef struct ms_op_call {
    const ms_op_attrs *attrs;
    int n_in, n_out;
    ms_tensor *in[MS_OP_MAX_IN];
    ms_tensor *out[MS_OP_MAX_OUT];
    const ms_shape *gin;                         /* global input shapes [n_in] */
    const ms_shape *gout;                        /* global output shapes [n_out] */
    int64_t in_start[MS_OP_MAX_IN][MS_MAX_DIMS]; /* box start of each input */
    int64_t out_start[MS_OP_MAX_OUT][MS_MAX_DIMS];
    const ms_placements *in_pl; /* N-d placements of the inputs as run */
    const ms_placements *out_pl;
    struct ms_dmesh *mesh;             /* for ops that communicate (vocab-parallel xent) */
    ms_tensor *saved[MS_OP_MAX_SAVED]; /* forward -> backward buffers, sized by saved_floats */
    /* backward only: gradients of outputs (read) and inputs (accumulated; NULL = not wanted) */
    ms_tensor *dout[MS_OP_MAX_OUT];
    ms_tensor *din[MS_OP_MAX_IN];
    /* backward only: bit i set when din[i] holds nothing yet (the program left it unzeroed):
     * the backward writes every element of din[i] instead of adding to it. Set only for the
     * inputs the op's fresh_ok names. */
    unsigned din_fresh;
    uint64_t seed;           /* dropout's key: the run seed and the training step */
    ms_k_batch_window batch; /* where the program's rows sit in the step's batch (dropout) */
    bool eval;               /* evaluation: dropout passes values through */
    ms_kctx *kc;             /* the rank's kernels: every tensor above is in kc->dev's memory */
} ms_op_call;

typedef struct ms_op_def {
    int kind; /* its ms_op_kind (built-ins); set on registration for user ops */
    const char *name;
    int n_in, n_out; /* < 0: variadic, up to -n (concat inputs, split outputs) */
    /* Output global shapes from input global shapes; errors name the op and the shapes. */
    ms_status (*infer)(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                       ms_error *err);
    /* Candidates along one mesh dim of `n` ranks; returns how many (R-everything first). */
    int (*rule)(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *out);
    /* Optional: whether N-d input placements are runnable beyond what the per-dim rule can
     * see (e.g. heads split over two mesh dims must still divide evenly). NULL = always. */
    bool (*valid)(const ms_op_attrs *a, int n_in, const ms_shape *in, const ms_placements *in_pl,
                  const int *mesh_shape);
    /* Floats to save for backward, per saved slot, from the local input shapes. */
    void (*saved_floats)(const ms_op_attrs *a, const ms_op_call *call, int64_t *sizes);
    ms_status (*forward)(ms_op_call *call, ms_error *err);
    ms_status (*backward)(ms_op_call *call, ms_error *err);
    /* Work of the local forward (backward = true: backward) for the call's local shapes. */
    ms_k_cost (*cost)(const ms_op_call *call, bool backward);
    /* Whether every kernel the op calls exists in table k. NULL: the op calls the CPU kernels
     * of kernels.h directly, so it runs on host memory only (the CPU device). An op that
     * sets it calls kernels through call->kc only, and never reads tensor memory itself. */
    bool (*runs_on)(const ms_kernels *k);
    /* Whether the op's kernels in table k take bf16 operands as they are (fp32 accumulation,
     * each output rounded once), so that a bf16 program hands its buffers over instead of
     * staging them through fp32. NULL: never. */
    bool (*runs_bf16_on)(const ms_kernels *k);
    /* Which inputs take gradients (bit i = input i). Integer inputs (ids, targets) do not. */
    unsigned grad_inputs;
    /* Which outputs hold integers (bit o = output o: indices), kept fp32 under bf16 precision
     * like every output of an op that passes no gradient. */
    unsigned int_outputs;
    /* Which inputs' gradients the backward can write whole instead of adding to (bit i =
     * input i; ms_op_call.din_fresh): the program then need not zero a gradient that this op
     * writes first. 0: the backward always adds. */
    unsigned fresh_ok;
} ms_op_def;

/* The table row of op id `op` (built-in or registered), or NULL. */
const ms_op_def *ms_op_get(int op);
int ms_op_count(void);
/* Looks up an op id by name; -1 if none. */
int ms_op_find(const char *name);

/* Registers a user operator; returns its id (>= MS_OP_BUILTIN_COUNT) in *id. Every slot
 * but saved_floats and cost is required. Not thread-safe: register before ranks start. */
ms_status ms_op_register(const ms_op_def *def, int *id, ms_error *err);

/* Checks that every built-in op fills every required slot (run by the tests). */
ms_status ms_ops_check(ms_error *err);

/* Duality for backward, per mesh dim: the placement the output gradient must have, and
 * the placement an input gradient comes out in, for the candidate the forward used. */
ms_placement ms_rule_dual_out(ms_placement out);
ms_placement ms_rule_dual_in(const ms_rule_cand *c, int n_in, int n_out, int i);

/* Helpers for writing rules. */
static inline ms_placement ms_R(void) {
    return ms_pl_replicate();
}
static inline ms_placement ms_S(int d) {
    return ms_pl_shard(d);
}
static inline ms_placement ms_Psum(void) {
    return ms_pl_partial(MS_REDUCE_SUM);
}

#endif

/* lm_layout.h - what the closed-form cost model knows of a built-in transformer (GPT-2, BERT,
 * LLaMA): one layer and the model's two ends as data, read off the builders (gpt.c for GPT-2
 * and BERT, llama.c for LLaMA) and the tensor-parallel rules (strategy.c). The planner
 * (engine/plan/cost.c) prices every built-in model from this one description, so the
 * differences between the families are the fields below, not code paths there; the family is
 * looked at here and nowhere outside engine/model. Models of other kinds (model.h defs without
 * `lm`) have no layout: the planner compiles their program instead.
 */
#ifndef MS_LM_LAYOUT_H
#define MS_LM_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model/config.h"

/* How tensor parallelism splits a linear layer's weight: by output columns (its output, and
 * its bias, sharded), by input rows (its output a partial sum, reduced over tp), or not at
 * all (every tp rank computes it whole: LLaMA's k and v when the kv heads do not divide tp). */
typedef enum ms_lm_split { MS_LM_COLUMN, MS_LM_ROW, MS_LM_WHOLE } ms_lm_split;

#define MS_LM_MAX_LINEAR 8

/* What follows a linear layer's product, as the builder runs it: its own bias op, or the bias
 * inside a fused operator: bias_gelu (the MLP's activation) or bias_dropout_add (dropout and
 * the residual add after an output projection). */
typedef enum ms_lm_fuse { MS_LM_FUSE_NONE, MS_LM_FUSE_GELU, MS_LM_FUSE_RESIDUAL } ms_lm_fuse;

/* x[tokens, k] @ W[k, n] (+ bias[n]), whole-model sizes. */
typedef struct ms_lm_linear {
    int64_t k, n;
    uint8_t split; /* ms_lm_split under tp */
    uint8_t fuse;  /* ms_lm_fuse: where the bias is added */
    bool bias;
    bool same_input; /* reads the previous linear's input (q, k, v; gate, up) */
} ms_lm_linear;

typedef struct ms_lm_layout {
    ms_model_type type;
    int64_t h, heads, kv_heads, head_dim;
    /* per layer */
    ms_lm_linear lin[MS_LM_MAX_LINEAR];
    int n_lin;
    int attn_at;       /* attention runs before lin[attn_at], the output projection */
    int norm_op;       /* MS_OP_LAYERNORM (weight and bias) or MS_OP_RMSNORM (weight) */
    int norm_params;   /* per norm, in units of h: 2 or 1 */
    int norms;         /* norms per layer */
    int act_op;        /* MS_OP_GELU on the up projection, or MS_OP_SWIGLU on gate and up */
    int64_t act_width; /* the activation's output width (4h, or intermediate_size) */
    bool causal;       /* decoder attention; BERT's is bidirectional */
    bool gqa;          /* q, k, v as separate projections (GQA op), rotary on q and k */
    bool linear_op;    /* projections are the fused LINEAR op (bias inside), not MATMUL + BIAS */
    bool kv_whole;     /* kv heads do not divide tp: every tp rank holds them all (the query
                        * heads still split), their gradients all-reduced */
    bool dropout;      /* resid_pdrop > 0: two dropouts per layer */
    /* the ends */
    int64_t vocab, pos_rows; /* learned position embedding rows (0: rotary positions) */
    bool emb_norm;           /* a norm after the embedding (BERT's embeddings.LayerNorm) */
    bool head_transform; /* BERT's MLM transform: dense h x h + GELU + LayerNorm, whole over tp */
    int64_t head_rows;   /* positions per sequence the head runs on: BERT's masked ones
                          * (gathered before it), else every one (0) */
    bool final_norm;     /* a norm before the head (GPT-2's ln_f, LLaMA's model.norm) */
    bool tied;           /* the head reads the token embedding */
    bool megatron_sp;    /* sp as Megatron-LM lays it out (LLaMA): each norm's output gathered
                          * to the column-parallel linears, each row-parallel output reduce-
                          * scattered; otherwise (GPT-2, BERT) the engine gathers the weights */
} ms_lm_layout;

/* Whether two configs build the same model (every field a layout or the engine reads). */
bool ms_lm_same_model(const ms_model_config *a, const ms_model_config *b);

/* The description of c's model under tensor parallelism tp, for sequences of seq tokens. */
void ms_lm_layout_of(const ms_model_config *c, int tp, int seq, ms_lm_layout *f);

/* Parameters of one layer: whole, and on one tp rank (sharded linears and their column
 * biases divided by tp, norms and row-parallel biases whole). */
double ms_lm_layout_layer_params(const ms_lm_layout *f, int tp);

/* Parameter tensors (each its own gradient collective without buckets): of one layer, of the
 * embedding's end and of the head's end (a tied head's table counted there too). */
int ms_lm_layout_layer_tensors(const ms_lm_layout *f);
int ms_lm_layout_first_tensors(const ms_lm_layout *f);
int ms_lm_layout_last_tensors(const ms_lm_layout *f);

/* The embedding's and the head's parameters on one tp rank: the token embedding (vocab-
 * parallel unless replicated), positions, norms, the MLM transform, an untied head. */
double ms_lm_layout_first_params(const ms_lm_layout *f, int tp, bool vocab_parallel);
double ms_lm_layout_last_params(const ms_lm_layout *f, int tp, bool vocab_parallel);

#endif

/* config.h - the model's shape and hyperparameters, from a Hugging Face-style config.json.
 *
 * "model_type": "llama" reads Hugging Face LlamaConfig keys instead (listed in docs/configs.md).
 * Accepts GPT-2 keys (n_layer, n_head, n_embd, vocab_size, n_positions) and their generic HF
 * aliases (num_hidden_layers, num_attention_heads, hidden_size, max_position_embeddings;
 * n_ctx for n_positions). Keys that would change the model are checked against the model
 * meshscope builds (activation_function must be a GELU, tie_word_embeddings true, ...); HF
 * keys that change nothing here (architectures, bos_token_id, ...) are ignored; any other key,
 * and any key given twice, is refused, so real HF files load but a typo cannot pass unseen
 * (docs/configs.md lists the keys). Every error names the file and the JSON path of the
 * offending value, and says how to fix it.
 */
#ifndef MS_CONFIG_H
#define MS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"

/* config.json larger than this is certainly not a config (guards against passing weights). */
#define MS_CONFIG_MAX_BYTES   (1u << 20)
#define MS_CONFIG_OP_NAME_MAX 48 /* "attention_op" and its NUL */

typedef enum ms_model_type { MS_MODEL_GPT2, MS_MODEL_BERT, MS_MODEL_LLAMA } ms_model_type;

typedef struct ms_model_config {
    ms_model_type model_type; /* "model_type": "gpt2" (default), "bert" or "llama" */
    int n_layer;
    int n_head;
    int n_embd; /* a multiple of n_head */
    int vocab_size;
    int n_positions;           /* the longest sequence the position embedding covers */
    double layer_norm_epsilon; /* default 1e-5 (BERT alias: layer_norm_eps) */
    double resid_pdrop;        /* dropout probabilities in [0, 1), default 0 */
    double attn_pdrop;
    double embd_pdrop;
    /* LLaMA only (Hugging Face LlamaConfig keys); layer_norm_epsilon holds rms_norm_eps */
    int n_kv_head;            /* num_key_value_heads: divides n_head (default n_head) */
    int intermediate_size;    /* the SwiGLU MLP's width */
    double rope_theta;        /* default 10000 */
    bool tie_word_embeddings; /* lm_head shares embed_tokens (default false) */
    /* "attention_op": a registered operator (ms_op_register) that replaces the built-in
     * gqa_attention: q [B, T, H, D], k, v [B, T, Hkv, D] -> [B, T, H, D], i[0] causal. Empty:
     * the built-in. Resolved by name when the model is built. */
    char attention_op[MS_CONFIG_OP_NAME_MAX];
} ms_model_config;

/* Reads and validates `path` (at most MS_CONFIG_MAX_BYTES). *out is written only on success. */
ms_status ms_config_load(const char *path, ms_model_config *out, ms_error *err);

/* The same from `len` bytes of JSON (need not be NUL-terminated). `name` stands for the file
 * in messages ("config.json" when NULL). */
ms_status ms_config_from_string(const char *json, size_t len, const char *name,
                                ms_model_config *out, ms_error *err);

/* Checks the invariants the parser enforces, for configs built in code. */
ms_status ms_config_validate(const ms_model_config *c, const char *name, ms_error *err);

/* Whether the output layer shares the token embedding (GPT-2, BERT; LLaMA when asked). */
bool ms_model_ties_embedding(const ms_model_config *c);

/* "gpt2", "bert" or "llama". */
const char *ms_model_type_name(ms_model_type t);

/* Parameter count of a GPT-2 with this config: token and position embeddings (the LM head is
 * tied to the token embedding), per block ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
 * mlp.c_proj with biases, and the final ln_f. GPT-2 small gives 124,439,808. */
int64_t ms_gpt2_param_count(const ms_model_config *c);

#endif

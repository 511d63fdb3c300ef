/* llama.h - the LLaMA decoder as a graph with Hugging Face tensor names.
 *
 * model.embed_tokens, per layer input_layernorm (RMSNorm), self_attn.{q,k,v,o}_proj (no bias;
 * grouped kv heads), rotary on q and k, causal attention, post_attention_layernorm,
 * mlp.{gate,up,down}_proj with SwiGLU, then model.norm and lm_head (or the tied embedding).
 * Projection weights keep their heads as a dim (q_proj.weight [H, D, C] here, [H*D, C] in the
 * file; o_proj.weight [C, H, D], [C, H*D] in the file), so tensor parallelism shards heads
 * without a reshape. ms_model_build dispatches here for "model_type": "llama". The attention
 * core is the built-in gqa_attention or, with the config's "attention_op", a user operator
 * registered under that name (same inputs and attributes; see docs/user-ops.md).
 */
#ifndef MS_LLAMA_H
#define MS_LLAMA_H

#include "engine/model/gpt.h"

/* A chunk of the LLaMA model into out->g (see ms_model_build_chunk, which checks the chunk and
 * the sizes first and reports the graph's errors); cfg->model_type is MS_MODEL_LLAMA. */
void ms_llama_build_chunk(const ms_model_config *cfg, int B, int T, const ms_model_chunk *ch,
                          ms_model *out);

/* Checks what the builder cannot: the config's "attention_op", when set, names a registered
 * operator taking q, k, v and giving one output. */
ms_status ms_llama_check(const ms_model_config *cfg, ms_error *err);

/* The checkpoint shape of a LLaMA projection weight; false when `name` is not one. */
bool ms_llama_checkpoint_shape(const char *name, const ms_shape *internal, ms_shape *file);

#endif

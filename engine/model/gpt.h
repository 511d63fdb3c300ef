/* gpt.h - model builders: a GPT-2 decoder (tied embeddings) and a BERT-style encoder with a
 * masked-LM head, as graphs with Hugging Face tensor names.
 *
 * Internal shapes differ from the checkpoint's only by a reshape of the same memory:
 * attn.c_attn.weight is [C, 3, C] here ([C, 3C] in the file) and attn.c_attn.bias [3, C]
 * ([3C]), so that sharding the last dim splits heads, not the q/k/v blocks.
 */
#ifndef MS_GPT_H
#define MS_GPT_H

#include "engine/graph/graph.h"
#include "engine/model/config.h"
#include "engine/model/model.h"

/* k, the positions BERT masks (and its head runs on) per sequence of T tokens: ceil(0.15 T);
 * 0 for the other families. */
int ms_model_mlm_positions(const ms_model_config *c, int T);

/* BERT's mask token: byte 0, which text never contains. */
#define MS_MLM_MASK_ID 0

/* Masked-LM inputs for a BERT batch: in each row exactly m->mlm_per_row positions, drawn
 * from Philox keyed by (seed, batch index, row), get the mask token in ids and keep their
 * original token as the target; every other target is -1 (ignored). ids and targets are
 * [B, T]; targets is written, ids rewritten in place. */
void ms_model_mlm_mask(const ms_model *m, uint64_t seed, uint64_t batch, int32_t *ids,
                       int32_t *targets);

/* The head's inputs for `rows` rows of full-length targets [rows, T] (-1: not predicted), as
 * floats to feed: GPT-2's targets as they are; for BERT each row's masked positions (the
 * targets >= 0, in order; a row with fewer than k pads with position 0 and target -1, which
 * the loss counts as 0) and their targets, [rows, k] each. targets_out or positions_out may
 * be NULL to skip it; positions_out is left alone for GPT-2. */
void ms_model_head_inputs(const ms_model *m, int rows, const int32_t *targets, float *targets_out,
                          float *positions_out);

/* Builds the model for batch B and sequence T. Errors name the problem (T > n_positions,
 * heads not dividing channels, ...). The model owns its graph. */
ms_status ms_model_build(const ms_model_config *cfg, int B, int T, ms_model *out, ms_error *err);
/* One chunk of it. Parameters keep their names (and so their initial values: they are keyed
 * by name), so the chunks of a model hold exactly its parameters, the tied word embedding
 * in both the first and the last chunk. The whole model is the chunk {0, n_layer, 1, 1}. */
ms_status ms_model_build_chunk(const ms_model_config *cfg, int B, int T, const ms_model_chunk *ch,
                               ms_model *out, ms_error *err);

/* The checkpoint shape of a parameter (Hugging Face layout) for its internal shape. */
void ms_model_checkpoint_shape(const char *name, const ms_shape *internal, ms_shape *file);

#endif

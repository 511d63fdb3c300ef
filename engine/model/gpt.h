/* gpt.h - model builders: a GPT-2 decoder (tied embeddings) and a BERT-style encoder with a
 * masked-LM head, as graphs with Hugging Face tensor names.
 *
 * Internal shapes differ from the checkpoint's only by a reshape of the same memory:
 * attn.c_attn.weight is [C, 3, C] here ([C, 3C] in the file) and attn.c_attn.bias [3, C]
 * ([3C]), so that sharding the last dim splits heads, not the q/k/v blocks.
 */
#ifndef MS_GPT_H
#define MS_GPT_H

#include "graph/graph.h"
#include "model/config.h"

typedef struct ms_model {
    ms_graph *g;
    int ids, targets, pos; /* inputs: token ids [B, T], targets [B, T], positions [B, T] */
    int loss;              /* mean cross-entropy, a scalar */
    int logits;            /* [B, T, V] */
    int B, T;
} ms_model;

/* Builds the model for batch B and sequence T. Errors name the problem (T > n_positions,
 * heads not dividing channels, ...). The model owns its graph. */
ms_status ms_model_build(const ms_model_config *cfg, int B, int T, ms_model *out, ms_error *err);
void ms_model_free(ms_model *m);

/* The checkpoint shape of a parameter (Hugging Face layout) for its internal shape. */
void ms_model_checkpoint_shape(const char *name, const ms_shape *internal, ms_shape *file);

#endif

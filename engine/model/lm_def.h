/* lm_def.h - the built-in language models (GPT-2, BERT, LLaMA) as model defs (model.h).
 *
 * Their inputs, per row of T tokens: input_ids [T], position_ids [T] (GPT-2 and BERT), and
 * targets [T] (GPT-2, LLaMA) or BERT's masked_lm_labels and masked_lm_positions [k]. prepare
 * makes them from a text source's fields "ids" and "targets": positions 0..T-1, and BERT's
 * masks drawn per (seed, batch, row) (ms_model_mlm_mask). The blocks are the transformer
 * layers; the tied word embedding is the parameter the first and last chunk share. */
#ifndef MS_LM_DEF_H
#define MS_LM_DEF_H

#include "engine/model/config.h"
#include "engine/model/model.h"

/* The def of cfg's model for sequences of seq tokens. cfg is borrowed: it must outlive the def
 * and its copies. */
ms_status ms_model_def_from_config(const ms_model_config *cfg, int seq, ms_model_def *out,
                                   ms_error *err);

/* Forward + backward flops per token of cfg's pieces at sequence length seq: one layer, the
 * first chunk's extra (the embeddings: lookups, no matmul) and the last's (the head and the
 * loss; BERT's head runs on the ceil(0.15 seq) masked positions of each sequence only). */
void ms_lm_block_costs(const ms_model_config *cfg, int seq, double *layer, double *first,
                       double *last);

#endif

/* balance.h - splitting a model's layers into pipeline chunks of even cost.
 *
 * Chunk 0 also runs the embedding and the last chunk the head and the loss, so an even count
 * of layers per chunk is not an even amount of work when the head is large (GPT-2's vocabulary
 * projection costs about four of its layers). The split minimises the costliest chunk, which
 * sets the pipeline's pace: every stage waits for the slowest one each micro-batch.
 */
#ifndef MS_PIPELINE_BALANCE_H
#define MS_PIPELINE_BALANCE_H

#include "engine/model/config.h"

/* What a chunk's pieces cost, in the same unit (forward + backward flops per token). */
typedef struct ms_pp_costs {
    double layer; /* one transformer layer */
    double first; /* what chunk 0 runs besides its layers: the embeddings */
    double last;  /* what the last chunk runs besides its layers: the head and the loss */
} ms_pp_costs;

/* Forward + backward flops per token of cfg's pieces at sequence length seq: the kernels'
 * matmuls and attention (the elementwise rest is a few percent and scales alike). BERT's head
 * runs on the ceil(0.15 seq) masked positions of each sequence (ms_model_mlm_positions), so
 * `last` is its cost on those rows spread over the sequence's tokens. */
ms_pp_costs ms_pp_model_costs(const ms_model_config *cfg, int seq);

/* Splits n_layer layers into `chunks` contiguous chunks (1 <= chunks <= n_layer) of at least
 * one layer each, minimising the costliest chunk under costs c; counts[chunks] receives the
 * layers per chunk. The even split is kept unless the balanced one is more than 2% cheaper at
 * its costliest chunk: cost estimates are not that precise, and an even split keeps chunks
 * alike. Pure. */
void ms_pp_balance_layers(int n_layer, int chunks, const ms_pp_costs *c, int *counts);

#endif

/* chunks.h - a pipeline's model chunks: which layers each holds, and its graph.
 *
 * A strategy with pp stages and v virtual stages cuts the model into pp x v chunks. Pure
 * functions of the config and the strategy: the trainer builds its stages from them
 * (engine/train/stages.h) and the planner compiles the same chunks from shapes
 * (engine/plan/engine_workload.c), so both see one split.
 */
#ifndef MS_PP_CHUNKS_H
#define MS_PP_CHUNKS_H

#include "engine/model/config.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"

/* Model chunk k's layers [*lo, *hi) under strategy s: pp_layers by hand, else pp x
 * virtual_stages chunks balanced by cost (engine/pipeline/balance.h: the head's chunk may hold
 * fewer layers). */
void ms_pp_chunk_layers(const ms_model_config *cfg, const ms_strategy *s, int k, int *lo, int *hi);
/* Model chunk k's graph for `rows` sequences of `seq` tokens, its boundary values (the
 * residual stream) annotated with the stream placements that every stage shares. Pure: the
 * planner compiles it from shapes. */
ms_status ms_pp_chunk_model(const ms_model_config *cfg, const ms_strategy *s, int rows, int seq,
                            int k, ms_model *md, ms_error *err);

#endif

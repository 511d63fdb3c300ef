/* chunks.h - a pipeline's model chunks: which blocks each holds, and its graph.
 *
 * A strategy with pp stages and v virtual stages cuts the model into pp x v chunks. Pure
 * functions of the model def and the strategy: the trainer builds its stages from them
 * (engine/train/stages.h) and the planner compiles the same chunks from shapes
 * (engine/plan/engine_workload.c), so both see one split. The _config forms are the built-in
 * language models' (engine/model/lm_def.h).
 */
#ifndef MS_PP_CHUNKS_H
#define MS_PP_CHUNKS_H

#include "engine/model/config.h"
#include "engine/model/gpt.h"
#include "engine/model/model.h"
#include "engine/model/strategy.h"

/* Model chunk k's blocks [*lo, *hi) under strategy s: pp_layers by hand, else pp x
 * virtual_stages chunks balanced by the def's block costs (engine/pipeline/balance.h: the
 * head's chunk may hold fewer blocks; equal costs without the hook). */
void ms_pp_chunk_layers_def(const ms_model_def *d, const ms_strategy *s, int k, int *lo, int *hi);
/* Model chunk k's graph for `rows` batch rows, its boundary values (what crosses a chunk
 * boundary) annotated with the placements every stage shares. Pure: the planner compiles it
 * from shapes. */
ms_status ms_pp_chunk_model_def(const ms_model_def *d, const ms_strategy *s, int rows, int k,
                                ms_model *md, ms_error *err);

/* The same for a built-in language model's config, sequences of `seq` tokens. */
void ms_pp_chunk_layers(const ms_model_config *cfg, const ms_strategy *s, int k, int *lo, int *hi);
ms_status ms_pp_chunk_model(const ms_model_config *cfg, const ms_strategy *s, int rows, int seq,
                            int k, ms_model *md, ms_error *err);

#endif

/* static_def.h - an eager step made a graph (engine/graph/static_graph.h) as a model def, so
 * the trainer gives it every strategy that keeps its batch (to_static).
 *
 * Its inputs are the recipe's named inputs, split over dp by rows (their first dim is the
 * batch); its parameters start from the values the eager run had; its shard hook places every
 * parameter and input as the eager step had them, on a mesh of as many dims (record on a dp x
 * tp mesh for the trainer's), and the operators' rules complete the rest. One block: no
 * pipeline cuts. A recorded step fixes its batch, so a micro-batched strategy is refused.
 *
 * Ownership: the def borrows the recipe, which must outlive it and its copies.
 */
#ifndef MS_STATIC_DEF_H
#define MS_STATIC_DEF_H

#include "engine/graph/static_graph.h"
#include "engine/model/model.h"

ms_status ms_model_def_from_static(const ms_static_graph *s, const char *name, ms_model_def *out,
                                   ms_error *err);

#endif

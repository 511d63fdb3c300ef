/* onnx_def.h - an ONNX model (engine/model/onnx_import.h) as a model def (model.h), so that
 * `meshscope train|eval|explain|plan --model model.onnx` trains it under any strategy.
 *
 * The def's inputs are the file's graph inputs with a symbolic batch dim (their rows; index
 * inputs are whole numbers); inputs without one are refused (name them as a batch or fold
 * them into the file). Its parameters are the float initializers under their ONNX names, with
 * the file's values as their initial values. The loss is the graph output named by
 * opts->loss, or else the file's only scalar output; anything else is refused with the
 * outputs listed. One block: an ONNX graph has no cut points a pipeline can use (pp 1).
 *
 * Ownership: the def's user pointer owns the parsed file; release it with
 * ms_model_def_onnx_free once no copy of the def is in use.
 */
#ifndef MS_ONNX_DEF_H
#define MS_ONNX_DEF_H

#include "engine/model/model.h"

typedef struct ms_onnx_def_opts {
    const char *loss; /* the graph output that is the loss; NULL: the only scalar output */
} ms_onnx_def_opts;

ms_status ms_model_def_from_onnx(const char *path, const ms_onnx_def_opts *opts, ms_model_def *out,
                                 ms_error *err);
void ms_model_def_onnx_free(ms_model_def *d);

#endif

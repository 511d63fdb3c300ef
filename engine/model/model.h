/* model.h - the model interface: what the engine takes, for any model.
 *
 * A model is an ms_model_def: a name, the named inputs one batch row carries, a number of
 * blocks (where a pipeline may cut: chunk k holds blocks [lo, hi), the first chunk also what
 * comes before block 0 and the last what comes after the last block, the loss included), and
 * hooks:
 * - build_chunk builds one chunk's graph for `rows` batch rows: inputs named as the def's
 *   inputs (shape [rows, sample shape...]), parameters under stable names (their checkpoint and
 *   trace names), a scalar loss (last chunk), and the residual stream that crosses a chunk
 *   boundary as "hidden_in" (an input, chunks after the first) and ms_model.hidden_out (chunks
 *   before the last). Parameters are keyed by name, so the chunks of a model hold exactly its
 *   parameters whatever the cut;
 * - shard (optional) is the placement hint: a parameter's or value's placements by name, tried
 *   after a strategy file's glob rules; without it parameters are replicated and the planner's
 *   rules complete the rest;
 * - prepare (optional) turns rows of a batch source's fields into the model's inputs (the
 *   built-in language models make positions and BERT's masks there); without it each input is
 *   the source's field of the same name and sample shape;
 * - block_costs (optional) weights the blocks for balancing pipeline chunks (equal without).
 *
 * Every input is split over data parallelism on its first (row) dim; a micro-batch is a row
 * range of every input alike. The trainer, the pipeline chunking, checkpoints, the switch, eval
 * and the views work from this interface; the built-in families (GPT-2, BERT, LLaMA) are defs
 * made by ms_model_def_from_config (engine/model/lm_def.c).
 *
 * Ownership: a def is a plain value (copy it); `user` and the strings the hooks return are the
 * def's maker's, and must outlive every copy.
 */
#ifndef MS_MODEL_H
#define MS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/data/batch_source.h"
#include "engine/graph/graph.h"

#define MS_MODEL_MAX_INPUTS 8
#define MS_MODEL_NAME_MAX   64

typedef struct ms_model {
    ms_graph *g;
    /* The def's inputs in this chunk (value ids in g, in the def's order; -1: not here). */
    int input[MS_MODEL_MAX_INPUTS];
    int loss;   /* the scalar loss (last chunk), else -1 */
    int logits; /* the output a sampler reads (language models), else -1 */
    /* A pipeline chunk's boundary: the activation input (chunks after the first) and output
     * (chunks before the last); -1 otherwise. */
    int hidden_in, hidden_out;
    /* The built-in language models' own: token ids, targets (BERT: the masked positions'
     * labels) and positions; BERT's k masked positions per row and their input; B and T. */
    int ids, targets, pos;
    int mlm_per_row;
    int mlm_pos;
    int B, T;
} ms_model;

/* Which blocks a pipeline chunk holds: [layer_lo, layer_hi), with what precedes block 0 when
 * first and what follows the last block (the loss) when last. */
typedef struct ms_model_chunk {
    int layer_lo, layer_hi;
    bool first, last;
    /* The reference fused operators are checked against (built-in models): every bias add,
     * GELU, dropout and residual add its own operator. */
    bool unfused;
} ms_model_chunk;

typedef struct ms_model_input {
    char name[MS_BATCH_NAME_MAX];
    int ndim; /* of one row (the batch dim not counted) */
    int shape[MS_MAX_DIMS];
    bool integer; /* ids, labels: whole numbers */
} ms_model_input;

typedef struct ms_model_def ms_model_def;
struct ms_strategy;

typedef struct ms_model_hooks {
    ms_status (*build_chunk)(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                             ms_model *out, ms_error *err);
    /* Placement hint for `name` (a parameter or a value) on a mesh of mesh_ndim dims under
     * strategy s (engine/model/strategy.h); false: no hint. */
    bool (*shard)(const ms_model_def *d, const struct ms_strategy *s, const char *name,
                  const ms_shape *shape, int mesh_ndim, ms_placements *pl);
    /* What the model itself asks of a strategy beyond the generic checks (the built-in models:
     * heads divisible by tp x cp, the sequence within the position table); NULL: nothing. */
    ms_status (*check)(const ms_model_def *d, const struct ms_strategy *s, ms_error *err);
    /* Rows of a batch: fields[f] holds `rows` rows of the source's field f, inputs[i] receives
     * rows rows of the def's input i. seed and batch key any randomness (BERT's masks). */
    ms_status (*prepare)(const ms_model_def *d, const ms_batch_source *src, uint64_t seed,
                         uint64_t batch, int rows, float *const *fields, float *const *inputs,
                         ms_error *err);
    /* The cost of one block and the extra of the first and the last chunk (the embedding; the
     * head and the loss), in one unit (flops per row, say). */
    void (*block_costs)(const ms_model_def *d, double *block, double *first, double *last);
    /* Opens the data file at `path` as this model's batch source (the built-in models:
     * byte-tokenized text); NULL: an array file (.npy, .npz or safetensors, see
     * engine/data/array_source.h) whose arrays are named as the inputs. */
    ms_status (*open_data)(const ms_model_def *d, const char *path, double val_fraction,
                           ms_batch_source **out, ms_error *err);
    /* What a run announces of the model ("12 layers, 12 heads, ..."); NULL: its blocks and
     * inputs. */
    void (*describe)(const ms_model_def *d, char *buf, size_t cap);
    /* A parameter's initial values from outside (an imported model's weights): fills full
     * (numel floats, the parameter's global shape) and returns true, or false to keep the
     * graph's own init (ms_init, keyed by name). NULL: every parameter keeps its init. */
    bool (*initial_value)(const ms_model_def *d, const char *param, float *full, int64_t numel);
} ms_model_hooks;

struct ms_model_def {
    char name[MS_MODEL_NAME_MAX]; /* "gpt2", "bert", "llama", or the user's model's */
    const ms_model_hooks *hooks;
    int n_blocks; /* >= 1 */
    int ninputs;
    ms_model_input inputs[MS_MODEL_MAX_INPUTS];
    /* A parameter the first and the last chunk both hold (tied embeddings), or "" */
    char tied[MS_MODEL_NAME_MAX];
    void *user;
    /* The built-in language models' config (lm_def.c), else NULL: borrowed, outlives the def */
    const struct ms_model_config *lm;
};

/* Floats per row of input i. */
int64_t ms_model_input_numel(const ms_model_def *d, int i);
/* Input named `name`, or -1. */
int ms_model_def_find_input(const ms_model_def *d, const char *name);

/* Checks the def itself: a name, a build hook, 1 <= n_blocks, 1 <= ninputs <= the maximum,
 * distinct non-empty input names, positive sample dims. The message names the def. */
ms_status ms_model_def_check(const ms_model_def *d, ms_error *err);

/* Checks that src can feed d: without a prepare hook each input needs a source field of the
 * same name and sample shape. The message names the input, the file and the fix. */
ms_status ms_model_def_check_source(const ms_model_def *d, const ms_batch_source *src,
                                    ms_error *err);

/* Builds chunk ch for `rows` rows through the hook, then fills out->input from the graph's
 * inputs by name and checks what the engine relies on: the last chunk sets a scalar loss,
 * every input named by the def that the graph has is [rows, sample shape...]. */
ms_status ms_model_def_build(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                             ms_model *out, ms_error *err);

/* The model's inputs for rows [0, rows) of a batch whose source rows are in fields (prepare, or
 * fields by name). */
ms_status ms_model_def_prepare(const ms_model_def *d, const ms_batch_source *src, uint64_t seed,
                               uint64_t batch, int rows, float *const *fields, float *const *inputs,
                               ms_error *err);

/* The model's data at `path`: the open_data hook, else an array file (val_fraction: the tail
 * kept for evaluation). The caller closes it (ms_batch_source_close). */
ms_status ms_model_def_open_data(const ms_model_def *d, const char *path, double val_fraction,
                                 ms_batch_source **out, ms_error *err);

/* One line on the model: the describe hook, else "N blocks; inputs x [16], label". */
void ms_model_def_describe(const ms_model_def *d, char *buf, size_t cap);

void ms_model_free(ms_model *m);

#endif

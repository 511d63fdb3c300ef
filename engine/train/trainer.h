/* trainer.h - one object that owns a rank's training: the model compiled for a strategy,
 * the optimizer state, the learning-rate schedule, the data cursor and the step counter.
 *
 * A step is AdamW with global-norm clipping and warmup + cosine decay over batch `step` of
 * the training split. Batch i is a pure function of (seed, i), so every strategy sees the
 * same data and a run that switches strategy equals one that ran the target throughout.
 *
 * Switching strategy and checkpointing share one view of the state: ms_trainer_state walks
 * every tensor the run carries from step to step (each parameter and its two Adam moments,
 * then each buffer: batch norm's running statistics) with its global shape, placements and
 * local buffer. A switch compiles the model for the
 * new mesh and moves every state tensor from the old boxes to the new ones.
 *
 * Offload (the strategy's offload, engine/train/offload.h): the moments and the fp32 master weights
 * of each optimizer shard live in host memory and AdamW runs on the host, overlapped with the next
 * step's forward unless the options say otherwise; the state tensors' moment boxes are then host
 * memory, the parameters' boxes stay on the device.
 *
 * ZeRO (the strategy's zero stage) is placements over dp: the moments of a parameter
 * replicated over dp are sharded there (S(0), nested innermost), each rank updates its shard
 * of the parameter and the shards are gathered back (stage 1); the gradients are
 * reduce-scattered into the same shards (stage 2); the parameters themselves are stored
 * sharded and gathered for each use inside the compiled program (stage 3). The state reports
 * those sharded placements and boxes, so a switch between any two stages or strategies is the
 * same move of boxes.
 *
 * Collective: create, step, evaluate, switch and sample are called by every rank of the world
 * at the same step with the same arguments.
 *
 * Ownership: ms_trainer_create returns a trainer that the caller destroys before ctx. The
 * trainer copies cfg, strategy, placement rules and options; it borrows `data` (may be NULL when no
 * step or evaluation runs), which must outlive it. Optimizer state lives on the rank's device, so
 * the device's counters (the memory views) include it, unless the options name another device
 * for it (ms_train_opts.optim_device).
 */
#ifndef MS_TRAINER_H
#define MS_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/data/dataset.h"
#include "engine/dist/dmesh.h"
#include "engine/graph/graph.h"
#include "engine/model/config.h"
#include "engine/model/gpt.h"
#include "engine/model/lm_def.h"
#include "engine/model/model.h"
#include "engine/data/batch_source.h"
#include "engine/model/strategy.h"
#include "engine/runtime/ctx.h"

/* What to do when a step's loss or gradient norm is not finite. */
typedef enum ms_on_nonfinite {
    MS_NONFINITE_STOP, /* fail the step with MS_ERR_DIVERGED, naming the step and the fix */
    MS_NONFINITE_SKIP  /* leave parameters and moments unchanged, count the skip, go on */
} ms_on_nonfinite;

typedef struct ms_train_opts {
    int batch, seq;      /* global rows per step and sequence length */
    int steps;           /* the schedule's horizon (total steps of the run) */
    int warmup;          /* warmup steps (may exceed steps: the rate then only ramps up) */
    uint64_t seed;       /* data order, masks and initial weights */
    double lr, min_lr;   /* peak and final learning rate */
    double weight_decay; /* AdamW's decoupled decay */
    double clip;         /* max global gradient norm; <= 0: no clipping */
    double beta1, beta2; /* 0: 0.9 and 0.95 */
    double eps;          /* 0: 1e-8 */
    bool keep_logits;    /* keep the logits (text sampling) */
    bool inference;      /* no optimizer state (eval, explain) */
    ms_on_nonfinite on_nonfinite;
    /* Where the optimizer state lives (borrowed; must outlive the trainer): NULL is the
     * rank's device; a host device is CPU offload, the same placements on another device. */
    ms_device *optim_device;
    /* Under the strategy's offload: run the host AdamW inside the step instead of overlapping
     * it with the next step's forward (engine/train/offload.h); the results are the same. */
    bool offload_serial;
} ms_train_opts;

/* Checks the options: positive sizes, lr >= min_lr >= 0, betas in [0, 1).
 * The message names the flag and the accepted range. */
ms_status ms_train_opts_check(const ms_train_opts *o, ms_error *err);

typedef struct ms_trainer ms_trainer;

/* Builds the model for cfg, compiles it for strategy s (with the explicit placement rules of
 * its strategy file, or NULL) on this rank and allocates the optimizer state (zeroed). The
 * strategy must pass the validator (engine/plan/validate.h) for the ctx's world and the
 * options' batch and sequence. The step counter starts at 0. */
ms_status ms_trainer_create(ms_ctx *ctx, const ms_model_config *cfg, const ms_strategy *s,
                            const ms_placement_rules *rules, const ms_train_opts *o,
                            const ms_text_data *data, ms_trainer **out, ms_error *err);
/* The same for any model (engine/model/model.h) fed by a batch source (borrowed; NULL when no
 * step or evaluation runs): the def is copied (what it borrows must outlive the trainer),
 * checked, and its inputs checked against the source's fields. ms_trainer_create is this with
 * the built-in model's def (engine/model/lm_def.h) over a text source of `data`. */
ms_status ms_trainer_create_def(ms_ctx *ctx, const ms_model_def *def, const ms_strategy *s,
                                const ms_placement_rules *rules, const ms_train_opts *o,
                                const ms_batch_source *src, ms_trainer **out, ms_error *err);
void ms_trainer_destroy(ms_trainer *t);

typedef struct ms_step_result {
    int64_t step;      /* the step that ran */
    float loss;        /* mean training loss of the batch */
    double grad_norm;  /* global gradient norm before clipping */
    double lr;         /* learning rate used */
    bool skipped;      /* non-finite, skipped (MS_NONFINITE_SKIP) */
    int64_t t_data_ns; /* when the batch was fed (the rest of the step followed) */
    int64_t t_optim_ns;
} ms_step_result;

/* One training step on batch `step` of the training split, then step += 1. With
 * MS_NONFINITE_STOP a non-finite loss or gradient norm fails with MS_ERR_DIVERGED and changes
 * nothing. */
ms_status ms_trainer_step(ms_trainer *t, ms_step_result *out, ms_error *err);

/* Mean loss over the first `batches` evaluation batches of a split (fewer if the split is
 * shorter; none is an error naming the data and the batch size). */
ms_status ms_trainer_evaluate(ms_trainer *t, ms_split split, int batches, double *loss,
                              ms_error *err);

/* Carries the run over to strategy `target` (with its placement rules, or NULL) at this step
 * boundary: validates it, compiles the model for the new mesh, moves every parameter, both Adam
 * moments and every buffer from the old placements to the new ones (send/recv of only what changes
 * hands), then swaps. The step, schedule and data cursor carry on. On failure the trainer is
 * unchanged; a target the job cannot take fails with MS_ERR_INVALID and the reason. A target t runs
 * already (ms_trainer_runs) changes nothing and moves nothing. */
ms_status ms_trainer_switch(ms_trainer *t, const ms_strategy *target,
                            const ms_placement_rules *rules, ms_error *err);

/* Whether t runs strategy s with exactly these placement rules (NULL: none) now: a switch
 * to it would change nothing. */
bool ms_trainer_runs(const ms_trainer *t, const ms_strategy *s, const ms_placement_rules *rules);

/* Generates n bytes after `prompt` from row 0's logits (temperature 0.8, Philox keyed by
 * seed): out (n + strlen(prompt) + 1 bytes) receives prompt and continuation. Needs
 * keep_logits. */
ms_status ms_trainer_sample(ms_trainer *t, const char *prompt, int n, uint64_t seed, char *out,
                            ms_error *err);

int64_t ms_trainer_step_index(const ms_trainer *t);
ms_ctx *ms_trainer_ctx(const ms_trainer *t);
/* Sets the next step to run (a resumed run). */
void ms_trainer_set_step(ms_trainer *t, int64_t step);
const ms_strategy *ms_trainer_strategy(const ms_trainer *t);
/* The placement rules it runs under (n = 0 and !no_hints: the model's own layout). */
const ms_placement_rules *ms_trainer_rules(const ms_trainer *t);
/* The built-in model's config, or NULL for other models. */
const ms_model_config *ms_trainer_config(const ms_trainer *t);
const ms_model_def *ms_trainer_def(const ms_trainer *t);
const ms_train_opts *ms_trainer_opts(const ms_trainer *t);
const ms_model *ms_trainer_model(const ms_trainer *t);
const ms_mesh *ms_trainer_mesh(const ms_trainer *t);
ms_dmesh *ms_trainer_dmesh(ms_trainer *t); /* the communicators of this rank's (stage) mesh */
ms_program *ms_trainer_program(ms_trainer *t);
int64_t ms_trainer_skipped(const ms_trainer *t);

/* --- the state: what a switch moves and a checkpoint saves -------------------------------- */

/* A buffer (ms_graph_buffer: batch norm's running statistics) is state that is not trained:
 * no moments, and the optimizer never touches it; its `param` is the buffer's name. */
typedef enum ms_state_kind {
    MS_STATE_PARAM,
    MS_STATE_ADAM_M,
    MS_STATE_ADAM_V,
    MS_STATE_BUFFER
} ms_state_kind;

typedef struct ms_state_tensor {
    const char *param; /* the parameter's (or buffer's) name (Hugging Face style) */
    ms_state_kind kind;
    ms_shape gshape;  /* global shape (internal layout, see ms_model_checkpoint_shape) */
    ms_placements pl; /* placements on the trainer's mesh */
    ms_dmesh *mesh;   /* borrowed */
    float *local;     /* this rank's box, n floats */
    size_t n;
    int lshape[MS_MAX_DIMS];
    int lndim;
} ms_state_tensor;

/* Offload with overlap leaves the last step's host update in flight, the parameters following
 * at their next use: this finishes it and brings every parameter onto the device (gathered).
 * Evaluation, sampling, switching, the state's full values and checkpoints call it themselves;
 * whoever reads state tensors' boxes directly calls it first. Collective; a no-op without
 * offload. */
ms_status ms_trainer_settle(ms_trainer *t, ms_error *err);

/* The number of state tensors: 3 per parameter (1 with `inference`), then 1 per buffer. The
 * list is the same on every rank: every parameter of the model as each pipeline chunk holds it
 * (the tied word embedding once per holder under pp), then every buffer as each chunk holds it,
 * on its stage's mesh; a rank outside that mesh gets no box (local NULL, n 0). */
int ms_trainer_num_state(const ms_trainer *t);
/* State tensor i, ordered parameter by parameter (param, m, v), then the buffers
 * (MS_STATE_BUFFER) in model order. */
void ms_trainer_state(ms_trainer *t, int i, ms_state_tensor *out);
/* After writing state tensors through their local boxes (a checkpoint load): under bf16
 * precision the parameters' bf16 use copies are rounded from the fp32 masters before the next
 * step. Every rank calls it alike. */
void ms_trainer_state_written(ms_trainer *t);
/* The activation memory of this rank's micro-batch slots as the run used them
 * (engine/train/stages.h). */
struct ms_stages_memory;
void ms_trainer_memory(const ms_trainer *t, struct ms_stages_memory *out);

/* The bytes of this rank's state as allocated: parameters and gradients as the programs store
 * them (ZeRO 3: the dp shard; 2: the gradients' shard), and the optimizer state on its device
 * (ZeRO >= 1: the dp shard). Micro-batched under ZeRO 2 and 3 the gradients also accumulate
 * whole before their reduce-scatter; those buffers are not counted here. Under bf16 precision
 * the parameters are the bf16 use copies and the gradients bf16, and the fp32 master weights
 * count with the optimizer state. */
typedef struct ms_trainer_bytes {
    double params, grads, optim;
    /* Offload (the strategy's offload): the optimizer's host memory, apart from the device's:
     * the fp32 master weights, both Adam moments and the staged gradient shards. optim then
     * counts what stays on the device (under bf16 the fp32 copy the bf16 cast reads). */
    double host_optim;
} ms_trainer_bytes;
void ms_trainer_state_bytes(ms_trainer *t, ms_trainer_bytes *out);

/* Loads state tensor i (a parameter or a buffer) from its full values where this rank holds it
 * (a no-op elsewhere): checkpoint loads. Every rank passes the same values. */
ms_status ms_trainer_load_param(ms_trainer *t, int i, const float *full, ms_error *err);
/* The full value of state tensor i on world rank 0 (an empty tensor elsewhere). Collective
 * over the world. */
ms_status ms_trainer_state_full(ms_trainer *t, int i, ms_tensor *out, ms_error *err);

#endif

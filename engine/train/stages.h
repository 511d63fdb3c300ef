/* stages.h - a rank's share of the model under a strategy: its pipeline chunks compiled on its
 * stage's mesh, the schedule that runs them, and the transfers between stages.
 *
 * Without pipeline parallelism (pp 1) a rank holds one chunk, the whole model, and a step is
 * m micro-batches (forward, then backward, gradients accumulating) and one gradient sync. With
 * pp p and v virtual stages the world is p stages of R = dp x tp x cp ranks (stage s is world
 * ranks s*R .. s*R + R-1), the model's layers are split into p*v chunks, rank s holds chunks
 * c*p + s (c < v), and the schedule (engine/pipeline/schedule.h) orders their forwards,
 * backwards and transfers.
 *
 * Transfers: the activation crossing a chunk boundary is the residual stream, placed alike on
 * every stage (the strategy's stream placement), so a transfer is one send of this rank's
 * local box to the rank at the same mesh position of the neighbouring stage. The schedule's
 * lists order the computes; the transfers run where the data flows: a compute posts the send
 * of what it made right after it (non-blocking, ms_ip2p) and receives its input right before
 * it, straight into its micro-batch's arena, so no stage waits for a receiver to arrive
 * (Megatron-LM's interleaved schedule overlaps its p2p the same way). What leaves after the
 * arena is free (the input gradient after B) goes through a small outbox of boundary-sized
 * buffers, reused as their sends complete. Peers and sizes are fixed when compiling.
 *
 * The tied word embedding: the first and the last chunk each hold a copy. After the gradient
 * sync, the two copies' gradients are summed by an all-reduce between the two stages
 * (Megatron's embedding group), so both take the same AdamW update and stay equal; the global
 * gradient norm counts the first copy only.
 *
 * Micro-batch j of a step is, on every data-parallel replica r, rows j*b .. j*b + b-1 of that
 * replica's share of the global batch (b = batch / (dp m)): the split the planner prices.
 *
 * Collective: create, step, forward and destroy are called by every world rank.
 * Ownership: the stages own their meshes, graphs, programs and buffers; ctx outlives them.
 */
#ifndef MS_STAGES_H
#define MS_STAGES_H

#include "engine/graph/graph.h"
#include "engine/model/model.h"
#include "engine/model/strategy.h"
#include "engine/pipeline/chunks.h"
#include "engine/runtime/ctx.h"

typedef struct ms_stages ms_stages;

typedef struct ms_stages_opts {
    int batch;     /* global rows per step */
    uint64_t seed; /* parameter init and dropout */
    bool keep_logits;
    /* bf16 with offload: the host device the fp32 masters live on (ms_compile_opts.master_host,
     * borrowed), else NULL */
    ms_device *master_host;
} ms_stages_opts;

/* Splits the model def (copied; what it borrows must outlive the stages) by strategy s (which must
 * pass the validator) and compiles this rank's chunks. */
ms_status ms_stages_create(ms_ctx *ctx, const ms_model_def *def, const ms_strategy *s,
                           const ms_placement_rules *rules, const ms_stages_opts *o,
                           ms_stages **out, ms_error *err);
void ms_stages_destroy(ms_stages *st);

/* Parameters written through their views (ms_program_params_written on every chunk). */
void ms_stages_params_written(ms_stages *st);

/* Training step `step`'s forwards and backwards over the global batch: inputs[i] holds the
 * model's input i for every row of it (identical on every rank), then the gradient sync and the
 * tied embedding's all-reduce. *loss receives the batch's mean loss on every rank. Dropout draws
 * the step's masks (ms_program_set_dropout). */
ms_status ms_stages_train(ms_stages *st, int64_t step, float *const *inputs, float *loss,
                          ms_error *err);
/* After the optimizer updated each parameter's optimizer shard: ZeRO 1 and 2 gather the
 * shards back into every chunk's parameters (ms_program_param_sync). */
ms_status ms_stages_param_sync(ms_stages *st, ms_error *err);
/* ms_stages_param_sync for local parameter i alone (ms_program_param_sync_one). */
ms_status ms_stages_param_sync_one(ms_stages *st, int i, ms_error *err);
/* Host masters: parameter i's master rounded for its next sync (ms_program_round_master). */
ms_status ms_stages_round_master(ms_stages *st, int i, struct ms_kctx *kc, ms_error *err);
/* fn(arg, i) runs before a training step's first read of local parameter i
 * (ms_program_on_param_use on every chunk; NULL removes it). */
void ms_stages_on_param_use(ms_stages *st, ms_param_use_fn fn, void *arg);
/* fn(arg, i) runs during a training step as soon as local parameter i's gradient is final
 * (ms_program_on_grad_final on every chunk; the tied embedding's copies after their
 * all-reduce, at the step's end). NULL removes it. */
void ms_stages_on_grad_final(ms_stages *st, ms_param_use_fn fn, void *arg);
/* This rank's parameters in the order a training step first reads them: chunk by chunk in
 * model order, within a chunk by first use. order receives ms_stages_num_params indices. */
void ms_stages_param_use_order(ms_stages *st, int *order);
/* Forward only (evaluation, sampling; dropout off): *loss as above. */
ms_status ms_stages_forward(ms_stages *st, float *const *inputs, float *loss, ms_error *err);

/* This rank's parameters over all its chunks, in chunk order, and whether each counts in the
 * global gradient norm (false for the last chunk's copy of the tied embedding). */
int ms_stages_num_params(const ms_stages *st);
ms_status ms_stages_param(ms_stages *st, int i, ms_param_view *out, bool *in_norm);

/* The local chunk holding the head (logits, loss), or -1 on other stages. */
int ms_stages_head_chunk(const ms_stages *st);
/* Broadcasts n floats from the head's stage (its first rank) to every rank. */
ms_status ms_stages_from_head(ms_stages *st, float *x, size_t n, ms_error *err);

/* The catalog: every parameter of the model as every chunk holds it, in model order (chunk
 * 0's, then chunk 1's, ...), the same list on every rank; the tied word embedding appears
 * once per holder. What switching and saving walk. */
typedef struct ms_stages_entry {
    const char *param; /* its name (borrowed from a graph of the stages) */
    ms_shape gshape;
    ms_placements pl;     /* on the holder's stage mesh: the stored parameter's */
    ms_placements opt_pl; /* its optimizer state's (ZeRO: sharded over dp) */
    ms_dmesh *mesh;       /* the holder's stage mesh (this rank may not be a member) */
    int model_chunk;
    int local_index; /* this rank's parameter index (ms_stages_param), or -1 if not ours */
} ms_stages_entry;
/* Made when the stages are (the other stages' chunks are compiled from shapes for it); *out
 * lives as long as st. Returns the number of entries. */
int ms_stages_catalog(const ms_stages *st, const ms_stages_entry **out);
/* The buffers' catalog (ms_graph_buffer: batch norm's running statistics), alike: every buffer
 * of the model as every chunk holds it, in model order, with opt_pl = pl and local_index this
 * rank's buffer index (ms_stages_buffer), or -1. */
int ms_stages_buffer_catalog(const ms_stages *st, const ms_stages_entry **out);
/* This rank's buffers over all its chunks, in chunk order. */
int ms_stages_num_buffers(const ms_stages *st);
ms_status ms_stages_buffer(ms_stages *st, int i, ms_buffer_view *out);
/* Writes local buffer i's box from the buffer's full values (ms_program_load_buffer). */
ms_status ms_stages_load_buffer(ms_stages *st, int i, const float *full, ms_error *err);

/* Writes local parameter i's shard from the parameter's full values. */
ms_status ms_stages_load_param(ms_stages *st, int i, const float *full, ms_error *err);

/* Activation memory as run: the arenas in this rank's pool (one per micro-batch unit held;
 * free ones are reused, so this is the most units held at once, a unit being one micro-batch
 * on one chunk), the schedule's bound for this stage, and the bytes of one arena (the largest
 * chunk's inputs, activations and temporaries). With a pipeline, what lives within one pass
 * (a forward's temporaries, a backward's working gradients, recompute's values made again)
 * may sit instead in one scratch that all micro-batches share (ms_compile_opts.inflight): an
 * arena then holds what crosses from a micro-batch's forward to its backward. */
typedef struct ms_stages_memory {
    int stage;
    int held, bound;
    double slot_bytes;       /* one arena */
    double scratch_bytes;    /* the shared scratch (0: none) */
    double activation_bytes; /* the arenas and the scratch allocated */
    double own_arena_bytes;  /* one micro-batch: the program's own arena, allocated with it */
} ms_stages_memory;
void ms_stages_memory_get(const ms_stages *st, ms_stages_memory *out);

int ms_stages_pp(const ms_stages *st);
int ms_stages_micro_batches(const ms_stages *st);
/* The stage mesh this rank belongs to. */
const ms_mesh *ms_stages_mesh(const ms_stages *st);
ms_dmesh *ms_stages_dmesh(ms_stages *st);
/* This rank's chunks: count, and each one's model and program. */
int ms_stages_num_chunks(const ms_stages *st);
const ms_model *ms_stages_model(const ms_stages *st, int c);
ms_program *ms_stages_program(ms_stages *st, int c);

#endif

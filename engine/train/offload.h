/* offload.h - ZeRO-Offload: a rank's optimizer on the host.
 *
 * With the strategy's `offload` the fp32 master weights and both Adam moments of each
 * parameter's optimizer shard (ZeRO's owned shard; the whole local shard without ZeRO) live in
 * host memory: pinned beside a GPU (ms_device_host_beside), plain elsewhere. A step then copies
 * each owned gradient shard device -> host, runs AdamW on the host (the CPU kernel table, on
 * host threads), copies the updated master shard host -> device into the parameter, and runs
 * the ZeRO gather as without offload. The same kernel in the same order: the run equals the one
 * without offload bit for bit wherever the device's own AdamW is the CPU's (cpu, fenced).
 *
 * Overlap (ZeRO-Offload's "one-step delayed" schedule, without the delay): the host updates of
 * step s run on a worker thread, parameter by parameter in the order step s+1 first reads
 * them (first stage, first layer first), and each publishes its readiness. Step s+1's program
 * waits for a parameter right before its first use (ms_stages_on_param_use), then copies it
 * onto the device and runs its own gather, so the host AdamW hides behind the next step's data
 * loading and forward. Nothing is read early: exact, not delayed.
 *
 * The gradients leave during backward (ZeRO-Offload's overlap of the copies with backward):
 * as soon as a parameter's owned gradient shard is final (after its bucket's collective,
 * ms_stages_on_grad_final) the rank thread hands it to the worker, which copies it to the host
 * while backward goes on (on a device that runs asynchronously, CUDA, the rank thread makes the
 * copy itself, ordered after the kernels that wrote the gradient). When nothing global stands
 * between the gradients and the update (no clipping by the global norm, no skipping of non-finite
 * steps: ms_offload_begin_step given the step's AdamW options) the worker runs the parameter's
 * AdamW right after its copy, during backward too; otherwise the updates start at
 * ms_offload_update, once the norm is known. The copies and updates are on the "optimizer (host)"
 * lane at the times they ran.
 *
 * Collective: ms_offload_update and ms_offload_settle are called by every rank of the world at
 * the same point (the gathers are collectives over dp).
 *
 * Under bf16 the program holds the masters in host memory itself (ms_param_view.host_master,
 * ms_compile_opts.master_host): the host AdamW updates them in place and rounds each into its
 * bf16 shard at once, and the parameter sync copies that up; nothing fp32 stays on the device.
 * Ownership: the offload owns the masters, the staged gradients, its host kernel context and
 * its worker thread; it borrows the device, the host device, the stages and the moments, which
 * outlive it (the trainer destroys it first).
 */
#ifndef MS_OFFLOAD_H
#define MS_OFFLOAD_H

#include <stdbool.h>

#include "engine/optim/optim.h"
#include "engine/runtime/ctx.h"
#include "engine/train/stages.h"

typedef struct ms_offload ms_offload;

/* For the parameters of st: m[i] and v[i] are parameter i's moments (opt_n floats each) in
 * host memory of `host`; the masters are read from the device at the first update. overlap
 * runs the updates on a worker thread (see above). */
ms_status ms_offload_create(ms_ctx *ctx, ms_device *host, ms_stages *st, float **m, float **v,
                            bool overlap, ms_offload **out, ms_error *err);
/* Joins the worker (after the update it runs, if any). NULL is a no-op. */
void ms_offload_destroy(ms_offload *o);

/* A training step begins (before its forward): aw, when not NULL, is its AdamW (gradient scale
 * 1), which the worker may then run as each gradient arrives; NULL: the update waits for
 * ms_offload_update. Waits for the last step's gradient copies (the step zeroes the gradients).
 * Without overlap nothing happens during backward and this does nothing. */
ms_status ms_offload_begin_step(ms_offload *o, const ms_adamw_opts *aw, int64_t t, ms_error *err);
/* Step t's update of every owned shard with AdamW options aw and gradient scale `scale`: the
 * gradients are on the host when it returns; without overlap so are the updated parameters
 * (gathered), with overlap they follow by ms_offload_settle or their next use. After an eager
 * ms_offload_begin_step, aw, t must be the ones given there and scale 1. */
ms_status ms_offload_update(ms_offload *o, const ms_adamw_opts *aw, int64_t t, float scale,
                            ms_error *err);
/* Waits for the update in flight and brings every parameter it changed onto the device (and
 * gathers it): what anything that reads parameters or moments outside a step runs first. */
ms_status ms_offload_settle(ms_offload *o, ms_error *err);
/* The parameters on the device were written (a checkpoint load, a switch): the masters are
 * read again before the next update. Call it settled. */
void ms_offload_params_written(ms_offload *o);

/* Host bytes it holds: the fp32 master weights it allocated (not the program's host masters)
 * and the staged gradients (the moments are the trainer's, on the same host device). */
double ms_offload_master_bytes(const ms_offload *o);
double ms_offload_staging_bytes(const ms_offload *o);

#endif

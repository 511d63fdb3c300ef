/* grad_buckets.h - gradient buckets (private to engine/graph): the all-reduces (or ZeRO's
 * reduce-scatters) that move a program's parameter gradients into their placements (the
 * data-parallel P(sum) -> R, or -> S(0)), grouped in the order backward finishes the gradients into
 * buckets of at most a given size, each all-reduced with one non-blocking call as soon as backward
 * has produced its last gradient, so that the reduction runs while backward computes the rest.
 *
 * The program describes every bucketed gradient once, in the order it becomes final
 * (ms_gb_add: the instruction after which it is final, its size, the mesh dim and reduce op),
 * then binds the memory (ms_gb_bind, ms_gb_bind_storage). Running: after each backward
 * instruction ms_gb_after copies the gradients final there into their bucket's slot of one
 * contiguous buffer and issues the bucket's all-reduce when it is full; at grad sync
 * ms_gb_finish waits for a gradient's bucket and copies the reduced values to the parameter's
 * gradient. A gradient counts as final after `passes` runs of its instruction (the
 * micro-batches of a step: it accumulates until the last one).
 *
 * Buckets never mix mesh dims, reduce ops or kinds (one communicator, op and collective per
 * call); a gradient larger than the bucket size gets a bucket of its own. A reduce-scatter
 * bucket (ZeRO 2 and 3) packs every member's blocks together, so each receives its shards.
 * Gradients are float32 or bf16 (ms_gb_add_dt); a bucket holds one type, and bf16 buckets are
 * reduced by the communicator's bf16 reductions (fp32 in rank order, rounded once), moving half
 * the bytes. Sizes: the bucket cap is in bytes; gradient sizes are in elements of their type.
 * Device memory: the gradients and the storage are on the rank's device, the one its
 * communicators were given (ms_comm_set_device): packing and unpacking are that device's copies
 * (the host's when a communicator has none), and the collectives stage what their backend
 * cannot address (comm.h).
 * Ownership: the program owns the buckets; the storage is the program's (from its device);
 * ms_gb_destroy waits for any all-reduce still in flight, so nothing writes into freed memory.
 */
#ifndef MS_GRAD_BUCKETS_H
#define MS_GRAD_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/core/status.h"

typedef struct ms_grad_buckets ms_grad_buckets;

/* bucket_mb > 0: the largest bucket in MiB; passes >= 1: backward runs per step. */
ms_grad_buckets *ms_gb_create(double bucket_mb, int passes);
void ms_gb_destroy(ms_grad_buckets *gb);

/* Appends a gradient final after instruction `ready` (not before the previous one's):
 * n elements of dt (MS_COMM_F32 or MS_COMM_BF16) reduced with op over mesh dim `mesh_dim`:
 * all-reduced (parts 0), or reduce-scattered over the dim's `parts` members, member c keeping
 * block c of the `rows` leading rows under the balanced split (ZeRO 2 and 3: the gradient
 * sharded S(0) innermost). Returns its index. */
int ms_gb_add_dt(ms_grad_buckets *gb, int ready, int64_t n, int64_t rows, int parts, int mesh_dim,
                 ms_reduce_op op, ms_comm_dtype dt);
/* The same for n floats (MS_COMM_F32). */
int ms_gb_add(ms_grad_buckets *gb, int ready, int64_t n, int64_t rows, int parts, int mesh_dim,
              ms_reduce_op op);
int ms_gb_count(const ms_grad_buckets *gb);   /* gradients */
int ms_gb_buckets(const ms_grad_buckets *gb); /* buckets */
int ms_gb_bucket_of(const ms_grad_buckets *gb, int i);
/* Bytes of the contiguous buffer behind every bucket (and the reduce-scatters' results), and
 * the same in 4-byte units (exact: the size is a multiple of 4), for callers that size it in
 * floats. The buffer must be at least float-aligned. */
size_t ms_gb_storage_bytes(const ms_grad_buckets *gb);
size_t ms_gb_storage_floats(const ms_grad_buckets *gb);

/* Gradient i's accumulated gradient (src), the parameter's (dst: its shard when scattered),
 * both elements of the gradient's type, and its communicator; then, once every gradient is
 * bound, the storage. */
void ms_gb_bind(ms_grad_buckets *gb, int i, const void *src, void *dst, ms_comm *comm);
void ms_gb_bind_storage(ms_grad_buckets *gb, void *storage);

/* After instruction k ran: packs the gradients final at k and issues full buckets. */
ms_status ms_gb_after(ms_grad_buckets *gb, int k, ms_error *err);
/* At grad sync: waits for gradient i's bucket and copies its reduced values to dst. */
ms_status ms_gb_finish(ms_grad_buckets *gb, int i, ms_error *err);
/* Gradient i's reduced values are in its dst: final for this step. */
typedef ms_status (*ms_gb_done_fn)(void *arg, int i, ms_error *err);
/* During backward: completes every bucket whose collective is over (ms_comm_test), copies its
 * gradients' reduced values to their dst at once and calls done for each, so that a consumer
 * (the host optimizer) takes them while backward goes on. ms_gb_finish then only counts them.
 * The dst must not be written by anything else before grad sync (the parameters' gradients:
 * persistent, written only there). */
ms_status ms_gb_poll(ms_grad_buckets *gb, ms_gb_done_fn done, void *arg, ms_error *err);
/* A new step's accumulation (ms_program_zero_grads): counts start again. */
void ms_gb_reset(ms_grad_buckets *gb);

#endif

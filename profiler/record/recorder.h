/* recorder.h - per-rank event recording: a preallocated ring that the rank writes without
 * locks or allocation, and that other threads (analysis, the views) read concurrently.
 *
 * Writer: exactly one thread, the rank's. ms_recorder_push never blocks: when the ring is
 * full it overwrites the oldest event and counts the drop. With tracing off the recorder
 * pointer is NULL and every hook is one branch (ms_recorder_on).
 * Readers: any thread, any time, through a cursor; a reader that falls behind by more than
 * the capacity skips what was overwritten and learns how many it missed.
 *
 * Ownership: the recorder owns its ring and its group table; it is created by whoever
 * starts a traced run and outlives the rank context that points at it.
 */
#ifndef MS_RECORDER_H
#define MS_RECORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/event.h"

typedef struct ms_recorder ms_recorder;

/* capacity: events in the ring (rounded up to a power of two, 2 .. 2^26). The ring is
 * allocated here, once; MS_ERR_NOMEM if that fails. */
ms_status ms_recorder_create(int rank, size_t capacity, ms_recorder **out, ms_error *err);
void ms_recorder_destroy(ms_recorder *r);

static inline bool ms_recorder_on(const ms_recorder *r) {
    return r != NULL;
}

/* Appends ev (its rank and step fields are filled from the recorder). Writer thread only. */
void ms_recorder_push(ms_recorder *r, const ms_event *ev);
/* The same, keeping ev's own rank and step: for events recorded elsewhere (GPU activity from
 * another recorder) that this writer passes on. */
void ms_recorder_push_as(ms_recorder *r, const ms_event *ev);

/* The training step stamped on later events. Writer thread only. */
void ms_recorder_set_step(ms_recorder *r, int64_t step);
int64_t ms_recorder_step(const ms_recorder *r);

/* Registers a communicator group and returns its id (idempotent per name + ranks; g->id is
 * ignored). The id is a hash of the name, size and ranks, so the same group gets the same id
 * on every rank and gathered tables merge by id; a (rare) clash with a different group in
 * this table is resolved by probing to the next free id. Returns -1 when the table
 * (MS_REC_MAX_GROUPS) is full or g is invalid. Any thread; takes a mutex (registration is
 * rare and off the push path). */
#define MS_REC_MAX_GROUPS 512
int32_t ms_recorder_group(ms_recorder *r, const ms_group *g);
/* Copies the group table (at most max) into out; returns the number of groups. */
int ms_recorder_groups(const ms_recorder *r, ms_group *out, int max);

/* Reads events newer than *cursor (start with 0) into out, at most max, oldest first, and
 * advances the cursor. *missed (may be NULL) receives how many were overwritten before this
 * reader saw them. Any thread, concurrently with the writer: every event returned is whole
 * (a slot rewritten during the copy is detected and counted as missed, never returned
 * torn). Lock-free; never waits for the writer. */
size_t ms_recorder_read(const ms_recorder *r, uint64_t *cursor, ms_event *out, size_t max,
                        uint64_t *missed);

/* Events pushed so far (the write counter: cursors count in the same numbers), and how many
 * were overwritten because the ring was full (pushed - capacity, whether or not a reader had
 * already seen them; readers learn what they themselves lost through `missed`). Any thread. */
uint64_t ms_recorder_pushed(const ms_recorder *r);
uint64_t ms_recorder_dropped(const ms_recorder *r);
int ms_recorder_rank(const ms_recorder *r);

#endif

/* gpu_attribute.h - which rank and step each piece of GPU activity belongs to.
 *
 * CUPTI delivers GPU activity late (when its buffers fill or are flushed) to one collector per
 * process, whose recorder stamps it with its own rank and whatever step is current then. The
 * truth is in the correlation id (event.h): an operator that launched GPU work bracketed it
 * with the id (rank << 40 | counter), and its own event carries the same id and the step it
 * ran in. So each correlated piece takes the rank and step of its operator; one without a
 * correlation (a copy the device made outside any operator) keeps its rank and takes the step
 * whose span on that rank contains its start (-1 if none does).
 */
#ifndef MS_GPU_ATTRIBUTE_H
#define MS_GPU_ATTRIBUTE_H

#include <stddef.h>

#include "engine/core/event.h"

/* Rewrites rank and step of every GPU activity event in ev[0..n) (ms_ev_op.gpu != NONE);
 * engine events are left alone. O(n log n); allocates scratch (on failure it leaves ev as it
 * was and returns -1; else the number of events it changed). */
long ms_gpu_attribute(ms_event *ev, size_t n);

#endif

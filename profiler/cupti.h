/* cupti.h - GPU activity from CUPTI (the NVIDIA profiling interface Kineto uses), turned into
 * meshscope events: kernels, memcpys, memsets, runtime/driver API calls and synchronizations
 * become MS_EV_OP spans on the rank's time axis (ms_now_ns, CLOCK_MONOTONIC).
 *
 * Threads. CUPTI hands filled activity buffers to a callback on a thread of its own (or on
 * whichever thread calls cuptiActivityFlushAll). That callback only queues the buffer: it
 * takes one short lock and never calls CUPTI while holding it. Buffers are parsed and turned
 * into events by the collector's flush thread (every flush_ms), by ms_cupti_flush and by
 * ms_cupti_stop, one at a time under the collector's drain lock. So the recorder given to
 * ms_cupti_start has exactly one writer at any moment, and it is never the rank's thread:
 * give the collector its own recorder (e.g. ms_recorder_create(rank, ...) per GPU), not the
 * rank's, whose single writer is the rank's thread.
 *
 * Correlation. The engine brackets the GPU work of one operator with
 * ms_cupti_push_correlation(op id) / ms_cupti_pop_correlation(); CUPTI tags every API call
 * made in between (and, through its correlation id, the kernel or copy it launched) with
 * that id, which the event carries in ms_ev_op.corr, with the GPU activity's kind, device and
 * stream. Ids must be non-zero: 0 means "not launched inside a pushed region".
 *
 * Time. CUPTI timestamps are nanoseconds on CUPTI's own clock. The collector measures the
 * offset to ms_now_ns at start (the tightest of 16 bracketed reads, Cristian style) and
 * re-checks it at every drain, adopting a new value only when it moved by more than 1 us
 * (so that wall-clock slewing is followed without jittering adjacent spans).
 *
 * Not-yet-complete work: a record is delivered only once CUPTI has all its timestamps.
 * Synchronize the device (cudaDeviceSynchronize) before ms_cupti_flush / ms_cupti_stop when
 * every launched kernel must appear; ms_cupti_stop force-flushes, and records still
 * incomplete then are dropped (counted in ms_cupti_stats.incomplete).
 *
 * One collector per process (CUPTI allows one activity subscriber; older drivers refuse a
 * second tool such as Nsight Systems, and ms_cupti_start then says so).
 */
#ifndef MS_CUPTI_H
#define MS_CUPTI_H

#include <stdint.h>

#include "engine/core/status.h"
#include "profiler/record/recorder.h"

/* Counters since the last ms_cupti_start; any thread. */
typedef struct ms_cupti_stats {
    uint64_t buffers;             /* activity buffers CUPTI completed */
    uint64_t records;             /* activity records parsed */
    uint64_t events;              /* events pushed into the recorder */
    uint64_t cupti_dropped;       /* records CUPTI dropped (it had no buffer for them) */
    uint64_t incomplete;          /* records without timestamps (still running at a forced flush) */
    uint64_t buffer_failures;     /* buffer allocations that failed (CUPTI drops records then) */
    int64_t clock_offset_ns;      /* ms_now_ns() - CUPTI time, as last adopted */
    int64_t clock_uncertainty_ns; /* half the best bracketing round trip */
} ms_cupti_stats;

#ifdef MS_HAVE_CUPTI

/* Starts collecting into gpu_rec (see "Threads" above: a recorder of its own) and flushes
 * every flush_ms milliseconds (1 .. 60000; ~100 keeps live views current at little cost).
 * MS_ERR_UNSUPPORTED, with the reason, when there is no driver or GPU, when CUPTI refuses
 * (insufficient privileges, another profiler attached, version mismatch), so callers can run
 * without GPU tracing. MS_ERR_INVALID if a collector is already running. */
ms_status ms_cupti_start(ms_recorder *gpu_rec, int flush_ms, ms_error *err);

/* Asks CUPTI for the buffers whose records are complete and turns them into events now
 * (what the flush thread does on its timer). Any thread; no-op when not running. */
ms_status ms_cupti_flush(ms_error *err);

/* Stops the flush thread, disables the activity kinds, force-flushes and drains what is
 * left. After it returns nothing writes gpu_rec any more. No-op when not running. */
void ms_cupti_stop(void);

/* Brackets GPU work launched by the calling thread with an external correlation id (CUPTI's
 * CUSTOM0 kind). Cheap no-ops when no collector runs; pops match pushes per thread even if
 * the collector stopped in between. */
void ms_cupti_push_correlation(uint64_t id);
void ms_cupti_pop_correlation(void);

void ms_cupti_get_stats(ms_cupti_stats *out);

#else /* !MS_HAVE_CUPTI: the same API, so that callers need no #ifdef of their own */

#ifdef MS_HAVE_CUDA
#define MS_CUPTI_MISSING "CUDA, but its toolkit had no CUPTI when it was configured"
#else
#define MS_CUPTI_MISSING "no CUDA"
#endif

static inline ms_status ms_cupti_start(ms_recorder *gpu_rec, int flush_ms, ms_error *err) {
    (void)gpu_rec, (void)flush_ms;
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "GPU tracing needs a build with CUDA and CUPTI (this build has %s)",
                   MS_CUPTI_MISSING);
}
static inline ms_status ms_cupti_flush(ms_error *err) {
    (void)err;
    return MS_OK;
}
static inline void ms_cupti_stop(void) {}
static inline void ms_cupti_push_correlation(uint64_t id) {
    (void)id;
}
static inline void ms_cupti_pop_correlation(void) {}
static inline void ms_cupti_get_stats(ms_cupti_stats *out) {
    *out = (ms_cupti_stats){0};
}

#endif

#endif

/* device.h - the device interface: where tensor memory lives and how bytes move.
 *
 * One struct of function pointers per backend (CPU now, CUDA when built and present), so
 * callers allocate through ms_device_* and never know which one they hold. Each device
 * counts its bytes in use and the peak, which the profiler reports as memory per rank.
 *
 * Ownership: ms_device_alloc returns memory owned by the caller, released with
 * ms_device_free on the same device. Devices themselves are created per rank and freed
 * with ms_device_destroy.
 *
 * Streams and marks: a device object is one rank's queue of work. On CUDA it owns one
 * blocking compute stream: every kernel context made on it (engine/kernels/backend.h) launches
 * there, and the device's own copies, zeroing and box copies run there too, so kernels and
 * copies keep the order the rank issued them in. A mark (ms_device_mark_record) is a point in
 * that queue, an event; a consumer with a stream of its own (NCCL) waits for it on that stream
 * (ms_device_mark_wait) without blocking the host. Marks belong to the device that recorded
 * them and go back to it (ms_device_mark_release), before the device is destroyed.
 */
#ifndef MS_DEVICE_H
#define MS_DEVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"

#define MS_TENSOR_ALIGN    64 /* bytes: one cache line, and what AVX-512 loads want */
#define MS_DEVICE_MAX_DIMS 8  /* the most dims a box copy takes (MS_MAX_DIMS of tensor.h) */

/* MS_DEVICE_FENCED is the CPU with its memory fenced off from host code: its addresses carry
 * MS_DEVICE_FENCE_TAG, which makes them non-canonical, so host code that dereferences one
 * faults at once, while its kernels (engine/kernels/backend.h) and copies remove the tag.
 * A GPU's memory behaves the same way towards the host, so a run on the fenced device proves,
 * on a machine without a GPU, that the host never touches device memory outside the kernel
 * interface and the device's copies. */
typedef enum ms_device_kind {
    MS_DEVICE_CPU,
    MS_DEVICE_CUDA,
    MS_DEVICE_FENCED,
    MS_DEVICE_KIND_COUNT
} ms_device_kind;

#define MS_DEVICE_FENCE_TAG ((uintptr_t)1 << 62)

typedef enum ms_copy_dir {
    MS_COPY_HOST_TO_DEVICE,
    MS_COPY_DEVICE_TO_HOST,
    MS_COPY_DEVICE_TO_DEVICE,
} ms_copy_dir;

typedef struct ms_device ms_device;
/* A point in a device's queue of work (CUDA: an event on its compute stream). Opaque: each
 * backend casts its own type. */
typedef struct ms_device_mark ms_device_mark;

/* Backend slots. All are required but sync and the three mark slots. */
typedef struct ms_device_ops {
    const char *name;
    ms_device_kind kind;
    /* Returns MS_TENSOR_ALIGN-aligned memory of at least nbytes, or MS_ERR_NOMEM. */
    ms_status (*alloc)(ms_device *dev, size_t nbytes, void **out, ms_error *err);
    void (*free)(ms_device *dev, void *ptr);
    ms_status (*copy)(ms_device *dev, void *dst, const void *src, size_t nbytes, ms_copy_dir dir,
                      ms_error *err);
    ms_status (*memset_zero)(ms_device *dev, void *dst, size_t nbytes, ms_error *err);
    /* Copies the box [src_start, src_start + len) of a row-major array of shape src_shape
     * into the array of shape dst_shape at dst_start; both arrays in this device's memory,
     * elements of `elt` bytes, `ndim` dims (0: one element). Reshards pack and unpack with it. */
    ms_status (*copy_box)(ms_device *dev, void *dst, const int64_t *dst_shape,
                          const int64_t *dst_start, const void *src, const int64_t *src_shape,
                          const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                          ms_error *err);
    /* Whether ptr is memory of this device that the host cannot dereference: the
     * communicators stage exactly such buffers through host memory (comm.h). The CPU: never;
     * the fenced device: the tag is set; CUDA: the runtime says device memory. */
    bool (*owns)(const ms_device *dev, const void *ptr);
    /* Optional (NULL: the device runs nothing asynchronously): waits until all work queued on
     * the device, on any stream, has finished. */
    ms_status (*sync)(ms_device *dev, ms_error *err);
    /* Optional, all three or none (none: ms_device_mark_record syncs instead). mark_record:
     * a mark after every kernel and copy queued on this device object so far, by any thread.
     * mark_wait: makes `stream`, a queue of the device's native kind that is not the device's
     * own (CUDA: a cudaStream_t), wait for the mark's work before whatever it runs next; the
     * host does not wait. mark_release: the mark goes back to the device (its pool); a mark
     * may be released as soon as the waits for it are queued. */
    ms_status (*mark_record)(ms_device *dev, ms_device_mark **out, ms_error *err);
    ms_status (*mark_wait)(ms_device *dev, const ms_device_mark *mark, void *stream, ms_error *err);
    void (*mark_release)(ms_device *dev, ms_device_mark *mark);
    /* Whether the kernel contexts made on this device add their launches to `work` (the
     * fenced device, whose marks are counts of work: see ms_device_fenced_mark_work). */
    bool counts_work;
    void (*destroy)(ms_device *dev);
} ms_device_ops;

struct ms_device {
    const ms_device_ops *ops;
    void *impl;           /* backend state */
    int ordinal;          /* CUDA device number; 0 for the CPU */
    uintptr_t addr_tag;   /* MS_DEVICE_FENCE_TAG on the fenced device, else 0 */
    atomic_size_t in_use; /* bytes currently allocated through this device */
    atomic_size_t peak;   /* high-water mark of in_use */
    atomic_size_t limit;  /* 0, or the most in_use may reach (ms_device_set_limit) */
    /* Where ops->counts_work: kernel launches and copies queued on this device so far. */
    _Atomic uint64_t work;
};

/* A CPU device. Never fails except for memory. */
ms_status ms_device_cpu_create(ms_device **out, ms_error *err);

/* A fenced CPU device (see MS_DEVICE_FENCED). Never fails except for memory. Its marks let
 * the host check the ordering a GPU needs: a mark holds the device's `work` count when it was
 * recorded, so a consumer can tell which launches and copies it covers; waiting for one checks
 * that it is this device's and covers no work that was never queued. */
ms_status ms_device_fenced_create(ms_device **out, ms_error *err);
/* The work count a fenced device's mark covers (mark from ms_device_mark_record on it). */
uint64_t ms_device_fenced_mark_work(const ms_device_mark *mark);

/* Host code may not dereference memory of a device that is not host-addressable. */
static inline bool ms_device_host_addressable(const ms_device *dev) {
    return dev->ops->kind == MS_DEVICE_CPU;
}

/* How many CUDA devices answer (0 without a driver, a GPU or a CUDA build). */
int ms_device_cuda_count(void);
/* CUDA device `ordinal`'s name ("NVIDIA H200") and memory in bytes; false (and nothing
 * written) when it does not answer. */
bool ms_device_cuda_describe(int ordinal, char *name, size_t len, double *mem_bytes);

/* A CUDA device for `ordinal`. Returns MS_ERR_UNSUPPORTED with a message saying why (not
 * built with CUDA, no driver, no GPU) so that callers can fall back to the CPU. The device
 * owns its compute stream (made on first use) and its pool of marks (events). */
ms_status ms_device_cuda_create(int ordinal, ms_device **out, ms_error *err);
/* The CUDA build: a CUDA device's compute stream (a cudaStream_t). The device is its one owner
 * and holder: made on the first call, destroyed with the device; callers (its kernel contexts)
 * ask for it at each use and keep no copy. Once made, every call returns it with MS_OK. */
ms_status ms_device_cuda_stream(ms_device *dev, void **out, ms_error *err);

/* A device of `kind` for world rank `rank` (CUDA: GPU rank mod the GPUs present). */
ms_status ms_device_create(ms_device_kind kind, int rank, ms_device **out, ms_error *err);

/* The best device available: CUDA when `want_gpu` and one exists, else the CPU. When it
 * falls back, `note` (if non-NULL) receives the reason; otherwise note is set to "". */
ms_status ms_device_auto_create(bool want_gpu, int ordinal, ms_device **out, char *note,
                                size_t note_len, ms_error *err);

void ms_device_destroy(ms_device *dev);

/* Where a job asks to train (`--device`). */
typedef enum ms_device_choice {
    MS_DEVICE_CHOICE_CPU,
    MS_DEVICE_CHOICE_CUDA,
    MS_DEVICE_CHOICE_AUTO,   /* CUDA when it is usable for training, else the CPU */
    MS_DEVICE_CHOICE_FENCED, /* the fenced CPU device (MS_DEVICE_FENCED), for checking */
    MS_DEVICE_CHOICE_COUNT
} ms_device_choice;
const char *ms_device_choice_name(ms_device_choice c); /* "cpu", "cuda", "auto", "fenced" */

/* The device kind a job trains on for `choice`, decided once before any rank starts. CUDA is
 * probed through the CUDA runtime (device 0): `cuda` fails with MS_ERR_UNSUPPORTED naming the
 * runtime's reason when no GPU is usable; `auto` then falls back to the CPU. `note` says what
 * was chosen and why ("" for `cpu` and `fenced`). */
ms_status ms_device_resolve(ms_device_choice choice, ms_device_kind *out, char *note,
                            size_t note_len, ms_error *err);

/* A host device for state kept in host memory beside dev (optimizer offload): pinned memory
 * (cudaHostAlloc, so copies to and from the GPU run at the link's full speed) when dev is a
 * CUDA device, plain host memory otherwise. Host-addressable, with its own byte counters (the
 * memory views report it apart from dev's). The caller destroys it. */
ms_status ms_device_host_beside(const ms_device *dev, ms_device **out, ms_error *err);
/* The CUDA build's pinned host device (ms_device_host_beside). */
ms_status ms_device_cuda_pinned_create(int ordinal, ms_device **out, ms_error *err);

/* A process-wide CPU device for memory that no rank's device owns (wrapped host buffers).
 * Stateless but for its byte counters; never destroyed. */
ms_device *ms_device_host(void);

/* Caps the bytes in use on this device (0 removes the cap): an allocation that would pass
 * it fails with MS_ERR_NOMEM as if the device were full. For a memory budget per rank, and
 * for tests of what happens when memory runs out. Allocations already made are kept. */
void ms_device_set_limit(ms_device *dev, size_t bytes);

/* MS_ERR_NOMEM (naming the size and the device) when the backend or the limit refuses. */
ms_status ms_device_alloc(ms_device *dev, size_t nbytes, void **out, ms_error *err);
void ms_device_free(ms_device *dev, void *ptr, size_t nbytes);
ms_status ms_device_copy(ms_device *dev, void *dst, const void *src, size_t nbytes, ms_copy_dir dir,
                         ms_error *err);
ms_status ms_device_zero(ms_device *dev, void *dst, size_t nbytes, ms_error *err);
ms_status ms_device_copy_box(ms_device *dev, void *dst, const int64_t *dst_shape,
                             const int64_t *dst_start, const void *src, const int64_t *src_shape,
                             const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                             ms_error *err);

/* Whether ptr is memory of dev that host code may not touch (the owns slot; false for NULL). */
bool ms_device_owns(const ms_device *dev, const void *ptr);
/* Waits for everything queued on dev (the sync slot; at once where there is none): what
 * ms_device_mark_record falls back to on a device without marks. */
ms_status ms_device_sync(ms_device *dev, ms_error *err);

/* A mark after all the work this device object has queued so far (the mark_record slot), for
 * a consumer on another stream: the communicators' direct path (NCCL) records one on the
 * caller's thread when a call is issued and has its stream wait for it. On a device without
 * marks it waits for the device instead (ms_device_sync) and gives NULL: nothing is left to
 * wait for. NULL dev: *out = NULL. */
ms_status ms_device_mark_record(ms_device *dev, ms_device_mark **out, ms_error *err);
/* Makes `stream` (the device's native kind) wait for mark; a NULL mark is ready. */
ms_status ms_device_mark_wait(ms_device *dev, const ms_device_mark *mark, void *stream,
                              ms_error *err);
/* Gives mark back to dev; NULL is a no-op. */
void ms_device_mark_release(ms_device *dev, ms_device_mark *mark);
/* Whether dev has the mark slots. */
bool ms_device_has_marks(const ms_device *dev);

/* Copies nbytes between any mix of dev's memory and host memory, the direction told by
 * ms_device_owns of each end (neither: a host copy). For memory whose device the caller does
 * not know for sure: wrapped buffers, state that lives on the rank's device or on a host
 * device beside it (optimizer offload). dev may be NULL (host only). */
ms_status ms_device_move(const ms_device *dev, void *dst, const void *src, size_t nbytes,
                         ms_error *err);

/* Calls fn once per contiguous run of a box copy (the innermost dim): the byte offsets of the
 * run in the destination and the source, and its bytes. Stops at the first failure. */
typedef ms_status (*ms_box_run_fn)(size_t dst_off, size_t src_off, size_t bytes, void *arg,
                                   ms_error *err);
ms_status ms_box_runs(const int64_t *dst_shape, const int64_t *dst_start, const int64_t *src_shape,
                      const int64_t *src_start, const int64_t *len, int ndim, size_t elt,
                      ms_box_run_fn fn, void *arg, ms_error *err);

/* The box copy on host memory (the CPU backend's copy_box; ms_copy_box_f32 for any element). */
void ms_host_copy_box(void *dst, const int64_t *dst_shape, const int64_t *dst_start,
                      const void *src, const int64_t *src_shape, const int64_t *src_start,
                      const int64_t *len, int ndim, size_t elt);

static inline const char *ms_device_name(const ms_device *dev) {
    return dev->ops->name;
}

#endif

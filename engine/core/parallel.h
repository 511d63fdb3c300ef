/* parallel.h - splitting a long loop across the rank's own cores.
 *
 * A rank may use as many threads as it gives OpenBLAS (ms_k_blas_set_threads: cores / ranks,
 * so ranks x threads never oversubscribes the machine). sgemm already uses them; this lets
 * the streaming kernels (the optimizer, the gradient norm, GELU, adds, LayerNorm) use them
 * too. With one thread per rank (the usual case for several thread ranks) every call runs
 * inline on the caller.
 *
 * Each calling thread (rank) gets its own small pool, created on first use. Idle workers
 * sleep in the kernel (futex), they never spin: OpenMP's workers spin after each region
 * (libgomp reads OMP_WAIT_POLICY before main runs), on exactly the cores OpenBLAS's threads
 * need next, which is what makes stock PyTorch slow on this kind of machine
 * (docs/benchmarks.md).
 */
#ifndef MS_PARALLEL_H
#define MS_PARALLEL_H

#include <stdint.h>

/* Work on items [lo, hi). */
typedef void (*ms_range_fn)(void *arg, int64_t lo, int64_t hi);

/* Runs fn over [0, n) in contiguous chunks of at least `grain` items (a multiple of `grain`
 * except the last), a few per thread, each taken by whichever thread is free first (the
 * caller works too); returns when all are done. fn must be safe to run concurrently on
 * disjoint ranges, and must not depend on which thread runs a chunk. */
void ms_parallel_for(int64_t n, int64_t grain, ms_range_fn fn, void *arg);

/* Threads a rank uses (the process-wide setting; >= 1). Set by ms_k_blas_set_threads. */
void ms_parallel_set_threads(int n);
int ms_parallel_threads(void);

#endif

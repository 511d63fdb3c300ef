/* blas.h - the one door to OpenBLAS: every sgemm the CPU kernels make, and the process's BLAS
 * thread policy.
 *
 * OpenBLAS's thread pool is process-wide. Whether it splits a GEMM across its workers depends
 * on the CPU's kernel and its size thresholds, so a process that never chose its thread count
 * behaves differently from one machine to the next. The policy is therefore decided once per
 * process, before its first GEMM (ms_blas_policy), and changed only through
 * ms_k_blas_set_threads:
 *   - under ThreadSanitizer it is always one thread. OpenBLAS is not instrumented, so TSan
 *     cannot see its pool's synchronisation and reports a kernel that reads what a BLAS worker
 *     wrote as a race. A TSan build aborts, naming the cause, if it ever finds the pool larger
 *     (someone called openblas_set_num_threads behind this module's back);
 *   - otherwise MS_BLAS_THREADS when set (1..1024), else OpenBLAS's own count (which honours
 *     OPENBLAS_NUM_THREADS). A job then sets cores / ranks (job_launch).
 * Nothing else in meshscope includes cblas.h or calls openblas_* (scripts/check-layers.sh).
 */
#ifndef MS_BLAS_H
#define MS_BLAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* C[m, n] (ldc) = alpha * op(A) op(B) + beta * C, row-major with explicit leading dims; does
 * nothing when m or n is 0. Sizes must fit in an int (kernels.h). */
void ms_blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Decides the process's BLAS threads if nothing has yet (idempotent, thread-safe) and returns
 * the count in force. */
int ms_blas_policy(void);

/* True in a ThreadSanitizer build, where the policy pins BLAS to one thread. */
bool ms_blas_pinned_for_tsan(void);

/* The OpenBLAS core to ask for (OPENBLAS_CORETYPE, read when the library loads) when this
 * library fell back to its generic "Prescott" kernels on a CPU newer than itself (Debian 12's
 * 0.3.21 does not know Sapphire Rapids): SkylakeX where the CPU has AVX-512 F, BW, DQ and VL,
 * Haswell where it has AVX2 and FMA. Those kernels run GEMMs with a dimension under ~64 (a
 * CNN's channels, a narrow layer) about 4x faster here. NULL when OpenBLAS recognised the CPU,
 * OPENBLAS_CORETYPE is already set, or the CPU has neither. meshscope_main (cli/meshscope.h)
 * re-executes itself with it; scripts/run-tests.sh exports it for the test binaries. */
const char *ms_blas_better_core(void);

/* The BLAS build and the kernel it runs on this CPU, as one line: OpenBLAS's config string,
 * its core name and its threading ("OpenBLAS 0.3.21 DYNAMIC_ARCH ... MAX_THREADS=64, core
 * Prescott, pthreads"). A DYNAMIC_ARCH build picks its kernel at run time, so two machines
 * with the same library can run different GEMM code (the cpu-local calibration keys on it). */
void ms_blas_describe(char *buf, size_t len);

#endif

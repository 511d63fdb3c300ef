/* cuda_check.h - the one conversion of a CUDA runtime error into a status, for the C files and
 * the .cu files of the GPU path alike.
 *
 *   MS_CHECK(ms_cuda_status(cudaSetDevice(d), "cudaSetDevice", err));
 *   MS_CUDA_CHECK(cudaStreamSynchronize(s), err);   // names the call itself
 *
 * An allocation failure is MS_ERR_NOMEM; anything else is `kind` (ms_cuda_status_as) or
 * MS_ERR_INTERNAL. The message is "cuda: WHAT failed: the runtime's reason". Only for builds
 * with the CUDA toolkit (MS_HAVE_CUDA).
 */
#ifndef MS_CUDA_CHECK_H
#define MS_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus /* status.h is C17; the .cu files include it as C++ */
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif
extern "C" {
#endif
#include "engine/core/status.h"
#ifdef __cplusplus
}
#endif

static inline ms_status ms_cuda_status_as(cudaError_t e, ms_status kind, const char *what,
                                          ms_error *err) {
    if (e == cudaSuccess) return MS_OK;
    return ms_fail(err, e == cudaErrorMemoryAllocation ? MS_ERR_NOMEM : kind, "cuda: %s failed: %s",
                   what, cudaGetErrorString(e));
}

static inline ms_status ms_cuda_status(cudaError_t e, const char *what, ms_error *err) {
    return ms_cuda_status_as(e, MS_ERR_INTERNAL, what, err);
}

#define MS_CUDA_CHECK(call, err) MS_CHECK(ms_cuda_status((call), #call, (err)))

#endif

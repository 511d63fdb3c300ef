/* comm_nccl_stub.c - ms_comm_nccl_create in builds without NCCL (see comm.h): it says so and
 * how to get it; falling back to another backend is the caller's choice. */
#include "engine/comm/comm.h"

ms_status ms_comm_nccl_create(ms_comm *bootstrap, int device, ms_comm **out, ms_error *err) {
    (void)bootstrap, (void)device;
    if (out) *out = NULL;
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "this meshscope build has no NCCL backend: install the CUDA toolkit and NCCL "
                   "(nccl.h, libnccl) and reconfigure with -DMS_ENABLE_CUDA=ON, or use the "
                   "threads or mpi backend");
}

/* flash.cuh - the launchers of flash.cu (bf16 flash attention on the tensor cores) for the
 * other .cu files of this folder; flash_math.cuh has the arguments and the arithmetic.
 */
#ifndef MS_CUDA_FLASH_CUH
#define MS_CUDA_FLASH_CUH

#include "engine/kernels/cuda/cuda_kernels.h" /* ms_status, C++-safe */
#include "engine/kernels/cuda/flash_math.cuh"

/* Whether the call fits the tensor-core kernels: a head size they are built for
 * (ms_fa_head_size_ok), whole kv groups, row strides multiples of 8 elements, 16-byte aligned
 * operands. Whether to use them at all is the kernel context's (ms_cu_attention_flash). */
bool ms_cu_flash_fits(const ms_fa_args *a);

/* out, lse and (when not NULL) o_f32 of every query row of b batch items, on kc's stream. */
ms_status ms_cu_flash_forward(ms_kctx *kc, const ms_fa_args *a, int64_t b, ms_error *err);

/* dq, dk, dv += the gradients; a->delta: dO_i . O_i per query row, computed before. */
ms_status ms_cu_flash_backward(ms_kctx *kc, const ms_fa_args *a, int64_t b, ms_error *err);

#endif

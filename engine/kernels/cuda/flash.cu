/* flash.cu - bf16 flash attention on the tensor cores: flash_math.cuh's block bodies launched
 * with the GPU's block context (mma.sync for the products, __shfl_xor_sync, __syncthreads).
 *
 * attention.cu hands a bf16 call here when its kernel context chose these kernels
 * (ms_cu_attention_flash: decided when the context was made, never on a device before sm_80)
 * and the call fits them (ms_cu_flash_fits; flash_math.cuh says which calls do); otherwise it
 * runs its row kernels.
 */
#include "engine/kernels/cuda/flash.cuh"
#include "engine/kernels/cuda/launch.cuh"

/* The block context of flash_math.cuh on a GPU. Its functions compile for the host too (as
 * traps) only so that the __host__ __device__ bodies instantiate cleanly. */
struct ms_fa_gpu {
    MS_HD int tid() const {
#ifdef __CUDA_ARCH__
        return (int)threadIdx.x;
#else
        return 0;
#endif
    }
    MS_HD int lane() const {
        return tid() % 32;
    }
    MS_HD int warp() const {
        return tid() / 32;
    }
    MS_HD void sync() {
#ifdef __CUDA_ARCH__
        __syncthreads();
#endif
    }
    MS_HD float shfl_xor(float v, int mask) {
#ifdef __CUDA_ARCH__
        return __shfl_xor_sync(0xffffffffu, v, mask);
#else
        (void)mask;
        return v;
#endif
    }
    /* count 2 or 4 (a compile-time constant where the bodies call it) */
    MS_HD void ldsm(uint32_t *r, int count, bool trans, const uint16_t *row) {
#if defined(__CUDA_ARCH__)
        const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
        if (count == 4 && trans)
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"(addr));
        else if (count == 4)
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"(addr));
        else if (trans)
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                         : "=r"(r[0]), "=r"(r[1])
                         : "r"(addr));
        else
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                         : "=r"(r[0]), "=r"(r[1])
                         : "r"(addr));
#else
        (void)r, (void)count, (void)trans, (void)row;
#endif
    }
    MS_HD void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
        __trap(); /* no context chooses these kernels before sm_80 */
#else
        (void)d, (void)a, (void)b;
#endif
    }
};

template <int HS> __global__ void __launch_bounds__(MS_FA_THREADS) fa_forward_kernel(ms_fa_args a) {
    __shared__ __align__(16) uint16_t smem[MS_FA_SMEM_BF16(HS)];
    __shared__ float fsmem[MS_FA_SMEM_FLOATS];
    ms_fa_gpu cx;
    ms_fa_forward_block<HS>(cx, a, blockIdx.x, blockIdx.y, blockIdx.z, smem, fsmem);
}

template <int HS> __global__ void __launch_bounds__(MS_FA_THREADS) fa_dq_kernel(ms_fa_args a) {
    __shared__ __align__(16) uint16_t smem[MS_FA_SMEM_BF16(HS)];
    __shared__ float fsmem[MS_FA_SMEM_FLOATS];
    ms_fa_gpu cx;
    ms_fa_dq_block<HS>(cx, a, blockIdx.x, blockIdx.y, blockIdx.z, smem, fsmem);
}

template <int HS> __global__ void __launch_bounds__(MS_FA_THREADS) fa_dkv_kernel(ms_fa_args a) {
    __shared__ __align__(16) uint16_t smem[MS_FA_SMEM_BF16(HS)];
    __shared__ float fsmem[MS_FA_SMEM_FLOATS];
    ms_fa_gpu cx;
    ms_fa_dkv_block<HS>(cx, a, blockIdx.x, blockIdx.y, blockIdx.z, smem, fsmem);
}

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

bool ms_cu_flash_fits(const ms_fa_args *a) {
    const bool heads_ok = a->h > 0 && a->hkv > 0 && a->h % a->hkv == 0;
    return heads_ok && ms_fa_head_size_ok(a->hs) && a->q_ld % 8 == 0 && a->kv_ld % 8 == 0 &&
           a->out_ld % 8 == 0 && aligned16(a->q) && aligned16(a->k) && aligned16(a->v) &&
           (!a->dout || aligned16(a->dout));
}

/* Launches kernel template K for the head size (one of ms_fa_head_size_ok's: the callers
 * checked with ms_cu_flash_fits); another is refused, launching nothing. */
#define FA_CASE(K, HS, grid, stream, a)                                                            \
    case HS:                                                                                       \
        K<HS><<<grid, MS_FA_THREADS, 0, stream>>>(a);                                              \
        break
#define FA_LAUNCH(K, grid, stream, a, what, err)                                                   \
    do {                                                                                           \
        switch ((a).hs) {                                                                          \
            FA_CASE(K, 16, grid, stream, a);                                                       \
            FA_CASE(K, 32, grid, stream, a);                                                       \
            FA_CASE(K, 48, grid, stream, a);                                                       \
            FA_CASE(K, 64, grid, stream, a);                                                       \
            FA_CASE(K, 80, grid, stream, a);                                                       \
            FA_CASE(K, 96, grid, stream, a);                                                       \
            FA_CASE(K, 128, grid, stream, a);                                                      \
            default:                                                                               \
                return ms_fail(err, MS_ERR_INVALID, "%s: no kernel for head size %lld", what,      \
                               (long long)(a).hs);                                                 \
        }                                                                                          \
        MS_CHECK(ms_cu_launched(what, err));                                                       \
    } while (0)

static dim3 fa_grid(int64_t b, int64_t rows, int64_t heads) {
    return dim3((unsigned)((rows + MS_FA_ROWS - 1) / MS_FA_ROWS), (unsigned)heads, (unsigned)b);
}

ms_status ms_cu_flash_forward(ms_kctx *kc, const ms_fa_args *a, int64_t b, ms_error *err) {
    if (b <= 0 || a->tq <= 0) return MS_OK;
    FA_LAUNCH(fa_forward_kernel, fa_grid(b, a->tq, a->h), (cudaStream_t)ms_cu_stream(kc), *a,
              "flash attention forward (bf16)", err);
    return MS_OK;
}

ms_status ms_cu_flash_backward(ms_kctx *kc, const ms_fa_args *a, int64_t b, ms_error *err) {
    if (b <= 0 || a->tq <= 0) return MS_OK;
    cudaStream_t s = (cudaStream_t)ms_cu_stream(kc);
    if (a->dq)
        FA_LAUNCH(fa_dq_kernel, fa_grid(b, a->tq, a->h), s, *a,
                  "flash attention backward dq (bf16)", err);
    if ((!a->dk && !a->dv) || a->tk <= 0) return MS_OK;
    FA_LAUNCH(fa_dkv_kernel, fa_grid(b, a->tk, a->hkv), s, *a,
              "flash attention backward dk, dv (bf16)", err);
    return MS_OK;
}

/* cuda_simt_host.h - runs a GPU thread block's body on the CPU: one host thread per GPU
 * thread, for kernel bodies written against a block context (engine/kernels/cuda/
 * flash_math.cuh). The block's barrier is a pthread barrier over all its threads; a warp's
 * collective operations (shfl_xor; ldsm, the matrix load from shared memory; mma, the tensor
 * cores' m16n8k16 bf16 product) meet at a barrier of the warp's 32 threads, where each lane
 * deposits its registers (or its row address) and reads what the operation gives it. mma
 * assembles A and B from every lane's registers with the fragment layouts of
 * engine/kernels/cuda/mma_math.cuh, which are the PTX ISA's, and sums in double; ldsm reads
 * the rows the lanes name with the matrix load's layout from the same header.
 *
 * So the body's own indexing - which lane loads which element, how C fragments become A
 * operands, the shared-memory tiles and the barriers between them - is what runs here, and
 * only the instruction's layout (from the PTX ISA) and the launch are left for a GPU.
 * Compiled by nvcc as host code (tests/test_cuda_host_flash.cu).
 */
#ifndef MS_TESTS_CUDA_SIMT_HOST_H
#define MS_TESTS_CUDA_SIMT_HOST_H

#include <pthread.h>
#include <string.h>

#include <thread>
#include <vector>

#include "engine/kernels/cuda/mma_math.cuh"

#define SIMT_MAX_WARPS 8

struct simt_block {
    int nthreads;
    pthread_barrier_t all;
    pthread_barrier_t warp[SIMT_MAX_WARPS];
    uint32_t xa[SIMT_MAX_WARPS][32][4], xb[SIMT_MAX_WARPS][32][2];
    float xf[SIMT_MAX_WARPS][32];
    const uint16_t *xp[SIMT_MAX_WARPS][32];
};

/* The block context of one host thread. Its functions are host code (empty in device
 * passes, which never instantiate a body with it). */
struct simt_cx {
    simt_block *blk;
    int t;

    MS_HD int tid() const { return t; }
    MS_HD int lane() const { return t % 32; }
    MS_HD int warp() const { return t / 32; }
    MS_HD void sync() {
#ifndef __CUDA_ARCH__
        pthread_barrier_wait(&blk->all);
#endif
    }
    MS_HD void warp_sync() {
#ifndef __CUDA_ARCH__
        pthread_barrier_wait(&blk->warp[warp()]);
#endif
    }
    MS_HD float shfl_xor(float v, int mask) {
        blk->xf[warp()][lane()] = v;
        warp_sync();
        const float r = blk->xf[warp()][lane() ^ mask];
        warp_sync(); /* nobody deposits again before every lane has read */
        return r;
    }
    /* ldmatrix .m8n8.x{count}: lane 8 i + r gives row r of matrix i; lane l receives in
     * register i the two elements ms_cu_ldsm_at names of matrix i. */
    MS_HD void ldsm(uint32_t *r, int count, bool trans, const uint16_t *row) {
        const int w = warp();
        blk->xp[w][lane()] = row;
        warp_sync();
        for (int i = 0; i < count; i++) {
            uint16_t h[2];
            for (int half = 0; half < 2; half++) {
                int rr, cc;
                ms_cu_ldsm_at(lane(), half, trans, &rr, &cc);
                h[half] = blk->xp[w][8 * i + rr][cc];
            }
            r[i] = ms_cu_pack_bits(h[0], h[1]);
        }
        warp_sync();
    }
    MS_HD void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
        const int w = warp();
        memcpy(blk->xa[w][lane()], a, sizeof blk->xa[w][0]);
        memcpy(blk->xb[w][lane()], b, sizeof blk->xb[w][0]);
        warp_sync();
        float am[16][16], bm[16][8];
        for (int l = 0; l < 32; l++) {
            for (int i = 0; i < 8; i++) {
                int r, c;
                ms_cu_mma_a_at(l, i, &r, &c);
                const uint32_t u = blk->xa[w][l][i / 2];
                am[r][c] = i % 2 ? ms_cu_bf16x2_hi(u) : ms_cu_bf16x2_lo(u);
            }
            for (int i = 0; i < 4; i++) {
                int k, n;
                ms_cu_mma_b_at(l, i, &k, &n);
                const uint32_t u = blk->xb[w][l][i / 2];
                bm[k][n] = i % 2 ? ms_cu_bf16x2_hi(u) : ms_cu_bf16x2_lo(u);
            }
        }
        warp_sync();
        for (int i = 0; i < 4; i++) {
            int r, c;
            ms_cu_mma_c_at(lane(), i, &r, &c);
            double s = 0;
            for (int k = 0; k < 16; k++) s += (double)am[r][k] * bm[k][c];
            d[i] = (float)((double)d[i] + s);
        }
    }
};

/* Runs body(cx) on nthreads host threads (a multiple of 32, at most 32 SIMT_MAX_WARPS) as one
 * block, and returns when all have finished. */
template <class F> static void simt_run_block(int nthreads, F body) {
    simt_block blk;
    blk.nthreads = nthreads;
    pthread_barrier_init(&blk.all, NULL, (unsigned)nthreads);
    for (int w = 0; w < nthreads / 32; w++) pthread_barrier_init(&blk.warp[w], NULL, 32);
    std::vector<std::thread> threads;
    threads.reserve(nthreads);
    for (int t = 0; t < nthreads; t++)
        threads.emplace_back([&blk, &body, t] {
            simt_cx cx{&blk, t};
            body(cx);
        });
    for (auto &th : threads) th.join();
    pthread_barrier_destroy(&blk.all);
    for (int w = 0; w < nthreads / 32; w++) pthread_barrier_destroy(&blk.warp[w]);
}

#endif

/* mma_math.cuh - the warp-level bf16 matrix product of the tensor cores (PTX mma.sync
 * m16n8k16, bf16 operands, fp32 accumulators) as the kernels here see it: which element of
 * the 16x16 A, 16x8 B and 16x8 C each lane holds, and bf16 pairs packed into 32-bit registers.
 *
 * A kernel body that multiplies with the tensor cores is written against a "block context"
 * (flash_math.cuh), whose mma(d, a, b) is d += A B for one warp. On a GPU that is the PTX
 * instruction; tests/cuda_simt_host.h runs the same body on the CPU, one thread per lane, and
 * its mma assembles A and B from all 32 lanes with the layout functions below. The layouts
 * are those of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"):
 * with g = lane / 4 and t = lane % 4,
 *   A (16 x 16, row-major, 4 registers of 2 bf16): element i of 8 sits at row g + 8 (i/2 % 2),
 *     column 2t + i % 2 + 8 (i / 4);
 *   B (16 x 8, k x n, 2 registers of 2 bf16): element i of 4 at k = 2t + i % 2 + 8 (i / 2),
 *     n = g;
 *   C, D (16 x 8 fp32, 4 registers): element i at row g + 8 (i / 2), column 2t + i % 2.
 * So two C tiles side by side (columns 0-7 and 8-15) hold, register for register, the
 * elements of one A tile: a product's output feeds the next product as its A operand without
 * leaving the registers (ms_cu_mma_a_from_c), the step that keeps flash attention's
 * probabilities out of memory.
 *
 * A packed pair holds its lower-indexed element (the smaller column of A and C, the smaller
 * k of B) in the low 16 bits.
 *
 * B fragments come out of shared memory through the warp's matrix load (PTX ldmatrix
 * .m8n8.b16, `ldsm` of the block context): count (2 or 4) 8 x 8 bf16 matrices, each of 8 rows
 * of 16 contiguous bytes whose addresses lanes 8 i .. 8 i + 7 give (lane 8 i + r: row r of
 * matrix i); lane l = 4 g + t receives register i = row g, elements 2t and 2t + 1 of matrix i,
 * or with .trans the transposed matrix's: elements (2t, g) and (2t + 1, g). That is a B
 * fragment's register straight from rows of K (B[k][n] = K[n][k], plain) or of V
 * (B[k][n] = V[k][n], transposed): one instruction where lane-by-lane loads take two (four
 * 16-bit ones for V).
 */
#ifndef MS_CUDA_MMA_MATH_CUH
#define MS_CUDA_MMA_MATH_CUH

#include "engine/kernels/cuda/math_common.cuh"

/* Unrolls the loop it precedes in device code, where fragments are register arrays that a
 * rolled loop would index at run time (local memory); the host compiler knows no such pragma. */
#ifdef __CUDA_ARCH__
#define MS_UNROLL _Pragma("unroll")
#else
#define MS_UNROLL
#endif

/* The element of matrix i that lane l receives in the low (half 0) or high (half 1) 16 bits
 * of its register i from a matrix load (ldmatrix), as (row, column) of the matrix as stored. */
MS_HD void ms_cu_ldsm_at(int lane, int half, bool trans, int *row, int *col) {
    const int g = lane / 4, e = 2 * (lane % 4) + half;
    *row = trans ? e : g;
    *col = trans ? g : e;
}

/* The coordinates of element i of a lane's fragment (see the layouts above). */
MS_HD void ms_cu_mma_a_at(int lane, int i, int *row, int *col) {
    *row = lane / 4 + 8 * (i / 2 % 2);
    *col = 2 * (lane % 4) + i % 2 + 8 * (i / 4);
}
MS_HD void ms_cu_mma_b_at(int lane, int i, int *k, int *n) {
    *k = 2 * (lane % 4) + i % 2 + 8 * (i / 2);
    *n = lane / 4;
}
MS_HD void ms_cu_mma_c_at(int lane, int i, int *row, int *col) {
    *row = lane / 4 + 8 * (i / 2);
    *col = 2 * (lane % 4) + i % 2;
}

/* Two values rounded to bf16 (round to nearest even, as ms_cu_store) and packed. */
MS_HD uint32_t ms_cu_pack_bf16x2(float lo, float hi) {
    return (uint32_t)ms_cu_bf16_round(lo) | (uint32_t)ms_cu_bf16_round(hi) << 16;
}
MS_HD uint32_t ms_cu_pack_bits(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}
MS_HD float ms_cu_bf16x2_lo(uint32_t u) {
    return ms_cu_bf16_widen((uint16_t)(u & 0xffffu));
}
MS_HD float ms_cu_bf16x2_hi(uint32_t u) {
    return ms_cu_bf16_widen((uint16_t)(u >> 16));
}

/* Two adjacent bf16 in memory (4-byte aligned) as one register. */
MS_HD uint32_t ms_cu_ld_pair(const uint16_t *p) {
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)p;
#else
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
#endif
}

/* 16 bytes (8 bf16), both ends 16-byte aligned. */
MS_HD void ms_cu_copy16(uint16_t *dst, const uint16_t *src) {
#ifdef __CUDA_ARCH__
    *(uint4 *)dst = *(const uint4 *)src;
#else
    memcpy(dst, src, 16);
#endif
}
MS_HD void ms_cu_zero16(uint16_t *dst) {
#ifdef __CUDA_ARCH__
    *(uint4 *)dst = make_uint4(0, 0, 0, 0);
#else
    memset(dst, 0, 16);
#endif
}

/* The A operand made of two C tiles: c0 columns 0-7, c1 columns 8-15, rounded to bf16. */
MS_HD void ms_cu_mma_a_from_c(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = ms_cu_pack_bf16x2(c0[0], c0[1]);
    a[1] = ms_cu_pack_bf16x2(c0[2], c0[3]);
    a[2] = ms_cu_pack_bf16x2(c1[0], c1[1]);
    a[3] = ms_cu_pack_bf16x2(c1[2], c1[3]);
}

/* A: rows [r0, r0 + 16) and columns [k0, k0 + 16) of a row-major bf16 matrix (ld elements
 * apart), rows >= nrows read as zeros. */
MS_HD void ms_cu_mma_load_a(uint32_t a[4], int lane, const uint16_t *m, int64_t ld, int64_t r0,
                            int64_t nrows, int64_t k0) {
    MS_UNROLL
    for (int reg = 0; reg < 4; reg++) {
        int row, col;
        ms_cu_mma_a_at(lane, 2 * reg, &row, &col);
        a[reg] = r0 + row < nrows ? ms_cu_ld_pair(m + (r0 + row) * ld + k0 + col) : 0u;
    }
}

/* The same B fragments lane by lane, without a matrix load: what the matrix loads of the
 * kernels must give (tests/test_cuda_host_flash.cu compares them). */

/* B with B[k][n] = m[n0 + n][k0 + k]: the rows of m are B's columns (K in Q K^T). */
MS_HD void ms_cu_mma_load_b_rows(uint32_t b[2], int lane, const uint16_t *m, int64_t ld, int64_t n0,
                                 int64_t k0) {
    MS_UNROLL
    for (int reg = 0; reg < 2; reg++) {
        int k, n;
        ms_cu_mma_b_at(lane, 2 * reg, &k, &n);
        b[reg] = ms_cu_ld_pair(m + (n0 + n) * ld + k0 + k);
    }
}

/* B with B[k][n] = m[k0 + k][n0 + n]: the rows of m are B's rows (V in P V), two loads a
 * register. */
MS_HD void ms_cu_mma_load_b_cols(uint32_t b[2], int lane, const uint16_t *m, int64_t ld, int64_t k0,
                                 int64_t n0) {
    MS_UNROLL
    for (int reg = 0; reg < 2; reg++) {
        int k, n;
        ms_cu_mma_b_at(lane, 2 * reg, &k, &n);
        b[reg] = ms_cu_pack_bits(m[(k0 + k) * ld + n0 + n], m[(k0 + k + 1) * ld + n0 + n]);
    }
}

#endif

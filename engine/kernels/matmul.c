/* matmul.c - batched matrix products and their gradients, all through ms_blas_sgemm (blas.h).
 *
 * Transposes are sgemm flags, never copies. A product whose B is a shared weight and whose A is
 * not transposed is one sgemm over batch * m rows (the linear-layer case), so OpenBLAS sees one
 * large problem instead of many small ones.
 */
#include "engine/kernels/blas.h"
#include "engine/kernels/kernels.h"

/* C[m, n] = alpha * op(A) op(B) + beta * C with row-major leading dims implied by the storage
 * shapes: A is [m, k] or [k, m], B is [k, n] or [n, k]. */
static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 const float *b, float beta, float *c) {
    ms_blas_sgemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

/* The linear-layer shape: many A's against one B, A stored untransposed. */
static bool foldable(const ms_k_gemm *g) {
    return g->bcast_b && !g->bcast_a && !g->trans_a;
}

void ms_k_matmul_forward(const ms_k_gemm *g, float *c, const float *a, const float *b, float alpha,
                         float beta) {
    if (foldable(g)) {
        gemm(false, g->trans_b, g->batch * g->m, g->n, g->k, alpha, a, b, beta, c);
        return;
    }
    const int64_t sa = g->bcast_a ? 0 : g->m * g->k, sb = g->bcast_b ? 0 : g->k * g->n;
    const int64_t sc = g->m * g->n;
    for (int64_t i = 0; i < g->batch; i++)
        gemm(g->trans_a, g->trans_b, g->m, g->n, g->k, alpha, a + i * sa, b + i * sb, beta,
             c + i * sc);
}

/* With C = alpha op(A) op(B):  d op(A) = alpha dC op(B)^T  and  d op(B) = alpha op(A)^T dC.
 * When A is stored transposed its gradient is the transpose, dA = alpha op(B) dC^T, and the same
 * for B; each of the four storage cases is then a single sgemm with the right flags. */
static void grad_a(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float *da,
                   const float *dc, const float *b, float beta) {
    if (!ta) /* da [m, k] = dc [m, n] @ op(B)^T; B [k, n] needs T, B [n, k] is op(B)^T as is */
        gemm(false, !tb, m, k, n, alpha, dc, b, beta, da);
    else /* da [k, m] = op(B) [k, n] @ dc^T */
        gemm(tb, true, k, m, n, alpha, b, dc, beta, da);
}

static void grad_b(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float *db,
                   const float *dc, const float *a, float beta) {
    if (!tb) /* db [k, n] = op(A)^T [k, m] @ dc; A [m, k] needs T, A [k, m] is op(A)^T as is */
        gemm(!ta, false, k, n, m, alpha, a, dc, beta, db);
    else /* db [n, k] = dc^T [n, m] @ op(A) [m, k] */
        gemm(true, ta, n, k, m, alpha, dc, a, beta, db);
}

void ms_k_matmul_backward(const ms_k_gemm *g, float *da, float *db, const float *dc, const float *a,
                          const float *b, float alpha, bool accumulate) {
    const float beta0 = accumulate ? 1.0f : 0.0f;
    if (foldable(g)) {
        const int64_t rows = g->batch * g->m;
        if (da) grad_a(false, g->trans_b, rows, g->n, g->k, alpha, da, dc, b, beta0);
        if (db) grad_b(false, g->trans_b, rows, g->n, g->k, alpha, db, dc, a, beta0);
        return;
    }
    const int64_t sa = g->m * g->k, sb = g->k * g->n, sc = g->m * g->n;
    for (int64_t i = 0; i < g->batch; i++) {
        const float *ai = a + (g->bcast_a ? 0 : i * sa), *bi = b + (g->bcast_b ? 0 : i * sb);
        const float *dci = dc + i * sc;
        /* A shared operand sums its gradient over the batch: after the first item, add. */
        if (da) {
            const float beta = (g->bcast_a && i > 0) ? 1.0f : beta0;
            grad_a(g->trans_a, g->trans_b, g->m, g->n, g->k, alpha, da + (g->bcast_a ? 0 : i * sa),
                   dci, bi, beta);
        }
        if (db) {
            const float beta = (g->bcast_b && i > 0) ? 1.0f : beta0;
            grad_b(g->trans_a, g->trans_b, g->m, g->n, g->k, alpha, db + (g->bcast_b ? 0 : i * sb),
                   dci, ai, beta);
        }
    }
    /* A zero batch with accumulate = false still promises a zeroed shared gradient. */
    if (g->batch == 0 && !accumulate) {
        if (da && g->bcast_a)
            for (int64_t j = 0; j < sa; j++) da[j] = 0.0f;
        if (db && g->bcast_b)
            for (int64_t j = 0; j < sb; j++) db[j] = 0.0f;
    }
}

ms_k_cost ms_k_matmul_cost(const ms_k_gemm *g, bool backward, bool beta_nonzero, bool need_da,
                           bool need_db) {
    const double prod = 2.0 * (double)g->m * (double)g->n * (double)g->k;
    const double na = (double)g->m * g->k * (g->bcast_a ? 1 : g->batch);
    const double nb = (double)g->k * g->n * (g->bcast_b ? 1 : g->batch);
    const double nc = (double)g->m * g->n * g->batch;
    ms_k_cost cost = {0, 0};
    if (!backward) {
        cost.flops = prod * g->batch;
        cost.bytes = 4.0 * (na + nb + nc * (beta_nonzero ? 2 : 1));
        return cost;
    }
    /* Each gradient is one product the size of the forward; it reads dC and the other operand
     * and writes its own (counted as written once: accumulation is a choice of the caller). */
    if (need_da) {
        cost.flops += prod * g->batch;
        cost.bytes += 4.0 * (nc + nb + na);
    }
    if (need_db) {
        cost.flops += prod * g->batch;
        cost.bytes += 4.0 * (nc + na + nb);
    }
    return cost;
}

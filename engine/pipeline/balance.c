/* balance.c - pipeline chunks of even cost (see balance.h). */
#include "engine/pipeline/balance.h"

#include <math.h>
#include <stdlib.h>

#include "engine/core/xalloc.h"
#include "engine/model/lm_def.h"

ms_pp_costs ms_pp_model_costs(const ms_model_config *cfg, int seq) {
    ms_pp_costs c;
    ms_lm_block_costs(cfg, seq, &c.layer, &c.first, &c.last);
    return c;
}

static double chunk_cost(const ms_pp_costs *c, int chunks, int k, int layers) {
    return layers * c->layer + (k == 0 ? c->first : 0) + (k == chunks - 1 ? c->last : 0);
}

static double max_cost(const ms_pp_costs *c, int chunks, const int *counts) {
    double worst = 0;
    for (int k = 0; k < chunks; k++) {
        double x = chunk_cost(c, chunks, k, counts[k]);
        if (x > worst) worst = x;
    }
    return worst;
}

/* Chunks k.. holding the last n layers: the least possible costliest chunk when cap < 0,
 * else the least sum of squared chunk costs with every chunk at most cap (the most even
 * split among those with the least costliest chunk). best[k][n] is that value, take[k][n] the
 * layers chunk k takes for it; infeasible entries are INFINITY. */
static double plan(int L, int K, const ms_pp_costs *c, double cap, int *counts) {
    double *best = xmalloc(sizeof *best * (size_t)(K + 1) * (size_t)(L + 1));
    int *take = xmalloc(sizeof *take * (size_t)(K + 1) * (size_t)(L + 1));
#define AT(k, n) ((size_t)(k) * (size_t)(L + 1) + (size_t)(n))
    for (int k = K - 1; k >= 0; k--)
        for (int n = K - k; n <= L - k; n++) {
            double b = INFINITY;
            int t = 1, lo = k == K - 1 ? n : 1, hi = k == K - 1 ? n : n - (K - k - 1);
            for (int x = lo; x <= hi; x++) {
                double here = chunk_cost(c, K, k, x),
                       rest = k == K - 1 ? 0 : best[AT(k + 1, n - x)];
                double v = cap < 0 ? fmax(here, rest) : here > cap ? INFINITY : here * here + rest;
                if (v < b) b = v, t = x;
            }
            best[AT(k, n)] = b;
            take[AT(k, n)] = t;
        }
    double v = best[AT(0, L)];
    for (int k = 0, n = L; k < K; k++) {
        counts[k] = take[AT(k, n)];
        n -= counts[k];
    }
#undef AT
    free(best);
    free(take);
    return v;
}

static void balanced(int L, int K, const ms_pp_costs *c, int *counts) {
    double worst = plan(L, K, c, -1, counts);
    if (plan(L, K, c, worst * (1 + 1e-12), counts) == INFINITY) plan(L, K, c, -1, counts);
}

/* The last split made on this thread: the planner asks for the same one once per chunk of
 * every strategy it prices, and the split's dynamic program is O(chunks x layers^2). Held in
 * the thread's own storage (nothing to free when the thread ends); larger splits are not kept. */
#define LAST_SPLIT_MAX 256
static _Thread_local struct {
    int n_layer, chunks; /* chunks 0: none kept */
    ms_pp_costs c;
    int counts[LAST_SPLIT_MAX];
} last_split;

void ms_pp_balance_layers(int n_layer, int chunks, const ms_pp_costs *c, int *counts) {
    if (last_split.chunks && last_split.n_layer == n_layer && last_split.chunks == chunks &&
        last_split.c.layer == c->layer && last_split.c.first == c->first &&
        last_split.c.last == c->last) {
        for (int k = 0; k < chunks; k++) counts[k] = last_split.counts[k];
        return;
    }
    for (int k = 0; k < chunks; k++) counts[k] = n_layer * (k + 1) / chunks - n_layer * k / chunks;
    int *b = xmalloc(sizeof *b * (size_t)chunks);
    balanced(n_layer, chunks, c, b);
    if (max_cost(c, chunks, b) < 0.98 * max_cost(c, chunks, counts))
        for (int k = 0; k < chunks; k++) counts[k] = b[k];
    if (chunks <= LAST_SPLIT_MAX) {
        for (int k = 0; k < chunks; k++) last_split.counts[k] = counts[k];
        last_split.n_layer = n_layer, last_split.chunks = chunks, last_split.c = *c;
    }
    free(b);
}

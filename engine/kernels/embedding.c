/* embedding.c - row lookup in a (possibly vocab-sharded) table and its scatter-add backward.
 *
 * A rank holding rows [v0, v0 + Vl) of the table writes zeros for ids it does not own, so the
 * sum over vocab shards (one all-reduce) is the full lookup; the backward touches only owned rows.
 */
#include "engine/kernels/kernels.h"

#include <string.h>

void ms_k_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                            int64_t c, int64_t v0, int64_t vl) {
    for (int64_t r = 0; r < n; r++) {
        const int64_t row = (int64_t)ids[r] - v0;
        float *o = out + r * c;
        if (row >= 0 && row < vl)
            memcpy(o, table + row * c, (size_t)c * sizeof(float));
        else
            memset(o, 0, (size_t)c * sizeof(float));
    }
}

void ms_k_embedding_backward(float *dtable, const int32_t *ids, const float *dout, int64_t n,
                             int64_t c, int64_t v0, int64_t vl) {
    for (int64_t r = 0; r < n; r++) {
        const int64_t row = (int64_t)ids[r] - v0;
        if (row < 0 || row >= vl) continue;
        float *d = dtable + row * c;
        const float *g = dout + r * c;
        for (int64_t j = 0; j < c; j++) d[j] += g[j];
    }
}

ms_k_cost ms_k_embedding_cost(int64_t n, int64_t c, bool backward) {
    const double e = (double)n * (double)c, rows = (double)n;
    ms_k_cost k;
    if (!backward) {
        k.flops = 0;
        k.bytes = 4.0 * (rows + 2 * e); /* ids, table rows read, out written */
    } else {
        k.flops = e;
        k.bytes = 4.0 * (rows + e + 2 * e); /* ids, dout, dtable rows read and written */
    }
    return k;
}

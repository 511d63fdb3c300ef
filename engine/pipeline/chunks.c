/* chunks.c - which blocks each pipeline model chunk holds, and its graph (chunks.h). */
#include "engine/pipeline/chunks.h"

#include <stdlib.h>

#include "engine/core/xalloc.h"
#include "engine/model/lm_def.h"
#include "engine/pipeline/balance.h"

void ms_pp_chunk_layers_def(const ms_model_def *d, const ms_strategy *s, int k, int *lo, int *hi) {
    int p = s->pp > 1 ? s->pp : 1, v = s->virtual_stages > 1 ? s->virtual_stages : 1;
    int n = d->n_blocks, chunks = p * v;
    if (s->pp_layers[0] && v == 1) {
        int at = 0;
        for (int i = 0; i < k; i++) at += s->pp_layers[i];
        *lo = at;
        *hi = at + s->pp_layers[k];
        return;
    }
    ms_pp_costs costs = {.layer = 1, .first = 0, .last = 0};
    if (d->hooks->block_costs) d->hooks->block_costs(d, &costs.layer, &costs.first, &costs.last);
    int *counts = xmalloc(sizeof *counts * (size_t)chunks);
    ms_pp_balance_layers(n, chunks, &costs, counts);
    *lo = 0;
    for (int i = 0; i < k; i++) *lo += counts[i];
    *hi = *lo + counts[k];
    free(counts);
}

ms_status ms_pp_chunk_model_def(const ms_model_def *d, const ms_strategy *s, int rows, int k,
                                ms_model *md, ms_error *err) {
    int chunks = (s->pp > 1 ? s->pp : 1) * (s->virtual_stages > 1 ? s->virtual_stages : 1);
    ms_model_chunk mc = {.first = k == 0, .last = k == chunks - 1};
    ms_pp_chunk_layers_def(d, s, k, &mc.layer_lo, &mc.layer_hi);
    MS_CHECK(ms_model_def_build(d, rows, &mc, md, err));
    int b = md->hidden_in >= 0 ? md->hidden_in : md->hidden_out;
    if (b >= 0) {
        /* the boundary's placements: what crosses every chunk boundary, placed as the model's
         * "hidden_in" (the built-in models: the residual stream) */
        const ms_shape *shape = ms_graph_value_shape(md->g, b);
        int ndim = s->cp > 1 ? 3 : 2;
        ms_sharding sh = {.s = s, .rules = NULL, .def = d};
        ms_placements pl = ms_placements_replicated(ndim);
        if (!ms_strategy_shard(&sh, "hidden_in", shape, ndim, &pl))
            pl = ms_placements_replicated(ndim);
        if (md->hidden_in >= 0) ms_graph_annotate(md->g, md->hidden_in, &pl);
        if (md->hidden_out >= 0) ms_graph_annotate(md->g, md->hidden_out, &pl);
    }
    return MS_OK;
}

void ms_pp_chunk_layers(const ms_model_config *cfg, const ms_strategy *s, int k, int *lo, int *hi) {
    ms_model_def d;
    ms_error e;
    /* Balanced at the model's context length, so a strategy's split does not depend on the
     * job's sequence length. */
    (void)ms_model_def_from_config(cfg, cfg->n_positions > 0 ? cfg->n_positions : 1, &d, &e);
    ms_pp_chunk_layers_def(&d, s, k, lo, hi);
}

ms_status ms_pp_chunk_model(const ms_model_config *cfg, const ms_strategy *s, int rows, int seq,
                            int k, ms_model *md, ms_error *err) {
    ms_model_def d;
    MS_CHECK(ms_model_def_from_config(cfg, seq, &d, err));
    return ms_pp_chunk_model_def(&d, s, rows, k, md, err);
}

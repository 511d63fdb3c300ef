/* lm_def.c - the built-in language models as model defs (lm_def.h). */
#include "engine/model/lm_def.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"

static int seq_of(const ms_model_def *d) {
    return d->inputs[0].shape[0];
}

static ms_status lm_build(const ms_model_def *d, int rows, const ms_model_chunk *ch, ms_model *out,
                          ms_error *err) {
    return ms_model_build_chunk(d->lm, rows, seq_of(d), ch, out, err);
}

static bool lm_shard(const ms_model_def *d, const ms_strategy *s, const char *name,
                     const ms_shape *shape, int mesh_ndim, ms_placements *pl) {
    (void)d;
    /* what crosses a pipeline boundary is the residual stream */
    if (!strcmp(name, "hidden_in")) name = "embed";
    return ms_lm_shard(s, name, shape, mesh_ndim, pl);
}

/* The heads that tp and cp split, and the position table the sequence must fit. */
static ms_status lm_check(const ms_model_def *d, const ms_strategy *s, ms_error *err) {
    const ms_model_config *cfg = d->lm;
    if (cfg->n_head % s->tp)
        return ms_fail(err, MS_ERR_INVALID,
                       "tensor-parallel degree %d does not divide the %d attention heads; pick a "
                       "tp that divides n_head",
                       s->tp, cfg->n_head);
    if (cfg->n_head % (s->tp * s->cp))
        return ms_fail(err, MS_ERR_INVALID,
                       "tp x cp = %d does not divide the %d attention heads (context parallelism "
                       "moves heads, not sequence, into attention); pick tp x cp dividing n_head",
                       s->tp * s->cp, cfg->n_head);
    if (seq_of(d) > cfg->n_positions)
        return ms_fail(err, MS_ERR_INVALID, "the sequence %d exceeds n_positions %d", seq_of(d),
                       cfg->n_positions);
    return MS_OK;
}

/* ids, positions, targets (BERT: masked) from the text source's ids and targets. */
static ms_status lm_prepare(const ms_model_def *d, const ms_batch_source *src, uint64_t seed,
                            uint64_t batch, int rows, float *const *fields, float *const *inputs,
                            ms_error *err) {
    int fi = ms_batch_source_find(src, "ids"), ft = ms_batch_source_find(src, "targets");
    int T = seq_of(d);
    if (fi < 0 || ft < 0 || src->fields[fi].ndim != 1 || src->fields[fi].shape[0] != T)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: model %s reads text: fields \"ids\" and \"targets\" of %d tokens "
                       "per row",
                       src->name, d->name, T);
    size_t n = (size_t)rows * (size_t)T;
    int32_t *ids = xmalloc(sizeof *ids * (n ? n : 1)), *tgt = xmalloc(sizeof *tgt * (n ? n : 1));
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)fields[fi][i], tgt[i] = (int32_t)fields[ft][i];
    ms_model shape = {.B = rows, .T = T, .mlm_per_row = ms_model_mlm_positions(d->lm, T)};
    if (shape.mlm_per_row) ms_model_mlm_mask(&shape, seed, batch, ids, tgt);
    for (int i = 0; i < d->ninputs; i++) {
        const char *nm = d->inputs[i].name;
        float *x = inputs[i];
        if (!strcmp(nm, "input_ids"))
            for (size_t c = 0; c < n; c++) x[c] = (float)ids[c];
        else if (!strcmp(nm, "position_ids"))
            for (size_t c = 0; c < n; c++) x[c] = (float)(c % (size_t)T);
        else if (!strcmp(nm, "targets") || !strcmp(nm, "masked_lm_labels"))
            ms_model_head_inputs(&shape, rows, tgt, x, NULL);
        else if (!strcmp(nm, "masked_lm_positions"))
            ms_model_head_inputs(&shape, rows, tgt, NULL, x);
    }
    free(ids), free(tgt);
    return MS_OK;
}

static void lm_costs(const ms_model_def *d, double *block, double *first, double *last) {
    ms_lm_block_costs(d->lm, d->lm->n_positions, block, first, last);
}

static ms_status lm_open_data(const ms_model_def *d, const char *path, double val_fraction,
                              ms_batch_source **out, ms_error *err) {
    return ms_text_source_open_file(path, seq_of(d), val_fraction, d->lm->vocab_size, out, err);
}

static void lm_describe(const ms_model_def *d, char *buf, size_t cap) {
    const ms_model_config *cfg = d->lm;
    snprintf(buf, cap, "%d layers, %d heads, %d channels, vocab %d, sequence %d", cfg->n_layer,
             cfg->n_head, cfg->n_embd, cfg->vocab_size, seq_of(d));
}

static const ms_model_hooks lm_hooks = {.build_chunk = lm_build,
                                        .shard = lm_shard,
                                        .check = lm_check,
                                        .prepare = lm_prepare,
                                        .block_costs = lm_costs,
                                        .open_data = lm_open_data,
                                        .describe = lm_describe};

void ms_lm_block_costs(const ms_model_config *cfg, int seq, double *layer, double *first,
                       double *last) {
    const double C = cfg->n_embd, V = cfg->vocab_size, T = seq;
    const double fwd_bwd = 3; /* backward is two matmuls per forward matmul */
    /* qkv (6C^2), projection (2C^2), MLP (16C^2); scores and values (4TC, causal or not). */
    *layer = fwd_bwd * (24 * C * C + 4 * T * C);
    *first = 0; /* lookups: no matmul */
    /* logits (2CV), BERT's transform dense (2C^2); BERT's head runs on the k masked positions
     * of each sequence only (gathered before it), so per token of the sequence it costs k / T
     * of that */
    bool bert = cfg->model_type == MS_MODEL_BERT;
    double rows = bert && T > 0 ? ms_model_mlm_positions(cfg, seq) / T : 1;
    *last = fwd_bwd * (2 * C * V + (bert ? 2 * C * C : 0)) * rows;
}

static void add_input(ms_model_def *d, const char *name, int len) {
    ms_model_input *in = &d->inputs[d->ninputs++];
    snprintf(in->name, sizeof in->name, "%s", name);
    in->ndim = 1, in->shape[0] = len, in->integer = true;
}

static const char *tied_name(const ms_model_config *cfg) {
    switch (cfg->model_type) {
        case MS_MODEL_BERT:
            return "embeddings.word_embeddings.weight";
        case MS_MODEL_LLAMA:
            return "model.embed_tokens.weight";
        default:
            return "wte.weight";
    }
}

ms_status ms_model_def_from_config(const ms_model_config *cfg, int seq, ms_model_def *out,
                                   ms_error *err) {
    memset(out, 0, sizeof *out);
    if (seq < 1) return ms_fail(err, MS_ERR_INVALID, "model: --seq %d must be at least 1", seq);
    snprintf(out->name, sizeof out->name, "%s", ms_model_type_name(cfg->model_type));
    out->hooks = &lm_hooks;
    out->n_blocks = cfg->n_layer;
    out->lm = cfg;
    add_input(out, "input_ids", seq);
    if (cfg->model_type != MS_MODEL_LLAMA) add_input(out, "position_ids", seq);
    if (cfg->model_type == MS_MODEL_BERT) {
        int k = ms_model_mlm_positions(cfg, seq);
        add_input(out, "masked_lm_labels", k);
        add_input(out, "masked_lm_positions", k);
    } else {
        add_input(out, "targets", seq);
    }
    if (ms_model_ties_embedding(cfg)) snprintf(out->tied, sizeof out->tied, "%s", tied_name(cfg));
    return MS_OK;
}

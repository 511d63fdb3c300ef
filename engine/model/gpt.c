/* gpt.c - GPT-2 and BERT graphs. */
#include "engine/model/gpt.h"

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/model/llama.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

typedef struct builder {
    ms_graph *g;
    const ms_model_config *c;
    int B, T, C, H, V;
    int stream;   /* dropout stream counter: one Philox stream per dropout site */
    bool unfused; /* the fused operators' reference: each elementwise step its own op */
} builder;

static int param(builder *b, const char *name, int ndim, const int64_t *shape, ms_init init) {
    return ms_graph_param(b->g, name, ndim, shape, init);
}

static int op1(builder *b, int op, const ms_op_attrs *a, int x, const char *name) {
    return ms_graph_op(b->g, op, a, 1, &x, name);
}

static int op2(builder *b, int op, const ms_op_attrs *a, int x, int y, const char *name) {
    int in[2] = {x, y};
    return ms_graph_op(b->g, op, a, 2, in, name);
}

static int layernorm(builder *b, int x, const char *prefix) {
    char n[96];
    const int64_t c[1] = {b->C};
    snprintf(n, sizeof n, "%s.weight", prefix);
    int w = param(b, n, 1, c, (ms_init){MS_INIT_CONST, 1.0f});
    snprintf(n, sizeof n, "%s.bias", prefix);
    int bias = param(b, n, 1, c, (ms_init){MS_INIT_CONST, 0.0f});
    ms_op_attrs a = {.f = {(float)b->c->layer_norm_epsilon}};
    int in[3] = {x, w, bias};
    return ms_graph_op(b->g, MS_OP_LAYERNORM, &a, 3, in, prefix);
}

/* x @ W, W [in, out...]; the layer's bias [out...] in *bias, for the caller to add (alone or
 * fused with what follows). */
static int matmul_of(builder *b, int x, const char *prefix, int wnd, const int64_t *wshape,
                     float std, int *bias) {
    char n[96], on[96];
    snprintf(n, sizeof n, "%s.weight", prefix);
    int w = param(b, n, wnd, wshape, (ms_init){MS_INIT_NORMAL, std});
    snprintf(n, sizeof n, "%s.bias", prefix);
    *bias = param(b, n, wnd - 1, wshape + 1, (ms_init){MS_INIT_CONST, 0.0f});
    snprintf(on, sizeof on, "%s.mm", prefix);
    return op2(b, MS_OP_MATMUL, NULL, x, w, on);
}

/* x @ W + bias. */
static int linear(builder *b, int x, const char *prefix, int wnd, const int64_t *wshape,
                  float std) {
    int bias, y = matmul_of(b, x, prefix, wnd, wshape, std, &bias);
    return op2(b, MS_OP_BIAS, NULL, y, bias, prefix);
}

/* gelu(x @ W + bias): the bias inside bias_gelu. */
static int linear_gelu(builder *b, int x, const char *prefix, int wnd, const int64_t *wshape,
                       float std, const char *gelu_name) {
    int bias, y = matmul_of(b, x, prefix, wnd, wshape, std, &bias);
    if (!b->unfused) return op2(b, MS_OP_BIAS_GELU, NULL, y, bias, gelu_name);
    y = op2(b, MS_OP_BIAS, NULL, y, bias, prefix);
    return op1(b, MS_OP_GELU, NULL, y, gelu_name);
}

static int dropout(builder *b, int x, double p, const char *name) {
    if (p <= 0) return x;
    ms_op_attrs a = {.i = {b->stream++}, .f = {(float)p}};
    return op1(b, MS_OP_DROPOUT, &a, x, name);
}

/* res + dropout(x @ W + bias), the output projection joining the residual stream: one
 * bias_dropout_add named `add_name` (a stream name, placed as the residual), or the chain. */
static int linear_dropout_add(builder *b, int x, int res, const char *prefix, int wnd,
                              const int64_t *wshape, float std, const char *drop_name,
                              const char *add_name) {
    int bias, y = matmul_of(b, x, prefix, wnd, wshape, std, &bias);
    double p = b->c->resid_pdrop;
    if (b->unfused) {
        y = dropout(b, op2(b, MS_OP_BIAS, NULL, y, bias, prefix), p, drop_name);
        return op2(b, MS_OP_ADD, NULL, res, y, add_name);
    }
    ms_op_attrs a = {.i = {p > 0 ? b->stream++ : 0}, .f = {p > 0 ? (float)p : 0.0f}};
    int in[3] = {y, bias, res};
    return ms_graph_op(b->g, MS_OP_BIAS_DROPOUT_ADD, &a, 3, in, add_name);
}

/* The first attention-dropout stream (layer l's is this + l): far above the numbered sites. */
#define GPT_ATTN_DROPOUT_STREAM (1 << 20)

/* Attention with its output projection, dropout and the residual add: res + attn(x). */
static int attention_block(builder *b, int x, int res, int l, bool causal) {
    char p[64], n[96], r[64];
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)b->c->n_layer);
    snprintf(p, sizeof p, "h.%d.attn.c_attn", l);
    const int64_t wqkv[3] = {b->C, 3, b->C};
    int qkv = linear(b, x, p, 3, wqkv, std);
    /* attn_pdrop drops probabilities inside the fused op, on a stream of its own per layer
     * (apart from the numbered dropout sites, so they keep their masks) */
    const double ap = b->c->attn_pdrop;
    ms_op_attrs aa = {.i = {b->H, causal, ap > 0 ? GPT_ATTN_DROPOUT_STREAM + l : 0},
                      .f = {ap > 0 ? (float)ap : 0.0f}};
    snprintf(n, sizeof n, "h.%d.attn.core", l);
    ms_graph_region_begin(b->g, MS_REGION_ATTENTION); /* selective recompute drops its T x T */
    int a = op1(b, MS_OP_ATTENTION, &aa, qkv, n);
    ms_graph_region_end(b->g, MS_REGION_ATTENTION);
    snprintf(p, sizeof p, "h.%d.attn.c_proj", l);
    const int64_t wo[2] = {b->C, b->C};
    snprintf(n, sizeof n, "h.%d.attn.dropout", l);
    snprintf(r, sizeof r, "h.%d.res1", l);
    return linear_dropout_add(b, a, res, p, 2, wo, proj_std, n, r);
}

/* The MLP with its dropout and the residual add: res + mlp(x). */
static int mlp_block(builder *b, int x, int res, int l) {
    char p[64], n[96], r[64];
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)b->c->n_layer);
    snprintf(p, sizeof p, "h.%d.mlp.c_fc", l);
    const int64_t w1[2] = {b->C, 4 * (int64_t)b->C};
    snprintf(n, sizeof n, "h.%d.mlp.gelu", l);
    int h = linear_gelu(b, x, p, 2, w1, std, n);
    snprintf(p, sizeof p, "h.%d.mlp.c_proj", l);
    const int64_t w2[2] = {4 * (int64_t)b->C, b->C};
    snprintf(n, sizeof n, "h.%d.mlp.dropout", l);
    snprintf(r, sizeof r, "h.%d.res2", l);
    return linear_dropout_add(b, h, res, p, 2, w2, proj_std, n, r);
}

static ms_status check_dims(const ms_model_config *c, int B, int T, ms_error *err) {
    if (B < 1 || T < 1)
        return ms_fail(err, MS_ERR_INVALID, "model: batch %d and sequence %d must be positive", B,
                       T);
    if (T > c->n_positions)
        return ms_fail(err, MS_ERR_INVALID,
                       "model: sequence length %d exceeds n_positions %d; "
                       "use --seq %d or less",
                       T, c->n_positions, c->n_positions);
    if (c->n_head < 1 || c->n_embd % c->n_head)
        return ms_fail(err, MS_ERR_INVALID, "model: n_embd %d is not divisible by n_head %d",
                       c->n_embd, c->n_head);
    return MS_OK;
}

/* The word embedding: read by the first chunk's lookup and the last chunk's tied head. */
static int word_embedding(builder *b) {
    const int64_t wte_s[2] = {b->V, b->C};
    const char *name =
        b->c->model_type == MS_MODEL_BERT ? "embeddings.word_embeddings.weight" : "wte.weight";
    return param(b, name, 2, wte_s, (ms_init){MS_INIT_NORMAL, 0.02f});
}

static int embed(builder *b, ms_model *out, int wte) {
    const ms_model_config *cfg = b->c;
    bool bert = cfg->model_type == MS_MODEL_BERT;
    const int64_t bt[2] = {b->B, b->T}, wpe_s[2] = {cfg->n_positions, b->C};
    out->ids = ms_graph_input(b->g, "input_ids", 2, bt);
    out->pos = ms_graph_input(b->g, "position_ids", 2, bt);
    const char *wpe_name = bert ? "embeddings.position_embeddings.weight" : "wpe.weight";
    int wpe = param(b, wpe_name, 2, wpe_s, (ms_init){MS_INIT_NORMAL, 0.01f});
    int tok = op2(b, MS_OP_EMBEDDING, NULL, out->ids, wte, "tok_emb");
    int posv = op2(b, MS_OP_EMBEDDING, NULL, out->pos, wpe, "pos_emb");
    int x = op2(b, MS_OP_ADD, NULL, tok, posv, "embed");
    x = dropout(b, x, cfg->embd_pdrop, "embed.dropout");
    if (bert) x = layernorm(b, x, "embeddings.LayerNorm");
    return x;
}

/* GPT-2: pre-LayerNorm residual blocks. */
static int gpt2_block(builder *b, int x, int l) {
    char n[64];
    snprintf(n, sizeof n, "h.%d.ln_1", l);
    x = attention_block(b, layernorm(b, x, n), x, l, true);
    snprintf(n, sizeof n, "h.%d.ln_2", l);
    return mlp_block(b, layernorm(b, x, n), x, l);
}

/* BERT: post-LayerNorm, bidirectional attention. */
static int bert_block(builder *b, int x, int l) {
    char n[64];
    x = attention_block(b, x, x, l, false);
    snprintf(n, sizeof n, "h.%d.ln_1", l);
    x = layernorm(b, x, n);
    x = mlp_block(b, x, x, l);
    snprintf(n, sizeof n, "h.%d.ln_2", l);
    return layernorm(b, x, n);
}

/* One transformer layer, its operators one recompute region (full recompute keeps only x). */
static int block(builder *b, int x, int l) {
    ms_graph_region_begin(b->g, MS_REGION_BLOCK);
    int y = b->c->model_type == MS_MODEL_BERT ? bert_block(b, x, l) : gpt2_block(b, x, l);
    ms_graph_region_end(b->g, MS_REGION_BLOCK);
    return y;
}

/* BERT's masked-LM head on the masked positions only, gathered first (as the reference
 * implementations' masked_lm_positions): [B, T, C] -> [B, k, C], then dense + GELU +
 * LayerNorm and the tied decoder on B x k rows instead of B x T. */
static int mlm_transform(builder *b, ms_model *out, int x) {
    const int64_t bk[2] = {b->B, out->mlm_per_row};
    out->targets = ms_graph_input(b->g, "masked_lm_labels", 2, bk);
    out->mlm_pos = ms_graph_input(b->g, "masked_lm_positions", 2, bk);
    ms_op_attrs along_t = {.i = {1}};
    x = op2(b, MS_OP_BATCH_GATHER, &along_t, x, out->mlm_pos, "masked_hidden");
    const int64_t wd[2] = {b->C, b->C};
    x = linear_gelu(b, x, "cls.predictions.transform.dense", 2, wd, 0.02f,
                    "cls.predictions.transform.gelu");
    return layernorm(b, x, "cls.predictions.transform.LayerNorm");
}

static void head(builder *b, ms_model *out, int x, int wte) {
    if (b->c->model_type == MS_MODEL_BERT) {
        x = mlm_transform(b, out, x);
    } else {
        const int64_t bt[2] = {b->B, b->T};
        out->targets = ms_graph_input(b->g, "targets", 2, bt);
        x = layernorm(b, x, "ln_f");
    }
    ms_op_attrs tb = {.i = {1}};
    out->logits = op2(b, MS_OP_MATMUL, &tb, x, wte, "logits");
    int losses = op2(b, MS_OP_XENT, NULL, out->logits, out->targets, "losses");
    ms_op_attrs all = {.i = {-1}};
    out->loss = op1(b, MS_OP_MEAN, &all, losses, "loss");
    ms_graph_set_loss(b->g, out->loss);
}

ms_status ms_model_build_chunk(const ms_model_config *cfg, int B, int T, const ms_model_chunk *ch,
                               ms_model *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    out->ids = out->targets = out->pos = out->loss = out->logits = -1;
    out->hidden_in = out->hidden_out = out->mlm_pos = -1;
    MS_CHECK(check_dims(cfg, B, T, err));
    if (ch->layer_lo < 0 || ch->layer_hi < ch->layer_lo || ch->layer_hi > cfg->n_layer ||
        (!ch->first && !ch->last && ch->layer_hi == ch->layer_lo))
        return ms_fail(err, MS_ERR_INVALID,
                       "model: chunk of layers [%d, %d) does not fit a model of %d layers, or "
                       "holds nothing",
                       ch->layer_lo, ch->layer_hi, cfg->n_layer);
    if (cfg->model_type == MS_MODEL_LLAMA) {
        MS_CHECK(ms_llama_check(cfg, err));
        ms_llama_build_chunk(cfg, B, T, ch, out);
        ms_status st = ms_graph_error(out->g, err);
        if (st != MS_OK) ms_model_free(out);
        return st;
    }
    builder b = {.g = ms_graph_create(),
                 .c = cfg,
                 .B = B,
                 .T = T,
                 .C = cfg->n_embd,
                 .H = cfg->n_head,
                 .V = cfg->vocab_size,
                 .unfused = ch->unfused};
    /* Dropout streams are numbered model-wide (the embedding's, then two per layer), so a
     * chunk's masks are the whole model's. The first chunk numbers its embedding's itself. */
    if (!ch->first)
        b.stream = (cfg->embd_pdrop > 0 ? 1 : 0) + (cfg->resid_pdrop > 0 ? 2 : 0) * ch->layer_lo;
    out->mlm_per_row = ms_model_mlm_positions(cfg, T);
    int wte = ch->first || ch->last ? word_embedding(&b) : -1;
    int x;
    if (ch->first) {
        x = embed(&b, out, wte);
    } else {
        const int64_t btc[3] = {B, T, cfg->n_embd};
        x = out->hidden_in = ms_graph_input(b.g, "hidden_in", 3, btc);
        ms_graph_input_grad(b.g, x);
    }
    for (int l = ch->layer_lo; l < ch->layer_hi; l++) x = block(&b, x, l);
    if (ch->last) {
        head(&b, out, x, wte);
    } else {
        out->hidden_out = x;
        ms_graph_set_output(b.g, x);
    }
    out->g = b.g;
    out->B = B;
    out->T = T;
    ms_status st = ms_graph_error(b.g, err);
    if (st != MS_OK) ms_model_free(out);
    return st;
}

ms_status ms_model_build(const ms_model_config *cfg, int B, int T, ms_model *out, ms_error *err) {
    ms_model_chunk whole = {.layer_hi = cfg->n_layer, .first = true, .last = true};
    return ms_model_build_chunk(cfg, B, T, &whole, out, err);
}

int ms_model_mlm_positions(const ms_model_config *c, int T) {
    return c->model_type == MS_MODEL_BERT ? (int)ceil(0.15 * T) : 0;
}

void ms_model_checkpoint_shape(const char *name, const ms_shape *internal, ms_shape *file) {
    *file = *internal;
    if (ms_llama_checkpoint_shape(name, internal, file)) return;
    size_t n = strlen(name);
    const char *w = "attn.c_attn.weight", *bb = "attn.c_attn.bias";
    if (n >= strlen(w) && !strcmp(name + n - strlen(w), w) && internal->ndim == 3) {
        file->ndim = 2;
        file->d[1] = internal->d[1] * internal->d[2];
    } else if (n >= strlen(bb) && !strcmp(name + n - strlen(bb), bb) && internal->ndim == 2) {
        file->ndim = 1;
        file->d[0] = internal->d[0] * internal->d[1];
    }
}

void ms_model_mlm_mask(const ms_model *m, uint64_t seed, uint64_t batch, int32_t *ids,
                       int32_t *targets) {
    int T = m->T, k = m->mlm_per_row;
    int *perm = xmalloc(sizeof(int) * (size_t)T);
    for (int r = 0; r < m->B; r++) {
        int32_t *row = ids + (size_t)r * T, *tg = targets + (size_t)r * T;
        for (int t = 0; t < T; t++) perm[t] = t, tg[t] = -1;
        /* The first k steps of a Fisher-Yates shuffle pick k distinct positions. */
        for (int j = 0; j < k && j < T; j++) {
            uint32_t w[4];
            ms_philox_words(seed ^ 0x6d6c6dULL, batch, (uint64_t)r * (uint64_t)T + (uint64_t)j, w);
            int pick = j + (int)(w[0] % (uint32_t)(T - j));
            int tmp = perm[j];
            perm[j] = perm[pick], perm[pick] = tmp;
            int pos = perm[j];
            tg[pos] = row[pos];
            row[pos] = MS_MLM_MASK_ID;
        }
    }
    free(perm);
}

void ms_model_head_inputs(const ms_model *m, int rows, const int32_t *targets, float *targets_out,
                          float *positions_out) {
    int T = m->T, k = m->mlm_per_row;
    if (!k) {
        for (int64_t i = 0; targets_out && i < (int64_t)rows * T; i++)
            targets_out[i] = (float)targets[i];
        return;
    }
    for (int r = 0; r < rows; r++) {
        const int32_t *tg = targets + (size_t)r * T;
        int j = 0;
        for (int t = 0; t < T && j < k; t++) {
            if (tg[t] < 0) continue;
            if (targets_out) targets_out[(size_t)r * k + j] = (float)tg[t];
            if (positions_out) positions_out[(size_t)r * k + j] = (float)t;
            j++;
        }
        for (; j < k; j++) {
            if (targets_out) targets_out[(size_t)r * k + j] = -1.0f;
            if (positions_out) positions_out[(size_t)r * k + j] = 0.0f;
        }
    }
}

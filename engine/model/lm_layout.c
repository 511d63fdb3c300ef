/* lm_layout.c - the built-in transformers' layer descriptions the closed form prices. */
#include "engine/model/lm_layout.h"

#include <string.h>

#include "engine/model/gpt.h"
#include "engine/ops/op.h"

static void add_linear(ms_lm_layout *f, int64_t k, int64_t n, ms_lm_split split, bool bias,
                       bool same_input) {
    f->lin[f->n_lin++] = (ms_lm_linear){
        .k = k, .n = n, .split = (uint8_t)split, .bias = bias, .same_input = same_input};
}

/* GPT-2 and BERT (gpt.c): c_attn [h, 3h] and c_fc [h, 4h] column-parallel, the two c_proj
 * row-parallel, all with biases; LayerNorm; GELU. c_fc's bias is inside bias_gelu, the
 * c_proj's inside bias_dropout_add. */
static void gpt_layer(const ms_model_config *c, ms_lm_layout *f) {
    const int64_t h = c->n_embd;
    add_linear(f, h, 3 * h, MS_LM_COLUMN, true, false); /* attn.c_attn */
    add_linear(f, h, h, MS_LM_ROW, true, false);        /* attn.c_proj */
    add_linear(f, h, 4 * h, MS_LM_COLUMN, true, false); /* mlp.c_fc */
    add_linear(f, 4 * h, h, MS_LM_ROW, true, false);    /* mlp.c_proj */
    f->lin[1].fuse = f->lin[3].fuse = MS_LM_FUSE_RESIDUAL;
    f->lin[2].fuse = MS_LM_FUSE_GELU;
    f->attn_at = 1;
    f->norm_op = MS_OP_LAYERNORM, f->norm_params = 2, f->norms = 2;
    f->act_op = MS_OP_GELU, f->act_width = 4 * h;
    f->pos_rows = c->n_positions;
}

/* LLaMA (llama.c): q [h, H d], k and v [h, Hkv d], o [H d, h], gate and up [h, I], down
 * [I, h], no biases; RMSNorm; SwiGLU; rotary positions. Under tp (strategy.c) q, gate and up
 * are column-parallel, o and down row-parallel, the embedding and lm_head vocab-parallel; k
 * and v shard with the query heads when the kv heads divide tp and are whole otherwise. */
static void llama_layer(const ms_model_config *c, int tp, ms_lm_layout *f) {
    const int64_t h = c->n_embd, qd = f->heads * f->head_dim, kvd = f->kv_heads * f->head_dim;
    const int64_t I = c->intermediate_size;
    f->kv_whole = tp > 1 && f->kv_heads % tp != 0;
    ms_lm_split kv = f->kv_whole ? MS_LM_WHOLE : MS_LM_COLUMN;
    add_linear(f, h, qd, MS_LM_COLUMN, false, false); /* q_proj */
    add_linear(f, h, kvd, kv, false, true);           /* k_proj */
    add_linear(f, h, kvd, kv, false, true);           /* v_proj */
    add_linear(f, qd, h, MS_LM_ROW, false, false);    /* o_proj */
    add_linear(f, h, I, MS_LM_COLUMN, false, false);  /* gate_proj */
    add_linear(f, h, I, MS_LM_COLUMN, false, true);   /* up_proj */
    add_linear(f, I, h, MS_LM_ROW, false, false);     /* down_proj */
    f->attn_at = 3;
    f->norm_op = MS_OP_RMSNORM, f->norm_params = 1, f->norms = 2;
    f->act_op = MS_OP_SWIGLU, f->act_width = I;
    f->gqa = f->linear_op = true;
    f->final_norm = f->megatron_sp = true;
}

void ms_lm_layout_of(const ms_model_config *c, int tp, int seq, ms_lm_layout *f) {
    memset(f, 0, sizeof *f);
    f->type = c->model_type;
    f->h = c->n_embd;
    f->heads = c->n_head;
    f->kv_heads = c->model_type == MS_MODEL_LLAMA && c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
    f->head_dim = c->n_embd / c->n_head;
    f->vocab = c->vocab_size;
    f->tied = ms_model_ties_embedding(c);
    f->dropout = c->resid_pdrop > 0;
    f->causal = c->model_type != MS_MODEL_BERT;
    if (c->model_type == MS_MODEL_LLAMA) {
        llama_layer(c, tp, f);
        return;
    }
    gpt_layer(c, f);
    bool bert = c->model_type == MS_MODEL_BERT;
    f->emb_norm = f->head_transform = bert;
    f->head_rows = ms_model_mlm_positions(c, seq);
    f->final_norm = !bert;
}

double ms_lm_layout_layer_params(const ms_lm_layout *f, int tp) {
    double p = (double)f->norms * f->norm_params * f->h;
    for (int i = 0; i < f->n_lin; i++) {
        const ms_lm_linear *l = &f->lin[i];
        double t = l->split == MS_LM_WHOLE ? 1 : tp;
        p += (double)l->k * l->n / t;
        if (l->bias) p += l->split == MS_LM_COLUMN ? l->n / t : l->n;
    }
    return p;
}

int ms_lm_layout_layer_tensors(const ms_lm_layout *f) {
    int n = f->norms * f->norm_params; /* weight, and bias for LayerNorm */
    for (int i = 0; i < f->n_lin; i++) n += 1 + f->lin[i].bias;
    return n;
}

int ms_lm_layout_first_tensors(const ms_lm_layout *f) {
    return 1 + (f->pos_rows > 0) + (f->emb_norm ? f->norm_params : 0);
}

int ms_lm_layout_last_tensors(const ms_lm_layout *f) {
    return 1 + (f->final_norm ? f->norm_params : 0) + (f->head_transform ? 2 + f->norm_params : 0);
}

double ms_lm_layout_first_params(const ms_lm_layout *f, int tp, bool vocab_parallel) {
    double h = (double)f->h, p = (double)f->vocab * h / (vocab_parallel ? tp : 1);
    p += (double)f->pos_rows * h;
    if (f->emb_norm) p += f->norm_params * h;
    return p;
}

double ms_lm_layout_last_params(const ms_lm_layout *f, int tp, bool vocab_parallel) {
    double h = (double)f->h, p = (double)f->vocab * h / (vocab_parallel ? tp : 1);
    if (f->final_norm) p += f->norm_params * h;
    if (f->head_transform) p += h * h + h + f->norm_params * h;
    return p;
}

bool ms_lm_same_model(const ms_model_config *a, const ms_model_config *b) {
    return a->model_type == b->model_type && a->n_layer == b->n_layer && a->n_head == b->n_head &&
           a->n_embd == b->n_embd && a->vocab_size == b->vocab_size &&
           a->n_kv_head == b->n_kv_head && a->intermediate_size == b->intermediate_size &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->n_positions == b->n_positions &&
           a->resid_pdrop == b->resid_pdrop && a->attn_pdrop == b->attn_pdrop &&
           a->embd_pdrop == b->embd_pdrop;
}

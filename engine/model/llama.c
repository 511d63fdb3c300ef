/* llama.c - the LLaMA graph. */
#include "engine/model/llama.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct llama {
    ms_graph *g;
    const ms_model_config *c;
    int B, T, C, H, Hkv, D;
    int attention_op; /* gqa_attention, or the config's registered "attention_op" */
} llama;

static int weight(llama *m, const char *name, int ndim, const int64_t *shape, float std) {
    return ms_graph_param(m->g, name, ndim, shape, (ms_init){MS_INIT_NORMAL, std});
}

/* x W^T over the last `kdims` dims of x; LLaMA's projections have no bias. */
static int project(llama *m, int x, const char *prefix, int wnd, const int64_t *wshape, int kdims,
                   float std) {
    char n[96];
    snprintf(n, sizeof n, "%s.weight", prefix);
    int in[2] = {x, weight(m, n, wnd, wshape, std)};
    ms_op_attrs a = {.i = {kdims}};
    return ms_graph_op(m->g, MS_OP_LINEAR, &a, 2, in, prefix);
}

static int rmsnorm(llama *m, int x, const char *prefix) {
    char n[96];
    const int64_t c[1] = {m->C};
    snprintf(n, sizeof n, "%s.weight", prefix);
    int in[2] = {x, ms_graph_param(m->g, n, 1, c, (ms_init){MS_INIT_CONST, 1.0f})};
    ms_op_attrs a = {.f = {(float)m->c->layer_norm_epsilon}};
    return ms_graph_op(m->g, MS_OP_RMSNORM, &a, 2, in, prefix);
}

static int rotary(llama *m, int x, const char *name) {
    ms_op_attrs a = {.f = {(float)m->c->rope_theta}};
    return ms_graph_op(m->g, MS_OP_ROTARY, &a, 1, &x, name);
}

static int add(llama *m, int x, int y, const char *name) {
    int in[2] = {x, y};
    return ms_graph_op(m->g, MS_OP_ADD, NULL, 2, in, name);
}

static int attention(llama *m, int x, int l) {
    char p[96], n[96];
    const float std = 0.02f, out_std = 0.02f / sqrtf(2.0f * (float)m->c->n_layer);
    const int64_t wq[3] = {m->H, m->D, m->C}, wkv[3] = {m->Hkv, m->D, m->C};
    int in[3];
    snprintf(p, sizeof p, "model.layers.%d.self_attn.q_proj", l);
    in[0] = project(m, x, p, 3, wq, 1, std);
    snprintf(p, sizeof p, "model.layers.%d.self_attn.k_proj", l);
    in[1] = project(m, x, p, 3, wkv, 1, std);
    snprintf(p, sizeof p, "model.layers.%d.self_attn.v_proj", l);
    in[2] = project(m, x, p, 3, wkv, 1, std);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.q_rotary", l);
    in[0] = rotary(m, in[0], n);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.k_rotary", l);
    in[1] = rotary(m, in[1], n);
    ms_op_attrs causal = {.i = {1}};
    snprintf(n, sizeof n, "model.layers.%d.self_attn.core", l);
    ms_graph_region_begin(m->g, MS_REGION_ATTENTION);
    int a = ms_graph_op(m->g, m->attention_op, &causal, 3, in, n);
    ms_graph_region_end(m->g, MS_REGION_ATTENTION);
    const int64_t wo[3] = {m->C, m->H, m->D};
    snprintf(p, sizeof p, "model.layers.%d.self_attn.o_proj", l);
    return project(m, a, p, 3, wo, 2, out_std);
}

static int mlp(llama *m, int x, int l) {
    char p[96], n[96];
    const float std = 0.02f, out_std = 0.02f / sqrtf(2.0f * (float)m->c->n_layer);
    const int64_t I = m->c->intermediate_size, wup[2] = {I, m->C}, wdown[2] = {m->C, I};
    int in[2];
    snprintf(p, sizeof p, "model.layers.%d.mlp.gate_proj", l);
    in[0] = project(m, x, p, 2, wup, 1, std);
    snprintf(p, sizeof p, "model.layers.%d.mlp.up_proj", l);
    in[1] = project(m, x, p, 2, wup, 1, std);
    snprintf(n, sizeof n, "model.layers.%d.mlp.swiglu", l);
    int h = ms_graph_op(m->g, MS_OP_SWIGLU, NULL, 2, in, n);
    snprintf(p, sizeof p, "model.layers.%d.mlp.down_proj", l);
    return project(m, h, p, 2, wdown, 1, out_std);
}

/* One pre-norm layer, one recompute region (full recompute keeps only x). */
static int layer(llama *m, int x, int l) {
    char n[96];
    ms_graph_region_begin(m->g, MS_REGION_BLOCK);
    snprintf(n, sizeof n, "model.layers.%d.input_layernorm", l);
    int a = attention(m, rmsnorm(m, x, n), l);
    snprintf(n, sizeof n, "model.layers.%d.res1", l);
    x = add(m, x, a, n);
    snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm", l);
    int f = mlp(m, rmsnorm(m, x, n), l);
    snprintf(n, sizeof n, "model.layers.%d.res2", l);
    x = add(m, x, f, n);
    ms_graph_region_end(m->g, MS_REGION_BLOCK);
    return x;
}

static void head(llama *m, ms_model *out, int x, int embed) {
    const int64_t bt[2] = {m->B, m->T}, wv[2] = {m->c->vocab_size, m->C};
    out->targets = ms_graph_input(m->g, "targets", 2, bt);
    x = rmsnorm(m, x, "model.norm");
    int in[2] = {x, embed >= 0 ? embed : weight(m, "lm_head.weight", 2, wv, 0.02f)};
    ms_op_attrs k1 = {.i = {1}};
    out->logits = ms_graph_op(m->g, MS_OP_LINEAR, &k1, 2, in, "logits");
    in[0] = out->logits, in[1] = out->targets;
    int losses = ms_graph_op(m->g, MS_OP_XENT, NULL, 2, in, "losses");
    ms_op_attrs all = {.i = {-1}};
    out->loss = ms_graph_op(m->g, MS_OP_MEAN, &all, 1, &losses, "loss");
    ms_graph_set_loss(m->g, out->loss);
}

void ms_llama_build_chunk(const ms_model_config *cfg, int B, int T, const ms_model_chunk *ch,
                          ms_model *out) {
    llama m = {.g = ms_graph_create(),
               .c = cfg,
               .B = B,
               .T = T,
               .C = cfg->n_embd,
               .H = cfg->n_head,
               .Hkv = cfg->n_kv_head,
               .D = cfg->n_embd / cfg->n_head,
               .attention_op =
                   cfg->attention_op[0] ? ms_op_find(cfg->attention_op) : MS_OP_GQA_ATTENTION};
    const int64_t bt[2] = {B, T}, wv[2] = {cfg->vocab_size, cfg->n_embd};
    bool tied = cfg->tie_word_embeddings;
    int embed = ch->first || (ch->last && tied)
                    ? weight(&m, "model.embed_tokens.weight", 2, wv, 0.02f)
                    : -1;
    int x;
    if (ch->first) {
        out->ids = ms_graph_input(m.g, "input_ids", 2, bt);
        int in[2] = {out->ids, embed};
        x = ms_graph_op(m.g, MS_OP_EMBEDDING, NULL, 2, in, "model.embed_tokens");
    } else {
        const int64_t btc[3] = {B, T, cfg->n_embd};
        x = out->hidden_in = ms_graph_input(m.g, "hidden_in", 3, btc);
        ms_graph_input_grad(m.g, x);
    }
    for (int l = ch->layer_lo; l < ch->layer_hi; l++) x = layer(&m, x, l);
    if (ch->last) {
        head(&m, out, x, tied ? embed : -1);
    } else {
        out->hidden_out = x;
        ms_graph_set_output(m.g, x);
    }
    out->g = m.g;
    out->B = B;
    out->T = T;
}

ms_status ms_llama_check(const ms_model_config *cfg, ms_error *err) {
    if (!cfg->attention_op[0]) return MS_OK;
    int op = ms_op_find(cfg->attention_op);
    const ms_op_def *def = op >= 0 ? ms_op_get(op) : NULL;
    if (!def)
        return ms_fail(err, MS_ERR_INVALID,
                       "model: attention_op \"%s\" is not a registered operator; register it "
                       "with ms_op_register before building the model, or remove the key",
                       cfg->attention_op);
    if (def->n_out != 1 || !(def->n_in == 3 || def->n_in <= -3))
        return ms_fail(err, MS_ERR_INVALID,
                       "model: attention_op \"%s\" must take q, k and v and give one output "
                       "(it takes %d inputs and gives %d outputs)",
                       cfg->attention_op, def->n_in, def->n_out);
    return MS_OK;
}

bool ms_llama_checkpoint_shape(const char *name, const ms_shape *internal, ms_shape *file) {
    static const char *const heads_first[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                              "self_attn.v_proj.weight"};
    size_t n = strlen(name);
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(heads_first[i]);
        if (n >= k && !strcmp(name + n - k, heads_first[i]) && internal->ndim == 3) {
            *file = *internal;
            file->ndim = 2;
            file->d[0] = internal->d[0] * internal->d[1];
            file->d[1] = internal->d[2];
            return true;
        }
    }
    const char *o = "self_attn.o_proj.weight";
    if (n >= strlen(o) && !strcmp(name + n - strlen(o), o) && internal->ndim == 3) {
        *file = *internal;
        file->ndim = 2;
        file->d[1] = internal->d[1] * internal->d[2];
        return true;
    }
    return false;
}

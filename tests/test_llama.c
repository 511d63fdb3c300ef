/* test_llama.c - the LLaMA model: config keys, the forward against a float64 reference, and
 * distributed training against one rank.
 *
 * The reference below is written from the LLaMA definition (Hugging Face modeling_llama):
 * RMSNorm, rotary embeddings on q and k (pairs i, i + D/2), grouped-query causal attention,
 * SwiGLU, an untied head. It loads the same random weights as the engine's graph and compares
 * logits and loss. Test names end in _wN, the world size they need.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "tests/equiv.h"
#include "tests/testkit.h"

/* --- config ------------------------------------------------------------------------------------
 */

static ms_model_config llama_config(int kv_heads, bool tied) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": %d, \"hidden_size\": 16, \"intermediate_size\": 24, "
             "\"vocab_size\": 256, \"max_position_embeddings\": 16, \"rope_theta\": 500.0, "
             "\"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": %s, \"hidden_act\": \"silu\"}",
             kv_heads, tied ? "true" : "false");
    ms_model_config c;
    ms_error err = {0};
    if (ms_config_from_string(json, strlen(json), "llama.json", &c, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return c;
}

static void expect_config_error(const char *json, const char *words) {
    ms_model_config c;
    ms_error err = {0};
    assert_int_equal(ms_config_from_string(json, strlen(json), "x.json", &c, &err), MS_ERR_INVALID);
    if (!strstr(err.msg, words)) fail_msg("expected '%s' in: %s", words, err.msg);
}

#define LLAMA_BASE                                                                                 \
    "\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "            \
    "\"hidden_size\": 16, \"intermediate_size\": 24, \"vocab_size\": 256, "                        \
    "\"max_position_embeddings\": 16"

static void config_keys_w1(void **state) {
    (void)state;
    ms_model_config c = llama_config(2, true);
    assert_int_equal(c.model_type, MS_MODEL_LLAMA);
    assert_int_equal(c.n_kv_head, 2);
    assert_int_equal(c.intermediate_size, 24);
    assert_true(c.tie_word_embeddings);
    assert_true(fabs(c.rope_theta - 500) < 1e-9 && fabs(c.layer_norm_epsilon - 1e-5) < 1e-12);
    const char *defaults = "{" LLAMA_BASE "}";
    ms_error err = {0};
    assert_int_equal(ms_config_from_string(defaults, strlen(defaults), NULL, &c, &err), MS_OK);
    assert_int_equal(c.n_kv_head, 4); /* num_key_value_heads defaults to the heads */
    assert_false(c.tie_word_embeddings);
    assert_true(fabs(c.rope_theta - 10000) < 1e-9);
    expect_config_error("{" LLAMA_BASE ", \"num_key_value_heads\": 3}", "does not divide");
    expect_config_error("{" LLAMA_BASE ", \"rope_thet\": 1}",
                        "closest known key is \"rope_theta\"");
    expect_config_error("{" LLAMA_BASE ", \"hidden_act\": \"gelu\"}", "silu");
    expect_config_error("{" LLAMA_BASE ", \"attention_bias\": true}", "no bias");
    expect_config_error("{" LLAMA_BASE ", \"rope_scaling\": {\"type\": \"linear\"}}", "unscaled");
    expect_config_error("{" LLAMA_BASE ", \"n_layer\": 2}", "unknown key \"n_layer\"");
    expect_config_error("{\"model_type\": \"llama\", \"num_hidden_layers\": 2, "
                        "\"num_attention_heads\": 4, \"hidden_size\": 12, \"intermediate_size\": "
                        "24, \"vocab_size\": 256, \"max_position_embeddings\": 16}",
                        "odd");
}

/* --- the forward against a float64 reference -------------------------------------------------- */

enum { FB = 2, FT = 7, MAXP = 32 };

typedef struct weights {
    int n;
    char names[MAXP][96];
    double *w[MAXP];
} weights;

static const double *find(const weights *W, const char *fmt, int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    for (int i = 0; i < W->n; i++)
        if (!strcmp(W->names[i], name)) return W->w[i];
    fail_msg("no parameter %s", name);
    return NULL;
}

/* y[n] = sum_k x[k] W[n][k] (W in the file's [N, K] layout). */
static void matvec(double *y, const double *W, const double *x, int N, int K) {
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += W[(size_t)n * K + k] * x[k];
        y[n] = s;
    }
}

static void rms(double *y, const double *x, const double *w, int C, double eps) {
    double ss = 0;
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    double s = 1 / sqrt(ss / C + eps);
    for (int i = 0; i < C; i++) y[i] = x[i] * s * w[i];
}

static void rope(double *v, int heads, int D, int pos, double theta) {
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < D / 2; i++) {
            double ang = pos * pow(theta, -2.0 * i / D), *a = v + h * D + i, *b = a + D / 2;
            double x = *a, y = *b;
            *a = x * cos(ang) - y * sin(ang);
            *b = y * cos(ang) + x * sin(ang);
        }
}

/* Causal grouped-query attention of one sequence: q [T, H*D], k, v [T, Hkv*D] -> o [T, H*D]. */
static void attend(double *o, const double *q, const double *k, const double *v, int T, int H,
                   int Hkv, int D) {
    double sc[FT];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / Hkv);
            double mx = -INFINITY, z = 0;
            for (int s = 0; s <= t; s++) {
                double d = 0;
                for (int i = 0; i < D; i++)
                    d += q[t * H * D + h * D + i] * k[s * Hkv * D + g * D + i];
                sc[s] = d / sqrt(D);
                mx = fmax(mx, sc[s]);
            }
            for (int s = 0; s <= t; s++) z += sc[s] = exp(sc[s] - mx);
            for (int i = 0; i < D; i++) {
                double acc = 0;
                for (int s = 0; s <= t; s++) acc += sc[s] / z * v[s * Hkv * D + g * D + i];
                o[t * H * D + h * D + i] = acc;
            }
        }
}

static void reference_layer(const ms_model_config *c, const weights *W, int l, double *x) {
    const int T = FT, C = c->n_embd, H = c->n_head, Hkv = c->n_kv_head, D = C / H,
              I = c->intermediate_size;
    double *q = xcalloc((size_t)T * H * D, sizeof *q), *k = xcalloc((size_t)T * Hkv * D, 8),
           *v = xcalloc((size_t)T * Hkv * D, 8), *o = xcalloc((size_t)T * H * D, 8), n[64], y[64],
           g[64], u[64];
    for (int t = 0; t < T; t++) {
        rms(n, x + t * C, find(W, "model.layers.%d.input_layernorm.weight", l), C,
            c->layer_norm_epsilon);
        matvec(q + t * H * D, find(W, "model.layers.%d.self_attn.q_proj.weight", l), n, H * D, C);
        matvec(k + t * Hkv * D, find(W, "model.layers.%d.self_attn.k_proj.weight", l), n, Hkv * D,
               C);
        matvec(v + t * Hkv * D, find(W, "model.layers.%d.self_attn.v_proj.weight", l), n, Hkv * D,
               C);
        rope(q + t * H * D, H, D, t, c->rope_theta);
        rope(k + t * Hkv * D, Hkv, D, t, c->rope_theta);
    }
    attend(o, q, k, v, T, H, Hkv, D);
    for (int t = 0; t < T; t++) {
        double *xt = x + t * C;
        matvec(y, find(W, "model.layers.%d.self_attn.o_proj.weight", l), o + t * H * D, C, H * D);
        for (int i = 0; i < C; i++) xt[i] += y[i];
        rms(n, xt, find(W, "model.layers.%d.post_attention_layernorm.weight", l), C,
            c->layer_norm_epsilon);
        matvec(g, find(W, "model.layers.%d.mlp.gate_proj.weight", l), n, I, C);
        matvec(u, find(W, "model.layers.%d.mlp.up_proj.weight", l), n, I, C);
        for (int i = 0; i < I; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        matvec(y, find(W, "model.layers.%d.mlp.down_proj.weight", l), g, C, I);
        for (int i = 0; i < C; i++) xt[i] += y[i];
    }
    free(q), free(k), free(v), free(o);
}

/* Logits [FB, FT, V] and the mean cross-entropy of one batch. */
static double reference_forward(const ms_model_config *c, const weights *W, const int *ids,
                                const int *tgt, double *logits) {
    const int C = c->n_embd, V = c->vocab_size;
    const double *emb = find(W, "model.embed_tokens.weight", 0);
    const double *head = c->tie_word_embeddings ? emb : find(W, "lm_head.weight", 0);
    double *x = xcalloc((size_t)FT * C, sizeof *x), n[64], loss = 0;
    for (int b = 0; b < FB; b++) {
        for (int t = 0; t < FT; t++) memcpy(x + t * C, emb + (size_t)ids[b * FT + t] * C, 8 * C);
        for (int l = 0; l < c->n_layer; l++) reference_layer(c, W, l, x);
        for (int t = 0; t < FT; t++) {
            double *z = logits + ((size_t)b * FT + t) * V, mx = -INFINITY, s = 0;
            rms(n, x + t * C, find(W, "model.norm.weight", 0), C, c->layer_norm_epsilon);
            matvec(z, head, n, V, C);
            for (int i = 0; i < V; i++) mx = fmax(mx, z[i]);
            for (int i = 0; i < V; i++) s += exp(z[i] - mx);
            loss += mx + log(s) - z[tgt[b * FT + t]];
        }
    }
    free(x);
    return loss / (FB * FT);
}

typedef struct fwd_arg {
    ms_model_config cfg;
    const char *strategy;
} fwd_arg;

/* Random weights (norm weights around 1), the same on every rank, loaded into the program and
 * kept in float64 for the reference. */
static void load_weights(mt_rank *r, ms_program *p, weights *W) {
    ms_error err = {0};
    W->n = ms_program_num_params(p);
    for (int i = 0; i < W->n && i < MAXP; i++) {
        ms_param_view pv;
        ms_program_param(p, i, &pv);
        snprintf(W->names[i], sizeof W->names[i], "%s", pv.name);
        int64_t len = 1;
        for (int d = 0; d < pv.gshape.ndim; d++) len *= pv.gshape.d[d];
        float *f = xmalloc(sizeof(float) * (size_t)len);
        W->w[i] = xmalloc(sizeof(double) * (size_t)len);
        bool norm = strstr(pv.name, "norm") != NULL;
        for (int64_t k = 0; k < len; k++) {
            /* a fixed pseudo-random sequence per parameter, the same on every rank */
            double u = sin(12.9898 * (double)(k + 1) + 78.233 * (i + 1)) * 43758.5453;
            u = u - floor(u) - 0.5;
            f[k] = (float)(norm ? 1 + 0.4 * u : 0.6 * u);
            W->w[i][k] = f[k];
        }
        MT_OK(r, ms_program_load_param(p, i, f, &err), &err);
        free(f);
    }
}

static void forward_run(mt_rank *r, void *arg) {
    fwd_arg *a = arg;
    ms_error err = {0};
    ms_strategy s;
    ms_placement_rules rules = {0};
    if (!MT_OK(r, ms_strategy_parse_json(a->strategy, strlen(a->strategy), "s", &s, &rules, &err),
               &err))
        return;
    ms_mesh mesh;
    ms_strategy_mesh(&s, &mesh, &err);
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_model m;
    if (!MT_OK(r, ms_model_build(&a->cfg, FB, FT, &m, &err), &err)) return;
    MT_CHECK(r, m.pos < 0, "LLaMA takes no position input (rotary positions are implicit)");
    ms_graph_keep(m.g, m.logits);
    ms_program *p;
    ms_sharding sh = {.s = &s, .kv_heads = a->cfg.n_kv_head};
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sh, .seed = 3};
    if (!MT_OK(r, ms_program_compile(m.g, dm, &co, &p, &err), &err)) return;
    weights W = {0};
    load_weights(r, p, &W);
    int ids[FB * FT], tgt[FB * FT];
    float fid[FB * FT], ftg[FB * FT];
    for (int i = 0; i < FB * FT; i++) {
        ids[i] = (i * 37 + 11) % a->cfg.vocab_size, tgt[i] = (i * 53 + 5) % a->cfg.vocab_size;
        fid[i] = (float)ids[i], ftg[i] = (float)tgt[i];
    }
    ms_program_feed(p, m.ids, fid, &err);
    ms_program_feed(p, m.targets, ftg, &err);
    float loss = 0;
    ms_tensor lg = {0};
    if (MT_OK(r, ms_program_forward(p, &loss, &err), &err) &&
        MT_OK(r, ms_program_value(p, m.logits, &lg, &err), &err)) {
        size_t n = (size_t)FB * FT * a->cfg.vocab_size;
        double *ref = xmalloc(sizeof(double) * n), worst = 0, scale = 0;
        double want = reference_forward(&a->cfg, &W, ids, tgt, ref);
        const float *got = ms_tensor_f32(&lg);
        for (size_t i = 0; i < n; i++) {
            worst = fmax(worst, fabs(got[i] - ref[i]));
            scale = fmax(scale, fabs(ref[i]));
        }
        MT_CHECK(r, scale > 0.1, "degenerate logits (largest %g): the test could not fail", scale);
        MT_CHECK(r, worst <= 1e-4 * scale, "logits differ by %.3g (largest %.3g)", worst, scale);
        MT_CHECK(r, fabs(loss - want) <= 1e-5 * fabs(want), "loss %.7f, reference %.7f", loss,
                 want);
        free(ref);
        ms_tensor_release(&lg);
    }
    for (int i = 0; i < W.n; i++) free(W.w[i]);
    ms_program_destroy(p);
    ms_model_free(&m);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void check_forward(ms_model_config cfg, const char *strategy, int world) {
    fwd_arg a = {cfg, strategy};
    mt_run(world, forward_run, &a);
}

static void forward_gqa_w1(void **state) {
    (void)state;
    check_forward(llama_config(2, false), "{\"dp\": 1}", 1);
}
static void forward_mqa_tied_w1(void **state) {
    (void)state;
    check_forward(llama_config(1, true), "{\"dp\": 1}", 1);
}
static void forward_tp2_w2(void **state) {
    (void)state;
    check_forward(llama_config(2, false), "{\"tp\": 2}", 2);
}
static void forward_tp2_kv1_w2(void **state) {
    (void)state;
    check_forward(llama_config(1, false), "{\"tp\": 2}", 2);
}

/* --- the tp layout: placements and collectives of the compiled program ------------------------
 * Compiled for mesh coordinate 0 without ranks (ms_program_compile_shapes): what the engine
 * would run, read off its reshards. */

typedef struct tp_counts {
    int fwd[MS_RSTEP_KIND_COUNT], bwd[MS_RSTEP_KIND_COUNT], other; /* collectives only */
} tp_counts;

/* configs/llama-tiny.json's shapes (3 layers): the completion weighs bytes, so the layout is
 * checked where activations outweigh the weights, as in training. */
static ms_model_config layout_config(int kv_heads) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": %d, \"hidden_size\": 128, \"intermediate_size\": 352, "
             "\"vocab_size\": 256, \"max_position_embeddings\": 128}",
             kv_heads);
    ms_model_config c;
    ms_error err = {0};
    if (ms_config_from_string(json, strlen(json), "llama.json", &c, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return c;
}

static ms_program *compile_layout(const ms_model_config *cfg, const char *strategy, ms_model *m) {
    ms_error err = {0};
    ms_strategy s;
    if (ms_strategy_parse_json(strategy, strlen(strategy), "s", &s, NULL, &err) != MS_OK)
        fail_msg("%s", err.msg);
    ms_mesh mesh;
    assert_int_equal(ms_strategy_mesh(&s, &mesh, &err), MS_OK);
    if (ms_model_build(cfg, 8, 64, m, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_sharding sh = {.s = &s, .kv_heads = cfg->n_kv_head};
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sh, .seed = 3};
    const int coords[3] = {0};
    ms_program *p;
    if (ms_program_compile_shapes(m->g, &mesh, coords, &co, &p, &err) != MS_OK)
        fail_msg("%s", err.msg);
    ms_mesh_free(&mesh);
    return p;
}

/* Collectives (steps that move bytes) of the reshards named `prefix`*, by phase and kind.
 * Weights must never move in the forward or backward: Megatron keeps every shard local. */
static tp_counts count_collectives(const ms_program *p, const char *prefix) {
    tp_counts c = {0};
    for (int i = 0; i < ms_program_num_reshards(p); i++) {
        ms_reshard_info r;
        assert_int_equal(ms_program_reshard(p, i, &r), MS_OK);
        bool weight = strstr(r.name, ".weight") != NULL;
        if (weight && r.phase != MS_PROG_GRAD_SYNC && r.coll_bytes > 0)
            fail_msg("parameter %s is moved (%s) in the step", r.name,
                     r.phase == MS_PROG_FORWARD ? "forward" : "backward");
        if (strncmp(r.name, prefix, strlen(prefix)) || !r.plan) continue;
        for (int k = 0; k < r.plan->nsteps; k++) {
            const ms_rstep *st = &r.plan->steps[k];
            if (st->coll_bytes <= 0) continue;
            if (r.phase == MS_PROG_FORWARD)
                c.fwd[st->kind]++;
            else if (r.phase == MS_PROG_BACKWARD)
                c.bwd[st->kind]++;
            else
                c.other++;
        }
    }
    return c;
}

static void expect_counts(const tp_counts *c, const char *what, const int *fwd, const int *bwd) {
    for (int k = 0; k < MS_RSTEP_KIND_COUNT; k++)
        if (c->fwd[k] != fwd[k] || c->bwd[k] != bwd[k])
            fail_msg("%s: %d forward and %d backward %s, expected %d and %d", what, c->fwd[k],
                     c->bwd[k], ms_rstep_name((ms_rstep_kind)k), fwd[k], bwd[k]);
    if (c->other) fail_msg("%s: %d collectives outside forward and backward", what, c->other);
}

/* Megatron-LM per layer: without sp one all-reduce after o_proj and after down_proj, and in
 * the backward one per column-parallel group (q/k/v, gate/up); with sp each all-reduce is a
 * reduce-scatter of the row-parallel output and an all-gather of the next norm's output (the
 * backward: the duals). Layer 0 also reduces the vocab-parallel lookup. */
static void check_layer_collectives(const char *strategy, bool sp) {
    ms_model_config cfg = layout_config(2);
    ms_model m;
    ms_program *p = compile_layout(&cfg, strategy, &m);
    int fwd[MS_RSTEP_KIND_COUNT] = {0}, bwd[MS_RSTEP_KIND_COUNT] = {0};
    if (sp) {
        fwd[MS_RSTEP_REDUCE_SCATTER] = 2, fwd[MS_RSTEP_ALL_GATHER] = 2;
        bwd[MS_RSTEP_ALL_GATHER] = 2, bwd[MS_RSTEP_ALL_REDUCE] = 2;
    } else {
        fwd[MS_RSTEP_ALL_REDUCE] = 2, bwd[MS_RSTEP_ALL_REDUCE] = 2;
    }
    for (int l = 1; l < cfg.n_layer; l++) {
        char prefix[64], what[96];
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        snprintf(what, sizeof what, "%s, layer %d", strategy, l);
        tp_counts c = count_collectives(p, prefix);
        expect_counts(&c, what, fwd, bwd);
    }
    /* the lookup: one all-reduce of its partial sums, nothing in the backward */
    tp_counts e = count_collectives(p, "model.embed_tokens");
    int efwd[MS_RSTEP_KIND_COUNT] = {[MS_RSTEP_ALL_REDUCE] = 1}, none[MS_RSTEP_KIND_COUNT] = {0};
    expect_counts(&e, "the embedding", efwd, none);
    ms_program_destroy(p);
    ms_model_free(&m);
}

static void collectives_per_layer_tp2_w1(void **state) {
    (void)state;
    check_layer_collectives("{\"tp\": 2}", false);
}
static void collectives_per_layer_tp2_sp_w1(void **state) {
    (void)state;
    check_layer_collectives("{\"tp\": 2, \"sp\": true}", true);
}

/* Placements of the named parameters on the tp mesh dim. */
static void expect_tp_placement(ms_program *p, const char *name, ms_placement want) {
    for (int i = 0; i < ms_program_num_params(p); i++) {
        ms_param_view pv;
        ms_program_param(p, i, &pv);
        if (strcmp(pv.name, name)) continue;
        ms_placement got = pv.pl.p[1];
        if (!ms_placement_same_kind(got, want) || (got.kind == MS_PL_SHARD && got.dim != want.dim))
            fail_msg("%s: placement on tp is not the Megatron layout's", name);
        return;
    }
    fail_msg("no parameter %s", name);
}

/* One kv head over tp 2: k and v replicated, the query heads and o_proj split, the MLP and
 * both vocab ends sharded. */
static void layout_tp2_kv1_w1(void **state) {
    (void)state;
    ms_model_config cfg = layout_config(1);
    ms_model m;
    ms_program *p = compile_layout(&cfg, "{\"tp\": 2}", &m);
    expect_tp_placement(p, "model.layers.0.self_attn.q_proj.weight", ms_pl_shard(0));
    expect_tp_placement(p, "model.layers.0.self_attn.k_proj.weight", ms_pl_replicate());
    expect_tp_placement(p, "model.layers.0.self_attn.v_proj.weight", ms_pl_replicate());
    expect_tp_placement(p, "model.layers.0.self_attn.o_proj.weight", ms_pl_shard(1));
    expect_tp_placement(p, "model.layers.1.mlp.down_proj.weight", ms_pl_shard(1));
    expect_tp_placement(p, "model.embed_tokens.weight", ms_pl_shard(0));
    expect_tp_placement(p, "lm_head.weight", ms_pl_shard(0));
    /* attention runs on the query-head shard: its output is head-sharded, not gathered */
    bool core_split = false;
    for (int i = 0; i < ms_program_num_kernels(p); i++) {
        ms_kernel_info k;
        assert_int_equal(ms_program_kernel(p, i, &k), MS_OK);
        if (k.phase == MS_PROG_FORWARD && !strcmp(k.name, "model.layers.0.self_attn.core"))
            core_split = k.out_pl[0].p[1].kind == MS_PL_SHARD && k.out_pl[0].p[1].dim == 2;
    }
    assert_true(core_split);
    ms_program_destroy(p);
    ms_model_free(&m);
}

/* --- training against one rank -----------------------------------------------------------------
 */

static void check(int kv_heads, bool tied, const char *strategy, int world) {
    ms_model_config cfg = llama_config(kv_heads, tied);
    mt_equiv_check_model(&cfg, strategy, NULL, NULL, world);
}

static void train_dp2_w2(void **state) {
    (void)state;
    check(2, false, "{\"dp\": 2}", 2);
}
static void train_tp2_w2(void **state) {
    (void)state;
    check(2, false, "{\"tp\": 2}", 2);
}
static void train_tp2_kv1_w2(void **state) {
    (void)state;
    check(1, false, "{\"tp\": 2}", 2);
}
static void train_dp2_tp2_w4(void **state) {
    (void)state;
    check(2, false, "{\"dp\": 2, \"tp\": 2}", 4);
}
static void train_tp2_sp_w2(void **state) {
    (void)state;
    check(2, false, "{\"tp\": 2, \"sp\": true}", 2);
}
static void train_cp2_w2(void **state) {
    (void)state;
    check(2, false, "{\"cp\": 2}", 2);
}
static void train_pp2_w2(void **state) {
    (void)state;
    check(2, false, "{\"pp\": 2, \"micro_batches\": 2}", 2);
}
static void train_pp2_tied_w2(void **state) {
    (void)state;
    check(1, true, "{\"pp\": 2, \"micro_batches\": 2}", 2);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(config_keys_w1),
    cmocka_unit_test(forward_gqa_w1),
    cmocka_unit_test(forward_mqa_tied_w1),
    cmocka_unit_test(forward_tp2_w2),
    cmocka_unit_test(forward_tp2_kv1_w2),
    cmocka_unit_test(collectives_per_layer_tp2_w1),
    cmocka_unit_test(collectives_per_layer_tp2_sp_w1),
    cmocka_unit_test(layout_tp2_kv1_w1),
    cmocka_unit_test(train_dp2_w2),
    cmocka_unit_test(train_tp2_w2),
    cmocka_unit_test(train_tp2_kv1_w2),
    cmocka_unit_test(train_dp2_tp2_w4),
    cmocka_unit_test(train_tp2_sp_w2),
    cmocka_unit_test(train_cp2_w2),
    cmocka_unit_test(train_pp2_w2),
    cmocka_unit_test(train_pp2_tied_w2),
};
MT_MAIN("llama", tests)

/* speech_classifier.c - your own model in C: a speech-style classifier, a 1-D convolution
 * front end and a transformer encoder, trained by meshscope under any strategy (docs/models.md).
 *
 *   speech_classifier make-data FILE [--samples N]   synthetic utterances into FILE
 *   speech_classifier train --data FILE [meshscope train's options]
 *
 * The model: FEATS x FRAMES features per utterance (as log-mel frames, channels first), two
 * conv1d layers (the second halves the frames), positions added, NB pre-norm transformer
 * encoder blocks (bidirectional attention, GELU MLP; each a pipeline cut point and a
 * recompute region), a final norm, the mean over frames and a linear head over CLASSES with a
 * mean cross-entropy.
 *
 * Tensor parallelism is Megatron's for the encoder (the fused q/k/v weight [C, 3, C] split by
 * heads, the output projection by rows, the MLP by columns then rows), given by name in the
 * shard hook; the front end and the head stay replicated, and the engine infers the rest.
 * Written against the public API only (engine/model/model.h, cli/meshscope.h,
 * engine/io/safetensors.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/meshscope.h"
#include "engine/core/philox.h"
#include "engine/io/safetensors.h"
#include "engine/model/model.h"
#include "engine/model/strategy.h"

enum { FEATS = 8, FRAMES = 64, T = FRAMES / 2, C = 32, HEADS = 4, CLASSES = 10, BLOCKS = 4 };

/* --- the model ------------------------------------------------------------------------------ */

/* An operator whose output is named `name`: the name the trace, the views and explain show. */
static int op(ms_graph *g, int kind, const ms_op_attrs *a, int n, const int *in, const char *name) {
    return ms_graph_op(g, kind, a, n, in, name);
}

static int param(ms_graph *g, const char *name, int ndim, const int64_t *shape, ms_init init) {
    return ms_graph_param(g, name, ndim, shape, init);
}

static int weight2(ms_graph *g, const char *name, int64_t a, int64_t b) {
    const int64_t s[2] = {a, b};
    return param(g, name, 2, s, (ms_init){MS_INIT_NORMAL, 0.08f});
}

static int layernorm(ms_graph *g, int x, const char *prefix) {
    char wn[96], bn[96];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(bn, sizeof bn, "%s.bias", prefix);
    const int64_t cs[1] = {C};
    int w = param(g, wn, 1, cs, (ms_init){MS_INIT_CONST, 1.0f});
    int b = param(g, bn, 1, cs, (ms_init){MS_INIT_CONST, 0.0f});
    ms_op_attrs a = {.f = {1e-5f}};
    return op(g, MS_OP_LAYERNORM, &a, 3, (int[]){x, w, b}, prefix);
}

/* A conv1d of width 3 with its weight prefix.weight, its output named prefix, then GELU. */
static int conv1d_gelu(ms_graph *g, int x, const char *prefix, int cin, int cout, int stride) {
    char n[96];
    snprintf(n, sizeof n, "%s.weight", prefix);
    const int64_t ws[3] = {cout, cin, 3};
    int w = param(g, n, 3, ws, (ms_init){MS_INIT_NORMAL, 0.2f});
    ms_op_attrs a = {.i = {stride, 1, 1, 1}}; /* stride, padding, dilation, groups */
    x = op(g, MS_OP_CONV1D, &a, 2, (int[]){x, w}, prefix);
    snprintf(n, sizeof n, "%s.gelu", prefix);
    return op(g, MS_OP_GELU, NULL, 1, &x, n);
}

/* features [N, FEATS, FRAMES] -> [N, T, C]: two convolutions, frames to the middle, positions */
static int front_end(ms_graph *g, int x) {
    x = conv1d_gelu(g, x, "frontend.conv1", FEATS, C, 1);
    x = conv1d_gelu(g, x, "frontend.conv2", C, C, 2);
    ms_op_attrs swap = {.i = {1, 2}};
    x = op(g, MS_OP_TRANSPOSE, &swap, 1, &x, "frontend.frames");
    const int64_t ps[2] = {T, C};
    int pos = param(g, "frontend.positions", 2, ps, (ms_init){MS_INIT_NORMAL, 0.02f});
    return op(g, MS_OP_BIAS, NULL, 2, (int[]){x, pos}, "frontend.out");
}

static int attention(ms_graph *g, int x, int l) {
    char n[96];
    snprintf(n, sizeof n, "encoder.%d.attn.qkv.weight", l);
    const int64_t qs[3] = {C, 3, C};
    int wqkv = param(g, n, 3, qs, (ms_init){MS_INIT_NORMAL, 0.08f});
    snprintf(n, sizeof n, "encoder.%d.attn.qkv", l);
    int qkv = op(g, MS_OP_MATMUL, NULL, 2, (int[]){x, wqkv}, n); /* [N, T, 3, C] */
    ms_op_attrs a = {.i = {HEADS, 0}};                           /* bidirectional */
    snprintf(n, sizeof n, "encoder.%d.attn.core", l);
    int y = op(g, MS_OP_ATTENTION, &a, 1, &qkv, n);
    snprintf(n, sizeof n, "encoder.%d.attn.out.weight", l);
    int w = weight2(g, n, C, C);
    snprintf(n, sizeof n, "encoder.%d.attn.out", l);
    return op(g, MS_OP_MATMUL, NULL, 2, (int[]){y, w}, n);
}

static int mlp(ms_graph *g, int x, int l) {
    char n1[96], n2[96];
    snprintf(n1, sizeof n1, "encoder.%d.mlp.fc1.weight", l);
    snprintf(n2, sizeof n2, "encoder.%d.mlp.fc2.weight", l);
    int w1 = weight2(g, n1, C, 4 * C), w2 = weight2(g, n2, 4 * C, C);
    n1[strlen(n1) - 7] = n2[strlen(n2) - 7] = '\0'; /* drop ".weight": the products' names */
    int h = op(g, MS_OP_MATMUL, NULL, 2, (int[]){x, w1}, n1);
    char gn[96];
    snprintf(gn, sizeof gn, "encoder.%d.mlp.gelu", l);
    h = op(g, MS_OP_GELU, NULL, 1, &h, gn);
    return op(g, MS_OP_MATMUL, NULL, 2, (int[]){h, w2}, n2);
}

/* Encoder block l (pre-norm): x + attn(ln(x)), then + mlp(ln(.)). */
static int block(ms_graph *g, int x, int l) {
    char n[96];
    ms_graph_region_begin(g, MS_REGION_BLOCK);
    snprintf(n, sizeof n, "encoder.%d.ln1", l);
    int a = attention(g, layernorm(g, x, n), l);
    snprintf(n, sizeof n, "encoder.%d.attn.residual", l);
    x = op(g, MS_OP_ADD, NULL, 2, (int[]){x, a}, n);
    snprintf(n, sizeof n, "encoder.%d.ln2", l);
    int m = mlp(g, layernorm(g, x, n), l);
    snprintf(n, sizeof n, "encoder.%d.mlp.residual", l);
    x = op(g, MS_OP_ADD, NULL, 2, (int[]){x, m}, n);
    ms_graph_region_end(g, MS_REGION_BLOCK);
    return x;
}

static int head(ms_graph *g, ms_model *out, int x, int rows) {
    x = layernorm(g, x, "head.ln");
    ms_op_attrs frames = {.i = {1}};
    x = op(g, MS_OP_MEAN, &frames, 1, &x, "head.pool"); /* [N, C] */
    int w = weight2(g, "head.weight", C, CLASSES);
    out->logits = op(g, MS_OP_MATMUL, NULL, 2, (int[]){x, w}, "head.logits");
    const int64_t ls[1] = {rows};
    int label = ms_graph_input(g, "label", 1, ls);
    int losses = op(g, MS_OP_XENT, NULL, 2, (int[]){out->logits, label}, "head.losses");
    ms_op_attrs all = {.i = {-1}};
    return op(g, MS_OP_MEAN, &all, 1, &losses, "loss");
}

static ms_status build_chunk(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                             ms_model *out, ms_error *err) {
    (void)d, (void)err;
    memset(out, 0, sizeof *out);
    out->loss = out->logits = out->hidden_in = out->hidden_out = -1;
    ms_graph *g = out->g = ms_graph_create();
    int x;
    if (ch->first) {
        const int64_t fs[3] = {rows, FEATS, FRAMES};
        x = front_end(g, ms_graph_input(g, "features", 3, fs));
    } else {
        const int64_t hs[3] = {rows, T, C};
        x = out->hidden_in = ms_graph_input(g, "hidden_in", 3, hs);
        ms_graph_input_grad(g, x);
    }
    for (int l = ch->layer_lo; l < ch->layer_hi; l++) x = block(g, x, l);
    if (!ch->last) {
        out->hidden_out = x;
        ms_graph_set_output(g, x);
        return MS_OK;
    }
    out->loss = head(g, out, x, rows);
    ms_graph_set_loss(g, out->loss);
    return MS_OK;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Megatron's encoder split over tp (mesh dim 1). */
static bool shard(const ms_model_def *d, const ms_strategy *s, const char *name,
                  const ms_shape *shape, int mesh_ndim, ms_placements *pl) {
    (void)d, (void)shape;
    if (s->tp < 2 || mesh_ndim < 2 || strncmp(name, "encoder.", 8)) return false;
    int dim = ends_with(name, "qkv.weight")   ? 2 /* by heads */
              : ends_with(name, "out.weight") ? 0
              : ends_with(name, "fc1.weight") ? 1
              : ends_with(name, "fc2.weight") ? 0
                                              : -1;
    if (dim < 0) return false;
    *pl = ms_placements_replicated(mesh_ndim);
    pl->p[1] = ms_pl_shard(dim);
    ms_placements_default_order(pl);
    return true;
}

static const ms_model_hooks hooks = {.build_chunk = build_chunk, .shard = shard};

static ms_model_def speech_def(void) {
    ms_model_def d = {.name = "speech-encoder", .hooks = &hooks, .n_blocks = BLOCKS, .ninputs = 2};
    d.inputs[0] = (ms_model_input){.name = "features", .ndim = 2, .shape = {FEATS, FRAMES}};
    d.inputs[1] = (ms_model_input){.name = "label", .ndim = 0, .integer = true};
    return d;
}

/* --- synthetic data ------------------------------------------------------------------------- */

/* Utterance i of class c = i % CLASSES: a tone whose pitch (cycles per utterance) is the
 * class's, loudest in feature band c % FEATS, gliding up or down by the class's parity, over
 * noise. */
static void make_utterance(uint64_t i, float *x, float *label) {
    int c = (int)(i % CLASSES);
    double cycles = 2 + c, glide = c % 2 ? 0.5 : -0.5;
    for (int f = 0; f < FEATS; f++)
        for (int t = 0; t < FRAMES; t++) {
            double u = (double)t / FRAMES, amp = f == c % FEATS ? 1.5 : 0.3;
            double v = amp * sin(2 * M_PI * (cycles * u + glide * u * u) + 0.3 * f);
            x[f * FRAMES + t] =
                (float)(v + 0.2 * ms_philox_normal(9, i, (uint64_t)(f * FRAMES + t)));
        }
    *label = (float)c;
}

static int make_data(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: speech_classifier make-data FILE [--samples N]\n");
        return 2;
    }
    long n = 1024;
    if (argc >= 4 && !strcmp(argv[2], "--samples")) n = strtol(argv[3], NULL, 10);
    if (n < 1 || n > 1000000) {
        fprintf(stderr, "speech_classifier make-data: --samples takes 1 to 1000000\n");
        return 2;
    }
    size_t per = (size_t)FEATS * FRAMES;
    float *x = malloc(sizeof(float) * per * (size_t)n), *lab = malloc(sizeof(float) * (size_t)n);
    if (!x || !lab) {
        free(x), free(lab);
        fprintf(stderr, "speech_classifier make-data: out of memory\n");
        return 1;
    }
    for (long i = 0; i < n; i++) make_utterance((uint64_t)i, x + per * (size_t)i, lab + i);
    ms_st_entry e[2] = {
        {.name = "features", .dtype = MS_F32, .ndim = 3, .shape = {n, FEATS, FRAMES}, .data = x},
        {.name = "label", .dtype = MS_F32, .ndim = 1, .shape = {n}, .data = lab}};
    ms_error err = {0};
    ms_status st = ms_safetensors_write(argv[1], e, 2, NULL, 0, &err);
    free(x), free(lab);
    if (st != MS_OK) {
        fprintf(stderr, "speech_classifier make-data: %s\n", err.msg);
        return 1;
    }
    printf("wrote %ld utterances of %d features x %d frames and their labels to %s\n", n, FEATS,
           FRAMES, argv[1]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "make-data")) return make_data(argc - 1, argv + 1);
    ms_model_def def = speech_def();
    return meshscope_main_with_model(argc, argv, &def);
}

/* image_classifier.c - your own model in C: a small ResNet that classifies images, trained by
 * meshscope under any strategy (docs/models.md walks through it).
 *
 *   image_classifier make-data FILE [--samples N]   synthetic images into FILE (safetensors)
 *   image_classifier train --data FILE [meshscope train's options: --dp, --tp, --pp, --zero,
 *                          --recompute, --precision, --tui, --web, --save-dir, ...]
 *
 * The model: 3 x 16 x 16 images, a 3x3 conv stem to 16 channels, NB residual blocks of
 * conv-norm-ReLU-conv-norm + skip (each a pipeline cut point and a recompute region), global
 * average pooling and a linear head over 10 classes with a mean cross-entropy.
 *
 * Tensor parallelism for a CNN is channel sharding: each block's first conv splits its output
 * channels (column parallel), its norm and ReLU run on the channel shards, and its second conv
 * splits its input channels (row parallel), whose partial sums one all-reduce completes, as
 * Megatron splits an MLP. The shard hook below says so by parameter name; everything else
 * (the activations' placements, the collectives) the engine infers.
 *
 * Written against the public API only: engine/model/model.h (the model), cli/meshscope.h (the
 * command line) and engine/io/safetensors.h (writing the data).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/meshscope.h"
#include "engine/core/philox.h"
#include "engine/io/safetensors.h"
#include "engine/model/model.h"
#include "engine/model/strategy.h"

enum { CH_IN = 3, SIDE = 16, WIDTH = 16, GROUPS = 4, CLASSES = 10, BLOCKS = 4 };

/* --- the model ------------------------------------------------------------------------------ */

/* An operator whose output is named `name`: the name the trace, the views and explain show. */
static int op(ms_graph *g, int kind, const ms_op_attrs *a, int n, const int *in, const char *name) {
    return ms_graph_op(g, kind, a, n, in, name);
}

static const char *suffixed(char *buf, size_t cap, const char *prefix, const char *what) {
    snprintf(buf, cap, "%s.%s", prefix, what);
    return buf;
}

/* A 3x3 conv, stride 1, padding 1, no bias: its weight is prefix.weight, its output prefix. */
static int conv3x3(ms_graph *g, int x, const char *prefix, int cin, int cout) {
    char n[96];
    const int64_t ws[4] = {cout, cin, 3, 3};
    int w = ms_graph_param(g, suffixed(n, sizeof n, prefix, "weight"), 4, ws,
                           (ms_init){MS_INIT_NORMAL, 0.15f});
    ms_op_attrs a = {.i = {1, 1, 1, 1, 1, 1, 1}}; /* strides, paddings, dilations, groups */
    return op(g, MS_OP_CONV2D, &a, 2, (int[]){x, w}, prefix);
}

static int norm(ms_graph *g, int x, const char *prefix) {
    char wn[96], bn[96];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(bn, sizeof bn, "%s.bias", prefix);
    const int64_t cs[1] = {WIDTH};
    int w = ms_graph_param(g, wn, 1, cs, (ms_init){MS_INIT_CONST, 1.0f});
    int b = ms_graph_param(g, bn, 1, cs, (ms_init){MS_INIT_CONST, 0.0f});
    ms_op_attrs a = {.i = {GROUPS}, .f = {1e-5f}};
    return op(g, MS_OP_GROUP_NORM, &a, 3, (int[]){x, w, b}, prefix);
}

static int relu(ms_graph *g, int x, const char *name) {
    return op(g, MS_OP_RELU, NULL, 1, &x, name);
}

/* Block l: relu(x + norm(conv(relu(norm(conv(x)))))). */
static int block(ms_graph *g, int x, int l) {
    char n[96];
    ms_graph_region_begin(g, MS_REGION_BLOCK);
    snprintf(n, sizeof n, "blocks.%d.conv1", l);
    int y = conv3x3(g, x, n, WIDTH, WIDTH);
    snprintf(n, sizeof n, "blocks.%d.norm1", l);
    y = norm(g, y, n);
    snprintf(n, sizeof n, "blocks.%d.relu1", l);
    y = relu(g, y, n);
    snprintf(n, sizeof n, "blocks.%d.conv2", l);
    y = conv3x3(g, y, n, WIDTH, WIDTH);
    snprintf(n, sizeof n, "blocks.%d.norm2", l);
    y = norm(g, y, n);
    snprintf(n, sizeof n, "blocks.%d.residual", l);
    y = op(g, MS_OP_ADD, NULL, 2, (int[]){x, y}, n);
    snprintf(n, sizeof n, "blocks.%d.out", l);
    y = relu(g, y, n);
    ms_graph_region_end(g, MS_REGION_BLOCK);
    return y;
}

static int head(ms_graph *g, ms_model *out, int x, int rows) {
    int p = op(g, MS_OP_GLOBAL_AVG_POOL, NULL, 1, &x, "head.pool"); /* [N, C, 1, 1] */
    ms_op_attrs flat = {.i = {2, rows, WIDTH}};
    p = op(g, MS_OP_RESHAPE, &flat, 1, &p, "head.flat");
    const int64_t ws[2] = {WIDTH, CLASSES};
    int w = ms_graph_param(g, "head.weight", 2, ws, (ms_init){MS_INIT_NORMAL, 0.2f});
    out->logits = op(g, MS_OP_MATMUL, NULL, 2, (int[]){p, w}, "head.logits");
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
        const int64_t is[4] = {rows, CH_IN, SIDE, SIDE};
        x = conv3x3(g, ms_graph_input(g, "image", 4, is), "stem.conv", CH_IN, WIDTH);
        x = relu(g, norm(g, x, "stem.norm"), "stem.relu");
    } else { /* what the previous pipeline chunk sent */
        const int64_t hs[4] = {rows, WIDTH, SIDE, SIDE};
        x = out->hidden_in = ms_graph_input(g, "hidden_in", 4, hs);
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

/* Channel sharding over tp (mesh dim 1): conv1 by output channels, conv2 by input channels.
 * norm1 then runs on the channel shards (each holds whole groups); everything else follows. */
static bool shard(const ms_model_def *d, const ms_strategy *s, const char *name,
                  const ms_shape *shape, int mesh_ndim, ms_placements *pl) {
    (void)d, (void)shape;
    if (s->tp < 2 || mesh_ndim < 2 || strncmp(name, "blocks.", 7)) return false;
    int dim = ends_with(name, "conv1.weight") ? 0 : ends_with(name, "conv2.weight") ? 1 : -1;
    if (dim < 0) return false;
    *pl = ms_placements_replicated(mesh_ndim);
    pl->p[1] = ms_pl_shard(dim);
    ms_placements_default_order(pl);
    return true;
}

static const ms_model_hooks hooks = {.build_chunk = build_chunk, .shard = shard};

static ms_model_def resnet_def(void) {
    ms_model_def d = {.name = "tiny-resnet", .hooks = &hooks, .n_blocks = BLOCKS, .ninputs = 2};
    d.inputs[0] = (ms_model_input){.name = "image", .ndim = 3, .shape = {CH_IN, SIDE, SIDE}};
    d.inputs[1] = (ms_model_input){.name = "label", .ndim = 0, .integer = true};
    return d;
}

/* --- synthetic data ------------------------------------------------------------------------- */

/* Image i of class i % 10: a bright 4x4 square at the class's place on a 4 x 4 grid (classes
 * 0-9 of its 16 cells), in a channel mix of the class, over Gaussian noise. */
static void make_image(uint64_t i, float *img, float *label) {
    int c = (int)(i % CLASSES), gx = c % 4, gy = c / 4;
    for (int ch = 0; ch < CH_IN; ch++)
        for (int y = 0; y < SIDE; y++)
            for (int x = 0; x < SIDE; x++) {
                size_t at = ((size_t)ch * SIDE + (size_t)y) * SIDE + (size_t)x;
                float v = 0.3f * (float)ms_philox_normal(7, i, at);
                if (x / 4 == gx && y / 4 == gy) v += 1.0f + 0.5f * (float)((c + ch) % 3);
                img[at] = v;
            }
    *label = (float)c;
}

static int make_data(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: image_classifier make-data FILE [--samples N]\n");
        return 2;
    }
    long n = 1024;
    if (argc >= 4 && !strcmp(argv[2], "--samples")) n = strtol(argv[3], NULL, 10);
    if (n < 1 || n > 1000000) {
        fprintf(stderr, "image_classifier make-data: --samples takes 1 to 1000000\n");
        return 2;
    }
    size_t per = (size_t)CH_IN * SIDE * SIDE;
    float *img = malloc(sizeof(float) * per * (size_t)n), *lab = malloc(sizeof(float) * (size_t)n);
    if (!img || !lab) {
        free(img), free(lab);
        fprintf(stderr, "image_classifier make-data: out of memory\n");
        return 1;
    }
    for (long i = 0; i < n; i++) make_image((uint64_t)i, img + per * (size_t)i, lab + i);
    ms_st_entry e[2] = {
        {.name = "image", .dtype = MS_F32, .ndim = 4, .shape = {n, CH_IN, SIDE, SIDE}, .data = img},
        {.name = "label", .dtype = MS_F32, .ndim = 1, .shape = {n}, .data = lab}};
    ms_error err = {0};
    ms_status st = ms_safetensors_write(argv[1], e, 2, NULL, 0, &err);
    free(img), free(lab);
    if (st != MS_OK) {
        fprintf(stderr, "image_classifier make-data: %s\n", err.msg);
        return 1;
    }
    printf("wrote %ld images of %d x %d x %d and their labels to %s\n", n, CH_IN, SIDE, SIDE,
           argv[1]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "make-data")) return make_data(argc - 1, argv + 1);
    ms_model_def def = resnet_def();
    return meshscope_main_with_model(argc, argv, &def);
}

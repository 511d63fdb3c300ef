/* onnx_def.c - an ONNX model as a model def (onnx_def.h). */
#include "engine/model/onnx_def.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/model/onnx_import.h"

#define MAX_OUTPUTS 64

typedef struct onnx_user {
    ms_onnx_model *m;
    int loss_output;                      /* index among the graph's outputs */
    ms_onnx_blocks blocks;                /* the repeated stack, if found (n >= 2) */
    int cut_ndim[MS_ONNX_MAX_BLOCKS + 1]; /* the shapes of the values crossing the cuts */
    int64_t cut_shape[MS_ONNX_MAX_BLOCKS + 1][MS_MAX_DIMS];
} onnx_user;

/* Chunk ch's part of the file's graph: its blocks' nodes, the prefix when first, the rest and
 * the loss when last; each block a recompute region. */
static void chunk_part(const onnx_user *u, const ms_model_chunk *ch, ms_onnx_part *p) {
    const ms_onnx_blocks *bl = &u->blocks;
    memset(p, 0, sizeof *p);
    if (bl->n < 2) { /* one block: the whole graph */
        p->hi = SIZE_MAX;
        return;
    }
    p->lo = ch->first ? 0 : bl->start[ch->layer_lo];
    p->hi = ch->last ? SIZE_MAX : bl->start[ch->layer_hi];
    if (!ch->first) {
        p->in = bl->cut[ch->layer_lo];
        p->in_ndim = u->cut_ndim[ch->layer_lo];
        memcpy(p->in_shape, u->cut_shape[ch->layer_lo], sizeof p->in_shape);
    }
    if (!ch->last) p->out = bl->cut[ch->layer_hi];
    p->region_starts = bl->start + ch->layer_lo;
    p->nregions = ch->layer_hi - ch->layer_lo;
    p->regions_end = ch->layer_hi < bl->n ? bl->start[ch->layer_hi] : bl->end;
}

static ms_status onnx_build(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                            ms_model *out, ms_error *err) {
    const onnx_user *u = d->user;
    memset(out, 0, sizeof *out);
    out->loss = out->logits = out->hidden_in = out->hidden_out = -1;
    out->g = ms_graph_create();
    ms_onnx_part part;
    chunk_part(u, ch, &part);
    int outs[MAX_OUTPUTS];
    ms_status st = ms_onnx_build_part(u->m, rows, &part, out->g, outs, MAX_OUTPUTS, &out->hidden_in,
                                      &out->hidden_out, err);
    if (st != MS_OK) {
        ms_model_free(out);
        return st;
    }
    if (out->hidden_out >= 0) {
        ms_graph_set_output(out->g, out->hidden_out);
        return MS_OK;
    }
    out->loss = outs[u->loss_output];
    ms_graph_set_loss(out->g, out->loss);
    return MS_OK;
}

static bool onnx_initial(const ms_model_def *d, const char *param, float *full, int64_t numel) {
    const onnx_user *u = d->user;
    int64_t n = 0;
    const float *v = ms_onnx_initializer(u->m, param, &n);
    if (!v || n != numel) return false;
    memcpy(full, v, sizeof(float) * (size_t)numel);
    return true;
}

static void onnx_describe(const ms_model_def *d, char *buf, size_t cap) {
    const onnx_user *u = d->user;
    char blocks[96] = "one block: no pipeline cuts";
    if (u->blocks.n >= 2)
        snprintf(blocks, sizeof blocks, "%d blocks %s.0..%d", u->blocks.n, u->blocks.scope + 1,
                 u->blocks.n - 1);
    snprintf(buf, cap, "ONNX, opset %lld, %d input%s, loss %s, %s", (long long)ms_onnx_opset(u->m),
             d->ninputs, d->ninputs == 1 ? "" : "s", ms_onnx_output_name(u->m, u->loss_output),
             blocks);
}

static const ms_model_hooks onnx_hooks = {
    .build_chunk = onnx_build, .initial_value = onnx_initial, .describe = onnx_describe};

/* The def's inputs: every graph input, by rows of its batch dim. */
static ms_status take_inputs(const char *path, ms_onnx_model *m, ms_model_def *d, ms_error *err) {
    int n = ms_onnx_num_inputs(m);
    if (n < 1 || n > MS_MODEL_MAX_INPUTS)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: %d graph inputs; meshscope takes 1 to %d",
                       path, n, MS_MODEL_MAX_INPUTS);
    for (int i = 0; i < n; i++) {
        const char *name = ms_onnx_input_name(m, i);
        if (!ms_onnx_input_has_batch(m, i))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: input %s has no symbolic batch dim; export it with "
                           "dynamic_axes={\"%s\": {0: \"batch\"}} so that its rows can be "
                           "split over data parallelism",
                           path, name, name);
        int64_t shape[MS_MAX_DIMS];
        int nd = ms_onnx_input_shape(m, i, 1, shape);
        if (strlen(name) >= sizeof d->inputs[i].name || nd < 1)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: input %s: a name over %zu bytes", path,
                           name, sizeof d->inputs[i].name - 1);
        ms_model_input *in = &d->inputs[i];
        snprintf(in->name, sizeof in->name, "%s", name);
        in->ndim = nd - 1;
        for (int k = 1; k < nd; k++) in->shape[k - 1] = (int)shape[k];
        in->integer = ms_onnx_input_is_index(m, i);
    }
    d->ninputs = n;
    return MS_OK;
}

/* The repeated stack a pipeline may cut, with the shapes of what crosses each cut (read off a
 * build for two rows; their first dim must be the batch). */
static void find_blocks(onnx_user *u, ms_model_def *d) {
    ms_onnx_blocks *bl = &u->blocks;
    d->n_blocks = 1;
    if (ms_onnx_find_blocks(u->m, bl) < 2) {
        bl->n = 0;
        return;
    }
    ms_graph *g = ms_graph_create();
    int outs[MAX_OUTPUTS];
    ms_error e = {0};
    bool ok = ms_onnx_build(u->m, 2, g, outs, MAX_OUTPUTS, &e) == MS_OK;
    for (int k = 1; ok && k <= bl->n; k++) {
        int v = ms_graph_find(g, bl->cut[k]);
        const ms_shape *s = v >= 0 ? ms_graph_value_shape(g, v) : NULL;
        ok = s && s->ndim >= 1 && s->d[0] == 2;
        for (int i = 0; ok && i < s->ndim; i++) u->cut_shape[k][i] = s->d[i];
        if (ok) u->cut_ndim[k] = s->ndim;
    }
    ms_graph_destroy(g);
    /* A weight both ends read (a head tied to the embedding) is held by the first and the last
     * chunk and its gradients summed between them; the def names one such weight. */
    bool several = false;
    const char *tied = ok ? ms_onnx_shared_initializer(u->m, bl->start[0], bl->end, &several) : 0;
    if (!ok || several || (tied && strlen(tied) >= sizeof d->tied)) {
        bl->n = 0;
        return;
    }
    if (tied) snprintf(d->tied, sizeof d->tied, "%s", tied);
    d->n_blocks = bl->n;
}

/* The loss: the named output, or the only scalar one (found by building for one row). */
static ms_status find_loss(const char *path, const ms_onnx_def_opts *o, onnx_user *u,
                           ms_error *err) {
    int n = ms_onnx_num_outputs(u->m);
    ms_graph *g = ms_graph_create();
    int outs[MAX_OUTPUTS];
    ms_status st = n > MAX_OUTPUTS ? ms_fail(err, MS_ERR_UNSUPPORTED, "%s: %d outputs (at most %d)",
                                             path, n, MAX_OUTPUTS)
                                   : ms_onnx_build(u->m, 2, g, outs, MAX_OUTPUTS, err);
    char names[512] = "";
    int scalar = -1, scalars = 0;
    for (int i = 0; st == MS_OK && i < n; i++) {
        const char *name = ms_onnx_output_name(u->m, i);
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "", name);
        const ms_shape *s =
            i < MAX_OUTPUTS && outs[i] >= 0 ? ms_graph_value_shape(g, outs[i]) : NULL;
        int64_t numel = s ? 1 : 0; /* an empty output is no value */
        for (int k = 0; s && k < s->ndim; k++) numel *= s->d[k];
        if (o && o->loss && !strcmp(o->loss, name) && s) u->loss_output = i;
        if (numel == 1) scalar = i, scalars++;
    }
    ms_graph_destroy(g);
    MS_CHECK(st);
    if (o && o->loss && u->loss_output < 0)
        return ms_fail(err, MS_ERR_INVALID, "%s: no graph output named %s (its outputs: %s)", path,
                       o->loss, names);
    if (u->loss_output < 0 && scalars != 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: %s scalar output%s (outputs: %s); export a module that returns its "
                       "loss, or name the loss with --loss NAME",
                       path, scalars ? "more than one" : "no", scalars ? "s" : "", names);
    if (u->loss_output < 0) u->loss_output = scalar;
    return MS_OK;
}

ms_status ms_model_def_from_onnx(const char *path, const ms_onnx_def_opts *opts, ms_model_def *out,
                                 ms_error *err) {
    memset(out, 0, sizeof *out);
    onnx_user *u = xcalloc(1, sizeof *u);
    u->loss_output = -1;
    ms_status st = ms_onnx_open(path, &u->m, err);
    if (st == MS_OK) st = take_inputs(path, u->m, out, err);
    if (st == MS_OK) st = find_loss(path, opts, u, err);
    if (st == MS_OK) find_blocks(u, out);
    if (st != MS_OK) {
        ms_onnx_close(u->m);
        free(u);
        memset(out, 0, sizeof *out);
        return st;
    }
    const char *base = strrchr(path, '/');
    snprintf(out->name, sizeof out->name, "%s", base ? base + 1 : path);
    out->hooks = &onnx_hooks;
    out->user = u;
    return MS_OK;
}

void ms_model_def_onnx_free(ms_model_def *d) {
    if (!d || d->hooks != &onnx_hooks) return;
    onnx_user *u = d->user;
    if (u) ms_onnx_close(u->m);
    free(u);
    d->user = NULL;
}

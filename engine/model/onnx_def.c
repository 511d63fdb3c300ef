/* onnx_def.c - an ONNX model as a model def (onnx_def.h). */
#include "engine/model/onnx_def.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/model/onnx_import.h"

#define MAX_OUTPUTS 64

typedef struct onnx_user {
    ms_onnx_model *m;
    int loss_output; /* index among the graph's outputs */
} onnx_user;

static ms_status onnx_build(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                            ms_model *out, ms_error *err) {
    (void)ch; /* one block: the chunk is the whole model */
    const onnx_user *u = d->user;
    memset(out, 0, sizeof *out);
    out->logits = out->hidden_in = out->hidden_out = -1;
    out->g = ms_graph_create();
    int outs[MAX_OUTPUTS];
    ms_status st = ms_onnx_build(u->m, rows, out->g, outs, MAX_OUTPUTS, err);
    if (st != MS_OK) {
        ms_model_free(out);
        return st;
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
    snprintf(buf, cap, "ONNX, opset %lld, %d input%s, loss %s", (long long)ms_onnx_opset(u->m),
             d->ninputs, d->ninputs == 1 ? "" : "s", ms_onnx_output_name(u->m, u->loss_output));
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
        const ms_shape *s = ms_graph_value_shape(g, outs[i]);
        int64_t numel = 1;
        for (int k = 0; k < s->ndim; k++) numel *= s->d[k];
        if (o && o->loss && !strcmp(o->loss, name)) u->loss_output = i;
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
    if (st != MS_OK) {
        ms_onnx_close(u->m);
        free(u);
        memset(out, 0, sizeof *out);
        return st;
    }
    const char *base = strrchr(path, '/');
    snprintf(out->name, sizeof out->name, "%s", base ? base + 1 : path);
    out->hooks = &onnx_hooks;
    out->n_blocks = 1;
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

/* model.c - the model interface's generic part (model.h). */
#include "engine/model/model.h"

#include <stdio.h>
#include <string.h>

#include "engine/data/array_source.h"

int64_t ms_model_input_numel(const ms_model_def *d, int i) {
    int64_t n = 1;
    for (int k = 0; k < d->inputs[i].ndim; k++) n *= d->inputs[i].shape[k];
    return n;
}

int ms_model_def_find_input(const ms_model_def *d, const char *name) {
    for (int i = 0; i < d->ninputs; i++)
        if (!strcmp(d->inputs[i].name, name)) return i;
    return -1;
}

ms_status ms_model_def_check(const ms_model_def *d, ms_error *err) {
    const char *name = d->name[0] ? d->name : "(unnamed)";
    if (!d->name[0] || !d->hooks || !d->hooks->build_chunk)
        return ms_fail(err, MS_ERR_INVALID, "model %s: a model needs a name and a build_chunk hook",
                       name);
    if (d->n_blocks < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "model %s: n_blocks is %d; a model has at least one block (the whole "
                       "model when it has no repeated part)",
                       name, d->n_blocks);
    if (d->ninputs < 1 || d->ninputs > MS_MODEL_MAX_INPUTS)
        return ms_fail(err, MS_ERR_INVALID, "model %s: %d inputs; give 1 to %d", name, d->ninputs,
                       MS_MODEL_MAX_INPUTS);
    for (int i = 0; i < d->ninputs; i++) {
        const ms_model_input *in = &d->inputs[i];
        if (!in->name[0] || ms_model_def_find_input(d, in->name) != i)
            return ms_fail(err, MS_ERR_INVALID,
                           "model %s: input %d is unnamed or its name \"%s\" repeats an "
                           "earlier input's",
                           name, i, in->name);
        if (in->ndim < 0 || in->ndim > MS_MAX_DIMS - 1)
            return ms_fail(err, MS_ERR_INVALID, "model %s: input %s has %d sample dims (0..%d)",
                           name, in->name, in->ndim, MS_MAX_DIMS - 1);
        for (int k = 0; k < in->ndim; k++)
            if (in->shape[k] < 1)
                return ms_fail(err, MS_ERR_INVALID, "model %s: input %s has dim %d of size %d",
                               name, in->name, k, in->shape[k]);
    }
    return MS_OK;
}

static void shape_text(int ndim, const int *shape, char *buf, size_t cap) {
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < ndim && at < cap; k++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%d", k ? ", " : "", shape[k]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

ms_status ms_model_def_check_source(const ms_model_def *d, const ms_batch_source *src,
                                    ms_error *err) {
    if (d->hooks->prepare) return MS_OK;
    for (int i = 0; i < d->ninputs; i++) {
        const ms_model_input *in = &d->inputs[i];
        int f = ms_batch_source_find(src, in->name);
        if (f < 0)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: no field \"%s\", which model %s takes as an input; name the "
                           "array \"%s\" in the file (or rename the model's input)",
                           src->name, in->name, d->name, in->name);
        const ms_batch_field *fd = &src->fields[f];
        bool same = fd->ndim == in->ndim;
        for (int k = 0; same && k < in->ndim; k++) same = fd->shape[k] == in->shape[k];
        if (!same) {
            char a[96], b[96];
            shape_text(fd->ndim, fd->shape, a, sizeof a);
            shape_text(in->ndim, in->shape, b, sizeof b);
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: field \"%s\" holds samples of shape %s; model %s takes %s per "
                           "row; reshape the array or change the model's input",
                           src->name, in->name, a, d->name, b);
        }
    }
    return MS_OK;
}

/* Checks a built chunk's inputs against the def's sample shapes. */
static ms_status check_inputs(const ms_model_def *d, int rows, ms_model *out, ms_error *err) {
    for (int i = 0; i < d->ninputs; i++) {
        int v = ms_graph_find(out->g, d->inputs[i].name);
        out->input[i] = v;
        if (v < 0) continue;
        const ms_shape *s = ms_graph_value_shape(out->g, v);
        bool same = s->ndim == d->inputs[i].ndim + 1 && s->d[0] == rows;
        for (int k = 0; same && k < d->inputs[i].ndim; k++)
            same = s->d[k + 1] == d->inputs[i].shape[k];
        if (!same)
            return ms_fail(err, MS_ERR_INVALID,
                           "model %s: the graph's input %s does not have the shape [rows, "
                           "sample...] the model declares (rows %d); make them agree",
                           d->name, d->inputs[i].name, rows);
    }
    return MS_OK;
}

ms_status ms_model_def_build(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                             ms_model *out, ms_error *err) {
    MS_CHECK(ms_model_def_check(d, err));
    if (ch->layer_lo < 0 || ch->layer_hi < ch->layer_lo || ch->layer_hi > d->n_blocks)
        return ms_fail(err, MS_ERR_INVALID,
                       "model %s: a chunk of blocks [%d, %d) does not fit its %d blocks", d->name,
                       ch->layer_lo, ch->layer_hi, d->n_blocks);
    MS_CHECK(d->hooks->build_chunk(d, rows, ch, out, err));
    ms_status st = ms_graph_error(out->g, err);
    if (st == MS_OK) st = check_inputs(d, rows, out, err);
    if (st == MS_OK && ch->last) {
        const ms_shape *ls = out->loss >= 0 ? ms_graph_value_shape(out->g, out->loss) : NULL;
        int64_t n = 1;
        for (int k = 0; ls && k < ls->ndim; k++) n *= ls->d[k];
        if (!ls || n != 1)
            st = ms_fail(err, MS_ERR_INVALID,
                         "model %s: the last chunk sets no scalar loss; end the graph with a "
                         "mean (or sum) and ms_graph_set_loss, and set ms_model.loss",
                         d->name);
    }
    if (st != MS_OK) ms_model_free(out);
    return st;
}

ms_status ms_model_def_prepare(const ms_model_def *d, const ms_batch_source *src, uint64_t seed,
                               uint64_t batch, int rows, float *const *fields, float *const *inputs,
                               ms_error *err) {
    if (d->hooks->prepare) return d->hooks->prepare(d, src, seed, batch, rows, fields, inputs, err);
    for (int i = 0; i < d->ninputs; i++) {
        int f = ms_batch_source_find(src, d->inputs[i].name);
        if (f < 0)
            return ms_fail(err, MS_ERR_INVALID, "%s: no field \"%s\" for model %s", src->name,
                           d->inputs[i].name, d->name);
        memcpy(inputs[i], fields[f],
               sizeof(float) * (size_t)rows * (size_t)ms_model_input_numel(d, i));
    }
    return MS_OK;
}

ms_status ms_model_def_open_data(const ms_model_def *d, const char *path, double val_fraction,
                                 ms_batch_source **out, ms_error *err) {
    *out = NULL;
    if (d->hooks->open_data) return d->hooks->open_data(d, path, val_fraction, out, err);
    ms_array_source_opts ao = {.val_fraction = val_fraction};
    return ms_array_source_open(path, &ao, out, err);
}

void ms_model_def_describe(const ms_model_def *d, char *buf, size_t cap) {
    if (d->hooks->describe) {
        d->hooks->describe(d, buf, cap);
        return;
    }
    size_t at =
        (size_t)snprintf(buf, cap, "%d block%s; inputs", d->n_blocks, d->n_blocks == 1 ? "" : "s");
    for (int i = 0; i < d->ninputs && at < cap; i++) {
        at += (size_t)snprintf(buf + at, cap - at, "%s %s", i ? "," : "", d->inputs[i].name);
        if (d->inputs[i].ndim && at < cap) {
            char shape[96];
            shape_text(d->inputs[i].ndim, d->inputs[i].shape, shape, sizeof shape);
            at += (size_t)snprintf(buf + at, cap - at, " %s", shape);
        }
    }
}

void ms_model_free(ms_model *m) {
    if (!m) return;
    ms_graph_destroy(m->g);
    memset(m, 0, sizeof *m);
}

/* static_def.c - a recorded eager step as a model def (static_def.h). */
#include "engine/model/static_def.h"

#include <stdio.h>
#include <string.h>

static int batch_of(const ms_static_graph *s) {
    for (int i = 0; i < s->nleaves; i++)
        if (!s->leaves[i].param) return (int)s->leaves[i].shape[0];
    return 0;
}

static ms_status static_build(const ms_model_def *d, int rows, const ms_model_chunk *ch,
                              ms_model *out, ms_error *err) {
    (void)ch;
    const ms_static_graph *s = d->user;
    memset(out, 0, sizeof *out);
    out->loss = out->logits = out->hidden_in = out->hidden_out = -1;
    if (rows != batch_of(s))
        return ms_fail(err, MS_ERR_INVALID,
                       "model %s: the recorded step holds %d rows and this run asks for %d; "
                       "train it with the batch it was recorded with and one micro-batch",
                       d->name, batch_of(s), rows);
    out->g = ms_graph_create();
    ms_status st = ms_static_build(s, out->g, &out->loss, err);
    if (st != MS_OK) ms_model_free(out);
    return st;
}

static bool static_initial(const ms_model_def *d, const char *param, float *full, int64_t numel) {
    const ms_static_leaf *l = ms_static_param(d->user, param);
    int64_t n = 1;
    for (int k = 0; l && k < l->ndim; k++) n *= l->shape[k];
    if (!l || !l->values || n != numel) return false;
    memcpy(full, l->values, sizeof(float) * (size_t)numel);
    return true;
}

/* The leaves where the eager step had them, on a mesh of as many dims. */
static bool static_shard(const ms_model_def *d, const struct ms_strategy *st, const char *name,
                         const ms_shape *shape, int mesh_ndim, ms_placements *pl) {
    (void)st, (void)shape;
    const ms_static_graph *s = d->user;
    for (int i = 0; i < s->nleaves; i++)
        if (!strcmp(s->leaves[i].name, name) && s->leaves[i].pl.n == mesh_ndim) {
            *pl = s->leaves[i].pl;
            return true;
        }
    return false;
}

static const ms_model_hooks static_hooks = {
    .build_chunk = static_build, .shard = static_shard, .initial_value = static_initial};

ms_status ms_model_def_from_static(const ms_static_graph *s, const char *name, ms_model_def *out,
                                   ms_error *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name && name[0] ? name : "to_static");
    out->hooks = &static_hooks;
    out->n_blocks = 1;
    out->user = (void *)s;
    for (int i = 0; i < s->nleaves; i++) {
        const ms_static_leaf *l = &s->leaves[i];
        if (l->param) continue;
        if (out->ninputs == MS_MODEL_MAX_INPUTS || l->ndim < 1 || l->shape[0] != batch_of(s))
            return ms_fail(err, MS_ERR_INVALID,
                           "to_static %s: input %s must be [batch, ...] like the others, and "
                           "at most %d inputs",
                           out->name, l->name, MS_MODEL_MAX_INPUTS);
        ms_model_input *in = &out->inputs[out->ninputs++];
        snprintf(in->name, sizeof in->name, "%s", l->name);
        in->ndim = l->ndim - 1;
        for (int k = 1; k < l->ndim; k++) in->shape[k - 1] = (int)l->shape[k];
    }
    return ms_model_def_check(out, err);
}

/* eager_adamw.c - AdamW on eager parameters' local shards. */
#include "engine/graph/eager_adamw.h"

#include <stdlib.h>

#include "engine/core/xalloc.h"

struct ms_eager_adamw {
    ms_kctx *kc;      /* the kernels of the parameters' device, made at the first step */
    ms_tensor *m, *v; /* [n] moments, shaped like each local shard */
    int n;
    int64_t t; /* steps taken */
};

ms_eager_adamw *ms_eager_adamw_create(void) {
    return xcalloc(1, sizeof(ms_eager_adamw));
}

void ms_eager_adamw_destroy(ms_eager_adamw *a) {
    if (!a) return;
    for (int i = 0; i < a->n; i++) ms_tensor_release(&a->m[i]), ms_tensor_release(&a->v[i]);
    ms_kctx_destroy(a->kc);
    free(a->m);
    free(a->v);
    free(a);
}

static ms_status alloc_moments(ms_eager_adamw *a, int n, ms_dtensor *const *params, ms_error *err) {
    MS_CHECK(ms_kctx_create(params[0]->mesh->ctx->device, &a->kc, err));
    a->m = xcalloc((size_t)n, sizeof *a->m);
    a->v = xcalloc((size_t)n, sizeof *a->v);
    a->n = n;
    for (int i = 0; i < n; i++) {
        const ms_tensor *p = &params[i]->local;
        ms_device *dev = params[i]->mesh->ctx->device;
        MS_CHECK(ms_tensor_alloc(dev, MS_F32, p->ndim, p->shape, &a->m[i], err));
        MS_CHECK(ms_tensor_alloc(dev, MS_F32, p->ndim, p->shape, &a->v[i], err));
    }
    return MS_OK;
}

ms_status ms_eager_adamw_step(ms_eager_adamw *a, const ms_tape *tape, int n,
                              ms_dtensor *const *params, const bool *decay, const ms_adamw_opts *o,
                              ms_error *err) {
    if (n < 1 || !ms_dmesh_is_member(params[0]->mesh)) return MS_OK;
    if (a->n && a->n != n)
        return ms_fail(err, MS_ERR_INVALID,
                       "eager adamw: %d parameters, but the moments were made for %d; pass the "
                       "same parameters every step",
                       n, a->n);
    if (!a->n) MS_CHECK(alloc_moments(a, n, params, err));
    for (int i = 0; i < n; i++) { /* check everything before touching anything */
        const ms_dtensor *grad = ms_tape_grad(tape, params[i]);
        if (!grad)
            return ms_fail(err, MS_ERR_INVALID,
                           "eager adamw: parameter %d has no gradient; ms_tape_watch it before the "
                           "forward and run ms_tape_backward before the step",
                           i);
        if (ms_tensor_numel(&grad->local) != ms_tensor_numel(&a->m[i]) ||
            ms_tensor_numel(&params[i]->local) != ms_tensor_numel(&a->m[i]))
            return ms_fail(err, MS_ERR_INVALID,
                           "eager adamw: parameter %d changed size since the first step", i);
    }
    a->t++;
    for (int i = 0; i < n; i++) {
        const ms_tensor *g = &ms_tape_grad(tape, params[i])->local;
        ms_adamw_opts oi = *o;
        if (decay && !decay[i]) oi.weight_decay = 0;
        MS_CHECK(MS_CALL_K(a->kc, adamw_step, ms_tensor_f32(&params[i]->local), ms_tensor_f32(g),
                           ms_tensor_f32(&a->m[i]), ms_tensor_f32(&a->v[i]),
                           (size_t)ms_tensor_numel(g), &oi, a->t, 1.0f, err));
    }
    return MS_OK;
}

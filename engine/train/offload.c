/* offload.c - ZeRO-Offload: masters and moments on the host, AdamW on the host's cores,
 * optionally overlapped with the next step's forward (see offload.h). */
#include "engine/train/offload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/kernels/backend.h"
#include "profiler/record/hooks.h"

struct ms_offload {
    ms_ctx *ctx;
    ms_device *dev;  /* borrowed: the rank's device (parameters, gradients) */
    ms_device *host; /* borrowed: masters, moments and staged gradients */
    ms_kctx *hkc;    /* owned: the CPU kernels on host memory */
    ms_stages *st;   /* borrowed */
    int n;
    float **m, **v;          /* borrowed: the moments */
    float **master;          /* [n]: fp32 master of the optimizer shard, opt_n floats */
    void **grad;             /* [n]: the staged gradient shard (fp32 or bf16 elements) */
    size_t *mbytes, *gbytes; /* [n]: their allocations */
    size_t *len;     /* [n]: the shard's elements (the worker reads these, never the program) */
    bool *bf16_grad; /* [n]: the gradient is bf16 */
    int *order;      /* [n]: update order, the next step's first uses */
    bool stale;      /* masters to be read from the device before the next update */
    bool overlap;
    /* The worker (overlap). Guarded by mu: posted, done, ready, span, quit, failed. */
    pthread_t worker;
    bool started, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t posted, done; /* updates posted, finished */
    int64_t *ready;       /* [n]: the last update that finished parameter i */
    int64_t (*span)[2];   /* [n]: when that update ran */
    ms_status failed;     /* the worker's first failure, its message in werr */
    ms_error werr;
    ms_adamw_opts aw; /* the posted update */
    int64_t t;
    float scale;
    bool *pending; /* [n]: rank thread only: updated, not yet on the device */
    int npending;
};

/* --- host AdamW of one parameter ------------------------------------------------------------ */

static ms_status view(const ms_offload *o, int i, ms_param_view *pv) {
    return ms_stages_param(o->st, i, pv, NULL);
}

static ms_status host_adamw(ms_offload *o, int i, const ms_adamw_opts *aw, int64_t t, float scale,
                            ms_error *err) {
    size_t n = o->len[i];
    if (o->bf16_grad[i])
        return MS_CALL_K(o->hkc, adamw_step_bf16_grad, o->master[i], (const uint16_t *)o->grad[i],
                         o->m[i], o->v[i], n, aw, t, scale, err);
    return MS_CALL_K(o->hkc, adamw_step, o->master[i], (const float *)o->grad[i], o->m[i], o->v[i],
                     n, aw, t, scale, err);
}

/* The updated master shard into the parameter on the device. */
static ms_status copy_up(ms_offload *o, int i, ms_error *err) {
    ms_param_view pv;
    view(o, i, &pv);
    float *dst = ms_tensor_f32(&pv.data) + pv.data_off;
    return ms_device_copy(o->dev, dst, o->master[i], sizeof(float) * (size_t)pv.opt_n,
                          MS_COPY_HOST_TO_DEVICE, err);
}

/* Every owned gradient shard device -> host, one copy per parameter. */
static ms_status copy_grads_down(ms_offload *o, ms_error *err) {
    int64_t t0 = ms_now_ns();
    for (int i = 0; i < o->n; i++) {
        ms_param_view pv;
        view(o, i, &pv);
        size_t elt = ms_dtype_size(pv.grad.dtype);
        const char *src = (const char *)ms_tensor_data(&pv.grad) + elt * (size_t)pv.grad_off;
        MS_CHECK(ms_device_copy(o->dev, o->grad[i], src, elt * (size_t)pv.opt_n,
                                MS_COPY_DEVICE_TO_HOST, err));
    }
    ms_record_optim(&o->ctx->trace, "offload: gradients to host", "memcpy D2H", t0, ms_now_ns(),
                    false);
    return MS_OK;
}

static ms_status read_masters(ms_offload *o, ms_error *err) {
    for (int i = 0; i < o->n && o->stale; i++) {
        ms_param_view pv;
        view(o, i, &pv);
        const float *src = ms_tensor_f32(&pv.data) + pv.data_off;
        MS_CHECK(ms_device_copy(o->dev, o->master[i], src, sizeof(float) * (size_t)pv.opt_n,
                                MS_COPY_DEVICE_TO_HOST, err));
    }
    o->stale = false;
    return MS_OK;
}

/* --- the worker ----------------------------------------------------------------------------- */

static void *worker_main(void *arg) {
    ms_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->quit && o->done == o->posted) pthread_cond_wait(&o->cv, &o->mu);
        if (o->quit) break;
        int64_t gen = o->posted, t = o->t;
        ms_adamw_opts aw = o->aw;
        float scale = o->scale;
        bool ok = o->failed == MS_OK;
        pthread_mutex_unlock(&o->mu);
        for (int k = 0; k < o->n; k++) {
            int i = o->order[k];
            ms_error e = {0};
            int64_t t0 = ms_now_ns();
            ms_status st = ok ? host_adamw(o, i, &aw, t, scale, &e) : MS_OK;
            int64_t t1 = ms_now_ns();
            pthread_mutex_lock(&o->mu);
            if (st != MS_OK && o->failed == MS_OK) o->failed = st, o->werr = e;
            ok = o->failed == MS_OK;
            o->ready[i] = gen;
            o->span[i][0] = t0, o->span[i][1] = t1;
            pthread_cond_broadcast(&o->cv);
            pthread_mutex_unlock(&o->mu);
        }
        pthread_mutex_lock(&o->mu);
        o->done = gen;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Parameter i's update in flight: wait for it, put it on the device, gather it. The host
 * update's span goes on the rank's "optimizer (host)" lane, recorded here by the rank thread
 * (the recorder has one writer). */
static ms_status take(ms_offload *o, int i, ms_error *err) {
    if (!o->pending[i]) return MS_OK;
    int64_t t0 = ms_now_ns(), span[2];
    pthread_mutex_lock(&o->mu);
    while (o->ready[i] < o->posted) pthread_cond_wait(&o->cv, &o->mu);
    ms_status failed = o->failed;
    if (failed != MS_OK) *err = o->werr;
    span[0] = o->span[i][0], span[1] = o->span[i][1];
    pthread_mutex_unlock(&o->mu);
    o->pending[i] = false;
    if (--o->npending == 0) ms_stages_on_param_use(o->st, NULL, NULL);
    if (failed != MS_OK) return failed;
    ms_param_view pv;
    view(o, i, &pv);
    ms_record_optim(&o->ctx->trace, pv.name, "adamw (host)", span[0], span[1], true);
    int64_t waited = ms_now_ns();
    if (waited - t0 > 10000) /* longer than taking the lock: the forward waited */
        ms_record_optim(&o->ctx->trace, pv.name, "offload wait", t0, waited, false);
    MS_CHECK(copy_up(o, i, err));
    MS_CHECK(ms_stages_param_sync_one(o->st, i, err));
    ms_record_optim(&o->ctx->trace, pv.name, "memcpy H2D", waited, ms_now_ns(), false);
    return MS_OK;
}

static ms_status on_use(void *arg, int param, ms_error *err) {
    return take(arg, param, err);
}

ms_status ms_offload_settle(ms_offload *o, ms_error *err) {
    for (int k = 0; o && o->npending && k < o->n; k++) MS_CHECK(take(o, o->order[k], err));
    return MS_OK;
}

/* --- the update ----------------------------------------------------------------------------- */

static ms_status update_now(ms_offload *o, const ms_adamw_opts *aw, int64_t t, float scale,
                            ms_error *err) {
    for (int k = 0; k < o->n; k++) {
        int i = o->order[k];
        ms_param_view pv;
        view(o, i, &pv);
        int64_t t0 = ms_now_ns();
        MS_CHECK(host_adamw(o, i, aw, t, scale, err));
        int64_t t1 = ms_now_ns();
        ms_record_optim(&o->ctx->trace, pv.name, "adamw (host)", t0, t1, true);
        MS_CHECK(copy_up(o, i, err));
        ms_record_optim(&o->ctx->trace, pv.name, "memcpy H2D", t1, ms_now_ns(), false);
    }
    return ms_stages_param_sync(o->st, err);
}

ms_status ms_offload_update(ms_offload *o, const ms_adamw_opts *aw, int64_t t, float scale,
                            ms_error *err) {
    MS_CHECK(ms_offload_settle(o, err));
    MS_CHECK(read_masters(o, err));
    MS_CHECK(copy_grads_down(o, err));
    if (!o->overlap) return update_now(o, aw, t, scale, err);
    pthread_mutex_lock(&o->mu);
    ms_status failed = o->failed;
    if (failed != MS_OK) *err = o->werr;
    o->aw = *aw, o->t = t, o->scale = scale;
    if (failed == MS_OK) o->posted++;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (failed != MS_OK) return failed;
    for (int i = 0; i < o->n; i++) o->pending[i] = true;
    o->npending = o->n;
    if (o->n) ms_stages_on_param_use(o->st, on_use, o);
    return MS_OK;
}

void ms_offload_params_written(ms_offload *o) {
    if (o) o->stale = true;
}

/* --- lifetime ------------------------------------------------------------------------------- */

static ms_status alloc_buffers(ms_offload *o, ms_error *err) {
    for (int i = 0; i < o->n; i++) {
        ms_param_view pv;
        view(o, i, &pv);
        /* one spare element: an empty shard (uneven splits) still gets a valid pointer */
        o->len[i] = (size_t)pv.opt_n;
        o->bf16_grad[i] = pv.grad.dtype == MS_BF16;
        o->mbytes[i] = sizeof(float) * ((size_t)pv.opt_n + 1);
        o->gbytes[i] = ms_dtype_size(pv.grad.dtype) * ((size_t)pv.opt_n + 1);
        MS_CHECK(ms_device_alloc(o->host, o->mbytes[i], (void **)&o->master[i], err));
        MS_CHECK(ms_device_alloc(o->host, o->gbytes[i], &o->grad[i], err));
    }
    return MS_OK;
}

ms_status ms_offload_create(ms_ctx *ctx, ms_device *host, ms_stages *st, float **m, float **v,
                            bool overlap, ms_offload **out, ms_error *err) {
    ms_offload *o = xcalloc(1, sizeof *o);
    *o = (ms_offload){.ctx = ctx, .dev = ctx->device, .host = host, .st = st, .m = m, .v = v};
    o->n = ms_stages_num_params(st);
    size_t n = (size_t)(o->n ? o->n : 1);
    o->master = xcalloc(n, sizeof *o->master);
    o->grad = xcalloc(n, sizeof *o->grad);
    o->mbytes = xcalloc(n, sizeof *o->mbytes);
    o->gbytes = xcalloc(n, sizeof *o->gbytes);
    o->order = xcalloc(n, sizeof *o->order);
    o->len = xcalloc(n, sizeof *o->len);
    o->bf16_grad = xcalloc(n, sizeof *o->bf16_grad);
    o->ready = xcalloc(n, sizeof *o->ready);
    o->span = xcalloc(n, sizeof *o->span);
    o->pending = xcalloc(n, sizeof *o->pending);
    o->stale = true;
    ms_stages_param_use_order(st, o->order);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    ms_status s = ms_kctx_create(host, &o->hkc, err);
    if (s == MS_OK) s = alloc_buffers(o, err);
    if (s == MS_OK && overlap) {
        if (pthread_create(&o->worker, NULL, worker_main, o) != 0)
            s = ms_fail(err, MS_ERR_INTERNAL, "offload: cannot start the host optimizer thread");
        o->started = s == MS_OK;
        o->overlap = o->started;
    }
    if (s != MS_OK) {
        ms_offload_destroy(o);
        return s;
    }
    *out = o;
    return MS_OK;
}

void ms_offload_destroy(ms_offload *o) {
    if (!o) return;
    if (o->started) {
        pthread_mutex_lock(&o->mu);
        /* let the update in flight finish: it writes the moments the trainer frees next */
        while (o->done != o->posted) pthread_cond_wait(&o->cv, &o->mu);
        o->quit = true;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->worker, NULL);
    }
    if (o->npending) ms_stages_on_param_use(o->st, NULL, NULL);
    for (int i = 0; i < o->n; i++) {
        if (o->master[i]) ms_device_free(o->host, o->master[i], o->mbytes[i]);
        if (o->grad[i]) ms_device_free(o->host, o->grad[i], o->gbytes[i]);
    }
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    ms_kctx_destroy(o->hkc);
    free(o->master), free(o->grad), free(o->mbytes), free(o->gbytes), free(o->order);
    free(o->ready), free(o->span), free(o->pending), free(o->len), free(o->bf16_grad);
    free(o);
}

double ms_offload_master_bytes(const ms_offload *o) {
    double b = 0;
    for (int i = 0; o && i < o->n; i++) b += (double)o->mbytes[i];
    return b;
}

double ms_offload_staging_bytes(const ms_offload *o) {
    double b = 0;
    for (int i = 0; o && i < o->n; i++) b += (double)o->gbytes[i];
    return b;
}

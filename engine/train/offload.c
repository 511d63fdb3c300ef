/* offload.c - ZeRO-Offload: masters and moments on the host, AdamW on the host's cores,
 * optionally overlapped with the next step's forward (see offload.h). */
#include "engine/train/offload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/kernels/backend.h"
#include "engine/core/trace_sink.h"

/* A piece of work for the worker: parameter i's gradient to the host, its AdamW, or both. */
typedef struct job {
    int i;
    bool copy, update;
    ms_adamw_opts aw;
    int64_t t, gen;
    float scale;
} job;

struct ms_offload {
    ms_ctx *ctx;
    ms_device *dev;  /* borrowed: the rank's device (parameters, gradients) */
    ms_device *host; /* borrowed: masters, moments and staged gradients */
    ms_kctx *hkc;    /* owned: the CPU kernels on host memory */
    ms_stages *st;   /* borrowed */
    int n;
    float **m, **v; /* borrowed: the moments */
    float **master; /* [n]: fp32 master of the optimizer shard, opt_n floats */
    /* the program holds the masters in host memory (bf16: ms_compile_opts.master_host): master
     * points into it, nothing is copied between them and the device, and each update ends by
     * rounding its master for the parameter sync to copy up */
    bool host_masters;
    void **grad;             /* [n]: the staged gradient shard (fp32 or bf16 elements) */
    const void **dgrad;      /* [n]: the owned gradient shard on the device (stable) */
    size_t *mbytes, *gbytes; /* [n]: their allocations */
    size_t *len;     /* [n]: the shard's elements (the worker reads these, never the program) */
    bool *bf16_grad; /* [n]: the gradient is bf16 */
    int *order;      /* [n]: update order, the next step's first uses */
    bool stale;      /* masters to be read from the device before the next update */
    bool overlap;
    /* A step (ms_offload_begin_step .. ms_offload_update), rank thread only: */
    bool in_step, eager; /* eager: updates start with the copies, with aw and t below */
    ms_adamw_opts eager_aw;
    int64_t eager_t, gen; /* gen: the step's number among the updates */
    bool *handed;         /* [n]: handed to the worker this step */
    /* The worker (overlap). Guarded by mu: the queue, copies, ready, spans, quit, failed. */
    pthread_t worker;
    bool started, quit, busy;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *q; /* ring of qcap jobs: [qhead, qhead + qlen) */
    int qcap, qhead, qlen;
    int copies;          /* copies queued or running */
    int64_t posted;      /* the last update posted (its gen) */
    int64_t *ready;      /* [n]: the last update that finished parameter i */
    int64_t (*span)[2];  /* [n]: when that update ran */
    int64_t (*cspan)[2]; /* [n]: when its last gradient copy ran */
    bool *copied;        /* [n]: a copy ran whose span is not yet on the trace */
    ms_status failed;    /* the worker's first failure, its message in werr */
    ms_error werr;
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
        MS_CHECK(MS_CALL_K(o->hkc, adamw_step_bf16_grad, o->master[i], (const uint16_t *)o->grad[i],
                           o->m[i], o->v[i], n, aw, t, scale, err));
    else
        MS_CHECK(MS_CALL_K(o->hkc, adamw_step, o->master[i], (const float *)o->grad[i], o->m[i],
                           o->v[i], n, aw, t, scale, err));
    /* host masters: the bf16 rounding now, off the next forward's path */
    return o->host_masters ? ms_stages_round_master(o->st, i, o->hkc, err) : MS_OK;
}

/* The updated master shard into the parameter on the device. */
static ms_status copy_up(ms_offload *o, int i, ms_error *err) {
    if (o->host_masters) return MS_OK; /* the parameter sync copies the rounding up */
    ms_param_view pv;
    view(o, i, &pv);
    float *dst = ms_tensor_f32(&pv.data) + pv.data_off;
    return ms_device_copy(o->dev, dst, o->master[i], sizeof(float) * (size_t)pv.opt_n,
                          MS_COPY_HOST_TO_DEVICE, err);
}

/* Parameter i's owned gradient shard device -> host (the worker or the rank thread). */
static ms_status copy_grad(ms_offload *o, int i, ms_error *err) {
    size_t bytes = o->len[i] * (o->bf16_grad[i] ? sizeof(uint16_t) : sizeof(float));
    return ms_device_copy(o->dev, o->grad[i], o->dgrad[i], bytes, MS_COPY_DEVICE_TO_HOST, err);
}

/* Every owned gradient shard device -> host, one copy per parameter. */
static ms_status copy_grads_down(ms_offload *o, ms_error *err) {
    int64_t t0 = ms_now_ns();
    for (int i = 0; i < o->n; i++) MS_CHECK(copy_grad(o, i, err));
    ms_record_optim(&o->ctx->trace, "offload: gradients to host", "memcpy D2H", t0, ms_now_ns(),
                    false);
    return MS_OK;
}

static ms_status read_masters(ms_offload *o, ms_error *err) {
    for (int i = 0; i < o->n && o->stale && !o->host_masters; i++) {
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

/* Runs one job outside the lock and publishes what it did. Called and returns with mu held. */
static void run_job(ms_offload *o, const job *j) {
    bool ok = o->failed == MS_OK;
    pthread_mutex_unlock(&o->mu);
    ms_error e = {0};
    ms_status st = MS_OK;
    int64_t c0 = ms_now_ns(), c1 = c0;
    if (ok && j->copy) st = copy_grad(o, j->i, &e), c1 = ms_now_ns();
    if (st == MS_OK && ok && j->update) st = host_adamw(o, j->i, &j->aw, j->t, j->scale, &e);
    int64_t t1 = ms_now_ns();
    pthread_mutex_lock(&o->mu);
    if (st != MS_OK && o->failed == MS_OK) o->failed = st, o->werr = e;
    if (j->copy) {
        o->copies--;
        o->cspan[j->i][0] = c0, o->cspan[j->i][1] = c1;
        o->copied[j->i] = true;
    }
    if (j->update) {
        o->ready[j->i] = j->gen;
        o->span[j->i][0] = c1, o->span[j->i][1] = t1;
    }
    pthread_cond_broadcast(&o->cv);
}

static void *worker_main(void *arg) {
    ms_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->quit && !o->qlen) pthread_cond_wait(&o->cv, &o->mu);
        if (!o->qlen) break; /* quit, and nothing left */
        job j = o->q[o->qhead];
        o->qhead = (o->qhead + 1) % o->qcap;
        o->qlen--;
        o->busy = true;
        run_job(o, &j);
        o->busy = false;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Queues j for the worker (mu held); waits while the ring is full. */
static void push(ms_offload *o, const job *j) {
    while (o->qlen == o->qcap) pthread_cond_wait(&o->cv, &o->mu);
    o->q[(o->qhead + o->qlen++) % o->qcap] = *j;
    if (j->copy) o->copies++;
    pthread_cond_broadcast(&o->cv);
}

/* The worker's copy spans not yet on the trace, there on the "optimizer (host)" lane: recorded
 * by the rank thread (the recorder has one writer). mu held. */
static void record_copies(ms_offload *o) {
    for (int i = 0; i < o->n; i++) {
        if (!o->copied[i]) continue;
        o->copied[i] = false;
        ms_param_view pv;
        view(o, i, &pv);
        ms_record_optim(&o->ctx->trace, pv.name, "gradient D2H (host)", o->cspan[i][0],
                        o->cspan[i][1], true);
    }
}

/* Parameter i's update in flight: wait for it, put it on the device, gather it. The host
 * update's span goes on the rank's "optimizer (host)" lane, recorded here by the rank thread
 * (the recorder has one writer). */
static ms_status take(ms_offload *o, int i, ms_error *err) {
    if (!o->pending[i]) return MS_OK;
    int64_t t0 = ms_now_ns(), span[2];
    pthread_mutex_lock(&o->mu);
    while (o->ready[i] < o->posted && o->failed == MS_OK) pthread_cond_wait(&o->cv, &o->mu);
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

/* Parameter i's gradient is final (during backward): the worker copies it to the host and,
 * eager, updates it at once. Its previous update must be on the device first. */
static ms_status on_grad_final(void *arg, int i, ms_error *err) {
    ms_offload *o = arg;
    if (!o->in_step || o->handed[i]) return MS_OK;
    MS_CHECK(take(o, i, err));
    MS_CHECK(read_masters(o, err));
    /* A device that runs asynchronously (CUDA) orders the copy after the kernels that wrote
     * the gradient only on the rank thread's stream: there the rank thread copies. */
    bool worker_copies = o->dev->ops->sync == NULL;
    if (!worker_copies) MS_CHECK(copy_grad(o, i, err));
    job j = {.i = i, .copy = worker_copies, .update = o->eager, .gen = o->gen};
    j.aw = o->eager_aw, j.t = o->eager_t, j.scale = 1.0f;
    pthread_mutex_lock(&o->mu);
    push(o, &j);
    pthread_mutex_unlock(&o->mu);
    o->handed[i] = true;
    return MS_OK;
}

ms_status ms_offload_begin_step(ms_offload *o, const ms_adamw_opts *aw, int64_t t, ms_error *err) {
    if (!o || !o->overlap) return MS_OK;
    /* the last step's copies read the gradients this step zeroes first */
    pthread_mutex_lock(&o->mu);
    while (o->copies && o->failed == MS_OK) pthread_cond_wait(&o->cv, &o->mu);
    ms_status failed = o->failed;
    if (failed != MS_OK) *err = o->werr;
    record_copies(o);
    pthread_mutex_unlock(&o->mu);
    if (failed != MS_OK) return failed;
    o->in_step = true;
    o->eager = aw != NULL;
    if (aw) o->eager_aw = *aw, o->eager_t = t;
    o->gen++;
    memset(o->handed, 0, sizeof *o->handed * (size_t)o->n);
    return MS_OK;
}

/* Overlapped: posts the updates of every parameter (with the copies of those not handed over
 * during backward), in the next step's order of first use. */
static ms_status post_updates(ms_offload *o, const ms_adamw_opts *aw, int64_t t, float scale,
                              ms_error *err) {
    bool eager = o->in_step && o->eager;
    if (!o->in_step) o->gen++, memset(o->handed, 0, sizeof *o->handed * (size_t)o->n);
    o->in_step = false; /* the step's gradients are all in: later calls are not its */
    if (eager && (scale != 1.0f || t != o->eager_t || aw->lr != o->eager_aw.lr))
        return ms_fail(err, MS_ERR_INTERNAL,
                       "offload: step %lld's update differs from the one begun during backward",
                       (long long)t);
    pthread_mutex_lock(&o->mu);
    ms_status failed = o->failed;
    if (failed != MS_OK) *err = o->werr;
    for (int k = 0; k < o->n && failed == MS_OK; k++) {
        int i = o->order[k];
        if (eager && o->handed[i]) continue;
        job j = {.i = i, .copy = !o->handed[i], .update = true, .gen = o->gen};
        j.aw = *aw, j.t = t, j.scale = scale;
        push(o, &j);
    }
    if (failed == MS_OK) o->posted = o->gen;
    pthread_mutex_unlock(&o->mu);
    return failed;
}

ms_status ms_offload_update(ms_offload *o, const ms_adamw_opts *aw, int64_t t, float scale,
                            ms_error *err) {
    MS_CHECK(ms_offload_settle(o, err));
    MS_CHECK(read_masters(o, err));
    if (!o->overlap) {
        MS_CHECK(copy_grads_down(o, err));
        return update_now(o, aw, t, scale, err);
    }
    MS_CHECK(post_updates(o, aw, t, scale, err));
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
        o->gbytes[i] = ms_dtype_size(pv.grad.dtype) * ((size_t)pv.opt_n + 1);
        o->host_masters = pv.host_master;
        if (pv.host_master) {
            o->master[i] = ms_tensor_f32(&pv.data) + pv.data_off; /* the program's */
        } else {
            o->mbytes[i] = sizeof(float) * ((size_t)pv.opt_n + 1);
            MS_CHECK(ms_device_alloc(o->host, o->mbytes[i], (void **)&o->master[i], err));
        }
        MS_CHECK(ms_device_alloc(o->host, o->gbytes[i], &o->grad[i], err));
        o->dgrad[i] = (const char *)ms_tensor_data(&pv.grad) +
                      ms_dtype_size(pv.grad.dtype) * (size_t)pv.grad_off;
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
    o->dgrad = xcalloc(n, sizeof *o->dgrad);
    o->handed = xcalloc(n, sizeof *o->handed);
    o->cspan = xcalloc(n, sizeof *o->cspan);
    o->copied = xcalloc(n, sizeof *o->copied);
    o->qcap = 4 * (int)n + 4; /* a step's copies and updates, and the last step's updates */
    o->q = xcalloc((size_t)o->qcap, sizeof *o->q);
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
        if (o->overlap) ms_stages_on_grad_final(st, on_grad_final, o);
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
        /* the worker drains its queue first: it writes the moments the trainer frees next */
        o->quit = true;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->worker, NULL);
    }
    if (o->npending) ms_stages_on_param_use(o->st, NULL, NULL);
    if (o->overlap) ms_stages_on_grad_final(o->st, NULL, NULL);
    for (int i = 0; i < o->n; i++) {
        if (o->master[i] && o->mbytes[i]) ms_device_free(o->host, o->master[i], o->mbytes[i]);
        if (o->grad[i]) ms_device_free(o->host, o->grad[i], o->gbytes[i]);
    }
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    ms_kctx_destroy(o->hkc);
    free(o->master), free(o->grad), free(o->mbytes), free(o->gbytes), free(o->order);
    free(o->ready), free(o->span), free(o->pending), free(o->len), free(o->bf16_grad);
    free(o->dgrad), free(o->handed), free(o->cspan), free(o->copied), free(o->q);
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

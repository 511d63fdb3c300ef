/* trainer.c - a rank's training: compiled model, optimizer state, schedule, step (see
 * trainer.h). */
#include "engine/train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/kernels/backend.h"
#include "engine/optim/optim.h"
#include "engine/plan/validate.h"
#include "engine/train/offload.h"
#include "engine/train/stages.h"
#include "engine/core/trace_sink.h"

/* The model compiled for one strategy on this rank (its pipeline chunks, or the whole model):
 * what a switch replaces whole. */
typedef struct compiled {
    ms_strategy strat;
    ms_placement_rules rules;
    ms_stages *st;
} compiled;

/* Adam moments, one pair per parameter, each the optimizer's shard of it (ZeRO: over dp; the
 * whole local shard otherwise), on the optimizer's device. bf16 master weights, when they
 * come, are a third array here, sharded alike. */
typedef struct moments {
    ms_device *dev;
    float **m, **v;
    size_t *bytes;
    int n;
} moments;

struct ms_trainer {
    ms_ctx *ctx;
    ms_dmesh *root;   /* world rank 0 alone: where ms_trainer_state_full gathers */
    ms_model_def def; /* the model; def.lm points at cfg for the built-in ones */
    ms_model_config cfg;
    ms_train_opts o;
    const ms_batch_source *src; /* borrowed, or own_src; NULL: no data */
    ms_batch_source *own_src;   /* the text source ms_trainer_create opens over its data */
    compiled c;
    moments mo;
    ms_device *host; /* owned: host memory beside the device, for offload (NULL: inference) */
    ms_offload *off; /* the compiled strategy's offload, else NULL */
    ms_kctx *okc;    /* owned: the kernels of the optimizer's device (AdamW, the norms) */
    int64_t step;    /* the next step to run: also the data cursor and the schedule's clock */
    int64_t skipped;
    /* One global batch: the source's fields, and the model's inputs made from them */
    float *fields[MS_BATCH_MAX_FIELDS];
    float *inputs[MS_MODEL_MAX_INPUTS];
    /* The gradient norm's list of gradients and their sums of squares (grown, never per step) */
    ms_k_span *norm_spans;
    double *norm_parts;
    int norm_cap;
    ms_k_adamw_item *adamw_items; /* AdamW's list of parameters, grown like the norm's */
    int adamw_cap;
};

/* --- checks ---------------------------------------------------------------------------------- */

ms_status ms_train_opts_check(const ms_train_opts *o, ms_error *err) {
    if (o->batch < 1 || o->seq < 1)
        return ms_fail(err, MS_ERR_INVALID, "--batch (%d) and --seq (%d) must be at least 1",
                       o->batch, o->seq);
    if (o->inference) return MS_OK;
    /* A warmup longer than the run is allowed: the learning rate then only ramps up. */
    if (o->steps < 0 || o->warmup < 0)
        return ms_fail(err, MS_ERR_INVALID, "--steps %d and --warmup %d must be >= 0", o->steps,
                       o->warmup);
    if (!(o->lr >= 0) || !(o->min_lr >= 0) || o->min_lr > o->lr)
        return ms_fail(err, MS_ERR_INVALID,
                       "--lr %g and --min-lr %g: need 0 <= min-lr <= lr (finite numbers)", o->lr,
                       o->min_lr);
    if (!(o->weight_decay >= 0) || !isfinite(o->clip))
        return ms_fail(err, MS_ERR_INVALID,
                       "--weight-decay %g must be >= 0 and --clip %g finite (<= 0 turns it off)",
                       o->weight_decay, o->clip);
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) || !(o->eps >= 0))
        return ms_fail(err, MS_ERR_INVALID, "AdamW betas must be in [0, 1) and eps >= 0");
    return MS_OK;
}

/* The validator for this rank's job (no memory cap: the trainer allocates what it needs). */
static ms_status check_strategy(ms_ctx *ctx, const ms_model_def *d, const ms_train_opts *o,
                                const ms_strategy *s, ms_error *err) {
    ms_job_shape job = {.world = ctx->world_size, .batch = o->batch, .seq = o->seq};
    return ms_strategy_check_def(s, d, &job, err);
}

/* --- compiling and the optimizer state ------------------------------------------------------- */

static void compiled_free(compiled *c) {
    ms_stages_destroy(c->st);
    memset(c, 0, sizeof *c);
}

static ms_device *optim_device(const ms_trainer *t) {
    return t->o.optim_device ? t->o.optim_device : t->ctx->device;
}

/* Where strategy s keeps the moments: host memory under offload. */
static ms_device *moments_device(const ms_trainer *t, const ms_strategy *s) {
    return s->offload ? t->host : optim_device(t);
}

/* The optimizer reads the gradients and writes the parameters in place, so it runs where they
 * live; a host optimizer for device parameters is offload, which moves them explicitly. */
static ms_status check_optim_device(const ms_trainer *t, ms_error *err) {
    ms_device *od = optim_device(t), *pd = t->ctx->device;
    if (t->o.optim_device && !t->o.inference && t->c.strat.offload)
        return ms_fail(err, MS_ERR_INVALID,
                       "trainer: offload puts the optimizer in host memory itself; leave "
                       "optim_device unset or turn offload off");
    if (od == pd || (ms_device_host_addressable(od) && ms_device_host_addressable(pd)))
        return MS_OK;
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "trainer: the optimizer's device (%s) cannot read the parameters on %s; keep "
                   "the optimizer on the parameters' device",
                   ms_device_name(od), ms_device_name(pd));
}

static ms_status compile_for(ms_trainer *t, const ms_strategy *s, const ms_placement_rules *rules,
                             compiled *c, ms_error *err) {
    memset(c, 0, sizeof *c);
    c->strat = *s;
    if (rules) c->rules = *rules;
    ms_stages_opts so = {.batch = t->o.batch, .seed = t->o.seed, .keep_logits = t->o.keep_logits};
    /* ZeRO-Offload under bf16: the masters live on the host beside the moments; the device
     * keeps the bf16 use copies alone */
    if (s->offload && s->precision == MS_PRECISION_BF16 && !t->o.inference)
        so.master_host = t->host;
    return ms_stages_create(t->ctx, &t->def, &c->strat, &c->rules, &so, &c->st, err);
}

static void moments_free(moments *mo) {
    ms_device *dev = mo->dev;
    for (int i = 0; i < mo->n; i++) {
        if (mo->m[i]) ms_device_free(dev, mo->m[i], mo->bytes[i]);
        if (mo->v[i]) ms_device_free(dev, mo->v[i], mo->bytes[i]);
    }
    free(mo->m), free(mo->v), free(mo->bytes);
    memset(mo, 0, sizeof *mo);
}

static ms_status moments_init(ms_device *dev, ms_stages *p, moments *mo, ms_error *err) {
    mo->dev = dev;
    mo->n = ms_stages_num_params(p);
    mo->m = xcalloc((size_t)mo->n, sizeof *mo->m);
    mo->v = xcalloc((size_t)mo->n, sizeof *mo->v);
    mo->bytes = xcalloc((size_t)mo->n, sizeof *mo->bytes);
    for (int i = 0; i < mo->n; i++) {
        ms_param_view pv;
        ms_stages_param(p, i, &pv, NULL);
        /* One spare float: an empty shard (uneven splits) still gets a valid pointer. */
        mo->bytes[i] = ((size_t)pv.opt_n + 1) * sizeof(float);
        ms_status st = ms_device_alloc(dev, mo->bytes[i], (void **)&mo->m[i], err);
        if (st == MS_OK) st = ms_device_alloc(dev, mo->bytes[i], (void **)&mo->v[i], err);
        if (st != MS_OK) {
            moments_free(mo);
            return st;
        }
        if (st == MS_OK) st = ms_device_zero(dev, mo->m[i], mo->bytes[i], err);
        if (st == MS_OK) st = ms_device_zero(dev, mo->v[i], mo->bytes[i], err);
        if (st != MS_OK) {
            moments_free(mo);
            return st;
        }
    }
    return MS_OK;
}

/* The host optimizer of compiled model c (its moments mo), when its strategy offloads. */
static ms_status offload_for(ms_trainer *t, compiled *c, moments *mo, ms_offload **out,
                             ms_error *err) {
    *out = NULL;
    if (t->o.inference || !c->strat.offload) return MS_OK;
    return ms_offload_create(t->ctx, t->host, c->st, mo->m, mo->v, !t->o.offload_serial, out, err);
}

ms_status ms_trainer_settle(ms_trainer *t, ms_error *err) {
    return ms_offload_settle(t->off, err);
}

/* The batch buffers for the def's inputs and the source's fields, B rows each. */
static void batch_buffers(ms_trainer *t) {
    size_t B = (size_t)t->o.batch;
    for (int i = 0; i < t->def.ninputs; i++)
        t->inputs[i] = xmalloc(sizeof(float) * B * (size_t)ms_model_input_numel(&t->def, i));
    for (int f = 0; t->src && f < t->src->nfields; f++)
        t->fields[f] =
            xmalloc(sizeof(float) * B * (size_t)ms_batch_field_numel(&t->src->fields[f]));
}

/* The def's own initial values (an imported model's weights), where it has them: every rank
 * loads its boxes of each such parameter, as a checkpoint load does. */
static ms_status initial_values(ms_trainer *t, ms_error *err) {
    if (!t->def.hooks->initial_value) return MS_OK;
    ms_status st = MS_OK;
    for (int i = 0; i < ms_trainer_num_state(t) && st == MS_OK; i++) {
        ms_state_tensor s;
        ms_trainer_state(t, i, &s);
        if (s.kind != MS_STATE_PARAM) continue;
        int64_t n = 1;
        for (int d = 0; d < s.gshape.ndim; d++) n *= s.gshape.d[d];
        float *full = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
        if (t->def.hooks->initial_value(&t->def, s.param, full, n))
            st = ms_trainer_load_param(t, i, full, err);
        free(full);
    }
    if (st == MS_OK) ms_trainer_state_written(t);
    return st;
}

/* The common part of both constructors: t->def, t->src and t->o are set. */
static ms_status trainer_open(ms_trainer *t, const ms_strategy *s, const ms_placement_rules *rules,
                              ms_error *err) {
    const ms_train_opts *o = &t->o;
    if (t->o.beta1 == 0) t->o.beta1 = 0.9;
    if (t->o.beta2 == 0) t->o.beta2 = 0.95;
    if (t->o.eps == 0) t->o.eps = 1e-8;
    batch_buffers(t);
    ms_mesh root;
    const int one = 1, zero = 0;
    ms_status st = ms_mesh_init(&root, 1, &one, NULL, &zero, err);
    if (st == MS_OK) st = ms_dmesh_create(t->ctx, &root, &t->root, err);
    ms_mesh_free(&root);
    t->c.strat = *s;
    if (st == MS_OK) st = check_optim_device(t, err);
    if (st == MS_OK && !o->inference) st = ms_device_host_beside(t->ctx->device, &t->host, err);
    if (st == MS_OK) st = ms_kctx_create(optim_device(t), &t->okc, err);
    if (st == MS_OK) st = compile_for(t, s, rules, &t->c, err);
    if (st == MS_OK && !o->inference) st = moments_init(moments_device(t, s), t->c.st, &t->mo, err);
    if (st == MS_OK) st = offload_for(t, &t->c, &t->mo, &t->off, err);
    if (st == MS_OK) st = initial_values(t, err);
    return st;
}

ms_status ms_trainer_create_def(ms_ctx *ctx, const ms_model_def *def, const ms_strategy *s,
                                const ms_placement_rules *rules, const ms_train_opts *o,
                                const ms_batch_source *src, ms_trainer **out, ms_error *err) {
    *out = NULL;
    MS_CHECK(ms_train_opts_check(o, err));
    MS_CHECK(ms_model_def_check(def, err));
    MS_CHECK(check_strategy(ctx, def, o, s, err));
    if (src) MS_CHECK(ms_model_def_check_source(def, src, err));
    ms_trainer *t = xcalloc(1, sizeof *t);
    t->ctx = ctx;
    t->def = *def;
    if (def->lm) { /* the trainer's own copy, which outlives the caller's */
        t->cfg = *def->lm;
        t->def.lm = &t->cfg;
    }
    t->o = *o;
    t->src = src;
    ms_status st = trainer_open(t, s, rules, err);
    if (st != MS_OK) {
        ms_trainer_destroy(t);
        return st;
    }
    *out = t;
    return MS_OK;
}

ms_status ms_trainer_create(ms_ctx *ctx, const ms_model_config *cfg, const ms_strategy *s,
                            const ms_placement_rules *rules, const ms_train_opts *o,
                            const ms_text_data *data, ms_trainer **out, ms_error *err) {
    *out = NULL;
    ms_model_def def;
    MS_CHECK(ms_train_opts_check(o, err));
    MS_CHECK(ms_model_def_from_config(cfg, o->seq, &def, err));
    if (data) MS_CHECK(ms_text_data_check_vocab(data, cfg->vocab_size, err));
    ms_batch_source *src = NULL;
    if (data) MS_CHECK(ms_text_source_open(data, &src, err));
    ms_status st = ms_trainer_create_def(ctx, &def, s, rules, o, src, out, err);
    if (st != MS_OK) {
        ms_batch_source_close(src);
        return st;
    }
    (*out)->own_src = src;
    return MS_OK;
}

void ms_trainer_destroy(ms_trainer *t) {
    if (!t) return;
    ms_offload_destroy(t->off); /* first: its worker writes the moments */
    moments_free(&t->mo);
    compiled_free(&t->c);
    ms_kctx_destroy(t->okc);
    ms_dmesh_destroy(t->root);
    if (t->host) ms_device_destroy(t->host);
    for (int i = 0; i < MS_MODEL_MAX_INPUTS; i++) free(t->inputs[i]);
    for (int f = 0; f < MS_BATCH_MAX_FIELDS; f++) free(t->fields[f]);
    ms_batch_source_close(t->own_src);
    free(t->norm_spans), free(t->norm_parts), free(t->adamw_items);
    free(t);
}

/* --- a step ---------------------------------------------------------------------------------- */

/* Loads batch `batch` of split s (sampled, or in order for evaluation) into t->inputs: the
 * source's rows, then the model's inputs made from them; `seed` keys the model's randomness
 * (BERT's masks). */
static ms_status load_batch(ms_trainer *t, ms_split s, bool eval, uint64_t seed, uint64_t batch,
                            ms_error *err) {
    int B = t->o.batch;
    MS_CHECK(ms_batch_source_read(t->src, s, eval, t->o.seed, batch, B, 0, B, t->fields, err));
    return ms_model_def_prepare(&t->def, t->src, seed, batch, B, t->fields, t->inputs, err);
}

/* Global gradient norm: each shard counted once (owners), summed over the world. The sums of
 * squares of all of this rank's gradients come back in one list (one wait for the device),
 * and are added in parameter order. */
static ms_status grad_norm(ms_trainer *t, double *norm, ms_error *err) {
    const int np = ms_stages_num_params(t->c.st);
    if (np > t->norm_cap) {
        free(t->norm_spans), free(t->norm_parts);
        t->norm_spans = xmalloc(sizeof *t->norm_spans * (size_t)np);
        t->norm_parts = xmalloc(sizeof *t->norm_parts * (size_t)np);
        t->norm_cap = np;
    }
    int n = 0;
    for (int i = 0; i < np; i++) {
        ms_param_view v;
        bool counted = true;
        ms_stages_param(t->c.st, i, &v, &counted);
        if (!v.owner || !counted) continue;
        t->norm_spans[n++] = (ms_k_span){.data = ms_tensor_data(&v.grad),
                                         .n = (size_t)ms_tensor_numel(&v.grad),
                                         .bf16 = v.grad.dtype == MS_BF16};
    }
    MS_CHECK(MS_CALL_K(t->okc, sumsq_list, t->norm_parts, t->norm_spans, n, err));
    double local = 0;
    for (int i = 0; i < n; i++) local += t->norm_parts[i];
    /* Two floats keep the sum's precision through a float all-reduce. */
    float parts[2] = {(float)local, (float)(local - (double)(float)local)}, sum[2];
    MS_CHECK(ms_all_reduce(t->ctx->world, parts, sum, 2, MS_REDUCE_SUM, err));
    *norm = sqrt((double)sum[0] + (double)sum[1]);
    return MS_OK;
}

static ms_adamw_opts adamw_opts(const ms_trainer *t, double lr) {
    return (ms_adamw_opts){.lr = (float)lr,
                           .beta1 = (float)t->o.beta1,
                           .beta2 = (float)t->o.beta2,
                           .eps = (float)t->o.eps,
                           .weight_decay = (float)t->o.weight_decay};
}

/* Offload: the step begins; without clipping and without skipping the host may update each
 * parameter as soon as its gradient is on the host (nothing global to wait for). */
static ms_status offload_begin(ms_trainer *t, double lr, ms_error *err) {
    if (!t->off) return MS_OK;
    ms_adamw_opts aw = adamw_opts(t, lr);
    bool eager = !(t->o.clip > 0) && t->o.on_nonfinite != MS_NONFINITE_SKIP;
    return ms_offload_begin_step(t->off, eager ? &aw : NULL, t->step + 1, err);
}

static ms_status adamw_all(ms_trainer *t, double lr, float scale, ms_error *err) {
    ms_adamw_opts aw = adamw_opts(t, lr);
    if (t->off) return ms_offload_update(t->off, &aw, t->step + 1, scale, err);
    /* Every parameter's update in one list (one launch on a GPU, not one per tensor). */
    if (t->mo.n > t->adamw_cap) {
        free(t->adamw_items);
        t->adamw_items = xmalloc(sizeof *t->adamw_items * (size_t)t->mo.n);
        t->adamw_cap = t->mo.n;
    }
    for (int i = 0; i < t->mo.n; i++) {
        ms_param_view pv;
        ms_stages_param(t->c.st, i, &pv, NULL);
        const bool bf16 = pv.grad.dtype == MS_BF16;
        t->adamw_items[i] = (ms_k_adamw_item){
            .p = ms_tensor_f32(&pv.data) + pv.data_off,
            .g = bf16 ? (const void *)((const uint16_t *)ms_tensor_data(&pv.grad) + pv.grad_off)
                      : (const void *)(ms_tensor_f32(&pv.grad) + pv.grad_off),
            .m = t->mo.m[i],
            .v = t->mo.v[i],
            .n = (size_t)pv.opt_n,
            .g_bf16 = bf16};
    }
    MS_CHECK(MS_CALL_K(t->okc, adamw_list, t->adamw_items, t->mo.n, &aw, t->step + 1, scale, err));
    /* ZeRO 1 and 2: every rank updated its shard; gather them back */
    return ms_stages_param_sync(t->c.st, err);
}

ms_status ms_trainer_step(ms_trainer *t, ms_step_result *out, ms_error *err) {
    if (t->o.inference || !t->src)
        return ms_fail(err, MS_ERR_INVALID, "trainer: created without optimizer or data");
    memset(out, 0, sizeof *out);
    out->step = t->step;
    out->t_data_ns = ms_now_ns();
    MS_CHECK(load_batch(t, MS_SPLIT_TRAIN, false, t->o.seed, (uint64_t)t->step, err));
    ms_record_span(&t->ctx->trace, MS_EV_DATA, out->t_data_ns);
    ms_lr_schedule sched = {.lr_max = t->o.lr,
                            .lr_min = t->o.min_lr,
                            .warmup_steps = t->o.warmup,
                            .total_steps = t->o.steps};
    out->lr = ms_lr_at(&sched, t->step);
    MS_CHECK(offload_begin(t, out->lr, err));
    MS_CHECK(ms_stages_train(t->c.st, t->step, t->inputs, &out->loss, err));
    MS_CHECK(grad_norm(t, &out->grad_norm, err));
    out->t_optim_ns = ms_now_ns();
    if (!isfinite(out->loss) || !isfinite(out->grad_norm)) {
        /* Every rank sees the same loss and norm (both are reduced), so all decide alike. */
        if (t->o.on_nonfinite == MS_NONFINITE_STOP)
            return ms_fail(err, MS_ERR_DIVERGED,
                           "step %lld: the %s is not finite (loss %g, gradient norm %g): "
                           "training diverged; lower --lr (now %g) or set --clip, or pass "
                           "--on-nan skip to skip such steps",
                           (long long)t->step, isfinite(out->loss) ? "gradient norm" : "loss",
                           (double)out->loss, out->grad_norm, t->o.lr);
        out->skipped = true;
        t->skipped++;
    } else {
        float scale = t->o.clip > 0 ? ms_clip_scale(out->grad_norm, t->o.clip) : 1.0f;
        MS_CHECK(adamw_all(t, out->lr, scale, err));
    }
    ms_record_span(&t->ctx->trace, MS_EV_OPTIM, out->t_optim_ns);
    t->step++;
    return MS_OK;
}

ms_status ms_trainer_evaluate(ms_trainer *t, ms_split split, int batches, double *loss,
                              ms_error *err) {
    int B = t->o.batch;
    if (!t->src) return ms_fail(err, MS_ERR_INVALID, "trainer: created without data");
    MS_CHECK(ms_trainer_settle(t, err));
    uint64_t have = ms_batch_source_eval_batches(t->src, split, B);
    if ((uint64_t)batches > have) batches = (int)have;
    if (batches < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the %s split is too short for one evaluation batch of %d rows",
                       t->src->name, split == MS_SPLIT_VAL ? "validation" : "training", B);
    double sum = 0;
    for (int b = 0; b < batches; b++) {
        /* evaluation's masks (BERT) are keyed apart from any training run's */
        MS_CHECK(load_batch(t, split, true, 7, (uint64_t)b, err));
        float l;
        MS_CHECK(ms_stages_forward(t->c.st, t->inputs, &l, err));
        sum += l;
    }
    *loss = sum / batches;
    return MS_OK;
}

/* --- switching strategy ---------------------------------------------------------------------- */

/* A state tensor as a DistTensor on its mesh; its local tensor wraps the state's box (left
 * empty on ranks outside the mesh). A box in host memory (offloaded moments) on a device the
 * host cannot address is staged onto the device first, in *stage (free it with
 * ms_device_free(dev, *stage, sizeof(float) * s->n) after the reshard). */
static ms_status state_dtensor(ms_device *dev, const ms_state_tensor *s, ms_dtensor *d,
                               float **stage, ms_error *err) {
    *d = (ms_dtensor){.ndim = s->gshape.ndim, .mesh = s->mesh, .pl = s->pl};
    *stage = NULL;
    memcpy(d->gshape, s->gshape.d, sizeof d->gshape);
    if (!ms_dmesh_is_member(s->mesh)) return MS_OK;
    float *box = s->local;
    if (!ms_device_host_addressable(dev) && !ms_device_owns(dev, box)) {
        MS_CHECK(ms_device_alloc(dev, sizeof(float) * s->n, (void **)stage, err));
        box = *stage;
        MS_CHECK(
            ms_device_copy(dev, box, s->local, sizeof(float) * s->n, MS_COPY_HOST_TO_DEVICE, err));
    }
    int64_t shape[MS_MAX_DIMS];
    for (int k = 0; k < s->lndim; k++) shape[k] = s->lshape[k];
    return ms_tensor_wrap(box, MS_F32, s->lndim, shape, &d->local, err);
}

static void unstage(ms_device *dev, const ms_state_tensor *s, float *stage) {
    if (stage) ms_device_free(dev, stage, sizeof(float) * s->n);
}

ms_status ms_trainer_state_full(ms_trainer *t, int i, ms_tensor *out, ms_error *err) {
    *out = (ms_tensor){0};
    MS_CHECK(ms_trainer_settle(t, err));
    ms_state_tensor s;
    ms_trainer_state(t, i, &s);
    ms_dtensor a = {0}, b = {0};
    float *stage = NULL;
    ms_status st = state_dtensor(t->ctx->device, &s, &a, &stage, err);
    ms_placements r = ms_placements_replicated(1);
    if (st == MS_OK) st = ms_reshard_cross_mesh(&a, t->root, &r, &b, NULL, err);
    ms_tensor_release(&a.local);
    unstage(t->ctx->device, &s, stage);
    if (st == MS_OK && t->ctx->rank == 0) {
        /* gathered on the device; handed back in host memory */
        if (ms_device_host_addressable(t->ctx->device)) {
            *out = b.local;
            return MS_OK;
        }
        st = ms_dtensor_local_copy(t->root, &b.local, true, out, err);
    }
    ms_dtensor_release(&b);
    return st;
}

/* Moves one state tensor's box to its box on another mesh (collective over the world). */
static ms_status move_state(ms_device *dev, const ms_state_tensor *from, const ms_state_tensor *to,
                            ms_error *err) {
    ms_dtensor a = {0}, b = {0};
    float *stage = NULL;
    ms_status st = state_dtensor(dev, from, &a, &stage, err);
    if (st == MS_OK) st = ms_reshard_cross_mesh(&a, to->mesh, &to->pl, &b, NULL, err);
    ms_tensor_release(&a.local);
    unstage(dev, from, stage);
    if (st != MS_OK || !ms_dmesh_is_member(to->mesh)) {
        ms_dtensor_release(&b);
        return st;
    }
    if ((size_t)ms_tensor_numel(&b.local) != to->n)
        st = ms_fail(err, MS_ERR_INTERNAL, "switch: %s moved %lld elements into a box of %zu",
                     to->param, (long long)ms_tensor_numel(&b.local), to->n);
    else /* into the device, or host memory under offload */
        st = ms_device_move(dev, to->local, ms_tensor_f32(&b.local), sizeof(float) * to->n, err);
    ms_dtensor_release(&b);
    return st;
}

/* Buffer entry j of the stages' buffer catalog as state tensor (kind MS_STATE_BUFFER). */
static void buffer_state(compiled *c, int j, ms_state_tensor *out) {
    const ms_stages_entry *cat;
    ms_stages_buffer_catalog(c->st, &cat);
    const ms_stages_entry *e = &cat[j];
    memset(out, 0, sizeof *out);
    out->param = e->param;
    out->kind = MS_STATE_BUFFER;
    out->gshape = e->gshape;
    out->pl = e->pl;
    out->mesh = e->mesh;
    out->lndim = e->gshape.ndim;
    if (e->local_index < 0) return;
    ms_buffer_view bv;
    ms_stages_buffer(c->st, e->local_index, &bv);
    out->lndim = bv.data.ndim;
    for (int d = 0; d < bv.data.ndim; d++) out->lshape[d] = (int)bv.data.shape[d];
    out->n = (size_t)ms_tensor_numel(&bv.data);
    out->local = ms_tensor_f32(&bv.data);
}

/* The state tensors of a compiled model and its moments (see ms_trainer_state): per entry
 * of the stages' catalog, the parameter and its two moments; then every buffer. */
static void state_of(compiled *c, moments *mo, bool inference, int i, ms_state_tensor *out) {
    int per = inference ? 1 : 3;
    const ms_stages_entry *cat;
    int np = ms_stages_catalog(c->st, &cat);
    if (i >= np * per) {
        buffer_state(c, i - np * per, out);
        return;
    }
    const ms_stages_entry *e = &cat[i / per];
    memset(out, 0, sizeof *out);
    out->param = e->param;
    out->kind = (ms_state_kind)(i % per);
    out->gshape = e->gshape;
    bool param = out->kind == MS_STATE_PARAM;
    out->pl = param ? e->pl : e->opt_pl;
    out->mesh = e->mesh;
    out->lndim = e->gshape.ndim;
    if (e->local_index < 0) return; /* another stage's: no box here */
    ms_param_view pv;
    ms_stages_param(c->st, e->local_index, &pv, NULL);
    out->lndim = pv.data.ndim;
    for (int d = 0; d < pv.data.ndim; d++)
        out->lshape[d] = (int)(param ? pv.data.shape[d] : pv.opt_shape.d[d]);
    out->n = param ? (size_t)ms_tensor_numel(&pv.data) : (size_t)pv.opt_n;
    out->local = param                          ? ms_tensor_f32(&pv.data)
                 : out->kind == MS_STATE_ADAM_M ? mo->m[e->local_index]
                                                : mo->v[e->local_index];
}

ms_status ms_trainer_load_param(ms_trainer *t, int i, const float *full, ms_error *err) {
    const ms_stages_entry *cat, *bcat;
    int per = t->o.inference ? 1 : 3, n = ms_stages_catalog(t->c.st, &cat);
    int nb = ms_stages_buffer_catalog(t->c.st, &bcat);
    if (i >= n * per && i < n * per + nb) {
        int local = bcat[i - n * per].local_index;
        return local < 0 ? MS_OK : ms_stages_load_buffer(t->c.st, local, full, err);
    }
    if (i < 0 || i / per >= n || i % per != MS_STATE_PARAM)
        return ms_fail(err, MS_ERR_INVALID, "trainer: state tensor %d is not a parameter", i);
    int local = cat[i / per].local_index;
    ms_offload_params_written(t->off);
    return local < 0 ? MS_OK : ms_stages_load_param(t->c.st, local, full, err);
}

static int num_state(const compiled *c, bool inference) {
    const ms_stages_entry *cat, *bcat;
    return ms_stages_catalog(c->st, &cat) * (inference ? 1 : 3) +
           ms_stages_buffer_catalog(c->st, &bcat);
}

/* The first state tensor of c with this parameter name and kind, or -1. */
static int find_state(compiled *c, moments *mo, bool inference, const char *param,
                      ms_state_kind kind) {
    for (int i = 0; i < num_state(c, inference); i++) {
        ms_state_tensor s;
        state_of(c, mo, inference, i, &s);
        if (s.kind == kind && !strcmp(s.param, param)) return i;
    }
    return -1;
}

static bool same_rules(const ms_placement_rules *a, const ms_placement_rules *b) {
    if (a->n != b->n || a->no_hints != b->no_hints) return false;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->r[i].pattern, b->r[i].pattern) || !ms_placements_eq(&a->r[i].pl, &b->r[i].pl))
            return false;
    return true;
}

bool ms_trainer_runs(const ms_trainer *t, const ms_strategy *s, const ms_placement_rules *rules) {
    static const ms_placement_rules none = {0};
    return ms_strategy_equal(&t->c.strat, s) && same_rules(&t->c.rules, rules ? rules : &none);
}

ms_status ms_trainer_switch(ms_trainer *t, const ms_strategy *target,
                            const ms_placement_rules *rules, ms_error *err) {
    if (ms_trainer_runs(t, target, rules)) return MS_OK; /* nothing would move */
    MS_CHECK(check_strategy(t->ctx, &t->def, &t->o, target, err));
    if (target->offload && t->o.optim_device && !t->o.inference)
        return ms_fail(err, MS_ERR_INVALID,
                       "switch: offload puts the optimizer in host memory itself; this run keeps "
                       "it on %s (optim_device)",
                       ms_device_name(t->o.optim_device));
    MS_CHECK(ms_trainer_settle(t, err));
    compiled nc;
    moments nm = {0};
    ms_offload *noff = NULL;
    MS_CHECK(compile_for(t, target, rules, &nc, err));
    ms_status st =
        t->o.inference ? MS_OK : moments_init(moments_device(t, target), nc.st, &nm, err);
    /* Every state tensor of the target (the tied embedding once per holder) from the first
     * holder of the same parameter and kind here. */
    int n = num_state(&nc, t->o.inference);
    for (int i = 0; i < n && st == MS_OK; i++) {
        ms_state_tensor a, b;
        state_of(&nc, &nm, t->o.inference, i, &b);
        int from = find_state(&t->c, &t->mo, t->o.inference, b.param, b.kind);
        if (from < 0) {
            st = ms_fail(err, MS_ERR_INTERNAL, "switch: no %s in the running model", b.param);
            break;
        }
        state_of(&t->c, &t->mo, t->o.inference, from, &a);
        st = move_state(t->ctx->device, &a, &b, err);
    }
    if (st == MS_OK) st = offload_for(t, &nc, &nm, &noff, err);
    if (st != MS_OK) {
        moments_free(&nm);
        compiled_free(&nc);
        return st;
    }
    ms_offload_destroy(t->off);
    moments_free(&t->mo);
    compiled_free(&t->c);
    t->c = nc;
    t->mo = nm;
    t->off = noff; /* its masters are read from the moved parameters at the first update */
    ms_stages_params_written(t->c.st);
    return MS_OK;
}

/* --- sampling -------------------------------------------------------------------------------- */

/* Draws a token from logits row (temperature 0.8) with the uniform u in [0, 1). */
static int draw(const float *row, int V, double u) {
    double mx = row[0], z = 0;
    for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    for (int v = 0; v < V; v++) z += exp((row[v] - mx) / 0.8);
    double target = u * z, acc = 0;
    for (int v = 0; v < V; v++) {
        acc += exp((row[v] - mx) / 0.8);
        if (acc >= target) return v;
    }
    return V - 1;
}

ms_status ms_trainer_sample(ms_trainer *t, const char *prompt, int n, uint64_t seed, char *out,
                            ms_error *err) {
    if (!t->o.keep_logits)
        return ms_fail(err, MS_ERR_INVALID, "trainer: sampling needs keep_logits");
    if (!t->def.lm || t->def.hooks->prepare == NULL)
        return ms_fail(err, MS_ERR_INVALID, "trainer: model %s does not generate text",
                       t->def.name);
    MS_CHECK(ms_trainer_settle(t, err));
    int T = t->o.seq, V = t->cfg.vocab_size;
    int len = (int)strlen(prompt);
    if (len > T) len = T;
    memcpy(out, prompt, (size_t)len);
    int total = len;
    size_t cells = (size_t)t->o.batch * (size_t)T;
    /* the text's two fields, as a text source would give them */
    ms_batch_source text = {.nfields = 2};
    snprintf(text.name, sizeof text.name, "the prompt");
    const char *names[2] = {"ids", "targets"};
    for (int f = 0; f < 2; f++) {
        snprintf(text.fields[f].name, sizeof text.fields[f].name, "%s", names[f]);
        text.fields[f].ndim = 1, text.fields[f].shape[0] = T, text.fields[f].integer = true;
    }
    float *ids = xmalloc(sizeof *ids * cells), *tgt = xcalloc(cells, sizeof *tgt);
    float *fields[2] = {ids, tgt};
    ms_status st = MS_OK;
    int head = ms_stages_head_chunk(t->c.st);
    for (int k = 0; k < n; k++) {
        /* Every row holds the context, so whichever micro-batch's logits the head kept last
         * has it in its first row. */
        int ctxlen = total < T ? total : T;
        for (size_t c = 0; c < cells; c++) {
            int i = (int)(c % (size_t)T);
            ids[c] = i < ctxlen ? (unsigned char)out[total - ctxlen + i] : 0;
        }
        float loss, pick = 0;
        st = ms_model_def_prepare(&t->def, &text, seed, 0, t->o.batch, fields, t->inputs, err);
        if (st == MS_OK) st = ms_stages_forward(t->c.st, t->inputs, &loss, err);
        if (st == MS_OK && head >= 0) {
            ms_program *p = ms_stages_program(t->c.st, head);
            ms_tensor logits = {0};
            st = ms_program_value(p, ms_stages_model(t->c.st, head)->logits, &logits, err);
            if (st == MS_OK) {
                const float *row = ms_tensor_f32(&logits) + (size_t)(ctxlen - 1) * V;
                pick = (float)draw(row, V, ms_philox_uniform(seed, 99, (uint64_t)k));
            }
            ms_tensor_release(&logits);
        }
        if (st == MS_OK) st = ms_stages_from_head(t->c.st, &pick, 1, err);
        if (st != MS_OK) break;
        int c = (int)pick;
        out[total++] = (char)(c < 32 && c != '\n' ? ' ' : c);
    }
    out[total] = '\0';
    free(ids), free(tgt);
    return st;
}

/* --- accessors and the state ----------------------------------------------------------------- */

void ms_trainer_memory(const ms_trainer *t, ms_stages_memory *out) {
    ms_stages_memory_get(t->c.st, out);
}

int64_t ms_trainer_step_index(const ms_trainer *t) {
    return t->step;
}
void ms_trainer_set_step(ms_trainer *t, int64_t step) {
    t->step = step;
}
const ms_strategy *ms_trainer_strategy(const ms_trainer *t) {
    return &t->c.strat;
}
const ms_placement_rules *ms_trainer_rules(const ms_trainer *t) {
    return &t->c.rules;
}
const ms_model_config *ms_trainer_config(const ms_trainer *t) {
    return t->def.lm;
}
const ms_model_def *ms_trainer_def(const ms_trainer *t) {
    return &t->def;
}
const ms_train_opts *ms_trainer_opts(const ms_trainer *t) {
    return &t->o;
}
const ms_model *ms_trainer_model(const ms_trainer *t) {
    return ms_stages_model(t->c.st, 0);
}
const ms_mesh *ms_trainer_mesh(const ms_trainer *t) {
    return ms_stages_mesh(t->c.st);
}
ms_dmesh *ms_trainer_dmesh(ms_trainer *t) {
    return ms_stages_dmesh(t->c.st);
}
ms_program *ms_trainer_program(ms_trainer *t) {
    return ms_stages_program(t->c.st, 0);
}
ms_ctx *ms_trainer_ctx(const ms_trainer *t) {
    return t->ctx;
}

int64_t ms_trainer_skipped(const ms_trainer *t) {
    return t->skipped;
}

void ms_trainer_state_bytes(ms_trainer *t, ms_trainer_bytes *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ms_stages_num_params(t->c.st); i++) {
        ms_param_view pv;
        ms_stages_param(t->c.st, i, &pv, NULL);
        /* bf16: the bf16 use copies are the parameters, the fp32 masters optimizer state */
        double master = 4.0 * (double)ms_tensor_numel(&pv.data);
        out->params += pv.use_bytes ? (double)pv.use_bytes : master;
        /* host masters: the master and its bf16 rounding on the host */
        if (pv.host_master)
            out->host_optim += master * 1.5;
        else
            out->optim += pv.use_bytes ? master : 0;
        out->grads += (double)ms_dtype_size(pv.grad.dtype) * (double)ms_tensor_numel(&pv.grad);
    }
    double *adam = t->off ? &out->host_optim : &out->optim;
    for (int i = 0; i < t->mo.n; i++) *adam += 2.0 * (double)t->mo.bytes[i];
    out->host_optim += ms_offload_master_bytes(t->off) + ms_offload_staging_bytes(t->off);
}

int ms_trainer_num_state(const ms_trainer *t) {
    return num_state(&t->c, t->o.inference);
}

void ms_trainer_state(ms_trainer *t, int i, ms_state_tensor *out) {
    state_of(&t->c, &t->mo, t->o.inference, i, out);
}

void ms_trainer_state_written(ms_trainer *t) {
    ms_offload_params_written(t->off);
    ms_stages_params_written(t->c.st);
}

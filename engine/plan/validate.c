/* validate.c - whether a strategy suits a job and whether this engine runs it (validate.h). */
#include "engine/plan/validate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/model/lm_def.h"
#include "engine/pipeline/schedule.h"
#include "engine/plan/cost.h"
#include "engine/plan/workload.h"

/* The degrees against the world, the enums, and the heads and layers they split. */
static ms_status check_mesh(const ms_strategy *s, const ms_model_def *d, const ms_job_shape *job,
                            ms_error *err) {
    const int layers = d->n_blocks;
    char name[MS_STRATEGY_NAME_MAX];
    int ranks = ms_strategy_ranks(s);
    if (ranks < 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "degrees must be in 1..%d and multiply to at most %d (dp %d, tp %d, pp %d, "
                       "cp %d)",
                       MS_STRATEGY_MAX_DEGREE, MS_STRATEGY_MAX_RANKS, s->dp, s->tp, s->pp, s->cp);
    if (ranks != job->world)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s needs %d ranks but the job runs on %d; choose degrees whose product "
                       "is %d",
                       ms_strategy_name(s, name, sizeof name), ranks, job->world, job->world);
    if (s->recompute >= MS_RECOMPUTE_COUNT || s->precision >= MS_PRECISION_COUNT ||
        s->schedule >= MS_SCHEDULE_COUNT)
        return ms_fail(err, MS_ERR_INVALID,
                       "unknown recompute mode %d, precision %d or schedule %d (see strategy.h)",
                       s->recompute, s->precision, s->schedule);
    if (s->recompute_layers > 0 && s->recompute != MS_RECOMPUTE_FULL)
        return ms_fail(err, MS_ERR_INVALID,
                       "recompute_layers %d limits full recompute to the first layers of each "
                       "chunk; give it with recompute full, or leave it out",
                       s->recompute_layers);
    if (s->recompute_layers > layers)
        return ms_fail(err, MS_ERR_INVALID,
                       "recompute_layers %d exceeds the model's %d layers; give at most %d (0: "
                       "every layer)",
                       s->recompute_layers, layers, layers);
    if (s->pp > layers)
        return ms_fail(err, MS_ERR_INVALID,
                       "pp %d exceeds the %d layers: every stage needs at least one layer; use a "
                       "pp that divides n_layer (at most %d)",
                       s->pp, layers, layers);
    return MS_OK;
}

/* pp_layers against pp and n_layer; *stages_out the stages it lists (0: none). */
static ms_status check_pp_layers(const ms_strategy *s, const ms_model_def *d, int *stages_out,
                                 ms_error *err) {
    const int n_layer = d->n_blocks;
    int layers = 0;
    *stages_out = 0;
    int stages = 0;
    for (; stages < MS_STRATEGY_MAX_STAGES && s->pp_layers[stages]; stages++)
        layers += s->pp_layers[stages];
    if (stages && stages != s->pp)
        return ms_fail(err, MS_ERR_INVALID,
                       "pp_layers lists %d stages but pp is %d; give one layer count per stage",
                       stages, s->pp);
    if (stages && layers != n_layer)
        return ms_fail(err, MS_ERR_INVALID,
                       "pp_layers adds up to %d layers but the model has %d; make the counts add "
                       "up to n_layer",
                       layers, n_layer);
    /* Without pp_layers the stages are balanced by cost (engine/pipeline/balance.h), so any
     * pp up to n_layer splits; the interleaved schedule cuts equal stages into equal chunks. */
    if (s->virtual_stages > 1 && n_layer % s->pp)
        return ms_fail(err, MS_ERR_INVALID,
                       "pp %d does not divide the %d layers, and the interleaved schedule needs "
                       "equal stages; pick a pp that divides n_layer",
                       s->pp, n_layer);
    *stages_out = stages;
    return MS_OK;
}

/* The sequence against cp, sp against tp, ZeRO against dp, the batch against dp. */
static ms_status check_shape(const ms_strategy *s, const ms_job_shape *job, ms_error *err) {
    if (job->seq % s->cp)
        return ms_fail(err, MS_ERR_INVALID,
                       "cp %d does not divide the sequence length %d; pick a cp that divides it",
                       s->cp, job->seq);
    if (s->sp && s->tp < 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "sp without tp: sequence parallelism (--sp) shards over the "
                       "tensor-parallel group; use it with tp 2 or more");
    if (s->zero < 0 || s->zero > 3)
        return ms_fail(err, MS_ERR_INVALID, "ZeRO stage %d does not exist; use 0, 1, 2 or 3",
                       s->zero);
    if (s->zero && s->dp < 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "ZeRO stage %d with dp %d: ZeRO shards over data parallelism: give dp >= 2 "
                       "or zero 0",
                       s->zero, s->dp);
    if (job->batch < 1 || job->batch % s->dp)
        return ms_fail(err, MS_ERR_INVALID,
                       "the batch %d is not divisible by dp %d; pick a dp that divides it or a "
                       "batch that is a multiple of dp",
                       job->batch, s->dp);
    return MS_OK;
}

/* The micro-batches make each dp rank's share of the batch; *m_out how many. */
static ms_status check_micro(const ms_strategy *s, const ms_job_shape *job, int *m_out,
                             ms_error *err) {
    int mb = 0, m = 0, per = job->batch / s->dp;
    if (!ms_strategy_micro(s, job->batch, &mb, &m)) {
        char given[96];
        if (s->micro_batches > 0 && s->micro_batch > 0)
            snprintf(given, sizeof given, "%d micro-batches of %d sequences", s->micro_batches,
                     s->micro_batch);
        else if (s->micro_batch > 0)
            snprintf(given, sizeof given, "micro-batches of %d sequences", s->micro_batch);
        else
            snprintf(given, sizeof given, "%d micro-batches", s->micro_batches);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s do not make the %d sequences per dp rank (batch %d / dp %d); give "
                       "micro_batches x micro_batch = %d",
                       given, per, job->batch, s->dp, per);
    }
    *m_out = m;
    return MS_OK;
}

/* The schedule against pp, its virtual stages and m micro-batches. */
static ms_status check_schedule(const ms_strategy *s, int n_layer, int stages, int m,
                                ms_error *err) {
    if (s->schedule != MS_SCHEDULE_1F1B && s->pp < 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "the %s schedule orders pipeline stages; use it with pp 2 or more",
                       ms_schedule_name(s->schedule));
    if (s->virtual_stages < 1 ||
        (s->virtual_stages > 1) != (s->schedule == MS_SCHEDULE_INTERLEAVED))
        return ms_fail(err, MS_ERR_INVALID,
                       "virtual_stages %d with the %s schedule: the interleaved schedule takes 2 "
                       "or more virtual stages, the others 1",
                       s->virtual_stages, ms_schedule_name(s->schedule));
    if (s->virtual_stages > 1 && stages)
        return ms_fail(err, MS_ERR_INVALID,
                       "the interleaved schedule cuts every stage into virtual_stages equal "
                       "chunks; leave pp_layers out");
    int per_stage = n_layer / s->pp;
    if (s->virtual_stages > 1 && per_stage % s->virtual_stages) {
        char fix[96] = "";
        int len = 0;
        for (int d = 2; d <= per_stage && d <= MS_PP_MAX_VIRTUAL && len < 64; d++)
            if (per_stage % d == 0)
                len += snprintf(fix + len, sizeof fix - (size_t)len, "%s%d", len ? ", " : "", d);
        return ms_fail(err, MS_ERR_INVALID,
                       "pp %d x virtual_stages %d does not divide the %d layers: the %d layer%s "
                       "per stage (n_layer / pp) cannot be cut into %d chunks; %s%s",
                       s->pp, s->virtual_stages, n_layer, per_stage, per_stage == 1 ? "" : "s",
                       s->virtual_stages,
                       len ? "use virtual_stages "
                           : "use the 1f1b schedule (a stage of one layer "
                             "does not split)",
                       fix);
    }
    /* what the schedule itself needs (the interleaved one: whole groups of pp micro-batches) */
    MS_CHECK(ms_pp_schedule_check((ms_schedule)s->schedule, s->pp, m, s->virtual_stages, err));
    return MS_OK;
}

ms_status ms_strategy_check_def(const ms_strategy *s, const ms_model_def *d,
                                const ms_job_shape *job, ms_error *err) {
    int stages = 0, m = 0;
    MS_CHECK(check_mesh(s, d, job, err));
    if (d->hooks->check) MS_CHECK(d->hooks->check(d, s, err));
    MS_CHECK(check_pp_layers(s, d, &stages, err));
    MS_CHECK(check_shape(s, job, err));
    MS_CHECK(check_micro(s, job, &m, err));
    MS_CHECK(check_schedule(s, d->n_blocks, stages, m, err));
    if (!(s->bucket_mb >= 0) || !isfinite(s->bucket_mb))
        return ms_fail(err, MS_ERR_INVALID, "bucket_mb %g: give a size in MiB > 0 (0: none)",
                       (double)s->bucket_mb);
    if (s->head_replicated && s->tp < 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "a replicated head (--head-replicated, \"head_replicated\": true) needs "
                       "tp 2 or more; without tp the head is whole anyway");
    return MS_OK;
}

/* Bytes per rank the engine needs to run s: its compiled program's arena, parameters,
 * gradients and Adam moments (the model: cfg, or d when d is not NULL). */
static ms_status engine_memory(const ms_strategy *s, const ms_model_config *cfg,
                               const ms_model_def *d, const ms_job_shape *job, double *need,
                               ms_error *err) {
    ms_cluster *c = calloc(1, sizeof *c);
    ms_plan_workload *w = malloc(sizeof *w);
    if (!c || !w) {
        free(c), free(w);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    }
    snprintf(c->backend, sizeof c->backend, "threads");
    c->cpu = true;
    c->cores = 1;
    ms_plan_problem pb = {.devices = job->world,
                          .global_batch = job->batch,
                          .seq = d ? 1 : job->seq,
                          .dtype = MS_PLAN_FP32,
                          .cluster = c,
                          .engine_workloads = true,
                          .def = d};
    if (cfg) pb.model = *cfg;
    ms_status st = wk_from_engine(&pb, s, w, NULL, err);
    if (s->offload) ms_plan_offload_memory(s, w); /* the moments live on the host */
    *need = w->mem_params + w->mem_grads + w->mem_optim + w->mem_act + w->mem_other;
    free(c);
    free(w);
    return st;
}

/* need (engine_memory's) against the cap. */
static ms_status memory_fits(double need, double mem_cap_bytes, ms_error *err) {
    if (need <= mem_cap_bytes) return MS_OK;
    char a[32], b[32];
    return ms_fail(err, MS_ERR_INVALID, "over memory: needs %s per rank, the cap is %s",
                   ms_plan_bytes_str(need, a, sizeof a),
                   ms_plan_bytes_str(mem_cap_bytes, b, sizeof b));
}

ms_status ms_strategy_check(const ms_strategy *s, const ms_model_config *cfg,
                            const ms_job_shape *job, ms_error *err) {
    ms_model_def d;
    MS_CHECK(ms_model_def_from_config(cfg, job->seq > 0 ? job->seq : 1, &d, err));
    return ms_strategy_check_def(s, &d, job, err);
}

ms_status ms_strategy_validate(const ms_strategy *s, const ms_model_config *cfg,
                               const ms_job_shape *job, double mem_cap_bytes, ms_error *err) {
    MS_CHECK(ms_strategy_check(s, cfg, job, err));
    if (mem_cap_bytes > 0) {
        double need = 0;
        MS_CHECK(engine_memory(s, cfg, NULL, job, &need, err));
        MS_CHECK(memory_fits(need, mem_cap_bytes, err));
    }
    return MS_OK;
}

ms_status ms_strategy_validate_def(const ms_strategy *s, const ms_model_def *d,
                                   const ms_job_shape *job, double mem_cap_bytes, ms_error *err) {
    if (d->lm) return ms_strategy_validate(s, d->lm, job, mem_cap_bytes, err);
    MS_CHECK(ms_strategy_check_def(s, d, job, err));
    if (mem_cap_bytes > 0) {
        double need = 0;
        MS_CHECK(engine_memory(s, NULL, d, job, &need, err));
        MS_CHECK(memory_fits(need, mem_cap_bytes, err));
    }
    return MS_OK;
}

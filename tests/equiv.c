/* equiv.c - a distributed training run against one rank (equiv.h). */
#include "tests/equiv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/dtensor.h"
#include "engine/model/strategy.h"
#include "engine/train/stages.h"
#include "engine/train/trainer.h"

enum { B = 8, T = 8, STEPS = 3, MAX_PARAMS = 64 };

ms_model_config mt_equiv_config(bool bert) {
    return mt_tiny_config(bert, 0);
}

ms_train_opts mt_equiv_opts(void) {
    return mt_train_opts(B, T, STEPS);
}

ms_status mt_equiv_data(ms_text_data *d, ms_error *err) {
    return mt_repeated_text("And God said, Let there be light: and there was light. ", T, d, err);
}

/* The one-rank run: losses and every parameter, full. */
typedef struct reference {
    float losses[STEPS];
    double val;
    int n;
    char names[MAX_PARAMS][96];
    float *data[MAX_PARAMS];
    int64_t len[MAX_PARAMS];
} reference;

typedef struct run_arg {
    ms_model_config cfg;
    mt_equiv_tol tol;
    const char *strategy; /* JSON */
    const char *then[2];  /* strategies switched to before steps 1 and 2 (live switches) */
    reference *ref;       /* filled by the reference run, read by the others */
    bool is_ref;
    bool root_only;      /* a reference of many ranks: world rank 0 fills it and compares */
    bool offload_serial; /* ms_train_opts.offload_serial */
    bool no_clip;        /* ms_train_opts.clip 0 */
} run_arg;

/* Adds parameter `name`'s squared difference from the one-rank run and its squared norm to
 * sums[0..1], and checks its largest single difference. The relative error is taken over all
 * of a stage's parameters as one vector, ||x - ref|| / ||ref||: sums in another order change
 * an element whose gradient nearly cancels by a fraction of an AdamW step, which a tensor
 * of small values (a bias that started at 0) shows as a large relative error of its own. A
 * misplaced or stale shard is off by whole steps, which the largest difference catches. */
static void compare_param(mt_rank *r, const reference *ref, const char *name, const float *x,
                          int64_t len, double worst_tol, double sums[2]) {
    for (int i = 0; i < ref->n; i++) {
        if (strcmp(ref->names[i], name)) continue;
        MT_CHECK(r, ref->len[i] == len, "%s: %lld elements, one rank has %lld", name,
                 (long long)len, (long long)ref->len[i]);
        if (ref->len[i] != len) return;
        double worst = 0;
        for (int64_t k = 0; k < len; k++) {
            double dk = (double)x[k] - ref->data[i][k];
            sums[0] += dk * dk;
            sums[1] += (double)ref->data[i][k] * ref->data[i][k];
            worst = fmax(worst, fabs(dk));
        }
        MT_CHECK(r, worst <= worst_tol, "%s: an element differs by %.3g (rank %d)", name, worst,
                 r->ctx->rank);
        return;
    }
    MT_CHECK(r, false, "%s: no such parameter in the one-rank run", name);
}

static void run(mt_rank *r, void *arg) {
    run_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err)) return;
    ms_model_config cfg = a->cfg;
    ms_train_opts o = mt_equiv_opts();
    o.offload_serial = a->offload_serial;
    if (a->no_clip) o.clip = 0;
    ms_strategy s;
    ms_placement_rules rules;
    if (!MT_OK(r,
               ms_strategy_parse_json(a->strategy, strlen(a->strategy), "case", &s, &rules, &err),
               &err)) {
        ms_text_data_close(&d);
        return;
    }
    ms_trainer *tr = NULL;
    if (!MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, &rules, &o, &d, &tr, &err), &err)) {
        ms_text_data_close(&d);
        return;
    }
    reference *ref = a->ref;
    /* Who fills the reference, and who compares with it. */
    const bool root = r->ctx->rank == 0, fills = a->is_ref && (root || !a->root_only),
               checks = !a->is_ref && (root || !a->root_only);
    for (int step = 0; step < STEPS; step++) {
        if (step >= 1 && a->then[step - 1]) {
            ms_strategy to;
            ms_placement_rules to_rules;
            const char *j = a->then[step - 1];
            if (MT_OK(r, ms_strategy_parse_json(j, strlen(j), "then", &to, &to_rules, &err), &err))
                MT_OK(r, ms_trainer_switch(tr, &to, &to_rules, &err), &err);
        }
        ms_step_result res;
        if (!MT_OK(r, ms_trainer_step(tr, &res, &err), &err)) break;
        if (fills)
            ref->losses[step] = res.loss;
        else if (checks)
            MT_CHECK(r,
                     fabsf(res.loss - ref->losses[step]) <= a->tol.loss * fabsf(ref->losses[step]),
                     "%s, step %d: loss %.7f, one rank %.7f", a->strategy, step, res.loss,
                     ref->losses[step]);
    }
    /* Activation memory: the arenas the run needed are the schedule's in-flight bound, no
     * more (the schedule's memory claim, measured) and no fewer (the bound is tight). */
    ms_stages_memory mem;
    ms_trainer_memory(tr, &mem);
    if (ms_trainer_strategy(tr)->pp > 1)
        MT_CHECK(r, mem.held == mem.bound, "%s, stage %d: %d micro-batches held, bound %d",
                 a->strategy, mem.stage, mem.held, mem.bound);
    double val = 0;
    MT_OK(r, ms_trainer_evaluate(tr, MS_SPLIT_VAL, 2, &val, &err), &err);
    if (fills)
        ref->val = val;
    else if (checks)
        MT_CHECK(r, fabs(val - ref->val) <= a->tol.loss * fabs(ref->val),
                 "%s: validation loss %.7f, one rank %.7f", a->strategy, val, ref->val);
    /* Every parameter as each chunk holds it (both copies of the tied embedding under pp),
     * gathered on world rank 0. */
    double sums[2] = {0, 0};
    int ns = ms_trainer_num_state(tr);
    for (int i = 0; i < ns; i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        if (st.kind != MS_STATE_PARAM) continue;
        ms_tensor full = {0};
        if (!MT_OK(r, ms_trainer_state_full(tr, i, &full, &err), &err)) break;
        int64_t len = ms_tensor_numel(&full);
        if (fills && root && ref->n < MAX_PARAMS) {
            snprintf(ref->names[ref->n], sizeof ref->names[0], "%s", st.param);
            ref->len[ref->n] = len;
            ref->data[ref->n] = xmalloc(sizeof(float) * (size_t)len);
            memcpy(ref->data[ref->n], ms_tensor_f32(&full), sizeof(float) * (size_t)len);
            ref->n++;
        } else if (!a->is_ref && root) {
            compare_param(r, ref, st.param, ms_tensor_f32(&full), len, a->tol.worst, sums);
        }
        ms_tensor_release(&full);
    }
    if (!a->is_ref && root)
        MT_CHECK(r, sqrt(sums[0] / sums[1]) <= a->tol.params,
                 "%s: the parameters differ by %.3g relative", a->strategy,
                 sqrt(sums[0] / sums[1]));
    if (!a->is_ref && root && a->tol.differ)
        MT_CHECK(r, sums[0] > 0, "%s: the parameters equal the reference's bit for bit",
                 a->strategy);
    /* Gradient buckets asked for are buckets run: the gradient all-reduces went through them. */
    ms_program_stats ps;
    ms_program_stats_get(ms_trainer_program(tr), &ps);
    if (s.bucket_mb > 0 && s.dp > 1 && !a->then[0] && !a->then[1])
        MT_CHECK(r, ps.grad_buckets > 0 && ps.bucketed_grads >= ps.grad_buckets,
                 "%s: %d gradients in %d buckets", a->strategy, ps.bucketed_grads, ps.grad_buckets);
    ms_trainer_destroy(tr);
    ms_text_data_close(&d);
}

mt_equiv_tol mt_equiv_exact(void) {
    return (mt_equiv_tol){
        .ref = "{\"dp\": 1}", .loss = 1e-5, .params = 1e-5, .worst = 0.01 * mt_equiv_opts().lr};
}

void mt_equiv_check_device(const ms_model_config *model, const char *strategy, int world,
                           ms_device_kind device) {
    const ms_model_config cfg = model ? *model : mt_equiv_config(false);
    const mt_equiv_tol exact = {.ref = strategy}; /* every tolerance 0: bit for bit */
    reference ref = {0};
    run_arg ra = {.cfg = cfg,
                  .tol = exact,
                  .strategy = strategy,
                  .ref = &ref,
                  .is_ref = true,
                  .root_only = true};
    mt_run(world, run, &ra);
    run_arg a = {.cfg = cfg, .tol = exact, .strategy = strategy, .ref = &ref, .root_only = true};
    mt_run_device(world, device, run, &a);
    if (mt_world_rank() == 0) assert_true(ref.n > 0);
    for (int i = 0; i < ref.n; i++) free(ref.data[i]);
}

static void check_pair(const ms_model_config *model, const char *ref, const char *strategy,
                       const char *then1, const char *then2, int world, ms_device_kind device,
                       bool serial, bool no_clip) {
    const ms_model_config cfg = model ? *model : mt_equiv_config(false);
    const mt_equiv_tol exact = {.ref = ref}; /* every tolerance 0: bit for bit */
    reference r = {0};
    run_arg ra = {.cfg = cfg,
                  .tol = exact,
                  .strategy = ref,
                  .ref = &r,
                  .is_ref = true,
                  .root_only = true,
                  .no_clip = no_clip};
    mt_run_device(world, device, run, &ra);
    run_arg a = {.cfg = cfg,
                 .tol = exact,
                 .strategy = strategy,
                 .then = {then1, then2},
                 .ref = &r,
                 .root_only = true,
                 .offload_serial = serial,
                 .no_clip = no_clip};
    mt_run_device(world, device, run, &a);
    if (mt_world_rank() == 0) assert_true(r.n > 0);
    for (int i = 0; i < r.n; i++) free(r.data[i]);
}

void mt_equiv_check_pair(const ms_model_config *model, const char *ref, const char *strategy,
                         const char *then1, const char *then2, int world, ms_device_kind device,
                         bool serial) {
    check_pair(model, ref, strategy, then1, then2, world, device, serial, false);
}

void mt_equiv_check_pair_noclip(const ms_model_config *model, const char *ref, const char *strategy,
                                int world, ms_device_kind device) {
    check_pair(model, ref, strategy, NULL, NULL, world, device, false, true);
}

ms_trainer *mt_equiv_trainer(mt_rank *r, const char *strategy, const ms_train_opts *o,
                             const ms_text_data *d, ms_error *err) {
    ms_model_config cfg = mt_equiv_config(false);
    ms_train_opts dflt = mt_equiv_opts();
    ms_strategy s;
    ms_trainer *t = NULL;
    if (MT_OK(r, ms_strategy_parse_json(strategy, strlen(strategy), "case", &s, NULL, err), err))
        MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, NULL, o ? o : &dflt, d, &t, err), err);
    return t;
}

/* The reference (ref_cfg under tol->ref, one rank), then cfg under strategy on world ranks. */
static void check_against(const ms_model_config *ref_cfg, const ms_model_config *cfg,
                          const char *strategy, const char *then1, const char *then2, int world,
                          const mt_equiv_tol *tol) {
    reference ref = {0};
    run_arg ra = {.cfg = *ref_cfg, .tol = *tol, .strategy = tol->ref, .ref = &ref, .is_ref = true};
    mt_run_threads(1, run, &ra);
    assert_true(ref.n > 0);
    run_arg a = {
        .cfg = *cfg, .tol = *tol, .strategy = strategy, .then = {then1, then2}, .ref = &ref};
    mt_run(world, run, &a);
    for (int i = 0; i < ref.n; i++) free(ref.data[i]);
}

void mt_equiv_check_tol(const ms_model_config *cfg, const char *strategy, const char *then1,
                        const char *then2, int world, const mt_equiv_tol *tol) {
    check_against(cfg, cfg, strategy, then1, then2, world, tol);
}

void mt_equiv_check_model(const ms_model_config *cfg, const char *strategy, const char *then1,
                          const char *then2, int world) {
    mt_equiv_tol tol = mt_equiv_exact();
    check_against(cfg, cfg, strategy, then1, then2, world, &tol);
}

void mt_equiv_check_against(const ms_model_config *ref_cfg, const ms_model_config *cfg,
                            const char *strategy, int world) {
    mt_equiv_tol tol = mt_equiv_exact();
    check_against(ref_cfg, cfg, strategy, NULL, NULL, world, &tol);
}

void mt_equiv_check(bool bert, const char *strategy, const char *then1, const char *then2,
                    int world) {
    ms_model_config cfg = mt_equiv_config(bert);
    mt_equiv_check_model(&cfg, strategy, then1, then2, world);
}

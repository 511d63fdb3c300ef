/* test_offload.c - ZeRO-Offload: the host optimizer computes what the device's does, bit for
 * bit, overlapped or not, under every parallelism; checkpoints and live switches carry a run
 * into and out of it; its memory moves to the host.
 *
 * Each equivalence case trains the GPT three steps with "offload": true and compares every
 * step's loss, the validation loss and every final parameter with the same strategy without
 * offload on the same world and device (the CPU, and the fenced device, whose memory the host
 * cannot touch): equal bits, since the host runs the same AdamW kernel over the same shards in
 * the same order. The checkpoint cases save under one setting and resume under the other; the
 * switch cases move a running job into and out of offload.
 *
 * Test names end in _wN, the world size they need: the MPI entries filter on it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/xalloc.h"
#include "engine/graph/graph.h"
#include "engine/plan/search.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "tests/equiv.h"
#include "tests/testkit.h"

/* base: a strategy's JSON without the closing brace. */
static void pair_model(const ms_model_config *cfg, const char *base, int world,
                       ms_device_kind device, bool serial) {
    char ref[256], off[256];
    snprintf(ref, sizeof ref, "%s}", base);
    snprintf(off, sizeof off, "%s, \"offload\": true}", base);
    mt_equiv_check_pair(cfg, ref, off, NULL, NULL, world, device, serial);
}

static void pair_on(const char *base, int world, ms_device_kind device, bool serial) {
    pair_model(NULL, base, world, device, serial);
}

/* One case per strategy and device: overlapped on the CPU and the fenced device. */
#define OFFLOAD_CASE(name, base, world)                                                            \
    static void name##_cpu_w##world(void **state) {                                                \
        (void)state;                                                                               \
        pair_on(base, world, MS_DEVICE_CPU, false);                                                \
    }                                                                                              \
    static void name##_fenced_w##world(void **state) {                                             \
        (void)state;                                                                               \
        pair_on(base, world, MS_DEVICE_FENCED, false);                                             \
    }

OFFLOAD_CASE(one_rank, "{\"dp\": 1", 1)
OFFLOAD_CASE(dp2_zero0, "{\"dp\": 2", 2)
OFFLOAD_CASE(dp2_zero1, "{\"dp\": 2, \"zero\": 1", 2)
OFFLOAD_CASE(dp2_zero2, "{\"dp\": 2, \"zero\": 2", 2)
OFFLOAD_CASE(dp2_zero3, "{\"dp\": 2, \"zero\": 3", 2)
OFFLOAD_CASE(tp2, "{\"dp\": 1, \"tp\": 2", 2)
OFFLOAD_CASE(pp2, "{\"dp\": 1, \"pp\": 2, \"micro_batches\": 2", 2)
OFFLOAD_CASE(bf16_dp2_zero1, "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\"", 2)
OFFLOAD_CASE(bf16_dp2_zero3, "{\"dp\": 2, \"zero\": 3, \"precision\": \"bf16\"", 2)
/* bf16's masters on the host: cast where they are stored (one rank, tp), through a shard (ZeRO 1
 * above) and per pipeline chunk */
OFFLOAD_CASE(bf16_one_rank, "{\"dp\": 1, \"precision\": \"bf16\"", 1)
OFFLOAD_CASE(bf16_tp2, "{\"dp\": 1, \"tp\": 2, \"sp\": true, \"precision\": \"bf16\"", 2)
OFFLOAD_CASE(bf16_pp2, "{\"dp\": 1, \"pp\": 2, \"micro_batches\": 2, \"precision\": \"bf16\"", 2)
/* Gradients bucketed: with clipping their copies start as each bucket completes in backward. */
OFFLOAD_CASE(bucketed_dp2_zero1, "{\"dp\": 2, \"zero\": 1, \"bucket_mb\": 0.01", 2)
OFFLOAD_CASE(dp2_pp2_zero3, "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"zero\": 3", 4)

/* Without clipping the host AdamW of each parameter runs during backward, right after its
 * gradient's copy (with clipping, above, the copies overlap and the updates wait for the
 * norm): the same bits. Small buckets complete while backward goes on; micro-batches make a
 * gradient final only on the last pass. */
#define NOCLIP_CASE(name, base, world, device)                                                     \
    static void noclip_##name##_w##world(void **state) {                                           \
        (void)state;                                                                               \
        char ref[256], off[256];                                                                   \
        snprintf(ref, sizeof ref, "%s}", base);                                                    \
        snprintf(off, sizeof off, "%s, \"offload\": true}", base);                                 \
        mt_equiv_check_pair_noclip(NULL, ref, off, world, device);                                 \
    }

NOCLIP_CASE(one_rank_cpu, "{\"dp\": 1", 1, MS_DEVICE_CPU)
NOCLIP_CASE(dp2_zero0_fenced, "{\"dp\": 2, \"bucket_mb\": 0.01", 2, MS_DEVICE_FENCED)
NOCLIP_CASE(dp2_zero1_cpu, "{\"dp\": 2, \"zero\": 1", 2, MS_DEVICE_CPU)
NOCLIP_CASE(dp2_zero2_fenced, "{\"dp\": 2, \"zero\": 2", 2, MS_DEVICE_FENCED)
NOCLIP_CASE(dp2_zero3_cpu, "{\"dp\": 2, \"zero\": 3, \"bucket_mb\": 0.01", 2, MS_DEVICE_CPU)
NOCLIP_CASE(small_buckets_dp2_zero2_micro_cpu,
            "{\"dp\": 2, \"zero\": 2, \"micro_batches\": 2, \"bucket_mb\": 0.002", 2, MS_DEVICE_CPU)
NOCLIP_CASE(tp2_cpu, "{\"dp\": 1, \"tp\": 2", 2, MS_DEVICE_CPU)
NOCLIP_CASE(pp2_fenced, "{\"dp\": 1, \"pp\": 2, \"micro_batches\": 2", 2, MS_DEVICE_FENCED)
NOCLIP_CASE(bf16_dp2_zero1_cpu, "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\"", 2,
            MS_DEVICE_CPU)
NOCLIP_CASE(bf16_dp2_zero3_fenced,
            "{\"dp\": 2, \"zero\": 3, \"bucket_mb\": 0.01, \"precision\": \"bf16\"", 2,
            MS_DEVICE_FENCED)
NOCLIP_CASE(dp2_pp2_zero3_cpu, "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"zero\": 3", 4,
            MS_DEVICE_CPU)

/* --- gradients final during backward ------------------------------------------------------- */

/* ms_program_on_grad_final tells of each gradient once per step, once it is final (its values
 * then equal the step's end's). A gradient that needs no grad sync is told right after its last
 * write, while backward still runs: at the first call some other gradient still differs from
 * its value at the step's end. (A bucket's gradients are told when its collective is seen
 * complete, which depends on timing; tests/test_grad_buckets.c polls them.) */
#define FINAL_MAX 64
typedef struct final_arg {
    const char *strategy;
    bool early; /* the first call must come while backward still runs */
    ms_program *p;
    float *at_call[FINAL_MAX], *at_first[FINAL_MAX]; /* each gradient when told; all at the first */
    int64_t len[FINAL_MAX];
    int calls;
} final_arg;

static const float *grad_of(ms_program *p, int i, int64_t *len) {
    ms_param_view pv;
    ms_program_param(p, i, &pv);
    *len = ms_tensor_numel(&pv.grad);
    return ms_tensor_f32(&pv.grad);
}

static ms_status on_final(void *arg, int i, ms_error *err) {
    (void)err;
    final_arg *a = arg;
    int n = ms_program_num_params(a->p);
    for (int j = 0; j < n && a->calls == 0; j++) {
        const float *g = grad_of(a->p, j, &a->len[j]);
        a->at_first[j] = xrealloc(a->at_first[j], sizeof(float) * (size_t)(a->len[j] + 1));
        memcpy(a->at_first[j], g, sizeof(float) * (size_t)a->len[j]);
    }
    const float *g = grad_of(a->p, i, &a->len[i]);
    a->at_call[i] = xrealloc(a->at_call[i], sizeof(float) * (size_t)(a->len[i] + 1));
    memcpy(a->at_call[i], g, sizeof(float) * (size_t)a->len[i]);
    a->calls++;
    return MS_OK;
}

static void final_run(mt_rank *r, void *arg) {
    final_arg *all = arg, *a = &all[r->ctx->rank];
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err)) return;
    ms_trainer *t = mt_equiv_trainer(r, all[0].strategy, NULL, &d, &err);
    if (t) {
        a->p = ms_trainer_program(t);
        int n = ms_program_num_params(a->p);
        MT_CHECK(r, n <= FINAL_MAX, "%d parameters", n);
        ms_program_on_grad_final(a->p, on_final, a);
        for (int step = 0; step < 2 && n <= FINAL_MAX; step++) {
            ms_step_result res;
            a->calls = 0;
            if (!MT_OK(r, ms_trainer_step(t, &res, &err), &err)) break;
            MT_CHECK(r, a->calls == n, "step %d: %d of %d gradients told", step, a->calls, n);
            bool early = false;
            for (int i = 0; i < n && a->calls == n; i++) {
                int64_t len;
                const float *g = grad_of(a->p, i, &len);
                MT_CHECK(r, !memcmp(a->at_call[i], g, sizeof(float) * (size_t)len),
                         "step %d: parameter %d's gradient changed after it was told final", step,
                         i);
                early |= memcmp(a->at_first[i], g, sizeof(float) * (size_t)len) != 0;
            }
            MT_CHECK(r, early || !all[0].early,
                     "%s: every gradient was final before the first was told", all[0].strategy);
        }
        ms_program_on_grad_final(a->p, NULL, NULL);
    }
    ms_trainer_destroy(t);
    ms_text_data_close(&d);
    for (int i = 0; i < FINAL_MAX; i++) free(a->at_call[i]), free(a->at_first[i]);
}

static void grads_told_final(const char *strategy, int world, bool early) {
    final_arg a[4] = {{.strategy = strategy, .early = early}};
    mt_run(world, final_run, a);
}
static void grads_final_in_backward_w1(void **state) {
    (void)state;
    grads_told_final("{\"dp\": 1}", 1, true);
}
static void grads_final_buckets_w2(void **state) {
    (void)state;
    grads_told_final("{\"dp\": 2, \"zero\": 2, \"bucket_mb\": 0.01}", 2, false);
}
static void grads_final_tp2_w2(void **state) {
    (void)state;
    grads_told_final("{\"dp\": 1, \"tp\": 2}", 2, false);
}

/* Wider layers (gpt-bench's 256 channels): a parameter's deferred gather and bf16 cast run in
 * the middle of the forward, so their temporaries must not share arena space with the step's
 * live buffers (ms_compile_opts.deferred_param_sync); here they would. */
static void wide_bf16(const char *base) {
    ms_model_config cfg = mt_equiv_config(false);
    cfg.n_embd = 256;
    pair_model(&cfg, base, 2, MS_DEVICE_FENCED, false);
}
static void wide_bf16_dp2_zero1_w2(void **state) {
    (void)state;
    wide_bf16("{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\"");
}
static void wide_dp2_zero2_w2(void **state) {
    (void)state;
    ms_model_config cfg = mt_equiv_config(false);
    cfg.n_embd = 256;
    pair_model(&cfg, "{\"dp\": 2, \"zero\": 2", 2, MS_DEVICE_CPU, false);
}

/* The host AdamW inside the step (no overlap) computes the same. */
static void serial_dp2_zero2_cpu_w2(void **state) {
    (void)state;
    pair_on("{\"dp\": 2, \"zero\": 2", 2, MS_DEVICE_CPU, true);
}
static void serial_bf16_dp2_zero2_fenced_w2(void **state) {
    (void)state;
    pair_on("{\"dp\": 2, \"zero\": 2, \"precision\": \"bf16\"", 2, MS_DEVICE_FENCED, true);
}
static void serial_pp2_fenced_w2(void **state) {
    (void)state;
    pair_on("{\"dp\": 1, \"pp\": 2, \"micro_batches\": 2", 2, MS_DEVICE_FENCED, true);
}

/* --- live switches ------------------------------------------------------------------------- */

/* Into offload before step 1, out of it before step 2: the run on the target (the strategy
 * without offload) throughout, bit for bit, on the fenced device. */
static void switch_in_and_out_fenced_w2(void **state) {
    (void)state;
    mt_equiv_check_pair(NULL, "{\"dp\": 2, \"zero\": 1}", "{\"dp\": 2, \"zero\": 1}",
                        "{\"dp\": 2, \"zero\": 1, \"offload\": true}", "{\"dp\": 2, \"zero\": 1}",
                        2, MS_DEVICE_FENCED, false);
}
/* The same under bf16, where offload moves the masters to the host and back. */
static void switch_bf16_in_and_out_fenced_w2(void **state) {
    (void)state;
    const char *plain = "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\"}";
    mt_equiv_check_pair(NULL, plain, plain,
                        "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\", \"offload\": true}",
                        plain, 2, MS_DEVICE_FENCED, false);
}
/* Out of offload and back, across meshes and ZeRO stages: each step's loss that of the one-rank
 * run (which every target equals within 1e-5). */
static void switch_across_meshes_w4(void **state) {
    (void)state;
    mt_equiv_check(false, "{\"dp\": 4, \"offload\": true}", "{\"dp\": 2, \"tp\": 2, \"zero\": 3}",
                   "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"zero\": 1, \"offload\": true}",
                   4);
}

/* --- checkpoints --------------------------------------------------------------------------- */

#define CK_STEPS 4
#define CK_SAVE  2

typedef struct ck_arg {
    const char *first, *second; /* strategy JSON before and after the save; second NULL: none */
    char dir[256];
    float losses[CK_STEPS];
    float *params; /* world rank 0: every parameter gathered, in state order */
    size_t n;
} ck_arg;

static ms_trainer *ck_trainer(mt_rank *r, const char *json, ms_text_data *d, ms_error *err) {
    ms_train_opts o = mt_equiv_opts();
    o.steps = CK_STEPS;
    return mt_equiv_trainer(r, json, &o, d, err);
}

static void ck_steps(mt_rank *r, ms_trainer *t, int upto, ck_arg *a, ms_error *err) {
    while (ms_trainer_step_index(t) < upto) {
        ms_step_result res;
        int64_t k = ms_trainer_step_index(t);
        if (!MT_OK(r, ms_trainer_step(t, &res, err), err)) return;
        if (r->ctx->rank == 0) a->losses[k] = res.loss; /* every rank's is the same */
    }
}

static void ck_gather(mt_rank *r, ms_trainer *t, ck_arg *a, ms_error *err) {
    for (int i = 0; i < ms_trainer_num_state(t); i++) {
        ms_state_tensor st;
        ms_trainer_state(t, i, &st);
        if (st.kind != MS_STATE_PARAM) continue;
        ms_tensor full = {0};
        if (!MT_OK(r, ms_trainer_state_full(t, i, &full, err), err)) return;
        size_t len = (size_t)ms_tensor_numel(&full);
        if (r->ctx->rank == 0) {
            a->params = xrealloc(a->params, sizeof(float) * (a->n + len));
            memcpy(a->params + a->n, ms_tensor_f32(&full), sizeof(float) * len);
            a->n += len;
        }
        ms_tensor_release(&full);
    }
}

static void ck_run(mt_rank *r, void *arg) {
    ck_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err)) return;
    ms_trainer *t = ck_trainer(r, a->first, &d, &err);
    if (t && a->second) {
        ms_ckpt_opts co = {.dir = a->dir, .keep = 2};
        ms_ckpt_saver *sv = NULL;
        ck_steps(r, t, CK_SAVE, a, &err);
        if (MT_OK(r, ms_ckpt_saver_create(r->ctx, &co, &sv, &err), &err)) {
            MT_OK(r, ms_ckpt_saver_save(sv, t, NULL, &err), &err);
            MT_OK(r, ms_ckpt_saver_poll(sv, true, NULL, 0, &err), &err);
            ms_ckpt_saver_destroy(sv);
        }
        ms_trainer_destroy(t);
        t = ck_trainer(r, a->second, &d, &err);
        if (t) MT_OK(r, ms_ckpt_load(t, a->dir, NULL, &err), &err);
    }
    if (t) {
        ck_steps(r, t, CK_STEPS, a, &err);
        ck_gather(r, t, a, &err);
    }
    ms_trainer_destroy(t);
    ms_text_data_close(&d);
}

/* Saved under `first`, resumed under `second`: the uninterrupted run under `second`, bit for
 * bit (the checkpoint holds the same tensors with offload as without). */
static void resume_check(const char *tag, const char *first, const char *second, int world,
                         ms_device_kind dev) {
    ck_arg ref = {.first = second}, run = {.first = first, .second = second};
    /* one folder for every process of an MPI world (they share a parent, mpirun), made afresh
     * by world rank 0 alone: two processes running rm -rf and mkdir on one path race (rm's
     * unlink meets the other's new folder: "Is a directory"). The others first use it in the
     * second run below, after the reference run's collectives, which rank 0 joins only once
     * the folder exists. */
    snprintf(run.dir, sizeof run.dir, "/tmp/ms_offload_ck_%d_%s", (int)getppid(), tag);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", run.dir, run.dir);
    if (mt_world_rank() == 0) assert_int_equal(system(cmd), 0);
    mt_run_device(world, dev, ck_run, &ref);
    mt_run_device(world, dev, ck_run, &run);
    if (mt_world_rank() == 0) {
        for (int k = 0; k < CK_STEPS; k++)
            if (memcmp(&ref.losses[k], &run.losses[k], sizeof(float)))
                fail_msg("%s -> %s: step %d loss %.9g, uninterrupted %.9g", first, second, k,
                         (double)run.losses[k], (double)ref.losses[k]);
        assert_true(ref.n > 0);
        assert_int_equal(ref.n, run.n);
        if (memcmp(ref.params, run.params, sizeof(float) * ref.n))
            fail_msg("%s -> %s: the final parameters differ from the uninterrupted run's", first,
                     second);
    }
    free(ref.params), free(run.params);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", run.dir);
    if (mt_world_rank() == 0 && system(cmd) != 0) print_message("could not remove %s\n", run.dir);
}

static void resume_offload_to_none_w2(void **state) {
    (void)state;
    resume_check("from_offload", "{\"dp\": 2, \"zero\": 2, \"offload\": true}",
                 "{\"dp\": 2, \"zero\": 2}", 2, MS_DEVICE_FENCED);
}
static void resume_bf16_offload_to_none_w2(void **state) {
    (void)state;
    resume_check("bf16_from_offload",
                 "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\", \"offload\": true}",
                 "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\"}", 2, MS_DEVICE_FENCED);
}
static void resume_bf16_none_to_offload_w2(void **state) {
    (void)state;
    resume_check("bf16_to_offload", "{\"dp\": 2, \"zero\": 2, \"precision\": \"bf16\"}",
                 "{\"dp\": 2, \"zero\": 2, \"precision\": \"bf16\", \"offload\": true}", 2,
                 MS_DEVICE_CPU);
}
static void resume_none_to_offload_w2(void **state) {
    (void)state;
    resume_check("to_offload", "{\"dp\": 2, \"zero\": 1}",
                 "{\"dp\": 2, \"zero\": 1, \"offload\": true}", 2, MS_DEVICE_CPU);
}

/* --- memory and bad input ------------------------------------------------------------------ */

typedef struct mem_arg {
    const char *strategy;
    bool inference;
    ms_trainer_bytes bytes;
    size_t device_bytes; /* the rank's device in use after creating the trainer */
    size_t arena;        /* its program's arena */
} mem_arg;

static void mem_run(mt_rank *r, void *arg) {
    mem_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err)) return;
    ms_train_opts o = mt_equiv_opts();
    o.inference = a->inference;
    size_t before = atomic_load(&r->ctx->device->in_use);
    ms_trainer *t = mt_equiv_trainer(r, a->strategy, &o, &d, &err);
    if (t && r->ctx->rank == 0) {
        ms_trainer_state_bytes(t, &a->bytes);
        a->device_bytes = atomic_load(&r->ctx->device->in_use) - before;
        a->arena = ms_program_arena_bytes(ms_trainer_program(t));
    }
    double val;
    if (t) MT_OK(r, ms_trainer_evaluate(t, MS_SPLIT_VAL, 1, &val, &err), &err);
    ms_trainer_destroy(t);
    ms_text_data_close(&d);
}

/* fp32: the moments leave the device (optimizer state 0 there, the device that much lighter
 * but for the arena space of the deferred gathers' shards, at most the parameters' shard); the
 * host holds moments, masters and staged gradients: twice the moments' bytes. */
static void memory_moves_to_host_w2(void **state) {
    (void)state;
    mem_arg none = {.strategy = "{\"dp\": 2, \"zero\": 1}"};
    mem_arg off = {.strategy = "{\"dp\": 2, \"zero\": 1, \"offload\": true}"};
    mt_run_device(2, MS_DEVICE_FENCED, mem_run, &none);
    mt_run_device(2, MS_DEVICE_FENCED, mem_run, &off);
    if (mt_world_rank() != 0) return;
    assert_true(none.bytes.optim > 0);
    assert_true(none.bytes.host_optim == 0);
    assert_true(off.bytes.optim == 0);
    assert_true(off.bytes.params == none.bytes.params && off.bytes.grads == none.bytes.grads);
    assert_true(off.bytes.host_optim == 2 * none.bytes.optim);
    double grown = (double)off.arena - (double)none.arena;
    assert_true(grown >= 0 && grown <= none.bytes.params / 2 + 64 * 64);
    assert_true((double)none.device_bytes - (double)off.device_bytes == none.bytes.optim - grown);
}

/* bf16: the device keeps the bf16 use copies and gradients alone; the fp32 masters (4 bytes an
 * element, optimizer state on the device without offload) and the moments leave it. The host
 * holds the moments, the masters with their bf16 rounding (6 bytes) and the bf16 gradients
 * (2): 16 bytes where the device had 12. */
static void bf16_masters_leave_the_device_w2(void **state) {
    (void)state;
    mem_arg none = {.strategy = "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\"}"};
    mem_arg off = {.strategy =
                       "{\"dp\": 2, \"zero\": 1, \"precision\": \"bf16\", \"offload\": true}"};
    mt_run_device(2, MS_DEVICE_FENCED, mem_run, &none);
    mt_run_device(2, MS_DEVICE_FENCED, mem_run, &off);
    if (mt_world_rank() != 0) return;
    assert_true(none.bytes.optim > 0 && none.bytes.host_optim == 0);
    assert_true(off.bytes.optim == 0);
    assert_true(off.bytes.params == none.bytes.params && off.bytes.grads == none.bytes.grads);
    /* the moments' spare float per parameter aside, 16 bytes an element against 12 */
    double ratio = off.bytes.host_optim / none.bytes.optim;
    assert_true(ratio > 4.0 / 3 - 0.01 && ratio < 4.0 / 3 + 0.01);
    double grown = (double)off.arena - (double)none.arena;
    assert_true(grown >= 0 && grown <= none.bytes.params / 2 + 64 * 64);
    assert_true((double)none.device_bytes - (double)off.device_bytes == none.bytes.optim - grown);
}

/* Inference (eval, explain) has no optimizer: offload asks nothing of it. */
static void inference_ignores_offload_w1(void **state) {
    (void)state;
    mem_arg a = {.strategy = "{\"dp\": 1, \"offload\": true}", .inference = true};
    mt_run(1, mem_run, &a);
    if (mt_world_rank() == 0) assert_true(a.bytes.optim == 0 && a.bytes.host_optim == 0);
}

static void bad_input_refused(void **state) {
    (void)state;
    ms_strategy s;
    ms_error err = {0};
    const char *j = "{\"dp\": 2, \"offload\": 1}";
    assert_int_not_equal(ms_strategy_parse_json(j, strlen(j), "s.json", &s, NULL, &err), MS_OK);
    mt_expect_escaped(err.msg, "offload");
    /* the name and the short form carry it, and parse back */
    const char *k = "{\"dp\": 2, \"zero\": 3, \"offload\": true}";
    assert_int_equal(ms_strategy_parse_json(k, strlen(k), "k", &s, NULL, &err), MS_OK);
    char name[MS_STRATEGY_NAME_MAX], js[MS_STRATEGY_JSON_MAX];
    assert_non_null(strstr(ms_strategy_name(&s, name, sizeof name), "offload"));
    ms_strategy back;
    ms_strategy_short_json(&s, js, sizeof js);
    assert_int_equal(ms_strategy_parse_json(js, strlen(js), "back", &back, NULL, &err), MS_OK);
    assert_true(back.offload && ms_strategy_equal(&s, &back));
}

/* A host optimizer device named by the options and offload's own: refused, naming the fix. */
static void optim_device_and_offload(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_model_config cfg = mt_equiv_config(false);
    ms_train_opts o = mt_equiv_opts();
    ms_device *host = NULL;
    ms_device_cpu_create(&host, &err);
    o.optim_device = host;
    ms_strategy s;
    const char *j = "{\"dp\": 1, \"offload\": true}";
    ms_strategy_parse_json(j, strlen(j), "s", &s, NULL, &err);
    ms_trainer *t = NULL;
    ms_status st = ms_trainer_create(r->ctx, &cfg, &s, NULL, &o, NULL, &t, &err);
    MT_CHECK(r, st == MS_ERR_INVALID && strstr(err.msg, "optim_device"), "got %d: %s", st, err.msg);
    ms_trainer_destroy(t);
    ms_device_destroy(host);
}
static void optim_device_refused_w1(void **state) {
    (void)state;
    mt_run(1, optim_device_and_offload, NULL);
}

/* --- the planner ---------------------------------------------------------------------------- */

/* A 1.3B GPT on one 16 GB A100 in fp32: 16 bytes a parameter (weights, gradients, moments) do
 * not fit, with or without recompute and micro-batches; offload moves 8 of them to the host. */
static ms_plan_problem big_on_small(ms_cluster *c) {
    ms_error err = {0};
    assert_int_equal(ms_cluster_load(MS_SOURCE_DIR "/configs/clusters/dgx-a100-80gb.json", c, &err),
                     MS_OK);
    c->mem_bytes = 16e9;
    ms_model_config m = {.model_type = MS_MODEL_GPT2,
                         .n_layer = 24,
                         .n_head = 16,
                         .n_embd = 2048,
                         .vocab_size = 50257,
                         .n_positions = 1024,
                         .layer_norm_epsilon = 1e-5};
    return (ms_plan_problem){.model = m,
                             .devices = 1,
                             .global_batch = 4,
                             .seq = 512,
                             .dtype = MS_PLAN_FP32,
                             .cluster = c};
}

static void planner_chooses_offload_when_nothing_else_fits(void **state) {
    (void)state;
    ms_cluster c;
    ms_plan_problem pb = big_on_small(&c);
    ms_plan_search_opts so = {.keep = 20};
    ms_plan_result res;
    ms_error err = {0};
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    assert_true(res.n_cands > 0 && res.cands[0].fits && res.cands[0].s.offload);
    for (int i = 0; i < res.n_cands; i++) {
        const ms_plan_estimate *e = &res.cands[i];
        ms_strategy plain = e->s;
        plain.offload = false;
        ms_plan_estimate p;
        assert_int_equal(ms_plan_estimate_one(&pb, &plain, NULL, &p, &err), MS_OK);
        assert_false(p.fits); /* fits only with offload */
        assert_true(e->fits == (e->mem_total <= e->mem_cap && e->mem_host <= e->mem_host_cap));
        /* the moments leave the device: 8 bytes a parameter; the host holds 16 */
        double psi = ms_plan_model_params(&pb.model);
        assert_true(fabs(p.mem_total - e->mem_total - 8 * psi) < 1e-6 * p.mem_total);
        assert_true(e->mem_optim == 0 && fabs(e->mem_host - 16 * psi) < 1e-3 * e->mem_host);
        /* the copies at the link's 25 GB/s: 4 bytes down, 4 up a parameter */
        assert_true(fabs(e->offload_copy_s - 8 * psi / 25e9) < 1e-3 * e->offload_copy_s);
        /* hidden: the down copies but the last layer's share, the host AdamW but the first's */
        double down = 4 * psi / 25e9, layers = pb.model.n_layer / (double)e->s.pp;
        assert_true(e->offload_hidden_s > 0);
        assert_true(e->offload_hidden_s <=
                    down * (1 - 1 / layers) + e->offload_host_s * (1 - 1 / layers) + 1e-12);
        assert_true(e->step_s > p.step_s);
        char name[MS_STRATEGY_NAME_MAX];
        assert_non_null(strstr(ms_strategy_name(&e->s, name, sizeof name), "offload"));
    }
    ms_plan_result_free(&res);
}

/* Without clipping the host AdamW also starts during backward: never slower, more hidden, and
 * still never the parts nothing can hide (the up copies, the last gradients' copy, the first
 * layer's update). */
static void planner_prices_updates_in_backward_without_clip(void **state) {
    (void)state;
    ms_cluster c;
    ms_plan_problem pb = big_on_small(&c);
    ms_strategy s;
    ms_error err = {0};
    const char *j = "{\"dp\": 1, \"offload\": true}";
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "s", &s, NULL, &err), MS_OK);
    ms_plan_estimate clip, noclip;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &clip, &err), MS_OK);
    pb.no_clip = true;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &noclip, &err), MS_OK);
    assert_true(noclip.offload_hidden_s > clip.offload_hidden_s);
    assert_true(noclip.step_s < clip.step_s);
    assert_true(fabs((clip.step_s - noclip.step_s) -
                     (noclip.offload_hidden_s - clip.offload_hidden_s)) < 1e-9 * clip.step_s);
    double psi = ms_plan_model_params(&pb.model), layers = pb.model.n_layer;
    double floor = 4 * psi / 25e9 * (1 + 1 / layers) + noclip.offload_host_s / layers;
    assert_true(noclip.offload_copy_s + noclip.offload_host_s - noclip.offload_hidden_s >=
                floor * (1 - 1e-9));
}

/* bf16: the masters leave the device with the moments (12 bytes an element), the host holds 16
 * (masters, their rounding, moments, bf16 gradients), and the link moves 2 bytes down and 2 up. */
static void planner_bf16_offload_moves_masters(void **state) {
    (void)state;
    ms_cluster c;
    ms_plan_problem pb = big_on_small(&c);
    pb.dtype = MS_PLAN_BF16;
    ms_strategy s;
    ms_error err = {0};
    const char *j = "{\"dp\": 1, \"precision\": \"bf16\", \"offload\": true}";
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "s", &s, NULL, &err), MS_OK);
    ms_strategy plain = s;
    plain.offload = false;
    ms_plan_estimate off, none;
    assert_int_equal(ms_plan_estimate_one(&pb, &s, NULL, &off, &err), MS_OK);
    assert_int_equal(ms_plan_estimate_one(&pb, &plain, NULL, &none, &err), MS_OK);
    double psi = ms_plan_model_params(&pb.model);
    assert_true(off.mem_optim == 0);
    assert_true(fabs(none.mem_total - off.mem_total - 12 * psi) < 1e-6 * none.mem_total);
    assert_true(fabs(off.mem_host - 16 * psi) < 1e-3 * off.mem_host);
    assert_true(fabs(off.offload_copy_s - 4 * psi / 25e9) < 1e-3 * off.offload_copy_s);
}

static void planner_evaluates_fixed_offload(void **state) {
    (void)state;
    ms_cluster c;
    ms_plan_problem pb = big_on_small(&c);
    c.mem_bytes = 80e9; /* everything fits: offload only when fixed */
    ms_plan_fixed f;
    ms_error err = {0};
    assert_int_equal(ms_plan_fixed_parse("dp=1,offload=1", &f, &err), MS_OK);
    ms_plan_search_opts so = {.keep = 20, .fixed = &f};
    ms_plan_result res;
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    for (int i = 0; i < res.n_cands; i++) assert_true(res.cands[i].s.offload);
    ms_plan_result_free(&res);
    so.fixed = NULL;
    assert_int_equal(ms_plan_search(&pb, &so, &res, &err), MS_OK);
    for (int i = 0; i < res.n_cands; i++) assert_false(res.cands[i].s.offload);
    ms_plan_result_free(&res);
    assert_int_not_equal(ms_plan_fixed_parse("offload=2", &f, &err), MS_OK);
    mt_expect_escaped(err.msg, "offload=2");
}

#define BOTH(name)  cmocka_unit_test(name##_cpu_w1), cmocka_unit_test(name##_fenced_w1)
#define BOTH2(name) cmocka_unit_test(name##_cpu_w2), cmocka_unit_test(name##_fenced_w2)

static const struct CMUnitTest tests[] = {
    BOTH(one_rank),
    BOTH2(dp2_zero0),
    BOTH2(dp2_zero1),
    BOTH2(dp2_zero2),
    BOTH2(dp2_zero3),
    BOTH2(tp2),
    BOTH2(pp2),
    BOTH2(bf16_dp2_zero1),
    BOTH2(bf16_dp2_zero3),
    BOTH(bf16_one_rank),
    BOTH2(bf16_tp2),
    BOTH2(bf16_pp2),
    BOTH2(bucketed_dp2_zero1),
    cmocka_unit_test(dp2_pp2_zero3_cpu_w4),
    cmocka_unit_test(dp2_pp2_zero3_fenced_w4),
    cmocka_unit_test(noclip_one_rank_cpu_w1),
    cmocka_unit_test(noclip_dp2_zero0_fenced_w2),
    cmocka_unit_test(noclip_dp2_zero1_cpu_w2),
    cmocka_unit_test(noclip_dp2_zero2_fenced_w2),
    cmocka_unit_test(noclip_dp2_zero3_cpu_w2),
    cmocka_unit_test(noclip_small_buckets_dp2_zero2_micro_cpu_w2),
    cmocka_unit_test(noclip_tp2_cpu_w2),
    cmocka_unit_test(noclip_pp2_fenced_w2),
    cmocka_unit_test(noclip_bf16_dp2_zero1_cpu_w2),
    cmocka_unit_test(noclip_bf16_dp2_zero3_fenced_w2),
    cmocka_unit_test(noclip_dp2_pp2_zero3_cpu_w4),
    cmocka_unit_test(grads_final_in_backward_w1),
    cmocka_unit_test(grads_final_buckets_w2),
    cmocka_unit_test(grads_final_tp2_w2),
    cmocka_unit_test(wide_bf16_dp2_zero1_w2),
    cmocka_unit_test(wide_dp2_zero2_w2),
    cmocka_unit_test(serial_dp2_zero2_cpu_w2),
    cmocka_unit_test(serial_pp2_fenced_w2),
    cmocka_unit_test(serial_bf16_dp2_zero2_fenced_w2),
    cmocka_unit_test(switch_bf16_in_and_out_fenced_w2),
    cmocka_unit_test(resume_bf16_offload_to_none_w2),
    cmocka_unit_test(resume_bf16_none_to_offload_w2),
    cmocka_unit_test(bf16_masters_leave_the_device_w2),
    cmocka_unit_test(switch_in_and_out_fenced_w2),
    cmocka_unit_test(switch_across_meshes_w4),
    cmocka_unit_test(resume_offload_to_none_w2),
    cmocka_unit_test(resume_none_to_offload_w2),
    cmocka_unit_test(memory_moves_to_host_w2),
    cmocka_unit_test(inference_ignores_offload_w1),
    cmocka_unit_test(optim_device_refused_w1),
    cmocka_unit_test(bad_input_refused),
    cmocka_unit_test(planner_chooses_offload_when_nothing_else_fits),
    cmocka_unit_test(planner_evaluates_fixed_offload),
    cmocka_unit_test(planner_bf16_offload_moves_masters),
    cmocka_unit_test(planner_prices_updates_in_backward_without_clip),
};

MT_MAIN("test_offload", tests)

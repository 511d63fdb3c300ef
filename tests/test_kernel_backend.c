/* test_kernel_backend.c - the kernel interface per device (engine/kernels/backend.h) and the
 * fenced device:
 *   - the fenced device's memory faults when host code reads it (in a child process), and its
 *     copies move bytes exactly;
 *   - every slot of the fenced table, run on fenced memory, writes bit for bit what the CPU
 *     table writes on host memory from the same inputs (a slot that forgot to remove the tag
 *     from one of its pointers would fault instead);
 *   - the CPU and fenced tables fill every slot; an operator that declares its kernels runs
 *     on both; a program for the fenced device refuses an operator without kernels, naming it.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/core/device.h"
#include "engine/core/xalloc.h"
#include "engine/dist/dmesh.h"
#include "engine/graph/graph.h"
#include "engine/kernels/backend.h"
#include "engine/ops/op.h"
#include "engine/runtime/ctx.h"
#include "tests/testkit.h"

/* --- the fenced device ------------------------------------------------------------------- */

static void fenced_memory_faults_on_host_access(void **state) {
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* the test runner's handler would carry on */
        signal(SIGBUS, SIG_DFL);
        ms_device *dev;
        ms_error err = {0};
        if (ms_device_fenced_create(&dev, &err) != MS_OK) _exit(3);
        float *x;
        if (ms_device_alloc(dev, 64, (void **)&x, &err) != MS_OK) _exit(4);
        volatile float v = x[0]; /* must fault here */
        (void)v;
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* Killed by the fault, or (under a sanitiser) reported and exited non-zero. */
    assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                                        WEXITSTATUS(status) != 3 && WEXITSTATUS(status) != 4));
}

static void fenced_copies_move_bytes(void **state) {
    (void)state;
    ms_device *dev;
    ms_error err = {0};
    assert_int_equal(ms_device_fenced_create(&dev, &err), MS_OK);
    assert_false(ms_device_host_addressable(dev));
    enum { R = 5, C = 7 };
    float host[R * C], back[R * C] = {0};
    for (int i = 0; i < R * C; i++) host[i] = (float)i * 0.5f - 3;
    float *a, *b;
    assert_int_equal(ms_device_alloc(dev, sizeof host, (void **)&a, &err), MS_OK);
    assert_int_equal(ms_device_alloc(dev, sizeof host, (void **)&b, &err), MS_OK);
    assert_true(((uintptr_t)a & MS_DEVICE_FENCE_TAG) != 0);
    assert_int_equal(ms_device_copy(dev, a, host, sizeof host, MS_COPY_HOST_TO_DEVICE, &err),
                     MS_OK);
    assert_int_equal(ms_device_zero(dev, b, sizeof host, &err), MS_OK);
    /* The box rows 1..3, columns 2..5 of a into the same place of b; the rest stays 0. */
    const int64_t shape[2] = {R, C}, at[2] = {1, 2}, len[2] = {3, 4};
    assert_int_equal(
        ms_device_copy_box(dev, b, shape, at, a, shape, at, len, 2, sizeof(float), &err), MS_OK);
    assert_int_equal(ms_device_copy(dev, back, b, sizeof back, MS_COPY_DEVICE_TO_HOST, &err),
                     MS_OK);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            bool in = r >= 1 && r < 4 && c >= 2 && c < 6;
            assert_true(back[r * C + c] == (in ? host[r * C + c] : 0.0f));
        }
    ms_device_free(dev, a, sizeof host);
    ms_device_free(dev, b, sizeof host);
    ms_device_destroy(dev);
}

/* --- every slot, fenced against the CPU -------------------------------------------------- */

enum { NBUF = 16, BUF_FLOATS = 4096, B = 2, T = 8, C = 16, NH = 2, V = 32 };

/* The buffers every slot reads and writes: f[k] floats, ids / targets, doubles land on the
 * host. */
typedef struct pool {
    float *f[NBUF];
    int32_t *ids, *tgt;
    double sums[5]; /* sumsq, sumsq_bf16, then sumsq_list of three */
} pool;

static void run_every_slot(ms_kctx *kc, pool *p) {
    ms_error err = {0};
    float **f = p->f;
    const int64_t n = B * T * C, rows = B * T;
#define K(fn, ...) assert_int_equal(MS_CALL_K(kc, fn, __VA_ARGS__, &err), MS_OK)
    K(fill, f[0], 0.25f, 7);
    K(accumulate, f[1], f[2], n);
    K(bf16_round, (uint16_t *)f[3], f[4], n);
    K(bf16_widen, f[5], (const uint16_t *)f[3], n);
    K(bf16_accumulate, (uint16_t *)f[3], (const uint16_t *)f[3], n);
    K(ids_from_floats, p->tgt + 0, f[6], 0); /* no rows: the ids stay */
    ms_k_gemm g = {.batch = 1, .m = rows, .n = C, .k = C, .bcast_b = true};
    K(matmul_forward, &g, f[7], f[1], f[2], 1.0f, 0.0f);
    K(matmul_backward, &g, f[8], f[9], f[7], f[1], f[2], 1.0f, true);
    K(add_forward, f[10], f[1], f[2], n);
    K(add_backward, f[10], f[11], f[2], n);
    K(mul_forward, f[11], f[1], f[2], n);
    K(mul_backward, f[12], f[13], f[11], f[1], f[2], n);
    K(scale_forward, f[12], f[1], 0.5f, n);
    K(scale_backward, f[13], f[12], 0.5f, n);
    K(bias_add_forward, f[14], f[1], f[2], rows, C);
    K(bias_add_backward, f[14], f[15], f[1], rows, C, 1u); /* dinp fresh: written */
    K(gelu_forward, f[6], f[1], n);
    K(gelu_backward, f[7], f[1], f[6], n);
    K(sum_forward, f[8], f[1], B, T, C);
    K(sum_backward, f[9], f[8], 0.5f, B, T, C);
    K(layernorm_forward, f[10], f[11], f[12], f[1], f[2], f[4], rows, C, 1e-5f);
    K(layernorm_backward, f[13], f[14], f[15], f[10], f[1], f[2], f[11], f[12], rows, C);
    K(softmax_forward, f[6], f[1], rows, C);
    K(softmax_backward, f[7], f[9], f[6], rows, C);
    /* attention: qkv [B, T, 3C] in f[1]; out f[6]; saved f[8]; dqkv f[9]; scratch f[10] */
    assert_true(kc->k->attention_saved_floats(B, T, C, NH) <= BUF_FLOATS);
    assert_true(kc->k->attention_scratch_floats(B, T, NH) <= BUF_FLOATS);
    K(attention_forward, f[6], f[8], NULL, f[1], NULL, B, T, C, NH, true, NULL);
    K(attention_backward, f[9], f[10], f[7], f[1], f[8], NULL, B, T, C, NH, true, 0u, NULL);
    /* the LLaMA layers: x [B, T, NH, C / NH] in f[1] */
    K(rmsnorm_forward, f[3], f[4], f[1], f[2], rows, C, 1e-6f);
    K(rmsnorm_backward, f[5], f[13], f[7], f[1], f[2], f[4], rows, C);
    K(swiglu_forward, f[14], f[1], f[2], n);
    K(swiglu_backward, f[15], f[0] + 64, f[14], f[1], f[2], n);
    K(rotary_tables, f[3], f[4], T, 5, C / NH, 10000.0f);
    K(rotary_apply, f[5], f[1], f[3], f[4], B, T, NH, C / NH, false);
    K(rotary_apply, f[6], f[5], f[3], f[4], B, T, NH, C / NH, true);
    /* grouped-query attention, NH query heads over one kv head, a sequence shard from 3 with
     * a key mask: q [B, T, NH, D] in f[1], packed kv [B, T, 2, 1, D] in f[2], mask [B, T] */
    const int64_t hd = C / NH;
    const ms_k_gqa gq = {.b = B,
                         .tq = T - 3,
                         .tk = T,
                         .h = NH,
                         .hkv = 1,
                         .d = hd,
                         .q_stride = C,
                         .kv_stride = 2 * hd,
                         .out_stride = C,
                         .q_start = 3,
                         .causal = true};
    float *mask = f[0] + 32; /* B * T entries of 0 or 1 */
    K(fill, mask, 1.0f, B * T);
    K(fill, mask + T + 2, 0.0f, 3);
    assert_true(kc->k->gqa_saved_floats(&gq) <= BUF_FLOATS);
    assert_true(kc->k->gqa_scratch_floats(&gq) <= BUF_FLOATS);
    K(gqa_forward, &gq, f[7], f[8], f[1], f[2], f[2] + hd, mask);
    K(gqa_backward, &gq, f[9], f[10], f[10] + hd, f[11], f[12], f[1], f[2], f[2] + hd, f[8], mask);
    K(embedding_forward, f[11], p->ids, f[2], rows, C, 0, V);
    K(embedding_backward, f[12], p->ids, f[11], rows, C, 0, V);
    /* vocab-parallel cross-entropy over logits [rows, V] in f[1] */
    K(xent_vp_rowmax, f[13], f[1], rows, V);
    K(xent_vp_sumexp, f[14], f[1], f[13], rows, V);
    K(xent_vp_target, f[15], f[1], p->tgt, rows, V, 0);
    K(xent_vp_loss, f[0] + 8, f[13], f[14], f[15], p->tgt, rows);
    K(xent_vp_backward, f[2], f[1], f[13], f[14], p->tgt, f[0] + 8, rows, V, 0, 1u); /* fresh */
    ms_k_batch_window w = {.rows = B, .stride = B, .offset = 0};
    const int64_t shape[3] = {B, T, C}, start[3] = {0, 0, 0};
    K(dropout_forward, f[3], f[1], 0.25f, 11, 2, 3, shape, start, shape, &w);
    K(dropout_backward, f[4], f[3], 0.25f, 11, 2, 3, shape, start, shape, &w);
    ms_adamw_opts o = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    K(adamw_step, f[5], f[6], f[7], f[8], (size_t)n, &o, 3, 0.5f);
    K(adamw_step_bf16_grad, f[9], (const uint16_t *)f[3], f[10], f[11], (size_t)n, &o, 3, 1.0f);
    /* the list: a parameter of each kind, as the two calls above would update them */
    const ms_k_adamw_item items[2] = {{f[13], f[14], f[15], f[0] + 96, (size_t)n / 4, false},
                                      {f[12], f[3], f[2], f[1], (size_t)n / 2, true}};
    K(adamw_list, items, 2, &o, 4, 0.75f);
    /* masters into bf16 use copies: two tensors and an empty one */
    const ms_k_cast_item casts[3] = {{(uint16_t *)f[4], f[9], (size_t)n / 2},
                                     {(uint16_t *)f[4] + n / 2 + 8, f[13], (size_t)n / 3},
                                     {(uint16_t *)f[4], f[9], 0}};
    K(bf16_round_list, casts, 3);
    K(sumsq, &p->sums[0], f[5], (size_t)n);
    K(sumsq_bf16, &p->sums[1], (const uint16_t *)f[3], (size_t)n);
    /* the list: the same two tensors and a third, each its own sum as the calls above give */
    const ms_k_span spans[3] = {{f[5], (size_t)n, false},
                                {(const uint16_t *)f[3], (size_t)n, true},
                                {f[6], (size_t)n / 2, false}};
    K(sumsq_list, &p->sums[2], spans, 3);
    assert_memory_equal(&p->sums[2], &p->sums[0], 2 * sizeof(double));
    double half;
    K(sumsq, &half, f[6], (size_t)n / 2);
    assert_memory_equal(&p->sums[4], &half, sizeof half);
    K(scale_inplace, f[12], (size_t)n, 0.75f);
    K(bias_gelu_forward, f[13], f[1], f[2], rows, C);
    K(bias_gelu_backward, f[14], f[15], f[13], f[1], f[2], rows, C, 0u); /* added to */
    const int64_t bshape[3] = {B, T, C}, bstart[3] = {0, 0, 0};
    ms_k_fused_dropout fd = {0.25f, 7, 3, {3, bshape, bstart, bshape, &w}};
    K(bias_dropout_add_forward, f[6], f[1], f[2], f[3], C, &fd);
    K(bias_dropout_add_backward, f[7], f[8], f[9], f[6], C, &fd, 5u); /* dinp, dres fresh */
    /* gather rows by per-sequence positions (integer floats in f[0]'s first 4 slots) */
    K(fill, f[0], 3.0f, 2);
    K(fill, f[0] + 2, 6.0f, 2);
    ms_k_gather_dims gd = {B, T, 2, C, 0, false, true};
    K(gather, f[10], f[1], f[0], &gd, false);
    K(scatter_add, f[11], f[10], f[0], &gd);
#undef K
}

static void fenced_table_matches_cpu(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *cpu, *fen;
    assert_int_equal(ms_device_cpu_create(&cpu, &err), MS_OK);
    assert_int_equal(ms_device_fenced_create(&fen, &err), MS_OK);
    ms_kctx *kc_cpu, *kc_fen;
    assert_int_equal(ms_kctx_create(cpu, &kc_cpu, &err), MS_OK);
    /* an attention choice is accepted and, with one attention kernel, changes nothing */
    const ms_kctx_opts rows = {.attention = MS_KATTENTION_ROWS};
    assert_int_equal(ms_kctx_create_with(fen, &rows, &kc_fen, &err), MS_OK);
    pool h = {0}, d = {0};
    const size_t fb = BUF_FLOATS * sizeof(float), ib = (size_t)B * T * sizeof(int32_t);
    uint64_t x = 12345;
    for (int k = 0; k < NBUF; k++) {
        h.f[k] = xmalloc(fb);
        for (int i = 0; i < BUF_FLOATS; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            h.f[k][i] = (float)((double)(x >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
        }
        assert_int_equal(ms_device_alloc(fen, fb, (void **)&d.f[k], &err), MS_OK);
        assert_int_equal(ms_device_copy(fen, d.f[k], h.f[k], fb, MS_COPY_HOST_TO_DEVICE, &err),
                         MS_OK);
    }
    h.ids = xmalloc(ib), h.tgt = xmalloc(ib);
    for (int i = 0; i < B * T; i++)
        h.ids[i] = (i * 7) % V, h.tgt[i] = i % 5 == 0 ? -1 : (i * 3) % V;
    assert_int_equal(ms_device_alloc(fen, ib, (void **)&d.ids, &err), MS_OK);
    assert_int_equal(ms_device_alloc(fen, ib, (void **)&d.tgt, &err), MS_OK);
    ms_device_copy(fen, d.ids, h.ids, ib, MS_COPY_HOST_TO_DEVICE, &err);
    ms_device_copy(fen, d.tgt, h.tgt, ib, MS_COPY_HOST_TO_DEVICE, &err);

    run_every_slot(kc_cpu, &h);
    run_every_slot(kc_fen, &d);

    float *back = xmalloc(fb);
    for (int k = 0; k < NBUF; k++) {
        assert_int_equal(ms_device_copy(fen, back, d.f[k], fb, MS_COPY_DEVICE_TO_HOST, &err),
                         MS_OK);
        if (memcmp(back, h.f[k], fb)) fail_msg("buffer %d differs between the cpu and fenced", k);
        ms_device_free(fen, d.f[k], fb);
        free(h.f[k]);
    }
    assert_true(memcmp(d.sums, h.sums, sizeof h.sums) == 0);
    free(back);
    ms_device_free(fen, d.ids, ib), ms_device_free(fen, d.tgt, ib);
    free(h.ids), free(h.tgt);
    ms_kctx_destroy(kc_cpu), ms_kctx_destroy(kc_fen);
    ms_device_destroy(cpu), ms_device_destroy(fen);
}

/* --- bf16 products: the fenced table's unstaged slots against staging on the CPU ---------- */

/* n bf16 values from a deterministic stream in [-1, 1). */
static uint16_t *bf16_values(int64_t n, uint64_t seed) {
    float *f = xmalloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        f[i] = (float)((double)(seed >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
    }
    uint16_t *h = xmalloc((size_t)n * sizeof *h);
    ms_k_bf16_round(h, f, n);
    free(f);
    return h;
}

static float *widen(const uint16_t *h, int64_t n) {
    float *f = xmalloc((size_t)n * sizeof *f);
    ms_k_bf16_widen(f, h, n);
    return f;
}

static uint16_t *on_fenced(ms_device *fen, const uint16_t *h, int64_t n) {
    ms_error err = {0};
    void *d;
    assert_int_equal(ms_device_alloc(fen, (size_t)n * 2, &d, &err), MS_OK);
    assert_int_equal(ms_device_copy(fen, d, h, (size_t)n * 2, MS_COPY_HOST_TO_DEVICE, &err), MS_OK);
    return d;
}

static void assert_fenced_equals(ms_device *fen, const uint16_t *d, const uint16_t *want, int64_t n,
                                 const char *what) {
    ms_error err = {0};
    uint16_t *back = xmalloc((size_t)n * 2);
    assert_int_equal(ms_device_copy(fen, back, d, (size_t)n * 2, MS_COPY_DEVICE_TO_HOST, &err),
                     MS_OK);
    if (memcmp(back, want, (size_t)n * 2)) fail_msg("%s: the unstaged bf16 product differs", what);
    free(back);
}

/* The program hands bf16 buffers to a table's bf16 products without staging them (as on
 * CUDA); on the fenced table that must write exactly what staging writes: widen, the fp32
 * product, one rounding (accumulation included). A weight-form and a batched product. */
static void fenced_bf16_products_equal_staged(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *fen;
    assert_int_equal(ms_device_fenced_create(&fen, &err), MS_OK);
    ms_kctx *kc;
    assert_int_equal(ms_kctx_create(fen, &kc, &err), MS_OK);
    const ms_k_gemm shapes[2] = {{.batch = 1, .m = 24, .n = 20, .k = 36, .bcast_b = true},
                                 {.batch = 3, .m = 8, .n = 12, .k = 16, .trans_b = true}};
    for (int s = 0; s < 2; s++) {
        const ms_k_gemm *g = &shapes[s];
        int64_t na = (g->bcast_a ? 1 : g->batch) * g->m * g->k;
        int64_t nb = (g->bcast_b ? 1 : g->batch) * g->k * g->n, nc = g->batch * g->m * g->n;
        uint16_t *a = bf16_values(na, 1 + s), *b = bf16_values(nb, 7 + s);
        uint16_t *dc = bf16_values(nc, 11 + s);
        uint16_t *da0 = bf16_values(na, 13 + s), *db0 = bf16_values(nb, 17 + s);
        /* staged on the host */
        float *wa = widen(a, na), *wb = widen(b, nb), *wdc = widen(dc, nc);
        float *wc = xmalloc((size_t)nc * sizeof *wc), *wda = widen(da0, na), *wdb = widen(db0, nb);
        ms_k_matmul_forward(g, wc, wa, wb, 1.0f, 0.0f);
        ms_k_matmul_backward(g, wda, wdb, wdc, wa, wb, 1.0f, true);
        uint16_t *c = xmalloc((size_t)nc * 2), *da = xmalloc((size_t)na * 2);
        uint16_t *db = xmalloc((size_t)nb * 2);
        ms_k_bf16_round(c, wc, nc), ms_k_bf16_round(da, wda, na), ms_k_bf16_round(db, wdb, nb);
        /* unstaged on the fenced device */
        uint16_t *fa = on_fenced(fen, a, na), *fb = on_fenced(fen, b, nb);
        uint16_t *fdc = on_fenced(fen, dc, nc), *fc = on_fenced(fen, dc, nc);
        uint16_t *fda = on_fenced(fen, da0, na), *fdb = on_fenced(fen, db0, nb);
        assert_int_equal(MS_CALL_K(kc, matmul_forward_bf16, g, fc, fa, fb, 1.0f, 0.0f, &err),
                         MS_OK);
        assert_int_equal(
            MS_CALL_K(kc, matmul_backward_bf16, g, fda, fdb, fdc, fa, fb, 1.0f, true, &err), MS_OK);
        assert_fenced_equals(fen, fc, c, nc, "forward");
        assert_fenced_equals(fen, fda, da, na, "gradient of a");
        assert_fenced_equals(fen, fdb, db, nb, "gradient of b");
        ms_device_free(fen, fa, (size_t)na * 2), ms_device_free(fen, fb, (size_t)nb * 2);
        ms_device_free(fen, fdc, (size_t)nc * 2), ms_device_free(fen, fc, (size_t)nc * 2);
        ms_device_free(fen, fda, (size_t)na * 2), ms_device_free(fen, fdb, (size_t)nb * 2);
        free(a), free(b), free(dc), free(da0), free(db0), free(wa), free(wb), free(wdc), free(wc);
        free(wda), free(wdb), free(c), free(da), free(db);
    }
    ms_kctx_destroy(kc);
    ms_device_destroy(fen);
}

/* --- tables and operators ---------------------------------------------------------------- */

static void host_tables_fill_every_slot(void **state) {
    (void)state;
    const ms_device_kind kinds[2] = {MS_DEVICE_CPU, MS_DEVICE_FENCED};
    for (int t = 0; t < 2; t++) {
        const ms_kernels *k = ms_kernels_for(kinds[t]);
        assert_non_null(k);
        /* The slots are the pointers after the name and the kind. */
        const char *base = (const char *)k + offsetof(ms_kernels, sync);
        size_t nslots = (sizeof *k - offsetof(ms_kernels, sync)) / sizeof(void *);
        /* The bf16 kernels are optional: the CPU stages them through fp32 instead. */
        const size_t bf16_first =
                         (offsetof(ms_kernels, matmul_forward_bf16) - offsetof(ms_kernels, sync)) /
                         sizeof(void *),
                     bf16_last = (offsetof(ms_kernels, embedding_backward_bf16) -
                                  offsetof(ms_kernels, sync)) /
                                 sizeof(void *);
        for (size_t i = 0; i < nslots; i++) {
            void *slot;
            memcpy(&slot, base + i * sizeof(void *), sizeof slot);
            bool optional = kinds[t] == MS_DEVICE_CPU && i >= bf16_first && i <= bf16_last;
            if (!slot && !optional) fail_msg("table %s: slot %zu is empty", k->name, i);
        }
    }
#ifndef MS_HAVE_CUDA
    assert_null(ms_kernels_for(MS_DEVICE_CUDA));
#endif
    /* Every built-in operator declares its kernels and runs on every table of this build
     * (`meshscope ops` shows no host-only operator); GPT-2's and LLaMA's first among them. */
    for (int op = 0; op < MS_OP_BUILTIN_COUNT; op++) {
        const ms_op_def *d = ms_op_get(op);
        if (!d->runs_on) fail_msg("operator '%s' declares no kernels (runs_on)", d->name);
        for (ms_device_kind kind = MS_DEVICE_CPU; kind <= MS_DEVICE_CUDA; kind++)
            if (ms_kernels_for(kind) && !d->runs_on(ms_kernels_for(kind)))
                fail_msg("operator '%s' lacks kernels in table %s", d->name,
                         ms_kernels_for(kind)->name);
    }
    /* A GPU's bf16 kernels are priced by the fenced table where CUDA is not built (the
     * planner's staging area, program.c shapes_kernels): the two cover the same operators. */
    const ms_kernels *cuda = ms_kernels_for(MS_DEVICE_CUDA);
    for (int op = 0; cuda && op < MS_OP_BUILTIN_COUNT; op++) {
        const ms_op_def *d = ms_op_get(op);
        if (d->runs_bf16_on &&
            d->runs_bf16_on(cuda) != d->runs_bf16_on(ms_kernels_for(MS_DEVICE_FENCED)))
            fail_msg("operator '%s': bf16 kernels on %s but not on the other table", d->name,
                     d->runs_bf16_on(cuda) ? "cuda" : "fenced");
    }
    // clang-format off
    const int transformer[] = {
        MS_OP_MATMUL, MS_OP_ADD, MS_OP_BIAS, MS_OP_GELU, MS_OP_LAYERNORM, MS_OP_ATTENTION,
        MS_OP_EMBEDDING, MS_OP_XENT, MS_OP_MEAN, MS_OP_DROPOUT, MS_OP_SCALE,
        MS_OP_RMSNORM, MS_OP_ROTARY, MS_OP_SWIGLU, MS_OP_GQA_ATTENTION, MS_OP_LINEAR,
        MS_OP_PADDED_ATTENTION};
    // clang-format on
    for (size_t i = 0; i < sizeof transformer / sizeof *transformer; i++) {
        const ms_op_def *d = ms_op_get(transformer[i]);
        assert_non_null(d->runs_on);
        assert_true(d->runs_on(ms_kernels_for(MS_DEVICE_CPU)));
        assert_true(d->runs_on(ms_kernels_for(MS_DEVICE_FENCED)));
    }
}

/* A graph with an operator that has no kernels in the fenced table is refused by name: a user
 * operator that calls the CPU kernels directly (no runs_on), as neg's row without it. */
static int host_only_op = -1;

static ms_status refuse_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    (void)arg;
    ms_graph *g = ms_graph_create();
    int x = ms_graph_input(g, "x", 2, (int64_t[]){4, 8});
    int y = ms_graph_op(g, host_only_op, NULL, 1, &x, "flip");
    ms_op_attrs all = {.i = {-1}};
    ms_graph_set_loss(g, ms_graph_op(g, MS_OP_MEAN, &all, 1, &y, "loss"));
    ms_mesh mesh;
    ms_dmesh *dm = NULL;
    ms_program *p = NULL;
    ms_status st = ms_mesh_init(&mesh, 1, (int[]){1}, (const char *[]){"dp"}, NULL, err);
    if (st == MS_OK) st = ms_dmesh_create(ctx, &mesh, &dm, err);
    if (st == MS_OK) st = ms_program_compile(g, dm, NULL, &p, err);
    ms_program_destroy(p);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    ms_graph_destroy(g);
    return st;
}

static void fenced_program_refuses_ops_without_kernels(void **state) {
    (void)state;
    ms_error err = {0};
    if (host_only_op < 0) {
        ms_op_def def = *ms_op_get(MS_OP_NEG);
        def.name = "host_neg", def.runs_on = NULL;
        if (ms_op_register(&def, &host_only_op, &err) != MS_OK) fail_msg("%s", err.msg);
    }
    ms_launch_opts lo = {.backend = MS_BACKEND_THREADS, .nranks = 1, .device = MS_DEVICE_FENCED};
    ms_status st = ms_launch(&lo, refuse_rank, NULL, &err);
    if (st != MS_ERR_UNSUPPORTED) fail_msg("status %d: %s", (int)st, err.msg);
    assert_non_null(strstr(err.msg, "'host_neg'"));
    assert_non_null(strstr(err.msg, "'flip'"));
    assert_non_null(strstr(err.msg, "fenced"));
    assert_non_null(strstr(err.msg, "--device cpu"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fenced_memory_faults_on_host_access),
        cmocka_unit_test(fenced_copies_move_bytes),
        cmocka_unit_test(fenced_table_matches_cpu),
        cmocka_unit_test(fenced_bf16_products_equal_staged),
        cmocka_unit_test(host_tables_fill_every_slot),
        cmocka_unit_test(fenced_program_refuses_ops_without_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

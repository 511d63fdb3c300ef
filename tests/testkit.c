/* testkit.c - the rank-function test harness (see testkit.h). */
#include "tests/testkit.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_mpi.h"
#include "engine/core/xalloc.h"
#include "engine/dist/dtensor.h"
#include "engine/kernels/blas.h"
#include "engine/model/config.h"

static ms_backend_kind g_backend = MS_BACKEND_THREADS;
static int g_mpi_world = 0, g_world_rank = 0;

int mt_world_rank(void) {
    return g_world_rank;
}

ms_backend_kind mt_backend(void) {
    return g_backend;
}
int mt_mpi_world(void) {
    return g_mpi_world;
}

void mt_failf(mt_rank *r, const char *file, int line, const char *fmt, ...) {
    if (r->failures++ == 0) {
        int n = snprintf(r->first, sizeof r->first, "%s:%d: ", file, line);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->first + n, sizeof r->first - (size_t)n, fmt, ap);
        va_end(ap);
    }
}

int mt_ok_at(mt_rank *r, ms_status st, const ms_error *err, const char *file, int line) {
    if (st == MS_OK) return 1;
    mt_failf(r, file, line, "%s: %s", ms_status_str(st), err ? err->msg : "");
    return 0;
}

typedef struct run_arg {
    mt_rank_fn fn;
    void *arg;
    ms_backend_kind backend;
} run_arg;

static ms_status rank_main(ms_ctx *ctx, void *p, ms_error *err) {
    run_arg *ra = p;
    mt_rank r = {.ctx = ctx};
    ra->fn(&r, ra->arg);
    if (ra->backend == MS_BACKEND_MPI) {
        /* Every process must agree on the verdict, so all of them fail the test. */
        float mine = (float)r.failures, total = 0;
        ms_error e2;
        if (ms_all_reduce(ctx->world, &mine, &total, 1, MS_REDUCE_SUM, &e2) != MS_OK)
            return ms_fail(err, MS_ERR_COMM, "verdict exchange failed: %s", e2.msg);
        if (r.failures)
            return ms_fail(err, MS_ERR_INTERNAL, "%d failure(s); first: %s", r.failures, r.first);
        if (total > 0)
            return ms_fail(err, MS_ERR_INTERNAL, "%d failure(s) on other ranks", (int)total);
        return MS_OK;
    }
    if (r.failures)
        return ms_fail(err, MS_ERR_INTERNAL, "%d failure(s); first: %s", r.failures, r.first);
    return MS_OK;
}

static void run_on(ms_backend_kind backend, int nranks, ms_device_kind device, mt_rank_fn fn,
                   void *arg) {
    /* The BLAS policy is decided before any rank multiplies; a TSan build must find it at one
     * thread, or TSan would report OpenBLAS's unseen synchronisation as races (blas.h). */
    if (ms_blas_pinned_for_tsan() && ms_blas_policy() != 1) {
        print_error("ThreadSanitizer build with OpenBLAS's pool at %d threads: the BLAS policy "
                    "(engine/kernels/blas.h) was bypassed\n",
                    ms_blas_policy());
        fail();
    }
    run_arg ra = {fn, arg, backend};
    ms_launch_opts opts = {.backend = backend,
                           .nranks = backend == MS_BACKEND_MPI ? 0 : nranks,
                           .device = device,
                           .seed = 1234,
                           .timeout_ms = MT_TIMEOUT_MS};
    ms_error err = {0};
    ms_status st = ms_launch(&opts, rank_main, &ra, &err);
    if (st != MS_OK) {
        print_error("%s\n", err.msg);
        fail();
    }
}

void mt_run_device(int nranks, ms_device_kind device, mt_rank_fn fn, void *arg) {
    if (g_backend == MS_BACKEND_MPI && g_mpi_world < nranks) {
        print_error("this test needs %d ranks but mpirun started %d\n", nranks, g_mpi_world);
        fail();
    }
    run_on(g_backend, nranks, device, fn, arg);
}

void mt_run(int nranks, mt_rank_fn fn, void *arg) {
    mt_run_device(nranks, MS_DEVICE_CPU, fn, arg);
}

void mt_run_threads(int nranks, mt_rank_fn fn, void *arg) {
    run_on(MS_BACKEND_THREADS, nranks, MS_DEVICE_CPU, fn, arg);
}

void mt_expect_escaped(const char *msg, const char *want) {
    if (!strstr(msg, want)) fail_msg("message '%s' lacks '%s'", msg, want);
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++)
        if (*c < 0x20 || *c == 0x7f || (c[0] == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f))
            fail_msg("message '%s' holds control byte 0x%02x at %zu", msg, *c,
                     (size_t)(c - (const unsigned char *)msg));
}

static long sweep_stride(void) {
    static _Atomic long cached; /* rank threads may ask first at once: all compute the same */
    long stride = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!stride) {
        const char *s = getenv("MS_SWEEP_STRIDE");
        long k = s ? strtol(s, NULL, 10) : 1;
        stride = k > 1 ? k : 1;
        atomic_store_explicit(&cached, stride, memory_order_relaxed);
    }
    return stride;
}

bool mt_sweep_full(void) {
    return sweep_stride() == 1;
}

bool mt_sweep_take(long i, long n, long salt) {
    long stride = sweep_stride();
    if (stride == 1) return true;
    if (n > 0 && i == salt % n) return true; /* every sweep keeps at least one case */
    /* A mixing hash, not (i + salt) % stride: a plain stride over a pair index a * n + b
     * would, for even n, only ever pair a with b of one parity. */
    uint64_t h = ((uint64_t)i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)salt * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    return h % (uint64_t)stride == 0;
}

void mt_apply_filter(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "--filter")) cmocka_set_test_filter(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "--skip")) cmocka_set_skip_filter(argv[2]);
}

int mt_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t n) {
    mt_apply_filter(argc, argv);
    if (ms_mpi_launched()) {
        ms_error err = {0};
        if (ms_mpi_init(&argc, &argv, &err) != MS_OK) {
            fprintf(stderr, "%s: %s\n", name, err.msg);
            return 1;
        }
        g_backend = MS_BACKEND_MPI;
        ms_comm *w;
        if (ms_comm_mpi_create_world(&w, &err) != MS_OK) {
            fprintf(stderr, "%s: %s\n", name, err.msg);
            return 1;
        }
        g_mpi_world = ms_comm_size(w);
        g_world_rank = ms_comm_rank(w);
        ms_comm_destroy(w);
    }
    int rc = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    if (g_backend == MS_BACKEND_MPI) ms_mpi_finalize();
    return rc;
}

ms_model_config mt_source_config(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/configs/%s", MS_SOURCE_DIR, name);
    ms_model_config c;
    ms_error err = {0};
    if (ms_config_load(path, &c, &err) != MS_OK) fail_msg("%s", err.msg);
    return c;
}

ms_model_config mt_tiny_config(bool bert, double pdrop) {
    return (ms_model_config){.model_type = bert ? MS_MODEL_BERT : MS_MODEL_GPT2,
                             .n_layer = 4,
                             .n_head = 4,
                             .n_embd = 32,
                             .vocab_size = 256,
                             .n_positions = 16,
                             .layer_norm_epsilon = 1e-5,
                             .embd_pdrop = pdrop,
                             .resid_pdrop = pdrop,
                             .attn_pdrop = pdrop};
}

ms_train_opts mt_train_opts(int batch, int seq, int steps) {
    return (ms_train_opts){.batch = batch,
                           .seq = seq,
                           .steps = steps,
                           .warmup = 1,
                           .seed = 11,
                           .lr = 3e-3,
                           .min_lr = 3e-4,
                           .weight_decay = 0.1,
                           .clip = 0.5};
}

int mt_write_job_files(const char *dir, int n_embd, char *text, char *model) {
    snprintf(text, 300, "%s/text.txt", dir);
    snprintf(model, 300, "%s/model.json", dir);
    FILE *f = fopen(text, "w");
    for (int i = 0; f && i < 400; i++)
        fprintf(f,
                "And the earth was without form, and void; and darkness was upon the face of "
                "the deep. Verse %d.\n",
                i);
    if (!f || fclose(f) != 0) return -1;
    f = fopen(model, "w");
    if (!f) return -1;
    fprintf(f,
            "{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": %d, \"vocab_size\": 256, "
            "\"n_positions\": 32}\n",
            n_embd);
    return fclose(f) == 0 ? 0 : -1;
}

ms_status mt_repeated_text(const char *line, int seq, ms_text_data *d, ms_error *err) {
    size_t len = strlen(line), n = 64 * len;
    uint8_t *bytes = xmalloc(n);
    for (size_t i = 0; i < n; i++) bytes[i] = (uint8_t)line[i % len];
    ms_status st = ms_text_data_from_bytes("test-text", bytes, n, seq, 0.1, d, err);
    free(bytes);
    return st;
}

void mt_gather_state(mt_rank *r, ms_trainer *tr, mt_state *out, ms_error *err) {
    int n = ms_trainer_num_state(tr);
    MT_CHECK(r, n <= MT_MAX_STATE, "%d state tensors, room for %d", n, MT_MAX_STATE);
    if (r->ctx->rank == 0) out->n = n;
    for (int i = 0; i < n && i < MT_MAX_STATE; i++) {
        ms_state_tensor st;
        ms_trainer_state(tr, i, &st);
        ms_dtensor d = {.ndim = st.gshape.ndim, .mesh = st.mesh, .pl = st.pl};
        memcpy(d.gshape, st.gshape.d, sizeof d.gshape);
        int64_t shape[MS_MAX_DIMS];
        for (int k = 0; k < st.lndim; k++) shape[k] = st.lshape[k];
        MT_OK(r, ms_tensor_wrap(st.local, MS_F32, st.lndim, shape, &d.local, err), err);
        ms_tensor full = {0};
        MT_OK(r, ms_dtensor_full(&d, &full, err), err);
        ms_tensor_release(&d.local);
        if (r->ctx->rank == 0) {
            out->len[i] = ms_tensor_numel(&full);
            out->data[i] = xmalloc(sizeof(float) * (size_t)out->len[i]);
            memcpy(out->data[i], ms_tensor_f32(&full), sizeof(float) * (size_t)out->len[i]);
        }
        ms_tensor_release(&full);
    }
}

void mt_state_free(mt_state *s) {
    for (int i = 0; i < s->n && i < MT_MAX_STATE; i++) free(s->data[i]);
    memset(s, 0, sizeof *s);
}

void mt_state_check(const mt_state *got, const mt_state *want, double lr) {
    assert_int_equal(got->n, want->n);
    assert_true(got->n > 0);
    const char *kind[3] = {"parameter", "Adam m", "Adam v"};
    for (int i = 0; i < got->n; i++) {
        assert_int_equal(got->len[i], want->len[i]);
        double scale = 0, diff = 0;
        for (int64_t k = 0; k < want->len[i]; k++) {
            scale = fmax(scale, fabs(want->data[i][k]));
            diff = fmax(diff, fabs(got->data[i][k] - want->data[i][k]));
        }
        if (diff > 1e-4 * scale + 0.05 * lr)
            fail_msg("state tensor %d (%s of parameter %d): max difference %g at scale %g", i,
                     kind[i % 3], i / 3, diff, scale);
    }
}

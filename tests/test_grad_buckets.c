/* test_grad_buckets.c - gradient buckets (engine/graph/grad_buckets.h) with float32 and bf16
 * gradients, all-reduced and reduce-scattered (ZeRO), in buckets that hold every gradient of a
 * type or one each.
 *
 * Every bucketed result must equal, bit for bit, the same gradient reduced on its own with the
 * blocking call (the unbucketed path), and that in turn the reference computed here from the
 * inputs: bf16 widened, summed in fp32 in rank order and rounded once; float32 inputs are small
 * multiples of 1/8, so their sums are exact in any order. Polled (ms_gb_poll, as backward polls
 * for the host optimizer), each gradient is told once, its result already in dst, and a
 * second step reuses the buckets. Runs on the threads backend and under
 * mpirun, on a 1-d mesh of n ranks (its communicator is what the program binds).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/tensor.h"
#include "engine/core/xalloc.h"
#include "engine/dist/dmesh.h"
#include "engine/dist/placement.h"
#include "engine/graph/grad_buckets.h"
#include "tests/testkit.h"

/* One gradient: its type, size and rows; reduce-scattered when scatter. */
typedef struct grad_case {
    ms_comm_dtype dt;
    int64_t n, rows;
    bool scatter;
} grad_case;

/* Odd sizes, so that a float32 bucket follows a bf16 one ending off float alignment. In
 * buckets of 64 MiB: bf16, f32, bf16 (2), bf16 scattered (2), f32 scattered, f32: 6 buckets;
 * in buckets of 1 KiB, one each. */
static const grad_case grads[] = {
    {MS_COMM_BF16, 301, 1, false}, {MS_COMM_F32, 77, 1, false},   {MS_COMM_BF16, 4099, 1, false},
    {MS_COMM_BF16, 9, 1, false},   {MS_COMM_BF16, 35, 7, true},   {MS_COMM_BF16, 513, 19, true},
    {MS_COMM_F32, 60, 5, true},    {MS_COMM_F32, 2050, 1, false},
};
#define N_GRADS (int)(sizeof grads / sizeof grads[0])

/* Rank r's gradient g at i. bf16: one rank holds a large value among small ones (the sum loses
 * them when rounded at every step); float32: multiples of 1/8 below 16. */
static float input(int r, int n, int g, int64_t i) {
    size_t h = (size_t)r * 37 + (size_t)i * 11 + (size_t)g * 5;
    if (grads[g].dt == MS_COMM_F32) return (float)((int)(h % 101) - 50) * 0.125f;
    if ((size_t)r == ((size_t)i + (size_t)g) % (size_t)n) return 256.0f * (float)(1 + i % 3);
    return (h / 4 % 3 ? 1.0f : -1.0f) * (0.75f + 0.25f * (float)(h % 4));
}

/* The reduced value of gradient g at i, as stored (a bf16 value widened). */
static float reduced(int n, int g, int64_t i) {
    float acc = 0;
    for (int p = 0; p < n; p++) acc += input(p, n, g, i); /* exact inputs in bf16 and f32 */
    return grads[g].dt == MS_COMM_BF16 ? ms_f32_from_bf16(ms_bf16_from_f32(acc)) : acc;
}

static void put(void *buf, ms_comm_dtype dt, int64_t i, float v) {
    if (dt == MS_COMM_BF16)
        ((uint16_t *)buf)[i] = ms_bf16_from_f32(v);
    else
        ((float *)buf)[i] = v;
}

static float get(const void *buf, ms_comm_dtype dt, int64_t i) {
    return dt == MS_COMM_BF16 ? ms_f32_from_bf16(((const uint16_t *)buf)[i])
                              : ((const float *)buf)[i];
}

/* Gradient g's rows [row0, row0 + len) of member c when scattered over n. */
static void shard(int g, int n, int c, int64_t *first, int64_t *count) {
    int64_t row0, len, row = grads[g].n / grads[g].rows;
    ms_split_part(grads[g].rows, n, c, &row0, &len);
    *first = row0 * row;
    *count = grads[g].scatter ? len * row : grads[g].n;
    if (!grads[g].scatter) *first = 0;
}

/* The unbucketed reduction of gradient g: the blocking call on its own. */
static ms_status unbucketed(ms_comm *c, int g, const void *src, void *dst, ms_error *err) {
    const int n = ms_comm_size(c);
    if (!grads[g].scatter)
        return ms_all_reduce_dt(c, grads[g].dt, src, dst, (size_t)grads[g].n, MS_REDUCE_SUM, err);
    size_t counts[8];
    for (int p = 0; p < n; p++) {
        int64_t first, count;
        shard(g, n, p, &first, &count);
        counts[p] = (size_t)count;
    }
    return ms_reduce_scatter_dt(c, grads[g].dt, src, dst, counts, MS_REDUCE_SUM, err);
}

typedef struct bucket_run {
    int n;
    double bucket_mb;
    bool poll; /* two steps, each collecting the results by ms_gb_poll before ms_gb_finish */
} bucket_run;

static ms_status count_told(void *arg, int i, ms_error *err) {
    (void)err;
    ((int *)arg)[i]++;
    return MS_OK;
}

/* ms_gb_poll until every gradient was told (each once), the way backward polls between its
 * instructions; then dst holds the results, which ms_gb_finish leaves as they are. */
static void poll_all(mt_rank *r, ms_grad_buckets *gb, void **dst, void **seen) {
    ms_error err = {0};
    int told[N_GRADS] = {0}, ntold = 0;
    for (int spin = 0; ntold < N_GRADS && spin < 200000; spin++) {
        if (!MT_OK(r, ms_gb_poll(gb, count_told, told, &err), &err)) return;
        ntold = 0;
        for (int g = 0; g < N_GRADS; g++) ntold += told[g] > 0;
        if (ntold < N_GRADS) usleep(50);
    }
    for (int g = 0; g < N_GRADS; g++) {
        MT_CHECK(r, told[g] == 1, "gradient %d told %d times by ms_gb_poll", g, told[g]);
        size_t bytes = (size_t)grads[g].n * ms_comm_dtype_size(grads[g].dt);
        memcpy(seen[g], dst[g], bytes);
    }
}

/* ms_gb_finish of every gradient: each result equals the unbucketed one and the reference
 * (and, polled, what dst held before). */
static void check_finished(mt_rank *r, const bucket_run *run, int me, ms_grad_buckets *gb,
                           void **dst, void **want, void **seen) {
    const int n = run->n;
    ms_error err = {0};
    for (int g = 0; g < N_GRADS; g++) {
        if (!MT_OK(r, ms_gb_finish(gb, g, &err), &err)) continue;
        size_t bytes = (size_t)grads[g].n * ms_comm_dtype_size(grads[g].dt);
        MT_CHECK(r, !seen || !memcmp(seen[g], dst[g], bytes),
                 "gradient %d: ms_gb_finish changed what ms_gb_poll put in dst", g);
        int64_t first, count;
        shard(g, n, me, &first, &count);
        for (int64_t i = 0; i < count; i++) {
            float got = get(dst[g], grads[g].dt, i), ref = get(want[g], grads[g].dt, i);
            if (got != ref || ref != reduced(n, g, first + i)) {
                MT_CHECK(r, false,
                         "n=%d, buckets of %.4f MiB, gradient %d (%s%s) [%lld]: bucketed %g, "
                         "unbucketed %g, reference %g",
                         n, run->bucket_mb, g, ms_comm_dtype_name(grads[g].dt),
                         grads[g].scatter ? ", scattered" : "", (long long)i, (double)got,
                         (double)ref, (double)reduced(n, g, first + i));
                break;
            }
        }
    }
}

static void body_buckets(mt_rank *r, void *arg) {
    const bucket_run *run = arg;
    const int n = run->n;
    int ids[8];
    for (int i = 0; i < n; i++) ids[i] = i;
    ms_mesh mesh;
    ms_dmesh *dm;
    ms_error err = {0};
    if (!MT_OK(r, ms_mesh_init(&mesh, 1, &n, NULL, ids, &err), &err)) return;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    if (!ms_dmesh_is_member(dm)) goto out;
    ms_comm *c = dm->dim_comm[0];
    const int me = ms_comm_rank(c);
    ms_grad_buckets *gb = ms_gb_create(run->bucket_mb, 1);
    void *src[N_GRADS], *dst[N_GRADS], *want[N_GRADS], *seen[N_GRADS];
    for (int g = 0; g < N_GRADS; g++) {
        size_t bytes = (size_t)grads[g].n * ms_comm_dtype_size(grads[g].dt) + 4;
        src[g] = xcalloc(1, bytes), dst[g] = xcalloc(1, bytes), want[g] = xcalloc(1, bytes);
        seen[g] = xcalloc(1, bytes);
        for (int64_t i = 0; i < grads[g].n; i++) put(src[g], grads[g].dt, i, input(me, n, g, i));
        int i = ms_gb_add_dt(gb, g, grads[g].n, grads[g].scatter ? grads[g].rows : 0,
                             grads[g].scatter ? n : 0, 0, MS_REDUCE_SUM, grads[g].dt);
        MT_CHECK(r, i == g, "gradient %d got index %d", g, i);
        ms_gb_bind(gb, g, src[g], dst[g], c);
        MT_OK(r, unbucketed(c, g, src[g], want[g], &err), &err);
    }
    size_t bytes = ms_gb_storage_bytes(gb);
    MT_CHECK(r, bytes % sizeof(float) == 0 && ms_gb_storage_floats(gb) * sizeof(float) == bytes,
             "storage of %zu bytes is not whole floats", bytes);
    void *storage = xaligned_alloc(64, (bytes + 63) / 64 * 64);
    ms_gb_bind_storage(gb, storage);
    for (int step = 0; step < (run->poll ? 2 : 1); step++) {
        for (int g = 0; g < N_GRADS; g++)
            memset(dst[g], 0, (size_t)grads[g].n * ms_comm_dtype_size(grads[g].dt));
        for (int k = 0; k < N_GRADS; k++) MT_OK(r, ms_gb_after(gb, k, &err), &err);
        if (run->poll) poll_all(r, gb, dst, seen);
        check_finished(r, run, me, gb, dst, want, run->poll ? seen : NULL);
    }
    const int nb = run->bucket_mb > 1 ? 6 : N_GRADS;
    MT_CHECK(r, ms_gb_buckets(gb) == nb, "%d buckets; want %d (types and kinds never mix)",
             ms_gb_buckets(gb), nb);
    ms_gb_destroy(gb);
    free(storage);
    for (int g = 0; g < N_GRADS; g++) free(src[g]), free(dst[g]), free(want[g]), free(seen[g]);
out:
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void test_buckets(void **state) {
    (void)state;
    for (int n = 2; n <= 4; n++)
        for (int big = 0; big < 2; big++) {
            if (mt_backend() == MS_BACKEND_MPI && mt_mpi_world() < n) continue;
            for (int poll = 0; poll < 2; poll++) {
                bucket_run run = {n, big ? 64.0 : 0.001, poll};
                mt_run(n, body_buckets, &run);
            }
        }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_buckets),
};
MT_MAIN("grad_buckets", tests)

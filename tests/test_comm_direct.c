/* test_comm_direct.c - a communicator's direct path for device memory (ms_comm_adopt_direct).
 *
 * Where a communicator has a backend that moves device memory itself (NCCL on a GPU), the
 * collectives on device buffers run on it and nothing is staged through the host. Without a
 * GPU the same routing is checked with the fenced device and a stand-in direct backend that
 * removes the fence's tag and hands the host addresses to a second threads communicator with
 * the same members: a call on fenced memory that went the staged way would copy through the
 * host (and still be right), so each case checks both the values (against sums computed
 * here) and which way the call went (ms_comm_direct_calls, the observer's algorithm name).
 *
 * The ordering a GPU needs: a direct backend works on a stream of its own, so it must wait for
 * the kernels that wrote its buffers, and only for those. The fenced device's marks are counts
 * of the launches and copies queued on it (core/device.h); the stand-in backend waits for the
 * mark it is handed, as NCCL does, and records which work the mark covers and how much work
 * had been queued when it ran. Non-blocking calls run on the progress thread, held back until
 * the rank has launched more kernels, so a mark taken when the call runs instead of when it
 * was issued would cover those kernels and fail. A counting sync slot shows the device-wide
 * sync is gone from the direct path, and remains the fallback on a device without marks.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/comm/comm_impl.h"
#include "engine/core/device.h"
#include "engine/kernels/backend.h"
#include "tests/testkit.h"

enum { NRANKS = 4, N = 24 };

/* --- the stand-in direct backend: untag, then the inner communicator ---------------------- */

typedef struct untag_ctx {
    ms_comm *inner;   /* owned: threads communicator with the same members */
    ms_device *dev;   /* the rank's fenced device, whose marks the calls bring */
    atomic_bool held; /* a call waits while set (the rank launches kernels meanwhile) */
    /* What the last call found, written where it ran (the progress thread for non-blocking
     * calls), read after the call or its wait returned. */
    bool had_mark;
    uint64_t mark_work;   /* the work its mark covers */
    uint64_t work_at_run; /* the work queued on the device when it ran */
} untag_ctx;

#define U(p) ((void *)((p) ? (uintptr_t)(p) & ~MS_DEVICE_FENCE_TAG : (uintptr_t)0))

/* Where every slot that may be direct starts, as NCCL's enter(): waits while held, then for
 * the call's mark, and notes what it found. */
static ms_status u_enter(untag_ctx *u, const ms_comm_call *call, ms_error *err) {
    for (int64_t t0 = ms_now_ns(); atomic_load(&u->held);) {
        if (ms_now_ns() - t0 > 10000000000LL)
            return ms_fail(err, MS_ERR_TIMEOUT, "the rank never let the call run");
        sched_yield();
    }
    MS_CHECK(ms_comm_call_wait_ready(call, NULL, err)); /* as NCCL's stream would */
    u->had_mark = call->ready != NULL;
    u->mark_work = u->had_mark ? ms_device_fenced_mark_work(call->ready) : 0;
    u->work_at_run = u->dev ? atomic_load(&u->dev->work) : 0;
    return MS_OK;
}

static ms_status u_all_reduce(void *ctx, const void *send, void *recv, size_t count,
                              ms_reduce_op op, ms_comm_call *call, ms_error *err) {
    untag_ctx *u = ctx;
    MS_CHECK(u_enter(u, call, err));
    return ms_all_reduce_dt(u->inner, call->dtype, U(send), U(recv), count, op, err);
}
static ms_status u_reduce_scatter(void *ctx, const void *send, void *recv, const size_t *counts,
                                  ms_reduce_op op, ms_comm_call *call, ms_error *err) {
    untag_ctx *u = ctx;
    MS_CHECK(u_enter(u, call, err));
    return ms_reduce_scatter_dt(u->inner, call->dtype, U(send), U(recv), counts, op, err);
}
static ms_status u_all_gather(void *ctx, const void *send, void *recv, const size_t *counts,
                              ms_comm_call *call, ms_error *err) {
    untag_ctx *u = ctx;
    MS_CHECK(u_enter(u, call, err));
    return ms_all_gather_dt(u->inner, call->dtype, U(send), U(recv), counts, err);
}
static ms_status u_all_to_all(void *ctx, const void *send, const size_t *sc, const size_t *sd,
                              void *recv, const size_t *rc, const size_t *rd, ms_comm_call *call,
                              ms_error *err) {
    return ms_all_to_all_dt(((untag_ctx *)ctx)->inner, call->dtype, U(send), sc, sd, U(recv), rc,
                            rd, err);
}
static ms_status u_broadcast(void *ctx, void *buf, size_t count, int root, ms_comm_call *call,
                             ms_error *err) {
    return ms_broadcast_dt(((untag_ctx *)ctx)->inner, call->dtype, U(buf), count, root, err);
}
static ms_status u_barrier(void *ctx, ms_comm_call *call, ms_error *err) {
    (void)call;
    return ms_barrier(((untag_ctx *)ctx)->inner, err);
}
static void u_destroy(void *ctx) {
    ms_comm_destroy(((untag_ctx *)ctx)->inner);
    free(ctx);
}
/* Non-blocking calls run on the progress thread, as NCCL's do. */
static bool u_async_ok(void *ctx) {
    (void)ctx;
    return true;
}
static const ms_comm_backend_ops untag_ops = {.name = "untag",
                                              .all_reduce = u_all_reduce,
                                              .reduce_scatter = u_reduce_scatter,
                                              .all_gather = u_all_gather,
                                              .all_to_all = u_all_to_all,
                                              .broadcast = u_broadcast,
                                              .barrier = u_barrier,
                                              .destroy = u_destroy,
                                              .async_ok = u_async_ok};

/* The algorithm names the observer saw, per rank (the last call). */
static char seen_algo[NRANKS][16];

static void observe(void *user, const ms_comm_event *ev) {
    snprintf(seen_algo[*(int *)user], sizeof seen_algo[0], "%s", ev->algo ? ev->algo : "");
}

/* --- one rank ------------------------------------------------------------------------------- */

typedef struct rank_bufs {
    ms_device *dev;
    float *d_send, *d_recv; /* fenced */
    float host_send[NRANKS * N], host_recv[NRANKS * N], back[NRANKS * N];
} rank_bufs;

static void fill(float *x, int n, int rank) {
    for (int i = 0; i < n; i++) x[i] = (float)(rank * 1000 + i);
}

static void to_dev(mt_rank *R, rank_bufs *b, const float *h, float *d, size_t n) {
    ms_error err = {0};
    MT_OK(R, ms_device_copy(b->dev, d, h, n * sizeof(float), MS_COPY_HOST_TO_DEVICE, &err), &err);
}
static const float *from_dev(mt_rank *R, rank_bufs *b, const float *d, size_t n) {
    ms_error err = {0};
    MT_OK(R, ms_device_copy(b->dev, b->back, d, n * sizeof(float), MS_COPY_DEVICE_TO_HOST, &err),
          &err);
    return b->back;
}

/* got[i] == sum over ranks of (rank * 1000 + i) */
static void expect_sum(mt_rank *R, const char *what, const float *got, int n, int size) {
    for (int i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += (float)(r * 1000 + i);
        MT_CHECK(R, got[i] == want, "%s: element %d is %g, want %g", what, i, (double)got[i],
                 (double)want);
    }
}

/* got[r * N + i] == r * 1000 + i: every rank's block in rank order */
static void expect_blocks(mt_rank *R, const char *what, const float *got, int size) {
    for (int r = 0; r < size; r++)
        for (int i = 0; i < N; i++)
            MT_CHECK(R, got[r * N + i] == (float)(r * 1000 + i), "%s: block %d element %d is %g",
                     what, r, i, (double)got[r * N + i]);
}

/* The stand-in over inner; *ctx_out (may be NULL) receives its context, to read what it saw. */
static ms_comm *untag_over(ms_comm *inner, ms_device *dev, untag_ctx **ctx_out) {
    const int P = ms_comm_size(inner);
    int world[NRANKS];
    for (int r = 0; r < P; r++) world[r] = ms_comm_world_rank(inner, r);
    untag_ctx *uc = calloc(1, sizeof *uc);
    uc->inner = inner;
    uc->dev = dev;
    if (ctx_out) *ctx_out = uc;
    return ms_comm_wrap(&untag_ops, uc, ms_comm_rank(inner), P, world, "untag");
}

static void rank_main(mt_rank *R, void *arg) {
    (void)arg;
    ms_ctx *ctx = R->ctx;
    const int me = ctx->rank, P = ctx->world_size;
    ms_error err = {0};
    ms_comm *a = NULL, *inner = NULL;
    rank_bufs b = {0};
    if (!MT_OK(R, ms_comm_split(ctx->world, 0, me, "a", &a, &err), &err) ||
        !MT_OK(R, ms_comm_split(ctx->world, 0, me, "inner", &inner, &err), &err) ||
        !MT_OK(R, ms_device_fenced_create(&b.dev, &err), &err))
        return;
    ms_comm_set_device(a, b.dev);
    MT_CHECK(R, ms_comm_direct_name(a) == NULL, "a direct path before adopting one");
    if (!MT_OK(R, ms_comm_adopt_direct(a, untag_over(inner, b.dev, NULL), &err), &err)) return;
    MT_CHECK(R, !strcmp(ms_comm_direct_name(a), "untag"), "direct path %s", ms_comm_direct_name(a));
    int who = me;
    ms_comm_set_observer(a, observe, &who);
    const size_t bytes = sizeof(float) * NRANKS * N;
    MT_OK(R, ms_device_alloc(b.dev, bytes, (void **)&b.d_send, &err), &err);
    MT_OK(R, ms_device_alloc(b.dev, bytes, (void **)&b.d_recv, &err), &err);

    /* all-reduce on device memory: direct */
    fill(b.host_send, N, me);
    to_dev(R, &b, b.host_send, b.d_send, N);
    MT_OK(R, ms_all_reduce(a, b.d_send, b.d_recv, N, MS_REDUCE_SUM, &err), &err);
    expect_sum(R, "all-reduce (device)", from_dev(R, &b, b.d_recv, N), N, P);
    MT_CHECK(R, ms_comm_direct_calls(a) == 1, "direct calls %lld",
             (long long)ms_comm_direct_calls(a));
    MT_CHECK(R, !strcmp(seen_algo[me], "untag"), "observer saw '%s'", seen_algo[me]);

    /* on host memory, and a mix: a's own backend (the mix staged) */
    MT_OK(R, ms_all_reduce(a, b.host_send, b.host_recv, N, MS_REDUCE_SUM, &err), &err);
    expect_sum(R, "all-reduce (host)", b.host_recv, N, P);
    MT_CHECK(R, strcmp(seen_algo[me], "untag"), "a host all-reduce went the direct way");
    memset(b.host_recv, 0, sizeof b.host_recv);
    MT_OK(R, ms_all_reduce(a, b.d_send, b.host_recv, N, MS_REDUCE_SUM, &err), &err);
    expect_sum(R, "all-reduce (device to host)", b.host_recv, N, P);
    MT_CHECK(R, ms_comm_direct_calls(a) == 1, "a mixed call went the direct way");

    /* all-gather, reduce-scatter, all-to-all, broadcast on device memory: direct */
    size_t counts[NRANKS], displs[NRANKS];
    for (int r = 0; r < P; r++) counts[r] = N, displs[r] = (size_t)r * N;
    MT_OK(R, ms_all_gather(a, b.d_send, b.d_recv, counts, &err), &err);
    expect_blocks(R, "all-gather", from_dev(R, &b, b.d_recv, (size_t)P * N), P);
    for (int r = 0; r < P; r++) fill(b.host_send + r * N, N, me);
    to_dev(R, &b, b.host_send, b.d_send, (size_t)P * N);
    MT_OK(R, ms_reduce_scatter(a, b.d_send, b.d_recv, counts, MS_REDUCE_SUM, &err), &err);
    expect_sum(R, "reduce-scatter", from_dev(R, &b, b.d_recv, N), N, P);
    MT_OK(R, ms_all_to_all(a, b.d_send, counts, displs, b.d_recv, counts, displs, &err), &err);
    expect_blocks(R, "all-to-all", from_dev(R, &b, b.d_recv, (size_t)P * N), P);
    if (me == 1) to_dev(R, &b, b.host_send, b.d_recv, N);
    MT_OK(R, ms_broadcast(a, b.d_recv, N, 1, &err), &err);
    const float *g = from_dev(R, &b, b.d_recv, N);
    for (int i = 0; i < N; i++)
        MT_CHECK(R, g[i] == (float)(1000 + i), "broadcast: element %d is %g", i, (double)g[i]);
    MT_CHECK(R, ms_comm_direct_calls(a) == 5, "direct calls %lld, want 5",
             (long long)ms_comm_direct_calls(a));

    /* non-blocking on device memory: direct, and the values are there by the wait */
    fill(b.host_send, N, me);
    to_dev(R, &b, b.host_send, b.d_send, N);
    ms_comm_request *req = ms_iall_reduce(a, b.d_send, b.d_recv, N, MS_REDUCE_SUM, &err);
    MT_CHECK(R, req != NULL, "iall_reduce: %s", err.msg);
    MT_OK(R, ms_comm_wait(req, &err), &err);
    expect_sum(R, "iall-reduce", from_dev(R, &b, b.d_recv, N), N, P);
    MT_CHECK(R, ms_comm_direct_calls(a) == 6, "direct calls %lld, want 6",
             (long long)ms_comm_direct_calls(a));

    /* a second direct path is refused (and freed) */
    ms_comm *again = NULL;
    MT_OK(R, ms_comm_split(ctx->world, 0, me, "again", &again, &err), &err);
    ms_error e2 = {0};
    MT_CHECK(R, ms_comm_adopt_direct(a, again, &e2) == MS_ERR_INVALID, "a second path adopted");
    MT_CHECK(R, strstr(e2.msg, "same members") != NULL, "message: %s", e2.msg);

    ms_device_free(b.dev, b.d_send, bytes), ms_device_free(b.dev, b.d_recv, bytes);
    ms_comm_destroy(a); /* and the direct path with its inner communicator */
    ms_device_destroy(b.dev);
}

static void collectives_on_device_memory_take_the_direct_path(void **state) {
    (void)state;
    mt_run(NRANKS, rank_main, NULL);
}

/* --- ordering: a mark per call, not a device-wide sync --------------------------------------- */

/* Each rank's device, its slots (the fenced ones with a counting sync, with or without marks)
 * and how often that sync ran. */
static _Atomic(ms_device *) rank_dev[NRANKS]; /* read by every rank's sync */
static ms_device_ops rank_ops[NRANKS];
static atomic_int rank_syncs[NRANKS];

static ms_status counting_sync(ms_device *dev, ms_error *err) {
    (void)err;
    for (int r = 0; r < NRANKS; r++)
        if (atomic_load(&rank_dev[r]) == dev) atomic_fetch_add(&rank_syncs[r], 1);
    return MS_OK;
}

static void install_slots(ms_device *dev, int me, bool marks) {
    rank_ops[me] = *dev->ops;
    rank_ops[me].sync = counting_sync;
    if (!marks) {
        rank_ops[me].mark_record = NULL;
        rank_ops[me].mark_wait = NULL;
        rank_ops[me].mark_release = NULL;
    }
    dev->ops = &rank_ops[me];
    atomic_store(&rank_dev[me], dev);
    atomic_store(&rank_syncs[me], 0);
}

/* Every element of the n floats at d equals want. */
static void expect_all(mt_rank *R, rank_bufs *b, const char *what, const float *d, float want) {
    const float *got = from_dev(R, b, d, N);
    for (int i = 0; i < N; i++)
        MT_CHECK(R, got[i] == want, "%s: element %d is %g, want %g", what, i, (double)got[i],
                 (double)want);
}

/* What the backend found when the call ran: with marks, a mark covering exactly `before`
 * units of work (everything queued before the call, nothing after); without, none. */
static void expect_mark(mt_rank *R, const untag_ctx *u, bool marks, uint64_t before,
                        const char *what) {
    if (!marks) {
        MT_CHECK(R, !u->had_mark, "%s: a mark from a device without marks", what);
        return;
    }
    MT_CHECK(R, u->had_mark, "%s: the direct backend got no mark", what);
    MT_CHECK(R, u->mark_work == before, "%s: the mark covers %llu units of work, want %llu", what,
             (unsigned long long)u->mark_work, (unsigned long long)before);
}

static void ordering_rank(mt_rank *R, void *arg) {
    const bool marks = *(const bool *)arg;
    ms_ctx *ctx = R->ctx;
    const int me = ctx->rank, P = ctx->world_size;
    ms_error err = {0};
    ms_comm *a = NULL, *inner = NULL;
    ms_kctx *kc = NULL;
    untag_ctx *u = NULL;
    rank_bufs b = {0};
    float *d_other = NULL;
    if (!MT_OK(R, ms_comm_split(ctx->world, 0, me, "a", &a, &err), &err) ||
        !MT_OK(R, ms_comm_split(ctx->world, 0, me, "inner", &inner, &err), &err) ||
        !MT_OK(R, ms_device_fenced_create(&b.dev, &err), &err) ||
        !MT_OK(R, ms_kctx_create(b.dev, &kc, &err), &err))
        return;
    install_slots(b.dev, me, marks);
    ms_comm_set_device(a, b.dev);
    MT_OK(R, ms_comm_adopt_direct(a, untag_over(inner, b.dev, &u), &err), &err);
    const size_t bytes = sizeof(float) * N;
    MT_OK(R, ms_device_alloc(b.dev, bytes * P, (void **)&b.d_send, &err), &err);
    MT_OK(R, ms_device_alloc(b.dev, bytes * P, (void **)&b.d_recv, &err), &err);
    MT_OK(R, ms_device_alloc(b.dev, bytes, (void **)&d_other, &err), &err);
    size_t counts[NRANKS];
    for (int r = 0; r < P; r++) counts[r] = N;

    /* blocking: a kernel writes the send buffer, then the call */
    MT_OK(R, MS_CALL_K(kc, fill, b.d_send, (float)(me + 1), N, &err), &err);
    uint64_t before = atomic_load(&b.dev->work);
    MT_OK(R, ms_all_reduce(a, b.d_send, b.d_recv, N, MS_REDUCE_SUM, &err), &err);
    expect_all(R, &b, "all-reduce", b.d_recv, (float)(P * (P + 1) / 2));
    expect_mark(R, u, marks, before, "all-reduce");
    before = atomic_load(&b.dev->work);
    MT_OK(R, ms_all_gather(a, b.d_send, b.d_recv, counts, &err), &err);
    expect_all(R, &b, "all-gather (rank 0's block)", b.d_recv, 1.0f);
    expect_mark(R, u, marks, before, "all-gather");

    /* non-blocking: held on the progress thread until three more kernels are launched */
    MT_OK(R, MS_CALL_K(kc, fill, b.d_send, (float)(2 * (me + 1)), N, &err), &err);
    before = atomic_load(&b.dev->work);
    atomic_store(&u->held, true);
    ms_comm_request *req = ms_iall_reduce(a, b.d_send, b.d_recv, N, MS_REDUCE_SUM, &err);
    MT_CHECK(R, req != NULL, "iall_reduce: %s", err.msg);
    for (int i = 0; i < 3; i++) MT_OK(R, MS_CALL_K(kc, fill, d_other, (float)i, N, &err), &err);
    const uint64_t after = atomic_load(&b.dev->work);
    atomic_store(&u->held, false);
    MT_OK(R, ms_comm_wait(req, &err), &err);
    expect_all(R, &b, "iall-reduce", b.d_recv, (float)(P * (P + 1)));
    expect_mark(R, u, marks, before, "iall-reduce");
    MT_CHECK(R, u->work_at_run >= after,
             "the iall-reduce ran with %llu units of work queued, before the %llu after it",
             (unsigned long long)u->work_at_run, (unsigned long long)after);

    /* a non-blocking reduce-scatter the same way; its send buffer is written by P kernels */
    for (int r = 0; r < P; r++)
        MT_OK(R, MS_CALL_K(kc, fill, b.d_send + r * N, (float)(r + 1), N, &err), &err);
    before = atomic_load(&b.dev->work);
    atomic_store(&u->held, true);
    req = ms_ireduce_scatter(a, b.d_send, b.d_recv, counts, MS_REDUCE_SUM, &err);
    MT_CHECK(R, req != NULL, "ireduce_scatter: %s", err.msg);
    MT_OK(R, MS_CALL_K(kc, fill, d_other, -1.0f, N, &err), &err); /* after: not covered */
    const uint64_t after_rs = atomic_load(&b.dev->work);
    atomic_store(&u->held, false);
    MT_OK(R, ms_comm_wait(req, &err), &err);
    expect_all(R, &b, "ireduce-scatter", b.d_recv, (float)(P * (me + 1)));
    expect_mark(R, u, marks, before, "ireduce-scatter");
    MT_CHECK(R, u->work_at_run >= after_rs, "the ireduce-scatter ran before the kernel after it");

    /* the device-wide sync: never with marks, once per direct call without */
    MT_CHECK(R, ms_comm_direct_calls(a) == 4, "direct calls %lld, want 4",
             (long long)ms_comm_direct_calls(a));
    MT_CHECK(R, atomic_load(&rank_syncs[me]) == (marks ? 0 : 4), "device syncs %d, want %d",
             atomic_load(&rank_syncs[me]), marks ? 0 : 4);

    ms_device_free(b.dev, b.d_send, bytes * P), ms_device_free(b.dev, b.d_recv, bytes * P);
    ms_device_free(b.dev, d_other, bytes);
    ms_comm_destroy(a);
    ms_kctx_destroy(kc);
    atomic_store(&rank_dev[me], NULL);
    ms_device_destroy(b.dev);
}

static void direct_calls_wait_for_a_mark_of_the_work_issued_before_them(void **state) {
    (void)state;
    bool marks = true;
    mt_run(NRANKS, ordering_rank, &marks);
}

static void a_device_without_marks_is_synced_before_direct_calls(void **state) {
    (void)state;
    bool marks = false;
    mt_run(NRANKS, ordering_rank, &marks);
}

/* The fenced device refuses to wait for another device's mark (a caller's bug on a GPU). */
static void a_mark_is_waited_for_on_the_device_that_recorded_it(void **state) {
    (void)state;
    ms_device *one = NULL, *two = NULL;
    ms_device_mark *m = NULL;
    ms_error err = {0};
    assert_int_equal(ms_device_fenced_create(&one, &err), MS_OK);
    assert_int_equal(ms_device_fenced_create(&two, &err), MS_OK);
    assert_true(ms_device_has_marks(one));
    assert_int_equal(ms_device_zero(one, NULL, 0, &err), MS_OK); /* one unit of work */
    assert_int_equal(ms_device_mark_record(one, &m, &err), MS_OK);
    assert_non_null(m);
    assert_int_equal(ms_device_fenced_mark_work(m), 1);
    assert_int_equal(ms_device_mark_wait(one, m, NULL, &err), MS_OK);
    assert_int_equal(ms_device_mark_wait(two, m, NULL, &err), MS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "another device"));
    ms_device_mark_release(one, m);
    ms_device_destroy(one), ms_device_destroy(two);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(a_mark_is_waited_for_on_the_device_that_recorded_it),
    cmocka_unit_test(collectives_on_device_memory_take_the_direct_path),
    cmocka_unit_test(direct_calls_wait_for_a_mark_of_the_work_issued_before_them),
    cmocka_unit_test(a_device_without_marks_is_synced_before_direct_calls),
};
MT_MAIN("test_comm_direct", tests)

/* test_cupti.c - GPU activity tracing: the NCCL profiler plugin's conversion and bookkeeping
 * (plain C, runs on every machine that builds CUDA support), then the CUPTI collector on a
 * real GPU (memcpy and memset with their bytes, timestamps inside the test's own wall-clock
 * window, and the external correlation ids pushed around the calls).
 *
 * Exit codes: 0 pass, 1 fail, 77 skip (no usable GPU, or CUPTI refused: the reason is
 * printed). The plain-C part runs before the skip, so a skip still means it passed. */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "engine/core/device.h"
#include "profiler/cupti.h"
#include "profiler/nccl_profiler.h"
#include "profiler/record/recorder.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* --- NCCL plugin: the pure conversion ------------------------------------------------- */

static ms_nccl_record coll_record(const char *func, const char *type, uint64_t count) {
    ms_nccl_record r;
    memset(&r, 0, sizeof r);
    r.kind = MS_NCCL_COLL;
    r.rank = 1;
    r.nranks = 4;
    r.peer = 2;
    r.seq = 41;
    r.count = count;
    r.t_start_ns = 1000;
    r.t_enqueued_ns = 1500;
    r.t_end_ns = 9000;
    r.timing = MS_NCCL_T_HOST;
    snprintf(r.func, sizeof r.func, "%s", func);
    snprintf(r.datatype, sizeof r.datatype, "%s", type);
    snprintf(r.algo, sizeof r.algo, "RING");
    snprintf(r.proto, sizeof r.proto, "LL128");
    return r;
}

static void test_nccl_conversion(void) {
    ms_event e;
    ms_nccl_record r = coll_record("AllReduce", "ncclFloat32", 1000);
    CHECK(ms_nccl_record_to_event(&r, &e), "AllReduce converts");
    CHECK(e.kind == MS_EV_COLL && e.u.coll.coll == MS_COLL_ALL_REDUCE, "kind %d coll %d", e.kind,
          e.u.coll.coll);
    CHECK(e.u.coll.bytes == 4000, "all-reduce bytes = count * 4, got %" PRIu64, e.u.coll.bytes);
    CHECK(e.u.coll.seq == 41 && e.u.coll.group_size == 4 && e.u.coll.group_rank == 1,
          "seq %" PRId64 " size %d rank %d", e.u.coll.seq, e.u.coll.group_size,
          e.u.coll.group_rank);
    CHECK(!strcmp(e.u.coll.algo, "ring/ll128"), "algo '%s'", e.u.coll.algo);
    CHECK(e.u.coll.group == -1 && e.u.coll.mesh_dim == -1, "group %d dim %d", e.u.coll.group,
          e.u.coll.mesh_dim);
    CHECK(e.t0_ns == 1000 && e.t1_ns == 9000, "host timing [%" PRId64 ", %" PRId64 "]", e.t0_ns,
          e.t1_ns);

    /* nccl-tests sizes: all-gather counts the whole gathered buffer, reduce-scatter the
     * whole input, all-to-all everything sent; NCCL's count is per rank for all three. */
    r = coll_record("AllGather", "ncclBfloat16", 100);
    CHECK(ms_nccl_record_to_event(&r, &e) && e.u.coll.bytes == 100 * 2 * 4,
          "all-gather bytes %" PRIu64, e.u.coll.bytes);
    r = coll_record("ReduceScatter", "ncclFloat64", 10);
    CHECK(ms_nccl_record_to_event(&r, &e) && e.u.coll.bytes == 10 * 8 * 4,
          "reduce-scatter bytes %" PRIu64, e.u.coll.bytes);
    r = coll_record("AlltoAll", "ncclInt8", 7);
    CHECK(ms_nccl_record_to_event(&r, &e) && e.u.coll.coll == MS_COLL_ALL_TO_ALL &&
              e.u.coll.bytes == 7 * 4,
          "all-to-all bytes %" PRIu64, e.u.coll.bytes);
    r = coll_record("Broadcast", "ncclFloat16", 8);
    CHECK(ms_nccl_record_to_event(&r, &e) && e.u.coll.root == 2 && e.u.coll.bytes == 16,
          "broadcast root %d bytes %" PRIu64, e.u.coll.root, e.u.coll.bytes);
    r = coll_record("AllReduce", "Unknown", 8); /* NCCL names ncclUint8 "Unknown" */
    CHECK(ms_nccl_record_to_event(&r, &e) && e.u.coll.bytes == 0, "unknown type: 0 bytes");
    r = coll_record("Reduce", "ncclFloat32", 8);
    CHECK(!ms_nccl_record_to_event(&r, &e), "Reduce has no ms_coll_kind: no event");

    /* Timing: enqueue-only spans stop at the enqueue; GPU spans take the GPU's duration,
     * placed at the observed end, and never start before the host start. */
    r = coll_record("AllReduce", "ncclFloat32", 1);
    r.timing = MS_NCCL_T_ENQUEUE;
    CHECK(ms_nccl_record_to_event(&r, &e) && e.t0_ns == 1000 && e.t1_ns == 1500,
          "enqueue timing [%" PRId64 ", %" PRId64 "]", e.t0_ns, e.t1_ns);
    r.timing = MS_NCCL_T_GPU;
    r.gpu_start_ns = 50000;
    r.gpu_end_ns = 53000;
    CHECK(ms_nccl_record_to_event(&r, &e) && e.t0_ns == 6000 && e.t1_ns == 9000,
          "gpu timing [%" PRId64 ", %" PRId64 "]", e.t0_ns, e.t1_ns);
    r.gpu_end_ns = 60000; /* GPU span longer than the host saw: clamp to the host start */
    CHECK(ms_nccl_record_to_event(&r, &e) && e.t0_ns == 1000 && e.t1_ns == 9000,
          "gpu timing clamped [%" PRId64 ", %" PRId64 "]", e.t0_ns, e.t1_ns);

    /* Point to point: sends are events on the {sender, receiver} pair; receives and proxy
     * operations are records only. */
    r = coll_record("Send", "ncclFloat32", 256);
    r.kind = MS_NCCL_P2P;
    r.is_send = 1;
    r.peer = 3;
    CHECK(ms_nccl_record_to_event(&r, &e) && e.u.coll.coll == MS_COLL_P2P &&
              e.u.coll.group_size == 2 && e.u.coll.group_rank == 0 && e.u.coll.bytes == 1024,
          "send: coll %d size %d rank %d bytes %" PRIu64, e.u.coll.coll, e.u.coll.group_size,
          e.u.coll.group_rank, e.u.coll.bytes);
    r.is_send = 0;
    snprintf(r.func, sizeof r.func, "Recv");
    CHECK(!ms_nccl_record_to_event(&r, &e), "recv: no event");
    r.kind = MS_NCCL_PROXY_OP;
    CHECK(!ms_nccl_record_to_event(&r, &e), "proxy op: no event");

    CHECK(ms_nccl_type_size("ncclFloat8e4m3") == 1 && ms_nccl_type_size(NULL) == 0, "type sizes");
    CHECK(ms_nccl_coll_kind("SendRecv") == MS_COLL_P2P && ms_nccl_coll_kind("Gather") == -1,
          "function kinds");
}

/* --- NCCL plugin: the call sequence NCCL makes ------------------------------------------ */

static size_t drain_all(ms_nccl_record *out, size_t max) {
    return ms_nccl_profiler_drain_records(out, max);
}

static void test_nccl_plugin(void) {
    const ms_nccl_profiler_v5 *p = &ncclProfiler_v5;
    CHECK(p->name && !strcmp(p->name, "meshscope"), "plugin name");
    CHECK(p->init && p->startEvent && p->stopEvent && p->recordEventState && p->finalize,
          "every v5 entry point is set");
    ms_nccl_record recs[16];
    drain_all(recs, 16);

    setenv("MS_NCCL_PROFILER_PROXY", "1", 1);
    void *ctx = NULL;
    int mask = 0;
    CHECK(p->init(&ctx, 0xC0FFEE, &mask, "world", 1, 4, 2, NULL) == 0 && ctx, "init");
    CHECK((mask & MS_NCCL_PROFILE_COLL) && (mask & MS_NCCL_PROFILE_KERNEL_CH) &&
              (mask & MS_NCCL_PROFILE_PROXY_OP),
          "activation mask 0x%x", mask);

    /* A collective on two channels: nothing is reported until both channels have ended. */
    ms_nccl_event_descr_v5 d;
    memset(&d, 0, sizeof d);
    d.type = MS_NCCL_PROFILE_COLL;
    d.rank = 2;
    d.coll.seqNumber = 7;
    d.coll.func = "AllGather";
    d.coll.count = 1024;
    d.coll.datatype = "ncclFloat32";
    d.coll.nChannels = 2;
    d.coll.algo = "RING";
    d.coll.proto = "Simple";
    void *coll = NULL, *ch[3] = {NULL, NULL, NULL}, *proxy = NULL;
    p->startEvent(ctx, &coll, &d);
    CHECK(coll != NULL, "collective handle");
    p->stopEvent(coll); /* enqueued */
    CHECK(drain_all(recs, 16) == 0, "no record before the channels end");

    for (int i = 0; i < 3; i++) {
        memset(&d, 0, sizeof d);
        d.type = MS_NCCL_PROFILE_KERNEL_CH;
        d.parentObj = coll;
        d.kernelCh.channelId = (uint8_t)i;
        d.kernelCh.pTimer = 1000000 + (uint64_t)i * 100;
        p->startEvent(ctx, &ch[i], &d);
    }
    CHECK(ch[0] && ch[1] && !ch[2], "a channel beyond the announced two is not tracked");

    memset(&d, 0, sizeof d);
    d.type = MS_NCCL_PROFILE_PROXY_OP;
    d.parentObj = coll;
    d.proxyOp.pid = getpid();
    d.proxyOp.channelId = 1;
    d.proxyOp.peer = 3;
    d.proxyOp.nSteps = 8;
    d.proxyOp.chunkSize = 1 << 16;
    d.proxyOp.isSend = 1;
    p->startEvent(ctx, &proxy, &d);
    CHECK(proxy != NULL, "proxy handle");
    p->stopEvent(proxy);

    ms_nccl_state_args_v5 a = {.kernelCh = {.pTimer = 1500000}};
    p->recordEventState(ch[0], MS_NCCL_STATE_KERNEL_CH_STOP, &a);
    p->stopEvent(ch[0]);
    size_t n = drain_all(recs, 16);
    CHECK(n == 1 && recs[0].kind == MS_NCCL_PROXY_OP, "only the proxy op so far (%zu)", n);
    if (n == 1) {
        CHECK(recs[0].peer == 3 && recs[0].is_send && recs[0].n_steps == 8 && recs[0].seq == 7 &&
                  !strcmp(recs[0].func, "AllGather") && !recs[0].remote,
              "proxy record: peer %d send %d steps %d seq %" PRIu64 " func %s", recs[0].peer,
              recs[0].is_send, recs[0].n_steps, recs[0].seq, recs[0].func);
    }
    a.kernelCh.pTimer = 1600100;
    p->recordEventState(ch[1], MS_NCCL_STATE_KERNEL_CH_STOP, &a);
    p->stopEvent(ch[1]);
    n = drain_all(recs, 16);
    CHECK(n == 1, "the collective after its last channel (%zu)", n);
    if (n == 1) {
        const ms_nccl_record *r = &recs[0];
        CHECK(r->kind == MS_NCCL_COLL && r->timing == MS_NCCL_T_GPU && r->seq == 7 &&
                  r->comm_id == 0xC0FFEE && r->rank == 2 && r->nranks == 4,
              "kind %d timing %d seq %" PRIu64, r->kind, r->timing, r->seq);
        CHECK(r->gpu_start_ns == 1000000 && r->gpu_end_ns == 1600100,
              "gpu [%" PRIu64 ", %" PRIu64 "]", r->gpu_start_ns, r->gpu_end_ns);
        CHECK(r->t_start_ns <= r->t_enqueued_ns && r->t_enqueued_ns <= r->t_end_ns,
              "host times ordered");
        ms_event e;
        CHECK(ms_nccl_record_to_event(r, &e) && e.u.coll.bytes == 1024 * 4 * 4 &&
                  !strcmp(e.u.coll.algo, "ring/simple"),
              "event bytes %" PRIu64 " algo %s", e.u.coll.bytes, e.u.coll.algo);
    }

    /* A send without channel events is reported at its stop; a receive is a record only. */
    memset(&d, 0, sizeof d);
    d.type = MS_NCCL_PROFILE_P2P;
    d.p2p.func = "Send";
    d.p2p.count = 64;
    d.p2p.datatype = "ncclFloat32";
    d.p2p.peer = 0;
    void *send = NULL, *recv = NULL;
    p->startEvent(ctx, &send, &d);
    p->stopEvent(send);
    d.p2p.func = "Recv";
    p->startEvent(ctx, &recv, &d);
    p->stopEvent(recv);
    ms_event ev[4];
    n = ms_nccl_profiler_drain(ev, 4);
    CHECK(n == 1 && ev[0].u.coll.coll == MS_COLL_P2P && ev[0].u.coll.bytes == 256,
          "one event for the send (%zu)", n);

    /* A collective whose channels never come is finished by finalize. */
    memset(&d, 0, sizeof d);
    d.type = MS_NCCL_PROFILE_COLL;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclFloat32";
    d.coll.count = 1;
    d.coll.nChannels = 4;
    void *orphan = NULL;
    p->startEvent(ctx, &orphan, &d);
    p->stopEvent(orphan);
    ms_nccl_profiler_stats st;
    ms_nccl_profiler_get_stats(&st);
    const uint64_t early = st.flushed_early;
    p->finalize(ctx);
    n = drain_all(recs, 16);
    CHECK(n == 1 && recs[0].timing == MS_NCCL_T_ENQUEUE, "orphan flushed at finalize (%zu)", n);
    ms_nccl_profiler_get_stats(&st);
    CHECK(st.flushed_early == early + 1 && st.comms == 0 && st.dropped_full == 0,
          "stats: early %" PRIu64 " comms %" PRIu64, st.flushed_early, st.comms);
}

/* --- CUPTI on a GPU ----------------------------------------------------------------------- */

/* The first op event of this kind whose name contains name_part and, unless corr is 0,
 * whose correlation id is corr. */
static const ms_event *find_op(const ms_event *ev, size_t n, const char *opname,
                               const char *name_part, uint64_t corr) {
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == MS_EV_OP && !strcmp(ev[i].u.op.opname, opname) &&
            strstr(ev[i].u.op.name, name_part) && (!corr || ev[i].u.op.corr == corr))
            return &ev[i];
    return NULL;
}

static int test_cupti_gpu(void) {
    ms_error err = {0};
    ms_device *gpu = NULL;
    if (ms_device_cuda_create(0, &gpu, &err) != MS_OK) {
        printf("SKIP: %s\n", err.msg);
        return 77;
    }
    ms_device_destroy(gpu);
    ms_recorder *rec = NULL;
    if (ms_recorder_create(0, 1 << 16, &rec, &err) != MS_OK) {
        fprintf(stderr, "recorder: %s\n", err.msg);
        return 1;
    }
    ms_status st = ms_cupti_start(rec, 50, &err);
    if (st == MS_ERR_UNSUPPORTED) {
        printf("SKIP: %s\n", err.msg);
        ms_recorder_destroy(rec);
        return 77;
    }
    if (st != MS_OK) {
        fprintf(stderr, "cupti start: %s\n", err.msg);
        ms_recorder_destroy(rec);
        return 1;
    }

    enum { BYTES = 8 << 20 };
    const int64_t w0 = ms_now_ns();
    void *dev = NULL, *host = NULL;
    if (cudaMalloc(&dev, BYTES) != cudaSuccess || cudaMallocHost(&host, BYTES) != cudaSuccess) {
        fprintf(stderr, "cuda allocation failed\n");
        ms_cupti_stop();
        return 1;
    }
    memset(host, 1, BYTES);
    ms_cupti_push_correlation(4242);
    cudaError_t e1 = cudaMemcpy(dev, host, BYTES, cudaMemcpyHostToDevice);
    ms_cupti_pop_correlation();
    ms_cupti_push_correlation(4343);
    cudaError_t e2 = cudaMemset(dev, 0, BYTES);
    ms_cupti_pop_correlation();
    cudaError_t e3 = cudaDeviceSynchronize();
    CHECK(e1 == cudaSuccess && e2 == cudaSuccess && e3 == cudaSuccess, "cuda calls: %s %s %s",
          cudaGetErrorString(e1), cudaGetErrorString(e2), cudaGetErrorString(e3));

    /* Live path: everything is complete, so a default flush must deliver the memcpy. */
    CHECK(ms_cupti_flush(&err) == MS_OK, "flush: %s", err.msg);
    enum { MAX_EV = 1 << 16 };
    ms_event *ev = calloc(MAX_EV, sizeof *ev);
    uint64_t cursor = 0, missed = 0;
    size_t n = ms_recorder_read(rec, &cursor, ev, MAX_EV, &missed);
    CHECK(find_op(ev, n, "cuda_memcpy", "HtoD", 0) != NULL, "memcpy visible after a live flush");

    cudaFree(dev);
    cudaFreeHost(host);
    const int64_t w1 = ms_now_ns();
    ms_cupti_stop();
    n += ms_recorder_read(rec, &cursor, ev + n, MAX_EV - n, &missed);
    ms_cupti_stats cs;
    ms_cupti_get_stats(&cs);
    printf("cupti: %zu events (%" PRIu64 " records, %" PRIu64 " buffers, %" PRIu64
           " dropped, %" PRIu64 " incomplete), clock offset %" PRId64 " +- %" PRId64 " ns\n",
           n, cs.records, cs.buffers, cs.cupti_dropped, cs.incomplete, cs.clock_offset_ns,
           cs.clock_uncertainty_ns);

    /* GPU clocks are mapped onto ours within the measured uncertainty; allow a little more
     * for CUPTI's own normalisation of device timestamps. */
    const int64_t slack = cs.clock_uncertainty_ns + 200000;
    const ms_event *cp = find_op(ev, n, "cuda_memcpy", "HtoD", 4242);
    CHECK(cp != NULL, "memcpy HtoD with correlation 4242");
    if (cp) {
        CHECK(cp->u.op.gpu == MS_GPU_MEMCPY, "memcpy kind %d", (int)cp->u.op.gpu);
        CHECK(cp->u.op.bytes == (double)BYTES, "memcpy bytes %.0f", cp->u.op.bytes);
        CHECK(cp->t0_ns <= cp->t1_ns && cp->t0_ns >= w0 - slack && cp->t1_ns <= w1 + slack,
              "memcpy [%" PRId64 ", %" PRId64 "] outside the test window [%" PRId64 ", %" PRId64
              "]",
              cp->t0_ns, cp->t1_ns, w0, w1);
    }
    const ms_event *ms = find_op(ev, n, "cuda_memset", "memset", 4343);
    CHECK(ms != NULL, "memset with correlation 4343");
    if (ms) {
        CHECK(ms->u.op.bytes == (double)BYTES, "memset bytes %.0f", ms->u.op.bytes);
        CHECK(ms->t0_ns <= ms->t1_ns && ms->t0_ns >= w0 - slack && ms->t1_ns <= w1 + slack,
              "memset [%" PRId64 ", %" PRId64 "] outside the test window", ms->t0_ns, ms->t1_ns);
        if (cp) CHECK(cp->t1_ns <= ms->t0_ns + slack, "memcpy ends before the memset starts");
    }
    CHECK(find_op(ev, n, "cuda_runtime", "", 4242) != NULL,
          "the runtime call that launched the memcpy carries correlation 4242");
    CHECK(find_op(ev, n, "cuda_runtime", "", 4343) != NULL,
          "the runtime call that launched the memset carries correlation 4343");

    /* After stop nothing writes the recorder any more. */
    const uint64_t pushed = ms_recorder_pushed(rec);
    ms_cupti_flush(&err);
    CHECK(ms_recorder_pushed(rec) == pushed, "no events after stop");
    free(ev);
    ms_recorder_destroy(rec);
    return failures ? 1 : 0;
}

int main(void) {
    test_nccl_conversion();
    test_nccl_plugin();
    printf("%s: nccl profiler plugin conversion and bookkeeping\n", failures ? "FAIL" : "ok");
    if (failures) return 1;
    int rc = test_cupti_gpu();
    if (rc == 0) printf("ok: cupti collector on a GPU\n");
    return rc;
}

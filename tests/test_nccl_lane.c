/* test_nccl_lane.c - NCCL's view in a traced job, on the host (no GPU, no NCCL run): where the
 * plugin is found (next to the executable, ../lib, the user's NCCL_PROFILER_PLUGIN, missing:
 * one message and the run goes on), the real plugin library loaded the way NCCL loads it and
 * fed NCCL's v5 call sequence by hand, its records drained into a rank's ring, linked to
 * meshscope's collectives (threads and MPI layouts, ambiguity, unlinked records), GPU spans
 * placed against the truth, and the trace file: the "NCCL (plugin)" lane with its args,
 * accepted by the validator and read back field for field; then the tracer end to end on two
 * thread ranks whose device claims to be a GPU (start, drain at the gathers, link, file). */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "job/tracer.h"
#include "profiler/nccl_lane.h"
#include "tests/testkit.h"
#include "traces/trace_check.h"
#include "traces/trace_read.h"
#include "traces/trace_write.h"

/* --- finding the plugin ------------------------------------------------------------------ */

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
}

static void resolve_paths(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_nccl_lane_XXXXXX", p[512], exe[512], why[512], want[600];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/bin", dir), mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/lib", dir), mkdir(p, 0700);
    snprintf(exe, sizeof exe, "%s/bin/meshscope", dir);
    bool env = true;

    /* Nowhere: false, and the reason names the file and the fix. */
    assert_false(ms_nccl_plugin_resolve(NULL, exe, p, sizeof p, &env, why, sizeof why));
    assert_false(env);
    assert_non_null(strstr(why, MS_NCCL_PLUGIN_FILE));
    assert_non_null(strstr(why, "NCCL_PROFILER_PLUGIN"));

    /* Installed layout: lib/ beside bin/. */
    snprintf(want, sizeof want, "%s/lib/" MS_NCCL_PLUGIN_FILE, dir);
    touch(want);
    assert_true(ms_nccl_plugin_resolve("", exe, p, sizeof p, &env, why, sizeof why));
    snprintf(want, sizeof want, "%s/bin/../lib/" MS_NCCL_PLUGIN_FILE, dir);
    assert_string_equal(p, want);

    /* Next to the executable (the build directory) comes first. */
    snprintf(want, sizeof want, "%s/bin/" MS_NCCL_PLUGIN_FILE, dir);
    touch(want);
    assert_true(ms_nccl_plugin_resolve(NULL, exe, p, sizeof p, &env, why, sizeof why));
    assert_string_equal(p, want);

    /* The user's value wins even where ours exists: a path as is, a name the way NCCL
     * expands it, "none" is off. */
    assert_true(
        ms_nccl_plugin_resolve("/opt/x/libmine.so", exe, p, sizeof p, &env, why, sizeof why));
    assert_true(env);
    assert_string_equal(p, "/opt/x/libmine.so");
    assert_true(ms_nccl_plugin_resolve("inspector", exe, p, sizeof p, &env, why, sizeof why));
    assert_string_equal(p, "libnccl-profiler-inspector.so");
    assert_true(
        ms_nccl_plugin_resolve(MS_NCCL_PLUGIN_FILE, exe, p, sizeof p, &env, why, sizeof why));
    assert_string_equal(p, MS_NCCL_PLUGIN_FILE);
    assert_false(ms_nccl_plugin_resolve("none", exe, p, sizeof p, &env, why, sizeof why));
    assert_non_null(strstr(why, "none"));

    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    assert_int_equal(system(p), 0);
}

/* Runs ms_nccl_lane_open twice in a child (the lane is once per process) with env as
 * NCCL_PROFILER_PLUGIN (NULL: unset) and the executable at exe; returns what the child wrote
 * on stderr. The child exits 0 when both opens failed, the variable is as the user left it
 * and a drain afterwards is a harmless no-op. */
static void open_in_child(const char *env, const char *exe, char *err_text, size_t cap) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        if (env)
            setenv("NCCL_PROFILER_PLUGIN", env, 1);
        else
            unsetenv("NCCL_PROFILER_PLUGIN");
        bool a = ms_nccl_lane_open(exe), b = ms_nccl_lane_open(exe);
        const char *now = getenv("NCCL_PROFILER_PLUGIN");
        bool env_kept = env ? now && !strcmp(now, env) : now == NULL;
        ms_recorder *rec = NULL;
        ms_error e = {0};
        bool drained_nothing = ms_recorder_create(0, 64, &rec, &e) == MS_OK &&
                               ms_nccl_lane_drain(rec, 0, NULL) == 0 &&
                               ms_recorder_pushed(rec) == 0;
        ms_recorder_destroy(rec);
        _exit(!a && !b && env_kept && drained_nothing && !*ms_nccl_lane_path() ? 0 : 1);
    }
    close(fd[1]);
    size_t k = 0;
    ssize_t got;
    while (k + 1 < cap && (got = read(fd[0], err_text + k, cap - 1 - k)) > 0) k += (size_t)got;
    err_text[k] = '\0';
    close(fd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void open_missing_says_so_once(void **state) {
    (void)state;
    char text[2048];
    open_in_child(NULL, "/nonexistent/bin/meshscope", text, sizeof text);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, "no NCCL profiler plugin"));
    assert_non_null(strstr(text, "tracing without NCCL's view"));

    /* Found but not loadable (an empty file): said once, and the variable is left unset,
     * so that NCCL does not trip over it either. */
    char dir[] = "/tmp/ms_nccl_lane_XXXXXX", p[600];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/" MS_NCCL_PLUGIN_FILE, dir);
    touch(p);
    snprintf(p, sizeof p, "%s/meshscope", dir);
    open_in_child(NULL, p, text, sizeof text);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, "cannot load"));
    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    assert_int_equal(system(p), 0);

    /* The user's path is kept, and its failure to load is the one message. */
    open_in_child("/nonexistent/libnccl-profiler-x.so", MS_TEST_PLUGIN_DIR "/meshscope", text,
                  sizeof text);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, "/nonexistent/libnccl-profiler-x.so"));

    /* A library that loads but is not ours: said, not drained. */
    open_in_child(MS_TEST_NOT_PLUGIN, MS_TEST_PLUGIN_DIR "/meshscope", text, sizeof text);
    assert_int_equal(count_lines(text), 1);
    assert_non_null(strstr(text, "is not meshscope's NCCL profiler plugin"));

    /* "none": NCCL's plugin is off, and so is the lane. */
    open_in_child("none", MS_TEST_PLUGIN_DIR "/meshscope", text, sizeof text);
    assert_int_equal(count_lines(text), 1);
}

/* --- the real plugin, fed NCCL's calls, drained into a ring ----------------------------- */

static ms_nccl_event_descr_v5 coll_descr(uint64_t seq, const char *func, uint8_t chans) {
    ms_nccl_event_descr_v5 d;
    memset(&d, 0, sizeof d);
    d.type = MS_NCCL_PROFILE_COLL;
    d.coll.seqNumber = seq;
    d.coll.func = func;
    d.coll.count = 1024;
    d.coll.datatype = "ncclBfloat16";
    d.coll.nChannels = chans;
    d.coll.algo = "RING";
    d.coll.proto = "LL128";
    d.coll.root = 0;
    return d;
}

static void plugin_drains_into_ring(void **state) {
    (void)state;
    unsetenv("NCCL_PROFILER_PLUGIN");
    assert_true(ms_nccl_lane_open(MS_TEST_PLUGIN_DIR "/meshscope"));
    const char *env = getenv("NCCL_PROFILER_PLUGIN");
    assert_non_null(env);
    assert_string_equal(env, MS_TEST_PLUGIN_DIR "/" MS_NCCL_PLUGIN_FILE);
    assert_string_equal(ms_nccl_lane_path(), env);

    /* NCCL's side: the library named by the variable, and its v5 table. The loader hands
     * back the copy the lane opened, so both see one buffer. */
    void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    const ms_nccl_profiler_v5 *p = dlsym(h, "ncclProfiler_v5");
    assert_non_null(p);
    void *ctx = NULL;
    int mask = 0;
    assert_int_equal(p->init(&ctx, 0xABCDEF12345ull, &mask, "dp", 1, 2, 1, NULL), 0);

    ms_nccl_event_descr_v5 d = coll_descr(9, "AllReduce", 2);
    void *coll = NULL, *ch[2] = {NULL, NULL}, *proxy = NULL, *send = NULL, *recv = NULL;
    p->startEvent(ctx, &coll, &d);
    p->stopEvent(coll);
    for (int i = 0; i < 2; i++) {
        ms_nccl_event_descr_v5 c;
        memset(&c, 0, sizeof c);
        c.type = MS_NCCL_PROFILE_KERNEL_CH;
        c.parentObj = coll;
        c.kernelCh.channelId = (uint8_t)i;
        c.kernelCh.pTimer = 5000000 + (uint64_t)i * 10;
        p->startEvent(ctx, &ch[i], &c);
        ms_nccl_state_args_v5 a = {.kernelCh = {.pTimer = 5007000 + (uint64_t)i * 10}};
        p->recordEventState(ch[i], MS_NCCL_STATE_KERNEL_CH_STOP, &a);
    }
    ms_nccl_event_descr_v5 pd;
    memset(&pd, 0, sizeof pd);
    pd.type = MS_NCCL_PROFILE_PROXY_OP;
    pd.parentObj = coll;
    pd.proxyOp.pid = getpid();
    pd.proxyOp.peer = 0;
    pd.proxyOp.nSteps = 4;
    p->startEvent(ctx, &proxy, &pd);
    p->stopEvent(proxy);
    p->stopEvent(ch[0]);
    p->stopEvent(ch[1]);
    memset(&d, 0, sizeof d);
    d.type = MS_NCCL_PROFILE_P2P;
    d.p2p.func = "Send";
    d.p2p.count = 77;
    d.p2p.datatype = "ncclFloat32";
    d.p2p.peer = 0;
    p->startEvent(ctx, &send, &d);
    p->stopEvent(send);
    d.p2p.func = "Recv";
    p->startEvent(ctx, &recv, &d);
    p->stopEvent(recv);

    ms_recorder *rec = NULL;
    ms_error err = {0};
    assert_int_equal(ms_recorder_create(3, 64, &rec, &err), MS_OK);
    ms_recorder_set_step(rec, 12);
    ms_nccl_lane_counts counts = {0};
    assert_int_equal(ms_nccl_lane_drain(rec, 3, &counts), 3);
    assert_int_equal(counts.events, 3);
    assert_int_equal(counts.proxy_ops, 1);

    ms_event ev[8];
    uint64_t cursor = 0, missed = 0;
    assert_int_equal(ms_recorder_read(rec, &cursor, ev, 8, &missed), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ev[i].kind, MS_EV_NCCL);
        assert_int_equal(ev[i].rank, 3);
        assert_int_equal(ev[i].step, -1); /* linking gives the step, not the drain's */
        assert_int_equal(ev[i].u.nccl.comm_id, 0xABCDEF12345ull);
        assert_int_equal(ev[i].u.nccl.comm_rank, 1);
        assert_int_equal(ev[i].u.nccl.nranks, 2);
        assert_int_equal(ev[i].u.nccl.linked, 0);
        assert_true(ev[i].t0_ns <= ev[i].t1_ns);
    }
    /* the proxy op ended first, but the collective only once its channels had */
    const ms_ev_nccl *c = &ev[0].u.nccl;
    assert_string_equal(c->func, "AllReduce");
    assert_string_equal(c->algo, "RING");
    assert_string_equal(c->proto, "LL128");
    assert_string_equal(c->dtype, "ncclBfloat16");
    assert_int_equal(c->coll, MS_COLL_ALL_REDUCE);
    assert_int_equal(c->seq, 9);
    assert_int_equal(c->count, 1024);
    assert_int_equal(c->channels, 2);
    assert_int_equal(c->timing, MS_NCCL_T_GPU);
    assert_int_equal(c->gpu_t0, 5000000);
    assert_int_equal(c->gpu_t1, 5007010);
    assert_true(c->enqueued_ns >= 0 && c->enqueued_ns <= ev[0].t1_ns - ev[0].t0_ns);
    assert_string_equal(ev[1].u.nccl.func, "Send");
    assert_true(ev[1].u.nccl.p2p && ev[1].u.nccl.is_send);
    assert_int_equal(ev[1].u.nccl.coll, MS_COLL_P2P);
    assert_int_equal(ev[1].u.nccl.count, 77);
    assert_int_equal(ev[1].u.nccl.timing, MS_NCCL_T_ENQUEUE);
    assert_true(ev[2].u.nccl.p2p && !ev[2].u.nccl.is_send);

    assert_int_equal(ms_nccl_lane_drain(rec, 3, &counts), 0); /* the buffer is empty now */
    p->finalize(ctx);
    dlclose(h);
    ms_recorder_destroy(rec);
}

/* --- linking and GPU placement ------------------------------------------------------------ */

static ms_event coll_ev(int rank, int group, int gsize, int grank, int64_t seq, int64_t t0,
                        int64_t t1, ms_coll_kind kind) {
    ms_event e;
    memset(&e, 0, sizeof e);
    e.kind = MS_EV_COLL;
    e.rank = rank;
    e.step = 4;
    e.phase = MS_PHASE_BACKWARD;
    e.t0_ns = t0;
    e.t1_ns = t1;
    e.u.coll.coll = (uint8_t)kind;
    e.u.coll.group = group;
    e.u.coll.group_size = gsize;
    e.u.coll.group_rank = grank;
    e.u.coll.seq = seq;
    e.u.coll.mesh_dim = 0;
    ms_ev_strcpy(e.u.coll.algo, sizeof e.u.coll.algo, NULL, "nccl");
    return e;
}

/* A record as the drain makes it: drained by `drainer`, NCCL's host start t0. */
static ms_event nccl_ev(int drainer, uint64_t comm, int crank, const char *func, int64_t t0,
                        int64_t t1) {
    ms_nccl_record r;
    memset(&r, 0, sizeof r);
    r.kind = strcmp(func, "Send") && strcmp(func, "Recv") ? MS_NCCL_COLL : MS_NCCL_P2P;
    r.is_send = !strcmp(func, "Send");
    r.timing = MS_NCCL_T_HOST;
    r.rank = crank;
    r.nranks = 2;
    r.peer = 1 - crank;
    r.comm_id = comm;
    r.seq = 1;
    r.count = 256;
    r.n_channels = 4;
    r.t_start_ns = t0;
    r.t_enqueued_ns = t0 + 10;
    r.t_end_ns = t1;
    snprintf(r.func, sizeof r.func, "%s", func);
    snprintf(r.datatype, sizeof r.datatype, "ncclFloat32");
    snprintf(r.algo, sizeof r.algo, "TREE");
    snprintf(r.proto, sizeof r.proto, "Simple");
    int kind = !strcmp(func, "AllReduce")   ? MS_COLL_ALL_REDUCE
               : !strcmp(func, "AllGather") ? MS_COLL_ALL_GATHER
                                            : MS_COLL_P2P;
    ms_event e;
    assert_true(ms_nccl_lane_event(&r, drainer, kind, &e));
    return e;
}

enum { COMM_A = 0xA, COMM_B = 0xB, COMM_C = 0xC };
#define GPU_BASE 1000000000LL /* the GPU clock reads the host's + GPU_BASE (the truth) */

/* Threads layout: 2 ranks in one process, everything drained by rank 0. */
static size_t link_case(ms_event *ev) {
    size_t n = 0;
    /* tp (group 5): both ranks all-reduce at once; NCCL comm A */
    ev[n++] = coll_ev(0, 5, 2, 0, 10, 1000, 5000, MS_COLL_ALL_REDUCE);
    ev[n++] = coll_ev(1, 5, 2, 1, 10, 1100, 5200, MS_COLL_ALL_REDUCE);
    ev[n++] = nccl_ev(0, COMM_A, 0, "AllReduce", 1500, 4000); /* 2 */
    ev[n++] = nccl_ev(0, COMM_A, 1, "AllReduce", 1600, 4100); /* 3 */
    /* dp groups 7 {rank 0, ...} and 8 {rank 1, ...}: both ranks are position 0 in their own
     * group; alone in time first (teaching B -> (7, 0) and C -> (8, 1)), then together. */
    ev[n++] = coll_ev(0, 7, 2, 0, 1, 10000, 12000, MS_COLL_ALL_REDUCE);
    ev[n++] = nccl_ev(0, COMM_B, 0, "AllReduce", 10500, 11000); /* 5 */
    ev[n++] = coll_ev(1, 8, 2, 0, 1, 13000, 15000, MS_COLL_ALL_REDUCE);
    ev[n++] = nccl_ev(0, COMM_C, 0, "AllReduce", 13500, 14000); /* 7 */
    ev[n++] = coll_ev(0, 7, 2, 0, 2, 16000, 19000, MS_COLL_ALL_REDUCE);
    ev[n++] = coll_ev(1, 8, 2, 0, 2, 16000, 19000, MS_COLL_ALL_REDUCE);
    ev[n++] = nccl_ev(0, COMM_B, 0, "AllReduce", 16500, 17000); /* 10 */
    ev[n++] = nccl_ev(0, COMM_C, 0, "AllReduce", 16600, 17100); /* 11 */
    /* an all-gather NCCL made that meshscope did not (wrong kind): kept, unlinked */
    ev[n++] = nccl_ev(0, COMM_A, 1, "AllGather", 1700, 1800); /* 12 */
    /* outside any collective: kept on the rank its communicator was seen on */
    ev[n++] = nccl_ev(0, COMM_A, 1, "AllReduce", 50000, 50100); /* 13 */
    /* a send inside meshscope's p2p (sender side) */
    ev[n++] = coll_ev(1, 9, 2, 0, 3, 60000, 62000, MS_COLL_P2P);
    ev[n++] = nccl_ev(0, COMM_A, 1, "Send", 60100, 60200); /* 15 */
    /* GPU-timed (member A/0): true GPU spans [2000, 3500] and [21000, 25000] on the host
     * clock; the host saw them end at 4000 and 25100 */
    ev[n++] = coll_ev(0, 5, 2, 0, 11, 19500, 26000, MS_COLL_ALL_REDUCE);
    ev[n++] = nccl_ev(0, COMM_A, 0, "AllReduce", 20000, 25100); /* 17 */
    ev[2].u.nccl.timing = ev[17].u.nccl.timing = MS_NCCL_T_GPU;
    ev[2].u.nccl.gpu_t0 = GPU_BASE + 2000, ev[2].u.nccl.gpu_t1 = GPU_BASE + 3500;
    ev[17].u.nccl.gpu_t0 = GPU_BASE + 21000, ev[17].u.nccl.gpu_t1 = GPU_BASE + 25000;
    /* rank 1 also receives (another pair, group 10) while it sends: the send belongs to the
     * sending side's event, the receive to the receiving side's */
    ev[n] = coll_ev(1, 10, 2, 1, 5, 60050, 61000, MS_COLL_P2P);
    ev[n++].u.coll.recv = 1;
    ev[n++] = nccl_ev(0, COMM_A, 1, "Recv", 60060, 60500); /* 19 */
    return n;
}

static void assert_linked(const ms_event *e, int rank, int group, int64_t seq) {
    assert_int_equal(e->kind, MS_EV_NCCL);
    assert_int_equal(e->u.nccl.linked, 1);
    assert_int_equal(e->rank, rank);
    assert_int_equal(e->u.nccl.ms_group, group);
    assert_int_equal(e->u.nccl.ms_seq, seq);
    assert_int_equal(e->step, 4);
    assert_int_equal(e->phase, MS_PHASE_BACKWARD);
}

static void link_threads_layout(void **state) {
    (void)state;
    ms_event ev[32];
    size_t n = link_case(ev);
    ms_nccl_link_stats st;
    assert_int_equal(ms_nccl_lane_link(ev, n, true, &st), 0);
    assert_linked(&ev[2], 0, 5, 10);
    assert_linked(&ev[3], 1, 5, 10); /* comm rank 1 is world rank 1, though rank 0 drained it */
    assert_linked(&ev[5], 0, 7, 1);
    assert_linked(&ev[7], 1, 8, 1);
    assert_linked(&ev[10], 0, 7, 2); /* ambiguous alone, decided by what comm B taught */
    assert_linked(&ev[11], 1, 8, 2);
    assert_linked(&ev[15], 1, 9, 3);
    assert_linked(&ev[17], 0, 5, 11);
    assert_linked(&ev[19], 1, 10, 5);
    assert_int_equal(ev[12].u.nccl.linked, 0);
    assert_int_equal(ev[12].rank, 1);
    assert_int_equal(ev[13].u.nccl.linked, 0);
    assert_int_equal(ev[13].rank, 1);
    assert_int_equal(ev[13].step, -1);
    assert_int_equal(ev[13].u.nccl.ms_group, -1);
    assert_int_equal(st.linked, 9);
    assert_int_equal(st.unlinked, 2);

    /* GPU placement: offset bracket [max(host start - GPU start), min(host end - GPU end)] =
     * [-500, 100] - GPU_BASE: placed spans lie within the bracket's width after the truth,
     * end no later than the host saw them end, and keep the host span. */
    assert_int_equal(st.gpu_placed, 2);
    assert_int_equal(st.gpu_uncertainty_ns, 600);
    const int64_t truth[2][2] = {{2000, 3500}, {21000, 25000}},
                  host[2][2] = {{1500, 4000}, {20000, 25100}};
    const ms_event *g[2] = {&ev[2], &ev[17]};
    for (int k = 0; k < 2; k++) {
        assert_true(g[k]->t0_ns >= truth[k][0] && g[k]->t0_ns - truth[k][0] <= 600);
        assert_int_equal(g[k]->t1_ns - g[k]->t0_ns, truth[k][1] - truth[k][0]);
        assert_true(g[k]->t1_ns <= host[k][1]);
        assert_int_equal(g[k]->u.nccl.host_t0, host[k][0]);
        assert_int_equal(g[k]->u.nccl.host_t1, host[k][1]);
    }
    /* host-timed records keep their host span */
    assert_int_equal(ev[3].t0_ns, 1600);
    assert_int_equal(ev[3].t1_ns, 4100);
    assert_int_equal(ev[3].u.nccl.host_t1, 0);
}

/* MPI layout: one rank per process, so a record only links to its drainer's events. */
static void link_mpi_layout(void **state) {
    (void)state;
    ms_event ev[4];
    ev[0] = coll_ev(0, 5, 2, 0, 10, 1000, 5000, MS_COLL_ALL_REDUCE);
    ev[1] = nccl_ev(1, COMM_A, 0, "AllReduce", 1500, 4000); /* drained by rank 1 */
    ev[2] = coll_ev(1, 5, 2, 1, 10, 1000, 5000, MS_COLL_ALL_REDUCE);
    ev[3] = nccl_ev(1, COMM_A, 1, "AllReduce", 1500, 4000);
    ms_nccl_link_stats st;
    assert_int_equal(ms_nccl_lane_link(ev, 4, false, &st), 0);
    assert_int_equal(ev[1].u.nccl.linked, 0); /* rank 0's collective is another process's */
    assert_int_equal(ev[1].rank, 1);
    assert_linked(&ev[3], 1, 5, 10);
    assert_int_equal(st.linked, 1);
    assert_int_equal(st.unlinked, 1);
}

/* --- the trace file --------------------------------------------------------------------- */

static void trace_lane(void **state) {
    (void)state;
    ms_event ev[40];
    size_t n = link_case(ev);
    assert_int_equal(ms_nccl_lane_link(ev, n, true, NULL), 0);
    ms_group groups[4] = {{.id = 5, .name = "tp", .size = 2, .ranks = {0, 1}},
                          {.id = 7, .name = "dp", .size = 2, .ranks = {0, 2}},
                          {.id = 8, .name = "dp", .size = 2, .ranks = {1, 3}},
                          {.id = 9, .name = "pp", .size = 2, .ranks = {1, 0}}};
    char path[] = "/tmp/ms_nccl_lane_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ms_error err = {0};
    ms_trace_meta meta = {.backend = "threads", .world_size = 2};
    assert_int_equal(ms_trace_write(path, ev, n, groups, 4, &meta, &err), MS_OK);
    assert_int_equal(ms_trace_check(path, NULL, &err), MS_OK);

    /* The lane's thread, and one slice's args as written. */
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    assert_non_null(strstr(text, "\"thread_name\",\"pid\":0,\"tid\":"));
    assert_non_null(strstr(text, "{\"name\":\"NCCL (plugin)\"}"));
    const char *s = strstr(text, "\"cat\":\"nccl\",\"name\":\"Send\"");
    assert_non_null(s);
    const char *want[] = {
        "\"algorithm\":\"TREE\"", "\"protocol\":\"Simple\"",   "\"channels\":4",
        "\"count\":256",          "\"dtype\":\"ncclFloat32\"", "\"peer\":0",
        "\"p2p\":\"send\"",       "\"timing\":\"host\"",       "\"comm id\":\"0x000000000000000a\"",
        "\"linked\":1",           "\"ms group id\":9",         "\"ms seq\":3"};
    const char *end = strchr(s, '\n');
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        const char *at = strstr(s, want[k]);
        assert_true(at && (!end || at < end));
    }

    /* Read back: every field of every NCCL event. */
    ms_trace t;
    assert_int_equal(ms_trace_read(path, &t, &err), MS_OK);
    size_t found = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind != MS_EV_NCCL) continue;
        const ms_event *a = &ev[i];
        for (size_t j = 0; j < t.n_events; j++) {
            const ms_event *b = &t.events[j];
            if (b->kind != MS_EV_NCCL || b->t0_ns != a->t0_ns ||
                b->u.nccl.comm_id != a->u.nccl.comm_id ||
                b->u.nccl.comm_rank != a->u.nccl.comm_rank ||
                strcmp(b->u.nccl.func, a->u.nccl.func))
                continue;
            const ms_ev_nccl *x = &a->u.nccl, *y = &b->u.nccl;
            assert_int_equal(b->rank, a->rank);
            assert_int_equal(b->step, a->step);
            assert_int_equal(b->t1_ns, a->t1_ns);
            assert_int_equal(y->seq, x->seq);
            assert_int_equal(y->count, x->count);
            assert_int_equal(y->gpu_t0, x->gpu_t0);
            assert_int_equal(y->gpu_t1, x->gpu_t1);
            assert_int_equal(y->enqueued_ns, x->enqueued_ns);
            assert_int_equal(y->host_t0, x->host_t0);
            assert_int_equal(y->host_t1, x->host_t1);
            assert_int_equal(y->ms_seq, x->ms_seq);
            assert_int_equal(y->ms_group, x->ms_group);
            assert_int_equal(y->nranks, x->nranks);
            assert_int_equal(y->peer, x->peer);
            assert_int_equal(y->channels, x->channels);
            assert_int_equal(y->p2p, x->p2p);
            assert_int_equal(y->is_send, x->is_send);
            assert_int_equal(y->timing, x->timing);
            assert_int_equal(y->linked, x->linked);
            assert_int_equal(y->coll, x->coll);
            assert_string_equal(y->dtype, x->dtype);
            assert_string_equal(y->algo, x->algo);
            assert_string_equal(y->proto, x->proto);
            found++;
            break;
        }
    }
    assert_int_equal(found, 11);
    ms_trace_free(&t);
    unlink(path);
}

/* --- the tracer: two thread ranks, end to end ------------------------------------------- */

/* Each rank plays its own NCCL: a communicator member that makes one all-reduce inside the
 * meshscope collective it records. The rank's device claims to be a GPU (the lane is for
 * CUDA runs; the CUPTI half then says it has no GPU and traces the host). Rank 0 drains the
 * process's plugin, so rank 1's record reaches the file only through linking. */
static ms_status tracer_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    const char *path = arg;
    static ms_device_ops gpu_ops[2];
    const ms_device_ops *cpu_ops = ctx->device->ops;
    gpu_ops[ctx->rank] = *cpu_ops;
    gpu_ops[ctx->rank].kind = MS_DEVICE_CUDA;
    ctx->device->ops = &gpu_ops[ctx->rank];
    tracer t;
    tracer_opts to = {.path = path}; /* as train --trace asks */
    ms_status st = tracer_open(ctx, &t, &to, err);
    if (st == MS_OK) {
        void *h = dlopen(getenv("NCCL_PROFILER_PLUGIN"), RTLD_NOW | RTLD_LOCAL);
        const ms_nccl_profiler_v5 *p = h ? dlsym(h, "ncclProfiler_v5") : NULL;
        void *pctx = NULL, *coll = NULL;
        int mask = 0;
        if (!p || p->init(&pctx, 0x77, &mask, "world", 1, 2, ctx->rank, NULL) != 0)
            return ms_fail(err, MS_ERR_INVALID, "the plugin does not load");
        ms_event e = {.kind = MS_EV_COLL, .phase = MS_PHASE_FORWARD};
        e.t0_ns = ms_now_ns();
        ms_nccl_event_descr_v5 d = coll_descr(3, "AllReduce", 0);
        p->startEvent(pctx, &coll, &d);
        p->stopEvent(coll);
        e.t1_ns = ms_now_ns();
        e.u.coll = (ms_ev_coll){.coll = MS_COLL_ALL_REDUCE,
                                .group = 0,
                                .group_size = 2,
                                .group_rank = ctx->rank,
                                .seq = 42,
                                .mesh_dim = -1};
        ms_recorder_push(t.rec, &e);
        st = tracer_gather(ctx, &t, err);
        if (st == MS_OK) st = tracer_finish(ctx, &t, err);
        p->finalize(pctx);
        dlclose(h);
    }
    tracer_close(ctx, &t);
    ctx->device->ops = cpu_ops;
    return st;
}

static void tracer_end_to_end(void **state) {
    (void)state;
    assert_true(ms_nccl_lane_open(NULL)); /* opened by plugin_drains_into_ring */
    char path[] = "/tmp/ms_nccl_lane_job_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ms_launch_opts lo = {.backend = MS_BACKEND_THREADS, .nranks = 2};
    ms_error err = {0};
    assert_int_equal(ms_launch(&lo, tracer_rank, path, &err), MS_OK);
    assert_int_equal(ms_trace_check(path, NULL, &err), MS_OK);
    ms_trace t;
    assert_int_equal(ms_trace_read(path, &t, &err), MS_OK);
    int seen[2] = {0, 0};
    for (size_t i = 0; i < t.n_events; i++) {
        const ms_event *e = &t.events[i];
        if (e->kind != MS_EV_NCCL) continue;
        assert_true(e->rank == 0 || e->rank == 1);
        assert_int_equal(e->u.nccl.comm_rank, e->rank); /* on its own rank, not the drainer's */
        assert_int_equal(e->u.nccl.linked, 1);
        assert_int_equal(e->u.nccl.ms_seq, 42);
        assert_int_equal(e->u.nccl.seq, 3);
        assert_int_equal(e->u.nccl.comm_id, 0x77);
        assert_int_equal(e->phase, MS_PHASE_FORWARD);
        seen[e->rank]++;
    }
    assert_int_equal(seen[0], 1);
    assert_int_equal(seen[1], 1);
    ms_trace_free(&t);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resolve_paths),           cmocka_unit_test(open_missing_says_so_once),
        cmocka_unit_test(plugin_drains_into_ring), cmocka_unit_test(link_threads_layout),
        cmocka_unit_test(link_mpi_layout),         cmocka_unit_test(trace_lane),
        cmocka_unit_test(tracer_end_to_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

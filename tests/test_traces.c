/* test_traces.c - trace files: the writer's Kineto layout checked independently with cJSON
 * (required keys, no overlapping slices per thread, flows from reshards to collectives),
 * the exact round trip through the reader, the validator's rules one by one, durable writes
 * that keep the old file on failure, bad and foreign inputs, the export speed at a million
 * events, and the `meshscope trace` command line. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "cli/commands.h"
#include "engine/io/fileio.h"
#include "profiler/analysis.h"
#include "profiler/gpu_attribute.h"
#include "tests/testkit.h"
#include "traces/trace_check.h"
#include "traces/trace_merge.h"
#include "traces/trace_read.h"
#include "traces/trace_write.h"

/* --- helpers ---------------------------------------------------------------------------- */

static char g_dir[64];

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ms_traces_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *out, size_t len, const char *name) {
    snprintf(out, len, "%s/%s", g_dir, name);
}

static char *slurp(const char *path, size_t *n) {
    uint8_t *buf;
    size_t len;
    ms_error err = {0};
    ms_status st = ms_read_file(path, (size_t)1 << 31, &buf, &len, &err);
    if (st != MS_OK) fail_msg("%s", err.msg);
    if (n) *n = len;
    return (char *)buf;
}

static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static int count_temps(void) {
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

/* --- a synthetic multi-rank run --------------------------------------------------------- */

/* 4 ranks on a 2 x 2 mesh (dp, tp): tp groups {0,1} {2,3}, dp groups {0,2} {1,3}. */
static const ms_group k_groups[] = {
    {.id = 0, .name = "tp", .size = 2, .ranks = {0, 1}},
    {.id = 1, .name = "tp", .size = 2, .ranks = {2, 3}},
    {.id = 2, .name = "dp", .size = 2, .ranks = {0, 2}},
    {.id = 3, .name = "dp", .size = 2, .ranks = {1, 3}},
};
#define N_GROUPS 4

static ms_event ev_base(int kind, int rank, int64_t step, int phase, int64_t t0, int64_t t1) {
    ms_event e;
    memset(&e, 0, sizeof e);
    e.kind = (uint8_t)kind;
    e.rank = rank;
    e.step = step;
    e.phase = (uint8_t)phase;
    e.t0_ns = t0;
    e.t1_ns = t1;
    return e;
}

static ms_event ev_coll(int rank, int64_t step, int64_t t0, int64_t t1, int coll, bool tp,
                        int64_t seq, uint64_t bytes, uint64_t flow) {
    ms_event e = ev_base(MS_EV_COLL, rank, step, MS_PHASE_BACKWARD, t0, t1);
    ms_ev_coll *c = &e.u.coll;
    c->coll = (uint8_t)coll;
    c->reduce = coll == MS_COLL_REDUCE_SCATTER ? MS_REDUCE_AVG : MS_REDUCE_SUM;
    c->mesh_dim = tp ? 1 : 0;
    c->group = tp ? rank / 2 : 2 + rank % 2;
    c->group_size = 2;
    c->group_rank = tp ? rank % 2 : rank / 2;
    c->seq = seq;
    c->bytes = bytes;
    snprintf(c->algo, sizeof c->algo, "shm-direct");
    c->flow = flow;
    return e;
}

/* Appends one step of one rank (15 events, 16 on rank 0's steps): a step slice, data
 * loading, six ops, two overlapping tp all-reduces belonging to one reshard, a dp
 * reduce-scatter overlapping compute, the optimizer, two memory samples. Times are odd
 * nanosecond values so that the microsecond formatting is exercised. */
static size_t synth_step(ms_event *ev, size_t n, int rank, int64_t s, int64_t base) {
    int64_t T = base + s * 2000003 + rank * 1111;
    uint64_t flow = (uint64_t)s * 10 + 1;
    ev[n++] = ev_base(MS_EV_STEP, rank, s, MS_PHASE_OTHER, T, T + 1900001);
    ms_event d = ev_base(MS_EV_DATA, rank, s, MS_PHASE_OTHER, T + 100, T + 907);
    snprintf(d.u.op.name, sizeof d.u.op.name, "batch");
    ev[n++] = d;
    for (int k = 0; k < 6; k++) {
        ms_event o = ev_base(MS_EV_OP, rank, s, k < 3 ? MS_PHASE_FORWARD : MS_PHASE_BACKWARD,
                             T + 1000 + k * 150007, T + 1000 + k * 150007 + 140003);
        o.u.op.op = 3 + k;
        if (k == 2)
            snprintf(o.u.op.name, sizeof o.u.op.name, "h.0.attn \"q\\k\" \xc3\xa9 \t");
        else if (k != 5)
            snprintf(o.u.op.name, sizeof o.u.op.name, "h.%d.mlp.c_fc.mm", k);
        snprintf(o.u.op.opname, sizeof o.u.op.opname, "matmul");
        o.u.op.flops = k == 1 ? 1234.5678 : 2.0 * 64 * 64 * 64 * (k + 1);
        o.u.op.bytes = 3.0 * 4 * 64 * 64;
        ev[n++] = o;
    }
    ms_event r = ev_base(MS_EV_RESHARD, rank, s, MS_PHASE_FORWARD, T + 5000, T + 600001);
    snprintf(r.u.reshard.tensor, sizeof r.u.reshard.tensor, "h.0.mlp.c_proj.out");
    snprintf(r.u.reshard.from, sizeof r.u.reshard.from, "[R, P(sum)]");
    snprintf(r.u.reshard.to, sizeof r.u.reshard.to, "[R, R]");
    r.u.reshard.nsteps = 2;
    r.u.reshard.bytes = 8192 + 12288;
    r.u.reshard.flow = flow;
    ev[n++] = r;
    ev[n++] =
        ev_coll(rank, s, T + 10001, T + 300003, MS_COLL_ALL_REDUCE, true, 2 * s + 1, 8192, flow);
    ev[n++] =
        ev_coll(rank, s, T + 200001, T + 500003, MS_COLL_ALL_REDUCE, true, 2 * s + 2, 12288, flow);
    ev[n++] =
        ev_coll(rank, s, T + 900001, T + 1400003, MS_COLL_REDUCE_SCATTER, false, s + 1, 65536, 0);
    if (rank == 0) { /* a collective on a group missing from the table */
        ms_event u =
            ev_coll(rank, s, T + 1410000, T + 1420000, MS_COLL_BARRIER, false, s + 1, 0, 0);
        u.u.coll.group = 99;
        u.u.coll.mesh_dim = -1;
        ev[n++] = u;
    }
    ev[n++] = ev_base(MS_EV_OPTIM, rank, s, MS_PHASE_OTHER, T + 1500001, T + 1600003);
    for (int k = 0; k < 2; k++) {
        ms_event m = ev_base(MS_EV_MEM, rank, s, MS_PHASE_OTHER, T + 50001 + k * 950000,
                             T + 50001 + k * 950000);
        m.u.mem.in_use = (uint64_t)(rank + 1) * 1234567 + (uint64_t)s * 1000 + 1 + (uint64_t)k;
        m.u.mem.peak = m.u.mem.in_use + ((uint64_t)3 << 30) + 7;
        if (k % 2) { /* every other sample carries the training state's split */
            m.u.mem.params = (uint64_t)rank * 1000003 + 11;
            m.u.mem.grads = m.u.mem.params + 5;
            m.u.mem.optim = 2 * m.u.mem.params + 1;
            m.u.mem.acts = m.u.mem.in_use / 3 + 17;
        }
        ev[n++] = m;
    }
    return n;
}

#define BASE_NS 5000000000123LL

/* nranks x nsteps steps into a new array. */
static ms_event *synth(int nranks, int nsteps, size_t *n) {
    ms_event *ev = malloc(sizeof *ev * (size_t)nranks * (size_t)nsteps * 16);
    assert_non_null(ev);
    size_t k = 0;
    for (int r = 0; r < nranks; r++)
        for (int s = 0; s < nsteps; s++) k = synth_step(ev, k, r, s, BASE_NS);
    *n = k;
    return ev;
}

static void assert_same_event(const ms_event *a, const ms_event *b, size_t i) {
    if (a->kind != b->kind || a->phase != b->phase || a->rank != b->rank || a->step != b->step ||
        a->t0_ns != b->t0_ns || a->t1_ns != b->t1_ns)
        fail_msg("event %zu: kind %d/%d phase %d/%d rank %d/%d step %lld/%lld t0 %lld/%lld t1 "
                 "%lld/%lld",
                 i, a->kind, b->kind, a->phase, b->phase, a->rank, b->rank, (long long)a->step,
                 (long long)b->step, (long long)a->t0_ns, (long long)b->t0_ns, (long long)a->t1_ns,
                 (long long)b->t1_ns);
    switch (a->kind) {
        case MS_EV_OP:
        case MS_EV_DATA:
        case MS_EV_OPTIM:
            assert_int_equal(a->u.op.op, b->u.op.op);
            assert_string_equal(a->u.op.name, b->u.op.name);
            assert_string_equal(a->u.op.opname, b->u.op.opname);
            assert_true(a->u.op.flops == b->u.op.flops);
            assert_true(a->u.op.bytes == b->u.op.bytes);
            break;
        case MS_EV_COLL: {
            const ms_ev_coll *x = &a->u.coll, *y = &b->u.coll;
            assert_int_equal(x->coll, y->coll);
            assert_int_equal(x->reduce, y->reduce);
            assert_int_equal(x->mesh_dim, y->mesh_dim);
            assert_int_equal(x->group, y->group);
            assert_int_equal(x->group_size, y->group_size);
            assert_int_equal(x->group_rank, y->group_rank);
            assert_int_equal(x->seq, y->seq);
            assert_int_equal(x->bytes, y->bytes);
            assert_string_equal(x->algo, y->algo);
            assert_int_equal(x->flow, y->flow);
            break;
        }
        case MS_EV_RESHARD:
            assert_string_equal(a->u.reshard.tensor, b->u.reshard.tensor);
            assert_string_equal(a->u.reshard.from, b->u.reshard.from);
            assert_string_equal(a->u.reshard.to, b->u.reshard.to);
            assert_int_equal(a->u.reshard.nsteps, b->u.reshard.nsteps);
            assert_int_equal(a->u.reshard.bytes, b->u.reshard.bytes);
            assert_int_equal(a->u.reshard.flow, b->u.reshard.flow);
            break;
        case MS_EV_MEM:
            assert_int_equal(a->u.mem.in_use, b->u.mem.in_use);
            assert_int_equal(a->u.mem.peak, b->u.mem.peak);
            assert_int_equal(a->u.mem.params, b->u.mem.params);
            assert_int_equal(a->u.mem.grads, b->u.mem.grads);
            assert_int_equal(a->u.mem.optim, b->u.mem.optim);
            assert_int_equal(a->u.mem.acts, b->u.mem.acts);
            break;
        case MS_EV_PIPE: {
            const ms_ev_pipe *x = &a->u.pipe, *y = &b->u.pipe;
            assert_int_equal(x->action, y->action);
            assert_int_equal(x->chunk, y->chunk);
            assert_int_equal(x->stage, y->stage);
            assert_int_equal(x->mb, y->mb);
            assert_int_equal(x->model_chunk, y->model_chunk);
            assert_int_equal(x->stages, y->stages);
            assert_int_equal(x->virtual_stages, y->virtual_stages);
            assert_int_equal(x->micro_batches, y->micro_batches);
            assert_string_equal(x->schedule, y->schedule);
            break;
        }
        default:
            break;
    }
}

static void write_synth(const char *path, int nranks, int nsteps) {
    size_t n;
    ms_event *ev = synth(nranks, nsteps, &n);
    ms_trace_meta meta = {.backend = "threads", .world_size = nranks};
    ms_error err = {0};
    if (ms_trace_write(path, ev, n, k_groups, N_GROUPS, &meta, &err) != MS_OK)
        fail_msg("%s", err.msg);
    free(ev);
}

/* --- the round trip ----------------------------------------------------------------------- */

/* Times round trip exactly: the file holds microseconds with 3 decimals, i.e. whole
 * nanoseconds, and the reader converts the decimal text without going through a double. */
static void roundtrip(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "rt.json");
    size_t n;
    ms_event *ev = synth(4, 3, &n);
    ms_trace_meta meta = {.backend = "threads", .world_size = 4};
    ms_error err = {0};
    assert_int_equal(ms_trace_write(path, ev, n, k_groups, N_GROUPS, &meta, &err), MS_OK);

    ms_trace_check_info info;
    if (ms_trace_check(path, &info, &err) != MS_OK) fail_msg("%s", err.msg);

    ms_trace t;
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_true(t.meshscope);
    assert_int_equal(t.world_size, 4);
    assert_int_equal(t.rank, 0);
    assert_string_equal(t.backend, "threads");
    assert_int_equal(t.base_ns, BASE_NS);
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < n; i++) assert_same_event(&ev[i], &t.events[i], i);
    assert_int_equal(t.n_groups, N_GROUPS);
    for (int g = 0; g < N_GROUPS; g++) {
        assert_int_equal(t.groups[g].id, k_groups[g].id);
        assert_string_equal(t.groups[g].name, k_groups[g].name);
        assert_int_equal(t.groups[g].size, 2);
        assert_memory_equal(t.groups[g].ranks, k_groups[g].ranks, 2 * sizeof(int32_t));
    }
    /* Everything but the M and flow events became an event again. */
    assert_int_equal(t.n_trace_events - t.n_ignored, n);
    ms_trace_free(&t);

    /* A base time after some events: negative timestamps round-trip too. */
    meta.has_base = true;
    meta.base_ns = BASE_NS + 3000000;
    assert_int_equal(ms_trace_write(path, ev, n, k_groups, N_GROUPS, &meta, &err), MS_OK);
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < n; i++) assert_same_event(&ev[i], &t.events[i], i);
    ms_trace_free(&t);

    /* Events in no particular order (reversed): the writer sorts its index, the file keeps
     * the given order, the threads still never overlap. */
    for (size_t i = 0; i < n / 2; i++) {
        ms_event tmp = ev[i];
        ev[i] = ev[n - 1 - i];
        ev[n - 1 - i] = tmp;
    }
    meta.has_base = false;
    assert_int_equal(ms_trace_write(path, ev, n, k_groups, N_GROUPS, &meta, &err), MS_OK);
    if (ms_trace_check(path, &info, &err) != MS_OK) fail_msg("%s", err.msg);
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < n; i++) assert_same_event(&ev[i], &t.events[i], i);
    ms_trace_free(&t);
    free(ev);
}

/* --- the layout, checked without the project's own reader ------------------------------- */

typedef struct slice {
    int pid, tid;
    double ts, dur;
    const cJSON *ev;
} slice;

static int cmp_slice(const void *a, const void *b) {
    const slice *x = a, *y = b;
    if (x->pid != y->pid) return x->pid - y->pid;
    if (x->tid != y->tid) return x->tid - y->tid;
    return x->ts < y->ts ? -1 : x->ts > y->ts;
}

/* The whole text as one JSON value followed by whitespace only (cJSON's own "require null
 * terminated" check rejects a trailing newline in a length-limited buffer). */
static cJSON *parse_whole(const char *text, size_t len) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    assert_non_null(root);
    while (end < text + len && (*end == '\n' || *end == ' ')) end++;
    assert_true(end == text + len);
    return root;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *thread_name_of(const cJSON *evs, int pid, int tid) {
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = jstr(e, "ph"), *name = jstr(e, "name");
        if (ph && !strcmp(ph, "M") && name && !strcmp(name, "thread_name") &&
            jnum(e, "pid") == pid && jnum(e, "tid") == tid)
            return jstr(cJSON_GetObjectItemCaseSensitive(e, "args"), "name");
    }
    return NULL;
}

/* --- pipeline slices -------------------------------------------------------------------- */

static ms_event ev_pipe(int rank, int64_t step, int64_t t0, int64_t t1, int action, int stage,
                        int mb, int chunk, int p, int v, int m, const char *sched) {
    ms_event e = ev_base(MS_EV_PIPE, rank, step,
                         action == MS_PIPE_F ? MS_PHASE_FORWARD : MS_PHASE_BACKWARD, t0, t1);
    ms_ev_pipe *x = &e.u.pipe;
    x->action = (uint8_t)action;
    x->chunk = (uint8_t)chunk;
    x->stage = (int16_t)stage;
    x->mb = mb;
    x->model_chunk = chunk * p + stage;
    x->stages = (int16_t)p;
    x->virtual_stages = (int16_t)v;
    x->micro_batches = m;
    snprintf(x->schedule, sizeof x->schedule, "%s", sched);
    return e;
}

/* Step 0: interleaved on pp 2 x dp 2 (ranks 0, 1 on stage 0; 2, 3 on stage 1), 2 micro-batches
 * on 2 chunks, every F then every B, with an op inside each action; step 1: zb-h1's W on
 * rank 0. Returns the count written into ev (69: room for 80). */
static size_t synth_pipe(ms_event *ev) {
    size_t n = 0;
    for (int r = 0; r < 4; r++) {
        int stage = r / 2;
        int64_t t = BASE_NS + r * 777 + 1;
        ev[n++] = ev_base(MS_EV_STEP, r, 0, MS_PHASE_OTHER, t, t + 9000001);
        for (int k = 0; k < 8; k++) {
            int action = k < 4 ? MS_PIPE_F : MS_PIPE_B, mb = k % 2, chunk = k / 2 % 2;
            int64_t a = t + 1000 + k * 1000003, b = a + 900001;
            ev[n++] = ev_pipe(r, 0, a, b, action, stage, mb, chunk, 2, 2, 2, "interleaved");
            ms_event o = ev_base(MS_EV_OP, r, 0, ev[n - 1].phase, a + 10, b - 10);
            snprintf(o.u.op.opname, sizeof o.u.op.opname, "matmul");
            ev[n++] = o;
        }
    }
    ev[n++] =
        ev_pipe(0, 1, BASE_NS + 20000003, BASE_NS + 20500001, MS_PIPE_W, 0, 3, 0, 2, 1, 4, "zb-h1");
    return n;
}

/* Pipeline actions are slices on their own thread per rank ("pipeline"), named F/B/W and
 * micro-batch (".chunk" with virtual stages), cat "pipeline", every field in the args; the
 * validator accepts them and the reader gives back the same events. */
static void pipeline_slices(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "pipe.json");
    ms_event ev[80];
    size_t n = synth_pipe(ev);
    ms_error err = {0};
    ms_trace_meta meta = {.world_size = 4};
    assert_int_equal(ms_trace_write(path, ev, n, NULL, 0, &meta, &err), MS_OK);
    if (ms_trace_check(path, NULL, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_trace t;
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < n; i++) assert_same_event(&ev[i], &t.events[i], i);
    ms_trace_free(&t);

    size_t len;
    char *text = slurp(path, &len);
    cJSON *root = parse_whole(text, len);
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
    int npipe = 0, nops = 0;
    bool seen_f11 = false, seen_b0 = false, seen_w3 = false;
    cJSON_ArrayForEach(e, evs) {
        const char *cat = jstr(e, "cat"), *name = jstr(e, "name");
        if (strcmp(jstr(e, "ph"), "X") || !cat) continue;
        int pid = (int)jnum(e, "pid"), tid = (int)jnum(e, "tid");
        const char *tn = thread_name_of(evs, pid, tid);
        if (!strcmp(cat, "cpu_op")) {
            assert_string_equal(tn, "compute");
            nops++;
        }
        if (strcmp(cat, "pipeline")) continue;
        npipe++;
        assert_string_equal(tn, "pipeline");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
        static const char *const keys[] = {
            "action",         "stage",         "micro-batch", "chunk", "model chunk", "stages",
            "virtual stages", "micro-batches", "schedule",    "step",  "phase"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!cJSON_GetObjectItemCaseSensitive(a, keys[k]))
                fail_msg("pipeline args lack \"%s\"", keys[k]);
        if (jnum(a, "virtual stages") > 1) assert_int_equal((int)jnum(a, "stage"), pid / 2);
        seen_f11 |= !strcmp(name, "F1.1") && !strcmp(jstr(a, "schedule"), "interleaved") &&
                    jnum(a, "model chunk") == 2 + pid / 2;
        seen_b0 |= !strcmp(name, "B0.0") && !strcmp(jstr(a, "phase"), "backward");
        seen_w3 |= !strcmp(name, "W3") && !strcmp(jstr(a, "schedule"), "zb-h1");
    }
    assert_int_equal(npipe, 4 * 8 + 1);
    assert_int_equal(nops, 4 * 8);
    assert_true(seen_f11 && seen_b0 && seen_w3);
    cJSON_Delete(root);
    free(text);
}

static void kineto_layout(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "layout.json");
    write_synth(path, 4, 3);
    size_t len;
    char *text = slurp(path, &len);
    cJSON *root = parse_whole(text, len);

    /* Kineto's header. */
    assert_int_equal((int)jnum(root, "schemaVersion"), 1);
    assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, "deviceProperties")));
    const cJSON *di = cJSON_GetObjectItemCaseSensitive(root, "distributedInfo");
    assert_string_equal(jstr(di, "backend"), "threads");
    assert_int_equal((int)jnum(di, "rank"), 0);
    assert_int_equal((int)jnum(di, "world_size"), 4);
    const cJSON *pg = cJSON_GetObjectItemCaseSensitive(di, "pg_config");
    assert_int_equal(cJSON_GetArraySize(pg), N_GROUPS);
    const cJSON *g0 = cJSON_GetArrayItem(pg, 0);
    assert_string_equal(jstr(g0, "pg_name"), "tp");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(g0, "ranks")), 2);
    assert_true(jnum(root, "baseTimeNanoseconds") == (double)BASE_NS);
    assert_string_equal(jstr(root, "displayTimeUnit"), "ms");
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    assert_true(cJSON_IsArray(evs));

    /* Every X slice, sorted per thread: strictly no overlap (the writer does not nest). */
    int nev = cJSON_GetArraySize(evs), nx = 0, ncoll = 0, nmem = 0, nsteps = 0;
    slice *sl = malloc(sizeof *sl * (size_t)nev);
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = jstr(e, "ph");
        assert_non_null(ph);
        if (!strcmp(ph, "C")) {
            assert_string_equal(jstr(e, "name"), "memory");
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
            assert_true(jnum(a, "in_use_MiB") > 0 && jnum(a, "peak_MiB") > 3072);
            nmem++;
        }
        if (strcmp(ph, "X")) continue;
        sl[nx++] =
            (slice){(int)jnum(e, "pid"), (int)jnum(e, "tid"), jnum(e, "ts"), jnum(e, "dur"), e};
        assert_true(sl[nx - 1].dur >= 0);
        const char *name = jstr(e, "name"), *cat = jstr(e, "cat");
        nsteps += !strncmp(name, "ProfilerStep#", 13);
        if (!strcmp(cat, "comm")) {
            ncoll++;
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
            static const char *const keys[] = {
                "Collective name",    "In msg nelems", "Out msg nelems",
                "Group size",         "dtype",         "Process Group Ranks",
                "Process Group Name", "bytes",         "seq",
                "algorithm",          "mesh dim"};
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                if (!cJSON_GetObjectItemCaseSensitive(a, keys[k]))
                    fail_msg("collective args lack \"%s\"", keys[k]);
            assert_string_equal(jstr(a, "dtype"), "Float");
            if (!strcmp(jstr(a, "Collective name"), "reduce_scatter"))
                assert_true(jnum(a, "In msg nelems") == 2 * jnum(a, "Out msg nelems"));
        }
    }
    assert_int_equal(nsteps, 12);
    assert_int_equal(nmem, 24);
    assert_int_equal(ncoll, 4 * 3 * 3 + 3);
    qsort(sl, (size_t)nx, sizeof *sl, cmp_slice);
    for (int i = 1; i < nx; i++)
        if (sl[i].pid == sl[i - 1].pid && sl[i].tid == sl[i - 1].tid &&
            sl[i].ts < sl[i - 1].ts + sl[i - 1].dur - 1e-6)
            fail_msg("slices overlap on pid %d tid %d at ts %.3f", sl[i].pid, sl[i].tid, sl[i].ts);

    /* Thread names: every used thread is named; the overlapping tp all-reduces needed a
     * second tp thread; steps, compute and reshards have their own. */
    bool seen_tp2 = false, seen_dp = false, seen_compute = false, seen_steps = false,
         seen_reshard = false;
    for (int i = 0; i < nx; i++) {
        const char *tn = thread_name_of(evs, sl[i].pid, sl[i].tid);
        if (!tn) fail_msg("pid %d tid %d has no thread_name", sl[i].pid, sl[i].tid);
        const char *cat = jstr(sl[i].ev, "cat");
        if (!strcmp(cat, "comm")) {
            assert_true(!strncmp(tn, "comm: ", 6));
            seen_tp2 |= !strcmp(tn, "comm: tp #2");
            seen_dp |= !strcmp(tn, "comm: dp");
        }
        if (!strcmp(cat, "cpu_op")) seen_compute |= !strcmp(tn, "compute");
        if (!strcmp(cat, "user_annotation")) seen_steps |= !strcmp(tn, "steps");
        if (!strcmp(cat, "reshard")) seen_reshard |= !strcmp(tn, "reshard");
    }
    assert_true(seen_tp2 && seen_dp && seen_compute && seen_steps && seen_reshard);
    /* One process per rank, named and sorted. */
    for (int r = 0; r < 4; r++) {
        bool named = false;
        cJSON_ArrayForEach(e, evs) {
            const char *name = jstr(e, "name");
            if (!strcmp(jstr(e, "ph"), "M") && !strcmp(name, "process_name") &&
                jnum(e, "pid") == r) {
                char want[24];
                snprintf(want, sizeof want, "rank %d", r);
                assert_string_equal(jstr(cJSON_GetObjectItemCaseSensitive(e, "args"), "name"),
                                    want);
                named = true;
            }
        }
        assert_true(named);
    }

    /* Flows: each f binds a collective slice, its s lies on a reshard slice of the same rank
     * with the same flow number, and each linked collective has exactly one. */
    int nf = 0;
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(jstr(e, "ph"), "f")) continue;
        nf++;
        assert_string_equal(jstr(e, "bp"), "e");
        double id = jnum(e, "id");
        const cJSON *s = NULL, *x;
        cJSON_ArrayForEach(x, evs) if (!strcmp(jstr(x, "ph"), "s") && jnum(x, "id") == id) s = x;
        assert_non_null(s);
        const slice *coll = NULL, *res = NULL;
        for (int i = 0; i < nx; i++) {
            if (sl[i].pid == (int)jnum(e, "pid") && sl[i].tid == (int)jnum(e, "tid") &&
                sl[i].ts == jnum(e, "ts"))
                coll = &sl[i];
            if (sl[i].pid == (int)jnum(s, "pid") && sl[i].tid == (int)jnum(s, "tid") &&
                sl[i].ts <= jnum(s, "ts") && jnum(s, "ts") <= sl[i].ts + sl[i].dur)
                res = &sl[i];
        }
        assert_non_null(coll);
        assert_non_null(res);
        assert_string_equal(jstr(coll->ev, "cat"), "comm");
        assert_string_equal(jstr(res->ev, "cat"), "reshard");
        assert_int_equal(coll->pid, res->pid);
        double cf = jnum(cJSON_GetObjectItemCaseSensitive(coll->ev, "args"), "flow");
        double rf = jnum(cJSON_GetObjectItemCaseSensitive(res->ev, "args"), "flow");
        assert_true(cf == rf && cf > 0);
    }
    assert_int_equal(nf, 4 * 3 * 2); /* two all-reduces per reshard */
    free(sl);
    cJSON_Delete(root);
    free(text);
}

/* Strings: escapes, control characters and invalid UTF-8 (a name cut inside a character)
 * still make valid JSON; valid UTF-8 survives, invalid bytes become U+FFFD. */
static void strings_and_utf8(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "utf8.json");
    ms_event ev[2];
    ev[0] = ev_base(MS_EV_OP, 0, 0, MS_PHASE_FORWARD, 1000, 2000);
    snprintf(ev[0].u.op.name, sizeof ev[0].u.op.name, "q\"\\\x01\n/\xe2\x82\xac cut\xc3");
    ev[1] = ev_base(MS_EV_OP, 0, 0, MS_PHASE_FORWARD, 2000, 3000);
    memset(ev[1].u.op.name, 'a', sizeof ev[1].u.op.name); /* no terminator */
    ms_error err = {0};
    assert_int_equal(ms_trace_write(path, ev, 2, NULL, 0, NULL, &err), MS_OK);
    size_t len;
    char *text = slurp(path, &len);
    cJSON *root = parse_whole(text, len);
    cJSON_Delete(root);
    free(text);
    ms_trace t;
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.n_events, 2);
    assert_string_equal(t.events[0].u.op.name, "q\"\\\x01\n/\xe2\x82\xac cut\xef\xbf\xbd");
    assert_int_equal(strlen(t.events[1].u.op.name), sizeof ev[1].u.op.name - 1);
    ms_trace_free(&t);
    assert_int_equal(ms_trace_check(path, NULL, &err), MS_OK);
}

/* Many events on one thread overlapping every other: each gets its own thread, no quadratic
 * blow-up, the validator agrees. */
static void heavy_overlap(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "overlap.json");
    enum { N = 20000 };
    ms_event *ev = malloc(sizeof *ev * N);
    for (int i = 0; i < N; i++)
        ev[i] = ev_base(MS_EV_OP, 0, 0, MS_PHASE_FORWARD, 1000 + i, 1000000 + i);
    ms_error err = {0};
    assert_int_equal(ms_trace_write(path, ev, N, NULL, 0, NULL, &err), MS_OK);
    ms_trace_check_info info;
    if (ms_trace_check(path, &info, &err) != MS_OK) fail_msg("%s", err.msg);
    size_t len;
    char *text = slurp(path, &len);
    assert_non_null(strstr(text, "\"compute #20000\""));
    free(text);
    free(ev);
}

/* --- the validator ------------------------------------------------------------------------ */

typedef struct rule_case {
    const char *events; /* the traceEvents array's content */
    long violation;     /* expected index, -1: valid */
    const char *msg;    /* expected in the message */
} rule_case;

static void validator_rules(void **state) {
    (void)state;
    static const rule_case cases[] = {
        /* nesting and touching are fine, partial overlap is not */
        {"{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":10},"
         "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":2,\"dur\":3},"
         "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":10,\"dur\":5},"
         "{\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":3,\"dur\":50}",
         -1, NULL},
        {"{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":10},"
         "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":5,\"dur\":10},"
         "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":9.999,\"dur\":10}",
         2, "partially overlap"},
        {"{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0}", 0, "numeric \"dur\" >= 0"},
        {"{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":0,\"dur\":-1}", 0, "\"dur\" >= 0"},
        {"{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":\"0\",\"dur\":1}", 0, "numeric \"ts\""},
        {"{\"pid\":0,\"tid\":1,\"ts\":0}", 0, "no string \"ph\""},
        {"{\"ph\":\"Q\",\"pid\":0,\"tid\":1,\"ts\":0}", 0, "unknown phase"},
        {"{\"ph\":\"X\",\"pid\":\"main\",\"tid\":1,\"ts\":0,\"dur\":1}", 0, "\"pid\" must be"},
        {"{\"ph\":\"X\",\"pid\":0,\"tid\":1.5,\"ts\":0,\"dur\":1}", 0, "\"tid\" must be"},
        {"{\"ph\":\"X\",\"pid\":0,\"ts\":0,\"dur\":1}", 0, "no \"tid\""},
        {"[1]", 0, "must be a JSON object"},
        {"{\"ph\":\"B\",\"pid\":0,\"tid\":1,\"ts\":0,\"name\":\"a\"},"
         "{\"ph\":\"B\",\"pid\":0,\"tid\":1,\"ts\":1,\"name\":\"b\"},"
         "{\"ph\":\"E\",\"pid\":0,\"tid\":1,\"ts\":2},"
         "{\"ph\":\"E\",\"pid\":0,\"tid\":1,\"ts\":3,\"name\":\"a\"}",
         -1, NULL},
        {"{\"ph\":\"E\",\"pid\":0,\"tid\":1,\"ts\":3}", 0, "no open B"},
        {"{\"ph\":\"B\",\"pid\":0,\"tid\":1,\"ts\":0,\"name\":\"a\"},"
         "{\"ph\":\"B\",\"pid\":0,\"tid\":1,\"ts\":1,\"name\":\"b\"},"
         "{\"ph\":\"E\",\"pid\":0,\"tid\":1,\"ts\":2,\"name\":\"a\"},"
         "{\"ph\":\"E\",\"pid\":0,\"tid\":1,\"ts\":3}",
         2, "differs from the name"},
        {"{\"ph\":\"B\",\"pid\":0,\"tid\":1,\"ts\":0}", 0, "never ended"},
        {"{\"ph\":\"i\",\"pid\":0,\"tid\":1,\"ts\":0,\"s\":\"x\"}", 0, "scope"},
        {"{\"ph\":\"i\",\"ts\":0,\"s\":\"g\"}", -1, NULL},
        {"{\"ph\":\"C\",\"pid\":0,\"ts\":0,\"name\":\"m\",\"args\":{\"a\":1,\"b\":\"2\"}}", 0,
         "\"b\" is not"},
        {"{\"ph\":\"C\",\"pid\":0,\"ts\":0,\"name\":\"m\"}", 0, "\"args\" object"},
        {"{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"process_nam\",\"args\":{\"name\":\"x\"}}", 0,
         "unknown metadata"},
        {"{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":5}}", 0,
         "string args.name"},
        {"{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"thread_sort_index\",\"args\":{}}", 0,
         "sort_index"},
        {"{\"ph\":\"f\",\"bp\":\"e\",\"id\":7,\"cat\":\"a\",\"pid\":0,\"tid\":1,\"ts\":5},"
         "{\"ph\":\"s\",\"id\":7,\"cat\":\"a\",\"pid\":0,\"tid\":1,\"ts\":1}",
         -1, NULL},
        {"{\"ph\":\"s\",\"id\":7,\"cat\":\"a\",\"pid\":0,\"tid\":1,\"ts\":1},"
         "{\"ph\":\"f\",\"bp\":\"e\",\"id\":7,\"cat\":\"b\",\"pid\":0,\"tid\":1,\"ts\":5}",
         1, "no s (start)"},
        {"{\"ph\":\"f\",\"pid\":0,\"tid\":1,\"ts\":5}", 0, "needs an \"id\""},
        {"{\"ph\":\"s\",\"id\":1,\"bp\":\"x\",\"pid\":0,\"tid\":1,\"ts\":5}", 0, "\"bp\""},
        {"{\"ph\":\"b\",\"pid\":0,\"ts\":5,\"cat\":\"c\",\"name\":\"n\"}", 0, "\"id2\""},
        {"{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1e300,\"dur\":1}", 0, "out of range"},
    };
    char text[2048];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "{\"traceEvents\":[%s],\"displayTimeUnit\":\"ns\"}",
                 cases[i].events);
        ms_trace_check_info info;
        ms_error err = {0};
        ms_status st = ms_trace_check_mem(text, strlen(text), "t.json", &info, &err);
        if (cases[i].violation < 0) {
            if (st != MS_OK) fail_msg("case %zu: rejected: %s", i, err.msg);
            assert_int_equal(info.violation, SIZE_MAX);
        } else {
            if (st != MS_ERR_INVALID) fail_msg("case %zu: accepted", i);
            if (info.violation != (size_t)cases[i].violation || !strstr(err.msg, cases[i].msg))
                fail_msg("case %zu: violation %zu, message '%s'; wanted %ld with '%s'", i,
                         info.violation, err.msg, cases[i].violation, cases[i].msg);
            char where[32];
            snprintf(where, sizeof where, "event %ld", cases[i].violation);
            assert_non_null(strstr(err.msg, where));
        }
    }
    /* meshscope's own rules for pipeline slices, in its files only. */
    static const rule_case pipe_cases[] = {
        {"\"name\":\"F3\",\"args\":{\"action\":\"F\",\"stage\":1,\"micro-batch\":3,"
         "\"chunk\":0,\"model chunk\":1,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"step\":0,\"phase\":\"forward\"}",
         -1, NULL},
        {"\"name\":\"B3.1\",\"args\":{\"action\":\"B\",\"stage\":1,\"micro-batch\":3,"
         "\"chunk\":1,\"model chunk\":3,\"stages\":2,\"virtual stages\":2,"
         "\"micro-batches\":4,\"schedule\":\"interleaved\",\"phase\":\"backward\"}",
         -1, NULL},
        {"\"name\":\"W0\",\"args\":{\"action\":\"W\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":0,\"model chunk\":0,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"zb-h1\",\"phase\":\"backward\"}",
         -1, NULL},
        {"\"name\":\"F3\",\"args\":{\"action\":\"F\",\"stage\":2,\"micro-batch\":3,"
         "\"chunk\":0,\"model chunk\":2,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"phase\":\"forward\"}",
         1, "\"stage\" in [0, 1]"},
        {"\"name\":\"F4\",\"args\":{\"action\":\"F\",\"stage\":0,\"micro-batch\":4,"
         "\"chunk\":0,\"model chunk\":0,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"phase\":\"forward\"}",
         1, "\"micro-batch\" in [0, 3]"},
        {"\"name\":\"F0.2\",\"args\":{\"action\":\"F\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":2,\"model chunk\":4,\"stages\":2,\"virtual stages\":2,"
         "\"micro-batches\":4,\"schedule\":\"interleaved\",\"phase\":\"forward\"}",
         1, "\"chunk\" in [0, 1]"},
        {"\"name\":\"F0.1\",\"args\":{\"action\":\"F\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":1,\"model chunk\":1,\"stages\":2,\"virtual stages\":2,"
         "\"micro-batches\":4,\"schedule\":\"interleaved\",\"phase\":\"forward\"}",
         1, "model chunk 1 is not"},
        {"\"name\":\"F0\",\"args\":{\"action\":\"X\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":0,\"model chunk\":0,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"phase\":\"forward\"}",
         1, "args.action"},
        {"\"name\":\"W0\",\"args\":{\"action\":\"W\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":0,\"model chunk\":0,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"phase\":\"backward\"}",
         1, "only zb-h1"},
        {"\"name\":\"B0\",\"args\":{\"action\":\"B\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":0,\"model chunk\":0,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"phase\":\"forward\"}",
         1, "phase \"backward\""},
        {"\"name\":\"F1\",\"args\":{\"action\":\"F\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":0,\"model chunk\":0,\"stages\":2,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"phase\":\"forward\"}",
         1, "name must be \"F0\""},
        {"\"name\":\"F0\",\"args\":{\"action\":\"F\",\"stage\":0,\"micro-batch\":0,"
         "\"chunk\":0,\"model chunk\":0,\"stages\":0,\"virtual stages\":1,"
         "\"micro-batches\":4,\"schedule\":\"1f1b\",\"phase\":\"forward\"}",
         1, "\"stages\" in [1,"},
        {"\"name\":\"F0\"", 1, "\"args\" object"},
    };
    for (size_t i = 0; i < sizeof pipe_cases / sizeof pipe_cases[0]; i++) {
        /* A valid slice first, so that the case under test is event 1. */
        for (int own = 1; own >= 0; own--) {
            char first[1024];
            snprintf(first, sizeof first,
                     "{\"ph\":\"X\",\"cat\":\"pipeline\",\"pid\":0,\"tid\":1,\"ts\":0,"
                     "\"dur\":1,%s}",
                     pipe_cases[0].events);
            snprintf(text, sizeof text,
                     "{%s\"traceEvents\":[%s,{\"ph\":\"X\",\"cat\":\"pipeline\","
                     "\"pid\":0,\"tid\":2,\"ts\":0,\"dur\":1,%s}]}",
                     own ? "\"meshscope\":{\"format\":1}," : "", first, pipe_cases[i].events);
            ms_trace_check_info info;
            ms_error err = {0};
            ms_status st = ms_trace_check_mem(text, strlen(text), "p.json", &info, &err);
            if (pipe_cases[i].violation < 0 || !own) { /* others' files: no such rules */
                if (st != MS_OK) fail_msg("pipe case %zu (own %d): rejected: %s", i, own, err.msg);
            } else {
                if (st != MS_ERR_INVALID) fail_msg("pipe case %zu: accepted", i);
                if (info.violation != 1 || !strstr(err.msg, pipe_cases[i].msg))
                    fail_msg("pipe case %zu: violation %zu, message '%s'; wanted 1 with '%s'", i,
                             info.violation, err.msg, pipe_cases[i].msg);
            }
        }
    }

    /* File-level rules. */
    const char *bad_unit = "{\"traceEvents\":[],\"displayTimeUnit\":\"s\"}";
    ms_error err = {0};
    assert_int_equal(ms_trace_check_mem(bad_unit, strlen(bad_unit), "u.json", NULL, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "displayTimeUnit"));
}

/* Strings from a trace reach messages escaped: no terminal control from a file gets through. */
static void hardening_trace_strings_escaped(void **state) {
    (void)state;
    static const struct {
        const char *event, *want;
    } cases[] = {
        {"{\"ph\":\"\\u001b[2J\",\"pid\":0,\"tid\":1,\"ts\":0}", "unknown phase \"\\x1B[2J\""},
        {"{\"ph\":\"M\",\"pid\":0,\"name\":\"\\u001b]0;x\\u0007\",\"args\":{}}",
         "unknown metadata event name \"\\x1B]0;x\\x07\""},
        {"{\"ph\":\"C\",\"pid\":0,\"ts\":0,\"args\":{\"\\u009b31m\":\"a\"}}",
         "\"\\xC2\\x9B31m\" is not"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"traceEvents\":[%s]}", cases[i].event);
        ms_error err = {0};
        assert_int_equal(ms_trace_check_mem(text, strlen(text), "t.json", NULL, &err),
                         MS_ERR_INVALID);
        mt_expect_escaped(err.msg, cases[i].want);
    }
    /* A group name read from a trace, in the analysis' refusal of its ranks. */
    ms_group g = {.id = 3, .size = 1, .ranks = {MS_AN_MAX_RANKS + 5}};
    memcpy(g.name, "\x1b[31mdp\x1b[0m\x1b[2J!", sizeof g.name); /* fills it, unterminated */
    ms_event ev = {.kind = MS_EV_STEP, .rank = 0, .step = 0, .t0_ns = 0, .t1_ns = 10};
    ms_analysis a;
    ms_error err = {0};
    assert_int_equal(ms_analyze(&ev, 1, &g, 1, 0, 0, &a, &err), MS_ERR_UNSUPPORTED);
    mt_expect_escaped(err.msg, "group 3 ('\\x1B[31mdp\\x1B[0m\\x1B[2J!') lists rank");
}

/* A crafted trace with negative FLOPs and bytes: they read as unknown, never as negative
 * work in `trace summary`'s totals. */
/* The strategy a trace names comes from its degree groups only: a one-rank group of an
 * unnamed mesh dim ("d0") and "world" once leaked in ("d01 x dp2 x tp2"). */
static void strategy_text_from_groups(void **state) {
    (void)state;
    ms_group groups[] = {
        {.id = 0, .name = "world", .size = 4}, {.id = 1, .name = "d0", .size = 1},
        {.id = 2, .name = "tp", .size = 2},    {.id = 3, .name = "dp", .size = 2},
        {.id = 4, .name = "tp", .size = 2},    {.id = 5, .name = "dpx", .size = 3}};
    ms_trace t = {.groups = groups, .n_groups = 6};
    char text[64];
    ms_trace_strategy_text(&t, text, sizeof text);
    assert_string_equal(text, "dp2 x tp2");
    t.n_groups = 2;
    ms_trace_strategy_text(&t, text, sizeof text);
    assert_string_equal(text, "trace");
    ms_group cp[] = {{.id = 1, .name = "cp", .size = 4}, {.id = 2, .name = "dp", .size = 1}};
    t = (ms_trace){.groups = cp, .n_groups = 2};
    ms_trace_strategy_text(&t, text, sizeof text);
    assert_string_equal(text, "dp1 x cp4");
}

static void hardening_negative_counts(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "negative.json");
    size_t n;
    ms_event *ev = synth(2, 2, &n);
    size_t op = n;
    for (size_t i = 0; i < n && op == n; i++)
        if (ev[i].kind == MS_EV_OP) op = i;
    assert_true(op < n);
    ev[op].u.op.flops = -5e12;
    ev[op].u.op.bytes = -INFINITY;
    ms_error err = {0};
    if (ms_trace_write(path, ev, n, k_groups, N_GROUPS, NULL, &err) != MS_OK)
        fail_msg("%s", err.msg);
    ms_trace t;
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < t.n_events; i++)
        if (t.events[i].kind == MS_EV_OP)
            if (t.events[i].u.op.flops < 0 || t.events[i].u.op.bytes < 0)
                fail_msg("event %zu reads back with flops %g, bytes %g", i, t.events[i].u.op.flops,
                         t.events[i].u.op.bytes);
    ms_trace_free(&t);
    free(ev);
    unlink(path);
}

/* --- bad and foreign input ------------------------------------------------------------------ */

typedef struct bad_case {
    const char *text;
    const char *msg;
    bool reader_only; /* the validator stops earlier, at an event rule */
} bad_case;

static void bad_inputs(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"", "not a Chrome trace (no traceEvents array)", false},
        {"   \n", "not a Chrome trace (no traceEvents array)", false},
        {"{}", "not a Chrome trace (no traceEvents array)", false},
        {"{\"name\": \"x\", \"values\": [1, 2, {\"a\": null}]}",
         "not a Chrome trace (no traceEvents array)", false},
        {"[{\"ph\":\"X\"}]", "JSON Array Format", false},
        {"hello", "does not start with a JSON object", false},
        {"{\"traceEvents\": 5}", "traceEvents is not an array", false},
        {"{\"traceEvents\": [{\"ph\":\"X\"} {\"ph\":\"X\"}]}", "byte 28: expected ',' or ']'",
         true},
        {"{\"traceEvents\": [] \"x\": 1}", "byte 19: expected ',' or '}'", false},
        {"{\"traceEvents\": [{\"ph\":\"X\",}]}", "expected '\"' to start a member name", false},
        {"{\"traceEvents\": [{\"ph\":\"X\"", "byte 26: unexpected end of file (truncated?)", false},
        {"{\"traceEvents\": [", "unexpected end of file", false},
        {"{\"traceEvents\": []", "unexpected end of file", false},
        {"{\"traceEvents\": []} x", "trailing data", false},
        {"{\"traceEvents\": [], \"traceEvents\": []}", "second traceEvents", false},
        {"{\"traceEvents\": [{\"name\":\"a\x01\"}]}", "control character", false},
        {"{\"traceEvents\": [{\"name\":\"\\q\"}]}", "valid escape", false},
        {"{\"traceEvents\": [{\"ts\":01}]}", "expected ',' or '}'", false},
        {"{\"traceEvents\": [{\"ts\":1.}]}", "digit after '.'", false},
        {"{\"traceEvents\": [{\"ts\":-}]}", "digit in a number", false},
        {"{\"traceEvents\": [tru]}", "expected 'true'", false},
        {"{\"traceEvents\": [{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
         "[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}]"
         "}",
         "nested more than 64", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *text = cases[i].text;
        ms_trace t;
        ms_error err = {0};
        ms_status st = ms_trace_read_mem(text, strlen(text), "x.json", &t, &err);
        if (st != MS_ERR_INVALID || !strstr(err.msg, cases[i].msg) ||
            strncmp(err.msg, "x.json: ", 8))
            fail_msg("read case %zu: status %d, message '%s'; wanted '%s'", i, st, err.msg,
                     cases[i].msg);
        assert_null(t.events);
        ms_error err2 = {0};
        st = ms_trace_check_mem(text, strlen(text), "x.json", NULL, &err2);
        if (st != MS_ERR_INVALID || (!cases[i].reader_only && !strstr(err2.msg, cases[i].msg)))
            fail_msg("check case %zu: status %d, message '%s'; wanted '%s'", i, st, err2.msg,
                     cases[i].msg);
    }
    /* Missing files and folders: an i/o error naming the path. */
    char path[128];
    path_in(path, sizeof path, "missing.json");
    ms_trace t;
    ms_error err = {0};
    assert_int_equal(ms_trace_read(path, &t, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(ms_trace_check(g_dir, NULL, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "folder"));

    /* Every truncation of a valid file fails cleanly, in both the reader and the validator. */
    path_in(path, sizeof path, "trunc.json");
    write_synth(path, 2, 1);
    size_t len;
    char *text = slurp(path, &len);
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
    for (size_t cut = 0; cut < len; cut++) {
        char *part = malloc(cut ? cut : 1); /* exact size, so ASan sees any over-read */
        memcpy(part, text, cut);
        ms_error e1 = {0}, e2 = {0};
        if (ms_trace_read_mem(part, cut, "cut.json", &t, &e1) != MS_ERR_INVALID)
            fail_msg("a file cut at %zu of %zu bytes was read", cut, len);
        if (ms_trace_check_mem(part, cut, "cut.json", NULL, &e2) != MS_ERR_INVALID)
            fail_msg("a file cut at %zu of %zu bytes was accepted", cut, len);
        free(part);
    }
    free(text);
}

/* A PyTorch/Kineto-style trace: steps, GPU kernels and collectives are read; nested CPU ops,
 * the CPU-side collective record, flows, instants and metadata are ignored; the validator
 * accepts it (nested slices are legal). */
static void foreign_kineto(void **state) {
    (void)state;
    static const char text[] =
        "{\"schemaVersion\": 1, \"deviceProperties\": [{\"id\": 0, \"name\": \"NVIDIA H100\"}],\n"
        " \"distributedInfo\": {\"backend\": \"nccl\", \"rank\": 1, \"world_size\": 2,\n"
        "   \"pg_config\": [{\"pg_name\": \"0\", \"pg_desc\": \"default_pg\", \"pg_size\": 2,\n"
        "                   \"ranks\": [0, 1]}]},\n"
        " \"traceEvents\": [\n"
        "  {\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#5\", \"pid\": 77,"
        "   \"tid\": 77, \"ts\": 1700000000000100.5, \"dur\": 1000},\n"
        "  {\"ph\": \"X\", \"cat\": \"gpu_user_annotation\", \"name\": \"ProfilerStep#5\","
        "   \"pid\": 0, \"tid\": 7, \"ts\": 1700000000000101, \"dur\": 990},\n"
        "  {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::linear\", \"pid\": 77, \"tid\": "
        "77,"
        "   \"ts\": 1700000000000105, \"dur\": 80, \"args\": {\"External id\": 3}},\n"
        "  {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"pid\": 77, \"tid\": 77,"
        "   \"ts\": 1700000000000110, \"dur\": 50},\n"
        "  {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"record_param_comms\", \"pid\": 77,"
        "   \"tid\": 77, \"ts\": 1700000000000300, \"dur\": 10, \"args\": {\"Collective name\":"
        "   \"allreduce\", \"In msg nelems\": 1024, \"Out msg nelems\": 1024, \"Group size\": 2,"
        "   \"dtype\": \"Float\", \"Process Group Name\": \"0\", \"Process Group Ranks\": \"[0, "
        "1]\"}},\n"
        "  {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"sm90_xmma_gemm\", \"pid\": 0, \"tid\": "
        "7,"
        "   \"ts\": 1700000000000120, \"dur\": 20.25, \"args\": {\"stream\": 7}},\n"
        "  {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"ncclDevKernel_AllReduce_Sum_f32\","
        "   \"pid\": 0, \"tid\": 20, \"ts\": 1700000000000310, \"dur\": 100, \"args\": {"
        "   \"Collective name\": \"allreduce\", \"In msg nelems\": 1024, \"Out msg nelems\": 1024,"
        "   \"Group size\": 2, \"dtype\": \"BFloat16\", \"Process Group Name\": \"0\","
        "   \"Process Group Ranks\": [0, 1], \"Seq\": 4}},\n"
        "  {\"ph\": \"f\", \"id\": 1, \"pid\": 0, \"tid\": 7, \"ts\": 1700000000000120,"
        "   \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"},\n"
        "  {\"ph\": \"s\", \"id\": 1, \"pid\": 77, \"tid\": 77, \"ts\": 1700000000000111,"
        "   \"cat\": \"ac2g\", \"name\": \"ac2g\"},\n"
        "  {\"ph\": \"i\", \"name\": \"[memory]\", \"pid\": 77, \"tid\": 77,"
        "   \"ts\": 1700000000000111, \"s\": \"t\", \"args\": {\"Total Allocated\": 100}},\n"
        "  {\"ph\": \"M\", \"name\": \"process_name\", \"pid\": 0, \"tid\": 0,"
        "   \"args\": {\"name\": \"python\"}},\n"
        "  {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"weird\", \"pid\": 0, \"tid\": 9,"
        "   \"ts\": \"soon\", \"dur\": 1}\n"
        " ],\n"
        " \"traceName\": \"x.json\", \"displayTimeUnit\": \"ms\", \"baseTimeNanoseconds\": 1000}\n";
    ms_trace t;
    ms_error err = {0};
    if (ms_trace_read_mem(text, strlen(text), "kineto.json", &t, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_false(t.meshscope);
    assert_int_equal(t.rank, 1);
    assert_int_equal(t.world_size, 2);
    assert_int_equal(t.n_trace_events, 12);
    assert_int_equal(t.n_events, 3);
    assert_int_equal(t.n_ignored, 9);
    assert_int_equal(t.n_groups, 1);
    assert_string_equal(t.groups[0].name, "default_pg");
    const ms_event *st = &t.events[0], *k = &t.events[1], *c = &t.events[2];
    assert_int_equal(st->kind, MS_EV_STEP);
    assert_int_equal(st->step, 5);
    assert_int_equal(st->rank, 1);
    assert_int_equal(st->t0_ns, 1700000000000100500LL + 1000);
    assert_int_equal(st->t1_ns, 1700000000001100500LL + 1000);
    assert_int_equal(k->kind, MS_EV_OP);
    assert_int_equal(k->step, 5);
    assert_int_equal(k->t1_ns - k->t0_ns, 20250);
    assert_string_equal(k->u.op.name, "sm90_xmma_gemm");
    assert_int_equal(c->kind, MS_EV_COLL);
    assert_int_equal(c->u.coll.coll, MS_COLL_ALL_REDUCE);
    assert_int_equal(c->u.coll.bytes, 2048);
    assert_int_equal(c->u.coll.group, t.groups[0].id);
    assert_int_equal(c->u.coll.group_rank, 1);
    assert_int_equal(c->u.coll.seq, 4);
    assert_int_equal(c->step, 5);
    ms_trace_free(&t);

    /* Valid except for the last event's string ts, which the validator reports. */
    ms_trace_check_info info;
    assert_int_equal(ms_trace_check_mem(text, strlen(text), "kineto.json", &info, &err),
                     MS_ERR_INVALID);
    assert_int_equal(info.violation, 11);
    assert_non_null(strstr(err.msg, "numeric \"ts\""));
}

/* --- durable writes ------------------------------------------------------------------------- */

static void failed_write_keeps_old(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "durable.json");
    write_synth(path, 2, 2);
    size_t len0;
    char *before = slurp(path, &len0);
    size_t n;
    ms_event *ev = synth(4, 3, &n);
    static const ms_io_fault faults[] = {MS_IO_FAULT_WRITE, MS_IO_FAULT_FSYNC, MS_IO_FAULT_RENAME};
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
        ms_error err = {0};
        ms_io_inject_fault(faults[f], 5000);
        ms_status st = ms_trace_write(path, ev, n, k_groups, N_GROUPS, NULL, &err);
        ms_io_inject_fault(MS_IO_FAULT_NONE, 0);
        assert_int_equal(st, MS_ERR_IO);
        if (!strstr(err.msg, path)) fail_msg("message does not name the path: %s", err.msg);
        size_t len1;
        char *after = slurp(path, &len1);
        assert_int_equal(len0, len1);
        assert_memory_equal(before, after, len0);
        free(after);
        assert_int_equal(count_temps(), 0);
    }
    /* A folder that does not exist. */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/folder/t.json", g_dir);
    ms_error err = {0};
    assert_int_equal(ms_trace_write(bad, ev, n, k_groups, N_GROUPS, NULL, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, bad));
    /* Bad arguments. */
    assert_int_equal(ms_trace_write(NULL, ev, n, NULL, 0, NULL, &err), MS_ERR_INVALID);
    ev[0].kind = 200;
    assert_int_equal(ms_trace_write(path, ev, n, NULL, 0, NULL, &err), MS_ERR_INVALID);
    free(ev);
    free(before);
}

/* --- a million events: written, read back and checked ----------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void export_million(void **state) {
    (void)state;
    char path[128];
    path_in(path, sizeof path, "million.json");
    enum { N = 1000000 };
    ms_event *ev = malloc(sizeof *ev * (N + 16));
    assert_non_null(ev);
    size_t n = 0;
    for (int64_t s = 0; n < N; s++)
        for (int r = 0; r < 8 && n < N; r++) n = synth_step(ev, n, r, s, BASE_NS);
    n = N;
    ms_error err = {0};
    double t0 = now_s();
    if (ms_trace_write(path, ev, n, k_groups, N_GROUPS, NULL, &err) != MS_OK)
        fail_msg("%s", err.msg);
    double t1 = now_s();
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    /* The figures are information: speed is measured in bench/, on a quiet machine, not
     * asserted in a test that shares the cores with the rest of the suite. */
    printf("export: %d events, %.1f MB, %.3f s (%.2f M events/s)\n", N, sb.st_size / 1e6, t1 - t0,
           N / (t1 - t0) / 1e6);

    ms_trace t;
    double t2 = now_s();
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    double t3 = now_s();
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < n; i += 9973) assert_same_event(&ev[i], &t.events[i], i);
    ms_trace_free(&t);
    ms_trace_check_info info;
    if (ms_trace_check(path, &info, &err) != MS_OK) fail_msg("%s", err.msg);
    double t4 = now_s();
    printf("read: %.3f s, check: %.3f s (%zu trace events)\n", t3 - t2, t4 - t3, info.n_events);
    unlink(path);
    free(ev);
}

/* --- the command line ------------------------------------------------------------------------ */

static int run_cmd(int argc, const char **argv) {
    return ms_cmd_trace(argc, (char **)argv);
}

/* Writes the events of one rank to a per-rank file, with that rank's own group ids (each
 * rank numbers its groups from 0: the merge must map them). */
static void write_rank_file(const char *path, int rank) {
    size_t n;
    ms_event *all = synth(4, 2, &n);
    ms_event *mine = malloc(sizeof *mine * n);
    size_t k = 0;
    ms_group g[2];
    g[0] = k_groups[rank / 2];     /* tp */
    g[1] = k_groups[2 + rank % 2]; /* dp */
    g[0].id = 0;
    g[1].id = 1;
    for (size_t i = 0; i < n; i++) {
        if (all[i].rank != rank) continue;
        mine[k] = all[i];
        if (mine[k].kind == MS_EV_COLL && mine[k].u.coll.group != 99)
            mine[k].u.coll.group = mine[k].u.coll.mesh_dim == 1 ? 0 : 1;
        k++;
    }
    ms_trace_meta meta = {.backend = "mpi", .rank = rank, .world_size = 4};
    ms_error err = {0};
    if (ms_trace_write(path, mine, k, g, 2, &meta, &err) != MS_OK) fail_msg("%s", err.msg);
    free(mine);
    free(all);
}

static void cli(void **state) {
    (void)state;
    char r[4][128], out[128], bad[128], foreign[128];
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "rank%d.json", i);
        path_in(r[i], sizeof r[i], name);
        write_rank_file(r[i], i);
    }
    path_in(out, sizeof out, "merged.json");
    const char *merge[] = {"trace", "merge", r[0], r[1], r[2], r[3], "-o", out};
    assert_int_equal(run_cmd(8, merge), 0);
    ms_trace t;
    ms_error err = {0};
    if (ms_trace_read(out, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.world_size, 4);
    assert_string_equal(t.backend, "mpi");
    assert_int_equal(t.n_groups, 4); /* tp{0,1} tp{2,3} dp{0,2} dp{1,3} */
    size_t n;
    ms_event *want = synth(4, 2, &n);
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < n; i++) {
        const ms_event *e = &t.events[i];
        assert_int_equal(e->rank, want[i].rank); /* files in rank order, events in order */
        if (e->kind != MS_EV_COLL || want[i].u.coll.group == 99) continue;
        const ms_group *g = NULL;
        for (int k = 0; k < t.n_groups; k++)
            if (t.groups[k].id == e->u.coll.group) g = &t.groups[k];
        assert_non_null(g);
        const ms_group *w = &k_groups[want[i].u.coll.group];
        assert_string_equal(g->name, w->name);
        assert_memory_equal(g->ranks, w->ranks, 2 * sizeof(int32_t));
    }
    ms_trace_free(&t);
    free(want);
    assert_int_equal(ms_trace_check(out, NULL, &err), MS_OK);

    const char *check_ok[] = {"trace", "check", out};
    assert_int_equal(run_cmd(3, check_ok), 0);
    const char *summary[] = {"trace", "summary", out, "--steps", "0:1"};
    assert_int_equal(run_cmd(5, summary), 0);
    const char *summary_all[] = {"trace", "summary", r[2]};
    assert_int_equal(run_cmd(3, summary_all), 0);

    /* Bad input: exit 1 with a message, never a crash. */
    path_in(bad, sizeof bad, "bad.json");
    spit(bad, "{\"traceEvents\": [{\"ph\": \"X\", \"pid\": 0, \"tid\": 1, \"ts\": 0, \"dur\": 5},");
    path_in(foreign, sizeof foreign, "foreign.json");
    spit(foreign, "{\"data\": [1, 2, 3]}");
    const char *check_bad[] = {"trace", "check", bad};
    assert_int_equal(run_cmd(3, check_bad), 1);
    const char *summary_bad[] = {"trace", "summary", foreign};
    assert_int_equal(run_cmd(3, summary_bad), 1);
    const char *summary_missing[] = {"trace", "summary", "/nonexistent/x.json"};
    assert_int_equal(run_cmd(3, summary_missing), 1);
    const char *merge_bad[] = {"trace", "merge", r[0], bad, "-o", out};
    assert_int_equal(run_cmd(6, merge_bad), 1);
    const char *merge_dup[] = {"trace", "merge", r[0], r[1], r[0], "-o", out};
    assert_int_equal(run_cmd(7, merge_dup), 1);
    const char *merge_self[] = {"trace", "merge", r[0], r[1], "-o", r[1]};
    assert_int_equal(run_cmd(6, merge_self), 1);
    /* The refused merges left the output as it was. */
    assert_int_equal(ms_trace_check(out, NULL, &err), MS_OK);
    assert_int_equal(ms_trace_check(r[1], NULL, &err), MS_OK);

    /* Usage errors: exit 2. */
    const char *u1[] = {"trace"};
    assert_int_equal(run_cmd(1, u1), 2);
    const char *u2[] = {"trace", "frobnicate"};
    assert_int_equal(run_cmd(2, u2), 2);
    const char *u3[] = {"trace", "merge", r[0], r[1]};
    assert_int_equal(run_cmd(4, u3), 2);
    const char *u4[] = {"trace", "summary", out, "--steps", "5:2"};
    assert_int_equal(run_cmd(5, u4), 2);
    const char *u5[] = {"trace", "summary", out, "--steps", "x"};
    assert_int_equal(run_cmd(5, u5), 2);
    const char *u6[] = {"trace", "check"};
    assert_int_equal(run_cmd(2, u6), 2);
    const char *u7[] = {"trace", "merge", r[0], "-o"};
    assert_int_equal(run_cmd(4, u7), 2);
}

/* --- many process groups -------------------------------------------------------------- */

/* A Kineto trace of rank 0 with MANY_GROUPS process groups named "0", "1", ... (Kineto's
 * pg_name is an id): the first half listed in pg_config, [0, p]; the other half only named
 * by the collectives, each with rank list [0, a, b] of its own. MANY_COLLS all-reduces go
 * round the groups in order, group g's with 1 + g float elements. */
#define MANY_GROUPS 65536
#define MANY_COLLS  (4 * MANY_GROUPS)
#define MANY_LISTED (MANY_GROUPS / 2)

static int many_ranks(int g, int32_t *r) {
    r[0] = 0;
    if (g < MANY_LISTED) {
        r[1] = 1 + g % 255;
        return 2;
    }
    int j = g - MANY_LISTED;
    r[1] = 1 + j % 255;
    r[2] = 1 + j / 255;
    return 3;
}

static void put_ranks(FILE *f, int g) {
    int32_t r[3];
    int n = many_ranks(g, r);
    fputc('[', f);
    for (int k = 0; k < n; k++) fprintf(f, "%s%d", k ? ", " : "", (int)r[k]);
    fputc(']', f);
}

static void write_many_groups(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"schemaVersion\": 1, \"distributedInfo\": {\"backend\": \"nccl\", \"rank\": 0,"
               " \"world_size\": 256, \"pg_config\": [");
    for (int g = 0; g < MANY_LISTED; g++) {
        fprintf(f,
                "%s\n{\"pg_name\": \"%d\", \"pg_desc\": \"undefined\", \"pg_size\": 2, \"ranks\": ",
                g ? "," : "", g);
        put_ranks(f, g);
        fputc('}', f);
    }
    fprintf(f,
            "]},\n\"traceEvents\": [\n{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": "
            "\"ProfilerStep#1\", \"pid\": 1, \"tid\": 1, \"ts\": 0, \"dur\": %d}",
            2 * MANY_COLLS + 2);
    for (int i = 0; i < MANY_COLLS; i++) {
        int g = i % MANY_GROUPS;
        int32_t r[3];
        fprintf(f,
                ",\n{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"ncclDevKernel_AllReduce\", "
                "\"pid\": 0, \"tid\": 7, \"ts\": %d, \"dur\": 1, \"args\": {\"Collective name\": "
                "\"allreduce\", \"In msg nelems\": %d, \"Out msg nelems\": %d, \"Group size\": %d, "
                "\"dtype\": \"Float\", \"Process Group Name\": \"%d\", \"Process Group Ranks\": \"",
                2 * i + 1, 1 + g, 1 + g, many_ranks(g, r), g);
        put_ranks(f, g);
        fprintf(f, "\"}}");
    }
    fprintf(f, "\n], \"baseTimeNanoseconds\": 1000}\n");
    assert_int_equal(fclose(f), 0);
}

/* Every collective of t on the group the file named, with its bytes: g's ids, names and rank
 * lists as written, and the bytes per group summed. */
static void check_many_groups(const ms_trace *t) {
    assert_int_equal(t->n_groups, MANY_GROUPS);
    const ms_group **by_id = calloc(MANY_GROUPS, sizeof *by_id);
    uint64_t *bytes = calloc(MANY_GROUPS, sizeof *bytes);
    assert_true(by_id && bytes);
    for (int i = 0; i < t->n_groups; i++) {
        const ms_group *g = &t->groups[i];
        assert_true(g->id >= 0 && g->id < MANY_GROUPS && !by_id[g->id]);
        by_id[g->id] = g;
    }
    size_t n_coll = 0;
    for (size_t i = 0; i < t->n_events; i++) {
        const ms_event *e = &t->events[i];
        if (e->kind != MS_EV_COLL) continue;
        int want = (int)(n_coll++ % MANY_GROUPS);
        assert_true(e->u.coll.group >= 0 && e->u.coll.group < MANY_GROUPS);
        const ms_group *g = by_id[e->u.coll.group];
        char name[16];
        snprintf(name, sizeof name, "%d", want);
        if (strcmp(g->name, name))
            fail_msg("collective %zu on group '%s', not '%s'", i, g->name, name);
        int32_t r[3];
        assert_int_equal(g->size, many_ranks(want, r));
        assert_memory_equal(g->ranks, r, sizeof *r * (size_t)g->size);
        assert_int_equal(e->u.coll.group_rank, 0);
        bytes[want] += e->u.coll.bytes;
    }
    assert_int_equal(n_coll, MANY_COLLS);
    for (int g = 0; g < MANY_GROUPS; g++)
        if (bytes[g] != (uint64_t)(MANY_COLLS / MANY_GROUPS) * 4 * (uint64_t)(1 + g))
            fail_msg("group %d: %llu bytes", g, (unsigned long long)bytes[g]);
    free(by_id);
    free(bytes);
}

/* Runs `meshscope trace ARGS` with its standard output in the file out. */
static int run_cmd_to(int argc, const char **argv, const char *out) {
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    FILE *f = fopen(out, "w");
    assert_true(saved >= 0 && f);
    dup2(fileno(f), STDOUT_FILENO);
    int rc = run_cmd(argc, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    fclose(f);
    return rc;
}

/* Group resolution once scanned every known group for each collective (and the merge every
 * group for each event): with 65536 groups, `trace summary` of a million collectives took
 * minutes where `trace check` took a second. The lookups are hashed now. The work is asserted
 * as a count, not a time: a few lookups per collective and under 3 table slots per lookup,
 * where a scan compared some 32768 names per collective. (Were a scan back, the read alone
 * would also take minutes, past the test's timeout.) */
static void hardening_many_groups(void **state) {
    (void)state;
    char path[128], merged[128], text[128];
    path_in(path, sizeof path, "many-groups.json");
    path_in(merged, sizeof merged, "many-groups-merged.json");
    path_in(text, sizeof text, "many-groups.txt");
    write_many_groups(path);
    ms_trace t;
    ms_error err = {0};
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.n_events, MANY_COLLS + 1);
    check_many_groups(&t);
    printf("read: %llu group lookups, %llu probes for %d collectives\n",
           (unsigned long long)t.n_group_lookups, (unsigned long long)t.n_group_probes, MANY_COLLS);
    assert_true(t.n_group_lookups >= MANY_COLLS && t.n_group_lookups <= 4 * (uint64_t)MANY_COLLS);
    assert_true(t.n_group_probes <= 3 * t.n_group_lookups);

    /* The merge maps each event's group through the same kind of index. */
    ms_trace_merge m = {0};
    if (ms_trace_merge_add(&m, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(m.n_groups, MANY_GROUPS);
    assert_int_equal(m.n_events, t.n_events);
    printf("merge: %llu group lookups, %llu probes\n", (unsigned long long)m.n_group_lookups,
           (unsigned long long)m.n_group_probes);
    assert_true(m.n_group_lookups <= 2 * (uint64_t)MANY_COLLS);
    assert_true(m.n_group_probes <= 3 * m.n_group_lookups);
    ms_trace_merge_free(&m);
    ms_trace_free(&t);

    /* The commands: the summary counts every group and collective; the merged file has them
     * all, each collective on its group with its bytes. */
    const char *summary[] = {"trace", "summary", path};
    assert_int_equal(run_cmd_to(3, summary, text), 0);
    char *out = slurp(text, NULL);
    char want[320];
    snprintf(want, sizeof want, "%s: %d events read (%d trace events, 0 not used), %d groups", path,
             MANY_COLLS + 1, MANY_COLLS + 1, MANY_GROUPS);
    if (!strstr(out, want)) fail_msg("the summary does not say \"%s\"", want);
    free(out);
    const char *merge[] = {"trace", "merge", path, "-o", merged};
    assert_int_equal(run_cmd_to(5, merge, text), 0);
    out = slurp(text, NULL);
    snprintf(want, sizeof want, "%s: %d events from 1 file, 1 rank, %d groups", merged,
             MANY_COLLS + 1, MANY_GROUPS);
    if (!strstr(out, want)) fail_msg("the merge does not say \"%s\": %s", want, out);
    free(out);
    if (ms_trace_read(merged, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_true(t.meshscope);
    check_many_groups(&t);
    ms_trace_free(&t);
    unlink(path);
    unlink(merged);
    unlink(text);
}

/* GPU activity as CUPTI delivers it: kernels and a copy on two streams of one GPU, runtime
 * calls on the host, correlated with the engine ops that launched them; one copy launched
 * outside any op; all stamped with the collector's rank (0) and a late step (9). */
static size_t synth_gpu(ms_event *ev) {
    size_t n = 0;
    for (int r = 0; r < 2; r++) {
        ev[n++] = (ms_event){.kind = MS_EV_STEP,
                             .rank = r,
                             .step = 4,
                             .t0_ns = BASE_NS,
                             .t1_ns = BASE_NS + 10000000};
        for (int k = 0; k < 2; k++) {
            uint64_t corr = ((uint64_t)r << 40) | (uint64_t)(k + 1);
            ms_event op = {.kind = MS_EV_OP,
                           .rank = r,
                           .step = 4,
                           .t0_ns = BASE_NS + 1000000 * (k + 1),
                           .t1_ns = BASE_NS + 1000000 * (k + 1) + 20000};
            op.u.op.op = k ? MS_OP_GELU : MS_OP_MATMUL;
            snprintf(op.u.op.name, sizeof op.u.op.name, "h.0.op%d", k);
            snprintf(op.u.op.opname, sizeof op.u.op.opname, k ? "gelu" : "matmul");
            op.u.op.corr = corr;
            ev[n++] = op;
            ms_event api = op;
            api.rank = 0, api.step = 9, api.t1_ns = api.t0_ns + 5000;
            api.u.op = (ms_ev_op){.op = -1, .corr = corr, .gpu = MS_GPU_API};
            snprintf(api.u.op.name, sizeof api.u.op.name, "cudaLaunchKernel");
            snprintf(api.u.op.opname, sizeof api.u.op.opname, "cuda_runtime");
            ev[n++] = api;
            ms_event kern = api;
            kern.t0_ns = op.t0_ns + 30000, kern.t1_ns = op.t0_ns + 400000;
            kern.u.op.gpu = MS_GPU_KERNEL, kern.u.op.device = 0, kern.u.op.stream = 7 + r;
            snprintf(kern.u.op.name, sizeof kern.u.op.name, k ? "gelu_fwd" : "sgemm_128x64");
            snprintf(kern.u.op.opname, sizeof kern.u.op.opname, "cuda_kernel");
            ev[n++] = kern;
        }
    }
    ms_event cp = {.kind = MS_EV_OP,
                   .rank = 0,
                   .step = 9,
                   .t0_ns = BASE_NS + 5000000,
                   .t1_ns = BASE_NS + 5100000};
    cp.u.op = (ms_ev_op){.op = -1, .gpu = MS_GPU_MEMCPY, .device = 0, .stream = 7, .bytes = 4096};
    snprintf(cp.u.op.name, sizeof cp.u.op.name, "HtoD");
    snprintf(cp.u.op.opname, sizeof cp.u.op.opname, "cuda_memcpy");
    ev[n++] = cp;
    return n;
}

/* The collector's events take the rank and step of the op that launched them (or, without a
 * correlation, the step whose span holds them); the trace puts kernels and copies on a thread
 * per GPU stream in Kineto's categories, links each op to its kernel with an "ac2g" flow, and
 * passes the validator; the reader gives every field back; analysis counts the kernels, not
 * the launches, as the GPU ranks' compute. */
static void gpu_activity(void **state) {
    (void)state;
    ms_event ev[32];
    size_t n = synth_gpu(ev);
    assert_int_equal(ms_gpu_attribute(ev, n), 9); /* every GPU event but none of the ops */
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind != MS_EV_OP || ev[i].u.op.gpu == MS_GPU_NONE) continue;
        assert_int_equal(ev[i].step, 4);
        if (ev[i].u.op.corr) assert_int_equal(ev[i].rank, MS_EV_CORR_RANK(ev[i].u.op.corr));
    }
    char path[128];
    path_in(path, sizeof path, "gpu.json");
    ms_error err = {0};
    ms_trace_meta meta = {.world_size = 2};
    assert_int_equal(ms_trace_write(path, ev, n, NULL, 0, &meta, &err), MS_OK);
    if (ms_trace_check(path, NULL, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_trace t;
    if (ms_trace_read(path, &t, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(t.n_events, n);
    for (size_t i = 0; i < n; i++) {
        assert_same_event(&ev[i], &t.events[i], i);
        if (ev[i].kind != MS_EV_OP) continue;
        assert_int_equal(t.events[i].u.op.gpu, ev[i].u.op.gpu);
        assert_true(t.events[i].u.op.corr == ev[i].u.op.corr);
        if (ev[i].u.op.gpu == MS_GPU_KERNEL)
            assert_int_equal(t.events[i].u.op.stream, ev[i].u.op.stream);
    }
    ms_trace_free(&t);

    size_t len;
    char *text = slurp(path, &len);
    cJSON *root = parse_whole(text, len);
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
    int kernels = 0, copies = 0, starts = 0, ends = 0;
    cJSON_ArrayForEach(e, evs) {
        const char *cat = jstr(e, "cat"), *ph = jstr(e, "ph");
        if (!cat) continue;
        int pid = (int)jnum(e, "pid"), tid = (int)jnum(e, "tid");
        if (!strcmp(ph, "X") && (!strcmp(cat, "kernel") || !strcmp(cat, "gpu_memcpy"))) {
            char want[48];
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
            snprintf(want, sizeof want, "GPU 0 stream %d", (int)jnum(a, "stream"));
            assert_string_equal(thread_name_of(evs, pid, tid), want);
            kernels += !strcmp(cat, "kernel");
            copies += !strcmp(cat, "gpu_memcpy");
        }
        /* host calls: the rank's compute lane (a track of its own where they nest in an op) */
        if (!strcmp(cat, "cuda_runtime"))
            assert_true(!strncmp(thread_name_of(evs, pid, tid), "compute", 7));
        if (!strcmp(cat, "ac2g")) {
            starts += !strcmp(ph, "s");
            ends += !strcmp(ph, "f");
            if (!strcmp(ph, "s")) assert_string_equal(thread_name_of(evs, pid, tid), "compute");
        }
    }
    assert_int_equal(kernels, 4);
    assert_int_equal(copies, 1);
    assert_int_equal(starts, 4); /* one per correlated kernel; the copy has no op */
    assert_int_equal(ends, 4);
    cJSON_Delete(root);
    free(text);

    /* Compute on a GPU rank is its kernels' time (4 x 370 us over two ranks), not the ops'. */
    ms_analysis an;
    if (ms_analyze(ev, n, NULL, 0, 0, -1, &an, &err) != MS_OK) fail_msg("%s", err.msg);
    double compute = 0;
    for (int r = 0; r < an.nranks; r++) compute += an.overlap[r].compute_s;
    assert_true(fabs(compute - 4 * 370e-6) < 1e-9);
    ms_analysis_free(&an);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(roundtrip),
    cmocka_unit_test(pipeline_slices),
    cmocka_unit_test(gpu_activity),
    cmocka_unit_test(kineto_layout),
    cmocka_unit_test(strings_and_utf8),
    cmocka_unit_test(heavy_overlap),
    cmocka_unit_test(validator_rules),
    cmocka_unit_test(bad_inputs),
    cmocka_unit_test(foreign_kineto),
    cmocka_unit_test(failed_write_keeps_old),
    cmocka_unit_test(cli),
    cmocka_unit_test(export_million),
    cmocka_unit_test(strategy_text_from_groups),
    cmocka_unit_test(hardening_negative_counts),
    cmocka_unit_test(hardening_trace_strings_escaped),
    cmocka_unit_test(hardening_many_groups),
};

int main(int argc, char **argv) {
    mt_apply_filter(argc, argv);
    return cmocka_run_group_tests_name("traces", tests, setup_dir, remove_dir);
}

/* test_device_fenced.c - the distributed layer on memory the host cannot touch.
 *
 * Every rank's device is the fenced device (engine/core/device.h): any host read or write of
 * its memory faults, as a GPU's would. So these tests prove that the communicators (which
 * stage device memory through the host, comm.h), the reshard executor, the cross-mesh reshard
 * and ms_dtensor_shard / ms_dtensor_full touch tensors only through the device's copies:
 *   - each collective, blocking and not, f32 and bf16, on device buffers gives, bit for bit,
 *     what the same collective gives on host buffers on the same communicator (the host run is
 *     also the check that host buffers still pass straight through a communicator that has a
 *     device);
 *   - every pair of placements on meshes [2], [4] and [2,2] (every step kind: all_reduce,
 *     reduce_scatter, all_gather, all_to_all, slice, partialize, counted and required), in f32
 *     (ms_reshard) and bf16 (ms_reshard_run_dt), and cross-mesh transfers, leave on every rank
 *     the slice of an independently built global tensor;
 *   - training on the fenced device equals training on the CPU bit for bit (losses, validation
 *     loss, every final parameter): one rank, dp2, tp2, dp2 x tp2, tp2 + sp, cp2, ZeRO 1, 2
 *     (bucketed) and 3 on dp2, bf16 on dp2 (bucketed), dp2 x tp2 + sp with ZeRO 3, bf16 dp4
 *     with ZeRO 2, pp2 (1f1b), and a save + resume. The cases of 4 ranks end in _w4 (what an
 *     mpirun of 4 processes runs).
 * The same file runs on the threads backend and under mpirun.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "engine/core/xalloc.h"
#include "engine/dist/dtensor.h"
#include "engine/dist/reshard.h"
#include "engine/model/strategy.h"
#include "engine/train/checkpoint.h"
#include "tests/equiv.h"
#include "tests/testkit.h"

enum { WORLD = 4, N = 37 }; /* N: elements per rank, odd so that nothing lines up by chance */

/* --- device buffers -------------------------------------------------------------------- */

static void *dev_alloc(mt_rank *r, size_t bytes) {
    void *p = NULL;
    ms_error err = {0};
    MT_OK(r, ms_device_alloc(r->ctx->device, bytes, &p, &err), &err);
    return p;
}

static void dev_free(mt_rank *r, void *p, size_t bytes) {
    ms_device_free(r->ctx->device, p, bytes);
}

static void to_dev(mt_rank *r, void *dst, const void *src, size_t bytes) {
    ms_error err = {0};
    MT_OK(r, ms_device_copy(r->ctx->device, dst, src, bytes, MS_COPY_HOST_TO_DEVICE, &err), &err);
}

static void from_dev(mt_rank *r, void *dst, const void *src, size_t bytes) {
    ms_error err = {0};
    MT_OK(r, ms_device_copy(r->ctx->device, dst, src, bytes, MS_COPY_DEVICE_TO_HOST, &err), &err);
}

/* The fence holds: every rank's memory really is off limits to the host. */
static void device_is_fenced(mt_rank *r, void *arg) {
    (void)arg;
    MT_CHECK(r, !ms_device_host_addressable(r->ctx->device), "rank %d: device %s is addressable",
             r->ctx->rank, ms_device_name(r->ctx->device));
    void *p = dev_alloc(r, 64);
    float x = 0;
    MT_CHECK(r, ms_device_owns(r->ctx->device, p) && !ms_device_owns(r->ctx->device, &x),
             "owns: the device's buffer and a host variable are told apart");
    MT_CHECK(r, ms_comm_device(r->ctx->world) == r->ctx->device,
             "the world communicator stages through the rank's device");
    /* A tensor wrapped over device memory (ms_tensor_wrap_on): its copies are made on the
     * device, and releasing it leaves the caller's buffer alone. */
    const float vals[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    float back[16] = {0};
    to_dev(r, p, vals, sizeof vals);
    ms_error err = {0};
    ms_tensor w = {0}, c = {0};
    if (MT_OK(r, ms_tensor_wrap_on(r->ctx->device, p, MS_F32, 2, (int64_t[]){4, 4}, &w, &err),
              &err) &&
        MT_OK(r, ms_tensor_contiguous(&w, MS_F32, &c, &err), &err)) {
        MT_CHECK(r, ms_device_owns(r->ctx->device, ms_tensor_data(&c)),
                 "a copy of a device-wrapped tensor left the device");
        from_dev(r, back, ms_tensor_data(&c), sizeof back);
        MT_CHECK(r, !memcmp(back, vals, sizeof vals), "the copy differs from the wrapped data");
    }
    ms_tensor_release(&c);
    ms_tensor_release(&w);
    from_dev(r, back, p, sizeof back); /* still the caller's, still readable */
    MT_CHECK(r, !memcmp(back, vals, sizeof vals), "releasing the wrap touched the buffer");
    dev_free(r, p, 64);
}

static void test_fenced_world_w4(void **state) {
    (void)state;
    mt_run_device(WORLD, MS_DEVICE_FENCED, device_is_fenced, NULL);
}

/* --- collectives: device memory against host memory ----------------------------------- */

/* A collective on send/recv holding elements of dt; n elements per rank as a base size. */
typedef ms_status (*coll_fn)(ms_comm *c, ms_comm_dtype dt, const void *send, void *recv,
                             ms_error *err);

static void even_counts(ms_comm *c, size_t *counts, int skew) {
    for (int p = 0; p < ms_comm_size(c); p++) counts[p] = (size_t)(N + skew * p);
}

static ms_status c_all_reduce(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    return ms_all_reduce_dt(c, dt, s, r, N, MS_REDUCE_SUM, e);
}
static ms_status c_all_reduce_inplace(ms_comm *c, ms_comm_dtype dt, const void *s, void *r,
                                      ms_error *e) {
    (void)s;
    return ms_all_reduce_dt(c, dt, r, r, N, MS_REDUCE_AVG, e);
}
static ms_status c_reduce_scatter(ms_comm *c, ms_comm_dtype dt, const void *s, void *r,
                                  ms_error *e) {
    size_t counts[WORLD];
    even_counts(c, counts, 1);
    return ms_reduce_scatter_dt(c, dt, s, r, counts, MS_REDUCE_MAX, e);
}
static ms_status c_all_gather(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    size_t counts[WORLD];
    even_counts(c, counts, -2);
    return ms_all_gather_dt(c, dt, s, r, counts, e);
}
static ms_status c_all_to_all(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    size_t sc[WORLD], sd[WORLD], rc[WORLD], rd[WORLD], so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)(1 + (me + 2 * p) % 5), rc[p] = (size_t)(1 + (p + 2 * me) % 5);
        sd[p] = so, rd[p] = ro;
        so += sc[p] + 1, ro += rc[p] + 2; /* gaps: displacements are honoured */
    }
    return ms_all_to_all_dt(c, dt, s, sc, sd, r, rc, rd, e);
}
static ms_status c_broadcast(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    (void)s;
    return ms_broadcast_dt(c, dt, r, N, ms_comm_size(c) - 1, e);
}
/* A ring: send to the next rank, receive from the previous one (two tags, two halves). */
static int ring_ops(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_p2p_op *ops) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    size_t half = N / 2, elt = ms_comm_dtype_size(dt);
    ops[0] = (ms_p2p_op){MS_P2P_SEND, (me + 1) % n, (void *)s, half, 1};
    ops[1] = (ms_p2p_op){MS_P2P_RECV, (me + n - 1) % n, r, half, 1};
    ops[2] = (ms_p2p_op){MS_P2P_SEND, (me + 1) % n, (char *)s + half * elt, N - half, 2};
    ops[3] = (ms_p2p_op){MS_P2P_RECV, (me + n - 1) % n, (char *)r + half * elt, N - half, 2};
    return 4;
}
static ms_status c_p2p(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    ms_p2p_op ops[4];
    return ms_p2p_dt(c, dt, ops, ring_ops(c, dt, s, r, ops), e);
}
static ms_status c_ip2p(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    ms_p2p_op ops[4];
    ms_comm_request *q = ms_ip2p_dt(c, dt, ops, ring_ops(c, dt, s, r, ops), e);
    if (!q) return e->code;
    bool done = false;
    ms_status st = ms_comm_test(q, &done, e); /* a test first, then the wait */
    return done ? st : ms_comm_wait(q, e);
}
/* Non-blocking collectives, three in flight at once on separate staging buffers. */
static ms_status c_iall_reduce3(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    size_t third = N / 3, elt = ms_comm_dtype_size(dt);
    ms_comm_request *q[3];
    for (int k = 0; k < 3; k++) {
        size_t len = k < 2 ? third : N - 2 * third;
        q[k] = ms_iall_reduce_dt(c, dt, (const char *)s + k * third * elt,
                                 (char *)r + k * third * elt, len, MS_REDUCE_SUM, e);
    }
    ms_status st = MS_OK;
    for (int k = 2; k >= 0; k--) /* completed out of issue order */
        if (ms_comm_wait(q[k], e) != MS_OK) st = e->code;
    return st;
}
static ms_status c_ireduce_scatter(ms_comm *c, ms_comm_dtype dt, const void *s, void *r,
                                   ms_error *e) {
    size_t counts[WORLD];
    even_counts(c, counts, 3);
    return ms_comm_wait(ms_ireduce_scatter_dt(c, dt, s, r, counts, MS_REDUCE_SUM, e), e);
}
static ms_status c_iall_gather(ms_comm *c, ms_comm_dtype dt, const void *s, void *r, ms_error *e) {
    size_t counts[WORLD];
    even_counts(c, counts, 1);
    return ms_comm_wait(ms_iall_gather_dt(c, dt, s, r, counts, e), e);
}

typedef struct coll_case {
    const char *name;
    coll_fn fn;
} coll_case;

static const coll_case colls[] = {
    {"all_reduce", c_all_reduce},
    {"all_reduce in place", c_all_reduce_inplace},
    {"reduce_scatter", c_reduce_scatter},
    {"all_gather", c_all_gather},
    {"all_to_all", c_all_to_all},
    {"broadcast", c_broadcast},
    {"p2p", c_p2p},
    {"ip2p", c_ip2p},
    {"iall_reduce x3", c_iall_reduce3},
    {"ireduce_scatter", c_ireduce_scatter},
    {"iall_gather", c_iall_gather},
};

enum { BUF_ELTS = 8 * N * WORLD }; /* covers every case's largest buffer */

/* This rank's inputs: send and recv prefilled with distinct values of dt. */
static void fill(int rank, ms_comm_dtype dt, uint8_t *send, uint8_t *recv) {
    for (int i = 0; i < BUF_ELTS; i++) {
        float a = 2 * ms_philox_uniform(7, (uint64_t)rank, (uint64_t)i) - 1;
        float b = 2 * ms_philox_uniform(8, (uint64_t)rank, (uint64_t)i) - 1;
        if (dt == MS_COMM_BF16) {
            ((uint16_t *)send)[i] = ms_bf16_from_f32(a);
            ((uint16_t *)recv)[i] = ms_bf16_from_f32(b);
        } else {
            ((float *)send)[i] = a, ((float *)recv)[i] = b;
        }
    }
}

/* What the observer saw of a run: calls and their bytes (the probes' view). */
typedef struct seen {
    int calls;
    size_t bytes;
} seen;

static void observe(void *user, const ms_comm_event *ev) {
    seen *s = user;
    s->calls++;
    s->bytes += ev->bytes;
}

/* One case on one communicator: on host buffers, then on device buffers; the bytes of recv
 * must be equal, and so must what the observer was told. */
static void check_coll(mt_rank *r, ms_comm *c, const coll_case *cc, ms_comm_dtype dt) {
    const size_t bytes = BUF_ELTS * ms_comm_dtype_size(dt);
    uint8_t *hs = xmalloc(bytes), *hr = xmalloc(bytes), *got = xmalloc(bytes);
    fill(ms_comm_rank(c), dt, hs, hr);
    void *ds = dev_alloc(r, bytes), *dr = dev_alloc(r, bytes);
    to_dev(r, ds, hs, bytes);
    to_dev(r, dr, hr, bytes);
    ms_error err = {0};
    seen host = {0}, dev = {0};
    ms_comm_set_observer(c, observe, &host);
    MT_OK(r, cc->fn(c, dt, hs, hr, &err), &err);
    ms_comm_set_observer(c, observe, &dev);
    MT_OK(r, cc->fn(c, dt, ds, dr, &err), &err);
    ms_comm_set_observer(c, NULL, NULL);
    MT_CHECK(r, host.calls > 0 && host.calls == dev.calls && host.bytes == dev.bytes,
             "%s: the observer saw %d calls, %zu bytes on the host, %d, %zu on the device",
             cc->name, host.calls, host.bytes, dev.calls, dev.bytes);
    from_dev(r, got, dr, bytes);
    size_t at = 0;
    while (at < bytes && got[at] == hr[at]) at++;
    MT_CHECK(r, at == bytes, "%s %s on '%s' (%s): device memory differs from host at byte %zu",
             cc->name, ms_comm_dtype_name(dt), ms_comm_name(c), ms_comm_backend(c), at);
    /* The sends are left as they were. */
    from_dev(r, got, ds, bytes);
    MT_CHECK(r, !memcmp(got, hs, bytes), "%s: the device send buffer changed", cc->name);
    dev_free(r, ds, bytes);
    dev_free(r, dr, bytes);
    free(hs), free(hr), free(got);
}

/* Mixed: a device send and a host receive, and the reverse, each equal to host-only. */
static void check_mixed(mt_rank *r, ms_comm *c) {
    float hs[N], hr[N], mixed[N];
    for (int i = 0; i < N; i++) hs[i] = (float)(ms_comm_rank(c) * 100 + i);
    void *d = dev_alloc(r, sizeof hs);
    to_dev(r, d, hs, sizeof hs);
    ms_error err = {0};
    MT_OK(r, ms_all_reduce(c, hs, hr, N, MS_REDUCE_SUM, &err), &err);
    MT_OK(r, ms_all_reduce(c, d, mixed, N, MS_REDUCE_SUM, &err), &err);
    MT_CHECK(r, !memcmp(mixed, hr, sizeof hr), "device send, host receive differs");
    MT_OK(r, ms_all_reduce(c, hs, d, N, MS_REDUCE_SUM, &err), &err);
    from_dev(r, mixed, d, sizeof mixed);
    MT_CHECK(r, !memcmp(mixed, hr, sizeof hr), "host send, device receive differs");
    dev_free(r, d, sizeof hs);
}

static void run_collectives(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *pair = NULL; /* a split inherits the device */
    ms_error err = {0};
    if (!MT_OK(r, ms_comm_split(r->ctx->world, r->ctx->rank / 2, 0, "pair", &pair, &err), &err))
        return;
    MT_CHECK(r, ms_comm_device(pair) == r->ctx->device, "a split lost the rank's device");
    ms_comm *comms[2] = {r->ctx->world, pair};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
            check_coll(r, comms[k], &colls[i], MS_COMM_F32);
            check_coll(r, comms[k], &colls[i], MS_COMM_BF16);
        }
    check_mixed(r, r->ctx->world);
    ms_comm_destroy(pair);
}

static void test_collectives_w4(void **state) {
    (void)state;
    mt_run_device(WORLD, MS_DEVICE_FENCED, run_collectives, NULL);
}

/* --- reshards ---------------------------------------------------------------------------- */

static float global_value(int64_t g) {
    return 2.0f * ms_philox_uniform(99, 1, (uint64_t)g) - 1.0f;
}

/* Placements of a mesh of m dims over a 2-d tensor: R, S(0), S(1), P(sum|avg|max|min) each. */
static int enumerate(int m, ms_placements *out) {
    const int nopt = 3 + MS_REDUCE_COUNT;
    int combos = 1, n = 0;
    for (int d = 0; d < m; d++) combos *= nopt;
    for (int c = 0; c < combos; c++) {
        ms_placements pl = {.n = m};
        for (int d = 0, rem = c; d < m; d++, rem /= nopt) {
            int o = rem % nopt;
            pl.p[d] = o == 0   ? ms_pl_replicate()
                      : o <= 2 ? ms_pl_shard(o - 1)
                               : ms_pl_partial((ms_reduce_op)(o - 3));
        }
        if (ms_placements_validate(&pl, m, 2, NULL) == MS_OK) out[n++] = pl;
    }
    return n;
}

/* The global tensor's values at the box [start, start + len) of gshape, f32 or bf16. */
static void global_box(const int64_t *gshape, const int64_t *start, const int64_t *len, bool bf16,
                       void *out) {
    int64_t k = 0;
    for (int64_t i = 0; i < len[0]; i++)
        for (int64_t j = 0; j < len[1]; j++, k++) {
            float v = global_value((start[0] + i) * gshape[1] + start[1] + j);
            if (bf16)
                ((uint16_t *)out)[k] = ms_bf16_from_f32(v);
            else
                ((float *)out)[k] = v;
        }
}

/* Whether the R -> P rule leaves zeros on this rank (a P(sum) dim at a coordinate but 0). */
static bool zeroed(const ms_placements *pl, const ms_dmesh *dm) {
    for (int m = 0; m < pl->n; m++)
        if (pl->p[m].kind == MS_PL_PARTIAL && pl->p[m].reduce == MS_REDUCE_SUM && dm->coords[m])
            return true;
    return false;
}

/* data (n elements of dt on the device, this rank's box under pl) with its Partial mesh dims
 * reduced in place, through the communicators, on the device; then against the global box. */
static bool matches_global(mt_rank *r, ms_dmesh *dm, const ms_placements *pl, const int64_t *gshape,
                           ms_comm_dtype dt, void *data, const char *what) {
    int64_t start[2], len[2];
    ms_local_box(pl, &dm->mesh, dm->coords, 2, gshape, start, len);
    size_t n = (size_t)(len[0] * len[1]), bytes = n * ms_comm_dtype_size(dt);
    ms_error err = {0};
    for (int m = 0; m < pl->n; m++)
        if (pl->p[m].kind == MS_PL_PARTIAL &&
            !MT_OK(r,
                   ms_all_reduce_dt(dm->dim_comm[m], dt, data, data, n,
                                    (ms_reduce_op)pl->p[m].reduce, &err),
                   &err))
            return false;
    void *got = xmalloc(bytes + 4), *want = xmalloc(bytes + 4);
    from_dev(r, got, data, bytes);
    global_box(gshape, start, len, dt == MS_COMM_BF16, want);
    bool ok = !memcmp(got, want, bytes);
    MT_CHECK(r, ok, "%s: rank %d's box [%lld+%lld, %lld+%lld] is not the global tensor's", what,
             r->ctx->rank, (long long)start[0], (long long)len[0], (long long)start[1],
             (long long)len[1]);
    free(got), free(want);
    return ok;
}

typedef struct sweep {
    mt_rank *r;
    ms_dmesh *dm;
    const int64_t *gshape;
    unsigned kinds; /* step kinds run on this rank (bits of ms_rstep_kind) */
    int pairs;
} sweep;

/* f32: shard the global tensor (host) onto the device under a, reshard to b, check. */
static void pair_f32(sweep *sw, const ms_placements *a, const ms_placements *b) {
    mt_rank *r = sw->r;
    ms_error err = {0};
    ms_tensor g;
    if (!MT_OK(r, ms_tensor_alloc(ms_device_host(), MS_F32, 2, sw->gshape, &g, &err), &err)) return;
    int64_t zero[2] = {0, 0};
    global_box(sw->gshape, zero, sw->gshape, false, ms_tensor_data(&g));
    ms_dtensor t;
    ms_status st = ms_dtensor_shard(sw->dm, &g, a, &t, &err);
    ms_tensor_release(&g);
    if (!MT_OK(r, st, &err)) return;
    ms_reshard_report rep;
    char sa[64], sb[64], what[160];
    snprintf(what, sizeof what, "f32 %s -> %s", ms_placements_str(a, sa, sizeof sa),
             ms_placements_str(b, sb, sizeof sb));
    if (MT_OK(r, ms_reshard(&t, b, &rep, &err), &err) && ms_dmesh_is_member(sw->dm)) {
        for (int k = 0; k < rep.nsteps; k++) sw->kinds |= 1u << rep.steps[k].kind;
        matches_global(r, sw->dm, b, sw->gshape, MS_COMM_F32, ms_tensor_data(&t.local), what);
        sw->pairs++;
    }
    ms_dtensor_release(&t);
}

/* bf16: the executor on raw device buffers (ms_reshard_run_dt). */
static void pair_bf16(sweep *sw, const ms_placements *a, const ms_placements *b) {
    mt_rank *r = sw->r;
    ms_dmesh *dm = sw->dm;
    ms_error err = {0};
    ms_reshard_plan plan;
    if (!MT_OK(r, ms_reshard_plan_make(&dm->mesh, a, b, 2, sw->gshape, &plan, &err), &err) ||
        !ms_dmesh_is_member(dm))
        return;
    int64_t s0[2], l0[2], s1[2], l1[2];
    ms_local_box(a, &dm->mesh, dm->coords, 2, sw->gshape, s0, l0);
    ms_local_box(b, &dm->mesh, dm->coords, 2, sw->gshape, s1, l1);
    size_t in_bytes = (size_t)(l0[0] * l0[1]) * 2 + 2, out_bytes = (size_t)(l1[0] * l1[1]) * 2 + 2;
    uint16_t *host = xcalloc(in_bytes, 1);
    if (!zeroed(a, dm)) global_box(sw->gshape, s0, l0, true, host);
    void *in = dev_alloc(r, in_bytes), *out = dev_alloc(r, out_bytes);
    to_dev(r, in, host, in_bytes);
    char sa[64], sb[64], what[160];
    snprintf(what, sizeof what, "bf16 %s -> %s", ms_placements_str(a, sa, sizeof sa),
             ms_placements_str(b, sb, sizeof sb));
    if (MT_OK(r, ms_reshard_run_dt(dm, &plan, 2, sw->gshape, MS_BF16, in, out, NULL, &err), &err))
        matches_global(r, dm, b, sw->gshape, MS_COMM_BF16, out, what);
    dev_free(r, in, in_bytes);
    dev_free(r, out, out_bytes);
    free(host);
}

typedef struct mesh_case {
    int ndim, shape[2];
} mesh_case;

static const mesh_case meshes[] = {{1, {2, 1}}, {1, {4, 1}}, {2, {2, 2}}};
static const int64_t shapes[][2] = {{5, 3}, {1, 4}, {3, 7}};

static void run_reshards(mt_rank *r, void *arg) {
    (void)arg;
    ms_placements *pls = xmalloc(sizeof *pls * 64);
    unsigned kinds = 0;
    for (size_t mc = 0; mc < sizeof meshes / sizeof meshes[0]; mc++) {
        ms_mesh mesh;
        ms_dmesh *dm = NULL;
        ms_error err = {0};
        if (!MT_OK(r, ms_mesh_init(&mesh, meshes[mc].ndim, meshes[mc].shape, NULL, NULL, &err),
                   &err))
            break;
        if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) {
            ms_mesh_free(&mesh);
            break;
        }
        int np = enumerate(meshes[mc].ndim, pls);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            sweep sw = {.r = r, .dm = dm, .gshape = shapes[s]};
            for (int a = 0; a < np && r->failures < 5; a++)
                for (int b = 0; b < np && r->failures < 5; b++) {
                    pair_f32(&sw, &pls[a], &pls[b]);
                    pair_bf16(&sw, &pls[a], &pls[b]);
                }
            kinds |= sw.kinds;
        }
        ms_dmesh_destroy(dm);
        ms_mesh_free(&mesh);
    }
    free(pls);
    const ms_rstep_kind need[] = {MS_RSTEP_ALL_REDUCE, MS_RSTEP_REDUCE_SCATTER,
                                  MS_RSTEP_ALL_GATHER, MS_RSTEP_ALL_TO_ALL,
                                  MS_RSTEP_SLICE,      MS_RSTEP_PARTIALIZE};
    if (r->ctx->rank == 0)
        for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
            MT_CHECK(r, kinds & (1u << need[k]), "no reshard ran a %s step",
                     ms_rstep_name(need[k]));
}

static void test_reshards_w4(void **state) {
    (void)state;
    mt_run_device(WORLD, MS_DEVICE_FENCED, run_reshards, NULL);
}

/* Cross-mesh: from [2] on ranks {0,1} to [3] on ranks {1,2,3} and back, every pair of
 * placements (a Partial source is reduced on its mesh first) but P(avg), whose average of
 * three equal values need not round back to the value. */
static bool is_avg(const ms_placements *pl) {
    return pl->p[0].kind == MS_PL_PARTIAL && pl->p[0].reduce == MS_REDUCE_AVG;
}

static void run_cross_mesh(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_mesh ma, mb;
    const int sa_shape[1] = {2}, sb_shape[1] = {3}, ra[2] = {0, 1}, rb[3] = {1, 2, 3};
    if (!MT_OK(r, ms_mesh_init(&ma, 1, sa_shape, NULL, ra, &err), &err)) return;
    if (!MT_OK(r, ms_mesh_init(&mb, 1, sb_shape, NULL, rb, &err), &err)) return;
    ms_dmesh *da = NULL, *db = NULL;
    MT_OK(r, ms_dmesh_create(r->ctx, &ma, &da, &err), &err);
    MT_OK(r, ms_dmesh_create(r->ctx, &mb, &db, &err), &err);
    ms_placements pls[8];
    int np = enumerate(1, pls);
    int64_t gshape[2] = {5, 6}, zero[2] = {0, 0};
    ms_tensor g;
    MT_OK(r, ms_tensor_alloc(ms_device_host(), MS_F32, 2, gshape, &g, &err), &err);
    global_box(gshape, zero, gshape, false, ms_tensor_data(&g));
    bool sent = false;
    for (int dir = 0; dir < 2 && da && db; dir++) {
        ms_dmesh *from = dir ? db : da, *to = dir ? da : db;
        for (int a = 0; a < np; a++)
            for (int b = 0; b < np && r->failures < 5; b++) {
                if (is_avg(&pls[a]) || is_avg(&pls[b])) continue;
                ms_dtensor s, t;
                if (!MT_OK(r, ms_dtensor_shard(from, &g, &pls[a], &s, &err), &err)) continue;
                ms_reshard_report rep;
                char x[64], y[64], what[160];
                snprintf(what, sizeof what, "cross-mesh %s -> %s",
                         ms_placements_str(&pls[a], x, sizeof x),
                         ms_placements_str(&pls[b], y, sizeof y));
                if (MT_OK(r, ms_reshard_cross_mesh(&s, to, &pls[b], &t, &rep, &err), &err)) {
                    sent |= rep.coll_bytes > 0;
                    if (ms_dmesh_is_member(to))
                        matches_global(r, to, &pls[b], gshape, MS_COMM_F32,
                                       ms_tensor_data(&t.local), what);
                    ms_dtensor_release(&t);
                }
                ms_dtensor_release(&s);
            }
    }
    if (r->ctx->rank == 0) MT_CHECK(r, sent, "no cross-mesh transfer sent anything");
    ms_tensor_release(&g);
    ms_dmesh_destroy(da);
    ms_dmesh_destroy(db);
    ms_mesh_free(&ma);
    ms_mesh_free(&mb);
}

static void test_cross_mesh_w4(void **state) {
    (void)state;
    mt_run_device(WORLD, MS_DEVICE_FENCED, run_cross_mesh, NULL);
}

/* ms_dtensor_from_local takes a local part in host memory onto the rank's device. */
static void check_from_host(mt_rank *r, ms_dmesh *dm, const ms_tensor *g) {
    ms_error err = {0};
    ms_placements pl = {.n = 2, .p = {ms_pl_shard(0), ms_pl_shard(1)}};
    int64_t start[2], len[2];
    ms_local_box(&pl, &dm->mesh, dm->coords, 2, g->shape, start, len);
    ms_tensor local, full = {0};
    if (!MT_OK(r, ms_tensor_alloc(ms_device_host(), MS_F32, 2, len, &local, &err), &err)) return;
    global_box(g->shape, start, len, false, ms_tensor_data(&local));
    ms_dtensor t;
    if (!MT_OK(r, ms_dtensor_from_local(dm, &local, &pl, 2, NULL, &t, &err), &err)) {
        ms_tensor_release(&local);
        return;
    }
    MT_CHECK(r, ms_device_owns(r->ctx->device, ms_tensor_data(&t.local)),
             "from_local left the local part in host memory");
    if (MT_OK(r, ms_dtensor_full(&t, &full, &err), &err))
        MT_CHECK(r, !memcmp(ms_tensor_data(&full), ms_tensor_data(g), 7 * 5 * 4),
                 "from_local then full differs from the global tensor");
    ms_tensor_release(&full);
    ms_dtensor_release(&t);
}

/* ms_dtensor_full hands back host memory gathered from the device; from_local takes host
 * memory onto it. */
static void run_full(mt_rank *r, void *arg) {
    (void)arg;
    ms_error err = {0};
    ms_mesh mesh;
    const int shape[2] = {2, 2};
    if (!MT_OK(r, ms_mesh_init(&mesh, 2, shape, NULL, NULL, &err), &err)) return;
    ms_dmesh *dm = NULL;
    if (MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) {
        int64_t gshape[2] = {7, 5}, zero[2] = {0, 0};
        ms_tensor g, full = {0};
        MT_OK(r, ms_tensor_alloc(ms_device_host(), MS_F32, 2, gshape, &g, &err), &err);
        global_box(gshape, zero, gshape, false, ms_tensor_data(&g));
        ms_placements pl = {.n = 2, .p = {ms_pl_shard(1), ms_pl_partial(MS_REDUCE_SUM)}};
        ms_dtensor t;
        if (MT_OK(r, ms_dtensor_shard(dm, &g, &pl, &t, &err), &err)) {
            if (MT_OK(r, ms_dtensor_full(&t, &full, &err), &err)) {
                MT_CHECK(r, full.storage && !ms_device_owns(r->ctx->device, ms_tensor_data(&full)),
                         "ms_dtensor_full returned device memory");
                MT_CHECK(r, !memcmp(ms_tensor_data(&full), ms_tensor_data(&g), 7 * 5 * 4),
                         "ms_dtensor_full differs from the global tensor");
            }
            ms_dtensor_release(&t);
        }
        ms_tensor_release(&full);
        check_from_host(r, dm, &g);
        ms_tensor_release(&g);
        ms_dmesh_destroy(dm);
    }
    ms_mesh_free(&mesh);
}

static void test_dtensor_full_w4(void **state) {
    (void)state;
    mt_run_device(WORLD, MS_DEVICE_FENCED, run_full, NULL);
}

/* --- training: the fenced device against the CPU, bit for bit ---------------------------- */

typedef struct train_case {
    const char *strategy;
    int world;
    double pdrop; /* the model's dropout (0: none) */
} train_case;

static const train_case trains[] = {
    {"{\"dp\": 1}", 1, 0},
    {"{\"dp\": 2}", 2, 0},
    {"{\"tp\": 2}", 2, 0},
    {"{\"dp\": 2, \"tp\": 2}", 4, 0},
    {"{\"tp\": 2, \"sp\": true}", 2, 0},
    {"{\"cp\": 2}", 2, 0},
    {"{\"dp\": 2, \"zero\": 1}", 2, 0},
    {"{\"dp\": 2, \"zero\": 2, \"bucket_mb\": 0.01}", 2, 0},
    {"{\"dp\": 2, \"zero\": 3}", 2, 0},
    {"{\"dp\": 2, \"precision\": \"bf16\", \"bucket_mb\": 0.01}", 2, 0},
    {"{\"dp\": 2, \"tp\": 2, \"sp\": true, \"zero\": 3}", 4, 0},
    {"{\"dp\": 4, \"precision\": \"bf16\", \"zero\": 2}", 4, 0},
    /* bf16 on one rank and with tp + sp: the fenced table's bf16 kernels (matmul, layernorm,
     * the bias ops, bias_gelu, bias_dropout_add with and without dropout, add, the embedding,
     * vocab-sliced under tp) take their buffers unstaged, the CPU stages them: the same bits. */
    {"{\"dp\": 1, \"precision\": \"bf16\"}", 1, 0.1},
    {"{\"tp\": 2, \"sp\": true, \"precision\": \"bf16\"}", 2, 0.1},
};

static void train_equal(void **state) {
    const train_case *tc = *state;
    const ms_model_config model = mt_tiny_config(false, tc->pdrop);
    mt_equiv_check_device(&model, tc->strategy, tc->world, MS_DEVICE_FENCED);
}
/* Named by world size, so that an mpirun of n processes runs the cases of n ranks. */
#define train_equal_w1 train_equal
#define train_equal_w2 train_equal
#define train_equal_w4 train_equal

/* pp2 under 1f1b: the stage boundary's outbox (engine/train/stages.c) is filled with a host
 * memcpy of device memory; enabled in CMake once that is a device copy. */
static void pp_train_equal(void **state) {
    (void)state;
    mt_equiv_check_device(NULL, "{\"pp\": 2, \"micro_batches\": 2, \"schedule\": \"1f1b\"}", 2,
                          MS_DEVICE_FENCED);
}

/* Save after two steps, resume in a new trainer, one more step: what a run sees (losses,
 * validation loss, a hash of every final parameter's bits) per device. */
typedef struct resume_out {
    float loss[3];
    double val;
    uint64_t hash;
} resume_out;

typedef struct resume_arg {
    const char *strategy;
    resume_out out;
} resume_arg;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ULL;
    return h;
}

/* A checkpoint folder that every rank agrees on: made by rank 0, its name broadcast. */
static bool shared_dir(mt_rank *r, char *dir, size_t cap) {
    ms_error err = {0};
    size_t len = 0;
    if (r->ctx->rank == 0) {
        snprintf(dir, cap, "/tmp/ms-fenced-ckpt-XXXXXX");
        MT_CHECK(r, mkdtemp(dir) != NULL, "mkdtemp failed");
        len = strlen(dir) + 1;
    }
    return MT_OK(r, ms_comm_bcast_msg(r->ctx->world, 0, dir, &len, cap, &err), &err);
}

static ms_trainer *make_trainer(mt_rank *r, const char *strategy, ms_text_data *d) {
    ms_error err = {0};
    ms_model_config cfg = mt_equiv_config(false);
    ms_train_opts o = mt_equiv_opts();
    ms_strategy s;
    ms_placement_rules rules;
    ms_trainer *t = NULL;
    if (MT_OK(r, ms_strategy_parse_json(strategy, strlen(strategy), "case", &s, &rules, &err),
              &err))
        MT_OK(r, ms_trainer_create(r->ctx, &cfg, &s, &rules, &o, d, &t, &err), &err);
    return t;
}

static void step_into(mt_rank *r, ms_trainer *t, float *loss) {
    ms_step_result res;
    ms_error err = {0};
    if (MT_OK(r, ms_trainer_step(t, &res, &err), &err)) *loss = res.loss;
}

static void run_save_resume(mt_rank *r, void *arg) {
    resume_arg *a = arg;
    ms_error err = {0};
    ms_text_data d;
    char dir[256] = "";
    if (!MT_OK(r, mt_equiv_data(&d, &err), &err) || !shared_dir(r, dir, sizeof dir)) return;
    ms_trainer *t = make_trainer(r, a->strategy, &d);
    resume_out got = {0};
    ms_ckpt_saver *sv = NULL;
    ms_ckpt_opts co = {.dir = dir};
    if (t && MT_OK(r, ms_ckpt_saver_create(r->ctx, &co, &sv, &err), &err)) {
        step_into(r, t, &got.loss[0]);
        step_into(r, t, &got.loss[1]);
        MT_OK(r, ms_ckpt_saver_save(sv, t, NULL, &err), &err);
        MT_OK(r, ms_ckpt_saver_poll(sv, true, NULL, 0, &err), &err);
        ms_ckpt_saver_destroy(sv);
    }
    ms_trainer_destroy(t);
    t = make_trainer(r, a->strategy, &d);
    if (t && MT_OK(r, ms_ckpt_load(t, dir, NULL, &err), &err)) {
        step_into(r, t, &got.loss[2]);
        MT_OK(r, ms_trainer_evaluate(t, MS_SPLIT_VAL, 2, &got.val, &err), &err);
        uint64_t h = 0xcbf29ce484222325ULL;
        for (int i = 0; i < ms_trainer_num_state(t); i++) {
            ms_tensor full = {0};
            if (!MT_OK(r, ms_trainer_state_full(t, i, &full, &err), &err)) break;
            if (full.storage)
                h = fnv(h, ms_tensor_data(&full), sizeof(float) * (size_t)ms_tensor_numel(&full));
            ms_tensor_release(&full);
        }
        got.hash = h;
    }
    ms_trainer_destroy(t);
    ms_text_data_close(&d);
    if (r->ctx->rank == 0) {
        a->out = got; /* the other ranks' threads leave it alone */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        MT_CHECK(r, system(cmd) == 0, "cannot remove %s", dir);
    }
}

static void save_resume_w4(void **state) {
    (void)state;
    const char *strategy = "{\"dp\": 2, \"tp\": 2, \"zero\": 1}";
    resume_arg cpu = {.strategy = strategy}, fenced = {.strategy = strategy};
    mt_run_device(4, MS_DEVICE_CPU, run_save_resume, &cpu);
    mt_run_device(4, MS_DEVICE_FENCED, run_save_resume, &fenced);
    if (mt_world_rank() != 0) return;
    for (int k = 0; k < 3; k++)
        if (cpu.out.loss[k] != fenced.out.loss[k] || !(cpu.out.loss[k] > 0))
            fail_msg("save + resume, step %d: loss %.9g on fenced, %.9g on the CPU", k,
                     fenced.out.loss[k], cpu.out.loss[k]);
    assert_true(cpu.out.val == fenced.out.val && cpu.out.hash == fenced.out.hash);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_fenced_world_w4),
    cmocka_unit_test(test_collectives_w4),
    cmocka_unit_test(test_reshards_w4),
    cmocka_unit_test(test_cross_mesh_w4),
    cmocka_unit_test(test_dtensor_full_w4),
    cmocka_unit_test_prestate(train_equal_w1, (void *)&trains[0]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[1]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[2]),
    cmocka_unit_test_prestate(train_equal_w4, (void *)&trains[3]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[4]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[5]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[6]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[7]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[8]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[9]),
    cmocka_unit_test_prestate(train_equal_w4, (void *)&trains[10]),
    cmocka_unit_test_prestate(train_equal_w4, (void *)&trains[11]),
    cmocka_unit_test_prestate(train_equal_w1, (void *)&trains[12]),
    cmocka_unit_test_prestate(train_equal_w2, (void *)&trains[13]),
    cmocka_unit_test(save_resume_w4),
    cmocka_unit_test(pp_train_equal),
};
MT_MAIN("device_fenced", tests)

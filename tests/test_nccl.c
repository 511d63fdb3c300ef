/* test_nccl.c - the NCCL communicator backend: creation and its refusals, then (with GPUs)
 * every collective on device buffers against references computed on the host, the events
 * the profiler's probe records for them, split, refused host buffers and timeouts.
 *
 * What runs where:
 *   - every build: ms_comm_nccl_create's refusals on two thread ranks. Without NCCL it says
 *     the build has none; without a GPU it says there is no CUDA device, on every rank; and
 *     the bootstrap communicator still works afterwards (no rank was left waiting).
 *   - one GPU: a one-rank NCCL communicator runs every collective (no p2p: there is no peer),
 *     and as a host communicator's direct path it waits for the compute stream's mark.
 *   - two or more GPUs: also thread ranks with one device each (up to 4), which exercise
 *     the unequal-count paths (padded reduce_scatter, send/recv all_gather), p2p with tags
 *     and a split with a non-member; and two timeouts.
 * Exit codes: 0 pass, 1 fail, 77 skip (no NCCL in this build, or no GPU; the reason is
 * printed). The refusal checks run before a skip, so a skip still means they passed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "tests/testkit.h"

#ifdef MS_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "engine/core/device.h"
#include "engine/kernels/backend.h"
#include "profiler/record/hooks.h"
#include "profiler/record/recorder.h"
#endif

/* Why the GPU tests are skipped; with NCCL, how many GPUs this process sees. */
static char g_why[256];
#ifdef MS_HAVE_NCCL
static int g_ngpu;
#endif

/* --- refusals (every build) --------------------------------------------------------------- */

static void rank_refusals(mt_rank *r, void *arg) {
    (void)arg;
    ms_ctx *ctx = r->ctx;
    ms_error err = {0};
    ms_comm *nc = NULL;
#ifndef MS_HAVE_NCCL
    ms_status st = ms_comm_nccl_create(ctx->world, 0, &nc, &err);
    MT_CHECK(r, st == MS_ERR_UNSUPPORTED, "without NCCL: %s (%s)", ms_status_str(st), err.msg);
    MT_CHECK(r, strstr(err.msg, "no NCCL") && strstr(err.msg, "-DMS_ENABLE_CUDA=ON"),
             "the message says the build has no NCCL and how to get it: %s", err.msg);
    MT_CHECK(r, strstr(err.msg, "threads or mpi backend"), "names the fallback: %s", err.msg);
#else
    ms_status st = ms_comm_nccl_create(NULL, 0, &nc, &err);
    MT_CHECK(r, st == MS_ERR_INVALID && nc == NULL, "NULL bootstrap: %s", ms_status_str(st));
    if (g_ngpu == 0) {
        nc = (ms_comm *)&err; /* must be reset to NULL */
        st = ms_comm_nccl_create(ctx->world, 0, &nc, &err);
        MT_CHECK(r, st == MS_ERR_UNSUPPORTED, "without a GPU: %s (%s)", ms_status_str(st), err.msg);
        MT_CHECK(r, strstr(err.msg, "no CUDA device"), "the message names the cause: %s", err.msg);
        MT_CHECK(r, strstr(err.msg, "threads or mpi backend") && strstr(err.msg, "caller's choice"),
                 "the message leaves the fallback to the caller: %s", err.msg);
    } else {
        /* Rank 1 asks for a device that does not exist: both ranks fail, rank 0 naming it. */
        int device = ctx->rank == 1 ? g_ngpu + 3 : 0;
        st = ms_comm_nccl_create(ctx->world, device, &nc, &err);
        MT_CHECK(r, st == MS_ERR_INVALID, "rank %d, device %d: %s (%s)", ctx->rank, device,
                 ms_status_str(st), err.msg);
        if (ctx->rank == 0)
            MT_CHECK(r, strstr(err.msg, "rank 1 (world 1)"), "names the rank: %s", err.msg);
        else
            MT_CHECK(r, strstr(err.msg, "requested"), "says what was asked for: %s", err.msg);
    }
#endif
    MT_CHECK(r, nc == NULL, "*out is NULL after a failure");
    /* Nobody was left waiting: the bootstrap works and every rank is at the same call. */
    float one = 1.0f, sum = 0.0f;
    if (MT_OK(r, ms_all_reduce(ctx->world, &one, &sum, 1, MS_REDUCE_SUM, &err), &err))
        MT_CHECK(r, sum == (float)ctx->world_size, "bootstrap all_reduce gave %g", (double)sum);
}

static void test_refusals(void **state) {
    (void)state;
    mt_run_threads(2, rank_refusals, NULL);
}

#ifdef MS_HAVE_NCCL

/* --- helpers -------------------------------------------------------------------------------- */

#define SENTINEL (-777.0f)

/* The input of rank r at index i: exact small multiples of 1/8, varied by salt. */
static float val(int r, size_t i, int salt) {
    size_t h = (size_t)r * 37 + i * 11 + (size_t)salt * 5;
    return (float)((int)(h % 101) - 50) * 0.25f + (float)r * 0.125f;
}

static double reduce_ref(const int *members, int n, size_t i, int salt, ms_reduce_op op) {
    double acc = val(members[0], i, salt);
    for (int k = 1; k < n; k++) {
        double x = val(members[k], i, salt);
        if (op == MS_REDUCE_MAX)
            acc = x > acc ? x : acc;
        else if (op == MS_REDUCE_MIN)
            acc = x < acc ? x : acc;
        else
            acc += x;
    }
    return op == MS_REDUCE_AVG ? acc / n : acc;
}

static int close_to(double got, double want) {
    return fabs(got - want) <= 1e-5 * (fabs(want) > 1.0 ? fabs(want) : 1.0);
}

/* One rank's state: its NCCL communicator, GPU, recorder and the probe's group id. */
typedef struct gpu_rank {
    mt_rank *r;
    int n, me;
    int world[16]; /* 0..n-1: the members, for reduce_ref */
    ms_comm *nc;
    ms_device *gpu;
    ms_recorder *rec;
    uint64_t cursor;
    int32_t group;
} gpu_rank;

static float *dev_floats(gpu_rank *g, size_t n) {
    void *p = NULL;
    ms_error err = {0};
    if (!MT_OK(g->r, ms_device_alloc(g->gpu, n * sizeof(float), &p, &err), &err)) return NULL;
    return p;
}

static void dev_release(gpu_rank *g, float *d, size_t n) {
    ms_device_free(g->gpu, d, n * sizeof(float));
}

static void put(gpu_rank *g, float *d, const float *h, size_t n) {
    ms_error err = {0};
    MT_OK(g->r, ms_device_copy(g->gpu, d, h, n * sizeof(float), MS_COPY_HOST_TO_DEVICE, &err),
          &err);
}

static void get(gpu_rank *g, float *h, const float *d, size_t n) {
    ms_error err = {0};
    MT_OK(g->r, ms_device_copy(g->gpu, h, d, n * sizeof(float), MS_COPY_DEVICE_TO_HOST, &err),
          &err);
}

static float *host_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = SENTINEL;
    return p;
}

/* The events recorded since the last look: exactly one, a collective of `kind` moving
 * `bytes` (the nccl-tests convention of comm.h) on the NCCL communicator's group, with
 * the communicator's latest sequence number. */
static void expect_event(gpu_rank *g, const char *what, ms_coll_kind kind, size_t bytes, int root) {
    mt_rank *r = g->r;
    ms_event ev[8];
    size_t got = ms_recorder_read(g->rec, &g->cursor, ev, 8, NULL);
    MT_CHECK(r, got == 1, "%s: %zu events recorded, want 1", what, got);
    if (got < 1) return;
    const ms_ev_coll *c = &ev[0].u.coll;
    MT_CHECK(r, ev[0].kind == MS_EV_COLL, "%s: event kind %d", what, ev[0].kind);
    MT_CHECK(r, c->coll == kind, "%s: collective %s, want %s", what,
             ms_coll_name((ms_coll_kind)c->coll), ms_coll_name(kind));
    MT_CHECK(r, c->bytes == bytes, "%s: %llu bytes, want %zu", what, (unsigned long long)c->bytes,
             bytes);
    MT_CHECK(r, c->group == g->group && c->group_size == g->n && c->group_rank == g->me,
             "%s: group %d (%d of %d), want %d (%d of %d)", what, c->group, c->group_rank,
             c->group_size, g->group, g->me, g->n);
    MT_CHECK(r, c->seq == ms_comm_seq(g->nc), "%s: seq %lld, want %lld", what, (long long)c->seq,
             (long long)ms_comm_seq(g->nc));
    MT_CHECK(r, !strcmp(c->algo, "nccl"), "%s: algo '%s'", what, c->algo);
    MT_CHECK(r, ev[0].t1_ns >= ev[0].t0_ns, "%s: times run backwards", what);
    if (root >= 0) MT_CHECK(r, c->root == root, "%s: root %d, want %d", what, c->root, root);
}

/* The probe registered the communicator's group under its name and members. */
static int32_t find_group(gpu_rank *g) {
    ms_group groups[16];
    int k = ms_recorder_groups(g->rec, groups, 16);
    for (int i = 0; i < k; i++) {
        if (strcmp(groups[i].name, ms_comm_name(g->nc)) || groups[i].size != g->n) continue;
        for (int p = 0; p < g->n; p++)
            MT_CHECK(g->r, groups[i].ranks[p] == p, "group member %d is world %d", p,
                     groups[i].ranks[p]);
        return groups[i].id;
    }
    MT_CHECK(g->r, 0, "no group '%s' in the recorder", ms_comm_name(g->nc));
    return -1;
}

/* --- collectives ---------------------------------------------------------------------------- */

static void check_all_reduce(gpu_rank *g) {
    const size_t count = 1003;
    float *h = host_floats(count), *out = host_floats(count);
    float *ds = dev_floats(g, count), *dr = dev_floats(g, count);
    ms_error err = {0};
    for (int op = 0; op < MS_REDUCE_COUNT && ds && dr; op++) {
        const int salt = op + 1;
        for (size_t i = 0; i < count; i++) h[i] = val(g->me, i, salt);
        /* AVG runs in place, the others from a separate send buffer. */
        bool in_place = op == MS_REDUCE_AVG;
        put(g, in_place ? dr : ds, h, count);
        MT_OK(g->r, ms_all_reduce(g->nc, in_place ? dr : ds, dr, count, (ms_reduce_op)op, &err),
              &err);
        get(g, out, dr, count);
        for (size_t i = 0; i < count; i++) {
            double want = reduce_ref(g->world, g->n, i, salt, (ms_reduce_op)op);
            if (!close_to(out[i], want)) {
                MT_CHECK(g->r, 0, "all_reduce %s n=%d: [%zu] = %g, want %g",
                         ms_reduce_op_name((ms_reduce_op)op), g->n, i, (double)out[i], want);
                break;
            }
        }
        expect_event(g, "all_reduce", MS_COLL_ALL_REDUCE, count * sizeof(float), -1);
    }
    dev_release(g, ds, count), dev_release(g, dr, count);
    free(h), free(out);
}

/* Block sizes: equal, or unequal with one empty block when there are peers. */
static void block_counts(int n, bool equal, size_t base, size_t *counts, size_t *offs,
                         size_t *total) {
    *total = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = equal ? base : base + 3 * (size_t)p;
        if (!equal && n > 1 && p == n - 1) counts[p] = 0;
        offs[p] = *total;
        *total += counts[p];
    }
}

static void check_reduce_scatter(gpu_rank *g, bool equal) {
    size_t counts[16], offs[16], total;
    block_counts(g->n, equal, equal ? 64 : 5, counts, offs, &total);
    const size_t mine = counts[g->me];
    const int salt = equal ? 21 : 22;
    const ms_reduce_op op = equal ? MS_REDUCE_SUM : MS_REDUCE_AVG;
    float *h = host_floats(total), *out = host_floats(mine);
    for (size_t i = 0; i < total; i++) h[i] = val(g->me, i, salt);
    float *ds = dev_floats(g, total), *dr = dev_floats(g, mine);
    ms_error err = {0};
    if (ds && dr) {
        put(g, ds, h, total);
        MT_OK(g->r, ms_reduce_scatter(g->nc, ds, dr, counts, op, &err), &err);
        get(g, out, dr, mine);
        for (size_t i = 0; i < mine; i++) {
            double want = reduce_ref(g->world, g->n, offs[g->me] + i, salt, op);
            if (!close_to(out[i], want)) {
                MT_CHECK(g->r, 0, "reduce_scatter (%s) rank %d: [%zu] = %g, want %g",
                         equal ? "equal" : "unequal", g->me, i, (double)out[i], want);
                break;
            }
        }
        expect_event(g, "reduce_scatter", MS_COLL_REDUCE_SCATTER, total * sizeof(float), -1);
    }
    dev_release(g, ds, total), dev_release(g, dr, mine);
    free(h), free(out);
}

static void check_all_gather(gpu_rank *g, bool equal) {
    size_t counts[16], offs[16], total;
    block_counts(g->n, equal, equal ? 50 : 7, counts, offs, &total);
    if (!equal && g->n > 1) { /* move the empty block to the front */
        counts[g->n - 1] = counts[0], counts[0] = 0;
        total = 0;
        for (int p = 0; p < g->n; p++) offs[p] = total, total += counts[p];
    }
    const size_t mine = counts[g->me];
    const int salt = equal ? 31 : 32;
    float *h = host_floats(mine), *out = host_floats(total);
    for (size_t i = 0; i < mine; i++) h[i] = val(g->me, i, salt);
    float *ds = dev_floats(g, mine), *dr = dev_floats(g, total);
    ms_error err = {0};
    if (ds && dr) {
        put(g, ds, h, mine);
        put(g, dr, out, total); /* sentinels */
        MT_OK(g->r, ms_all_gather(g->nc, ds, dr, counts, &err), &err);
        get(g, out, dr, total);
        int bad = 0;
        for (int p = 0; p < g->n && !bad; p++)
            for (size_t i = 0; i < counts[p] && !bad; i++)
                if (out[offs[p] + i] != val(p, i, salt)) {
                    MT_CHECK(g->r, 0, "all_gather (%s): block %d [%zu] = %g, want %g",
                             equal ? "equal" : "unequal", p, i, (double)out[offs[p] + i],
                             (double)val(p, i, salt));
                    bad = 1;
                }
        expect_event(g, "all_gather", MS_COLL_ALL_GATHER, total * sizeof(float), -1);
    }
    dev_release(g, ds, mine), dev_release(g, dr, total);
    free(h), free(out);
}

static void check_broadcast(gpu_rank *g) {
    const size_t count = 777;
    const int root = g->n - 1;
    float *h = host_floats(count);
    if (g->me == root)
        for (size_t i = 0; i < count; i++) h[i] = val(root, i, 41);
    float *d = dev_floats(g, count);
    ms_error err = {0};
    if (d) {
        put(g, d, h, count);
        MT_OK(g->r, ms_broadcast(g->nc, d, count, root, &err), &err);
        get(g, h, d, count);
        for (size_t i = 0; i < count; i++)
            if (h[i] != val(root, i, 41)) {
                MT_CHECK(g->r, 0, "broadcast from %d: [%zu] = %g, want %g", root, i, (double)h[i],
                         (double)val(root, i, 41));
                break;
            }
        expect_event(g, "broadcast", MS_COLL_BROADCAST, count * sizeof(float), root);
    }
    dev_release(g, d, count);
    free(h);
}

static void check_all_to_all(gpu_rank *g) {
    const int n = g->n, me = g->me;
    size_t sc[16], sd[16], rc[16], rd[16], sent = 0, received = 0;
    for (int p = 0; p < n; p++) {
        /* What me sends to p is what p receives from me: the formula is symmetric. */
        sc[p] = 2 + (size_t)((me + p) % 3);
        rc[p] = 2 + (size_t)((p + me) % 3);
        sd[p] = sent, sent += sc[p];
        rd[p] = received, received += rc[p];
    }
    float *h = host_floats(sent), *out = host_floats(received);
    for (int p = 0; p < n; p++)
        for (size_t j = 0; j < sc[p]; j++) h[sd[p] + j] = val(me, (size_t)p * 1000 + j, 51);
    float *ds = dev_floats(g, sent), *dr = dev_floats(g, received);
    ms_error err = {0};
    if (ds && dr) {
        put(g, ds, h, sent);
        MT_OK(g->r, ms_all_to_all(g->nc, ds, sc, sd, dr, rc, rd, &err), &err);
        get(g, out, dr, received);
        int bad = 0;
        for (int p = 0; p < n && !bad; p++)
            for (size_t j = 0; j < rc[p] && !bad; j++) {
                float want = val(p, (size_t)me * 1000 + j, 51);
                if (out[rd[p] + j] != want) {
                    MT_CHECK(g->r, 0, "all_to_all: from %d [%zu] = %g, want %g", p, j,
                             (double)out[rd[p] + j], (double)want);
                    bad = 1;
                }
            }
        expect_event(g, "all_to_all", MS_COLL_ALL_TO_ALL, sent * sizeof(float), -1);
    }
    dev_release(g, ds, sent), dev_release(g, dr, received);
    free(h), free(out);
}

/* A ring: two sends to the next rank (tags 5 then 2) and the two receives from the previous
 * one posted in the other order, so only tag matching pairs them correctly. */
static void check_p2p(gpu_rank *g) {
    const int next = (g->me + 1) % g->n, prev = (g->me + g->n - 1) % g->n;
    const size_t na = 100, nb = 50;
    float *ha = host_floats(na), *hb = host_floats(nb);
    for (size_t i = 0; i < na; i++) ha[i] = val(g->me, i, 61);
    for (size_t i = 0; i < nb; i++) hb[i] = val(g->me, i, 62);
    float *sa = dev_floats(g, na), *sb = dev_floats(g, nb);
    float *ra = dev_floats(g, na), *rb = dev_floats(g, nb);
    ms_error err = {0};
    if (sa && sb && ra && rb) {
        put(g, sa, ha, na), put(g, sb, hb, nb);
        ms_p2p_op ops[4] = {
            {MS_P2P_SEND, next, sa, na, 5},
            {MS_P2P_SEND, next, sb, nb, 2},
            {MS_P2P_RECV, prev, rb, nb, 2},
            {MS_P2P_RECV, prev, ra, na, 5},
        };
        MT_OK(g->r, ms_p2p(g->nc, ops, 4, &err), &err);
        get(g, ha, ra, na), get(g, hb, rb, nb);
        for (size_t i = 0; i < na; i++)
            if (ha[i] != val(prev, i, 61)) {
                MT_CHECK(g->r, 0, "p2p tag 5 from %d: [%zu] = %g", prev, i, (double)ha[i]);
                break;
            }
        for (size_t i = 0; i < nb; i++)
            if (hb[i] != val(prev, i, 62)) {
                MT_CHECK(g->r, 0, "p2p tag 2 from %d: [%zu] = %g", prev, i, (double)hb[i]);
                break;
            }
        /* One event per send, in the batch's order, on the {me, next} pair's group. */
        ms_event ev[8];
        size_t got = ms_recorder_read(g->rec, &g->cursor, ev, 8, NULL);
        MT_CHECK(g->r, got == 2, "p2p: %zu events, want one per send", got);
        for (size_t k = 0; k < got && k < 2; k++) {
            const ms_ev_coll *c = &ev[k].u.coll;
            size_t want = (k == 0 ? na : nb) * sizeof(float);
            MT_CHECK(g->r, c->coll == MS_COLL_P2P && c->bytes == want && c->group_size == 2,
                     "p2p event %zu: %s, %llu bytes (want %zu), group of %d", k,
                     ms_coll_name((ms_coll_kind)c->coll), (unsigned long long)c->bytes, want,
                     c->group_size);
            MT_CHECK(g->r, c->group != g->group, "p2p events are on the pair's group");
        }
    }
    dev_release(g, sa, na), dev_release(g, sb, nb), dev_release(g, ra, na), dev_release(g, rb, nb);
    free(ha), free(hb);
}

static int split_color(int n, int p) {
    return n >= 3 && p == n - 1 ? -1 : p % 2;
}

/* Colors by parity (the last of three or more ranks stays out), keys reverse the order. */
static void check_split(gpu_rank *g) {
    const int n = g->n, color = split_color(n, g->me);
    ms_comm *child = NULL;
    ms_error err = {0};
    if (!MT_OK(g->r, ms_comm_split(g->nc, color, -g->me, "half", &child, &err), &err)) return;
    expect_event(g, "split", MS_COLL_SPLIT, 0, -1);
    if (color < 0) {
        MT_CHECK(g->r, child == NULL, "a non-member gets no communicator");
        return;
    }
    int members[16], size = 0, me = -1;
    for (int p = n - 1; p >= 0; p--)
        if (split_color(n, p) == color) {
            if (p == g->me) me = size;
            members[size++] = p;
        }
    MT_CHECK(g->r, child && ms_comm_size(child) == size && ms_comm_rank(child) == me,
             "split: rank %d of %d, want %d of %d", child ? ms_comm_rank(child) : -1,
             child ? ms_comm_size(child) : -1, me, size);
    if (!child) return;
    MT_CHECK(g->r, !strcmp(ms_comm_backend(child), "nccl"), "the child is an NCCL communicator");
    for (int k = 0; k < size; k++)
        MT_CHECK(g->r, ms_comm_world_rank(child, k) == members[k], "member %d is world %d, want %d",
                 k, ms_comm_world_rank(child, k), members[k]);
    const size_t count = 32;
    float *h = host_floats(count);
    for (size_t i = 0; i < count; i++) h[i] = val(g->me, i, 71);
    float *d = dev_floats(g, count);
    if (d) {
        put(g, d, h, count);
        MT_OK(g->r, ms_all_reduce(child, d, d, count, MS_REDUCE_SUM, &err), &err);
        MT_OK(g->r, ms_barrier(child, &err), &err);
        get(g, h, d, count);
        for (size_t i = 0; i < count; i++)
            if (!close_to(h[i], reduce_ref(members, size, i, 71, MS_REDUCE_SUM))) {
                MT_CHECK(g->r, 0, "all_reduce on the split: [%zu] = %g", i, (double)h[i]);
                break;
            }
    }
    dev_release(g, d, count);
    free(h);
    ms_comm_destroy(child);
}

/* Host memory is refused with a message before NCCL sees it; the communicator stays usable. */
static void check_host_buffer_refused(gpu_rank *g) {
    float host[4] = {1, 2, 3, 4};
    ms_error err = {0};
    ms_status st = ms_all_reduce(g->nc, host, host, 4, MS_REDUCE_SUM, &err);
    MT_CHECK(g->r, st == MS_ERR_INVALID && strstr(err.msg, "host memory"), "a host buffer: %s (%s)",
             ms_status_str(st), err.msg);
    MT_CHECK(g->r, !ms_comm_is_broken(g->nc), "a refused buffer does not break the communicator");
    ms_event ev[8];
    ms_recorder_read(g->rec, &g->cursor, ev, 8, NULL); /* the failed call's event */
}

static void rank_collectives(mt_rank *r, void *arg) {
    (void)arg;
    ms_ctx *ctx = r->ctx;
    gpu_rank g = {.r = r, .n = ctx->world_size, .me = ctx->rank};
    for (int p = 0; p < g.n; p++) g.world[p] = p;
    ms_error err = {0};
    if (!MT_OK(r, ms_comm_nccl_create(ctx->world, ctx->rank, &g.nc, &err), &err)) return;
    MT_CHECK(r,
             !strcmp(ms_comm_backend(g.nc), "nccl") && ms_comm_size(g.nc) == g.n &&
                 ms_comm_rank(g.nc) == g.me,
             "created: backend %s, rank %d of %d", ms_comm_backend(g.nc), ms_comm_rank(g.nc),
             ms_comm_size(g.nc));
    MT_CHECK(r, ms_comm_timeout_ms(g.nc) == ms_comm_timeout_ms(ctx->world),
             "takes the bootstrap's timeout");
    bool ok = MT_OK(r, ms_device_cuda_create(ctx->rank, &g.gpu, &err), &err) &&
              MT_OK(r, ms_recorder_create(ctx->rank, 256, &g.rec, &err), &err);
    ms_comm_probe *probe = NULL;
    if (ok) {
        /* The profiler's probe, as a dmesh or the ctx installs it on any communicator. */
        ctx->trace.recorder = g.rec;
        probe = ms_comm_probe_attach(&ctx->trace, g.nc, -1);
        MT_CHECK(r, probe != NULL, "probe attached");
        g.group = find_group(&g);
        g.cursor = ms_recorder_pushed(g.rec);

        check_all_reduce(&g);
        check_reduce_scatter(&g, true);
        check_reduce_scatter(&g, false);
        check_all_gather(&g, true);
        check_all_gather(&g, false);
        check_broadcast(&g);
        check_all_to_all(&g);
        if (g.n > 1) check_p2p(&g);
        MT_OK(r, ms_barrier(g.nc, &err), &err);
        expect_event(&g, "barrier", MS_COLL_BARRIER, 0, -1);
        check_split(&g);
        check_host_buffer_refused(&g);
        MT_CHECK(r, atomic_load(&g.gpu->in_use) == 0, "test buffers all freed");
    }
    ms_comm_destroy(g.nc);
    ms_comm_probe_free(probe);
    ctx->trace.recorder = NULL;
    ms_recorder_destroy(g.rec);
    ms_device_destroy(g.gpu);
}

/* The direct path's ordering (docs/ARCHITECTURE.md, streams and events), on one GPU: a kernel
 * queued behind long GEMMs on the compute stream writes the send buffer, then a non-blocking
 * all-reduce is issued. NCCL's stream waits for the mark recorded at issue, so it reduces what
 * the kernel wrote; without that wait it would run at once and read the buffer before the
 * kernel. The way back keeps the host's completion: a kernel queued after the wait reads the
 * result. */
static void rank_direct_order(mt_rank *r, void *arg) {
    (void)arg;
    ms_ctx *ctx = r->ctx;
    ms_error err = {0};
    ms_device *gpu = NULL;
    ms_kctx *kc = NULL;
    ms_comm *host = NULL, *nc = NULL;
    enum { M = 2048, GEMMS = 16 };
    const int64_t n = (int64_t)1 << 20;
    float *send = NULL, *recv = NULL, *a = NULL, *b = NULL, *c = NULL;
    const size_t vb = (size_t)n * sizeof(float), mb = (size_t)M * M * sizeof(float);
    if (!MT_OK(r, ms_device_cuda_create(0, &gpu, &err), &err) ||
        !MT_OK(r, ms_kctx_create(gpu, &kc, &err), &err) ||
        !MT_OK(r, ms_comm_split(ctx->world, 0, 0, "host", &host, &err), &err) ||
        !MT_OK(r, ms_comm_nccl_create(ctx->world, 0, &nc, &err), &err))
        goto out;
    ms_comm_set_device(host, gpu);
    if (!MT_OK(r, ms_comm_adopt_direct(host, nc, &err), &err)) goto out;
    MT_OK(r, ms_device_alloc(gpu, vb, (void **)&send, &err), &err);
    MT_OK(r, ms_device_alloc(gpu, vb, (void **)&recv, &err), &err);
    MT_OK(r, ms_device_alloc(gpu, mb, (void **)&a, &err), &err);
    MT_OK(r, ms_device_alloc(gpu, mb, (void **)&b, &err), &err);
    MT_OK(r, ms_device_alloc(gpu, mb, (void **)&c, &err), &err);
    if (r->failures) goto out;
    MT_OK(r, ms_device_zero(gpu, send, vb, &err), &err);
    MT_OK(r, ms_device_zero(gpu, a, mb, &err), &err);
    MT_OK(r, ms_device_zero(gpu, b, mb, &err), &err);
    const ms_k_gemm g = {.batch = 1, .m = M, .n = M, .k = M};
    for (int i = 0; i < GEMMS; i++)
        MT_OK(r, MS_CALL_K(kc, matmul_forward, &g, c, a, b, 1.0f, 0.0f, &err), &err);
    MT_OK(r, MS_CALL_K(kc, fill, send, 7.0f, n, &err), &err);
    ms_comm_request *req = ms_iall_reduce(host, send, recv, (size_t)n, MS_REDUCE_SUM, &err);
    MT_CHECK(r, req != NULL, "iall_reduce: %s", err.msg);
    MT_OK(r, ms_comm_wait(req, &err), &err);
    MT_CHECK(r, ms_comm_direct_calls(host) == 1, "the all-reduce did not go the direct way");
    MT_OK(r, MS_CALL_K(kc, scale_forward, send, recv, 2.0f, n, &err), &err);
    float *back = malloc(2 * vb);
    MT_OK(r, ms_device_copy(gpu, back, recv, vb, MS_COPY_DEVICE_TO_HOST, &err), &err);
    MT_OK(r, ms_device_copy(gpu, back + n, send, vb, MS_COPY_DEVICE_TO_HOST, &err), &err);
    int64_t bad_recv = 0, bad_after = 0;
    for (int64_t i = 0; i < n; i++) bad_recv += back[i] != 7.0f, bad_after += back[n + i] != 14.0f;
    MT_CHECK(r, bad_recv == 0,
             "%lld of %lld results are not the 7 the kernel wrote before the "
             "all-reduce (NCCL did not wait for it); first %g",
             (long long)bad_recv, (long long)n, (double)back[0]);
    MT_CHECK(r, bad_after == 0, "%lld of %lld values read after the wait are not 14",
             (long long)bad_after, (long long)n);
    free(back);
out:
    ms_device_free(gpu, send, vb), ms_device_free(gpu, recv, vb);
    ms_device_free(gpu, a, mb), ms_device_free(gpu, b, mb), ms_device_free(gpu, c, mb);
    ms_comm_destroy(host); /* and the NCCL communicator it adopted */
    if (!host) ms_comm_destroy(nc);
    ms_kctx_destroy(kc);
    ms_device_destroy(gpu);
}

static void test_direct_order(void **state) {
    (void)state;
    mt_run_threads(1, rank_direct_order, NULL);
}

static void test_one_rank(void **state) {
    (void)state;
    mt_run_threads(1, rank_collectives, NULL);
}

static void test_ranks(void **state) {
    (void)state;
    if (g_ngpu < 2) {
        printf("skipped: %d GPU, and NCCL needs one per rank\n", g_ngpu);
        skip();
    }
    mt_run_threads(g_ngpu < 4 ? g_ngpu : 4, rank_collectives, NULL);
}

/* Rank 1 never takes part: rank 0 times out, first in a receive (the missing rank is the
 * batch's only peer, so it is named), then in an all_reduce on a fresh communicator. */
static void rank_timeout(mt_rank *r, void *arg) {
    (void)arg;
    ms_ctx *ctx = r->ctx;
    ms_error err = {0};
    ms_device *gpu = NULL;
    if (!MT_OK(r, ms_device_cuda_create(ctx->rank, &gpu, &err), &err)) return;
    void *d = NULL;
    MT_OK(r, ms_device_alloc(gpu, 256 * sizeof(float), &d, &err), &err);
    for (int round = 0; round < 2 && d; round++) {
        ms_comm *nc = NULL;
        if (!MT_OK(r, ms_comm_nccl_create(ctx->world, ctx->rank, &nc, &err), &err)) break;
        ms_comm_set_timeout_ms(nc, 1500);
        if (ctx->rank == 0) {
            int64_t t0 = ms_now_ns();
            ms_status st = round == 0 ? ms_recv(nc, d, 256, 1, 7, &err)
                                      : ms_all_reduce(nc, d, d, 256, MS_REDUCE_SUM, &err);
            double s = (double)(ms_now_ns() - t0) / 1e9;
            MT_CHECK(r, st == MS_ERR_TIMEOUT && strstr(err.msg, "timed out after 1500 ms"),
                     "round %d: %s (%s)", round, ms_status_str(st), err.msg);
            MT_CHECK(r, s >= 1.4 && s < 30.0, "round %d: gave up after %.2f s", round, s);
            if (round == 0)
                MT_CHECK(r, strstr(err.msg, "did not arrive: 1 (world 1)"),
                         "the receive's peer is named: %s", err.msg);
            MT_CHECK(r, ms_comm_is_broken(nc), "broken after a timeout");
            st = ms_barrier(nc, &err);
            MT_CHECK(r, st == MS_ERR_COMM && strstr(err.msg, "broken"), "then fails fast: %s",
                     err.msg);
        }
        MT_OK(r, ms_barrier(ctx->world, &err), &err); /* rank 1 waits here */
        ms_comm_destroy(nc);
    }
    ms_device_free(gpu, d, 256 * sizeof(float));
    ms_device_destroy(gpu);
}

static void test_timeout(void **state) {
    (void)state;
    if (g_ngpu < 2) {
        printf("skipped: the timeout needs two ranks, so two GPUs\n");
        skip();
    }
    mt_run_threads(2, rank_timeout, NULL);
}

/* How many GPUs this process sees; 0 with the reason in g_why. */
static int gpu_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(g_why, sizeof g_why, "no CUDA device (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(e));
        return 0;
    }
    if (n == 0) snprintf(g_why, sizeof g_why, "no CUDA device (cudaGetDeviceCount found none)");
    return n;
}

#endif /* MS_HAVE_NCCL */

int main(int argc, char **argv) {
    const struct CMUnitTest refusals[] = {cmocka_unit_test(test_refusals)};
#ifdef MS_HAVE_NCCL
    g_ngpu = gpu_count();
    if (g_ngpu > 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_refusals),     cmocka_unit_test(test_one_rank),
            cmocka_unit_test(test_direct_order), cmocka_unit_test(test_ranks),
            cmocka_unit_test(test_timeout),
        };
        return mt_main(argc, argv, "nccl", tests, sizeof tests / sizeof tests[0]);
    }
#else
    snprintf(g_why, sizeof g_why, "this build has no NCCL");
#endif
    int rc = mt_main(argc, argv, "nccl", refusals, 1);
    if (rc != 0) return rc;
    printf("SKIP: %s; the refusals of ms_comm_nccl_create were checked\n", g_why);
    return 77;
}

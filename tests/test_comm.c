/* test_comm.c - the communicator contract: every collective, point-to-point batches, split,
 * observer events, timeouts, byte messages and variable-length messages, checked against
 * references computed independently (in double precision for floats) from deterministic
 * per-rank inputs.
 *
 * Runs on the threads backend, and under mpirun on the MPI backend: every body works on a
 * communicator of exactly n ranks (the world, or a split of its first n members when
 * mpirun started more), so the same checks apply to both.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/comm/comm_threads.h"
#include "engine/core/tensor.h"
#include "tests/testkit.h"

#define SENTINEL (-777.0f)

/* --- helpers ------------------------------------------------------------------------------ */

/* The input of rank r at index i; exact small multiples of 1/4, varied by salt. */
static float val(int r, size_t i, int salt) {
    size_t h = (size_t)r * 37 + i * 11 + (size_t)salt * 5;
    return (float)((int)(h % 101) - 50) * 0.25f + (float)r * 0.125f;
}

/* acc (op) x; AVG accumulates as a sum. */
static double fold(double acc, double x, ms_reduce_op op) {
    if (op == MS_REDUCE_MAX) return x > acc ? x : acc;
    if (op == MS_REDUCE_MIN) return x < acc ? x : acc;
    return acc + x;
}

static double reduce_ref(int n, size_t i, int salt, ms_reduce_op op) {
    double acc = val(0, i, salt);
    for (int p = 1; p < n; p++) acc = fold(acc, val(p, i, salt), op);
    return op == MS_REDUCE_AVG ? acc / n : acc;
}

static int close_to(double got, double want) {
    return fabs(got - want) <= 1e-5 * (fabs(want) > 1.0 ? fabs(want) : 1.0);
}

/* got[0..count) must be the reduction of elements off.. of every rank's input. */
static void check_reduced(mt_rank *r, const char *what, const float *got, size_t count, size_t off,
                          int n, int salt, ms_reduce_op op) {
    for (size_t i = 0; i < count; i++) {
        double want = reduce_ref(n, off + i, salt, op);
        if (!close_to(got[i], want)) {
            mt_failf(r, __FILE__, __LINE__, "%s: n=%d op=%s count=%zu: [%zu] = %g, want %g", what,
                     n, ms_reduce_op_name(op), count, i, (double)got[i], want);
            return;
        }
    }
}

static float *alloc_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = SENTINEL;
    return p;
}

/* The communicator of exactly n ranks a body runs on: the world when it has n ranks,
 * otherwise a split of its first n members (mpirun with more processes); NULL for the rest. */
static ms_comm *group_of(mt_rank *r, int n, const char *name) {
    ms_comm *w = r->ctx->world;
    if (ms_comm_size(w) == n) return w;
    ms_comm *c = NULL;
    ms_error err;
    int me = ms_comm_rank(w);
    MT_OK(r, ms_comm_split(w, me < n ? 0 : -1, me, name, &c, &err), &err);
    return c;
}

static void group_done(mt_rank *r, ms_comm *c) {
    if (c && c != r->ctx->world) ms_comm_destroy(c);
}

/* Runs body on each world size in sizes[] (skipping sizes mpirun did not start). */
static void run_sizes(mt_rank_fn body, const int *sizes, size_t k) {
    for (size_t i = 0; i < k; i++) {
        if (mt_backend() == MS_BACKEND_MPI && mt_mpi_world() < sizes[i]) continue;
        mt_run(sizes[i], body, (void *)&sizes[i]);
    }
}

#define RUN_SIZES(body, ...)                                                                       \
    do {                                                                                           \
        static const int sizes_[] = {__VA_ARGS__};                                                 \
        run_sizes(body, sizes_, sizeof sizes_ / sizeof sizes_[0]);                                 \
    } while (0)

/* Uneven per-rank counts: pattern 0 all zero, 1 all one, 2 r*7+1, 3 zeros on odd ranks,
 * 4 large (several reduction sub-chunks), 5 only rank 0. */
#define N_PATTERNS 6
static size_t pattern_count(int pattern, int r) {
    switch (pattern) {
        case 0:
            return 0;
        case 1:
            return 1;
        case 2:
            return (size_t)r * 7 + 1;
        case 3:
            return r % 2 ? 0 : (size_t)r * 7 + 3;
        case 4:
            return (size_t)r * 5000 + 4099;
        default:
            return r == 0 ? 1001 : 0;
    }
}

/* counts[p] = pattern_count(pat, p) for the n members; *off = where member me's block
 * starts. Returns the sum. */
static size_t pattern_layout(int pat, int n, int me, size_t *counts, size_t *off) {
    size_t total = 0;
    *off = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = pattern_count(pat, p);
        if (p < me) *off += counts[p];
        total += counts[p];
    }
    return total;
}

static const size_t reduce_counts[] = {0, 1, 5, 16, 17, 63, 259, 12289, 100003};
#define N_REDUCE_COUNTS (sizeof reduce_counts / sizeof reduce_counts[0])

/* --- all_reduce ---------------------------------------------------------------------------- */

static void body_all_reduce(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "ar");
    if (!c) return;
    int me = ms_comm_rank(c);
    for (int op = 0; op < MS_REDUCE_COUNT; op++)
        for (size_t k = 0; k < N_REDUCE_COUNTS; k++)
            for (int in_place = 0; in_place < 2; in_place++) {
                size_t count = reduce_counts[k];
                int salt = op * 31 + (int)k * 3 + in_place;
                float *send = alloc_floats(count), *recv = alloc_floats(count);
                for (size_t i = 0; i < count; i++) send[i] = val(me, i, salt);
                float *out = in_place ? send : recv;
                ms_error err;
                if (MT_OK(r, ms_all_reduce(c, send, out, count, (ms_reduce_op)op, &err), &err))
                    check_reduced(r, in_place ? "all_reduce in place" : "all_reduce", out, count, 0,
                                  n, salt, (ms_reduce_op)op);
                free(send);
                free(recv);
            }
    group_done(r, c);
}

static void test_all_reduce(void **state) {
    (void)state;
    RUN_SIZES(body_all_reduce, 1, 2, 3, 4, 8);
}

/* --- reduce_scatter ------------------------------------------------------------------------ */

static void body_reduce_scatter(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "rs");
    if (!c) return;
    int me = ms_comm_rank(c);
    size_t *counts = malloc(sizeof *counts * (size_t)n);
    for (int op = 0; op < MS_REDUCE_COUNT; op++)
        for (int pat = 0; pat < N_PATTERNS; pat++) {
            int salt = op * 17 + pat;
            size_t off, total = pattern_layout(pat, n, me, counts, &off);
            float *send = alloc_floats(total), *recv = alloc_floats(counts[me] + 1);
            for (size_t i = 0; i < total; i++) send[i] = val(me, i, salt);
            ms_error err;
            if (MT_OK(r, ms_reduce_scatter(c, send, recv, counts, (ms_reduce_op)op, &err), &err)) {
                check_reduced(r, "reduce_scatter", recv, counts[me], off, n, salt,
                              (ms_reduce_op)op);
                MT_CHECK(r, recv[counts[me]] == SENTINEL, "reduce_scatter wrote past its block");
            }
            free(send);
            free(recv);
        }
    free(counts);
    group_done(r, c);
}

static void test_reduce_scatter(void **state) {
    (void)state;
    RUN_SIZES(body_reduce_scatter, 1, 2, 3, 4, 8);
}

/* --- all_gather ---------------------------------------------------------------------------- */

static void body_all_gather(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "ag");
    if (!c) return;
    int me = ms_comm_rank(c);
    size_t *counts = malloc(sizeof *counts * (size_t)n);
    for (int pat = 0; pat < N_PATTERNS; pat++) {
        size_t total = 0;
        for (int p = 0; p < n; p++) total += counts[p] = pattern_count(pat, p);
        float *send = alloc_floats(counts[me]), *recv = alloc_floats(total + 1);
        for (size_t i = 0; i < counts[me]; i++) send[i] = val(me, i, pat);
        ms_error err;
        if (MT_OK(r, ms_all_gather(c, send, recv, counts, &err), &err)) {
            size_t off = 0;
            for (int p = 0; p < n; p++)
                for (size_t i = 0; i < counts[p]; i++, off++)
                    if (recv[off] != val(p, i, pat)) {
                        MT_CHECK(r, 0, "all_gather n=%d pattern %d: block %d [%zu] = %g, want %g",
                                 n, pat, p, i, (double)recv[off], (double)val(p, i, pat));
                        p = n;
                        break;
                    }
            MT_CHECK(r, recv[total] == SENTINEL, "all_gather wrote past the end");
        }
        free(send);
        free(recv);
    }
    free(counts);
    group_done(r, c);
}

static void test_all_gather(void **state) {
    (void)state;
    RUN_SIZES(body_all_gather, 1, 2, 3, 4, 8);
}

/* --- all_to_all ---------------------------------------------------------------------------- */

/* Floats that rank s sends to rank d; some pairs send nothing. */
static size_t a2a_count(int s, int d, int big) {
    return big ? ((size_t)(s + 1) * (size_t)(d + 2) * 37) % 3001 : (size_t)(s * 3 + d * 5) % 7;
}

static void body_all_to_all(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "a2a");
    if (!c) return;
    int me = ms_comm_rank(c);
    size_t *sc = malloc(sizeof(size_t) * 4 * (size_t)n), *sd = sc + n, *rc = sd + n, *rd = rc + n;
    for (int big = 0; big < 2; big++) {
        /* Send blocks are laid out in reverse peer order with gaps of 3, receive blocks in
         * order with gaps of 2: displacements are honoured, not assumed packed. */
        size_t send_len = 0, recv_len = 0;
        for (int p = n - 1; p >= 0; p--) {
            sc[p] = a2a_count(me, p, big);
            sd[p] = send_len;
            send_len += sc[p] + 3;
        }
        for (int p = 0; p < n; p++) {
            rc[p] = a2a_count(p, me, big);
            rd[p] = recv_len;
            recv_len += rc[p] + 2;
        }
        float *send = alloc_floats(send_len), *recv = alloc_floats(recv_len);
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < sc[p]; i++) send[sd[p] + i] = val(me, i, p * 13 + big);
        ms_error err;
        if (MT_OK(r, ms_all_to_all(c, send, sc, sd, recv, rc, rd, &err), &err)) {
            for (int p = 0; p < n; p++) {
                for (size_t i = 0; i < rc[p]; i++)
                    if (recv[rd[p] + i] != val(p, i, me * 13 + big)) {
                        MT_CHECK(r, 0, "all_to_all n=%d: from rank %d [%zu] = %g, want %g", n, p, i,
                                 (double)recv[rd[p] + i], (double)val(p, i, me * 13 + big));
                        break;
                    }
                MT_CHECK(r, recv[rd[p] + rc[p]] == SENTINEL && recv[rd[p] + rc[p] + 1] == SENTINEL,
                         "all_to_all n=%d wrote into the gap after the block from rank %d", n, p);
            }
        }
        free(send);
        free(recv);
    }
    free(sc);
    group_done(r, c);
}

static void test_all_to_all(void **state) {
    (void)state;
    RUN_SIZES(body_all_to_all, 1, 2, 3, 4, 8);
}

/* --- broadcast ------------------------------------------------------------------------------ */

static void body_broadcast(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "bcast");
    if (!c) return;
    int me = ms_comm_rank(c);
    static const size_t counts[] = {0, 1, 17, 5003};
    for (int root = 0; root < n; root++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            size_t count = counts[k];
            int salt = root * 7 + (int)k;
            float *buf = alloc_floats(count + 1);
            if (me == root)
                for (size_t i = 0; i < count; i++) buf[i] = val(root, i, salt);
            ms_error err;
            if (MT_OK(r, ms_broadcast(c, buf, count, root, &err), &err)) {
                for (size_t i = 0; i < count; i++)
                    if (buf[i] != val(root, i, salt)) {
                        MT_CHECK(r, 0, "broadcast n=%d root %d count %zu: [%zu] = %g, want %g", n,
                                 root, count, i, (double)buf[i], (double)val(root, i, salt));
                        break;
                    }
                MT_CHECK(r, buf[count] == SENTINEL, "broadcast wrote past the end");
            }
            free(buf);
        }
    group_done(r, c);
}

static void test_broadcast(void **state) {
    (void)state;
    RUN_SIZES(body_broadcast, 1, 2, 3, 4, 8);
}

/* --- point-to-point ------------------------------------------------------------------------- */

/* The payload of message k from s to d. */
static void fill_msg(float *buf, size_t count, int s, int d, int k) {
    for (size_t i = 0; i < count; i++) buf[i] = val(s, i, d * 101 + k);
}

static int check_msg(mt_rank *r, const char *what, const float *buf, size_t count, int s, int d,
                     int k) {
    for (size_t i = 0; i < count; i++)
        if (buf[i] != val(s, i, d * 101 + k)) {
            mt_failf(r, __FILE__, __LINE__, "%s: message %d from %d to %d: [%zu] = %g, want %g",
                     what, k, s, d, i, (double)buf[i], (double)val(s, i, d * 101 + k));
            return 0;
        }
    return 1;
}

/* Every rank sends to the next and receives from the previous in one batch; half of the
 * ranks list the receive first. */
static void p2p_ring(mt_rank *r, ms_comm *c) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t ns = 1000 + (size_t)me, nr = 1000 + (size_t)prev;
    float *send = alloc_floats(ns), *recv = alloc_floats(nr);
    fill_msg(send, ns, me, next, 0);
    ms_p2p_op s = {MS_P2P_SEND, next, send, ns, 5}, v = {MS_P2P_RECV, prev, recv, nr, 5};
    ms_p2p_op ops[2] = {s, v};
    if (me % 2) {
        ops[0] = v;
        ops[1] = s;
    }
    ms_error err;
    if (MT_OK(r, ms_p2p(c, ops, 2, &err), &err)) check_msg(r, "ring", recv, nr, prev, me, 0);
    free(send);
    free(recv);
}

/* Every rank sends to and receives from every other rank in one batch, receives listed
 * first and in descending order: deadlock-free only if the batch completes as a whole. */
static void p2p_all_pairs(mt_rank *r, ms_comm *c) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    if (n < 2) return;
    ms_p2p_op *ops = malloc(sizeof *ops * 2 * (size_t)n);
    float **bufs = malloc(sizeof *bufs * 2 * (size_t)n);
    int nops = 0;
    for (int p = n - 1; p >= 0; p--) {
        if (p == me) continue;
        size_t cnt = (size_t)((p * 5 + me * 3) % 11) * 100 + 1;
        bufs[nops] = alloc_floats(cnt);
        ops[nops] = (ms_p2p_op){MS_P2P_RECV, p, bufs[nops], cnt, p};
        nops++;
    }
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        size_t cnt = (size_t)((me * 5 + p * 3) % 11) * 100 + 1;
        bufs[nops] = alloc_floats(cnt);
        fill_msg(bufs[nops], cnt, me, p, 1);
        ops[nops] = (ms_p2p_op){MS_P2P_SEND, p, bufs[nops], cnt, me};
        nops++;
    }
    ms_error err;
    if (MT_OK(r, ms_p2p(c, ops, nops, &err), &err))
        for (int i = 0; i < nops; i++)
            if (ops[i].kind == MS_P2P_RECV)
                check_msg(r, "all pairs", ops[i].buf, ops[i].count, ops[i].peer, me, 1);
    for (int i = 0; i < nops; i++) free(bufs[i]);
    free(bufs);
    free(ops);
}

/* Rank 0 sends 20 messages with tags k%3 to rank 1 in one batch; rank 1 receives them in one
 * batch listed by descending tag. Messages with one tag arrive in the order sent. */
#define MANY 20
static void p2p_many(mt_rank *r, ms_comm *c) {
    int me = ms_comm_rank(c);
    if (me > 1 || ms_comm_size(c) < 2) return;
    ms_p2p_op ops[MANY];
    float *bufs[MANY];
    int nops = 0;
    for (int tag = 2; tag >= 0; tag--)
        for (int k = 0; k < MANY; k++) {
            /* Rank 0 lists its sends in message order (one pass), rank 1 by tag. */
            if (me == 0 ? tag != 0 : k % 3 != tag) continue;
            size_t cnt = (size_t)k * 3 + 1;
            bufs[nops] = alloc_floats(cnt);
            if (me == 0) fill_msg(bufs[nops], cnt, 0, 1, k);
            ops[nops] =
                (ms_p2p_op){me == 0 ? MS_P2P_SEND : MS_P2P_RECV, 1 - me, bufs[nops], cnt, k % 3};
            nops++;
        }
    ms_error err;
    if (MT_OK(r, ms_p2p(c, ops, nops, &err), &err) && me == 1)
        for (int i = 0; i < nops; i++)
            check_msg(r, "many", ops[i].buf, ops[i].count, 0, 1, (int)(ops[i].count - 1) / 3);
    for (int i = 0; i < nops; i++) free(bufs[i]);
}

/* Separate sends on one side, one batch on the other, in crossed tag order; plus empty
 * messages. */
static void p2p_cross_batches(mt_rank *r, ms_comm *c) {
    int me = ms_comm_rank(c);
    if (me > 1 || ms_comm_size(c) < 2) return;
    float a[64], b[64];
    ms_error err;
    if (me == 0) {
        fill_msg(a, 64, 0, 1, 7);
        fill_msg(b, 32, 0, 1, 8);
        MT_OK(r, ms_send(c, a, 64, 1, 2, &err), &err);
        MT_OK(r, ms_send(c, b, 32, 1, 1, &err), &err);
        MT_OK(r, ms_send(c, NULL, 0, 1, 9, &err), &err);
        MT_OK(r, ms_recv(c, a, 64, 1, 3, &err), &err);
        check_msg(r, "reply", a, 64, 1, 0, 9);
    } else {
        ms_p2p_op ops[2] = {{MS_P2P_RECV, 0, b, 32, 1}, {MS_P2P_RECV, 0, a, 64, 2}};
        if (MT_OK(r, ms_p2p(c, ops, 2, &err), &err)) {
            check_msg(r, "crossed tag 2", a, 64, 0, 1, 7);
            check_msg(r, "crossed tag 1", b, 32, 0, 1, 8);
        }
        MT_OK(r, ms_recv(c, NULL, 0, 0, 9, &err), &err);
        fill_msg(a, 64, 1, 0, 9);
        MT_OK(r, ms_send(c, a, 64, 0, 3, &err), &err);
    }
}

/* Point-to-point is not collective: the collective sequence stays usable after it. */
static void collective_after_p2p(mt_rank *r, ms_comm *c) {
    int n = ms_comm_size(c);
    float one = 1, sum = 0;
    ms_error err;
    if (MT_OK(r, ms_all_reduce(c, &one, &sum, 1, MS_REDUCE_SUM, &err), &err))
        MT_CHECK(r, sum == (float)n, "all_reduce after p2p gave %g, want %d", (double)sum, n);
}

/* Non-blocking sends: every rank posts a send to the next, then receives from the previous
 * with a blocking call, then completes its send. Under rendezvous (ms_send first) nobody
 * would ever receive; the posted sends must let every receive complete. */
static void ip2p_ring(mt_rank *r, ms_comm *c) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t ns = 500 + (size_t)me * 3, nr = 500 + (size_t)prev * 3;
    float *send = alloc_floats(ns), *recv = alloc_floats(nr);
    fill_msg(send, ns, me, next, 2);
    ms_error err;
    ms_p2p_op op = {MS_P2P_SEND, next, send, ns, 11};
    ms_comm_request *q = ms_ip2p(c, &op, 1, &err);
    MT_CHECK(r, q != NULL, "ms_ip2p: %s", err.msg);
    op = (ms_p2p_op){0}; /* ops are copied: clearing ours must not matter */
    if (MT_OK(r, ms_recv(c, recv, nr, prev, 11, &err), &err))
        check_msg(r, "posted ring", recv, nr, prev, me, 2);
    MT_OK(r, ms_comm_wait(q, &err), &err);
    free(send);
    free(recv);
}

/* Posted receives complete only once their sender has sent: rank 0 posts two receives and
 * tests them before rank 1 sends anything (a barrier orders the two), then polls them with
 * ms_comm_test until done; rank 1 sends them in the other order, as separate requests. */
static void ip2p_posted_receives(mt_rank *r, ms_comm *c) {
    int me = ms_comm_rank(c);
    float a[300], b[40];
    ms_comm_request *q[2] = {NULL, NULL};
    ms_error err;
    if (me == 0) {
        ms_p2p_op ra = {MS_P2P_RECV, 1, a, 300, 1}, rb = {MS_P2P_RECV, 1, b, 40, 2};
        q[0] = ms_ip2p(c, &ra, 1, &err);
        q[1] = ms_ip2p(c, &rb, 1, &err);
        for (int i = 0; i < 2; i++) {
            bool done = true;
            MT_OK(r, ms_comm_test(q[i], &done, &err), &err);
            MT_CHECK(r, !done, "receive %d completed before anything was sent", i);
        }
    } else if (me == 1) {
        fill_msg(a, 300, 1, 0, 3);
        fill_msg(b, 40, 1, 0, 4);
    }
    MT_OK(r, ms_barrier(c, &err), &err);
    if (me == 1) {
        ms_p2p_op sb = {MS_P2P_SEND, 0, b, 40, 2}, sa = {MS_P2P_SEND, 0, a, 300, 1};
        q[1] = ms_ip2p(c, &sb, 1, &err);
        q[0] = ms_ip2p(c, &sa, 1, &err);
        MT_OK(r, ms_comm_wait(q[0], &err), &err);
        MT_OK(r, ms_comm_wait(q[1], &err), &err);
    } else if (me == 0) {
        for (int left = 2; left;) {
            left = 0;
            for (int i = 0; i < 2; i++) {
                bool done = true;
                if (q[i] && !MT_OK(r, ms_comm_test(q[i], &done, &err), &err)) return;
                if (done) q[i] = NULL;
                left += !done;
            }
            sched_yield();
        }
        check_msg(r, "posted receive a", a, 300, 1, 0, 3);
        check_msg(r, "posted receive b", b, 40, 1, 0, 4);
    }
}

/* A send completed late, after the receiver took it and a later send was posted: rank 0
 * waits for send A only after posting B, and rank 1 takes B only after C, which rank 0
 * sends once A is complete. A is complete whatever came after it (were B's posting mistaken
 * for A's, both ranks would wait for each other). */
static void ip2p_late_completion(mt_rank *r, ms_comm *c) {
    int me = ms_comm_rank(c);
    float a[8], b[8], x[8];
    ms_error err;
    ms_comm_request *qa = NULL, *qb = NULL;
    if (me == 0) {
        fill_msg(a, 8, 0, 1, 5);
        fill_msg(b, 8, 0, 1, 6);
        fill_msg(x, 8, 0, 1, 7);
        ms_p2p_op op = {MS_P2P_SEND, 1, a, 8, 21};
        qa = ms_ip2p(c, &op, 1, &err);
    } else if (me == 1) {
        if (MT_OK(r, ms_recv(c, a, 8, 0, 21, &err), &err)) check_msg(r, "late a", a, 8, 0, 1, 5);
    }
    MT_OK(r, ms_barrier(c, &err), &err);
    if (me == 0) {
        ms_p2p_op op = {MS_P2P_SEND, 1, b, 8, 22};
        qb = ms_ip2p(c, &op, 1, &err);
        MT_OK(r, ms_comm_wait(qa, &err), &err);
        MT_OK(r, ms_send(c, x, 8, 1, 23, &err), &err);
        MT_OK(r, ms_comm_wait(qb, &err), &err);
    } else if (me == 1) {
        if (MT_OK(r, ms_recv(c, x, 8, 0, 23, &err), &err)) check_msg(r, "late x", x, 8, 0, 1, 7);
        if (MT_OK(r, ms_recv(c, b, 8, 0, 22, &err), &err)) check_msg(r, "late b", b, 8, 0, 1, 6);
    }
}

static void body_p2p(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "p2p");
    if (!c) return;
    p2p_ring(r, c);
    p2p_all_pairs(r, c);
    p2p_many(r, c);
    p2p_cross_batches(r, c);
    ip2p_ring(r, c);
    ip2p_posted_receives(r, c);
    ip2p_late_completion(r, c);
    collective_after_p2p(r, c);
    group_done(r, c);
}

static void test_p2p(void **state) {
    (void)state;
    RUN_SIZES(body_p2p, 2, 3, 4, 8);
}

/* --- barrier ------------------------------------------------------------------------------- */

static void body_barrier(mt_rank *r, void *arg) {
    const int *n = arg;
    ms_comm *c = group_of(r, *n, "bar");
    if (!c) return;
    ms_error err;
    /* On threads the ranks share `arrivals`: nobody may leave round k before all arrived. */
    static _Atomic int arrivals;
    int threads = mt_backend() == MS_BACKEND_THREADS;
    for (int k = 0; k < 50; k++) {
        if (threads) atomic_fetch_add(&arrivals, 1);
        if (!MT_OK(r, ms_barrier(c, &err), &err)) break;
        if (threads) {
            int seen = atomic_load(&arrivals);
            MT_CHECK(r, seen == (k + 1) * *n, "barrier %d: %d arrivals, want %d", k, seen,
                     (k + 1) * *n);
        }
        if (!MT_OK(r, ms_barrier(c, &err), &err)) break; /* keeps round k+1 apart */
    }
    /* Reset for the next world size once everybody has done its last check. */
    if (threads && MT_OK(r, ms_barrier(c, &err), &err) && ms_comm_rank(c) == 0)
        atomic_store(&arrivals, 0);
    group_done(r, c);
}

static void test_barrier(void **state) {
    (void)state;
    RUN_SIZES(body_barrier, 1, 2, 3, 8);
}

/* --- split --------------------------------------------------------------------------------- */

/* Checks a sub-communicator against the parent ranks it should hold, in order, then runs
 * all_reduce and all_gather on it. */
static void check_sub(mt_rank *r, ms_comm *parent, ms_comm *sub, const int *members, int size) {
    int me = ms_comm_rank(parent);
    MT_CHECK(r, ms_comm_size(sub) == size, "split: size %d, want %d", ms_comm_size(sub), size);
    for (int k = 0; k < size; k++) {
        MT_CHECK(r, ms_comm_world_rank(sub, k) == ms_comm_world_rank(parent, members[k]),
                 "split: member %d is world rank %d, want %d", k, ms_comm_world_rank(sub, k),
                 ms_comm_world_rank(parent, members[k]));
        if (members[k] == me)
            MT_CHECK(r, ms_comm_rank(sub) == k, "split: rank %d, want %d", ms_comm_rank(sub), k);
    }
    if (ms_comm_size(sub) != size) return;
    /* all_reduce of val(parent rank): the reference needs the parent ranks of the members. */
    enum { COUNT = 300 };
    float send[COUNT], recv[COUNT];
    for (size_t i = 0; i < COUNT; i++) send[i] = val(me, i, 3);
    ms_error err;
    if (MT_OK(r, ms_all_reduce(sub, send, recv, COUNT, MS_REDUCE_SUM, &err), &err))
        for (size_t i = 0; i < COUNT; i++) {
            double want = 0;
            for (int k = 0; k < size; k++) want += val(members[k], i, 3);
            if (!close_to(recv[i], want)) {
                MT_CHECK(r, 0, "split all_reduce [%zu] = %g, want %g", i, (double)recv[i], want);
                break;
            }
        }
    /* all_gather of each member's parent rank shows the order. */
    size_t *counts = malloc(sizeof *counts * (size_t)size);
    float *all = alloc_floats((size_t)size);
    for (int k = 0; k < size; k++) counts[k] = 1;
    float mine = (float)me;
    if (MT_OK(r, ms_all_gather(sub, &mine, all, counts, &err), &err))
        for (int k = 0; k < size; k++)
            MT_CHECK(r, all[k] == (float)members[k], "split all_gather [%d] = %g, want %d", k,
                     (double)all[k], members[k]);
    free(counts);
    free(all);
}

static void body_split(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "parent");
    if (!c) return;
    int me = ms_comm_rank(c);
    int *members = malloc(sizeof *members * (size_t)n);
    ms_error err;

    /* Even/odd colors with reversed keys: members in descending parent rank. */
    ms_comm *parity = NULL;
    if (MT_OK(r, ms_comm_split(c, me % 2, -me, "parity", &parity, &err), &err) && parity) {
        int size = 0;
        for (int p = n - 1; p >= 0; p--)
            if (p % 2 == me % 2) members[size++] = p;
        MT_CHECK(r, !strcmp(ms_comm_name(parity), "parity"), "split name '%s'",
                 ms_comm_name(parity));
        check_sub(r, c, parity, members, size);
    } else {
        MT_CHECK(r, 0, "split gave no communicator to a member");
    }

    /* Rank 0 opts out; equal keys order by parent rank. */
    ms_comm *rest = NULL;
    if (MT_OK(r, ms_comm_split(c, me == 0 ? -1 : 4, 0, "rest", &rest, &err), &err)) {
        if (me == 0) {
            MT_CHECK(r, rest == NULL, "a rank with color -1 got a communicator");
        } else if (rest) {
            for (int p = 1; p < n; p++) members[p - 1] = p;
            check_sub(r, c, rest, members, n - 1);
        } else {
            MT_CHECK(r, 0, "split gave no communicator to a member");
        }
    }

    /* A split of a split: the parity group halved by key. */
    if (parity) {
        int ps = ms_comm_size(parity), pr = ms_comm_rank(parity);
        ms_comm *half = NULL;
        if (MT_OK(r, ms_comm_split(parity, pr < ps / 2, pr, "half", &half, &err), &err) && half) {
            /* Members of my half, as parity ranks, then as parent ranks via the world. */
            int size = 0;
            for (int k = 0; k < ps; k++)
                if ((k < ps / 2) == (pr < ps / 2)) members[size++] = k;
            MT_CHECK(r, ms_comm_size(half) == size, "nested split: size %d, want %d",
                     ms_comm_size(half), size);
            for (int k = 0; k < size && k < ms_comm_size(half); k++)
                MT_CHECK(r, ms_comm_world_rank(half, k) == ms_comm_world_rank(parity, members[k]),
                         "nested split: member %d is world %d, want %d", k,
                         ms_comm_world_rank(half, k), ms_comm_world_rank(parity, members[k]));
            MT_OK(r, ms_barrier(half, &err), &err);
        }
        ms_comm_destroy(half);
    }
    ms_comm_destroy(rest);
    ms_comm_destroy(parity);
    free(members);
    group_done(r, c);
}

static void test_split(void **state) {
    (void)state;
    RUN_SIZES(body_split, 1, 2, 4, 8);
}

/* --- observer events ------------------------------------------------------------------------- */

typedef struct event_log {
    int n;
    ms_comm_event ev[16];
} event_log;

static void record(void *user, const ms_comm_event *ev) {
    event_log *log = user;
    if (log->n < 16) log->ev[log->n++] = *ev;
}

static void body_observer(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "obs");
    if (!c) return;
    int me = ms_comm_rank(c), next = (me + 1) % n, prev = (me + n - 1) % n;
    event_log log = {0};
    ms_comm_set_observer(c, record, &log);
    int64_t seq0 = ms_comm_seq(c);
    float buf[64] = {0}, out[64];
    size_t counts[3] = {1, 2, 3}, sc[3], sd[3], rc[3], rd[3];
    size_t sent = 0, off = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)(me + p + 1);
        sd[p] = sent;
        sent += sc[p];
        rc[p] = (size_t)(p + me + 1);
        rd[p] = off;
        off += rc[p];
    }
    ms_error err;
    MT_OK(r, ms_all_reduce(c, buf, out, 10, MS_REDUCE_AVG, &err), &err);
    MT_OK(r, ms_reduce_scatter(c, buf, out, counts, MS_REDUCE_MAX, &err), &err);
    MT_OK(r, ms_all_gather(c, buf, out, counts, &err), &err);
    MT_OK(r, ms_all_to_all(c, buf, sc, sd, out, rc, rd, &err), &err);
    MT_OK(r, ms_broadcast(c, buf, 7, 1, &err), &err);
    MT_OK(r, ms_barrier(c, &err), &err);
    ms_p2p_op ops[2] = {{MS_P2P_SEND, next, buf, 5, 0}, {MS_P2P_RECV, prev, out, 5, 0}};
    MT_OK(r, ms_p2p(c, ops, 2, &err), &err);
    ms_comm_set_observer(c, NULL, NULL);

    static const ms_coll_kind kinds[] = {
        MS_COLL_ALL_REDUCE, MS_COLL_REDUCE_SCATTER, MS_COLL_ALL_GATHER, MS_COLL_ALL_TO_ALL,
        MS_COLL_BROADCAST,  MS_COLL_BARRIER,        MS_COLL_P2P};
    size_t bytes[] = {40, 24, 24, sent * 4, 28, 0, 20};
    MT_CHECK(r, log.n == 7, "observer saw %d events, want 7", log.n);
    for (int i = 0; i < log.n && i < 7; i++) {
        const ms_comm_event *e = &log.ev[i];
        MT_CHECK(r, e->kind == kinds[i], "event %d: kind %s, want %s", i, ms_coll_name(e->kind),
                 ms_coll_name(kinds[i]));
        MT_CHECK(r, e->seq == seq0 + 1 + i, "event %d: seq %lld, want %lld", i, (long long)e->seq,
                 (long long)(seq0 + 1 + i));
        MT_CHECK(r, e->bytes == bytes[i], "event %d (%s): %zu bytes, want %zu", i,
                 ms_coll_name(e->kind), e->bytes, bytes[i]);
        MT_CHECK(r, e->status == MS_OK && e->comm == c && e->t_end_ns >= e->t_start_ns,
                 "event %d: status %s", i, ms_status_str(e->status));
        MT_CHECK(r, e->algo && e->algo[0], "event %d has no algorithm name", i);
    }
    if (log.n == 7) {
        MT_CHECK(r, log.ev[0].op == MS_REDUCE_AVG && log.ev[1].op == MS_REDUCE_MAX,
                 "reduction events carry the wrong op");
        MT_CHECK(r, log.ev[4].root == 1 && log.ev[0].root == -1, "broadcast root %d",
                 log.ev[4].root);
    }
    group_done(r, c);
}

static void test_observer(void **state) {
    (void)state;
    RUN_SIZES(body_observer, 3);
}

/* --- timeouts ------------------------------------------------------------------------------ */

#define SHORT_TIMEOUT_MS 300
#define SLACK_NS         5000000000LL /* a loaded 2-core machine can stall threads for a while */

/* A fresh group of the first n world ranks, so a broken communicator cannot leak into other
 * tests; everybody else gets NULL. */
static ms_comm *fresh_group(mt_rank *r, int n, const char *name) {
    ms_comm *c = NULL;
    ms_error err;
    int me = ms_comm_rank(r->ctx->world);
    MT_OK(r, ms_comm_split(r->ctx->world, me < n ? 0 : -1, me, name, &c, &err), &err);
    if (c) ms_comm_set_timeout_ms(c, SHORT_TIMEOUT_MS);
    return c;
}

/* Rank 2 skips an all_reduce: ranks 0 and 1 time out naming the op, the group, the sequence
 * number and rank 2; the group is broken afterwards; rank 2's late call fails too. */
static void body_timeout(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *c = fresh_group(r, 3, "tmo_group");
    ms_error err;
    /* Buffers outlive every call on c: a backend may still hold on to them after a failure. */
    float send[100] = {0}, recv[100];
    float waited_ms = 0, longest_ms = 0;
    int me = c ? ms_comm_rank(c) : -1;
    if (c && me < 2) {
        int64_t t0 = ms_now_ns();
        ms_status st = ms_all_reduce(c, send, recv, 100, MS_REDUCE_SUM, &err);
        int64_t dt = ms_now_ns() - t0;
        MT_CHECK(r, st == MS_ERR_TIMEOUT, "all_reduce without rank 2 gave %s, want timeout",
                 ms_status_str(st));
        waited_ms = (float)dt * 1e-6f;
        MT_CHECK(r, dt < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS, "timed out late, after %lld ms",
                 (long long)(dt / 1000000));
        if (st == MS_ERR_TIMEOUT) {
            MT_CHECK(r,
                     strstr(err.msg, "all_reduce") && strstr(err.msg, "tmo_group") &&
                         strstr(err.msg, "seq") && strstr(err.msg, "2 (world 2)"),
                     "timeout message lacks op, group, seq or missing rank: %s", err.msg);
            MT_CHECK(r, !strstr(err.msg, "0 (world 0)") && !strstr(err.msg, "1 (world 1)"),
                     "timeout message names a rank that arrived: %s", err.msg);
        }
        MT_CHECK(r, ms_comm_is_broken(c), "communicator not broken after a timeout");
        t0 = ms_now_ns();
        st = ms_barrier(c, &err);
        MT_CHECK(r, st == MS_ERR_COMM, "call on a broken communicator gave %s, want comm error",
                 ms_status_str(st));
        MT_CHECK(r, ms_now_ns() - t0 < 1000000000LL, "call on a broken communicator was slow");
    }
    /* A rank may fail before its own deadline when a peer gave up first (the group is then
     * abandoned), but the first to give up must have waited the whole timeout. */
    if (MT_OK(r, ms_all_reduce(r->ctx->world, &waited_ms, &longest_ms, 1, MS_REDUCE_MAX, &err),
              &err))
        MT_CHECK(r, longest_ms >= SHORT_TIMEOUT_MS * 0.95f, "timed out early, after %g ms",
                 (double)longest_ms);
    /* Rank 2 comes late, after the others gave up: it must fail, never use their buffers. */
    if (c && me == 2) {
        int64_t t0 = ms_now_ns();
        ms_status st = ms_all_reduce(c, send, recv, 100, MS_REDUCE_SUM, &err);
        int64_t dt = ms_now_ns() - t0;
        if (mt_backend() == MS_BACKEND_THREADS)
            MT_CHECK(r, st == MS_ERR_COMM, "late all_reduce gave %s, want comm error",
                     ms_status_str(st));
        MT_CHECK(r, dt < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS, "late call took %lld ms",
                 (long long)(dt / 1000000));
    }
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    ms_comm_destroy(c);
    /* The world is unaffected. */
    float one = 1, sum = 0;
    if (MT_OK(r, ms_all_reduce(r->ctx->world, &one, &sum, 1, MS_REDUCE_SUM, &err), &err))
        MT_CHECK(r, sum == (float)ms_comm_size(r->ctx->world), "world all_reduce gave %g",
                 (double)sum);
}

static void test_timeout(void **state) {
    (void)state;
    RUN_SIZES(body_timeout, 3);
}

/* Rank 1 never receives: rank 0's send (floats, or an odd number of bytes) times out naming
 * rank 1, and rank 1's late receive must not get the withdrawn message. */
static void p2p_timeout_as(mt_rank *r, ms_comm_dtype dt) {
    const bool bytes = dt == MS_COMM_BYTES;
    ms_comm *c = fresh_group(r, 2, bytes ? "bp2p_tmo" : "p2p_tmo");
    ms_error err;
    float buf[256];
    fill_msg(buf, 256, 0, 1, 0);
    int me = c ? ms_comm_rank(c) : -1;
    if (me == 0) {
        int64_t t0 = ms_now_ns();
        ms_status st =
            bytes ? ms_send_bytes(c, buf, 1023, 1, 0, &err) : ms_send(c, buf, 256, 1, 0, &err);
        int64_t dt_ns = ms_now_ns() - t0;
        MT_CHECK(r, st == MS_ERR_TIMEOUT, "unmatched %s send gave %s, want timeout",
                 ms_comm_dtype_name(dt), ms_status_str(st));
        MT_CHECK(r, dt_ns < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS,
                 "timed out late, after %lld ms", (long long)(dt_ns / 1000000));
        if (st == MS_ERR_TIMEOUT)
            MT_CHECK(r, strstr(err.msg, "send_recv") && strstr(err.msg, "1 (world 1)"),
                     "p2p timeout message lacks op or peer: %s", err.msg);
    }
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    if (me == 1) {
        int64_t t0 = ms_now_ns();
        ms_status st =
            bytes ? ms_recv_bytes(c, buf, 1023, 0, 0, &err) : ms_recv(c, buf, 256, 0, 0, &err);
        if (mt_backend() == MS_BACKEND_THREADS)
            MT_CHECK(r, st == MS_ERR_COMM, "late %s receive gave %s, want comm error",
                     ms_comm_dtype_name(dt), ms_status_str(st));
        MT_CHECK(r, ms_now_ns() - t0 < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS,
                 "late receive took too long");
    }
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    ms_comm_destroy(c);
}

/* A posted receive whose sender never sends: its wait times out naming the sender, within
 * the timeout of its posting. */
static void ip2p_timeout(mt_rank *r) {
    ms_comm *c = fresh_group(r, 2, "ip2p_tmo");
    ms_error err;
    float buf[16];
    if (c && ms_comm_rank(c) == 0) {
        int64_t t0 = ms_now_ns();
        ms_p2p_op op = {MS_P2P_RECV, 1, buf, 16, 0};
        ms_comm_request *q = ms_ip2p(c, &op, 1, &err);
        ms_status st = q ? ms_comm_wait(q, &err) : MS_ERR_INVALID;
        MT_CHECK(r, st == MS_ERR_TIMEOUT, "unmatched posted receive gave %s, want timeout",
                 ms_status_str(st));
        MT_CHECK(r, ms_now_ns() - t0 < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS,
                 "timed out late, after %lld ms", (long long)((ms_now_ns() - t0) / 1000000));
        if (st == MS_ERR_TIMEOUT)
            MT_CHECK(r, strstr(err.msg, "send_recv") && strstr(err.msg, "1 (world 1)"),
                     "posted receive's timeout lacks op or peer: %s", err.msg);
    }
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    ms_comm_destroy(c);
}

static void body_p2p_timeout(mt_rank *r, void *arg) {
    (void)arg;
    p2p_timeout_as(r, MS_COMM_F32);
    p2p_timeout_as(r, MS_COMM_BYTES);
    ip2p_timeout(r);
}

static void test_p2p_timeout(void **state) {
    (void)state;
    RUN_SIZES(body_p2p_timeout, 2);
}

/* --- large messages ---------------------------------------------------------------------- */

/* Messages past 8 MiB per rank, where backends may change how they copy (the threads
 * backend pushes all_gather in bigger sub-chunks), with odd counts so that blocks start
 * unaligned. */
static void body_large(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "large");
    if (!c) return;
    int me = ms_comm_rank(c);
    ms_error err;
    size_t *counts = malloc(sizeof(size_t) * 2 * (size_t)n), *displs = counts + n;
    size_t total = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = (size_t)(3 << 20) / (size_t)n + (size_t)p * 3 + 1;
        displs[p] = total;
        total += counts[p];
    }
    float *send = alloc_floats(total), *recv = alloc_floats(total + 1);

    for (size_t i = 0; i < counts[me]; i++) send[i] = val(me, i, 1);
    if (MT_OK(r, ms_all_gather(c, send, recv, counts, &err), &err)) {
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < counts[p]; i++)
                if (recv[displs[p] + i] != val(p, i, 1)) {
                    MT_CHECK(r, 0, "large all_gather: block %d [%zu] = %g, want %g", p, i,
                             (double)recv[displs[p] + i], (double)val(p, i, 1));
                    p = n;
                    break;
                }
        MT_CHECK(r, recv[total] == SENTINEL, "large all_gather wrote past the end");
    }

    /* all_to_all with the same block sizes in both directions: block p of rank s holds
     * val(s, i, p). */
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < counts[p]; i++) send[displs[p] + i] = val(me, i, p + 2);
    size_t *rc = malloc(sizeof(size_t) * 2 * (size_t)n), *rd = rc + n, off = 0;
    for (int p = 0; p < n; p++) {
        rc[p] = counts[me];
        rd[p] = off;
        off += rc[p];
    }
    float *a2a = alloc_floats(off + 1);
    if (MT_OK(r, ms_all_to_all(c, send, counts, displs, a2a, rc, rd, &err), &err)) {
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < rc[p]; i++)
                if (a2a[rd[p] + i] != val(p, i, me + 2)) {
                    MT_CHECK(r, 0, "large all_to_all: from %d [%zu] = %g, want %g", p, i,
                             (double)a2a[rd[p] + i], (double)val(p, i, me + 2));
                    p = n;
                    break;
                }
        MT_CHECK(r, a2a[off] == SENTINEL, "large all_to_all wrote past the end");
    }

    size_t count = total - 1; /* odd */
    for (size_t i = 0; i < count; i++) recv[i] = me == n - 1 ? val(me, i, 9) : SENTINEL;
    if (MT_OK(r, ms_broadcast(c, recv, count, n - 1, &err), &err))
        for (size_t i = 0; i < count; i++)
            if (recv[i] != val(n - 1, i, 9)) {
                MT_CHECK(r, 0, "large broadcast [%zu] = %g, want %g", i, (double)recv[i],
                         (double)val(n - 1, i, 9));
                break;
            }

    for (size_t i = 0; i < count; i++) send[i] = val(me, i, 4);
    if (MT_OK(r, ms_all_reduce(c, send, recv, count, MS_REDUCE_AVG, &err), &err))
        check_reduced(r, "large all_reduce", recv, count, 0, n, 4, MS_REDUCE_AVG);
    free(a2a);
    free(rc);
    free(send);
    free(recv);
    free(counts);
    group_done(r, c);
}

static void test_large(void **state) {
    (void)state;
    RUN_SIZES(body_large, 2, 3);
}

/* --- bytes ----------------------------------------------------------------------------------- */

#define BYTE_SENTINEL 0xA5

/* Byte lengths every byte test goes through: empty, odd, word-sized, past a page. */
static const size_t byte_lens[] = {0, 1, 3, 4, 4097};
#define N_BYTE_LENS (sizeof byte_lens / sizeof byte_lens[0])

/* Byte i of a message from rank s, varied by salt; computed, never transported. */
static uint8_t bval(int s, size_t i, int salt) {
    uint32_t h = (uint32_t)s * 2654435761u ^ (uint32_t)i * 40503u ^ (uint32_t)salt * 2246822519u;
    return (uint8_t)(h ^ h >> 11 ^ h >> 19);
}

/* A buffer of n bytes at an odd address, between two sentinel bytes: returns the base, and
 * the n usable bytes start at base + 1. */
static uint8_t *alloc_guarded(size_t n) {
    uint8_t *base = malloc(n + 2);
    memset(base, BYTE_SENTINEL, n + 2);
    return base;
}

static void fill_bytes(uint8_t *p, size_t n, int s, int salt) {
    for (size_t i = 0; i < n; i++) p[i] = bval(s, i, salt);
}

/* p[0..n) must be rank s's message with salt, and the guard bytes around it untouched. */
static int check_bytes(mt_rank *r, const char *what, const uint8_t *p, size_t n, int s, int salt) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != bval(s, i, salt)) {
            mt_failf(r, __FILE__, __LINE__, "%s: %zu bytes from rank %d: [%zu] = %d, want %d", what,
                     n, s, i, p[i], bval(s, i, salt));
            return 0;
        }
    if (p[-1] != BYTE_SENTINEL || p[n] != BYTE_SENTINEL) {
        mt_failf(r, __FILE__, __LINE__, "%s: %zu bytes from rank %d: wrote outside the buffer",
                 what, n, s);
        return 0;
    }
    return 1;
}

static int all_sentinel(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != BYTE_SENTINEL) return 0;
    return 1;
}

static void body_bytes_broadcast(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "bbcast");
    if (!c) return;
    int me = ms_comm_rank(c);
    for (int root = 0; root < n; root++)
        for (size_t k = 0; k < N_BYTE_LENS; k++) {
            size_t len = byte_lens[k];
            int salt = root * 7 + (int)k;
            uint8_t *base = alloc_guarded(len), *p = base + 1;
            if (me == root) fill_bytes(p, len, root, salt);
            ms_error err;
            if (MT_OK(r, ms_broadcast_bytes(c, len ? p : NULL, len, root, &err), &err))
                check_bytes(r, "broadcast_bytes", p, len, root, salt);
            free(base);
        }
    group_done(r, c);
}

static void test_bytes_broadcast(void **state) {
    (void)state;
    RUN_SIZES(body_bytes_broadcast, 1, 2, 3, 4);
}

/* Every rank sends byte_lens[k] bytes to the next and receives from the previous. */
static void bytes_ring(mt_rank *r, ms_comm *c) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    ms_error err;
    if (n == 1) { /* nobody to talk to: an empty batch */
        MT_OK(r, ms_p2p_bytes(c, NULL, 0, &err), &err);
        return;
    }
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (size_t k = 0; k < N_BYTE_LENS; k++) {
        size_t len = byte_lens[k];
        uint8_t *out = alloc_guarded(len), *in = alloc_guarded(len);
        fill_bytes(out + 1, len, me, 100 + (int)k);
        ms_p2p_op ops[2] = {{MS_P2P_RECV, prev, in + 1, len, 4},
                            {MS_P2P_SEND, next, out + 1, len, 4}};
        if (MT_OK(r, ms_p2p_bytes(c, ops, 2, &err), &err))
            check_bytes(r, "bytes ring", in + 1, len, prev, 100 + (int)k);
        free(out);
        free(in);
    }
}

/* Bytes from s to d in the all-pairs batch. */
static size_t pair_len(int s, int d) {
    return byte_lens[(size_t)(s * 3 + d) % N_BYTE_LENS];
}

/* Every rank sends to and receives from every other in one batch, receives first and in
 * descending peer order, with lengths that differ per pair (some zero). */
static void bytes_all_pairs(mt_rank *r, ms_comm *c) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    if (n < 2) return;
    ms_p2p_op *ops = malloc(sizeof *ops * 2 * (size_t)n);
    uint8_t **bases = malloc(sizeof *bases * 2 * (size_t)n);
    int nops = 0;
    for (int p = n - 1; p >= 0; p--) {
        if (p == me) continue;
        bases[nops] = alloc_guarded(pair_len(p, me));
        ops[nops] = (ms_p2p_op){MS_P2P_RECV, p, bases[nops] + 1, pair_len(p, me), p};
        nops++;
    }
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        bases[nops] = alloc_guarded(pair_len(me, p));
        fill_bytes(bases[nops] + 1, pair_len(me, p), me, 200 + p);
        ops[nops] = (ms_p2p_op){MS_P2P_SEND, p, bases[nops] + 1, pair_len(me, p), me};
        nops++;
    }
    ms_error err;
    if (MT_OK(r, ms_p2p_bytes(c, ops, nops, &err), &err))
        for (int i = 0; i < nops; i++)
            if (ops[i].kind == MS_P2P_RECV)
                check_bytes(r, "bytes all pairs", ops[i].buf, ops[i].count, ops[i].peer, 200 + me);
    for (int i = 0; i < nops; i++) free(bases[i]);
    free(bases);
    free(ops);
}

/* Single sends and receives between ranks 0 and 1: 4097 bytes, an empty message with no
 * buffer, and a 3-byte reply. */
static void bytes_single(mt_rank *r, ms_comm *c) {
    int me = ms_comm_rank(c);
    if (me > 1 || ms_comm_size(c) < 2) return;
    uint8_t *big = alloc_guarded(4097), *small = alloc_guarded(3);
    ms_error err;
    if (me == 0) {
        fill_bytes(big + 1, 4097, 0, 300);
        MT_OK(r, ms_send_bytes(c, big + 1, 4097, 1, 3, &err), &err);
        MT_OK(r, ms_send_bytes(c, NULL, 0, 1, 4, &err), &err);
        if (MT_OK(r, ms_recv_bytes(c, small + 1, 3, 1, 5, &err), &err))
            check_bytes(r, "reply", small + 1, 3, 1, 301);
    } else {
        if (MT_OK(r, ms_recv_bytes(c, big + 1, 4097, 0, 3, &err), &err))
            check_bytes(r, "recv_bytes", big + 1, 4097, 0, 300);
        MT_OK(r, ms_recv_bytes(c, NULL, 0, 0, 4, &err), &err);
        fill_bytes(small + 1, 3, 1, 301);
        MT_OK(r, ms_send_bytes(c, small + 1, 3, 0, 5, &err), &err);
    }
    free(big);
    free(small);
}

/* The threads backend sees both sides: floats sent to a byte receive are refused, naming
 * both units. */
static void bytes_mixed(mt_rank *r, ms_comm *c) {
    int me = ms_comm_rank(c);
    if (mt_backend() != MS_BACKEND_THREADS || me > 1 || ms_comm_size(c) < 2) return;
    float f[4] = {1, 2, 3, 4};
    uint8_t b[16];
    ms_error err;
    if (me == 0) {
        MT_OK(r, ms_send(c, f, 4, 1, 6, &err), &err);
    } else {
        ms_status st = ms_recv_bytes(c, b, sizeof b, 0, 6, &err);
        MT_CHECK(r, st == MS_ERR_INVALID && strstr(err.msg, "floats") && strstr(err.msg, "bytes"),
                 "floats into a byte receive gave %s (%s)", ms_status_str(st), err.msg);
    }
}

static void body_bytes_p2p(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "bp2p");
    if (!c) return;
    bytes_ring(r, c);
    bytes_all_pairs(r, c);
    bytes_single(r, c);
    bytes_mixed(r, c);
    collective_after_p2p(r, c);
    group_done(r, c);
}

static void test_bytes_p2p(void **state) {
    (void)state;
    RUN_SIZES(body_bytes_p2p, 1, 2, 3, 4);
}

/* --- variable-length messages ---------------------------------------------------------------- */

#define MSG_CAP 4097

static void body_bcast_msg(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "msg");
    if (!c) return;
    int me = ms_comm_rank(c);
    ms_error err;
    uint8_t *base = alloc_guarded(5000), *p = base + 1;
    static const size_t lens[] = {0, 1, 3, MSG_CAP};
    for (int root = 0; root < n; root++)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            int salt = 400 + root * 5 + (int)k;
            memset(base, BYTE_SENTINEL, 5002);
            size_t len = me == root ? lens[k] : 12345;
            if (me == root) fill_bytes(p, lens[k], root, salt);
            if (!MT_OK(r, ms_comm_bcast_msg(c, root, p, &len, MSG_CAP, &err), &err)) continue;
            MT_CHECK(r, len == lens[k], "message from %d: length %zu, want %zu", root, len,
                     lens[k]);
            check_bytes(r, "message", p, lens[k], root, salt);
            MT_CHECK(r, all_sentinel(p + lens[k], 5000 - lens[k]), "message wrote past its length");
        }

    /* Longer than root's cap: every member refuses, nothing moves, nothing is truncated. */
    int root = n - 1;
    memset(base, BYTE_SENTINEL, 5002);
    size_t len = me == root ? 5000 : 12345;
    if (me == root) fill_bytes(p, 5000, root, 1);
    ms_status st = ms_comm_bcast_msg(c, root, p, &len, MSG_CAP, &err);
    MT_CHECK(r, st == MS_ERR_INVALID && strstr(err.msg, "5000") && strstr(err.msg, "4097"),
             "oversized message gave %s (%s)", ms_status_str(st), st ? err.msg : "");
    if (me != root)
        MT_CHECK(r, len == 0 && all_sentinel(base, 5002),
                 "a refused message changed the receiver's length (%zu) or buffer", len);

    /* Members with different caps: the one whose cap is too small refuses alone and keeps
     * its buffer; the others get the message; everybody stays in step. */
    if (n > 1) {
        memset(base, BYTE_SENTINEL, 5002);
        len = me == 0 ? 100 : 0;
        if (me == 0) fill_bytes(p, 100, 0, 2);
        size_t cap = me == n - 1 ? 10 : MSG_CAP;
        st = ms_comm_bcast_msg(c, 0, p, &len, cap, &err);
        if (me == n - 1)
            MT_CHECK(r,
                     st == MS_ERR_INVALID && len == 0 && all_sentinel(base, 5002) &&
                         strstr(err.msg, "100") && strstr(err.msg, "cap of 10"),
                     "a message over this member's cap gave %s, length %zu (%s)", ms_status_str(st),
                     len, st ? err.msg : "");
        else if (MT_OK(r, st, &err))
            MT_CHECK(r, len == 100 && check_bytes(r, "message", p, 100, 0, 2),
                     "message of 100 bytes: length %zu", len);
    }

    /* The communicator is still usable and in step. */
    memset(base, BYTE_SENTINEL, 5002);
    len = me == 0 ? 3 : 0;
    if (me == 0) fill_bytes(p, 3, 0, 3);
    if (MT_OK(r, ms_comm_bcast_msg(c, 0, p, &len, MSG_CAP, &err), &err))
        MT_CHECK(r, len == 3 && check_bytes(r, "message after refusals", p, 3, 0, 3),
                 "message after refusals: length %zu", len);
    free(base);
    group_done(r, c);
}

static void test_bcast_msg(void **state) {
    (void)state;
    RUN_SIZES(body_bcast_msg, 1, 2, 3, 4);
}

/* Observer events of byte calls carry the element type and exactly the bytes moved. */
static void body_bytes_observer(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "bobs");
    if (!c) return;
    int me = ms_comm_rank(c), next = (me + 1) % n, prev = (me + n - 1) % n;
    event_log log = {0};
    ms_comm_set_observer(c, record, &log);
    int64_t seq0 = ms_comm_seq(c);
    uint8_t big[4097] = {0}, a[3] = {1, 2, 3}, b[3], msg[1001] = {0};
    float f[7] = {0};
    size_t len = me == 0 ? sizeof msg : 0;
    ms_error err;
    MT_OK(r, ms_broadcast_bytes(c, big, sizeof big, 1, &err), &err);
    ms_p2p_op ops[2] = {{MS_P2P_SEND, next, a, 3, 0}, {MS_P2P_RECV, prev, b, 3, 0}};
    MT_OK(r, ms_p2p_bytes(c, ops, 2, &err), &err);
    MT_OK(r, ms_comm_bcast_msg(c, 0, msg, &len, sizeof msg, &err), &err);
    MT_OK(r, ms_broadcast(c, f, 7, 0, &err), &err);
    ms_comm_set_observer(c, NULL, NULL);

    static const ms_coll_kind kinds[] = {MS_COLL_BROADCAST, MS_COLL_P2P, MS_COLL_BROADCAST,
                                         MS_COLL_BROADCAST, MS_COLL_BROADCAST};
    static const ms_comm_dtype types[] = {MS_COMM_BYTES, MS_COMM_BYTES, MS_COMM_BYTES,
                                          MS_COMM_BYTES, MS_COMM_F32};
    /* 4097 broadcast, 3 sent, the message's 16-byte header and 1001-byte payload, 7 floats */
    static const size_t bytes[] = {4097, 3, 16, 1001, 28};
    enum { N_EV = 5 };
    MT_CHECK(r, log.n == N_EV, "observer saw %d events, want %d", log.n, N_EV);
    for (int i = 0; i < log.n && i < N_EV; i++) {
        const ms_comm_event *e = &log.ev[i];
        MT_CHECK(r, e->kind == kinds[i] && e->dtype == types[i] && e->bytes == bytes[i],
                 "event %d: %s of %zu %s bytes, want %s of %zu %s bytes", i, ms_coll_name(e->kind),
                 e->bytes, ms_comm_dtype_name(e->dtype), ms_coll_name(kinds[i]), bytes[i],
                 ms_comm_dtype_name(types[i]));
        MT_CHECK(r, e->seq == seq0 + 1 + i && e->status == MS_OK, "event %d: seq %lld, %s", i,
                 (long long)e->seq, ms_status_str(e->status));
    }
    if (log.n == N_EV) {
        const ms_comm_event *e = &log.ev[1];
        size_t sent = 0;
        for (int i = 0; i < e->n_p2p; i++)
            if (e->p2p[i].kind == MS_P2P_SEND)
                sent += e->p2p[i].count * ms_comm_dtype_size(e->dtype);
        MT_CHECK(r, e->n_p2p == 2 && sent == e->bytes, "p2p event: %d ops, %zu bytes sent",
                 e->n_p2p, sent);
        MT_CHECK(r, log.ev[0].root == 1 && log.ev[2].root == 0, "broadcast roots %d, %d",
                 log.ev[0].root, log.ev[2].root);
    }
    group_done(r, c);
}

static void test_bytes_observer(void **state) {
    (void)state;
    RUN_SIZES(body_bytes_observer, 3);
}

/* A byte broadcast that rank 2 never joins times out naming rank 2 (and only it); rank 2's
 * late call fails fast. (The byte send nobody receives is in body_p2p_timeout.) */
static void body_bytes_timeout(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *c = fresh_group(r, 3, "btmo");
    ms_error err;
    /* Buffers outlive every call on c: a backend may still hold on to them after a failure. */
    static uint8_t bufs[3][4097];
    uint8_t *buf = bufs[ms_comm_rank(r->ctx->world) % 3];
    int me = c ? ms_comm_rank(c) : -1;
    if (c && me < 2) {
        int64_t t0 = ms_now_ns();
        ms_status st = ms_broadcast_bytes(c, buf, 4097, 0, &err);
        int64_t dt = ms_now_ns() - t0;
        MT_CHECK(r, st == MS_ERR_TIMEOUT, "byte broadcast without rank 2 gave %s, want timeout",
                 ms_status_str(st));
        MT_CHECK(r, dt < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS, "timed out late, after %lld ms",
                 (long long)(dt / 1000000));
        if (st == MS_ERR_TIMEOUT)
            MT_CHECK(r,
                     strstr(err.msg, "broadcast") && strstr(err.msg, "btmo") &&
                         strstr(err.msg, "2 (world 2)") && !strstr(err.msg, "0 (world 0)") &&
                         !strstr(err.msg, "1 (world 1)"),
                     "timeout message does not name exactly the missing rank: %s", err.msg);
    }
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    if (c && me == 2) {
        int64_t t0 = ms_now_ns();
        ms_status st = ms_broadcast_bytes(c, buf, 4097, 0, &err);
        if (mt_backend() == MS_BACKEND_THREADS)
            MT_CHECK(r, st == MS_ERR_COMM, "late byte broadcast gave %s, want comm error",
                     ms_status_str(st));
        MT_CHECK(r, ms_now_ns() - t0 < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS,
                 "late byte broadcast took too long");
    }
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    ms_comm_destroy(c);
}

static void test_bytes_timeout(void **state) {
    (void)state;
    RUN_SIZES(body_bytes_timeout, 3);
}

/* --- stress: many small calls on oversubscribed ranks ------------------------------------------
 */

static void body_stress(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "stress");
    if (!c) return;
    int me = ms_comm_rank(c);
    float send[64], recv[64], ring[8];
    ms_error err;
    for (int it = 0; it < 300 && !r->failures; it++) {
        size_t count = (size_t)(it % 64);
        ms_reduce_op op = (ms_reduce_op)(it % MS_REDUCE_COUNT);
        for (size_t i = 0; i < count; i++) send[i] = val(me, i, it);
        if (MT_OK(r, ms_all_reduce(c, send, recv, count, op, &err), &err))
            check_reduced(r, "stress all_reduce", recv, count, 0, n, it, op);
        if (it % 7 == 0 && n > 1) {
            int next = (me + 1) % n, prev = (me + n - 1) % n;
            fill_msg(send, 8, me, next, it);
            ms_p2p_op ops[2] = {{MS_P2P_SEND, next, send, 8, 1}, {MS_P2P_RECV, prev, ring, 8, 1}};
            if (MT_OK(r, ms_p2p(c, ops, 2, &err), &err))
                check_msg(r, "stress ring", ring, 8, prev, me, it);
        }
        if (it % 5 == 0) MT_OK(r, ms_barrier(c, &err), &err);
        if (it % 3 == 0) p2p_many(r, c); /* FIFO per tag while entries are reused */
    }
    group_done(r, c);
}

static void test_stress(void **state) {
    (void)state;
    RUN_SIZES(body_stress, 2, 8);
}

/* --- non-blocking collectives ------------------------------------------------------------------
 */

/* One non-blocking call of the mix below, and what it must produce. */
typedef struct async_call {
    ms_coll_kind kind;
    ms_reduce_op op;
    int salt, pattern;
    size_t count; /* all_reduce */
    size_t counts[8];
    float *send, *recv;
    ms_comm_request *req;
} async_call;

#define N_ASYNC 24

/* Call i of the mix: all_reduce (sizes from 0 up, in place on odd i), reduce_scatter and
 * all_gather with uneven counts. */
static void async_issue(mt_rank *r, ms_comm *c, async_call *a, int i) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    memset(a, 0, sizeof *a);
    a->kind = i % 3 == 0   ? MS_COLL_ALL_REDUCE
              : i % 3 == 1 ? MS_COLL_REDUCE_SCATTER
                           : MS_COLL_ALL_GATHER;
    a->op = (ms_reduce_op)(i % MS_REDUCE_COUNT);
    a->salt = 100 + i;
    a->pattern = i % N_PATTERNS;
    size_t total = 0;
    for (int p = 0; p < n; p++) total += a->counts[p] = pattern_count(a->pattern, p);
    size_t nsend = a->kind == MS_COLL_ALL_REDUCE   ? (a->count = reduce_counts[i % N_REDUCE_COUNTS])
                   : a->kind == MS_COLL_ALL_GATHER ? a->counts[me]
                                                   : total;
    size_t nrecv = a->kind == MS_COLL_ALL_REDUCE       ? a->count
                   : a->kind == MS_COLL_REDUCE_SCATTER ? a->counts[me]
                                                       : total;
    a->send = alloc_floats(nsend);
    a->recv = alloc_floats(nrecv);
    for (size_t k = 0; k < nsend; k++) a->send[k] = val(me, k, a->salt);
    ms_error err;
    if (a->kind == MS_COLL_ALL_REDUCE)
        a->req = ms_iall_reduce(c, a->send, i % 2 ? a->send : a->recv, a->count, a->op, &err);
    else if (a->kind == MS_COLL_REDUCE_SCATTER)
        a->req = ms_ireduce_scatter(c, a->send, a->recv, a->counts, a->op, &err);
    else
        a->req = ms_iall_gather(c, a->send, a->recv, a->counts, &err);
    MT_CHECK(r, a->req, "issuing non-blocking call %d failed: %s", i, err.msg);
}

/* Checks call i's result against the reference, then frees its buffers. */
static void async_check(mt_rank *r, ms_comm *c, async_call *a, int i) {
    int n = ms_comm_size(c), me = ms_comm_rank(c);
    if (a->kind == MS_COLL_ALL_REDUCE) {
        check_reduced(r, "iall_reduce", i % 2 ? a->send : a->recv, a->count, 0, n, a->salt, a->op);
    } else if (a->kind == MS_COLL_REDUCE_SCATTER) {
        size_t off = 0;
        for (int p = 0; p < me; p++) off += a->counts[p];
        check_reduced(r, "ireduce_scatter", a->recv, a->counts[me], off, n, a->salt, a->op);
    } else {
        size_t off = 0;
        for (int p = 0; p < n; p++)
            for (size_t k = 0; k < a->counts[p]; k++, off++)
                MT_CHECK(r, a->recv[off] == val(p, k, a->salt),
                         "iall_gather %d: block %d [%zu] = %g", i, p, k, (double)a->recv[off]);
    }
    free(a->send);
    free(a->recv);
}

/* Many calls in flight on two communicators at once, with a blocking call between them;
 * waited for out of order (reverse, then by polling), every result checked. */
static void body_async_many(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "async");
    if (!c) return;
    ms_comm *c2 = NULL;
    ms_error err;
    MT_OK(r, ms_comm_split(c, 0, -ms_comm_rank(c), "async2", &c2, &err), &err); /* reversed */
    async_call *a = calloc(N_ASYNC, sizeof *a), *b = calloc(N_ASYNC, sizeof *b);
    for (int i = 0; i < N_ASYNC; i++) {
        async_issue(r, c, &a[i], i);
        async_issue(r, c2, &b[i], N_ASYNC - 1 - i);
        if (i == N_ASYNC / 2) { /* a blocking call keeps its place in the order */
            float x = (float)ms_comm_rank(c), y = 0;
            if (MT_OK(r, ms_all_reduce(c, &x, &y, 1, MS_REDUCE_SUM, &err), &err))
                MT_CHECK(r, y == (float)(n * (n - 1) / 2), "blocking all_reduce between gave %g",
                         (double)y);
        }
    }
    for (int i = N_ASYNC - 1; i >= 0; i--)
        if (MT_OK(r, ms_comm_wait(a[i].req, &err), &err)) async_check(r, c, &a[i], i);
    for (int left = N_ASYNC; left > 0;) {
        for (int i = 0; i < N_ASYNC; i++) {
            if (!b[i].req) continue;
            bool done = false;
            ms_status st = ms_comm_test(b[i].req, &done, &err);
            if (!done) continue;
            b[i].req = NULL;
            left--;
            if (MT_OK(r, st, &err)) async_check(r, c2, &b[i], N_ASYNC - 1 - i);
        }
    }
    MT_CHECK(r, ms_comm_in_flight(c) == 0 && ms_comm_in_flight(c2) == 0, "calls left in flight");
    free(a);
    free(b);
    ms_comm_destroy(c2); /* nothing pending */
    group_done(r, c);
}

static void test_async_many(void **state) {
    (void)state;
    RUN_SIZES(body_async_many, 1, 2, 3, 4);
}

/* A call progresses without its issuer: after issuing, the rank only polls ms_comm_test (no
 * wait) while the call completes. Events come to the observer on the waiting thread, with
 * issue <= start <= end, flagged non-blocking, in sequence order. */
typedef struct async_log {
    event_log log;
    pthread_t waiter;
    int wrong_thread;
} async_log;

static void async_record(void *user, const ms_comm_event *ev) {
    async_log *l = user;
    if (!pthread_equal(pthread_self(), l->waiter)) l->wrong_thread++;
    record(&l->log, ev);
}

static void body_async_progress(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "async_pr");
    if (!c) return;
    async_log l = {.waiter = pthread_self()};
    ms_comm_set_observer(c, async_record, &l);
    int64_t seq0 = ms_comm_seq(c);
    enum { COUNT = 1 << 16 };
    float *x = alloc_floats(COUNT), *y = alloc_floats(COUNT);
    for (size_t i = 0; i < COUNT; i++) x[i] = val(ms_comm_rank(c), i, 7);
    ms_error err;
    ms_comm_request *q[3];
    for (int k = 0; k < 3; k++) q[k] = ms_iall_reduce(c, x, y, COUNT, MS_REDUCE_SUM, &err);
    MT_CHECK(r, l.log.n == 0, "observer called before any wait");
    bool done = false;
    int64_t t_end = ms_now_ns() + 20000000000LL;
    for (int k = 2; k >= 0; k--) { /* the last first: it completes only after the others */
        while (!(done = false) && MT_OK(r, ms_comm_test(q[k], &done, &err), &err) && !done &&
               ms_now_ns() < t_end)
            sched_yield();
        MT_CHECK(r, done, "call %d made no progress while its issuer only polled", k);
    }
    if (done) check_reduced(r, "polled iall_reduce", y, COUNT, 0, n, 7, MS_REDUCE_SUM);
    ms_comm_set_observer(c, NULL, NULL);
    MT_CHECK(r, l.wrong_thread == 0, "%d events reported on another thread", l.wrong_thread);
    MT_CHECK(r, l.log.n == 3, "observer saw %d events, want 3", l.log.n);
    for (int i = 0; i < l.log.n; i++) {
        const ms_comm_event *e = &l.log.ev[i];
        MT_CHECK(r, e->async && e->kind == MS_COLL_ALL_REDUCE && e->bytes == COUNT * 4,
                 "event %d: %s async=%d bytes=%zu", i, ms_coll_name(e->kind), e->async, e->bytes);
        MT_CHECK(r, e->t_issue_ns <= e->t_start_ns && e->t_start_ns <= e->t_end_ns,
                 "event %d: issue %lld, start %lld, end %lld", i, (long long)e->t_issue_ns,
                 (long long)e->t_start_ns, (long long)e->t_end_ns);
        MT_CHECK(r, e->seq == seq0 + 3 - i, "event %d: seq %lld, want %lld (waited in reverse)", i,
                 (long long)e->seq, (long long)(seq0 + 3 - i));
    }
    free(x);
    free(y);
    group_done(r, c);
}

static void test_async_progress(void **state) {
    (void)state;
    RUN_SIZES(body_async_progress, 2, 4);
}

/* Bad arguments fail at issue with no request and no sequence number; size 0 and a single
 * rank complete; waiting for NULL is fine. */
static void body_async_args(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "async_args");
    if (!c) return;
    ms_error err;
    float x[4] = {0};
    int64_t seq = ms_comm_seq(c);
    MT_CHECK(r, !ms_iall_reduce(c, NULL, x, 4, MS_REDUCE_SUM, &err) && err.code == MS_ERR_INVALID,
             "NULL send accepted");
    MT_CHECK(r, !ms_iall_reduce(c, x, x, 4, (ms_reduce_op)99, &err) && err.code == MS_ERR_INVALID,
             "bad op accepted");
    MT_CHECK(r, !ms_iall_gather(c, x, x, NULL, &err) && err.code == MS_ERR_INVALID,
             "NULL counts accepted");
    MT_CHECK(r, ms_comm_seq(c) == seq, "a refused call took a sequence number");
    size_t counts[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    if (n > 1)
        MT_CHECK(r, !ms_ireduce_scatter(c, x, x, counts, MS_REDUCE_SUM, &err),
                 "in-place reduce_scatter accepted");
    ms_comm_request *q = ms_iall_reduce(c, NULL, NULL, 0, MS_REDUCE_SUM, &err);
    MT_CHECK(r, q, "size-0 iall_reduce refused: %s", err.msg);
    MT_OK(r, ms_comm_wait(q, &err), &err);
    MT_OK(r, ms_comm_wait(NULL, &err), &err);
    group_done(r, c);
}

static void test_async_args(void **state) {
    (void)state;
    RUN_SIZES(body_async_args, 1, 3);
}

/* Rank 2 never issues: ranks 0 and 1 get the timeout (naming rank 2) from their first wait,
 * whichever request it is for, and from the timed-out call's own wait; a broken-communicator
 * error from later calls and from the call queued behind it. A blocking call made before any
 * wait reports the timeout itself. The world is unaffected. */
static void body_async_timeout(mt_rank *r, void *arg) {
    (void)arg;
    ms_comm *c = fresh_group(r, 3, "atmo_group");
    ms_error err;
    float send[100] = {0}, recv[3][100];
    int me = c ? ms_comm_rank(c) : -1;
    if (c && me < 2) {
        int64_t t0 = ms_now_ns();
        ms_comm_request *q[3];
        for (int k = 0; k < 3; k++)
            q[k] = ms_iall_reduce(c, send, recv[k], 100, MS_REDUCE_SUM, &err);
        MT_CHECK(r, q[0] && q[1] && q[2], "issue failed: %s", err.msg);
        MT_CHECK(r, ms_now_ns() - t0 < SHORT_TIMEOUT_MS * 1000000LL, "issuing blocked");
        /* Waited out of order: the last call, refused because the first timed out, reports
         * that timeout, naming rank 2. */
        ms_status st = ms_comm_wait(q[2], &err);
        MT_CHECK(r, st == MS_ERR_TIMEOUT, "first wait gave %s, want timeout", ms_status_str(st));
        if (st == MS_ERR_TIMEOUT)
            MT_CHECK(r,
                     strstr(err.msg, "all_reduce") && strstr(err.msg, "atmo_group") &&
                         strstr(err.msg, "seq") && strstr(err.msg, "2 (world 2)"),
                     "timeout message lacks op, group, seq or missing rank: %s", err.msg);
        st = ms_barrier(c, &err);
        MT_CHECK(r, st == MS_ERR_COMM && strstr(err.msg, "broken"),
                 "blocking call after the timeout gave %s (%s), want broken", ms_status_str(st),
                 err.msg);
        st = ms_comm_wait(q[0], &err);
        MT_CHECK(r, st == MS_ERR_TIMEOUT && strstr(err.msg, "2 (world 2)"),
                 "the timed-out call's own wait gave %s: %s", ms_status_str(st), err.msg);
        st = ms_comm_wait(q[1], &err);
        MT_CHECK(r, st == MS_ERR_COMM && strstr(err.msg, "broken"),
                 "queued call behind a timeout gave %s (%s), want broken", ms_status_str(st),
                 err.msg);
        MT_CHECK(r, ms_now_ns() - t0 < SHORT_TIMEOUT_MS * 1000000LL + SLACK_NS, "took too long");
        MT_CHECK(
            r, !ms_iall_reduce(c, send, recv[0], 1, MS_REDUCE_SUM, &err) && err.code == MS_ERR_COMM,
            "issue on a broken communicator accepted");
    }
    /* A blocking call before any wait learns of the timeout itself. */
    ms_comm *c2 = fresh_group(r, 3, "atmo_block");
    if (c2 && ms_comm_rank(c2) < 2) {
        ms_comm_request *q = ms_iall_reduce(c2, send, recv[0], 100, MS_REDUCE_SUM, &err);
        ms_status st = ms_barrier(c2, &err);
        MT_CHECK(r, st == MS_ERR_TIMEOUT && strstr(err.msg, "2 (world 2)"),
                 "blocking call behind a timed-out one gave %s: %s", ms_status_str(st), err.msg);
        ms_comm_wait(q, &err);
    }
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    ms_comm_destroy(c2);
    MT_OK(r, ms_barrier(r->ctx->world, &err), &err);
    ms_comm_destroy(c);
    float one = 1, sum = 0;
    if (MT_OK(r, ms_all_reduce(r->ctx->world, &one, &sum, 1, MS_REDUCE_SUM, &err), &err))
        MT_CHECK(r, sum == (float)ms_comm_size(r->ctx->world), "world all_reduce gave %g",
                 (double)sum);
}

static void test_async_timeout(void **state) {
    (void)state;
    RUN_SIZES(body_async_timeout, 3);
}

/* --- bf16 ------------------------------------------------------------------------------------
 *
 * Every bf16 result must equal, bit for bit and on every rank, the reference computed here from
 * the same inputs: widened, reduced in fp32 in rank order, rounded once (ms_bf16_from_f32). The
 * inputs put one large value (256..768, whose bf16 ulp is 2..4) among small ones (0.75..1.5) on
 * most elements: reduced pairwise in bf16 the small ones vanish into the large one, reduced in
 * fp32 they add up, so a backend that rounds at every step fails (bf16_inputs_matter checks
 * that the two references do differ). */

static uint16_t hval(int r, int n, size_t i, int salt) {
    size_t h = (size_t)r * 37 + i * 11 + (size_t)salt * 5;
    if (i % 5 == 4) return ms_bf16_from_f32(val(r, i, salt)); /* exact in bf16 too */
    if (r == (int)((i + (size_t)salt) % (size_t)n))
        return ms_bf16_from_f32(256.0f * (float)(1 + (i + (size_t)salt) % 3));
    return ms_bf16_from_f32((h / 4 % 3 ? 1.0f : -1.0f) * (0.75f + 0.25f * (float)(h % 4)));
}

static uint16_t bf16_ref(int n, size_t i, int salt, ms_reduce_op op, bool pairwise) {
    float acc = ms_f32_from_bf16(hval(0, n, i, salt));
    for (int p = 1; p < n; p++) {
        /* A float sum computed in double and rounded to float is the float sum. */
        acc = (float)fold(acc, ms_f32_from_bf16(hval(p, n, i, salt)), op);
        if (pairwise) acc = ms_f32_from_bf16(ms_bf16_from_f32(acc));
    }
    if (op == MS_REDUCE_AVG) acc *= 1.0f / (float)n;
    return ms_bf16_from_f32(acc);
}

static uint16_t *alloc_bf16(size_t n) {
    uint16_t *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = 0xdead;
    return p;
}

/* got[0..count) must be the reduction of elements off.. of every rank's input, bit for bit. */
static void check_bf16_reduced(mt_rank *r, const char *what, const uint16_t *got, size_t count,
                               size_t off, int n, int salt, ms_reduce_op op) {
    for (size_t i = 0; i < count; i++) {
        uint16_t want = bf16_ref(n, off + i, salt, op, false);
        if (got[i] != want) {
            mt_failf(r, __FILE__, __LINE__,
                     "%s: n=%d op=%s count=%zu: [%zu] = %g (0x%04x), want %g (0x%04x)", what, n,
                     ms_reduce_op_name(op), count, i, (double)ms_f32_from_bf16(got[i]), got[i],
                     (double)ms_f32_from_bf16(want), want);
            return;
        }
    }
}

/* got[0..count) must be rank p's input from element off on, with salt. */
static int check_bf16_block(mt_rank *r, const char *what, const uint16_t *got, size_t count, int p,
                            int n, size_t off, int salt) {
    for (size_t i = 0; i < count; i++)
        if (got[i] != hval(p, n, off + i, salt)) {
            mt_failf(r, __FILE__, __LINE__, "%s: n=%d: rank %d's [%zu] = 0x%04x, want 0x%04x", what,
                     n, p, off + i, got[i], hval(p, n, off + i, salt));
            return 0;
        }
    return 1;
}

static void test_bf16_inputs_matter(void **state) {
    (void)state;
    for (int n = 3; n <= 4; n++) {
        int differ = 0;
        for (size_t i = 0; i < 64; i++)
            differ +=
                bf16_ref(n, i, 1, MS_REDUCE_SUM, false) != bf16_ref(n, i, 1, MS_REDUCE_SUM, true);
        assert_true(differ >= 8);
    }
}

/* Every op: reduce_scatter of each uneven pattern, then all_reduce (in place on odd cases) of
 * sizes from 0 to several reduction sub-chunks. */
static void bf16_reductions(mt_rank *r, ms_comm *c) {
    const int n = ms_comm_size(c), me = ms_comm_rank(c);
    static const size_t sizes[N_PATTERNS] = {0, 1, 5, 17, 259, 12289};
    size_t counts[8];
    ms_error err;
    for (int k = 0; k < MS_REDUCE_COUNT * N_PATTERNS; k++) {
        const ms_reduce_op op = (ms_reduce_op)(k % MS_REDUCE_COUNT);
        const int salt = 300 + k;
        size_t off, total = pattern_layout(k / MS_REDUCE_COUNT, n, me, counts, &off);
        size_t count = sizes[k / MS_REDUCE_COUNT], len = total > count ? total : count;
        uint16_t *send = alloc_bf16(len + 1), *part = alloc_bf16(counts[me] + 1),
                 *all = alloc_bf16(count + 1);
        for (size_t i = 0; i < len; i++) send[i] = hval(me, n, i, salt);
        if (MT_OK(r, ms_reduce_scatter_dt(c, MS_COMM_BF16, send, part, counts, op, &err), &err)) {
            check_bf16_reduced(r, "bf16 reduce_scatter", part, counts[me], off, n, salt, op);
            MT_CHECK(r, part[counts[me]] == 0xdead, "bf16 reduce_scatter wrote past its block");
        }
        uint16_t *out = k % 2 ? send : all;
        if (MT_OK(r, ms_all_reduce_dt(c, MS_COMM_BF16, send, out, count, op, &err), &err)) {
            check_bf16_reduced(r, k % 2 ? "bf16 all_reduce in place" : "bf16 all_reduce", out,
                               count, 0, n, salt, op);
            MT_CHECK(r, all[count] == 0xdead, "bf16 all_reduce wrote past the end");
        }
        free(send);
        free(part);
        free(all);
    }
}

/* all_gather, all_to_all and broadcast of bf16 move exact bits, with uneven counts. */
static void bf16_moves(mt_rank *r, ms_comm *c) {
    const int n = ms_comm_size(c);
    int me = ms_comm_rank(c);
    size_t *counts = malloc(sizeof(size_t) * 5 * (size_t)n), *sc = counts + n, *sd = sc + n,
           *rc = sd + n, *rd = rc + n;
    ms_error err;
    for (int pat = 0; pat < N_PATTERNS; pat++) {
        size_t total = 0;
        for (int p = 0; p < n; p++) total += counts[p] = pattern_count(pat, p);
        uint16_t *send = alloc_bf16(counts[me]), *recv = alloc_bf16(total + 1);
        for (size_t i = 0; i < counts[me]; i++) send[i] = hval(me, n, i, pat);
        if (MT_OK(r, ms_all_gather_dt(c, MS_COMM_BF16, send, recv, counts, &err), &err)) {
            size_t off = 0;
            for (int p = 0; p < n; off += counts[p], p++)
                if (!check_bf16_block(r, "bf16 all_gather", recv + off, counts[p], p, n, 0, pat))
                    break;
            MT_CHECK(r, recv[total] == 0xdead, "bf16 all_gather wrote past the end");
        }
        free(send);
        free(recv);
    }
    size_t send_len = 0, recv_len = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = a2a_count(me, p, 1), sd[p] = send_len, send_len += sc[p] + 1;
        rc[p] = a2a_count(p, me, 1), rd[p] = recv_len, recv_len += rc[p] + 1;
    }
    uint16_t *send = alloc_bf16(send_len), *recv = alloc_bf16(recv_len);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < sc[p]; i++) send[sd[p] + i] = hval(me, n, i, 50 + p);
    if (MT_OK(r, ms_all_to_all_dt(c, MS_COMM_BF16, send, sc, sd, recv, rc, rd, &err), &err))
        for (int p = 0; p < n; p++) {
            check_bf16_block(r, "bf16 all_to_all", recv + rd[p], rc[p], p, n, 0, 50 + me);
            MT_CHECK(r, recv[rd[p] + rc[p]] == 0xdead, "bf16 all_to_all wrote past a block");
        }
    for (int root = 0; root < n; root++) {
        uint16_t *buf = alloc_bf16(5004);
        if (me == root)
            for (size_t i = 0; i < 5003; i++) buf[i] = hval(root, n, i, 70);
        if (MT_OK(r, ms_broadcast_dt(c, MS_COMM_BF16, buf, 5003, root, &err), &err)) {
            check_bf16_block(r, "bf16 broadcast", buf, 5003, root, n, 0, 70);
            MT_CHECK(r, buf[5003] == 0xdead, "bf16 broadcast wrote past the end");
        }
        free(buf);
    }
    free(send);
    free(recv);
    free(counts);
}

/* A ring of bf16 messages (one batch each way), then single sends and receives. */
static void bf16_p2p(mt_rank *r, ms_comm *c) {
    const int n = ms_comm_size(c);
    int me = ms_comm_rank(c), next = (me + 1) % n, prev = (me + n - 1) % n;
    const size_t count = 3001;
    uint16_t *out = alloc_bf16(count), *in = alloc_bf16(count + 1);
    for (size_t i = 0; i < count; i++) out[i] = hval(me, n, i, 90 + next);
    ms_error err;
    ms_p2p_op ops[2] = {{MS_P2P_SEND, next, out, count, 7}, {MS_P2P_RECV, prev, in, count, 7}};
    if (MT_OK(r, ms_p2p_dt(c, MS_COMM_BF16, ops, 2, &err), &err)) {
        check_bf16_block(r, "bf16 p2p", in, count, prev, n, 0, 90 + me);
        MT_CHECK(r, in[count] == 0xdead, "bf16 p2p wrote past the end");
    }
    memset(in, 0, count * sizeof *in);
    if (me == 0) {
        MT_OK(r, ms_send_dt(c, MS_COMM_BF16, out, count, next, 3, &err), &err);
        if (MT_OK(r, ms_recv_dt(c, MS_COMM_BF16, in, count, prev, 3, &err), &err))
            check_bf16_block(r, "bf16 send/recv", in, count, prev, n, 0, 90 + me);
    } else {
        if (MT_OK(r, ms_recv_dt(c, MS_COMM_BF16, in, count, prev, 3, &err), &err))
            check_bf16_block(r, "bf16 send/recv", in, count, prev, n, 0, 90 + me);
        MT_OK(r, ms_send_dt(c, MS_COMM_BF16, out, count, next, 3, &err), &err);
    }
    free(out);
    free(in);
}

/* Non-blocking bf16 calls, several in flight, waited for in reverse order. */
static void bf16_async(mt_rank *r, ms_comm *c) {
    const int n = ms_comm_size(c);
    int me = ms_comm_rank(c);
    enum { K = 9 };
    uint16_t *send[K], *recv[K];
    ms_comm_request *req[K];
    size_t counts[8], total = 0, off = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = pattern_count(4, p);
        if (p < me) off += counts[p];
        total += counts[p];
    }
    ms_error err;
    for (int k = 0; k < K; k++) {
        ms_reduce_op op = (ms_reduce_op)(k % MS_REDUCE_COUNT);
        send[k] = alloc_bf16(total + 1);
        recv[k] = alloc_bf16(total + 1);
        for (size_t i = 0; i < total; i++) send[k][i] = hval(me, n, i, 200 + k);
        if (k % 3 == 0)
            req[k] = ms_iall_reduce_dt(c, MS_COMM_BF16, send[k], send[k], total, op, &err);
        else if (k % 3 == 1)
            req[k] = ms_ireduce_scatter_dt(c, MS_COMM_BF16, send[k], recv[k], counts, op, &err);
        else
            req[k] = ms_iall_gather_dt(c, MS_COMM_BF16, send[k], recv[k], counts, &err);
        MT_CHECK(r, req[k], "issuing bf16 call %d: %s", k, err.msg);
    }
    for (int k = K - 1; k >= 0; k--) {
        ms_reduce_op op = (ms_reduce_op)(k % MS_REDUCE_COUNT);
        if (req[k] && MT_OK(r, ms_comm_wait(req[k], &err), &err)) {
            if (k % 3 == 0)
                check_bf16_reduced(r, "bf16 iall_reduce", send[k], total, 0, n, 200 + k, op);
            else if (k % 3 == 1)
                check_bf16_reduced(r, "bf16 ireduce_scatter", recv[k], counts[me], off, n, 200 + k,
                                   op);
            else
                for (int p = 0, at = 0; p < n; at += (int)counts[p], p++)
                    check_bf16_block(r, "bf16 iall_gather", recv[k] + at, counts[p], p, n, 0,
                                     200 + k);
        }
        free(send[k]);
        free(recv[k]);
    }
}

/* Every bf16 call reports half the bytes of the same float32 call, and its type; raw bytes
 * are refused for reductions before anything starts. */
static void bf16_observer(mt_rank *r, ms_comm *c) {
    const int n = ms_comm_size(c), me = ms_comm_rank(c), next = (me + 1) % n;
    event_log log = {0};
    float buf[64] = {0}, out[64];
    size_t counts[4] = {1, 2, 3, 4}, sc[4] = {2, 2, 2, 2}, sd[4] = {0, 2, 4, 6};
    ms_error err = {0};
    int64_t seq0 = ms_comm_seq(c);
    MT_CHECK(r,
             ms_all_reduce_dt(c, MS_COMM_BYTES, buf, out, 8, MS_REDUCE_SUM, &err) ==
                     MS_ERR_INVALID &&
                 strstr(err.msg, "cannot be reduced"),
             "a bytes all_reduce was not refused: %s", err.msg);
    MT_CHECK(r, !ms_ireduce_scatter_dt(c, MS_COMM_BYTES, buf, out, counts, MS_REDUCE_SUM, &err),
             "a bytes reduce_scatter was not refused");
    MT_CHECK(r, ms_comm_seq(c) == seq0, "a refused call took a sequence number");
    ms_comm_set_observer(c, record, &log);
    for (int bf = 0; bf < 2; bf++) {
        ms_comm_dtype dt = bf ? MS_COMM_BF16 : MS_COMM_F32;
        ms_p2p_op ops[2] = {{MS_P2P_SEND, next, buf, 5, 0},
                            {MS_P2P_RECV, (me + n - 1) % n, out, 5, 0}};
        MT_OK(r, ms_all_reduce_dt(c, dt, buf, out, 10, MS_REDUCE_SUM, &err), &err);
        MT_OK(r, ms_reduce_scatter_dt(c, dt, buf, out, counts, MS_REDUCE_MAX, &err), &err);
        MT_OK(r, ms_all_gather_dt(c, dt, buf, out, counts, &err), &err);
        MT_OK(r, ms_all_to_all_dt(c, dt, buf, sc, sd, out, sc, sd, &err), &err);
        MT_OK(r, ms_broadcast_dt(c, dt, buf, 7, 1, &err), &err);
        MT_OK(r, ms_p2p_dt(c, dt, ops, 2, &err), &err);
        MT_OK(r, ms_comm_wait(ms_iall_reduce_dt(c, dt, buf, buf, 9, MS_REDUCE_SUM, &err), &err),
              &err);
    }
    ms_comm_set_observer(c, NULL, NULL);
    MT_CHECK(r, log.n == 14, "observer saw %d events, want 14", log.n);
    for (int i = 0; i < 7 && log.n == 14; i++) {
        const ms_comm_event *f = &log.ev[i], *b = &log.ev[7 + i];
        MT_CHECK(r, f->kind == b->kind && f->dtype == MS_COMM_F32 && b->dtype == MS_COMM_BF16,
                 "event %d: %s/%s vs %s/%s", i, ms_coll_name(f->kind), ms_comm_dtype_name(f->dtype),
                 ms_coll_name(b->kind), ms_comm_dtype_name(b->dtype));
        MT_CHECK(r, f->bytes > 0 && b->bytes * 2 == f->bytes,
                 "%s: bf16 reports %zu bytes, f32 %zu: want half", ms_coll_name(b->kind), b->bytes,
                 f->bytes);
    }
}

/* Every bf16 collective on groups of 1 to 4 (point-to-point and the observer from 2). */
static void body_bf16(mt_rank *r, void *arg) {
    int n = *(const int *)arg;
    ms_comm *c = group_of(r, n, "bf16");
    if (!c) return;
    bf16_reductions(r, c);
    bf16_moves(r, c);
    if (n > 1) bf16_p2p(r, c);
    if (n > 1) bf16_observer(r, c);
    bf16_async(r, c);
    group_done(r, c);
}

static void test_bf16(void **state) {
    (void)state;
    RUN_SIZES(body_bf16, 1, 2, 3, 4);
}

/* --- the threads world itself ------------------------------------------------------------------
 */

static void test_threads_world(void **state) {
    (void)state;
    ms_threads_world *w = NULL;
    ms_error err;
    assert_int_equal(ms_threads_world_create(0, &w, &err), MS_ERR_INVALID);
    assert_int_equal(ms_threads_world_create(1, &w, &err), MS_OK);
    assert_int_equal(ms_threads_world_size(w), 1);
    ms_comm *c = NULL, *again = NULL;
    assert_int_equal(ms_comm_threads_create(w, 1, &again, &err), MS_ERR_INVALID);
    assert_int_equal(ms_comm_threads_create(w, 0, &c, &err), MS_OK);
    assert_int_equal(ms_comm_threads_create(w, 0, &again, &err), MS_ERR_INVALID);
    assert_null(again);
    assert_string_equal(ms_comm_backend(c), "threads");
    assert_int_equal(ms_comm_size(c), 1);
    float x[3] = {1, 2, 3}, y[3];
    assert_int_equal(ms_all_reduce(c, x, y, 3, MS_REDUCE_AVG, &err), MS_OK);
    assert_true(y[0] == 1 && y[1] == 2 && y[2] == 3);
    ms_comm_destroy(c);
    ms_threads_world_destroy(w);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_threads_world),
    cmocka_unit_test(test_all_reduce),
    cmocka_unit_test(test_reduce_scatter),
    cmocka_unit_test(test_all_gather),
    cmocka_unit_test(test_all_to_all),
    cmocka_unit_test(test_broadcast),
    cmocka_unit_test(test_p2p),
    cmocka_unit_test(test_barrier),
    cmocka_unit_test(test_split),
    cmocka_unit_test(test_observer),
    cmocka_unit_test(test_timeout),
    cmocka_unit_test(test_p2p_timeout),
    cmocka_unit_test(test_large),
    cmocka_unit_test(test_stress),
    cmocka_unit_test(test_bytes_broadcast),
    cmocka_unit_test(test_bytes_p2p),
    cmocka_unit_test(test_bcast_msg),
    cmocka_unit_test(test_bytes_observer),
    cmocka_unit_test(test_bytes_timeout),
    cmocka_unit_test(test_async_many),
    cmocka_unit_test(test_async_progress),
    cmocka_unit_test(test_async_args),
    cmocka_unit_test(test_async_timeout),
    cmocka_unit_test(test_bf16_inputs_matter),
    cmocka_unit_test(test_bf16),
};

MT_MAIN("comm", tests)

/* clock.c - aligning rank clocks by ping-pong with rank 0 (see clock.h). */
#include "profiler/record/clock.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

#define CLOCK_TAG 7301
#define PART_BITS 22
#define PART_MASK ((UINT64_C(1) << PART_BITS) - 1)

void ms_clock_encode(int64_t v, float out[3]) {
    uint64_t u = (uint64_t)v;
    out[0] = (float)(u & PART_MASK);
    out[1] = (float)((u >> PART_BITS) & PART_MASK);
    out[2] = (float)(u >> (2 * PART_BITS)); /* 20 bits */
}

int64_t ms_clock_decode(const float in[3]) {
    uint64_t u =
        (uint64_t)in[0] | (uint64_t)in[1] << PART_BITS | (uint64_t)in[2] << (2 * PART_BITS);
    return (int64_t)u;
}

/* Rank 0's side for one peer: the offset and uncertainty of its best round. */
static ms_status probe_peer(ms_comm *c, int peer, int rounds, int64_t *off, int64_t *unc,
                            ms_error *err) {
    int64_t best_rtt = INT64_MAX;
    for (int k = 0; k < rounds; k++) {
        uint8_t ping = (uint8_t)k;
        int64_t pong;
        ms_p2p_op ops[2] = {{MS_P2P_SEND, peer, &ping, sizeof ping, CLOCK_TAG},
                            {MS_P2P_RECV, peer, &pong, sizeof pong, CLOCK_TAG}};
        int64_t ta = ms_now_ns();
        MS_CHECK(ms_p2p_bytes(c, ops, 2, err));
        int64_t tb = ms_now_ns();
        int64_t rtt = tb - ta;
        if (rtt < best_rtt) {
            best_rtt = rtt;
            /* The peer read its clock T at rank-0 time ta + rtt/2, give or take rtt/2. */
            *off = ta + rtt / 2 - pong;
            *unc = (rtt + 1) / 2;
        }
    }
    return MS_OK;
}

/* A non-root rank's side: answer every ping with the time read right after it arrived. */
static ms_status answer_pings(ms_comm *c, int rounds, ms_error *err) {
    for (int k = 0; k < rounds; k++) {
        uint8_t ping;
        MS_CHECK(ms_recv_bytes(c, &ping, sizeof ping, 0, CLOCK_TAG, err));
        int64_t pong = ms_now_ns();
        MS_CHECK(ms_send_bytes(c, &pong, sizeof pong, 0, CLOCK_TAG, err));
    }
    return MS_OK;
}

static ms_status measure(ms_comm *world, int rounds, int64_t *offset_ns, int64_t *uncertainty_ns,
                         ms_error *err) {
    *offset_ns = 0;
    *uncertainty_ns = 0;
    if (rounds < 1 || rounds > 1000)
        return ms_fail(err, MS_ERR_INVALID, "clock alignment: rounds must be 1..1000 (got %d)",
                       rounds);
    int n = ms_comm_size(world), me = ms_comm_rank(world);
    if (n == 1) return MS_OK;
    ms_comm *c = NULL;
    ms_status st = ms_comm_split(world, 0, me, "clock", &c, err);
    if (st != MS_OK) return ms_fail_wrap(err, st, "clock alignment");
    /* Results travel back as one byte broadcast: (offset, uncertainty) per rank. */
    int64_t *res = xcalloc((size_t)n * 2, sizeof *res);
    if (me == 0) {
        for (int r = 1; r < n && st == MS_OK; r++)
            st = probe_peer(c, r, rounds, &res[2 * r], &res[2 * r + 1], err);
    } else {
        st = answer_pings(c, rounds, err);
    }
    if (st == MS_OK) st = ms_broadcast_bytes(c, res, (size_t)n * 2 * sizeof *res, 0, err);
    if (st == MS_OK) {
        *offset_ns = res[2 * me];
        *uncertainty_ns = res[2 * me + 1];
    }
    free(res);
    ms_comm_destroy(c);
    return st == MS_OK ? MS_OK : ms_fail_wrap(err, st, "clock alignment");
}

ms_status ms_clock_measure(ms_comm *world, int rounds, int64_t *offset_ns, int64_t *uncertainty_ns,
                           ms_error *err) {
    return measure(world, rounds, offset_ns, uncertainty_ns, err);
}

ms_status ms_clock_align(ms_comm *world, int rounds, int64_t *offset_ns, int64_t *uncertainty_ns,
                         ms_error *err) {
    MS_CHECK(measure(world, rounds, offset_ns, uncertainty_ns, err));
    if (!strcmp(ms_comm_backend(world), "threads")) {
        /* One process, one CLOCK_MONOTONIC: the true offset is exactly zero. */
        *offset_ns = 0;
        *uncertainty_ns = 0;
    }
    return MS_OK;
}

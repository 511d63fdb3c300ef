/* gather.c - incremental collection of events and group tables on rank 0 (see gather.h). */
#include "profiler/record/gather.h"

#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

/* Events and groups travel as their bytes (gather.h). A tag of its own keeps them apart
 * from any other point-to-point traffic on the communicator. */
#define GATHER_TAG 7302
/* One rank's share always fits a single message of every backend (MPI counts are int). */
static_assert(MS_GATHER_MAX_PER_RANK * sizeof(ms_event) <= (size_t)INT_MAX,
              "a rank's events must fit one message");
static_assert(MS_REC_MAX_GROUPS * sizeof(ms_group) <= (size_t)INT_MAX,
              "a rank's groups must fit one message");

/* Gathers `mine` records of `rec_size` bytes each from every rank into rank 0's `dst`
 * (rank 0's own records are expected at the front of dst already). counts: every rank's
 * count, as exchanged. One point-to-point batch on every rank (possibly empty), so the
 * communicator's sequence numbers stay in step: each rank sends its records to rank 0,
 * which receives them all at once, at their places in dst. */
static ms_status gatherv(ms_comm *comm, const void *src, size_t mine, const size_t *counts,
                         void *dst, size_t rec_size, ms_error *err) {
    int n = ms_comm_size(comm), me = ms_comm_rank(comm);
    if (me != 0) {
        ms_p2p_op send = {MS_P2P_SEND, 0, (void *)src, mine * rec_size, GATHER_TAG};
        return ms_p2p_bytes(comm, &send, mine ? 1 : 0, err);
    }
    ms_p2p_op *ops = xmalloc(sizeof *ops * (size_t)n);
    int nops = 0;
    size_t off = counts[0];
    for (int p = 1; p < n; p++) {
        if (counts[p])
            ops[nops++] = (ms_p2p_op){MS_P2P_RECV, p, (char *)dst + off * rec_size,
                                      counts[p] * rec_size, GATHER_TAG};
        off += counts[p];
    }
    ms_status st = ms_p2p_bytes(comm, ops, nops, err);
    free(ops);
    return st;
}

/* Every rank's (count, limit) pair; identical on all ranks afterwards. */
static ms_status exchange_counts(ms_comm *comm, size_t count, size_t limit, size_t *counts,
                                 size_t *limits, ms_error *err) {
    int n = ms_comm_size(comm);
    float mine[2] = {(float)count, (float)limit}; /* both <= 2^24: exact as floats */
    float *all = xmalloc(sizeof(float) * 2 * (size_t)n);
    size_t *two = xmalloc(sizeof(size_t) * (size_t)n);
    for (int p = 0; p < n; p++) two[p] = 2;
    ms_status st = ms_all_gather(comm, mine, all, two, err);
    if (st == MS_OK)
        for (int p = 0; p < n; p++) {
            counts[p] = (size_t)all[2 * p];
            limits[p] = (size_t)all[2 * p + 1];
        }
    free(all);
    free(two);
    return st;
}

ms_status ms_gather_events(ms_comm *comm, ms_recorder *local, uint64_t *cursor, size_t max_per_rank,
                           ms_event *out, size_t *n_out, int64_t clock_offset_ns, ms_error *err) {
    *n_out = 0;
    int n = ms_comm_size(comm), me = ms_comm_rank(comm);
    if (max_per_rank == 0 || max_per_rank > MS_GATHER_MAX_PER_RANK)
        return ms_fail(err, MS_ERR_INVALID, "event gather: max_per_rank must be 1..%zu (got %zu)",
                       MS_GATHER_MAX_PER_RANK, max_per_rank);
    if (me == 0 && !out)
        return ms_fail(err, MS_ERR_INVALID, "event gather: rank 0 needs an output buffer");

    ms_event *stage = out ? out : xmalloc(sizeof(ms_event) * max_per_rank);
    /* Read with a copy of the cursor: it is committed only if the events got through. */
    uint64_t cur = *cursor;
    size_t k = local ? ms_recorder_read(local, &cur, stage, max_per_rank, NULL) : 0;
    if (clock_offset_ns)
        for (size_t i = 0; i < k; i++) {
            stage[i].t0_ns += clock_offset_ns;
            stage[i].t1_ns += clock_offset_ns;
        }

    ms_status st = MS_OK;
    size_t total = k;
    if (n > 1) {
        size_t *counts = xmalloc(sizeof(size_t) * 2 * (size_t)n), *limits = counts + n;
        st = exchange_counts(comm, k, max_per_rank, counts, limits, err);
        /* Every rank sees every limit, so a mismatch fails on all ranks alike, before rank
         * 0 could receive more than its buffer holds. */
        for (int p = 0; st == MS_OK && p < n; p++)
            if (limits[p] != limits[0] || counts[p] > limits[0])
                st = ms_fail(err, MS_ERR_INVALID,
                             "event gather: rank %d passed max_per_rank %zu but rank 0 passed "
                             "%zu; every rank must pass the same",
                             p, limits[p], limits[0]);
        if (st == MS_OK) st = gatherv(comm, stage, k, counts, out, sizeof(ms_event), err);
        if (st == MS_OK && me == 0) {
            total = 0;
            for (int p = 0; p < n; p++) total += counts[p];
        }
        free(counts);
    }
    if (stage != out) free(stage);
    if (st != MS_OK) return ms_fail_wrap(err, st, "event gather");
    *cursor = cur;
    *n_out = total;
    return MS_OK;
}

ms_status ms_gather_groups(ms_comm *comm, const ms_recorder *local, ms_group *out, int max,
                           int *n_out, ms_error *err) {
    *n_out = 0;
    int n = ms_comm_size(comm), me = ms_comm_rank(comm);
    if (me == 0 && (!out || max < 0))
        return ms_fail(err, MS_ERR_INVALID, "group gather: rank 0 needs an output buffer");
    ms_group *mine = xmalloc(sizeof(ms_group) * MS_REC_MAX_GROUPS);
    size_t k = local ? (size_t)ms_recorder_groups(local, mine, MS_REC_MAX_GROUPS) : 0;
    size_t *counts = xmalloc(sizeof(size_t) * 2 * (size_t)n), *limits = counts + n;
    ms_group *all = NULL;
    ms_status st = MS_OK;
    size_t total = k;
    if (n > 1) {
        st = exchange_counts(comm, k, MS_REC_MAX_GROUPS, counts, limits, err);
        if (st == MS_OK && me == 0) {
            total = 0;
            for (int p = 0; p < n; p++) total += counts[p];
            all = xmalloc(sizeof(ms_group) * (total ? total : 1));
            memcpy(all, mine, sizeof(ms_group) * k);
        }
        if (st == MS_OK) st = gatherv(comm, mine, k, counts, all, sizeof(ms_group), err);
    } else {
        all = mine;
        mine = NULL;
    }
    if (st == MS_OK && me == 0) {
        int m = 0;
        for (size_t i = 0; i < total && m < max; i++) {
            int dup = 0;
            for (int j = 0; j < m && !dup; j++) dup = out[j].id == all[i].id;
            if (!dup) out[m++] = all[i];
        }
        *n_out = m;
    }
    free(all);
    free(mine);
    free(counts);
    return st == MS_OK ? MS_OK : ms_fail_wrap(err, st, "group gather");
}

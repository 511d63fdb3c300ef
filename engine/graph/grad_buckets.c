/* grad_buckets.c - gradient buckets (see grad_buckets.h). */
#include "engine/graph/grad_buckets.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

typedef struct grad {
    int ready, bucket;
    int64_t n;
    size_t offset; /* floats into the storage */
    const float *src;
    float *dst;
    int hits; /* runs of `ready` since the accumulation started */
} grad;

typedef struct bucket {
    int first, count; /* its gradients [first, first + count) */
    size_t offset, floats;
    int mesh_dim;
    ms_reduce_op op;
    ms_comm *comm;
    int packed, finished; /* gradients copied in, and out, this step */
    ms_comm_request *req; /* in flight between the last pack and the first finish */
    bool reduced;         /* waited for this step */
} bucket;

struct ms_grad_buckets {
    size_t cap_floats;
    int passes;
    grad *g;
    int ng, cg;
    bucket *b;
    int nb, cbk;
    size_t floats;
    float *storage;
};

ms_grad_buckets *ms_gb_create(double bucket_mb, int passes) {
    ms_grad_buckets *gb = xcalloc(1, sizeof *gb);
    double cap = bucket_mb * 1024.0 * 1024.0 / sizeof(float);
    gb->cap_floats = cap < 1 ? 1 : (size_t)cap;
    gb->passes = passes < 1 ? 1 : passes;
    return gb;
}

void ms_gb_destroy(ms_grad_buckets *gb) {
    if (!gb) return;
    for (int b = 0; b < gb->nb; b++) ms_comm_wait(gb->b[b].req, NULL); /* errors: moot now */
    free(gb->g);
    free(gb->b);
    free(gb);
}

/* The bucket gradient i joins: the open one if it matches and fits, else a new one. */
static int place(ms_grad_buckets *gb, int i, int mesh_dim, ms_reduce_op op) {
    bucket *last = gb->nb ? &gb->b[gb->nb - 1] : NULL;
    size_t n = (size_t)gb->g[i].n;
    if (last && last->mesh_dim == mesh_dim && last->op == op &&
        last->floats + n <= gb->cap_floats) {
        last->count++;
        last->floats += n;
        return gb->nb - 1;
    }
    if (gb->nb == gb->cbk) {
        gb->cbk = gb->cbk ? 2 * gb->cbk : 16;
        gb->b = xrealloc(gb->b, sizeof *gb->b * (size_t)gb->cbk);
    }
    gb->b[gb->nb] = (bucket){
        .first = i, .count = 1, .offset = gb->floats, .floats = n, .mesh_dim = mesh_dim, .op = op};
    return gb->nb++;
}

int ms_gb_add(ms_grad_buckets *gb, int ready, int64_t n, int mesh_dim, ms_reduce_op op) {
    if (gb->ng == gb->cg) {
        gb->cg = gb->cg ? 2 * gb->cg : 64;
        gb->g = xrealloc(gb->g, sizeof *gb->g * (size_t)gb->cg);
    }
    int i = gb->ng++;
    gb->g[i] = (grad){.ready = ready, .n = n};
    gb->g[i].bucket = place(gb, i, mesh_dim, op);
    gb->g[i].offset = gb->floats;
    gb->floats += (size_t)n;
    return i;
}

int ms_gb_count(const ms_grad_buckets *gb) {
    return gb->ng;
}
int ms_gb_buckets(const ms_grad_buckets *gb) {
    return gb->nb;
}
int ms_gb_bucket_of(const ms_grad_buckets *gb, int i) {
    return gb->g[i].bucket;
}
size_t ms_gb_storage_floats(const ms_grad_buckets *gb) {
    return gb->floats;
}

void ms_gb_bind(ms_grad_buckets *gb, int i, const float *src, float *dst, ms_comm *comm) {
    gb->g[i].src = src;
    gb->g[i].dst = dst;
    gb->b[gb->g[i].bucket].comm = comm;
}

void ms_gb_bind_storage(ms_grad_buckets *gb, float *storage) {
    gb->storage = storage;
}

/* The first gradient final at instruction k (gradients are in ready order), or ng. */
static int first_ready_at(const ms_grad_buckets *gb, int k) {
    int lo = 0, hi = gb->ng;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (gb->g[mid].ready < k)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Kicks the transport of the buckets in flight (ms_comm_progress) from the compute thread. */
static void progress(ms_grad_buckets *gb) {
    ms_comm *last = NULL;
    for (int b = 0; b < gb->nb; b++)
        if (gb->b[b].req && gb->b[b].comm != last) ms_comm_progress(last = gb->b[b].comm);
}

ms_status ms_gb_after(ms_grad_buckets *gb, int k, ms_error *err) {
    progress(gb);
    for (int i = first_ready_at(gb, k); i < gb->ng && gb->g[i].ready == k; i++) {
        grad *g = &gb->g[i];
        if (++g->hits < gb->passes) continue;
        bucket *b = &gb->b[g->bucket];
        memcpy(gb->storage + g->offset, g->src, sizeof(float) * (size_t)g->n);
        if (++b->packed < b->count) continue;
        float *x = gb->storage + b->offset;
        b->req = ms_iall_reduce(b->comm, x, x, b->floats, b->op, err);
        if (!b->req) return err ? err->code : MS_ERR_COMM;
    }
    return MS_OK;
}

ms_status ms_gb_finish(ms_grad_buckets *gb, int i, ms_error *err) {
    grad *g = &gb->g[i];
    bucket *b = &gb->b[g->bucket];
    if (!b->reduced) {
        if (b->packed < b->count)
            return ms_fail(err, MS_ERR_INTERNAL,
                           "gradient bucket %d: grad sync before backward produced all of its "
                           "%d gradients (%d of them)",
                           g->bucket, b->count, b->packed);
        ms_comm_request *req = b->req;
        b->req = NULL;
        b->reduced = true;
        MS_CHECK(ms_comm_wait(req, err));
    }
    memcpy(g->dst, gb->storage + g->offset, sizeof(float) * (size_t)g->n);
    if (++b->finished == b->count) { /* the bucket's step is over */
        b->packed = b->finished = 0;
        b->reduced = false;
        for (int j = b->first; j < b->first + b->count; j++) gb->g[j].hits = 0;
    }
    return MS_OK;
}

void ms_gb_reset(ms_grad_buckets *gb) {
    if (!gb) return;
    for (int i = 0; i < gb->ng; i++) gb->g[i].hits = 0;
    for (int b = 0; b < gb->nb; b++) {
        ms_comm_wait(gb->b[b].req, NULL); /* an abandoned step's: its result is dropped */
        gb->b[b] = (bucket){.first = gb->b[b].first,
                            .count = gb->b[b].count,
                            .offset = gb->b[b].offset,
                            .floats = gb->b[b].floats,
                            .mesh_dim = gb->b[b].mesh_dim,
                            .op = gb->b[b].op,
                            .comm = gb->b[b].comm};
    }
}

/* grad_buckets.c - gradient buckets (see grad_buckets.h). Offsets into the storage are in
 * bytes: buckets of float32 and of bf16 gradients share it, each aligned to its element. */
#include "engine/graph/grad_buckets.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/placement.h"

typedef struct grad {
    int ready, bucket;
    int64_t n;     /* elements of its bucket's type */
    int64_t rows;  /* reduce-scatter: the rows split over the group (n / rows elements each) */
    size_t offset; /* all-reduce: bytes into the storage */
    size_t *part;  /* reduce-scatter: where its block c goes in the send buffer [parts] */
    size_t recv;   /* reduce-scatter: where its shard arrives in the receive buffer */
    const void *src;
    void *dst;
    int hits;      /* runs of `ready` since the accumulation started */
    bool unpacked; /* its reduced values are in dst this step (ms_gb_poll or ms_gb_finish) */
} grad;

typedef struct bucket {
    int first, count; /* its gradients [first, first + count) */
    size_t offset, bytes;
    size_t recv_offset, recv_bytes; /* reduce-scatter: its receive buffer (upper bound) */
    size_t *counts;                 /* reduce-scatter: each member's block in elements [parts] */
    int mesh_dim, parts;            /* parts 0: all-reduce */
    ms_reduce_op op;
    ms_comm_dtype dtype;
    size_t elt; /* bytes per element */
    ms_comm *comm;
    int packed, finished; /* gradients copied in, and out, this step */
    ms_comm_request *req; /* in flight between the last pack and the first finish */
    bool reduced;         /* waited for this step */
} bucket;

struct ms_grad_buckets {
    size_t cap_bytes;
    int passes;
    grad *g;
    int ng, cg;
    bucket *b;
    int nb, cbk;
    size_t bytes, recv_bytes; /* the send buffers, then the receive buffers */
    char *storage;
};

ms_grad_buckets *ms_gb_create(double bucket_mb, int passes) {
    ms_grad_buckets *gb = xcalloc(1, sizeof *gb);
    double cap = bucket_mb * 1024.0 * 1024.0;
    gb->cap_bytes = cap < 1 ? 1 : (size_t)cap;
    gb->passes = passes < 1 ? 1 : passes;
    return gb;
}

void ms_gb_destroy(ms_grad_buckets *gb) {
    if (!gb) return;
    for (int b = 0; b < gb->nb; b++) {
        ms_comm_wait(gb->b[b].req, NULL); /* errors: moot now */
        free(gb->b[b].counts);
    }
    for (int i = 0; i < gb->ng; i++) free(gb->g[i].part);
    free(gb->g);
    free(gb->b);
    free(gb);
}

/* Elements of block c of gradient g (rows split the balanced way, dim 0 outermost). */
static size_t block(const grad *g, int parts, int c, int64_t *row0) {
    int64_t off, len;
    ms_split_part(g->rows, parts, c, &off, &len);
    if (row0) *row0 = off;
    return (size_t)(len * (g->n / g->rows));
}

static size_t align_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

/* Where the receive buffers start: after the send buffers, float-aligned. */
static size_t recv_base(const ms_grad_buckets *gb) {
    return align_up(gb->bytes, sizeof(float));
}

/* The bucket gradient i joins: the open one if it matches and fits, else a new one. */
static int place(ms_grad_buckets *gb, int i, int mesh_dim, int parts, ms_reduce_op op,
                 ms_comm_dtype dt) {
    bucket *last = gb->nb ? &gb->b[gb->nb - 1] : NULL;
    const size_t elt = ms_comm_dtype_size(dt);
    size_t n = (size_t)gb->g[i].n * elt;
    size_t most = parts ? block(&gb->g[i], parts, 0, NULL) * elt : 0; /* part 0 is the largest */
    if (last && last->mesh_dim == mesh_dim && last->parts == parts && last->op == op &&
        last->dtype == dt && last->bytes + n <= gb->cap_bytes) {
        last->count++;
        last->bytes += n;
        last->recv_bytes += most;
        gb->recv_bytes += most;
        return gb->nb - 1;
    }
    if (gb->nb == gb->cbk) {
        gb->cbk = gb->cbk ? 2 * gb->cbk : 16;
        gb->b = xrealloc(gb->b, sizeof *gb->b * (size_t)gb->cbk);
    }
    gb->bytes = align_up(gb->bytes, elt);
    gb->recv_bytes = align_up(gb->recv_bytes, elt);
    gb->b[gb->nb] = (bucket){.first = i,
                             .count = 1,
                             .offset = gb->bytes,
                             .bytes = n,
                             .recv_offset = gb->recv_bytes,
                             .recv_bytes = most,
                             .mesh_dim = mesh_dim,
                             .parts = parts,
                             .op = op,
                             .dtype = dt,
                             .elt = elt};
    gb->recv_bytes += most;
    return gb->nb++;
}

int ms_gb_add_dt(ms_grad_buckets *gb, int ready, int64_t n, int64_t rows, int parts, int mesh_dim,
                 ms_reduce_op op, ms_comm_dtype dt) {
    if (gb->ng == gb->cg) {
        gb->cg = gb->cg ? 2 * gb->cg : 64;
        gb->g = xrealloc(gb->g, sizeof *gb->g * (size_t)gb->cg);
    }
    int i = gb->ng++;
    gb->g[i] = (grad){.ready = ready, .n = n, .rows = rows > 0 ? rows : 1};
    gb->g[i].bucket = place(gb, i, mesh_dim, parts > 1 ? parts : 0, op, dt);
    gb->g[i].offset = gb->bytes;
    gb->bytes += (size_t)n * ms_comm_dtype_size(dt);
    return i;
}

int ms_gb_add(ms_grad_buckets *gb, int ready, int64_t n, int64_t rows, int parts, int mesh_dim,
              ms_reduce_op op) {
    return ms_gb_add_dt(gb, ready, n, rows, parts, mesh_dim, op, MS_COMM_F32);
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
size_t ms_gb_storage_bytes(const ms_grad_buckets *gb) {
    return recv_base(gb) + align_up(gb->recv_bytes, sizeof(float));
}
size_t ms_gb_storage_floats(const ms_grad_buckets *gb) {
    return ms_gb_storage_bytes(gb) / sizeof(float);
}

void ms_gb_bind(ms_grad_buckets *gb, int i, const void *src, void *dst, ms_comm *comm) {
    gb->g[i].src = src;
    gb->g[i].dst = dst;
    gb->b[gb->g[i].bucket].comm = comm;
}

/* A reduce-scatter bucket's send buffer holds member c's blocks of every gradient together
 * (region c, in gradient order), so that member c receives exactly its shards. */
static void layout_scatter(ms_grad_buckets *gb, bucket *b) {
    b->counts = xcalloc((size_t)b->parts, sizeof *b->counts);
    for (int i = b->first; i < b->first + b->count; i++)
        for (int c = 0; c < b->parts; c++) b->counts[c] += block(&gb->g[i], b->parts, c, NULL);
    int me = b->comm ? ms_comm_rank(b->comm) : 0;
    size_t region = b->offset, recv = b->recv_offset;
    for (int c = 0; c < b->parts; c++) {
        size_t at = region;
        for (int i = b->first; i < b->first + b->count; i++) {
            grad *g = &gb->g[i];
            if (!g->part) g->part = xcalloc((size_t)b->parts, sizeof *g->part);
            g->part[c] = at;
            at += block(g, b->parts, c, NULL) * b->elt;
            if (c == me) {
                g->recv = recv_base(gb) + recv;
                recv += block(g, b->parts, c, NULL) * b->elt;
            }
        }
        region += b->counts[c] * b->elt;
    }
}

void ms_gb_bind_storage(ms_grad_buckets *gb, void *storage) {
    gb->storage = storage;
    for (int b = 0; b < gb->nb; b++)
        if (gb->b[b].parts) layout_scatter(gb, &gb->b[b]);
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

/* The device that holds the gradients and the storage: the rank's, which the bucket's
 * communicator was given (comm.h); a communicator without one is on host memory. */
static ms_device *bucket_device(const bucket *b) {
    ms_device *dev = b->comm ? ms_comm_device(b->comm) : NULL;
    return dev ? dev : ms_device_host();
}

static ms_status dcopy(const bucket *b, void *dst, const void *src, size_t bytes, ms_error *err) {
    return ms_device_copy(bucket_device(b), dst, src, bytes, MS_COPY_DEVICE_TO_DEVICE, err);
}

/* Copies gradient g into its bucket's send buffer: whole, or block by block. */
static ms_status pack(ms_grad_buckets *gb, const grad *g, const bucket *b, ms_error *err) {
    if (!b->parts) return dcopy(b, gb->storage + g->offset, g->src, b->elt * (size_t)g->n, err);
    const int64_t row = g->n / g->rows;
    for (int c = 0; c < b->parts; c++) {
        int64_t row0;
        size_t len = block(g, b->parts, c, &row0);
        MS_CHECK(dcopy(b, gb->storage + g->part[c],
                       (const char *)g->src + (size_t)(row0 * row) * b->elt, b->elt * len, err));
    }
    return MS_OK;
}

static ms_comm_request *issue(ms_grad_buckets *gb, bucket *b, ms_error *err) {
    char *x = gb->storage + b->offset;
    if (!b->parts) return ms_iall_reduce_dt(b->comm, b->dtype, x, x, b->bytes / b->elt, b->op, err);
    return ms_ireduce_scatter_dt(b->comm, b->dtype, x, gb->storage + recv_base(gb) + b->recv_offset,
                                 b->counts, b->op, err);
}

ms_status ms_gb_after(ms_grad_buckets *gb, int k, ms_error *err) {
    progress(gb);
    for (int i = first_ready_at(gb, k); i < gb->ng && gb->g[i].ready == k; i++) {
        grad *g = &gb->g[i];
        if (++g->hits < gb->passes) continue;
        bucket *b = &gb->b[g->bucket];
        MS_CHECK(pack(gb, g, b, err));
        if (++b->packed < b->count) continue;
        b->req = issue(gb, b, err);
        if (!b->req) return err ? err->code : MS_ERR_COMM;
    }
    return MS_OK;
}

/* Copies gradient g's reduced values (its shard, when scattered) into its dst. */
static ms_status unpack(ms_grad_buckets *gb, grad *g, const bucket *b, ms_error *err) {
    g->unpacked = true;
    if (!b->parts) return dcopy(b, g->dst, gb->storage + g->offset, b->elt * (size_t)g->n, err);
    int me = ms_comm_rank(b->comm);
    return dcopy(b, g->dst, gb->storage + g->recv, b->elt * block(g, b->parts, me, NULL), err);
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
    if (!g->unpacked) MS_CHECK(unpack(gb, g, b, err));
    if (++b->finished == b->count) { /* the bucket's step is over */
        b->packed = b->finished = 0;
        b->reduced = false;
        for (int j = b->first; j < b->first + b->count; j++)
            gb->g[j].hits = 0, gb->g[j].unpacked = false;
    }
    return MS_OK;
}

ms_status ms_gb_poll(ms_grad_buckets *gb, ms_gb_done_fn done, void *arg, ms_error *err) {
    for (int k = 0; gb && k < gb->nb; k++) {
        bucket *b = &gb->b[k];
        bool over = false;
        if (!b->req || b->reduced) continue;
        MS_CHECK(ms_comm_test(b->req, &over, err));
        if (!over) continue;
        b->req = NULL; /* ms_comm_test freed it */
        b->reduced = true;
        for (int i = b->first; i < b->first + b->count; i++) {
            MS_CHECK(unpack(gb, &gb->g[i], b, err));
            MS_CHECK(done(arg, i, err));
        }
    }
    return MS_OK;
}

void ms_gb_reset(ms_grad_buckets *gb) {
    if (!gb) return;
    for (int i = 0; i < gb->ng; i++) gb->g[i].hits = 0, gb->g[i].unpacked = false;
    for (int b = 0; b < gb->nb; b++) {
        bucket *x = &gb->b[b];
        ms_comm_wait(x->req, NULL); /* an abandoned step's: its result is dropped */
        x->req = NULL;
        x->packed = x->finished = 0;
        x->reduced = false;
    }
}

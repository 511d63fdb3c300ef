/* program_buckets.c - gradient buckets: which gradients share a collective issued during
 * backward. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/graph/grad_buckets.h"
#include "engine/graph/graph_impl.h"
#include "engine/graph/program.h"
#include "engine/core/parallel.h"
#include "engine/ops/select.h"
#include "engine/core/trace_sink.h"

#include "engine/graph/program_impl.h"

/* --- gradient buckets ------------------------------------------------------------------------ */

/* Whether instruction in prog_writes buffer b. */
bool prog_writes(const instr *in, int b) {
    if (in->dst == b) return true;
    for (int i = 0; in->kind == I_BWD && i < MS_OP_MAX_IN; i++)
        if (in->din_buf[i] == b) return true;
    return false;
}

/* The last backward instruction that prog_writes buffer b: after it the gradient is final. */
int prog_final_write(const ms_program *p, int b) {
    for (int k = p->n_backward - 1; k >= p->n_forward; k--)
        if (prog_writes(&p->ins[k], b)) return k;
    return p->n_backward - 1;
}

/* The rows a grad-sync reduce-scatter splits, when it splits the local buffer's dim 0 (ZeRO's
 * S(0) innermost: each member's block a contiguous prog_run of rows) and this rank's block is the
 * target buffer; else 0. */
static int64_t scatter_rows(const ms_program *p, const instr *in) {
    const ms_rstep *st = &in->plan->steps[0];
    const buf *src = &p->bufs[in->src], *dst = &p->bufs[in->dst];
    if (st->after.p[st->mesh_dim].kind != MS_PL_SHARD || st->after.p[st->mesh_dim].dim != 0 ||
        src->lshape.ndim < 1 || src->lshape.d[0] < 1)
        return 0;
    int64_t rows = src->lshape.d[0], off, len;
    ms_split_part(rows, p->mesh->shape[st->mesh_dim], p->coords[st->mesh_dim], &off, &len);
    return len * (src->numel / rows) == dst->numel ? rows : 0;
}

/* A grad-sync reshard that is one all-reduce of same-sized buffers (the data-parallel
 * P -> R) or one reduce-scatter of dim 0 (ZeRO 2 and 3) can prog_run in a bucket; anything else
 * (other shards, several steps) runs as a reshard at grad sync, as without buckets. */
static bool bucketable(const ms_program *p, const instr *in) {
    if (in->kind != I_RESHARD || in->phase != MS_PROG_GRAD_SYNC || !in->plan) return false;
    if (in->plan->nsteps != 1) return false;
    if (in->plan->steps[0].kind == MS_RSTEP_REDUCE_SCATTER) return scatter_rows(p, in) > 0;
    if (in->plan->steps[0].kind != MS_RSTEP_ALL_REDUCE) return false;
    return p->bufs[in->src].numel == p->bufs[in->dst].numel;
}

typedef struct ready_grad {
    int ready, ins;
} ready_grad;

static int cmp_ready(const void *a, const void *b) {
    const ready_grad *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return (x->ins > y->ins) - (x->ins < y->ins);
}

/* Groups the bucketable grad-sync all-reduces, in the order backward finishes their
 * gradients, into buckets of at most opts->bucket_mb MiB; their reshard instructions then only
 * collect the bucket's result (ms_gb_finish). The gradients stay live until grad sync as
 * before, so the memory plan is unchanged but for the buckets' own buffer. */
void prog_plan_grad_buckets(ms_program *p, const ms_compile_opts *opts) {
    ready_grad *rg = xmalloc(sizeof *rg * (size_t)(p->ni - p->n_backward + 1));
    int n = 0;
    for (int k = p->n_backward; k < p->ni; k++)
        if (bucketable(p, &p->ins[k]))
            rg[n++] = (ready_grad){prog_final_write(p, p->ins[k].src), k};
    qsort(rg, (size_t)n, sizeof *rg, cmp_ready);
    int passes = p->passes;
    p->buckets = n ? ms_gb_create(opts->bucket_mb, passes) : NULL;
    for (int i = 0; i < n; i++) {
        instr *in = &p->ins[rg[i].ins];
        const ms_rstep *step = &in->plan->steps[0];
        ms_reduce_op op = (ms_reduce_op)step->before.p[step->mesh_dim].reduce;
        bool scatter = step->kind == MS_RSTEP_REDUCE_SCATTER;
        int64_t rows = scatter ? scatter_rows(p, in) : 0;
        int parts = scatter ? p->mesh->shape[step->mesh_dim] : 0;
        ms_comm_dtype dt = p->bufs[in->src].dtype == MS_BF16 ? MS_COMM_BF16 : MS_COMM_F32;
        int g = ms_gb_add_dt(p->buckets, rg[i].ready, p->bufs[in->src].numel, rows, parts,
                             step->mesh_dim, op, dt);
        in->bucket_grad = g + 1;
    }
    free(rg);
}

/* The buckets' buffer, and each gradient's source, target and communicator. */
ms_status prog_bind_grad_buckets(ms_program *p, ms_error *err) {
    if (!p->buckets) return MS_OK;
    size_t bytes = ms_gb_storage_bytes(p->buckets);
    p->bucket_storage = prog_alloc(p, bytes + 64);
    if (!p->bucket_storage)
        return ms_fail(err, MS_ERR_NOMEM, "program: cannot allocate %zu bytes of gradient buckets",
                       bytes);
    for (int k = p->n_backward; k < p->ni; k++) {
        const instr *in = &p->ins[k];
        if (!in->bucket_grad) continue;
        ms_comm *comm = p->dm->dim_comm[in->plan->steps[0].mesh_dim];
        ms_gb_bind(p->buckets, in->bucket_grad - 1, p->bufs[in->src].ptr, p->bufs[in->dst].ptr,
                   comm);
    }
    ms_gb_bind_storage(p->buckets, p->bucket_storage);
    return MS_OK;
}

/* program_memory.c - the memory plan: step-lived buffers packed into one arena; allocation. */
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

/* --- memory plan ---------------------------------------------------------------------------- */

static void touch(ms_program *p, int b, int at) {
    if (b < 0) return;
    buf *bf = &p->bufs[b];
    if (bf->first < 0 || at < bf->first) bf->first = at;
    if (at > bf->last) bf->last = at;
}

static int cmp_size_desc(const void *a, const void *b, void *ctx) {
    const buf *bufs = ctx;
    int64_t x = bufs[*(const int *)a].nfloats, y = bufs[*(const int *)b].nfloats;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The arena and the persistent buffers come from the rank's device, so its in-use and peak
 * counters (the memory the views and traces report) include them. Without a device in the
 * rank context, plain aligned memory does. */
void *prog_alloc(ms_program *p, size_t bytes) {
    void *x = NULL;
    ms_error e;
    return ms_device_alloc(p->dev, bytes, &x, &e) == MS_OK ? x : NULL;
}

void prog_free(ms_program *p, void *x, size_t bytes) {
    if (x) ms_device_free(p->dev, x, bytes);
}

/* The most floats of step-lived buffers live at once, parameter gradients waiting for the
 * grad sync left out: what activations, their gradients and temporaries need. */
static size_t peak_activations(const ms_program *p) {
    bool *param_grad = xcalloc((size_t)p->nb + 1, sizeof(bool));
    for (int v = 0; v < p->g->nv; v++)
        if (p->g->v[v].kind == GV_PARAM && p->pv[v].has_grad) param_grad[p->pv[v].gbuf] = true;
    int64_t *delta = xcalloc((size_t)p->ni + 2, sizeof(int64_t));
    for (int b = 0; b < p->nb; b++) {
        const buf *bf = &p->bufs[b];
        if (bf->persistent || bf->first < 0 || param_grad[b]) continue;
        int64_t padded = (bf->nfloats + 15) / 16 * 16;
        delta[bf->first] += padded;
        delta[bf->last + 1] -= padded;
    }
    int64_t live = 0, peak = 0;
    for (int k = 0; k <= p->ni; k++) {
        live += delta[k];
        if (live > peak) peak = live;
    }
    free(delta);
    free(param_grad);
    return (size_t)peak;
}

size_t prog_padded_floats(const buf *bf) {
    return ((size_t)bf->nfloats + 15) / 16 * 16; /* 64-byte aligned */
}

/* A placed buffer as the greedy scan reads it: its lifetime and its span, packed (a buf is
 * hundreds of bytes, and each placement scans every buffer placed before it). */
typedef struct placed {
    int first, last;
    size_t lo, hi;
} placed;

/* Greedy by size: each of the buffers order[0..n) takes the lowest offset free during its
 * lifetime. Returns the floats the layout spans. */
static size_t place_buffers(buf *bufs, int *order, int n) {
    qsort_r(order, (size_t)n, sizeof(int), cmp_size_desc, bufs);
    size_t top = 0, *lo = xmalloc(sizeof(size_t) * (size_t)(2 * n + 1)), *hi = lo + n;
    placed *done = xmalloc(sizeof *done * (size_t)(n + 1));
    for (int a = 0; a < n; a++) {
        buf *bf = &bufs[order[a]];
        size_t need = prog_padded_floats(bf), off = 0;
        int m = 0; /* the spans of the buffers placed before and alive with this one */
        for (int c = 0; c < a; c++) {
            if (done[c].last < bf->first || bf->last < done[c].first) continue;
            lo[m] = done[c].lo, hi[m++] = done[c].hi;
        }
        for (bool moved = true; moved;) {
            moved = false;
            for (int c = 0; c < m; c++)
                if (off < hi[c] && lo[c] < off + need) off = hi[c], moved = true;
        }
        bf->offset = off;
        done[a] = (placed){bf->first, bf->last, off, off + need};
        if (off + need > top) top = off + need;
    }
    free(done);
    free(lo);
    return top;
}

/* The pass, one call of a micro-batched program's caller, that instruction k runs in: the
 * forward, the backward (its input gradients), the weight gradients, the grad sync, the
 * parameter sync; ni is after the step. */
static int pass_of(const ms_program *p, int k) {
    return k < p->n_forward    ? 0
           : k < p->n_weight   ? 1
           : k < p->n_backward ? 2
           : k < p->n_sync     ? 3
           : k < p->ni         ? 4
                               : 5;
}

/* With a shared scratch (ms_compile_opts.inflight > 1): the step-lived buffers order[0..n)
 * that live within one pass go to the scratch, the rest (and what the caller moves in or out
 * of the micro-batch's arena between passes: its inputs, output, their gradients and the
 * loss) stay in the arena. Kept when inflight arenas and one scratch take less than inflight
 * arenas of the single layout (top floats); else every buffer goes back to that layout. */
static void split_scratch(ms_program *p, int *order, int n, size_t top) {
    bool *held = xcalloc((size_t)p->nb + 1, sizeof(bool));
    for (int v = 0; v < p->g->nv; v++) {
        if (p->g->v[v].kind == GV_INPUT) held[p->pv[v].buf] = true;
        if (p->in_grad_buf[v] >= 0) held[p->in_grad_buf[v]] = true;
    }
    if (p->g->output >= 0) held[p->pv[p->g->output].buf] = true;
    if (p->out_grad_buf >= 0) held[p->out_grad_buf] = true;
    if (p->loss_buf >= 0) held[p->loss_buf] = true;
    size_t *joint = xmalloc(sizeof(size_t) * (size_t)(n + 1));
    int *keep = xmalloc(sizeof(int) * (size_t)(n + 1)), nk = 0;
    int *scr = xmalloc(sizeof(int) * (size_t)(n + 1)), ns = 0;
    for (int a = 0; a < n; a++) {
        buf *bf = &p->bufs[order[a]];
        joint[a] = bf->offset;
        if (held[order[a]] || pass_of(p, bf->first) != pass_of(p, bf->last))
            keep[nk++] = order[a];
        else
            scr[ns++] = order[a];
    }
    size_t arena = place_buffers(p->bufs, keep, nk), scratch = place_buffers(p->bufs, scr, ns);
    double in = (double)p->inflight;
    if (ns > 0 && in * (double)arena + (double)scratch < in * (double)top) {
        for (int a = 0; a < ns; a++) p->bufs[scr[a]].scratch = true;
        p->arena_floats = arena;
        p->scratch_floats = scratch;
    } else {
        for (int a = 0; a < n; a++) p->bufs[order[a]].offset = joint[a];
    }
    free(scr);
    free(keep);
    free(joint);
    free(held);
}

/* Offsets of every buffer: step-lived ones in the arena (and the scratch), the rest in
 * persistent storage. */
void prog_layout_memory(ms_program *p) {
    for (int k = 0; k < p->ni; k++) {
        instr *in = &p->ins[k];
        touch(p, in->src, k);
        touch(p, in->dst, k);
        if (in->node >= 0) {
            gnode *nd = &p->g->n[in->node];
            for (int i = 0; i < nd->n_in; i++) touch(p, in->kb.in[i], k);
            for (int o = 0; o < nd->n_out; o++) touch(p, in->kb.out[o], k);
            for (int s = 0; s < MS_OP_MAX_SAVED; s++) touch(p, in->kb.saved[s], k);
            for (int o = 0; o < MS_OP_MAX_OUT; o++) touch(p, in->dout_buf[o], k);
            for (int i = 0; i < MS_OP_MAX_IN; i++) touch(p, in->din_buf[i], k);
        }
    }
    touch(p, p->loss_buf, p->ni); /* read after the step */
    /* Inputs are written before the first instruction, a chunk's output is read (sent) and
     * its gradient written between forward and backward, input gradients read after. */
    for (int v = 0; v < p->g->nv; v++) {
        if (p->g->v[v].kind == GV_INPUT) touch(p, p->pv[v].buf, 0);
        if (p->in_grad_buf[v] >= 0) touch(p, p->in_grad_buf[v], p->ni);
    }
    if (p->g->output >= 0) touch(p, p->pv[p->g->output].buf, p->n_forward);
    touch(p, p->out_grad_buf, p->n_forward);
    /* A deferred parameter sync runs between any two of the step's instructions. */
    for (int b = 0; b < p->nb && p->deferred_sync; b++)
        if (!p->bufs[b].persistent && p->bufs[b].first >= p->n_sync) p->bufs[b].first = 0;
    int *order = xmalloc(sizeof(int) * (size_t)p->nb);
    int n = 0;
    p->persist_floats = 0;
    for (int b = 0; b < p->nb; b++) {
        buf *bf = &p->bufs[b];
        size_t padded = prog_padded_floats(bf);
        if (bf->on_host) {
            bf->offset = p->host_floats;
            p->host_floats += padded;
        } else if (bf->persistent) {
            bf->offset = p->persist_floats;
            p->persist_floats += padded;
        } else if (bf->first >= 0) {
            order[n++] = b;
            p->unplanned_floats += padded;
        }
    }
    p->arena_floats = place_buffers(p->bufs, order, n);
    if (p->micro && p->inflight > 1) split_scratch(p, order, n, p->arena_floats);
    free(order);
    p->activation_floats = peak_activations(p);
}

/* The arena and persistent storage behind the layout; every buffer's tensor becomes a view. */
ms_status prog_alloc_memory(ms_program *p, ms_error *err) {
    size_t top = p->arena_floats;
    /* Micro-batched, the caller binds an arena per micro-batch (ms_program_bind_arena). */
    p->arena = p->micro ? NULL : prog_alloc(p, (top + 16) * sizeof(float));
    p->persist = prog_alloc(p, (p->persist_floats + 16) * sizeof(float));
    if (p->staging_floats) p->staging = prog_alloc(p, (p->staging_floats + 16) * sizeof(float));
    if ((!p->arena && !p->micro) || !p->persist || (p->staging_floats && !p->staging))
        return ms_fail(err, MS_ERR_NOMEM, "program: cannot allocate %zu + %zu + %zu bytes",
                       top * sizeof(float), p->persist_floats * sizeof(float),
                       p->staging_floats * sizeof(float));
    MS_CHECK(ms_device_zero(p->dev, p->persist, (p->persist_floats + 16) * sizeof(float), err));
    if (p->master_host) {
        size_t bytes = (p->host_floats + 16) * sizeof(float);
        MS_CHECK(ms_device_alloc(p->master_host, bytes, (void **)&p->host_persist, err));
        memset(p->host_persist, 0, bytes);
    }
    for (int b = 0; b < p->nb; b++) {
        buf *bf = &p->bufs[b];
        bf->ptr = bf->on_host      ? p->host_persist + bf->offset
                  : bf->persistent ? p->persist + bf->offset
                  : bf->scratch    ? NULL /* the caller binds it (micro-batched) */
                  : p->arena       ? p->arena + bf->offset
                                   : NULL;
        MS_CHECK(ms_tensor_wrap(bf->ptr, bf->dtype, bf->lshape.ndim, bf->lshape.d, &bf->t, err));
        if (bf->dtype == MS_BF16)
            MS_CHECK(
                ms_tensor_wrap(p->staging, MS_F32, bf->lshape.ndim, bf->lshape.d, &bf->wide, err));
    }
    return MS_OK;
}

/* program_util.c - small helpers shared by the program's files (program_impl.h). */
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

/* --- small helpers ----------------------------------------------------------------------- */

void prog_local_shape(const ms_program *p, const ms_shape *g, const ms_placements *pl,
                      ms_shape *out) {
    int64_t start[MS_MAX_DIMS];
    out->ndim = g->ndim;
    ms_local_box(pl, p->mesh, p->coords, g->ndim, g->d, start, out->d);
}

int64_t prog_shape_n(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

int prog_new_typed_buf(ms_program *p, const ms_shape *gshape, const ms_placements *pl,
                       bool persistent, ms_dtype dtype) {
    if (p->nb == p->cb) {
        p->cb = p->cb ? p->cb * 2 : 256;
        p->bufs = xrealloc(p->bufs, sizeof *p->bufs * (size_t)p->cb);
    }
    buf *b = &p->bufs[p->nb];
    memset(b, 0, sizeof *b);
    prog_local_shape(p, gshape, pl, &b->lshape);
    b->dtype = dtype;
    b->numel = prog_shape_n(&b->lshape);
    b->nfloats = dtype == MS_BF16 ? (b->numel + 1) / 2 : b->numel;
    b->persistent = persistent;
    b->first = b->last = -1;
    /* shapes only until the memory plan wraps the arena (cost functions read shapes) */
    b->t.dtype = dtype;
    b->t.ndim = b->lshape.ndim;
    memcpy(b->t.shape, b->lshape.d, sizeof b->t.shape);
    return p->nb++;
}

/* A buffer for value v (or its gradient) in placements pl, in the value's element type. */
int prog_new_buf(ms_program *p, int v, const ms_placements *pl, bool persistent) {
    return prog_new_typed_buf(p, &p->g->v[v].shape, pl, persistent, prog_value_dtype(p, v));
}

int prog_new_raw_buf(ms_program *p, int64_t nfloats) {
    ms_shape s = {.ndim = 1, .d = {nfloats}};
    ms_placements r = ms_placements_replicated(p->mesh->ndim);
    return prog_new_typed_buf(p, &s, &r, false, MS_F32);
}

instr *prog_emit(ms_program *p, ikind kind, ms_program_phase phase) {
    if (p->ni == p->ci) {
        p->ci = p->ci ? p->ci * 2 : 256;
        p->ins = xrealloc(p->ins, sizeof *p->ins * (size_t)p->ci);
    }
    instr *in = &p->ins[p->ni++];
    memset(in, 0, sizeof *in);
    in->kind = kind;
    in->node = in->value = in->src = in->dst = -1;
    for (int i = 0; i < MS_OP_MAX_OUT; i++) in->dout_buf[i] = -1;
    for (int i = 0; i < MS_OP_MAX_IN; i++) in->din_buf[i] = -1;
    in->phase = phase;
    return in;
}

static const char *const phase_names[] = {"forward",   "loss",       "backward",
                                          "grad sync", "param sync", "recompute"};
_Static_assert(sizeof phase_names / sizeof *phase_names == MS_PROG_PHASE_COUNT, "a name per phase");

const char *ms_program_phase_name(ms_program_phase ph) {
    return (unsigned)ph < MS_PROG_PHASE_COUNT ? phase_names[ph] : "?";
}

/* Reshards in the backward and the gradient sync move a gradient, not the value itself,
 * except a ZeRO-3 parameter gathered for a backward kernel. */
bool prog_moves_grad(const instr *in) {
    return (in->phase == MS_PROG_BACKWARD || in->phase == MS_PROG_GRAD_SYNC) && !in->gather;
}

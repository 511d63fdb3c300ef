/* gpu_attribute.c - GPU activity attributed to the operator that launched it (gpu_attribute.h). */
#include "profiler/gpu_attribute.h"

#include <stdint.h>
#include <stdlib.h>

typedef struct key {
    uint64_t id; /* correlation id, or (rank, t0) for step spans */
    int64_t t0, t1;
    int32_t rank;
    int64_t step;
} key;

static int cmp_corr(const void *a, const void *b) {
    const key *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int cmp_span(const void *a, const void *b) {
    const key *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* The step whose span on `rank` contains t: the last span starting at or before t. */
static int64_t step_at(const key *spans, size_t n, int32_t rank, int64_t t) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (spans[mid].rank < rank || (spans[mid].rank == rank && spans[mid].t0 <= t))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return -1;
    const key *s = &spans[lo - 1];
    return s->rank == rank && t < s->t1 ? s->step : -1;
}

long ms_gpu_attribute(ms_event *ev, size_t n) {
    size_t nops = 0, nsteps = 0, ngpu = 0;
    for (size_t i = 0; i < n; i++) {
        nops += ev[i].kind == MS_EV_OP && ev[i].u.op.gpu == MS_GPU_NONE && ev[i].u.op.corr;
        nsteps += ev[i].kind == MS_EV_STEP;
        ngpu += ev[i].kind == MS_EV_OP && ev[i].u.op.gpu != MS_GPU_NONE;
    }
    if (!ngpu) return 0; /* a CPU run: nothing to attribute, no scratch (the live window's case) */
    key *ops = malloc(sizeof *ops * (nops + 1)), *spans = malloc(sizeof *spans * (nsteps + 1));
    if (!ops || !spans) {
        free(ops), free(spans);
        return -1;
    }
    size_t a = 0, b = 0;
    for (size_t i = 0; i < n; i++) {
        const ms_event *e = &ev[i];
        if (e->kind == MS_EV_OP && e->u.op.gpu == MS_GPU_NONE && e->u.op.corr)
            ops[a++] = (key){.id = e->u.op.corr, .rank = e->rank, .step = e->step};
        if (e->kind == MS_EV_STEP)
            spans[b++] = (key){.t0 = e->t0_ns, .t1 = e->t1_ns, .rank = e->rank, .step = e->step};
    }
    qsort(ops, nops, sizeof *ops, cmp_corr);
    qsort(spans, nsteps, sizeof *spans, cmp_span);
    long changed = 0;
    for (size_t i = 0; i < n; i++) {
        ms_event *e = &ev[i];
        if (e->kind != MS_EV_OP || e->u.op.gpu == MS_GPU_NONE) continue;
        key want = {.id = e->u.op.corr};
        const key *op = e->u.op.corr ? bsearch(&want, ops, nops, sizeof *ops, cmp_corr) : NULL;
        int32_t rank = op ? op->rank : e->rank;
        int64_t step = op ? op->step : step_at(spans, nsteps, rank, e->t0_ns);
        changed += rank != e->rank || step != e->step;
        e->rank = rank;
        e->step = step;
    }
    free(ops), free(spans);
    return changed;
}

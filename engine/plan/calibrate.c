/* calibrate.c - measuring this machine as the cpu-local cluster.
 *
 * Everything is measured through the engine's own code: its sgemm wrapper (the matmul
 * kernel), its attention kernel, its elementwise kernels, AdamW, and the threads backend's
 * collectives through the public communicator API. Compute is measured with every core busy
 * (one worker thread per core, each with one BLAS thread, running the same kernel at once),
 * because that is how thread ranks run during training; collectives are measured at each rank
 * count the planner may use, with the world split into groups of each size, so concurrent
 * groups share the cores as the mesh dims of a real run do. Oversubscribed ranks (more ranks
 * than cores) also pay a synchronisation cost when they arrive at a collective from compute
 * (a peer may be descheduled); that is measured separately as `sync`.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/core/xalloc.h"
#include "engine/kernels/kernels.h"
#include "engine/optim/optim.h"
#include "engine/dist/dmesh.h"
#include "engine/model/gpt.h"
#include "engine/model/strategy.h"
#include "engine/ops/op.h"
#include "engine/plan/calib_cache.h"
#include "engine/plan/cluster.h"
#include "engine/plan/cost.h"
#include "engine/core/trace_sink.h"
#include "engine/runtime/ctx.h"

static double now_s(void) {
    return (double)ms_now_ns() * 1e-9;
}

/* --- compute jobs, run on every core at once ------------------------------------------------ */

typedef enum job_kind {
    J_GEMM,
    J_ATTN_F,
    J_ATTN_B,
    J_LN_F,
    J_LN_B,
    J_GELU_F,
    J_GELU_B,
    J_BIAS_F,
    J_BIAS_B,
    J_ADD,
    J_SOFTMAX_F,
    J_SOFTMAX_B,
    J_XENT_F,
    J_XENT_B,
    J_EMB_F,
    J_EMB_B,
    J_DROP_F,
    J_DROP_B,
    J_ADAMW,
    J_SUMSQ,
    J_MEMSET,
} job_kind;

typedef struct job {
    job_kind kind;
    int64_t m, n, k; /* GEMM shape; attention: n = t, k = hs */
    double seconds;  /* per call, median over the workers */
} job;

#define ELT_ROWS  1024
#define ELT_C     256
#define BIG_ELEMS (1 << 20)
#define WINDOW_S  0.012

typedef struct worker_mem {
    float *a, *b, *c, *d, *e;
    int32_t *ids;
} worker_mem;

static float *fill(size_t n, float v) {
    float *p = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64 + 64);
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = v * (float)((i % 13) + 1) / 13.0f;
    return p;
}

static void run_job(const job *j, worker_mem *w) {
    const int64_t N = ELT_ROWS, C = ELT_C, n = N * C;
    switch (j->kind) {
        case J_GEMM: {
            ms_k_gemm g = {.batch = 1, .m = j->m, .n = j->n, .k = j->k, .bcast_b = true};
            ms_k_matmul_forward(&g, w->c, w->a, w->b, 1.0f, 0.0f);
            break;
        }
        case J_ATTN_F:
            ms_k_attention_forward(w->c, w->d, NULL, w->a, NULL, 1, j->n, 4 * j->k, 4, true, NULL);
            break;
        case J_ATTN_B:
            ms_k_attention_backward(w->e, w->b, w->c, w->a, w->d, 1, j->n, 4 * j->k, 4, true, NULL);
            break;
        case J_LN_F:
            ms_k_layernorm_forward(w->c, w->d, w->d + N, w->a, w->b, w->b + C, N, C, 1e-5f);
            break;
        case J_LN_B:
            ms_k_layernorm_backward(w->e, w->b + 2 * C, w->b + 3 * C, w->c, w->a, w->b, w->d,
                                    w->d + N, N, C);
            break;
        case J_GELU_F:
            ms_k_gelu_forward(w->c, w->a, n);
            break;
        case J_GELU_B:
            ms_k_gelu_backward(w->e, w->a, w->c, n);
            break;
        case J_BIAS_F:
            ms_k_bias_add_forward(w->c, w->a, w->b, N, C);
            break;
        case J_BIAS_B:
            ms_k_bias_add_backward(w->e, w->b, w->c, N, C);
            break;
        case J_ADD:
            ms_k_add_forward(w->c, w->a, w->e, n);
            break;
        case J_SOFTMAX_F:
            ms_k_softmax_forward(w->c, w->a, N, C);
            break;
        case J_SOFTMAX_B:
            ms_k_softmax_backward(w->e, w->a, w->c, N, C);
            break;
        case J_XENT_F:
            ms_k_xent_forward(w->c, w->d, w->a, w->ids, N, C);
            break;
        case J_XENT_B:
            ms_k_xent_backward(w->e, w->a, w->d, w->ids, w->b, N, C);
            break;
        case J_EMB_F:
            ms_k_embedding_forward(w->c, w->ids, w->a, N, C, 0, C);
            break;
        case J_EMB_B:
            ms_k_embedding_backward(w->e, w->ids, w->c, N, C, 0, C);
            break;
        case J_DROP_F:
            ms_k_dropout_forward(w->c, w->a, 0.1f, 7, 1, 1, &n, NULL, NULL, NULL);
            break;
        case J_DROP_B:
            ms_k_dropout_backward(w->e, w->c, 0.1f, 7, 1, 1, &n, NULL, NULL, NULL);
            break;
        case J_ADAMW: {
            ms_adamw_opts o = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
            ms_adamw_step(w->a, w->b, w->c, w->e, BIG_ELEMS, &o, 1, NULL);
            break;
        }
        case J_SUMSQ: {
            volatile double s = ms_sumsq_f32(w->a, BIG_ELEMS);
            (void)s;
            break;
        }
        case J_MEMSET:
            memset(w->e, 0, sizeof(float) * 2 * BIG_ELEMS);
            break;
    }
}

/* A step's memory-bound operators read tensors other operators wrote long before (a layer's
 * saved input in the backward), from beyond the core's own cache. Measured on one set of
 * buffers a loop keeps them in L2 and reads up to 2.5x the step's rate (a 2-core Xeon with
 * 2 MiB of L2 per core: GELU's backward, 0.31 ms a call in a loop, 0.53 ms inside a step). So
 * every call but the GEMMs' moves on to the next of SLOTS windows, 4 MiB apart in each of the
 * five buffers: the calls cycle through 80 MiB, far beyond L2. */
#define SLOTS 4

static void slot(worker_mem *m, long call) {
    const size_t off = (size_t)(call % SLOTS) * BIG_ELEMS;
    m->a += off, m->b += off, m->c += off, m->d += off, m->e += off;
}

typedef struct pool {
    job *jobs;
    int n_jobs, n_workers;
    double *secs; /* [job][worker] */
    pthread_barrier_t bar;
    int worker_ok[64];
} pool;

typedef struct worker_arg {
    pool *p;
    int id;
} worker_arg;

static void *worker(void *argp) {
    worker_arg *wa = argp;
    pool *p = wa->p;
    const size_t big =
        (size_t)(SLOTS + 1) * BIG_ELEMS; /* memset's 2 x BIG_ELEMS at the last slot */
    worker_mem w = {fill(big, 0.01f), fill(big, 0.02f), fill(big, 0.0f),
                    fill(big, 0.5f),  fill(big, 0.0f),  xmalloc(sizeof(int32_t) * ELT_ROWS)};
    bool ok = w.a && w.b && w.c && w.d && w.e;
    for (int i = 0; ok && i < ELT_ROWS; i++) w.ids[i] = (i * 37) % ELT_C;
    p->worker_ok[wa->id] = ok;
    for (int j = 0; j < p->n_jobs; j++) {
        pthread_barrier_wait(&p->bar);
        double t0 = now_s(), t;
        long calls = 0;
        if (ok) {
            run_job(&p->jobs[j], &w); /* warm-up */
            t0 = now_s();
            do {
                worker_mem at = w;
                if (p->jobs[j].kind != J_GEMM) slot(&at, calls);
                run_job(&p->jobs[j], &at);
                calls++;
                t = now_s();
            } while (t - t0 < WINDOW_S || calls < 2);
            p->secs[(size_t)j * p->n_workers + wa->id] = (t - t0) / (double)calls;
        }
    }
    free(w.a), free(w.b), free(w.c), free(w.d), free(w.e), free(w.ids);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs every job on `workers` threads at once, job after job; fills jobs[].seconds. */
static ms_status run_loaded(job *jobs, int n_jobs, int workers, ms_error *err) {
    if (workers > 64) workers = 64;
    pool p = {.jobs = jobs, .n_jobs = n_jobs, .n_workers = workers};
    p.secs = xcalloc((size_t)n_jobs * (size_t)workers, sizeof(double));
    pthread_barrier_init(&p.bar, NULL, (unsigned)workers);
    pthread_t th[64];
    worker_arg wa[64];
    int started = 0;
    for (int i = 0; i < workers; i++) {
        wa[i] = (worker_arg){&p, i};
        if (pthread_create(&th[i], NULL, worker, &wa[i]) != 0) break;
        started++;
    }
    if (started < workers) {
        /* cannot happen in practice; the barrier would never open */
        for (int i = 0; i < started; i++) pthread_cancel(th[i]);
        pthread_barrier_destroy(&p.bar);
        free(p.secs);
        return ms_fail(err, MS_ERR_INTERNAL, "calibration: cannot start %d threads", workers);
    }
    for (int i = 0; i < workers; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&p.bar);
    ms_status st = MS_OK;
    for (int i = 0; i < workers; i++)
        if (!p.worker_ok[i]) st = ms_fail(err, MS_ERR_NOMEM, "calibration: out of memory");
    for (int j = 0; j < n_jobs && st == MS_OK; j++) {
        double *v = p.secs + (size_t)j * workers;
        qsort(v, (size_t)workers, sizeof(double), cmp_d);
        jobs[j].seconds = v[workers / 2];
    }
    free(p.secs);
    return st;
}

/* --- collectives --------------------------------------------------------------------------- */

static const int64_t coll_sizes[3] = {4096, 256 * 1024, 4 * 1024 * 1024};
static const int coll_iters[3] = {200, 40, 8};
static const ms_coll_kind coll_kinds[4] = {MS_COLL_ALL_REDUCE, MS_COLL_ALL_GATHER,
                                           MS_COLL_REDUCE_SCATTER, MS_COLL_ALL_TO_ALL};

typedef struct coll_run {
    int group;
    double t[4][3]; /* seconds per call: kind x size (rank 0 writes) */
} coll_run;

/* Buffers cycle through this much memory per rank, so that every call reads and writes cold
 * memory, as a step's reshards do (each moves a different tensor). */
#define COLD_BYTES (24u << 20)

static ms_status one_coll(ms_comm *c, ms_coll_kind kind, int64_t bytes, const float *a, float *b,
                          size_t *cnt, size_t *dsp, ms_error *err) {
    int g = ms_comm_size(c);
    size_t floats = (size_t)bytes / 4, per = floats / (size_t)g;
    for (int i = 0; i < g; i++) cnt[i] = per, dsp[i] = per * (size_t)i;
    switch (kind) {
        case MS_COLL_ALL_REDUCE:
            return ms_all_reduce(c, a, b, floats, MS_REDUCE_SUM, err);
        case MS_COLL_ALL_GATHER:
            return ms_all_gather(c, a, b, cnt, err);
        case MS_COLL_REDUCE_SCATTER:
            return ms_reduce_scatter(c, a, b, cnt, MS_REDUCE_SUM, err);
        default:
            return ms_all_to_all(c, a, cnt, dsp, b, cnt, dsp, err);
    }
}

/* Max over the world of this rank's elapsed seconds. */
static ms_status world_max(ms_ctx *ctx, double v, double *out, ms_error *err) {
    float x = (float)v, y;
    MS_CHECK(ms_all_reduce(ctx->world, &x, &y, 1, MS_REDUCE_MAX, err));
    *out = y;
    return MS_OK;
}

static ms_status coll_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    coll_run *r = arg;
    int g = r->group;
    ms_comm *c = NULL;
    MS_CHECK(ms_comm_split(ctx->world, ctx->rank / g, ctx->rank % g, "cal", &c, err));
    const size_t cap = COLD_BYTES / 4;
    float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
    size_t cnt[64], dsp[64];
    ms_status st = MS_OK;
    if (!a || !b) st = ms_fail(err, MS_ERR_NOMEM, "calibration: out of memory");
    for (int k = 0; k < 4 && st == MS_OK; k++)
        for (int z = 0; z < 3 && st == MS_OK; z++) {
            size_t n = (size_t)coll_sizes[z] / 4, slots = cap / n;
            double reps[3];
            for (int rep = 0; rep < 3 && st == MS_OK; rep++) {
                MS_CHECK_GOTO(ms_barrier(ctx->world, err), st, out);
                MS_CHECK_GOTO(one_coll(c, coll_kinds[k], coll_sizes[z], a, b, cnt, dsp, err), st,
                              out);
                double t0 = now_s();
                for (int i = 0; i < coll_iters[z]; i++) {
                    size_t at = (size_t)(i + 1) % slots * n;
                    MS_CHECK_GOTO(
                        one_coll(c, coll_kinds[k], coll_sizes[z], a + at, b + at, cnt, dsp, err),
                        st, out);
                }
                MS_CHECK_GOTO(world_max(ctx, now_s() - t0, &reps[rep], err), st, out);
                reps[rep] /= coll_iters[z];
            }
            qsort(reps, 3, sizeof(double), cmp_d);
            if (ctx->rank == 0) r->t[k][z] = reps[1];
        }
out:
    free(a);
    free(b);
    ms_comm_destroy(c);
    return st;
}

/* alpha + x / bw through the measured points (x = bus bytes), least squares. */
static void fit(const double *x, const double *y, int n, double *alpha, double *bw) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
    double den = n * sxx - sx * sx;
    double slope = den > 0 ? (n * sxy - sx * sy) / den : 0;
    double icpt = (sy - slope * sx) / n;
    if (slope <= 0) slope = 1e-12;
    if (icpt < 0) icpt = y[0] < x[0] * slope ? 0 : y[0] - x[0] * slope;
    if (icpt < 0) icpt = 0;
    *alpha = icpt;
    *bw = 1 / slope;
}

static ms_status calibrate_colls(int max_ranks, void *log, ms_cluster *c, ms_error *err) {
    for (int R = 2; R <= max_ranks; R *= 2)
        for (int g = 2; g <= R; g *= 2) {
            coll_run run = {.group = g};
            ms_launch_opts lo = {.backend = MS_BACKEND_THREADS, .nranks = R, .seed = 1};
            MS_CHECK(ms_launch(&lo, coll_rank, &run, err));
            for (int k = 0; k < 4 && c->n_coll < MS_CLUSTER_MAX_COLL; k++) {
                double x[3], y[3];
                for (int z = 0; z < 3; z++) {
                    x[z] = ms_coll_busbw_factor(coll_kinds[k], g) * (double)coll_sizes[z];
                    y[z] = run.t[k][z];
                }
                double alpha, bw;
                fit(x, y, 3, &alpha, &bw);
                c->coll[c->n_coll++] = (ms_coll_point){.ranks = R,
                                                       .group = g,
                                                       .kind = (uint8_t)coll_kinds[k],
                                                       .alpha = alpha,
                                                       .busbw = bw};
            }
            if (log)
                fprintf(
                    log, "cpu-local: %d ranks, groups of %d: all-reduce %.1f us + %.2f GB/s bus\n",
                    R, g, c->coll[c->n_coll - 4].alpha * 1e6, c->coll[c->n_coll - 4].busbw / 1e9);
        }
    return MS_OK;
}

/* --- synchronisation and in-step rates, measured on the engine's own step --------------------
 * Two GPTs unlike the shipped configs (3 layers, 8 heads of 32, vocab 320, batch 8 x 96 tokens;
 * and 2 layers, 8 heads of 16, batch 8 x 64) run forward + backward + gradient reduction on R
 * thread ranks as dpR, tpR and tpR +sp. Each step is split by the ranks' own operator events:
 * their compute (wall time on ranks that have a core each; CPU time times ranks per core where
 * they share, so that a rank descheduled between operators is not counted as computing), the
 * collectives as priced above, and the rest, r, which is what the ranks lost meeting each other.
 * With n collectives reached from compute, B bus bytes in them and two phase boundaries per step
 * (end of forward, start of the gradient reduction):
 *     r = n x per_call + B x per_byte + 2 x per_phase,
 * solved from the six (non-negative least squares: a cost that comes out negative is dropped).
 * The compute is measured, not predicted: solved against the predicted compute, r took in what
 * the rates miss inside a step (a fifth of the compute on a 2-core Xeon) and came out as 3.5 ms
 * per phase boundary on two ranks, which every small step then paid.
 *
 * What the rates miss is measured too, per class: the kernels' time inside the steps over their
 * time at the rates measured above (in_step, cluster.h), at each GPT's mean bytes per call
 * (a kernel whose operands come from beyond L2 runs slower than the same kernel in a loop);
 * and, where ranks outnumber the cores, what their compute loses besides (the sync point's
 * compute factor: the scheduler's turns evict each other's caches). */

#define SYNC_MAX_RANKS 8
#define SYNC_STEPS     7 /* two warm-up steps, then five timed */

typedef struct step_run {
    int dp, tp;
    bool sp;
    ms_model_config cfg;
    int B, T;
    double step_s; /* the median timed step (rank 0) */
    /* each rank's operator time in that step: CPU time, and wall time per class */
    double compute_cpu_s[SYNC_MAX_RANKS];
    double class_s[SYNC_MAX_RANKS][MS_CLUSTER_IN_STEP];
    double class_bytes[MS_CLUSTER_IN_STEP], class_calls[MS_CLUSTER_IN_STEP]; /* rank 0's */
} step_run;

/* A rank's operator kernels, summed per step: the calibration's own trace sink. */
typedef struct op_clock {
    int step;
    double cpu_prev; /* the thread's CPU time at the last event or the step's start */
    double op_cpu_s[SYNC_STEPS];
    /* per class (GEMM, attention, the rest, as the planner splits them): wall time, the
     * bytes the kernels' cost functions count, calls */
    double class_s[SYNC_STEPS][MS_CLUSTER_IN_STEP];
    double class_bytes[SYNC_STEPS][MS_CLUSTER_IN_STEP], class_calls[SYNC_STEPS][MS_CLUSTER_IN_STEP];
} op_clock;

static int op_class(int op) {
    return op == MS_OP_MATMUL || op == MS_OP_LINEAR             ? 0
           : op == MS_OP_ATTENTION || op == MS_OP_GQA_ATTENTION ? 1
                                                                : 2;
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Events come at the end of each operator and reshard, so the CPU time since the previous
 * one is the operator's (plus the few untraced instructions before it). */
static void op_clock_emit(void *rec, const ms_event *e) {
    op_clock *c = rec;
    if (c->step < 0 || c->step >= SYNC_STEPS) return;
    double cpu = thread_cpu_s();
    if (e->kind == MS_EV_OP) {
        int k = op_class(e->u.op.op);
        c->class_s[c->step][k] += (double)(e->t1_ns - e->t0_ns) * 1e-9;
        c->class_bytes[c->step][k] += e->u.op.bytes;
        c->class_calls[c->step][k] += 1;
        c->op_cpu_s[c->step] += cpu - c->cpu_prev;
    }
    c->cpu_prev = cpu;
}

static ms_comm_probe *op_clock_probe(const ms_trace_state *ts, ms_comm *c, int mesh_dim) {
    (void)ts, (void)c, (void)mesh_dim;
    return NULL;
}

static void op_clock_probe_free(ms_comm_probe *p) {
    (void)p;
}

static const ms_trace_sink_ops op_clock_ops = {
    .emit = op_clock_emit, .probe_attach = op_clock_probe, .probe_free = op_clock_probe_free};

static ms_status step_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    step_run *r = arg;
    ms_strategy s;
    MS_CHECK(ms_strategy_init(&s, r->dp, r->tp, 1, r->sp, err));
    ms_mesh mesh;
    MS_CHECK(ms_strategy_mesh(&s, &mesh, err));
    ms_dmesh *dm = NULL;
    ms_model m = {0};
    ms_program *prog = NULL;
    float *buf = NULL;
    ms_status st;
    MS_CHECK_GOTO(ms_dmesh_create(ctx, &mesh, &dm, err), st, out);
    MS_CHECK_GOTO(ms_model_build(&r->cfg, r->B, r->T, &m, err), st, out);
    ms_sharding sh = {.s = &s};
    ms_compile_opts co = {.shard = ms_strategy_shard, .shard_user = &sh, .seed = 5};
    MS_CHECK_GOTO(ms_program_compile(m.g, dm, &co, &prog, err), st, out);
    int n = r->B * r->T;
    buf = xmalloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) buf[i] = (float)((i * 7) % r->cfg.vocab_size);
    MS_CHECK_GOTO(ms_program_feed(prog, m.ids, buf, err), st, out);
    for (int i = 0; i < n; i++) buf[i] = (float)((i * 11 + 3) % r->cfg.vocab_size);
    MS_CHECK_GOTO(ms_program_feed(prog, m.targets, buf, err), st, out);
    for (int i = 0; i < n; i++) buf[i] = (float)(i % r->T);
    MS_CHECK_GOTO(ms_program_feed(prog, m.pos, buf, err), st, out);
    double times[SYNC_STEPS];
    op_clock clock = {.step = -1};
    ctx->trace.recorder = &clock;
    ctx->trace.ops = &op_clock_ops;
    for (int i = 0; i < SYNC_STEPS; i++) {
        MS_CHECK_GOTO(ms_barrier(ctx->world, err), st, out);
        clock.step = i;
        clock.cpu_prev = thread_cpu_s();
        double t0 = now_s();
        float loss;
        MS_CHECK_GOTO(ms_program_step(prog, &loss, err), st, out);
        double t;
        MS_CHECK_GOTO(world_max(ctx, now_s() - t0, &t, err), st, out);
        times[i] = t;
        clock.step = -1;
    }
    /* the median of five, as a training run's step is read (the planner's validation, the
     * advisor): ranks that share cores take turns, and their steps vary by themselves (on a
     * 2-core Zen 5, four ranks' fastest step was 10-15% under their median), so the fastest
     * priced every such step optimistic. Another process's load is kept out by the idle check.
     * Every rank has the same times, so every rank picks the same step. */
    int order[SYNC_STEPS - 2];
    for (int i = 0; i < SYNC_STEPS - 2; i++) order[i] = i + 2;
    for (int i = 1; i < SYNC_STEPS - 2; i++) /* insertion sort by time, ties by index */
        for (int j = i; j > 0 && times[order[j]] < times[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    int best = order[(SYNC_STEPS - 2) / 2];
    if (ctx->rank == 0) r->step_s = times[best];
    r->compute_cpu_s[ctx->rank] = clock.op_cpu_s[best];
    memcpy(r->class_s[ctx->rank], clock.class_s[best], sizeof clock.class_s[best]);
    if (ctx->rank == 0) {
        memcpy(r->class_bytes, clock.class_bytes[best], sizeof r->class_bytes);
        memcpy(r->class_calls, clock.class_calls[best], sizeof r->class_calls);
    }
    st = MS_OK;
out:
    ctx->trace.recorder = NULL;
    ctx->trace.ops = NULL;
    free(buf);
    ms_program_destroy(prog);
    ms_model_free(&m);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    return st;
}

/* Least squares over the columns in `use` (bit j = unknown j), by the normal equations. */
static bool lsq(double x[][3], const double *r, int rows, unsigned use, double *sol) {
    int idx[3], k = 0;
    for (int j = 0; j < 3; j++)
        if (use >> j & 1) idx[k++] = j;
    double a[3][4] = {{0}};
    for (int p = 0; p < k; p++) {
        for (int q = 0; q < k; q++)
            for (int i = 0; i < rows; i++) a[p][q] += x[i][idx[p]] * x[i][idx[q]];
        for (int i = 0; i < rows; i++) a[p][k] += x[i][idx[p]] * r[i];
    }
    for (int p = 0; p < k; p++) { /* Gauss-Jordan */
        int piv = p;
        for (int q = p + 1; q < k; q++)
            if (fabs(a[q][p]) > fabs(a[piv][p])) piv = q;
        if (fabs(a[piv][p]) < 1e-300) return false;
        for (int q = 0; q <= k; q++) {
            double t = a[p][q];
            a[p][q] = a[piv][q];
            a[piv][q] = t;
        }
        for (int q = 0; q < k; q++) {
            if (q == p) continue;
            double f = a[q][p] / a[p][p];
            for (int z = p; z <= k; z++) a[q][z] -= f * a[p][z];
        }
    }
    for (int j = 0; j < 3; j++) sol[j] = 0;
    for (int p = 0; p < k; p++) sol[idx[p]] = a[p][k] / a[p][p];
    return true;
}

/* Non-negative least squares for three unknowns: the best fit among the subsets of unknowns
 * whose solution is non-negative. */
static void nnls3(double x[][3], const double *r, int rows, double *best) {
    double best_err = 1e300;
    for (int j = 0; j < 3; j++) best[j] = 0;
    for (unsigned use = 1; use < 8; use++) {
        double sol[3];
        if (!lsq(x, r, rows, use, sol)) continue;
        bool ok = true;
        for (int j = 0; j < 3; j++) ok &= sol[j] >= 0;
        if (!ok) continue;
        double e = 0;
        for (int i = 0; i < rows; i++) {
            double d = r[i];
            for (int j = 0; j < 3; j++) d -= x[i][j] * sol[j];
            e += d * d;
        }
        if (e < best_err) {
            best_err = e;
            for (int j = 0; j < 3; j++) best[j] = sol[j];
        }
    }
}

/* One variant (dp, tp or tp +sp) on R ranks: run, priced without synchronisation, and the
 * step's part that the ranks lost meeting each other. */
typedef struct sync_variant {
    step_run run;
    double measured_compute; /* the ranks' mean, in the planner's terms (shared cores) */
    double pred_compute, comm;
    double measured_class[MS_CLUSTER_IN_STEP];
    ms_plan_estimate e;
} sync_variant;

static ms_status measure_variant(const ms_model_config *cfg, int B, int T, int R, int v,
                                 const ms_cluster *c, sync_variant *out, ms_error *err) {
    step_run *run = &out->run;
    *run = (step_run){.dp = v ? 1 : R, .tp = v ? R : 1, .sp = v == 2, .cfg = *cfg, .B = B, .T = T};
    ms_launch_opts lo = {.backend = MS_BACKEND_THREADS, .nranks = R, .seed = 1};
    MS_CHECK(ms_launch(&lo, step_rank, run, err));
    ms_plan_problem pb = {.model = *cfg,
                          .devices = R,
                          .global_batch = B,
                          .seq = T,
                          .dtype = MS_PLAN_FP32,
                          .cluster = c,
                          .engine_workloads = true};
    ms_strategy s;
    MS_CHECK(ms_strategy_init(&s, run->dp, run->tp, 1, run->sp, err));
    ms_plan_estimate *e = &out->e;
    MS_CHECK(ms_plan_estimate_one(&pb, &s, NULL, e, err));
    /* the program's part of the step: no optimizer, no gradient norm; its collectives as
     * priced, its compute as the ranks measured it */
    double pred =
        e->step_s - e->compute_s[MS_PC_OPTIMIZER] - e->comm_s[MS_PLAN_WORLD] - e->overhead_s;
    out->pred_compute = 0;
    for (int k = 0; k < MS_PC_COUNT; k++)
        if (k != MS_PC_OPTIMIZER) out->pred_compute += e->compute_s[k];
    double wall = 0, cpu = 0; /* the ranks' means: wall time is the classes' together */
    for (int k = 0; k < MS_CLUSTER_IN_STEP; k++) {
        out->measured_class[k] = 0;
        for (int q = 0; q < R; q++) out->measured_class[k] += run->class_s[q][k] / R;
        wall += out->measured_class[k];
    }
    for (int q = 0; q < R; q++) cpu += run->compute_cpu_s[q] / R;
    out->measured_compute = R > c->cores ? cpu * R / c->cores : wall;
    out->comm = pred - out->pred_compute;
    return MS_OK;
}

/* What one or more runs on ranks with a core each measured per class, against the same
 * kernels priced at the measured rates. */
typedef struct class_sum {
    double measured[MS_CLUSTER_IN_STEP], predicted[MS_CLUSTER_IN_STEP];
    double bytes[MS_CLUSTER_IN_STEP], calls[MS_CLUSTER_IN_STEP];
} class_sum;

static void class_add(class_sum *cs, const sync_variant *sv) {
    for (int k = 0; k < MS_CLUSTER_IN_STEP; k++) {
        cs->measured[k] += sv->measured_class[k];
        cs->predicted[k] += sv->e.compute_s[k];
        cs->bytes[k] += sv->run.class_bytes[k];
        cs->calls[k] += sv->run.class_calls[k];
    }
}

/* The in-step factors: each class's measured time over its predicted, at the small GPT's and
 * the calibration GPT's mean kernel bytes. */
static void set_in_step(ms_cluster *c, const class_sum *small, const class_sum *big, void *log) {
    static const char *const names[MS_CLUSTER_IN_STEP] = {"GEMM", "attention", "other kernels"};
    for (int k = 0; k < MS_CLUSTER_IN_STEP; k++) {
        const class_sum *at[2] = {small, big};
        for (int i = 0; i < 2; i++) {
            const class_sum *cs = at[i];
            double f = cs->predicted[k] > 0 && cs->measured[k] > 0
                           ? cs->measured[k] / cs->predicted[k]
                           : 1;
            c->in_step[k].factor[i] = f < 0.5 ? 0.5 : f > 4 ? 4 : f;
            c->in_step[k].bytes[i] = cs->calls[k] > 0 ? cs->bytes[k] / cs->calls[k] : 1;
        }
        if (log)
            fprintf(log,
                    "cpu-local: inside a training step, %s ran %.2fx its measured time at %.0f KB "
                    "a call, %.2fx at %.0f KB; priced so\n",
                    names[k], c->in_step[k].factor[0], c->in_step[k].bytes[0] / 1e3,
                    c->in_step[k].factor[1], c->in_step[k].bytes[1] / 1e3);
    }
}

/* The two GPTs the steps run (see above): heads of 32 in the larger, a size on the attention
 * grid, so that the grid's interpolation is not taken for the step's (192 channels in 8 heads
 * of 24 were: attention 1.7x); 2 layers of 128 channels in heads of 16 in the small one, whose
 * kernels' operands stay in the core's cache. */
static const ms_model_config sync_gpt = {.model_type = MS_MODEL_GPT2,
                                         .n_layer = 3,
                                         .n_head = 8,
                                         .n_embd = 256,
                                         .vocab_size = 320,
                                         .n_positions = 128,
                                         .layer_norm_epsilon = 1e-5};

/* R ranks: both GPTs, three variants each (one on a single rank, where tp is dp), the waits
 * of collectives between short and long stretches of compute solved as R's sync point. On
 * r_f ranks the classes' times go to `small` and `big`; elsewhere the ranks' compute over
 * its in-step prediction is the point's compute factor. */
static ms_status sync_point_at(int R, int r_f, void *log, const ms_cluster *c, class_sum *small,
                               class_sum *big, ms_sync_point *out, ms_error *err) {
    static const char *const names[3] = {"dp", "tp", "tp +sp"};
    ms_model_config small_gpt = sync_gpt;
    small_gpt.n_layer = 2, small_gpt.n_embd = 128;
    double r[6], x[6][3]; /* residuals; rows (calls, bus bytes, phases) */
    double sum_measured = 0, sum_pred = 0;
    int rows = 0;
    for (int v = 0; v < 6; v++) {
        const bool is_small = v >= 3;
        if (R == 1 && v % 3) continue;
        sync_variant sv;
        MS_CHECK(measure_variant(is_small ? &small_gpt : &sync_gpt, 8, is_small ? 64 : 96, R, v % 3,
                                 c, &sv, err));
        r[rows] = sv.run.step_s - sv.measured_compute - sv.comm;
        x[rows][0] = sv.e.mb_coll_calls;
        x[rows][1] = sv.e.mb_coll_bus_bytes;
        x[rows][2] = R > 1 ? 2 : 0;
        rows++;
        if (R == r_f) class_add(is_small ? small : big, &sv);
        sum_measured += sv.measured_compute, sum_pred += sv.pred_compute;
        if (log)
            fprintf(log,
                    "cpu-local: %d ranks, %s GPT, %s: step %.1f ms, compute %.1f ms (%.1f "
                    "priced), collectives %.1f ms without synchronisation (%g from compute, "
                    "%.1f MB)\n",
                    R, is_small ? "small" : "larger", names[v % 3], sv.run.step_s * 1e3,
                    sv.measured_compute * 1e3, sv.pred_compute * 1e3, sv.comm * 1e3, x[rows - 1][0],
                    x[rows - 1][1] / 1e6);
    }
    double sol[3];
    nnls3(x, r, rows, sol);
    double f = R != r_f && sum_pred > 0 ? sum_measured / sum_pred : 1;
    *out = (ms_sync_point){.ranks = R,
                           .per_call = sol[0],
                           .per_byte = sol[1],
                           .per_phase = sol[2],
                           .compute = f < 0.5 ? 0.5
                                      : f > 4 ? 4
                                              : f};
    if (log)
        fprintf(log,
                "cpu-local: %d ranks: %.0f us per collective from compute, %.2f ns per bus byte, "
                "%.0f us per phase boundary, compute %.2fx\n",
                R, sol[0] * 1e6, sol[1] * 1e9, sol[2] * 1e6, out->compute);
    return MS_OK;
}

static ms_status calibrate_sync(int max_ranks, void *log, ms_cluster *c, ms_error *err) {
    c->n_sync = 0; /* predictions below without synchronisation, at the measured rates */
    memset(c->in_step, 0, sizeof c->in_step);
    /* The in-step factors come from the most ranks that still have a core each (one rank on
     * a single core), measured first: the other rank counts' compute factors are over the
     * in-step prediction (more ranks than cores lose each other's caches). One rank with the
     * cores' BLAS threads is not measured: on two cores the two GPTs' compute came out 1.20x
     * and 1.50x the prediction, gpt-tiny's 1.33x and gpt-bench's 1.09x, no factor that
     * carries over. */
    int order[MS_CLUSTER_MAX_SYNC], n = 0, r_f = 1;
    for (int R = 2; R <= max_ranks && R <= 8 && R <= c->cores; R *= 2) r_f = R;
    order[n++] = r_f;
    for (int R = 2; R <= max_ranks && R <= 8; R *= 2)
        if (R != r_f) order[n++] = R;
    class_sum small = {0}, big = {0};
    ms_sync_point found[MS_CLUSTER_MAX_SYNC];
    for (int i = 0; i < n; i++) {
        MS_CHECK(sync_point_at(order[i], r_f, log, c, &small, &big, &found[i], err));
        if (i == 0) set_in_step(c, &small, &big, log);
    }
    /* by rank count, as they were measured in earlier versions */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && found[j - 1].ranks > found[j].ranks; j--) {
            ms_sync_point t = found[j];
            found[j] = found[j - 1];
            found[j - 1] = t;
        }
    memcpy(c->sync, found, sizeof(ms_sync_point) * (size_t)n);
    c->n_sync = n;
    return MS_OK;
}

/* --- the whole calibration ------------------------------------------------------------------- */

static const int64_t grid[4] = {16, 64, 256, 1024};
static const int64_t attn_t[3] = {32, 128, 512};
static const int64_t attn_hs[4] = {16, 32, 64, 128};

static double elt_bytes(job_kind k) {
    const int64_t N = ELT_ROWS, C = ELT_C, n = N * C;
    switch (k) {
        case J_LN_F:
        case J_LN_B:
            return ms_k_layernorm_cost(N, C, k == J_LN_B).bytes;
        case J_GELU_F:
        case J_GELU_B:
            return ms_k_elementwise_cost(MS_K_GELU, n, 0, k == J_GELU_B).bytes;
        case J_BIAS_F:
        case J_BIAS_B:
            return ms_k_elementwise_cost(MS_K_BIAS_ADD, n, C, k == J_BIAS_B).bytes;
        case J_ADD:
            return ms_k_elementwise_cost(MS_K_ADD, n, 0, false).bytes;
        case J_SOFTMAX_F:
        case J_SOFTMAX_B:
            return ms_k_softmax_cost(N, C, k == J_SOFTMAX_B).bytes;
        case J_XENT_F:
        case J_XENT_B:
            return ms_k_xent_cost(N, C, k == J_XENT_B).bytes;
        case J_EMB_F:
        case J_EMB_B:
            return ms_k_embedding_cost(N, C, k == J_EMB_B).bytes;
        case J_DROP_F:
        case J_DROP_B:
            return ms_k_dropout_cost(n, k == J_DROP_B).bytes;
        case J_ADAMW:
            return 28.0 * BIG_ELEMS;
        case J_SUMSQ:
            return 4.0 * BIG_ELEMS;
        case J_MEMSET:
            return 8.0 * BIG_ELEMS;
        default:
            return 0;
    }
}

ms_status ms_cluster_calibrate_cpu(int max_ranks, void *log, ms_cluster *out, ms_error *err) {
    ms_cluster *c = xcalloc(1, sizeof *c);
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int blas_before = ms_k_blas_threads();
    ms_k_blas_set_threads(1);
    double t_start = now_s();
    if (log) fprintf(log, "cpu-local: measuring this machine (%d cores) ...\n", cores);

    /* compute, every core busy */
    job jobs[128];
    int nj = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int d = 0; d < 4; d++)
                jobs[nj++] = (job){.kind = J_GEMM, .m = grid[a], .n = grid[b], .k = grid[d]};
    int attn0 = nj;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++) {
            jobs[nj++] = (job){.kind = J_ATTN_F, .n = attn_t[a], .k = attn_hs[b]};
            jobs[nj++] = (job){.kind = J_ATTN_B, .n = attn_t[a], .k = attn_hs[b]};
        }
    int elt0 = nj;
    for (int k = J_LN_F; k <= J_MEMSET; k++) jobs[nj++] = (job){.kind = (job_kind)k};
    ms_status st = run_loaded(jobs, nj, cores, err);
    if (st != MS_OK) goto fail;
    for (int i = 0; i < attn0; i++)
        c->gemm[c->n_gemm++] =
            (ms_gemm_point){jobs[i].m, jobs[i].n, jobs[i].k,
                            2.0 * (double)jobs[i].m * jobs[i].n * jobs[i].k / jobs[i].seconds};
    for (int i = attn0; i < elt0; i += 2)
        c->attn[c->n_attn++] = (ms_attn_point){.t = jobs[i].n,
                                               .hs = jobs[i].k,
                                               .fwd_s = jobs[i].seconds / 4,
                                               .bwd_s = jobs[i + 1].seconds / 4};
    {
        /* per op class: bytes (as its cost function counts them) per second, forward and
         * backward together */
        struct {
            ms_oprate r;
            job_kind f, b;
        } map[] = {
            {MS_OPRATE_LAYERNORM, J_LN_F, J_LN_B},         {MS_OPRATE_GELU, J_GELU_F, J_GELU_B},
            {MS_OPRATE_BIAS, J_BIAS_F, J_BIAS_B},          {MS_OPRATE_STREAM, J_ADD, J_ADD},
            {MS_OPRATE_SOFTMAX, J_SOFTMAX_F, J_SOFTMAX_B}, {MS_OPRATE_XENT, J_XENT_F, J_XENT_B},
            {MS_OPRATE_EMBEDDING, J_EMB_F, J_EMB_B},       {MS_OPRATE_DROPOUT, J_DROP_F, J_DROP_B},
            {MS_OPRATE_ADAMW, J_ADAMW, J_ADAMW},           {MS_OPRATE_SUMSQ, J_SUMSQ, J_SUMSQ},
            {MS_OPRATE_MEMSET, J_MEMSET, J_MEMSET}};
        for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
            double tf = jobs[elt0 + map[i].f - J_LN_F].seconds;
            double tb = jobs[elt0 + map[i].b - J_LN_F].seconds;
            double bf = elt_bytes(map[i].f), bb = elt_bytes(map[i].b);
            c->oprate[map[i].r] = map[i].f == map[i].b ? bf / tf : (bf + bb) / (tf + tb);
        }
    }
    double best = 0;
    for (int i = 0; i < c->n_gemm; i++)
        if (c->gemm[i].flops_per_s > best) best = c->gemm[i].flops_per_s;
    if (log)
        fprintf(log, "cpu-local: sgemm up to %.1f GFLOP/s per core with every core busy\n",
                best / 1e9);
    /* one rank with two BLAS threads against one loaded core (a rank alone on 2+ cores) */
    c->blas_speedup_2 = 1;
    if (cores >= 2) {
        ms_k_blas_set_threads(2);
        job one = {.kind = J_GEMM, .m = 1024, .n = 1024, .k = 256};
        st = run_loaded(&one, 1, 1, err);
        ms_k_blas_set_threads(1);
        if (st != MS_OK) goto fail;
        double r2 = 2.0 * 1024 * 1024 * 256 / one.seconds;
        double r1 = 0;
        for (int i = 0; i < c->n_gemm; i++)
            if (c->gemm[i].m == 1024 && c->gemm[i].n == 1024 && c->gemm[i].k == 256)
                r1 = c->gemm[i].flops_per_s;
        if (r1 > 0) c->blas_speedup_2 = r2 / r1;
    }
    st = calibrate_colls(max_ranks, log, c, err);
    if (st != MS_OK) goto fail;

    /* the description */
    snprintf(c->name, sizeof c->name, "cpu-local");
    ms_cluster_cpu_model(c->cpu_model, sizeof c->cpu_model);
    snprintf(c->device, sizeof c->device, "thread rank on %.80s", c->cpu_model);
    snprintf(c->backend, sizeof c->backend, "threads");
    c->cpu = true;
    c->cores = cores;
    c->devices_per_node = 4096;
    c->nodes = 1;
    c->peak_flops[MS_PLAN_FP32] = c->peak_flops[MS_PLAN_BF16] = best; /* per rank on a core */
    c->gemm_efficiency[MS_PLAN_FP32] = c->gemm_efficiency[MS_PLAN_BF16] = 1;
    c->vector_flops = best / 4;
    c->mem_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    c->usable_memory_fraction = 0.8;
    c->mem_bw = c->oprate[MS_OPRATE_STREAM] * cores;
    c->mem_efficiency = 1;
    c->algo = MS_ALGO_DIRECT;
    for (int i = 0; i < c->n_coll; i++)
        if (c->coll[i].ranks == 2 && c->coll[i].kind == MS_COLL_ALL_REDUCE)
            c->intra =
                (ms_link){.bw = c->coll[i].busbw, .latency = c->coll[i].alpha, .efficiency = 1};
    c->inter = c->intra;
    c->causal_skip = true;
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(c->calibrated_at, sizeof c->calibrated_at, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    st = calibrate_sync(max_ranks, log, c, err);
    if (st != MS_OK) goto fail;
    if (log) fprintf(log, "cpu-local: calibrated in %.1f s\n", now_s() - t_start);
    *out = *c;
fail:
    ms_k_blas_set_threads(blas_before > 0 ? blas_before : 1);
    free(c);
    return st;
}

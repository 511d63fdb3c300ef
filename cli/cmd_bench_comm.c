/* cmd_bench_comm.c - `meshscope bench comm`: bus bandwidth of meshscope's threads backend
 * next to OpenMPI's own blocking collectives, in the nccl-tests convention.
 *
 * The threads side runs in this process through ms_launch and the ms_* collectives. The
 * MPI side is a child `mpirun ... meshscope bench comm-mpi-worker` that calls MPI_Allreduce
 * and friends directly (not meshscope's MPI backend) and prints one machine-readable row
 * per point on stdout, which this process parses. Both sides share the timing protocol
 * below, so the numbers differ only by the transport. See bench/README.md.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "cli/child.h"
#include "cli/commands.h"
#include "engine/core/xalloc.h"
#include "engine/runtime/ctx.h"

#include "cli/options.h"

#ifdef MS_HAVE_MPI
#include <mpi.h>
#endif

/* --- options --------------------------------------------------------------------------------- */

typedef enum bop { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_COUNT } bop;

static const char *const op_names[OP_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                               "all_to_all"};
static const ms_coll_kind op_kinds[OP_COUNT] = {MS_COLL_ALL_REDUCE, MS_COLL_ALL_GATHER,
                                                MS_COLL_REDUCE_SCATTER, MS_COLL_ALL_TO_ALL};

#define MAX_RANK_LIST 8
#define MAX_RANKS     64
#define MAX_BYTES     ((size_t)2 << 30) /* 2 GiB: counts stay far below MPI's int limit */
#define ROW_TAG       "MSROW"

typedef struct bench_opts {
    bool json;
    int ranks[MAX_RANK_LIST];
    int n_ranks;
    size_t min_bytes, max_bytes;
    int step;  /* size multiplier between points */
    int iters; /* 0: scaled by size */
    int reps;  /* repetitions per point; the median is reported */
    bool ops[OP_COUNT];
    bool run_threads, run_mpi;
    bool mpi_default_malloc; /* leave glibc's mmap/trim behaviour alone in the MPI worker */
} bench_opts;

/* Parses "4096", "4K", "4KiB", "256M", "1G" into bytes. */
static bool parse_bytes(const char *s, size_t *out) {
    if (!s || !isdigit((unsigned char)s[0])) return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return false;
    unsigned long long mul = 1;
    if (*end) {
        char u = (char)toupper((unsigned char)*end++);
        if (u == 'K')
            mul = 1ULL << 10;
        else if (u == 'M')
            mul = 1ULL << 20;
        else if (u == 'G')
            mul = 1ULL << 30;
        else
            return false;
        if (!strcmp(end, "iB") || !strcmp(end, "B") || !strcmp(end, "ib") || !strcmp(end, "b"))
            end += strlen(end);
        if (*end) return false;
    }
    if (v > (unsigned long long)SIZE_MAX / mul) return false;
    *out = (size_t)(v * mul);
    return true;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static int op_parse(const char *s, size_t len) {
    for (int i = 0; i < OP_COUNT; i++) {
        if (strlen(op_names[i]) != len) continue;
        bool same = true;
        for (size_t k = 0; k < len && same; k++)
            same = (s[k] == '-' ? '_' : s[k]) == op_names[i][k];
        if (same) return i;
    }
    return -1;
}

/* Option callbacks (options.h): each parses one flag's text into dest. */
static bool opt_ranks(const char *v, void *dest, char *msg, size_t cap) {
    bench_opts *o = dest;
    o->n_ranks = 0;
    const char *p = v;
    while (*p) {
        char item[32];
        size_t k = strcspn(p, ",");
        snprintf(item, sizeof item, "%.*s", (int)(k < 31 ? k : 31), p);
        int r;
        if (k == 0 || k > 30 || !parse_int(item, 2, MAX_RANKS, &r)) {
            snprintf(msg, cap, "'%s' is not a rank count between 2 and %d", item, MAX_RANKS);
            return false;
        }
        if (o->n_ranks == MAX_RANK_LIST) {
            snprintf(msg, cap, "at most %d rank counts", MAX_RANK_LIST);
            return false;
        }
        o->ranks[o->n_ranks++] = r;
        p += k;
        if (*p == ',') p++;
    }
    if (o->n_ranks == 0) {
        snprintf(msg, cap, "give a list such as 2,4");
        return false;
    }
    return true;
}

static bool opt_bytes(const char *v, void *dest, char *msg, size_t cap) {
    size_t b;
    if (!parse_bytes(v, &b) || b < 4 || b > MAX_BYTES) {
        snprintf(msg, cap, "expected a size between 4 and 2G (bytes, or with a K, M, G suffix)");
        return false;
    }
    *(size_t *)dest = b;
    return true;
}

static bool opt_ops(const char *v, void *dest, char *msg, size_t cap) {
    bool *ops = dest;
    for (int k = 0; k < OP_COUNT; k++) ops[k] = false;
    const char *p = v;
    do {
        size_t k = strcspn(p, ",");
        int op = op_parse(p, k);
        if (op < 0) {
            snprintf(msg, cap,
                     "unknown operation '%.*s'; use all_reduce, all_gather, reduce_scatter, "
                     "all_to_all",
                     (int)(k < 40 ? k : 40), p);
            return false;
        }
        ops[op] = true;
        p += k;
    } while (*p++ == ',');
    return true;
}

static bool opt_backends(const char *v, void *dest, char *msg, size_t cap) {
    bench_opts *o = dest;
    o->run_threads = o->run_mpi = false;
    const char *p = v;
    do {
        size_t k = strcspn(p, ",");
        if (k == 7 && !strncmp(p, "threads", 7))
            o->run_threads = true;
        else if (k == 3 && !strncmp(p, "mpi", 3))
            o->run_mpi = true;
        else {
            snprintf(msg, cap, "unknown backend '%.*s'; use threads, mpi", (int)(k < 40 ? k : 40),
                     p);
            return false;
        }
        p += k;
    } while (*p++ == ',');
    return true;
}

/* Parses argv (argv[0] is the subcommand name) for `meshscope NAME`. Returns MS_OPTS_PROCEED,
 * or the exit code after the help or an error. */
static int parse_opts(const char *name, int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.ranks = {2, 4},
                      .n_ranks = 2,
                      .min_bytes = 4096,
                      .step = 4,
                      .run_threads = true,
                      .run_mpi = true};
    for (int i = 0; i < OP_COUNT; i++) o->ops[i] = true;
    bool quick = false;
    const ms_option opts[] = {
        MS_FLAG("json", &o->json, "print JSON instead of a table"),
        MS_CALL("ranks", "LIST", o, opt_ranks,
                "rank counts, comma-separated, each >= 2 (default 2,4)"),
        MS_CALL("min-bytes", "B", &o->min_bytes, opt_bytes,
                "smallest size (default 4096; suffixes K, M, G = KiB, MiB, GiB)"),
        MS_CALL("max-bytes", "B", &o->max_bytes, opt_bytes,
                "largest size (default 256M, at most 2G)"),
        MS_INT("step", "F", &o->step, 2, 16, "size multiplier between points (default 4)"),
        MS_INT("iters", "N", &o->iters, 1, 1000000,
               "timed iterations per repetition (default: ~30 ms a repetition)"),
        MS_INT("reps", "R", &o->reps, 1, 99, "repetitions per point, median reported (default 5)"),
        MS_CALL("ops", "LIST", o->ops, opt_ops,
                "subset of all_reduce,all_gather,reduce_scatter,all_to_all (default all)"),
        MS_CALL("backends", "LIST", o, opt_backends, "subset of threads,mpi (default both)"),
        MS_FLAG("quick", &quick, "--max-bytes 16M --reps 3 (unless given)"),
        MS_FLAG("mpi-default-malloc", &o->mpi_default_malloc,
                "do not keep OpenMPI's per-call temporaries in the heap (bench/README.md)"),
    };
    const ms_opts_cmd cmd = {
        .name = name,
        .synopsis = "[options]",
        .about = "Bus bandwidth (nccl-tests convention) of all_reduce, all_gather, "
                 "reduce_scatter and all_to_all:\nmeshscope's threads backend next to "
                 "OpenMPI's own collectives.",
        MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, NULL, 0, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    /* 0: not given (neither flag accepts 0). */
    if (!o->max_bytes) o->max_bytes = quick ? (size_t)16 << 20 : (size_t)256 << 20;
    if (!o->reps) o->reps = quick ? 3 : 5;
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "meshscope %s: --min-bytes (%zu) is larger than --max-bytes (%zu)\n", name,
                o->min_bytes, o->max_bytes);
        return 2;
    }
    return MS_OPTS_PROCEED;
}

/* --- the measurement protocol, shared by both sides ------------------------------------------ */

typedef struct point {
    bop op;
    int ranks;
    size_t bytes; /* nccl-tests convention for op, see elems() */
    int iters, reps;
    double time_us; /* median over repetitions of the time per iteration */
    double min_us;
} point;

/* What a side provides: one collective on preallocated buffers, a barrier and a max. */
typedef struct runner runner;
struct runner {
    int rank, n;
    float *send, *recv; /* max_bytes each */
    size_t *counts, *displs;
    ms_comm *comm; /* threads side */
    ms_status (*coll)(runner *r, bop op, size_t c, ms_error *err);
    ms_status (*barrier)(runner *r, ms_error *err);
    ms_status (*max_over_ranks)(runner *r, double *v, ms_error *err);
};

/* Elements per block for op at `bytes`: all_reduce reduces `bytes` (one buffer); the
 * others move `bytes` in total (gathered output, scattered input, sent per rank), that is
 * n blocks. Returns the bytes actually used (rounded down to whole blocks, at least one). */
static size_t elems(bop op, size_t bytes, int n, size_t *block) {
    size_t f = bytes / sizeof(float);
    if (op == OP_ALL_REDUCE) {
        *block = f ? f : 1;
        return *block * sizeof(float);
    }
    *block = f / (size_t)n ? f / (size_t)n : 1;
    return *block * (size_t)n * sizeof(float);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static ms_status time_iters(runner *r, bop op, size_t c, int iters, double *sec, ms_error *err) {
    MS_CHECK(r->barrier(r, err));
    int64_t t0 = ms_now_ns();
    for (int i = 0; i < iters; i++) MS_CHECK(r->coll(r, op, c, err));
    *sec = (double)(ms_now_ns() - t0) * 1e-9;
    /* The slowest rank defines the collective's time. */
    return r->max_over_ranks(r, sec, err);
}

#define TARGET_REP_S 0.03 /* one repetition: long enough to average out the clock */

/* Measures one point. Every decision derives from values that are identical on all ranks
 * (options and max-reduced times), so the ranks stay in lockstep. */
static ms_status measure(runner *r, const bench_opts *o, bop op, size_t bytes, point *out,
                         ms_error *err) {
    size_t c;
    out->op = op;
    out->ranks = r->n;
    out->bytes = elems(op, bytes, r->n, &c);
    MS_CHECK(r->coll(r, op, c, err)); /* warm-up: caches, MPI's internal buffers */
    double t1;
    MS_CHECK(time_iters(r, op, c, 1, &t1, err));
    if (t1 < 1e-3) { /* small: one call is too noisy to size the loop; also warms up more */
        MS_CHECK(time_iters(r, op, c, 10, &t1, err));
        t1 /= 10;
    }
    int iters = o->iters, reps = o->reps;
    if (!iters) {
        double want = ceil(TARGET_REP_S / (t1 > 1e-9 ? t1 : 1e-9));
        iters = want > 100000 ? 100000 : want < 1 ? 1 : (int)want;
        if (t1 * reps > 2.0 && reps > 3) reps = 3; /* the largest sizes: keep the run short */
    }
    double times[99];
    for (int k = 0; k < reps; k++) {
        MS_CHECK(time_iters(r, op, c, iters, &times[k], err));
        times[k] /= iters;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    out->iters = iters;
    out->reps = reps;
    out->time_us =
        (reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2])) * 1e6;
    out->min_us = times[0] * 1e6;
    return MS_OK;
}

static int n_sizes(const bench_opts *o) {
    int k = 0;
    for (size_t b = o->min_bytes; b <= o->max_bytes; b *= (size_t)o->step) k++;
    return k;
}

/* Runs every (op, size) point on one runner; rank 0's `emit` receives each result. `ready`
 * is this rank's setup status: the ranks first agree that all of them are ready, so that
 * one failed allocation stops every rank instead of leaving its peers waiting. */
static ms_status run_points(runner *r, const bench_opts *o, ms_status ready,
                            void (*emit)(void *, const point *), void *user, ms_error *err) {
    double failed = ready != MS_OK;
    ms_error e2;
    MS_CHECK(r->max_over_ranks(r, &failed, ready != MS_OK ? &e2 : err));
    if (ready != MS_OK) return ready;
    if (failed > 0)
        return ms_fail(err, MS_ERR_NOMEM, "another rank could not allocate its buffers");
    for (int op = 0; op < OP_COUNT; op++) {
        if (!o->ops[op]) continue;
        size_t prev = 0;
        for (size_t b = o->min_bytes; b <= o->max_bytes; b *= (size_t)o->step) {
            size_t c, bytes = elems((bop)op, b, r->n, &c);
            if (bytes == prev) continue; /* tiny sizes rounded to the same point */
            prev = bytes;
            point p;
            MS_CHECK(measure(r, o, (bop)op, b, &p, err));
            if (r->rank == 0) emit(user, &p);
        }
    }
    return MS_OK;
}

/* Buffers of max_bytes (at least one float per rank, see elems), written once so that page
 * faults stay out of the timings. */
static ms_status runner_alloc(runner *r, const bench_opts *o, ms_error *err) {
    size_t len =
        o->max_bytes > (size_t)r->n * sizeof(float) ? o->max_bytes : (size_t)r->n * sizeof(float);
    len = (len + 63) & ~(size_t)63;
    r->send = aligned_alloc(64, len);
    r->recv = aligned_alloc(64, len);
    if (!r->send || !r->recv)
        return ms_fail(err, MS_ERR_NOMEM, "cannot allocate 2 x %zu bytes of buffers", len);
    for (size_t i = 0; i < len / sizeof(float); i++) r->send[i] = (float)(r->rank + 1);
    memset(r->recv, 0, len);
    r->counts = xcalloc((size_t)r->n, sizeof *r->counts);
    r->displs = xcalloc((size_t)r->n, sizeof *r->displs);
    return MS_OK;
}

static void runner_free(runner *r) {
    free(r->send);
    free(r->recv);
    free(r->counts);
    free(r->displs);
}

/* --- results --------------------------------------------------------------------------------- */

typedef struct row {
    point p;
    bool mpi; /* backend: false = threads */
} row;

typedef struct rows {
    row *v;
    int n, cap;
} rows;

static void rows_add(rows *rs, const point *p, bool mpi) {
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 64;
        rs->v = xrealloc(rs->v, (size_t)rs->cap * sizeof *rs->v);
    }
    rs->v[rs->n++] = (row){*p, mpi};
}

static const row *rows_find(const rows *rs, bop op, int ranks, size_t bytes, bool mpi) {
    for (int i = 0; i < rs->n; i++) {
        const row *w = &rs->v[i];
        if (w->p.op == op && w->p.ranks == ranks && w->p.bytes == bytes && w->mpi == mpi) return w;
    }
    return NULL;
}

/* GB/s with GB = 1e9 bytes, as nccl-tests. */
static double algbw(const point *p) {
    return (double)p->bytes / (p->time_us * 1e-6) / 1e9;
}
static double busbw(const point *p) {
    return algbw(p) * ms_coll_busbw_factor(op_kinds[p->op], p->ranks);
}

/* --- threads side ---------------------------------------------------------------------------- */

static ms_status th_coll(runner *r, bop op, size_t c, ms_error *err) {
    for (int p = 0; p < r->n; p++) {
        r->counts[p] = c;
        r->displs[p] = (size_t)p * c;
    }
    switch (op) {
        case OP_ALL_REDUCE:
            return ms_all_reduce(r->comm, r->send, r->recv, c, MS_REDUCE_SUM, err);
        case OP_ALL_GATHER:
            return ms_all_gather(r->comm, r->send, r->recv, r->counts, err);
        case OP_REDUCE_SCATTER:
            return ms_reduce_scatter(r->comm, r->send, r->recv, r->counts, MS_REDUCE_SUM, err);
        case OP_ALL_TO_ALL:
            return ms_all_to_all(r->comm, r->send, r->counts, r->displs, r->recv, r->counts,
                                 r->displs, err);
        default:
            return ms_fail(err, MS_ERR_INTERNAL, "unknown bench op %d", (int)op);
    }
}

static ms_status th_barrier(runner *r, ms_error *err) {
    return ms_barrier(r->comm, err);
}

static ms_status th_max(runner *r, double *v, ms_error *err) {
    float x = (float)*v, y = 0;
    MS_CHECK(ms_all_reduce(r->comm, &x, &y, 1, MS_REDUCE_MAX, err));
    *v = y;
    return MS_OK;
}

typedef struct th_arg {
    const bench_opts *o;
    rows *out;
} th_arg;

static void th_emit(void *user, const point *p) {
    rows_add(((th_arg *)user)->out, p, false);
}

static ms_status th_rank(ms_ctx *ctx, void *arg, ms_error *err) {
    th_arg *a = arg;
    runner r = {.rank = ctx->rank,
                .n = ctx->world_size,
                .comm = ctx->world,
                .coll = th_coll,
                .barrier = th_barrier,
                .max_over_ranks = th_max};
    ms_status st = runner_alloc(&r, a->o, err);
    st = run_points(&r, a->o, st, th_emit, a, err);
    runner_free(&r);
    return st;
}

static ms_status run_threads(const bench_opts *o, int n, rows *out, ms_error *err) {
    th_arg a = {o, out};
    ms_launch_opts lo = {
        .backend = MS_BACKEND_THREADS, .nranks = n, .seed = 1, .timeout_ms = 300000};
    return ms_launch(&lo, th_rank, &a, err);
}

/* --- MPI side: the worker -------------------------------------------------------------------- */

#ifdef MS_HAVE_MPI

static ms_status mpi_check(int rc, const char *what, ms_error *err) {
    if (rc == MPI_SUCCESS) return MS_OK;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return ms_fail(err, MS_ERR_COMM, "%s failed: %s", what, s);
}

static ms_status mw_coll(runner *r, bop op, size_t c, ms_error *err) {
    int ci = (int)c; /* c <= 2 GiB / 4: fits */
    switch (op) {
        case OP_ALL_REDUCE:
            return mpi_check(
                MPI_Allreduce(r->send, r->recv, ci, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce", err);
        case OP_ALL_GATHER:
            return mpi_check(
                MPI_Allgather(r->send, ci, MPI_FLOAT, r->recv, ci, MPI_FLOAT, MPI_COMM_WORLD),
                "MPI_Allgather", err);
        case OP_REDUCE_SCATTER:
            return mpi_check(
                MPI_Reduce_scatter_block(r->send, r->recv, ci, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Reduce_scatter_block", err);
        case OP_ALL_TO_ALL:
            return mpi_check(
                MPI_Alltoall(r->send, ci, MPI_FLOAT, r->recv, ci, MPI_FLOAT, MPI_COMM_WORLD),
                "MPI_Alltoall", err);
        default:
            return ms_fail(err, MS_ERR_INTERNAL, "unknown bench op %d", (int)op);
    }
}

static ms_status mw_barrier(runner *r, ms_error *err) {
    (void)r;
    return mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", err);
}

static ms_status mw_max(runner *r, double *v, ms_error *err) {
    (void)r;
    double in = *v;
    return mpi_check(MPI_Allreduce(&in, v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
                     "MPI_Allreduce (max time)", err);
}

/* One tab-separated row per point; the parent parses these (see parse_row). */
static void mw_emit(void *user, const point *p) {
    (void)user;
    printf("%s\t%s\t%d\t%zu\t%d\t%d\t%.4f\t%.4f\n", ROW_TAG, op_names[p->op], p->ranks, p->bytes,
           p->iters, p->reps, p->time_us, p->min_us);
    fflush(stdout);
}

int ms_cmd_bench_comm_mpi_worker(int argc, char **argv) {
    bench_opts o;
    int rc = parse_opts("bench comm-mpi-worker", argc, argv, &o);
    if (rc != MS_OPTS_PROCEED) return rc;
    /* OpenMPI allocates temporaries inside some collectives (reduce-scatter: the whole
     * input) on every call. Large ones are mmapped by glibc and returned on free, so each
     * call pays fresh page faults, ~15 us per page in a VM such as a Firecracker sandbox:
     * that would measure the allocator, not the transport. Keeping all allocations in the
     * heap and never trimming it lets later calls reuse the pages, as a long-running job's
     * warmed-up allocator would. The threads backend allocates nothing per call. */
    if (!o.mpi_default_malloc) {
        mallopt(M_MMAP_MAX, 0);
        mallopt(M_TRIM_THRESHOLD, INT_MAX);
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    runner r = {.coll = mw_coll, .barrier = mw_barrier, .max_over_ranks = mw_max};
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.n);
    ms_error err = {0};
    ms_status st = runner_alloc(&r, &o, &err);
    st = run_points(&r, &o, st, mw_emit, NULL, &err);
    runner_free(&r);
    if (st != MS_OK) {
        fprintf(stderr, "meshscope bench comm-mpi-worker: rank %d: %s\n", r.rank, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1); /* peers may be blocked in a collective */
    }
    MPI_Finalize();
    return 0;
}

#else

int ms_cmd_bench_comm_mpi_worker(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "meshscope bench comm-mpi-worker: this build has no MPI support\n");
    return 2;
}

#endif

/* --- MPI side: the parent -------------------------------------------------------------------- */

#define MPI_SIDE_TIMEOUT_S 1800 /* a stuck mpirun is killed rather than waited for forever */
#define MPI_SIDE_GRACE_S   10   /* after SIGTERM, before SIGKILL */

#ifdef MS_HAVE_MPI

static bool find_on_path(const char *name, char *out, size_t len) {
    const char *path = getenv("PATH");
    if (!path) return false;
    while (*path) {
        size_t k = strcspn(path, ":");
        snprintf(out, len, "%.*s/%s", (int)k, k ? path : ".", name);
        if (access(out, X_OK) == 0) return true;
        path += k;
        if (*path == ':') path++;
    }
    return false;
}

static bool parse_row(char *line, point *p) {
    char *f[9];
    int nf = 0;
    for (char *s = strtok(line, "\t"); s && nf < 9; s = strtok(NULL, "\t")) f[nf++] = s;
    if (nf != 8 || strcmp(f[0], ROW_TAG)) return false;
    int op = op_parse(f[1], strlen(f[1]));
    if (op < 0) return false;
    p->op = (bop)op;
    p->ranks = atoi(f[2]);
    p->bytes = (size_t)strtoull(f[3], NULL, 10);
    p->iters = atoi(f[4]);
    p->reps = atoi(f[5]);
    p->time_us = strtod(f[6], NULL);
    p->min_us = strtod(f[7], NULL);
    return p->ranks > 0 && p->time_us > 0;
}

static void list_arg(char *buf, size_t len, const bench_opts *o) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < OP_COUNT; i++)
        if (o->ops[i]) k += (size_t)snprintf(buf + k, len - k, "%s%s", k ? "," : "", op_names[i]);
}

/* Runs the worker under mpirun with n processes and collects its rows. MS_ERR_UNSUPPORTED
 * when the comparison cannot run here (no mpirun, no MPI in this build). */
static ms_status run_mpi(const bench_opts *o, int n, rows *out, ms_error *err) {
    char mpirun[4096], self[4096];
    if (!find_on_path("mpirun", mpirun, sizeof mpirun))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "mpirun is not on PATH, so only the threads side ran; install OpenMPI "
                       "(apt-get install openmpi-bin) to compare");
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return ms_fail(err, MS_ERR_IO, "cannot find this executable (/proc/self/exe)");
    self[sl] = '\0';
    fprintf(stderr, "bench comm: OpenMPI (mpirun -np %d), %d sizes ...\n", n, n_sizes(o));
    char np[16], minb[32], maxb[32], step[16], reps[16], iters[16], ops[128];
    snprintf(np, sizeof np, "%d", n);
    snprintf(minb, sizeof minb, "%zu", o->min_bytes);
    snprintf(maxb, sizeof maxb, "%zu", o->max_bytes);
    snprintf(step, sizeof step, "%d", o->step);
    snprintf(reps, sizeof reps, "%d", o->reps);
    snprintf(iters, sizeof iters, "%d", o->iters);
    list_arg(ops, sizeof ops, o);
    /* Node-local shared-memory transport (vader), as in the test suite; no binding, since
     * the threads side is not bound either and ranks may outnumber cores. */
    char *argv[40];
    int na = 0;
    char *fixed[] = {mpirun,
                     "--allow-run-as-root",
                     "--oversubscribe",
                     "--bind-to",
                     "none",
                     "--mca",
                     "btl",
                     "self,vader",
                     "-np",
                     np,
                     self,
                     "bench",
                     "comm-mpi-worker",
                     "--ops",
                     ops,
                     "--min-bytes",
                     minb,
                     "--max-bytes",
                     maxb,
                     "--step",
                     step,
                     "--reps",
                     reps};
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++) argv[na++] = fixed[k];
    if (o->iters) {
        argv[na++] = "--iters";
        argv[na++] = iters;
    }
    if (o->mpi_default_malloc) argv[na++] = "--mpi-default-malloc";
    argv[na] = NULL;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return ms_fail(err, MS_ERR_IO, "pipe: %s", strerror(errno));
    /* mpirun and its ranks in a process group of their own: a signal to the bench reaches
     * all of them, and none outlives it (cli/child.h). */
    ms_child child;
    int rc = ms_child_start(argv, true, fds[1], &child);
    int e = errno;
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return ms_fail(err, MS_ERR_IO, "cannot start %s: %s", mpirun, strerror(e));
    }
    /* Read rows line by line; anything else the child prints goes to our stderr, so that
     * stdout stays clean for --json. */
    char buf[8192];
    size_t have = 0;
    int got = 0;
    bool timed_out = false;
    int64_t deadline = ms_now_ns() + (int64_t)MPI_SIDE_TIMEOUT_S * 1000000000LL;
    for (;;) {
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int64_t left_ms = (deadline - ms_now_ns()) / 1000000;
        if (left_ms <= 0) {
            timed_out = true;
            break;
        }
        int pr = poll(&pfd, 1, left_ms > 60000 ? 60000 : (int)left_ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        ssize_t k = read(fds[0], buf + have, sizeof buf - 1 - have);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        have += (size_t)k;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n'))) {
            *nl = '\0';
            point p;
            char copy[512];
            snprintf(copy, sizeof copy, "%.*s", (int)sizeof copy - 1, line);
            if (parse_row(copy, &p)) {
                rows_add(out, &p, true);
                got++;
            } else if (*line) {
                fprintf(stderr, "[mpirun] %s\n", line);
            }
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
        if (have == sizeof buf - 1) have = 0; /* an absurdly long line: drop it */
    }
    close(fds[0]);
    int code = timed_out ? ms_child_stop(&child, SIGTERM, MPI_SIDE_GRACE_S)
                         : ms_child_wait(&child, MPI_SIDE_GRACE_S);
    if (timed_out)
        return ms_fail(err, MS_ERR_TIMEOUT, "the MPI side with %d ranks did not finish within %d s",
                       n, MPI_SIDE_TIMEOUT_S);
    if (ms_child_forwarded())
        return ms_fail(err, MS_ERR_IO, "the MPI side with %d ranks was stopped by signal %d", n,
                       ms_child_forwarded());
    if (code != 0)
        return ms_fail(err, MS_ERR_COMM, "the MPI side with %d ranks failed (%s %d) after %d rows",
                       n, code > 128 ? "signal" : "exit code", code > 128 ? code - 128 : code, got);
    return MS_OK;
}

#else

static ms_status run_mpi(const bench_opts *o, int n, rows *out, ms_error *err) {
    (void)o, (void)n, (void)out;
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "this meshscope build has no MPI support, so only the threads side ran");
}

#endif

/* --- output ---------------------------------------------------------------------------------- */

static void fmt_bytes(char *buf, size_t len, size_t b) {
    if (b >= ((size_t)1 << 30) && b % ((size_t)1 << 30) == 0)
        snprintf(buf, len, "%zu GiB", b >> 30);
    else if (b >= ((size_t)1 << 20) && b % ((size_t)1 << 20) == 0)
        snprintf(buf, len, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, len, "%zu KiB", b >> 10);
    else
        snprintf(buf, len, "%zu B", b);
}

static void fmt_time(char *buf, size_t len, double us) {
    if (us >= 1e6)
        snprintf(buf, len, "%.2f s", us * 1e-6);
    else if (us >= 1e3)
        snprintf(buf, len, "%.2f ms", us * 1e-3);
    else
        snprintf(buf, len, "%.1f us", us);
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

/* Every (op, ranks, bytes) key in the order measured: op, then the --ranks order, then size. */
typedef void (*key_fn)(void *user, bop op, int ranks, size_t bytes, const row *th, const row *mpi);

static void for_each_key(const bench_opts *o, const rows *rs, key_fn fn, void *user) {
    for (int op = 0; op < OP_COUNT; op++) {
        if (!o->ops[op]) continue;
        for (int ri = 0; ri < o->n_ranks; ri++) {
            int n = o->ranks[ri];
            bool dup = false;
            for (int j = 0; j < ri; j++) dup |= o->ranks[j] == n;
            if (dup) continue;
            size_t prev = 0;
            for (size_t b = o->min_bytes; b <= o->max_bytes; b *= (size_t)o->step) {
                size_t c, bytes = elems((bop)op, b, n, &c);
                if (bytes == prev) continue; /* tiny sizes rounded to the same point */
                prev = bytes;
                const row *th = rows_find(rs, (bop)op, n, bytes, false);
                const row *mp = rows_find(rs, (bop)op, n, bytes, true);
                if (th || mp) fn(user, (bop)op, n, bytes, th, mp);
            }
        }
    }
}

static void table_line(void *user, bop op, int ranks, size_t bytes, const row *th, const row *mp) {
    bop *last = user;
    if (*last != op) {
        if (*last != OP_COUNT) printf("\n");
        *last = op;
    }
    char sz[32], tt[32] = "-", mt[32] = "-", tb[32] = "-", mb[32] = "-", ratio[32] = "-";
    fmt_bytes(sz, sizeof sz, bytes);
    if (th) {
        fmt_time(tt, sizeof tt, th->p.time_us);
        snprintf(tb, sizeof tb, "%.2f", busbw(&th->p));
    }
    if (mp) {
        fmt_time(mt, sizeof mt, mp->p.time_us);
        snprintf(mb, sizeof mb, "%.2f", busbw(&mp->p));
    }
    if (th && mp) snprintf(ratio, sizeof ratio, "%.2f", busbw(&th->p) / busbw(&mp->p));
    printf("%-14s %5d %9s  %11s %10s  %11s %10s  %11s\n", op_names[op], ranks, sz, tt, tb, mt, mb,
           ratio);
}

typedef struct json_state {
    bool first;
} json_state;

static void json_ratio(void *user, bop op, int ranks, size_t bytes, const row *th, const row *mp) {
    json_state *js = user;
    if (!th || !mp) return;
    printf("%s\n    {\"op\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"threads_busbw_gbs\": %.4f, "
           "\"mpi_busbw_gbs\": %.4f, \"threads_over_mpi\": %.4f}",
           js->first ? "" : ",", op_names[op], ranks, bytes, busbw(&th->p), busbw(&mp->p),
           busbw(&th->p) / busbw(&mp->p));
    js->first = false;
}

static void print_json(const bench_opts *o, const rows *rs, char notes[][MS_ERROR_MSG_MAX + 64],
                       int n_notes) {
    printf("{\n  \"bench\": \"comm\",\n  \"unit\": \"GB/s (1e9 bytes/s)\",\n  \"convention\": "
           "\"nccl-tests: algbw = bytes / time, busbw = algbw * factor\",\n  \"rows\": [");
    for (int i = 0; i < rs->n; i++) {
        const point *p = &rs->v[i].p;
        printf("%s\n    {\"op\": \"%s\", \"backend\": \"%s\", \"ranks\": %d, \"bytes\": %zu, "
               "\"iters\": %d, \"reps\": %d, \"time_us\": %.3f, \"min_time_us\": %.3f, "
               "\"algbw_gbs\": %.4f, \"busbw_factor\": %.4f, \"busbw_gbs\": %.4f}",
               i ? "," : "", op_names[p->op], rs->v[i].mpi ? "mpi" : "threads", p->ranks, p->bytes,
               p->iters, p->reps, p->time_us, p->min_us, algbw(p),
               ms_coll_busbw_factor(op_kinds[p->op], p->ranks), busbw(p));
    }
    printf("\n  ],\n  \"ratios\": [");
    json_state js = {true};
    for_each_key(o, rs, json_ratio, &js);
    printf("\n  ],\n  \"notes\": [");
    for (int i = 0; i < n_notes; i++) {
        printf("%s\n    ", i ? "," : "");
        json_str(notes[i]);
    }
    printf("%s]\n}\n", n_notes ? "\n  " : "");
}

/* --- the command ----------------------------------------------------------------------------- */

/* Refuses sizes that would not fit in memory: each rank holds two buffers of max_bytes,
 * and MPI's reductions add a temporary of about the same size. */
static bool memory_ok(const bench_opts *o, char *msg, size_t len) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) return true;
    double phys = (double)pages * (double)psz;
    int nmax = 0;
    for (int i = 0; i < o->n_ranks; i++) nmax = o->ranks[i] > nmax ? o->ranks[i] : nmax;
    double need = 3.0 * (double)o->max_bytes * nmax;
    if (need <= 0.75 * phys) return true;
    snprintf(msg, len,
             "--max-bytes %zu with %d ranks needs about %.1f GiB but this machine has %.1f GiB; "
             "lower --max-bytes",
             o->max_bytes, nmax, need / (1 << 30), phys / (1 << 30));
    return false;
}

int ms_cmd_bench_comm(int argc, char **argv) {
    bench_opts o;
    char msg[512];
    int rc = parse_opts("bench comm", argc, argv, &o);
    if (rc != MS_OPTS_PROCEED) return rc;
    if (!memory_ok(&o, msg, sizeof msg)) {
        fprintf(stderr, "meshscope bench comm: %s\n", msg);
        return 2;
    }
    rows rs = {0};
    char notes[MAX_RANK_LIST * 2 + 3][MS_ERROR_MSG_MAX + 64];
    int n_notes = 0;
    rc = 0;
    bool mpi_unavailable = false, mpi_ran = false;
    /* Ranks share the cores with whatever else runs: say so when the machine was busy. */
    double load = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (getloadavg(&load, 1) == 1 && load > 0.5)
        snprintf(notes[n_notes++], sizeof notes[0],
                 "the machine was not idle when the bench started (1-minute load average %.2f "
                 "on %ld CPUs): other work competes with the ranks, so numbers are noisy",
                 load, cpus);
    for (int ri = 0; ri < o.n_ranks; ri++) {
        int n = o.ranks[ri];
        bool dup = false;
        for (int j = 0; j < ri; j++) dup |= o.ranks[j] == n;
        if (dup) continue;
        ms_error err = {0};
        if (o.run_threads) {
            fprintf(stderr, "bench comm: threads backend, %d ranks, %d sizes ...\n", n,
                    n_sizes(&o));
            if (run_threads(&o, n, &rs, &err) != MS_OK) {
                snprintf(notes[n_notes++], sizeof notes[0], "threads side with %d ranks failed: %s",
                         n, err.msg);
                fprintf(stderr, "meshscope bench comm: %s\n", notes[n_notes - 1]);
                rc = 1;
            }
        }
        if (o.run_mpi && !mpi_unavailable) {
            ms_status st = run_mpi(&o, n, &rs, &err);
            mpi_ran |= st != MS_ERR_UNSUPPORTED;
            if (st == MS_ERR_UNSUPPORTED) {
                mpi_unavailable = true;
                snprintf(notes[n_notes++], sizeof notes[0], "%s", err.msg);
                fprintf(stderr, "meshscope bench comm: note: %s\n", err.msg);
            } else if (st != MS_OK) {
                snprintf(notes[n_notes++], sizeof notes[0], "%s", err.msg);
                fprintf(stderr, "meshscope bench comm: %s\n", err.msg);
                rc = 1;
            }
        }
        if (ms_child_forwarded()) { /* told to stop: no more world sizes */
            free(rs.v);
            return 128 + ms_child_forwarded();
        }
    }
    if (mpi_ran && !o.mpi_default_malloc)
        snprintf(notes[n_notes++], sizeof notes[0],
                 "the MPI worker keeps glibc allocations in the heap (M_MMAP_MAX=0, no trimming) "
                 "so that OpenMPI's per-call temporaries are not page-faulted in on every call; "
                 "--mpi-default-malloc turns this off");
    if (o.json) {
        print_json(&o, &rs, notes, n_notes);
    } else {
        printf("bus bandwidth, nccl-tests convention (GB/s = 1e9 B/s); time = median per call\n"
               "threads/mpi = threads busbw / mpi busbw (> 1: the threads backend is faster)\n\n");
        printf("%-14s %5s %9s  %11s %10s  %11s %10s  %11s\n", "op", "ranks", "size", "threads",
               "busbw", "mpi", "busbw", "threads/mpi");
        bop last = OP_COUNT;
        for_each_key(&o, &rs, table_line, &last);
        for (int i = 0; i < n_notes; i++) printf("%snote: %s\n", i ? "" : "\n", notes[i]);
    }
    free(rs.v);
    return rc;
}

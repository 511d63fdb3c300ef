/* test_reshard.c - the exhaustive reshard suite.
 *
 * For each mesh (1, 2, 3, 4, 2x2, 2x3 and 2x2x2, with permuted rank ids) and tensor shapes
 * whose dims do not divide by the mesh dims or are smaller than them, every pair of
 * placements (a seeded sample on the 3-d mesh) is resharded and every rank's result is
 * checked against the slice of an independently computed global reference:
 *   - a source is built from "parts": for each coordinate q of its Partial mesh dims a
 *     Philox tensor part_q; a rank holds part_q[its box]; the reference is the reduction
 *     of the parts over q, computed here in double precision;
 *   - a Partial target is reduced across its mesh dims with the (separately tested)
 *     communicator before comparing.
 * The same file runs on the threads backend and under mpirun.
 *
 * The bf16 cases (test_case_bf16) run every pair again with bf16 elements through
 * ms_reshard_run_dt: the parts are rounded to bf16 and the result must equal, bit for bit, the
 * slice of the bf16 global tensor, which is the parts reduced in fp32 in coordinate order and
 * rounded once, when the source has at most one Partial mesh dim and the target none. With
 * more (each reducing step rounds once) it must be within the bf16 rounding of each step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "tests/testkit.h"

#define MAX_STATES 16384

typedef struct case_set {
    const char *name;
    int mesh_ndim;
    int mesh_shape[3];
    int tndim;
    int nshapes;
    int64_t shapes[4][3];
    int sample; /* 0: all pairs; else this many seeded random pairs */
} case_set;

/* Every valid placement list for a mesh of M dims and a tensor of T dims, including
 * every nesting order of shards that share a tensor dim. */
static int enumerate_placements(int M, int T, ms_placements *out) {
    int nopt = 1 + T + MS_REDUCE_COUNT, n = 0;
    int combos = 1;
    for (int m = 0; m < M; m++) combos *= nopt;
    for (int c = 0; c < combos; c++) {
        ms_placements base = {.n = M};
        int rem = c;
        for (int m = 0; m < M; m++) {
            int o = rem % nopt;
            rem /= nopt;
            base.p[m] = o == 0   ? ms_pl_replicate()
                        : o <= T ? ms_pl_shard(o - 1)
                                 : ms_pl_partial((ms_reduce_op)(o - 1 - T));
        }
        /* Try every order assignment; keep the valid ones. */
        int orders = 1;
        for (int m = 0; m < M; m++) orders *= M;
        for (int a = 0; a < orders; a++) {
            ms_placements pl = base;
            int r2 = a;
            bool skip = false;
            for (int m = 0; m < M; m++) {
                int k = r2 % M;
                r2 /= M;
                if (pl.p[m].kind == MS_PL_SHARD)
                    pl.p[m].order = (int8_t)k;
                else if (k)
                    skip = true; /* count non-shard dims once */
            }
            if (skip || ms_placements_validate(&pl, M, T, NULL) != MS_OK) continue;
            if (n < MAX_STATES) out[n++] = pl;
        }
    }
    return n;
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static float part_value(int q, int64_t g) {
    return 2.0f * ms_philox_uniform(99, (uint64_t)q + 1, (uint64_t)g) - 1.0f;
}

/* The part as the bf16 cases hold it. */
static float part_bf16(int q, int64_t g) {
    return ms_f32_from_bf16(ms_bf16_from_f32(part_value(q, g)));
}

/* The part index of a rank: its coordinates along the Partial mesh dims, linearised. */
static int part_of(const ms_placements *pl, const ms_mesh *m, const int *coords) {
    int q = 0;
    for (int d = 0; d < m->ndim; d++)
        if (pl->p[d].kind == MS_PL_PARTIAL) q = q * m->shape[d] + coords[d];
    return q;
}

/* acc (op) x; AVG accumulates as a sum. */
static double combine(double acc, double x, ms_reduce_op op) {
    if (op == MS_REDUCE_MAX) return x > acc ? x : acc;
    if (op == MS_REDUCE_MIN) return x < acc ? x : acc;
    return acc + x;
}

/* Reference global value at linear index g: the reduction of all parts (rounded to bf16 first
 * when bf16); *mag, when not NULL, the sum of their magnitudes. */
static double reference(const ms_placements *pl, const ms_mesh *m, int64_t g, bool bf16,
                        double *mag) {
    float (*part)(int, int64_t) = bf16 ? part_bf16 : part_value;
    int nparts = 1, avg_div = 1;
    ms_reduce_op kind = MS_REDUCE_SUM;
    bool any = false;
    for (int d = 0; d < m->ndim; d++)
        if (pl->p[d].kind == MS_PL_PARTIAL) {
            any = true;
            nparts *= m->shape[d];
            ms_reduce_op op = (ms_reduce_op)pl->p[d].reduce;
            if (op == MS_REDUCE_AVG) avg_div *= m->shape[d];
            if (op == MS_REDUCE_MAX || op == MS_REDUCE_MIN) kind = op;
        }
    if (mag) *mag = any ? 0 : fabs(part(0, g));
    if (!any) return part(0, g);
    double acc = kind == MS_REDUCE_SUM ? 0 : part(0, g);
    for (int q = 0; q < nparts; q++) {
        double v = part(q, g);
        if (mag) *mag += fabs(v);
        acc = combine(acc, v, kind);
    }
    return kind == MS_REDUCE_SUM ? acc / avg_div : acc;
}

static int64_t linear(const int64_t *idx, const int64_t *shape, int ndim) {
    int64_t g = 0;
    for (int d = 0; d < ndim; d++) g = g * shape[d] + idx[d];
    return g;
}

static bool next_idx(int64_t *idx, const int64_t *len, int ndim) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < len[d]) return true;
        idx[d] = 0;
    }
    return false;
}

typedef struct pair_ctx {
    mt_rank *r;
    ms_dmesh *dm;
    int ndim;
    const int64_t *gshape;
    int64_t pairs_checked;
} pair_ctx;

/* This rank's source values: its part q on its box [start, start + len). */
static void fill_source(const pair_ctx *pc, const ms_placements *src, const int64_t *start,
                        const int64_t *len, float *out) {
    int64_t idx[MS_MAX_DIMS] = {0}, n = 1, gi[MS_MAX_DIMS];
    for (int d = 0; d < pc->ndim; d++) n *= len[d];
    int q = part_of(src, &pc->dm->mesh, pc->dm->coords);
    for (int64_t i = 0; i < n; next_idx(idx, len, pc->ndim)) {
        for (int d = 0; d < pc->ndim; d++) gi[d] = idx[d] + start[d];
        out[i++] = part_value(q, linear(gi, pc->gshape, pc->ndim));
    }
}

static void check_pair(pair_ctx *pc, const ms_placements *src, const ms_placements *dst) {
    mt_rank *r = pc->r;
    ms_dmesh *dm = pc->dm;
    const ms_mesh *m = &dm->mesh;
    const int ndim = pc->ndim;
    ms_error err = {0};
    char sa[96], sb[96];
    ms_placements_str(src, sa, sizeof sa);
    ms_placements_str(dst, sb, sizeof sb);
    bool member = ms_dmesh_is_member(dm);

    /* Build this rank's source local part from its part tensor. */
    ms_tensor local = {0};
    if (member) {
        int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS];
        ms_local_box(src, m, dm->coords, ndim, pc->gshape, start, len);
        if (!MT_OK(r, ms_tensor_alloc(r->ctx->device, MS_F32, ndim, len, &local, &err), &err))
            return;
        fill_source(pc, src, start, len, ms_tensor_f32(&local));
    }
    ms_dtensor t;
    ms_status st = ms_dtensor_from_local(dm, &local, src, ndim, pc->gshape, &t, &err);
    if (!MT_OK(r, st, &err)) {
        ms_tensor_release(&local);
        return;
    }
    ms_reshard_report rep;
    st = ms_reshard(&t, dst, &rep, &err);
    MT_CHECK(r, st == MS_OK, "%s: %s -> %s: %s", ms_comm_backend(r->ctx->world), sa, sb, err.msg);
    if (st != MS_OK || !member) {
        ms_dtensor_release(&t);
        return;
    }
    /* Predicted bytes equal executed bytes on the rank at coordinate 0 (the plan's rank). */
    bool origin = true;
    for (int d = 0; d < m->ndim; d++) origin &= dm->coords[d] == 0;
    if (origin) {
        ms_reshard_plan plan;
        ms_reshard_plan_make(m, src, dst, ndim, pc->gshape, &plan, &err);
        double predicted = 0;
        for (int k = 0; k < plan.nsteps; k++) predicted += plan.steps[k].coll_bytes;
        MT_CHECK(r, rep.nsteps == plan.nsteps && (double)rep.coll_bytes == predicted,
                 "%s -> %s: executed %d steps / %zu bytes, plan says %d / %.0f", sa, sb, rep.nsteps,
                 rep.coll_bytes, plan.nsteps, predicted);
    }
    /* Resolve Partial target dims with the communicator, then compare with the slice. */
    int64_t n = ms_tensor_numel(&t.local);
    float *v = xmalloc(sizeof(float) * (size_t)(n + 1));
    memcpy(v, ms_tensor_f32(&t.local), sizeof(float) * (size_t)n);
    for (int d = 0; d < m->ndim; d++)
        if (dst->p[d].kind == MS_PL_PARTIAL) {
            float *tmp = xmalloc(sizeof(float) * (size_t)(n + 1));
            MT_OK(r,
                  ms_all_reduce(dm->dim_comm[d], v, tmp, (size_t)n, (ms_reduce_op)dst->p[d].reduce,
                                &err),
                  &err);
            free(v);
            v = tmp;
        }
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS], idx[MS_MAX_DIMS] = {0};
    ms_local_box(dst, m, dm->coords, ndim, pc->gshape, start, len);
    for (int d = 0; d < ndim; d++)
        MT_CHECK(r, t.local.shape[d] == len[d], "%s -> %s: local dim %d is %lld, box says %lld", sa,
                 sb, d, (long long)t.local.shape[d], (long long)len[d]);
    if (n > 0 && r->failures < 5) {
        int64_t i = 0;
        do {
            int64_t gi[MS_MAX_DIMS];
            for (int d = 0; d < ndim; d++) gi[d] = idx[d] + start[d];
            double want = reference(src, m, linear(gi, pc->gshape, ndim), false, NULL);
            double got = v[i++];
            if (fabs(got - want) > 1e-5 * (1 + fabs(want))) {
                MT_CHECK(r, false,
                         "%s backend, mesh %dd, rank %d: %s -> %s at global index %lld: "
                         "got %.7f want %.7f",
                         ms_comm_backend(r->ctx->world), m->ndim, r->ctx->rank, sa, sb,
                         (long long)linear(gi, pc->gshape, ndim), got, want);
                break;
            }
        } while (next_idx(idx, len, ndim));
    }
    free(v);
    ms_dtensor_release(&t);
    pc->pairs_checked++;
}

/* --- bf16 ------------------------------------------------------------------------------ */

/* With at most one Partial mesh dim: the bf16 parts widened, reduced in fp32 in coordinate
 * order (the rank order of the dim's communicator) and rounded once, as the bf16 collectives
 * reduce them. */
static uint16_t reference_bf16(const ms_placements *pl, const ms_mesh *m, int64_t g) {
    int n = 1;
    ms_reduce_op op = MS_REDUCE_SUM;
    for (int d = 0; d < m->ndim; d++)
        if (pl->p[d].kind == MS_PL_PARTIAL) n = m->shape[d], op = (ms_reduce_op)pl->p[d].reduce;
    float acc = part_bf16(0, g);
    /* A float sum computed in double and rounded to float is the float sum (53 >= 2*24+2). */
    for (int q = 1; q < n; q++) acc = (float)combine(acc, part_bf16(q, g), op);
    if (op == MS_REDUCE_AVG) acc *= 1.0f / (float)n;
    return ms_bf16_from_f32(acc);
}

static int n_partial(const ms_placements *pl) {
    int k = 0;
    for (int d = 0; d < pl->n; d++) k += pl->p[d].kind == MS_PL_PARTIAL;
    return k;
}

/* This rank's bf16 source part: its float32 one rounded. */
static uint16_t *bf16_source(const pair_ctx *pc, const ms_placements *src) {
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS], n = 1;
    ms_local_box(src, &pc->dm->mesh, pc->dm->coords, pc->ndim, pc->gshape, start, len);
    for (int d = 0; d < pc->ndim; d++) n *= len[d];
    float *f = xmalloc(sizeof *f * (size_t)(n + 1));
    uint16_t *in = xmalloc(sizeof *in * (size_t)(n + 1));
    fill_source(pc, src, start, len, f);
    for (int64_t i = 0; i < n; i++) in[i] = ms_bf16_from_f32(f[i]);
    free(f);
    return in;
}

/* Element i of the result, at global index g, against the reference. */
static bool bf16_matches(const ms_placements *src, const ms_placements *dst, const ms_mesh *m,
                         int64_t g, uint16_t got, double *want) {
    if (n_partial(src) <= 1 && n_partial(dst) == 0) {
        uint16_t w = reference_bf16(src, m, g);
        *want = ms_f32_from_bf16(w);
        return got == w;
    }
    /* Each reducing step (and the Partial target's all-reduce) rounds once: at most half a
     * bf16 ulp (2^-9 relative) of a partial sum, bounded by the parts' magnitudes, each. */
    double mag;
    *want = reference(src, m, g, true, &mag);
    double tol = 0x1p-9 * (m->ndim + 1) * (mag + fabs(*want));
    return fabs(ms_f32_from_bf16(got) - *want) <= tol;
}

static void check_pair_bf16(pair_ctx *pc, const ms_placements *src, const ms_placements *dst) {
    mt_rank *r = pc->r;
    ms_dmesh *dm = pc->dm;
    const ms_mesh *m = &dm->mesh;
    const int ndim = pc->ndim;
    ms_reshard_plan plan;
    ms_error err = {0};
    if (!MT_OK(r, ms_reshard_plan_make(m, src, dst, ndim, pc->gshape, &plan, &err), &err)) return;
    if (!ms_dmesh_is_member(dm)) return;
    char sa[96], sb[96];
    ms_placements_str(src, sa, sizeof sa);
    ms_placements_str(dst, sb, sizeof sb);
    size_t n = 1;
    uint16_t *in = bf16_source(pc, src);
    int64_t start[MS_MAX_DIMS], len[MS_MAX_DIMS], idx[MS_MAX_DIMS] = {0};
    ms_local_box(dst, m, dm->coords, ndim, pc->gshape, start, len);
    for (int d = 0; d < ndim; d++) n *= (size_t)len[d];
    uint16_t *out = xmalloc(sizeof *out * (n + 1)), *tmp = xmalloc(sizeof *tmp * (n + 1));
    out[n] = 0xdead;
    ms_reshard_report rep;
    ms_status st = ms_reshard_run_dt(dm, &plan, ndim, pc->gshape, MS_BF16, in, out, &rep, &err);
    MT_CHECK(r, st == MS_OK, "bf16 %s: %s -> %s: %s", ms_comm_backend(r->ctx->world), sa, sb,
             err.msg);
    MT_CHECK(r, st != MS_OK || out[n] == 0xdead, "bf16 %s -> %s wrote past the end", sa, sb);
    /* Predicted bytes equal executed bytes on the plan's rank, half those of float32. */
    bool origin = true;
    for (int d = 0; d < m->ndim; d++) origin &= dm->coords[d] == 0;
    if (st == MS_OK && origin)
        MT_CHECK(r,
                 (double)rep.coll_bytes == ms_reshard_plan_bytes(&plan, 2) &&
                     2 * ms_reshard_plan_bytes(&plan, 2) == ms_reshard_plan_bytes(&plan, 4),
                 "bf16 %s -> %s: executed %zu bytes, plan says %.0f (f32 %.0f)", sa, sb,
                 rep.coll_bytes, ms_reshard_plan_bytes(&plan, 2), ms_reshard_plan_bytes(&plan, 4));
    for (int d = 0; st == MS_OK && d < m->ndim; d++)
        if (dst->p[d].kind == MS_PL_PARTIAL) {
            st = ms_all_reduce_dt(dm->dim_comm[d], MS_COMM_BF16, out, tmp, n,
                                  (ms_reduce_op)dst->p[d].reduce, &err);
            MT_OK(r, st, &err);
            memcpy(out, tmp, sizeof *out * n);
        }
    for (size_t i = 0; st == MS_OK && i < n && r->failures < 5; i++, next_idx(idx, len, ndim)) {
        int64_t gi[MS_MAX_DIMS];
        for (int d = 0; d < ndim; d++) gi[d] = idx[d] + start[d];
        int64_t g = linear(gi, pc->gshape, ndim);
        double want;
        if (!bf16_matches(src, dst, m, g, out[i], &want)) {
            MT_CHECK(r, false,
                     "bf16, %s backend, mesh %dd, rank %d: %s -> %s at global index %lld: got "
                     "%.7f (0x%04x) want %.7f",
                     ms_comm_backend(r->ctx->world), m->ndim, r->ctx->rank, sa, sb, (long long)g,
                     (double)ms_f32_from_bf16(out[i]), out[i], want);
            break;
        }
    }
    free(in);
    free(out);
    free(tmp);
    pc->pairs_checked++;
}

static void run_case_as(mt_rank *r, const case_set *cs, bool bf16) {
    ms_error err = {0};
    int size = 1;
    for (int d = 0; d < cs->mesh_ndim; d++) size *= cs->mesh_shape[d];
    int ids[64];
    for (int i = 0; i < size; i++) ids[i] = size - 1 - i; /* arbitrary (reversed) ids */
    ms_mesh mesh;
    if (!MT_OK(r, ms_mesh_init(&mesh, cs->mesh_ndim, cs->mesh_shape, NULL, ids, &err), &err))
        return;
    ms_dmesh *dm;
    if (!MT_OK(r, ms_dmesh_create(r->ctx, &mesh, &dm, &err), &err)) return;
    ms_placements *states = xmalloc(sizeof *states * MAX_STATES);
    int ns = enumerate_placements(cs->mesh_ndim, cs->tndim, states);
    pair_ctx pc = {.r = r, .dm = dm, .ndim = cs->tndim};
    void (*check)(pair_ctx *, const ms_placements *, const ms_placements *) =
        bf16 ? check_pair_bf16 : check_pair;
    for (int s = 0; s < cs->nshapes; s++) {
        pc.gshape = cs->shapes[s];
        if (cs->sample == 0) {
            for (int a = 0; a < ns; a++)
                for (int b = 0; b < ns; b++)
                    if (mt_sweep_take((long)a * ns + b, (long)ns * ns, s))
                        check(&pc, &states[a], &states[b]);
        } else {
            uint64_t seed = 12345 + (uint64_t)s;
            for (int k = 0; k < cs->sample; k++) {
                int a = (int)(lcg(&seed) % (uint64_t)ns), b = (int)(lcg(&seed) % (uint64_t)ns);
                if (mt_sweep_take(k, cs->sample, s)) check(&pc, &states[a], &states[b]);
            }
        }
    }
    if (r->ctx->rank == 0 && ms_dmesh_is_member(dm))
        print_message("  %s (%s backend%s): %d placements, %lld pairs checked on rank 0\n",
                      cs->name, ms_comm_backend(r->ctx->world), bf16 ? ", bf16" : "", ns,
                      (long long)pc.pairs_checked);
    free(states);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
}

static void run_case(mt_rank *r, void *arg) {
    run_case_as(r, arg, false);
}

static void run_case_bf16(mt_rank *r, void *arg) {
    run_case_as(r, arg, true);
}

static int world_for(const case_set *cs) {
    int size = 1;
    for (int d = 0; d < cs->mesh_ndim; d++) size *= cs->mesh_shape[d];
    return size;
}

#define SHAPES_2D                                                                                  \
    {                                                                                              \
        {5, 3}, {1, 4}, {3, 7}, {                                                                  \
            0, 2                                                                                   \
        }                                                                                          \
    }

static const case_set cases[] = {
    {"mesh [1]", 1, {1}, 2, 4, SHAPES_2D, 0},
    {"mesh [2]", 1, {2}, 2, 4, SHAPES_2D, 0},
    {"mesh [3]", 1, {3}, 2, 4, SHAPES_2D, 0},
    {"mesh [4]", 1, {4}, 2, 4, SHAPES_2D, 0},
    {"mesh [2,2]", 2, {2, 2}, 2, 3, SHAPES_2D, 0},
    {"mesh [2,3]", 2, {2, 3}, 2, 3, SHAPES_2D, 0},
    {"mesh [2,2,2]", 3, {2, 2, 2}, 3, 2, {{3, 5, 2}, {1, 2, 3}}, 400},
};

static void test_case(void **state) {
    const case_set *cs = *state;
    mt_run(world_for(cs), run_case, (void *)cs);
}

static void test_case_bf16(void **state) {
    const case_set *cs = *state;
    mt_run(world_for(cs), run_case_bf16, (void *)cs);
}

/* --- planner properties (no ranks) ----------------------------------------------------- */

static void plan_of(const char *mesh_text, const char *a, const char *b, int ndim, const int64_t *g,
                    ms_reshard_plan *plan) {
    ms_mesh m;
    ms_placements src, dst;
    ms_error err;
    assert_int_equal(ms_mesh_parse(&m, mesh_text, &err), MS_OK);
    assert_int_equal(ms_placements_parse(a, &src, &err), MS_OK);
    assert_int_equal(ms_placements_parse(b, &dst, &err), MS_OK);
    if (ms_reshard_plan_make(&m, &src, &dst, ndim, g, plan, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_mesh_free(&m);
}

static void planner_picks_fewest_bytes(void **state) {
    (void)state;
    const int64_t g[2] = {8, 8};
    ms_reshard_plan p;
    /* P -> S is one reduce-scatter, not all-reduce + slice. */
    plan_of("4", "[P(sum)]", "[S(0)]", 2, g, &p);
    assert_int_equal(p.nsteps, 1);
    assert_int_equal(p.steps[0].kind, MS_RSTEP_REDUCE_SCATTER);
    assert_float_equal(p.wire_bytes, 256.0 * 3 / 4, 1e-9);
    /* Slice first, then all-reduce half the data: 2*(1/2)*128 B instead of 256 B. */
    plan_of("2x2", "[P(sum), R]", "[R, S(0)]", 2, g, &p);
    assert_int_equal(p.nsteps, 2);
    assert_int_equal(p.steps[0].kind, MS_RSTEP_SLICE);
    assert_int_equal(p.steps[1].kind, MS_RSTEP_ALL_REDUCE);
    assert_float_equal(p.wire_bytes, 128.0, 1e-9);
    /* S(0) -> S(1) is one all-to-all. */
    plan_of("2", "[S(0)]", "[S(1)]", 2, g, &p);
    assert_int_equal(p.nsteps, 1);
    assert_int_equal(p.steps[0].kind, MS_RSTEP_ALL_TO_ALL);
    /* Swapping the nesting order needs the inner shard gathered first. */
    plan_of("2x2", "[S(0), S(0)]", "[S(0,1), S(0,0)]", 2, g, &p);
    assert_true(p.nsteps >= 2);
    assert_int_equal(p.steps[0].mesh_dim, 1); /* the innermost moves first */
    /* Same placements: no steps. */
    plan_of("2x2", "[S(0), R]", "[S(0), R]", 2, g, &p);
    assert_int_equal(p.nsteps, 0);
}

static void planner_cache_and_errors(void **state) {
    (void)state;
    ms_mesh m;
    ms_error err;
    ms_mesh_parse(&m, "2x2", &err);
    ms_placements a, b, bad;
    ms_placements_parse("[S(0), R]", &a, &err);
    ms_placements_parse("[R, S(1)]", &b, &err);
    ms_placements_parse("[S(5), R]", &bad, &err);
    const int64_t g[2] = {4, 6};
    struct ms_plan_cache *cache = ms_plan_cache_create();
    const ms_reshard_plan *p1, *p2;
    assert_int_equal(ms_plan_cache_get(cache, &m, &a, &b, 2, g, &p1, &err), MS_OK);
    assert_int_equal(ms_plan_cache_get(cache, &m, &a, &b, 2, g, &p2, &err), MS_OK);
    assert_ptr_equal(p1, p2);
    const int64_t g2[2] = {5, 6};
    assert_int_equal(ms_plan_cache_get(cache, &m, &a, &b, 2, g2, &p2, &err), MS_OK);
    assert_ptr_not_equal(p1, p2);
    assert_int_equal(ms_plan_cache_get(cache, &m, &bad, &b, 2, g, &p2, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "reshard source"));
    ms_plan_cache_destroy(cache);
    ms_mesh_free(&m);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(planner_picks_fewest_bytes),
    cmocka_unit_test(planner_cache_and_errors),
    cmocka_unit_test_prestate(test_case, (void *)&cases[0]),
    cmocka_unit_test_prestate(test_case, (void *)&cases[1]),
    cmocka_unit_test_prestate(test_case, (void *)&cases[2]),
    cmocka_unit_test_prestate(test_case, (void *)&cases[3]),
    cmocka_unit_test_prestate(test_case, (void *)&cases[4]),
    cmocka_unit_test_prestate(test_case, (void *)&cases[5]),
    cmocka_unit_test_prestate(test_case, (void *)&cases[6]),
    cmocka_unit_test_prestate(test_case_bf16, (void *)&cases[0]),
    cmocka_unit_test_prestate(test_case_bf16, (void *)&cases[1]),
    cmocka_unit_test_prestate(test_case_bf16, (void *)&cases[2]),
    cmocka_unit_test_prestate(test_case_bf16, (void *)&cases[3]),
    cmocka_unit_test_prestate(test_case_bf16, (void *)&cases[4]),
    cmocka_unit_test_prestate(test_case_bf16, (void *)&cases[5]),
    cmocka_unit_test_prestate(test_case_bf16, (void *)&cases[6]),
};
MT_MAIN("reshard", tests)

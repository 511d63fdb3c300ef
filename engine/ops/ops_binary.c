/* ops_binary.c - the elementwise binary family with numpy broadcasting (sub, div, maximum,
 * pow, comparisons, ...) and the ternary lerp and where.
 *
 * Shapes align from the right; a size-1 or missing input dim repeats along the output's.
 * Rule, per output dim d of size > 1: the output may be S(d) when every input that has d
 * with size > 1 is sharded on it and every input that repeats along d is replicated (each
 * rank then holds matching slices; a repeated input's gradient comes back P(sum) by
 * duality, the partial sums over each rank's slice). P(sum) passes through only where the op
 * is linear in its partial inputs: a + b and a - b (both partial), a * b (one partial, the
 * other replicated), a / b (a partial), lerp (a and b partial, w replicated) and where (a
 * and b partial, cond replicated). max/min of partial sums is not the partial of anything,
 * and a P(max) pass-through would leave the backward reading a partial input: none.
 *
 * Each op is a row of a table-driven family (MS_OP_FAMILY_ROW); the formulas are
 * kernels/elementwise_ext.c's.
 */
#include "engine/kernels/elementwise_ext.h"
#include "engine/ops/op_family_row.h"

/* --- shared: broadcast shapes, rule, local layout --------------------------------------- */

static ms_status bcast_shape(const char *name, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    int nd = 0;
    for (int i = 0; i < n_in; i++) nd = in[i].ndim > nd ? in[i].ndim : nd;
    out->ndim = nd;
    for (int d = 0; d < nd; d++) {
        int64_t size = 1;
        for (int i = 0; i < n_in; i++) {
            int di = d - (nd - in[i].ndim);
            if (di < 0 || in[i].d[di] == 1) continue;
            if (size != 1 && in[i].d[di] != size) {
                char buf[200];
                return ms_fail(err, MS_ERR_INVALID,
                               "%s: shapes %s do not broadcast (dim %d from the right: %lld vs "
                               "%lld); each dim must match or be 1",
                               name, ms_op_shapes_str(n_in, in, buf, sizeof buf), nd - d,
                               (long long)size, (long long)in[i].d[di]);
            }
            size = in[i].d[di];
        }
        out->d[d] = size;
    }
    return MS_OK;
}

/* R..R->R, then one S(d) candidate per output dim d of size > 1. */
static int bcast_rule(int n_in, const ms_shape *in, ms_rule_cand *c) {
    ms_shape out;
    ms_error err;
    if (bcast_shape("", n_in, in, &out, &err) != MS_OK) return 0;
    int k = 0;
    for (int i = 0; i < n_in; i++) c[k].in[i] = ms_R();
    c[k++].out[0] = ms_R();
    for (int d = 0; d < out.ndim; d++) {
        if (out.d[d] == 1) continue;
        for (int i = 0; i < n_in; i++) {
            int di = d - (out.ndim - in[i].ndim);
            c[k].in[i] = di >= 0 && in[i].d[di] != 1 ? ms_S(di) : ms_R();
        }
        c[k++].out[0] = ms_S(d);
    }
    return k;
}

/* Every op of both families: k is its kernel id, unused. */
#define bcast_infer(k, name, a, n_in, in, out, err)                                                \
    ((void)(k), (void)(a), bcast_shape(name, n_in, in, out, err))

/* A candidate whose inputs are P(sum) where pattern has 'P' and R elsewhere, output P(sum). */
static void partial_cand(ms_rule_cand *c, int n_in, const char *pattern) {
    for (int i = 0; i < n_in; i++) c->in[i] = pattern[i] == 'P' ? ms_Psum() : ms_R();
    c->out[0] = ms_Psum();
}

static void local_layout(const ms_op_call *c, ms_k_bcast *bc) {
    const int64_t *shapes[MS_K_BCAST_MAX_IN];
    int ndims[MS_K_BCAST_MAX_IN];
    for (int i = 0; i < c->n_in; i++) shapes[i] = c->in[i]->shape, ndims[i] = c->in[i]->ndim;
    ms_k_bcast_init(bc, c->out[0]->ndim, c->out[0]->shape, c->n_in, shapes, ndims);
}

/* --- binary ----------------------------------------------------------------------------- */

/* A constant expression: it sets the rows' grad_inputs. */
#define BINARY_COMPARES(k)                                                                         \
    ((k) == MS_K_BIN_EQ || (k) == MS_K_BIN_NE || (k) == MS_K_BIN_LT || (k) == MS_K_BIN_LE ||       \
     (k) == MS_K_BIN_GT || (k) == MS_K_BIN_GE)

#define binary_infer bcast_infer

static int binary_rule(ms_k_binary k, const ms_op_attrs *a, int n_in, const ms_shape *in, int nr,
                       ms_rule_cand *c) {
    (void)a, (void)nr;
    int n = bcast_rule(n_in, in, c);
    if (k == MS_K_BIN_ADD_BCAST || k == MS_K_BIN_SUB) partial_cand(&c[n++], 2, "PP");
    if (k == MS_K_BIN_MUL_BCAST || k == MS_K_BIN_DIV) partial_cand(&c[n++], 2, "PR");
    if (k == MS_K_BIN_MUL_BCAST) partial_cand(&c[n++], 2, "RP");
    return n;
}

static ms_status binary_forward(ms_k_binary k, ms_op_call *c, ms_error *e) {
    ms_k_bcast bc;
    local_layout(c, &bc);
    return MS_CALL_K(c->kc, binary_forward, k, F(c->out[0]), F(c->in[0]), F(c->in[1]), &bc, e);
}

static ms_status binary_backward(ms_k_binary k, ms_op_call *c, ms_error *e) {
    if (BINARY_COMPARES(k)) return MS_OK; /* no gradient */
    ms_k_bcast bc;
    local_layout(c, &bc);
    return MS_CALL_K(c->kc, binary_backward, k, F(c->din[0]), F(c->din[1]), F(c->dout[0]),
                     F(c->in[0]), F(c->in[1]), &bc, e);
}

static bool binary_runs_on(const ms_kernels *k) {
    return k->binary_forward && k->binary_backward;
}

static ms_k_cost binary_cost(ms_k_binary k, const ms_op_call *c, bool bw) {
    return ms_k_binary_cost(k, N(c->out[0]), N(c->in[0]), N(c->in[1]), bw);
}

#define BINARY_ROW(ID, op, ff, fb)                                                                 \
    MS_OP_FAMILY_ROW(binary, MS_K_BIN_##ID, MS_OP_##ID, op, 2,                                     \
                     BINARY_COMPARES(MS_K_BIN_##ID) ? 0 : 3)
MS_K_BINARY_OPS(BINARY_ROW)

/* --- ternary: lerp (a, b, w) and where (cond, a, b) ------------------------------------- */

typedef ms_k_ternary ternary_kind;
#define TERNARY_LERP  MS_K_TER_LERP
#define TERNARY_WHERE MS_K_TER_WHERE

#define ternary_infer bcast_infer

static int ternary_rule(ternary_kind k, const ms_op_attrs *a, int n_in, const ms_shape *in, int nr,
                        ms_rule_cand *c) {
    (void)a, (void)nr;
    int n = bcast_rule(n_in, in, c);
    /* lerp = (1 - w) a + w b; where picks partials elementwise */
    partial_cand(&c[n++], 3, k == TERNARY_LERP ? "PPR" : "RPP");
    return n;
}

static ms_status ternary_forward(ternary_kind k, ms_op_call *c, ms_error *e) {
    ms_k_bcast bc;
    local_layout(c, &bc);
    return MS_CALL_K(c->kc, ternary_forward, k, F(c->out[0]), F(c->in[0]), F(c->in[1]), F(c->in[2]),
                     &bc, e);
}

static ms_status ternary_backward(ternary_kind k, ms_op_call *c, ms_error *e) {
    ms_k_bcast bc;
    local_layout(c, &bc);
    float *dx = k == TERNARY_LERP ? F(c->din[0]) : NULL; /* where's cond takes no gradient */
    return MS_CALL_K(c->kc, ternary_backward, k, dx, F(c->din[1]), F(c->din[2]), F(c->dout[0]),
                     F(c->in[0]), F(c->in[1]), F(c->in[2]), &bc, e);
}

static bool ternary_runs_on(const ms_kernels *k) {
    return k->ternary_forward && k->ternary_backward;
}

/* lerp: sub, mul, add forward; three products and (1 - w) backward. where: selects. */
static ms_k_cost ternary_cost(ternary_kind k, const ms_op_call *c, bool bw) {
    const int64_t n_in[3] = {N(c->in[0]), N(c->in[1]), N(c->in[2])};
    bool lerp = k == TERNARY_LERP;
    return ms_k_ternary_cost(lerp ? 3 : 0, lerp ? 6 : 0, N(c->out[0]), n_in, bw);
}

MS_OP_FAMILY_ROW(ternary, TERNARY_LERP, MS_OP_LERP, lerp, 3, 7)
MS_OP_FAMILY_ROW(ternary, TERNARY_WHERE, MS_OP_WHERE, where, 3, 6) /* cond: a 0/1 mask */

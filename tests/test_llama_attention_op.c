/* test_llama_attention_op.c - a fused attention registered from outside the engine and used in
 * LLaMA through the config's "attention_op", trained against the built-in attention.
 *
 * fused_gqa is what a FlashAttention kernel would register (docs/user-ops.md): causal grouped-
 * query attention, q [B, T, H, D] with k, v [B, T, Hkv, D], i[0] causal, with its own SPMD rule
 * and kernels written here from the definition, not the engine's. The rule is GQA-aware: heads
 * split with the kv heads when both divide the mesh dim, the query heads alone with every kv
 * head replicated (fewer kv heads than tensor-parallel ranks), queries along the sequence with
 * the keys whole (context parallelism), or the batch. The kernels find their heads and
 * positions from the global shapes and box starts the engine passes.
 *
 * Training runs compare the model with fused_gqa under tp2, cp2 and one kv head over tp2
 * against the built-in model on one rank: every step's loss, the validation loss and every
 * final parameter within 1e-5 (tests/equiv.h). Test names end in _wN, the world size.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/gpt.h"
#include "tests/equiv.h"
#include "tests/testkit.h"

/* --- the operator ------------------------------------------------------------------------- */

static ms_status fused_infer(const ms_op_attrs *a, int n_in, const ms_shape *in, ms_shape *out,
                             ms_error *err) {
    (void)a;
    const ms_shape *q = &in[0], *k = &in[1], *v = &in[2];
    bool ok = n_in == 3 && q->ndim == 4 && k->ndim == 4 && v->ndim == 4;
    for (int d = 0; ok && d < 4; d++) ok = k->d[d] == v->d[d] && (d == 2 || k->d[d] == q->d[d]);
    if (!ok || k->d[2] < 1 || q->d[2] % k->d[2])
        return ms_fail(err, MS_ERR_INVALID,
                       "fused_gqa: q must be [B, T, H, D], k and v [B, T, Hkv, D], Hkv dividing H");
    out[0] = *q;
    return MS_OK;
}

static void cand(ms_rule_cand *c, ms_placement q, ms_placement kv, ms_placement out) {
    c->in[0] = q, c->in[1] = c->in[2] = kv, c->out[0] = out;
}

/* Along one mesh dim of n ranks, replicated first. */
static int fused_rule(const ms_op_attrs *a, int n_in, const ms_shape *in, int n, ms_rule_cand *c) {
    (void)a, (void)n_in;
    int k = 0;
    cand(&c[k++], ms_R(), ms_R(), ms_R());
    cand(&c[k++], ms_S(0), ms_S(0), ms_S(0)); /* batch */
    if (in[0].d[2] % n == 0 && in[1].d[2] % n == 0) cand(&c[k++], ms_S(2), ms_S(2), ms_S(2));
    if (in[0].d[2] % n == 0) cand(&c[k++], ms_S(2), ms_R(), ms_S(2)); /* kv heads replicated */
    cand(&c[k++], ms_S(1), ms_R(), ms_S(1)); /* queries by position, keys whole */
    return k;
}

/* Ways mesh dims split tensor dim `dim`. */
static int64_t ways(const ms_placements *pl, int dim, const int *mesh_shape) {
    int64_t w = 1;
    for (int m = 0; m < pl->n; m++)
        if (pl->p[m].kind == MS_PL_SHARD && pl->p[m].dim == dim) w *= mesh_shape[m];
    return w;
}

/* N-d: the kv heads split as the query heads or not at all, evenly. */
static bool fused_valid(const ms_op_attrs *a, int n_in, const ms_shape *in, const ms_placements *pl,
                        const int *mesh_shape) {
    (void)a, (void)n_in;
    int64_t wq = ways(&pl[0], 2, mesh_shape), wkv = ways(&pl[1], 2, mesh_shape);
    return in[0].d[2] % wq == 0 && (wkv == 1 || (wkv == wq && in[1].d[2] % wq == 0));
}

/* This rank's problem: local sizes, and where its query heads, kv heads and positions start. */
typedef struct fused_dims {
    int64_t b, tq, tk, h, hkv, d, group, h0, kv0, t0;
    bool causal;
} fused_dims;

static fused_dims dims_of(const ms_op_call *c) {
    const ms_tensor *q = c->in[0], *k = c->in[1];
    return (fused_dims){.b = q->shape[0],
                        .tq = q->shape[1],
                        .tk = k->shape[1],
                        .h = q->shape[2],
                        .hkv = k->shape[2],
                        .d = q->shape[3],
                        .group = c->gin[0].d[2] / c->gin[1].d[2],
                        .h0 = c->in_start[0][2],
                        .kv0 = c->in_start[1][2],
                        .t0 = c->in_start[0][1],
                        .causal = c->attrs->i[0] != 0};
}

static void fused_saved(const ms_op_attrs *a, const ms_op_call *c, int64_t *sizes) {
    (void)a;
    fused_dims z = dims_of(c);
    sizes[0] = z.b * z.h * z.tq * z.tk; /* the probabilities */
}

/* Row (bi, t) of head h of a [B, T, heads, D] tensor. */
static int64_t at(const fused_dims *z, int64_t t_len, int64_t heads, int64_t bi, int64_t t,
                  int64_t h) {
    return ((bi * t_len + t) * heads + h) * z->d;
}

/* Keys query i sees: all, or positions up to its own global one. */
static int64_t keys_seen(const fused_dims *z, int64_t i) {
    int64_t n = z->causal ? z->t0 + i + 1 : z->tk;
    return n < z->tk ? n : z->tk;
}

static ms_status fused_forward(ms_op_call *c, ms_error *err) {
    (void)err;
    fused_dims z = dims_of(c);
    const float *q = ms_tensor_f32(c->in[0]), *k = ms_tensor_f32(c->in[1]),
                *v = ms_tensor_f32(c->in[2]);
    float *o = ms_tensor_f32(c->out[0]), *p = ms_tensor_f32(c->saved[0]);
    const float scale = 1.0f / sqrtf((float)z.d);
    for (int64_t bi = 0; bi < z.b; bi++)
        for (int64_t h = 0; h < z.h; h++) {
            int64_t g = (z.h0 + h) / z.group - z.kv0; /* this head's kv head, locally */
            for (int64_t i = 0; i < z.tq; i++) {
                float *pr = p + ((bi * z.h + h) * z.tq + i) * z.tk, mx = -INFINITY, sum = 0;
                const float *qi = q + at(&z, z.tq, z.h, bi, i, h);
                int64_t n = keys_seen(&z, i);
                for (int64_t j = 0; j < z.tk; j++) {
                    float s = 0;
                    const float *kj = k + at(&z, z.tk, z.hkv, bi, j, g);
                    for (int64_t e = 0; e < z.d && j < n; e++) s += qi[e] * kj[e];
                    pr[j] = s * scale;
                    if (j < n && pr[j] > mx) mx = pr[j];
                }
                for (int64_t j = 0; j < z.tk; j++) sum += pr[j] = j < n ? expf(pr[j] - mx) : 0;
                float *oi = o + at(&z, z.tq, z.h, bi, i, h);
                memset(oi, 0, sizeof(float) * (size_t)z.d);
                for (int64_t j = 0; j < n; j++) {
                    pr[j] /= sum;
                    const float *vj = v + at(&z, z.tk, z.hkv, bi, j, g);
                    for (int64_t e = 0; e < z.d; e++) oi[e] += pr[j] * vj[e];
                }
            }
        }
    return MS_OK;
}

/* What the tests read: backward calls, and those on a share of the query heads or positions. */
static atomic_int fused_calls, fused_shard_calls;

/* dV += P^T dO; dS = P (dO V^T - rowsum); dQ += scale dS K; dK += scale dS^T Q (accumulated). */
static ms_status fused_backward(ms_op_call *c, ms_error *err) {
    (void)err;
    fused_dims z = dims_of(c);
    const float *q = ms_tensor_f32(c->in[0]), *k = ms_tensor_f32(c->in[1]),
                *v = ms_tensor_f32(c->in[2]), *p = ms_tensor_f32(c->saved[0]),
                *dout = ms_tensor_f32(c->dout[0]);
    float *dq = c->din[0] ? ms_tensor_f32(c->din[0]) : NULL,
          *dk = c->din[1] ? ms_tensor_f32(c->din[1]) : NULL,
          *dv = c->din[2] ? ms_tensor_f32(c->din[2]) : NULL;
    const float scale = 1.0f / sqrtf((float)z.d);
    for (int64_t bi = 0; bi < z.b; bi++)
        for (int64_t h = 0; h < z.h; h++) {
            int64_t g = (z.h0 + h) / z.group - z.kv0;
            for (int64_t i = 0; i < z.tq; i++) {
                const float *pr = p + ((bi * z.h + h) * z.tq + i) * z.tk;
                const float *doi = dout + at(&z, z.tq, z.h, bi, i, h);
                const float *qi = q + at(&z, z.tq, z.h, bi, i, h);
                int64_t n = keys_seen(&z, i);
                float dot = 0;
                for (int64_t j = 0; j < n; j++) {
                    const float *vj = v + at(&z, z.tk, z.hkv, bi, j, g);
                    float dp = 0;
                    for (int64_t e = 0; e < z.d; e++) dp += doi[e] * vj[e];
                    dot += pr[j] * dp;
                }
                for (int64_t j = 0; j < n; j++) {
                    int64_t kj = at(&z, z.tk, z.hkv, bi, j, g);
                    float dp = 0;
                    for (int64_t e = 0; e < z.d; e++) dp += doi[e] * v[kj + e];
                    float ds = pr[j] * (dp - dot) * scale;
                    for (int64_t e = 0; e < z.d; e++) {
                        if (dv) dv[kj + e] += pr[j] * doi[e];
                        if (dk) dk[kj + e] += ds * qi[e];
                        if (dq) dq[at(&z, z.tq, z.h, bi, i, h) + e] += ds * k[kj + e];
                    }
                }
            }
        }
    atomic_fetch_add(&fused_calls, 1);
    if (z.h < c->gin[0].d[2] || z.tq < c->gin[0].d[1]) atomic_fetch_add(&fused_shard_calls, 1);
    return MS_OK;
}

static const ms_op_def fused_gqa_def = {
    .name = "fused_gqa",
    .n_in = 3,
    .n_out = 1,
    .infer = fused_infer,
    .rule = fused_rule,
    .valid = fused_valid,
    .saved_floats = fused_saved,
    .forward = fused_forward,
    .backward = fused_backward,
    .grad_inputs = 7,
};

/* --- the tests ---------------------------------------------------------------------------- */

static ms_model_config config(int kv_heads, const char *attention_op) {
    char json[640];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": %d, \"hidden_size\": 32, \"intermediate_size\": 48, "
             "\"vocab_size\": 256, \"max_position_embeddings\": 16%s%s%s}",
             kv_heads, attention_op ? ", \"attention_op\": \"" : "",
             attention_op ? attention_op : "", attention_op ? "\"" : "");
    ms_model_config c;
    ms_error err = {0};
    if (ms_config_from_string(json, strlen(json), "llama.json", &c, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return c;
}

/* The user op's run against the built-in model on one rank; split: whether its backward must
 * have run on a share of the query heads (tp) or positions (cp). */
static void check(int kv_heads, const char *strategy, int world, bool split) {
    ms_model_config builtin = config(kv_heads, NULL), fused = config(kv_heads, "fused_gqa");
    atomic_store(&fused_calls, 0);
    atomic_store(&fused_shard_calls, 0);
    mt_equiv_check_against(&builtin, &fused, strategy, world);
    if (world > 1 && mt_mpi_world() == 0) { /* the counters are this process's */
        assert_true(atomic_load(&fused_calls) > 0);
        assert_int_equal(atomic_load(&fused_shard_calls) > 0, split);
    }
}

static void one_rank_w1(void **state) {
    (void)state;
    check(2, "{\"dp\": 1}", 1, false);
}
static void tp2_w2(void **state) {
    (void)state;
    check(2, "{\"tp\": 2}", 2, true);
}
static void tp2_one_kv_head_w2(void **state) {
    (void)state;
    check(1, "{\"tp\": 2}", 2, true);
}
static void cp2_w2(void **state) {
    (void)state;
    check(2, "{\"cp\": 2}", 2, true);
}

/* Bad input: an unregistered name and an op of the wrong arity fail the build by name. */
static void unknown_op_w1(void **state) {
    (void)state;
    ms_model_config c = config(2, "no_such_attention");
    ms_model m;
    ms_error err = {0};
    assert_int_equal(ms_model_build(&c, 2, 8, &m, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "\"no_such_attention\" is not a registered operator"));
    c = config(2, "gelu");
    assert_int_equal(ms_model_build(&c, 2, 8, &m, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "must take q, k and v"));
    const char *bad = "{\"model_type\": \"llama\", \"num_hidden_layers\": 1, "
                      "\"num_attention_heads\": 2, \"hidden_size\": 8, \"intermediate_size\": 8, "
                      "\"vocab_size\": 16, \"max_position_embeddings\": 8, \"attention_op\": 3}";
    ms_model_config c2;
    assert_int_equal(ms_config_from_string(bad, strlen(bad), "x.json", &c2, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "$.attention_op"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(one_rank_w1),        cmocka_unit_test(unknown_op_w1), cmocka_unit_test(tp2_w2),
    cmocka_unit_test(tp2_one_kv_head_w2), cmocka_unit_test(cp2_w2),
};
/* The op is registered once, before any rank starts (ms_op_register is not thread-safe). */
int main(int argc, char **argv) {
    ms_error err = {0};
    int id;
    if (ms_op_register(&fused_gqa_def, &id, &err) != MS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    return mt_main(argc, argv, "llama_attention_op", tests, sizeof tests / sizeof tests[0]);
}

/* op_defs.h - the built-in operator rows (private to engine/ops) and helpers shared by the
 * files that define them. */
#ifndef MS_OP_DEFS_H
#define MS_OP_DEFS_H

#include "engine/ops/op.h"

extern const ms_op_def ms_op_matmul_def, ms_op_add_def, ms_op_mul_def, ms_op_scale_def,
    ms_op_bias_def, ms_op_gelu_def, ms_op_layernorm_def, ms_op_softmax_def, ms_op_attention_def,
    ms_op_embedding_def, ms_op_xent_def, ms_op_reshape_def, ms_op_transpose_def, ms_op_split_def,
    ms_op_concat_def, ms_op_sum_def, ms_op_mean_def, ms_op_dropout_def;

/* The families' rows, one extern line per operator, in their ms_op_kind order. */
// clang-format off
/* -- unary -- */
extern const ms_op_def ms_op_neg_def;
extern const ms_op_def ms_op_abs_def;
extern const ms_op_def ms_op_exp_def;
extern const ms_op_def ms_op_log_def;
extern const ms_op_def ms_op_log1p_def;
extern const ms_op_def ms_op_expm1_def;
extern const ms_op_def ms_op_sqrt_def;
extern const ms_op_def ms_op_rsqrt_def;
extern const ms_op_def ms_op_square_def;
extern const ms_op_def ms_op_reciprocal_def;
extern const ms_op_def ms_op_sin_def;
extern const ms_op_def ms_op_cos_def;
extern const ms_op_def ms_op_tanh_def;
extern const ms_op_def ms_op_sigmoid_def;
extern const ms_op_def ms_op_relu_def;
extern const ms_op_def ms_op_leaky_relu_def;
extern const ms_op_def ms_op_elu_def;
extern const ms_op_def ms_op_silu_def;
extern const ms_op_def ms_op_gelu_erf_def;
extern const ms_op_def ms_op_softplus_def;
extern const ms_op_def ms_op_mish_def;
extern const ms_op_def ms_op_hardswish_def;
extern const ms_op_def ms_op_hardsigmoid_def;
extern const ms_op_def ms_op_clamp_def;
extern const ms_op_def ms_op_pow_scalar_def;
extern const ms_op_def ms_op_sign_def;
extern const ms_op_def ms_op_selu_def;
extern const ms_op_def ms_op_softsign_def;
extern const ms_op_def ms_op_logsigmoid_def;
extern const ms_op_def ms_op_erf_def;
extern const ms_op_def ms_op_atan_def;
extern const ms_op_def ms_op_add_scalar_def;
/* -- end unary -- */

/* -- binary -- */
extern const ms_op_def ms_op_add_bcast_def;
extern const ms_op_def ms_op_sub_def;
extern const ms_op_def ms_op_mul_bcast_def;
extern const ms_op_def ms_op_div_def;
extern const ms_op_def ms_op_maximum_def;
extern const ms_op_def ms_op_minimum_def;
extern const ms_op_def ms_op_pow_def;
extern const ms_op_def ms_op_atan2_def;
extern const ms_op_def ms_op_hypot_def;
extern const ms_op_def ms_op_squared_difference_def;
extern const ms_op_def ms_op_add_relu_def;
extern const ms_op_def ms_op_eq_def;
extern const ms_op_def ms_op_ne_def;
extern const ms_op_def ms_op_lt_def;
extern const ms_op_def ms_op_le_def;
extern const ms_op_def ms_op_gt_def;
extern const ms_op_def ms_op_ge_def;
extern const ms_op_def ms_op_lerp_def;
extern const ms_op_def ms_op_where_def;
/* -- end binary -- */

/* -- reduce -- */
extern const ms_op_def ms_op_sum_dims_def, ms_op_mean_dims_def, ms_op_max_dims_def, ms_op_min_dims_def,
    ms_op_prod_def, ms_op_var_def, ms_op_std_def, ms_op_logsumexp_def, ms_op_norm_def,
    ms_op_argmax_def, ms_op_argmin_def, ms_op_count_nonzero_def;
/* -- end reduce -- */

/* -- index -- */
extern const ms_op_def ms_op_permute_def, ms_op_slice_def, ms_op_narrow_def,
    ms_op_index_select_def, ms_op_gather_def, ms_op_scatter_add_def, ms_op_cumsum_def,
    ms_op_cumprod_def, ms_op_flip_def, ms_op_roll_def, ms_op_repeat_def, ms_op_expand_def,
    ms_op_squeeze_def, ms_op_unsqueeze_def, ms_op_pad_def, ms_op_tril_def, ms_op_triu_def,
    ms_op_stack_def, ms_op_masked_fill_def, ms_op_one_hot_def, ms_op_topk_def, ms_op_sort_def,
    ms_op_batch_gather_def;
/* -- end index -- */

/* -- layers -- */
extern const ms_op_def ms_op_rmsnorm_def;
extern const ms_op_def ms_op_layernorm_plain_def;
extern const ms_op_def ms_op_log_softmax_def;
extern const ms_op_def ms_op_masked_softmax_def;
extern const ms_op_def ms_op_swiglu_def;
extern const ms_op_def ms_op_rotary_def;
extern const ms_op_def ms_op_gqa_attention_def;
extern const ms_op_def ms_op_padded_attention_def;
extern const ms_op_def ms_op_linear_def;
extern const ms_op_def ms_op_bmm_def;
extern const ms_op_def ms_op_nll_loss_def;
extern const ms_op_def ms_op_mse_loss_def;
extern const ms_op_def ms_op_l1_loss_def;
extern const ms_op_def ms_op_huber_loss_def;
extern const ms_op_def ms_op_xent_smooth_def;
extern const ms_op_def ms_op_cosine_similarity_def;
/* -- end layers -- */

/* -- fused -- */
extern const ms_op_def ms_op_bias_gelu_def;
extern const ms_op_def ms_op_bias_dropout_add_def;
/* -- end fused -- */

/* -- conv -- */
extern const ms_op_def ms_op_conv1d_def;
extern const ms_op_def ms_op_conv2d_def;
/* -- end conv -- */

/* -- pool -- */
extern const ms_op_def ms_op_max_pool1d_def;
extern const ms_op_def ms_op_max_pool2d_def;
extern const ms_op_def ms_op_avg_pool1d_def;
extern const ms_op_def ms_op_avg_pool2d_def;
extern const ms_op_def ms_op_global_avg_pool_def;
extern const ms_op_def ms_op_group_norm_def;
extern const ms_op_def ms_op_resize_def;
extern const ms_op_def ms_op_train_select_def;
/* -- end pool -- */
// clang-format on

static inline int64_t shape_numel(const ms_shape *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

static inline float *F(const ms_tensor *t) {
    return t ? ms_tensor_f32(t) : NULL;
}
/* A bf16 operand's bits. bf16 operands reach an op only when the rank's table has the op's
 * bf16 kernels (ms_op_def.runs_bf16_on); otherwise the program stages them through fp32. */
static inline uint16_t *U16(const ms_tensor *t) {
    return t ? (uint16_t *)ms_tensor_data(t) : NULL;
}
/* Whether the program handed the call its bf16 buffers as they are. */
static inline bool bf16_call(const ms_op_call *c) {
    return c->in[0]->dtype == MS_BF16;
}
/* One call of the product's backward kernel: dA into da and dB into db (tensors, or NULL),
 * added to what they hold (acc) or written whole. */
static inline ms_status matmul_grads_call(ms_op_call *c, const ms_k_gemm *g, ms_tensor *da,
                                          ms_tensor *db, bool acc, ms_error *err) {
    if (bf16_call(c))
        return MS_CALL_K(c->kc, matmul_backward_bf16, g, U16(da), U16(db), U16(c->dout[0]),
                         U16(c->in[0]), U16(c->in[1]), 1.0f, acc, err);
    return MS_CALL_K(c->kc, matmul_backward, g, F(da), F(db), F(c->dout[0]), F(c->in[0]),
                     F(c->in[1]), 1.0f, acc, err);
}

/* A product's gradients into din[0] (dA) and din[1] (dB), either NULL when not wanted: each
 * added to what it holds, or written whole where the call's din_fresh says it holds nothing
 * yet; one kernel call when the two are alike, else one each. */
static inline ms_status matmul_grads(ms_op_call *c, const ms_k_gemm *g, ms_error *err) {
    ms_tensor *da = c->din[0], *db = c->din[1];
    const bool fa = c->din_fresh & 1u, fb = (c->din_fresh >> 1) & 1u;
    if (g->k <= 0 || g->batch <= 0) { /* no product: a fresh gradient is zeros (bits 0) */
        ms_tensor *fresh[2] = {fa ? da : NULL, fb ? db : NULL};
        for (int i = 0; i < 2; i++)
            if (fresh[i])
                MS_CHECK(MS_CALL_K(
                    c->kc, fill, ms_tensor_data(fresh[i]), 0.0f,
                    (ms_tensor_numel(fresh[i]) * (int64_t)ms_dtype_size(fresh[i]->dtype) + 3) / 4,
                    err));
        return MS_OK;
    }
    if (!da || !db || fa == fb) return matmul_grads_call(c, g, da, db, da ? !fa : !fb, err);
    MS_CHECK(matmul_grads_call(c, g, da, NULL, !fa, err));
    return matmul_grads_call(c, g, NULL, db, !fb, err);
}

static inline int64_t N(const ms_tensor *t) {
    return ms_tensor_numel(t);
}
static inline int64_t last_dim(const ms_tensor *t) {
    return t->ndim ? t->shape[t->ndim - 1] : 1;
}

/* Candidate builders. */
static inline void cand1(ms_rule_cand *c, ms_placement in0, ms_placement out0) {
    c->in[0] = in0;
    c->out[0] = out0;
}
static inline void cand2(ms_rule_cand *c, ms_placement in0, ms_placement in1, ms_placement out0) {
    c->in[0] = in0;
    c->in[1] = in1;
    c->out[0] = out0;
}

/* How many ways N-d placements split tensor dim `dim`: the product of the sizes of the mesh
 * dims that shard it (for `valid`: heads or groups that must stay whole). */
static inline int64_t ms_op_shard_ways(const ms_placements *pl, int dim, const int *mesh_shape) {
    int64_t ways = 1;
    for (int m = 0; m < pl->n; m++)
        if (pl->p[m].kind == MS_PL_SHARD && pl->p[m].dim == dim) ways *= mesh_shape[m];
    return ways;
}

/* "op: shapes [2, 3] and [4]" style description of input shapes, for errors. */
const char *ms_op_shapes_str(int n, const ms_shape *s, char *buf, size_t len);

/* Integer-valued float ids -> int32 (ids and targets are stored as exact floats). */
void ms_op_ids_from_floats(int32_t *out, const float *in, int64_t n);

#endif

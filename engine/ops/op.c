/* op.c - the operator table, user-op registration and backward duality. */
#include "engine/ops/op.h"

#include <stdio.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/ops/op_defs.h"

/* Positional, so adding an ms_op_kind without its row fails the static assert below. */
// clang-format off
static const ms_op_def *const builtin_ops[] = {
    &ms_op_matmul_def,    &ms_op_add_def,       &ms_op_mul_def,       &ms_op_scale_def,
    &ms_op_bias_def,      &ms_op_gelu_def,      &ms_op_layernorm_def, &ms_op_softmax_def,
    &ms_op_attention_def, &ms_op_embedding_def, &ms_op_xent_def,      &ms_op_reshape_def,
    &ms_op_transpose_def, &ms_op_split_def,     &ms_op_concat_def,    &ms_op_sum_def,
    &ms_op_mean_def,      &ms_op_dropout_def,
    /* -- unary -- */
    &ms_op_neg_def,
    &ms_op_abs_def,
    &ms_op_exp_def,
    &ms_op_log_def,
    &ms_op_log1p_def,
    &ms_op_expm1_def,
    &ms_op_sqrt_def,
    &ms_op_rsqrt_def,
    &ms_op_square_def,
    &ms_op_reciprocal_def,
    &ms_op_sin_def,
    &ms_op_cos_def,
    &ms_op_tanh_def,
    &ms_op_sigmoid_def,
    &ms_op_relu_def,
    &ms_op_leaky_relu_def,
    &ms_op_elu_def,
    &ms_op_silu_def,
    &ms_op_gelu_erf_def,
    &ms_op_softplus_def,
    &ms_op_mish_def,
    &ms_op_hardswish_def,
    &ms_op_hardsigmoid_def,
    &ms_op_clamp_def,
    &ms_op_pow_scalar_def,
    &ms_op_sign_def,
    &ms_op_selu_def,
    &ms_op_softsign_def,
    &ms_op_logsigmoid_def,
    &ms_op_erf_def,
    &ms_op_atan_def,
    &ms_op_add_scalar_def,
    /* -- end unary -- */

    /* -- binary -- */
    &ms_op_add_bcast_def,
    &ms_op_sub_def,
    &ms_op_mul_bcast_def,
    &ms_op_div_def,
    &ms_op_maximum_def,
    &ms_op_minimum_def,
    &ms_op_pow_def,
    &ms_op_atan2_def,
    &ms_op_hypot_def,
    &ms_op_squared_difference_def,
    &ms_op_add_relu_def,
    &ms_op_eq_def,
    &ms_op_ne_def,
    &ms_op_lt_def,
    &ms_op_le_def,
    &ms_op_gt_def,
    &ms_op_ge_def,
    &ms_op_lerp_def,
    &ms_op_where_def,
    /* -- end binary -- */

    /* -- reduce -- */
    &ms_op_sum_dims_def,  &ms_op_mean_dims_def, &ms_op_max_dims_def,  &ms_op_min_dims_def,
    &ms_op_prod_def,      &ms_op_var_def,       &ms_op_std_def,       &ms_op_logsumexp_def,
    &ms_op_norm_def,      &ms_op_argmax_def,    &ms_op_argmin_def,    &ms_op_count_nonzero_def,
    /* -- end reduce -- */

    /* -- index -- */
    &ms_op_permute_def, &ms_op_slice_def, &ms_op_narrow_def,
    &ms_op_index_select_def, &ms_op_gather_def, &ms_op_scatter_add_def,
    &ms_op_cumsum_def, &ms_op_cumprod_def, &ms_op_flip_def,
    &ms_op_roll_def, &ms_op_repeat_def, &ms_op_expand_def,
    &ms_op_squeeze_def, &ms_op_unsqueeze_def, &ms_op_pad_def,
    &ms_op_tril_def, &ms_op_triu_def, &ms_op_stack_def,
    &ms_op_masked_fill_def, &ms_op_one_hot_def, &ms_op_topk_def,
    &ms_op_sort_def, &ms_op_batch_gather_def,
    /* -- end index -- */

    /* -- layers -- */
    &ms_op_rmsnorm_def,
    &ms_op_layernorm_plain_def,
    &ms_op_log_softmax_def,
    &ms_op_masked_softmax_def,
    &ms_op_swiglu_def,
    &ms_op_rotary_def,
    &ms_op_gqa_attention_def,
    &ms_op_padded_attention_def,
    &ms_op_linear_def,
    &ms_op_bmm_def,
    &ms_op_nll_loss_def,
    &ms_op_mse_loss_def,
    &ms_op_l1_loss_def,
    &ms_op_huber_loss_def,
    &ms_op_xent_smooth_def,
    &ms_op_cosine_similarity_def,
    /* -- end layers -- */

    /* -- fused -- */
    &ms_op_bias_gelu_def,
    &ms_op_bias_dropout_add_def,
    /* -- end fused -- */

    /* -- conv -- */
    &ms_op_conv1d_def,
    &ms_op_conv2d_def,
    /* -- end conv -- */

    /* -- pool -- */
    &ms_op_max_pool1d_def,
    &ms_op_max_pool2d_def,
    &ms_op_avg_pool1d_def,
    &ms_op_avg_pool2d_def,
    &ms_op_global_avg_pool_def,
    &ms_op_group_norm_def,
    &ms_op_resize_def,
    &ms_op_train_select_def,
    /* -- end pool -- */
};
// clang-format on
_Static_assert(sizeof builtin_ops / sizeof builtin_ops[0] == MS_OP_BUILTIN_COUNT,
               "every ms_op_kind needs a row in builtin_ops");

#define MS_OP_MAX_USER 64
static ms_op_def user_ops[MS_OP_MAX_USER];
static int n_user_ops;

const ms_op_def *ms_op_get(int op) {
    if (op >= 0 && op < MS_OP_BUILTIN_COUNT) return builtin_ops[op];
    op -= MS_OP_BUILTIN_COUNT;
    return op >= 0 && op < n_user_ops ? &user_ops[op] : NULL;
}

int ms_op_count(void) {
    return MS_OP_BUILTIN_COUNT + n_user_ops;
}

int ms_op_find(const char *name) {
    for (int i = 0; i < ms_op_count(); i++)
        if (!strcmp(ms_op_get(i)->name, name)) return i;
    return -1;
}

static ms_status check_def(const ms_op_def *d, ms_error *err) {
    const char *missing = !d->name       ? "name"
                          : !d->infer    ? "infer"
                          : !d->rule     ? "rule"
                          : !d->forward  ? "forward"
                          : !d->backward ? "backward"
                          : d->n_out == 0 || d->n_out > MS_OP_MAX_OUT || d->n_out < -MS_OP_MAX_OUT
                              ? "n_out (1..4, or -k for variadic)"
                          : d->n_in == 0 || d->n_in > MS_OP_MAX_IN || d->n_in < -MS_OP_MAX_IN
                              ? "n_in (1..4, or -k for variadic)"
                              : NULL;
    if (missing)
        return ms_fail(err, MS_ERR_INVALID, "operator '%s' has no valid %s",
                       d->name ? d->name : "(unnamed)", missing);
    return MS_OK;
}

ms_status ms_op_register(const ms_op_def *def, int *id, ms_error *err) {
    MS_CHECK(check_def(def, err));
    if (ms_op_find(def->name) >= 0)
        return ms_fail(err, MS_ERR_INVALID, "an operator named '%s' is already registered",
                       def->name);
    if (n_user_ops == MS_OP_MAX_USER)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "at most %d user operators", MS_OP_MAX_USER);
    user_ops[n_user_ops] = *def;
    user_ops[n_user_ops].kind = MS_OP_BUILTIN_COUNT + n_user_ops;
    *id = MS_OP_BUILTIN_COUNT + n_user_ops++;
    return MS_OK;
}

ms_status ms_ops_check(ms_error *err) {
    for (int i = 0; i < MS_OP_BUILTIN_COUNT; i++) {
        MS_CHECK(check_def(builtin_ops[i], err));
        if (builtin_ops[i]->kind != i)
            return ms_fail(err, MS_ERR_INTERNAL, "builtin_ops[%d] is '%s', whose kind is %d", i,
                           builtin_ops[i]->name, builtin_ops[i]->kind);
    }
    return MS_OK;
}

ms_placement ms_rule_dual_out(ms_placement out) {
    /* The gradient of a partial value is the full gradient on every rank. */
    return out.kind == MS_PL_PARTIAL ? ms_R() : out;
}

ms_placement ms_rule_dual_in(const ms_rule_cand *c, int n_in, int n_out, int i) {
    ms_placement p = c->in[i];
    if (p.kind == MS_PL_PARTIAL) return ms_R();
    if (p.kind == MS_PL_SHARD) return p;
    /* A replicated input of a candidate that splits work along this mesh dim receives a
     * partial gradient on each rank; of a fully replicated candidate, the full one. */
    bool all_r = true;
    for (int k = 0; k < n_in; k++) all_r &= c->in[k].kind == MS_PL_REPLICATE;
    for (int k = 0; k < n_out; k++) all_r &= c->out[k].kind == MS_PL_REPLICATE;
    return all_r ? ms_R() : ms_Psum();
}

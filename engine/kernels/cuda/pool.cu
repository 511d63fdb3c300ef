/* pool.cu - pooling, group normalisation and resizing around pool_math.cuh: pooling and
 * resizing one thread per output element (forward) or input element (backward, a gather);
 * GroupNorm's statistics one block per (sample, group) row, its backward one block per
 * (sample, channel) row for the channel sums, then one thread per row, element or channel.
 * The geometries are captured by value. */
#include "engine/kernels/cuda/launch.cuh"
#include "engine/kernels/cuda/pool_math.cuh"

ms_status ms_cu_pool_forward(ms_kctx *kc, const ms_k_pool *g, float *out, int32_t *idx,
                             const float *inp, ms_error *err) {
    const ms_k_pool p = *g;
    return ms_cu_each(p.planes * p.oh * p.ow, kc, "pool forward", err,
                      [=] __device__(int64_t o) { ms_cu_pool_fwd(&p, out, idx, inp, o); });
}

ms_status ms_cu_pool_backward(ms_kctx *kc, const ms_k_pool *g, float *dinp, const float *dout,
                              const int32_t *idx, ms_error *err) {
    const ms_k_pool p = *g;
    if (!dinp) return MS_OK;
    return ms_cu_each(p.planes * p.h * p.w, kc, "pool backward", err,
                      [=] __device__(int64_t i) { ms_cu_pool_bwd(&p, dinp, dout, idx, i); });
}

ms_status ms_cu_group_norm_forward(ms_kctx *kc, const ms_k_gnorm *g, float *out, float *mean,
                                   float *rstd, const float *inp, const float *weight,
                                   const float *bias, ms_error *err) {
    if (g->groups <= 0) return MS_OK;
    const int64_t cpg = g->c / g->groups, len = cpg * g->s, groups = g->groups, s = g->s;
    const float eps = g->eps;
    return ms_cu_rows(
        g->n * groups, kc, "group_norm forward", err, [=] __device__(int64_t r, int lane) {
            const float *x = inp + r * len;
            const int64_t c0 = r % groups * cpg;
            const float m =
                ms_cu_block_sum(ms_cu_row_sum_part(x, len, lane, MS_CU_ROW_LANES)) / (float)len;
            const float sq = ms_cu_block_sum(ms_cu_ln_sqdev_part(x, len, m, lane, MS_CU_ROW_LANES));
            const float rs = ms_cu_ln_rstd(sq, len, eps);
            ms_cu_gn_out_part(out + r * len, x, weight + c0, bias + c0, len, s, m, rs, lane,
                              MS_CU_ROW_LANES);
            if (lane == 0) mean[r] = m, rstd[r] = rs;
        });
}

/* scratch: sd, sdx [N, C] (the channel sums), then ga, gb [N, G] (the group means). */
ms_status ms_cu_group_norm_backward(ms_kctx *kc, const ms_k_gnorm *g, float *dinp, float *dweight,
                                    float *dbias, float *scratch, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, ms_error *err) {
    if (g->groups <= 0 || g->n <= 0) return MS_OK;
    const ms_k_gnorm p = *g;
    const int64_t nc = p.n * p.c, rows = p.n * p.groups, cpg = p.c / p.groups;
    float *sd = scratch, *sdx = scratch + nc, *ga = scratch + 2 * nc, *gb = ga + rows;
    MS_CHECK(ms_cu_rows(nc, kc, "group_norm backward (channel sums)", err,
                        [=] __device__(int64_t q, int lane) {
                            const int64_t r = q / p.c * p.groups + q % p.c / cpg;
                            float a, b;
                            ms_cu_gn_chan_part(&a, &b, dout + q * p.s, inp + q * p.s, p.s, mean[r],
                                               rstd[r], lane, MS_CU_ROW_LANES);
                            a = ms_cu_block_sum(a);
                            b = ms_cu_block_sum(b);
                            if (lane == 0) sd[q] = a, sdx[q] = b;
                        }));
    if (dinp) {
        MS_CHECK(ms_cu_each(
            rows, kc, "group_norm backward (group sums)", err,
            [=] __device__(int64_t r) { ms_cu_gn_group_sums(ga, gb, sd, sdx, weight, &p, r); }));
        MS_CHECK(ms_cu_each(nc * p.s, kc, "group_norm backward", err, [=] __device__(int64_t e) {
            ms_cu_gn_dinp(dinp, dout, inp, weight, mean, rstd, ga, gb, &p, e);
        }));
    }
    if (!dweight && !dbias) return MS_OK;
    return ms_cu_each(
        p.c, kc, "group_norm backward (weight, bias)", err,
        [=] __device__(int64_t c) { ms_cu_gn_dparams(dweight, dbias, sd, sdx, &p, c); });
}

ms_status ms_cu_resize_forward(ms_kctx *kc, const ms_k_resize *g, float *out, const float *inp,
                               ms_error *err) {
    const ms_k_resize p = *g;
    return ms_cu_each(p.planes * p.oh * p.ow, kc, "resize forward", err,
                      [=] __device__(int64_t o) { ms_cu_resize_fwd(&p, out, inp, o); });
}

ms_status ms_cu_resize_backward(ms_kctx *kc, const ms_k_resize *g, float *dinp, const float *dout,
                                ms_error *err) {
    const ms_k_resize p = *g;
    if (!dinp) return MS_OK;
    return ms_cu_each(p.planes * p.h * p.w, kc, "resize backward", err,
                      [=] __device__(int64_t i) { ms_cu_resize_bwd(&p, dinp, dout, i); });
}

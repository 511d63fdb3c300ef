/* llama.cu - RMSNorm, SwiGLU and rotary embedding around llama_math.cuh: RMSNorm one block per
 * row (the lanes combined by the block's tree, launch.cuh), its dweight the two passes of
 * colsum_math.cuh; SwiGLU one thread per element; rotary one thread per table entry or per
 * rotated pair. */
#include "engine/kernels/cuda/launch.cuh"
#include "engine/kernels/cuda/llama_math.cuh"

ms_status ms_cu_rmsnorm_forward(ms_kctx *kc, float *out, float *rstd, const float *inp,
                                const float *weight, int64_t n, int64_t c, float eps,
                                ms_error *err) {
    return ms_cu_rows(n, kc, "rmsnorm forward", err, [=] __device__(int64_t r, int lane) {
        const float *x = inp + r * c;
        const float ss = ms_cu_block_sum(ms_cu_rms_sumsq_part(x, c, lane, MS_CU_ROW_LANES));
        const float s = ms_cu_ln_rstd(ss, c, eps);
        ms_cu_rms_out_part(out + r * c, x, weight, c, s, lane, MS_CU_ROW_LANES);
        if (lane == 0) rstd[r] = s;
    });
}

ms_status ms_cu_rmsnorm_backward(ms_kctx *kc, float *dinp, float *dweight, float *scratch,
                                 const float *dout, const float *inp, const float *weight,
                                 const float *rstd, int64_t n, int64_t c, ms_error *err) {
    if (dweight && n > 0 && c > 0) {
        const char *what = "rmsnorm backward (dweight)";
        MS_CHECK(ms_cu_colsum_scratch(scratch, what, err));
        MS_CHECK(ms_cu_chunks(n, c, kc, what, err, [=] __device__(int64_t b, int64_t j) {
            ms_cu_rms_dweight_part(scratch, dout, inp, rstd, n, c, b, j);
        }));
        const int64_t chunks = ms_cu_colsum_chunks(n);
        MS_CHECK(ms_cu_each(c, kc, what, err, [=] __device__(int64_t j) {
            ms_cu_colsum_finish(dweight, scratch, chunks, c, j);
        }));
    }
    if (!dinp) return MS_OK;
    return ms_cu_rows(n, kc, "rmsnorm backward", err, [=] __device__(int64_t r, int lane) {
        const float *g = dout + r * c, *x = inp + r * c;
        const float wgx =
            ms_cu_block_sum(ms_cu_rms_wgx_part(g, x, weight, c, lane, MS_CU_ROW_LANES));
        ms_cu_rms_dinp_part(dinp + r * c, g, x, weight, c, rstd[r], wgx, lane, MS_CU_ROW_LANES);
    });
}

ms_status ms_cu_swiglu_forward(ms_kctx *kc, float *out, const float *gate, const float *up,
                               int64_t n, ms_error *err) {
    return ms_cu_each(n, kc, "swiglu forward", err,
                      [=] __device__(int64_t i) { ms_cu_swiglu_fwd(out, gate, up, i); });
}

ms_status ms_cu_swiglu_backward(ms_kctx *kc, float *dgate, float *dup, const float *dout,
                                const float *gate, const float *up, int64_t n, ms_error *err) {
    if (!dgate && !dup) return MS_OK;
    return ms_cu_each(n, kc, "swiglu backward", err, [=] __device__(int64_t i) {
        ms_cu_swiglu_bwd(dgate, dup, dout, gate, up, i);
    });
}

ms_status ms_cu_rotary_tables(ms_kctx *kc, float *cosb, float *sinb, int64_t t, int64_t t0,
                              int64_t d, float theta, ms_error *err) {
    if (d % 2)
        return ms_fail(err, MS_ERR_INVALID, "cuda rotary: head size %lld is odd", (long long)d);
    return ms_cu_each(t * (d / 2), kc, "rotary tables", err, [=] __device__(int64_t e) {
        ms_cu_rotary_entry(cosb, sinb, t0, d, theta, e);
    });
}

ms_status ms_cu_rotary_apply(ms_kctx *kc, float *out, const float *inp, const float *cosb,
                             const float *sinb, int64_t b, int64_t t, int64_t h, int64_t d,
                             bool inverse, ms_error *err) {
    if (d % 2)
        return ms_fail(err, MS_ERR_INVALID, "cuda rotary: head size %lld is odd", (long long)d);
    return ms_cu_each(b * t * h * (d / 2), kc, "rotary apply", err, [=] __device__(int64_t e) {
        ms_cu_rotary_pair(out, inp, cosb, sinb, t, h, d, inverse, e);
    });
}

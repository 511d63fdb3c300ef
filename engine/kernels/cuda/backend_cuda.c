/* backend_cuda.c - the CUDA kernel table (built with CUDA only) and the kernel context's state.
 *
 * Most slots point straight at a function of engine/kernels/cuda's .cu files, declared in
 * cuda_kernels.h with the slot's signature. The adapters here are the slots that need what
 * the context keeps: device scratch grown on demand (the column reductions' chunk sums, the
 * embedding backward's sort, the sums of squares) and the lists staged through pinned host
 * memory (AdamW's parameters, the gradient norm's tensors, the masters' bf16 casts).
 *
 * Ownership: the context owns its scratch, its staged lists and its cuBLAS handle. The compute
 * stream is the device's (core/device_cuda.c), which every kernel context of the device shares
 * and the device's copies run on, so kernels and copies keep the rank's order and a device
 * mark covers them all; ms_cu_stream asks the device for it at each launch. Not verified on a
 * GPU yet: the arithmetic of each kernel is host-tested (tests/test_cuda_host.cu), the
 * launches and this table run only where a GPU exists. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/cuda_check.h"
#include "engine/core/xalloc.h"
#include "engine/kernels/backend.h"
#include "engine/kernels/cuda/cuda_kernels.h"
#include "engine/kernels/kernels.h" /* ms_k_attn_dropout */

/* Defined here, declared by backend.c (the one caller). */
const ms_kernels *ms_kernels_cuda_table(void);
ms_status ms_kctx_cuda_init(ms_kctx *kc, const ms_kctx_opts *opts, ms_error *err);
void ms_kctx_cuda_fini(ms_kctx *kc);

/* A list of items a launch reads (tensors, parameters), copied up from pinned host memory:
 * the host side is refilled only once the last copy from it has run (`copied`), so a caller
 * may queue list after list without waiting for the device. Grown on demand. */
typedef struct list_stage {
    void *host, *dev;
    size_t cap;
    cudaEvent_t copied; /* recorded after the last copy up; NULL before the first */
} list_stage;

/* A device buffer the context keeps and grows on demand (scratch_room), so a training step
 * allocates nothing once its largest call has run. */
typedef struct dev_scratch {
    void *p;
    size_t cap; /* bytes */
} dev_scratch;

/* The stream is not here: the device holds it (ms_cu_stream asks). */
typedef struct cuda_kctx {
    bool flash;                        /* the attention path, chosen at creation (flash_chosen) */
    cublasHandle_t blas;               /* NULL until the first product (ms_cu_blas) */
    dev_scratch sumsq;                 /* doubles: partial sums, then the result in the last one */
    dev_scratch emb;                   /* the embedding backward's sort */
    dev_scratch colsum;                /* floats: the column reductions' chunk sums */
    list_stage sumsq_list, adamw_list; /* the gradient norm's tensors, AdamW's parameters */
    list_stage cast_list;              /* the masters rounded into their bf16 use copies */
    dev_scratch sums;                  /* doubles: the list's sums of squares */
} cuda_kctx;

#define CU(kc) ((cuda_kctx *)(kc)->impl)

/* Whether bf16 attention calls that fit the tensor-core kernels run them: asked for (by
 * default unless MS_CUDA_ATTENTION=rows), on a device with bf16 mma.sync (compute capability
 * 8.0). Decided once, here, for the context's life. */
static bool flash_chosen(int ordinal, ms_kattention choice) {
    if (choice == MS_KATTENTION_DEFAULT) {
        const char *env = getenv("MS_CUDA_ATTENTION");
        choice = env && strcmp(env, "rows") == 0 ? MS_KATTENTION_ROWS : MS_KATTENTION_FASTEST;
    }
    int major = 0;
    return choice == MS_KATTENTION_FASTEST &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) ==
               cudaSuccess &&
           major >= 8;
}

/* Makes the device's stream now, so that ms_cu_stream has it from here on. */
ms_status ms_kctx_cuda_init(ms_kctx *kc, const ms_kctx_opts *opts, ms_error *err) {
    cuda_kctx *x = xcalloc(1, sizeof *x);
    kc->impl = x;
    x->flash = flash_chosen(kc->dev->ordinal, opts ? opts->attention : MS_KATTENTION_DEFAULT);
    void *stream = NULL;
    ms_status st = ms_device_cuda_stream(kc->dev, &stream, err);
    if (st == MS_OK) st = ms_cuda_status(cudaSetDevice(kc->dev->ordinal), "cudaSetDevice", err);
    if (st != MS_OK) ms_kctx_cuda_fini(kc);
    return st;
}

void ms_kctx_cuda_fini(ms_kctx *kc) {
    cuda_kctx *x = CU(kc);
    if (!x) return;
    if (x->blas) cublasDestroy(x->blas);
    dev_scratch *scratch[4] = {&x->sumsq, &x->emb, &x->colsum, &x->sums};
    for (int i = 0; i < 4; i++)
        if (scratch[i]->p) cudaFree(scratch[i]->p);
    list_stage *lists[3] = {&x->sumsq_list, &x->adamw_list, &x->cast_list};
    for (int i = 0; i < 3; i++) {
        if (lists[i]->host) cudaFreeHost(lists[i]->host);
        if (lists[i]->dev) cudaFree(lists[i]->dev);
        if (lists[i]->copied) cudaEventDestroy(lists[i]->copied);
    }
    free(x);
    kc->impl = NULL;
}

void *ms_cu_stream(const ms_kctx *kc) {
    void *stream = NULL;
    ms_error unused;
    (void)ms_device_cuda_stream(kc->dev, &stream, &unused); /* made: cannot fail */
    return stream;
}

bool ms_cu_attention_flash(const ms_kctx *kc) {
    return CU(kc)->flash;
}

ms_status ms_cu_blas(ms_kctx *kc, void **out, ms_error *err) {
    cuda_kctx *x = CU(kc);
    if (!x->blas) {
        const cudaError_t e = cudaSetDevice(kc->dev->ordinal);
        if (e != cudaSuccess)
            return ms_fail(err, MS_ERR_INTERNAL, "cuda context: device %d: %s", kc->dev->ordinal,
                           cudaGetErrorString(e));
        cublasStatus_t s = cublasCreate(&x->blas);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(x->blas, ms_cu_stream(kc));
        if (s != CUBLAS_STATUS_SUCCESS) {
            if (x->blas) cublasDestroy(x->blas);
            x->blas = NULL;
            return ms_fail(err, MS_ERR_INTERNAL,
                           "cuda context: creating the cuBLAS handle: cuBLAS failed: %s",
                           cublasGetStatusString(s));
        }
    }
    *out = x->blas;
    return MS_OK;
}

static ms_status c_sync(ms_kctx *kc, ms_error *err) {
    return ms_cuda_status(cudaStreamSynchronize(ms_cu_stream(kc)), "cudaStreamSynchronize", err);
}

/* Grows s to at least `bytes` (what: the cudaMalloc named in an error), after the stream
 * drains: a launch in flight may still use the old buffer. */
static ms_status scratch_room(ms_kctx *kc, dev_scratch *s, size_t bytes, const char *what,
                              ms_error *err) {
    if (bytes <= s->cap) return MS_OK;
    if (s->p) {
        MS_CHECK(c_sync(kc, err));
        cudaFree(s->p);
    }
    s->p = NULL;
    s->cap = 0;
    MS_CHECK(ms_cuda_status(cudaMalloc(&s->p, bytes), what, err));
    s->cap = bytes;
    return MS_OK;
}

/* The chunk sums of a column reduction over [n, c] with `terms` sums (cuda_kernels.h), when
 * the call wants one (else *out = NULL). */
static ms_status colsum_scratch(ms_kctx *kc, bool want, int64_t n, int64_t c, int terms,
                                float **out, ms_error *err) {
    *out = NULL;
    const int64_t need = want ? ms_cu_colsum_scratch_floats(n, c, terms) : 0;
    if (need <= 0) return MS_OK;
    dev_scratch *s = &CU(kc)->colsum;
    MS_CHECK(scratch_room(kc, s, sizeof(float) * (size_t)need, "cudaMalloc (column sums)", err));
    *out = s->p;
    return MS_OK;
}

/* The rows of bias + dropout + residual add's [numel / nb, nb] view (fused.cu's). */
static int64_t bda_rows(const ms_k_fused_dropout *d, int64_t nb) {
    int64_t n = 1;
    for (int k = 0; k < d->box.ndim; k++) n *= d->box.lshape[k];
    return n / (nb > 0 ? nb : 1);
}

/* ---- the backwards that sum over rows: their column-sum scratch ---- */
static ms_status c_bias_add_backward(ms_kctx *kc, float *dinp, float *dbias, const float *dout,
                                     int64_t n, int64_t c, unsigned fresh, ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dbias != NULL, n, c, 1, &s, err));
    return ms_cu_bias_add_backward(kc, dinp, dbias, s, dout, n, c, fresh, err);
}
static ms_status c_bias_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                          const uint16_t *dout, int64_t n, int64_t c,
                                          unsigned fresh, ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dbias != NULL, n, c, 1, &s, err));
    return ms_cu_bias_add_backward_bf16(kc, dinp, dbias, s, dout, n, c, fresh, err);
}
static ms_status c_bias_gelu_backward(ms_kctx *kc, float *dinp, float *dbias, const float *dout,
                                      const float *inp, const float *bias, int64_t n, int64_t c,
                                      unsigned fresh, ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dbias != NULL, n, c, 1, &s, err));
    return ms_cu_bias_gelu_backward(kc, dinp, dbias, s, dout, inp, bias, n, c, fresh, err);
}
static ms_status c_bias_gelu_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                           const uint16_t *dout, const uint16_t *inp,
                                           const uint16_t *bias, int64_t n, int64_t c,
                                           unsigned fresh, ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dbias != NULL, n, c, 1, &s, err));
    return ms_cu_bias_gelu_backward_bf16(kc, dinp, dbias, s, dout, inp, bias, n, c, fresh, err);
}
static ms_status c_bias_dropout_add_backward(ms_kctx *kc, float *dinp, float *dbias, float *dres,
                                             const float *dout, int64_t nb,
                                             const ms_k_fused_dropout *d, unsigned fresh,
                                             ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dbias != NULL, bda_rows(d, nb), nb > 0 ? nb : 1, 1, &s, err));
    return ms_cu_bias_dropout_add_backward(kc, dinp, dbias, dres, s, dout, nb, d, fresh, err);
}
static ms_status c_bias_dropout_add_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dbias,
                                                  uint16_t *dres, const uint16_t *dout, int64_t nb,
                                                  const ms_k_fused_dropout *d, unsigned fresh,
                                                  ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dbias != NULL, bda_rows(d, nb), nb > 0 ? nb : 1, 1, &s, err));
    return ms_cu_bias_dropout_add_backward_bf16(kc, dinp, dbias, dres, s, dout, nb, d, fresh, err);
}
static ms_status c_layernorm_backward(ms_kctx *kc, float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp, const float *weight,
                                      const float *mean, const float *rstd, int64_t n, int64_t c,
                                      ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dweight || dbias, n, c, 2, &s, err));
    return ms_cu_layernorm_backward(kc, dinp, dweight, dbias, s, dout, inp, weight, mean, rstd, n,
                                    c, err);
}
static ms_status c_layernorm_backward_bf16(ms_kctx *kc, uint16_t *dinp, uint16_t *dweight,
                                           uint16_t *dbias, const uint16_t *dout,
                                           const uint16_t *inp, const uint16_t *weight,
                                           const float *mean, const float *rstd, int64_t n,
                                           int64_t c, ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dweight || dbias, n, c, 2, &s, err));
    return ms_cu_layernorm_backward_bf16(kc, dinp, dweight, dbias, s, dout, inp, weight, mean, rstd,
                                         n, c, err);
}
/* Attention dropout (attn_pdrop) has no CUDA kernel: refused with the fix named, before any
 * launch; otherwise the kernels as they are. */
static ms_status no_attn_dropout(const ms_k_attn_dropout *drop, ms_error *err) {
    if (!drop || drop->p <= 0) return MS_OK;
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "attention dropout (attn_pdrop %g) is not implemented on CUDA; set attn_pdrop "
                   "to 0 in the model config, or train on the CPU (--device cpu)",
                   (double)drop->p);
}
static ms_status c_attention_forward(ms_kctx *kc, float *out, float *saved, float *work,
                                     const float *qkv, const float *mask, int64_t b, int64_t t,
                                     int64_t c, int64_t nh, bool causal,
                                     const ms_k_attn_dropout *drop, ms_error *err) {
    (void)work;
    MS_CHECK(no_attn_dropout(drop, err));
    return ms_cu_attention_forward(kc, out, saved, qkv, mask, b, t, c, nh, causal, err);
}
static ms_status c_attention_backward(ms_kctx *kc, float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *saved, const float *mask,
                                      int64_t b, int64_t t, int64_t c, int64_t nh, bool causal,
                                      unsigned fresh, const ms_k_attn_dropout *drop,
                                      ms_error *err) {
    MS_CHECK(no_attn_dropout(drop, err));
    return ms_cu_attention_backward(kc, dqkv, scratch, dout, qkv, saved, mask, b, t, c, nh, causal,
                                    fresh, err);
}
static ms_status c_attention_forward_bf16(ms_kctx *kc, uint16_t *out, float *saved, float *work,
                                          const uint16_t *qkv, const float *mask, int64_t b,
                                          int64_t t, int64_t c, int64_t nh, bool causal,
                                          const ms_k_attn_dropout *drop, ms_error *err) {
    (void)work;
    MS_CHECK(no_attn_dropout(drop, err));
    return ms_cu_attention_forward_bf16(kc, out, saved, qkv, mask, b, t, c, nh, causal, err);
}
static ms_status c_attention_backward_bf16(ms_kctx *kc, uint16_t *dqkv, float *scratch,
                                           const uint16_t *dout, const uint16_t *qkv,
                                           const float *saved, const float *mask, int64_t b,
                                           int64_t t, int64_t c, int64_t nh, bool causal,
                                           unsigned fresh, const ms_k_attn_dropout *drop,
                                           ms_error *err) {
    MS_CHECK(no_attn_dropout(drop, err));
    return ms_cu_attention_backward_bf16(kc, dqkv, scratch, dout, qkv, saved, mask, b, t, c, nh,
                                         causal, fresh, err);
}
static ms_status c_rmsnorm_backward(ms_kctx *kc, float *dinp, float *dweight, const float *dout,
                                    const float *inp, const float *weight, const float *rstd,
                                    int64_t n, int64_t c, ms_error *err) {
    float *s;
    MS_CHECK(colsum_scratch(kc, dweight != NULL, n, c, 1, &s, err));
    return ms_cu_rmsnorm_backward(kc, dinp, dweight, s, dout, inp, weight, rstd, n, c, err);
}

/* ---- the embedding backward: its sort scratch for n tokens over vl rows ---- */
static ms_status emb_scratch(ms_kctx *kc, int64_t n, int64_t vl, ms_error *err) {
    return scratch_room(kc, &CU(kc)->emb, ms_cu_embedding_scratch_bytes(n, vl),
                        "cudaMalloc (embedding backward)", err);
}
static ms_status c_embedding_backward(ms_kctx *kc, float *dtable, const int32_t *ids,
                                      const float *dout, int64_t n, int64_t c, int64_t v0,
                                      int64_t vl, ms_error *err) {
    MS_CHECK(emb_scratch(kc, n, vl, err));
    return ms_cu_embedding_backward(kc, dtable, ids, dout, n, c, v0, vl, CU(kc)->emb.p,
                                    CU(kc)->emb.cap, err);
}
static ms_status c_embedding_backward_bf16(ms_kctx *kc, uint16_t *dtable, const int32_t *ids,
                                           const uint16_t *dout, int64_t n, int64_t c, int64_t v0,
                                           int64_t vl, ms_error *err) {
    MS_CHECK(emb_scratch(kc, n, vl, err));
    return ms_cu_embedding_backward_bf16(kc, dtable, ids, dout, n, c, v0, vl, CU(kc)->emb.p,
                                         CU(kc)->emb.cap, err);
}

/* ---- the sums of squares: partials on the device, the result copied back ---- */

/* The sums of squares' device doubles, `need` of them at least. A single sum keeps its chunk
 * partials first and its result in the last double (sumsq_last). */
static ms_status sumsq_room(ms_kctx *kc, int64_t need, ms_error *err) {
    return scratch_room(kc, &CU(kc)->sumsq, sizeof(double) * (size_t)need,
                        "cudaMalloc (sum of squares)", err);
}
static double *sumsq_last(ms_kctx *kc) {
    const dev_scratch *s = &CU(kc)->sumsq;
    return (double *)s->p + s->cap / sizeof(double) - 1;
}
static ms_status sumsq_scratch(ms_kctx *kc, size_t n, ms_error *err) {
    return sumsq_room(kc, ms_cu_sumsq_scratch_doubles((int64_t)n) + 1, err);
}
static ms_status sumsq_result(ms_kctx *kc, double *host_out, ms_error *err) {
    MS_CHECK(ms_cuda_status(cudaMemcpyAsync(host_out, sumsq_last(kc), sizeof(double),
                                            cudaMemcpyDeviceToHost, ms_cu_stream(kc)),
                            "cudaMemcpyAsync (sum of squares)", err));
    return c_sync(kc, err);
}
static ms_status c_sumsq(ms_kctx *kc, double *host_out, const float *x, size_t n, ms_error *err) {
    MS_CHECK(sumsq_scratch(kc, n, err));
    MS_CHECK(ms_cu_sumsq(kc, sumsq_last(kc), CU(kc)->sumsq.p, x, (int64_t)n, err));
    return sumsq_result(kc, host_out, err);
}
static ms_status c_sumsq_bf16(ms_kctx *kc, double *host_out, const uint16_t *x, size_t n,
                              ms_error *err) {
    MS_CHECK(sumsq_scratch(kc, n, err));
    MS_CHECK(ms_cu_sumsq_bf16(kc, sumsq_last(kc), CU(kc)->sumsq.p, x, (int64_t)n, err));
    return sumsq_result(kc, host_out, err);
}

/* ---- lists staged through pinned host memory ---- */

/* The host side of a list, room for `bytes`, free to fill: waits for its last copy up (and,
 * to grow it, for the stream: a launch in flight may still read the device side). */
static ms_status list_fill(ms_kctx *kc, list_stage *ls, size_t bytes, ms_error *err) {
    if (ls->copied)
        MS_CHECK(ms_cuda_status(cudaEventSynchronize(ls->copied), "cudaEventSynchronize", err));
    if (bytes <= ls->cap) return MS_OK;
    MS_CHECK(c_sync(kc, err));
    if (ls->host) cudaFreeHost(ls->host);
    if (ls->dev) cudaFree(ls->dev);
    ls->host = ls->dev = NULL, ls->cap = 0;
    if (!ls->copied)
        MS_CHECK(ms_cuda_status(cudaEventCreateWithFlags(&ls->copied, cudaEventDisableTiming),
                                "cudaEventCreate (list)", err));
    MS_CHECK(ms_cuda_status(cudaHostAlloc(&ls->host, bytes, cudaHostAllocDefault),
                            "cudaHostAlloc (list)", err));
    MS_CHECK(ms_cuda_status(cudaMalloc(&ls->dev, bytes), "cudaMalloc (list)", err));
    ls->cap = bytes;
    return MS_OK;
}

/* The filled host side up to the device, on the stream, before what is launched next. */
static ms_status list_send(ms_kctx *kc, list_stage *ls, size_t bytes, ms_error *err) {
    cudaStream_t s = ms_cu_stream(kc);
    MS_CHECK(ms_cuda_status(cudaMemcpyAsync(ls->dev, ls->host, bytes, cudaMemcpyHostToDevice, s),
                            "cudaMemcpyAsync (list)", err));
    return ms_cuda_status(cudaEventRecord(ls->copied, s), "cudaEventRecord (list)", err);
}

/* The whole list in two launches (ms_cu_sumsq_list: each tensor's sum has the bits a call of
 * its own gives), its descriptors copied up from pinned memory, the sums copied back, one
 * wait for the device. */
static ms_status c_sumsq_list(ms_kctx *kc, double *host_out, const ms_k_span *x, int n,
                              ms_error *err) {
    if (n <= 0) return MS_OK;
    cuda_kctx *c = CU(kc);
    const size_t bytes = sizeof(ms_cu_sumsq_item) * (size_t)n;
    MS_CHECK(list_fill(kc, &c->sumsq_list, bytes, err));
    MS_CHECK(scratch_room(kc, &c->sums, sizeof(double) * (size_t)n, "cudaMalloc (sums of squares)",
                          err));
    ms_cu_sumsq_item *items = c->sumsq_list.host;
    for (int i = 0; i < n; i++)
        items[i] = (ms_cu_sumsq_item){.x = x[i].data, .n = (int64_t)x[i].n, .bf16 = x[i].bf16};
    const int64_t chunks = ms_cu_sumsq_list_plan(items, n);
    MS_CHECK(sumsq_room(kc, chunks, err)); /* one partial a chunk */
    MS_CHECK(list_send(kc, &c->sumsq_list, bytes, err));
    MS_CHECK(ms_cu_sumsq_list(kc, c->sums.p, c->sumsq.p, c->sumsq_list.dev, n, chunks, err));
    MS_CHECK(ms_cuda_status(cudaMemcpyAsync(host_out, c->sums.p, sizeof(double) * (size_t)n,
                                            cudaMemcpyDeviceToHost, ms_cu_stream(kc)),
                            "cudaMemcpyAsync (sums of squares)", err));
    return c_sync(kc, err);
}

/* Every parameter's AdamW in one launch, the list copied up from pinned memory; nothing waits
 * for the device. */
static ms_status c_adamw_list(ms_kctx *kc, const ms_k_adamw_item *x, int n, const ms_adamw_opts *o,
                              int64_t t, float grad_scale, ms_error *err) {
    MS_CHECK(ms_adamw_check(o, t, grad_scale, err));
    if (n <= 0) return MS_OK;
    cuda_kctx *c = CU(kc);
    const size_t bytes = sizeof(ms_cu_adamw_item) * (size_t)n;
    MS_CHECK(list_fill(kc, &c->adamw_list, bytes, err));
    ms_cu_adamw_item *items = c->adamw_list.host;
    for (int i = 0; i < n; i++)
        items[i] = (ms_cu_adamw_item){.p = x[i].p,
                                      .g = x[i].g,
                                      .m = x[i].m,
                                      .v = x[i].v,
                                      .n = (int64_t)x[i].n,
                                      .g_bf16 = x[i].g_bf16};
    const int64_t chunks = ms_cu_adamw_list_plan(items, n);
    MS_CHECK(list_send(kc, &c->adamw_list, bytes, err));
    return ms_cu_adamw_list(kc, c->adamw_list.dev, n, chunks, o, t, grad_scale, err);
}

/* Every master's rounding into its use copy in one launch, the list copied up from pinned
 * memory; nothing waits for the device. */
static ms_status c_bf16_round_list(ms_kctx *kc, const ms_k_cast_item *x, int n, ms_error *err) {
    if (n <= 0) return MS_OK;
    cuda_kctx *c = CU(kc);
    const size_t bytes = sizeof(ms_cu_cast_item) * (size_t)n;
    MS_CHECK(list_fill(kc, &c->cast_list, bytes, err));
    ms_cu_cast_item *items = c->cast_list.host;
    for (int i = 0; i < n; i++)
        items[i] = (ms_cu_cast_item){.dst = x[i].dst, .src = x[i].src, .n = (int64_t)x[i].n};
    const int64_t chunks = ms_cu_cast_list_plan(items, n);
    MS_CHECK(list_send(kc, &c->cast_list, bytes, err));
    return ms_cu_cast_list(kc, c->cast_list.dev, n, chunks, err);
}

/* Slot by slot, in backend.h's order: ms_cu_* are the .cu files' entries, c_* the adapters
 * above. */
static const ms_kernels cuda_kernels = {
    .name = "cuda",
    .kind = MS_DEVICE_CUDA,
    .sync = c_sync,
    .fill = ms_cu_fill,
    .accumulate = ms_cu_accumulate,
    .bf16_accumulate = ms_cu_bf16_accumulate,
    .bf16_widen = ms_cu_bf16_widen,
    .bf16_round = ms_cu_bf16_round,
    .bf16_round_list = c_bf16_round_list,
    .ids_from_floats = ms_cu_ids_from_floats,
    .matmul_forward = ms_cu_matmul_forward,
    .matmul_backward = ms_cu_matmul_backward,
    .matmul_forward_bf16 = ms_cu_matmul_forward_bf16,
    .matmul_backward_bf16 = ms_cu_matmul_backward_bf16,
    .add_forward_bf16 = ms_cu_add_forward_bf16,
    .add_backward_bf16 = ms_cu_add_backward_bf16,
    .bias_add_forward_bf16 = ms_cu_bias_add_forward_bf16,
    .bias_add_backward_bf16 = c_bias_add_backward_bf16,
    .gelu_forward_bf16 = ms_cu_gelu_forward_bf16,
    .gelu_backward_bf16 = ms_cu_gelu_backward_bf16,
    .bias_gelu_forward_bf16 = ms_cu_bias_gelu_forward_bf16,
    .bias_gelu_backward_bf16 = c_bias_gelu_backward_bf16,
    .bias_dropout_add_forward_bf16 = ms_cu_bias_dropout_add_forward_bf16,
    .bias_dropout_add_backward_bf16 = c_bias_dropout_add_backward_bf16,
    .layernorm_forward_bf16 = ms_cu_layernorm_forward_bf16,
    .layernorm_backward_bf16 = c_layernorm_backward_bf16,
    .attention_forward_bf16 = c_attention_forward_bf16,
    .attention_backward_bf16 = c_attention_backward_bf16,
    .xent_vp_rowmax_bf16 = ms_cu_xent_vp_rowmax_bf16,
    .xent_vp_sumexp_bf16 = ms_cu_xent_vp_sumexp_bf16,
    .xent_vp_target_bf16 = ms_cu_xent_vp_target_bf16,
    .xent_vp_backward_bf16 = ms_cu_xent_vp_backward_bf16,
    .dropout_forward_bf16 = ms_cu_dropout_forward_bf16,
    .dropout_backward_bf16 = ms_cu_dropout_backward_bf16,
    .embedding_forward_bf16 = ms_cu_embedding_forward_bf16,
    .embedding_backward_bf16 = c_embedding_backward_bf16,
    .add_forward = ms_cu_add_forward,
    .add_backward = ms_cu_add_backward,
    .mul_forward = ms_cu_mul_forward,
    .mul_backward = ms_cu_mul_backward,
    .scale_forward = ms_cu_scale_forward,
    .scale_backward = ms_cu_scale_backward,
    .bias_add_forward = ms_cu_bias_add_forward,
    .bias_add_backward = c_bias_add_backward,
    .gelu_forward = ms_cu_gelu_forward,
    .gelu_backward = ms_cu_gelu_backward,
    .sum_forward = ms_cu_sum_forward,
    .sum_backward = ms_cu_sum_backward,
    .layernorm_forward = ms_cu_layernorm_forward,
    .layernorm_backward = c_layernorm_backward,
    .softmax_forward = ms_cu_softmax_forward,
    .softmax_backward = ms_cu_softmax_backward,
    .attention_saved_floats = ms_cu_attention_saved_floats,
    .attention_scratch_floats = ms_cu_attention_scratch_floats,
    .attention_forward = c_attention_forward,
    .attention_backward = c_attention_backward,
    .rmsnorm_forward = ms_cu_rmsnorm_forward,
    .rmsnorm_backward = c_rmsnorm_backward,
    .swiglu_forward = ms_cu_swiglu_forward,
    .swiglu_backward = ms_cu_swiglu_backward,
    .rotary_tables = ms_cu_rotary_tables,
    .rotary_apply = ms_cu_rotary_apply,
    .gqa_saved_floats = ms_cu_gqa_saved_floats,
    .gqa_scratch_floats = ms_cu_gqa_scratch_floats,
    .gqa_forward = ms_cu_gqa_forward,
    .gqa_backward = ms_cu_gqa_backward,
    .embedding_forward = ms_cu_embedding_forward,
    .embedding_backward = c_embedding_backward,
    .xent_vp_rowmax = ms_cu_xent_vp_rowmax,
    .xent_vp_sumexp = ms_cu_xent_vp_sumexp,
    .xent_vp_target = ms_cu_xent_vp_target,
    .xent_vp_loss = ms_cu_xent_vp_loss,
    .xent_vp_backward = ms_cu_xent_vp_backward,
    .bias_gelu_forward = ms_cu_bias_gelu_forward,
    .bias_gelu_backward = c_bias_gelu_backward,
    .bias_dropout_add_forward = ms_cu_bias_dropout_add_forward,
    .bias_dropout_add_backward = c_bias_dropout_add_backward,
    .gather = ms_cu_gather,
    .scatter_add = ms_cu_scatter_add,
    .dropout_forward = ms_cu_dropout_forward,
    .dropout_backward = ms_cu_dropout_backward,
    .adamw_step = ms_cu_adamw_step,
    .adamw_step_bf16_grad = ms_cu_adamw_step_bf16_grad,
    .sumsq = c_sumsq,
    .sumsq_bf16 = c_sumsq_bf16,
    .adamw_list = c_adamw_list,
    .sumsq_list = c_sumsq_list,
    .scale_inplace = ms_cu_scale_inplace,
    .copy = ms_cu_copy,
    .unary_forward = ms_cu_unary_forward,
    .unary_backward = ms_cu_unary_backward,
    .binary_forward = ms_cu_binary_forward,
    .binary_backward = ms_cu_binary_backward,
    .ternary_forward = ms_cu_ternary_forward,
    .ternary_backward = ms_cu_ternary_backward,
    .reduce_forward = ms_cu_reduce_forward,
    .reduce_backward = ms_cu_reduce_backward,
    .view_forward = ms_cu_view_forward,
    .view_backward = ms_cu_view_backward,
    .block_copy = ms_cu_block_copy,
    .scan_forward = ms_cu_scan_forward,
    .scan_backward = ms_cu_scan_backward,
    .triangle = ms_cu_triangle,
    .masked_fill_forward = ms_cu_masked_fill_forward,
    .masked_fill_backward = ms_cu_masked_fill_backward,
    .one_hot = ms_cu_one_hot,
    .sort_rows = ms_cu_sort_rows,
    .sort_rows_backward = ms_cu_sort_rows_backward,
    .rows_forward = ms_cu_rows_forward,
    .rows_backward = ms_cu_rows_backward,
    .bmm_forward = ms_cu_bmm_forward,
    .bmm_backward = ms_cu_bmm_backward,
    .pointwise_loss_forward = ms_cu_pointwise_loss_forward,
    .pointwise_loss_backward = ms_cu_pointwise_loss_backward,
    .nll_forward = ms_cu_nll_forward,
    .nll_backward = ms_cu_nll_backward,
    .xent_smooth_forward = ms_cu_xent_smooth_forward,
    .xent_smooth_backward = ms_cu_xent_smooth_backward,
    /* -- conv -- */
    .conv_scratch_floats = ms_cu_conv_scratch_floats,
    .conv_forward = ms_cu_conv_forward,
    .conv_backward = ms_cu_conv_backward,
    /* -- end conv -- */
    /* -- pool -- */
    .pool_forward = ms_cu_pool_forward,
    .pool_backward = ms_cu_pool_backward,
    .group_norm_forward = ms_cu_group_norm_forward,
    .group_norm_backward = ms_cu_group_norm_backward,
    .resize_forward = ms_cu_resize_forward,
    .resize_backward = ms_cu_resize_backward,
    /* -- end pool -- */
};

const ms_kernels *ms_kernels_cuda_table(void) {
    return &cuda_kernels;
}

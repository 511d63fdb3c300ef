/* cost.c - strategies, the closed-form workload, pricing a workload on a cluster, memory. */
#include "engine/plan/cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/dist/reshard.h"
#include "engine/kernels/fused.h"
#include "engine/kernels/index.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/layers.h"
#include "engine/ops/op.h"
#include "engine/pipeline/balance.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"
#include "engine/model/lm_layout.h"
#include "engine/plan/validate.h"
#include "engine/plan/workload.h"

const char *ms_plan_dim_name(ms_plan_dim d) {
    static const char *const n[] = {"dp", "tp", "pp", "cp", "world"};
    return d < MS_PLAN_DIM_COUNT ? n[d] : "?";
}

const char *ms_plan_class_name(ms_plan_class c) {
    static const char *const n[] = {"gemm", "attention", "elementwise", "optimizer"};
    return c < MS_PC_COUNT ? n[c] : "?";
}

void ms_plan_scales_identity(ms_plan_scales *s) {
    for (int i = 0; i < MS_PC_COUNT; i++) s->compute[i] = 1;
    for (int i = 0; i < MS_PLAN_DIM_COUNT; i++) s->comm[i] = 1;
    s->overhead_s = 0;
    s->sync = 1;
    s->dp_overlap = -1;
}

/* --- strategies --------------------------------------------------------------------------------
 */

char *ms_plan_bytes_str(double b, char *buf, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (b >= 1024 && k < 4) b /= 1024, k++;
    snprintf(buf, len, "%.1f %s", b, u[k]);
    return buf;
}

ms_job_shape ms_plan_job(const ms_plan_problem *pb) {
    return (ms_job_shape){.world = pb->devices, .batch = pb->global_batch, .seq = pb->seq};
}

const ms_model_def *ms_plan_user_def(const ms_plan_problem *pb) {
    return pb->def && !pb->def->lm ? pb->def : NULL;
}

ms_plan_problem ms_plan_problem_resolved(const ms_plan_problem *pb) {
    ms_plan_problem r = *pb;
    if (pb->def && pb->def->lm) {
        r.model = *pb->def->lm;
        r.def = NULL;
    } else if (pb->def) {
        r.seq = 1; /* a row is the unit a step counts */
    }
    return r;
}

ms_status ms_plan_check(const ms_plan_problem *pb, const ms_strategy *s, ms_error *err) {
    ms_job_shape job = ms_plan_job(pb);
    const ms_model_def *d = ms_plan_user_def(pb);
    return d ? ms_strategy_check_def(s, d, &job, err) : ms_strategy_check(s, &pb->model, &job, err);
}

bool ms_plan_executable(const ms_plan_problem *pb, const ms_strategy *s, char *why, size_t len) {
    char dummy[8];
    if (!why) why = dummy, len = sizeof dummy;
    why[0] = '\0';
    /* threads: cpu-local's thread ranks; nccl: CUDA devices, a rank per GPU (ranks share GPUs
     * when there are fewer), NCCL per mesh dim, MPI processes across nodes */
    const char *b = pb->cluster->backend;
    if (strcmp(b, "threads") && strcmp(b, "nccl")) {
        snprintf(why, len,
                 "this engine runs on the threads (cpu-local) and nccl (CUDA) backends, "
                 "not on %s's '%s'",
                 pb->cluster->name, b);
        return false;
    }
    ms_error e = {0};
    ms_job_shape job = ms_plan_job(pb);
    const ms_model_def *d = ms_plan_user_def(pb);
    if ((d ? ms_strategy_validate_def(s, d, &job, 0, &e)
           : ms_strategy_validate(s, &pb->model, &job, 0, &e)) == MS_OK)
        return true;
    snprintf(why, len, "%s", e.msg);
    return false;
}

/* The micro-batch size and count of a checked strategy. */
static void micro(const ms_plan_problem *pb, const ms_strategy *s, int *size, int *count) {
    if (!ms_strategy_micro(s, pb->global_batch, size, count)) *size = *count = 1;
}

static int memo_stage_layers(ms_plan_memo *memo, const ms_model_config *c, int p, int v);

/* Layers on the busiest pipeline stage, the stages split as the engine splits them
 * (ms_pp_chunk_layers: pp_layers, else pp x virtual_stages chunks balanced by cost at the
 * model's context length), balanced once per model and split (memo) rather than per chunk. */
static int stage_layers(const ms_plan_problem *pb, const ms_strategy *s) {
    int p = s->pp > 1 ? s->pp : 1, v = s->virtual_stages > 1 ? s->virtual_stages : 1, most = 0;
    if (s->pp_layers[0] && v == 1) {
        for (int q = 0; q < p; q++) most = s->pp_layers[q] > most ? s->pp_layers[q] : most;
        return most;
    }
    return memo_stage_layers(pb->memo, &pb->model, p, v);
}

/* The busiest stage's layers of cfg split into p x v balanced chunks (stage q holds chunks q,
 * q + p, ...). */
static int balanced_stage_layers(const ms_model_config *cfg, int p, int v) {
    int *counts = xmalloc(sizeof *counts * (size_t)(p * v)), most = 0;
    ms_pp_costs costs = ms_pp_model_costs(cfg, cfg->n_positions);
    ms_pp_balance_layers(cfg->n_layer, p * v, &costs, counts);
    for (int q = 0; q < p; q++) {
        int layers = 0;
        for (int c = 0; c < v; c++) layers += counts[c * p + q];
        most = layers > most ? layers : most;
    }
    free(counts);
    return most;
}

/* --- closed-form quantities ------------------------------------------------------------------- */

double ms_plan_model_flops(const ms_model_config *c, double batch, double seq) {
    /* per token: 6 FLOPs per weight of the layers' linears and the head (forward 2, backward
     * 4), and the scores and weighted values, 4 s x (query heads x head size) forward, 3x that
     * in all (GPT-2: 24 h^2 + 4 s h per layer forward, the logits 2 h V: the hand count
     * 72 B s l h^2 (1 + s/(6h)) + 6 B s h V); BERT's head only on its masked positions */
    ms_lm_layout f;
    ms_lm_layout_of(c, 1, (int)seq, &f);
    double lin = 0, s = seq, tokens = batch * seq;
    double head_tokens = f.head_rows ? batch * (double)f.head_rows : tokens;
    for (int i = 0; i < f.n_lin; i++) lin += (double)f.lin[i].k * f.lin[i].n;
    double head = (double)f.h * f.vocab + (f.head_transform ? (double)f.h * f.h : 0);
    double attn = 12.0 * s * (double)f.heads * f.head_dim;
    return tokens * c->n_layer * (6 * lin + attn) + head_tokens * 6 * head;
}

double ms_plan_narayanan_flops(const ms_model_config *c, double batch, double seq, bool recompute) {
    double h = c->n_embd, l = c->n_layer, V = c->vocab_size, s = seq;
    return (recompute ? 96.0 : 72.0) * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

double ms_plan_param_count(const ms_model_config *c) {
    double h = c->n_embd, l = c->n_layer, V = c->vocab_size, s = c->n_positions;
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
}

void ms_plan_zero_memory(double psi, int nd, int stage, ms_plan_dtype dt, double *params,
                         double *grads, double *optim) {
    /* bytes per parameter: mixed precision keeps 16-bit weights and gradients and K = 12 of
     * fp32 optimizer state (master weights, m, v); fp32 training 4 + 4 and 8 (m, v) */
    double wb = dt == MS_PLAN_BF16 ? 2 : 4, gb = wb, ob = dt == MS_PLAN_BF16 ? 12 : 8;
    double n = nd > 0 ? nd : 1;
    *params = psi * wb / (stage >= 3 ? n : 1);
    *grads = psi * gb / (stage >= 2 ? n : 1);
    *optim = psi * ob / (stage >= 1 ? n : 1);
}

double ms_plan_layer_activation_bytes(double s, double b, double h, double a, int t, bool sp, int c,
                                      bool recompute, bool flash, ms_plan_dtype dt) {
    double scale = dt == MS_PLAN_FP32 ? 2.0 : 1.0; /* 32-bit activations double the figures */
    double sl = s / c;
    if (recompute) return scale * 2 * sl * b * h / (sp ? t : 1);
    double linear = (sp ? 34.0 / t : 10.0 + 24.0 / t) * sl * b * h;
    double scores = flash ? 0 : 5.0 * a * s * s * b / ((double)t * c);
    return scale * (linear + scores);
}

/* --- where a mesh dim's group lies -------------------------------------------------------------
 */

/* Layout tp (innermost), cp, dp, pp (outermost), as Megatron-LM orders its groups. The
 * gradient group of dp with cp > 1 is dp x cp (stride tp). */
static ms_group_place place(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_dim dim,
                            int group) {
    const ms_cluster *c = pb->cluster;
    switch (dim) {
        case MS_PLAN_TP:
            return ms_cluster_group(c, group, 1);
        case MS_PLAN_CP:
            return ms_cluster_group(c, group, s->tp);
        case MS_PLAN_DP:
            return ms_cluster_group(c, group, group == s->dp * s->cp ? s->tp : s->tp * s->cp);
        case MS_PLAN_PP:
            return ms_cluster_group(c, group, s->tp * s->cp * s->dp);
        default:
            return ms_cluster_group(c, group, 1);
    }
}

double ms_plan_coll_time(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_dim dim,
                         ms_coll_kind kind, double bytes, double gap_s) {
    int group = dim == MS_PLAN_TP   ? s->tp
                : dim == MS_PLAN_CP ? s->cp
                : dim == MS_PLAN_DP ? s->dp
                : dim == MS_PLAN_PP ? s->pp
                                    : pb->devices;
    return ms_cluster_coll_time(pb->cluster, kind, place(pb, s, dim, group), bytes, pb->devices,
                                gap_s);
}

/* --- workloads -----------------------------------------------------------------------------------
 */

void wk_reset(ms_plan_workload *w) {
    w->nk = w->nc = 0;
    w->from_engine = false;
    w->opt_elems = w->norm_elems = w->zero_bytes = w->bwd_mb_s = w->hw_flops_step = 0;
    w->mem_params = w->mem_grads = w->mem_optim = w->mem_act = w->mem_other = 0;
    w->layers_per_stage = 0;
}

void wk_kernel_add(ms_plan_workload *w, ms_plan_class cls, ms_oprate rate, wk_phase ph, int op,
                   int64_t m, int64_t n, int64_t k, double flops, double bytes, double count) {
    if (count <= 0) return;
    for (int i = 0; i < w->nk; i++) {
        wk_kernel *e = &w->k[i];
        if (e->cls == cls && e->rate == rate && e->phase == ph && e->op == op && e->m == m &&
            e->n == n && e->k == k && e->flops == flops && e->bytes == bytes) {
            e->count += count;
            return;
        }
    }
    if (w->nk == WK_MAX_KERNELS) {
        /* Full: fold into the last entry of the same class (its time is linear in count). */
        for (int i = w->nk - 1; i >= 0; i--)
            if (w->k[i].cls == cls && w->k[i].phase == ph) {
                w->k[i].count += count * (flops + bytes) / (w->k[i].flops + w->k[i].bytes + 1e-30);
                return;
            }
        return;
    }
    w->k[w->nk++] = (wk_kernel){.cls = (uint8_t)cls,
                                .rate = (uint8_t)rate,
                                .phase = (uint8_t)ph,
                                .op = (int16_t)op,
                                .m = m,
                                .n = n,
                                .k = k,
                                .flops = flops,
                                .bytes = bytes,
                                .count = count};
}

void wk_coll_add(ms_plan_workload *w, ms_coll_kind kind, ms_plan_dim dim, wk_when when, int group,
                 double bytes, double count) {
    if (count <= 0 || group <= 1) return;
    for (int i = 0; i < w->nc; i++) {
        wk_coll *e = &w->c[i];
        if (e->kind == kind && e->dim == dim && e->when == when && e->group == group &&
            e->bytes == bytes) {
            e->count += count;
            return;
        }
    }
    if (w->nc == WK_MAX_COLLS) return;
    w->c[w->nc++] = (wk_coll){.kind = (uint8_t)kind,
                              .dim = (uint8_t)dim,
                              .when = (uint8_t)when,
                              .group = group,
                              .bytes = bytes,
                              .count = count};
}

static double wk_flops(const ms_plan_workload *w) {
    double f = 0;
    for (int i = 0; i < w->nk; i++) f += w->k[i].flops * w->k[i].count;
    return f;
}

/* A linear layer x[m, k] @ W[k, n] through the matmul op's own cost function (op: MATMUL, or
 * LINEAR for families whose projections are that op). */
static void add_gemm_op(ms_plan_workload *w, int op, int64_t m, int64_t n, int64_t k, double rc,
                        double count) {
    ms_k_gemm g = {.batch = 1, .m = m, .n = n, .k = k, .bcast_b = true};
    ms_k_cost f = ms_k_matmul_cost(&g, false, false, true, true);
    ms_k_cost b = ms_k_matmul_cost(&g, true, false, true, true);
    wk_kernel_add(w, MS_PC_GEMM, MS_OPRATE_STREAM, WK_FWD, op, m, n, k, f.flops, f.bytes, count);
    wk_kernel_add(w, MS_PC_GEMM, MS_OPRATE_STREAM, WK_BWD, op, m, n, k, b.flops, b.bytes, count);
    if (rc > 0)
        wk_kernel_add(w, MS_PC_GEMM, MS_OPRATE_STREAM, WK_RECOMPUTE, op, m, n, k, f.flops, f.bytes,
                      count * rc);
}

static void add_gemm(ms_plan_workload *w, int64_t m, int64_t n, int64_t k, double rc,
                     double count) {
    add_gemm_op(w, MS_OP_MATMUL, m, n, k, rc, count);
}

static void add_elt(ms_plan_workload *w, ms_oprate rate, int op, ms_k_cost f, ms_k_cost b,
                    double rc, double count) {
    wk_kernel_add(w, MS_PC_ELEMENTWISE, rate, WK_FWD, op, 0, 0, 0, f.flops, f.bytes, count);
    wk_kernel_add(w, MS_PC_ELEMENTWISE, rate, WK_BWD, op, 0, 0, 0, b.flops, b.bytes, count);
    if (rc > 0)
        wk_kernel_add(w, MS_PC_ELEMENTWISE, rate, WK_RECOMPUTE, op, 0, 0, 0, f.flops, f.bytes,
                      count * rc);
}

/* The closed form, one micro-batch on the busiest stage (its layers, the head, and the
 * embedding when pp = 1), with the kernels the engine runs for the model's family
 * (engine/model/lm_layout.h): each through its op's own cost function. */
typedef struct analytic {
    const ms_plan_problem *pb;
    const ms_strategy *s;
    ms_plan_workload *w;
    ms_lm_layout f;
    int t, cp, p, mb, n_micro;
    /* rc: the share of the stage's layers full recompute runs again (0: none, 1: all; less
     * with recompute_layers); sel: selective recompute; vp: a vocab-parallel head */
    double rc;
    bool sel, vp;
    int64_t h, V, S, b, tok, tok_sp;
    /* rows the head's decoder and loss run on (BERT: b x k, whole over cp) */
    int64_t head_rows;
    double ab, L; /* activation bytes; layers on the busiest stage */
    double emb;   /* the embedding on the busiest stage: 1 when pp = 1 */
    double f_layers, f_head;
} analytic;

/* A linear layer's local shape on one tp rank: rows x n, reduction k. */
static void linear_local(const analytic *z, const ms_lm_linear *l, int64_t *n, int64_t *k) {
    int64_t t = z->t;
    *n = l->split == MS_LM_COLUMN ? l->n / t : l->n;
    *k = l->split == MS_LM_ROW ? l->k / t : l->k;
}

static void add_norm(analytic *z, int64_t rows, double rc, double count) {
    bool rms = z->f.norm_op == MS_OP_RMSNORM;
    ms_k_cost f =
        rms ? ms_k_rmsnorm_cost(rows, z->h, false) : ms_k_layernorm_cost(rows, z->h, false);
    ms_k_cost b = rms ? ms_k_rmsnorm_cost(rows, z->h, true) : ms_k_layernorm_cost(rows, z->h, true);
    add_elt(z->w, MS_OPRATE_LAYERNORM, z->f.norm_op, f, b, rc, count);
}

static void add_bias(analytic *z, int64_t rows, int64_t n, double rc, double count) {
    add_elt(z->w, MS_OPRATE_BIAS, MS_OP_BIAS,
            ms_k_elementwise_cost(MS_K_BIAS_ADD, rows * n, n, false),
            ms_k_elementwise_cost(MS_K_BIAS_ADD, rows * n, n, true), rc, count);
}

static void add_stream(analytic *z, int op, ms_oprate rate, ms_k_elt k, int64_t n, double rc,
                       double count) {
    add_elt(z->w, rate, op, ms_k_elementwise_cost(k, n, 0, false),
            ms_k_elementwise_cost(k, n, 0, true), rc, count);
}

/* gelu(x + bias) over rows x n, one pass. */
static void add_bias_gelu(analytic *z, int64_t rows, int64_t n, double rc, double count) {
    add_elt(z->w, MS_OPRATE_GELU, MS_OP_BIAS_GELU, ms_k_bias_gelu_cost(rows, n, false),
            ms_k_bias_gelu_cost(rows, n, true), rc, count);
}

/* res + dropout(x + bias) over rows x n, one pass (Philox-bound when the layer drops). */
static void add_bias_dropout_add(analytic *z, int64_t rows, int64_t n, double rc, double count) {
    bool drop = z->f.dropout;
    add_elt(z->w, drop ? MS_OPRATE_DROPOUT : MS_OPRATE_STREAM, MS_OP_BIAS_DROPOUT_ADD,
            ms_k_bias_dropout_add_cost(rows * n, n, drop, false),
            ms_k_bias_dropout_add_cost(rows * n, n, drop, true), rc, count);
}

/* A linear layer's bias as the builder adds it: its own op, inside bias_dropout_add (with a
 * residual add and dropout), or inside bias_gelu (priced with the activation). Returns
 * whether it took a residual add. */
static bool add_linear_bias(analytic *z, const ms_lm_linear *l, int64_t n, double count) {
    int64_t rows = l->split == MS_LM_COLUMN ? z->tok : z->tok_sp;
    if (!l->bias || l->fuse == MS_LM_FUSE_GELU) return false;
    if (l->fuse == MS_LM_FUSE_RESIDUAL) {
        add_bias_dropout_add(z, rows, n, z->rc, count);
        return true;
    }
    add_bias(z, rows, n, z->rc, count);
    return false;
}

/* The cp rank the step waits for: the last, whose queries see the longest causal prefix (the
 * engine workload compiles that rank too); every cp rank is alike without a causal mask. */
static int64_t cp_q_start(const analytic *z) {
    return z->cp > 1 && z->f.causal ? z->S - z->S / z->cp : 0;
}

/* Attention's core on the local heads. GPT-2 and BERT (qkv packed) move heads in over cp and
 * attend over whole sequences; LLaMA's GQA keeps its queries on the cp sequence shard and
 * gathers k and v whole (the last shard's queries see every key before them). kv heads that
 * do not divide tp are all on every tp rank, the query heads split. */
static void analytic_attention(analytic *z) {
    const ms_lm_layout *f = &z->f;
    const ms_cluster *cl = z->pb->cluster;
    const int64_t cp_heads = f->gqa ? 1 : z->cp; /* cp splits packed heads, not GQA's */
    int64_t split = (int64_t)z->t * cp_heads, kv_split = f->kv_whole ? cp_heads : split;
    int64_t lh = f->heads / split, lkv = f->kv_heads / kv_split, hs = f->head_dim, b = z->b,
            S = z->S;
    bool causal = f->causal && cl->causal_skip;
    int op = f->gqa ? MS_OP_GQA_ATTENTION : MS_OP_ATTENTION;
    ms_k_cost fw, bw;
    if (f->gqa) {
        ms_k_gqa g = {.b = b,
                      .tq = S / z->cp,
                      .tk = S,
                      .h = lh,
                      .hkv = lkv,
                      .d = hs,
                      .q_start = cp_q_start(z),
                      .causal = causal};
        fw = ms_k_gqa_cost(&g, false), bw = ms_k_gqa_cost(&g, true);
        /* rotary on q and k, on the sequence shard */
        int64_t nq = z->tok * lh * hs, nk = z->tok * lkv * hs;
        for (int i = 0; i < 2; i++)
            add_elt(z->w, MS_OPRATE_STREAM, MS_OP_ROTARY, ms_k_rowwise_cost(1, i ? nk : nq, 3, 2),
                    ms_k_rowwise_cost(1, i ? nk : nq, 3, 3), z->rc, z->L);
    } else {
        fw = ms_k_attention_cost(b, S, lh * hs, lh, causal, false);
        bw = ms_k_attention_cost(b, S, lh * hs, lh, causal, true);
    }
    const int64_t tq = f->gqa ? S / z->cp : S; /* local query rows per sequence */
    const int64_t m = b * lh * tq / S;         /* as the engine source: n keys, m x n queries */
    if (cl->flash_attention) {
        /* scores stay on chip: only q, k, v and the output move */
        double qkvo = 4.0 * (double)b * (2.0 * tq * lh + 2.0 * S * lkv) * hs;
        fw.bytes = qkvo;
        bw.bytes = 2 * qkvo;
    }
    wk_kernel_add(z->w, MS_PC_ATTENTION, MS_OPRATE_SOFTMAX, WK_FWD, op, m, S, hs, fw.flops,
                  fw.bytes, z->L);
    wk_kernel_add(z->w, MS_PC_ATTENTION, MS_OPRATE_SOFTMAX, WK_BWD, op, m, S, hs, bw.flops,
                  bw.bytes, z->L);
    if (z->rc > 0 || z->sel)
        wk_kernel_add(z->w, MS_PC_ATTENTION, MS_OPRATE_SOFTMAX, WK_RECOMPUTE, op, m, S, hs,
                      fw.flops, fw.bytes, z->L * (z->sel ? 1 : z->rc));
}

/* One layer's kernels, L times: norms, the family's linears (attention between the first
 * linears and the output projection) and their biases, the MLP activation, the residual adds
 * and dropouts that no fused operator took. */
static void analytic_layers(analytic *z) {
    const ms_lm_layout *f = &z->f;
    const int64_t tok = z->tok, tok_sp = z->tok_sp, h = z->h;
    const double rc = z->rc;
    const double L = z->L;
    double adds = 2; /* residual adds (each after a dropout when the layer drops) */
    bool act_fused = false;
    /* Megatron-LM's sp in this engine (LLaMA): the norms run on whole sequences, and so does
     * the attention block's residual add (the MLP's is reduce-scattered onto the shard) */
    const bool whole = f->megatron_sp && z->s->sp && z->t > 1;
    add_norm(z, whole ? tok : tok_sp, rc, f->norms * L);
    if (whole) add_stream(z, MS_OP_ADD, MS_OPRATE_STREAM, MS_K_ADD, tok * h, rc, L), adds--;
    for (int i = 0; i < f->n_lin; i++) {
        const ms_lm_linear *l = &f->lin[i];
        int64_t n, k;
        linear_local(z, l, &n, &k);
        if (i == f->attn_at) analytic_attention(z); /* the output projection reads it */
        add_gemm_op(z->w, f->linear_op ? MS_OP_LINEAR : MS_OP_MATMUL, tok, n, k, rc, L);
        adds -= add_linear_bias(z, l, n, L);
        act_fused |= l->bias && l->fuse == MS_LM_FUSE_GELU;
    }
    int64_t width = f->act_width / (z->t > 1 ? z->t : 1), act = tok * width;
    if (f->act_op == MS_OP_SWIGLU)
        add_elt(z->w, MS_OPRATE_STREAM, MS_OP_SWIGLU, ms_k_rowwise_cost(1, act, 5, 3),
                ms_k_rowwise_cost(1, act, 10, 7), rc, L);
    else if (act_fused)
        add_bias_gelu(z, tok, width, rc, L);
    else
        add_stream(z, MS_OP_GELU, MS_OPRATE_GELU, MS_K_GELU, act, rc, L);
    add_stream(z, MS_OP_ADD, MS_OPRATE_STREAM, MS_K_ADD, tok_sp * h, rc, adds * L);
    if (f->dropout)
        add_elt(z->w, MS_OPRATE_DROPOUT, MS_OP_DROPOUT, ms_k_dropout_cost(tok_sp * h, false),
                ms_k_dropout_cost(tok_sp * h, true), rc, adds * L);
    z->f_layers = wk_flops(z->w);
}

/* The embedding's kernels, count times (0: none); returns one set's FLOPs. */
static double analytic_embedding(analytic *z, double count) {
    const int64_t tok = z->tok, tok_sp = z->tok_sp, h = z->h;
    double lookups = z->f.pos_rows ? 2 : 1;
    /* the vocab-parallel lookup runs on every row */
    ms_k_cost ef = ms_k_embedding_cost(tok, h, false), eb = ms_k_embedding_cost(tok, h, true);
    add_elt(z->w, MS_OPRATE_EMBEDDING, MS_OP_EMBEDDING, ef, eb, false, lookups * count);
    double one = lookups * (ef.flops + eb.flops);
    if (z->f.pos_rows) {
        ms_k_cost af = ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, false),
                  ab = ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, true);
        add_elt(z->w, MS_OPRATE_STREAM, MS_OP_ADD, af, ab, false, count);
        one += af.flops + ab.flops;
    }
    if (z->f.emb_norm) {
        add_norm(z, tok_sp, false, count);
        one += ms_k_layernorm_cost(tok_sp, h, false).flops +
               ms_k_layernorm_cost(tok_sp, h, true).flops;
    }
    return one;
}

/* The head (last stage): the final norm or BERT's MLM transform, the logits, the loss. BERT's
 * runs on its masked positions, gathered first: dense + bias_gelu + LayerNorm, whole over tp.
 * The dense product's output is reduce-scattered over the batch: over cp for the rest of the
 * head, under sp for bias_gelu and the norm (whose output the decoder reads whole). */
static void analytic_head(analytic *z) {
    const int64_t h = z->h, tok_sp = z->tok_sp, all = z->head_rows;
    const int64_t rows = z->f.head_rows ? all / z->cp : all;
    const int64_t rows_sp = z->s->sp && z->t > 1 ? rows / z->t : rows;
    const int64_t vl = z->vp ? z->V / z->t : z->V;
    /* a replicated head under GPT-2's and BERT's sp reads its input where it lies, split over
     * tp (the final norm's sequence shard, BERT's transform's rows): its own rows */
    const int64_t head_rows = !z->vp && !z->f.megatron_sp ? rows_sp : rows;
    double before = wk_flops(z->w);
    if (z->f.final_norm) add_norm(z, z->f.megatron_sp ? z->tok : tok_sp, false, 1);
    if (z->f.head_transform) {
        add_elt(z->w, MS_OPRATE_STREAM, MS_OP_BATCH_GATHER, ms_k_index_cost(all * h, 0, false),
                ms_k_index_cost(all * h, 0, true), false, 1);
        add_gemm(z->w, all, h, h, false, 1);
        add_bias_gelu(z, rows_sp, h, false, 1);
        add_norm(z, rows_sp, false, 1);
    }
    add_gemm_op(z->w, z->f.linear_op ? MS_OP_LINEAR : MS_OP_MATMUL, head_rows, vl, h, false, 1);
    add_elt(z->w, MS_OPRATE_XENT, MS_OP_XENT, ms_k_xent_cost(head_rows, vl, false),
            ms_k_xent_cost(head_rows, vl, true), false, 1);
    z->f_head = wk_flops(z->w) - before;
}

/* The tp collectives outside the layers' linears: whole kv heads' gradients (k and v's
 * outputs, all-reduced in the backward), the vocab-parallel lookup's reduction, the head
 * input's gradient, and the vocab-parallel cross-entropy's three row reductions. */
static void analytic_tp_rest(const analytic *z) {
    const ms_lm_layout *f = &z->f;
    ms_plan_workload *w = z->w;
    const int t = z->t;
    /* the head's rows on this rank (BERT's gathered ones split over cp) */
    const double rows = (double)(z->f.head_rows ? z->head_rows / z->cp : z->head_rows);
    const double x = (double)z->tok * z->h * z->ab, head = rows * z->h * z->ab;
    if (f->kv_whole)
        wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t,
                    (double)z->tok * f->kv_heads * f->head_dim * z->ab, 2 * z->L);
    if (!z->vp && z->s->sp && f->megatron_sp) {
        /* a replicated table under LLaMA's sp: the whole lookup meets the first layer's
         * sequence-sharded residual, gathered once; the table's gradient, from the rank's
         * rows, all-reduced (the head runs on the gathered final norm: its gradient whole) */
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, z->emb);
        if (z->emb > 0)
            wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_GRAD, t, (double)z->V * z->h * z->ab,
                        1);
    }
    if (!z->vp) return;
    /* LLaMA's first norm all-reduces the lookup (its output is replicated over tp): under full
     * recompute that runs again with the first layer */
    double again = z->rc > 0 && f->megatron_sp ? 2 : 1;
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, x, z->emb * again);
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, head, 1); /* the head's input */
    /* row max, sum of exponentials, target logit */
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, rows * 4, 3);
}

/* tp without sp: the Megatron-LM layout. Forward, an all-reduce after each row-parallel
 * linear; backward, an all-reduce of the input gradient of each column-parallel group. Under
 * cp, GPT-2's and BERT's attention output projection sums on the cp head shard: its partial
 * sum is reduce-scattered over tp, moved back to the sequence shard and all-gathered. */
static void analytic_tp(const analytic *z, double passes_f) {
    const ms_lm_layout *f = &z->f;
    const double x = (double)z->tok * z->h * z->ab;
    double fwd = 0, bwd = 0, split = z->cp > 1 && !f->gqa ? 1 : 0;
    for (int i = 0; i < f->n_lin; i++) {
        const ms_lm_linear *l = &f->lin[i];
        fwd += l->split == MS_LM_ROW;
        bwd += l->split == MS_LM_COLUMN && !l->same_input;
    }
    wk_coll_add(z->w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, z->t, x,
                z->L * ((fwd - split) * passes_f + bwd));
    wk_coll_add(z->w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, z->t, x,
                z->L * split * passes_f);
    wk_coll_add(z->w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, z->t, x, z->L * split * passes_f);
    analytic_tp_rest(z);
}

/* tp with sp as Megatron-LM lays it out (LLaMA): forward, each column-parallel group's input
 * (a norm's output) all-gathered from the sequence shard, each row-parallel output reduce-
 * scattered onto it; backward, the row outputs' gradients all-gathered and the groups' input
 * gradients all-reduced (the engine runs the norms on whole sequences); then as without sp. */
static void analytic_megatron_sp(const analytic *z, double passes_f) {
    const ms_lm_layout *f = &z->f;
    const double x = (double)z->tok * z->h * z->ab, L = z->L;
    double rows = 0, groups = 0;
    for (int i = 0; i < f->n_lin; i++) {
        rows += f->lin[i].split == MS_LM_ROW;
        groups += f->lin[i].split == MS_LM_COLUMN && !f->lin[i].same_input;
    }
    wk_coll_add(z->w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, z->t, x, L * rows * passes_f);
    wk_coll_add(z->w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, z->t, x,
                L * (groups * passes_f + rows));
    wk_coll_add(z->w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, z->t, x, L * groups);
    analytic_tp_rest(z);
}

/* A parameter of `elems` sharded over tp under sp: gathered for each forward, its gradient
 * reduce-scattered once per step; count per micro-batch. */
static void sp_gathered(const analytic *z, double elems, double fwd_count, double grads) {
    double bytes = elems * z->ab;
    wk_coll_add(z->w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, z->t, bytes, fwd_count);
    wk_coll_add(z->w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_GRAD, z->t, bytes, grads);
}

/* How the engine's completion lays out a column-parallel linear whose input is the sequence-
 * sharded stream under sp. It takes, for each op, the placements whose input reshards move the
 * fewest bytes, plus the reduction of a partial sum the op makes by moving its inputs
 * (ops/select.h), ties in this order: gather the weight (its bytes w), gather the input (x,
 * Megatron-LM's sp), or split the reduction (input and weight all-to-all'ed to the k dim,
 * (x + w) / tp, and the output's partial sum, `out` bytes, reduce-scattered). Gathering the
 * weight wins while the weights are small next to the tokens (tp2 on the tiny configs); the
 * split only when the output is much smaller than the gathered input. */
typedef enum sp_layout { SP_GATHER_WEIGHT, SP_GATHER_INPUT, SP_SPLIT_K } sp_layout;

static sp_layout sp_layout_of(double x, double w, double out, int t) {
    double split = (x + w) / t + out;
    if (w <= x && w <= split) return SP_GATHER_WEIGHT;
    return x <= split ? SP_GATHER_INPUT : SP_SPLIT_K;
}

/* The layout of the column-parallel linear `col`, its input the gathered stream. */
static sp_layout sp_column_layout(const analytic *z, const ms_lm_linear *col) {
    const double tok = (double)z->tok, ab = z->ab;
    return sp_layout_of(tok * z->h * ab, (double)col->k * col->n * ab, tok * col->n * ab, z->t);
}

/* One column-parallel linear (lin[c]) and the row-parallel one after it (lin[r]) under sp in
 * `layout`, L layers. Returns the replicated parameters whose gradients are all-reduced. */
static double sp_group(const analytic *z, int c, int r, sp_layout layout, double passes_f) {
    const ms_lm_layout *f = &z->f;
    ms_plan_workload *w = z->w;
    const ms_lm_linear *col = &f->lin[c], *row = &f->lin[r];
    const int t = z->t;
    const double L = z->L, tok = (double)z->tok, ab = z->ab, x = tok * z->h * ab;
    double repl = row->bias ? (double)row->n : 0;
    if (layout == SP_GATHER_WEIGHT) {
        /* both weights (and the column bias) gathered every forward, reduce-scattered once;
         * attention runs on a batch shard: qkv all-to-all'ed there and its output back */
        sp_gathered(z, (double)col->k * col->n + (col->bias ? col->n : 0), L * passes_f, L);
        sp_gathered(z, (double)row->k * row->n, L * passes_f, L);
        if (r == f->attn_at) {
            wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, tok / t * col->n * ab,
                        L * (passes_f + 1));
            wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, x / t, L * (passes_f + 1));
        }
        return repl;
    }
    if (layout == SP_GATHER_INPUT) {
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, L * passes_f);
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x, L);
    } else {
        /* input and weight to the k dim (the weight's gradient back once per step); the
         * output's partial sum reduce-scattered onto its columns, gathered in the backward */
        double wb = (double)col->k * col->n * ab / t, out = tok * col->n * ab;
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, x / t, L * (passes_f + 1));
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, wb, L * passes_f);
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_GRAD, t, wb, L);
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, out, L * passes_f);
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, out, L);
    }
    /* the row-parallel output reduce-scattered onto the sequence shard, gathered backward */
    wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x, L * passes_f);
    wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, L);
    return repl;
}

/* The layout of GPT-2's tied head under sp: a column-parallel linear over the vocabulary. */
static sp_layout sp_head_layout(const analytic *z) {
    const double tok = (double)z->tok, ab = z->ab, table = (double)z->V * z->h * ab;
    return sp_layout_of(tok * z->h * ab, table, tok * z->V * ab, z->t);
}

/* The token lookup under sp, its ids gathered from the sequence shard. The completion prices
 * the vocab-parallel lookup's partial sum by its reduce-scatter onto the stream (x bytes) and
 * takes instead, when that moves fewer bytes (table / tp < x), the table all-to-all'ed onto
 * its columns and the looked-up rows all-to-all'ed to the sequence shard (the duals in the
 * backward; the table's gradient back to the vocabulary shard unless the tied head gathers
 * the table and sums its gradient whole). Gathering the table (when its bytes are within the
 * ids') is not modelled. */
static void sp_lookup(const analytic *z, double first) {
    const ms_lm_layout *f = &z->f;
    ms_plan_workload *w = z->w;
    const int t = z->t;
    const double tok = (double)z->tok, ab = z->ab, x = tok * z->h * ab;
    const double table_shard = (double)z->V * z->h * ab / t;
    wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, tok * 4, first);
    if (x <= table_shard) {
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x, first);
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, first);
        return;
    }
    bool head_sums_whole = f->tied && !f->head_rows && sp_head_layout(z) == SP_GATHER_WEIGHT;
    wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, x / t, 2 * first);
    wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, table_shard,
                (head_sums_whole ? 1 : 2) * first);
}

/* The tied head under sp (GPT-2), laid out like a column-parallel linear over the vocabulary:
 * the table gathered (and again for the backward; the loss reduced), or the final norm's
 * output gathered, or both all-to-all'ed and the logits reduce-scattered over the vocabulary;
 * the vocab-parallel loss's three row reductions then. */
static void sp_head(const analytic *z, double last) {
    const ms_lm_layout *f = &z->f;
    ms_plan_workload *w = z->w;
    const int t = z->t;
    const double tok = (double)z->tok, ab = z->ab, x = tok * z->h * ab;
    const double table = (double)z->V * z->h, first = z->emb;
    sp_layout layout = sp_head_layout(z);
    if (layout == SP_GATHER_WEIGHT) {
        bool shared = f->tied && first > 0; /* one table serves both ends */
        if (first > 0) sp_gathered(z, table, first, 1);
        if (!shared) sp_gathered(z, table, last, 1);
        if (f->tied) wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, table * ab, last);
        wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, 4, last); /* the loss */
        return;
    }
    if (layout == SP_GATHER_INPUT) {
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, last);
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x, last);
    } else {
        double logits = tok * z->V * ab;
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, x / t, 2 * last);
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_IN_MB, t, table * ab / t, 2 * last);
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_TP, WK_GRAD, t, table * ab / t, last);
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, logits, last);
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, logits, last);
    }
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, tok * 4, 3 * last);
}

/* tp with sp, as the engine completes it (GPT-2, BERT): the residual stream stays sequence-
 * sharded, each column-parallel linear in the layout sp_layout_of picks for it; replicated
 * parameters' gradients are all-reduced. */
static void analytic_sp(const analytic *z, double passes_f) {
    const ms_lm_layout *f = &z->f;
    ms_plan_workload *w = z->w;
    const int t = z->t;
    const double L = z->L, h = (double)z->h, ab = z->ab;
    double repl = (double)f->norms * f->norm_params * h;
    for (int c = 0; c < f->n_lin; c++) {
        if (f->lin[c].split != MS_LM_COLUMN) continue;
        int r = c + 1;
        while (r < f->n_lin && f->lin[r].split != MS_LM_ROW) r++;
        if (r == f->n_lin) break;
        repl += sp_group(z, c, r, sp_column_layout(z, &f->lin[c]), passes_f);
    }
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_GRAD, t, repl * ab, L);
    /* the ends */
    double first = z->emb, last = 1;
    double ends_repl = (f->final_norm ? f->norm_params * h : 0) +
                       (f->head_transform ? h * h + h + f->norm_params * h : 0);
    if (first > 0) {
        ends_repl += (double)f->pos_rows * h + (f->emb_norm ? f->norm_params * h : 0);
        if (z->vp) sp_lookup(z, first);
    }
    /* a replicated table: looked up and multiplied where the rows lie, no collective; its
     * gradient, made from the rank's rows, all-reduced with the other replicated parameters */
    if (!z->vp) ends_repl += (double)z->V * h;
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_GRAD, t, ends_repl * ab, 1);
    if (!z->vp) /* the loss: each rank's rows' sum */
        wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, 4, last);
    if (!f->head_rows) {
        if (z->vp) sp_head(z, last);
        return;
    }
    /* BERT's gathered head: its rows arrive as a partial sum (each rank gathers from its
     * sequence shard); the dense product is reduce-scattered over the batch, the LayerNorm's
     * output all-gathered to the vocab-parallel decoder (the table stays sharded), the reverse
     * in the backward; the loss's three row reductions */
    double x = (double)z->head_rows * h * ab;
    if (!z->vp) { /* the replicated decoder reads the norm's rows where they lie */
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x, last);
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, last);
        return;
    }
    wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x, 2 * last);
    wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, 2 * last);
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, (double)z->head_rows * 4, 3 * last);
}

/* cp: GPT-2's and BERT's packed qkv go from the sequence shard to a head shard and the
 * attention output back (all-to-all; its gradient, replicated over tp, moves whole); LLaMA's
 * queries stay on the sequence shard while k and v are gathered whole (their gradients
 * reduce-scattered back). */
static void analytic_cp(const analytic *z, double passes_f) {
    const ms_lm_layout *f = &z->f;
    const int t = z->t, cp = z->cp;
    const double L = z->L, tok = (double)z->tok, ab = z->ab;
    if (f->gqa) {
        double lkv = (double)f->kv_heads / (f->kv_whole ? 1 : t);
        double kv = (double)z->b * z->S * lkv * f->head_dim * ab;
        wk_coll_add(z->w, MS_COLL_ALL_GATHER, MS_PLAN_CP, WK_IN_MB, cp, kv, 2 * L * passes_f);
        wk_coll_add(z->w, MS_COLL_REDUCE_SCATTER, MS_PLAN_CP, WK_IN_MB, cp, kv, 2 * L);
        return;
    }
    double qkv = tok * (f->heads + 2 * f->kv_heads) * f->head_dim / t * ab, o = tok * z->h * ab;
    wk_coll_add(z->w, MS_COLL_ALL_TO_ALL, MS_PLAN_CP, WK_IN_MB, cp, qkv, L * (passes_f + 1));
    wk_coll_add(z->w, MS_COLL_ALL_TO_ALL, MS_PLAN_CP, WK_IN_MB, cp, o / t, L * passes_f);
    wk_coll_add(z->w, MS_COLL_ALL_TO_ALL, MS_PLAN_CP, WK_IN_MB, cp, o, L);
}

/* The collectives inside a micro-batch: tp's, cp's and the pipeline's transfers. */
static void analytic_mb_collectives(const analytic *z) {
    ms_plan_workload *w = z->w;
    const int t = z->t, cp = z->cp;
    double x = (double)z->tok * z->h * z->ab; /* one tp-replicated activation */
    double passes_f = 1 + z->rc; /* forward collectives run again in the recomputed layers */
    if (t > 1 && z->s->sp && z->f.megatron_sp)
        analytic_megatron_sp(z, passes_f);
    else if (t > 1 && z->s->sp)
        analytic_sp(z, passes_f);
    else if (t > 1)
        analytic_tp(z, passes_f);
    if (cp > 1 && z->f.head_rows) {
        /* BERT's gathered head: the dense product's partial rows reduce-scattered over the
         * batch, their gradient gathered back */
        double head = (double)z->head_rows * z->h * z->ab;
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_CP, WK_IN_MB, cp, head, 1);
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_CP, WK_IN_MB, cp, head, 1);
    }
    if (cp > 1) analytic_cp(z, passes_f);
    /* the loss, reduced over the ranks that split the batch and the sequence */
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_CP, WK_IN_MB, cp, 4, 1);
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_DP, WK_IN_MB, z->s->dp, 4, 1);
    if (z->p > 1) /* activations forward and gradients backward, scatter-gathered over tp; once
                   * per model chunk with virtual stages */
        wk_coll_add(w, MS_COLL_P2P, MS_PLAN_PP, WK_IN_MB, z->p, x / t, 2.0 * z->s->virtual_stages);
}

/* The gradients' reduction, as the engine plans it over every dim the parameters are
 * replicated on: dp by ZeRO stage, and cp. With both, each gradient is reduce-scattered over
 * dp, its shard all-reduced over cp and (ZeRO 0 and 1) gathered back over dp. Each of the
 * `calls` reductions of a pass (one per parameter tensor, or per gradient bucket) pays its
 * latency, as does each of the parameter gathers (one per tensor); psi elements in `tensors`
 * tensors. */
static void analytic_grad_sync(const analytic *z, double psi, double wte, double calls,
                               double tensors) {
    ms_plan_workload *w = z->w;
    const ms_strategy *s = z->s;
    const int dp = s->dp, cp = s->cp;
    const double n = calls > 1 ? calls : 1, nt = tensors > 1 ? tensors : 1;
    double wb = z->pb->dtype == MS_PLAN_BF16 ? 2 : 4, g = psi * wb / n, m = z->n_micro;
    double pt = psi * wb / nt; /* a parameter tensor's bytes: gathers are never bucketed */
    /* ZeRO 2 and 3 reduce every micro-batch's gradients (accumulated whole before) */
    double per = s->zero >= 2 ? m : 1;
    if (dp > 1 && (cp > 1 || s->zero >= 2)) {
        wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_DP, WK_GRAD, dp, g, per * n);
        if (s->zero < 2) wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, dp, g, n);
    } else if (dp > 1) {
        wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_DP, WK_GRAD, dp, g, n);
    }
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_CP, WK_GRAD, cp, g / dp, per * n);
    if (dp < 2) return;
    if (s->zero == 1 || s->zero == 2) /* the updated shards gathered after the optimizer */
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, dp, pt, nt);
    if (s->zero >= 3) {
        /* parameters gathered for forward and backward, every micro-batch (a tied table once
         * more for the head) */
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, dp, pt, 2 * m * nt);
        if (z->p == 1 && z->f.tied)
            wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, dp, wte * wb, 2 * m);
    }
}

/* The gradient collectives of one pass over psi elements in `tensors` tensors: one per tensor,
 * or with buckets one per bucket_mb MiB (a greedy fill in backward's order, which the engine's
 * compiled buckets equal on the families tested). */
static double grad_calls(const analytic *z, double psi, int tensors) {
    const ms_strategy *s = z->s;
    /* a bucket holds one collective: over dp and cp each gradient's reduction has three */
    if (s->bucket_mb <= 0 || (s->dp > 1 && s->cp > 1)) return tensors;
    double bytes = psi * (z->pb->dtype == MS_PLAN_BF16 ? 2 : 4);
    return ceil(bytes / (s->bucket_mb * 1048576.0));
}

/* Parameters on the busiest stage (the last on a tie, as the engine prices it), their
 * gradients' collectives (by ZeRO stage) and the state's memory. */
static void analytic_state(const analytic *z) {
    ms_plan_workload *w = z->w;
    const ms_plan_problem *pb = z->pb;
    const ms_strategy *s = z->s;
    const ms_lm_layout *f = &z->f;
    double layers = z->L * ms_lm_layout_layer_params(f, z->t);
    double first = ms_lm_layout_first_params(f, z->t, z->vp),
           last = ms_lm_layout_last_params(f, z->t, z->vp);
    double wte = (double)z->V * z->h / (z->vp ? z->t : 1);
    double psi = z->p == 1 ? layers + first + last - (f->tied ? wte : 0) : layers + last;
    int nz = s->dp; /* ZeRO shards over dp */
    double gb = pb->dtype == MS_PLAN_BF16 ? 2 : 4;
    int tensors = (int)z->L * ms_lm_layout_layer_tensors(f) + ms_lm_layout_last_tensors(f);
    if (z->p == 1) tensors += ms_lm_layout_first_tensors(f) - (f->tied ? 1 : 0);
    analytic_grad_sync(z, psi, wte, grad_calls(z, psi, tensors), tensors);
    if (s->zero >= 3 && s->dp > 1 && z->rc > 0 && pb->cluster->zero3_recompute_regathers) {
        /* a stack that gathers the recomputed layers' parameters once more, for their backward
         * (ms_cluster.zero3_recompute_regathers) */
        int lt = ms_lm_layout_layer_tensors(f);
        wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, s->dp,
                    ms_lm_layout_layer_params(f, z->t) * gb / lt, z->rc * z->L * lt * z->n_micro);
    }
    if (s->bucket_mb > 0 && (s->dp > 1) != (s->cp > 1)) /* the buckets' buffer, ZeRO's shards */
        w->mem_other += psi * gb * (1 + (s->zero >= 2 ? 1.0 / s->dp : 0));
    if (z->p > 1 && f->tied) /* the tied embedding's gradient between the first and last stage */
        wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_PP, WK_GRAD, 2, wte * gb, 1);
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_WORLD, WK_STEP, pb->devices, 8, 1);
    ms_plan_zero_memory(psi, nz, s->zero, pb->dtype, &w->mem_params, &w->mem_grads, &w->mem_optim);
    w->opt_elems = s->zero >= 1 ? psi / nz : psi;
    w->norm_elems = s->zero >= 2 ? psi / nz : psi;
    w->zero_bytes = (s->zero >= 2 ? psi / nz : psi) * gb;
}

/* The column-parallel groups of a layer under sp (GPT-2, BERT): lin[c] and the row-parallel
 * lin[r] after it, each in its layout; fn receives each. */
typedef double (*sp_group_fn)(const analytic *z, const ms_lm_linear *col, bool attention,
                              sp_layout layout);
static double sp_groups_sum(const analytic *z, sp_group_fn fn) {
    const ms_lm_layout *f = &z->f;
    double sum = 0;
    for (int c = 0; c < f->n_lin; c++) {
        if (f->lin[c].split != MS_LM_COLUMN) continue;
        int r = c + 1;
        while (r < f->n_lin && f->lin[r].split != MS_LM_ROW) r++;
        if (r == f->n_lin) break;
        sum += fn(z, &f->lin[c], r == f->attn_at, sp_column_layout(z, &f->lin[c]));
    }
    return sum;
}

/* Values per token a group keeps beyond its sharded outputs: the copies its reshards make
 * (attention's inputs and output moved to a batch shard; a gathered input; an input moved to
 * the k dim) and the partial sums before their reduce-scatter. */
static double sp_group_values(const analytic *z, const ms_lm_linear *col, bool attention,
                              sp_layout layout) {
    double t = z->t, h = (double)z->h;
    if (layout == SP_GATHER_WEIGHT) return attention ? ((double)col->n + h) / t : 0;
    if (layout == SP_GATHER_INPUT) return h + h;
    return h / t + (double)col->n + h;
}

/* Elements of the weights a group keeps for its backward: gathered whole, or moved to the k
 * dim (its shard). */
static double sp_group_weights(const analytic *z, const ms_lm_linear *col, bool attention,
                               sp_layout layout) {
    (void)attention;
    double wc = (double)col->k * col->n, wr = wc * z->h / col->n; /* the row linear: n x h */
    if (layout == SP_GATHER_WEIGHT) return wc + wr;
    return layout == SP_SPLIT_K ? wc / z->t : 0;
}

static double sp_values(const analytic *z) {
    return sp_groups_sum(z, sp_group_values);
}

/* Elements per token one layer's forward makes on a tp rank, every value kept for the
 * backward (this engine keeps them all): norms, linears and biases, attention's output, its
 * scores (heads x keys per query) unless flash or selective recompute drop them, rotary
 * outputs, the activation, the residual adds. Without sp a row-parallel output is a whole
 * partial sum and each tp all-reduce writes a second copy of the stream; with sp (the engine's
 * layout) every linear runs on a sequence shard, and attention's inputs arrive as a second
 * copy (all-to-all to heads, or k and v gathered). */
static double layer_values(const analytic *z, bool scores) {
    const ms_lm_layout *f = &z->f;
    const bool sp = z->s->sp && z->t > 1;
    double t = z->t, h = (double)z->h, hsp = sp ? h / t : h, hs = f->head_dim;
    /* packed attention runs on whole sequences of heads / (tp x cp) (cp rows per local token);
     * GQA on the local tokens' queries against k and v gathered whole over cp */
    double rows = f->gqa ? 1 : z->cp, lh = (double)f->heads / t / rows;
    double lkv = (double)f->kv_heads / (f->kv_whole ? 1 : t);
    /* Megatron-LM's sp (LLaMA): norms and the first residual add on whole sequences */
    double whole = sp && f->megatron_sp ? h : hsp;
    double v = f->norms * whole + whole + hsp + f->act_width / t + lh * hs * rows;
    for (int i = 0; i < f->n_lin; i++) {
        const ms_lm_linear *l = &f->lin[i];
        bool shard = l->split == MS_LM_COLUMN || (sp && l->split != MS_LM_WHOLE);
        /* a fused bias's output is the activation's or the residual's, counted with them */
        v += (shard ? l->n / t : l->n) * (l->bias && l->fuse == MS_LM_FUSE_NONE ? 2 : 1);
        if (t > 1 && !sp) /* the all-reduced copies: outputs, and column groups' input grads */
            v += h * ((l->split == MS_LM_ROW) + (l->split == MS_LM_COLUMN && !l->same_input));
    }
    if (f->gqa) v += (lh + lkv) * hs + (z->cp > 1 ? 2 * lkv * hs * z->cp : 0);
    if (!f->gqa && z->cp > 1) v += (3 * h + h) / t; /* qkv and the output, moved over cp */
    if (sp && f->gqa) v += 2.0 * f->kv_heads * hs;
    if (sp && f->megatron_sp) /* each group's gathered input, each row output's partial sum */
        for (int i = 0; i < f->n_lin; i++)
            v += h * ((f->lin[i].split == MS_LM_ROW) +
                      (f->lin[i].split == MS_LM_COLUMN && !f->lin[i].same_input));
    if (sp && !f->megatron_sp) v += sp_values(z);
    if (scores) v += lh * z->S * rows;
    return v;
}

/* Activations: the busiest stage's layers' values (only the layer inputs under full
 * recompute, plus one layer's values once) times the most micro-batches the schedule holds on
 * any stage; the ends' values (embedding lookups, position add and norm on the first stage; the
 * final norm or BERT's transform on the last) and the fp32 logits with their gradient (under
 * full recompute, the larger of those and one layer's values); the
 * backward's working gradients (the stream's and the widest activation's); the weights
 * gathered and kept for the backward (sp: every layer's; ZeRO 3: a layer's and its whole
 * gradient at a time). */
static void analytic_activations(const analytic *z) {
    const ms_cluster *cl = z->pb->cluster;
    const ms_strategy *s = z->s;
    const ms_lm_layout *f = &z->f;
    bool scores = !(cl->flash_attention || z->sel), sp = s->sp && z->t > 1;
    double tok = (double)z->tok, ab = z->ab, h = (double)z->h, hsp = sp ? h / z->t : h;
    double layer = layer_values(z, scores) * tok * ab;
    int held = 1; /* the most any stage holds (the first, under 1F1B) */
    for (int q = 0; z->p > 1 && q < z->p; q++) {
        int b =
            ms_pp_inflight_bound((ms_schedule)s->schedule, z->p, z->n_micro, s->virtual_stages, q);
        if (b > held) held = b;
    }
    double ends = f->final_norm ? hsp : 0;
    if (z->emb > 0) ends += (f->pos_rows ? 3 : 1) * h + (f->emb_norm ? hsp : 0);
    double work = hsp + f->act_width / z->t;
    const int64_t vl = z->vp ? z->V / z->t : z->V;
    /* BERT's head: the gathered rows, the dense product, bias_gelu and LayerNorm per row */
    double rows = (double)z->head_rows, transform = f->head_transform ? 4 * h * rows * ab : 0;
    double logits = 2.0 * rows * vl * 4;
    double gathered = 0;
    if (sp) gathered += z->L * ab * (f->megatron_sp ? 0 : sp_groups_sum(z, sp_group_weights));
    if (s->zero >= 3 && s->dp > 1) gathered += 2 * ms_lm_layout_layer_params(f, z->t) * ab;
    /* at the start of the backward every value is alive; under full recompute the head's are
     * freed before the layers' are made again, one layer at a time */
    double head = ends * tok * ab + transform + logits, work_b = work * tok * ab;
    /* under full recompute a micro-batch in flight holds its layers' inputs only: what is made
     * again, and the head's values, live within one pass, in the scratch the micro-batches
     * share (engine/graph/graph.h, ms_compile_opts.inflight) */
    const double rc_layers = z->rc * z->L; /* recomputed: their inputs only */
    double act = z->rc > 0 ? (rc_layers * tok * hsp * ab + (z->L - rc_layers) * layer) * held +
                                 fmax(head, layer)
                           : (z->L * layer + head) * held;
    z->w->mem_act = act + work_b + gathered;
    /* over dp and cp, each gradient's reduction runs in steps (reduce-scatter, all-reduce,
     * all-gather) through buffers the arena lends at grad sync, when the activations are gone:
     * the arena is at least the gradients' bytes */
    if (s->dp > 1 && s->cp > 1 && s->zero < 2) z->w->mem_act = fmax(z->w->mem_act, z->w->mem_grads);
}

void wk_analytic(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_workload *w) {
    wk_reset(w);
    analytic z = {.pb = pb, .s = s, .w = w, .t = s->tp, .cp = s->cp, .p = s->pp};
    ms_lm_layout_of(&pb->model, s->tp, pb->seq, &z.f);
    z.rc = s->recompute == MS_RECOMPUTE_FULL;
    z.sel = s->recompute == MS_RECOMPUTE_SELECTIVE; /* attention's core again */
    z.vp = z.t > 1 && !s->head_replicated;
    micro(pb, s, &z.mb, &z.n_micro);
    const ms_model_config *c = &pb->model;
    z.h = c->n_embd, z.V = c->vocab_size, z.S = pb->seq;
    z.b = z.mb;
    z.tok = z.b * z.S / z.cp;                 /* rows of a tp-replicated activation */
    z.tok_sp = s->sp ? z.tok / z.t : z.tok;   /* rows of the residual stream */
    z.ab = pb->dtype == MS_PLAN_BF16 ? 2 : 4; /* activation bytes */
    z.L = stage_layers(pb, s);
    /* recompute_layers: the first N layers of each chunk (virtual_stages chunks a stage) */
    if (z.rc > 0 && s->recompute_layers > 0 && z.L > 0)
        z.rc = fmin(1.0, (double)s->recompute_layers * s->virtual_stages / z.L);
    z.emb = z.p == 1 ? 1 : 0;
    z.head_rows = z.f.head_rows ? z.b * z.f.head_rows : z.tok;
    w->layers_per_stage = stage_layers(pb, s);
    analytic_layers(&z);
    analytic_head(&z);
    double f_emb = analytic_embedding(&z, z.emb);
    analytic_mb_collectives(&z);
    analytic_state(&z);
    analytic_activations(&z);
    /* hardware FLOPs of the step over every device: layers on every stage, the head and the
     * embedding once per pipeline */
    double per_device_mb = z.f_layers * ((double)c->n_layer / z.p / z.L) + (z.f_head + f_emb) / z.p;
    w->hw_flops_step = per_device_mb * z.n_micro * pb->devices;
}

/* --- the memo's parts ------------------------------------------------------------------------- */

typedef struct memo_entry {
    ms_model_config model;
    bool has_def; /* a program's own model: def, not model */
    ms_model_def def;
    int batch, seq;
    ms_strategy s;
    ms_plan_workload w;
    ms_plan_engine_stats st;
    struct memo_entry *next;
} memo_entry;

/* A simulated bubble fraction, with the executor's posted transfers. Under 1f1b, gpipe and
 * interleaved it does not depend on how a micro-batch splits into F, B and W
 * (test_pp_schedule checks four splits): they are keyed by (schedule, pp, m, v) alone, so a
 * search simulates each once; zb-h1 is keyed by its split too. */
typedef struct bubble_entry {
    int kind, p, m, v;
    double f, w; /* zb-h1: the forward's and the weight gradient's shares; else 0 */
    double frac;
    struct bubble_entry *next;
} bubble_entry;

#define BUBBLE_BUCKETS 256

/* The busiest stage's layers under a balanced split, per model and (pp, virtual stages). */
typedef struct stage_entry {
    ms_model_config model;
    int p, v, most;
    struct stage_entry *next;
} stage_entry;

struct ms_plan_memo {
    struct ms_plan_cache *plans; /* the compiles' reshard plans, made on first use */
    memo_entry *head;
    bubble_entry *bubbles[BUBBLE_BUCKETS];
    stage_entry *stages;
};

/* The bubble fraction of s's schedule over m micro-batches of forward f, input-gradient b and
 * weight-gradient w seconds, from the pipeline simulator (memoised in memo when given). */
static double bubble_fraction(ms_plan_memo *memo, const ms_strategy *s, int m, double f, double b,
                              double w) {
    bool zb = s->schedule == MS_SCHEDULE_ZB_H1;
    double sum = f + b + w, kf = zb ? f / sum : 0, kw = zb ? w / sum : 0;
    unsigned h = ((unsigned)s->schedule * 7919u + (unsigned)s->pp * 131u + (unsigned)m * 31u +
                  (unsigned)s->virtual_stages) %
                 BUBBLE_BUCKETS;
    for (bubble_entry *e = memo ? memo->bubbles[h] : NULL; e; e = e->next)
        if (e->kind == s->schedule && e->p == s->pp && e->m == m && e->v == s->virtual_stages &&
            e->f == kf && e->w == kw)
            return e->frac;
    double frac;
    if (ms_pp_bubble_fraction((ms_schedule)s->schedule, s->pp, m, s->virtual_stages, f, b, w, &frac,
                              NULL) != MS_OK)
        frac = (double)(s->pp - 1) / (m + s->pp - 1); /* a checked strategy always simulates */
    /* the simulator's rounding differs in the last bits between splits: to 1e-12, a memoised
     * fraction and a fresh one are the same number, so searches with and without a memo agree */
    frac = round(frac * 1e12) / 1e12;
    if (memo) {
        bubble_entry *e = xmalloc(sizeof *e);
        *e = (bubble_entry){.kind = s->schedule,
                            .p = s->pp,
                            .m = m,
                            .v = s->virtual_stages,
                            .f = kf,
                            .w = kw,
                            .frac = frac,
                            .next = memo->bubbles[h]};
        memo->bubbles[h] = e;
    }
    return frac;
}

/* --- pricing ---------------------------------------------------------------------------------- */

/* The bytes a kernel moves: its cost function counts fp32 elements; on a GPU a bf16 program's
 * elementwise and attention kernels read and write bf16 (the CUDA table's bf16 kernels, fp32
 * statistics aside), half of that. A CPU's bf16 program widens its operands instead, and its
 * per-operator rates are measured. */
static double kernel_bytes(const ms_plan_problem *pb, const wk_kernel *e) {
    return !pb->cluster->cpu && pb->dtype == MS_PLAN_BF16 ? 0.5 * e->bytes : e->bytes;
}

/* Whether the model's attention is causal (the layout's `causal`: BERT's is bidirectional); a
 * program's own model's attention is priced whole. */
static bool causal_attention(const ms_plan_problem *pb, const ms_strategy *s) {
    if (ms_plan_user_def(pb)) return false;
    ms_lm_layout f;
    ms_lm_layout_of(&pb->model, s->tp, pb->seq, &f);
    return f.causal;
}

/* How much slower a kernel runs inside a step than at its class's measured rates (cpu-local's
 * in_step, and its ranks' compute factor where they share cores; 1 elsewhere). */
static double in_step(const ms_plan_problem *pb, const wk_kernel *e) {
    return ms_cluster_in_step(pb->cluster, e->cls, kernel_bytes(pb, e)) *
           ms_cluster_sync_compute(pb->cluster, pb->devices);
}

/* A kernel's time at its class's measured rates. */
static double kernel_time(const ms_plan_problem *pb, const wk_kernel *e, bool causal) {
    const ms_cluster *c = pb->cluster;
    int r = pb->devices;
    switch (e->cls) {
        case MS_PC_GEMM:
            if (e->phase == WK_BWD) /* dA = dC B^T and dB = A^T dC */
                return ms_cluster_gemm_time(c, pb->dtype, e->m, e->k, e->n, r) +
                       ms_cluster_gemm_time(c, pb->dtype, e->k, e->n, e->m, r);
            return ms_cluster_gemm_time(c, pb->dtype, e->m, e->n, e->k, r);
        case MS_PC_ATTENTION: {
            bool bwd = e->phase == WK_BWD;
            if (c->cpu) return ms_cluster_attention_time(c, e->m, e->n, e->k, bwd, r);
            /* per head: S = Q K^T and O = P V (four products backward) as batched GEMMs, and
             * the softmax and its traffic as an elementwise kernel. A batched GEMM over the
             * batch x heads items runs like one GEMM with the items stacked on its rows (one
             * launch, the tiles of all items in flight), not like that many small GEMMs: BERT's
             * 128 x 128 x 64 heads would otherwise pay a launch and a small tile's efficiency
             * each. */
            double frac = c->causal_skip && causal ? 0.5 : 1.0;
            if (e->op == MS_OP_GQA_ATTENTION && c->causal_skip && e->m * e->n > 0)
                /* the pairs its cost function counts (a causal cp shard sees a prefix of keys)
                 * over the m n x n it would without the mask */
                frac = e->flops /
                       ((double)e->m * e->n * e->n * (bwd ? 8.0 * e->k + 4 : 4.0 * e->k + 4));
            int64_t rows = e->m * e->n;
            double g = ms_cluster_gemm_time(c, pb->dtype, rows, e->n, e->k, r) +
                       ms_cluster_gemm_time(c, pb->dtype, rows, e->k, e->n, r);
            double gemm = g * frac * (bwd ? 2 : 1);
            double bytes = kernel_bytes(pb, e), per = c->score_bytes[bwd ? 1 : 0];
            if (!c->flash_attention && per > 0) {
                /* the stack's unfused kernels move each score `per` bytes (the whole square:
                 * the mask is applied inside the softmax), where the engine's kernel writes or
                 * reads it once */
                double own = pb->dtype == MS_PLAN_BF16 ? 2 : 4;
                bytes += (double)e->m * e->n * e->n * (per - own);
            }
            double soft = ms_cluster_elementwise_time(
                c, MS_OPRATE_SOFTMAX, (double)e->m * e->n * e->n * frac * 4, bytes, r);
            return gemm + soft;
        }
        default:
            return ms_cluster_elementwise_time(c, (ms_oprate)e->rate, e->flops, kernel_bytes(pb, e),
                                               r);
    }
}

static double coll_time(const ms_plan_problem *pb, const ms_strategy *s, const wk_coll *e,
                        double gap_s) {
    ms_group_place g = place(pb, s, (ms_plan_dim)e->dim, e->group);
    return ms_cluster_coll_time(pb->cluster, (ms_coll_kind)e->kind, g, e->bytes, pb->devices,
                                e->when == WK_IN_MB ? gap_s : -1);
}

static void price(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_workload *w,
                  const ms_plan_scales *sc, ms_plan_estimate *out) {
    const ms_cluster *c = pb->cluster;
    int mb, n_micro;
    micro(pb, s, &mb, &n_micro);
    double cls_mb[MS_PC_COUNT] = {0}, dim_mb[MS_PLAN_DIM_COUNT] = {0};
    double grad[MS_PLAN_DIM_COUNT] = {0}, stepc[MS_PLAN_DIM_COUNT] = {0};
    double bwd_mb = 0, fwd_mb = 0, wgrad_mb = 0;
    const bool causal = causal_attention(pb, s);
    for (int i = 0; i < w->nk; i++) {
        const wk_kernel *e = &w->k[i];
        const double scale = in_step(pb, e) * e->count * sc->compute[e->cls];
        double t = kernel_time(pb, e, causal) * scale;
        cls_mb[e->cls] += t;
        if (e->phase == WK_BWD) bwd_mb += t;
        if (e->phase == WK_FWD) fwd_mb += t;
        if (e->phase == WK_BWD && e->cls == MS_PC_GEMM) /* the weight gradient dB = A^T dC */
            wgrad_mb += ms_cluster_gemm_time(c, pb->dtype, e->k, e->n, e->m, pb->devices) * scale;
    }
    /* collectives inside the micro-batch arrive from compute: on average this much of it */
    double kernels_mb = 0, calls_mb = 0, bus_mb = 0;
    for (int k = 0; k < MS_PC_COUNT; k++) kernels_mb += cls_mb[k];
    for (int i = 0; i < w->nc; i++)
        if (w->c[i].when == WK_IN_MB) {
            const wk_coll *e = &w->c[i];
            calls_mb += e->count;
            double f =
                e->kind == MS_COLL_P2P ? 1 : ms_coll_busbw_factor((ms_coll_kind)e->kind, e->group);
            bus_mb += e->count * e->bytes * f;
        }
    double gap = calls_mb > 0 ? kernels_mb / calls_mb : 0;
    for (int i = 0; i < w->nc; i++) {
        const wk_coll *e = &w->c[i];
        double t = coll_time(pb, s, e, gap) * e->count * sc->comm[e->dim];
        double *to = e->when == WK_IN_MB ? dim_mb : e->when == WK_GRAD ? grad : stepc;
        to[e->dim] += t;
        out->comm_bytes[e->dim] += e->bytes * e->count * (e->when == WK_IN_MB ? n_micro : 1);
    }
    w->bwd_mb_s = bwd_mb;
    double m = n_micro, t_mb = 0, kernels = 0;
    for (int k = 0; k < MS_PC_COUNT; k++) t_mb += cls_mb[k], kernels += cls_mb[k];
    for (int d = 0; d < MS_PLAN_DIM_COUNT; d++) t_mb += dim_mb[d];
    for (int k = 0; k < MS_PC_COUNT; k++) out->compute_s[k] = cls_mb[k] * m;
    out->bubble_s = 0;
    if (s->pp > 1 && t_mb > 0) {
        /* the bubble: the pipeline simulator runs the schedule with this stage's forward,
         * input-gradient and weight-gradient times (recompute runs in the backward; the
         * micro-batch's collectives are shared out in proportion) */
        double f = kernels > 0 ? fwd_mb / kernels : 0.5, wg = kernels > 0 ? wgrad_mb / kernels : 0;
        double frac =
            bubble_fraction(pb->memo, s, n_micro, f * t_mb, (1 - f - wg) * t_mb, wg * t_mb);
        out->bubble_s = m * t_mb * frac / (1 - frac);
        /* Thread ranks that share cores (cpu-local, share = ranks / cores > 1) run at 1/share
         * of a core while all are busy; a rank idle in its bubble hands its core to the busy
         * ones, which then run faster. The step is then the longer of the CPU work spread
         * over all cores (every rank's m micro-batches at the shared speed) and the schedule's
         * critical path at full speed (busy time and bubble, each 1/share as long). */
        double share = ms_cluster_share(c, pb->devices);
        if (share > 1) {
            double busy = m * t_mb, path = (busy + out->bubble_s) / share;
            out->bubble_s = path > busy ? path - busy : 0;
        }
    }
    double exposed_grad = 0;
    for (int d = 0; d < MS_PLAN_DIM_COUNT; d++) {
        /* gradients: the schedule hides up to dp_overlap of them behind the last backward
         * (with buckets, the share measured on this job once the advisor has seen it), never
         * the last layer's bucket */
        double total = grad[d], hidden = 0;
        double overlap = s->bucket_mb > 0 && sc->dp_overlap >= 0 ? sc->dp_overlap : c->dp_overlap;
        if (total > 0 && overlap > 0) {
            hidden = overlap * total;
            if (hidden > bwd_mb) hidden = bwd_mb;
            double last = total / (w->layers_per_stage > 0 ? w->layers_per_stage : 1);
            if (total - hidden < last) hidden = total - last;
            if (hidden < 0) hidden = 0;
        }
        out->comm_total_s[d] = dim_mb[d] * m + total + stepc[d];
        out->comm_s[d] = dim_mb[d] * m + (total - hidden) + stepc[d];
        exposed_grad += total - hidden + stepc[d];
    }
    /* the optimizer and its companions, once per step */
    int r = pb->devices;
    double opt =
        ms_cluster_elementwise_time(c, MS_OPRATE_ADAMW, 12 * w->opt_elems, 28 * w->opt_elems, r) +
        ms_cluster_elementwise_time(c, MS_OPRATE_SUMSQ, 2 * w->norm_elems, 4 * w->norm_elems, r) +
        ms_cluster_elementwise_time(c, MS_OPRATE_STREAM, w->norm_elems, 8 * w->norm_elems, r) +
        ms_cluster_elementwise_time(c, MS_OPRATE_MEMSET, 0, w->zero_bytes * m, r);
    opt *= sc->compute[MS_PC_OPTIMIZER];
    out->compute_s[MS_PC_OPTIMIZER] += opt;
    /* oversubscribed thread ranks meet at the end of each forward, at the start of each
     * gradient reduction and at the gradient norm */
    out->sync_s = (2 * m + 1) * ms_cluster_sync_phase(c, pb->devices) * sc->sync;
    out->mb_coll_calls = calls_mb * m;
    out->mb_coll_bus_bytes = bus_mb * m;
    out->overhead_s = c->step_overhead + out->sync_s + sc->overhead_s;
    out->step_s = m * t_mb + out->bubble_s + exposed_grad + opt + out->overhead_s;
}

/* --- the memo ----------------------------------------------------------------------------------
 */

ms_plan_memo *ms_plan_memo_create(void) {
    return xcalloc(1, sizeof(ms_plan_memo));
}

struct ms_plan_cache *ms_plan_memo_plans(ms_plan_memo *m) {
    if (!m->plans) m->plans = ms_plan_cache_create();
    return m->plans;
}

void ms_plan_memo_destroy(ms_plan_memo *m) {
    if (!m) return;
    ms_plan_cache_destroy(m->plans);
    for (memo_entry *e = m->head, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    for (int i = 0; i < BUBBLE_BUCKETS; i++)
        for (bubble_entry *e = m->bubbles[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    for (stage_entry *e = m->stages, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    free(m);
}

static bool same_model(const ms_model_config *a, const ms_model_config *b) {
    return ms_lm_same_model(a, b);
}

/* Whether two defs are one model: the same hooks and user data, name, blocks and inputs. */
static bool same_def(const ms_model_def *a, const ms_model_def *b) {
    return a->hooks == b->hooks && a->user == b->user && a->n_blocks == b->n_blocks &&
           a->ninputs == b->ninputs && !strcmp(a->name, b->name) && !strcmp(a->tied, b->tied) &&
           !memcmp(a->inputs, b->inputs, sizeof a->inputs[0] * (size_t)a->ninputs);
}

/* Whether a memo entry is of the problem's model. */
static bool same_problem_model(const memo_entry *e, const ms_plan_problem *pb) {
    const ms_model_def *d = ms_plan_user_def(pb);
    if (d) return e->has_def && same_def(&e->def, d);
    return !e->has_def && same_model(&e->model, &pb->model);
}

static int memo_stage_layers(ms_plan_memo *memo, const ms_model_config *c, int p, int v) {
    for (stage_entry *e = memo ? memo->stages : NULL; e; e = e->next)
        if (e->p == p && e->v == v && same_model(&e->model, c)) return e->most;
    int most = balanced_stage_layers(c, p, v);
    if (memo) {
        stage_entry *e = xmalloc(sizeof *e);
        *e = (stage_entry){.model = *c, .p = p, .v = v, .most = most, .next = memo->stages};
        memo->stages = e;
    }
    return most;
}

/* The engine workload of s, compiled once per memo. */
static ms_status engine_cached(const ms_plan_problem *pb, const ms_strategy *s,
                               const ms_plan_workload **w, const ms_plan_engine_stats **st,
                               ms_plan_workload *scratch, ms_plan_engine_stats *scratch_st,
                               ms_error *err) {
    ms_plan_memo *m = pb->rules ? NULL : pb->memo; /* the memo's key has no rules */
    for (memo_entry *e = m ? m->head : NULL; e; e = e->next)
        if (same_problem_model(e, pb) && e->batch == pb->global_batch && e->seq == pb->seq &&
            ms_strategy_equal(&e->s, s)) {
            *w = &e->w;
            *st = &e->st;
            return MS_OK;
        }
    if (!m) {
        MS_CHECK(wk_from_engine(pb, s, scratch, scratch_st, err));
        *w = scratch;
        *st = scratch_st;
        return MS_OK;
    }
    memo_entry *e = xcalloc(1, sizeof *e);
    ms_status st2 = wk_from_engine(pb, s, &e->w, &e->st, err);
    if (st2 != MS_OK) {
        free(e);
        return st2;
    }
    e->model = pb->model;
    if (ms_plan_user_def(pb)) e->has_def = true, e->def = *ms_plan_user_def(pb);
    e->batch = pb->global_batch;
    e->seq = pb->seq;
    e->s = *s;
    e->next = m->head;
    m->head = e;
    *w = &e->w;
    *st = &e->st;
    return MS_OK;
}

/* Whether the engine's program may be compiled for this problem (small enough to build here). */
static bool engine_sized(const ms_plan_problem *pb) {
    if (ms_plan_user_def(pb)) return true; /* no closed form: its program is all there is */
    if (pb->engine_any_size && pb->engine_workloads) return true;
    double params = ms_plan_model_params(&pb->model);
    double act = (double)pb->global_batch * pb->seq * pb->model.n_embd * pb->model.n_layer * 40.0;
    return pb->engine_workloads && params * 4 < (1u << 30) && act < 4.0 * (1u << 30);
}

ms_status ms_plan_engine_stats_get(const ms_plan_problem *pb, const ms_strategy *s,
                                   ms_plan_engine_stats *out, ms_error *err) {
    ms_plan_problem rp = ms_plan_problem_resolved(pb);
    pb = &rp;
    MS_CHECK(ms_plan_check(pb, s, err));
    ms_plan_workload *scratch = xmalloc(sizeof *scratch);
    const ms_plan_workload *w;
    const ms_plan_engine_stats *st;
    ms_plan_engine_stats tmp;
    ms_status rc = engine_cached(pb, s, &w, &st, scratch, &tmp, err);
    if (rc == MS_OK) *out = *st;
    free(scratch);
    return rc;
}

/* A program's own model's FLOPs per step: its whole program on one rank (no recompute) over the
 * global batch, forward and backward, compiled once per memo: what the model computes, however
 * a strategy splits or repeats it. 0 when it does not compile. */
static double def_model_flops(const ms_plan_problem *pb) {
    ms_strategy whole;
    ms_strategy_defaults(&whole);
    ms_plan_workload *scratch = xmalloc(sizeof *scratch);
    const ms_plan_workload *w;
    const ms_plan_engine_stats *st;
    ms_plan_engine_stats tmp;
    ms_error err = {0};
    double flops = engine_cached(pb, &whole, &w, &st, scratch, &tmp, &err) == MS_OK ? st->flops : 0;
    free(scratch);
    return flops;
}

ms_status ms_plan_estimate_one(const ms_plan_problem *problem, const ms_strategy *s,
                               const ms_plan_scales *scales, ms_plan_estimate *out, ms_error *err) {
    ms_status st = ms_plan_estimate_unnamed(problem, s, scales, out, err);
    if (st == MS_OK) ms_strategy_name(&out->s, out->text, sizeof out->text);
    return st;
}

ms_status ms_plan_estimate_unnamed(const ms_plan_problem *problem, const ms_strategy *s,
                                   const ms_plan_scales *scales, ms_plan_estimate *out,
                                   ms_error *err) {
    memset(out, 0, sizeof *out);
    /* priced at the strategy's own precision */
    ms_plan_problem at = ms_plan_problem_resolved(problem);
    MS_CHECK(ms_plan_check(&at, s, err));
    const bool user = ms_plan_user_def(&at) != NULL;
    at.dtype = s->precision == MS_PRECISION_BF16 ? MS_PLAN_BF16 : MS_PLAN_FP32;
    const ms_plan_problem *pb = &at;
    ms_plan_scales id;
    if (!scales) {
        ms_plan_scales_identity(&id);
        scales = &id;
    }
    out->s = *s;
    out->executable = ms_plan_executable(pb, s, out->not_executable, sizeof out->not_executable);
    ms_plan_workload *w = xmalloc(sizeof *w);
    ms_status st = MS_OK;
    if ((out->executable || user) && engine_sized(pb)) {
        const ms_plan_workload *cw;
        const ms_plan_engine_stats *es;
        ms_plan_engine_stats tmp;
        st = engine_cached(pb, s, &cw, &es, w, &tmp, err);
        if (st != MS_OK) {
            free(w);
            return st;
        }
        if (cw != w) memcpy(w, cw, sizeof *w);
        out->from_engine = true;
    } else {
        wk_analytic(pb, s, w);
    }
    price(pb, s, w, scales, out);
    if (s->offload) ms_plan_offload_price(pb, s, w, scales, out);
    out->tokens_per_s = (double)pb->global_batch * pb->seq / out->step_s;
    out->model_flops =
        user ? def_model_flops(pb) : ms_plan_model_flops(&pb->model, pb->global_batch, pb->seq);
    out->hw_flops = w->hw_flops_step;
    out->model_tflops_per_device = out->model_flops / out->step_s / pb->devices / 1e12;
    out->hw_tflops_per_device = out->hw_flops / out->step_s / pb->devices / 1e12;
    out->mem_params = w->mem_params;
    out->mem_grads = w->mem_grads;
    out->mem_optim = w->mem_optim;
    out->mem_act = w->mem_act;
    out->mem_other = w->mem_other;
    out->mem_total = w->mem_params + w->mem_grads + w->mem_optim + w->mem_act + w->mem_other;
    const ms_cluster *c = pb->cluster;
    out->mem_cap = c->mem_bytes * c->usable_memory_fraction / (c->cpu ? pb->devices : 1);
    out->fits = out->mem_total <= out->mem_cap && out->mem_host <= out->mem_host_cap;
    free(w);
    return st;
}

ms_status ms_plan_tally_get(const ms_plan_problem *problem, const ms_strategy *s, bool closed_form,
                            ms_plan_tally *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    ms_plan_problem pb = ms_plan_problem_resolved(problem);
    MS_CHECK(ms_plan_check(&pb, s, err));
    if (closed_form && ms_plan_user_def(&pb))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s has no closed form: only its compiled program prices it",
                       ms_plan_user_def(&pb)->name);
    pb.dtype = s->precision == MS_PRECISION_BF16 ? MS_PLAN_BF16 : MS_PLAN_FP32;
    ms_plan_workload *w = xmalloc(sizeof *w);
    ms_status st = MS_OK;
    if (closed_form)
        wk_analytic(&pb, s, w);
    else
        st = wk_from_engine(&pb, s, w, NULL, err);
    if (st == MS_OK) {
        int mb, m;
        micro(&pb, s, &mb, &m);
        out->flops = wk_flops(w) * m;
        for (int i = 0; i < w->nc; i++) {
            const wk_coll *e = &w->c[i];
            double calls = e->count * (e->when == WK_IN_MB ? m : 1);
            out->coll_bytes[e->dim][e->kind] += e->bytes * calls;
            out->coll_calls[e->dim][e->kind] += calls;
        }
        out->mem_params = w->mem_params, out->mem_grads = w->mem_grads;
        out->mem_optim = w->mem_optim, out->mem_act = w->mem_act;
    }
    free(w);
    return st;
}

double ms_plan_model_params(const ms_model_config *c) {
    ms_lm_layout f;
    ms_lm_layout_of(c, 1, 0, &f);
    double wte = (double)f.vocab * f.h;
    return c->n_layer * ms_lm_layout_layer_params(&f, 1) + ms_lm_layout_first_params(&f, 1, false) +
           ms_lm_layout_last_params(&f, 1, false) - (f.tied ? wte : 0);
}

/* cost.c - strategies, the closed-form workload, pricing a workload on a cluster, memory. */
#include "engine/plan/cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/kernels/kernels.h"
#include "engine/ops/op.h"
#include "engine/pipeline/simulate.h"
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

bool ms_plan_executable(const ms_plan_problem *pb, const ms_strategy *s, char *why, size_t len) {
    char dummy[8];
    if (!why) why = dummy, len = sizeof dummy;
    why[0] = '\0';
    if (strcmp(pb->cluster->backend, "threads")) {
        snprintf(why, len, "this engine trains on thread ranks (cpu-local) only, not on %s",
                 pb->cluster->name);
        return false;
    }
    ms_error e = {0};
    ms_job_shape job = ms_plan_job(pb);
    if (ms_strategy_validate(s, &pb->model, &job, 0, &e) == MS_OK) return true;
    snprintf(why, len, "%s", e.msg);
    return false;
}

/* The micro-batch size and count of a checked strategy. */
static void micro(const ms_plan_problem *pb, const ms_strategy *s, int *size, int *count) {
    if (!ms_strategy_micro(s, pb->global_batch, size, count)) *size = *count = 1;
}

/* Layers on the busiest pipeline stage. */
static int stage_layers(const ms_plan_problem *pb, const ms_strategy *s) {
    int most = 0;
    for (int i = 0; i < MS_STRATEGY_MAX_STAGES && s->pp_layers[i]; i++)
        most = s->pp_layers[i] > most ? s->pp_layers[i] : most;
    return most ? most : pb->model.n_layer / s->pp;
}

/* --- closed-form quantities ------------------------------------------------------------------- */

double ms_plan_model_flops(const ms_model_config *c, double batch, double seq) {
    double h = c->n_embd, l = c->n_layer, V = c->vocab_size, s = seq;
    /* per layer and token: 24 h^2 (qkv 6, projection 2, MLP 16) + 4 s h (scores and values),
     * forward; backward twice that; the logits 2 h V forward, 6 h V in all */
    return 72.0 * batch * s * l * h * h * (1 + s / (6 * h)) + 6.0 * batch * s * h * V;
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

/* A linear layer x[m, k] @ W[k, n] through the matmul op's own cost function. */
static void add_gemm(ms_plan_workload *w, int64_t m, int64_t n, int64_t k, bool rc, double count) {
    ms_k_gemm g = {.batch = 1, .m = m, .n = n, .k = k, .bcast_b = true};
    ms_k_cost f = ms_k_matmul_cost(&g, false, false, true, true);
    ms_k_cost b = ms_k_matmul_cost(&g, true, false, true, true);
    wk_kernel_add(w, MS_PC_GEMM, MS_OPRATE_STREAM, WK_FWD, MS_OP_MATMUL, m, n, k, f.flops, f.bytes,
                  count);
    wk_kernel_add(w, MS_PC_GEMM, MS_OPRATE_STREAM, WK_BWD, MS_OP_MATMUL, m, n, k, b.flops, b.bytes,
                  count);
    if (rc)
        wk_kernel_add(w, MS_PC_GEMM, MS_OPRATE_STREAM, WK_RECOMPUTE, MS_OP_MATMUL, m, n, k, f.flops,
                      f.bytes, count);
}

static void add_elt(ms_plan_workload *w, ms_oprate rate, int op, ms_k_cost f, ms_k_cost b, bool rc,
                    double count) {
    wk_kernel_add(w, MS_PC_ELEMENTWISE, rate, WK_FWD, op, 0, 0, 0, f.flops, f.bytes, count);
    wk_kernel_add(w, MS_PC_ELEMENTWISE, rate, WK_BWD, op, 0, 0, 0, b.flops, b.bytes, count);
    if (rc)
        wk_kernel_add(w, MS_PC_ELEMENTWISE, rate, WK_RECOMPUTE, op, 0, 0, 0, f.flops, f.bytes,
                      count);
}

/* Local parameters of one transformer layer under tp (column-parallel qkv and fc with their
 * biases, row-parallel projections; norms and row-parallel biases replicated). */
static double layer_params_local(double h, int t) {
    return (12 * h * h + 7 * h) / t + 6 * h;
}

/* The Megatron-LM layout in closed form, one micro-batch on the busiest stage (its layers,
 * the head, and the embedding when pp = 1), with the same kernels the engine's GPT runs. */
/* What the parts of the closed-form workload share: the strategy's shapes on one device. */
typedef struct analytic {
    const ms_plan_problem *pb;
    const ms_strategy *s;
    ms_plan_workload *w;
    int t, cp, p, mb, n_micro;
    bool rc, sel, vp; /* full recompute, selective recompute, vocab-parallel head */
    int64_t h, a, V, S, b, tok, tok_sp;
    double ab, L; /* activation bytes; layers on the busiest stage */
    double emb;   /* the embedding on the busiest stage: 1 when pp = 1 */
    double f_layers, f_head;
} analytic;

/* One layer's kernels, L times. */
static void analytic_layers(analytic *z) {
    ms_plan_workload *w = z->w;
    const ms_cluster *cl = z->pb->cluster;
    const int64_t t = z->t, h = z->h, tok = z->tok, tok_sp = z->tok_sp, b = z->b, S = z->S;
    const bool rc = z->rc;
    const double L = z->L;
    add_elt(w, MS_OPRATE_LAYERNORM, MS_OP_LAYERNORM, ms_k_layernorm_cost(tok_sp, h, false),
            ms_k_layernorm_cost(tok_sp, h, true), rc, 2 * L);
    add_gemm(w, tok, 3 * h / t, h, rc, L); /* c_attn */
    add_elt(w, MS_OPRATE_BIAS, MS_OP_BIAS, /* its bias */
            ms_k_elementwise_cost(MS_K_BIAS_ADD, tok * 3 * h / t, 3 * h / t, false),
            ms_k_elementwise_cost(MS_K_BIAS_ADD, tok * 3 * h / t, 3 * h / t, true), rc, L);
    {
        /* attention over whole sequences on a / (t cp) heads (cp moves heads in) */
        int64_t lh = z->a / (t * z->cp), cl_ch = h / (t * z->cp);
        ms_k_cost f = ms_k_attention_cost(b, S, cl_ch, lh, cl->causal_skip, false);
        ms_k_cost bw = ms_k_attention_cost(b, S, cl_ch, lh, cl->causal_skip, true);
        if (cl->flash_attention) {
            /* scores stay on chip: only q, k, v and the output move */
            double qkvo = 4.0 * (double)b * S * (3.0 * cl_ch + cl_ch);
            f.bytes = qkvo;
            bw.bytes = 2 * qkvo;
        }
        int64_t hs = h / z->a;
        wk_kernel_add(w, MS_PC_ATTENTION, MS_OPRATE_SOFTMAX, WK_FWD, MS_OP_ATTENTION, b * lh, S, hs,
                      f.flops, f.bytes, L);
        wk_kernel_add(w, MS_PC_ATTENTION, MS_OPRATE_SOFTMAX, WK_BWD, MS_OP_ATTENTION, b * lh, S, hs,
                      bw.flops, bw.bytes, L);
        if (rc || z->sel)
            wk_kernel_add(w, MS_PC_ATTENTION, MS_OPRATE_SOFTMAX, WK_RECOMPUTE, MS_OP_ATTENTION,
                          b * lh, S, hs, f.flops, f.bytes, L);
    }
    add_gemm(w, tok, h, h / t, rc, L);     /* attn.c_proj */
    add_gemm(w, tok, 4 * h / t, h, rc, L); /* mlp.c_fc */
    add_gemm(w, tok, h, 4 * h / t, rc, L); /* mlp.c_proj */
    add_elt(w, MS_OPRATE_BIAS, MS_OP_BIAS, /* c_fc bias */
            ms_k_elementwise_cost(MS_K_BIAS_ADD, tok * 4 * h / t, 4 * h / t, false),
            ms_k_elementwise_cost(MS_K_BIAS_ADD, tok * 4 * h / t, 4 * h / t, true), rc, L);
    add_elt(w, MS_OPRATE_GELU, MS_OP_GELU,
            ms_k_elementwise_cost(MS_K_GELU, tok * 4 * h / t, 0, false),
            ms_k_elementwise_cost(MS_K_GELU, tok * 4 * h / t, 0, true), rc, L);
    add_elt(w, MS_OPRATE_BIAS, MS_OP_BIAS, /* the two projection biases, on the stream */
            ms_k_elementwise_cost(MS_K_BIAS_ADD, tok_sp * h, h, false),
            ms_k_elementwise_cost(MS_K_BIAS_ADD, tok_sp * h, h, true), rc, 2 * L);
    add_elt(w, MS_OPRATE_STREAM, MS_OP_ADD, ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, false),
            ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, true), rc, 2 * L);
    if (z->pb->model.resid_pdrop > 0)
        add_elt(w, MS_OPRATE_DROPOUT, MS_OP_DROPOUT, ms_k_dropout_cost(tok_sp * h, false),
                ms_k_dropout_cost(tok_sp * h, true), rc, 2 * L);
    z->f_layers = wk_flops(w);
}

/* The head (last stage) and the embedding (first stage; on the busiest one only when pp = 1). */
static void analytic_ends(analytic *z) {
    ms_plan_workload *w = z->w;
    const int64_t h = z->h, tok = z->tok, tok_sp = z->tok_sp;
    const int64_t vl = z->vp ? z->V / z->t : z->V;
    add_elt(w, MS_OPRATE_LAYERNORM, MS_OP_LAYERNORM, ms_k_layernorm_cost(tok_sp, h, false),
            ms_k_layernorm_cost(tok_sp, h, true), false, 1);
    add_gemm(w, tok, vl, h, false, 1);
    add_elt(w, MS_OPRATE_XENT, MS_OP_XENT, ms_k_xent_cost(tok, vl, false),
            ms_k_xent_cost(tok, vl, true), false, 1);
    z->f_head = wk_flops(w) - z->f_layers;
    add_elt(w, MS_OPRATE_EMBEDDING, MS_OP_EMBEDDING, ms_k_embedding_cost(tok, h, false),
            ms_k_embedding_cost(tok, h, true), false, 2 * z->emb);
    add_elt(w, MS_OPRATE_STREAM, MS_OP_ADD, ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, false),
            ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, true), false, z->emb);
}

/* The collectives inside a micro-batch: tp's, cp's and the pipeline's transfers. */
static void analytic_mb_collectives(const analytic *z) {
    ms_plan_workload *w = z->w;
    const int t = z->t, cp = z->cp;
    const double L = z->L, emb = z->emb;
    double x = (double)z->tok * z->h * z->ab; /* one tp-replicated activation */
    double passes_f = z->rc ? 2 : 1;          /* forward collectives run again under recompute */
    if (t > 1) {
        if (!z->s->sp) {
            wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, x, 2 * L * (passes_f + 1));
            wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, x, emb + 1); /* emb, head */
        } else {
            wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, 2 * L * (passes_f + 1));
            wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x,
                        2 * L * (passes_f + 1));
            wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_TP, WK_IN_MB, t, x, emb + 1);
            wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_TP, WK_IN_MB, t, x, emb + 1);
        }
        if (z->vp) /* row max, sum of exponentials, target logit */
            wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_TP, WK_IN_MB, t, (double)z->tok * 4, 3);
    }
    if (cp > 1) {
        /* sequence-sharded qkv to head-sharded and back, forward and backward */
        double qkv = (double)z->tok * 3 * z->h / t * z->ab, o = (double)z->tok * z->h / t * z->ab;
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_CP, WK_IN_MB, cp, qkv, L * (passes_f + 1));
        wk_coll_add(w, MS_COLL_ALL_TO_ALL, MS_PLAN_CP, WK_IN_MB, cp, o, L * (passes_f + 1));
    }
    if (z->p > 1) /* activations forward and gradients backward, scatter-gathered over tp; once
                   * per model chunk with virtual stages */
        wk_coll_add(w, MS_COLL_P2P, MS_PLAN_PP, WK_IN_MB, z->p, x / t, 2.0 * z->s->virtual_stages);
}

/* Parameters on the busiest stage, their gradients' collectives (by ZeRO stage) and the
 * state's memory. */
static void analytic_state(const analytic *z) {
    ms_plan_workload *w = z->w;
    const ms_plan_problem *pb = z->pb;
    const ms_strategy *s = z->s;
    double lp = layer_params_local((double)z->h, z->t);
    double wte = (double)z->V * z->h / (z->vp ? z->t : 1),
           wpe = (double)pb->model.n_positions * z->h;
    double first = z->L * lp + wte + wpe, last = z->L * lp + 2.0 * z->h + (z->p > 1 ? wte : 0);
    double psi = first > last ? first : last;
    int nd = s->dp * s->cp, nz = s->dp; /* gradients reduce over dp x cp; ZeRO shards over dp */
    double gb = pb->dtype == MS_PLAN_BF16 ? 2 : 4;
    double m = z->n_micro;
    if (nd > 1) {
        double g = psi * gb, wbytes = psi * (pb->dtype == MS_PLAN_BF16 ? 2 : 4);
        switch (s->zero) {
            case 0:
                wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_DP, WK_GRAD, nd, g, 1);
                break;
            case 1:
                wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_DP, WK_GRAD, nd, g, 1);
                wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, nd, wbytes, 1);
                break;
            case 2:
                wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_DP, WK_GRAD, nd, g, m);
                wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, nd, wbytes, 1);
                break;
            default: /* parameters gathered for forward and backward, every micro-batch */
                wk_coll_add(w, MS_COLL_REDUCE_SCATTER, MS_PLAN_DP, WK_GRAD, nd, g, m);
                wk_coll_add(w, MS_COLL_ALL_GATHER, MS_PLAN_DP, WK_GRAD, nd, wbytes, 2 * m);
                break;
        }
    }
    if (z->p > 1) /* the tied embedding's gradient between the first and the last stage */
        wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_PP, WK_GRAD, 2, wte * gb, 1);
    wk_coll_add(w, MS_COLL_ALL_REDUCE, MS_PLAN_WORLD, WK_STEP, pb->devices, 8, 1);
    ms_plan_zero_memory(psi, nz, s->zero, pb->dtype, &w->mem_params, &w->mem_grads, &w->mem_optim);
    w->opt_elems = s->zero >= 1 ? psi / nz : psi;
    w->norm_elems = s->zero >= 2 ? psi / nz : psi;
    w->zero_bytes = (s->zero >= 2 ? psi / nz : psi) * gb;
}

/* Activations in flight on the first (or, when larger, the last) stage. */
static void analytic_activations(const analytic *z) {
    const ms_cluster *cl = z->pb->cluster;
    const ms_strategy *s = z->s;
    double S = (double)z->S, b = (double)z->b, h = (double)z->h, a = (double)z->a;
    double layer = ms_plan_layer_activation_bytes(S, b, h, a, z->t, s->sp, z->cp, z->rc,
                                                  cl->flash_attention || z->sel, z->pb->dtype);
    double in_flight = s->schedule == MS_SCHEDULE_GPIPE ? z->n_micro
                       : z->p < z->n_micro              ? z->p
                                                        : z->n_micro;
    double act_first = z->L * layer * in_flight;
    if (z->rc)
        act_first += ms_plan_layer_activation_bytes(S, b, h, a, z->t, s->sp, z->cp, false,
                                                    cl->flash_attention, z->pb->dtype);
    const int64_t vl = z->vp ? z->V / z->t : z->V;
    double logits = 2.0 * (double)z->tok * vl * 4; /* fp32 logits and their gradient */
    double act_last = z->L * layer + logits;
    z->w->mem_act = z->p == 1 ? act_first + logits : (act_first > act_last ? act_first : act_last);
}

static void wk_analytic(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_workload *w) {
    wk_reset(w);
    analytic z = {.pb = pb, .s = s, .w = w, .t = s->tp, .cp = s->cp, .p = s->pp};
    z.rc = s->recompute == MS_RECOMPUTE_FULL;
    z.sel = s->recompute == MS_RECOMPUTE_SELECTIVE; /* attention's core again */
    z.vp = z.t > 1 && !s->vocab_replicated;
    micro(pb, s, &z.mb, &z.n_micro);
    const ms_model_config *c = &pb->model;
    z.h = c->n_embd, z.a = c->n_head, z.V = c->vocab_size, z.S = pb->seq;
    z.b = z.mb;
    z.tok = z.b * z.S / z.cp;                 /* rows of a tp-replicated activation */
    z.tok_sp = s->sp ? z.tok / z.t : z.tok;   /* rows of the residual stream */
    z.ab = pb->dtype == MS_PLAN_BF16 ? 2 : 4; /* activation bytes */
    z.L = stage_layers(pb, s);
    z.emb = z.p == 1 ? 1 : 0;
    w->layers_per_stage = stage_layers(pb, s);
    analytic_layers(&z);
    analytic_ends(&z);
    analytic_mb_collectives(&z);
    analytic_state(&z);
    analytic_activations(&z);
    /* hardware FLOPs of the step over every device: layers on every stage, the head and the
     * embedding once per pipeline */
    const int64_t tok = z.tok, tok_sp = z.tok_sp, h = z.h;
    ms_k_cost ef = ms_k_embedding_cost(tok, h, false), eb = ms_k_embedding_cost(tok, h, true);
    double f_emb = 2 * (ef.flops + eb.flops) +
                   ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, false).flops +
                   ms_k_elementwise_cost(MS_K_ADD, tok_sp * h, 0, true).flops;
    double per_device_mb = z.f_layers * ((double)c->n_layer / z.p / z.L) + (z.f_head + f_emb) / z.p;
    w->hw_flops_step = per_device_mb * z.n_micro * pb->devices;
}

/* --- the memo's parts ------------------------------------------------------------------------- */

typedef struct memo_entry {
    ms_model_config model;
    int batch, seq;
    ms_strategy s;
    ms_plan_workload w;
    ms_plan_engine_stats st;
    struct memo_entry *next;
} memo_entry;

/* A simulated bubble fraction. 1f1b, gpipe and interleaved pair their transfer batches so
 * that the fraction does not depend on how a micro-batch splits into F, B and W
 * (test_pp_schedule checks four splits): they are keyed by (schedule, pp, m, v) alone, so a
 * search simulates each once; zb-h1 is keyed by its split too. */
typedef struct bubble_entry {
    int kind, p, m, v;
    double f, w; /* zb-h1: the forward's and the weight gradient's shares; else 0 */
    double frac;
    struct bubble_entry *next;
} bubble_entry;

#define BUBBLE_BUCKETS 256

struct ms_plan_memo {
    memo_entry *head;
    bubble_entry *bubbles[BUBBLE_BUCKETS];
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

static double kernel_time(const ms_plan_problem *pb, const wk_kernel *e) {
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
             * the softmax and its traffic as an elementwise kernel */
            double frac = c->causal_skip ? 0.5 : 1.0;
            double g = ms_cluster_gemm_time(c, pb->dtype, e->n, e->n, e->k, r) +
                       ms_cluster_gemm_time(c, pb->dtype, e->n, e->k, e->n, r);
            double gemm = (double)e->m * g * frac * (bwd ? 2 : 1);
            double soft = ms_cluster_elementwise_time(
                c, MS_OPRATE_SOFTMAX, (double)e->m * e->n * e->n * frac * 4, e->bytes, r);
            return gemm + soft;
        }
        default:
            return ms_cluster_elementwise_time(c, (ms_oprate)e->rate, e->flops, e->bytes, r);
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
    for (int i = 0; i < w->nk; i++) {
        const wk_kernel *e = &w->k[i];
        double t = kernel_time(pb, e) * e->count * sc->compute[e->cls];
        cls_mb[e->cls] += t;
        if (e->phase == WK_BWD) bwd_mb += t;
        if (e->phase == WK_FWD) fwd_mb += t;
        if (e->phase == WK_BWD && e->cls == MS_PC_GEMM) /* the weight gradient dB = A^T dC */
            wgrad_mb += ms_cluster_gemm_time(c, pb->dtype, e->k, e->n, e->m, pb->devices) *
                        e->count * sc->compute[e->cls];
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
        /* gradients: the schedule hides up to dp_overlap of them behind the last backward,
         * never the last layer's bucket */
        double total = grad[d], hidden = 0;
        if (total > 0 && c->dp_overlap > 0) {
            hidden = c->dp_overlap * total;
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
    out->sync_s = (2 * m + 1) * ms_cluster_sync_phase(c, pb->devices);
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

void ms_plan_memo_destroy(ms_plan_memo *m) {
    if (!m) return;
    for (memo_entry *e = m->head, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    for (int i = 0; i < BUBBLE_BUCKETS; i++)
        for (bubble_entry *e = m->bubbles[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    free(m);
}

static bool same_model(const ms_model_config *a, const ms_model_config *b) {
    return a->model_type == b->model_type && a->n_layer == b->n_layer && a->n_head == b->n_head &&
           a->n_embd == b->n_embd && a->vocab_size == b->vocab_size &&
           a->n_positions == b->n_positions && a->resid_pdrop == b->resid_pdrop &&
           a->attn_pdrop == b->attn_pdrop && a->embd_pdrop == b->embd_pdrop;
}

/* The engine workload of s, compiled once per memo. */
static ms_status engine_cached(const ms_plan_problem *pb, const ms_strategy *s,
                               const ms_plan_workload **w, const ms_plan_engine_stats **st,
                               ms_plan_workload *scratch, ms_plan_engine_stats *scratch_st,
                               ms_error *err) {
    ms_plan_memo *m = pb->memo;
    for (memo_entry *e = m ? m->head : NULL; e; e = e->next)
        if (same_model(&e->model, &pb->model) && e->batch == pb->global_batch &&
            e->seq == pb->seq && ms_strategy_equal(&e->s, s)) {
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
    double params = ms_plan_param_count(&pb->model);
    double act = (double)pb->global_batch * pb->seq * pb->model.n_embd * pb->model.n_layer * 40.0;
    return pb->engine_workloads && params * 4 < (1u << 30) && act < 4.0 * (1u << 30);
}

ms_status ms_plan_engine_stats_get(const ms_plan_problem *pb, const ms_strategy *s,
                                   ms_plan_engine_stats *out, ms_error *err) {
    ms_job_shape job = ms_plan_job(pb);
    MS_CHECK(ms_strategy_check(s, &pb->model, &job, err));
    ms_plan_workload *scratch = xmalloc(sizeof *scratch);
    const ms_plan_workload *w;
    const ms_plan_engine_stats *st;
    ms_plan_engine_stats tmp;
    ms_status rc = engine_cached(pb, s, &w, &st, scratch, &tmp, err);
    if (rc == MS_OK) *out = *st;
    free(scratch);
    return rc;
}

ms_status ms_plan_estimate_one(const ms_plan_problem *problem, const ms_strategy *s,
                               const ms_plan_scales *scales, ms_plan_estimate *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    ms_job_shape job = ms_plan_job(problem);
    MS_CHECK(ms_strategy_check(s, &problem->model, &job, err));
    /* priced at the strategy's own precision */
    ms_plan_problem at = *problem;
    at.dtype = s->precision == MS_PRECISION_BF16 ? MS_PLAN_BF16 : MS_PLAN_FP32;
    const ms_plan_problem *pb = &at;
    ms_plan_scales id;
    if (!scales) {
        ms_plan_scales_identity(&id);
        scales = &id;
    }
    out->s = *s;
    ms_strategy_name(s, out->text, sizeof out->text);
    out->executable = ms_plan_executable(pb, s, out->not_executable, sizeof out->not_executable);
    ms_plan_workload *w = xmalloc(sizeof *w);
    ms_status st = MS_OK;
    if (out->executable && engine_sized(pb)) {
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
    out->tokens_per_s = (double)pb->global_batch * pb->seq / out->step_s;
    out->model_flops = ms_plan_model_flops(&pb->model, pb->global_batch, pb->seq);
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
    out->fits = out->mem_total <= out->mem_cap;
    free(w);
    return st;
}

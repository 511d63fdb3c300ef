/* workload.h - what one device does for one micro-batch (private to engine/plan): kernels
 * and collectives, from the engine's compiled program (engine_workload.c) or in closed form
 * (cost.c), priced by cost.c. */
#ifndef MS_PLAN_WORKLOAD_H
#define MS_PLAN_WORKLOAD_H

#include "engine/plan/cost.h"

#define WK_MAX_KERNELS 256
#define WK_MAX_COLLS   256

typedef enum wk_phase { WK_FWD, WK_BWD, WK_RECOMPUTE } wk_phase;

/* Collectives inside the micro-batch (tp, cp, pp: on the critical path, ranks arriving from
 * compute), once per step after the last backward (gradients), or elsewhere in the step. */
typedef enum wk_when { WK_IN_MB, WK_GRAD, WK_STEP } wk_when;

typedef struct wk_kernel {
    uint8_t cls;   /* ms_plan_class */
    uint8_t rate;  /* ms_oprate (elementwise) */
    uint8_t phase; /* wk_phase */
    int16_t op;    /* ms_op_kind, -1 for closed-form entries without one */
    /* GEMM: C[m, n] = A[m, k] B[k, n] (backward prices dA and dB); attention: m = batch x
     * local heads, n = sequence, k = head size (GQA: n keys, m x n query rows: queries on a cp
     * shard see the whole sequence) */
    int64_t m, n, k;
    double flops, bytes; /* one call, from the op's cost function */
    double count;        /* calls per micro-batch */
} wk_kernel;

typedef struct wk_coll {
    uint8_t kind; /* ms_coll_kind */
    uint8_t dim;  /* ms_plan_dim */
    uint8_t when; /* wk_when */
    int group;
    double bytes; /* nccl-tests convention */
    double count; /* per micro-batch (WK_IN_MB) or per step */
} wk_coll;

typedef struct ms_plan_workload {
    wk_kernel k[WK_MAX_KERNELS];
    int nk;
    wk_coll c[WK_MAX_COLLS];
    int nc;
    bool from_engine;
    /* per step, per device */
    double opt_elems;     /* parameters AdamW updates */
    double norm_elems;    /* gradient elements the norm reads (and clipping rescales) */
    double zero_bytes;    /* gradient bytes zeroed per micro-batch */
    double bwd_mb_s;      /* set by pricing: backward seconds of one micro-batch */
    double hw_flops_step; /* all devices */
    double mem_params, mem_grads, mem_optim, mem_act, mem_other;
    int layers_per_stage;
} ms_plan_workload;

void wk_reset(ms_plan_workload *w);
/* Adds (or merges into an identical entry) count calls of a kernel. */
void wk_kernel_add(ms_plan_workload *w, ms_plan_class cls, ms_oprate rate, wk_phase ph, int op,
                   int64_t m, int64_t n, int64_t k, double flops, double bytes, double count);
void wk_coll_add(ms_plan_workload *w, ms_coll_kind kind, ms_plan_dim dim, wk_when when, int group,
                 double bytes, double count);

/* The closed form for any checked strategy (cost.c), from the model family's description. */
void wk_analytic(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_workload *w);

/* The engine's program for an executable strategy (engine_workload.c). stats may be NULL. */
ms_status wk_from_engine(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_workload *w,
                         ms_plan_engine_stats *stats, ms_error *err);

#endif

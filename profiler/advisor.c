/* advisor.c - recalibrating the cost model from a running job and suggesting strategies. */
#include "profiler/advisor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/plan/auto_place.h"
#include "engine/plan/validate.h"

struct ms_advisor {
    ms_model_def def;    /* def.lm points at cfg for a built-in model */
    ms_model_config cfg; /* a built-in model's config */
    int world, batch, seq;
    double mem_cap; /* bytes per rank; 0: the cluster's usable memory shared by the ranks */
    ms_cluster cluster;
    ms_plan_memo *memo;
    ms_plan_scales scales;
    int updates;
    int off_rounds;           /* rounds in a row the model missed the measured step */
    char note[MS_LIVE_TEXT];  /* ms_advisor_note */
    ms_placement_rules rules; /* the job's current placement rules (n = 0, !no_hints: none) */
    /* The layout searched for one strategy, kept: the search compiles hundreds of layouts */
    bool searched, search_ok;
    ms_strategy searched_for;
    ms_auto_place_result *layout;
};

ms_status ms_advisor_create(const ms_model_def *def, int world, int batch, int seq,
                            const ms_cluster *cluster, ms_advisor **out, ms_error *err) {
    *out = NULL;
    if (!def->lm) seq = 1; /* a program's own model: a row is the unit */
    if (world < 1 || batch < 1 || seq < 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "advisor: world %d, batch %d and sequence %d must be positive", world, batch,
                       seq);
    ms_advisor *a = xcalloc(1, sizeof *a);
    a->def = *def;
    if (def->lm) {
        a->cfg = *def->lm;
        a->def.lm = &a->cfg;
    }
    a->world = world;
    a->batch = batch;
    a->seq = seq;
    a->cluster = *cluster;
    a->memo = ms_plan_memo_create();
    ms_plan_scales_identity(&a->scales);
    if (!a->memo) {
        free(a);
        return ms_fail(err, MS_ERR_NOMEM, "advisor: out of memory");
    }
    *out = a;
    return MS_OK;
}

void ms_advisor_destroy(ms_advisor *a) {
    if (!a) return;
    ms_plan_memo_destroy(a->memo);
    free(a->layout);
    free(a);
}

char *ms_advisor_layout_name(const ms_strategy *s, char *buf, size_t n) {
    char name[MS_STRATEGY_NAME_MAX];
    snprintf(buf, n, "%.40s, placements searched", ms_strategy_name(s, name, sizeof name));
    return buf;
}

void ms_advisor_set_placements(ms_advisor *a, const ms_placement_rules *rules) {
    if (rules)
        a->rules = *rules;
    else
        memset(&a->rules, 0, sizeof a->rules);
}

void ms_advisor_scales(const ms_advisor *a, ms_plan_scales *out) {
    *out = a->scales;
}

const char *ms_advisor_note(const ms_advisor *a) {
    return a->note;
}

void ms_advisor_set_memory_cap(ms_advisor *a, double bytes) {
    a->mem_cap = bytes > 0 ? bytes : 0;
}

static ms_plan_problem problem(ms_advisor *a) {
    return (ms_plan_problem){.model = a->cfg,
                             .devices = a->world,
                             .global_batch = a->batch,
                             .seq = a->seq,
                             .dtype = MS_PLAN_FP32,
                             .cluster = &a->cluster,
                             .engine_workloads = true,
                             .memo = a->memo,
                             .def = a->def.lm ? NULL : &a->def};
}

/* The current strategy's problem: under the job's own placement rules, when it has any. */
static ms_plan_problem current_problem(ms_advisor *a) {
    ms_plan_problem pb = problem(a);
    if (a->rules.n || a->rules.no_hints) pb.rules = &a->rules;
    return pb;
}

ms_status ms_advisor_predict(ms_advisor *a, const ms_strategy *s, ms_plan_estimate *out,
                             ms_error *err) {
    ms_plan_problem pb = problem(a);
    return ms_plan_estimate_one(&pb, s, &a->scales, out, err);
}

/* --- measurements ------------------------------------------------------------------------------
 */

typedef struct measured {
    bool have_ops, have_dims;
    double cls[MS_PC_COUNT];       /* seconds per rank per step */
    double dim[MS_PLAN_DIM_COUNT]; /* seconds per rank per step */
    double idle;                   /* seconds per step on the slowest rank */
} measured;

static ms_plan_dim dim_named(const char *n) {
    return !strcmp(n, "dp")   ? MS_PLAN_DP
           : !strcmp(n, "tp") ? MS_PLAN_TP
           : !strcmp(n, "cp") ? MS_PLAN_CP
           : !strcmp(n, "pp") ? MS_PLAN_PP
                              : MS_PLAN_WORLD;
}

static void measure(const ms_analysis *an, int world, const ms_plan_estimate *pred, measured *m) {
    memset(m, 0, sizeof *m);
    if (!an) return;
    double steps = an->n_steps > 0 ? an->n_steps : 1;
    double nr = an->nranks > 0 ? an->nranks : world;
    for (int i = 0; i < an->n_ops; i++) {
        const ms_op_row *r = &an->ops[i];
        ms_plan_class c = !strcmp(r->name, "matmul")      ? MS_PC_GEMM
                          : !strcmp(r->name, "attention") ? MS_PC_ATTENTION
                                                          : MS_PC_ELEMENTWISE;
        m->cls[c] += r->seconds / nr / steps;
        m->have_ops = true;
    }
    if (an->n_dims > 0) {
        /* a collective's duration is added once per peer it sends to: divide each rank's
         * row by its peer count to get the rank's time in that dim */
        for (int d = 0; d < an->n_dims && d < MS_AN_MAX_DIMS; d++) {
            const ms_heatmap *h = &an->per_dim[d];
            if (!h->seconds || h->nranks < 1) continue;
            double total = 0;
            for (int r = 0; r < h->nranks; r++) {
                double row = 0;
                int peers = 0;
                for (int q = 0; q < h->nranks; q++) {
                    double v = h->seconds[(size_t)r * h->nranks + q];
                    if (v > 0) row += v, peers++;
                }
                if (peers) total += row / peers;
            }
            m->dim[dim_named(an->dim_names[d])] += total / h->nranks / steps;
            m->have_dims = true;
        }
    } else if (an->n_busbw > 0) {
        /* no heatmaps: attribute by group size, splitting ties by the prediction */
        for (int i = 0; i < an->n_busbw; i++) {
            const ms_busbw_row *r = &an->busbw[i];
            double t = r->mean_s * r->count / nr / steps;
            int sizes[MS_PLAN_DIM_COUNT] = {pred->s.dp, pred->s.tp, pred->s.pp, pred->s.cp, world};
            double wsum = 0;
            for (int d = 0; d < MS_PLAN_DIM_COUNT - 1; d++)
                if (sizes[d] == r->group_size) wsum += pred->comm_total_s[d] + 1e-12;
            for (int d = 0; d < MS_PLAN_DIM_COUNT - 1 && wsum > 0; d++)
                if (sizes[d] == r->group_size)
                    m->dim[d] += t * (pred->comm_total_s[d] + 1e-12) / wsum;
            m->have_dims = true;
        }
    }
    for (int i = 0; i < an->n_steps; i++) m->idle += an->steps[i].idle_s / steps;
}

/* The share of the dp gradient traffic the trace saw hidden under compute, over all ranks,
 * when the job runs gradient buckets: what the cost model then takes as hidden (the traffic's
 * total is rescaled with the dp dim's factor like any other collective). */
static void measure_dp_overlap(ms_advisor *a, const ms_strategy *cur, const ms_analysis *an) {
    if (!an || cur->bucket_mb <= 0 || cur->dp < 2) return;
    double comm = 0, hidden = 0;
    for (int r = 0; r < an->nranks && r < MS_AN_MAX_RANKS; r++)
        comm += an->overlap[r].dp_comm_s, hidden += an->overlap[r].dp_hidden_s;
    if (comm <= 0) return;
    double share = hidden / comm;
    a->scales.dp_overlap =
        a->scales.dp_overlap < 0 ? share : 0.5 * a->scales.dp_overlap + 0.5 * share;
}

static double clampd(double x, double lo, double hi) {
    return x < lo ? lo : x > hi ? hi : x;
}

static void blend(double *slot, double fresh, int updates) {
    *slot = updates == 0 ? fresh : 0.5 * *slot + 0.5 * fresh;
}

/* --- suggestions --------------------------------------------------------------------------------
 */

static const char *fmt_ms(double s, char *buf, size_t len) {
    snprintf(buf, len, "%.1f ms", s * 1e3);
    return buf;
}

static const char *coll_words(ms_plan_dim d, const ms_strategy *s) {
    switch (d) {
        case MS_PLAN_TP:
            return s->sp ? "tp all-gather and reduce-scatter" : "tp all-reduce";
        case MS_PLAN_DP:
            return "dp gradient all-reduce";
        case MS_PLAN_CP:
            return "cp all-to-all";
        case MS_PLAN_PP:
            return "pp transfers";
        default:
            return "world all-reduce";
    }
}

static void evidence(const ms_plan_estimate *cur, const ms_plan_estimate *tgt,
                     const ms_plan_scales *sc, double measured_step, char *buf, size_t len) {
    /* the part of the step the switch saves most on */
    typedef struct part {
        double c, t;
        int kind; /* 0 compute class, 1 comm dim */
        int idx;
    } part;
    part parts[MS_PC_COUNT + MS_PLAN_DIM_COUNT];
    int n = 0;
    for (int c = 0; c < MS_PC_COUNT; c++)
        parts[n++] = (part){cur->compute_s[c], tgt->compute_s[c], 0, c};
    for (int d = 0; d < MS_PLAN_DIM_COUNT; d++)
        parts[n++] = (part){cur->comm_s[d], tgt->comm_s[d], 1, d};
    int best = 0;
    for (int i = 1; i < n; i++)
        if (parts[i].c - parts[i].t > parts[best].c - parts[best].t) best = i;
    char what[96], a[32], b[32], t[32];
    double scale;
    if (parts[best].kind == 1) {
        snprintf(what, sizeof what, "%s", coll_words((ms_plan_dim)parts[best].idx, &cur->s));
        scale = sc->comm[parts[best].idx];
    } else {
        static const char *const names[] = {"GEMM compute", "attention compute",
                                            "elementwise compute", "the optimizer step"};
        snprintf(what, sizeof what, "%s", names[parts[best].idx]);
        scale = sc->compute[parts[best].idx];
    }
    double step = measured_step > 0 ? measured_step : cur->step_s;
    size_t k = (size_t)snprintf(buf, len, "%s is %.0f%% of the step (%s of %s)", what,
                                100 * parts[best].c / step, fmt_ms(parts[best].c, a, sizeof a),
                                fmt_ms(step, t, sizeof t));
    if (k < len && fabs(scale - 1) > 0.25)
        k += (size_t)snprintf(buf + k, len - k, ", %.1fx what the model predicted", scale);
    if (k < len) {
        double r = parts[best].c > 0 ? parts[best].t / parts[best].c : 0;
        const char *verb = parts[best].t <= 1e-9 ? "removes it"
                           : r < 0.4             ? "cuts it"
                           : r < 0.6             ? "halves it"
                                                 : "reduces it";
        snprintf(buf + k, len - k, "; %.96s %s to %s", tgt->text, verb,
                 fmt_ms(parts[best].t, b, sizeof b));
    }
}

/* What changes from a to b, setting by setting in the table's order: "dp 2 -> 4, tp 2 -> 1".
 * The head's layout counts only where tp shards it. */
static void diff_str(const ms_strategy *a, const ms_strategy *b, char *buf, size_t len) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < MS_SET_COUNT && k < len; i++) {
        const ms_setting *st = &ms_settings[i];
        if (ms_setting_equal(a, b, st)) continue;
        if (i == MS_SET_head_replicated && (a->tp < 2 || b->tp < 2)) continue;
        char x[64], y[64];
        k += (size_t)snprintf(buf + k, len - k, "%s%s %s -> %s", k ? ", " : "", st->name,
                              ms_setting_text(a, st, x, sizeof x),
                              ms_setting_text(b, st, y, sizeof y));
    }
    if (k > len) buf[len - 1] = '\0';
}

/* A suggestion's id: a hash of the whole strategy (FNV-1a over its short JSON), so two
 * suggestions that differ in any knob never share one. */
static int32_t suggestion_id(const ms_strategy *s) {
    char json[512];
    ms_strategy_short_json(s, json, sizeof json);
    uint32_t h = 2166136261u;
    for (const char *c = json; *c; c++) h = (h ^ (uint8_t)*c) * 16777619u;
    int32_t id = (int32_t)(h & 0x7fffffff);
    return id ? id : 1;
}

/* A suggestion to move from current (measured, cur_e its estimate) to s (estimated cand). */
static void fill_suggestion(ms_suggestion *g, const ms_strategy *current, const ms_strategy *s,
                            const ms_plan_estimate *cur_e, const ms_plan_estimate *cand,
                            const ms_plan_scales *scales, double measured_step_s, double cap) {
    memset(g, 0, sizeof *g);
    g->id = suggestion_id(s);
    g->state = MS_SUGG_OPEN;
    g->applied_step = -1;
    snprintf(g->target, sizeof g->target, "%.63s", cand->text);
    ms_strategy_short_json(s, g->target_json, sizeof g->target_json);
    ms_strategy_name(current, g->current, sizeof g->current);
    g->predicted_gain = (measured_step_s - cand->step_s) / measured_step_s;
    g->predicted_step_s = cand->step_s;
    g->current_step_s = measured_step_s;
    evidence(cur_e, cand, scales, measured_step_s, g->evidence, sizeof g->evidence);
    char u[32], c2[32];
    snprintf(g->memory_check, sizeof g->memory_check, "fits: %s of %s per rank",
             ms_plan_bytes_str(cand->mem_total, u, sizeof u),
             ms_plan_bytes_str(cap, c2, sizeof c2));
    diff_str(current, s, g->diff, sizeof g->diff);
}

/* s, or the fastest variant of s with ZeRO (over dp) and activation recompute that fits the
 * memory cap, in s's precision or, when none does, in bf16: what the advisor suggests when a
 * mesh alone does not fit. bf16 only for memory: on cores without bf16 units its conversions
 * cost time the cost model does not price. *est receives the chosen strategy's estimate;
 * false when nothing fits. */
static bool fit_memory(const ms_advisor *a, const ms_job_shape *job, const ms_plan_problem *pb,
                       double cap, ms_strategy *s, ms_plan_estimate *est) {
    const ms_plan_scales *scales = &a->scales;
    ms_error err = {0};
    if (ms_plan_estimate_one(pb, s, scales, est, &err) != MS_OK) return false;
    if (est->mem_total <= cap) return true;
    ms_strategy base = *s;
    ms_plan_estimate trial;
    bool found = false;
    for (int p = base.precision; p < MS_PRECISION_COUNT && !found; p++)
        for (int z = 0; z <= (base.dp > 1 ? 3 : 0); z++)
            for (int r = MS_RECOMPUTE_NONE; r < MS_RECOMPUTE_COUNT; r++) {
                ms_strategy v = base;
                v.zero = z, v.recompute = (uint8_t)r, v.precision = (uint8_t)p;
                if ((!z && r == MS_RECOMPUTE_NONE && p == base.precision) ||
                    ms_strategy_validate_def(&v, &a->def, job, 0, NULL) != MS_OK ||
                    ms_plan_estimate_one(pb, &v, scales, &trial, &err) != MS_OK ||
                    trial.mem_total > cap || (found && trial.step_s >= est->step_s))
                    continue;
                *s = v, *est = trial, found = true;
            }
    return found;
}

/* The strategies weighed on this world: every dp x tp x cp mesh (with and without sp), alone
 * and on pipeline stages (pp 2, 4, 8 dividing the world and the layers; 1f1b with pp or 2 pp
 * micro-batches, which keep the bubble at a third or a fifth of a step or less). A program's
 * own model has no sequence to split: dp x tp meshes without sp, on stages likewise. */
static int candidates(const ms_advisor *a, ms_strategy *out, int cap) {
    int n = 0;
    const bool lm = a->def.lm != NULL;
    for (int pp = 1; pp <= 8 && pp <= a->world; pp *= 2) {
        if (a->world % pp || a->def.n_blocks % pp) continue;
        int stage = a->world / pp;
        for (int tp = 1; tp <= stage; tp++)
            for (int cp = 1; tp * cp <= stage && (lm || cp == 1); cp++) {
                if (stage % (tp * cp)) continue;
                for (int sp = 0; sp <= (lm && tp > 1); sp++)
                    for (int mi = 0; mi < (pp > 1 ? 2 : 1) && n < cap; mi++) {
                        ms_strategy s;
                        if (ms_strategy_init(&s, stage / (tp * cp), tp, cp, sp, NULL) != MS_OK)
                            continue;
                        s.pp = pp;
                        if (pp > 1) s.micro_batches = pp << mi;
                        out[n++] = s;
                        /* on GPUs each gradient's NCCL call costs microseconds: 25 MiB
                         * buckets, as PyTorch DDP's, too */
                        if (!a->cluster.cpu && (s.dp > 1) != (s.cp > 1) && n < cap) {
                            s.bucket_mb = 25;
                            out[n++] = s;
                        }
                    }
            }
    }
    return n;
}

/* Step 1 of a round: the scales learned from the window's measures (an) against the
 * identity-scaled prediction `pred` of the current strategy, blended into a->scales. */
static void recalibrate(ms_advisor *a, const ms_strategy *current, const ms_analysis *an,
                        const ms_plan_estimate *pred, double measured_step_s) {
    const ms_strategy cur = *current;
    measured m;
    measure(an, a->world, pred, &m);
    ms_plan_scales fresh = a->scales;
    /* A trace books as communication every wait inside a collective. The model already puts
     * part of that elsewhere: the phase-boundary waits of thread ranks (overhead) and, when
     * ranks outnumber cores, compute: a rank waiting in a collective hands its core to a peer,
     * whose kernels then run faster than their fair share, so measured compute falls short of
     * the prediction by about what the collectives gained. Those parts are taken off the
     * measured collective time (pro rata over the mesh dims) before the dims are rescaled, and
     * the compute classes keep their measured mix but never drop below the predicted total. */
    double pred_comp = 0, meas_comp = 0, meas_comm = 0, pred_comm = 0;
    for (int c = 0; c < MS_PC_OPTIMIZER; c++)
        pred_comp += pred->compute_s[c], meas_comp += m.cls[c];
    for (int d = 0; d < MS_PLAN_DIM_COUNT; d++)
        meas_comm += m.dim[d], pred_comm += pred->comm_total_s[d];
    /* The phase-boundary synchronisation is a residual of whole calibration steps, so it is
     * the noisiest figure of the calibration (a busy machine then inflates it many times); the
     * collectives' own transfers were measured alone. Those waits are spent inside
     * collectives, so the sync can take at most the measured collective time beyond the
     * predicted transfers: when it would exceed that, it shrinks first. */
    if (m.have_dims && pred->sync_s > 1e-9) {
        double room = meas_comm - pred_comm;
        fresh.sync = room >= pred->sync_s ? 1 : room > 0 ? room / pred->sync_s : 0;
    }
    double sync_s = pred->sync_s * fresh.sync;
    bool shared = a->cluster.cpu && a->world > a->cluster.cores;
    double lift =
        shared && m.have_ops && meas_comp > 0 && meas_comp < pred_comp ? pred_comp / meas_comp : 1;
    double shift = sync_s + (lift > 1 ? pred_comp - meas_comp : 0);
    if (m.have_ops) {
        for (int c = 0; c < MS_PC_OPTIMIZER; c++)
            if (pred->compute_s[c] > 1e-9 && m.cls[c] > 0)
                fresh.compute[c] = clampd(lift * m.cls[c] / pred->compute_s[c], 0.2, 8);
        double opt = pred->compute_s[MS_PC_OPTIMIZER] + pred->overhead_s - pred->sync_s;
        if (opt > 1e-9 && m.idle > 0) fresh.compute[MS_PC_OPTIMIZER] = clampd(m.idle / opt, 0.2, 8);
    }
    if (m.have_dims)
        for (int d = 0; d < MS_PLAN_DIM_COUNT; d++)
            if (pred->comm_total_s[d] > 1e-9 && m.dim[d] > 0) {
                double net = m.dim[d] - (meas_comm > 0 ? shift * m.dim[d] / meas_comm : 0);
                fresh.comm[d] = clampd(net / pred->comm_total_s[d], 0.2, 8);
            }
    if (!m.have_ops && !m.have_dims) {
        /* only the step time: scale the whole model */
        double r = clampd(measured_step_s / pred->step_s, 0.2, 8);
        for (int c = 0; c < MS_PC_COUNT; c++) fresh.compute[c] = r;
        for (int d = 0; d < MS_PLAN_DIM_COUNT; d++) fresh.comm[d] = r;
        fresh.sync = r;
    }
    for (int c = 0; c < MS_PC_COUNT; c++)
        blend(&a->scales.compute[c], fresh.compute[c], a->updates);
    for (int d = 0; d < MS_PLAN_DIM_COUNT; d++)
        blend(&a->scales.comm[d], fresh.comm[d], a->updates);
    blend(&a->scales.sync, fresh.sync, a->updates);
    measure_dp_overlap(a, &cur, an);
}

/* What the scales leave unexplained of the measured step becomes a per-step constant; then
 * *cur_e is the current strategy's estimate with every scale, and *explained_s its step
 * without that constant: what the model's terms account for. */
static ms_status fit_overhead(ms_advisor *a, const ms_plan_problem *pb, const ms_strategy *cur,
                              double measured_step_s, ms_plan_estimate *cur_e, double *explained_s,
                              ms_error *err) {
    ms_plan_scales noover = a->scales;
    noover.overhead_s = 0;
    MS_CHECK(ms_plan_estimate_one(pb, cur, &noover, cur_e, err));
    *explained_s = cur_e->step_s;
    double resid = measured_step_s - cur_e->step_s;
    if (resid < -0.5 * cur_e->step_s) resid = -0.5 * cur_e->step_s;
    blend(&a->scales.overhead_s, resid, a->updates);
    a->updates++;
    return ms_plan_estimate_one(pb, cur, &a->scales, cur_e, err);
}

/* Step 2: every other executable strategy on this world predicted at least `threshold`
 * faster than the measured step (any that fits when the current one is over the memory cap),
 * best first, into tmp (room for 64); returns the count. */
static int suggest(const ms_advisor *a, const ms_plan_problem *pb, const ms_strategy *current,
                   const ms_plan_estimate *cur_e, double measured_step_s, double threshold,
                   ms_suggestion *tmp) {
    const ms_strategy cur = *current;
    ms_job_shape job = {.world = a->world, .batch = a->batch, .seq = a->seq};
    ms_plan_estimate cand_est, *cand = &cand_est;
    int nt = 0;
    double cap = a->mem_cap > 0 ? a->mem_cap
                                : a->cluster.mem_bytes * a->cluster.usable_memory_fraction /
                                      (a->cluster.cpu ? a->world : 1);
    ms_strategy *all = xmalloc(sizeof *all * 256);
    int nall = candidates(a, all, 256);
    /* a current strategy over the cap takes any strategy that fits, faster or not */
    bool over = cur_e->mem_total > cap;
    for (int k = 0; k < nall && nt < 64; k++) {
        ms_strategy s = all[k];
        /* the job's precision stays unless memory asks for bf16 (fit_memory); the current
         * mesh itself is weighed too, for a variant of it that fits */
        s.precision = cur.precision;
        if (ms_strategy_validate_def(&s, &a->def, &job, 0, NULL) != MS_OK) continue;
        /* its variants are validated where they are made */
        if (!fit_memory(a, &job, pb, cap, &s, cand) || ms_strategy_equal(&s, &cur)) continue;
        double gain = (measured_step_s - cand->step_s) / measured_step_s;
        /* never a strategy the job's switch would refuse: the validator has the last word,
         * memory cap included (this compiles the program: only for winners) */
        if ((!over && gain < threshold) ||
            ms_strategy_validate_def(&s, &a->def, &job, cap, NULL) != MS_OK)
            continue;
        fill_suggestion(&tmp[nt++], current, &s, cur_e, cand, &a->scales, measured_step_s, cap);
    }
    free(all);
    return nt;
}

/* Best first. */
static void sort_by_gain(ms_suggestion *tmp, int nt) {
    for (int i = 1; i < nt; i++)
        for (int j = i; j > 0 && tmp[j - 1].predicted_gain < tmp[j].predicted_gain; j--) {
            ms_suggestion t = tmp[j];
            tmp[j] = tmp[j - 1];
            tmp[j - 1] = t;
        }
}

/* The current strategy's layout, searched once (engine/plan/auto_place.h); NULL when the search
 * found none. */
static const ms_auto_place_result *searched_layout(ms_advisor *a, const ms_strategy *current) {
    if (a->searched && ms_strategy_equal(&a->searched_for, current))
        return a->search_ok ? a->layout : NULL;
    if (!a->layout) a->layout = xmalloc(sizeof *a->layout);
    ms_plan_problem pb = problem(a);
    ms_error err = {0};
    a->searched = true, a->searched_for = *current;
    a->search_ok = ms_plan_auto_placements(&pb, current, NULL, a->layout, &err) == MS_OK;
    return a->search_ok ? a->layout : NULL;
}

bool ms_advisor_searched_rules(const ms_advisor *a, const ms_strategy *s, ms_placement_rules *out) {
    if (!a->searched || !a->search_ok || !ms_strategy_equal(&a->searched_for, s)) return false;
    *out = a->layout->rules;
    return true;
}

/* Step 2b: the current strategy under a searched layout ("placements": "auto"), when it runs
 * tp > 1 under a layout it was given (its model's own, or rules beside it) and, priced with the
 * learned scales as every candidate is, it is `threshold` faster than the measured step. pred is
 * the current strategy's unscaled estimate (its collective bytes for the evidence). Writes at
 * most one suggestion into *g; returns how many. */
static int auto_suggestion(ms_advisor *a, const ms_strategy *current, const ms_plan_estimate *pred,
                           const ms_plan_estimate *cur_e, double measured_step_s, double threshold,
                           ms_suggestion *g) {
    if (current->tp < 2 || current->cp > 1 || a->rules.no_hints) return 0;
    const ms_auto_place_result *r = searched_layout(a, current);
    if (!r) return 0;
    /* priced as every other candidate: with the scales learned from this job */
    ms_plan_problem pb = problem(a);
    pb.rules = &r->rules;
    ms_plan_estimate target;
    ms_error err = {0};
    if (ms_plan_estimate_one(&pb, current, &a->scales, &target, &err) != MS_OK) return 0;
    double gain = (measured_step_s - target.step_s) / measured_step_s;
    double cap = a->mem_cap > 0 ? a->mem_cap
                                : a->cluster.mem_bytes * a->cluster.usable_memory_fraction /
                                      (a->cluster.cpu ? a->world : 1);
    if (gain < threshold || target.mem_total > cap) return 0;
    fill_suggestion(g, current, current, cur_e, &target, &a->scales, measured_step_s, cap);
    g->id = suggestion_id(current) ^ 0x5a5a5a; /* not the plain strategy's id */
    g->id = g->id ? g->id & 0x7fffffff : 1;
    char bytes_now[32], bytes_then[32];
    ms_advisor_layout_name(current, g->target, sizeof g->target);
    size_t n = strlen(g->target_json);
    if (n && g->target_json[n - 1] == '}')
        snprintf(g->target_json + n - 1, sizeof g->target_json - (n - 1),
                 "%s\"placements\": \"auto\"}", n > 2 ? ", " : "");
    char *rules = xmalloc(16384);
    ms_auto_place_rules_str(&r->rules, rules, 16384);
    snprintf(g->diff, sizeof g->diff, "placements: the model's own -> searched %s", rules);
    free(rules);
    snprintf(g->evidence, sizeof g->evidence,
             "the searched layout moves %s of collectives per step and rank against %s; "
             "predicted %.0f%% faster (%d layouts compiled)",
             ms_plan_bytes_str(ms_plan_estimate_coll_bytes(&target), bytes_then, sizeof bytes_then),
             ms_plan_bytes_str(ms_plan_estimate_coll_bytes(pred), bytes_now, sizeof bytes_now),
             100 * gain, r->compiles);
    return 1;
}

/* Between steps 1 and 2: whether this round may suggest. The per-step constant closes any gap
 * between the scaled prediction and the measured step by construction, so the check is on what
 * the scaled terms explain: a model that, even rescaled, misses the step by more than
 * MS_ADVISOR_OFF_LIMIT does not know where that time goes, and what it predicts for other
 * strategies is a guess. Such a round opens nothing (what is open stays: one noisy round must not
 * take away what a user is about to accept); MS_ADVISOR_OFF_ROUNDS of them in a row are no noise,
 * and a->note says so until a round agrees again. */
static bool model_agrees(ms_advisor *a, double explained_s, double measured_step_s) {
    double off = (explained_s - measured_step_s) / measured_step_s;
    bool agrees = fabs(off) <= MS_ADVISOR_OFF_LIMIT;
    a->off_rounds = agrees ? 0 : a->off_rounds + 1;
    a->note[0] = '\0';
    if (a->off_rounds >= MS_ADVISOR_OFF_ROUNDS)
        snprintf(a->note, sizeof a->note,
                 "the cost model is %.0f%% off the measured step for %d rounds (predicts %.1f ms, "
                 "measured %.1f ms); relearning from the trace; no suggestions until it agrees "
                 "within %.0f%%",
                 100 * fabs(off), a->off_rounds, explained_s * 1e3, measured_step_s * 1e3,
                 100 * MS_ADVISOR_OFF_LIMIT);
    return agrees;
}

ms_status ms_advisor_update(ms_advisor *a, const ms_strategy *current, const ms_analysis *an,
                            double measured_step_s, double threshold, ms_suggestion *out, int max,
                            int *n, ms_error *err) {
    *n = 0;
    if (threshold <= 0) threshold = MS_ADVISOR_DEFAULT_THRESHOLD;
    if (!(measured_step_s > 0))
        return ms_fail(err, MS_ERR_INVALID, "advisor: the measured step time must be positive");
    ms_plan_problem pb = problem(a), cur_pb = current_problem(a);
    ms_plan_scales id;
    ms_plan_scales_identity(&id);
    ms_plan_estimate pred, cur_e;
    ms_status st = ms_plan_estimate_one(&cur_pb, current, &id, &pred, err);
    if (st != MS_OK) {
        char name[MS_STRATEGY_NAME_MAX];
        return ms_fail_wrap(err, st, "advisor: the current strategy %s",
                            ms_strategy_name(current, name, sizeof name));
    }
    recalibrate(a, current, an, &pred, measured_step_s);
    double explained;
    MS_CHECK(fit_overhead(a, &cur_pb, current, measured_step_s, &cur_e, &explained, err));
    if (!model_agrees(a, explained, measured_step_s)) return MS_OK;
    ms_suggestion *tmp = xcalloc(65, sizeof *tmp);
    int nt = suggest(a, &pb, current, &cur_e, measured_step_s, threshold, tmp);
    nt += auto_suggestion(a, current, &pred, &cur_e, measured_step_s, threshold, &tmp[nt]);
    sort_by_gain(tmp, nt);
    for (int i = 0; i < nt && i < max; i++) out[(*n)++] = tmp[i];
    free(tmp);
    return MS_OK;
}

void ms_advisor_switch_result(const ms_suggestion *s, double measured_before_s,
                              double measured_after_s, char *buf, size_t len) {
    double before = measured_before_s > 0 ? measured_before_s : s ? s->current_step_s : 0;
    double got = before > 0 ? (before - measured_after_s) / before : 0;
    char predicted[96] = "no prediction (a direct request)";
    if (s)
        snprintf(predicted, sizeof predicted, "predicted %.0f%% %s (%.1f ms per step)",
                 fabs(100 * s->predicted_gain), s->predicted_gain >= 0 ? "faster" : "slower",
                 s->predicted_step_s * 1e3);
    snprintf(buf, len, "%s, measured %.0f%% %s (%.1f ms against %.1f ms)", predicted,
             fabs(100 * got), got >= 0 ? "faster" : "slower", measured_after_s * 1e3, before * 1e3);
}

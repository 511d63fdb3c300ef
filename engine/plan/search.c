/* search.c - enumerating, pricing and ranking strategies; the reason the winner wins. */
#include "engine/plan/search.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/core/xalloc.h"
#include "engine/plan/validate.h"

void ms_plan_fixed_none(ms_plan_fixed *f) {
    ms_strategy_defaults(&f->s);
    f->mask = 0;
}

/* The fixed value of a scalar setting, or -1 when it is searched. */
static int fixed_int(const ms_plan_fixed *f, ms_setting_id id) {
    return ms_plan_fixed_has(f, id) ? (int)ms_setting_value(&f->s, &ms_settings[id]) : -1;
}

/* The --evaluate key closest to `key`, for a suggestion: a former key's new name, else the
 * setting sharing the longest prefix. */
static const char *closest_setting(const char *key) {
    static const char *const renamed[][2] = {{"vp", "head_replicated (of the opposite sense)"},
                                             {"mb", "micro_batch"},
                                             {"micro", "micro_batches"},
                                             {"bucket", "bucket_mb"}};
    for (size_t i = 0; i < sizeof renamed / sizeof *renamed; i++)
        if (!strcmp(key, renamed[i][0])) return renamed[i][1];
    const char *best = ms_settings[0].name;
    size_t best_common = 0;
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const char *n = ms_settings[i].name;
        size_t c = 0;
        while (n[c] && key[c] == n[c]) c++;
        if (c > best_common) best_common = c, best = n;
    }
    return best;
}

ms_status ms_plan_fixed_parse(const char *text, ms_plan_fixed *f, ms_error *err) {
    ms_plan_fixed_none(f);
    char buf[512];
    if (!text || strlen(text) >= sizeof buf)
        return ms_fail(err, MS_ERR_INVALID, "--evaluate: expected a list like \"tp=8,pp=2,dp=32\"");
    snprintf(buf, sizeof buf, "%s", text);
    for (char *tok = strtok(buf, ", "); tok; tok = strtok(NULL, ", ")) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return ms_fail(err, MS_ERR_INVALID,
                           "--evaluate: '%s' is not key=value (e.g. \"tp=8,pp=2,dp=32\")", tok);
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        for (char *p = tok; *p; p++) *p = (char)tolower((unsigned char)*p);
        const ms_setting *st = ms_setting_find(k);
        if (!st) {
            char list[512];
            size_t n = 0;
            for (int i = 0; i < MS_SET_COUNT && n < sizeof list; i++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                                      ms_settings[i].name);
            return ms_fail(err, MS_ERR_INVALID,
                           "--evaluate: unknown setting '%s'; did you mean '%s'? (settings: %s)", k,
                           closest_setting(k), list);
        }
        char why[256];
        if (!ms_setting_set_text(&f->s, st, v, why, sizeof why))
            return ms_fail(err, MS_ERR_INVALID, "--evaluate: %s=%s: expected %s", k, v, why);
        f->mask |= 1u << (st - ms_settings);
    }
    ms_strategy_settle(&f->s, f->mask);
    return MS_OK;
}

bool ms_plan_fixed_match(const ms_plan_fixed *f, const ms_strategy *s, int global_batch) {
    int mb = 0, m = 0;
    ms_strategy_micro(s, global_batch, &mb, &m);
    for (int i = 0; i < MS_SET_COUNT; i++) {
        if (!ms_plan_fixed_has(f, (ms_setting_id)i)) continue;
        switch ((ms_setting_id)i) {
            case MS_SET_micro_batch:
                if (f->s.micro_batch != mb) return false;
                break;
            case MS_SET_micro_batches:
                if (f->s.micro_batches != m) return false;
                break;
            case MS_SET_head_replicated:
                if (f->s.head_replicated != (s->tp > 1 && s->head_replicated)) return false;
                break;
            case MS_SET_bucket_mb:
                if ((int)f->s.bucket_mb != (int)s->bucket_mb) return false;
                break;
            default:
                if (!ms_setting_equal(&f->s, s, &ms_settings[i])) return false;
        }
    }
    return true;
}

void ms_plan_fixed_apply(const ms_plan_fixed *f, ms_strategy *s) {
    static const ms_setting_id applied[] = {MS_SET_schedule, MS_SET_virtual_stages,
                                            MS_SET_pp_layers, MS_SET_precision};
    for (size_t i = 0; i < sizeof applied / sizeof *applied; i++)
        if (ms_plan_fixed_has(f, applied[i])) ms_setting_copy(s, &f->s, &ms_settings[applied[i]]);
}

/* Estimates s; when it does not fit the devices' memory and `may_offload`, estimates it again
 * with the optimizer offloaded and keeps that (s updated). One estimate for a strategy that
 * fits: the estimate compiles the engine's program for the strategy, which is what costs. */
static ms_status estimate_or_offload(const ms_plan_problem *pb, ms_strategy *s, bool may_offload,
                                     const ms_plan_scales *sc, ms_plan_estimate *e, ms_error *err) {
    ms_status st = ms_plan_estimate_unnamed(pb, s, sc, e, err);
    if (st != MS_OK || e->fits || !may_offload || s->offload) return st;
    s->offload = true;
    return ms_plan_estimate_unnamed(pb, s, sc, e, err);
}

/* --- explaining ------------------------------------------------------------------------------ */

typedef struct part {
    const char *name;
    double s;
} part;

/* The step's parts: compute, each dim's exposed communication, the bubble, the optimizer. */
static int parts_of(const ms_plan_estimate *e, part *p) {
    int n = 0;
    p[n++] = (part){"compute", e->compute_s[MS_PC_GEMM] + e->compute_s[MS_PC_ATTENTION] +
                                   e->compute_s[MS_PC_ELEMENTWISE]};
    p[n++] = (part){"tp communication", e->comm_s[MS_PLAN_TP]};
    p[n++] = (part){"dp gradient traffic", e->comm_s[MS_PLAN_DP]};
    p[n++] = (part){"cp all-to-all", e->comm_s[MS_PLAN_CP]};
    p[n++] = (part){"pp transfers", e->comm_s[MS_PLAN_PP]};
    p[n++] = (part){"pipeline bubble", e->bubble_s};
    p[n++] = (part){"optimizer", e->compute_s[MS_PC_OPTIMIZER]};
    return n;
}

static const char *fmt_s(double s, char *buf, size_t len) {
    if (s >= 1)
        snprintf(buf, len, "%.2f s", s);
    else if (s >= 1e-3)
        snprintf(buf, len, "%.1f ms", s * 1e3);
    else
        snprintf(buf, len, "%.0f us", s * 1e6);
    return buf;
}

static const char *fmt_b(double b, char *buf, size_t len) {
    if (b >= 1e9)
        snprintf(buf, len, "%.1f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, len, "%.1f MB", b / 1e6);
    else
        snprintf(buf, len, "%.0f KB", b / 1e3);
    return buf;
}

void ms_plan_breakdown_str(const ms_plan_estimate *e, char *buf, size_t len) {
    part p[8];
    int n = parts_of(e, p);
    /* largest first */
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && p[b - 1].s < p[b].s; b--) {
            part t = p[b];
            p[b] = p[b - 1];
            p[b - 1] = t;
        }
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < len; i++) {
        double pct = e->step_s > 0 ? 100 * p[i].s / e->step_s : 0;
        if (pct < 1) continue;
        k += (size_t)snprintf(buf + k, len - k, "%s%s %.0f%%", k ? ", " : "", p[i].name, pct);
    }
}

void ms_plan_explain_difference(const ms_plan_estimate *win, const ms_plan_estimate *other,
                                char *buf, size_t len) {
    part a[8], b[8];
    int n = parts_of(win, a);
    parts_of(other, b);
    int big = 0;
    for (int i = 1; i < n; i++)
        if (b[i].s - a[i].s > b[big].s - a[big].s) big = i;
    char x[32], y[32], t1[32], t2[32];
    snprintf(buf, len, "%s takes %s against %s (%s per step against %s)", a[big].name,
             fmt_s(a[big].s, x, sizeof x), fmt_s(b[big].s, y, sizeof y),
             fmt_s(win->step_s, t1, sizeof t1), fmt_s(other->step_s, t2, sizeof t2));
}

static void make_reason(const ms_plan_problem *pb, ms_plan_result *r) {
    if (r->n_cands == 0) return;
    const ms_plan_estimate *w = &r->cands[0];
    char st[32], mem[32], cap[32], bd[160];
    ms_plan_breakdown_str(w, bd, sizeof bd);
    size_t k = (size_t)snprintf(
        r->reason, sizeof r->reason,
        "%s wins at %s per step (%.0f %s, %.3g model TFLOP/s per device), %s of %s per "
        "device; its step is %s.",
        w->text, fmt_s(w->step_s, st, sizeof st), w->tokens_per_s,
        ms_plan_user_def(pb) ? "rows/s" : "tokens/s", w->model_tflops_per_device,
        fmt_b(w->mem_total, mem, sizeof mem), fmt_b(w->mem_cap, cap, sizeof cap), bd);
    if (!w->fits && k < sizeof r->reason)
        k += (size_t)snprintf(r->reason + k, sizeof r->reason - k,
                              " It does not fit: nothing in the searched space does.");
    if (r->n_cands > 1 && k < sizeof r->reason) {
        char d[256];
        ms_plan_explain_difference(w, &r->cands[1], d, sizeof d);
        k += (size_t)snprintf(r->reason + k, sizeof r->reason - k,
                              " Against the runner-up, %s: %s.", r->cands[1].text, d);
    }
    if (r->have_unconstrained && k < sizeof r->reason) {
        char us[32], um[32];
        k += (size_t)snprintf(r->reason + k, sizeof r->reason - k,
                              " The fastest strategy ignoring memory, %s (%s), needs %s per "
                              "device.",
                              r->unconstrained.text, fmt_s(r->unconstrained.step_s, us, sizeof us),
                              fmt_b(r->unconstrained.mem_total, um, sizeof um));
    }
    if (r->have_best_executable && k < sizeof r->reason) {
        char es[32];
        snprintf(r->reason + k, sizeof r->reason - k,
                 " The best this engine runs here is %s at %s (%.0f%% slower).",
                 r->best_executable.text, fmt_s(r->best_executable.step_s, es, sizeof es),
                 100 * (r->best_executable.step_s / w->step_s - 1));
    }
}

/* --- the search ------------------------------------------------------------------------------- */

/* Why no strategy is valid, when the loops never got as far as pricing one. */
static void diagnose(const ms_plan_problem *pb, const ms_plan_fixed *f, ms_error *e) {
    const ms_model_config *c = &pb->model;
    int D = pb->devices;
    long fixed = 1;
    const int fdp = fixed_int(f, MS_SET_dp), ftp = fixed_int(f, MS_SET_tp),
              fpp = fixed_int(f, MS_SET_pp), fcp = fixed_int(f, MS_SET_cp);
    const int deg[4] = {fdp, ftp, fpp, fcp};
    for (int i = 0; i < 4; i++)
        if (deg[i] > 0) fixed *= deg[i];
    if (D % fixed)
        ms_fail(e, MS_ERR_INVALID,
                "the fixed degrees multiply to %ld, which does not divide %d "
                "devices",
                fixed, D);
    else if (ftp > 0 && c->n_head % ftp)
        ms_fail(e, MS_ERR_INVALID, "tp %d does not divide the %d attention heads", ftp, c->n_head);
    else if (ftp > 0 && fcp > 0 && c->n_head % (ftp * fcp))
        ms_fail(e, MS_ERR_INVALID, "tp x cp = %d does not divide the %d attention heads", ftp * fcp,
                c->n_head);
    else if (fpp > c->n_layer)
        ms_fail(e, MS_ERR_INVALID, "pp %d is more stages than the %d layers", fpp, c->n_layer);
    else if (fcp > 0 && pb->seq % fcp)
        ms_fail(e, MS_ERR_INVALID, "cp %d does not divide the sequence %d", fcp, pb->seq);
    else if (fdp > 0 && pb->global_batch % fdp)
        ms_fail(e, MS_ERR_INVALID, "dp %d does not divide the global batch %d", fdp,
                pb->global_batch);
    else if (fixed_int(f, MS_SET_sp) == 1 && ftp == 1)
        ms_fail(e, MS_ERR_INVALID, "sp needs tp 2 or more");
}

static bool better(const ms_plan_estimate *a, const ms_plan_estimate *b) {
    if (a->step_s != b->step_s) return a->step_s < b->step_s;
    return a->mem_total < b->mem_total;
}

/* Inserts e into the sorted top-`keep` list. */
static void keep_top(ms_plan_estimate *list, int *n, int keep, const ms_plan_estimate *e) {
    if (*n == keep && !better(e, &list[keep - 1])) return;
    int i = *n < keep ? (*n)++ : keep - 1;
    while (i > 0 && better(e, &list[i - 1])) {
        list[i] = list[i - 1];
        i--;
    }
    list[i] = *e;
}

/* One search's state: the problem, the fixed knobs, and the best estimates so far. */
typedef struct search_run {
    const ms_plan_problem *pb;
    const ms_plan_fixed *f;
    const ms_plan_scales *sc;
    int keep;
    bool exe_only;
    uint8_t precision;
    ms_plan_estimate *fit, *nofit; /* the best `keep` that fit the memory, and that do not */
    int nfit, nnofit;
    ms_plan_estimate e; /* the one being weighed */
    ms_error first;     /* why the first strategy was refused */
    bool any_valid;
    ms_plan_result *out;
} search_run;

/* Prices s and keeps it among the best; a strategy the model refuses (MS_ERR_INVALID) is
 * skipped, remembering the first reason; any other failure ends the search. */
static ms_status weigh(search_run *r, ms_strategy *s, ms_error *err) {
    if (!ms_plan_fixed_match(r->f, s, r->pb->global_batch)) return MS_OK;
    if (r->exe_only && !ms_plan_executable(r->pb, s, NULL, 0)) return MS_OK;
    ms_error e2 = {0};
    ms_plan_estimate *e = &r->e;
    ms_status st =
        estimate_or_offload(r->pb, s, fixed_int(r->f, MS_SET_offload) < 0, r->sc, e, &e2);
    if (st != MS_OK) {
        if (!r->first.msg[0]) r->first = e2;
        if (st == MS_ERR_INVALID) return MS_OK;
        if (err) *err = e2;
        return st;
    }
    ms_plan_result *out = r->out;
    r->any_valid = true;
    out->evaluated++;
    if (e->fits) {
        keep_top(r->fit, &r->nfit, r->keep, e);
    } else {
        out->pruned_memory++;
        keep_top(r->nofit, &r->nnofit, r->keep, e);
    }
    if (e->executable &&
        (!out->have_best_executable ||
         (e->fits && (!out->best_executable.fits || better(e, &out->best_executable))))) {
        out->best_executable = *e;
        out->have_best_executable = true;
    }
    return MS_OK;
}

/* Every variant of one mesh: sp, the head's layout, ZeRO, recompute, buckets and the
 * micro-batch size. */
static ms_status search_mesh(search_run *r, int dp, int tp, int cp, int pp, ms_error *err) {
    const ms_plan_fixed *f = r->f;
    const int per = r->pb->global_batch / dp;
    /* gradient buckets: none, or on GPUs (where each NCCL call costs microseconds) PyTorch
     * DDP's 25 MiB too where the engine buckets (over dp or cp, not both) */
    const int fbk = fixed_int(f, MS_SET_bucket_mb);
    const int bks[2] = {fbk > 0 ? fbk : 0, 25};
    const int nbk = fbk < 0 && !r->pb->cluster->cpu && (dp > 1) != (cp > 1) ? 2 : 1;
    const int rc_max = fixed_int(f, MS_SET_recompute) == 2 ? 2 : 1;
    static const uint8_t recompute[3] = {MS_RECOMPUTE_NONE, MS_RECOMPUTE_FULL,
                                         MS_RECOMPUTE_SELECTIVE};
    for (int sp = 0; sp <= (tp > 1); sp++)
        for (int vp = tp > 1; vp >= 0; vp--)
            for (int z = 0; z <= (dp > 1 ? 3 : 0); z++)
                for (int rc = 0; rc <= rc_max; rc++)
                    for (int bk = 0; bk < nbk; bk++)
                        for (int mb = 1; mb <= per; mb++) {
                            if (per % mb) continue;
                            ms_strategy s;
                            ms_strategy_defaults(&s);
                            s.dp = dp, s.tp = tp, s.pp = pp, s.cp = cp, s.sp = sp;
                            s.zero = z;
                            s.recompute = recompute[rc];
                            s.micro_batches = per / mb;
                            s.head_replicated = tp > 1 && !vp;
                            s.precision = r->precision;
                            s.offload = fixed_int(f, MS_SET_offload) == 1;
                            ms_plan_fixed_apply(f, &s);
                            s.bucket_mb = (float)bks[bk];
                            MS_CHECK(weigh(r, &s, err));
                        }
    return MS_OK;
}

/* Every dp x tp x cp x pp mesh of the devices that the model, the batch and the fixed
 * degrees allow. */
static ms_status search_meshes(search_run *r, ms_error *err) {
    const ms_model_config *c = &r->pb->model;
    const ms_plan_fixed *f = r->f;
    const int D = r->pb->devices, B = r->pb->global_batch;
    for (int tp = 1; tp <= D; tp++) {
        if (D % tp || c->n_head % tp ||
            (fixed_int(f, MS_SET_tp) >= 0 && fixed_int(f, MS_SET_tp) != tp))
            continue;
        for (int cp = 1; tp * cp <= D; cp++) {
            if ((D / tp) % cp || c->n_head % (tp * cp) || r->pb->seq % cp) continue;
            if (fixed_int(f, MS_SET_cp) >= 0 && fixed_int(f, MS_SET_cp) != cp) continue;
            for (int pp = 1; tp * cp * pp <= D; pp++) {
                /* the search tries even splits; a pp the user fixes may split unevenly
                 * (pp_layers, or stages balanced by cost) */
                const int fpp = fixed_int(f, MS_SET_pp);
                if ((D / (tp * cp)) % pp || pp > c->n_layer || (fpp >= 0 && fpp != pp) ||
                    (fpp < 0 && c->n_layer % pp))
                    continue;
                int dp = D / (tp * cp * pp);
                if (B % dp || (fixed_int(f, MS_SET_dp) >= 0 && fixed_int(f, MS_SET_dp) != dp))
                    continue;
                MS_CHECK(search_mesh(r, dp, tp, cp, pp, err));
            }
        }
    }
    return MS_OK;
}

/* --- a program's own model ------------------------------------------------------------------ */

/* Every variant of one dp x tp x pp mesh for a program's own model: ZeRO (dp > 1), recompute
 * none or full, fp32 or bf16 (unless fixed), buckets as for the built-in models, and every
 * micro-batch size dividing the per-rank batch; each checked against the def
 * (ms_strategy_check_def) before it is priced. */
static ms_status search_def_mesh(search_run *r, const ms_model_def *d, int dp, int tp, int pp,
                                 ms_error *err) {
    const ms_plan_fixed *f = r->f;
    const int per = r->pb->global_batch / dp;
    const ms_job_shape job = ms_plan_job(r->pb);
    const int fbk = fixed_int(f, MS_SET_bucket_mb);
    const int bks[2] = {fbk > 0 ? fbk : 0, 25};
    const int nbk = fbk < 0 && !r->pb->cluster->cpu && dp > 1 ? 2 : 1;
    const int fpr = fixed_int(f, MS_SET_precision);
    static const uint8_t recompute[2] = {MS_RECOMPUTE_NONE, MS_RECOMPUTE_FULL};
    static const uint8_t precision[2] = {MS_PRECISION_FP32, MS_PRECISION_BF16};
    for (int pr = 0; pr < 2; pr++)
        for (int z = 0; z <= (dp > 1 ? 3 : 0); z++)
            for (int rc = 0; rc < 2; rc++)
                for (int bk = 0; bk < nbk; bk++)
                    for (int mb = 1; mb <= per; mb++) {
                        if (per % mb || (fpr >= 0 && fpr != precision[pr])) continue;
                        ms_strategy s;
                        ms_strategy_defaults(&s);
                        s.dp = dp, s.tp = tp, s.pp = pp;
                        s.zero = z;
                        s.recompute = recompute[rc];
                        s.micro_batches = per / mb;
                        s.precision = precision[pr];
                        s.offload = fixed_int(f, MS_SET_offload) == 1;
                        ms_plan_fixed_apply(f, &s);
                        s.bucket_mb = (float)bks[bk];
                        if (ms_strategy_check_def(&s, d, &job, NULL) != MS_OK) continue;
                        MS_CHECK(weigh(r, &s, err));
                    }
    return MS_OK;
}

/* Every dp x tp x pp mesh of the devices for a program's own model: pp up to its blocks, dp
 * dividing the batch (no cp: its rows are the unit, seq 1). */
static ms_status search_def_meshes(search_run *r, const ms_model_def *d, ms_error *err) {
    const ms_plan_fixed *f = r->f;
    const int D = r->pb->devices, B = r->pb->global_batch;
    if (fixed_int(f, MS_SET_cp) > 1 || fixed_int(f, MS_SET_sp) == 1) return MS_OK;
    for (int tp = 1; tp <= D; tp++) {
        if (D % tp || (fixed_int(f, MS_SET_tp) >= 0 && fixed_int(f, MS_SET_tp) != tp)) continue;
        for (int pp = 1; tp * pp <= D && pp <= d->n_blocks; pp++) {
            if ((D / tp) % pp || (fixed_int(f, MS_SET_pp) >= 0 && fixed_int(f, MS_SET_pp) != pp))
                continue;
            int dp = D / (tp * pp);
            if (B % dp || (fixed_int(f, MS_SET_dp) >= 0 && fixed_int(f, MS_SET_dp) != dp)) continue;
            MS_CHECK(search_def_mesh(r, d, dp, tp, pp, err));
        }
    }
    return MS_OK;
}

/* The result's candidates: those that fit, else the best that do not; the best executable
 * one only when it is not the first candidate already. */
static void settle_result(search_run *r) {
    ms_plan_result *out = r->out;
    for (int i = 0; i < r->nfit; i++)
        ms_strategy_name(&r->fit[i].s, r->fit[i].text, sizeof r->fit[i].text);
    for (int i = 0; i < r->nnofit; i++)
        ms_strategy_name(&r->nofit[i].s, r->nofit[i].text, sizeof r->nofit[i].text);
    if (out->have_best_executable)
        ms_strategy_name(&out->best_executable.s, out->best_executable.text,
                         sizeof out->best_executable.text);
    if (r->nfit > 0) {
        out->cands = r->fit;
        out->n_cands = r->nfit;
        r->fit = NULL;
        if (r->nnofit > 0 && better(&r->nofit[0], &out->cands[0])) {
            out->unconstrained = r->nofit[0];
            out->have_unconstrained = true;
        }
    } else {
        out->cands = r->nofit;
        out->n_cands = r->nnofit;
        r->nofit = NULL;
    }
    if (out->have_best_executable && out->n_cands &&
        out->best_executable.executable == out->cands[0].executable &&
        ms_strategy_equal(&out->best_executable.s, &out->cands[0].s))
        out->have_best_executable = false;
    make_reason(r->pb, out);
}

ms_status ms_plan_search(const ms_plan_problem *problem, const ms_plan_search_opts *opts,
                         ms_plan_result *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    /* a memo for the search's own run when the caller has none: strategies that differ only in
     * knobs the pipeline does not see share one simulated bubble */
    ms_plan_problem local = *problem;
    ms_plan_memo *own = local.memo ? NULL : (local.memo = ms_plan_memo_create());
    local = ms_plan_problem_resolved(&local);
    const ms_plan_problem *pb = &local;
    const ms_model_def *user = ms_plan_user_def(pb);
    int64_t t0 = ms_now_ns();
    ms_plan_fixed none;
    ms_plan_fixed_none(&none);
    const ms_model_config *c = &pb->model;
    int D = pb->devices, B = pb->global_batch;
    if (D < 1 || B < 1 || pb->seq < 1) {
        ms_plan_memo_destroy(own);
        return ms_fail(err, MS_ERR_INVALID, "devices, global batch and sequence must be positive");
    }
    search_run r = {
        .pb = pb,
        .f = opts && opts->fixed ? opts->fixed : &none,
        .sc = opts ? opts->scales : NULL,
        .keep = opts && opts->keep > 0 ? opts->keep : 10,
        .exe_only = opts && opts->executable_only,
        .precision = pb->dtype == MS_PLAN_BF16 ? MS_PRECISION_BF16 : MS_PRECISION_FP32,
        .out = out,
    };
    r.fit = xcalloc((size_t)r.keep, sizeof *r.fit);
    r.nofit = xcalloc((size_t)r.keep, sizeof *r.nofit);
    ms_status st = user ? search_def_meshes(&r, user, err) : search_meshes(&r, err);
    if (st == MS_OK && !r.any_valid && !r.first.msg[0] && !user) diagnose(pb, r.f, &r.first);
    if (st == MS_OK && !r.any_valid && user)
        st = ms_fail(err, MS_ERR_INVALID,
                     "no strategy fits the constraints for %d devices and batch %d (%s: %d "
                     "blocks)%s%s",
                     D, B, user->name, user->n_blocks, r.first.msg[0] ? ": " : "",
                     r.first.msg[0] ? r.first.msg
                                    : "; check the fixed knobs and that the batch divides by dp");
    if (st == MS_OK && !r.any_valid)
        st = ms_fail(err, MS_ERR_INVALID,
                     "no strategy fits the constraints for %d devices, batch %d, sequence %d "
                     "(%d layers, %d heads)%s%s",
                     D, B, pb->seq, c->n_layer, c->n_head, r.first.msg[0] ? ": " : "",
                     r.first.msg[0] ? r.first.msg
                                    : "; check the fixed knobs and that the batch "
                                      "divides by dp");
    if (st == MS_OK) settle_result(&r);
    free(r.fit);
    free(r.nofit);
    ms_plan_memo_destroy(own);
    out->search_ms = (double)(ms_now_ns() - t0) / 1e6;
    return st;
}

void ms_plan_result_free(ms_plan_result *r) {
    if (!r) return;
    free(r->cands);
    memset(r, 0, sizeof *r);
}

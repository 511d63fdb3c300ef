/* live_job.c - the live model, dashboard and TUI of a training job, the per-step control
 * exchange and carrying out its decisions. See live_job.h. */
#include "job/live_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/plan/auto_place.h"
#include "engine/plan/validate.h"

bool live_job_wanted(const run_opts *o) {
    return o->web || o->tui || o->switch_spec;
}

/* Bytes per rank a target may need: --memory-cap, else the usable memory of this machine or
 * of a GPU, shared by the ranks that share it (once the cluster is known), else no limit (0). */
static double memory_cap(const live_job *j) {
    if (j->o->memory_cap_mib > 0) return j->o->memory_cap_mib * 1048576.0;
    if (!j->advisor) return 0;
    double cap = j->cluster.mem_bytes * j->cluster.usable_memory_fraction;
    int world = j->plan->world_size;
    int sharing = j->cluster.cpu ? world : (world + j->gpus - 1) / (j->gpus > 0 ? j->gpus : 1);
    return sharing > 1 ? cap / sharing : cap;
}

/* The cluster the advisor prices: this machine's thread ranks, or on CUDA its GPUs
 * (gpu-local; every rank priced as a GPU of its own, ranks that share one are told). */
static ms_status advisor_cluster(live_job *j, const run_opts *o, int world, ms_error *err) {
    ms_device_kind kind = MS_DEVICE_CPU;
    MS_CHECK(ms_device_resolve((ms_device_choice)o->device, &kind, NULL, 0, err));
    if (kind != MS_DEVICE_CUDA)
        return ms_cluster_resolve("cpu-local", false, NULL, &j->cluster, err);
    MS_CHECK(ms_cluster_resolve("gpu-local", false, stderr, &j->cluster, err));
    j->gpus = j->cluster.devices_per_node;
    j->cluster.devices_per_node = world > j->gpus ? world : j->gpus;
    if (world > j->gpus)
        fprintf(stderr,
                "note: %d ranks share %d GPU%s; the advisor prices each rank as a GPU of its "
                "own\n",
                world, j->gpus, j->gpus == 1 ? "" : "s");
    return MS_OK;
}

ms_status live_job_check_target(const live_job *j, const ms_strategy *s, ms_error *err) {
    ms_job_shape job = {.world = j->plan->world_size, .batch = j->o->batch, .seq = j->o->seq};
    return ms_strategy_validate_def(s, &j->plan->def, &job, memory_cap(j), err);
}

/* live_job_check_target through the job's verdicts: each strategy is compiled for the
 * memory check once per job (needs j->mu, so a live job). */
static ms_status check_target_cached(live_job *j, const ms_strategy *s, ms_error *err) {
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_verdicts; i++)
        if (ms_strategy_equal(&j->verdicts[i].s, s)) {
            ms_status st = j->verdicts[i].st;
            if (st != MS_OK) ms_fail(err, st, "%s", j->verdicts[i].msg);
            pthread_mutex_unlock(&j->mu);
            return st;
        }
    pthread_mutex_unlock(&j->mu);
    ms_error e = {0};
    ms_status st = live_job_check_target(j, s, &e);
    pthread_mutex_lock(&j->mu);
    live_verdict *v = &j->verdicts[j->next_verdict];
    j->next_verdict = (j->next_verdict + 1) % LIVE_JOB_VERDICTS;
    if (j->n_verdicts < LIVE_JOB_VERDICTS) j->n_verdicts++;
    v->s = *s, v->st = st;
    snprintf(v->msg, sizeof v->msg, "%s", e.msg);
    pthread_mutex_unlock(&j->mu);
    if (st != MS_OK) *err = e;
    return st;
}

/* On the live thread, once: the verdict of every dp x tp x cp (+sp) mesh of this world, so
 * that a dashboard request for any of them is answered without compiling on its thread. */
static void warm_verdicts(live_job *j) {
    int world = j->plan->world_size;
    for (int tp = 1; tp <= world; tp++)
        for (int cp = 1; tp * cp <= world; cp++)
            for (int sp = 0; sp <= (tp > 1) && world % (tp * cp) == 0; sp++) {
                ms_strategy s;
                ms_error e = {0};
                if (ms_strategy_init(&s, world / (tp * cp), tp, cp, sp, &e) == MS_OK)
                    check_target_cached(j, &s, &e);
            }
    j->warmed = true;
}

/* Parses a target (short form or strategy-file form, placements included) and checks it. */
static ms_status parse_target(const live_job *j, const char *json, const char *name, ms_strategy *s,
                              ms_placement_rules *rules, ms_error *err) {
    MS_CHECK(ms_strategy_parse_json(json, strlen(json), name, s, rules, err));
    return live_job_check_target(j, s, err);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double live_job_median(const double *v, int n) {
    if (n <= 0) return 0;
    double *tmp = xmalloc(sizeof *tmp * (size_t)n);
    memcpy(tmp, v, sizeof *tmp * (size_t)n);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_double);
    double m = n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
    free(tmp);
    return m;
}

/* The layout behind this round's "placements searched" suggestion, if it has one, kept for
 * its accept (request_target). */
static void remember_priced_layout(live_job *j, const ms_strategy *cur, const ms_suggestion *g,
                                   int n) {
    for (int i = 0; i < n; i++) {
        if (!strstr(g[i].target_json, "\"placements\": \"auto\"")) continue;
        ms_placement_rules *rules = xmalloc(sizeof *rules);
        if (!ms_advisor_searched_rules(j->advisor, cur, rules)) {
            free(rules);
            return;
        }
        pthread_mutex_lock(&j->mu);
        free(j->priced_layout);
        j->priced_layout = rules;
        j->priced_layout_id = g[i].id;
        pthread_mutex_unlock(&j->mu);
        return;
    }
}

/* Steps whose median is the current step time the advisor prices against. */
#define ADVISE_STEPS 32

/* The live thread's advisor round: recalibrate on the analysed window, if every step in it
 * ran the current strategy, and publish what is predicted to be faster. */
static void advise(void *user, ms_live *l, const ms_snapshot *s) {
    live_job *j = user;
    const ms_analysis *an = &s->analysis;
    if (!j->warmed) warm_verdicts(j);
    if (!j->advisor || an->n_steps < 2 || s->n_history < an->n_steps) return;
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    pthread_mutex_lock(&j->mu);
    ms_strategy cur = j->current;
    *rules = j->current_rules;
    int64_t since = j->current_since;
    bool have = j->has_current;
    pthread_mutex_unlock(&j->mu);
    ms_advisor_set_placements(j->advisor, rules);
    free(rules);
    if (!have) return;
    for (int i = 0; i < an->n_steps; i++)
        if (an->steps[i].step < since) return; /* the window straddles a switch */
    /* The step time every gain is taken against: the median of the last ADVISE_STEPS steps
     * under this strategy, not of the analysed window alone. A short window on shared cores
     * swung by half from one round to the next on two shared cores, and every gain with it. */
    double times[ADVISE_STEPS];
    int n = 0;
    for (int k = s->n_history - 1; k >= 0 && n < ADVISE_STEPS && s->history[k].step >= since; k--)
        times[n++] = s->history[k].step_s;
    if (n < an->n_steps) return;
    double median = live_job_median(times, n);
    ms_suggestion out[MS_LIVE_MAX_SUGGESTIONS];
    int got = 0;
    ms_error err = {0};
    /* Candidates down to half the threshold, so that open suggestions can stay open
     * (hysteresis: ms_suggestions_next). */
    double open_at =
        j->o->advise_threshold > 0 ? j->o->advise_threshold : MS_ADVISOR_DEFAULT_THRESHOLD;
    if (ms_advisor_update(j->advisor, &cur, an, median, open_at / 2, out, MS_LIVE_MAX_SUGGESTIONS,
                          &got, &err) != MS_OK) {
        ms_live_set_event(l, "advisor: %s", err.msg);
        return;
    }
    remember_priced_layout(j, &cur, out, got);
    /* A model that has missed the measured step for rounds suggests nothing: the live model
     * withdraws what is open and the views show why. */
    const char *note = ms_advisor_note(j->advisor);
    if (note[0])
        ms_live_withhold_suggestions(l, note);
    else
        ms_live_set_suggestions(l, out, got, open_at);
}

/* Strategy s with `rules` as its whole layout, as strategy JSON every rank compiles alike
 * (owned). */
static char *json_with_layout(const ms_strategy *s, const ms_placement_rules *rules) {
    char *out = xmalloc(MS_STRATEGY_JSON_MAX + 16384);
    ms_strategy_short_json(s, out, MS_STRATEGY_JSON_MAX);
    size_t n = strlen(out);
    if (n && out[n - 1] == '}') out[--n] = '\0';
    snprintf(out + n, 32, "%s\"placements\": ", n > 1 ? ", " : "");
    n = strlen(out);
    ms_auto_place_rules_str(rules, out + n, 16384 - 8);
    strcat(out, "}");
    return out;
}

/* An accepted "placements searched" suggestion: *json (its target, saying "auto") becomes the
 * strategy with the layout the advisor priced it with, so the job runs what the user accepted
 * and does not search again. Left as it is when no layout is kept for `id`. */
static ms_status apply_priced_layout(live_job *j, int32_t id, char **json, ms_error *err) {
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    pthread_mutex_lock(&j->mu);
    bool have = j->priced_layout && j->priced_layout_id == id;
    if (have) *rules = *j->priced_layout;
    pthread_mutex_unlock(&j->mu);
    ms_strategy s;
    ms_placement_rules *said = xmalloc(sizeof *said);
    ms_status st = MS_OK;
    if (have) st = ms_strategy_parse_json(*json, strlen(*json), "strategy", &s, said, err);
    if (st == MS_OK && have && said->auto_place) {
        free(*json);
        *json = json_with_layout(&s, rules);
    }
    free(said);
    free(rules);
    return st;
}

/* The strategy JSON a request targets (owned copy): its own body, or the accepted
 * suggestion's. */
static ms_status request_target(live_job *j, const ms_live_req *req, char **json, ms_error *err) {
    if (req->kind == MS_REQ_STRATEGY) {
        *json = xstrdup(req->strategy_json);
        return MS_OK;
    }
    const ms_snapshot *s = ms_live_acquire(j->live);
    ms_status st = ms_fail(err, MS_ERR_INVALID, "no suggestion with id %d", (int)req->id);
    for (int i = 0; i < s->n_suggestions; i++)
        if (s->suggestions[i].id == req->id) {
            *json = xstrdup(s->suggestions[i].target_json);
            st = MS_OK;
        }
    ms_snapshot_release(s);
    if (st == MS_OK) st = apply_priced_layout(j, req->id, json, err);
    if (st != MS_OK && *json) {
        free(*json);
        *json = NULL;
    }
    return st;
}

/* The control queue's validator: runs on the view's thread before a request is queued, so a
 * refused switch is answered at once (422) and the job never sees it. */
static ms_status validate_request(void *user, const ms_live_req *req, ms_error *err) {
    live_job *j = user;
    if (req->kind != MS_REQ_STRATEGY && req->kind != MS_REQ_ACCEPT) return MS_OK;
    char *json = NULL;
    MS_CHECK(request_target(j, req, &json, err));
    ms_strategy s;
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    ms_status st = ms_strategy_parse_json(json, strlen(json), "strategy", &s, rules, err);
    /* A target with its own placement rules is checked afresh; a plain mesh by its verdict. */
    if (st == MS_OK)
        st = rules->n ? live_job_check_target(j, &s, err) : check_target_cached(j, &s, err);
    free(rules);
    free(json);
    return st;
}

/* Checks --switch; fills the parts of j that need no live model. */
static ms_status job_prepare(live_job *j, const run_opts *o, const job_plan *plan, ms_error *err) {
    memset(j, 0, sizeof *j);
    j->o = o;
    j->plan = plan;
    j->switch_step = -1;
    j->measure_from = -1;
    if (!o->switch_spec) return MS_OK;
    const char *colon = strchr(o->switch_spec, ':');
    char *end = NULL;
    long step = colon ? strtol(o->switch_spec, &end, 10) : -1;
    if (!colon || end != colon || step < 0 || step > 100000000)
        return ms_fail(err, MS_ERR_INVALID,
                       "--switch '%s': expected STEP:STRATEGY, e.g. --switch "
                       "'50:{\"dp\": 2, \"tp\": 2}'",
                       o->switch_spec);
    ms_strategy s;
    if (strlen(colon + 1) > LIVE_JOB_MAX_STRATEGY)
        return ms_fail(err, MS_ERR_INVALID, "--switch: the strategy is %zu bytes; at most %d",
                       strlen(colon + 1), LIVE_JOB_MAX_STRATEGY);
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    ms_status st = parse_target(j, colon + 1, "--switch", &s, rules, err);
    free(rules);
    MS_CHECK(st);
    j->switch_step = (int)step;
    j->switch_json = xstrdup(colon + 1);
    return MS_OK;
}

ms_status live_job_check_options(const run_opts *o, const job_plan *plan, ms_error *err) {
    live_job j;
    ms_status st = job_prepare(&j, o, plan, err);
    free(j.switch_json);
    return st;
}

ms_status live_job_open(live_job *j, const run_opts *o, const job_plan *plan, ms_error *err) {
    MS_CHECK(job_prepare(j, o, plan, err));
    int world_size = plan->world_size;
    ms_live_opts lo = {.info = {.nranks = world_size,
                                .tokens_per_step = (int64_t)o->batch * o->seq,
                                .live = true}};
    snprintf(lo.info.model, sizeof lo.info.model, "%s", o->model);
    snprintf(lo.info.backend, sizeof lo.info.backend, "%s", ms_backend_name(o->backend));
    MS_CHECK(ms_live_create(&lo, &j->live, err));
    pthread_mutex_init(&j->mu, NULL);
    ms_live_set_validator(j->live, validate_request, j);
    ms_status st = MS_OK;
    if ((o->web || o->tui) && o->backend == MS_BACKEND_THREADS) {
        /* The advisor prices strategies for this machine's thread ranks (measured once, a few
         * seconds, then cached), or for its GPUs. */
        st = advisor_cluster(j, o, world_size, err);
        if (st == MS_OK)
            st = ms_advisor_create(&plan->def, world_size, o->batch, o->seq, &j->cluster,
                                   &j->advisor, err);
        if (st == MS_OK) {
            ms_advisor_set_memory_cap(j->advisor, memory_cap(j));
            ms_live_set_advisor(j->live, advise, j, 2000);
        }
    }
    if (st == MS_OK) st = ms_live_start(j->live, err);
    if (st == MS_OK && o->web) {
        char host[64];
        ms_web_opts wo = {.token_file = o->web_token_file};
        st = ms_web_parse_hostport(o->web, host, sizeof host, &wo.port, err);
        wo.host = host;
        if (st == MS_OK) st = ms_web_start(j->live, &wo, &j->web, err);
        if (st == MS_OK) {
            printf("dashboard: %s\n", ms_web_url(j->web));
            fflush(stdout);
            ms_live_set_event(j->live, "dashboard: %s", ms_web_url(j->web));
        }
    }
    if (st == MS_OK && o->tui) st = ms_tui_start(j->live, &j->tui, err);
    if (st != MS_OK) live_job_close(j);
    return st;
}

ms_status live_job_for_rank(ms_ctx *ctx, const run_opts *o, const job_plan *plan, live_job *shared,
                            live_job *own, live_job **out, ms_error *err) {
    memset(own, 0, sizeof *own);
    *out = shared;
    if (!live_job_wanted(o) || ctx->backend != MS_BACKEND_MPI) return MS_OK;
    *out = NULL;
    if (ctx->rank != 0) return MS_OK; /* only receives decisions */
    MS_CHECK(live_job_open(own, o, plan, err));
    *out = own;
    return MS_OK;
}

void live_job_release_rank(live_job *own) {
    if (!own->live) return;
    live_job_finish(own);
    live_job_close(own);
}

void live_job_finish(live_job *j) {
    if (!j->live) return;
    ms_live_stop(j->live);
    while (j->tui && !ms_tui_done(j->tui)) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void live_job_close(live_job *j) {
    bool had_live = j->live != NULL;
    ms_tui_stop(j->tui);
    ms_web_stop(j->web);
    ms_live_destroy(j->live); /* stops the live thread, the advisor's only caller */
    ms_advisor_destroy(j->advisor);
    j->advisor = NULL;
    if (had_live) pthread_mutex_destroy(&j->mu);
    if (j->epilogue.len) fputs(j->epilogue.p, stdout);
    free(j->epilogue.p);
    j->epilogue = (ms_strbuf){0};
    free(j->switch_json);
    j->switch_json = NULL;
    free(j->priced_layout);
    j->priced_layout = NULL;
    j->tui = NULL, j->web = NULL, j->live = NULL;
}

void control_free(control *c) {
    free(c->strategy);
    memset(c, 0, sizeof *c);
}

/* A target saying "placements": "auto" (alone or beside pins): the search runs here, on rank
 * 0 between steps, and *json becomes the strategy with the layout found written out, so that
 * every rank compiles the same program. Other targets are left as they are. */
static ms_status resolve_auto_target(live_job *j, char **json, ms_error *err) {
    ms_strategy s;
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    ms_auto_place_result *r = NULL;
    ms_status st = ms_strategy_parse_json(*json, strlen(*json), "strategy", &s, rules, err);
    if (st == MS_OK && rules->auto_place) {
        r = xmalloc(sizeof *r);
        st = job_auto_placements(j->o, j->plan, &s, rules, r, err);
    }
    if (st == MS_OK && r) {
        free(*json);
        *json = json_with_layout(&s, &r->rules);
        char name[MS_STRATEGY_NAME_MAX];
        if (j->live)
            ms_live_set_event(j->live,
                              "auto placements for %s: predicted %.1f ms a step, %d layouts "
                              "compiled in %.0f ms",
                              ms_strategy_name(&s, name, sizeof name), r->best.step_s * 1e3,
                              r->compiles, r->search_ms);
    }
    free(r);
    free(rules);
    return st;
}

/* Rank 0's decision for this step. */
static void decide(live_job *j, int step, control *c) {
    memset(c, 0, sizeof *c);
    ms_error err = {0};
    if (j->switch_step == step) {
        c->kind = CONTROL_SWITCH;
        c->strategy = xstrdup(j->switch_json);
        j->switch_taken = true;
        if (resolve_auto_target(j, &c->strategy, &err) != MS_OK) {
            if (j->live) ms_live_set_event(j->live, "--switch refused: %s", err.msg);
            control_free(c);
        }
        return;
    }
    ms_live_req req;
    if (!j->live || !ms_live_take(j->live, &req)) return;
    if (req.kind == MS_REQ_STOP) {
        c->kind = CONTROL_STOP;
        return;
    }
    if (request_target(j, &req, &c->strategy, &err) != MS_OK ||
        resolve_auto_target(j, &c->strategy, &err) != MS_OK) {
        ms_live_set_event(j->live, "request refused: %s", err.msg);
        if (req.kind == MS_REQ_ACCEPT) ms_live_suggestion_refused(j->live, req.id, err.msg);
        control_free(c);
        return;
    }
    c->kind = CONTROL_SWITCH;
    c->suggestion = req.kind == MS_REQ_ACCEPT ? req.id : 0;
}

ms_status live_job_control(live_job *j, ms_comm *comm, int step, control *out, ms_error *err) {
    /* Every step: kind, suggestion id and strategy length (three int32); the strategy text
     * follows only when switching, so a plain step moves 12 bytes and allocates nothing. */
    int32_t hdr[3] = {0, 0, 0};
    if (ms_comm_rank(comm) == 0) {
        decide(j, step, out);
        size_t n = out->strategy ? strlen(out->strategy) : 0;
        if (n > LIVE_JOB_MAX_STRATEGY) {
            if (j->live)
                ms_live_set_event(j->live, "request refused: a strategy of %zu bytes (at most %d)",
                                  n, LIVE_JOB_MAX_STRATEGY);
            control_free(out);
            n = 0;
        }
        hdr[0] = (int32_t)out->kind, hdr[1] = out->suggestion, hdr[2] = (int32_t)n;
    } else {
        memset(out, 0, sizeof *out);
    }
    ms_status st = ms_broadcast_bytes(comm, hdr, sizeof hdr, 0, err);
    if (st == MS_OK && ms_comm_rank(comm) != 0) {
        out->kind = (control_kind)hdr[0];
        out->suggestion = hdr[1];
        if (out->kind == CONTROL_SWITCH) {
            out->strategy = xmalloc((size_t)hdr[2] + 1);
            out->strategy[hdr[2]] = '\0';
        }
    }
    if (st == MS_OK && out->kind == CONTROL_SWITCH && hdr[2] > 0)
        st = ms_broadcast_bytes(comm, out->strategy, (size_t)hdr[2], 0, err);
    if (st != MS_OK) control_free(out);
    return st;
}

/* --- carrying out a decision ------------------------------------------------------------ */

/* Rank 0 after a switch (and at the start): the strategy the steps from `step` on run. */
static void set_current(live_job *j, const ms_strategy *s, const ms_placement_rules *rules,
                        int64_t step) {
    if (!j || !j->live) return;
    pthread_mutex_lock(&j->mu);
    j->current = *s;
    j->current_rules = *rules;
    j->current_since = step;
    j->has_current = true;
    pthread_mutex_unlock(&j->mu);
    char name[MS_STRATEGY_NAME_MAX];
    ms_live_set_strategy(j->live, job_strategy_name(s, rules, name, sizeof name));
}

static void switched(live_job *j, const control *c, int step, const char *before, const char *after,
                     double ms, bool quiet) {
    if (!quiet)
        printf("step %5d  switched %s -> %s in %.1f ms (parameters and Adam moments resharded "
               "in memory)\n",
               step, before, after, ms);
    if (!j || !j->live) return;
    ms_live_set_event(j->live, "switched %s -> %s at step %d in %.0f ms", before, after, step, ms);
    if (c->suggestion) ms_live_suggestion_applied(j->live, c->suggestion, step, false);
    j->measure_from = step;
    j->measured_suggestion = c->suggestion;
    j->before_ms = live_job_median(j->recent, j->n_recent);
    j->n_recent = 0;
}

/* A target the job runs already: nothing to reshard. */
static void unchanged(live_job *j, const control *c, int step, const char *name, bool quiet) {
    if (!quiet)
        printf("step %5d  switch to %s: the job runs it already; nothing changes\n", step, name);
    if (!j || !j->live) return;
    ms_live_set_event(j->live, "switch to %s at step %d: the job runs it already; nothing changes",
                      name, step);
    if (c->suggestion) ms_live_suggestion_applied(j->live, c->suggestion, step, true);
}

static void refused(live_job *j, const control *c, int step, const char *why, bool quiet) {
    if (!quiet) printf("step %5d  switch refused: %s\n", step, why);
    if (!j || !j->live) return;
    ms_live_set_event(j->live, "switch refused: %s", why);
    if (c->suggestion) ms_live_suggestion_refused(j->live, c->suggestion, why);
}

ms_status live_job_apply(live_job *j, ms_ctx *ctx, ms_trainer *t, const control *c, int step,
                         bool quiet, ms_error *err) {
    if (c->kind == CONTROL_STOP) {
        if (ctx->rank == 0 && j && j->live) ms_live_set_event(j->live, "stopped at step %d", step);
        return MS_OK;
    }
    if (c->kind != CONTROL_SWITCH) return MS_OK;
    ms_strategy target;
    ms_error why = {0};
    char before[MS_STRATEGY_NAME_MAX], after[MS_STRATEGY_NAME_MAX];
    ms_strategy_name(ms_trainer_strategy(t), before, sizeof before);
    int64_t t0 = ms_now_ns();
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    ms_status st =
        ms_strategy_parse_json(c->strategy, strlen(c->strategy), "strategy", &target, rules, &why);
    if (st == MS_OK && ms_trainer_runs(t, &target, rules)) {
        free(rules); /* every rank sees the same: none reshards */
        if (ctx->rank == 0) unchanged(j, c, step, before, quiet);
        return MS_OK;
    }
    if (st == MS_OK) st = ms_trainer_switch(t, &target, rules, &why);
    free(rules);
    if (st == MS_OK) {
        if (ctx->rank == 0) {
            ms_strategy_name(ms_trainer_strategy(t), after, sizeof after);
            const ms_placement_rules *now = ms_trainer_rules(t);
            if (now->n || now->no_hints) { /* the layout is the switch's too: say so */
                size_t k = strlen(after);
                snprintf(after + k, sizeof after - k, " (%d placement rule%s%s)", now->n,
                         now->n == 1 ? "" : "s", now->no_hints ? ", the rest completed" : "");
            }
            switched(j, c, step, before, after, (ms_now_ns() - t0) / 1e6, quiet);
            set_current(j, ms_trainer_strategy(t), ms_trainer_rules(t), step);
        }
        return MS_OK;
    }
    if (st == MS_ERR_INVALID || st == MS_ERR_UNSUPPORTED) {
        /* A target the job cannot take is refused; training goes on unchanged. */
        if (ctx->rank == 0) refused(j, c, step, why.msg, quiet);
        return MS_OK;
    }
    *err = why;
    return st;
}

/* Steps measured under a new strategy before its report: the first one after the switch
 * (which may still settle in) is left out of the measure. */
#define SWITCH_MEASURE 10

/* A line for stdout, or kept for after the TUI, which owns the terminal. */
static void say(live_job *j, bool quiet, const char *line) {
    if (quiet) {
        ms_strbuf_printf(&j->epilogue, "%s\n", line);
    } else {
        printf("%s\n", line);
        fflush(stdout);
    }
}

/* Once the new strategy has run SWITCH_MEASURE steps after its first: the switch's one report
 * (ms_advisor_switch_result), predicted against measured, on stdout and in the views. The
 * measure before is the median of the (up to LIVE_JOB_RECENT) steps before the switch, after
 * it the median of steps measure_from + 1 .. measure_from + SWITCH_MEASURE. */
static void report_switch(live_job *j, int64_t step) {
    if (j->measure_from < 0 || step < j->measure_from + SWITCH_MEASURE) return;
    int n = j->n_recent < SWITCH_MEASURE ? j->n_recent : SWITCH_MEASURE;
    double after_ms = live_job_median(j->recent + j->n_recent - n, n);
    ms_suggestion sugg, *s = NULL;
    if (j->measured_suggestion && ms_live_suggestion_get(j->live, j->measured_suggestion, &sugg))
        s = &sugg;
    char text[MS_LIVE_TEXT], line[MS_LIVE_TEXT + 64];
    ms_advisor_switch_result(s, j->before_ms / 1e3, after_ms / 1e3, text, sizeof text);
    if (s) ms_live_suggestion_measured(j->live, s->id, text);
    ms_live_set_event(j->live, "switch at step %lld: %s", (long long)j->measure_from, text);
    snprintf(line, sizeof line, "step %5lld  switch at step %lld: %s", (long long)step,
             (long long)j->measure_from, text);
    say(j, j->o->tui, line);
    j->measure_from = -1;
}

void live_job_step_done(live_job *j, const ms_trainer *t, const ms_step_result *r, double ms) {
    if (!j || !j->live) return;
    if (r->step == 0 || !j->has_current)
        set_current(j, ms_trainer_strategy(t), ms_trainer_rules(t), r->step);
    if (j->n_recent == LIVE_JOB_RECENT)
        memmove(j->recent, j->recent + 1, sizeof *j->recent * --j->n_recent);
    j->recent[j->n_recent++] = ms;
    const ms_train_opts *o = ms_trainer_opts(t);
    ms_live_step rec = {.step = r->step,
                        .loss = r->loss,
                        .step_s = ms / 1e3,
                        .tokens_per_s = (double)o->batch * o->seq / (ms / 1e3),
                        .lr = r->lr,
                        .grad_norm = r->grad_norm};
    ms_strategy_name(ms_trainer_strategy(t), rec.strategy, sizeof rec.strategy);
    ms_live_step_done(j->live, &rec);
    report_switch(j, r->step);
}

/* --- the end of training ---------------------------------------------------------------------- */

/* A target's name ("dp2 x tp2"), or its JSON as given when it does not parse. */
static void target_name(const char *json, char *out, size_t len) {
    ms_strategy s;
    ms_placement_rules *rules = xmalloc(sizeof *rules);
    if (ms_strategy_parse_json(json, strlen(json), "strategy", &s, rules, NULL) == MS_OK)
        ms_strategy_name(&s, out, len);
    else
        snprintf(out, len, "%s", json);
    free(rules);
}

/* One switch that will never be carried out: said on stdout (or after the TUI) and in the
 * views; an accepted suggestion becomes dropped. */
static void not_applied(live_job *j, const char *json, const char *when, int32_t suggestion,
                        int64_t last_step, bool quiet) {
    char name[MS_STRATEGY_NAME_MAX], line[MS_STRATEGY_NAME_MAX + 256];
    target_name(json, name, sizeof name);
    snprintf(line, sizeof line, "the switch to %s %s was not applied: the run ended at step %lld",
             name, when, (long long)last_step);
    say(j, quiet, line);
    if (!j->live) return;
    ms_live_set_event(j->live, "%s", line);
    if (suggestion) ms_live_suggestion_dropped(j->live, suggestion, last_step);
}

void live_job_end(live_job *j, int64_t last_step, bool quiet) {
    if (!j) return;
    char when[96];
    if (j->switch_step >= 0 && !j->switch_taken) {
        snprintf(when, sizeof when, "for step %d (--switch)", j->switch_step);
        not_applied(j, j->switch_json, when, 0, last_step, quiet);
    }
    if (!j->live) return;
    ms_live_req *left = xmalloc(sizeof *left * MS_LIVE_QUEUE);
    int n = ms_live_close_control(j->live, left);
    for (int i = 0; i < n; i++) {
        char *json = NULL;
        if (left[i].kind == MS_REQ_STOP || request_target(j, &left[i], &json, NULL) != MS_OK)
            continue; /* a stop: the run has ended anyway */
        if (left[i].step >= 0)
            snprintf(when, sizeof when, "requested at step %lld", (long long)left[i].step);
        else
            snprintf(when, sizeof when, "requested before the first step");
        not_applied(j, json, when, left[i].kind == MS_REQ_ACCEPT ? left[i].id : 0, last_step,
                    quiet);
        free(json);
    }
    free(left);
}

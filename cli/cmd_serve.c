/* cmd_serve.c - `meshscope serve TRACE.json [--web HOST:PORT] [--web-token-file FILE]`: the
 * dashboard over a trace file instead of a running job.
 *
 * The trace's events and groups go into a live model (info.live = false, so the control
 * routes answer 409), which analyses every step of the file at once; the step slices of the
 * lowest rank become the step history (no loss: a trace does not record it). Prints one line,
 * "dashboard: URL", and serves until SIGINT or SIGTERM.
 *
 * Exit codes: 0 after a signal, 1 when the trace cannot be read or the server cannot start,
 * 2 for usage errors.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "profiler/live.h"
#include "traces/trace_read.h"
#include "web/web.h"

#include "cli/options.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static int step_cmp(const void *a, const void *b) {
    const ms_live_step *x = a, *y = b;
    return (x->step > y->step) - (x->step < y->step);
}

/* The step history from the lowest rank's step slices (time only, no loss), oldest first,
 * into the live model. */
static void feed_history(ms_live *live, const ms_trace *t, int min_rank, size_t n_steps,
                         const char *strategy) {
    ms_live_step *hist = n_steps ? calloc(n_steps, sizeof *hist) : NULL;
    size_t k = 0;
    for (size_t i = 0; hist && i < t->n_events; i++) {
        const ms_event *e = &t->events[i];
        if (e->kind != MS_EV_STEP || e->rank != min_rank) continue;
        ms_live_step *s = &hist[k++];
        s->step = e->step;
        s->loss = NAN;
        s->lr = NAN;
        s->grad_norm = NAN;
        s->step_s = (double)(e->t1_ns - e->t0_ns) / 1e9;
        s->tokens_per_s = NAN;
        snprintf(s->strategy, sizeof s->strategy, "%s", strategy);
    }
    if (hist) qsort(hist, k, sizeof *hist, step_cmp);
    for (size_t i = 0; i < k; i++) ms_live_step_done(live, &hist[i]);
    free(hist);
}

/* A finished live model over every step of trace t (read from path), analysed at once;
 * *nranks the ranks it shows. Fails when the trace has more ranks than the views show. */
static ms_status trace_live(const char *path, const ms_trace *t, ms_live **out, int *nranks_out,
                            ms_error *err) {
    int nranks = t->world_size;
    int64_t lo = INT64_MAX, hi = -1;
    for (size_t i = 0; i < t->n_events; i++) {
        const ms_event *e = &t->events[i];
        if (e->rank >= nranks) nranks = e->rank + 1;
        if (e->step >= 0 && e->step < lo) lo = e->step;
        if (e->step > hi) hi = e->step;
    }
    if (nranks < 1) nranks = 1;
    if (nranks > MS_AN_MAX_RANKS)
        return ms_fail(err, MS_ERR_INVALID, "%s: %d ranks; the dashboard shows at most %d", path,
                       nranks, MS_AN_MAX_RANKS);
    char strategy[64];
    ms_trace_strategy_text(t, strategy, sizeof strategy);
    int64_t window = hi >= 0 && lo <= hi ? hi - lo + 1 : 1;
    ms_live_opts lo_opts = {.info = {.nranks = nranks, .live = false},
                            .window_steps = window < (1 << 20) ? (int)window : 1 << 20};
    const char *base = strrchr(path, '/');
    snprintf(lo_opts.info.model, sizeof lo_opts.info.model, "%s", base ? base + 1 : path);
    snprintf(lo_opts.info.backend, sizeof lo_opts.info.backend, "trace");
    int min_rank = nranks;
    size_t n_steps = 0;
    for (size_t i = 0; i < t->n_events; i++)
        if (t->events[i].kind == MS_EV_STEP && t->events[i].rank < min_rank)
            min_rank = t->events[i].rank;
    for (size_t i = 0; i < t->n_events; i++)
        n_steps += t->events[i].kind == MS_EV_STEP && t->events[i].rank == min_rank;
    lo_opts.history = n_steps > 0 && n_steps < (1u << 20) ? (int)n_steps : 0;
    ms_live *live = NULL;
    MS_CHECK(ms_live_create(&lo_opts, &live, err));
    feed_history(live, t, min_rank, n_steps, strategy);
    ms_live_set_strategy(live, strategy);
    ms_live_feed_groups(live, t->groups, t->n_groups);
    ms_live_feed_events(live, t->events, t->n_events);
    ms_live_set_event(live, "trace %s: %zu events, %d ranks", path, t->n_events, nranks);
    ms_live_publish_now(live);
    *out = live;
    *nranks_out = nranks;
    return MS_OK;
}

int ms_cmd_serve(int argc, char **argv) {
    const char *pos[1], *web = "127.0.0.1:0", *token_file = NULL;
    const ms_option opts[] = {
        MS_TEXT("web", "HOST:PORT", &web, "where to serve (default 127.0.0.1:0, any free port)"),
        MS_TEXT("web-token-file", "FILE", &token_file,
                "write the dashboard's token to FILE (mode 0600, removed at exit), for "
                "meshscope top --token-file FILE"),
    };
    const ms_opts_cmd cmd = {.name = "serve",
                             .synopsis = "TRACE.json [--web HOST:PORT] [--web-token-file FILE]",
                             .about = "Serves the web dashboard over a trace file and prints its "
                                      "URL; Ctrl-C stops.",
                             MS_OPTS_TABLE(opts),
                             .min_pos = 1,
                             .pos_name = "a trace file"};
    int rc = ms_opts_run(&cmd, argc, argv, pos, 1, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    const char *path = pos[0];
    char host[64];
    int port = 0;
    ms_error err = {0};
    if (ms_web_parse_hostport(web, host, sizeof host, &port, &err) != MS_OK) {
        fprintf(stderr, "meshscope serve: %s\n", err.msg);
        return 2;
    }

    ms_trace t = {0};
    if (ms_trace_read(path, &t, &err) != MS_OK) {
        fprintf(stderr, "meshscope serve: %s\n", err.msg);
        ms_trace_free(&t);
        return 1;
    }
    int nranks = 0;
    ms_live *live = NULL;
    if (trace_live(path, &t, &live, &nranks, &err) != MS_OK) {
        fprintf(stderr, "meshscope serve: %s\n", err.msg);
        ms_trace_free(&t);
        return 1;
    }
    size_t n_events = t.n_events;
    ms_trace_free(&t);

    /* The handlers only set a flag (libraries such as OpenBLAS own threads that would take a
     * blocked-signal sigwait's signal by default); this thread polls it. */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    ms_web_opts wo = {.host = host, .port = port, .token_file = token_file};
    ms_web *w = NULL;
    if (ms_web_start(live, &wo, &w, &err) != MS_OK) {
        fprintf(stderr, "meshscope serve: %s\n", err.msg);
        ms_live_destroy(live);
        return 1;
    }
    printf("dashboard: %s\n", ms_web_url(w));
    fflush(stdout);
    fprintf(stderr, "meshscope serve: %s (%zu events, %d ranks); Ctrl-C stops\n", path, n_events,
            nranks);
    while (!g_stop) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    ms_web_stop(w);
    ms_live_destroy(live);
    return 0;
}

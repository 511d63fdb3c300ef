/* live.c - the live model: a window of recent events, analysed off the training threads
 * into immutable, reference-counted snapshots; plus the control queue.
 *
 * Locks: `mu` guards the small shared state (history, strategy, suggestions, queue, the
 * published snapshot pointer, fed events). Rank 0 holds it for a struct copy per step; the
 * views hold it for a pointer copy; the builder holds it only to copy its inputs out and to
 * swap the pointer in. The event window itself belongs to whoever builds (the live thread,
 * or publish_now callers, serialised by `build_mu`), so analysis runs with no lock that
 * training or a view could wait on. */
#include "profiler/live.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "profiler/gpu_attribute.h"
#include "engine/comm/comm.h"
#include "engine/comm/flight.h"
#include "engine/core/device.h"
#include "engine/core/xalloc.h"
#include "traces/trace_write.h"

#define LIVE_MAX_RECS   MS_AN_MAX_RANKS
#define LIVE_MAX_GROUPS MS_REC_MAX_GROUPS
#define LIVE_MAX_EVENTS ((size_t)1 << 21) /* the window's cap: 2M events x 184 B = 368 MB */
#define LIVE_POLL_MS    50
#define LIVE_SPANS_RANK 1024 /* timeline spans kept per rank (merged beyond) */
#define LIVE_PIPE_STAGE 4096 /* pipeline actions kept per stage (the first ones beyond) */

struct ms_live {
    ms_live_opts o;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* a new version was published */
    const ms_snapshot *cur;
    uint64_t version;
    ms_live_step *hist; /* ring of o.history */
    int hist_n, hist_head;
    char strategy[64];
    char last_event[MS_LIVE_TEXT];
    ms_suggestion sugg[MS_LIVE_MAX_SUGGESTIONS];
    int n_sugg;
    char advisor_note[MS_LIVE_TEXT]; /* "" while the advisor suggests */
    ms_live_req queue[MS_LIVE_QUEUE];
    int q_head, q_n;
    ms_live_validate_fn validate;
    void *validate_user;
    ms_live_advise_fn advise;
    void *advise_user;
    int advise_period_ms;
    ms_recorder *recs[LIVE_MAX_RECS];
    int n_recs;
    ms_event *fed; /* events fed (MPI rank 0, trace files) not yet in the window */
    size_t n_fed, cap_fed;
    ms_group groups[LIVE_MAX_GROUPS];
    int n_groups;
    bool dirty;    /* something besides events changed since the last publish */
    bool finished; /* stopped: no more control */
    bool closed;   /* training has ended: no more control (ms_live_close_control) */
    bool stop;     /* asks the thread to end */

    pthread_mutex_t build_mu; /* one builder at a time; guards everything below */
    uint64_t cursors[LIVE_MAX_RECS];
    ms_event *win; /* the window: events of recent steps, any order; from win_dev */
    size_t n_win, cap_win;
    ms_live_mem *mem; /* latest sample per rank */
    int64_t built_step;
    size_t max_win;              /* LIVE_MAX_EVENTS, or less once win_dev refused to grow it */
    ms_device *win_dev;          /* the window's memory: large, so a status and not an abort */
    char win_note[MS_LIVE_TEXT]; /* why the window stopped growing, for the views ("": none) */
    pthread_t thread;
    bool running;
};

const char *ms_suggestion_state_name(ms_suggestion_state s) {
    static const char *names[MS_SUGG_STATE_COUNT] = {"open",    "pending", "applied",  "dismissed",
                                                     "refused", "dropped", "withdrawn"};
    return (unsigned)s < MS_SUGG_STATE_COUNT ? names[s] : "unknown";
}

/* --- snapshots ---------------------------------------------------------------------------- */

void ms_snapshot_release(const ms_snapshot *cs) {
    ms_snapshot *s = (ms_snapshot *)cs;
    if (!s) return;
    if (atomic_fetch_sub_explicit((_Atomic int *)&s->refs_, 1, memory_order_acq_rel) != 1) return;
    free(s->history);
    free(s->timeline);
    free(s->pipeline.blocks);
    free(s->mem);
    ms_analysis_free(&s->analysis);
    free(s);
}

static const ms_snapshot *snapshot_retain(const ms_snapshot *cs) {
    atomic_fetch_add_explicit((_Atomic int *)&((ms_snapshot *)cs)->refs_, 1, memory_order_relaxed);
    return cs;
}

/* --- creation ----------------------------------------------------------------------------- */

ms_status ms_live_create(const ms_live_opts *opts, ms_live **out, ms_error *err) {
    *out = NULL;
    if (!opts || opts->info.nranks < 1 || opts->info.nranks > MS_AN_MAX_RANKS)
        return ms_fail(err, MS_ERR_INVALID, "live model: nranks must be 1..%d", MS_AN_MAX_RANKS);
    ms_device *dev;
    MS_CHECK(ms_device_cpu_create(&dev, err));
    if (opts->window_limit_bytes) ms_device_set_limit(dev, opts->window_limit_bytes);
    ms_live *l = xcalloc(1, sizeof *l);
    l->o = *opts;
    l->win_dev = dev;
    l->max_win = LIVE_MAX_EVENTS;
    if (l->o.history <= 0) l->o.history = 1024;
    if (l->o.window_steps <= 0) l->o.window_steps = 4;
    if (l->o.tick_ms <= 0) l->o.tick_ms = 250;
    pthread_mutex_init(&l->mu, NULL);
    pthread_mutex_init(&l->build_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->hist = xcalloc((size_t)l->o.history, sizeof *l->hist);
    l->mem = xcalloc((size_t)l->o.info.nranks, sizeof *l->mem);
    l->built_step = -1;
    ms_snapshot *s = xcalloc(1, sizeof *s);
    s->refs_ = 1;
    s->info = l->o.info;
    s->step = -1;
    s->timeline_step = -1;
    s->pipeline.step = -1;
    s->mem = xcalloc((size_t)l->o.info.nranks, sizeof *s->mem);
    l->cur = s;
    *out = l;
    return MS_OK;
}

void ms_live_destroy(ms_live *l) {
    if (!l) return;
    ms_live_stop(l);
    ms_snapshot_release(l->cur);
    free(l->hist);
    free(l->fed);
    ms_device_free(l->win_dev, l->win, l->cap_win * sizeof *l->win);
    ms_device_destroy(l->win_dev);
    free(l->mem);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    pthread_mutex_destroy(&l->build_mu);
    free(l);
}

/* --- producers ---------------------------------------------------------------------------- */

void ms_live_attach_recorder(ms_live *l, ms_recorder *rec) {
    pthread_mutex_lock(&l->mu);
    if (l->n_recs < LIVE_MAX_RECS) l->recs[l->n_recs++] = rec;
    pthread_mutex_unlock(&l->mu);
}

static void add_groups_locked(ms_live *l, const ms_group *g, int n);

static void drain_recorder(ms_live *l, ms_recorder *rec, uint64_t *cursor);
static void take_groups(ms_live *l, ms_recorder *rec);

void ms_live_detach_recorder(ms_live *l, ms_recorder *rec) {
    pthread_mutex_lock(&l->build_mu);
    take_groups(l, rec);
    pthread_mutex_lock(&l->mu);
    int r = 0;
    while (r < l->n_recs && l->recs[r] != rec) r++;
    pthread_mutex_unlock(&l->mu);
    if (r < l->n_recs) {
        /* Keep what it recorded last: the live thread may not have read it yet. */
        drain_recorder(l, rec, &l->cursors[r]);
        pthread_mutex_lock(&l->mu);
        l->n_recs--;
        l->recs[r] = l->recs[l->n_recs];
        l->cursors[r] = l->cursors[l->n_recs];
        l->dirty = true;
        pthread_mutex_unlock(&l->mu);
    }
    pthread_mutex_unlock(&l->build_mu);
}

static void add_groups_locked(ms_live *l, const ms_group *g, int n) {
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < l->n_groups && l->groups[j].id != g[i].id) j++;
        if (j == l->n_groups && l->n_groups < LIVE_MAX_GROUPS) l->groups[l->n_groups++] = g[i];
    }
}

void ms_live_feed_events(ms_live *l, const ms_event *ev, size_t n) {
    /* Nothing to add (a trace with no usable events): ev and l->fed may both be NULL, which
     * memcpy does not allow even for 0 bytes. */
    if (n == 0) return;
    pthread_mutex_lock(&l->mu);
    if (l->n_fed + n > l->cap_fed) {
        l->cap_fed = (l->n_fed + n) * 2;
        l->fed = xrealloc(l->fed, l->cap_fed * sizeof *l->fed);
    }
    memcpy(l->fed + l->n_fed, ev, n * sizeof *ev);
    l->n_fed += n;
    pthread_mutex_unlock(&l->mu);
}

void ms_live_feed_groups(ms_live *l, const ms_group *g, int n) {
    pthread_mutex_lock(&l->mu);
    add_groups_locked(l, g, n);
    pthread_mutex_unlock(&l->mu);
}

void ms_live_step_done(ms_live *l, const ms_live_step *s) {
    pthread_mutex_lock(&l->mu);
    l->hist[l->hist_head] = *s;
    l->hist_head = (l->hist_head + 1) % l->o.history;
    if (l->hist_n < l->o.history) l->hist_n++;
    l->dirty = true;
    pthread_mutex_unlock(&l->mu);
}

void ms_live_set_strategy(ms_live *l, const char *strategy) {
    pthread_mutex_lock(&l->mu);
    snprintf(l->strategy, sizeof l->strategy, "%s", strategy);
    l->dirty = true;
    pthread_mutex_unlock(&l->mu);
}

void ms_live_set_event(ms_live *l, const char *fmt, ...) {
    char text[MS_LIVE_TEXT];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&l->mu);
    memcpy(l->last_event, text, sizeof text);
    l->dirty = true;
    pthread_mutex_unlock(&l->mu);
}

static const ms_suggestion *find_sugg(const ms_suggestion *s, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (s[i].id == id) return &s[i];
    return NULL;
}

/* A candidate as an open suggestion. */
static ms_suggestion as_open(const ms_suggestion *f) {
    ms_suggestion g = *f;
    g.state = MS_SUGG_OPEN;
    g.applied_step = -1;
    g.result[0] = '\0';
    g.missed = 0;
    return g;
}

int ms_suggestions_next(const ms_suggestion *cur, int n_cur, const ms_suggestion *fresh,
                        int n_fresh, double open_at, ms_suggestion *out) {
    double keep_at = open_at / 2;
    int n = 0;
    /* What the views show, in its order: acted-on and dismissed entries as they are (their
     * ids never reopen); open ones updated in place while still good enough, else closed. */
    for (int i = 0; i < n_cur && n < MS_LIVE_MAX_SUGGESTIONS; i++) {
        const ms_suggestion *f = find_sugg(fresh, n_fresh, cur[i].id);
        if (cur[i].state == MS_SUGG_WITHDRAWN) {
            /* the advisor suggests again: what it still finds good enough reopens */
            if (f && f->predicted_gain >= open_at) out[n++] = as_open(f);
            continue;
        }
        if (cur[i].state != MS_SUGG_OPEN) {
            out[n++] = cur[i];
            continue;
        }
        if (f && f->predicted_gain >= keep_at) {
            out[n++] = as_open(f);
        } else if (cur[i].missed + 1 < MS_SUGG_GRACE_ROUNDS) {
            out[n] = cur[i];
            out[n++].missed++;
        }
    }
    /* New targets, best first: appended while there is room, then each replaces the open
     * entry with the smallest gain if it predicts more (superseded). */
    for (int i = 0; i < n_fresh; i++) {
        if (fresh[i].predicted_gain < open_at || find_sugg(out, n, fresh[i].id)) continue;
        int at = -1;
        if (n < MS_LIVE_MAX_SUGGESTIONS)
            at = n++;
        else
            for (int k = 0; k < n; k++)
                if (out[k].state == MS_SUGG_OPEN &&
                    out[k].predicted_gain < fresh[i].predicted_gain &&
                    (at < 0 || out[k].predicted_gain < out[at].predicted_gain))
                    at = k;
        if (at >= 0) out[at] = as_open(&fresh[i]);
    }
    return n;
}

void ms_live_set_suggestions(ms_live *l, const ms_suggestion *s, int n, double open_at) {
    ms_suggestion next[MS_LIVE_MAX_SUGGESTIONS];
    pthread_mutex_lock(&l->mu);
    int nn = ms_suggestions_next(l->sugg, l->n_sugg, s, n, open_at, next);
    memcpy(l->sugg, next, sizeof next[0] * (size_t)nn);
    l->n_sugg = nn;
    l->advisor_note[0] = '\0';
    l->dirty = true;
    pthread_mutex_unlock(&l->mu);
}

void ms_live_withhold_suggestions(ms_live *l, const char *note) {
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->n_sugg; i++) {
        ms_suggestion *s = &l->sugg[i];
        if (s->state != MS_SUGG_OPEN) continue;
        s->state = MS_SUGG_WITHDRAWN;
        s->missed = 0;
        snprintf(s->result, sizeof s->result, "%s", note);
    }
    snprintf(l->advisor_note, sizeof l->advisor_note, "%s", note);
    l->dirty = true;
    pthread_mutex_unlock(&l->mu);
}

static ms_suggestion *find_sugg_locked(ms_live *l, int32_t id) {
    for (int i = 0; i < l->n_sugg; i++)
        if (l->sugg[i].id == id) return &l->sugg[i];
    return NULL;
}

/* step for suggestion_move: keep the suggestion's applied_step */
#define KEEP_STEP INT64_MIN

/* The one state change after acceptance: from `from` to `to`, with its step (or KEEP_STEP) and
 * result text (NULL keeps the text). */
static bool suggestion_move(ms_live *l, int32_t id, ms_suggestion_state from,
                            ms_suggestion_state to, int64_t step, const char *result) {
    pthread_mutex_lock(&l->mu);
    ms_suggestion *s = find_sugg_locked(l, id);
    bool moved = s && s->state == from;
    if (moved) {
        s->state = (uint8_t)to;
        if (step != KEEP_STEP) s->applied_step = step;
        if (result) snprintf(s->result, sizeof s->result, "%s", result);
        l->dirty = true;
    }
    pthread_mutex_unlock(&l->mu);
    return moved;
}

bool ms_live_suggestion_applied(ms_live *l, int32_t id, int64_t step, bool unchanged) {
    return suggestion_move(l, id, MS_SUGG_PENDING, MS_SUGG_APPLIED, step,
                           unchanged ? "the job runs it already; nothing changed"
                                     : "applied; measuring");
}

bool ms_live_suggestion_refused(ms_live *l, int32_t id, const char *why) {
    return suggestion_move(l, id, MS_SUGG_PENDING, MS_SUGG_REFUSED, -1, why);
}

bool ms_live_suggestion_dropped(ms_live *l, int32_t id, int64_t last_step) {
    char result[MS_LIVE_TEXT];
    snprintf(result, sizeof result, "not applied: the run ended at step %lld",
             (long long)last_step);
    return suggestion_move(l, id, MS_SUGG_PENDING, MS_SUGG_DROPPED, -1, result);
}

bool ms_live_suggestion_measured(ms_live *l, int32_t id, const char *report) {
    return suggestion_move(l, id, MS_SUGG_APPLIED, MS_SUGG_APPLIED, KEEP_STEP, report);
}

bool ms_live_suggestion_get(ms_live *l, int32_t id, ms_suggestion *out) {
    pthread_mutex_lock(&l->mu);
    const ms_suggestion *s = find_sugg_locked(l, id);
    if (s) *out = *s;
    pthread_mutex_unlock(&l->mu);
    return s != NULL;
}

/* --- the control queue -------------------------------------------------------------------- */

void ms_live_set_validator(ms_live *l, ms_live_validate_fn fn, void *user) {
    pthread_mutex_lock(&l->mu);
    l->validate = fn;
    l->validate_user = user;
    pthread_mutex_unlock(&l->mu);
}

ms_status ms_live_post(ms_live *l, const ms_live_req *req, ms_error *err) {
    if (!req || req->kind >= MS_REQ_KIND_COUNT)
        return ms_fail(err, MS_ERR_INVALID, "unknown request kind");
    pthread_mutex_lock(&l->mu);
    bool finished = l->finished || !l->o.info.live, closed = l->closed;
    ms_live_validate_fn fn = l->validate;
    void *user = l->validate_user;
    ms_suggestion *s = NULL;
    if (req->kind == MS_REQ_ACCEPT || req->kind == MS_REQ_DISMISS) s = find_sugg_locked(l, req->id);
    int state = s ? s->state : -1;
    pthread_mutex_unlock(&l->mu);
    if (finished)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "the job has finished (or this is a trace file): nothing to control");
    if (closed)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "the job has ended training (it is finishing up): nothing to control");
    if ((req->kind == MS_REQ_ACCEPT || req->kind == MS_REQ_DISMISS) && state < 0)
        return ms_fail(err, MS_ERR_INVALID, "no suggestion with id %d", (int)req->id);
    if (req->kind == MS_REQ_ACCEPT && state != MS_SUGG_OPEN)
        return ms_fail(err, MS_ERR_INVALID, "suggestion %d is %s, not open", (int)req->id,
                       ms_suggestion_state_name((ms_suggestion_state)state));
    /* The validator runs without the lock: it may be slow-ish (parses JSON, checks memory). */
    if (fn) MS_CHECK(fn(user, req, err));
    pthread_mutex_lock(&l->mu);
    ms_status st = MS_OK;
    if (req->kind == MS_REQ_DISMISS) {
        s = find_sugg_locked(l, req->id);
        if (s && s->state == MS_SUGG_OPEN) s->state = MS_SUGG_DISMISSED;
        l->dirty = true;
    } else if (l->closed) {
        st = ms_fail(err, MS_ERR_UNSUPPORTED,
                     "the job has ended training (it is finishing up): nothing to control");
    } else if (l->q_n == MS_LIVE_QUEUE) {
        st = ms_fail(err, MS_ERR_NOMEM, "the control queue is full (%d requests); retry later",
                     MS_LIVE_QUEUE);
    } else {
        if (req->kind == MS_REQ_ACCEPT) {
            s = find_sugg_locked(l, req->id);
            if (s) s->state = MS_SUGG_PENDING;
        }
        ms_live_req *q = &l->queue[(l->q_head + l->q_n) % MS_LIVE_QUEUE];
        *q = *req;
        q->step = l->hist_n ? l->hist[(l->hist_head - 1 + l->o.history) % l->o.history].step : -1;
        l->q_n++;
        l->dirty = true;
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

bool ms_live_take(ms_live *l, ms_live_req *out) {
    pthread_mutex_lock(&l->mu);
    bool got = l->q_n > 0;
    if (got) {
        *out = l->queue[l->q_head];
        l->q_head = (l->q_head + 1) % MS_LIVE_QUEUE;
        l->q_n--;
    }
    pthread_mutex_unlock(&l->mu);
    return got;
}

int ms_live_close_control(ms_live *l, ms_live_req *out) {
    pthread_mutex_lock(&l->mu);
    l->closed = true;
    int n = l->q_n;
    for (int i = 0; i < n; i++) out[i] = l->queue[(l->q_head + i) % MS_LIVE_QUEUE];
    l->q_head = l->q_n = 0;
    l->dirty = true;
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* --- readers ------------------------------------------------------------------------------ */

const ms_snapshot *ms_live_acquire(ms_live *l) {
    pthread_mutex_lock(&l->mu);
    const ms_snapshot *s = snapshot_retain(l->cur);
    pthread_mutex_unlock(&l->mu);
    return s;
}

uint64_t ms_live_version(ms_live *l) {
    pthread_mutex_lock(&l->mu);
    uint64_t v = l->version;
    pthread_mutex_unlock(&l->mu);
    return v;
}

uint64_t ms_live_wait(ms_live *l, uint64_t version, int timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&l->mu);
    while (l->version <= version && !l->stop)
        if (pthread_cond_timedwait(&l->cv, &l->mu, &dl) != 0) break;
    uint64_t v = l->version;
    pthread_mutex_unlock(&l->mu);
    return v;
}

/* --- building a snapshot (build_mu held) --------------------------------------------------- */

/* Makes room for `more` events at the end of the window and returns how many fit (fewer
 * only when the window is smaller than `more`). The window doubles through its device up to
 * max_win. When the device refuses, it asks for half as much, down to what the window has;
 * the window then keeps the size it got for the rest of the run, the views get an event
 * saying so, and the oldest events make room instead. */
static size_t win_reserve(ms_live *l, size_t more) {
    if (l->n_win + more > l->cap_win && l->cap_win < l->max_win) {
        size_t want = l->cap_win ? l->cap_win : 4096;
        while (want < l->n_win + more && want < l->max_win) want *= 2;
        if (want > l->max_win) want = l->max_win;
        size_t cap = want;
        void *p = NULL;
        ms_error why = {0};
        while (ms_device_alloc(l->win_dev, cap * sizeof *l->win, &p, &why) != MS_OK) {
            p = NULL;
            cap /= 2;
            if (cap <= l->cap_win || cap < 1024) break;
        }
        if (p) {
            if (l->n_win) memcpy(p, l->win, l->n_win * sizeof *l->win);
            ms_device_free(l->win_dev, l->win, l->cap_win * sizeof *l->win);
            l->win = p;
            l->cap_win = cap;
        }
        if (cap < want) {
            l->max_win = l->cap_win;
            snprintf(l->win_note, sizeof l->win_note,
                     "live window: cannot grow to %zu events (%.100s); analysing the newest %zu "
                     "events, which may cover fewer steps",
                     want, why.msg, l->cap_win);
        }
    }
    if (more > l->cap_win) more = l->cap_win;
    if (l->n_win + more > l->cap_win) {
        size_t drop = l->n_win + more - l->cap_win;
        memmove(l->win, l->win + drop, (l->n_win - drop) * sizeof *l->win);
        l->n_win -= drop;
    }
    return more;
}

/* Appends everything new in a rank's ring to the window. build_mu held. */
static void drain_recorder(ms_live *l, ms_recorder *rec, uint64_t *cursor) {
    for (;;) {
        size_t room = win_reserve(l, 4096);
        if (!room) return; /* no window at all: its device refused */
        size_t got = ms_recorder_read(rec, cursor, l->win + l->n_win, room, NULL);
        l->n_win += got;
        if (got < room) return;
    }
}

/* Adds the groups a rank's recorder registered (ranks register as meshes come up). */
static void take_groups(ms_live *l, ms_recorder *rec) {
    ms_group *g = xmalloc(sizeof *g * MS_REC_MAX_GROUPS);
    int n = ms_recorder_groups(rec, g, MS_REC_MAX_GROUPS);
    pthread_mutex_lock(&l->mu);
    add_groups_locked(l, g, n);
    pthread_mutex_unlock(&l->mu);
    free(g);
}

/* The oldest step a window of `steps` steps keeps of these events; *complete gets the latest
 * step complete on every rank that reported one (-1 if none). */
static int64_t first_kept_step(const ms_event *ev, size_t n, int nranks, int steps,
                               int64_t *complete) {
    int64_t last[MS_AN_MAX_RANKS];
    for (int r = 0; r < nranks; r++) last[r] = -1;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == MS_EV_STEP && ev[i].rank >= 0 && ev[i].rank < nranks &&
            ev[i].step > last[ev[i].rank])
            last[ev[i].rank] = ev[i].step;
    *complete = -1;
    bool any = false;
    for (int r = 0; r < nranks; r++) {
        if (last[r] < 0) continue;
        *complete = !any || last[r] < *complete ? last[r] : *complete;
        any = true;
    }
    return *complete - steps + 1;
}

/* Moves new events (rings, fed) into the window; returns the latest step complete on every
 * rank that reported one (-1 if none). Memory samples update the per-rank table. */
static int64_t collect(ms_live *l, ms_recorder **recs, int n_recs) {
    int nr = l->o.info.nranks;
    int64_t complete;
    for (int r = 0; r < n_recs; r++) drain_recorder(l, recs[r], &l->cursors[r]);
    pthread_mutex_lock(&l->mu);
    if (l->n_fed) {
        size_t nf = l->n_fed;
        if (l->n_win + nf > l->max_win) {
            /* More than the window holds (a long trace file, ordered by rank): keep only the
             * steps the window will analyse before making room. */
            int64_t lo = first_kept_step(l->fed, nf, nr, l->o.window_steps, &complete);
            nf = 0;
            for (size_t i = 0; i < l->n_fed; i++)
                if (l->fed[i].step >= lo) l->fed[nf++] = l->fed[i];
        }
        size_t n = win_reserve(l, nf); /* the newest n of them */
        if (n) memcpy(l->win + l->n_win, l->fed + nf - n, n * sizeof *l->fed);
        l->n_win += n;
        l->n_fed = 0;
    }
    pthread_mutex_unlock(&l->mu);
    if (l->win_note[0]) {
        ms_live_set_event(l, "%s", l->win_note);
        l->win_note[0] = '\0';
    }

    for (size_t i = 0; i < l->n_win; i++) {
        const ms_event *e = &l->win[i];
        if (e->kind == MS_EV_MEM && e->rank >= 0 && e->rank < nr) {
            l->mem[e->rank] = (ms_live_mem){.in_use = e->u.mem.in_use,
                                            .peak = e->u.mem.peak,
                                            .params = e->u.mem.params,
                                            .grads = e->u.mem.grads,
                                            .optim = e->u.mem.optim,
                                            .acts = e->u.mem.acts,
                                            .host_optim = e->u.mem.host_optim};
        }
    }
    /* Forget what falls out of the window (keeps order); win_reserve caps its size. */
    int64_t lo = first_kept_step(l->win, l->n_win, nr, l->o.window_steps, &complete);
    size_t w = 0;
    for (size_t i = 0; i < l->n_win; i++)
        if (l->win[i].step >= lo && l->win[i].kind != MS_EV_MEM) l->win[w++] = l->win[i];
    l->n_win = w;
    return complete;
}

static int span_cmp(const void *a, const void *b) {
    const ms_live_span *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* Merges neighbours of one kind less than tol apart, in place; returns the new count. */
static size_t merge_spans(ms_live_span *sp, size_t n, double tol) {
    size_t w = 0;
    for (size_t a = 0; a < n; a++) {
        if (w && sp[w - 1].kind == sp[a].kind && sp[a].t0 - sp[w - 1].t1 <= tol) {
            if (sp[a].t1 > sp[w - 1].t1) sp[w - 1].t1 = sp[a].t1;
        } else {
            sp[w++] = sp[a];
        }
    }
    return w;
}

/* The timeline of one step: compute and comm spans per rank, relative to the earliest
 * rank's step start. A rank with more than LIVE_SPANS_RANK spans has neighbours of one
 * kind merged (gaps under 0.2% of the step, then wider) until it fits. */
static void build_timeline(ms_live *l, int64_t step, ms_snapshot *s) {
    int64_t t_lo = INT64_MAX, t_hi = INT64_MIN;
    double flops = 0;
    size_t n = 0;
    for (size_t i = 0; i < l->n_win; i++) {
        const ms_event *e = &l->win[i];
        if (e->step != step) continue;
        if (e->kind == MS_EV_STEP) {
            t_lo = e->t0_ns < t_lo ? e->t0_ns : t_lo;
            t_hi = e->t1_ns > t_hi ? e->t1_ns : t_hi;
        }
        if (e->kind == MS_EV_OP) flops += e->u.op.flops;
        if (e->kind == MS_EV_OP || e->kind == MS_EV_COLL) n++;
    }
    if (t_lo == INT64_MAX) return;
    s->timeline_step = step;
    s->timeline_wall_s = (double)(t_hi - t_lo) / 1e9;
    s->achieved_flops_per_s = s->timeline_wall_s > 0 ? flops / s->timeline_wall_s : 0;
    ms_live_span *sp = xmalloc((n ? n : 1) * sizeof *sp);
    size_t k = 0;
    for (size_t i = 0; i < l->n_win; i++) {
        const ms_event *e = &l->win[i];
        if (e->step != step || (e->kind != MS_EV_OP && e->kind != MS_EV_COLL)) continue;
        ms_live_span *x = &sp[k++];
        memset(x, 0, sizeof *x);
        x->rank = e->rank;
        x->t0 = (double)(e->t0_ns - t_lo) / 1e9;
        x->t1 = (double)(e->t1_ns - t_lo) / 1e9;
        if (e->kind == MS_EV_OP) {
            x->kind = MS_LANE_COMPUTE;
            x->mesh_dim = -1;
            snprintf(x->name, sizeof x->name, "%s", e->u.op.opname);
        } else {
            x->kind = MS_LANE_COMM;
            x->mesh_dim = e->u.coll.mesh_dim;
            snprintf(x->name, sizeof x->name, "%s", ms_coll_name((ms_coll_kind)e->u.coll.coll));
        }
    }
    qsort(sp, k, sizeof *sp, span_cmp);
    size_t w = 0;
    for (size_t i = 0; i < k;) {
        size_t j = i;
        while (j < k && sp[j].rank == sp[i].rank) j++;
        size_t start = w, cnt = j - i;
        memmove(&sp[start], &sp[i], cnt * sizeof *sp);
        for (double tol = s->timeline_wall_s * 0.002; cnt > LIVE_SPANS_RANK && tol < 1e9; tol *= 4)
            cnt = merge_spans(&sp[start], cnt, tol);
        if (cnt > LIVE_SPANS_RANK) cnt = LIVE_SPANS_RANK;
        w = start + cnt;
        i = j;
    }
    s->timeline = sp;
    s->n_timeline = (int)w;
}

static int block_cmp(const void *a, const void *b) {
    const ms_live_pipe_block *x = a, *y = b;
    if (x->stage != y->stage) return x->stage < y->stage ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* Whether e is an action of the schedule the analysis measured, on one of its stages. */
static bool measured_action(const ms_event *e, const ms_pipe_stats *ps) {
    const ms_ev_pipe *p = &e->u.pipe;
    return e->kind == MS_EV_PIPE && p->stages == ps->stages &&
           p->micro_batches == ps->micro_batches && p->virtual_stages == ps->virtual_stages &&
           !strncmp(p->schedule, ps->schedule, sizeof p->schedule) && p->stage >= 0 &&
           p->stage < ps->stages;
}

/* The pipeline view of one step (pp > 1): one lane per stage from its lowest rank, times from
 * the step's first action over all ranks. */
static void build_pipeline(ms_live *l, int64_t step, ms_snapshot *s) {
    const ms_pipe_stats *ps = &s->analysis.pipe;
    ms_live_pipeline *pl = &s->pipeline;
    if (ps->stages < 2 || ps->last_step != step) return;
    int64_t t_lo = INT64_MAX, t_hi = INT64_MIN;
    for (int k = 0; k < ps->stages; k++) pl->rank[k] = -1;
    for (size_t i = 0; i < l->n_win; i++) {
        const ms_event *e = &l->win[i];
        if (e->step != step || !measured_action(e, ps)) continue;
        t_lo = e->t0_ns < t_lo ? e->t0_ns : t_lo;
        t_hi = e->t1_ns > t_hi ? e->t1_ns : t_hi;
        int32_t *lane = &pl->rank[e->u.pipe.stage];
        if (*lane < 0 || e->rank < *lane) *lane = e->rank;
    }
    if (t_hi <= t_lo) return;
    int count[MS_AN_MAX_STAGES] = {0};
    size_t n = 0;
    for (size_t i = 0; i < l->n_win; i++) {
        const ms_event *e = &l->win[i];
        n += e->step == step && measured_action(e, ps) && e->rank == pl->rank[e->u.pipe.stage];
    }
    ms_live_pipe_block *b = xmalloc((n ? n : 1) * sizeof *b);
    size_t k = 0;
    for (size_t i = 0; i < l->n_win; i++) {
        const ms_event *e = &l->win[i];
        if (e->step != step || !measured_action(e, ps)) continue;
        const ms_ev_pipe *p = &e->u.pipe;
        if (e->rank != pl->rank[p->stage] || count[p->stage] >= LIVE_PIPE_STAGE) continue;
        count[p->stage]++;
        b[k++] = (ms_live_pipe_block){.stage = p->stage,
                                      .action = p->action,
                                      .chunk = p->chunk,
                                      .mb = p->mb,
                                      .t0 = (double)(e->t0_ns - t_lo) / 1e9,
                                      .t1 = (double)(e->t1_ns - t_lo) / 1e9};
    }
    qsort(b, k, sizeof *b, block_cmp);
    pl->step = step;
    pl->wall_s = (double)(t_hi - t_lo) / 1e9;
    pl->stages = ps->stages;
    pl->blocks = b;
    pl->n_blocks = (int)k;
}

/* Builds and publishes a snapshot. build_mu held. */
static void build_and_publish(ms_live *l) {
    pthread_mutex_lock(&l->mu);
    ms_recorder *recs[LIVE_MAX_RECS];
    int n_recs = l->n_recs;
    memcpy(recs, l->recs, sizeof recs[0] * (size_t)n_recs);
    pthread_mutex_unlock(&l->mu);

    for (int r = 0; r < n_recs; r++) take_groups(l, recs[r]);
    int64_t complete = collect(l, recs, n_recs);

    ms_snapshot *s = xcalloc(1, sizeof *s);
    s->refs_ = 1;
    s->info = l->o.info;
    s->timeline_step = -1;
    s->pipeline.step = -1;
    s->mem = xmalloc(sizeof *s->mem * (size_t)l->o.info.nranks);
    memcpy(s->mem, l->mem, sizeof *s->mem * (size_t)l->o.info.nranks);
    if (complete >= 0) {
        ms_group *groups = xmalloc(sizeof *groups * LIVE_MAX_GROUPS);
        pthread_mutex_lock(&l->mu);
        int ng = l->n_groups;
        memcpy(groups, l->groups, sizeof *groups * (size_t)ng);
        pthread_mutex_unlock(&l->mu);
        ms_error err = {0};
        int64_t lo = complete - l->o.window_steps + 1;
        /* GPU activity arrives late and unattributed: give it its operator's rank and step. */
        ms_gpu_attribute(l->win, l->n_win);
        if (ms_analyze(l->win, l->n_win, groups, ng, lo < 0 ? 0 : lo, complete, &s->analysis,
                       &err) != MS_OK)
            ms_analysis_free(&s->analysis);
        free(groups);
        build_timeline(l, complete, s);
        build_pipeline(l, complete, s);
    }
    l->built_step = complete;

    pthread_mutex_lock(&l->mu);
    s->history = xmalloc(sizeof *s->history * (size_t)(l->hist_n ? l->hist_n : 1));
    for (int i = 0; i < l->hist_n; i++)
        s->history[i] = l->hist[(l->hist_head - l->hist_n + i + l->o.history) % l->o.history];
    s->n_history = l->hist_n;
    s->step = l->hist_n ? s->history[l->hist_n - 1].step : complete;
    memcpy(s->strategy, l->strategy, sizeof s->strategy);
    memcpy(s->last_event, l->last_event, sizeof s->last_event);
    memcpy(s->advisor_note, l->advisor_note, sizeof s->advisor_note);
    memcpy(s->suggestions, l->sugg, sizeof l->sugg[0] * (size_t)l->n_sugg);
    s->n_suggestions = l->n_sugg;
    s->finished = l->finished || !l->o.info.live;
    s->taken_ns = ms_now_ns();
    if (!s->finished)
        ms_flight_hang_alert(s->taken_ns, MS_LIVE_HANG_FACTOR, (int64_t)(MS_LIVE_HANG_MIN_S * 1e9),
                             s->hang_alert, sizeof s->hang_alert);
    s->version = ++l->version;
    const ms_snapshot *old = l->cur;
    l->cur = s;
    l->dirty = false;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    ms_snapshot_release(old);
}

void ms_live_publish_now(ms_live *l) {
    pthread_mutex_lock(&l->build_mu);
    build_and_publish(l);
    pthread_mutex_unlock(&l->build_mu);
}

/* True when something changed since the last snapshot: a step, suggestions, fed events. */
/* Whether the flight recorder's hang alert differs from the latest snapshot's: a hang brings
 * no steps and no events, yet the views must learn of it. */
static bool hang_changed(ms_live *l) {
    char alert[MS_LIVE_TEXT];
    ms_flight_hang_alert(ms_now_ns(), MS_LIVE_HANG_FACTOR, (int64_t)(MS_LIVE_HANG_MIN_S * 1e9),
                         alert, sizeof alert);
    pthread_mutex_lock(&l->mu);
    bool changed = l->cur && !l->cur->finished && strcmp(alert, l->cur->hang_alert) != 0;
    pthread_mutex_unlock(&l->mu);
    return changed;
}

static bool has_news(ms_live *l) {
    pthread_mutex_lock(&l->mu);
    bool news = l->dirty || l->n_fed > 0;
    pthread_mutex_unlock(&l->mu);
    return news || hang_changed(l);
}

void ms_live_set_advisor(ms_live *l, ms_live_advise_fn fn, void *user, int period_ms) {
    pthread_mutex_lock(&l->mu);
    l->advise = fn;
    l->advise_user = user;
    l->advise_period_ms = period_ms > 0 ? period_ms : 1000;
    pthread_mutex_unlock(&l->mu);
}

static void *live_main(void *arg) {
    ms_live *l = arg;
    int64_t last_publish = 0, last_advice = 0;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        bool stop = l->stop;
        pthread_mutex_unlock(&l->mu);
        if (stop) break;
        int64_t now = ms_now_ns();
        if (now - last_publish >= (int64_t)l->o.tick_ms * 1000000 && has_news(l)) {
            ms_live_publish_now(l);
            last_publish = now;
            pthread_mutex_lock(&l->mu);
            ms_live_advise_fn fn = l->advise;
            void *user = l->advise_user;
            int64_t period = (int64_t)l->advise_period_ms * 1000000;
            pthread_mutex_unlock(&l->mu);
            if (fn && now - last_advice >= period) {
                const ms_snapshot *s = ms_live_acquire(l);
                fn(user, l, s);
                ms_snapshot_release(s);
                last_advice = now;
            }
        }
        struct timespec ts = {0, LIVE_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

ms_status ms_live_start(ms_live *l, ms_error *err) {
    if (l->running) return MS_OK;
    if (pthread_create(&l->thread, NULL, live_main, l) != 0)
        return ms_fail(err, MS_ERR_NOMEM, "live model: cannot start its thread");
    l->running = true;
    return MS_OK;
}

void ms_live_stop(ms_live *l) {
    pthread_mutex_lock(&l->mu);
    bool was_finished = l->finished;
    l->stop = true;
    l->finished = true;
    l->dirty = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (l->running) {
        pthread_join(l->thread, NULL);
        l->running = false;
    }
    if (!was_finished) ms_live_publish_now(l);
}

ms_status ms_live_write_trace(ms_live *l, const char *path, ms_error *err) {
    pthread_mutex_lock(&l->build_mu);
    ms_group *groups = xmalloc(sizeof *groups * LIVE_MAX_GROUPS);
    pthread_mutex_lock(&l->mu);
    int ng = l->n_groups;
    memcpy(groups, l->groups, sizeof *groups * (size_t)ng);
    pthread_mutex_unlock(&l->mu);
    ms_trace_meta meta = {.backend = l->o.info.backend, .world_size = l->o.info.nranks};
    ms_status st = ms_trace_write(path, l->win, l->n_win, groups, ng, &meta, err);
    free(groups);
    pthread_mutex_unlock(&l->build_mu);
    return st;
}

/* sse.c - GET /api/v1/events: server-sent events, one "snapshot" event per new snapshot
 * version, a comment line as heartbeat every MS_WEB_HEARTBEAT_MS.
 *
 * Every stream is a libmicrohttpd response with a content-reader callback that runs on the
 * daemon's thread. When the stream has nothing to send, the callback suspends its
 * connection and returns 0 bytes, so an idle stream costs no CPU at all (no polling). A
 * notifier thread waits for new versions (ms_live_wait) and for the heartbeat clock, and
 * resumes the suspended streams, whose callbacks then copy the shared text of the version
 * (ms_web_cache_get: serialised once, whatever the number of streams). A stream that falls
 * behind skips versions: it always gets the newest. New versions wake the streams at most
 * every MS_WEB_MIN_PUSH_MS, and less often when many streams are open (see notifier_main).
 *
 * A stream's `suspended` flag and MHD's suspension change together under w->mu, so the
 * notifier only resumes connections that really are suspended.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/comm.h"
#include "web/web_internal.h"

struct sse_client {
    ms_web *w;
    struct MHD_Connection *conn;
    sse_client *prev, *next;
    bool suspended;
    uint64_t sent_version; /* newest version sent (or known to the client: Last-Event-ID) */
    uint64_t hb_seen;      /* heartbeat round last answered */
    ms_web_text *msg;      /* the event being written, from offset `off` */
    size_t off;
    char small[48]; /* a short line being written (retry hint, heartbeat) */
    size_t small_len, small_off;
};

static void set_small(sse_client *k, const char *text) {
    k->small_len = strlen(text);
    memcpy(k->small, text, k->small_len);
    k->small_off = 0;
}

/* Content reader: fills buf with what the stream has to say; suspends when nothing. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse_client *k = cls;
    ms_web *w = k->w;
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = 0;
    while (n < max) {
        if (k->small_off < k->small_len) {
            size_t m = k->small_len - k->small_off;
            if (m > max - n) m = max - n;
            memcpy(buf + n, k->small + k->small_off, m);
            k->small_off += m;
            n += m;
            continue;
        }
        if (k->msg) {
            size_t m = k->msg->len - k->off;
            if (m > max - n) m = max - n;
            memcpy(buf + n, k->msg->buf + k->off, m);
            k->off += m;
            n += m;
            if (k->off == k->msg->len) {
                ms_web_text_release(k->msg);
                k->msg = NULL;
            }
            continue;
        }
        if (n > 0) break; /* send what is ready before looking for more */
        if (ms_live_version(w->live) > k->sent_version) {
            ms_web_text *t = ms_web_cache_get(w);
            if (t && t->version > k->sent_version) {
                k->msg = t;
                k->off = 0;
                k->sent_version = t->version;
                continue;
            }
            ms_web_text_release(t);
        }
        if (k->hb_seen < w->hb_seq) {
            k->hb_seen = w->hb_seq;
            set_small(k, ": heartbeat\n\n");
            continue;
        }
        break;
    }
    if (n == 0) {
        k->suspended = true;
        MHD_suspend_connection(k->conn);
    }
    pthread_mutex_unlock(&w->mu);
    return (ssize_t)n;
}

static void sse_free(void *cls) {
    sse_client *k = cls;
    ms_web *w = k->w;
    pthread_mutex_lock(&w->mu);
    if (k->prev)
        k->prev->next = k->next;
    else if (w->clients == k)
        w->clients = k->next;
    if (k->next) k->next->prev = k->prev;
    w->n_clients--;
    pthread_mutex_unlock(&w->mu);
    ms_web_text_release(k->msg);
    free(k);
}

struct MHD_Response *ms_web_sse_response(ms_web *w, struct MHD_Connection *c, const char *last_id) {
    sse_client *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->w = w;
    k->conn = c;
    set_small(k, "retry: 2000\n\n");
    if (last_id) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(last_id, &end, 10);
        /* An id from before a restart (newer than anything here) means nothing: resend. */
        if (!errno && end != last_id && !*end && v <= ms_live_version(w->live)) k->sent_version = v;
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, sse_read, k, sse_free);
    if (!r) {
        free(k);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    pthread_mutex_lock(&w->mu);
    k->hb_seen = w->hb_seq;
    k->next = w->clients;
    if (w->clients) w->clients->prev = k;
    w->clients = k;
    w->n_clients++;
    pthread_mutex_unlock(&w->mu);
    return r;
}

/* Resumes every suspended stream. w->mu held. */
static void wake_all_locked(ms_web *w) {
    for (sse_client *k = w->clients; k; k = k->next)
        if (k->suspended) {
            k->suspended = false;
            MHD_resume_connection(k->conn);
        }
}

static int64_t now_ms(void) {
    return ms_now_ns() / 1000000;
}

/* Sleeps until `until_ms` (monotonic) or until the server stops; returns false on stop. */
static bool nap(ms_web *w, int64_t until_ms) {
    pthread_mutex_lock(&w->mu);
    while (!w->stopping && now_ms() < until_ms) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t left = until_ms - now_ms();
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&w->stop_cv, &w->mu, &ts);
    }
    bool go_on = !w->stopping;
    pthread_mutex_unlock(&w->mu);
    return go_on;
}

static void *notifier_main(void *arg) {
    ms_web *w = arg;
    uint64_t seen = ms_live_version(w->live);
    int64_t last_hb = now_ms();
    for (;;) {
        const int64_t t0 = now_ms();
        /* Waits in steps of 250 ms so that a stop is noticed soon. */
        uint64_t v = ms_live_wait(w->live, seen, 250);
        pthread_mutex_lock(&w->mu);
        bool stop = w->stopping;
        bool wake = false;
        if (!stop && v > seen) {
            seen = v;
            wake = true;
        }
        if (!stop && now_ms() - last_hb >= w->heartbeat_ms) {
            w->hb_seq++;
            last_hb = now_ms();
            wake = true;
        }
        if (wake) wake_all_locked(w);
        pthread_mutex_unlock(&w->mu);
        if (stop) break;
        /* ms_live_wait returns at once once the live model stopped: never spin. After a
         * wake, leave the streams time to send before the next one: MS_WEB_MIN_PUSH_MS, or
         * MS_WEB_PUSH_MS_PER_STREAM per open stream when there are many, which bounds what
         * a crowd of viewers costs the machine (at most 1000 / MS_WEB_PUSH_MS_PER_STREAM
         * events a second in all, whatever the number of streams). */
        int64_t gap = MS_WEB_MIN_PUSH_MS;
        pthread_mutex_lock(&w->mu);
        if ((int64_t)w->n_clients * MS_WEB_PUSH_MS_PER_STREAM > gap)
            gap = (int64_t)w->n_clients * MS_WEB_PUSH_MS_PER_STREAM;
        pthread_mutex_unlock(&w->mu);
        int64_t until = wake ? now_ms() + gap : t0 + 250;
        if (!nap(w, until)) break;
    }
    return NULL;
}

ms_status ms_web_sse_start(ms_web *w, ms_error *err) {
    if (pthread_create(&w->notifier, NULL, notifier_main, w) != 0)
        return ms_fail(err, MS_ERR_NOMEM, "web: cannot start the event notifier thread");
    w->notifier_running = true;
    return MS_OK;
}

void ms_web_sse_stop(ms_web *w) {
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    /* Resumed streams end (their reader sees `stopping`); MHD_stop_daemon must not find any
     * suspended connection. */
    wake_all_locked(w);
    pthread_cond_broadcast(&w->stop_cv);
    pthread_mutex_unlock(&w->mu);
    if (w->notifier_running) {
        pthread_join(w->notifier, NULL);
        w->notifier_running = false;
    }
}

void ms_web_set_heartbeat_ms(ms_web *w, int ms) {
    pthread_mutex_lock(&w->mu);
    w->heartbeat_ms = ms > 0 ? ms : MS_WEB_HEARTBEAT_MS;
    pthread_mutex_unlock(&w->mu);
}

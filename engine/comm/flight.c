/* flight.c - the per-rank flight recorder and its signal-safe dumps (flight.h).
 *
 * Everything that may run in a signal handler (dump_to_fd, ms_flight_describe and the text
 * writer below) formats by hand into a caller's buffer and writes with write(2): no stdio, no
 * allocation, no locks. The handler reads the rings without their mutexes; a call recorded at
 * that very moment may come out torn, which a post-mortem can live with. */
#include "engine/comm/flight.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/comm/comm_impl.h"
#include "engine/core/xalloc.h"

struct ms_flight {
    pthread_mutex_t mu; /* guards ring and next */
    int rank;
    uint64_t next; /* tickets handed out */
    atomic_bool dumped;
    char path[512]; /* of the dump, once dumped */
    char host[64];  /* the rank's host name, read at creation (dumps are signal-safe) */
    ms_flight_entry ring[MS_FLIGHT_RING];
};

static _Atomic(ms_flight *) recorders[MS_COMM_MAX_RANKS];
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;
static char dump_dir[400];
static atomic_bool dir_set;

static const char *const state_names[MS_FLIGHT_STATE_COUNT] = {"issued", "started", "done",
                                                               "failed"};

const char *ms_flight_state_name(ms_flight_state s) {
    return (unsigned)s < MS_FLIGHT_STATE_COUNT ? state_names[s] : "?";
}

/* --- a text writer that is safe in a signal handler ------------------------------------ */

/* Appends to p[0..cap); with fd >= 0 a full buffer is written out, otherwise text is cut. */
typedef struct text {
    char *p;
    size_t n, cap;
    int fd;
} text;

static void text_flush(text *t) {
    size_t off = 0;
    while (t->fd >= 0 && off < t->n) {
        ssize_t k = write(t->fd, t->p + off, t->n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    t->n = 0;
}

static void put_c(text *t, char c) {
    if (t->n + 1 >= t->cap) {
        if (t->fd < 0) return;
        text_flush(t);
    }
    t->p[t->n++] = c;
    if (t->fd < 0) t->p[t->n] = '\0';
}

static void put_s(text *t, const char *s) {
    while (*s) put_c(t, *s++);
}

static void put_i(text *t, int64_t v) {
    char d[24];
    int k = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do d[k++] = (char)('0' + u % 10);
    while ((u /= 10) && k < 23);
    if (v < 0) put_c(t, '-');
    while (k) put_c(t, d[--k]);
}

/* A duration, e.g. "5.0 s" or "12.3 ms". */
static void put_dur(text *t, int64_t ns) {
    if (ns < 0) ns = 0; /* a call that started after the clock was read: just now */
    bool secs = ns >= 1000000000;
    int64_t tenths = ns / (secs ? 100000000 : 100000);
    put_i(t, tenths / 10);
    put_c(t, '.');
    put_i(t, tenths % 10);
    put_s(t, secs ? " s" : " ms");
}

/* A JSON string; names are short ASCII, anything else becomes '?'. */
static void put_json_s(text *t, const char *s) {
    put_c(t, '"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') put_c(t, '\\');
        put_c(t, (unsigned char)*s < 0x20 ? '?' : *s);
    }
    put_c(t, '"');
}

static void put_key(text *t, const char *key) {
    put_s(t, ",\"");
    put_s(t, key);
    put_s(t, "\":");
}

/* --- communicators --------------------------------------------------------------------- */

static uint32_t fnv1a(uint32_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

size_t ms_flight_format_ranks(const int *ranks, int n, char *out, size_t len) {
    text r = {out, 0, len, -1};
    if (len) out[0] = '\0';
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        if (r.n + 26 >= r.cap) {
            put_s(&r, "...");
            break;
        }
        if (i) put_c(&r, ',');
        put_i(&r, ranks[i]);
        if (j > i) put_c(&r, '-'), put_i(&r, ranks[j]);
        i = j + 1;
    }
    return r.n;
}

void ms_flight_comm_init(ms_flight_comm *fc, const char *name, const int *world_ranks, int size,
                         int rank) {
    memset(fc, 0, sizeof *fc);
    text t = {fc->name, 0, sizeof fc->name, -1};
    put_s(&t, name);
    ms_flight_format_ranks(world_ranks, size, fc->ranks, sizeof fc->ranks);
    fc->id = fnv1a(fnv1a(2166136261u, fc->name, strlen(fc->name)), world_ranks,
                   sizeof(int) * (size_t)size);
    fc->rank = rank;
    fc->size = size;
}

/* A rank at s (digits only), into *v; the character after it. Past MS_FLIGHT_MAX_RANK: -1. */
static const char *parse_rank(const char *s, long *v) {
    *v = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        if (*v <= MS_FLIGHT_MAX_RANK) *v = *v * 10 + (*s - '0'); /* stays far from overflow */
    if (*v > MS_FLIGHT_MAX_RANK) *v = -1;
    return s;
}

int ms_flight_parse_ranks(const char *s, int *out, int cap) {
    int n = 0;
    while (*s >= '0' && *s <= '9') {
        long a, b;
        s = parse_rank(s, &a);
        b = a;
        if (*s == '-' && s[1] >= '0' && s[1] <= '9') s = parse_rank(s + 1, &b);
        if (a < 0 || b < 0) return -1;
        for (long v = a; v <= b && n < cap; v++) out[n++] = (int)v;
        if (*s == ',') s++;
    }
    return n;
}

int64_t ms_flight_span_ns(int64_t from, int64_t to) {
    if (to <= from) return 0;
    uint64_t d = (uint64_t)to - (uint64_t)from; /* exact: the difference is in (0, 2^64) */
    return d > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)d;
}

/* --- recorders ------------------------------------------------------------------------- */

ms_flight *ms_flight_for_rank(int world_rank) {
    if (world_rank < 0 || world_rank >= MS_COMM_MAX_RANKS) return NULL;
    ms_flight *f = atomic_load(&recorders[world_rank]);
    if (f) return f;
    pthread_mutex_lock(&create_mu);
    f = atomic_load(&recorders[world_rank]);
    if (!f) {
        f = xcalloc(1, sizeof *f);
        pthread_mutex_init(&f->mu, NULL);
        f->rank = world_rank;
        if (gethostname(f->host, sizeof f->host - 1) != 0) f->host[0] = '\0';
        atomic_store(&recorders[world_rank], f);
    }
    pthread_mutex_unlock(&create_mu);
    return f;
}

int ms_flight_rank(const ms_flight *f) {
    return f->rank;
}

uint64_t ms_flight_issue(ms_flight *f, const ms_flight_comm *fc, const ms_flight_call *call,
                         int64_t now_ns) {
    if (!f) return 0;
    pthread_mutex_lock(&f->mu);
    uint64_t ticket = ++f->next;
    ms_flight_entry *e = &f->ring[(ticket - 1) % MS_FLIGHT_RING];
    e->ticket = ticket;
    e->seq = call->seq;
    e->t_issue_ns = now_ns;
    e->t_start_ns = e->t_end_ns = 0;
    e->bytes = call->bytes;
    e->kind = (uint8_t)call->kind;
    e->dtype = (uint8_t)call->dtype;
    e->state = MS_FLIGHT_ISSUED;
    e->root = (int16_t)call->root;
    e->n_p2p = (int16_t)call->n_p2p;
    e->peer = (int16_t)call->peer;
    e->p2p_send = call->p2p_send;
    e->status = MS_OK;
    e->n_missing = 0;
    e->comm = *fc;
    pthread_mutex_unlock(&f->mu);
    return ticket;
}

/* The live slot of ticket, or NULL when the ring has moved past it. Under f->mu. */
static ms_flight_entry *slot(ms_flight *f, uint64_t ticket) {
    ms_flight_entry *e = &f->ring[(ticket - 1) % MS_FLIGHT_RING];
    return ticket && e->ticket == ticket ? e : NULL;
}

void ms_flight_start(ms_flight *f, uint64_t ticket, int64_t now_ns) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    ms_flight_entry *e = slot(f, ticket);
    if (e) e->t_start_ns = now_ns, e->state = MS_FLIGHT_STARTED;
    pthread_mutex_unlock(&f->mu);
}

void ms_flight_end(ms_flight *f, uint64_t ticket, ms_status st, const int *missing, int n_missing,
                   int64_t now_ns) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    ms_flight_entry *e = slot(f, ticket);
    if (e) {
        if (!e->t_start_ns) e->t_start_ns = now_ns; /* refused before it began */
        e->t_end_ns = now_ns;
        e->state = st == MS_OK ? MS_FLIGHT_DONE : MS_FLIGHT_FAILED;
        e->status = (int16_t)st;
        e->n_missing = 0;
        for (int i = 0; i < n_missing && i < MS_FLIGHT_MAX_MISSING; i++)
            e->missing[e->n_missing++] = (int16_t)missing[i];
    }
    pthread_mutex_unlock(&f->mu);
}

/* Visits f's entries oldest first (no lock: the caller holds it, or is a signal handler). */
#define FOR_EACH_ENTRY(f, e)                                                                       \
    for (uint64_t t_ = (f)->next > MS_FLIGHT_RING ? (f)->next - MS_FLIGHT_RING + 1 : 1;            \
         t_ <= (f)->next; t_++)                                                                    \
        for (const ms_flight_entry *e = &(f)->ring[(t_ - 1) % MS_FLIGHT_RING]; e; e = NULL)        \
            if (e->ticket == t_)

int ms_flight_snapshot(ms_flight *f, ms_flight_entry *out, int cap) {
    int n = 0;
    pthread_mutex_lock(&f->mu);
    FOR_EACH_ENTRY(f, e) {
        if (n < cap) out[n++] = *e;
    }
    pthread_mutex_unlock(&f->mu);
    return n;
}

void ms_flight_reset(void) {
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (!f) continue;
        pthread_mutex_lock(&f->mu);
        f->next = 0;
        memset(f->ring, 0, sizeof f->ring);
        f->path[0] = '\0';
        atomic_store(&f->dumped, false);
        pthread_mutex_unlock(&f->mu);
    }
}

/* --- describing a rank ----------------------------------------------------------------- */

/* "all_reduce seq 12 on 'dp' (ranks 0-3)", or "send to rank 3 seq 17 on 'pp' (ranks 0-3)". */
static void put_call(text *t, const ms_flight_entry *e) {
    if (e->kind == MS_COLL_P2P && e->n_p2p) {
        put_s(t, e->p2p_send ? "send to rank " : "recv from rank ");
        put_i(t, e->peer);
        if (e->n_p2p > 1) put_s(t, " (and more)");
    } else {
        put_s(t, ms_coll_name((ms_coll_kind)e->kind));
    }
    put_s(t, " seq ");
    put_i(t, e->seq);
    put_s(t, " on '");
    put_s(t, e->comm.name);
    put_s(t, "' (ranks ");
    put_s(t, e->comm.ranks);
    put_c(t, ')');
}

size_t ms_flight_format_call(const ms_flight_entry *e, char *out, size_t len) {
    text t = {out, 0, len, -1};
    if (len) out[0] = '\0';
    put_call(&t, e);
    return t.n;
}

const ms_flight_entry *ms_flight_where(const ms_flight_entry *e, int n) {
    for (int i = 0; i < n; i++)
        if (e[i].state == MS_FLIGHT_FAILED) return &e[i];
    for (int pass = MS_FLIGHT_STARTED; pass >= MS_FLIGHT_ISSUED; pass--)
        for (int i = 0; i < n; i++)
            if (e[i].state == pass) return &e[i];
    return NULL;
}

size_t ms_flight_describe(const ms_flight_entry *e, int n, int rank, int64_t now_ns, char *out,
                          size_t len) {
    text t = {out, 0, len, -1};
    if (len) out[0] = '\0';
    put_s(&t, "rank ");
    put_i(&t, rank);
    const ms_flight_entry *w = ms_flight_where(e, n);
    if (!n) {
        put_s(&t, " recorded no communication");
    } else if (!w) {
        put_s(&t, " completed all of its last ");
        put_i(&t, n);
        put_s(&t, " calls; the last: ");
        put_call(&t, &e[n - 1]);
    } else if (w->state == MS_FLIGHT_FAILED) {
        put_s(&t, " waited ");
        put_dur(&t, ms_flight_span_ns(w->t_start_ns, w->t_end_ns));
        put_s(&t, " in ");
        put_call(&t, w);
        put_s(&t, " and gave up (");
        put_s(&t, ms_status_str((ms_status)w->status));
        put_c(&t, ')');
        for (int i = 0; i < w->n_missing; i++) {
            put_s(&t, i ? ", " : "; not arrived: rank ");
            put_i(&t, w->missing[i]);
        }
    } else {
        put_s(&t, w->state == MS_FLIGHT_STARTED ? " was in " : " was queued for ");
        put_call(&t, w);
        put_s(&t, " for ");
        put_dur(&t, ms_flight_span_ns(w->t_start_ns ? w->t_start_ns : w->t_issue_ns, now_ns));
    }
    return t.n;
}

/* --- dumps ----------------------------------------------------------------------------- */

void ms_flight_set_dir(const char *dir) {
    text t = {dump_dir, 0, sizeof dump_dir, -1};
    dump_dir[0] = '\0';
    if (dir) put_s(&t, dir);
    atomic_store(&dir_set, dump_dir[0] != '\0');
}

/* The first dumps of a process may come from several rank threads at once: one of them
 * reads MS_FLIGHT_DIR into dump_dir while the others wait (never from a signal handler: those
 * dump through dump_unlocked, which only reads). */
const char *ms_flight_dir(void) {
    if (!atomic_load(&dir_set)) {
        static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;
        pthread_mutex_lock(&env_mu);
        const char *env = getenv("MS_FLIGHT_DIR");
        if (!atomic_load(&dir_set) && env && *env) ms_flight_set_dir(env);
        pthread_mutex_unlock(&env_mu);
    }
    return atomic_load(&dir_set) ? dump_dir : NULL;
}

/* mkdir -p of dir (signal-safe). */
static void make_dirs(const char *dir) {
    char p[sizeof dump_dir];
    size_t n = 0;
    for (; dir[n] && n + 1 < sizeof p; n++) {
        if (dir[n] == '/' && n) {
            p[n] = '\0';
            mkdir(p, 0755);
        }
        p[n] = dir[n];
    }
    p[n] = '\0';
    mkdir(p, 0755);
}

static void field_i(text *t, const char *key, int64_t v) {
    put_key(t, key);
    put_i(t, v);
}

static void field_s(text *t, const char *key, const char *v) {
    put_key(t, key);
    put_json_s(t, v);
}

static void put_entry(text *t, const ms_flight_entry *e) {
    put_s(t, "{\"seq\":");
    put_i(t, e->seq);
    field_s(t, "op", ms_coll_name((ms_coll_kind)e->kind));
    field_s(t, "comm", e->comm.name);
    field_i(t, "comm_id", e->comm.id);
    field_s(t, "ranks", e->comm.ranks);
    field_i(t, "comm_rank", e->comm.rank);
    field_i(t, "comm_size", e->comm.size);
    field_s(t, "state", ms_flight_state_name((ms_flight_state)e->state));
    field_i(t, "bytes", (int64_t)e->bytes);
    field_s(t, "dtype", ms_comm_dtype_name((ms_comm_dtype)e->dtype));
    field_i(t, "root", e->root);
    field_i(t, "peer", e->peer);
    field_s(t, "p2p", !e->n_p2p ? "" : e->p2p_send ? "send" : "recv");
    field_i(t, "issue_ns", e->t_issue_ns);
    field_i(t, "start_ns", e->t_start_ns);
    field_i(t, "end_ns", e->t_end_ns);
    field_i(t, "timeout_ms", e->comm.timeout_ns / 1000000);
    field_s(t, "status", e->state >= MS_FLIGHT_DONE ? ms_status_str((ms_status)e->status) : "");
    put_key(t, "missing");
    put_c(t, '[');
    for (int i = 0; i < e->n_missing; i++) {
        if (i) put_c(t, ',');
        put_i(t, e->missing[i]);
    }
    put_s(t, "]}\n");
}

/* Writes f's dump to fd: a header line, then its entries oldest first. */
static void dump_to_fd(const ms_flight *f, const char *reason, int fd) {
    char buf[2048];
    text t = {buf, 0, sizeof buf, fd};
    uint64_t n = f->next < MS_FLIGHT_RING ? f->next : MS_FLIGHT_RING;
    put_s(&t, "{\"flight\":1,\"rank\":");
    put_i(&t, f->rank);
    field_i(&t, "pid", getpid());
    field_s(&t, "host", f->host);
    field_s(&t, "reason", reason);
    field_i(&t, "now_ns", ms_now_ns());
    field_i(&t, "entries", (int64_t)n);
    field_i(&t, "dropped", (int64_t)(f->next - n));
    put_s(&t, "}\n");
    FOR_EACH_ENTRY(f, e) put_entry(&t, e);
    text_flush(&t);
}

/* Creates f's dump file and writes it (signal-safe; the caller holds f->mu or is a handler). */
static bool dump_unlocked(ms_flight *f, const char *reason) {
    const char *dir = atomic_load(&dir_set) ? dump_dir : NULL;
    if (!dir) return false;
    bool expected = false;
    if (!atomic_compare_exchange_strong(&f->dumped, &expected, true)) return f->path[0] != '\0';
    make_dirs(dir);
    text p = {f->path, 0, sizeof f->path, -1};
    put_s(&p, dir);
    put_s(&p, "/flight-rank");
    put_i(&p, f->rank);
    put_s(&p, "-pid");
    put_i(&p, getpid());
    put_s(&p, ".jsonl");
    int fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        f->path[0] = '\0';
        return false;
    }
    dump_to_fd(f, reason, fd);
    close(fd);
    return true;
}

bool ms_flight_dump(ms_flight *f, const char *reason, char *path, size_t len) {
    if (!f) return false;
    ms_flight_dir(); /* picks up MS_FLIGHT_DIR */
    pthread_mutex_lock(&f->mu);
    bool ok = dump_unlocked(f, reason);
    if (path && len) {
        text t = {path, 0, len, -1};
        path[0] = '\0';
        if (ok) put_s(&t, f->path);
    }
    pthread_mutex_unlock(&f->mu);
    return ok;
}

const char *ms_flight_dump_path(int i) {
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (f && atomic_load(&f->dumped) && f->path[0] && i-- == 0) return f->path;
    }
    return NULL;
}

/* --- signals --------------------------------------------------------------------------- */

static ms_flight_entry sig_entries[MS_FLIGHT_RING]; /* the handler's scratch: no stack giant */

static void on_fatal_signal(int sig) {
    const char *reason = sig == SIGTERM ? "SIGTERM" : "SIGABRT";
    int64_t now = ms_now_ns();
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (!f || !f->next) continue;
        bool had = atomic_load(&f->dumped);
        dump_unlocked(f, reason);
        int n = 0;
        FOR_EACH_ENTRY(f, e) sig_entries[n++] = *e;
        char line[512];
        text t = {line, 0, sizeof line - 1, -1};
        put_s(&t, "meshscope: ");
        put_s(&t, reason);
        put_s(&t, ": ");
        t.n += ms_flight_describe(sig_entries, n, r, now, line + t.n, sizeof line - 1 - t.n);
        if (!had && f->path[0]) put_s(&t, "; flight recorder: "), put_s(&t, f->path);
        line[t.n++] = '\n';
        text out = {line, t.n, sizeof line, STDERR_FILENO};
        text_flush(&out);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void ms_flight_install_signals(void) {
    static atomic_bool installed;
    if (atomic_exchange(&installed, true)) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGABRT, &sa, NULL);
}

/* --- hang alerts ----------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The median duration of f's last (up to 15) completions of e's op on e's communicator, or
 * 0 when there is none. Under f->mu. */
static int64_t usual_ns(const ms_flight *f, const ms_flight_entry *w) {
    int64_t d[15];
    int k = 0;
    for (uint64_t t = f->next; t >= 1 && t + MS_FLIGHT_RING > f->next && k < 15; t--) {
        const ms_flight_entry *e = &f->ring[(t - 1) % MS_FLIGHT_RING];
        if (e->ticket == t && e->state == MS_FLIGHT_DONE && e->kind == w->kind &&
            e->comm.id == w->comm.id)
            d[k++] = e->t_end_ns - e->t_start_ns;
    }
    if (!k) return 0;
    qsort(d, (size_t)k, sizeof d[0], cmp_i64);
    return d[k / 2];
}

/* Whether the rank of f has issued call seq (or a later one) of communicator id. */
static bool has_entered(ms_flight *f, uint32_t id, int64_t seq) {
    bool in = false;
    pthread_mutex_lock(&f->mu);
    FOR_EACH_ENTRY(f, e) in |= e->comm.id == id && e->seq >= seq;
    pthread_mutex_unlock(&f->mu);
    return in;
}

typedef struct hang {
    ms_flight_entry e;
    int rank;
    int64_t waited, usual;
} hang;

/* The longest-waiting call of f over its threshold, into *h when it beats h->waited. */
static void worst_of(ms_flight *f, int64_t now, double factor, int64_t min_ns, hang *h) {
    pthread_mutex_lock(&f->mu);
    FOR_EACH_ENTRY(f, e) {
        if (e->state != MS_FLIGHT_STARTED || now - e->t_start_ns <= h->waited) continue;
        int64_t usual = usual_ns(f, e), waited = now - e->t_start_ns;
        if (waited > min_ns && (double)waited > factor * (double)usual)
            *h = (hang){*e, f->rank, waited, usual};
    }
    pthread_mutex_unlock(&f->mu);
}

bool ms_flight_hang_alert(int64_t now_ns, double factor, int64_t min_ns, char *out, size_t len) {
    hang h = {.waited = 0};
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (f) worst_of(f, now_ns, factor, min_ns, &h);
    }
    if (len) out[0] = '\0';
    if (!h.waited) return false;
    text t = {out, 0, len, -1};
    put_s(&t, "hang: ");
    put_call(&t, &h.e);
    put_s(&t, " has waited ");
    put_dur(&t, h.waited);
    if (h.usual) put_s(&t, " (usually "), put_dur(&t, h.usual), put_c(&t, ')');
    if (h.e.n_p2p) { /* p2p sequence numbers differ between peers: name the peer only */
        put_s(&t, "; waits for rank ");
        put_i(&t, h.e.peer);
        return true;
    }
    int members[MS_COMM_MAX_RANKS];
    int n = ms_flight_parse_ranks(h.e.comm.ranks, members, MS_COMM_MAX_RANKS);
    int absent = 0, unknown = 0;
    for (int i = 0; i < n; i++) {
        /* an MPI world may be larger than the ranks that keep a recorder here */
        ms_flight *m = members[i] < MS_COMM_MAX_RANKS ? atomic_load(&recorders[members[i]]) : NULL;
        if (!m || !m->next) {
            unknown++;
        } else if (!has_entered(m, h.e.comm.id, h.e.seq)) {
            put_s(&t, absent++ ? ", " : "; not arrived: rank ");
            put_i(&t, members[i]);
        }
    }
    if (!absent) {
        put_s(&t, "; rank ");
        put_i(&t, h.rank);
        put_s(&t, unknown ? " waits for the other ranks" : " waits: every rank has entered");
    }
    return true;
}

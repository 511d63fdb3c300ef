/* flight.c - the per-rank flight recorder, its live records and its signal-safe dumps
 * (flight.h).
 *
 * Everything that may run in a signal handler (dump_to_fd, ms_flight_describe and the text
 * writer below) formats by hand into a caller's buffer and writes with write(2): no stdio, no
 * allocation, no locks. The handler reads the rings without their mutexes; a slot being
 * rewritten at that moment has ticket 0 and is skipped.
 *
 * A live record is the recorder's log itself, mapped MAP_SHARED from its file: every store is
 * in the kernel's page cache the moment it is made, so it outlives a SIGKILL. Slots are
 * written ticket last (after a compiler fence), so a process killed mid-write leaves an empty
 * slot rather than a torn one; the reader checks every field anyway. */
#include "engine/comm/flight.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h> /* rename(2) alone: it is async-signal-safe, stdio's streams are not */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/comm/comm_impl.h"
#include "engine/core/xalloc.h"

#define LIVE_MAGIC   "msflight" /* 8 bytes, no NUL */
#define LIVE_VERSION 1

/* A recorder's log exactly as its live record holds it (docs/formats.md, "Live records"): this
 * header, then the ring. Native byte order and layout: the doctor of the same build reads it,
 * and refuses a record whose sizes differ. */
typedef struct flight_head {
    char magic[8]; /* written last: a record cut off while created has none */
    uint32_t version, header_size, entry_size, ring_size;
    int32_t rank, world_size, pid, term_sig;
    char host[64];   /* the rank's host name, read at creation (dumps are signal-safe) */
    uint64_t next;   /* tickets handed out */
    int64_t last_ns; /* the newest record's time */
    int64_t term_ns; /* when SIGTERM or SIGABRT arrived; 0: none */
} flight_head;

typedef struct flight_log {
    flight_head h;
    ms_flight_entry ring[MS_FLIGHT_RING];
} flight_log;

struct ms_flight {
    pthread_mutex_t mu; /* guards log (the pointer and what it holds), mapped and live */
    int rank;
    atomic_bool dumped;
    bool mapped;    /* log is a file mapping (munmap), else heap (free) */
    char path[512]; /* of the dump, once dumped */
    char live[512]; /* of the live record while it exists; "" otherwise */
    flight_log *log;
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

/* Appends to p[0..cap); with fd >= 0 a full buffer is written out, otherwise text is cut. A
 * write that fails (a full disk) sets fd to -1: the rest is cut, and the caller can tell. */
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
        if (k <= 0) {
            t->fd = -1;
            break;
        }
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

/* --- live records ---------------------------------------------------------------------- */

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

/* Creates path for writing (signal-safe), making its folder first: a second time when the
 * folder went in between (another process of the job exited and removed it, empty). */
static int create_in(const char *dir, const char *path, int flags) {
    int fd = -1;
    for (int i = 0; i < 2 && fd < 0; i++) {
        make_dirs(dir);
        fd = open(path, flags | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 && errno != ENOENT) break;
    }
    return fd;
}

/* DIR/flight-rank<R>-pid<P><suffix> into out[0..len) (signal-safe). */
static void record_path(const char *dir, int rank, const char *suffix, char *out, size_t len) {
    text p = {out, 0, len, -1};
    out[0] = '\0';
    put_s(&p, dir);
    put_s(&p, "/flight-rank");
    put_i(&p, rank);
    put_s(&p, "-pid");
    put_i(&p, getpid());
    put_s(&p, suffix);
}

static pid_t exit_pid; /* the process whose live records the exit hook removes */

/* At a normal exit, nothing went wrong that the records must tell: they go, and so does the
 * folder when that leaves it empty (it was made for them). A forked child that exits owns
 * none of them. */
static void remove_live_records(void) {
    if (getpid() != exit_pid) return;
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (!f) continue;
        pthread_mutex_lock(&f->mu);
        if (f->live[0]) unlink(f->live);
        f->live[0] = '\0';
        pthread_mutex_unlock(&f->mu);
    }
    if (atomic_load(&dir_set)) rmdir(dump_dir);
}

/* A log mapped from f's new live record in dir (its path into f->live), zero-filled; NULL
 * when the file cannot be made. Its blocks are allocated up front: a store into a mapping of
 * a sparse file on a full disk would kill the process with SIGBUS. */
static flight_log *live_open(ms_flight *f, const char *dir) {
    record_path(dir, f->rank, ".ring", f->live, sizeof f->live);
    int fd = create_in(dir, f->live, O_RDWR);
    void *p = MAP_FAILED;
    if (fd >= 0 && posix_fallocate(fd, 0, sizeof(flight_log)) == 0)
        p = mmap(NULL, sizeof(flight_log), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (p == MAP_FAILED) {
        if (fd >= 0) unlink(f->live);
        f->live[0] = '\0';
        return NULL;
    }
    static atomic_bool hooked;
    if (!atomic_exchange(&hooked, true)) {
        exit_pid = getpid();
        atexit(remove_live_records);
    }
    return p;
}

/* Fills l's header, from src's when there is one, magic last. */
static void log_header(flight_log *l, const flight_head *src, int rank) {
    l->h.version = LIVE_VERSION;
    l->h.header_size = (uint32_t)offsetof(flight_log, ring);
    l->h.entry_size = (uint32_t)sizeof(ms_flight_entry);
    l->h.ring_size = MS_FLIGHT_RING;
    l->h.rank = rank;
    l->h.pid = (int32_t)getpid();
    if (src) {
        memcpy(l->h.host, src->host, sizeof l->h.host);
        l->h.world_size = src->world_size;
        l->h.next = src->next;
        l->h.last_ns = src->last_ns;
        l->h.term_ns = src->term_ns;
        l->h.term_sig = src->term_sig;
    } else if (gethostname(l->h.host, sizeof l->h.host - 1) != 0) {
        l->h.host[0] = '\0';
    }
    atomic_signal_fence(memory_order_seq_cst);
    memcpy(l->h.magic, LIVE_MAGIC, sizeof l->h.magic);
}

/* Whether path names a file directly in dir. */
static bool in_dir(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && path[n] == '/' && !strchr(path + n + 1, '/');
}

/* Puts f's log where it belongs (under f->mu, or before f is published): in a live record in
 * dir while f has not dumped, else in memory (its dump is its record). A log that moves to a
 * new file is copied there, entries first, and its old file removed. */
static void log_attach(ms_flight *f, const char *dir) {
    bool want = dir && !atomic_load(&f->dumped);
    if (f->log && (want ? f->live[0] && in_dir(f->live, dir) : !f->live[0])) return;
    if (!want && f->log) { /* the mapping of a removed file serves as memory */
        unlink(f->live);
        f->live[0] = '\0';
        return;
    }
    char old_live[sizeof f->live];
    memcpy(old_live, f->live, sizeof old_live);
    flight_log *old = f->log, *l = want ? live_open(f, dir) : NULL;
    bool mapped = l != NULL;
    if (!l) l = xcalloc(1, sizeof *l);
    if (old) memcpy(l->ring, old->ring, sizeof l->ring);
    log_header(l, old ? &old->h : NULL, f->rank);
    f->log = l;
    if (old_live[0]) unlink(old_live);
    if (old && f->mapped)
        munmap(old, sizeof *old);
    else
        free(old);
    f->mapped = mapped;
}

/* --- recorders ------------------------------------------------------------------------- */

ms_flight *ms_flight_for_rank(int world_rank) {
    if (world_rank < 0 || world_rank >= MS_COMM_MAX_RANKS) return NULL;
    ms_flight *f = atomic_load(&recorders[world_rank]);
    if (f) return f;
    const char *dir = ms_flight_dir(); /* before create_mu: it may move existing recorders */
    pthread_mutex_lock(&create_mu);
    f = atomic_load(&recorders[world_rank]);
    if (!f) {
        f = xcalloc(1, sizeof *f);
        pthread_mutex_init(&f->mu, NULL);
        f->rank = world_rank;
        log_attach(f, dir);
        atomic_store(&recorders[world_rank], f);
    }
    pthread_mutex_unlock(&create_mu);
    return f;
}

int ms_flight_rank(const ms_flight *f) {
    return f->rank;
}

void ms_flight_prepare(int world_rank, int world_size) {
    ms_flight *f = ms_flight_for_rank(world_rank);
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    if (world_size > 0 && world_size <= MS_FLIGHT_MAX_RANK + 1) f->log->h.world_size = world_size;
    pthread_mutex_unlock(&f->mu);
}

uint64_t ms_flight_issue(ms_flight *f, const ms_flight_comm *fc, const ms_flight_call *call,
                         int64_t now_ns) {
    if (!f) return 0;
    pthread_mutex_lock(&f->mu);
    flight_log *l = f->log;
    uint64_t ticket = l->h.next + 1;
    ms_flight_entry *e = &l->ring[(ticket - 1) % MS_FLIGHT_RING];
    e->ticket = 0; /* empty until whole, for a handler or a kill in the middle */
    atomic_signal_fence(memory_order_seq_cst);
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
    atomic_signal_fence(memory_order_seq_cst);
    e->ticket = ticket;
    l->h.next = ticket;
    l->h.last_ns = now_ns;
    pthread_mutex_unlock(&f->mu);
    return ticket;
}

/* The live slot of ticket, or NULL when the ring has moved past it. Under f->mu. */
static ms_flight_entry *slot(ms_flight *f, uint64_t ticket) {
    ms_flight_entry *e = &f->log->ring[(ticket - 1) % MS_FLIGHT_RING];
    return ticket && e->ticket == ticket ? e : NULL;
}

void ms_flight_start(ms_flight *f, uint64_t ticket, int64_t now_ns) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    ms_flight_entry *e = slot(f, ticket);
    if (e) {
        e->t_start_ns = now_ns;
        atomic_signal_fence(memory_order_seq_cst); /* the state never claims a missing time */
        e->state = MS_FLIGHT_STARTED;
        f->log->h.last_ns = now_ns;
    }
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
        e->status = (int16_t)st;
        int n = n_missing < MS_FLIGHT_MAX_MISSING ? n_missing : MS_FLIGHT_MAX_MISSING;
        for (int i = 0; i < n; i++) e->missing[i] = (int16_t)missing[i];
        atomic_signal_fence(memory_order_seq_cst);
        e->n_missing = (int16_t)(n > 0 ? n : 0);
        e->state = st == MS_OK ? MS_FLIGHT_DONE : MS_FLIGHT_FAILED;
        f->log->h.last_ns = now_ns;
    }
    pthread_mutex_unlock(&f->mu);
}

/* Visits f's entries oldest first (no lock: the caller holds it, or is a signal handler). */
#define FOR_EACH_ENTRY(f, e)                                                                       \
    for (uint64_t n_ = (f)->log->h.next, t_ = n_ > MS_FLIGHT_RING ? n_ - MS_FLIGHT_RING + 1 : 1;   \
         t_ <= n_; t_++)                                                                           \
        for (const ms_flight_entry *e = &(f)->log->ring[(t_ - 1) % MS_FLIGHT_RING]; e; e = NULL)   \
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
    const char *dir = ms_flight_dir();
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (!f) continue;
        pthread_mutex_lock(&f->mu);
        flight_head *h = &f->log->h;
        h->next = 0;
        h->last_ns = h->term_ns = 0;
        h->term_sig = h->world_size = 0;
        memset(f->log->ring, 0, sizeof f->log->ring);
        f->path[0] = '\0';
        atomic_store(&f->dumped, false);
        log_attach(f, dir);
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
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (!f) continue;
        pthread_mutex_lock(&f->mu);
        log_attach(f, atomic_load(&dir_set) ? dump_dir : NULL);
        pthread_mutex_unlock(&f->mu);
    }
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

/* Writes f's dump to fd: a header line, then its entries oldest first. Whether every byte was
 * written. */
static bool dump_to_fd(const ms_flight *f, const char *reason, int fd) {
    char buf[2048];
    text t = {buf, 0, sizeof buf, fd};
    const flight_head *h = &f->log->h;
    uint64_t n = h->next < MS_FLIGHT_RING ? h->next : MS_FLIGHT_RING;
    put_s(&t, "{\"flight\":1,\"rank\":");
    put_i(&t, f->rank);
    field_i(&t, "pid", getpid());
    field_s(&t, "host", h->host);
    field_i(&t, "world", h->world_size);
    field_s(&t, "reason", reason);
    field_i(&t, "now_ns", ms_now_ns());
    field_i(&t, "entries", (int64_t)n);
    field_i(&t, "dropped", (int64_t)(h->next - n));
    put_s(&t, "}\n");
    FOR_EACH_ENTRY(f, e) put_entry(&t, e);
    text_flush(&t);
    return t.fd >= 0;
}

/* Writes f's dump (signal-safe; the caller holds f->mu or is a handler): under a temporary
 * name, renamed into place once whole, so that a SIGKILL in the middle leaves no cut dump but
 * the live record, which then goes. */
static bool dump_unlocked(ms_flight *f, const char *reason) {
    const char *dir = atomic_load(&dir_set) ? dump_dir : NULL;
    if (!dir) return false;
    bool expected = false;
    if (!atomic_compare_exchange_strong(&f->dumped, &expected, true)) return f->path[0] != '\0';
    char tmp[sizeof f->path + 8];
    record_path(dir, f->rank, ".jsonl", f->path, sizeof f->path);
    record_path(dir, f->rank, ".jsonl.tmp", tmp, sizeof tmp);
    int fd = create_in(dir, tmp, O_WRONLY);
    bool ok = fd >= 0 && dump_to_fd(f, reason, fd);
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (!ok || rename(tmp, f->path) != 0) {
        if (fd >= 0) unlink(tmp);
        f->path[0] = '\0';
        return false;
    }
    if (f->live[0]) unlink(f->live);
    f->live[0] = '\0';
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
    /* The marks first, for every rank: mpirun sends SIGKILL as soon as one rank of its has
     * ended (its sleep between the two signals ends at the first SIGCHLD), which may be
     * before this process gets through its dumps; the live records then say what came. */
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (!f) continue;
        f->log->h.term_ns = now;
        atomic_signal_fence(memory_order_seq_cst);
        f->log->h.term_sig = sig;
    }
    for (int r = 0; r < MS_COMM_MAX_RANKS; r++) {
        ms_flight *f = atomic_load(&recorders[r]);
        if (!f) continue;
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

/* --- live records, read back ----------------------------------------------------------- */

size_t ms_flight_live_size(void) {
    return sizeof(flight_log);
}

/* Whether e, read from a live record, holds what a recorder writes: every enum in range, ranks
 * as a dump's reader accepts them (flight_doctor.c), strings terminated. */
static bool entry_valid(const ms_flight_entry *e) {
    if (e->kind >= MS_COLL_KIND_COUNT || e->dtype >= MS_COMM_DTYPE_COUNT ||
        e->state >= MS_FLIGHT_STATE_COUNT || e->status < 0 || e->status >= MS_STATUS_COUNT ||
        (e->p2p_send != 0 && e->p2p_send != 1) || e->root < -1 || e->peer < -1 || e->n_p2p < 0 ||
        e->n_missing < 0 || e->n_missing > MS_FLIGHT_MAX_MISSING)
        return false;
    for (int i = 0; i < e->n_missing; i++)
        if (e->missing[i] < 0) return false;
    const ms_flight_comm *c = &e->comm;
    return memchr(c->name, '\0', sizeof c->name) && memchr(c->ranks, '\0', sizeof c->ranks) &&
           c->rank >= 0 && c->rank <= MS_FLIGHT_MAX_RANK && c->size >= 0 &&
           c->size <= MS_FLIGHT_MAX_RANK && ms_flight_parse_ranks(c->ranks, NULL, 0) >= 0;
}

/* The header at bytes into *h and *info; NULL when it is one, else what is wrong. */
static const char *read_head(const void *bytes, size_t len, flight_head *h, ms_flight_live *info) {
    if (len != sizeof(flight_log))
        return "its size is not that of a live record of this build (another version wrote it, "
               "or it is no live record)";
    memcpy(h, bytes, sizeof *h);
    if (memcmp(h->magic, LIVE_MAGIC, sizeof h->magic))
        return "it does not begin as a live record does (the rank was killed while creating it, "
               "or it is no live record)";
    if (h->version != LIVE_VERSION || h->header_size != offsetof(flight_log, ring) ||
        h->entry_size != sizeof(ms_flight_entry) || h->ring_size != MS_FLIGHT_RING)
        return "its layout is not this build's (another version wrote it)";
    if (h->rank < 0 || h->rank > MS_FLIGHT_MAX_RANK || h->world_size < 0 ||
        h->world_size > MS_FLIGHT_MAX_RANK + 1)
        return "its rank or world size is out of range (0..32767)";
    memset(info, 0, sizeof *info);
    info->rank = h->rank;
    info->world_size = h->world_size;
    info->pid = h->pid;
    memcpy(info->host, h->host, sizeof info->host - 1);
    bool term = h->term_sig == SIGTERM || h->term_sig == SIGABRT;
    info->term_sig = term ? h->term_sig : 0;
    info->term_ns = term ? h->term_ns : 0;
    info->last_ns = h->last_ns;
    return NULL;
}

static int by_ticket(const void *a, const void *b) {
    const ms_flight_entry *x = a, *y = b;
    return (x->ticket > y->ticket) - (x->ticket < y->ticket);
}

int ms_flight_live_read(const void *bytes, size_t len, ms_flight_live *info, ms_flight_entry *out,
                        const char **why) {
    flight_head h;
    *why = read_head(bytes, len, &h, info);
    if (*why) return -1;
    /* Each slot holds the ticket it was written for; the newest MS_FLIGHT_RING tickets are the
     * ring (an empty or torn slot is left out, a stale one is older than those). */
    const unsigned char *ring = (const unsigned char *)bytes + offsetof(flight_log, ring);
    uint64_t newest = 0;
    int n = 0;
    for (int i = 0; i < MS_FLIGHT_RING; i++) {
        ms_flight_entry *e = &out[n];
        memcpy(e, ring + sizeof *e * (size_t)i, sizeof *e);
        if (!e->ticket || (e->ticket - 1) % MS_FLIGHT_RING != (uint64_t)i) continue;
        if (!entry_valid(e)) {
            info->torn++;
            continue;
        }
        if (e->ticket > newest) newest = e->ticket;
        n++;
    }
    int kept = 0;
    uint64_t oldest = newest > MS_FLIGHT_RING ? newest - MS_FLIGHT_RING + 1 : 1;
    for (int i = 0; i < n; i++)
        if (out[i].ticket >= oldest) out[kept++] = out[i];
    qsort(out, (size_t)kept, sizeof *out, by_ticket);
    info->dropped = newest - (uint64_t)kept;
    return kept;
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
    uint64_t next = f->log->h.next;
    for (uint64_t t = next; t >= 1 && t + MS_FLIGHT_RING > next && k < 15; t--) {
        const ms_flight_entry *e = &f->log->ring[(t - 1) % MS_FLIGHT_RING];
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
        if (!m || !m->log->h.next) {
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

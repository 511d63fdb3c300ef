/* flight_doctor.c - reading flight recorder dumps and saying what happened (flight_doctor.h).
 *
 * Calls are matched across ranks by (communicator id, sequence number): every member numbers
 * a communicator's collectives alike. Point-to-point batches are numbered only by the ranks
 * that take part, so they are reported per rank (where it was last seen), not matched.
 *
 * A rank without a dump may have left its live record (flight-rank<R>-pid<P>.ring: killed
 * before or while dumping); it is read as the dump it did not write, said so in its line. */
#include "profiler/flight_doctor.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/comm/comm_impl.h"
#include "engine/comm/flight.h"
#include "engine/io/fileio.h"

/* A dump holds at most MS_FLIGHT_RING entries of a few hundred bytes each: a file far larger
 * than that is no dump, and is refused by its size before a byte of it is read. */
#define DUMP_MAX_BYTES (64u << 20)

enum { ALL_RANKS = MS_FLIGHT_MAX_RANK + 1 }; /* any rank a dump may name, and a world's size */

/* One rank's dump. */
typedef struct dump {
    const char *path;
    int rank;      /* 0..MS_FLIGHT_MAX_RANK */
    char host[64]; /* "" in dumps that predate it */
    char reason[MS_ERROR_MSG_MAX];
    int64_t now_ns;
    ms_flight_entry *e;
    int n;
    int world; /* the size of the rank's world; 0: not known (older dumps) */
    bool cut;  /* its last line was cut off (the rank was killed while dumping) */
    /* nothing to read: killed before it wrote a byte, or in the middle of its header */
    bool empty, head_cut;
    /* read from a live record: the rank wrote no dump; term_sig: the signal it got first */
    bool live;
    int term_sig, torn;
    const char *unusable; /* a live record that cannot be read: why (static text) */
} dump;

/* A number as int64, 0 when absent; saturated at int64's ends (a dump is input: a cast of a
 * double out of range would be undefined). */
static int64_t num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) return 0;
    if (v->valuedouble >= 0x1p63) return INT64_MAX;
    if (v->valuedouble < -0x1p63) return INT64_MIN;
    return (int64_t)v->valuedouble;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Whether v is a whole number in lo..hi. */
static bool in_range(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
           v->valuedouble == (double)(int64_t)v->valuedouble;
}

/* A rank field of o into *out (def when absent); false when it is no rank (nor -1 where
 * `none` allows it). */
static bool rank_of(const cJSON *o, const char *key, bool none, int def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = def;
    if (!v) return true;
    if (!in_range(v, none ? -1 : 0, MS_FLIGHT_MAX_RANK)) return false;
    *out = (int)v->valuedouble;
    return true;
}

static int lookup(const char *name, const char *(*name_of)(int), int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(name, name_of(i))) return i;
    return -1;
}
static const char *coll_name(int i) {
    return ms_coll_name((ms_coll_kind)i);
}
static const char *state_name(int i) {
    return ms_flight_state_name((ms_flight_state)i);
}
static const char *status_name(int i) {
    return ms_status_str((ms_status)i);
}
static const char *dtype_name(int i) {
    return ms_comm_dtype_name((ms_comm_dtype)i);
}

/* The ranks of an entry: root, peer, its place and size in the communicator, its members and
 * those a timeout named; NULL when they are ranks, else what is wrong. */
static const char *parse_entry_ranks(const cJSON *o, ms_flight_entry *e) {
    int root, peer, comm_rank, comm_size;
    if (!rank_of(o, "root", true, 0, &root) || !rank_of(o, "peer", true, 0, &peer) ||
        !rank_of(o, "comm_rank", false, 0, &comm_rank) ||
        !rank_of(o, "comm_size", false, 0, &comm_size))
        return "root, peer, comm_rank or comm_size is not a rank (-1 or 0..32767)";
    e->root = (int16_t)root;
    e->peer = (int16_t)peer;
    e->comm.rank = comm_rank;
    e->comm.size = comm_size;
    snprintf(e->comm.ranks, sizeof e->comm.ranks, "%s", str(o, "ranks"));
    if (ms_flight_parse_ranks(e->comm.ranks, NULL, 0) < 0)
        return "\"ranks\" names a rank past 32767";
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "missing"), *v;
    if (m && !cJSON_IsArray(m)) return "\"missing\" is not a list of ranks";
    cJSON_ArrayForEach(v, m) {
        if (!in_range(v, 0, MS_FLIGHT_MAX_RANK))
            return "\"missing\" holds something other than a rank (0..32767)";
        if (e->n_missing < MS_FLIGHT_MAX_MISSING)
            e->missing[e->n_missing++] = (int16_t)v->valuedouble;
    }
    return NULL;
}

/* One entry line into e; NULL when it is one, else what is wrong ("" when it is no entry at
 * all: no op, state or seq). */
static const char *parse_entry(const cJSON *o, ms_flight_entry *e) {
    memset(e, 0, sizeof *e);
    int kind = lookup(str(o, "op"), coll_name, MS_COLL_KIND_COUNT);
    int state = lookup(str(o, "state"), state_name, MS_FLIGHT_STATE_COUNT);
    if (kind < 0 || state < 0 || !cJSON_GetObjectItemCaseSensitive(o, "seq")) return "";
    e->kind = (uint8_t)kind;
    e->state = (uint8_t)state;
    int dt = lookup(str(o, "dtype"), dtype_name, MS_COMM_DTYPE_COUNT);
    e->dtype = (uint8_t)(dt < 0 ? 0 : dt);
    int status = lookup(str(o, "status"), status_name, MS_STATUS_COUNT);
    e->status = (int16_t)(status < 0 ? MS_OK : status);
    e->seq = num(o, "seq");
    e->bytes = (uint64_t)num(o, "bytes");
    const char *p2p = str(o, "p2p");
    e->n_p2p = *p2p != '\0';
    e->p2p_send = !strcmp(p2p, "send");
    e->t_issue_ns = num(o, "issue_ns");
    e->t_start_ns = num(o, "start_ns");
    e->t_end_ns = num(o, "end_ns");
    snprintf(e->comm.name, sizeof e->comm.name, "%s", str(o, "comm"));
    e->comm.id = (uint32_t)num(o, "comm_id");
    int64_t timeout_ms = num(o, "timeout_ms");
    e->comm.timeout_ns = timeout_ms > INT64_MAX / 1000000   ? INT64_MAX
                         : timeout_ms < INT64_MIN / 1000000 ? INT64_MIN
                                                            : timeout_ms * 1000000;
    return parse_entry_ranks(o, e);
}

/* Whether the cut-off first line line[0..n) begins as a dump's header does. */
static bool is_head_start(const char *line, size_t n) {
    static const char head[] = "{\"flight\":1,";
    return !strncmp(line, head, n < sizeof head - 1 ? n : sizeof head - 1);
}

/* The header line o of d; fails naming the file. */
static ms_status parse_head(const cJSON *o, dump *d, ms_error *err) {
    if (!o || num(o, "flight") != 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s is not a flight recorder dump: its first line lacks \"flight\":1 "
                       "(docs/formats.md); remove it from the folder",
                       d->path);
    const cJSON *rank = cJSON_GetObjectItemCaseSensitive(o, "rank");
    if (!in_range(rank, 0, MS_FLIGHT_MAX_RANK)) {
        char was[40] = "missing";
        if (cJSON_IsNumber(rank)) snprintf(was, sizeof was, "%.17g", rank->valuedouble);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s is not a flight recorder dump: its header's \"rank\" is %s, not a "
                       "world rank (0..%d); remove it from the folder",
                       d->path, was, MS_FLIGHT_MAX_RANK);
    }
    d->rank = (int)rank->valuedouble;
    const cJSON *world = cJSON_GetObjectItemCaseSensitive(o, "world");
    d->world = in_range(world, 0, ALL_RANKS) ? (int)world->valuedouble : 0;
    d->now_ns = num(o, "now_ns");
    snprintf(d->reason, sizeof d->reason, "%s", str(o, "reason"));
    snprintf(d->host, sizeof d->host, "%s", str(o, "host"));
    return MS_OK;
}

/* Line `lineno` (2 on) of d, parsed into o (NULL: not JSON; whole: it ends in a newline):
 * one more entry, or the note that the dump was cut off; fails naming the file and the line. */
static ms_status parse_line(const cJSON *o, bool whole, int lineno, dump *d, int *cap,
                            ms_error *err) {
    if (d->n == MS_FLIGHT_RING)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s holds more than %d entries, more than a flight recorder keeps: it is "
                       "not a flight recorder dump; remove it from the folder",
                       d->path, MS_FLIGHT_RING);
    if (d->n == *cap) {
        *cap = *cap ? 2 * *cap : 8;
        d->e = xrealloc(d->e, sizeof *d->e * (size_t)*cap);
    }
    const char *why = o ? parse_entry(o, &d->e[d->n]) : "";
    if (!why) {
        d->n++;
        return MS_OK;
    }
    if (!whole) { /* the dump stopped mid-entry; the complete entries before it stand */
        d->cut = true;
        return MS_OK;
    }
    if (!*why)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s line %d is not a flight recorder entry; remove the file or the line",
                       d->path, lineno);
    return ms_fail(err, MS_ERR_INVALID, "%s line %d: %s; remove the file or the line", d->path,
                   lineno, why);
}

/* Reads one dump from text[0..len): a header line, then entries. A last line without its
 * newline is the dump stopped mid-entry (killed while writing, as the launcher does to a
 * stopped rank). */
static ms_status parse_dump(const char *text, size_t len, dump *d, ms_error *err) {
    d->empty = len == 0;
    if (memchr(text, '\0', len))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s holds NUL bytes: it is not a flight recorder dump (docs/formats.md); "
                       "remove it from the folder",
                       d->path);
    int lineno = 0, cap = 0;
    ms_status st = MS_OK;
    for (size_t pos = 0; pos < len && st == MS_OK && !d->cut;) {
        const char *line = text + pos, *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) + 1 : len - pos;
        pos += n;
        lineno++;
        if (lineno == 1 && !nl && is_head_start(line, n)) {
            d->head_cut = true; /* killed mid-header: nothing to read, not a foreign file */
            break;
        }
        cJSON *o = cJSON_ParseWithLength(line, n);
        st = lineno == 1 ? parse_head(o, d, err) : parse_line(o, nl != NULL, lineno, d, &cap, err);
        cJSON_Delete(o);
    }
    return st;
}

static bool has_suffix(const char *name, const char *suffix) {
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

/* A live record, bytes[0..len) (any bytes), into d; one that is none is left out, saying why
 * (a rank killed while it created its record, another build's record, a stray file). */
static void parse_live(const void *bytes, size_t len, dump *d) {
    ms_flight_live info;
    d->e = xmalloc(sizeof *d->e * MS_FLIGHT_RING);
    int n = ms_flight_live_read(bytes, len, &info, d->e, &d->unusable);
    if (n < 0) return;
    d->live = true;
    d->n = n;
    d->torn = info.torn;
    d->rank = info.rank;
    d->world = info.world_size;
    d->term_sig = info.term_sig;
    /* as of the signal when one came, else of its last call: when it ended is not known */
    d->now_ns = info.term_ns ? info.term_ns : info.last_ns;
    snprintf(d->host, sizeof d->host, "%s", info.host);
    snprintf(d->reason, sizeof d->reason, "%s",
             !info.term_sig             ? ""
             : info.term_sig == SIGTERM ? "SIGTERM"
                                        : "SIGABRT");
}

/* Reads the live record at d->path from fd (of `size` bytes): no more than one byte past the
 * size a record has, enough to tell that a larger file is none. */
static ms_status read_live(dump *d, int fd, uint64_t size, ms_error *err) {
    size_t cap = ms_flight_live_size() + 1, n = size < cap ? (size_t)size : cap;
    char *bytes = xmalloc(n + 1);
    ms_status st = ms_read_exact(fd, bytes, n, d->path, err);
    if (st == MS_OK) parse_live(bytes, n, d);
    free(bytes);
    return st;
}

/* Reads the dump at d->path: a regular file (a FIFO or a device named like a dump would block
 * or never end) no larger than a dump can be, refused by name otherwise. */
static ms_status read_dump(dump *d, ms_error *err) {
    int fd;
    uint64_t size;
    ms_status st = ms_open_regular(d->path, &fd, &size, err);
    if (st != MS_OK) {
        char why[MS_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        return ms_fail(err, st,
                       "%s; a flight recorder dump is a regular file: remove it from "
                       "the folder",
                       why);
    }
    if (has_suffix(d->path, ".ring")) {
        st = read_live(d, fd, size, err);
        close(fd);
        return st;
    }
    if (size > DUMP_MAX_BYTES) {
        close(fd);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s is %llu bytes, more than the %u MiB a flight recorder dump can take "
                       "(%d entries at most): it is not one; remove it from the folder",
                       d->path, (unsigned long long)size, DUMP_MAX_BYTES >> 20, MS_FLIGHT_RING);
    }
    char *text = xmalloc((size_t)size + 1);
    st = ms_read_exact(fd, text, (size_t)size, d->path, err);
    close(fd);
    if (st == MS_OK) st = parse_dump(text, (size_t)size, d, err);
    free(text);
    return st;
}

/* The dumps under diagnosis, one per rank, in rank order, with what is looked up over and
 * over: where each rank was, each rank's dump, the ranks some timeout named as missing. The
 * tables by rank are bounded: a dump names no rank past MS_FLIGHT_MAX_RANK. */

typedef struct dump_set {
    const dump *d;
    int nd;
    const ms_flight_entry **where; /* [nd]: ms_flight_where of each */
    int *of_rank;                  /* [ALL_RANKS]: the index of the rank's dump, -1 none */
    bool *named;                   /* [ALL_RANKS]: named missing in some rank's `where` */
} dump_set;

static void dump_set_init(dump_set *s, const dump *d, int nd) {
    *s = (dump_set){.d = d,
                    .nd = nd,
                    .where = xmalloc(sizeof *s->where * ((size_t)nd + 1)),
                    .of_rank = xmalloc(sizeof *s->of_rank * ALL_RANKS),
                    .named = xcalloc(ALL_RANKS, sizeof *s->named)};
    for (int r = 0; r < ALL_RANKS; r++) s->of_rank[r] = -1;
    for (int i = 0; i < nd; i++) {
        const ms_flight_entry *w = s->where[i] = ms_flight_where(d[i].e, d[i].n);
        s->of_rank[d[i].rank] = i;
        for (int k = 0; w && k < w->n_missing; k++) s->named[w->missing[k]] = true;
    }
}

static void dump_set_free(dump_set *s) {
    free(s->where), free(s->of_rank), free(s->named);
}

/* The dump of rank (any int: a peer read from a dump may be -1), or NULL. */
static const dump *find_rank(const dump_set *s, int rank) {
    return rank >= 0 && rank < ALL_RANKS && s->of_rank[rank] >= 0 ? &s->d[s->of_rank[rank]] : NULL;
}

static bool named_missing(const dump_set *s, int rank) {
    return rank >= 0 && rank < ALL_RANKS && s->named[rank];
}

/* Whether d is the live record of a rank that ended without a dump and without a signal its
 * handler saw: SIGKILL (alone, or before the handler of a SIGTERM ran), or a crash. It did not
 * wait in the call its record ends in: it was gone. */
static bool ended(const dump *d) {
    return d->live && !d->term_sig;
}

#define ENDED_HOW "without a dump or a signal it could handle (SIGKILL, or a crash)"

/* How long a rank waited in e, as of its dump. */
static int64_t waited_ns(const dump *d, const ms_flight_entry *e) {
    int64_t end = e->t_end_ns ? e->t_end_ns : d->now_ns;
    return ms_flight_span_ns(e->t_start_ns ? e->t_start_ns : e->t_issue_ns, end);
}

static void put_duration(ms_strbuf *out, int64_t ns) {
    if (ns >= 1000000000)
        ms_strbuf_printf(out, "%.1f s", (double)ns / 1e9);
    else
        ms_strbuf_printf(out, "%.1f ms", (double)ns / 1e6);
}

/* The newest entry of d on communicator id, or NULL. */
static const ms_flight_entry *newest_on(const dump *d, uint32_t id) {
    for (int i = d->n - 1; i >= 0; i--)
        if (d->e[i].comm.id == id) return &d->e[i];
    return NULL;
}

static const ms_flight_entry *at_seq(const dump *d, uint32_t id, int64_t seq) {
    for (int i = d->n - 1; i >= 0; i--)
        if (d->e[i].comm.id == id && d->e[i].seq == seq) return &d->e[i];
    return NULL;
}

/* Whether x is the call of w (same communicator, same sequence number). */
static bool same_call(const ms_flight_entry *x, const ms_flight_entry *w) {
    return x && x->comm.id == w->comm.id && x->seq == w->seq;
}

/* What went wrong with member m of collective w (described in call), which it did not wait in
 * with the others; false when nothing can be said (partial: m may have dumped elsewhere). */
static bool member_finding(const dump_set *s, bool partial, int m, const ms_flight_entry *w,
                           const char *call, ms_strbuf *out) {
    const dump *dm = find_rank(s, m);
    if (!dm && partial && !named_missing(s, m)) return false;
    const ms_flight_entry *last = dm ? newest_on(dm, w->comm.id) : NULL;
    const ms_flight_entry *same = dm ? at_seq(dm, w->comm.id, w->seq) : NULL;
    if (!dm && partial)
        ms_strbuf_printf(out, "rank %d never arrived in %s", m, call);
    else if (!dm)
        ms_strbuf_printf(out, "rank %d %s %s and left no flight dump (it died or was stopped)", m,
                         named_missing(s, m) ? "never arrived in" : "did not finish", call);
    else if (ended(dm) && (!last || last->seq < w->seq))
        ms_strbuf_printf(out, "rank %d never entered %s: it ended before, " ENDED_HOW, m, call);
    else if (ended(dm) && same && same->kind == w->kind && same->state < MS_FLIGHT_DONE)
        ms_strbuf_printf(out, "rank %d did not finish %s: it ended there " ENDED_HOW, m, call);
    else if (!last || last->seq < w->seq)
        ms_strbuf_printf(out, "rank %d never entered %s", m, call);
    else if (same && same->kind != w->kind)
        ms_strbuf_printf(out,
                         "rank %d called %s as seq %lld there instead of %s: the ranks called "
                         "collectives in different orders",
                         m, ms_coll_name((ms_coll_kind)same->kind), (long long)w->seq,
                         ms_coll_name((ms_coll_kind)w->kind));
    else if (same && same->state == MS_FLIGHT_ISSUED && s->where[s->of_rank[m]] &&
             !same_call(s->where[s->of_rank[m]], w)) {
        /* issued (a non-blocking call queued) but never started: m was still in an earlier
         * call, which the others had finished without it (m had sent its share) */
        char at[160];
        ms_flight_format_call(s->where[s->of_rank[m]], at, sizeof at);
        ms_strbuf_printf(out, "rank %d never arrived in %s: it was still in %s", m, call, at);
    } else
        ms_strbuf_printf(out, "rank %d finished %s while others did not", m, call);
    return true;
}

/* The ranks that dumped as stuck in w's call, in rank order: waiting, or late (named missing
 * by others: they came after the others gave up), or, with `member` set, strangers (not among
 * its members). Each list has room for every dump. */
typedef struct stuck {
    int *waiting, *late, *strangers;
    int nw, nl, ns;
    int64_t waited; /* the longest wait of those waiting */
} stuck;

static void find_stuck(const dump_set *s, const ms_flight_entry *w, const bool *member, stuck *k) {
    for (int i = 0; i < s->nd; i++) {
        const ms_flight_entry *x = s->where[i];
        int rank = s->d[i].rank;
        if (!same_call(x, w) || ended(&s->d[i])) continue; /* gone, not waiting: a member */
        if (member && !member[rank]) {
            k->strangers[k->ns++] = rank;
        } else if (x->status != MS_ERR_TIMEOUT && named_missing(s, rank)) {
            k->late[k->nl++] = rank; /* the others timed out before it came */
        } else {
            k->waiting[k->nw++] = rank;
            if (waited_ns(&s->d[i], x) > k->waited) k->waited = waited_ns(&s->d[i], x);
        }
    }
}

/* The findings about collective w (where some rank was stuck): who never entered it, who came
 * only after the others gave up on it, who died without a dump, who called something else, and
 * how long the others waited. Every list is as long as the dumps or the ranks a dump can name
 * (a folder may hold any number of dumps). */
static void diagnose_collective(const dump_set *s, bool partial, const ms_flight_entry *w,
                                ms_strbuf *out) {
    char call[160], ranks[96];
    ms_flight_format_call(w, call, sizeof call);
    int *members = xmalloc(sizeof *members * ALL_RANKS);
    bool *member = xcalloc(ALL_RANKS, sizeof *member), *said = xcalloc(ALL_RANKS, sizeof *said);
    int n = ms_flight_parse_ranks(w->comm.ranks, members, ALL_RANKS); /* checked when read */
    for (int i = 0; i < n; i++) member[members[i]] = true;
    /* a list cut short ("0,2,4,...") does not say who else is a member */
    bool whole_list = !strstr(w->comm.ranks, "...");
    size_t room = sizeof(int) * ((size_t)s->nd + 1);
    stuck k = {.waiting = xmalloc(room), .late = xmalloc(room), .strangers = xmalloc(room)};
    find_stuck(s, w, whole_list ? member : NULL, &k);
    ms_flight_format_ranks(k.waiting, k.nw, ranks, sizeof ranks);
    for (int i = 0; i < k.nw; i++) said[k.waiting[i]] = true;
    for (int i = 0; i < k.nl; i++) said[k.late[i]] = true;
    int named = 0;
    for (int i = 0; i < n; i++) {
        if (said[members[i]]) continue;
        said[members[i]] = true;
        if (!member_finding(s, partial, members[i], w, call, out)) continue;
        named++;
        ms_strbuf_printf(out, "; rank%s %s waited ", k.nw > 1 ? "s" : "", ranks);
        put_duration(out, k.waited);
        ms_strbuf_printf(out, "\n");
    }
    for (int i = 0; i < k.nl && k.nw; i++, named++) {
        ms_strbuf_printf(out, "rank %d came late to %s: rank%s %s waited ", k.late[i], call,
                         k.nw > 1 ? "s" : "", ranks);
        put_duration(out, k.waited);
        ms_strbuf_printf(out, " for it and gave up first\n");
    }
    if (k.ns) {
        char others[96];
        ms_flight_format_ranks(k.strangers, k.ns, others, sizeof others);
        ms_strbuf_printf(out,
                         "rank%s %s dumped as in %s but %s not among its ranks: %s dump%s "
                         "another job's or corrupt\n",
                         k.ns > 1 ? "s" : "", others, call, k.ns > 1 ? "are" : "is",
                         k.ns > 1 ? "their" : "its", k.ns > 1 ? "s are" : " is");
    }
    if (!named && !partial && k.nw + k.nl) {
        ms_strbuf_printf(out,
                         "every member entered %s and none finished: the transfer itself "
                         "stalled (waited ",
                         call);
        put_duration(out, k.waited);
        ms_strbuf_printf(out, ")\n");
    }
    free(k.waiting), free(k.late), free(k.strangers);
    free(members), free(member), free(said);
}

/* A point-to-point batch a rank was stuck in. */
static void diagnose_p2p(const dump_set *s, const dump *r, const ms_flight_entry *w,
                         ms_strbuf *out) {
    char call[160];
    ms_flight_format_call(w, call, sizeof call);
    ms_strbuf_printf(out, "rank %d was last seen in %s, for ", r->rank, call);
    put_duration(out, waited_ns(r, w));
    const dump *peer = find_rank(s, w->peer);
    if (!peer)
        ms_strbuf_printf(out, "; rank %d left no flight dump (it died or was stopped)", w->peer);
    else if (ended(peer))
        ms_strbuf_printf(out, "; rank %d ended " ENDED_HOW, w->peer);
    ms_strbuf_printf(out, "\n");
}

static int dump_cmp(const void *a, const void *b) {
    const dump *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Whether every rank stuck in w's call was named missing by another: it is a culprit of a
 * later call (e.g. stopped inside an MPI all-reduce that its peers completed), said there. */
static bool only_culprits(const dump_set *s, const ms_flight_entry *w) {
    for (int i = 0; i < s->nd; i++)
        if (same_call(s->where[i], w) && !named_missing(s, s->d[i].rank)) return false;
    return true;
}

/* The hosts of the dumps: each dump's host as an index into name[0..nh), in the order the
 * hosts first appear in rank order, and each host's ranks as a compact list. Built by sorting,
 * so that any number of dumps and hosts takes n log n. */
typedef struct hosts {
    int *of;           /* [nd] */
    const char **name; /* [nh] */
    char (*ranks)[96]; /* [nh] */
    int nh;
} hosts;

/* A dump by host, then rank: what hosts_init sorts. */
typedef struct by_host {
    const char *host;
    int rank, i;
} by_host;

static int by_host_cmp(const void *a, const void *b) {
    const by_host *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static void hosts_init(hosts *h, const dump_set *s) {
    int nd = s->nd;
    by_host *o = xmalloc(sizeof *o * ((size_t)nd + 1));
    int *group = xmalloc(sizeof *group * ((size_t)nd + 1));
    int *ranks = xmalloc(sizeof *ranks * ((size_t)nd + 1));
    for (int i = 0; i < nd; i++) o[i] = (by_host){s->d[i].host, s->d[i].rank, i};
    qsort(o, (size_t)nd, sizeof *o, by_host_cmp);
    int ng = 0;
    for (int i = 0; i < nd; i++) {
        if (i && strcmp(o[i].host, o[i - 1].host)) ng++;
        group[o[i].i] = ng;
    }
    ng += nd > 0;
    *h = (hosts){.of = xmalloc(sizeof *h->of * ((size_t)nd + 1)),
                 .name = xmalloc(sizeof *h->name * ((size_t)ng + 1)),
                 .ranks = xmalloc(sizeof *h->ranks * ((size_t)ng + 1))};
    int *id = xmalloc(sizeof *id * ((size_t)ng + 1));
    for (int g = 0; g < ng; g++) id[g] = -1;
    for (int i = 0; i < nd; i++) { /* rank order: the order hosts first appear in */
        if (id[group[i]] < 0) h->name[id[group[i]] = h->nh++] = s->d[i].host;
        h->of[i] = id[group[i]];
    }
    for (int i = 0, n = 0; i < nd; i++) { /* each host's ranks, in order */
        ranks[n++] = o[i].rank;
        if (i + 1 < nd && !strcmp(o[i + 1].host, o[i].host)) continue;
        ms_flight_format_ranks(ranks, n, h->ranks[h->of[o[i].i]], sizeof h->ranks[0]);
        n = 0;
    }
    free(o), free(group), free(ranks), free(id);
}

static void hosts_free(hosts *h) {
    free(h->of), free(h->name), free(h->ranks);
}

/* Memo of waits_on_other_hosts, per dump, valid for one host (gen: that host's index + 1): a
 * wait that comes back to a rank still being followed is a cycle of waits within the host,
 * which is no link's fault; each rank is followed once per host (without the memo, ranks that
 * each name two peers of their host took exponential time). */
enum { FOLLOWING = 1, YES, NO };
typedef struct memo {
    int *gen;
    uint8_t *state;
} memo;

/* Whether the timed-out wait of dump i comes down only to ranks of hosts other than host h
 * that dumped (alive): each missing rank of another host, or of h when it timed out waiting
 * itself and its wait comes down to other hosts (a rank waiting in a tp collective for a peer
 * of its host that was still in a dp collective with the cut-off host). */
static bool waits_on_other_hosts(const dump_set *s, const hosts *hs, int i, int h, memo *m) {
    if (m->gen[i] == h + 1) return m->state[i] == YES;
    m->gen[i] = h + 1;
    const ms_flight_entry *w = s->where[i];
    if (!w || w->status != MS_ERR_TIMEOUT || !w->n_missing) return (m->state[i] = NO), false;
    m->state[i] = FOLLOWING;
    bool yes = true;
    for (int k = 0; k < w->n_missing && yes; k++) {
        const dump *dm = find_rank(s, w->missing[k]);
        int j = dm ? (int)(dm - s->d) : -1;
        if (!dm || ended(dm)) /* not alive at the end: the rank, not the link, failed */
            yes = false;
        else if (hs->of[j] == h || !dm->host[0])
            yes = waits_on_other_hosts(s, hs, j, h, m);
    }
    m->state[i] = yes ? YES : NO;
    return yes;
}

static int cmp_pair(const void *a, const void *b) {
    const int *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* The pairs of hosts (a, b) where a rank of a named a rank of b as missing, sorted, distinct,
 * into pairs[0..2 * return). */
static int named_pairs(const dump_set *s, const hosts *hs, int *pairs) {
    int n = 0;
    for (int i = 0; i < s->nd; i++)
        for (int k = 0; s->where[i] && k < s->where[i]->n_missing; k++) {
            const dump *dm = find_rank(s, s->where[i]->missing[k]);
            int a = hs->of[i], b = dm ? hs->of[dm - s->d] : a;
            if (a != b) pairs[2 * n] = a, pairs[2 * n + 1] = b, n++;
        }
    qsort(pairs, (size_t)n, 2 * sizeof *pairs, cmp_pair);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (!u || cmp_pair(&pairs[2 * i], &pairs[2 * (u - 1)])) {
            pairs[2 * u] = pairs[2 * i], pairs[2 * u + 1] = pairs[2 * i + 1];
            u++;
        }
    return u;
}

/* Whether every rank that timed out waited only for ranks of other hosts (see above). */
static bool all_wait_on_other_hosts(const dump_set *s, const hosts *hs) {
    memo m = {.gen = xcalloc((size_t)s->nd + 1, sizeof *m.gen),
              .state = xcalloc((size_t)s->nd + 1, 1)};
    bool any = false, all = true;
    for (int i = 0; i < s->nd && all; i++) {
        const ms_flight_entry *w = s->where[i];
        if (!w || w->status != MS_ERR_TIMEOUT || !w->n_missing) continue;
        all = s->d[i].host[0] && waits_on_other_hosts(s, hs, i, hs->of[i], &m);
        any = true;
    }
    free(m.gen), free(m.state);
    return any && all;
}

/* Hosts that lost each other: every rank that timed out waited, directly or behind a peer of
 * its own host, only for ranks of other hosts, and those dumped too (alive, waiting
 * themselves): not a rank but the link between the hosts failed. Says so for each pair of
 * hosts that named each other; false when the dumps do not show that (one host, a stalled
 * rank of its own host, or one without a dump). */
static bool diagnose_hosts(const dump_set *s, ms_strbuf *out) {
    hosts hs;
    hosts_init(&hs, s);
    bool said = false;
    if (all_wait_on_other_hosts(s, &hs)) {
        int *pairs = xmalloc(sizeof *pairs * (2 * (size_t)s->nd * MS_FLIGHT_MAX_MISSING + 2));
        int np = named_pairs(s, &hs, pairs);
        for (int i = 0; i < np; i++) {
            int x = pairs[2 * i], y = pairs[2 * i + 1], back[2] = {y, x};
            if (x > y || !bsearch(back, pairs, (size_t)np, 2 * sizeof *pairs, cmp_pair)) continue;
            const char *a = hs.name[x], *b = hs.name[y];
            ms_strbuf_printf(out,
                             "hosts %s (ranks %s) and %s (ranks %s) lost each other: every rank "
                             "that timed out waited only for ranks of another host (or behind a "
                             "peer of its own host that did), which were alive and waiting too; "
                             "the link between %s and %s is down\n",
                             a, hs.ranks[x], b, hs.ranks[y], a, b);
            said = true;
        }
        free(pairs);
    }
    hosts_free(&hs);
    return said;
}

/* One line per rank: where it was, and what its record is. */
static void put_rank_line(const dump *d, ms_strbuf *out) {
    char line[512];
    ms_flight_describe(d->e, d->n, d->rank, d->now_ns, line, sizeof line);
    if (!d->live)
        ms_strbuf_printf(out, "  %s [dumped on: %s]%s", line, d->reason,
                         d->cut ? " (the dump was cut short: the rank was killed while "
                                  "writing it; its complete entries are read)"
                                : "");
    else if (d->term_sig)
        ms_strbuf_printf(out,
                         "  %s [no dump: it got %s and was killed before its dump was written; "
                         "read from its live record]",
                         line, d->reason);
    else
        ms_strbuf_printf(out,
                         "  %s [no dump: it ended " ENDED_HOW
                         "; read from its live record, as of its last call]",
                         line);
    if (d->torn)
        ms_strbuf_printf(out, " (%d entr%s being written as it ended left out)", d->torn,
                         d->torn == 1 ? "y" : "ies");
    ms_strbuf_printf(out, "\n");
}

/* The ranks of the world (its size as the records know it) that left no record at all: they
 * ended before their recorder was made (killed while starting), or their files were removed.
 * Returns whether there is one. */
static bool say_unrecorded(const dump *d, int nd, ms_strbuf *out) {
    int world = 0, m = 0;
    for (int i = 0; i < nd; i++)
        if (d[i].world > world) world = d[i].world;
    int *none = xmalloc(sizeof *none * ((size_t)world + 1));
    for (int r = 0, i = 0; r < world; r++) {
        while (i < nd && d[i].rank < r) i++;
        if (i == nd || d[i].rank != r) none[m++] = r;
    }
    static const char why[] = "left no flight record: ended before it began recording (killed "
                              "as it started), or its files were removed";
    if (m > 16) { /* a world of thousands: one line */
        char list[96];
        ms_flight_format_ranks(none, m, list, sizeof list);
        ms_strbuf_printf(out, "  %d ranks (%s) %s\n", m, list, why);
    }
    for (int k = 0; k < m && m <= 16; k++) ms_strbuf_printf(out, "  rank %d %s\n", none[k], why);
    free(none);
    return m > 0;
}

static void diagnose(dump *d, int nd, bool partial, ms_strbuf *out) {
    qsort(d, (size_t)nd, sizeof *d, dump_cmp);
    dump_set s;
    dump_set_init(&s, d, nd);
    bool fault = diagnose_hosts(&s, out);
    int n_live = 0, n_ended = 0, gone[8];
    for (int i = 0; i < nd; i++) {
        n_live += d[i].live;
        if (ended(&d[i]) && n_ended < 8) gone[n_ended++] = d[i].rank;
    }
    if (n_ended) {
        char ranks[96];
        ms_flight_format_ranks(gone, n_ended, ranks, sizeof ranks);
        bool many = n_ended > 1;
        ms_strbuf_printf(out,
                         "rank%s %s%s ended without a dump or a signal %s could handle (SIGKILL, "
                         "or a crash); %s live record%s tell%s where\n",
                         many ? "s" : "", ranks, n_ended == 8 ? " (and more)" : "",
                         many ? "they" : "it", many ? "their" : "its", many ? "s" : "",
                         many ? "" : "s");
        fault = true;
    }
    for (int i = 0; i < nd; i++) {
        const ms_flight_entry *w = s.where[i];
        if (!w || ended(&d[i])) continue; /* it was gone, not stuck: said with its peers */
        fault = true;
        if (w->n_p2p) {
            diagnose_p2p(&s, &d[i], w, out);
            continue;
        }
        bool seen = false; /* diagnosed with an earlier rank */
        for (int j = 0; j < i && !seen; j++) seen = !ended(&d[j]) && same_call(s.where[j], w);
        if (!seen && !only_culprits(&s, w)) diagnose_collective(&s, partial, w, out);
    }
    dump_set_free(&s);
    ms_strbuf unrecorded = {0};
    if (!partial && say_unrecorded(d, nd, &unrecorded)) fault = true;
    if (!fault)
        ms_strbuf_printf(out, "all ranks completed every collective: no communication fault\n");
    ms_strbuf_printf(out, "per rank (%d dump%s", nd - n_live, nd - n_live == 1 ? "" : "s");
    if (n_live) ms_strbuf_printf(out, ", %d live record%s", n_live, n_live == 1 ? "" : "s");
    ms_strbuf_printf(out, "):\n");
    for (int i = 0; i < nd; i++) put_rank_line(&d[i], out);
    if (unrecorded.p) ms_strbuf_put(out, unrecorded.p, unrecorded.len);
    free(unrecorded.p);
}

/* Keeps one dump per rank, the newest (a folder may hold an earlier job's dumps too), first
 * in d; returns how many. Those left out are named. */
static int keep_newest(dump *d, int n, ms_strbuf *out) {
    int kept = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < kept && d[k].rank != d[i].rank) k++;
        bool newer = k == kept || d[i].now_ns > d[k].now_ns;
        if (k < kept)
            ms_strbuf_printf(out, "(left out %s: an older dump of rank %d)\n",
                             newer ? d[k].path : d[i].path, d[i].rank);
        if (!newer) continue;
        dump t = d[k];
        d[k] = d[i];
        d[i] = t;
        if (k == kept) kept++;
    }
    return kept;
}

/* The diagnosis of d[0..n), read (or failed: st); frees what the dumps hold. */
static ms_status doctor(dump *d, int n, ms_status st, bool partial, ms_strbuf *out, ms_error *err) {
    /* a rank killed before it wrote its header (as the launcher may kill a stopped rank while
     * it dumps) left nothing to read: the others' dumps still tell what happened */
    int usable = 0;
    for (int i = 0; i < n && st == MS_OK; i++) {
        if (d[i].unusable) {
            ms_strbuf_printf(out, "(left out %s: %s)\n", d[i].path, d[i].unusable);
            continue;
        }
        if (d[i].empty || d[i].head_cut) {
            ms_strbuf_printf(out, "(left out %s: %s; the rank was killed while dumping)\n",
                             d[i].path, d[i].empty ? "empty" : "its first line is cut short");
            continue;
        }
        dump t = d[usable];
        d[usable++] = d[i];
        d[i] = t;
    }
    if (st == MS_OK && !usable)
        st = ms_fail(err, MS_ERR_INVALID,
                     "no flight recorder dump could be read: each is empty or cut off in its "
                     "first line (the ranks were killed while dumping), or a live record that "
                     "is none");
    int kept = st == MS_OK ? keep_newest(d, usable, out) : 0;
    if (st == MS_OK) diagnose(d, kept, partial, out);
    for (int i = 0; i < n; i++) free(d[i].e);
    free(d);
    return st;
}

ms_status ms_doctor_files(const char *const *paths, int n, bool partial, ms_strbuf *out,
                          ms_error *err) {
    dump *d = xcalloc((size_t)(n > 0 ? n : 1), sizeof *d);
    ms_status st = MS_OK;
    for (int i = 0; i < n && st == MS_OK; i++) {
        d[i].path = paths[i];
        st = read_dump(&d[i], err);
    }
    return doctor(d, n, st, partial, out, err);
}

ms_status ms_doctor_texts(const ms_doctor_text *dumps, int n, bool partial, ms_strbuf *out,
                          ms_error *err) {
    dump *d = xcalloc((size_t)(n > 0 ? n : 1), sizeof *d);
    ms_status st = MS_OK;
    for (int i = 0; i < n && st == MS_OK; i++) {
        d[i].path = dumps[i].name;
        if (dumps[i].len > DUMP_MAX_BYTES)
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s is more than the %u MiB a flight recorder dump can take",
                         dumps[i].name, DUMP_MAX_BYTES >> 20);
        else if (has_suffix(dumps[i].name, ".ring"))
            parse_live(dumps[i].text, dumps[i].len, &d[i]);
        else
            st = parse_dump(dumps[i].text, dumps[i].len, &d[i], err);
    }
    return doctor(d, n, st, partial, out, err);
}

/* A dump's or a live record's name. */
static bool is_dump_name(const char *name) {
    return !strncmp(name, "flight-rank", 11) &&
           (has_suffix(name, ".jsonl") || has_suffix(name, ".ring"));
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Drops from the sorted paths[0..n) each live record whose process's dump is there too (it
 * was killed after the dump and before the record went: the dump says it all); returns how
 * many remain. */
static int drop_dumped_live(char **paths, int n) {
    bool *drop = xcalloc((size_t)n, sizeof *drop); /* all are looked up before any goes */
    for (int i = 0; i < n; i++) {
        if (!has_suffix(paths[i], ".ring")) continue;
        size_t stem = strlen(paths[i]) - 5, len = stem + 7;
        char *dumped = xmalloc(len);
        snprintf(dumped, len, "%.*s.jsonl", (int)stem, paths[i]);
        drop[i] = bsearch(&dumped, paths, (size_t)n, sizeof *paths, str_cmp) != NULL;
        free(dumped);
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (drop[i])
            free(paths[i]);
        else
            paths[kept++] = paths[i];
    }
    free(drop);
    return kept;
}

ms_status ms_doctor_dir(const char *dir, ms_strbuf *out, ms_error *err) {
    DIR *dh = opendir(dir);
    if (!dh)
        return ms_fail(err, MS_ERR_IO,
                       "cannot read the folder %s (%s); give the --flight-dir of the failed job "
                       "(its ranks make it as they start: a job ended before that has none)",
                       dir, strerror(errno));
    char **paths = NULL;
    int n = 0, cap = 0;
    for (struct dirent *de; (de = readdir(dh));) {
        if (!is_dump_name(de->d_name)) continue;
        if (n == cap) paths = xrealloc(paths, sizeof *paths * (size_t)(cap = cap ? 2 * cap : 64));
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        paths[n] = xmalloc(len);
        snprintf(paths[n++], len, "%s/%s", dir, de->d_name);
    }
    closedir(dh);
    ms_status st;
    if (n) {
        qsort(paths, (size_t)n, sizeof *paths, str_cmp);
        n = drop_dumped_live(paths, n);
    }
    if (!n) {
        st = ms_fail(err, MS_ERR_INVALID,
                     "%s holds no flight recorder dumps (flight-rank<R>-pid<P>.jsonl) nor live "
                     "records (.ring): ranks keep a live record there while they run, removed "
                     "when they exit normally, and dump there when a collective times out or a "
                     "rank is terminated; a job ended before its ranks started leaves none",
                     dir);
    } else {
        st = ms_doctor_files((const char *const *)paths, n, false, out, err);
    }
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
    return st;
}

/* trace_json.c - a streaming JSON reader for Chrome traces: chunked input, one small tree per
 * event, byte offsets in every error. See trace_json.h for why it does not build a DOM. */
#include "traces/trace_json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHUNK  (1u << 20)
#define NO_KEY UINT32_MAX

/* --- byte source -------------------------------------------------------------------------- */

void tj_src_mem(tj_src *s, const void *data, size_t len, const char *name) {
    *s = (tj_src){.p = data, .len = len, .name = name};
}

ms_status tj_src_open(tj_src *s, const char *path, ms_error *err) {
    *s = (tj_src){.name = path};
    FILE *f = fopen(path, "rb");
    if (!f) return ms_fail(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || S_ISDIR(sb.st_mode)) {
        fclose(f);
        return ms_fail(err, MS_ERR_IO, "%s: is a folder, not a trace file", path);
    }
    s->buf = malloc(CHUNK);
    if (!s->buf) {
        fclose(f);
        return ms_fail(err, MS_ERR_NOMEM, "%s: cannot allocate a read buffer", path);
    }
    s->f = f;
    s->p = s->buf;
    return MS_OK;
}

void tj_src_close(tj_src *s) {
    if (s->f) fclose(s->f);
    free(s->buf);
    s->f = NULL;
    s->buf = NULL;
}

/* Next chunk of a file; false at the end (or on a read error, recorded in ioerr). */
static bool refill(tj_src *s) {
    if (!s->f || s->ioerr) return false;
    s->base += s->len;
    s->pos = 0;
    s->len = fread(s->buf, 1, CHUNK, s->f);
    if (s->len == 0 && ferror(s->f)) s->ioerr = errno ? errno : EIO;
    return s->len > 0;
}

/* The next byte without consuming it, or -1 at the end of the input. */
static inline int peek(tj_src *s) {
    if (s->pos < s->len) return s->p[s->pos];
    return refill(s) ? s->p[s->pos] : -1;
}

static inline void skip_ws(tj_src *s) {
    for (;;) {
        while (s->pos < s->len) {
            uint8_t c = s->p[s->pos];
            if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
            s->pos++;
        }
        if (!refill(s)) return;
    }
}

/* --- tree ------------------------------------------------------------------------------- */

void tj_doc_free(tj_doc *d) {
    free(d->nodes);
    free(d->pool);
    *d = (tj_doc){0};
}

static void doc_reset(tj_doc *d, size_t limit) {
    d->n = 0;
    d->plen = 0;
    d->limit = limit;
}

int tj_get(const tj_doc *d, int obj, const char *key) {
    if (obj < 0 || d->nodes[obj].type != TJ_OBJ) return -1;
    for (int c = d->nodes[obj].first; c >= 0; c = d->nodes[c].next)
        if (!strcmp(d->pool + d->nodes[c].key, key)) return c;
    return -1;
}

const char *tj_str(const tj_doc *d, int node) {
    if (node < 0 || d->nodes[node].type != TJ_STR) return NULL;
    return d->pool + d->nodes[node].text;
}

const char *tj_key(const tj_doc *d, int node) {
    if (node < 0 || d->nodes[node].key == NO_KEY) return "";
    return d->pool + d->nodes[node].key;
}

double tj_num(const tj_doc *d, int node) {
    if (node < 0 || d->nodes[node].type != TJ_NUM) return NAN;
    return strtod(d->pool + d->nodes[node].text, NULL);
}

static const uint64_t pow10_u64[20] = {1ull,
                                       10ull,
                                       100ull,
                                       1000ull,
                                       10000ull,
                                       100000ull,
                                       1000000ull,
                                       10000000ull,
                                       100000000ull,
                                       1000000000ull,
                                       10000000000ull,
                                       100000000000ull,
                                       1000000000000ull,
                                       10000000000000ull,
                                       100000000000000ull,
                                       1000000000000000ull,
                                       10000000000000000ull,
                                       100000000000000000ull,
                                       1000000000000000000ull,
                                       10000000000000000000ull};

/* Exact decimal scaling on the number's text: up to 19 significant digits are kept in a
 * uint64, so "12345.678" microseconds become 12345678 ns with no binary rounding on the way. */
bool tj_scaled(const tj_doc *d, int node, int scale, int64_t *out, bool *inexact) {
    if (node < 0 || d->nodes[node].type != TJ_NUM) return false;
    const char *p = d->pool + d->nodes[node].text;
    bool neg = *p == '-', dropped = false;
    if (neg) p++;
    uint64_t mant = 0;
    int nd = 0;
    long exp10 = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (nd < 19) {
            mant = mant * 10 + (uint64_t)(*p - '0');
            if (mant) nd++;
        } else {
            exp10++;
            dropped |= *p != '0';
        }
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++) {
            if (nd < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                if (mant) nd++;
                exp10--;
            } else {
                dropped |= *p != '0';
            }
        }
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        bool eneg = *p == '-';
        if (*p == '-' || *p == '+') p++;
        long e = 0;
        for (; *p >= '0' && *p <= '9'; p++)
            if (e < 100000) e = e * 10 + (*p - '0');
        exp10 += eneg ? -e : e;
    }
    long target = exp10 + scale;
    uint64_t v;
    if (mant == 0) {
        v = 0;
    } else if (target >= 0) {
        v = mant;
        for (long i = 0; i < target; i++) {
            if (v > UINT64_MAX / 10) return false;
            v *= 10;
        }
    } else if (target < -19) {
        v = 0;
        dropped = true;
    } else {
        uint64_t q = pow10_u64[-target];
        v = mant / q;
        uint64_t r = mant % q;
        if (r >= q - r) v++; /* r >= q/2 without overflow: half away from zero */
        dropped |= r != 0;
    }
    if (v > (uint64_t)INT64_MAX) return false;
    *out = neg ? -(int64_t)v : (int64_t)v;
    if (inexact) *inexact = dropped;
    return true;
}

bool tj_int(const tj_doc *d, int node, int64_t lo, int64_t hi, int64_t *out) {
    bool inexact;
    int64_t v;
    if (!tj_scaled(d, node, 0, &v, &inexact) || inexact || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* --- parser ----------------------------------------------------------------------------- */

typedef struct parser {
    tj_src *s;
    tj_doc *d;
    bool store; /* false: validate and skip, storing nothing */
    ms_error *err;
} parser;

static ms_status io_fail(parser *p) {
    return ms_fail(p->err, MS_ERR_IO, "%s: read failed at byte %llu: %s", p->s->name,
                   (unsigned long long)tj_off(p->s), strerror(p->s->ioerr));
}

/* "x.json: byte 123: expected ',' or ']'" (with what was found, or that the file ended). */
static ms_status syntax(parser *p, const char *what) {
    if (p->s->ioerr) return io_fail(p);
    int c = peek(p->s);
    unsigned long long off = (unsigned long long)tj_off(p->s);
    if (c < 0)
        return ms_fail(p->err, MS_ERR_INVALID,
                       "%s: byte %llu: unexpected end of file (truncated?); expected %s",
                       p->s->name, off, what);
    if (c >= 0x20 && c < 0x7f)
        return ms_fail(p->err, MS_ERR_INVALID, "%s: byte %llu: expected %s, found '%c'", p->s->name,
                       off, what, c);
    return ms_fail(p->err, MS_ERR_INVALID, "%s: byte %llu: expected %s, found byte 0x%02x",
                   p->s->name, off, what, c);
}

static ms_status too_big(parser *p) {
    return ms_fail(p->err, MS_ERR_INVALID,
                   "%s: byte %llu: value too large (over %zu bytes of text in one event or "
                   "header value)",
                   p->s->name, (unsigned long long)tj_off(p->s), p->d->limit);
}

static ms_status pool_put(parser *p, const char *b, size_t n) {
    tj_doc *d = p->d;
    if (d->plen + n + 1 > d->limit) return too_big(p);
    if (d->plen + n + 1 > d->pcap) {
        size_t cap = d->pcap ? d->pcap : 4096;
        while (cap < d->plen + n + 1) cap *= 2;
        char *np = realloc(d->pool, cap);
        if (!np) return ms_fail(p->err, MS_ERR_NOMEM, "%s: out of memory", p->s->name);
        d->pool = np;
        d->pcap = cap;
    }
    memcpy(d->pool + d->plen, b, n);
    d->plen += n;
    return MS_OK;
}

/* Appends a node (store mode); *idx = -1 when not storing. */
static ms_status new_node(parser *p, tj_type t, int *idx) {
    *idx = -1;
    if (!p->store) return MS_OK;
    tj_doc *d = p->d;
    /* Nodes count against the limit too, so "[[],[],...]" cannot grow without bound. */
    if ((size_t)(d->n + 1) * 8 > d->limit) return too_big(p);
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 256;
        tj_node *nn = realloc(d->nodes, cap * sizeof *nn);
        if (!nn) return ms_fail(p->err, MS_ERR_NOMEM, "%s: out of memory", p->s->name);
        d->nodes = nn;
        d->cap = cap;
    }
    d->nodes[d->n] = (tj_node){.type = (uint8_t)t, .key = NO_KEY, .first = -1, .next = -1};
    *idx = (int)d->n++;
    return MS_OK;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static ms_status read_hex4(parser *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(peek(p->s));
        if (h < 0) return syntax(p, "4 hex digits after \\u");
        p->s->pos++;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return MS_OK;
}

static size_t utf8_encode(unsigned cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A string at the current '"'; stores its decoded text (NUL-terminated) when `keep`, and
 * returns the pool offset and length. Lone surrogates become U+FFFD (tolerated, as browsers
 * do); raw control characters are an error, as JSON says. */
static ms_status parse_string(parser *p, bool keep, uint32_t *text, uint32_t *len) {
    tj_src *s = p->s;
    s->pos++; /* the opening quote */
    size_t start = p->d->plen;
    keep = keep && p->store;
    for (;;) {
        /* Copy a run of plain bytes from the current chunk at once. */
        size_t i = s->pos;
        while (i < s->len && s->p[i] != '"' && s->p[i] != '\\' && s->p[i] >= 0x20) i++;
        if (keep && i > s->pos) MS_CHECK(pool_put(p, (const char *)s->p + s->pos, i - s->pos));
        s->pos = i;
        int c = peek(s);
        if (c < 0) return syntax(p, "'\"' to end the string");
        if (c == '"') {
            s->pos++;
            break;
        }
        if (c < 0x20) return syntax(p, "no control character inside a string (escape it)");
        if (c != '\\') continue; /* the chunk ended inside a run */
        s->pos++;
        int e = peek(s);
        char out[8];
        size_t n = 1;
        switch (e) {
            case '"':
                out[0] = '"';
                break;
            case '\\':
                out[0] = '\\';
                break;
            case '/':
                out[0] = '/';
                break;
            case 'b':
                out[0] = '\b';
                break;
            case 'f':
                out[0] = '\f';
                break;
            case 'n':
                out[0] = '\n';
                break;
            case 'r':
                out[0] = '\r';
                break;
            case 't':
                out[0] = '\t';
                break;
            case 'u': {
                s->pos++;
                unsigned cp;
                MS_CHECK(read_hex4(p, &cp));
                if (cp >= 0xd800 && cp < 0xdc00 && peek(s) == '\\') {
                    s->pos++;
                    if (peek(s) != 'u') return syntax(p, "'u' of a low surrogate escape");
                    s->pos++;
                    unsigned lo;
                    MS_CHECK(read_hex4(p, &lo));
                    if (lo >= 0xdc00 && lo < 0xe000)
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    else
                        cp = 0xfffd;
                } else if (cp >= 0xd800 && cp < 0xe000) {
                    cp = 0xfffd;
                }
                n = utf8_encode(cp, out);
                if (keep) MS_CHECK(pool_put(p, out, n));
                continue;
            }
            default:
                return syntax(p, "a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
        }
        s->pos++;
        if (keep) MS_CHECK(pool_put(p, out, n));
    }
    if (keep) MS_CHECK(pool_put(p, "", 1));
    *text = (uint32_t)start;
    *len = keep ? (uint32_t)(p->d->plen - start - 1) : 0;
    return MS_OK;
}

static ms_status parse_number(parser *p, int idx) {
    tj_src *s = p->s;
    char tmp[64];
    size_t n = 0, start = p->d->plen;
    bool keep = idx >= 0;
/* Appends the current byte to the number text, in 64-byte pieces. */
#define TAKE()                                                                                     \
    do {                                                                                           \
        if (keep) {                                                                                \
            tmp[n++] = (char)s->p[s->pos];                                                         \
            if (n == sizeof tmp) {                                                                 \
                MS_CHECK(pool_put(p, tmp, n));                                                     \
                n = 0;                                                                             \
            }                                                                                      \
        }                                                                                          \
        s->pos++;                                                                                  \
    } while (0)
    if (peek(s) == '-') TAKE();
    int c = peek(s);
    if (c == '0') {
        TAKE();
    } else if (c >= '1' && c <= '9') {
        while ((c = peek(s)) >= '0' && c <= '9') TAKE();
    } else {
        return syntax(p, "a digit in a number");
    }
    if (peek(s) == '.') {
        TAKE();
        if (!((c = peek(s)) >= '0' && c <= '9')) return syntax(p, "a digit after '.'");
        while ((c = peek(s)) >= '0' && c <= '9') TAKE();
    }
    c = peek(s);
    if (c == 'e' || c == 'E') {
        TAKE();
        c = peek(s);
        if (c == '+' || c == '-') TAKE();
        if (!((c = peek(s)) >= '0' && c <= '9')) return syntax(p, "a digit in the exponent");
        while ((c = peek(s)) >= '0' && c <= '9') TAKE();
    }
#undef TAKE
    if (keep) {
        MS_CHECK(pool_put(p, tmp, n));
        MS_CHECK(pool_put(p, "", 1));
        p->d->nodes[idx].text = (uint32_t)start;
        p->d->nodes[idx].len = (uint32_t)(p->d->plen - start - 1);
    }
    return MS_OK;
}

static ms_status parse_literal(parser *p, const char *word, tj_type t, int *idx) {
    for (const char *w = word; *w; w++) {
        if (peek(p->s) != *w) {
            char what[16];
            snprintf(what, sizeof what, "'%s'", word);
            return syntax(p, what);
        }
        p->s->pos++;
    }
    return new_node(p, t, idx);
}

static ms_status parse_value(parser *p, int depth, int *idx);

static ms_status parse_container(parser *p, int depth, bool obj, int *idx) {
    if (depth >= TJ_MAX_DEPTH)
        return ms_fail(p->err, MS_ERR_INVALID, "%s: byte %llu: nested more than %d levels deep",
                       p->s->name, (unsigned long long)tj_off(p->s), TJ_MAX_DEPTH);
    MS_CHECK(new_node(p, obj ? TJ_OBJ : TJ_ARR, idx));
    int self = *idx;
    p->s->pos++; /* '{' or '[' */
    skip_ws(p->s);
    char close = obj ? '}' : ']';
    if (peek(p->s) == close) {
        p->s->pos++;
        return MS_OK;
    }
    int prev = -1;
    uint32_t count = 0;
    for (;;) {
        uint32_t key = NO_KEY, klen;
        if (obj) {
            skip_ws(p->s);
            if (peek(p->s) != '"') return syntax(p, "'\"' to start a member name");
            MS_CHECK(parse_string(p, true, &key, &klen));
            skip_ws(p->s);
            if (peek(p->s) != ':') return syntax(p, "':' after a member name");
            p->s->pos++;
        }
        int child;
        MS_CHECK(parse_value(p, depth + 1, &child));
        if (self >= 0) {
            tj_node *nodes = p->d->nodes;
            nodes[child].key = key;
            if (prev < 0)
                nodes[self].first = child;
            else
                nodes[prev].next = child;
            prev = child;
            nodes[self].len = ++count;
        }
        skip_ws(p->s);
        int c = peek(p->s);
        if (c == ',') {
            p->s->pos++;
            continue;
        }
        if (c == close) {
            p->s->pos++;
            return MS_OK;
        }
        return syntax(p, obj ? "',' or '}'" : "',' or ']'");
    }
}

static ms_status parse_value(parser *p, int depth, int *idx) {
    skip_ws(p->s);
    int c = peek(p->s);
    switch (c) {
        case '{':
            return parse_container(p, depth, true, idx);
        case '[':
            return parse_container(p, depth, false, idx);
        case '"': {
            MS_CHECK(new_node(p, TJ_STR, idx));
            uint32_t text, len;
            MS_CHECK(parse_string(p, *idx >= 0, &text, &len));
            if (*idx >= 0) {
                p->d->nodes[*idx].text = text;
                p->d->nodes[*idx].len = len;
            }
            return MS_OK;
        }
        case 't':
            return parse_literal(p, "true", TJ_TRUE, idx);
        case 'f':
            return parse_literal(p, "false", TJ_FALSE, idx);
        case 'n':
            return parse_literal(p, "null", TJ_NULL, idx);
        default:
            if (c == '-' || (c >= '0' && c <= '9')) {
                MS_CHECK(new_node(p, TJ_NUM, idx));
                return parse_number(p, *idx);
            }
            return syntax(p, "a value");
    }
}

/* --- the trace walk --------------------------------------------------------------------- */

/* Up to the first member: a byte order mark (which some editors add) skipped, then '{'. */
static ms_status scan_open(parser *p) {
    tj_src *s = p->s;
    if (peek(s) == 0xef && s->len - s->pos >= 3 && !memcmp(s->p + s->pos, "\xef\xbb\xbf", 3))
        s->pos += 3;
    skip_ws(s);
    int c = peek(s);
    if (c < 0)
        return s->ioerr ? io_fail(p)
                        : ms_fail(p->err, MS_ERR_INVALID,
                                  "%s: the file is empty (no JSON value); not a Chrome trace (no "
                                  "traceEvents array)",
                                  s->name);
    if (c == '[')
        return ms_fail(p->err, MS_ERR_INVALID,
                       "%s: the top level is an array (the Trace Event Format's JSON Array "
                       "Format); meshscope reads the JSON Object Format {\"traceEvents\": [...]}",
                       s->name);
    if (c != '{')
        return ms_fail(p->err, MS_ERR_INVALID,
                       "%s: not a Chrome trace: the file does not start with a JSON object",
                       s->name);
    s->pos++;
    return MS_OK;
}

/* The traceEvents array, each event parsed into the doc and handed to h->event. */
static ms_status scan_events(parser *p, const tj_handler *h) {
    tj_src *s = p->s;
    if (peek(s) != '[')
        return peek(s) < 0 ? syntax(p, "'[' to start traceEvents")
                           : ms_fail(p->err, MS_ERR_INVALID,
                                     "%s: byte %llu: not a Chrome trace: traceEvents is not an "
                                     "array",
                                     s->name, (unsigned long long)tj_off(s));
    s->pos++;
    skip_ws(s);
    if (peek(s) == ']') {
        s->pos++;
        return MS_OK;
    }
    for (size_t index = 0;; index++) {
        skip_ws(s);
        uint64_t off = tj_off(s);
        doc_reset(p->d, TJ_MAX_EVENT_BYTES);
        int root;
        MS_CHECK(parse_value(p, 0, &root));
        MS_CHECK(h->event(h->user, index, off, p->d, root, p->err));
        skip_ws(s);
        int c = peek(s);
        if (c == ',') {
            s->pos++;
            continue;
        }
        if (c == ']') {
            s->pos++;
            return MS_OK;
        }
        return syntax(p, "',' or ']' after an event in traceEvents");
    }
}

/* One top-level member: traceEvents, a member the handler wants (h->meta), or one skipped. */
static ms_status scan_member(parser *p, const tj_handler *h, bool *seen_events) {
    tj_src *s = p->s;
    skip_ws(s);
    if (peek(s) != '"') return syntax(p, "'\"' to start a member name");
    /* The key goes into the tree's pool, then into a local copy. */
    doc_reset(p->d, TJ_MAX_META_BYTES);
    p->store = true;
    uint32_t kt, kl;
    MS_CHECK(parse_string(p, true, &kt, &kl));
    char key[64];
    bool long_key = kl >= sizeof key;
    snprintf(key, sizeof key, "%s", p->d->pool + kt);
    skip_ws(s);
    if (peek(s) != ':') return syntax(p, "':' after a member name");
    s->pos++;
    skip_ws(s);
    int root;
    if (!long_key && !strcmp(key, "traceEvents")) {
        if (*seen_events)
            return ms_fail(p->err, MS_ERR_INVALID, "%s: byte %llu: a second traceEvents key",
                           s->name, (unsigned long long)tj_off(s));
        *seen_events = true;
        return scan_events(p, h);
    }
    if (!long_key && h->want_meta && h->want_meta(h->user, key)) {
        doc_reset(p->d, TJ_MAX_META_BYTES);
        MS_CHECK(parse_value(p, 0, &root));
        return h->meta(h->user, key, p->d, root, p->err);
    }
    p->store = false;
    MS_CHECK(parse_value(p, 0, &root));
    p->store = true;
    return MS_OK;
}

/* The members of the top-level object, after its '{'. */
static ms_status scan_members(parser *p, const tj_handler *h, bool *seen_events) {
    tj_src *s = p->s;
    skip_ws(s);
    if (peek(s) == '}') {
        s->pos++;
        return MS_OK;
    }
    for (;;) {
        MS_CHECK(scan_member(p, h, seen_events));
        skip_ws(s);
        int c = peek(s);
        if (c == ',') {
            s->pos++;
            continue;
        }
        if (c == '}') {
            s->pos++;
            return MS_OK;
        }
        return syntax(p, "',' or '}' after a top-level member");
    }
}

ms_status tj_scan_trace(tj_src *s, const tj_handler *h, ms_error *err) {
    tj_doc doc = {0};
    parser p = {.s = s, .d = &doc, .err = err};
    bool seen_events = false;
    ms_status st = scan_open(&p);
    if (st == MS_OK) st = scan_members(&p, h, &seen_events);
    if (st == MS_OK) {
        skip_ws(s);
        if (peek(s) >= 0)
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s: byte %llu: trailing data after the top-level object", s->name,
                         (unsigned long long)tj_off(s));
        else if (s->ioerr)
            st = io_fail(&p);
        else if (!seen_events)
            st = ms_fail(err, MS_ERR_INVALID, "%s: not a Chrome trace (no traceEvents array)",
                         s->name);
    }
    tj_doc_free(&doc);
    return st;
}

/* trace_json.h - internal: the streaming JSON layer shared by the trace reader and validator.
 *
 * Trace files can be hundreds of MB, so nothing here builds a tree of the whole file. A
 * byte source (tj_src) reads a file in 1 MiB chunks (or walks a memory buffer), and
 * tj_scan_trace walks the top-level object: each element of "traceEvents" is parsed on its
 * own into a small tree (tj_doc, reset for every event, capped in bytes and depth) and
 * handed to a callback; other top-level keys are either parsed the same way (when the
 * caller wants them: "distributedInfo", "baseTimeNanoseconds", ...) or skipped without
 * storing anything. Numbers keep their text so that times convert to nanoseconds exactly.
 *
 * Errors name the file and the byte offset: "x.json: byte 123: expected ',' or ']'".
 * Not a public API: include it only from traces/.
 */
#ifndef MS_TRACE_JSON_H
#define MS_TRACE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/core/status.h"

#define TJ_MAX_DEPTH       64          /* nesting allowed inside one event or metadata value */
#define TJ_MAX_EVENT_BYTES (1u << 20)  /* stored text (strings, numbers) of one event */
#define TJ_MAX_META_BYTES  (16u << 20) /* stored text of one wanted top-level value */

/* A byte source: a FILE read in chunks, or a caller's memory buffer (borrowed). */
typedef struct tj_src {
    FILE *f; /* NULL for memory */
    const uint8_t *p;
    size_t len, pos;
    uint64_t base; /* file offset of p[0] */
    uint8_t *buf;  /* owned chunk buffer (files only) */
    const char *name;
    int ioerr; /* errno of a failed read, 0 if none */
} tj_src;

void tj_src_mem(tj_src *s, const void *data, size_t len, const char *name);
/* Opens `path` for reading: MS_ERR_IO naming the path when it cannot (missing, a folder). */
ms_status tj_src_open(tj_src *s, const char *path, ms_error *err);
void tj_src_close(tj_src *s);
static inline uint64_t tj_off(const tj_src *s) {
    return s->base + s->pos;
}

typedef enum tj_type { TJ_NULL, TJ_FALSE, TJ_TRUE, TJ_NUM, TJ_STR, TJ_ARR, TJ_OBJ } tj_type;

/* One value. Strings and numbers keep their (decoded, NUL-terminated) text in the pool. */
typedef struct tj_node {
    uint8_t type;
    uint32_t len;        /* text bytes (strings, numbers) or child count (arrays, objects) */
    uint32_t text;       /* pool offset of the text */
    uint32_t key;        /* pool offset of the member name when inside an object */
    int32_t first, next; /* first child, next sibling; -1 = none */
} tj_node;

/* A small tree for one value; reused (tj_doc_reset) from event to event. */
typedef struct tj_doc {
    tj_node *nodes;
    uint32_t n, cap;
    char *pool;
    size_t plen, pcap;
    size_t limit; /* pool bytes allowed */
} tj_doc;

void tj_doc_free(tj_doc *d);

/* Tree access. All take node indices; -1 stands for "absent" and is accepted everywhere. */
int tj_get(const tj_doc *d, int obj, const char *key); /* member of an object, first match */
const char *tj_str(const tj_doc *d, int node);         /* string text, NULL if not a string */
const char *tj_key(const tj_doc *d, int node);         /* member name */
static inline int tj_type_of(const tj_doc *d, int node) {
    return node < 0 ? -1 : (int)d->nodes[node].type;
}
static inline int tj_first(const tj_doc *d, int node) {
    return node < 0 ? -1 : d->nodes[node].first;
}
static inline int tj_next(const tj_doc *d, int node) {
    return node < 0 ? -1 : d->nodes[node].next;
}
/* A number as a double (NaN if not a number). */
double tj_num(const tj_doc *d, int node);
/* A number times 10^scale as an exact integer, rounded half away from zero. Returns false if
 * node is not a number or the result does not fit; *inexact (may be NULL) says whether
 * rounding dropped non-zero digits. */
bool tj_scaled(const tj_doc *d, int node, int scale, int64_t *out, bool *inexact);
/* An integral number that fits in [lo, hi]. */
bool tj_int(const tj_doc *d, int node, int64_t lo, int64_t hi, int64_t *out);

/* What tj_scan_trace calls. want_meta may be NULL (skip every other key). */
typedef struct tj_handler {
    void *user;
    bool (*want_meta)(void *user, const char *key);
    ms_status (*meta)(void *user, const char *key, const tj_doc *d, int root, ms_error *err);
    /* index: position in traceEvents; off: byte offset of the element */
    ms_status (*event)(void *user, size_t index, uint64_t off, const tj_doc *d, int root,
                       ms_error *err);
} tj_handler;

/* Walks a Chrome trace in the JSON Object Format. Fails with MS_ERR_INVALID on malformed or
 * truncated JSON, on a top level that is not an object with a "traceEvents" array, and on
 * values over the caps; MS_ERR_IO on a read error; or with whatever a callback returned. */
ms_status tj_scan_trace(tj_src *s, const tj_handler *h, ms_error *err);

#endif

/* safetensors.c - writing (hand-built header, durable) and reading (cJSON, validated). */
#include "engine/io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/xalloc.h"
#include "engine/io/json_text.h"
#include "engine/io/fileio.h"

/* The format is little-endian; so are all the hosts meshscope targets, which lets f32 data
 * go to and from the file without byte swapping. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* JSON numbers are doubles: integers above 2^53 cannot be represented exactly. */
#define MAX_JSON_INT 9007199254740992.0

static ms_status invalid(ms_error *err, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ms_status invalid(ms_error *err, const char *name, const char *fmt, ...) {
    char msg[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ms_fail(err, MS_ERR_INVALID, "%s: %s", name, msg);
}

static const char *dtype_tag(ms_dtype dt) {
    return dt == MS_BF16 ? "BF16" : "F32";
}

/* numel of a shape, or -1 when a dim is negative or the byte size (numel * esize) would
 * not fit in int64. */
static int64_t checked_numel(int ndim, const int64_t *shape, size_t esize) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return -1;
        if (shape[d] != 0 && n > INT64_MAX / (int64_t)esize / shape[d]) return -1;
        n *= shape[d];
    }
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* writing                                                                                   */

typedef ms_strbuf sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    ms_strbuf_put(b, s, n);
}

static void sb_puts(sbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

static void sb_u64(sbuf *b, uint64_t v) {
    char tmp[24];
    int k = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)k);
}

/* A JSON string literal; bytes >= 0x80 pass through (names are UTF-8). */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char esc[2] = {'\\', (char)*c};
            sb_put(b, esc, 2);
        } else if (*c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name that appears twice, or NULL. Sorting keeps this O(n log n). */
static const char *find_duplicate(const char **names, int n) {
    if (n < 2) return NULL;
    const char **s = xmalloc((size_t)n * sizeof *s);
    memcpy(s, names, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_str_ptr);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0) dup = s[i];
    free(s);
    return dup;
}

static ms_status check_entries(const char *path, const ms_st_entry *e, int n, const ms_st_kv *meta,
                               int nmeta, ms_error *err) {
    if (n < 0 || (n > 0 && !e) || nmeta < 0 || (nmeta > 0 && !meta))
        return invalid(err, path, "bad entry list (n %d, nmeta %d)", n, nmeta);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = e[i].name;
        if (!nm || !*nm) return invalid(err, path, "tensor %d has no name", i);
        if (strcmp(nm, "__metadata__") == 0)
            return invalid(err, path, "a tensor cannot be named __metadata__ (reserved)");
        if (e[i].dtype != MS_F32 && e[i].dtype != MS_BF16)
            return invalid(err, path, "tensor %s: dtype must be F32 or BF16", nm);
        if (e[i].ndim < 0 || e[i].ndim > MS_MAX_DIMS)
            return invalid(err, path, "tensor %s: %d dims; 0..%d are supported", nm, e[i].ndim,
                           MS_MAX_DIMS);
        int64_t numel = checked_numel(e[i].ndim, e[i].shape, ms_dtype_size(e[i].dtype));
        if (numel < 0)
            return invalid(err, path, "tensor %s: shape has a negative dim or is too large", nm);
        if (numel > 0 && !e[i].data) return invalid(err, path, "tensor %s: no data given", nm);
        uint64_t bytes = (uint64_t)numel * ms_dtype_size(e[i].dtype);
        if (total + bytes < total || total + bytes > (uint64_t)MAX_JSON_INT)
            return invalid(err, path, "tensors total more than 2^53 bytes");
        total += bytes;
    }
    const char **names = xmalloc(((size_t)n + (size_t)nmeta + 1) * sizeof *names);
    for (int i = 0; i < n; i++) names[i] = e[i].name;
    const char *dup = find_duplicate(names, n);
    ms_status st = MS_OK;
    if (dup) st = invalid(err, path, "two tensors are named %s; names must be unique", dup);
    for (int i = 0; st == MS_OK && i < nmeta; i++) {
        if (!meta[i].key || !meta[i].value)
            st = invalid(err, path, "metadata entry %d has a NULL key or value", i);
        names[i] = meta[i].key;
    }
    if (st == MS_OK && (dup = find_duplicate(names, nmeta)))
        st = invalid(err, path, "metadata key %s appears twice", dup);
    free(names);
    return st;
}

/* The header JSON, space-padded so that 8 + its length is a multiple of 8. */
static void build_header(const ms_st_entry *e, int n, const ms_st_kv *meta, int nmeta, sbuf *b) {
    sb_puts(b, "{");
    if (nmeta > 0) {
        sb_puts(b, "\"__metadata__\":{");
        for (int i = 0; i < nmeta; i++) {
            if (i) sb_puts(b, ",");
            sb_json_str(b, meta[i].key);
            sb_puts(b, ":");
            sb_json_str(b, meta[i].value);
        }
        sb_puts(b, "}");
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (i || nmeta > 0) sb_puts(b, ",");
        sb_json_str(b, e[i].name);
        sb_puts(b, ":{\"dtype\":\"");
        sb_puts(b, dtype_tag(e[i].dtype));
        sb_puts(b, "\",\"shape\":[");
        for (int d = 0; d < e[i].ndim; d++) {
            if (d) sb_puts(b, ",");
            sb_u64(b, (uint64_t)e[i].shape[d]);
        }
        uint64_t bytes =
            (uint64_t)checked_numel(e[i].ndim, e[i].shape, 1) * ms_dtype_size(e[i].dtype);
        sb_puts(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_puts(b, ",");
        sb_u64(b, off + bytes);
        sb_puts(b, "]}");
        off += bytes;
    }
    sb_puts(b, "}");
    while (b->len % 8) sb_puts(b, " ");
}

typedef struct write_job {
    const char *path;
    const ms_st_entry *e;
    int n;
    const sbuf *header;
} write_job;

static ms_status write_body(FILE *f, void *arg, ms_error *err) {
    const write_job *j = arg;
    uint8_t len8[8];
    uint64_t hl = j->header->len;
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hl >> (8 * i));
    MS_CHECK(ms_durable_fwrite(f, len8, 8, j->path, err));
    MS_CHECK(ms_durable_fwrite(f, j->header->p, j->header->len, j->path, err));
    enum { CHUNK = 1 << 15 };
    uint16_t *half = NULL;
    ms_status st = MS_OK;
    for (int i = 0; i < j->n && st == MS_OK; i++) {
        const ms_st_entry *e = &j->e[i];
        int64_t numel = checked_numel(e->ndim, e->shape, 1);
        if (e->dtype == MS_F32) {
            st = ms_durable_fwrite(f, e->data, (size_t)numel * sizeof(float), j->path, err);
            continue;
        }
        if (!half) half = xmalloc(CHUNK * sizeof *half);
        for (int64_t k = 0; k < numel && st == MS_OK; k += CHUNK) {
            int64_t m = numel - k < CHUNK ? numel - k : CHUNK;
            for (int64_t q = 0; q < m; q++) half[q] = ms_bf16_from_f32(e->data[k + q]);
            st = ms_durable_fwrite(f, half, (size_t)m * sizeof *half, j->path, err);
        }
    }
    free(half);
    return st;
}

ms_status ms_safetensors_write(const char *path, const ms_st_entry *entries, int n,
                               const ms_st_kv *meta, int nmeta, ms_error *err) {
    MS_CHECK(check_entries(path, entries, n, meta, nmeta, err));
    sbuf header = {0};
    build_header(entries, n, meta, nmeta, &header);
    ms_status st;
    if (header.len > MS_ST_MAX_HEADER) {
        st = invalid(err, path,
                     "the header would be %zu bytes, over the %u-byte limit readers "
                     "accept; use fewer or shorter names and metadata",
                     header.len, MS_ST_MAX_HEADER);
    } else {
        write_job job = {path, entries, n, &header};
        st = ms_write_file_durable(path, write_body, &job, err);
    }
    free(header.p);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* reading                                                                                   */

void ms_safetensors_free(ms_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        free(f->tensors[i].name);
        free(f->tensors[i].data);
    }
    for (int i = 0; i < f->nmeta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->by_name);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* A JSON integer in [0, 2^53]. */
static bool json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= MAX_JSON_INT && d == floor(d))) return false;
    *out = (uint64_t)d;
    return true;
}

/* Every dtype tag of the format and its element size. */
static const struct {
    const char *tag;
    unsigned bytes;
} all_dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
                  {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
                  {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8}};

/* Sets t's dtype from the tag; false when the tag is not accepted. */
static bool set_dtype(ms_st_tensor *t, const char *tag, bool any) {
    for (size_t i = 0; i < sizeof all_dtypes / sizeof all_dtypes[0]; i++) {
        if (strcmp(tag, all_dtypes[i].tag) != 0) continue;
        bool bf16 = strcmp(tag, "BF16") == 0;
        if (!any && !bf16 && strcmp(tag, "F32") != 0) return false;
        t->dtype = bf16 ? MS_BF16 : MS_F32;
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", tag);
        t->dtype_bytes = all_dtypes[i].bytes;
        return true;
    }
    return false;
}

static ms_status parse_tensor(const cJSON *item, const char *name, bool any, ms_st_tensor *t,
                              ms_error *err) {
    char tn[MS_SAFE_LEN], got[64];
    ms_safe_str(tn, sizeof tn, item->string);
    if (!cJSON_IsObject(item)) {
        ms_json_describe(item, got, sizeof got);
        return invalid(err, name,
                       "tensor %s: expected an object with dtype, shape and "
                       "data_offsets, got %s",
                       tn, got);
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!dt || !sh || !of)
        return invalid(err, name, "tensor %s: missing \"%s\"", tn,
                       !dt   ? "dtype"
                       : !sh ? "shape"
                             : "data_offsets");
    if (!cJSON_IsString(dt)) {
        ms_json_describe(dt, got, sizeof got);
        return invalid(err, name, "tensor %s: dtype: expected a string, got %s", tn, got);
    }
    if (!set_dtype(t, dt->valuestring, any)) {
        ms_json_describe(dt, got, sizeof got);
        if (any)
            return invalid(err, name, "tensor %s: dtype %s is not a safetensors dtype", tn, got);
        return invalid(err, name,
                       "tensor %s: dtype %s is not supported (meshscope reads F32 "
                       "and BF16); convert the checkpoint to one of those",
                       tn, got);
    }
    if (!cJSON_IsArray(sh)) {
        ms_json_describe(sh, got, sizeof got);
        return invalid(err, name, "tensor %s: shape: expected an array, got %s", tn, got);
    }
    int nd = cJSON_GetArraySize(sh);
    if (nd > MS_MAX_DIMS)
        return invalid(err, name, "tensor %s: shape has %d dims; at most %d are supported", tn, nd,
                       MS_MAX_DIMS);
    t->ndim = nd;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        uint64_t v;
        if (!json_uint(x, &v)) {
            ms_json_describe(x, got, sizeof got);
            return invalid(err, name,
                           "tensor %s: shape[%d]: expected a non-negative integer, "
                           "got %s",
                           tn, d, got);
        }
        t->shape[d] = (int64_t)v;
    }
    size_t esize = t->dtype_bytes;
    t->numel = checked_numel(nd, t->shape, esize);
    if (t->numel < 0)
        return invalid(err, name, "tensor %s: shape is too large (its byte size overflows)", tn);
    uint64_t b, e;
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !json_uint(of->child, &b) ||
        !json_uint(of->child->next, &e)) {
        return invalid(err, name,
                       "tensor %s: data_offsets: expected [begin, end] with "
                       "non-negative integers",
                       tn);
    }
    if (e < b)
        return invalid(err, name, "tensor %s: data_offsets [%llu, %llu) end before they begin", tn,
                       (unsigned long long)b, (unsigned long long)e);
    uint64_t want = (uint64_t)t->numel * esize;
    if (e - b != want) {
        char s[96];
        return invalid(err, name,
                       "tensor %s: data_offsets [%llu, %llu) hold %llu bytes but "
                       "shape %s of %s needs %llu",
                       tn, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)(e - b), ms_shape_str(t->shape, nd, s, sizeof s),
                       t->dtype_name, (unsigned long long)want);
    }
    t->begin = b;
    t->end = e;
    return MS_OK;
}

static int cmp_offsets(const void *a, const void *b) {
    const ms_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    const ms_st_tensor *x = *(const ms_st_tensor *const *)a, *y = *(const ms_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static ms_status parse_tree(const cJSON *root, const char *name, bool any, ms_st_file *out,
                            ms_error *err) {
    char a[MS_SAFE_LEN], b[MS_SAFE_LEN];
    if (!cJSON_IsObject(root))
        return invalid(err, name, "header: expected a JSON object at the top level");
    int nchild = cJSON_GetArraySize(root);
    out->tensors = xcalloc((size_t)nchild + 1, sizeof *out->tensors);
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (out->meta_keys) return invalid(err, name, "header: __metadata__ appears twice");
            if (!cJSON_IsObject(it))
                return invalid(err, name, "header: __metadata__ must be an object of strings");
            int nm = cJSON_GetArraySize(it);
            out->meta_keys = xcalloc((size_t)nm + 1, sizeof *out->meta_keys);
            out->meta_values = xcalloc((size_t)nm + 1, sizeof *out->meta_values);
            for (const cJSON *m = it->child; m; m = m->next) {
                if (!cJSON_IsString(m))
                    return invalid(err, name, "header: __metadata__.%s must be a string",
                                   ms_safe_str(a, sizeof a, m->string));
                out->meta_keys[out->nmeta] = xstrdup(m->string);
                out->meta_values[out->nmeta] = xstrdup(m->valuestring);
                out->nmeta++;
            }
            continue;
        }
        ms_st_tensor *t = &out->tensors[out->n];
        MS_CHECK(parse_tensor(it, name, any, t, err));
        t->name = xstrdup(it->string);
        out->n++;
    }
    /* Names: cJSON keeps duplicate keys, so reject them here. */
    out->by_name = xmalloc(((size_t)out->n + 1) * sizeof *out->by_name);
    qsort(out->tensors, (size_t)out->n, sizeof *out->tensors, cmp_offsets);
    for (int i = 0; i < out->n; i++) out->by_name[i] = &out->tensors[i];
    qsort(out->by_name, (size_t)out->n, sizeof *out->by_name, cmp_tensor_name);
    for (int i = 1; i < out->n; i++)
        if (strcmp(out->by_name[i - 1]->name, out->by_name[i]->name) == 0)
            return invalid(err, name, "header: tensor %s appears twice",
                           ms_safe_str(a, sizeof a, out->by_name[i]->name));
    /* Offsets must tile the data section exactly: sorted by begin, each starts where the
     * previous one ended, the first at 0 and the last at the end of the file. */
    uint64_t pos = 0;
    for (int i = 0; i < out->n; i++) {
        const ms_st_tensor *t = &out->tensors[i];
        if (t->begin > pos)
            return invalid(err, name,
                           "data_offsets leave a gap: bytes [%llu, %llu) of the data "
                           "section belong to no tensor (next is %s)",
                           (unsigned long long)pos, (unsigned long long)t->begin,
                           ms_safe_str(a, sizeof a, t->name));
        if (t->begin < pos)
            return invalid(err, name,
                           "data_offsets overlap: %s [%llu, %llu) starts inside %s, which "
                           "ends at %llu",
                           ms_safe_str(a, sizeof a, t->name), (unsigned long long)t->begin,
                           (unsigned long long)t->end,
                           ms_safe_str(b, sizeof b, out->tensors[i - 1].name),
                           (unsigned long long)pos);
        pos = t->end;
    }
    if (pos != out->data_len)
        return invalid(err, name,
                       "the tensors' data is %llu bytes but the data section is %llu "
                       "bytes; the file is %s",
                       (unsigned long long)pos, (unsigned long long)out->data_len,
                       pos > out->data_len ? "truncated" : "padded or corrupt");
    return MS_OK;
}

static ms_status parse_header(const uint8_t *buf, size_t len, uint64_t file_size, const char *name,
                              bool any, ms_st_file *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    if (!name) name = "<memory>";
    if (file_size < 8 || len < 8)
        return invalid(err, name,
                       "the file is %llu bytes, too short for safetensors (it starts "
                       "with an 8-byte header length)",
                       (unsigned long long)(file_size < len ? file_size : len));
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
    if (hl > MS_ST_MAX_HEADER)
        return invalid(err, name,
                       "header length %llu is over the %u-byte limit; the file is "
                       "corrupt or not safetensors",
                       (unsigned long long)hl, MS_ST_MAX_HEADER);
    if (hl > file_size - 8)
        return invalid(err, name,
                       "header length %llu is more than the %llu bytes after it; the "
                       "file is truncated or not safetensors",
                       (unsigned long long)hl, (unsigned long long)(file_size - 8));
    if (hl > len - 8)
        return invalid(err, name, "only %zu of the %llu header bytes were given", len - 8,
                       (unsigned long long)hl);
    const char *h = (const char *)buf + 8;
    if (hl < 2 || h[0] != '{')
        return invalid(err, name, "the header does not start with '{'; not a safetensors file");
    if (memchr(h, '\0', hl))
        return invalid(err, name, "the header contains a NUL byte; the file is corrupt");
    /* cJSON wants the text NUL-terminated to reject trailing garbage (padding spaces are
     * whitespace and allowed). */
    char *text = xmalloc(hl + 1);
    memcpy(text, h, hl);
    text[hl] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, hl + 1, &end, 1);
    ms_status st;
    if (!root) {
        size_t off = end ? (size_t)(end - text) : 0;
        st = invalid(err, name,
                     "the header is not valid JSON (%s at byte %zu of %llu); the file "
                     "is corrupt",
                     ms_json_depth_at(text, off) >= CJSON_NESTING_LIMIT ? "nested too deeply"
                                                                        : "error",
                     off, (unsigned long long)hl);
    } else {
        out->header_len = hl;
        out->data_len = file_size - 8 - hl;
        st = parse_tree(root, name, any, out, err);
    }
    cJSON_Delete(root);
    free(text);
    if (st != MS_OK) {
        ms_safetensors_free(out);
        return st;
    }
    out->path = xstrdup(name);
    return MS_OK;
}

ms_status ms_safetensors_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
                                      const char *name, ms_st_file *out, ms_error *err) {
    return parse_header(buf, len, file_size, name, false, out, err);
}

ms_status ms_safetensors_parse_header_any(const uint8_t *buf, size_t len, uint64_t file_size,
                                          const char *name, ms_st_file *out, ms_error *err) {
    return parse_header(buf, len, file_size, name, true, out, err);
}

ms_status ms_safetensors_read(const char *path, ms_st_file *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    int fd;
    uint64_t size;
    MS_CHECK(ms_open_regular(path, &fd, &size, err)); /* a FIFO or a device: refused, no wait */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return ms_fail(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    uint8_t len8[8] = {0};
    size_t got = fread(len8, 1, 8, f);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)len8[i] << (8 * i);
    ms_status st;
    uint8_t *head = NULL;
    if (got < 8 || size < 8 || hl > MS_ST_MAX_HEADER || hl > size - 8) {
        /* Let the parser word the error from what we have. */
        st = ms_safetensors_parse_header(len8, got, size, path, out, err);
        if (st == MS_OK) st = invalid(err, path, "short read of the header length");
        goto done;
    }
    head = xmalloc(8 + hl);
    memcpy(head, len8, 8);
    if (fread(head + 8, 1, hl, f) != hl) {
        st = ms_fail(err, MS_ERR_IO, "%s: cannot read the %llu-byte header: %s", path,
                     (unsigned long long)hl, ferror(f) ? strerror(errno) : "file shrank");
        goto done;
    }
    MS_CHECK_GOTO(ms_safetensors_parse_header(head, 8 + hl, size, path, out, err), st, done);
    /* The tensors are sorted by offset and tile the data section, so read them in order. */
    enum { CHUNK = 1 << 15 };
    uint16_t *half = NULL;
    char tn[MS_SAFE_LEN];
    for (int i = 0; i < out->n && st == MS_OK; i++) {
        ms_st_tensor *t = &out->tensors[i];
        if (t->numel == 0) continue;
        ms_safe_str(tn, sizeof tn, t->name);
        t->data = malloc((size_t)t->numel * sizeof(float));
        if (!t->data) {
            st = ms_fail(err, MS_ERR_NOMEM, "%s: cannot allocate %lld floats for %s", path,
                         (long long)t->numel, tn);
            break;
        }
        if (t->dtype == MS_F32) {
            if (fread(t->data, sizeof(float), (size_t)t->numel, f) != (size_t)t->numel)
                st = ms_fail(err, MS_ERR_IO, "%s: cannot read tensor %s: %s", path, tn,
                             ferror(f) ? strerror(errno) : "file shrank");
            continue;
        }
        if (!half) half = xmalloc(CHUNK * sizeof *half);
        for (int64_t k = 0; k < t->numel && st == MS_OK; k += CHUNK) {
            size_t m = (size_t)(t->numel - k < CHUNK ? t->numel - k : CHUNK);
            if (fread(half, sizeof *half, m, f) != m) {
                st = ms_fail(err, MS_ERR_IO, "%s: cannot read tensor %s: %s", path, tn,
                             ferror(f) ? strerror(errno) : "file shrank");
                break;
            }
            for (size_t q = 0; q < m; q++) t->data[k + (int64_t)q] = ms_f32_from_bf16(half[q]);
        }
    }
    free(half);
done:
    free(head);
    fclose(f);
    if (st != MS_OK) ms_safetensors_free(out);
    return st;
}

const ms_st_tensor *ms_safetensors_find(const ms_st_file *f, const char *name) {
    size_t lo = 0, hi = (size_t)f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *ms_safetensors_meta(const ms_st_file *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

static int cmp_expect_name(const void *a, const void *b) {
    return strcmp((*(const ms_st_expect *const *)a)->name, (*(const ms_st_expect *const *)b)->name);
}

ms_status ms_safetensors_check(const ms_st_file *f, const ms_st_expect *want, int n,
                               ms_error *err) {
    const char *p = f->path ? f->path : "<memory>";
    char a[128], b[128];
    for (int i = 0; i < n; i++) {
        const ms_st_tensor *t = ms_safetensors_find(f, want[i].name);
        if (!t)
            return ms_fail(err, MS_ERR_INVALID,
                           "checkpoint %s: missing tensor %s, which the model expects with shape "
                           "%s (the file has %d tensors); is it a checkpoint of this model?",
                           p, want[i].name, ms_shape_str(want[i].shape, want[i].ndim, b, sizeof b),
                           f->n);
        bool same = t->ndim == want[i].ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == want[i].shape[d];
        if (!same)
            return ms_fail(err, MS_ERR_INVALID,
                           "checkpoint %s: %s has shape %s, the model expects %s", p, t->name,
                           ms_shape_str(t->shape, t->ndim, a, sizeof a),
                           ms_shape_str(want[i].shape, want[i].ndim, b, sizeof b));
    }
    /* Every expected name is present; anything beyond them is unexpected. */
    const ms_st_expect **sorted = xmalloc(((size_t)n + 1) * sizeof *sorted);
    for (int i = 0; i < n; i++) sorted[i] = &want[i];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_expect_name);
    ms_status st = MS_OK;
    for (int i = 0; i < f->n && st == MS_OK; i++) {
        ms_st_expect key = {.name = f->tensors[i].name};
        const ms_st_expect *kp = &key;
        if (!bsearch(&kp, sorted, (size_t)n, sizeof *sorted, cmp_expect_name))
            st = ms_fail(err, MS_ERR_INVALID,
                         "checkpoint %s: unexpected tensor %s (shape %s), which the model does not "
                         "have; is it a checkpoint of another model config?",
                         p, ms_safe_str(b, sizeof b, f->tensors[i].name),
                         ms_shape_str(f->tensors[i].shape, f->tensors[i].ndim, a, sizeof a));
    }
    free(sorted);
    return st;
}

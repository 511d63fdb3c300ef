/* array_source.c - .npy, .npz and safetensors arrays as a batch source (array_source.h). */
#include "engine/data/array_source.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zip.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/io/fileio.h"
#include "engine/io/safetensors.h"

/* Both formats are little-endian, like every host meshscope targets. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "array_source.c assumes a little-endian host"
#endif

#define MAX_WHOLE        16777216   /* 2^24: the largest run of integers fp32 holds exactly */
#define NPY_MAX_HEADER   (1u << 20) /* numpy itself refuses headers over 10,000 bytes */
#define NPY_MAX_DIGITS   18
#define FEISTEL_ROUNDS   6
#define DEFLATE_MAX_GROW 1100 /* deflate expands at most ~1032x; more is a lie or a bomb */

typedef enum adt { A_F32, A_F64, A_F16, A_BF16, A_I8, A_U8, A_I16, A_I32, A_I64, A_BOOL } adt;

/* The element types read: their size, whether they are whole numbers, and their names in
 * .npy descr (without the byte order) and safetensors. */
static const struct {
    adt t;
    unsigned bytes;
    bool integer;
    const char *npy, *st;
} dts[] = {
    {A_F32, 4, false, "f4", "F32"}, {A_F64, 8, false, "f8", "F64"},
    {A_F16, 2, false, "f2", "F16"}, {A_BF16, 2, false, NULL, "BF16"},
    {A_I8, 1, true, "i1", "I8"},    {A_U8, 1, true, "u1", "U8"},
    {A_I16, 2, true, "i2", "I16"},  {A_I32, 4, true, "i4", "I32"},
    {A_I64, 8, true, "i8", "I64"},  {A_BOOL, 1, true, "b1", "BOOL"},
};
#define NDTS ((int)(sizeof dts / sizeof dts[0]))

typedef struct arr {
    int dt;              /* index into dts */
    const uint8_t *data; /* n samples of row_elems elements, sample-major */
    uint64_t row_elems;
} arr;

typedef struct impl {
    uint8_t *map; /* the file, mapped read-only (NULL once an .npz is unpacked) */
    size_t map_len;
    uint8_t *owned[MS_BATCH_MAX_FIELDS]; /* .npz members, decompressed */
    arr a[MS_BATCH_MAX_FIELDS];
    uint64_t n;      /* samples in the file */
    uint64_t ntrain; /* the training split is samples [0, ntrain) */
} impl;

/* --- the epoch permutation ---------------------------------------------------------------- */

static uint64_t feistel(uint64_t x, int half, uint64_t mask, const uint32_t k[4]) {
    uint64_t l = x >> half, r = x & mask;
    for (uint32_t round = 0; round < FEISTEL_ROUNDS; round++) {
        uint32_t ctr[4] = {(uint32_t)r, round, k[2], k[3]}, key[2] = {k[0], k[1]}, o[4];
        ms_philox4x32_10(ctr, key, o);
        uint64_t t = l ^ ((((uint64_t)o[1] << 32) | o[0]) & mask);
        l = r;
        r = t;
    }
    return (l << half) | r;
}

uint64_t ms_array_perm(uint64_t seed, uint64_t stream, uint64_t epoch, uint64_t n, uint64_t p) {
    if (n <= 1) return 0;
    int bits = 64 - __builtin_clzll(n - 1);
    bits += bits & 1;
    if (bits < 2) bits = 2;
    int half = bits / 2; /* <= 32, so a half fits the 32-bit counter word */
    uint64_t mask = (1ull << half) - 1;
    uint32_t k[4];
    ms_philox_words(seed, stream, epoch, k);
    /* A permutation of [0, 2^bits) (< 4n); walking p's cycle until it lands below n gives a
     * permutation of [0, n), and ends because p itself is below n. */
    uint64_t x = p % n;
    do x = feistel(x, half, mask, k);
    while (x >= n);
    return x;
}

/* --- reading rows ------------------------------------------------------------------------- */

static float f32_from_f16(uint16_t h) {
    int e = (h >> 10) & 0x1f;
    unsigned m = h & 0x3ffu;
    float v = e == 0    ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(m | 0x400u), e - 25);
    return (h & 0x8000u) ? -v : v;
}

/* Element k of an array of type t at p, as a double (exact for every type read). */
static double elem(adt t, const uint8_t *p, uint64_t k) {
    switch (t) {
        case A_F32: {
            float v;
            memcpy(&v, p + 4 * k, 4);
            return v;
        }
        case A_F64: {
            double v;
            memcpy(&v, p + 8 * k, 8);
            return v;
        }
        case A_F16:
        case A_BF16: {
            uint16_t v;
            memcpy(&v, p + 2 * k, 2);
            return t == A_F16 ? f32_from_f16(v) : ms_f32_from_bf16(v);
        }
        case A_I8:
            return (int8_t)p[k];
        case A_U8:
            return p[k];
        case A_BOOL:
            return p[k] != 0;
        case A_I16: {
            int16_t v;
            memcpy(&v, p + 2 * k, 2);
            return v;
        }
        case A_I32: {
            int32_t v;
            memcpy(&v, p + 4 * k, 4);
            return v;
        }
        case A_I64: {
            int64_t v;
            memcpy(&v, p + 8 * k, 8);
            return (double)v;
        }
    }
    return 0;
}

static void convert_row(const arr *a, uint64_t sample, float *out) {
    adt t = dts[a->dt].t;
    const uint8_t *p = a->data + sample * a->row_elems * dts[a->dt].bytes;
    if (t == A_F32) {
        memcpy(out, p, a->row_elems * sizeof(float));
        return;
    }
    for (uint64_t k = 0; k < a->row_elems; k++) out[k] = (float)elem(t, p, k);
}

static const char *split_name(ms_split s) {
    return s == MS_SPLIT_TRAIN ? "training" : s == MS_SPLIT_VAL ? "validation" : "whole";
}

static ms_status array_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                            uint64_t batch, int B, int r0, int nrows, float *const *out,
                            ms_error *err) {
    const impl *im = src->impl;
    const uint64_t n = src->samples[s], begin = s == MS_SPLIT_VAL ? im->ntrain : 0;
    if (eval && batch >= n / (uint64_t)B)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: evaluation batch %llu of %d rows is past the end of the %s split, "
                       "which holds %llu samples (%llu whole batches)",
                       src->name, (unsigned long long)batch, B, split_name(s),
                       (unsigned long long)n, (unsigned long long)(n / (uint64_t)B));
    for (int j = 0; j < nrows; j++) {
        uint64_t r = (uint64_t)(r0 + j), idx;
        if (eval) {
            idx = batch * (uint64_t)B + r;
        } else {
            unsigned __int128 d = (unsigned __int128)batch * (uint64_t)B + r;
            idx = ms_array_perm(seed, MS_ARRAY_STREAM_BASE + (uint64_t)s, (uint64_t)(d / n), n,
                                (uint64_t)(d % n));
        }
        for (int f = 0; f < src->nfields; f++) {
            int64_t numel = ms_batch_field_numel(&src->fields[f]);
            convert_row(&im->a[f], begin + idx, out[f] + (int64_t)j * numel);
        }
    }
    return MS_OK;
}

static void array_close(ms_batch_source *src) {
    impl *im = src->impl;
    if (!im) return;
    if (im->map) munmap(im->map, im->map_len);
    for (int i = 0; i < MS_BATCH_MAX_FIELDS; i++) free(im->owned[i]);
    free(im);
    src->impl = NULL;
}

static const ms_batch_source_vt array_vt = {.read = array_read, .close = array_close};

/* --- fields ------------------------------------------------------------------------------- */

static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, ndim == 1 ? ",)" : ")");
    return buf;
}

/* Adds array `name` (type dt, shape[ndim], data checked to hold it) as the next field. */
static ms_status add_field(ms_batch_source *src, const char *where, const char *name, int dt,
                           int ndim, const int64_t *shape, const uint8_t *data, ms_error *err) {
    impl *im = src->impl;
    char nm[MS_SAFE_LEN], sh[160], other[MS_SAFE_LEN];
    ms_safe_str(nm, sizeof nm, name);
    if (src->nfields == MS_BATCH_MAX_FIELDS)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: array %s is one too many: a source holds at most %d arrays (fields)",
                       where, nm, MS_BATCH_MAX_FIELDS);
    size_t len = strlen(name);
    if (len == 0 || len >= MS_BATCH_NAME_MAX)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: array name \"%s\" is %zu bytes; a field name needs 1 to %d bytes",
                       where, nm, len, MS_BATCH_NAME_MAX - 1);
    if (ms_batch_source_find(src, name) >= 0)
        return ms_fail(err, MS_ERR_INVALID, "%s: array %s appears twice", where, nm);
    if (ndim == 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: array %s is 0-d (a single value), so it has no sample dim; store one "
                       "value per sample, shape (N,)",
                       where, nm);
    if (ndim - 1 > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: array %s has %d dims; a sample may have at most %d (plus the sample "
                       "dim)",
                       where, nm, ndim, MS_MAX_DIMS);
    shape_str(shape, ndim, sh, sizeof sh);
    if (shape[0] == 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: array %s has zero samples (shape %s); the first dim counts samples",
                       where, nm, sh);
    ms_batch_field *f = &src->fields[src->nfields];
    for (int d = 1; d < ndim; d++) {
        if (shape[d] <= 0 || shape[d] > INT_MAX)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: array %s has shape %s; each dim of a sample must be in "
                           "[1, %d]",
                           where, nm, sh, INT_MAX);
        f->shape[d - 1] = (int)shape[d];
    }
    if (src->nfields > 0 && (uint64_t)shape[0] != im->n)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the label count does not match: array %s has %llu samples (its first "
                       "dim) but array %s has %llu; every array needs one entry per sample",
                       where, nm, (unsigned long long)shape[0],
                       ms_safe_str(other, sizeof other, src->fields[0].name),
                       (unsigned long long)im->n);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->ndim = ndim - 1;
    f->integer = dts[dt].integer;
    im->a[src->nfields] =
        (arr){.dt = dt, .data = data, .row_elems = (uint64_t)ms_batch_field_numel(f)};
    im->n = (uint64_t)shape[0];
    src->nfields++;
    return MS_OK;
}

/* Integer fields: every value within 2^24, so fp32 holds it exactly. */
static ms_status check_whole(const ms_batch_source *src, ms_error *err) {
    const impl *im = src->impl;
    for (int f = 0; f < src->nfields; f++) {
        const arr *a = &im->a[f];
        adt t = dts[a->dt].t;
        if (t != A_I32 && t != A_I64) continue; /* narrower types always fit */
        uint64_t total = im->n * a->row_elems;
        for (uint64_t k = 0; k < total; k++) {
            double v = elem(t, a->data, k);
            if (v > MAX_WHOLE || v < -MAX_WHOLE) {
                char nm[MS_SAFE_LEN];
                return ms_fail(err, MS_ERR_INVALID,
                               "%s: array %s holds %.0f (sample %llu), beyond 2^24 = %d in "
                               "magnitude: fp32 cannot hold it exactly; remap the values (ids, "
                               "labels) to a smaller range",
                               src->name, ms_safe_str(nm, sizeof nm, src->fields[f].name), v,
                               (unsigned long long)(k / a->row_elems), MAX_WHOLE);
            }
        }
    }
    return MS_OK;
}

/* --- .npy --------------------------------------------------------------------------------- */

typedef struct npy {
    int dt;
    int ndim;
    int64_t shape[MS_MAX_DIMS + 2];
    const uint8_t *data;
} npy;

typedef struct lex {
    const char *p, *begin, *end;
    const char *where; /* for messages */
    ms_error *err;
} lex;

static ms_status lex_fail(lex *x, const char *what) {
    return ms_fail(x->err, MS_ERR_INVALID,
                   "%s: the .npy header is not a valid dict: %s at byte %d of the header", x->where,
                   what, (int)(x->p - x->begin));
}

static void skip_ws(lex *x) {
    while (x->p < x->end && (*x->p == ' ' || *x->p == '\t' || *x->p == '\n' || *x->p == '\r'))
        x->p++;
}

static bool eat(lex *x, char c) {
    skip_ws(x);
    if (x->p < x->end && *x->p == c) {
        x->p++;
        return true;
    }
    return false;
}

/* A quoted string of printable characters without escapes, up to cap - 1 bytes. */
static ms_status lex_str(lex *x, char *out, size_t cap) {
    skip_ws(x);
    if (x->p >= x->end || (*x->p != '\'' && *x->p != '"')) return lex_fail(x, "expected a string");
    char q = *x->p++;
    size_t n = 0;
    while (x->p < x->end && *x->p != q) {
        if (*x->p < 0x20 || *x->p > 0x7e || *x->p == '\\' || n + 1 >= cap)
            return lex_fail(x, "a string that is too long or holds escapes");
        out[n++] = *x->p++;
    }
    if (x->p >= x->end) return lex_fail(x, "an unterminated string");
    x->p++;
    out[n] = '\0';
    return MS_OK;
}

static ms_status lex_bool(lex *x, bool *out) {
    skip_ws(x);
    size_t left = (size_t)(x->end - x->p);
    if (left >= 4 && !memcmp(x->p, "True", 4))
        *out = true, x->p += 4;
    else if (left >= 5 && !memcmp(x->p, "False", 5))
        *out = false, x->p += 5;
    else
        return lex_fail(x, "expected True or False");
    return MS_OK;
}

/* A tuple of non-negative integers: (), (3,), (3, 4), (3, 4,). */
static ms_status lex_shape(lex *x, npy *a) {
    if (!eat(x, '(')) return lex_fail(x, "expected a shape tuple");
    a->ndim = 0;
    for (;;) {
        if (eat(x, ')')) return MS_OK;
        if (a->ndim == MS_MAX_DIMS + 1)
            return ms_fail(x->err, MS_ERR_INVALID,
                           "%s: the shape has more than %d dims; a sample may have at most %d",
                           x->where, MS_MAX_DIMS + 1, MS_MAX_DIMS);
        skip_ws(x);
        int64_t v = 0;
        int nd = 0;
        for (; x->p < x->end && *x->p >= '0' && *x->p <= '9'; x->p++, nd++) {
            if (nd == NPY_MAX_DIGITS) return lex_fail(x, "a dim with too many digits");
            v = v * 10 + (*x->p - '0');
        }
        if (nd == 0) return lex_fail(x, "expected a non-negative integer in the shape");
        a->shape[a->ndim++] = v;
        if (!eat(x, ',')) {
            if (eat(x, ')')) return MS_OK;
            return lex_fail(x, "expected ',' or ')' in the shape");
        }
    }
}

static const char *kind_word(char k) {
    switch (k) {
        case 'c':
            return "complex";
        case 'O':
            return "Python objects";
        case 'U':
        case 'S':
        case 'a':
            return "strings";
        case 'M':
        case 'm':
            return "dates and times";
        case 'V':
            return "raw or structured records";
        case 'u':
            return "unsigned integers wider than 8 bits";
        default:
            return "an unknown kind";
    }
}

/* The dtype of a descr such as '<f4' or '|u1'. */
static ms_status npy_dtype(const char *where, const char *descr, int *dt, ms_error *err) {
    char order = descr[0];
    for (int i = 0; order && i < NDTS; i++) {
        if (!dts[i].npy || strcmp(descr + 1, dts[i].npy) != 0) continue;
        if (order == '<' || order == '=' || order == '|' || (order == '>' && dts[i].bytes == 1)) {
            *dt = i;
            return MS_OK;
        }
        if (order == '>')
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: dtype '%s' is big-endian; save it little-endian "
                           "(a.astype('<%s'))",
                           where, descr, dts[i].npy);
    }
    return ms_fail(err, MS_ERR_INVALID,
                   "%s: dtype '%s' (%s) is not supported; the arrays read are float32, float64, "
                   "float16, int8, uint8, int16, int32, int64 and bool",
                   where, descr, order ? kind_word(descr[1]) : "empty");
}

/* The header dict: exactly 'descr', 'fortran_order' and 'shape', once each. */
static ms_status npy_dict(lex *x, npy *a) {
    char key[32], descr[32];
    bool fortran = false;
    int seen = 0;
    if (!eat(x, '{')) return lex_fail(x, "expected '{'");
    while (!eat(x, '}')) {
        MS_CHECK(lex_str(x, key, sizeof key));
        if (!eat(x, ':')) return lex_fail(x, "expected ':'");
        int bit = !strcmp(key, "descr")           ? 1
                  : !strcmp(key, "fortran_order") ? 2
                  : !strcmp(key, "shape")         ? 4
                                                  : 0;
        if (!bit || (seen & bit)) return lex_fail(x, bit ? "a repeated key" : "an unknown key");
        seen |= bit;
        if (bit == 1 && (skip_ws(x), x->p < x->end && *x->p == '['))
            return ms_fail(x->err, MS_ERR_INVALID,
                           "%s: the dtype is structured (a list of named fields), which is not "
                           "supported; save each field as its own array",
                           x->where);
        MS_CHECK(bit == 1   ? lex_str(x, descr, sizeof descr)
                 : bit == 2 ? lex_bool(x, &fortran)
                            : lex_shape(x, a));
        if (!eat(x, ',') && (skip_ws(x), x->p < x->end && *x->p != '}'))
            return lex_fail(x, "expected ',' or '}'");
    }
    skip_ws(x);
    if (x->p != x->end) return lex_fail(x, "text after the dict");
    if (seen != 7)
        return lex_fail(x, !(seen & 1)   ? "no 'descr'"
                           : !(seen & 2) ? "no 'fortran_order'"
                                         : "no 'shape'");
    if (fortran)
        return ms_fail(x->err, MS_ERR_INVALID,
                       "%s: fortran_order is True (a column-major array), which is not "
                       "supported; save a C-ordered copy: np.save(path, np.ascontiguousarray(a))",
                       x->where);
    return npy_dtype(x->where, descr, &a->dt, x->err);
}

/* Parses the .npy in buf[0, len) (a whole file or an .npz member). */
static ms_status parse_npy(const uint8_t *buf, size_t len, const char *where, npy *a,
                           ms_error *err) {
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0)
        return ms_fail(err, MS_ERR_INVALID,
                       len < 10 ? "%s: the .npy file is truncated (%zu bytes, shorter than its "
                                  "preamble)"
                                : "%s: not a .npy array (no \\x93NUMPY magic; %zu bytes)",
                       where, len);
    int major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: .npy format version %d.%d is not supported (1.0, 2.0 and 3.0 are)",
                       where, major, minor);
    size_t pre = major == 1 ? 10 : 12;
    if (len < pre)
        return ms_fail(err, MS_ERR_INVALID, "%s: the .npy file is truncated inside its preamble",
                       where);
    uint32_t hl = buf[8] | (uint32_t)buf[9] << 8;
    if (major > 1) hl |= (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
    if (hl > NPY_MAX_HEADER)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the .npy header length %u is over the %u-byte limit; the file is "
                       "corrupt",
                       where, hl, NPY_MAX_HEADER);
    if (hl > len - pre)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the .npy header is cut: it declares %u bytes but %zu follow; the "
                       "file is truncated",
                       where, hl, len - pre);
    lex x = {.p = (const char *)buf + pre,
             .begin = (const char *)buf + pre,
             .end = (const char *)buf + pre + hl,
             .where = where,
             .err = err};
    MS_CHECK(npy_dict(&x, a));
    /* The size, overflow-checked before it is compared with what the file holds. */
    char sh[160];
    uint64_t bytes = dts[a->dt].bytes, avail = len - pre - hl;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] != 0 && bytes > UINT64_MAX / 2 / (uint64_t)a->shape[d])
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: shape %s is too large: its byte size overflows", where,
                           shape_str(a->shape, a->ndim, sh, sizeof sh));
        bytes *= (uint64_t)a->shape[d];
    }
    if (bytes != avail)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: shape %s of '%s' needs %llu data bytes but the file holds %llu; the "
                       "file is %s",
                       where, shape_str(a->shape, a->ndim, sh, sizeof sh), dts[a->dt].npy,
                       (unsigned long long)bytes, (unsigned long long)avail,
                       bytes > avail ? "truncated" : "corrupt (bytes after the data)");
    a->data = buf + pre + hl;
    return MS_OK;
}

/* --- the three formats -------------------------------------------------------------------- */

static ms_status load_npy(ms_batch_source *src, const char *path, const char *name, ms_error *err) {
    impl *im = src->impl;
    npy a;
    MS_CHECK(parse_npy(im->map, im->map_len, path, &a, err));
    return add_field(src, path, name, a.dt, a.ndim, a.shape, a.data, err);
}

/* Reads member i of the archive whole (its CRC checked) into a new buffer. */
static ms_status unzip_member(zip_t *z, zip_uint64_t i, const zip_stat_t *zs, const char *where,
                              uint8_t **out, ms_error *err) {
    uint8_t *buf = malloc(zs->size ? zs->size : 1);
    if (!buf)
        return ms_fail(err, MS_ERR_NOMEM, "%s: cannot allocate %llu bytes to unpack it", where,
                       (unsigned long long)zs->size);
    *out = buf;
    zip_file_t *zf = zip_fopen_index(z, i, 0);
    if (!zf) return ms_fail(err, MS_ERR_INVALID, "%s: cannot open it: %s", where, zip_strerror(z));
    zip_uint64_t got = 0;
    ms_status st = MS_OK;
    for (;;) {
        uint8_t extra;
        zip_int64_t r = got < zs->size ? zip_fread(zf, buf + got, zs->size - got)
                                       : zip_fread(zf, &extra, 1); /* the end: checks the CRC */
        if (r < 0) {
            st = ms_fail(err, MS_ERR_INVALID, "%s: cannot unpack it: %s; the archive is corrupt",
                         where, zip_file_strerror(zf));
            break;
        }
        if (r == 0 && got < zs->size)
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s: it ends after %llu of its %llu bytes; the archive is corrupt", where,
                         (unsigned long long)got, (unsigned long long)zs->size);
        else if (r > 0 && got == zs->size)
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s: it holds more than the %llu bytes its entry declares; the archive "
                         "is corrupt",
                         where, (unsigned long long)zs->size);
        if (r == 0 || st != MS_OK) break;
        got += (zip_uint64_t)r;
    }
    zip_fclose(zf);
    return st;
}

static ms_status load_member(ms_batch_source *src, const char *path, zip_t *z, zip_uint64_t i,
                             ms_error *err) {
    impl *im = src->impl;
    char where[512], nm[MS_SAFE_LEN], field[MS_BATCH_NAME_MAX + 8];
    zip_stat_t zs;
    zip_stat_init(&zs);
    if (zip_stat_index(z, i, 0, &zs) != 0 || !(zs.valid & ZIP_STAT_NAME) ||
        !(zs.valid & ZIP_STAT_SIZE) || !(zs.valid & ZIP_STAT_COMP_SIZE))
        return ms_fail(err, MS_ERR_INVALID, "%s: cannot read entry %llu of the .npz archive: %s",
                       path, (unsigned long long)i, zip_strerror(z));
    snprintf(where, sizeof where, "%s: member %s", path, ms_safe_str(nm, sizeof nm, zs.name));
    size_t len = strlen(zs.name);
    if (len < 5 || strcmp(zs.name + len - 4, ".npy") != 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s is not a .npy array (np.savez writes NAME.npy members)", where);
    if (len - 4 >= sizeof field)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the array name is %zu bytes; a field name needs 1 to %d bytes", where,
                       len - 4, MS_BATCH_NAME_MAX - 1);
    memcpy(field, zs.name, len - 4);
    field[len - 4] = '\0';
    if ((zs.valid & ZIP_STAT_ENCRYPTION_METHOD) && zs.encryption_method != ZIP_EM_NONE)
        return ms_fail(err, MS_ERR_INVALID, "%s is encrypted, which is not supported", where);
    if (!(zs.valid & ZIP_STAT_COMP_METHOD) ||
        (zs.comp_method != ZIP_CM_STORE && zs.comp_method != ZIP_CM_DEFLATE))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s is compressed with method %d; only stored and deflated members (what "
                       "np.savez and np.savez_compressed write) are read",
                       where, (int)zs.comp_method);
    /* The compressed size is within the file, so the cap cannot overflow. */
    uint64_t comp = zs.comp_size <= im->map_len ? zs.comp_size : UINT64_MAX / DEFLATE_MAX_GROW;
    uint64_t cap = zs.comp_method == ZIP_CM_STORE ? comp : comp * DEFLATE_MAX_GROW + 65536;
    if (zs.comp_size > im->map_len || zs.size > cap || zs.size > SIZE_MAX / 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s declares %llu bytes from %llu compressed bytes in a %zu-byte file; the "
                       "archive is corrupt",
                       where, (unsigned long long)zs.size, (unsigned long long)zs.comp_size,
                       im->map_len);
    uint8_t **buf = &im->owned[src->nfields];
    MS_CHECK(unzip_member(z, i, &zs, where, buf, err));
    npy a;
    MS_CHECK(parse_npy(*buf, zs.size, where, &a, err));
    return add_field(src, path, field, a.dt, a.ndim, a.shape, a.data, err);
}

static ms_status load_npz(ms_batch_source *src, const char *path, ms_error *err) {
    impl *im = src->impl;
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *zsrc = zip_source_buffer_create(im->map, im->map_len, 0, &ze);
    zip_t *z = zsrc ? zip_open_from_source(zsrc, ZIP_RDONLY | ZIP_CHECKCONS, &ze) : NULL;
    if (!z) {
        ms_status st = ms_fail(err, MS_ERR_INVALID,
                               "%s: not a valid .npz (zip) archive: %s; the file is truncated or "
                               "corrupt",
                               path, zip_error_strerror(&ze));
        if (zsrc) zip_source_free(zsrc);
        zip_error_fini(&ze);
        return st;
    }
    zip_error_fini(&ze);
    zip_int64_t n = zip_get_num_entries(z, 0);
    ms_status st = MS_OK;
    if (n <= 0) st = ms_fail(err, MS_ERR_INVALID, "%s: the .npz archive holds no arrays", path);
    for (zip_int64_t i = 0; i < n && st == MS_OK; i++) {
        if (i == MS_BATCH_MAX_FIELDS)
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s: the archive holds %lld arrays; a source holds at most %d (fields)",
                         path, (long long)n, MS_BATCH_MAX_FIELDS);
        else
            st = load_member(src, path, z, (zip_uint64_t)i, err);
    }
    zip_discard(z); /* frees zsrc too */
    /* The members are unpacked: the mapping is no longer needed. */
    munmap(im->map, im->map_len);
    im->map = NULL;
    return st;
}

static ms_status load_safetensors(ms_batch_source *src, const char *path, ms_error *err) {
    impl *im = src->impl;
    ms_st_file f;
    MS_CHECK(ms_safetensors_parse_header_any(im->map, im->map_len, im->map_len, path, &f, err));
    ms_status st = MS_OK;
    if (f.n == 0)
        st = ms_fail(err, MS_ERR_INVALID, "%s: the safetensors file holds no tensors", path);
    const uint8_t *base = im->map + 8 + f.header_len;
    for (int i = 0; i < f.n && st == MS_OK; i++) {
        const ms_st_tensor *t = &f.tensors[i];
        int dt = -1;
        for (int k = 0; k < NDTS; k++)
            if (!strcmp(dts[k].st, t->dtype_name)) dt = k;
        char nm[MS_SAFE_LEN];
        if (dt < 0)
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s: tensor %s: dtype %s is not supported; the tensors read are F32, "
                         "F64, F16, BF16, I8, U8, I16, I32, I64 and BOOL",
                         path, ms_safe_str(nm, sizeof nm, t->name), t->dtype_name);
        else
            st = add_field(src, path, t->name, dt, t->ndim, t->shape, base + t->begin, err);
    }
    ms_safetensors_free(&f);
    return st;
}

/* --- opening ------------------------------------------------------------------------------ */

static ms_status map_file(const char *path, impl *im, ms_error *err) {
    int fd;
    uint64_t size;
    MS_CHECK(ms_open_regular(path, &fd, &size, err));
    if (size == 0) {
        close(fd);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the file is empty; expected a .npy, .npz or safetensors file", path);
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return ms_fail(err, MS_ERR_IO, "%s: cannot map the file: %s", path, strerror(e));
    im->map = m;
    im->map_len = (size_t)size;
    return MS_OK;
}

static ms_status load_any(ms_batch_source *src, const char *path, const char *npy_name,
                          ms_error *err) {
    const impl *im = src->impl;
    const uint8_t *b = im->map;
    size_t n = im->map_len;
    if (!memcmp(b, "\x93NUMPY", n < 6 ? n : 6)) return load_npy(src, path, npy_name, err);
    if (n >= 4 && (!memcmp(b, "PK\x03\x04", 4) || !memcmp(b, "PK\x05\x06", 4)))
        return load_npz(src, path, err);
    if (n >= 9 && b[8] == '{') return load_safetensors(src, path, err);
    char hex[40] = "";
    for (size_t i = 0; i < n && i < 8; i++)
        snprintf(hex + 3 * i, sizeof hex - 3 * i, " %02x", b[i]);
    return ms_fail(err, MS_ERR_INVALID,
                   "%s: unknown format: not a .npy, .npz or safetensors file (it starts with"
                   "%s)",
                   path, hex);
}

static ms_status set_splits(ms_batch_source *src, double vf, ms_error *err) {
    impl *im = src->impl;
    uint64_t nval = (uint64_t)floor((double)im->n * vf);
    if (nval >= im->n)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: val_fraction %g of %llu samples leaves no training sample; lower "
                       "val_fraction",
                       src->name, vf, (unsigned long long)im->n);
    im->ntrain = im->n - nval;
    src->samples[MS_SPLIT_TRAIN] = im->ntrain;
    src->samples[MS_SPLIT_VAL] = nval;
    src->samples[MS_SPLIT_ALL] = im->n;
    return MS_OK;
}

ms_status ms_array_source_open(const char *path, const ms_array_source_opts *opts,
                               ms_batch_source **out, ms_error *err) {
    *out = NULL;
    double vf = opts ? opts->val_fraction : 0;
    const char *npy_name = opts && opts->npy_name ? opts->npy_name : "x";
    if (!path) return ms_fail(err, MS_ERR_INVALID, "the array source needs a file");
    if (!(vf >= 0 && vf < 1))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: val_fraction is %g; it must be in [0, 1) (0.1 keeps the last 10%% "
                       "of the samples for validation)",
                       path, vf);
    ms_batch_source *src = xcalloc(1, sizeof *src);
    src->vt = &array_vt;
    snprintf(src->name, sizeof src->name, "%s", path);
    src->impl = xcalloc(1, sizeof(impl));
    ms_status st = map_file(path, src->impl, err);
    if (st == MS_OK) st = load_any(src, path, npy_name, err);
    if (st == MS_OK) st = check_whole(src, err);
    if (st == MS_OK) st = set_splits(src, vf, err);
    if (st != MS_OK) {
        ms_batch_source_close(src);
        return st;
    }
    *out = src;
    return MS_OK;
}

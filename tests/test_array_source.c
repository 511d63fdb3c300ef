/* test_array_source.c - arrays in .npy, .npz and safetensors files as batch sources: values
 * of every dtype read back through the field conversion, every sample once per epoch, batches
 * as pure functions of (seed, index, rows), data-parallel shards, evaluation order and the
 * validation tail, and (hardening_*) one case per kind of bad file, each asserting the status
 * and that the message names the file and the problem.
 *
 * The files are written here byte by byte (.npy headers, safetensors headers) and with
 * libzip (.npz, stored and deflated), independently of the reader. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>

#include "engine/data/array_source.h"
#include "engine/io/safetensors.h"
#include "tests/testkit.h"

/* --- writing files ------------------------------------------------------------------------ */

static char g_dir[64];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* A .npy image: the header dict text as given (dict), padded with spaces and a newline so the
 * data starts 64-byte aligned, then the data. */
static uint8_t *npy_image(int version, const char *dict, const void *data, size_t nbytes,
                          size_t *len) {
    size_t pre = version == 1 ? 10 : 12, dl = strlen(dict);
    size_t hl = (pre + dl + 1 + 63) / 64 * 64 - pre;
    uint8_t *b = calloc(1, pre + hl + nbytes + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (uint8_t)version;
    b[7] = 0;
    for (size_t i = 0; i < (version == 1 ? 2u : 4u); i++) b[8 + i] = (uint8_t)(hl >> (8 * i));
    memset(b + pre, ' ', hl);
    memcpy(b + pre, dict, dl);
    b[pre + hl - 1] = '\n';
    if (nbytes) memcpy(b + pre + hl, data, nbytes);
    *len = pre + hl + nbytes;
    return b;
}

static void shape_text(const int64_t *shape, int ndim, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "(");
    for (int d = 0; d < ndim; d++)
        k += (size_t)snprintf(out + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    snprintf(out + k, cap - k, ndim == 1 ? ",)" : ")");
}

static uint8_t *npy_array(const char *descr, const int64_t *shape, int ndim, const void *data,
                          size_t nbytes, size_t *len) {
    char dict[512], sh[256];
    shape_text(shape, ndim, sh, sizeof sh);
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             sh);
    return npy_image(1, dict, data, nbytes, len);
}

static void write_npy(const char *path, const char *descr, const int64_t *shape, int ndim,
                      const void *data, size_t nbytes) {
    size_t len;
    uint8_t *b = npy_array(descr, shape, ndim, data, nbytes, &len);
    write_bytes(path, b, len);
    free(b);
}

/* x = 0, 1, ..., n-1 as float32, shape (n,): a field whose value is its sample's index. */
static void write_index_npy(const char *path, int64_t n) {
    float *x = malloc(sizeof *x * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)i;
    write_npy(path, "<f4", &n, 1, x, sizeof *x * (size_t)n);
    free(x);
}

typedef struct member {
    const char *name; /* in the archive, with .npy */
    uint8_t *bytes;
    size_t len;
    bool deflate;
} member;

static void write_npz(const char *path, const member *m, int n) {
    int zerr = 0;
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &zerr);
    assert_non_null(z);
    for (int i = 0; i < n; i++) {
        zip_source_t *s = zip_source_buffer(z, m[i].bytes, m[i].len, 0);
        assert_non_null(s);
        zip_int64_t idx = zip_file_add(z, m[i].name, s, ZIP_FL_ENC_UTF_8);
        assert_true(idx >= 0);
        assert_int_equal(zip_set_file_compression(z, (zip_uint64_t)idx,
                                                  m[i].deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0),
                         0);
    }
    assert_int_equal(zip_close(z), 0);
}

typedef struct st_tensor {
    const char *name, *dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
} st_tensor;

/* A safetensors file by hand (the engine's writer only writes F32 and BF16). */
static void write_st(const char *path, const st_tensor *t, int n) {
    char head[4096];
    size_t k = (size_t)snprintf(head, sizeof head, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        k += (size_t)snprintf(head + k, sizeof head - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                              i ? "," : "", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            k += (size_t)snprintf(head + k, sizeof head - k, "%s%lld", d ? "," : "",
                                  (long long)t[i].shape[d]);
        k += (size_t)snprintf(head + k, sizeof head - k, "],\"data_offsets\":[%llu,%llu]}",
                              (unsigned long long)off, (unsigned long long)(off + t[i].nbytes));
        off += t[i].nbytes;
    }
    k += (size_t)snprintf(head + k, sizeof head - k, "}");
    while ((8 + k) % 8) head[k++] = ' ';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)k >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(head, 1, k, f);
    for (int i = 0; i < n; i++)
        if (t[i].nbytes) fwrite(t[i].data, 1, t[i].nbytes, f);
    fclose(f);
}

/* --- reading ------------------------------------------------------------------------------ */

static ms_batch_source *open_ok(const char *path, double vf, const char *npy_name) {
    ms_array_source_opts o = {.val_fraction = vf, .npy_name = npy_name};
    ms_batch_source *src = NULL;
    ms_error err = {0};
    ms_status st = ms_array_source_open(path, &o, &src, &err);
    if (st != MS_OK) fail_msg("%s", err.msg);
    assert_non_null(src);
    return src;
}

/* Rows [r0, r0 + n) of a batch, every field, into new buffers (out[f]). */
static void read_rows(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                      uint64_t batch, int B, int r0, int n, float **out) {
    for (int f = 0; f < src->nfields; f++)
        out[f] = calloc((size_t)(n ? n : 1) * (size_t)ms_batch_field_numel(&src->fields[f]),
                        sizeof(float));
    ms_error err = {0};
    ms_status st = ms_batch_source_read(src, s, eval, seed, batch, B, r0, n, out, &err);
    if (st != MS_OK) fail_msg("%s", err.msg);
}

static void free_rows(const ms_batch_source *src, float **out) {
    for (int f = 0; f < src->nfields; f++) free(out[f]);
}

/* The sample indices of rows [0, B) of sampled batch i of an index source (field 0 = index). */
static void batch_indices(const ms_batch_source *src, ms_split s, uint64_t seed, uint64_t i, int B,
                          int64_t *idx) {
    float *out[MS_BATCH_MAX_FIELDS];
    read_rows(src, s, false, seed, i, B, 0, B, out);
    for (int r = 0; r < B; r++) idx[r] = (int64_t)out[0][r];
    free_rows(src, out);
}

/* --- values of every dtype ---------------------------------------------------------------- */

enum { NS = 5, NC = 3, NV = NS * NC };

/* The expected floats of element k, by dtype. */
static float want_value(const char *dt, int k) {
    static const float f16v[NV] = {1.0f, -2.0f, 0.5f,        65504.0f, 5.9604645e-8f,
                                   0.0f, -0.0f, 0.33325195f, 1024.0f,  -1.5f,
                                   3.0f, 7.0f,  -65504.0f,   0.25f,    100.0f};
    if (!strcmp(dt, "f2")) return f16v[k];
    if (!strcmp(dt, "b1")) return (float)(k % 3 == 0);
    if (!strcmp(dt, "u1")) return (float)(k * 17 % 256);
    if (!strcmp(dt, "i1")) return (float)(k * 17 % 256 - 128);
    if (!strcmp(dt, "i2")) return (float)(k * 4099 % 65536 - 32768);
    if (!strcmp(dt, "i4") || !strcmp(dt, "i8"))
        return (float)((k % 2 ? -1 : 1) * (k * 1118481 % 16777217));
    if (!strcmp(dt, "f8")) return (float)(k * 0.1 - 0.7);
    return (float)k * 1.25f - 3.0f; /* f4 */
}

/* The bytes of the NV values of dtype dt, into b; returns the element size. */
static size_t encode(const char *dt, uint8_t *b) {
    static const uint16_t f16b[NV] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001,
                                      0x0000, 0x8000, 0x3555, 0x6400, 0xbe00,
                                      0x4200, 0x4700, 0xfbff, 0x3400, 0x5640};
    size_t es = dt[1] - '0';
    for (int k = 0; k < NV; k++) {
        float w = want_value(dt, k);
        if (!strcmp(dt, "f2"))
            memcpy(b + 2 * k, &f16b[k], 2);
        else if (!strcmp(dt, "f4"))
            memcpy(b + 4 * k, &w, 4);
        else if (!strcmp(dt, "f8")) {
            double v = k * 0.1 - 0.7;
            memcpy(b + 8 * k, &v, 8);
        } else if (!strcmp(dt, "i8")) {
            int64_t v = (int64_t)w;
            memcpy(b + 8 * k, &v, 8);
        } else if (!strcmp(dt, "i4")) {
            int32_t v = (int32_t)w;
            memcpy(b + 4 * k, &v, 4);
        } else if (!strcmp(dt, "i2")) {
            int16_t v = (int16_t)w;
            memcpy(b + 2 * k, &v, 2);
        } else if (!strcmp(dt, "i1")) {
            int8_t v = (int8_t)w;
            memcpy(b + k, &v, 1);
        } else {
            b[k] = (uint8_t)w; /* u1, b1 */
        }
    }
    return es;
}

static void check_values(const ms_batch_source *src, int f, const char *dt) {
    float *out[MS_BATCH_MAX_FIELDS];
    read_rows(src, MS_SPLIT_ALL, true, 0, 0, NS, 0, NS, out);
    for (int k = 0; k < NV; k++)
        if (out[f][k] != want_value(dt, k))
            fail_msg("%s: element %d is %.9g, want %.9g", dt, k, out[f][k], want_value(dt, k));
    free_rows(src, out);
    bool integer = dt[0] == 'i' || dt[0] == 'u' || dt[0] == 'b';
    assert_int_equal(src->fields[f].integer, integer);
    assert_int_equal(src->fields[f].ndim, 1);
    assert_int_equal(src->fields[f].shape[0], NC);
    assert_int_equal(src->samples[MS_SPLIT_ALL], NS);
}

static const char *const all_npy[] = {"f4", "f8", "f2", "i1", "u1", "i2", "i4", "i8", "b1"};
#define NDT ((int)(sizeof all_npy / sizeof all_npy[0]))

static void npy_every_dtype(void **state) {
    (void)state;
    for (int i = 0; i < NDT; i++) {
        const char *dt = all_npy[i];
        uint8_t data[NV * 8];
        size_t es = encode(dt, data);
        char descr[8];
        snprintf(descr, sizeof descr, "%c%s", es == 1 ? '|' : '<', dt);
        int64_t shape[2] = {NS, NC};
        const char *path = tmp_path("v.npy");
        write_npy(path, descr, shape, 2, data, es * NV);
        ms_batch_source *src = open_ok(path, 0, NULL);
        assert_int_equal(src->nfields, 1);
        assert_string_equal(src->fields[0].name, "x");
        check_values(src, 0, dt);
        ms_batch_source_close(src);
    }
}

/* Headers of versions 2.0 and 3.0, double quotes, no trailing comma, another key order. */
static void npy_versions(void **state) {
    (void)state;
    uint8_t data[NV * 8];
    size_t es = encode("f4", data);
    const char *dicts[] = {"{\"shape\": (5, 3), \"fortran_order\": False, \"descr\": \"<f4\"}",
                           "{'descr':'<f4','fortran_order':False,'shape':(5,3)}"};
    for (int v = 1; v <= 3; v++) {
        for (int d = 0; d < 2; d++) {
            size_t len;
            uint8_t *b = npy_image(v, dicts[d], data, es * NV, &len);
            const char *path = tmp_path("ver.npy");
            write_bytes(path, b, len);
            free(b);
            ms_batch_source *src = open_ok(path, 0, "feat");
            assert_string_equal(src->fields[0].name, "feat");
            check_values(src, 0, "f4");
            ms_batch_source_close(src);
        }
    }
}

/* Every safetensors dtype read, in two files (a source holds at most 8 fields), plus one file
 * written by the engine's own writer (F32 and BF16). */
static void safetensors_every_dtype(void **state) {
    (void)state;
    static const char *st_names[] = {"F32", "F64", "F16", "I8", "U8", "I16", "I32", "I64", "BOOL"};
    uint8_t data[NDT][NV * 8];
    st_tensor t[NDT];
    for (int i = 0; i < NDT; i++) {
        size_t es = encode(all_npy[i], data[i]);
        t[i] = (st_tensor){.name = all_npy[i],
                           .dtype = st_names[i],
                           .ndim = 2,
                           .shape = {NS, NC},
                           .data = data[i],
                           .nbytes = es * NV};
    }
    for (int part = 0; part < 2; part++) {
        int lo = part ? 5 : 0, n = part ? NDT - 5 : 5;
        const char *path = tmp_path("v.safetensors");
        write_st(path, t + lo, n);
        ms_batch_source *src = open_ok(path, 0, NULL);
        assert_int_equal(src->nfields, n);
        for (int f = 0; f < n; f++) {
            assert_string_equal(src->fields[f].name, all_npy[lo + f]);
            check_values(src, f, all_npy[lo + f]);
        }
        ms_batch_source_close(src);
    }
    /* BF16 through the engine's writer: values that bf16 holds exactly. */
    float x[NV], y[NS];
    for (int k = 0; k < NV; k++) x[k] = (float)k * 0.5f - 2.0f;
    for (int k = 0; k < NS; k++) y[k] = (float)(k * 3);
    ms_st_entry e[2] = {
        {.name = "img", .dtype = MS_BF16, .ndim = 3, .shape = {NS, 1, NC}, .data = x},
        {.name = "label", .dtype = MS_F32, .ndim = 1, .shape = {NS}, .data = y}};
    ms_error err = {0};
    const char *path = tmp_path("w.safetensors");
    assert_int_equal(ms_safetensors_write(path, e, 2, NULL, 0, &err), MS_OK);
    ms_batch_source *src = open_ok(path, 0, NULL);
    assert_int_equal(src->nfields, 2);
    assert_int_equal(src->fields[0].ndim, 2);
    assert_int_equal(src->fields[1].ndim, 0);
    assert_false(src->fields[0].integer);
    float *out[MS_BATCH_MAX_FIELDS];
    read_rows(src, MS_SPLIT_ALL, true, 0, 0, NS, 0, NS, out);
    assert_memory_equal(out[0], x, sizeof x);
    assert_memory_equal(out[1], y, sizeof y);
    free_rows(src, out);
    ms_batch_source_close(src);
}

/* An .npz with a deflated and a stored member; fields in archive order. */
static void npz_stored_and_deflated(void **state) {
    (void)state;
    enum { N = 37 };
    float x[N * 6];
    int64_t y[N];
    uint8_t z[N];
    for (int i = 0; i < N * 6; i++) x[i] = (float)i * 0.25f;
    for (int i = 0; i < N; i++) y[i] = i % 10, z[i] = (uint8_t)(200 + i % 50);
    int64_t sx[3] = {N, 2, 3}, sy[1] = {N};
    member m[3] = {{.name = "images.npy", .deflate = true},
                   {.name = "labels.npy", .deflate = false},
                   {.name = "mask.npy", .deflate = true}};
    m[0].bytes = npy_array("<f4", sx, 3, x, sizeof x, &m[0].len);
    m[1].bytes = npy_array("<i8", sy, 1, y, sizeof y, &m[1].len);
    m[2].bytes = npy_array("|u1", sy, 1, z, sizeof z, &m[2].len);
    const char *path = tmp_path("d.npz");
    write_npz(path, m, 3);
    for (int i = 0; i < 3; i++) free(m[i].bytes);
    ms_batch_source *src = open_ok(path, 0, NULL);
    assert_int_equal(src->nfields, 3);
    assert_string_equal(src->fields[0].name, "images");
    assert_string_equal(src->fields[1].name, "labels");
    assert_string_equal(src->fields[2].name, "mask");
    assert_int_equal(src->fields[0].ndim, 2);
    assert_false(src->fields[0].integer);
    assert_true(src->fields[1].integer);
    float *out[MS_BATCH_MAX_FIELDS];
    read_rows(src, MS_SPLIT_ALL, true, 0, 0, N, 0, N, out);
    assert_memory_equal(out[0], x, sizeof x);
    for (int i = 0; i < N; i++) {
        assert_true(out[1][i] == (float)y[i]);
        assert_true(out[2][i] == (float)z[i]);
    }
    free_rows(src, out);
    ms_batch_source_close(src);
}

/* --- sampling ----------------------------------------------------------------------------- */

/* Every sample once per epoch over 4 epochs, read batch by batch. */
static void check_epochs(int64_t n, int B, uint64_t seed) {
    const char *path = tmp_path("idx.npy");
    write_index_npy(path, n);
    ms_batch_source *src = open_ok(path, 0, NULL);
    const int epochs = 4;
    int64_t total = n * epochs, nb = (total + B - 1) / B;
    int64_t *draw = malloc(sizeof *draw * (size_t)(nb * B));
    for (int64_t i = 0; i < nb; i++)
        batch_indices(src, MS_SPLIT_TRAIN, seed, (uint64_t)i, B, draw + i * B);
    int *seen = malloc(sizeof *seen * (size_t)n);
    for (int e = 0; e < epochs; e++) {
        memset(seen, 0, sizeof *seen * (size_t)n);
        for (int64_t p = 0; p < n; p++) {
            int64_t s = draw[e * n + p];
            assert_true(s >= 0 && s < n);
            seen[s]++;
        }
        for (int64_t s = 0; s < n; s++)
            if (seen[s] != 1)
                fail_msg("n %lld B %d epoch %d: sample %lld drawn %d times", (long long)n, B, e,
                         (long long)s, seen[s]);
    }
    free(seen);
    free(draw);
    ms_batch_source_close(src);
}

static void once_per_epoch(void **state) {
    (void)state;
    const int64_t ns[] = {1, 2, 7, 13, 64, 97, 250};
    const int bs[] = {1, 3, 8, 16};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t j = 0; j < sizeof bs / sizeof bs[0]; j++) check_epochs(ns[i], bs[j], 1234 + i);
}

/* The permutation itself for larger n (primes and powers of two, around the Feistel sizes). */
static void permutation_is_bijection(void **state) {
    (void)state;
    const uint64_t ns[] = {3, 4, 5, 1024, 1025, 65537, 100003};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        uint64_t n = ns[i];
        uint8_t *seen = calloc(n, 1);
        for (uint64_t p = 0; p < n; p++) {
            uint64_t q = ms_array_perm(77, MS_ARRAY_STREAM_BASE, 5, n, p);
            assert_true(q < n);
            assert_int_equal(seen[q], 0);
            seen[q] = 1;
        }
        free(seen);
    }
}

/* Two opens agree; any rows equal the slice of the whole batch; dp shards concatenate. */
static void batches_are_pure(void **state) {
    (void)state;
    enum { N = 53, B = 8 };
    float x[N * 4];
    int32_t y[N];
    for (int i = 0; i < N * 4; i++) x[i] = (float)i;
    for (int i = 0; i < N; i++) y[i] = i * 7 - 100;
    int64_t sx[2] = {N, 4}, sy[1] = {N};
    member m[2] = {{.name = "x.npy", .deflate = true}, {.name = "y.npy"}};
    m[0].bytes = npy_array("<f4", sx, 2, x, sizeof x, &m[0].len);
    m[1].bytes = npy_array("<i4", sy, 1, y, sizeof y, &m[1].len);
    const char *path = tmp_path("pure.npz");
    write_npz(path, m, 2);
    free(m[0].bytes), free(m[1].bytes);
    ms_batch_source *a = open_ok(path, 0.1, NULL), *b = open_ok(path, 0.1, NULL);
    for (uint64_t i = 0; i < 20; i++) {
        float *wa[MS_BATCH_MAX_FIELDS], *wb[MS_BATCH_MAX_FIELDS];
        read_rows(a, MS_SPLIT_TRAIN, false, 9, i * 3, B, 0, B, wa);
        read_rows(b, MS_SPLIT_TRAIN, false, 9, i * 3, B, 0, B, wb);
        assert_memory_equal(wa[0], wb[0], sizeof(float) * B * 4);
        assert_memory_equal(wa[1], wb[1], sizeof(float) * B);
        /* Rows agree across fields: y of the sample whose x row is read. */
        for (int r = 0; r < B; r++) {
            int s = (int)wa[0][r * 4] / 4;
            assert_true(s < (int)a->samples[MS_SPLIT_TRAIN]);
            assert_true(wa[1][r] == (float)(s * 7 - 100));
        }
        for (int r0 = 0; r0 < B; r0++)
            for (int n = 0; r0 + n <= B; n += 3) {
                float *part[MS_BATCH_MAX_FIELDS];
                read_rows(b, MS_SPLIT_TRAIN, false, 9, i * 3, B, r0, n, part);
                if (n) {
                    assert_memory_equal(part[0], wa[0] + r0 * 4, sizeof(float) * (size_t)n * 4);
                    assert_memory_equal(part[1], wa[1] + r0, sizeof(float) * (size_t)n);
                }
                free_rows(b, part);
            }
        for (int dp = 1; dp <= 4; dp *= 2) {
            float cat[B * 4];
            for (int rank = 0; rank < dp; rank++) {
                int r0, nr;
                ms_error err = {0};
                assert_int_equal(ms_dp_rows(B, dp, rank, &r0, &nr, &err), MS_OK);
                float *part[MS_BATCH_MAX_FIELDS];
                read_rows(a, MS_SPLIT_TRAIN, false, 9, i * 3, B, r0, nr, part);
                memcpy(cat + r0 * 4, part[0], sizeof(float) * (size_t)nr * 4);
                free_rows(a, part);
            }
            assert_memory_equal(cat, wa[0], sizeof cat);
        }
        free_rows(a, wa);
        free_rows(b, wb);
    }
    ms_batch_source_close(a);
    ms_batch_source_close(b);
}

static void seeds_and_epochs_differ(void **state) {
    (void)state;
    enum { N = 40 };
    const char *path = tmp_path("seeds.npy");
    write_index_npy(path, N);
    ms_batch_source *src = open_ok(path, 0, NULL);
    int64_t s1[N], s2[N], e1[N];
    batch_indices(src, MS_SPLIT_TRAIN, 1, 0, N, s1);
    batch_indices(src, MS_SPLIT_TRAIN, 2, 0, N, s2);
    batch_indices(src, MS_SPLIT_TRAIN, 1, 1, N, e1); /* batch 1 of N rows is epoch 1 */
    assert_true(memcmp(s1, s2, sizeof s1) != 0);
    assert_true(memcmp(s1, e1, sizeof s1) != 0);
    /* Not the identity either. */
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += s1[i] == i;
    assert_true(fixed < N / 2);
    ms_batch_source_close(src);
}

/* Evaluation reads the split in file order; the validation split is the tail; training draws
 * only from the head. */
static void eval_order_and_val_tail(void **state) {
    (void)state;
    enum { N = 10 };
    const char *path = tmp_path("split.npy");
    write_index_npy(path, N);
    ms_batch_source *src = open_ok(path, 0.25, NULL); /* floor(2.5) = 2 validation samples */
    assert_int_equal(src->samples[MS_SPLIT_TRAIN], 8);
    assert_int_equal(src->samples[MS_SPLIT_VAL], 2);
    assert_int_equal(src->samples[MS_SPLIT_ALL], 10);
    assert_int_equal(ms_batch_source_eval_batches(src, MS_SPLIT_TRAIN, 3), 2);
    int64_t idx[8];
    float *out[MS_BATCH_MAX_FIELDS];
    read_rows(src, MS_SPLIT_VAL, true, 0, 0, 2, 0, 2, out);
    assert_true(out[0][0] == 8.0f && out[0][1] == 9.0f);
    free_rows(src, out);
    for (uint64_t i = 0; i < 3; i++) {
        read_rows(src, MS_SPLIT_TRAIN, true, 0, i, 2, 0, 2, out);
        assert_true(out[0][0] == (float)(2 * i) && out[0][1] == (float)(2 * i + 1));
        free_rows(src, out);
    }
    read_rows(src, MS_SPLIT_ALL, true, 0, 1, 5, 0, 5, out);
    for (int r = 0; r < 5; r++) assert_true(out[0][r] == (float)(5 + r));
    free_rows(src, out);
    for (uint64_t i = 0; i < 5; i++) {
        batch_indices(src, MS_SPLIT_TRAIN, 3, i, 8, idx);
        for (int r = 0; r < 8; r++) assert_true(idx[r] >= 0 && idx[r] < 8);
        batch_indices(src, MS_SPLIT_VAL, 3, i, 2, idx);
        assert_true((idx[0] == 8 && idx[1] == 9) || (idx[0] == 9 && idx[1] == 8));
    }
    /* Past the end: names the batch, the split and the count. */
    float buf[4], *o[1] = {buf};
    ms_error err = {0};
    assert_int_equal(ms_batch_source_read(src, MS_SPLIT_TRAIN, true, 0, 2, 3, 0, 3, o, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "evaluation batch 2 of 3 rows is past the end of the training "
                                    "split, which holds 8 samples"));
    ms_batch_source_close(src);
}

/* --- bad files ---------------------------------------------------------------------------- */

/* Opening `path` fails with `code` and a message naming the file and holding `want`. */
static void expect_fail(const char *path, const ms_array_source_opts *o, ms_status code,
                        const char *want) {
    ms_batch_source *src = (ms_batch_source *)1;
    ms_error err = {0};
    ms_status st = ms_array_source_open(path, o, &src, &err);
    if (st != code) fail_msg("%s: status %d, want %d: %s", path, (int)st, (int)code, err.msg);
    assert_null(src);
    if (!strstr(err.msg, path)) fail_msg("message does not name %s: %s", path, err.msg);
    if (!strstr(err.msg, want)) fail_msg("message lacks \"%s\": %s", want, err.msg);
    assert_null(strchr(err.msg, '\n'));
    if (getenv("MS_TEST_VERBOSE")) print_message("%s\n", err.msg);
}

static uint8_t *small_npy(size_t *len) {
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[2] = {3, 2};
    return npy_array("<f4", s, 2, x, sizeof x, len);
}

static void hardening_missing_and_empty(void **state) {
    (void)state;
    expect_fail(tmp_path("nope.npy"), NULL, MS_ERR_IO, "No such file");
    write_bytes(tmp_path("empty.npy"), "", 0);
    expect_fail(tmp_path("empty.npy"), NULL, MS_ERR_INVALID, "the file is empty");
    expect_fail(g_dir, NULL, MS_ERR_IO, "is a folder, not a regular file");
}

static void hardening_npy_truncated(void **state) {
    (void)state;
    size_t len;
    uint8_t *b = small_npy(&len);
    const char *path = tmp_path("cut.npy");
    write_bytes(path, b, 8); /* inside the preamble */
    expect_fail(path, NULL, MS_ERR_INVALID, "truncated");
    write_bytes(path, b, 40); /* inside the header dict */
    expect_fail(path, NULL, MS_ERR_INVALID, "the .npy header is cut");
    write_bytes(path, b, len - 5); /* data shorter than the shape says */
    expect_fail(path, NULL, MS_ERR_INVALID, "needs 24 data bytes but the file holds 19");
    expect_fail(path, NULL, MS_ERR_INVALID, "truncated");
    free(b);
}

static void hardening_unknown_format(void **state) {
    (void)state;
    const char *path = tmp_path("text.npy");
    write_bytes(path, "hello, world, not arrays", 24);
    expect_fail(path, NULL, MS_ERR_INVALID, "unknown format: not a .npy, .npz or safetensors");
    size_t len;
    uint8_t *b = small_npy(&len);
    b[6] = 4; /* version 4.0 */
    write_bytes(path, b, len);
    expect_fail(path, NULL, MS_ERR_INVALID, "version 4.0 is not supported");
    free(b);
}

static void hardening_npy_bad_dtype(void **state) {
    (void)state;
    const struct {
        const char *descr, *want;
    } cases[] = {{"<c8", "dtype '<c8' (complex)"}, {"|O", "dtype '|O' (Python objects)"},
                 {"<U5", "dtype '<U5' (strings)"}, {">f4", "big-endian"},
                 {"<u4", "dtype '<u4'"},           {"<f16", "not supported"}};
    uint8_t zero[64] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t s[1] = {2};
        size_t es = strcmp(cases[i].descr, "<U5") == 0 ? 20 : 8;
        const char *path = tmp_path("dt.npy");
        write_npy(path, cases[i].descr, s, 1, zero, 2 * es);
        expect_fail(path, NULL, MS_ERR_INVALID, cases[i].want);
    }
    const char *path = tmp_path("struct.npy");
    size_t len;
    uint8_t *b = npy_image(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
                           zero, 8, &len);
    write_bytes(path, b, len);
    free(b);
    expect_fail(path, NULL, MS_ERR_INVALID, "structured");
}

static void hardening_npy_bad_header(void **state) {
    (void)state;
    const struct {
        const char *dict, *want;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", "np.ascontiguousarray"},
        {"{'descr': '<f4', 'fortran_order': False}", "no 'shape'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
         "a repeated key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "an unknown key"},
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", "expected True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "non-negative integer"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", "text after the dict"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1,1)}",
         "more than 9 dims"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (9999999999999999999,)}",
         "too many digits"},
        {"['descr', '<f4']", "expected '{'"},
    };
    float x[2] = {1, 2};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint8_t *b = npy_image(1, cases[i].dict, x, sizeof x, &len);
        const char *path = tmp_path("hdr.npy");
        write_bytes(path, b, len);
        free(b);
        expect_fail(path, NULL, MS_ERR_INVALID, cases[i].want);
    }
    /* A header length beyond the limit (version 2: 4-byte length). */
    size_t len;
    uint8_t *b =
        npy_image(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", x, sizeof x, &len);
    b[11] = 0x40;
    const char *path = tmp_path("hlen.npy");
    write_bytes(path, b, len);
    free(b);
    expect_fail(path, NULL, MS_ERR_INVALID, "over the 1048576-byte limit");
}

static void hardening_huge_dims(void **state) {
    (void)state;
    float x[2] = {1, 2};
    const char *path = tmp_path("huge.npy");
    int64_t s2[2] = {1099511627776, 1099511627776}, s1[1] = {1099511627776};
    write_npy(path, "<f4", s2, 2, x, sizeof x);
    expect_fail(path, NULL, MS_ERR_INVALID, "is too large: its byte size overflows");
    write_npy(path, "<f4", s1, 1, x, sizeof x);
    expect_fail(path, NULL, MS_ERR_INVALID, "needs 4398046511104 data bytes but the file holds 8");
    /* A per-sample dim beyond int. */
    int64_t s3[3] = {0, 3000000000, 0};
    write_npy(path, "<f4", s3, 3, x, 0);
    expect_fail(path, NULL, MS_ERR_INVALID, "zero samples");
    int64_t s4[2] = {1, 0};
    write_npy(path, "<f4", s4, 2, x, 0);
    expect_fail(path, NULL, MS_ERR_INVALID, "each dim of a sample must be in [1,");
    /* safetensors: a shape whose size overflows. */
    st_tensor t = {.name = "x",
                   .dtype = "F32",
                   .ndim = 2,
                   .shape = {1ll << 40, 1ll << 40},
                   .data = x,
                   .nbytes = 8};
    path = tmp_path("huge.safetensors");
    write_st(path, &t, 1);
    expect_fail(path, NULL, MS_ERR_INVALID, "tensor x: shape is too large");
}

static void hardening_zero_samples_and_0d(void **state) {
    (void)state;
    float x[1] = {3};
    int64_t s0[1] = {0};
    const char *path = tmp_path("zero.npy");
    write_npy(path, "<f4", s0, 1, x, 0);
    expect_fail(path, NULL, MS_ERR_INVALID, "array x has zero samples (shape (0,))");
    write_npy(path, "<f4", s0, 0, x, 4);
    expect_fail(path, NULL, MS_ERR_INVALID, "is 0-d (a single value), so it has no sample dim");
    st_tensor t = {.name = "scalar", .dtype = "F32", .ndim = 0, .data = x, .nbytes = 4};
    path = tmp_path("zero.safetensors");
    write_st(path, &t, 1);
    expect_fail(path, NULL, MS_ERR_INVALID, "array scalar is 0-d");
    /* A val_fraction outside [0, 1). */
    path = tmp_path("one.npy");
    write_index_npy(path, 3);
    ms_array_source_opts o = {.val_fraction = 1.0};
    expect_fail(path, &o, MS_ERR_INVALID, "val_fraction is 1; it must be in [0, 1)");
    o.val_fraction = NAN;
    expect_fail(path, &o, MS_ERR_INVALID, "it must be in [0, 1)");
}

static void hardening_label_count(void **state) {
    (void)state;
    float x[10 * 2] = {0};
    int64_t y[9] = {0};
    int64_t sx[2] = {10, 2}, sy[1] = {9};
    member m[2] = {{.name = "x.npy"}, {.name = "y.npy", .deflate = true}};
    m[0].bytes = npy_array("<f4", sx, 2, x, sizeof x, &m[0].len);
    m[1].bytes = npy_array("<i8", sy, 1, y, sizeof y, &m[1].len);
    const char *path = tmp_path("count.npz");
    write_npz(path, m, 2);
    free(m[0].bytes), free(m[1].bytes);
    expect_fail(path, NULL, MS_ERR_INVALID,
                "the label count does not match: array y has 9 samples (its first dim) but array "
                "x has 10");
    st_tensor t[2] = {
        {.name = "a", .dtype = "F32", .ndim = 1, .shape = {4}, .data = x, .nbytes = 16},
        {.name = "b", .dtype = "I64", .ndim = 1, .shape = {2}, .data = y, .nbytes = 16}};
    path = tmp_path("count.safetensors");
    write_st(path, t, 2);
    expect_fail(path, NULL, MS_ERR_INVALID,
                "array b has 2 samples (its first dim) but array a has 4");
}

static void hardening_too_many_fields_and_long_names(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s[1] = {2};
    enum { M = MS_BATCH_MAX_FIELDS + 1 };
    member m[M];
    char names[M][24];
    for (int i = 0; i < M; i++) {
        snprintf(names[i], sizeof names[i], "f%d.npy", i);
        m[i] = (member){.name = names[i]};
        m[i].bytes = npy_array("<f4", s, 1, x, sizeof x, &m[i].len);
    }
    const char *path = tmp_path("many.npz");
    write_npz(path, m, M);
    expect_fail(path, NULL, MS_ERR_INVALID, "the archive holds 9 arrays; a source holds at most 8");
    st_tensor t[M];
    for (int i = 0; i < M; i++) {
        names[i][strlen(names[i]) - 4] = '\0';
        t[i] = (st_tensor){
            .name = names[i], .dtype = "F32", .ndim = 1, .shape = {2}, .data = x, .nbytes = 8};
    }
    path = tmp_path("many.safetensors");
    write_st(path, t, M);
    expect_fail(path, NULL, MS_ERR_INVALID, "is one too many: a source holds at most 8 arrays");
    char longname[200];
    memset(longname, 'n', 100);
    strcpy(longname + 100, ".npy");
    m[0].name = longname;
    path = tmp_path("long.npz");
    write_npz(path, m, 1);
    expect_fail(path, NULL, MS_ERR_INVALID,
                "the array name is 100 bytes; a field name needs 1 to 63");
    longname[100] = '\0';
    t[0].name = longname;
    path = tmp_path("long.safetensors");
    write_st(path, t, 1);
    expect_fail(path, NULL, MS_ERR_INVALID, "is 100 bytes; a field name needs 1 to 63");
    ms_array_source_opts o = {.npy_name = ""};
    path = tmp_path("noname.npy");
    write_npy(path, "<f4", s, 1, x, sizeof x);
    expect_fail(path, &o, MS_ERR_INVALID, "a field name needs 1 to 63 bytes");
    m[0].name = "notes.txt";
    path = tmp_path("txt.npz");
    write_npz(path, m, 1);
    expect_fail(path, NULL, MS_ERR_INVALID, "member notes.txt is not a .npy array");
    for (int i = 0; i < M; i++) free(m[i].bytes);
}

static void hardening_integers_beyond_2_24(void **state) {
    (void)state;
    int64_t y[4] = {1, -16777216, 16777217, 3};
    int64_t s[1] = {4};
    const char *path = tmp_path("big.npy");
    write_npy(path, "<i8", s, 1, y, sizeof y);
    expect_fail(path, NULL, MS_ERR_INVALID, "array x holds 16777217 (sample 2), beyond 2^24");
    int32_t z[4] = {0, 0, 0, -20000000};
    write_npy(path, "<i4", s, 1, z, sizeof z);
    expect_fail(path, NULL, MS_ERR_INVALID, "holds -20000000 (sample 3)");
    st_tensor t = {.name = "ids", .dtype = "I64", .ndim = 1, .shape = {4}, .data = y, .nbytes = 32};
    path = tmp_path("big.safetensors");
    write_st(path, &t, 1);
    expect_fail(path, NULL, MS_ERR_INVALID, "array ids holds 16777217 (sample 2)");
}

static void hardening_safetensors_bad(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    st_tensor t = {.name = "x", .dtype = "F32", .ndim = 1, .shape = {4}, .data = x, .nbytes = 16};
    const char *path = tmp_path("cut.safetensors");
    write_st(path, &t, 1);
    FILE *f = fopen(path, "rb");
    uint8_t buf[512];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(path, buf, len - 4);
    expect_fail(path, NULL, MS_ERR_INVALID, "truncated");
    write_bytes(path, buf, 20); /* inside the header */
    expect_fail(path, NULL, MS_ERR_INVALID, "truncated");
    t.dtype = "C64";
    write_st(path, &t, 1);
    expect_fail(path, NULL, MS_ERR_INVALID, "dtype \"C64\" is not a safetensors dtype");
    t.dtype = "U32";
    write_st(path, &t, 1);
    expect_fail(path, NULL, MS_ERR_INVALID, "dtype U32 is not supported");
    write_bytes(path, "\x08\0\0\0\0\0\0\0{}      ", 16);
    expect_fail(path, NULL, MS_ERR_INVALID, "holds no tensors");
}

/* The archive at path, read back whole into buf; returns its length and sets *data to the
 * offset of the first member's data (after its local header). */
static size_t read_zip(const char *path, uint8_t *buf, size_t cap, size_t *data) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t len = fread(buf, 1, cap, f);
    fclose(f);
    assert_true(len > 30 && len < cap);
    *data = 30 + (buf[26] | (size_t)buf[27] << 8) + (buf[28] | (size_t)buf[29] << 8);
    return len;
}

static void hardening_npz_bad(void **state) {
    (void)state;
    size_t len, data;
    uint8_t buf[4096];
    for (int deflate = 0; deflate < 2; deflate++) {
        member m[1] = {{.name = "x.npy", .deflate = deflate}};
        m[0].bytes = small_npy(&m[0].len);
        const char *path = tmp_path("bad.npz");
        write_npz(path, m, 1);
        free(m[0].bytes);
        len = read_zip(path, buf, sizeof buf, &data);
        write_bytes(path, buf, len - 30); /* the central directory cut */
        expect_fail(path, NULL, MS_ERR_INVALID, "not a valid .npz (zip) archive");
        /* A flipped byte in the member's data: the CRC (or the inflater) refuses it. */
        buf[data + (deflate ? 10 : 100)] ^= 0x55;
        write_bytes(path, buf, len);
        expect_fail(path, NULL, MS_ERR_INVALID, "member x.npy: cannot unpack it");
    }
    const char *path = tmp_path("bad.npz");
    member m[1];
    /* An empty archive. */
    write_bytes(path, "PK\x05\x06\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 22);
    expect_fail(path, NULL, MS_ERR_INVALID, "holds no arrays");
    /* A member whose .npy is cut (a stored member, shorter than its shape). */
    m[0] = (member){.name = "y.npy"};
    m[0].bytes = small_npy(&m[0].len);
    m[0].len -= 4;
    write_npz(path, m, 1);
    free(m[0].bytes);
    expect_fail(path, NULL, MS_ERR_INVALID, "member y.npy: shape (3, 2) of 'f4' needs 24 data");
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ms_test_array_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(npy_every_dtype, setup, teardown),
    cmocka_unit_test_setup_teardown(npy_versions, setup, teardown),
    cmocka_unit_test_setup_teardown(safetensors_every_dtype, setup, teardown),
    cmocka_unit_test_setup_teardown(npz_stored_and_deflated, setup, teardown),
    cmocka_unit_test_setup_teardown(once_per_epoch, setup, teardown),
    cmocka_unit_test(permutation_is_bijection),
    cmocka_unit_test_setup_teardown(batches_are_pure, setup, teardown),
    cmocka_unit_test_setup_teardown(seeds_and_epochs_differ, setup, teardown),
    cmocka_unit_test_setup_teardown(eval_order_and_val_tail, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_missing_and_empty, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_npy_truncated, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_unknown_format, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_npy_bad_dtype, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_npy_bad_header, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_huge_dims, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_zero_samples_and_0d, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_label_count, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_too_many_fields_and_long_names, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_integers_beyond_2_24, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_safetensors_bad, setup, teardown),
    cmocka_unit_test_setup_teardown(hardening_npz_bad, setup, teardown),
};

MT_MAIN("array_source", tests)

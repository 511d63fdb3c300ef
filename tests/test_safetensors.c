/* test_safetensors.c - checkpoint files: byte-exact layout, F32/BF16 round trips, durable
 * writes that leave the old file intact on failure (and no temporary file on a signal, with
 * the mode the umask gives), every reader validation error with names from the file shown
 * escaped, and the model-shape check. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/io/fileio.h"
#include "engine/io/safetensors.h"
#include "tests/testkit.h"

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Files in dir whose name contains ".tmp." (leftover temporaries). */
static int count_temps(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static void rm_rf(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Parses `header` as the JSON of a file whose data section is data_len bytes. */
static ms_status parse_hdr(const char *header, uint64_t data_len, const char *name, ms_st_file *f,
                           ms_error *err) {
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    ms_status st = ms_safetensors_parse_header(buf, 8 + hl, 8 + hl + data_len, name, f, err);
    free(buf);
    return st;
}

static void expect_bad(const char *header, uint64_t data_len, const char *want) {
    ms_st_file f;
    ms_error err = {0};
    ms_status st = parse_hdr(header, data_len, "bad.safetensors", &f, &err);
    if (st != MS_ERR_INVALID) fail_msg("accepted %s (status %d)", header, st);
    if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
    assert_int_equal(strncmp(err.msg, "bad.safetensors: ", 17), 0);
    assert_int_equal(f.n, 0);
    ms_safetensors_free(&f);
}

static void exact_layout(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/tiny.safetensors", dir);
    const float a[2] = {1.0f, -2.5f};
    ms_st_entry e[1] = {{.name = "a", .dtype = MS_F32, .ndim = 1, .shape = {2}, .data = a}};
    ms_st_kv meta[1] = {{"format", "pt"}};
    ms_error err = {0};
    if (ms_safetensors_write(path, e, 1, meta, 1, &err) != MS_OK) fail_msg("%s", err.msg);
    size_t n;
    uint8_t *b = slurp(path, &n);
    /* 85 bytes of JSON padded with spaces to 88: 8 + 88 is a multiple of 8. */
    const char *json =
        "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
        "\"data_offsets\":[0,8]}}";
    size_t jl = strlen(json);
    assert_int_equal(jl, 85);
    assert_int_equal(le64(b), 88);
    assert_int_equal(n, 8 + 88 + 8);
    assert_memory_equal(b + 8, json, jl);
    assert_memory_equal(b + 8 + jl, "   ", 3);
    assert_memory_equal(b + 96, a, 8);
    free(b);
    unlink(path);
    rm_rf(dir);
}

static void roundtrip(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    enum { R = 37, C = 53 };
    float *w = malloc(sizeof(float) * R * C), *bias = malloc(sizeof(float) * C);
    for (int i = 0; i < R * C; i++) w[i] = sinf((float)i * 0.37f) * 3.0f + (float)i * 1e-3f;
    for (int i = 0; i < C; i++) bias[i] = -0.001f * (float)i;
    const float scalar = 3.14159265f;
    float empty_dummy = 0;
    ms_st_entry e[5] = {
        {.name = "h.0.attn.c_attn.weight", .dtype = MS_F32, .ndim = 2, .shape = {R, C}, .data = w},
        {.name = "h.0.attn.c_attn.bias", .dtype = MS_BF16, .ndim = 1, .shape = {C}, .data = bias},
        {.name = "w.bf16", .dtype = MS_BF16, .ndim = 2, .shape = {R, C}, .data = w},
        {.name = "scalar \"quoted\"\\", .dtype = MS_F32, .ndim = 0, .data = &scalar},
        {.name = "empty", .dtype = MS_F32, .ndim = 2, .shape = {0, 5}, .data = &empty_dummy},
    };
    ms_st_kv meta[2] = {{"step", "1200"}, {"note", "line\nbreak \"q\""}};
    ms_error err = {0};
    if (ms_safetensors_write(path, e, 5, meta, 2, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(count_temps(dir), 0);

    /* Bytes: the data section is the tensors back to back in the order given, F32 as is,
     * BF16 as the rounded upper halves. */
    size_t n;
    uint8_t *b = slurp(path, &n);
    uint64_t hl = le64(b);
    assert_int_equal((8 + hl) % 8, 0);
    assert_int_equal(b[8], '{');
    const uint8_t *data = b + 8 + hl;
    size_t off = 0;
    assert_memory_equal(data + off, w, sizeof(float) * R * C);
    off += sizeof(float) * R * C;
    for (int i = 0; i < C; i++, off += 2) {
        uint16_t h = (uint16_t)(data[off] | data[off + 1] << 8);
        assert_int_equal(h, ms_bf16_from_f32(bias[i]));
    }
    for (int i = 0; i < R * C; i++, off += 2) {
        uint16_t h = (uint16_t)(data[off] | data[off + 1] << 8);
        assert_int_equal(h, ms_bf16_from_f32(w[i]));
    }
    assert_memory_equal(data + off, &scalar, 4);
    off += 4;
    assert_int_equal(8 + hl + off, n);
    free(b);

    /* Values back. */
    ms_st_file f;
    if (ms_safetensors_read(path, &f, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(f.n, 5);
    assert_string_equal(f.path, path);
    const ms_st_tensor *t = ms_safetensors_find(&f, "h.0.attn.c_attn.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, MS_F32);
    assert_true(t->ndim == 2 && t->shape[0] == R && t->shape[1] == C && t->numel == R * C);
    assert_memory_equal(t->data, w, sizeof(float) * R * C);
    t = ms_safetensors_find(&f, "w.bf16");
    assert_non_null(t);
    assert_int_equal(t->dtype, MS_BF16);
    for (int i = 0; i < R * C; i++) {
        assert_true(t->data[i] == ms_f32_from_bf16(ms_bf16_from_f32(w[i])));
        assert_true(fabsf(t->data[i] - w[i]) <= fabsf(w[i]) * 0x1p-8f);
    }
    t = ms_safetensors_find(&f, "h.0.attn.c_attn.bias");
    assert_non_null(t);
    for (int i = 0; i < C; i++)
        assert_true(t->data[i] == ms_f32_from_bf16(ms_bf16_from_f32(bias[i])));
    t = ms_safetensors_find(&f, "scalar \"quoted\"\\");
    assert_non_null(t);
    assert_true(t->ndim == 0 && t->numel == 1 && t->data[0] == scalar);
    t = ms_safetensors_find(&f, "empty");
    assert_non_null(t);
    assert_true(t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 5 && t->numel == 0);
    assert_null(t->data);
    assert_null(ms_safetensors_find(&f, "nope"));
    assert_string_equal(ms_safetensors_meta(&f, "step"), "1200");
    assert_string_equal(ms_safetensors_meta(&f, "note"), "line\nbreak \"q\"");
    assert_null(ms_safetensors_meta(&f, "absent"));
    ms_safetensors_free(&f);
    ms_safetensors_free(&f); /* twice is fine */

    /* Zero tensors is a valid (empty) checkpoint. */
    if (ms_safetensors_write(path, NULL, 0, NULL, 0, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(ms_safetensors_read(path, &f, &err), MS_OK);
    assert_int_equal(f.n, 0);
    ms_safetensors_free(&f);
    free(w);
    free(bias);
    rm_rf(dir);
}

/* Files written by other tools order keys differently and lay tensors out in any order. */
static void foreign_order(void **state) {
    (void)state;
    const char *h = "{\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]},\n"
                    " \"a\":{\"shape\":[2],\"data_offsets\":[0,8],\"dtype\":\"F32\"},"
                    "\"__metadata__\":{\"format\":\"pt\"}}      ";
    ms_st_file f;
    ms_error err = {0};
    if (parse_hdr(h, 12, "x", &f, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(f.n, 2);
    /* tensors[] is in offset order. */
    assert_string_equal(f.tensors[0].name, "a");
    assert_string_equal(f.tensors[1].name, "b");
    assert_true(f.tensors[1].begin == 8 && f.tensors[1].end == 12);
    assert_string_equal(ms_safetensors_meta(&f, "format"), "pt");
    assert_null(f.tensors[0].data);
    ms_safetensors_free(&f);
}

static void reader_errors(void **state) {
    (void)state;
    ms_st_file f;
    ms_error err = {0};
    const uint8_t tiny[5] = {1, 2, 3, 4, 5};
    assert_int_equal(ms_safetensors_parse_header(tiny, 5, 5, "t", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "t: the file is 5 bytes, too short for safetensors"));
    uint8_t huge[16] = {0};
    huge[4] = 1; /* 2^32 */
    assert_int_equal(ms_safetensors_parse_header(huge, 16, 16, "t", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "header length 4294967296 is over the 100000000-byte limit"));
    uint8_t longer[16] = {100};
    assert_int_equal(ms_safetensors_parse_header(longer, 16, 16, "t", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "header length 100 is more than the 8 bytes after it"));

    const char *A = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char h[512];
    expect_bad("[1, 2]                  ", 0, "does not start with '{'");
    expect_bad("{\"a\": {\"dtype\": \"F32\",", 0, "the header is not valid JSON");
    expect_bad("{} x", 0, "not valid JSON");
    expect_bad("{\"a\":1}", 0, "tensor a: expected an object with dtype, shape and data_offsets");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor a: missing \"dtype\"");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
               "tensor a: dtype \"F16\" is not supported (meshscope reads F32 and BF16)");
    expect_bad("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
               "dtype: expected a string, got 7");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "tensor a: shape[0]: expected a non-negative integer, got -1");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
               "shape[0]: expected a non-negative integer, got 1.5");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4,
               "shape: expected an array, got 3");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}",
               4, "shape is too large (its byte size overflows)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               4, "shape has 9 dims; at most 8 are supported");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
               "tensor a: data_offsets [0, 4) hold 4 bytes but shape [2] of F32 needs 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
               "end before they begin");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
               "data_offsets: expected [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8,
               "data_offsets: expected [begin, end]");
    /* Tiling of the data section. */
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
             A);
    expect_bad(h, 16,
               "data_offsets leave a gap: bytes [8, 12) of the data section belong to no "
               "tensor (next is b)");
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", A);
    expect_bad(h, 8, "data_offsets overlap: b [4, 8) starts inside a, which ends at 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "gap: bytes [0, 4)");
    snprintf(h, sizeof h, "{%s}", A);
    expect_bad(h, 12,
               "the tensors' data is 8 bytes but the data section is 12 bytes; the file is "
               "padded or corrupt");
    expect_bad(h, 4,
               "the tensors' data is 8 bytes but the data section is 4 bytes; the file is "
               "truncated");
    snprintf(h, sizeof h, "{%s,%s}", A, A);
    expect_bad(h, 8, "header: tensor a appears twice");
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":1},%s}", A);
    expect_bad(h, 8, "header: __metadata__.k must be a string");
    snprintf(h, sizeof h, "{\"__metadata__\":[],%s}", A);
    expect_bad(h, 8, "__metadata__ must be an object of strings");
    /* Deep nesting is a JSON error, not a stack overflow. */
    char *deep = malloc(6002);
    deep[0] = '{';
    memcpy(deep + 1, "\"a\":", 4);
    memset(deep + 5, '[', 5996);
    deep[6001] = '\0';
    expect_bad(deep, 0, "not valid JSON (nested too deeply at byte");
    free(deep);
    /* A NUL inside the header. */
    uint8_t nul[8 + 8] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' ', ' ', ' ', ' ', ' '};
    assert_int_equal(ms_safetensors_parse_header(nul, 16, 16, "t", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "NUL byte"));
    /* Fewer header bytes given than the header length (a caller reading in pieces). */
    uint8_t part[12] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    assert_int_equal(ms_safetensors_parse_header(part, 12, 64, "t", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "only 4 of the 8 header bytes were given"));
}

static void reader_files(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    ms_st_file f;
    ms_error err = {0};
    assert_int_equal(ms_safetensors_read(path, &f, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "No such file or directory"));
    assert_int_equal(ms_safetensors_read(dir, &f, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "not a regular file"));
    /* A truncated file: every byte count below the full one fails cleanly. */
    const float v[4] = {1, 2, 3, 4};
    ms_st_entry e[1] = {{.name = "v", .dtype = MS_F32, .ndim = 1, .shape = {4}, .data = v}};
    assert_int_equal(ms_safetensors_write(path, e, 1, NULL, 0, &err), MS_OK);
    size_t n;
    uint8_t *b = slurp(path, &n);
    for (size_t cut = 0; cut < n; cut++) {
        FILE *fw = fopen(path, "wb");
        fwrite(b, 1, cut, fw);
        fclose(fw);
        assert_int_equal(ms_safetensors_read(path, &f, &err), MS_ERR_INVALID);
        assert_non_null(strstr(err.msg, path));
        assert_null(f.tensors);
    }
    FILE *fw = fopen(path, "wb");
    fwrite(b, 1, n - 1, fw);
    fclose(fw);
    assert_int_equal(ms_safetensors_read(path, &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "truncated"));
    free(b);
    rm_rf(dir);
}

static void durable_write(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    enum { M = 4096 };
    float *v1 = malloc(sizeof(float) * M), *v2 = malloc(sizeof(float) * M);
    for (int i = 0; i < M; i++) {
        v1[i] = (float)i;
        v2[i] = -(float)i;
    }
    ms_st_entry e[1] = {{.name = "w", .dtype = MS_F32, .ndim = 1, .shape = {M}, .data = v1}};
    ms_error err = {0};
    assert_int_equal(ms_safetensors_write(path, e, 1, NULL, 0, &err), MS_OK);
    size_t n1;
    uint8_t *good = slurp(path, &n1);

    /* Each injected failure: MS_ERR_IO naming the path and the errno text, the old file
     * byte-identical, no temporary left behind. */
    e[0].data = v2;
    const ms_io_fault faults[4] = {MS_IO_FAULT_WRITE, MS_IO_FAULT_WRITE, MS_IO_FAULT_FSYNC,
                                   MS_IO_FAULT_RENAME};
    const size_t after[4] = {0, 5000, 0, 0};
    const char *want[4] = {"No space left on device", "No space left on device",
                           "fsync failed: Input/output error", "cannot rename"};
    for (int k = 0; k < 4; k++) {
        ms_io_inject_fault(faults[k], after[k]);
        assert_int_equal(ms_safetensors_write(path, e, 1, NULL, 0, &err), MS_ERR_IO);
        if (!strstr(err.msg, path) || !strstr(err.msg, want[k]))
            fail_msg("fault %d: '%s'", k, err.msg);
        size_t n;
        uint8_t *now = slurp(path, &n);
        assert_int_equal(n, n1);
        assert_memory_equal(now, good, n1);
        free(now);
        assert_int_equal(count_temps(dir), 0);
        ms_st_file f;
        assert_int_equal(ms_safetensors_read(path, &f, &err), MS_OK);
        assert_true(f.tensors[0].data[5] == 5.0f);
        ms_safetensors_free(&f);
    }
    /* The fault is one-shot: the next write succeeds and replaces the file. */
    assert_int_equal(ms_safetensors_write(path, e, 1, NULL, 0, &err), MS_OK);
    ms_st_file f;
    assert_int_equal(ms_safetensors_read(path, &f, &err), MS_OK);
    assert_true(f.tensors[0].data[5] == -5.0f);
    ms_safetensors_free(&f);
    assert_int_equal(count_temps(dir), 0);

    /* A folder that does not exist. */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/dir/ckpt.safetensors", dir);
    assert_int_equal(ms_safetensors_write(bad, e, 1, NULL, 0, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, bad));
    assert_non_null(strstr(err.msg, "cannot create a temporary file in folder"));
    assert_non_null(strstr(err.msg, "No such file or directory"));
    /* A path naming a folder. */
    snprintf(bad, sizeof bad, "%s/", dir);
    assert_int_equal(ms_safetensors_write(bad, e, 1, NULL, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "names a folder"));
    /* Writing over a folder fails at the rename and leaves the folder. */
    char sub[160];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(ms_safetensors_write(sub, e, 1, NULL, 0, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot rename the temporary file into place"));
    assert_int_equal(count_temps(dir), 0);
    free(good);
    free(v1);
    free(v2);
    rm_rf(dir);
}

static void writer_errors(void **state) {
    (void)state;
    const float v[2] = {1, 2};
    ms_error err = {0};
    ms_st_entry e[2] = {{.name = "a", .dtype = MS_F32, .ndim = 1, .shape = {2}, .data = v},
                        {.name = "a", .dtype = MS_F32, .ndim = 1, .shape = {2}, .data = v}};
    const char *p = "/tmp/ms_test_st_never_written.safetensors";
    assert_int_equal(ms_safetensors_write(p, e, 2, NULL, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "two tensors are named a"));
    e[1].name = "__metadata__";
    assert_int_equal(ms_safetensors_write(p, e, 2, NULL, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "reserved"));
    e[1].name = "b";
    e[1].data = NULL;
    assert_int_equal(ms_safetensors_write(p, e, 2, NULL, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tensor b: no data given"));
    e[1].data = v;
    e[1].shape[0] = -2;
    assert_int_equal(ms_safetensors_write(p, e, 2, NULL, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "negative dim"));
    e[1].shape[0] = 2;
    ms_st_kv meta[2] = {{"k", "1"}, {"k", "2"}};
    assert_int_equal(ms_safetensors_write(p, e, 2, meta, 2, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "metadata key k appears twice"));
    assert_int_equal(access(p, F_OK), -1);
}

static void shape_check(void **state) {
    (void)state;
    /* A GPT-2-sized header without its data: the check needs only names and shapes. */
    const char *h = "{\"h.0.attn.c_attn.weight\":{\"dtype\":\"BF16\",\"shape\":[768,2304],"
                    "\"data_offsets\":[0,3538944]},"
                    "\"h.0.attn.c_attn.bias\":{\"dtype\":\"F32\",\"shape\":[2304],"
                    "\"data_offsets\":[3538944,3548160]}}";
    ms_st_file f;
    ms_error err = {0};
    if (parse_hdr(h, 3548160, "x.safetensors", &f, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_st_expect want[3] = {{"h.0.attn.c_attn.weight", 2, {768, 2304}},
                            {"h.0.attn.c_attn.bias", 1, {2304}},
                            {"h.0.ln_1.weight", 1, {768}}};
    assert_int_equal(ms_safetensors_check(&f, want, 2, &err), MS_OK);
    assert_int_equal(ms_safetensors_check(&f, want, 3, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "checkpoint x.safetensors: missing tensor h.0.ln_1.weight, "
                                    "which the model expects with shape [768]"));
    want[0].shape[1] = 1536;
    assert_int_equal(ms_safetensors_check(&f, want, 2, &err), MS_ERR_INVALID);
    assert_string_equal(err.msg, "checkpoint x.safetensors: h.0.attn.c_attn.weight has shape "
                                 "[768, 2304], the model expects [768, 1536]");
    want[0].ndim = 3;
    want[0].shape[1] = 2304;
    want[0].shape[2] = 1;
    assert_int_equal(ms_safetensors_check(&f, want, 2, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "has shape [768, 2304], the model expects [768, 2304, 1]"));
    assert_int_equal(ms_safetensors_check(&f, &want[1], 1, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "checkpoint x.safetensors: unexpected tensor "
                                    "h.0.attn.c_attn.weight (shape [768, 2304]), which the model "
                                    "does not have"));
    ms_safetensors_free(&f);
}

/* A tensor name from the file reaches the message escaped and bounded: a checkpoint cannot
 * clear the screen or retitle the terminal through an error. */
static void hardening_tensor_names_escaped(void **state) {
    (void)state;
    const char *evil = "\\u001b[2J\\u001b]0;pwn\\u0007";
    const char *shown = "\\x1B[2J\\x1B]0;pwn\\x07";
    char h[8192], want[256];
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
             evil);
    snprintf(want, sizeof want, "tensor %s: dtype \"F64\" is not supported", shown);
    expect_bad(h, 8, want);
    snprintf(h, sizeof h, "{\"__metadata__\":{\"%s\":1}}", evil);
    snprintf(want, sizeof want, "__metadata__.%s must be a string", shown);
    expect_bad(h, 0, want);
    snprintf(h, sizeof h,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             evil);
    snprintf(want, sizeof want, "data_offsets overlap: %s [0, 4) starts inside a", shown);
    expect_bad(h, 8, want);
    /* A name of 6000 bytes is cut in the message. */
    char name[6001];
    memset(name, 'x', 6000);
    name[6000] = '\0';
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
             name);
    ms_st_file f;
    ms_error err = {0};
    assert_int_equal(parse_hdr(h, 8, "bad.safetensors", &f, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "xxx...: dtype \"F64\" is not supported"));
    /* The unexpected-tensor check names the file's extra tensor, escaped too. */
    snprintf(h, sizeof h,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             evil);
    if (parse_hdr(h, 8, "x.safetensors", &f, &err) != MS_OK) fail_msg("%s", err.msg);
    ms_st_expect only_a[1] = {{"a", 1, {1}}};
    assert_int_equal(ms_safetensors_check(&f, only_a, 1, &err), MS_ERR_INVALID);
    snprintf(want, sizeof want, "unexpected tensor %s (shape [1])", shown);
    mt_expect_escaped(err.msg, want);
    ms_safetensors_free(&f);
}

static ms_status write_bytes(FILE *f, void *arg, ms_error *err) {
    const char *text = arg;
    return ms_durable_fwrite(f, text, strlen(text), "test", err);
}

static mode_t written_mode(const char *path, mode_t mask) {
    mode_t old = umask(mask);
    ms_error err = {0};
    ms_status st = ms_write_file_durable(path, write_bytes, "x", &err);
    umask(old);
    if (st != MS_OK) fail_msg("%s", err.msg);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return sb.st_mode & 0777;
}

/* A checkpoint or trace gets the mode any new file gets: 0666 less the umask. */
static void hardening_durable_write_umask(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    assert_int_equal(written_mode(path, 027), 0640);
    assert_int_equal(written_mode(path, 077), 0600);
    assert_int_equal(written_mode(path, 022), 0644);
    assert_int_equal(written_mode(path, 002), 0664);
    assert_int_equal(count_temps(dir), 0);
    rm_rf(dir);
}

typedef struct signal_job {
    int sig; /* sent to the process after the first half */
    size_t bytes;
} signal_job;

/* Writes half, signals the process, writes the other half. */
static ms_status write_then_signal(FILE *f, void *arg, ms_error *err) {
    const signal_job *j = arg;
    char *buf = calloc(1, j->bytes / 2);
    ms_status st = ms_durable_fwrite(f, buf, j->bytes / 2, "test", err);
    fflush(f);
    kill(getpid(), j->sig);
    if (st == MS_OK) st = ms_durable_fwrite(f, buf, j->bytes / 2, "test", err);
    free(buf);
    return st;
}

static volatile sig_atomic_t g_flag;
static void set_flag(int sig) {
    g_flag = sig;
}

/* In a child: a durable write of path interrupted by sig. With the default action the child
 * must die of sig; with a handler of its own (own_handler) the write must finish, the signal
 * reach that handler, and the handler be in place afterwards (exit 0; 1 + a code otherwise). */
static int write_interrupted(const char *path, int sig, bool own_handler) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct sigaction sa = {.sa_handler = own_handler ? set_flag : SIG_DFL};
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, NULL);
        signal_job j = {sig, 1 << 22};
        ms_error err = {0};
        if (ms_write_file_durable(path, write_then_signal, &j, &err) != MS_OK) _exit(2);
        struct sigaction now;
        sigaction(sig, NULL, &now);
        _exit(g_flag != sig ? 3 : now.sa_handler != set_flag ? 4 : 0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

/* SIGINT or SIGTERM in the middle of a save: the process still dies of the signal, but its
 * temporary file (megabytes) is removed and the previous checkpoint is untouched. */
static void hardening_durable_write_signal(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    ms_error err = {0};
    assert_int_equal(ms_write_file_durable(path, write_bytes, "previous", &err), MS_OK);
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int k = 0; k < 2; k++) {
        int status = write_interrupted(path, sigs[k], false);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != sigs[k])
            fail_msg("signal %d: the writer did not die of it (status 0x%x)", sigs[k], status);
        assert_int_equal(count_temps(dir), 0);
        size_t n;
        uint8_t *b = slurp(path, &n);
        assert_int_equal(n, 8);
        assert_memory_equal(b, "previous", 8);
        free(b);
    }
    /* A program with its own handler gets the signal, and the write goes on to the end. */
    int status = write_interrupted(path, SIGINT, true);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("with a handler: status 0x%x", status);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 1 << 22);
    assert_int_equal(count_temps(dir), 0);
    rm_rf(dir);
}

static void touch(const char *dir, const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("left over", f);
    fclose(f);
}

static bool exists(const char *dir, const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* A temporary file left by a killed save is removed by the next save of the same path; one
 * that a writer still holds (locked), and those of other files, are not. */
static void hardening_durable_write_sweep(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], live[160];
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    touch(dir, "ck.safetensors.tmp.AbC123");
    touch(dir, "ck.safetensors.tmp.Live99");
    touch(dir, "other.safetensors.tmp.AbC123");
    touch(dir, "ck.safetensors.tmp.toolong");
    touch(dir, "ck.safetensors.tmp.a-c123");
    snprintf(live, sizeof live, "%s/ck.safetensors.tmp.Live99", dir);
    int fd = open(live, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX), 0); /* as a writer in another process holds it */
    ms_error err = {0};
    assert_int_equal(ms_write_file_durable(path, write_bytes, "new", &err), MS_OK);
    assert_false(exists(dir, "ck.safetensors.tmp.AbC123"));
    assert_true(exists(dir, "ck.safetensors.tmp.Live99"));
    assert_true(exists(dir, "other.safetensors.tmp.AbC123"));
    assert_true(exists(dir, "ck.safetensors.tmp.toolong"));
    assert_true(exists(dir, "ck.safetensors.tmp.a-c123"));
    close(fd); /* the writer is gone: its file is stale now */
    assert_int_equal(ms_write_file_durable(path, write_bytes, "newer", &err), MS_OK);
    assert_false(exists(dir, "ck.safetensors.tmp.Live99"));
    size_t n;
    uint8_t *b = slurp(path, &n);
    assert_int_equal(n, 5);
    free(b);
    rm_rf(dir);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(exact_layout),
    cmocka_unit_test(roundtrip),
    cmocka_unit_test(foreign_order),
    cmocka_unit_test(reader_errors),
    cmocka_unit_test(reader_files),
    cmocka_unit_test(durable_write),
    cmocka_unit_test(writer_errors),
    cmocka_unit_test(shape_check),
    cmocka_unit_test(hardening_tensor_names_escaped),
    cmocka_unit_test(hardening_durable_write_umask),
    cmocka_unit_test(hardening_durable_write_signal),
    cmocka_unit_test(hardening_durable_write_sweep),
};
MT_MAIN("safetensors", tests)

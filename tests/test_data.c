/* test_data.c - the byte tokenizer, text-file splits and their error messages, the Philox
 * batch sampler (determinism, bounds, uniformity), DP sharding of the global batch, evaluation
 * windows against direct file reads, the check of the data's tokens against the model's
 * vocabulary, and (mode "prepare-data") the data preparation script. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/data/dataset.h"
#include "engine/data/tokenizer.h"
#include "tests/testkit.h"

/* A temp folder per test binary, removed at the end of each test that makes one. */
static void make_dir(char *dir, size_t len) {
    snprintf(dir, len, "/tmp/ms_test_data_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void write_file(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Pseudo-text with every byte value, so that a wrong offset shows as a wrong token. */
static uint8_t *make_bytes(size_t n) {
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((i * 2654435761u) >> 13);
    return b;
}

static void tokenizer_roundtrip(void **state) {
    (void)state;
    uint8_t all[256], back[256];
    int32_t ids[256];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
    ms_byte_encode(all, 256, ids);
    for (int i = 0; i < 256; i++) assert_int_equal(ids[i], i);
    ms_error err = {0};
    assert_int_equal(ms_byte_decode(ids, 256, back, &err), MS_OK);
    assert_memory_equal(all, back, 256);
    const char *text = "In the beginning God created the heaven and the earth.\n\xc3\xa9";
    size_t n = strlen(text);
    ms_byte_encode((const uint8_t *)text, n, ids);
    assert_int_equal(ms_byte_decode(ids, n, back, &err), MS_OK);
    assert_memory_equal(text, back, n);
    ids[3] = 256;
    assert_int_equal(ms_byte_decode(ids, n, back, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 3 is 256, outside the byte vocabulary 0..255"));
    ids[3] = -1;
    assert_int_equal(ms_byte_decode(ids, n, back, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "is -1"));
}

static void open_errors(void **state) {
    (void)state;
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    ms_text_data d;
    ms_error err = {0};

    snprintf(path, sizeof path, "%s/missing.txt", dir);
    assert_int_equal(ms_text_data_open(path, 64, 0.1, &d, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "No such file or directory"));
    assert_non_null(strstr(err.msg, "scripts/prepare-data.sh"));
    assert_null(d.bytes);

    snprintf(path, sizeof path, "%s/empty.txt", dir);
    write_file(path, (const uint8_t *)"", 0);
    assert_int_equal(ms_text_data_open(path, 64, 0.1, &d, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "the file is empty; it needs at least one window of "
                                    "seq_len + 1 = 65 bytes"));
    unlink(path);

    snprintf(path, sizeof path, "%s/short.txt", dir);
    uint8_t *b = make_bytes(1000);
    write_file(path, b, 40);
    assert_int_equal(ms_text_data_open(path, 64, 0.1, &d, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "the file has 40 bytes, shorter than one window of "
                                    "seq_len + 1 = 65 bytes"));
    /* Long enough for a window overall, but the 10% validation split is not. */
    write_file(path, b, 300);
    assert_int_equal(ms_text_data_open(path, 64, 0.1, &d, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "the validation split (the last 30 bytes, val_fraction 0.1) "
                                    "is shorter than one window of seq_len + 1 = 65 bytes"));
    /* ... and with most of it for validation the training split is too short. */
    assert_int_equal(ms_text_data_open(path, 64, 0.9, &d, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "the training split (the first 30 of 300 bytes) is shorter"));
    assert_int_equal(ms_text_data_open(path, 64, 1.0, &d, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "val_fraction is 1; it must be in [0, 1)"));
    assert_int_equal(ms_text_data_open(path, 0, 0.1, &d, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "seq_len is 0"));
    /* val_fraction 0: no validation split, the whole file trains. */
    assert_int_equal(ms_text_data_open(path, 64, 0.0, &d, &err), MS_OK);
    size_t begin, len;
    ms_text_data_split(&d, MS_SPLIT_TRAIN, &begin, &len);
    assert_true(begin == 0 && len == 300);
    ms_text_data_split(&d, MS_SPLIT_VAL, &begin, &len);
    assert_int_equal(len, 0);
    int32_t in[64];
    assert_int_equal(ms_text_data_sample(&d, MS_SPLIT_VAL, 1, 0, 1, 0, 1, in, NULL, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "the validation split has 0 bytes"));
    ms_text_data_close(&d);
    ms_text_data_close(&d); /* twice is fine */
    unlink(path);
    free(b);
    rmdir(dir);
}

enum { N = 20000, T = 16, B = 8 };

static void sampler_determinism(void **state) {
    (void)state;
    uint8_t *b = make_bytes(N);
    ms_text_data d, d2;
    ms_error err = {0};
    assert_int_equal(ms_text_data_from_bytes("mem", b, N, T, 0.1, &d, &err), MS_OK);
    assert_int_equal(ms_text_data_from_bytes("mem", b, N, T, 0.1, &d2, &err), MS_OK);
    size_t begin, len;
    ms_text_data_split(&d, MS_SPLIT_TRAIN, &begin, &len);
    assert_true(begin == 0 && len == 18000);
    ms_text_data_split(&d, MS_SPLIT_VAL, &begin, &len);
    assert_true(begin == 18000 && len == 2000);

    enum { NB = 50 };
    int32_t *all = malloc(sizeof(int32_t) * NB * B * T);
    for (uint64_t i = 0; i < NB; i++)
        assert_int_equal(
            ms_text_data_sample(&d, MS_SPLIT_TRAIN, 42, i, B, 0, B, all + i * B * T, NULL, &err),
            MS_OK);
    int32_t in1[B * T], tg1[B * T], in2[B * T];
    for (uint64_t i = NB; i-- > 0;) {
        /* Same (seed, i) -> same batch, from a separately opened dataset and in reverse
         * order: a resumed run sees the batches of an uninterrupted one. */
        assert_int_equal(ms_text_data_sample(&d2, MS_SPLIT_TRAIN, 42, i, B, 0, B, in1, tg1, &err),
                         MS_OK);
        assert_memory_equal(in1, all + i * B * T, sizeof in1);
        /* Each row is a window of the training split: targets are inputs shifted by one. */
        for (int r = 0; r < B; r++) {
            size_t s = ms_text_data_sample_start(&d, MS_SPLIT_TRAIN, 42, i, B, r);
            assert_true(s + T + 1 <= 18000);
            for (int t = 0; t < T; t++) {
                assert_int_equal(in1[r * T + t], b[s + t]);
                assert_int_equal(tg1[r * T + t], b[s + t + 1]);
            }
        }
        /* Another seed gives another batch. */
        assert_int_equal(ms_text_data_sample(&d, MS_SPLIT_TRAIN, 43, i, B, 0, B, in2, NULL, &err),
                         MS_OK);
        assert_memory_not_equal(in1, in2, sizeof in1);
    }
    /* Consecutive batches differ. */
    assert_int_equal(ms_text_data_sample(&d, MS_SPLIT_TRAIN, 42, 0, B, 0, B, in1, NULL, &err),
                     MS_OK);
    assert_int_equal(ms_text_data_sample(&d, MS_SPLIT_TRAIN, 42, 1, B, 0, B, in2, NULL, &err),
                     MS_OK);
    assert_memory_not_equal(in1, in2, sizeof in1);
    /* Validation samples stay in the validation split. */
    for (uint64_t i = 0; i < 200; i++)
        for (int r = 0; r < B; r++)
            assert_true(ms_text_data_sample_start(&d, MS_SPLIT_VAL, 7, i, B, r) + T + 1 <= 2000);
    /* Bad row ranges are errors, not overruns. */
    assert_int_equal(ms_text_data_sample(&d, MS_SPLIT_TRAIN, 1, 0, B, 6, 3, in1, NULL, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "rows [6, 6 + 3) are not inside a batch of 8 rows"));
    ms_text_data_close(&d);
    ms_text_data_close(&d2);
    free(all);
    free(b);
}

static void sampler_uniform(void **state) {
    (void)state;
    /* A small split so that every start is reachable: 100 bytes, T 9 -> 91 starts. */
    uint8_t *b = make_bytes(100);
    ms_text_data d;
    ms_error err = {0};
    assert_int_equal(ms_text_data_from_bytes("mem", b, 100, 9, 0.0, &d, &err), MS_OK);
    enum { STARTS = 91, DRAWS = 91000 };
    int counts[STARTS] = {0};
    for (int k = 0; k < DRAWS; k++) {
        size_t s = ms_text_data_sample_start(&d, MS_SPLIT_TRAIN, 5, (uint64_t)k / 4, 4, k % 4);
        assert_true(s < STARTS);
        counts[s]++;
    }
    /* Chi-square with 90 degrees of freedom: mean 90, sd ~13.4; 160 is > 5 sd. */
    double chi = 0, e = (double)DRAWS / STARTS;
    for (int s = 0; s < STARTS; s++) {
        assert_true(counts[s] > 0);
        chi += (counts[s] - e) * (counts[s] - e) / e;
    }
    assert_true(chi < 160);
    ms_text_data_close(&d);
    free(b);
}

static void dp_sharding(void **state) {
    (void)state;
    uint8_t *b = make_bytes(N);
    ms_text_data d;
    ms_error err = {0};
    assert_int_equal(ms_text_data_from_bytes("mem", b, N, T, 0.1, &d, &err), MS_OK);
    int32_t global_in[B * T], global_tg[B * T], in[B * T], tg[B * T];
    for (uint64_t i = 0; i < 5; i++) {
        for (int mode = 0; mode < 2; mode++) {
            ms_status st = mode == 0 ? ms_text_data_sample(&d, MS_SPLIT_TRAIN, 9, i, B, 0, B,
                                                           global_in, global_tg, &err)
                                     : ms_text_data_eval(&d, MS_SPLIT_VAL, i, B, 0, B, global_in,
                                                         global_tg, &err);
            assert_int_equal(st, MS_OK);
            const int dps[3] = {1, 2, 4};
            for (int k = 0; k < 3; k++) {
                memset(in, 0xff, sizeof in);
                memset(tg, 0xff, sizeof tg);
                for (int rank = 0; rank < dps[k]; rank++) {
                    int r0, nrows;
                    assert_int_equal(ms_dp_rows(B, dps[k], rank, &r0, &nrows, &err), MS_OK);
                    assert_int_equal(nrows, B / dps[k]);
                    st = mode == 0 ? ms_text_data_sample(&d, MS_SPLIT_TRAIN, 9, i, B, r0, nrows,
                                                         in + r0 * T, tg + r0 * T, &err)
                                   : ms_text_data_eval(&d, MS_SPLIT_VAL, i, B, r0, nrows,
                                                       in + r0 * T, tg + r0 * T, &err);
                    assert_int_equal(st, MS_OK);
                }
                assert_memory_equal(in, global_in, sizeof in);
                assert_memory_equal(tg, global_tg, sizeof tg);
            }
        }
    }
    int r0, nrows;
    assert_int_equal(ms_dp_rows(10, 4, 0, &r0, &nrows, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "batch size 10 is not divisible by the data-parallel degree "
                                    "4; use a batch size that is a multiple of 4"));
    assert_int_equal(ms_dp_rows(8, 4, 4, &r0, &nrows, &err), MS_ERR_INVALID);
    assert_int_equal(ms_dp_rows(8, 4, 3, &r0, &nrows, &err), MS_OK);
    assert_true(r0 == 6 && nrows == 2);
    ms_text_data_close(&d);
    free(b);
}

static void eval_windows(void **state) {
    (void)state;
    char dir[64], path[128];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/text.bin", dir);
    uint8_t *b = make_bytes(N);
    write_file(path, b, N);
    ms_text_data d;
    ms_error err = {0};
    assert_int_equal(ms_text_data_open(path, T, 0.1, &d, &err), MS_OK);
    assert_string_equal(d.path, path);
    /* Validation: 2000 bytes / (8 * 17) = 14 whole batches; whole file: 20000 / 136 = 147. */
    assert_int_equal(ms_text_data_eval_batches(&d, MS_SPLIT_VAL, B), 14);
    assert_int_equal(ms_text_data_eval_batches(&d, MS_SPLIT_ALL, B), 147);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    int32_t in[B * T], tg[B * T];
    uint8_t win[T + 1];
    const ms_split splits[2] = {MS_SPLIT_VAL, MS_SPLIT_ALL};
    const long base[2] = {18000, 0};
    const uint64_t nb[2] = {14, 147};
    for (int k = 0; k < 2; k++) {
        for (uint64_t i = 0; i < nb[k]; i++) {
            assert_int_equal(ms_text_data_eval(&d, splits[k], i, B, 0, B, in, tg, &err), MS_OK);
            for (int r = 0; r < B; r++) {
                /* Row r of batch i is the T+1 bytes at (i*B + r)*(T+1), read straight from
                 * the file. */
                long off = base[k] + (long)((i * B + (uint64_t)r) * (T + 1));
                assert_int_equal(fseek(f, off, SEEK_SET), 0);
                assert_int_equal(fread(win, 1, T + 1, f), T + 1);
                for (int t = 0; t < T; t++) {
                    assert_int_equal(in[r * T + t], win[t]);
                    assert_int_equal(tg[r * T + t], win[t + 1]);
                }
            }
        }
        assert_int_equal(ms_text_data_eval(&d, splits[k], nb[k], B, 0, B, in, tg, &err),
                         MS_ERR_INVALID);
        assert_non_null(strstr(err.msg, path));
        assert_non_null(strstr(err.msg, "does not fit"));
    }
    assert_non_null(strstr(err.msg, "evaluation batch 147 does not fit: the file has 20000 bytes, "
                                    "enough for 147 batches of 8 rows x 17 bytes"));
    fclose(f);
    ms_text_data_close(&d);
    unlink(path);
    free(b);
    rmdir(dir);
}

/* Every byte of the data must be a token of the model: a vocabulary smaller than the largest
 * byte is refused up front, naming the byte, its offset and the vocab_size that fits. */
static void hardening_vocab_check(void **state) {
    (void)state;
    const char text[] = "And God saw the light, that it was good"; /* largest: 'w' = 119 */
    ms_text_data d;
    ms_error err = {0};
    assert_int_equal(
        ms_text_data_from_bytes("kjv.txt", (const uint8_t *)text, strlen(text), 4, 0.0, &d, &err),
        MS_OK);
    assert_int_equal(ms_text_data_check_vocab(&d, 1, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "kjv.txt: byte 65 at offset 0 is token 65, outside the "
                                    "model's vocabulary of 1 tokens"));
    assert_non_null(strstr(err.msg, "needs vocab_size 120 or more"));
    assert_non_null(strstr(err.msg, "\"vocab_size\""));
    /* One short: the first byte past it is named. */
    assert_int_equal(ms_text_data_check_vocab(&d, 119, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "byte 119 at offset 10"));
    assert_int_equal(ms_text_data_check_vocab(&d, 120, &err), MS_OK);
    assert_int_equal(ms_text_data_check_vocab(&d, MS_BYTE_VOCAB, &err), MS_OK);
    ms_text_data_close(&d);
    /* Any byte at all fits 256. */
    uint8_t all[512];
    for (int i = 0; i < 512; i++) all[i] = (uint8_t)i;
    assert_int_equal(ms_text_data_from_bytes(NULL, all, sizeof all, 8, 0.0, &d, &err), MS_OK);
    assert_int_equal(ms_text_data_check_vocab(&d, 255, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "needs vocab_size 256 or more"));
    assert_int_equal(ms_text_data_check_vocab(&d, MS_BYTE_VOCAB, &err), MS_OK);
    ms_text_data_close(&d);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(tokenizer_roundtrip),   cmocka_unit_test(open_errors),
    cmocka_unit_test(sampler_determinism),   cmocka_unit_test(sampler_uniform),
    cmocka_unit_test(dp_sharding),           cmocka_unit_test(eval_windows),
    cmocka_unit_test(hardening_vocab_check),
};

/* --- "prepare-data" mode: runs scripts/prepare-data.sh into a temp folder (77 = skip). ----- */

static int run(const char *cmd, char *out, size_t len) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int prepare_data_check(void) {
    const char *script = MS_SOURCE_DIR "/scripts/prepare-data.sh";
    char dir[64] = "/tmp/ms_test_prepare_XXXXXX", out[128], cmd[512], text[4096];
    /* Not inside a cmocka test here: report failures by exit code, not asserts. */
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(out, sizeof out, "%s/sub/kjv.txt", dir);
    /* Without `bible` on PATH the script fails and says which package to install. */
    snprintf(cmd, sizeof cmd, "env PATH=%s /bin/bash %s %s 2>&1", dir, script, out);
    int rc = run(cmd, text, sizeof text);
    if (rc != 1 || !strstr(text, "bible-kjv")) {
        fprintf(stderr, "FAIL: without bible: rc %d, output '%s'\n", rc, text);
        return 1;
    }
    if (system("command -v bible >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: the 'bible' program (package bible-kjv) is not installed\n");
        rmdir(dir);
        return 77;
    }
    snprintf(cmd, sizeof cmd, "/bin/bash %s %s 2>&1", script, out);
    rc = run(cmd, text, sizeof text);
    if (rc != 0) {
        fprintf(stderr, "FAIL: prepare-data.sh: rc %d: %s\n", rc, text);
        return 1;
    }
    struct stat sb;
    if (stat(out, &sb) != 0 || sb.st_size < (1 << 20)) {
        fprintf(stderr, "FAIL: %s is missing or under 1 MiB\n", out);
        return 1;
    }
    FILE *f = fopen(out, "rb");
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *first = "In the beginning God created the heaven and the earth.\n"
                        "And the earth was without form, and void;";
    if (strncmp(text, first, strlen(first)) != 0) {
        fprintf(stderr, "FAIL: %s starts with '%.80s'\n", out, text);
        return 1;
    }
    /* Idempotent: a second run leaves the file alone. */
    struct stat sb2;
    rc = run(cmd, text, sizeof text);
    if (rc != 0 || stat(out, &sb2) != 0 || sb2.st_mtim.tv_sec != sb.st_mtim.tv_sec ||
        sb2.st_mtim.tv_nsec != sb.st_mtim.tv_nsec || !strstr(text, "nothing to do")) {
        fprintf(stderr, "FAIL: second run rc %d changed the file or said '%s'\n", rc, text);
        return 1;
    }
    printf("prepare-data: %s, %lld bytes\n", out, (long long)sb.st_size);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "prepare-data") == 0) return prepare_data_check();
    return mt_main(argc, argv, "data", tests, sizeof tests / sizeof tests[0]);
}

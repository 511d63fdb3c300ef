/* test_core.c - tensors, views, bf16, device accounting and Philox, against independent
 * references (published Philox vectors, direct index arithmetic); the sanitiser for text from
 * files in messages; the device's byte limit; ms_panic's hooks in a child process that
 * panics; the hash index's order and probe counts. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/core/hmap.h"
#include "engine/core/panic.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "engine/core/xalloc.h"
#include "tests/testkit.h"

/* Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10). */
static void philox_known_answers(void **state) {
    (void)state;
    uint32_t out[4];
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    ms_philox4x32_10(c0, k0, out);
    assert_int_equal(out[0], 0x6627e8d5u);
    assert_int_equal(out[1], 0xe169c58du);
    assert_int_equal(out[2], 0xbc57ac4cu);
    assert_int_equal(out[3], 0x9b00dbd8u);
    const uint32_t c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    const uint32_t k1[2] = {0xffffffffu, 0xffffffffu};
    ms_philox4x32_10(c1, k1, out);
    assert_int_equal(out[0], 0x408f276du);
    assert_int_equal(out[1], 0x41c83b0eu);
    assert_int_equal(out[2], 0xa20bc7c6u);
    assert_int_equal(out[3], 0x6d5451fdu);
    const uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    const uint32_t k2[2] = {0xa4093822u, 0x299f31d0u};
    ms_philox4x32_10(c2, k2, out);
    assert_int_equal(out[0], 0xd16cfe09u);
    assert_int_equal(out[1], 0x94fdccebu);
    assert_int_equal(out[2], 0x5001e420u);
    assert_int_equal(out[3], 0x24126ea1u);
}

static void philox_distribution(void **state) {
    (void)state;
    /* Mean and variance of 200k normals and uniforms are within 4 sigma of the truth. */
    const int n = 200000;
    double su = 0, sn = 0, sn2 = 0;
    for (int i = 0; i < n; i++) {
        float u = ms_philox_uniform(7, 3, (uint64_t)i);
        assert_true(u >= 0.0f && u < 1.0f);
        su += u;
        double z = ms_philox_normal(7, 3, (uint64_t)i);
        sn += z;
        sn2 += z * z;
    }
    assert_true(fabs(su / n - 0.5) < 4 * sqrt(1.0 / 12 / n));
    assert_true(fabs(sn / n) < 4 * sqrt(1.0 / n));
    assert_true(fabs(sn2 / n - 1.0) < 4 * sqrt(2.0 / n));
    /* Different streams and seeds give different values. */
    assert_true(ms_philox_uniform(7, 3, 5) != ms_philox_uniform(7, 4, 5));
    assert_true(ms_philox_uniform(7, 3, 5) != ms_philox_uniform(8, 3, 5));
}

static void tensor_alloc_views(void **state) {
    (void)state;
    ms_device *dev;
    ms_error err;
    assert_int_equal(ms_device_cpu_create(&dev, &err), MS_OK);
    ms_tensor t;
    const int64_t shape[3] = {3, 5, 7};
    assert_int_equal(ms_tensor_alloc(dev, MS_F32, 3, shape, &t, &err), MS_OK);
    assert_int_equal((uintptr_t)ms_tensor_data(&t) % MS_TENSOR_ALIGN, 0);
    assert_int_equal(ms_tensor_numel(&t), 105);
    assert_true(ms_tensor_is_contiguous(&t));
    assert_int_equal(atomic_load(&dev->in_use), 105 * 4);
    float *p = ms_tensor_f32(&t);
    for (int i = 0; i < 105; i++) p[i] = (float)i;

    /* slice dim 1 [2, 5) then transpose (0, 2): element (k, j, i) = t[i][j+2][k] */
    ms_tensor s, tr;
    assert_int_equal(ms_tensor_slice(&t, 1, 2, 3, &s, &err), MS_OK);
    assert_false(ms_tensor_is_contiguous(&s));
    assert_int_equal(ms_tensor_transpose(&s, 0, 2, &tr, &err), MS_OK);
    for (int64_t k = 0; k < 7; k++)
        for (int64_t j = 0; j < 3; j++)
            for (int64_t i = 0; i < 3; i++) {
                int64_t idx[3] = {k, j, i};
                assert_float_equal(ms_tensor_get(&tr, idx), (float)(i * 35 + (j + 2) * 7 + k), 0);
            }
    ms_tensor c;
    assert_int_equal(ms_tensor_contiguous(&tr, MS_F32, &c, &err), MS_OK);
    assert_true(ms_tensor_is_contiguous(&c));
    assert_float_equal(ms_tensor_f32(&c)[1 * 9 + 2 * 3 + 0], (float)(0 * 35 + 4 * 7 + 1), 0);

    /* Errors name the problem. */
    assert_int_equal(ms_tensor_slice(&t, 1, 4, 3, &s, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "outside dim 1"));
    assert_int_equal(ms_tensor_transpose(&t, 0, 3, &s, &err), MS_ERR_INVALID);
    const int64_t bad[2] = {4, 4};
    assert_int_equal(ms_tensor_reshape(&tr, 2, bad, &s, &err), MS_ERR_INVALID);
    const int64_t r2[2] = {15, 7};
    ms_tensor rs;
    assert_int_equal(ms_tensor_reshape(&t, 2, r2, &rs, &err), MS_OK);
    assert_int_equal(ms_tensor_reshape(&t, 2, bad, &s, &err), MS_ERR_INVALID);
    ms_tensor_release(&s); /* failed calls above left the slice view untouched */
    const int64_t neg[1] = {-1};
    ms_tensor none;
    assert_int_equal(ms_tensor_alloc(dev, MS_F32, 1, neg, &none, &err), MS_ERR_INVALID);
    assert_null(none.storage);
    assert_int_equal(ms_tensor_alloc(dev, MS_F32, 9, shape, &none, &err), MS_ERR_INVALID);

    ms_tensor_release(&rs);
    ms_tensor_release(&c);
    ms_tensor_release(&tr);
    assert_int_equal(atomic_load(&dev->in_use), 105 * 4); /* views keep storage alive */
    ms_tensor_release(&t);
    assert_int_equal(atomic_load(&dev->in_use), 0);
    assert_int_equal(atomic_load(&dev->peak), (105 + 63) * 4); /* t and the contiguous copy */
    ms_device_destroy(dev);
}

static void bf16_storage(void **state) {
    (void)state;
    /* Exact for bf16-representable values, round-to-nearest-even otherwise. */
    assert_float_equal(ms_f32_from_bf16(ms_bf16_from_f32(1.5f)), 1.5f, 0);
    assert_float_equal(ms_f32_from_bf16(ms_bf16_from_f32(-2.0f)), -2.0f, 0);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1. */
    assert_float_equal(ms_f32_from_bf16(ms_bf16_from_f32(1.0f + 1.0f / 256)), 1.0f, 0);
    assert_float_equal(ms_f32_from_bf16(ms_bf16_from_f32(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256, 0);
    assert_true(isnan(ms_f32_from_bf16(ms_bf16_from_f32(NAN))));
    assert_true(isinf(ms_f32_from_bf16(ms_bf16_from_f32(INFINITY))));
    ms_device *dev;
    ms_error err;
    ms_device_cpu_create(&dev, &err);
    const int64_t shape[2] = {4, 6};
    ms_tensor f, h, back;
    ms_tensor_alloc(dev, MS_F32, 2, shape, &f, &err);
    assert_int_equal(ms_tensor_init_normal(&f, 1, 2, shape, NULL, 0, 1, &err), MS_OK);
    assert_int_equal(ms_tensor_contiguous(&f, MS_BF16, &h, &err), MS_OK);
    assert_int_equal(h.storage->nbytes, 24 * 2);
    assert_int_equal(ms_tensor_contiguous(&h, MS_F32, &back, &err), MS_OK);
    for (int i = 0; i < 24; i++) {
        float a = ms_tensor_f32(&f)[i], b = ms_tensor_f32(&back)[i];
        assert_true(fabsf(a - b) <= fabsf(a) / 256.0f); /* 8 bits of mantissa */
    }
    ms_tensor_release(&f), ms_tensor_release(&h), ms_tensor_release(&back);
    ms_device_destroy(dev);
}

/* Initialising any box of a global tensor equals the same box of the whole tensor. */
static void philox_init_is_shard_invariant(void **state) {
    (void)state;
    ms_device *dev;
    ms_error err;
    ms_device_cpu_create(&dev, &err);
    const int64_t g[3] = {5, 7, 3};
    ms_tensor whole;
    ms_tensor_alloc(dev, MS_F32, 3, g, &whole, &err);
    assert_int_equal(ms_tensor_init_normal(&whole, 42, 9, g, NULL, 0.5f, 0.02f, &err), MS_OK);
    for (int64_t a = 0; a < 5; a++)
        for (int64_t b = 0; b < 7; b += 2) {
            const int64_t start[3] = {a, b, 1}, len[3] = {5 - a, b < 6 ? 2 : 1, 2};
            ms_tensor part;
            ms_tensor_alloc(dev, MS_F32, 3, len, &part, &err);
            assert_int_equal(ms_tensor_init_normal(&part, 42, 9, g, start, 0.5f, 0.02f, &err),
                             MS_OK);
            for (int64_t i = 0; i < len[0]; i++)
                for (int64_t j = 0; j < len[1]; j++)
                    for (int64_t k = 0; k < len[2]; k++) {
                        int64_t li[3] = {i, j, k}, gi[3] = {i + a, j + b, k + 1};
                        assert_float_equal(ms_tensor_get(&part, li), ms_tensor_get(&whole, gi), 0);
                    }
            ms_tensor_release(&part);
        }
    const int64_t start[3] = {4, 0, 0}, len[3] = {2, 1, 1};
    ms_tensor part;
    ms_tensor_alloc(dev, MS_F32, 3, len, &part, &err);
    assert_int_equal(ms_tensor_init_normal(&part, 42, 9, g, start, 0, 1, &err), MS_ERR_INVALID);
    ms_tensor_release(&part);
    ms_tensor_release(&whole);
    ms_device_destroy(dev);
}

static void copy_box(void **state) {
    (void)state;
    float src[4 * 5 * 6], dst[3 * 3 * 4];
    for (int i = 0; i < 120; i++) src[i] = (float)i;
    memset(dst, 0, sizeof dst);
    const int64_t ss[3] = {4, 5, 6}, ds[3] = {3, 3, 4}, s0[3] = {1, 2, 3}, d0[3] = {1, 0, 1},
                  len[3] = {2, 3, 3};
    ms_copy_box_f32(dst, ds, d0, src, ss, s0, len, 3);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                bool inside = i >= 1 && k >= 1;
                float want = inside ? (float)((i - 1 + 1) * 30 + (j + 2) * 6 + (k - 1 + 3)) : 0.0f;
                assert_float_equal(dst[(i * 3 + j) * 4 + k], want, 0);
            }
}

static void device_fallback(void **state) {
    (void)state;
    ms_device *dev;
    ms_error err;
    char note[256];
    assert_int_equal(ms_device_auto_create(true, 0, &dev, note, sizeof note, &err), MS_OK);
    if (dev->ops->kind == MS_DEVICE_CPU) assert_true(strlen(note) > 0); /* says why */
    ms_device_destroy(dev);
    assert_int_equal(ms_device_auto_create(false, 0, &dev, note, sizeof note, &err), MS_OK);
    assert_int_equal(dev->ops->kind, MS_DEVICE_CPU);
    assert_string_equal(note, "");
    ms_device_destroy(dev);
}

/* Text from files goes into messages with nothing a terminal would act on, nothing that is
 * not valid UTF-8, and a bounded length; printable text, UTF-8 included, is kept as it is. */
static void hardening_safe_str(void **state) {
    (void)state;
    char out[MS_SAFE_LEN];
    assert_string_equal(ms_safe_str(out, sizeof out, "h.0.attn.c_attn.weight"),
                        "h.0.attn.c_attn.weight");
    assert_string_equal(ms_safe_str(out, sizeof out, "\x1b[2J\x1b]0;owned\x07"),
                        "\\x1B[2J\\x1B]0;owned\\x07");
    assert_string_equal(ms_safe_str(out, sizeof out, "tab\there\nDEL\x7f"),
                        "tab\\x09here\\x0ADEL\\x7F");
    /* Valid UTF-8 stays; C1 controls (CSI U+009B) and bidi overrides (U+202E) are escaped. */
    assert_string_equal(ms_safe_str(out, sizeof out, "caf\xc3\xa9 \xe2\x9c\x93"),
                        "caf\xc3\xa9 \xe2\x9c\x93");
    assert_string_equal(ms_safe_str(out, sizeof out,
                                    "a\xc2\x9b"
                                    "31mb"),
                        "a\\xC2\\x9B31mb");
    assert_string_equal(ms_safe_str(out, sizeof out, "x\xe2\x80\xaey"), "x\\xE2\\x80\\xAEy");
    /* Invalid UTF-8: stray continuation, overlong, surrogate, truncated, past U+10FFFF. */
    assert_string_equal(ms_safe_str(out, sizeof out, "\x80\xc0\xaf\xed\xa0\x80\xe2\x82"),
                        "\\x80\\xC0\\xAF\\xED\\xA0\\x80\\xE2\\x82");
    assert_string_equal(ms_safe_str(out, sizeof out, "\xf4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");
    /* A backslash is doubled, so \x1B in the output always means an escaped byte. */
    assert_string_equal(ms_safe_str(out, sizeof out, "a\\x1B"), "a\\\\x1B");
    assert_string_equal(ms_safe_str(out, sizeof out, NULL), "(null)");
    /* Bounded: a long name is cut at a character boundary and marked. */
    char longer[4096];
    memset(longer, 'n', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    ms_safe_str(out, sizeof out, longer);
    assert_int_equal(strlen(out), sizeof out - 1);
    assert_string_equal(out + sizeof out - 4, "...");
    char small[8];
    assert_string_equal(ms_safe_str(small, sizeof small, "\x1b\x1b"), "\\x1B...");
    assert_string_equal(ms_safe_str(small, sizeof small, "abcdefg"), "abcdefg");
    assert_string_equal(ms_safe_str(small, sizeof small, "abcdefgh"), "abcd...");
    /* Never a split UTF-8 sequence at the cut. */
    assert_string_equal(ms_safe_str(small, sizeof small, "ab\xe2\x9c\x93\xe2\x9c\x93"), "ab...");
}

/* A byte limit on a device refuses what would pass it, with a message, and counts nothing
 * for the refusal; lifting it allows the allocation. */
static void device_limit(void **state) {
    (void)state;
    ms_device *dev;
    ms_error err = {0};
    assert_int_equal(ms_device_cpu_create(&dev, &err), MS_OK);
    void *a = NULL, *b = NULL;
    assert_int_equal(ms_device_alloc(dev, 4096, &a, &err), MS_OK);
    ms_device_set_limit(dev, 6000);
    assert_int_equal(ms_device_alloc(dev, 4096, &b, &err), MS_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "4096 bytes"));
    assert_non_null(strstr(err.msg, "6000-byte limit"));
    assert_int_equal(atomic_load(&dev->in_use), 4096);
    ms_device_set_limit(dev, 0);
    assert_int_equal(ms_device_alloc(dev, 4096, &b, &err), MS_OK);
    assert_int_equal(atomic_load(&dev->in_use), 8192);
    ms_device_free(dev, a, 4096);
    ms_device_free(dev, b, 4096);
    assert_int_equal(atomic_load(&dev->in_use), 0);
    assert_int_equal(atomic_load(&dev->peak), 8192);
    ms_device_destroy(dev);
}

/* --- ms_panic: run in a child whose stderr is a pipe --------------------------------------- */

static char kept[] = "[kept]", removed[] = "[removed]";

static void hook_write(void *user) {
    const char *tag = user;
    ssize_t n = write(STDERR_FILENO, tag, strlen(tag));
    (void)n;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

/* Forks a child that registers the hooks and then panics (how: 0 ms_panic, 1 xmalloc of more
 * than the address space); returns its termination status and what it wrote to stderr. */
static int run_panicking_child(int how, char *out, size_t cap) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        ms_panic_hook_add(hook_write, kept);
        ms_panic_hook_add(hook_write, removed);
        ms_panic_hook_add(hook_write, kept); /* a second registration is a no-op */
        ms_panic_hook_remove(hook_write, removed);
        if (how == 0) ms_panic("boom %d", 42);
        volatile size_t huge = SIZE_MAX / 2;
        void *p = xmalloc(huge);
        free(p);
        _exit(0); /* not reached */
    }
    close(fds[1]);
    size_t n = 0;
    for (ssize_t got; n + 1 < cap && (got = read(fds[0], out + n, cap - 1 - n)) > 0;)
        n += (size_t)got;
    out[n] = '\0';
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

/* The hooks run (once each, the removed one not at all) before the message, then SIGABRT. */
static void panic_runs_hooks_then_aborts(void **state) {
    (void)state;
    char out[2048];
    int status = run_panicking_child(0, out, sizeof out);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_string_equal(out, "[kept]meshscope: boom 42\n");
#ifndef UNDER_SANITIZER
    /* xalloc's out-of-memory path is the same panic (sanitizers report huge sizes first). */
    status = run_panicking_child(1, out, sizeof out);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_non_null(strstr(out, "[kept]meshscope: out of memory allocating"));
    assert_non_null(strstr(out, "bytes of bookkeeping\n"));
#endif
}

/* --- the hash index ----------------------------------------------------------------------- */

static bool eq_key(const void *ctx, uint32_t val) {
    const int *k = ctx;
    return (int)val % 10 == *k; /* value v holds key v % 10 */
}

static bool eq_int(const void *ctx, uint32_t val) {
    return (int)val == *(const int *)ctx;
}

/* Equal keys come back in the order added, also when their chain wraps round the table's end
 * and the table grows under them; distinct keys cost under 3 slots a lookup. */
static void hmap_index(void **state) {
    (void)state;
    ms_hmap m = {0};
    const uint64_t h = UINT64_MAX; /* one hash for all: its home is the last slot */
    for (uint32_t v = 0; v < 100; v++) {
        assert_true(ms_hmap_add(&m, h, v));
        for (int k = 0; k < 10 && k <= (int)v; k++) {
            uint32_t got = UINT32_MAX;
            assert_true(ms_hmap_find(&m, h, eq_key, &k, &got));
            assert_int_equal(got, (uint32_t)k);
        }
    }
    int k = 3;
    uint32_t got;
    assert_false(ms_hmap_find(&m, 0, eq_key, &k, &got));
    ms_hmap_free(&m);
    assert_int_equal(m.cap, 0);

    enum { N = 100000 };
    for (int v = 0; v < N; v++)
        assert_true(ms_hmap_add(&m, ms_hash_mix((uint64_t)v * 3), (uint32_t)v));
    m.lookups = m.probes = 0;
    for (int v = 0; v < 2 * N; v++) {
        bool hit = ms_hmap_find(&m, ms_hash_mix((uint64_t)v * 3), eq_int, &v, &got);
        assert_int_equal(hit, v < N);
        if (hit) assert_int_equal(got, (uint32_t)v);
    }
    assert_int_equal(m.lookups, 2 * N);
    assert_true(m.probes < 3 * m.lookups);
    ms_hmap_free(&m);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(hardening_safe_str),
    cmocka_unit_test(philox_known_answers),
    cmocka_unit_test(philox_distribution),
    cmocka_unit_test(tensor_alloc_views),
    cmocka_unit_test(bf16_storage),
    cmocka_unit_test(philox_init_is_shard_invariant),
    cmocka_unit_test(copy_box),
    cmocka_unit_test(device_fallback),
    cmocka_unit_test(device_limit),
    cmocka_unit_test(panic_runs_hooks_then_aborts),
    cmocka_unit_test(hmap_index),
};
MT_MAIN("core", tests)

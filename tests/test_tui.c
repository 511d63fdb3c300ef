/* test_tui.c - the terminal view's pure drawing helpers against hand-computed answers: the
 * colour scale, sparkline glyphs in UTF-8 and ASCII, bars, the timeline's lane layout and the
 * pipeline's (blocks, labels, fill glyphs), axis steps, number formatting, glyph and colour
 * choices from the environment, the dashboard URL split, and the suggestion highlight that
 * follows its suggestion when the list re-sorts. (The screens themselves run
 * under tmux: tests/tui_tmux.sh.)
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/testkit.h"

#include "tui/draw.h"
#include "tui/source.h"
#include "tui/tui_impl.h"

static void test_scale_level(void **state) {
    (void)state;
    /* 5 levels: 0 = nothing, then (0, 25] (25, 50] (50, 75] (75, 100]. */
    assert_int_equal(ms_tui_scale_level(0, 100, 5), 0);
    assert_int_equal(ms_tui_scale_level(-3, 100, 5), 0);
    assert_int_equal(ms_tui_scale_level(1, 100, 5), 1);
    assert_int_equal(ms_tui_scale_level(25, 100, 5), 1);
    assert_int_equal(ms_tui_scale_level(25.01, 100, 5), 2);
    assert_int_equal(ms_tui_scale_level(50, 100, 5), 2);
    assert_int_equal(ms_tui_scale_level(75, 100, 5), 3);
    assert_int_equal(ms_tui_scale_level(76, 100, 5), 4);
    assert_int_equal(ms_tui_scale_level(100, 100, 5), 4);
    assert_int_equal(ms_tui_scale_level(250, 100, 5), 4); /* above the max: clamped */
    assert_int_equal(ms_tui_scale_level(NAN, 100, 5), 0);
    assert_int_equal(ms_tui_scale_level(5, 0, 5), 0);
    assert_int_equal(ms_tui_scale_level(5, 10, 1), 0);
    /* 10 levels over 9: 4.5 / 9 * 9 = 4.5 -> 5; the tiniest value still shows. */
    assert_int_equal(ms_tui_scale_level(4.5, 9, 10), 5);
    assert_int_equal(ms_tui_scale_level(1e-12, 9, 10), 1);
}

static void test_spark_index(void **state) {
    (void)state;
    assert_int_equal(ms_tui_spark_index(0, 0, 7), 0);
    assert_int_equal(ms_tui_spark_index(3, 0, 7), 3);
    assert_int_equal(ms_tui_spark_index(3.49, 0, 7), 3);
    assert_int_equal(ms_tui_spark_index(3.5, 0, 7), 4);
    assert_int_equal(ms_tui_spark_index(7, 0, 7), 7);
    assert_int_equal(ms_tui_spark_index(-5, 0, 7), 0);
    assert_int_equal(ms_tui_spark_index(99, 0, 7), 7);
    assert_int_equal(ms_tui_spark_index(2, 2, 2), 3); /* flat */
    assert_int_equal(ms_tui_spark_index(NAN, 0, 1), 0);
}

static void test_sparkline(void **state) {
    (void)state;
    const ms_tui_glyphs *u = ms_tui_glyphs_get(true), *a = ms_tui_glyphs_get(false);
    double ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    char out[256];
    assert_int_equal(ms_tui_sparkline(ramp, 8, 8, u, out, sizeof out), 8);
    assert_string_equal(out, "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588");
    assert_int_equal(ms_tui_sparkline(ramp, 8, 8, a, out, sizeof out), 8);
    assert_string_equal(out, "_.-~=+*#");
    /* 8 values in 4 columns: means 0.5 2.5 4.5 6.5 -> (x - 0.5) / 6 * 7 = 0, 2.33, 4.67, 7. */
    assert_int_equal(ms_tui_sparkline(ramp, 8, 4, u, out, sizeof out), 4);
    assert_string_equal(out, "\u2581\u2583\u2586\u2588");
    assert_int_equal(ms_tui_sparkline(ramp, 8, 4, a, out, sizeof out), 4);
    assert_string_equal(out, "_-+#");
    /* Fewer values than columns: one each, left-aligned; a flat series sits in the middle. */
    double flat[3] = {1, 1, 1};
    assert_int_equal(ms_tui_sparkline(flat, 3, 10, u, out, sizeof out), 3);
    assert_string_equal(out, "\u2584\u2584\u2584");
    /* A missing value (NaN, a diverged loss) is a gap. */
    double gap[3] = {1, NAN, 3};
    assert_int_equal(ms_tui_sparkline(gap, 3, 3, a, out, sizeof out), 3);
    assert_string_equal(out, "_ #");
    /* 9 values in 3 columns: means 1, 4, 7 -> 0, 3.5 -> 4, 7. */
    double nine[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(ms_tui_sparkline(nine, 9, 3, a, out, sizeof out), 3);
    assert_string_equal(out, "_=#");
    /* The buffer bounds the columns: 3-byte glyphs in 8 bytes leave room for 2. */
    assert_int_equal(ms_tui_sparkline(ramp, 8, 8, u, out, 8), 2);
    assert_string_equal(out, "\u2581\u2582");
    assert_int_equal(ms_tui_sparkline(NULL, 0, 8, u, out, sizeof out), 0);
    assert_string_equal(out, "");
}

static void test_hbar(void **state) {
    (void)state;
    const ms_tui_glyphs *u = ms_tui_glyphs_get(true), *a = ms_tui_glyphs_get(false);
    char out[256];
    assert_int_equal(ms_tui_hbar(0.5, 10, u, out, sizeof out), 5); /* 40 eighths */
    assert_string_equal(out, "\u2588\u2588\u2588\u2588\u2588");
    assert_int_equal(ms_tui_hbar(0.55, 10, u, out, sizeof out), 6); /* 44: 5 and 4/8 */
    assert_string_equal(out, "\u2588\u2588\u2588\u2588\u2588\u258c");
    assert_int_equal(ms_tui_hbar(0.53, 10, u, out, sizeof out), 6); /* 42.4 -> 42: 5 and 2/8 */
    assert_string_equal(out, "\u2588\u2588\u2588\u2588\u2588\u258e");
    assert_int_equal(ms_tui_hbar(0.55, 10, a, out, sizeof out), 6); /* ASCII: 4/8 rounds up */
    assert_string_equal(out, "######");
    assert_int_equal(ms_tui_hbar(0.53, 10, a, out, sizeof out), 5); /* 2/8 rounds down */
    assert_string_equal(out, "#####");
    assert_int_equal(ms_tui_hbar(1.5, 4, a, out, sizeof out), 4);
    assert_string_equal(out, "####");
    assert_int_equal(ms_tui_hbar(-1, 4, a, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(ms_tui_hbar(NAN, 4, a, out, sizeof out), 0);
}

static ms_live_span span(int rank, ms_lane_kind kind, double t0, double t1) {
    ms_live_span s;
    memset(&s, 0, sizeof s);
    s.rank = rank;
    s.kind = (uint8_t)kind;
    s.t0 = t0;
    s.t1 = t1;
    s.mesh_dim = -1;
    return s;
}

static void test_lane_layout(void **state) {
    (void)state;
    /* A 1 s step over 10 columns: column c is [0.1c, 0.1c + 0.1). */
    ms_live_span s[] = {
        span(0, MS_LANE_COMPUTE, 0.0, 0.3),   /* columns 0-2 */
        span(0, MS_LANE_COMM, 0.25, 0.4),     /* 2-3, over the compute in 2 */
        span(0, MS_LANE_COMPUTE, 0.45, 0.46), /* shorter than a column: still column 4 */
        span(0, MS_LANE_COMPUTE, 0.6, 0.61),  /* 6 */
        span(0, MS_LANE_COMPUTE, 0.95, 1.2),  /* 9, clipped at the end */
        span(1, MS_LANE_COMM, 0.0, 1.0),      /* another rank's lane */
        span(0, MS_LANE_COMPUTE, 0.8, 0.7),   /* backwards: ignored */
    };
    int n = (int)(sizeof s / sizeof s[0]);
    uint8_t out[10];
    const uint8_t I = MS_TUI_CELL_IDLE, C = MS_TUI_CELL_COMPUTE, M = MS_TUI_CELL_COMM;
    const uint8_t want0[10] = {C, C, M, M, C, I, C, I, I, C};
    ms_tui_lane_layout(s, n, 0, 1.0, 10, out);
    assert_memory_equal(out, want0, 10);
    const uint8_t want1[10] = {M, M, M, M, M, M, M, M, M, M};
    ms_tui_lane_layout(s, n, 1, 1.0, 10, out);
    assert_memory_equal(out, want1, 10);
    const uint8_t idle[10] = {I, I, I, I, I, I, I, I, I, I};
    ms_tui_lane_layout(s, n, 2, 1.0, 10, out); /* a rank with no spans */
    assert_memory_equal(out, idle, 10);
    ms_tui_lane_layout(s, n, 0, 0.0, 10, out); /* no wall time: nothing to place */
    assert_memory_equal(out, idle, 10);

    /* Edges that land exactly on column boundaries (0.3 * 10 is 3.0000000000000004 in
     * doubles) cover exactly their columns. */
    ms_live_span e[] = {span(0, MS_LANE_COMM, 0.3, 0.5)};
    const uint8_t want_e[10] = {I, I, I, M, M, I, I, I, I, I};
    ms_tui_lane_layout(e, 1, 0, 1.0, 10, out);
    assert_memory_equal(out, want_e, 10);

    /* A 45 ms step over 9 columns (5 ms each): compute 0-20 ms, comm 20-30, idle after. */
    ms_live_span f[] = {span(3, MS_LANE_COMPUTE, 0.000, 0.020),
                        span(3, MS_LANE_COMM, 0.020, 0.030)};
    const uint8_t want_f[9] = {C, C, C, C, M, M, I, I, I};
    uint8_t out9[9];
    ms_tui_lane_layout(f, 2, 3, 0.045, 9, out9);
    assert_memory_equal(out9, want_f, 9);
}

static ms_live_pipe_block block(int stage, int action, int mb, int chunk, double t0, double t1) {
    return (ms_live_pipe_block){.stage = (int16_t)stage,
                                .action = (uint8_t)action,
                                .chunk = (uint8_t)chunk,
                                .mb = mb,
                                .t0 = t0,
                                .t1 = t1};
}

static void test_pipe_layout(void **state) {
    (void)state;
    /* 1 s over 10 columns: column c's midpoint is 0.1c + 0.05. */
    ms_live_pipe_block b[] = {
        block(0, MS_PIPE_F, 0, 0, 0.0, 0.3),   /* 0: midpoints 0.05 .. 0.25: columns 0-2 */
        block(0, MS_PIPE_B, 0, 0, 0.3, 0.42),  /* 1: 0.35: column 3 */
        block(0, MS_PIPE_F, 1, 0, 0.42, 0.44), /* 2: no midpoint; its start's column 4 is idle */
        block(0, MS_PIPE_F, 2, 0, 0.5, 0.51),  /* 3: no midpoint, and column 5 is block 4's */
        block(0, MS_PIPE_B, 1, 0, 0.51, 0.58), /* 4: 0.55: column 5 */
        block(0, MS_PIPE_W, 3, 0, 0.9, 1.2),   /* 5: 0.95: column 9, clipped at the end */
        block(1, MS_PIPE_F, 0, 0, 0.0, 1.0),   /* 6: another stage's lane */
        block(0, MS_PIPE_F, 4, 0, 0.7, 0.6),   /* 7: backwards: ignored */
    };
    int n = (int)(sizeof b / sizeof b[0]);
    int32_t out[10];
    const int32_t want0[10] = {0, 0, 0, 1, 2, 4, -1, -1, -1, 5};
    ms_tui_pipe_layout(b, n, 0, 1.0, 10, out);
    assert_memory_equal(out, want0, sizeof want0);
    const int32_t want1[10] = {6, 6, 6, 6, 6, 6, 6, 6, 6, 6};
    ms_tui_pipe_layout(b, n, 1, 1.0, 10, out);
    assert_memory_equal(out, want1, sizeof want1);
    const int32_t idle[10] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    ms_tui_pipe_layout(b, n, 2, 1.0, 10, out); /* a stage without blocks: all bubble */
    assert_memory_equal(out, idle, sizeof idle);
    ms_tui_pipe_layout(b, n, 0, 0.0, 10, out); /* no wall time */
    assert_memory_equal(out, idle, sizeof idle);

    /* A lane with two columns for each of its blocks gives each two at least, in time order,
     * as near their times as that allows: a stalled action does not hide its neighbours. */
    ms_live_pipe_block m[] = {
        block(0, MS_PIPE_F, 0, 0, 0.0, 0.01),  /* tiny */
        block(0, MS_PIPE_F, 1, 0, 0.01, 0.9),  /* a stall: most of the step */
        block(0, MS_PIPE_B, 0, 0, 0.9, 0.905), /* tiny */
        block(0, MS_PIPE_B, 1, 0, 0.995, 1.0), /* tiny, at the very end */
    };
    int32_t lane[10];
    /* forward: F0 0-1, F1 2-8, B0 9-10, B1 11-12 (past the lane); backward: B1 back to 8-9,
     * B0 to 6-7, F1 ends at 6 */
    const int32_t want_min[10] = {0, 0, 1, 1, 1, 1, 2, 2, 3, 3};
    ms_tui_pipe_layout(m, 4, 0, 1.0, 10, lane);
    assert_memory_equal(lane, want_min, sizeof want_min);
    /* with fewer than two columns per block the layout stays proportional, and short blocks
     * next to a long one may not show */
    int32_t narrow[7];
    const int32_t want_narrow[7] = {1, 1, 1, 1, 1, 1, 2}; /* F0 and B1 hidden */
    ms_tui_pipe_layout(m, 4, 0, 1.0, 7, narrow);
    assert_memory_equal(narrow, want_narrow, sizeof want_narrow);

    char label[16];
    ms_tui_pipe_label(&b[0], 1, label, sizeof label);
    assert_string_equal(label, "F0");
    ms_tui_pipe_label(&b[5], 1, label, sizeof label);
    assert_string_equal(label, "W3");
    ms_live_pipe_block c = block(0, MS_PIPE_B, 12, 1, 0, 1);
    ms_tui_pipe_label(&c, 2, label, sizeof label); /* virtual stages: the chunk too */
    assert_string_equal(label, "B12.1");
    /* Fill glyphs tell F, B and W apart in both glyph sets, one column each. */
    for (int u = 0; u < 2; u++) {
        const ms_tui_glyphs *g = ms_tui_glyphs_get(u);
        assert_true(strcmp(g->pipe[0], g->pipe[1]) && strcmp(g->pipe[1], g->pipe[2]) &&
                    strcmp(g->pipe[0], g->pipe[2]));
        if (!u)
            for (int a = 0; a < 3; a++) assert_int_equal(strlen(g->pipe[a]), 1);
    }
}

static void test_nice_step(void **state) {
    (void)state;
    assert_true(fabs(ms_tui_nice_step(0.045, 5) - 0.01) < 1e-15); /* 9 ms -> 10 ms */
    assert_true(fabs(ms_tui_nice_step(1.0, 4) - 0.5) < 1e-15);    /* 0.25 -> 0.5 */
    assert_true(fabs(ms_tui_nice_step(7.0, 7) - 1.0) < 1e-15);    /* exactly 1 */
    assert_true(fabs(ms_tui_nice_step(3.0, 2) - 2.0) < 1e-15);    /* 1.5 -> 2 */
    assert_true(fabs(ms_tui_nice_step(2e-6, 1) - 2e-6) < 1e-20);
    assert_true(ms_tui_nice_step(0, 5) == 0);
    assert_true(ms_tui_nice_step(1, 0) == 0);
}

#define FMT(fn, v, want)                                                                           \
    do {                                                                                           \
        char b_[64];                                                                               \
        assert_string_equal(fn((v), b_, sizeof b_), (want));                                       \
    } while (0)

static void test_format(void **state) {
    (void)state;
    FMT(ms_tui_fmt_bytes, 0, "0 B");
    FMT(ms_tui_fmt_bytes, 512, "512 B");
    FMT(ms_tui_fmt_bytes, 1536, "1.50 KiB");
    FMT(ms_tui_fmt_bytes, 10.0 * 1024 * 1024, "10.0 MiB");
    FMT(ms_tui_fmt_bytes, 12.34 * 1024 * 1024, "12.3 MiB");
    FMT(ms_tui_fmt_bytes, 150.0 * 1024 * 1024 * 1024, "150 GiB");
    FMT(ms_tui_fmt_bytes, -1, "-");
    FMT(ms_tui_fmt_bytes, NAN, "-");

    FMT(ms_tui_fmt_seconds, 0, "0 s");
    FMT(ms_tui_fmt_seconds, 8.5e-7, "850 ns");
    FMT(ms_tui_fmt_seconds, 2.5e-5, "25.0 us");
    FMT(ms_tui_fmt_seconds, 1.5e-3, "1.50 ms");
    FMT(ms_tui_fmt_seconds, 0.1234, "123 ms");
    FMT(ms_tui_fmt_seconds, 2, "2.00 s");
    FMT(ms_tui_fmt_seconds, 75, "1m15s");
    FMT(ms_tui_fmt_seconds, 4000, "1h06m");
    FMT(ms_tui_fmt_seconds, INFINITY, "-");

    FMT(ms_tui_fmt_rate, 2.5e9, "2.50 GB/s");
    FMT(ms_tui_fmt_rate, 999, "999 B/s");
    FMT(ms_tui_fmt_rate, 12.5e6, "12.5 MB/s");
    FMT(ms_tui_fmt_flops, 1.234e12, "1.23 TFLOP/s");
    FMT(ms_tui_fmt_flops, 5e8, "500 MFLOP/s");
    FMT(ms_tui_fmt_flops, 0, "0 FLOP/s");
    FMT(ms_tui_fmt_count, 950, "950");
    FMT(ms_tui_fmt_count, 12345, "12.3k");
    FMT(ms_tui_fmt_count, 1.234e6, "1.23M");

    FMT(ms_tui_fmt_bytes_short, 0, "0");
    FMT(ms_tui_fmt_bytes_short, 512, "512B");
    FMT(ms_tui_fmt_bytes_short, 1536, "1.5K");
    FMT(ms_tui_fmt_bytes_short, 12.0 * 1024 * 1024, "12M");
    FMT(ms_tui_fmt_bytes_short, 1.2 * 1024 * 1024 * 1024, "1.2G");
    FMT(ms_tui_fmt_seconds_short, 0, "0");
    FMT(ms_tui_fmt_seconds_short, 1.2e-7, "120ns");
    FMT(ms_tui_fmt_seconds_short, 8.5e-6, "8.5us");
    FMT(ms_tui_fmt_seconds_short, 1.2e-3, "1.2ms");
    FMT(ms_tui_fmt_seconds_short, 0.012, "12ms");
    FMT(ms_tui_fmt_seconds_short, 1.5, "1.5s");
    FMT(ms_tui_fmt_seconds_short, 150, "2.5m");
    FMT(ms_tui_fmt_seconds_short, 12 * 3600, "12h");
    FMT(ms_tui_fmt_rate_short, 2.5e9, "2.5G");
    FMT(ms_tui_fmt_rate_short, 8.5e8, "850M");
    FMT(ms_tui_fmt_rate_short, -2, "-");
    /* Heatmap cells are at most 5 columns wide. */
    char b[64];
    double probes[] = {1, 999, 1023, 9.99 * 1024, 999.4 * 1024 * 1024, 1e15};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        assert_true(strlen(ms_tui_fmt_bytes_short(probes[i], b, sizeof b)) <= 5);
        assert_true(strlen(ms_tui_fmt_rate_short(probes[i], b, sizeof b)) <= 5);
        assert_true(strlen(ms_tui_fmt_seconds_short(probes[i] * 1e-9, b, sizeof b)) <= 5);
    }
}

static void ascii_only(const char *s) {
    for (; *s; s++) assert_true((unsigned char)*s < 0x80);
}

static void test_environment(void **state) {
    (void)state;
    assert_true(ms_tui_want_utf8("UTF-8", NULL));
    assert_true(ms_tui_want_utf8("utf8", NULL));
    assert_false(ms_tui_want_utf8("ANSI_X3.4-1968", NULL));
    assert_false(ms_tui_want_utf8(NULL, NULL));
    assert_false(ms_tui_want_utf8("UTF-8", "1"));
    assert_true(ms_tui_want_utf8("UTF-8", "0"));
    assert_true(ms_tui_want_utf8("UTF-8", ""));
    assert_false(ms_tui_want_mono(NULL));
    assert_false(ms_tui_want_mono(""));
    assert_true(ms_tui_want_mono("1"));

    /* The ASCII set is ASCII; each set's glyphs are distinct where they must be. */
    const ms_tui_glyphs *a = ms_tui_glyphs_get(false), *u = ms_tui_glyphs_get(true);
    assert_false(a->utf8);
    assert_true(u->utf8);
    for (int i = 0; i < 8; i++) ascii_only(a->spark[i]);
    for (int i = 0; i < 5; i++) ascii_only(a->shade[i]);
    for (int i = 0; i < 9; i++) ascii_only(a->eighth[i]);
    for (int i = 0; i < 3; i++) ascii_only(a->lane[i]);
    const char *frame[] = {a->hline, a->vline, a->tl, a->tr, a->bl, a->br, a->tick, a->arrow};
    for (size_t i = 0; i < sizeof frame / sizeof frame[0]; i++) ascii_only(frame[i]);
    assert_string_not_equal(a->lane[MS_TUI_CELL_COMPUTE], a->lane[MS_TUI_CELL_COMM]);
    for (int i = 1; i < 8; i++) assert_string_not_equal(u->spark[i - 1], u->spark[i]);
}

static void test_redact(void **state) {
    (void)state;
    char out[128];
    ms_tui_redact_token("dashboard: http://127.0.0.1:8123/?token=0123abcd", out, sizeof out);
    assert_string_equal(out, "dashboard: http://127.0.0.1:8123/?token=***");
    ms_tui_redact_token("a?token=x&b=1 token=y z", out, sizeof out);
    assert_string_equal(out, "a?token=***&b=1 token=*** z");
    ms_tui_redact_token("nothing here", out, sizeof out);
    assert_string_equal(out, "nothing here");
    ms_tui_redact_token("token=abcdef", out, 8); /* truncated, still hidden */
    assert_string_equal(out, "token=*");
}

static void test_parse_url(void **state) {
    (void)state;
    char base[256], token[128];
    ms_error err = {0};
    assert_int_equal(ms_tui_parse_url("http://127.0.0.1:8123/?token=abc", base, sizeof base, token,
                                      sizeof token, &err),
                     MS_OK);
    assert_string_equal(base, "http://127.0.0.1:8123");
    assert_string_equal(token, "abc");
    assert_int_equal(
        ms_tui_parse_url("http://127.0.0.1:8123", base, sizeof base, token, sizeof token, &err),
        MS_OK);
    assert_string_equal(base, "http://127.0.0.1:8123");
    assert_string_equal(token, "");
    assert_int_equal(ms_tui_parse_url("HTTPS://host:1/x?a=1&token=a%2Fb&c=2#token=no", base,
                                      sizeof base, token, sizeof token, &err),
                     MS_OK);
    assert_string_equal(base, "HTTPS://host:1");
    assert_string_equal(token, "a/b");

    assert_int_equal(ms_tui_parse_url("ftp://x/", base, sizeof base, token, sizeof token, &err),
                     MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'ftp://x/'"));
    assert_non_null(strstr(err.msg, "http://127.0.0.1:PORT/?token=TOKEN"));
    assert_int_equal(
        ms_tui_parse_url("127.0.0.1:8123", base, sizeof base, token, sizeof token, &err),
        MS_ERR_INVALID);
    assert_int_equal(
        ms_tui_parse_url("http:///?token=a", base, sizeof base, token, sizeof token, &err),
        MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no host"));
    assert_int_equal(ms_tui_parse_url("http://a b/", base, sizeof base, token, sizeof token, &err),
                     MS_ERR_INVALID);
    assert_int_equal(ms_tui_parse_url("", base, sizeof base, token, sizeof token, &err),
                     MS_ERR_INVALID);
    char small[4];
    assert_int_equal(
        ms_tui_parse_url("http://h/?token=abcdef", base, sizeof base, small, sizeof small, &err),
        MS_ERR_INVALID);
}

/* The highlight follows its suggestion, not its row: an advisor round re-sorts the list (the
 * gains move as it learns) and Enter must accept what the user is looking at. */
static void test_selection_follows_id(void **state) {
    (void)state;
    static ms_snapshot s; /* large: the suggestion table */
    ms_tui t;
    memset(&t, 0, sizeof t);
    const int32_t order1[3] = {5, 7, 9}, order2[3] = {9, 5, 7};
    s.n_suggestions = 3;
    for (int i = 0; i < 3; i++) s.suggestions[i].id = order1[i];
    assert_int_equal(ms_tui_selected_suggestion(&t, &s)->id, 5); /* none yet: the first row */
    t.selected = 2, t.selected_id = 9;                           /* the user moved down twice */
    for (int i = 0; i < 3; i++) s.suggestions[i].id = order2[i];
    assert_int_equal(ms_tui_selected_suggestion(&t, &s)->id, 9); /* now row 0, still 9 */
    assert_int_equal(t.selected, 0);
    t.selected_id = 5;
    assert_int_equal(ms_tui_selected_suggestion(&t, &s)->id, 5);
    assert_int_equal(t.selected, 1);
    /* it left the list: the highlight stays on its row, on the suggestion now there */
    s.suggestions[1].id = 11;
    assert_int_equal(ms_tui_selected_suggestion(&t, &s)->id, 11);
    s.n_suggestions = 1;
    t.selected_id = 99;
    t.selected = 2;
    assert_int_equal(ms_tui_selected_suggestion(&t, &s)->id, 9);
    s.n_suggestions = 0;
    assert_null(ms_tui_selected_suggestion(&t, &s));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_scale_level), cmocka_unit_test(test_spark_index),
    cmocka_unit_test(test_sparkline),   cmocka_unit_test(test_hbar),
    cmocka_unit_test(test_lane_layout), cmocka_unit_test(test_pipe_layout),
    cmocka_unit_test(test_nice_step),   cmocka_unit_test(test_format),
    cmocka_unit_test(test_environment), cmocka_unit_test(test_redact),
    cmocka_unit_test(test_parse_url),   cmocka_unit_test(test_selection_follows_id),
};

MT_MAIN("tui", tests)

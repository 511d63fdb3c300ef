/* draw.h - the pure parts of drawing: glyph sets, the colour scale, sparklines, bars, the
 * timeline's lane layout, axis ticks and number formatting. Nothing here touches the
 * terminal, so every answer can be checked by hand (tests/test_tui.c).
 *
 * Strings written into caller buffers are NUL-terminated and truncated to the capacity;
 * glyphs are one terminal column each, in both glyph sets.
 */
#ifndef MS_TUI_DRAW_H
#define MS_TUI_DRAW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "profiler/live.h"

/* One glyph set: UTF-8 block elements, or plain ASCII for terminals and locales that
 * cannot show them. */
typedef struct ms_tui_glyphs {
    bool utf8;
    const char *spark[8];  /* sparkline levels, lowest first */
    const char *shade[5];  /* monochrome heat levels: none, light .. full */
    const char *eighth[9]; /* bar ends: 0/8 .. 8/8 of a column ("" = no column) */
    const char *lane[3];   /* timeline cells: idle, compute, comm (ms_tui_cell) */
    const char *pipe[3];   /* pipeline blocks' fill: F, B, W (ms_ev_pipe_action) */
    const char *hline, *vline, *tl, *tr, *bl, *br;
    const char *tick;  /* a mark on the time axis */
    const char *arrow; /* "->" or a one-column arrow */
} ms_tui_glyphs;

const ms_tui_glyphs *ms_tui_glyphs_get(bool utf8);

/* Whether to draw UTF-8 glyphs: the locale's codeset (nl_langinfo(CODESET)) is UTF-8 and
 * MESHSCOPE_ASCII (ascii_env, may be NULL) is unset, empty or "0". */
bool ms_tui_want_utf8(const char *codeset, const char *ascii_env);
/* Whether colours are off: NO_COLOR (no_color_env, may be NULL) is set to a non-empty
 * value (no-color.org). */
bool ms_tui_want_mono(const char *no_color_env);

/* The colour scale: level 0 for v <= 0 (no traffic), else levels 1..nlevels-1 split
 * (0, vmax] into equal bins, each bin's upper edge inclusive: level = ceil(v / vmax *
 * (nlevels - 1)), at least 1, at most nlevels - 1. Non-finite values or vmax <= 0 give 0. */
int ms_tui_scale_level(double v, double vmax, int nlevels);

/* Sparkline level 0..7 of v within [lo, hi]: round((v - lo) / (hi - lo) * 7), clamped.
 * A flat series (hi <= lo) sits in the middle (3). */
int ms_tui_spark_index(double v, double lo, double hi);

/* A sparkline of n values in at most `width` columns: one value per column when n <=
 * width (left-aligned, n columns), else column c shows the mean of values
 * [c*n/width, (c+1)*n/width). Levels are relative to the min and max of the column values;
 * non-finite values are skipped and a column without any value is a space. Returns the
 * number of columns written into out (cap bytes, glyphs of g). */
int ms_tui_sparkline(const double *v, int n, int width, const ms_tui_glyphs *g, char *out,
                     size_t cap);

/* A horizontal bar of `width` columns filled to frac (clamped to [0, 1]) in eighths of a
 * column: round(frac * width * 8) eighths, full columns first, then the partial glyph
 * (UTF-8 only; ASCII rounds the partial column to full at >= 4/8). Returns the columns
 * written (the filled part only; the caller pads). */
int ms_tui_hbar(double frac, int width, const ms_tui_glyphs *g, char *out, size_t cap);

/* Timeline cells. */
typedef enum ms_tui_cell { MS_TUI_CELL_IDLE, MS_TUI_CELL_COMPUTE, MS_TUI_CELL_COMM } ms_tui_cell;

/* Lays rank's spans (others are skipped) over `cols` columns covering [0, wall_s): column c
 * is [c, c+1) * wall_s / cols. A span covers every column it overlaps (at least the one
 * holding its start), so a short span is never invisible; communication is painted over
 * compute; columns no span touches are idle. Spans past the end are clipped. out[cols]. */
void ms_tui_lane_layout(const ms_live_span *spans, int n, int rank, double wall_s, int cols,
                        uint8_t *out);

/* Lays stage's pipeline blocks (others are skipped) over `cols` columns covering [0, wall_s):
 * out[c] is the index into b of the block drawn in column c, or -1 (idle: the bubble).
 * Column c is [c, c+1) * wall_s / cols. When the lane has two columns for each of its blocks,
 * every block gets two at least (room for "F3": a user sees every action however short),
 * placed as near its time as that allows, in order. Otherwise a column shows the block covering
 * its midpoint (the later one if two do); a block covering none (shorter than a column) shows
 * in the column holding its start when nothing else is drawn there. Blocks past the end are
 * clipped. out[cols]. */
void ms_tui_pipe_layout(const ms_live_pipe_block *b, int n, int stage, double wall_s, int cols,
                        int32_t *out);

/* A block's label: action and micro-batch, "F3", "B3", "W3"; with virtual stages (v > 1) the
 * local chunk too, "F3.1" (as the trace names the slice). */
void ms_tui_pipe_label(const ms_live_pipe_block *b, int v, char *out, size_t cap);

/* A readable axis step for `range` split into at most max_ticks intervals: 1, 2 or 5
 * times a power of ten. 0 for range <= 0. */
double ms_tui_nice_step(double range, int max_ticks);

/* Copies text into out (cap bytes) with the value of every "token=" hidden as "token=***",
 * so that a dashboard address in a message does not put its token on the screen. */
void ms_tui_redact_token(const char *text, char *out, size_t cap);

/* Three significant digits with a unit. Binary prefixes for bytes ("0 B", "512 B",
 * "1.50 KiB", "12.3 MiB", "150 GiB"); SI prefixes for rates ("2.50 GB/s") and FLOP/s
 * ("1.23 TFLOP/s"); seconds as "0 s", "850 ns", "25.0 us", "1.50 ms", "2.00 s", "1m15s".
 * Negative or non-finite values print "-". Returns buf. */
char *ms_tui_fmt_bytes(double bytes, char *buf, size_t cap);
char *ms_tui_fmt_seconds(double s, char *buf, size_t cap);
char *ms_tui_fmt_rate(double bytes_per_s, char *buf, size_t cap);
char *ms_tui_fmt_flops(double flops_per_s, char *buf, size_t cap);
/* Plain counts with SI prefixes: "950", "12.3k", "1.23M". */
char *ms_tui_fmt_count(double v, char *buf, size_t cap);
/* At most 5 columns, for heatmap cells (two significant digits below 10, none after the
 * point above): bytes "512B", "1.5K", "12M", "1.2G" (binary); seconds "120ns", "8.5us",
 * "1.2ms", "12ms", "1.5s", "2.5m", "12h"; rates "2.5G", "850M" (SI, per second implied). Zero
 * prints "0"; negative or non-finite values "-". */
char *ms_tui_fmt_bytes_short(double bytes, char *buf, size_t cap);
char *ms_tui_fmt_seconds_short(double s, char *buf, size_t cap);
char *ms_tui_fmt_rate_short(double bytes_per_s, char *buf, size_t cap);

#endif

/* draw.c - glyph sets, the colour scale, sparklines, bars, lane layout, axis steps and
 * number formatting (see draw.h). Pure: no terminal, no allocation. */
#include "tui/draw.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const ms_tui_glyphs utf8_glyphs = {
    .utf8 = true,
    .spark = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"},
    .shade = {" ", "\u2591", "\u2592", "\u2593", "\u2588"},
    .eighth = {"", "\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589", "\u2588"},
    .lane = {"\u00b7", "\u2588", "\u2588"},
    .pipe = {"\u2588", "\u2593", "\u2592"},
    .hline = "\u2500",
    .vline = "\u2502",
    .tl = "\u250c",
    .tr = "\u2510",
    .bl = "\u2514",
    .br = "\u2518",
    .tick = "\u2575",
    .arrow = "\u2192",
};

static const ms_tui_glyphs ascii_glyphs = {
    .utf8 = false,
    .spark = {"_", ".", "-", "~", "=", "+", "*", "#"},
    .shade = {" ", ".", ":", "*", "#"},
    .eighth = {"", "", "", "", "#", "#", "#", "#", "#"},
    .lane = {".", "=", "#"},
    .pipe = {"#", "=", "-"},
    .hline = "-",
    .vline = "|",
    .tl = "+",
    .tr = "+",
    .bl = "+",
    .br = "+",
    .tick = "|",
    .arrow = ">",
};

const ms_tui_glyphs *ms_tui_glyphs_get(bool utf8) {
    return utf8 ? &utf8_glyphs : &ascii_glyphs;
}

bool ms_tui_want_utf8(const char *codeset, const char *ascii_env) {
    if (ascii_env && ascii_env[0] && strcmp(ascii_env, "0") != 0) return false;
    if (!codeset) return false;
    return !strcasecmp(codeset, "UTF-8") || !strcasecmp(codeset, "UTF8");
}

bool ms_tui_want_mono(const char *no_color_env) {
    return no_color_env && no_color_env[0];
}

int ms_tui_scale_level(double v, double vmax, int nlevels) {
    if (nlevels < 2 || !isfinite(v) || !isfinite(vmax) || v <= 0 || vmax <= 0) return 0;
    int lvl = (int)ceil(v / vmax * (nlevels - 1) - 1e-9);
    if (lvl < 1) lvl = 1;
    if (lvl > nlevels - 1) lvl = nlevels - 1;
    return lvl;
}

int ms_tui_spark_index(double v, double lo, double hi) {
    if (!(hi > lo)) return 3;
    double f = (v - lo) / (hi - lo);
    if (!(f > 0)) f = 0; /* also NaN */
    if (f > 1) f = 1;
    return (int)floor(f * 7 + 0.5);
}

/* Appends s to out[*len] within cap; false (nothing written) when it does not fit. */
static bool append(char *out, size_t cap, size_t *len, const char *s) {
    size_t n = strlen(s);
    if (*len + n + 1 > cap) return false;
    memcpy(out + *len, s, n + 1);
    *len += n;
    return true;
}

int ms_tui_sparkline(const double *v, int n, int width, const ms_tui_glyphs *g, char *out,
                     size_t cap) {
    if (cap) out[0] = '\0';
    if (!v || n <= 0 || width <= 0 || cap == 0) return 0;
    int cols = n <= width ? n : width;
    double lo = INFINITY, hi = -INFINITY;
    /* Two passes over the columns: the range, then the glyphs (no buffer of column values,
     * so any width works). */
    for (int pass = 0; pass < 2; pass++) {
        size_t len = 0;
        for (int c = 0; c < cols; c++) {
            int a = (int)((int64_t)c * n / cols), b = (int)((int64_t)(c + 1) * n / cols);
            double sum = 0;
            int k = 0;
            for (int i = a; i < b; i++)
                if (isfinite(v[i])) sum += v[i], k++;
            if (pass == 0) {
                if (k) lo = fmin(lo, sum / k), hi = fmax(hi, sum / k);
                continue;
            }
            const char *glyph = k ? g->spark[ms_tui_spark_index(sum / k, lo, hi)] : " ";
            if (!append(out, cap, &len, glyph)) return c;
        }
        if (pass == 1) return cols;
    }
    return 0;
}

int ms_tui_hbar(double frac, int width, const ms_tui_glyphs *g, char *out, size_t cap) {
    if (cap) out[0] = '\0';
    if (width <= 0 || cap == 0) return 0;
    if (!(frac > 0)) frac = 0;
    if (frac > 1) frac = 1;
    long eighths = lround(frac * width * 8);
    int full = (int)(eighths / 8), rem = (int)(eighths % 8);
    size_t len = 0;
    int cols = 0;
    for (; cols < full; cols++)
        if (!append(out, cap, &len, g->eighth[8])) return cols;
    if (rem && cols < width && g->eighth[rem][0]) {
        if (!append(out, cap, &len, g->eighth[rem])) return cols;
        cols++;
    }
    return cols;
}

void ms_tui_lane_layout(const ms_live_span *spans, int n, int rank, double wall_s, int cols,
                        uint8_t *out) {
    if (cols <= 0) return;
    memset(out, MS_TUI_CELL_IDLE, (size_t)cols);
    if (!spans || !(wall_s > 0)) return;
    double scale = cols / wall_s;
    /* Compute first, communication second, so that communication wins a shared column. */
    static const uint8_t order[2] = {MS_LANE_COMPUTE, MS_LANE_COMM};
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            const ms_live_span *s = &spans[i];
            if (s->rank != rank || s->kind != order[pass] || !(s->t1 >= s->t0)) continue;
            double x0 = floor(s->t0 * scale + 1e-9), x1 = ceil(s->t1 * scale - 1e-9);
            if (x1 <= x0) x1 = x0 + 1;
            if (x0 < 0) x0 = 0;
            if (x1 > cols) x1 = cols;
            uint8_t cell = order[pass] == MS_LANE_COMM ? MS_TUI_CELL_COMM : MS_TUI_CELL_COMPUTE;
            for (int c = (int)x0; c < (int)x1; c++) out[c] = cell;
        }
    }
}

/* Columns every block gets when the lane has room for all: its action and micro-batch. */
#define PIPE_MIN_COLS 2
/* Blocks of one lane laid out at that minimum at most (more fall back to proportional). */
#define PIPE_MIN_BLOCKS 512

/* The proportional layout: columns whose midpoint lies in a block; a block covering no
 * midpoint keeps the column of its start when nothing else is there. */
static void pipe_layout_proportional(const ms_live_pipe_block *b, int n, int stage, double scale,
                                     int cols, int32_t *out) {
    for (int i = 0; i < n; i++) {
        if (b[i].stage != stage || !(b[i].t1 >= b[i].t0)) continue;
        double c0 = ceil(b[i].t0 * scale - 0.5), c1 = ceil(b[i].t1 * scale - 0.5);
        if (c0 < 0) c0 = 0;
        if (c1 > cols) c1 = cols;
        for (int c = (int)c0; c < (int)c1; c++) out[c] = i;
    }
    for (int i = 0; i < n; i++) {
        if (b[i].stage != stage || !(b[i].t1 >= b[i].t0)) continue;
        double c0 = ceil(b[i].t0 * scale - 0.5), c1 = ceil(b[i].t1 * scale - 0.5);
        if (c1 > c0) continue;
        double c = floor(b[i].t0 * scale);
        if (c < 0) c = 0;
        if (c >= cols) c = cols - 1;
        if (out[(int)c] < 0) out[(int)c] = i;
    }
}

/* The lane's k blocks (indices idx, by start) at PIPE_MIN_COLS columns at least, each as near
 * its proportional place as that allows: a forward pass pushes blocks right of their
 * predecessors, a backward pass pulls them back inside the lane. Needs k * PIPE_MIN_COLS <=
 * cols. */
static void pipe_layout_min_width(const ms_live_pipe_block *b, const int *idx, int k, double scale,
                                  int cols, int32_t *out) {
    int c0[PIPE_MIN_BLOCKS], c1[PIPE_MIN_BLOCKS];
    for (int j = 0; j < k; j++) {
        const ms_live_pipe_block *x = &b[idx[j]];
        double s = ceil(x->t0 * scale - 0.5), e = ceil(x->t1 * scale - 0.5);
        c0[j] = s < 0 ? 0 : s > cols ? cols : (int)s;
        c1[j] = e < 0 ? 0 : e > cols ? cols : (int)e;
        if (j > 0 && c0[j] < c1[j - 1]) c0[j] = c1[j - 1];
        if (c1[j] < c0[j] + PIPE_MIN_COLS) c1[j] = c0[j] + PIPE_MIN_COLS;
    }
    for (int j = k - 1; j >= 0; j--) {
        int limit = j == k - 1 ? cols : c0[j + 1];
        if (c1[j] > limit) c1[j] = limit;
        if (c0[j] > c1[j] - PIPE_MIN_COLS) c0[j] = c1[j] - PIPE_MIN_COLS;
    }
    for (int j = 0; j < k; j++)
        for (int c = c0[j]; c < c1[j]; c++) out[c] = idx[j];
}

void ms_tui_pipe_layout(const ms_live_pipe_block *b, int n, int stage, double wall_s, int cols,
                        int32_t *out) {
    if (cols <= 0) return;
    for (int c = 0; c < cols; c++) out[c] = -1;
    if (!b || !(wall_s > 0)) return;
    const double scale = cols / wall_s;
    int k = 0;
    for (int i = 0; i < n; i++) k += b[i].stage == stage && b[i].t1 >= b[i].t0;
    if (k == 0) return;
    if ((long)k * PIPE_MIN_COLS > cols || k > PIPE_MIN_BLOCKS) {
        pipe_layout_proportional(b, n, stage, scale, cols, out);
        return;
    }
    int idx[PIPE_MIN_BLOCKS];
    k = 0;
    for (int i = 0; i < n; i++)
        if (b[i].stage == stage && b[i].t1 >= b[i].t0) idx[k++] = i;
    for (int j = 1; j < k; j++) /* by start: a lane holds a few dozen blocks, already near order */
        for (int m = j; m > 0 && b[idx[m - 1]].t0 > b[idx[m]].t0; m--) {
            int t = idx[m];
            idx[m] = idx[m - 1];
            idx[m - 1] = t;
        }
    pipe_layout_min_width(b, idx, k, scale, cols, out);
}

void ms_tui_pipe_label(const ms_live_pipe_block *b, int v, char *out, size_t cap) {
    static const char act[3] = {'F', 'B', 'W'};
    char a = b->action < 3 ? act[b->action] : '?';
    if (v > 1)
        snprintf(out, cap, "%c%d.%d", a, (int)b->mb, (int)b->chunk);
    else
        snprintf(out, cap, "%c%d", a, (int)b->mb);
}

void ms_tui_redact_token(const char *text, char *out, size_t cap) {
    if (!cap) return;
    size_t n = 0;
    while (*text && n + 1 < cap) {
        if (!strncmp(text, "token=", 6)) {
            const char *rep = "token=***";
            for (; *rep && n + 1 < cap; rep++) out[n++] = *rep;
            text += 6;
            while (*text && *text != '&' && *text != ' ' && *text != '#' && *text != '"' &&
                   *text != '\'')
                text++;
            continue;
        }
        out[n++] = *text++;
    }
    out[n] = '\0';
}

double ms_tui_nice_step(double range, int max_ticks) {
    if (!(range > 0) || max_ticks < 1) return 0;
    double raw = range / max_ticks;
    double mag = pow(10, floor(log10(raw)));
    double norm = raw / mag;
    double f = norm <= 1 + 1e-9 ? 1 : norm <= 2 + 1e-9 ? 2 : norm <= 5 + 1e-9 ? 5 : 10;
    return f * mag;
}

/* --- numbers ------------------------------------------------------------------------------ */

/* v in [0, 1000) or [0, 1024) with three significant digits. */
static char *fmt3(double v, const char *unit, char *buf, size_t cap) {
    if (v == 0)
        snprintf(buf, cap, "0 %s", unit);
    else if (v < 9.995)
        snprintf(buf, cap, "%.2f %s", v, unit);
    else if (v < 99.95)
        snprintf(buf, cap, "%.1f %s", v, unit);
    else
        snprintf(buf, cap, "%.0f %s", v, unit);
    return buf;
}

/* Two significant digits below 10, whole numbers above, no space before the unit. */
static char *fmt2(double v, const char *unit, char *buf, size_t cap) {
    if (v == 0)
        snprintf(buf, cap, "0");
    else if (v < 9.95)
        snprintf(buf, cap, "%.1f%s", v, unit);
    else
        snprintf(buf, cap, "%.0f%s", v, unit);
    return buf;
}

/* Scales v by `base` until it is below base (or the units run out). */
static double scale_down(double v, double base, int nunits, int *unit) {
    *unit = 0;
    while (v >= base && *unit < nunits - 1) v /= base, (*unit)++;
    return v;
}

static bool bad(double v) {
    return !isfinite(v) || v < 0;
}

char *ms_tui_fmt_bytes(double bytes, char *buf, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bad(bytes)) return snprintf(buf, cap, "-"), buf;
    int u;
    double v = scale_down(bytes, 1024, 6, &u);
    if (u == 0) return snprintf(buf, cap, "%.0f B", v), buf;
    return fmt3(v, units[u], buf, cap);
}

char *ms_tui_fmt_rate(double bytes_per_s, char *buf, size_t cap) {
    static const char *units[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"};
    if (bad(bytes_per_s)) return snprintf(buf, cap, "-"), buf;
    int u;
    double v = scale_down(bytes_per_s, 1000, 6, &u);
    return fmt3(v, units[u], buf, cap);
}

char *ms_tui_fmt_flops(double flops_per_s, char *buf, size_t cap) {
    static const char *units[] = {"FLOP/s",  "kFLOP/s", "MFLOP/s", "GFLOP/s",
                                  "TFLOP/s", "PFLOP/s", "EFLOP/s"};
    if (bad(flops_per_s)) return snprintf(buf, cap, "-"), buf;
    int u;
    double v = scale_down(flops_per_s, 1000, 7, &u);
    return fmt3(v, units[u], buf, cap);
}

char *ms_tui_fmt_count(double v, char *buf, size_t cap) {
    static const char *units[] = {"", "k", "M", "G", "T", "P"};
    if (bad(v)) return snprintf(buf, cap, "-"), buf;
    int u;
    double x = scale_down(v, 1000, 6, &u);
    if (u == 0) return snprintf(buf, cap, "%.0f", x), buf;
    fmt3(x, units[u], buf, cap);
    /* fmt3 puts a space before the unit; counts read better without it. */
    char *sp = strchr(buf, ' ');
    if (sp) memmove(sp, sp + 1, strlen(sp));
    return buf;
}

char *ms_tui_fmt_seconds(double s, char *buf, size_t cap) {
    if (bad(s)) return snprintf(buf, cap, "-"), buf;
    if (s == 0) return snprintf(buf, cap, "0 s"), buf;
    if (s < 1e-6) return fmt3(s * 1e9, "ns", buf, cap);
    if (s < 1e-3) return fmt3(s * 1e6, "us", buf, cap);
    if (s < 1) return fmt3(s * 1e3, "ms", buf, cap);
    if (s < 60) return fmt3(s, "s", buf, cap);
    long whole = lround(s);
    if (whole < 3600) return snprintf(buf, cap, "%ldm%02lds", whole / 60, whole % 60), buf;
    return snprintf(buf, cap, "%ldh%02ldm", whole / 3600, whole / 60 % 60), buf;
}

char *ms_tui_fmt_bytes_short(double bytes, char *buf, size_t cap) {
    static const char *units[] = {"B", "K", "M", "G", "T", "P"};
    if (bad(bytes)) return snprintf(buf, cap, "-"), buf;
    int u;
    double v = scale_down(bytes, 1024, 6, &u);
    if (u == 0) return snprintf(buf, cap, bytes == 0 ? "0" : "%.0fB", v), buf;
    return fmt2(v, units[u], buf, cap);
}

char *ms_tui_fmt_seconds_short(double s, char *buf, size_t cap) {
    if (bad(s)) return snprintf(buf, cap, "-"), buf;
    if (s == 0) return snprintf(buf, cap, "0"), buf;
    if (s < 1e-6) return fmt2(s * 1e9, "ns", buf, cap);
    if (s < 1e-3) return fmt2(s * 1e6, "us", buf, cap);
    if (s < 1) return fmt2(s * 1e3, "ms", buf, cap);
    if (s < 60) return fmt2(s, "s", buf, cap);
    if (s < 3600) return fmt2(s / 60, "m", buf, cap);
    return fmt2(s / 3600, "h", buf, cap);
}

char *ms_tui_fmt_rate_short(double bytes_per_s, char *buf, size_t cap) {
    static const char *units[] = {"", "k", "M", "G", "T", "P"};
    if (bad(bytes_per_s)) return snprintf(buf, cap, "-"), buf;
    int u;
    double v = scale_down(bytes_per_s, 1000, 6, &u);
    return fmt2(v, units[u], buf, cap);
}

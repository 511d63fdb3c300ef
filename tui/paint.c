/* paint.c - colour pairs and clipped drawing primitives (see paint.h). */
#include "tui/paint.h"

#include "tui/draw.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <wchar.h>

/* Pair numbers: roles from 1, heat levels from HEAT_PAIR0, micro-batches from MB_PAIR0. */
#define HEAT_PAIR0 32
#define MB_PAIR0   (HEAT_PAIR0 + MS_TUI_HEAT_MAX)

typedef struct pal_entry {
    short fg, bg;
    attr_t extra;
} pal_entry;

/* -1 = the terminal's default colour (use_default_colors). */
static const pal_entry pal256[MS_ROLE_COUNT] = {
    [MS_ROLE_NORMAL] = {-1, -1, 0},      [MS_ROLE_HEADER] = {255, 24, 0},
    [MS_ROLE_TAB] = {250, 24, 0},        [MS_ROLE_TAB_ACTIVE] = {16, 214, A_BOLD},
    [MS_ROLE_TITLE] = {110, -1, A_BOLD}, [MS_ROLE_DIM] = {244, -1, 0},
    [MS_ROLE_VALUE] = {255, -1, A_BOLD}, [MS_ROLE_COMPUTE] = {71, -1, 0},
    [MS_ROLE_COMM] = {203, -1, 0},       [MS_ROLE_IDLE] = {240, -1, 0},
    [MS_ROLE_GOOD] = {114, -1, 0},       [MS_ROLE_WARN] = {214, -1, A_BOLD},
    [MS_ROLE_BAD] = {196, -1, A_BOLD},   [MS_ROLE_SELECT] = {16, 110, 0},
    [MS_ROLE_INUSE] = {75, -1, 0},       [MS_ROLE_PEAK] = {176, -1, 0},
};

static const pal_entry pal8[MS_ROLE_COUNT] = {
    [MS_ROLE_NORMAL] = {-1, -1, 0},
    [MS_ROLE_HEADER] = {COLOR_WHITE, COLOR_BLUE, A_BOLD},
    [MS_ROLE_TAB] = {COLOR_WHITE, COLOR_BLUE, 0},
    [MS_ROLE_TAB_ACTIVE] = {COLOR_BLACK, COLOR_YELLOW, A_BOLD},
    [MS_ROLE_TITLE] = {COLOR_CYAN, -1, A_BOLD},
    [MS_ROLE_DIM] = {-1, -1, A_DIM},
    [MS_ROLE_VALUE] = {-1, -1, A_BOLD},
    [MS_ROLE_COMPUTE] = {COLOR_GREEN, -1, 0},
    [MS_ROLE_COMM] = {COLOR_RED, -1, A_BOLD},
    [MS_ROLE_IDLE] = {-1, -1, A_DIM},
    [MS_ROLE_GOOD] = {COLOR_GREEN, -1, 0},
    [MS_ROLE_WARN] = {COLOR_YELLOW, -1, A_BOLD},
    [MS_ROLE_BAD] = {COLOR_RED, -1, A_BOLD},
    [MS_ROLE_SELECT] = {COLOR_BLACK, COLOR_CYAN, 0},
    [MS_ROLE_INUSE] = {COLOR_CYAN, -1, 0},
    [MS_ROLE_PEAK] = {COLOR_MAGENTA, -1, 0},
};

/* Monochrome: patterns only. */
static const attr_t mono[MS_ROLE_COUNT] = {
    [MS_ROLE_NORMAL] = A_NORMAL,
    [MS_ROLE_HEADER] = A_REVERSE,
    [MS_ROLE_TAB] = A_REVERSE,
    [MS_ROLE_TAB_ACTIVE] = A_BOLD,
    [MS_ROLE_TITLE] = A_BOLD,
    [MS_ROLE_DIM] = A_NORMAL,
    [MS_ROLE_VALUE] = A_BOLD,
    [MS_ROLE_COMPUTE] = A_NORMAL,
    [MS_ROLE_COMM] = A_BOLD,
    [MS_ROLE_IDLE] = A_NORMAL,
    [MS_ROLE_GOOD] = A_NORMAL,
    [MS_ROLE_WARN] = A_BOLD,
    [MS_ROLE_BAD] = A_BOLD | A_UNDERLINE,
    [MS_ROLE_SELECT] = A_REVERSE,
    [MS_ROLE_INUSE] = A_NORMAL,
    [MS_ROLE_PEAK] = A_BOLD,
};

/* The colour scale, cold to hot: a dark cell for "nothing", then purple through teal and
 * green to yellow (perceptually ordered, readable for the common colour blindnesses). */
static const short heat256_bg[MS_TUI_HEAT_MAX] = {236, 54, 61, 67, 31, 36, 71, 113, 148, 220};
static const short heat256_fg[MS_TUI_HEAT_MAX] = {246, 255, 255, 255, 255, 255, 16, 16, 16, 16};
static const short heat8_bg[6] = {-1, COLOR_BLUE, COLOR_CYAN, COLOR_GREEN, COLOR_YELLOW, COLOR_RED};
static const short heat8_fg[6] = {-1,          COLOR_WHITE, COLOR_BLACK,
                                  COLOR_BLACK, COLOR_BLACK, COLOR_WHITE};

/* Micro-batches of the pipeline view: neighbours in hue far apart, so consecutive micro-batches
 * (drawn side by side) never look alike. */
static const short mb256[MS_TUI_MB_MAX] = {75, 214, 114, 176, 222, 44, 209, 147};
static const short mb8[6] = {COLOR_CYAN,    COLOR_YELLOW, COLOR_GREEN,
                             COLOR_MAGENTA, COLOR_BLUE,   COLOR_RED};

void ms_tui_paint_init(ms_tui_paint *p, bool utf8, bool mono_wanted) {
    memset(p, 0, sizeof *p);
    p->g = ms_tui_glyphs_get(utf8);
    p->palette = MS_PALETTE_MONO;
    if (!mono_wanted && has_colors() && start_color() == OK) {
        use_default_colors();
        if (COLORS >= 256 && COLOR_PAIRS > MB_PAIR0 + MS_TUI_MB_MAX)
            p->palette = MS_PALETTE_256;
        else if (COLORS >= 8 && COLOR_PAIRS > MB_PAIR0 + 6)
            p->palette = MS_PALETTE_8;
    }
    if (p->palette == MS_PALETTE_MONO) {
        for (int r = 0; r < MS_ROLE_COUNT; r++) p->role[r] = mono[r];
        p->n_heat = 5;
        p->heat_glyphs = true;
        static const attr_t heat[5] = {A_NORMAL, A_NORMAL, A_NORMAL, A_BOLD, A_BOLD};
        for (int l = 0; l < 5; l++) p->heat[l] = heat[l];
        p->n_mb = 2; /* alternate plain and bold; the fill glyphs tell F, B and W apart */
        p->mb[0] = A_NORMAL;
        p->mb[1] = A_BOLD;
        return;
    }
    const pal_entry *pal = p->palette == MS_PALETTE_256 ? pal256 : pal8;
    for (int r = 0; r < MS_ROLE_COUNT; r++) {
        if (pal[r].fg == -1 && pal[r].bg == -1) {
            p->role[r] = pal[r].extra;
            continue;
        }
        init_pair((short)(1 + r), pal[r].fg, pal[r].bg);
        p->role[r] = COLOR_PAIR(1 + r) | pal[r].extra;
    }
    p->n_mb = p->palette == MS_PALETTE_256 ? MS_TUI_MB_MAX : 6;
    for (int j = 0; j < p->n_mb; j++) {
        init_pair((short)(MB_PAIR0 + j), p->palette == MS_PALETTE_256 ? mb256[j] : mb8[j], -1);
        p->mb[j] = COLOR_PAIR(MB_PAIR0 + j);
    }
    if (p->palette == MS_PALETTE_256) {
        p->n_heat = MS_TUI_HEAT_MAX;
        for (int l = 0; l < p->n_heat; l++) {
            init_pair((short)(HEAT_PAIR0 + l), heat256_fg[l], heat256_bg[l]);
            p->heat[l] = COLOR_PAIR(HEAT_PAIR0 + l);
        }
    } else {
        p->n_heat = 6;
        for (int l = 0; l < p->n_heat; l++) {
            init_pair((short)(HEAT_PAIR0 + l), heat8_fg[l], heat8_bg[l]);
            p->heat[l] = COLOR_PAIR(HEAT_PAIR0 + l) | (l ? 0 : A_DIM);
        }
    }
}

/* Copies at most maxw columns of s into out (cap bytes), replacing what a terminal must not
 * receive by '?'. Returns the columns. */
static int sanitize(const ms_tui_paint *p, const char *s, int maxw, char *out, size_t cap) {
    size_t len = 0;
    int cols = 0;
    mbstate_t st;
    memset(&st, 0, sizeof st);
    while (*s && cols < maxw && len + 5 < cap) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x80) {
            out[len++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
            s++, cols++;
            continue;
        }
        if (!p->g->utf8) {
            out[len++] = '?';
            s++, cols++;
            continue;
        }
        wchar_t wc;
        size_t n = mbrtowc(&wc, s, strlen(s), &st);
        if (n == (size_t)-1 || n == (size_t)-2 || n == 0) {
            memset(&st, 0, sizeof st);
            out[len++] = '?';
            s++, cols++;
            continue;
        }
        int w = wcwidth(wc);
        if (w < 0) {
            out[len++] = '?';
            cols++;
        } else if (w > 0) {
            if (cols + w > maxw) break;
            memcpy(out + len, s, n);
            len += n;
            cols += w;
        }
        s += n;
    }
    out[len] = '\0';
    return cols;
}

int ms_tui_text_width(const ms_tui_paint *p, const char *s) {
    char buf[1024];
    return sanitize(p, s ? s : "", 255, buf, sizeof buf);
}

int ms_tui_text(const ms_tui_paint *p, int y, int x, int maxw, attr_t a, const char *s) {
    if (!s || y < 0 || y >= LINES || x < 0 || x >= COLS) return 0;
    if (maxw > COLS - x) maxw = COLS - x;
    if (maxw <= 0) return 0;
    char buf[2048];
    if (maxw > 400) maxw = 400;
    int cols = sanitize(p, s, maxw, buf, sizeof buf);
    attrset(a);
    mvaddstr(y, x, buf);
    attrset(A_NORMAL);
    return cols;
}

int ms_tui_textf(const ms_tui_paint *p, int y, int x, int maxw, attr_t a, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ms_tui_text(p, y, x, maxw, a, buf);
}

int ms_tui_text_right(const ms_tui_paint *p, int y, int x_end, int maxw, attr_t a, const char *s) {
    int w = ms_tui_text_width(p, s);
    if (w > maxw) w = maxw;
    return ms_tui_text(p, y, x_end - w, w, a, s);
}

void ms_tui_repeat(int y, int x, int n, attr_t a, const char *glyph) {
    if (y < 0 || y >= LINES || x < 0) return;
    if (n > COLS - x) n = COLS - x;
    if (n <= 0) return;
    attrset(a);
    move(y, x);
    for (int i = 0; i < n; i++) addstr(glyph);
    attrset(A_NORMAL);
}

void ms_tui_box(const ms_tui_paint *p, int y, int x, int h, int w, const char *title) {
    if (h < 2 || w < 2) return;
    const ms_tui_glyphs *g = p->g;
    attr_t a = p->role[MS_ROLE_TITLE];
    ms_tui_repeat(y, x, 1, a, g->tl);
    ms_tui_repeat(y, x + 1, w - 2, a, g->hline);
    ms_tui_repeat(y, x + w - 1, 1, a, g->tr);
    for (int r = 1; r < h - 1; r++) {
        ms_tui_repeat(y + r, x, 1, a, g->vline);
        ms_tui_repeat(y + r, x + 1, w - 2, A_NORMAL, " ");
        ms_tui_repeat(y + r, x + w - 1, 1, a, g->vline);
    }
    ms_tui_repeat(y + h - 1, x, 1, a, g->bl);
    ms_tui_repeat(y + h - 1, x + 1, w - 2, a, g->hline);
    ms_tui_repeat(y + h - 1, x + w - 1, 1, a, g->br);
    if (title && title[0] && w > 6) ms_tui_textf(p, y, x + 2, w - 4, a, " %s ", title);
}

void ms_tui_bar(const ms_tui_paint *p, int y, int x, int width, double frac, attr_t a,
                attr_t rest) {
    if (width <= 0) return;
    char buf[1024];
    if (width > 250) width = 250;
    int cols = ms_tui_hbar(frac, width, p->g, buf, sizeof buf);
    ms_tui_text(p, y, x, cols, a, buf);
    /* The empty part: a dim shade keeps the bar's extent visible. */
    const char *empty = p->g->utf8 ? p->g->shade[1] : ".";
    ms_tui_repeat(y, x + cols, width - cols, rest, empty);
}

void ms_tui_time_axis(const ms_tui_paint *p, int y, int x, int lw, double wall) {
    ms_tui_repeat(y, x, lw, p->role[MS_ROLE_DIM], p->g->hline);
    double step = ms_tui_nice_step(wall, lw / 12 > 1 ? lw / 12 : 1);
    if (step <= 0) return;
    int last_end = -1;
    for (int k = 0;; k++) {
        double tt = k * step;
        if (tt > wall * (1 + 1e-9)) break;
        int col = (int)(tt / wall * lw + 0.5);
        if (col >= lw) col = lw - 1;
        ms_tui_repeat(y, x + col, 1, p->role[MS_ROLE_DIM], p->g->tick);
        char lab[32];
        if (k == 0)
            snprintf(lab, sizeof lab, "0");
        else
            ms_tui_fmt_seconds_short(tt, lab, sizeof lab);
        int lw_lab = (int)strlen(lab);
        int lx = col - lw_lab / 2;
        if (lx < 0) lx = 0;
        if (lx + lw_lab > lw) lx = lw - lw_lab;
        if (lx > last_end) {
            ms_tui_text(p, y + 1, x + lx, lw_lab, p->role[MS_ROLE_DIM], lab);
            last_end = lx + lw_lab;
        }
    }
}

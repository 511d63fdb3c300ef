/* paint.h - drawing on the terminal: colour pairs built once for the terminal's palette
 * (256 colours, 8 colours, or none), and clipped text, boxes and bars in the glyph set
 * the locale allows. Used only on the UI thread, between initscr/newterm and endwin.
 */
#ifndef MS_TUI_PAINT_H
#define MS_TUI_PAINT_H

#include <stdbool.h>

// clang-format off
#include <curses.h>
// clang-format on

#include "tui/draw.h"

/* What a piece of text is, rather than its colour: each role maps to attributes once. */
typedef enum ms_tui_role {
    MS_ROLE_NORMAL,
    MS_ROLE_HEADER,     /* the top bar */
    MS_ROLE_TAB,        /* a screen name in the top bar */
    MS_ROLE_TAB_ACTIVE, /* the current screen */
    MS_ROLE_TITLE,      /* section titles */
    MS_ROLE_DIM,        /* labels, axes, hints */
    MS_ROLE_VALUE,      /* numbers worth reading */
    MS_ROLE_COMPUTE,
    MS_ROLE_COMM,
    MS_ROLE_IDLE,
    MS_ROLE_GOOD,
    MS_ROLE_WARN,
    MS_ROLE_BAD,
    MS_ROLE_SELECT, /* the selected table row */
    MS_ROLE_INUSE,  /* memory in use */
    MS_ROLE_PEAK,   /* memory peak */
    MS_ROLE_COUNT
} ms_tui_role;

typedef enum ms_tui_palette { MS_PALETTE_MONO, MS_PALETTE_8, MS_PALETTE_256 } ms_tui_palette;

#define MS_TUI_HEAT_MAX 10
#define MS_TUI_MB_MAX   8 /* micro-batch colours (they repeat past this; labels say which) */

typedef struct ms_tui_paint {
    ms_tui_palette palette;
    const ms_tui_glyphs *g;
    attr_t role[MS_ROLE_COUNT];
    int n_heat;                   /* levels of the colour scale, level 0 = nothing */
    attr_t heat[MS_TUI_HEAT_MAX]; /* a cell at each level (background colour or pattern) */
    bool heat_glyphs;             /* monochrome: levels drawn as shade glyphs */
    int n_mb;                     /* micro-batch colours: micro-batch j is mb[j % n_mb] */
    attr_t mb[MS_TUI_MB_MAX];
} ms_tui_paint;

/* Chooses the palette (mono when `mono` or the terminal has no colours) and builds the
 * colour pairs. Call once after newterm. */
void ms_tui_paint_init(ms_tui_paint *p, bool utf8, bool mono);

/* Text at (y, x), at most maxw columns and never past the screen's right edge; control
 * characters, invalid UTF-8 and (in ASCII mode) every non-ASCII byte print as '?'. Returns
 * the columns written. */
int ms_tui_text(const ms_tui_paint *p, int y, int x, int maxw, attr_t a, const char *s);
int ms_tui_textf(const ms_tui_paint *p, int y, int x, int maxw, attr_t a, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Text right-aligned so that it ends just before column x_end. */
int ms_tui_text_right(const ms_tui_paint *p, int y, int x_end, int maxw, attr_t a, const char *s);
/* Columns the text takes (after the same replacements as ms_tui_text). */
int ms_tui_text_width(const ms_tui_paint *p, const char *s);
/* `n` copies of a one-column glyph. */
void ms_tui_repeat(int y, int x, int n, attr_t a, const char *glyph);
/* A frame with a title in its top edge; the inside is cleared. */
void ms_tui_box(const ms_tui_paint *p, int y, int x, int h, int w, const char *title);
/* A time axis `lw` columns wide from 0 to `wall` seconds: a rule with ticks on row y, their
 * labels on row y + 1 where they fit without overlapping. */
void ms_tui_time_axis(const ms_tui_paint *p, int y, int x, int lw, double wall);
/* A bar of `width` columns: the filled part in `a`, the rest blank in `rest`. */
void ms_tui_bar(const ms_tui_paint *p, int y, int x, int width, double frac, attr_t a, attr_t rest);

#endif

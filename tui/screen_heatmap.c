/* screen_heatmap.c - screen 2: who talks to whom. A rank x rank matrix (row: the sending
 * rank, column: the receiving rank) of bytes, time in collectives, or their ratio, over the
 * analysed window, for all traffic or one mesh dim; coloured on a scale from the largest
 * cell, with the value in each cell when it fits, axis labels and a legend.
 */
#include <stdio.h>
#include <string.h>

#include "tui/tui_impl.h"

#define LABEL_W 8 /* "src r12 " */

static const char *const mode_names[MS_HEAT_MODE_COUNT] = {"bytes sent", "time in collectives",
                                                           "bandwidth (bytes / seconds)"};

static const ms_heatmap *current_map(const ms_tui *t, const ms_snapshot *s) {
    const ms_analysis *an = &s->analysis;
    if (t->heat_dim >= 0 && t->heat_dim < an->n_dims) return &an->per_dim[t->heat_dim];
    return &an->all;
}

static double cell_value(ms_tui_heat_mode mode, const ms_heatmap *m, int i, int j) {
    size_t k = (size_t)i * (size_t)m->nranks + (size_t)j;
    double b = m->bytes ? m->bytes[k] : 0, sec = m->seconds ? m->seconds[k] : 0;
    switch (mode) {
        case MS_HEAT_BYTES:
            return b;
        case MS_HEAT_TIME:
            return sec;
        default:
            return sec > 0 ? b / sec : 0;
    }
}

static char *cell_text(ms_tui_heat_mode mode, double v, char *buf, size_t cap) {
    if (v <= 0) return snprintf(buf, cap, "-"), buf;
    switch (mode) {
        case MS_HEAT_BYTES:
            return ms_tui_fmt_bytes_short(v, buf, cap);
        case MS_HEAT_TIME:
            return ms_tui_fmt_seconds_short(v, buf, cap);
        default:
            return ms_tui_fmt_rate_short(v, buf, cap);
    }
}

static char *long_text(ms_tui_heat_mode mode, double v, char *buf, size_t cap) {
    switch (mode) {
        case MS_HEAT_BYTES:
            return ms_tui_fmt_bytes(v, buf, cap);
        case MS_HEAT_TIME:
            return ms_tui_fmt_seconds(v, buf, cap);
        default:
            return ms_tui_fmt_rate(v, buf, cap);
    }
}

/* One cell of `cw - 1` columns at level lvl with centred text. */
static void draw_cell(const ms_tui_paint *p, int y, int x, int cw, int lvl, const char *text) {
    int inner = cw - 1;
    attr_t a = p->heat[lvl];
    ms_tui_repeat(y, x, inner, a, p->heat_glyphs ? p->g->shade[lvl] : " ");
    int tw = ms_tui_text_width(p, text);
    if (tw <= inner) ms_tui_text(p, y, x + (inner - tw) / 2, tw, a, text);
}

static void draw_heatmap(ms_tui *t, const ms_snapshot *s, int y, int h, int w) {
    const ms_tui_paint *p = &t->paint;
    const ms_analysis *an = &s->analysis;
    int end = y + h;
    if (t->heat_dim >= an->n_dims) t->heat_dim = -1;
    const ms_heatmap *m = current_map(t, s);
    char dim[64];
    if (t->heat_dim < 0)
        snprintf(dim, sizeof dim, "all traffic");
    else
        snprintf(dim, sizeof dim, "mesh dim %d (%s)", t->heat_dim,
                 an->dim_names[t->heat_dim][0] ? an->dim_names[t->heat_dim] : "?");
    ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_TITLE], "Heatmap: %s, %s, steps %lld-%lld",
                 mode_names[t->heat_mode], dim, (long long)an->step_lo, (long long)an->step_hi);
    int n = m->nranks;
    if (n <= 0 || !m->bytes) {
        ms_tui_text(p, y + 1, 2, w - 2, p->role[MS_ROLE_DIM],
                    "no traffic analysed yet: the heatmap fills in after the first steps");
        return;
    }
    double vmax = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double v = cell_value(t->heat_mode, m, i, j);
            if (v > vmax) vmax = v;
        }

    /* Cell width: as wide as fits, 3..8 columns (a value shows from 5 on). */
    int avail = w - LABEL_W - 1;
    int cw = avail / n;
    if (cw > 8) cw = 8;
    if (cw < 3) cw = 3;
    int ncols = avail / cw;
    if (ncols > n) ncols = n;
    int nrows = end - y - 4; /* header row, legend (2), a scroll hint */
    if (nrows < 1) nrows = 1;
    if (nrows > n) nrows = n;
    if (t->hscroll > n - ncols) t->hscroll = n - ncols;
    if (t->hscroll < 0) t->hscroll = 0;
    int r0 = ms_tui_clamp_scroll(&t->scroll[1], n, nrows), c0 = t->hscroll;

    /* Column labels: the receiving ranks. */
    ms_tui_text(p, y, 0, LABEL_W, p->role[MS_ROLE_DIM], "src\\dst");
    for (int j = 0; j < ncols; j++) {
        char lab[16];
        snprintf(lab, sizeof lab, "r%d", c0 + j);
        int lw = (int)strlen(lab);
        int x = LABEL_W + j * cw + (cw - 1 - lw) / 2;
        if (lw <= cw - 1) ms_tui_text(p, y, x, lw, p->role[MS_ROLE_DIM], lab);
    }
    y++;
    for (int i = 0; i < nrows; i++) {
        int r = r0 + i;
        ms_tui_textf(p, y, 0, LABEL_W, p->role[MS_ROLE_DIM], "%*sr%-*d", 4, "", LABEL_W - 6, r);
        for (int j = 0; j < ncols; j++) {
            int c = c0 + j;
            double v = cell_value(t->heat_mode, m, r, c);
            int lvl = ms_tui_scale_level(v, vmax, p->n_heat);
            char txt[16] = "";
            if (cw - 1 >= 4 || v <= 0) cell_text(t->heat_mode, v, txt, sizeof txt);
            draw_cell(p, y, LABEL_W + j * cw, cw, lvl, txt);
        }
        y++;
    }
    if (ncols < n || nrows < n)
        ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_DIM],
                     "rows %d-%d, columns %d-%d of %d ranks (arrows scroll)", r0, r0 + nrows - 1,
                     c0, c0 + ncols - 1, n);
    y++;
    if (y >= end) return;

    /* Legend: a swatch per level, then what the ends mean. */
    int x = ms_tui_text(p, y, 0, w, p->role[MS_ROLE_DIM], "scale ");
    for (int l = 0; l < p->n_heat && x + 2 < w; l++) {
        ms_tui_repeat(y, x, 2, p->heat[l], p->heat_glyphs ? p->g->shade[l] : " ");
        x += 2;
    }
    char a[32], b[32];
    ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_NORMAL], "  0 %s %s  (%d levels, %s each)",
                 p->g->arrow, long_text(t->heat_mode, vmax, a, sizeof a), p->n_heat - 1,
                 long_text(t->heat_mode, vmax / (p->n_heat - 1), b, sizeof b));
}

static ms_tui_key_result heatmap_key(ms_tui *t, const ms_snapshot *s, int ch) {
    switch (ch) {
        case 'b':
            t->heat_mode = MS_HEAT_BYTES;
            return MS_KEY_HANDLED;
        case 't':
            t->heat_mode = MS_HEAT_TIME;
            return MS_KEY_HANDLED;
        case 'w':
            t->heat_mode = MS_HEAT_BUSBW;
            return MS_KEY_HANDLED;
        case 'd':
            t->heat_dim = t->heat_dim + 1 < s->analysis.n_dims ? t->heat_dim + 1 : -1;
            if (s->analysis.n_dims == 0) ms_tui_flash(t, MS_ROLE_DIM, "no mesh dims seen yet");
            return MS_KEY_HANDLED;
        case KEY_LEFT:
            t->hscroll--;
            return MS_KEY_HANDLED;
        case KEY_RIGHT:
            t->hscroll++;
            return MS_KEY_HANDLED;
        default:
            return MS_KEY_IGNORED;
    }
}

const ms_tui_screen ms_tui_screen_heatmap = {
    .name = "heatmap",
    .keys = "b:bytes t:time w:bandwidth d:dim",
    .draw = draw_heatmap,
    .key = heatmap_key,
};

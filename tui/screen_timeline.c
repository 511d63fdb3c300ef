/* screen_timeline.c - screen 3: the last complete step, one lane per rank, compute and
 * communication spans laid over the screen's width (ms_tui_lane_layout), idle elsewhere,
 * with a time axis and each rank's totals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "tui/tui_impl.h"

#define LANE_X   6  /* "r12  " */
#define TOTALS_W 36 /* " compute 12.3 ms  comm 1.50 ms" */

typedef struct iv {
    double t0, t1;
} iv;

static int cmp_iv(const void *a, const void *b) {
    double x = ((const iv *)a)->t0, y = ((const iv *)b)->t0;
    return x < y ? -1 : x > y;
}

/* Length of the union of rank's spans of `kind` (-1: any kind) within [0, wall]. */
static double union_s(const ms_snapshot *s, int rank, int kind, iv *buf) {
    int n = 0;
    for (int i = 0; i < s->n_timeline; i++) {
        const ms_live_span *sp = &s->timeline[i];
        if (sp->rank != rank || (kind >= 0 && sp->kind != kind)) continue;
        double a = sp->t0 < 0 ? 0 : sp->t0,
               b = sp->t1 > s->timeline_wall_s ? s->timeline_wall_s : sp->t1;
        if (b > a) buf[n++] = (iv){a, b};
    }
    qsort(buf, (size_t)n, sizeof *buf, cmp_iv);
    double total = 0, cur0 = 0, cur1 = -1;
    for (int i = 0; i < n; i++) {
        if (buf[i].t0 > cur1) {
            if (cur1 > cur0) total += cur1 - cur0;
            cur0 = buf[i].t0, cur1 = buf[i].t1;
        } else if (buf[i].t1 > cur1) {
            cur1 = buf[i].t1;
        }
    }
    if (cur1 > cur0) total += cur1 - cur0;
    return total;
}

static const char *cell_glyph(const ms_tui_paint *p, int cell) {
    /* Without colour, compute and communication need different glyphs. */
    if (p->palette == MS_PALETTE_MONO && p->g->utf8 && cell == MS_TUI_CELL_COMPUTE)
        return p->g->shade[2];
    return p->g->lane[cell];
}

static void draw_timeline(ms_tui *t, const ms_snapshot *s, int y, int h, int w) {
    const ms_tui_paint *p = &t->paint;
    int end = y + h;
    int n = ms_tui_nranks(s);
    char a[32], b[32], c[32];
    if (s->timeline_step < 0 || s->n_timeline <= 0 || !(s->timeline_wall_s > 0) || n <= 0) {
        ms_tui_text(p, y, 0, w, p->role[MS_ROLE_TITLE], "Timeline");
        ms_tui_text(p, y + 2, 2, w - 2, p->role[MS_ROLE_DIM],
                    "no complete step recorded yet: lanes appear after the first step");
        return;
    }
    ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_TITLE], "Timeline of step %lld (%s wall, %d ranks)",
                 (long long)s->timeline_step, ms_tui_fmt_seconds(s->timeline_wall_s, a, sizeof a),
                 n);
    int x = 2;
    x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_COMPUTE], "%s compute",
                      cell_glyph(p, MS_TUI_CELL_COMPUTE));
    x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_COMM], "   %s communication",
                      cell_glyph(p, MS_TUI_CELL_COMM));
    x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_IDLE], "   %s idle",
                      cell_glyph(p, MS_TUI_CELL_IDLE));
    ms_tui_text(p, y, x, w - x, p->role[MS_ROLE_DIM],
                "   (a span covers every column it touches; communication drawn on top)");
    y += 2;

    bool totals = w - LANE_X - TOTALS_W >= 30;
    int lw = w - LANE_X - 1 - (totals ? TOTALS_W : 0);
    if (lw > 1000) lw = 1000;
    int visible = end - y - 3;
    if (visible < 1) visible = 1;
    int first = ms_tui_clamp_scroll(&t->scroll[2], n, visible);
    if (totals)
        ms_tui_textf(p, y - 1, LANE_X + lw + 1, TOTALS_W, p->role[MS_ROLE_DIM], "%9s %9s %9s",
                     "compute", "comm", "idle");
    uint8_t *cells = xmalloc((size_t)lw);
    iv *buf = xmalloc(((size_t)s->n_timeline + 1) * sizeof *buf);
    for (int r = first; r < n && r < first + visible; r++) {
        ms_tui_textf(p, y, 0, LANE_X, p->role[MS_ROLE_DIM], "r%d", r);
        ms_tui_lane_layout(s->timeline, s->n_timeline, r, s->timeline_wall_s, lw, cells);
        /* Runs of one kind are drawn with one call. */
        for (int c0 = 0; c0 < lw;) {
            int c1 = c0;
            while (c1 < lw && cells[c1] == cells[c0]) c1++;
            ms_tui_role role = cells[c0] == MS_TUI_CELL_COMM      ? MS_ROLE_COMM
                               : cells[c0] == MS_TUI_CELL_COMPUTE ? MS_ROLE_COMPUTE
                                                                  : MS_ROLE_IDLE;
            ms_tui_repeat(y, LANE_X + c0, c1 - c0, p->role[role], cell_glyph(p, cells[c0]));
            c0 = c1;
        }
        if (totals) {
            double comp = union_s(s, r, MS_LANE_COMPUTE, buf);
            double comm = union_s(s, r, MS_LANE_COMM, buf);
            double busy = union_s(s, r, -1, buf);
            ms_tui_textf(p, y, LANE_X + lw + 1, TOTALS_W, p->role[MS_ROLE_DIM], "%9s %9s %9s",
                         ms_tui_fmt_seconds(comp, a, sizeof a),
                         ms_tui_fmt_seconds(comm, b, sizeof b),
                         ms_tui_fmt_seconds(s->timeline_wall_s - busy, c, sizeof c));
        }
        y++;
    }
    free(buf);
    free(cells);
    ms_tui_time_axis(p, y, LANE_X, lw, s->timeline_wall_s);
    y += 2;
    if (n > visible && y < end)
        ms_tui_textf(p, y, 0, w, p->role[MS_ROLE_DIM], "ranks %d-%d of %d (Up/Down)", first,
                     first + visible - 1, n);
}

const ms_tui_screen ms_tui_screen_timeline = {
    .name = "timeline",
    .keys = "Up/Down:ranks",
    .draw = draw_timeline,
    .key = NULL,
};

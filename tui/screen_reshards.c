/* screen_reshards.c - screen 4: what the placements cost. The reshard table of the analysed
 * window (transition, count, bytes, time, as the analysis sorts it: most time first), then
 * the collectives with the highest bus bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/core/xalloc.h"
#include "tui/tui_impl.h"

static int cmp_busbw(const void *a, const void *b) {
    double x = ((const ms_busbw_row *)a)->busbw_gbs, y = ((const ms_busbw_row *)b)->busbw_gbs;
    return x > y ? -1 : x < y;
}

static int draw_reshard_table(ms_tui *t, const ms_snapshot *s, int y, int rows, int w) {
    const ms_tui_paint *p = &t->paint;
    const ms_analysis *an = &s->analysis;
    ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_TITLE],
                 "Reshards, steps %lld-%lld (most time first; summed over ranks)",
                 (long long)an->step_lo, (long long)an->step_hi);
    if (an->n_reshards <= 0) {
        ms_tui_text(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "no reshards in the window");
        return y;
    }
    int tw = w - 2 - 48;
    if (tw > 60) tw = 60;
    if (tw < 16) tw = 16;
    ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "%-*s %7s %11s %10s %10s", tw,
                 "transition", "count", "bytes", "time", "per call");
    int visible = rows - 2;
    if (visible < 1) visible = 1;
    int first = ms_tui_clamp_scroll(&t->scroll[3], an->n_reshards, visible);
    for (int i = first; i < an->n_reshards && i < first + visible; i++) {
        const ms_reshard_row *r = &an->reshards[i];
        char a[32], b[32], c[32];
        int x = 2 + ms_tui_text(p, y, 2, tw, p->role[MS_ROLE_NORMAL], r->transition);
        if (x < 2 + tw) x = 2 + tw;
        ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_VALUE], " %7d %11s %10s %10s", r->count,
                     ms_tui_fmt_bytes(r->bytes, a, sizeof a),
                     ms_tui_fmt_seconds(r->seconds, b, sizeof b),
                     ms_tui_fmt_seconds(r->count ? r->seconds / r->count : 0, c, sizeof c));
        y++;
    }
    if (an->n_reshards > visible)
        ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "rows %d-%d of %d (Up/Down)",
                     first + 1, first + visible < an->n_reshards ? first + visible : an->n_reshards,
                     an->n_reshards);
    return y;
}

static void draw_busbw(ms_tui *t, const ms_snapshot *s, int y, int rows, int w) {
    const ms_tui_paint *p = &t->paint;
    const ms_analysis *an = &s->analysis;
    ms_tui_text(p, y++, 0, w, p->role[MS_ROLE_TITLE],
                "Top collectives by bus bandwidth (nccl-tests factors)");
    if (an->n_busbw <= 0) {
        ms_tui_text(p, y, 2, w - 2, p->role[MS_ROLE_DIM], "no collectives in the window");
        return;
    }
    ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "%-16s %5s %11s %7s %10s %12s",
                 "collective", "ranks", "size", "count", "mean time", "busbw");
    ms_busbw_row *rows_sorted = xmalloc((size_t)an->n_busbw * sizeof *rows_sorted);
    memcpy(rows_sorted, an->busbw, (size_t)an->n_busbw * sizeof *rows_sorted);
    qsort(rows_sorted, (size_t)an->n_busbw, sizeof *rows_sorted, cmp_busbw);
    for (int i = 0; i < an->n_busbw && i < rows - 2; i++) {
        const ms_busbw_row *r = &rows_sorted[i];
        char a[32], b[32], c[32];
        ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_NORMAL], "%-16s %5d %11s %7d %10s %12s",
                     r->coll < MS_COLL_KIND_COUNT ? ms_coll_name((ms_coll_kind)r->coll) : "?",
                     r->group_size, ms_tui_fmt_bytes((double)r->bytes, a, sizeof a), r->count,
                     ms_tui_fmt_seconds(r->mean_s, b, sizeof b),
                     ms_tui_fmt_rate(r->busbw_gbs * 1e9, c, sizeof c));
    }
    free(rows_sorted);
}

static void draw_reshards(ms_tui *t, const ms_snapshot *s, int y, int h, int w) {
    int end = y + h;
    /* The reshard table gets what it needs up to 60% of the height; the rest lists the
     * collectives. */
    int want = s->analysis.n_reshards + 3;
    int top = h * 3 / 5;
    if (want < top) top = want;
    if (top < 4) top = 4;
    y = draw_reshard_table(t, s, y, top - 1, w) + 1;
    if (end - y >= 3) draw_busbw(t, s, y, end - y, w);
}

const ms_tui_screen ms_tui_screen_reshards = {
    .name = "reshards",
    .keys = "Up/Down:rows",
    .draw = draw_reshards,
    .key = NULL,
};

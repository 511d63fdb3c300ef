/* screen_overview.c - screen 1: where the job is and where its time goes.
 *
 *   step, strategy, loss and tokens/s with sparklines over the step history, step time,
 *   achieved FLOP/s; the step breakdown (compute / exposed communication / idle on the
 *   slowest rank, mean over the analysed window) as one stacked bar; communication overlap
 *   per rank (HTA's ratio) as a table; stragglers; the job's last event.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "tui/tui_impl.h"

/* A label in dim, then a value. Returns the x after both. */
static int label_value(const ms_tui_paint *p, int y, int x, int w, const char *label,
                       const char *value) {
    x += ms_tui_text(p, y, x, w - x, p->role[MS_ROLE_DIM], label);
    x += ms_tui_text(p, y, x, w - x, p->role[MS_ROLE_VALUE], value);
    return x;
}

/* A sparkline of one field of the step history. */
static int history_spark(const ms_tui_paint *p, const ms_snapshot *s, int y, int x, int width,
                         bool tokens) {
    if (s->n_history <= 0 || width <= 0) return 0;
    double *v = xmalloc((size_t)s->n_history * sizeof *v);
    for (int i = 0; i < s->n_history; i++)
        v[i] = tokens ? s->history[i].tokens_per_s : s->history[i].loss;
    char buf[2048];
    if (width > 400) width = 400;
    int cols = ms_tui_sparkline(v, s->n_history, width, p->g, buf, sizeof buf);
    ms_tui_text(p, y, x, cols, p->role[tokens ? MS_ROLE_INUSE : MS_ROLE_GOOD], buf);
    free(v);
    return cols;
}

static void min_max_loss(const ms_snapshot *s, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int i = 0; i < s->n_history; i++)
        if (isfinite(s->history[i].loss))
            *lo = fmin(*lo, s->history[i].loss), *hi = fmax(*hi, s->history[i].loss);
}

static int draw_training(ms_tui *t, const ms_snapshot *s, int y, int w) {
    const ms_tui_paint *p = &t->paint;
    char a[64], b[64];
    const ms_live_step *last = s->n_history > 0 ? &s->history[s->n_history - 1] : NULL;
    ms_tui_text(p, y++, 0, w, p->role[MS_ROLE_TITLE], "Training");

    int x = 2;
    snprintf(a, sizeof a, "%lld", (long long)s->step);
    x = label_value(p, y, x, w, "step ", s->step >= 0 ? a : "-");
    x = label_value(p, y, x + 4, w, "strategy ", s->strategy[0] ? s->strategy : "-");
    if (last && last->lr > 0) {
        snprintf(a, sizeof a, "%.3g", last->lr);
        x = label_value(p, y, x + 4, w, "lr ", a);
    }
    if (last && last->grad_norm > 0) {
        snprintf(a, sizeof a, "%.3g", last->grad_norm);
        label_value(p, y, x + 4, w, "grad norm ", a);
    }
    y++;

    int spark_x = 28, spark_w = w - spark_x - 2;
    if (last && isfinite(last->loss))
        snprintf(a, sizeof a, "%.4f", last->loss);
    else
        snprintf(a, sizeof a, last ? "nan" : "-");
    label_value(p, y, 2, w, "loss      ", a);
    if (spark_w >= 8 && s->n_history > 1) {
        double lo, hi;
        min_max_loss(s, &lo, &hi);
        char range[96] = "";
        if (lo <= hi) snprintf(range, sizeof range, " %.3g..%.3g", lo, hi);
        int rw = (int)strlen(range);
        int sw = spark_w - rw > 8 ? spark_w - rw : spark_w;
        int cols = history_spark(p, s, y, spark_x, sw, false);
        if (sw < spark_w) ms_tui_text(p, y, spark_x + cols, rw, p->role[MS_ROLE_DIM], range);
    }
    y++;

    if (last) {
        ms_tui_fmt_count(last->tokens_per_s, b, sizeof b);
        snprintf(a, sizeof a, "%s", b);
    } else {
        snprintf(a, sizeof a, "-");
    }
    label_value(p, y, 2, w, "tokens/s  ", a);
    if (spark_w >= 8 && s->n_history > 1) history_spark(p, s, y, spark_x, spark_w, true);
    y++;

    x = label_value(p, y, 2, w, "step time ",
                    last ? ms_tui_fmt_seconds(last->step_s, a, sizeof a) : "-");
    label_value(p, y, x < spark_x ? spark_x : x + 2, w, "achieved ",
                s->achieved_flops_per_s > 0 ? ms_tui_fmt_flops(s->achieved_flops_per_s, b, sizeof b)
                                            : "-");
    return y + 1;
}

static int draw_breakdown(ms_tui *t, const ms_snapshot *s, int y, int w) {
    const ms_tui_paint *p = &t->paint;
    const ms_analysis *an = &s->analysis;
    if (an->n_steps <= 0) {
        ms_tui_text(p, y++, 0, w, p->role[MS_ROLE_TITLE], "Step breakdown");
        ms_tui_text(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "no complete step analysed yet");
        return y;
    }
    double wall = 0, comp = 0, comm = 0, idle = 0;
    for (int i = 0; i < an->n_steps; i++) {
        wall += an->steps[i].wall_s, comp += an->steps[i].compute_s;
        comm += an->steps[i].exposed_comm_s, idle += an->steps[i].idle_s;
    }
    int n = an->n_steps;
    wall /= n, comp /= n, comm /= n, idle /= n;
    ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_TITLE],
                 "Step breakdown (slowest rank, mean of steps %lld-%lld)",
                 (long long)an->steps[0].step, (long long)an->steps[n - 1].step);
    int bw = w - 4 < 72 ? w - 4 : 72;
    double total = comp + comm + idle;
    if (total <= 0) total = 1;
    int cc = (int)lround(comp / total * bw), mc = (int)lround(comm / total * bw);
    if (cc + mc > bw) mc = bw - cc;
    int ic = bw - cc - mc;
    const ms_tui_glyphs *g = p->g;
    ms_tui_repeat(y, 2, cc, p->role[MS_ROLE_COMPUTE], g->lane[MS_TUI_CELL_COMPUTE]);
    ms_tui_repeat(y, 2 + cc, mc, p->role[MS_ROLE_COMM],
                  p->palette == MS_PALETTE_MONO && g->utf8 ? g->shade[2]
                                                           : g->lane[MS_TUI_CELL_COMM]);
    ms_tui_repeat(y, 2 + cc + mc, ic, p->role[MS_ROLE_IDLE], g->lane[MS_TUI_CELL_IDLE]);
    y++;
    char a[32], b[32], c[32], d[32];
    int x = 2;
    x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_COMPUTE], "%s compute %s %.0f%%",
                      g->lane[MS_TUI_CELL_COMPUTE], ms_tui_fmt_seconds(comp, a, sizeof a),
                      100 * comp / total);
    x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_COMM], "   %s exposed comm %s %.0f%%",
                      p->palette == MS_PALETTE_MONO && g->utf8 ? g->shade[2]
                                                               : g->lane[MS_TUI_CELL_COMM],
                      ms_tui_fmt_seconds(comm, b, sizeof b), 100 * comm / total);
    x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_IDLE], "   %s idle %s %.0f%%",
                      g->lane[MS_TUI_CELL_IDLE], ms_tui_fmt_seconds(idle, c, sizeof c),
                      100 * idle / total);
    ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_DIM], "   of %s",
                 ms_tui_fmt_seconds(wall, d, sizeof d));
    return y + 1;
}

static int draw_overlap(ms_tui *t, const ms_snapshot *s, int y, int rows, int w) {
    const ms_tui_paint *p = &t->paint;
    const ms_analysis *an = &s->analysis;
    ms_tui_text(p, y++, 0, w, p->role[MS_ROLE_TITLE],
                "Overlap per rank (compute during communication / communication)");
    if (an->nranks <= 0) {
        ms_tui_text(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "no events analysed yet");
        return y;
    }
    int bw = w - 88 > 30 ? 30 : w - 88;
    if (bw < 6) bw = 6;
    ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "%-6s %10s %10s  %-*s %14s %12s %10s",
                 "rank", "comm", "compute", bw + 6, "overlap", "exposed comm", "exposed/step",
                 "dp hidden");
    int visible = rows - 2;
    if (visible < 1) visible = 1;
    int first = ms_tui_clamp_scroll(&t->scroll[0], an->nranks, visible);
    for (int r = first; r < an->nranks && r < first + visible; r++) {
        const ms_rank_overlap *o = &an->overlap[r];
        char a[32], b[32], c[32];
        int x = 2;
        x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_NORMAL], "r%-5d %10s %10s  ", r,
                          ms_tui_fmt_seconds(o->comm_s, a, sizeof a),
                          ms_tui_fmt_seconds(o->compute_s, b, sizeof b));
        ms_tui_bar(p, y, x, bw, o->overlap_ratio, p->role[MS_ROLE_GOOD], p->role[MS_ROLE_IDLE]);
        x += bw;
        x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_VALUE], " %4.0f%%",
                          100 * o->overlap_ratio);
        x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_COMM], " %14s",
                          ms_tui_fmt_seconds(o->exposed_comm_s, c, sizeof c));
        /* per step, and the share of the dp gradient communication hidden under compute (the
         * buckets' overlap; "-" without dp collectives) */
        x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_COMM], " %12s",
                          ms_tui_fmt_seconds(o->exposed_comm_step_s, a, sizeof a));
        if (o->dp_comm_s > 0)
            ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_VALUE], " %9.0f%%",
                         100 * o->dp_hidden_ratio);
        else
            ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_DIM], " %10s", "-");
        y++;
    }
    if (an->nranks > visible)
        ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "ranks %d-%d of %d (Up/Down)", first,
                     first + visible - 1 < an->nranks - 1 ? first + visible - 1 : an->nranks - 1,
                     an->nranks);
    return y;
}

static void draw_overview(ms_tui *t, const ms_snapshot *s, int y, int h, int w) {
    const ms_tui_paint *p = &t->paint;
    int end = y + h;
    y = draw_training(t, s, y, w) + 1;
    if (y < end - 3) y = draw_breakdown(t, s, y, w) + 1;
    /* Keep the last two rows for stragglers and the last event. */
    int rows = end - 2 - y;
    if (rows >= 3) y = draw_overlap(t, s, y, rows, w);
    const ms_analysis *an = &s->analysis;
    if (an->n_stragglers > 0 && y < end) {
        char line[512], a[32];
        int n = snprintf(line, sizeof line, "stragglers: ");
        for (int i = 0; i < an->n_stragglers && n < (int)sizeof line - 80; i++)
            n += snprintf(line + n, sizeof line - (size_t)n, "%sr%d last in %.0f%% (lag %s)",
                          i ? ", " : "", an->stragglers[i].rank,
                          100 * an->stragglers[i].last_fraction,
                          ms_tui_fmt_seconds(an->stragglers[i].mean_lag_s, a, sizeof a));
        ms_tui_text(p, end - 2, 0, w, p->role[MS_ROLE_WARN], line);
    }
    ms_tui_text(p, end - 1, 0, w, p->role[MS_ROLE_DIM], "last event: ");
    char event[MS_LIVE_TEXT];
    ms_tui_redact_token(s->last_event, event, sizeof event);
    ms_tui_text(p, end - 1, 12, w - 12, p->role[MS_ROLE_NORMAL], event[0] ? event : "-");
}

const ms_tui_screen ms_tui_screen_overview = {
    .name = "overview",
    .keys = "Up/Down:ranks",
    .draw = draw_overview,
    .key = NULL,
};

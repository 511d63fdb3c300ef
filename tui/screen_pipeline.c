/* screen_pipeline.c - screen 7, shown only for a pipeline (pp > 1): the last complete step's
 * actions, one lane per stage (its first rank), each F, B or W block labelled with its
 * micro-batch and coloured by it, the bubble idle; beside each lane the measured bubble of
 * that step, the schedule's formula and the window's mean (profiler/analysis.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "tui/tui_impl.h"

#define LANE_X   9  /* "s12 r345 " */
#define TOTALS_W 30 /* "  bubble  formula   window" */
#define SCREEN   6  /* this screen's index (its scroll) */

bool ms_tui_pipeline_shown(const ms_snapshot *s) {
    return s && (s->pipeline.step >= 0 || s->analysis.pipe.stages > 1);
}

static void pct(double v, char *buf, size_t cap) {
    if (isfinite(v))
        snprintf(buf, cap, "%.1f%%", v * 100);
    else
        snprintf(buf, cap, "-");
}

static attr_t mb_attr(const ms_tui_paint *p, int mb) {
    return p->n_mb > 0 ? p->mb[(mb < 0 ? -mb : mb) % p->n_mb] : A_NORMAL;
}

/* The legend: what each fill means, and the micro-batch colours. */
static void draw_legend(const ms_tui_paint *p, int y, int w, int m) {
    int x = 2;
    static const char *const what[3] = {"forward", "backward", "weight grad"};
    for (int a = 0; a < 3; a++)
        x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_NORMAL], "%s%s %s   ", p->g->pipe[a],
                          p->g->pipe[a], what[a]);
    x += ms_tui_textf(p, y, x, w - x, p->role[MS_ROLE_IDLE], "%s bubble", p->g->lane[0]);
    x += ms_tui_text(p, y, x, w - x, p->role[MS_ROLE_DIM], "   micro-batch ");
    for (int j = 0; j < m && j < 10 && x < w; j++)
        x += ms_tui_textf(p, y, x, w - x, mb_attr(p, j) | A_BOLD, "%d ", j);
    if (m > 10) ms_tui_text(p, y, x, w - x, p->role[MS_ROLE_DIM], "...");
}

/* One lane: runs of a block get its label first, then its fill; idle columns the idle glyph. */
static void draw_lane(const ms_tui_paint *p, const ms_live_pipeline *pl, int v, int y, int x,
                      int lw, const int32_t *cells) {
    for (int c0 = 0; c0 < lw;) {
        int c1 = c0;
        while (c1 < lw && cells[c1] == cells[c0]) c1++;
        if (cells[c0] < 0) {
            ms_tui_repeat(y, x + c0, c1 - c0, p->role[MS_ROLE_IDLE], p->g->lane[0]);
        } else {
            const ms_live_pipe_block *b = &pl->blocks[cells[c0]];
            attr_t a = mb_attr(p, b->mb);
            /* The whole label where it fits, else without the chunk, else the action alone:
             * a cut label ("F3.") would read as another block. */
            char label[16];
            ms_tui_pipe_label(b, v, label, sizeof label);
            if ((int)strlen(label) > c1 - c0) ms_tui_pipe_label(b, 1, label, sizeof label);
            if ((int)strlen(label) > c1 - c0) label[1] = '\0';
            int n = ms_tui_text(p, y, x + c0, c1 - c0, a | A_BOLD | A_REVERSE, label);
            ms_tui_repeat(y, x + c0 + n, c1 - c0 - n, a, p->g->pipe[b->action < 3 ? b->action : 0]);
        }
        c0 = c1;
    }
}

static void draw_pipeline(ms_tui *t, const ms_snapshot *s, int y, int h, int w) {
    const ms_tui_paint *p = &t->paint;
    const ms_live_pipeline *pl = &s->pipeline;
    const ms_pipe_stats *ps = &s->analysis.pipe;
    int end = y + h;
    if (!ms_tui_pipeline_shown(s)) {
        ms_tui_text(p, y, 0, w, p->role[MS_ROLE_TITLE], "Pipeline");
        ms_tui_text(p, y + 2, 2, w - 2, p->role[MS_ROLE_DIM],
                    "this run has no pipeline: the view shows the stages of a run with pp > 1");
        return;
    }
    if (pl->step < 0 || !(pl->wall_s > 0) || pl->stages < 1) {
        ms_tui_text(p, y, 0, w, p->role[MS_ROLE_TITLE], "Pipeline");
        ms_tui_text(p, y + 2, 2, w - 2, p->role[MS_ROLE_DIM],
                    "no complete step recorded yet: lanes appear after the first step");
        return;
    }
    char a[32], b[32], c[32];
    int v = ps->virtual_stages;
    char vs[32] = "";
    if (v > 1) snprintf(vs, sizeof vs, " x %d virtual stages", v);
    ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_TITLE],
                 "Pipeline of step %lld: %s, %d stages%s, %d micro-batches (%s from the first "
                 "action to the last)",
                 (long long)pl->step, ps->schedule, pl->stages, vs, ps->micro_batches,
                 ms_tui_fmt_seconds(pl->wall_s, a, sizeof a));
    draw_legend(p, y, w, ps->micro_batches);
    y += 2;

    bool totals = w - LANE_X - TOTALS_W >= 30;
    int lw = w - LANE_X - 1 - (totals ? TOTALS_W : 0);
    if (lw > 1000) lw = 1000;
    int visible = end - y - 5;
    if (visible < 1) visible = 1;
    int first = ms_tui_clamp_scroll(&t->scroll[SCREEN], pl->stages, visible);
    if (totals)
        ms_tui_textf(p, y - 1, LANE_X + lw + 1, TOTALS_W, p->role[MS_ROLE_DIM], "%9s %9s %9s",
                     "bubble", "formula", "window");
    pct(ps->formula, b, sizeof b);
    int32_t *cells = xmalloc(sizeof *cells * (size_t)lw);
    for (int k = first; k < pl->stages && k < first + visible; k++) {
        ms_tui_textf(p, y, 0, LANE_X, p->role[MS_ROLE_DIM], "s%d r%d", k, (int)pl->rank[k]);
        ms_tui_pipe_layout(pl->blocks, pl->n_blocks, k, pl->wall_s, lw, cells);
        draw_lane(p, pl, v, y, LANE_X, lw, cells);
        if (totals) {
            pct(k < MS_AN_MAX_STAGES ? ps->last_stage_bubble[k] : NAN, a, sizeof a);
            pct(k < MS_AN_MAX_STAGES ? ps->stage_bubble[k] : NAN, c, sizeof c);
            int x = LANE_X + lw + 1;
            x += ms_tui_textf(p, y, x, 10, p->role[MS_ROLE_VALUE], "%9s ", a);
            x += ms_tui_textf(p, y, x, 10, p->role[MS_ROLE_DIM], "%9s ", b);
            ms_tui_textf(p, y, x, 10, p->role[MS_ROLE_NORMAL], "%9s", c);
        }
        y++;
    }
    free(cells);
    ms_tui_time_axis(p, y, LANE_X, lw, pl->wall_s);
    y += 2;
    if (y < end) {
        pct(ps->last_bubble, a, sizeof a);
        const char *f = !strcmp(ps->schedule, "interleaved") ? "(p-1)/(v*m+p-1)"
                        : isfinite(ps->formula)              ? "(p-1)/(m+p-1)"
                                                             : "none for this schedule";
        ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_NORMAL],
                     "bubble %s in step %lld (1 - busy / the step's span of actions, mean over "
                     "ranks); formula %s = %s; window: mean over %d step%s",
                     a, (long long)pl->step, f, b, ps->n_steps, ps->n_steps == 1 ? "" : "s");
    }
    if (pl->stages > visible && y < end)
        ms_tui_textf(p, y, 0, w, p->role[MS_ROLE_DIM], "stages %d-%d of %d (Up/Down)", first,
                     first + visible - 1, pl->stages);
}

const ms_tui_screen ms_tui_screen_pipeline = {
    .name = "pipeline",
    .keys = "Up/Down:stages",
    .draw = draw_pipeline,
    .key = NULL,
    .shown = ms_tui_pipeline_shown,
    .hidden = "no pipeline in this run: screen 7 shows the stages of a run with pp > 1",
};

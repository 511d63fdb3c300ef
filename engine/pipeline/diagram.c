/* diagram.c - the stage-by-time chart of a pipeline schedule (diagram.h). */
#include "engine/pipeline/diagram.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"

#define WIDTH     100 /* columns a printed line stays within */
#define MAX_PARTS 6   /* wrapped parts drawn; the figures below cover the whole step anyway */

/* "F3", "B12", "W0", "F3a" (local chunk a); "F3/30" past 26 chunks. */
static void label(char *buf, size_t n, const ms_pp_action *a, int v) {
    char op = "FBW"[a->op];
    if (v == 1)
        snprintf(buf, n, "%c%d", op, a->mb);
    else if (v <= 26)
        snprintf(buf, n, "%c%d%c", op, a->mb, 'a' + a->chunk);
    else
        snprintf(buf, n, "%c%d/%d", op, a->mb, a->chunk);
}

/* The formula's bubble with unit times, and how it reads. */
static double formula(ms_schedule kind, int p, int m, int v, char *text, size_t n) {
    switch (kind) {
        case MS_SCHEDULE_INTERLEAVED:
            snprintf(text, n, "(p-1)/(v m+p-1) = %d/%d", p - 1, v * m + p - 1);
            return (double)(p - 1) / (v * m + p - 1);
        case MS_SCHEDULE_ZB_H1:
            /* Qi et al.: (p-1)(t_F + t_B - t_W) idle against 3m units of work */
            snprintf(text, n, "(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W)) = %d/%d", p - 1, 3 * m + p - 1);
            return (double)(p - 1) / (3 * m + p - 1);
        default:
            snprintf(text, n, "(p-1)/(m+p-1) = %d/%d", p - 1, m + p - 1);
            return (double)(p - 1) / (m + p - 1);
    }
}

ms_status ms_pp_schedule_print(FILE *f, ms_schedule kind, int p, int m, int v, ms_error *err) {
    ms_pp_plan pl;
    MS_CHECK(ms_pp_plan_make(kind, p, m, v, &pl, err));
    ms_pp_timeline tl;
    ms_pp_times unit = {.f = 1, .b = 1, .w = 1};
    ms_status st = ms_pp_simulate(&pl, &unit, &tl, err);
    if (st != MS_OK) {
        ms_pp_plan_free(&pl);
        return st;
    }
    const int cells = (int)(tl.step + 0.5);
    /* every cell's action on every stage (-1: idle), and the widest label */
    int *cell = xmalloc((size_t)p * (cells > 0 ? cells : 1) * sizeof(int));
    int cw = 2;
    char buf[32];
    for (int i = 0; i < p * cells; i++) cell[i] = -1;
    for (int s = 0; s < p; s++)
        for (int i = 0; i < pl.n[s]; i++) {
            const ms_pp_action *a = &pl.act[s][i];
            if (ms_pp_is_comm(a->op)) continue;
            for (int c = (int)(tl.start[s][i] + 0.5); c < (int)(tl.end[s][i] + 0.5); c++)
                cell[s * cells + c] = i;
            label(buf, sizeof buf, a, v);
            if ((int)strlen(buf) > cw) cw = (int)strlen(buf);
        }
    cw++; /* a space between cells */

    const char *name = ms_schedule_name(kind);
    fprintf(f, "pipeline schedule: %s, pp %d, %d micro-batch%s", name, p, m, m == 1 ? "" : "es");
    if (v > 1) fprintf(f, ", %d virtual stages", v);
    fprintf(f, "\n  one cell per unit of time: F forward, %s, . idle\n",
            kind == MS_SCHEDULE_ZB_H1 ? "B input gradient, W weight gradient"
                                      : "B backward (input and weight gradients: 2 cells)");
    if (v > 1)
        fprintf(f, "  chunk letters a, b, ...: local chunk c holds model chunk c*%d + stage\n", p);
    const int head = 9; /* "stage 12 " */
    int most = (WIDTH - head) / cw, parts = (cells + most - 1) / most;
    int per = parts > 0 ? (cells + parts - 1) / parts : 1; /* parts of equal width */
    for (int c0 = 0; c0 < cells; c0 += per) {
        if (c0 / per == MAX_PARTS) {
            fprintf(f, "  (the last %d units of time are not drawn)\n", cells - c0);
            break;
        }
        int c1 = c0 + per < cells ? c0 + per : cells;
        /* the ruler: the time of the part's first cell and of every fifth cell after it */
        char ruler[WIDTH + 64];
        int len = snprintf(ruler, sizeof ruler, "%-*s", head, "time");
        for (int c = c0; c < c1; c++) {
            int col = head + (c - c0) * cw;
            bool mark = c % 5 == 0 || (c == c0 && 5 - c % 5 >= 3);
            if (mark && col >= len && col < WIDTH)
                len += snprintf(ruler + len, sizeof ruler - (size_t)len, "%*s%d", col - len, "", c);
        }
        fprintf(f, "%s\n", ruler);
        for (int s = 0; s < p; s++) {
            fprintf(f, "stage %-3d", s);
            int spaces = 0; /* blanks are written before the next cell, so lines end at a cell */
            for (int c = c0; c < c1; c++) {
                int i = cell[s * cells + c];
                if (i < 0)
                    snprintf(buf, sizeof buf, ".");
                else
                    label(buf, sizeof buf, &pl.act[s][i], v);
                fprintf(f, "%*s%s", spaces, "", buf);
                spaces = cw - (int)strlen(buf);
            }
            fputc('\n', f);
        }
    }
    for (int s = 0; s < p; s++) {
        const ms_pp_stage_time *x = &tl.stage[s];
        fprintf(f, "  stage %d: bubble %.1f%% (%g of %g idle), peak in flight %d (bound %d)\n", s,
                100 * x->bubble, tl.step - x->busy, tl.step, x->peak_inflight,
                ms_pp_inflight_bound(kind, p, m, v, s));
    }
    char text[96];
    double fb = formula(kind, p, m, v, text, sizeof text);
    fprintf(f, "  bubble %.1f%% (mean over stages); formula %s = %.1f%%\n", 100 * tl.bubble, text,
            100 * fb);
    if (v > 1)
        fprintf(f, "  in flight: micro-batch x chunk units, each 1/%d of a stage's activations\n",
                v);
    free(cell);
    ms_pp_timeline_free(&tl);
    ms_pp_plan_free(&pl);
    return MS_OK;
}

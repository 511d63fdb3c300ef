/* screen_memory.c - screen 5: device memory per rank, the bytes in use and the peak, as bars
 * on one scale (the largest peak), and what the training state holds of it: parameters,
 * gradients, optimizer state and activations (ZeRO shards the first three over dp, recompute
 * and pipelines change the last); under offload the optimizer's host memory on a line apart. */
#include <stdbool.h>
#include <stdio.h>

#include "tui/tui_impl.h"

static void draw_memory(ms_tui *t, const ms_snapshot *s, int y, int h, int w) {
    const ms_tui_paint *p = &t->paint;
    int end = y + h;
    int n = s->info.nranks;
    char a[32], b[32];
    if (n <= 0 || !s->mem) {
        ms_tui_text(p, y, 0, w, p->role[MS_ROLE_TITLE], "Memory per rank");
        ms_tui_text(p, y + 2, 2, w - 2, p->role[MS_ROLE_DIM], "no memory samples yet");
        return;
    }
    double top = 0, total_use = 0, total_peak = 0;
    for (int r = 0; r < n; r++) {
        if ((double)s->mem[r].peak > top) top = (double)s->mem[r].peak;
        if ((double)s->mem[r].in_use > top) top = (double)s->mem[r].in_use;
        total_use += (double)s->mem[r].in_use, total_peak += (double)s->mem[r].peak;
    }
    ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_TITLE],
                 "Memory per rank (device bytes; bars scaled to %s)",
                 ms_tui_fmt_bytes(top, a, sizeof a));
    ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "all ranks: %s in use, %s peak",
                 ms_tui_fmt_bytes(total_use, a, sizeof a),
                 ms_tui_fmt_bytes(total_peak, b, sizeof b));
    double host = 0;
    for (int r = 0; r < n; r++) host += (double)s->mem[r].host_optim;
    if (host > 0) /* offload: host memory, not in the bars */
        ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM],
                     "offload: %s in host memory (fp32 masters, Adam moments, staged gradients; "
                     "rank 0: %s)",
                     ms_tui_fmt_bytes(host, a, sizeof a),
                     ms_tui_fmt_bytes((double)s->mem[0].host_optim, b, sizeof b));
    y++;
    bool split = false;
    for (int r = 0; r < n; r++) split |= (s->mem[r].params | s->mem[r].optim | s->mem[r].acts) > 0;
    /* "r12  " bar " 12.3 MiB  " bar " 12.3 MiB" ["  params grads optim acts"] */
    enum { SPLIT_W = 4 * 10 + 2 };
    int sw = split && w >= 6 + 2 * 11 + 2 + 2 * 8 + SPLIT_W ? SPLIT_W : 0;
    int bw = (w - 6 - 2 * 11 - 2 - sw) / 2;
    if (bw > 50) bw = 50;
    if (bw < 4) bw = 4;
    int x_use = 6, x_peak = x_use + bw + 11 + 2;
    ms_tui_text(p, y, 0, 6, p->role[MS_ROLE_DIM], "rank");
    ms_tui_text(p, y, x_use, bw, p->role[MS_ROLE_INUSE], "in use");
    ms_tui_text(p, y, x_peak, bw, p->role[MS_ROLE_PEAK], "peak");
    int x_split = x_peak + bw + 12;
    if (sw)
        ms_tui_textf(p, y, x_split, sw, p->role[MS_ROLE_DIM], "  %9s %9s %9s %9s", "params",
                     "grads", "optimizer", "activ.");
    y++;
    int visible = end - y - 1;
    if (visible < 1) visible = 1;
    int first = ms_tui_clamp_scroll(&t->scroll[4], n, visible);
    for (int r = first; r < n && r < first + visible; r++) {
        const ms_live_mem *m = &s->mem[r];
        ms_tui_textf(p, y, 0, 6, p->role[MS_ROLE_DIM], "r%d", r);
        ms_tui_bar(p, y, x_use, bw, top > 0 ? (double)m->in_use / top : 0, p->role[MS_ROLE_INUSE],
                   p->role[MS_ROLE_IDLE]);
        ms_tui_textf(p, y, x_use + bw, 12, p->role[MS_ROLE_VALUE], " %10s",
                     ms_tui_fmt_bytes((double)m->in_use, a, sizeof a));
        ms_tui_bar(p, y, x_peak, bw, top > 0 ? (double)m->peak / top : 0, p->role[MS_ROLE_PEAK],
                   p->role[MS_ROLE_IDLE]);
        ms_tui_textf(p, y, x_peak + bw, 12, p->role[MS_ROLE_VALUE], " %10s",
                     ms_tui_fmt_bytes((double)m->peak, b, sizeof b));
        if (sw) {
            char c[32], d[32];
            ms_tui_textf(p, y, x_split, sw, p->role[MS_ROLE_VALUE], "  %9s %9s %9s %9s",
                         ms_tui_fmt_bytes((double)m->params, a, sizeof a),
                         ms_tui_fmt_bytes((double)m->grads, b, sizeof b),
                         ms_tui_fmt_bytes((double)m->optim, c, sizeof c),
                         ms_tui_fmt_bytes((double)m->acts, d, sizeof d));
        }
        y++;
    }
    if (n > visible)
        ms_tui_textf(p, y, 0, w, p->role[MS_ROLE_DIM], "ranks %d-%d of %d (Up/Down)", first,
                     first + visible - 1, n);
}

const ms_tui_screen ms_tui_screen_memory = {
    .name = "memory",
    .keys = "Up/Down:ranks",
    .draw = draw_memory,
    .key = NULL,
};

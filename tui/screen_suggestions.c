/* screen_suggestions.c - screen 6: strategies the job proposes. A list with each
 * suggestion's state and result (above it, why the advisor suggests nothing, while its model
 * disagrees with the measured step); the selected one in detail; Enter or `a` opens a confirm
 * box (the strategy diff, predicted gain, evidence and memory check) where `y` accepts it
 * (accepting switches the job's strategy, so it always takes this second step); `x`
 * dismisses. */
#include <stdio.h>
#include <string.h>

#include "tui/tui_impl.h"

static ms_tui_role state_role(int state) {
    switch (state) {
        case MS_SUGG_OPEN:
            return MS_ROLE_VALUE;
        case MS_SUGG_PENDING:
            return MS_ROLE_WARN;
        case MS_SUGG_APPLIED:
            return MS_ROLE_GOOD;
        case MS_SUGG_REFUSED:
            return MS_ROLE_BAD;
        case MS_SUGG_WITHDRAWN:
            return MS_ROLE_WARN;
        default:
            return MS_ROLE_DIM;
    }
}

static const char *state_name(int state) {
    return state < MS_SUGG_STATE_COUNT ? ms_suggestion_state_name((ms_suggestion_state)state) : "?";
}

/* Highlights the suggestion in row i of s (clamped). */
static void select_row(ms_tui *t, const ms_snapshot *s, int i) {
    if (i >= s->n_suggestions) i = s->n_suggestions - 1;
    if (i < 0) i = 0;
    t->selected = i;
    t->selected_id = s->suggestions[i].id;
}

const ms_suggestion *ms_tui_selected_suggestion(ms_tui *t, const ms_snapshot *s) {
    if (s->n_suggestions <= 0) return NULL;
    int row = t->selected; /* the same row when the highlighted one has left the list */
    for (int i = 0; i < s->n_suggestions; i++)
        if (s->suggestions[i].id == t->selected_id) row = i;
    select_row(t, s, row);
    return &s->suggestions[t->selected];
}

/* Draws text wrapped at spaces into at most max_rows rows of width w (p NULL: only counts);
 * returns rows used. */
static int wrapped(const ms_tui_paint *p, int y, int x, int w, int max_rows, attr_t a,
                   const char *text) {
    int rows = 0;
    while (*text && rows < max_rows && w > 0) {
        int len = (int)strlen(text), take = len;
        if (len > w) {
            take = w;
            while (take > 0 && text[take] != ' ') take--;
            if (take == 0) take = w;
        }
        char line[512];
        snprintf(line, sizeof line, "%.*s", take, text);
        if (p) ms_tui_text(p, y + rows, x, w, a, line);
        rows++;
        text += take;
        while (*text == ' ') text++;
    }
    return rows;
}

static void gain_text(const ms_suggestion *g, char *buf, size_t cap) {
    char a[32], b[32];
    if (g->current_step_s > 0 && g->predicted_step_s > 0)
        snprintf(buf, cap, "%.0f%% faster: %s -> %s per step", 100 * g->predicted_gain,
                 ms_tui_fmt_seconds(g->current_step_s, a, sizeof a),
                 ms_tui_fmt_seconds(g->predicted_step_s, b, sizeof b));
    else
        snprintf(buf, cap, "%.0f%% faster", 100 * g->predicted_gain);
}

static void draw_suggestions(ms_tui *t, const ms_snapshot *s, int y, int h, int w) {
    const ms_tui_paint *p = &t->paint;
    int end = y + h;
    ms_tui_text(p, y++, 0, w, p->role[MS_ROLE_TITLE],
                "Suggestions (strategies predicted to run faster)");
    if (s->advisor_note[0]) /* why there are none now; what is withdrawn stays listed */
        y += wrapped(p, y, 2, w - 2, 3, p->role[MS_ROLE_WARN], s->advisor_note);
    if (s->n_suggestions <= 0 && s->advisor_note[0]) return;
    if (s->n_suggestions <= 0) {
        ms_tui_text(p, y + 1, 2, w - 2, p->role[MS_ROLE_DIM],
                    "no suggestions yet: when the job finds a strategy it predicts to be "
                    "faster, it appears here to review and accept");
        return;
    }
    const ms_suggestion *sel = ms_tui_selected_suggestion(t, s);
    /* the target column fits the longest name (pipelines and memory knobs make long ones) */
    int tw = 20;
    for (int i = 0; i < s->n_suggestions; i++) {
        int len = (int)strlen(s->suggestions[i].target);
        if (len > tw) tw = len < 48 ? len : 48;
    }
    ms_tui_textf(p, y++, 2, w - 2, p->role[MS_ROLE_DIM], "%-4s %-10s %-*s %-8s %s", "id", "state",
                 tw, "target", "gain", "result");
    for (int i = 0; i < s->n_suggestions && y < end - 6; i++) {
        const ms_suggestion *g = &s->suggestions[i];
        bool on = g == sel;
        attr_t base = on ? p->role[MS_ROLE_SELECT] : p->role[MS_ROLE_NORMAL];
        if (on) ms_tui_repeat(y, 0, w, base, " ");
        ms_tui_text(p, y, 0, 2, base, on ? ">" : " ");
        int x = 2;
        x += ms_tui_textf(p, y, x, w - x, base, "%-4d ", (int)g->id);
        x += ms_tui_textf(p, y, x, w - x, on ? base : p->role[state_role(g->state)], "%-10s ",
                          state_name(g->state));
        char gain[32];
        snprintf(gain, sizeof gain, "%+.0f%%", 100 * g->predicted_gain);
        ms_tui_textf(p, y, x, w - x, base, "%-*.*s %-8s %s", tw, tw, g->target, gain, g->result);
        y++;
    }
    y++;
    if (!sel || y >= end) return;
    char gain[160];
    gain_text(sel, gain, sizeof gain);
    static const char *const labels[] = {"change", "predicted", "evidence", "memory", "result"};
    const char *values[] = {sel->diff, gain, sel->evidence, sel->memory_check, sel->result};
    ms_tui_textf(p, y++, 0, w, p->role[MS_ROLE_TITLE], "Suggestion %d: %s %s %s", (int)sel->id,
                 sel->current[0] ? sel->current : "?", p->g->arrow, sel->target);
    for (int i = 0; i < 5 && y < end; i++) {
        if (!values[i][0]) continue;
        ms_tui_text(p, y, 2, 12, p->role[MS_ROLE_DIM], labels[i]);
        y += wrapped(p, y, 14, w - 16, end - y, p->role[MS_ROLE_NORMAL], values[i]);
    }
    if (sel->applied_step >= 0 && y < end)
        ms_tui_textf(p, y, 2, w - 2, p->role[MS_ROLE_DIM], "applied at step %lld",
                     (long long)sel->applied_step);
}

void ms_tui_draw_confirm(ms_tui *t, const ms_snapshot *s, const ms_suggestion *g) {
    (void)s;
    const ms_tui_paint *p = &t->paint;
    char title[96], gain[160];
    gain_text(g, gain, sizeof gain);
    static const char *const labels[] = {"change", "predicted", "evidence", "memory"};
    const char *values[] = {g->diff, gain, g->evidence, g->memory_check};
    int bw = COLS - 8 < 84 ? COLS - 8 : 84, iw = bw - 4;
    /* Frame, the switch line, the wrapped fields, a blank, two lines of text. */
    int bh = 2 + 1 + 1 + 2;
    for (int i = 0; i < 4; i++) {
        int n = wrapped(NULL, 0, 0, iw - 11, 100, 0, values[i][0] ? values[i] : "-");
        bh += n ? n : 1;
    }
    if (bh > LINES - 2) bh = LINES - 2;
    int by = (LINES - bh) / 2, bx = (COLS - bw) / 2;
    snprintf(title, sizeof title, "accept suggestion %d?", (int)g->id);
    ms_tui_box(p, by, bx, bh, bw, title);
    int y = by + 1, x = bx + 2, end = by + bh - 3;
    ms_tui_textf(p, y++, x, iw, p->role[MS_ROLE_VALUE], "switch %s %s %s",
                 g->current[0] ? g->current : "?", p->g->arrow, g->target);
    for (int i = 0; i < 4 && y < end; i++) {
        ms_tui_text(p, y, x, 11, p->role[MS_ROLE_DIM], labels[i]);
        int used = wrapped(p, y, x + 11, iw - 11, end - y, p->role[MS_ROLE_NORMAL],
                           values[i][0] ? values[i] : "-");
        y += used ? used : 1;
    }
    ms_tui_text(p, by + bh - 3, x, iw, p->role[MS_ROLE_DIM],
                "The job switches at its next step boundary.");
    ms_tui_text(p, by + bh - 2, x, iw, p->role[MS_ROLE_TITLE], "y: accept    n or Esc: cancel");
}

static ms_tui_key_result suggestions_key(ms_tui *t, const ms_snapshot *s, int ch) {
    const ms_suggestion *g = ms_tui_selected_suggestion(t, s);
    switch (ch) {
        case KEY_UP:
        case KEY_DOWN:
            if (g) select_row(t, s, t->selected + (ch == KEY_UP ? -1 : 1));
            return MS_KEY_HANDLED;
        case '\n':
        case '\r':
        case KEY_ENTER:
        case 'a':
            if (!g) return MS_KEY_HANDLED;
            if (t->src->read_only)
                ms_tui_flash(t, MS_ROLE_WARN, "read-only view: accepting is off");
            else if (g->state != MS_SUGG_OPEN)
                ms_tui_flash(t, MS_ROLE_WARN, "suggestion %d is %s: nothing to accept", (int)g->id,
                             state_name(g->state));
            else
                t->confirm_id = g->id;
            return MS_KEY_HANDLED;
        case 'x': {
            if (!g) return MS_KEY_HANDLED;
            if (t->src->read_only) {
                ms_tui_flash(t, MS_ROLE_WARN, "read-only view: dismissing is off");
                return MS_KEY_HANDLED;
            }
            if (g->state != MS_SUGG_OPEN) {
                ms_tui_flash(t, MS_ROLE_WARN, "suggestion %d is %s: nothing to dismiss", (int)g->id,
                             state_name(g->state));
                return MS_KEY_HANDLED;
            }
            ms_live_req req;
            memset(&req, 0, sizeof req);
            req.kind = MS_REQ_DISMISS;
            req.id = g->id;
            ms_error err = {0};
            if (t->src->ops->post(t->src->self, &req, &err) == MS_OK)
                ms_tui_flash(t, MS_ROLE_GOOD, "suggestion %d dismissed", (int)g->id);
            else
                ms_tui_flash(t, MS_ROLE_BAD, "%s", err.msg);
            return MS_KEY_HANDLED;
        }
        default:
            return MS_KEY_IGNORED;
    }
}

const ms_tui_screen ms_tui_screen_suggestions = {
    .name = "suggestions",
    .keys = "Up/Down:select Enter/a:accept x:dismiss",
    .draw = draw_suggestions,
    .key = suggestions_key,
};

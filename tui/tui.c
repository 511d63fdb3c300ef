/* tui.c - the TUI's thread: terminal setup and teardown, the event loop, global keys, the
 * header and footer, the help overlay, signals.
 *
 * One loop on one thread: take the newest snapshot (unless paused), draw everything, wait
 * for a key at most one tick (250 ms), handle it. Handlers return what to do next (ignored,
 * handled, quit). The terminal is restored on every way out: q, a signal (the handlers only
 * set a flag that the loop reads within a tick), ms_tui_stop, and, as a last resort, an
 * atexit hook and a panic hook (ms_panic) that write the terminal's reset strings and the
 * saved tty modes without touching curses.
 *
 * The UI thread takes no lock of the training step: snapshots and requests go through the
 * source (ms_live_acquire / ms_live_post in process).
 */
#include <langinfo.h>
#include <locale.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "engine/core/panic.h"
#include "engine/core/xalloc.h"
#include "tui/tui_impl.h"

#define TICK_MS  250
#define FLASH_NS 4000000000LL
#define MIN_COLS 60
#define MIN_ROWS 14

static const ms_tui_screen *const screens[MS_TUI_NSCREENS] = {
    &ms_tui_screen_overview, &ms_tui_screen_heatmap, &ms_tui_screen_timeline,
    &ms_tui_screen_reshards, &ms_tui_screen_memory,  &ms_tui_screen_suggestions,
    &ms_tui_screen_pipeline,
};

/* Whether screen i is offered for snapshot s (the pipeline screen only for pp > 1). */
static bool screen_shown(int i, const ms_snapshot *s) {
    return !screens[i]->shown || screens[i]->shown(s);
}

/* The number of screens offered: "1-N" in the footer. Hidden screens come last. */
static int screens_shown(const ms_snapshot *s) {
    int n = 0;
    for (int i = 0; i < MS_TUI_NSCREENS; i++) n += screen_shown(i, s);
    return n;
}

/* --- process-wide state: signals and the last-resort restore ------------------------------ */

/* One TUI per process: signal dispositions and the tty are process-wide. */
static atomic_bool g_busy;
static volatile sig_atomic_t g_signal;
static const int g_sigs[3] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction g_old[3];
static bool g_handlers_on;

/* For the atexit hook: the tty modes before we started and the strings that leave curses
 * mode (leave the alternate screen, show the cursor, reset attributes). */
static atomic_bool g_term_active;
static struct termios g_tty;
static bool g_tty_saved;
static char g_reset[256];
static pthread_once_t g_atexit_once = PTHREAD_ONCE_INIT;

static void on_signal(int sig) {
    g_signal = sig;
    /* Chain to the job's own flag-setting handler, if it had one. */
    for (int i = 0; i < 3; i++)
        if (g_sigs[i] == sig && !(g_old[i].sa_flags & SA_SIGINFO) &&
            g_old[i].sa_handler != SIG_DFL && g_old[i].sa_handler != SIG_IGN &&
            g_old[i].sa_handler != on_signal)
            g_old[i].sa_handler(sig);
}

static void handlers_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    for (int i = 0; i < 3; i++) sigaction(g_sigs[i], &sa, &g_old[i]);
    g_handlers_on = true;
}

static void handlers_restore(void) {
    if (!g_handlers_on) return;
    for (int i = 0; i < 3; i++) sigaction(g_sigs[i], &g_old[i], NULL);
    g_handlers_on = false;
}

static void last_resort_restore(void) {
    if (!atomic_exchange(&g_term_active, false)) return;
    if (g_reset[0]) {
        ssize_t n = write(STDOUT_FILENO, g_reset, strlen(g_reset));
        (void)n;
    }
    if (g_tty_saved) tcsetattr(STDIN_FILENO, TCSANOW, &g_tty);
}

static void panic_restore(void *user) {
    (void)user;
    last_resort_restore();
}

/* exit() runs the atexit hook; ms_panic (engine/core/panic.h), which aborts, runs the same
 * restore as a panic hook. Both only write and tcsetattr, so they are safe from anywhere. */
static void register_atexit(void) {
    atexit(last_resort_restore);
    ms_panic_hook_add(panic_restore, NULL);
}

/* Appends a terminfo string capability to g_reset. */
static void add_reset(const char *cap) {
    char *s = tigetstr(cap);
    if (!s || s == (char *)-1) return;
    size_t have = strlen(g_reset), n = strlen(s);
    if (have + n + 1 <= sizeof g_reset) memcpy(g_reset + have, s, n + 1);
}

/* --- terminal ------------------------------------------------------------------------------ */

static void term_restore(ms_tui *t) {
    if (!t->term_on) return;
    atomic_store(&g_term_active, false);
    curs_set(1);
    endwin();
    t->term_on = false;
}

/* --- helpers shared with the screens ------------------------------------------------------ */

void ms_tui_flash(ms_tui *t, ms_tui_role role, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->msg, sizeof t->msg, fmt, ap);
    va_end(ap);
    t->msg_role = role;
    t->msg_until_ns = ms_now_ns() + FLASH_NS;
}

int ms_tui_clamp_scroll(int *scroll, int rows, int visible) {
    int max = rows - visible;
    if (max < 0) max = 0;
    if (*scroll > max) *scroll = max;
    if (*scroll < 0) *scroll = 0;
    return *scroll;
}

int ms_tui_nranks(const ms_snapshot *s) {
    if (!s) return 0;
    if (s->analysis.nranks > 0) return s->analysis.nranks;
    return s->info.nranks > 0 ? s->info.nranks : 0;
}

/* --- drawing ------------------------------------------------------------------------------ */

static void draw_header(ms_tui *t, const ms_snapshot *s, int w) {
    const ms_tui_paint *p = &t->paint;
    ms_tui_repeat(0, 0, w, p->role[MS_ROLE_HEADER], " ");
    int x = ms_tui_text(p, 0, 0, w, p->role[MS_ROLE_HEADER], " meshscope ");
    for (int i = 0; i < MS_TUI_NSCREENS && x < w; i++) {
        if (!screen_shown(i, s) && i != t->screen) continue;
        char tab[32];
        snprintf(tab, sizeof tab, " %d %s ", i + 1, screens[i]->name);
        ms_tui_role r = i == t->screen ? MS_ROLE_TAB_ACTIVE : MS_ROLE_TAB;
        x += ms_tui_text(p, 0, x, w - x, p->role[r], tab);
    }
    const char *state = NULL;
    ms_tui_role sr = MS_ROLE_TAB_ACTIVE;
    if (t->paused)
        state = " PAUSED ";
    else if (s && s->finished)
        state = s->info.live ? " finished " : " trace ";
    if (state && x + (int)strlen(state) + 1 <= w)
        ms_tui_text(p, 0, w - (int)strlen(state), (int)strlen(state), p->role[sr], state);

    char trouble[512];
    if (t->src->ops->trouble(t->src->self, trouble, sizeof trouble)) {
        ms_tui_text(p, 1, 0, w, p->role[MS_ROLE_BAD], trouble);
        return;
    }
    if (!s) {
        ms_tui_textf(p, 1, 0, w, p->role[MS_ROLE_DIM], "waiting for the first snapshot from %s",
                     t->src->where);
        return;
    }
    char line[512], step[32];
    if (s->step >= 0)
        snprintf(step, sizeof step, "%lld", (long long)s->step);
    else
        snprintf(step, sizeof step, "-");
    x = 0;
    x += ms_tui_text(p, 1, x, w - x, p->role[MS_ROLE_DIM], "step ");
    x += ms_tui_text(p, 1, x, w - x, p->role[MS_ROLE_VALUE], step);
    snprintf(line, sizeof line, "  %s  ", s->strategy[0] ? s->strategy : "-");
    x += ms_tui_text(p, 1, x, w - x, p->role[MS_ROLE_NORMAL], line);
    if (s->advisor_note[0]) { /* the advisor does not trust its model: more than the job's info */
        snprintf(line, sizeof line, "no advice: %s", s->advisor_note);
        ms_tui_text(p, 1, x, w - x, p->role[MS_ROLE_WARN], line);
        return;
    }
    snprintf(line, sizeof line, "%s | %s | %d ranks | %s", s->info.model[0] ? s->info.model : "?",
             s->info.backend[0] ? s->info.backend : "?", s->info.nranks, t->src->where);
    ms_tui_text(p, 1, x, w - x, p->role[MS_ROLE_DIM], line);
}

static void draw_footer(ms_tui *t, int y, int w) {
    const ms_tui_paint *p = &t->paint;
    if (t->msg[0] && ms_now_ns() < t->msg_until_ns) {
        ms_tui_text(p, y, 0, w, p->role[t->msg_role], t->msg);
        return;
    }
    t->msg[0] = '\0';
    if (t->snap && t->snap->hang_alert[0]) { /* a collective hangs: say so before the keys */
        ms_tui_text(p, y, 0, w, p->role[MS_ROLE_BAD], t->snap->hang_alert);
        return;
    }
    char keys[256];
    snprintf(keys, sizeof keys, "?:help  q:quit  p:%s  Tab:next  1-%d:screen  %s",
             t->paused ? "resume" : "pause", screens_shown(t->snap), screens[t->screen]->keys);
    ms_tui_text(p, y, 0, w, p->role[MS_ROLE_DIM], keys);
}

static void draw_help(ms_tui *t, int rows, int cols) {
    const char *const lines[] = {
        "Screens",
        "  1-7, Tab, Shift-Tab   overview, heatmap, timeline, reshards, memory, suggestions,",
        "                        pipeline (7: runs with pp > 1 only)",
        "Everywhere",
        "  ?                     this help (any key closes it)",
        t->src->in_process ? "  q                     quit: the job stops after its current step"
                           : "  q                     quit this view (the job keeps running)",
        "  p                     pause the display (keeps the last snapshot)",
        "  Up Down PgUp PgDn     scroll tables; Home / End jump",
        "  Ctrl-L                redraw the screen",
        "Heatmap",
        "  b  t  w               bytes, time, bandwidth (bytes / seconds) per rank pair",
        "  d                     all traffic, then each mesh dim in turn",
        "  Left Right            scroll columns when the ranks do not fit",
        "Pipeline",
        "  Up Down               scroll stages; a lane per stage: F B W blocks labelled and",
        "                        coloured by micro-batch, dots the bubble, measured vs formula",
        "Suggestions",
        "  Enter or a            review a suggestion; y in the box accepts it",
        "  x                     dismiss the selected suggestion",
        "Heat colours run from dark (little) to bright (most); '-' is no traffic.",
    };
    const ms_tui_paint *p = &t->paint;
    int n = (int)(sizeof lines / sizeof lines[0]);
    int bw = cols - 4 < 88 ? cols - 4 : 88, bh = n + 4 < rows - 2 ? n + 4 : rows - 2;
    int by = (rows - bh) / 2, bx = (cols - bw) / 2;
    ms_tui_box(p, by, bx, bh, bw, "help");
    for (int i = 0; i < n && i < bh - 3; i++) {
        bool head = lines[i][0] != ' ' && i != n - 1;
        ms_tui_text(p, by + 1 + i, bx + 2, bw - 4,
                    head ? p->role[MS_ROLE_TITLE] : p->role[MS_ROLE_NORMAL], lines[i]);
    }
    ms_tui_text(p, by + bh - 2, bx + 2, bw - 4, p->role[MS_ROLE_DIM], "press any key");
}

static void draw(ms_tui *t) {
    const ms_tui_paint *p = &t->paint;
    int rows = LINES, cols = COLS;
    erase();
    if (cols < MIN_COLS || rows < MIN_ROWS) {
        ms_tui_textf(p, 0, 0, cols, p->role[MS_ROLE_WARN],
                     "terminal too small (%dx%d): meshscope needs %dx%d; q quits", cols, rows,
                     MIN_COLS, MIN_ROWS);
        refresh();
        return;
    }
    const ms_snapshot *s = t->snap;
    draw_header(t, s, cols);
    if (s) {
        screens[t->screen]->draw(t, s, 2, rows - 3, cols);
    }
    draw_footer(t, rows - 1, cols);
    if (t->confirm_id && s) {
        const ms_suggestion *g = NULL;
        for (int i = 0; i < s->n_suggestions; i++)
            if (s->suggestions[i].id == t->confirm_id) g = &s->suggestions[i];
        if (g)
            ms_tui_draw_confirm(t, s, g);
        else
            t->confirm_id = 0;
    }
    if (t->help) draw_help(t, rows, cols);
    refresh();
}

/* --- keys --------------------------------------------------------------------------------- */

static void post(ms_tui *t, ms_live_req_kind kind, int32_t id, const char *done_msg) {
    ms_live_req req;
    memset(&req, 0, sizeof req);
    req.kind = (uint8_t)kind;
    req.id = id;
    ms_error err = {0};
    ms_status st = t->src->ops->post(t->src->self, &req, &err);
    if (st == MS_OK)
        ms_tui_flash(t, MS_ROLE_GOOD, "%s", done_msg);
    else
        ms_tui_flash(t, MS_ROLE_BAD, "%s", err.msg[0] ? err.msg : ms_status_str(st));
}

static ms_tui_key_result confirm_key(ms_tui *t, int ch) {
    int32_t id = t->confirm_id;
    if (ch == 'y' || ch == 'Y') {
        t->confirm_id = 0;
        char msg[128];
        snprintf(msg, sizeof msg,
                 "suggestion %d accepted: the job switches at its next step boundary", (int)id);
        post(t, MS_REQ_ACCEPT, id, msg);
    } else if (ch == 'n' || ch == 'N' || ch == 27 || ch == 'q' || ch == 'Q') {
        t->confirm_id = 0;
        ms_tui_flash(t, MS_ROLE_DIM, "not accepted");
    }
    return MS_KEY_HANDLED;
}

static ms_tui_key_result global_key(ms_tui *t, int ch) {
    switch (ch) {
        case 'q':
        case 'Q':
            return MS_KEY_QUIT;
        case '?':
        case 'h':
        case KEY_F(1):
            t->help = true;
            return MS_KEY_HANDLED;
        case 'p':
        case 'P':
            t->paused = !t->paused;
            return MS_KEY_HANDLED;
        case '\t':
            do t->screen = (t->screen + 1) % MS_TUI_NSCREENS;
            while (!screen_shown(t->screen, t->snap));
            return MS_KEY_HANDLED;
        case KEY_BTAB:
            do t->screen = (t->screen + MS_TUI_NSCREENS - 1) % MS_TUI_NSCREENS;
            while (!screen_shown(t->screen, t->snap));
            return MS_KEY_HANDLED;
        case 12: /* Ctrl-L */
            clearok(curscr, TRUE);
            return MS_KEY_HANDLED;
        case KEY_UP:
            t->scroll[t->screen]--;
            return MS_KEY_HANDLED;
        case KEY_DOWN:
            t->scroll[t->screen]++;
            return MS_KEY_HANDLED;
        case KEY_PPAGE:
            t->scroll[t->screen] -= 10;
            return MS_KEY_HANDLED;
        case KEY_NPAGE:
            t->scroll[t->screen] += 10;
            return MS_KEY_HANDLED;
        case KEY_HOME:
            t->scroll[t->screen] = 0;
            return MS_KEY_HANDLED;
        case KEY_END:
            t->scroll[t->screen] = 1 << 30; /* clamped when drawn */
            return MS_KEY_HANDLED;
        default:
            break;
    }
    if (ch >= '1' && ch < '1' + MS_TUI_NSCREENS) {
        if (!screen_shown(ch - '1', t->snap)) {
            ms_tui_flash(t, MS_ROLE_WARN, "%s", screens[ch - '1']->hidden);
            return MS_KEY_HANDLED;
        }
        t->screen = ch - '1';
        return MS_KEY_HANDLED;
    }
    return MS_KEY_IGNORED;
}

static ms_tui_key_result handle_key(ms_tui *t, int ch) {
    if (ch == KEY_RESIZE) {
        clearok(curscr, TRUE);
        return MS_KEY_HANDLED;
    }
    if (t->help) { /* any key closes the help */
        t->help = false;
        return MS_KEY_HANDLED;
    }
    if (t->confirm_id) return confirm_key(t, ch);
    const ms_tui_screen *sc = screens[t->screen];
    if (sc->key && t->snap) {
        ms_tui_key_result r = sc->key(t, t->snap, ch);
        if (r != MS_KEY_IGNORED) return r;
    }
    return global_key(t, ch);
}

/* --- the loop ------------------------------------------------------------------------------ */

static void take_snapshot(ms_tui *t) {
    const ms_snapshot *n = t->src->ops->poll(t->src->self);
    if (!n) return;
    if (t->snap) t->src->ops->release(t->src->self, t->snap);
    t->snap = n;
}

static void *ui_main(void *arg) {
    ms_tui *t = arg;
    bool quit = false;
    while (!atomic_load(&t->stop_req)) {
        if (g_signal) break;
        if (!t->paused || !t->snap) take_snapshot(t);
        draw(t);
        int ch = getch(); /* at most one tick */
        if (ch == ERR) continue;
        if (handle_key(t, ch) == MS_KEY_QUIT) {
            quit = true;
            break;
        }
    }
    /* A quit or a signal asks an in-process job to end after its step; a finished job has
     * nothing to stop (the post fails quietly). */
    if ((quit || g_signal) && t->src->in_process) {
        ms_live_req req;
        memset(&req, 0, sizeof req);
        req.kind = MS_REQ_STOP;
        t->src->ops->post(t->src->self, &req, NULL);
    }
    term_restore(t);
    handlers_restore();
    atomic_store(&t->done, true);
    return NULL;
}

ms_status ms_tui_start_source(ms_tui_source *src, ms_tui **out, ms_error *err) {
    *out = NULL;
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        ms_tui_source_destroy(src);
        return ms_fail(err, MS_ERR_INVALID,
                       "the terminal view needs a terminal: stdin and stdout must be a tty; "
                       "drop --tui (or run it in a terminal), or watch the job with "
                       "`meshscope top URL` from another one");
    }
    if (atomic_exchange(&g_busy, true)) {
        ms_tui_source_destroy(src);
        return ms_fail(err, MS_ERR_INVALID, "a terminal view is already running in this process");
    }
    /* The character type only: numbers elsewhere in the process (JSON, traces) keep the C
     * locale's decimal point. */
    setlocale(LC_CTYPE, "");
    bool utf8 = ms_tui_want_utf8(nl_langinfo(CODESET), getenv("MESHSCOPE_ASCII"));
    bool mono = ms_tui_want_mono(getenv("NO_COLOR"));

    ms_tui *t = xcalloc(1, sizeof *t);
    t->src = src;
    t->heat_dim = -1;
    g_tty_saved = tcgetattr(STDIN_FILENO, &g_tty) == 0;
    /* Our handlers go in first: curses installs its own for SIGINT and SIGTERM (which exit
     * the process) only where the disposition is still the default. */
    handlers_install();
    t->term = newterm(NULL, stdout, stdin);
    if (!t->term) {
        handlers_restore();
        const char *term = getenv("TERM");
        ms_tui_source_destroy(src);
        free(t);
        atomic_store(&g_busy, false);
        return ms_fail(err, MS_ERR_INVALID,
                       "cannot drive the terminal type '%s' (TERM): set TERM to one this system "
                       "knows, e.g. TERM=xterm-256color, or drop --tui",
                       term ? term : "");
    }
    set_term(t->term);
    t->term_on = true;
    g_reset[0] = '\0';
    add_reset("rmcup");
    add_reset("cnorm");
    add_reset("sgr0");
    pthread_once(&g_atexit_once, register_atexit);
    atomic_store(&g_term_active, true);
    cbreak();
    noecho();
    nonl();
    keypad(stdscr, TRUE);
    set_escdelay(25);
    curs_set(0);
    timeout(TICK_MS);
    ms_tui_paint_init(&t->paint, utf8, mono);
    if (pthread_create(&t->thread, NULL, ui_main, t) != 0) {
        term_restore(t);
        handlers_restore();
        delscreen(t->term);
        ms_tui_source_destroy(src);
        free(t);
        atomic_store(&g_busy, false);
        return ms_fail(err, MS_ERR_INTERNAL, "cannot start the terminal view's thread");
    }
    t->thread_started = true;
    *out = t;
    return MS_OK;
}

ms_status ms_tui_start(ms_live *live, ms_tui **out, ms_error *err) {
    return ms_tui_start_source(ms_tui_source_live(live), out, err);
}

bool ms_tui_done(const ms_tui *t) {
    return t && atomic_load(&((ms_tui *)t)->done);
}

void ms_tui_stop(ms_tui *t) {
    if (!t) return;
    atomic_store(&t->stop_req, true);
    if (t->thread_started) pthread_join(t->thread, NULL);
    term_restore(t); /* the thread has done it; this is for a thread that never ran */
    handlers_restore();
    if (t->term) delscreen(t->term);
    if (t->snap) t->src->ops->release(t->src->self, t->snap);
    ms_tui_source_destroy(t->src);
    free(t);
    atomic_store(&g_busy, false);
}

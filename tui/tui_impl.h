/* tui_impl.h - what the TUI's modules share: its state and the screen table.
 *
 * Everything here is touched only by the UI thread, except `done` and `stop_req` (atomics
 * read by the caller's thread).
 */
#ifndef MS_TUI_IMPL_H
#define MS_TUI_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "tui/paint.h"
#include "tui/source.h"
#include "tui/tui.h"

#define MS_TUI_NSCREENS 7

/* What a key handler did with a key. */
typedef enum ms_tui_key_result { MS_KEY_IGNORED, MS_KEY_HANDLED, MS_KEY_QUIT } ms_tui_key_result;

/* Heatmap quantity. */
typedef enum ms_tui_heat_mode {
    MS_HEAT_BYTES,
    MS_HEAT_TIME,
    MS_HEAT_BUSBW,
    MS_HEAT_MODE_COUNT
} ms_tui_heat_mode;

struct ms_tui {
    ms_tui_source *src;
    ms_tui_paint paint;
    SCREEN *term;
    bool term_on; /* the terminal is in curses mode */

    pthread_t thread;
    bool thread_started;
    atomic_bool stop_req; /* ms_tui_stop asks the loop to end */
    atomic_bool done;     /* the user quit, a signal arrived, or the loop ended */

    const ms_snapshot *snap; /* the one on screen (owned via src->release) */
    int screen;              /* index into ms_tui_screens */
    bool paused, help;
    int32_t confirm_id; /* the suggestion in the confirm box, 0 = none */

    /* Per-screen view state. */
    int scroll[MS_TUI_NSCREENS]; /* first table row shown */
    int hscroll;                 /* heatmap: first column shown */
    ms_tui_heat_mode heat_mode;
    int heat_dim; /* -1 = all traffic, else a mesh dim */
    /* suggestions: the highlighted one. Kept by id, since each advisor round may re-sort the
     * list: a row index would move the highlight, and Enter, onto another suggestion. */
    int32_t selected_id; /* 0: none yet, the first row */
    int selected;        /* its row in the latest snapshot */

    char msg[512]; /* a transient message in the footer */
    ms_tui_role msg_role;
    int64_t msg_until_ns;
};

/* A screen: draws itself into rows [y, y + h) of a `w`-column terminal, and may take keys
 * before the global ones (NULL: none). A screen with `shown` appears (tab, Tab cycling, its
 * number key) only for snapshots it returns true for; NULL: always. */
typedef struct ms_tui_screen {
    const char *name;
    const char *keys; /* the screen's own keys, for the footer */
    void (*draw)(ms_tui *t, const ms_snapshot *s, int y, int h, int w);
    ms_tui_key_result (*key)(ms_tui *t, const ms_snapshot *s, int ch);
    bool (*shown)(const ms_snapshot *s);
    const char *hidden; /* said when its key is pressed while hidden */
} ms_tui_screen;

extern const ms_tui_screen ms_tui_screen_overview, ms_tui_screen_heatmap, ms_tui_screen_timeline,
    ms_tui_screen_reshards, ms_tui_screen_memory, ms_tui_screen_suggestions, ms_tui_screen_pipeline;

/* Whether the snapshot describes a pipeline (pp > 1), i.e. the pipeline screen is shown. */
bool ms_tui_pipeline_shown(const ms_snapshot *s);

/* Shows msg in the footer for a few seconds. */
void ms_tui_flash(ms_tui *t, ms_tui_role role, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Rows of a scrolled table: clamps *scroll so that the last row can reach the bottom and
 * returns it. */
int ms_tui_clamp_scroll(int *scroll, int rows, int visible);

/* The number of ranks a snapshot describes (the analysis, else the job info). */
int ms_tui_nranks(const ms_snapshot *s);

/* The suggestion under the cursor on the suggestions screen, or NULL. */
const ms_suggestion *ms_tui_selected_suggestion(ms_tui *t, const ms_snapshot *s);

/* The confirm box for suggestion id (drawn over the screen). */
void ms_tui_draw_confirm(ms_tui *t, const ms_snapshot *s, const ms_suggestion *g);

#endif

/* tui.h - the terminal view: ncurses (wide-character) screens over live snapshots.
 *
 * The TUI reads snapshots through a source: the in-process live model (`train --tui`) or a
 * running job's dashboard over HTTP (`meshscope top URL`). It runs on its own thread with a
 * refresh tick that does not depend on key presses, and restores the terminal on every exit
 * path (q, errors, SIGINT/SIGTERM/SIGHUP, the job ending).
 *
 * Ownership: the caller owns the TUI and the live model it reads; stop the TUI first.
 */
#ifndef MS_TUI_H
#define MS_TUI_H

#include <stdbool.h>

#include "engine/core/status.h"
#include "profiler/live.h"

typedef struct ms_tui ms_tui;

/* Takes over the terminal (stdin/stdout must be a tty: MS_ERR_INVALID otherwise, saying
 * to drop --tui or run in a terminal) and starts the UI thread over live (borrowed). */
ms_status ms_tui_start(ms_live *live, ms_tui **out, ms_error *err);
/* True once the user pressed q (the TUI has then posted MS_REQ_STOP to the job) or a signal
 * asked the job to end. */
bool ms_tui_done(const ms_tui *t);
/* Restores the terminal and joins the UI thread. NULL is fine. */
void ms_tui_stop(ms_tui *t);

#endif

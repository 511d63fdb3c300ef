/* cmd_top.c - `meshscope top URL`: the terminal view of a job running elsewhere, read from
 * its dashboard (GET /api/v1/snapshot about twice a second, Bearer token). Accepting or
 * dismissing a suggestion posts to the dashboard; q leaves this view and never stops the job.
 *
 * Exit codes: 0 after q, 1 when the dashboard cannot be read (the message names the address
 * and the fix) or no terminal is attached, 2 usage errors.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "tui/source.h"
#include "tui/tui.h"

#include "cli/options.h"

int ms_cmd_top(int argc, char **argv) {
    const char *pos[1], *token = NULL;
    int npos = 0, interval = 500;
    bool read_only = false;
    const ms_option opts[] = {
        MS_TEXT("token", "TOKEN", &token, "the dashboard's token, when URL does not carry it"),
        MS_INT("interval", "MS", &interval, 50, 60000,
               "milliseconds between snapshots (default 500)"),
        MS_FLAG("read-only", &read_only, "no accepting or dismissing suggestions"),
    };
    const ms_opts_cmd cmd = {
        .name = "top",
        .synopsis = "URL [options]",
        .about = "The terminal view of a running job. URL is the dashboard line a job prints with "
                 "--web, e.g.\nhttp://127.0.0.1:8123/?token=0123abcd...\n"
                 "keys: 1-6 or Tab switch screens, ? help, p pause, q quit (the job keeps running)",
        MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, pos, 1, &npos);
    if (rc != MS_OPTS_PROCEED) return rc;
    const char *url = npos ? pos[0] : NULL;
    if (!url) {
        fprintf(stderr, "meshscope top: which job? Pass the dashboard line it printed, e.g.\n"
                        "  meshscope top 'http://127.0.0.1:8123/?token=...'\n"
                        "(start the job with `meshscope train ... --web 127.0.0.1:0`)\n");
        return 2;
    }
    char base[256], url_token[320];
    ms_error err = {0};
    if (ms_tui_parse_url(url, base, sizeof base, url_token, sizeof url_token, &err) != MS_OK) {
        fprintf(stderr, "meshscope top: %s\n", err.msg);
        return 2;
    }
    if (!token) token = url_token;

    ms_tui_source *src = NULL;
    if (ms_tui_source_http(base, token, interval, &src, &err) != MS_OK) {
        fprintf(stderr, "meshscope top: %s\n", err.msg);
        return 1;
    }
    src->read_only = read_only;
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        ms_tui_source_destroy(src);
        fprintf(stderr,
                "meshscope top: %s answers, but this is not a terminal (stdin and "
                "stdout must be a tty): run meshscope top in one\n",
                base);
        return 1;
    }
    ms_tui *t = NULL;
    if (ms_tui_start_source(src, &t, &err) != MS_OK) {
        fprintf(stderr, "meshscope top: %s\n", err.msg);
        return 1;
    }
    while (!ms_tui_done(t)) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    ms_tui_stop(t);
    return 0;
}

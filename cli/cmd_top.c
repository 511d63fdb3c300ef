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

static void usage(FILE *f) {
    fprintf(f,
            "usage: meshscope top URL [--token TOKEN] [--interval MS] [--read-only]\n"
            "\n"
            "  URL          the dashboard line a job prints with --web, e.g.\n"
            "               http://127.0.0.1:8123/?token=0123abcd...\n"
            "  --token      the token, when URL does not carry it\n"
            "  --interval   milliseconds between snapshots (default 500)\n"
            "  --read-only  no accepting or dismissing suggestions\n"
            "\n"
            "keys: 1-6 or Tab switch screens, ? help, p pause, q quit (the job keeps running)\n");
}

int ms_cmd_top(int argc, char **argv) {
    const char *url = NULL, *token = NULL;
    int interval = 500;
    bool read_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--token") || !strcmp(a, "--interval")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "meshscope top: %s needs a value\n", a);
                return 2;
            }
            if (!strcmp(a, "--token")) {
                token = argv[++i];
            } else {
                char *end = NULL;
                long v = strtol(argv[++i], &end, 10);
                if (!end || *end || v < 50 || v > 60000) {
                    fprintf(stderr,
                            "meshscope top: --interval '%s': expected milliseconds from 50 to "
                            "60000\n",
                            argv[i]);
                    return 2;
                }
                interval = (int)v;
            }
        } else if (!strcmp(a, "--read-only")) {
            read_only = true;
        } else if (a[0] == '-') {
            fprintf(stderr, "meshscope top: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (url) {
            fprintf(stderr, "meshscope top: one URL only (got '%s' and '%s')\n", url, a);
            return 2;
        } else {
            url = a;
        }
    }
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

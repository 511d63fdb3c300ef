/* cmd_top.c - `meshscope top URL`: the terminal view of a job running elsewhere, read from
 * its dashboard (GET /api/v1/snapshot about twice a second, Bearer token). Accepting or
 * dismissing a suggestion posts to the dashboard; q leaves this view and never stops the job.
 *
 * The token: a command line is readable by every local user (ps, /proc/PID/cmdline), so the
 * token has ways in that keep it out of one, as for Jupyter and kubectl: --token-file FILE,
 * --token - (standard input) and MESHSCOPE_TOKEN. --token TOKEN and the URL's ?token= still
 * work, with a warning. The first found counts: --token-file, --token (- included), the URL,
 * then MESHSCOPE_TOKEN.
 *
 * Exit codes: 0 after q, 1 when the dashboard cannot be read (the message names the address
 * and the fix) or no terminal is attached, 2 usage errors (a token that cannot be had
 * included: an empty, unreadable, over-long or not regular token file, say).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "engine/io/fileio.h"
#include "tui/source.h"
#include "tui/tui.h"

#include "cli/options.h"

#define TOKEN_MAX      256  /* the longest token sent (tui/source_http.c refuses more) */
#define TOKEN_FILE_MAX 4096 /* a token file is one short line: more is the wrong file */

/* The token and where it came from, for messages ("MESHSCOPE_TOKEN", "--token-file F"). */
typedef struct token_in {
    char text[TOKEN_FILE_MAX + 1];
    char from[320];
    bool given;      /* by any of the ways: then it must be a token */
    bool from_stdin; /* standard input is spent: keys come from the terminal */
} token_in;

static void warn_in_argv(const char *what) {
    fprintf(stderr,
            "meshscope top: warning: %s puts the token in the command line, which every local "
            "user can read (ps); use --token-file FILE, --token - (standard input) or "
            "MESHSCOPE_TOKEN\n",
            what);
}

/* Keeps the first line of text (n bytes), without its line end. */
static void first_line(token_in *t, const char *text, size_t n) {
    const char *nl = memchr(text, '\n', n);
    if (nl) n = (size_t)(nl - text);
    if (n && text[n - 1] == '\r') n--;
    memcpy(t->text, text, n);
    t->text[n] = '\0';
}

static bool token_from_file(token_in *t, const char *path) {
    snprintf(t->from, sizeof t->from, "--token-file %s", path);
    uint8_t *buf;
    size_t n;
    ms_error err = {0};
    if (ms_read_file(path, TOKEN_FILE_MAX, &buf, &n, &err) != MS_OK) {
        fprintf(stderr,
                "meshscope top: --token-file %s (want a regular file of at most %d bytes, the "
                "token on its first line: train --web-token-file FILE writes one)\n",
                err.msg, TOKEN_FILE_MAX);
        return false;
    }
    first_line(t, (const char *)buf, n);
    free(buf);
    struct stat sb;
    if (stat(path, &sb) == 0 && (sb.st_mode & (S_IRGRP | S_IROTH)))
        fprintf(stderr,
                "meshscope top: warning: --token-file %s can be read by other users (mode "
                "%03o): chmod 600 %s\n",
                path, (unsigned)(sb.st_mode & 0777), path);
    return true;
}

/* One line from fd, a byte at a time so that nothing after it is consumed; false on a read
 * error or a line longer than TOKEN_FILE_MAX. */
static bool read_line(int fd, token_in *t) {
    char buf[TOKEN_FILE_MAX + 1];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return false;
        if (r == 0 || buf[n] == '\n') break;
        if (++n > TOKEN_FILE_MAX) {
            errno = EMSGSIZE;
            return false;
        }
    }
    first_line(t, buf, n);
    return true;
}

/* --token -: a line from standard input; typed at a terminal, with a prompt and no echo. */
static bool token_from_stdin(token_in *t) {
    snprintf(t->from, sizeof t->from, "standard input (--token -)");
    t->from_stdin = true;
    struct termios old, quiet;
    bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &old) == 0;
    if (tty) {
        fprintf(stderr, "dashboard token: ");
        quiet = old;
        quiet.c_lflag &= ~(tcflag_t)ECHO;
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
    }
    bool ok = read_line(STDIN_FILENO, t);
    int e = errno;
    if (tty) {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
        fprintf(stderr, "\n");
    }
    if (!ok)
        fprintf(stderr,
                "meshscope top: --token -: cannot read the token from standard input: %s; "
                "pipe it one line of at most %d bytes\n",
                e == EMSGSIZE ? "the line is too long" : strerror(e), TOKEN_FILE_MAX);
    return ok;
}

/* The token by the precedence above, into t (empty: none given); false after a message. */
static bool find_token(token_in *t, const char *flag, const char *file, const char *url_token) {
    const char *env = getenv("MESHSCOPE_TOKEN");
    if (flag && file) {
        fprintf(stderr, "meshscope top: give the token one way: --token-file FILE or --token, "
                        "not both\n");
        return false;
    }
    if (flag && strcmp(flag, "-")) warn_in_argv("--token TOKEN");
    if (url_token[0]) warn_in_argv("the URL's ?token=");
    t->given = file || flag;
    if (file) return token_from_file(t, file);
    if (flag && !strcmp(flag, "-")) return token_from_stdin(t);
    const char *text = flag ? flag : url_token[0] ? url_token : env;
    snprintf(t->from, sizeof t->from, "%s",
             flag           ? "--token"
             : url_token[0] ? "the URL"
                            : "MESHSCOPE_TOKEN");
    if (!text) return true; /* none: the dashboard will say so */
    snprintf(t->text, sizeof t->text, "%s", text);
    t->given = true;
    return true;
}

/* An empty, over-long or garbled token is refused here, naming where it came from. */
static bool token_ok(const token_in *t) {
    size_t n = strlen(t->text);
    char why[64] = "";
    if (n == 0)
        snprintf(why, sizeof why, "is empty");
    else if (n > TOKEN_MAX)
        snprintf(why, sizeof why, "is longer than %d characters", TOKEN_MAX);
    for (size_t i = 0; !why[0] && i < n; i++)
        if ((unsigned char)t->text[i] <= 0x20 || t->text[i] == 0x7f)
            snprintf(why, sizeof why, "contains a space or control character");
    if (why[0])
        fprintf(stderr,
                "meshscope top: the token from %s %s: give the token of the dashboard line the "
                "job printed (after ?token=), alone\n",
                t->from, why);
    return !why[0];
}

/* Keys come from standard input: after a token was piped there, from the terminal. */
static void keys_from_terminal(void) {
    int fd = open("/dev/tty", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return; /* none: the terminal check below says so */
    dup2(fd, STDIN_FILENO);
    close(fd);
}

static int run_view(const char *base, const char *token, int interval, bool read_only,
                    bool keys_moved) {
    ms_error err = {0};
    ms_tui_source *src = NULL;
    if (ms_tui_source_http(base, token, interval, &src, &err) != MS_OK) {
        fprintf(stderr, "meshscope top: %s\n", err.msg);
        return 1;
    }
    src->read_only = read_only;
    if (keys_moved && !isatty(STDIN_FILENO)) keys_from_terminal();
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

int ms_cmd_top(int argc, char **argv) {
    const char *pos[1], *token = NULL, *token_file = NULL;
    int npos = 0, interval = 500;
    bool read_only = false;
    const ms_option opts[] = {
        MS_TEXT("token-file", "FILE", &token_file,
                "the token: FILE's first line (train --web-token-file FILE writes it)"),
        MS_TEXT("token", "TOKEN|-", &token,
                "the token; -: read from standard input (a TOKEN here shows in ps)"),
        MS_INT("interval", "MS", &interval, 50, 60000,
               "milliseconds between snapshots (default 500)"),
        MS_FLAG("read-only", &read_only, "no accepting or dismissing suggestions"),
    };
    const ms_opts_cmd cmd = {
        .name = "top",
        .synopsis = "URL [options]",
        .about = "The terminal view of a running job. URL is its dashboard, e.g. "
                 "http://127.0.0.1:8123.\n"
                 "The token, the first found: --token-file FILE, --token - (standard input), "
                 "--token TOKEN,\n"
                 "the URL's ?token=TOKEN, then the environment's MESHSCOPE_TOKEN. Every local "
                 "user can read\n"
                 "a command line (ps): --token TOKEN and ?token= work, with a warning.\n"
                 "keys: 1-6 or Tab switch screens, ? help, p pause, q quit (the job keeps "
                 "running)",
        MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, pos, 1, &npos);
    if (rc != MS_OPTS_PROCEED) return rc;
    const char *url = npos ? pos[0] : NULL;
    if (!url) {
        fprintf(stderr, "meshscope top: which job? Pass its dashboard address and token, e.g.\n"
                        "  meshscope top http://127.0.0.1:8123 --token-file FILE\n"
                        "(start the job with `meshscope train ... --web 127.0.0.1:0 "
                        "--web-token-file FILE`)\n");
        return 2;
    }
    char base[256], url_token[320];
    ms_error err = {0};
    if (ms_tui_parse_url(url, base, sizeof base, url_token, sizeof url_token, &err) != MS_OK) {
        fprintf(stderr, "meshscope top: %s\n", err.msg);
        return 2;
    }
    token_in t = {0};
    if (!find_token(&t, token, token_file, url_token) || (t.given && !token_ok(&t))) return 2;
    return run_view(base, t.text, interval, read_only, t.from_stdin);
}

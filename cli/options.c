/* options.c - the option tables of options.h, parsed with getopt_long.
 *
 * Each table entry becomes a struct option whose val is OPT_LONG + its index, and its short
 * name (if any) a letter in the option string; so getopt_long's answer says both which entry
 * matched and how it was spelled. The option string starts with "-" (positional arguments
 * come back in order as 1, argv is never permuted) and ":" (a missing argument comes back as
 * ':', not '?'), and opterr is cleared: every message is ours. */
#include "cli/options.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/runtime/ctx.h"

#define OPT_LONG 0x100 /* above every short option letter */

/* The implicit -h, --help: one past the table's entries. */
static bool is_help(const ms_opts_cmd *cmd, int val) {
    return val == 'h' || val == OPT_LONG + cmd->n_opts;
}

static bool takes_arg(const ms_option *o) {
    return o->kind != MS_OPT_FLAG;
}

static const ms_option *by_short(const ms_opts_cmd *cmd, int c) {
    for (int i = 0; i < cmd->n_opts; i++)
        if (cmd->opts[i].short_name && cmd->opts[i].short_name == c) return &cmd->opts[i];
    return NULL;
}

/* The flag as typed: "--name" (val from a long option) or "-c". */
static void flag_name(const ms_opts_cmd *cmd, int val, char *out, size_t cap) {
    if (val >= OPT_LONG)
        snprintf(out, cap, "--%s",
                 val - OPT_LONG < cmd->n_opts ? cmd->opts[val - OPT_LONG].name : "help");
    else
        snprintf(out, cap, "-%c", val);
}

static bool fail(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(char *msg, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return false;
}

/* Stores value (NULL for a flag) as o says; on bad input fills msg naming `flag`. */
static bool store(const ms_option *o, const char *flag, const char *value, char *msg, size_t cap) {
    if (o->fn) {
        char why[200] = "";
        if (o->fn(value, o->dest, why, sizeof why)) return true;
        return value ? fail(msg, cap, "bad value '%s' for %s: %s", value, flag, why)
                     : fail(msg, cap, "%s: %s", flag, why);
    }
    switch (o->kind) {
        case MS_OPT_FLAG:
            *(bool *)o->dest = true;
            return true;
        case MS_OPT_INT: {
            char *end;
            errno = 0;
            long long v = strtoll(value, &end, 10);
            if (!*value || *end || errno || (double)v < o->min || (double)v > o->max)
                return fail(msg, cap,
                            "bad value '%s' for %s: expected an integer from %.0f to %.0f", value,
                            flag, o->min, o->max);
            *(int *)o->dest = (int)v;
            return true;
        }
        case MS_OPT_DOUBLE: {
            char *end;
            double v = strtod(value, &end);
            if (!*value || *end || !(v >= o->min && v <= o->max))
                return fail(msg, cap, "bad value '%s' for %s: expected a number from %g to %g",
                            value, flag, o->min, o->max);
            *(double *)o->dest = v;
            return true;
        }
        case MS_OPT_STRING:
            *(const char **)o->dest = value;
            return true;
        case MS_OPT_ENUM: {
            int n = 0;
            for (; o->choices[n]; n++)
                if (!strcmp(value, o->choices[n])) {
                    *(int *)o->dest = n;
                    return true;
                }
            size_t k = (size_t)snprintf(msg, cap, "bad value '%s' for %s: use ", value, flag);
            for (int i = 0; i < n && k < cap; i++)
                k += (size_t)snprintf(msg + k, cap - k, "%s%s", o->choices[i],
                                      i + 2 < n    ? ", "
                                      : i + 2 == n ? " or "
                                                   : "");
            return false;
        }
    }
    return fail(msg, cap, "%s: unknown kind of option", flag);
}

/* The argument's name in help and messages: the metavar, an enum's choices as a|b|c, "ARG";
 * empty for a flag. */
static void metavar(const ms_option *o, char *out, size_t cap) {
    out[0] = '\0';
    if (o->kind == MS_OPT_ENUM && !o->metavar && o->choices) {
        size_t k = 0;
        for (int i = 0; o->choices[i] && k < cap; i++)
            k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? "|" : "", o->choices[i]);
    } else if (takes_arg(o)) {
        snprintf(out, cap, "%s", o->metavar ? o->metavar : "ARG");
    }
}

/* "--name" as typed: argv element text up to any '='. */
static void typed_name(const char *arg, char *out, size_t cap) {
    size_t n = strcspn(arg, "=");
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), arg);
}

static bool unknown(const ms_opts_cmd *cmd, const char *arg, char *msg, size_t cap) {
    char name[64];
    typed_name(arg, name, sizeof name);
    const char *s = ms_opts_suggest(cmd, name);
    if (s) return fail(msg, cap, "unknown option '%s'; did you mean '--%s'?", name, s);
    return fail(msg, cap, "unknown option '%s'; 'meshscope %s --help' lists the options", name,
                cmd->name);
}

/* Whether arg spells "--name" in full (optionally with "=value"). */
static bool exact(const char *arg, const char *name) {
    size_t k = strlen(name);
    return !strncmp(arg, "--", 2) && !strncmp(arg + 2, name, k) &&
           (!arg[2 + k] || arg[2 + k] == '=');
}

static bool positional(const char **pos, int max_pos, int *npos, const char *arg, char *msg,
                       size_t cap) {
    if (*npos < max_pos) {
        pos[(*npos)++] = arg;
        return true;
    }
    if (max_pos > 0)
        return fail(msg, cap, "unexpected argument '%s' (after '%s')", arg, pos[max_pos - 1]);
    return fail(msg, cap, "unexpected argument '%s'", arg);
}

ms_opts_status ms_opts_parse(const ms_opts_cmd *cmd, int argc, char **argv, const char **pos,
                             int max_pos, int *n_pos, char *msg, size_t cap) {
    int n = cmd->n_opts;
    struct option *lo = xcalloc((size_t)n + 2, sizeof *lo);
    char *shorts = xmalloc(2 * (size_t)n + 8);
    size_t ns = 0;
    shorts[ns++] = '-';
    shorts[ns++] = ':';
    shorts[ns++] = 'h';
    for (int i = 0; i < n; i++) {
        const ms_option *o = &cmd->opts[i];
        lo[i] = (struct option){o->name, takes_arg(o) ? required_argument : no_argument, NULL,
                                OPT_LONG + i};
        if (o->short_name) {
            shorts[ns++] = o->short_name;
            if (takes_arg(o)) shorts[ns++] = ':';
        }
    }
    lo[n] = (struct option){"help", no_argument, NULL, OPT_LONG + n};
    shorts[ns] = '\0';

    ms_opts_status st = MS_OPTS_OK;
    int npos = 0;
    msg[0] = '\0';
    optind = 0; /* glibc: 0 re-initialises the scan completely */
    opterr = 0;
    for (;;) {
        int at = optind > 0 ? optind : 1; /* the argv element this call looks at */
        int c = getopt_long(argc, argv, shorts, lo, NULL);
        if (c == -1) break;
        bool ok = true;
        if (c == 1) {
            ok = positional(pos, max_pos, &npos, optarg, msg, cap);
        } else if (c == ':') {
            const ms_option *o =
                optopt >= OPT_LONG ? &cmd->opts[optopt - OPT_LONG] : by_short(cmd, optopt);
            char flag[72], meta[160];
            flag_name(cmd, optopt, flag, sizeof flag);
            metavar(o, meta, sizeof meta);
            ok = fail(msg, cap, "%s needs a value: %s %s", flag, flag, meta);
        } else if (c == '?') {
            char flag[72];
            flag_name(cmd, optopt, flag, sizeof flag);
            if (optopt >= OPT_LONG)
                ok = fail(msg, cap, "%s takes no value (got '%s')", flag, argv[at]);
            else if (optopt && argv[at][1] != '-' && strlen(argv[at]) > 2)
                ok = unknown(cmd, argv[at], msg, cap); /* "-steps": a long name, one dash */
            else if (optopt)
                ok = fail(msg, cap, "unknown option '%s'; 'meshscope %s --help' lists the options",
                          flag, cmd->name);
            else
                ok = unknown(cmd, argv[at], msg, cap); /* unknown or ambiguous long name */
        } else if (c >= OPT_LONG && !exact(argv[at], lo[c - OPT_LONG].name)) {
            ok = unknown(cmd, argv[at], msg, cap); /* getopt_long took an abbreviation */
        } else if (is_help(cmd, c)) {
            st = MS_OPTS_HELP;
            break;
        } else {
            const ms_option *o = c >= OPT_LONG ? &cmd->opts[c - OPT_LONG] : by_short(cmd, c);
            char flag[72];
            flag_name(cmd, c, flag, sizeof flag);
            ok = store(o, flag, takes_arg(o) ? optarg : NULL, msg, cap);
        }
        if (!ok) {
            st = MS_OPTS_ERROR;
            break;
        }
    }
    /* After "--": the rest is positional. */
    for (int i = optind; st == MS_OPTS_OK && i < argc; i++)
        if (!positional(pos, max_pos, &npos, argv[i], msg, cap)) st = MS_OPTS_ERROR;
    if (st == MS_OPTS_OK && npos < cmd->min_pos) {
        fail(msg, cap, "give %s (usage: meshscope %s %s)",
             cmd->pos_name ? cmd->pos_name : "arguments", cmd->name,
             cmd->synopsis ? cmd->synopsis : "");
        st = MS_OPTS_ERROR;
    }
    if (n_pos) *n_pos = npos;
    free(lo);
    free(shorts);
    return st;
}

/* Optimal string alignment distance: edits, with a swap of neighbours counting as one. */
static int distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const char *ms_opts_suggest(const ms_opts_cmd *cmd, const char *arg) {
    char word[64];
    const char *w = arg + (arg[0] == '-') + (arg[0] == '-' && arg[1] == '-');
    typed_name(w, word, sizeof word);
    size_t len = strlen(word);
    if (!len) return NULL;
    int limit = len < 4 ? 1 : len < 9 ? 2 : 3;
    const char *best = NULL, *prefix_of = NULL;
    int best_d = limit + 1;
    for (int i = 0; i <= cmd->n_opts; i++) {
        const char *name = i < cmd->n_opts ? cmd->opts[i].name : "help";
        int d = distance(word, name);
        if (d < best_d) best_d = d, best = name;
        if (!prefix_of && len >= 2 && !strncmp(name, word, len)) prefix_of = name;
    }
    return best ? best : prefix_of;
}

/* "--name METAVAR", with "-c, " (or room for it) before it, into out. */
static int left_column(const ms_option *o, char *out, size_t cap) {
    char meta[160];
    metavar(o, meta, sizeof meta);
    char sh[8] = "    ";
    if (o->short_name) snprintf(sh, sizeof sh, "-%c, ", o->short_name);
    return snprintf(out, cap, "%s--%s%s%s", sh, o->name, meta[0] ? " " : "", meta);
}

void ms_opts_help(const ms_opts_cmd *cmd, FILE *f) {
    fprintf(f, "usage: meshscope %s%s%s\n", cmd->name, cmd->synopsis ? " " : "",
            cmd->synopsis ? cmd->synopsis : "");
    if (cmd->about) fprintf(f, "\n%s\n", cmd->about);
    const ms_option help = {
        .name = "help", .short_name = 'h', .kind = MS_OPT_FLAG, .help = "show this help and exit"};
    int width = 0;
    char col[256];
    for (int i = 0; i <= cmd->n_opts; i++) {
        int w = left_column(i < cmd->n_opts ? &cmd->opts[i] : &help, col, sizeof col);
        if (w > width && w <= 30) width = w;
    }
    fprintf(f, "\noptions:\n");
    for (int i = 0; i <= cmd->n_opts; i++) {
        const ms_option *o = i < cmd->n_opts ? &cmd->opts[i] : &help;
        left_column(o, col, sizeof col);
        fprintf(f, "  %-*s  %s\n", width, col, o->help ? o->help : "");
    }
}

int ms_opts_run(const ms_opts_cmd *cmd, int argc, char **argv, const char **pos, int max_pos,
                int *n_pos) {
    char msg[512];
    switch (ms_opts_parse(cmd, argc, argv, pos, max_pos, n_pos, msg, sizeof msg)) {
        case MS_OPTS_OK:
            return MS_OPTS_PROCEED;
        case MS_OPTS_HELP:
            ms_opts_help(cmd, stdout);
            return 0;
        case MS_OPTS_ERROR:
            break;
    }
    fprintf(stderr, "meshscope %s: %s\n", cmd->name, msg);
    return 2;
}

const char *const ms_cli_backend_names[] = {"threads", "mpi", NULL};
static_assert(MS_BACKEND_THREADS == 0 && MS_BACKEND_MPI == 1 && MS_BACKEND_COUNT == 2,
              "ms_cli_backend_names follows ms_backend_kind");

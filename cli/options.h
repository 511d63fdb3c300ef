/* options.h - one command-line parser for every subcommand, built on getopt_long.
 *
 * A command declares a table of its options: long name, optional short name, the kind of
 * argument (none, an integer or a number in a range, text, one of a list of choices, or text
 * handed to a callback), a metavar, one line of help, and where the value goes. The parser
 * checks every value against the table and answers with a message that names the flag, the
 * value and what is accepted; an unknown flag gets the closest one in the table suggested.
 * The help text is generated from the same table, so it cannot miss an option.
 *
 * Long names must be given whole: getopt_long's prefix abbreviations are refused, so that
 * `--step` is an error (with '--steps' suggested) rather than a silent `--steps`.
 * Positional arguments are returned in order wherever they appear among the options (no
 * argv permutation); everything after "--" is positional. -h and --help are implicit.
 *
 * getopt_long keeps its state in globals (optind, optarg, ...): parsing resets them first, so
 * any number of parses can run one after another, but not from two threads at once.
 */
#ifndef MS_OPTIONS_H
#define MS_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum ms_opt_kind {
    MS_OPT_FLAG,   /* no argument: *(bool *)dest = true */
    MS_OPT_INT,    /* a decimal integer in [min, max]: *(int *)dest */
    MS_OPT_DOUBLE, /* a number in [min, max]: *(double *)dest */
    MS_OPT_STRING, /* any text: *(const char **)dest points into argv */
    MS_OPT_ENUM,   /* one of choices: *(int *)dest = its index */
} ms_opt_kind;

/* A callback parses the option's text itself (NULL for MS_OPT_FLAG) into dest. On bad input
 * it writes what it expected to msg ("a size such as 4K or 1M") and returns false. */
typedef bool (*ms_opt_fn)(const char *value, void *dest, char *msg, size_t cap);

typedef struct ms_option {
    const char *name;           /* long name without the dashes: "steps" */
    char short_name;            /* 'o' for -o; 0 for none */
    ms_opt_kind kind;           /* with fn: MS_OPT_FLAG (no argument) or MS_OPT_STRING (one) */
    const char *metavar;        /* the argument in help: "N", "FILE"; NULL: "ARG" (enum: a|b|c) */
    const char *help;           /* one line */
    void *dest;                 /* where the value goes, typed as kind says; the callback's dest */
    double min, max;            /* MS_OPT_INT and MS_OPT_DOUBLE: the accepted range, inclusive */
    const char *const *choices; /* MS_OPT_ENUM: the accepted words, NULL-terminated */
    ms_opt_fn fn;               /* when set, called with the text instead of storing it */
} ms_option;

/* Shorthand for the common table entries (each a brace initialiser of ms_option). */
#define MS_FLAG(nm, field, text)                                                                   \
    { .name = (nm), .kind = MS_OPT_FLAG, .help = (text), .dest = (field) }
#define MS_TEXT(nm, mv, field, text)                                                               \
    { .name = (nm), .kind = MS_OPT_STRING, .metavar = (mv), .help = (text), .dest = (field) }
#define MS_INT(nm, mv, field, lo, hi, text)                                                        \
    {                                                                                              \
        .name = (nm), .kind = MS_OPT_INT, .metavar = (mv), .help = (text), .dest = (field),        \
        .min = (lo), .max = (hi)                                                                   \
    }
#define MS_NUM(nm, mv, field, lo, hi, text)                                                        \
    {                                                                                              \
        .name = (nm), .kind = MS_OPT_DOUBLE, .metavar = (mv), .help = (text), .dest = (field),     \
        .min = (lo), .max = (hi)                                                                   \
    }
#define MS_CALL(nm, mv, field, func, text)                                                         \
    {                                                                                              \
        .name = (nm), .kind = MS_OPT_STRING, .metavar = (mv), .help = (text), .dest = (field),     \
        .fn = (func)                                                                               \
    }
#define MS_ENUM(nm, field, words, text)                                                            \
    { .name = (nm), .kind = MS_OPT_ENUM, .help = (text), .dest = (field), .choices = (words) }

/* A command: its name in messages ("train", "bench comm"), the rest of its usage line, an
 * optional paragraph for its help, its options, and how many positional arguments it needs. */
typedef struct ms_opts_cmd {
    const char *name;
    const char *synopsis; /* "--model CONFIG --data FILE [options]" */
    const char *about;    /* printed under the usage line; may hold newlines; NULL: none */
    const ms_option *opts;
    int n_opts;
    int min_pos;          /* positional arguments required; fewer is an error ... */
    const char *pos_name; /* ... that says what to give: "a trace file" */
} ms_opts_cmd;

/* .opts and .n_opts of an ms_opts_cmd from an array: {.name = "x", MS_OPTS_TABLE(opts)}. */
#define MS_OPTS_TABLE(arr) .opts = (arr), .n_opts = (int)(sizeof(arr) / sizeof((arr)[0]))

typedef enum ms_opts_status {
    MS_OPTS_OK,    /* parsed; the values are stored */
    MS_OPTS_HELP,  /* -h or --help was given (parsing stopped there) */
    MS_OPTS_ERROR, /* bad input; msg says what and names the flag */
} ms_opts_status;

/* Parses argv[1..argc-1] (argv[0] is the command's name) against cmd's table, storing values
 * as they come. Positional arguments go to pos in order (up to max_pos, more is an error;
 * pos may be NULL when max_pos is 0), their count to *n_pos (may be NULL). On MS_OPTS_ERROR
 * msg holds one line, without the command's name. argv is not reordered. */
ms_opts_status ms_opts_parse(const ms_opts_cmd *cmd, int argc, char **argv, const char **pos,
                             int max_pos, int *n_pos, char *msg, size_t cap);

/* Writes the command's help: usage line, about, then one line per option (and -h, --help). */
void ms_opts_help(const ms_opts_cmd *cmd, FILE *f);

/* The CLI's wrapper of ms_opts_parse: prints the help to stdout (returns 0) or the error to
 * stderr as "meshscope NAME: ..." (returns 2), or returns MS_OPTS_PROCEED when the command
 * should run. */
#define MS_OPTS_PROCEED (-1)
int ms_opts_run(const ms_opts_cmd *cmd, int argc, char **argv, const char **pos, int max_pos,
                int *n_pos);

/* The long name (without dashes) in cmd's table, "help" included, closest to the unknown
 * option arg ("--step", "--step=3", "-steps") by edit distance, or a name arg is the start
 * of; NULL when none is close enough to be worth suggesting. */
const char *ms_opts_suggest(const ms_opts_cmd *cmd, const char *arg);

/* --- shared by several commands --------------------------------------------------------- */

/* The --backend words, in ms_backend_kind order (runtime/ctx.h), and the option that takes
 * them into an int (cast it to ms_backend_kind). */
extern const char *const ms_cli_backend_names[];
#define MS_ENUM_BACKEND(field)                                                                     \
    MS_ENUM("backend", field, ms_cli_backend_names,                                                \
            "communicator (default: mpi when started by mpirun, else threads)")

#endif

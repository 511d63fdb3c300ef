/* test_options.c - the command-line option parser (cli/options.h): values land where the
 * table says, ranges and choices are enforced with messages naming the flag, the value and
 * what is accepted, missing arguments and unknown flags are refused (with the closest flag
 * suggested, never a silent abbreviation), positional arguments keep their order, the help
 * lists every option, and one parse leaves nothing behind for the next.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testkit.h"

#include "cli/options.h"

typedef struct vals {
    int steps, mode;
    double lr;
    const char *out;
    bool json;
    int evens; /* set by a callback */
} vals;

static bool opt_even(const char *v, void *dest, char *msg, size_t cap) {
    char *end;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n % 2) {
        snprintf(msg, cap, "expected an even number");
        return false;
    }
    *(int *)dest = (int)n;
    return true;
}

static const char *const modes[] = {"fast", "slow", "exact", NULL};

/* A small command over v; its table lives as long as the test. */
typedef struct fixture {
    vals v;
    ms_option opts[6];
    ms_opts_cmd cmd;
} fixture;

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    f->v = (vals){.steps = 100, .lr = 1e-3};
    const ms_option opts[] = {
        MS_INT("steps", "N", &f->v.steps, 0, 1000, "optimizer steps"),
        MS_NUM("lr", "LR", &f->v.lr, 0, 10, "learning rate"),
        MS_ENUM("mode", &f->v.mode, modes, "how to run"),
        {.name = "output",
         .short_name = 'o',
         .kind = MS_OPT_STRING,
         .metavar = "FILE",
         .help = "where to write",
         .dest = &f->v.out},
        MS_FLAG("json", &f->v.json, "print JSON"),
        MS_CALL("even", "N", &f->v.evens, opt_even, "an even number"),
    };
    memcpy(f->opts, opts, sizeof opts);
    f->cmd = (ms_opts_cmd){.name = "thing",
                           .synopsis = "[options] FILE...",
                           .about = "Does a thing.",
                           MS_OPTS_TABLE(f->opts)};
}

typedef struct result {
    ms_opts_status st;
    char msg[512];
    const char *pos[8];
    int npos;
} result;

/* Parses the NULL-terminated words after the command name. */
static result parse(fixture *f, const char *const *words) {
    char *argv[32] = {"thing"};
    int argc = 1;
    for (; words[argc - 1]; argc++) argv[argc] = (char *)words[argc - 1];
    result r = {0};
    r.st = ms_opts_parse(&f->cmd, argc, argv, r.pos, 8, &r.npos, r.msg, sizeof r.msg);
    return r;
}

#define PARSE(f, ...) parse((f), (const char *const[]){__VA_ARGS__, NULL})

static void assert_contains(const char *text, const char *want) {
    if (!strstr(text, want)) fail_msg("wanted '%s' in '%s'", want, text);
}

static void test_values(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    result r = PARSE(&f, "--steps", "7", "--lr=0.5", "--mode", "exact", "-o", "x.json", "--json",
                     "--even", "4");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_int_equal(f.v.steps, 7);
    assert_true(f.v.lr == 0.5);
    assert_int_equal(f.v.mode, 2);
    assert_string_equal(f.v.out, "x.json");
    assert_true(f.v.json);
    assert_int_equal(f.v.evens, 4);
    assert_int_equal(r.npos, 0);
    /* Long form of a short option, attached short value, and the untouched defaults. */
    fixture_init(&f);
    r = PARSE(&f, "--output", "a", "-ob");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_string_equal(f.v.out, "b");
    assert_int_equal(f.v.steps, 100);
    assert_true(f.v.lr == 1e-3);
}

static void test_ranges(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    result r = PARSE(&f, "--steps", "1001");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "bad value '1001' for --steps: expected an integer from 0 to 1000");
    assert_int_equal(f.v.steps, 100);
    r = PARSE(&f, "--steps", "-1");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "'-1' for --steps");
    r = PARSE(&f, "--steps", "lots");
    assert_contains(r.msg, "bad value 'lots' for --steps");
    r = PARSE(&f, "--steps", "");
    assert_contains(r.msg, "bad value '' for --steps");
    r = PARSE(&f, "--steps", "12x");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    r = PARSE(&f, "--steps", "99999999999999999999");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    r = PARSE(&f, "--steps", "0");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_int_equal(f.v.steps, 0);
    r = PARSE(&f, "--steps", "1000");
    assert_int_equal(r.st, MS_OPTS_OK);

    r = PARSE(&f, "--lr", "11");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "bad value '11' for --lr: expected a number from 0 to 10");
    r = PARSE(&f, "--lr", "nan");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    r = PARSE(&f, "--lr", "1e-4");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_true(f.v.lr == 1e-4);

    r = PARSE(&f, "--even", "3");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "bad value '3' for --even: expected an even number");
}

static void test_choices(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    result r = PARSE(&f, "--mode", "slow");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_int_equal(f.v.mode, 1);
    r = PARSE(&f, "--mode", "quick");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "bad value 'quick' for --mode: use fast, slow or exact");
    r = PARSE(&f, "--mode", "Fast");
    assert_int_equal(r.st, MS_OPTS_ERROR);
}

static void test_missing_argument(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    result r = PARSE(&f, "--steps");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "--steps needs a value: --steps N");
    r = PARSE(&f, "--json", "-o");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "-o needs a value: -o FILE");
    r = PARSE(&f, "--mode");
    assert_contains(r.msg, "--mode needs a value: --mode fast|slow|exact");
    r = PARSE(&f, "--json=yes");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "--json takes no value");
}

static void test_unknown_and_suggestion(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    /* An abbreviation getopt_long would take is refused, with the whole name suggested. */
    result r = PARSE(&f, "--step", "3");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_string_equal(r.msg, "unknown option '--step'; did you mean '--steps'?");
    assert_int_equal(f.v.steps, 100);
    r = PARSE(&f, "--stpes=3");
    assert_string_equal(r.msg, "unknown option '--stpes'; did you mean '--steps'?");
    r = PARSE(&f, "--jsno");
    assert_string_equal(r.msg, "unknown option '--jsno'; did you mean '--json'?");
    r = PARSE(&f, "--outptu", "x");
    assert_contains(r.msg, "did you mean '--output'?");
    r = PARSE(&f, "-steps");
    assert_contains(r.msg, "unknown option '-steps'; did you mean '--steps'?");
    r = PARSE(&f, "--hepl");
    assert_contains(r.msg, "did you mean '--help'?");
    r = PARSE(&f, "--frobnicate");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_contains(r.msg, "unknown option '--frobnicate'; 'meshscope thing --help' lists");
    assert_null(strstr(r.msg, "did you mean"));
    r = PARSE(&f, "-x");
    assert_contains(r.msg, "unknown option '-x'");
    assert_string_equal(ms_opts_suggest(&f.cmd, "--mod"), "mode");
    assert_string_equal(ms_opts_suggest(&f.cmd, "--ev"), "even");
    assert_null(ms_opts_suggest(&f.cmd, "--zzzzzzzz"));
}

static void test_positional_and_help(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    /* Positionals in order wherever they are, argv left as it was; "--" ends the options. */
    char *argv[] = {"thing", "a", "--json", "b", "--steps", "5", "-", "--", "--steps", NULL};
    char *copy[10];
    memcpy(copy, argv, sizeof argv);
    result r = {0};
    r.st = ms_opts_parse(&f.cmd, 9, argv, r.pos, 8, &r.npos, r.msg, sizeof r.msg);
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_int_equal(r.npos, 4);
    assert_string_equal(r.pos[0], "a");
    assert_string_equal(r.pos[1], "b");
    assert_string_equal(r.pos[2], "-");
    assert_string_equal(r.pos[3], "--steps");
    assert_int_equal(f.v.steps, 5);
    assert_memory_equal(argv, copy, sizeof argv);
    /* Too many positionals, or any where none is taken. */
    char *three[] = {"thing", "a", "b", NULL};
    const char *one[1];
    int n = 0;
    assert_int_equal(ms_opts_parse(&f.cmd, 3, three, one, 1, &n, r.msg, sizeof r.msg),
                     MS_OPTS_ERROR);
    assert_contains(r.msg, "unexpected argument 'b' (after 'a')");
    assert_int_equal(ms_opts_parse(&f.cmd, 3, three, NULL, 0, NULL, r.msg, sizeof r.msg),
                     MS_OPTS_ERROR);
    assert_contains(r.msg, "unexpected argument 'a'");
    /* Too few. */
    f.cmd.min_pos = 2;
    f.cmd.pos_name = "two files";
    r = PARSE(&f, "a", "--json");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    assert_string_equal(r.msg, "give two files (usage: meshscope thing [options] FILE...)");
    r = PARSE(&f, "a", "--json", "b");
    assert_int_equal(r.st, MS_OPTS_OK);
    r = PARSE(&f, "--help");
    assert_int_equal(r.st, MS_OPTS_HELP);
    f.cmd.min_pos = 0;
    /* -h and --help stop the parse wherever they are. */
    r = PARSE(&f, "--json", "--help", "--steps", "x");
    assert_int_equal(r.st, MS_OPTS_HELP);
    r = PARSE(&f, "-h");
    assert_int_equal(r.st, MS_OPTS_HELP);
    r = PARSE(&f, "--he");
    assert_int_equal(r.st, MS_OPTS_ERROR);
}

static void test_help_lists_every_option(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    assert_non_null(mem);
    ms_opts_help(&f.cmd, mem);
    fclose(mem);
    assert_contains(text, "usage: meshscope thing [options] FILE...\n");
    assert_contains(text, "Does a thing.");
    const char *lines[] = {"--steps N",         "--lr LR", "--mode fast|slow|exact",
                           "-o, --output FILE", "--json",  "--even N",
                           "-h, --help"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) assert_contains(text, lines[i]);
    /* One line per option, each with its help. */
    int n_lines = 0;
    for (int i = 0; i < f.cmd.n_opts; i++) {
        char *at = strstr(text, f.cmd.opts[i].help);
        assert_non_null(at);
        char *bol = at;
        while (bol > text && bol[-1] != '\n') bol--;
        char want[32];
        snprintf(want, sizeof want, "--%s", f.cmd.opts[i].name);
        assert_non_null(strstr(bol, want));
        assert_true(strstr(bol, want) < at);
        n_lines++;
    }
    assert_int_equal(n_lines, 6);
    free(text);
}

/* Every parse starts afresh: an error midway, a help, or a parse of another table leave no
 * state (getopt's optind, a half-read cluster of short options) for the next. */
static void test_reset_between_parses(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    result r = PARSE(&f, "--json", "--steps", "bad", "--lr", "2");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    r = PARSE(&f, "--lr", "2");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_true(f.v.lr == 2);
    r = PARSE(&f, "-h", "--steps", "1");
    assert_int_equal(r.st, MS_OPTS_HELP);
    r = PARSE(&f, "--steps", "1");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_int_equal(f.v.steps, 1);
    /* Stopped inside "-xo": the next parse must not resume at 'o'. */
    r = PARSE(&f, "-xo", "file");
    assert_int_equal(r.st, MS_OPTS_ERROR);
    fixture_init(&f);
    r = PARSE(&f, "pos");
    assert_int_equal(r.st, MS_OPTS_OK);
    assert_null(f.v.out);
    assert_int_equal(r.npos, 1);
    assert_string_equal(r.pos[0], "pos");
    /* A different table with a shorter argv, many times over. */
    bool quiet = false;
    const ms_option other[] = {MS_FLAG("quiet", &quiet, "say less")};
    const ms_opts_cmd cmd = {.name = "other", MS_OPTS_TABLE(other)};
    for (int i = 0; i < 100; i++) {
        char *argv[] = {"other", "--quiet", NULL};
        quiet = false;
        char msg[256];
        assert_int_equal(ms_opts_parse(&cmd, 2, argv, NULL, 0, NULL, msg, sizeof msg), MS_OPTS_OK);
        assert_true(quiet);
        r = PARSE(&f, "--steps", "9", "--json");
        assert_int_equal(r.st, MS_OPTS_OK);
        assert_int_equal(f.v.steps, 9);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_choices),
        cmocka_unit_test(test_missing_argument),
        cmocka_unit_test(test_unknown_and_suggestion),
        cmocka_unit_test(test_positional_and_help),
        cmocka_unit_test(test_help_lists_every_option),
        cmocka_unit_test(test_reset_between_parses),
    };
    return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}

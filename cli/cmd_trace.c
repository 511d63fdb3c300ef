/* cmd_trace.c - `meshscope trace merge|summary|check`: the trace files' command line.
 *
 *   merge    per-rank trace files into one (one process per rank), groups deduplicated
 *   summary  the analysis of a trace (profiler/analysis.h) as text
 *   check    the Trace Event Format rules (traces/trace_check.h)
 *
 * Exit codes: 0 success, 1 bad input (missing, malformed, truncated, foreign or failing a
 * rule; the message names the file and the problem), 2 usage errors.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "engine/core/xalloc.h"
#include "profiler/analysis.h"
#include "traces/trace_check.h"
#include "traces/trace_merge.h"
#include "traces/trace_read.h"
#include "traces/trace_write.h"

#include "cli/options.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: meshscope trace <command> ...\n"
            "\n"
            "  merge A.json B.json ... -o OUT.json\n"
            "                     merge per-rank traces into one file, one process per rank;\n"
            "                     OUT must not be one of the inputs\n"
            "  summary FILE.json [--steps A:B]\n"
            "                     steps, overlap, bus bandwidth, ops, reshards, traffic and\n"
            "                     stragglers from a trace (steps A..B inclusive; A: or :B or A)\n"
            "  check FILE.json    check the file against the Trace Event Format rules; exit 1\n"
            "                     with the first violation\n"
            "\n"
            "meshscope trace COMMAND --help lists a command's options\n");
}

/* --- merge ----------------------------------------------------------------------------- */

/* Every event's rank is a plausible one and in no earlier file (owner: the input index per
 * rank seen so far); false after saying which rule an event broke. */
static bool check_ranks(const ms_trace *t, const char **in, int i, int32_t **owner,
                        int32_t *n_owner) {
    for (size_t k = 0; k < t->n_events; k++) {
        int32_t rank = t->events[k].rank;
        if (rank < 0 || rank >= 1 << 20) {
            fprintf(stderr, "meshscope trace merge: %s: event %zu has rank %d\n", in[i], k,
                    (int)rank);
            return false;
        }
        if (rank >= *n_owner) {
            int32_t nn = rank + 1;
            *owner = xrealloc(*owner, sizeof **owner * (size_t)nn);
            for (int32_t r = *n_owner; r < nn; r++) (*owner)[r] = -1;
            *n_owner = nn;
        }
        if ((*owner)[rank] < 0) (*owner)[rank] = i;
        if ((*owner)[rank] != i) {
            fprintf(stderr,
                    "meshscope trace merge: rank %d is in both %s and %s; merge takes one "
                    "file per rank\n",
                    (int)rank, in[(*owner)[rank]], in[i]);
            return false;
        }
    }
    return true;
}

static int cmd_merge(int argc, char **argv) {
    const char *out = NULL;
    const char **in = xcalloc((size_t)argc, sizeof *in);
    int nin = 0;
    const ms_option opts[] = {
        {.name = "output",
         .short_name = 'o',
         .kind = MS_OPT_STRING,
         .metavar = "OUT.json",
         .help = "the merged file (required; not one of the inputs)",
         .dest = &out},
    };
    const ms_opts_cmd cmd = {.name = "trace merge",
                             .synopsis = "A.json B.json ... -o OUT.json",
                             .about = "Merges per-rank traces into one file, one process per rank.",
                             MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, in, argc, &nin);
    if (rc != MS_OPTS_PROCEED) {
        free(in);
        return rc;
    }
    rc = 1;
    if (!out || nin == 0) {
        fprintf(stderr, "meshscope trace merge: give input files and -o OUT.json\n\n");
        ms_opts_help(&cmd, stderr);
        free(in);
        return 2;
    }
    /* Never write over an input: the merge would read a file it is replacing. */
    struct stat so;
    if (stat(out, &so) == 0) {
        for (int i = 0; i < nin; i++) {
            struct stat si;
            if (stat(in[i], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
                fprintf(stderr,
                        "meshscope trace merge: the output %s is also an input (%s); choose "
                        "another output file\n",
                        out, in[i]);
                free(in);
                return 1;
            }
        }
    }
    ms_trace_merge m = {0};
    int32_t *owner = NULL; /* input index per rank seen, for the duplicate-rank check */
    int32_t n_owner = 0;
    char backend[32] = "";
    int world = 0;
    for (int i = 0; i < nin; i++) {
        ms_trace t;
        ms_error err = {0};
        if (ms_trace_read(in[i], &t, &err) != MS_OK) {
            fprintf(stderr, "meshscope trace merge: %s\n", err.msg);
            goto done;
        }
        if (t.n_events == 0) {
            fprintf(stderr,
                    "meshscope trace merge: %s: no events meshscope understands (%zu trace "
                    "events, all ignored)\n",
                    in[i], t.n_trace_events);
            ms_trace_free(&t);
            goto done;
        }
        if (!check_ranks(&t, in, i, &owner, &n_owner)) {
            ms_trace_free(&t);
            goto done;
        }
        if (ms_trace_merge_add(&m, &t, &err) != MS_OK) {
            fprintf(stderr, "meshscope trace merge: %s: %s\n", in[i], err.msg);
            ms_trace_free(&t);
            goto done;
        }
        if (!backend[0]) snprintf(backend, sizeof backend, "%s", t.backend);
        if (t.world_size > world) world = t.world_size;
        ms_trace_free(&t);
    }
    if (n_owner > world) world = n_owner;
    ms_trace_meta meta = {.backend = backend[0] ? backend : NULL, .rank = 0, .world_size = world};
    ms_error err = {0};
    if (ms_trace_write(out, m.events, m.n_events, m.groups, m.n_groups, &meta, &err) != MS_OK) {
        fprintf(stderr, "meshscope trace merge: %s\n", err.msg);
        goto done;
    }
    printf("%s: %zu events from %d file%s, %d rank%s, %d group%s\n", out, m.n_events, nin,
           nin == 1 ? "" : "s", n_owner, n_owner == 1 ? "" : "s", m.n_groups,
           m.n_groups == 1 ? "" : "s");
    rc = 0;
done:
    ms_trace_merge_free(&m);
    free(owner);
    free(in);
    return rc;
}

/* --- summary --------------------------------------------------------------------------- */

static bool parse_step(const char *s, size_t len, int64_t *out) {
    if (len == 0 || len > 18) return false;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

/* "A:B", "A:", ":B" or "A" into [lo, hi] (hi = -1: to the end). */
static bool parse_steps(const char *s, int64_t *lo, int64_t *hi) {
    const char *colon = strchr(s, ':');
    *lo = 0;
    *hi = -1;
    if (!colon) {
        if (!parse_step(s, strlen(s), lo)) return false;
        *hi = *lo;
        return true;
    }
    size_t a = (size_t)(colon - s), b = strlen(colon + 1);
    if (a == 0 && b == 0) return false;
    if (a && !parse_step(s, a, lo)) return false;
    if (b && !parse_step(colon + 1, b, hi)) return false;
    return *hi < 0 || *lo <= *hi;
}

typedef struct step_range {
    int64_t lo, hi;
} step_range;

static bool opt_steps(const char *v, void *dest, char *msg, size_t cap) {
    step_range *r = dest;
    if (parse_steps(v, &r->lo, &r->hi)) return true;
    snprintf(msg, cap, "expected A:B (A <= B), A:, :B or A, with step numbers >= 0");
    return false;
}

static int cmd_summary(int argc, char **argv) {
    const char *pos[1];
    step_range r = {0, -1};
    const ms_option opts[] = {
        MS_CALL("steps", "A:B", &r, opt_steps, "steps A..B inclusive; A: or :B or A (default all)"),
    };
    const ms_opts_cmd cmd = {.name = "trace summary",
                             .synopsis = "FILE.json [--steps A:B]",
                             .about = "Steps, overlap, bus bandwidth, ops, reshards, traffic and "
                                      "stragglers from a trace.",
                             MS_OPTS_TABLE(opts),
                             .min_pos = 1,
                             .pos_name = "a trace file"};
    int rc = ms_opts_run(&cmd, argc, argv, pos, 1, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    const char *path = pos[0];
    int64_t lo = r.lo, hi = r.hi;
    ms_trace t;
    ms_error err = {0};
    if (ms_trace_read(path, &t, &err) != MS_OK) {
        fprintf(stderr, "meshscope trace summary: %s\n", err.msg);
        return 1;
    }
    printf("%s: %zu events read (%zu trace events, %zu not used), %d group%s%s\n", path, t.n_events,
           t.n_trace_events, t.n_ignored, t.n_groups, t.n_groups == 1 ? "" : "s",
           t.meshscope ? "" : " (not written by meshscope: steps, kernels and collectives only)");
    ms_analysis a;
    if (ms_analyze(t.events, t.n_events, t.groups, t.n_groups, lo, hi, &a, &err) != MS_OK) {
        fprintf(stderr, "meshscope trace summary: %s: %s\n", path, err.msg);
        ms_trace_free(&t);
        return 1;
    }
    ms_analysis_print(&a, stdout);
    ms_analysis_free(&a);
    ms_trace_free(&t);
    return 0;
}

/* --- check ----------------------------------------------------------------------------- */

static int cmd_check(int argc, char **argv) {
    const char **files = xcalloc((size_t)argc, sizeof *files);
    int nfiles = 0;
    const ms_opts_cmd cmd = {.name = "trace check",
                             .synopsis = "FILE.json ...",
                             .about = "Checks each file against the Trace Event Format rules; "
                                      "exit 1 with the first violation.",
                             .min_pos = 1,
                             .pos_name = "one or more trace files"};
    int rc = ms_opts_run(&cmd, argc, argv, files, argc, &nfiles);
    if (rc != MS_OPTS_PROCEED) {
        free(files);
        return rc;
    }
    rc = 0;
    for (int i = 0; i < nfiles; i++) {
        ms_trace_check_info info;
        ms_error err = {0};
        if (ms_trace_check(files[i], &info, &err) != MS_OK) {
            fprintf(stderr, "meshscope trace check: %s\n", err.msg);
            rc = 1;
        } else {
            printf("%s: ok, %zu events follow the Trace Event Format rules\n", files[i],
                   info.n_events);
        }
    }
    free(files);
    return rc;
}

int ms_cmd_trace(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(sub, "merge")) return cmd_merge(argc - 1, argv + 1);
    if (!strcmp(sub, "summary")) return cmd_summary(argc - 1, argv + 1);
    if (!strcmp(sub, "check")) return cmd_check(argc - 1, argv + 1);
    fprintf(stderr, "meshscope trace: unknown command '%s'; available: merge, summary, check\n\n",
            sub);
    usage(stderr);
    return 2;
}

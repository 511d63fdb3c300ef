/* session.h - the flags train, eval and explain share, parsed into run_opts (job/job.h). */
#ifndef MS_SESSION_H
#define MS_SESSION_H

#include "cli/options.h"
#include "job/job.h"

/* The commands that share run_opts; each takes its own subset of the flags. */
typedef enum run_cmd {
    RUN_TRAIN = 1,
    RUN_EVAL = 2,
    RUN_EXPLAIN = 4,
    RUN_ALL = RUN_TRAIN | RUN_EVAL | RUN_EXPLAIN
} run_cmd;

/* Parses cmd's flags (argv[0] is the command's name) into o, with the defaults for the rest.
 * Returns MS_OPTS_PROCEED (options.h) to run the command, or the exit code after printing
 * the help (0) or a clear error (2). */
int run_opts_parse(run_cmd cmd, int argc, char **argv, run_opts *o);

#endif

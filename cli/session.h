/* session.h - the flags train, eval and explain share (run_opts, job/job.h). */
#ifndef MS_SESSION_H
#define MS_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "job/job.h"

/* Parses the shared flags; `allowed` lists the flags this command takes, as
 * "--model --data ...". Prints a clear error and returns 2 on bad input, 0 on success. */
int run_opts_parse(const char *cmd, int argc, char **argv, const char *allowed, run_opts *o);

#endif

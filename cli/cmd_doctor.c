/* cmd_doctor.c - `meshscope doctor DIR`: reads the flight recorder dumps a failed job left
 * (train --flight-dir, default ./meshscope-flight), and the live records of its ranks killed
 * before they dumped, and says what happened in plain words.
 *
 * Exit codes: 0 a diagnosis (a fault or none), 1 a folder that cannot be read, holds no dumps
 * or holds a broken one (the message names it), 2 usage errors.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "profiler/flight_doctor.h"

int ms_cmd_doctor(int argc, char **argv) {
    const char *pos[1];
    int npos = 0;
    const ms_opts_cmd cmd = {.name = "doctor",
                             .synopsis = "DIR",
                             .about = "What happened to a failed job, from the flight recorder "
                                      "dumps its ranks wrote to DIR\n(train --flight-dir, default "
                                      "./meshscope-flight) and the live records of those killed "
                                      "before\nthey dumped: who never entered which collective, "
                                      "who waited, where each rank was last seen.",
                             .min_pos = 1,
                             .pos_name = "a flight recorder folder"};
    int rc = ms_opts_run(&cmd, argc, argv, pos, 1, &npos);
    if (rc != MS_OPTS_PROCEED) return rc;
    ms_strbuf text = {0};
    ms_error err = {0};
    if (ms_doctor_dir(pos[0], &text, &err) != MS_OK) {
        fprintf(stderr, "meshscope doctor: %s\n", err.msg);
        free(text.p);
        return 1;
    }
    fputs(text.p, stdout);
    free(text.p);
    return 0;
}

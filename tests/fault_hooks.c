/* fault_hooks.c - faults for tests, linked only into the test build of the binary
 * (meshscope-faults), never into meshscope.
 *
 * MS_TEST_STALL=RANK:STEP[:SECONDS] makes that rank stop answering before STEP: it sleeps
 * SECONDS, by default 2 s past the communicator timeout, as a hung thread rank would, so that
 * the others' timeout, their flight recorder dumps and diagnosis, and the process's exit
 * without the sleeper can be checked on the threads backend (tests/threads_stall.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "job/train_job.h"

static void stall(const ms_ctx *ctx, int step, int timeout_s) {
    const char *spec = getenv("MS_TEST_STALL");
    int rank, at, seconds = (timeout_s > 0 ? timeout_s : 60) + 2;
    if (!spec || sscanf(spec, "%d:%d:%d", &rank, &at, &seconds) < 2 || rank != ctx->rank ||
        at != step)
        return;
    sleep((unsigned)(seconds > 0 ? seconds : 0));
}

__attribute__((constructor)) static void install(void) {
    train_job_step_hook = stall;
}

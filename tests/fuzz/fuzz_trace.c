/* fuzz_trace.c - fuzz target: the trace reader and the trace validator on arbitrary bytes.
 *
 * Both walk the same streaming JSON layer but keep different state (events and groups;
 * per-thread intervals, B/E stacks and flow ids), so both run on every input. The status
 * returned is the reader's failure if it fails, else the validator's: an ok-* corpus file
 * must be read and pass every rule, a bad-* file must be rejected by one of them. */
#include "tests/fuzz/fuzz.h"

#include "traces/trace_check.h"
#include "traces/trace_read.h"

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    ms_trace t;
    ms_status st = ms_trace_read_mem(data, size, "fuzz.json", &t, err);
    ms_trace_free(&t);
    ms_trace_check_info info;
    ms_error check_err = {0};
    ms_status cst = ms_trace_check_mem(data, size, "fuzz.json", &info, &check_err);
    if (st == MS_OK && cst != MS_OK) {
        st = cst;
        if (err) *err = check_err;
    }
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}

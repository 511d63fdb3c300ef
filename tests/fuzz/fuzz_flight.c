/* fuzz_flight.c - fuzz target: flight recorder dumps (engine/comm/flight.h) read and diagnosed
 * by the doctor (profiler/flight_doctor.h) as `meshscope doctor` does a folder of them.
 *
 * The input holds up to 16 dumps separated by form feeds ('\f'); its first byte, when it is
 * 'P', asks for a partial diagnosis (some ranks' dumps only, as under MPI). A corpus file
 * ok-* must be diagnosed, bad-* refused. */
#include "tests/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profiler/flight_doctor.h"

enum { MAX_DUMPS = 16 };

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    const char *p = (const char *)data, *end = p + size;
    bool partial = size && *p == 'P';
    if (partial) p++;
    ms_doctor_text dumps[MAX_DUMPS];
    char names[MAX_DUMPS][64];
    int n = 0;
    while (n < MAX_DUMPS) {
        const char *ff = memchr(p, '\f', (size_t)(end - p));
        const char *stop = ff && n + 1 < MAX_DUMPS ? ff : end;
        snprintf(names[n], sizeof names[n], "fuzz/flight-rank%d-pid%d.jsonl", n, n);
        dumps[n] = (ms_doctor_text){names[n], p, (size_t)(stop - p)};
        n++;
        if (stop == end) break;
        p = stop + 1;
    }
    ms_strbuf out = {0};
    ms_status st = ms_doctor_texts(dumps, n, partial, &out, err);
    free(out.p);
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}

/* fuzz_snapshot.c - fuzz target: the snapshot JSON reader (profiler/snapshot_json.h), which
 * `meshscope top` runs on whatever a dashboard URL answers. A snapshot that parses must write
 * back to JSON that parses again. */
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "profiler/snapshot_json.h"

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    ms_snapshot *s = NULL;
    ms_status st = ms_snapshot_from_json((const char *)data, size, &s, err);
    if (st != MS_OK) return (int)st;
    cJSON *j = ms_snapshot_to_json(s);
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    ms_snapshot *again = NULL;
    if (!text || ms_snapshot_from_json(text, strlen(text), &again, NULL) != MS_OK) abort();
    cJSON_free(text);
    ms_snapshot_release(again);
    ms_snapshot_release(s);
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}

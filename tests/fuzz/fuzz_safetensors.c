/* fuzz_safetensors.c - fuzz target: the safetensors header reader on arbitrary bytes, taken
 * as a whole file (so header length, JSON, dtypes, shapes and offsets are all in play). */
#include "tests/fuzz/fuzz.h"

#include "engine/io/safetensors.h"

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    ms_st_file f;
    ms_status st = ms_safetensors_parse_header(data, size, size, "fuzz", &f, err);
    if (st == MS_OK) {
        /* Exercise the accessors on what was accepted. */
        for (int i = 0; i < f.n; i++) (void)ms_safetensors_find(&f, f.tensors[i].name);
        ms_st_expect none = {"", 0, {0}};
        ms_error ignored;
        (void)ms_safetensors_check(&f, &none, 1, &ignored);
    }
    ms_safetensors_free(&f);
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}

/* fuzz_config.c - fuzz target: the config.json parser on arbitrary bytes. */
#include "tests/fuzz/fuzz.h"

#include "engine/model/config.h"

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    ms_model_config c;
    ms_status st = ms_config_from_string((const char *)data, size, "fuzz.json", &c, err);
    if (st == MS_OK) (void)ms_gpt2_param_count(&c);
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}

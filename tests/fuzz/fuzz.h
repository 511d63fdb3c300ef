/* fuzz.h - the shape of a fuzz target here: one parse function per input format.
 *
 * Each target file defines ms_fuzz_one (returns the parser's ms_status, so the corpus
 * replay can check that malformed inputs are rejected) and LLVMFuzzerTestOneInput, the
 * libFuzzer entry point, which calls it. The replay driver links the same file, so CI
 * exercises exactly the code libFuzzer does, without libFuzzer.
 */
#ifndef MS_FUZZ_H
#define MS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"

/* err may be NULL. */
int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif

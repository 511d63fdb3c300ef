/* fuzz_array_source.c - fuzz target: the array source on arbitrary bytes taken as a whole
 * file (.npy headers, .npz archives through libzip, safetensors headers, sizes, dtypes and
 * the checks across fields), then a sampled and an evaluation batch of what was accepted.
 * The bytes reach the reader as an in-memory file (memfd), so no disk is written. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

#include "engine/data/array_source.h"

/* Reads rows of a sampled and an evaluation batch, at most 4 rows of at most 4096 floats. */
static void exercise(const ms_batch_source *src) {
    float *out[MS_BATCH_MAX_FIELDS] = {0};
    int B = src->samples[MS_SPLIT_ALL] < 4 ? (int)src->samples[MS_SPLIT_ALL] : 4;
    for (int f = 0; f < src->nfields; f++)
        if (ms_batch_field_numel(&src->fields[f]) > 4096) B = 0;
    if (B == 0) return;
    for (int f = 0; f < src->nfields; f++)
        out[f] = malloc(sizeof(float) * (size_t)B * (size_t)ms_batch_field_numel(&src->fields[f]));
    ms_error ignored;
    (void)ms_batch_source_read(src, MS_SPLIT_TRAIN, false, 7, 3, B, 0, B, out, &ignored);
    (void)ms_batch_source_read(src, MS_SPLIT_ALL, true, 0, 0, B, 0, B, out, &ignored);
    for (int f = 0; f < src->nfields; f++) free(out[f]);
}

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    int fd = memfd_create("fuzz_array_source", MFD_CLOEXEC);
    if (fd < 0) return ms_fail(err, MS_ERR_IO, "memfd_create failed");
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return ms_fail(err, MS_ERR_IO, "memfd write failed");
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ms_batch_source *src = NULL;
    ms_array_source_opts opts = {.val_fraction = 0.25, .npy_name = "x"};
    ms_status st = ms_array_source_open(path, &opts, &src, err);
    if (st == MS_OK) exercise(src);
    ms_batch_source_close(src);
    close(fd);
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}

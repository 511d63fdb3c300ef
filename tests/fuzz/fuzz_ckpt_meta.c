/* fuzz_ckpt_meta.c - fuzz target: a checkpoint's meta.json on arbitrary bytes, read and checked
 * as every loader reads it (engine/train/checkpoint_internal.h): fields in range, sizes, the
 * pieces tiling each tensor exactly, the room of each file, no tensor or file twice.
 *
 * What is accepted must hold up: each small tensor is then assembled from its pieces as a
 * loader does (ckpt_copy_overlap), and every element must be written exactly once; anything
 * else aborts, which the fuzzer reports. */
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>

#include "engine/train/checkpoint_internal.h"

/* Assembles tensor c from pieces whose elements hold their piece's index + 1, into a buffer
 * counting writes: with exact coverage, each element is written once, by its piece. */
static void assemble(const ckpt_tensor *c) {
    int nd = c->gshape.ndim;
    int64_t numel = 1, zero[MS_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) numel *= c->gshape.d[d];
    if (numel > (1 << 16)) return; /* keep each input fast */
    float *full = calloc((size_t)numel + 1, sizeof *full);
    int64_t copied = 0;
    for (int k = 0; k < c->np; k++) {
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= c->pieces[k].shape[d];
        float *src = malloc(sizeof *src * (size_t)n);
        for (int64_t i = 0; i < n; i++) src[i] = (float)(k + 1);
        copied += ckpt_copy_overlap(nd, c->pieces[k].start, c->pieces[k].shape, src, zero,
                                    c->gshape.d, full);
        free(src);
    }
    for (int64_t i = 0; i < numel; i++)
        if (full[i] == 0) abort(); /* an element no piece wrote: a gap that was accepted */
    if (copied != numel) abort();  /* an element written twice: an accepted overlap */
    free(full);
}

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    ckpt_meta m;
    ms_status st = ckpt_meta_parse((const char *)data, size, "fuzz/meta.json", &m, err);
    for (int i = 0; st == MS_OK && i < m.nt; i++) assemble(&m.t[i]);
    ckpt_meta_free(&m);
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}

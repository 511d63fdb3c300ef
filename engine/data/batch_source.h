/* batch_source.h - where training batches come from: named tensors, one row per sample.
 *
 * A source holds a fixed list of fields (a name, the shape of one sample's value, and whether
 * the values are whole numbers: token ids, class labels) and the number of samples in each
 * split. Every value reaches the engine as a float (the engine stores fp32), so whole numbers
 * beyond 2^24 are refused when the source opens, not rounded.
 *
 * Batches are pure functions of their index, like the text source's (engine/data/dataset.h):
 * - sampled batch i (training) of B rows holds, in row r, the sample at draw d = i*B + r of
 *   the split's order: epoch d / N is a permutation of the N samples drawn from Philox keyed
 *   by (seed, the source's stream, the epoch), so every sample appears once per epoch, any
 *   rank computes any rows without shared state, and a resumed run at step i sees the same
 *   batches as one that never stopped (the cursor is the step);
 * - evaluation batch i holds samples i*B .. i*B + B-1 of the split, in file order.
 * A data-parallel rank reads rows [r0, r0 + nrows) of the global batch, so the shards of any
 * degree concatenate to the same global batch.
 *
 * Sources: the byte-tokenized text (ms_text_source_open: fields "ids" and "targets", [T] each,
 * whole numbers) and arrays in files (engine/data/array_source.h: .npy, .npz, safetensors).
 *
 * Ownership: the caller closes what it opened (ms_batch_source_close); a source is read-only
 * once open, so ranks (threads) may read one source concurrently.
 */
#ifndef MS_BATCH_SOURCE_H
#define MS_BATCH_SOURCE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/data/dataset.h"

#define MS_BATCH_MAX_FIELDS 8
#define MS_BATCH_NAME_MAX   64

typedef struct ms_batch_field {
    char name[MS_BATCH_NAME_MAX];
    int ndim; /* of one sample (the batch dim is not counted); 0 is a scalar per sample */
    int shape[MS_MAX_DIMS];
    bool integer; /* whole numbers (ids, labels), exactly representable in fp32 */
} ms_batch_field;

/* Floats per sample of field f. */
int64_t ms_batch_field_numel(const ms_batch_field *f);

typedef struct ms_batch_source ms_batch_source;

/* One implementation per kind of source. */
typedef struct ms_batch_source_vt {
    /* Rows [r0, r0 + nrows) of batch `batch` (B rows) of split s, sampled (eval false) or in
     * order (eval true), into out[f] (nrows x numel(field f) floats, caller-owned) for each
     * field f. An evaluation batch past the split's end is an error. */
    ms_status (*read)(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                      uint64_t batch, int B, int r0, int nrows, float *const *out, ms_error *err);
    void (*close)(ms_batch_source *src);
} ms_batch_source_vt;

struct ms_batch_source {
    const ms_batch_source_vt *vt;
    char name[256]; /* the file, for messages */
    int nfields;
    ms_batch_field fields[MS_BATCH_MAX_FIELDS];
    uint64_t samples[3]; /* per split (MS_SPLIT_TRAIN, _VAL, _ALL) */
    void *impl;          /* the implementation's, owned by the source */
};

/* The field named `name`, or -1. */
int ms_batch_source_find(const ms_batch_source *src, const char *name);

/* vt->read with the arguments checked (B > 0, 0 <= r0, r0 + nrows <= B, a non-empty split). */
ms_status ms_batch_source_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                               uint64_t batch, int B, int r0, int nrows, float *const *out,
                               ms_error *err);

/* How many whole evaluation batches of B rows the split holds. */
uint64_t ms_batch_source_eval_batches(const ms_batch_source *src, ms_split s, int B);

/* Closes and frees; NULL is fine. */
void ms_batch_source_close(ms_batch_source *src);

/* The text source over `data` (borrowed; must outlive the source): fields "ids" and
 * "targets", [T] whole numbers each, read through ms_text_data_sample / ms_text_data_eval so
 * its batches equal the text data's. */
ms_status ms_text_source_open(const ms_text_data *data, ms_batch_source **out, ms_error *err);

/* The same over the text file at `path` (ms_text_data_open: seq tokens per row, val_fraction
 * for evaluation), which the source owns; vocab_size > 0 checks every byte is a token
 * (ms_text_data_check_vocab). */
ms_status ms_text_source_open_file(const char *path, int seq, double val_fraction, int vocab_size,
                                   ms_batch_source **out, ms_error *err);

#endif

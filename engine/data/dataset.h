/* dataset.h - a byte-tokenized text file as training and evaluation batches.
 *
 * The file is read whole and split by position: the last `val_fraction` of its bytes is the
 * validation split, the rest the training split (MS_SPLIT_ALL is the whole file). A batch is
 * B rows of T+1 consecutive tokens; inputs are the first T of each row, targets the last T.
 *
 * Sampled batches (training): row r of batch i starts at a window start drawn from Philox
 * keyed by (seed, stream of the split, draw index i*B + r), uniform over every start whose
 * window fits in the split. Batch i is thus a pure function of (seed, i, B, T, the file):
 * any rank computes any rows without shared state, and a resumed run at step i sees the same
 * batches as an uninterrupted one.
 *
 * Evaluation batches: row r of batch i is the T+1 bytes starting at byte (i*B + r)*(T+1) of
 * the split (of the file for MS_SPLIT_ALL), in order, no shuffling; asking for a batch that
 * does not fit is an error.
 *
 * Data parallelism: the global batch does not depend on the DP degree; a DP rank takes rows
 * [r0, r0 + nrows) of it (ms_dp_rows), so concatenating the shards of any degree gives the
 * same global batch.
 */
#ifndef MS_DATASET_H
#define MS_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"

typedef enum ms_split { MS_SPLIT_TRAIN, MS_SPLIT_VAL, MS_SPLIT_ALL } ms_split;

typedef struct ms_text_data {
    char *path;       /* owned copy, for messages */
    uint8_t *bytes;   /* the whole file, owned */
    size_t nbytes;    /* > 0 */
    size_t val_begin; /* train = [0, val_begin), validation = [val_begin, nbytes) */
    int seq_len;      /* T: a window is T + 1 bytes */
    double val_fraction;
} ms_text_data;

/* Reads `path`, checks that it is non-empty and that every non-empty split holds at least
 * one window of seq_len + 1 bytes (messages name the path and the sizes), and splits it.
 * val_fraction is in [0, 1) (0.1 = last 10% for validation; 0 = no validation split).
 * Release with ms_text_data_close. On failure *d is zeroed. */
ms_status ms_text_data_open(const char *path, int seq_len, double val_fraction, ms_text_data *d,
                            ms_error *err);

/* The same over a copy of n bytes in memory; `name` stands for the path in messages. */
ms_status ms_text_data_from_bytes(const char *name, const uint8_t *bytes, size_t n, int seq_len,
                                  double val_fraction, ms_text_data *d, ms_error *err);

/* Checks that the model's vocabulary holds every token of the file: byte b is token b, so
 * vocab_size tokens cover the bytes 0..vocab_size-1. Cross-entropy and the embedding index
 * their rows by token, so one past the vocabulary would be read or written out of bounds (or,
 * sharded, silently dropped). Fails with MS_ERR_INVALID naming the first byte outside, the
 * vocab_size the data needs and the fix. */
ms_status ms_text_data_check_vocab(const ms_text_data *d, int vocab_size, ms_error *err);

/* Frees what open allocated; safe on a zeroed struct and twice. */
void ms_text_data_close(ms_text_data *d);

/* [*begin, *begin + *len) is the split's byte range in the file. */
void ms_text_data_split(const ms_text_data *d, ms_split s, size_t *begin, size_t *len);

/* The Philox stream of a split's sampler (distinct from the small tensor ids used for
 * initialisation, so data draws never correlate with weights). */
#define MS_DATA_STREAM_BASE 0x6d73646174610000ull /* "msdata\0\0" */

/* Window start (a byte offset from the split's beginning) of global row r of sampled batch
 * `batch` with B rows. In [0, split length - T - 1]. */
size_t ms_text_data_sample_start(const ms_text_data *d, ms_split s, uint64_t seed, uint64_t batch,
                                 int B, int r);

/* Rows [r0, r0 + nrows) of sampled batch `batch` (B rows in the global batch) into
 * inputs[nrows * T] and targets[nrows * T] (caller-owned; targets may be NULL). */
ms_status ms_text_data_sample(const ms_text_data *d, ms_split s, uint64_t seed, uint64_t batch,
                              int B, int r0, int nrows, int32_t *inputs, int32_t *targets,
                              ms_error *err);

/* How many whole evaluation batches of B rows fit in the split. */
uint64_t ms_text_data_eval_batches(const ms_text_data *d, ms_split s, int B);

/* Rows [r0, r0 + nrows) of evaluation batch `batch` (see above), same buffers as _sample.
 * Fails with MS_ERR_INVALID when the batch does not fit in the split. */
ms_status ms_text_data_eval(const ms_text_data *d, ms_split s, uint64_t batch, int B, int r0,
                            int nrows, int32_t *inputs, int32_t *targets, ms_error *err);

/* Data-parallel rank dp_rank of dp takes rows [*r0, *r0 + *nrows) of a global batch of B rows.
 * B must be a multiple of dp, so that every rank's loss has the same weight in the mean. */
ms_status ms_dp_rows(int B, int dp, int dp_rank, int *r0, int *nrows, ms_error *err);

#endif
